//! The label-smoothing part of a smoothed cross-entropy, fused: with the output layer
//! `z = h W^T + b` (V classes) and smoothing `eps`,
//! `(1 - eps) (lse - z_y) + eps mean_j (lse - z_j) = (lse - z_y) + eps (z_y - mean_j z_j)`,
//! so the smoothed loss is the plain one ([`super::linear_cross_entropy`]) plus
//! `eps / count * sum over counted rows n of (z_{n, y_n} - mean_j z_{n, j})`, which needs no
//! softmax: `z_y = h . W_y + b_y` and `mean_j z_j = h . mean_j W_j + mean_j b_j`.
//!
//! # Why
//! Composed of candle ops this term is an `index_select` of N weight rows, a product, two
//! reductions, a matrix-vector product and their backward passes, whose weight gradient is a
//! dense (V, C) `index_add` into zeros that lands in candle's `GradStore`. Fused, it is one
//! pass over the rows forward and one backward, and the weight's and bias's gradients go to
//! [`DirectGrads`] beside the output layer's own, so a model whose output layer writes there
//! keeps every gradient of that matrix in one place.
//!
//! # Gradients
//! With `k = g eps / count` (g the incoming gradient): `dh_n = k (W_{y_n} - mean_j W_j)` on
//! counted rows (0 on ignored ones), `dW_j = k sum_{n: y_n = j} h_n - (k / V) sum_n h_n`,
//! `db_j = k count_j - k count / V`. Sums over rows run in f64.

use super::{cpu_fwd3, fused_applies, grads3, Backward3, Forward3, Tensors3};
use super::{CpuArgs3, Grads3, Kernel3, Op3};
use crate::grads::DirectGrads;
use candle_core::{bail, CpuStorage, DType, Result, Shape, Tensor, D};

/// The inputs of [`label_smoothing_term`] and [`label_smoothing_term_reference`]: the
/// output layer's input and parameters, the targets and the smoothing.
///
/// # Shapes
/// hidden (N, C), weight (V, C), bias (V,), targets (N,) u32
#[derive(Debug, Clone, Copy)]
pub struct SmoothingInputs<'a> {
    /// The output layer's input rows `h`.
    pub hidden: &'a Tensor,
    /// The output layer's weight `W`.
    pub weight: &'a Tensor,
    /// The output layer's bias `b`.
    pub bias: &'a Tensor,
    /// Each row's target class.
    pub targets: &'a Tensor,
    /// The target of rows that do not count (padding).
    pub ignore_index: u32,
    /// The label smoothing `eps`.
    pub eps: f64,
}

/// `eps / count * sum over rows n whose target is not `ignore_index` of (z_{n, y_n} - mean_j
/// z_{n, j})`, `z = hidden W^T + b`; 0 when no row counts. Added to the output layer's
/// plain cross-entropy it gives the label-smoothed cross-entropy (module docs). With `direct`,
/// the weight's and bias's gradients go there when they are CPU f32 variables.
///
/// # Shapes
/// hidden (N, C), weight (V, C), bias (V,), targets (N,) u32 -> scalar
pub fn label_smoothing_term(
    inputs: SmoothingInputs,
    direct: Option<&DirectGrads>,
) -> Result<Tensor> {
    let (hidden, weight, bias, targets) =
        (inputs.hidden, inputs.weight, inputs.bias, inputs.targets);
    if !fused_applies(&[hidden, weight, bias]) {
        return label_smoothing_term_reference(inputs);
    }
    let (n, c) = hidden.dims2()?;
    let (v, wc) = weight.dims2()?;
    if wc != c || bias.dims() != [v] || targets.elem_count() != n {
        bail!(
            "label smoothing: hidden {:?}, weight {:?}, bias {:?}, targets {:?} do not fit",
            hidden.dims(),
            weight.dims(),
            bias.dims(),
            targets.dims()
        );
    }
    let ids = targets.flatten_all()?.to_vec1::<u32>()?;
    let mut rows = Vec::with_capacity(n);
    for &t in &ids {
        if t == inputs.ignore_index {
            rows.push(None);
        } else if (t as usize) < v {
            rows.push(Some(t as usize));
        } else {
            bail!("label smoothing: target {t} outside 0..{v}");
        }
    }
    let op = SmoothingTerm {
        rows,
        eps: inputs.eps,
        direct: direct.cloned(),
    };
    hidden
        .contiguous()?
        .apply_op3(&weight.contiguous()?, &bias.contiguous()?, Op3(op))
}

/// [`label_smoothing_term`] composed of candle ops (the plain version the fused op is
/// checked against, and the path for other devices and dtypes).
pub fn label_smoothing_term_reference(inputs: SmoothingInputs) -> Result<Tensor> {
    let SmoothingInputs {
        hidden,
        weight,
        bias,
        targets,
        ignore_index,
        eps,
    } = inputs;
    let targets = targets.flatten_all()?;
    let keep = targets.ne(ignore_index)?;
    let count = keep.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
    let safe = keep.where_cond(&targets, &targets.zeros_like()?)?;
    // (N, C) . (N, C) -> (N,): the logit of each target token.
    let z_y = ((hidden * weight.index_select(&safe, 0)?)?.sum(D::Minus1)?
        + bias.index_select(&safe, 0)?)?;
    // (N, C) @ (C, 1) -> (N,): the mean logit over the vocabulary.
    let w_mean = weight.mean(0)?.unsqueeze(1)?;
    let z_mean = hidden
        .matmul(&w_mean)?
        .squeeze(1)?
        .broadcast_add(&bias.mean_all()?)?;
    let gap = ((z_y - z_mean)? * keep.to_dtype(hidden.dtype())?)?;
    gap.sum_all()? * (eps / count.max(1.0))
}

