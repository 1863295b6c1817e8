//! The language model's output layer, log-softmax and negative log-likelihood, fused:
//! `loss = mean over non-ignored rows n of (logsumexp(z_n) - z_n[t_n])`, `z = h W^T + b`.
//!
//! # Why
//! This is the hot spot of the tutorial model: `(700 x 200) @ (200 x 33,278)` forward and two
//! more products of that size backward are about 90 % of a step's FLOPs (3 x 9.3 GFLOP).
//! Composed of candle primitives it also makes a dozen passes over the 93 MB `(N, V)` logits
//! (on a 2-core Sapphire Rapids, 2026-11-21: 290 ms for the bias gradient's `sum_keepdim(0)`
//! alone and 171 ms for a scalar multiply), plus transposed copies of the weight and fresh allocations that fault in
//! page by page: 1.24 s forward + backward on one thread here, against 0.25 s fused (4.9x;
//! `examples/kernels_bench.rs`). On both cores of an otherwise idle machine the fused loss
//! took 139 ms forward + backward, 202 GFLOP/s over its 3 products (the 2048^3 ceiling of
//! candle's gemm here is 122-153), and 46 ms forward alone.
//!
//! # Design
//! - **Forward = pass 1 (1 product), backward = pass 2 (2 products).** The forward pass
//!   computes the logits block by block, their log-sum-exp and the loss; when some input
//!   tracks gradients it keeps the exponentiated logits for the backward pass, which turns
//!   them into `P = softmax - onehot` and runs the two gradient products. So evaluation (no
//!   backward) costs one product even with parameters that are `Var`s, training costs exactly
//!   3 (nothing recomputed), and the incoming gradient folds into the per-row scale of `P`
//!   (no extra pass over the 26 MB weight gradient). If the kept state is gone (a second
//!   backward on the same graph), pass 1 reruns from the inputs.
//! - **Vocabulary blocks of [`GEMM_BLOCK`] columns ([`BLOCK`] with bf16 products), stored transposed.**
//!   Pass 1, per block `j`:
//!   `Z_j^T = W_j H^T + b_j` (`len x N`, gemm reading `W` in place and `H^T` from one
//!   contiguous copy made per call: read through strides, gemm packed `H` again for every
//!   block, 3-4% of the product's time), the block max of
//!   each row, `exp(z - block max)` stored in place of the logits, its sum folded into a
//!   running (max, sum) per row (online log-sum-exp), the target logits picked out. The
//!   transposed layout puts the per-row reductions along contiguous memory (16 rows per
//!   AVX-512 instruction) and makes every product below read its operands with unit strides.
//!   Pass 2, once every row's log-sum-exp is known, per block:
//!   `P_j = (softmax - onehot) / count` in place as the stored exponentials times one factor
//!   per row, `exp(block max - lse) / count` (no second exponential per element), its row
//!   sums are `dbias_j`; then `dW_j = P_j^T H` (each block of dW written once, never
//!   accumulated) and `dH^T += (P_j W_j)^T`. Each `dW_j`'s sum of squares is taken while it
//!   is in cache and handed with `dW` to [`DirectGrads`], so that the gradient-norm clipping
//!   does not read the 23-26 MB `dW` from memory again (2-4% of a training step).
//! - **The exponentiated logits are kept** from the forward to the backward pass (`N x V`,
//!   93 MB in f32 at the tutorial's shapes) in a buffer that goes back to a pool when the
//!   backward pass is done or the graph is dropped, and is reused by the next call (no page
//!   faults after the first; [`release_scratch`] frees it). Recomputing them in the backward
//!   pass instead would be a 4th product of 9.3 GFLOP: 67 ms of one core here, against one
//!   read of the buffer. With no input tracking gradients nothing is kept and one block per
//!   thread suffices.
//! - **Threads:** the vocabulary is split into one contiguous range of blocks per thread
//!   (as many as candle's CPU pool has; scoped threads, see `run_threads`), each running
//!   single-threaded gemm calls on its own blocks
//!   (gemm's own `Parallelism::Rayon(2)` per call measured slower: 236 vs 221 ms for the three
//!   products; rayon is not used). The partial log-sum-exps are merged between the passes and
//!   the per-thread `dH` summed at the end.
//!
//! Products, one core, CPU time over the 65 blocks (gemm 0.19 `x86-v4`): logits 67 ms
//! (140 GFLOP/s), `dW` 73 ms (127), `dH` 70 ms (133); the transposed layout saved 14 ms of
//! that against row-major logits. Everything else (exponentials, bias, reductions, page faults,
//! candle's gradient accumulation) is about a quarter of the CPU time.
//!
//! # bf16 products ([`linear_cross_entropy_with`], [`Precision::Bf16`])
//! The three products run on the AMX units or as AVX512-BF16 dot products ([`super::bf16`],
//! whichever the CPU has) with bf16 operands and fp32
//! accumulation; everything else above stays fp32 (bias, maxima, exponentials, log-sum-exp,
//! the scaling of `P`, the bias gradient). Operands are packed per block: `W_j` as bf16 rows
//! (and `W_j^T` for `dH`), `H^T` and `H` once per call, and `P_j^T` straight from the stored
//! exponentials into both layouts in one pass that also applies the per-row factor and the
//! one-hot term and sums `dbias` (so no scaled f32 `P` is written back). Products write into
//! 64-byte-aligned scratch that stays in L2 (tile stores into the uncached region were the
//! slowest part) and are copied out, adding the bias on the way. The kept exponentials are
//! rounded to bf16 (`Store::Bf16`, 47 instead of 93 MB written and read back per step at the
//! tutorial's shapes; `P` is rounded to bf16 for its products anyway, and the bias gradient,
//! summed in f32, stays within 5e-6 of the fp32 kernel's). At the tutorial's shapes the loss
//! takes 76-107 ms forward + backward where fp32 storage took 101-114 (three interleaved
//! pairs, busy machine) and the fp32 kernel 144.
//!
//! # Loss semantics
//! Identical to PyTorch's `CrossEntropyLoss(reduction="mean", ignore_index=i)` on the logits
//! `h W^T + b`: the mean over rows whose target is not `ignore_index` of
//! `-log_softmax(logits)[target]`. Ignored rows contribute nothing to the loss or to any
//! gradient. If every row is ignored the loss is NaN (0/0, as PyTorch) and the gradients are
//! zero (as PyTorch's). A target outside `0..V` that is not `ignore_index` is an error.

