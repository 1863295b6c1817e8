//! The scalar type the kernels are generic over (`f32`, `f64`), row primitives written so that
//! LLVM vectorises them, and the run-time dispatch that compiles them for AVX-512.
//!
//! The crate is built for baseline x86-64 (SSE2), where these loops would run 4 lanes wide at
//! best. [`simd`] runs a closure inside a `#[target_feature(enable = "avx512f,...")]` function;
//! every primitive here is `#[inline(always)]`, so it is inlined into that closure and compiled
//! with 16-lane (f32) registers. Reductions keep [`LANES`] independent partial sums so that they
//! vectorise too (a single running sum is a serial dependency chain that LLVM may not reorder).
//!
//! `exp` for f32 is a branch-free Cephes-style polynomial (about 2 ulp) instead of `f32::exp`,
//! which is a scalar libm call: over the 2 x 23.3 M exponentials of the language model's loss
//! that call alone costs about 200 ms; the polynomial vectorises to about 3 ms.

use candle_core::WithDType;

/// Independent partial sums in reductions (two AVX-512 registers of f32, four of f64).
pub(crate) const LANES: usize = 32;

/// `f32` or `f64`.
pub(crate) trait Float: WithDType + Send + Sync {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
}

impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f32::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}

impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

/// `e^x` for f32, branch-free so that it vectorises; relative error about 2 ulp over the
/// whole range, `exp(-inf) = 0`, `exp(+inf) = inf`, NaN propagates, results below `f32`'s
/// normal range are produced as denormals or 0 like libm.
///
/// Cephes `expf`: `x = n ln2 + r` with `|r| <= ln2 / 2`, a degree-7 polynomial for `e^r`,
/// then `2^n` built from exponent bits. `2^n` is applied as two factors so that every `n` in
/// `[-150, 128]` (all of f32's range) stays a normal number on the way.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // Comparisons (not f32::max/min) so NaN stays NaN.
    let x = if x < -104.0 { -104.0 } else { x };
    let x = if x > 89.0 { 89.0 } else { x };
    // Round x * log2(e) to the nearest integer with the 1.5 * 2^23 trick.
    const MAGIC: f32 = 12_582_912.0;
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    // The integer n is also in t's low mantissa bits. Reading it there instead of `n as i32`
    // matters: the saturating cast is scalarised lane by lane (NaN checks).
    let ni = t.to_bits() as i32 - MAGIC.to_bits() as i32;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let p = p * (r * r) + r + 1.0;
    let half = ni >> 1;
    let a = f32::from_bits(((half + 127) as u32) << 23);
    let b = f32::from_bits(((ni - half + 127) as u32) << 23);
    p * a * b
}

// ---------------------------------------------------------------------------------------------
// Row primitives. All `#[inline(always)]`: they are meant to be inlined into a closure run by
// `simd`, which is where they get their vector width.
// ---------------------------------------------------------------------------------------------

#[inline(always)]
fn fold_lanes<T: Float>(acc: &[T; LANES]) -> T {
    let mut s = T::ZERO;
    for &a in acc {
        s += a;
    }
    s
}

/// Largest element (`-inf` for an empty row). NaN elements are skipped here; they still
/// poison the row through the exponentials that follow.
#[inline(always)]
pub(crate) fn row_max<T: Float>(x: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            acc[i] = if ch[i] > acc[i] { ch[i] } else { acc[i] };
        }
    }
    let mut m = T::NEG_INFINITY;
    for &a in acc.iter().chain(chunks.remainder()) {
        m = if a > m { a } else { m };
    }
    m
}

#[inline(always)]
pub(crate) fn row_sum<T: Float>(x: &[T]) -> T {
    let mut acc = [T::ZERO; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            acc[i] += ch[i];
        }
    }
    let mut s = fold_lanes(&acc);
    for &r in chunks.remainder() {
        s += r;
    }
    s
}

#[inline(always)]
pub(crate) fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [T::ZERO; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = fold_lanes(&acc);
    for (&x, &y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    s
}

/// `sum((x - c)^2)`.
#[inline(always)]
pub(crate) fn sum_sq_dev<T: Float>(x: &[T], c: T) -> T {
    let mut acc = [T::ZERO; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            let d = ch[i] - c;
            acc[i] += d * d;
        }
    }
    let mut s = fold_lanes(&acc);
    for &r in chunks.remainder() {
        let d = r - c;
        s += d * d;
    }
    s
}

