//! What the training tests share: a progress sink that prints nothing, fresh folders, and
//! the options of a run started from scratch on the CPU. Each test file uses some of it.
#![allow(dead_code)]

use candle_core::Device;
use std::path::{Path, PathBuf};
use transformer_runtime::config::MtTrainConfig;
use transformer_train::runner::{Progress, RunOptions};

/// Progress that prints nothing: the tests read the summaries and the run's files instead.
pub struct Quiet;
impl Progress for Quiet {
    fn line(&mut self, _: &str) {}
}

/// A fresh, empty folder `<prefix>-<name>-<pid>` under the system's temporary folder.
pub fn temp_dir(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Removes each folder of `dirs` with what it holds, once a test is done with them.
pub fn remove_dirs<const N: usize>(dirs: [PathBuf; N]) {
    for d in dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A run of `config` into `out` from scratch on the CPU, to its end: no resume, no stop, no
/// interrupt, one process, no settings marked as given. Tests change what they exercise
/// with struct-update syntax (`RunOptions { resume: true, ..fresh(cfg, out) }`).
pub fn fresh<C>(config: C, out: impl Into<PathBuf>) -> RunOptions<C> {
    RunOptions {
        config,
        out: out.into(),
        resume: false,
        stop_after_steps: None,
        crash_after_steps: None,
        dist: Default::default(),
        interrupt: None,
        device: Device::Cpu,
        given: Vec::new(),
    }
}

/// Flips the bits of `mask` in the middle byte of the file at `path` (damage a checksum must
/// catch) and returns the file's bytes as they were, to put back.
pub fn flip_middle_byte(path: &Path, mask: u8) -> Vec<u8> {
    let good = std::fs::read(path).unwrap();
    let mut bytes = good.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= mask;
    std::fs::write(path, &bytes).unwrap();
    good
}

/// A tiny translation model on the toy corpus in `dir`: `train.de`/`train.en` and
/// `valid.de`/`valid.en` (and `test.de`/`test.en` when `test`), a vocabulary of `vocab_size`,
/// `layers` encoder and as many decoder layers of width `d_model` with `nhead` heads and a
/// feed-forward layer of `dim_feedforward`; everything else as by default.
pub fn tiny_mt_config(
    dir: &Path,
    test: bool,
    vocab_size: usize,
    d_model: usize,
    nhead: usize,
    layers: usize,
    dim_feedforward: usize,
) -> MtTrainConfig {
    let file = |name: &str| Some(dir.join(name));
    MtTrainConfig {
        train_src: file("train.de"),
        train_tgt: file("train.en"),
        valid_src: file("valid.de"),
        valid_tgt: file("valid.en"),
        test_src: test.then(|| dir.join("test.de")),
        test_tgt: test.then(|| dir.join("test.en")),
        vocab_size,
        d_model,
        nhead,
        encoder_layers: layers,
        decoder_layers: layers,
        dim_feedforward,
        ..MtTrainConfig::default()
    }
}
