//! Scaled dot-product attention fused into one op per call, for the short sequences of the
//! tutorial models (T = S = 35, H = 2, D = 100); the model uses it wherever the attention
//! weights are not asked for (the model's `attention::attention_output`):
//! `out = (softmax(scale * Q K^T, masked) * dropout) V`.
//!
//! Composed, candle runs about 8 ops forward (scale, transpose, batched matmul, mask add,
//! softmax, mask multiply, dropout, batched matmul) and about 20 backward, each a separate
//! tensor with candle's thread-pool hand-off, on matrices of only 35 x 35; most of the time is
//! overhead. Here each (batch, head) pair runs its 2 products forward and 5 backward through
//! `gemm` on strided views of the inputs (no transposed copies, and Q, K, V may be views with
//! the heads split out of a `(B, T, H, D)` tensor), the (batch, head) pairs split over
//! threads. The attention weights are not stored: backward recomputes them (one 35 x 35 x D
//! product per pair), which keeps the op stateless.
//!
//! Measured gain is modest: 3.9 vs 6.2 ms forward + backward for one layer's attention at
//! (20, 2, 35, 100) with a causal mask and dropout, against 5.3 ms for the composition with
//! the fused softmax (one thread, including a cotangent product and candle's gradient
//! bookkeeping; `examples/kernels_bench.rs`). At these sizes the matrix products are tiny and
//! most of the remaining time is allocation and bookkeeping, so about 1.5 to 2.5 ms a step for
//! the tutorial's two layers.

use super::float::{self, simd, Float};
use super::matmul::{gemm, Mat};
use super::softmax::softmax_last_dim_reference;
use super::{fused_applies, run_parallel, with_slice};
use super::{given, grads3, Backward3, CpuArgs3, Grads3, Kernel3, Op3, Tensors3};
use candle_core::{bail, CpuStorage, DType, Layout, Result, Shape, Storage, Tensor};

/// Queries, keys and values split into heads, as attention takes them.
#[derive(Debug, Clone, Copy)]
pub struct Qkv<'a> {
    /// Queries (B, H, T, D).
    pub q: &'a Tensor,
    /// Keys (B, H, S, D).
    pub k: &'a Tensor,
    /// Values (B, H, S, Dv).
    pub v: &'a Tensor,
}

/// The inputs of [`attention`] and [`attention_reference`]: queries, keys and values, the
/// keep-mask and dropout multiplier (if any) and the scale (their meaning: [`attention`]).
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs<'a> {
    /// Queries, keys and values.
    pub qkv: Qkv<'a>,
    /// u8, broadcastable to (B, H, T, S), 1 = the query may attend to the key.
    pub keep: Option<&'a Tensor>,
    /// The multiplier applied to the weights after the softmax, broadcastable to
    /// (B, H, T, S).
    pub dropout: Option<&'a Tensor>,
    /// The scores' scale, usually `1 / sqrt(D)`.
    pub scale: f64,
}

/// Fused scaled dot-product attention with a hand-written backward pass (gradients of `q`,
/// `k` and `v`).
///
/// - `keep`: u8, broadcastable to (B, H, T, S), 1 = the query may attend to the key. A query
///   that may attend to no key gets all-zero weights (and output), not NaN, like
///   the model's `attention::scaled_dot_product_attention`.
/// - `dropout`: multiplier applied to the weights after the softmax (0 where dropped,
///   `1 / (1 - p)` where kept), broadcastable to (B, H, T, S), q's dtype; a constant (no
///   gradient flows into it).
/// - `scale`: usually `1 / sqrt(D)`.
///
/// CPU f32/f64 run the fused kernel; other devices and dtypes run [`attention_reference`].
///
/// # Shapes
/// - q: (B, H, T, D), k: (B, H, S, D), v: (B, H, S, Dv)
/// - -> (B, H, T, Dv)
pub fn attention(inputs: AttentionInputs) -> Result<Tensor> {
    let dims = inputs.qkv.dims()?;
    let (Qkv { q, k, v }, dropout) = (inputs.qkv, inputs.dropout);
    let fused = fused_applies(&[q, k, v])
        && dropout.is_none_or(|d| d.device().is_cpu() && d.dtype() == q.dtype());
    if !fused {
        return attention_reference(inputs);
    }
    let (b, h, t, s, _, _) = dims;
    let keep = match inputs.keep {
        Some(m) => Some(
            m.to_dtype(DType::U8)?
                .broadcast_as((b, h, t, s))?
                .flatten_all()?
                .to_vec1::<u8>()?,
        ),
        None => None,
    };
    let dropout = match dropout {
        Some(d) => Some(d.detach().broadcast_as((b, h, t, s))?.contiguous()?),
        None => None,
    };
    // Rows must be contiguous (the last stride 1); any other strides are read in place.
    let rows = |x: &Tensor| -> Result<Tensor> {
        if x.dim(3)? <= 1 || x.stride()[3] == 1 {
            Ok(x.clone())
        } else {
            x.contiguous()
        }
    };
    rows(q)?.apply_op3(
        &rows(k)?,
        &rows(v)?,
        Op3(Attention {
            scale: inputs.scale,
            keep,
            dropout,
        }),
    )
}

