//! `transformer mt` end to end: a run killed with SIGKILL at several moments (one of them in
//! the middle of writing a checkpoint) and resumed each time ends with exactly the result of
//! the run that was never interrupted; translate and eval on the trained run.

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

mod common;
use common::{
    bin, failure_stderr, json_lines, mt_translate_stdin, succeeded, temp_dir as temp, weights,
    write_toy_run_files,
};

fn temp_dir(name: &str) -> PathBuf {
    temp("mt-cli", name)
}

/// A toy language pair (train 300, valid 20, test 20 lines) and its tiny model's config.
fn write_corpus(dir: &Path) {
    let splits = [("train", 300), ("valid", 20), ("test", 20)];
    write_toy_run_files(dir, &splits, false, SETTINGS);
}

/// The training settings of these tests' runs.
const SETTINGS: &str = "lr_factor = 0.1
epochs = 3
max_tokens = 160
log_interval = 4
         checkpoint_interval = 5
beam = 2
";

/// Every training step of these runs is slowed by a pause, so that kills land between the
/// moments the test chooses on a machine of any speed.
const STEP_DELAY_MS: &str = "25";

fn train(dir: &Path, out: &Path, resume: bool, save_delay_ms: Option<u64>) -> Child {
    let mut c = bin();
    c.args(["mt", "train", "--config"])
        .arg(dir.join("config.toml"))
        .arg("--out")
        .arg(out)
        .env("TRANSFORMER_TEST_STEP_DELAY_MS", STEP_DELAY_MS)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if resume {
        c.arg("--resume");
    }
    if let Some(ms) = save_delay_ms {
        c.env("TRANSFORMER_TEST_SAVE_DELAY_MS", ms.to_string());
    }
    c.spawn().expect("starts")
}

