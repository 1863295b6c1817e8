//! The full encoder-decoder model of Figure 1: token embeddings scaled by sqrt(d_model)
//! (section 3.4), sinusoidal positional encoding (section 3.5), the [`Transformer`] core, and
//! a linear output layer to the target vocabulary (the softmax lives in the loss).

use crate::config::TransformerConfig;
use crate::dropout::Mode;
use crate::embedding::Embedding;
use crate::linear::Linear;
use crate::mask::Mask;
use crate::params::{Init, ParamBuilder};
use crate::positional::PositionalEncoding;
use crate::transformer::Transformer;
use crate::Result;
use candle_core::Tensor;

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
    /// # Shapes
    /// src (B, S) u32, tgt (B, T) u32
    pub fn new(src: &Tensor, tgt: &Tensor, pad_id: u32) -> Result<Self> {
        let src_pad = Mask::key_padding_from_ids(src, pad_id)?;
        let (_, t) = tgt.dims2()?;
        let tgt_mask =
            Mask::causal(t, tgt.device())?.and(&Mask::key_padding_from_ids(tgt, pad_id)?)?;
        Ok(Self {
            src: src_pad.clone(),
            tgt: tgt_mask,
            memory: src_pad,
        })
    }
}

#[derive(Debug, Clone)]
pub struct Seq2Seq {
    src_embedding: Embedding,
    tgt_embedding: Embedding,
    pos_encoder: PositionalEncoding,
    transformer: Transformer,
    generator: Linear,
    d_model: usize,
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
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let c = cfg.d_model;
        let emb_init = Init::XavierUniform {
            fan_in: c,
            fan_out: c,
        };
        let src_embedding = Embedding::new(&pb.pp("src_embedding"), src_vocab, c, emb_init)?;
        let tgt_embedding = Embedding::new(&pb.pp("tgt_embedding"), tgt_vocab, c, emb_init)?;
        let transformer = Transformer::new(&pb.pp("transformer"), cfg)?;
        let generator = Linear::new(&pb.pp("generator"), c, tgt_vocab, true)?;
        pb.reinit_xavier_matrices()?;
        let pos_encoder =
            PositionalEncoding::new(c, cfg.max_len, cfg.dropout, pb.dtype(), &pb.device())?;
        Ok(Self {
            src_embedding,
            tgt_embedding,
            pos_encoder,
            transformer,
            generator,
            d_model: c,
        })
    }

    fn embed(&self, emb: &Embedding, ids: &Tensor, offset: usize, mode: Mode) -> Result<Tensor> {
        let x = (emb.forward(ids)? * (self.d_model as f64).sqrt())?;
        self.pos_encoder.forward(&x, offset, mode)
    }

    /// # Shapes
    /// src (B, S) u32 -> memory (B, S, C)
    pub fn encode(&self, src: &Tensor, src_mask: Option<&Mask>, mode: Mode) -> Result<Tensor> {
        let x = self.embed(&self.src_embedding, src, 0, mode)?;
        self.transformer.encode(&x, src_mask, mode)
    }

    /// Logits for every target position.
    ///
    /// # Shapes
    /// tgt (B, T) u32, memory (B, S, C) -> (B, T, V)
    pub fn decode(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<Tensor> {
        let y = self.embed(&self.tgt_embedding, tgt, 0, mode)?;
        let h = self
            .transformer
            .decode(&y, memory, tgt_mask, memory_mask, mode)?;
        self.generator.forward(&h)
    }

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
        self.decode(tgt_in, &memory, Some(&masks.tgt), Some(&masks.memory), mode)
    }
}
