//! Forward + backward time of each fused kernel in `transformer_kernels` against its
//! composed-of-primitives reference, at the shapes of the PyTorch tutorial language model
//! (batch 20 x bptt 35 = 700 tokens, d_model 200, 2 heads, vocabulary 33,278), f32.
//!
//! ```text
//! CARGO_TARGET_DIR=/tmp/target-kernels cargo run --release -p transformer-kernels --example kernels_bench [REPEATS] [fused|lce]
//! ```
//! - REPEATS: timed runs of the loss (default 10; the median is printed) after one warm-up
//!   run; the small ops run 5 x REPEATS (at least 20), the composed loss at most 5.
//! - `fused`: skip the slow composed linear_cross_entropy (its column prints NaN).
//! - `lce`: only run the fused linear_cross_entropy forward + backward REPEATS times, silently
//!   (for `perf stat` / `perf record`); `lce-bf16` the same with bf16 products on AMX.
//!
//! - `ceilings`: this machine's FMA peak and the gemm crate's rate at the loss's block shape,
//!   each on both cores at once (REPEATS rounds), the ceilings docs/PERFORMANCE.md compares
//!   the step's products with.
//!
//! `RAYON_NUM_THREADS=1` runs the kernels (and candle's own ops) on one thread. Every
//! "fwd+bwd" time includes candle's backprop bookkeeping (e.g. the `zeros_like` + `add` it
//! does to accumulate each returned gradient); the softmax, layer-norm and attention rows also
//! include a multiplication by a random cotangent and a `sum_all`, identical on both sides.

use candle_core::{DType, Device, Result, Tensor, Var};
use std::time::Instant;
use transformer_kernels as kernels;

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

struct Lce {
    ins: [Var; 3],
    targets: Tensor,
}

