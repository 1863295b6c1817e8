//! The WikiText-2 language model of PyTorch's "Language Modeling with nn.Transformer and
//! torchtext" tutorial: its data pipeline, training loop, evaluation and checkpoints.
//!
//! The loop, in the tutorial's order: for each epoch, for each `bptt` window of the
//! batchified training stream: forward under the causal mask, cross-entropy, backward, clip
//! the gradient norm to 0.5, SGD step; log every 200 batches; at the end of the epoch
//! evaluate on validation, keep the best model, step the learning rate (x0.95). At the end,
//! evaluate the best model on test.
//!
//! One addition to the tutorial, on by default (`average_decay`, 0 turns it off): a moving
//! average of the weights ([`crate::average`]) is validated beside the SGD weights at every
//! epoch end, and whichever of the two has the lower validation loss is the best model. It is
//! a read-out only: the training steps, and so the SGD weights' log and validation figures,
//! are exactly the tutorial's. The best SGD weights are kept too and tested at the end, so
//! the tutorial's own result is always reported.
//!
//! A run directory holds everything about a run:
//!
//! | file | what |
//! |---|---|
//! | `config.toml` | the resolved configuration |
//! | `vocab.txt` | the vocabulary, one token per line in id order |
//! | `checkpoint.safetensors` | latest resumable state: weights + position, RNG, best loss |
//! | `best.safetensors` | the weights with the lowest validation loss so far |
//! | `best-sgd.safetensors` | the same among the SGD weights only (when averaging) |
//! | `metrics.jsonl` | one JSON object per log line, validation and test result |
//! | `loss.svg` | training and validation loss against the step |

use crate::average::CHECKPOINT_PREFIX as AVERAGE_PREFIX;
use crate::checkpoint;
use crate::checkpoint::params_tensors;
use crate::clip::clip_coefficient;
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::metrics::{Metric, Weights};
use crate::optim::Sgd;
use crate::runner::{
    self, check_format, open_run_dir, predates_averaging, save_tagged, LogWindow, RunState, Saved,
    StepStats, Task, Validation,
};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use transformer_model::kernels::Precision;
use transformer_model::{DirectGrads, LmConfig, Mode, ParamBuilder, Params, Rng, TransformerLm};
use transformer_text::batch::{batchify, Batch, Batched};
use transformer_text::corpus::{build_vocab_with, read_split_with, LineEnd, Split};
use transformer_text::Vocab;

/// Format tag written into checkpoints and checked on load.
pub const CHECKPOINT_FORMAT: &str = "transformer-lm-checkpoint/1";
/// Format tag of model-only weight files (`best.safetensors`).
pub const WEIGHTS_FORMAT: &str = "transformer-lm-weights/1";
/// Optimizer steps between updates of the weight average: each update is one pass over all
/// the weights (2 reads, 1 write of 12 M floats, several ms on a 2-core machine), and a
/// horizon of thousands of steps loses nothing by sampling every fourth iterate.
pub const AVERAGE_EVERY: usize = 4;

/// Everything a run is configured by; defaults are the tutorial's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LmTrainConfig {
    /// Folder with train.txt, valid.txt, test.txt.
    pub data: Option<PathBuf>,
    /// Embedding dimension (`emsize`).
    pub emsize: usize,
    /// Feed-forward width (`d_hid`).
    pub nhid: usize,
    /// Encoder layers (`nlayers`).
    pub nlayers: usize,
    /// Attention heads; must divide `emsize`.
    pub nhead: usize,
    /// Dropout probability of the positional encoding and every encoder layer.
    pub dropout: f64,
    /// SGD learning rate of the first epoch.
    pub lr: f64,
    /// StepLR: the learning rate is multiplied by `gamma` after every epoch.
    pub gamma: f64,
    /// Gradient-norm clipping threshold.
    pub clip: f64,
    /// Passes over the training split.
    pub epochs: usize,
    /// Training columns of `batchify`.
    pub batch_size: usize,
    /// Validation and test columns of `batchify`.
    pub eval_batch_size: usize,
    /// Window length.
    pub bptt: usize,
    /// Windows whose gradients are summed before one SGD step (gradient accumulation), per
    /// process: the global batch is `accumulate` x processes windows, its gradient that of
    /// the mean loss per token over all of them ([`crate::dist`]). 1: the tutorial's step
    /// per window.
    pub accumulate: usize,
    /// Print and record the mean training loss every this many batches.
    pub log_interval: usize,
    /// Write a resumable checkpoint every this many batches (and at every epoch end).
    pub checkpoint_interval: usize,
    /// Stop each epoch after this many batches (quick runs); all when absent.
    pub max_batches: Option<usize>,
    /// Seed for initialisation and dropout.
    pub seed: u64,
    /// Arithmetic of the output layer's products in training: `f32` (the tutorial's) or
    /// `bf16` (mixed precision on the AMX units or AVX512-BF16; f32 where the CPU has
    /// neither). Validation and
    /// test perplexities are always computed in f32.
    pub precision: Precision,
    /// With `precision` bf16, a fresh run first times the output layer both ways and trains
    /// in bf16 only if it is faster on this CPU ([`crate::precision`]); false: bf16 as
    /// asked, unmeasured (the run's `config.toml` records the outcome either way).
    pub measure_precision: bool,
    /// Share the embedding matrix with the output layer (not the tutorial's model; see
    /// [`LmConfig::tie_weights`]).
    pub tie_weights: bool,
    /// Append an `<eos>` token to every line, empty lines included, as the older tutorial's
    /// torchtext `WikiText2` did (not the newer tutorial's `data_process`; see
    /// [`LineEnd`]). Evaluation of the run (`lm eval`) reads text the same way.
    pub eos_per_line: bool,
    /// Decay per step of the moving average of the weights that is validated beside the SGD
    /// weights ([`crate::average`]); 0 turns averaging off (the tutorial's read-out alone).
    pub average_decay: f64,
}