/// The same attention composed of candle primitives with backward passes, the way
/// The model's `attention` module composes it: a finite additive mask (-1e30) before the softmax, then the
/// weights multiplied by the keep-mask (zeroing fully masked rows) and by the dropout
/// multiplier.
pub fn attention_reference(inputs: AttentionInputs) -> Result<Tensor> {
    inputs.qkv.dims()?;
    let Qkv { q, k, v } = inputs.qkv;
    let (keep, dropout, scale) = (inputs.keep, inputs.dropout, inputs.scale);
    // candle's batched matmul rejects some strided operands (heads split out of (B, T, H, D)).
    let (k, v) = (k.contiguous()?, v.contiguous()?);
    let scores = crate::autocast::matmul(&(q * scale)?, &k.transpose(2, 3)?)?;
    let weights = match keep {
        None => softmax_last_dim_reference(&scores)?,
        Some(m) => {
            let keep = m.to_dtype(scores.dtype())?;
            let additive = keep.affine(1e30, -1e30)?;
            softmax_last_dim_reference(&scores.broadcast_add(&additive)?)?.broadcast_mul(&keep)?
        }
    };
    let weights = match dropout {
        Some(d) => weights.broadcast_mul(&d.detach())?,
        None => weights,
    };
    crate::autocast::matmul(&weights, &v)
}

/// (B, H, T, S, D, Dv).
type Dims = (usize, usize, usize, usize, usize, usize);

impl Qkv<'_> {
    /// Their sizes (B, H, T, S, D, Dv), or an error where they disagree.
    pub fn dims(&self) -> Result<Dims> {
        let (q, k, v) = (self.q, self.k, self.v);
        let (b, h, t, d) = q.dims4()?;
        let (kb, kh, s, kd) = k.dims4()?;
        let (vb, vh, vs, dv) = v.dims4()?;
        if (kb, kh, kd) != (b, h, d) || (vb, vh, vs) != (b, h, s) {
            bail!(
                "attention: q {:?}, k {:?}, v {:?} disagree (need (B,H,T,D), (B,H,S,D), (B,H,S,Dv))",
                q.dims(),
                k.dims(),
                v.dims()
            );
        }
        Ok((b, h, t, s, d, dv))
    }
}

/// Multiply-adds below which the op stays on one thread.
const MIN_PARALLEL_MACS: usize = 1 << 20;

struct Attention {
    scale: f64,
    /// (B, H, T, S) expanded, 1 = may attend.
    keep: Option<Vec<u8>>,
    /// (B, H, T, S) contiguous, q's dtype.
    dropout: Option<Tensor>,
}

/// A (B, H, rows, cols) tensor read through its strides; rows must be contiguous.
struct View4<'a, T> {
    data: &'a [T],
    dims: [usize; 4],
    strides: [usize; 4],
}

impl<'a, T: Float> View4<'a, T> {
    fn new(s: &'a CpuStorage, l: &Layout) -> Result<Self> {
        let dims: [usize; 4] = l
            .dims()
            .try_into()
            .map_err(|_| candle_core::Error::Msg("attention: expected 4 dimensions".into()))?;
        let strides: [usize; 4] = l.stride().try_into().expect("4 strides for 4 dimensions");
        if dims[3] > 1 && strides[3] != 1 {
            bail!("attention: rows must be contiguous, strides {strides:?}");
        }
        Ok(Self {
            data: &s.as_slice::<T>()?[l.start_offset()..],
            dims,
            strides,
        })
    }

    /// The (rows x cols) matrix of pair `bh` (= batch * H + head).
    fn mat(&self, bh: usize) -> Mat<&'a [T]> {
        let (bi, hi) = (bh / self.dims[1], bh % self.dims[1]);
        let off = bi * self.strides[0] + hi * self.strides[1];
        Mat::new(
            &self.data[off..],
            self.dims[2],
            self.dims[3],
            self.strides[2],
            1,
        )
    }
}

fn with_view<T: Float, R>(t: &Tensor, f: impl FnOnce(View4<'_, T>) -> Result<R>) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => f(View4::new(s, layout)?),
        _ => bail!("attention: expected a CPU tensor"),
    }
}

/// Splits `0..pairs` over threads when the work is large enough.
fn pair_ranges(pairs: usize, macs: usize) -> Vec<std::ops::Range<usize>> {
    super::split_ranges(pairs, macs, MIN_PARALLEL_MACS)
}

