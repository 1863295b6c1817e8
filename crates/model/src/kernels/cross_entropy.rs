//! The language model's output layer, log-softmax and negative log-likelihood, fused:
//! `loss = mean over non-ignored rows n of (logsumexp(z_n) - z_n[t_n])`, `z = h W^T + b`.
//!
//! # Why
//! This is the hot spot of the tutorial model: `(700 x 200) @ (200 x 33,278)` forward and two
//! more products of that size backward are about 90 % of a step's FLOPs (3 x 9.3 GFLOP).
//! Composed of candle primitives it also makes a dozen passes over the 93 MB `(N, V)` logits
//! (NOTES.md measured 290 ms for the bias gradient's `sum_keepdim(0)` alone and 171 ms for a
//! scalar multiply), plus transposed copies of the weight and fresh allocations that fault in
//! page by page. Measured numbers are in `examples/kernels_bench.rs` and the report in
//! [`crate::kernels`].
//!
//! # Design
//! - **Gradients are computed in the forward pass** when any input tracks gradients (the
//!   training case), and handed out by `bwd`, scaled by the incoming gradient. The loss is a
//!   scalar, so `d loss / d inputs` is all the backward pass ever needs; computing it while
//!   the logits are at hand costs exactly 3 matrix products (logits, `dH = P W`,
//!   `dW = P^T H`) and no recomputation. With no input tracking gradients (evaluation) only
//!   the logits product and the log-sum-exp run. If `bwd` runs a second time on the same
//!   graph, the gradients are recomputed from the inputs.
//! - **Vocabulary blocks of [`BLOCK`] columns.** Pass 1, per block: `z_j = H W_j^T` (gemm),
//!   add the bias, fold the block into a running (max, sum of exp) per row (online
//!   log-sum-exp) and pick the target logits. Pass 2, once the log-sum-exp of every row is
//!   known, per block: `P_j = softmax - onehot` scaled by `1/count` in place, its column sums
//!   are `dbias_j`, then `dW_j = P_j^T H` (written once, never accumulated) and
//!   `dH += P_j W_j`. All three products read the weight and the logits in place through
//!   strides: no transposed copies.
//! - **The logits are stored** (block-major, `N x V`, 93 MB at the tutorial's shapes) between
//!   the two passes in a buffer reused across calls, rather than recomputed in pass 2
//!   (a 4th product of 9.3 GFLOP, about 70 ms here, against about 15 ms of memory traffic).
//!   The buffer is kept for the next call (no page faults); [`release_scratch`] frees it.
//! - **Threads:** the vocabulary is split into one contiguous range of blocks per thread
//!   (`std::thread::scope`, 2 threads here), each running single-threaded gemm calls on its
//!   own blocks; the partial log-sum-exps are merged between the passes and the per-thread
//!   `dH` summed at the end. Measured faster than one thread driving gemm's own rayon
//!   parallelism per call (221 vs 236 ms for the three products; rayon is not used).
//!
//! # Loss semantics
//! Identical to PyTorch's `CrossEntropyLoss(reduction="mean", ignore_index=i)` on the logits
//! `h W^T + b`: the mean over rows whose target is not `ignore_index` of
//! `-log_softmax(logits)[target]`. Ignored rows contribute nothing to the loss or to any
//! gradient. If every row is ignored the loss is NaN (0/0, as PyTorch) and the gradients are
//! zero (as PyTorch's). A target outside `0..V` that is not `ignore_index` is an error.

use super::float::{self, simd, Float};
use super::{cpu_slice, fused_applies, num_threads, run_parallel, with_slice};
use candle_core::{bail, CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor, D};
use std::ops::Range;
use std::sync::Mutex;

/// Vocabulary columns per block. A block of logits for the 700 rows is 1.4 MB (f32), which
/// stays in this CPU's 2 MB L2 between the product that writes it and the pass that reads it.
/// Measured for the three products at the tutorial's shapes (2 threads): 256: 250 ms,
/// 512: 221 ms, 1024: 232 ms, 2048: 247 ms.
pub const BLOCK: usize = 512;

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
    let (n, c, v) = check_shapes(hidden, weight, bias, targets)?;
    if !fused_applies(&[hidden, weight, bias]) {
        return linear_cross_entropy_reference(hidden, weight, bias, targets, ignore_index);
    }
    let targets = prepare_targets(targets, v, ignore_index)?;
    let want_grad = hidden.track_op() || weight.track_op() || bias.track_op();
    let h = hidden.reshape((n, c))?.contiguous()?;
    let op = LinearCrossEntropy {
        targets,
        want_grad,
        saved: Mutex::new(None),
    };
    h.apply_op3(&weight.contiguous()?, &bias.contiguous()?, op)
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
    let logits = hidden
        .reshape((n, c))?
        .matmul(&weight.t()?)?
        .broadcast_add(bias)?;
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
    let n = if c == 0 { 0 } else { hidden.elem_count() / c };
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

