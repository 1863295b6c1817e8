//! `--device`: where a command's model runs. [`DeviceArg::open`] is the one place a command's
//! device is decided, and it logs where the work runs.

use anyhow::Result;
use candle_core::Device;
use clap::Args;
use std::fmt;

/// A device as named on the command line: `cpu`, `cuda` (GPU 0) or `cuda:N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceName {
    /// The CPU: candle's CPU ops and this project's fused kernels.
    Cpu,
    /// NVIDIA GPU number N (from 0) through candle's CUDA backend.
    Cuda(usize),
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Cpu => f.write_str("cpu"),
            DeviceName::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl std::str::FromStr for DeviceName {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim();
        match s {
            "cpu" => return Ok(DeviceName::Cpu),
            "cuda" => return Ok(DeviceName::Cuda(0)),
            _ => {}
        }
        match s.strip_prefix("cuda:") {
            Some(n) => n.parse::<usize>().map(DeviceName::Cuda).map_err(|_| {
                format!(
                    "`{s}`: the GPU's number after `cuda:` must be a whole number from 0 \
                     (cuda:0, cuda:1, ...); `nvidia-smi -L` lists the GPUs"
                )
            }),
            None => Err(format!(
                "`{s}` is not a device: use cpu, cuda (the first GPU) or cuda:N (GPU N, from 0)"
            )),
        }
    }
}

/// The `--device` flag, shared by every command that trains, evaluates, translates or
/// generates.
#[derive(Args, Clone, Copy, Debug)]
pub struct DeviceArg {
    /// Where the model runs: cpu, cuda (the first GPU) or cuda:N (GPU N, from 0). CUDA needs a
    /// binary built with the `cuda` feature (scripts/build_cuda.sh; see docs/CUDA.md).
    #[arg(long, default_value = "cpu", value_name = "cpu|cuda|cuda:N")]
    pub device: DeviceName,
}

impl DeviceArg {
    /// Opens the device and logs (on stderr) where the work runs.
    pub fn open(&self) -> Result<Device> {
        let device = open(self.device)?;
        eprintln!("device: {}", describe(self.device));
        Ok(device)
    }
}

/// The device `name` stands for: the CPU, or the GPU through candle's CUDA backend. A GPU in
/// a binary built without CUDA, or one that cannot be opened, is an error that says why and
/// what to do.
pub fn open(name: DeviceName) -> Result<Device> {
    match name {
        DeviceName::Cpu => Ok(Device::Cpu),
        DeviceName::Cuda(i) => open_cuda(i),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(i: usize) -> Result<Device> {
    let device = Device::new_cuda(i).map_err(|e| {
        // CUDA's reason without the backtrace candle attaches under RUST_BACKTRACE.
        let e = match e {
            candle_core::Error::WithBacktrace { inner, .. } => *inner,
            e => e,
        };
        anyhow::anyhow!(
            "--device cuda:{i}: cannot open GPU {i} through CUDA: {e}. Check that this \
             machine has an NVIDIA GPU numbered {i} and a working driver (`nvidia-smi -L` lists \
             the GPUs; a GPU is numbered from 0), or run on the CPU with --device cpu"
        )
    })?;
    keep_freed_gpu_memory(i);
    Ok(device)
}

/// Makes the GPU's default memory pool keep what is freed for the next allocation instead of
/// returning it to the driver at every synchronisation. candle allocates every tensor from
/// that pool (`cuMemAllocAsync`), and a training step frees and allocates the same sizes
/// again after each read of its loss: with the pool's default threshold of 0, every step
/// mapped its memory afresh. PyTorch's caching allocator keeps memory the same way. A failure
/// here costs speed only, so it is reported and ignored.
#[cfg(feature = "cuda")]
fn keep_freed_gpu_memory(i: usize) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    // SAFETY: plain driver calls on a device candle has just opened; the out-pointers are
    // valid locals and the attribute's value is a u64 as the driver expects.
    let status = unsafe {
        let mut dev: sys::CUdevice = 0;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut keep_all: u64 = u64::MAX;
        let mut r = sys::cuDeviceGet(&mut dev, i as std::ffi::c_int);
        if r == sys::CUresult::CUDA_SUCCESS {
            r = sys::cuDeviceGetDefaultMemPool(&mut pool, dev);
        }
        if r == sys::CUresult::CUDA_SUCCESS {
            r = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut keep_all as *mut u64).cast(),
            );
        }
        r
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        eprintln!("warning: cuda:{i}: could not make the memory pool keep freed memory ({status:?}); training will be slower");
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(i: usize) -> Result<Device> {
    anyhow::bail!(
        "--device cuda:{i}: this binary was built without CUDA support. Build one with \
         scripts/build_cuda.sh (it compiles `--features cuda` into target/cuda/release/transformer; \
         see docs/CUDA.md), or run on the CPU with --device cpu"
    )
}

/// What runs where on `name`, for the log.
pub fn describe(name: DeviceName) -> String {
    match name {
        DeviceName::Cpu => {
            "cpu (candle's CPU ops, and the fused f32 kernels where they apply)".into()
        }
        DeviceName::Cuda(_) => format!(
            "{name} (cuBLAS and candle's CUDA ops, fused CUDA kernels for layer norm, attention's \
             softmax, dropout, the feed-forward activation and the loss; bf16 training as \
             autocast; the fused CPU kernels and int8 decoding do not run there)"
        ),
    }
}

/// The name of an opened device, as `--device` takes it (`cpu`, `cuda:0`).
pub fn name_of(device: &Device) -> String {
    transformer_runtime::load::device_name(device)
}

#[cfg(test)]
mod tests {
    use super::DeviceName;

    #[test]
    fn parses_the_three_forms() {
        assert_eq!("cpu".parse::<DeviceName>(), Ok(DeviceName::Cpu));
        assert_eq!("cuda".parse::<DeviceName>(), Ok(DeviceName::Cuda(0)));
        assert_eq!("cuda:0".parse::<DeviceName>(), Ok(DeviceName::Cuda(0)));
        assert_eq!("cuda:3".parse::<DeviceName>(), Ok(DeviceName::Cuda(3)));
        assert_eq!(DeviceName::Cuda(3).to_string(), "cuda:3");
        assert_eq!(DeviceName::Cpu.to_string(), "cpu");
    }

    #[test]
    fn rejects_others_saying_what_is_accepted() {
        for bad in ["cuda:x", "cuda:", "cuda:-1", "cuda:1.5"] {
            let e = bad.parse::<DeviceName>().unwrap_err();
            assert!(e.contains("whole number"), "{bad}: {e}");
        }
        for bad in ["gpu", "CUDA", "metal", ""] {
            let e = bad.parse::<DeviceName>().unwrap_err();
            assert!(e.contains("use cpu, cuda"), "{bad}: {e}");
        }
    }
}
