// Fused training kernels for the GPU, each forward with its backward, in f32 and f64
// (crates/kernels/src/cuda.rs launches them; crates/cli/tests/cuda_parity.rs checks each
// against the composed candle ops it replaces):
//
// - layer norm over rows of C: forward one warp per row; backward one warp per row for the
//   input's gradient (writing each row's mean and 1/std), then the weight's and bias's
//   gradients as column sums in row chunks (partials, then one final sum: no atomics, the
//   same result every run);
// - softmax over rows of S with a scale, an optional keep-mask (u8, broadcast over
//   (B, H, T, S) by strides) and an optional dropout mask regenerated from its key (the
//   mask of src/cuda/dropout.cu, element for element the CPU's): forward one warp per row;
//   backward recomputes the probabilities from the input, so nothing but the input is kept;
// - dropout applied in one pass (the mask regenerated; its own backward);
// - bias + ReLU or GELU (erf) + dropout, one elementwise pass forward, one backward plus the
//   bias's column sums;
// - the output layer's label-smoothed cross-entropy over logits (N, V) with the bias added
//   inside: one block per row forward (an online max / sum of exponentials in one read),
//   then one block for the means; one block per row backward, writing the logits' gradient;
// - many tensors as one index space (a table of their addresses): the sum of the squares of
//   every gradient (clipping), and one Adam step over every parameter.
//
// Sums are in the element type (f32 sums in f32, as candle's composed ops sum), reduced by
// warp shuffles.

#define GOLDEN 0x9e3779b97f4a7c15ULL

