//! bf16 matrix products with fp32 accumulation, for the mixed-precision path of the fused
//! kernels, on one of two kinds of hardware:
//! - the AMX tile units (Intel Xeon since Sapphire Rapids): `tdpbf16ps`, a 16 x 16 block of
//!   C per instruction;
//! - AVX512-BF16 dot products (AMD Zen 4 and 5, Intel Cooper Lake; also on AMX CPUs):
//!   `vdpbf16ps`, 16 lanes each adding two bf16 products per instruction.
//!
//! # Why by hand
//! Neither the `gemm` crate nor candle's CPU backend has bf16 products on either unit, and
//! Rust's AMX intrinsics (`_tile_*`, target feature `amx-tile`) are unstable on Rust 1.95.
//! Inline assembly is stable, so the AMX micro-kernel is ten instructions of it. On the
//! project's 2-core Sapphire Rapids it runs the language-model loss's block products at
//! 440-480 GFLOP/s on one core with the operands in cache (250-300 per core with both busy),
//! against 120-150 for gemm's fp32 AVX-512 kernels on the same machine (the `speed` test
//! below). The AVX512-BF16 intrinsics are stable; on a Zen 5 core `vdpbf16ps` peaks at twice
//! the fp32 FMA rate (462 vs 232 GFLOP/s per core, measured on the 2-core AMD EPYC).
//!
//! # Layouts
//! Both instructions read the same operand layouts. `tdpbf16ps C, A, B` adds to the 16 x 16
//! fp32 tile `C` the product of `A`, 16 rows by 32 bf16 values of K, and `B`, 16 pairs of K
//! rows by 16 columns stored "VNNI" style: the two bf16 values of K rows `2p` and `2p + 1` of
//! one column sit next to each other in one 32-bit word. `vdpbf16ps` takes one such pair of A
//! (broadcast) against one row of 16 words of B. So:
//! - left operands are row-major bf16 (`pack_rows`, `pack_rows_transposed`), rows padded
//!   to a multiple of 32 and K to a multiple of 32 with zeros;
//! - right operands are `u32` words, one per (pair of K rows, column)
//!   (`pack_pairs_of_rows`, `pack_pairs_of_cols`), K padded to a multiple of 32 and the
//!   columns to a multiple of 32 with zeros.
//!
//! The AMX micro-kernel computes a 32 x 32 block of C with 4 accumulator tiles, 2 tiles of A
//! and 2 of B per 32 values of K (each tile of A and B loaded once, used twice); the AVX-512
//! one an 8 x 32 block in 16 registers, 2 loads of B and 8 broadcasts of A per pair of K.
//!
//! # Rounding
//! fp32 values are rounded to the nearest bf16 (ties to even): 8 significant bits, a relative
//! error of at most 2^-9 per operand. Products of two bf16 values are exact in fp32, and the
//! sums are fp32 (in an order that differs between the two units). A dot product of length K
//! with unit-size terms is then off by about `2^-9 * sqrt(K)` relative to its terms' scale
//! (the tests bound it).

/// The hardware that runs the bf16 matrix products (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// AMX-TILE and AMX-BF16.
    Amx,
    /// AVX-512F with AVX512-BF16.
    Avx512Bf16,
}

impl Backend {
    /// How messages name it.
    pub fn describe(self) -> &'static str {
        match self {
            Backend::Amx => "the AMX units",
            Backend::Avx512Bf16 => "AVX512-BF16 dot products",
        }
    }
}

/// The bf16 products this CPU runs, checked once: AMX when the CPU has AMX-TILE and AMX-BF16
/// and the OS granted the process the tile state (Linux 5.16+,
/// `arch_prctl(ARCH_REQ_XCOMP_PERM)`), else AVX512-BF16 where the CPU has it, else none (the
/// fp32 path runs instead). The environment variable `TRANSFORMER_NO_AMX` rules out AMX, and
/// `TRANSFORMER_NO_BF16` both.
pub fn backend() -> Option<Backend> {
    use std::sync::OnceLock;
    static BACKEND: OnceLock<Option<Backend>> = OnceLock::new();
    *BACKEND.get_or_init(|| {
        if std::env::var_os("TRANSFORMER_NO_BF16").is_some() {
            None
        } else if std::env::var_os("TRANSFORMER_NO_AMX").is_none() && supports(Backend::Amx) {
            Some(Backend::Amx)
        } else if supports(Backend::Avx512Bf16) {
            Some(Backend::Avx512Bf16)
        } else {
            None
        }
    })
}

