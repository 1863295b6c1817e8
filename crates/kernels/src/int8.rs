//! int8 products for decoding: `y = x W^T + b` with `W` stored as int8.
//!
//! # The scheme
//! The one CTranslate2 uses on CPUs: **weights** symmetric int8 with one scale per output
//! row (`scale_o = max_k |W[o, k]| / 127`, `q = round(W / scale_o)`), quantized once when a
//! model is prepared for decoding; **activations** symmetric int8 per row at run time
//! (`s_i = max_k |x[i, k]| / 127`); products accumulated exactly in i32 and scaled back,
//! `y[i, o] = s_i scale_o sum_k qx[i, k] qW[o, k] + b[o]`. The only rounding is the two
//! quantizations; every kernel below computes the same i32 sums, so their outputs are equal
//! bit for bit (tested), and the float result differs from the f32 product by the
//! quantization error only (tested against a bound).
//!
//! # The kernels, chosen at run time by CPU feature
//! - **AVX512-VNNI** (Zen 4, Intel since Cascade Lake): `vpdpbusd` multiplies 64 unsigned
//!   bytes by 64 signed bytes and adds each group of 4 products to an i32 lane. The
//!   activations are made unsigned by adding 128 (`u = qx + 128`), and the excess
//!   `128 sum_k qW[o, k]` (precomputed per output) is taken off the sums. Weights are packed
//!   in blocks of 16 outputs x 4 inputs (64 bytes, one register): a tile of 4 rows x 64
//!   outputs keeps 16 accumulators in registers and loads each weight byte once per 4 rows.
//! - **AVX2** (every x86-64 CPU this project runs on): `vpmaddubsw` multiplies 32 unsigned
//!   bytes by 32 signed bytes and adds pairs of products into i16 lanes, saturating. With
//!   VNNI's `qx + 128` a pair could reach 255 x 127 x 2 > 32767, so instead the sign of `qx`
//!   moves onto the weight: `vpmaddubsw(|qx|, sign(qW, qx))` (`vpsignb` negates, keeps or
//!   zeroes each weight byte by the sign of the activation byte) multiplies `|qx| <= 127` by
//!   `±qW` with `|qW| <= 127`, each product being `qx qW` exactly, and a pair of them has a
//!   magnitude at most 127 x 127 x 2 = 32258 < 32767: no saturation, ever, because both
//!   operands are symmetric in [-127, 127] (never -128). `vpmaddwd` with ones then adds
//!   pairs of i16 lanes into exact i32 lanes (4 products each). Weights are packed in blocks
//!   of 8 outputs x 4 inputs (32 bytes, one register), 4 bytes of an activation row are
//!   broadcast to every lane, and a tile of 3 rows x 3 blocks (2 x 4 and 1 x 4 for the
//!   last rows) keeps its accumulators in registers: no horizontal sums, each weight byte loaded once per tile of rows. The
//!   scaling to f32 is done in the tile, straight into the output.
//! - **Scalar**: the reference.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Which int8 kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Kernel {
    /// AVX512-VNNI `vpdpbusd`.
    Avx512Vnni,
    /// AVX2 `vpmaddubsw` on the activations' magnitudes and the signed weights.
    Avx2,
    /// Plain Rust.
    Scalar,
}

impl Int8Kernel {
    /// The fastest kernel this CPU runs.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512f")
            {
                return Int8Kernel::Avx512Vnni;
            }
            if is_x86_feature_detected!("avx2") {
                return Int8Kernel::Avx2;
            }
        }
        Int8Kernel::Scalar
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Int8Kernel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Int8Kernel::Avx512Vnni => Int8Kernel::detect() == Int8Kernel::Avx512Vnni,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// A name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Int8Kernel::Avx512Vnni => "AVX512-VNNI",
            Int8Kernel::Avx2 => "AVX2",
            Int8Kernel::Scalar => "scalar",
        }
    }
}

/// Outputs per VNNI block.
const BLOCK: usize = 16;

