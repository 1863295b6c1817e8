#![warn(missing_docs)]

//! Fused CPU kernels with hand-written backward passes, below the model: they take weights
//! and shapes as plain data (tensors, slices, [`Activation`], [`Precision`]) and write
//! gradients into a plain buffer ([`grads::DirectGrads`]); they know none of the model's types.
//!
//! Each kernel is a candle `CustomOp` whose forward and backward run as plain loops over the
//! tensors' slices (CPU, `f32` and `f64`). On any other device or dtype each public function
//! falls back to its `*_reference` twin, composed only of candle primitives that have a
//! backward pass (the tests compare the two, forward and every gradient).
//!
//! Why they exist: with candle 0.11 the tutorial language model spends most of its step in
//! chains of small primitive ops, each of which allocates a fresh tensor and walks it once
//! (measured on the project's 2-core machines: softmax / layer norm / cross-entropy from
//! primitives give a step of 2.3-2.9 s; PyTorch takes 0.4-0.7 s). candle's own fused `softmax_last_dim`, `layer_norm`
//! etc. have no backward at all and silently drop gradients, so they cannot be used.
//!
//! Forward + backward at the tutorial's shapes, f32, median ms, `examples/kernels_bench.rs`
//! on this 2-core Sapphire Rapids; one thread (`RAYON_NUM_THREADS=1`), measured while another
//! job kept both cores busy, so read the ratios:
//!
//! | kernel | replaces | fused | composed | speed-up |
//! |---|---|---|---|---|
//! | [`softmax_last_dim`] (20, 2, 35, 35) | max, sub, exp, sum, div and their backward | 0.23 | 1.20 | 5.2x |
//! | [`layer_norm`] (700, 200) | mean, sub, sqr, mean, add, sqrt, recip, mul, mul, add | 2.06 | 5.80 | 2.8x |
//! | [`attention`] (20, 2, 35, 100) | scale, matmul, mask, softmax, dropout, matmul | 3.87 | 6.23 | 1.6x |
//! | [`linear_cross_entropy`] N 700, C 200, V 33,278 | output layer, log-softmax, NLL | 251 | 1241 | 4.9x |
//!
//! (The small ops' times include a multiply by a cotangent, a `sum_all` and candle's gradient
//! bookkeeping, the same on both sides: most of what is left.) On both cores with the machine
//! otherwise idle, the loss took 139 ms forward + backward (202 GFLOP/s over its 3 products of
//! 9.3 GFLOP each) and 46 ms forward alone.
//!
//! The fused linear layer ([`linear`], (700, 200) x (200, 200), as in the encoder) takes 1.47
//! ms forward + backward against 2.95 composed, on both cores. A whole encoder layer is one op
//! too ([`encoder_layer`], for training through `DirectGrads` and for evaluation): the
//! tutorial's two layers take 11.9 ms forward + backward at 20 x 35 against 20.6 ms as a
//! candle graph of the fused small ops.
//!
//! With bf16 products on the AMX units ([`bf16`], [`Precision::Bf16`]) the loss takes 72 ms
//! forward + backward on both cores of the Sapphire Rapids, against 144 ms in fp32 (same
//! run). For decoding,
//! [`linear_few_rows`] computes the output layer for one token in 0.84 ms against 1.39 ms.
//!
//! The module docs of each kernel give its design and more numbers.

mod activation;
mod argmax;
mod attention;
pub mod autocast;
pub mod bf16;
mod cross_entropy;
#[cfg(feature = "cuda")]
mod cuda;
mod decoder_layer;
mod decoder_step;
mod dropout;
mod encoder_layer;
mod few_rows;
mod float;
mod fused_layer;
pub mod gpu;
pub mod grads;
pub mod int8;
mod layer_activation;
mod layer_norm;
mod linear;
mod matmul;
mod one_row;
mod panels;
pub mod rng;
mod rows;
mod shared;
mod small_rows;
mod smoothing;
mod softmax;
mod sublayer;
#[doc(hidden)]
pub mod testing;
#[doc(hidden)]
pub mod timing;

