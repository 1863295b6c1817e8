//! Scaled dot-product attention (section 3.2.1, equation 1):
//! `Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V`.

use crate::dropout::{Dropout, Mode};
use crate::mask::Mask;
pub use crate::ops::Qkv;
use crate::Result;
use candle_core::Tensor;

/// Softmax over the last dimension, with a backward pass: the fused kernel on CPU f32/f64,
/// the composition of primitives elsewhere (max-subtracted, the max detached).
pub use crate::ops::softmax_last_dim;

/// What [`scaled_dot_product_attention`] and [`attention_output`] attend with: queries,
/// keys and values split into heads, the mask, the attention dropout and the mode it runs in.
///
/// # Shapes
/// - q: (B, H, T, D), k: (B, H, S, D), v: (B, H, S, Dv)
/// - mask: broadcastable to (B, H, T, S), 1 = may attend
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs<'a> {
    /// Queries, keys and values.
    pub qkv: Qkv<'a>,
    /// Which keys each query may attend to (all, without one).
    pub mask: Option<&'a Mask>,
    /// Dropout on the attention weights.
    pub dropout: Dropout,
    /// Training (dropout drawn) or evaluation.
    pub mode: Mode<'a>,
}

/// Attention of queries over keys and values; returns `(output, weights)`.
///
/// `weights` are the softmax probabilities before attention dropout (what a person wants to
/// see; identical in evaluation). Where a query's every key is masked, its weights and output
/// are zeros, not NaN. Queries are scaled by `1/sqrt(D)` before the product, as PyTorch does.
///
/// # Shapes
/// - q: (B, H, T, D), k: (B, H, S, D), v: (B, H, S, Dv)
/// - mask: broadcastable to (B, H, T, S), 1 = may attend
/// - -> output (B, H, T, Dv), weights (B, H, T, S)
pub fn scaled_dot_product_attention(inputs: AttentionInputs) -> Result<(Tensor, Tensor)> {
    let (_, _, _, _, d, _) = inputs.qkv.dims()?;
    let Qkv { q, k, v } = inputs.qkv;
    let (mask, dropout, mode) = (inputs.mask, inputs.dropout, inputs.mode);
    let q = (q * (1.0 / (d as f64).sqrt()))?;
    // (B, H, T, D) @ (B, H, D, S) -> (B, H, T, S)
    let scores = crate::ops::matmul(&q, &k.transpose(2, 3)?)?;
    let weights = match mask {
        None => softmax_last_dim(&scores)?,
        Some(mask) => {
            let scores = scores.broadcast_add(&mask.additive(scores.dtype())?)?;
            let weights = softmax_last_dim(&scores)?;
            if mask.may_mask_whole_rows() {
                // Multiplying by the keep-mask zeroes rows whose keys are all masked (their
                // softmax would otherwise be uniform); elsewhere masked weights are already 0.
                weights.broadcast_mul(&mask.keep().to_dtype(scores.dtype())?)?
            } else {
                weights
            }
        }
    };
    let dropped = dropout.forward(&weights, mode)?;
    // (B, H, T, S) @ (B, H, S, Dv) -> (B, H, T, Dv)
    let out = crate::ops::matmul(&dropped, v)?;
    Ok((out, weights))
}

/// The output of [`scaled_dot_product_attention`] without its weights, as one fused op with a
/// hand-written backward on CPU f32/f64 ([`crate::ops::attention`]: 2x the composed op's
/// forward + backward at the tutorial's sizes, because nothing of the (B, H, T, S) weights is
/// kept). Same masking (rows with no key get zeros) and the same dropout mask, drawn from the
/// same RNG stream. On a GPU the softmax with its scale, mask and dropout is one fused kernel
/// between cuBLAS's two products ([`crate::ops::attention_gpu`]).
///
/// # Shapes
/// as [`scaled_dot_product_attention`] -> output (B, H, T, Dv)
pub fn attention_output(inputs: AttentionInputs) -> Result<Tensor> {
    let (Qkv { q, k, v }, mask) = (inputs.qkv, inputs.mask);
    let (dropout, mode) = (inputs.dropout, inputs.mode);
    let (b, h, t, d) = q.dims4()?;
    let s = k.dim(2)?;
    if crate::ops::gpu_fused(&[q, k, v]) {
        // On the GPU: the scale, mask, softmax and dropout as one fused kernel each way.
        let keep = mask.map(|m| m.keep());
        let stream = dropout.stream(mode);
        let scale = 1.0 / (d as f64).sqrt();
        if let Some(out) = crate::ops::attention_gpu(q, k, v, keep, stream, scale)? {
            return Ok(out);
        }
    }
    let drop = dropout.multiplier((b, h, t, s), q.dtype(), q.device(), mode)?;
    crate::ops::attention(crate::ops::AttentionInputs {
        qkv: inputs.qkv,
        keep: mask.map(|m| m.keep()),
        dropout: drop.as_ref(),
        scale: 1.0 / (d as f64).sqrt(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, D};

    #[test]
    fn fully_masked_rows_are_zero_not_nan() -> Result<()> {
        let dev = Device::Cpu;
        let q = Tensor::randn(0f32, 1.0, (1, 2, 3, 4), &dev)?;
        let k = Tensor::randn(0f32, 1.0, (1, 2, 5, 4), &dev)?;
        let v = Tensor::randn(0f32, 1.0, (1, 2, 5, 4), &dev)?;
        // Query row 1 may attend to nothing.
        let keep = Tensor::new(&[[1u8, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], &dev)?;
        let mask = Mask::from_keep(&keep)?;
        let (out, w) = scaled_dot_product_attention(AttentionInputs {
            qkv: Qkv {
                q: &q,
                k: &k,
                v: &v,
            },
            mask: Some(&mask),
            dropout: Dropout::new(0.0),
            mode: Mode::Eval,
        })?;
        let w = w.to_dtype(DType::F64)?;
        let abs_sum = |t: &Tensor| -> Result<f64> { t.abs()?.sum_all()?.to_scalar::<f64>() };
        assert_eq!(abs_sum(&w.narrow(2, 1, 1)?)?, 0.0);
        assert_eq!(abs_sum(&out.to_dtype(DType::F64)?.narrow(2, 1, 1)?)?, 0.0);
        let sums = w.sum(D::Minus1)?.flatten_all()?.to_vec1::<f64>()?;
        for (i, s) in sums.iter().enumerate() {
            let expect = if i % 3 == 1 { 0.0 } else { 1.0 };
            assert!((s - expect).abs() < 1e-6, "row {i} sums to {s}");
        }
        // Masked keys get exactly zero weight.
        assert_eq!(
            w.narrow(2, 0, 1)?
                .narrow(3, 2, 3)?
                .sum_all()?
                .to_scalar::<f64>()?,
            0.0
        );
        Ok(())
    }
}
