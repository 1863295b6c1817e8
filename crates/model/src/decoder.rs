//! The decoder (section 3.1): N identical layers, each masked self-attention, attention over
//! the encoder output (encoder-decoder attention, section 3.2.3) and a feed-forward network,
//! each wrapped in a residual connection with layer normalisation.

use crate::dropout::{Dropout, Mode};
use crate::encoder::{residual, LayerSpec};
use crate::feed_forward::FeedForward;
use crate::grads::DirectGrads;
use crate::kernels;
use crate::layer_norm::LayerNorm;
use crate::mask::Mask;
use crate::multi_head::{KvCache, MultiHeadAttention};
use crate::params::ParamBuilder;
use crate::Result;
use candle_core::Tensor;

/// The attention weights of one decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderWeights {
    /// Masked self-attention, (B, H, T, T).
    pub self_attn: Tensor,
    /// Encoder-decoder attention, (B, H, T, S): which source word each target word attends to.
    pub cross_attn: Tensor,
}

/// One decoder layer: masked self-attention, encoder-decoder attention and a feed-forward
/// network, each a residual sub-layer with layer normalisation (post-norm or `norm_first`).
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    self_attn: MultiHeadAttention,
    /// Encoder-decoder attention; named `multihead_attn` as in PyTorch.
    multihead_attn: MultiHeadAttention,
    ff: FeedForward,
    norm1: LayerNorm,
    norm2: LayerNorm,
    norm3: LayerNorm,
    dropout: Dropout,
    norm_first: bool,
}

impl DecoderLayer {
    /// Creates the layer's parameters under `pb` with PyTorch's names (`self_attn`,
    /// `multihead_attn`, `linear1`, `linear2`, `norm1`..`norm3`).
    pub fn new(pb: &ParamBuilder, spec: &LayerSpec) -> Result<Self> {
        let mha = |name| {
            MultiHeadAttention::new(&pb.pp(name), spec.d_model, spec.nhead, spec.dropout, true)
        };
        let norm = |name| LayerNorm::new(&pb.pp(name), spec.d_model, spec.layer_norm_eps);
        Ok(Self {
            self_attn: mha("self_attn")?,
            multihead_attn: mha("multihead_attn")?,
            ff: FeedForward::new(
                pb,
                spec.d_model,
                spec.dim_feedforward,
                spec.activation,
                spec.dropout,
            )?,
            norm1: norm("norm1")?,
            norm2: norm("norm2")?,
            norm3: norm("norm3")?,
            dropout: Dropout::new(spec.dropout),
            norm_first: spec.norm_first,
        })
    }

    /// The layer's parameters in the fused kernels' layout and its layer norms' epsilon, for
    /// a layer with biases whose three norms share one epsilon; `None` otherwise.
    fn kernel_params(&self) -> Option<(kernels::DecoderLayerParams, f64)> {
        let (linear1, linear2, _, _) = self.ff.parts();
        let affine = |lin: &'_ crate::linear::Linear| -> Option<(Tensor, Tensor)> {
            Some((lin.weight().clone(), lin.bias()?.clone()))
        };
        let proj = |m: &MultiHeadAttention| -> Option<[(Tensor, Tensor); 4]> {
            let [q, k, v, o] = m.projections();
            Some([affine(q)?, affine(k)?, affine(v)?, affine(o)?])
        };
        let (sa, ca) = (proj(&self.self_attn)?, proj(&self.multihead_attn)?);
        let (l1, l2) = (affine(linear1)?, affine(linear2)?);
        let norms = [&self.norm1, &self.norm2, &self.norm3].map(|n| n.parts());
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

