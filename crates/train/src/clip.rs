//! Gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`.

use candle_core::{backprop::GradStore, Result, Var};

/// Scales all gradients by `max_norm / (total_norm + 1e-6)` when that is below 1, where
/// `total_norm` is the L2 norm of all gradients together. Returns `total_norm` (before
/// clipping), as PyTorch does. Parameters without a gradient are skipped.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    let mut sq = 0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += g
                .sqr()?
                .sum_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_scalar::<f64>()?;
        }
    }
    let total = sq.sqrt();
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 {
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * coef)?);
            }
        }
    }
    Ok(total)
}
