//! The fused GPU kernels (`src/cuda/fused.cu`, compiled to PTX by the build script) as candle
//! ops, each with its backward pass as another op: layer norm, softmax with a scale, a
//! keep-mask and dropout (attention's), dropout, bias + activation + dropout (the
//! feed-forward block's hidden layer) and the output layer's label-smoothed cross-entropy;
//! and, over many tensors at once, the gradients' sum of squares and an Adam step.
//! f32 and f64 tensors on a CUDA device; the public functions that use them
//! ([`crate::layer_norm`], [`crate::softmax_last_dim`], [`crate::gpu::attention_gpu`],
//! [`crate::dropout()`], [`crate::gpu::bias_activation_dropout`],
//! [`crate::gpu::linear_smoothed_cross_entropy`], [`crate::linear_cross_entropy`],
//! [`crate::gpu::sum_of_squares`], [`crate::gpu::adam_step`]) decide, by the tensors' device and dtype, where
//! they run. Each replaces about ten of candle's element-wise kernels forward and twenty
//! backward with one or three; `crates/cli/tests/cuda_parity.rs` checks each, forward and
//! every gradient, against the composed ops on the CPU.

use crate::layer_activation::Activation;
use crate::rng::MaskSpec;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{
    bail, CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Storage,
    Tensor, WithDType,
};

/// `src/cuda/fused.cu` compiled to PTX by the build script.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fused.ptx"));

/// The name the PTX module is loaded under on each device.
const MODULE: &str = "transformer_fused";

/// Threads per block of the row kernels (8 warps: one row per warp, 8 rows per block).
const ROW_THREADS: u32 = 256;

/// Threads per block of the cross-entropy's row kernels (one block per row of V logits).
const XENT_THREADS: u32 = 512;

/// Rows per chunk of the column sums (each chunk's partial sums, then one final sum).
const COL_CHUNK: usize = 64;

/// Whether the fused GPU kernels take these tensors: all on one CUDA device, all f32 or all
/// f64 (bf16 products come from the matrix products around them, [`crate::autocast`]), and
/// the kernels not switched off ([`enabled`]).
pub(crate) fn applies(ts: &[&Tensor]) -> bool {
    let dtype = ts[0].dtype();
    enabled()
        && matches!(dtype, DType::F32 | DType::F64)
        && ts
            .iter()
            .all(|t| t.device().is_cuda() && t.dtype() == dtype)
}

/// False where the environment variable `TRANSFORMER_CUDA_FUSED` is `0`: then every layer
/// runs composed of candle's ops on the GPU too (as before these kernels; for comparisons).
/// Read once.
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("TRANSFORMER_CUDA_FUSED").map_or(true, |v| v != "0"))
}

/// An element type the kernels exist for.
trait Elem: CudaDType + DeviceRepr + ValidAsZeroBits + WithDType + Copy {
    /// The kernels' name suffix.
    const SUFFIX: &'static str;
}

impl Elem for f32 {
    const SUFFIX: &'static str = "f32";
}

impl Elem for f64 {
    const SUFFIX: &'static str = "f64";
}

/// The name of kernel `name` for element type `T`.
fn kname<T: Elem>(name: &str) -> String {
    format!("{name}_{}", T::SUFFIX)
}

/// Kernel `$name` for element type `$t` on `$dev` (the module loaded on first use).
macro_rules! func {
    ($t:ty, $dev:expr, $name:expr) => {
        $dev.get_or_load_custom_func(&kname::<$t>($name), MODULE, PTX)
    };
}

/// The contiguous elements behind a storage with `l`, as a view.
fn view<'a, T: Elem>(
    s: &'a CudaStorage,
    l: &Layout,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("kernels (cuda): expected a contiguous tensor, got layout {l:?}");
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// `f` with the CUDA storage and layout of `t`.
fn with_cuda<R>(t: &Tensor, f: impl FnOnce(&CudaStorage, &Layout) -> Result<R>) -> Result<R> {
    let (s, l) = t.storage_and_layout();
    match &*s {
        Storage::Cuda(c) => f(c, l),
        _ => bail!("kernels (cuda): expected a tensor on a CUDA device"),
    }
}

/// Blocks of [`ROW_THREADS`] for `rows` rows of one warp each.
fn row_config(rows: usize) -> LaunchConfig {
    let warps = (ROW_THREADS / 32) as usize;
    LaunchConfig {
        grid_dim: (rows.div_ceil(warps).max(1) as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A grid-stride elementwise launch over `n` elements.
fn elementwise_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535 * 4);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Runs `f::<f32>` or `f::<f64>` by `dtype`.
macro_rules! by_dtype {
    ($name:expr, $dtype:expr, $f:ident ( $($arg:expr),* )) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            dt => bail!("{}: f32 or f64 only, got {dt:?}", $name),
        }
    };
}