/// The default decay of the weight average: a horizon of about 1,000 steps, a third of an
/// epoch of the tutorial's run. Chosen by validation perplexity among 0.99, 0.999, 0.9995 and
/// 0.9998 in a full default run (docs/LM.md); the model still improves quickly over the
/// tutorial's three epochs, so longer horizons lag behind it.
pub const DEFAULT_AVERAGE_DECAY: f64 = 0.999;

/// The settings a resumed run may change ([`crate::runner::resume_config`]): how long it
/// trains, what it logs and checkpoints, and where its data lies. The rest (the model, the
/// optimizer, the batches, the seed) are the run's own.
pub const MAY_CHANGE_ON_RESUME: &[&str] = &[
    "epochs",
    "accumulate",
    "max_batches",
    "log_interval",
    "checkpoint_interval",
    "data",
    "measure_precision",
];

/// What `--precision bf16` runs in bf16, as the log says it (the encoder layers stay f32, so
/// that the language model's bf16 arithmetic is the output layer's alone).
const BF16_COVERS: &str = "the output layer's products";

impl Default for LmTrainConfig {
    fn default() -> Self {
        Self {
            data: None,
            emsize: 200,
            nhid: 200,
            nlayers: 2,
            nhead: 2,
            dropout: 0.2,
            lr: 5.0,
            gamma: 0.95,
            clip: 0.5,
            epochs: 3,
            batch_size: 20,
            eval_batch_size: 10,
            bptt: 35,
            accumulate: 1,
            log_interval: 200,
            checkpoint_interval: 500,
            max_batches: None,
            seed: 42,
            precision: Precision::F32,
            measure_precision: true,
            tie_weights: false,
            eos_per_line: false,
            average_decay: DEFAULT_AVERAGE_DECAY,
        }
    }
}

impl LmTrainConfig {
    /// What line ends become in the token streams.
    pub fn line_end(&self) -> LineEnd {
        if self.eos_per_line {
            LineEnd::Eos
        } else {
            LineEnd::Dropped
        }
    }

    /// The model configuration for a vocabulary of `ntoken`.
    pub fn model(&self, ntoken: usize) -> LmConfig {
        LmConfig {
            ntoken,
            d_model: self.emsize,
            nhead: self.nhead,
            d_hid: self.nhid,
            nlayers: self.nlayers,
            dropout: self.dropout,
            tie_weights: self.tie_weights,
            ..LmConfig::default()
        }
    }

    /// Checks the model sizes and that counts are positive and rates in range.
    pub fn validate(&self) -> Result<()> {
        self.model(1).validate()?;
        if self.accumulate == 0 {
            return Err(Error::Usage(
                "accumulate (--accumulate) must be at least 1 (1: a step per window)".into(),
            ));
        }
        if self.max_batches == Some(0) {
            return Err(Error::Usage(
                "max_batches (--max-batches) must be at least 1 (leave it out for all)".into(),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Usage(format!(
                "dropout is {}: it must be in [0, 1)",
                self.dropout
            )));
        }
        for (name, v) in [
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            ("eval_batch_size", self.eval_batch_size),
            ("bptt", self.bptt),
            ("log_interval", self.log_interval),
        ] {
            if v == 0 {
                return Err(Error::Usage(format!("{name} must be at least 1")));
            }
        }
        if !(self.lr > 0.0 && self.gamma > 0.0 && self.clip > 0.0) {
            return Err(Error::Usage("lr, gamma and clip must be positive".into()));
        }
        if !(0.0..1.0).contains(&self.average_decay) {
            return Err(Error::Usage(format!(
                "average_decay is {}: it must be at least 0 (0 = no weight average) and below 1 \
                 (0.999 averages over about 1,000 steps)",
                self.average_decay
            )));
        }
        Ok(())
    }

    /// Reads a TOML file of the same keys (any subset; the rest keep their defaults).
    pub fn from_toml_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| Error::Config {
            path: path.into(),
            msg: e.to_string(),
        })
    }

    /// The configuration as TOML, every key written (what `config.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }

    /// The learning rate of `epoch` (1-based): StepLR(step_size 1, gamma).
    pub fn lr_at_epoch(&self, epoch: usize) -> f64 {
        self.lr * self.gamma.powi(epoch as i32 - 1)
    }
}

