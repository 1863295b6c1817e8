//! One step of incremental decoding through the whole decoder stack, fused (forward only):
//! for each row (a sentence, or one hypothesis of a beam) one new target position goes
//! through every decoder layer (masked self-attention over the row's cached keys and values,
//! encoder-decoder attention over its sentence's projected memory, the feed-forward network,
//! residuals and layer norms, post-norm or `norm_first`) and the final norm.
//!
//! # Why
//! Composed of candle ops a step is about 60 small ops per batch (each a fresh tensor and a
//! hand-off to the thread pool), the self-attention cache is concatenated anew at every step
//! (`O(T^2)` copying over a sentence), and every reordering of beams copies every layer's
//! cache and encoder-decoder keys and values. At beam 5 the products are small (about 125
//! rows x 256 x 256), so that overhead is most of a step.
//!
//! # How
//! - **Rows are independent** in a decoding step (a row attends only to its own history), so
//!   the rows are split into one group per thread and each thread runs the whole stack on its
//!   group: one hand-off to the pool per step.
//! - **The self-attention cache is never copied.** Step `t` appends one block of keys and
//!   values per layer (`rows_t x C`); each row keeps, per earlier step, the index of its
//!   ancestor's row in that step's block (`origin`). Reordering rows for a beam search copies
//!   those index lists (`t` integers per row), not the keys and values.
//! - **The encoder-decoder keys and values are computed once per sentence** ([`DecoderStack::start`])
//!   and never copied: each row knows its sentence, and beams of one sentence share them.
//!
//! The arithmetic is that of the composed layers (the model's `DecoderLayer` stepping with a cache)
//! in another order of summation; checked against them over steps with beams reordered and
//! rows dropped (`tests/decode_step.rs`).

use super::attention::masked_softmax_rows;
use super::float::{self, simd};
use super::int8::{Int8Kernel, QuantizedLinear};
use super::layer_activation::Activation;
use super::linear::rows_forward;
use super::matmul::{gemm, unpacked_row_chunks, Mat};
use super::one_row;
use super::panels;
use super::shared::ln_rows;
use super::sublayer::{residual_sum, sublayer_input};
use super::{num_threads, run_parallel, with_f32};
use candle_core::{bail, DType, Result, Tensor};
use std::sync::Arc;

/// Index of each parameter in [`DecoderLayerParams`].
pub(super) mod slot {
    pub const SQ_W: usize = 0;
    pub const SK_W: usize = 2;
    pub const SV_W: usize = 4;
    pub const SO_W: usize = 6;
    pub const CQ_W: usize = 8;
    pub const CK_W: usize = 10;
    pub const CV_W: usize = 12;
    pub const CO_W: usize = 14;
    pub const L1_W: usize = 16;
    pub const L2_W: usize = 18;
    pub const N1_W: usize = 20;
    pub const N2_W: usize = 22;
    pub const N3_W: usize = 24;
    pub const COUNT: usize = 26;
}

/// A weight and its bias.
pub type Affine<'a> = (&'a Tensor, &'a Tensor);

/// The parameters of one decoder layer in PyTorch's layouts: the self-attention's and the
/// encoder-decoder attention's query, key, value and output projections `(C, C)` + `(C,)`,
/// `linear1` `(F, C)` + `(F,)`, `linear2` `(C, F)` + `(C,)`, and the three layer norms.
#[derive(Debug, Clone)]
pub struct DecoderLayerParams {
    pub(super) tensors: Vec<Tensor>,
}

impl DecoderLayerParams {
    /// Collects one layer's parameters: `self_attn` and `cross_attn` as `[q, k, v, out]`,
    /// `norms` as `[norm1, norm2, norm3]`.
    pub fn new(
        self_attn: [Affine; 4],
        cross_attn: [Affine; 4],
        linear1: Affine,
        linear2: Affine,
        norms: [Affine; 3],
    ) -> Self {
        let mut tensors = Vec::with_capacity(slot::COUNT);
        let all = self_attn
            .into_iter()
            .chain(cross_attn)
            .chain([linear1, linear2])
            .chain(norms);
        for (w, b) in all {
            tensors.push(w.clone());
            tensors.push(b.clone());
        }
        Self { tensors }
    }

