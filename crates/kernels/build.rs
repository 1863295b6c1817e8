//! With the `cuda` feature, compiles the crate's own CUDA kernels (`src/cuda/dropout.cu`, the
//! dropout mask, and `src/cuda/fused.cu`, the fused training kernels) to PTX
//! with nvcc, for `include_str!` in the crate; the GPU's driver compiles the PTX for the GPU
//! it runs on when a kernel is first loaded. nvcc is the one candle's CUDA kernels are built
//! with (`scripts/build_cuda.sh` puts it on the PATH and sets `NVCC`); the PTX targets
//! `CUDA_COMPUTE_CAP` (default 75, the oldest architecture CUDA 13 supports, so the PTX runs
//! on every GPU CUDA 13 does).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| "nvcc".into());
    let cap = std::env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "75".into());
    for name in ["dropout", "fused"] {
        let src = format!("src/cuda/{name}.cu");
        println!("cargo:rerun-if-changed={src}");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", &format!("-arch=compute_{cap}"), &src, "-o"])
            .arg(&ptx)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "the cuda feature needs nvcc to compile {src} ({nvcc}: {e}); build with \
                     scripts/build_cuda.sh, which installs it, or set NVCC"
                )
            });
        assert!(status.success(), "nvcc failed on {src}");
    }
}