/// The three splits, tokenized and batchified, and the vocabulary.
pub struct LmData {
    /// The vocabulary, built from the training split.
    pub vocab: Vocab,
    /// The training split in `batch_size` columns.
    pub train: Batched,
    /// The validation split in `eval_batch_size` columns.
    pub valid: Batched,
    /// The test split in `eval_batch_size` columns.
    pub test: Batched,
}

impl LmData {
    /// Reads `dir`/{train,valid,test}.txt; the vocabulary is built from train unless given
    /// (a resumed run uses the one it saved).
    pub fn load(dir: &Path, cfg: &LmTrainConfig, vocab: Option<Vocab>) -> Result<Self> {
        transformer_text::corpus::split_paths(dir)?;
        let vocab = match vocab {
            Some(v) => v,
            None => build_vocab_with(&dir.join(Split::Train.file_name()), cfg.line_end())?,
        };
        let split = |s: Split, bsz: usize| -> Result<Batched> {
            let path = dir.join(s.file_name());
            let ids = read_split_with(&path, &vocab, cfg.line_end())?;
            batchify(&ids, bsz).map_err(|e| Error::Config {
                path: path.clone(),
                msg: e.to_string(),
            })
        };
        Ok(Self {
            train: split(Split::Train, cfg.batch_size)?,
            valid: split(Split::Valid, cfg.eval_batch_size)?,
            test: split(Split::Test, cfg.eval_batch_size)?,
            vocab,
        })
    }
}

/// A `bptt` window as tensors: input `(B, T)` (batch-first) and targets `(B * T,)` in the
/// same order. The tutorial's window is sequence-first `(T, B)`; only the layout differs.
pub fn window_tensors(w: &Batch, device: &Device) -> Result<(Tensor, Tensor)> {
    let shape = (w.seq_len, w.batch_size);
    let input = Tensor::from_vec(w.input.clone(), shape, device)?
        .t()?
        .contiguous()?;
    let target = Tensor::from_vec(w.target.clone(), shape, device)?
        .t()?
        .flatten_all()?;
    Ok((input, target))
}

/// The tutorial's training step, the body of [`train`]'s loop (and what `transformer bench
/// lm` times): forward in training mode, mean cross-entropy, backward, PyTorch's
/// `clip_grad_norm_` coefficient, SGD scaled by it.
///
/// The embedding's, the encoder layers' and the output layer's gradients bypass candle's
/// `GradStore` ([`TransformerLm::loss_direct`], `transformer_model::grads`): the output
/// layer's are written once into buffers kept from step to step, the embedding's are its
/// used rows, each encoder layer is one fused op, and the norm and the update read them
/// where they are ([`Gradients`]). The same result, to rounding, as the model's composed
/// forward pass with [`Gradients::backward`] + [`crate::clip::clip_coefficient`] +
/// [`Sgd::step`] (`tests/lm_train.rs` compares them).
pub struct LmStep {
    /// Its `lr` is the learning rate of the next step.
    pub opt: Sgd,
    clip: f64,
    direct: DirectGrads,
}

impl LmStep {
    /// SGD over `vars` (all the model's parameters) at `lr`, clipping the gradient norm to
    /// `clip`.
    pub fn new(vars: Vec<Var>, lr: f64, clip: f64) -> Self {
        Self {
            opt: Sgd::new(vars, lr),
            clip,
            direct: DirectGrads::new(),
        }
    }

