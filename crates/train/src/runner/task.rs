//! What a task supplies ([`Task`]) and what the loop keeps: the run state, validation, the best model.

use super::*;
use crate::average::WeightAverage;
use crate::checkpoint::params_tensors;
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::metrics::{self, Metric, Score, ScoreMetric, Weights};
use crate::optim::Adam;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use transformer_model::{ParamBuilder, Params, Precision, Rng};

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

/// The settings of a run that the runner itself acts on ([`run`]), read by key from a task's
/// configuration ([`RunConfig::settings`]): every task names them alike in its
/// `config.toml`, and a task whose configuration lacks one runs with its default here.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunSettings {
    /// Passes over the training data (default 1).
    pub epochs: usize,
    /// Batches between resumable checkpoints (default 0: at epoch ends only).
    pub checkpoint_interval: usize,
    /// Batches whose gradients one process sums before each optimizer step (default 1).
    pub accumulate: usize,
    /// The run's seed; dropout draws from `seed + 1` (default 0).
    pub seed: u64,
    /// Decay per step of the weight average validated beside the trained weights (default
    /// 0: no average).
    pub average_decay: f64,
    /// The training arithmetic asked for (default f32); [`start_model`] settles it.
    pub precision: Precision,
    /// Whether a fresh run asking for bf16 times it against f32 first (default true).
    pub measure_precision: bool,
}

impl Default for RunSettings {
    fn default() -> Self {
        Self {
            epochs: 1,
            checkpoint_interval: 0,
            accumulate: 1,
            seed: 0,
            average_decay: 0.0,
            precision: Precision::F32,
            measure_precision: true,
        }
    }
}

/// The settings every resumed run may take from the new invocation, named alike in every
/// task's configuration: how long it trains (`epochs`, `max_batches`), the batches per
/// process and step (`accumulate`, which must keep the run's global batch), what it logs and
/// checkpoints, and whether a bf16 run would be timed (`measure_precision`; a resumed run
/// keeps its precision). A task adds its own ([`RunConfig::MAY_CHANGE_ON_RESUME`]).
pub const RUNNER_MAY_CHANGE: &[&str] = &[
    "epochs",
    "accumulate",
    "max_batches",
    "log_interval",
    "checkpoint_interval",
    "measure_precision",
];

/// What the runner reads of a task's configuration to open a run ([`open_run`]).
pub trait RunConfig: Clone + Serialize + serde::de::DeserializeOwned {
    /// The settings a resumed run may take from the new invocation besides the runner's
    /// ([`RUNNER_MAY_CHANGE`]); the rest must match the run's own ([`resume_config`]).
    const MAY_CHANGE_ON_RESUME: &'static [&'static str];
    /// Makes the input paths absolute: the run records them, and a resume may start in
    /// another directory.
    fn make_paths_absolute(&mut self);
    /// The recorded input paths, by configuration key, checked on resume
    /// ([`check_recorded_paths`]).
    fn recorded_paths(&self) -> Vec<(&'static str, &Option<PathBuf>)>;
    /// Turns weight averaging off (a run written before averaging existed resumes without).
    fn without_averaging(&mut self);
    /// Records the training arithmetic [`start_model`] settled on (a task without a
    /// `precision` key trains in f32 and keeps nothing).
    fn set_precision(&mut self, _precision: Precision) {}
    /// The configuration as TOML, every key written (what the run directory's `config.toml`
    /// and every checkpoint keep).
    fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }
    /// The settings the runner acts on ([`RunSettings`]), by their keys in [`Self::to_toml`].
    fn settings(&self) -> RunSettings {
        let table = toml::Value::try_from(self).expect("config serializes");
        table
            .try_into()
            .expect("the run settings' keys hold numbers in every task's configuration")
    }
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
    /// What `best` measures ([`Selection::key`]); absent in states written before chrF
    /// selection existed, when it was the loss or BLEU (the task's selection then).
    #[serde(default)]
    pub best_by: Option<String>,
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
            best_by: None,
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

