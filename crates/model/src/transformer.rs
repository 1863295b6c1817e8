//! The encoder-decoder Transformer core (section 3, Figure 1 without embeddings and output
//! layer), equivalent to `torch.nn.Transformer`: an encoder and a decoder stack, each with a
//! final LayerNorm.

use crate::backend::Pass;
use crate::config::TransformerConfig;
use crate::decoder::{Decoder, DecoderInputs};
use crate::dropout::Mode;
use crate::encoder::Encoder;
use crate::mask::Mask;
use crate::params::ParamBuilder;
use crate::stack::LayerSpec;
use crate::Result;
use candle_core::Tensor;

/// The encoder and decoder stacks of `torch.nn.Transformer`, on embedded inputs (B, S, C)
/// and (B, T, C).
#[derive(Debug, Clone)]
pub struct Transformer {
    encoder: Encoder,
    decoder: Decoder,
}

impl Transformer {
    /// Parameters are named `<pb>.encoder.*` and `<pb>.decoder.*`, and every matrix is
    /// re-initialised Xavier-uniform, as `nn.Transformer._reset_parameters` does.
    pub fn new(pb: &ParamBuilder, cfg: &TransformerConfig) -> Result<Self> {
        cfg.validate()
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        let spec = LayerSpec::from(cfg);
        let encoder = Encoder::new(
            &pb.pp("encoder"),
            &spec,
            cfg.num_encoder_layers,
            cfg.final_norm,
        )?;
        let decoder = Decoder::new(
            &pb.pp("decoder"),
            &spec,
            cfg.num_decoder_layers,
            cfg.final_norm,
        )?;
        pb.reinit_xavier_matrices()?;
        Ok(Self { encoder, decoder })
    }

    /// The backend the encoder and decoder layers run through (the builder's,
    /// [`ParamBuilder::backend`]).
    pub fn backend(&self) -> &std::sync::Arc<dyn crate::backend::Backend> {
        self.encoder.backend()
    }

    /// The encoder stack (`nn.Transformer.encoder`): [`Encoder::forward`] encodes the source
    /// once, reused by every decoding step; [`Encoder::forward_as`] differentiates it as a
    /// [`crate::Pass`] says, with each layer's self-attention weights when asked.
    pub fn encoder(&self) -> &Encoder {
        &self.encoder
    }

    /// The decoder stack (`nn.Transformer.decoder`): [`Decoder::forward_as`] over embedded
    /// targets and the memory; for incremental decoding
    /// [`Decoder::project_memory`] and [`Decoder::forward_step`].
    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    /// The whole model. Each mask already includes its key padding (combine them with
    /// [`Mask::and`]): `src_mask` for encoder self-attention, `tgt_mask` for decoder
    /// self-attention (causal), `memory_mask` for encoder-decoder attention.
    ///
    /// # Shapes
    /// src (B, S, C), tgt (B, T, C) -> (B, T, C)
    pub fn forward(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_mask: Option<&Mask>,
        tgt_mask: Option<&Mask>,
        memory_mask: Option<&Mask>,
        mode: Mode,
    ) -> Result<Tensor> {
        let memory = self.encoder.forward(src, src_mask, mode)?;
        let pass = Pass::new(mode);
        let inputs = DecoderInputs::full(&memory, tgt_mask, memory_mask);
        let (y, _) = self.decoder.forward_as(tgt, inputs, pass)?;
        Ok(y)
    }
}