    /// Whether every parameter can take [`crate::grads::DirectGrads`] (CPU f32 variables).
    pub fn all_accepted_by_direct_grads(&self) -> bool {
        self.tensors.iter().all(crate::grads::DirectGrads::accepts)
    }
}

/// What every layer of a [`DecoderStack`] shares besides its parameters' shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StackOptions {
    /// Attention heads per layer.
    pub nhead: usize,
    /// Epsilon added to the variance in every layer norm.
    pub eps: f64,
    /// Pre-norm instead of post-norm residual sub-layers.
    pub norm_first: bool,
    /// The feed-forward activation.
    pub activation: Activation,
}

/// A whole decoder stack for [`DecoderStack::step`]: its layers, the final norm (if any),
/// and the options its layers share (heads, the norms' epsilon and place, the activation).
#[derive(Debug, Clone)]
pub struct DecoderStack {
    layers: Vec<DecoderLayerParams>,
    final_norm: Option<(Tensor, Tensor)>,
    options: StackOptions,
    /// The weight matrices transposed and packed ([`DecodeCache`]'s `wt`), when made once
    /// for every batch decoded with this stack ([`DecoderStack::with_transposed_weights`]).
    wt: Option<Arc<Vec<WeightForms>>>,
    /// The weight matrices in int8 with their biases, indexed as `wt`, when the stack
    /// decodes in int8 ([`DecoderStack::with_int8_weights`]).
    q: Option<Arc<Vec<Option<QuantizedLinear>>>>,
}

/// Everything a fused decoding step keeps between steps (see the module docs).
#[derive(Debug, Clone)]
pub struct DecodeCache {
    /// Padded source length.
    s: usize,
    /// The stack's int8 weights, when it decodes in int8.
    q: Option<Arc<Vec<Option<QuantizedLinear>>>>,
    /// Source keep mask per sentence, `sentences x S`, 1 = a real token.
    keep: Vec<u8>,
    /// Encoder-decoder keys and values per layer, `sentences x S x C` each.
    cross_k: Vec<Vec<f32>>,
    cross_v: Vec<Vec<f32>>,
    /// The sentence of each row.
    row_sentence: Vec<u32>,
    /// Self-attention keys and values per layer and step, `rows_t x C` each.
    self_k: Vec<Vec<Vec<f32>>>,
    self_v: Vec<Vec<Vec<f32>>>,
    /// Per row, per earlier step: the row of that step's block holding its ancestor.
    origin: Vec<Vec<u32>>,
    /// Every layer's weight matrices transposed (`W^T`, `in x out`) and packed into panels
    /// ([`WeightForms`], indexed by layer and [`slot`]; empty for biases and norms): gemm
    /// and the panels read their operand without gathering it element by element, which at
    /// decoding's few rows was 40% of a step. Shared by every batch of a
    /// [`DecoderStack::with_transposed_weights`] stack.
    wt: Arc<Vec<WeightForms>>,
}

/// One weight matrix of the stack in the forms the f32 products read: packed into panels
/// for products of several rows ([`super::panels`], for the kernel this CPU runs), and
/// transposed (`W^T`) only where something reads it: gemm where no panels run, and the
/// one-row kernel on AVX-512. Each form is as large as the weight (100 MB at the paper's
/// base size), so a form nothing reads is not made. Neither for biases, norms and the
/// encoder-decoder attention's key and value projections (the memory's keys and values are
/// made once per batch from the weights as they are).
#[derive(Debug, Clone, Default)]
pub(crate) struct WeightForms {
    wt: Vec<f32>,
    panels: Option<panels::Packed>,
}

