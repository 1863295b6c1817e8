//! The elementwise and row kernels of `transformer_kernels` (tanh, sigmoid, softmax, layer
//! norm, the linear layer, dropout, log-softmax) against their composed references (forward
//! and every gradient through candle's backprop) and against central finite differences.
//! The other families: `cross_entropy.rs`, `attention.rs`.

use candle_core::{DType, Device, Result, Tensor};
use transformer_kernels::{
    dropout, dropout_reference, layer_norm, layer_norm_reference, linear, linear_few_rows,
    linear_few_rows_reference, linear_reference, linear_wt, log_softmax_rows_f32, sigmoid,
    sigmoid_reference, softmax_last_dim, softmax_last_dim_reference, tanh,
};

mod common;
use common::*;

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
            compare_unary("tanh", x.clone(), &cot, tanh, |x| x.tanh());
            compare_unary("sigmoid", x, &cot, sigmoid, sigmoid_reference);
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
            compare_unary(
                &format!("softmax {shape:?} {dtype:?}"),
                x,
                &cot,
                softmax_last_dim,
                softmax_last_dim_reference,
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
    compare_unary(
        "softmax 600x500",
        x,
        &cot,
        softmax_last_dim,
        softmax_last_dim_reference,
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
            let seed = 20 + k as u64;
            // An offset mean, to test the two-pass variance.
            let x = (tensor(&shape, seed, 2.0, dtype) + 3.0).unwrap();
            compare_layer_norm(&format!("layer_norm {shape:?} {dtype:?}"), x, seed);
        }
    }
}

/// The layer norm of `x` against its reference, the weight, bias and cotangent drawn from
/// `seed` + 10, 20 and 30.
fn compare_layer_norm(name: &str, x: Tensor, seed: u64) {
    let (dtype, c) = (x.dtype(), *x.dims().last().unwrap());
    let w = tensor(&[c], seed + 10, 1.0, dtype);
    let b = tensor(&[c], seed + 20, 1.0, dtype);
    let cot = tensor(x.dims(), seed + 30, 1.0, dtype);
    compare_ternary(
        name,
        [x, w, b],
        &cot,
        |x, w, b| layer_norm(x, w, b, 1e-5),
        |x, w, b| layer_norm_reference(x, w, b, 1e-5),
    );
}

/// Over 2 x 2^17 elements: rows split over threads, per-thread weight/bias gradients summed.
#[test]
fn layer_norm_matches_reference_multithreaded() {
    let x = tensor(&[2001, 200], 21, 2.0, DType::F64);
    compare_layer_norm("layer_norm 2001x200", x, 21);
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
            compare_ternary(
                &format!("linear {shape:?} -> {m} {dtype:?}"),
                [x, w, b],
                &cot,
                linear,
                linear_reference,
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
