//! The operations the paper's modules are written in, and the one place those modules reach
//! the kernels crate ([`transformer_kernels`]). Whole layers are chosen in
//! [`crate::backend`]; the single ops below are chosen per call by their tensors: the fused
//! CPU kernel for f32/f64 tensors on the CPU (one pass, a hand-written backward, tested
//! against the composition it replaces in the kernels' tests), the fused CUDA kernel for
//! f32/f64 tensors on a GPU (layer norm, softmax, dropout, and [`attention_gpu`],
//! [`bias_activation_dropout`], [`smoothed_cross_entropy_gpu`]: tested against the
//! compositions in `crates/cli/tests/cuda_parity.rs`), candle's composed ops elsewhere
//! (bf16, or a GPU with `TRANSFORMER_CUDA_FUSED=0`). An op of another device plugs in here,
//! not in the modules.

use crate::grads::DirectGrads;
use crate::Result;
use candle_core::Tensor;
use transformer_kernels as kernels;

/// The arithmetic of the fused layers' large products ([`kernels::Precision`]).
pub use kernels::Precision;

/// The arithmetic of decoding's products ([`crate::Seq2Seq::prepare_decoding`]; chosen when the model is built,
/// [`crate::ParamBuilder::with_decoding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecodePrecision {
    /// f32 throughout (the default).
    #[default]
    F32,
    /// The decoder layers' projections and feed-forward products in int8 (where the backend
    /// has an int8 decoding step: the CPU's), and the output layer's too when `output_layer`.
    Int8 {
        /// Whether the output layer (d_model x vocabulary) is int8 as well.
        output_layer: bool,
    },
}

impl DecodePrecision {
    /// Whether the decoder layers are asked to run in int8.
    pub fn int8_layers(self) -> bool {
        matches!(self, Self::Int8 { .. })
    }

    /// Whether the output layer is asked to run in int8.
    pub fn int8_output(self) -> bool {
        matches!(self, Self::Int8 { output_layer: true })
    }
}

/// Softmax over the last dimension, with a backward pass (composed: max-subtracted, the max
/// detached).
pub use kernels::softmax_last_dim;

/// `a @ b` (batched), with bf16 operands inside a mixed-precision pass
/// ([`crate::backend::Backend::mixed_precision`]), f32 otherwise.
pub use kernels::autocast::matmul;

/// Attention's output `softmax(q k^T * scale, masked) v` without its weights, dropout
/// multiplier `drop` on the weights; rows with no key get zeros
/// ([`crate::attention::attention_output`]).
pub use kernels::{attention, AttentionInputs, Qkv};

/// Inverted dropout with mask element `i` kept where `uniform_at(seed, stream, i) >= p`.
pub use kernels::dropout;

/// The logistic function.
pub use kernels::sigmoid;

/// The hyperbolic tangent.
pub use kernels::tanh;

/// Layer normalisation over the last dimension with gain `w` and bias `b`.
pub use kernels::layer_norm;

/// `x W^T + b` with gradients for all three.
pub use kernels::linear;

/// `x W^T + b` for a few rows of `x` (a decoding step's output layer), reading `W` in place.
pub use kernels::linear_few_rows;

/// `x Wt + b` with the weight given transposed (`Wt = W^T`, kept by the caller for the
/// steps of a batch); forward only.
pub use kernels::linear_wt;

/// The output layer and its mean cross-entropy over the targets as one op (`ignore`: a
/// target that counts for nothing), the products in `precision`. With `grads` the weight's
/// and bias's gradients go there (CPU f32 variables), not to candle's `GradStore`; the
/// values are the same either way.
pub fn output_cross_entropy(
    h: &Tensor,
    w: &Tensor,
    b: &Tensor,
    targets: &Tensor,
    ignore: Option<u32>,
    precision: Precision,
    grads: Option<&DirectGrads>,
) -> Result<Tensor> {
    match grads {
        Some(g) => kernels::linear_cross_entropy_direct(h, w, b, targets, ignore, precision, g),
        None => kernels::linear_cross_entropy_with(h, w, b, targets, ignore, precision),
    }
}

/// The label-smoothing term of the loss, `eps` times the mean over the kept targets of
/// minus the mean log-probability over the vocabulary (its weight and bias gradients to
/// `grads` when given).
pub use kernels::{label_smoothing_term, SmoothingInputs};

/// Whether the fused GPU kernels take these tensors (f32 or f64 on a CUDA device, in a
/// build with the `cuda` feature): then [`attention_gpu`], [`bias_activation_dropout`] and
/// [`smoothed_cross_entropy_gpu`] run, and a caller draws its dropout stream for them.
pub use kernels::gpu::applies as gpu_fused;

/// Attention's output with the softmax, scale, mask and dropout fused on the GPU
/// ([`kernels::gpu::attention_gpu`]); `None` where [`gpu_fused`] does not hold.
pub use kernels::gpu::attention_gpu;

/// `dropout(activation(x + bias))` fused on the GPU ([`kernels::gpu::bias_activation_dropout`]);
/// `None` where [`gpu_fused`] does not hold.
pub fn bias_activation_dropout(
    x: &Tensor,
    bias: &Tensor,
    activation: crate::config::Activation,
    dropout: Option<kernels::gpu::DropoutStream>,
) -> Result<Option<Tensor>> {
    kernels::gpu::bias_activation_dropout(x, bias, activation.into(), dropout)
}

/// `(loss, nll)`: the output layer and its label-smoothed cross-entropy fused on the GPU
/// ([`kernels::gpu::linear_smoothed_cross_entropy`]); `None` where [`gpu_fused`] does not
/// hold.
pub use kernels::gpu::linear_smoothed_cross_entropy as smoothed_cross_entropy_gpu;
