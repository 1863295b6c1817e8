//! The two passes over the vocabulary's column blocks that [`super::forward`] and
//! [`super::backward`] run per thread: pass 1 the logits, their running maximum and
//! normaliser per row; pass 2 the probabilities' products with the hidden states and the
//! weight, and the gradient blocks.

use super::*;

/// Pass 1 over the columns `cols`, block by block: `Z_j^T = W_j H^T + b_j` (`len x n`, so that
/// the per-row reductions run along contiguous memory), the block max per row, `exp(z - max)`
/// in place and its sum per row, folded into the running (max, sum) per row. `store` says
/// what stays in `region` for pass 2: with `Full`, block `j` at `n * (v0_j - cols.start)`;
/// with `Bf16`, the same rounded to bf16 in the region's slots read as `u16`
/// ([`as_bf16_slots`]; the block itself is computed in a scratch); with `None`, `region` holds
/// one block at a time. `h_transposed` is `H^T` (`c x n`, contiguous) for the gemm products,
/// `h_t` the packed operand of the bf16 ones.
#[allow(clippy::too_many_arguments)]
pub(super) fn pass1<T: Pooled>(
    h: &[T],
    h_transposed: Option<&[T]>,
    w: &[T],
    b: &[T],
    n: usize,
    c: usize,
    targets: &[Option<usize>],
    cols: Range<usize>,
    block: usize,
    region: &mut [T],
    store: Store,
    h_t: Option<&[u32]>,
) -> Partial<T> {
    let mut p = Partial {
        max: vec![T::NEG_INFINITY; n],
        sum: vec![T::ZERO; n],
        target_logit: vec![T::ZERO; n],
        block_max: vec![T::NEG_INFINITY; n * cols.len().div_ceil(block)],
    };
    let mut block_sum = vec![T::ZERO; n];
    let (mut w_j, mut z_scratch) = (Vec::new(), Vec::new());
    // With bf16 storage the block is computed here and only its rounded exponentials go to
    // the region.
    let (mut unstored, mut full, mut bf16_region) = match store {
        Store::Bf16 => (
            vec![T::ZERO; n * block.min(cols.len())],
            None,
            T::as_f32_mut(region).map(as_bf16_slots),
        ),
        _ => (Vec::new(), Some(region), None),
    };
    let mut v0 = cols.start;
    let mut j = 0;
    while v0 < cols.end {
        let len = block.min(cols.end - v0);
        let local = v0 - cols.start;
        let z = match (store, full.as_deref_mut()) {
            (Store::None, Some(region)) => &mut region[..n * len],
            (Store::Full, Some(region)) => &mut region[n * local..n * (local + len)],
            _ => &mut unstored[..n * len],
        };
        let w_rows = &w[v0 * c..(v0 + len) * c];
        let bias = &b[v0..v0 + len];
        let bmax = &mut p.block_max[j * n..(j + 1) * n];
        // Z^T (len x n, row stride n) = W_j (len x c) @ H^T (c x n), plus the bias, and the
        // block's max per row.
        let bf16_args = (
            h_t,
            T::as_f32_mut(&mut *z),
            T::as_f32(w_rows),
            T::as_f32(bias),
            T::as_f32_mut(&mut *bmax),
        );
        match bf16_args {
            (Some(h_t), Some(z), Some(w_rows), Some(bias), Some(bmax)) => {
                // In slices of BF16_ROWS rows through a 64-byte-aligned scratch that stays in
                // L2 (tile stores straight into the uncached, unaligned region were slow),
                // copied out with the bias added and the max taken on the way.
                let np = pad32(n);
                let zs = bf16::aligned(&mut z_scratch, BF16_ROWS * np);
                for s0 in (0..len).step_by(BF16_ROWS) {
                    let rows = BF16_ROWS.min(len - s0);
                    bf16::pack_rows(&w_rows[s0 * c..(s0 + rows) * c], (rows, c, c), &mut w_j);
                    bf16::gemm_bf16(zs, np, rows, n, &w_j, pad32(c), h_t, np, false);
                    let dst = &mut z[s0 * n..(s0 + rows) * n];
                    let bias = &bias[s0..s0 + rows];
                    simd(
                        #[inline(always)]
                        || {
                            let rows = dst.chunks_exact_mut(n).zip(zs.chunks_exact(np));
                            for ((zr, sr), &bv) in rows.zip(bias) {
                                for ((x, &s), m) in zr.iter_mut().zip(sr).zip(bmax.iter_mut()) {
                                    *x = s + bv;
                                    *m = if *x > *m { *x } else { *m };
                                }
                            }
                        },
                    );
                }
            }
            _ => {
                // The gemm crate (fp32 products, f64): W_j in place, H^T from its copy.
                let h_t = match h_transposed {
                    Some(t) => Mat::new(t, c, n, n, 1),
                    None => Mat::new(h, c, n, 1, c),
                };
                gemm(
                    Mat::new_mut(&mut *z, len, n, n, 1),
                    false,
                    Mat::new(w_rows, len, c, c, 1),
                    h_t,
                    T::ONE,
                );
                simd(
                    #[inline(always)]
                    || {
                        for (zr, &bv) in z.chunks_exact_mut(n).zip(bias) {
                            for (x, m) in zr.iter_mut().zip(bmax.iter_mut()) {
                                *x += bv;
                                *m = if *x > *m { *x } else { *m };
                            }
                        }
                    },
                );
            }
        }
        // With bf16 storage, this block's slots in the region.
        let bf16_dst = bf16_region
            .as_deref_mut()
            .map(|slots| &mut slots[n * local..n * (local + len)]);
        simd(
            #[inline(always)]
            || {
                for (row, t) in targets.iter().enumerate() {
                    if let Some(t) = *t {
                        if (v0..v0 + len).contains(&t) {
                            p.target_logit[row] = z[(t - v0) * n + row];
                        }
                    }
                }
                // exp(z - block max), stored for pass 2, summed per row.
                block_sum.fill(T::ZERO);
                let bf16_sweep = (
                    bf16_dst,
                    T::as_f32(z),
                    T::as_f32(bmax),
                    T::as_f32_mut(&mut block_sum),
                );
                if let (Some(dst), Some(z), Some(bmax), Some(sums)) = bf16_sweep {
                    // Straight into the bf16 store: the f32 block is scratch.
                    for (zr, dr) in z.chunks_exact(n).zip(dst.chunks_exact_mut(n)) {
                        for (((&x, &m), s), o) in zr.iter().zip(bmax).zip(sums.iter_mut()).zip(dr) {
                            let e = Float::exp(x - m);
                            *s += e;
                            *o = bf16::bf16_bits(e);
                        }
                    }
                } else if store == Store::None {
                    // Nothing reads the exponentials again: only their sums.
                    for zr in z.chunks_exact(n) {
                        for ((&x, &m), s) in zr.iter().zip(bmax.iter()).zip(block_sum.iter_mut()) {
                            *s += (x - m).exp();
                        }
                    }
                } else {
                    for zr in z.chunks_exact_mut(n) {
                        for ((x, &m), s) in zr.iter_mut().zip(bmax.iter()).zip(block_sum.iter_mut())
                        {
                            let e = (*x - m).exp();
                            *x = e;
                            *s += e;
                        }
                    }
                }
                // Online log-sum-exp: fold the block into the running state.
                for row in 0..n {
                    let (m, s, bm, bs) = (p.max[row], p.sum[row], bmax[row], block_sum[row]);
                    if bm > m {
                        p.sum[row] = s * (m - bm).exp() + bs;
                        p.max[row] = bm;
                    } else {
                        p.sum[row] = s + bs * (bm - m).exp();
                    }
                }
            },
        );
        v0 += len;
        j += 1;
    }
    p
}

