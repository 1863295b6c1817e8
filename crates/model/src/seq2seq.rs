//! The full encoder-decoder model of Figure 1: token embeddings scaled by sqrt(d_model)
//! (section 3.4), sinusoidal positional encoding (section 3.5), the [`Transformer`] core, and
//! a linear output layer to the target vocabulary (the softmax lives in the loss).
//!
//! Two ways to run the decoder:
//! - [`Seq2Seq::forward`] / [`Seq2Seq::loss`]: every target position at once under the causal
//!   mask (training, teacher forcing);
//! - [`Seq2Seq::start`] then [`Seq2Seq::step`]: one position at a time (decoding; written in
//!   the second `impl` block below, which follows what the backend chose for the decoder layers
//!   and the output layer), with the encoder run once, each decoder layer's encoder-decoder
//!   keys and values projected once, and the self-attention keys and values of earlier
//!   positions cached ([`DecodeState`]).
//!   The two give the same logits (tested).

pub use crate::backend::DecodePrecision;
use crate::backend::FusedDecoding;
use crate::backend::{Backprop, Pass};
use crate::config::TransformerConfig;
use crate::decode_state::Caches;
pub use crate::decode_state::{DecodeState, PreparedDecoding};
use crate::decoder::{DecoderInputs, DecoderWeights};
use crate::dropout::Mode;
use crate::embedding::Embedding;
use crate::grads::DirectGrads;
use crate::linear::Linear;
use crate::mask::Mask;
use crate::multi_head::KvCache;
use crate::ops::Precision;
use crate::params::{Init, ParamBuilder};
use crate::positional::{PositionalEncoding, Positions};
use crate::restrict::CandidateVocab;
use crate::transformer::Transformer;
use crate::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The masks one batch needs, built in one place from the token ids.
#[derive(Debug, Clone)]
pub struct Seq2SeqMasks {
    /// Encoder self-attention: source key padding, (B, 1, 1, S).
    pub src: Mask,
    /// Decoder self-attention: causal and target key padding, (B, 1, T, T).
    pub tgt: Mask,
    /// Encoder-decoder attention: source key padding, (B, 1, 1, S).
    pub memory: Mask,
}

impl Seq2SeqMasks {
    /// The masks for source ids `src` and decoder input ids `tgt`, padded with `pad_id`.
    ///
    /// # Shapes
    /// src (B, S) u32, tgt (B, T) u32
    pub fn new(src: &Tensor, tgt: &Tensor, pad_id: u32) -> Result<Self> {
        let src_pad = Mask::key_padding_from_ids(src, pad_id)?;
        let (_, t) = tgt.dims2()?;
        // The first position is the start token, always a real one, even where it is the
        // padding id (Marian starts decoding from `<pad>`).
        let first: Vec<u8> = (0..t).map(|i| u8::from(i == 0)).collect();
        let first = Tensor::from_vec(first, (1, t), tgt.device())?;
        let tgt_keep = tgt.ne(pad_id)?.broadcast_maximum(&first)?;
        let tgt_mask = Mask::causal(t, tgt.device())?.and(&Mask::key_valid(&tgt_keep)?)?;
        Ok(Self {
            src: src_pad.clone(),
            tgt: tgt_mask,
            memory: src_pad,
        })
    }
}

/// Everything that defines a [`Seq2Seq`]'s shape; saved beside its weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seq2SeqConfig {
    /// The encoder-decoder core.
    pub transformer: TransformerConfig,
    /// Source vocabulary size.
    pub src_vocab: usize,
    /// Target vocabulary size.
    pub tgt_vocab: usize,
    /// One matrix for the source embedding, the target embedding and the output layer
    /// (section 3.4; needs one joint vocabulary, so `src_vocab == tgt_vocab`).
    #[serde(default)]
    pub share_embeddings: bool,
    /// How tokens enter the stacks: the paper's by default; published models differ.
    #[serde(default, skip_serializing_if = "Inputs::is_paper")]
    pub inputs: Inputs,
}