impl WeightForms {
    /// The forms of `w` (`rows x cols`, row-major) that [`project`] reads on this CPU.
    fn of(w: &[f32], rows: usize, cols: usize) -> Self {
        let panels = panels::Packed::for_this_cpu(w, rows, cols);
        let wt = if panels.is_none() || float::avx512() {
            transpose_matrix(w, rows, cols)
        } else {
            Vec::new()
        };
        Self { wt, panels }
    }
}

impl DecodeCache {
    /// Rows (sentences or hypotheses).
    pub fn rows(&self) -> usize {
        self.row_sentence.len()
    }

    /// Padded source length of the batch.
    pub fn source_len(&self) -> usize {
        self.s
    }

    /// Steps taken.
    pub fn steps(&self) -> usize {
        self.self_k.first().map_or(0, Vec::len)
    }

    /// Keeps rows `rows` in that order (repeats allowed): the index lists move, the keys and
    /// values stay where they are.
    pub fn select_rows(&mut self, rows: &[u32]) -> Result<()> {
        let n = self.rows();
        if let Some(&r) = rows.iter().find(|&&r| r as usize >= n) {
            bail!("decoding state: row {r} selected from {n} rows");
        }
        self.row_sentence = rows
            .iter()
            .map(|&r| self.row_sentence[r as usize])
            .collect();
        self.origin = rows
            .iter()
            .map(|&r| self.origin[r as usize].clone())
            .collect();
        Ok(())
    }
}

/// One layer's parameters as slices, indexed by [`slot`].
type LayerW<'a> = &'a [&'a [f32]];

/// Sizes of one step.
#[derive(Debug, Clone, Copy)]
struct Dims {
    c: usize,
    f: usize,
    h: usize,
    s: usize,
    eps: f32,
    norm_first: bool,
    activation: Activation,
}

/// What one group of rows needs to read of the cache.
struct CacheView<'a> {
    keep: &'a [u8],
    cross_k: &'a [Vec<f32>],
    cross_v: &'a [Vec<f32>],
    row_sentence: &'a [u32],
    self_k: &'a [Vec<Vec<f32>>],
    self_v: &'a [Vec<Vec<f32>>],
    origin: &'a [Vec<u32>],
    wt: &'a [WeightForms],
    q: Option<&'a [Option<QuantizedLinear>]>,
    /// Whether the f32 products split their outputs between the threads: a step of fewer
    /// rows than threads, run as one group ([`panels::Packed::forward_rows_split`]).
    split_outputs: bool,
}

/// This step's attention weights when asked for: per layer, self `(rows, H, t + 1)` and
/// encoder-decoder `(rows, H, S)`.
pub type StepWeights = (Vec<Vec<f32>>, Vec<Vec<f32>>);

impl DecoderStack {
    /// A stack of `layers`, with the final norm `final_norm` (weight, bias) if any.
    pub fn new(
        layers: Vec<DecoderLayerParams>,
        final_norm: Option<(Tensor, Tensor)>,
        options: StackOptions,
    ) -> Self {
        Self {
            layers,
            final_norm,
            options,
            wt: None,
            q: None,
        }
    }

    /// This stack decoding with int8 products (`kernel`): every projection and the
    /// feed-forward network of every layer quantized once here (symmetric int8 with one scale
    /// per output row, [`super::int8`]); the encoder-decoder keys and values of the memory,
    /// computed once per sentence, stay f32. The weights must not change while it is in use.
    pub fn with_int8_weights(mut self, kernel: Int8Kernel) -> Result<Self> {
        if !self.applies() {
            bail!("fused decoding step: the decoder's parameters do not fit it");
        }
        let layers = self.layers.len();
        let tensors = self.all_tensors();
        let q = with_f32(&tensors, |w| {
            let items: Vec<usize> = (0..layers * slot::COUNT).collect();
            run_parallel(items, |i| {
                let (l, k) = (i / slot::COUNT, i % slot::COUNT);
                match self.layers[l].tensors[k].dims2() {
                    Ok((out, inp)) if k < slot::N1_W => {
                        Some(QuantizedLinear::new(w[i], w[i + 1], out, inp, kernel))
                    }
                    _ => None,
                }
            })
        })?;
        self.q = Some(Arc::new(q));
        // The f32 products are not used: no transposed copies.
        self.wt = Some(Arc::new(Vec::new()));
        Ok(self)
    }

