//! f32 row primitives in AVX-512 intrinsics: 32 lanes in two registers, and the ragged end
//! of a row (rows of 35 in attention, 200 in layer norm) handled by masked loads instead of a
//! scalar loop. Written by hand because the auto-vectorised versions in `float` keep their
//! accumulators on the stack and pay store-forwarding stalls on the padded tail (the fused
//! softmax over 20 x 2 x 35 x 35 took 0.5 ms with them).

use std::arch::x86_64::*;

/// Lanes `0..r` (all 16 when `r >= 16`).
#[inline(always)]
pub(crate) fn mask(r: usize) -> __mmask16 {
    if r >= 16 {
        0xffff
    } else {
        ((1u32 << r) - 1) as __mmask16
    }
}

/// [`super::exp_f32`] on 16 lanes, with FMA and `vscalefps` for the `2^n`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn exp(x: __m512) -> __m512 {
    // max/min return their second operand when either is NaN: x, so NaN stays NaN.
    let x = _mm512_max_ps(_mm512_set1_ps(-104.0), x);
    let x = _mm512_min_ps(_mm512_set1_ps(89.0), x);
    let magic = _mm512_set1_ps(12_582_912.0);
    let t = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), magic);
    let n = _mm512_sub_ps(t, magic);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm512_set1_ps(1.987_569_1e-4);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.398_199_9e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.333_452e-3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.166_579_6e-2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.666_666_5e-1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
    let p = _mm512_fmadd_ps(
        p,
        _mm512_mul_ps(r, r),
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_scalef_ps(p, n)
}

/// The body of a reduction of the row `$x` in two accumulators of 16 lanes from `$init`:
/// `$op(acc, v)` on every full vector, `$tail(acc, mask, ptr)` on the ragged end (a masked
/// load), and `$reduce` of the two accumulators combined by `$op`. A macro, not a generic
/// function: the intrinsics must be compiled inside the caller's `#[target_feature]`.
macro_rules! two_register_reduction {
    ($x:expr, $init:expr, $op:path, |$a:ident, $k:ident, $p:ident| $tail:expr, $reduce:path) => {{
        let (n, p) = ($x.len(), $x.as_ptr());
        let mut a0 = $init;
        let mut a1 = a0;
        let mut i = 0;
        while i + 32 <= n {
            a0 = $op(a0, _mm512_loadu_ps(p.add(i)));
            a1 = $op(a1, _mm512_loadu_ps(p.add(i + 16)));
            i += 32;
        }
        while i < n {
            let ($a, $k, $p) = (a0, mask(n - i), p.add(i));
            a0 = $tail;
            i += 16;
        }
        $reduce($op(a0, a1))
    }};
}

/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn row_max(x: &[f32]) -> f32 {
    two_register_reduction!(
        x,
        _mm512_set1_ps(f32::NEG_INFINITY),
        _mm512_max_ps,
        |a, k, p| _mm512_mask_max_ps(a, k, a, _mm512_maskz_loadu_ps(k, p)),
        _mm512_reduce_max_ps
    )
}

/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn row_sum(x: &[f32]) -> f32 {
    two_register_reduction!(
        x,
        _mm512_setzero_ps(),
        _mm512_add_ps,
        |a, k, p| _mm512_add_ps(a, _mm512_maskz_loadu_ps(k, p)),
        _mm512_reduce_add_ps
    )
}

/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let (n, pa, pb) = (a.len().min(b.len()), a.as_ptr(), b.as_ptr());
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = a0;
    let mut i = 0;
    while i + 32 <= n {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(i)), _mm512_loadu_ps(pb.add(i)), a0);
        a1 = _mm512_fmadd_ps(
            _mm512_loadu_ps(pa.add(i + 16)),
            _mm512_loadu_ps(pb.add(i + 16)),
            a1,
        );
        i += 32;
    }
    while i < n {
        let k = mask(n - i);
        a0 = _mm512_fmadd_ps(
            _mm512_maskz_loadu_ps(k, pa.add(i)),
            _mm512_maskz_loadu_ps(k, pb.add(i)),
            a0,
        );
        i += 16;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
}

/// `sum((x - c)^2)`.
///
/// # Safety
/// The CPU must support AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn sum_sq_dev(x: &[f32], c: f32) -> f32 {
    let (n, p) = (x.len(), x.as_ptr());
    let cv = _mm512_set1_ps(c);
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = a0;
    let mut i = 0;
    while i + 32 <= n {
        let d0 = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), cv);
        let d1 = _mm512_sub_ps(_mm512_loadu_ps(p.add(i + 16)), cv);
        a0 = _mm512_fmadd_ps(d0, d0, a0);
        a1 = _mm512_fmadd_ps(d1, d1, a1);
        i += 32;
    }
    while i < n {
        let k = mask(n - i);
        let d = _mm512_maskz_sub_ps(k, _mm512_maskz_loadu_ps(k, p.add(i)), cv);
        a0 = _mm512_fmadd_ps(d, d, a0);
        i += 16;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
}

/// `out[i] = exp(x[i] - m)` for `i < n`; returns the sum. `x` and `out` may be the same
/// memory (each block is loaded before it is stored).
///
/// # Safety
/// The CPU must support AVX-512 F; `x` and `out` must be valid for `n` elements.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp_sub_store_sum(x: *const f32, n: usize, m: f32, out: *mut f32) -> f32 {
    let mv = _mm512_set1_ps(m);
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = a0;
    let mut i = 0;
    while i + 32 <= n {
        let e0 = exp(_mm512_sub_ps(_mm512_loadu_ps(x.add(i)), mv));
        let e1 = exp(_mm512_sub_ps(_mm512_loadu_ps(x.add(i + 16)), mv));
        _mm512_storeu_ps(out.add(i), e0);
        _mm512_storeu_ps(out.add(i + 16), e1);
        a0 = _mm512_add_ps(a0, e0);
        a1 = _mm512_add_ps(a1, e1);
        i += 32;
    }
    while i < n {
        let k = mask(n - i);
        let e = _mm512_maskz_mov_ps(
            k,
            exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x.add(i)), mv)),
        );
        _mm512_mask_storeu_ps(out.add(i), k, e);
        a0 = _mm512_add_ps(a0, e);
        i += 16;
    }
    _mm512_reduce_add_ps(_mm512_add_ps(a0, a1))
}
