//! The decoder (section 3.1): N identical layers, each masked self-attention, attention over
//! the encoder output (encoder-decoder attention, section 3.2.3) and a feed-forward network,
//! each wrapped in a residual connection with layer normalisation.

pub use crate::backend::DecoderWeights;
use crate::backend::{self, Backend, DecoderLayerCall, DecoderLayerParts, Pass};
use crate::dropout::{Dropout, Mode};
use crate::encoder::{residual, residual_with};
use crate::feed_forward::FeedForward;
use crate::layer_norm::LayerNorm;
use crate::mask::Mask;
use crate::multi_head::{KvCache, MultiHeadAttention};
use crate::ops::Qkv;
use crate::params::ParamBuilder;
use crate::stack::{LayerSpec, Stack, StackLayer};
use crate::Result;
use candle_core::Tensor;

/// What the encoder-decoder attention attends to: the encoder output, or its keys and values
/// projected once per sentence for incremental decoding ([`DecoderLayer::project_memory`]).
#[derive(Debug, Clone, Copy)]
enum Memory<'a> {
    Full(&'a Tensor),
    Projected(&'a (Tensor, Tensor)),
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

    /// The layer's parts, for a [`Backend`] that runs it another way: self-attention,
    /// encoder-decoder attention, feed-forward, the three norms, the residual dropout and
    /// whether it is pre-norm.
    pub(crate) fn parts(&self) -> DecoderLayerParts<'_> {
        DecoderLayerParts {
            self_attn: &self.self_attn,
            cross_attn: &self.multihead_attn,
            ff: &self.ff,
            norms: [&self.norm1, &self.norm2, &self.norm3],
            dropout: self.dropout,
            norm_first: self.norm_first,
        }
    }

    /// Runs the layer, composed, on all target positions at once; returns both attentions'
    /// weights when `pass` asks for them (without them both attentions run as the fused
    /// attention op, which keeps nothing of the (B, H, T, S) weights). The composed layer is
    /// differentiated through candle's graph: `pass.backprop` matters to the stack, whose
    /// backend may run the layer another way.
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
        pass: Pass,
    ) -> Result<(Tensor, Option<DecoderWeights>)> {
        let memory = Memory::Full(memory);
        self.run(
            x,
            memory,
            None,
            self_mask,
            memory_mask,
            pass.mode,
            pass.weights,
        )
    }

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
        let memory = Memory::Projected(memory_kv);
        let (x, w) = self.run(x, memory, Some(cache), self_mask, memory_mask, mode, true)?;
        Ok((x, w.expect("weights were asked for")))
    }

    /// The composed layer: the three residual sub-layers, extending `cache` when given, the
    /// attention weights only with `need_weights` (without them, both attentions run as the
    /// fused attention op, which keeps nothing of them; over projected memory the weights
    /// are always computed).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        x: &Tensor,
        memory: Memory,
        cache: Option<&mut KvCache>,
        self_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<DecoderWeights>)> {
        let (x, self_w) =
            residual_with(x, &self.norm1, self.norm_first, self.dropout, mode, |h| {
                self.self_attn
                    .self_attention(h, cache, self_mask, mode, need_weights)
            })?;
        let (x, cross_w) =
            residual_with(&x, &self.norm2, self.norm_first, self.dropout, mode, |h| {
                let attn = &self.multihead_attn;
                let (out, w) = match memory {
                    Memory::Full(m) if !need_weights => {
                        return Ok((attn.cross_attention_output(h, m, memory_mask, mode)?, None))
                    }
                    Memory::Full(m) => attn.forward(h, m, m, memory_mask, mode)?,
                    Memory::Projected((k, v)) => attn.attend(
                        Qkv {
                            q: &attn.project_q(h)?,
                            k,
                            v,
                        },
                        memory_mask,
                        mode,
                    )?,
                };
                Ok((out, Some(w)))
            })?;
        let x = residual(&x, &self.norm3, self.norm_first, self.dropout, mode, |h| {
            self.ff.forward(h, mode)
        })?;
        let weights = match (self_w, cross_w) {
            (Some(self_attn), Some(cross_attn)) => Some(DecoderWeights {
                self_attn,
                cross_attn,
            }),
            _ => None,
        };
        Ok((x, weights))
    }
}

/// N decoder layers and an optional final LayerNorm ([`Stack`]: `nn.TransformerDecoder`'s
/// `norm`). Each layer call goes through the stack's backend, which runs it or leaves it to
/// the composed layer; the backend also makes the fused decoding step
/// ([`Decoder::fused_stack`]).
pub type Decoder = Stack<DecoderLayer>;