/// Whether bf16 products can run here: some [`backend`] is available.
pub fn available() -> bool {
    backend().is_some()
}

/// Whether this CPU (and OS) can run `unit`, whichever [`backend`] chose. Checked once.
pub fn supports(unit: Backend) -> bool {
    use std::sync::OnceLock;
    static AMX: OnceLock<bool> = OnceLock::new();
    match unit {
        Backend::Amx => *AMX.get_or_init(imp::detect),
        Backend::Avx512Bf16 => dot::detect(),
    }
}

/// Rounds to the nearest bf16, ties to even (the bits of the upper half of an f32). NaN stays
/// NaN for the quiet NaNs arithmetic produces.
#[inline(always)]
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The f32 value of bf16 bits.
#[inline(always)]
pub(crate) fn bf16_value(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// A 64-byte-aligned slice of `len` values inside `buf` (tile loads and stores are fastest
/// on whole cache lines). Not cleared: whatever `buf` held before, zeros when it grows.
pub(crate) fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len + 16 {
        buf.resize(len + 16, 0.0);
    }
    let skip = buf.as_ptr().align_offset(64).min(16);
    &mut buf[skip..skip + len]
}

/// Rounds `n` up to a multiple of 32 (the kernel's block size in M, N and K).
pub(crate) fn pad32(n: usize) -> usize {
    n.div_ceil(32) * 32
}

/// A packing's source: `rows x cols` values, row `r` starting at `r * ld`.
pub(crate) type Layout = (usize, usize, usize);

/// `dst` cleared to `rows` rows of `width` zeros; returns `width`.
fn zeroed_rows<T: Copy + Default>(dst: &mut Vec<T>, rows: usize, width: usize) -> usize {
    dst.clear();
    dst.resize(rows * width, T::default());
    width
}

/// Left operand: `dst[r * kp + k] = bf16(src[r * ld + k])` for `r < rows`, `k < cols`, and 0
/// in the padding up to `pad32(rows)` rows of `kp = pad32(cols)` values.
pub(crate) fn pack_rows(src: &[f32], (rows, cols, ld): Layout, dst: &mut Vec<u16>) {
    let kp = zeroed_rows(dst, pad32(rows), pad32(cols));
    super::float::simd(
        #[inline(always)]
        || {
            for (r, out) in dst.chunks_exact_mut(kp).take(rows).enumerate() {
                for (o, &x) in out.iter_mut().zip(&src[r * ld..r * ld + cols]) {
                    *o = bf16_bits(x);
                }
            }
        },
    );
}

/// Left operand from the transpose of `src` (`rows x cols`, row stride `ld`):
/// `dst[k * rp + r] = bf16(src[r * ld + k])`, `pad32(cols)` rows of `rp = pad32(rows)` values.
pub(crate) fn pack_rows_transposed(src: &[f32], (rows, cols, ld): Layout, dst: &mut Vec<u16>) {
    let rp = zeroed_rows(dst, pad32(cols), pad32(rows));
    assert!(rows == 0 || src.len() >= (rows - 1) * ld + cols);
    // In 16 x 16 tiles: each row of 16 values converted in one go (vectorised), transposed
    // through a 512-byte buffer in L1, and written as 16 contiguous values per row of `dst`
    // (0.17 ms for a 512 x 200 block with element-wise stores, 32 x 32 tiles).
    super::float::simd(
        #[inline(always)]
        || {
            let mut tile = [[0u16; 16]; 16];
            for r0 in (0..rows).step_by(16) {
                let rn = 16.min(rows - r0);
                for k0 in (0..cols).step_by(16) {
                    let kn = 16.min(cols - k0);
                    let mut conv = [0u16; 16];
                    for r in 0..rn {
                        let row = &src[(r0 + r) * ld + k0..][..kn];
                        for (c, &x) in conv.iter_mut().zip(row) {
                            *c = bf16_bits(x);
                        }
                        for (k, &c) in conv[..kn].iter().enumerate() {
                            tile[k][r] = c;
                        }
                    }
                    for (k, t) in tile[..kn].iter().enumerate() {
                        dst[(k0 + k) * rp + r0..][..rn].copy_from_slice(&t[..rn]);
                    }
                }
            }
        },
    );
}