use super::bf16::{self, pad32};
use super::float::{self, simd, Float};
use super::matmul::{gemm, Mat};
use super::{cpu_slice, fused_applies, run_threads, with_slice, Precision};
use super::{CpuArgs3, Grads3, Kernel3, Op3};
use crate::grads::DirectGrads;
use candle_core::{bail, CpuStorage, DType, Result, Shape, Tensor, D};
use std::ops::Range;
use std::sync::Mutex;

mod passes;
use passes::{pass1, pass2};

/// Vocabulary columns per block with bf16 products (AMX; AVX512-BF16 too). A block of logits for the 700 rows
/// is 1.4 MB (f32), which stays in this CPU's 2 MB L2 between the product that writes it and
/// the passes that read it. Measured for the three products at the tutorial's shapes (2
/// threads, row-major logits): 256: 250 ms, 512: 221 ms, 1024: 232 ms, 2048: 247 ms; with the
/// final transposed layout 256 to 2048 were within the noise of a shared machine. On the
/// 2-core Sapphire Rapids (commit 8200a72, 2026-11-24), each step alternating between two sizes in one process: the bf16 step is 0.8-2.4% slower
/// with 256 (3 runs of 28 pairs).
pub const BLOCK: usize = 512;

/// Vocabulary columns per block with the gemm crate's products (f32 without bf16 products, f64): the
/// fp32 training step is 1.1-2.7% faster than with 512 (paired medians 0.973 / 0.986 / 0.985
/// / 0.980 / 0.989 over 5 runs of 28 alternating pairs, Sapphire Rapids, 2026-11-24, noisy minutes; 128 was
/// 2.3-2.9% slower than 256), evaluation the same (0.993-1.008).
pub const GEMM_BLOCK: usize = 256;

