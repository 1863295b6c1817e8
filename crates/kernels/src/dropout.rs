//! Inverted dropout with the mask regenerated from the RNG instead of stored:
//! `y = x * keep / (1 - p)`, `keep[i] = uniform(seed, stream, i) >= p`.
//!
//! Composed, dropout builds its mask as a `Vec`, makes a tensor of it, and multiplies (one
//! more tensor, and a stored mask for the backward pass). The mask is a pure function of
//! `(seed, stream, index)` ([`crate::rng::uniform_at`]), so this op computes it on the fly in
//! one pass, and its backward pass is the same op on the incoming gradient (dropout is
//! linear in `x`): nothing is kept. The masks are bit for bit those of the composed version.

use super::float::{simd, Float};
use super::{cpu_slice, fused_applies, par_rows};
use crate::rng::MaskSpec;
use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};

/// Elements per thread below which the kernel stays on the calling thread.
const MIN_PARALLEL_ELEMS: usize = 1 << 16;

/// Dropout of `x` with probability `p` (in [0, 1)) and the mask of stream `stream` under
/// `seed`: element `i` (in row-major order) is kept, and scaled by `1 / (1 - p)`, where
/// `uniform_at(seed, stream, i) >= p`. CPU f32/f64 run the fused kernel; elsewhere the mask
/// is built as a tensor and multiplied ([`dropout_reference`]).
///
/// # Shapes
/// any shape -> the same shape
pub fn dropout(x: &Tensor, p: f64, seed: u64, stream: u64) -> Result<Tensor> {
    if !(0.0..1.0).contains(&p) {
        bail!("dropout: p = {p} must lie in [0, 1)");
    }
    #[cfg(feature = "cuda")]
    if crate::cuda::applies(&[x]) {
        // One pass on the GPU: the mask regenerated there, its backward the same op.
        return x
            .contiguous()?
            .apply_op1(Dropout(MaskSpec::new(p, seed, stream)));
    }
    if !fused_applies(&[x]) {
        return dropout_reference(x, p, seed, stream);
    }
    x.contiguous()?
        .apply_op1(Dropout(MaskSpec::new(p, seed, stream)))
}

/// The same dropout composed: the scaled keep-mask as a tensor, times `x`. On a GPU the mask
/// is made there, by a kernel of this crate (`src/cuda/dropout.cu`), element for element the
/// mask the CPU makes; elsewhere it is made on the CPU.
pub fn dropout_reference(x: &Tensor, p: f64, seed: u64, stream: u64) -> Result<Tensor> {
    let spec = MaskSpec::new(p, seed, stream);
    let scale = 1.0 / (1.0 - p);
    #[cfg(feature = "cuda")]
    if x.device().is_cuda()
        && matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
    {
        match x.apply_op1_no_bwd(&gpu::Mask { spec, scale }) {
            Ok(mask) => return x.mul(&mask),
            // The same mask from the CPU (slower: made there and copied over), and the
            // reason once.
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    eprintln!(
                        "warning: dropout masks are made on the CPU: the GPU kernel failed: {e}"
                    )
                });
            }
        }
    }
    let keep = (0..x.elem_count()).map(|i| spec.keep(i as u64));
    let mask = match x.dtype() {
        candle_core::DType::F64 => {
            let m: Vec<f64> = keep.map(|k| if k { scale } else { 0.0 }).collect();
            Tensor::from_vec(m, x.shape(), x.device())?
        }
        dtype => {
            let m: Vec<f32> = keep.map(|k| if k { scale as f32 } else { 0.0 }).collect();
            Tensor::from_vec(m, x.shape(), x.device())?.to_dtype(dtype)?
        }
    };
    x.mul(&mask)
}

