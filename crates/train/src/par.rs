//! Splitting one pass over a large parameter or gradient between threads.
//!
//! The optimizer step and the gradient norm each walk all 12-14 M numbers of the tutorial
//! model once; one thread does not saturate memory bandwidth, so tensors above [`MIN_LEN`]
//! elements are cut into one contiguous piece per thread of candle's CPU pool (scoped threads;
//! the split depends only on the length and the thread count, so results are reproducible).

/// Elements below which a pass stays on the calling thread (spawning costs tens of µs).
pub const MIN_LEN: usize = 1 << 18;

/// How many pieces a pass over `len` elements is cut into.
fn pieces(len: usize) -> usize {
    if len < MIN_LEN {
        1
    } else {
        (candle_core::utils::barrier_pool().n_workers() + 1).clamp(1, 8)
    }
}

/// `f` on each piece of `x`, in parallel; the results in order.
pub fn map<T: Sync, R: Send>(x: &[T], f: impl Fn(&[T]) -> R + Sync) -> Vec<R> {
    let n = pieces(x.len());
    let per = x.len().div_ceil(n).max(1);
    if n == 1 {
        return vec![f(x)];
    }
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = x.chunks(per).map(|c| s.spawn(move || f(c))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker thread panicked"))
            .collect()
    })
}

/// `f` on matching pieces of `dst` and `src` (same length), in parallel.
pub fn zip_mut<T: Send + Sync>(dst: &mut [T], src: &[T], f: impl Fn(&mut [T], &[T]) + Sync) {
    assert_eq!(dst.len(), src.len());
    let n = pieces(dst.len());
    let per = dst.len().div_ceil(n).max(1);
    if n == 1 {
        return f(dst, src);
    }
    std::thread::scope(|s| {
        let f = &f;
        for (d, c) in dst.chunks_mut(per).zip(src.chunks(per)) {
            s.spawn(move || f(d, c));
        }
    });
}

/// `f` on matching pieces of `dst`, `a` and `b` (same length), in parallel.
pub fn zip3_mut<T: Send + Sync>(
    dst: &mut [T],
    a: &[T],
    b: &[T],
    f: impl Fn(&mut [T], &[T], &[T]) + Sync,
) {
    assert!(dst.len() == a.len() && a.len() == b.len());
    let n = pieces(dst.len());
    let per = dst.len().div_ceil(n).max(1);
    if n == 1 {
        return f(dst, a, b);
    }
    std::thread::scope(|s| {
        let f = &f;
        for ((d, a), b) in dst.chunks_mut(per).zip(a.chunks(per)).zip(b.chunks(per)) {
            s.spawn(move || f(d, a, b));
        }
    });
}

/// Sum of squares in f64, with independent lanes so that it vectorises.
pub fn sum_sq_f32(x: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i] as f64 * c[i] as f64;
        }
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| v as f64 * v as f64)
        .sum();
    acc.iter().sum::<f64>() + tail
}

/// Sum of squares with independent lanes so that it vectorises.
pub fn sum_sq_f64(x: &[f64]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] += c[i] * c[i];
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| v * v).sum();
    acc.iter().sum::<f64>() + tail
}

/// An in-place elementwise update of one contiguous CPU tensor by another of its size, in
/// parallel pieces ([`zip_mut`]): `f32` updates a piece of f32 numbers, `f64` one of f64
/// numbers (`None` where the update takes f32 only). The optimizers' `p += alpha * g` and
/// the weight average's step toward the weights run as this op.
pub struct ZipInPlace<F, G> {
    /// The op's name, in its errors.
    pub name: &'static str,
    /// The update of an f32 piece.
    pub f32: F,
    /// The update of an f64 piece, where there is one.
    pub f64: Option<G>,
}

impl<F, G> ZipInPlace<F, G> {
    /// Whether the op can update `dst` by `src` in place: both contiguous CPU tensors of one
    /// shape, f32 (or f64, where the op has an f64 update).
    pub fn runs_in_place(&self, dst: &candle_core::Tensor, src: &candle_core::Tensor) -> bool {
        use candle_core::DType;
        let dtype_ok =
            dst.dtype() == DType::F32 || (dst.dtype() == DType::F64 && self.f64.is_some());
        dst.device().is_cpu()
            && dtype_ok
            && src.dtype() == dst.dtype()
            && src.dims() == dst.dims()
            && dst.is_contiguous()
            && src.is_contiguous()
    }
}

impl<F, G> candle_core::InplaceOp2 for ZipInPlace<F, G>
where
    F: Fn(&mut [f32], &[f32]) + Sync,
    G: Fn(&mut [f64], &[f64]) + Sync,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn cpu_fwd(
        &self,
        dst: &mut candle_core::CpuStorage,
        dl: &candle_core::Layout,
        src: &candle_core::CpuStorage,
        sl: &candle_core::Layout,
    ) -> candle_core::Result<()> {
        use candle_core::CpuStorage::{F32, F64};
        let name = self.name;
        let (Some((d0, d1)), Some((s0, s1))) = (dl.contiguous_offsets(), sl.contiguous_offsets())
        else {
            candle_core::bail!("{name}: expected contiguous tensors");
        };
        if d1 - d0 != s1 - s0 {
            candle_core::bail!("{name}: the two tensors differ in size");
        }
        match (dst, src, &self.f64) {
            (F32(d), F32(s), _) => zip_mut(&mut d[d0..d1], &s[s0..s1], &self.f32),
            (F64(d), F64(s), Some(f)) => zip_mut(&mut d[d0..d1], &s[s0..s1], f),
            _ => candle_core::bail!("{name}: expected f32 or f64 tensors of one dtype"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_everything_once() {
        for len in [0, 1, 7, MIN_LEN - 1, MIN_LEN, MIN_LEN * 3 + 5] {
            let x: Vec<f32> = (0..len).map(|i| (i % 13) as f32 - 6.0).collect();
            let want: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let got: f64 = map(&x, sum_sq_f32).iter().sum();
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "{len}: {got} vs {want}"
            );
            let x64: Vec<f64> = x.iter().map(|&v| v as f64).collect();
            let got: f64 = map(&x64, sum_sq_f64).iter().sum();
            assert!(
                (got - want).abs() <= 1e-12 * want.max(1.0),
                "{len}: {got} vs {want}"
            );

            let mut d = vec![1f32; len];
            zip_mut(&mut d, &x, |d, s| {
                d.iter_mut().zip(s).for_each(|(a, b)| *a += 2.0 * b)
            });
            assert!(d.iter().zip(&x).all(|(a, b)| *a == 1.0 + 2.0 * b), "{len}");
        }
    }
}