/// Splits `data` into consecutive chunks of `per * range.len()` elements.
fn split_by<'a, T>(
    mut data: &'a mut [T],
    ranges: &[std::ops::Range<usize>],
    per: usize,
) -> Vec<&'a mut [T]> {
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        let (mine, rest) = data.split_at_mut(r.len() * per);
        out.push(mine);
        data = rest;
    }
    out
}

/// The attention weights of one pair in `p` (T x S, from `scores` already in it): masked
/// entries to -inf, softmax per row, rows with no allowed key all zero.
#[inline(always)]
pub(super) fn masked_softmax_rows<T: Float>(p: &mut [T], keep: Option<&[u8]>, s: usize) {
    if s == 0 {
        return;
    }
    for (i, row) in p.chunks_exact_mut(s).enumerate() {
        if let Some(keep) = keep {
            // A select, not a conditional store, so that it vectorises.
            for (x, &k) in row.iter_mut().zip(&keep[i * s..(i + 1) * s]) {
                *x = if k == 0 { T::NEG_INFINITY } else { *x };
            }
        }
        let m = float::row_max(row);
        if m == T::NEG_INFINITY {
            row.fill(T::ZERO);
            continue;
        }
        let sum = float::exp_sub_inplace_sum(row, m);
        float::scale_inplace(row, T::ONE / sum);
    }
}

impl Attention {
    /// Scores and weights of pair `bh` into `p` (T x S).
    #[allow(clippy::too_many_arguments)]
    fn weights<T: Float>(
        &self,
        q: &View4<'_, T>,
        k: &View4<'_, T>,
        bh: usize,
        t: usize,
        s: usize,
        p: &mut [T],
    ) {
        gemm(
            Mat::new_mut(p, t, s, s, 1),
            false,
            q.mat(bh),
            k.mat(bh).t(),
            T::from_f64(self.scale),
        );
        let keep = self
            .keep
            .as_deref()
            .map(|m| &m[bh * t * s..(bh + 1) * t * s]);
        simd(
            #[inline(always)]
            || masked_softmax_rows(p, keep, s),
        );
    }