/// Gradients with respect to (hidden, weight, bias) of the mean loss, for an incoming gradient
/// of 1.
enum Grads {
    F32(Vec<f32>, Vec<f32>, Vec<f32>),
    F64(Vec<f64>, Vec<f64>, Vec<f64>),
}

struct LinearCrossEntropy {
    targets: Vec<Option<usize>>,
    want_grad: bool,
    saved: Mutex<Option<Grads>>,
}

impl CustomOp3 for LinearCrossEntropy {
    fn name(&self) -> &'static str {
        "kernels-linear-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n, c) = match l1.dims() {
            &[n, c] => (n, c),
            d => bail!("kernels-linear-cross-entropy: hidden {d:?} is not (N, C)"),
        };
        let v = l3.dims()[0];
        let storage = match s1 {
            CpuStorage::F32(_) => {
                let (h, w, b) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?);
                let (loss, grads) = compute::<f32>(h, w, b, n, c, v, &self.targets, self.want_grad);
                if let Some((dh, dw, db)) = grads {
                    *self.saved.lock().unwrap() = Some(Grads::F32(dh, dw, db));
                }
                CpuStorage::F32(vec![loss as f32])
            }
            CpuStorage::F64(_) => {
                let (h, w, b) = (cpu_slice(s1, l1)?, cpu_slice(s2, l2)?, cpu_slice(s3, l3)?);
                let (loss, grads) = compute::<f64>(h, w, b, n, c, v, &self.targets, self.want_grad);
                if let Some((dh, dw, db)) = grads {
                    *self.saved.lock().unwrap() = Some(Grads::F64(dh, dw, db));
                }
                CpuStorage::F64(vec![loss])
            }
            _ => bail!("kernels-linear-cross-entropy: only f32 and f64"),
        };
        Ok((storage, Shape::from(())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        _loss: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let g = grad.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let saved = self.saved.lock().unwrap().take();
        let saved = match saved {
            Some(s) => s,
            // Backward a second time (or the forward ran with no input tracking gradients):
            // recompute from the inputs.
            None => recompute(hidden, weight, bias, &self.targets)?,
        };
        let dev = hidden.device();
        let (dh, dw, db) = match saved {
            Grads::F32(dh, dw, db) => finish(dh, dw, db, g as f32, hidden, weight, bias, dev)?,
            Grads::F64(dh, dw, db) => finish(dh, dw, db, g, hidden, weight, bias, dev)?,
        };
        Ok((Some(dh), Some(dw), Some(db)))
    }
}

/// Scales the gradients by the incoming gradient (skipped when it is 1, the usual case of
/// `loss.backward()`) and wraps them without copying.
#[allow(clippy::too_many_arguments)]
fn finish<T: Float>(
    mut dh: Vec<T>,
    mut dw: Vec<T>,
    mut db: Vec<T>,
    g: T,
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    dev: &Device,
) -> Result<(Tensor, Tensor, Tensor)> {
    if g != T::ONE {
        for x in [&mut dh, &mut dw, &mut db] {
            super::par_rows(x, 1, 1 << 20, |_, part| {
                simd(
                    #[inline(always)]
                    || float::scale_inplace(part, g),
                )
            });
        }
    }
    Ok((
        Tensor::from_vec(dh, hidden.shape(), dev)?,
        Tensor::from_vec(dw, weight.shape(), dev)?,
        Tensor::from_vec(db, bias.shape(), dev)?,
    ))
}

