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
#[allow(missing_docs)]
pub trait Float: WithDType + Send + Sync {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    /// The error function, as candle's `erf` op computes it.
    fn erf(self) -> Self;
    fn tanh(self) -> Self;

    // Row primitives (see the free functions of the same names). The defaults are the
    // portable versions; f32 overrides them with AVX-512 code where the CPU has it.
    #[inline(always)]
    fn row_max(x: &[Self]) -> Self {
        generic_row_max(x)
    }
    #[inline(always)]
    fn row_sum(x: &[Self]) -> Self {
        generic_row_sum(x)
    }
    #[inline(always)]
    fn dot(a: &[Self], b: &[Self]) -> Self {
        generic_dot(a, b)
    }
    #[inline(always)]
    fn sum_sq_dev(x: &[Self], c: Self) -> Self {
        generic_sum_sq_dev(x, c)
    }
    #[inline(always)]
    fn exp_sub_inplace_sum(x: &mut [Self], m: Self) -> Self {
        generic_exp_sub_inplace_sum(x, m)
    }
    #[inline(always)]
    fn exp_sub_store_sum(x: &[Self], m: Self, out: &mut [Self]) -> Self {
        generic_exp_sub_store_sum(x, m, out)
    }

    /// `x` as f32 values, for the paths that exist for f32 only (bf16 products); `None` for
    /// other types.
    #[inline(always)]
    fn as_f32(_x: &[Self]) -> Option<&[f32]> {
        None
    }
    /// [`Float::as_f32`], mutably.
    #[inline(always)]
    fn as_f32_mut(_x: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
}

/// The constants and scalar functions of [`Float`] for `$t`: its own `ln`, `sqrt` and
/// `tanh`, `$exp` and `$erf` (one implementation per type, hence a macro). The `@calls` arm
/// writes each method `name(self)` as a call of its function.
macro_rules! scalar_basics {
    ($t:ident, $exp:path, $erf:path) => {
        const ZERO: Self = 0.0;
        const ONE: Self = 1.0;
        const NEG_INFINITY: Self = $t::NEG_INFINITY;
        scalar_basics!(@calls exp: $exp, ln: $t::ln, sqrt: $t::sqrt, erf: $erf, tanh: $t::tanh);
    };
    (@calls $($name:ident: $f:path),*) => {
        $(
            #[inline(always)]
            fn $name(self) -> Self {
                $f(self)
            }
        )*
    };
}

/// Calls the AVX-512 version of a row primitive when the CPU has it.
macro_rules! avx512_or {
    ($fast:expr, $portable:expr) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if level() == Level::Avx512 {
                // SAFETY: `level` checked that the CPU supports AVX-512 F/VL/DQ/BW.
                return unsafe { $fast };
            }
        }
        $portable
    }};
}

impl Float for f32 {
    scalar_basics!(f32, exp_f32, candle_core::cpu::erf::erf_f32);
    #[inline(always)]
    fn as_f32(x: &[Self]) -> Option<&[f32]> {
        Some(x)
    }
    #[inline(always)]
    fn as_f32_mut(x: &mut [Self]) -> Option<&mut [f32]> {
        Some(x)
    }
    #[inline(always)]
    fn row_max(x: &[Self]) -> Self {
        avx512_or!(avx512::row_max(x), generic_row_max(x))
    }
    #[inline(always)]
    fn row_sum(x: &[Self]) -> Self {
        avx512_or!(avx512::row_sum(x), generic_row_sum(x))
    }
    #[inline(always)]
    fn dot(a: &[Self], b: &[Self]) -> Self {
        avx512_or!(avx512::dot(a, b), generic_dot(a, b))
    }
    #[inline(always)]
    fn sum_sq_dev(x: &[Self], c: Self) -> Self {
        avx512_or!(avx512::sum_sq_dev(x, c), generic_sum_sq_dev(x, c))
    }
    #[inline(always)]
    fn exp_sub_inplace_sum(x: &mut [Self], m: Self) -> Self {
        avx512_or!(
            avx512::exp_sub_store_sum(x.as_ptr(), x.len(), m, x.as_mut_ptr()),
            generic_exp_sub_inplace_sum(x, m)
        )
    }
    #[inline(always)]
    fn exp_sub_store_sum(x: &[Self], m: Self, out: &mut [Self]) -> Self {
        let n = x.len().min(out.len());
        avx512_or!(
            avx512::exp_sub_store_sum(x.as_ptr(), n, m, out.as_mut_ptr()),
            generic_exp_sub_store_sum(x, m, out)
        )
    }
}

