//! The recurrent encoder-decoders the Transformer replaced, as baselines in the same harness:
//! one bidirectional GRU encoder and three decoders.
//!
//! - [`RnnAttention::None`] (Cho et al. 2014; Sutskever et al. 2014): the decoder sees the
//!   source only through one fixed-size vector `z`, made from the encoder's final states. `z`
//!   is its initial state and is fed again at every step, in the GRU's input and in the output
//!   layer's: `s_t = GRU([y_t; z], s_{t-1})`, output `o_t = tanh(W_o [s_t; z; y_t])`.
//! - [`RnnAttention::Dot`] (Luong et al. 2015, dot score): `s_t = GRU(y_t, s_{t-1})`, scores
//!   `s_t . h_i` over the encoder outputs `h_i`, weights `a_t = softmax(scores)`, context
//!   `c_t = sum_i a_ti h_i`, output `o_t = tanh(W_o [s_t; c_t])` (Luong's attentional
//!   hidden state).
//! - [`RnnAttention::Bahdanau`] (Bahdanau et al. 2015, additive): scores
//!   `v . tanh(W_b s_{t-1} + W_c h_i)` from the previous state, the context concatenated into
//!   the GRU's input, `s_t = GRU([y_t; c_t], s_{t-1})`, output `o_t = tanh(W_o [s_t; c_t;
//!   y_t])` (Bahdanau's deep output, with tanh in place of maxout).
//!
//! All three end in the same output layer, logits `= W o_t + b` from `o_t` of `2 hidden`
//! units: the models differ only in how the source reaches the decoder. (Feeding
//! `[s_t; c_t; y_t]` to the vocabulary directly, as some tutorials do, makes the output layer
//! 2.5 times as large at the default sizes, and it dominates the step.)
//!
//! The encoder is an embedding (with dropout) and one bidirectional GRU layer of `hidden`
//! units per direction; its outputs `h_i` are both directions' states, `2 hidden` wide, and the
//! decoder's state is `2 hidden` wide too (so the dot score needs no projection). The decoder
//! starts from `tanh(W [h_fwd; h_bwd])` of the encoder's final states. Attention never looks at
//! padding: padded source positions get zero weight.
//!
//! Training runs the decoder over the target with teacher forcing and ends in the same
//! label-smoothed loss as the Transformer ([`crate::seq2seq::label_smoothed_loss`]); decoding
//! steps through [`RnnSeq2Seq::start`] and [`RnnSeq2Seq::step`] with an [`RnnState`].

use crate::dropout::{Dropout, Mode};
use crate::embedding::Embedding;
use crate::gru::{Gru, GruDirection};
use crate::linear::Linear;
use crate::mask::Mask;
use crate::params::{Init, ParamBuilder};
use crate::seq2seq::{label_smoothed_loss, Seq2SeqLoss};
use crate::Result;
use candle_core::{Tensor, D};
use serde::{Deserialize, Serialize};

/// Which decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RnnAttention {
    /// No attention: the encoder's final state only.
    None,
    /// Dot-product (Luong) attention.
    Dot,
    /// Additive (Bahdanau) attention.
    Bahdanau,
}

/// Sizes of a recurrent encoder-decoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RnnSeq2SeqConfig {
    /// Source vocabulary size.
    pub src_vocab: usize,
    /// Target vocabulary size V (the output layer's width).
    pub tgt_vocab: usize,
    /// Embedding width of both sides.
    pub emb: usize,
    /// GRU units per encoder direction; the decoder has twice as many.
    pub hidden: usize,
    /// Dropout on the embeddings.
    pub dropout: f64,
    /// How the decoder attends over the encoder states.
    pub attention: RnnAttention,
}

impl RnnSeq2SeqConfig {
    /// Checks the sizes before any tensor exists.
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("src_vocab", self.src_vocab),
            ("tgt_vocab", self.tgt_vocab),
            ("emb", self.emb),
            ("hidden", self.hidden),
        ] {
            if v == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(format!("dropout is {}: it must be in [0, 1)", self.dropout));
        }
        Ok(())
    }

    /// Width of what the output projection `W_o` reads.
    fn output_inputs(&self) -> usize {
        let d = 2 * self.hidden;
        match self.attention {
            RnnAttention::None | RnnAttention::Bahdanau => d + d + self.emb,
            RnnAttention::Dot => d + d,
        }
    }
}