/// Right operand whose K runs down the rows of `src` (`rows x cols`, row stride `ld`): word
/// `(p, j)` pairs `src[2p][j]` (low half) with `src[2p + 1][j]` (high half).
/// `pad32(rows) / 2` rows of `np = pad32(cols)` words.
pub(crate) fn pack_pairs_of_rows(src: &[f32], (rows, cols, ld): Layout, dst: &mut Vec<u32>) {
    let np = zeroed_rows(dst, pad32(rows) / 2, pad32(cols));
    super::float::simd(
        #[inline(always)]
        || {
            for (p, out) in dst.chunks_exact_mut(np).enumerate() {
                let r = 2 * p;
                if r >= rows {
                    break;
                }
                let lo = &src[r * ld..r * ld + cols];
                if r + 1 < rows {
                    let hi = &src[(r + 1) * ld..(r + 1) * ld + cols];
                    for ((o, &a), &b) in out.iter_mut().zip(lo).zip(hi) {
                        *o = bf16_bits(a) as u32 | (bf16_bits(b) as u32) << 16;
                    }
                } else {
                    for (o, &a) in out.iter_mut().zip(lo) {
                        *o = bf16_bits(a) as u32;
                    }
                }
            }
        },
    );
}

/// Right operand whose K runs along the rows of `src` (`rows x cols`, row stride `ld`), i.e.
/// the operand is `src` transposed: word `(p, j)` pairs `src[j][2p]` with `src[j][2p + 1]`.
/// `pad32(cols) / 2` rows of `np = pad32(rows)` words.
pub(crate) fn pack_pairs_of_cols(src: &[f32], (rows, cols, ld): Layout, dst: &mut Vec<u32>) {
    let np = zeroed_rows(dst, pad32(cols) / 2, pad32(rows));
    for j in 0..rows {
        let row = &src[j * ld..j * ld + cols];
        for (p, pair) in row.chunks(2).enumerate() {
            let hi = pair.get(1).map_or(0, |&b| bf16_bits(b) as u32);
            dst[p * np + j] = bf16_bits(pair[0]) as u32 | hi << 16;
        }
    }
}

/// `c[i * ldc + j] (+)= sum_k A[i][k] B[k][j]` for `i < m`, `j < n`, with `A` a packed left
/// operand (`pad32(m)` rows of `kp` bf16 values, [`pack_rows`]) and `B` a packed right
/// operand (`kp / 2` rows of `ldb` words, `ldb >= pad32(n)`). `kp` must be a multiple of 32
/// and the padding zero. With `accumulate` the product is added to `c`, else it replaces it.
/// Runs on the calling thread.
///
/// # Panics
/// If no [`backend`] is available or a slice is too short for the sizes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_bf16(
    c: &mut [f32],
    ldc: usize,
    m: usize,
    n: usize,
    a: &[u16],
    kp: usize,
    b: &[u32],
    ldb: usize,
    accumulate: bool,
) {
    let unit = backend().expect("gemm_bf16 needs AMX or AVX512-BF16");
    gemm_bf16_on(unit, Gemm(c, ldc, m, n, a, kp, b, ldb, accumulate));
}

/// The arguments of one [`gemm_bf16`] in its order (`c, ldc, m, n, a, kp, b, ldb,
/// accumulate`), as its units' kernels take them.
struct Gemm<'a>(
    &'a mut [f32],
    usize,
    usize,
    usize,
    &'a [u16],
    usize,
    &'a [u32],
    usize,
    bool,
);