    /// The int8 kernel the stack decodes with, if it does.
    pub fn int8_kernel(&self) -> Option<Int8Kernel> {
        self.q
            .as_ref()
            .and_then(|q| q.iter().flatten().next().map(|l| l.kernel()))
    }

    /// This stack with its weight matrices transposed and packed into panels once here, for
    /// every batch it starts (else each [`DecoderStack::start`] makes them, 2% of a beam
    /// search over a test set in batches of 25 sentences). The weights must not change while
    /// it is in use.
    pub fn with_transposed_weights(mut self) -> Result<Self> {
        if !self.applies() {
            bail!("fused decoding step: the decoder's parameters do not fit it");
        }
        self.wt = Some(Arc::new(self.weight_forms()?));
        Ok(self)
    }

    /// Every layer's weight matrices transposed and packed, indexed by layer and [`slot`]
    /// (empty for biases and norms).
    fn weight_forms(&self) -> Result<Vec<WeightForms>> {
        let layers = self.layers.len();
        let tensors = self.all_tensors();
        with_f32(&tensors, |w| {
            let items: Vec<usize> = (0..layers * slot::COUNT).collect();
            run_parallel(items, |i| {
                let (l, k) = (i / slot::COUNT, i % slot::COUNT);
                let t = &self.layers[l].tensors[k];
                match t.dims2() {
                    Ok((rows, cols)) if k < slot::N1_W && k != slot::CK_W && k != slot::CV_W => {
                        WeightForms::of(w[i], rows, cols)
                    }
                    _ => WeightForms::default(),
                }
            })
        })
    }

    /// Attention heads per layer.
    pub fn nhead(&self) -> usize {
        self.options.nhead
    }

    fn all_tensors(&self) -> Vec<&Tensor> {
        let mut ts: Vec<&Tensor> = self.layers.iter().flat_map(|l| &l.tensors).collect();
        if let Some((w, b)) = &self.final_norm {
            ts.push(w);
            ts.push(b);
        }
        ts
    }

