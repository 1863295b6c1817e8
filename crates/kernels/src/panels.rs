//! `y = x W^T + b` for many rows of `x`, f32, with `W` packed once into panels of outputs:
//! the output layer of a beam-search step (125 rows x 8,000 outputs x 256 inputs for 25
//! sentences at beam 5), whose weight stays the same for every step of every batch, and the
//! decoding stack's projections (`decoder_step`).
//!
//! # Why
//! [`crate::linear_wt`] hands gemm blocks of `W^T` read in place; at the output layer's
//! shape gemm ran at 45-49 G multiply-adds/s on one core of the 2-vCPU Zen 4, the AVX-512
//! kernel here at 53-56 G/s (about 95% of the core's fused multiply-add rate), with the same
//! sums in the same order (`examples/kernels_timing.rs panels`). The weight is packed once per
//! model ([`PanelLinear::new`]), so no step copies it.
//!
//! On a CPU with AVX2 and FMA but no AVX-512 (the 2-vCPU Zen 3 EPYC) the AVX2 kernel here
//! (panels of 16 outputs, tiles of 6 rows) ran on one core at 27-29 G multiply-adds/s where
//! gemm over `W^T` in place ran at 16-18 at the output layer (125 rows x 8,000 x 256 or 512),
//! and at 30-37 against gemm's 12-26 at the decoding stack's products (125 or 63 rows x
//! 512 -> 512, 512 -> 2048, 2048 -> 512; 2.3x at 5 rows, 1.2x at one). gemm has no packed
//! `W` to reuse at these few rows: it streams the unpacked `W^T` at every call, 4 MB for a
//! feed-forward layer. A beam search (`bench mt-decode`, beam 5, 100 sentences in batches of
//! 25, d_model 512) took 2.80-2.94 s against 4.39-5.61 s through gemm, the same tokens.
//!
//! # How
//! Panel `j` holds `W^T`'s columns `NR j .. NR j + NR` row after row (`k x NR`, zero-padded
//! past `m`), `NR` the kernel's panel width ([`Kernel`]: 32 for AVX-512, 16 for AVX2); the
//! packing records the kernel it is for, so it is never read by the other. For each panel
//! and each tile of rows of `x` the accumulators hold the tile's outputs (AVX-512: 12 x 32 in
//! 24 registers; AVX2: 6 x 16 in 12); for each input `kk` two loads of the panel's row `kk`
//! and a broadcast of `x[r][kk]` per row feed two fused multiply-adds per row.
//! Each output is the sum over `kk` in order, each one fused multiply-add starting from 0,
//! then the bias: both kernels give the same bits, those of the plain loop
//! `s = x[kk].mul_add(w[kk], s)` then `s + b` (tested). The panels are split between the
//! threads in groups of 256 outputs.

use super::float;
use candle_core::{bail, DType, Result, Tensor};

/// Outputs per panel of the AVX-512 kernel: two AVX-512 registers.
const NR_AVX512: usize = 32;
/// Outputs per panel of the AVX2 kernel: two AVX registers.
const NR_AVX2: usize = 16;
/// Outputs per parallel item of [`PanelLinear::forward`].
const GROUP_OUTPUTS: usize = 256;

/// The kernel a weight is packed for. The panel width is the kernel's, so it is part of the
/// packing ([`Packed`]), never chosen again when the packing is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Panels of 32 outputs, tiles of 12 rows.
    Avx512,
    /// Panels of 16 outputs, tiles of 6 rows.
    Avx2,
}

impl Kernel {
    /// The kernel the products use on this CPU: AVX-512 where it has it, else AVX2 with FMA,
    /// else none (gemm then).
    pub(crate) fn for_this_cpu() -> Option<Self> {
        if float::avx512() {
            Some(Self::Avx512)
        } else if float::avx2_fma() {
            Some(Self::Avx2)
        } else {
            None
        }
    }

    /// Whether this CPU can run it.
    pub(crate) fn runs_here(self) -> bool {
        match self {
            Self::Avx512 => float::avx512(),
            Self::Avx2 => float::avx2_fma(),
        }
    }

    /// Outputs per panel.
    pub(crate) fn width(self) -> usize {
        match self {
            Self::Avx512 => NR_AVX512,
            Self::Avx2 => NR_AVX2,
        }
    }
}