/// The block length for bf16 products ([`super::bf16`]) or the gemm crate's.
fn block_len(bf16_products: bool) -> usize {
    if bf16_products {
        BLOCK
    } else {
        GEMM_BLOCK
    }
}

/// Vocabulary rows per bf16 product in pass 1 (a 360 KB scratch of logits at N = 700).
const BF16_ROWS: usize = 128;

/// Products smaller than this many multiply-adds (`N * C * V`) stay on one thread.
const MIN_PARALLEL_MACS: usize = 1 << 22;

/// Fused `cross_entropy(hidden @ weight^T + bias, targets)` with mean reduction and an optional
/// `ignore_index`, without ever materialising the logits as a candle tensor.
///
/// Returns a scalar (rank 0) of hidden's dtype. The backward pass gives the gradients of
/// `hidden`, `weight` and `bias`. See the module docs for the exact semantics (PyTorch's).
/// CPU f32/f64 run the fused kernel; other devices and dtypes run
/// [`linear_cross_entropy_reference`].
///
/// Memory: when an input tracks gradients, the returned loss holds the exponentiated logits
/// (`N x V`, 93 MB at the tutorial's shapes in f32) until its backward pass runs or the loss
/// is dropped; keep the scalar (`to_scalar`), not the tensor, for logging. Inputs that track
/// nothing (e.g. detached parameters in evaluation) keep nothing.
///
/// # Shapes
/// - hidden: (..., C), flattened to (N, C); weight: (V, C); bias: (V,)
/// - targets: u32 with N elements (any shape, e.g. (B, T) for hidden (B, T, C))
/// - -> ()
pub fn linear_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<Tensor> {
    linear_cross_entropy_with(hidden, weight, bias, targets, ignore_index, Precision::F32)
}

/// [`linear_cross_entropy`] with a choice of arithmetic for its three products.
///
/// [`Precision::Bf16`] runs them with bf16 operands and fp32 accumulation (on the AMX units
/// or as AVX512-BF16 dot products) when the inputs are f32 on the CPU and
/// [`bf16::available`]; otherwise (f64, other devices, a CPU with neither) this is exactly
/// [`linear_cross_entropy`]. Everything but the products
/// (bias, log-sum-exp, softmax, the gradient scaling and the bias gradient) stays fp32.
/// Measured error against the fp32 kernel at the tutorial's shapes: see
/// `tests/kernels.rs` (`bf16_loss_is_close_to_f32`).
pub fn linear_cross_entropy_with(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
    precision: Precision,
) -> Result<Tensor> {
    fused(
        [hidden, weight, bias],
        targets,
        ignore_index,
        precision,
        None,
    )
}

/// [`linear_cross_entropy_with`] whose backward pass writes the gradients of `weight` and
/// `bias` into `grads` ([`crate::grads`]: buffers kept from step to step, written once)
/// instead of returning them to candle's `GradStore`, where those are CPU f32 variables;
/// only `hidden`'s gradient flows on through candle. Same values, bit for bit.
pub fn linear_cross_entropy_direct(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
    precision: Precision,
    grads: &DirectGrads,
) -> Result<Tensor> {
    fused(
        [hidden, weight, bias],
        targets,
        ignore_index,
        precision,
        Some(grads),
    )
}

