//! How incremental decoding runs, as a backend chooses it ([`super::Backend::decoding_stack`],
//! [`super::Backend::output_layer`]): the decoder as one fused step with its own caches
//! ([`FusedDecoding`]) or the composed layers, and the output layer ([`OutputLayer`]) in f32
//! or int8, over the whole vocabulary or a batch's candidates. [`crate::Seq2Seq::start`] and
//! [`crate::Seq2Seq::step`] only ask what was chosen.

use super::DecoderWeights;
use super::DecodingStack;
use crate::kernels::int8::{Int8Kernel, QuantizedLinear};
use crate::kernels::DecodeCache;
use crate::linear::Linear;
use crate::Result;
use candle_core::{DType, Tensor};
use std::sync::{Arc, OnceLock};

pub use crate::ops::DecodePrecision;

/// A Transformer's decoding made ready once for many batches
/// ([`crate::Seq2Seq::prepare_decoding`]): what the backend chose for the decoder layers and
/// for the output layer.
#[derive(Debug, Clone)]
pub struct PreparedDecoding {
    /// The fused decoding step with its weights made ready (transposed, or int8), where the
    /// backend has one for this decoder; `None`: the composed layers.
    pub(crate) stack: Option<DecodingStack>,
    /// The output layer as decoding runs it.
    pub(crate) output: OutputLayer,
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
        let output = self.output.describe();
        let slow = self
            .stack
            .as_ref()
            .and_then(|s| s.int8_kernel())
            .or(self.output.int8_kernel())
            .is_some_and(|k| k != Int8Kernel::Avx512Vnni);
        if slow {
            // Measured (crates/kernels/examples/int8_bench.rs, base-size shapes on an AVX2
            // EPYC): without VNNI the int8 products run at 1.0-1.35x the f32 panels' rate.
            format!(
                "{layers}, {output}; this CPU has no AVX512-VNNI: its int8 products run on \
                 AVX2, at most a third faster than f32 ones"
            )
        } else {
            format!("{layers}, {output}")
        }
    }

    /// The same decoding through the composed decoder layers (the output layer as it is):
    /// the plain version the fused step is checked against.
    pub fn with_composed_layers(self) -> Self {
        Self {
            stack: None,
            ..self
        }
    }
}

/// The output layer as decoding runs it: `h W^T + b` over the whole vocabulary or over a
/// batch's candidate rows ([`Self::restricted`]), in f32 ([`crate::kernels::linear_few_rows`]
/// for up to 8 rows, else [`crate::kernels::PanelLinear`] with `W` packed once, or
/// [`crate::kernels::linear_wt`] with `W^T` made once where that kernel does not run;
/// candle's matmul off the CPU) or int8 (one scale per row, the rows quantized once).
#[derive(Debug, Clone)]
pub struct OutputLayer {
    /// The weight's rows scored, (V, C) or (K, C).
    w: Tensor,
    bias: Tensor,
    /// `w` made ready for many rows at the first step with more than 8 rows, and shared by
    /// the batches started from one [`PreparedDecoding`].
    many_rows: Arc<OnceLock<ManyRows>>,
    /// The same rows in int8, when the output layer decodes in int8.
    q: Option<Arc<QuantizedLinear>>,
    /// The int8 screen of the f32 layer for [`Self::argmax`], made at its first call with up
    /// to 8 rows (`None` inside: no screen pays here) and shared like `many_rows`.
    screen: Arc<OnceLock<Option<crate::kernels::ArgmaxScreen>>>,
    /// The token id of each row, ascending, when restricted to candidates.
    ids: Option<Arc<[u32]>>,
}

/// Rows up to which the f32 output layer multiplies by `W` as it is (the few-rows kernel);
/// above, by [`ManyRows`].
const FEW_ROWS: usize = 8;

/// The f32 output layer's weight for products of many rows.
#[derive(Debug)]
enum ManyRows {
    /// Packed into panels ([`crate::kernels::PanelLinear`]: CPU f32 with AVX-512, or AVX2
    /// and FMA).
    Panels(crate::kernels::PanelLinear),
    /// Transposed, (C, V) ([`crate::kernels::linear_wt`]).
    Transposed(Tensor),
}

impl OutputLayer {
    /// The layer `linear` (weight (V, C), bias (V,)) in f32, or in int8 with `int8`'s kernel.
    pub fn new(linear: &Linear, int8: Option<Int8Kernel>) -> Result<Self> {
        let bias = linear.bias().expect("the output layer has a bias");
        Self::from_rows(linear.weight().clone(), bias.clone(), int8, None)
    }

    fn from_rows(
        w: Tensor,
        bias: Tensor,
        int8: Option<Int8Kernel>,
        ids: Option<Arc<[u32]>>,
    ) -> Result<Self> {
        let q = match int8 {
            Some(kernel) => {
                let (v, c) = w.dims2()?;
                let wv = w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let bv = bias.to_dtype(DType::F32)?.to_vec1::<f32>()?;
                Some(Arc::new(QuantizedLinear::new(&wv, &bv, v, c, kernel)))
            }
            None => None,
        };
        Ok(Self {
            w,
            bias,
            many_rows: Arc::default(),
            q,
            screen: Arc::default(),
            ids,
        })
    }

    /// This layer cut down to the rows `ids` (ascending, without repeats), in the same
    /// arithmetic: CTranslate2's vocabulary map ([`crate::restrict`]).
    pub fn restricted(&self, ids: Vec<u32>) -> Result<Self> {
        let idx = Tensor::new(ids.as_slice(), self.w.device())?;
        let w = self.w.detach().index_select(&idx, 0)?.contiguous()?;
        let bias = self.bias.detach().index_select(&idx, 0)?;
        Self::from_rows(w, bias, self.int8_kernel(), Some(ids.into()))
    }

