//! What every training task shares: the run directory (fresh or resumed), progress
//! callbacks, stop requests (Ctrl-C, a step budget), and the files of named tensors with a
//! format tag that every checkpoint and weight file is.
//!
//! The language model ([`crate::lm`]) and translation ([`crate::mt`]) run their loops in
//! the same order on these pieces: data, model, optimizer, then per batch step / log /
//! checkpoint, per epoch validate / keep the best / checkpoint / plot, at the end test.

use crate::average::WeightAverage;
use crate::checkpoint::{self, params_tensors};
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::metrics::{self, Metric, Weights};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use transformer_model::{ParamBuilder, Params, Rng};

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
    /// Stop after this many optimizer steps in this invocation, saving a checkpoint
    /// (`--resume` continues exactly there).
    pub stop_after_steps: Option<usize>,
    /// Stop after this many steps without saving, as a killed process would (tests: resume
    /// then starts from the last periodic checkpoint).
    pub crash_after_steps: Option<usize>,
    /// When set (by a Ctrl-C handler, say), save a checkpoint after the current batch and
    /// return; `--resume` continues from there.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// The device the model is built and trained on.
    pub device: Device,
    /// The settings of `config` the user gave for this invocation (flags, keys of a
    /// `--config` file), as opposed to defaults. On resume each is compared with the run's
    /// own configuration: one that may change on resume takes effect and the log says so, one
    /// that may not is an error ([`resume_config`]).
    pub given: Vec<Given>,
    /// The processes the run trains in ([`crate::dist`]): one by default; with several,
    /// rank 0 alone writes the run's files.
    pub dist: crate::dist::Dist,
}

/// A setting given for this invocation: its configuration key and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Given {
    /// The configuration key (`d_model`).
    pub key: String,
    /// Where it was given, as the user wrote it (`--d-model`, `d_model in --config x.toml`).
    pub from: String,
}

impl Given {
    /// A setting given as the flag `from`.
    pub fn new(key: &str, from: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            from: from.into(),
        }
    }

    /// The keys of the TOML file `path` (a `--config` file), each given as `KEY in --config
    /// PATH`.
    pub fn from_config_file(path: &Path) -> Result<Vec<Given>> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| Error::Config {
            path: path.into(),
            msg: e.to_string(),
        })?;
        Ok(table
            .keys()
            .map(|k| Given::new(k, format!("{k} in --config {}", path.display())))
            .collect())
    }
}

/// The configuration a resumed run continues with: the run's own (`saved`), with each
/// setting of `given` taken from `asked` where it differs and `may_change` lists it (the log
/// lines returned say what changed). A differing setting that may not change on resume is an
/// error listing every such setting, the run's value and what to do.
pub fn resume_config<C: Serialize + serde::de::DeserializeOwned>(
    run: &Path,
    saved: &C,
    asked: &C,
    given: &[Given],
    may_change: &[&str],
) -> Result<(C, Vec<String>)> {
    let table = |c: &C| match toml::Value::try_from(c) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    let (mut merged, asked) = (table(saved), table(asked));
    let show = |v: Option<&toml::Value>| v.map_or("none".to_string(), |v| v.to_string());
    let (mut notes, mut conflicts) = (Vec::new(), Vec::new());
    let mut seen = std::collections::HashSet::new();
    for g in given {
        if !seen.insert(&g.key) {
            continue;
        }
        let (old, new) = (merged.get(&g.key).cloned(), asked.get(&g.key).cloned());
        if old == new {
            continue;
        }
        if may_change.contains(&g.key.as_str()) {
            notes.push(format!(
                "resume: {} changes {} from {} to {}",
                g.from,
                g.key,
                show(old.as_ref()),
                show(new.as_ref())
            ));
            match new {
                Some(v) => merged.insert(g.key.clone(), v),
                None => merged.remove(&g.key),
            };
        } else {
            conflicts.push(format!(
                "  {}: {} (the run has {} = {})",
                g.from,
                show(new.as_ref()),
                g.key,
                show(old.as_ref())
            ));
        }
    }
    if !conflicts.is_empty() {
        return Err(Error::Usage(format!(
            "{}: --resume continues the run as it was configured, and these settings cannot \
             change on resume:\n{}\nDrop them (or give the run's values) to resume, or start a \
             new run with another --out. What may change on resume: {}.",
            run.display(),
            conflicts.join("\n"),
            may_change.join(", ")
        )));
    }
    let c = toml::Value::Table(merged)
        .try_into()
        .map_err(|e: toml::de::Error| Error::Config {
            path: config_path(run),
            msg: e.to_string(),
        })?;
    Ok((c, notes))
}