/// The fused loss on the layer's `[hidden, weight, bias]` (see [`linear_cross_entropy_direct`]).
fn fused(
    inputs @ [hidden, weight, bias]: [&Tensor; 3],
    targets: &Tensor,
    ignore_index: Option<u32>,
    precision: Precision,
    direct: Option<&DirectGrads>,
) -> Result<Tensor> {
    let (n, c, v) = check_shapes(hidden, weight, bias, targets)?;
    #[cfg(feature = "cuda")]
    if crate::cuda::applies(&inputs) {
        // The GPU's fused loss (no smoothing): its first output.
        let _ = (n, c, v, precision, direct);
        let (loss, _) =
            crate::cuda::smoothed_cross_entropy(hidden, weight, bias, targets, ignore_index, 0.0)?;
        return Ok(loss);
    }
    if !fused_applies(&inputs) {
        return linear_cross_entropy_reference(hidden, weight, bias, targets, ignore_index);
    }
    let targets = prepare_targets(targets, v, ignore_index)?;
    let want_grad = hidden.track_op() || weight.track_op() || bias.track_op();
    let h = hidden.reshape((n, c))?.contiguous()?;
    let op = LinearCrossEntropy {
        targets,
        want_grad,
        bf16_products: precision == Precision::Bf16
            && hidden.dtype() == DType::F32
            && bf16::available(),
        saved: Mutex::new(None),
        direct: direct.cloned(),
    };
    h.apply_op3(&weight.contiguous()?, &bias.contiguous()?, Op3(op))
}

/// The same loss composed of candle primitives with backward passes: matmul, broadcast add,
/// detached row max, exp, sum, log, gather, and a 0/1 mask for ignored rows.
pub fn linear_cross_entropy_reference(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore_index: Option<u32>,
) -> Result<Tensor> {
    let (n, c, v) = check_shapes(hidden, weight, bias, targets)?;
    let dev = hidden.device();
    let t = prepare_targets(targets, v, ignore_index)?;
    let logits =
        crate::autocast::matmul(&hidden.reshape((n, c))?, &weight.t()?)?.broadcast_add(bias)?;
    let max = logits.max_keepdim(1)?.detach();
    let z = logits.broadcast_sub(&max)?;
    let lse = z.exp()?.sum_keepdim(1)?.log()?;
    let log_probs = z.broadcast_sub(&lse)?;
    let safe: Vec<u32> = t.iter().map(|t| t.unwrap_or(0) as u32).collect();
    let keep: Vec<f64> = t.iter().map(|t| f64::from(t.is_some() as u8)).collect();
    let count = keep.iter().sum::<f64>();
    let picked = log_probs
        .gather(&Tensor::from_vec(safe, (n, 1), dev)?, 1)?
        .squeeze(1)?;
    let keep = Tensor::from_vec(keep, n, dev)?.to_dtype(hidden.dtype())?;
    (picked * keep)?.sum_all()?.affine(-1.0 / count, 0.0)
}

/// Frees the logits buffer kept between calls of [`linear_cross_entropy`] (93 MB at the
/// tutorial's shapes in f32).
pub fn release_scratch() {
    *f32::pool().lock().unwrap_or_else(|e| e.into_inner()) = Vec::new();
    *f64::pool().lock().unwrap_or_else(|e| e.into_inner()) = Vec::new();
}

fn check_shapes(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
) -> Result<(usize, usize, usize)> {
    let c = hidden.dim(D::Minus1)?;
    let n = hidden.elem_count().checked_div(c).unwrap_or(0);
    let (v, wc) = weight.dims2()?;
    if wc != c || bias.dims() != [v] || targets.elem_count() != n {
        bail!(
            "linear_cross_entropy: hidden {:?} (N, C), weight {:?} (V, C), bias {:?} (V,), \
             targets {:?} (N elements) disagree",
            hidden.dims(),
            weight.dims(),
            bias.dims(),
            targets.dims()
        );
    }
    if targets.dtype() != DType::U32 {
        bail!(
            "linear_cross_entropy: targets must be u32, got {:?}",
            targets.dtype()
        );
    }
    Ok((n, c, v))
}

/// Targets as row -> `Some(class)`, or `None` for ignored rows.
fn prepare_targets(
    targets: &Tensor,
    v: usize,
    ignore_index: Option<u32>,
) -> Result<Vec<Option<usize>>> {
    let t = targets.flatten_all()?.to_vec1::<u32>()?;
    t.into_iter()
        .map(|t| {
            if Some(t) == ignore_index {
                Ok(None)
            } else if (t as usize) < v {
                Ok(Some(t as usize))
            } else {
                bail!("linear_cross_entropy: target {t} outside 0..{v} (and not ignore_index)")
            }
        })
        .collect()
}

