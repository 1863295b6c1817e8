//! The largest output of a linear layer `x W^T + b` for a few rows of `x`, exactly as
//! [`crate::linear_few_rows`] computes each output, without computing every output exactly:
//! greedy decoding's output layer, which needs only the most likely token.
//!
//! # Why
//! One token per step against the whole vocabulary is a matrix-vector product over all of
//! `W` (8 MB of f32 for the default translation model's 8,000 x 256): a third of a greedy
//! step, bound by how fast `W` streams in. Its int8 copy is a quarter of the bytes.
//!
//! # How
//! A screen, then an exact pass over the few outputs the screen cannot rule out:
//! 1. every output in int8 ([`QuantizedLinear`], the CPU's fastest kernel): `a_r`;
//! 2. a bound `B` on how far any `a_r` can be from the f32 output `y_r` that
//!    [`crate::linear_few_rows`] would give (below), so `y_r` lies in `[a_r - B, a_r + B]`;
//! 3. the outputs with `a_r >= max_s a_s - 2B` computed in f32 exactly as
//!    [`crate::linear_few_rows`] computes them (the same function), the first largest kept.
//!
//! Every other output `r` has `y_r <= a_r + B < max_s a_s - B <= y_m` for the output `m` of
//! the largest `a`, which is recomputed: it can be neither the largest nor an equal first one.
//! The answer is the plain one's, the first of equals included (tested against it).
//!
//! # The bound
//! With `x = x^ + e` (the activations' quantization, `|e_j| <= s_x / 2` plus the rounding of
//! `x_j / s_x`, `s_x = max_j |x_j| / 127`) and `w_r = w^_r + d_r` (the weights'),
//! `x.w_r - x^.w^_r = x.d_r + e.w^_r`, so by Cauchy-Schwarz
//! `|x.w_r - x^.w^_r| <= |x| |d_r| + |e| |w^_r|`. The int8 kernel's `a_r` is `x^.w^_r + b_r`
//! up to four f32 roundings (`4u (|x^| |w^_r| + |b_r|)`, `u = 2^-24`; its i32 sum is exact),
//! and any f32 sum of `k` products plus the bias is within
//! `gamma (|x| |w_r| + |b_r|)`, `gamma = (k + 2) u / (1 - (k + 2) u)`, of the real value.
//! `B` is the sum of these, with each row's norms replaced by their largest over the rows,
//! in f64 and widened by a part in 10^6; a row with anything not finite falls back to the
//! plain computation.

use super::float::simd;
use super::int8::{quantize_weight_rows, Int8Kernel, QuantizedLinear};
use super::with_f32;
use candle_core::{bail, DType, Result, Tensor};

/// `W` and `b` in int8 with the norms the screen's bound needs (why it finds the plain
/// answer: the docs at the top of `crates/kernels/src/argmax.rs`).
#[derive(Debug, Clone)]
pub struct ArgmaxScreen {
    q: QuantizedLinear,
    /// The largest over the rows of `|w_r - w^_r|`, `|w^_r|`, `|w_r|` and `|b_r|`.
    max_err: f64,
    max_norm_q: f64,
    max_norm: f64,
    max_bias: f64,
}

/// What [`ArgmaxScreen::argmax`] found for one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screened {
    /// The index of the largest output (the first of equals).
    pub index: usize,
    /// Outputs computed in f32 to find it (all of them when the row fell back).
    pub exact: usize,
}

/// The unit roundoff of f32.
const U: f64 = f32::EPSILON as f64 / 2.0;

impl ArgmaxScreen {
    /// The screen of the layer `w` (`out x k`, row-major) with `bias` (`out`), for `kernel`.
    pub fn new(w: &[f32], bias: &[f32], out: usize, k: usize, kernel: Int8Kernel) -> Self {
        assert_eq!(w.len(), out * k, "argmax screen: weight size");
        assert_eq!(bias.len(), out, "argmax screen: bias size");
        let (q, scales) = quantize_weight_rows(w, k);
        let (mut max_err, mut max_norm_q, mut max_norm) = (0f64, 0f64, 0f64);
        for ((row, qr), &s) in w.chunks_exact(k).zip(q.chunks_exact(k)).zip(&scales) {
            let (mut err, mut norm_q, mut norm) = (0f64, 0f64, 0f64);
            for (&v, &t) in row.iter().zip(qr) {
                // `s * t` is exact in f64 (a 24-bit by 8-bit product).
                let deq = s as f64 * t as f64;
                err += (v as f64 - deq).powi(2);
                norm_q += deq * deq;
                norm += (v as f64).powi(2);
            }
            max_err = max_err.max(err.sqrt());
            max_norm_q = max_norm_q.max(norm_q.sqrt());
            max_norm = max_norm.max(norm.sqrt());
        }
        let max_bias = bias.iter().fold(0f64, |m, &b| m.max((b as f64).abs()));
        Self {
            q: QuantizedLinear::new(w, bias, out, k, kernel),
            max_err,
            max_norm_q,
            max_norm,
            max_bias,
        }
    }

