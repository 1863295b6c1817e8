//! Timings behind the kernels' design, for `examples/kernels_timing.rs` (run it with
//! `RAYON_NUM_THREADS=1` for one thread's figures). Each function prints its measurements
//! (best of repeated runs, in ms) and asserts nothing; they reach crate-private kernels,
//! hence their place here. Not a stable API.

use super::bf16::{self, backend, gemm_bf16, pack_rows_transposed, pad32};
use super::linear::{rows_forward, rows_input_grad, weight_grad_rows};
use super::matmul::{gemm, Mat};
use super::rng::MaskSpec;
use super::shared::drop_inplace;
use super::small_rows;
use std::time::Instant;

fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// The query, key and value projections (forward, input gradient, weight gradient) as one
/// product with a `3C`-wide weight against three products, at 1000 rows of width 256 (no
/// gain at these shapes, so the sub-layers keep three).
pub fn projections_merged_or_not() {
    let (n, c) = (1000, 256);
    let x: Vec<f32> = (0..n * c).map(|i| (i % 17) as f32 * 0.1).collect();
    let w: Vec<f32> = (0..3 * c * c).map(|i| (i % 13) as f32 * 0.01).collect();
    let b = vec![0.1f32; 3 * c];
    let mut y3 = vec![0f32; 3 * n * c];
    let mut y = vec![0f32; 3 * n * c];
    for _ in 0..3 {
        let sep = best(20, || {
            for i in 0..3 {
                let yi = &mut y3[i * n * c..(i + 1) * n * c];
                rows_forward(yi, &x, &w[i * c * c..(i + 1) * c * c], &b[..c], n, c, c);
            }
        });
        let one = best(20, || rows_forward(&mut y, &x, &w, &b, n, 3 * c, c));
        println!("forward: three {sep:.3} ms, merged {one:.3} ms");
        let dy = y.clone();
        let mut dx = vec![0f32; n * c];
        let sep = best(20, || {
            for i in 0..3 {
                rows_input_grad(
                    &mut dx,
                    i > 0,
                    &dy[i * n * c..(i + 1) * n * c],
                    &w[i * c * c..(i + 1) * c * c],
                    n,
                    c,
                );
            }
        });
        let one = best(20, || rows_input_grad(&mut dx, false, &dy, &w, n, 3 * c));
        println!("input grad: three {sep:.3} ms, merged {one:.3} ms");
        let mut dw = vec![0f32; 3 * c * c];
        let sep = best(20, || {
            for i in 0..3 {
                weight_grad_rows(
                    &mut dw[i * c * c..(i + 1) * c * c],
                    0..c,
                    &dy[i * n * c..(i + 1) * n * c],
                    &x,
                    n,
                    c,
                    c,
                );
            }
        });
        let one = best(20, || {
            weight_grad_rows(&mut dw, 0..3 * c, &dy, &x, n, 3 * c, c)
        });
        println!("weight grad: three {sep:.3} ms, merged {one:.3} ms");
    }
}

/// The per-head products of the attention sub-layer (64 sequences of 18 positions, 8 heads
/// of width 32), with their GFLOP/s: far below gemm's rate at a head's 18 x 18 x 32.
pub fn attention_heads() {
    let (ns, t, c, h) = (64, 18, 256, 8);
    let dh = c / h;
    let n = ns * t;
    let q: Vec<f32> = (0..n * c).map(|i| (i % 17) as f32 * 0.01).collect();
    let k = q.clone();
    let v = q.clone();
    let mut p = vec![0f32; ns * h * t * t];
    let mut o = vec![0f32; n * c];
    for _ in 0..3 {
        let ms = best(20, || {
            for sl in 0..ns {
                for hi in 0..h {
                    let qo = sl * t * c + hi * dh;
                    let pb = &mut p[(sl * h + hi) * t * t..][..t * t];
                    gemm(
                        Mat::new_mut(pb, t, t, t, 1),
                        false,
                        Mat::new(&q[qo..], t, dh, c, 1),
                        Mat::new(&k[qo..], t, dh, c, 1).t(),
                        0.1,
                    );
                    gemm(
                        Mat::new_mut(&mut o[qo..], t, dh, c, 1),
                        false,
                        Mat::new(pb, t, t, t, 1),
                        Mat::new(&v[qo..], t, dh, c, 1),
                        1.0,
                    );
                }
            }
        });
        let flops = 2.0 * 2.0 * (ns * h * t * t * dh) as f64;
        println!("attention products (2 per head, {ns} x {h} heads of {t} x {t} x {dh}): {ms:.3} ms, {:.1} GFLOP/s", flops / ms / 1e6);
    }
}