/// What the backward pass needs from the forward pass, for one element type.
enum SavedAny {
    F32(Saved<f32>),
    F64(Saved<f64>),
}

struct LinearCrossEntropy {
    targets: Vec<Option<usize>>,
    /// Some input tracks gradients: keep the exponentials for the backward pass.
    want_grad: bool,
    /// Run the products in bf16 ([`bf16::gemm_bf16`]) (f32 inputs only).
    bf16_products: bool,
    saved: Mutex<Option<SavedAny>>,
    /// Where the weight's and bias's gradients go when they are CPU f32 variables.
    direct: Option<DirectGrads>,
}

impl Kernel3 for LinearCrossEntropy {
    const NAME: &'static str = "kernels-linear-cross-entropy";

    fn forward(&self, [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        let (n, c) = match l1.dims() {
            &[n, c] => (n, c),
            d => bail!("kernels-linear-cross-entropy: hidden {d:?} is not (N, C)"),
        };
        let v = l3.dims()[0];
        let storage = match s1 {
            CpuStorage::F32(_) => {
                let (h, w, b) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?);
                let (loss, saved) = forward::<f32>(
                    h,
                    w,
                    b,
                    n,
                    c,
                    v,
                    &self.targets,
                    self.want_grad,
                    self.bf16_products,
                );
                *self.saved.lock().unwrap() = saved.map(SavedAny::F32);
                CpuStorage::F32(vec![loss as f32])
            }
            CpuStorage::F64(_) => {
                let (h, w, b) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?);
                let (loss, saved) =
                    forward::<f64>(h, w, b, n, c, v, &self.targets, self.want_grad, false);
                *self.saved.lock().unwrap() = saved.map(SavedAny::F64);
                CpuStorage::F64(vec![loss])
            }
            _ => bail!("kernels-linear-cross-entropy: only f32 and f64"),
        };
        Ok((storage, Shape::from(())))
    }

    fn backward(
        &self,
        [hidden, weight, bias]: [&Tensor; 3],
        _loss: &Tensor,
        grad: &Tensor,
    ) -> Result<Grads3> {
        let inputs = [hidden, weight, bias];
        let g = grad.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let saved = self.saved.lock().unwrap().take();
        let direct = self
            .direct
            .as_ref()
            .filter(|_| DirectGrads::accepts(weight) && DirectGrads::accepts(bias));
        let (dh, dw, db) = match hidden.dtype() {
            DType::F32 => {
                let saved = match saved {
                    Some(SavedAny::F32(s)) => Some(s),
                    _ => None,
                };
                if let Some(direct) = direct {
                    // Into the previous step's buffers: nothing allocated or zeroed (pass 2
                    // writes every element once).
                    let mut dw = direct.take_buffer(weight, weight.elem_count());
                    let mut db = direct.take_buffer(bias, bias.elem_count());
                    let (dh, dw_sum_sq) = self.grads_into(inputs, saved, g, &mut dw, &mut db)?;
                    direct.put_dense_with_sum_sq(weight, dw, dw_sum_sq);
                    direct.put_dense(bias, db);
                    return Ok((Some(dh), None, None));
                }
                self.grads::<f32>(inputs, saved, g)?
            }
            DType::F64 => {
                let saved = match saved {
                    Some(SavedAny::F64(s)) => Some(s),
                    _ => None,
                };
                self.grads::<f64>(inputs, saved, g)?
            }
            dt => bail!("kernels-linear-cross-entropy: unsupported dtype {dt:?}"),
        };
        Ok((Some(dh), Some(dw), Some(db)))
    }
}

impl LinearCrossEntropy {
    /// The backward pass on the op's inputs: pass 2 on what the forward pass kept or, when
    /// that is gone (a second backward on the same graph), on a fresh pass 1.
    fn grads<T: Pooled>(
        &self,
        inputs: [&Tensor; 3],
        saved: Option<Saved<T>>,
        g: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let [hidden, weight, bias] = inputs;
        let (mut dw, mut db) = (
            vec![T::ZERO; weight.elem_count()],
            vec![T::ZERO; bias.elem_count()],
        );
        let (dh, _) = self.grads_into(inputs, saved, g, &mut dw, &mut db)?;
        let dev = hidden.device();
        Ok((
            dh,
            Tensor::from_vec(dw, weight.shape(), dev)?,
            Tensor::from_vec(db, bias.shape(), dev)?,
        ))
    }

