//! The sub-layers the fused encoder and decoder layers share ([`super::encoder_layer`],
//! [`super::decoder_layer`]): an attention sub-layer (self-attention, or attention over
//! another sequence such as the encoder's output) and the feed-forward sub-layer, each with
//! its residual, dropout and layer norm (post-norm or pre-norm), forward and backward, over
//! one thread's group of sequences with single-threaded products. The parameters are slices
//! indexed by the calling layer's slots.
//!
//! Only the sequences' real rows are computed when the caller gives their lengths ([`Rows`]):
//! the rows are packed together for the projections, the feed-forward layer and the norms,
//! and attention runs per sequence over its own length. The projections' and the
//! feed-forward layer's products run in fp32, or in bf16 with fp32 accumulation
//! ([`LayerShape::bf16`]).

use super::attention::masked_softmax_rows;
use super::bf16;
use super::float::{self, Float};
use super::layer_activation::Activation;
use super::linear::{bias_grad_add, bias_rows, rows_forward, rows_input_grad};
use super::matmul::{gemm, Mat};
use super::rng::MaskSpec;
pub(super) use super::rows::{check_lengths, Rows};
use super::shared::{
    drop_inplace, drop_into, linear_grads, ln_bwd, ln_rows, two, LayerShape, Norm,
};

thread_local! {
    /// Each thread's packed bf16 operands, kept between calls.
    static PACKED: std::cell::RefCell<(Vec<u16>, Vec<u32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

/// `out` as f32 when the sub-layers' products run in bf16 (`sh.bf16` and f32 operands).
#[inline(always)]
fn bf16_out<'a, T: Float>(sh: &LayerShape, out: &'a mut [T]) -> Option<&'a mut [f32]> {
    if sh.bf16 {
        T::as_f32_mut(out)
    } else {
        None
    }
}

/// `out (+)= A B` (`rows x cols`, `depth` terms each) in bf16 with fp32 accumulation, the
/// operands packed into this thread's buffers: `A` stored `rows x depth`, or `depth x rows`
/// (`a_t`); `B` stored `depth x cols`, or `cols x depth` (`b_t`).
#[inline(always)]
fn bf16_product(
    out: &mut [f32],
    (rows, cols, depth): (usize, usize, usize),
    accumulate: bool,
    (a, a_t): (&[f32], bool),
    (b, b_t): (&[f32], bool),
) {
    PACKED.with_borrow_mut(|(pa, pb)| {
        if a_t {
            bf16::pack_rows_transposed(a, (depth, rows, rows), pa);
        } else {
            bf16::pack_rows(a, (rows, depth, depth), pa);
        }
        if b_t {
            bf16::pack_pairs_of_cols(b, (cols, depth, depth), pb);
        } else {
            bf16::pack_pairs_of_rows(b, (depth, cols, cols), pb);
        }
        let (kp, ldb) = (bf16::pad32(depth), bf16::pad32(cols));
        bf16::gemm_bf16(out, cols, rows, cols, pa, kp, pb, ldb, accumulate);
    });
}

/// `y = x W^T + b` for `n` rows (`x` `n x k`, `W` `m x k`; the weight at `slot` of `w`, its
/// bias next): [`rows_forward`], or its products in bf16 (`sh.bf16`).
#[inline(always)]
fn lin_forward<T: Float>(
    sh: &LayerShape,
    y: &mut [T],
    x: &[T],
    (w, slot): (&[&[T]], usize),
    (n, m, k): (usize, usize, usize),
) {
    let (w, b) = (w[slot], w[slot + 1]);
    if let Some(y) = bf16_out(sh, y) {
        bias_rows(y, f32s(b));
        bf16_product(y, (n, m, k), true, (f32s(x), false), (f32s(w), true));
        return;
    }
    rows_forward(y, x, w, b, n, m, k)
}