/// `path` made absolute (canonical where it exists), so that a run's configuration names
/// its files wherever the run is resumed from.
pub fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Checks, on resume, that the files a run's configuration names exist: `paths` are
/// `(key, path)`; one missing and not given again for this invocation is an error that says
/// it comes from the run's `config.toml` and how to point elsewhere.
pub fn check_recorded_paths(
    run: &Path,
    paths: &[(&str, &Option<PathBuf>)],
    given: &[Given],
) -> Result<()> {
    for (key, p) in paths {
        let Some(p) = p else { continue };
        if p.exists() || given.iter().any(|g| g.key == *key) {
            continue;
        }
        return Err(Error::Usage(format!(
            "{}: no such file or folder; the run's configuration ({}) names it as {key}: if it \
             moved, pass --{} PATH again with --resume (the data's location may change on \
             resume)",
            p.display(),
            config_path(run).display(),
            key.replace('_', "-")
        )));
    }
    Ok(())
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

impl RunLock {
    /// Locks the run directory `run` (which exists) or says which process holds it.
    pub fn acquire(run: &Path) -> Result<Self> {
        use std::io::{Read, Seek};
        let path = lock_path(run);
        let io = |source| Error::Io {
            path: path.clone(),
            source,
        };
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

/// Where a run stands, for every task; saved in every checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The epoch in progress (1-based); `epochs + 1` once training is over.
    pub epoch: usize,
    /// Index of the next batch of this epoch.
    #[serde(alias = "next_window")]
    pub next_batch: usize,
    /// Optimizer steps taken.
    pub step: usize,
    /// Dropout RNG `(seed, counter)`.
    pub rng: (u64, u64),
    /// The best model's validation figure (the task's: the LM's loss, translation's BLEU).
    #[serde(alias = "best_val_loss", alias = "best_bleu")]
    pub best: Option<f64>,
    /// Which weights `best.safetensors` holds, and from the end of which epoch.
    #[serde(default)]
    pub best_weights: Weights,
    /// The epoch at whose end the best model was validated (0 before the first).
    #[serde(default)]
    pub best_epoch: usize,
    /// The best figure of the trained weights alone, when the task keeps them apart from an
    /// average that may win ([`Task::BEST_TRAINED_FILE`]).
    #[serde(default, alias = "best_sgd_val_loss")]
    pub best_trained: Option<f64>,
    /// The sum of the training losses ([`StepStats::loss`]) since the last log line.
    pub log_loss_sum: f64,
    /// The sum of the plain cross-entropies ([`StepStats::nll`]) since the last log line.
    #[serde(default)]
    pub log_nll_sum: f64,
    /// The number of batches since the last log line.
    pub log_batches: usize,
    /// The number of target tokens since the last log line.
    #[serde(default)]
    pub log_tokens: usize,
    /// Whether the test has been run.
    pub finished: bool,
    /// The records `metrics.jsonl` held when the checkpoint was written: a resumed run
    /// keeps exactly these and writes the rest again, whatever the moment it was stopped at.
    #[serde(default)]
    pub metrics_records: Option<usize>,
    /// Batches per optimizer step (`--accumulate` x processes, [`crate::dist`]); absent in
    /// checkpoints of runs with one batch per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch: Option<usize>,
}

impl RunState {
    /// A fresh run's state; `rng_seed` seeds dropout.
    pub fn new(rng_seed: u64) -> Self {
        Self {
            epoch: 1,
            next_batch: 0,
            step: 0,
            rng: (rng_seed, 0),
            best: None,
            best_weights: Weights::Sgd,
            best_epoch: 0,
            best_trained: None,
            log_loss_sum: 0.0,
            log_nll_sum: 0.0,
            log_batches: 0,
            log_tokens: 0,
            finished: false,
            metrics_records: None,
            global_batch: None,
        }
    }
}

/// What one training step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// The loss that was differentiated.
    pub loss: f64,
    /// The plain cross-entropy (equal to `loss` without label smoothing).
    pub nll: f64,
    /// Target tokens in the batch.
    pub tokens: usize,
}

/// The batches since the last log line, for a task's log line.
#[derive(Debug, Clone, Copy)]
pub struct LogWindow {
    /// The epoch in progress (1-based).
    pub epoch: usize,
    /// 0-based index of the batch just done.
    pub index: usize,
    /// The epoch's batch count.
    pub batches: usize,
    /// Optimizer steps taken.
    pub step: usize,
    /// The sum of the window's training losses ([`StepStats::loss`]), one per batch.
    pub loss_sum: f64,
    /// The sum of the window's plain cross-entropies ([`StepStats::nll`]), one per batch.
    pub nll_sum: f64,
    /// The number of batches in the window.
    pub count: usize,
    /// The number of target tokens in the window.
    pub tokens: usize,
    /// Wall-clock seconds since the last log line (or the epoch's start).
    pub seconds: f64,
    /// Batches per optimizer step (the global batch): each step's loss counts once per
    /// batch in `loss_sum`, `nll_sum` and `count`.
    pub per_step: usize,
}

/// One validation of one set of weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// Mean cross-entropy per target token.
    pub loss: f64,
    /// Translation: corpus BLEU of the validation set.
    pub bleu: Option<f64>,
}

