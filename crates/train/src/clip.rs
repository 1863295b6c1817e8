//! Gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`.

use candle_core::{backprop::GradStore, DType, Result, Storage, Tensor, Var};
use transformer_model::grads::{DirectGrads, GradView};

/// The L2 norm of all gradients together, accumulated in f64. Contiguous CPU f32/f64
/// gradients are read in place (one pass, no temporaries); others through tensor ops.
pub fn grad_norm(grads: &GradStore, vars: &[Var]) -> Result<f64> {
    Ok(store_sum_sq(grads, vars)?.sqrt())
}

/// [`grad_norm`] over the gradients in `grads` and those in `direct` together (a parameter
/// has its gradient in one or the other; see `transformer_model::grads`). Row gradients
/// are read as the rows they are.
pub fn grad_norm_with(grads: &GradStore, direct: &DirectGrads, vars: &[Var]) -> Result<f64> {
    let mut sq = store_sum_sq(grads, vars)?;
    direct.for_each(|_, g| {
        sq += match g {
            GradView::Dense {
                sum_sq: Some(sq), ..
            } => sq,
            GradView::Dense { values, .. } => {
                crate::par::map(values, crate::par::sum_sq_f32).iter().sum()
            }
            GradView::Rows { rows, .. } => crate::par::sum_sq_f32(rows),
        };
        Ok(())
    })?;
    Ok(sq.sqrt())
}

fn store_sum_sq(grads: &GradStore, vars: &[Var]) -> Result<f64> {
    let mut sq = 0f64;
    for v in vars {
        if let Some(g) = grads.get(v.as_tensor()) {
            sq += sum_of_squares(g)?;
        }
    }
    Ok(sq)
}

fn sum_of_squares(g: &Tensor) -> Result<f64> {
    if g.device().is_cpu() && g.is_contiguous() {
        let (storage, layout) = g.storage_and_layout();
        if let (Storage::Cpu(s), Some((a, b))) = (&*storage, layout.contiguous_offsets()) {
            match g.dtype() {
                DType::F32 => {
                    let x = &s.as_slice::<f32>()?[a..b];
                    return Ok(crate::par::map(x, crate::par::sum_sq_f32).iter().sum());
                }
                DType::F64 => {
                    let x = &s.as_slice::<f64>()?[a..b];
                    return Ok(crate::par::map(x, crate::par::sum_sq_f64).iter().sum());
                }
                _ => {}
            }
        }
    }
    g.to_dtype(DType::F64)?.sqr()?.sum_all()?.to_scalar::<f64>()
}

/// PyTorch's clipping coefficient: `min(1, max_norm / (total_norm + 1e-6))`, with the total
/// norm. Multiply the step by it (see [`crate::Sgd::step_scaled`]) instead of rewriting every
/// gradient.
pub fn clip_coefficient(grads: &GradStore, vars: &[Var], max_norm: f64) -> Result<(f64, f64)> {
    let total = grad_norm(grads, vars)?;
    Ok((total, coefficient(total, max_norm)))
}

/// [`clip_coefficient`] over the gradients in `grads` and in `direct` together.
pub fn clip_coefficient_with(
    grads: &GradStore,
    direct: &DirectGrads,
    vars: &[Var],
    max_norm: f64,
) -> Result<(f64, f64)> {
    let total = grad_norm_with(grads, direct, vars)?;
    Ok((total, coefficient(total, max_norm)))
}

fn coefficient(total: f64, max_norm: f64) -> f64 {
    (max_norm / (total + 1e-6)).min(1.0)
}

/// Scales all gradients by `max_norm / (total_norm + 1e-6)` when that is below 1, where
/// `total_norm` is the L2 norm of all gradients together. Returns `total_norm` (before
/// clipping), as PyTorch does. Parameters without a gradient are skipped.
pub fn clip_grad_norm(grads: &mut GradStore, vars: &[Var], max_norm: f64) -> Result<f64> {
    let (total, coef) = clip_coefficient(grads, vars, max_norm)?;
    if coef < 1.0 {
        for v in vars {
            if let Some(g) = grads.remove(v.as_tensor()) {
                grads.insert(v.as_tensor(), (g * coef)?);
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn norm_and_coefficient_match_the_definition() -> Result<()> {
        let a = Var::new(&[3.0f32, 0.0], &Device::Cpu)?;
        let b = Var::new(&[[4.0f32]], &Device::Cpu)?;
        // loss = 3a0 + 4b: gradients (3, 0) and (4): norm 5.
        let loss =
            ((a.as_tensor().get(0)? * 3.0)? + (b.as_tensor().flatten_all()?.get(0)? * 4.0)?)?;
        let grads = loss.backward()?;
        let vars = [a, b];
        let (total, coef) = clip_coefficient(&grads, &vars, 0.5)?;
        assert!((total - 5.0).abs() < 1e-9);
        assert!((coef - 0.5 / (5.0 + 1e-6)).abs() < 1e-12);
        assert_eq!(clip_coefficient(&grads, &vars, 10.0)?.1, 1.0);
        Ok(())
    }
}
