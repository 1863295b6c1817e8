//! Translation as a task on the [`crate::runner`].

use super::*;
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::metrics::{Metric, Score, ScoreMetric, Weights};
use crate::optim::{Adam, NoamSchedule};
use crate::runner::{
    EpochEnd, LogWindow, Selection, StepStats, Task, TestRun, Trained, Validation,
};
use candle_core::Device;
use std::time::Instant;
use transformer_model::{DirectGrads, Rng};
use transformer_text::bucket::{pair_batches, PairBatch};
use transformer_text::parallel::PairSource;
use transformer_text::score::bleu::{corpus_bleu, BleuOptions};
use transformer_text::subword::{Subword, TextTokenizer};

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

impl MtTask {
    /// The score validation chooses the best model by: chrF where the output is Korean
    /// (BLEU's 13a words are Korean's space-separated eojeol, each a stem with its particles,
    /// so BLEU there measures the tokenization as much as the translation), BLEU elsewhere.
    fn score_metric(&self) -> ScoreMetric {
        match self.cfg.language_pair() {
            Some((_, target)) if target == "ko" => ScoreMetric::Chrf,
            _ => ScoreMetric::Bleu,
        }
    }
}

impl Task for MtTask {
    type Config = MtTrainConfig;
    type ModelConfig = MtModelConfig;
    const CHECKPOINT_FORMAT: &'static str = CHECKPOINT_FORMAT;

    /// The higher validation score: chrF for Korean output, BLEU otherwise
    /// ([`MtTask::score_metric`]).
    fn selection(&self) -> Selection {
        Selection::HigherScore(self.score_metric())
    }

    fn config(&self) -> &MtTrainConfig {
        &self.cfg
    }
    fn trained(&self) -> &Trained<MtModelConfig> {
        &self.trained
    }

    fn start_epoch(&mut self, epoch: usize) -> Result<usize> {
        let sp = self.tokenizer.specials();
        let seed = self
            .cfg
            .seed
            .wrapping_mul(1_000_003)
            .wrapping_add(epoch as u64);
        self.batches = pair_batches(
            &self.train.src,
            &self.train.tgt,
            &self.keep,
            self.cfg.max_tokens,
            sp,
            seed,
        );
        Ok(self
            .cfg
            .max_batches
            .map_or(self.batches.len(), |m| m.min(self.batches.len())))
    }

    fn batch_tokens(&self, index: usize) -> usize {
        self.batches[index].tgt_tokens
    }

    fn backward(&mut self, index: usize, rng: &Rng) -> Result<(Gradients, StepStats)> {
        let pad = self.tokenizer.specials().pad;
        let b = &self.batches[index];
        let (src, tgt_in, tgt_out) = batch_tensors(b, &self.device)?;
        let batch = [&src, &tgt_in, &tgt_out];
        let model = &self.trained.model;
        let ls = self.cfg.label_smoothing;
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
        let mut bytes = Vec::new();
        for (s, t) in self.train.src.iter().zip(&self.train.tgt) {
            bytes.extend(s.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xff);
            bytes.extend(t.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xfe);
        }
        bytes.extend(self.keep.iter().flat_map(|&k| (k as u64).to_le_bytes()));
        crate::dist::hash_bytes(&bytes)
    }

    fn log_due(&self, index: usize, batches: usize) -> bool {
        (index + 1).is_multiple_of(self.cfg.log_interval) || index + 1 == batches
    }

    fn log_line(&self, w: &LogWindow) -> (String, Metric) {
        let n = w.count.max(1) as f64;
        let (cur, cur_nll) = (w.loss_sum / n, w.nll_sum / n);
        let ms = w.seconds * 1e3 / n;
        let (epoch, batch, batches, lr) = (w.epoch, w.index + 1, w.batches, self.opt.lr);
        (
            format!(
                "| epoch {epoch:3} | {batch:5}/{batches:5} batches | lr {lr:.2e} | ms/batch {ms:6.1} | tok/s {:6.0} | loss {cur:5.2} | ppl {:7.2}",
                w.tokens as f64 / w.seconds.max(1e-9),
                cur_nll.exp()
            ),
            Metric::Train {
                step: w.step,
                epoch,
                batch,
                batches,
                lr,
                ms_per_batch: ms,
                loss: cur,
                ppl: cur_nll.exp(),
            },
        )
    }