    /// The output, contiguous (B, H, T, Dv).
    fn forward<T: Float>(&self, [q, k, v]: [View4<'_, T>; 3], drop: Option<&[T]>) -> Vec<T> {
        let [b, h, t, d] = q.dims;
        let (s, dv) = (k.dims[2], v.dims[3]);
        let pairs = b * h;
        let mut out = vec![T::ZERO; pairs * t * dv];
        let ranges = pair_ranges(pairs, pairs * t * s * (d + dv));
        let chunks = split_by(&mut out, &ranges, t * dv);
        run_parallel(ranges.into_iter().zip(chunks).collect(), |(r, out)| {
            let mut p = vec![T::ZERO; t * s];
            for (i, bh) in r.enumerate() {
                self.weights(&q, &k, bh, t, s, &mut p);
                if let Some(drop) = drop {
                    float::mul_inplace(&mut p, &drop[bh * t * s..(bh + 1) * t * s]);
                }
                gemm(
                    Mat::new_mut(&mut out[i * t * dv..(i + 1) * t * dv], t, dv, dv, 1),
                    false,
                    Mat::new(&p, t, s, s, 1),
                    v.mat(bh),
                    T::ONE,
                );
            }
        });
        out
    }

    /// Returns (dq, dk, dv), contiguous (B, H, ., .).
    #[allow(clippy::type_complexity)]
    fn backward<T: Float>(
        &self,
        [q, k, v]: [View4<'_, T>; 3],
        drop: Option<&[T]>,
        dout: &[T],
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let [b, h, t, d] = q.dims;
        let (s, dv) = (k.dims[2], v.dims[3]);
        let pairs = b * h;
        let scale = T::from_f64(self.scale);
        let (mut dq, mut dk, mut dvv) = (
            vec![T::ZERO; pairs * t * d],
            vec![T::ZERO; pairs * s * d],
            vec![T::ZERO; pairs * s * dv],
        );
        let ranges = pair_ranges(pairs, pairs * t * s * (2 * d + 3 * dv));
        let items: Vec<_> = ranges
            .iter()
            .cloned()
            .zip(split_by(&mut dq, &ranges, t * d))
            .zip(split_by(&mut dk, &ranges, s * d))
            .zip(split_by(&mut dvv, &ranges, s * dv))
            .collect();
        run_parallel(items, |(((r, dq), dk), dvv)| {
            let mut p = vec![T::ZERO; t * s];
            let mut pd = vec![T::ZERO; t * s];
            let mut dp = vec![T::ZERO; t * s];
            for (i, bh) in r.enumerate() {
                let d_o = Mat::new(&dout[bh * t * dv..(bh + 1) * t * dv], t, dv, dv, 1);
                self.weights(&q, &k, bh, t, s, &mut p);
                // Weights after dropout.
                let pd: &[T] = match drop {
                    Some(drop) => {
                        pd.copy_from_slice(&p);
                        float::mul_inplace(&mut pd, &drop[bh * t * s..(bh + 1) * t * s]);
                        &pd
                    }
                    None => &p,
                };
                // dV = Pd^T dO (S x Dv).
                gemm(
                    Mat::new_mut(&mut dvv[i * s * dv..(i + 1) * s * dv], s, dv, dv, 1),
                    false,
                    Mat::new(pd, t, s, s, 1).t(),
                    Mat::new(&dout[bh * t * dv..(bh + 1) * t * dv], t, dv, dv, 1),
                    T::ONE,
                );
                // dPd = dO V^T (T x S), then through the dropout and the softmax:
                // dS = P * (dP - rowsum(dP * P)).
                gemm(
                    Mat::new_mut(&mut dp, t, s, s, 1),
                    false,
                    d_o,
                    v.mat(bh).t(),
                    T::ONE,
                );
                simd(
                    #[inline(always)]
                    || {
                        if let Some(drop) = drop {
                            float::mul_inplace(&mut dp, &drop[bh * t * s..(bh + 1) * t * s]);
                        }
                        if s > 0 {
                            for (dr, pr) in dp.chunks_exact_mut(s).zip(p.chunks_exact(s)) {
                                let dot = float::dot(dr, pr);
                                for (x, &w) in dr.iter_mut().zip(pr) {
                                    *x = w * (*x - dot);
                                }
                            }
                        }
                    },
                );
                // dQ = scale dS K (T x D); dK = scale dS^T Q (S x D).
                gemm(
                    Mat::new_mut(&mut dq[i * t * d..(i + 1) * t * d], t, d, d, 1),
                    false,
                    Mat::new(&dp, t, s, s, 1),
                    k.mat(bh),
                    scale,
                );
                gemm(
                    Mat::new_mut(&mut dk[i * s * d..(i + 1) * s * d], s, d, d, 1),
                    false,
                    Mat::new(&dp, t, s, s, 1).t(),
                    q.mat(bh),
                    scale,
                );
            }
        });
        (dq, dk, dvv)
    }
}

impl Kernel3 for Attention {
    const NAME: &'static str = "kernels-attention";

    fn forward(&self, [(s1, l1), (s2, l2), (s3, l3)]: CpuArgs3) -> Result<(CpuStorage, Shape)> {
        let [b, h, t, _] = l1.dims().try_into().map_err(|_| {
            candle_core::Error::Msg("kernels-attention: q must have 4 dimensions".into())
        })?;
        let dv = l3.dims()[3];
        fn run<T: Float>(op: &Attention, s: [(&CpuStorage, &Layout); 3]) -> Result<Vec<T>> {
            let qkv = [
                View4::new(s[0].0, s[0].1)?,
                View4::new(s[1].0, s[1].1)?,
                View4::new(s[2].0, s[2].1)?,
            ];
            match &op.dropout {
                Some(d) => with_slice::<T, _>(d, |drop| Ok(op.forward(qkv, Some(drop)))),
                None => Ok(op.forward(qkv, None)),
            }
        }
        let s = [(s1, l1), (s2, l2), (s3, l3)];
        let storage = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(run::<f32>(self, s)?),
            CpuStorage::F64(_) => CpuStorage::F64(run::<f64>(self, s)?),
            _ => bail!("kernels-attention: only f32 and f64"),
        };
        Ok((storage, Shape::from((b, h, t, dv))))
    }

    fn backward(&self, inputs: [&Tensor; 3], _out: &Tensor, grad: &Tensor) -> Result<Grads3> {
        grads3(self, Self::NAME, inputs, grad).map(given)
    }
}

impl Backward3 for Attention {
    fn grads<T: Float>(&self, [q, k, v]: [&Tensor; 3], grad: &Tensor) -> Result<Tensors3> {
        let (dq, dk, dv) = with_slice::<T, _>(grad, |dout| {
            with_view::<T, _>(q, |qv| {
                with_view::<T, _>(k, |kv| {
                    with_view::<T, _>(v, |vv| {
                        let qkv = [qv, kv, vv];
                        match &self.dropout {
                            Some(d) => with_slice::<T, _>(d, |drop| {
                                Ok(self.backward(qkv, Some(drop), dout))
                            }),
                            None => Ok(self.backward(qkv, None, dout)),
                        }
                    })
                })
            })
        })?;
        let dev = q.device();
        Ok((
            Tensor::from_vec(dq, q.shape(), dev)?,
            Tensor::from_vec(dk, k.shape(), dev)?,
            Tensor::from_vec(dv, v.shape(), dev)?,
        ))
    }
}