    /// Whether the fused step runs on these parameters: CPU f32, contiguous, shapes that fit.
    pub fn applies(&self) -> bool {
        let Some(first) = self.layers.first() else {
            return false;
        };
        let Ok((c, _)) = first.tensors[slot::SQ_W].dims2() else {
            return false;
        };
        let f = first.tensors[slot::L1_W].dim(0).unwrap_or(0);
        self.options.nhead > 0
            && c.is_multiple_of(self.options.nhead)
            && self
                .all_tensors()
                .iter()
                .all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous())
            && self.layers.iter().all(|l| {
                let d = |i: usize| l.tensors[i].dims().to_vec();
                (0..4).all(|k| d(slot::SQ_W + 2 * k) == [c, c] && d(slot::CQ_W + 2 * k) == [c, c])
                    && d(slot::L1_W) == [f, c]
                    && d(slot::L2_W) == [c, f]
            })
    }

    fn dims(&self, s: usize) -> Dims {
        let t = &self.layers[0].tensors;
        Dims {
            c: t[slot::SQ_W].dim(0).unwrap_or(0),
            f: t[slot::L1_W].dim(0).unwrap_or(0),
            h: self.options.nhead,
            s,
            eps: self.options.eps as f32,
            norm_first: self.options.norm_first,
            activation: self.options.activation,
        }
    }

    /// The cache before the first step: every layer's encoder-decoder keys and values of
    /// `memory` (the encoder output, `(B, S, C)` f32) and the source keep mask `keep`
    /// (`B x S`, 1 = a real token); one row per sentence.
    pub fn start(&self, memory: &Tensor, keep: &[u8]) -> Result<DecodeCache> {
        let (b, s, c) = memory.dims3()?;
        if !self.applies() || self.dims(s).c != c || keep.len() != b * s {
            bail!(
                "fused decoding step: memory {:?} does not fit the decoder",
                memory.dims()
            );
        }
        let mem = memory
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        let layers = self.layers.len();
        let tensors = self.all_tensors();
        let kv = with_f32(&tensors, |w| {
            // One item per layer and projection (key, value).
            let items: Vec<(usize, usize)> = (0..layers)
                .flat_map(|l| [(l, slot::CK_W), (l, slot::CV_W)])
                .collect();
            run_parallel(items, |(l, i)| {
                let lw = &w[l * slot::COUNT..(l + 1) * slot::COUNT];
                let mut out = vec![0f32; b * s * c];
                simd(
                    #[inline(always)]
                    || rows_forward(&mut out, &mem, lw[i], lw[i + 1], b * s, c, c),
                );
                out
            })
        })?;
        let mut it = kv.into_iter();
        let (mut cross_k, mut cross_v) = (Vec::new(), Vec::new());
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            cross_k.push(k);
            cross_v.push(v);
        }
        let wt = match &self.wt {
            Some(wt) => wt.clone(),
            None => Arc::new(self.weight_forms()?),
        };
        Ok(DecodeCache {
            s,
            q: self.q.clone(),
            wt,
            keep: keep.to_vec(),
            cross_k,
            cross_v,
            row_sentence: (0..b as u32).collect(),
            self_k: vec![Vec::new(); layers],
            self_v: vec![Vec::new(); layers],
            origin: vec![Vec::new(); b],
        })
    }

    /// One step: `x` holds each row's embedded new token (`rows x C`, position encoding
    /// added); returns the stack's output for those positions (`rows x C`) and, with
    /// `want_weights`, the step's attention weights. The cache grows by one position.
    pub fn step(
        &self,
        cache: &mut DecodeCache,
        mut x: Vec<f32>,
        want_weights: bool,
    ) -> Result<(Vec<f32>, Option<StepWeights>)> {
        let d = self.dims(cache.s);
        let (rows, layers, t) = (cache.rows(), self.layers.len(), cache.steps());
        if x.len() != rows * d.c {
            bail!(
                "fused decoding step: {} inputs for {rows} rows of width {}",
                x.len(),
                d.c
            );
        }
        let mut new_k: Vec<Vec<f32>> = vec![vec![0f32; rows * d.c]; layers];
        let mut new_v: Vec<Vec<f32>> = vec![vec![0f32; rows * d.c]; layers];
        let (sw, cw) = (d.h * (t + 1), d.h * d.s);
        let mut self_w: Vec<Vec<f32>> =
            vec![vec![0f32; if want_weights { rows * sw } else { 0 }]; layers];
        let mut cross_w: Vec<Vec<f32>> =
            vec![vec![0f32; if want_weights { rows * cw } else { 0 }]; layers];
        // One group of rows per thread when there is enough work.
        let work = rows * d.c * (8 * d.c + 2 * d.f) * layers;
        let groups = if work < (1 << 21) {
            1
        } else {
            num_threads().min(rows).max(1)
        };
        // Too few rows to give every thread some (greedy decoding of one sentence: one row):
        // the products split their outputs between the threads instead. A step of one row
        // streams every weight of the decoder once, and one core alone draws less of the
        // memory's bandwidth than two: greedy latency at the paper's base size 116-121 ms
        // against 83-99 ms on the 2-vCPU EPYC (docs/RESULTS_LOG.md, 2026-11-28).
        let split_outputs = work >= (1 << 21) && groups < num_threads();
        let ranges: Vec<std::ops::Range<usize>> = (0..groups)
            .map(|i| i * rows / groups..(i + 1) * rows / groups)
            .collect();
        let tensors = self.all_tensors();
        let view = CacheView {
            keep: &cache.keep,
            cross_k: &cache.cross_k,
            cross_v: &cache.cross_v,
            row_sentence: &cache.row_sentence,
            self_k: &cache.self_k,
            self_v: &cache.self_v,
            origin: &cache.origin,
            wt: &cache.wt,
            q: cache.q.as_deref().map(|q| q.as_slice()),
            split_outputs,
        };
        let final_norm = self.final_norm.is_some();
        with_f32(&tensors, |w| {
            // Per group: its rows of x, and of every layer's new keys, values and weights.
            let mut xs = split(&mut x, &ranges, d.c);
            let mut ks: Vec<Vec<&mut [f32]>> =
                transpose(new_k.iter_mut().map(|b| split(b, &ranges, d.c)).collect());
            let mut vs: Vec<Vec<&mut [f32]>> =
                transpose(new_v.iter_mut().map(|b| split(b, &ranges, d.c)).collect());
            let sws = if want_weights {
                transpose(self_w.iter_mut().map(|b| split(b, &ranges, sw)).collect())
            } else {
                (0..groups).map(|_| Vec::new()).collect()
            };
            let cws = if want_weights {
                transpose(cross_w.iter_mut().map(|b| split(b, &ranges, cw)).collect())
            } else {
                (0..groups).map(|_| Vec::new()).collect()
            };
            let items: Vec<_> = ranges
                .iter()
                .cloned()
                .zip(xs.drain(..))
                .zip(ks.drain(..).zip(vs.drain(..)))
                .zip(sws.into_iter().zip(cws))
                .collect();
            run_parallel(items, |(((r, x), (k, v)), (sw, cw))| {
                simd(
                    #[inline(always)]
                    || {
                        let layer_w: Vec<LayerW> = (0..layers)
                            .map(|l| &w[l * slot::COUNT..(l + 1) * slot::COUNT])
                            .collect();
                        let norm = final_norm
                            .then(|| (w[layers * slot::COUNT], w[layers * slot::COUNT + 1]));
                        step_group(&d, &layer_w, norm, &view, t, r, x, k, v, sw, cw)
                    },
                )
            });
        })?;
        for (l, (k, v)) in new_k.into_iter().zip(new_v).enumerate() {
            cache.self_k[l].push(k);
            cache.self_v[l].push(v);
        }
        for (r, o) in cache.origin.iter_mut().enumerate() {
            o.push(r as u32);
        }
        Ok((x, want_weights.then_some((self_w, cross_w))))
    }
}

