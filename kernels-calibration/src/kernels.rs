//! CUDA C source of the element-wise and attention kernels, compiled at run time by NVRTC.
//!
//! Tensors are bf16 stored as raw 16-bit words (converted by hand, so NVRTC needs no CUDA
//! headers); accumulation is in fp32. Attention reads a paged KV cache (blocks of
//! [`BLOCK_SIZE`] slots through a block table, as vLLM's) with the two kernels serving
//! systems run: a FlashAttention-2-style prefill kernel (tiles of 64 queries and 64 keys,
//! `mma.sync` bf16 tensor-core instructions, online softmax in registers) and a split-KV
//! paged decode kernel (FlashDecoding, vLLM's `paged_attention_v2`) with a reduction
//! kernel. They need compute capability 8.0 or newer and a head dimension of [`HEAD_DIM`].

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

// Keeps one SM busy for `cycles` clock cycles: launched before a timed batch, it lets the
// host enqueue the batch's kernels while the GPU waits, so the events time the GPU's work
// alone (as a CUDA graph replays it), not the host's launch rate.
extern "C" __global__ void spin_wait(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}

// ---------------------------------------------------------------------------------------
// Paged KV cache: K and V are [block][slot in block][kv head][d], BLOCK_SIZE slots a block.
// Token `pos` of sequence `s` lives in physical slot
//   block_table[bt_start[s] + pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE.
#define BLOCK_SIZE 16
#define HEAD_DIM 128
#define NEG_INF __int_as_float(0xff800000u)

__device__ __forceinline__ long kv_slot(const int* block_table, int bt_start, int pos) {
    return (long)block_table[bt_start + pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
}

// Appends the K and V of each row to its sequence's paged cache: row r is token pos[r] of
// sequence seq_of[r].
extern "C" __global__ void kv_append(const bf16* qkv, bf16* kcache, bf16* vcache,
                                     const int* seq_of, const int* pos, const int* block_table,
                                     const int* bt_start, int rows, int nh, int nkv, int d) {
    long per_row = (long)nkv * d;
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * per_row) return;
    int r = idx / per_row;
    long i = idx % per_row;
    long width = (long)(nh + 2 * nkv) * d;
    long slot = kv_slot(block_table, bt_start[seq_of[r]], pos[r]) * per_row + i;
    kcache[slot] = qkv[r * width + (long)nh * d + i];
    vcache[slot] = qkv[r * width + (long)(nh + nkv) * d + i];
}