pub use activation::{sigmoid, sigmoid_reference, tanh};
pub use argmax::{first_largest, ArgmaxScreen, Screened};
pub use attention::{attention, attention_reference, AttentionInputs, Qkv};
pub use cross_entropy::{
    linear_cross_entropy, linear_cross_entropy_direct, linear_cross_entropy_reference,
    linear_cross_entropy_with, release_scratch,
};
pub use decoder_layer::{decoder_layer, DecoderLayerDropout};
pub use decoder_step::{DecodeCache, DecoderLayerParams, DecoderStack, StackOptions, StepWeights};
pub use dropout::{dropout, dropout_reference};
pub use encoder_layer::{
    encoder_layer, encoder_layer_applies, EncoderLayerParams, LayerDropout, WeightBias,
};
pub use few_rows::{linear_few_rows, linear_few_rows_reference, linear_wt};
pub use layer_activation::Activation;
pub use layer_norm::{layer_norm, layer_norm_reference};
pub use linear::{linear, linear_reference};
pub use panels::PanelLinear;
pub use shared::EncoderLayerOptions;
pub use smoothing::{label_smoothing_term, label_smoothing_term_reference, SmoothingInputs};
pub use softmax::{
    log_softmax_rows_f32, log_sum_exp_rows_f32, softmax_last_dim, softmax_last_dim_reference,
};

use candle_core::{bail, CpuStorage, DType, Layout, Result, Storage, Tensor, WithDType};

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" | "fp32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(format!("unknown precision {s:?}: use f32 or bf16")),
        }
    }
}

/// The arithmetic of a kernel's large matrix products. Written `f32` / `bf16` in configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp32 (or the inputs' own f64): the reference arithmetic.
    #[default]
    F32,
    /// bf16 operands with fp32 accumulation, on the AMX units or as AVX512-BF16 dot products
    /// ([`bf16`]) where the CPU has either and the inputs are f32; the fp32 path elsewhere. Mixed precision: everything
    /// outside the products stays fp32.
    Bf16,
}

/// True when the fused CPU path applies: every tensor on the CPU with `dtype` f32 or f64, and
/// no [`autocast`] guard asking for bf16 products of f32 tensors (the composed form then runs,
/// with its products in bf16, on any device).
fn fused_applies(ts: &[&Tensor]) -> bool {
    let dtype = ts[0].dtype();
    matches!(dtype, DType::F32 | DType::F64)
        && !(dtype == DType::F32 && autocast::bf16_products())
        && ts.iter().all(|t| t.device().is_cpu() && t.dtype() == dtype)
}

/// A linear layer's sizes `(out, in)`: `w`'s `(out, in)`, checked against `b`'s `(out,)`
/// (`who` names the layer's kind in the error).
fn linear_dims(who: &str, w: &Tensor, b: &Tensor) -> Result<(usize, usize)> {
    let (out, k) = w.dims2()?;
    if b.dims() != [out] {
        bail!(
            "{who}: w {:?} (out, k) and b {:?} (out,) disagree",
            w.dims(),
            b.dims()
        );
    }
    Ok((out, k))
}

/// Whether every tensor is f32 on the CPU.
fn all_f32_cpu(ts: &[&Tensor]) -> bool {
    ts.iter()
        .all(|t| t.dtype() == DType::F32 && t.device().is_cpu())
}

/// The contiguous slice behind a CPU storage with `layout`.
fn cpu_slice<'a, T: WithDType>(s: &'a candle_core::CpuStorage, layout: &Layout) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => bail!("kernels: expected a contiguous tensor, got layout {layout:?}"),
    }
}

/// The inputs of a three-tensor op's CPU forward pass: each storage with its layout.
type CpuArgs3<'a> = [(&'a candle_core::CpuStorage, &'a Layout); 3];

/// The gradients of a three-tensor op's inputs, in order.
type Grads3 = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// Three tensors: a three-tensor op's inputs' gradients, all given.
type Tensors3 = (Tensor, Tensor, Tensor);

/// A fused op of three tensors: its name, its CPU forward pass and its backward pass (by
/// default none: a forward-only op). [`Op3`] makes it a candle `CustomOp3`.
trait Kernel3: Send + Sync {
    /// The op's name in candle's errors and in this crate's.
    const NAME: &'static str;
    /// The output storage and shape from the three inputs.
    fn forward(&self, args: CpuArgs3) -> Result<(candle_core::CpuStorage, candle_core::Shape)>;
    /// The inputs' gradients from the output's, `grad`.
    fn backward(&self, _inputs: [&Tensor; 3], _out: &Tensor, _grad: &Tensor) -> Result<Grads3> {
        Err(candle_core::Error::BackwardNotSupported { op: Self::NAME })
    }
}

/// candle's `CustomOp3` for a [`Kernel3`]: the one place its signatures are written.
struct Op3<K>(K);

