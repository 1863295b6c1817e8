//! `y = x W^T + b` for many rows of `x`, f32, AVX-512, with `W` packed once into panels of
//! 32 outputs: the output layer of a beam-search step (125 rows x 8,000 outputs x 256
//! inputs for 25 sentences at beam 5), whose weight stays the same for every step of every
//! batch.
//!
//! # Why
//! [`crate::linear_wt`] hands gemm blocks of `W^T` read in place; at the output layer's
//! shape gemm ran at 45-49 G multiply-adds/s on one core of the 2-vCPU Zen 4, this kernel
//! at 53-56 G/s (about 95% of the core's fused multiply-add rate), with the same sums in the
//! same order (`examples/kernels_timing.rs panels`). The weight is packed once per model
//! ([`PanelLinear::new`]), so no step copies it.
//!
//! # How
//! Panel `j` holds `W^T`'s columns `32 j .. 32 j + 32` row after row (`k x 32`, 32 KB at
//! `k` = 256, zero-padded past `m`). For each panel and each tile of 12 rows of `x`, 24
//! AVX-512 accumulators hold the tile's 12 x 32 outputs; for each input `kk` two loads of
//! the panel's row `kk` and twelve broadcasts of `x[r][kk]` feed 24 fused multiply-adds.
//! Each output is the sum over `kk` in order, each one fused multiply-add, then the bias.
//! The panels are split between the threads in groups of 8 (256 outputs).

use super::float;
use candle_core::{bail, DType, Result, Tensor};

/// Outputs per panel: two AVX-512 registers.
const NR: usize = 32;
/// Rows of `x` per tile: 24 accumulators, 2 panel registers and a broadcast of 32.
const MR: usize = 12;
/// Panels per parallel item (256 outputs).
const GROUP: usize = 8;

/// A linear layer's weight (`m x k`) packed into panels, and its bias, for
/// [`PanelLinear::forward`].
#[derive(Debug, Clone)]
pub struct PanelLinear {
    panels: Vec<f32>,
    bias: Vec<f32>,
    m: usize,
    k: usize,
}

impl PanelLinear {
    /// The layer `w` (`m x k`), `b` (`m`), packed; `None` where the kernel does not run:
    /// a CPU without AVX-512, or tensors that are not CPU f32.
    pub fn new(w: &Tensor, b: &Tensor) -> Result<Option<Self>> {
        let (m, k) = super::linear_dims("PanelLinear", w, b)?;
        if !float::avx512() || !super::all_f32_cpu(&[w, b]) {
            return Ok(None);
        }
        let wv = w.flatten_all()?.to_vec1::<f32>()?;
        Ok(Some(Self {
            panels: pack(&wv, m, k),
            bias: b.to_vec1::<f32>()?,
            m,
            k,
        }))
    }

    /// Outputs (`m`).
    pub fn out_features(&self) -> usize {
        self.m
    }

    /// `x W^T + b`.
    ///
    /// # Shapes
    /// x (N, k) f32 -> (N, m)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, k) = x.dims2()?;
        if k != self.k {
            bail!(
                "PanelLinear: x {:?} for a layer of {} inputs",
                x.dims(),
                self.k
            );
        }
        let xv = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let m = self.m;
        let mut y = vec![0f32; n * m];
        let product = Product {
            x: &xv,
            panels: &self.panels,
            b: &self.bias,
            dims: (n, m, k),
        };
        product.check(&y);
        let panels = m.div_ceil(NR);
        let groups: Vec<usize> = (0..panels.div_ceil(GROUP)).collect();
        let out = SendPtr(y.as_mut_ptr());
        super::run_parallel(groups, |g| {
            let out = &out; // the whole wrapper, not its pointer field alone
            let js = g * GROUP..((g + 1) * GROUP).min(panels);
            // SAFETY: checked above; each group writes its own columns of `y`.
            unsafe { product.panel_range(out.0, js) }
        });
        Tensor::from_vec(y, (n, m), x.device())
    }
}