struct SmoothingTerm {
    /// Each row's target, `None` where it is ignored.
    rows: Vec<Option<usize>>,
    eps: f64,
    direct: Option<DirectGrads>,
}

impl SmoothingTerm {
    fn count(&self) -> usize {
        self.rows.iter().filter(|r| r.is_some()).count()
    }
}

impl Forward3 for SmoothingTerm {
    fn run<T: super::float::Float>(&self, h: &[T], w: &[T], b: &[T]) -> Vec<T> {
        vec![T::from_f64(forward::<T>(self, h, w, b))]
    }
}

impl Backward3 for SmoothingTerm {
    /// The gradients of the inputs as tensors of their shapes.
    fn grads<T: super::float::Float>(
        &self,
        [hidden, weight, bias]: [&Tensor; 3],
        grad: &Tensor,
    ) -> Result<Tensors3> {
        let g = grad.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let (h, w, b) = (
            hidden.flatten_all()?.to_vec1::<T>()?,
            weight.flatten_all()?.to_vec1::<T>()?,
            bias.to_vec1::<T>()?,
        );
        let (dh, dw, db) = backward(self, g, &h, &w, &b);
        let dev = hidden.device();
        Ok((
            Tensor::from_vec(dh, hidden.shape(), dev)?,
            Tensor::from_vec(dw, weight.shape(), dev)?,
            Tensor::from_vec(db, bias.shape(), dev)?,
        ))
    }
}

/// `mean_j W_j` (C) and `mean_j b_j`, summed in f64.
fn means<T: super::float::Float>(w: &[T], b: &[T], c: usize) -> (Vec<f64>, f64) {
    let v = b.len();
    let mut wbar = vec![0f64; c];
    for row in w.chunks_exact(c) {
        for (s, &x) in wbar.iter_mut().zip(row) {
            *s += x.to_f64();
        }
    }
    wbar.iter_mut().for_each(|s| *s /= v as f64);
    let bbar = b.iter().map(|x| x.to_f64()).sum::<f64>() / v as f64;
    (wbar, bbar)
}

fn forward<T: super::float::Float>(op: &SmoothingTerm, h: &[T], w: &[T], b: &[T]) -> f64 {
    let c = w.len() / b.len().max(1);
    let (wbar, bbar) = means(w, b, c);
    let mut acc = 0f64;
    for (hr, row) in h.chunks_exact(c).zip(&op.rows) {
        let Some(y) = *row else { continue };
        let wy = &w[y * c..(y + 1) * c];
        let mut gap = b[y].to_f64() - bbar;
        for ((&x, &wv), &m) in hr.iter().zip(wy).zip(&wbar) {
            gap += x.to_f64() * (wv.to_f64() - m);
        }
        acc += gap;
    }
    op.eps / (op.count().max(1) as f64) * acc
}

/// `(dh, dW, db)` for incoming gradient `g` (see the module docs).
fn backward<T: super::float::Float>(
    op: &SmoothingTerm,
    g: f64,
    h: &[T],
    w: &[T],
    b: &[T],
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (v, n) = (b.len(), op.rows.len());
    let c = w.len() / v.max(1);
    let count = op.count();
    let k = g * op.eps / (count.max(1) as f64);
    let (wbar, _) = means(w, b, c);
    let mut dh = vec![T::ZERO; n * c];
    let mut hsum = vec![0f64; c];
    let mut per_row = vec![0f64; v * c];
    let mut per_bias = vec![0f64; v];
    for ((hr, dhr), row) in h.chunks_exact(c).zip(dh.chunks_exact_mut(c)).zip(&op.rows) {
        let Some(y) = *row else { continue };
        let wy = &w[y * c..(y + 1) * c];
        for ((d, &wv), &m) in dhr.iter_mut().zip(wy).zip(&wbar) {
            *d = T::from_f64(k * (wv.to_f64() - m));
        }
        for ((s, r), &x) in hsum
            .iter_mut()
            .zip(&mut per_row[y * c..(y + 1) * c])
            .zip(hr)
        {
            *s += x.to_f64();
            *r += x.to_f64();
        }
        per_bias[y] += 1.0;
    }
    let spread: Vec<f64> = hsum.iter().map(|s| k * s / v as f64).collect();
    let dw = per_row
        .chunks_exact(c)
        .flat_map(|r| r.iter().zip(&spread).map(|(&x, &s)| T::from_f64(k * x - s)))
        .collect();
    let base = k * count as f64 / v as f64;
    let db = per_bias
        .iter()
        .map(|&m| T::from_f64(k * m - base))
        .collect();
    (dh, dw, db)
}

impl Kernel3 for SmoothingTerm {
    const NAME: &'static str = "kernels-label-smoothing-term";

    fn forward(&self, args: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        Ok((cpu_fwd3(self, Self::NAME, args)?, Shape::from(())))
    }

    fn backward(
        &self,
        inputs @ [hidden, weight, bias]: [&Tensor; 3],
        _out: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        let (dh, dw, db) = grads3(self, Self::NAME, inputs, grad)?;
        let direct = self.direct.as_ref().filter(|_| {
            hidden.dtype() == DType::F32
                && DirectGrads::accepts(weight)
                && DirectGrads::accepts(bias)
        });
        match direct {
            Some(direct) => {
                direct.put_dense(weight, dw.flatten_all()?.to_vec1::<f32>()?);
                direct.put_dense(bias, db.to_vec1::<f32>()?);
                Ok((Some(dh), None, None))
            }
            None => Ok((Some(dh), Some(dw), Some(db))),
        }
    }
}
