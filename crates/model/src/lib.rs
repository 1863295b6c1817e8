//! The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) on candle,
//! one module per concept, in the order of the paper.
//!
//! # Shape legend
//! Used in every `# Shapes` section and every `// (B, T, C) -> ...` comment:
//!
//! | letter | meaning |
//! |---|---|
//! | B | batch |
//! | S | source (key / memory) length |
//! | T | target (query) length |
//! | C | `d_model` |
//! | H | attention heads |
//! | D | head dimension, `C / H` |
//! | F | feed-forward width, `d_ff` |
//! | V | vocabulary size |
//!
//! Tensors are batch-first, `(B, T, C)`. Token ids are `u32`. Masks are `u8` with one
//! polarity everywhere: **1 = may attend, 0 = masked** (see [`mask`]).
//!
//! # Conventions
//! - State is explicit: train/eval [`Mode`] (which carries the dropout RNG) and, later, the KV
//!   cache are arguments; no module mutates itself in `forward`.
//! - Every op on a training path is composed of candle primitives with a backward pass.
//!   candle's fused `softmax_last_dim`, `layer_norm`, `rms_norm` and `sdpa` have no backward
//!   and silently drop gradients, so they are never used here; nor is `gelu_erf`, whose
//!   backward uses a 6-digit constant (breaks float64 parity).
//! - Parameter names are PyTorch's (`encoder.layers.0.self_attn.out_proj.weight`), except that
//!   PyTorch's packed `in_proj_weight`/`in_proj_bias` are split into `q_proj`, `k_proj`,
//!   `v_proj` (see [`import`]). Names are the checkpoint contract.
//!
//! # Example
//! A language model and an encoder-decoder at toy sizes, built with a seeded
//! [`ParamBuilder`] and run on the CPU:
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use transformer_model::seq2seq::Seq2SeqMasks;
//! use transformer_model::{
//!     Backprop, LmConfig, Mode, ParamBuilder, Precision, Rng, Seq2Seq, TransformerConfig,
//!     TransformerLm,
//! };
//!
//! let device = Device::Cpu;
//!
//! // The tutorial's language model with V 50, C 16, 2 heads, F 32, one layer.
//! let pb = ParamBuilder::new(DType::F32, &device, 42);
//! let cfg = LmConfig {
//!     ntoken: 50,
//!     d_model: 16,
//!     nhead: 2,
//!     d_hid: 32,
//!     nlayers: 1,
//!     ..LmConfig::default()
//! };
//! let lm = TransformerLm::new(&pb, &cfg)?;
//! let ids = Tensor::new(&[[1u32, 2, 3, 4], [5, 6, 7, 8]], &device)?; // (B, T) = (2, 4)
//! let logits = lm.forward(&ids, Mode::Eval)?;
//! assert_eq!(logits.dims(), &[2, 4, 50]); // (B, T, V)
//!
//! // A training loss (dropout drawn from `rng`) and its gradients, through candle's graph
//! // (`Backprop::Direct` sends most of them to the fused layers' buffers instead).
//! let targets = Tensor::new(&[[2u32, 3, 4, 5], [6, 7, 8, 9]], &device)?;
//! let rng = Rng::new(1);
//! let loss = lm.loss(&ids, &targets, Mode::Train(&rng), Backprop::Graph)?;
//! let grads = loss.backward()?;
//! let params = pb.params();
//! assert!(params.vars().iter().all(|v| grads.get(v.as_tensor()).is_some()));
//!
//! // An encoder-decoder (2 + 2 layers, C 32, 4 heads) from 20 source to 30 target tokens.
//! let pb = ParamBuilder::new(DType::F32, &device, 42);
//! let model = Seq2Seq::new(&pb, &TransformerConfig::tiny(), 20, 30)?;
//! let src = Tensor::new(&[[3u32, 4, 5, 0]], &device)?; // (B, S), 0 = padding
//! let tgt_in = Tensor::new(&[[1u32, 6, 7]], &device)?; // (B, T), 1 = start symbol
//! let masks = Seq2SeqMasks::new(&src, &tgt_in, 0)?;
//! let logits = model.forward(&src, &tgt_in, &masks, Mode::Eval)?;
//! assert_eq!(logits.dims(), &[1, 3, 30]); // (B, T, V)
//! # Ok::<(), candle_core::Error>(())
//! ```

#![warn(missing_docs)]

pub mod attention;
pub mod backend;
pub mod config;
pub mod decode_state;
pub mod decoder;
pub mod dropout;
pub mod embedding;
pub mod encoder;
pub mod error;
pub mod feed_forward;
pub mod gru;
pub mod import;
pub mod layer_norm;
pub mod linear;
pub mod lm;
pub mod mask;
pub mod multi_head;
pub mod ops;
pub mod params;
pub mod positional;
pub mod restrict;
pub mod rnn;
pub mod seq2seq;
pub mod stack;
pub mod transformer;

/// The fused CPU kernels, a crate of their own below the model ([`transformer_kernels`]).
pub use transformer_kernels as kernels;
/// The gradient buffer the fused kernels write into ([`transformer_kernels::grads`]).
pub use transformer_kernels::grads;
/// The counter-based RNG of initialisation and dropout ([`transformer_kernels::rng`]).
pub use transformer_kernels::rng;

pub use attention::{scaled_dot_product_attention, softmax_last_dim, AttentionInputs, Qkv};
pub use backend::{Backprop, Pass};
pub use config::{Activation, LmConfig, TransformerConfig};
pub use decoder::{Decoder, DecoderLayer};
pub use dropout::{Dropout, Mode};
pub use embedding::Embedding;
pub use encoder::{Encoder, EncoderLayer};
pub use error::ConfigError;
pub use feed_forward::FeedForward;
pub use grads::DirectGrads;
/// Whether this CPU has bf16 products and which unit runs them ([`kernels::bf16`]): what the
/// precision choice and the benchmarks ask, without naming the kernels.
pub use kernels::bf16;
/// The index of the largest value, the first of equals: greedy search's choice among logits
/// ([`kernels::first_largest`]).
pub use kernels::first_largest;
/// The int8 scheme's weight quantization (one scale per row), for int8 runs on disk.
pub use kernels::int8::quantize_weight_rows;
/// The fused output layer with its cross-entropy ([`kernels::linear_cross_entropy_with`]),
/// which the precision choice times in each arithmetic.
pub use kernels::linear_cross_entropy_with;
/// The arithmetic of the fused layers' large products (`f32`, `bf16`): a model setting, so
/// callers need not name the kernels ([`kernels::Precision`]).
pub use kernels::Precision;
/// Row-wise log-sum-exp and log-softmax of f32 logits, the decoders' scoring
/// ([`kernels::log_sum_exp_rows_f32`], [`kernels::log_softmax_rows_f32`]).
pub use kernels::{log_softmax_rows_f32, log_sum_exp_rows_f32};
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use lm::TransformerLm;
pub use mask::Mask;
pub use multi_head::{KvCache, MultiHeadAttention};
pub use params::{Init, ParamBuilder, Params};
pub use positional::{PositionalEncoding, Positions};
pub use rng::Rng;
pub use rnn::{RnnAttention, RnnSeq2Seq, RnnSeq2SeqConfig, RnnState};
pub use seq2seq::{
    DecodePrecision, DecodeState, Inputs, PreparedDecoding, Seq2Seq, Seq2SeqConfig, Seq2SeqLoss,
};
pub use transformer::Transformer;

/// candle's result type; every forward returns it.
pub type Result<T> = candle_core::Result<T>;