/// Column sums of the (rows, c) matrix `dy` into `out` (c,) — with `ln = Some((x, stats))`
/// the layer norm's weight gradient `sum(dy * xhat)` into `out` and the bias's `sum(dy)`
/// into `out2` — through per-chunk partials and one final sum.
#[allow(clippy::too_many_arguments)]
fn column_sums<T: Elem>(
    dev: &CudaDevice,
    dy: &candle_core::cuda_backend::cudarc::driver::CudaView<'_, T>,
    ln: Option<(
        &candle_core::cuda_backend::cudarc::driver::CudaView<'_, T>,
        &candle_core::cuda_backend::cudarc::driver::CudaSlice<T>,
    )>,
    out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, T>,
    out2: Option<&mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, T>>,
    rows: usize,
    c: usize,
) -> Result<()> {
    let chunks = rows.div_ceil(COL_CHUNK).max(1);
    // SAFETY: every partial is written by `col_partials` below (zeros for empty chunks).
    let part = unsafe { dev.alloc::<T>(chunks * c)? };
    let part2 = unsafe { dev.alloc::<T>(chunks * c)? };
    let null = 0u64;
    let (rows_i, c_i, chunk_i) = (rows as i32, c as i32, COL_CHUNK as i32);
    let f = func!(T, dev, "col_partials")?;
    let mut b = f.builder();
    b.arg(dy);
    match &ln {
        Some((x, stats)) => {
            b.arg(*x).arg(*stats).arg(&part).arg(&part2);
        }
        None => {
            b.arg(&null).arg(&null).arg(&part).arg(&null);
        }
    }
    b.arg(&rows_i).arg(&c_i).arg(&chunk_i);
    let cfg = LaunchConfig {
        grid_dim: (c.div_ceil(32) as u32, chunks as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments match `col_partials`'s signature; every index is bounded by
    // `rows` and `c`.
    unsafe { b.launch(cfg) }.w()?;
    let fin = func!(T, dev, "col_final")?;
    let cfg = LaunchConfig {
        grid_dim: (c.div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let chunks_i = chunks as i32;
    let mut b = fin.builder();
    b.arg(&part).arg(out).arg(&chunks_i).arg(&c_i);
    // SAFETY: as above.
    unsafe { b.launch(cfg) }.w()?;
    if let Some(out2) = out2 {
        let mut b = fin.builder();
        b.arg(&part2).arg(out2).arg(&chunks_i).arg(&c_i);
        // SAFETY: as above.
        unsafe { b.launch(cfg) }.w()?;
    }
    Ok(())
}

/// Splits a packed `(n + k c)` result into its first `n` elements in `shape` and `k` vectors
/// of `c`.
fn unpack(packed: &Tensor, shape: &Shape, c: usize, k: usize) -> Result<(Tensor, Vec<Tensor>)> {
    let n = shape.elem_count();
    let head = packed.narrow(0, 0, n)?.reshape(shape)?;
    let tails = (0..k)
        .map(|i| packed.narrow(0, n + i * c, c))
        .collect::<Result<Vec<_>>>()?;
    Ok((head, tails))
}

// ---------------------------------------------------------------------------------------
// Layer norm.

/// Layer norm over the last dimension on the GPU (x, weight, bias contiguous).
pub(crate) fn layer_norm(x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64) -> Result<Tensor> {
    x.contiguous()?.apply_op3(
        &weight.contiguous()?,
        &bias.contiguous()?,
        LayerNorm { eps },
    )
}

#[derive(Clone, Copy)]
struct LayerNorm {
    eps: f64,
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "kernels-cuda-layer-norm"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-layer-norm runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            eps: f64,
            (s1, l1): (&CudaStorage, &Layout),
            (s2, l2): (&CudaStorage, &Layout),
            (s3, l3): (&CudaStorage, &Layout),
        ) -> Result<CudaStorage> {
            let dev = &s1.device;
            let n = l1.shape().elem_count();
            let c = l2.shape().elem_count();
            let rows = n.checked_div(c).unwrap_or(0);
            // SAFETY: every element is written below (none when there are no rows).
            let y = unsafe { dev.alloc::<T>(n)? };
            if rows > 0 {
                let (x, w, b) = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
                let (rows_i, c_i, eps) = (rows as i32, c as i32, T::from_f64(eps));
                let f = func!(T, dev, "ln_fwd")?;
                let mut a = f.builder();
                a.arg(&x)
                    .arg(&w)
                    .arg(&b)
                    .arg(&y)
                    .arg(&rows_i)
                    .arg(&c_i)
                    .arg(&eps);
                // SAFETY: the arguments match `ln_fwd`'s signature.
                unsafe { a.launch(row_config(rows)) }.w()?;
            }
            Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
        }
        let s = by_dtype!(
            self.name(),
            s1.dtype(),
            run(self.eps, (s1, l1), (s2, l2), (s3, l3))
        )?;
        Ok((s, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = w.elem_count();
        let packed = x.apply_op3_no_bwd(w, &dy.contiguous()?, &LayerNormBwd(*self))?;
        let (dx, mut t) = unpack(&packed, x.shape(), c, 2)?;
        let db = t.pop();
        let dw = t.pop();
        Ok((Some(dx), dw, db))
    }
}

/// The layer norm's gradients, packed: dx (x's elements), then dweight (C), dbias (C).
struct LayerNormBwd(LayerNorm);

impl CustomOp3 for LayerNormBwd {
    fn name(&self) -> &'static str {
        "kernels-cuda-layer-norm-bwd"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-layer-norm-bwd runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            eps: f64,
            (s1, l1): (&CudaStorage, &Layout),
            (s2, l2): (&CudaStorage, &Layout),
            (s3, l3): (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, usize)> {
            let dev = &s1.device;
            let n = l1.shape().elem_count();
            let c = l2.shape().elem_count();
            let rows = n.checked_div(c).unwrap_or(0);
            if l3.shape().elem_count() != n {
                bail!("kernels-cuda-layer-norm-bwd: gradient of another shape");
            }
            let total = n + 2 * c;
            if rows == 0 {
                let out = dev.alloc_zeros::<T>(total)?;
                return Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), total));
            }
            // SAFETY: dx by `ln_bwd_rows`, dweight and dbias by the column sums.
            let mut out = unsafe { dev.alloc::<T>(total)? };
            let stats = unsafe { dev.alloc::<T>(2 * rows)? };
            let (x, w, dy) = (view::<T>(s1, l1)?, view::<T>(s2, l2)?, view::<T>(s3, l3)?);
            let (rows_i, c_i, eps) = (rows as i32, c as i32, T::from_f64(eps));
            {
                let mut dx = out.slice_mut(0..n);
                let f = func!(T, dev, "ln_bwd_rows")?;
                let mut a = f.builder();
                a.arg(&x).arg(&w).arg(&dy).arg(&mut dx).arg(&stats);
                a.arg(&rows_i).arg(&c_i).arg(&eps);
                // SAFETY: the arguments match `ln_bwd_rows`'s signature.
                unsafe { a.launch(row_config(rows)) }.w()?;
            }
            {
                let (_, mut rest) = out.split_at_mut(n);
                let (mut dw, mut db) = rest.split_at_mut(c);
                column_sums::<T>(
                    dev,
                    &dy,
                    Some((&x, &stats)),
                    &mut dw,
                    Some(&mut db),
                    rows,
                    c,
                )?;
            }
            Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), total))
        }
        let (s, total) = by_dtype!(
            self.name(),
            s1.dtype(),
            run(self.0.eps, (s1, l1), (s2, l2), (s3, l3))
        )?;
        Ok((s, Shape::from(total)))
    }
}

