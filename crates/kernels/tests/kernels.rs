//! The fused kernels of `transformer_kernels` against their composed references
//! (forward and every gradient through candle's backprop) and against central finite
//! differences.

use candle_core::{DType, Device, Result, Tensor, Var};
use transformer_kernels::{
    attention, attention_reference, bf16, dropout, dropout_reference, label_smoothing_term,
    label_smoothing_term_reference, layer_norm, layer_norm_reference, linear, linear_cross_entropy,
    linear_cross_entropy_reference, linear_cross_entropy_with, linear_few_rows,
    linear_few_rows_reference, linear_reference, linear_wt, log_softmax_rows_f32, sigmoid,
    sigmoid_reference, softmax_last_dim, softmax_last_dim_reference, tanh, Precision,
};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Deterministic values in roughly [-scale, scale] (an LCG; no global RNG state).
fn values(n: usize, seed: u64, scale: f64) -> Vec<f64> {
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

fn tensor(shape: &[usize], seed: u64, scale: f64, dtype: DType) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(values(n, seed, scale), shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn to_f64(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// Max abs difference relative to the largest magnitude of `want`.
fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
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

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    let e = rel_err(got, want);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        _ => 1e-5,
    }
}

/// Output and gradients of `f(inputs)` contracted with `cot` (`sum(out * cot)`), via candle's
/// backprop.
fn run_with_grads(
    inputs: &[Tensor],
    cot: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
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
fn compare(
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

/// Central differences (eps 1e-6, f64) of `f(inputs) . cot` against the backprop gradients.
fn finite_difference_check(
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

// ---------------------------------------------------------------------------------------------
// tanh and sigmoid
// ---------------------------------------------------------------------------------------------

#[test]
fn tanh_and_sigmoid_match_candle_and_their_references() {
    // Across the polynomial / exponential switch at 0.625, tiny and huge inputs, both signs,
    // and more elements than one thread takes (the parallel split).
    for (n, scale) in [(37, 0.7), (5000, 3.0), (70_001, 30.0)] {
        for dtype in [DType::F32, DType::F64] {
            let x = tensor(&[n], n as u64, scale, dtype);
            let cot = tensor(&[n], 7, 1.0, dtype);
            compare("tanh", &[x.clone()], &cot, |t| tanh(&t[0]), |t| t[0].tanh());
            compare(
                "sigmoid",
                &[x],
                &cot,
                |t| sigmoid(&t[0]),
                |t| sigmoid_reference(&t[0]),
            );
        }
    }
    // Per element, not only relative to the largest value: small arguments keep their
    // relative precision, extremes saturate without NaN.
    let xs = [
        0.0f32, 1e-6, -3e-4, 0.3, -0.625, 0.626, 5.0, -9.0, 40.0, -100.0, 1e30,
    ];
    let x = Tensor::new(&xs[..], &Device::Cpu).unwrap();
    let t = tanh(&x).unwrap().to_vec1::<f32>().unwrap();
    let s = sigmoid(&x).unwrap().to_vec1::<f32>().unwrap();
    for (i, &v) in xs.iter().enumerate() {
        let (want_t, want_s) = ((v as f64).tanh(), 1.0 / (1.0 + (-(v as f64)).exp()));
        assert!(
            (t[i] as f64 - want_t).abs() <= 4.0 * f32::EPSILON as f64 * want_t.abs().max(1e-30),
            "tanh({v}) = {} against {want_t}",
            t[i]
        );
        assert!(
            (s[i] as f64 - want_s).abs() <= 4.0 * f32::EPSILON as f64 * want_s.max(1e-30)
                || want_s < 1e-37,
            "sigmoid({v}) = {} against {want_s}",
            s[i]
        );
    }
}

#[test]
fn tanh_and_sigmoid_finite_differences() {
    let x = tensor(&[3, 7], 11, 3.0, DType::F64);
    let cot = tensor(&[3, 7], 12, 1.0, DType::F64);
    finite_difference_check("tanh", &[x.clone()], &cot, |t| tanh(&t[0]));
    finite_difference_check("sigmoid", &[x], &cot, |t| sigmoid(&t[0]));
}

// ---------------------------------------------------------------------------------------------
// Softmax
// ---------------------------------------------------------------------------------------------

#[test]
fn softmax_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        // Widths around the 32-lane chunks, large values to exercise the max subtraction.
        for (k, shape) in [
            vec![3, 5, 7],
            vec![2, 37],
            vec![4, 1],
            vec![5, 70],
            vec![2, 2, 35, 35],
            vec![3, 64],
        ]
        .into_iter()
        .enumerate()
        {
            let x = tensor(&shape, 10 + k as u64, 30.0, dtype);
            let cot = tensor(&shape, 100 + k as u64, 1.0, dtype);
            compare(
                &format!("softmax {shape:?} {dtype:?}"),
                &[x],
                &cot,
                |t| softmax_last_dim(&t[0]),
                |t| softmax_last_dim_reference(&t[0]),
            );
        }
    }
}

/// Large enough (over 2 x 2^17 elements) for the rows to be split over threads.
#[test]
fn softmax_matches_reference_multithreaded() {
    let shape = [600, 500];
    let x = tensor(&shape, 1, 5.0, DType::F64);
    let cot = tensor(&shape, 2, 1.0, DType::F64);
    compare(
        "softmax 600x500",
        &[x],
        &cot,
        |t| softmax_last_dim(&t[0]),
        |t| softmax_last_dim_reference(&t[0]),
    );
}

#[test]
fn softmax_non_contiguous_and_masked() {
    for dtype in [DType::F64, DType::F32] {
        // A transposed view, and -inf entries as an additive attention mask leaves them.
        let x = tensor(&[6, 4, 9], 3, 3.0, dtype);
        let mask: Vec<f64> = (0..4 * 9)
            .map(|i| {
                if i % 9 > i / 9 + 4 {
                    f64::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (4, 9), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let cot = tensor(&[4, 6, 9], 4, 1.0, dtype);
        let prep = |t: &Tensor| t.transpose(0, 1)?.broadcast_add(&mask.unsqueeze(1)?);
        compare(
            &format!("softmax masked {dtype:?}"),
            &[x],
            &cot,
            |t| softmax_last_dim(&prep(&t[0])?),
            |t| softmax_last_dim_reference(&prep(&t[0])?),
        );
        let y =
            to_f64(&softmax_last_dim(&prep(&tensor(&[6, 4, 9], 3, 3.0, dtype)).unwrap()).unwrap());
        let m = to_f64(&mask.unsqueeze(1).unwrap().broadcast_as((4, 6, 9)).unwrap());
        for (a, b) in y.iter().zip(&m) {
            if b.is_infinite() {
                assert_eq!(*a, 0.0, "masked weight must be exactly zero");
            }
        }
    }
}

#[test]
fn softmax_finite_differences() {
    let x = tensor(&[2, 3, 5], 5, 2.0, DType::F64);
    let cot = tensor(&[2, 3, 5], 6, 1.0, DType::F64);
    finite_difference_check("softmax", &[x], &cot, |t| softmax_last_dim(&t[0]));
}

#[test]
fn softmax_other_dtypes_fall_back_to_reference() {
    let x = tensor(&[3, 7], 7, 2.0, DType::BF16);
    let a = softmax_last_dim(&x).unwrap();
    let b = softmax_last_dim_reference(&x).unwrap();
    assert_eq!(a.dtype(), DType::BF16);
    assert_eq!(to_f64(&a), to_f64(&b));
}

// ---------------------------------------------------------------------------------------------
// Layer norm
// ---------------------------------------------------------------------------------------------

#[test]
fn layer_norm_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        for (k, shape) in [vec![7, 5], vec![3, 4, 37], vec![2, 1], vec![700, 200]]
            .into_iter()
            .enumerate()
        {
            let k = k as u64;
            let c = *shape.last().unwrap();
            // An offset mean, to test the two-pass variance.
            let x = (tensor(&shape, 20 + k, 2.0, dtype) + 3.0).unwrap();
            let w = tensor(&[c], 30 + k, 1.0, dtype);
            let b = tensor(&[c], 40 + k, 1.0, dtype);
            let cot = tensor(&shape, 50 + k, 1.0, dtype);
            compare(
                &format!("layer_norm {shape:?} {dtype:?}"),
                &[x, w, b],
                &cot,
                |t| layer_norm(&t[0], &t[1], &t[2], 1e-5),
                |t| layer_norm_reference(&t[0], &t[1], &t[2], 1e-5),
            );
        }
    }
}

/// Over 2 x 2^17 elements: rows split over threads, per-thread weight/bias gradients summed.
#[test]
fn layer_norm_matches_reference_multithreaded() {
    let shape = [2001, 200];
    let x = tensor(&shape, 21, 2.0, DType::F64);
    let w = tensor(&[200], 31, 1.0, DType::F64);
    let b = tensor(&[200], 41, 1.0, DType::F64);
    let cot = tensor(&shape, 51, 1.0, DType::F64);
    compare(
        "layer_norm 2001x200",
        &[x, w, b],
        &cot,
        |t| layer_norm(&t[0], &t[1], &t[2], 1e-5),
        |t| layer_norm_reference(&t[0], &t[1], &t[2], 1e-5),
    );
}

#[test]
fn layer_norm_finite_differences() {
    let x = tensor(&[3, 5], 22, 2.0, DType::F64);
    let w = tensor(&[5], 32, 1.0, DType::F64);
    let b = tensor(&[5], 42, 1.0, DType::F64);
    let cot = tensor(&[3, 5], 52, 1.0, DType::F64);
    finite_difference_check("layer_norm", &[x, w, b], &cot, |t| {
        layer_norm(&t[0], &t[1], &t[2], 1e-5)
    });
}

/// The fused linear layer against `x.matmul(w.t()) + b`: a 3-d input, sizes that are no
/// multiple of any SIMD width, and one large enough to split over the threads.
#[test]
fn linear_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        for (shape, m) in [(vec![2, 3, 5], 7), (vec![1, 1], 1), (vec![700, 200], 200)] {
            let k = *shape.last().unwrap();
            let x = tensor(&shape, 1, 1.0, dtype);
            let w = tensor(&[m, k], 2, 0.5, dtype);
            let b = tensor(&[m], 3, 0.5, dtype);
            let mut out = shape.clone();
            *out.last_mut().unwrap() = m;
            let cot = tensor(&out, 4, 1.0, dtype);
            compare(
                &format!("linear {shape:?} -> {m} {dtype:?}"),
                &[x, w, b],
                &cot,
                |t| linear(&t[0], &t[1], &t[2]),
                |t| linear_reference(&t[0], &t[1], &t[2]),
            );
        }
    }
}

#[test]
fn linear_finite_differences() {
    let x = tensor(&[3, 4], 5, 1.0, DType::F64);
    let w = tensor(&[5, 4], 6, 1.0, DType::F64);
    let b = tensor(&[5], 7, 1.0, DType::F64);
    let cot = tensor(&[3, 5], 8, 1.0, DType::F64);
    finite_difference_check("linear", &[x, w, b], &cot, |t| linear(&t[0], &t[1], &t[2]));
}

#[test]
fn linear_rejects_bad_shapes() {
    let x = tensor(&[3, 4], 5, 1.0, DType::F32);
    let w = tensor(&[5, 4], 6, 1.0, DType::F32);
    assert!(linear(&x, &w, &tensor(&[4], 7, 1.0, DType::F32)).is_err());
    assert!(linear(&x, &w.t().unwrap(), &tensor(&[5], 7, 1.0, DType::F32)).is_err());
}

#[test]
fn layer_norm_rejects_bad_shapes() {
    let x = tensor(&[3, 5], 1, 1.0, DType::F32);
    let w = tensor(&[4], 1, 1.0, DType::F32);
    assert!(layer_norm(&x, &w, &w, 1e-5).is_err());
}

// ---------------------------------------------------------------------------------------------
// Linear + cross-entropy
// ---------------------------------------------------------------------------------------------

fn targets(n: usize, v: usize, seed: u64, ignore: Option<(u32, usize)>) -> Tensor {
    let t: Vec<u32> = values(n, seed, 1.0)
        .into_iter()
        .enumerate()
        .map(|(i, x)| match ignore {
            // Every `every`-th row ignored.
            Some((id, every)) if i % every == 1 => id,
            _ => (((x + 1.0) / 2.0 * v as f64) as usize).min(v - 1) as u32,
        })
        .collect();
    Tensor::from_vec(t, n, &Device::Cpu).unwrap()
}

fn lce_inputs(n: usize, c: usize, v: usize, seed: u64, dtype: DType) -> Vec<Tensor> {
    vec![
        tensor(&[n, c], seed, 1.0, dtype),
        tensor(&[v, c], seed + 1, 0.5, dtype),
        tensor(&[v], seed + 2, 0.5, dtype),
    ]
}

/// The fused loss against its reference for an incoming gradient `g`: the loss and the
/// gradients of hidden states, weight and bias.
fn compare_lce(name: &str, inputs: &[Tensor], targets: &Tensor, ignore: Option<u32>, g: f64) {
    let cot = Tensor::new(g, &Device::Cpu)
        .unwrap()
        .to_dtype(inputs[0].dtype())
        .unwrap();
    compare(
        name,
        inputs,
        &cot,
        |x| linear_cross_entropy(&x[0], &x[1], &x[2], targets, ignore),
        |x| linear_cross_entropy_reference(&x[0], &x[1], &x[2], targets, ignore),
    );
}

#[test]
fn linear_cross_entropy_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        // (N, C, V, ignore): tiny; V over several blocks of 512 with a partial last block;
        // large enough (N C V >= 2^22) to split the vocabulary over threads, with 5, 8 and
        // with 25 blocks of 256; ignore_index inside and outside 0..V.
        for (k, (n, c, v, ignore)) in [
            (7, 5, 13, Some((3u32, 3usize))),
            (7, 5, 13, None),
            (9, 6, 1100, Some((u32::MAX, 4))),
            (37, 200, 1100, Some((0, 5))),
            (50, 64, 2000, None),
            (48, 16, 12 * 512 + 37, Some((1, 4))),
            (1, 3, 2, None),
        ]
        .into_iter()
        .enumerate()
        {
            let k = k as u64 * 10;
            let inputs = lce_inputs(n, c, v, 60 + k, dtype);
            let t = targets(n, v, 70 + k, ignore);
            compare_lce(
                &format!("linear_cross_entropy N={n} C={c} V={v} {ignore:?} {dtype:?}"),
                &inputs,
                &t,
                ignore.map(|(id, _)| id),
                1.75,
            );
        }
    }
}