/// How token ids become the stacks' inputs: embedding, scale, positions. [`Default`] is the
/// paper's (sections 3.4 and 3.5); published models ([`crate::positional::Positions`]) vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Inputs {
    /// Embeddings multiplied by sqrt(d_model) (section 3.4).
    pub scale_embeddings: bool,
    /// The position table added to them.
    pub positions: Positions,
    /// The decoder's first input (position 0) is a zero vector, whatever its token: what
    /// CTranslate2 does for Marian models, whose start token's embedding is zero.
    pub zero_start_embedding: bool,
}

impl Default for Inputs {
    fn default() -> Self {
        Self {
            scale_embeddings: true,
            positions: Positions::Interleaved,
            zero_start_embedding: false,
        }
    }
}

impl Inputs {
    /// The paper's: scaled embeddings, interleaved sinusoids, the start token embedded.
    pub fn is_paper(&self) -> bool {
        *self == Self::default()
    }
}

impl Seq2SeqConfig {
    /// Checks the core and the vocabularies; the error says what to change.
    pub fn validate(&self) -> std::result::Result<(), crate::ConfigError> {
        self.transformer.validate()?;
        if self.src_vocab == 0 || self.tgt_vocab == 0 {
            return Err(crate::ConfigError::Zero { name: "vocabulary" });
        }
        if self.share_embeddings && self.src_vocab != self.tgt_vocab {
            return Err(crate::ConfigError::Invalid(format!(
                "shared embeddings need one joint vocabulary, but the source has {} tokens and \
                 the target {}: train a joint tokenizer or turn sharing off",
                self.src_vocab, self.tgt_vocab
            )));
        }
        Ok(())
    }
}

/// The encoder-decoder Transformer with embeddings and output layer: source ids (B, S) and
/// target ids (B, T) -> logits (B, T, V).
#[derive(Debug, Clone)]
pub struct Seq2Seq {
    pub(crate) src_embedding: Embedding,
    pub(crate) tgt_embedding: Embedding,
    /// The source's positions, and the target's (one table but for learned ones).
    src_positions: PositionalEncoding,
    tgt_positions: PositionalEncoding,
    /// What the embeddings are multiplied by: sqrt(d_model), or 1.
    embed_scale: Option<f64>,
    /// The target's position 0 gets a zero embedding ([`Inputs::zero_start_embedding`]).
    zero_start: bool,
    pub(crate) transformer: Transformer,
    pub(crate) generator: Linear,
    /// The arithmetic decoding is prepared in ([`ParamBuilder::decoding`]).
    pub(crate) decode_precision: DecodePrecision,
    /// The arithmetic of a training pass's products (fused layers and output layer, `Direct`),
    /// from the builder ([`ParamBuilder::precision`]).
    precision: Precision,
    /// Decoding's output vocabulary per batch, when restricted ([`crate::restrict`]).
    pub(crate) candidates: Option<Arc<dyn CandidateVocab>>,
}

/// The training loss of one batch.
#[derive(Debug, Clone)]
pub struct Seq2SeqLoss {
    /// What to differentiate: label-smoothed cross-entropy per target token.
    pub loss: Tensor,
    /// Plain cross-entropy per target token (the perplexity's logarithm), detached.
    pub nll: Tensor,
}

/// Cross-entropy of `targets` under the output layer `generator` applied to `h`, over the
/// rows whose target is not `pad_id`, with label smoothing `eps`: the target distribution is
/// `1 - eps` on the right token plus `eps / V` on every token, as PyTorch's
/// `CrossEntropyLoss(label_smoothing=eps, ignore_index=pad)`. Every sequence-to-sequence model
/// ends in it (the Transformer and the recurrent baselines).
///
/// Computed without the (N, V) logits in memory: the output layer, log-softmax and negative
/// log-likelihood are one fused op ([`crate::ops::output_cross_entropy`]), and the
/// smoothing term needs no softmax, because
/// `(1 - eps) (lse - z_y) + eps mean_j (lse - z_j) = nll + eps (z_y - mean_j z_j)`,
/// where `z_y = h . W_y + b_y` and `mean_j z_j = h . mean_j W_j + mean_j b_j`
/// ([`crate::ops::label_smoothing_term`]).
///
/// # Shapes
/// h (N, C) or (B, T, C), targets (N,) or (B, T) u32 (a row per target) -> scalars
pub fn label_smoothed_loss(
    h: &Tensor,
    generator: &Linear,
    targets: &Tensor,
    pad_id: u32,
    eps: f64,
) -> Result<Seq2SeqLoss> {
    label_smoothed_loss_with(h, generator, targets, pad_id, eps, None)
}