/// The dropout mask made on the GPU.
#[cfg(feature = "cuda")]
mod gpu {
    use super::MaskSpec;
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice, WrapErr};
    use candle_core::{bail, CpuStorage, CustomOp1, Layout, Result, Shape};

    /// `src/cuda/dropout.cu` compiled to PTX by the build script.
    const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/dropout.ptx"));

    /// The scaled keep-mask of `spec` in the shape and dtype of the tensor it is applied to
    /// (whose values it does not read).
    pub(super) struct Mask {
        pub(super) spec: MaskSpec,
        pub(super) scale: f64,
    }

    impl Mask {
        /// Runs kernel `name` for `n` elements of type `T` on `s`'s device.
        fn launch<T>(&self, name: &str, s: &CudaStorage, n: usize, scale: T) -> Result<CudaStorage>
        where
            T: candle_core::cuda_backend::CudaDType
                + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
        {
            let dev = &s.device;
            let func = dev.get_or_load_custom_func(name, "transformer_dropout", PTX)?;
            // SAFETY: every element is written by the kernel below.
            let out = unsafe { dev.alloc::<T>(n)? };
            let (key, threshold, n64) = (self.spec.key, self.spec.threshold, n as u64);
            let mut b = func.builder();
            b.arg(&out).arg(&n64).arg(&key).arg(&threshold).arg(&scale);
            // SAFETY: the arguments match the kernel's signature.
            unsafe { b.launch(LaunchConfig::for_num_elems(n.max(1) as u32)) }.w()?;
            Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
        }
    }

    impl CustomOp1 for Mask {
        fn name(&self) -> &'static str {
            "kernels-dropout-mask"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            bail!("kernels-dropout-mask runs on the GPU only")
        }

        fn cuda_fwd(&self, s: &CudaStorage, l: &Layout) -> Result<(CudaStorage, Shape)> {
            let n = l.shape().elem_count();
            let storage = match &s.slice {
                CudaStorageSlice::F32(_) => {
                    self.launch("dropout_mask_f32", s, n, self.scale as f32)?
                }
                CudaStorageSlice::F64(_) => self.launch("dropout_mask_f64", s, n, self.scale)?,
                _ => bail!("kernels-dropout-mask: f32 or f64 only"),
            };
            Ok((storage, l.shape().clone()))
        }
    }
}

struct Dropout(MaskSpec);

impl CustomOp1 for Dropout {
    fn name(&self) -> &'static str {
        "kernels-dropout"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let storage = match s {
            CpuStorage::F32(_) => CpuStorage::F32(apply::<f32>(cpu_slice(s, l)?, self.0)),
            CpuStorage::F64(_) => CpuStorage::F64(apply::<f64>(cpu_slice(s, l)?, self.0)),
            _ => bail!("kernels-dropout: only f32 and f64"),
        };
        Ok((storage, l.shape().clone()))
    }

    /// The same mask applied on the GPU in one pass ([`crate::cuda`]).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::cuda_backend::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::cuda_backend::CudaStorage, Shape)> {
        let spec = self.0;
        let out = crate::cuda::dropout_apply(s, l, spec.key, spec.threshold, 1.0 / (1.0 - spec.p))?;
        Ok((out, l.shape().clone()))
    }

    /// Linear in `x`: the gradient goes through the same mask.
    fn bwd(&self, _x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.contiguous()?.apply_op1(Dropout(self.0))?))
    }
}

fn apply<T: Float>(x: &[T], spec: MaskSpec) -> Vec<T> {
    let scale = T::from_f64(1.0 / (1.0 - spec.p));
    let mut y = vec![T::ZERO; x.len()];
    // Rows of 1024 elements, only to hand out contiguous pieces.
    let width = 1024.min(x.len()).max(1);
    par_rows(&mut y, width, MIN_PARALLEL_ELEMS, |r0, ys| {
        simd(
            #[inline(always)]
            || {
                let start = r0 * width;
                for (j, (o, &v)) in ys.iter_mut().zip(&x[start..]).enumerate() {
                    let keep = spec.keep((start + j) as u64);
                    *o = if keep { v * scale } else { T::ZERO };
                }
            },
        )
    });
    y
}
