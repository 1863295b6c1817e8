//! Decoding a split to score it: validation (greedy) and the test (beam search) translate
//! each process's share and score all of it, as `mt translate` and `mt eval` would.

use super::*;
use crate::dist::Dist;
use crate::error::{Error, Result};
use crate::metrics::{Score, ScoreMetric, Scores};
use candle_core::Device;
use transformer_text::score::bleu::{corpus_bleu, BleuOptions, BleuScore};
use transformer_text::subword::Subword;

/// The score validation chooses the best model by: chrF where the output is Korean
/// (BLEU's 13a words are Korean's space-separated eojeol, each a stem with its particles,
/// so BLEU there measures the tokenization as much as the translation), BLEU elsewhere.
pub fn score_metric(cfg: &MtTrainConfig) -> ScoreMetric {
    match cfg.language_pair() {
        Some((_, target)) if target == "ko" => ScoreMetric::Chrf,
        _ => ScoreMetric::Bleu,
    }
}

/// Translates `src` with `model` as `request` asks, each process of `dist` its share
/// ([`Dist::shard`], reported to `on_batch`); every process gets every translation, in order.
pub fn translate_shared(
    model: &MtModel,
    tok: &Subword,
    src: &[String],
    request: &DecodeRequest,
    (dev, dist): (&Device, &Dist),
    on_batch: impl FnMut(usize, usize),
) -> Result<Vec<String>> {
    let share = &src[dist.shard(src.len())];
    let mine = translate_lines(&model.decoder()?, tok, share, request, dev, on_batch)?;
    dist.gather_lines(mine)
}

/// The corpus score `metric` (sacreBLEU's default BLEU or chrF) of `hyps` against `refs`.
pub fn score(metric: ScoreMetric, hyps: &[String], refs: &[String]) -> Result<Score> {
    let value = match metric {
        ScoreMetric::Bleu => bleu(hyps, refs)?,
        ScoreMetric::Chrf => chrf(hyps, refs)?,
    };
    Ok(Score { metric, value })
}

/// The test set's scores: sacreBLEU's BLEU, beside it the BLEU of lowercased 13a tokens
/// (the published word-level baselines' figure), and chrF where the best model was chosen
/// by it (Korean output).
pub struct TestScores {
    /// sacreBLEU's default corpus BLEU.
    pub bleu: f64,
    /// Corpus BLEU of lowercased 13a tokens.
    pub lowercased: BleuScore,
    /// sacreBLEU's default chrF, when `metric` was chrF.
    pub chrf: Option<f64>,
}

impl TestScores {
    /// The scores of `hyps` against `refs`, for a run that chose its best model by `metric`.
    pub fn of(metric: ScoreMetric, hyps: &[String], refs: &[String]) -> Result<Self> {
        Ok(Self {
            bleu: bleu(hyps, refs)?,
            lowercased: corpus_bleu(hyps, refs, &BleuOptions::lowercased_tokens())
                .map_err(|e| Error::Usage(e.to_string()))?,
            chrf: match metric {
                ScoreMetric::Chrf => Some(chrf(hyps, refs)?),
                ScoreMetric::Bleu => None,
            },
        })
    }

    /// The log lines after the test's own: the lowercased BLEU, and chrF where it chose.
    pub fn lines(&self) -> Vec<String> {
        let lc = &self.lowercased;
        let mut lines = vec![format!("| {}: {:.2}", lc.options.label(), lc.score)];
        lines.extend(self.chrf.map(|c| {
            format!(
                "| test chrF {c:5.2} (sacreBLEU's chrF2; the score for Korean output, which \
                 the best model was chosen by)"
            )
        }));
        lines
    }

    /// The scores as the test's record keeps them.
    pub fn record(&self) -> Scores {
        Scores {
            bleu: Some(self.bleu),
            chrf: self.chrf,
        }
    }
}
