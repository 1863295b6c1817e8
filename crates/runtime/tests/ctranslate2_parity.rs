//! CTranslate2 models imported and decoded here give CTranslate2's own tokens and scores.
//!
//! The fixtures (`tests/fixtures/ctranslate2/`, made by `scripts/make_ct2_fixtures.py` with
//! the `ctranslate2` package): CTranslate2's trained test model (`aren-transliteration`,
//! binary versions 1 and 2, float32, int16 and int8) and small synthetic models covering
//! what it does not (pre- and post-norm, every activation, learned positions, unscaled
//! embeddings, a zero start embedding, float16, bfloat16, int8 and int16 weights, shared and
//! tied embeddings), each with `translate_batch`'s outputs for greedy and beam search under
//! several options. Runs in float32 arithmetic must give the same tokens and scores within
//! 1e-4. Runs in CTranslate2's int8 arithmetic (another int8 scheme than ours: it also
//! quantizes each product's input) are compared by how many outputs agree: on this tiny model
//! int8 changes most outputs (CTranslate2's int8 agrees with its own float32 on about 115 of
//! 300 greedy outputs), so ours must agree with CTranslate2's int8 about as often as that.

use serde_json::Value;
use std::path::{Path, PathBuf};

mod common;
use common::{imported, options};
use transformer_model::DecodePrecision;
use transformer_runtime::import::Format;
use transformer_runtime::load::LoadedMt;
use transformer_text::TextTokenizer;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ctranslate2")
}

/// Agreement of one run: (outputs whose every hypothesis has CTranslate2's tokens, outputs,
/// the largest score difference among those).
fn compare(run: &LoadedMt, inputs: &[Vec<u32>], spec: &Value) -> (usize, usize, f64, String) {
    let (opts, lp) = options(run, &spec["options"]);
    let ours = common::decode(run, inputs, opts);
    let results = spec["results"].as_array().expect("results");
    let (mut same, mut worst, mut first_diff) = (0, 0f64, String::new());
    for (i, (hyps, want)) in ours.iter().zip(results).enumerate() {
        let want_h = want["hypotheses"].as_array().expect("hypotheses");
        let want_s = want["scores"].as_array().expect("scores");
        let tokens: Vec<Vec<String>> = hyps.iter().map(|h| common::token_strings(run, h)).collect();
        let expected: Vec<Vec<String>> = want_h
            .iter()
            .map(|h| serde_json::from_value(h.clone()).expect("tokens"))
            .collect();
        if tokens == expected {
            same += 1;
            for (h, s) in hyps.iter().zip(want_s) {
                worst = worst.max((h.engine_score(lp) - s.as_f64().expect("score")).abs());
            }
        } else if first_diff.is_empty() {
            first_diff = format!("input {i}: ours {tokens:?}, CTranslate2's {expected:?}");
        }
    }
    (same, results.len(), worst, first_diff)
}

/// How many of CTranslate2's outputs in two runs are the same.
fn agreement(a: &Value, b: &Value) -> usize {
    let (a, b) = (
        a["results"].as_array().unwrap(),
        b["results"].as_array().unwrap(),
    );
    a.iter()
        .zip(b)
        .filter(|(x, y)| x["hypotheses"] == y["hypotheses"])
        .count()
}

