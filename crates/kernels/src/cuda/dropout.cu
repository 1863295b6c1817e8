// The dropout mask on the GPU, element for element the one the CPU makes
// (crates/kernels/src/dropout.rs, MaskSpec::keep): element i is kept, as `scale`, where the
// top 53 bits of SplitMix64's finaliser over `key + i * GOLDEN` are at or above `threshold`;
// else 0. A grid-stride loop over the n elements of a contiguous output.

#define GOLDEN 0x9e3779b97f4a7c15ULL

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define DROPOUT_MASK(NAME, T)                                                                 \
    extern "C" __global__ void NAME(T *out, unsigned long long n, unsigned long long key,     \
                                    unsigned long long threshold, T scale) {                  \
        unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;               \
        for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
             i < n; i += stride) {                                                            \
            out[i] = (mix64(key + i * GOLDEN) >> 11) >= threshold ? scale : (T)0;             \
        }                                                                                     \
    }

DROPOUT_MASK(dropout_mask_f32, float)
DROPOUT_MASK(dropout_mask_f64, double)