// ---------------------------------------------------------------------------------------
// Softmax with scale, keep-mask and dropout.

/// The dropout mask of a kernel: none (threshold 0), or a [`MaskSpec`]'s key, threshold and
/// the kept elements' scale `1 / (1 - p)`.
#[derive(Debug, Clone, Copy)]
struct DropArgs {
    key: u64,
    threshold: u64,
    scale: f64,
}

impl DropArgs {
    fn new(dropout: Option<(f64, u64, u64)>) -> Self {
        match dropout {
            Some((p, seed, stream)) if p > 0.0 => {
                let spec = MaskSpec::new(p, seed, stream);
                let (key, threshold) = spec.key_threshold();
                Self {
                    key,
                    threshold,
                    scale: 1.0 / (1.0 - p),
                }
            }
            _ => Self {
                key: 0,
                threshold: 0,
                scale: 1.0,
            },
        }
    }
}

/// `dropout(softmax(scale * x, masked by keep) * keep)` over the last dimension of the 4-d
/// `x` (B, H, T, S), `keep` u8 broadcastable to it (1 = may attend; a row with nothing to
/// attend to gives zeros), the dropout mask of `(p, seed, stream)` over (B, H, T, S) in
/// row-major order. Any rank without a mask.
pub(crate) fn masked_softmax(
    x: &Tensor,
    keep: Option<&Tensor>,
    scale: f64,
    dropout: Option<(f64, u64, u64)>,
) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (nh, nt) = match keep {
        Some(_) if dims.len() != 4 => bail!("masked softmax: x {dims:?} must be (B, H, T, S)"),
        Some(_) => (dims[1], dims[2]),
        None => (1, 1),
    };
    let keep = match keep {
        Some(k) => Some(k.to_dtype(DType::U8)?.broadcast_as(x.shape())?),
        None => None,
    };
    x.contiguous()?.apply_op1(Softmax {
        scale,
        keep,
        nh,
        nt,
        drop: DropArgs::new(dropout),
    })
}

#[derive(Clone)]
struct Softmax {
    scale: f64,
    /// u8, broadcast to x's shape (strides 0 where it repeats).
    keep: Option<Tensor>,
    nh: usize,
    nt: usize,
    drop: DropArgs,
}