/// A 64-byte line of the packing: panels start on a cache line and every 16-output row of a
/// panel fills one, so no load of the kernels straddles two lines.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A weight `W` (`m x k`) packed into panels for one [`Kernel`]: `[panel][kk][lane]`, the
/// lanes `W^T`'s columns, zero past `m`.
#[derive(Debug, Clone)]
pub(crate) struct Packed {
    kernel: Kernel,
    lines: Vec<Line>,
    m: usize,
    k: usize,
}

impl Packed {
    /// `w` (`m x k`, row-major) packed for `kernel` (which need not run on this CPU).
    pub(crate) fn new(kernel: Kernel, w: &[f32], m: usize, k: usize) -> Self {
        assert!(
            w.len() >= m * k,
            "panels: {} weights for {m} x {k}",
            w.len()
        );
        let nr = kernel.width();
        let mut lines = vec![Line([0.0; 16]); m.div_ceil(nr) * k * nr / 16];
        // SAFETY: `Line` is 16 f32 and nothing else (`repr(C)`; its alignment adds no
        // padding to 64 bytes).
        let p = unsafe {
            std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<f32>(), lines.len() * 16)
        };
        for (o, row) in w[..m * k].chunks_exact(k.max(1)).enumerate().take(m) {
            let (j, lane) = (o / nr, o % nr);
            for (kk, &v) in row.iter().enumerate() {
                p[(j * k + kk) * nr + lane] = v;
            }
        }
        Self {
            kernel,
            lines,
            m,
            k,
        }
    }

    /// `w` packed for this CPU's kernel; `None` where there is none.
    pub(crate) fn for_this_cpu(w: &[f32], m: usize, k: usize) -> Option<Self> {
        Kernel::for_this_cpu().map(|kernel| Self::new(kernel, w, m, k))
    }

    /// The packed values.
    fn values(&self) -> &[f32] {
        // SAFETY: as in `new`.
        unsafe {
            std::slice::from_raw_parts(self.lines.as_ptr().cast::<f32>(), self.lines.len() * 16)
        }
    }

    /// Panels (`m / width`, rounded up).
    fn panels(&self) -> usize {
        self.m.div_ceil(self.kernel.width())
    }

    /// `y = x W^T + b` for `n` rows on this thread: `x` (`n x k`), `y` (`n x m`), row-major
    /// (the decoding stack's products, whose rows are already split between the threads).
    ///
    /// # Panics
    /// If a slice is shorter than the sizes say, or the CPU cannot run the packing's kernel.
    pub(crate) fn forward_rows(&self, y: &mut [f32], x: &[f32], b: &[f32], n: usize) {
        let product = self.product(x, b, n);
        product.check(y);
        // SAFETY: checked above.
        unsafe { product.panel_range(y.as_mut_ptr(), 0..self.panels()) }
    }

    /// [`Packed::forward_rows`] with the panels split between the kernels' threads: for a
    /// product of too few rows to split by rows (a decoding step of one row, which streams
    /// the weights: two cores draw more of the memory's bandwidth than one). Every output is computed as
    /// [`Packed::forward_rows`] computes it (the same tiles over the same rows), so the
    /// results are equal bit for bit.
    ///
    /// # Panics
    /// As [`Packed::forward_rows`].
    pub(crate) fn forward_rows_split(&self, y: &mut [f32], x: &[f32], b: &[f32], n: usize) {
        let product = self.product(x, b, n);
        product.check(y);
        let panels = self.panels();
        let threads = super::num_threads().clamp(1, panels.max(1));
        let ranges: Vec<std::ops::Range<usize>> = (0..threads)
            .map(|i| i * panels / threads..(i + 1) * panels / threads)
            .collect();
        let out = SendPtr(y.as_mut_ptr());
        super::run_parallel(ranges, |js| {
            let out = &out; // the whole wrapper, not its pointer field alone
                            // SAFETY: checked above; each range writes its own columns of `y`.
            unsafe { product.panel_range(out.0, js) }
        });
    }

    fn product<'a>(&'a self, x: &'a [f32], b: &'a [f32], n: usize) -> Product<'a> {
        Product {
            kernel: self.kernel,
            x,
            panels: self.values(),
            b,
            dims: (n, self.m, self.k),
        }
    }
}

/// A linear layer's weight (`m x k`) packed into panels, and its bias, for
/// [`PanelLinear::forward`].
#[derive(Debug, Clone)]
pub struct PanelLinear {
    packed: Packed,
    bias: Vec<f32>,
}

