//! The encoder (section 3.1): a stack of N identical layers, each a self-attention sub-layer
//! and a feed-forward sub-layer, each wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
//! (post-norm, the paper) or `x + Dropout(Sublayer(LayerNorm(x)))` (`norm_first`).

use crate::config::Activation;
use crate::dropout::{Dropout, Mode};
use crate::feed_forward::FeedForward;
use crate::grads::DirectGrads;
use crate::kernels::{self, EncoderLayerOptions, EncoderLayerParams, LayerDropout};
use crate::layer_norm::LayerNorm;
use crate::mask::Mask;
use crate::multi_head::{KvCache, MultiHeadAttention};
use crate::params::ParamBuilder;
use crate::Result;
use candle_core::Tensor;

/// The sizes and options one layer needs (a view of the model configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    /// Model width C (`d_model`).
    pub d_model: usize,
    /// Attention heads H; must divide `d_model`.
    pub nhead: usize,
    /// Inner feed-forward width F (`d_ff`).
    pub dim_feedforward: usize,
    /// Dropout probability for the residual, attention and feed-forward dropouts.
    pub dropout: f64,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Epsilon added to the variance in each layer norm.
    pub layer_norm_eps: f64,
    /// Pre-norm (`x + f(norm(x))`) instead of post-norm (`norm(x + f(x))`).
    pub norm_first: bool,
}

impl From<&crate::config::TransformerConfig> for LayerSpec {
    fn from(c: &crate::config::TransformerConfig) -> Self {
        Self {
            d_model: c.d_model,
            nhead: c.nhead,
            dim_feedforward: c.dim_feedforward,
            dropout: c.dropout,
            activation: c.activation,
            layer_norm_eps: c.layer_norm_eps,
            norm_first: c.norm_first,
        }
    }
}

/// How the caller will differentiate a forward pass, which decides whether a layer may run
/// as one fused op ([`kernels::encoder_layer`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backprop<'a> {
    /// Through candle's graph (`loss.backward()`): the composed layer.
    Graph,
    /// The parameters' gradients into `DirectGrads`, the input's through the graph; the
    /// fused layers' products in the given arithmetic ([`EncoderLayerOptions::precision`]).
    Direct(&'a DirectGrads, kernels::Precision),
    /// Not at all (evaluation): no graph is built.
    Off,
}

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
    if norm_first {
        x + dropout.forward(&f(&norm.forward(x)?)?, mode)?
    } else {
        norm.forward(&(x + dropout.forward(&f(x)?, mode)?)?)
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
        let (x, weights) = self.run(x, mask, cache, mode, true, Backprop::Graph)?;
        Ok((x, weights.expect("weights were asked for")))
    }

    /// The layer as one fused op ([`kernels::encoder_layer`]) when it applies (a ReLU or GELU layer
    /// on CPU f32 tensors, f64 too without gradients; with `Direct`, an input that is part of
    /// a graph and parameters that are variables); `None` otherwise. Draws the same dropout
    /// streams as the composed layer, in the same order.
    fn fused(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Option<Tensor>> {
        let (grads, precision) = match backprop {
            Backprop::Graph => return Ok(None),
            Backprop::Direct(g, p) => (Some(g), p),
            Backprop::Off => (None, kernels::Precision::F32),
        };
        let (linear1, linear2, activation, ff_dropout) = self.ff.parts();
        let [q, k, v, out] = self.self_attn.projections();
        let (n1_w, n1_b, eps) = self.norm1.parts();
        let (n2_w, n2_b, eps2) = self.norm2.parts();
        let p = self.dropout.p();
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
        let same_dropout = self.self_attn.dropout().p() == p && ff_dropout.p() == p;
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
            nhead: self.self_attn.nhead(),
            layer_norm_eps: eps,
            norm_first: self.norm_first,
            precision,
            activation: activation.into(),
        };
        let (keep, lengths) = (mask.map(|m| m.keep()), mask.and_then(|m| m.lengths()));
        kernels::encoder_layer(x, &params, opts, keep, lengths, dropout, grads).map(Some)
    }

    /// The layer; the attention weights only with `need_weights` (without them, attention
    /// runs as one fused op that keeps nothing of them).
    fn run(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        cache: Option<&mut KvCache>,
        mode: Mode,
        need_weights: bool,
        backprop: Backprop,
    ) -> Result<(Tensor, Option<Tensor>)> {
        if !need_weights && cache.is_none() {
            if let Some(y) = self.fused(x, mask, mode, backprop)? {
                return Ok((y, None));
            }
        }
        let mut weights = None;
        let x = residual(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
            if !need_weights {
                return self.self_attn.self_attention_output(h, cache, mask, mode);
            }
            let (out, w) = match cache {
                Some(cache) => self.self_attn.forward_cached(h, cache, mask, mode)?,
                None => self.self_attn.forward(h, h, h, mask, mode)?,
            };
            weights = Some(w);
            Ok(out)
        })?;
        let x = residual(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })?;
        Ok((x, weights))
    }
}

