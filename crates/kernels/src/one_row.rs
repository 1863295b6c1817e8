//! `y = x W^T + b` for one row of `x`, f32, AVX-512, with the weight stored transposed
//! (`W^T`, `k x m`): the decoder stack's products at a greedy decoding step, one sentence at
//! a time.
//!
//! # Why
//! With one row each weight is read once for one multiply-add, so a step's speed is the
//! speed its weights (8 MB of f32 for the default model's decoder) stream in. The gemm
//! crate's one-row path read `W^T` at 59-66 GB/s from the L3 cache on the 2-vCPU Zen 4,
//! this loop at 73-97 GB/s; in greedy decoding the decoder stack went from 3.3 to 2.3 ms a
//! sentence. Splitting the products' columns between the two threads did not pay (slower in
//! 5 of 6 alternating rounds). The same register scheme for the output layer's dot products
//! (eight rows of `W` at a time) was slower than `few_rows`' one row at a time for the
//! language model's 28,782 x 200 layer, and is not used.
//!
//! # How
//! Per block of 256 outputs, sixteen AVX-512 accumulators hold `y`; for each input `kk`,
//! `x[kk]` broadcast times the block of row `kk` of `W^T` (1 KB, contiguous). Each output
//! is the bias plus the products in order of `kk`, each one fused multiply-add: the sums of
//! `x W^T + b` in another order than gemm's.

use super::float;

/// `y = b + x W^T` for one row `x` (`k`), from `wt = W^T` (`k x m`, row-major), `b` (`m`).
///
/// # Panics
/// If a slice is shorter than the sizes say, or the CPU lacks AVX-512 ([`float::avx512`]).
pub(crate) fn wt_row(y: &mut [f32], x: &[f32], wt: &[f32], b: &[f32], m: usize, k: usize) {
    assert!(
        x.len() >= k && wt.len() >= k * m && b.len() >= m && y.len() >= m,
        "one_row: slices shorter than 1 x {k} @ {k} x {m}"
    );
    assert!(float::avx512(), "one_row: this CPU has no AVX-512");
    // SAFETY: AVX-512 F is present and the slices hold the sizes (both asserted).
    #[cfg(target_arch = "x86_64")]
    unsafe {
        avx512::wt_row(y, x, wt, b, m, k)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use crate::float::avx512::mask;
    use std::arch::x86_64::*;

    /// Outputs per block of [`wt_row`]: sixteen registers of 16 lanes.
    const BLOCK: usize = 256;
    /// # Safety
    /// AVX-512 F; the slices hold `k`, `k x m`, `m` and `m` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn wt_row(
        y: &mut [f32],
        x: &[f32],
        wt: &[f32],
        b: &[f32],
        m: usize,
        k: usize,
    ) {
        let (xp, wp, bp, yp) = (x.as_ptr(), wt.as_ptr(), b.as_ptr(), y.as_mut_ptr());
        let mut j = 0;
        while j + BLOCK <= m {
            let mut acc = [_mm512_setzero_ps(); BLOCK / 16];
            for (q, a) in acc.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(bp.add(j + 16 * q));
            }
            for kk in 0..k {
                let xv = _mm512_set1_ps(*xp.add(kk));
                let row = wp.add(kk * m + j);
                for (q, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(xv, _mm512_loadu_ps(row.add(16 * q)), *a);
                }
            }
            for (q, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(yp.add(j + 16 * q), *a);
            }
            j += BLOCK;
        }
        // The last outputs, 16 at a time.
        while j < m {
            let r = mask(m - j);
            let mut a = _mm512_maskz_loadu_ps(r, bp.add(j));
            for kk in 0..k {
                let w = _mm512_maskz_loadu_ps(r, wp.add(kk * m + j));
                a = _mm512_fmadd_ps(_mm512_set1_ps(*xp.add(kk)), w, a);
            }
            _mm512_mask_storeu_ps(yp.add(j), r, a);
            j += 16;
        }
    }
}