/// [`label_smoothed_loss`] whose output layer's weight and bias gradients go to `direct`
/// when given (and they are CPU f32 variables), not to candle's `GradStore`, with the output
/// layer's products in the given precision.
pub fn label_smoothed_loss_with(
    h: &Tensor,
    generator: &Linear,
    targets: &Tensor,
    pad_id: u32,
    eps: f64,
    direct: Option<(&DirectGrads, Precision)>,
) -> Result<Seq2SeqLoss> {
    use crate::ops;
    // One row per target, whatever the batch's shape.
    let (h, targets) = (
        &h.reshape(((), h.dim(D::Minus1)?))?,
        &targets.flatten_all()?,
    );
    let w = generator.weight();
    let bias = generator.bias().expect("the output layer has a bias");
    // Padding rows count for nothing, so the output layer runs on the other rows only: its
    // three (rows x C x V) products are most of the step's arithmetic, and a length-bucketed
    // Multi30k batch is about a sixth padding. The gather and its backward (a scatter into
    // (N, C) zeros) cost N x C; the loss and every gradient are the same.
    let ids = targets.to_vec1::<u32>()?;
    let kept: Vec<u32> = (0..ids.len() as u32)
        .filter(|&i| ids[i as usize] != pad_id)
        .collect();
    let (h, targets) = if !kept.is_empty() && kept.len() < ids.len() {
        let idx = Tensor::new(kept.as_slice(), h.device())?;
        (h.index_select(&idx, 0)?, targets.index_select(&idx, 0)?)
    } else {
        (h.clone(), targets.clone())
    };
    let (h, targets) = (&h, &targets);
    // On the GPU: the output layer's product, then the smoothed loss as one fused kernel.
    if let Some((loss, nll)) =
        ops::smoothed_cross_entropy_gpu(h, w, bias, targets, Some(pad_id), eps)?
    {
        return Ok(Seq2SeqLoss { nll, loss });
    }
    let nll = match direct {
        Some((d, precision)) => {
            ops::output_cross_entropy(h, w, bias, targets, Some(pad_id), precision, Some(d))?
        }
        None => ops::output_cross_entropy(h, w, bias, targets, Some(pad_id), Precision::F32, None)?,
    };
    let direct = direct.map(|(d, _)| d);
    if eps == 0.0 {
        return Ok(Seq2SeqLoss {
            nll: nll.detach(),
            loss: nll,
        });
    }
    let inputs = ops::SmoothingInputs {
        hidden: h,
        weight: w,
        bias,
        targets,
        ignore_index: pad_id,
        eps,
    };
    let smooth = ops::label_smoothing_term(inputs, direct)?;
    Ok(Seq2SeqLoss {
        nll: nll.detach(),
        loss: (nll + smooth)?,
    })
}

impl Seq2Seq {
    /// Parameters: `src_embedding.weight`, `tgt_embedding.weight`, `transformer.*`,
    /// `generator.{weight,bias}`; every matrix Xavier-uniform (as the Annotated Transformer).
    pub fn new(
        pb: &ParamBuilder,
        cfg: &TransformerConfig,
        src_vocab: usize,
        tgt_vocab: usize,
    ) -> Result<Self> {
        Self::with_config(
            pb,
            &Seq2SeqConfig {
                transformer: cfg.clone(),
                src_vocab,
                tgt_vocab,
                share_embeddings: false,
                inputs: Inputs::default(),
            },
        )
    }