    /// One step on a window; returns its loss. `rng` draws the dropout masks.
    ///
    /// # Shapes
    /// input (B, T) u32, target (B * T,) u32
    pub fn run(
        &mut self,
        model: &TransformerLm,
        input: &Tensor,
        target: &Tensor,
        rng: &Rng,
        precision: Precision,
    ) -> Result<f64> {
        let loss = model.loss_direct(input, target, Mode::Train(rng), precision, &self.direct)?;
        let grads = Gradients::from_backward(&loss, self.opt.vars(), &self.direct)?;
        let (_, coef) = clip_coefficient(&grads, self.clip)?;
        self.opt.step(&grads, coef)?;
        drop(grads); // empties `self.direct` for the next step
        Ok(loss.to_dtype(DType::F64)?.to_scalar::<f64>()?)
    }
}

/// The tutorial's `evaluate`: the mean loss per target token over all windows, each window's
/// mean loss weighted by its length.
pub fn evaluate(
    model: &TransformerLm,
    data: &Batched,
    bptt: usize,
    device: &Device,
) -> Result<f64> {
    evaluate_on(model, data, bptt, device, &crate::dist::Dist::single())
}

/// [`evaluate`] with the windows split across the processes of `dist` (each its
/// [`crate::dist::Dist::shard`]) and the sums added: every process gets the loss.
pub fn evaluate_on(
    model: &TransformerLm,
    data: &Batched,
    bptt: usize,
    device: &Device,
    dist: &crate::dist::Dist,
) -> Result<f64> {
    let windows: Vec<Batch> = data.windows(bptt).collect();
    let mut total = 0.0;
    for w in &windows[dist.shard(windows.len())] {
        let (input, target) = window_tensors(w, device)?;
        // No backward follows (the tutorial evaluates under torch.no_grad()).
        let loss = model.loss_no_grad(&input, &target)?;
        total += w.seq_len as f64 * loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    }
    let mut sum = [total];
    dist.sum_f64(&mut sum);
    Ok(sum[0] / (data.rows - 1) as f64)
}

/// Where a run stands; saved in every checkpoint (the runner's, for every task).
pub type TrainState = RunState;

pub use crate::runner::{PrintProgress, Progress};

/// How to run [`train`].
pub type TrainOptions = crate::runner::RunOptions<LmTrainConfig>;

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Where the run stands at the end of this invocation.
    pub state: TrainState,
    /// The best model's test loss (mean cross-entropy, nats per token), once tested.
    pub test_loss: Option<f64>,
    /// The loss of every step taken in this invocation.
    pub step_losses: Vec<f64>,
}

pub use crate::runner::{best_path, checkpoint_path, config_path, metrics_path};

/// `vocab.txt` in the run directory `run`.
pub fn vocab_path(run: &Path) -> PathBuf {
    run.join("vocab.txt")
}
/// `best-sgd.safetensors` in the run directory `run`: the best SGD weights, kept apart
/// from `best.safetensors` when the weight average wins.
pub fn best_sgd_path(run: &Path) -> PathBuf {
    run.join("best-sgd.safetensors")
}

/// The default data folder: `../shared/data/wikitext-2` from the working directory, if it
/// exists.
pub fn default_data_dir() -> Option<PathBuf> {
    let p = PathBuf::from("../shared/data/wikitext-2");
    p.is_dir().then_some(p)
}

/// Saves model weights with the config needed to rebuild the model.
pub fn save_weights(path: &Path, params: &Params, model: &LmConfig) -> Result<()> {
    save_tagged(
        path,
        &params_tensors(params),
        WEIGHTS_FORMAT,
        [(
            "model",
            serde_json::to_string(model).expect("config serializes"),
        )],
    )
}

/// A trained model loaded from a run directory (its best weights, or the latest checkpoint
/// when no best model exists yet).
pub struct LoadedLm {
    /// The model, ready to evaluate or generate.
    pub model: TransformerLm,
    /// Its parameters.
    pub params: Params,
    /// Its configuration: the best weights' own, or derived from the run's configuration
    /// when the weights come from a checkpoint.
    pub config: LmConfig,
    /// The run's vocabulary (`vocab.txt`).
    pub vocab: Vocab,
    /// How the run's text was read (its `config.toml`; the newer tutorial's where there is
    /// none, as for imported models).
    pub line_end: LineEnd,
    /// What the front end should tell the user about where the weights came from: set
    /// when there is no `best.safetensors` yet and the checkpoint's weights are used.
    pub note: Option<String>,
}