impl Softmax {
    /// Launches `softmax_fwd` (`dy` None) or `softmax_bwd` over x's rows.
    fn launch<T: Elem>(
        &self,
        x: (&CudaStorage, &Layout),
        dy: Option<(&CudaStorage, &Layout)>,
    ) -> Result<CudaStorage> {
        let (s, l) = x;
        let dev = &s.device;
        let n = l.shape().elem_count();
        let width = *l.dims().last().unwrap_or(&1);
        let rows = n.checked_div(width).unwrap_or(0);
        // SAFETY: every element is written by the kernel (none when there are no rows).
        let out = unsafe { dev.alloc::<T>(n)? };
        if rows == 0 {
            return Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()));
        }
        let xv = view::<T>(s, l)?;
        let (rows_i, s_i) = (rows as i32, width as i32);
        let (nh_i, nt_i) = (self.nh as i32, self.nt as i32);
        let (scale, dscale) = (T::from_f64(self.scale), T::from_f64(self.drop.scale));
        let (key, threshold) = (self.drop.key, self.drop.threshold);
        let run = |keep: Option<(&CudaStorage, &Layout)>| -> Result<()> {
            let null = 0u64;
            let (kview, strides) = match keep {
                Some((ks, kl)) => {
                    let st = kl.stride();
                    let strides = [st[0], st[1], st[2], st[3]].map(|v| v as i64);
                    (
                        Some(ks.as_cuda_slice::<u8>()?.slice(kl.start_offset()..)),
                        strides,
                    )
                }
                None => (None, [0i64; 4]),
            };
            let dyv = match dy {
                Some((ds, dl)) => Some(view::<T>(ds, dl)?),
                None => None,
            };
            let name = if dy.is_some() {
                "softmax_bwd"
            } else {
                "softmax_fwd"
            };
            let f = func!(T, dev, name)?;
            let mut a = f.builder();
            a.arg(&xv);
            if let Some(d) = &dyv {
                a.arg(d);
            }
            a.arg(&out).arg(&rows_i).arg(&s_i).arg(&scale);
            match &kview {
                Some(k) => a.arg(k),
                None => a.arg(&null),
            };
            a.arg(&strides[0])
                .arg(&strides[1])
                .arg(&strides[2])
                .arg(&strides[3]);
            a.arg(&nh_i)
                .arg(&nt_i)
                .arg(&key)
                .arg(&threshold)
                .arg(&dscale);
            // SAFETY: the arguments match the kernel's signature; the mask's strides index
            // the broadcast (B, H, T, S) view of its storage.
            unsafe { a.launch(row_config(rows)) }.w()?;
            Ok(())
        };
        match &self.keep {
            Some(k) => with_cuda(k, |ks, kl| run(Some((ks, kl))))?,
            None => run(None)?,
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "kernels-cuda-softmax"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-softmax runs on the GPU only")
    }

    fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
        let out = match s.dtype() {
            DType::F32 => self.launch::<f32>((s, l), None)?,
            DType::F64 => self.launch::<f64>((s, l), None)?,
            dt => bail!("kernels-cuda-softmax: f32 or f64 only, got {dt:?}"),
        };
        Ok((out, l.shape().clone()))
    }

    /// The probabilities are recomputed from `x`: nothing else is kept.
    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(
            &dy.contiguous()?,
            &SoftmaxBwd(self.clone()),
        )?))
    }
}

/// The softmax's input gradient from (x, dy).
struct SoftmaxBwd(Softmax);

