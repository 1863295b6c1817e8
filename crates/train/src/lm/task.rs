//! The language model as a task on the [`crate::runner`].

use super::*;
use crate::error::Result;
use crate::grads::Gradients;
use crate::metrics::{Metric, Weights};
use crate::runner::{
    EpochEnd, LogWindow, ModelPlan, PrecisionProbe, Setup, StepStats, Task, TestRun, Trained,
    Validation,
};
use candle_core::Device;
use transformer_model::{LmConfig, Rng, TransformerLm};

// A run keeps its vocabulary as `vocab.txt`.
crate::runner::run_tokenizer_file!(Vocab, vocab_path);

/// The language model's start on the runner: the three splits of the data folder, encoded
/// with the vocabulary of the training split (a resumed run's own), and the model for it.
pub(super) struct LmSetup;

impl Setup for LmSetup {
    type Task = LmTask;
    type Tokenizer = Vocab;
    type Data = LmData;

    fn data(
        &mut self,
        cfg: &mut LmTrainConfig,
        vocab: Option<Vocab>,
        progress: &mut dyn Progress,
    ) -> Result<LmData> {
        cfg.validate()?;
        let data_dir = cfg.data.clone().or_else(default_data_dir).ok_or_else(|| {
            Error::Usage(
                "no data: pass --data DIR (a folder with train.txt, valid.txt and test.txt, such as WikiText-2)".into(),
            )
        })?;
        let data_dir = runner::absolute(&data_dir);
        let data = LmData::load(&data_dir, cfg, vocab)?;
        cfg.data = Some(data_dir);
        if cfg.eos_per_line {
            progress.line(
                "data: an <eos> token after every line, empty lines included (the older \
                 tutorial's stream; perplexities are not comparable with the default's)",
            );
        }
        Ok(data)
    }

    fn tokenizer(data: &LmData) -> &Vocab {
        &data.vocab
    }

    /// bf16 only where it measures faster here (fresh runs; a resumed run keeps its choice).
    fn model(&self, cfg: &LmTrainConfig, data: &LmData) -> Result<ModelPlan<LmConfig>> {
        Ok(ModelPlan {
            config: cfg.model(data.vocab.len()),
            probe: Some(PrecisionProbe {
                rows: cfg.batch_size * cfg.bptt,
                d_model: cfg.emsize,
                vocab: data.vocab.len(),
                covers: BF16_COVERS,
            }),
            precision_note: None,
        })
    }

    fn task(
        self,
        cfg: LmTrainConfig,
        data: LmData,
        trained: Trained<LmConfig>,
        device: &Device,
    ) -> Result<LmTask> {
        let num_windows = data.train.num_windows(cfg.bptt);
        let epoch_windows = runner::epoch_batches(num_windows, cfg.max_batches);
        // The tutorial labels its log lines with len(train_data) // bptt.
        let label_batches = cfg
            .max_batches
            .map_or(data.train.tutorial_num_batches(cfg.bptt), |_| epoch_windows);
        Ok(LmTask {
            step: LmStep::new(trained.params.vars(), cfg.lr, cfg.clip),
            data,
            trained,
            device: device.clone(),
            epoch_windows,
            label_batches,
            cfg,
        })
    }
}

/// The language model as a task on the [`crate::runner`]: the tutorial's windows, step,
/// log lines, validation (lower loss is better) and test.
pub(super) struct LmTask {
    pub(super) cfg: LmTrainConfig,
    pub(super) data: LmData,
    pub(super) trained: Trained<LmConfig>,
    pub(super) step: LmStep,
    pub(super) device: Device,
    /// Windows per epoch (all, or `max_batches`), and the count the tutorial's log prints.
    pub(super) epoch_windows: usize,
    pub(super) label_batches: usize,
}

impl Task for LmTask {
    type Config = LmTrainConfig;
    type ModelConfig = LmConfig;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;
    // With an average, the best SGD weights are kept apart too, for the tutorial's own test
    // figure.
    const BEST_TRAINED_FILE: Option<&'static str> = Some("best-sgd.safetensors");