/// Loads the model of the run directory `run` onto `device`: see [`LoadedLm`].
pub fn load_run(run: &Path, device: &Device) -> Result<LoadedLm> {
    if !run.is_dir() {
        return Err(Error::Usage(format!(
            "{}: no such run directory (create one with `transformer lm train --out DIR` or `transformer lm import-torch`)",
            run.display()
        )));
    }
    let vocab = Vocab::load(&vocab_path(run))?;
    let line_end = if config_path(run).exists() {
        LmTrainConfig::from_toml_file(&config_path(run))?.line_end()
    } else {
        LineEnd::Dropped
    };
    let (path, note) = runner::weights_file(run);
    let format = if note.is_none() {
        WEIGHTS_FORMAT
    } else {
        CHECKPOINT_FORMAT
    };
    if !path.exists() {
        return Err(Error::Usage(format!(
            "{}: no best.safetensors or checkpoint.safetensors",
            run.display()
        )));
    }
    let (model, params, config) = load_model(&path, format, vocab.len(), device)
        .map_err(|e| runner::with_fallback_advice(e, run, &path))?;
    Ok(LoadedLm {
        model,
        params,
        config,
        vocab,
        line_end,
        note,
    })
}

/// The model in a weights file (`format` [`WEIGHTS_FORMAT`]) or a checkpoint
/// ([`CHECKPOINT_FORMAT`]; its SGD weights), checked against a vocabulary of `ntoken`.
fn load_model(
    path: &Path,
    format: &str,
    ntoken: usize,
    device: &Device,
) -> Result<(TransformerLm, Params, LmConfig)> {
    let path = path.to_path_buf();
    let (mut tensors, meta) = checkpoint::load(&path, device)?;
    check_format(&path, &meta, format)?;
    tensors.retain(|name, _| !name.starts_with(AVERAGE_PREFIX));
    let config: LmConfig = if format == WEIGHTS_FORMAT {
        serde_json::from_str(meta.get("model").map(String::as_str).unwrap_or("")).map_err(|e| {
            Error::Checkpoint {
                path: path.clone(),
                msg: format!("model config: {e}"),
            }
        })?
    } else {
        let cfg: LmTrainConfig =
            toml::from_str(meta.get("config").map(String::as_str).unwrap_or("")).map_err(|e| {
                Error::Checkpoint {
                    path: path.clone(),
                    msg: format!("config: {e}"),
                }
            })?;
        cfg.model(ntoken)
    };
    if config.ntoken != ntoken {
        return Err(Error::Checkpoint {
            path,
            msg: format!(
                "the model has {} tokens but vocab.txt has {ntoken}",
                config.ntoken,
            ),
        });
    }
    let pb = ParamBuilder::new(DType::F32, device, 0);
    let model = TransformerLm::new(&pb, &config)?;
    let params = pb.params();
    params.assign(&tensors)?;
    Ok((model, params, config))
}

/// The language model as a task on the [`crate::runner`]: the tutorial's windows, step,
/// log lines, validation (lower loss is better) and test.
struct LmTask {
    cfg: LmTrainConfig,
    model_cfg: LmConfig,
    data: LmData,
    model: TransformerLm,
    params: Params,
    step: LmStep,
    device: Device,
    /// Windows per epoch (all, or `max_batches`), and the count the tutorial's log prints.
    epoch_windows: usize,
    label_batches: usize,
}

impl Task for LmTask {
    type Model = TransformerLm;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;
    // With an average, the best SGD weights are kept apart too, for the tutorial's own test
    // figure.
    const BEST_TRAINED_FILE: Option<&'static str> = Some("best-sgd.safetensors");

    fn epochs(&self) -> usize {
        self.cfg.epochs
    }
    fn checkpoint_interval(&self) -> usize {
        self.cfg.checkpoint_interval
    }
    fn config_toml(&self) -> String {
        self.cfg.to_toml()
    }
    fn model(&self) -> &TransformerLm {
        &self.model
    }
    fn params(&self) -> &Params {
        &self.params
    }
    fn build_model(&self, pb: &ParamBuilder) -> transformer_model::Result<TransformerLm> {
        TransformerLm::new(pb, &self.model_cfg)
    }
    fn save_weights(&self, path: &Path, params: &Params) -> Result<()> {
        save_weights(path, params, &self.model_cfg)
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<usize> {
        self.step.opt.lr = self.cfg.lr_at_epoch(epoch);
        Ok(self.epoch_windows)
    }

    fn train_step(&mut self, index: usize, _step: usize, rng: &Rng) -> Result<StepStats> {
        let w = self.data.train.window(index, self.cfg.bptt);
        let (input, target) = window_tensors(&w, &self.device)?;
        let loss = self
            .step
            .run(&self.model, &input, &target, rng, self.cfg.precision)?;
        Ok(StepStats {
            loss,
            nll: loss,
            tokens: w.seq_len * w.batch_size,
        })
    }

    fn accumulate(&self) -> usize {
        self.cfg.accumulate
    }

    fn batch_tokens(&self, index: usize) -> usize {
        let w = self.data.train.window(index, self.cfg.bptt);
        w.seq_len * w.batch_size
    }

    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let w = self.data.train.window(index, self.cfg.bptt);
        let (input, target) = window_tensors(&w, &self.device)?;
        let loss = self.model.loss_direct(
            &input,
            &target,
            Mode::Train(rng),
            self.cfg.precision,
            &self.step.direct,
        )?;
        let grads = Gradients::from_backward(&loss, self.step.opt.vars(), &self.step.direct)?;
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let tokens = w.seq_len * w.batch_size;
        Ok((
            grads,
            StepStats {
                loss,
                nll: loss,
                tokens,
            },
        ))
    }