typedef unsigned long long u64;

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Whether element i of a dropout mask with this key and threshold is kept (threshold 0:
// no dropout, every element kept).
__device__ __forceinline__ bool kept(u64 key, u64 threshold, u64 i) {
    return (mix64(key + i * GOLDEN) >> 11) >= threshold;
}

__device__ __forceinline__ float exp_t(float x) { return expf(x); }
__device__ __forceinline__ double exp_t(double x) { return exp(x); }
__device__ __forceinline__ float log_t(float x) { return logf(x); }
__device__ __forceinline__ double log_t(double x) { return log(x); }
__device__ __forceinline__ float sqrt_t(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_t(double x) { return sqrt(x); }
__device__ __forceinline__ float erf_t(float x) { return erff(x); }
__device__ __forceinline__ double erf_t(double x) { return erf(x); }
__device__ __forceinline__ float max_t(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_t(double a, double b) { return fmax(a, b); }

template <typename T> __device__ __forceinline__ T neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return -__int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return -__longlong_as_double(0x7ff0000000000000LL);
}

template <typename T> __device__ __forceinline__ T nan_t();
template <> __device__ __forceinline__ float nan_t<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double nan_t<double>() {
    return __longlong_as_double(0x7ff8000000000000LL);
}

template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = max_t(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// (max, sum of exp(x - max)) pairs combined; a pair with max -inf holds nothing.
template <typename T> __device__ __forceinline__ void lse_combine(T &m, T &s, T m2, T s2) {
    if (m2 == neg_inf<T>()) return;
    if (m == neg_inf<T>()) {
        m = m2;
        s = s2;
        return;
    }
    T mm = max_t(m, m2);
    s = s * exp_t(m - mm) + s2 * exp_t(m2 - mm);
    m = mm;
}

template <typename T> __device__ __forceinline__ void warp_lse(T &m, T &s) {
    for (int o = 16; o > 0; o >>= 1) {
        T m2 = __shfl_xor_sync(0xffffffffu, m, o);
        T s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_combine(m, s, m2, s2);
    }
}

// The sum over the block (every thread gets it); `sh` holds 32 values.
template <typename T> __device__ __forceinline__ T block_sum(T v, T *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : (T)0;
    return warp_sum(v);
}

template <typename T> __device__ __forceinline__ void block_lse(T &m, T &s, T *shm, T *shs) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    warp_lse(m, s);
    __syncthreads();
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    m = lane < nw ? shm[lane] : neg_inf<T>();
    s = lane < nw ? shs[lane] : (T)0;
    warp_lse(m, s);
}

// ---------------------------------------------------------------------------------------
// Layer norm. x, y, dy, dx: (rows, c) contiguous; w, b: (c,).

template <typename T>
__device__ void ln_fwd(const T *x, const T *w, const T *b, T *y, int rows, int c, T eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *xr = x + (size_t)row * c;
    T *yr = y + (size_t)row * c;
    T s = 0;
    for (int j = lane; j < c; j += 32) s += xr[j];
    T mean = warp_sum(s) / (T)c;
    T v = 0;
    for (int j = lane; j < c; j += 32) {
        T d = xr[j] - mean;
        v += d * d;
    }
    T rstd = (T)1 / sqrt_t(warp_sum(v) / (T)c + eps);
    for (int j = lane; j < c; j += 32) yr[j] = (xr[j] - mean) * rstd * w[j] + b[j];
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w; stats[2 row] = mean,
// stats[2 row + 1] = rstd for the column sums.
template <typename T>
__device__ void ln_bwd_rows(const T *x, const T *w, const T *dy, T *dx, T *stats, int rows, int c,
                            T eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *xr = x + (size_t)row * c;
    const T *dyr = dy + (size_t)row * c;
    T *dxr = dx + (size_t)row * c;
    T s = 0;
    for (int j = lane; j < c; j += 32) s += xr[j];
    T mean = warp_sum(s) / (T)c;
    T v = 0;
    for (int j = lane; j < c; j += 32) {
        T d = xr[j] - mean;
        v += d * d;
    }
    T rstd = (T)1 / sqrt_t(warp_sum(v) / (T)c + eps);
    T sg = 0, sgx = 0;
    for (int j = lane; j < c; j += 32) {
        T g = dyr[j] * w[j];
        sg += g;
        sgx += g * (xr[j] - mean) * rstd;
    }
    T mean_g = warp_sum(sg) / (T)c, mean_gx = warp_sum(sgx) / (T)c;
    for (int j = lane; j < c; j += 32) {
        T g = dyr[j] * w[j];
        T xh = (xr[j] - mean) * rstd;
        dxr[j] = rstd * (g - mean_g - xh * mean_gx);
    }
    if (lane == 0) {
        stats[2 * (size_t)row] = mean;
        stats[2 * (size_t)row + 1] = rstd;
    }
}

// Column partial sums over a chunk of rows, blocks of (32, 8) threads: block (bx, by) sums
// columns bx*32.. over rows by*chunk.. into part[by * c + col] (and, for the layer norm,
// part2: the bias's). With x and stats the summand is dy * xhat (the layer-norm weight's
// gradient) and part2 gets dy; without, part gets dy alone.
template <typename T>
__device__ void col_partials(const T *dy, const T *x, const T *stats, T *part, T *part2, int rows,
                             int c, int chunk) {
    __shared__ T sh1[8][33];
    __shared__ T sh2[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
    T a1 = 0, a2 = 0;
    if (col < c) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            T g = dy[(size_t)r * c + col];
            if (x) {
                a1 += g * (x[(size_t)r * c + col] - stats[2 * (size_t)r]) * stats[2 * (size_t)r + 1];
                a2 += g;
            } else {
                a1 += g;
            }
        }
    }
    sh1[threadIdx.y][threadIdx.x] = a1;
    sh2[threadIdx.y][threadIdx.x] = a2;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        T s1 = 0, s2 = 0;
        for (int k = 0; k < 8; k++) {
            s1 += sh1[k][threadIdx.x];
            s2 += sh2[k][threadIdx.x];
        }
        part[(size_t)blockIdx.y * c + col] = s1;
        if (part2) part2[(size_t)blockIdx.y * c + col] = s2;
    }
}

// out[col] = sum over the chunks of part[chunk * c + col].
template <typename T> __device__ void col_final(const T *part, T *out, int chunks, int c) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    T s = 0;
    for (int k = 0; k < chunks; k++) s += part[(size_t)k * c + col];
    out[col] = s;
}

