//! `transformer mt` under concurrent use, kills, moves, damage and bad input: one training
//! process per run directory, every metrics record written once whatever the moment of a
//! kill, resume from any directory honouring or refusing changed settings, damaged weights
//! refused with the file named, one over-long line never sinking a job, values that make no
//! sense refused, and the exit statuses of Ctrl-C and closed pipes.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{bin, json_lines, succeeded, temp_dir as temp, write_toy_run_files};

fn temp_dir(name: &str) -> PathBuf {
    temp("run-dir", name)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A toy language pair (each source word maps to one target word, order reversed) and a
/// `config.toml` naming its files relative to `dir`: runs are started from `dir`.
fn write_corpus(dir: &Path, epochs: usize) {
    let splits = [("train", 200), ("valid", 12), ("test", 12)];
    write_toy_run_files(
        dir,
        &splits,
        true,
        &format!(
            "lr_factor = 0.1\nepochs = {epochs}\nmax_tokens = 160\nmax_batches = 10\n\
             log_interval = 4\ncheckpoint_interval = 5\nbeam = 2\n"
        ),
    );
}

/// A fresh folder holding the toy corpus and its config for `epochs` epochs.
fn corpus_dir(name: &str, epochs: usize) -> PathBuf {
    let dir = temp_dir(name);
    write_corpus(&dir, epochs);
    dir
}

/// A corpus folder `name` (see [`corpus_dir`]) with a finished training run in its `run`
/// folder: (folder, run).
fn trained_run(name: &str, epochs: usize) -> (PathBuf, PathBuf) {
    let dir = corpus_dir(name, epochs);
    let out = dir.join("run");
    succeeded(&run(train(&dir, &out, &[])));
    (dir, out)
}

/// `mt train --config config.toml --out OUT ARGS...`, started from `dir`.
fn train(dir: &Path, out: &Path, args: &[&str]) -> Command {
    let mut c = bin();
    c.current_dir(dir)
        .args(["mt", "train", "--config", "config.toml", "--out"])
        .arg(out)
        .args(args);
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("runs")
}

/// Runs `c` with its standard output closed before it writes anything (as `| head -0`
/// would), its standard error kept.
fn run_with_stdout_closed(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts")
}

/// Every record of metrics.jsonl as (kind, step, epoch, weights, loss).
fn records(run: &Path) -> Vec<(String, u64, u64, String, String)> {
    json_lines(&std::fs::read_to_string(run.join("metrics.jsonl")).unwrap_or_default())
        .into_iter()
        .map(|v| {
            (
                v["kind"].as_str().unwrap().to_string(),
                v["step"].as_u64().unwrap(),
                v["epoch"].as_u64().unwrap_or(0),
                v["weights"].as_str().unwrap_or("").to_string(),
                v["loss"].to_string(),
            )
        })
        .collect()
}

/// Asserts that no record of the run is there twice.
fn assert_each_record_once(run: &Path) {
    let r = records(run);
    let keys: HashSet<_> = r.iter().map(|(k, s, e, w, _)| (k, s, e, w)).collect();
    assert_eq!(keys.len(), r.len(), "a record written twice: {r:?}");
}

/// Waits until `f` holds (or panics after 60 s).
fn wait_for(mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_run_directory_has_one_training_process_at_a_time() {
    let dir = corpus_dir("lock", 2);
    let out = dir.join("run");
    let mut slow = train(&dir, &out, &[]);
    slow.env("TRANSFORMER_TEST_STEP_DELAY_MS", "40");
    let mut first = spawn(slow);
    let lock = out.join("lock");
    wait_for(|| std::fs::read_to_string(&lock).is_ok_and(|s| !s.trim().is_empty()));
    let pid = first.id().to_string();
    // A second fresh run and a resume are refused at once, naming the holder.
    for args in [&[][..], &["--resume"][..]] {
        let o = run(train(&dir, &out, args));
        assert_eq!(o.status.code(), Some(1));
        let err = text(&o.stderr);
        assert!(err.contains("in use") && err.contains(&pid), "{err}");
    }
    assert!(first.try_wait().unwrap().is_none(), "the first run goes on");
    // A killed holder releases the lock: a resume takes over.
    first.kill().unwrap();
    first.wait().unwrap();
    let resume = out.join("checkpoint.safetensors").exists();
    succeeded(&run(train(
        &dir,
        &out,
        if resume { &["--resume"] } else { &[] },
    )));
    assert_each_record_once(&out);
}

/// Kills the training at every moment it writes a file (each held 60 ms before its rename),
/// resuming each time: the records are those of the uninterrupted run, each once.
#[test]
fn kills_at_every_save_point_leave_each_record_once() {
    let dir = corpus_dir("kills", 2);
    let whole = dir.join("whole");
    succeeded(&run(train(&dir, &whole, &[])));

    let out = dir.join("killed");
    let mut killed_at = HashSet::new();
    let mut finished = false;
    for _ in 0..80 {
        // Torn writes of earlier kills are left behind; clear them so that only this
        // process's writes are seen.
        if let Ok(entries) = std::fs::read_dir(&out) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().ends_with(".tmp") {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let resume = out.join("checkpoint.safetensors").exists();
        let mut c = train(&dir, &out, if resume { &["--resume"] } else { &[] });
        c.env("TRANSFORMER_TEST_SAVE_DELAY_MS", "60");
        let mut child = spawn(c);
        let mut killed = false;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "a run failed instead of resuming");
                finished = true;
                break;
            }
            let tmp = std::fs::read_dir(&out).ok().and_then(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .find(|n| n.ends_with(".tmp"))
            });
            if let Some(name) = tmp {
                let at = (name, records(&out).len());
                if killed_at.insert(at) {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    killed = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if finished && !killed {
            break;
        }
    }
    assert!(finished, "the run ends");
    assert!(
        killed_at
            .iter()
            .any(|(n, _)| n == "checkpoint.safetensors.tmp")
            && killed_at.iter().any(|(n, _)| n == "best.safetensors.tmp"),
        "{killed_at:?}"
    );
    assert_each_record_once(&out);
    assert_eq!(records(&whole), records(&out));
}

#[test]
fn resume_from_anywhere_honours_or_refuses_changed_settings() {
    let dir = corpus_dir("resume", 2);
    let out = dir.join("run");
    succeeded(&run(train(&dir, Path::new("run"), &["--max-steps", "3"])));
    let config = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        config.contains(&format!(
            "{}",
            dir.canonicalize().unwrap().join("train.de").display()
        )),
        "paths are recorded absolute: {config}"
    );

    // From another directory, with more epochs and another log interval: both take effect.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let resume = |args: &[&str]| {
        let mut c = bin();
        c.current_dir(&elsewhere)
            .args(["mt", "train", "--resume", "--out"])
            .arg(&out)
            .args(args);
        run(c)
    };
    let o = resume(&["--epochs", "3", "--log-interval", "2"]);
    succeeded(&o);
    let log = text(&o.stdout);
    assert!(
        log.contains("resume: --epochs changes epochs from 2 to 3")
            && log.contains("resume: --log-interval changes log_interval from 4 to 2"),
        "{log}"
    );
    let r = records(&out);
    assert!(r.iter().any(|(k, _, e, _, _)| k == "valid" && *e == 3));
    assert_eq!(r.iter().filter(|(k, ..)| k == "test").count(), 1);
    assert!(std::fs::read_to_string(out.join("config.toml"))
        .unwrap()
        .contains("epochs = 3"));

    // Settings that are the run's own are refused, each named with the run's value, and
    // nothing is trained.
    let o = resume(&["--epochs", "4", "--d-model", "64", "--seed", "5"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("--d-model: 64 (the run has d_model = 32)")
            && err.contains("--seed: 5 (the run has seed = 1)")
            && !err.contains("--epochs:"),
        "{err}"
    );
    assert_eq!(records(&out), r);
    let o = resume(&["--epochs", "1"]);
    assert!(text(&o.stderr).contains("trained 3 epochs already"));

    // A recorded file that moved: the error says where the path comes from and the flag
    // that points elsewhere; giving it resumes.
    std::fs::rename(dir.join("train.de"), dir.join("moved.de")).unwrap();
    let o = resume(&["--epochs", "4"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("train.de") && err.contains("config.toml") && err.contains("--train-src"),
        "{err}"
    );
    let moved = dir.join("moved.de");
    let o = resume(&["--epochs", "4", "--train-src", moved.to_str().unwrap()]);
    succeeded(&o);
    assert!(text(&o.stdout).contains("resume: --train-src changes train_src"));
    assert_each_record_once(&out);
    assert_eq!(
        records(&out).iter().filter(|(k, ..)| k == "test").count(),
        2,
        "tested after epoch 3 and again after epoch 4"
    );
}

#[test]
fn bad_input_and_damage_never_pass_silently() {
    let (dir, runp) = trained_run("bad", 1);
    let r = runp.to_str().unwrap();

    // One line far longer than the model takes among good ones: the job goes on, and a
    // warning names the line.
    let long: Vec<&str> = (0..1500)
        .map(|i| ["ein", "hund", "katzen", "haus"][i % 4])
        .collect();
    let src = dir.join("long.de");
    std::fs::write(
        &src,
        format!("ein hund .\n{}\nzwei katzen .\n", long.join(" ")),
    )
    .unwrap();
    let refs = dir.join("long.en");
    std::fs::write(&refs, format!("a dog .\n{}\ntwo cats .\n", long.join(" "))).unwrap();
    let o = run({
        let mut c = bin();
        c.args(["mt", "translate", "--run", r, "--beam", "1", "--src"])
            .arg(&src);
        c
    });
    succeeded(&o);
    assert_eq!(text(&o.stdout).lines().count(), 3);
    let err = text(&o.stderr);
    assert!(
        err.contains("warning: line 2:") && err.contains("1023"),
        "{err}"
    );
    let o = run({
        let mut c = bin();
        c.args(["mt", "eval", "--run", r, "--beam", "1", "--json", "--src"])
            .arg(&src)
            .arg("--ref")
            .arg(&refs);
        c
    });
    succeeded(&o);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sentences"], 3);
    assert!(v["loss"].as_f64().unwrap().is_finite());

    // A long sentence's attention page is written, with a warning about its size.
    let page = dir.join("page.html");
    let o = run({
        let mut c = bin();
        c.args(["mt", "attention", "--run", r, "--beam", "1", "--src"])
            .arg(long[..300].join(" "))
            .arg("--html")
            .arg(&page);
        c
    });
    succeeded(&o);
    let err = text(&o.stderr);
    assert!(
        err.contains("warning: --html") && err.contains(" MB "),
        "{err}"
    );
    assert!(std::fs::metadata(&page).unwrap().len() > 8 << 20);

    // Values that make no sense are refused, before any long work, naming the flag.
    let a_file = dir.join("test.de");
    let a_file = a_file.to_str().unwrap();
    let d = dir.to_str().unwrap();
    // The command, its flags, what its error must say.
    let mt_train: &[&str] = &["mt", "train", "--config", "config.toml"];
    let generate: &[&str] = &["lm", "generate", "--run", r, "--prompt", "a"];
    let attention: &[&str] = &["mt", "attention", "--run", r, "--src", "ein hund"];
    let translate: &[&str] = &["mt", "translate", "--run", r];
    let eval: &[&str] = &["mt", "eval", "--run", r];
    let lm_eval: &[&str] = &["lm", "eval", "--run", r];
    let cases: Vec<(&[&str], Vec<&str>, &str)> = vec![
        (mt_train, vec!["--max-valid", "0"], "--max-valid"),
        (mt_train, vec!["--max-batches", "0"], "--max-batches"),
        (mt_train, vec!["--max-steps", "0"], "--max-steps"),
        (
            mt_train,
            vec!["--out", a_file],
            "is a file, not a directory",
        ),
        (
            &["lm", "train"],
            vec!["--max-batches", "0"],
            "--max-batches",
        ),
        (generate, vec!["--top-k", "0"], "--top-k"),
        (generate, vec!["--temperature=-1"], "--temperature"),
        (generate, vec!["--temperature", "nan"], "--temperature"),
        (lm_eval, vec!["--text", a_file, "--bptt", "0"], "--bptt"),
        (translate, vec!["--max-len-a=-1"], "--max-len-a"),
        (
            translate,
            vec!["--length-penalty", "nan"],
            "--length-penalty",
        ),
        (translate, vec!["--length-penalty=-2"], "--length-penalty"),
        (translate, vec!["--beam", "0"], "--beam"),
        (
            eval,
            vec!["--src", a_file, "--ref", a_file, "--hyp-out", d],
            "--hyp-out",
        ),
        (
            attention,
            vec!["--layer", "99", "--out", "x.svg"],
            "--layer 99",
        ),
        (attention, vec!["--head", "0", "--out", "x.svg"], "--head 0"),
        (
            translate,
            vec!["--src", "/nonexistent/in.de"],
            "/nonexistent/in.de",
        ),
    ];
    for (command, flags, want) in cases {
        let args = [command, &flags[..]].concat();
        let o = run({
            let mut c = bin();
            c.current_dir(&dir).args(&args).stdin(Stdio::null());
            c
        });
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = text(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(err.matches("os error").count() <= 1, "said once: {err}");
    }

    // Damaged weights: an error naming the file and what to fall back to; without
    // best.safetensors, a warning that the checkpoint's weights are used.
    let translate = || {
        let mut c = bin();
        c.args(["mt", "translate", "--run", r, "--src", a_file]);
        run(c)
    };
    let best = runp.join("best.safetensors");
    let good = std::fs::read(&best).unwrap();
    let mut bytes = good.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x08;
    std::fs::write(&best, &bytes).unwrap();
    let o = translate();
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("best.safetensors") && err.contains("checksum") && err.contains("mv "),
        "{err}"
    );
    std::fs::remove_file(&best).unwrap();
    let o = translate();
    assert!(o.status.success());
    assert!(
        text(&o.stderr).contains("warning:") && text(&o.stderr).contains("checkpoint.safetensors")
    );
    let ckpt = runp.join("checkpoint.safetensors");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&ckpt, &bytes).unwrap();
    let o = run(train(&dir, &runp, &["--resume"]));
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("checkpoint.safetensors") && err.contains("cannot resume"),
        "{err}"
    );
    std::fs::write(&best, &good).unwrap();
    assert!(translate().status.success());
}