    fn update(&mut self, grads: &Gradients, _step: usize) -> Result<()> {
        let (_, coef) = clip_coefficient(grads, self.step.clip)?;
        self.step.opt.step(grads, coef)?;
        Ok(())
    }

    fn data_hash(&self) -> u64 {
        let bytes: Vec<u8> = self
            .data
            .train
            .data
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        crate::dist::hash_bytes(&bytes)
    }

    /// The tutorial logs after batch indices 200, 400, ... (0-based), averaging over
    /// `log_interval` batches whatever the count.
    fn log_due(&self, index: usize, _batches: usize) -> bool {
        index % self.cfg.log_interval == 0 && index > 0
    }

    fn log_line(&self, w: &LogWindow) -> (String, Metric) {
        // The tutorial divides by log_interval whatever the count; with several windows per
        // step, the mean over the window's batches.
        let cur = if w.per_step > 1 {
            w.loss_sum / w.count.max(1) as f64
        } else {
            w.loss_sum / self.cfg.log_interval as f64
        };
        let ms = w.seconds * 1e3 / w.count as f64;
        let lr = self.step.opt.lr;
        let (epoch, batch, label) = (w.epoch, w.index, self.label_batches);
        (
            format!(
                "| epoch {epoch:3} | {batch:5}/{label:5} batches | lr {lr:02.2} | ms/batch {ms:5.2} | loss {cur:5.2} | ppl {:8.2}",
                cur.exp()
            ),
            Metric::Train {
                step: w.step,
                epoch,
                batch,
                batches: label,
                lr,
                ms_per_batch: ms,
                loss: cur,
                ppl: cur.exp(),
            },
        )
    }

    fn validate(&self, model: &TransformerLm, dist: &crate::dist::Dist) -> Result<Validation> {
        Ok(Validation {
            loss: evaluate_on(model, &self.data.valid, self.cfg.bptt, &self.device, dist)?,
            bleu: None,
        })
    }

    fn epoch_lines(
        &self,
        epoch: usize,
        secs: f64,
        _train_seconds: f64,
        validated: &[(Weights, Validation)],
    ) -> Vec<String> {
        let mut lines = vec!["-".repeat(89)];
        for (weights, v) in validated {
            let loss = v.loss;
            lines.push(match weights {
                Weights::Sgd => format!(
                    "| end of epoch {epoch:3} | time: {secs:5.2}s | valid loss {loss:5.2} | valid ppl {:8.2}",
                    loss.exp()
                ),
                Weights::Average => format!(
                    "| weight average   | decay {:<9} | valid loss {loss:5.2} | valid ppl {:8.2}",
                    self.cfg.average_decay,
                    loss.exp()
                ),
            });
        }
        lines.push("-".repeat(89));
        lines
    }

    /// The best model, and the best SGD weights where the average won (the tutorial's own
    /// result).
    fn test(
        &mut self,
        run: &Path,
        state: &RunState,
        progress: &mut dyn Progress,
        dist: &crate::dist::Dist,
    ) -> Result<(Vec<Metric>, Option<f64>)> {
        let (cfg, dev) = (&self.cfg, &self.device);
        let best = load_run(run, dev)?;
        let test_loss = evaluate_on(&best.model, &self.data.test, cfg.bptt, dev, dist)?;
        let mut tests = vec![(state.best_weights, test_loss)];
        progress.line(&"=".repeat(89));
        progress.line(&format!(
            "| End of training | test loss {test_loss:5.2} | test ppl {:8.2}",
            test_loss.exp()
        ));
        if cfg.average_decay > 0.0 {
            progress.line(&format!(
                "| best model by validation: {} after epoch {}",
                state.best_weights.describe(),
                state.best_epoch
            ));
        }
        if state.best_weights == Weights::Average {
            let (sgd, _, _) = load_model(
                &best_sgd_path(run),
                WEIGHTS_FORMAT,
                self.data.vocab.len(),
                dev,
            )?;
            let sgd_loss = evaluate_on(&sgd, &self.data.test, cfg.bptt, dev, dist)?;
            progress.line(&format!(
                "| best SGD weights (the tutorial's read-out) | test loss {sgd_loss:5.2} | test ppl {:8.2}",
                sgd_loss.exp()
            ));
            tests.push((Weights::Sgd, sgd_loss));
        }
        progress.line(&"=".repeat(89));
        let records = tests
            .into_iter()
            .map(|(weights, loss)| Metric::Test {
                step: state.step,
                loss,
                ppl: loss.exp(),
                weights,
                bleu: None,
            })
            .collect();
        Ok((records, Some(test_loss)))
    }
}