// ---------------------------------------------------------------------------------------
// Softmax over rows of s with scale, keep-mask and dropout. Row r is (b, h, t) of
// (nb, nh, nt); the keep-mask element (b, h, t, j) is keep[b kb + h kh + t kt + j ks] (strides
// 0 where it broadcasts); keep null: no mask. The dropout element index is r s + j.

struct MaskArgs {
    const unsigned char *keep;
    long long kb, kh, kt, ks;
    int nh, nt;
};

__device__ __forceinline__ MaskArgs mask_args(const unsigned char *keep, long long kb,
                                              long long kh, long long kt, long long ks, int nh,
                                              int nt) {
    MaskArgs m;
    m.keep = keep;
    m.kb = kb;
    m.kh = kh;
    m.kt = kt;
    m.ks = ks;
    m.nh = nh;
    m.nt = nt;
    return m;
}

__device__ __forceinline__ const unsigned char *mask_row(const MaskArgs &m, int row) {
    if (!m.keep) return 0;
    int t = row % m.nt, bh = row / m.nt;
    int h = bh % m.nh, b = bh / m.nh;
    return m.keep + b * m.kb + h * m.kh + t * m.kt;
}

// Each lane's (max, sum) over its share of a row of z = scale x, masked entries skipped;
// then the row's, in every lane. Returns whether the mask keeps any entry.
template <typename T>
__device__ __forceinline__ bool row_lse(const T *xr, const unsigned char *kr, long long ks, int s,
                                        T scale, T &m, T &sum) {
    int lane = threadIdx.x & 31;
    m = neg_inf<T>();
    sum = 0;
    int any = 0;
    for (int j = lane; j < s; j += 32) {
        if (kr && !kr[j * ks]) continue;
        any = 1;
        T z = xr[j] * scale;
        if (z > m) {
            sum = (m == neg_inf<T>() ? (T)0 : sum * exp_t(m - z)) + (T)1;
            m = z;
        } else {
            sum += exp_t(z - m);
        }
    }
    warp_lse(m, sum);
    return __any_sync(0xffffffffu, any);
}

template <typename T>
__device__ void softmax_fwd(const T *x, T *y, int rows, int s, T scale, MaskArgs mk, u64 key,
                            u64 threshold, T dscale) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *xr = x + (size_t)row * s;
    T *yr = y + (size_t)row * s;
    const unsigned char *kr = mask_row(mk, row);
    T m, sum;
    bool any = row_lse(xr, kr, mk.ks, s, scale, m, sum);
    T inv = (T)1 / sum;
    u64 base = (u64)row * (u64)s;
    for (int j = lane; j < s; j += 32) {
        T p = (!any || (kr && !kr[j * mk.ks])) ? (T)0 : exp_t(xr[j] * scale - m) * inv;
        if (threshold) p = kept(key, threshold, base + j) ? p * dscale : (T)0;
        yr[j] = p;
    }
}

// dx = scale p (dp - sum(dp p)) with dp = dy times the dropout mask; p recomputed from x.
template <typename T>
__device__ void softmax_bwd(const T *x, const T *dy, T *dx, int rows, int s, T scale, MaskArgs mk,
                            u64 key, u64 threshold, T dscale) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *xr = x + (size_t)row * s;
    const T *dyr = dy + (size_t)row * s;
    T *dxr = dx + (size_t)row * s;
    const unsigned char *kr = mask_row(mk, row);
    T m, sum;
    bool any = row_lse(xr, kr, mk.ks, s, scale, m, sum);
    T inv = (T)1 / sum;
    u64 base = (u64)row * (u64)s;
    T dot = 0;
    for (int j = lane; j < s; j += 32) {
        T p = (!any || (kr && !kr[j * mk.ks])) ? (T)0 : exp_t(xr[j] * scale - m) * inv;
        T dp = dyr[j];
        if (threshold) dp = kept(key, threshold, base + j) ? dp * dscale : (T)0;
        dot += dp * p;
    }
    dot = warp_sum(dot);
    for (int j = lane; j < s; j += 32) {
        T p = (!any || (kr && !kr[j * mk.ks])) ? (T)0 : exp_t(xr[j] * scale - m) * inv;
        T dp = dyr[j];
        if (threshold) dp = kept(key, threshold, base + j) ? dp * dscale : (T)0;
        dxr[j] = scale * p * (dp - dot);
    }
}