/// `y`'s pointer, shared by the items that write disjoint columns of it.
struct SendPtr(*mut f32);
// SAFETY: the items write disjoint parts of the buffer, which outlives the parallel run.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// `y = x W^T + b` for `n` rows on this thread, from `w` packed by [`pack`]: `x` (`n x k`),
/// `y` (`n x m`), row-major (the decoding stack's products, whose rows are already split
/// between the threads).
///
/// # Panics
/// If a slice is shorter than the sizes say, or the CPU lacks AVX-512.
pub(crate) fn forward_rows(
    y: &mut [f32],
    x: &[f32],
    panels: &[f32],
    b: &[f32],
    n: usize,
    m: usize,
    k: usize,
) {
    let product = Product {
        x,
        panels,
        b,
        dims: (n, m, k),
    };
    product.check(y);
    // SAFETY: checked above.
    unsafe { product.panel_range(y.as_mut_ptr(), 0..m.div_ceil(NR)) }
}

/// The inputs of `y = x W^T + b` for `n` rows: `x` (`n x k`), `W` (`m x k`) packed by
/// [`pack`] into `panels`, `b` (`m`).
#[derive(Clone, Copy)]
struct Product<'a> {
    x: &'a [f32],
    panels: &'a [f32],
    b: &'a [f32],
    /// `(n, m, k)`.
    dims: (usize, usize, usize),
}

impl Product<'_> {
    /// Panics unless `y` holds `n x m` outputs, the slices `n x k` inputs, `m` biases and
    /// the packed weight, and the CPU has AVX-512: what [`Product::panel_range`] relies on.
    fn check(&self, y: &[f32]) {
        let (n, m, k) = self.dims;
        assert!(
            self.x.len() >= n * k
                && y.len() >= n * m
                && self.b.len() >= m
                && self.panels.len() >= m.div_ceil(NR) * k * NR,
            "panels: slices shorter than {n} x {k} @ {k} x {m}"
        );
        assert!(float::avx512(), "panels: this CPU has no AVX-512");
    }

    /// The panels `js` of `y = x W^T + b`, every row: the columns `32 js.start .. 32 js.end`.
    ///
    /// # Safety
    /// What [`Product::check`] asserts, with `y` pointing to the `n x m` outputs; no other
    /// thread writes these columns meanwhile.
    unsafe fn panel_range(&self, y: *mut f32, js: std::ops::Range<usize>) {
        for j in js {
            #[cfg(target_arch = "x86_64")]
            avx512::panel(y, self, j)
        }
    }
}