/// Drawing and applying a dropout mask per element, against a plain add, over 2^20 elements.
pub fn dropout_masks() {
    let spec = MaskSpec::new(0.1, 7, 3);
    let mut x = vec![1f32; 1 << 20];
    for _ in 0..3 {
        let ms = best(20, || {
            crate::float::simd(
                #[inline(always)]
                || drop_inplace(&mut x, &spec, 12345, 1.1),
            )
        });
        println!(
            "dropout of 2^20 elements: {ms:.3} ms ({:.2} ns each)",
            ms * 1e6 / (1 << 20) as f64
        );
        let mut y = vec![0f32; 1 << 20];
        let ms = best(20, || {
            crate::float::simd(
                #[inline(always)]
                || {
                    for (a, b) in y.iter_mut().zip(&x) {
                        *a += *b;
                    }
                },
            )
        });
        println!("add of 2^20 elements: {ms:.3} ms");
    }
}

/// A layer's products (forward, input gradient, weight gradient) in f32 against bf16 with
/// the packing included, at three layer shapes; prints nothing without a bf16 unit.
pub fn layer_products_bf16() {
    if !bf16::available() {
        return;
    }
    for (n, k, m) in [(1000, 256, 256), (1000, 256, 512), (1000, 512, 256)] {
        let x: Vec<f32> = (0..n * k).map(|i| (i % 17) as f32 * 0.1).collect();
        let w: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.01).collect();
        let dy: Vec<f32> = (0..n * m).map(|i| (i % 11) as f32 * 0.01).collect();
        let b = vec![0.1f32; m];
        let (mut y, mut dx, mut dw) = (vec![0f32; n * m], vec![0f32; n * k], vec![0f32; m * k]);
        let (mut pa, mut pb) = (Vec::new(), Vec::new());
        for _ in 0..2 {
            let f32_ms = [
                best(10, || rows_forward(&mut y, &x, &w, &b, n, m, k)),
                best(10, || rows_input_grad(&mut dx, false, &dy, &w, n, m)),
                best(10, || weight_grad_rows(&mut dw, 0..m, &dy, &x, n, m, k)),
            ];
            let bf_ms = [
                best(10, || {
                    bf16::pack_rows(&x, (n, k, k), &mut pa);
                    bf16::pack_pairs_of_cols(&w, (m, k, k), &mut pb);
                    bf16::gemm_bf16(&mut y, m, n, m, &pa, pad32(k), &pb, pad32(m), false);
                }),
                best(10, || {
                    bf16::pack_rows(&dy, (n, m, m), &mut pa);
                    bf16::pack_pairs_of_rows(&w, (m, k, k), &mut pb);
                    bf16::gemm_bf16(&mut dx, k, n, k, &pa, pad32(m), &pb, pad32(k), false);
                }),
                best(10, || {
                    bf16::pack_rows_transposed(&dy, (n, m, m), &mut pa);
                    bf16::pack_pairs_of_rows(&x, (n, k, k), &mut pb);
                    bf16::gemm_bf16(&mut dw, k, m, k, &pa, pad32(n), &pb, pad32(k), false);
                }),
            ];
            println!(
                "{n} x {k} -> {m}: forward {:.3} / {:.3} ms, input grad {:.3} / {:.3}, weight grad {:.3} / {:.3} (f32 / bf16 with packing)",
                f32_ms[0], bf_ms[0], f32_ms[1], bf_ms[1], f32_ms[2], bf_ms[2]
            );
        }
    }
}

