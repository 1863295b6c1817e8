//! The fused GPU kernels' entry points, for the model's layers to call on any build: each
//! runs its fused CUDA op where the tensors are f32 or f64 on a CUDA device (and the crate is
//! built with the `cuda` feature), and answers `None` elsewhere, where the caller runs its
//! composed layer. [`applies`] says beforehand which it will be, so that a caller draws its
//! dropout streams once, for the path it takes.

use crate::Activation;
use candle_core::{Result, Tensor};

/// A dropout mask as the kernels regenerate it: `(p, seed, stream)`, element `i` (in
/// row-major order) kept where `uniform_at(seed, stream, i) >= p` ([`crate::dropout()`]'s mask).
pub type DropoutStream = (f64, u64, u64);

/// Whether the fused GPU kernels run on these tensors: all f32 or all f64 on a CUDA device,
/// in a build with the `cuda` feature.
pub fn applies(ts: &[&Tensor]) -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::cuda::applies(ts)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = ts;
        false
    }
}

/// Attention's output `dropout(softmax(scale q k^T, masked by keep)) v` with the softmax,
/// scale, mask and dropout as one fused kernel forward and one backward between cuBLAS's two
/// products; rows with no key to attend to get zeros (as [`crate::attention_reference`]).
/// `None` where [`applies`] does not hold for q, k and v.
///
/// # Shapes
/// q (B, H, T, D), k (B, H, S, D), v (B, H, S, Dv), keep u8 broadcastable to (B, H, T, S)
/// -> (B, H, T, Dv)
pub fn attention_gpu(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keep: Option<&Tensor>,
    dropout: Option<DropoutStream>,
    scale: f64,
) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if applies(&[q, k, v]) {
        return crate::cuda::attention(q, k, v, keep, dropout, scale).map(Some);
    }
    let _ = (q, k, v, keep, dropout, scale);
    Ok(None)
}

/// `dropout(activation(x + bias))` over the last dimension of `x` as one fused kernel forward
/// and one backward (with the bias's column sums): the feed-forward block's hidden layer
/// after its product. `None` where [`applies`] does not hold for x and bias.
///
/// # Shapes
/// x (..., F), bias (F,) -> (..., F)
pub fn bias_activation_dropout(
    x: &Tensor,
    bias: &Tensor,
    activation: Activation,
    dropout: Option<DropoutStream>,
) -> Result<Option<Tensor>> {
    // The CUDA kernel has ReLU and the exact GELU; the other activations run composed.
    #[cfg(feature = "cuda")]
    if matches!(activation, Activation::Relu | Activation::Gelu) && applies(&[x, bias]) {
        return crate::cuda::bias_activation_dropout(x, bias, activation, dropout).map(Some);
    }
    let _ = (x, bias, activation, dropout);
    Ok(None)
}

/// `(loss, nll)` of the output layer `hidden W^T + bias` over the rows whose target is not
/// `ignore`: the mean label-smoothed cross-entropy (smoothing `eps`, PyTorch's
/// `CrossEntropyLoss(label_smoothing=eps)`) and the mean negative log-likelihood (detached),
/// the product in cuBLAS and the rest one fused kernel forward and one backward. `None`
/// where [`applies`] does not hold for hidden, weight and bias.
///
/// # Shapes
/// hidden (N, C), weight (V, C), bias (V,), targets (N,) u32 -> two scalars
pub fn linear_smoothed_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore: Option<u32>,
    eps: f64,
) -> Result<Option<(Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if applies(&[hidden, weight, bias]) {
        return crate::cuda::smoothed_cross_entropy(hidden, weight, bias, targets, ignore, eps)
            .map(Some);
    }
    let _ = (hidden, weight, bias, targets, ignore, eps);
    Ok(None)
}

/// The sum of the squares of every element of `ts` in f64, as a scalar f64 tensor on their
/// GPU: one kernel over all of them and one for the total (the gradient norm for clipping
/// without a kernel per gradient). `None` where [`applies`] does not hold for them all (or
/// there are none).
pub fn sum_of_squares(ts: &[&Tensor]) -> Result<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    if !ts.is_empty() && applies(ts) {
        return crate::cuda::sum_of_squares(ts).map(Some);
    }
    let _ = ts;
    Ok(None)
}

/// One Adam step of every parameter in place, as one kernel over all of them: `params` and
/// their gradients `grads` (the same shapes; each is made contiguous), the moments `m` and
/// `s` laid end to end in the parameters' order (contiguous, updated in place),
/// `hyper = [beta1, beta2, eps, lr]`, `corrections = [1 - beta1^t, 1 - beta2^t]`, and the
/// gradients scaled by `scale` where it is below 1 (the clipping coefficient). Per element,
/// in the parameters' dtype: `m = m beta1 + g (1 - beta1)`, `s = s beta2 + g^2 (1 - beta2)`,
/// `p -= (m / c1) / (sqrt(s / c2) + eps) lr`. Returns false, having changed nothing, where
/// [`applies`] does not hold for every tensor or a parameter is not contiguous.
pub fn adam_step(
    params: &[&Tensor],
    grads: &[&Tensor],
    moments: (&Tensor, &Tensor),
    hyper: [f64; 4],
    corrections: [f64; 2],
    scale: f64,
) -> Result<bool> {
    #[cfg(feature = "cuda")]
    {
        let all: Vec<&Tensor> = params
            .iter()
            .chain(grads)
            .copied()
            .chain([moments.0, moments.1])
            .collect();
        if params.is_empty()
            || params.len() != grads.len()
            || !applies(&all)
            || !params.iter().all(|p| p.is_contiguous())
            || !moments.0.is_contiguous()
            || !moments.1.is_contiguous()
        {
            return Ok(false);
        }
        let grads: Vec<Tensor> = grads
            .iter()
            .map(|g| g.contiguous())
            .collect::<Result<_>>()?;
        let grads: Vec<&Tensor> = grads.iter().collect();
        crate::cuda::adam_step(params, &grads, moments, hyper, corrections, scale)?;
        Ok(true)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (params, grads, moments, hyper, corrections, scale);
        Ok(false)
    }
}
