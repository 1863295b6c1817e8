//! The language model as a task on the [`crate::runner`].

use super::*;
use crate::clip::clip_coefficient;
use crate::error::Result;
use crate::grads::Gradients;
use crate::metrics::{Metric, Weights};
use crate::runner::{LogWindow, RunState, StepStats, Task, Validation};
use candle_core::{DType, Device};
use std::path::Path;
use transformer_model::Backprop;
use transformer_model::{LmConfig, Mode, ParamBuilder, Params, Rng, TransformerLm};

/// The language model as a task on the [`crate::runner`]: the tutorial's windows, step,
/// log lines, validation (lower loss is better) and test.
pub(super) struct LmTask {
    pub(super) cfg: LmTrainConfig,
    pub(super) model_cfg: LmConfig,
    pub(super) data: LmData,
    pub(super) model: TransformerLm,
    pub(super) params: Params,
    pub(super) step: LmStep,
    pub(super) device: Device,
    /// Windows per epoch (all, or `max_batches`), and the count the tutorial's log prints.
    pub(super) epoch_windows: usize,
    pub(super) label_batches: usize,
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
        let loss = self.model.loss(
            &input,
            &target,
            Mode::Train(rng),
            Backprop::Direct(&self.step.direct, Precision::F32),
            self.cfg.precision,
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
            score: None,
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
                chrf: None,
            })
            .collect();
        Ok((records, Some(test_loss)))
    }
}