/// Outputs per AVX2 block.
const AVX2_BLOCK: usize = 8;

/// Rows of the AVX2 kernel's largest tile (3 rows x 3 blocks measured a little faster
/// than 4 x 2, 5 x 2 or 4 x 3 on a Zen 3; all within the noise of a shared machine).
const AVX2_ROWS: usize = 3;

std::thread_local! {
    /// Each thread's buffers for [`QuantizedLinear::forward_outputs`]: the quantized rows,
    /// their scales and the i32 sums (VNNI, scalar), kept between calls.
    static SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<f32>, Vec<i32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// A linear layer's weight in int8 (one scale per output row) and its bias, laid out for
/// one kernel.
#[derive(Debug, Clone)]
pub struct QuantizedLinear {
    /// Outputs (rows of `W`).
    out: usize,
    /// Inputs (columns of `W`).
    k: usize,
    /// Inputs padded to a multiple of 16 (AVX2) or 4 (VNNI), the padding zero.
    kp: usize,
    /// The weights: `[out][kp]` row-major (scalar), AVX2 blocks `[out / 8][kp / 4][8][4]`
    /// (outputs padded to 8), or VNNI blocks `[out / 16][kp / 4][16][4]` (outputs padded
    /// to 16).
    w: Vec<i8>,
    /// `scale_o` per output.
    scale: Vec<f32>,
    /// `128 sum_k qW[o, k]` per output (VNNI's correction).
    excess: Vec<i32>,
    bias: Vec<f32>,
    kernel: Int8Kernel,
}

impl QuantizedLinear {
    /// Quantizes `w` (`out x k`, row-major, PyTorch's layout) with `bias` (`out`) for
    /// `kernel`.
    pub fn new(w: &[f32], bias: &[f32], out: usize, k: usize, kernel: Int8Kernel) -> Self {
        assert_eq!(w.len(), out * k, "weight size");
        assert_eq!(bias.len(), out, "bias size");
        assert!(
            kernel.available(),
            "{} is not available here",
            kernel.name()
        );
        let kp = k.div_ceil(16) * 16;
        let (rows, scale) = quantize_weight_rows(w, k);
        let mut q = vec![0i8; out * kp];
        let mut excess = vec![0i32; out];
        for (o, row) in rows.chunks_exact(k).enumerate() {
            q[o * kp..o * kp + k].copy_from_slice(row);
            excess[o] = 128 * row.iter().map(|&t| t as i32).sum::<i32>();
        }
        // Blocks of `width` outputs x 4 inputs, `[out / width][kp / 4][width][4]`.
        let blocks_of = |width: usize| {
            let mut p = vec![0i8; out.div_ceil(width) * width * kp];
            for o in 0..out {
                let (b, lane) = (o / width, o % width);
                for j in 0..kp {
                    p[((b * (kp / 4) + j / 4) * width + lane) * 4 + j % 4] = q[o * kp + j];
                }
            }
            p
        };
        let w = match kernel {
            Int8Kernel::Avx512Vnni => blocks_of(BLOCK),
            Int8Kernel::Avx2 => blocks_of(AVX2_BLOCK),
            _ => q,
        };
        Self {
            out,
            k,
            kp,
            w,
            scale,
            excess,
            bias: bias.to_vec(),
            kernel,
        }
    }

    /// Outputs.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Inputs.
    pub fn in_features(&self) -> usize {
        self.k
    }

    /// The kernel this layer runs.
    pub fn kernel(&self) -> Int8Kernel {
        self.kernel
    }

    /// Bytes of weights, scales and bias.
    pub fn bytes(&self) -> usize {
        self.w.len() + 4 * (self.scale.len() + self.excess.len() + self.bias.len())
    }

    /// Outputs per block of the weights' layout: where [`Self::forward_outputs`]'s ranges
    /// may start.
    fn block(&self) -> usize {
        match self.kernel {
            Int8Kernel::Avx512Vnni => BLOCK,
            Int8Kernel::Avx2 => AVX2_BLOCK,
            Int8Kernel::Scalar => 1,
        }
    }

    /// `y = x W^T + b` for the rows of `x` (`n x k`), outputs `outs` only, into `y`
    /// (`n x outs.len()`, row-major), on the calling thread. `outs` starts on a block of the
    /// layout (a multiple of 16 serves every kernel).
    pub fn forward_outputs(&self, y: &mut [f32], x: &[f32], outs: std::ops::Range<usize>) {
        let (k, kp) = (self.k, self.kp);
        let n = x.len() / k;
        let width = outs.len();
        assert_eq!(x.len(), n * k, "input size");
        assert_eq!(y.len(), n * width, "output size");
        assert!(
            outs.start % self.block() == 0 && outs.end <= self.out,
            "outputs {outs:?} of {}, in blocks of {}",
            self.out,
            self.block()
        );
        SCRATCH.with_borrow_mut(|(qx, sx, acc)| {
            let unsigned = self.kernel == Int8Kernel::Avx512Vnni;
            quantize_rows(x, RowLayout { k, kp, unsigned }, qx, sx);
            #[cfg(target_arch = "x86_64")]
            if self.kernel == Int8Kernel::Avx2 {
                // The scaling is done in the tiles, straight into `y`.
                unsafe { self.forward_avx2(y, qx, sx, n, outs) };
                return;
            }
            acc.clear();
            acc.resize(n * width, 0);
            match self.kernel {
                #[cfg(target_arch = "x86_64")]
                Int8Kernel::Avx512Vnni => unsafe { self.dots_vnni(qx, n, outs.clone(), acc) },
                _ => self.dots_scalar(qx, n, outs.clone(), acc),
            }
            let (scale, bias) = (&self.scale[outs.clone()], &self.bias[outs]);
            for ((yr, ar), &s) in y
                .chunks_exact_mut(width)
                .zip(acc.chunks_exact(width))
                .zip(sx.iter())
            {
                for (((yv, &a), &ws), &b) in yr.iter_mut().zip(ar).zip(scale).zip(bias) {
                    *yv = a as f32 * (s * ws) + b;
                }
            }
        })
    }

    /// `y = x W^T + b` for every output, on the calling thread.
    pub fn forward(&self, y: &mut [f32], x: &[f32]) {
        self.forward_outputs(y, x, 0..self.out);
    }

    /// `y = x W^T + b` split between the kernels' threads (for a wide layer: the output
    /// layer): by rows when there are rows enough for every thread, else by outputs.
    pub fn forward_parallel(&self, y: &mut [f32], x: &[f32]) {
        let n = x.len() / self.k.max(1);
        let work = n * self.out * self.k;
        let threads = if work < 1 << 20 {
            1
        } else {
            super::num_threads()
        };
        if threads <= 1 {
            return self.forward(y, x);
        }
        if n >= 4 * threads {
            // Contiguous groups of rows (whole VNNI tiles where possible), each into its own
            // part of `y`.
            let per = n.div_ceil(threads).div_ceil(4) * 4;
            let items: Vec<(&[f32], &mut [f32])> = x
                .chunks(per * self.k)
                .zip(y.chunks_mut(per * self.out))
                .collect();
            super::run_parallel(items, |(xs, ys)| self.forward(ys, xs));
            return;
        }
        // Few rows: ranges of whole blocks of outputs, gathered afterwards.
        let block = self.block().max(BLOCK);
        let blocks = self.out.div_ceil(block);
        let ranges = super::split_ranges(blocks, work, 1 << 20);
        let parts = super::run_parallel(ranges, |r| {
            let outs = r.start * block..(r.end * block).min(self.out);
            let mut part = vec![0f32; n * outs.len()];
            self.forward_outputs(&mut part, x, outs.clone());
            (outs, part)
        });
        for (outs, part) in parts {
            let w = outs.len();
            for i in 0..n {
                y[i * self.out + outs.start..i * self.out + outs.end]
                    .copy_from_slice(&part[i * w..(i + 1) * w]);
            }
        }
    }

    fn dots_scalar(&self, qx: &[u8], n: usize, outs: std::ops::Range<usize>, acc: &mut [i32]) {
        let kp = self.kp;
        let width = outs.len();
        let unsigned = self.kernel == Int8Kernel::Avx512Vnni;
        for i in 0..n {
            let xr = &qx[i * kp..(i + 1) * kp];
            for (j, o) in outs.clone().enumerate() {
                let mut s = 0i32;
                for (jj, &xv) in xr.iter().enumerate() {
                    let xv = if unsigned {
                        xv as i32 - 128
                    } else {
                        xv as i8 as i32
                    };
                    s += xv * self.weight(o, jj) as i32;
                }
                acc[i * width + j] = s;
            }
        }
    }

    /// The quantized weight `(o, j)` whatever the layout.
    fn weight(&self, o: usize, j: usize) -> i8 {
        match self.kernel {
            Int8Kernel::Avx512Vnni => {
                let (b, lane) = (o / BLOCK, o % BLOCK);
                self.w[((b * (self.kp / 4) + j / 4) * BLOCK + lane) * 4 + j % 4]
            }
            Int8Kernel::Avx2 => {
                let (b, lane) = (o / AVX2_BLOCK, o % AVX2_BLOCK);
                self.w[((b * (self.kp / 4) + j / 4) * AVX2_BLOCK + lane) * 4 + j % 4]
            }
            Int8Kernel::Scalar => self.w[o * self.kp + j],
        }
    }

    /// The AVX2 kernel: `y` (`n x outs.len()`) from the quantized rows `qx` (`n x kp`) and
    /// their scales `sx`, by tiles of rows x blocks of 8 outputs.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn forward_avx2(
        &self,
        y: &mut [f32],
        qx: &[u8],
        sx: &[f32],
        n: usize,
        outs: std::ops::Range<usize>,
    ) {
        debug_assert_eq!(outs.start % AVX2_BLOCK, 0);
        debug_assert!(qx.len() >= n * self.kp && sx.len() >= n && y.len() >= n * outs.len());
        let (b0, b1) = (outs.start / AVX2_BLOCK, outs.end.div_ceil(AVX2_BLOCK));
        let mut i = 0;
        while i < n {
            let rows = (n - i).min(AVX2_ROWS);
            let mut b = b0;
            while b < b1 {
                // The widest tile of these rows that fits in the 16 registers (the
                // accumulators, a register per block of weights, the broadcast row, its
                // magnitude, the ones and temporaries).
                let blocks = (b1 - b).min(match rows {
                    1 | 2 => 4,
                    _ => 3,
                });
                let t = (y.as_mut_ptr(), qx, sx, i, b, &outs);
                match (rows, blocks) {
                    (3, 3) => self.tile_avx2::<3, 3>(t),
                    (3, 2) => self.tile_avx2::<3, 2>(t),
                    (3, _) => self.tile_avx2::<3, 1>(t),
                    (2, 4) => self.tile_avx2::<2, 4>(t),
                    (2, 3) => self.tile_avx2::<2, 3>(t),
                    (2, 2) => self.tile_avx2::<2, 2>(t),
                    (2, _) => self.tile_avx2::<2, 1>(t),
                    (_, 4) => self.tile_avx2::<1, 4>(t),
                    (_, 3) => self.tile_avx2::<1, 3>(t),
                    (_, 2) => self.tile_avx2::<1, 2>(t),
                    (_, _) => self.tile_avx2::<1, 1>(t),
                }
                b += blocks;
            }
            i += rows;
        }
    }

    /// Rows `i..i + R` x blocks `b..b + B` of 8 outputs, scaled and biased into `y` (rows of
    /// `outs.len()`, starting at output `outs.start`); `(y, qx, sx, i, b, outs)` as
    /// [`Self::forward_avx2`] has them. Outputs past `outs.end` (the padding of the last
    /// block, or outputs of another range) are computed and dropped.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn tile_avx2<const R: usize, const B: usize>(
        &self,
        (y, qx, sx, i, b, outs): (
            *mut f32,
            &[u8],
            &[f32],
            usize,
            usize,
            &std::ops::Range<usize>,
        ),
    ) {
        let kp = self.kp;
        let k4s = kp / 4;
        let ones = _mm256_set1_epi16(1);
        let mut a = [[_mm256_setzero_si256(); B]; R];
        // Block `b + bb`'s 32 bytes for inputs `4 k4..4 k4 + 4` at `wp + (bb k4s + k4) 32`.
        let wp = self.w.as_ptr().add(b * k4s * 32);
        let xp = qx.as_ptr().add(i * kp);
        for k4 in 0..k4s {
            let mut wv = [_mm256_setzero_si256(); B];
            for (bb, v) in wv.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(wp.add((bb * k4s + k4) * 32) as *const __m256i);
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let xv = _mm256_set1_epi32(std::ptr::read_unaligned(
                    xp.add(r * kp + k4 * 4) as *const i32
                ));
                // |qx| as unsigned bytes (qx >= -127, so no overflow), and each weight byte
                // with its activation's sign: products exact, pair sums <= 32258.
                let ax = _mm256_abs_epi8(xv);
                for (v, &w) in ar.iter_mut().zip(&wv) {
                    let p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, xv));
                    *v = _mm256_add_epi32(*v, _mm256_madd_epi16(p, ones));
                }
            }
        }
        // `a as f32 * (s * scale) + bias`, as the other kernels' epilogue rounds it (no FMA).
        let width = outs.len();
        for (r, ar) in a.iter().enumerate() {
            let s = sx[i + r];
            let yr = y.add((i + r) * width);
            for (bb, v) in ar.iter().enumerate() {
                let o = (b + bb) * AVX2_BLOCK;
                if o >= outs.end {
                    break;
                }
                let f = _mm256_cvtepi32_ps(*v);
                if o + AVX2_BLOCK <= outs.end {
                    let sc = _mm256_mul_ps(
                        _mm256_set1_ps(s),
                        _mm256_loadu_ps(self.scale.as_ptr().add(o)),
                    );
                    let z = _mm256_add_ps(
                        _mm256_mul_ps(f, sc),
                        _mm256_loadu_ps(self.bias.as_ptr().add(o)),
                    );
                    _mm256_storeu_ps(yr.add(o - outs.start), z);
                } else {
                    let mut lanes = [0i32; AVX2_BLOCK];
                    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, *v);
                    for (lane, &t) in lanes.iter().enumerate().take(outs.end - o) {
                        *yr.add(o + lane - outs.start) =
                            t as f32 * (s * self.scale[o + lane]) + self.bias[o + lane];
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn dots_vnni(&self, qx: &[u8], n: usize, outs: std::ops::Range<usize>, acc: &mut [i32]) {
        // `outs` starts on a block boundary (forward_parallel cuts whole blocks; forward
        // takes all), and may end inside the last block.
        debug_assert_eq!(outs.start % BLOCK, 0);
        let (b0, b1) = (outs.start / BLOCK, outs.end.div_ceil(BLOCK));
        let mut i = 0;
        while i < n {
            let rows = (n - i).min(4);
            let mut b = b0;
            while b < b1 {
                let blocks = (b1 - b).min(4);
                match (rows, blocks) {
                    (4, 4) => self.tile_vnni::<4, 4>(qx, i, b, &outs, acc),
                    (4, _) => {
                        for bb in b..b + blocks {
                            self.tile_vnni::<4, 1>(qx, i, bb, &outs, acc);
                        }
                    }
                    (_, 4) => {
                        for r in i..i + rows {
                            self.tile_vnni::<1, 4>(qx, r, b, &outs, acc);
                        }
                    }
                    _ => {
                        for r in i..i + rows {
                            for bb in b..b + blocks {
                                self.tile_vnni::<1, 1>(qx, r, bb, &outs, acc);
                            }
                        }
                    }
                }
                b += blocks;
            }
            i += rows;
        }
    }

    /// Rows `i..i + R` x blocks `b..b + B` of 16 outputs.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile_vnni<const R: usize, const B: usize>(
        &self,
        qx: &[u8],
        i: usize,
        b: usize,
        outs: &std::ops::Range<usize>,
        acc: &mut [i32],
    ) {
        let kp = self.kp;
        let mut a = [[_mm512_setzero_si512(); B]; R];
        let wp = self.w.as_ptr();
        for k4 in 0..kp / 4 {
            let mut wv = [_mm512_setzero_si512(); B];
            for (bb, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(wp.add(((b + bb) * (kp / 4) + k4) * 64) as *const _);
            }
            for (r, ar) in a.iter_mut().enumerate() {
                let xp = qx.as_ptr().add((i + r) * kp + k4 * 4) as *const i32;
                let xv = _mm512_set1_epi32(std::ptr::read_unaligned(xp));
                for (bb, v) in ar.iter_mut().enumerate() {
                    *v = _mm512_dpbusd_epi32(*v, xv, wv[bb]);
                }
            }
        }
        let width = outs.len();
        for (r, ar) in a.iter().enumerate() {
            for (bb, v) in ar.iter().enumerate() {
                let mut lanes = [0i32; BLOCK];
                _mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, *v);
                for (lane, &s) in lanes.iter().enumerate() {
                    let o = (b + bb) * BLOCK + lane;
                    if o < outs.end {
                        acc[(i + r) * width + (o - outs.start)] = s - self.excess[o];
                    }
                }
            }
        }
    }
}