/// `dx (+)= dy W` for `n` rows (`dy` `n x m`, `W` `m x k`, the weight at `slot` of `w`):
/// [`rows_input_grad`], or its product in bf16 (`sh.bf16`).
#[inline(always)]
fn lin_input_grad<T: Float>(
    sh: &LayerShape,
    (dx, accumulate): (&mut [T], bool),
    dy: &[T],
    (w, slot): (&[&[T]], usize),
    (n, m): (usize, usize),
) {
    let w = w[slot];
    if let Some(dx) = bf16_out(sh, dx) {
        let k = w.len() / m.max(1);
        bf16_product(
            dx,
            (n, k, m),
            accumulate,
            (f32s(dy), false),
            (f32s(w), false),
        );
        return;
    }
    rows_input_grad(dx, accumulate, dy, w, n, m)
}

/// The gradients of the weight at `slot` of `g` and of its bias (next): `dW = dy^T x`
/// (overwritten) and `db += sum_rows(dy)` over `n` rows: [`linear_grads`], or the weight's
/// product in bf16 (`sh.bf16`; the bias's sum stays fp32).
#[inline(always)]
fn lin_grads<T: Float>(
    sh: &LayerShape,
    (g, slot): (&mut [Vec<T>], usize),
    dy: &[T],
    x: &[T],
    n: usize,
    k: usize,
) {
    let (dw, db) = two(g, slot, slot + 1);
    if let Some(dw) = bf16_out(sh, dw) {
        let m = db.len();
        bf16_product(dw, (m, k, n), false, (f32s(dy), true), (f32s(x), false));
        bias_grad_add(db, dy);
        return;
    }
    linear_grads(dw, db, dy, x, n, k)
}

/// A sub-layer's input as its first products read it: with pre-norm (`norm_first`) the layer
/// norm `norm` of `x`, made in `normed` (its statistics in `nrm` when kept for a backward
/// pass); with post-norm `x` itself. The training layers' sub-layers and the decoding step
/// ([`super::decoder_step`]) share it.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn sublayer_input<'a, T: Float>(
    norm_first: bool,
    eps: T,
    w: &[&[T]],
    norm: usize,
    x: &'a [T],
    normed: &'a mut Vec<T>,
    nrm: Option<&mut Norm<T>>,
) -> &'a [T] {
    if !norm_first {
        return x;
    }
    normed.resize(x.len(), T::ZERO);
    ln_rows(x, w[norm], w[norm + 1], eps, normed, nrm);
    normed
}

/// A sub-layer's end once its branch's output is in `out`: the residual `x` added
/// (`out = x + out`), and with post-norm the layer norm `norm` of the sum in place (its
/// statistics in `nrm` when kept). The training layers' sub-layers (after their dropout) and
/// the decoding step share it.
#[inline(always)]
pub(super) fn residual_sum<T: Float>(
    (norm_first, eps): (bool, T),
    w: &[&[T]],
    norm: usize,
    x: &[T],
    out: &mut [T],
    nrm: Option<&mut Norm<T>>,
) {
    for (r, &xv) in out.iter_mut().zip(x) {
        *r = xv + *r;
    }
    if !norm_first {
        let sum = out.to_vec();
        ln_rows(&sum, w[norm], w[norm + 1], eps, out, nrm);
    }
}

/// A sub-layer's end, on its branch's output `out`: dropout (`drop`), then
/// [`residual_sum`] (its statistics in `nrm`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn residual_fwd<T: Float>(
    sh: &LayerShape,
    (w, norm): (&[&[T]], usize),
    x: &[T],
    rows: &Rows,
    (drop, dscale): (Option<&MaskSpec>, T),
    out: &mut [T],
    nrm: &mut Norm<T>,
) {
    if let Some(m) = drop {
        drop_rows(out, m, rows, sh.c, dscale);
    }
    let how = (sh.norm_first, T::from_f64(sh.eps));
    residual_sum(how, w, norm, x, out, Some(nrm));
}