/// The fused label-smoothing term against its composed reference (value and every gradient,
/// f64 and f32, with ignored rows, a pad id outside the vocabulary and no ignored rows) and
/// against finite differences; its gradients into `DirectGrads` equal those it returns to the
/// graph.
#[test]
fn label_smoothing_term_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        for (k, (n, c, v, ignore)) in [
            (7, 5, 13, (3u32, 3usize)),
            (37, 64, 300, (0, 5)),
            (20, 16, 50, (u32::MAX, 4)),
        ]
        .into_iter()
        .enumerate()
        {
            let k = k as u64 * 10;
            let inputs = lce_inputs(n, c, v, 160 + k, dtype);
            let t = targets(n, v, 170 + k, Some(ignore));
            let cot = Tensor::new(1.75f64, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            compare(
                &format!("label_smoothing_term N={n} C={c} V={v} {ignore:?} {dtype:?}"),
                &inputs,
                &cot,
                |x| label_smoothing_term(&x[0], &x[1], &x[2], &t, ignore.0, 0.1, None),
                |x| label_smoothing_term_reference(&x[0], &x[1], &x[2], &t, ignore.0, 0.1),
            );
        }
    }
    let inputs = lce_inputs(6, 4, 9, 190, DType::F64);
    let t = targets(6, 9, 191, Some((2, 3)));
    let one = Tensor::new(1f64, &Device::Cpu).unwrap();
    finite_difference_check("label_smoothing_term", &inputs, &one, |x| {
        label_smoothing_term(&x[0], &x[1], &x[2], &t, 2, 0.2, None)
    });
    // Into DirectGrads: the weight's and bias's gradients land there, the same values.
    let inputs = lce_inputs(11, 8, 30, 200, DType::F32);
    let t = targets(11, 30, 201, Some((0, 4)));
    let vars: Vec<Var> = inputs
        .iter()
        .map(|x| Var::from_tensor(x).unwrap())
        .collect();
    let direct = transformer_kernels::grads::DirectGrads::new();
    let f = |d: Option<&transformer_kernels::grads::DirectGrads>| {
        let [h, w, b] = [0, 1, 2].map(|i| vars[i].as_tensor());
        label_smoothing_term(h, w, b, &t, 0, 0.1, d)
            .unwrap()
            .backward()
            .unwrap()
    };
    let graph = f(None);
    let store = f(Some(&direct));
    for i in [1, 2] {
        let x = vars[i].as_tensor();
        assert!(
            store.get(x).is_none(),
            "input {i}: a direct gradient also in the store"
        );
        let got = direct.get(x).unwrap().expect("a direct gradient");
        assert_close(
            &format!("direct grad of input {i}"),
            &got,
            graph.get(x).unwrap(),
            0.0,
        );
    }
}

