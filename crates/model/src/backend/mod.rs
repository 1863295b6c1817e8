//! How each layer runs: the one place that decides it.
//!
//! The paper's modules compute each layer one way, composed of candle ops (the reference and
//! the fallback). A [`Backend`] may run a layer another way (today: the whole encoder layer
//! as one fused CPU op, [`CpuFused`]); it is chosen once, when a stack is built for a device
//! ([`choose`]), and asked for every layer call, and it answers `None` where it does not cover
//! the call (then the composed layer runs). [`Backend::describe`] says what was chosen and
//! why, for the log. Adding a backend means implementing [`Backend`] (each method defaults
//! to the composed layer) and giving it to the stacks when a model is built
//! ([`crate::ParamBuilder::with_backend`]), not editing the paper's modules. Every fast
//! implementation is tested against the composed one (`tests/fused_layers.rs`,
//! `tests/invariants.rs`, `tests/decode_step.rs`); `tests/backend.rs` registers a toy one.
//!
//! Decoding is chosen here too ([`Backend::decoding_stack`], [`Backend::output_layer`]): the
//! decoder as one fused step (f32, or int8 weights) or the composed layers, and the output
//! layer in f32 or int8, over the whole vocabulary or a batch's candidates.

mod decoding;
pub use decoding::{DecodePrecision, FusedDecoding, OutputLayer, PreparedDecoding};

use crate::config::Activation;
use crate::dropout::{Dropout, Mode};
use crate::feed_forward::FeedForward;
use crate::grads::DirectGrads;
use crate::kernels::{self, EncoderLayerOptions, EncoderLayerParams, LayerDropout, Precision};
use crate::layer_norm::LayerNorm;
use crate::linear::Linear;
use crate::mask::Mask;
use crate::multi_head::MultiHeadAttention;
use crate::Result;
use candle_core::{Device, Tensor};
use std::sync::Arc;

/// The attention weights of one decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Masked self-attention, (B, H, T, T).
    pub self_attn: Tensor,
    /// Encoder-decoder attention, (B, H, T, S): which source word each target word attends to.
    pub cross_attn: Tensor,
}

/// The whole decoder as one fused decoding step with its own caches (today the CPU's,
/// [`kernels::DecoderStack`]: f32, or int8 weights once prepared).
pub use crate::kernels::DecoderStack as DecodingStack;

/// How the caller will differentiate a forward pass, which decides whether a layer may run
/// as one fused op.
#[derive(Debug, Clone, Copy)]
pub enum Backprop<'a> {
    /// Through candle's graph (`loss.backward()`): the composed layer.
    Graph,
    /// The parameters' gradients into `DirectGrads`, the input's through the graph.
    Direct(&'a DirectGrads),
    /// Not at all (evaluation): no graph is built.
    Off,
}

/// One forward pass through a stack: train or eval (with the dropout RNG), how it will be
/// differentiated, and whether each layer's attention weights are returned.
#[derive(Debug, Clone, Copy)]
pub struct Pass<'a> {
    /// Train (with the dropout RNG) or eval.
    pub mode: Mode<'a>,
    /// How the pass will be differentiated.
    pub backprop: Backprop<'a>,
    /// Whether each layer's attention weights are returned (the fused layers keep none, so
    /// those layers run composed).
    pub weights: bool,
    /// The arithmetic of the fused layers' products in a `Direct` pass
    /// ([`EncoderLayerOptions::precision`]): the model's training precision, which it was
    /// built with. f32 unless a model says otherwise ([`Self::products`]).
    pub precision: Precision,
}

impl<'a> Pass<'a> {
    /// A pass in `mode` through candle's graph, without the attention weights.
    pub fn new(mode: Mode<'a>) -> Self {
        Self {
            mode,
            backprop: Backprop::Graph,
            weights: false,
            precision: Precision::F32,
        }
    }

    /// The same pass, differentiated as `backprop` says.
    pub fn backprop(self, backprop: Backprop<'a>) -> Self {
        Self { backprop, ..self }
    }

    /// The same pass, its fused layers' products in `precision` when differentiated `Direct`.
    pub fn products(self, precision: Precision) -> Self {
        Self { precision, ..self }
    }

    /// The same pass, returning each layer's attention weights.
    pub fn weights(self) -> Self {
        Self {
            weights: true,
            ..self
        }
    }
}