/// `m` (rows x cols, row-major) transposed.
fn transpose_matrix(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; rows * cols];
    for (i, row) in m.chunks_exact(cols).enumerate() {
        for (j, &x) in row.iter().enumerate() {
            t[j * rows + i] = x;
        }
    }
    t
}

/// `y = x W^T + b` for `n` rows from `w`'s forms (`W^T`, `k x m`, or its panels),
/// single-threaded, or with the panels' outputs split between the threads (`split`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn project(
    y: &mut [f32],
    x: &[f32],
    w: &WeightForms,
    b: &[f32],
    n: usize,
    m: usize,
    k: usize,
    split: bool,
) {
    let wt = &w.wt[..];
    if n == 1 && float::avx512() {
        // One row reads each weight once: the step's speed is how fast the weights stream
        // in (`one_row`). Splitting the columns between the threads did not pay here.
        return one_row::wt_row(y, x, wt, b, m, k);
    }
    if let Some(p) = &w.panels {
        if split {
            return p.forward_rows_split(y, x, b, n);
        }
        // Several rows (one too on AVX2, where `one_row` does not run: 1.2x gemm's rate):
        // the packed panels' tiles (12 x 32 on AVX-512, 6 x 16 on AVX2) run nearer the FMA
        // rate than gemm reading `W^T` in place (`super::panels`).
        return p.forward_rows(y, x, b, n);
    }
    gemm_wt_rows(y, x, wt, b, n, m, k)
}

