//! `--device`: every command that runs a model takes it; a GPU asked of a binary built without
//! CUDA, or a device name that is not one, is refused with a message that says what to do;
//! and `--device cpu` is the default exactly (same translations, same training losses).

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{bin, mt_translate_stdin, temp_dir as temp, write_toy_run_files};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    temp("device", name)
}

/// Every command that trains, evaluates, translates, generates or benchmarks a model, with
/// the arguments it needs to get as far as opening the device (the paths need not exist:
/// the device is opened before anything is read).
fn model_commands(dir: &Path) -> Vec<Vec<String>> {
    let run = dir.join("no-run").display().to_string();
    let file = dir.join("no-file").display().to_string();
    let out = dir.join("out").display().to_string();
    let cmds: Vec<Vec<&str>> = vec![
        vec!["copy-task", "--steps", "1"],
        vec!["lm", "train", "--out", &out, "--max-steps", "1"],
        vec!["lm", "eval", "--run", &run, "--text", &file],
        vec!["lm", "generate", "--run", &run, "--prompt", "the"],
        vec!["lm", "attention", "--run", &run, "--text", "the"],
        vec!["mt", "train", "--out", &out, "--max-steps", "1"],
        vec!["mt", "translate", "--run", &run, "--src", &file],
        vec!["mt", "eval", "--run", &run, "--src", &file, "--ref", &file],
        vec!["mt", "attention", "--run", &run, "--src", "ein hund"],
        vec!["serve", "--run", &run, "--port", "0"],
        vec!["bench", "lm", "--repeats", "1"],
        vec!["bench", "mt", "--repeats", "1"],
        vec!["bench", "mt-decode", "--run", &run, "--src", &file],
    ];
    cmds.into_iter()
        .map(|c| c.into_iter().map(String::from).collect())
        .collect()
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_in_a_build_without_the_feature_says_how_to_build_one() {
    let dir = temp_dir("no-cuda");
    for cmd in model_commands(&dir) {
        for device in ["cuda", "cuda:1"] {
            let o = bin()
                .args(&cmd)
                .args(["--device", device])
                .output()
                .unwrap();
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(1), "{cmd:?} --device {device}: {err}");
            assert!(
                err.contains("built without CUDA support") && err.contains("scripts/build_cuda.sh"),
                "{cmd:?} --device {device}: {err}"
            );
            let want = if device == "cuda" { "cuda:0" } else { "cuda:1" };
            assert!(err.contains(&format!("--device {want}")), "{cmd:?}: {err}");
            // Nothing was started: no run directory, no output.
            assert!(!dir.join("out").exists(), "{cmd:?} wrote its run directory");
            assert_eq!(text(&o.stdout), "", "{cmd:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_device_that_is_not_one_is_a_usage_error_naming_the_forms() {
    let dir = temp_dir("bad-name");
    for cmd in model_commands(&dir) {
        let o = bin()
            .args(&cmd)
            .args(["--device", "cuda:x"])
            .output()
            .unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(
            err.contains("invalid value 'cuda:x' for '--device")
                && err.contains("must be a whole number"),
            "{cmd:?}: {err}"
        );
    }
    let o = bin()
        .args(["copy-task", "--device", "gpu"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("use cpu, cuda (the first GPU) or cuda:N"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Commands that run a model say on stderr where it runs.
fn device_line(o: &Output) -> String {
    text(&o.stderr)
        .lines()
        .find(|l| l.starts_with("device: "))
        .unwrap_or_else(|| panic!("no device line in: {}", text(&o.stderr)))
        .to_string()
}

/// The copy task's output without its wall-clock figures ("| 5.4 ms/step", "trained in
/// 0.8s; ", ", 3.1s in all").
fn without_timing(stdout: &[u8]) -> String {
    text(stdout)
        .lines()
        .map(|l| {
            let l = match l.strip_prefix("trained in ") {
                Some(rest) => rest.split_once("; ").map_or(rest, |(_, r)| r),
                None => l,
            };
            let l = match l.rfind(", ") {
                Some(i) if l.ends_with("s in all") => &l[..i],
                _ => l,
            };
            l.split(" | ")
                .filter(|field| !field.ends_with(" ms/step"))
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn device_cpu_trains_exactly_as_the_default() {
    let args = [
        "copy-task",
        "--steps",
        "40",
        "--log-every",
        "10",
        "--seed",
        "3",
    ];
    let default = bin().args(args).output().unwrap();
    let cpu = bin().args(args).args(["--device", "cpu"]).output().unwrap();
    assert!(default.status.success(), "{}", text(&default.stderr));
    assert!(cpu.status.success(), "{}", text(&cpu.stderr));
    let (a, b) = (without_timing(&default.stdout), without_timing(&cpu.stdout));
    assert!(
        a.contains("step    40/40 | lr 7.07e-3 | loss "),
        "no losses logged: {a}"
    );
    assert!(!a.contains("ms/step"), "{a}");
    assert_eq!(a, b);
    for o in [&default, &cpu] {
        assert_eq!(
            device_line(o),
            "device: cpu (candle's CPU ops, and the fused f32 kernels where they apply)"
        );
    }
}

/// A toy language pair (order reversed, one word for one) and a config naming its files.
fn write_corpus(dir: &Path) {
    let splits = [("train", 120), ("valid", 8), ("test", 8)];
    write_toy_run_files(dir, &splits, true, SETTINGS);
}

/// The training settings of the test's run.
const SETTINGS: &str = "lr_factor = 0.1\nepochs = 1\nmax_tokens = 160\nmax_batches = 8\nbeam = 2\n";

#[test]
fn device_cpu_translates_exactly_as_the_default() {
    let dir = temp_dir("translate");
    write_corpus(&dir);
    let run = dir.join("run");
    let o = bin()
        .current_dir(&dir)
        .args(["mt", "train", "--config", "config.toml", "--out"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        device_line(&o),
        "device: cpu (candle's CPU ops, and the fused f32 kernels where they apply)"
    );
    let input = "ein hund läuft .\nzwei katzen schlafen .\nkatzen .\n";
    for extra in [&[][..], &["--beam", "1"][..]] {
        let default = mt_translate_stdin(&run, extra, input);
        let cpu = mt_translate_stdin(&run, &[extra, &["--device", "cpu"][..]].concat(), input);
        assert!(default.status.success(), "{}", text(&default.stderr));
        assert!(cpu.status.success(), "{}", text(&cpu.stderr));
        assert_eq!(text(&default.stdout).lines().count(), 3);
        assert_eq!(text(&default.stdout), text(&cpu.stdout), "{extra:?}");
        assert_eq!(device_line(&default), device_line(&cpu));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
