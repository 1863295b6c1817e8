//! Data-parallel training under the real Open MPI (`mpirun`, 2 ranks over TCP loopback):
//! 2 ranks follow the trajectory of one process with `--accumulate 2` (losses and weights),
//! and validate and test in shares that score as one process does;
//! a rank killed with SIGKILL ends the job within a bounded time, naming the rank, and the
//! run resumes; a run moves between 2 ranks and 1 process with `--accumulate 2` and back,
//! and a resume that would change the global batch is refused with the fix; a rank that
//! disagrees on the configuration or cannot read the data fails the job before any step.
//!
//! Built only with the `mpi` feature: `cargo test --release -p transformer-cli --features
//! mpi --test mpi` (needs `openmpi-bin`, `libopenmpi-dev`, `libclang-dev`).
#![cfg(feature = "mpi")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_transformer");

mod common;
use common::{
    failed, json_lines, output_text as text, succeeded, temp_dir as temp, toy_corpus_flags,
    weights, write_toy_corpus, GERMAN, TINY_MODEL_FLAGS,
};

fn temp_dir(name: &str) -> PathBuf {
    temp("mpi", name)
}

/// A toy parallel corpus: each source word maps to one target word, order reversed.
fn write_corpus(dir: &Path, lines: usize) {
    write_toy_corpus(
        dir,
        &GERMAN,
        &[("train", lines), ("valid", 12), ("test", 8)],
    );
}

/// A fresh folder holding the toy corpus with `lines` training pairs.
fn corpus_dir(name: &str, lines: usize) -> PathBuf {
    let d = temp_dir(name);
    write_corpus(&d, lines);
    d
}

fn mt_args(data: &Path, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["mt", "train"].iter().map(|s| s.to_string()).collect();
    a.extend(toy_corpus_flags(data));
    for s in TINY_MODEL_FLAGS.into_iter().chain([
        "--max-tokens",
        "64",
        "--log-interval",
        "1",
        "--checkpoint-interval",
        "4",
        "--beam",
        "1",
        "--precision",
        "f32",
        "--out",
    ]) {
        a.push(s.into());
    }
    a.push(out.display().to_string());
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// `mpirun` for `n` ranks on this machine (TCP loopback, as root too), one thread each.
/// `mpirun` with `n` ranks of the binary; a job still running after 300 s (a hang: every
/// job here takes seconds) is aborted, so a deadlock fails its test instead of stalling it.
fn mpirun(n: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--timeout",
        "300",
        "--mca",
        "btl",
        "tcp,self",
        "-x",
        "RAYON_NUM_THREADS=1",
        "-np",
    ])
    .arg(n.to_string())
    .arg(EXE);
    c
}

