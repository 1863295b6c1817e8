//! What the fused layers share below their sub-layers ([`super::sublayer`],
//! [`super::encoder_layer`], [`super::decoder_layer`], [`super::decoder_step`]): the layers'
//! options, the rows' layer norm forward and backward, dropout on a slice, a linear layer's
//! weight and bias gradients, the attention mask expanded per sequence, and the split of a
//! batch into one group of sequences per thread.

use super::float::Float;
use super::layer_activation::Activation;
use super::layer_norm;
use super::linear::{bias_grad_add, weight_grad_rows};
use super::rng::MaskSpec;

/// The layer's options (the model's layer specification without what the parameters give).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderLayerOptions {
    /// Attention heads H; must divide C.
    pub nhead: usize,
    /// Epsilon added to the variance in both layer norms.
    pub layer_norm_eps: f64,
    /// Pre-norm instead of post-norm residual sub-layers.
    pub norm_first: bool,
    /// The arithmetic of the projections' and the feed-forward layer's products:
    /// [`super::Precision::Bf16`] runs them in bf16 with fp32 accumulation where the CPU has
    /// a bf16 unit and the inputs are f32 (with gradients: the f64 path has none); the
    /// attention heads, norms, softmax and everything else stay fp32.
    pub precision: super::Precision,
    /// The feed-forward activation: ReLU (the paper's), GELU (exact or tanh) or Swish.
    pub activation: Activation,
}

/// Multiply-adds per thread below which the layer runs on one thread.
pub(crate) const MIN_PARALLEL_MACS: usize = 1 << 20;

/// The attention mask expanded to `(B | 1, T, T)`.
#[derive(Debug)]
pub(crate) struct Keep {
    pub(crate) data: Vec<u8>,
    pub(crate) per_batch: bool,
}

impl Keep {
    pub(crate) fn of(&self, seq: usize, t: usize) -> &[u8] {
        let i = if self.per_batch { seq } else { 0 };
        &self.data[i * t * t..(i + 1) * t * t]
    }
}

/// `x[j] = keep(first + j) ? x[j] * scale : 0`: dropout forward, or its backward on a
/// gradient.
#[inline(always)]
pub(crate) fn drop_inplace<T: Float>(x: &mut [T], spec: &MaskSpec, first: usize, scale: T) {
    for (j, v) in x.iter_mut().enumerate() {
        *v = if spec.keep((first + j) as u64) {
            *v * scale
        } else {
            T::ZERO
        };
    }
}

/// [`drop_inplace`] into `out`.
#[inline(always)]
pub(crate) fn drop_into<T: Float>(x: &[T], out: &mut [T], spec: &MaskSpec, first: usize, scale: T) {
    for (j, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if spec.keep((first + j) as u64) {
            v * scale
        } else {
            T::ZERO
        };
    }
}

/// Row statistics of one layer norm over `n` rows: the normalised rows and `1 / std`.
#[derive(Debug)]
pub(crate) struct Norm<T> {
    xhat: Vec<T>,
    rstd: Vec<T>,
}

impl<T> Default for Norm<T> {
    fn default() -> Self {
        Self {
            xhat: Vec::new(),
            rstd: Vec::new(),
        }
    }
}

/// `dW = dy^T x` (m x k, overwritten) and `db += sum_rows(dy)` over all `n` rows.
pub(crate) fn linear_grads<T: Float>(
    dw: &mut [T],
    db: &mut [T],
    dy: &[T],
    x: &[T],
    n: usize,
    k: usize,
) {
    let m = db.len();
    weight_grad_rows(dw, 0..m, dy, x, n, m, k);
    bias_grad_add(db, dy);
}

/// Layer norm of the rows of `x` into `y`; `norm`, when given, keeps the normalised rows and
/// `1 / std` for a backward pass ([`ln_fwd`]), else nothing is kept (decoding).
#[inline(always)]
pub(crate) fn ln_rows<T: Float>(
    x: &[T],
    g: &[T],
    b: &[T],
    eps: T,
    y: &mut [T],
    norm: Option<&mut Norm<T>>,
) {
    match norm {
        Some(norm) => ln_fwd(x, g, b, eps, y, norm),
        None => {
            let c = g.len();
            for (xr, yr) in x.chunks_exact(c).zip(y.chunks_exact_mut(c)) {
                layer_norm::forward_row(xr, g, b, eps, yr, None);
            }
        }
    }
}