    /// As [`Seq2Seq::new`]; with `share_embeddings` there is one matrix,
    /// `src_embedding.weight`, used by both embeddings and the output layer (whose bias is
    /// `generator.bias`).
    pub fn with_config(pb: &ParamBuilder, cfg: &Seq2SeqConfig) -> Result<Self> {
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let tcfg = &cfg.transformer;
        let c = tcfg.d_model;
        let emb_init = Init::XavierUniform {
            fan_in: c,
            fan_out: c,
        };
        let src_embedding = Embedding::new(&pb.pp("src_embedding"), cfg.src_vocab, c, emb_init)?;
        let (tgt_embedding, generator) = if cfg.share_embeddings {
            let bias = pb.pp("generator").var("bias", cfg.tgt_vocab, Init::Zeros)?;
            (
                src_embedding.clone(),
                Linear::from_parts(src_embedding.weight().clone(), Some(bias)),
            )
        } else {
            (
                Embedding::new(&pb.pp("tgt_embedding"), cfg.tgt_vocab, c, emb_init)?,
                Linear::new(&pb.pp("generator"), c, cfg.tgt_vocab, true)?,
            )
        };
        let transformer = Transformer::new(&pb.pp("transformer"), tcfg)?;
        pb.reinit_xavier_matrices()?;
        if cfg.share_embeddings {
            // One matrix is both the input embedding (scaled by sqrt(C)) and the output layer.
            // Xavier over (V, C) gives rows of norm about 0.25: inputs a quarter of the
            // positional encoding's size and near-zero logits that take many steps to grow.
            // Entries of standard deviation C^-1/2 (as fairseq initialises shared embeddings)
            // give unit-variance inputs and unit-scale logits from the start.
            pb.reinit(
                "src_embedding.weight",
                Init::Uniform((3.0 / c as f64).sqrt()),
            )?;
        }
        let inputs = cfg.inputs;
        let (src_positions, tgt_positions) = match inputs.positions {
            Positions::Interleaved => {
                let pe = PositionalEncoding::new(
                    c,
                    tcfg.max_len,
                    tcfg.dropout,
                    pb.dtype(),
                    &pb.device(),
                )?;
                (pe.clone(), pe)
            }
            Positions::Learned => {
                let learned = |name: &str| -> Result<PositionalEncoding> {
                    let init = Init::Uniform((3.0 / c as f64).sqrt());
                    let pe = pb.pp(name).var("weight", (tcfg.max_len, c), init)?;
                    Ok(PositionalEncoding::with_table(pe, tcfg.dropout))
                };
                (learned("src_positions")?, learned("tgt_positions")?)
            }
            fixed => {
                let table = fixed
                    .table(c, tcfg.max_len, &pb.device())?
                    .expect("a fixed table")
                    .to_dtype(pb.dtype())?;
                let pe = PositionalEncoding::with_table(table, tcfg.dropout);
                (pe.clone(), pe)
            }
        };
        Ok(Self {
            src_embedding,
            tgt_embedding,
            src_positions,
            tgt_positions,
            embed_scale: inputs.scale_embeddings.then(|| (c as f64).sqrt()),
            zero_start: inputs.zero_start_embedding,
            transformer,
            generator,
            decode_precision: pb.decoding(),
            precision: pb.precision(),
            candidates: pb.candidates(),
        })
    }

    /// The arithmetic decoding is prepared in.
    pub fn decode_precision(&self) -> DecodePrecision {
        self.decode_precision
    }

    /// Positions the positional encoding covers: the longest sequence (source with its
    /// `<eos>`, or target with its `<bos>`) the model takes.
    pub fn max_positions(&self) -> usize {
        self.src_positions
            .max_len()
            .min(self.tgt_positions.max_len())
    }

    /// The device the weights live on.
    pub fn device(&self) -> candle_core::Device {
        self.generator.weight().device().clone()
    }

    /// The stack's input for `ids` at positions `offset ..`: the embedding (`emb`, the
    /// source's or the target's), scaled, plus the positions, dropped out.
    pub(crate) fn embed(
        &self,
        emb: &Embedding,
        ids: &Tensor,
        offset: usize,
        mode: Mode,
    ) -> Result<Tensor> {
        self.inputs(emb, emb.forward(ids)?, offset, mode)
    }

