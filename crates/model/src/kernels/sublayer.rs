//! The sub-layers the fused encoder and decoder layers share ([`super::encoder_layer`],
//! [`super::decoder_layer`]): an attention sub-layer (self-attention, or attention over
//! another sequence such as the encoder's output) and the feed-forward sub-layer, each with
//! its residual, dropout and layer norm (post-norm or pre-norm), forward and backward, over
//! one thread's group of sequences with single-threaded products. The parameters are slices
//! indexed by the calling layer's slots.

use super::attention::masked_softmax_rows;
use super::dropout::MaskSpec;
use super::encoder_layer::{drop_inplace, drop_into, linear_grads, ln_bwd, ln_fwd, two, Norm};
use super::float::{self, Float};
use super::linear::{rows_forward, rows_input_grad};
use super::matmul::{gemm, Mat};

/// What the sub-layers need of a layer's shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct SubDims {
    /// Rows (positions) per sequence of the sub-layer's input.
    pub(super) t: usize,
    pub(super) c: usize,
    pub(super) f: usize,
    pub(super) h: usize,
    pub(super) eps: f64,
    pub(super) norm_first: bool,
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
    /// After the ReLU, before dropout.
    hid: Vec<T>,
    norm: Norm<T>,
}

/// An attention sub-layer over a group of sequences starting at `s0`: queries from `x` (the
/// sub-layer's input, `T` rows per sequence), keys and values from `kv` (`tk` rows per
/// sequence) or, with `kv` `None`, from the input itself; `keep(seq)` is sequence `seq`'s
/// `T x tk` mask. Writes the sub-layer's output (the residual stream after it) into `out`.
/// `base` and `norm` are the slots of the query weight and of the norm's weight.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn attn_fwd<'k, T: Float>(
    sh: &SubDims,
    w: &[&[T]],
    (base, norm): (usize, usize),
    x: &[T],
    kv: Option<&[T]>,
    tk: usize,
    keep: impl Fn(usize) -> Option<&'k [u8]>,
    drops: SublayerDrops,
    dscale: T,
    s0: usize,
    out: &mut [T],
) -> AttnSaved<T> {
    let (t, c, h) = (sh.t, sh.c, sh.h);
    let n = x.len() / c;
    let ns = n / t;
    let dh = c / h;
    let eps = T::from_f64(sh.eps);
    let scale = T::from_f64(1.0 / (dh as f64).sqrt());
    let mut nrm = Norm::default();
    let mut a_in = Vec::new();
    let a_src: &[T] = if sh.norm_first {
        a_in = vec![T::ZERO; n * c];
        ln_fwd(x, w[norm], w[norm + 1], eps, &mut a_in, &mut nrm);
        &a_in
    } else {
        x
    };
    let kv_src = kv.unwrap_or(a_src);
    let nk = ns * tk;
    let mut q = vec![T::ZERO; n * c];
    let mut k = vec![T::ZERO; nk * c];
    let mut v = vec![T::ZERO; nk * c];
    rows_forward(&mut q, a_src, w[base], w[base + 1], n, c, c);
    rows_forward(&mut k, kv_src, w[base + 2], w[base + 3], nk, c, c);
    rows_forward(&mut v, kv_src, w[base + 4], w[base + 5], nk, c, c);
    let mut p = vec![T::ZERO; ns * h * t * tk];
    let mut o = vec![T::ZERO; n * c];
    let mut pd = vec![T::ZERO; t * tk];
    for sl in 0..ns {
        let seq = s0 + sl;
        for hi in 0..h {
            let (qo, ko) = (sl * t * c + hi * dh, sl * tk * c + hi * dh);
            let pb = &mut p[(sl * h + hi) * t * tk..][..t * tk];
            gemm(
                Mat::new_mut(pb, t, tk, tk, 1),
                false,
                Mat::new(&q[qo..], t, dh, c, 1),
                Mat::new(&k[ko..], tk, dh, c, 1).t(),
                scale,
            );
            masked_softmax_rows(pb, keep(seq), tk);
            let weights: &[T] = match drops.attn {
                Some(m) => {
                    drop_into(pb, &mut pd, m, (seq * h + hi) * t * tk, dscale);
                    &pd
                }
                None => pb,
            };
            gemm(
                Mat::new_mut(&mut o[qo..], t, dh, c, 1),
                false,
                Mat::new(weights, t, tk, tk, 1),
                Mat::new(&v[ko..], tk, dh, c, 1),
                T::ONE,
            );
        }
    }
    rows_forward(out, &o, w[base + 6], w[base + 7], n, c, c);
    if let Some(m) = drops.out {
        drop_inplace(out, m, s0 * t * c, dscale);
    }
    for (r, &xv) in out.iter_mut().zip(x) {
        *r = xv + *r;
    }
    if !sh.norm_first {
        let sum = out.to_vec();
        ln_fwd(&sum, w[norm], w[norm + 1], eps, out, &mut nrm);
    }
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
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn attn_bwd<T: Float>(
    sh: &SubDims,
    w: &[&[T]],
    (base, norm): (usize, usize),
    g: &mut [Vec<T>],
    sv: &AttnSaved<T>,
    x: &[T],
    kv: Option<(&[T], &mut [T])>,
    tk: usize,
    drops: SublayerDrops,
    dscale: T,
    s0: usize,
    dout: &[T],
    dx: &mut [T],
    scratch: &mut Vec<T>,
) {
    let (t, c, h) = (sh.t, sh.c, sh.h);
    let n = x.len() / c;
    let ns = n / t;
    let nk = ns * tk;
    let dh = c / h;
    let scale = T::from_f64(1.0 / (dh as f64).sqrt());
    // Through the norm (post-norm) to the residual sum; the residual's share is dx itself.
    if sh.norm_first {
        dx.copy_from_slice(dout);
    } else {
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(dout, &sv.norm, w[norm], dx, false, gw, gb, scratch);
    }
    let mut da = dx.to_vec();
    if let Some(m) = drops.out {
        drop_inplace(&mut da, m, s0 * t * c, dscale);
    }
    {
        let (gw, gb) = two(g, base + 6, base + 7);
        linear_grads(gw, gb, &da, &sv.o, n, c);
    }
    let mut d_o = vec![T::ZERO; n * c];
    rows_input_grad(&mut d_o, false, &da, w[base + 6], n, c);
    let (mut dq, mut dk, mut dv) = (da, vec![T::ZERO; nk * c], vec![T::ZERO; nk * c]);
    let mut pd = vec![T::ZERO; t * tk];
    let mut dp = vec![T::ZERO; t * tk];
    for sl in 0..ns {
        let seq = s0 + sl;
        for hi in 0..h {
            let (qo, ko) = (sl * t * c + hi * dh, sl * tk * c + hi * dh);
            let pb = &sv.p[(sl * h + hi) * t * tk..][..t * tk];
            let first = (seq * h + hi) * t * tk;
            let weights: &[T] = match drops.attn {
                Some(m) => {
                    drop_into(pb, &mut pd, m, first, dscale);
                    &pd
                }
                None => pb,
            };
            // dV = Pd^T dO; dPd = dO V^T.
            gemm(
                Mat::new_mut(&mut dv[ko..], tk, dh, c, 1),
                false,
                Mat::new(weights, t, tk, tk, 1).t(),
                Mat::new(&d_o[qo..], t, dh, c, 1),
                T::ONE,
            );
            gemm(
                Mat::new_mut(&mut dp, t, tk, tk, 1),
                false,
                Mat::new(&d_o[qo..], t, dh, c, 1),
                Mat::new(&sv.v[ko..], tk, dh, c, 1).t(),
                T::ONE,
            );
            // Through the dropout and the softmax: dS = P (dP - rowsum(dP P)).
            if let Some(m) = drops.attn {
                drop_inplace(&mut dp, m, first, dscale);
            }
            for (dr, pr) in dp.chunks_exact_mut(tk).zip(pb.chunks_exact(tk)) {
                let dot = float::dot(dr, pr);
                for (x, &pv) in dr.iter_mut().zip(pr) {
                    *x = pv * (*x - dot);
                }
            }
            // dQ = scale dS K; dK = scale dS^T Q.
            gemm(
                Mat::new_mut(&mut dq[qo..], t, dh, c, 1),
                false,
                Mat::new(&dp, t, tk, tk, 1),
                Mat::new(&sv.k[ko..], tk, dh, c, 1),
                scale,
            );
            gemm(
                Mat::new_mut(&mut dk[ko..], tk, dh, c, 1),
                false,
                Mat::new(&dp, t, tk, tk, 1).t(),
                Mat::new(&sv.q[qo..], t, dh, c, 1),
                scale,
            );
        }
    }
    // The projections.
    let a_src: &[T] = if sh.norm_first { &sv.a_in } else { x };
    let kv_src: &[T] = match &kv {
        Some((m, _)) => m,
        None => a_src,
    };
    for (dproj, src, rows, sl) in [
        (&dq, a_src, n, base),
        (&dk, kv_src, nk, base + 2),
        (&dv, kv_src, nk, base + 4),
    ] {
        let (gw, gb) = two(g, sl, sl + 1);
        linear_grads(gw, gb, dproj, src, rows, c);
    }
    let mut da_in = d_o;
    rows_input_grad(&mut da_in, false, &dq, w[base], n, c);
    match kv {
        Some((_, dkv)) => {
            rows_input_grad(dkv, false, &dk, w[base + 2], nk, c);
            rows_input_grad(dkv, true, &dv, w[base + 4], nk, c);
        }
        None => {
            rows_input_grad(&mut da_in, true, &dk, w[base + 2], n, c);
            rows_input_grad(&mut da_in, true, &dv, w[base + 4], n, c);
        }
    }
    if sh.norm_first {
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(&da_in, &sv.norm, w[norm], dx, true, gw, gb, scratch);
    } else {
        float::add_inplace(dx, &da_in);
    }
}

/// The feed-forward sub-layer on `x` (rows from row `row0` of the batch), its output into
/// `y`; `slots` are those of `linear1`'s and `linear2`'s weights and of the norm's weight.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn ff_fwd<T: Float>(
    sh: &SubDims,
    w: &[&[T]],
    (l1, l2, norm): (usize, usize, usize),
    x: &[T],
    drops: FfDrops,
    dscale: T,
    row0: usize,
    y: &mut [T],
) -> FfSaved<T> {
    let (c, f) = (sh.c, sh.f);
    let n = x.len() / c;
    let eps = T::from_f64(sh.eps);
    let mut nrm = Norm::default();
    let mut f_in = Vec::new();
    let f_src: &[T] = if sh.norm_first {
        f_in = vec![T::ZERO; n * c];
        ln_fwd(x, w[norm], w[norm + 1], eps, &mut f_in, &mut nrm);
        &f_in
    } else {
        x
    };
    let mut hid = vec![T::ZERO; n * f];
    rows_forward(&mut hid, f_src, w[l1], w[l1 + 1], n, f, c);
    for v in hid.iter_mut() {
        *v = if *v > T::ZERO { *v } else { T::ZERO };
    }
    let mut hd_buf;
    let hd: &[T] = match drops.hidden {
        Some(m) => {
            hd_buf = vec![T::ZERO; n * f];
            drop_into(&hid, &mut hd_buf, m, row0 * f, dscale);
            &hd_buf
        }
        None => &hid,
    };
    rows_forward(y, hd, w[l2], w[l2 + 1], n, c, f);
    if let Some(m) = drops.out {
        drop_inplace(y, m, row0 * c, dscale);
    }
    for (r, &xv) in y.iter_mut().zip(x) {
        *r = xv + *r;
    }
    if !sh.norm_first {
        let sum = y.to_vec();
        ln_fwd(&sum, w[norm], w[norm + 1], eps, y, &mut nrm);
    }
    FfSaved {
        f_in,
        hid,
        norm: nrm,
    }
}