/// What a backend reads of an encoder layer (`EncoderLayer`'s parts): the backend sits
/// below the layers, which call it.
#[derive(Debug, Clone, Copy)]
pub struct EncoderLayerParts<'a> {
    pub(crate) self_attn: &'a MultiHeadAttention,
    pub(crate) ff: &'a FeedForward,
    pub(crate) norm1: &'a LayerNorm,
    pub(crate) norm2: &'a LayerNorm,
    pub(crate) dropout: Dropout,
    pub(crate) norm_first: bool,
}

/// What a backend reads of a decoder layer (`DecoderLayer`'s parts): self-attention,
/// encoder-decoder attention, feed-forward, the three norms, the residual dropout and
/// whether it is pre-norm.
#[derive(Debug, Clone, Copy)]
pub struct DecoderLayerParts<'a> {
    pub(crate) self_attn: &'a MultiHeadAttention,
    pub(crate) cross_attn: &'a MultiHeadAttention,
    pub(crate) ff: &'a FeedForward,
    pub(crate) norms: [&'a LayerNorm; 3],
    pub(crate) dropout: Dropout,
    pub(crate) norm_first: bool,
}

/// One call of an encoder layer: its input, mask and mode, and how it will be
/// differentiated. A stack asks its backend only for calls without a cache and without
/// attention weights (`Stack::run`); the others run the composed layer.
#[derive(Debug, Clone, Copy)]
pub struct LayerCall<'a> {
    /// The layer's input, (B, T, C).
    pub x: &'a Tensor,
    /// The self-attention mask.
    pub mask: Option<&'a Mask>,
    /// Train (with the dropout RNG) or eval.
    pub mode: Mode<'a>,
    /// How the pass will be differentiated.
    pub backprop: Backprop<'a>,
    /// The products' arithmetic when differentiated `Direct` ([`Pass::precision`]).
    pub precision: Precision,
}

/// One call of a decoder layer over the whole encoder output, without attention weights
/// and without a cache (the other calls run the composed layer).
#[derive(Debug, Clone, Copy)]
pub struct DecoderLayerCall<'a> {
    /// The layer's input, (B, T, C).
    pub x: &'a Tensor,
    /// The encoder output, (B, S, C).
    pub memory: &'a Tensor,
    /// The self-attention mask.
    pub self_mask: Option<&'a Mask>,
    /// The encoder-decoder attention mask.
    pub memory_mask: Option<&'a Mask>,
    /// Train (with the dropout RNG) or eval.
    pub mode: Mode<'a>,
    /// How the pass will be differentiated.
    pub backprop: Backprop<'a>,
    /// The products' arithmetic when differentiated `Direct` ([`Pass::precision`]).
    pub precision: Precision,
}

