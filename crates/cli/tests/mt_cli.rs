//! `transformer mt` end to end: a run killed with SIGKILL at several moments (one of them in
//! the middle of writing a checkpoint) and resumed each time ends with exactly the result of
//! the run that was never interrupted; translate and eval on the trained run.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

mod common;
use common::{bin, temp_dir as temp, weights, write_tiny_config, write_toy_corpus, GERMAN};

fn temp_dir(name: &str) -> PathBuf {
    temp("mt-cli", name)
}

/// A toy language pair (train 300, valid 20, test 20 lines) and its tiny model's config.
fn write_corpus(dir: &Path) {
    write_toy_corpus(dir, &GERMAN, &[("train", 300), ("valid", 20), ("test", 20)]);
    write_tiny_config(
        dir,
        false,
        true,
        "lr_factor = 0.1
epochs = 3
max_tokens = 160
log_interval = 4
         checkpoint_interval = 5
beam = 2
",
    );
}

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
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
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
    let mut child = bin()
        .args(["mt", "translate", "--run"])
        .arg(&whole)
        .args(["--beam", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"ein hund .\n\nzwei katzen schlafen .\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let text = String::from_utf8(o.stdout).unwrap();
    assert_eq!(text.lines().count(), 3, "{text}");
    assert_eq!(
        text.lines().nth(1),
        Some(""),
        "an empty line translates to an empty line"
    );
    let o = bin()
        .args(["mt", "eval", "--run"])
        .arg(&whole)
        .arg("--src")
        .arg(dir.join("test.de"))
        .arg("--ref")
        .arg(dir.join("test.en"))
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    let o = bin()
        .args(["mt", "eval", "--run"])
        .arg(&whole)
        .args(["--test-set", "all", "--json", "--hyp-out"])
        .arg(&hyps)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sets: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
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
    let restricted = |extra: &[&str]| {
        bin()
            .args(["mt", "eval", "--run"])
            .arg(&whole)
            .args(["--test-set", "test", "--restrict-vocab", "--hyp-out"])
            .arg(dir.join("restricted.hyp"))
            .args(extra)
            .output()
            .unwrap()
    };
    let o = restricted(&[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("transformer mt vocab-map --run"));
    let o = bin()
        .args(["mt", "vocab-map", "--run"])
        .arg(&whole)
        .args(["--frequent", "1000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = restricted(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.join("restricted.hyp")).unwrap(),
        std::fs::read_to_string(whole.join("test.hyp")).unwrap()
    );
    let o = bin()
        .args(["mt", "eval", "--run"])
        .arg(&whole)
        .args(["--test-set", "news"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("this run names valid, test (or all)"), "{err}");

    // Attention pictures of the trained run: a heatmap with one cell per (output token,
    // source token) and the explorer page with every layer's maps.
    let (svg, html) = (dir.join("att.svg"), dir.join("att.html"));
    let o = bin()
        .args(["mt", "attention", "--run"])
        .arg(&whole)
        .args(["--src", "ein hund läuft .", "--head", "2", "--out"])
        .arg(&svg)
        .arg("--html")
        .arg(&html)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    let o = bin()
        .args(["mt", "attention", "--run"])
        .arg(&whole)
        .args(["--src", "ein hund .", "--head", "9", "--out"])
        .arg(dir.join("bad.svg"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("4 head(s)"));
}

#[test]
fn positional_encoding_picture_has_a_cell_per_position_and_dimension() {
    let dir = temp_dir("pe");
    let out = dir.join("pe.svg");
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
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
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
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("even"));
}
