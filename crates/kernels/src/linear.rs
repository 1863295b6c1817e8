//! A linear layer, `y = x W^T + b`, fused: the bias is the product's starting value, and the
//! backward pass computes `dx = dy W`, `dW = dy^T x` and `db = sum_rows(dy)` straight from
//! the operands' own layouts.
//!
//! # Why
//! Composed in candle, `x.matmul(&w.t()?)?.broadcast_add(&b)?` costs in the backward pass a
//! `sum_keepdim(0)` for the bias (candle's reduction over a leading dimension walks the
//! tensor element by element with index arithmetic), a gradient for `w.t()` that candle
//! transposes back and adds into a fresh zero tensor through its strided (slow) path, and
//! fresh tensors for every intermediate. The tutorial LM has 12 such layers in its encoder:
//! `perf` put candle's reductions alone at about 4% of a training step.
//!
//! # Exactness
//! Same products as candle's matmul (the `gemm` crate, whose sums run in its own blocked
//! order); the bias gradient sums rows in order, as candle's reduction does. Checked against
//! [`linear_reference`] forward and for every gradient (`tests/kernels.rs`).

use super::float::{self, simd, Float};
use super::matmul::{gemm, Mat};
use super::small_rows;
use super::{cpu_fwd3, fused_applies, num_threads, run_parallel, with_slice, Forward3};
use super::{given, grads3, Backward3, CpuArgs3, Grads3, Kernel3, Op3, Tensors3};
use candle_core::{bail, CpuStorage, DType, Result, Shape, Tensor};

/// Multiply-adds per thread below which the kernel stays on the calling thread.
const MIN_PARALLEL_WORK: usize = 1 << 20;

/// `x W^T + b` with a hand-written backward pass giving the gradients of all three.
///
/// CPU f32/f64 run the fused kernel; other devices and dtypes run [`linear_reference`].
///
/// # Shapes
/// - x: (..., K), weight: (M, K), bias: (M,)
/// - -> (..., M)
pub fn linear(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (m, k) = weight.dims2()?;
    let dims = x.dims();
    if dims.last() != Some(&k) || bias.dims() != [m] {
        bail!(
            "linear: x {dims:?} needs a last dimension of {k} and bias ({m},) for weight \
             ({m}, {k}); got bias {:?}",
            bias.dims()
        );
    }
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("checked above") = m;
    if !fused_applies(&[x, weight, bias]) {
        return linear_reference(x, weight, bias);
    }
    let rows = x.elem_count() / k.max(1);
    x.reshape((rows, k))?
        .contiguous()?
        .apply_op3(&weight.contiguous()?, &bias.contiguous()?, Op3(LinearOp))?
        .reshape(out_dims)
}

/// The same layer composed of candle primitives with backward passes.
pub fn linear_reference(x: &Tensor, weight: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (m, k) = weight.dims2()?;
    let mut out_dims = x.dims().to_vec();
    if let Some(last) = out_dims.last_mut() {
        *last = m;
    }
    let rows = x.elem_count() / k.max(1);
    crate::autocast::matmul(&x.reshape((rows, k))?, &weight.t()?)?
        .broadcast_add(bias)?
        .reshape(out_dims)
}

struct LinearOp;

impl Kernel3 for LinearOp {
    const NAME: &'static str = "kernels-linear";

    fn forward(&self, [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        let (n, m) = (l1.dims()[0], l2.dims()[0]);
        let out = cpu_fwd3(&Dims { n, m }, Self::NAME, [(s1, l1), (s2, l2), (s3, l3)])?;
        Ok((out, Shape::from((n, m))))
    }

    fn backward(&self, inputs: [&Tensor; 3], _y: &Tensor, dy: &Tensor) -> Result<Grads3> {
        grads3(self, Self::NAME, inputs, dy).map(given)
    }
}

impl Backward3 for LinearOp {
    fn grads<T: Float>(&self, [x, weight, bias]: [&Tensor; 3], dy: &Tensor) -> Result<Tensors3> {
        tensors(backward::<T>(x, weight, dy)?, x, weight, bias)
    }
}

/// The three gradients as tensors shaped like `x`, `weight` and `bias`.
fn tensors<T: Float>(
    (dx, dw, db): (Vec<T>, Vec<T>, Vec<T>),
    x: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let dev = x.device();
    Ok((
        Tensor::from_vec(dx, x.shape(), dev)?,
        Tensor::from_vec(dw, weight.shape(), dev)?,
        Tensor::from_vec(db, bias.shape(), dev)?,
    ))
}

/// Row ranges of an `rows x cols` output with `depth`-long dot products, one per thread.
fn row_split(rows: usize, cols: usize, depth: usize) -> Vec<std::ops::Range<usize>> {
    let threads = num_threads()
        .min(rows * cols * depth / MIN_PARALLEL_WORK)
        .min(rows)
        .max(1);
    (0..threads)
        .map(|i| i * rows / threads..(i + 1) * rows / threads)
        .collect()
}

/// Splits `out` (`rows x width`, row-major) at the given row ranges.
fn split_rows<'a, T>(
    mut out: &'a mut [T],
    ranges: &[std::ops::Range<usize>],
    width: usize,
) -> Vec<(std::ops::Range<usize>, &'a mut [T])> {
    let mut parts = Vec::with_capacity(ranges.len());
    for r in ranges {
        let (mine, rest) = out.split_at_mut(r.len() * width);
        parts.push((r.clone(), mine));
        out = rest;
    }
    parts
}

/// The sizes of one call: `n` rows, `m` outputs.
struct Dims {
    n: usize,
    m: usize,
}