/// Logits that jump far above (or below) everything before them in a later vocabulary block:
/// the online log-sum-exp of pass 1 must rescale its running sum when a block's max rises by
/// 90 (`e^90` overflows f32) or 40, and lose nothing that matters when a block falls far below
/// (-300); pass 2 scales each block's stored exponentials by its own factor.
#[test]
fn linear_cross_entropy_extreme_logits_in_late_blocks() {
    let (n, c, v) = (9, 6, 3 * 512 + 5);
    for dtype in [DType::F64, DType::F32] {
        for (high, low) in [(90.0, -300.0), (40.0, -300.0), (0.0, -300.0)] {
            let mut bias = values(v, 301, 0.5);
            bias[1100] = high;
            bias[600] = low;
            let inputs = vec![
                tensor(&[n, c], 302, 1.0, dtype),
                tensor(&[v, c], 303, 0.5, dtype),
                Tensor::from_vec(bias, v, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap(),
            ];
            let mut t: Vec<u32> = (0..n as u32).map(|i| i * 97 % v as u32).collect();
            t[1] = 1100;
            t[2] = 600;
            let t = Tensor::from_vec(t, n, &Device::Cpu).unwrap();
            let name = format!("extreme logits {high} / {low} {dtype:?}");
            compare_lce(&name, &inputs, &t, None, 1.0);
        }
    }
}

/// Hidden states as (B, T, C) with targets (B, T), and a plain `loss.backward()` (incoming
/// gradient exactly 1, the path that hands the stored gradients out unscaled).
#[test]
fn linear_cross_entropy_batched_shapes_and_unit_gradient() {
    let dtype = DType::F32;
    let (b, t, c, v) = (4, 5, 8, 600);
    let h = Var::from_tensor(&tensor(&[b, t, c], 80, 1.0, dtype)).unwrap();
    let w = Var::from_tensor(&tensor(&[v, c], 81, 0.5, dtype)).unwrap();
    let bias = Var::from_tensor(&tensor(&[v], 82, 0.5, dtype)).unwrap();
    let tg = targets(b * t, v, 83, Some((7, 3))).reshape((b, t)).unwrap();
    let grads_of = |loss: Tensor| {
        let g = loss.backward().unwrap();
        [&h, &w, &bias].map(|x| g.get(x.as_tensor()).unwrap().clone())
    };
    let fused = linear_cross_entropy(&h, &w, &bias, &tg, Some(7)).unwrap();
    let reference = linear_cross_entropy_reference(&h, &w, &bias, &tg, Some(7)).unwrap();
    assert_eq!(fused.dims(), &[] as &[usize]);
    assert_close("loss", &fused, &reference, 1e-5);
    let (gf, gr) = (grads_of(fused), grads_of(reference));
    assert_eq!(gf[0].dims(), &[b, t, c]);
    for i in 0..3 {
        assert_close(&format!("grad {i}"), &gf[i], &gr[i], 1e-5);
    }
}

/// A second backward on the same graph finds the state kept by the forward pass consumed and
/// reruns pass 1 from the inputs.
#[test]
fn linear_cross_entropy_backward_twice() {
    let inputs = lce_inputs(11, 7, 30, 90, DType::F64);
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let tg = targets(11, 30, 91, Some((2, 4)));
    let loss = linear_cross_entropy(&vars[0], &vars[1], &vars[2], &tg, Some(2)).unwrap();
    let g1 = loss.backward().unwrap();
    let g2 = (&loss * 3.0).unwrap().backward().unwrap();
    for v in &vars {
        let a = g1.get(v.as_tensor()).unwrap();
        let b = (g2.get(v.as_tensor()).unwrap() / 3.0).unwrap();
        assert_close("second backward", &b, a, 1e-13);
    }
}

#[test]
fn linear_cross_entropy_finite_differences() {
    let inputs = lce_inputs(4, 3, 6, 95, DType::F64);
    let tg = targets(4, 6, 96, Some((5, 3)));
    let cot = Tensor::new(1.0f64, &Device::Cpu).unwrap();
    finite_difference_check("linear_cross_entropy", &inputs, &cot, |x| {
        linear_cross_entropy(&x[0], &x[1], &x[2], &tg, Some(5))
    });
}

/// No input tracks gradients (evaluation): only the loss is computed, and it is the same.
#[test]
fn linear_cross_entropy_without_grad() {
    for (n, c, v) in [(7, 5, 13), (37, 200, 1100)] {
        let x = lce_inputs(n, c, v, 97, DType::F32);
        let tg = targets(n, v, 98, Some((1, 3)));
        let a = linear_cross_entropy(&x[0], &x[1], &x[2], &tg, Some(1)).unwrap();
        let b = linear_cross_entropy_reference(&x[0], &x[1], &x[2], &tg, Some(1)).unwrap();
        assert_close("eval loss", &a, &b, 1e-5);
    }
}

type LossFn = dyn Fn(&Tensor, &Tensor, &Tensor, &Tensor, Option<u32>) -> Result<Tensor>;

/// Two losses alive at once, each holding its own kept exponentials (the second cannot reuse
/// the pooled buffer the first holds), one backward through their sum; then a loss over `Var`s
/// that is dropped without a backward (evaluation with parameters), whose buffer goes back to
/// the pool for the next call.
#[test]
fn linear_cross_entropy_two_losses_in_one_graph() {
    for (n, c, v) in [(7, 5, 13), (37, 200, 1100)] {
        let a = lce_inputs(n, c, v, 300, DType::F64);
        let h2 = tensor(&[n, c], 303, 1.0, DType::F64);
        let vars: Vec<Var> = a
            .iter()
            .chain([&h2])
            .map(|t| Var::from_tensor(t).unwrap())
            .collect();
        let (t1, t2) = (targets(n, v, 304, Some((1, 3))), targets(n, v, 305, None));
        let grads = |f: &LossFn| {
            let [h, w, b, h2] = [0, 1, 2, 3].map(|i| vars[i].as_tensor());
            // Evaluation-style loss on the same Vars, dropped without backward.
            drop(f(h2, w, b, &t2, None).unwrap());
            let l1 = f(h, w, b, &t1, Some(1)).unwrap();
            let l2 = f(h2, w, b, &t2, None).unwrap();
            let total = (l1 + (l2 * 0.5).unwrap()).unwrap();
            let g = total.backward().unwrap();
            [h, w, b, h2].map(|x| g.get(x).unwrap().clone())
        };
        let fused = grads(&|h, w, b, t, i| linear_cross_entropy(h, w, b, t, i));
        let reference = grads(&|h, w, b, t, i| linear_cross_entropy_reference(h, w, b, t, i));
        for (i, (f, r)) in fused.iter().zip(&reference).enumerate() {
            assert_close(&format!("two losses N={n} V={v}: grad {i}"), f, r, 1e-12);
        }
    }
}

/// PyTorch: mean over zero rows is NaN, and the gradients are zero.
#[test]
fn linear_cross_entropy_all_ignored() {
    let inputs = lce_inputs(3, 4, 5, 99, DType::F64);
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let tg = Tensor::new(&[2u32, 2, 2], &Device::Cpu).unwrap();
    let loss = linear_cross_entropy(&vars[0], &vars[1], &vars[2], &tg, Some(2)).unwrap();
    assert!(loss.to_scalar::<f64>().unwrap().is_nan());
    let g = loss.backward().unwrap();
    for v in &vars {
        let s = to_f64(g.get(v.as_tensor()).unwrap());
        assert!(s.iter().all(|&x| x == 0.0), "{s:?}");
    }
}

#[test]
fn linear_cross_entropy_rejects_bad_targets() {
    let x = lce_inputs(3, 4, 5, 1, DType::F32);
    let bad = Tensor::new(&[0u32, 5, 1], &Device::Cpu).unwrap();
    assert!(linear_cross_entropy(&x[0], &x[1], &x[2], &bad, None).is_err());
    // 5 is fine when it is the ignore index.
    assert!(linear_cross_entropy(&x[0], &x[1], &x[2], &bad, Some(5)).is_ok());
    let short = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
    assert!(linear_cross_entropy(&x[0], &x[1], &x[2], &short, None).is_err());
}

// ---------------------------------------------------------------------------------------------
// Attention
// ---------------------------------------------------------------------------------------------

/// keep (B, 1, T, S): causal, plus key padding in batch 1 and one query of batch 0 that may
/// attend to nothing.
fn attention_keep(b: usize, t: usize, s: usize) -> Tensor {
    let mut keep = vec![0u8; b * t * s];
    for bi in 0..b {
        for i in 0..t {
            for j in 0..s {
                let causal = j <= i + s.saturating_sub(t);
                let padded = bi == 1 && j + 2 >= s;
                let dead_row = bi == 0 && i == t / 2;
                keep[(bi * t + i) * s + j] = u8::from(causal && !padded && !dead_row);
            }
        }
    }
    Tensor::from_vec(keep, (b, 1, t, s), &Device::Cpu).unwrap()
}

fn dropout_multiplier(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let v: Vec<f64> = values(shape.iter().product(), seed, 1.0)
        .into_iter()
        .map(|x| if x < -0.6 { 0.0 } else { 1.0 / 0.8 })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[test]
fn attention_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        // (B, H, T, S, D, Dv, masked, dropout); the last is the tutorial's shape (threads).
        for (k, (b, h, t, s, d, dv, masked, dropped)) in [
            (2, 3, 5, 7, 4, 6, true, true),
            (2, 1, 7, 7, 5, 5, false, false),
            (3, 2, 1, 9, 3, 2, true, false),
            (2, 2, 6, 6, 8, 8, false, true),
            (20, 2, 35, 35, 100, 100, true, true),
        ]
        .into_iter()
        .enumerate()
        {
            let k = k as u64 * 10;
            let inputs = vec![
                tensor(&[b, h, t, d], 200 + k, 1.0, dtype),
                tensor(&[b, h, s, d], 201 + k, 1.0, dtype),
                tensor(&[b, h, s, dv], 202 + k, 1.0, dtype),
            ];
            let cot = tensor(&[b, h, t, dv], 203 + k, 1.0, dtype);
            let keep = masked.then(|| attention_keep(b, t, s));
            let drop = dropped.then(|| dropout_multiplier(&[b, h, t, s], 204 + k, dtype));
            let scale = 1.0 / (d as f64).sqrt();
            compare(
                &format!("attention B={b} H={h} T={t} S={s} D={d} Dv={dv} {dtype:?}"),
                &inputs,
                &cot,
                |x| attention(&x[0], &x[1], &x[2], keep.as_ref(), drop.as_ref(), scale),
                |x| attention_reference(&x[0], &x[1], &x[2], keep.as_ref(), drop.as_ref(), scale),
            );
        }
    }
}

