//! A MarianMT model (OPUS-MT's format) imported and decoded here gives what `transformers`
//! gives: the same source ids as `MarianTokenizer`, logits within 1e-4 of PyTorch's, and the
//! tokens, scores and text of `generate()` for greedy and beam search; its CTranslate2
//! conversion (`ct2-transformers-converter`) gives `translate_batch`'s.
//!
//! The fixtures (`tests/fixtures/marian/`, made by `scripts/make_marian_fixtures.py`): a
//! German-English MarianMT (d_model 64, 2 + 2 layers, Swish, a non-zero `final_logits_bias`)
//! trained briefly on Multi30k with SentencePiece models trained here, saved as
//! `model.safetensors` and as `pytorch_model.bin`, and converted to CTranslate2.

use candle_core::{Device, Tensor};
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use transformer_decode::SearchRules;
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::Mode;
use transformer_runtime::import::{as_run, Format};
use transformer_runtime::load::{load_run, Execution, LoadedMt};

use transformer_text::TextTokenizer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/marian")
        .join(name)
}

fn expected() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap()
}

fn load(model: &Path) -> LoadedMt {
    let (dir, _guard) = as_run(model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    load_run(&dir, &Execution::on(&Device::Cpu)).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn marian_decodes_as_generate_from_safetensors_and_from_pytorch_bin() {
    let want = expected();
    let lines = want["lines"].as_array().unwrap();
    for dir in ["marian-de-en", "marian-de-en-bin"] {
        let model = fixture(dir);
        assert_eq!(Format::detect(&model).unwrap(), Format::Marian);
        let run = load(&model);
        let eos = run.tokenizer.specials().eos;
        // MarianTokenizer's ids, `</s>` included.
        let src: Vec<Vec<u32>> = lines
            .iter()
            .map(|l| {
                let mut s = run.tokenizer.encode(l["src"].as_str().unwrap());
                s.push(eos);
                assert_eq!(s, ids(&l["src_ids"]), "{}", l["src"]);
                s[..s.len() - 1].to_vec()
            })
            .collect();
        for (beam, key) in [(1, "greedy"), (4, "beam4")] {
            let opts = run.config.decode_options(beam);
            assert!(matches!(opts.rules, SearchRules::HuggingFace { .. }));
            let out = common::decode(&run, &src, opts);
            for (l, hyps) in lines.iter().zip(&out) {
                let h = &hyps[0];
                let r = &l["hf"]["float32"][key];
                let mut got = h.tokens.clone();
                got.push(eos);
                assert_eq!(got, ids(&r["ids"]), "{dir} {key}: {}", l["src"]);
                assert_eq!(run.tokenizer.decode(&h.tokens), r["text"].as_str().unwrap());
                let (ours, theirs) = match key {
                    "greedy" => (h.score, r["sum_logprob"].as_f64().unwrap()),
                    _ => (h.engine_score(1.0), r["sequences_score"].as_f64().unwrap()),
                };
                assert!(
                    (ours - theirs).abs() < 1e-4,
                    "{dir} {key}: score {ours} vs {theirs}"
                );
            }
        }
    }
}

#[test]
fn marian_logits_match_pytorch() {
    let run = load(&fixture("marian-de-en"));
    let reference =
        candle_core::safetensors::load(fixture("logits.safetensors"), &Device::Cpu).unwrap();
    let f64s = |name: &str| -> Vec<f64> {
        reference[name]
            .to_dtype(candle_core::DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    let columns: Vec<usize> = f64s("columns").iter().map(|&c| c as usize).collect();
    let want = expected();
    let lines = want["meta"]["teacher_forced"]["lines"].as_array().unwrap();
    let pad = run.tokenizer.specials().pad;
    let model = run.model.transformer().expect("a Transformer");
    for l in lines {
        let i = l["index"].as_u64().unwrap();
        let (src, tgt) = (ids(&l["input_ids"]), ids(&l["decoder_input_ids"]));
        let s = Tensor::from_vec(src.clone(), (1, src.len()), &Device::Cpu).unwrap();
        let t = Tensor::from_vec(tgt.clone(), (1, tgt.len()), &Device::Cpu).unwrap();
        let masks = Seq2SeqMasks::new(&s, &t, pad).unwrap();
        let ours = model.forward(&s, &t, &masks, Mode::Eval).unwrap();
        let ours = ours.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
        // PyTorch in float64 (its position table rounded to f32, as ours).
        let sel = f64s(&format!("sel.f64.{i}"));
        let lse = f64s(&format!("lse.f64.{i}"));
        let mut worst = 0f64;
        for (p, row) in ours.iter().enumerate() {
            for (j, &c) in columns.iter().enumerate() {
                worst = worst.max((row[c] as f64 - sel[p * columns.len() + j]).abs());
            }
            let m = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let our_lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            worst = worst.max((our_lse - lse[p]).abs());
        }
        if i == 0 {
            let full = f64s("full.f64.0");
            for (a, b) in ours.iter().flatten().zip(&full) {
                worst = worst.max((*a as f64 - b).abs());
            }
        }
        assert!(
            worst < 1e-4,
            "line {i}: logits differ from PyTorch's by {worst}"
        );
    }
    assert!(lines.len() >= 20);
}

#[test]
fn marians_ctranslate2_conversion_decodes_as_translate_batch() {
    let want = expected();
    let lines = want["lines"].as_array().unwrap();
    let run = load(&fixture("marian-de-en-ct2"));
    // CTranslate2 is given MarianTokenizer's pieces, `</s>` included.
    let src: Vec<Vec<u32>> = lines
        .iter()
        .map(|l| {
            let pieces: Vec<String> = serde_json::from_value(l["src_pieces"].clone()).unwrap();
            run.tokenizer.encode(&pieces.join(" "))
        })
        .collect();
    for (beam, key) in [(1, "greedy"), (4, "beam4")] {
        let opts = transformer_decode::DecodeOptions {
            max_len_b: 127,
            length_penalty: 1.0,
            ..run.config.decode_options(beam)
        };
        let out = common::decode(&run, &src, opts);
        for (l, hyps) in lines.iter().zip(&out) {
            let r = &l["ct2"]["float32"][key];
            let tokens: Vec<String> = common::token_strings(&run, &hyps[0]);
            let theirs: Vec<String> = serde_json::from_value(r["tokens"].clone()).unwrap();
            assert_eq!(tokens, theirs, "{key}: {}", l["src"]);
            let score = r["score"].as_f64().unwrap();
            assert!((hyps[0].engine_score(1.0) - score).abs() < 1e-4, "{key}");
        }
    }
}

/// `renormalize_logits` (newer OPUS-MT generation configurations): the same greedy tokens,
/// scored over the vocabulary without `<pad>`, as `compute_transition_scores(...,
/// normalize_logits=True)` scores them.
#[test]
fn renormalized_logits_score_without_pad() {
    let want = expected();
    let lines = want["lines"].as_array().unwrap();
    let run = load(&fixture("marian-de-en"));
    let eos = run.tokenizer.specials().eos;
    let src: Vec<Vec<u32>> = lines
        .iter()
        .map(|l| run.tokenizer.encode(l["src"].as_str().unwrap()))
        .collect();
    let opts = transformer_decode::DecodeOptions {
        rules: SearchRules::HuggingFace {
            suppress: Some(run.tokenizer.specials().pad),
            renormalize: true,
        },
        ..run.config.decode_options(1)
    };
    let out = common::decode(&run, &src, opts);
    for (l, hyps) in lines.iter().zip(&out) {
        let r = &l["hf"]["float32"]["greedy"];
        let mut got = hyps[0].tokens.clone();
        got.push(eos);
        assert_eq!(got, ids(&r["ids"]));
        let theirs = r["sum_logprob_nopad"].as_f64().unwrap();
        assert!(
            (hyps[0].score - theirs).abs() < 1e-4,
            "{} vs {theirs}",
            hyps[0].score
        );
    }
}
