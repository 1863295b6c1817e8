//! The one decoding interface every sequence-to-sequence model implements: encode once,
//! step with a cache, reorder the cache. The searches in [`crate::search`] use nothing else.

use candle_core::{DType, Result, Tensor};
use transformer_model::seq2seq::Seq2SeqMasks;
use transformer_model::{DecodeState, Mask, Mode, RnnSeq2Seq, RnnState, Seq2Seq};

/// What one decoding step returns.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// Next-token logits, (B, V).
    pub logits: Tensor,
    /// When asked for: this step's attention over the source, (B, L, H, S) for a Transformer
    /// (every decoder layer and head of the encoder-decoder attention); a model with one
    /// attention (an RNN's) returns (B, 1, 1, S).
    pub attention: Option<Tensor>,
    /// The token id of each column of `logits`, ascending, when the model scores a
    /// restricted vocabulary ([`transformer_model::restrict`]); `None`: column `t` is token
    /// `t`.
    pub vocab: Option<std::sync::Arc<[u32]>>,
}

/// A model that decodes step by step.
///
/// - [`StepModel::start`] encodes a batch of sources once and returns the decoding state
///   (for a Transformer: the encoder-decoder keys and values of every layer, and empty
///   self-attention caches);
/// - [`StepModel::step`] feeds one token per row (`<bos>` first) and returns the next
///   token's logits, growing the state's caches by one position;
/// - [`StepModel::select_rows`] keeps some rows of the state, in a given order, repeats
///   allowed: beams expand, follow their parents and drop finished sentences with it.
pub trait StepModel {
    /// Everything kept between steps.
    type State;
    /// Encodes a batch of sources and returns the state before the first step.
    ///
    /// # Shapes
    /// src (B, S) u32, padded with `pad`
    fn start(&self, src: &Tensor, pad: u32) -> Result<Self::State>;
    /// Source lengths (without padding) of the state's rows.
    fn src_lens(&self, state: &Self::State) -> Vec<usize>;
    /// Feeds one token per row and returns the next token's logits (and, with `attention`,
    /// the step's attention over the source).
    ///
    /// # Shapes
    /// tokens: one per row -> logits (B, V)
    fn step(&self, state: &mut Self::State, tokens: &[u32], attention: bool) -> Result<StepOutput>;
    /// Keeps rows `rows` of the state, in that order.
    fn select_rows(&self, state: &mut Self::State, rows: &[u32]) -> Result<()>;
    /// [`StepModel::step`] for greedy search: only each row's most likely next token, the
    /// token of the largest logit (the first of equals). A model may find it without computing
    /// every logit exactly; this default computes them.
    ///
    /// # Shapes
    /// tokens: one per row -> one token per row
    fn step_argmax(&self, state: &mut Self::State, tokens: &[u32]) -> Result<Vec<u32>> {
        let out = self.step(state, tokens, false)?;
        let lp = LogProbs::of(&out)?;
        Ok((0..lp.rows()).map(|r| lp.argmax(r)).collect())
    }
    /// The longest output the model can produce, whatever the length limit of
    /// [`crate::DecodeOptions`] says (`None`: no limit). A Transformer's decoder sees `<bos>`
    /// and every output token at its own position, so it makes at most its positional
    /// encoding's length minus one; the searches end every hypothesis there.
    fn max_output_len(&self) -> Option<usize> {
        None
    }
}

/// Stacks each layer's encoder-decoder weights of one position: (B, H, 1, S) per layer ->
/// (B, L, H, S).
fn stack_cross(weights: &[transformer_model::decoder::DecoderWeights]) -> Result<Tensor> {
    let per_layer: Vec<Tensor> = weights
        .iter()
        .map(|w| w.cross_attn.squeeze(2))
        .collect::<Result<_>>()?;
    Tensor::stack(&per_layer, 1)?.to_dtype(DType::F32)
}

/// The Transformer with its key/value caches ([`Seq2Seq::start`], [`Seq2Seq::step`]).
impl StepModel for Seq2Seq {
    type State = DecodeState;

    fn max_output_len(&self) -> Option<usize> {
        Some(self.max_positions().saturating_sub(1))
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<DecodeState> {
        Seq2Seq::start(self, src, pad)
    }

    fn src_lens(&self, state: &DecodeState) -> Vec<usize> {
        state.src_lens.clone()
    }

    fn step(&self, state: &mut DecodeState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        let dev = self.device();
        let ids = Tensor::new(tokens, &dev)?;
        let (logits, weights) = Seq2Seq::step(self, state, &ids, attention)?;
        Ok(StepOutput {
            logits,
            attention: weights.as_deref().map(stack_cross).transpose()?,
            vocab: state.vocab().cloned(),
        })
    }

    fn select_rows(&self, state: &mut DecodeState, rows: &[u32]) -> Result<()> {
        state.select_rows(rows)
    }

    /// The output layer's own argmax ([`transformer_model::backend::OutputLayer::argmax`]).
    fn step_argmax(&self, state: &mut DecodeState, tokens: &[u32]) -> Result<Vec<u32>> {
        let ids = Tensor::new(tokens, &self.device())?;
        Seq2Seq::step_argmax(self, state, &ids)
    }
}

/// The recurrent encoder-decoders ([`RnnSeq2Seq`]): the state is the encoder outputs and the
/// decoder's hidden state; attention weights come as (B, 1, 1, S).
impl StepModel for RnnSeq2Seq {
    type State = RnnState;

