//! The fused layers on plain slices, for the model's tests that compare them with its
//! composed layers (`transformer-model`'s `tests/fused_layers.rs`): the layers' arithmetic
//! with an explicit number of thread groups, without candle's op around it. Not an API.

pub use super::decoder_layer::run_slices as decoder_layer_slices;
pub use super::encoder_layer::run_slices as encoder_layer_slices;
pub use super::float::Float;
use super::sublayer::SubDims;

/// A layer's shape and options: `b` sequences of `t` rows (`s` memory rows for a decoder
/// layer), width `c`, feed-forward width `f`, `h` heads.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Sequences B.
    pub b: usize,
    /// Rows per sequence T.
    pub t: usize,
    /// Memory rows per sequence S (decoder layers).
    pub s: usize,
    /// Width C.
    pub c: usize,
    /// Feed-forward width F.
    pub f: usize,
    /// Heads H.
    pub h: usize,
    /// The layer norms' epsilon.
    pub eps: f64,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
    /// bf16 products (f32 inputs, a CPU with a bf16 unit).
    pub bf16: bool,
    /// GELU instead of ReLU.
    pub gelu: bool,
}

impl Shape {
    pub(crate) fn sub(&self) -> SubDims {
        SubDims {
            c: self.c,
            f: self.f,
            h: self.h,
            eps: self.eps,
            norm_first: self.norm_first,
            bf16: self.bf16,
            gelu: self.gelu,
        }
    }
}

/// What a layer's forward and backward passes gave.
#[derive(Debug)]
pub struct Run<T> {
    /// The output.
    pub y: Vec<T>,
    /// The input's gradient.
    pub dx: Vec<T>,
    /// The memory's gradient (decoder layers; empty for encoder layers).
    pub dmemory: Vec<T>,
    /// Each parameter's gradient, in the layer's slot order.
    pub grads: Vec<Vec<T>>,
    /// How many groups the forward pass kept state for.
    pub groups: usize,
}
