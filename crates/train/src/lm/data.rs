//! The batchified splits, the training step and evaluation.

use super::*;
use crate::clip::clip_coefficient;
use crate::error::{Error, Result};
use crate::grads::Gradients;
use crate::optim::Sgd;
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;
use transformer_model::Backprop;
use transformer_model::{DirectGrads, Mode, Rng, TransformerLm};
use transformer_text::batch::{batchify, Batch, Batched};
use transformer_text::corpus::{build_vocab_with, read_split_with, Split};
use transformer_text::Vocab;

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

    /// A hash of the training split's token ids, which processes compare before training
    /// together ([`crate::runner::Task::data_hash`]).
    pub fn train_hash(&self) -> u64 {
        let bytes: Vec<u8> = self
            .train
            .data
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        crate::dist::hash_bytes(&bytes)
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
/// `GradStore` ([`TransformerLm::loss`] with `Backprop::Direct`, `transformer_model::grads`): the output
/// layer's are written once into buffers kept from step to step, the embedding's are its
/// used rows, each encoder layer is one fused op, and the norm and the update read them
/// where they are ([`Gradients`]). The same result, to rounding, as the model's composed
/// forward pass with [`Gradients::backward`] + [`crate::clip::clip_coefficient`] +
/// [`Sgd::step`] (`tests/lm_train.rs` compares them).
pub struct LmStep {
    /// Its `lr` is the learning rate of the next step.
    pub opt: Sgd,
    pub(super) clip: f64,
    pub(super) direct: DirectGrads,
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

    /// The loss of a window and its gradients, with dropout from `rng`; the output layer's
    /// products in the model's training precision (its builder's).
    ///
    /// # Shapes
    /// input (B, T) u32, target (B * T,) u32
    pub fn gradients(
        &self,
        model: &TransformerLm,
        input: &Tensor,
        target: &Tensor,
        rng: &Rng,
    ) -> Result<(Gradients, f64)> {
        let loss = model.loss(
            input,
            target,
            Mode::Train(rng),
            Backprop::Direct(&self.direct),
        )?;
        let grads = Gradients::from_backward(&loss, self.opt.vars(), &self.direct)?;
        Ok((grads, loss.to_dtype(DType::F64)?.to_scalar::<f64>()?))
    }

    /// SGD with `grads` at the current learning rate, scaled by PyTorch's clipping
    /// coefficient. Dropping `grads` afterwards empties the direct buffers for the next step.
    pub fn apply(&mut self, grads: &Gradients) -> Result<()> {
        let (_, coef) = clip_coefficient(grads, self.clip)?;
        self.opt.step(grads, coef)?;
        Ok(())
    }

    /// One step on a window ([`Self::gradients`], then [`Self::apply`]); returns its loss.
    /// `rng` draws the dropout masks.
    ///
    /// # Shapes
    /// input (B, T) u32, target (B * T,) u32
    pub fn run(
        &mut self,
        model: &TransformerLm,
        input: &Tensor,
        target: &Tensor,
        rng: &Rng,
    ) -> Result<f64> {
        let (grads, loss) = self.gradients(model, input, target, rng)?;
        self.apply(&grads)?;
        Ok(loss)
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
        let loss = model.loss(&input, &target, Mode::Eval, Backprop::Off)?;
        total += w.seq_len as f64 * loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    }
    let mut sum = [total];
    dist.sum_f64(&mut sum);
    Ok(sum[0] / (data.rows - 1) as f64)
}