    /// The screen of the layer with weight `w` (out, k) and bias `b` (out,), with the fastest
    /// int8 kernel: `None` where it would not pay (not CPU f32, or no SIMD int8 kernel).
    pub fn of_layer(w: &Tensor, b: &Tensor) -> Result<Option<Self>> {
        let (out, k) = super::linear_dims("ArgmaxScreen", w, b)?;
        let kernel = Int8Kernel::detect();
        if kernel == Int8Kernel::Scalar || !super::all_f32_cpu(&[w, b]) {
            return Ok(None);
        }
        let (w, b) = (w.contiguous()?, b.contiguous()?);
        with_f32(&[&w, &b], |s| Some(Self::new(s[0], s[1], out, k, kernel)))
    }

    /// [`Self::argmax`] of the rows of `x` (N, k), given the layer's `w` (out, k) and `b`
    /// (out,) as tensors (CPU f32).
    pub fn argmax_rows(&self, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Vec<Screened>> {
        let (_, xk) = x.dims2()?;
        let (k, out) = (self.q.in_features(), self.q.out_features());
        if xk != k || w.dims() != [out, k] || b.dims() != [out] {
            bail!(
                "ArgmaxScreen of a {out} x {k} layer: x {:?}, w {:?}, b {:?}",
                x.dims(),
                w.dims(),
                b.dims()
            );
        }
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let (w, b) = (w.contiguous()?, b.contiguous()?);
        with_f32(&[&x, &w, &b], |s| self.argmax(s[0], s[1], s[2]))
    }

    /// For each row of `x` (`n x k`): the index of the largest output of `x W^T + b` as
    /// [`crate::linear_few_rows`] computes it in f32 (the first of equals), given the same `w`
    /// and `b` the screen was made from.
    pub fn argmax(&self, x: &[f32], w: &[f32], b: &[f32]) -> Vec<Screened> {
        let (k, out) = (self.q.in_features(), self.q.out_features());
        assert_eq!(x.len() % k.max(1), 0, "argmax screen: input size");
        assert!(
            w.len() == out * k && b.len() == out,
            "argmax screen: W or b of another size"
        );
        let n = x.len() / k.max(1);
        let mut approx = vec![0f32; n * out];
        self.q.forward_parallel(&mut approx, x);
        x.chunks_exact(k)
            .zip(approx.chunks_exact(out))
            .map(|(xr, ar)| self.row(xr, ar, w, b))
            .collect()
    }

    /// One row: `ar` is its int8 screen.
    fn row(&self, x: &[f32], ar: &[f32], w: &[f32], b: &[f32]) -> Screened {
        let (k, out) = (self.q.in_features(), self.q.out_features());
        let plain = || {
            let all: Vec<f32> = (0..out).map(|r| exact_output(x, w, b, r, k)).collect();
            Screened {
                index: first_largest(&all),
                exact: out,
            }
        };
        let (norm, max_abs) = x.iter().fold((0f64, 0f32), |(s, m), &v| {
            (s + (v as f64).powi(2), m.max(v.abs()))
        });
        let norm = norm.sqrt();
        // |e_j| <= s_x (1/2 + 255 u): `x_j / s_x` is computed as `x_j * (1 / s_x)`, two
        // roundings of a value up to 127; s_x <= max |x| / 127 (1 + u), the (1 + u) in the
        // widening below. 2^-12 is far above 255 u.
        let err_x = (k as f64).sqrt() * (max_abs as f64 / 127.0) * (0.5 + 1.0 / 4096.0);
        let gamma = (k + 2) as f64 * U / (1.0 - (k + 2) as f64 * U);
        let bound = (norm * self.max_err
            + err_x * self.max_norm_q
            + 4.0 * U * ((norm + err_x) * self.max_norm_q + self.max_bias)
            + gamma * (norm * self.max_norm + self.max_bias))
            * (1.0 + 1e-6);
        if !(bound.is_finite() && ar.iter().all(|v| v.is_finite())) {
            return plain();
        }
        let top = ar.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let floor = top as f64 - 2.0 * bound;
        let candidates: Vec<usize> = (0..out).filter(|&r| ar[r] as f64 >= floor).collect();
        let values: Vec<f32> = candidates
            .iter()
            .map(|&r| exact_output(x, w, b, r, k))
            .collect();
        Screened {
            index: candidates[first_largest(&values)],
            exact: candidates.len(),
        }
    }
}

/// Output `r` of `x W^T + b` in f32, the very value [`crate::linear_few_rows`] gives.
fn exact_output(x: &[f32], w: &[f32], b: &[f32], r: usize, k: usize) -> f32 {
    simd(
        #[inline(always)]
        || super::few_rows::output(x, &w[r * k..(r + 1) * k], b[r]),
    )
}

/// The index of the largest value, the first of equals: the first value is kept, then each
/// one greater than the kept one (so a NaN is never chosen after the first; 0 when empty).
/// Greedy search's choice among logits.
pub fn first_largest(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate().skip(1) {
        if v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::tests::{data, kernels};
    use candle_core::{Device, Tensor};

    /// The plain answer: every output by `linear_few_rows`, then the first largest.
    fn plain(x: &[f32], w: &[f32], b: &[f32], out: usize, k: usize) -> Vec<usize> {
        let n = x.len() / k;
        let t = |v: &[f32], s: (usize, usize)| Tensor::from_slice(v, s, &Device::Cpu).unwrap();
        let y = crate::linear_few_rows(
            &t(x, (n, k)),
            &t(w, (out, k)),
            &t(b, (1, out)).squeeze(0).unwrap(),
        )
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
        y.iter().map(|row| first_largest(row)).collect()
    }

    /// The screened answer is the plain one: on random layers, on a layer whose outputs are
    /// nearly tied (rows that differ in one weight by one f32 step), and on exact ties (equal
    /// rows and biases: the first is the answer), with every int8 kernel.
    #[test]
    fn the_screen_finds_the_plain_answer() {
        let (out, k) = (3000, 256);
        let b = data(out, 2);
        let mut w = data(out * k, 1);
        // Rows 100 and 2900 equal to row 1500 (and their biases), row 2000 one step above it
        // in one weight: every row of x along row 1500 makes them the largest, nearly tied.
        let row: Vec<f32> = w[1500 * k..1501 * k].iter().map(|v| v * 4.0).collect();
        let mut b = b;
        for r in [100, 1500, 2000, 2900] {
            w[r * k..(r + 1) * k].copy_from_slice(&row);
            b[r] = b[1500];
        }
        w[2000 * k + 7] = f32::from_bits(w[2000 * k + 7].to_bits() + 1);
        let mut x = data(8 * k, 3);
        for (i, xr) in x.chunks_exact_mut(k).enumerate().skip(4) {
            for (v, &r) in xr.iter_mut().zip(&row) {
                *v = 0.1 * *v + r * i as f32;
            }
        }
        let want = plain(&x, &w, &b, out, k);
        assert!(want[4..]
            .iter()
            .all(|&i| [100, 1500, 2000, 2900].contains(&i)));
        for kernel in kernels() {
            let screen = ArgmaxScreen::new(&w, &b, out, k, kernel);
            for (n, xs) in [(1, &x[..k]), (8, &x[..])] {
                let got = screen.argmax(xs, &w, &b);
                let idx: Vec<usize> = got.iter().map(|s| s.index).collect();
                assert_eq!(idx, want[..n], "{kernel:?}, {n} rows");
            }
        }
    }

    /// Many outputs within the quantization's error of each other (rows along one direction,
    /// apart by a little noise): the int8 order is not the f32 order, and the answer must
    /// still be the plain one.
    #[test]
    fn the_screen_keeps_what_int8_cannot_tell_apart() {
        let (out, k) = (500, 256);
        let base = data(k, 7);
        let noise = data(out * k, 8);
        let w: Vec<f32> = (0..out * k)
            .map(|i| 4.0 * base[i % k] + 0.01 * noise[i])
            .collect();
        let b = vec![0f32; out];
        let jitter = data(16 * k, 9);
        let x: Vec<f32> = (0..16 * k)
            .map(|i| base[i % k] + 0.01 * jitter[i])
            .collect();
        let want = plain(&x, &w, &b, out, k);
        for kernel in kernels() {
            let screen = ArgmaxScreen::new(&w, &b, out, k, kernel);
            let got: Vec<usize> = screen.argmax(&x, &w, &b).iter().map(|s| s.index).collect();
            assert_eq!(got, want, "{kernel:?}");
        }
    }

    /// The screen rules out most outputs when one stands out (else it would save nothing),
    /// and a row with a NaN falls back to the plain computation of every output.
    #[test]
    fn the_screen_rules_out_most_outputs_and_falls_back_on_nan() {
        let (out, k) = (2000, 128);
        let (w, b) = (data(out * k, 5), data(out, 6));
        let screen = ArgmaxScreen::new(&w, &b, out, k, Int8Kernel::detect());
        // x along row 1234: its output stands out by about |w_1234|^2 * 3 = 128.
        let x: Vec<f32> = w[1234 * k..1235 * k].iter().map(|v| 3.0 * v).collect();
        let got = screen.argmax(&x, &w, &b)[0];
        assert_eq!(got.index, 1234);
        assert!(
            got.exact < out / 10,
            "{} of {out} computed exactly",
            got.exact
        );
        let mut bad = x.clone();
        bad[3] = f32::NAN;
        let got = screen.argmax(&bad, &w, &b)[0];
        assert_eq!(
            (got.index, got.exact),
            (plain(&bad, &w, &b, out, k)[0], out)
        );
    }
}
