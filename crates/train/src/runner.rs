//! What every training task shares: the run directory (fresh or resumed), progress
//! callbacks, stop requests (Ctrl-C, a step budget), and the files of named tensors with a
//! format tag that every checkpoint and weight file is.
//!
//! The language model ([`crate::lm`]) and translation ([`crate::mt`]) run their loops in
//! the same order on these pieces: data, model, optimizer, then per batch step / log /
//! checkpoint, per epoch validate / keep the best / checkpoint / plot, at the end test.

use crate::checkpoint;
use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use transformer_model::Params;

/// Callbacks for the front end: log lines and per-batch progress.
pub trait Progress {
    /// A line of the log (printed as is).
    fn line(&mut self, line: &str);
    /// Called after every training batch (and, at the end, every decoded batch).
    fn batch(&mut self, _epoch: usize, _done: usize, _total: usize) {}
}

/// Prints log lines to stdout.
pub struct PrintProgress;

impl Progress for PrintProgress {
    fn line(&mut self, line: &str) {
        println!("{line}");
    }
}

/// How to run a task's training: its configuration, the run directory, and when to stop.
#[derive(Debug, Clone)]
pub struct RunOptions<C> {
    /// The task's configuration (ignored when resuming: the checkpoint's is used).
    pub config: C,
    /// The run directory.
    pub out: PathBuf,
    /// Continue the run in `out` from its checkpoint.
    pub resume: bool,
    /// Stop (as if interrupted) after this many optimizer steps in this invocation.
    pub stop_after_steps: Option<usize>,
    /// When set (by a Ctrl-C handler, say), save a checkpoint after the current batch and
    /// return; `--resume` continues from there.
    pub interrupt: Option<Arc<AtomicBool>>,
    pub device: Device,
}

impl<C> RunOptions<C> {
    /// Whether the interrupt flag is raised.
    pub fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    }
}

/// The state of a run as a checkpoint's metadata: the progress (JSON) and the resolved
/// configuration (TOML).
pub fn state_meta<S: serde::Serialize>(
    state: &S,
    config_toml: String,
) -> [(&'static str, String); 2] {
    [
        (
            "state",
            serde_json::to_string(state).expect("state serializes"),
        ),
        ("config", config_toml),
    ]
}

/// The latest resumable state of a run.
pub fn checkpoint_path(run: &Path) -> PathBuf {
    run.join("checkpoint.safetensors")
}

/// The best weights by validation.
pub fn best_path(run: &Path) -> PathBuf {
    run.join("best.safetensors")
}

/// One JSON object per log line, validation and test result.
pub fn metrics_path(run: &Path) -> PathBuf {
    run.join("metrics.jsonl")
}

/// The resolved configuration.
pub fn config_path(run: &Path) -> PathBuf {
    run.join("config.toml")
}

/// Checks `run` against `resume` and creates it; returns whether a checkpoint is resumed.
/// Starting over a run, or resuming where there is nothing to resume, is an error that says
/// what to do.
pub fn open_run_dir(run: &Path, resume: bool) -> Result<bool> {
    let has_checkpoint = checkpoint_path(run).exists();
    if resume && !has_checkpoint {
        return Err(Error::Usage(format!(
            "{}: nothing to resume (no checkpoint.safetensors); start the run without --resume",
            run.display()
        )));
    }
    if !resume && has_checkpoint {
        return Err(Error::Usage(format!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            run.display()
        )));
    }
    std::fs::create_dir_all(run).map_err(|source| Error::Io {
        path: run.into(),
        source,
    })?;
    Ok(resume)
}

/// The parameters as named tensors (what a weights file holds).
pub fn params_tensors(params: &Params) -> Vec<(String, Tensor)> {
    params
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
        .collect()
}

/// Saves `tensors` with a format tag and more metadata, atomically.
pub fn save_tagged(
    path: &Path,
    tensors: &[(String, Tensor)],
    format: &str,
    meta: impl IntoIterator<Item = (&'static str, String)>,
) -> Result<()> {
    let mut m: HashMap<String, String> = meta.into_iter().map(|(k, v)| (k.into(), v)).collect();
    m.insert("format".into(), format.into());
    checkpoint::save(path, tensors, m)
}

/// Loads a file of tensors and checks its format tag; a file of another task says so.
pub fn load_tagged(
    path: &Path,
    want: &str,
    device: &Device,
) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let (tensors, meta) = checkpoint::load(path, device)?;
    check_format(path, &meta, want)?;
    Ok((tensors, meta))
}

/// Checks a file's format tag against `want` (`transformer-<task>-<kind>/<version>`).
pub fn check_format(path: &Path, meta: &HashMap<String, String>, want: &str) -> Result<()> {
    let task = |tag: &str| tag.split('-').nth(1).unwrap_or("").to_string();
    match meta.get("format") {
        Some(f) if f == want => Ok(()),
        Some(f) if f.starts_with("transformer-") && task(f) != task(want) => {
            Err(Error::Checkpoint {
                path: path.into(),
                msg: format!(
                    "this file belongs to a {} run ({f}), not a {} run ({want}): use it with \
                     `transformer {}` commands, or pass a run made by `transformer {} train`",
                    task(f),
                    task(want),
                    task(f),
                    task(want)
                ),
            })
        }
        Some(f) => Err(Error::Checkpoint {
            path: path.into(),
            msg: format!("format {f:?}, expected {want:?}"),
        }),
        None => Err(Error::Checkpoint {
            path: path.into(),
            msg: format!("no format tag (expected {want:?})"),
        }),
    }
}

/// A value from a file's metadata, parsed as JSON.
pub fn meta_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    meta: &HashMap<String, String>,
    key: &str,
) -> Result<T> {
    let text = meta.get(key).ok_or_else(|| Error::Checkpoint {
        path: path.into(),
        msg: format!("no {key} in the metadata"),
    })?;
    serde_json::from_str(text).map_err(|e| Error::Checkpoint {
        path: path.into(),
        msg: format!("{key}: {e}"),
    })
}