    /// [`Self::forward_no_weights`] as one fused op ([`kernels::decoder_layer`]) whose
    /// parameters' gradients go to `grads` when it applies (a ReLU or GELU layer on CPU f32 tensors,
    /// one dropout probability, inputs that are part of a graph and parameters that are
    /// variables); `None` otherwise. Draws the same dropout streams as the composed layer, in
    /// the same order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fused_direct(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
        grads: &DirectGrads,
        products: kernels::Precision,
    ) -> Result<Option<Tensor>> {
        let Some((params, eps)) = self.kernel_params() else {
            return Ok(None);
        };
        let (linear1, _, activation, ff_dropout) = self.ff.parts();
        let p = self.dropout.p();
        let same_dropout = self.self_attn.dropout().p() == p
            && self.multihead_attn.dropout().p() == p
            && ff_dropout.p() == p;
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
        let opts = kernels::EncoderLayerOptions {
            nhead: self.self_attn.nhead(),
            layer_norm_eps: eps,
            norm_first: self.norm_first,
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

    /// [`Self::forward`] without the attention weights: both attentions run as the fused
    /// attention op, which keeps nothing of the (B, H, T, S) weights (training).
    ///
    /// # Shapes
    /// x (B, T, C), memory (B, S, C) -> (B, T, C)
    pub fn forward_no_weights(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<Tensor> {
        let x = residual(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
            self.self_attn
                .self_attention_output(h, None, self_mask, mode)
        })?;
        let x = residual(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
            self.multihead_attn
                .cross_attention_output(h, memory, memory_mask, mode)
        })?;
        residual(&x, &self.norm3, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })
    }

    /// Runs the layer on all target positions at once and returns both attentions' weights.
    ///
    /// # Shapes
    /// - x (B, T, C), memory (B, S, C)
    /// - self_mask broadcastable to (B, H, T, T), memory_mask to (B, H, T, S)
    /// - -> (B, T, C) and the layer's attention weights
    pub fn forward(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, DecoderWeights)> {
        let (mut self_w, mut cross_w) = (None, None);
        let x = residual(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
            let (out, w) = self.self_attn.forward(h, h, h, self_mask, mode)?;
            self_w = Some(w);
            Ok(out)
        })?;
        let x = residual(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
            let (out, w) = self
                .multihead_attn
                .forward(h, memory, memory, memory_mask, mode)?;
            cross_w = Some(w);
            Ok(out)
        })?;
        let x = residual(&x, &self.norm3, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })?;
        let weights = DecoderWeights {
            self_attn: self_w.expect("self-attention ran"),
            cross_attn: cross_w.expect("cross-attention ran"),
        };
        Ok((x, weights))
    }
}

impl DecoderLayer {
    /// Projects the encoder output into this layer's encoder-decoder keys and values, once
    /// per source sentence (every decoding step reuses them).
    ///
    /// # Shapes
    /// memory (B, S, C) -> (B, H, S, D) each
    pub fn project_memory(&self, memory: &Tensor) -> Result<(Tensor, Tensor)> {
        self.multihead_attn.project_kv(memory, memory)
    }

    /// New target positions over the cached ones (`cache`, extended with them) and over the
    /// projected memory: one step of incremental decoding. `self_mask` covers all
    /// self-attention keys, (T, cached + T); `None` for a single new position, which may
    /// attend to everything before it. Same result as [`Self::forward`] at those positions.
    ///
    /// # Shapes
    /// - x (B, T, C), memory_kv (B, H, S, D) each, memory_mask broadcastable to (B, H, T, S)
    /// - -> (B, T, C) and the attention weights (self: (B, H, T, cached + T), cross:
    ///   (B, H, T, S))
    pub fn forward_step(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        memory_kv: &(Tensor, Tensor),
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, DecoderWeights)> {
        let (mut self_w, mut cross_w) = (None, None);
        let x = residual(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
            let (out, w) = self.self_attn.forward_cached(h, cache, self_mask, mode)?;
            self_w = Some(w);
            Ok(out)
        })?;
        let x = residual(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
            let q = self.multihead_attn.project_q(h)?;
            let (out, w) =
                self.multihead_attn
                    .attend(&q, &memory_kv.0, &memory_kv.1, memory_mask, mode)?;
            cross_w = Some(w);
            Ok(out)
        })?;
        let x = residual(&x, &self.norm3, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })?;
        let weights = DecoderWeights {
            self_attn: self_w.expect("self-attention ran"),
            cross_attn: cross_w.expect("cross-attention ran"),
        };
        Ok((x, weights))
    }
}

/// A weight and bias pair as references.
fn pair(p: &(Tensor, Tensor)) -> (&Tensor, &Tensor) {
    (&p.0, &p.1)
}

/// N decoder layers and an optional final LayerNorm (`nn.TransformerDecoder`'s `norm`).
#[derive(Debug, Clone)]
pub struct Decoder {
    layers: Vec<DecoderLayer>,
    norm: Option<LayerNorm>,
}

