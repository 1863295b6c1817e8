//! Gradient-norm clipping, as `torch.nn.utils.clip_grad_norm_`.

use crate::grads::Gradients;
use candle_core::Result;

/// PyTorch's clipping coefficient: `min(1, max_norm / (total_norm + 1e-6))`, with the total
/// norm ([`Gradients::norm`]). Multiply the step by it (the `scale` of [`crate::Sgd::step`]
/// and [`crate::Adam::step`]) instead of rewriting every gradient.
pub fn clip_coefficient(grads: &Gradients, max_norm: f64) -> Result<(f64, f64)> {
    let total = grads.norm()?;
    Ok((total, (max_norm / (total + 1e-6)).min(1.0)))
}

/// Scales all gradients by `max_norm / (total_norm + 1e-6)` when that is below 1, where
/// `total_norm` is the L2 norm of all gradients together. Returns `total_norm` (before
/// clipping), as PyTorch does.
pub fn clip_grad_norm(grads: &mut Gradients, max_norm: f64) -> Result<f64> {
    let (total, coef) = clip_coefficient(grads, max_norm)?;
    if coef < 1.0 {
        grads.scale(coef)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn norm_and_coefficient_match_the_definition() -> Result<()> {
        let a = Var::new(&[3.0f32, 0.0], &Device::Cpu)?;
        let b = Var::new(&[[4.0f32]], &Device::Cpu)?;
        // loss = 3a0 + 4b: gradients (3, 0) and (4): norm 5.
        let loss =
            ((a.as_tensor().get(0)? * 3.0)? + (b.as_tensor().flatten_all()?.get(0)? * 4.0)?)?;
        let mut grads = Gradients::backward(&loss, &[a.clone(), b.clone()])?;
        let (total, coef) = clip_coefficient(&grads, 0.5)?;
        assert!((total - 5.0).abs() < 1e-9);
        assert!((coef - 0.5 / (5.0 + 1e-6)).abs() < 1e-12);
        assert_eq!(clip_coefficient(&grads, 10.0)?.1, 1.0);
        // Clipping in place leaves the norm at max_norm (to the 1e-6 of the definition).
        assert!((clip_grad_norm(&mut grads, 0.5)? - 5.0).abs() < 1e-9);
        assert!((grads.norm()? - 0.5).abs() < 1e-6);
        assert_eq!(
            grads
                .get(&b)?
                .unwrap()
                .flatten_all()?
                .to_vec1::<f32>()?
                .len(),
            1
        );
        Ok(())
    }
}
