//! Incremental decoding of the Transformer ([`crate::Seq2Seq::start`],
//! [`crate::Seq2Seq::step`]) and what it keeps: the decoding state of a batch, and the
//! weights made ready once for many batches. How a step runs (the fused CPU stack chosen by
//! the model's backend, or the composed layers with their key/value caches; f32 or int8; the
//! full or a restricted output layer) is decided here, not in the paper's modules.

use crate::decoder::DecoderWeights;
use crate::dropout::Mode;
use crate::mask::Mask;
use crate::multi_head::KvCache;
use crate::restrict::RestrictedOutput;
use crate::seq2seq::{DecodePrecision, Seq2Seq};
use crate::Result;
use candle_core::{DType, Tensor};
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

/// Incremental decoding: the state a batch starts with, one step, and the weights made ready
/// once for many batches (the fused decoding stack, int8, the restricted output layer).
impl Seq2Seq {
    /// Encodes a batch of sources once and prepares incremental decoding: as one fused op
    /// per step where the decoder allows it ([`crate::decoder::Decoder::fused_stack`]: CPU
    /// f32, ReLU), else through the composed layers.
    ///
    /// # Shapes
    /// src (B, S) u32, padded with `pad_id`
    pub fn start(&self, src: &Tensor, pad_id: u32) -> Result<DecodeState> {
        self.start_with(src, pad_id, true)
    }

    /// [`Self::start`], through the composed layers whatever the decoder (`fused` false): the
    /// plain version the fused step is checked against.
    pub fn start_with(&self, src: &Tensor, pad_id: u32, fused: bool) -> Result<DecodeState> {
        let stack = self.transformer.decoder().fused_stack().filter(|_| fused);
        self.start_from(src, pad_id, stack, Arc::default(), None)
    }

    /// The weights decoding reads, made ready once for many batches: the fused step's stack
    /// with its weight matrices transposed, and the output layer's weight transposed (else
    /// [`Self::start`] makes them for every batch, 4% of a beam search over a test set in
    /// batches of 25 sentences). Valid while the model's weights stay as they are: prepare
    /// again after a training step.
    ///
    /// With [`DecodePrecision::Int8`] ([`Self::set_decode_precision`]) the fused stack's
    /// weights are quantized to int8 here instead (and the output layer's, when asked),
    /// with the fastest int8 kernel of this CPU; a decoder the fused step does not fit
    /// decodes in f32 ([`PreparedDecoding::describe`] says what was prepared).
    pub fn prepare_decoding(&self) -> Result<PreparedDecoding> {
        use crate::kernels::int8::{Int8Kernel, QuantizedLinear};
        let kernel = Int8Kernel::detect();
        let int8 = matches!(self.decode_precision, DecodePrecision::Int8 { .. });
        let stack = match self.transformer.decoder().fused_stack() {
            Some(s) if s.applies() && int8 => Some(s.with_int8_weights(kernel)?),
            Some(s) if s.applies() => Some(s.with_transposed_weights()?),
            _ => None,
        };
        let generator_q = match self.decode_precision {
            DecodePrecision::Int8 { output_layer: true } => {
                let w = self.generator.weight();
                let b = self.generator.bias().expect("the output layer has a bias");
                let (v, c) = w.dims2()?;
                let w = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let b = b.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                Some(Arc::new(QuantizedLinear::new(&w, &b, v, c, kernel)))
            }
            _ => None,
        };
        Ok(PreparedDecoding {
            stack,
            generator_t: Arc::default(),
            generator_q,
        })
    }

    /// [`Self::start`] with weights from [`Self::prepare_decoding`].
    pub fn start_prepared(
        &self,
        src: &Tensor,
        pad_id: u32,
        prepared: &PreparedDecoding,
    ) -> Result<DecodeState> {
        let stack = prepared.stack.clone();
        self.start_from(
            src,
            pad_id,
            stack,
            prepared.generator_t.clone(),
            prepared.generator_q.clone(),
        )
    }