fn recompute(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &[Option<usize>],
) -> Result<Grads> {
    let (n, c) = hidden.dims2()?;
    let v = weight.dim(0)?;
    fn go<T: Pooled>(
        hidden: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        n: usize,
        c: usize,
        v: usize,
        targets: &[Option<usize>],
    ) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
        with_slice::<T, _>(hidden, |h| {
            with_slice::<T, _>(weight, |w| {
                with_slice::<T, _>(bias, |b| {
                    let (_, grads) = compute::<T>(h, w, b, n, c, v, targets, true);
                    Ok(grads.expect("gradients were requested"))
                })
            })
        })
    }
    Ok(match hidden.dtype() {
        DType::F32 => {
            let (a, b, c) = go::<f32>(hidden, weight, bias, n, c, v, targets)?;
            Grads::F32(a, b, c)
        }
        DType::F64 => {
            let (a, b, c) = go::<f64>(hidden, weight, bias, n, c, v, targets)?;
            Grads::F64(a, b, c)
        }
        dt => bail!("kernels-linear-cross-entropy: unsupported dtype {dt:?}"),
    })
}

// ---------------------------------------------------------------------------------------------
// The kernel
// ---------------------------------------------------------------------------------------------

/// A reusable buffer per element type for the logits (see the module docs).
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

/// A strided matrix view for [`gemm`]: element `(i, j)` is `data[i * rs + j * cs]`.
struct Mat<P> {
    ptr: P,
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a, T> Mat<&'a [T]> {
    fn new(data: &'a [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        check_extent(data.len(), rows, cols, rs, cs);
        Mat { ptr: data, rows, cols, rs, cs }
    }
}

impl<'a, T> Mat<&'a mut [T]> {
    fn new_mut(data: &'a mut [T], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        check_extent(data.len(), rows, cols, rs, cs);
        Mat { ptr: data, rows, cols, rs, cs }
    }
}

fn check_extent(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) {
    if rows > 0 && cols > 0 {
        assert!(
            (rows - 1) * rs + (cols - 1) * cs < len,
            "matrix view {rows}x{cols} (strides {rs}, {cs}) outside a slice of {len}"
        );
    }
}