/// An implementation of the layer kinds. `None` from a method (the default): this backend
/// does not cover the call, and the composed layer runs.
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// What this backend is and why it was chosen, one line for the log.
    fn describe(&self) -> String;
    /// Mixed precision for one training pass whose products are to run in `precision`: a
    /// guard that makes the composed layers' products bf16 while it lives (PyTorch's
    /// autocast, [`kernels::autocast`]), or `None` where the products stay f32 or a backend
    /// lowers them by its own means. The default: the guard for [`Precision::Bf16`].
    fn mixed_precision(&self, precision: Precision) -> Option<kernels::autocast::Bf16Products> {
        (precision == Precision::Bf16).then(kernels::autocast::Bf16Products::on)
    }
    /// Runs one encoder layer, or `None`.
    fn encoder_layer(
        &self,
        _layer: &EncoderLayerParts<'_>,
        _call: LayerCall<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
    /// Runs one decoder layer, or `None`.
    fn decoder_layer(
        &self,
        _layer: &DecoderLayerParts<'_>,
        _call: DecoderLayerCall<'_>,
    ) -> Result<Option<Tensor>> {
        Ok(None)
    }
    /// The whole decoder as one fused decoding step with its own caches, its weights made
    /// ready for many batches in `precision`, or `None` (the default: decoding steps through
    /// the composed layers with their key/value caches, in f32).
    fn decoding_stack(
        &self,
        _layers: &[DecoderLayerParts<'_>],
        _final_norm: Option<&LayerNorm>,
        _precision: DecodePrecision,
    ) -> Result<Option<DecodingStack>> {
        Ok(None)
    }
    /// The output layer `output` as decoding runs it in `precision`. The default: f32.
    fn output_layer(&self, output: &Linear, _precision: DecodePrecision) -> Result<OutputLayer> {
        OutputLayer::new(output, None)
    }
}

/// The backend a model's stacks run through is chosen when the model is built: the
/// builder's ([`crate::ParamBuilder::with_backend`]), else the one for its device ([`choose`]).
impl crate::params::ParamBuilder {
    /// The same builder, whose models run their encoder and decoder layers, and decoding,
    /// through `backend` (a test's toy backend, say) instead of the one their device gets
    /// ([`choose`]).
    pub fn with_backend(self, backend: Arc<dyn Backend>) -> Self {
        self.keep_backend(Arc::new(backend))
    }

    /// The backend of the stacks built here: [`Self::with_backend`]'s, else [`choose`]'s.
    pub fn backend(&self) -> Arc<dyn Backend> {
        match self.kept_backend() {
            Some(kept) => kept
                .downcast_ref::<Arc<dyn Backend>>()
                .expect("with_backend keeps an Arc<dyn Backend>")
                .clone(),
            None => choose(&self.device()),
        }
    }
}

/// The backend for stacks whose parameters live on `device`: [`CpuFused`] on the CPU (its
/// kernels cover CPU f32 and f64 tensors), [`Composed`] elsewhere.
pub fn choose(device: &Device) -> Arc<dyn Backend> {
    if device.is_cpu() {
        Arc::new(CpuFused)
    } else {
        Arc::new(Composed)
    }
}

/// Every layer composed of candle ops (the paper's modules as written).
#[derive(Debug, Clone, Copy, Default)]
pub struct Composed;

impl Backend for Composed {
    fn describe(&self) -> String {
        "composed layers (candle ops; bf16 products under mixed precision): the parameters \
         are not on the CPU"
            .into()
    }
}

/// Encoder and decoder layers as one fused CPU op each ([`kernels::encoder_layer`],
/// [`kernels::decoder_layer`]; f32 or bf16 products) and decoding as one fused step
/// ([`kernels::DecoderStack`]) where the call allows it, the composed layers elsewhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuFused;

impl Backend for CpuFused {
    fn describe(&self) -> String {
        "fused CPU layers (f32, bf16 products when asked) where a pass keeps no attention \
         weights and no cache, composed layers elsewhere: the parameters are on the CPU"
            .into()
    }

    /// None: the fused kernels take the precision themselves ([`Pass::precision`]), as bf16
    /// products on the AMX units or AVX512-BF16 ([`kernels::bf16`]).
    fn mixed_precision(&self, _precision: Precision) -> Option<kernels::autocast::Bf16Products> {
        None
    }

    /// The layer as one fused op when it applies (a ReLU or GELU layer on CPU f32 tensors,
    /// f64 too without gradients; with `Direct`, an input that is part of a graph and
    /// parameters that are variables). Draws the same dropout streams as the composed layer,
    /// in the same order.
    fn encoder_layer(
        &self,
        layer: &EncoderLayerParts<'_>,
        call: LayerCall<'_>,
    ) -> Result<Option<Tensor>> {
        let LayerCall {
            x,
            mask,
            mode,
            backprop,
            precision,
        } = call;
        let (grads, precision) = match backprop {
            Backprop::Graph => return Ok(None),
            Backprop::Direct(g) => (Some(g), precision),
            Backprop::Off => (None, Precision::F32),
        };
        let EncoderLayerParts {
            self_attn,
            ff,
            norm1,
            norm2,
            dropout,
            norm_first,
        } = *layer;
        let (linear1, linear2, activation, ff_dropout) = ff.parts();
        let [q, k, v, out] = self_attn.projections();
        let (n1_w, n1_b, eps) = norm1.parts();
        let (n2_w, n2_b, eps2) = norm2.parts();
        let p = dropout.p();
        let biased = [q, k, v, out, linear1, linear2].map(|l| l.bias());
        let [Some(qb), Some(kb), Some(vb), Some(ob), Some(l1b), Some(l2b)] = biased else {
            return Ok(None);
        };
        let params = EncoderLayerParams::new(
            (q.weight(), qb),
            (k.weight(), kb),
            (v.weight(), vb),
            (out.weight(), ob),
            (linear1.weight(), l1b),
            (linear2.weight(), l2b),
            (n1_w, n1_b),
            (n2_w, n2_b),
        );
        let same_dropout = self_attn.dropout().p() == p && ff_dropout.p() == p;
        let (_, t, _) = x.dims3()?;
        let applies = eps == eps2
            && same_dropout
            && mask.is_none_or(|m| m.keep().dim(3).is_ok_and(|s| s == t))
            && kernels::encoder_layer_applies(x, &params, grads.is_some())
            && grads.is_none_or(|_| x.track_op() && params.all_accepted_by_direct_grads());
        if !applies {
            return Ok(None);
        }
        let dropout = match mode {
            Mode::Train(rng) if p > 0.0 => Some(LayerDropout {
                p,
                seed: rng.state().0,
                streams: std::array::from_fn(|_| rng.next_stream()),
            }),
            _ => None,
        };
        let opts = EncoderLayerOptions {
            nhead: self_attn.nhead(),
            layer_norm_eps: eps,
            norm_first,
            precision,
            activation: activation.into(),
        };
        let (keep, lengths) = (mask.map(|m| m.keep()), mask.and_then(|m| m.lengths()));
        kernels::encoder_layer(x, &params, opts, keep, lengths, dropout, grads).map(Some)
    }

    /// The layer as one fused op ([`kernels::decoder_layer`]) whose parameters' gradients go
    /// to `DirectGrads` when it applies (training with `Direct`: a ReLU or GELU layer on CPU
    /// f32 tensors, one dropout probability, inputs that are part of a graph and parameters
    /// that are variables). Draws the same dropout streams as the composed layer, in the
    /// same order.
    fn decoder_layer(
        &self,
        layer: &DecoderLayerParts<'_>,
        call: DecoderLayerCall<'_>,
    ) -> Result<Option<Tensor>> {
        let DecoderLayerCall {
            x,
            memory,
            self_mask,
            memory_mask,
            mode,
            backprop,
            precision: products,
        } = call;
        let Backprop::Direct(grads) = backprop else {
            return Ok(None);
        };
        let Some((params, eps)) = kernel_params(layer) else {
            return Ok(None);
        };
        let DecoderLayerParts {
            self_attn,
            cross_attn,
            ff,
            dropout,
            norm_first,
            ..
        } = *layer;
        let (linear1, _, activation, ff_dropout) = ff.parts();
        let p = dropout.p();
        let same_dropout =
            self_attn.dropout().p() == p && cross_attn.dropout().p() == p && ff_dropout.p() == p;
        let (b, t, _) = x.dims3()?;
        let s = memory.dim(1)?;
        let f32_cpu = |t: &Tensor| t.dtype() == candle_core::DType::F32 && t.device().is_cpu();
        let applies = same_dropout
            && f32_cpu(x)
            && f32_cpu(memory)
            && f32_cpu(linear1.weight())
            && self_mask.is_none_or(|m| m.keep().dims().last() == Some(&t))
            && memory_mask.is_none_or(|m| {
                let d = m.keep().dims();
                d.len() == 4 && d[2] == 1 && d[3] == s && (d[0] == 1 || d[0] == b)
            })
            && (x.track_op() || memory.track_op())
            && params.all_accepted_by_direct_grads();
        if !applies {
            return Ok(None);
        }
        let dropout = match mode {
            Mode::Train(rng) if p > 0.0 => Some(kernels::DecoderLayerDropout {
                p,
                seed: rng.state().0,
                streams: std::array::from_fn(|_| rng.next_stream()),
            }),
            _ => None,
        };
        // Padding rows are skipped where a mask declares lengths; the other side's are then
        // all real.
        let lengths = match (
            self_mask.and_then(|m| m.lengths()),
            memory_mask.and_then(|m| m.lengths()),
        ) {
            (None, None) => None,
            (tl, sl) => Some((
                tl.map_or_else(|| vec![t; b], <[usize]>::to_vec),
                sl.map_or_else(|| vec![s; b], <[usize]>::to_vec),
            )),
        };
        let opts = EncoderLayerOptions {
            nhead: self_attn.nhead(),
            layer_norm_eps: eps,
            norm_first,
            precision: products,
            activation: activation.into(),
        };
        kernels::decoder_layer(
            x,
            memory,
            &params,
            opts,
            self_mask.map(|m| m.keep()),
            memory_mask.map(|m| m.keep()),
            lengths.as_ref().map(|(t, s)| (&t[..], &s[..])),
            dropout,
            Some(grads),
        )
        .map(Some)
    }

    /// The stack as one fused decoding step ([`kernels::DecoderStack`]) when it applies
    /// (layers with biases and one activation, one layer-norm epsilon, CPU f32 contiguous parameters), its
    /// weights transposed once, or quantized to int8 with this CPU's fastest int8 kernel
    /// when `precision` asks.
    fn decoding_stack(
        &self,
        layers: &[DecoderLayerParts<'_>],
        norm: Option<&LayerNorm>,
        precision: DecodePrecision,
    ) -> Result<Option<DecodingStack>> {
        let Some(stack) = fused_decoding_stack(layers, norm) else {
            return Ok(None);
        };
        match precision.int8_layers() {
            true => stack.with_int8_weights(kernels::int8::Int8Kernel::detect()),
            false => stack.with_transposed_weights(),
        }
        .map(Some)
    }

    /// The output layer in int8 with this CPU's fastest int8 kernel when `precision` asks,
    /// else in f32.
    fn output_layer(&self, output: &Linear, precision: DecodePrecision) -> Result<OutputLayer> {
        let int8 = precision.int8_output();
        OutputLayer::new(output, int8.then(kernels::int8::Int8Kernel::detect))
    }
}

/// The decoder `layers` (and final norm) as the CPU's fused decoding step, when it fits it:
/// layers with biases and one activation, one layer-norm epsilon, CPU f32 contiguous parameters.
fn fused_decoding_stack(
    layers: &[DecoderLayerParts<'_>],
    norm: Option<&LayerNorm>,
) -> Option<DecodingStack> {
    let first = layers.first()?;
    let eps = first.norms[0].parts().2;
    let mut params = Vec::with_capacity(layers.len());
    for l in layers {
        let (p, e) = kernel_params(l)?;
        if e != eps {
            return None;
        }
        params.push(p);
    }
    let final_norm = match norm {
        Some(n) => {
            let (w, b, e) = n.parts();
            if e != eps {
                return None;
            }
            Some((w.clone(), b.clone()))
        }
        None => None,
    };
    let (nhead, norm_first) = (first.self_attn.nhead(), first.norm_first);
    let activation = first.ff.parts().2;
    if layers.iter().any(|l| l.ff.parts().2 != activation) {
        return None;
    }
    let options = kernels::StackOptions {
        nhead,
        eps,
        norm_first,
        activation: activation.into(),
    };
    let stack = kernels::DecoderStack::new(params, final_norm, options);
    stack.applies().then_some(stack)
}

/// The layer's parameters in the fused kernels' layout and its layer norms' epsilon, for
/// a layer with biases whose three norms share one epsilon; `None` otherwise.
fn kernel_params(l: &DecoderLayerParts) -> Option<(kernels::DecoderLayerParams, f64)> {
    let (linear1, linear2, _, _) = l.ff.parts();
    let affine = |lin: &'_ crate::linear::Linear| -> Option<(Tensor, Tensor)> {
        Some((lin.weight().clone(), lin.bias()?.clone()))
    };
    let proj = |m: &MultiHeadAttention| -> Option<[(Tensor, Tensor); 4]> {
        let [q, k, v, o] = m.projections();
        Some([affine(q)?, affine(k)?, affine(v)?, affine(o)?])
    };
    let (sa, ca) = (proj(l.self_attn)?, proj(l.cross_attn)?);
    let (l1, l2) = (affine(linear1)?, affine(linear2)?);
    let norms = l.norms.map(|n| n.parts());
    let eps = norms[0].2;
    if norms.iter().any(|n| n.2 != eps) {
        return None;
    }
    let params = kernels::DecoderLayerParams::new(
        [pair(&sa[0]), pair(&sa[1]), pair(&sa[2]), pair(&sa[3])],
        [pair(&ca[0]), pair(&ca[1]), pair(&ca[2]), pair(&ca[3])],
        pair(&l1),
        pair(&l2),
        norms.map(|n| (n.0, n.1)),
    );
    Some((params, eps))
}

/// A weight and bias pair as references.
fn pair(p: &(Tensor, Tensor)) -> (&Tensor, &Tensor) {
    (&p.0, &p.1)
}

impl From<Activation> for transformer_kernels::Activation {
    /// The fused kernels' own name for the activation.
    fn from(a: Activation) -> Self {
        match a {
            Activation::Relu => Self::Relu,
            Activation::Gelu => Self::Gelu,
            Activation::GeluTanh => Self::GeluTanh,
            Activation::Swish => Self::Swish,
        }
    }
}
