//! Layer normalisation (Ba et al. 2016), applied around every sub-layer (section 3.1).
//!
//! `y = (x - mean) / sqrt(var + eps) * weight + bias` over the last dimension, with the
//! biased variance and `eps` inside the square root, exactly as PyTorch's `nn.LayerNorm`
//! (some implementations add eps to the standard deviation instead; that differs).
//! Runs the fused kernel with a hand-written backward ([`crate::ops::layer_norm`]), or
//! its composition from candle primitives where the kernel does not apply.

use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::Tensor;

/// Layer normalisation over the last dimension (C) with a learned scale and shift.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// (C,)
    weight: Tensor,
    /// (C,)
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Creates `weight` (ones) and `bias` (zeros) of size `dim` under `pb`, as PyTorch does.
    pub fn new(pb: &ParamBuilder, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: pb.var("weight", dim, Init::Ones)?,
            bias: pb.var("bias", dim, Init::Zeros)?,
            eps,
        })
    }

    /// `(weight, bias, eps)`.
    pub(crate) fn parts(&self) -> (&Tensor, &Tensor, f64) {
        (&self.weight, &self.bias, self.eps)
    }

    /// Normalises each vector over its last dimension, then scales and shifts it.
    ///
    /// # Shapes
    /// (..., C) -> (..., C)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // The fused kernel on CPU f32/f64; the composed primitives elsewhere.
        crate::ops::layer_norm(x, &self.weight, &self.bias, self.eps)
    }
}
