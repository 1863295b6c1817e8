//! What incremental decoding of the Transformer keeps between steps: the decoding state of
//! a batch ([`DecodeState`]), made by [`crate::Seq2Seq::start`] and advanced by
//! [`crate::Seq2Seq::step`]. How a step runs (the fused stack or the composed layers with
//! their key/value caches; f32 or int8; the full or a restricted output layer) is the
//! backend's choice, made once in [`crate::Seq2Seq::prepare_decoding`]
//! ([`crate::backend::PreparedDecoding`]).

use crate::backend::{FusedDecoding, OutputLayer};
use crate::mask::Mask;
use crate::multi_head::KvCache;
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
    /// vocabulary is restricted ([`crate::ParamBuilder::with_candidates`]); `None`: every token.
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