/// [`residual_fwd`]'s backward pass: from the gradient of the sub-layer's output `dout`,
/// writes the residual's share of the input's gradient into `dx` (post-norm: through the
/// norm, whose parameters' gradients go into `g`) and returns the gradient of the branch's
/// output before its dropout.
#[inline(always)]
fn residual_bwd<T: Float>(
    sh: &LayerShape,
    (w, norm): (&[&[T]], usize),
    (g, scratch): (&mut [Vec<T>], &mut Vec<T>),
    (nrm, rows): (&Norm<T>, &Rows),
    (drop, dscale): (Option<&MaskSpec>, T),
    dout: &[T],
    dx: &mut [T],
) -> Vec<T> {
    if sh.norm_first {
        dx.copy_from_slice(dout);
    } else {
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(dout, nrm, w[norm], dx, false, gw, gb, scratch);
    }
    let mut d_branch = dx.to_vec();
    if let Some(m) = drop {
        drop_rows(&mut d_branch, m, rows, sh.c, dscale);
    }
    d_branch
}

/// The f32 values of a slice whose type is f32 (the bf16 paths' other operands).
#[inline(always)]
fn f32s<T: Float>(x: &[T]) -> &[f32] {
    T::as_f32(x).expect("bf16 products take f32 operands")
}

/// One attention sub-layer's dropout: of the weights and of the output.
#[derive(Clone, Copy)]
pub(super) struct SublayerDrops<'a> {
    pub(super) attn: Option<&'a MaskSpec>,
    pub(super) out: Option<&'a MaskSpec>,
}

/// The feed-forward sub-layer's dropout: of the hidden layer and of the output.
#[derive(Clone, Copy)]
pub(super) struct FfDrops<'a> {
    pub(super) hidden: Option<&'a MaskSpec>,
    pub(super) out: Option<&'a MaskSpec>,
}

/// What an attention sub-layer's forward pass keeps.
#[derive(Debug)]
pub(super) struct AttnSaved<T> {
    /// Pre-norm: the normalised input (the queries' source; the keys' and values' too in
    /// self-attention).
    a_in: Vec<T>,
    q: Vec<T>,
    k: Vec<T>,
    v: Vec<T>,
    /// Weights before dropout, `(seqs, H, T, Tk)`.
    p: Vec<T>,
    /// Heads merged, the output projection's input.
    o: Vec<T>,
    /// Post-norm: of the residual sum (the output); pre-norm: of the input.
    norm: Norm<T>,
}

/// What the feed-forward sub-layer's forward pass keeps.
#[derive(Debug)]
pub(super) struct FfSaved<T> {
    /// Pre-norm: the normalised input.
    f_in: Vec<T>,
    /// After the activation, before dropout.
    hid: Vec<T>,
    /// The activation's input, except for ReLU (empty: its output says where it passed).
    pre: Vec<T>,
    norm: Norm<T>,
}

/// Dropout (or its backward) on the group's rows `x` (`width` elements each), at the mask
/// elements of the padded batch.
#[inline(always)]
fn drop_rows<T: Float>(x: &mut [T], spec: &MaskSpec, rows: &Rows, width: usize, scale: T) {
    for (off, len, row) in rows.runs() {
        drop_inplace(
            &mut x[off * width..][..len * width],
            spec,
            row * width,
            scale,
        );
    }
}

/// `lq x lk` attention weights of one (sequence, head) through dropout: `p` into `out`, or
/// `out` in place without `p`. The mask element of weight `(i, j)` is `first + i * tk + j`
/// (the padded layout).
#[inline(always)]
fn drop_weights<T: Float>(
    p: Option<&[T]>,
    out: &mut [T],
    spec: &MaskSpec,
    first: usize,
    (lk, tk): (usize, usize),
    scale: T,
) {
    // One run of all the weights when their rows are contiguous in the mask, else a run
    // per row.
    let (runs, len, stride) = if lk == tk {
        (1, out.len(), 0)
    } else {
        (out.len() / lk, lk, tk)
    };
    for i in 0..runs {
        let (r, first) = (i * len..(i + 1) * len, first + i * stride);
        match p {
            Some(p) => drop_into(&p[r.clone()], &mut out[r], spec, first, scale),
            None => drop_inplace(&mut out[r], spec, first, scale),
        }
    }
}