    fn start(&self, src: &Tensor, pad: u32) -> Result<RnnState> {
        RnnSeq2Seq::start(self, src, pad)
    }

    fn src_lens(&self, state: &RnnState) -> Vec<usize> {
        state.src_lens.clone()
    }

    fn step(&self, state: &mut RnnState, tokens: &[u32], attention: bool) -> Result<StepOutput> {
        let ids = Tensor::new(tokens, self.generator_device())?;
        let (logits, weights) = RnnSeq2Seq::step(self, state, &ids, attention)?;
        Ok(StepOutput {
            logits,
            attention: weights
                .map(|w| w.unsqueeze(1)?.unsqueeze(1)?.to_dtype(DType::F32))
                .transpose()?,
            vocab: None,
        })
    }

    fn select_rows(&self, state: &mut RnnState, rows: &[u32]) -> Result<()> {
        state.select_rows(rows)
    }
}

/// The Transformer decoded the plain way, as most tutorials do: every step runs the decoder
/// over the whole prefix again (no cache). The reference the cached path is tested against,
/// and the baseline it is timed against.
pub struct Recompute<'a>(pub &'a Seq2Seq);

/// [`Recompute`]'s state: the encoder output, the source mask, and every row's prefix.
pub struct RecomputeState {
    memory: Tensor,
    src: Tensor,
    prefix: Vec<Vec<u32>>,
    src_lens: Vec<usize>,
    pad: u32,
}

impl StepModel for Recompute<'_> {
    type State = RecomputeState;

    fn max_output_len(&self) -> Option<usize> {
        StepModel::max_output_len(self.0)
    }

    fn start(&self, src: &Tensor, pad: u32) -> Result<RecomputeState> {
        let mask = Mask::key_padding_from_ids(src, pad)?;
        let memory = self.0.encode(src, Some(&mask), Mode::Eval)?;
        let src_lens = transformer_model::mask::lengths(src, pad)?;
        Ok(RecomputeState {
            memory,
            src: src.clone(),
            prefix: vec![Vec::new(); src_lens.len()],
            src_lens,
            pad,
        })
    }

    fn src_lens(&self, state: &RecomputeState) -> Vec<usize> {
        state.src_lens.clone()
    }

    fn step(
        &self,
        state: &mut RecomputeState,
        tokens: &[u32],
        attention: bool,
    ) -> Result<StepOutput> {
        for (p, &t) in state.prefix.iter_mut().zip(tokens) {
            p.push(t);
        }
        let (b, t) = (state.prefix.len(), state.prefix[0].len());
        let flat: Vec<u32> = state.prefix.iter().flatten().copied().collect();
        let tgt = Tensor::from_vec(flat, (b, t), state.memory.device())?;
        let masks = Seq2SeqMasks::new(&state.src, &tgt, state.pad)?;
        // The prefix holds no padding (every row gets a token each step): causal mask only.
        let causal = Mask::causal(t, tgt.device())?;
        let (logits, weights) = self.0.decode_as(
            &tgt,
            &state.memory,
            Some(&causal),
            Some(&masks.memory),
            transformer_model::Pass::new(Mode::Eval).weights(),
        )?;
        // (B, T, V) -> (B, V) at the last position.
        let logits = logits.narrow(1, t - 1, 1)?.squeeze(1)?;
        let attention = if attention {
            let last: Vec<_> = weights
                .iter()
                .map(|w| {
                    Ok(transformer_model::decoder::DecoderWeights {
                        self_attn: w.self_attn.clone(),
                        cross_attn: w.cross_attn.narrow(2, t - 1, 1)?,
                    })
                })
                .collect::<Result<_>>()?;
            Some(stack_cross(&last)?)
        } else {
            None
        };
        Ok(StepOutput {
            logits,
            attention,
            vocab: None,
        })
    }

    fn select_rows(&self, state: &mut RecomputeState, rows: &[u32]) -> Result<()> {
        let idx = Tensor::new(rows, state.memory.device())?;
        state.memory = state.memory.index_select(&idx, 0)?;
        state.src = state.src.index_select(&idx, 0)?;
        state.prefix = rows
            .iter()
            .map(|&r| state.prefix[r as usize].clone())
            .collect();
        state.src_lens = rows.iter().map(|&r| state.src_lens[r as usize]).collect();
        Ok(())
    }
}