// ---------------------------------------------------------------------------------------
// Dropout, y = x scale where kept, else 0 (its own backward on the gradient).

template <typename T>
__device__ void dropout_apply(const T *x, T *y, u64 n, u64 key, u64 threshold, T scale) {
    u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = kept(key, threshold, i) ? x[i] * scale : (T)0;
}

// ---------------------------------------------------------------------------------------
// Bias + activation (0 ReLU, 1 GELU with erf) + dropout over (rows, c): u = x + b[col]. ReLU's
// gradient at u = 0 is 0, as PyTorch's and the fused CPU layers' (candle's composed relu
// takes 1 there).

template <typename T> __device__ __forceinline__ T act_fwd(T u, int act) {
    if (act == 0) return u > (T)0 ? u : (T)0;
    T cdf = (T)0.5 * ((T)1 + erf_t(u * (T)0.70710678118654752440));
    return u * cdf;
}

template <typename T> __device__ __forceinline__ T act_grad(T u, int act) {
    if (act == 0) return u > (T)0 ? (T)1 : (T)0;
    T cdf = (T)0.5 * ((T)1 + erf_t(u * (T)0.70710678118654752440));
    T pdf = exp_t((T)-0.5 * u * u) * (T)0.39894228040143267794;
    return cdf + u * pdf;
}

template <typename T>
__device__ void bias_act_fwd(const T *x, const T *b, T *y, u64 n, int c, int act, u64 key,
                             u64 threshold, T dscale) {
    u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T v = act_fwd(x[i] + b[i % c], act);
        if (threshold) v = kept(key, threshold, i) ? v * dscale : (T)0;
        y[i] = v;
    }
}

template <typename T>
__device__ void bias_act_bwd(const T *x, const T *b, const T *dy, T *dx, u64 n, int c, int act,
                             u64 key, u64 threshold, T dscale) {
    u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T g = dy[i];
        if (threshold) g = kept(key, threshold, i) ? g * dscale : (T)0;
        dx[i] = g * act_grad(x[i] + b[i % c], act);
    }
}

// ---------------------------------------------------------------------------------------
// Label-smoothed cross-entropy of logits (n, v) plus bias (v,), targets u32 (n,), rows whose
// target is `ignore` (or outside 0..v: NaN) count for nothing. Per kept row with z = logits + b
// and lse its log-sum-exp: nll = lse - z_t, loss = nll + eps (z_t - mean_j z_j).
// rowbuf[2 i] = loss, rowbuf[2 i + 1] = nll (0 for ignored rows).

template <typename T>
__device__ void xent_rows(const T *logits, const T *b, const unsigned int *targets, T *rowbuf,
                          int n, int v, unsigned int ignore, T eps) {
    __shared__ T shm[32], shs[32], shz[32];
    int row = blockIdx.x;
    if (row >= n) return;
    const T *zr = logits + (size_t)row * v;
    T m = neg_inf<T>(), s = 0, zs = 0;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        T z = zr[j] + b[j];
        zs += z;
        if (z > m) {
            s = (m == neg_inf<T>() ? (T)0 : s * exp_t(m - z)) + (T)1;
            m = z;
        } else {
            s += exp_t(z - m);
        }
    }
    block_lse(m, s, shm, shs);
    zs = block_sum(zs, shz);
    if (threadIdx.x == 0) {
        unsigned int t = targets[row];
        T loss = 0, nll = 0;
        if (t != ignore) {
            if (t >= (unsigned int)v) {
                loss = nll = nan_t<T>();
            } else {
                T zt = zr[t] + b[t];
                nll = m + log_t(s) - zt;
                loss = nll + eps * (zt - zs / (T)v);
            }
        }
        rowbuf[2 * (size_t)row] = loss;
        rowbuf[2 * (size_t)row + 1] = nll;
    }
}