/// `y = x W^T + b` for `n` rows by gemm reading `W^T` (`k x m`) in place, in chunks of rows
/// that leave it unpacked, single-threaded: the products where no panels run.
pub(crate) fn gemm_wt_rows(
    y: &mut [f32],
    x: &[f32],
    wt: &[f32],
    b: &[f32],
    n: usize,
    m: usize,
    k: usize,
) {
    for row in y.chunks_exact_mut(m) {
        row.copy_from_slice(b);
    }
    for r in unpacked_row_chunks(n) {
        gemm(
            Mat::new_mut(&mut y[r.start * m..r.end * m], r.len(), m, m, 1),
            true,
            Mat::new(&x[r.start * k..r.end * k], r.len(), k, k, 1),
            Mat::new(wt, k, m, m, 1),
            1.0,
        );
    }
}

/// `y = x W^T + b` for the weight in `slot` of layer `l`: in int8 when the stack decodes in
/// int8, else f32 from the transposed weight. `(n, m, k)`: rows, outputs, inputs.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn project_layer(
    cache: &CacheView,
    lw: LayerW,
    l: usize,
    slot: usize,
    y: &mut [f32],
    x: &[f32],
    (n, m, k): (usize, usize, usize),
) {
    match cache.q {
        Some(q) => q[l * slot::COUNT + slot]
            .as_ref()
            .expect("an int8 weight in every weight slot")
            .forward(y, x),
        None => project(
            y,
            x,
            &cache.wt[l * slot::COUNT + slot],
            lw[slot + 1],
            n,
            m,
            k,
            cache.split_outputs,
        ),
    }
}

/// Splits `data` (rows of `width`) at the row ranges.
fn split<'a>(
    data: &'a mut [f32],
    ranges: &[std::ops::Range<usize>],
    width: usize,
) -> Vec<&'a mut [f32]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut rest = data;
    for r in ranges {
        let (mine, tail) = rest.split_at_mut(r.len() * width);
        out.push(mine);
        rest = tail;
    }
    out
}

/// `[layer][group]` into `[group][layer]`.
fn transpose<T>(v: Vec<Vec<T>>) -> Vec<Vec<T>> {
    let groups = v.first().map_or(0, Vec::len);
    let mut out: Vec<Vec<T>> = (0..groups).map(|_| Vec::with_capacity(v.len())).collect();
    for layer in v {
        for (g, item) in layer.into_iter().enumerate() {
            out[g].push(item);
        }
    }
    out
}