    /// [`Self::embed`] after the lookup: `x` (B, T, C) the rows of `emb`.
    fn inputs(&self, emb: &Embedding, x: Tensor, offset: usize, mode: Mode) -> Result<Tensor> {
        let x = match self.embed_scale {
            Some(s) => (x * s)?,
            None => x,
        };
        let target = std::ptr::eq(emb, &self.tgt_embedding);
        let x = if target && self.zero_start && offset == 0 {
            // Position 0's embedding is zero; the others are kept.
            let t = x.dim(1)?;
            let keep: Vec<f32> = (0..t).map(|i| if i == 0 { 0.0 } else { 1.0 }).collect();
            let keep = Tensor::from_vec(keep, (1, t, 1), x.device())?.to_dtype(x.dtype())?;
            x.broadcast_mul(&keep)?
        } else {
            x
        };
        let positions = match target {
            true => &self.tgt_positions,
            false => &self.src_positions,
        };
        positions.forward(&x, offset, mode)
    }

    /// Embeds and encodes the source: the memory the decoder attends to.
    ///
    /// # Shapes
    /// src (B, S) u32 -> memory (B, S, C)
    pub fn encode(&self, src: &Tensor, src_mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        Ok(self.encode_as(src, src_mask, Pass::new(mode))?.0)
    }

    /// The encoder's output, and every encoder layer's self-attention weights (B, H, S, S)
    /// when `pass` asks for them ([`Pass::weights`]).
    pub fn encode_as(
        &self,
        src: &Tensor,
        src_mask: Option<&Mask>,
        pass: Pass,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        let x = self.embed_as(&self.src_embedding, src, pass.mode, pass.backprop)?;
        self.transformer.encoder().forward_as(&x, src_mask, pass)
    }

    /// Logits for every target position, and every decoder layer's attention weights when
    /// `pass` asks for them ([`Pass::weights`]).
    ///
    /// # Shapes
    /// tgt (B, T) u32, memory (B, S, C) -> (B, T, V), per layer (B, H, T, T) and (B, H, T, S)
    pub fn decode_as(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        pass: Pass,
    ) -> Result<(Tensor, Vec<DecoderWeights>)> {
        let y = self.embed_as(&self.tgt_embedding, tgt, pass.mode, pass.backprop)?;
        let inputs = DecoderInputs::full(memory, tgt_mask, memory_mask);
        let (h, w) = self.transformer.decoder().forward_as(&y, inputs, pass)?;
        Ok((self.generator.forward(&h)?, w))
    }

    /// Next-token logits at every target position (teacher forcing): encode, then decode
    /// `tgt_in` under the masks.
    ///
    /// # Shapes
    /// src (B, S) u32, tgt_in (B, T) u32 -> logits (B, T, V)
    pub fn forward(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        masks: &Seq2SeqMasks,
        mode: Mode,
    ) -> Result<Tensor> {
        let memory = self.encode(src, Some(&masks.src), mode)?;
        let (tm, mm) = (Some(&masks.tgt), Some(&masks.memory));
        Ok(self.decode_as(tgt_in, &memory, tm, mm, Pass::new(mode))?.0)
    }

