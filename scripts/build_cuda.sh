#!/usr/bin/env bash
# Builds the `transformer` binary with the `cuda` feature (candle's CUDA backend) in one command,
# on a machine with no GPU and no CUDA installation:
#
#   scripts/build_cuda.sh            # -> target/cuda/release/transformer
#   scripts/build_cuda.sh --tests    # and the CPU-against-CUDA test, target/cuda/cuda_parity
#
# What it does:
#   1. installs NVIDIA's CUDA toolkit wheels from PyPI (nvcc, its front end and NVVM, the CUDA
#      runtime, NVRTC, cuBLAS, cuRAND and the CCCL headers) into a virtualenv under
#      target/cuda-toolkit/<version>/ (once; later runs reuse it);
#   2. adds what linking needs and the wheels do not ship: the unversioned library names
#      (libcublas.so -> libcublas.so.13, ...) and a link-time stub of the driver library
#      (lib/stubs/libcuda.so, soname libcuda.so.1), like the stub in NVIDIA's own toolkit. The
#      binary is linked against the soname only: at run time the GPU machine's driver provides
#      the real libcuda.so.1, and the stub is never loaded;
#   3. runs `cargo build --release -p transformer-cli --features cuda` with its own target
#      directory (target/cuda), so the CPU build in target/release is left as it is.
#
# Settings (environment variables):
#   CUDA_VERSION      toolkit major.minor to build against; default 13.0. Pick one the GPU
#                     machine's driver supports: `nvidia-smi` there prints "CUDA Version: X.Y",
#                     the newest toolkit its driver runs (driver 580 prints 13.0). A newer
#                     toolkit than the driver's gives "the provided PTX was compiled with an
#                     unsupported toolchain" at the first kernel launch. Only CUDA 13.x is
#                     scripted (PyPI packs 13.x into one folder, nvidia/cu13).
#   CUDA_COMPUTE_CAP  GPU architecture the kernels are compiled for; default 90 (H100, H200).
#                     80 for A100, 89 for L4/L40/RTX 4090, 86 for RTX 30xx/A10.
#   CARGO_BUILD_JOBS  parallel compile jobs, as for cargo (nvcc on candle's kernels is heavy).
#
# Running the binary on the GPU machine: copy target/cuda/release/transformer there (the GPU
# machine may have no network; the binary is all that must travel) and make the CUDA 13
# libraries it links findable (libcudart.so.13, libcublas.so.13 with libcublasLt.so.13, and
# libcurand.so.10; the end of this script lists them), e.g. from a PyTorch cu13x install:
#   export LD_LIBRARY_PATH="$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "lib"))'):$LD_LIBRARY_PATH"
#   ldd ./transformer | grep 'not found'      # prints nothing when all are found
# See docs/CUDA.md.
set -euo pipefail

tests=false
case "${1:-}" in
    "") ;;
    --tests) tests=true ;;
    *)
        echo "usage: scripts/build_cuda.sh [--tests]" >&2
        exit 2
        ;;
esac

cd "$(dirname "$0")/.."
root_dir=$(pwd)

