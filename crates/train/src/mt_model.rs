//! The translation architectures behind one type: the Transformer and the recurrent
//! baselines train, decode and are scored by the same code ([`crate::mt`]).

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};
use transformer_decode::{StepModel, StepOutput};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::Precision;
use transformer_model::{
    DecodePrecision, DecodeState, DirectGrads, Mode, ParamBuilder, PreparedDecoding, RnnAttention,
    RnnSeq2Seq, RnnSeq2SeqConfig, RnnState, Seq2Seq, Seq2SeqConfig, Seq2SeqLoss,
};

/// Which model `transformer mt train` builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arch {
    /// The Transformer (the default).
    #[default]
    Transformer,
    /// A bidirectional GRU encoder and a GRU decoder without attention: the source reaches
    /// the decoder as one fixed-size vector.
    Gru,
    /// The GRU encoder-decoder with dot-product (Luong) attention.
    GruDot,
    /// The GRU encoder-decoder with additive (Bahdanau) attention.
    GruBahdanau,
}

impl Arch {
    /// The recurrent decoder's attention, `None` for the Transformer.
    pub fn rnn_attention(self) -> Option<RnnAttention> {
        match self {
            Arch::Transformer => None,
            Arch::Gru => Some(RnnAttention::None),
            Arch::GruDot => Some(RnnAttention::Dot),
            Arch::GruBahdanau => Some(RnnAttention::Bahdanau),
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Transformer => "transformer",
            Arch::Gru => "gru",
            Arch::GruDot => "gru-dot",
            Arch::GruBahdanau => "gru-bahdanau",
        }
    }
}

impl std::str::FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        [
            Arch::Transformer,
            Arch::Gru,
            Arch::GruDot,
            Arch::GruBahdanau,
        ]
        .into_iter()
        .find(|a| a.name() == s)
        .ok_or_else(|| {
            format!("unknown architecture {s:?}: use transformer, gru, gru-dot or gru-bahdanau")
        })
    }
}

/// A model's configuration as saved beside its weights. (Untagged, and recurrent first: a
/// Transformer's configuration, as weight files have always held it, has no `attention`.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MtModelConfig {
    /// A GRU encoder-decoder.
    Rnn(RnnSeq2SeqConfig),
    /// A Transformer encoder-decoder.
    Transformer(Seq2SeqConfig),
}

/// A translation model of any architecture.
#[derive(Debug, Clone)]
pub enum MtModel {
    /// The Transformer encoder-decoder.
    Transformer(Seq2Seq),
    /// A GRU encoder-decoder (with or without attention).
    Rnn(RnnSeq2Seq),
}

impl MtModel {
    /// The longest sequence (with its `<eos>` or `<bos>`) the model takes: the Transformer's
    /// positional encoding length; `None` for the recurrent models, which have no limit.
    pub fn max_positions(&self) -> Option<usize> {
        match self {
            MtModel::Transformer(m) => Some(m.max_positions()),
            MtModel::Rnn(_) => None,
        }
    }

    /// Builds the model `cfg` describes.
    pub fn build(pb: &ParamBuilder, cfg: &MtModelConfig) -> transformer_model::Result<Self> {
        Ok(match cfg {
            MtModelConfig::Transformer(c) => MtModel::Transformer(Seq2Seq::with_config(pb, c)?),
            MtModelConfig::Rnn(c) => MtModel::Rnn(RnnSeq2Seq::new(pb, c)?),
        })
    }

    /// Label-smoothed cross-entropy of `tgt_out` over its non-padding positions, and the plain
    /// negative log-likelihood.
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T), tgt_out (B, T) u32 -> scalars
    pub fn loss(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        tgt_out: &Tensor,
        pad: u32,
        eps: f64,
        mode: Mode,
    ) -> Result<Seq2SeqLoss> {
        match self {
            MtModel::Transformer(m) => {
                let masks = Seq2SeqMasks::new(src, tgt_in, pad)?;
                m.loss(src, tgt_in, tgt_out, &masks, pad, eps, mode)
            }
            MtModel::Rnn(m) => m.loss(src, tgt_in, tgt_out, pad, eps, mode),
        }
    }

    /// [`Self::loss`] for training, with the Transformer's embedding, encoder-layer and
    /// output-layer gradients going to `direct` (`Seq2Seq::loss_direct`); the recurrent
    /// models' all go to candle's `GradStore`.
    #[allow(clippy::too_many_arguments)]
    pub fn loss_direct(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        tgt_out: &Tensor,
        pad: u32,
        eps: f64,
        precision: Precision,
        mode: Mode,
        direct: &DirectGrads,
    ) -> Result<Seq2SeqLoss> {
        match self {
            MtModel::Transformer(m) => {
                let masks = Seq2SeqMasks::new(src, tgt_in, pad)?;
                let l = (pad, eps, precision);
                m.loss_direct(src, tgt_in, tgt_out, &masks, l, mode, direct)
            }
            MtModel::Rnn(m) => m.loss(src, tgt_in, tgt_out, pad, eps, mode),
        }
    }
}

