//! `transformer_text::score` against sacreBLEU's own output: the fixtures in
//! `tests/fixtures/bleu/` were written by `scripts/make_bleu_fixtures.py` with the sacreBLEU
//! version named in them (the same as `score::SACREBLEU_VERSION`).
//!
//! Integer statistics (n-gram counts, totals, lengths) must agree exactly and floats to 1e-9
//! (the operations are sacreBLEU's, in its order; measured differences are 0 or a few ulps);
//! the formatted lines and signatures must be identical.

use std::path::{Path, PathBuf};

use serde_json::Value;
use transformer_text::score::{
    self, corpus_bleu, corpus_chrf, BleuOptions, ChrfOptions, Smoothing, Tokenizer,
    LOWERCASED_TOKEN_BLEU_LABEL, SACREBLEU_VERSION,
};

const TOL: f64 = 1e-9;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bleu")
}

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(dir().join(name)).expect("fixture exists");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// A case's hypotheses and references, read as the sacreBLEU command line (and the script)
/// reads them.
fn case(name: &str) -> (Vec<String>, Vec<String>) {
    let read = |ext: &str| {
        let text = std::fs::read_to_string(dir().join(format!("{name}.{ext}"))).unwrap();
        score::read_lines(&text)
    };
    (read("hyp"), read("ref"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().expect("a number")
}

fn u(v: &Value) -> u64 {
    v.as_u64().expect("a count")
}

fn close(what: &str, got: f64, want: f64, max_diff: &mut f64) {
    let d = (got - want).abs();
    *max_diff = max_diff.max(d);
    assert!(d <= TOL, "{what}: got {got}, sacreBLEU {want} (diff {d:e})");
}

/// Runs `check` on each of sacreBLEU's rows for `metric` ("bleu" or "chrf") in
/// expected.json, of which there must be `count`, with the signatures and the largest
/// difference from sacreBLEU so far (for `close`); then prints that difference.
fn each_expected_row(
    metric: &str,
    count: usize,
    mut check: impl FnMut(&[Value], &Value, &mut f64),
) {
    let expected = load("expected.json");
    let rows = expected[metric].as_array().unwrap();
    assert_eq!(rows.len(), count);
    let mut max_diff = 0.0f64;
    for row in rows {
        check(
            row.as_array().unwrap(),
            &expected["signatures"],
            &mut max_diff,
        );
    }
    eprintln!(
        "{metric}: {} scores, max |ours - sacreBLEU| = {max_diff:e}",
        rows.len()
    );
}

#[test]
fn fixtures_come_from_the_version_in_the_signatures() {
    assert_eq!(
        load("expected.json")["sacrebleu_version"],
        SACREBLEU_VERSION
    );
    assert_eq!(
        load("tokenize.json")["sacrebleu_version"],
        SACREBLEU_VERSION
    );
}

#[test]
fn corpus_bleu_matches_sacrebleu() {
    let mut lines_checked = 0;
    each_expected_row("bleu", 198, |r, signatures, max_diff| {
        let name = r[0].as_str().unwrap();
        let tok: Tokenizer = r[1].as_str().unwrap().parse().unwrap();
        let lowercase = r[2].as_bool().unwrap();
        let smooth_name = r[3].as_str().unwrap();
        let smoothing: Smoothing = smooth_name.parse().unwrap();
        let what = format!("{name} tok:{tok} lc:{lowercase} smooth:{smooth_name}");
        let opts = BleuOptions {
            tokenizer: tok,
            lowercase,
            smoothing,
            ..BleuOptions::default()
        };
        let (hyps, refs) = case(name);
        let s = corpus_bleu(&hyps, &refs, &opts).unwrap();

        close(&format!("{what} score"), s.score, f(&r[4]), max_diff);
        for (i, p) in r[5].as_array().unwrap().iter().enumerate() {
            close(
                &format!("{what} precision {}", i + 1),
                s.precisions[i],
                f(p),
                max_diff,
            );
        }
        close(&format!("{what} bp"), s.bp, f(&r[6]), max_diff);
        close(&format!("{what} ratio"), s.ratio, f(&r[7]), max_diff);
        assert_eq!(s.sys_len, u(&r[8]), "{what} sys_len");
        assert_eq!(s.ref_len, u(&r[9]), "{what} ref_len");
        // sacreBLEU adds add-k's k into the counts and totals it reports (orders 2 to 4),
        // unless nothing matched (it stops before smoothing then).
        let k = u64::from(smooth_name == "add-k" && s.counts.iter().any(|&c| c > 0));
        let counts: Vec<u64> = r[10].as_array().unwrap().iter().map(u).collect();
        let totals: Vec<u64> = r[11].as_array().unwrap().iter().map(u).collect();
        for n in 0..4 {
            let added = if n > 0 { k } else { 0 };
            assert_eq!(s.counts[n] + added, counts[n], "{what} count {}", n + 1);
            assert_eq!(s.totals[n] + added, totals[n], "{what} total {}", n + 1);
        }
        let key = format!(
            "bleu {tok} {} {smooth_name}",
            if lowercase { "lc" } else { "mixed" }
        );
        assert_eq!(s.signature(), signatures[&key], "{what} signature");
        if let Some(line) = r[12].as_str() {
            // sacreBLEU's `str(score)`; ours labels the lowercased-token convention differently.
            let ours = s.format();
            let ours = ours.replacen(LOWERCASED_TOKEN_BLEU_LABEL, "BLEU", 1);
            assert_eq!(ours, line, "{what} line");
            lines_checked += 1;
        }
    });
    assert!(lines_checked >= 40, "{lines_checked}");
}

#[test]
fn corpus_chrf_matches_sacrebleu() {
    each_expected_row("chrf", 44, |r, signatures, max_diff| {
        let name = r[0].as_str().unwrap();
        let word_order = u(&r[1]) as usize;
        let lowercase = r[2].as_bool().unwrap();
        let eps_smoothing = r[3].as_bool().unwrap();
        let what = format!("{name} nw:{word_order} lc:{lowercase} eps:{eps_smoothing}");
        let opts = ChrfOptions {
            word_order,
            lowercase,
            eps_smoothing,
            ..ChrfOptions::default()
        };
        let (hyps, refs) = case(name);
        let s = corpus_chrf(&hyps, &refs, &opts).unwrap();
        close(&format!("{what} score"), s.score, f(&r[4]), max_diff);
        let stats: Vec<[u64; 3]> = r[5]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let t = t.as_array().unwrap();
                [u(&t[0]), u(&t[1]), u(&t[2])]
            })
            .collect();
        assert_eq!(s.stats, stats, "{what} stats");
        let key = format!(
            "chrf nw{word_order} {} {}",
            if lowercase { "lc" } else { "mixed" },
            if eps_smoothing { "eps" } else { "eff" }
        );
        assert_eq!(s.signature(), signatures[&key], "{what} signature");
        assert_eq!(s.format(), r[6].as_str().unwrap(), "{what} line");
    });
}

