//! int8 products (`kernels::int8`) against f32 at the shapes of a decoding step of the
//! default translation model (beam 5 x 25 sentences = 125 rows; d_model 256, FFN 512,
//! vocabulary 8,000), each kernel this CPU runs, on one thread; and this machine's int8
//! peak (a register-only loop of `vpdpbusd`), so the kernels' rate can be read against it.
//!
//! With `base`, the shapes of the paper's base model instead (d_model 512, FFN 2048,
//! vocabulary 8,000) at 125, 25, 5 and 1 rows.
//!
//! ```text
//! cargo run --release -p transformer-kernels --example int8_bench [REPEATS] [base]
//! ```

use candle_core::{Device, Result, Tensor};
use std::time::Instant;
use transformer_kernels::int8::{Int8Kernel, QuantizedLinear};
use transformer_kernels::linear_wt;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `n` values uniform in [-1, 1): the products' speed does not depend on them.
fn data(n: usize) -> Result<Vec<f32>> {
    Tensor::rand(-1f32, 1f32, n, &Device::Cpu)?.to_vec1()
}

fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

/// Multiply-adds per second of a register-only `vpdpbusd` loop (8 independent chains).
#[cfg(target_arch = "x86_64")]
fn vnni_peak() -> Option<f64> {
    if Int8Kernel::detect() != Int8Kernel::Avx512Vnni {
        return None;
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn run(iters: usize) -> i32 {
        use std::arch::x86_64::*;
        let a = _mm512_set1_epi8(3);
        let b = _mm512_set1_epi8(-2);
        let mut acc = [_mm512_setzero_si512(); 8];
        for _ in 0..iters {
            for v in acc.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, a, b);
            }
        }
        let mut s = _mm512_setzero_si512();
        for v in acc {
            s = _mm512_add_epi32(s, v);
        }
        _mm512_reduce_add_epi32(s)
    }
    let iters = 20_000_000;
    let t = Instant::now();
    let s = unsafe { run(iters) };
    let secs = t.elapsed().as_secs_f64();
    std::hint::black_box(s);
    // 8 instructions of 64 multiply-adds each per iteration.
    Some(iters as f64 * 8.0 * 64.0 / secs)
}

#[cfg(not(target_arch = "x86_64"))]
fn vnni_peak() -> Option<f64> {
    None
}

fn main() -> Result<()> {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dev = Device::Cpu;
    println!("one thread; median of {reps}; GMAC/s = multiply-adds per second / 1e9");
    if let Some(p) = vnni_peak() {
        println!("vpdpbusd peak (register-only loop): {:.0} GMAC/s", p / 1e9);
    }
    println!(
        "{:<34} {:>10} {:>9}   {}",
        "product (rows x outputs x inputs)", "f32 ms", "GMAC/s", "int8 kernels: ms (GMAC/s)"
    );
    let base = std::env::args().nth(2).is_some_and(|s| s == "base");
    // (rows, outputs, inputs): a layer's products at each number of rows, and the output
    // layer of greedy decoding (one row).
    let (d, f) = if base { (512, 2048) } else { (256, 512) };
    let rows: &[usize] = if base { &[125, 25, 5, 1] } else { &[125] };
    let mut shapes: Vec<(String, usize, usize, usize)> = Vec::new();
    for &n in rows {
        for (name, out, k) in [
            ("projection", d, d),
            ("feed-forward", f, d),
            ("feed-forward", d, f),
            ("output layer", 8000, d),
        ] {
            shapes.push((format!("{name} {n} x {out} x {k}"), n, out, k));
        }
    }
    if !base {
        shapes.push((format!("output layer, greedy 1 x 8000 x {d}"), 1, 8000, d));
    }
    for (name, n, out, k) in shapes {
        let (w, b, x) = (data(out * k)?, data(out)?, data(n * k)?);
        let macs = (n * out * k) as f64;
        let wt = Tensor::from_vec(w.clone(), (out, k), &dev)?
            .t()?
            .contiguous()?;
        let bt = Tensor::from_vec(b.clone(), out, &dev)?;
        let xt = Tensor::from_vec(x.clone(), (n, k), &dev)?;
        let f32_ms = time(reps, || {
            let _ = linear_wt(&xt, &wt, &bt).unwrap();
        });
        let mut line = format!("{name:<34} {f32_ms:>10.3} {:>9.1}  ", macs / f32_ms / 1e6);
        for kern in [Int8Kernel::Avx512Vnni, Int8Kernel::Avx2, Int8Kernel::Scalar] {
            if !kern.available() || (kern == Int8Kernel::Scalar && macs > 1e8) {
                continue;
            }
            let q = QuantizedLinear::new(&w, &b, out, k, kern);
            let mut y = vec![0f32; n * out];
            let ms = time(reps, || q.forward(&mut y, &x));
            line.push_str(&format!(
                " {}: {ms:.3} ({:.1})",
                kern.name(),
                macs / ms / 1e6
            ));
        }
        println!("{line}");
    }
    Ok(())
}