/// The sequences of a group that attend to something, each as `(sequence, (first query row,
/// queries), (first key row, keys), p_at)`: `p_at` is where its `H x lq x lk` attention
/// weights start in the group's weights (one sequence after another, `h` heads each).
#[inline(always)]
fn attended_seqs<'r>(
    q_rows: &'r Rows,
    k_rows: &'r Rows,
    h: usize,
) -> impl Iterator<Item = (usize, (usize, usize), (usize, usize), usize)> + 'r {
    let mut p_at = 0;
    (0..q_rows.seqs()).filter_map(move |j| {
        let ((qr, lq), (kr, lk)) = (q_rows.seq(j), k_rows.seq(j));
        let at = p_at;
        p_at += h * lq * lk;
        (lq > 0 && lk > 0).then_some((q_rows.s0() + j, (qr, lq), (kr, lk), at))
    })
}

/// The `lq x lk` top-left block of a `t x tk` mask: the mask itself when that is all of it.
fn mask_block<'a>(
    keep: Option<&'a [u8]>,
    (lq, lk): (usize, usize),
    tk: usize,
    buf: &'a mut Vec<u8>,
) -> Option<&'a [u8]> {
    let keep = keep?;
    if lk == tk {
        return Some(&keep[..lq * tk]);
    }
    buf.clear();
    for i in 0..lq {
        buf.extend_from_slice(&keep[i * tk..i * tk + lk]);
    }
    Some(buf)
}

/// The attention sub-layer's input: the residual stream `x` of the query rows, and the
/// attended sequence with its rows where it is not `x` itself (the memory).
pub(super) type AttnInput<'a, T> = (&'a [T], &'a Rows, Option<(&'a [T], &'a Rows)>);

/// The attention sub-layer's backward input: what the forward pass saved, `x`, the query
/// rows, and the attended memory with its gradient and rows, where it is not `x` itself.
pub(super) type AttnBwdInput<'a, T> = (
    &'a AttnSaved<T>,
    &'a [T],
    &'a Rows,
    Option<(&'a [T], &'a mut [T], &'a Rows)>,
);

