//! The fused attention kernel against its composed reference and central finite differences.

use candle_core::{DType, Device, Result, Tensor};
use transformer_kernels::{attention, attention_reference, AttentionInputs, Qkv};

mod common;
use common::*;

/// The signature of [`attention`] and [`attention_reference`].
type AttentionFn = fn(AttentionInputs) -> Result<Tensor>;

/// `f` on `x`'s three tensors as Q, K and V.
fn on_qkv(
    f: AttentionFn,
    x: &[Tensor],
    keep: Option<&Tensor>,
    dropout: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    f(AttentionInputs {
        qkv: Qkv {
            q: &x[0],
            k: &x[1],
            v: &x[2],
        },
        keep,
        dropout,
        scale,
    })
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
                |x| on_qkv(attention, x, keep.as_ref(), drop.as_ref(), scale),
                |x| on_qkv(attention_reference, x, keep.as_ref(), drop.as_ref(), scale),
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
        let keep = &keep;
        let on_heads = |f: AttentionFn| {
            move |x: &[Tensor]| {
                let x = [heads(&x[0])?, heads(&x[1])?, heads(&x[2])?];
                on_qkv(f, &x, Some(keep), None, 0.5)
            }
        };
        compare(
            &format!("attention strided {dtype:?}"),
            &inputs,
            &cot,
            on_heads(attention),
            on_heads(attention_reference),
        );
    }
}

#[test]
fn attention_fully_masked_rows_are_zero() {
    let (b, h, t, d) = (2, 1, 4, 3);
    let q = tensor(&[b, h, t, d], 220, 1.0, DType::F32);
    let keep = attention_keep(b, t, t);
    let out = on_qkv(
        attention,
        &[q.clone(), q.clone(), q],
        Some(&keep),
        None,
        1.0,
    )
    .unwrap();
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
        on_qkv(attention, x, Some(&keep), Some(&drop), 0.7)
    });
}