#[test]
fn tokenizers_match_sacrebleu() {
    let fixture = load("tokenize.json");
    let strings = fixture["strings"].as_array().unwrap();
    assert!(strings.len() >= 30);
    for s in strings {
        let text = s["text"].as_str().unwrap();
        assert_eq!(score::tokenize_13a(text), s["13a"], "13a of {text:?}");
        assert_eq!(score::tokenize_intl(text), s["intl"], "intl of {text:?}");
        assert_eq!(score::tokenize_char(text), s["char"], "char of {text:?}");
        assert_eq!(
            text.to_lowercase(),
            s["lower"],
            "Python's lower() of {text:?}"
        );
    }
}

#[test]
fn whitespace_is_pythons() {
    let fixture = load("tokenize.json");
    let python: Vec<u32> = fixture["python_isspace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u(v) as u32)
        .collect();
    let ours: Vec<u32> = (0..=0x10FFFFu32)
        .filter(|&c| char::from_u32(c).is_some_and(score::is_python_whitespace))
        .collect();
    assert_eq!(ours, python);
}

#[test]
fn lowercased_token_bleu_is_13a_lowercase_without_smoothing_and_labelled() {
    let (hyps, refs) = case("en_multi30k");
    let opts = BleuOptions::lowercased_tokens();
    assert_eq!(
        (opts.tokenizer, opts.lowercase, opts.smoothing),
        (Tokenizer::V13a, true, Smoothing::None)
    );
    let s = corpus_bleu(&hyps, &refs, &opts).unwrap();
    assert!(
        s.format().starts_with(LOWERCASED_TOKEN_BLEU_LABEL),
        "{}",
        s.format()
    );
    assert!(s
        .format_with_signature()
        .starts_with(&format!("{LOWERCASED_TOKEN_BLEU_LABEL}|nrefs:1|case:lc|")));
    let plain = corpus_bleu(&hyps, &refs, &BleuOptions::default()).unwrap();
    assert!(plain.format().starts_with("BLEU = "));
    assert!(
        s.score > plain.score,
        "lowercasing can only add matches here"
    );
}

#[test]
fn mismatched_counts_are_an_error_naming_both() {
    let (hyps, refs) = case("numbers");
    let e = corpus_bleu(&hyps[1..], &refs, &BleuOptions::default()).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("5 hypotheses") && msg.contains("6 references"),
        "{msg}"
    );
    assert!(corpus_chrf(&hyps, &refs[1..], &ChrfOptions::default()).is_err());
}