    fn config(&self) -> &LmTrainConfig {
        &self.cfg
    }
    fn trained(&self) -> &Trained<LmConfig> {
        &self.trained
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<usize> {
        self.step.opt.lr = self.cfg.lr_at_epoch(epoch);
        Ok(self.epoch_windows)
    }

    fn batch_tokens(&self, index: usize) -> usize {
        let w = self.data.train.window(index, self.cfg.bptt);
        w.seq_len * w.batch_size
    }

    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let w = self.data.train.window(index, self.cfg.bptt);
        let (input, target) = window_tensors(&w, &self.device)?;
        let (grads, loss) = self
            .step
            .gradients(&self.trained.model, &input, &target, rng)?;
        let tokens = w.seq_len * w.batch_size;
        let nll = loss;
        Ok((grads, StepStats { loss, nll, tokens }))
    }

    fn update(&mut self, grads: &mut Gradients, _step: usize) -> Result<()> {
        self.step.apply(grads)
    }

    fn data_hash(&self) -> u64 {
        self.data.train_hash()
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
        let ms = w.ms_per_batch();
        let lr = self.step.opt.lr;
        let (epoch, batch, label) = (w.epoch, w.index, self.label_batches);
        (
            format!(
                "| epoch {epoch:3} | {batch:5}/{label:5} batches | lr {lr:02.2} | ms/batch {ms:5.2} | loss {cur:5.2} | ppl {:8.2}",
                cur.exp()
            ),
            w.record(batch, label, lr, cur, cur.exp()),
        )
    }

    fn validate(&self, model: &TransformerLm, dist: &crate::dist::Dist) -> Result<Validation> {
        let loss = evaluate_on(model, &self.data.valid, self.cfg.bptt, &self.device, dist)?;
        Ok(Validation::new(loss, None))
    }

    fn epoch_lines(&self, end: &EpochEnd) -> Vec<String> {
        let (epoch, secs) = (end.epoch, end.seconds);
        end.ruled(|weights, v| {
            let loss = v.loss;
            match weights {
                Weights::Sgd => format!(
                    "| end of epoch {epoch:3} | time: {secs:5.2}s | valid loss {loss:5.2} | valid ppl {:8.2}",
                    loss.exp()
                ),
                Weights::Average => format!(
                    "| weight average   | decay {:<9} | valid loss {loss:5.2} | valid ppl {:8.2}",
                    self.cfg.average_decay,
                    loss.exp()
                ),
            }
        })
    }

    /// The best model, and the best SGD weights where the average won (the tutorial's own
    /// result).
    fn test(&mut self, mut t: TestRun) -> Result<(Vec<Metric>, Option<f64>)> {
        let (cfg, dev) = (&self.cfg, &self.device);
        let best = load_run(t.run, dev)?;
        let test_loss = evaluate_on(&best.model, &self.data.test, cfg.bptt, dev, t.dist)?;
        let mut tests = vec![(t.state.best_weights, test_loss)];
        let mut lines = vec![format!(
            "| End of training | test loss {test_loss:5.2} | test ppl {:8.2}",
            test_loss.exp()
        )];
        if cfg.average_decay > 0.0 {
            lines.push(format!(
                "| best model by validation: {} after epoch {}",
                t.state.best_weights.describe(),
                t.state.best_epoch
            ));
        }
        if t.state.best_weights == Weights::Average {
            let (sgd, _, _) = load_model(
                &best_sgd_path(t.run),
                WEIGHTS_FORMAT,
                self.data.vocab.len(),
                dev,
            )?;
            let sgd_loss = evaluate_on(&sgd, &self.data.test, cfg.bptt, dev, t.dist)?;
            lines.push(format!(
                "| best SGD weights (the tutorial's read-out) | test loss {sgd_loss:5.2} | test ppl {:8.2}",
                sgd_loss.exp()
            ));
            tests.push((Weights::Sgd, sgd_loss));
        }
        t.report(&lines);
        let records = tests
            .into_iter()
            .map(|(weights, loss)| t.record(weights, loss, Default::default()))
            .collect();
        Ok((records, Some(test_loss)))
    }
}