impl CustomOp2 for SoftmaxBwd {
    fn name(&self) -> &'static str {
        "kernels-cuda-softmax-bwd"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-softmax-bwd runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        if l1.shape() != l2.shape() {
            bail!("kernels-cuda-softmax-bwd: gradient of another shape");
        }
        let out = match s1.dtype() {
            DType::F32 => self.0.launch::<f32>((s1, l1), Some((s2, l2)))?,
            DType::F64 => self.0.launch::<f64>((s1, l1), Some((s2, l2)))?,
            dt => bail!("kernels-cuda-softmax-bwd: f32 or f64 only, got {dt:?}"),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// Attention's output on the GPU, `dropout(softmax(scale q k^T, masked)) v`: the two
/// products in cuBLAS (bf16 operands under mixed precision, [`crate::autocast`]), the
/// scale, mask, softmax and dropout between them one fused kernel forward and one backward.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    keep: Option<&Tensor>,
    dropout: Option<(f64, u64, u64)>,
    scale: f64,
) -> Result<Tensor> {
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let scores = crate::autocast::matmul(&q, &k.transpose(2, 3)?)?;
    let weights = masked_softmax(&scores, keep, scale, dropout)?;
    crate::autocast::matmul(&weights, &v)
}

// ---------------------------------------------------------------------------------------
// Dropout.

/// `x` with the dropout mask `spec` applied in one pass (x contiguous), on the GPU.
pub(crate) fn dropout_apply(
    s: &CudaStorage,
    l: &Layout,
    key: u64,
    threshold: u64,
    scale: f64,
) -> Result<CudaStorage> {
    fn run<T: Elem>(
        s: &CudaStorage,
        l: &Layout,
        key: u64,
        threshold: u64,
        scale: f64,
    ) -> Result<CudaStorage> {
        let dev = &s.device;
        let n = l.shape().elem_count();
        // SAFETY: every element is written by the kernel.
        let y = unsafe { dev.alloc::<T>(n)? };
        if n > 0 {
            let x = view::<T>(s, l)?;
            let (n64, scale) = (n as u64, T::from_f64(scale));
            let f = func!(T, dev, "dropout_apply")?;
            let mut a = f.builder();
            a.arg(&x)
                .arg(&y)
                .arg(&n64)
                .arg(&key)
                .arg(&threshold)
                .arg(&scale);
            // SAFETY: the arguments match `dropout_apply`'s signature.
            unsafe { a.launch(elementwise_config(n)) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
    }
    by_dtype!(
        "kernels-dropout",
        s.dtype(),
        run(s, l, key, threshold, scale)
    )
}

// ---------------------------------------------------------------------------------------
// Bias + activation + dropout.

/// `dropout(activation(x + bias))` over the last dimension of `x` (its size that of `bias`),
/// one kernel forward and one (with the bias's column sums) backward.
pub(crate) fn bias_activation_dropout(
    x: &Tensor,
    bias: &Tensor,
    activation: Activation,
    dropout: Option<(f64, u64, u64)>,
) -> Result<Tensor> {
    x.contiguous()?.apply_op2(
        &bias.contiguous()?,
        BiasAct {
            gelu: activation == Activation::Gelu,
            drop: DropArgs::new(dropout),
        },
    )
}

#[derive(Clone, Copy)]
struct BiasAct {
    gelu: bool,
    drop: DropArgs,
}

impl BiasAct {
    /// Launches `bias_act_fwd` (`dy` None) or `bias_act_bwd` into `out` over x's elements.
    fn launch<T: Elem>(
        &self,
        (xs, xl): (&CudaStorage, &Layout),
        (bs, bl): (&CudaStorage, &Layout),
        dy: Option<(&CudaStorage, &Layout)>,
        out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, T>,
    ) -> Result<()> {
        let dev = &xs.device;
        let n = xl.shape().elem_count();
        let c = bl.shape().elem_count();
        if n == 0 {
            return Ok(());
        }
        let (x, b) = (view::<T>(xs, xl)?, view::<T>(bs, bl)?);
        let dyv = match dy {
            Some((ds, dl)) => Some(view::<T>(ds, dl)?),
            None => None,
        };
        let (n64, c_i, act) = (n as u64, c as i32, self.gelu as i32);
        let (key, threshold, dscale) = (
            self.drop.key,
            self.drop.threshold,
            T::from_f64(self.drop.scale),
        );
        let name = if dy.is_some() {
            "bias_act_bwd"
        } else {
            "bias_act_fwd"
        };
        let f = func!(T, dev, name)?;
        let mut a = f.builder();
        a.arg(&x).arg(&b);
        if let Some(d) = &dyv {
            a.arg(d);
        }
        a.arg(out).arg(&n64).arg(&c_i).arg(&act);
        a.arg(&key).arg(&threshold).arg(&dscale);
        // SAFETY: the arguments match the kernel's signature; x's size is a multiple of c.
        unsafe { a.launch(elementwise_config(n)) }.w()?;
        Ok(())
    }
}

impl CustomOp2 for BiasAct {
    fn name(&self) -> &'static str {
        "kernels-cuda-bias-activation"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-bias-activation runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            op: &BiasAct,
            x: (&CudaStorage, &Layout),
            b: (&CudaStorage, &Layout),
        ) -> Result<CudaStorage> {
            let dev = &x.0.device;
            let n = x.1.shape().elem_count();
            let c = b.1.shape().elem_count();
            if c == 0 || n % c != 0 || x.1.dims().last() != Some(&c) {
                bail!("kernels-cuda-bias-activation: x's last dimension must be the bias's");
            }
            // SAFETY: every element is written by the kernel.
            let mut y = unsafe { dev.alloc::<T>(n)? };
            op.launch::<T>(x, b, None, &mut y.slice_mut(..))?;
            Ok(CudaStorage::wrap_cuda_slice(y, dev.clone()))
        }
        let s = by_dtype!(self.name(), s1.dtype(), run(self, (s1, l1), (s2, l2)))?;
        Ok((s, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let packed = x.apply_op3_no_bwd(b, &dy.contiguous()?, &BiasActBwd(*self))?;
        let (dx, mut t) = unpack(&packed, x.shape(), b.elem_count(), 1)?;
        Ok((Some(dx), t.pop()))
    }
}

/// The gradients of bias + activation + dropout, packed: dx (x's elements), then dbias.
struct BiasActBwd(BiasAct);

impl CustomOp3 for BiasActBwd {
    fn name(&self) -> &'static str {
        "kernels-cuda-bias-activation-bwd"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-bias-activation-bwd runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            op: &BiasAct,
            x: (&CudaStorage, &Layout),
            b: (&CudaStorage, &Layout),
            dy: (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, usize)> {
            let dev = &x.0.device;
            let n = x.1.shape().elem_count();
            let c = b.1.shape().elem_count();
            if dy.1.shape().elem_count() != n || c == 0 {
                bail!("kernels-cuda-bias-activation-bwd: shapes disagree");
            }
            if n == 0 {
                let out = dev.alloc_zeros::<T>(c)?;
                return Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), c));
            }
            // SAFETY: dx by `bias_act_bwd`, dbias by the column sums.
            let mut out = unsafe { dev.alloc::<T>(n + c)? };
            {
                let (mut dx, mut db) = out.split_at_mut(n);
                op.launch::<T>(x, b, Some(dy), &mut dx)?;
                let dxv = dx.slice(..);
                column_sums::<T>(dev, &dxv, None, &mut db, None, n / c, c)?;
            }
            Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), n + c))
        }
        let (s, total) = by_dtype!(
            self.name(),
            s1.dtype(),
            run(&self.0, (s1, l1), (s2, l2), (s3, l3))
        )?;
        Ok((s, Shape::from(total)))
    }
}