/// Additive attention's layers: `v . tanh(W_b s + W_c h)`.
#[derive(Debug, Clone)]
struct Additive {
    /// W_c, applied once per sentence to the encoder outputs (with the bias).
    keys: Linear,
    /// W_b, applied to the decoder state at every step.
    query: Linear,
    /// v, (1, 2H) without bias.
    v: Linear,
}

/// A recurrent encoder-decoder (see the module docs).
#[derive(Debug, Clone)]
pub struct RnnSeq2Seq {
    cfg: RnnSeq2SeqConfig,
    src_embedding: Embedding,
    tgt_embedding: Embedding,
    encoder: Gru,
    /// Encoder final states (2H) -> the decoder's initial state (2H).
    bridge: Linear,
    decoder: GruDirection,
    additive: Option<Additive>,
    /// `W_o`: the decoder's state and what it reads of the source -> `o_t` (2H).
    output: Linear,
    generator: Linear,
    dropout: Dropout,
}

/// What decoding keeps between steps for B rows.
#[derive(Debug, Clone)]
pub struct RnnState {
    /// Encoder outputs, (B, S, 2H).
    outputs: Tensor,
    /// Bahdanau's `W_c h_i + b`, (B, S, 2H), computed once.
    keys: Option<Tensor>,
    /// 0 for tokens, a large negative number for padding, (B, S).
    mask: Tensor,
    /// The fixed-size summary `z` (the model without attention), (B, 2H).
    summary: Tensor,
    /// The decoder's state, (B, 2H).
    state: Tensor,
    /// Source length of every row (without padding).
    pub src_lens: Vec<usize>,
}

impl RnnState {
    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.src_lens.len()
    }

    /// Cuts every tensor of the state from candle's graph (decoding: the values only).
    fn detach(&mut self) {
        self.outputs = self.outputs.detach();
        self.keys = self.keys.as_ref().map(Tensor::detach);
        self.mask = self.mask.detach();
        self.summary = self.summary.detach();
        self.state = self.state.detach();
    }

    /// Keeps rows `rows` in that order (repeats allowed).
    ///
    /// # Shapes
    /// rows (B',) u32
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        let idx = Tensor::new(rows, self.state.device())?;
        self.outputs = self.outputs.index_select(&idx, 0)?;
        if let Some(k) = &self.keys {
            self.keys = Some(k.index_select(&idx, 0)?);
        }
        self.mask = self.mask.index_select(&idx, 0)?;
        self.summary = self.summary.index_select(&idx, 0)?;
        self.state = self.state.index_select(&idx, 0)?;
        self.src_lens = rows.iter().map(|&r| self.src_lens[r as usize]).collect();
        Ok(())
    }
}

impl RnnSeq2Seq {
    /// Parameters: `src_embedding.weight`, `tgt_embedding.weight`, `encoder.*_l0[_reverse]`
    /// (PyTorch's GRU names), `bridge.*`, `decoder.*_l0`, `attention.{keys,query,v}.*`
    /// (Bahdanau), `output.*`, `generator.*`. PyTorch's default initialisations:
    /// embeddings of unit variance, linear and GRU weights U(-1/sqrt(fan), 1/sqrt(fan)).
    pub fn new(pb: &ParamBuilder, cfg: &RnnSeq2SeqConfig) -> Result<Self> {
        cfg.validate().map_err(candle_core::Error::Msg)?;
        let (e, h) = (cfg.emb, cfg.hidden);
        let d = 2 * h;
        // U(-sqrt(3), sqrt(3)) has unit variance, as PyTorch's N(0, 1) embeddings.
        let emb_init = Init::Uniform(3f64.sqrt());
        let src_embedding = Embedding::new(&pb.pp("src_embedding"), cfg.src_vocab, e, emb_init)?;
        let tgt_embedding = Embedding::new(&pb.pp("tgt_embedding"), cfg.tgt_vocab, e, emb_init)?;
        let encoder = Gru::new(&pb.pp("encoder"), e, h, 1, true, 0.0)?;
        let bridge = Linear::new(&pb.pp("bridge"), d, d, true)?;
        let decoder_input = match cfg.attention {
            RnnAttention::None | RnnAttention::Bahdanau => e + d,
            RnnAttention::Dot => e,
        };
        let decoder = GruDirection::new(&pb.pp("decoder"), 0, "", decoder_input, d)?;
        let additive = match cfg.attention {
            RnnAttention::Bahdanau => {
                let a = pb.pp("attention");
                Some(Additive {
                    keys: Linear::new(&a.pp("keys"), d, d, true)?,
                    query: Linear::new(&a.pp("query"), d, d, false)?,
                    v: Linear::new(&a.pp("v"), d, 1, false)?,
                })
            }
            _ => None,
        };
        let output = Linear::new(&pb.pp("output"), cfg.output_inputs(), d, true)?;
        let generator = Linear::new(&pb.pp("generator"), d, cfg.tgt_vocab, true)?;
        Ok(Self {
            cfg: cfg.clone(),
            src_embedding,
            tgt_embedding,
            encoder,
            bridge,
            decoder,
            additive,
            output,
            generator,
            dropout: Dropout::new(cfg.dropout),
        })
    }

