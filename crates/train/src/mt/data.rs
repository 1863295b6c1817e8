//! Encoded splits, the run's files, and the teacher-forced loss, evaluation and step.

use super::*;
use crate::clip::clip_coefficient;
use crate::error::Result;
use crate::grads::Gradients;
use crate::optim::Adam;
use crate::runner::RunState;
use candle_core::{DType, Device, Tensor};
use transformer_model::Backprop;
use transformer_model::{DirectGrads, Mode, Rng};
use transformer_text::bucket::{pair_batches, PairBatch};
use transformer_text::parallel::Pairs;
use transformer_text::subword::{Subword, TextTokenizer};

/// A split's sentences and their token ids (without `<bos>` / `<eos>`).
#[derive(Debug, Clone)]
pub struct EncodedSplit {
    /// The sentence pairs as text.
    pub pairs: Pairs,
    /// The source sentences' token ids, one list per sentence.
    pub src: Vec<Vec<u32>>,
    /// The target sentences' token ids, one list per sentence.
    pub tgt: Vec<Vec<u32>>,
    /// The tokenizer's special ids (a published model's own).
    pub specials: transformer_text::Specials,
}

impl EncodedSplit {
    /// Tokenizes both sides of `pairs` with `tok`.
    pub fn encode(pairs: Pairs, tok: &Subword) -> Self {
        let src = pairs.src.iter().map(|s| tok.encode(s)).collect();
        let tgt = pairs.tgt.iter().map(|s| tok.encode_target(s)).collect();
        Self {
            pairs,
            src,
            tgt,
            specials: tok.specials(),
        }
    }

    /// A hash of the token ids and of `keep` (the pairs that train), which processes
    /// compare before training together ([`crate::runner::Task::data_hash`]).
    pub fn hash_with(&self, keep: &[usize]) -> u64 {
        let mut bytes = Vec::new();
        for (s, t) in self.src.iter().zip(&self.tgt) {
            bytes.extend(s.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xff);
            bytes.extend(t.iter().flat_map(|x| x.to_le_bytes()));
            bytes.push(0xfe);
        }
        bytes.extend(keep.iter().flat_map(|&k| (k as u64).to_le_bytes()));
        crate::dist::hash_bytes(&bytes)
    }

    /// The pairs `keep` in length-bucketed batches of at most `max_tokens` padded tokens a
    /// side, in the order `seed` shuffles them into (a training epoch's batches).
    pub fn batches(&self, keep: &[usize], max_tokens: usize, seed: u64) -> Vec<PairBatch> {
        pair_batches(&self.src, &self.tgt, keep, max_tokens, self.specials, seed)
    }

    /// The first `n` pairs.
    pub fn truncate(&mut self, n: usize) {
        self.pairs.src.truncate(n);
        self.pairs.tgt.truncate(n);
        self.src.truncate(n);
        self.tgt.truncate(n);
    }
}

pub use crate::runner::{best_path, checkpoint_path, config_path, metrics_path};

/// Where a run stands; saved in every checkpoint (the runner's, for every task).
pub type MtState = RunState;

/// How to run [`train`].
pub type MtTrainOptions = crate::runner::RunOptions<MtTrainConfig>;

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
pub struct MtSummary {
    /// Where the run stands at the end of this invocation.
    pub state: MtState,
    /// Test loss and sacreBLEU of the best model, when a test set was given.
    pub test: Option<(f64, f64)>,
    /// The loss of every step taken in this invocation.
    pub step_losses: Vec<f64>,
}

/// Tensors of a batch: src (B, S), tgt_in (B, T), tgt_out (B, T).
pub fn batch_tensors(b: &PairBatch, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    Ok((
        Tensor::from_vec(b.src.clone(), (b.rows, b.src_len), dev)?,
        Tensor::from_vec(b.tgt_in.clone(), (b.rows, b.tgt_len), dev)?,
        Tensor::from_vec(b.tgt_out.clone(), (b.rows, b.tgt_len), dev)?,
    ))
}

/// Mean cross-entropy per target token (no smoothing) over a split, teacher-forced.
pub fn evaluate_loss(
    model: &MtModel,
    data: &EncodedSplit,
    max_tokens: usize,
    dev: &Device,
) -> Result<f64> {
    evaluate_loss_on(model, data, max_tokens, dev, &crate::dist::Dist::single())
}

