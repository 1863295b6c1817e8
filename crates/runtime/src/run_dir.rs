//! The run directory: its paths, its lock, and the tagged tensor files of checkpoints and weights.

use crate::checkpoint::{self};
use crate::error::{Error, Result};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The prefix of the weight average's tensors in a checkpoint (`average.<name>`).
pub const AVERAGE_PREFIX: &str = "average.";

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

/// The lock file of a run directory: held (an OS lock, released when the process ends,
/// however it ends) by the training process using the directory, holding its process id.
pub fn lock_path(run: &Path) -> PathBuf {
    run.join("lock")
}

/// A run directory locked for one training process ([`open_run_dir`]); dropping it unlocks.
#[derive(Debug)]
pub struct RunLock {
    _file: std::fs::File,
}

/// The lock file names its holder only while it is held: a process that ends (or is
/// refused) leaves it as it found it, empty.
impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = self._file.set_len(0);
    }
}

impl RunLock {
    /// Locks the run directory `run` (which exists) or says which process holds it.
    pub fn acquire(run: &Path) -> Result<Self> {
        use std::io::{Read, Seek};
        let path = lock_path(run);
        let io = Error::io(&path);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(Error::Usage(format!(
                    "{} is in use by another training process{}: wait for it to end (or stop \
                     it), or choose another --out",
                    run.display(),
                    if pid.is_empty() {
                        String::new()
                    } else {
                        format!(" (pid {pid})")
                    }
                )));
            }
            // A file system without locks: the run goes on unlocked, as it always did.
            Err(std::fs::TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file })
    }
}

/// Checks `run` against `resume`, creates it and locks it for this process ([`RunLock`]);
/// returns whether a checkpoint is resumed, and the lock to hold while training. Starting
/// over a run, resuming where there is nothing to resume, or a directory another process
/// trains in, is an error that says what to do.
pub fn open_run_dir(run: &Path, resume: bool) -> Result<(bool, RunLock)> {
    if run.exists() && !run.is_dir() {
        return Err(Error::Usage(format!(
            "--out {} is a file, not a directory: choose another --out",
            run.display()
        )));
    }
    if resume && !run.is_dir() {
        return Err(Error::Usage(format!(
            "{}: no such run directory, so nothing to resume; start the run without --resume",
            run.display()
        )));
    }
    std::fs::create_dir_all(run).map_err(|e| {
        Error::Usage(format!(
            "--out {}: cannot create the run directory ({e}): choose another --out",
            run.display()
        ))
    })?;
    let lock = RunLock::acquire(run)?;
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
    Ok((resume, lock))
}

/// Checks that the trained run `run` exists; else an error that says how one is made
/// (`made_by`, the commands: "`transformer mt train --out DIR`").
pub fn check_run_exists(run: &Path, made_by: &str) -> Result<()> {
    if run.is_dir() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{}: no such run directory (create one with {made_by})",
        run.display()
    )))
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

/// The weights file a trained model is loaded from: `best.safetensors`, or, before the
/// first epoch has ended, the latest checkpoint, with a note saying so (for the front end
/// to print). A damaged `best.safetensors` is never skipped for the checkpoint silently:
/// [`with_fallback_advice`] says how to use the checkpoint instead.
pub fn weights_file(run: &Path) -> (PathBuf, Option<String>) {
    if best_path(run).exists() {
        (best_path(run), None)
    } else {
        (
            checkpoint_path(run),
            Some(format!(
                "{} has no best.safetensors (one is written when the first epoch ends): using \
                 the latest checkpoint's weights, checkpoint.safetensors",
                run.display()
            )),
        )
    }
}

/// `e`, an error loading `path` (a run's weights file), with what to fall back to when the
/// file is `best.safetensors` and the run has a checkpoint.
pub fn with_fallback_advice(e: Error, run: &Path, path: &Path) -> Error {
    match e {
        Error::Checkpoint { path: p, msg }
            if path == best_path(run) && checkpoint_path(run).exists() =>
        {
            Error::Checkpoint {
                msg: format!(
                    "{msg}; to use the run's latest checkpoint instead, move this file aside \
                     (mv {} {}.damaged)",
                    p.display(),
                    p.display()
                ),
                path: p,
            }
        }
        e => e,
    }
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

/// The text of the file `path` (an error names it).
pub(crate) fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.into(),
        source,
    })
}

/// Reads the TOML file `path` as a `T` (a task's configuration: any subset of its keys, the
/// rest at their defaults; or a bare table).
pub fn read_toml_file<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_text(path)?;
    toml::from_str(&text).map_err(|e| Error::Config {
        path: path.into(),
        msg: e.to_string(),
    })
}

/// `path` made absolute (canonical where it exists), so that a run's configuration names
/// its files wherever the run is resumed from.
pub fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Checks settings that must be at least 1: the first that is 0 comes back as the message
/// "`name` must be at least 1" (names as the caller shows them: a config key or a flag).
pub fn require_at_least_one(settings: &[(&str, usize)]) -> std::result::Result<(), String> {
    match settings.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(format!("{name} must be at least 1")),
        None => Ok(()),
    }
}