    /// The device the weights live on.
    pub fn generator_device(&self) -> &candle_core::Device {
        self.generator.weight().device()
    }

    /// The configuration the model was built from.
    pub fn config(&self) -> &RnnSeq2SeqConfig {
        &self.cfg
    }

    /// Encodes a padded batch and returns the decoding state at the first step.
    ///
    /// # Shapes
    /// src (B, S) u32, padded with `pad_id`
    pub fn start_with(&self, src: &Tensor, pad_id: u32, mode: Mode) -> Result<RnnState> {
        let (b, s) = src.dims2()?;
        let src_lens: Vec<usize> = crate::mask::lengths(src, pad_id)?;
        let x = self
            .dropout
            .forward(&self.src_embedding.forward(src)?, mode)?;
        let (outputs, finals) = self.encoder.forward(&x, Some(&src_lens), None, mode)?;
        // (2, B, H) -> (B, 2H): the forward direction's last state beside the reverse one's.
        let last = Tensor::cat(&[finals.get(0)?, finals.get(1)?], D::Minus1)?;
        let state = crate::ops::tanh(&self.bridge.forward(&last)?)?;
        let mask = Mask::key_padding_from_ids(src, pad_id)?
            .additive(outputs.dtype())?
            .reshape((b, s))?;
        let keys = match &self.additive {
            Some(a) => Some(a.keys.forward(&outputs)?),
            None => None,
        };
        Ok(RnnState {
            outputs,
            keys,
            mask,
            summary: state.clone(),
            state,
            src_lens,
        })
    }

    /// Encodes a batch of sources for decoding (evaluation mode). The state is detached from
    /// candle's graph, as every step's is ([`Self::step`]): decoding keeps no graph, so a
    /// long output's memory does not grow with every step's gates.
    pub fn start(&self, src: &Tensor, pad_id: u32) -> Result<RnnState> {
        let mut st = self.start_with(src, pad_id, Mode::Eval)?;
        st.detach();
        Ok(st)
    }

    /// Attention of `query` (B, 2H) over the state's encoder outputs: weights (B, S) and
    /// context (B, 2H).
    fn attend(&self, st: &RnnState, query: &Tensor) -> Result<(Tensor, Tensor)> {
        let scores = match (&self.additive, &st.keys) {
            (Some(a), Some(keys)) => {
                // (B, S, 2H) + (B, 1, 2H) -> tanh -> v -> (B, S)
                let q = a.query.forward(query)?.unsqueeze(1)?;
                a.v.forward(&crate::ops::tanh(&keys.broadcast_add(&q)?)?)?
                    .squeeze(2)?
            }
            // (B, S, 2H) @ (B, 2H, 1) -> (B, S)
            _ => st.outputs.matmul(&query.unsqueeze(2)?)?.squeeze(2)?,
        };
        let weights = crate::softmax_last_dim(&(scores + &st.mask)?)?;
        // (B, 1, S) @ (B, S, 2H) -> (B, 2H)
        let context = weights.unsqueeze(1)?.matmul(&st.outputs)?.squeeze(1)?;
        Ok((weights, context))
    }