/// `transformer mt COMMAND --run RUN ARGS...`, to its end.
fn mt_on_run(command: &str, run: &Path, args: &[&str]) -> Output {
    bin()
        .args(["mt", command, "--run"])
        .arg(run)
        .args(args)
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The last step the run's log reports (0 before its first log line).
fn logged_step(run: &Path) -> u64 {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// (kind, step, loss) of every line of metrics.jsonl: what must not change.
fn losses(run: &Path) -> Vec<(String, u64, f64)> {
    json_lines(&std::fs::read_to_string(run.join("metrics.jsonl")).unwrap())
        .into_iter()
        .map(|v| {
            (
                v["kind"].as_str().unwrap().to_string(),
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn killed_runs_resume_to_the_uninterrupted_result() {
    let dir = temp_dir("kill");
    write_corpus(&dir);
    let whole = dir.join("whole");
    let status = train(&dir, &whole, false, None).wait().unwrap();
    assert!(status.success());

    // Kill moments: after the first log line (step 4) and before the first checkpoint (step
    // 5), in the middle of writing a checkpoint (the temporary file is held 400 ms before
    // its rename), and at later steps.
    let out = dir.join("killed");
    let mut kills = 0;
    let plan: [(Option<u64>, Option<u64>); 5] = [
        (Some(4), None),
        (None, Some(400)),
        (Some(18), None),
        (None, Some(400)),
        (Some(33), None),
    ];
    for (at_step, mid_save) in plan {
        let resume = out.join("checkpoint.safetensors").exists();
        if mid_save.is_some() {
            // A torn write from an earlier kill is left behind (and ignored on resume); clear
            // it so that this kill waits for a new one.
            let _ = std::fs::remove_file(out.join("checkpoint.safetensors.tmp"));
        }
        let mut child = train(&dir, &out, resume, mid_save);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a run failed instead of resuming");
                break;
            }
            let due = match at_step {
                Some(step) => logged_step(&out) >= step,
                None => out.join("checkpoint.safetensors.tmp").exists(),
            };
            if due {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                kills += 1;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    assert_eq!(kills, 5, "every planned kill lands before the run ends");
    // A torn write never replaces a checkpoint: what is on disk loads.
    let resume = out.join("checkpoint.safetensors").exists();
    let status = train(&dir, &out, resume, None).wait().unwrap();
    assert!(status.success());

    assert_eq!(losses(&whole), losses(&out));
    for f in ["best.safetensors", "checkpoint.safetensors"] {
        assert_eq!(weights(&whole.join(f)), weights(&out.join(f)), "{f}");
    }
    assert_eq!(
        std::fs::read_to_string(whole.join("test.hyp")).unwrap(),
        std::fs::read_to_string(out.join("test.hyp")).unwrap()
    );

    // The trained run translates stdin and scores a file.
    let o = mt_translate_stdin(
        &whole,
        &["--beam", "2"],
        "ein hund .\n\nzwei katzen schlafen .\n",
    );
    let text = String::from_utf8(o.stdout).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert_eq!(
        text.lines().nth(1),
        Some(""),
        "an empty line translates to an empty line"
    );
    let (src, reference) = (dir.join("test.de"), dir.join("test.en"));
    let o = mt_on_run(
        "eval",
        &whole,
        &["--src", s(&src), "--ref", s(&reference), "--json"],
    );
    succeeded(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "bleu",
        "chrf",
        "sentences",
        "signature",
        "lowercased_token_bleu",
    ] {
        assert!(!v[key].is_null(), "{key} missing in {v}");
    }
    assert_eq!(v["sentences"], 20);

    // The sets the run names: --test-set all scores valid and test, one JSON line each, the
    // test's scores those of --src/--ref, its translations the run's own test.hyp.
    let hyps = dir.join("hyps");
    let o = mt_on_run(
        "eval",
        &whole,
        &["--test-set", "all", "--json", "--hyp-out", s(&hyps)],
    );
    succeeded(&o);
    let sets = json_lines(&String::from_utf8(o.stdout).unwrap());
    assert_eq!(sets.len(), 2);
    assert_eq!(
        (&sets[0]["set"], &sets[1]["set"]),
        (&"valid".into(), &"test".into())
    );
    for key in ["bleu", "chrf", "bleu_char", "loss", "sentences"] {
        assert_eq!(sets[1][key], v[key], "{key}");
    }
    assert_eq!(
        std::fs::read_to_string(hyps.join("test.hyp")).unwrap(),
        std::fs::read_to_string(whole.join("test.hyp")).unwrap()
    );
    assert!(hyps.join("valid.hyp").is_file());
    // Beside each set's translations, its sources and references, line for line.
    for (name, file) in [("test.src", "test.de"), ("test.ref", "test.en")] {
        let lines = |p: &std::path::Path| -> Vec<String> {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines().map(|l| l.trim().to_string()).collect()
        };
        assert_eq!(lines(&hyps.join(name)), lines(&dir.join(file)), "{name}");
    }
    let valid_lines = |ext: &str| {
        let p = hyps.join(format!("valid.{ext}"));
        std::fs::read_to_string(p).unwrap().lines().count()
    };
    assert_eq!(valid_lines("src"), valid_lines("hyp"));
    assert_eq!(valid_lines("ref"), valid_lines("hyp"));
    // A restricted output vocabulary: refused without a map, with the command that writes
    // one; with every token a candidate it translates exactly as the full vocabulary.
    let restricted_hyp = dir.join("restricted.hyp");
    let restricted = || {
        let hyp_out = s(&restricted_hyp);
        let args = [
            "--test-set",
            "test",
            "--restrict-vocab",
            "--hyp-out",
            hyp_out,
        ];
        mt_on_run("eval", &whole, &args)
    };
    let o = restricted();
    assert!(failure_stderr(&o).contains("transformer mt vocab-map --run"));
    succeeded(&mt_on_run("vocab-map", &whole, &["--frequent", "1000"]));
    succeeded(&restricted());
    assert_eq!(
        std::fs::read_to_string(&restricted_hyp).unwrap(),
        std::fs::read_to_string(whole.join("test.hyp")).unwrap()
    );
    let err = failure_stderr(&mt_on_run("eval", &whole, &["--test-set", "news"]));
    assert!(err.contains("this run names valid, test (or all)"), "{err}");

    // Attention pictures of the trained run: a heatmap with one cell per (output token,
    // source token) and the explorer page with every layer's maps.
    let (svg, html) = (dir.join("att.svg"), dir.join("att.html"));
    let o = mt_on_run(
        "attention",
        &whole,
        &[
            "--src",
            "ein hund läuft .",
            "--head",
            "2",
            "--out",
            s(&svg),
            "--html",
            s(&html),
        ],
    );
    succeeded(&o);
    let translation = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let svg = std::fs::read_to_string(&svg).unwrap();
    let cells = svg.matches("class=\"cell\"").count();
    assert!(cells >= 2 * 2, "{cells} cells for {translation:?}");
    assert!(
        svg.contains("layer 2, head 2") && svg.contains("&lt;eos&gt;"),
        "{svg}"
    );
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains("\"encoder\":[[[[") && html.contains("\"cross\":[[[["));
    // A head the model does not have is an error that says how many there are.
    let bad = dir.join("bad.svg");
    let o = mt_on_run(
        "attention",
        &whole,
        &["--src", "ein hund .", "--head", "9", "--out", s(&bad)],
    );
    assert!(failure_stderr(&o).contains("4 head(s)"));
}

#[test]
fn positional_encoding_picture_has_a_cell_per_position_and_dimension() {
    let out = temp_dir("pe").join("pe.svg");
    let o = bin()
        .args([
            "show",
            "positional-encoding",
            "--d-model",
            "16",
            "--max-len",
            "10",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    succeeded(&o);
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(svg.matches("class=\"cell\"").count(), 160);
    // Position 0: sin 0 = 0 in even columns, cos 0 = 1 in odd ones.
    assert!(
        svg.contains("0 / 0: 0.000") && svg.contains("0 / 1: 1.000"),
        "{svg}"
    );
    let o = bin()
        .args(["show", "positional-encoding", "--d-model", "15", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(failure_stderr(&o).contains("even"));
}

/// A UTF-8 byte order mark where a file or stdin begins is not text: training files with
/// one build the same tokenizer as without, and translate and eval answer as without.
#[test]
fn a_byte_order_mark_where_input_begins_is_not_text() {
    let dir = temp_dir("bom");
    write_toy_run_files(
        &dir,
        &[("train", 120), ("valid", 12), ("test", 12)],
        false,
        "",
    );
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    for f in [
        "train.de", "train.en", "valid.de", "valid.en", "test.de", "test.en",
    ] {
        std::fs::copy(dir.join(f), plain.join(f)).unwrap();
        let text = std::fs::read_to_string(dir.join(f)).unwrap();
        std::fs::write(dir.join(f), format!("\u{feff}{text}")).unwrap();
    }
    let train = |data: &Path, out: &Path| {
        let mut flags = common::toy_corpus_flags(data);
        flags.extend(
            common::TINY_MODEL_FLAGS
                .iter()
                .chain(&["--epochs", "1", "--max-batches", "4", "--beam", "1"])
                .map(|s| s.to_string()),
        );
        succeeded(
            &bin()
                .args(["mt", "train", "--out"])
                .arg(out)
                .args(&flags)
                .output()
                .unwrap(),
        );
    };
    let (run, run_plain) = (dir.join("run"), dir.join("run-plain"));
    train(&dir, &run);
    train(&plain, &run_plain);
    let tok = std::fs::read_to_string(run.join("tokenizer.json")).unwrap();
    assert!(
        !tok.contains('\u{feff}') && !tok.to_lowercase().contains("\\ufeff"),
        "the tokenizer learnt the byte order mark"
    );
    assert_eq!(
        tok,
        std::fs::read_to_string(run_plain.join("tokenizer.json")).unwrap()
    );

    // stdin and --src: the mark changes no translation.
    let lines = "ein hund läuft schnell .\nzwei katzen schlafen .\n";
    let stdout = |o: Output| {
        succeeded(&o);
        String::from_utf8(o.stdout).unwrap()
    };
    let plain_out = stdout(mt_translate_stdin(&run, &["--beam", "1"], lines));
    let bom_out = stdout(mt_translate_stdin(
        &run,
        &["--beam", "1"],
        &format!("\u{feff}{lines}"),
    ));
    assert_eq!(bom_out, plain_out);
    assert_eq!(plain_out.lines().count(), 2, "{plain_out}");
    let from_file = stdout(mt_on_run(
        "translate",
        &run,
        &["--beam", "1", "--src", s(&dir.join("test.de"))],
    ));
    let from_plain = stdout(mt_on_run(
        "translate",
        &run,
        &["--beam", "1", "--src", s(&plain.join("test.de"))],
    ));
    assert_eq!(from_file, from_plain);
    assert_eq!(from_file.lines().count(), 12);
    // eval: the same scores with the marks as without.
    let eval = |d: &Path| {
        let o = mt_on_run(
            "eval",
            &run,
            &[
                "--beam",
                "1",
                "--json",
                "--src",
                s(&d.join("test.de")),
                "--ref",
                s(&d.join("test.en")),
            ],
        );
        succeeded(&o);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["bleu"].clone(),
            v["chrf"].clone(),
            v["loss"].clone(),
            v["sentences"].clone(),
        )
    };
    assert_eq!(eval(&dir), eval(&plain));
}
