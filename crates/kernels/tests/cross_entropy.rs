//! The fused linear + cross-entropy kernel (and its label-smoothing term, and bf16 products)
//! against its composed reference and central finite differences.

use candle_core::{DType, Device, Result, Tensor, Var};
use transformer_kernels::{
    bf16, label_smoothing_term, label_smoothing_term_reference, linear_cross_entropy,
    linear_cross_entropy_reference, linear_cross_entropy_with, Precision, SmoothingInputs,
};

mod common;
use common::*;

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
    /// `x`'s hidden rows, weight and bias with targets `t`.
    fn smoothing<'a>(x: &'a [Tensor], t: &'a Tensor, ignore: u32, eps: f64) -> SmoothingInputs<'a> {
        SmoothingInputs {
            hidden: &x[0],
            weight: &x[1],
            bias: &x[2],
            targets: t,
            ignore_index: ignore,
            eps,
        }
    }
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
                |x| label_smoothing_term(smoothing(x, &t, ignore.0, 0.1), None),
                |x| label_smoothing_term_reference(smoothing(x, &t, ignore.0, 0.1)),
            );
        }
    }
    let inputs = lce_inputs(6, 4, 9, 190, DType::F64);
    let t = targets(6, 9, 191, Some((2, 3)));
    let one = Tensor::new(1f64, &Device::Cpu).unwrap();
    finite_difference_check("label_smoothing_term", &inputs, &one, |x| {
        label_smoothing_term(smoothing(x, &t, 2, 0.2), None)
    });
    // Into DirectGrads: the weight's and bias's gradients land there, the same values.
    let inputs = lce_inputs(11, 8, 30, 200, DType::F32);
    let t = targets(11, 30, 201, Some((0, 4)));
    let vars = vars_of(&inputs);
    let direct = transformer_kernels::grads::DirectGrads::new();
    let f = |d: Option<&transformer_kernels::grads::DirectGrads>| {
        let x = [0, 1, 2].map(|i| vars[i].as_tensor().clone());
        label_smoothing_term(smoothing(&x, &t, 0, 0.1), d)
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
    let vars = vars_of(&inputs);
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
        let vars = vars_of(a.iter().chain([&h2]));
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
    let vars = vars_of(&inputs);
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