/// `dst (+)= lhs @ rhs` through the `gemm` crate, single-threaded: the kernel already runs
/// one gemm per thread. The extents are checked when the views are built, and `dst` is a
/// `&mut` borrow, so it cannot overlap the inputs.
fn gemm<T: Float>(dst: Mat<&mut [T]>, accumulate: bool, lhs: Mat<&[T]>, rhs: Mat<&[T]>) {
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    assert!(lhs.rows == m && rhs.rows == k && rhs.cols == n, "gemm shapes disagree");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: every element addressed by the sizes and strides lies inside the slices
    // (check_extent), dst is exclusively borrowed, and T is f32 or f64, which gemm supports.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr.as_mut_ptr(),
            dst.cs as isize,
            dst.rs as isize,
            accumulate,
            lhs.ptr.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::ONE,
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
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

/// The columns `[v0, v1)` of blocks `blocks`.
fn cols(blocks: &Range<usize>, v: usize) -> Range<usize> {
    (blocks.start * BLOCK).min(v)..(blocks.end * BLOCK).min(v)
}

/// Loss (as f64) and, if `want_grad`, the gradients `(dh, dw, db)` for an incoming gradient
/// of 1.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn compute<T: Pooled>(
    h: &[T],
    w: &[T],
    b: &[T],
    n: usize,
    c: usize,
    v: usize,
    targets: &[Option<usize>],
    want_grad: bool,
) -> (f64, Option<(Vec<T>, Vec<T>, Vec<T>)>) {
    assert!(h.len() == n * c && w.len() == v * c && b.len() == v && targets.len() == n);
    let count = targets.iter().filter(|t| t.is_some()).count();
    if n == 0 || v == 0 {
        let grads =
            want_grad.then(|| (vec![T::ZERO; n * c], vec![T::ZERO; v * c], vec![T::ZERO; v]));
        return (f64::NAN, grads);
    }
    let blocks = v.div_ceil(BLOCK);
    let threads = if n * c * v < MIN_PARALLEL_MACS {
        1
    } else {
        num_threads().min(blocks).max(1)
    };
    let ranges: Vec<Range<usize>> = (0..threads)
        .map(|t| t * blocks / threads..(t + 1) * blocks / threads)
        .collect();

    // Exponentiated logits: all of them (block after block, each transposed, `len x n`) when
    // pass 2 needs them, else one block per thread.
    let per_thread = |r: &Range<usize>| {
        if want_grad {
            n * cols(r, v).len()
        } else {
            n * BLOCK.min(v)
        }
    };
    let mut buf = take_scratch::<T>(ranges.iter().map(per_thread).sum());
    let mut regions: Vec<&mut [T]> = Vec::with_capacity(threads);
    let mut rest = &mut buf[..];
    for r in &ranges {
        let (mine, tail) = rest.split_at_mut(per_thread(r));
        regions.push(mine);
        rest = tail;
    }

    // Pass 1: logits, exponentials, per-row log-sum-exp state, target logits.
    let items: Vec<_> = ranges.iter().cloned().zip(regions).collect();
    let (partials, regions): (Vec<Partial<T>>, Vec<&mut [T]>) =
        run_parallel(items, |(r, region)| {
            let p = pass1(h, w, b, n, c, targets, cols(&r, v), region, want_grad);
            (p, region)
        })
        .into_iter()
        .unzip();

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
    if !want_grad {
        give_back_scratch(buf);
        return (loss, None);
    }

    // Pass 2: P = (softmax - onehot) / count; dbias, dW (per block), dH (per thread, summed).
    let scale: Vec<T> = targets
        .iter()
        .map(|t| match t {
            Some(_) => T::ONE / T::from_f64(count as f64),
            None => T::ZERO,
        })
        .collect();
    let mut dw = vec![T::ZERO; v * c];
    let mut db = vec![T::ZERO; v];
    let mut items = Vec::with_capacity(threads);
    let (mut dw_rest, mut db_rest) = (&mut dw[..], &mut db[..]);
    for ((r, region), p) in ranges.iter().zip(regions).zip(&partials) {
        let cols = cols(r, v);
        let (dw_mine, dw_tail) = dw_rest.split_at_mut(cols.len() * c);
        let (db_mine, db_tail) = db_rest.split_at_mut(cols.len());
        (dw_rest, db_rest) = (dw_tail, db_tail);
        items.push((cols, region, &p.block_max[..], dw_mine, db_mine));
    }
    let dh_t = run_parallel(items, |(cols, region, block_max, dw, db)| {
        pass2(h, w, n, c, targets, &lse, &scale, cols, region, block_max, dw, db)
    });
    // Sum the threads' dH^T (C x N) and transpose to dH (N x C).
    let mut dh_t = dh_t.into_iter();
    let mut total = dh_t.next().expect("at least one thread");
    for other in dh_t {
        simd(
            #[inline(always)]
            || float::add_inplace(&mut total, &other),
        );
    }
    let mut dh = vec![T::ZERO; n * c];
    for (ci, col) in total.chunks_exact(n).enumerate() {
        for (row, &x) in col.iter().enumerate() {
            dh[row * c + ci] = x;
        }
    }
    give_back_scratch(buf);
    (loss, Some((dh, dw, db)))
}

/// Pass 1 over the columns `cols`, block by block: `Z_j^T = W_j H^T + b_j` (`len x n`, so that
/// the per-row reductions run along contiguous memory), the block max per row, `exp(z - max)`
/// in place and its sum per row, folded into the running (max, sum) per row. With `store`,
/// block `j` is left in `region` at `n * (v0_j - cols.start)`; else `region` holds one block
/// at a time.
#[allow(clippy::too_many_arguments)]
fn pass1<T: Float>(
    h: &[T],
    w: &[T],
    b: &[T],
    n: usize,
    c: usize,
    targets: &[Option<usize>],
    cols: Range<usize>,
    region: &mut [T],
    store: bool,
) -> Partial<T> {
    let mut p = Partial {
        max: vec![T::NEG_INFINITY; n],
        sum: vec![T::ZERO; n],
        target_logit: vec![T::ZERO; n],
        block_max: vec![T::NEG_INFINITY; n * cols.len().div_ceil(BLOCK)],
    };
    let mut block_sum = vec![T::ZERO; n];
    let mut v0 = cols.start;
    let mut j = 0;
    while v0 < cols.end {
        let len = BLOCK.min(cols.end - v0);
        let off = if store { n * (v0 - cols.start) } else { 0 };
        let z = &mut region[off..off + n * len];
        // Z^T (len x n, row stride n) = W_j (len x c) @ H^T (c x n): both read in place.
        gemm(
            Mat::new_mut(&mut *z, len, n, n, 1),
            false,
            Mat::new(&w[v0 * c..(v0 + len) * c], len, c, c, 1),
            Mat::new(h, c, n, 1, c),
        );
        let bias = &b[v0..v0 + len];
        let bmax = &mut p.block_max[j * n..(j + 1) * n];
        simd(
            #[inline(always)]
            || {
                // Bias and the running max over the block, one pass.
                for (zr, &bv) in z.chunks_exact_mut(n).zip(bias) {
                    for (x, m) in zr.iter_mut().zip(bmax.iter_mut()) {
                        *x += bv;
                        *m = if *x > *m { *x } else { *m };
                    }
                }
                for (row, t) in targets.iter().enumerate() {
                    if let Some(t) = *t {
                        if (v0..v0 + len).contains(&t) {
                            p.target_logit[row] = z[(t - v0) * n + row];
                        }
                    }
                }
                // exp(z - block max), stored for pass 2, summed per row.
                block_sum.fill(T::ZERO);
                for zr in z.chunks_exact_mut(n) {
                    for ((x, &m), s) in zr.iter_mut().zip(bmax.iter()).zip(block_sum.iter_mut()) {
                        let e = (*x - m).exp();
                        *x = e;
                        *s += e;
                    }
                }
                // Online log-sum-exp: fold the block into the running state.
                for row in 0..n {
                    let (m, s, bm, bs) = (p.max[row], p.sum[row], bmax[row], block_sum[row]);
                    if bm > m {
                        p.sum[row] = s * (m - bm).exp() + bs;
                        p.max[row] = bm;
                    } else {
                        p.sum[row] = s + bs * (bm - m).exp();
                    }
                }
            },
        );
        v0 += len;
        j += 1;
    }
    p
}