/// What best-model selection compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The lower validation loss (the language model, the copy task).
    LowerLoss,
    /// The higher validation BLEU (translation).
    HigherBleu,
}

impl Selection {
    /// The figure compared.
    pub fn figure(self, v: &Validation) -> f64 {
        match self {
            Selection::LowerLoss => v.loss,
            Selection::HigherBleu => v.bleu.unwrap_or(f64::NEG_INFINITY),
        }
    }

    /// Whether `new` beats `best`.
    pub fn better(self, new: f64, best: f64) -> bool {
        match self {
            Selection::LowerLoss => new < best,
            Selection::HigherBleu => new > best,
        }
    }
}

/// A training task on the runner: what it trains, on which batches, how a step goes, how
/// it validates and tests. The runner owns the rest: the loop, stops and checkpoints, the
/// weight average, the log and metrics, best-model selection, plots and resume.
pub trait Task {
    /// The model (the trained one, and the weight average's).
    type Model;
    /// The format tag of this task's checkpoints.
    const CHECKPOINT_FORMAT: &'static str;
    /// With a weight average, the file that keeps the best trained weights apart from
    /// `best.safetensors` (which the average may win), or `None` not to keep them.
    const BEST_TRAINED_FILE: Option<&'static str> = None;

    /// The number of epochs to train.
    fn epochs(&self) -> usize;
    /// Batches between resumable checkpoints (0: at epoch ends only).
    fn checkpoint_interval(&self) -> usize;
    /// The task's configuration as saved in checkpoints.
    fn config_toml(&self) -> String;
    /// The model being trained and its parameters.
    fn model(&self) -> &Self::Model;
    /// The trained model's parameters, for the optimizer, checkpoints and the average.
    fn params(&self) -> &Params;
    /// A second model of the same configuration (the weight average's).
    fn build_model(&self, pb: &ParamBuilder) -> transformer_model::Result<Self::Model>;
    /// Saves weights with what it takes to rebuild the model.
    fn save_weights(&self, path: &Path, params: &Params) -> Result<()>;

    /// Prepares `epoch` (1-based: its batch order, its learning rate); returns its number of
    /// batches.
    fn start_epoch(&mut self, epoch: usize) -> Result<usize>;
    /// One optimizer step on batch `index` of the epoch; `step` steps came before it.
    fn train_step(&mut self, index: usize, step: usize, rng: &Rng) -> Result<StepStats>;
    /// Batches whose gradients one process sums before each optimizer step (`--accumulate`,
    /// 1 by default); with several processes each takes this many of a global batch
    /// ([`crate::dist`]).
    fn accumulate(&self) -> usize {
        1
    }
    /// Target tokens of batch `index` of the epoch (the weight of its gradient in a global
    /// batch).
    fn batch_tokens(&self, _index: usize) -> usize {
        1
    }
    /// The loss of batch `index` and its gradients (of the mean loss per target token), with
    /// dropout from `rng`, without an optimizer step (accumulation and data parallelism).
    fn backward(&mut self, _index: usize, _rng: &Rng) -> Result<(Gradients, StepStats)> {
        Err(Error::Usage(
            "this task trains one batch per step (no --accumulate, no MPI)".into(),
        ))
    }
    /// One optimizer step (clipping, then the update) with `grads`; `step` steps came before.
    fn update(&mut self, _grads: &Gradients, _step: usize) -> Result<()> {
        Err(Error::Usage(
            "this task trains one batch per step (no --accumulate, no MPI)".into(),
        ))
    }
    /// A hash of the training data as this process read and encoded it (compared across
    /// processes before the first step).
    fn data_hash(&self) -> u64 {
        0
    }

