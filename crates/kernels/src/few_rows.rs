//! A linear layer `x W^T + b` for a few rows of `x`: the language model's output layer while
//! decoding, one token per sequence against the whole vocabulary.
//!
//! # Why
//! With one row the product is a matrix-vector product that reads all of `W` (23 MB for the
//! tutorial's 28,782 x 200) once per token; it is bound by memory bandwidth, not arithmetic.
//! candle sends it through gemm's general path, which packs blocks of `W^T` before using them.
//! Here each vocabulary row of `W` is read in place, once, by one AVX-512 dot product per row
//! of `x`, the vocabulary split between candle's pool threads. At one row, C 200, V 33,278:
//! 0.84 ms against 1.39 ms for candle's matmul + bias (`W` read at 32 GB/s;
//! `examples/kernels_bench.rs`).
//!
//! The backward pass is the usual one, composed of candle matmuls (decoding never takes it,
//! but the op must not drop gradients).

use super::float::{simd, Float};
use super::matmul::{gemm, unpacked_row_chunks, Mat};
use super::{cpu_fwd3, fused_applies, run_parallel, Forward3};
use super::{CpuArgs3, Grads3, Kernel3, Op3};
use candle_core::{bail, CpuStorage, Result, Shape, Tensor};

/// Rows up to which [`linear_few_rows`] runs its own kernel (above, candle's matmul).
pub(crate) const MAX_ROWS: usize = 8;

/// Vocabulary rows per work item (about 100 KB of `W` at C = 200).
const CHUNK: usize = 128;

/// `x W^T + b` with `x` (N, C), `W` (V, C), `b` (V,) -> (N, V). For N up to 8 on
/// CPU f32/f64 a dedicated kernel, otherwise candle's matmul; the same values either way up
/// to the order of additions.
pub fn linear_few_rows(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (n, _, _) = linear_dims("linear_few_rows", x, w, b, false)?;
    if n > MAX_ROWS || !fused_applies(&[x, w, b]) {
        return linear_few_rows_reference(x, w, b);
    }
    x.contiguous()?
        .apply_op3(&w.contiguous()?, &b.contiguous()?, Op3(FewRows))
}

/// `(N, C, V)` of a linear layer's `x` (N, C), weight `w` (V, C), or (C, V) when
/// `transposed`, and bias `b` (V,); an error naming `name` where they disagree.
fn linear_dims(
    name: &str,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    transposed: bool,
) -> Result<(usize, usize, usize)> {
    let (n, c) = x.dims2()?;
    let (rows, cols) = w.dims2()?;
    let (v, wc, w_name, w_shape) = match transposed {
        false => (rows, cols, "w", "(V, C)"),
        true => (cols, rows, "wt", "(C, V)"),
    };
    if wc != c || b.dims() != [v] {
        bail!(
            "{name}: x {:?} (N, C), {w_name} {:?} {w_shape}, b {:?} (V,) disagree",
            x.dims(),
            w.dims(),
            b.dims()
        );
    }
    Ok((n, c, v))
}

/// The same with candle primitives: `x.matmul(w.t()) + b`.
pub fn linear_few_rows_reference(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)?.broadcast_add(b)
}

struct FewRows;

impl Kernel3 for FewRows {
    const NAME: &'static str = "kernels-linear-few-rows";