/// Trains (or resumes) a run on the [`crate::runner`]; see the module docs for the loop and
/// the files.
pub fn train(opts: &TrainOptions, progress: &mut dyn Progress) -> Result<Summary> {
    let run = &opts.out;
    let dev = &opts.device;
    // Rank 0 alone creates, locks and writes the run directory; the other ranks read it.
    let writer = opts.dist.writes();
    let (resuming, _lock) = if writer {
        let (r, lock) = open_run_dir(run, opts.resume)?;
        (r, Some(lock))
    } else {
        (opts.resume, None)
    };
    let mut asked = opts.config.clone();
    asked.data = asked.data.as_deref().map(runner::absolute);

    // Configuration, vocabulary and checkpoint: fresh or from the checkpoint.
    let (cfg, vocab, saved) = if resuming {
        let saved = Saved::load(run, CHECKPOINT_FORMAT, dev)?;
        let text = saved.config_text(run)?;
        let mut cfg: LmTrainConfig = toml::from_str(text).map_err(|e| Error::Checkpoint {
            path: checkpoint_path(run),
            msg: e.to_string(),
        })?;
        // A run from before weight averaging existed continues as it was configured: without.
        if predates_averaging(text) {
            cfg.average_decay = 0.0;
        }
        let (cfg, notes) =
            runner::resume_config(run, &cfg, &asked, &opts.given, MAY_CHANGE_ON_RESUME)?;
        for n in &notes {
            progress.line(n);
        }
        runner::check_global_batch(run, &saved.state, cfg.accumulate, &opts.dist)?;
        runner::check_recorded_paths(run, &[("data", &cfg.data)], &opts.given)?;
        if writer && !notes.is_empty() {
            checkpoint::write_atomic(&config_path(run), cfg.to_toml().as_bytes())?;
        }
        (cfg, Some(Vocab::load(&vocab_path(run))?), Some(saved))
    } else {
        (asked, None, None)
    };
    cfg.validate()?;
    let data_dir = cfg.data.clone().or_else(default_data_dir).ok_or_else(|| {
        Error::Usage(
            "no data: pass --data DIR (a folder with train.txt, valid.txt and test.txt, such as WikiText-2)".into(),
        )
    })?;
    let data_dir = runner::absolute(&data_dir);
    let data = LmData::load(&data_dir, &cfg, vocab)?;
    let mut cfg = LmTrainConfig {
        data: Some(data_dir),
        ..cfg
    };
    // bf16 only where it measures faster here (fresh runs; a resumed run keeps its choice).
    let precision_line = if resuming {
        (cfg.precision == Precision::Bf16).then(|| crate::precision::resumed_line(BF16_COVERS))
    } else {
        let rows = cfg.batch_size * cfg.bptt;
        let (p, measure) = (cfg.precision, cfg.measure_precision);
        let choice =
            crate::precision::choose(p, measure, rows, cfg.emsize, data.vocab.len(), BF16_COVERS)?;
        cfg.precision = choice.precision;
        choice.line
    };
    if writer && !resuming {
        checkpoint::write_atomic(&config_path(run), cfg.to_toml().as_bytes())?;
        data.vocab.save(&vocab_path(run))?;
        let _ = std::fs::remove_file(metrics_path(run));
    }

    let model_cfg = cfg.model(data.vocab.len());
    let pb = ParamBuilder::new(DType::F32, dev, cfg.seed);
    let model = TransformerLm::new(&pb, &model_cfg)?;
    let params = pb.params();
    if cfg.eos_per_line {
        progress.line(
            "data: an <eos> token after every line, empty lines included (the older tutorial's \
             stream; perplexities are not comparable with the default's)",
        );
    }
    if let Some(line) = &precision_line {
        progress.line(line);
    }
    let num_windows = data.train.num_windows(cfg.bptt);
    let epoch_windows = cfg.max_batches.map_or(num_windows, |m| m.min(num_windows));
    // The tutorial labels its log lines with len(train_data) // bptt.
    let label_batches = cfg
        .max_batches
        .map_or(data.train.tutorial_num_batches(cfg.bptt), |_| epoch_windows);
    let mut task = LmTask {
        step: LmStep::new(params.vars(), cfg.lr, cfg.clip),
        model_cfg,
        data,
        model,
        params,
        device: dev.clone(),
        epoch_windows,
        label_batches,
        cfg,
    };
    let (seed, decay) = (task.cfg.seed, task.cfg.average_decay);
    let s = runner::run(
        &mut task,
        opts,
        saved,
        seed.wrapping_add(1),
        decay,
        AVERAGE_EVERY,
        progress,
    )?;
    Ok(Summary {
        state: s.state,
        test_loss: s.test_loss,
        step_losses: s.step_losses,
    })
}

