//! What a Transformer keeps while it decodes ([`crate::Seq2Seq::start`],
//! [`crate::Seq2Seq::step`]): the decoding state of a batch, and the weights made ready
//! once for many batches.

use crate::mask::Mask;
use crate::multi_head::KvCache;
use crate::restrict::RestrictedOutput;
use crate::Result;
use candle_core::Tensor;
use std::sync::{Arc, OnceLock};

/// What incremental decoding keeps between steps for a batch of B rows (sentences, or
/// sentences x beams): the encoder-decoder keys and values of every layer (computed once),
/// the self-attention cache of every layer, the source padding mask and the position of the
/// next token. Passed explicitly to [`crate::Seq2Seq::step`]; the model holds no state.
#[derive(Debug, Clone)]
pub struct DecodeState {
    pub(crate) caches: Caches,
    /// The output layer's weight transposed, (C, V), made at the first step with more rows
    /// than [`crate::kernels::linear_few_rows`] takes ([`crate::kernels::linear_wt`]);
    /// shared by the batches started from one [`PreparedDecoding`].
    pub(crate) generator_t: Arc<OnceLock<Tensor>>,
    /// The output layer in int8, when decoding in int8 with it.
    pub(crate) generator_q: Option<Arc<crate::kernels::int8::QuantizedLinear>>,
    /// The output layer cut down to this batch's candidates, when restricted.
    pub(crate) restricted: Option<RestrictedOutput>,
    /// Target positions decoded so far.
    pub position: usize,
    /// Source length of every row (without padding), for the decoding length limit.
    pub src_lens: Vec<usize>,
}

/// A Transformer's decoding weights made ready once for many batches
/// ([`crate::Seq2Seq::prepare_decoding`]).
#[derive(Debug, Clone)]
pub struct PreparedDecoding {
    /// The fused step's stack with its weights transposed, where the decoder allows it.
    pub(crate) stack: Option<crate::kernels::DecoderStack>,
    /// The output layer's weight transposed, (C, V), made at the first step that needs it.
    pub(crate) generator_t: Arc<OnceLock<Tensor>>,
    /// The output layer in int8 ([`DecodePrecision::Int8`] with `output_layer`).
    pub(crate) generator_q: Option<Arc<crate::kernels::int8::QuantizedLinear>>,
}

impl PreparedDecoding {
    /// What decoding was prepared with, for logs: the decoder layers' arithmetic (and its
    /// kernel) and the output layer's.
    pub fn describe(&self) -> String {
        let layers = match &self.stack {
            None => "decoder layers f32 (composed)".to_string(),
            Some(s) => match s.int8_kernel() {
                Some(k) => format!("decoder layers int8 ({})", k.name()),
                None => "decoder layers f32 (fused step)".to_string(),
            },
        };
        let output = match &self.generator_q {
            Some(q) => format!("output layer int8 ({})", q.kernel().name()),
            None => "output layer f32".to_string(),
        };
        let slow = self
            .stack
            .as_ref()
            .and_then(|s| s.int8_kernel())
            .or(self.generator_q.as_ref().map(|q| q.kernel()))
            .is_some_and(|k| k != crate::kernels::int8::Int8Kernel::Avx512Vnni);
        if slow {
            // Measured (crates/kernels/examples/int8_bench.rs): without VNNI the int8
            // products run below the f32 ones.
            format!(
                "{layers}, {output}; this CPU has no AVX512-VNNI: int8 saves memory here but                  decodes slower than f32"
            )
        } else {
            format!("{layers}, {output}")
        }
    }
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
    /// [`crate::kernels::DecoderStack::step`]'s cache, reordered without copying, and the
    /// stack it runs (collected and checked once per batch, not at every step).
    Fused(crate::kernels::DecodeCache, crate::kernels::DecoderStack),
}

impl DecodeState {
    /// Rows (sentences or hypotheses) in the batch.
    pub fn rows(&self) -> usize {
        self.src_lens.len()
    }

    /// The token id of each logit column [`crate::Seq2Seq::step`] returns, when the output
    /// vocabulary is restricted ([`crate::Seq2Seq::set_candidate_vocab`]); `None`: every token.
    pub fn vocab(&self) -> Option<&Arc<[u32]>> {
        self.restricted.as_ref().map(RestrictedOutput::ids)
    }

    /// Whether the steps run as one fused op ([`crate::kernels::DecoderStack`]).
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
            Caches::Fused(c, _) => c.select_rows(rows)?,
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