/// Q, K, V as views with the heads split out of (B, T, H, D) tensors, as multi-head attention
/// makes them: read in place through their strides.
#[test]
fn attention_strided_inputs() {
    let (b, h, t, d) = (3, 2, 6, 4);
    for dtype in [DType::F64, DType::F32] {
        let inputs: Vec<Tensor> = (0..3)
            .map(|i| tensor(&[b, t, h, d], 210 + i, 1.0, dtype))
            .collect();
        let cot = tensor(&[b, h, t, d], 214, 1.0, dtype);
        let keep = attention_keep(b, t, t);
        let heads = |x: &Tensor| x.transpose(1, 2);
        compare(
            &format!("attention strided {dtype:?}"),
            &inputs,
            &cot,
            |x| {
                attention(
                    &heads(&x[0])?,
                    &heads(&x[1])?,
                    &heads(&x[2])?,
                    Some(&keep),
                    None,
                    0.5,
                )
            },
            |x| {
                attention_reference(
                    &heads(&x[0])?,
                    &heads(&x[1])?,
                    &heads(&x[2])?,
                    Some(&keep),
                    None,
                    0.5,
                )
            },
        );
    }
}

#[test]
fn attention_fully_masked_rows_are_zero() {
    let (b, h, t, d) = (2, 1, 4, 3);
    let q = tensor(&[b, h, t, d], 220, 1.0, DType::F32);
    let keep = attention_keep(b, t, t);
    let out = attention(&q, &q, &q, Some(&keep), None, 1.0).unwrap();
    let row = to_f64(&out.get(0).unwrap().get(0).unwrap().get(t / 2).unwrap());
    assert!(row.iter().all(|&x| x == 0.0), "{row:?}");
    assert!(to_f64(&out).iter().all(|x| x.is_finite()));
}