/// Checks every run of the expected file `expected` for the model `model`: float32 runs
/// exactly (tokens, and scores within 1e-4); returns the int8 runs' agreement with ours, and
/// CTranslate2's own int8-to-float32 agreement where the file has both.
fn check_model(model: &Path, expected: &Path) -> Vec<(String, usize, usize, Option<usize>)> {
    let want: Value = serde_json::from_str(&std::fs::read_to_string(expected).unwrap()).unwrap();
    let f32_run = imported(model, Some(DecodePrecision::F32));
    let int8_run = imported(model, Some(DecodePrecision::Int8 { output_layer: true }));
    let inputs: Vec<Vec<u32>> = want["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|toks| {
            let toks: Vec<String> = serde_json::from_value(toks.clone()).unwrap();
            f32_run.tokenizer.encode(&toks.join(" "))
        })
        .collect();
    let mut int8 = Vec::new();
    for spec in want["runs"].as_array().unwrap() {
        let name = spec["name"].as_str().unwrap();
        let effective = spec["effective_compute_type"].as_str().unwrap_or("float32");
        if effective == "float32" {
            let (same, n, worst, diff) = compare(&f32_run, &inputs, spec);
            assert_eq!(
                same,
                n,
                "{} {name}: {same} of {n} outputs as CTranslate2's; first difference {diff}",
                model.display()
            );
            assert!(
                worst < 1e-4,
                "{} {name}: scores differ by up to {worst}",
                model.display()
            );
        } else {
            let (same, n, _, _) = compare(&int8_run, &inputs, spec);
            let runs = want["runs"].as_array().unwrap();
            let baseline = runs
                .iter()
                .find(|r| r["name"] == spec["name"] && r["compute_type"] == "float32")
                .map(|f| agreement(spec, f));
            int8.push((format!("{} {name}", model.display()), same, n, baseline));
        }
    }
    int8
}

#[test]
fn ctranslate2s_test_model_decodes_as_ctranslate2_in_every_version_and_weight_type() {
    let dir = fixtures();
    let mut int8 = Vec::new();
    for (version, name) in [
        ("v1", "aren-transliteration"),
        ("v1", "aren-transliteration-i16"),
        ("v2", "aren-transliteration"),
        ("v2", "aren-transliteration-i16"),
        ("v2", "aren-transliteration-i8"),
    ] {
        let model = dir.join(version).join(name);
        let expected = dir.join(format!("expected_{version}_{name}.json"));
        int8.extend(check_model(&model, &expected));
    }
    for (run, same, n, baseline) in &int8 {
        eprintln!(
            "{run}: {same} of {n} outputs as CTranslate2's int8 arithmetic (its float32: {})",
            baseline.map_or("-".into(), |b| b.to_string())
        );
        if let Some(b) = baseline {
            assert!(
                same * 10 >= b * 8,
                "{run}: {same} of {n} outputs as CTranslate2's int8, which agrees with its own \
                 float32 on {b}"
            );
        }
    }
}

#[test]
fn the_transliteration_model_translates_as_ctranslate2s_own_tests_expect() {
    // tests/translator_test.cc, ModelVariantTest.Transliteration.
    let model = fixtures().join("v2/aren-transliteration");
    let run = imported(&model, None);
    let src = run.tokenizer.encode("آ ت ز م و ن");
    let out = common::decode(&run, &[src], run.config.decode_options(run.config.beam));
    assert_eq!(run.tokenizer.decode(&out[0][0].tokens), "a t z m o n");
}

#[test]
fn synthetic_models_cover_every_supported_variant_and_refuse_the_others() {
    let dir = fixtures().join("synthetic");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(names.len() >= 8, "the synthetic fixtures are missing");
    for model in names {
        let name = model.file_name().unwrap().to_string_lossy().to_string();
        // An embedding layer norm, and an embedding scale other than sqrt(d_model) or 1, are
        // not supported: the import must say so, naming the feature.
        let refused = [
            ("lnembed", "layer norm after the embeddings"),
            ("embscale2", "embedding scale of 2"),
        ]
        .into_iter()
        .find(|(tag, _)| name.contains(tag));
        if let Some((_, feature)) = refused {
            let err = Format::CTranslate2
                .read(&model)
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains(feature), "{name}: {err}");
            assert!(
                err.contains("model.bin"),
                "{name}: the error names the file: {err}"
            );
            continue;
        }
        for (run, same, n, _) in check_model(&model, &model.join("expected.json")) {
            eprintln!("{run}: {same} of {n} outputs as CTranslate2's int8 arithmetic");
        }
    }
}
