//! Metrics as JSON lines, and a plot of training and validation loss as SVG.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Which weights a validation or test figure was computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    /// The SGD iterate: the tutorial's read-out.
    #[default]
    Sgd,
    /// The moving average of the weights ([`crate::average`]).
    Average,
}

impl Weights {
    /// The weights in words, for log lines ("the SGD weights", "the weight average").
    pub fn describe(self) -> &'static str {
        match self {
            Weights::Sgd => "the SGD weights",
            Weights::Average => "the weight average",
        }
    }
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Metric {
    /// Mean training loss over the last `log_interval` batches.
    Train {
        /// Optimizer steps taken.
        step: usize,
        /// The epoch (1-based).
        epoch: usize,
        /// The batch within the epoch, as the log line numbers it.
        batch: usize,
        /// The epoch's batch count, as the log line shows it.
        batches: usize,
        /// The learning rate of the last step.
        lr: f64,
        /// Mean wall-clock milliseconds per batch over the window.
        ms_per_batch: f64,
        /// Mean training loss (the one differentiated; label-smoothed in translation), nats.
        loss: f64,
        /// Perplexity: exp of the mean plain cross-entropy.
        ppl: f64,
    },
    /// End-of-epoch validation.
    Valid {
        /// Optimizer steps taken.
        step: usize,
        /// The epoch just finished (1-based).
        epoch: usize,
        /// Mean cross-entropy per target token on the validation set, nats.
        loss: f64,
        /// Perplexity, `exp(loss)`.
        ppl: f64,
        /// Wall-clock seconds of the epoch, training and validation.
        epoch_seconds: f64,
        /// Absent in files written before weight averaging existed: the SGD weights.
        #[serde(default)]
        weights: Weights,
        /// Translation: the validation set's scores (chrF into Korean, the figure the best
        /// model is chosen by there).
        #[serde(flatten)]
        scores: Scores,
    },
    /// Test at the end of training: of the best model by validation, and (when weights are
    /// averaged and the average won) of the best SGD weights too.
    Test {
        /// Optimizer steps taken.
        step: usize,
        /// Mean cross-entropy per target token on the test set, nats.
        loss: f64,
        /// Perplexity, `exp(loss)`.
        ppl: f64,
        /// Which weights were tested.
        #[serde(default)]
        weights: Weights,
        /// Translation: the test set's scores.
        #[serde(flatten)]
        scores: Scores,
    },
}

/// A translation record's quality scores (none for the language model): the fields `bleu`
/// and `chrf` of a `valid` or `test` line, each present when measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Scores {
    /// Corpus BLEU (sacreBLEU's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bleu: Option<f64>,
    /// Corpus chrF (sacreBLEU's default): translation into Korean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrf: Option<f64>,
}

impl Scores {
    /// The record's fields of a validation's score (`None`: no score).
    pub fn of(score: Option<Score>) -> Self {
        Self {
            bleu: Score::of(score, ScoreMetric::Bleu),
            chrf: Score::of(score, ScoreMetric::Chrf),
        }
    }
}

/// A task's quality score of a validation, higher is better: what the records call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreMetric {
    /// Corpus BLEU (sacreBLEU's default tokenization, 13a).
    Bleu,
    /// Corpus chrF (sacreBLEU's default: character 6-grams, beta 2).
    Chrf,
}

impl ScoreMetric {
    /// The name in records and checkpoints (`bleu`, `chrf`).
    pub fn key(self) -> &'static str {
        match self {
            ScoreMetric::Bleu => "bleu",
            ScoreMetric::Chrf => "chrf",
        }
    }

    /// The name in log lines (`BLEU`, `chrF`).
    pub fn label(self) -> &'static str {
        match self {
            ScoreMetric::Bleu => "BLEU",
            ScoreMetric::Chrf => "chrF",
        }
    }
}

/// A score of one of the [`ScoreMetric`]s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Score {
    /// Which score.
    pub metric: ScoreMetric,
    /// Its value (0-100).
    pub value: f64,
}

impl Score {
    /// The value when it is `metric`'s (for the record's field of that name).
    pub fn of(score: Option<Score>, metric: ScoreMetric) -> Option<f64> {
        score.filter(|s| s.metric == metric).map(|s| s.value)
    }
}

impl Metric {
    /// The optimizer step the record was taken at.
    pub fn step(&self) -> usize {
        match self {
            Metric::Train { step, .. } | Metric::Valid { step, .. } | Metric::Test { step, .. } => {
                *step
            }
        }
    }
}

/// Appends `m` as one JSON line to the file at `path` (created if missing).
pub fn append(path: &Path, m: &Metric) -> Result<()> {
    let io = Error::io(path);
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    writeln!(
        f,
        "{}",
        serde_json::to_string(m).expect("metrics serialize")
    )
    .map_err(io)
}

/// Reads a metrics file, one record per line; a missing file is no records.
pub fn read(path: &Path) -> Result<Vec<Metric>> {
    let text = read_text(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| Error::Config {
                path: path.to_path_buf(),
                msg: format!("line {}: {e}", i + 1),
            })
        })
        .collect()
}

/// The records (non-empty lines) of a metrics file; a missing file has none.
pub fn count(path: &Path) -> Result<usize> {
    Ok(read_text(path)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count())
}

/// The text of a metrics file; a missing file (a run that has logged nothing yet) reads as
/// empty.
fn read_text(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Keeps only the first `records` records of a metrics file (what a checkpoint knew of), so
/// that a resumed run writes every later record once. Lines are kept byte for byte.
pub fn truncate_to(path: &Path, records: usize) -> Result<()> {
    let text = read_text(path)?;
    let mut kept = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()).take(records) {
        kept.push_str(line);
        kept.push('\n');
    }
    crate::checkpoint::write_atomic(path, kept.as_bytes())
}

