//! The Annotated Transformer's copy task: learn to output the source sequence. Random
//! symbols 1..V-1 with the first position fixed to 1 (used as the start symbol), 0 = padding.
//! A model that decodes its inputs back has working embeddings, masks, attention over the
//! memory, training and decoding end to end.

use crate::checkpoint::params_tensors;
use crate::clip::clip_grad_norm;
use crate::error::Result;
use crate::grads::Gradients;
use crate::loss::cross_entropy;
use crate::metrics::Metric;
use crate::optim::{Adam, NoamSchedule};
use crate::runner::{
    self, save_tagged, ModelConfig, ModelPlan, Progress, RunOptions, Setup, StepStats, Task,
    TestRun, Trained, Validation,
};
use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};
use std::path::Path;
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{Mode, ParamBuilder, Params, Rng, Seq2Seq, TransformerConfig};

/// The padding symbol.
pub const PAD: u32 = 0;
/// The start symbol, the first position of every sequence.
pub const BOS: u32 = 1;
/// Format tag of the copy task's checkpoints.
pub const CHECKPOINT_FORMAT: &str = "transformer-copy-checkpoint/1";
/// Format tag of the copy task's weight files (`best` and `last`).
pub const WEIGHTS_FORMAT: &str = "transformer-copy-weights/1";

/// The copy task's settings: model, data and optimisation; [`Default`] is the Annotated
/// Transformer's setup (a 2-layer model, 11 symbols, sequences of 10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyTaskConfig {
    /// The encoder-decoder's sizes.
    pub model: TransformerConfig,
    /// Symbols 0..vocab (0 = padding, 1 = start).
    pub vocab: usize,
    /// Sequence length including the start symbol.
    pub seq_len: usize,
    /// Sequences per training batch.
    pub batch_size: usize,
    /// Optimizer steps (one random batch each).
    pub steps: usize,
    /// Warm-up steps of the Noam schedule.
    pub warmup: usize,
    /// Multiplies the Noam learning rate.
    pub lr_factor: f64,
    /// Seeds the initial weights and the held-out set; `seed + 1` seeds the batches and dropout.
    pub seed: u64,
    /// A log line every this many steps.
    pub log_every: usize,
}

impl Default for CopyTaskConfig {
    fn default() -> Self {
        Self {
            model: TransformerConfig {
                dropout: 0.1,
                ..TransformerConfig::tiny()
            },
            vocab: 11,
            seq_len: 10,
            batch_size: 32,
            steps: 800,
            warmup: 100,
            lr_factor: 1.0,
            seed: 1,
            log_every: 100,
        }
    }
}

/// A batch of random sequences; returned as `(B, seq_len)` u32 ids.
pub fn random_batch(
    rng: &Rng,
    cfg: &CopyTaskConfig,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let u = rng.uniform_vec(cfg.batch_size * cfg.seq_len);
    let ids: Vec<u32> = u
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if i % cfg.seq_len == 0 {
                BOS
            } else {
                1 + (x * (cfg.vocab - 1) as f64) as u32
            }
        })
        .collect();
    Tensor::from_vec(ids, (cfg.batch_size, cfg.seq_len), device)
}

/// The teacher-forced loss of a batch: predict `data[1..]` from `data[..-1]`, the source
/// being the whole sequence.
fn batch_loss(model: &Seq2Seq, data: &Tensor, cfg: &CopyTaskConfig, mode: Mode) -> Result<Tensor> {
    let (b, s) = data.dims2()?;
    let t = s - 1;
    let (tgt_in, tgt_out) = (data.narrow(1, 0, t)?, data.narrow(1, 1, t)?);
    let masks = Seq2SeqMasks::new(data, &tgt_in, PAD)?;
    let logits = model.forward(data, &tgt_in, &masks, mode)?;
    let (loss, _) = cross_entropy(
        &logits.reshape((b * t, cfg.vocab))?,
        &tgt_out.flatten_all()?,
        Some(PAD),
    )?;
    Ok(loss)
}

