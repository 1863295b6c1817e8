//! `transformer mt train --reverse` and `--init-from`: tiny runs on a toy corpus. A reversed
//! run records the setting and may not drop or gain it on resume; a fine-tuning run starts
//! from the other run's weights and tokenizer, inherits its model shape, refuses flags that
//! would change it, counts the `<unk>` tokens of its data, and keeps its `--init-from` on
//! resume.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{
    assert_mentions, bin, failed, succeeded, temp_dir as temp, toy_corpus_flags, weights,
    write_toy_corpus, GERMAN, TINY_MODEL_FLAGS,
};

fn temp_dir(name: &str) -> PathBuf {
    temp("mt-finetune", name)
}

/// The toy pair with `src_words` as its source vocabulary (so that a second corpus can use
/// words the first never had): `lines` training pairs, 12 for validation, 8 for test.
fn write_corpus(dir: &Path, src_words: &[&str], lines: usize) {
    write_toy_corpus(
        dir,
        src_words,
        &[("train", lines), ("valid", 12), ("test", 8)],
    );
}

/// `mt train` on the corpus in `data` into `out`, plus `extra` flags.
fn train(data: &Path, out: &Path, extra: &[&str]) -> Output {
    bin()
        .args(["mt", "train"])
        .args(toy_corpus_flags(data))
        .args([
            "--max-tokens",
            "160",
            "--log-interval",
            "4",
            "--beam",
            "1",
            "--precision",
            "f32",
        ])
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .expect("runs")
}

/// `train` with the tiny model's flags before `extra`.
fn train_tiny(data: &Path, out: &Path, extra: &[&str]) -> Output {
    train(data, out, &[&TINY_MODEL_FLAGS[..], extra].concat())
}

/// `--init-from BASE` (fine-tuning the run in `base`), then `extra`.
fn init_from<'a>(base: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    [&["--init-from", base.to_str().unwrap()][..], extra].concat()
}