    /// Pass 2 (after pass 1 again if its state is gone), writing every element of `dw` and
    /// `db` (`inputs` the op's: hidden, weight, bias); returns `dH` and the sum of squares
    /// of `dw`.
    fn grads_into<T: Pooled>(
        &self,
        [hidden, weight, bias]: [&Tensor; 3],
        saved: Option<Saved<T>>,
        g: f64,
        dw: &mut [T],
        db: &mut [T],
    ) -> Result<(Tensor, f64)> {
        let (n, c) = hidden.dims2()?;
        let v = weight.dim(0)?;
        let (dh, dw_sum_sq) = with_slice::<T, _>(hidden, |h| {
            with_slice::<T, _>(weight, |w| {
                let saved = match saved {
                    Some(s) => s,
                    None => with_slice::<T, _>(bias, |b| {
                        let (_, s) =
                            forward::<T>(h, w, b, n, c, v, &self.targets, true, self.bf16_products);
                        Ok(s.expect("the forward pass keeps its state when asked to"))
                    })?,
                };
                Ok(backward::<T>(
                    saved,
                    h,
                    w,
                    &self.targets,
                    T::from_f64(g),
                    self.bf16_products,
                    dw,
                    db,
                ))
            })
        })?;
        Ok((
            Tensor::from_vec(dh, hidden.shape(), hidden.device())?,
            dw_sum_sq,
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

/// A reusable buffer per element type for the logits (see the module docs). The f32 view the
/// bf16 products need is [`Float::as_f32`] (`None` for f64, which never takes that path).
trait Pooled: Float {
    fn pool() -> &'static Mutex<Vec<Self>>;
}
impl Pooled for f32 {
    fn pool() -> &'static Mutex<Vec<f32>> {
        static P: Mutex<Vec<f32>> = Mutex::new(Vec::new());
        &P
    }
}
impl Pooled for f64 {
    fn pool() -> &'static Mutex<Vec<f64>> {
        static P: Mutex<Vec<f64>> = Mutex::new(Vec::new());
        &P
    }
}

fn take_scratch<T: Pooled>(len: usize) -> Vec<T> {
    let v = std::mem::take(&mut *T::pool().lock().unwrap_or_else(|e| e.into_inner()));
    if v.len() >= len {
        v
    } else {
        drop(v);
        vec![T::ZERO; len]
    }
}

fn give_back_scratch<T: Pooled>(v: Vec<T>) {
    let mut p = T::pool().lock().unwrap_or_else(|e| e.into_inner());
    if v.len() > p.len() {
        *p = v;
    }
}

/// Per-row state of one thread's pass 1 over its blocks.
struct Partial<T> {
    /// Running max and sum of `exp(z - max)` over the thread's columns, per row.
    max: Vec<T>,
    sum: Vec<T>,
    /// The target's logit where this thread's blocks hold it, else 0.
    target_logit: Vec<T>,
    /// Per block and row, the block's max (what the stored exponentials are relative to).
    block_max: Vec<T>,
}

/// The columns `[v0, v1)` of blocks `blocks` of `block` columns.
fn cols(blocks: &Range<usize>, v: usize, block: usize) -> Range<usize> {
    (blocks.start * block).min(v)..(blocks.end * block).min(v)
}

/// The state pass 2 needs: the exponentials (`buf`, one region per thread range), each
/// block's max per row, every row's log-sum-exp. Dropping it returns `buf` to the pool.
struct Saved<T: Pooled> {
    buf: Vec<T>,
    /// `Full` or `Bf16`.
    store: Store,
    ranges: Vec<Range<usize>>,
    /// Columns per block.
    block: usize,
    block_max: Vec<Vec<T>>,
    lse: Vec<T>,
    count: usize,
    n: usize,
    c: usize,
    v: usize,
}

impl<T: Pooled> Drop for Saved<T> {
    fn drop(&mut self) {
        give_back_scratch(std::mem::take(&mut self.buf));
    }
}

/// Splits the `v.div_ceil(block)` blocks into one contiguous range per thread.
fn thread_ranges(n: usize, c: usize, v: usize, block: usize) -> Vec<Range<usize>> {
    super::split_ranges(v.div_ceil(block), n * c * v, MIN_PARALLEL_MACS)
}

/// What pass 1 keeps of the exponentials for pass 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Store {
    /// Nothing (no backward pass follows): one block per thread in cache.
    None,
    /// All of them, in the element type.
    Full,
    /// All of them rounded to bf16, two per f32 slot (the bf16 path, whose products round
    /// `P` to bf16 anyway): half the memory traffic of `Full`.
    Bf16,
}

/// Splits `buf` into the threads' regions: all their columns' exponentials (`Full`, or
/// half as many slots for `Bf16`), else room for one block each.
fn regions<'a, T>(
    buf: &'a mut [T],
    ranges: &[Range<usize>],
    n: usize,
    v: usize,
    block: usize,
    store: Store,
) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(ranges.len());
    let mut rest = buf;
    for r in ranges {
        let len = match store {
            Store::None => n * block.min(v),
            Store::Full => n * cols(r, v, block).len(),
            Store::Bf16 => (n * cols(r, v, block).len()).div_ceil(2),
        };
        let (mine, tail) = rest.split_at_mut(len);
        out.push(mine);
        rest = tail;
    }
    out
}

