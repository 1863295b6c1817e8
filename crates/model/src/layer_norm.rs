//! Layer normalisation (Ba et al. 2016), applied around every sub-layer (section 3.1).
//!
//! `y = (x - mean) / sqrt(var + eps) * weight + bias` over the last dimension, with the
//! biased variance and `eps` inside the square root, exactly as PyTorch's `nn.LayerNorm`
//! (some implementations add eps to the standard deviation instead; that differs).
//! Composed of candle primitives so that the backward pass exists.

use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::{Tensor, D};

#[derive(Debug, Clone)]
pub struct LayerNorm {
    /// (C,)
    weight: Tensor,
    /// (C,)
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    pub fn new(pb: &ParamBuilder, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: pb.var("weight", dim, Init::Ones)?,
            bias: pb.var("bias", dim, Init::Zeros)?,
            eps,
        })
    }

    /// # Shapes
    /// (..., C) -> (..., C)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centered = x.broadcast_sub(&mean)?;
        let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
        let inv_std = (var + self.eps)?.sqrt()?.recip()?;
        centered
            .broadcast_mul(&inv_std)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}
