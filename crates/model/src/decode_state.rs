//! Incremental decoding of the Transformer ([`crate::Seq2Seq::start`],
//! [`crate::Seq2Seq::step`]) and what it keeps: the decoding state of a batch. How a step
//! runs (the fused stack or the composed layers with their key/value caches; f32 or int8;
//! the full or a restricted output layer) is the backend's choice, made once in
//! [`crate::Seq2Seq::prepare_decoding`] ([`crate::backend::PreparedDecoding`]); this module
//! only follows it.

use crate::backend::{FusedDecoding, OutputLayer};
use crate::decoder::DecoderWeights;
use crate::dropout::Mode;
use crate::mask::Mask;
use crate::multi_head::KvCache;
use crate::seq2seq::Seq2Seq;
use crate::Result;
use candle_core::Tensor;
use std::sync::Arc;

pub use crate::backend::PreparedDecoding;

/// What incremental decoding keeps between steps for a batch of B rows (sentences, or
/// sentences x beams): the encoder-decoder keys and values of every layer (computed once),
/// the self-attention cache of every layer, the source padding mask and the position of the
/// next token. Passed explicitly to [`crate::Seq2Seq::step`]; the model holds no state.
#[derive(Debug, Clone)]
pub struct DecodeState {
    pub(crate) caches: Caches,
    /// The output layer this batch scores with (restricted to its candidates, when asked).
    pub(crate) output: OutputLayer,
    /// Target positions decoded so far.
    pub position: usize,
    /// Source length of every row (without padding), for the decoding length limit.
    pub src_lens: Vec<usize>,
}

/// The caches of the composed decoder layers, or of the fused decoding step.
#[derive(Debug, Clone)]
pub(crate) enum Caches {
    /// Tensors per row, reordered by copying ([`crate::decoder::DecoderLayer::forward_step`]).
    Tensors {
        memory_kv: Vec<(Tensor, Tensor)>,
        caches: Vec<KvCache>,
        memory_mask: Mask,
    },
    /// The backend's fused step with its own caches.
    Fused(FusedDecoding),
}

impl DecodeState {
    /// Rows (sentences or hypotheses) in the batch.
    pub fn rows(&self) -> usize {
        self.src_lens.len()
    }

    /// The token id of each logit column [`crate::Seq2Seq::step`] returns, when the output
    /// vocabulary is restricted ([`crate::Seq2Seq::set_candidate_vocab`]); `None`: every token.
    pub fn vocab(&self) -> Option<&Arc<[u32]>> {
        self.output.ids()
    }

    /// Whether the steps run as one fused op ([`crate::backend::DecodingStack`]).
    pub fn is_fused(&self) -> bool {
        matches!(self.caches, Caches::Fused(..))
    }

    /// Keeps rows `rows` in that order (repeats allowed): expands sentences into beams,
    /// follows hypotheses to their parents, drops finished sentences.
    ///
    /// # Shapes
    /// rows (B',) u32
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        match &mut self.caches {
            Caches::Fused(f) => f.select_rows(rows)?,
            Caches::Tensors {
                memory_kv,
                caches,
                memory_mask,
            } => {
                let dev = memory_mask.keep().device().clone();
                let idx = Tensor::new(rows, &dev)?;
                for (k, v) in memory_kv.iter_mut() {
                    *k = k.index_select(&idx, 0)?;
                    *v = v.index_select(&idx, 0)?;
                }
                for c in caches.iter_mut() {
                    c.select_rows(&idx)?;
                }
                *memory_mask = memory_mask.select_rows(&idx)?;
            }
        }
        self.src_lens = rows.iter().map(|&r| self.src_lens[r as usize]).collect();
        Ok(())
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
    /// in this model's [`DecodePrecision`](crate::DecodePrecision)
    /// ([`Self::set_decode_precision`]). On the CPU: the fused step's stack with its weight
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
    /// ([`OutputLayer::argmax`]: on the CPU without computing every logit exactly).
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