/// Next-token log-probabilities of a batch of rows, kept as the logits (read in place from
/// the step's output tensor when it is a contiguous CPU f32 one) and each row's log-normaliser:
/// `log p(t | row r) = logits[r][t] - lse[r]`, in f32, the very value a log-softmax written
/// out would hold ([`transformer_model::log_sum_exp_rows_f32`]). A beam search
/// reads a few entries of each row, so writing out every `rows x V` log-probability (and
/// copying the logits out of the tensor first) cost more than the search itself.
pub struct LogProbs<'a> {
    logits: Logits<'a>,
    width: usize,
    lse: Vec<f32>,
    /// The token of each column, when the vocabulary is restricted (ascending).
    vocab: Option<std::sync::Arc<[u32]>>,
}

/// Where [`LogProbs`] reads the logits.
enum Logits<'a> {
    /// A contiguous CPU f32 tensor's storage: `len` elements from `offset`.
    Borrowed {
        /// The storage's read guard (candle's lock type, unnamed here).
        storage: Box<dyn std::ops::Deref<Target = candle_core::Storage> + 'a>,
        offset: usize,
        len: usize,
    },
    /// A copy (other devices and dtypes).
    Owned(Vec<f32>),
}

impl Logits<'_> {
    fn data(&self) -> &[f32] {
        match self {
            Logits::Borrowed {
                storage,
                offset,
                len,
            } => match &***storage {
                candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => {
                    &v[*offset..*offset + *len]
                }
                _ => unreachable!("only contiguous CPU f32 storage is borrowed"),
            },
            Logits::Owned(v) => v,
        }
    }
}

impl<'a> LogProbs<'a> {
    /// The log-probabilities of `logits` (B, V).
    pub fn new(logits: &'a Tensor) -> Result<Self> {
        let (_, width) = logits.dims2()?;
        let (storage, layout) = logits.storage_and_layout();
        let borrowed = matches!(
            &*storage,
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(_))
        ) && layout.is_contiguous();
        let logits = if borrowed {
            Logits::Borrowed {
                offset: layout.start_offset(),
                len: layout.shape().elem_count(),
                storage: Box::new(storage),
            }
        } else {
            drop(storage);
            Logits::Owned(
                logits
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            )
        };
        let lse = transformer_model::log_sum_exp_rows_f32(logits.data(), width);
        Ok(Self {
            logits,
            width,
            lse,
            vocab: None,
        })
    }

    /// The log-probabilities of a step's output: over its restricted vocabulary when it has
    /// one (the other tokens have none: [`Self::get`] gives `None` for them).
    pub fn of(out: &'a StepOutput) -> Result<Self> {
        let mut lp = Self::new(&out.logits)?;
        lp.vocab.clone_from(&out.vocab);
        Ok(lp)
    }

    /// The token of column `c` of [`Self::logits`].
    pub fn token(&self, c: usize) -> u32 {
        match &self.vocab {
            Some(v) => v[c],
            None => c as u32,
        }
    }

    /// The column of token `t`, `None` when it is not scored.
    fn column(&self, t: u32) -> Option<usize> {
        match &self.vocab {
            Some(v) => v.binary_search(&t).ok(),
            None => Some(t as usize),
        }
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.lse.len()
    }

    /// Row `r`'s logits, one per column ([`Self::token`] names each column's token).
    pub fn logits(&self, r: usize) -> &[f32] {
        &self.logits.data()[r * self.width..(r + 1) * self.width]
    }

    /// Row `r`'s log-normaliser: `log p(t) = logits(r)[t] - lse(r)`.
    pub fn lse(&self, r: usize) -> f32 {
        self.lse[r]
    }

    /// `log p(t | row r)`; `None` when `t` is outside the vocabulary (or not among the
    /// restricted vocabulary's tokens).
    pub fn get(&self, r: usize, t: u32) -> Option<f32> {
        let l = self.lse[r];
        self.logits(r).get(self.column(t)?).map(|&x| x - l)
    }

    /// Row `r`'s log-probabilities written out, one per column.
    pub fn row(&self, r: usize) -> Vec<f32> {
        let l = self.lse[r];
        self.logits(r).iter().map(|&x| x - l).collect()
    }

    /// The most likely token of row `r`: the largest logit, the first of equals. (Compared
    /// as logits, before `- lse` rounds two nearly equal ones to one log-probability.)
    pub fn argmax(&self, r: usize) -> u32 {
        self.token(transformer_model::first_largest(self.logits(r)))
    }
}
