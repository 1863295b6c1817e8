//! Position-wise feed-forward network (section 3.3, equation 2):
//! `FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`, with dropout on the hidden layer as PyTorch's
//! `nn.TransformerEncoderLayer` uses it.

use crate::config::Activation;
use crate::dropout::{Dropout, Mode};
use crate::linear::Linear;
use crate::params::ParamBuilder;
use crate::Result;
use candle_core::Tensor;

/// The position-wise feed-forward network, (B, T, C) -> (B, T, F) -> (B, T, C).
#[derive(Debug, Clone)]
pub struct FeedForward {
    linear1: Linear,
    linear2: Linear,
    activation: Activation,
    dropout: Dropout,
}

impl FeedForward {
    /// `linear1` and `linear2` are created directly under `pb`, as PyTorch names them
    /// (`layers.0.linear1.weight`).
    pub fn new(
        pb: &ParamBuilder,
        d_model: usize,
        d_ff: usize,
        activation: Activation,
        dropout: f64,
    ) -> Result<Self> {
        Ok(Self {
            linear1: Linear::new(&pb.pp("linear1"), d_model, d_ff, true)?,
            linear2: Linear::new(&pb.pp("linear2"), d_ff, d_model, true)?,
            activation,
            dropout: Dropout::new(dropout),
        })
    }

    /// `linear1`, `linear2`, the activation and the dropout on the hidden layer.
    pub(crate) fn parts(&self) -> (&Linear, &Linear, Activation, Dropout) {
        (&self.linear1, &self.linear2, self.activation, self.dropout)
    }

    /// `linear2(dropout(activation(linear1(x))))`, position by position.
    ///
    /// # Shapes
    /// (B, T, C) -> (B, T, F) -> (B, T, C)
    pub fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if let (Some(b1), true) = (
            self.linear1.bias(),
            crate::ops::gpu_fused(&[x, self.linear1.weight()]),
        ) {
            // On the GPU: the product, then bias + activation + dropout as one fused kernel
            // each way.
            let w1 = self.linear1.weight();
            let (f, c) = w1.dims2()?;
            let rows = x.elem_count() / c.max(1);
            let h = crate::ops::matmul(&x.reshape((rows, c))?, &w1.t()?)?;
            let stream = self.dropout.stream(mode);
            if let Some(h) = crate::ops::bias_activation_dropout(&h, b1, self.activation, stream)? {
                let mut dims = x.dims().to_vec();
                if let Some(last) = dims.last_mut() {
                    *last = f;
                }
                return self.linear2.forward(&h.reshape(dims)?);
            }
        }
        let h = self.linear1.forward(x)?;
        let h = match self.activation {
            Activation::Relu => h.relu()?,
            Activation::Gelu => gelu_erf(&h)?,
            Activation::GeluTanh => gelu_tanh(&h)?,
            Activation::Swish => h.silu()?,
        };
        self.linear2.forward(&self.dropout.forward(&h, mode)?)
    }
}

/// Exact GELU, `x * (1 + erf(x / sqrt(2))) / 2`, composed from `erf` (exact backward) rather
/// than candle's `gelu_erf`, whose backward uses a rounded 1/sqrt(2 pi).
pub fn gelu_erf(x: &Tensor) -> Result<Tensor> {
    let cdf = ((x / std::f64::consts::SQRT_2)?.erf()? + 1.0)? * 0.5;
    x * cdf?
}

/// GELU's tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, composed of
/// tensor ops so that its gradient is exact (candle's own `gelu` differentiates with
/// six-digit constants).
pub fn gelu_tanh(x: &Tensor) -> Result<Tensor> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let cube = ((x * x)? * x)?;
    let inner = ((x + (cube * 0.044715)?)? * k)?;
    (x * 0.5)? * (inner.tanh()? + 1.0)?
}
