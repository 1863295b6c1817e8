//! The training configuration ([`LmTrainConfig`]) and what a resumed run may change.

use crate::error::{Error, Result};
use crate::runner::require_at_least_one;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use transformer_model::LmConfig;
use transformer_model::Precision;
use transformer_text::corpus::LineEnd;

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

/// The settings a resumed run may change besides the runner's
/// ([`crate::runner::RUNNER_MAY_CHANGE`]: how long it trains, what it logs and checkpoints):
/// where its data lies. The rest (the model, the optimizer, the batches, the seed) are the
/// run's own.
pub const MAY_CHANGE_ON_RESUME: &[&str] = &["data"];

/// What `--precision bf16` runs in bf16, as the log says it (the encoder layers stay f32, so
/// that the language model's bf16 arithmetic is the output layer's alone).
pub(super) const BF16_COVERS: &str = "the output layer's products";

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
        require_at_least_one(&[
            ("epochs", self.epochs),
            ("batch_size", self.batch_size),
            ("eval_batch_size", self.eval_batch_size),
            ("bptt", self.bptt),
            ("log_interval", self.log_interval),
        ])
        .map_err(Error::Usage)?;
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
        crate::runner::read_toml_file(path)
    }

    /// The learning rate of `epoch` (1-based): StepLR(step_size 1, gamma).
    pub fn lr_at_epoch(&self, epoch: usize) -> f64 {
        self.lr * self.gamma.powi(epoch as i32 - 1)
    }
}

impl crate::runner::RunConfig for LmTrainConfig {
    const MAY_CHANGE_ON_RESUME: &'static [&'static str] = MAY_CHANGE_ON_RESUME;
    fn make_paths_absolute(&mut self) {
        self.data = self.data.as_deref().map(crate::runner::absolute);
    }
    fn recorded_paths(&self) -> Vec<(&'static str, &Option<std::path::PathBuf>)> {
        vec![("data", &self.data)]
    }
    fn without_averaging(&mut self) {
        self.average_decay = 0.0;
    }
    fn set_precision(&mut self, precision: transformer_model::Precision) {
        self.precision = precision;
    }
}