/// Pass 2 over the columns `cols`, whose exponentials pass 1 left in `region`: turns block
/// `j` into `P_j^T = (softmax - onehot)^T * scale` in place (`exp(z - block max)` times the
/// per-row factor `exp(block max - lse) * scale`; no second exponential per element), writes
/// `db` (entries `cols` of dbias) and `dw` (rows `cols` of dW, each block written once) and
/// returns this thread's `dH^T = sum_j (P_j W_j)^T` (C x N).
#[allow(clippy::too_many_arguments)]
fn pass2<T: Float>(
    h: &[T],
    w: &[T],
    n: usize,
    c: usize,
    targets: &[Option<usize>],
    lse: &[T],
    scale: &[T],
    cols: Range<usize>,
    region: &mut [T],
    block_max: &[T],
    dw: &mut [T],
    db: &mut [T],
) -> Vec<T> {
    let mut dh_t = vec![T::ZERO; c * n];
    let mut factor = vec![T::ZERO; n];
    let mut v0 = cols.start;
    let mut j = 0;
    while v0 < cols.end {
        let len = BLOCK.min(cols.end - v0);
        let local = v0 - cols.start;
        let p = &mut region[n * local..n * (local + len)];
        let db = &mut db[local..local + len];
        let bmax = &block_max[j * n..(j + 1) * n];
        simd(
            #[inline(always)]
            || {
                for (((f, &m), &l), &s) in factor.iter_mut().zip(bmax).zip(lse).zip(scale) {
                    *f = if s == T::ZERO { T::ZERO } else { (m - l).exp() * s };
                }
                for (pr, d) in p.chunks_exact_mut(n).zip(db.iter_mut()) {
                    for (x, &f) in pr.iter_mut().zip(factor.iter()) {
                        *x *= f;
                    }
                    *d = float::row_sum(pr);
                }
                for (row, (t, &s)) in targets.iter().zip(scale).enumerate() {
                    if let Some(t) = *t {
                        if (v0..v0 + len).contains(&t) {
                            p[(t - v0) * n + row] -= s;
                            db[t - v0] -= s;
                        }
                    }
                }
            },
        );
        let p = &*p;
        // dW_j (len x c) = P_j^T (len x n) @ H (n x c).
        gemm(
            Mat::new_mut(&mut dw[local * c..(local + len) * c], len, c, c, 1),
            false,
            Mat::new(p, len, n, n, 1),
            Mat::new(h, n, c, c, 1),
        );
        // dH^T (n x c, stored column-major) += P_j (n x len) @ W_j (len x c).
        gemm(
            Mat::new_mut(&mut dh_t, n, c, 1, n),
            j > 0,
            Mat::new(p, n, len, 1, n),
            Mat::new(&w[v0 * c..(v0 + len) * c], len, c, c, 1),
        );
        v0 += len;
        j += 1;
    }
    dh_t
}
