//! Fused CPU kernels with hand-written backward passes.
//!
//! Each kernel is a candle `CustomOp` whose forward and backward run as plain loops over the
//! tensors' slices (CPU, `f32` and `f64`). On any other device or dtype each public function
//! falls back to its `*_reference` twin, composed only of candle primitives that have a
//! backward pass (the tests compare the two, forward and every gradient).
//!
//! Why they exist: with candle 0.11 the tutorial language model spends most of its step in
//! chains of small primitive ops, each of which allocates a fresh tensor and walks it once
//! (`../shared/NOTES.md`: softmax / layer norm / cross-entropy from primitives give a step of
//! 2.3-2.9 s; PyTorch takes 0.4-0.7 s). candle's own fused `softmax_last_dim`, `layer_norm`
//! etc. have no backward at all and silently drop gradients, so they cannot be used.
//!
//! | kernel | replaces | measured gain (forward + backward, this 2-core machine) |
//! |---|---|---|
//! | [`softmax_last_dim`] | max, sub, exp, sum, div (+ their backward) | see `examples/kernels_bench.rs` |
//! | [`layer_norm`] | mean, sub, sqr, mean, add, sqrt, recip, mul, mul, add | " |
//! | [`linear_cross_entropy`] | output projection + log-softmax + NLL | " |
//!
//! The module docs of each kernel give its numbers and design.

mod cross_entropy;
mod float;
mod layer_norm;
mod softmax;

pub use cross_entropy::{linear_cross_entropy, linear_cross_entropy_reference, release_scratch};
pub use layer_norm::{layer_norm, layer_norm_reference};
pub use softmax::{softmax_last_dim, softmax_last_dim_reference};

use candle_core::{bail, DType, Layout, Result, Storage, Tensor, WithDType};

/// True when the fused CPU path applies: every tensor on the CPU with `dtype` f32 or f64.
fn fused_applies(ts: &[&Tensor]) -> bool {
    let dtype = ts[0].dtype();
    matches!(dtype, DType::F32 | DType::F64)
        && ts.iter().all(|t| t.device().is_cpu() && t.dtype() == dtype)
}

/// The contiguous slice behind a CPU storage with `layout`.
fn cpu_slice<'a, T: WithDType>(s: &'a candle_core::CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => bail!("kernels: expected a contiguous tensor, got layout {layout:?}"),
    }
}

/// Calls `f` with the contiguous CPU data of `t` (copied to contiguous first if needed).
fn with_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => f(cpu_slice::<T>(s, layout)?),
        _ => bail!("kernels: expected a CPU tensor"),
    }
}

/// Worker threads for the big kernels: `RAYON_NUM_THREADS` if set (the variable candle's own
/// matmul honours), else the number of CPUs. The kernels use `std::thread::scope`, not rayon.
fn num_threads() -> usize {
    use std::sync::OnceLock;
    static N: OnceLock<usize> = OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1)
            })
    })
}

/// Runs `f` on every item, the first on the calling thread and the others on scoped threads
/// (one each); returns the results in order.
fn run_parallel<A: Send, R: Send>(items: Vec<A>, f: impl Fn(A) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    std::thread::scope(|s| {
        let f = &f;
        let mut items = items.into_iter();
        let first = items.next();
        let handles: Vec<_> = items.map(|a| s.spawn(move || f(a))).collect();
        let mut out = Vec::with_capacity(handles.len() + 1);
        if let Some(a) = first {
            out.push(f(a));
        }
        for h in handles {
            out.push(h.join().expect("kernel worker thread panicked"));
        }
        out
    })
}

/// Splits `data` (rows of `width` elements) into at most [`num_threads`] contiguous groups of
/// rows and runs `f(first_row, group)` on each in parallel. Inputs under `min_elems` elements
/// per thread stay on one thread: spawning costs tens of microseconds.
fn par_rows<T: Send, R: Send>(
    data: &mut [T],
    width: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R> {
    let rows = if width == 0 { 0 } else { data.len() / width };
    let threads = num_threads()
        .min(data.len() / min_elems.max(1))
        .min(rows)
        .max(1);
    let per = rows.div_ceil(threads).max(1);
    let items: Vec<(usize, &mut [T])> = data
        .chunks_mut(per * width.max(1))
        .enumerate()
        .map(|(i, c)| (i * per, c))
        .collect();
    if items.is_empty() {
        return vec![f(0, data)];
    }
    run_parallel(items, |(r0, c)| f(r0, c))
}