/// A weight matrix (`cols` columns, row-major) in int8 with one scale per row, the weights'
/// side of the scheme: `scale = max |row| / 127` (1 for a row of zeros),
/// `q = round(w / scale)`. Returns the bytes (row-major) and the scales.
pub fn quantize_weight_rows(w: &[f32], cols: usize) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(w.len() / cols.max(1));
    for row in w.chunks_exact(cols) {
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = if max > 0.0 { max / 127.0 } else { 1.0 };
        scales.push(s);
        q.extend(
            row.iter()
                .map(|&v| (v / s).round().clamp(-127.0, 127.0) as i8),
        );
    }
    (q, scales)
}

/// How [`quantize_rows`] lays out the rows: `k` values padded with zeros to `kp`, and
/// `unsigned` adding 128 (VNNI's unsigned operand).
#[derive(Clone, Copy)]
struct RowLayout {
    k: usize,
    kp: usize,
    unsigned: bool,
}

/// Each row of `x` (`n x k`) quantized to int8 with its own scale, laid out as `layout`
/// says. Writes the bytes to `q` and the scales to `s` (resized to `n x kp` and `n`).
fn quantize_rows(x: &[f32], layout: RowLayout, q: &mut Vec<u8>, s: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // The same code compiled for AVX2, where its loops vectorise.
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2(x: &[f32], layout: RowLayout, q: &mut Vec<u8>, s: &mut Vec<f32>) {
            quantize_rows_plain(x, layout, q, s)
        }
        return unsafe { avx2(x, layout, q, s) };
    }
    quantize_rows_plain(x, layout, q, s)
}