/// One epoch on 2 ranks of the corpus in `data` into `run`, started in the background with
/// every step slowed by `step_delay_ms`, so that the test can act mid-run.
fn slowed_job(data: &Path, run: &Path, step_delay_ms: u64) -> Child {
    mpirun(2)
        .env("TRANSFORMER_TEST_STEP_DELAY_MS", step_delay_ms.to_string())
        .args(mt_args(data, run, &["--epochs", "1"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts")
}

fn ranks(n: usize, args: &[String]) -> Output {
    mpirun(n).args(args).output().expect("mpirun runs")
}

fn single(args: &[String]) -> Output {
    Command::new(EXE).args(args).output().expect("runs")
}

/// An MPMD job of 2 ranks (MPI's form with one command per rank): rank 0 runs the binary
/// with `a`, rank 1 with `b`.
fn two_commands(a: &[String], b: &[String]) -> Output {
    Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "--mca",
            "btl",
            "tcp,self",
            "-np",
            "1",
            EXE,
        ])
        .args(a)
        .args([":", "-np", "1", EXE])
        .args(b)
        .output()
        .unwrap()
}

/// Asserts that a job that failed left no trace of a step in `run`: no checkpoint, no
/// metrics.
fn assert_no_step(run: &Path) {
    assert!(!run.join("checkpoint.safetensors").exists());
    assert!(!run.join("metrics.jsonl").exists());
}

/// The training losses of metrics.jsonl as (step, loss), in order.
fn step_losses(run: &Path) -> Vec<(u64, f64)> {
    json_lines(&std::fs::read_to_string(run.join("metrics.jsonl")).unwrap())
        .into_iter()
        .filter(|v| v["kind"] == "train")
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The (loss, BLEU) of every record of `kind` in metrics.jsonl.
fn records(run: &Path, kind: &str) -> Vec<(f64, Option<f64>)> {
    json_lines(&std::fs::read_to_string(run.join("metrics.jsonl")).unwrap())
        .into_iter()
        .filter(|v| v["kind"] == kind)
        .map(|v| (v["loss"].as_f64().unwrap(), v["bleu"].as_f64()))
        .collect()
}

/// The largest relative difference |a - b| / max(|a|, |b|, 1e-3) over every value of the
/// tensors of both files (weights, Adam's moments, the weight average).
fn max_relative(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> f64 {
    assert_eq!(
        a.keys().collect::<std::collections::BTreeSet<_>>(),
        b.keys().collect::<std::collections::BTreeSet<_>>()
    );
    a.iter()
        .flat_map(|(n, v)| {
            v.iter().zip(&b[n]).map(|(&x, &y)| {
                let (x, y) = (x as f64, y as f64);
                (x - y).abs() / x.abs().max(y.abs()).max(1e-3)
            })
        })
        .fold(0.0, f64::max)
}

/// `max_relative` over the final checkpoints of two runs.
fn checkpoint_difference(a: &Path, b: &Path) -> f64 {
    max_relative(
        &weights(&a.join("checkpoint.safetensors")),
        &weights(&b.join("checkpoint.safetensors")),
    )
}

fn compare_losses(a: &[(u64, f64)], b: &[(u64, f64)]) -> f64 {
    assert_eq!(a.len(), b.len(), "{a:?}\n{b:?}");
    a.iter()
        .zip(b)
        .map(|(&(sa, la), &(sb, lb))| {
            assert_eq!(sa, sb);
            (la - lb).abs() / la.abs().max(lb.abs())
        })
        .fold(0.0, f64::max)
}

#[test]
fn two_ranks_follow_one_process_accumulating_two_batches() {
    let d = corpus_dir("equal", 600);
    let (r2, r1) = (d.join("ranks2"), d.join("acc2"));
    // 60 batches: 30 steps of 2, then the epoch's end (validation split across the ranks)
    // and the test.
    let steps = ["--max-batches", "60", "--epochs", "1"];
    let o = ranks(2, &mt_args(&d, &r2, &steps));
    let log = succeeded(&o);
    assert!(
        log.contains(
            "data parallel: 2 processes, 1 batch(es) each per step: global batch of 2 batches"
        ),
        "{log}"
    );
    let o = single(&mt_args(
        &d,
        &r1,
        &[&steps[..], &["--accumulate", "2"]].concat(),
    ));
    succeeded(&o);
    let (l2, l1) = (step_losses(&r2), step_losses(&r1));
    assert_eq!(l2.len(), 30, "{l2:?}");
    let loss_diff = compare_losses(&l2, &l1);
    let weight_diff = checkpoint_difference(&r2, &r1);
    println!(
        "2 ranks vs 1 process --accumulate 2, 30 steps: max relative difference of the step \
         losses {loss_diff:.3e}, of the final weights and optimizer state {weight_diff:.3e}"
    );
    assert!(loss_diff <= 1e-6 && weight_diff <= 1e-6);
    // Validation and test, split across the ranks and gathered, score as one process does.
    let (v2, v1) = (records(&r2, "valid"), records(&r1, "valid"));
    assert_eq!(v2.len(), 2, "{v2:?}"); // the trained weights and their average
    assert_eq!(v1.len(), 2, "{v1:?}");
    for ((a, bleu_a), (b, bleu_b)) in v2.iter().zip(&v1) {
        // The loss's sum is added in another order (per rank, then across).
        assert!((a - b).abs() <= 1e-12 * a.abs(), "{v2:?} {v1:?}");
        assert_eq!(bleu_a, bleu_b);
    }
    let (t2, t1) = (records(&r2, "test"), records(&r1, "test"));
    assert_eq!(t2.len(), 1, "{t2:?}");
    assert!(
        (t2[0].0 - t1[0].0).abs() <= 1e-12 * t1[0].0.abs(),
        "{t2:?} {t1:?}"
    );
    assert_eq!(t2[0].1, t1[0].1);
    let hyp = |r: &Path| std::fs::read_to_string(r.join("test.hyp")).unwrap();
    assert_eq!(hyp(&r2), hyp(&r1));
    // The losses fell: the test is not comparing two runs that did nothing.
    assert!(l1[29].1 < l1[0].1, "{l1:?}");
    // One process with one batch per step trains another trajectory.
    let r0 = d.join("plain");
    let o = single(&mt_args(&d, &r0, &["--max-steps", "30"]));
    succeeded(&o);
    assert!(compare_losses(&step_losses(&r0), &l1) > 1e-4);
    let _ = std::fs::remove_dir_all(&d);
}

/// The pid of rank `rank` among mpirun's children (the ranks' environment names them).
fn rank_pid(mpirun_pid: u32, rank: usize) -> Option<u32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid != Some(mpirun_pid) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

#[test]
fn a_killed_rank_ends_the_job_and_the_run_resumes() {
    let d = corpus_dir("kill", 600);
    let run = d.join("run");
    let mut child = slowed_job(&d, &run, 150);
    let start = Instant::now();
    while !run.join("checkpoint.safetensors").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = rank_pid(child.id(), 1).expect("rank 1 is running");
    let killed = Instant::now();
    assert!(Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    // mpirun ends every rank within a bounded time.
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the job still runs 60 s after rank 1 was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waited = killed.elapsed();
    let o = child.wait_with_output().unwrap();
    let out = failed(&o);
    assert!(out.contains("rank 1") && out.contains("signal 9"), "{out}");
    println!(
        "rank 1 killed: the job ended {:.1} s later",
        waited.as_secs_f64()
    );
    // The checkpoint is whole: the run resumes from it (on 2 ranks) and finishes.
    let o = ranks(2, &mt_args(&d, &run, &["--epochs", "1", "--resume"]));
    let log = succeeded(&o);
    assert!(log.contains("resuming"), "{log}");
    assert!(run.join("best.safetensors").exists());
    let _ = std::fs::remove_dir_all(&d);
}

/// Ctrl-C on mpirun (which sends every rank SIGTERM): the ranks stop together at a step,
/// rank 0 saves a checkpoint and says how to continue, and the run resumes from that step.
#[test]
fn ctrl_c_on_mpirun_saves_a_checkpoint_and_the_run_resumes() {
    let d = corpus_dir("ctrl-c", 600);
    let run = d.join("run");
    let child = slowed_job(&d, &run, 50);
    let start = Instant::now();
    while step_losses_so_far(&run) < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no steps logged"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let o = child.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "an interrupted job does not report success"
    );
    let out = text(&o);
    assert!(
        out.contains("stopped: checkpoint saved after step"),
        "{out}"
    );
    assert!(out.contains("--resume"), "{out}");
    let stopped = step_losses(&run).last().expect("logged steps").0;
    let o = ranks(
        2,
        &mt_args(&d, &run, &["--epochs", "1", "--resume", "--max-steps", "2"]),
    );
    succeeded(&o);
    let after: Vec<u64> = step_losses(&run).iter().map(|s| s.0).collect();
    assert!(after.contains(&(stopped + 1)), "{stopped} {after:?}");
    let _ = std::fs::remove_dir_all(&d);
}

/// Training steps logged so far (0 before the run's metrics file exists).
fn step_losses_so_far(run: &Path) -> usize {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .map(|t| t.lines().filter(|l| l.contains("\"train\"")).count())
        .unwrap_or(0)
}

#[test]
fn a_run_moves_between_two_ranks_and_one_process_with_the_same_global_batch() {
    let d = corpus_dir("resume", 600);
    let (run, reference) = (d.join("run"), d.join("reference"));
    let o = single(&mt_args(
        &d,
        &reference,
        &["--max-steps", "15", "--accumulate", "2"],
    ));
    succeeded(&o);

    let o = ranks(2, &mt_args(&d, &run, &["--max-steps", "5"]));
    succeeded(&o);
    // One process with a step per batch would change the global batch: refused, with the fix.
    let o = single(&mt_args(&d, &run, &["--max-steps", "5", "--resume"]));
    let err = failed(&o);
    assert!(
        err.contains("the run takes 2 batch(es) per optimizer step")
            && err.contains("give --accumulate 2 with 1 process(es)"),
        "{err}"
    );
    let o = single(&mt_args(
        &d,
        &run,
        &["--max-steps", "5", "--resume", "--accumulate", "2"],
    ));
    succeeded(&o);
    // Back on 2 ranks the run's --accumulate 2 would make a global batch of 4: refused.
    let o = ranks(2, &mt_args(&d, &run, &["--max-steps", "5", "--resume"]));
    let err = failed(&o);
    assert!(
        err.contains("give --accumulate 1 with 2 process(es)"),
        "{err}"
    );
    let o = ranks(
        2,
        &mt_args(
            &d,
            &run,
            &["--max-steps", "5", "--resume", "--accumulate", "1"],
        ),
    );
    succeeded(&o);

    let (a, b) = (step_losses(&run), step_losses(&reference));
    assert_eq!(a.len(), 15);
    let loss_diff = compare_losses(&a, &b);
    let weight_diff = checkpoint_difference(&run, &reference);
    println!(
        "2 ranks, 1 process --accumulate 2, 2 ranks (5 steps each) vs 15 steps of 1 process \
         --accumulate 2: max relative difference of the losses {loss_diff:.3e}, of the \
         weights {weight_diff:.3e}"
    );
    assert!(loss_diff <= 1e-6 && weight_diff <= 1e-6);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_rank_that_disagrees_or_cannot_read_the_data_fails_the_job_before_any_step() {
    let d = corpus_dir("disagree", 100);
    // Rank 1 is started with another seed (MPI's MPMD form: one command per rank).
    let run = d.join("seed");
    let a = mt_args(&d, &run, &["--seed", "1"]);
    let b = mt_args(&d, &run, &["--seed", "2"]);
    let o = two_commands(&a, &b);
    let err = failed(&o);
    assert!(
        err.contains("rank 1's configuration differs from rank 0's"),
        "{err}"
    );
    assert_no_step(&run);

    // Rank 1 cannot read its training data.
    let run = d.join("data");
    let a = mt_args(&d, &run, &[]);
    let missing = d.join("missing.de").display().to_string();
    let b: Vec<String> = a
        .iter()
        .map(|s| {
            if s.ends_with("train.de") {
                missing.clone()
            } else {
                s.clone()
            }
        })
        .collect();
    let started = Instant::now();
    let o = two_commands(&a, &b);
    let out = failed(&o);
    assert!(
        out.contains("error: rank 1 of 2") && out.contains("missing.de"),
        "{out}"
    );
    assert_no_step(&run);
    assert!(started.elapsed() < Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&d);
}

/// The language model: 2 ranks equal one process with `--accumulate 2`, validation included.
#[test]
fn lm_two_ranks_follow_one_process_accumulating_two_windows() {
    let d = temp_dir("lm");
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far",
    ];
    for (split, n) in [("train", 3000), ("valid", 300), ("test", 300)] {
        let mut s = String::new();
        for i in 0..n {
            s.push_str(words[(i * 7 + i / 3) % words.len()]);
            s.push(if i % 11 == 10 { '\n' } else { ' ' });
        }
        std::fs::write(d.join(format!("{split}.txt")), s).unwrap();
    }
    let args = |out: &Path, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "lm",
            "train",
            "--data",
            &d.display().to_string(),
            "--emsize",
            "16",
            "--nhid",
            "16",
            "--nhead",
            "2",
            "--batch-size",
            "4",
            "--bptt",
            "8",
            "--log-interval",
            "1",
            "--epochs",
            "1",
            "--max-batches",
            "40",
            "--precision",
            "f32",
            "--out",
            &out.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let (r2, r1) = (d.join("ranks2"), d.join("acc2"));
    let o = ranks(2, &args(&r2, &[]));
    succeeded(&o);
    let o = single(&args(&r1, &["--accumulate", "2"]));
    succeeded(&o);
    let (a, b) = (step_losses(&r2), step_losses(&r1));
    assert!(!a.is_empty());
    let loss_diff = compare_losses(&a, &b);
    let weight_diff = checkpoint_difference(&r2, &r1);
    println!("lm: 2 ranks vs --accumulate 2: losses {loss_diff:.3e}, weights {weight_diff:.3e}");
    assert!(loss_diff <= 1e-6 && weight_diff <= 1e-6);
    let (v2, v1) = (records(&r2, "valid"), records(&r1, "valid"));
    assert!(!v2.is_empty());
    for ((a, _), (b, _)) in v2.iter().zip(&v1) {
        assert!((a - b).abs() <= 1e-12 * a.abs(), "{v2:?} {v1:?}");
    }
    let _ = std::fs::remove_dir_all(&d);
}
