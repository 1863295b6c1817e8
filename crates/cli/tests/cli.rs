//! The `transformer` binary end to end.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{assert_mentions, failure_stderr};

fn transformer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_transformer"))
        .args(args)
        .output()
        .expect("runs")
}

/// Asserts that a run of the binary succeeded (its stderr in the message otherwise).
fn assert_success(out: Output) -> Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs the binary and asserts it succeeded.
fn succeeds(args: &[&str]) -> Output {
    assert_success(transformer(args))
}

/// `lm import-torch` of a state dict with a vocabulary file and the tutorial's 4 heads.
fn import_torch(state_dict: &Path, vocab: &Path, out: &Path) -> Output {
    transformer(&[
        "lm",
        "import-torch",
        "--state-dict",
        s(state_dict),
        "--vocab",
        s(vocab),
        "--nhead",
        "4",
        "--out",
        s(out),
    ])
}

/// `lm eval --json` of `run` on the fixture's text, and PyTorch's own figures for that text
/// (`expected.json`).
fn eval_against_pytorch(run: &Path) -> (serde_json::Value, serde_json::Value) {
    let out = succeeds(&[
        "lm",
        "eval",
        "--run",
        s(run),
        "--text",
        s(&fixture("text.txt")),
        "--json",
    ]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("expected.json")).unwrap()).unwrap();
    (got, want)
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lm_import")
        .join(name)
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cli-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A PyTorch model imported from its state dict evaluates to PyTorch's own perplexity
/// (`expected.json`, written by scripts/make_lm_import_fixture.py).
#[test]
fn imported_torch_model_matches_pytorch_perplexity() {
    let run = temp_dir("import");
    assert_success(import_torch(
        &fixture("state_dict.safetensors"),
        &fixture("vocab.txt"),
        &run,
    ));

    let (got, want) = eval_against_pytorch(&run);
    assert_eq!(got["tokens"], want["tokens"]);
    for key in ["loss", "ppl"] {
        let (g, w) = (
            got[key].as_f64().unwrap(),
            want[&format!("{key}_f64")].as_f64().unwrap(),
        );
        assert!(((g - w) / w).abs() < 1e-6, "{key}: ours {g}, PyTorch {w}");
    }

    let out = succeeds(&[
        "lm",
        "generate",
        "--run",
        s(&run),
        "--prompt",
        "The history of",
        "--max-tokens",
        "12",
        "--seed",
        "1",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("the history of "), "{text}");
    assert_eq!(text.split_whitespace().count(), 3 + 12, "{text}");

    // Its self-attention as a picture: one cell per (word, word) of the 4 tokens.
    let (svg, html) = (run.join("a.svg"), run.join("a.html"));
    succeeds(&[
        "lm",
        "attention",
        "--run",
        s(&run),
        "--text",
        "The history of the",
        "--out",
        s(&svg),
        "--html",
        s(&html),
    ]);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(svg.matches("class=\"cell\"").count(), 16);
    assert!(svg.contains("average of 4 heads"), "{svg}");
    assert!(std::fs::read_to_string(&html)
        .unwrap()
        .contains("\"encoder\":[[[["));
    let _ = std::fs::remove_dir_all(run);
}

#[test]
fn bad_input_gives_errors_that_say_what_to_do() {
    let err = failure_stderr(&transformer(&[
        "lm",
        "eval",
        "--run",
        "/nonexistent/run",
        "--text",
        "x.txt",
    ]));
    assert_mentions(&err, &["/nonexistent/run", "lm train"]);

    let err = failure_stderr(&import_torch(
        &fixture("state_dict.safetensors"),
        &fixture("text.txt"),
        Path::new("/tmp/never"),
    ));
    assert!(err.contains("text.txt"), "{err}");

    let err = failure_stderr(&transformer(&["info", "--preset", "base", "--nhead", "7"]));
    assert!(err.contains("divisors of 512"));

    let out = transformer(&["lm", "train", "--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--resume"));

    // A data folder that does not exist: the folder, what it must hold, and the flag.
    let run = std::env::temp_dir().join(format!("cli-nodata-{}", std::process::id()));
    let err = failure_stderr(&transformer(&[
        "lm",
        "train",
        "--data",
        "/nonexistent/wikitext",
        "--out",
        s(&run),
    ]));
    assert_mentions(&err, &["/nonexistent/wikitext", "train.txt", "--data"]);
    let _ = std::fs::remove_dir_all(run);
}

/// The older tutorial's state dict (the embedding named `encoder`, the output layer
/// `decoder`) imports to the same model: the fixture's tensors under the older names give
/// PyTorch's perplexity too. An unknown layout is refused with the names it expected.
#[test]
fn older_tutorial_layout_imports_to_the_same_model() {
    let dir = temp_dir("import-older");
    std::fs::create_dir_all(&dir).unwrap();
    let tensors = candle_core::safetensors::load(
        fixture("state_dict.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let rename = |name: &str| match name {
        "embedding.weight" => "encoder.weight".to_string(),
        "linear.weight" => "decoder.weight".to_string(),
        "linear.bias" => "decoder.bias".to_string(),
        n => n.to_string(),
    };
    let older: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .iter()
        .map(|(n, t)| (rename(n), t.clone()))
        .collect();
    assert!(older.contains_key("encoder.weight") && !older.contains_key("embedding.weight"));
    let path = dir.join("older.safetensors");
    candle_core::safetensors::save(&older, &path).unwrap();
    let run = dir.join("run");
    let out = assert_success(import_torch(&path, &fixture("vocab.txt"), &run));
    assert!(String::from_utf8_lossy(&out.stdout).contains("older tutorial's layout"));
    let (got, want) = eval_against_pytorch(&run);
    let (g, w) = (
        got["ppl"].as_f64().unwrap(),
        want["ppl_f64"].as_f64().unwrap(),
    );
    assert!(((g - w) / w).abs() < 1e-6, "ours {g}, PyTorch {w}");

    // Neither layout: an error naming what it expected.
    let unknown: std::collections::HashMap<String, candle_core::Tensor> = tensors
        .iter()
        .map(|(n, t)| (n.replace("embedding", "emb"), t.clone()))
        .collect();
    let path = dir.join("unknown.safetensors");
    candle_core::safetensors::save(&unknown, &path).unwrap();
    let err = failure_stderr(&import_torch(
        &path,
        &fixture("vocab.txt"),
        &dir.join("never"),
    ));
    assert_mentions(&err, &["embedding.weight", "encoder.weight", "emb.weight"]);
    let _ = std::fs::remove_dir_all(dir);
}

/// A `transformer` built without the `mpi` feature, started by an MPI launcher as one of
/// several processes, refuses to train (each would train its own copy of the run) and says
/// how to build it; it writes nothing.
#[cfg(not(feature = "mpi"))]
#[test]
fn training_under_a_launcher_without_mpi_is_refused() {
    let out = temp_dir("no-mpi");
    for cmd in ["lm", "mt"] {
        let o = Command::new(env!("CARGO_BIN_EXE_transformer"))
            .args([cmd, "train", "--out", s(&out)])
            .env("OMPI_COMM_WORLD_SIZE", "2")
            .env("OMPI_COMM_WORLD_RANK", "1")
            .output()
            .expect("runs");
        let err = failure_stderr(&o);
        assert!(
            err.contains("built without MPI")
                && err.contains("cargo build --release -p transformer-cli --features mpi"),
            "{err}"
        );
        assert!(!out.exists());
    }
}
