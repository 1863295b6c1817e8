//! What `transformer mt` and `serve` refuse or say instead of going on quietly: a missing
//! `--init-from` run (nothing created), fine-tuning from int8 weights, quantizing a run
//! without best weights, a tokenizer that does not fit the weights, an empty set to score,
//! translating under mpirun, and a served pair from a language into itself.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::OnceLock;

mod common;
use common::{
    assert_mentions, bin, failure_stderr, succeeded, temp_dir as temp, toy_corpus_flags,
    write_toy_corpus, GERMAN, TINY_MODEL_FLAGS,
};

fn temp_dir(name: &str) -> PathBuf {
    temp("mt-refusals", name)
}

/// `mt train` of the tiny model on the toy corpus in `data` into `out`, plus `extra`.
fn train(data: &Path, out: &Path, extra: &[&str]) -> Output {
    bin()
        .args(["mt", "train"])
        .args(toy_corpus_flags(data))
        .args(TINY_MODEL_FLAGS)
        .args(["--max-tokens", "160", "--beam", "1", "--precision", "f32"])
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// A folder with the toy corpus and a finished one-epoch run in `run` (trained once).
fn base() -> &'static (PathBuf, PathBuf) {
    static BASE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = temp_dir("base");
        write_toy_corpus(&dir, &GERMAN, &[("train", 80), ("valid", 8), ("test", 8)]);
        let run = dir.join("run");
        succeeded(&train(&dir, &run, &["--epochs", "1", "--max-batches", "6"]));
        (dir, run)
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn init_from_a_missing_run_creates_nothing_and_int8_weights_are_said() {
    let (data, run) = base();
    let out = data.join("from-missing");
    let err = failure_stderr(&train(
        data,
        &out,
        &["--init-from", s(&data.join("no-such-run"))],
    ));
    assert_mentions(&err, &["--init-from", "no-such-run"]);
    assert!(
        !out.exists(),
        "a run that could not start left {}",
        out.display()
    );

    // Fine-tuning from an int8 run says that the weights are rounded ones.
    let int8 = data.join("int8");
    succeeded(
        &bin()
            .args(["mt", "quantize", "--run", s(run), "--out", s(&int8)])
            .output()
            .unwrap(),
    );
    // Two batches of fine-tuning from `run` into `out`: the log.
    let fine_tune = |run: &Path, out: &str| {
        succeeded(&train(
            data,
            &data.join(out),
            &["--init-from", s(run), "--epochs", "1", "--max-batches", "2"],
        ))
    };
    let log = fine_tune(&int8, "from-int8");
    assert_mentions(&log, &["holds int8 weights", "rounded to int8"]);
    let log = fine_tune(run, "from-f32");
    assert!(!log.contains("int8"), "{log}");
}

#[test]
fn quantizing_a_run_without_best_weights_says_it_uses_the_checkpoint() {
    let (data, _) = base();
    let early = data.join("early");
    succeeded(&train(data, &early, &["--epochs", "1", "--max-steps", "2"]));
    assert!(!early.join("best.safetensors").exists());
    let o = bin()
        .args(["mt", "quantize", "--run", s(&early), "--out"])
        .arg(data.join("early-int8"))
        .output()
        .unwrap();
    let all = succeeded(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("no best.safetensors") && err.contains("checkpoint"),
        "{all}"
    );
}

#[test]
fn a_tokenizer_that_does_not_fit_the_weights_is_refused_at_load() {
    let (data, run) = base();
    // Another run's tokenizer, of another size, put in a copy of the run.
    let other = data.join("other-vocab");
    succeeded(&train(
        data,
        &other,
        &["--epochs", "1", "--max-steps", "1", "--tokenizer", "words"],
    ));
    let broken = data.join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for f in ["config.toml", "best.safetensors"] {
        std::fs::copy(run.join(f), broken.join(f)).unwrap();
    }
    std::fs::copy(other.join("tokenizer.json"), broken.join("tokenizer.json")).unwrap();
    let o = common::mt_translate_stdin(&broken, &[], "ein hund läuft .\n");
    let err = failure_stderr(&o);
    assert_mentions(&err, &["tokenizer.json has", "tokens but the weights"]);
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

#[test]
fn eval_on_an_empty_file_has_nothing_to_score() {
    let (data, run) = base();
    let (src, reference) = (data.join("empty.de"), data.join("empty.en"));
    std::fs::write(&src, "").unwrap();
    std::fs::write(&reference, "").unwrap();
    let o = bin()
        .args([
            "mt",
            "eval",
            "--run",
            s(run),
            "--src",
            s(&src),
            "--ref",
            s(&reference),
        ])
        .output()
        .unwrap();
    let err = failure_stderr(&o);
    assert_mentions(&err, &["nothing to score", "empty.de"]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("perplexity"));
}

#[test]
fn translate_and_eval_refuse_to_run_once_per_rank() {
    let (data, run) = base();
    for (var, value) in [("OMPI_COMM_WORLD_SIZE", "2"), ("PMI_SIZE", "4")] {
        let mut translate = bin();
        translate
            .args(["mt", "translate", "--run", s(run), "--src"])
            .arg(data.join("test.de"));
        let mut eval = bin();
        eval.args(["mt", "eval", "--run", s(run), "--src"])
            .arg(data.join("test.de"))
            .arg("--ref")
            .arg(data.join("test.en"));
        for mut c in [translate, eval] {
            let o = c.env(var, value).output().unwrap();
            assert_mentions(&failure_stderr(&o), &["one process", "mpirun"]);
            assert!(o.stdout.is_empty());
        }
    }
    // One rank of one is one process.
    succeeded(
        &bin()
            .args(["mt", "translate", "--run", s(run), "--src"])
            .arg(data.join("test.de"))
            .env("OMPI_COMM_WORLD_SIZE", "1")
            .output()
            .unwrap(),
    );
}

#[test]
fn serving_a_language_into_itself_is_refused() {
    let (_, run) = base();
    let o = bin()
        .args(["serve", "--port", "0", "--run"])
        .arg(format!("de:de={}", run.display()))
        .output()
        .unwrap();
    assert_mentions(&failure_stderr(&o), &["de:de=", "both de"]);
}