impl Stack<DecoderLayer> {
    /// Runs every layer, then the final norm if any, on all target positions at once,
    /// differentiated as `pass.backprop` says: through the graph, or with the parameter
    /// gradients of each layer the backend runs as one fused op delivered to
    /// `DirectGrads` (the others, and the final norm, through candle's graph). Every layer's
    /// attention weights come back when `pass` asks for them ([`Pass::weights`]).
    ///
    /// # Shapes
    /// x (B, T, C), `inputs` over memory (B, S, C) ([`DecoderInputs::full`]) -> (B, T, C)
    /// and the weights
    pub fn forward_as(
        &self,
        x: &Tensor,
        inputs: DecoderInputs,
        pass: Pass,
    ) -> Result<(Tensor, Vec<DecoderWeights>)> {
        self.run(x, inputs, None, pass)
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
        let inputs = DecoderInputs {
            memory: MemoryPerLayer::Projected(memory_kv),
            self_mask,
            memory_mask,
        };
        self.run(x, inputs, Some(caches), Pass::new(mode).weights())
    }

    /// The stack as one fused decoding step ([`backend::DecodingStack`]) with its weights
    /// made ready in `precision`, where the backend has one for this decoder (the CPU's:
    /// ReLU layers with biases, one layer-norm epsilon, CPU f32 contiguous parameters).
    pub fn fused_stack(
        &self,
        precision: backend::DecodePrecision,
    ) -> Result<Option<backend::DecodingStack>> {
        let layers: Vec<_> = self.layers.iter().map(DecoderLayer::parts).collect();
        self.backend
            .decoding_stack(&layers, self.norm.as_ref(), precision)
    }
}

/// The memory of every layer: the encoder output they share, or one projection each.
#[derive(Debug, Clone, Copy)]
enum MemoryPerLayer<'a> {
    Full(&'a Tensor),
    Projected(&'a [(Tensor, Tensor)]),
}

/// What every decoder layer of a pass reads besides its input.
#[derive(Debug, Clone, Copy)]
pub struct DecoderInputs<'a> {
    memory: MemoryPerLayer<'a>,
    self_mask: Option<&'a Mask>,
    memory_mask: Option<&'a Mask>,
}

impl<'a> DecoderInputs<'a> {
    /// Every layer reading the encoder output `memory` (B, S, C), under `self_mask`
    /// (broadcastable to (B, H, T, T)) and `memory_mask` (to (B, H, T, S)).
    pub fn full(
        memory: &'a Tensor,
        self_mask: Option<&'a Mask>,
        memory_mask: Option<&'a Mask>,
    ) -> Self {
        DecoderInputs {
            memory: MemoryPerLayer::Full(memory),
            self_mask,
            memory_mask,
        }
    }

    /// Layer `i`'s memory.
    fn memory(&self, i: usize) -> Memory<'a> {
        match self.memory {
            MemoryPerLayer::Full(m) => Memory::Full(m),
            MemoryPerLayer::Projected(kv) => Memory::Projected(&kv[i]),
        }
    }
}

impl StackLayer for DecoderLayer {
    type Weights = DecoderWeights;
    type Inputs<'a> = DecoderInputs<'a>;

    fn build(pb: &ParamBuilder, spec: &LayerSpec) -> Result<Self> {
        DecoderLayer::new(pb, spec)
    }

    /// The backends' decoder layers take the whole encoder output: a layer over projected
    /// memory (incremental decoding, which has a cache anyway) runs composed.
    fn by_backend(
        &self,
        backend: &dyn Backend,
        x: &Tensor,
        inputs: DecoderInputs<'_>,
        i: usize,
        pass: Pass,
    ) -> Result<Option<Tensor>> {
        let Memory::Full(memory) = inputs.memory(i) else {
            return Ok(None);
        };
        let call = DecoderLayerCall {
            x,
            memory,
            self_mask: inputs.self_mask,
            memory_mask: inputs.memory_mask,
            mode: pass.mode,
            backprop: pass.backprop,
            precision: pass.precision,
        };
        backend.decoder_layer(&self.parts(), call)
    }

    fn composed(
        &self,
        x: &Tensor,
        inputs: DecoderInputs<'_>,
        i: usize,
        cache: Option<&mut KvCache>,
        mode: Mode,
        need_weights: bool,
    ) -> Result<(Tensor, Option<DecoderWeights>)> {
        let (self_mask, memory_mask) = (inputs.self_mask, inputs.memory_mask);
        self.run(
            x,
            inputs.memory(i),
            cache,
            self_mask,
            memory_mask,
            mode,
            need_weights,
        )
    }
}