/// Pass 2 over the columns `cols`, whose exponentials pass 1 left in `region`: turns block
/// `j` into `P_j^T = (softmax - onehot)^T * scale` (`exp(z - block max)` times the per-row
/// factor `exp(block max - lse) * scale`; no second exponential per element), in place on the
/// fp32 path, straight into the packed bf16 operands on the bf16 path ([`pack_p`]), writes
/// `db` (entries `cols` of dbias) and `dw` (rows `cols` of dW, each block written once) and
/// returns this thread's `dH^T = sum_j (P_j W_j)^T` (C x N).
#[allow(clippy::too_many_arguments)]
pub(super) fn pass2<T: Pooled>(
    h: &[T],
    w: &[T],
    n: usize,
    c: usize,
    targets: &[Option<usize>],
    lse: &[T],
    scale: &[T],
    cols: Range<usize>,
    block: usize,
    region: &mut [T],
    store: Store,
    block_max: &[T],
    dw: &mut [T],
    db: &mut [T],
    h_pairs: Option<&[u32]>,
) -> (Vec<T>, f64) {
    let (mut full, bf16_region) = match store {
        Store::Bf16 => (None, T::as_f32_mut(region).map(|r| &*as_bf16_slots(r))),
        _ => (Some(region), None),
    };
    let mut dh_t = vec![T::ZERO; c * n];
    let (mut p_rows, mut p_pairs, mut w_t) = (Vec::new(), Vec::new(), Vec::new());
    // bf16 products write through 64-byte-aligned scratch with padded rows (see pass 1):
    // dW_j's rows, and dH^T accumulated over all blocks, copied out at the end.
    let (mut dw_buf, mut dh_buf) = (Vec::new(), Vec::new());
    let (np, cp) = (pad32(n), pad32(c));
    let dh_pad = match h_pairs {
        Some(_) => bf16::aligned(&mut dh_buf, c * np),
        None => &mut [][..],
    };
    let mut factor = vec![T::ZERO; n];
    let mut dw_sum_sq = 0f64;
    let mut v0 = cols.start;
    let mut j = 0;
    while v0 < cols.end {
        let len = block.min(cols.end - v0);
        let local = v0 - cols.start;
        let p = match full.as_deref_mut() {
            Some(region) => &mut region[n * local..n * (local + len)],
            None => &mut [][..],
        };
        let e16 = bf16_region.map(|r| &r[n * local..n * (local + len)]);
        let db = &mut db[local..local + len];
        let bmax = &block_max[j * n..(j + 1) * n];
        simd(
            #[inline(always)]
            || {
                for (((f, &m), &l), &s) in factor.iter_mut().zip(bmax).zip(lse).zip(scale) {
                    *f = if s == T::ZERO {
                        T::ZERO
                    } else {
                        (m - l).exp() * s
                    };
                }
            },
        );
        let w_rows = &w[v0 * c..(v0 + len) * c];
        let dw_j = &mut dw[local * c..(local + len) * c];
        let bf16_args = (
            h_pairs,
            T::as_f32(p),
            T::as_f32(w_rows),
            T::as_f32_mut(&mut *dw_j),
            T::as_f32_mut(&mut *db),
            T::as_f32(&factor),
            T::as_f32(scale),
        );
        match bf16_args {
            (Some(h_pairs), Some(p), Some(w_rows), Some(dw_j), Some(db), Some(f), Some(sc)) => {
                // P_j^T straight into the two bf16 layouts the products read, its row sums
                // into db: one pass over the stored exponentials, no f32 P written back.
                let e = match e16 {
                    Some(e) => Exps::Bf16(e),
                    None => Exps::F32(p),
                };
                pack_p(e, len, n, f, sc, targets, v0, db, &mut p_rows, &mut p_pairs);
                // dW_j (len x c) = P_j^T (len x n) @ H (n x c).
                let dw_pad = bf16::aligned(&mut dw_buf, len * cp);
                bf16::gemm_bf16(dw_pad, cp, len, c, &p_rows, np, h_pairs, cp, false);
                for (dst, src) in dw_j.chunks_exact_mut(c).zip(dw_pad.chunks_exact(cp)) {
                    dst.copy_from_slice(&src[..c]);
                }
                // dH^T (c x n) += W_j^T (c x len) @ P_j^T (len x n).
                bf16::pack_rows_transposed(w_rows, (len, c, c), &mut w_t);
                bf16::gemm_bf16(dh_pad, np, c, n, &w_t, pad32(len), &p_pairs, np, j > 0);
            }
            _ => {
                debug_assert_eq!(store, Store::Full, "bf16 storage implies the bf16 products");
                simd(
                    #[inline(always)]
                    || {
                        for (pr, d) in p.chunks_exact_mut(n).zip(db.iter_mut()) {
                            for (x, &f) in pr.iter_mut().zip(factor.iter()) {
                                *x *= f;
                            }
                            *d = float::row_sum(pr);
                        }
                        for (row, (t, &s)) in targets.iter().zip(scale).enumerate() {
                            if let Some(t) = *t {
                                if (v0..v0 + len).contains(&t) {
                                    p[(t - v0) * n + row] -= s;
                                    db[t - v0] -= s;
                                }
                            }
                        }
                    },
                );
                let p = &*p;
                // dW_j (len x c) = P_j^T (len x n) @ H (n x c).
                gemm(
                    Mat::new_mut(&mut *dw_j, len, c, c, 1),
                    false,
                    Mat::new(p, len, n, n, 1),
                    Mat::new(h, n, c, c, 1),
                    T::ONE,
                );
                // dH^T (n x c, stored column-major) += P_j (n x len) @ W_j (len x c).
                gemm(
                    Mat::new_mut(&mut dh_t, n, c, 1, n),
                    j > 0,
                    Mat::new(p, n, len, 1, n),
                    Mat::new(w_rows, len, c, c, 1),
                    T::ONE,
                );
            }
        }
        // This block's share of the clipping norm, while dW_j is in cache.
        dw_sum_sq += simd(
            #[inline(always)]
            || float::sum_sq_f64(dw_j),
        );
        v0 += len;
        j += 1;
    }
    if let (Some(dh_t), false) = (T::as_f32_mut(&mut dh_t), dh_pad.is_empty()) {
        for (dst, src) in dh_t.chunks_exact_mut(n).zip(dh_pad.chunks_exact(np)) {
            dst.copy_from_slice(&src[..n]);
        }
    }
    (dh_t, dw_sum_sq)
}