fn lce_inputs(n: usize, c: usize, v: usize) -> Result<Lce> {
    let targets: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
    Ok(Lce {
        ins: [
            Var::from_tensor(&randn(&[n, c], 1.0)?)?,
            Var::from_tensor(&randn(&[v, c], 0.1)?)?,
            Var::from_tensor(&randn(&[v], 0.1)?)?,
        ],
        targets: Tensor::from_vec(targets, n, &Device::Cpu)?,
    })
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10);
    let mode = args.get(2).map(String::as_str).unwrap_or("");
    let (b, h, t, c, v) = (20usize, 2usize, 35usize, 200usize, 33_278usize);
    let n = b * t;

    if mode == "ceilings" {
        ceilings(reps);
        return Ok(());
    }
    if mode == "lce" || mode == "lce-bf16" {
        let x = lce_inputs(n, c, v)?;
        let [hid, w, bias] = &x.ins;
        let precision = if mode == "lce-bf16" {
            kernels::Precision::Bf16
        } else {
            kernels::Precision::F32
        };
        for _ in 0..reps {
            let loss =
                kernels::linear_cross_entropy_with(hid, w, bias, &x.targets, None, precision)?;
            let _ = loss.backward()?;
        }
        return Ok(());
    }

    // The small ops take a millisecond or less: more runs for a stable median.
    let small_reps = (reps * 5).max(20);
    println!(
        "median of {small_reps} runs (softmax, layer norm, attention) or {reps} runs (the \
         loss; the composed loss {} runs), ms, f32, RAYON_NUM_THREADS={:?}",
        reps.min(5),
        std::env::var("RAYON_NUM_THREADS").ok()
    );
    println!();
    println!("| op (shape) | fused fwd | fused fwd+bwd | reference fwd | reference fwd+bwd | speed-up (fwd+bwd) | notes |");
    println!("|---|---|---|---|---|---|---|");

    // Softmax over attention scores.
    {
        let shape = [b, h, t, t];
        let x = Var::from_tensor(&randn(&shape, 3.0)?)?;
        let cot = randn(&shape, 1.0)?;
        let fused = time(small_reps, std::slice::from_ref(&x), &|ts| {
            kernels::softmax_last_dim(&ts[0])?.mul(&cot)?.sum_all()
        })?;
        let reference = time(small_reps, &[x], &|ts| {
            kernels::softmax_last_dim_reference(&ts[0])?
                .mul(&cot)?
                .sum_all()
        })?;
        row(&format!("softmax_last_dim {shape:?}"), fused, reference, "");
    }

    // A linear layer of the encoder on the (700, 200) activations.
    {
        let ins = [
            Var::from_tensor(&randn(&[n, c], 1.0)?)?,
            Var::from_tensor(&randn(&[c, c], 0.1)?)?,
            Var::from_tensor(&randn(&[c], 0.1)?)?,
        ];
        let cot = randn(&[n, c], 1.0)?;
        let fused = time(small_reps, &ins, &|ts| {
            kernels::linear(&ts[0], &ts[1], &ts[2])?
                .mul(&cot)?
                .sum_all()
        })?;
        let reference = time(small_reps, &ins, &|ts| {
            kernels::linear_reference(&ts[0], &ts[1], &ts[2])?
                .mul(&cot)?
                .sum_all()
        })?;
        row(
            &format!("linear ({n}, {c}) x ({c}, {c})"),
            fused,
            reference,
            "",
        );
    }

    // Layer norm over the (700, 200) activations.
    {
        let ins = [
            Var::from_tensor(&randn(&[n, c], 1.0)?)?,
            Var::from_tensor(&randn(&[c], 1.0)?)?,
            Var::from_tensor(&randn(&[c], 1.0)?)?,
        ];
        let cot = randn(&[n, c], 1.0)?;
        let fused = time(small_reps, &ins, &|ts| {
            kernels::layer_norm(&ts[0], &ts[1], &ts[2], 1e-5)?
                .mul(&cot)?
                .sum_all()
        })?;
        let reference = time(small_reps, &ins, &|ts| {
            kernels::layer_norm_reference(&ts[0], &ts[1], &ts[2], 1e-5)?
                .mul(&cot)?
                .sum_all()
        })?;
        row(&format!("layer_norm [{n}, {c}]"), fused, reference, "");
    }

    // Attention of one layer: causal mask, dropout multiplier, heads of 100.
    {
        let d = c / h;
        let ins = [
            Var::from_tensor(&randn(&[b, h, t, d], 1.0)?)?,
            Var::from_tensor(&randn(&[b, h, t, d], 1.0)?)?,
            Var::from_tensor(&randn(&[b, h, t, d], 1.0)?)?,
        ];
        let cot = randn(&[b, h, t, d], 1.0)?;
        let keep: Vec<u8> = (0..t * t).map(|i| u8::from(i % t <= i / t)).collect();
        let keep = Tensor::from_vec(keep, (1, 1, t, t), &Device::Cpu)?;
        let drop = (Tensor::rand(0f32, 1.0, (b, h, t, t), &Device::Cpu)?
            .ge(0.2)?
            .to_dtype(DType::F32)?
            / 0.8)?;
        let scale = 1.0 / (d as f64).sqrt();
        let run = |f: fn(kernels::AttentionInputs) -> Result<Tensor>, ts: &[Tensor]| {
            let inputs = kernels::AttentionInputs {
                qkv: kernels::Qkv {
                    q: &ts[0],
                    k: &ts[1],
                    v: &ts[2],
                },
                keep: Some(&keep),
                dropout: Some(&drop),
                scale,
            };
            f(inputs)?.mul(&cot)?.sum_all()
        };
        let fused = time(small_reps, &ins, &|ts| run(kernels::attention, ts))?;
        let reference = time(small_reps, &ins, &|ts| {
            run(kernels::attention_reference, ts)
        })?;
        let composed_fused_softmax = time(small_reps, &ins, &|ts| {
            let scores = (&ts[0] * scale)?.matmul(&ts[1].t()?)?;
            let additive = keep.to_dtype(DType::F32)?.affine(1e30, -1e30)?;
            let w = kernels::softmax_last_dim(&scores.broadcast_add(&additive)?)?
                .broadcast_mul(&keep.to_dtype(DType::F32)?)?;
            w.broadcast_mul(&drop)?.matmul(&ts[2])?.mul(&cot)?.sum_all()
        })?;
        row(
            &format!("attention [{b}, {h}, {t}, {d}], causal + dropout"),
            fused,
            reference,
            &format!(
                "composed with the fused softmax: {:.2} / {:.2}",
                composed_fused_softmax.0, composed_fused_softmax.1
            ),
        );
    }

    // The output layer for one decoding step: 1 row against the vocabulary, no gradients.
    {
        let x = randn(&[1, c], 1.0)?;
        let w = randn(&[v, c], 0.1)?;
        let bias = randn(&[v], 0.1)?;
        let reps = small_reps * 5;
        let (mut fused, mut reference) = (Vec::new(), Vec::new());
        for i in 0..=reps {
            let t0 = Instant::now();
            kernels::linear_few_rows(&x, &w, &bias)?;
            let t1 = Instant::now();
            kernels::linear_few_rows_reference(&x, &w, &bias)?;
            let t2 = Instant::now();
            if i > 0 {
                fused.push((t1 - t0).as_secs_f64() * 1e3);
                reference.push((t2 - t1).as_secs_f64() * 1e3);
            }
        }
        let (f, r) = (median(fused), median(reference));
        println!(
            "| linear_few_rows N=1 C={c} V={v} (decoding, forward only) | {f:.3} | - | {r:.3} | - | {:.1}x (fwd) | fused reads W at {:.1} GB/s |",
            r / f,
            (v * c * 4) as f64 / f / 1e6
        );
    }

    // The output layer + cross-entropy.
    {
        let x = lce_inputs(n, c, v)?;
        let tg = &x.targets;
        let fused = time(reps, &x.ins, &|ts| {
            kernels::linear_cross_entropy(&ts[0], &ts[1], &ts[2], tg, None)
        })?;
        let reference = if mode == "fused" {
            (f64::NAN, f64::NAN)
        } else {
            time(reps.min(5), &x.ins, &|ts| {
                kernels::linear_cross_entropy_reference(&ts[0], &ts[1], &ts[2], tg, None)
            })?
        };
        let gflop = 3.0 * 2.0 * (n * c * v) as f64 / 1e9;
        row(
            &format!("linear_cross_entropy N={n} C={c} V={v}"),
            fused,
            reference,
            &format!(
                "fused fwd+bwd: {:.0} GFLOP/s counting 3 products of 2NCV ({gflop:.2} GFLOP)",
                gflop / fused.1 * 1e3
            ),
        );
        // The same with bf16 products (mixed precision).
        if let Some(unit) = kernels::bf16::backend() {
            let bf16 = time(reps, &x.ins, &|ts| {
                kernels::linear_cross_entropy_with(
                    &ts[0],
                    &ts[1],
                    &ts[2],
                    tg,
                    None,
                    kernels::Precision::Bf16,
                )
            })?;
            row(
                &format!(
                    "linear_cross_entropy, bf16 products as {} (reference column: fp32 fused)",
                    unit.describe()
                ),
                bf16,
                fused,
                &format!(
                    "fwd+bwd: {:.0} GFLOP/s counting 3 products of 2NCV",
                    gflop / bf16.1 * 1e3
                ),
            );
        } else {
            println!(
                "| linear_cross_entropy, bf16 | - | - | - | - | - | no AMX or AVX512-BF16 here |"
            );
        }
        // Evaluation: no input tracks gradients, only logits + log-sum-exp.
        let plain: Vec<Tensor> = x.ins.iter().map(|x| x.as_tensor().detach()).collect();
        let (mut eval, mut eval_ref) = (Vec::new(), Vec::new());
        for i in 0..=reps {
            let t0 = Instant::now();
            let l = kernels::linear_cross_entropy(&plain[0], &plain[1], &plain[2], tg, None)?;
            let _ = l.to_scalar::<f32>()?;
            let t1 = Instant::now();
            if mode != "fused" && i <= 5 {
                let l = kernels::linear_cross_entropy_reference(
                    &plain[0], &plain[1], &plain[2], tg, None,
                )?;
                let _ = l.to_scalar::<f32>()?;
            }
            let t2 = Instant::now();
            if i > 0 {
                eval.push((t1 - t0).as_secs_f64() * 1e3);
                if mode != "fused" && i <= 5 {
                    eval_ref.push((t2 - t1).as_secs_f64() * 1e3);
                }
            }
        }
        let e = median(eval);
        let er = if eval_ref.is_empty() {
            f64::NAN
        } else {
            median(eval_ref)
        };
        println!(
            "| linear_cross_entropy, no input needs a gradient (eval) | {e:.2} | - | {er:.2} | - | {:.1}x (fwd) | fused: {:.0} GFLOP/s (1 product) |",
            er / e,
            gflop / 3.0 / e * 1e3
        );
    }
    Ok(())
}

