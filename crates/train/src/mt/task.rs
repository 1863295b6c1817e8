//! Translation as a task on the [`crate::runner`].

use super::*;
use crate::error::Result;
use crate::grads::Gradients;
use crate::metrics::{Metric, Weights};
use crate::optim::{Adam, NoamSchedule};
use crate::runner::{
    self, EpochEnd, LogWindow, Selection, StepStats, Task, TestRun, Trained, Validation,
};
use candle_core::Device;
use std::time::Instant;
use transformer_model::{DirectGrads, Rng};
use transformer_text::bucket::PairBatch;
use transformer_text::parallel::PairSource;
use transformer_text::subword::Subword;

/// Translation as a task on the [`crate::runner`]: length-bucketed batches in a new order
/// every epoch, the label-smoothed step with Adam and the warm-up schedule, validation by
/// loss and greedy BLEU (higher BLEU is better), beam-search BLEU on the test set.
pub(super) struct MtTask {
    pub(super) cfg: MtTrainConfig,
    pub(super) trained: Trained<MtModelConfig>,
    pub(super) vars: Vec<candle_core::Var>,
    pub(super) opt: Adam,
    /// Gradients the fused ops write outside candle's `GradStore`, buffers reused.
    pub(super) direct: DirectGrads,
    pub(super) schedule: NoamSchedule,
    pub(super) tokenizer: Subword,
    pub(super) train: EncodedSplit,
    pub(super) keep: Vec<usize>,
    pub(super) valid: EncodedSplit,
    pub(super) test_files: Option<PairSource>,
    pub(super) device: Device,
    /// This epoch's batches.
    pub(super) batches: Vec<PairBatch>,
    /// The test loss and sacreBLEU of the best model, once tested.
    pub(super) test: Option<(f64, f64)>,
}

impl Task for MtTask {
    type Config = MtTrainConfig;
    type ModelConfig = MtModelConfig;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;

    /// The higher validation score: chrF for Korean output, BLEU otherwise
    /// ([`score_metric`]).
    fn selection(&self) -> Selection {
        Selection::HigherScore(score_metric(&self.cfg))
    }

    fn config(&self) -> &MtTrainConfig {
        &self.cfg
    }
    fn trained(&self) -> &Trained<MtModelConfig> {
        &self.trained
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<usize> {
        // A new batch order every epoch, fixed by the seed and the epoch.
        let seed = self.cfg.seed.wrapping_mul(1_000_003);
        let seed = seed.wrapping_add(epoch as u64);
        self.batches = self.train.batches(&self.keep, self.cfg.max_tokens, seed);
        let batches = self.batches.len();
        Ok(runner::epoch_batches(batches, self.cfg.max_batches))
    }

    fn batch_tokens(&self, index: usize) -> usize {
        self.batches[index].tgt_tokens
    }

    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let b = &self.batches[index];
        let (src, tgt_in, tgt_out) = batch_tensors(b, &self.device)?;
        let (model, batch) = (&self.trained.model, [&src, &tgt_in, &tgt_out]);
        let (pad, ls) = (self.train.specials.pad, self.cfg.label_smoothing);
        let (grads, loss, nll) =
            batch_gradients(model, &self.vars, &self.direct, batch, pad, ls, rng)?;
        let tokens = b.tgt_tokens;
        Ok((grads, StepStats { loss, nll, tokens }))
    }

    fn update(&mut self, grads: &mut Gradients, step: usize) -> Result<()> {
        self.opt.lr = self.schedule.lr(step + 1);
        apply_gradients(&mut self.opt, grads, self.cfg.clip)
    }

    fn data_hash(&self) -> u64 {
        self.train.hash_with(&self.keep)
    }

    fn log_due(&self, index: usize, batches: usize) -> bool {
        (index + 1).is_multiple_of(self.cfg.log_interval) || index + 1 == batches
    }