/// One block's stored exponentials, `len x n`.
#[derive(Clone, Copy)]
enum Exps<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

/// The f32 slots of a `Store::Bf16` region as bf16 values, two per slot.
fn as_bf16_slots(slots: &mut [f32]) -> &mut [u16] {
    // SAFETY: u16 has no invalid bit patterns and an alignment (2) dividing f32's (4); the
    // new slice covers exactly the same bytes and borrows them for the same lifetime.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<u16>(), slots.len() * 2) }
}

/// The bf16 operands of pass 2 from one block's stored exponentials `e` (`len x n`): row `r`
/// of `P_j^T` is `e[r] * factor - scale * onehot` (the target's `scale` subtracted where row
/// `v0 + r` is a row's target), written as bf16 rows into `rows` (`pad32(len) x pad32(n)`,
/// [`bf16::pack_rows`]'s layout) and as pairs of rows into `pairs`
/// ([`bf16::pack_pairs_of_rows`]'s); `db[r]` gets its sum (in f32).
#[allow(clippy::too_many_arguments)]
fn pack_p(
    e: Exps,
    len: usize,
    n: usize,
    factor: &[f32],
    scale: &[f32],
    targets: &[Option<usize>],
    v0: usize,
    db: &mut [f32],
    rows: &mut Vec<u16>,
    pairs: &mut Vec<u32>,
) {
    let (lp, np) = (pad32(len), pad32(n));
    // Sized once with zeros (the padding columns are never written, so stay zero); padding
    // rows of a short last block are cleared.
    if rows.len() < lp * np {
        rows.resize(pad32(BLOCK).max(lp) * np, 0);
        pairs.resize(pad32(BLOCK).max(lp) / 2 * np, 0);
    }
    rows[len * np..lp * np].fill(0);
    pairs[len.div_ceil(2) * np..lp / 2 * np].fill(0);
    // (row of P_j^T, column, amount) of the one-hot terms in this block, in row order.
    let mut hits: Vec<(usize, usize, f32)> = targets
        .iter()
        .zip(scale)
        .enumerate()
        .filter_map(|(col, (t, &s))| match *t {
            Some(t) if (v0..v0 + len).contains(&t) => Some((t - v0, col, s)),
            _ => None,
        })
        .collect();
    hits.sort_unstable_by_key(|h| (h.0, h.1));
    let (mut lo, mut hi) = (vec![0f32; n], vec![0f32; n]);
    simd(
        #[inline(always)]
        || {
            let mut hits = hits.iter().peekable();
            let mut row = |r: usize, out: &mut [f32], db: &mut [f32]| {
                if r >= len {
                    out.fill(0.0);
                    return;
                }
                match e {
                    Exps::F32(e) => {
                        for ((o, &x), &f) in out.iter_mut().zip(&e[r * n..(r + 1) * n]).zip(factor)
                        {
                            *o = x * f;
                        }
                    }
                    Exps::Bf16(e) => {
                        for ((o, &x), &f) in out.iter_mut().zip(&e[r * n..(r + 1) * n]).zip(factor)
                        {
                            *o = bf16::bf16_value(x) * f;
                        }
                    }
                }
                while let Some(&&(hr, col, s)) = hits.peek() {
                    if hr != r {
                        break;
                    }
                    out[col] -= s;
                    hits.next();
                }
                db[r] = float::row_sum(out);
            };
            for r in (0..len).step_by(2) {
                row(r, &mut lo, db);
                row(r + 1, &mut hi, db);
                for (o, &x) in rows[r * np..r * np + n].iter_mut().zip(&lo) {
                    *o = bf16::bf16_bits(x);
                }
                if r + 1 < len {
                    let dst = &mut rows[(r + 1) * np..(r + 1) * np + n];
                    for (o, &x) in dst.iter_mut().zip(&hi) {
                        *o = bf16::bf16_bits(x);
                    }
                }
                let dst = &mut pairs[r / 2 * np..r / 2 * np + n];
                for ((o, &a), &b) in dst.iter_mut().zip(&lo).zip(&hi) {
                    *o = bf16::bf16_bits(a) as u32 | (bf16::bf16_bits(b) as u32) << 16;
                }
            }
        },
    );
}
