//! Forward + backward time of each fused kernel in `transformer_model::kernels` against its
//! composed-of-primitives reference, at the shapes of the PyTorch tutorial language model
//! (batch 20 x bptt 35 = 700 tokens, d_model 200, 2 heads, vocabulary 33,278), f32.
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/target-kernels cargo run --release -p transformer-model --example kernels_bench
//! ```
//! Optional argument: repeats (default 10). `RAYON_NUM_THREADS=1` runs the kernels (and
//! candle's matmul) on one thread.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::time::Instant;
use transformer_model::kernels;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn randn(shape: &[usize], scale: f64) -> Result<Tensor> {
    Tensor::randn(0f32, scale as f32, shape, &Device::Cpu)
}

/// Median milliseconds of (forward, forward + backward) over `reps` runs after one warm-up.
fn time(
    reps: usize,
    inputs: &[Var],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<(f64, f64)> {
    let ts: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let (mut fwd, mut both) = (Vec::new(), Vec::new());
    for i in 0..=reps {
        let t0 = Instant::now();
        let loss = f(&ts)?;
        let _ = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        for t in &ts {
            assert!(grads.get(t).is_some(), "an input got no gradient");
        }
        let t2 = Instant::now();
        drop(grads);
        if i > 0 {
            fwd.push((t1 - t0).as_secs_f64() * 1e3);
            both.push((t2 - t0).as_secs_f64() * 1e3);
        }
    }
    Ok((median(fwd), median(both)))
}

fn row(name: &str, fused: (f64, f64), reference: (f64, f64), extra: &str) {
    println!(
        "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1}x | {extra} |",
        fused.0,
        fused.1,
        reference.0,
        reference.1,
        reference.1 / fused.1
    );
}

fn main() -> Result<()> {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    // `fused` as a second argument skips the references (for profiling).
    let only_fused = std::env::args().nth(2).as_deref() == Some("fused");
    // `lce` as a second argument: only the fused linear_cross_entropy, forward + backward
    // `reps` times, no output (for `perf stat`).
    if std::env::args().nth(2).as_deref() == Some("lce") {
        let (n, c, v) = (700, 200, 33_278);
        let hid = Var::from_tensor(&randn(&[n, c], 1.0)?)?;
        let w = Var::from_tensor(&randn(&[v, c], 0.1)?)?;
        let bias = Var::from_tensor(&randn(&[v], 0.1)?)?;
        let targets: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
        let targets = Tensor::from_vec(targets, n, &Device::Cpu)?;
        for _ in 0..reps {
            let loss = kernels::linear_cross_entropy(&hid, &w, &bias, &targets, None)?;
            let _ = loss.backward()?;
        }
        return Ok(());
    }
    let (b, t, h, c, v) = (20usize, 35usize, 2usize, 200usize, 33_278usize);
    let n = b * t;
    println!(
        "median of {reps} runs, ms, f32, threads: RAYON_NUM_THREADS={:?}",
        std::env::var("RAYON_NUM_THREADS").ok()
    );
    println!();
    println!("| op (shape) | fused fwd | fused fwd+bwd | reference fwd | reference fwd+bwd | speed-up (fwd+bwd) | |");
    println!("|---|---|---|---|---|---|---|");

    // Softmax over attention scores, contracted with a random cotangent.
    {
        let shape = [b, h, t, t];
        let x = Var::from_tensor(&randn(&shape, 3.0)?)?;
        let cot = randn(&shape, 1.0)?;
        let fused = time(reps, &[x.clone()], &|ts| {
            kernels::softmax_last_dim(&ts[0])?.mul(&cot)?.sum_all()
        })?;
        let reference = time(reps, &[x], &|ts| {
            kernels::softmax_last_dim_reference(&ts[0])?
                .mul(&cot)?
                .sum_all()
        })?;
        row(
            &format!("softmax_last_dim {shape:?}"),
            fused,
            reference,
            "incl. mul + sum_all by the cotangent",
        );
    }

    // Layer norm over the (700, 200) activations.
    {
        let x = Var::from_tensor(&randn(&[n, c], 1.0)?)?;
        let w = Var::from_tensor(&randn(&[c], 1.0)?)?;
        let bb = Var::from_tensor(&randn(&[c], 1.0)?)?;
        let cot = randn(&[n, c], 1.0)?;
        let ins = [x, w, bb];
        let fused = time(reps, &ins, &|ts| {
            kernels::layer_norm(&ts[0], &ts[1], &ts[2], 1e-5)?
                .mul(&cot)?
                .sum_all()
        })?;
        let reference = time(reps, &ins, &|ts| {
            kernels::layer_norm_reference(&ts[0], &ts[1], &ts[2], 1e-5)?
                .mul(&cot)?
                .sum_all()
        })?;
        row(
            &format!("layer_norm [{n}, {c}]"),
            fused,
            reference,
            "incl. mul + sum_all by the cotangent",
        );
    }

    // The output layer + cross-entropy.
    {
        let hid = Var::from_tensor(&randn(&[n, c], 1.0)?)?;
        let w = Var::from_tensor(&randn(&[v, c], 0.1)?)?;
        let bias = Var::from_tensor(&randn(&[v], 0.1)?)?;
        let targets: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
        let targets = Tensor::from_vec(targets, n, &Device::Cpu)?;
        let ins = [hid, w, bias];
        let fused = time(reps, &ins, &|ts| {
            kernels::linear_cross_entropy(&ts[0], &ts[1], &ts[2], &targets, None)
        })?;
        let reference = if only_fused {
            (f64::NAN, f64::NAN)
        } else {
            time(reps.min(5), &ins, &|ts| {
                kernels::linear_cross_entropy_reference(&ts[0], &ts[1], &ts[2], &targets, None)
            })?
        };
        let gflop = 3.0 * 2.0 * (n * c * v) as f64 / 1e9;
        row(
            &format!("linear_cross_entropy N={n} C={c} V={v}"),
            fused,
            reference,
            &format!(
                "fused: {:.0} GFLOP/s counting 3 products of 2NCV = {gflop:.2} GFLOP",
                gflop / fused.1 * 1e3
            ),
        );
        // Evaluation: no input tracks gradients, only logits + log-sum-exp.
        let plain: Vec<Tensor> = ins.iter().map(|x| x.as_tensor().detach()).collect();
        let mut eval = Vec::new();
        let mut eval_ref = Vec::new();
        for i in 0..=reps {
            let t0 = Instant::now();
            let l = kernels::linear_cross_entropy(&plain[0], &plain[1], &plain[2], &targets, None)?;
            let _ = l.to_scalar::<f32>()?;
            let t1 = Instant::now();
            let l = kernels::linear_cross_entropy_reference(
                &plain[0], &plain[1], &plain[2], &targets, None,
            )?;
            let _ = l.to_scalar::<f32>()?;
            let t2 = Instant::now();
            if i > 0 {
                eval.push((t1 - t0).as_secs_f64() * 1e3);
                eval_ref.push((t2 - t1).as_secs_f64() * 1e3);
            }
        }
        let (e, er) = (median(eval), median(eval_ref));
        println!(
            "| linear_cross_entropy, no gradient (eval) | {e:.2} | - | {er:.2} | - | {:.1}x (fwd) | 1 product: {:.0} GFLOP/s |",
            er / e,
            gflop / 3.0 / e * 1e3
        );
    }
    Ok(())
}