    fn log_line(&self, w: &LogWindow) -> (String, Metric) {
        let n = w.count.max(1) as f64;
        let (cur, cur_nll) = (w.loss_sum / n, w.nll_sum / n);
        let ms = w.ms_per_batch();
        let (epoch, batch, batches, lr) = (w.epoch, w.index + 1, w.batches, self.opt.lr);
        (
            format!(
                "| epoch {epoch:3} | {batch:5}/{batches:5} batches | lr {lr:.2e} | ms/batch {ms:6.1} | tok/s {:6.0} | loss {cur:5.2} | ppl {:7.2}",
                w.tokens as f64 / w.seconds.max(1e-9),
                cur_nll.exp()
            ),
            w.record(batch, batches, lr, cur, cur_nll.exp()),
        )
    }

    fn validate(&self, model: &MtModel, dist: &crate::dist::Dist) -> Result<Validation> {
        let dev = &self.device;
        let loss = evaluate_loss_on(model, &self.valid, self.cfg.max_tokens, dev, dist)?;
        let greedy = DecodeRequest::new(self.cfg.decode_options(1));
        let (src, refs) = (&self.valid.pairs.src, &self.valid.pairs.tgt);
        let hyps = translate_shared(model, &self.tokenizer, src, &greedy, (dev, dist), |_, _| {})?;
        let score = score(score_metric(&self.cfg), &hyps, refs)?;
        Ok(Validation::new(loss, Some(score)))
    }

    fn epoch_lines(&self, end: &EpochEnd) -> Vec<String> {
        let (epoch, secs, train_secs) = (end.epoch, end.seconds, end.train_seconds);
        end.ruled(|weights, v| {
            let head = match weights {
                Weights::Sgd => {
                    format!("| end of epoch {epoch:3} | time: {secs:6.1}s (train {train_secs:.1}s)")
                }
                // The decay and a space, padded to 11 as the LM's `{:<9}` pads it.
                Weights::Average => format!(
                    "| weight average (decay {:<11}",
                    format!("{}) ", self.cfg.average_decay)
                ),
            };
            let (label, value) = v
                .score
                .map_or(("BLEU", 0.0), |s| (s.metric.label(), s.value));
            format!(
                "{head} | valid loss {:5.3} | valid ppl {:7.2} | valid {label} {value:5.2} (greedy)",
                v.loss,
                v.loss.exp(),
            )
        })
    }

    fn adam(&mut self) -> Option<&mut Adam> {
        Some(&mut self.opt)
    }

    /// The best model translates the test set with beam search.
    fn test(&mut self, mut t: TestRun) -> Result<(Vec<Metric>, Option<f64>)> {
        let Some(src) = &self.test_files else {
            return Ok((Vec::new(), None));
        };
        let (cfg, dev, tok) = (&self.cfg, &self.device, &self.tokenizer);
        let best = load_run(t.run, &transformer_runtime::load::Execution::on(dev))?;
        let data = EncodedSplit::encode(src.read()?, tok);
        let loss = evaluate_loss_on(&best.model, &data, cfg.max_tokens, dev, t.dist)?;
        let start = Instant::now();
        let beam = DecodeRequest::new(cfg.decode_options(cfg.beam));
        let hyps = translate_shared(
            &best.model,
            tok,
            &data.pairs.src,
            &beam,
            (dev, t.dist),
            |done, total| t.progress.batch(cfg.epochs + 1, done, total),
        )?;
        let scores = TestScores::of(score_metric(cfg), &hyps, &data.pairs.tgt)?;
        t.write("test.hyp", (hyps.join("\n") + "\n").as_bytes())?;
        let mut lines = vec![format!(
            "| End of training | best: {} of epoch {} | test loss {loss:5.3} | test ppl {:7.2} (per word {:.2}) | test BLEU {:5.2} (sacreBLEU, beam {}, {:.1}s)",
            match t.state.best_weights {
                Weights::Sgd => "the trained weights",
                Weights::Average => "the weight average",
            },
            t.state.best_epoch,
            loss.exp(),
            word_perplexity(loss, &data),
            scores.bleu,
            cfg.beam,
            start.elapsed().as_secs_f64()
        )];
        lines.extend(scores.lines());
        t.report(&lines);
        self.test = Some((loss, scores.bleu));
        let record = t.record(t.state.best_weights, loss, scores.record());
        Ok((vec![record], Some(loss)))
    }
}