impl PanelLinear {
    /// The layer `w` (`m x k`), `b` (`m`), packed; `None` where the kernel does not run:
    /// a CPU without one of the kernels (`Kernel::for_this_cpu`), or tensors that are not
    /// CPU f32.
    pub fn new(w: &Tensor, b: &Tensor) -> Result<Option<Self>> {
        super::linear_dims("PanelLinear", w, b)?;
        match Kernel::for_this_cpu() {
            Some(kernel) => Self::with_kernel(w, b, kernel),
            None => Ok(None),
        }
    }

    /// [`PanelLinear::new`] for `kernel`; `None` where it does not run here.
    pub(crate) fn with_kernel(w: &Tensor, b: &Tensor, kernel: Kernel) -> Result<Option<Self>> {
        let (m, k) = super::linear_dims("PanelLinear", w, b)?;
        if !kernel.runs_here() || !super::all_f32_cpu(&[w, b]) {
            return Ok(None);
        }
        let wv = w.flatten_all()?.to_vec1::<f32>()?;
        Ok(Some(Self {
            packed: Packed::new(kernel, &wv, m, k),
            bias: b.to_vec1::<f32>()?,
        }))
    }

    /// Outputs (`m`).
    pub fn out_features(&self) -> usize {
        self.packed.m
    }

    /// `x W^T + b`.
    ///
    /// # Shapes
    /// x (N, k) f32 -> (N, m)
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, k) = x.dims2()?;
        if k != self.packed.k {
            bail!(
                "PanelLinear: x {:?} for a layer of {} inputs",
                x.dims(),
                self.packed.k
            );
        }
        let xv = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        let m = self.packed.m;
        let mut y = vec![0f32; n * m];
        let product = self.packed.product(&xv, &self.bias, n);
        product.check(&y);
        let (panels, group) = (
            self.packed.panels(),
            GROUP_OUTPUTS / self.packed.kernel.width(),
        );
        let groups: Vec<usize> = (0..panels.div_ceil(group)).collect();
        let out = SendPtr(y.as_mut_ptr());
        super::run_parallel(groups, |g| {
            let out = &out; // the whole wrapper, not its pointer field alone
            let js = g * group..((g + 1) * group).min(panels);
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

/// The inputs of `y = x W^T + b` for `n` rows: `x` (`n x k`), `W` (`m x k`) packed for
/// `kernel` into `panels`, `b` (`m`).
#[derive(Clone, Copy)]
struct Product<'a> {
    kernel: Kernel,
    x: &'a [f32],
    panels: &'a [f32],
    b: &'a [f32],
    /// `(n, m, k)`.
    dims: (usize, usize, usize),
}

impl Product<'_> {
    /// Panics unless `y` holds `n x m` outputs, the slices `n x k` inputs, `m` biases and
    /// the packed weight, and the CPU runs the kernel: what [`Product::panel_range`] relies
    /// on.
    fn check(&self, y: &[f32]) {
        let (n, m, k) = self.dims;
        let nr = self.kernel.width();
        assert!(
            self.x.len() >= n * k
                && y.len() >= n * m
                && self.b.len() >= m
                && self.panels.len() >= m.div_ceil(nr) * k * nr,
            "panels: slices shorter than {n} x {k} @ {k} x {m}"
        );
        assert!(
            self.kernel.runs_here(),
            "panels: this CPU cannot run the {:?} kernel",
            self.kernel
        );
    }

    /// The panels `js` of `y = x W^T + b`, every row: the columns `NR js.start .. NR js.end`.
    ///
    /// # Safety
    /// What [`Product::check`] asserts, with `y` pointing to the `n x m` outputs; no other
    /// thread writes these columns meanwhile.
    unsafe fn panel_range(&self, y: *mut f32, js: std::ops::Range<usize>) {
        for j in js {
            #[cfg(target_arch = "x86_64")]
            match self.kernel {
                Kernel::Avx512 => avx512::panel(y, self, j),
                Kernel::Avx2 => avx2::panel(y, self, j),
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Product, NR_AVX512 as NR};
    use crate::float::avx512::mask;
    use std::arch::x86_64::*;

    /// Rows of `x` per tile: 24 accumulators, 2 panel registers and a broadcast of 32.
    const MR: usize = 12;

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
            ..
        } = *product;
        let p = panels.as_ptr().add(j * k * NR);
        let width = (m - j * NR).min(NR);
        let masks = [mask(width), mask(width.saturating_sub(16))];
        let bias = [
            _mm512_maskz_loadu_ps(masks[0], b.as_ptr().add(j * NR)),
            _mm512_maskz_loadu_ps(masks[1], b.as_ptr().wrapping_add(j * NR + 16)),
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
            _mm512_mask_storeu_ps(
                row.wrapping_add(16),
                masks[1],
                _mm512_add_ps(hi[i], bias[1]),
            );
        }
    }
}