/// The copy task on the [`crate::runner`]: one epoch of `steps` random batches, Adam with
/// the warm-up schedule; validated (teacher-forced loss) and tested (exact greedy copies) on
/// held-out batches.
struct CopyTask {
    cfg: CopyTaskConfig,
    trained: Trained<CopyTaskConfig>,
    vars: Vec<Var>,
    opt: Adam,
    schedule: NoamSchedule,
    device: Device,
    /// Held-out sequences (their own seed): validation and test.
    held_out: Tensor,
    /// Exact copies of the best model on the held-out sequences, once tested.
    accuracy: Option<f64>,
}

/// The copy task's model is built from its whole configuration (sizes and vocabulary); its
/// weight files hold the weights alone.
impl ModelConfig for CopyTaskConfig {
    type Model = Seq2Seq;
    const WEIGHTS_FORMAT: &'static str = WEIGHTS_FORMAT;
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<Seq2Seq> {
        Seq2Seq::new(pb, &self.model, self.vocab, self.vocab)
    }
    fn save(&self, path: &Path, params: &Params) -> Result<()> {
        save_tagged(path, &params_tensors(params), WEIGHTS_FORMAT, [])
    }
}

/// The copy task trains one epoch of `steps` batches (the runner's default).
impl Task for CopyTask {
    type Config = CopyTaskConfig;
    type ModelConfig = CopyTaskConfig;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;

    fn config(&self) -> &CopyTaskConfig {
        &self.cfg
    }
    fn trained(&self) -> &Trained<CopyTaskConfig> {
        &self.trained
    }

    fn start_epoch(&mut self, _epoch: usize) -> Result<usize> {
        Ok(self.cfg.steps)
    }

    /// The batch is drawn from the run's RNG (resumed with it), then dropout from the same.
    fn backward(&mut self, _index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let data = random_batch(rng, &self.cfg, &self.device)?;
        let loss = batch_loss(&self.trained.model, &data, &self.cfg, Mode::Train(rng))?;
        let grads = Gradients::backward(&loss, &self.vars)?;
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let tokens = self.cfg.batch_size * (self.cfg.seq_len - 1);
        let nll = loss;
        Ok((grads, StepStats { loss, nll, tokens }))
    }

    /// The gradients clipped to norm 1 in place, then Adam on the warm-up schedule.
    fn update(&mut self, grads: &mut Gradients, step: usize) -> Result<()> {
        clip_grad_norm(grads, 1.0)?;
        self.opt.lr = self.schedule.lr(step + 1);
        self.opt.step(grads, 1.0)?;
        Ok(())
    }

    fn log_interval(&self) -> usize {
        self.cfg.log_every
    }

    fn learning_rate(&self) -> f64 {
        self.opt.lr
    }

    fn validate(&self, model: &Seq2Seq, _dist: &crate::dist::Dist) -> Result<Validation> {
        let loss = batch_loss(model, &self.held_out, &self.cfg, Mode::Eval)?;
        let loss = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok(Validation::new(loss, None))
    }

    fn adam(&mut self) -> Option<&mut Adam> {
        Some(&mut self.opt)
    }

    /// Exact greedy copies of the held-out sequences by the best model.
    fn test(&mut self, t: TestRun) -> Result<(Vec<Metric>, Option<f64>)> {
        let pb = ParamBuilder::new(DType::F32, &self.device, 0);
        let best = self.cfg.build(&pb)?;
        let (tensors, _) = runner::load_tagged(
            &crate::runner::best_path(t.run),
            WEIGHTS_FORMAT,
            &self.device,
        )?;
        pb.params().assign(&tensors)?;
        let loss = self.validate(&best, &crate::dist::Dist::single())?.loss;
        let acc = copy_accuracy(&best, &self.held_out)?;
        let decoded = greedy_copies(&best, &self.held_out)?;
        for (row, out) in self.held_out.to_vec2::<u32>()?.iter().zip(&decoded).take(3) {
            t.progress
                .line(&format!("  source {:?}\n  greedy {:?}", &row[1..], out));
        }
        t.progress.line(&format!(
            "exact copies on {} held-out sequences: {:.0}%",
            decoded.len(),
            100.0 * acc
        ));
        self.accuracy = Some(acc);
        let record = t.record(t.state.best_weights, loss, Default::default());
        Ok((vec![record], Some(loss)))
    }
}