    /// Whether a log line is due after batch `index` (0-based) of `batches`.
    fn log_due(&self, index: usize, batches: usize) -> bool;
    /// The log line for the batches since the last one, and its record.
    fn log_line(&self, w: &LogWindow) -> (String, Metric);

    /// Validation loss (and score) of a model; with several processes each computes its
    /// share (`dist`) and every one returns the gathered figures.
    fn validate(&self, model: &Self::Model, dist: &crate::dist::Dist) -> Result<Validation>;
    /// How the best model is chosen from validations.
    const SELECTION: Selection = Selection::LowerLoss;
    /// The end-of-epoch log lines.
    fn epoch_lines(
        &self,
        epoch: usize,
        seconds: f64,
        train_seconds: f64,
        validated: &[(Weights, Validation)],
    ) -> Vec<String>;

    /// Optimizer state for checkpoints: tensors and metadata (none for plain SGD).
    fn optimizer_state(&self) -> (Vec<(String, Tensor)>, Vec<(&'static str, String)>) {
        (Vec::new(), Vec::new())
    }
    /// Restores the optimizer from a checkpoint's tensors (taking its own out) and metadata.
    fn restore_optimizer(
        &mut self,
        _tensors: &mut HashMap<String, Tensor>,
        _meta: &HashMap<String, String>,
        _path: &Path,
    ) -> Result<()> {
        Ok(())
    }

    /// After the last epoch: tests the best model (and the best trained weights where
    /// the average won); returns the records to append and the test loss of the best model
    /// (`None` without a test set). With several processes each tests its share (`dist`)
    /// and every one returns the gathered figures; only the writing process writes files.
    fn test(
        &mut self,
        run: &Path,
        state: &RunState,
        progress: &mut dyn Progress,
        dist: &crate::dist::Dist,
    ) -> Result<(Vec<Metric>, Option<f64>)>;
}

/// A checkpoint to resume from: its tensors (weights, optimizer, average), metadata and
/// state.
pub struct Saved {
    /// The named tensors: weights, optimizer state and the weight average (`average.*`).
    pub tensors: HashMap<String, Tensor>,
    /// The string metadata: format tag, `state` (JSON), `config` (TOML) and the optimizer's.
    pub meta: HashMap<String, String>,
    /// Where the run stood when the checkpoint was written.
    pub state: RunState,
}

impl Saved {
    /// Loads `run`'s checkpoint, checks its tag, and parses its state.
    pub fn load(run: &Path, format: &str, device: &Device) -> Result<Self> {
        let path = checkpoint_path(run);
        let (tensors, meta) = load_tagged(&path, format, device).map_err(|e| match e {
            Error::Checkpoint { path, msg } => Error::Checkpoint {
                msg: format!(
                    "{msg}; the run cannot resume from it{}",
                    if best_path(run).exists() {
                        " (its best weights, best.safetensors, still translate and evaluate): \
                         restore the file from a copy, or start a new run with another --out"
                    } else {
                        ": restore the file from a copy, or start a new run with another --out"
                    }
                ),
                path,
            },
            e => e,
        })?;
        let state = meta_json(&path, &meta, "state")?;
        Ok(Self {
            tensors,
            meta,
            state,
        })
    }