    /// One decoder step from the embedded previous token `y` (B, E): advances the state and
    /// returns what the output projection `W_o` reads (B, F) and, with attention, its
    /// weights (B, S).
    fn advance(&self, st: &mut RnnState, y: &Tensor) -> Result<(Tensor, Option<Tensor>)> {
        match self.cfg.attention {
            RnnAttention::None => {
                let s = self
                    .decoder
                    .step(&Tensor::cat(&[y, &st.summary], 1)?, &st.state)?;
                st.state = s.clone();
                Ok((Tensor::cat(&[&s, &st.summary, y], 1)?, None))
            }
            RnnAttention::Dot => {
                let s = self.decoder.step(y, &st.state)?;
                st.state = s.clone();
                let (w, c) = self.attend(st, &s)?;
                Ok((Tensor::cat(&[&s, &c], 1)?, Some(w)))
            }
            RnnAttention::Bahdanau => {
                let (w, c) = self.attend(st, &st.state)?;
                let s = self.decoder.step(&Tensor::cat(&[y, &c], 1)?, &st.state)?;
                st.state = s.clone();
                Ok((Tensor::cat(&[&s, &c, y], 1)?, Some(w)))
            }
        }
    }

    /// The output layer's inputs `o_t` for every target position (teacher forcing) and the
    /// attention weights of each position.
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T) u32 -> features (B, T, 2H), weights (B, T, S) when the
    /// model attends
    pub fn decode_features(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        pad_id: u32,
        mode: Mode,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let mut st = self.start_with(src, pad_id, mode)?;
        let t = tgt_in.dim(1)?;
        let y = self
            .dropout
            .forward(&self.tgt_embedding.forward(tgt_in)?, mode)?;
        let mut feats = Vec::with_capacity(t);
        let mut weights = Vec::with_capacity(t);
        for i in 0..t {
            let (f, w) = self.advance(&mut st, &y.narrow(1, i, 1)?.squeeze(1)?)?;
            feats.push(f);
            if let Some(w) = w {
                weights.push(w);
            }
        }
        let weights = if weights.is_empty() {
            None
        } else {
            Some(Tensor::stack(&weights, 1)?)
        };
        // W_o and tanh for every position at once: one product instead of T.
        let o = crate::ops::tanh(&self.output.forward(&Tensor::stack(&feats, 1)?)?)?;
        Ok((o, weights))
    }

    /// Logits for every target position (teacher forcing).
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T) u32 -> (B, T, V)
    pub fn forward(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        pad_id: u32,
        mode: Mode,
    ) -> Result<Tensor> {
        let (f, _) = self.decode_features(src, tgt_in, pad_id, mode)?;
        self.generator.forward(&f)
    }

    /// Label-smoothed cross-entropy of `tgt_out` over its non-padding positions (see
    /// [`label_smoothed_loss`]).
    ///
    /// # Shapes
    /// src (B, S), tgt_in (B, T), tgt_out (B, T) u32 -> scalars
    pub fn loss(
        &self,
        src: &Tensor,
        tgt_in: &Tensor,
        tgt_out: &Tensor,
        pad_id: u32,
        eps: f64,
        mode: Mode,
    ) -> Result<Seq2SeqLoss> {
        let (f, _) = self.decode_features(src, tgt_in, pad_id, mode)?;
        label_smoothed_loss(&f, &self.generator, tgt_out, pad_id, eps)
    }

    /// Feeds one token per row and returns the next token's logits and, for the attention
    /// models when asked, this step's weights over the source.
    ///
    /// # Shapes
    /// tokens (B,) u32 -> logits (B, V), weights (B, S)
    pub fn step(
        &self,
        state: &mut RnnState,
        tokens: &Tensor,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let y = self.tgt_embedding.forward(tokens)?;
        let (f, w) = self.advance(state, &y)?;
        // The next step starts from values, not from this step's graph (see `start`).
        state.detach();
        let f = crate::ops::tanh(&self.output.forward(&f)?)?;
        let bias = self.generator.bias().expect("the output layer has a bias");
        let logits = crate::ops::linear_few_rows(&f, self.generator.weight(), bias)?;
        Ok((logits, if need_weights { w } else { None }))
    }
}