impl Forward3 for Dims {
    fn run<T: Float>(&self, x: &[T], w: &[T], b: &[T]) -> Vec<T> {
        forward(x, w, b, self.n, self.m)
    }
}

/// `y (n x m) = b + x (n x k) @ W^T`, rows split over the threads.
fn forward<T: Float>(x: &[T], w: &[T], b: &[T], n: usize, m: usize) -> Vec<T> {
    let k = w.len() / m.max(1);
    let mut y = vec![T::ZERO; n * m];
    let ranges = row_split(n, m, k);
    run_parallel(split_rows(&mut y, &ranges, m), |(rows, y)| {
        rows_forward(y, &x[rows.start * k..rows.end * k], w, b, rows.len(), m, k);
    });
    y
}

/// One thread's share of the layer: `y = b + x W^T` for `n` rows, x (n x k), W (m x k),
/// y (n x m), single-threaded (also the fused encoder layer's projections). f32 with 2 to
/// [`small_rows::MAX_ROWS`] rows runs [`small_rows`], which reads `W` without gemm's packing.
pub(super) fn rows_forward<T: Float>(
    y: &mut [T],
    x: &[T],
    w: &[T],
    b: &[T],
    n: usize,
    m: usize,
    k: usize,
) {
    if T::DTYPE == DType::F32 && (2..=small_rows::MAX_ROWS).contains(&n) && float::avx512() {
        // SAFETY: T is f32 (its DTYPE says so), so the slices are f32 slices.
        let f = |s: &[T]| unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<f32>(), s.len()) };
        // SAFETY: as above, and `y` is exclusively borrowed.
        let y = unsafe { std::slice::from_raw_parts_mut(y.as_mut_ptr().cast::<f32>(), y.len()) };
        return small_rows::forward(y, f(x), f(w), f(b), n, m, k);
    }
    bias_rows(y, b);
    gemm(
        Mat::new_mut(y, n, m, m, 1),
        true,
        Mat::new(x, n, k, k, 1),
        // W^T (k x m): element (i, j) is W[j][i].
        Mat::new(w, k, m, 1, k),
        T::ONE,
    );
}

/// Every row of `y` (rows of `b.len()`) set to the bias `b`: where a product then adds in.
pub(super) fn bias_rows<T: Float>(y: &mut [T], b: &[T]) {
    for row in y.chunks_exact_mut(b.len().max(1)) {
        row.copy_from_slice(b);
    }
}

/// `dx (+)= dy W` for `n` rows: dy (n x m), W (m x k), dx (n x k), single-threaded.
pub(super) fn rows_input_grad<T: Float>(
    dx: &mut [T],
    accumulate: bool,
    dy: &[T],
    w: &[T],
    n: usize,
    m: usize,
) {
    let k = w.len() / m.max(1);
    gemm(
        Mat::new_mut(dx, n, k, k, 1),
        accumulate,
        Mat::new(dy, n, m, m, 1),
        Mat::new(w, m, k, k, 1),
        T::ONE,
    );
}

/// Rows `rows` of `dW = dy^T x` (overwritten into `dw`, `rows.len() x k`) over all `n`
/// rows of dy (n x m) and x (n x k), single-threaded.
pub(super) fn weight_grad_rows<T: Float>(
    dw: &mut [T],
    rows: std::ops::Range<usize>,
    dy: &[T],
    x: &[T],
    n: usize,
    m: usize,
    k: usize,
) {
    gemm(
        Mat::new_mut(dw, rows.len(), k, k, 1),
        false,
        // dy^T restricted to rows `rows` of dW: element (i, j) is dy[j][i].
        Mat::new(&dy[rows.start..], rows.len(), n, 1, m),
        Mat::new(x, n, k, k, 1),
        T::ONE,
    );
}

/// `db += sum_rows(dy)`, row by row in order (dy rows of `db.len()`).
pub(super) fn bias_grad_add<T: Float>(db: &mut [T], dy: &[T]) {
    let m = db.len().max(1);
    simd(
        #[inline(always)]
        || {
            for row in dy.chunks_exact(m) {
                float::add_inplace(db, row);
            }
        },
    );
}

/// `(dx, dW, db)` for the incoming gradient `dy` (n x m).
fn backward<T: Float>(
    x: &Tensor,
    weight: &Tensor,
    dy: &Tensor,
) -> Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (n, k) = x.dims2()?;
    let m = weight.dim(0)?;
    with_slice::<T, _>(x, |x| {
        with_slice::<T, _>(weight, |w| {
            with_slice::<T, _>(dy, |g| {
                // dx (n x k) = dy (n x m) @ W (m x k), rows split over the threads.
                let mut dx = vec![T::ZERO; n * k];
                let ranges = row_split(n, k, m);
                run_parallel(split_rows(&mut dx, &ranges, k), |(rows, dx)| {
                    let g = &g[rows.start * m..rows.end * m];
                    rows_input_grad(dx, false, g, w, rows.len(), m);
                });
                // dW (m x k) = dy^T (m x n) @ x (n x k), rows of dW split over the threads;
                // the first thread also sums db (row by row, in order).
                let mut dw = vec![T::ZERO; m * k];
                let mut db = vec![T::ZERO; m];
                let ranges = row_split(m, k, n);
                let mut parts = split_rows(&mut dw, &ranges, k);
                let first = parts.remove(0);
                let mut items: Vec<_> = vec![(first.0, first.1, Some(&mut db[..]))];
                items.extend(parts.into_iter().map(|(r, d)| (r, d, None)));
                run_parallel(items, |(rows, dw, db)| {
                    weight_grad_rows(dw, rows, g, x, n, m, k);
                    if let Some(db) = db {
                        bias_grad_add(db, g);
                    }
                });
                Ok((dx, dw, db))
            })
        })
    })
}