    /// The configuration the checkpoint was written with, as TOML text.
    pub fn config_text(&self, run: &Path) -> Result<&str> {
        self.meta
            .get("config")
            .map(String::as_str)
            .ok_or_else(|| Error::Checkpoint {
                path: checkpoint_path(run),
                msg: "no config in the metadata".into(),
            })
    }
}

/// Whether a checkpoint's configuration predates weight averaging (no `average_decay`): such
/// a run continues as it was configured, without an average.
pub fn predates_averaging(config_toml: &str) -> bool {
    toml::from_str::<toml::Table>(config_toml).is_ok_and(|t| !t.contains_key("average_decay"))
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// Where the run stands at the end of this invocation.
    pub state: RunState,
    /// The best model's test loss, once tested.
    pub test_loss: Option<f64>,
    /// The loss of every step taken in this invocation.
    pub step_losses: Vec<f64>,
}

fn save_run_checkpoint<T: Task>(
    run: &Path,
    task: &T,
    average: Option<&WeightAverage<T::Model>>,
    state: &mut RunState,
) -> Result<()> {
    state.metrics_records = Some(metrics::count(&metrics_path(run))?);
    let state = &*state;
    let mut tensors = params_tensors(task.params());
    let (opt_tensors, opt_meta) = task.optimizer_state();
    tensors.extend(opt_tensors);
    if let Some(avg) = average {
        tensors.extend(avg.checkpoint_tensors());
    }
    save_tagged(
        &checkpoint_path(run),
        &tensors,
        T::CHECKPOINT_FORMAT,
        state_meta(state, task.config_toml())
            .into_iter()
            .chain(opt_meta),
    )
}

/// Checks, on resume, that `accumulate` batches per process on the processes of `dist`
/// make the run's global batch (batches per optimizer step, recorded in `state`); else an
/// error that says which `--accumulate` keeps it.
pub fn check_global_batch(
    run: &Path,
    state: &RunState,
    accumulate: usize,
    dist: &crate::dist::Dist,
) -> Result<()> {
    let n = dist.size();
    let global = accumulate.max(1) * n;
    let had = state.global_batch.unwrap_or(1);
    if state.step == 0 || had == global {
        return Ok(());
    }
    let fix = if had.is_multiple_of(n) {
        format!("give --accumulate {} with {n} process(es)", had / n)
    } else {
        format!(
            "run it on a number of processes that divides {had}, with --accumulate {had}/processes"
        )
    };
    Err(Error::Usage(format!(
        "{}: the run takes {had} batch(es) per optimizer step (its global batch), and this \
         invocation would take {global} (--accumulate {} x {n} process(es)), which would \
         change its training: to resume it, {fix}",
        run.display(),
        accumulate.max(1)
    )))
}

/// Trains `task` in the run directory `opts.out` (already opened with [`open_run_dir`]),
/// from `saved` when resuming (else dropout starts from `dropout_seed`); `average_decay` > 0 validates a moving average of the
/// weights beside them, updated every `average_every` steps.
///
/// The loop, in a fixed order: per batch, stop if asked (saving a checkpoint), one step,
/// update the average, log when due, checkpoint every `checkpoint_interval` batches; per
/// epoch, validate the trained weights and the average, keep the better as the best model,
/// checkpoint, plot; at the end, test the best model.
pub fn run<T: Task, C>(
    task: &mut T,
    opts: &RunOptions<C>,
    saved: Option<Saved>,
    dropout_seed: u64,
    average_decay: f64,
    average_every: usize,
    progress: &mut dyn Progress,
) -> Result<RunSummary> {
    let run = &opts.out;
    let mut average = if average_decay > 0.0 {
        Some(WeightAverage::new(
            task.params(),
            average_decay,
            average_every,
            |pb| task.build_model(pb),
        )?)
    } else {
        None
    };
    let mut state = RunState::new(dropout_seed);
    if let Some(mut saved) = saved {
        let path = checkpoint_path(run);
        match &mut average {
            Some(avg) => avg.restore(&mut saved.tensors, saved.state.step, &path)?,
            None => {
                crate::average::take_average(&mut saved.tensors);
            }
        }
        task.restore_optimizer(&mut saved.tensors, &saved.meta, &path)?;
        task.params()
            .assign(&saved.tensors)
            .map_err(|e| Error::Checkpoint {
                path: path.clone(),
                msg: e.to_string(),
            })?;
        state = saved.state;
        if opts.dist.writes() {
            match state.metrics_records {
                Some(n) => metrics::truncate_to(&metrics_path(run), n)?,
                // Checkpoints written before the count was kept.
                None => metrics::truncate_after(&metrics_path(run), state.step)?,
            }
        }
        let done = state.epoch - 1;
        if task.epochs() < done {
            return Err(Error::Usage(format!(
                "{}: the run has trained {done} epochs already: give --epochs {done} or more \
                 to resume it",
                run.display()
            )));
        }
        if state.finished && state.epoch <= task.epochs() {
            state.finished = false;
            progress.line(&format!(
                "resume: the run was finished after {done} epochs; training to epoch {}, \
                 then testing again",
                task.epochs()
            ));
        }
        progress.line(&format!(
            "resuming {} at epoch {} batch {} (step {})",
            run.display(),
            state.epoch,
            state.next_batch,
            state.step
        ));
    }
    let dist = &opts.dist;
    let writer = dist.writes();
    // Batches per optimizer step: the run's, kept on resume whatever the processes.
    let per_rank = task.accumulate().max(1);
    let global = per_rank * dist.size();
    check_global_batch(run, &state, per_rank, dist)?;
    state.global_batch = (global > 1).then_some(global);
    if dist.size() > 1 {
        let fix = "start every rank with the same command, files and environment";
        dist.check_same(
            "configuration",
            crate::dist::hash_bytes(task.config_toml().as_bytes()),
            fix,
        )?;
        dist.check_same("training data", task.data_hash(), fix)?;
        let vars = task.params().vars();
        dist.check_same("initial weights", crate::dist::hash_vars(&vars)?, fix)?;
        dist.check_same(
            "run state",
            crate::dist::hash_bytes(serde_json::to_string(&state).unwrap_or_default().as_bytes()),
            "every rank must read the same checkpoint (a run directory on a shared file system)",
        )?;
        progress.line(&format!(
            "data parallel: {} processes, {per_rank} batch(es) each per step: global batch of \
             {global} batches; start weights, configuration and data agree on every rank",
            dist.size()
        ));
    } else if global > 1 {
        progress.line(&format!(
            "accumulate: {global} batches' gradients per optimizer step (global batch of {global} batches)"
        ));
    }
    let mut acc = (global > 1).then(|| crate::dist::Accumulator::new(&task.params().vars()));
    let rng = Rng::from_state(state.rng.0, state.rng.1);
    let mut step_losses = Vec::new();
    let stopped = |state: RunState, step_losses: Vec<f64>| RunSummary {
        state,
        test_loss: None,
        step_losses,
    };
    let mut comm_seconds = 0.0;
    let mut stop_voted = false;

    while state.epoch <= task.epochs() {
        let epoch = state.epoch;
        let batches = task.start_epoch(epoch)?;
        let epoch_start = Instant::now();
        let mut log_start = Instant::now();
        let mut index = state.next_batch;
        while index < batches {
            let taken = step_losses.len();
            if opts.crash_after_steps == Some(taken) {
                return Ok(stopped(state, step_losses));
            }
            let asked = if acc.is_some() {
                stop_voted
            } else {
                opts.interrupted()
            };
            if opts.stop_after_steps == Some(taken) || asked {
                if writer {
                    save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
                }
                progress.line(&format!(
                    "stopped: checkpoint saved after step {}",
                    state.step
                ));
                return Ok(stopped(state, step_losses));
            }
            let (s, last, weight) = match &mut acc {
                None => (task.train_step(index, state.step, &rng)?, index, 1.0),
                Some(acc) => {
                    let end = (index + global).min(batches);
                    let tokens: usize = (index..end).map(|i| task.batch_tokens(i)).sum();
                    acc.clear();
                    for i in
                        crate::dist::local_batches(index, batches, global, per_rank, dist.rank())
                    {
                        let r = crate::dist::micro_rng(state.rng.0, state.step, i - index);
                        let (mut grads, s) = task.backward(i, &r)?;
                        acc.add(&mut grads, s.tokens, s.loss, s.nll)?;
                    }
                    acc.vote_stop(opts.interrupted());
                    let r = acc.reduce(dist, tokens)?;
                    comm_seconds += r.seconds;
                    stop_voted = r.stop;
                    task.update(&r.grads, state.step)?;
                    let (loss, nll) = (r.loss, r.nll);
                    // The step counts in the log as its batches, each at the step's loss.
                    let n = (end - index) as f64;
                    state.log_batches += end - index - 1;
                    (StepStats { loss, nll, tokens }, end - 1, n)
                }
            };
            step_losses.push(s.loss);
            state.step += 1;
            if let Some(avg) = &mut average {
                avg.after_step(state.step, task.params())?;
            }
            state.next_batch = last + 1;
            state.rng = rng.state();
            state.log_loss_sum += s.loss * weight;
            state.log_nll_sum += s.nll * weight;
            state.log_batches += 1;
            state.log_tokens += s.tokens;
            progress.batch(epoch, last + 1, batches);
            crate::checkpoint::test_pause("TRANSFORMER_TEST_STEP_DELAY_MS");
            let log_due = (index..=last).any(|i| task.log_due(i, batches));
            if log_due {
                let seconds = log_start.elapsed().as_secs_f64();
                let (mut line, metric) = task.log_line(&LogWindow {
                    epoch,
                    index: last,
                    batches,
                    step: state.step,
                    loss_sum: state.log_loss_sum,
                    nll_sum: state.log_nll_sum,
                    count: state.log_batches,
                    tokens: state.log_tokens,
                    seconds,
                    per_step: global,
                });
                if dist.size() > 1 {
                    line.push_str(&format!(
                        " | tok/s per rank {:.0} | comm wait {:.0}%",
                        state.log_tokens as f64 / dist.size() as f64 / seconds.max(1e-9),
                        100.0 * comm_seconds / seconds.max(1e-9)
                    ));
                }
                comm_seconds = 0.0;
                progress.line(&line);
                if writer {
                    metrics::append(&metrics_path(run), &metric)?;
                }
                state.log_loss_sum = 0.0;
                state.log_nll_sum = 0.0;
                state.log_batches = 0;
                state.log_tokens = 0;
                log_start = Instant::now();
            }
            let every = task.checkpoint_interval();
            if writer && every > 0 && (index..=last).any(|i| (i + 1).is_multiple_of(every)) {
                save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
            }
            index = last + 1;
        }

        // Validation of the trained weights and of their average (split across the
        // processes); the better is the best model, kept by rank 0.
        let train_seconds = epoch_start.elapsed().as_secs_f64();
        let mut validated = vec![(Weights::Sgd, task.validate(task.model(), dist)?)];
        if let Some(avg) = &average {
            validated.push((Weights::Average, task.validate(&avg.model, dist)?));
        }
        // Every process keeps the same record of the best (the test reads it); the writing
        // process alone logs and saves.
        let seconds = epoch_start.elapsed().as_secs_f64();
        if writer {
            for line in task.epoch_lines(epoch, seconds, train_seconds, &validated) {
                progress.line(&line);
            }
        }
        for &(weights, v) in &validated {
            if writer {
                metrics::append(
                    &metrics_path(run),
                    &Metric::Valid {
                        step: state.step,
                        epoch,
                        loss: v.loss,
                        ppl: v.loss.exp(),
                        epoch_seconds: seconds,
                        weights,
                        bleu: v.bleu,
                    },
                )?;
            }
            let params = match weights {
                Weights::Sgd => task.params(),
                Weights::Average => &average.as_ref().expect("validated").params,
            };
            let figure = T::SELECTION.figure(&v);
            if let Some(file) = T::BEST_TRAINED_FILE {
                if average.is_some()
                    && weights == Weights::Sgd
                    && state
                        .best_trained
                        .is_none_or(|b| T::SELECTION.better(figure, b))
                {
                    state.best_trained = Some(figure);
                    if writer {
                        task.save_weights(&run.join(file), params)?;
                    }
                }
            }
            if state.best.is_none_or(|b| T::SELECTION.better(figure, b)) {
                state.best = Some(figure);
                state.best_weights = weights;
                state.best_epoch = epoch;
                if writer {
                    task.save_weights(&best_path(run), params)?;
                }
            }
        }
        state.epoch += 1;
        state.next_batch = 0;
        state.log_loss_sum = 0.0;
        state.log_nll_sum = 0.0;
        state.log_batches = 0;
        state.log_tokens = 0;
        if writer {
            save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
            metrics::plot_svg(&metrics::read(&metrics_path(run))?, &run.join("loss.svg"))?;
        }
    }

    // Every process tests its share of the best model, which the writing process has just
    // saved: wait for it.
    dist.barrier();
    let (records, test_loss) = task.test(run, &state, progress, dist)?;
    if !writer {
        return Ok(stopped(state, step_losses));
    }
    if !state.finished {
        for m in &records {
            metrics::append(&metrics_path(run), m)?;
        }
        state.finished = true;
        save_run_checkpoint(run, task, average.as_ref(), &mut state)?;
    }
    metrics::plot_svg(&metrics::read(&metrics_path(run))?, &run.join("loss.svg"))?;
    Ok(RunSummary {
        state,
        test_loss,
        step_losses,
    })
}