/// Pass 1 on every thread: the loss (as f64) and, with `store`, the state for [`backward`].
#[allow(clippy::too_many_arguments)]
fn forward<T: Pooled>(
    h: &[T],
    w: &[T],
    b: &[T],
    n: usize,
    c: usize,
    v: usize,
    targets: &[Option<usize>],
    store: bool,
    bf16_products: bool,
) -> (f64, Option<Saved<T>>) {
    assert!(h.len() == n * c && w.len() == v * c && b.len() == v && targets.len() == n);
    let count = targets.iter().filter(|t| t.is_some()).count();
    let block = block_len(bf16_products);
    let ranges = thread_ranges(n, c, v, block);
    let kind = match (store, bf16_products) {
        (false, _) => Store::None,
        (true, false) => Store::Full,
        (true, true) => Store::Bf16,
    };
    let total = match kind {
        Store::None => ranges.len() * n * block.min(v),
        Store::Full => n * v,
        Store::Bf16 => ranges
            .iter()
            .map(|r| (n * cols(r, v, block).len()).div_ceil(2))
            .sum(),
    };
    let mut buf = take_scratch::<T>(total);
    let regs = regions(&mut buf, &ranges, n, v, block, kind);
    let items: Vec<_> = ranges.iter().cloned().zip(regs).collect();
    // bf16 products: H^T as the right operand of every block's Z^T = W_j H^T, packed once.
    let h_t = T::as_f32(h).filter(|_| bf16_products).map(|h| {
        let mut packed = Vec::new();
        bf16::pack_pairs_of_cols(h, (n, c, c), &mut packed);
        packed
    });
    // gemm products: H^T (c x n) contiguous, so that gemm reads it in place instead of
    // packing H again for every block (see the module docs).
    let h_transposed = h_t.is_none().then(|| {
        let mut t = vec![T::ZERO; n * c];
        for (row, hr) in h.chunks_exact(c.max(1)).enumerate() {
            for (ci, &x) in hr.iter().enumerate() {
                t[ci * n + row] = x;
            }
        }
        t
    });
    let partials: Vec<Partial<T>> = run_threads(items, |(r, region)| {
        pass1(
            h,
            h_transposed.as_deref(),
            w,
            b,
            n,
            c,
            targets,
            cols(&r, v, block),
            block,
            region,
            kind,
            h_t.as_deref(),
        )
    });

    // Merge the threads' partial log-sum-exps; the loss.
    let mut lse = vec![T::ZERO; n];
    let mut loss = 0f64;
    for (row, l) in lse.iter_mut().enumerate() {
        let m = partials
            .iter()
            .map(|p| p.max[row])
            .fold(T::NEG_INFINITY, |a, x| if x > a { x } else { a });
        let mut s = T::ZERO;
        let mut tl = T::ZERO;
        for p in &partials {
            s += p.sum[row] * (p.max[row] - m).exp();
            tl += p.target_logit[row];
        }
        *l = m + s.ln();
        if targets[row].is_some() {
            loss += (*l - tl).to_f64();
        }
    }
    let loss = loss / count as f64;
    let saved = Saved {
        buf,
        store: kind,
        ranges,
        block,
        block_max: partials.into_iter().map(|p| p.block_max).collect(),
        lse,
        count,
        n,
        c,
        v,
    };
    // Without `store`, dropping `saved` here gives the buffer back.
    (loss, store.then_some(saved))
}