#[inline(always)]
fn quantize_rows_plain(x: &[f32], layout: RowLayout, q: &mut Vec<u8>, s: &mut Vec<f32>) {
    let RowLayout { k, kp, unsigned } = layout;
    let n = x.len() / k;
    let pad = if unsigned { 128u8 } else { 0 };
    // Every byte is written below (a row's values, then its padding).
    q.resize(n * kp, pad);
    s.resize(n, 1.0);
    let shift = if unsigned { 128 } else { 0 };
    for ((row, qr), si) in x
        .chunks_exact(k)
        .zip(q.chunks_exact_mut(kp))
        .zip(s.iter_mut())
    {
        // The largest magnitude, per lane of 8 (a reduction the compiler vectorises; the
        // result is the same whatever the order, a maximum being exact).
        let mut lanes = [0f32; 8];
        let mut chunks = row.chunks_exact(8);
        for c in &mut chunks {
            for (m, &v) in lanes.iter_mut().zip(c) {
                let a = v.abs();
                *m = if a > *m { a } else { *m };
            }
        }
        let max = chunks
            .remainder()
            .iter()
            .fold(lanes.iter().fold(0f32, |m, &v| m.max(v)), |m, v| {
                m.max(v.abs())
            });
        let scale = if max > 0.0 { max / 127.0 } else { 1.0 };
        *si = scale;
        let inv = 1.0 / scale;
        for (qv, &v) in qr.iter_mut().zip(row) {
            // Ties to even: one vector rounding instruction.
            let t = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i32;
            *qv = (t + shift) as u8;
        }
        qr[k..].fill(pad);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Numbers in [-1, 1) from a fixed sequence (the argmax screen's tests use them too).
    pub(crate) fn data(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 33) % 20001) as f32 / 10000.0 - 1.0
            })
            .collect()
    }

    /// Every int8 kernel this CPU runs.
    pub(crate) fn kernels() -> Vec<Int8Kernel> {
        [Int8Kernel::Scalar, Int8Kernel::Avx2, Int8Kernel::Avx512Vnni]
            .into_iter()
            .filter(|k| k.available())
            .collect()
    }

    /// Every kernel gives the scalar kernel's output bit for bit, at shapes with edges (rows
    /// not a multiple of the tiles' 2, 3 or 4, outputs not a multiple of 8, 16 or 64, inputs
    /// not a multiple of 4, 16 or 32).
    #[test]
    fn every_kernel_equals_the_scalar_one_exactly() {
        // The last three are large enough for forward_parallel to split rows, then outputs.
        for (n, out, k) in [
            (1, 1, 1),
            (3, 17, 5),
            (5, 70, 37),
            (9, 130, 256),
            (4, 64, 64),
            (2, 8, 16),
            (6, 24, 32),
            (7, 9, 3),
            (11, 41, 33),
            (13, 23, 100),
            (1, 57, 130),
            (2, 33, 47),
            (25, 100, 510),
            (37, 300, 256),
            (3, 2000, 256),
            (5, 1003, 515),
        ] {
            let w = data(out * k, 1);
            let b = data(out, 2);
            let x = data(n * k, 3);
            let want = product(Int8Kernel::Scalar, &w, &b, &x, out, k);
            for kern in kernels() {
                let q = QuantizedLinear::new(&w, &b, out, k, kern);
                let y = product(kern, &w, &b, &x, out, k);
                assert_eq!(y, want, "{} at {n}x{out}x{k}", kern.name());
                let mut y = vec![0f32; n * out];
                q.forward_parallel(&mut y, &x);
                assert_eq!(y, want, "{} in parallel at {n}x{out}x{k}", kern.name());
            }
        }
    }

    /// `x W^T + b` by `kern` (`w`: `out x k`), on this thread.
    fn product(
        kern: Int8Kernel,
        w: &[f32],
        b: &[f32],
        x: &[f32],
        out: usize,
        k: usize,
    ) -> Vec<f32> {
        let q = QuantizedLinear::new(w, b, out, k, kern);
        let mut y = vec![0f32; x.len() / k * out];
        q.forward(&mut y, x);
        y
    }

    /// Every kernel's outputs over a range of outputs (starting on a block of 16, as
    /// forward_parallel cuts them) are the same outputs of the whole product, bit for bit.
    #[test]
    fn output_ranges_equal_the_whole_product() {
        let (n, out, k) = (7, 77, 45);
        let w = data(out * k, 7);
        let b = data(out, 8);
        let x = data(n * k, 9);
        for kern in kernels() {
            let q = QuantizedLinear::new(&w, &b, out, k, kern);
            let all = product(kern, &w, &b, &x, out, k);
            for outs in [0..16, 16..48, 32..77, 64..77, 48..64, 0..77, 16..17] {
                let width = outs.len();
                let mut y = vec![0f32; n * width];
                q.forward_outputs(&mut y, &x, outs.clone());
                for i in 0..n {
                    assert_eq!(
                        y[i * width..(i + 1) * width],
                        all[i * out + outs.start..i * out + outs.end],
                        "{} row {i}, outputs {outs:?}",
                        kern.name()
                    );
                }
            }
        }
    }

    /// The extremes: rows and weights quantized to +-127 only (every pair of products at the
    /// largest magnitude, 2 x 127 x 127, where a saturating i16 sum would show), of both
    /// signs and mixed, and zeros; every kernel equals the scalar one and the exact sum.
    #[test]
    fn extreme_values_are_exact() {
        let (n, out, k) = (5, 19, 1030);
        let sign = |i: usize, pattern: usize| -> f32 {
            match pattern {
                0 => 1.0,
                1 => -1.0,
                2 => {
                    if i % 2 == 0 {
                        1.0
                    } else {
                        -1.0
                    }
                }
                _ => {
                    if (i / 3) % 2 == 0 {
                        -1.0
                    } else {
                        1.0
                    }
                }
            }
        };
        let w: Vec<f32> = (0..out * k).map(|t| sign(t % k, (t / k) % 4)).collect();
        let x: Vec<f32> = (0..n * k)
            .map(|t| if t / k == 4 { 0.0 } else { sign(t % k, t / k) })
            .collect();
        let b = vec![0f32; out];
        let want = product(Int8Kernel::Scalar, &w, &b, &x, out, k);
        for kern in kernels() {
            let y = product(kern, &w, &b, &x, out, k);
            assert_eq!(y, want, "{}", kern.name());
            for i in 0..n {
                for o in 0..out {
                    // The scales are 1 / 127 on both sides: y = sum of +-1 products.
                    let want: f32 = (0..k).map(|j| x[i * k + j] * w[o * k + j]).sum();
                    let got = y[i * out + o];
                    assert!(
                        (got - want).abs() <= 1e-3 * want.abs().max(1.0),
                        "{} ({i}, {o}): {got} vs {want}",
                        kern.name()
                    );
                }
            }
        }
    }

    /// The int8 product is the f32 product up to the quantization error: each term's error
    /// is at most half a step of each factor, so `|y - y32| <= sum_k (|x| ds_w + |w| ds_x) / 2
    /// + ds_x ds_w k / 4` per output, with steps `ds = max / 127`.
    #[test]
    fn int8_is_the_f32_product_within_the_quantization_error() {
        let (n, out, k) = (6, 40, 96);
        let w = data(out * k, 4);
        let b = data(out, 5);
        let x = data(n * k, 6);
        let y = product(Int8Kernel::detect(), &w, &b, &x, out, k);
        let mut worst = 0f32;
        for i in 0..n {
            let xr = &x[i * k..(i + 1) * k];
            let dx = xr.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for o in 0..out {
                let wr = &w[o * k..(o + 1) * k];
                let dw = wr.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum::<f32>() + b[o];
                let bound: f32 = xr
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| (a.abs() * dw + b.abs() * dx) / 2.0 + dx * dw / 4.0)
                    .sum::<f32>()
                    + 1e-5;
                let err = (y[i * out + o] - exact).abs();
                assert!(err <= bound, "({i}, {o}): error {err} over bound {bound}");
                worst = worst.max(err / bound);
            }
        }
        // The bound is not vacuous: the error uses a fair part of it somewhere.
        assert!(worst > 0.01, "worst error / bound {worst}");
    }

    #[test]
    fn zero_rows_and_weights_give_the_bias() {
        let q = QuantizedLinear::new(&[0.0; 6], &[1.0, 2.0], 2, 3, Int8Kernel::detect());
        let mut y = vec![9f32; 4];
        q.forward(&mut y, &[0.0; 6]);
        assert_eq!(y, vec![1.0, 2.0, 1.0, 2.0]);
    }
}
