//! What the command-line tests share: the binary, fresh folders, the toy translation corpus
//! and its tiny model, the browser. Each test file uses some of it.
#![allow(dead_code)]

pub mod serve;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The `transformer` binary built for these tests.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_transformer"))
}

/// A finished command's stdout then its stderr, as one text.
pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Asserts that a command succeeded (its stdout and stderr in the message otherwise) and
/// returns its stdout and stderr as one text.
pub fn succeeded(o: &Output) -> String {
    let text = output_text(o);
    assert!(o.status.success(), "{text}");
    text
}

/// Asserts that a command failed (its stdout and stderr in the message otherwise) and
/// returns its stdout and stderr as one text.
pub fn failed(o: &Output) -> String {
    let text = output_text(o);
    assert!(!o.status.success(), "{text}");
    text
}

/// Asserts that a command failed (its stderr in the message otherwise) and returns its
/// stderr: where the error must be said.
pub fn failure_stderr(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    err
}

/// Asserts that `text` (an error message, a log) mentions each of `parts`, the whole text in
/// the message otherwise.
pub fn assert_mentions(text: &str, parts: &[&str]) {
    assert!(parts.iter().all(|p| text.contains(p)), "{text}");
}

/// `mt translate --run RUN` with `flags`, `input` on its stdin: its output, whatever its
/// exit status.
pub fn mt_translate_stdin(run: &Path, flags: &[&str], input: &str) -> Output {
    let mut child = bin()
        .args(["mt", "translate", "--run"])
        .arg(run)
        .args(flags)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh, empty folder `<prefix>-<name>-<pid>` under the system's temporary folder.
pub fn temp_dir(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The toy corpus's source words (German).
pub const GERMAN: [&str; 9] = [
    "ein", "hund", "läuft", "schnell", "zwei", "katzen", "schlafen", "im", "haus",
];

/// The toy corpus's target words, word `k` translating `GERMAN[k]`.
pub const ENGLISH: [&str; 9] = [
    "a", "dog", "runs", "fast", "two", "cats", "sleep", "in", "house",
];

/// A toy language pair in `dir`: `SPLIT.de` and `SPLIT.en` for each (split, lines) of
/// `splits`; each source word (of `src_words`) maps to one English word, order reversed.
pub fn write_toy_corpus(dir: &Path, src_words: &[&str], splits: &[(&str, usize)]) {
    for &(split, n) in splits {
        let (mut s, mut t) = (String::new(), String::new());
        for i in 0..n {
            let len = 2 + (i * 7 + split.len()) % 5;
            let ids: Vec<usize> = (0..len).map(|j| (i * 13 + j * 5 + j * j) % 9).collect();
            let words: Vec<&str> = ids.iter().map(|&k| src_words[k]).collect();
            s.push_str(&(words.join(" ") + " .\n"));
            let back: Vec<&str> = ids.iter().rev().map(|&k| ENGLISH[k]).collect();
            t.push_str(&(back.join(" ") + " .\n"));
        }
        std::fs::write(dir.join(format!("{split}.de")), s).unwrap();
        std::fs::write(dir.join(format!("{split}.en")), t).unwrap();
    }
}

/// The `mt train` flags naming the toy corpus's files in `data`: its train, valid and test
/// splits.
pub fn toy_corpus_flags(data: &Path) -> Vec<String> {
    let mut flags = Vec::new();
    for split in ["train", "valid", "test"] {
        for (side, ext) in [("src", "de"), ("tgt", "en")] {
            flags.push(format!("--{split}-{side}"));
            flags.push(data.join(format!("{split}.{ext}")).display().to_string());
        }
    }
    flags
}

/// The tiny model's `mt train` flags: the model of `write_tiny_config`.
pub const TINY_MODEL_FLAGS: [&str; 12] = [
    "--vocab-size",
    "60",
    "--d-model",
    "32",
    "--nhead",
    "4",
    "--layers",
    "2",
    "--dim-feedforward",
    "64",
    "--warmup",
    "30",
];

/// `dir/config.toml` naming the toy corpus's files in `dir` (by their full paths, or
/// relative to `dir` when `relative`: runs are then started from `dir`; the test split when
/// `test`), the tiny model (2 + 2 layers, d_model 32, 4 heads, FFN 64, a vocabulary of 60),
/// then `extra` (more keys, one per line).
pub fn write_tiny_config(dir: &Path, relative: bool, test: bool, extra: &str) {
    let file = |name: &str| {
        if relative {
            name.to_string()
        } else {
            dir.join(name).display().to_string()
        }
    };
    let mut keys = String::new();
    let mut splits = vec!["train", "valid"];
    if test {
        splits.push("test");
    }
    for split in splits {
        for (side, ext) in [("src", "de"), ("tgt", "en")] {
            keys += &format!("{split}_{side} = \"{}\"\n", file(&format!("{split}.{ext}")));
        }
    }
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "{keys}vocab_size = 60\nd_model = 32\nnhead = 4\nencoder_layers = 2\n\
             decoder_layers = 2\ndim_feedforward = 64\nwarmup = 30\n{extra}"
        ),
    )
    .unwrap();
}

/// The toy corpus (German source) with `splits` in `dir`, and its `config.toml` for the
/// tiny model with the training settings `extra` (`write_tiny_config`: file names relative
/// to `dir` when `relative`; the test split named when `splits` has one).
pub fn write_toy_run_files(dir: &Path, splits: &[(&str, usize)], relative: bool, extra: &str) {
    write_toy_corpus(dir, &GERMAN, splits);
    let test = splits.iter().any(|&(split, _)| split == "test");
    write_tiny_config(dir, relative, test, extra);
}

/// A headless Chromium: `CHROMIUM`, or the first of chromium, chromium-browser and
/// google-chrome on the PATH.
pub fn chromium() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            let out = Command::new("which").arg(name).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// Each line of `text` parsed as JSON: the records of a run's metrics.jsonl, the lines of
/// a `--json` output.
pub fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every tensor of a safetensors file, flattened to f32 values, by name.
pub fn weights(path: &Path) -> std::collections::HashMap<String, Vec<f32>> {
    candle_core::safetensors::load(path, &candle_core::Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}