impl Float for f64 {
    scalar_basics!(f64, f64::exp, candle_core::cpu::erf::erf_f64);
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
    // Fused multiply-adds (`mul_add`): Rust never contracts `a * b + c` into one, and with
    // separate multiplies and adds the exponential sweep of the loss's pass 1 ran at about 2
    // cycles per element (33 instructions per 16 lanes, a dependency chain twice as long);
    // with them, 1.8x faster, and one rounding fewer per step. Inside `simd` they are FMA
    // instructions; on the portable path (no FMA) a libm call, correct but slow.
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let mut p = 1.987_569_1e-4_f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let p = p.mul_add(r * r, r) + 1.0;
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

/// Runs `body` on `x` in chunks of [`LANES`], the last one padded with `pad` in a stack
/// buffer so that it runs the same vector code (rows of 35 or 200 would otherwise spend much
/// of their time in a scalar remainder loop).
#[inline(always)]
fn chunks<T: Float>(x: &[T], pad: T, mut body: impl FnMut(&[T; LANES])) {
    let mut it = x.chunks_exact(LANES);
    for ch in &mut it {
        body(ch.try_into().expect("a full chunk"));
    }
    let r = it.remainder();
    if !r.is_empty() {
        body(&padded(r, pad));
    }
}

/// A chunk's remainder `r` padded with `pad` to [`LANES`] elements.
#[inline(always)]
fn padded<T: Float>(r: &[T], pad: T) -> [T; LANES] {
    let mut buf = [pad; LANES];
    buf[..r.len()].copy_from_slice(r);
    buf
}

/// [`chunks`] in place: `body` may rewrite each chunk.
#[inline(always)]
fn chunks_mut<T: Float>(x: &mut [T], pad: T, mut body: impl FnMut(&mut [T; LANES])) {
    let mut it = x.chunks_exact_mut(LANES);
    for ch in &mut it {
        body(ch.try_into().expect("a full chunk"));
    }
    let r = it.into_remainder();
    if !r.is_empty() {
        let mut buf = padded(r, pad);
        body(&mut buf);
        let n = r.len();
        r.copy_from_slice(&buf[..n]);
    }
}

/// `LANES` partial results over `x`: lane `i` folds `step` over the elements `i`, `i + LANES`,
/// ... from `init`, the last chunk padded with `pad` ([`chunks`]).
#[inline(always)]
fn lane_fold<T: Float>(x: &[T], pad: T, init: T, step: impl Fn(T, T) -> T) -> [T; LANES] {
    let mut acc = [init; LANES];
    chunks(
        x,
        pad,
        #[inline(always)]
        |ch| {
            for i in 0..LANES {
                acc[i] = step(acc[i], ch[i]);
            }
        },
    );
    acc
}

/// Largest element (`-inf` for an empty row). NaN elements are skipped here; they still
/// poison the row through the exponentials that follow.
#[inline(always)]
fn generic_row_max<T: Float>(x: &[T]) -> T {
    let acc = lane_fold(x, T::NEG_INFINITY, T::NEG_INFINITY, max_of);
    acc.into_iter().fold(T::NEG_INFINITY, max_of)
}

/// `v` where it is larger than `a` (so a NaN `v` is passed over), else `a`.
#[inline(always)]
fn max_of<T: Float>(a: T, v: T) -> T {
    if v > a {
        v
    } else {
        a
    }
}

#[inline(always)]
fn generic_row_sum<T: Float>(x: &[T]) -> T {
    fold_lanes(&lane_fold(x, T::ZERO, T::ZERO, sum_of))
}

#[inline(always)]
fn sum_of<T: Float>(a: T, v: T) -> T {
    a + v
}

/// Lane `i` sums `a[j] * b[j]` over `j = i, i + LANES, ...` in order, then the lanes are
/// folded. The last partial chunk is added lane by lane in place (in 8-wide pieces, then one
/// by one) rather than through [`padded`] copies: the decoding step's attention takes dot
/// products of one head's width, 16 for a 128-wide model of 8 heads, where copying both
/// operands into padded buffers was 22% of a beam search on an AVX2 Zen 3. The sums are the
/// padded version's: a lane starts at +0 and never holds -0, so the padding's `+0 * +0`
/// changed nothing.
#[inline(always)]
fn generic_dot<T: Float>(a: &[T], b: &[T]) -> T {
    const PIECE: usize = 8;
    let n = a.len().min(b.len());
    let full = n - n % LANES;
    let mut acc = [T::ZERO; LANES];
    for (x, y) in a[..full]
        .chunks_exact(LANES)
        .zip(b[..full].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let (ra, rb) = (&a[full..n], &b[full..n]);
    let pieces = ra.len() - ra.len() % PIECE;
    for (p, (x, y)) in ra[..pieces]
        .chunks_exact(PIECE)
        .zip(rb[..pieces].chunks_exact(PIECE))
        .enumerate()
    {
        for i in 0..PIECE {
            acc[p * PIECE + i] += x[i] * y[i];
        }
    }
    for i in pieces..ra.len() {
        acc[i] += ra[i] * rb[i];
    }
    fold_lanes(&acc)
}

/// `sum((x - c)^2)`.
#[inline(always)]
fn generic_sum_sq_dev<T: Float>(x: &[T], c: T) -> T {
    let acc = lane_fold(
        x,
        c,
        T::ZERO,
        #[inline(always)]
        |a, v| {
            let d = v - c;
            a + d * d
        },
    );
    fold_lanes(&acc)
}

/// `out = exp(x - m)`; returns `sum(out)`.
#[inline(always)]
fn generic_exp_sub_store_sum<T: Float>(x: &[T], m: T, out: &mut [T]) -> T {
    let n = x.len().min(out.len());
    out[..n].copy_from_slice(&x[..n]);
    generic_exp_sub_inplace_sum(&mut out[..n], m)
}

/// `x = exp(x - m)` in place; returns `sum(x)`.
#[inline(always)]
fn generic_exp_sub_inplace_sum<T: Float>(x: &mut [T], m: T) -> T {
    let mut acc = [T::ZERO; LANES];
    chunks_mut(
        x,
        T::NEG_INFINITY,
        #[inline(always)]
        |ch| {
            for i in 0..LANES {
                let e = (ch[i] - m).exp();
                ch[i] = e;
                acc[i] += e;
            }
        },
    );
    fold_lanes(&acc)
}

/// Largest element (`-inf` for an empty row).
#[inline(always)]
pub(crate) fn row_max<T: Float>(x: &[T]) -> T {
    T::row_max(x)
}

#[inline(always)]
pub(crate) fn row_sum<T: Float>(x: &[T]) -> T {
    T::row_sum(x)
}

#[inline(always)]
pub(crate) fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    T::dot(a, b)
}

/// `sum((x - c)^2)`.
#[inline(always)]
pub(crate) fn sum_sq_dev<T: Float>(x: &[T], c: T) -> T {
    T::sum_sq_dev(x, c)
}

/// `x = exp(x - m)` in place; returns `sum(x)`.
#[inline(always)]
pub(crate) fn exp_sub_inplace_sum<T: Float>(x: &mut [T], m: T) -> T {
    T::exp_sub_inplace_sum(x, m)
}

/// `out = exp(x - m)`; returns `sum(out)`.
#[inline(always)]
pub(crate) fn exp_sub_store_sum<T: Float>(x: &[T], m: T, out: &mut [T]) -> T {
    T::exp_sub_store_sum(x, m, out)
}

/// The sum of squares of `x`, each square and the sum in f64 (eight independent lanes, so that
/// it vectorises): a gradient's contribution to the clipping norm, taken while it is in cache.
#[inline(always)]
pub(crate) fn sum_sq_f64<T: Float>(x: &[T]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for ch in &mut chunks {
        for i in 0..8 {
            let v = ch[i].to_f64();
            acc[i] += v * v;
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|v| v.to_f64() * v.to_f64())
        .sum();
    acc.iter().sum::<f64>() + tail
}

/// `x *= y` elementwise (SIMD-dispatched itself: called from plain code).
pub(crate) fn mul_inplace<T: Float>(x: &mut [T], y: &[T]) {
    simd(
        #[inline(always)]
        || {
            for (a, &b) in x.iter_mut().zip(y) {
                *a *= b;
            }
        },
    )
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

/// f32 row primitives in AVX-512 intrinsics, where the auto-vectorised ones fall short.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

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

/// Whether [`simd`] runs AVX-512 on this CPU (the hand-written AVX-512 kernels' test too).
pub(crate) fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level() == Level::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether this CPU runs AVX2 with FMA (every CPU [`simd`] runs AVX-512 on has them too),
/// for the hand-written AVX2 kernels; false under `TRANSFORMER_KERNELS_NO_SIMD` like the rest.
pub(crate) fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level() != Level::Base
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
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

    /// The dot product as it was: the last partial chunk of both operands copied into
    /// buffers padded with zeros, every chunk summed lane by lane.
    fn padded_dot<T: Float>(a: &[T], b: &[T]) -> T {
        let n = a.len().min(b.len());
        let mut acc = [T::ZERO; LANES];
        let mut add = |x: &[T; LANES], y: &[T; LANES]| {
            for i in 0..LANES {
                acc[i] += x[i] * y[i];
            }
        };
        let (mut ix, mut iy) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
        for (x, y) in (&mut ix).zip(&mut iy) {
            add(x.try_into().unwrap(), y.try_into().unwrap());
        }
        if !ix.remainder().is_empty() {
            add(
                &padded(ix.remainder(), T::ZERO),
                &padded(iy.remainder(), T::ZERO),
            );
        }
        fold_lanes(&acc)
    }

    /// The dot product without padded copies gives the padded version's bits, for every
    /// remainder length, with signed zeros, infinities and NaN among the values.
    #[test]
    fn dot_without_padding_sums_as_the_padded_one() {
        for n in 0..=130usize {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos() - 0.5).collect();
            assert_eq!(
                generic_dot(&x, &y).to_bits(),
                padded_dot(&x, &y).to_bits(),
                "f32 n={n}"
            );
            let xd: Vec<f64> = x.iter().map(|&v| v as f64 * 1.1).collect();
            let yd: Vec<f64> = y.iter().map(|&v| v as f64).collect();
            assert_eq!(
                generic_dot(&xd, &yd).to_bits(),
                padded_dot(&xd, &yd).to_bits(),
                "f64 n={n}"
            );
            // Unequal lengths: the shorter one's.
            assert_eq!(
                generic_dot(&x, &y[..n / 2]).to_bits(),
                padded_dot(&x, &y[..n / 2]).to_bits()
            );
        }
        let neg_zero = [-0.0f32; 5];
        assert_eq!(
            generic_dot(&neg_zero, &[1.0; 5]).to_bits(),
            padded_dot(&neg_zero, &[1.0; 5]).to_bits()
        );
        let special = [
            f32::INFINITY,
            -0.0,
            2.0,
            f32::NAN,
            1.0,
            -3.0,
            0.5,
            7.0,
            -1.0,
        ];
        for n in 0..=special.len() {
            let (a, b) = (&special[..n], &special[..n]);
            assert_eq!(
                generic_dot(a, b).to_bits(),
                padded_dot(a, b).to_bits(),
                "n={n}"
            );
        }
    }

    #[test]
    fn avx512_primitives_match_portable() {
        for n in [0usize, 1, 3, 15, 16, 17, 31, 32, 35, 64, 200, 701] {
            let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            let y: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let close = |a: f32, b: f32| (a - b).abs() <= 1e-5 * (1.0 + b.abs());
            assert_eq!(f32::row_max(&x), generic_row_max(&x), "n={n}");
            assert!(close(f32::row_sum(&x), generic_row_sum(&x)), "n={n}");
            assert!(close(f32::dot(&x, &y), generic_dot(&x, &y)), "n={n}");
            assert!(
                close(f32::sum_sq_dev(&x, 0.3), generic_sum_sq_dev(&x, 0.3)),
                "n={n}"
            );
            let (mut a, mut b) = (x.clone(), vec![0f32; n]);
            let s1 = f32::exp_sub_inplace_sum(&mut a, 1.0);
            let s2 = f32::exp_sub_store_sum(&x, 1.0, &mut b);
            let want: Vec<f32> = x.iter().map(|v| ((v - 1.0) as f64).exp() as f32).collect();
            let s: f32 = want.iter().sum();
            assert!(close(s1, s) && close(s2, s), "n={n}: {s1} {s2} {s}");
            for i in 0..n {
                assert!(close(a[i], want[i]) && a[i] == b[i], "n={n} i={i}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        if level() == Level::Avx512 {
            use std::arch::x86_64::*;
            let xs = [
                -110.0f32, -104.0, -87.5, -20.0, -1.0, 0.0, 0.5, 10.0, 88.5, 89.0, 100.0,
            ];
            for x in xs {
                let got = unsafe {
                    _mm512_reduce_add_ps(_mm512_maskz_mov_ps(1, avx512::exp(_mm512_set1_ps(x))))
                };
                let want = (x as f64).exp();
                if want > f32::MIN_POSITIVE as f64 && want < f32::MAX as f64 {
                    assert!(
                        ((got as f64 - want) / want).abs() < 3e-7,
                        "exp({x}) = {got}"
                    );
                } else if want < 1e-46 || want > f32::MAX as f64 {
                    assert!(got == 0.0 || got.is_infinite(), "exp({x}) = {got}");
                }
            }
            let nan = unsafe {
                _mm512_reduce_add_ps(_mm512_maskz_mov_ps(
                    1,
                    avx512::exp(_mm512_set1_ps(f32::NAN)),
                ))
            };
            assert!(nan.is_nan());
        }
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