    /// The token id of each logit column when restricted; `None`: every token.
    pub fn ids(&self) -> Option<&Arc<[u32]>> {
        self.ids.as_ref()
    }

    /// The int8 kernel it runs, if it does.
    pub fn int8_kernel(&self) -> Option<Int8Kernel> {
        self.q.as_ref().map(|q| q.kernel())
    }

    /// What it runs, for logs.
    pub fn describe(&self) -> String {
        match self.int8_kernel() {
            Some(k) => format!("output layer int8 ({})", k.name()),
            None => "output layer f32".to_string(),
        }
    }

    /// The logits of the decoder outputs `h`.
    ///
    /// # Shapes
    /// h (B, C) -> (B, V), or (B, K) when restricted
    pub fn logits(&self, h: &Tensor) -> Result<Tensor> {
        let rows = h.dim(0)?;
        if let Some(q) = &self.q {
            let x = h.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            let mut y = vec![0f32; rows * q.out_features()];
            q.forward_parallel(&mut y, &x);
            return Tensor::from_vec(y, (rows, q.out_features()), h.device());
        }
        if rows <= FEW_ROWS {
            return crate::kernels::linear_few_rows(h, &self.w, &self.bias);
        }
        let many = match self.many_rows.get() {
            Some(m) => m,
            None => {
                let (w, bias) = (self.w.detach(), self.bias.detach());
                let m = match crate::kernels::PanelLinear::new(&w, &bias)? {
                    Some(p) => ManyRows::Panels(p),
                    None => ManyRows::Transposed(w.t()?.contiguous()?),
                };
                // Another batch sharing the cell may have set it first: the same values.
                let _ = self.many_rows.set(m);
                self.many_rows.get().expect("set just now")
            }
        };
        match many {
            ManyRows::Panels(p) => p.forward(h),
            ManyRows::Transposed(wt) => crate::kernels::linear_wt(h, wt, &self.bias),
        }
    }

    /// The most likely token of each row of `h`: the token of the largest logit
    /// [`Self::logits`] gives, the first of equals. For up to 8 rows of the whole f32 layer on
    /// a CPU with SIMD int8, found without computing every logit exactly
    /// ([`crate::kernels::ArgmaxScreen`]: an int8 screen, then the logits it cannot rule out
    /// in f32, as [`Self::logits`] computes them); otherwise from the logits.
    ///
    /// # Shapes
    /// h (B, C) -> B token ids
    pub fn argmax(&self, h: &Tensor) -> Result<Vec<u32>> {
        let rows = h.dim(0)?;
        // The screen of the whole vocabulary is made once per model; a batch's candidates
        // (a few hundred rows, made anew for every batch) are fewer bytes than making it.
        let screen = match (&self.q, rows <= FEW_ROWS && self.ids.is_none()) {
            (None, true) => self
                .screen
                .get_or_init(|| {
                    // No screen when it cannot be made (a CPU f32 layer is what it needs):
                    // the logits then.
                    crate::kernels::ArgmaxScreen::of_layer(&self.w, &self.bias)
                        .ok()
                        .flatten()
                })
                .as_ref(),
            _ => None,
        };
        let columns: Vec<usize> = match screen {
            Some(s) => s
                .argmax_rows(h, &self.w, &self.bias)?
                .iter()
                .map(|r| r.index)
                .collect(),
            None => self
                .logits(h)?
                .to_dtype(DType::F32)?
                .to_vec2::<f32>()?
                .iter()
                .map(|row| crate::kernels::first_largest(row))
                .collect(),
        };
        Ok(columns
            .into_iter()
            .map(|c| match &self.ids {
                Some(ids) => ids[c],
                None => c as u32,
            })
            .collect())
    }
}

/// The fused decoding step of one batch: the stack and its caches (the encoder-decoder keys
/// and values computed once, the self-attention keys and values so far), reordered without
/// copying.
#[derive(Debug, Clone)]
pub struct FusedDecoding {
    cache: DecodeCache,
    stack: DecodingStack,
}

impl FusedDecoding {
    /// Starts a batch on the encoder output `memory` (B, S, C) whose real source tokens are
    /// `keep` (B x S, 1 = real).
    pub fn start(stack: DecodingStack, memory: &Tensor, keep: &[u8]) -> Result<Self> {
        Ok(Self {
            cache: stack.start(memory, keep)?,
            stack,
        })
    }

    /// Keeps rows `rows` in that order (repeats allowed).
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        self.cache.select_rows(rows)
    }

    /// One step on the embedded new tokens `y` (B, 1, C) at target position `position`: the
    /// stack's output (B, C) and, with `need_weights`, every layer's attention weights.
    pub fn step(
        &mut self,
        y: &Tensor,
        position: usize,
        need_weights: bool,
    ) -> Result<(Tensor, Option<Vec<DecoderWeights>>)> {
        let (rows, dev) = (self.cache.rows(), y.device());
        let c = y.dim(2)?;
        let x = y.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let (out, w) = self.stack.step(&mut self.cache, x, need_weights)?;
        let h = Tensor::from_vec(out, (rows, c), dev)?.to_dtype(y.dtype())?;
        let Some((self_w, cross_w)) = w else {
            return Ok((h, None));
        };
        let (nhead, s) = (self.stack.nhead(), self.cache.source_len());
        let weights = self_w
            .into_iter()
            .zip(cross_w)
            .map(|(sw, cw)| {
                Ok(DecoderWeights {
                    self_attn: Tensor::from_vec(sw, (rows, nhead, 1, position + 1), dev)?,
                    cross_attn: Tensor::from_vec(cw, (rows, nhead, 1, s), dev)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((h, Some(weights)))
    }
}