/// Imports the tutorial's PyTorch `TransformerModel` (either tutorial version's names, see
/// [`transformer_model::import::LmLayout`]) saved with
/// `safetensors.torch.save_file(model.state_dict(), FILE)` and its vocabulary (one token per
/// line in index order) into a new run directory that `eval` and `generate` can use. Sizes
/// are read from the tensors; the head count is not stored by PyTorch and must be given.
pub fn import_torch(
    state_dict: &Path,
    vocab_file: &Path,
    nhead: usize,
    out: &Path,
) -> Result<(LmConfig, transformer_model::import::LmLayout)> {
    let dev = Device::Cpu;
    let (tensors, _) = checkpoint::load(state_dict, &dev)?;
    let bad = |msg: String| Error::Checkpoint {
        path: state_dict.to_path_buf(),
        msg,
    };
    let (tensors, layout) =
        transformer_model::import::lm_from_torch_layout(tensors).map_err(bad)?;
    let dims = |name: &str| -> Result<Vec<usize>> {
        tensors.get(name).map(|t| t.dims().to_vec()).ok_or_else(|| {
            bad(format!(
                "no tensor {name:?}: expected the state dict of the tutorial's TransformerModel \
                 (embedding, transformer_encoder.layers.N.*, linear)"
            ))
        })
    };
    let emb = dims("embedding.weight")?;
    let (ntoken, d_model) = (emb[0], emb[1]);
    let d_hid = dims("transformer_encoder.layers.0.linear1.weight")?[0];
    let nlayers = (0..)
        .take_while(|i| {
            tensors.contains_key(&format!("transformer_encoder.layers.{i}.norm1.weight"))
        })
        .count();
    let vocab = Vocab::load(vocab_file)?;
    if vocab.len() != ntoken {
        return Err(Error::Usage(format!(
            "{} has {} tokens but the model's embedding has {ntoken} rows: pass the vocabulary the model was trained with",
            vocab_file.display(),
            vocab.len()
        )));
    }
    let config = LmConfig {
        ntoken,
        d_model,
        nhead,
        d_hid,
        nlayers,
        ..LmConfig::default()
    };
    config.validate()?;
    let pb = ParamBuilder::new(DType::F32, &dev, 0);
    TransformerLm::new(&pb, &config)?;
    let params = pb.params();
    let ours = transformer_model::import::from_torch(&tensors)?;
    params.assign(&ours).map_err(|e| bad(e.to_string()))?;
    std::fs::create_dir_all(out).map_err(|source| Error::Io {
        path: out.into(),
        source,
    })?;
    let train_cfg = LmTrainConfig {
        emsize: d_model,
        nhid: d_hid,
        nlayers,
        nhead,
        ..LmTrainConfig::default()
    };
    checkpoint::write_atomic(&config_path(out), train_cfg.to_toml().as_bytes())?;
    vocab.save(&vocab_path(out))?;
    save_weights(&best_path(out), &params, &config)?;
    Ok((config, layout))
}

/// Loss, perplexity and token count of a text file under a run's model, evaluated like the
/// tutorial's `evaluate` (tokenized with its vocabulary, batchified into `batch_size`
/// columns, `bptt` windows, each window's loss weighted by its length).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalResult {
    /// Mean cross-entropy per predicted token, in nats.
    pub loss: f64,
    /// Perplexity, `exp(loss)`.
    pub ppl: f64,
    /// The number of predicted tokens.
    pub tokens: usize,
}

/// Evaluates the text file `text` under the loaded model; see [`EvalResult`].
pub fn evaluate_file(
    lm: &LoadedLm,
    text: &Path,
    batch_size: usize,
    bptt: usize,
    device: &Device,
) -> Result<EvalResult> {
    let ids = read_split_with(text, &lm.vocab, lm.line_end)?;
    let data = batchify(&ids, batch_size).map_err(|e| Error::Config {
        path: text.into(),
        msg: e.to_string(),
    })?;
    let loss = evaluate(&lm.model, &data, bptt, device)?;
    Ok(EvalResult {
        loss,
        ppl: loss.exp(),
        tokens: (data.rows - 1) * data.cols,
    })
}