/// One thread's bf16 GFLOP/s at the language-model loss's block shapes, and the packing by
/// transposition its input gradient needs; prints nothing without a bf16 unit.
pub fn bf16_shapes_of_the_lm_loss() {
    let Some(unit) = backend() else {
        return;
    };
    println!("bf16 products as {}", unit.describe());
    for &(name, m, n, k, acc) in &[
        ("logits Z^T = W_j H^T", 512, 700, 200, false),
        ("dW_j = P_j^T H", 512, 200, 700, false),
        ("dH^T += W_j^T P_j^T", 200, 700, 512, true),
    ] {
        let a = vec![0x3f80u16; pad32(m) * pad32(k)];
        let b = vec![0x3f803f80u32; pad32(k) / 2 * pad32(n)];
        if name.starts_with("dH") {
            // Its left operand is packed from W_j by transposition every block.
            let w: Vec<f32> = (0..k * m).map(|i| (i % 97) as f32 * 0.01).collect();
            let mut out = Vec::new();
            let reps = 200;
            let t0 = Instant::now();
            for _ in 0..reps {
                pack_rows_transposed(&w, (k, m, m), &mut out);
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            println!("  pack_rows_transposed ({k}x{m}): {:.3} ms", s * 1e3);
        }
        for ldc in [n, pad32(n)] {
            let mut c = vec![0f32; m * ldc + 16];
            let off = (64 - (c.as_ptr() as usize % 64)) / 4 % 16;
            let reps = 200;
            let t0 = Instant::now();
            for _ in 0..reps {
                gemm_bf16(&mut c[off..], ldc, m, n, &a, pad32(k), &b, pad32(n), acc);
            }
            let s = t0.elapsed().as_secs_f64() / reps as f64;
            println!(
                "{name} ({m}x{n}x{k}) ldc {ldc}: {:.0} GFLOP/s, {:.3} ms",
                2.0 * (m * n * k) as f64 / s / 1e9,
                s * 1e3
            );
        }
    }
}

/// A 256 x 256 and a 512 x 256 projection (`x W^T + b`, `W` as stored) for 2 to 48 rows:
/// gemm, which packs `W` at every call, against the `small_rows` kernel, which reads it in place.
/// Each call reads another of 48 copies of the weight (more than the L2 cache holds), as the
/// encoder's products for one sentence do. Run with `RAYON_NUM_THREADS=1` for one thread's
/// figures (otherwise `small_rows` splits its columns between the threads).
pub fn small_rows_or_gemm() {
    if !super::float::avx512() {
        println!("no AVX-512 on this CPU: the small-rows kernel is not used here");
        return;
    }
    for (m, k) in [(256, 256), (512, 256)] {
        let copies = 48;
        let ws: Vec<Vec<f32>> = (0..copies)
            .map(|c| {
                (0..m * k)
                    .map(|i| ((i * 7 + c) % 23) as f32 * 0.01 - 0.1)
                    .collect()
            })
            .collect();
        let b: Vec<f32> = (0..m).map(|i| (i % 5) as f32 * 0.1).collect();
        for n in [2, 4, 16, 30, 48] {
            let x: Vec<f32> = (0..n * k).map(|i| (i % 11) as f32 * 0.1 - 0.5).collect();
            let mut y = vec![0f32; n * m];
            let g = best(20, || {
                for w in &ws {
                    super::linear::bias_rows(&mut y, &b);
                    gemm(
                        Mat::new_mut(&mut y, n, m, m, 1),
                        true,
                        Mat::new(&x, n, k, k, 1),
                        Mat::new(w, k, m, 1, k),
                        1.0,
                    );
                }
            });
            let s = best(20, || {
                for w in &ws {
                    small_rows::forward(&mut y, &x, w, &b, n, m, k);
                }
            });
            let per = 1e3 / copies as f64;
            println!(
                "{n:2} rows x {m} x {k}: gemm {:6.1} us, small_rows {:6.1} us ({:.2}x)",
                g * per,
                s * per,
                g / s
            );
        }
    }
}

/// The output layer of a beam-search step (125 rows x 8,000 outputs x 256 or 512 inputs)
/// through [`crate::linear_wt`] (gemm over blocks of `W^T` read in place) and through
/// [`crate::PanelLinear`] (`W` packed once into panels) for each panel kernel this CPU runs,
/// with the largest difference between the two; then the decoding stack's products at
/// d_model 512, FFN 2048 (125 rows, the 63 of one of two threads, and the 1 and 5 rows of
/// greedy decoding) as the step runs them on one thread: gemm reading `W^T` in place against
/// the panels.
pub fn panels_or_linear_wt() {
    use crate::panels::{Kernel, Packed};
    use candle_core::{Device, Tensor};
    let kernels: Vec<Kernel> = [Kernel::Avx512, Kernel::Avx2]
        .into_iter()
        .filter(|k| k.runs_here())
        .collect();
    if kernels.is_empty() {
        println!("neither AVX-512 nor AVX2 with FMA on this CPU: no panels kernel runs here");
        return;
    }
    let run = || -> candle_core::Result<()> {
        for (n, c, v) in [(125, 256, 8000), (125, 512, 8000)] {
            let dev = Device::Cpu;
            let x = Tensor::randn(0f32, 1.0, (n, c), &dev)?;
            let w = Tensor::randn(0f32, 0.1, (v, c), &dev)?;
            let b = Tensor::randn(0f32, 0.1, v, &dev)?;
            let wt = w.t()?.contiguous()?;
            let mut gemm_out = None;
            let g = best(20, || gemm_out = Some(crate::linear_wt(&x, &wt, &b)));
            let a = gemm_out.expect("ran")?;
            let macs = (n * c * v) as f64 / 1e6;
            for &kernel in &kernels {
                let panels = crate::PanelLinear::with_kernel(&w, &b, kernel)?.expect("runs here");
                let mut out = None;
                let p = best(20, || out = Some(panels.forward(&x)));
                let diff = (&a - out.expect("ran")?)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?;
                println!(
                    "{n} rows x {v} x {c}: linear_wt {g:.3} ms ({:.1} G/s), {kernel:?} panels {p:.3} ms ({:.1} G/s), {:.2}x; largest difference {diff}",
                    macs / g,
                    macs / p,
                    g / p
                );
            }
        }
        Ok(())
    };
    if let Err(e) = run() {
        println!("panels timing failed: {e}");
    }
    for (n, k, m) in [
        (125, 512, 512),
        (125, 512, 2048),
        (125, 2048, 512),
        (63, 512, 512),
        (63, 512, 2048),
        (63, 2048, 512),
        (1, 512, 2048),
        (5, 512, 2048),
    ] {
        let values = |len: usize, seed: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + seed * 104_729) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        let (x, w, b) = (values(n * k, 1), values(m * k, 2), values(m, 3));
        let mut wt = vec![0f32; k * m];
        for (j, row) in w.chunks_exact(k).enumerate() {
            for (kk, &v) in row.iter().enumerate() {
                wt[kk * m + j] = v;
            }
        }
        let mut y = vec![0f32; n * m];
        let g = best(20, || {
            crate::decoder_step::gemm_wt_rows(&mut y, &x, &wt, &b, n, m, k)
        });
        let macs = (n * k * m) as f64 / 1e6;
        for &kernel in &kernels {
            let packed = Packed::new(kernel, &w, m, k);
            let mut z = vec![0f32; n * m];
            let p = best(20, || packed.forward_rows(&mut z, &x, &b, n));
            let diff = y
                .iter()
                .zip(&z)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!(
                "{n} rows x {k} -> {m}: gemm {g:.3} ms ({:.1} G/s), {kernel:?} panels {p:.3} ms ({:.1} G/s), {:.2}x; largest difference {diff}",
                macs / g,
                macs / p,
                g / p
            );
        }
    }
}