/// GFLOP/s of `f` (which returns its FLOP count) on each of two threads running at once.
fn on_both_cores(f: fn() -> f64) -> [f64; 2] {
    let run = move || {
        let t = Instant::now();
        let flop = f();
        flop / t.elapsed().as_secs_f64() / 1e9
    };
    let other = std::thread::spawn(run);
    let mine = run();
    [mine, other.join().expect("benchmark thread")]
}

/// 16 independent chains of AVX-512 FMAs (12 of AVX2 FMAs without AVX-512), no memory
/// operands: the FMA units' peak.
#[cfg(target_arch = "x86_64")]
fn fma_peak() -> f64 {
    /// `$name(iters)`: `$chains` independent chains of `$fma` on registers of `$lanes` floats
    /// (`$set1` broadcasts, `$add` adds, `$store` stores one), `iters` rounds; returns the sum of
    /// every lane so that no chain is optimised away. One for each register width: the
    /// intrinsics and target features differ.
    macro_rules! fma_chains {
        ($name:ident, $features:literal, $chains:literal, $lanes:literal,
         $set1:ident, $fma:ident, $add:ident, $store:ident) => {
            #[target_feature(enable = $features)]
            fn $name(iters: usize) -> f32 {
                use std::arch::x86_64::*;
                let mut acc = [$set1(0.0); $chains];
                let (a, b) = ($set1(1.000_000_1), $set1(0.999_999_9));
                for _ in 0..iters {
                    for x in acc.iter_mut() {
                        *x = $fma(*x, a, b);
                    }
                }
                let s = acc.iter().fold($set1(0.0), |s, &x| $add(s, x));
                let mut lanes = [0f32; $lanes];
                // SAFETY: `lanes` holds one register's floats.
                unsafe { $store(lanes.as_mut_ptr(), s) };
                lanes.iter().sum()
            }
        };
    }
    fma_chains! { chains, "avx512f", 16, 16,
    _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps }
    // The same with 256-bit registers, for CPUs without AVX-512 (e.g. Zen 2/3).
    fma_chains! { chains256, "avx2,fma", 12, 8,
    _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps }
    let iters = 20_000_000;
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F was detected just above.
        std::hint::black_box(unsafe { chains(iters) });
        (iters * 16 * 16 * 2) as f64
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA were detected just above.
        std::hint::black_box(unsafe { chains256(iters) });
        (iters * 12 * 8 * 2) as f64
    } else {
        f64::NAN
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_peak() -> f64 {
    f64::NAN
}

/// The fused loss's pass-1 product at the tutorial's block shape, 200 times on one thread, in
/// cache: `Z^T (512 x 700) = W_j (512 x 200) @ H^T (200 x 700)`, `H^T` contiguous.
fn gemm_block() -> f64 {
    let (len, n, c, reps) = (512usize, 700usize, 200usize, 200usize);
    let h_t = vec![0.01f32; c * n];
    let w = vec![0.02f32; len * c];
    let mut z = vec![0f32; len * n];
    for _ in 0..reps {
        // SAFETY: the three buffers have the sizes and strides passed.
        unsafe {
            gemm::gemm(
                len,
                n,
                c,
                z.as_mut_ptr(),
                1,
                n as isize,
                false,
                w.as_ptr(),
                1,
                c as isize,
                h_t.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
    std::hint::black_box(&z);
    (2 * len * n * c * reps) as f64
}

fn ceilings(rounds: usize) {
    println!("GFLOP/s per thread, both threads at once ({rounds} rounds; this machine's");
    println!("speed varies from minute to minute, compare within a round):");
    for r in 0..rounds {
        let [a, b] = on_both_cores(fma_peak);
        let [c, d] = on_both_cores(gemm_block);
        println!(
            "round {}: FMA peak {a:.0} / {b:.0}   gemm 512x700x200 in cache {c:.0} / {d:.0}",
            r + 1
        );
    }
}