// The number of targets that are not `ignore`, summed by the whole block (in every thread).
__device__ __forceinline__ int kept_count(const unsigned int *targets, int n, unsigned int ignore) {
    __shared__ float shc[32];
    float k = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) k += targets[i] != ignore ? 1.f : 0.f;
    return (int)block_sum(k, shc);
}

// out[0] = sum of the rows' losses / count, out[1] = the same of their nll (count at least 1).
template <typename T>
__device__ void xent_total(const T *rowbuf, const unsigned int *targets, T *out, int n,
                           unsigned int ignore) {
    __shared__ T sh1[32], sh2[32];
    T a = 0, c = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        a += rowbuf[2 * (size_t)i];
        c += rowbuf[2 * (size_t)i + 1];
    }
    a = block_sum(a, sh1);
    c = block_sum(c, sh2);
    int count = kept_count(targets, n, ignore);
    T inv = (T)1 / (T)(count > 0 ? count : 1);
    if (threadIdx.x == 0) {
        out[0] = a * inv;
        out[1] = c * inv;
    }
}

// dz for the two outputs' gradients g[0] (loss) and g[1] (nll), per kept row:
// (g0 + g1) / count (p_j - [j = t]) + g0 eps / count ([j = t] - 1 / v); 0 for ignored rows.
template <typename T>
__device__ void xent_bwd(const T *logits, const T *b, const unsigned int *targets, const T *g,
                         T *dz, int n, int v, unsigned int ignore, T eps) {
    __shared__ T shm[32], shs[32];
    int row = blockIdx.x;
    if (row >= n) return;
    int count = kept_count(targets, n, ignore);
    unsigned int t = targets[row];
    T *dr = dz + (size_t)row * v;
    if (t == ignore) {
        for (int j = threadIdx.x; j < v; j += blockDim.x) dr[j] = 0;
        return;
    }
    const T *zr = logits + (size_t)row * v;
    T m = neg_inf<T>(), s = 0;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        T z = zr[j] + b[j];
        if (z > m) {
            s = (m == neg_inf<T>() ? (T)0 : s * exp_t(m - z)) + (T)1;
            m = z;
        } else {
            s += exp_t(z - m);
        }
    }
    block_lse(m, s, shm, shs);
    T inv_count = (T)1 / (T)(count > 0 ? count : 1);
    T a = (g[0] + g[1]) * inv_count, e = g[0] * eps * inv_count;
    T inv_s = (T)1 / s, inv_v = (T)1 / (T)v;
    for (int j = threadIdx.x; j < v; j += blockDim.x) {
        T p = exp_t(zr[j] + b[j] - m) * inv_s;
        T onehot = (unsigned int)j == t ? (T)1 : (T)0;
        dr[j] = a * (p - onehot) + e * (onehot - inv_v);
    }
}

// ---------------------------------------------------------------------------------------
// The entry points, one per element type.