impl LogWindow {
    /// Mean wall-clock milliseconds per batch over the window.
    pub fn ms_per_batch(&self) -> f64 {
        self.seconds * 1e3 / self.count.max(1) as f64
    }

    /// The window's `metrics.jsonl` record, numbered as its log line numbers it (batch
    /// `batch` of `batches`), with the learning rate, mean loss and perplexity it shows.
    pub fn record(&self, batch: usize, batches: usize, lr: f64, loss: f64, ppl: f64) -> Metric {
        Metric::Train {
            step: self.step,
            epoch: self.epoch,
            batch,
            batches,
            lr,
            ms_per_batch: self.ms_per_batch(),
            loss,
            ppl,
        }
    }
}

/// The batches an epoch trains: all `available`, or at most `max_batches` (quick runs).
pub fn epoch_batches(available: usize, max_batches: Option<usize>) -> usize {
    max_batches.map_or(available, |m| m.min(available))
}

/// One validation of one set of weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Validation {
    /// Mean cross-entropy per target token.
    pub loss: f64,
    /// The task's quality score of the validation set, if it has one (translation: BLEU,
    /// or chrF into Korean).
    pub score: Option<Score>,
}

impl Validation {
    /// A validation with mean loss `loss` and the task's `score`, where it has one.
    pub fn new(loss: f64, score: Option<Score>) -> Self {
        Self { loss, score }
    }
}

/// What best-model selection compares, as the task names it ([`Task::selection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The lower validation loss (the language model, the copy task).
    LowerLoss,
    /// The higher validation score of this metric (translation).
    HigherScore(ScoreMetric),
}

impl Selection {
    /// The figure compared.
    pub fn figure(self, v: &Validation) -> f64 {
        match self {
            Selection::LowerLoss => v.loss,
            Selection::HigherScore(m) => Score::of(v.score, m).unwrap_or(f64::NEG_INFINITY),
        }
    }

    /// Whether `new` beats `best`.
    pub fn better(self, new: f64, best: f64) -> bool {
        match self {
            Selection::LowerLoss => new < best,
            Selection::HigherScore(_) => new > best,
        }
    }

    /// The figure's name in the run state (`loss`, `bleu`, `chrf`).
    pub fn key(self) -> &'static str {
        match self {
            Selection::LowerLoss => "loss",
            Selection::HigherScore(m) => m.key(),
        }
    }
}

/// The configuration a task's model is built from: it builds the model (the trained one,
/// and a second for the weight average) and is saved beside the weights, so that a weights
/// file rebuilds its model.
pub trait ModelConfig: Serialize {
    /// The model.
    type Model;
    /// The format tag of the task's weight files (`best.safetensors`).
    const WEIGHTS_FORMAT: &'static str;
    /// A model of this configuration, its parameters from `pb`.
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<Self::Model>;
    /// Saves `params`, weights of a model of this configuration, tagged
    /// [`Self::WEIGHTS_FORMAT`], with the configuration (JSON) as the metadata `model`.
    fn save(&self, path: &Path, params: &Params) -> Result<()> {
        save_tagged(
            path,
            &params_tensors(params),
            Self::WEIGHTS_FORMAT,
            [(
                "model",
                serde_json::to_string(self).expect("config serializes"),
            )],
        )
    }
}

/// The model a task trains: the model, its parameters (for the optimizer, checkpoints and
/// the weight average) and the configuration it was built from.
pub struct Trained<C: ModelConfig> {
    /// The model being trained.
    pub model: C::Model,
    /// Its parameters.
    pub params: Params,
    /// Its configuration.
    pub config: C,
}

impl<C: ModelConfig> Trained<C> {
    /// A fresh model of configuration `config`, its weights drawn from `seed` on `device`,
    /// training in `precision` ([`ParamBuilder::precision`]: fixed for the model's life).
    pub fn new(
        config: C,
        device: &Device,
        precision: Precision,
        seed: u64,
    ) -> transformer_model::Result<Self> {
        let pb = ParamBuilder::new(DType::F32, device, seed).with_precision(precision);
        let model = config.build(&pb)?;
        Ok(Self {
            model,
            params: pb.params(),
            config,
        })
    }
}