CUDA_VERSION=${CUDA_VERSION:-13.0}
CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
major=${CUDA_VERSION%%.*}
minor=${CUDA_VERSION#*.}
if [[ "$major" != 13 || ! "$minor" =~ ^[0-9]+$ ]]; then
    echo "build_cuda.sh: CUDA_VERSION=$CUDA_VERSION is not supported; this script installs the" >&2
    echo "CUDA 13.x toolkit wheels (CUDA_VERSION=13.0 ... 13.4). For a driver older than 580" >&2
    echo "(nvidia-smi shows 'CUDA Version: 12.x'), install a CUDA 12 toolkit and build with" >&2
    echo "CUDA_ROOT=<toolkit> cargo build --release -p transformer-cli --features cuda." >&2
    exit 2
fi
if [[ ! "$CUDA_COMPUTE_CAP" =~ ^[0-9]+$ ]]; then
    echo "build_cuda.sh: CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP must be a number such as 90 (H100/H200) or 80 (A100)" >&2
    exit 2
fi

toolkit_dir="$root_dir/target/cuda-toolkit/$CUDA_VERSION"
venv="$toolkit_dir/venv"
python=${PYTHON:-python3}

if [[ ! -x "$venv/bin/python" ]]; then
    echo "== creating $venv"
    "$python" -m venv "$venv"
fi
stamp="$toolkit_dir/installed"
if [[ ! -f "$stamp" ]]; then
    echo "== installing the CUDA $CUDA_VERSION toolkit wheels from PyPI"
    # The cuRAND and cuBLAS wheels have their own version numbers; their sonames
    # (libcurand.so.10, libcublas.so.13) are what the binary records.
    "$venv/bin/pip" install --quiet --upgrade \
        "nvidia-cuda-nvcc==$CUDA_VERSION.*" \
        "nvidia-cuda-crt==$CUDA_VERSION.*" \
        "nvidia-nvvm==$CUDA_VERSION.*" \
        "nvidia-cuda-runtime==$CUDA_VERSION.*" \
        "nvidia-cuda-nvrtc==$CUDA_VERSION.*" \
        "nvidia-cuda-cccl==$CUDA_VERSION.*" \
        "nvidia-cublas==$CUDA_VERSION.*" \
        "nvidia-curand==10.*"
    touch "$stamp"
fi

cuda_root=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')
if [[ ! -x "$cuda_root/bin/nvcc" ]]; then
    echo "build_cuda.sh: no nvcc at $cuda_root/bin/nvcc after installing the wheels;" >&2
    echo "remove $toolkit_dir and run again" >&2
    exit 1
fi

# Unversioned names for the linker (-lcublas needs libcublas.so).
for lib in cudart cublas cublasLt nvrtc curand; do
    real=$(cd "$cuda_root/lib" && ls "lib$lib.so."* 2>/dev/null | grep -E "^lib$lib\.so\.[0-9]+$" | head -n 1 || true)
    if [[ -z "$real" ]]; then
        echo "build_cuda.sh: lib$lib.so.N is missing from $cuda_root/lib" >&2
        exit 1
    fi
    ln -sf "$real" "$cuda_root/lib/lib$lib.so"
done

# Link-time stub of the driver library: every cu* entry point that cudarc's bindings name.
stub_dir="$cuda_root/lib/stubs"
if [[ ! -f "$stub_dir/libcuda.so" ]]; then
    echo "== building the link-time driver stub $stub_dir/libcuda.so"
    mkdir -p "$stub_dir"
    grep -ohE '^[[:space:]]*CUresult CUDAAPI cu[A-Za-z0-9_]+\(' "$cuda_root/include/cuda.h" \
        | sed -E 's/.*CUDAAPI (cu[A-Za-z0-9_]+)\(/\1/' >"$stub_dir/names.txt"
    # cuda.h maps many names to versioned symbols (#define cuMemAlloc cuMemAlloc_v2): stub both.
    grep -ohE '^#define cu[A-Za-z0-9_]+ +cu[A-Za-z0-9_]+$' "$cuda_root/include/cuda.h" \
        | awk '{print $3}' >>"$stub_dir/names.txt"
    sort -u "$stub_dir/names.txt" \
        | awk '{print "int " $1 "(void) { return 999; /* CUDA_ERROR_UNKNOWN: link-time stub only */ }"}' \
            >"$stub_dir/libcuda_stub.c"
    cc -shared -fPIC -O0 -Wl,-soname,libcuda.so.1 -o "$stub_dir/libcuda.so" "$stub_dir/libcuda_stub.c"
fi

export CUDA_ROOT="$cuda_root"
export CUDA_PATH="$cuda_root"
export NVCC="$cuda_root/bin/nvcc"
export PATH="$cuda_root/bin:$PATH"
export CUDA_COMPUTE_CAP
# nvcc's own helpers (cicc, ptxas) find libnvvm and friends here during the build.
export LD_LIBRARY_PATH="$cuda_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== nvcc: $("$NVCC" --version | tail -n 2 | head -n 1)"
echo "== compute capability: $CUDA_COMPUTE_CAP"
echo "== cargo build --release -p transformer-cli --features cuda (target dir target/cuda)"
cargo build --release -p transformer-cli --features cuda --target-dir "$root_dir/target/cuda"

bin="$root_dir/target/cuda/release/transformer"
echo "== built $bin"
if $tests; then
    echo "== cargo test --no-run: the CPU-against-CUDA test (crates/cli/tests/cuda_parity.rs)"
    test_bin=$(cargo test --release -p transformer-cli --features cuda --target-dir "$root_dir/target/cuda" \
        --test cuda_parity --no-run --message-format=json \
        | sed -n 's/.*"executable":"\([^"]*cuda_parity[^"]*\)".*/\1/p' | tail -n 1)
    if [[ -z "$test_bin" ]]; then
        echo "build_cuda.sh: cargo built no cuda_parity test binary" >&2
        exit 1
    fi
    cp "$test_bin" "$root_dir/target/cuda/cuda_parity"
    echo "== built $root_dir/target/cuda/cuda_parity"
    echo "   on the GPU machine: TRANSFORMER_BIN=./transformer ./cuda_parity --ignored --test-threads 1"
fi
echo "   libraries it needs at run time (on the GPU machine):"
readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/     \1/p' | grep -E 'cu|nvrtc' || true
