//! What the command-line tests share: the binary, fresh folders, the toy translation corpus
//! and its tiny model, the browser. Each test file uses some of it.
#![allow(dead_code)]

pub mod serve;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `transformer` binary built for these tests.
pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_transformer"))
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

/// Every tensor of a safetensors file, flattened to f32 values, by name.
pub fn weights(path: &Path) -> std::collections::HashMap<String, Vec<f32>> {
    candle_core::safetensors::load(path, &candle_core::Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}