/// The model type of a task.
pub type ModelOf<T> = <<T as Task>::ModelConfig as ModelConfig>::Model;

/// A training task on the runner: what it trains, on which batches, how a step goes, how
/// it validates and tests. The runner owns the rest: the settings of its configuration
/// ([`RunSettings`]: epochs, checkpoints, accumulation, the dropout seed, the weight
/// average), the loop, stops and checkpoints, the log and metrics, best-model selection,
/// plots and resume.
pub trait Task {
    /// The task's configuration (the run's `config.toml`).
    type Config: RunConfig;
    /// The configuration of its model.
    type ModelConfig: ModelConfig;
    /// The format tag of this task's checkpoints.
    const CHECKPOINT_FORMAT: &'static str;
    /// With a weight average, the file that keeps the best trained weights apart from
    /// `best.safetensors` (which the average may win), or `None` not to keep them.
    const BEST_TRAINED_FILE: Option<&'static str> = None;

    /// The run's configuration, as saved in checkpoints.
    fn config(&self) -> &Self::Config;
    /// The model being trained.
    fn trained(&self) -> &Trained<Self::ModelConfig>;

    /// Prepares `epoch` (1-based: its batch order, its learning rate); returns its number of
    /// batches.
    fn start_epoch(&mut self, epoch: usize) -> Result<usize>;
    /// Target tokens of batch `index` of the epoch (the weight of its gradient in a global
    /// batch).
    fn batch_tokens(&self, _index: usize) -> usize {
        1
    }
    /// The loss of batch `index` and its gradients (of the mean loss per target token), with
    /// dropout from `rng`, without an optimizer step. The runner composes every step of
    /// this and [`Self::update`]: one batch per step, or the sum of several (accumulation,
    /// data parallelism).
    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)>;
    /// One optimizer step (clipping, then the update) with `grads`; `step` steps came before.
    fn update(&mut self, grads: &mut Gradients, step: usize) -> Result<()>;
    /// A hash of the training data as this process read and encoded it (compared across
    /// processes before the first step).
    fn data_hash(&self) -> u64 {
        0
    }

    /// Batches between log lines (the default [`Self::log_due`] reads it; 100 by default).
    fn log_interval(&self) -> usize {
        100
    }
    /// The learning rate of the last step, for the default [`Self::log_line`].
    fn learning_rate(&self) -> f64 {
        f64::NAN
    }
    /// Whether a log line is due after batch `index` (0-based) of `batches`; by default
    /// after the first batch, every [`Self::log_interval`] batches and the last.
    fn log_due(&self, index: usize, batches: usize) -> bool {
        index == 0 || (index + 1).is_multiple_of(self.log_interval().max(1)) || index + 1 == batches
    }
    /// The log line for the batches since the last one, and its record; by default
    /// `step I/N | lr | loss | ms/step`, the loss being the window's mean.
    fn log_line(&self, w: &LogWindow) -> (String, Metric) {
        let loss = w.loss_sum / w.count.max(1) as f64;
        let ms = w.ms_per_batch();
        let lr = self.learning_rate();
        (
            format!(
                "step {:>5}/{} | lr {lr:.2e} | loss {loss:.4} | {ms:.1} ms/step",
                w.index + 1,
                w.batches
            ),
            w.record(w.index + 1, w.batches, lr, loss, loss.exp()),
        )
    }

    /// Validation loss (and score) of a model; with several processes each computes its
    /// share (`dist`) and every one returns the gathered figures.
    fn validate(&self, model: &ModelOf<Self>, dist: &crate::dist::Dist) -> Result<Validation>;
    /// How the best model is chosen from validations (by default, the lower loss).
    fn selection(&self) -> Selection {
        Selection::LowerLoss
    }
    /// The end-of-epoch log lines; by default one per validated set of weights, with the
    /// epoch's seconds and its validation loss.
    fn epoch_lines(&self, end: &EpochEnd) -> Vec<String> {
        end.each_validated(|w, v| {
            format!(
                "trained in {:.1}s; held-out loss of {}: {:.4}",
                end.seconds,
                w.describe(),
                v.loss
            )
        })
    }

    /// The optimizer, where checkpoints keep its state (Adam's moments and step count);
    /// `None`, the default, for plain SGD, which has none.
    fn adam(&mut self) -> Option<&mut Adam> {
        None
    }

    /// After the last epoch: tests the best model (and the best trained weights where
    /// the average won); returns the records to append and the test loss of the best model
    /// (`None` without a test set). With several processes each tests its share
    /// ([`TestRun::dist`]) and every one returns the gathered figures; only the writing
    /// process writes files.
    fn test(&mut self, t: TestRun) -> Result<(Vec<Metric>, Option<f64>)>;
}

