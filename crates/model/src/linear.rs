//! A fully connected layer, `y = x W^T + b`, with PyTorch's weight layout `(out, in)`.

use crate::params::{Init, ParamBuilder};
use crate::Result;
use candle_core::Tensor;

/// A fully connected layer `y = x W^T + b`, weight (out, in), optional bias (out,).
#[derive(Debug, Clone)]
pub struct Linear {
    /// (out, in)
    weight: Tensor,
    /// (out,)
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer with PyTorch's default init for `weight` and `bias` (see [`Init::torch_linear`]).
    pub fn new(pb: &ParamBuilder, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        let init = Init::torch_linear(in_dim);
        Self::with_init(pb, in_dim, out_dim, init, bias.then_some(init))
    }

    /// A layer with explicit initialisations; `bias_init: None` means no bias.
    pub fn with_init(
        pb: &ParamBuilder,
        in_dim: usize,
        out_dim: usize,
        weight_init: Init,
        bias_init: Option<Init>,
    ) -> Result<Self> {
        let weight = pb.var("weight", (out_dim, in_dim), weight_init)?;
        let bias = match bias_init {
            Some(init) => Some(pb.var("bias", out_dim, init)?),
            None => None,
        };
        Ok(Self { weight, bias })
    }

    /// A layer on existing tensors (e.g. a weight shared with an embedding): `weight` is
    /// (out, in), `bias` (out,).
    pub fn from_parts(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    /// The weight, (out, in).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, (out,), if the layer has one.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// `x W^T + b` over the last dimension.
    ///
    /// # Shapes
    /// (..., in) -> (..., out)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (out_dim, in_dim) = self.weight.dims2()?;
        let dims = x.dims();
        if dims.last() != Some(&in_dim) {
            candle_core::bail!(
                "linear layer expects inputs with last dimension {in_dim}, got shape {dims:?}"
            );
        }
        if let Some(b) = &self.bias {
            // Fused forward and backward: no transposed gradient, no bias reduction through
            // candle's strided paths (the composed form is the kernels' `linear_reference`).
            return crate::ops::linear(x, &self.weight, b);
        }
        let rows = x.elem_count() / in_dim;
        // (..., in) -> (N, in) @ (in, out) -> (N, out); W^T is a strided view, not a copy.
        let y = crate::ops::matmul(&x.reshape((rows, in_dim))?, &self.weight.t()?)?;
        let mut out_dims = dims.to_vec();
        *out_dims.last_mut().unwrap() = out_dim;
        y.reshape(out_dims)
    }
}