/// `w` (`m x k`) as panels of `NR` columns of `W^T`: `[panel][kk][lane]`, zero past `m`.
pub(crate) fn pack(w: &[f32], m: usize, k: usize) -> Vec<f32> {
    let panels = m.div_ceil(NR);
    let mut p = vec![0f32; panels * k * NR];
    for (o, row) in w.chunks_exact(k).enumerate() {
        let (j, lane) = (o / NR, o % NR);
        for (kk, &v) in row.iter().enumerate() {
            p[(j * k + kk) * NR + lane] = v;
        }
    }
    p
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Product, MR, NR};
    use crate::float::avx512::mask;
    use std::arch::x86_64::*;

    /// Panel `j` of `y = x W^T + b` for all `n` rows.
    ///
    /// # Safety
    /// AVX-512 F; what [`Product::check`] asserts, with `y` pointing to `n x m` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn panel(y: *mut f32, product: &Product, j: usize) {
        let Product {
            x,
            panels,
            b,
            dims: (n, m, k),
        } = *product;
        let p = panels.as_ptr().add(j * k * NR);
        let width = (m - j * NR).min(NR);
        let masks = [mask(width), mask(width.saturating_sub(16))];
        let bias = [
            _mm512_maskz_loadu_ps(masks[0], b.as_ptr().add(j * NR)),
            _mm512_maskz_loadu_ps(masks[1], b.as_ptr().add(j * NR + 16)),
        ];
        let out = |r: usize| y.add(r * m + j * NR);
        let mut r = 0;
        while r + MR <= n {
            tile::<MR>(x.as_ptr().add(r * k), k, p, bias, masks, out(r), m);
            r += MR;
        }
        let (xr, o) = (x.as_ptr().add(r * k), out(r));
        match n - r {
            0 => {}
            1 => tile::<1>(xr, k, p, bias, masks, o, m),
            2 => tile::<2>(xr, k, p, bias, masks, o, m),
            3 => tile::<3>(xr, k, p, bias, masks, o, m),
            4 => tile::<4>(xr, k, p, bias, masks, o, m),
            5 => tile::<5>(xr, k, p, bias, masks, o, m),
            6 => tile::<6>(xr, k, p, bias, masks, o, m),
            7 => tile::<7>(xr, k, p, bias, masks, o, m),
            8 => tile::<8>(xr, k, p, bias, masks, o, m),
            9 => tile::<9>(xr, k, p, bias, masks, o, m),
            10 => tile::<10>(xr, k, p, bias, masks, o, m),
            _ => tile::<11>(xr, k, p, bias, masks, o, m),
        }
    }

    /// `R` rows of `x` (from `x`, row stride `k`) times one panel `p`, plus `bias`, into
    /// `y` (row stride `ldy`; only the lanes `masks` keep are written).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile<const R: usize>(
        x: *const f32,
        k: usize,
        p: *const f32,
        bias: [__m512; 2],
        masks: [__mmask16; 2],
        y: *mut f32,
        ldy: usize,
    ) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        for kk in 0..k {
            let w0 = _mm512_loadu_ps(p.add(kk * NR));
            let w1 = _mm512_loadu_ps(p.add(kk * NR + 16));
            for i in 0..R {
                let xv = _mm512_set1_ps(*x.add(i * k + kk));
                lo[i] = _mm512_fmadd_ps(xv, w0, lo[i]);
                hi[i] = _mm512_fmadd_ps(xv, w1, hi[i]);
            }
        }
        for i in 0..R {
            let row = y.add(i * ldy);
            _mm512_mask_storeu_ps(row, masks[0], _mm512_add_ps(lo[i], bias[0]));
            _mm512_mask_storeu_ps(row.add(16), masks[1], _mm512_add_ps(hi[i], bias[1]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against `x W^T + b` in f64, for row counts around the tile's 12 and output counts
    /// around the panel's 32 (a ragged last panel), with candle's f32 matmul beside it.
    #[test]
    fn panels_give_the_linear_layer() -> Result<()> {
        if crate::plain::no_avx512() {
            return Ok(());
        }
        let dev = Device::Cpu;
        for &(n, m, k) in &[(1, 32, 8), (13, 45, 17), (25, 70, 64), (125, 300, 256)] {
            let x = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
            let w = Tensor::randn(0f32, 0.2, (m, k), &dev)?;
            let b = Tensor::randn(0f32, 0.2, m, &dev)?;
            let layer = PanelLinear::new(&w, &b)?.expect("AVX-512 f32 CPU tensors");
            let got = layer.forward(&x)?;
            let want = x
                .to_dtype(DType::F64)?
                .matmul(&w.to_dtype(DType::F64)?.t()?)?
                .broadcast_add(&b.to_dtype(DType::F64)?)?;
            let err = (got.to_dtype(DType::F64)? - &want)?
                .abs()?
                .max_all()?
                .to_scalar::<f64>()?;
            let scale = want.abs()?.max_all()?.to_scalar::<f64>()?;
            assert!(
                err <= 1e-5 * scale,
                "{n} x {m} x {k}: off by {err} of {scale}"
            );
            let f32_err = (got - x.matmul(&w.t()?)?.broadcast_add(&b)?)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?;
            assert!(f32_err as f64 <= 1e-5 * scale, "{n} x {m} x {k}: {f32_err}");
        }
        Ok(())
    }

    #[test]
    fn other_tensors_are_declined() -> Result<()> {
        let dev = Device::Cpu;
        let w = Tensor::zeros((4, 3), DType::F64, &dev)?;
        let b = Tensor::zeros(4, DType::F64, &dev)?;
        assert!(PanelLinear::new(&w, &b)?.is_none());
        let b32 = Tensor::zeros(5, DType::F32, &dev)?;
        assert!(PanelLinear::new(&w.to_dtype(DType::F32)?, &b32).is_err());
        Ok(())
    }
}