/// [`MtModel`]'s decoding state.
pub enum MtState {
    /// The Transformer's: projected encoder memory and self-attention caches.
    Transformer(DecodeState),
    /// The GRU model's: encoder outputs and the decoder's hidden state.
    Rnn(RnnState),
}

impl StepModel for MtModel {
    type State = MtState;

    fn max_output_len(&self) -> Option<usize> {
        self.max_positions().map(|p| p.saturating_sub(1))
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<MtState> {
        Ok(match self {
            MtModel::Transformer(m) => MtState::Transformer(StepModel::start(m, src, pad)?),
            MtModel::Rnn(m) => MtState::Rnn(StepModel::start(m, src, pad)?),
        })
    }

    fn src_lens(&self, state: &MtState) -> Vec<usize> {
        match state {
            MtState::Transformer(s) => s.src_lens.clone(),
            MtState::Rnn(s) => s.src_lens.clone(),
        }
    }

    fn step(&self, state: &mut MtState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        match (self, state) {
            (MtModel::Transformer(m), MtState::Transformer(s)) => {
                StepModel::step(m, s, tokens, attention)
            }
            (MtModel::Rnn(m), MtState::Rnn(s)) => StepModel::step(m, s, tokens, attention),
            _ => candle_core::bail!("a decoding state of another architecture"),
        }
    }

    fn select_rows(&self, state: &mut MtState, rows: &[u32]) -> Result<()> {
        match state {
            MtState::Transformer(s) => s.select_rows(rows),
            MtState::Rnn(s) => s.select_rows(rows),
        }
    }
}

/// An [`MtModel`] ready to decode many batches: a Transformer's decoding weights are made
/// ready once here ([`Seq2Seq::prepare_decoding`]) instead of for every batch. It decodes
/// exactly as the model does; build it again after the weights change.
pub struct MtDecoder<'a> {
    model: &'a MtModel,
    prepared: Option<PreparedDecoding>,
}

impl MtModel {
    /// Decodes in `p` from now on ([`Seq2Seq::set_decode_precision`]); int8 covers the
    /// Transformer only.
    pub fn set_decode_precision(&mut self, p: DecodePrecision) -> Result<()> {
        match self {
            MtModel::Transformer(m) => m.set_decode_precision(p),
            MtModel::Rnn(_) if p != DecodePrecision::F32 => candle_core::bail!(
                "int8 decoding covers the Transformer; the recurrent models decode in f32"
            ),
            MtModel::Rnn(_) => {}
        }
        Ok(())
    }

    /// Restricts decoding's output vocabulary to each batch's candidates under `c`
    /// ([`Seq2Seq::set_candidate_vocab`]; `None`: every token); the Transformer only.
    pub fn set_candidate_vocab(
        &mut self,
        c: Option<std::sync::Arc<dyn transformer_model::restrict::CandidateVocab>>,
    ) -> Result<()> {
        match self {
            MtModel::Transformer(m) => m.set_candidate_vocab(c),
            MtModel::Rnn(_) if c.is_some() => candle_core::bail!(
                "a restricted output vocabulary covers the Transformer; the recurrent models \
                 score every token"
            ),
            MtModel::Rnn(_) => {}
        }
        Ok(())
    }

    /// The arithmetic decoding is prepared in.
    pub fn decode_precision(&self) -> DecodePrecision {
        match self {
            MtModel::Transformer(m) => m.decode_precision(),
            MtModel::Rnn(_) => DecodePrecision::F32,
        }
    }

    /// What [`Self::decoder`] prepares decoding with, for logs.
    pub fn describe_decoding(&self) -> Result<String> {
        Ok(self.decoder()?.describe())
    }

    /// This model ready to decode many batches ([`MtDecoder`]).
    pub fn decoder(&self) -> Result<MtDecoder<'_>> {
        let prepared = match self {
            MtModel::Transformer(m) => Some(m.prepare_decoding()?),
            MtModel::Rnn(_) => None,
        };
        Ok(MtDecoder {
            model: self,
            prepared,
        })
    }
}

impl MtDecoder<'_> {
    /// The model it decodes with.
    pub fn model(&self) -> &MtModel {
        self.model
    }

    /// What decoding was prepared with, for logs ([`PreparedDecoding::describe`]).
    pub fn describe(&self) -> String {
        match &self.prepared {
            Some(p) => p.describe(),
            None => "f32 (recurrent)".to_string(),
        }
    }
}

impl StepModel for MtDecoder<'_> {
    type State = MtState;

    fn max_output_len(&self) -> Option<usize> {
        StepModel::max_output_len(self.model)
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<MtState> {
        match (self.model, &self.prepared) {
            (MtModel::Transformer(m), Some(p)) => {
                Ok(MtState::Transformer(m.start_prepared(src, pad, p)?))
            }
            _ => self.model.start(src, pad),
        }
    }

    fn src_lens(&self, state: &MtState) -> Vec<usize> {
        self.model.src_lens(state)
    }

    fn step(&self, state: &mut MtState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        self.model.step(state, tokens, attention)
    }

    fn select_rows(&self, state: &mut MtState, rows: &[u32]) -> Result<()> {
        self.model.select_rows(state, rows)
    }
}
