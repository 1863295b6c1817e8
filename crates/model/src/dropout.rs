//! Dropout (section 5.4, "Residual Dropout") and the explicit train/eval [`Mode`].

use crate::rng::Rng;
use crate::Result;
use candle_core::Tensor;

/// Whether a forward pass trains (dropout active, drawing from the given RNG) or evaluates.
///
/// Passed by value through every forward: modules hold no mode of their own.
#[derive(Debug, Clone, Copy)]
pub enum Mode<'a> {
    /// Evaluation: dropout is the identity and nothing is drawn from an RNG.
    Eval,
    /// Training: dropout is active and draws its masks from this RNG.
    Train(&'a Rng),
}

impl Mode<'_> {
    /// True for [`Mode::Train`].
    pub fn is_train(&self) -> bool {
        matches!(self, Mode::Train(_))
    }
}

/// Inverted dropout: in training, zero each element with probability `p` and scale the rest
/// by `1 / (1 - p)`, so evaluation is the identity (as PyTorch's `nn.Dropout`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f64,
}

impl Dropout {
    /// `p` is validated by the model configs; it must lie in [0, 1).
    pub fn new(p: f64) -> Self {
        debug_assert!((0.0..1.0).contains(&p));
        Self { p }
    }

    /// The probability of zeroing an element.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Each call in training draws one fresh RNG stream; element `i` is kept where
    /// `uniform_at(seed, stream, i) >= p` ([`crate::ops::dropout`], which regenerates the
    /// mask in the backward pass instead of storing it).
    ///
    /// # Shapes
    /// any shape -> the same shape
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        match mode {
            Mode::Train(rng) if self.p > 0.0 => {
                let (seed, _) = rng.state();
                crate::ops::dropout(x, self.p, seed, rng.next_stream())
            }
            _ => Ok(x.clone()),
        }
    }

    /// The mask [`Self::forward`] would apply, as `(p, seed, stream)` for a fused kernel that
    /// regenerates it (drawing the same RNG stream); `None` where dropout is the identity
    /// (evaluation, or p = 0).
    pub fn stream(&self, mode: Mode) -> Option<(f64, u64, u64)> {
        match mode {
            Mode::Train(rng) if self.p > 0.0 => {
                let (seed, _) = rng.state();
                Some((self.p, seed, rng.next_stream()))
            }
            _ => None,
        }
    }

    /// The multiplier [`Self::forward`] would apply to a tensor of `shape` (0 or `1 / (1 - p)`
    /// per element, drawing the same RNG stream), for ops that take dropout as an argument;
    /// `None` where dropout is the identity (evaluation, or p = 0).
    pub fn multiplier(
        &self,
        shape: impl Into<candle_core::Shape>,
        dtype: candle_core::DType,
        device: &candle_core::Device,
        mode: Mode,
    ) -> Result<Option<Tensor>> {
        match mode {
            Mode::Train(_) if self.p > 0.0 => {
                let ones = Tensor::ones(shape, dtype, device)?;
                Ok(Some(self.forward(&ones, mode)?))
            }
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn eval_is_identity_and_train_scales() -> Result<()> {
        let x = Tensor::ones((100, 100), DType::F32, &Device::Cpu)?;
        let d = Dropout::new(0.25);
        let y = d.forward(&x, Mode::Eval)?;
        assert_eq!(y.sum_all()?.to_scalar::<f32>()?, 10_000.0);
        let rng = Rng::new(3);
        let y = d
            .forward(&x, Mode::Train(&rng))?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let zeros = y.iter().filter(|&&v| v == 0.0).count();
        assert!((2300..2700).contains(&zeros), "{zeros} zeros of 10000");
        assert!(y.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        // Two calls draw different masks; the same RNG state redraws the same one.
        let rng2 = Rng::new(3);
        let again = d
            .forward(&x, Mode::Train(&rng2))?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert_eq!(again, y);
        let next = d
            .forward(&x, Mode::Train(&rng2))?
            .flatten_all()?
            .to_vec1::<f32>()?;
        assert_ne!(next, y);
        Ok(())
    }
}
