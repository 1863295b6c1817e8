//! The encoder (section 3.1): a stack of N identical layers, each a self-attention sub-layer
//! and a feed-forward sub-layer, each wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
//! (post-norm, the paper) or `x + Dropout(Sublayer(LayerNorm(x)))` (`norm_first`).

use crate::backend::{Backend, EncoderLayerParts, LayerCall, Pass};
use crate::dropout::{Dropout, Mode};
use crate::feed_forward::FeedForward;
use crate::layer_norm::LayerNorm;
use crate::mask::Mask;
use crate::multi_head::{KvCache, MultiHeadAttention};
use crate::params::ParamBuilder;
use crate::stack::{LayerSpec, Stack, StackLayer};
use crate::Result;
use candle_core::Tensor;

/// A residual sub-layer connection (section 5.4 "Residual Dropout" and section 3.1):
/// post-norm `norm(x + dropout(f(x)))` or pre-norm `x + dropout(f(norm(x)))`.
pub(crate) fn residual(
    x: &Tensor,
    norm: &LayerNorm,
    norm_first: bool,
    dropout: Dropout,
    mode: Mode,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let (y, ()) = residual_with(x, norm, norm_first, dropout, mode, |h| Ok((f(h)?, ())))?;
    Ok(y)
}

/// [`residual`] around a sub-layer that also gives something beside its output (attention
/// its weights), which comes back untouched.
pub(crate) fn residual_with<W>(
    x: &Tensor,
    norm: &LayerNorm,
    norm_first: bool,
    dropout: Dropout,
    mode: Mode,
    f: impl FnOnce(&Tensor) -> Result<(Tensor, W)>,
) -> Result<(Tensor, W)> {
    if norm_first {
        let (y, w) = f(&norm.forward(x)?)?;
        Ok(((x + dropout.forward(&y, mode)?)?, w))
    } else {
        let (y, w) = f(x)?;
        Ok((norm.forward(&(x + dropout.forward(&y, mode)?)?)?, w))
    }
}

/// One encoder layer: self-attention and a feed-forward network, each a residual sub-layer
/// with layer normalisation (post-norm or `norm_first`).
#[derive(Debug, Clone)]
pub struct EncoderLayer {
    self_attn: MultiHeadAttention,
    ff: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    dropout: Dropout,
    norm_first: bool,
}

impl EncoderLayer {
    /// Creates the layer's parameters under `pb` with PyTorch's names (`self_attn`,
    /// `linear1`, `linear2`, `norm1`, `norm2`).
    pub fn new(pb: &ParamBuilder, spec: &LayerSpec) -> Result<Self> {
        Ok(Self {
            self_attn: MultiHeadAttention::new(
                &pb.pp("self_attn"),
                spec.d_model,
                spec.nhead,
                spec.dropout,
                true,
            )?,
            ff: FeedForward::new(
                pb,
                spec.d_model,
                spec.dim_feedforward,
                spec.activation,
                spec.dropout,
            )?,
            norm1: LayerNorm::new(&pb.pp("norm1"), spec.d_model, spec.layer_norm_eps)?,
            norm2: LayerNorm::new(&pb.pp("norm2"), spec.d_model, spec.layer_norm_eps)?,
            dropout: Dropout::new(spec.dropout),
            norm_first: spec.norm_first,
        })
    }

    /// Returns the layer output and the self-attention weights.
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C), weights (B, H, S, S)
    pub fn forward(&self, x: &Tensor, mask: Option<&Mask>, mode: Mode) -> Result<(Tensor, Tensor)> {
        self.forward_cached(x, mask, None, mode)
    }

    /// As [`EncoderLayer::forward`], attending also over (and extending) `cache` when given;
    /// the mask then covers all keys, `(T, S + T)`.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        cache: Option<&mut KvCache>,
        mode: Mode,
    ) -> Result<(Tensor, Tensor)> {
        let (x, weights) = self.run(x, mask, cache, mode, true)?;
        Ok((x, weights.expect("weights were asked for")))
    }

    /// The layer's parts, for a [`Backend`] that runs it another way.
    pub(crate) fn parts(&self) -> EncoderLayerParts<'_> {
        EncoderLayerParts {
            self_attn: &self.self_attn,
            ff: &self.ff,
            norm1: &self.norm1,
            norm2: &self.norm2,
            dropout: self.dropout,
            norm_first: self.norm_first,
        }
    }

    /// The composed layer; the attention weights only with `need_weights` (without them,
    /// attention runs as one fused op that keeps nothing of them).
    fn run(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        cache: Option<&mut KvCache>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (x, weights) =
            residual_with(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
                self.self_attn
                    .self_attention(h, cache, mask, mode, need_weights)
            })?;
        let x = residual(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })?;
        Ok((x, weights))
    }
}

/// N encoder layers and an optional final LayerNorm ([`Stack`]: `nn.TransformerEncoder`'s
/// `norm`; `nn.Transformer` has one, the tutorial language model does not). Each layer call
/// goes through the stack's backend, which runs it or leaves it to the composed layer.
pub type Encoder = Stack<EncoderLayer>;

impl Stack<EncoderLayer> {
    /// Runs every layer, then the final norm if any.
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C)
    pub fn forward(&self, x: &Tensor, mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        Ok(self.forward_as(x, mask, Pass::new(mode))?.0)
    }

    /// [`Self::forward`] differentiated as `pass.backprop` says: through the graph; with the
    /// parameter gradients of each layer the backend runs as one fused op delivered to
    /// `DirectGrads` instead of candle's `GradStore` (the input's gradient, and any composed
    /// layer's and the final norm's, go through the graph as usual; the same result summed in
    /// another order); or not at all (evaluation: a fused layer builds no graph and keeps
    /// nothing for a backward pass). Each layer's self-attention weights, (B, H, S, S), come
    /// back when `pass` asks for them ([`Pass::weights`]; those layers run composed).
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C) and the weights
    pub fn forward_as(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        pass: Pass,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        self.run(x, mask, None, pass)
    }

    /// Runs new positions over `caches` (one per layer, extended in place); the mask covers
    /// all keys, `(T, S + T)`.
    ///
    /// # Shapes
    /// x (B, T, C) -> (B, T, C)
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        caches: &mut [KvCache],
        mode: Mode,
    ) -> Result<Tensor> {
        if caches.len() != self.layers.len() {
            candle_core::bail!("{} caches for {} layers", caches.len(), self.layers.len());
        }
        Ok(self.run(x, mask, Some(caches), Pass::new(mode))?.0)
    }
}

impl StackLayer for EncoderLayer {
    type Weights = Tensor;
    type Inputs<'a> = Option<&'a Mask>;

    fn build(pb: &ParamBuilder, spec: &LayerSpec) -> Result<Self> {
        EncoderLayer::new(pb, spec)
    }

    fn by_backend(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        mask: Option<&Mask>,
        _: usize,
        pass: Pass,
    ) -> Result<Option<Tensor>> {
        let call = LayerCall {
            x,
            mask,
            mode: pass.mode,
            backprop: pass.backprop,
            precision: pass.precision,
        };
        backend.encoder_layer(&self.parts(), call)
    }

    fn composed(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        _: usize,
        cache: Option<&mut KvCache>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        self.run(x, mask, cache, mode, need_weights)
    }
}
