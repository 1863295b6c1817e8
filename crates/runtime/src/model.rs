//! The translation architectures behind one type ([`MtModel`]): the Transformer and the
//! recurrent baselines train, decode and are scored by the same code. A new architecture
//! implements [`Architecture`] and [`ArchConfig`] and takes one arm in
//! [`MtModelConfig::arch`]: the registry of architectures.

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};
use transformer_decode::{StepModel, StepOutput};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{
    Backprop, DecodePrecision, DecodeState, Mode, ParamBuilder, PreparedDecoding, RnnAttention,
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

/// What the rest of the program reads of an architecture's configuration. Each architecture's
/// configuration type implements it; [`MtModelConfig::arch`] is the one place that picks the
/// implementation.
pub trait ArchConfig {
    /// Builds the model.
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<Box<dyn Architecture>>;
    /// Checks the sizes, naming what is wrong.
    fn validate(&self) -> crate::error::Result<()>;
    /// The longest sequence the model takes (`None`: no limit).
    fn max_positions(&self) -> Option<usize>;
    /// The attention a picture can show: (decoder layers, heads); a recurrent model's one
    /// attention is (1, 1).
    fn attention_shape(&self) -> (usize, usize);
    /// The model's log line, given its parameter count.
    fn describe(&self, parameters: usize) -> String;
}

impl MtModelConfig {
    /// The architecture's own view of this configuration: the registration of the
    /// architectures, one arm each.
    pub fn arch(&self) -> &dyn ArchConfig {
        match self {
            MtModelConfig::Transformer(c) => c,
            MtModelConfig::Rnn(c) => c,
        }
    }
}

impl ArchConfig for Seq2SeqConfig {
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<Box<dyn Architecture>> {
        Ok(Box::new(Seq2Seq::with_config(pb, self)?))
    }
    fn validate(&self) -> crate::error::Result<()> {
        Ok(Seq2SeqConfig::validate(self)?)
    }
    fn max_positions(&self) -> Option<usize> {
        Some(self.transformer.max_len)
    }
    fn attention_shape(&self) -> (usize, usize) {
        (self.transformer.num_decoder_layers, self.transformer.nhead)
    }
    fn describe(&self, parameters: usize) -> String {
        let t = &self.transformer;
        format!(
            "model: Transformer, {parameters} parameters ({}+{} layers, d_model {}, {} heads, FFN {}, shared embeddings: {})",
            t.num_encoder_layers,
            t.num_decoder_layers,
            t.d_model,
            t.nhead,
            t.dim_feedforward,
            self.share_embeddings
        )
    }
}

impl ArchConfig for RnnSeq2SeqConfig {
    /// Refuses what only the Transformer decodes with: int8 products and a restricted
    /// output vocabulary.
    fn build(&self, pb: &ParamBuilder) -> transformer_model::Result<Box<dyn Architecture>> {
        if pb.decoding() != DecodePrecision::F32 {
            candle_core::bail!(
                "int8 decoding covers the Transformer; the recurrent models decode in f32"
            );
        }
        if pb.candidates().is_some() {
            candle_core::bail!(
                "a restricted output vocabulary covers the Transformer; the recurrent models \
                 score every token"
            );
        }
        Ok(Box::new(RnnSeq2Seq::new(pb, self)?))
    }
    fn validate(&self) -> crate::error::Result<()> {
        RnnSeq2SeqConfig::validate(self).map_err(crate::error::Error::Usage)
    }
    fn max_positions(&self) -> Option<usize> {
        None
    }
    fn attention_shape(&self) -> (usize, usize) {
        (1, 1)
    }
    fn describe(&self, parameters: usize) -> String {
        let name = match self.attention {
            RnnAttention::None => Arch::Gru,
            RnnAttention::Dot => Arch::GruDot,
            RnnAttention::Bahdanau => Arch::GruBahdanau,
        }
        .name();
        format!(
            "model: {name}, {parameters} parameters (embeddings {}, bidirectional GRU encoder {} x 2, GRU decoder {}, attention: {:?})",
            self.emb,
            self.hidden,
            2 * self.hidden,
            self.attention
        )
    }
}

/// The attention weights of one translation fed through a model with teacher forcing, each
/// `(1, H, Q, K)`: what [`crate::attention::attention_of`] turns into pictures.
#[derive(Debug, Default)]
pub struct AttentionWeights {
    /// Every encoder layer's self-attention (none for a recurrent model).
    pub encoder: Vec<Tensor>,
    /// Every decoder layer's self-attention (none for a recurrent model).
    pub decoder: Vec<Tensor>,
    /// Every decoder layer's attention over the source.
    pub cross: Vec<Tensor>,
}

/// What training, decoding and scoring need of a translation architecture. A new
/// architecture implements this for its model (and [`ArchState`] for its decoding state),
/// [`ArchConfig`] for its configuration, and takes one arm in [`MtModelConfig::arch`]; no
/// other code names it. The defaults cover what only the Transformer has (fused training
/// gradients, int8 and restricted-vocabulary decoding, decoding weights made ready once).
pub trait Architecture: ArchCommon + std::fmt::Debug + Send + Sync {
    /// The longest sequence (with its `<eos>` or `<bos>`) the model takes; `None`: no limit.
    fn max_positions(&self) -> Option<usize>;
    /// Label-smoothed cross-entropy of `tgt_out` over its non-padding positions, and the plain
    /// negative log-likelihood.
    /// `backprop`: where the gradients go ([`Backprop`]); a model without fused ops sends
    /// them all through candle's graph whatever it says.
    fn loss(
        &self,
        batch: [&Tensor; 3],
        pad_eps: (u32, f64),
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Seq2SeqLoss>;
    /// Encodes a batch of sources and returns the state before the first decoding step,
    /// with the decoding weights `prepared` made ready once where the model has them.
    fn start(
        &self,
        src: &Tensor,
        pad: u32,
        prepared: Option<&PreparedDecoding>,
    ) -> Result<Box<dyn ArchState>>;
    /// The attention weights of `tgt_in` given `src` (one sentence each, teacher forcing).
    fn attention(&self, src: &Tensor, tgt_in: &Tensor, pad: u32) -> Result<AttentionWeights>;
    /// Decoding weights made ready once for many batches, where the model has them.
    fn prepare_decoding(&self) -> Result<Option<PreparedDecoding>> {
        Ok(None)
    }
    /// What decoding runs with when nothing was prepared, for logs.
    fn describe_decoding(&self) -> String {
        "f32".into()
    }
    /// The arithmetic decoding is prepared in.
    fn decode_precision(&self) -> DecodePrecision {
        DecodePrecision::F32
    }
}

/// What every architecture does alike, given its model is a [`StepModel`] that clones
/// ([`Architecture`] requires it; implemented for every such model).
pub trait ArchCommon {
    /// One decoding step ([`StepModel::step`]) on a state [`Architecture::start`] made.
    fn step(
        &self,
        state: &mut dyn ArchState,
        tokens: &[u32],
        attention: bool,
    ) -> Result<StepOutput>;
    /// Each row's most likely next token ([`StepModel::step_argmax`]) on a state
    /// [`Architecture::start`] made.
    fn step_argmax(&self, state: &mut dyn ArchState, tokens: &[u32]) -> Result<Vec<u32>>;
    /// A copy (the weights' tensors are shared, as `Clone` shares them).
    fn clone_box(&self) -> Box<dyn Architecture>;
    /// For callers that need the concrete model ([`MtModel::transformer`]).
    fn as_any(&self) -> &dyn std::any::Any;
}

impl<M> ArchCommon for M
where
    M: Architecture + StepModel + Clone + 'static,
    M::State: 'static,
{
    fn step(
        &self,
        state: &mut dyn ArchState,
        tokens: &[u32],
        attention: bool,
    ) -> Result<StepOutput> {
        StepModel::step(self, own_state::<M::State>(state)?, tokens, attention)
    }
    fn step_argmax(&self, state: &mut dyn ArchState, tokens: &[u32]) -> Result<Vec<u32>> {
        StepModel::step_argmax(self, own_state::<M::State>(state)?, tokens)
    }
    fn clone_box(&self) -> Box<dyn Architecture> {
        Box::new(self.clone())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An architecture's decoding state, as [`Architecture::start`] makes it.
pub trait ArchState {
    /// Source lengths (without padding) of the state's rows.
    fn src_lens(&self) -> Vec<usize>;
    /// Keeps rows `rows` of the state, in that order.
    fn select_rows(&mut self, rows: &[u32]) -> Result<()>;
    /// For the architecture's own [`ArchCommon::step`].
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// [`ArchState`] for a state type with a public `src_lens` and a `select_rows` method.
macro_rules! arch_state {
    ($($state:ty),*) => {$(
        impl ArchState for $state {
            fn src_lens(&self) -> Vec<usize> {
                self.src_lens.clone()
            }
            fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
                <$state>::select_rows(self, rows)
            }
            fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
                self
            }
        }
    )*};
}

arch_state!(DecodeState, RnnState);

/// The state `start` made for this architecture, or an error naming the mix-up.
fn own_state<T: 'static>(state: &mut dyn ArchState) -> Result<&mut T> {
    state
        .as_any_mut()
        .downcast_mut::<T>()
        .ok_or_else(|| candle_core::Error::Msg("a decoding state of another architecture".into()))
}

impl Architecture for Seq2Seq {
    fn max_positions(&self) -> Option<usize> {
        Some(Seq2Seq::max_positions(self))
    }
    fn loss(
        &self,
        [src, tgt_in, tgt_out]: [&Tensor; 3],
        pad_eps: (u32, f64),
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Seq2SeqLoss> {
        let masks = Seq2SeqMasks::new(src, tgt_in, pad_eps.0)?;
        Seq2Seq::loss(self, src, tgt_in, tgt_out, &masks, pad_eps, mode, backprop)
    }
    fn start(
        &self,
        src: &Tensor,
        pad: u32,
        prepared: Option<&PreparedDecoding>,
    ) -> Result<Box<dyn ArchState>> {
        Ok(Box::new(match prepared {
            Some(p) => self.start_prepared(src, pad, p)?,
            None => StepModel::start(self, src, pad)?,
        }))
    }
    fn attention(&self, src: &Tensor, tgt_in: &Tensor, pad: u32) -> Result<AttentionWeights> {
        let masks = Seq2SeqMasks::new(src, tgt_in, pad)?;
        let pass = transformer_model::Pass::new(Mode::Eval).weights();
        let (memory, encoder) = self.encode_as(src, Some(&masks.src), pass)?;
        let (_, dec) =
            self.decode_as(tgt_in, &memory, Some(&masks.tgt), Some(&masks.memory), pass)?;
        Ok(AttentionWeights {
            encoder,
            decoder: dec.iter().map(|w| w.self_attn.clone()).collect(),
            cross: dec.iter().map(|w| w.cross_attn.clone()).collect(),
        })
    }
    fn prepare_decoding(&self) -> Result<Option<PreparedDecoding>> {
        Ok(Some(Seq2Seq::prepare_decoding(self)?))
    }
    fn decode_precision(&self) -> DecodePrecision {
        Seq2Seq::decode_precision(self)
    }
}

impl Architecture for RnnSeq2Seq {
    fn max_positions(&self) -> Option<usize> {
        None
    }
    fn loss(
        &self,
        [src, tgt_in, tgt_out]: [&Tensor; 3],
        (pad, eps): (u32, f64),
        mode: Mode,
        _: Backprop,
    ) -> Result<Seq2SeqLoss> {
        RnnSeq2Seq::loss(self, src, tgt_in, tgt_out, pad, eps, mode)
    }
    fn start(
        &self,
        src: &Tensor,
        pad: u32,
        _: Option<&PreparedDecoding>,
    ) -> Result<Box<dyn ArchState>> {
        Ok(Box::new(StepModel::start(self, src, pad)?))
    }
    fn attention(&self, src: &Tensor, tgt_in: &Tensor, pad: u32) -> Result<AttentionWeights> {
        let (_, w) = self.decode_features(src, tgt_in, pad, Mode::Eval)?;
        Ok(AttentionWeights {
            // (1, T, S) as one head: (1, 1, T, S).
            cross: w.map(|w| w.unsqueeze(1)).transpose()?.into_iter().collect(),
            ..Default::default()
        })
    }
    fn describe_decoding(&self) -> String {
        "f32 (recurrent)".into()
    }
}

/// A translation model of any architecture ([`Architecture`]), and how its translations are
/// made as a published model's own engine makes them ([`EngineRules`]; usually the defaults).
#[derive(Debug)]
pub struct MtModel(Box<dyn Architecture>, EngineRules);

/// What a published model's engine does around the search, given when the model is loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineRules {
    /// The target tokens every translation starts with (an Argos package's target prefix).
    pub target_prefix: Vec<u32>,
    /// Every `<unk>` of a translation becomes the source piece its alignment weighs most
    /// (CTranslate2's `replace_unknowns`, Argos Translate's call): the alignment to read,
    /// `None` for none.
    pub replace_unknowns: Option<Alignment>,
}

/// Where an output token's alignment with the source is read: the encoder-decoder attention
/// of decoder layer `layer` averaged over its first `heads` heads, in a model of `shape`
/// (decoder layers, heads) ([`crate::translate::alignment_rows`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Alignment {
    /// The model's decoder layers and heads.
    pub shape: (usize, usize),
    /// The layer read.
    pub layer: usize,
    /// The heads averaged, from the first.
    pub heads: usize,
}

impl Clone for MtModel {
    fn clone(&self) -> Self {
        MtModel(self.0.clone_box(), self.1.clone())
    }
}

impl From<Seq2Seq> for MtModel {
    fn from(m: Seq2Seq) -> Self {
        MtModel(Box::new(m), EngineRules::default())
    }
}

impl MtModel {
    /// The longest sequence (with its `<eos>` or `<bos>`) the model takes: the Transformer's
    /// positional encoding length; `None` for the recurrent models, which have no limit.
    pub fn max_positions(&self) -> Option<usize> {
        self.0.max_positions()
    }

    /// Builds the model `cfg` describes, to run as `pb` says: its training precision,
    /// decoding arithmetic and output vocabulary ([`ParamBuilder::with_decoding`], ...).
    pub fn build(pb: &ParamBuilder, cfg: &MtModelConfig) -> transformer_model::Result<Self> {
        Ok(MtModel(cfg.arch().build(pb)?, EngineRules::default()))
    }

    /// The Transformer, when this model is one (int8 quantization, for one, covers only it).
    pub fn transformer(&self) -> Option<&Seq2Seq> {
        self.0.as_any().downcast_ref()
    }

    /// The recurrent model, when this model is one.
    pub fn recurrent(&self) -> Option<&RnnSeq2Seq> {
        self.0.as_any().downcast_ref()
    }

    /// The attention weights of one translation, fed with teacher forcing.
    pub fn attention(&self, src: &Tensor, tgt_in: &Tensor, pad: u32) -> Result<AttentionWeights> {
        self.0.attention(src, tgt_in, pad)
    }

    /// Label-smoothed cross-entropy of `tgt_out` over its non-padding positions, and the plain
    /// negative log-likelihood, with the gradients going where `backprop` says: with
    /// `Backprop::Direct`, the Transformer's embedding, encoder-layer and output-layer
    /// gradients go to its `DirectGrads` ([`Seq2Seq::loss`]); the recurrent models' all go
    /// to candle's `GradStore`.
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T), tgt_out (B, T) u32 -> scalars
    pub fn loss(
        &self,
        batch: [&Tensor; 3],
        pad_eps: (u32, f64),
        mode: Mode,
        backprop: Backprop,
    ) -> Result<Seq2SeqLoss> {
        self.0.loss(batch, pad_eps, mode, backprop)
    }

    /// The target tokens every translation starts with, forced after the start token
    /// ([`crate::translate::translate`] decodes with them unless the request gives its own):
    /// a published model's target prefix ([`crate::config::Published::target_prefix`]).
    pub fn target_prefix(&self) -> &[u32] {
        &self.1.target_prefix
    }

    /// How this model's translations are made around the search ([`EngineRules`]).
    pub fn engine_rules(&self) -> &EngineRules {
        &self.1
    }

    /// This model, its translations made under `rules`; given when the model is loaded.
    pub(crate) fn with_engine_rules(mut self, rules: EngineRules) -> Self {
        self.1 = rules;
        self
    }

    /// The arithmetic decoding is prepared in.
    pub fn decode_precision(&self) -> DecodePrecision {
        self.0.decode_precision()
    }

    /// What [`Self::decoder`] prepares decoding with, for logs.
    pub fn describe_decoding(&self) -> Result<String> {
        Ok(self.decoder()?.describe())
    }

    /// This model ready to decode many batches ([`MtDecoder`]).
    pub fn decoder(&self) -> Result<MtDecoder<'_>> {
        Ok(MtDecoder {
            model: self,
            prepared: self.0.prepare_decoding()?,
        })
    }
}