/// An attention sub-layer over a group of sequences: queries from `x` (the sub-layer's
/// input, the rows `q_rows` describes), keys and values from `kv` (its rows described by
/// the second element) or, with `kv` `None`, from the input itself; `keep(seq)` is sequence
/// `seq`'s mask in the padded layout (`T x Tk`). Writes the sub-layer's output (the residual
/// stream after it) into `out`. `base` and `norm` are the slots of the query weight and of
/// the norm's weight.
#[inline(always)]
pub(super) fn attn_fwd<'k, T: Float>(
    sh: &LayerShape,
    (w, (base, norm)): (&[&[T]], (usize, usize)),
    (x, q_rows, kv): AttnInput<'_, T>,
    keep: impl Fn(usize) -> Option<&'k [u8]>,
    drops: SublayerDrops,
    dscale: T,
    out: &mut [T],
) -> AttnSaved<T> {
    let (c, h) = (sh.c, sh.h);
    let n = q_rows.n();
    debug_assert_eq!(x.len(), n * c);
    let dh = c / h;
    let scale = T::from_f64(1.0 / (dh as f64).sqrt());
    let mut nrm = Norm::default();
    let mut a_in = Vec::new();
    let eps = T::from_f64(sh.eps);
    let a_src = sublayer_input(sh.norm_first, eps, w, norm, x, &mut a_in, Some(&mut nrm));
    let (kv_src, k_rows) = kv.unwrap_or((a_src, q_rows));
    let nk = k_rows.n();
    let mut q = vec![T::ZERO; n * c];
    let mut k = vec![T::ZERO; nk * c];
    let mut v = vec![T::ZERO; nk * c];
    lin_forward(sh, &mut q, a_src, (w, base), (n, c, c));
    lin_forward(sh, &mut k, kv_src, (w, base + 2), (nk, c, c));
    lin_forward(sh, &mut v, kv_src, (w, base + 4), (nk, c, c));
    let (t, tk) = (q_rows.t(), k_rows.t());
    let p_len: usize = (0..q_rows.seqs())
        .map(|j| h * q_rows.seq(j).1 * k_rows.seq(j).1)
        .sum();
    let mut p = vec![T::ZERO; p_len];
    let mut o = vec![T::ZERO; n * c];
    let mut pd = vec![T::ZERO; t * tk];
    let mut mask_buf = Vec::new();
    for (seq, (qr, lq), (kr, lk), p_at) in attended_seqs(q_rows, k_rows, h) {
        let mask = mask_block(keep(seq), (lq, lk), tk, &mut mask_buf);
        for hi in 0..h {
            let (qo, ko) = (qr * c + hi * dh, kr * c + hi * dh);
            let pb = &mut p[p_at + hi * lq * lk..][..lq * lk];
            gemm(
                Mat::new_mut(pb, lq, lk, lk, 1),
                false,
                Mat::new(&q[qo..], lq, dh, c, 1),
                Mat::new(&k[ko..], lk, dh, c, 1).t(),
                scale,
            );
            masked_softmax_rows(pb, mask, lk);
            let weights: &[T] = match drops.attn {
                Some(m) => {
                    let pd = &mut pd[..lq * lk];
                    drop_weights(Some(pb), pd, m, (seq * h + hi) * t * tk, (lk, tk), dscale);
                    pd
                }
                None => pb,
            };
            gemm(
                Mat::new_mut(&mut o[qo..], lq, dh, c, 1),
                false,
                Mat::new(weights, lq, lk, lk, 1),
                Mat::new(&v[ko..], lk, dh, c, 1),
                T::ONE,
            );
        }
    }
    lin_forward(sh, out, &o, (w, base + 6), (n, c, c));
    residual_fwd(sh, (w, norm), x, q_rows, (drops.out, dscale), out, &mut nrm);
    AttnSaved {
        a_in,
        q,
        k,
        v,
        p,
        o,
        norm: nrm,
    }
}