#[test]
fn attention_finite_differences() {
    let (b, h, t, s, d) = (2, 2, 3, 4, 3);
    let inputs = vec![
        tensor(&[b, h, t, d], 230, 1.0, DType::F64),
        tensor(&[b, h, s, d], 231, 1.0, DType::F64),
        tensor(&[b, h, s, d], 232, 1.0, DType::F64),
    ];
    let cot = tensor(&[b, h, t, d], 233, 1.0, DType::F64);
    let keep = attention_keep(b, t, s);
    let drop = dropout_multiplier(&[b, h, t, s], 234, DType::F64);
    finite_difference_check("attention", &inputs, &cot, |x| {
        attention(&x[0], &x[1], &x[2], Some(&keep), Some(&drop), 0.7)
    });
}

/// The bf16 (AMX) products against the f32 kernel: loss and every gradient, at small shapes
/// with partial blocks and ignored rows, and at the tutorial language model's shape with its
/// initialisation scale (N 700, C 200, V 33,278). Relative errors in the max-norm, printed;
/// measured on Sapphire Rapids: loss 5e-6 to 1.8e-3 (the largest on a 2-class toy), gradients
/// of hidden and weight 1.8e-3 to 4.1e-3 (bf16 keeps 8 bits: 2^-9 = 2e-3), bias 3e-6 to
/// 1.3e-3. The bounds are about 3x above those. Runs on whichever bf16 unit the CPU has (AMX,
/// else AVX512-BF16); skipped (with a note) on CPUs with neither, where `Precision::Bf16` is
/// the f32 path itself.
#[test]
fn bf16_loss_is_close_to_f32() {
    if !bf16::available() {
        eprintln!(
            "no bf16 products on this CPU: Precision::Bf16 runs the f32 path; nothing to compare"
        );
        return;
    }
    let dtype = DType::F32;
    for (n, c, v, ignore, scale) in [
        (9, 6, 1100, Some((u32::MAX, 4)), 0.5),
        (37, 200, 1100, Some((0, 5)), 0.5),
        (50, 64, 2000, None, 0.5),
        (1, 3, 2, None, 0.5),
        (700, 200, 33_278, None, 0.1),
    ] {
        let inputs = vec![
            tensor(&[n, c], 100, 1.0, dtype),
            tensor(&[v, c], 101, scale, dtype),
            tensor(&[v], 102, scale, dtype),
        ];
        let t = targets(n, v, 103, ignore);
        let ig = ignore.map(|(id, _)| id);
        let cot = Tensor::new(1.0f32, &Device::Cpu).unwrap();
        let (out_f, grads_f) = run_with_grads(&inputs, &cot, |x| {
            linear_cross_entropy(&x[0], &x[1], &x[2], &t, ig)
        });
        let (out_b, grads_b) = run_with_grads(&inputs, &cot, |x| {
            linear_cross_entropy_with(&x[0], &x[1], &x[2], &t, ig, Precision::Bf16)
        });
        let name = format!("bf16 linear_cross_entropy N={n} C={c} V={v} {ignore:?}");
        let e = rel_err(&out_b, &out_f);
        eprintln!("{name}: loss {e:.1e}");
        assert!(e <= 5e-3, "{name}: loss relative error {e:e}");
        for (i, (gb, gf)) in grads_b.iter().zip(&grads_f).enumerate() {
            let e = rel_err(gb, gf);
            eprintln!("{name}: grad {i} {e:.1e}");
            assert!(
                e <= 1.5e-2,
                "{name}: grad of input {i}: relative error {e:e}"
            );
        }
    }
}