/// [`ff_fwd`]'s backward pass: the gradient of its input `x` into `dx`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn ff_bwd<T: Float>(
    sh: &SubDims,
    w: &[&[T]],
    (l1, l2, norm): (usize, usize, usize),
    g: &mut [Vec<T>],
    sv: &FfSaved<T>,
    x: &[T],
    drops: FfDrops,
    dscale: T,
    row0: usize,
    dy: &[T],
    dx: &mut [T],
    scratch: &mut Vec<T>,
) {
    let (c, f) = (sh.c, sh.f);
    let n = x.len() / c;
    if sh.norm_first {
        dx.copy_from_slice(dy);
    } else {
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(dy, &sv.norm, w[norm], dx, false, gw, gb, scratch);
    }
    let mut dgo = dx.to_vec();
    if let Some(m) = drops.out {
        drop_inplace(&mut dgo, m, row0 * c, dscale);
    }
    let mut hd = sv.hid.clone();
    if let Some(m) = drops.hidden {
        drop_inplace(&mut hd, m, row0 * f, dscale);
    }
    {
        let (gw, gb) = two(g, l2, l2 + 1);
        linear_grads(gw, gb, &dgo, &hd, n, f);
    }
    let mut dhid = hd;
    rows_input_grad(&mut dhid, false, &dgo, w[l2], n, c);
    if let Some(m) = drops.hidden {
        drop_inplace(&mut dhid, m, row0 * f, dscale);
    }
    for (dv, &hv) in dhid.iter_mut().zip(&sv.hid) {
        *dv = if hv > T::ZERO { *dv } else { T::ZERO };
    }
    let f_src: &[T] = if sh.norm_first { &sv.f_in } else { x };
    {
        let (gw, gb) = two(g, l1, l1 + 1);
        linear_grads(gw, gb, &dhid, f_src, n, c);
    }
    if sh.norm_first {
        let mut df_in = dgo;
        rows_input_grad(&mut df_in, false, &dhid, w[l1], n, f);
        let (gw, gb) = two(g, norm, norm + 1);
        ln_bwd(&df_in, &sv.norm, w[norm], dx, true, gw, gb, scratch);
    } else {
        rows_input_grad(dx, true, &dhid, w[l1], n, f);
    }
}