/// The largest absolute difference between two runs' weights of the same names.
fn max_difference(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f32 {
    assert_eq!(
        a.keys().collect::<std::collections::BTreeSet<_>>(),
        b.keys().collect::<std::collections::BTreeSet<_>>()
    );
    a.iter()
        .flat_map(|(n, v)| v.iter().zip(&b[n]).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

/// What `transformer serve --run RUN` answers to `GET /languages`.
fn served_languages(run: &Path) -> serde_json::Value {
    use std::io::{BufRead, Read, Write};
    let mut child = bin()
        .args(["serve", "--quiet", "--port", "0", "--run"])
        .arg(run)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line.trim().rsplit(':').next().unwrap().parse().unwrap();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /languages HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|_| panic!("{answer}"))
}

#[test]
fn reverse_is_recorded_and_fixed_for_the_run() {
    let d = temp_dir("reverse");
    write_corpus(&d, &GERMAN, 60);
    let run = d.join("run");
    let log = succeeded(&train_tiny(
        &d,
        &run,
        &[
            "--epochs",
            "1",
            "--reverse",
            "--src-lang",
            "de",
            "--tgt-lang",
            "en",
        ],
    ));
    // --src-lang and --tgt-lang name the files' languages (German sources, English
    // targets); reversed, the run translates English into German, says so, and records it.
    assert!(
        log.contains(
            "data: reversed (--reverse): every split's sides exchanged, translating en to de"
        ),
        "{log}"
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("reverse = true")
            && config.contains("src_lang = \"en\"")
            && config.contains("tgt_lang = \"de\""),
        "{config}"
    );
    // The test translations are English sentences turned into German ones: the reference
    // side is the German file.
    let hyps = std::fs::read_to_string(run.join("test.hyp")).unwrap();
    assert_eq!(hyps.lines().count(), 8);
    // The server offers the direction the run translates.
    let languages = served_languages(&run);
    assert_eq!(
        languages,
        serde_json::json!([
            {"code": "en", "name": "English", "targets": ["de"]},
            {"code": "de", "name": "German", "targets": []}
        ]),
        "{languages}"
    );

    // Resuming with more epochs keeps the direction; a non-reversed run may not gain it.
    succeeded(&train(&d, &run, &["--resume", "--epochs", "2"]));
    let plain = d.join("plain");
    succeeded(&train_tiny(
        &d,
        &plain,
        &["--epochs", "1", "--max-batches", "1"],
    ));
    let err = failed(&train(
        &d,
        &plain,
        &["--resume", "--epochs", "2", "--reverse"],
    ));
    assert!(
        err.contains("--reverse: true (the run has reverse = false)"),
        "{err}"
    );
}

#[test]
fn init_from_starts_from_the_runs_weights_and_tokenizer() {
    let d = temp_dir("init");
    write_corpus(&d, &GERMAN, 120);
    let base = d.join("base");
    succeeded(&train_tiny(&d, &base, &["--epochs", "2"]));

    // A learning rate too small to move the weights: the fine-tuned run's best weights are
    // the base run's, to rounding.
    let still = d.join("still");
    let log = succeeded(&train(
        &d,
        &still,
        &init_from(
            &base,
            &[
                "--epochs",
                "1",
                "--max-batches",
                "2",
                "--lr-factor",
                "1e-9",
                "--warmup",
                "10",
                "--average-decay",
                "0",
            ],
        ),
    ));
    assert!(log.contains("init: weights and tokenizer from"), "{log}");
    assert!(
        log.contains("<unk> in the training data under that tokenizer: 0 of"),
        "{log}"
    );
    assert!(!log.contains("warning:"), "{log}");
    assert_eq!(
        std::fs::read(base.join("tokenizer.json")).unwrap(),
        std::fs::read(still.join("tokenizer.json")).unwrap()
    );
    let config = std::fs::read_to_string(still.join("config.toml")).unwrap();
    for line in [
        "d_model = 32",
        "nhead = 4",
        "vocab_size = 60",
        "warmup = 10",
    ] {
        assert!(config.lines().any(|l| l == line), "{line} in {config}");
    }
    let (b, s) = (
        weights(&base.join("best.safetensors")),
        weights(&still.join("best.safetensors")),
    );
    let moved = max_difference(&b, &s);
    assert!(moved < 1e-5, "weights moved by {moved}");
    // The same settings without --init-from: other weights (fresh ones), which is what the
    // comparison above rules out.
    let fresh = d.join("fresh");
    succeeded(&train_tiny(
        &d,
        &fresh,
        &["--epochs", "1", "--max-batches", "2", "--lr-factor", "1e-9"],
    ));
    let f = weights(&fresh.join("best.safetensors"));
    assert!(max_difference(&b, &f) > 1e-2);

    // Shape flags that differ from the base run are refused, naming each.
    let err = failed(&train(
        &d,
        &d.join("bad"),
        &init_from(&base, &["--d-model", "64", "--layers", "3"]),
    ));
    for part in [
        "--init-from",
        "--d-model: 64 (that run has d_model = 32)",
        "--layers: 3 (that run has encoder_layers = 2)",
    ] {
        assert!(err.contains(part), "{part} in {err}");
    }
    // The same values as the base run's are fine to repeat.
    let same = d.join("same");
    succeeded(&train_tiny(
        &d,
        &same,
        &init_from(&base, &["--epochs", "1", "--max-batches", "1"]),
    ));

    // --init-from may not change on resume; the resumed run continues from its own checkpoint.
    let err = failed(&train(
        &d,
        &same,
        &[
            "--resume",
            "--epochs",
            "2",
            "--init-from",
            fresh.to_str().unwrap(),
        ],
    ));
    assert!(err.contains("--init-from: "), "{err}");
    let log = succeeded(&train(&d, &same, &["--resume", "--epochs", "2"]));
    assert!(!log.contains("init: weights"), "{log}");

    // Data in words the inherited tokenizer never saw: many <unk>, and a warning.
    let other = d.join("other");
    std::fs::create_dir_all(&other).unwrap();
    write_corpus(
        &other,
        &[
            "개",
            "고양이",
            "달린다",
            "빨리",
            "둘",
            "셋",
            "잔다",
            "안",
            "집",
        ],
        40,
    );
    let log = succeeded(&train(
        &other,
        &d.join("unk"),
        &init_from(&base, &["--epochs", "1", "--max-batches", "1"]),
    ));
    assert_mentions(&log, &["warning:", "of the training tokens are <unk>"]);
}
