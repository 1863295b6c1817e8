//! `transformer bleu` end to end, on the sacreBLEU fixtures of transformer-text
//! (`crates/text/tests/fixtures/bleu/`, written by `scripts/make_bleu_fixtures.py`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const TOL: f64 = 1e-9;

fn transformer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .output()
        .expect("runs")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../text/tests/fixtures/bleu")
}

fn file(name: &str) -> String {
    fixtures().join(name).to_str().unwrap().to_string()
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The fixture's BLEU row for `case` and the configuration.
fn bleu_row(exp: &Value, case: &str, tok: &str, lc: bool, smooth: &str) -> Vec<Value> {
    exp["bleu"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().clone())
        .find(|r| r[0] == case && r[1] == tok && r[2] == lc && r[3] == smooth)
        .expect("fixture row")
}

/// The fixture's default chrF2 row for `case`.
fn chrf_row(exp: &Value, case: &str) -> Vec<Value> {
    exp["chrf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().clone())
        .find(|r| r[0] == case && r[1] == 0 && r[2] == false && r[3] == false)
        .expect("fixture row")
}

fn json_run(case: &str, extra: &[&str]) -> Value {
    let (hyp, reference) = (file(&format!("{case}.hyp")), file(&format!("{case}.ref")));
    let mut args = vec!["bleu", "--hyp", &hyp, "--ref", &reference, "--json"];
    args.extend_from_slice(extra);
    let out = transformer(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn close(what: &str, got: &Value, want: &Value) {
    let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
    assert!((g - w).abs() <= TOL, "{what}: got {g}, sacreBLEU {w}");
}

/// Checks the BLEU fields of `out` against a fixture row.
fn check_bleu(out: &Value, row: &[Value], signature: &Value) {
    close("score", &out["score"], &row[4]);
    let precisions = out["precisions"].as_array().unwrap();
    assert_eq!(precisions.len(), 4);
    for (got, want) in precisions.iter().zip(row[5].as_array().unwrap()) {
        close("precision", got, want);
    }
    close("bp", &out["bp"], &row[6]);
    close("ratio", &out["ratio"], &row[7]);
    assert_eq!(out["sys_len"], row[8]);
    assert_eq!(out["ref_len"], row[9]);
    assert_eq!(&out["signature"], signature);
}

#[test]
fn json_matches_sacrebleu_on_multi30k_lines() {
    let exp = expected();
    let out = json_run("en_multi30k", &[]);
    let sig = &exp["signatures"]["bleu 13a mixed exp"];
    check_bleu(
        &out,
        &bleu_row(&exp, "en_multi30k", "13a", false, "exp"),
        sig,
    );
    let chrf = chrf_row(&exp, "en_multi30k");
    close("chrf", &out["chrf"], &chrf[4]);
    assert_eq!(
        out["chrf_signature"],
        exp["signatures"]["chrf nw0 mixed eff"]
    );
    let lc = bleu_row(&exp, "en_multi30k", "13a", true, "none");
    close(
        "lowercased_token_bleu",
        &out["lowercased_token_bleu"],
        &lc[4],
    );
    assert_eq!(
        out["lowercased_token_bleu_signature"],
        exp["signatures"]["bleu 13a lc none"]
    );
    assert!(out["lowercased_token_bleu_label"]
        .as_str()
        .unwrap()
        .contains("lowercased 13a tokens"));
    assert_eq!(out["segments"], 20);
}

#[test]
fn json_options_match_sacrebleu() {
    let exp = expected();
    for (case, tok, lc, smooth) in [
        ("unicode_punct", "intl", true, "none"),
        ("korean", "char", false, "exp"),
        ("empty_hyps", "13a", false, "exp"),
        ("all_empty", "none", true, "exp"),
        ("html_entities", "13a", true, "exp"),
    ] {
        let mut extra = vec!["--tokenize", tok, "--smooth", smooth];
        if lc {
            extra.push("--lowercase");
        }
        let out = json_run(case, &extra);
        let key = format!("bleu {tok} {} {smooth}", if lc { "lc" } else { "mixed" });
        check_bleu(
            &out,
            &bleu_row(&exp, case, tok, lc, smooth),
            &exp["signatures"][&key],
        );
        close("chrf", &out["chrf"], &chrf_row(&exp, case)[4]);
    }
}

#[test]
fn text_output_is_sacrebleus_lines_with_signatures() {
    let exp = expected();
    let out = transformer(&[
        "bleu",
        "--hyp",
        &file("numbers.hyp"),
        "--ref",
        &file("numbers.ref"),
    ]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // sacreBLEU's text line is "BLEU|<signature> = <the rest of str(score)>".
    let row = bleu_row(&exp, "numbers", "13a", false, "exp");
    let py = row[12].as_str().unwrap();
    let sig = exp["signatures"]["bleu 13a mixed exp"].as_str().unwrap();
    assert_eq!(lines[0], py.replacen("BLEU", &format!("BLEU|{sig}"), 1));
    let chrf = chrf_row(&exp, "numbers");
    let sig = exp["signatures"]["chrf nw0 mixed eff"].as_str().unwrap();
    assert_eq!(
        lines[1],
        chrf[6]
            .as_str()
            .unwrap()
            .replacen("chrF2", &format!("chrF2|{sig}"), 1)
    );
    let row = bleu_row(&exp, "numbers", "13a", true, "none");
    let sig = exp["signatures"]["bleu 13a lc none"].as_str().unwrap();
    let label = "BLEU (lowercased 13a tokens, no smoothing; torchtext bleu_score convention)";
    assert_eq!(
        lines[2],
        row[12]
            .as_str()
            .unwrap()
            .replacen("BLEU", &format!("{label}|{sig}"), 1)
    );
}

#[test]
fn different_line_counts_name_both_files_and_counts() {
    let (hyp, reference) = (file("numbers.hyp"), file("mixed_case.ref"));
    let out = transformer(&["bleu", "--hyp", &hyp, "--ref", &reference]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&hyp) && err.contains(&reference), "{err}");
    assert!(err.contains("6 lines") && err.contains("5 lines"), "{err}");
}

#[test]
fn unreadable_file_is_named() {
    let missing = fixtures().join("no-such-file.txt");
    let missing = missing.to_str().unwrap();
    let out = transformer(&["bleu", "--hyp", missing, "--ref", &file("numbers.ref")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--hyp") && err.contains(missing), "{err}");
}

#[test]
fn help_has_an_example() {
    let out = transformer(&["bleu", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("transformer bleu --hyp"), "{help}");
    assert!(
        help.contains("--tokenize") && help.contains("intl"),
        "{help}"
    );
}