    /// Cross-entropy of `tgt_out` given `src` and `tgt_in`, over the positions whose target is
    /// not `pad_id`, with label smoothing `eps` (Szegedy et al. 2016; section 5.4 uses 0.1);
    /// see [`label_smoothed_loss`].
    ///
    /// `backprop` says where the gradients go ([`Backprop`]): through candle's graph (the
    /// composed model, the reference); or, for training, most parameter gradients delivered
    /// to `DirectGrads` instead of candle's `GradStore` (see [`crate::grads`]): the
    /// embeddings' rows, every encoder and decoder layer the backend runs as one fused op, and
    /// the output layer's weight and bias, with their products in the model's training
    /// precision (from its builder, [`ParamBuilder::precision`]); the
    /// rest (the final norms, layers the backend does not fuse) through the graph as usual, and
    /// an optimizer reads both. The same loss with the same dropout either way, summed in
    /// another order. With `DirectGrads` the fused layers also skip padding rows: each
    /// sequence's positions after its last token (source; decoder input or target) are not
    /// computed, since the masks hide them and the loss ignores them
    /// ([`Mask::with_lengths`]).
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T), tgt_out (B, T) u32 -> scalars
    #[allow(clippy::too_many_arguments)]
    pub fn loss(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        tgt_out: &Tensor,
        masks: &Seq2SeqMasks,
        (pad_id, eps): (u32, f64),
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Seq2SeqLoss> {
        let direct = match backprop {
            Backprop::Direct(grads) => Some((grads, self.precision)),
            Backprop::Graph | Backprop::Off => None,
        };
        // bf16 products where the backend lowers the composed layers' (off the CPU).
        let _products = direct.and_then(|(_, p)| self.transformer.backend().mixed_precision(p));
        let (src_mask, tgt_mask, memory_mask) = if direct.is_some() {
            let src_len = crate::mask::padded_lengths(&[src], pad_id)?;
            let tgt_len = crate::mask::padded_lengths(&[tgt_in, tgt_out], pad_id)?;
            (
                masks.src.clone().with_lengths(src_len.clone()),
                masks.tgt.clone().with_lengths(tgt_len),
                masks.memory.clone().with_lengths(src_len),
            )
        } else {
            (masks.src.clone(), masks.tgt.clone(), masks.memory.clone())
        };
        let tr = &self.transformer;
        let x = self.embed_as(&self.src_embedding, src, mode, backprop)?;
        let pass = Pass::new(mode).backprop(backprop).products(self.precision);
        let (memory, _) = tr.encoder().forward_as(&x, Some(&src_mask), pass)?;
        let y = self.embed_as(&self.tgt_embedding, tgt_in, mode, backprop)?;
        let (tm, mm) = (Some(&tgt_mask), Some(&memory_mask));
        let (h, _) = tr
            .decoder()
            .forward_as(&y, DecoderInputs::full(&memory, tm, mm), pass)?;
        label_smoothed_loss_with(&h, &self.generator, tgt_out, pad_id, eps, direct)
    }

    /// [`Self::embed`] from position 0, the embedding's row gradients going where `backprop`
    /// says ([`Embedding::forward_as`]).
    fn embed_as(
        &self,
        emb: &Embedding,
        ids: &Tensor,
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Tensor> {
        self.inputs(emb, emb.forward_as(ids, backprop)?, 0, mode)
    }
}

/// Incremental decoding: the weights made ready once for many batches, the state a batch
/// starts with, and one step.
impl Seq2Seq {
    /// Encodes a batch of sources once and prepares incremental decoding as the backend
    /// chooses ([`Self::prepare_decoding`], for this one batch).
    ///
    /// # Shapes
    /// src (B, S) u32, padded with `pad_id`
    pub fn start(&self, src: &Tensor, pad_id: u32) -> Result<DecodeState> {
        self.start_with(src, pad_id, true)
    }

    /// [`Self::start`], through the composed decoder layers whatever the backend (`fused`
    /// false): the plain version the fused step is checked against.
    pub fn start_with(&self, src: &Tensor, pad_id: u32, fused: bool) -> Result<DecodeState> {
        let prepared = self.prepare_decoding()?;
        let prepared = match fused {
            true => prepared,
            false => prepared.with_composed_layers(),
        };
        self.start_prepared(src, pad_id, &prepared)
    }

    /// Decoding made ready once for many batches, as the decoder's backend chooses it
    /// ([`crate::backend::Backend::decoding_stack`], [`crate::backend::Backend::output_layer`])
    /// in this model's [`DecodePrecision`]
    /// ([`ParamBuilder::decoding`], fixed when the model was built). On the CPU: the fused step's stack with its weight
    /// matrices transposed, or quantized to int8, and the output layer in f32 (its weight
    /// transposed at the first step that needs it) or int8 (else [`Self::start`] makes them
    /// for every batch, 4% of a beam search over a test set in batches of 25 sentences).
    /// Valid while the model's weights stay as they are: prepare again after a training step.
    /// [`PreparedDecoding::describe`] says what was prepared.
    pub fn prepare_decoding(&self) -> Result<PreparedDecoding> {
        let decoder = self.transformer.decoder();
        Ok(PreparedDecoding {
            stack: decoder.fused_stack(self.decode_precision)?,
            output: decoder
                .backend()
                .output_layer(&self.generator, self.decode_precision)?,
        })
    }

    /// Encodes `src` and starts decoding as `prepared` says: with its fused step when it has
    /// one (else through the composed layers), and its output layer, restricted to the
    /// batch's candidates when the model has a candidate vocabulary.
    pub fn start_prepared(
        &self,
        src: &Tensor,
        pad_id: u32,
        prepared: &PreparedDecoding,
    ) -> Result<DecodeState> {
        let mask = Mask::key_padding_from_ids(src, pad_id)?;
        let src_lens = crate::mask::lengths(src, pad_id)?;
        let output = match &self.candidates {
            Some(c) => {
                let rows = crate::restrict::source_rows(src, pad_id)?;
                let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
                prepared.output.restricted(c.candidates(&refs))?
            }
            None => prepared.output.clone(),
        };
        let decoder = self.transformer.decoder();
        let caches = match &prepared.stack {
            Some(stack) => {
                let x = self
                    .embed(&self.src_embedding, src, 0, Mode::Eval)?
                    .detach();
                let pass = crate::Pass::new(Mode::Eval).backprop(crate::Backprop::Off);
                let (memory, _) = self
                    .transformer
                    .encoder()
                    .forward_as(&x, Some(&mask), pass)?;
                let keep = src.ne(pad_id)?.flatten_all()?.to_vec1::<u8>()?;
                Caches::Fused(FusedDecoding::start(stack.clone(), &memory, &keep)?)
            }
            None => {
                let memory = self.encode(src, Some(&mask), Mode::Eval)?;
                Caches::Tensors {
                    memory_kv: decoder.project_memory(&memory)?,
                    caches: vec![KvCache::new(); decoder.num_layers()],
                    memory_mask: mask,
                }
            }
        };
        Ok(DecodeState {
            caches,
            output,
            position: 0,
            src_lens,
        })
    }

    /// Feeds one new token per row (the previous step's choice; `<bos>` first) and returns
    /// the logits of the next one, with every decoder layer's attention weights of this
    /// position when `need_weights`. The state's caches grow by one position.
    ///
    /// # Shapes
    /// tokens (B,) u32 -> logits (B, V); weights per layer: self (B, H, 1, position + 1),
    /// cross (B, H, 1, S)
    pub fn step(
        &self,
        state: &mut DecodeState,
        tokens: &Tensor,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Vec<DecoderWeights>>)> {
        let (h, weights) = self.step_hidden(state, tokens, need_weights)?;
        let logits = state.output.logits(&h)?;
        Ok((logits, weights))
    }

    /// [`Self::step`] for greedy decoding: only the most likely next token of each row, the
    /// token of the largest logit (the first of equals), found as the output layer finds it
    /// ([`crate::backend::OutputLayer::argmax`]: on the CPU without computing every logit exactly).
    ///
    /// # Shapes
    /// tokens (B,) u32 -> B token ids
    pub fn step_argmax(&self, state: &mut DecodeState, tokens: &Tensor) -> Result<Vec<u32>> {
        let (h, _) = self.step_hidden(state, tokens, false)?;
        state.output.argmax(&h)
    }

    /// The decoder's output (B, C) of one step, and the attention weights when asked for.
    fn step_hidden(
        &self,
        state: &mut DecodeState,
        tokens: &Tensor,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Vec<DecoderWeights>>)> {
        // (B,) -> (B, 1) -> (B, 1, C)
        let ids = tokens.unsqueeze(1)?;
        let y = self.embed(&self.tgt_embedding, &ids, state.position, Mode::Eval)?;
        let decoder = self.transformer.decoder();
        let (h, weights) = match &mut state.caches {
            Caches::Tensors {
                memory_kv,
                caches,
                memory_mask,
            } => {
                let (h, w) = decoder.forward_step(
                    &y,
                    caches,
                    memory_kv,
                    None,
                    Some(memory_mask),
                    Mode::Eval,
                )?;
                // (B, 1, C) -> (B, C)
                (h.squeeze(1)?, Some(w))
            }
            Caches::Fused(f) => f.step(&y, state.position, need_weights)?,
        };
        state.position += 1;
        Ok((h, weights.filter(|_| need_weights)))
    }
}
