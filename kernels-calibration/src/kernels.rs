//! CUDA C source of the element-wise and attention kernels, compiled at run time by NVRTC.
//!
//! Tensors are bf16 stored as raw 16-bit words (converted by hand, so NVRTC needs no CUDA
//! headers); accumulation is in fp32. The attention kernels are straightforward (one block
//! per query token and head, scores in shared memory), not FlashAttention: the calibration
//! measures these kernels, and the README says so.

/// The kernels; entry points are `extern "C"`.
pub const SOURCE: &str = r#"
typedef unsigned short bf16;

__device__ __forceinline__ float to_f(bf16 v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

__device__ __forceinline__ bf16 to_bf(float f) {
    unsigned int u = __float_as_uint(f);
    unsigned int rounding = 0x7fffu + ((u >> 16) & 1u);
    return (bf16)((u + rounding) >> 16);
}

// out[r, :] = x[r, :] / rms(x[r, :]) * w; one block per row.
extern "C" __global__ void rmsnorm(const bf16* x, const bf16* w, bf16* out, int rows, int h) {
    extern __shared__ float partial[];
    int r = blockIdx.x;
    if (r >= rows) return;
    const bf16* xr = x + (long)r * h;
    float s = 0.0f;
    for (int i = threadIdx.x; i < h; i += blockDim.x) { float v = to_f(xr[i]); s += v * v; }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) partial[threadIdx.x] += partial[threadIdx.x + k];
        __syncthreads();
    }
    float inv = rsqrtf(partial[0] / h + 1e-5f);
    for (int i = threadIdx.x; i < h; i += blockDim.x)
        out[(long)r * h + i] = to_bf(to_f(xr[i]) * inv * to_f(w[i]));
}

// Rotary embedding in place on q [rows, nh, d] and k [rows, nkv, d] inside qkv rows of
// width (nh + 2 nkv) d; pos[r] is the token position.
extern "C" __global__ void rope(bf16* qkv, const int* pos, int rows, int nh, int nkv, int d) {
    long width = (long)(nh + 2 * nkv) * d;
    long pairs = (long)(nh + nkv) * (d / 2);
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * pairs) return;
    int r = idx / pairs;
    long p = idx % pairs;
    int head = p / (d / 2);
    int i = p % (d / 2);
    float theta = pos[r] * powf(10000.0f, -2.0f * i / d);
    float c = cosf(theta), s = sinf(theta);
    bf16* v = qkv + r * width + (long)head * d;
    float a = to_f(v[i]), b = to_f(v[i + d / 2]);
    v[i] = to_bf(a * c - b * s);
    v[i + d / 2] = to_bf(a * s + b * c);
}

// out[r, j] = silu(gu[r, j]) * gu[r, f + j].
extern "C" __global__ void silu_mul(const bf16* gu, bf16* out, int rows, int f) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)rows * f) return;
    long r = idx / f, j = idx % f;
    float g = to_f(gu[r * 2 * f + j]);
    float u = to_f(gu[r * 2 * f + f + j]);
    out[idx] = to_bf(g / (1.0f + __expf(-g)) * u);
}

// x += y, element-wise.
extern "C" __global__ void residual_add(bf16* x, const bf16* y, long n) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) x[idx] = to_bf(to_f(x[idx]) + to_f(y[idx]));
}

// Attention of query rows over a contiguous per-sequence KV cache (layout [token, nkv, d]
// for K and V). Block (row, head): query row `row` belongs to sequence seq_of[row], sees
// keys 0 .. visible[row] - 1 of that sequence, which start at kv_start[seq].
extern "C" __global__ void attention(const bf16* qkv, const bf16* kcache, const bf16* vcache,
                                     const int* seq_of, const int* visible, const long* kv_start,
                                     bf16* out, int nh, int nkv, int d) {
    extern __shared__ float scores[];
    int row = blockIdx.x, head = blockIdx.y;
    int seq = seq_of[row];
    int n = visible[row];
    int kvh = head / (nh / nkv);
    long width = (long)(nh + 2 * nkv) * d;
    const bf16* q = qkv + row * width + (long)head * d;
    const bf16* kb = kcache + kv_start[seq] * nkv * d + (long)kvh * d;
    const bf16* vb = vcache + kv_start[seq] * nkv * d + (long)kvh * d;
    float scale = rsqrtf((float)d);
    __shared__ float red[256];
    float local_max = -1e30f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        const bf16* k = kb + (long)t * nkv * d;
        float s = 0.0f;
        for (int i = 0; i < d; ++i) s += to_f(q[i]) * to_f(k[i]);
        s *= scale;
        scores[t] = s;
        local_max = fmaxf(local_max, s);
    }
    red[threadIdx.x] = local_max;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + k]);
        __syncthreads();
    }
    float m = red[0];
    __syncthreads();
    float local_sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float e = __expf(scores[t] - m);
        scores[t] = e;
        local_sum += e;
    }
    red[threadIdx.x] = local_sum;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    float inv = 1.0f / red[0];
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t < n; ++t) acc += scores[t] * to_f(vb[(long)t * nkv * d + i]);
        out[(long)row * nh * d + (long)head * d + i] = to_bf(acc * inv);
    }
}

// Appends the K and V of each row to its sequence's cache slot: row r is token pos[r] of
// sequence seq_of[r].
extern "C" __global__ void kv_append(const bf16* qkv, bf16* kcache, bf16* vcache,
                                     const int* seq_of, const int* pos, const long* kv_start,
                                     int rows, int nh, int nkv, int d) {
    long per_row = (long)nkv * d;
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * per_row) return;
    int r = idx / per_row;
    long i = idx % per_row;
    long width = (long)(nh + 2 * nkv) * d;
    long slot = (kv_start[seq_of[r]] + pos[r]) * per_row + i;
    kcache[slot] = qkv[r * width + (long)nh * d + i];
    vcache[slot] = qkv[r * width + (long)(nh + nkv) * d + i];
}
"#;

/// Kernel entry points in [`SOURCE`].
pub const ENTRY_POINTS: &[&str] = &[
    "rmsnorm",
    "rope",
    "silu_mul",
    "residual_add",
    "attention",
    "kv_append",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_once() {
        for name in ENTRY_POINTS {
            let decl = format!("__global__ void {name}(");
            assert_eq!(SOURCE.matches(&decl).count(), 1, "{name}");
        }
        // Braces balance (a cheap syntax check; NVRTC compiles it on the GPU machine).
        assert_eq!(SOURCE.matches('{').count(), SOURCE.matches('}').count());
    }
}