// Two floats to a bf16 pair (round to nearest even), `lo` in the low half.
__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// 2^x on the special-function unit (2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// D = A x B + D on tensor cores: A 16x16 (row), B 16x8 (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8x8 b16 matrices from shared memory; lane l gives the address of row l % 8 of
// matrix l / 8. Non-transposed: r[i] holds row lane/4, columns 2(lane%4) .. +1 of matrix i.
__device__ __forceinline__ void ldsm_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// The same, transposed: r[i] holds rows 2(lane%4) .. +1, column lane/4 of matrix i.
__device__ __forceinline__ void ldsm_x4_t(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// 16 bytes global -> shared without registers; `bytes` 0 writes zeros.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::); }
__device__ __forceinline__ void cp_async_wait_0() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Causal prefill attention of chunks over a paged cache, FlashAttention-2 style: a block
// (8 warps) takes 128 query rows of one chunk and one head; each warp owns 16 rows; key tiles
// of 64 are copied into shared memory with cp.async (the next tile's K while this tile's
// V is in flight, and so on); S = Q K^T and O += P V run on tensor cores (ldmatrix, mma.sync)
// with an online softmax in registers. Tile t covers rows tile_row[t] .. + tile_rows[t] - 1
// of qkv, tokens tile_pos[t] .. of sequence tile_seq[t]; a row at position p sees keys
// 0 ..= p. The host orders tiles longest first, so the causal imbalance does not leave a tail.
#define PF_ROWS 128
#define PF_KEYS 64
#define PF_STRIDE (HEAD_DIM + 8)

// Copies K or V of keys k0 .. k0 + 63 into `dst` (zeros past last_key).
__device__ __forceinline__ void pf_stage(bf16* dst, const bf16* cache, const int* block_table,
                                         int bts, int k0, int last_key, int nkv, int kvh) {
    for (int i = threadIdx.x; i < PF_KEYS * (HEAD_DIM / 8); i += blockDim.x) {
        int j = i / (HEAD_DIM / 8), c = (i % (HEAD_DIM / 8)) * 8;
        int key = k0 + j;
        bool in = key <= last_key;
        long off = in ? (kv_slot(block_table, bts, key) * nkv + kvh) * HEAD_DIM + c : 0;
        cp_async16(smem_addr(dst + j * PF_STRIDE + c), cache + off, in ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(256)
prefill_attention(const bf16* qkv, const bf16* kcache, const bf16* vcache,
                  const int* block_table, const int* bt_start, const int* tile_seq,
                  const int* tile_row, const int* tile_rows, const int* tile_pos,
                  bf16* out, int nh, int nkv) {
    __shared__ __align__(128) bf16 ks[PF_KEYS * PF_STRIDE];
    __shared__ __align__(128) bf16 vs[PF_KEYS * PF_STRIDE];
    const int d = HEAD_DIM;
    int tile = blockIdx.x, head = blockIdx.y;
    int kvh = head / (nh / nkv);
    int seq = tile_seq[tile], row0 = tile_row[tile], nrows = tile_rows[tile], pos0 = tile_pos[tile];
    int bts = bt_start[seq];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int g = lane >> 2, t = lane & 3;
    long width = (long)(nh + 2 * nkv) * d;
    int last_key = pos0 + nrows - 1;  // the last row sees keys 0 ..= last_key
    pf_stage(ks, kcache, block_table, bts, 0, last_key, nkv, kvh);
    cp_async_commit();
    pf_stage(vs, vcache, block_table, bts, 0, last_key, nkv, kvh);
    cp_async_commit();
    // Q fragments of this warp's 16 rows (rows past the tile are zero).
    unsigned qf[HEAD_DIM / 16][4];
    int ra = warp * 16 + g, rb = ra + 8;
    const unsigned* qa = (const unsigned*)(qkv + (long)(row0 + ra) * width + (long)head * d);
    const unsigned* qb = (const unsigned*)(qkv + (long)(row0 + rb) * width + (long)head * d);
    #pragma unroll
    for (int k = 0; k < HEAD_DIM / 16; ++k) {
        int c0 = (k * 16 + t * 2) / 2, c1 = (k * 16 + 8 + t * 2) / 2;
        qf[k][0] = ra < nrows ? qa[c0] : 0u;
        qf[k][1] = rb < nrows ? qb[c0] : 0u;
        qf[k][2] = ra < nrows ? qa[c1] : 0u;
        qf[k][3] = rb < nrows ? qb[c1] : 0u;
    }
    float o[HEAD_DIM / 8][4];
    #pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) { o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f; }
    float m_a = NEG_INF, m_b = NEG_INF, l_a = 0.0f, l_b = 0.0f;
    const float scale_log2 = rsqrtf((float)d) * 1.4426950408889634f;
    int pa = pos0 + ra, pb = pos0 + rb;
    int warp_last = pos0 + min(warp * 16 + 15, nrows - 1);
    // ldmatrix row addresses of this lane: matrix mi = lane / 8, row lane % 8.
    int mi = lane >> 3, mr = lane & 7;
    unsigned k_base = smem_addr(ks + mr * PF_STRIDE + (mi & 1) * 8 + (mi >> 1) * 16);
    unsigned v_base = smem_addr(vs + ((mi & 1) * 8 + mr) * PF_STRIDE + (mi >> 1) * 8);
    for (int k0 = 0; k0 <= last_key; k0 += PF_KEYS) {
        bool next = k0 + PF_KEYS <= last_key;
        cp_async_wait_1();  // K of this tile has landed (V may still be in flight)
        __syncthreads();
        bool active = k0 <= warp_last;  // some row of this warp sees a key of this tile
        float s[PF_KEYS / 8][4];
        if (active) {
            #pragma unroll
            for (int n = 0; n < PF_KEYS / 8; ++n) {
                s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
                #pragma unroll
                for (int k = 0; k < HEAD_DIM / 16; k += 2) {
                    unsigned b[4];
                    ldsm_x4(b, k_base + (unsigned)((n * 8 * PF_STRIDE + k * 16) * 2));
                    mma16816(s[n], qf[k], b[0], b[1]);
                    mma16816(s[n], qf[k + 1], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with K: stage the next tile's K
        if (next) pf_stage(ks, kcache, block_table, bts, k0 + PF_KEYS, last_key, nkv, kvh);
        cp_async_commit();
        if (active) {
            // Causal mask (only on tiles that cross this warp's diagonal) and online
            // softmax (rows ra and rb of this thread).
            float mx_a = NEG_INF, mx_b = NEG_INF;
            if (k0 + PF_KEYS - 1 > pos0 + warp * 16) {
                #pragma unroll
                for (int n = 0; n < PF_KEYS / 8; ++n) {
                    #pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        int key = k0 + n * 8 + t * 2 + e;
                        s[n][e] = key <= pa ? s[n][e] * scale_log2 : NEG_INF;
                        s[n][2 + e] = key <= pb ? s[n][2 + e] * scale_log2 : NEG_INF;
                    }
                }
            } else {
                #pragma unroll
                for (int n = 0; n < PF_KEYS / 8; ++n) {
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) s[n][e] *= scale_log2;
                }
            }
            #pragma unroll
            for (int n = 0; n < PF_KEYS / 8; ++n) {
                mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
                mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
            }
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
            mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
            mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
            float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
            float use_a = new_a == NEG_INF ? 0.0f : new_a;
            float use_b = new_b == NEG_INF ? 0.0f : new_b;
            float alpha_a = fast_exp2(m_a - use_a), alpha_b = fast_exp2(m_b - use_b);
            m_a = new_a;
            m_b = new_b;
            float sum_a = 0.0f, sum_b = 0.0f;
            #pragma unroll
            for (int n = 0; n < PF_KEYS / 8; ++n) {
                s[n][0] = fast_exp2(s[n][0] - use_a);
                s[n][1] = fast_exp2(s[n][1] - use_a);
                s[n][2] = fast_exp2(s[n][2] - use_b);
                s[n][3] = fast_exp2(s[n][3] - use_b);
                sum_a += s[n][0] + s[n][1];
                sum_b += s[n][2] + s[n][3];
            }
            l_a = l_a * alpha_a + sum_a;
            l_b = l_b * alpha_b + sum_b;
            #pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; ++n) {
                o[n][0] *= alpha_a; o[n][1] *= alpha_a;
                o[n][2] *= alpha_b; o[n][3] *= alpha_b;
            }
        }
        if (next) cp_async_wait_1(); else cp_async_wait_0();  // V of this tile has landed
        __syncthreads();
        if (active) {
            // O += P V: P's accumulator layout is the A-operand layout of the next MMA.
            #pragma unroll
            for (int kk = 0; kk < PF_KEYS / 16; ++kk) {
                unsigned pf[4];
                pf[0] = pack_bf2(s[2 * kk][0], s[2 * kk][1]);
                pf[1] = pack_bf2(s[2 * kk][2], s[2 * kk][3]);
                pf[2] = pack_bf2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                pf[3] = pack_bf2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
                #pragma unroll
                for (int n = 0; n < HEAD_DIM / 8; n += 2) {
                    unsigned b[4];
                    ldsm_x4_t(b, v_base + (unsigned)((kk * 16 * PF_STRIDE + n * 8) * 2));
                    mma16816(o[n], pf, b[0], b[1]);
                    mma16816(o[n + 1], pf, b[2], b[3]);
                }
            }
        }
        __syncthreads();  // every warp is done with V: stage the next tile's V
        if (next) pf_stage(vs, vcache, block_table, bts, k0 + PF_KEYS, last_key, nkv, kvh);
        cp_async_commit();
    }
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
    long ow = (long)nh * d;
    #pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n) {
        int col = head * d + n * 8 + t * 2;
        if (ra < nrows)
            *(unsigned*)(out + (long)(row0 + ra) * ow + col) = pack_bf2(o[n][0] * inv_a, o[n][1] * inv_a);
        if (rb < nrows)
            *(unsigned*)(out + (long)(row0 + rb) * ow + col) = pack_bf2(o[n][2] * inv_b, o[n][3] * inv_b);
    }
}

// Decode attention over a paged cache, split over the context (FlashDecoding, vLLM's
// paged_attention_v2): block (partition p, KV head) handles keys part_start[p] ..
// part_end[p] - 1 of sequence part_seq[p] for the G query heads sharing the KV head.
// A half-warp reads one key (16 lanes x 8 values of d = 128), four keys in flight per
// iteration; 8 half-warps per block. Writes per (partition, head): running max, sum of
// exponentials and the unnormalised output, which decode_reduce combines. One entry point
// per group size G (query heads per KV head), so registers hold only what G needs.
#define DEC_MAX_GROUP 8
template <int G>
__device__ __forceinline__ void decode_body(
        const bf16* qkv, const bf16* kcache, const bf16* vcache, const int* block_table,
        const int* bt_start, const int* seq_row, const int* part_seq, const int* part_start,
        const int* part_end, float* partial, int nh, int nkv) {
    const int d = HEAD_DIM;
    int p = blockIdx.x, kvh = blockIdx.y;
    int seq = part_seq[p], bts = bt_start[seq];
    int half = threadIdx.x / 16, hl = threadIdx.x % 16;  // 8 half-warps
    long width = (long)(nh + 2 * nkv) * d;
    const bf16* qrow = qkv + (long)seq_row[seq] * width;
    float q[G][8], m[G], l[G], acc[G][8];
    const float scale_log2 = rsqrtf((float)d) * 1.4426950408889634f;
    #pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = NEG_INF; l[h] = 0.0f;
        #pragma unroll
        for (int i = 0; i < 8; ++i) {
            acc[h][i] = 0.0f;
            q[h][i] = to_f(qrow[(long)(kvh * G + h) * d + hl * 8 + i]) * scale_log2;
        }
    }
    // Both half-warps of a warp run the same iterations (the shuffles need all 32 lanes);
    // a key past the partition's end is read as nothing and changes nothing. Each
    // iteration a warp takes 8 keys, 4 per half-warp, whose loads are all in flight at once.
    int pend = part_end[p];
    int warp = threadIdx.x / 32;
    for (int base = part_start[p] + warp * 8; base < pend; base += 32) {
        uint4 k4[4], v4[4];
        bool valid[4];
        long off[4];
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            int key = base + 2 * u + (half & 1);
            valid[u] = key < pend;
            off[u] = valid[u] ? (kv_slot(block_table, bts, key) * nkv + kvh) * d + hl * 8 : 0;
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (valid[u]) {
                k4[u] = *(const uint4*)(kcache + off[u]);
                v4[u] = *(const uint4*)(vcache + off[u]);
            } else {
                k4[u].x = k4[u].y = k4[u].z = k4[u].w = 0u;
                v4[u] = k4[u];
            }
        }
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            const bf16* kk = (const bf16*)&k4[u];
            const bf16* vv = (const bf16*)&v4[u];
            float kf[8], vf[8];
            #pragma unroll
            for (int i = 0; i < 8; ++i) { kf[i] = to_f(kk[i]); vf[i] = to_f(vv[i]); }
            #pragma unroll
            for (int h = 0; h < G; ++h) {
                float s = 0.0f;
                #pragma unroll
                for (int i = 0; i < 8; ++i) s += q[h][i] * kf[i];
                s += __shfl_xor_sync(0xffffffffu, s, 8);
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                s += __shfl_xor_sync(0xffffffffu, s, 2);
                s += __shfl_xor_sync(0xffffffffu, s, 1);
                if (valid[u]) {
                    float nm = fmaxf(m[h], s);
                    float alpha = fast_exp2(m[h] - nm), e = fast_exp2(s - nm);
                    m[h] = nm;
                    l[h] = l[h] * alpha + e;
                    #pragma unroll
                    for (int i = 0; i < 8; ++i) acc[h][i] = acc[h][i] * alpha + e * vf[i];
                }
            }
        }
    }
    // Combine the 8 half-warps through shared memory.
    __shared__ float sm_m[8][G], sm_l[8][G];
    __shared__ float sm_acc[8][G][HEAD_DIM];
    #pragma unroll
    for (int h = 0; h < G; ++h) {
        if (hl == 0) { sm_m[half][h] = m[h]; sm_l[half][h] = l[h]; }
        #pragma unroll
        for (int i = 0; i < 8; ++i) sm_acc[half][h][hl * 8 + i] = acc[h][i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * HEAD_DIM; idx += blockDim.x) {
        int h = idx / HEAD_DIM, i = idx % HEAD_DIM;
        float gm = NEG_INF;
        for (int w = 0; w < 8; ++w) gm = fmaxf(gm, sm_m[w][h]);
        float gl = 0.0f, ga = 0.0f;
        for (int w = 0; w < 8; ++w) {
            float f = sm_m[w][h] == NEG_INF ? 0.0f : exp2f(sm_m[w][h] - gm);
            gl += sm_l[w][h] * f;
            ga += sm_acc[w][h][i] * f;
        }
        float* dst = partial + ((long)p * nh + kvh * G + h) * (HEAD_DIM + 2);
        dst[2 + i] = ga;
        if (i == 0) { dst[0] = gm; dst[1] = gl; }
    }
}

#define DECODE_ENTRY(G)                                                                      \
extern "C" __global__ void __launch_bounds__(128) decode_attention_g##G(                     \
        const bf16* qkv, const bf16* kcache, const bf16* vcache, const int* block_table,     \
        const int* bt_start, const int* seq_row, const int* part_seq, const int* part_start, \
        const int* part_end, float* partial, int nh, int nkv) {                              \
    decode_body<G>(qkv, kcache, vcache, block_table, bt_start, seq_row, part_seq,            \
                   part_start, part_end, partial, nh, nkv);                                  \
}
DECODE_ENTRY(1)
DECODE_ENTRY(2)
DECODE_ENTRY(4)
DECODE_ENTRY(8)

// Combines a sequence's partitions: block (decode sequence s, head), one thread per d.
extern "C" __global__ void decode_reduce(const float* partial, const int* seq_row,
                                         const int* seq_part_first, const int* seq_part_count,
                                         int first_decode_seq, bf16* out, int nh) {
    int s = first_decode_seq + blockIdx.x, head = blockIdx.y, i = threadIdx.x;
    int first = seq_part_first[blockIdx.x], count = seq_part_count[blockIdx.x];
    float gm = NEG_INF;
    for (int k = 0; k < count; ++k)
        gm = fmaxf(gm, partial[((long)(first + k) * nh + head) * (HEAD_DIM + 2)]);
    float gl = 0.0f, ga = 0.0f;
    for (int k = 0; k < count; ++k) {
        const float* src = partial + ((long)(first + k) * nh + head) * (HEAD_DIM + 2);
        float f = src[0] == NEG_INF ? 0.0f : exp2f(src[0] - gm);
        gl += src[1] * f;
        ga += src[2 + i] * f;
    }
    out[(long)seq_row[s] * nh * HEAD_DIM + (long)head * HEAD_DIM + i] = to_bf(gl > 0.0f ? ga / gl : 0.0f);
}
"#;

/// Kernel entry points in [`SOURCE`].
pub const ENTRY_POINTS: &[&str] = &[
    "rmsnorm",
    "rope",
    "silu_mul",
    "residual_add",
    "spin_wait",
    "kv_append",
    "prefill_attention",
    "decode_attention_g1",
    "decode_attention_g2",
    "decode_attention_g4",
    "decode_attention_g8",
    "decode_reduce",
];

/// Slots per block of the paged KV cache (vLLM's default block size).
pub const BLOCK_SIZE: usize = 16;
/// The head dimension the attention kernels are written for (Llama-2/3 models).
pub const HEAD_DIM: usize = 128;
/// Query rows per prefill attention block (8 warps of 16 rows; measured on an H100: 13-15%
/// faster than 64 rows on chunks of 1,024 tokens and more, the same on short ones).
pub const PREFILL_TILE_ROWS: usize = 128;
/// Keys per decode partition (split-KV, as vLLM's `paged_attention_v2`; measured on an
/// H100: 512 left one decode over a 2,048-token context latency-bound at 39 us).
pub const DECODE_PARTITION: usize = 256;
/// Query heads per KV head the decode kernel has an entry point for
/// (`decode_attention_g{G}`).
pub const DECODE_GROUPS: [usize; 4] = [1, 2, 4, 8];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_once() {
        for name in ENTRY_POINTS {
            let defined = match name.strip_prefix("decode_attention_g") {
                // One instantiation of the decode body per group size, by macro.
                Some(g) => SOURCE.matches(&format!("DECODE_ENTRY({g})")).count(),
                None => {
                    SOURCE.matches(&format!("__global__ void {name}(")).count()
                        + SOURCE.matches(&format!(")\n{name}(")).count()
                }
            };
            assert_eq!(defined, 1, "{name}");
        }
        for g in DECODE_GROUPS {
            assert!(ENTRY_POINTS.contains(&format!("decode_attention_g{g}").as_str()));
        }
        // The host's tile and partition sizes are the kernels'.
        assert!(SOURCE.contains(&format!("#define PF_ROWS {PREFILL_TILE_ROWS}")));
        assert!(SOURCE.contains(&format!(
            "__launch_bounds__({})\nprefill_attention(",
            2 * PREFILL_TILE_ROWS
        )));
        assert!(SOURCE.contains(&format!("#define BLOCK_SIZE {BLOCK_SIZE}")));
        assert!(SOURCE.contains(&format!("#define HEAD_DIM {HEAD_DIM}")));
        // Braces balance (a cheap syntax check; NVRTC compiles it on the GPU machine).
        assert_eq!(SOURCE.matches('{').count(), SOURCE.matches('}').count());
    }
}