/// The end of an epoch, for a task's log lines ([`Task::epoch_lines`]).
#[derive(Debug, Clone, Copy)]
pub struct EpochEnd<'a> {
    /// The epoch just trained (1-based).
    pub epoch: usize,
    /// Wall-clock seconds of the epoch: training and validation.
    pub seconds: f64,
    /// Of those, the training's.
    pub train_seconds: f64,
    /// The validation of each set of weights: the trained ones, then the average's.
    pub validated: &'a [(Weights, Validation)],
}

impl EpochEnd<'_> {
    /// One log line per validated set of weights, as `line` writes it.
    pub fn each_validated(
        &self,
        mut line: impl FnMut(Weights, &Validation) -> String,
    ) -> Vec<String> {
        self.validated.iter().map(|(w, v)| line(*w, v)).collect()
    }

    /// The tutorials' end of epoch: a rule of dashes, [`Self::each_validated`], a rule.
    pub fn ruled(&self, line: impl FnMut(Weights, &Validation) -> String) -> Vec<String> {
        let rule = "-".repeat(89);
        let mut lines = vec![rule.clone()];
        lines.extend(self.each_validated(line));
        lines.push(rule);
        lines
    }
}

/// The finished run a task tests ([`Task::test`]).
pub struct TestRun<'a> {
    /// The run directory, whose `best.safetensors` is the best model.
    pub run: &'a Path,
    /// Where the run stands: which weights won, at which epoch, after how many steps.
    pub state: &'a RunState,
    /// The log.
    pub progress: &'a mut dyn Progress,
    /// The processes testing, each its share.
    pub dist: &'a crate::dist::Dist,
}

impl TestRun<'_> {
    /// Logs `lines` between two rules of `=`, as the tutorials end a run.
    pub fn report(&mut self, lines: &[String]) {
        let rule = "=".repeat(89);
        self.progress.line(&rule);
        for line in lines {
            self.progress.line(line);
        }
        self.progress.line(&rule);
    }

    /// The `metrics.jsonl` record of a test of `weights` with mean loss `loss` per target
    /// token and the task's `scores`, at the run's last step.
    pub fn record(&self, weights: Weights, loss: f64, scores: metrics::Scores) -> Metric {
        Metric::Test {
            step: self.state.step,
            loss,
            ppl: loss.exp(),
            weights,
            scores,
        }
    }

    /// Writes `bytes` as the run directory's file `name`, on the writing process only (the
    /// others test their share and write nothing).
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        if self.dist.writes() {
            crate::checkpoint::write_atomic(&self.run.join(name), bytes)?;
        }
        Ok(())
    }
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

pub(super) fn save_run_checkpoint<T: Task>(
    run: &Path,
    task: &mut T,
    average: Option<&WeightAverage<ModelOf<T>>>,
    state: &mut RunState,
) -> Result<()> {
    state.metrics_records = Some(metrics::count(&metrics_path(run))?);
    let state = &*state;
    let mut tensors = params_tensors(&task.trained().params);
    let (opt_tensors, opt_meta) = task
        .adam()
        .map_or_else(|| (Vec::new(), Vec::new()), |a| a.checkpoint_state());
    tensors.extend(opt_tensors);
    if let Some(avg) = average {
        tensors.extend(avg.checkpoint_tensors());
    }
    save_tagged(
        &checkpoint_path(run),
        &tensors,
        T::CHECKPOINT_FORMAT,
        state_meta(state, task.config().to_toml())
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