// ---------------------------------------------------------------------------------------
// The output layer's label-smoothed cross-entropy.

/// `(loss, nll)`: the output layer `hidden W^T + bias` (the product in cuBLAS, bf16 operands
/// under mixed precision), then its mean label-smoothed cross-entropy and mean negative
/// log-likelihood over the rows whose target is not `ignore` as one kernel forward and one
/// backward (the bias's gradient by column sums). `loss = nll + eps (z_t - mean_j z_j)`
/// per row, PyTorch's `CrossEntropyLoss(label_smoothing=eps)`.
pub(crate) fn smoothed_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    bias: &Tensor,
    targets: &Tensor,
    ignore: Option<u32>,
    eps: f64,
) -> Result<(Tensor, Tensor)> {
    let c = weight.dim(1)?;
    let n = hidden.elem_count().checked_div(c).unwrap_or(0);
    let logits = crate::autocast::matmul(&hidden.reshape((n, c))?, &weight.t()?)?;
    let targets = targets.flatten_all()?.to_dtype(DType::U32)?.contiguous()?;
    let out = logits.apply_op3(
        &bias.contiguous()?,
        &targets,
        Xent {
            ignore: ignore.unwrap_or(u32::MAX),
            eps,
        },
    )?;
    Ok((out.get(0)?, out.get(1)?.detach()))
}

#[derive(Clone, Copy)]
struct Xent {
    ignore: u32,
    eps: f64,
}

impl CustomOp3 for Xent {
    fn name(&self) -> &'static str {
        "kernels-cuda-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-cross-entropy runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            op: &Xent,
            (zs, zl): (&CudaStorage, &Layout),
            (bs, bl): (&CudaStorage, &Layout),
            (ts, tl): (&CudaStorage, &Layout),
        ) -> Result<CudaStorage> {
            let dev = &zs.device;
            let (n, v) = zl.shape().dims2()?;
            if bl.shape().elem_count() != v || tl.shape().elem_count() != n {
                bail!("kernels-cuda-cross-entropy: logits, bias and targets disagree");
            }
            // SAFETY: every row's pair by `xent_rows`, the two means by `xent_total`.
            let rowbuf = unsafe { dev.alloc::<T>(2 * n.max(1))? };
            let out = unsafe { dev.alloc::<T>(2)? };
            let (z, b) = (view::<T>(zs, zl)?, view::<T>(bs, bl)?);
            let Some((t0, t1)) = tl.contiguous_offsets() else {
                bail!("kernels-cuda-cross-entropy: targets must be contiguous");
            };
            let t = ts.as_cuda_slice::<u32>()?.slice(t0..t1);
            let (n_i, v_i, eps) = (n as i32, v as i32, T::from_f64(op.eps));
            if n > 0 {
                let f = func!(T, dev, "xent_rows")?;
                let mut a = f.builder();
                a.arg(&z).arg(&b).arg(&t).arg(&rowbuf);
                a.arg(&n_i).arg(&v_i).arg(&op.ignore).arg(&eps);
                let cfg = LaunchConfig {
                    grid_dim: (n as u32, 1, 1),
                    block_dim: (XENT_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: the arguments match `xent_rows`'s signature.
                unsafe { a.launch(cfg) }.w()?;
            }
            let f = func!(T, dev, "xent_total")?;
            let mut a = f.builder();
            a.arg(&rowbuf).arg(&t).arg(&out).arg(&n_i).arg(&op.ignore);
            let cfg = LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the arguments match `xent_total`'s signature.
            unsafe { a.launch(cfg) }.w()?;
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        }
        let s = by_dtype!(
            self.name(),
            s1.dtype(),
            run(self, (s1, l1), (s2, l2), (s3, l3))
        )?;
        Ok((s, Shape::from(2)))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        b: &Tensor,
        targets: &Tensor,
        _out: &Tensor,
        g: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let op = XentBwd {
            op: *self,
            g: g.contiguous()?,
        };
        let packed = logits.apply_op3_no_bwd(b, targets, &op)?;
        let (dz, mut t) = unpack(&packed, logits.shape(), b.elem_count(), 1)?;
        Ok((Some(dz), t.pop(), None))
    }
}

