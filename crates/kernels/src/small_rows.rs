//! `y = x W^T + b` for a few rows of `x` (2 to [`MAX_ROWS`]), f32, with the weight as the
//! model stores it (`W`, `m x k`, row-major): the encoder's products for one sentence, the
//! decoder's encoder-decoder keys and values at the start of decoding.
//!
//! # Why
//! For `x W^T` the gemm crate wants `W^T` column-major-contiguous, which `W` row-major is
//! not, so at every call it first copies ("packs") all of `W`; with a few rows on the
//! other side that copy costs more than the product. Greedy decoding of one 16-token
//! sentence spent about 2.5 ms of its 8 ms in the encoder, most of it packing.
//!
//! # How
//! `x` (at most 16 rows) is transposed once into `k` vectors of 16 lanes (one AVX-512
//! register each, zero past row `n`). Then for each block of [`COLS`] rows `j` of `W`, and
//! each `kk`, one multiply-add per row of the block: `acc_j += W[j][kk] * xT[kk]`, with
//! `W[j][kk]` broadcast from memory. The `COLS` accumulators hold `y[0..16][j]` and stay in
//! registers; `W` is read once, in place, with no horizontal sums. More than 16 rows run in
//! chunks of 16. Where the pool's other threads are free (the encoder of one sentence runs
//! on the calling thread alone), the blocks of `W` are split between the threads.
//!
//! Each output is `b[j]` plus the products in order of `kk`, each one fused multiply-add:
//! the sums of `x W^T + b` in another order than gemm's. `examples/kernels_timing.rs
//! small-rows` measures both.

use super::float;
use super::{num_threads, run_parallel, threads_are_free};

/// Rows of `x` per pass over `W` (one AVX-512 register of f32).
const LANES: usize = 16;

/// Rows of `W` per block (accumulators in registers).
const COLS: usize = 8;

/// Most rows the kernel is used for: above, gemm's packing of `W` is repaid by its
/// blocked products.
pub(crate) const MAX_ROWS: usize = 48;

/// Weights (`m x k`) from which a call's columns are split between free threads
/// ([`super::threads_are_free`]): one 256 x 256 projection and up.
const MIN_SPLIT: usize = 1 << 16;

/// `y = b + x W^T` for `n` rows: x (n x k), W (m x k), b (m), y (n x m).
///
/// # Panics
/// If a slice is shorter than the sizes say, or the CPU lacks AVX-512 ([`float::avx512`]).
pub(crate) fn forward(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    n: usize,
    m: usize,
    k: usize,
) {
    assert!(
        x.len() >= n * k && w.len() >= m * k && b.len() >= m && y.len() >= n * m,
        "small_rows: slices shorter than {n} x {k} @ ({m} x {k})^T"
    );
    assert!(float::avx512(), "small_rows: this CPU has no AVX-512");
    let mut xt = vec![0f32; k * LANES];
    let mut yt = vec![0f32; m * LANES];
    for r0 in (0..n).step_by(LANES) {
        let rows = (n - r0).min(LANES);
        xt.fill(0.0);
        for i in 0..rows {
            for (kk, &v) in x[(r0 + i) * k..(r0 + i + 1) * k].iter().enumerate() {
                xt[kk * LANES + i] = v;
            }
        }
        // Output columns in one range per free thread, each a whole number of blocks.
        let parts = if m * k >= MIN_SPLIT && threads_are_free() {
            num_threads()
        } else {
            1
        };
        let blocks = m.div_ceil(COLS);
        let mut chunks = Vec::with_capacity(parts);
        let mut rest: &mut [f32] = &mut yt;
        for p in 0..parts {
            let (a, z) = (
                p * blocks / parts * COLS,
                ((p + 1) * blocks / parts * COLS).min(m),
            );
            let (mine, tail) = rest.split_at_mut((z - a) * LANES);
            chunks.push((a..z, mine));
            rest = tail;
        }
        let xt = &xt;
        run_parallel(chunks, |(cols, out)| {
            // SAFETY: AVX-512 F is present (asserted); the slices hold the sizes (asserted),
            // and `out` holds the 16 lanes of each column in `cols`.
            #[cfg(target_arch = "x86_64")]
            unsafe {
                avx512::columns(
                    out,
                    xt,
                    &w[cols.start * k..cols.end * k],
                    &b[cols.clone()],
                    cols.len(),
                    k,
                )
            };
        });
        for i in 0..rows {
            for (jj, out) in y[(r0 + i) * m..(r0 + i + 1) * m].iter_mut().enumerate() {
                *out = yt[jj * LANES + i];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{COLS, LANES};
    use std::arch::x86_64::*;

    /// `yt[j] = b[j] + sum_kk W[j][kk] * xt[kk]` (16 lanes each) for every `j < m`.
    ///
    /// # Safety
    /// AVX-512 F; `xt` holds `k x 16`, `yt` `m x 16`, `w` `m x k`, `b` `m` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn columns(
        yt: &mut [f32],
        xt: &[f32],
        w: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
    ) {
        let (xp, wp, yp) = (xt.as_ptr(), w.as_ptr(), yt.as_mut_ptr());
        let mut j = 0;
        while j + COLS <= m {
            let mut acc = [_mm512_setzero_ps(); COLS];
            for (c, a) in acc.iter_mut().enumerate() {
                *a = _mm512_set1_ps(b[j + c]);
            }
            for kk in 0..k {
                let xv = _mm512_loadu_ps(xp.add(kk * LANES));
                for (c, a) in acc.iter_mut().enumerate() {
                    let wv = _mm512_set1_ps(*wp.add((j + c) * k + kk));
                    *a = _mm512_fmadd_ps(wv, xv, *a);
                }
            }
            for (c, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(yp.add((j + c) * LANES), *a);
            }
            j += COLS;
        }
        while j < m {
            let mut a = _mm512_set1_ps(b[j]);
            for kk in 0..k {
                let wv = _mm512_set1_ps(*wp.add(j * k + kk));
                a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(kk * LANES)), a);
            }
            _mm512_storeu_ps(yp.add(j * LANES), a);
            j += 1;
        }
    }
}