/// [`gemm_bf16`] on the given unit (the tests run both where the CPU has both).
///
/// # Panics
/// If this CPU does not [`supports`] `unit`, or a slice is too short for the sizes.
fn gemm_bf16_on(unit: Backend, g: Gemm) {
    let Gemm(c, ldc, m, n, a, kp, b, ldb, accumulate) = g;
    assert!(supports(unit), "this CPU has no {}", unit.describe());
    assert!(kp.is_multiple_of(32) && ldb >= pad32(n) && ldb.is_multiple_of(16));
    assert!(a.len() >= pad32(m) * kp && b.len() >= kp / 2 * ldb);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && c.len() >= (m - 1) * ldc + n);
    if kp == 0 {
        if !accumulate {
            for row in c.chunks_mut(ldc).take(m) {
                row[..n].fill(0.0);
            }
        }
        return;
    }
    if unit == Backend::Avx512Bf16 {
        // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked), and the sizes
        // were checked above as `dot::gemm` requires.
        unsafe { dot::gemm(Gemm(c, ldc, m, n, a, kp, b, ldb, accumulate)) };
        return;
    }
    // SAFETY: AMX is supported (checked), and every tile access stays inside the slices: A
    // rows i0..i0+32 < pad32(m) of kp values, B rows < kp/2 of ldb >= pad32(n) words, and
    // blocks of C that would cross its m x n edge go through `edge`, a 32 x 32 scratch.
    unsafe {
        imp::configure();
        let mut edge = [0f32; 32 * 32];
        for j0 in (0..n).step_by(32) {
            for i0 in (0..m).step_by(32) {
                let ap = a.as_ptr().add(i0 * kp);
                let bp = b.as_ptr().add(j0);
                let (mi, nj) = ((m - i0).min(32), (n - j0).min(32));
                if mi == 32 && nj == 32 {
                    let cp = c.as_mut_ptr().add(i0 * ldc + j0);
                    imp::block(ap, kp * 2, bp, ldb * 4, kp, cp, ldc * 4, accumulate);
                } else {
                    edge.fill(0.0);
                    if accumulate {
                        for i in 0..mi {
                            let src = &c[(i0 + i) * ldc + j0..][..nj];
                            edge[i * 32..i * 32 + nj].copy_from_slice(src);
                        }
                    }
                    imp::block(
                        ap,
                        kp * 2,
                        bp,
                        ldb * 4,
                        kp,
                        edge.as_mut_ptr(),
                        128,
                        accumulate,
                    );
                    for i in 0..mi {
                        c[(i0 + i) * ldc + j0..][..nj].copy_from_slice(&edge[i * 32..i * 32 + nj]);
                    }
                }
            }
        }
        imp::release();
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use std::arch::asm;

    pub(super) fn detect() -> bool {
        // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
        #[allow(unused_unsafe)]
        let leaf = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
        let has = |bit: u32| leaf.edx >> bit & 1 == 1;
        if !(has(22) && has(24)) {
            return false;
        }
        // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): without it the first
        // tile instruction faults.
        // SAFETY: a plain syscall with two integer arguments; it touches no memory of ours.
        let ret: isize;
        unsafe {
            asm!("syscall", inlateout("rax") 158isize => ret, in("rdi") 0x1023usize,
                 in("rsi") 18usize, lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        ret == 0
    }

    /// The tile configuration: palette 1, tiles 0-7 all 16 rows of 64 bytes
    /// (0-3: C accumulators, 4-5: A, 6-7: B).
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    /// Loads the tile configuration on this thread.
    ///
    /// # Safety
    /// AMX must be available.
    pub(super) unsafe fn configure() {
        let mut cfg = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        asm!("ldtilecfg [{}]", in(reg) &cfg, options(nostack, readonly));
    }

    /// Releases this thread's tile state (so context switches stop saving 8 KB of it).
    ///
    /// # Safety
    /// AMX must be available.
    pub(super) unsafe fn release() {
        asm!("tilerelease", options(nostack, nomem));
    }

    /// One 32 x 32 block of C (row stride `ldc` bytes) `(+)=` A (32 rows, stride `lda` bytes)
    /// times B (`k / 2` rows of 32 words, stride `ldb` bytes), over `k` values of K (a
    /// positive multiple of 32).
    ///
    /// # Safety
    /// The tiles must be configured ([`configure`]) and every row addressed must be readable
    /// (A: 32 rows of 2k bytes; B: k/2 rows of 128 bytes) or writable (C: 32 rows of 128 bytes).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) unsafe fn block(
        a: *const u16,
        lda: usize,
        b: *const u32,
        ldb: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let c0 = c as *mut u8;
        let (c1, c2) = (c0.add(64), c0.add(16 * ldc));
        let c3 = c2.add(64);
        if accumulate {
            asm!(
                "tileloadd tmm0, [{c0} + {ldc}*1]",
                "tileloadd tmm1, [{c1} + {ldc}*1]",
                "tileloadd tmm2, [{c2} + {ldc}*1]",
                "tileloadd tmm3, [{c3} + {ldc}*1]",
                c0 = in(reg) c0, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3,
                ldc = in(reg) ldc, options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem),
            );
        }
        asm!(
            "2:",
            "tileloadd tmm4, [{a} + {lda}*1]",
            "tileloadd tmm6, [{b} + {ldb}*1]",
            "tileloadd tmm5, [{a2} + {lda}*1]",
            "tileloadd tmm7, [{b2} + {ldb}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a}, 64",
            "add {a2}, 64",
            "add {b}, {bstep}",
            "add {b2}, {bstep}",
            "sub {k}, 32",
            "jnz 2b",
            a = inout(reg) a => _,
            a2 = inout(reg) (a as *const u8).add(16 * lda) => _,
            b = inout(reg) b => _,
            b2 = inout(reg) (b as *const u8).add(64) => _,
            lda = in(reg) lda,
            ldb = in(reg) ldb,
            bstep = in(reg) 16 * ldb,
            k = inout(reg) k => _,
            options(nostack, readonly),
        );
        asm!(
            "tilestored [{c0} + {ldc}*1], tmm0",
            "tilestored [{c1} + {ldc}*1], tmm1",
            "tilestored [{c2} + {ldc}*1], tmm2",
            "tilestored [{c3} + {ldc}*1], tmm3",
            c0 = in(reg) c0, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3,
            ldc = in(reg) ldc, options(nostack),
        );
    }
}