/// The cross-entropy's gradients for the outputs' gradient `g` (2,), packed: the logits'
/// (N x V), then the bias's (V).
struct XentBwd {
    op: Xent,
    g: Tensor,
}

impl CustomOp3 for XentBwd {
    fn name(&self) -> &'static str {
        "kernels-cuda-cross-entropy-bwd"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("kernels-cuda-cross-entropy-bwd runs on the GPU only")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        fn run<T: Elem>(
            op: &XentBwd,
            (zs, zl): (&CudaStorage, &Layout),
            (bs, bl): (&CudaStorage, &Layout),
            (ts, tl): (&CudaStorage, &Layout),
        ) -> Result<(CudaStorage, usize)> {
            let dev = &zs.device;
            let (n, v) = zl.shape().dims2()?;
            let total = n * v + v;
            if n == 0 {
                let out = dev.alloc_zeros::<T>(total)?;
                return Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), total));
            }
            // SAFETY: dz by `xent_bwd` (every row), dbias by the column sums.
            let mut out = unsafe { dev.alloc::<T>(total)? };
            let (z, b) = (view::<T>(zs, zl)?, view::<T>(bs, bl)?);
            let Some((t0, t1)) = tl.contiguous_offsets() else {
                bail!("kernels-cuda-cross-entropy-bwd: targets must be contiguous");
            };
            let t = ts.as_cuda_slice::<u32>()?.slice(t0..t1);
            let (n_i, v_i, eps) = (n as i32, v as i32, T::from_f64(op.op.eps));
            {
                let (mut dz, mut db) = out.split_at_mut(n * v);
                with_cuda(&op.g, |gs, gl| {
                    let g = view::<T>(gs, gl)?;
                    let f = func!(T, dev, "xent_bwd")?;
                    let mut a = f.builder();
                    a.arg(&z).arg(&b).arg(&t).arg(&g).arg(&mut dz);
                    a.arg(&n_i).arg(&v_i).arg(&op.op.ignore).arg(&eps);
                    let cfg = LaunchConfig {
                        grid_dim: (n as u32, 1, 1),
                        block_dim: (XENT_THREADS, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: the arguments match `xent_bwd`'s signature.
                    unsafe { a.launch(cfg) }.w()?;
                    Ok(())
                })?;
                let dzv = dz.slice(..);
                column_sums::<T>(dev, &dzv, None, &mut db, None, n, v)?;
            }
            Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), total))
        }
        let (s, total) = by_dtype!(
            self.name(),
            s1.dtype(),
            run(self, (s1, l1), (s2, l2), (s3, l3))
        )?;
        Ok((s, Shape::from(total)))
    }
}

// ---------------------------------------------------------------------------------------
// Many tensors as one: the gradients' sum of squares (clipping) and Adam.

/// Elements per block of the many-tensor kernels (`CHUNK` in `fused.cu`).
const MULTI_CHUNK: usize = 8192;

/// The device addresses of the first elements of `ts` (contiguous, element type `T`) and
/// their offsets end to end (one more than there are tensors), as one host table:
/// `[addresses..., offsets...]`.
fn address_table<T: Elem>(ts: &[&Tensor]) -> Result<(Vec<u64>, Vec<u64>)> {
    let mut addrs = Vec::with_capacity(ts.len());
    let mut offsets = Vec::with_capacity(ts.len() + 1);
    offsets.push(0u64);
    for t in ts {
        let a = with_cuda(t, |s, l| {
            use candle_core::cuda_backend::cudarc::driver::DevicePtr;
            let Some((start, _)) = l.contiguous_offsets() else {
                bail!("kernels (cuda): the many-tensor kernels take contiguous tensors");
            };
            let stream = s.device.cuda_stream();
            let (ptr, _record) = s.as_cuda_slice::<T>()?.device_ptr(&stream);
            Ok(ptr + (start * std::mem::size_of::<T>()) as u64)
        })?;
        addrs.push(a);
        let last = *offsets.last().unwrap_or(&0);
        offsets.push(last + t.elem_count() as u64);
    }
    Ok((addrs, offsets))
}