/// Layer norm of the rows of `x` into `y`, keeping the normalised rows and `1 / std` in
/// `norm` ([`super::layer_norm`]'s row arithmetic).
#[inline(always)]
pub(crate) fn ln_fwd<T: Float>(x: &[T], g: &[T], b: &[T], eps: T, y: &mut [T], norm: &mut Norm<T>) {
    let c = g.len();
    norm.xhat.resize(x.len(), T::ZERO);
    norm.rstd.resize(x.len() / c, T::ZERO);
    let rows = x.chunks_exact(c).zip(y.chunks_exact_mut(c));
    for (i, ((xr, yr), hr)) in rows.zip(norm.xhat.chunks_exact_mut(c)).enumerate() {
        norm.rstd[i] = layer_norm::forward_row(xr, g, b, eps, yr, Some(hr));
    }
}

/// Layer norm backward over the rows of `dy` into `dx` (added to it with `accumulate`),
/// the weight's and bias's gradients added into `dg`, `db`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn ln_bwd<T: Float>(
    dy: &[T],
    norm: &Norm<T>,
    g: &[T],
    dx: &mut [T],
    accumulate: bool,
    dg: &mut [T],
    db: &mut [T],
    scratch: &mut Vec<T>,
) {
    let c = g.len();
    let rows = dy.chunks_exact(c).zip(norm.xhat.chunks_exact(c));
    for (i, ((dyr, hr), dxr)) in rows.zip(dx.chunks_exact_mut(c)).enumerate() {
        let grads = (&mut dg[..], &mut db[..]);
        layer_norm::backward_row(dyr, hr, norm.rstd[i], g, scratch, grads, dxr, accumulate);
    }
}

/// Two distinct elements of `v` mutably (`i < j`).
pub(crate) fn two<T>(v: &mut [Vec<T>], i: usize, j: usize) -> (&mut [T], &mut [T]) {
    debug_assert!(i < j);
    let (a, b) = v.split_at_mut(j);
    (&mut a[i], &mut b[0])
}

/// `groups` contiguous ranges of `0..b`.
pub(crate) fn group_ranges(b: usize, groups: usize) -> Vec<std::ops::Range<usize>> {
    (0..groups)
        .map(|i| i * b / groups..(i + 1) * b / groups)
        .collect()
}

/// `data` (b items of `per` elements) split at [`group_ranges`].
pub(crate) fn split_at_ranges<T>(
    mut data: &mut [T],
    b: usize,
    groups: usize,
    per: usize,
) -> Vec<&mut [T]> {
    let mut out = Vec::with_capacity(groups);
    for r in group_ranges(b, groups) {
        let (mine, rest) = data.split_at_mut(r.len() * per);
        out.push(mine);
        data = rest;
    }
    out
}

/// A fused layer's shape and options, what its sub-layers read (the `sublayer` module; given
/// by [`crate::testing`]'s callers): `b` sequences of `t` rows (`s` memory rows for a decoder
/// layer), width `c`, feed-forward width `f`, `h` heads.
#[derive(Debug, Clone, Copy)]
pub struct LayerShape {
    /// Sequences B.
    pub b: usize,
    /// Rows per sequence T.
    pub t: usize,
    /// Memory rows per sequence S (decoder layers).
    pub s: usize,
    /// Width C.
    pub c: usize,
    /// Feed-forward width F.
    pub f: usize,
    /// Heads H.
    pub h: usize,
    /// The layer norms' epsilon.
    pub eps: f64,
    /// Pre-norm instead of post-norm.
    pub norm_first: bool,
    /// bf16 products (f32 inputs, a CPU with a bf16 unit): the projections' and the
    /// feed-forward layer's, with fp32 accumulation ([`super::bf16`]); everything else, the
    /// attention heads' products included, stays in the inputs' precision.
    pub bf16: bool,
    /// The feed-forward activation.
    pub activation: Activation,
}

impl LayerShape {
    /// The shape of `b` sequences of `t` rows (and their memory of `s`), width `c`,
    /// feed-forward width `f`, under `opts`, inputs of `dtype` (bf16 products only for f32 on
    /// a CPU with a bf16 unit).
    pub(crate) fn new(
        (b, t, s): (usize, usize, usize),
        (c, f): (usize, usize),
        opts: &EncoderLayerOptions,
        dtype: candle_core::DType,
    ) -> Self {
        Self {
            b,
            t,
            s,
            c,
            f,
            h: opts.nhead,
            eps: opts.layer_norm_eps,
            norm_first: opts.norm_first,
            bf16: opts.precision == super::Precision::Bf16
                && dtype == candle_core::DType::F32
                && super::bf16::available(),
            activation: opts.activation,
        }
    }
}

/// What a layer's forward and backward passes gave.
#[derive(Debug)]
pub struct Run<T> {
    /// The output.
    pub y: Vec<T>,
    /// The input's gradient.
    pub dx: Vec<T>,
    /// The memory's gradient (decoder layers; empty for encoder layers).
    pub dmemory: Vec<T>,
    /// Each parameter's gradient, in the layer's slot order.
    pub grads: Vec<Vec<T>>,
    /// How many groups the forward pass kept state for.
    pub groups: usize,
}