#[test]
fn linear_few_rows_matches_reference() {
    for dtype in [DType::F64, DType::F32] {
        // Rows 1 to the kernel's maximum and one past it (the reference path), a vocabulary
        // that is not a multiple of the kernel's chunk.
        for (k, (n, c, v)) in [
            (1, 5, 3),
            (1, 200, 1000),
            (3, 16, 300),
            (8, 7, 129),
            (9, 4, 50),
        ]
        .into_iter()
        .enumerate()
        {
            let k = k as u64 * 10;
            let inputs = vec![
                tensor(&[n, c], 200 + k, 1.0, dtype),
                tensor(&[v, c], 201 + k, 0.5, dtype),
                tensor(&[v], 202 + k, 0.5, dtype),
            ];
            let cot = tensor(&[n, v], 203 + k, 1.0, dtype);
            compare(
                &format!("linear_few_rows N={n} C={c} V={v} {dtype:?}"),
                &inputs,
                &cot,
                |x| linear_few_rows(&x[0], &x[1], &x[2]),
                |x| linear_few_rows_reference(&x[0], &x[1], &x[2]),
            );
        }
    }
}

/// The output layer from `W^T` (decoding's many rows): rows in several chunks of the
/// unpacked product and one, vocabularies that are not a multiple of its column block.
#[test]
fn linear_wt_matches_reference() -> Result<()> {
    for dtype in [DType::F64, DType::F32] {
        for (k, (n, c, v)) in [(9, 7, 129), (61, 32, 513), (130, 16, 1100)]
            .into_iter()
            .enumerate()
        {
            let k = k as u64 * 10;
            let x = tensor(&[n, c], 400 + k, 1.0, dtype);
            let w = tensor(&[v, c], 401 + k, 0.5, dtype);
            let b = tensor(&[v], 402 + k, 0.5, dtype);
            let got = linear_wt(&x, &w.t()?.contiguous()?, &b)?;
            let want = linear_few_rows_reference(&x, &w, &b)?;
            let e = rel_err(&got, &want);
            let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
            assert!(e <= tol, "linear_wt N={n} C={c} V={v} {dtype:?}: {e:e}");
        }
    }
    Ok(())
}