/// [`MtModel`]'s decoding state: its architecture's ([`ArchState`]).
pub struct MtState(Box<dyn ArchState>);

impl StepModel for MtModel {
    type State = MtState;

    fn max_output_len(&self) -> Option<usize> {
        self.max_positions().map(|p| p.saturating_sub(1))
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<MtState> {
        Ok(MtState(self.0.start(src, pad, None)?))
    }

    fn src_lens(&self, state: &MtState) -> Vec<usize> {
        state.0.src_lens()
    }

    fn step(&self, state: &mut MtState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        self.0.step(state.0.as_mut(), tokens, attention)
    }

    fn step_argmax(&self, state: &mut MtState, tokens: &[u32]) -> Result<Vec<u32>> {
        self.0.step_argmax(state.0.as_mut(), tokens)
    }

    fn select_rows(&self, state: &mut MtState, rows: &[u32]) -> Result<()> {
        state.0.select_rows(rows)
    }
}

/// An [`MtModel`] ready to decode many batches: a Transformer's decoding weights are made
/// ready once here ([`Seq2Seq::prepare_decoding`]) instead of for every batch. It decodes
/// exactly as the model does; build it again after the weights change.
pub struct MtDecoder<'a> {
    model: &'a MtModel,
    prepared: Option<PreparedDecoding>,
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
            None => self.model.0.describe_decoding(),
        }
    }
}

impl StepModel for MtDecoder<'_> {
    type State = MtState;

    fn max_output_len(&self) -> Option<usize> {
        StepModel::max_output_len(self.model)
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<MtState> {
        Ok(MtState(self.model.0.start(
            src,
            pad,
            self.prepared.as_ref(),
        )?))
    }

    fn src_lens(&self, state: &MtState) -> Vec<usize> {
        self.model.src_lens(state)
    }

    fn step(&self, state: &mut MtState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        self.model.step(state, tokens, attention)
    }

    fn step_argmax(&self, state: &mut MtState, tokens: &[u32]) -> Result<Vec<u32>> {
        self.model.step_argmax(state, tokens)
    }

    fn select_rows(&self, state: &mut MtState, rows: &[u32]) -> Result<()> {
        self.model.select_rows(state, rows)
    }
}