/// [`attn_fwd`]'s backward pass: from `dout` (the gradient of its output) writes the
/// gradient of its input `x` into `dx` and, for encoder-decoder attention, of `kv` into
/// `dkv`; adds the parameters' gradients into `g`.
#[inline(always)]
pub(super) fn attn_bwd<T: Float>(
    sh: &LayerShape,
    (w, (base, norm)): (&[&[T]], (usize, usize)),
    (g, scratch): (&mut [Vec<T>], &mut Vec<T>),
    (sv, x, q_rows, kv): AttnBwdInput<'_, T>,
    drops: SublayerDrops,
    dscale: T,
    (dout, dx): (&[T], &mut [T]),
) {
    let (c, h) = (sh.c, sh.h);
    let n = q_rows.n();
    let k_rows = kv.as_ref().map_or(q_rows, |(_, _, r)| r);
    let nk = k_rows.n();
    let (t, tk) = (q_rows.t(), k_rows.t());
    let dh = c / h;
    let scale = T::from_f64(1.0 / (dh as f64).sqrt());
    let out_drop = (drops.out, dscale);
    let g_s = (&mut *g, &mut *scratch);
    let da = residual_bwd(sh, (w, norm), g_s, (&sv.norm, q_rows), out_drop, dout, dx);
    lin_grads(sh, (g, base + 6), &da, &sv.o, n, c);
    let mut d_o = vec![T::ZERO; n * c];
    lin_input_grad(sh, (&mut d_o, false), &da, (w, base + 6), (n, c));
    let (mut dq, mut dk, mut dv) = (da, vec![T::ZERO; nk * c], vec![T::ZERO; nk * c]);
    let mut pd = vec![T::ZERO; t * tk];
    let mut dp = vec![T::ZERO; t * tk];
    for (seq, (qr, lq), (kr, lk), p_at) in attended_seqs(q_rows, k_rows, h) {
        let (pd, dp) = (&mut pd[..lq * lk], &mut dp[..lq * lk]);
        for hi in 0..h {
            let (qo, ko) = (qr * c + hi * dh, kr * c + hi * dh);
            let pb = &sv.p[p_at + hi * lq * lk..][..lq * lk];
            let first = (seq * h + hi) * t * tk;
            let weights: &[T] = match drops.attn {
                Some(m) => {
                    drop_weights(Some(pb), pd, m, first, (lk, tk), dscale);
                    pd
                }
                None => pb,
            };
            // dV = Pd^T dO; dPd = dO V^T.
            gemm(
                Mat::new_mut(&mut dv[ko..], lk, dh, c, 1),
                false,
                Mat::new(weights, lq, lk, lk, 1).t(),
                Mat::new(&d_o[qo..], lq, dh, c, 1),
                T::ONE,
            );
            gemm(
                Mat::new_mut(dp, lq, lk, lk, 1),
                false,
                Mat::new(&d_o[qo..], lq, dh, c, 1),
                Mat::new(&sv.v[ko..], lk, dh, c, 1).t(),
                T::ONE,
            );
            // Through the dropout and the softmax: dS = P (dP - rowsum(dP P)).
            if let Some(m) = drops.attn {
                drop_weights(None, dp, m, first, (lk, tk), dscale);
            }
            for (dr, pr) in dp.chunks_exact_mut(lk).zip(pb.chunks_exact(lk)) {
                let dot = float::dot(dr, pr);
                for (x, &pv) in dr.iter_mut().zip(pr) {
                    *x = pv * (*x - dot);
                }
            }
            // dQ = scale dS K; dK = scale dS^T Q.
            gemm(
                Mat::new_mut(&mut dq[qo..], lq, dh, c, 1),
                false,
                Mat::new(dp, lq, lk, lk, 1),
                Mat::new(&sv.k[ko..], lk, dh, c, 1),
                scale,
            );
            gemm(
                Mat::new_mut(&mut dk[ko..], lk, dh, c, 1),
                false,
                Mat::new(dp, lq, lk, lk, 1).t(),
                Mat::new(&sv.q[qo..], lq, dh, c, 1),
                scale,
            );
        }
    }
    // The projections.
    let a_src: &[T] = if sh.norm_first { &sv.a_in } else { x };
    let kv_src: &[T] = match &kv {
        Some((m, _, _)) => m,
        None => a_src,
    };
    for (dproj, src, rows, sl) in [
        (&dq, a_src, n, base),
        (&dk, kv_src, nk, base + 2),
        (&dv, kv_src, nk, base + 4),
    ] {
        lin_grads(sh, (g, sl), dproj, src, rows, c);
    }
    let mut da_in = d_o;
    lin_input_grad(sh, (&mut da_in, false), &dq, (w, base), (n, c));
    match kv {
        Some((_, dkv, _)) => {
            lin_input_grad(sh, (dkv, false), &dk, (w, base + 2), (nk, c));
            lin_input_grad(sh, (dkv, true), &dv, (w, base + 4), (nk, c));
        }
        None => {
            lin_input_grad(sh, (&mut da_in, true), &dk, (w, base + 2), (n, c));
            lin_input_grad(sh, (&mut da_in, true), &dv, (w, base + 4), (n, c));
        }
    }
    if sh.norm_first {
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(&da_in, &sv.norm, w[norm], dx, true, gw, gb, scratch);
    } else {
        float::add_inplace(dx, &da_in);
    }
}