/// N encoder layers and an optional final LayerNorm (`nn.TransformerEncoder`'s `norm`;
/// `nn.Transformer` has one, the tutorial language model does not).
#[derive(Debug, Clone)]
pub struct Encoder {
    layers: Vec<EncoderLayer>,
    norm: Option<LayerNorm>,
}

impl Encoder {
    /// Layers are named `<pb>.layers.<i>`, the final norm `<pb>.norm`.
    pub fn new(
        pb: &ParamBuilder,
        spec: &LayerSpec,
        num_layers: usize,
        final_norm: bool,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|i| EncoderLayer::new(&pb.pp("layers").pp(i), spec))
            .collect::<Result<_>>()?;
        let norm = if final_norm {
            Some(LayerNorm::new(
                &pb.pp("norm"),
                spec.d_model,
                spec.layer_norm_eps,
            )?)
        } else {
            None
        };
        Ok(Self { layers, norm })
    }

    /// Runs every layer, then the final norm if any.
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C)
    pub fn forward(&self, x: &Tensor, mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        Ok(self.run(x, mask, None, mode, false, Backprop::Graph)?.0)
    }

    /// [`Self::forward`] whose backward pass delivers the layers' parameter gradients to
    /// `grads` instead of candle's `GradStore` where each layer runs as one fused op
    /// ([`kernels::encoder_layer`]: ReLU or GELU layers on CPU f32); the input's gradient (and any
    /// layer's that cannot be fused, and the final norm's) go through the graph as usual.
    /// The same result as [`Self::forward`], summed in another order.
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C)
    pub fn forward_direct(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        mode: Mode,
        grads: &DirectGrads,
        products: kernels::Precision,
    ) -> Result<Tensor> {
        Ok(self
            .run(
                x,
                mask,
                None,
                mode,
                false,
                Backprop::Direct(grads, products),
            )?
            .0)
    }

    /// [`Self::forward`] for evaluation without gradients: each layer that can runs as one
    /// fused op that builds no graph and keeps nothing for a backward pass.
    ///
    /// # Shapes
    /// x (B, S, C), mask broadcastable to (B, H, S, S) -> (B, S, C)
    pub fn forward_no_grad(&self, x: &Tensor, mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        Ok(self.run(x, mask, None, mode, false, Backprop::Off)?.0)
    }

    /// Also returns each layer's self-attention weights, (B, H, S, S) each.
    pub fn forward_with_weights(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        self.run(x, mask, None, mode, true, Backprop::Graph)
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
        Ok(self
            .run(x, mask, Some(caches), mode, false, Backprop::Graph)?
            .0)
    }

    /// The number of layers N in the stack.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The stack; each layer's attention weights only with `need_weights` (else empty).
    fn run(
        &self,
        x: &Tensor,
        mask: Option<&Mask>,
        mut caches: Option<&mut [KvCache]>,
        mode: Mode,
        need_weights: bool,
        backprop: Backprop,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let mut x = x.clone();
        let mut weights = Vec::with_capacity(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            let (y, w) = layer.run(&x, mask, cache, mode, need_weights, backprop)?;
            x = y;
            weights.extend(w);
        }
        if let Some(norm) = &self.norm {
            x = norm.forward(&x)?;
        }
        Ok((x, weights))
    }
}