/// Pass 2 on every thread for an incoming gradient `g`: writes every element of `dw` and `db`
/// and returns `dh` and the sum of squares of `dw` (in f64).
#[allow(clippy::too_many_arguments)]
fn backward<T: Pooled>(
    mut saved: Saved<T>,
    h: &[T],
    w: &[T],
    targets: &[Option<usize>],
    g: T,
    bf16_products: bool,
    dw: &mut [T],
    db: &mut [T],
) -> (Vec<T>, f64) {
    let (n, c, v) = (saved.n, saved.c, saved.v);
    assert!(h.len() == n * c && w.len() == v * c && targets.len() == n);
    assert!(dw.len() == v * c && db.len() == v);
    // P = (softmax - onehot) * g / count on rows that count, 0 on ignored rows.
    let scale: Vec<T> = targets
        .iter()
        .map(|t| match t {
            Some(_) => g / T::from_f64(saved.count as f64),
            None => T::ZERO,
        })
        .collect();
    let (ranges, block) = (saved.ranges.clone(), saved.block);
    let store = saved.store;
    let regs = regions(&mut saved.buf, &ranges, n, v, block, store);
    let mut items = Vec::with_capacity(ranges.len());
    let (mut dw_rest, mut db_rest) = (dw, db);
    for ((r, region), bmax) in ranges.iter().zip(regs).zip(&saved.block_max) {
        let cols = cols(r, v, block);
        let (dw_mine, dw_tail) = dw_rest.split_at_mut(cols.len() * c);
        let (db_mine, db_tail) = db_rest.split_at_mut(cols.len());
        (dw_rest, db_rest) = (dw_tail, db_tail);
        items.push((cols, region, &bmax[..], dw_mine, db_mine));
    }
    let lse = &saved.lse;
    // bf16 products: H as the right operand of every block's dW_j = P_j^T H, packed once.
    let h_pairs = T::as_f32(h).filter(|_| bf16_products).map(|h| {
        let mut packed = Vec::new();
        bf16::pack_pairs_of_rows(h, (n, c, c), &mut packed);
        packed
    });
    let per_thread = run_threads(items, |(cols, region, block_max, dw, db)| {
        pass2(
            h,
            w,
            n,
            c,
            targets,
            lse,
            &scale,
            cols,
            block,
            region,
            store,
            block_max,
            dw,
            db,
            h_pairs.as_deref(),
        )
    });
    // dW's sum of squares, the threads' shares in thread order.
    let dw_sum_sq = per_thread.iter().map(|(_, sq)| sq).sum();
    // Sum the threads' dH^T (C x N) and transpose to dH (N x C).
    let mut dh_t = per_thread.into_iter().map(|(dh_t, _)| dh_t);
    let mut total = dh_t.next().expect("at least one thread");
    for other in dh_t {
        simd(
            #[inline(always)]
            || float::add_inplace(&mut total, &other),
        );
    }
    let mut dh = vec![T::ZERO; n * c];
    for (ci, col) in total.chunks_exact(n.max(1)).enumerate() {
        for (row, &x) in col.iter().enumerate() {
            dh[row * c + ci] = x;
        }
    }
    (dh, dw_sum_sq)
}