/// Keeps only the metrics up to `step` (what a resumed run has not yet redone). The kept
/// lines are written back as they were, so their numbers stay exact to the last digit (a
/// parse and re-serialisation of a float can move it by an ulp).
pub fn truncate_after(path: &Path, step: usize) -> Result<()> {
    let text = read_text(path)?;
    let mut kept = String::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let m: Metric = serde_json::from_str(line).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            msg: format!("line {}: {e}", i + 1),
        })?;
        if m.step() <= step {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    crate::checkpoint::write_atomic(path, kept.as_bytes())
}

/// Writes an SVG line chart of training loss (per log interval) and validation loss (per
/// epoch, of the SGD weights and, where there is one, of the weight average) against the step. Hand-written: two polylines and axes do not justify a plotting
/// crate's build time on this project's 2-core machines.
pub fn plot_svg(metrics: &[Metric], path: &Path) -> Result<()> {
    let train: Vec<(f64, f64)> = metrics
        .iter()
        .filter_map(|m| match m {
            Metric::Train { step, loss, .. } => Some((*step as f64, *loss)),
            _ => None,
        })
        .collect();
    let valid_of = |which: Weights| -> Vec<(f64, f64)> {
        metrics
            .iter()
            .filter_map(|m| match m {
                Metric::Valid {
                    step,
                    loss,
                    weights,
                    ..
                } if *weights == which => Some((*step as f64, *loss)),
                _ => None,
            })
            .collect()
    };
    let (valid, valid_avg) = (valid_of(Weights::Sgd), valid_of(Weights::Average));
    let all = train.iter().chain(&valid).chain(&valid_avg);
    let (mut x1, mut y0, mut y1) = (1f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in all {
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !y0.is_finite() {
        (y0, y1) = (0.0, 1.0);
    }
    if y1 - y0 < 1e-9 {
        y1 = y0 + 1.0;
    }
    let (w, h, l, r, t, b) = (720.0, 420.0, 60.0, 20.0, 30.0, 45.0);
    let sx = |x: f64| l + x / x1 * (w - l - r);
    let sy = |y: f64| t + (y1 - y) / (y1 - y0) * (h - t - b);
    let line = |pts: &[(f64, f64)]| {
        pts.iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Loss (cross-entropy, nats per token)</text>\n\
         <line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">training step</text>\n",
        w / 2.0, h - b, w - r, h - b, h - b, w / 2.0, h - 8.0
    );
    for i in 0..=4 {
        let y = y0 + (y1 - y0) * i as f64 / 4.0;
        s += &format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{y:.2}</text>\n",
            l - 6.0,
            sy(y) + 4.0
        );
        let x = x1 * i as f64 / 4.0;
        s += &format!(
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{x:.0}</text>\n",
            sx(x),
            h - b + 16.0
        );
    }
    s += &format!(
        "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        line(&train)
    );
    let mut legend = vec![("#1f77b4", "training")];
    for (pts, colour, name) in [
        (&valid, "#d62728", "validation"),
        (&valid_avg, "#2ca02c", "validation, weight average"),
    ] {
        if pts.is_empty() {
            continue;
        }
        legend.push((colour, name));
        s += &format!(
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\n",
            line(pts)
        );
        for &(x, y) in pts {
            s += &format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"{colour}\"/>\n",
                sx(x),
                sy(y)
            );
        }
    }
    for (i, (colour, name)) in legend.iter().enumerate() {
        s += &format!(
            "<text x=\"{}\" y=\"{}\" fill=\"{colour}\">{name}</text>\n",
            w - r - 180.0,
            t + 15.0 + 16.0 * i as f64
        );
    }
    s += "</svg>\n";
    crate::checkpoint::write_atomic(path, s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record's scores are the line's own `bleu` and `chrf` fields, written only when
    /// measured, and lines written before either existed still read.
    #[test]
    fn scores_are_fields_of_the_record_line() {
        let valid = Metric::Valid {
            step: 7,
            epoch: 1,
            loss: 2.5,
            ppl: 12.25,
            epoch_seconds: 3.0,
            weights: Weights::Average,
            scores: Scores {
                bleu: Some(31.5),
                chrf: None,
            },
        };
        let line = serde_json::to_string(&valid).unwrap();
        assert_eq!(
            line,
            "{\"kind\":\"valid\",\"step\":7,\"epoch\":1,\"loss\":2.5,\"ppl\":12.25,\
             \"epoch_seconds\":3.0,\"weights\":\"average\",\"bleu\":31.5}"
        );
        assert_eq!(serde_json::from_str::<Metric>(&line).unwrap(), valid);
        let old: Metric = serde_json::from_str(
            "{\"kind\":\"test\",\"step\":3,\"loss\":1.0,\"ppl\":2.718,\"chrf\":40}",
        )
        .unwrap();
        assert_eq!(
            old,
            Metric::Test {
                step: 3,
                loss: 1.0,
                ppl: 2.718,
                weights: Weights::Sgd,
                scores: Scores {
                    bleu: None,
                    chrf: Some(40.0),
                },
            }
        );
        let lm = Metric::Test {
            step: 3,
            loss: 1.0,
            ppl: 2.0,
            weights: Weights::Sgd,
            scores: Scores::default(),
        };
        let line = serde_json::to_string(&lm).unwrap();
        assert!(!line.contains("bleu") && !line.contains("chrf"), "{line}");
    }
}