impl<K: Kernel3> candle_core::CustomOp3 for Op3<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &candle_core::CpuStorage,
        l1: &Layout,
        s2: &candle_core::CpuStorage,
        l2: &Layout,
        s3: &candle_core::CpuStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CpuStorage, candle_core::Shape)> {
        self.0.forward([(s1, l1), (s2, l2), (s3, l3)])
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        c: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        self.0.backward([a, b, c], out, grad)
    }
}

/// A forward pass generic over the element type, on three slices of one type: what
/// [`cpu_fwd3`] runs for a `CustomOp3` whose kernel exists for f32 and f64.
trait Forward3 {
    fn run<T: float::Float>(&self, a: &[T], b: &[T], c: &[T]) -> Vec<T>;
}

/// The body of such a `CustomOp3::cpu_fwd`: the three contiguous slices in their common type
/// (f32 or f64, else an error naming the op), the kernel, its output as a storage.
fn cpu_fwd3(
    kernel: &impl Forward3,
    name: &str,
    [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3,
) -> Result<candle_core::CpuStorage> {
    use candle_core::CpuStorage;
    Ok(match s1 {
        CpuStorage::F32(_) => CpuStorage::F32(kernel.run::<f32>(
            cpu_slice(s1, l1)?,
            cpu_slice(s2, l2)?,
            cpu_slice(s3, l3)?,
        )),
        CpuStorage::F64(_) => CpuStorage::F64(kernel.run::<f64>(
            cpu_slice(s1, l1)?,
            cpu_slice(s2, l2)?,
            cpu_slice(s3, l3)?,
        )),
        _ => bail!("{name}: only f32 and f64"),
    })
}

/// A backward pass generic over the element type: what [`grads3`] runs for a `CustomOp3`
/// whose kernel exists for f32 and f64.
trait Backward3 {
    /// The gradients of the three `inputs` (of type `T`) from the output's, `grad`.
    fn grads<T: float::Float>(&self, inputs: [&Tensor; 3], grad: &Tensor) -> Result<Tensors3>;
}

/// The body of such a `CustomOp3::bwd`: [`Backward3::grads`] in the inputs' type (f32 or
/// f64, else an error naming the op).
fn grads3(
    kernel: &impl Backward3,
    name: &str,
    inputs: [&Tensor; 3],
    grad: &Tensor,
) -> Result<Tensors3> {
    match inputs[0].dtype() {
        DType::F32 => kernel.grads::<f32>(inputs, grad),
        DType::F64 => kernel.grads::<f64>(inputs, grad),
        dt => bail!("{name}: unsupported dtype {dt:?}"),
    }
}

/// Three gradients, all given.
fn given((a, b, c): Tensors3) -> Grads3 {
    (Some(a), Some(b), Some(c))
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

/// Calls `f` with the contiguous f32 data of each tensor (read-locked meanwhile).
pub(crate) fn with_f32<R>(ts: &[&Tensor], f: impl FnOnce(&[&[f32]]) -> R) -> Result<R> {
    let guards: Vec<_> = ts.iter().map(|t| t.storage_and_layout()).collect();
    let mut slices = Vec::with_capacity(ts.len());
    for (g, layout) in &guards {
        let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) = (&**g, layout.contiguous_offsets())
        else {
            bail!("kernels: expected contiguous CPU f32 tensors");
        };
        slices.push(&v[a..b]);
    }
    Ok(f(&slices))
}

/// How many threads candle's CPU thread pool runs: its workers plus the calling thread
/// (`CANDLE_NUM_THREADS`, else `RAYON_NUM_THREADS`, else the CPUs this process may use). The
/// kernels use as many.
fn num_threads() -> usize {
    candle_core::utils::barrier_pool().n_workers() + 1
}

/// Runs `f` on every item in parallel on candle's own CPU thread pool
/// (`candle_core::utils::barrier_pool`, the calling thread included) and returns the results
/// in order. For short work (a millisecond or less): waking the pool's workers costs
/// microseconds where spawning threads costs tens, and they are often still spinning from
/// the previous candle op, so threads of our own would compete with them for the cores.
fn run_parallel<A: Send, R: Send>(items: Vec<A>, f: impl Fn(A) -> R + Sync) -> Vec<R> {
    use std::sync::Mutex;
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    let n = items.len();
    let slots: Vec<Mutex<Option<A>>> = items.into_iter().map(|a| Mutex::new(Some(a))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..n).map(|_| Mutex::new(None)).collect();
    // Items are handed out dynamically, so all of them run whatever the pool's size.
    candle_core::utils::barrier_pool().execute_chunked(n, |range| {
        for i in range {
            let item = slots[i]
                .lock()
                .unwrap()
                .take()
                .expect("each item runs once");
            let r = in_parallel_item(|| f(item));
            *results[i].lock().unwrap() = Some(r);
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().unwrap().expect("the pool ran every item"))
        .collect()
}

thread_local! {
    /// How many parallel items ([`run_parallel`], [`run_threads`]) this thread is inside.
    static IN_ITEM: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `f()`, marked as one item of a parallel run on this thread ([`threads_are_free`]).
fn in_parallel_item<R>(f: impl FnOnce() -> R) -> R {
    /// Leaves the item on drop, so a panicking item leaves the count right too.
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            IN_ITEM.with(|c| c.set(c.get() - 1));
        }
    }
    IN_ITEM.with(|c| c.set(c.get() + 1));
    let _inside = Inside;
    f()
}

/// Whether work on this thread may be split between the pool's threads: there is more than
/// one, and this thread is not itself running one item of a parallel run (then the others
/// are busy with theirs). The encoder of one sentence runs as a single group of rows, on
/// the calling thread, and splits its products' columns instead.
fn threads_are_free() -> bool {
    IN_ITEM.with(|c| c.get()) == 0 && num_threads() > 1
}

/// Runs `f` on every item, the first on the calling thread and each other one on a scoped
/// thread of its own; returns the results in order. For long work (the language-model loss:
/// tens of milliseconds per item): candle's pool makes a thread that finishes early spin
/// until the others are done, which on a busy machine burns the time slices the others need;
/// a scoped thread's join sleeps.
fn run_threads<A: Send, R: Send>(items: Vec<A>, f: impl Fn(A) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(f).collect();
    }
    std::thread::scope(|s| {
        let f = &f;
        let mut items = items.into_iter();
        let first = items.next();
        let handles: Vec<_> = items
            .map(|a| s.spawn(move || in_parallel_item(|| f(a))))
            .collect();
        let mut out = Vec::with_capacity(handles.len() + 1);
        if let Some(a) = first {
            out.push(in_parallel_item(|| f(a)));
        }
        for h in handles {
            out.push(h.join().expect("kernel worker thread panicked"));
        }
        out
    })
}

/// Splits `0..items` into one contiguous range per thread ([`num_threads`], at most one per
/// item), or a single range when `work` is below `min_work` (spawning costs tens of
/// microseconds).
fn split_ranges(items: usize, work: usize, min_work: usize) -> Vec<std::ops::Range<usize>> {
    let threads = if work < min_work {
        1
    } else {
        num_threads().min(items).max(1)
    };
    (0..threads)
        .map(|i| i * items / threads..(i + 1) * items / threads)
        .collect()
}

/// Computes each row of `out` (rows of `width` elements; none when `width` is 0) as
/// `f(row, out_row)`, the rows split over threads as [`par_rows`] splits them and each
/// thread's loop compiled by [`float::simd`] (with `f`, when `f` is `#[inline(always)]`).
#[inline(always)]
fn for_each_row<T: Send>(
    out: &mut [T],
    width: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if width == 0 {
        return;
    }
    par_rows(out, width, min_elems, |r0, rows| {
        float::simd(
            #[inline(always)]
            || {
                for (i, row) in rows.chunks_exact_mut(width).enumerate() {
                    f(r0 + i, row);
                }
            },
        )
    });
}

/// Splits `data` (rows of `width` elements) into at most [`num_threads`] contiguous groups of
/// rows and runs `f(first_row, group)` on each in parallel. Inputs under `min_elems` elements
/// per thread stay on the calling thread: waking the pool costs microseconds.
fn par_rows<T: Send, R: Send>(
    data: &mut [T],
    width: usize,
    min_elems: usize,
    f: impl Fn(usize, &mut [T]) -> R + Sync,
) -> Vec<R> {
    let rows = data.len().checked_div(width).unwrap_or(0);
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

/// What the hand-written product kernels' unit tests compare with.
#[cfg(test)]
mod plain {
    /// True (and says so) where this CPU lacks AVX-512: the AVX-512 kernels are not used
    /// there, so their tests have nothing to check.
    pub(crate) fn no_avx512() -> bool {
        let none = !crate::float::avx512();
        if none {
            eprintln!("no AVX-512 on this CPU: the kernel is not used here, nothing to check");
        }
        none
    }

    /// `len` values in [-1, 1], fixed by `seed`.
    pub(crate) fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 2001)
            .map(|v| v as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Checks the product kernel `kernel(y, x, w, b, n, m, k)` (`y = b + x W^T`, `x` `n x k`)
    /// at each size `(n, m, k)` of `sizes` on [`values`], its output filled with NaN before,
    /// with [`assert_sums`]; `W` is stored `m x k`, or `k x m` when `transposed`. Nothing to
    /// check where the CPU lacks AVX-512.
    fn check_product(
        name: &str,
        sizes: &[(usize, usize, usize)],
        transposed: bool,
        kernel: impl Fn(&mut [f32], &[f32], &[f32], &[f32], usize, usize, usize),
    ) {
        if no_avx512() {
            return;
        }
        check_product_here(name, sizes, transposed, kernel)
    }

    /// [`check_product`] for a kernel that runs on this CPU.
    fn check_product_here(
        name: &str,
        sizes: &[(usize, usize, usize)],
        transposed: bool,
        kernel: impl Fn(&mut [f32], &[f32], &[f32], &[f32], usize, usize, usize),
    ) {
        for &(n, m, k) in sizes {
            let (x, w, b) = (values(n * k, 1), values(m * k, 2), values(m, 3));
            let mut y = vec![f32::NAN; n * m];
            kernel(&mut y, &x, &w, &b, n, m, k);
            let at = |j, kk| {
                if transposed {
                    w[kk * m + j]
                } else {
                    w[j * k + kk]
                }
            };
            assert_sums(name, &y, &x, &b, (n, m, k), at);
        }
    }

    /// The hand-written product kernels (AVX-512, and the AVX2 panels) against the plain sums
    /// in f64.
    #[test]
    fn product_kernels_agree_with_the_plain_sums() {
        // Every kernel on the same layers `(m, k)`: output counts with and without partial
        // blocks (`one_row`'s 256 outputs, `small_rows`' 8, the 32-wide panel), few and many
        // inputs.
        let layers = [
            (1, 1),
            (13, 200),
            (32, 16),
            (45, 17),
            (64, 32),
            (70, 3),
            (100, 33),
            (256, 256),
            (256, 512),
            (300, 37),
            (512, 256),
        ];
        // `one_row::wt_row`: one row, `W^T`.
        check_product(
            "wt_row",
            &layers.map(|(m, k)| (1, m, k)),
            true,
            |y, x, w, b, _, m, k| crate::one_row::wt_row(y, x, w, b, m, k),
        );
        // `small_rows` and `panels::forward_rows` (`W` packed): row counts below, at and
        // above `small_rows`' 16-row pass, and around the 12-row tile of the panels.
        let sizes: Vec<_> = [2, 5, 12, 13, 16, 17, 48, 62, 125]
            .into_iter()
            .flat_map(|n| layers.map(|(m, k)| (n, m, k)))
            .collect();
        check_product("small_rows", &sizes, false, crate::small_rows::forward);
        check_product("panels", &sizes, false, |y, x, w, b, n, m, k| {
            let packed = crate::panels::Packed::new(crate::panels::Kernel::Avx512, w, m, k);
            packed.forward_rows(y, x, b, n)
        });
        // The AVX2 panels (16 outputs, tiles of 6 rows) wherever AVX2 and FMA run.
        if crate::float::avx2_fma() {
            check_product_here("panels avx2", &sizes, false, |y, x, w, b, n, m, k| {
                let packed = crate::panels::Packed::new(crate::panels::Kernel::Avx2, w, m, k);
                packed.forward_rows(y, x, b, n)
            });
        } else {
            eprintln!("no AVX2 and FMA on this CPU: the AVX2 panels are not checked here");
        }
    }

    /// Asserts that `y` (`n x m`) is `b[j] + sum_kk x[i][kk] * w(j, kk)` summed in f64 in
    /// plain order, within the rounding of `k` f32 terms.
    pub(crate) fn assert_sums(
        name: &str,
        y: &[f32],
        x: &[f32],
        b: &[f32],
        (n, m, k): (usize, usize, usize),
        w: impl Fn(usize, usize) -> f32,
    ) {
        for i in 0..n {
            for j in 0..m {
                let dot: f64 = (0..k)
                    .map(|kk| x[i * k + kk] as f64 * w(j, kk) as f64)
                    .sum();
                let (got, want) = (y[i * m + j] as f64, b[j] as f64 + dot);
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                    "{name} ({n}, {m}, {k}) y[{i}][{j}] = {got}, want {want}"
                );
            }
        }
    }
}