    fn forward(&self, [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        let (n, c) = (l1.dims()[0], l1.dims()[1]);
        let v = l2.dims()[0];
        let storage = cpu_fwd3(
            &Dims { n, c, v },
            Self::NAME,
            [(s1, l1), (s2, l2), (s3, l3)],
        )?;
        Ok((storage, Shape::from((n, v))))
    }

    fn backward(&self, [x, w, _b]: [&Tensor; 3], _out: &Tensor, grad: &Tensor) -> Result<Grads3> {
        Ok((
            Some(grad.matmul(w)?),
            Some(grad.t()?.matmul(x)?),
            Some(grad.sum(0)?),
        ))
    }
}

/// The sizes of one call: `n` rows of `c` inputs, `v` outputs.
struct Dims {
    n: usize,
    c: usize,
    v: usize,
}

impl Forward3 for Dims {
    fn run<T: Float>(&self, x: &[T], w: &[T], b: &[T]) -> Vec<T> {
        forward(x, w, b, self.n, self.c, self.v)
    }
}

/// One output of the layer, `x . w_r + b_r`: what [`forward`] computes for every output and
/// [`crate::ArgmaxScreen`] for the few it cannot rule out (the same value bit for bit).
#[inline(always)]
pub(crate) fn output<T: Float>(x: &[T], wr: &[T], br: T) -> T {
    T::dot(x, wr) + br
}

fn forward<T: Float>(x: &[T], w: &[T], b: &[T], n: usize, c: usize, v: usize) -> Vec<T> {
    let chunks: Vec<usize> = (0..v.div_ceil(CHUNK)).collect();
    // Each item: its vocabulary rows' outputs, (rows of the chunk) x N.
    let parts = run_parallel(chunks, |k| {
        let rows = k * CHUNK..((k + 1) * CHUNK).min(v);
        let mut out = Vec::with_capacity(rows.len() * n);
        simd(
            #[inline(always)]
            || {
                for r in rows {
                    let wr = &w[r * c..(r + 1) * c];
                    for xr in x.chunks_exact(c.max(1)).take(n) {
                        out.push(output(xr, wr, b[r]));
                    }
                }
            },
        );
        out
    });
    let mut y = vec![T::ZERO; n * v];
    for (k, part) in parts.iter().enumerate() {
        for (i, vals) in part.chunks_exact(n.max(1)).enumerate() {
            for (row, &val) in vals.iter().enumerate() {
                y[row * v + k * CHUNK + i] = val;
            }
        }
    }
    y
}

/// `x Wt + b` with the weight given transposed, `Wt = W^T` (C, V): the output layer for many
/// rows at a time (a beam search's hypotheses), where the caller keeps `W^T` for the steps of
/// a batch. CPU f32/f64: per block of vocabulary columns one product that reads `Wt` and `x`
/// in place (candle's matmul has gemm gather `W` element by element into its packed layout
/// at every step, 24% of a beam-search step), the blocks split between the pool's threads;
/// elsewhere `x.matmul(Wt) + b`.
///
/// # Shapes
/// x (N, C), wt (C, V), b (V,) -> (N, V)
pub fn linear_wt(x: &Tensor, wt: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (n, c, v) = linear_dims("linear_wt", x, wt, b, true)?;
    if !fused_applies(&[x, wt, b]) {
        return x.matmul(wt)?.broadcast_add(b);
    }
    let (x, wt, b) = (
        x.contiguous()?.detach(),
        wt.contiguous()?.detach(),
        b.detach(),
    );
    x.apply_op3_no_bwd(&wt, &b.contiguous()?, &Op3(Transposed { n, c, v }))
}

/// [`linear_wt`]'s op (forward only: decoding takes no gradient).
struct Transposed {
    n: usize,
    c: usize,
    v: usize,
}

/// Vocabulary columns per block of [`linear_wt`]: the block of `W^T` (`C x WT_BLOCK`, 512 KB
/// at C = 256) stays in a core's L2 cache while the thread's row chunks pass over it.
const WT_BLOCK: usize = 256;

impl Forward3 for Transposed {
    fn run<T: Float>(&self, x: &[T], wt: &[T], b: &[T]) -> Vec<T> {
        let (n, c, v) = (self.n, self.c, self.v);
        let blocks: Vec<usize> = (0..v.div_ceil(WT_BLOCK)).collect();
        // Each block of columns j: out_j (n x len, row-major) = x Wt_j, computed as gemm's
        // column-major (len x n) = Wt_j^T x^T with both operands read in place, in chunks of
        // rows that leave the weight unpacked (`unpacked_row_chunks`).
        let parts = run_parallel(blocks, |j| {
            let cols = j * WT_BLOCK..((j + 1) * WT_BLOCK).min(v);
            let len = cols.len();
            let mut out = vec![T::ZERO; n * len];
            simd(
                #[inline(always)]
                || {
                    for r in unpacked_row_chunks(n) {
                        gemm(
                            Mat::new_mut(&mut out[r.start * len..], len, r.len(), 1, len),
                            false,
                            Mat::new(&wt[cols.start..], len, c, 1, v),
                            Mat::new(&x[r.start * c..r.end * c], c, r.len(), 1, c),
                            T::ONE,
                        )
                    }
                },
            );
            out
        });
        let mut y = vec![T::ZERO; n * v];
        for (j, part) in parts.iter().enumerate() {
            let v0 = j * WT_BLOCK;
            let len = part.len() / n.max(1);
            for (row, vals) in part.chunks_exact(len.max(1)).enumerate() {
                let dst = &mut y[row * v + v0..row * v + v0 + len];
                for ((d, &z), &bias) in dst.iter_mut().zip(vals).zip(&b[v0..v0 + len]) {
                    *d = z + bias;
                }
            }
        }
        y
    }
}

impl Kernel3 for Transposed {
    const NAME: &'static str = "kernels-linear-wt";

    fn forward(&self, [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        let storage = cpu_fwd3(self, Self::NAME, [(s1, l1), (s2, l2), (s3, l3)])?;
        Ok((storage, Shape::from((self.n, self.v))))
    }
}