/// The feed-forward sub-layer on `x` (the rows `rows` describes), its output into `y`; `slots` are those of `linear1`'s and `linear2`'s weights and of the norm's weight.
#[inline(always)]
pub(super) fn ff_fwd<T: Float>(
    sh: &LayerShape,
    (w, (l1, l2, norm)): (&[&[T]], (usize, usize, usize)),
    x: &[T],
    rows: &Rows,
    drops: FfDrops,
    dscale: T,
    y: &mut [T],
) -> FfSaved<T> {
    let (c, f) = (sh.c, sh.f);
    let n = x.len() / c;
    let mut nrm = Norm::default();
    let mut f_in = Vec::new();
    let eps = T::from_f64(sh.eps);
    let f_src = sublayer_input(sh.norm_first, eps, w, norm, x, &mut f_in, Some(&mut nrm));
    let mut hid = vec![T::ZERO; n * f];
    lin_forward(sh, &mut hid, f_src, (w, l1), (n, f, c));
    let mut pre = Vec::new();
    if sh.activation != Activation::Relu {
        pre = hid.clone();
        for v in hid.iter_mut() {
            *v = sh.activation.apply(*v);
        }
    } else {
        for v in hid.iter_mut() {
            *v = if *v > T::ZERO { *v } else { T::ZERO };
        }
    }
    let mut hd_buf;
    let hd: &[T] = match drops.hidden {
        Some(m) => {
            hd_buf = hid.clone();
            drop_rows(&mut hd_buf, m, rows, f, dscale);
            &hd_buf
        }
        None => &hid,
    };
    lin_forward(sh, y, hd, (w, l2), (n, c, f));
    residual_fwd(sh, (w, norm), x, rows, (drops.out, dscale), y, &mut nrm);
    FfSaved {
        f_in,
        hid,
        pre,
        norm: nrm,
    }
}

/// [`ff_fwd`]'s backward pass: the gradient of its input `x` into `dx`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn ff_bwd<T: Float>(
    sh: &LayerShape,
    (w, (l1, l2, norm)): (&[&[T]], (usize, usize, usize)),
    (g, scratch): (&mut [Vec<T>], &mut Vec<T>),
    (sv, x, rows): (&FfSaved<T>, &[T], &Rows),
    drops: FfDrops,
    dscale: T,
    dy: &[T],
    dx: &mut [T],
) {
    let (c, f) = (sh.c, sh.f);
    let n = x.len() / c;
    let out_drop = (drops.out, dscale);
    let g_s = (&mut *g, &mut *scratch);
    let dgo = residual_bwd(sh, (w, norm), g_s, (&sv.norm, rows), out_drop, dy, dx);
    let mut hd = sv.hid.clone();
    if let Some(m) = drops.hidden {
        drop_rows(&mut hd, m, rows, f, dscale);
    }
    lin_grads(sh, (g, l2), &dgo, &hd, n, f);
    let mut dhid = hd;
    lin_input_grad(sh, (&mut dhid, false), &dgo, (w, l2), (n, c));
    if let Some(m) = drops.hidden {
        drop_rows(&mut dhid, m, rows, f, dscale);
    }
    if sh.activation != Activation::Relu {
        for (dv, &pv) in dhid.iter_mut().zip(&sv.pre) {
            *dv *= sh.activation.derivative(pv);
        }
    } else {
        for (dv, &hv) in dhid.iter_mut().zip(&sv.hid) {
            *dv = if hv > T::ZERO { *dv } else { T::ZERO };
        }
    }
    let f_src: &[T] = if sh.norm_first { &sv.f_in } else { x };
    lin_grads(sh, (g, l1), &dhid, f_src, n, c);
    if sh.norm_first {
        let mut df_in = dgo;
        lin_input_grad(sh, (&mut df_in, false), &dhid, (w, l1), (n, f));
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(&df_in, &sv.norm, w[norm], dx, true, gw, gb, scratch);
    } else {
        lin_input_grad(sh, (dx, true), &dhid, (w, l1), (n, f));
    }
}