/// `sum(exp(x - m))` without storing anything.
#[inline(always)]
pub(crate) fn exp_sub_sum<T: Float>(x: &[T], m: T) -> T {
    let mut acc = [T::ZERO; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            acc[i] += (ch[i] - m).exp();
        }
    }
    let mut s = fold_lanes(&acc);
    for &r in chunks.remainder() {
        s += (r - m).exp();
    }
    s
}

/// `out = exp(x - m)`; returns `sum(out)`.
#[inline(always)]
pub(crate) fn exp_sub_store_sum<T: Float>(x: &[T], m: T, out: &mut [T]) -> T {
    let n = x.len().min(out.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    let mut acc = [T::ZERO; LANES];
    let mut cx = x.chunks_exact(LANES);
    let mut co = out.chunks_exact_mut(LANES);
    for (a, o) in (&mut cx).zip(&mut co) {
        for i in 0..LANES {
            let e = (a[i] - m).exp();
            o[i] = e;
            acc[i] += e;
        }
    }
    let mut s = fold_lanes(&acc);
    for (&a, o) in cx.remainder().iter().zip(co.into_remainder()) {
        let e = (a - m).exp();
        *o = e;
        s += e;
    }
    s
}

/// `x = exp(x - m) * s`, in place.
#[inline(always)]
pub(crate) fn exp_sub_scale_inplace<T: Float>(x: &mut [T], m: T, s: T) {
    for v in x.iter_mut() {
        *v = (*v - m).exp() * s;
    }
}

/// `x *= s`.
#[inline(always)]
pub(crate) fn scale_inplace<T: Float>(x: &mut [T], s: T) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `x += y`.
#[inline(always)]
pub(crate) fn add_inplace<T: Float>(x: &mut [T], y: &[T]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------

/// Runs `f` compiled for the widest vector ISA this CPU has (AVX-512, else AVX2 + FMA, else
/// baseline). `f` and everything it calls with `#[inline(always)]` is inlined into a function
/// with those target features, which is what lets LLVM use them.
#[inline(always)]
pub(crate) fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        match level() {
            Level::Avx512 => return unsafe { run_avx512(f) },
            Level::Avx2 => return unsafe { run_avx2(f) },
            Level::Base => {}
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Avx512,
    Avx2,
    Base,
}

#[cfg(target_arch = "x86_64")]
fn level() -> Level {
    use std::sync::OnceLock;
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        if std::env::var_os("TRANSFORMER_KERNELS_NO_SIMD").is_some() {
            Level::Base
        } else if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512bw")
        {
            Level::Avx512
        } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            Level::Avx2
        } else {
            Level::Base
        }
    })
}

/// # Safety
/// The CPU must support the listed features (checked by `level`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,bmi1,bmi2,popcnt")]
unsafe fn run_avx512<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// # Safety
/// The CPU must support the listed features (checked by `level`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,bmi1,bmi2,popcnt")]
unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_matches_libm() {
        let mut worst = 0f64;
        let mut x = -110.0f32;
        while x < 90.0 {
            let want = (x as f64).exp();
            let got = simd(
                #[inline(always)]
                || exp_f32(x),
            ) as f64;
            if want > f32::MIN_POSITIVE as f64 && want < f32::MAX as f64 {
                worst = worst.max(((got - want) / want).abs());
            } else if want < 1e-46 {
                assert_eq!(got, 0.0, "exp({x})");
            }
            x += 0.001_37;
        }
        assert!(
            worst < 3.0 * f32::EPSILON as f64,
            "worst relative error {worst}"
        );
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert_eq!(exp_f32(0.0), 1.0);
    }

    #[test]
    fn reductions() {
        let x: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
        let s: f32 = x.iter().sum();
        assert!(
            (simd(
                #[inline(always)]
                || row_sum(&x)
            ) - s)
                .abs()
                < 1e-5
        );
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(
            simd(
                #[inline(always)]
                || row_max(&x)
            ),
            m
        );
        let d: f32 = x.iter().map(|v| v * v).sum();
        assert!(
            (simd(
                #[inline(always)]
                || dot(&x, &x)
            ) - d)
                .abs()
                < 1e-5
        );
    }
}