#define ENTRY(SUF, T)                                                                          \
    extern "C" __global__ void ln_fwd_##SUF(const T *x, const T *w, const T *b, T *y, int rows, \
                                            int c, T eps) {                                    \
        ln_fwd<T>(x, w, b, y, rows, c, eps);                                                   \
    }                                                                                          \
    extern "C" __global__ void ln_bwd_rows_##SUF(const T *x, const T *w, const T *dy, T *dx,   \
                                                 T *stats, int rows, int c, T eps) {           \
        ln_bwd_rows<T>(x, w, dy, dx, stats, rows, c, eps);                                     \
    }                                                                                          \
    extern "C" __global__ void col_partials_##SUF(const T *dy, const T *x, const T *stats,     \
                                                  T *part, T *part2, int rows, int c,          \
                                                  int chunk) {                                 \
        col_partials<T>(dy, x, stats, part, part2, rows, c, chunk);                            \
    }                                                                                          \
    extern "C" __global__ void col_final_##SUF(const T *part, T *out, int chunks, int c) {     \
        col_final<T>(part, out, chunks, c);                                                    \
    }                                                                                          \
    extern "C" __global__ void softmax_fwd_##SUF(const T *x, T *y, int rows, int s, T scale,   \
                                                 const unsigned char *keep, long long kb,       \
                                                 long long kh, long long kt, long long ks,     \
                                                 int nh, int nt, u64 key, u64 threshold,       \
                                                 T dscale) {                                   \
        softmax_fwd<T>(x, y, rows, s, scale, mask_args(keep, kb, kh, kt, ks, nh, nt), key,     \
                       threshold, dscale);                                                     \
    }                                                                                          \
    extern "C" __global__ void softmax_bwd_##SUF(const T *x, const T *dy, T *dx, int rows,     \
                                                 int s, T scale, const unsigned char *keep,    \
                                                 long long kb, long long kh, long long kt,     \
                                                 long long ks, int nh, int nt, u64 key,        \
                                                 u64 threshold, T dscale) {                    \
        softmax_bwd<T>(x, dy, dx, rows, s, scale, mask_args(keep, kb, kh, kt, ks, nh, nt), key, \
                       threshold, dscale);                                                     \
    }                                                                                          \
    extern "C" __global__ void dropout_apply_##SUF(const T *x, T *y, u64 n, u64 key,           \
                                                   u64 threshold, T scale) {                   \
        dropout_apply<T>(x, y, n, key, threshold, scale);                                      \
    }                                                                                          \
    extern "C" __global__ void bias_act_fwd_##SUF(const T *x, const T *b, T *y, u64 n, int c,  \
                                                  int act, u64 key, u64 threshold, T dscale) { \
        bias_act_fwd<T>(x, b, y, n, c, act, key, threshold, dscale);                           \
    }                                                                                          \
    extern "C" __global__ void bias_act_bwd_##SUF(const T *x, const T *b, const T *dy, T *dx,  \
                                                  u64 n, int c, int act, u64 key,              \
                                                  u64 threshold, T dscale) {                   \
        bias_act_bwd<T>(x, b, dy, dx, n, c, act, key, threshold, dscale);                      \
    }                                                                                          \
    extern "C" __global__ void xent_rows_##SUF(const T *logits, const T *b,                    \
                                               const unsigned int *targets, T *rowbuf, int n,  \
                                               int v, unsigned int ignore, T eps) {            \
        xent_rows<T>(logits, b, targets, rowbuf, n, v, ignore, eps);                           \
    }                                                                                          \
    extern "C" __global__ void xent_total_##SUF(const T *rowbuf, const unsigned int *targets,  \
                                                T *out, int n, unsigned int ignore) {          \
        xent_total<T>(rowbuf, targets, out, n, ignore);                                        \
    }                                                                                          \
    extern "C" __global__ void xent_bwd_##SUF(const T *logits, const T *b,                     \
                                              const unsigned int *targets, const T *g, T *dz,  \
                                              int n, int v, unsigned int ignore, T eps) {      \
        xent_bwd<T>(logits, b, targets, g, dz, n, v, ignore, eps);                             \
    }

ENTRY(f32, float)
ENTRY(f64, double)

// ---------------------------------------------------------------------------------------
// Many tensors as one: tensor i's elements are elements offsets[i] .. offsets[i + 1] of one
// index space, its data at the device address ptrs[i]. Each block takes CHUNK consecutive
// elements of that space (which may cross tensors).