/// A finished copy-task run: the loss of every step and the exact-copy rate of the trained
/// model on 100 held-out sequences.
pub struct CopySummary {
    /// The training loss (mean cross-entropy, nats) of every step.
    pub losses: Vec<f64>,
    /// The fraction of held-out sequences the best model copies exactly; `None` when the
    /// test phase did not run.
    pub accuracy: Option<f64>,
    /// The model's number of scalar parameters.
    pub parameters: usize,
}

/// Trains the copy task from scratch (or resumes it) in the run directory `opts.out`.
pub fn train(
    opts: &RunOptions<CopyTaskConfig>,
    progress: &mut dyn Progress,
) -> Result<CopySummary> {
    let (task, s) = runner::train(CopySetup, opts, progress)?;
    Ok(CopySummary {
        losses: s.step_losses,
        accuracy: task.accuracy,
        parameters: task.trained.params.num_elements(),
    })
}

/// The copy task's start: no data to read (its batches are drawn as it trains), no
/// tokenizer, the model of its configuration in f32.
struct CopySetup;

impl Setup for CopySetup {
    type Task = CopyTask;
    type Tokenizer = ();
    type Data = ();

    fn data(&mut self, _: &mut CopyTaskConfig, _: Option<()>, _: &mut dyn Progress) -> Result<()> {
        Ok(())
    }

    fn tokenizer(_: &()) -> &() {
        &()
    }

    fn model(&self, cfg: &CopyTaskConfig, _: &()) -> Result<ModelPlan<CopyTaskConfig>> {
        Ok(ModelPlan::new(cfg.clone()))
    }

    fn task(
        self,
        cfg: CopyTaskConfig,
        _: (),
        trained: Trained<CopyTaskConfig>,
        dev: &Device,
    ) -> Result<CopyTask> {
        let vars = trained.params.vars();
        let held_out = random_batch(
            &Rng::new(cfg.seed ^ 0xdead_beef),
            &CopyTaskConfig {
                batch_size: 100,
                ..cfg.clone()
            },
            dev,
        )?;
        Ok(CopyTask {
            opt: Adam::new(vars.clone(), 0.0)?,
            schedule: NoamSchedule {
                d_model: cfg.model.d_model,
                warmup: cfg.warmup,
                factor: cfg.lr_factor,
            },
            vars,
            trained,
            device: dev.clone(),
            held_out,
            accuracy: None,
            cfg,
        })
    }
}

/// Greedy-decodes `src` (B, seq_len): `seq_len - 1` symbols per row (no end token).
pub fn greedy_copies(model: &Seq2Seq, src: &Tensor) -> candle_core::Result<Vec<Vec<u32>>> {
    let (_, s) = src.dims2()?;
    let opts = transformer_decode::DecodeOptions {
        beam: 1,
        max_len_a: 0.0,
        max_len_b: s - 1,
        bos: BOS,
        // No end token: every output is s - 1 symbols long (an id that is never produced).
        eos: u32::MAX,
        pad: PAD,
        ..Default::default()
    };
    Ok(transformer_decode::greedy(model, src, &opts)?
        .into_iter()
        .map(|h| h.tokens)
        .collect())
}

/// Greedy-decodes `src` (B, seq_len) and returns the fraction of sequences copied exactly.
pub fn copy_accuracy(model: &Seq2Seq, src: &Tensor) -> candle_core::Result<f64> {
    let (b, _) = src.dims2()?;
    let decoded = greedy_copies(model, src)?;
    let rows = src.to_vec2::<u32>()?;
    let exact = rows
        .iter()
        .zip(&decoded)
        .filter(|(r, d)| r[1..] == d[..])
        .count();
    Ok(exact as f64 / b as f64)
}

impl crate::runner::RunConfig for CopyTaskConfig {
    /// A resumed copy task continues as it was configured.
    const MAY_CHANGE_ON_RESUME: &'static [&'static str] = &[];
    fn make_paths_absolute(&mut self) {}
    fn recorded_paths(&self) -> Vec<(&'static str, &Option<std::path::PathBuf>)> {
        Vec::new()
    }
    fn without_averaging(&mut self) {}
}