/// [`evaluate_loss`] with the batches split across the processes of `dist` (each its
/// [`crate::dist::Dist::shard`]) and the sums added: every process gets the loss.
pub fn evaluate_loss_on(
    model: &MtModel,
    data: &EncodedSplit,
    max_tokens: usize,
    dev: &Device,
    dist: &crate::dist::Dist,
) -> Result<f64> {
    let sp = data.specials;
    let all: Vec<usize> = (0..data.src.len()).collect();
    // Sentences longer than the model takes are scored on their first positions (the length
    // rule of `translate`).
    let max = max_source_tokens(model);
    let (src, tgt) = (fit(&data.src, max), fit(&data.tgt, max));
    let batches = pair_batches(&src, &tgt, &all, max_tokens, sp, 0);
    let (mut total, mut tokens) = (0.0, 0usize);
    for b in &batches[dist.shard(batches.len())] {
        let (src, tgt_in, tgt_out) = batch_tensors(b, dev)?;
        let l = model.loss(
            [&src, &tgt_in, &tgt_out],
            (sp.pad, 0.0),
            Mode::Eval,
            Backprop::Graph,
        )?;
        total += l.nll.to_dtype(DType::F64)?.to_scalar::<f64>()? * b.tgt_tokens as f64;
        tokens += b.tgt_tokens;
    }
    let mut sums = [total, tokens as f64];
    dist.sum_f64(&mut sums);
    Ok(sums[0] / sums[1].max(1.0))
}

/// Perplexity per word rather than per subword token, comparable across tokenizations:
/// `exp(total loss / (words + sentences))`, where words are the references' 13a tokens
/// (punctuation split off, as word-level tutorials tokenize) and each sentence adds its end
/// token, as word-level vocabularies count `<eos>`.
pub fn word_perplexity(loss_per_token: f64, data: &EncodedSplit) -> f64 {
    let subwords: usize = data.tgt.iter().map(|t| t.len() + 1).sum();
    let words: usize = data
        .pairs
        .tgt
        .iter()
        .map(|l| {
            transformer_text::score::tokenize_13a(l)
                .split_whitespace()
                .count()
                + 1
        })
        .sum();
    (loss_per_token * subwords as f64 / words.max(1) as f64).exp()
}

/// The loss of one batch (`[src, tgt_in, tgt_out]`, padded with `pad`) and its gradients:
/// the label-smoothed loss per target token with dropout from `rng`, differentiated. Returns
/// the gradients, the loss and the plain negative log-likelihood per target token. The
/// products run in the model's training precision (its builder's).
///
/// `direct` takes the gradients that fused ops write outside candle's graph
/// (`MtModel::loss` with `Backprop::Direct`); [`Gradients::from_backward`] joins them with the
/// autograd's, and dropping the gradients empties `direct` for the next batch.
#[allow(clippy::too_many_arguments)]
pub fn batch_gradients(
    model: &MtModel,
    vars: &[candle_core::Var],
    direct: &DirectGrads,
    [src, tgt_in, tgt_out]: [&Tensor; 3],
    pad: u32,
    label_smoothing: f64,
    rng: &Rng,
) -> Result<(Gradients, f64, f64)> {
    let l = model.loss(
        [src, tgt_in, tgt_out],
        (pad, label_smoothing),
        Mode::Train(rng),
        Backprop::Direct(direct),
    )?;
    let grads = Gradients::from_backward(&l.loss, vars, direct)?;
    Ok((
        grads,
        l.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        l.nll.to_dtype(DType::F64)?.to_scalar::<f64>()?,
    ))
}

/// One optimizer step with `grads`: PyTorch's clipping coefficient for norm `clip`, then
/// `opt` at its current learning rate, scaled by it.
pub fn apply_gradients(opt: &mut Adam, grads: &Gradients, clip: f64) -> Result<()> {
    let (_, coef) = clip_coefficient(grads, clip)?;
    opt.step(grads, coef)?;
    Ok(())
}

/// One training step on one batch: [`batch_gradients`], then [`apply_gradients`]. Returns
/// the loss and the plain negative log-likelihood per target token. The training loop (the
/// runner composing the task's `backward` and `update`, which are these two) and
/// `transformer bench mt` take exactly this step.
#[allow(clippy::too_many_arguments)]
pub fn train_step(
    model: &MtModel,
    vars: &[candle_core::Var],
    opt: &mut Adam,
    direct: &DirectGrads,
    clip: f64,
    batch: [&Tensor; 3],
    pad: u32,
    label_smoothing: f64,
    rng: &Rng,
) -> Result<(f64, f64)> {
    let (grads, loss, nll) =
        batch_gradients(model, vars, direct, batch, pad, label_smoothing, rng)?;
    apply_gradients(opt, &grads, clip)?;
    Ok((loss, nll))
}