/// The AVX512-BF16 kernel.
#[cfg(target_arch = "x86_64")]
mod dot {
    use std::arch::x86_64::*;

    pub(super) fn detect() -> bool {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }

    /// Rows of C per micro-kernel call: 8 rows of 32 columns are 16 accumulator registers
    /// (`vdpbf16ps` needs about 12 in flight to keep both of a Zen 5 core's units busy), and
    /// 8 divides the 32-row padding of the left operand, so no call reads past it.
    const ROWS: usize = 8;

    /// The mask of the first `lanes` (at most 16) of 16.
    fn lane_mask(lanes: usize) -> __mmask16 {
        ((1u32 << lanes.min(16)) - 1) as __mmask16
    }

    /// [`super::gemm_bf16`] on the AVX-512 units: for each panel of 32 columns of B (which
    /// stays in L1 across the rows), 8 x 32 blocks of C down the rows, each over all of K.
    /// Columns past `n` are masked off when C is read and written.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX512-BF16 ([`detect`]), and the sizes must be as
    /// [`super::gemm_bf16`] checks them: `m, n > 0`, `kp` a positive multiple of 32,
    /// `a.len() >= pad32(m) * kp`, `b.len() >= kp / 2 * ldb`, `ldb >= pad32(n)`, `ldc >= n`
    /// and `c.len() >= (m - 1) * ldc + n`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn gemm(g: super::Gemm) {
        let super::Gemm(c, ldc, m, n, a, kp, b, ldb, accumulate) = g;
        let pairs = kp / 2;
        // Row i of A as pairs of K: words a[i * pairs..(i + 1) * pairs].
        let a = a.as_ptr() as *const u32;
        let c = c.as_mut_ptr();
        for j0 in (0..n).step_by(32) {
            let nj = (n - j0).min(32);
            let masks = [lane_mask(nj), lane_mask(nj.saturating_sub(16))];
            let bp = b.as_ptr().add(j0);
            for i0 in (0..m).step_by(ROWS) {
                let rows = ROWS.min(m - i0);
                let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
                if accumulate {
                    for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                        let cr = c.add((i0 + r) * ldc + j0);
                        acc[0] = _mm512_maskz_loadu_ps(masks[0], cr);
                        acc[1] = _mm512_maskz_loadu_ps(masks[1], cr.add(16));
                    }
                }
                let ap = a.add(i0 * pairs);
                for p in 0..pairs {
                    let brow = bp.add(p * ldb) as *const i32;
                    let b0: __m512bh = std::mem::transmute(_mm512_loadu_epi32(brow));
                    let b1: __m512bh = std::mem::transmute(_mm512_loadu_epi32(brow.add(16)));
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let pair = ap.add(r * pairs + p).read_unaligned() as i32;
                        let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                        acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                        acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                    }
                }
                for (r, acc) in acc.iter().enumerate().take(rows) {
                    let cr = c.add((i0 + r) * ldc + j0);
                    _mm512_mask_storeu_ps(cr, masks[0], acc[0]);
                    _mm512_mask_storeu_ps(cr.add(16), masks[1], acc[1]);
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod dot {
    pub(super) fn detect() -> bool {
        false
    }
    pub(super) unsafe fn gemm(_: super::Gemm) {
        unreachable!("AVX512-BF16 is never available here")
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    pub(super) fn detect() -> bool {
        false
    }
    pub(super) unsafe fn configure() {}
    pub(super) unsafe fn release() {}
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block(
        _: *const u16,
        _: usize,
        _: *const u32,
        _: usize,
        _: usize,
        _: *mut f32,
        _: usize,
        _: bool,
    ) {
        unreachable!("AMX is never available here")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: u64) -> Vec<f32> {
        (0..len)
            .map(|i| crate::rng::uniform_at(seed, 0, i as u64) as f32 * 2.0 - 1.0)
            .collect()
    }

    /// C = A B on each unit this CPU supports, for every packing: A as rows or transposed, B
    /// as pairs of rows or of columns, at sizes that are and are not multiples of 32 (and of
    /// the AVX-512 kernel's 8 rows), replacing and accumulating. Compared
    /// with the f64 product of the bf16-rounded operands, which only fp32 accumulation
    /// rounding separates from the kernel's result.
    #[test]
    fn products_match_the_rounded_operands() {
        let units: Vec<Backend> = [Backend::Amx, Backend::Avx512Bf16]
            .into_iter()
            .filter(|&u| supports(u))
            .collect();
        if units.is_empty() {
            eprintln!("neither AMX nor AVX512-BF16 here: nothing to check");
            return;
        }
        let sizes = [
            (32, 32, 32),
            (1, 1, 1),
            (45, 70, 33),
            (64, 200, 700),
            (200, 33, 512),
            (9, 17, 64),
        ];
        for (unit, (m, n, k)) in units.iter().flat_map(|&u| sizes.map(|s| (u, s))) {
            let a = values(m * k, 1); // m x k
            let bt = values(n * k, 2); // n x k, i.e. B^T
            let b = {
                let mut b = vec![0f32; k * n]; // k x n
                for i in 0..k {
                    for j in 0..n {
                        b[i * n + j] = bt[j * k + i];
                    }
                }
                b
            };
            let at = {
                let mut at = vec![0f32; k * m]; // k x m
                for i in 0..m {
                    for j in 0..k {
                        at[j * m + i] = a[i * k + j];
                    }
                }
                at
            };
            let round = |x: f32| bf16_value(bf16_bits(x)) as f64;
            let kp = pad32(k);
            let (mut pa, mut pat, mut pb, mut pbt) = (vec![], vec![], vec![], vec![]);
            pack_rows(&a, (m, k, k), &mut pa);
            pack_rows_transposed(&at, (k, m, m), &mut pat);
            pack_pairs_of_rows(&b, (k, n, n), &mut pb);
            pack_pairs_of_cols(&bt, (n, k, k), &mut pbt);
            assert_eq!(pa, pat, "both packings of A agree");
            assert_eq!(pb, pbt, "both packings of B agree");
            let ldc = n + 3;
            let init = values(m * ldc, 3);
            for accumulate in [false, true] {
                let mut c = init.clone();
                let ldb = pad32(n);
                let g = Gemm(&mut c, ldc, m, n, &pa, kp, &pb, ldb, accumulate);
                gemm_bf16_on(unit, g);
                for i in 0..m {
                    for j in 0..n {
                        let mut want: f64 = (0..k)
                            .map(|t| round(a[i * k + t]) * round(b[t * n + j]))
                            .sum();
                        if accumulate {
                            want += init[i * ldc + j] as f64;
                        }
                        let got = c[i * ldc + j] as f64;
                        assert!(
                            (got - want).abs() <= 1e-5 * (k as f64).sqrt() * 2.0,
                            "{unit:?} {m}x{n}x{k} acc={accumulate} ({i},{j}): {got} vs {want}"
                        );
                    }
                    // The padding columns of C's rows are untouched.
                    for j in n..ldc {
                        assert_eq!(c[i * ldc + j], init[i * ldc + j]);
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        assert_eq!(
            bf16_value(bf16_bits(1.0 + 1.0 / 256.0)),
            1.0,
            "tie goes to even"
        );
        assert_eq!(
            bf16_value(bf16_bits(1.0 + 3.0 / 256.0)),
            1.0 + 4.0 / 256.0,
            "tie to even"
        );
        assert_eq!(bf16_value(bf16_bits(1.0 + 1.5 / 256.0)), 1.0 + 2.0 / 256.0);
        assert!(bf16_value(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_value(bf16_bits(-3.0)), -3.0);
    }
}