impl Decoder {
    /// Layers are named `<pb>.layers.<i>`, the final norm `<pb>.norm`.
    pub fn new(
        pb: &ParamBuilder,
        spec: &LayerSpec,
        num_layers: usize,
        final_norm: bool,
    ) -> Result<Self> {
        let layers = (0..num_layers)
            .map(|i| DecoderLayer::new(&pb.pp("layers").pp(i), spec))
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

    /// Runs every layer, then the final norm if any, on all target positions at once.
    ///
    /// # Shapes
    /// x (B, T, C), memory (B, S, C) -> (B, T, C)
    pub fn forward(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward_no_weights(&x, memory, self_mask, memory_mask, mode)?;
        }
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }

    /// [`Self::forward`] for training with each layer that can as one fused op whose
    /// parameters' gradients go to `grads` ([`kernels::decoder_layer`]); the others, and
    /// the final norm, through candle's graph.
    ///
    /// # Shapes
    /// x (B, T, C), memory (B, S, C) -> (B, T, C)
    #[allow(clippy::too_many_arguments)]
    pub fn forward_direct(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
        grads: &DirectGrads,
        products: kernels::Precision,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = match layer.fused_direct(
                &x,
                memory,
                self_mask,
                memory_mask,
                mode,
                grads,
                products,
            )? {
                Some(y) => y,
                None => layer.forward_no_weights(&x, memory, self_mask, memory_mask, mode)?,
            };
        }
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Every layer's encoder-decoder keys and values ([`DecoderLayer::project_memory`]).
    ///
    /// # Shapes
    /// memory (B, S, C) -> one (B, H, S, D) pair per layer
    pub fn project_memory(&self, memory: &Tensor) -> Result<Vec<(Tensor, Tensor)>> {
        self.layers
            .iter()
            .map(|l| l.project_memory(memory))
            .collect()
    }

    /// One step of incremental decoding through the stack ([`DecoderLayer::forward_step`]):
    /// `caches` and `memory_kv` hold one entry per layer.
    ///
    /// # Shapes
    /// x (B, T, C) -> (B, T, C) and each layer's attention weights
    pub fn forward_step(
        &self,
        x: &Tensor,
        caches: &mut [KvCache],
        memory_kv: &[(Tensor, Tensor)],
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, Vec<DecoderWeights>)> {
        let n = self.layers.len();
        if caches.len() != n || memory_kv.len() != n {
            candle_core::bail!(
                "{} caches and {} memory projections for {n} decoder layers",
                caches.len(),
                memory_kv.len()
            );
        }
        let mut x = x.clone();
        let mut weights = Vec::with_capacity(n);
        for ((layer, cache), kv) in self.layers.iter().zip(caches).zip(memory_kv) {
            let (y, w) = layer.forward_step(&x, cache, kv, self_mask, memory_mask, mode)?;
            x = y;
            weights.push(w);
        }
        if let Some(norm) = &self.norm {
            x = norm.forward(&x)?;
        }
        Ok((x, weights))
    }

    /// The stack as one fused decoding step ([`kernels::DecoderStack`]) when it applies:
    /// ReLU layers with biases, one layer-norm epsilon, CPU f32 contiguous parameters.
    pub fn fused_stack(&self) -> Option<kernels::DecoderStack> {
        let first = self.layers.first()?;
        let (_, _, eps) = first.norm1.parts();
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            if l.ff.parts().2 != crate::config::Activation::Relu {
                return None;
            }
            let (params, e) = l.kernel_params()?;
            if e != eps {
                return None;
            }
            layers.push(params);
        }
        let final_norm = match &self.norm {
            Some(n) => {
                let (w, b, e) = n.parts();
                if e != eps {
                    return None;
                }
                Some((w.clone(), b.clone()))
            }
            None => None,
        };
        let stack = kernels::DecoderStack::new(
            layers,
            final_norm,
            first.self_attn.nhead(),
            eps,
            first.norm_first,
        );
        stack.applies().then_some(stack)
    }

    /// Also returns every layer's attention weights.
    pub fn forward_with_weights(
        &self,
        x: &Tensor,
        memory: &Tensor,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<(Tensor, Vec<DecoderWeights>)> {
        let mut x = x.clone();
        let mut weights = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (y, w) = layer.forward(&x, memory, self_mask, memory_mask, mode)?;
            x = y;
            weights.push(w);
        }
        if let Some(norm) = &self.norm {
            x = norm.forward(&x)?;
        }
        Ok((x, weights))
    }
}
