//! Target prefixes and `replace_unknowns` decode as CTranslate2's `translate_batch` does.
//!
//! The fixture (`tests/fixtures/ctranslate2/expected_prefix_unk.json`, made by
//! `scripts/make_ct2_prefix_fixtures.py` with the `ctranslate2` package) holds, for
//! CTranslate2's test model `aren-transliteration`, runs with one target prefix per example
//! (different lengths, some empty, all in one batch) under greedy and beam search, several
//! hypotheses, length penalties, `min_decoding_length` 0 and a `max_decoding_length` shorter
//! than some prefixes; and, for the Argos package `de_en.argosmodel`, runs with
//! `replace_unknowns` on sources holding words outside the vocabulary. Every token must be
//! CTranslate2's and every score within 1e-4.

use candle_core::Device;
use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::{imported, options};
use transformer_decode::Hypothesis;
use transformer_model::DecodePrecision;
use transformer_runtime::load::LoadedMt;
use transformer_runtime::translate::{alignment_rows, replace_unknowns, translate, DecodeRequest};
use transformer_text::TextTokenizer;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn expected() -> Value {
    let path = fixtures().join("ctranslate2/expected_prefix_unk.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The target ids of a fixture's prefixes (`null` for none), one list per input.
fn prefix_ids(run: &LoadedMt, spec: &Value, n: usize) -> Option<Vec<Vec<u32>>> {
    let p = spec["target_prefix"].as_array()?;
    assert_eq!(p.len(), n);
    Some(
        p.iter()
            .map(|x| {
                x.as_array().map_or(Vec::new(), |toks| {
                    toks.iter()
                        .map(|t| run.tokenizer.token_to_id(t.as_str().unwrap()).unwrap())
                        .collect()
                })
            })
            .collect(),
    )
}

/// `h`'s tokens, `<unk>` replaced from `source` when asked (as the Python `translate_batch`
/// does: the run's alignment layer and heads, over the source's pieces).
fn tokens_of(run: &LoadedMt, h: &Hypothesis, source: &[String], replace: bool) -> Vec<String> {
    let mut tokens = common::token_strings(run, h);
    if replace {
        let shape = run.model_config.arch().attention_shape();
        let align = run
            .config
            .published
            .as_ref()
            .unwrap()
            .alignment(shape.0, shape.1);
        let rows = alignment_rows(h, shape, align, tokens.len(), 0..source.len());
        assert_eq!(rows.len(), tokens.len(), "one attention row per token");
        let unk = run
            .tokenizer
            .token(run.tokenizer.as_published().unwrap().target.vocab.unk());
        replace_unknowns(&mut tokens, &unk, &rows, source);
    }
    tokens
}

/// Checks every run of `group` (inputs as source pieces) on `run`; returns how many
/// hypotheses held a prefix and how many tokens `replace_unknowns` replaced.
fn check_runs(run: &LoadedMt, group: &Value) -> (usize, usize) {
    let inputs: Vec<Vec<String>> = serde_json::from_value(group["inputs"].clone()).unwrap();
    let unk = run.tokenizer.as_published().unwrap().source.vocab.unk();
    let ids: Vec<Vec<u32>> = inputs
        .iter()
        .map(|s| {
            s.iter()
                .map(|p| run.tokenizer.source_token_to_id(p).unwrap_or(unk))
                .collect()
        })
        .collect();
    let decoder = run.model.decoder().unwrap();
    let (mut prefixed, mut replaced) = (0, 0);
    for spec in group["runs"].as_array().unwrap() {
        let name = spec["name"].as_str().unwrap();
        let (opts, lp) = options(run, &spec["options"]);
        let replace = opts.want_attention;
        let mut request = DecodeRequest::new(opts);
        if let Some(p) = prefix_ids(run, spec, ids.len()) {
            prefixed += p.iter().filter(|x| !x.is_empty()).count();
            request = request.with_target_prefix(p);
        }
        let ours = translate(&decoder, &ids, &request, &Device::Cpu, |_, _| {}).unwrap();
        let results = spec["results"].as_array().unwrap();
        assert_eq!(ours.len(), results.len());
        for (i, (hyps, want)) in ours.iter().zip(results).enumerate() {
            let want_h: Vec<Vec<String>> =
                serde_json::from_value(want["hypotheses"].clone()).unwrap();
            let got: Vec<Vec<String>> = hyps
                .iter()
                .map(|h| tokens_of(run, h, &inputs[i], replace))
                .collect();
            assert_eq!(got, want_h, "{name}, input {i}: {:?}", inputs[i]);
            for (h, (t, s)) in hyps
                .iter()
                .zip(got.iter().zip(want["scores"].as_array().unwrap()))
            {
                let s = s.as_f64().unwrap();
                let ours = h.engine_score(lp);
                assert!(
                    (ours - s).abs() < 1e-4,
                    "{name}, input {i}: score {ours}, CTranslate2's {s}"
                );
                replaced += t
                    .iter()
                    .filter(|x| run.tokenizer.token_to_id(x).is_none())
                    .count();
            }
        }
    }
    (prefixed, replaced)
}

/// The fixture model `name` (under `tests/fixtures`) imported, decoding in f32.
fn model(name: &str) -> LoadedMt {
    imported(&fixtures().join(name), Some(DecodePrecision::F32))
}

/// [`check_runs`] of the fixture's runs `key` on the fixture model `name`.
fn check_fixture(name: &str, key: &str) -> (usize, usize) {
    check_runs(&model(name), &expected()[key])
}

#[test]
fn target_prefixes_decode_as_ctranslate2_in_greedy_and_beam_search() {
    let (prefixed, _) = check_fixture("ctranslate2/v2/aren-transliteration", "aren");
    assert!(prefixed > 50, "the fixture has prefixes: {prefixed}");
}

#[test]
fn replace_unknowns_copies_the_aligned_source_token_as_ctranslate2() {
    let (prefixed, replaced) = check_fixture("marian/de_en.argosmodel", "argos");
    assert!(prefixed > 10, "{prefixed}");
    // Source words outside the vocabulary came back in place of <unk>.
    assert!(replaced > 10, "only {replaced} tokens replaced");
}

#[test]
fn without_prefixes_the_prefixed_search_is_the_plain_one() {
    // An empty prefix for every example decodes as no prefix at all (CTranslate2 drops them):
    // the fixture's all-empty run and the same inputs without `target_prefix`.
    let want = expected();
    let run = model("ctranslate2/v2/aren-transliteration");
    let inputs: Vec<Vec<String>> = serde_json::from_value(want["aren"]["inputs"].clone()).unwrap();
    let ids: Vec<Vec<u32>> = inputs
        .iter()
        .map(|s| run.tokenizer.encode(&s.join(" ")))
        .collect();
    let decoder = run.model.decoder().unwrap();
    let opts = run.config.decode_options(2);
    let plain = common::decode(&run, &ids, opts);
    let empty = DecodeRequest::new(opts).with_target_prefix(vec![Vec::new(); ids.len()]);
    let with_empty = translate(&decoder, &ids, &empty, &Device::Cpu, |_, _| {}).unwrap();
    assert_eq!(plain, with_empty);
}