/// The sum of the squares of every element of `ts` (one dtype, f32 or f64, on one GPU) in
/// f64, as a scalar on the device: one kernel over all of them (partial sums per block of
/// 8,192 elements) and one for the total.
pub(crate) fn sum_of_squares(ts: &[&Tensor]) -> Result<Tensor> {
    fn run<T: Elem>(ts: &[&Tensor], dev: &CudaDevice) -> Result<CudaStorage> {
        let (addrs, offsets) = address_table::<T>(ts)?;
        let total = *offsets.last().unwrap_or(&0) as usize;
        let out = dev.alloc_zeros::<f64>(1)?;
        if total == 0 {
            return Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()));
        }
        let blocks = total.div_ceil(MULTI_CHUNK);
        let table = dev.clone_htod(&[addrs, offsets].concat())?;
        let n = ts.len();
        let (a, o) = (table.slice(0..n), table.slice(n..2 * n + 1));
        // SAFETY: every partial is written by `multi_sumsq`.
        let partial = unsafe { dev.alloc::<f64>(blocks)? };
        let n_i = n as i32;
        let f = func!(T, dev, "multi_sumsq")?;
        let mut b = f.builder();
        b.arg(&a).arg(&o).arg(&n_i).arg(&partial);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `multi_sumsq`'s signature; the table holds live
        // contiguous tensors of `T` (the caller holds them).
        unsafe { b.launch(cfg) }.w()?;
        let fin = dev.get_or_load_custom_func("sum_partials_f64", MODULE, PTX)?;
        let blocks_i = blocks as i32;
        let mut b = fin.builder();
        b.arg(&partial).arg(&out).arg(&blocks_i);
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `sum_partials_f64`'s signature.
        unsafe { b.launch(cfg) }.w()?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let Some(first) = ts.first() else {
        bail!("kernels (cuda): sum of squares of no tensors");
    };
    let candle_core::Device::Cuda(dev) = first.device() else {
        bail!("kernels (cuda): expected tensors on a CUDA device");
    };
    let storage = by_dtype!("kernels-cuda-sum-of-squares", first.dtype(), run(ts, dev))?;
    Ok(Tensor::from_storage(
        Storage::Cuda(storage),
        Shape::from(()),
        candle_core::op::BackpropOp::none(),
        false,
    ))
}

/// One Adam step over every parameter in place (see `multi_adam` in `fused.cu`): `params`
/// and their gradients `grads` (the same shapes, contiguous), the moments `m` and `s` laid
/// end to end in the parameters' order (contiguous, updated in place), the gradients scaled
/// by `scale` where it is below 1. One kernel over all of them.
pub(crate) fn adam_step(
    params: &[&Tensor],
    grads: &[&Tensor],
    (m, s): (&Tensor, &Tensor),
    [beta1, beta2, eps, lr]: [f64; 4],
    [c1, c2]: [f64; 2],
    scale: f64,
) -> Result<()> {
    fn run<T: Elem>(
        params: &[&Tensor],
        grads: &[&Tensor],
        (m, s): (&Tensor, &Tensor),
        h: [f64; 6],
        scale: f64,
        dev: &CudaDevice,
    ) -> Result<()> {
        let (pa, offsets) = address_table::<T>(params)?;
        let (ga, goffsets) = address_table::<T>(grads)?;
        let (ma, _) = address_table::<T>(&[m])?;
        let (sa, _) = address_table::<T>(&[s])?;
        let total = *offsets.last().unwrap_or(&0) as usize;
        if goffsets != offsets || m.elem_count() != total || s.elem_count() != total {
            bail!("kernels-cuda-adam: parameters, gradients and moments disagree in size");
        }
        if total == 0 {
            return Ok(());
        }
        let n = params.len();
        let table = dev.clone_htod(&[pa, ga, offsets].concat())?;
        let (p, g, o) = (
            table.slice(0..n),
            table.slice(n..2 * n),
            table.slice(2 * n..3 * n + 1),
        );
        let [b1, b2, eps, lr, c1, c2] = h.map(T::from_f64);
        let (one_b1, one_b2) = (T::from_f64(1.0 - h[0]), T::from_f64(1.0 - h[1]));
        let (scale_t, scaled) = (T::from_f64(scale), i32::from(scale < 1.0));
        let n_i = n as i32;
        let f = func!(T, dev, "multi_adam")?;
        let mut b = f.builder();
        b.arg(&p).arg(&g).arg(&o).arg(&n_i).arg(&ma[0]).arg(&sa[0]);
        b.arg(&b1)
            .arg(&b2)
            .arg(&one_b1)
            .arg(&one_b2)
            .arg(&eps)
            .arg(&lr);
        b.arg(&c1).arg(&c2).arg(&scale_t).arg(&scaled);
        let cfg = LaunchConfig {
            grid_dim: (total.div_ceil(MULTI_CHUNK) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match `multi_adam`'s signature; the tables hold live
        // contiguous tensors of `T` (the caller holds them), the moments `total` elements.
        unsafe { b.launch(cfg) }.w()?;
        Ok(())
    }
    let Some(first) = params.first() else {
        return Ok(());
    };
    let candle_core::Device::Cuda(dev) = first.device() else {
        bail!("kernels-cuda-adam: expected parameters on a CUDA device");
    };
    let h = [beta1, beta2, eps, lr, c1, c2];
    by_dtype!(
        "kernels-cuda-adam",
        first.dtype(),
        run(params, grads, (m, s), h, scale, dev)
    )
}