#[test]
fn ctrl_c_exits_130_after_its_checkpoint_and_closed_pipes_exit_0() {
    let dir = corpus_dir("exit", 1);
    let out = dir.join("run");
    let mut c = train(&dir, &out, &[]);
    c.env("TRANSFORMER_TEST_STEP_DELAY_MS", "100")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let child = c.spawn().unwrap();
    wait_for(|| out.join("metrics.jsonl").exists());
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130));
    assert!(text(&o.stdout).contains("checkpoint saved"));
    succeeded(&run(train(&dir, &out, &["--resume"])));

    // Output into a pipe its reader has closed: quietly, status 0.
    let many = dir.join("many.de");
    std::fs::write(&many, "ein hund .\n".repeat(300)).unwrap();
    let mut translate = bin();
    translate
        .args(["mt", "translate", "--beam", "1", "--run"])
        .arg(&out)
        .arg("--src")
        .arg(&many);
    let mut info = bin();
    info.args(["info", "--preset", "tiny"]);
    for c in [translate, info] {
        let o = run_with_stdout_closed(c);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert!(
            !text(&o.stderr).contains("Broken pipe"),
            "{}",
            text(&o.stderr)
        );
    }
}

#[test]
fn a_closed_stdout_never_stops_training_and_the_log_file_keeps_the_log() {
    use std::io::BufRead;
    let dir = corpus_dir("closed-stdout", 2);
    let out = dir.join("run");
    let log_file = dir.join("train.log");
    let mut c = train(&dir, &out, &["--log-file", "train.log"]);
    c.env("TRANSFORMER_TEST_STEP_DELAY_MS", "30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Read the first lines as `| head -2` would, then close the pipe while training runs.
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0);
        first.push(line);
    }
    drop(reader);
    assert!(
        !out.join("best.safetensors").exists(),
        "the pipe must close before training ends"
    );
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("cannot write the log to standard output") && err.contains("training goes on"),
        "{err}"
    );
    // The run finished: best weights, both epochs validated, the test run.
    assert!(out.join("best.safetensors").exists());
    let r = records(&out);
    assert!(
        r.iter().any(|(k, _, e, _, _)| k == "valid" && *e == 2),
        "{r:?}"
    );
    assert_eq!(r.iter().filter(|(k, ..)| k == "test").count(), 1);
    // The log file holds the whole log: the lines read from the pipe, then the rest.
    let log = std::fs::read_to_string(&log_file).unwrap();
    assert!(log.starts_with(&first.concat()), "{log}");
    assert!(log.lines().count() > 10, "{log}");
    assert!(
        log.contains("| end of epoch   2 |") && log.contains("| End of training |"),
        "{log}"
    );

    // The copy task too: its stdout closed before its first line.
    let copy_log = dir.join("copy.log");
    let mut copy = bin();
    copy.args([
        "copy-task",
        "--steps",
        "60",
        "--log-every",
        "10",
        "--log-file",
    ])
    .arg(&copy_log);
    let o = run_with_stdout_closed(copy);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let log = std::fs::read_to_string(&copy_log).unwrap();
    assert!(
        log.starts_with("copy task:") && log.contains("parameters"),
        "{log}"
    );
}

#[test]
fn a_refused_resume_changes_nothing_on_disk() {
    let (dir, out) = trained_run("refused-resume", 2);
    let snapshot = || {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).unwrap_or_default())
            })
            .collect();
        files.sort();
        files
    };
    let before = snapshot();
    assert!(before.iter().any(|(n, _)| n == "config.toml"));
    for args in [
        &["--resume", "--epochs", "1"][..],
        &["--resume", "--epochs", "3", "--d-model", "64"][..],
    ] {
        let o = run(train(&dir, &out, args));
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        let after = snapshot();
        for ((name, a), (_, b)) in before.iter().zip(&after) {
            assert!(
                a == b,
                "{name} changed by a refused {args:?}: {}",
                String::from_utf8_lossy(b)
            );
        }
        assert_eq!(
            before.iter().map(|f| &f.0).collect::<Vec<_>>(),
            after.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
    }
}