/// The stack for the rows `r` of this step (`x` their inputs, overwritten with the output;
/// `k`, `v` their new keys and values per layer; `sw`, `cw` their attention weights per layer
/// when asked for).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn step_group(
    d: &Dims,
    w: &[LayerW],
    final_norm: Option<(&[f32], &[f32])>,
    cache: &CacheView,
    t: usize,
    r: std::ops::Range<usize>,
    x: &mut [f32],
    mut k: Vec<&mut [f32]>,
    mut v: Vec<&mut [f32]>,
    mut sw: Vec<&mut [f32]>,
    mut cw: Vec<&mut [f32]>,
) {
    let (c, f, h, s) = (d.c, d.f, d.h, d.s);
    let n = r.len();
    let dh = c / h;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut a = vec![0f32; n * c];
    let mut q = vec![0f32; n * c];
    let mut o = vec![0f32; n * c];
    let mut y = vec![0f32; n * c];
    let mut hid = vec![0f32; n * f];
    let mut p = vec![0f32; (t + 1).max(s)];
    for (l, lw) in w.iter().enumerate() {
        // Masked self-attention over the row's own history.
        let src = sublayer_input(d.norm_first, d.eps, lw, slot::N1_W, x, &mut a, None);
        project_layer(cache, lw, l, slot::SQ_W, &mut q, src, (n, c, c));
        project_layer(cache, lw, l, slot::SK_W, k[l], src, (n, c, c));
        project_layer(cache, lw, l, slot::SV_W, v[l], src, (n, c, c));
        o.fill(0.0);
        for i in 0..n {
            let row = r.start + i;
            let origin = &cache.origin[row];
            for hi in 0..h {
                let qh = &q[i * c + hi * dh..][..dh];
                let key = |step: usize| -> &[f32] {
                    if step == t {
                        &k[l][i * c + hi * dh..][..dh]
                    } else {
                        &cache.self_k[l][step][origin[step] as usize * c + hi * dh..][..dh]
                    }
                };
                let ps = &mut p[..t + 1];
                for (step, pv) in ps.iter_mut().enumerate() {
                    *pv = float::dot(qh, key(step)) * scale;
                }
                masked_softmax_rows(ps, None, t + 1);
                if let Some(wl) = sw.get_mut(l) {
                    wl[(i * h + hi) * (t + 1)..][..t + 1].copy_from_slice(ps);
                }
                let oh = &mut o[i * c + hi * dh..][..dh];
                for (step, &pv) in ps.iter().enumerate() {
                    let val: &[f32] = if step == t {
                        &v[l][i * c + hi * dh..][..dh]
                    } else {
                        &cache.self_v[l][step][origin[step] as usize * c + hi * dh..][..dh]
                    };
                    for (ov, &vv) in oh.iter_mut().zip(val) {
                        *ov += pv * vv;
                    }
                }
            }
        }
        project_layer(cache, lw, l, slot::SO_W, &mut y, &o, (n, c, c));
        // x = y + x (IEEE addition commutes: the same sum as x + y), then the post-norm.
        residual_sum((d.norm_first, d.eps), lw, slot::N1_W, &y, x, None);
        // Encoder-decoder attention over the row's sentence.
        let src = sublayer_input(d.norm_first, d.eps, lw, slot::N2_W, x, &mut a, None);
        project_layer(cache, lw, l, slot::CQ_W, &mut q, src, (n, c, c));
        o.fill(0.0);
        for i in 0..n {
            let sent = cache.row_sentence[r.start + i] as usize;
            let keep = &cache.keep[sent * s..(sent + 1) * s];
            let kb = &cache.cross_k[l][sent * s * c..(sent + 1) * s * c];
            let vb = &cache.cross_v[l][sent * s * c..(sent + 1) * s * c];
            for hi in 0..h {
                let qh = &q[i * c + hi * dh..][..dh];
                let ps = &mut p[..s];
                for (j, pv) in ps.iter_mut().enumerate() {
                    *pv = float::dot(qh, &kb[j * c + hi * dh..][..dh]) * scale;
                }
                masked_softmax_rows(ps, Some(keep), s);
                if let Some(wl) = cw.get_mut(l) {
                    wl[(i * h + hi) * s..][..s].copy_from_slice(ps);
                }
                let oh = &mut o[i * c + hi * dh..][..dh];
                for (j, &pv) in ps.iter().enumerate() {
                    if pv != 0.0 {
                        for (ov, &vv) in oh.iter_mut().zip(&vb[j * c + hi * dh..][..dh]) {
                            *ov += pv * vv;
                        }
                    }
                }
            }
        }
        project_layer(cache, lw, l, slot::CO_W, &mut y, &o, (n, c, c));
        // x = y + x, then the post-norm.
        residual_sum((d.norm_first, d.eps), lw, slot::N2_W, &y, x, None);
        // Feed-forward network.
        let src = sublayer_input(d.norm_first, d.eps, lw, slot::N3_W, x, &mut a, None);
        project_layer(cache, lw, l, slot::L1_W, &mut hid, src, (n, f, c));
        match d.activation {
            Activation::Relu => hid.iter_mut().for_each(|hv| *hv = hv.max(0.0)),
            act => hid.iter_mut().for_each(|hv| *hv = act.apply(*hv)),
        }
        project_layer(cache, lw, l, slot::L2_W, &mut y, &hid, (n, c, f));
        // x = y + x, then the post-norm.
        residual_sum((d.norm_first, d.eps), lw, slot::N3_W, &y, x, None);
    }
    if let Some((nw, nb)) = final_norm {
        let out = x.to_vec();
        ln_rows(&out, nw, nb, d.eps, x, None);
    }
}