    fn validate(&self, model: &MtModel, dist: &crate::dist::Dist) -> Result<Validation> {
        let dev = &self.device;
        let loss = evaluate_loss_on(model, &self.valid, self.cfg.max_tokens, dev, dist)?;
        let greedy = self.cfg.decode_options(1);
        let src = &self.valid.pairs.src;
        let mine = translate_lines(
            &model.decoder()?,
            &self.tokenizer,
            &src[dist.shard(src.len())],
            &DecodeRequest::new(greedy),
            dev,
            |_, _| {},
        )?;
        let hyps = dist.gather_lines(mine)?;
        let metric = self.score_metric();
        let refs = &self.valid.pairs.tgt;
        let value = match metric {
            ScoreMetric::Bleu => bleu(&hyps, refs)?,
            ScoreMetric::Chrf => chrf(&hyps, refs)?,
        };
        Ok(Validation {
            loss,
            score: Some(Score { metric, value }),
        })
    }

    fn epoch_lines(&self, end: &EpochEnd) -> Vec<String> {
        let (epoch, secs, train_secs) = (end.epoch, end.seconds, end.train_seconds);
        let mut lines = vec!["-".repeat(89)];
        for (weights, v) in end.validated {
            let head = match weights {
                Weights::Sgd => {
                    format!("| end of epoch {epoch:3} | time: {secs:6.1}s (train {train_secs:.1}s)")
                }
                Weights::Average => format!(
                    "| weight average (decay {}) {:>w$}",
                    self.cfg.average_decay,
                    "",
                    w = 9usize.saturating_sub(self.cfg.average_decay.to_string().len())
                ),
            };
            let (label, value) = v
                .score
                .map_or(("BLEU", 0.0), |s| (s.metric.label(), s.value));
            lines.push(format!(
                "{head} | valid loss {:5.3} | valid ppl {:7.2} | valid {label} {value:5.2} (greedy)",
                v.loss,
                v.loss.exp(),
            ));
        }
        lines.push("-".repeat(89));
        lines
    }

    fn adam(&mut self) -> Option<&mut Adam> {
        Some(&mut self.opt)
    }

    /// The best model translates the test set with beam search.
    fn test(&mut self, t: TestRun) -> Result<(Vec<Metric>, Option<f64>)> {
        let Some(src) = &self.test_files else {
            return Ok((Vec::new(), None));
        };
        let (cfg, dev) = (&self.cfg, &self.device);
        let best = load_run(t.run, &transformer_runtime::load::Execution::on(dev))?;
        let data = EncodedSplit::encode(src.read()?, &self.tokenizer);
        let loss = evaluate_loss_on(&best.model, &data, cfg.max_tokens, dev, t.dist)?;
        let start = Instant::now();
        let mine = translate_lines(
            &best.model.decoder()?,
            &self.tokenizer,
            &data.pairs.src[t.dist.shard(data.pairs.src.len())],
            &DecodeRequest::new(cfg.decode_options(cfg.beam)),
            dev,
            |done, total| t.progress.batch(cfg.epochs + 1, done, total),
        )?;
        let hyps = t.dist.gather_lines(mine)?;
        let b = bleu(&hyps, &data.pairs.tgt)?;
        let lc = corpus_bleu(&hyps, &data.pairs.tgt, &BleuOptions::lowercased_tokens())
            .map_err(|e| Error::Usage(e.to_string()))?;
        if t.dist.writes() {
            checkpoint::write_atomic(&t.run.join("test.hyp"), (hyps.join("\n") + "\n").as_bytes())?;
        }
        t.progress.line(&"=".repeat(89));
        t.progress.line(&format!(
            "| End of training | best: {} of epoch {} | test loss {loss:5.3} | test ppl {:7.2} (per word {:.2}) | test BLEU {b:5.2} (sacreBLEU, beam {}, {:.1}s)",
            match t.state.best_weights {
                Weights::Sgd => "the trained weights",
                Weights::Average => "the weight average",
            },
            t.state.best_epoch,
            loss.exp(),
            word_perplexity(loss, &data),
            cfg.beam,
            start.elapsed().as_secs_f64()
        ));
        t.progress
            .line(&format!("| {}: {:.2}", lc.options.label(), lc.score));
        let c = match self.score_metric() {
            ScoreMetric::Chrf => {
                let c = chrf(&hyps, &data.pairs.tgt)?;
                t.progress.line(&format!(
                    "| test chrF {c:5.2} (sacreBLEU's chrF2; the score for Korean output, which \
                     the best model was chosen by)"
                ));
                Some(c)
            }
            ScoreMetric::Bleu => None,
        };
        t.progress.line(&"=".repeat(89));
        self.test = Some((loss, b));
        let record = Metric::Test {
            step: t.state.step,
            loss,
            ppl: loss.exp(),
            weights: t.state.best_weights,
            scores: crate::metrics::Scores {
                bleu: Some(b),
                chrf: c,
            },
        };
        Ok((vec![record], Some(loss)))
    }
}
