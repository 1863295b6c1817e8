//! What the kernel tests share: deterministic inputs, error measures, a kernel's gradients
//! through candle's backprop, and central finite differences.
#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor, Var};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Deterministic values in roughly [-scale, scale] (an LCG; no global RNG state).
pub fn values(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

pub fn tensor(shape: &[usize], seed: u64, scale: f64, dtype: DType) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, scale), shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

pub fn to_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Max abs difference relative to the largest magnitude of `want`.
pub fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims(), "shapes differ");
    let (g, w) = (to_f64(got), to_f64(want));
    let scale = w.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-300);
    g.iter()
        .zip(&w)
        .map(|(a, b)| {
            if a.is_nan() && b.is_nan() {
                0.0
            } else {
                (a - b).abs()
            }
        })
        .fold(0f64, f64::max)
        / scale
}

pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let e = rel_err(got, want);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        _ => 1e-5,
    }
}

/// A `Var` (a tensor that tracks gradients) of each input.
pub fn vars_of<'a>(inputs: impl IntoIterator<Item = &'a Tensor>) -> Vec<Var> {
    inputs
        .into_iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect()
}

/// Output and gradients of `f(inputs)` contracted with `cot` (`sum(out * cot)`), via candle's
/// backprop.
pub fn run_with_grads(
    inputs: &[Tensor],
    cot: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> (Tensor, Vec<Tensor>) {
    let vars = vars_of(inputs);
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let out = f(&ts).unwrap();
    let loss = out.broadcast_mul(cot).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let gs = ts
        .iter()
        .map(|t| grads.get(t).expect("no gradient").clone())
        .collect();
    (out, gs)
}

/// Fused against reference: forward and the gradient of every input.
pub fn compare(
    name: &str,
    inputs: &[Tensor],
    cot: &Tensor,
    fused: impl Fn(&[Tensor]) -> Result<Tensor>,
    reference: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let dtype = inputs[0].dtype();
    let (out_f, grads_f) = run_with_grads(inputs, cot, fused);
    let (out_r, grads_r) = run_with_grads(inputs, cot, reference);
    assert_eq!(out_f.dtype(), dtype);
    assert_close(&format!("{name} forward"), &out_f, &out_r, tol(dtype));
    for (i, (gf, gr)) in grads_f.iter().zip(&grads_r).enumerate() {
        assert_close(&format!("{name} grad of input {i}"), gf, gr, tol(dtype));
    }
}

/// A one-input kernel against its reference with [`compare`].
pub fn compare_unary(
    name: &str,
    x: Tensor,
    cot: &Tensor,
    fused: fn(&Tensor) -> Result<Tensor>,
    reference: fn(&Tensor) -> Result<Tensor>,
) {
    compare(name, &[x], cot, |t| fused(&t[0]), |t| reference(&t[0]));
}

/// A three-input kernel against its reference with [`compare`].
pub fn compare_ternary(
    name: &str,
    inputs: [Tensor; 3],
    cot: &Tensor,
    fused: fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    reference: fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
) {
    let (f, r) = (
        |t: &[Tensor]| fused(&t[0], &t[1], &t[2]),
        |t: &[Tensor]| reference(&t[0], &t[1], &t[2]),
    );
    compare(name, &inputs, cot, f, r);
}

/// Central differences (eps 1e-6, f64) of `f(inputs) . cot` against the backprop gradients.
pub fn finite_difference_check(
    name: &str,
    inputs: &[Tensor],
    cot: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let eps = 1e-6;
    let (_, grads) = run_with_grads(inputs, cot, &f);
    let objective = |ts: &[Tensor]| -> f64 {
        f(ts)
            .unwrap()
            .broadcast_mul(cot)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    for (i, input) in inputs.iter().enumerate() {
        let base = to_f64(input);
        let mut numeric = Vec::with_capacity(base.len());
        for j in 0..base.len() {
            let probe = |delta: f64| {
                let mut v = base.clone();
                v[j] += delta;
                let mut ts = inputs.to_vec();
                ts[i] = Tensor::from_vec(v, input.shape(), &Device::Cpu).unwrap();
                objective(&ts)
            };
            numeric.push((probe(eps) - probe(-eps)) / (2.0 * eps));
        }
        let numeric = Tensor::from_vec(numeric, input.shape(), &Device::Cpu).unwrap();
        let e = rel_err(&grads[i], &numeric);
        assert!(
            e < 1e-6,
            "{name}: input {i}: analytic vs finite differences {e:e}"
        );
    }
}