/// The AVX2 + FMA kernel: 16 AVX registers hold a 6 x 16 tile (12 accumulators), the
/// panel's row (2) and one broadcast of `x`, as the AVX-512 kernel's 12 x 32 tile does in
/// 27 of 32.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Product, NR_AVX2 as NR};
    use std::arch::x86_64::*;

    /// Rows of `x` per tile.
    const MR: usize = 6;

    /// Panel `j` of `y = x W^T + b` for all `n` rows.
    ///
    /// # Safety
    /// AVX2 and FMA; what [`Product::check`] asserts, with `y` pointing to `n x m` values.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel(y: *mut f32, product: &Product, j: usize) {
        let Product {
            x,
            panels,
            b,
            dims: (n, m, k),
            ..
        } = *product;
        let p = panels.as_ptr().add(j * k * NR);
        // The last panel may hold fewer than 16 outputs: its bias is read into zeros, and its
        // rows are stored through a buffer (`tile`).
        let width = (m - j * NR).min(NR);
        let mut bias16 = [0f32; NR];
        bias16[..width].copy_from_slice(&b[j * NR..j * NR + width]);
        let bias = [
            _mm256_loadu_ps(bias16.as_ptr()),
            _mm256_loadu_ps(bias16.as_ptr().add(8)),
        ];
        let out = |r: usize| y.add(r * m + j * NR);
        let mut r = 0;
        while r + MR <= n {
            tile::<MR>(x.as_ptr().add(r * k), k, p, bias, width, out(r), m);
            r += MR;
        }
        let (xr, o) = (x.as_ptr().add(r * k), out(r));
        match n - r {
            0 => {}
            1 => tile::<1>(xr, k, p, bias, width, o, m),
            2 => tile::<2>(xr, k, p, bias, width, o, m),
            3 => tile::<3>(xr, k, p, bias, width, o, m),
            4 => tile::<4>(xr, k, p, bias, width, o, m),
            _ => tile::<5>(xr, k, p, bias, width, o, m),
        }
    }

    /// `R` rows of `x` (from `x`, row stride `k`) times one panel `p`, plus `bias`, into
    /// the first `width` columns of `y` (row stride `ldy`).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize>(
        x: *const f32,
        k: usize,
        p: *const f32,
        bias: [__m256; 2],
        width: usize,
        y: *mut f32,
        ldy: usize,
    ) {
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for kk in 0..k {
            let w0 = _mm256_load_ps(p.add(kk * NR));
            let w1 = _mm256_load_ps(p.add(kk * NR + 8));
            for i in 0..R {
                let xv = _mm256_broadcast_ss(&*x.add(i * k + kk));
                lo[i] = _mm256_fmadd_ps(xv, w0, lo[i]);
                hi[i] = _mm256_fmadd_ps(xv, w1, hi[i]);
            }
        }
        for i in 0..R {
            let row = y.add(i * ldy);
            let (a, z) = (_mm256_add_ps(lo[i], bias[0]), _mm256_add_ps(hi[i], bias[1]));
            if width == NR {
                _mm256_storeu_ps(row, a);
                _mm256_storeu_ps(row.add(8), z);
            } else {
                let mut buf = [0f32; NR];
                _mm256_storeu_ps(buf.as_mut_ptr(), a);
                _mm256_storeu_ps(buf.as_mut_ptr().add(8), z);
                std::ptr::copy_nonoverlapping(buf.as_ptr(), row, width);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The kernels this CPU runs (each is checked where it runs; says which do not).
    fn kernels_here() -> Vec<Kernel> {
        [Kernel::Avx512, Kernel::Avx2]
            .into_iter()
            .filter(|k| {
                let runs = k.runs_here();
                if !runs {
                    eprintln!("the {k:?} panels do not run on this CPU: not checked here");
                }
                runs
            })
            .collect()
    }

    /// Against `x W^T + b` in f64, for row counts around the tiles' 6 and 12 and output counts
    /// around the panels' 16 and 32 (a ragged last panel), with candle's f32 matmul beside
    /// it, through [`PanelLinear::forward`] (the panels split between threads).
    #[test]
    fn panels_give_the_linear_layer() -> Result<()> {
        let dev = Device::Cpu;
        for kernel in kernels_here() {
            for &(n, m, k) in &[(1, 32, 8), (13, 45, 17), (25, 70, 64), (125, 300, 256)] {
                let x = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
                let w = Tensor::randn(0f32, 0.2, (m, k), &dev)?;
                let b = Tensor::randn(0f32, 0.2, m, &dev)?;
                let layer = PanelLinear::with_kernel(&w, &b, kernel)?.expect("runs here");
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
                    "{kernel:?} {n} x {m} x {k}: off by {err} of {scale}"
                );
                let f32_err = (got - x.matmul(&w.t()?)?.broadcast_add(&b)?)?
                    .abs()?
                    .max_all()?
                    .to_scalar::<f32>()?;
                assert!(
                    f32_err as f64 <= 1e-5 * scale,
                    "{kernel:?} {n} x {m} x {k}: {f32_err}"
                );
            }
        }
        Ok(())
    }

    /// `b[j] + sum_kk x[i][kk] w[j][kk]` as the module states it: from 0, one fused
    /// multiply-add per `kk` in order, then the bias.
    fn plain(x: &[f32], w: &[f32], b: &[f32], (n, m, k): (usize, usize, usize)) -> Vec<f32> {
        let mut y = vec![0f32; n * m];
        for i in 0..n {
            for j in 0..m {
                let mut s = 0f32;
                for kk in 0..k {
                    s = x[i * k + kk].mul_add(w[j * k + kk], s);
                }
                y[i * m + j] = s + b[j];
            }
        }
        y
    }

    /// Every kernel gives the plain loop's bits (so the same bits as each other): every row
    /// count from 1 to 13 (tiles of 6 and 12, and every remainder) and 125, output counts
    /// that are and are not multiples of the panels' 16 and 32, odd input counts; through
    /// [`Packed::forward_rows`] and [`PanelLinear::forward`]. The output is NaN before, so
    /// a value not written shows.
    #[test]
    fn kernels_sum_as_the_plain_loop() -> Result<()> {
        let values = crate::plain::values;
        let rows = (1..=13).chain([24, 125]);
        let outputs = [1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 45, 300];
        let inputs = [1, 3, 17, 64, 255];
        for kernel in kernels_here() {
            for n in rows.clone() {
                for m in outputs {
                    for k in inputs {
                        let (x, w, b) = (values(n * k, 1), values(m * k, 2), values(m, 3));
                        let want = plain(&x, &w, &b, (n, m, k));
                        let mut y = vec![f32::NAN; n * m];
                        let packed = Packed::new(kernel, &w, m, k);
                        packed.forward_rows(&mut y, &x, &b, n);
                        let same = y.iter().zip(&want).all(|(a, z)| a.to_bits() == z.to_bits());
                        assert!(
                            same,
                            "{kernel:?} forward_rows ({n}, {m}, {k}): not the plain sums"
                        );
                        // The outputs split between the threads: the same sums.
                        let mut y = vec![f32::NAN; n * m];
                        packed.forward_rows_split(&mut y, &x, &b, n);
                        let same = y.iter().zip(&want).all(|(a, z)| a.to_bits() == z.to_bits());
                        assert!(
                            same,
                            "{kernel:?} forward_rows_split ({n}, {m}, {k}): not the plain sums"
                        );
                        if n == 125 || n == 13 {
                            let dev = Device::Cpu;
                            let layer = PanelLinear::with_kernel(
                                &Tensor::from_slice(&w, (m, k), &dev)?,
                                &Tensor::from_slice(&b, m, &dev)?,
                                kernel,
                            )?
                            .expect("runs here");
                            let got = layer
                                .forward(&Tensor::from_slice(&x, (n, k), &dev)?)?
                                .flatten_all()?
                                .to_vec1::<f32>()?;
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(a, z)| a.to_bits() == z.to_bits());
                            assert!(
                                same,
                                "{kernel:?} forward ({n}, {m}, {k}): not the plain sums"
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A packing keeps the kernel it was made for, and its panel width.
    #[test]
    fn a_packing_is_for_one_kernel() {
        let w = crate::plain::values(20 * 3, 1);
        for kernel in [Kernel::Avx512, Kernel::Avx2] {
            let p = Packed::new(kernel, &w, 20, 3);
            assert_eq!(p.kernel, kernel);
            assert_eq!(p.panels(), 20usize.div_ceil(kernel.width()));
            assert_eq!(p.values().len(), p.panels() * 3 * kernel.width());
            assert_eq!(p.values().as_ptr() as usize % 64, 0);
        }
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