    /// Encodes `src` and starts decoding with the fused `stack` when given (else through
    /// the composed layers), sharing `generator_t`.
    fn start_from(
        &self,
        src: &Tensor,
        pad_id: u32,
        stack: Option<crate::kernels::DecoderStack>,
        generator_t: Arc<OnceLock<Tensor>>,
        generator_q: Option<Arc<crate::kernels::int8::QuantizedLinear>>,
    ) -> Result<DecodeState> {
        let mask = Mask::key_padding_from_ids(src, pad_id)?;
        let src_lens = crate::mask::lengths(src, pad_id)?;
        let restricted = match &self.candidates {
            Some(c) => {
                let rows = crate::restrict::source_rows(src, pad_id)?;
                let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
                let int8 = generator_q.as_ref().map(|q| q.kernel());
                let bias = self.generator.bias().expect("the output layer has a bias");
                Some(RestrictedOutput::new(
                    self.generator.weight(),
                    bias,
                    c.candidates(&refs),
                    int8,
                )?)
            }
            None => None,
        };
        let decoder = self.transformer.decoder();
        if let Some(stack) = stack {
            let x = self
                .embed(&self.src_embedding, src, 0, Mode::Eval)?
                .detach();
            let pass = crate::Pass::new(Mode::Eval).backprop(crate::Backprop::Off);
            let (memory, _) = self
                .transformer
                .encoder()
                .forward_as(&x, Some(&mask), pass)?;
            let keep = src.ne(pad_id)?.flatten_all()?.to_vec1::<u8>()?;
            return Ok(DecodeState {
                caches: Caches::Fused(stack.start(&memory, &keep)?, stack),
                generator_t,
                generator_q,
                restricted,
                position: 0,
                src_lens,
            });
        }
        let memory = self.encode(src, Some(&mask), Mode::Eval)?;
        Ok(DecodeState {
            caches: Caches::Tensors {
                memory_kv: decoder.project_memory(&memory)?,
                caches: vec![KvCache::new(); decoder.num_layers()],
                memory_mask: mask,
            },
            generator_t,
            generator_q,
            restricted,
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
            Caches::Fused(cache, stack) => {
                let rows = cache.rows();
                let x = y.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                let (out, w) = stack.step(cache, x, need_weights)?;
                let dev = y.device();
                let h = Tensor::from_vec(out, (rows, self.d_model), dev)?.to_dtype(y.dtype())?;
                let weights = match w {
                    Some((self_w, cross_w)) => {
                        let (nhead, s) = (stack.nhead(), cache.source_len());
                        let per_layer = self_w
                            .into_iter()
                            .zip(cross_w)
                            .map(|(sw, cw)| {
                                Ok(DecoderWeights {
                                    self_attn: Tensor::from_vec(
                                        sw,
                                        (rows, nhead, 1, state.position + 1),
                                        dev,
                                    )?,
                                    cross_attn: Tensor::from_vec(cw, (rows, nhead, 1, s), dev)?,
                                })
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Some(per_layer)
                    }
                    None => None,
                };
                (h, weights)
            }
        };
        state.position += 1;
        let bias = self.generator.bias().expect("the output layer has a bias");
        let w = self.generator.weight();
        let logits = if let Some(r) = &state.restricted {
            r.logits(&h)?
        } else if let Some(q) = &state.generator_q {
            let rows = h.dim(0)?;
            let x = h.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let mut y = vec![0f32; rows * q.out_features()];
            q.forward_parallel(&mut y, &x);
            Tensor::from_vec(y, (rows, q.out_features()), h.device())?
        } else if h.dim(0)? <= 8 {
            crate::kernels::linear_few_rows(&h, w, bias)?
        } else {
            let wt = match state.generator_t.get() {
                Some(wt) => wt.clone(),
                None => {
                    let wt = w.detach().t()?.contiguous()?;
                    // Another batch sharing the cell may have set it first: the same values.
                    let _ = state.generator_t.set(wt.clone());
                    wt
                }
            };
            crate::kernels::linear_wt(&h, &wt, bias)?
        };
        Ok((logits, weights.filter(|_| need_weights)))
    }
}