/// Dropout with the mask regenerated: exactly the composed version, forward and gradient,
/// and exactly the rule `uniform_at(seed, stream, i) >= p` (the kernel compares integers).
#[test]
fn dropout_matches_reference_and_the_rng_rule() {
    use transformer_kernels::rng::uniform_at;
    for dtype in [DType::F64, DType::F32] {
        for (k, (shape, p)) in [
            (vec![3usize, 5], 0.2),
            (vec![20, 2, 35, 35], 0.1),
            (vec![700, 200], 0.5),
        ]
        .into_iter()
        .enumerate()
        {
            let (seed, stream) = (11 + k as u64, 3 * k as u64);
            let x = tensor(&shape, 300 + k as u64, 1.0, dtype);
            let cot = tensor(&shape, 310 + k as u64, 1.0, dtype);
            let (out_f, grads_f) = run_with_grads(std::slice::from_ref(&x), &cot, |t| {
                dropout(&t[0], p, seed, stream)
            });
            let (out_r, grads_r) = run_with_grads(std::slice::from_ref(&x), &cot, |t| {
                dropout_reference(&t[0], p, seed, stream)
            });
            assert_eq!(
                to_f64(&out_f),
                to_f64(&out_r),
                "{shape:?} {dtype:?} forward"
            );
            assert_eq!(
                to_f64(&grads_f[0]),
                to_f64(&grads_r[0]),
                "{shape:?} {dtype:?} grad"
            );
            let kept: Vec<bool> = to_f64(&out_f)
                .iter()
                .zip(to_f64(&x))
                .map(|(y, x)| *y != 0.0 || x == 0.0)
                .collect();
            for (i, &kept) in kept.iter().enumerate() {
                assert_eq!(
                    kept,
                    uniform_at(seed, stream, i as u64) >= p,
                    "{shape:?} element {i}"
                );
            }
        }
    }
}

/// The vectorised row log-softmax against f64 arithmetic: large and small logits, rows
/// split between threads, a row of `-inf` left as it is.
#[test]
fn log_softmax_rows_matches_f64() {
    let (rows, width) = (70, 3001);
    let mut x: Vec<f32> = values(rows * width, 5, 30.0)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    x[..width].fill(f32::NEG_INFINITY);
    x[width] = 1e4;
    let want: Vec<f64> = x
        .chunks_exact(width)
        .flat_map(|r| {
            let m = r.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b as f64));
            let lse = m + r.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
            r.iter().map(move |&v| v as f64 - lse).collect::<Vec<_>>()
        })
        .collect();
    log_softmax_rows_f32(&mut x, width);
    assert!(x[..width].iter().all(|v| *v == f32::NEG_INFINITY));
    for (i, (&got, &w)) in x.iter().zip(&want).enumerate().skip(width) {
        assert!(
            (got as f64 - w).abs() <= 2e-5 * w.abs().max(1.0),
            "element {i}: {got} vs {w}"
        );
    }
}