#define CHUNK 8192

// The tensor that element `start` belongs to (offsets ascending, offsets[0] = 0).
__device__ __forceinline__ int tensor_of(const u64 *offsets, int ntensors, u64 start) {
    int lo = 0, hi = ntensors - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= start) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// partial[block] = the sum of the squares of the block's elements, in f64.
template <typename T>
__device__ void multi_sumsq(const u64 *ptrs, const u64 *offsets, int ntensors, double *partial) {
    __shared__ int t0;
    __shared__ double sh[32];
    u64 total = offsets[ntensors];
    u64 start = (u64)blockIdx.x * CHUNK, end = start + CHUNK < total ? start + CHUNK : total;
    if (threadIdx.x == 0) t0 = tensor_of(offsets, ntensors, start);
    __syncthreads();
    int t = t0;
    double acc = 0;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
        while (i >= offsets[t + 1]) t++;
        double v = (double)((const T *)ptrs[t])[i - offsets[t]];
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// out[0] = the sum of partial[0 .. n].
__device__ void sum_partials(const double *partial, double *out, int n) {
    __shared__ double sh[32];
    double acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}

// One Adam step over every parameter (params[i], gradient grads[i]) with the moments m, s laid
// end to end in the same index space, each element as the flat f32 step of
// crates/train/src/optim.rs computes it: g scaled by the clipping coefficient where `scaled`,
// m = m b1 + g (1 - b1), s = s b2 + g^2 (1 - b2), p -= (m / c1) / (sqrt(s / c2) + eps) lr.
template <typename T>
__device__ void multi_adam(const u64 *params, const u64 *grads, const u64 *offsets, int ntensors,
                           T *m, T *s, T b1, T b2, T one_b1, T one_b2, T eps, T lr, T c1, T c2,
                           T scale, int scaled) {
    __shared__ int t0;
    u64 total = offsets[ntensors];
    u64 start = (u64)blockIdx.x * CHUNK, end = start + CHUNK < total ? start + CHUNK : total;
    if (threadIdx.x == 0) t0 = tensor_of(offsets, ntensors, start);
    __syncthreads();
    int t = t0;
    for (u64 i = start + threadIdx.x; i < end; i += blockDim.x) {
        while (i >= offsets[t + 1]) t++;
        u64 j = i - offsets[t];
        T g = ((const T *)grads[t])[j];
        if (scaled) g = g * scale;
        T mv = m[i] * b1 + g * one_b1;
        T sv = s[i] * b2 + (g * g) * one_b2;
        T denom = sqrt_t(sv / c2) + eps;
        T *p = (T *)params[t];
        p[j] = p[j] - ((mv / c1) / denom) * lr;
        m[i] = mv;
        s[i] = sv;
    }
}

extern "C" __global__ void sum_partials_f64(const double *partial, double *out, int n) {
    sum_partials(partial, out, n);
}

#define MULTI_ENTRY(SUF, T)                                                                     \
    extern "C" __global__ void multi_sumsq_##SUF(const u64 *ptrs, const u64 *offsets,           \
                                                 int ntensors, double *partial) {               \
        multi_sumsq<T>(ptrs, offsets, ntensors, partial);                                       \
    }                                                                                           \
    extern "C" __global__ void multi_adam_##SUF(const u64 *params, const u64 *grads,            \
                                                const u64 *offsets, int ntensors, T *m, T *s,   \
                                                T b1, T b2, T one_b1, T one_b2, T eps, T lr,    \
                                                T c1, T c2, T scale, int scaled) {              \
        multi_adam<T>(params, grads, offsets, ntensors, m, s, b1, b2, one_b1, one_b2, eps, lr,  \
                      c1, c2, scale, scaled);                                                   \
    }

MULTI_ENTRY(f32, float)
MULTI_ENTRY(f64, double)
