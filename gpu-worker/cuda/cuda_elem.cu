/* Element-wise and row-wise kernels of the CUDA backend: dtype conversion, fill_random, GGUF
 * dequantization, get_rows, bias, rmsnorm, rope (and rope + KV-cache store), swiglu, attn_merge.
 *
 * Where the CPU backend's arithmetic is simple enough, these kernels reproduce it bit for bit
 * (explicit __fmul_rn/__fadd_rn stop nvcc from contracting into FMAs, which the C11 build of
 * the CPU backend does not do): fill_random must (random-weight models are the same model on
 * both backends) and dequantization/rope do because it makes the cross-check exact. */
#include "ra_cuda.cuh"

#include <math.h>

namespace {

constexpr int kThreads = 256;

/* Grid for a grid-stride loop over n items: enough blocks to fill the GPU, never more than
 * the items need. */
unsigned grid_for(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  if (b > 65535u * 8u) b = 65535u * 8u;
  return b ? (unsigned)b : 1u;
}

template <typename D, typename S>
__global__ void convert_kernel(D *__restrict__ dst, const S *__restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = ra_cuda_from_f32<D>(ra_cuda_to_f32(src[i]));
}

template <typename D>
cudaError_t convert_to(cudaStream_t s, D *dst, const void *src, int src_dtype, size_t n) {
  switch (src_dtype) {
    case RA_DTYPE_F32: convert_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, (const float *)src, n); break;
    case RA_DTYPE_F16: convert_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, (const __half *)src, n); break;
    default: convert_kernel<<<grid_for(n), kThreads, 0, s>>>(dst, (const __nv_bfloat16 *)src, n); break;
  }
  return cudaGetLastError();
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename D>
__global__ void fill_random_kernel(D *__restrict__ dst, size_t n, uint64_t base, float center, float scale) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float u = (float)(splitmix64(base ^ (uint64_t)i) >> 40) * 0x1p-24f;
    float v = __fadd_rn(center, __fmul_rn(scale, __fsub_rn(__fmul_rn(2.0f, u), 1.0f)));
    dst[i] = ra_cuda_from_f32<D>(v);
  }
}

/* ---- GGUF dequantization: one thread per block of 32 (legacy) or 256 (k-quant) values ---- */

enum : uint32_t {
  GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
  GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_BF16 = 30,
};

/* fp16 from two bytes (blocks are only 2-byte aligned). */
__device__ __forceinline__ float f16_at(const uint8_t *p) {
  return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }

/* Q4_0: d | qs[16]: x = (nibble - 8) * d, low nibbles are values 0..15 */
template <typename D> __device__ void dq_q4_0(const uint8_t *b, D *y) {
  float d = f16_at(b);
  for (int j = 0; j < 16; j++) {
    y[j] = ra_cuda_from_f32<D>(mul((float)((b[2 + j] & 15) - 8), d));
    y[j + 16] = ra_cuda_from_f32<D>(mul((float)((b[2 + j] >> 4) - 8), d));
  }
}
/* Q4_1: d | m | qs[16]: x = nibble * d + m */
template <typename D> __device__ void dq_q4_1(const uint8_t *b, D *y) {
  float d = f16_at(b), m = f16_at(b + 2);
  for (int j = 0; j < 16; j++) {
    y[j] = ra_cuda_from_f32<D>(add(mul((float)(b[4 + j] & 15), d), m));
    y[j + 16] = ra_cuda_from_f32<D>(add(mul((float)(b[4 + j] >> 4), d), m));
  }
}
/* Q5_0/Q5_1: d | (m) | qh u32 | qs[16]: bit j of qh is the fifth bit of value j */
template <typename D> __device__ void dq_q5(const uint8_t *b, D *y, bool has_min) {
  float d = f16_at(b), m = has_min ? f16_at(b + 2) : 0.0f;
  const uint8_t *p = b + (has_min ? 4 : 2);
  uint32_t qh = p[0] | (p[1] << 8) | (p[2] << 16) | ((uint32_t)p[3] << 24);
  const uint8_t *qs = p + 4;
  int off = has_min ? 0 : 16;
  for (int j = 0; j < 16; j++) {
    int lo = (qs[j] & 15) | (int)(((qh >> j) & 1u) << 4);
    int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
    y[j] = ra_cuda_from_f32<D>(add(mul((float)(lo - off), d), m));
    y[j + 16] = ra_cuda_from_f32<D>(add(mul((float)(hi - off), d), m));
  }
}
/* Q8_0: d | int8 qs[32] */
template <typename D> __device__ void dq_q8_0(const uint8_t *b, D *y) {
  float d = f16_at(b);
  for (int j = 0; j < 32; j++) y[j] = ra_cuda_from_f32<D>(mul((float)(int8_t)b[2 + j], d));
}
/* Q2_K: scales[16] | qs[64] | d | dmin; 16-value groups with 4-bit scale (low) and min (high) */
template <typename D> __device__ void dq_q2_k(const uint8_t *b, D *y) {
  const uint8_t *sc = b, *q = b + 16;
  float d = f16_at(b + 80), dmin = f16_at(b + 82);
  int is = 0;
  for (int half = 0; half < 2; half++, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int g = 0; g < 2; g++, is++) {
        float dl = mul(d, (float)(sc[is] & 15)), ml = mul(dmin, (float)(sc[is] >> 4));
        for (int l = 0; l < 16; l++) *y++ = ra_cuda_from_f32<D>(sub(mul(dl, (float)((q[g * 16 + l] >> shift) & 3)), ml));
      }
}
/* Q3_K: hmask[32] | qs[64] | scales[12] | d; 6-bit scales biased by 32, 2+1-bit values */
template <typename D> __device__ void dq_q3_k(const uint8_t *b, D *y) {
  const uint8_t *hm = b, *q = b + 32, *s = b + 96;
  float d = f16_at(b + 108);
  int is = 0;
  unsigned mbit = 1;
  for (int half = 0; half < 2; half++, q += 32)
    for (int shift = 0; shift < 8; shift += 2, mbit <<= 1)
      for (int g = 0; g < 2; g++, is++) {
        int lo = is < 8 ? (s[is] & 15) : (s[is - 8] >> 4);
        int hi = (s[8 + (is % 4)] >> (2 * (is / 4))) & 3;
        float dl = mul(d, (float)((lo | (hi << 4)) - 32));
        for (int l = 0; l < 16; l++) {
          int v = (q[g * 16 + l] >> shift) & 3;
          if (!(hm[g * 16 + l] & mbit)) v -= 4;
          *y++ = ra_cuda_from_f32<D>(mul(dl, (float)v));
        }
      }
}
/* 6-bit scale and min of sub-block j of Q4_K/Q5_K (12 packed bytes). */
__device__ __forceinline__ void kscale_min(int j, const uint8_t *s, int *sc, int *mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}
/* Q4_K: d | dmin | scales[12] | qs[128]; Q5_K inserts qh[32] before qs. x = d*sc*q - dmin*mn */
template <typename D> __device__ void dq_q45_k(const uint8_t *b, D *y, bool five) {
  float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t *s = b + 4, *qh = b + 16, *q = b + 16 + (five ? 32 : 0);
  for (int pass = 0; pass < 4; pass++, y += 64, q += 32) {
    int sc, mn;
    kscale_min(2 * pass, s, &sc, &mn);
    float d1 = mul(d, (float)sc), m1 = mul(dmin, (float)mn);
    kscale_min(2 * pass + 1, s, &sc, &mn);
    float d2 = mul(d, (float)sc), m2 = mul(dmin, (float)mn);
    for (int l = 0; l < 32; l++) {
      int v = q[l] & 15;
      if (five && ((qh[l] >> (2 * pass)) & 1)) v += 16;
      y[l] = ra_cuda_from_f32<D>(sub(mul(d1, (float)v), m1));
      int w = q[l] >> 4;
      if (five && ((qh[l] >> (2 * pass + 1)) & 1)) w += 16;
      y[32 + l] = ra_cuda_from_f32<D>(sub(mul(d2, (float)w), m2));
    }
  }
}
/* Q6_K: ql[128] | qh[64] | int8 scales[16] | d; x = d * scale * (q6 - 32) */
template <typename D> __device__ void dq_q6_k(const uint8_t *b, D *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  float d = f16_at(b + 208);
  for (int half = 0; half < 2; half++, y += 128, ql += 64, qh += 32, sc += 8)
    for (int l = 0; l < 32; l++) {
      int is = l / 16;
      int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = ra_cuda_from_f32<D>(mul(mul(d, (float)sc[is]), (float)q1));
      y[l + 32] = ra_cuda_from_f32<D>(mul(mul(d, (float)sc[is + 2]), (float)q2));
      y[l + 64] = ra_cuda_from_f32<D>(mul(mul(d, (float)sc[is + 4]), (float)q3));
      y[l + 96] = ra_cuda_from_f32<D>(mul(mul(d, (float)sc[is + 6]), (float)q4));
    }
}

template <typename D>
__global__ void dequant_kernel(const uint8_t *__restrict__ raw, uint32_t type, size_t n_blocks, size_t block_bytes,
                               size_t block_values, D *__restrict__ dst) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_blocks; i += (size_t)gridDim.x * blockDim.x) {
    const uint8_t *b = raw + i * block_bytes;
    D *y = dst + i * block_values;
    switch (type) {
      case GGML_Q4_0: dq_q4_0(b, y); break;
      case GGML_Q4_1: dq_q4_1(b, y); break;
      case GGML_Q5_0: dq_q5(b, y, false); break;
      case GGML_Q5_1: dq_q5(b, y, true); break;
      case GGML_Q8_0: dq_q8_0(b, y); break;
      case GGML_Q2_K: dq_q2_k(b, y); break;
      case GGML_Q3_K: dq_q3_k(b, y); break;
      case GGML_Q4_K: dq_q45_k(b, y, false); break;
      case GGML_Q5_K: dq_q45_k(b, y, true); break;
      default: dq_q6_k(b, y); break;
    }
  }
}

/* ---- layer ops ---- */

struct inline_ids {
  int32_t v[RA_CUDA_INLINE_IDS];
};

template <typename T>
__global__ void get_rows_kernel(const T *__restrict__ table, int64_t dim, const int32_t *__restrict__ ids,
                                inline_ids small, float *__restrict__ out) {
  ra_cuda_pdl_entry();
  const int32_t id = ids ? ids[blockIdx.x] : small.v[blockIdx.x];
  const T *src = table + (int64_t)id * dim;
  float *dst = out + (int64_t)blockIdx.x * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = ra_cuda_to_f32(src[j]);
}

template <typename T>
__global__ void set_rows_kernel(T *__restrict__ table, int64_t dim, const int32_t *__restrict__ ids, inline_ids small,
                                const float *__restrict__ src) {
  ra_cuda_pdl_entry();
  const int32_t id = ids ? ids[blockIdx.x] : small.v[blockIdx.x];
  T *dst = table + (int64_t)id * dim;
  const float *row = src + (int64_t)blockIdx.x * dim;
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = ra_cuda_from_f32<T>(row[j]);
}

__global__ void bias_rows_kernel(float *__restrict__ y, const void *__restrict__ bias, int bias_dtype, int64_t n,
                                 int64_t m, int accumulate) {
  size_t total = (size_t)n * (size_t)m;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    float b = ra_cuda_load(bias, bias_dtype, (int64_t)(i % (size_t)m));
    y[i] = accumulate ? y[i] + b : b;
  }
}

/* One block per row. The sum of squares is accumulated in double, as the CPU backend does, so
 * the scale factors agree to the last bit nearly always. */
template <typename Y>
__global__ void rmsnorm_kernel(const float *x, const void *__restrict__ w, int w_dtype, float eps, Y *y, int64_t d) {
  __shared__ double part[kThreads / 32];
  ra_cuda_pdl_entry();
  const float *xr = x + (int64_t)blockIdx.x * d;
  Y *yr = y + (int64_t)blockIdx.x * d;
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += (double)xr[j] * (double)xr[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
    part[0] = t;
  }
  __syncthreads();
  float inv = (float)(1.0 / sqrt(part[0] / (double)d + (double)eps));
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
    yr[j] = ra_cuda_from_f32<Y>(mul(mul(xr[j], inv), ra_cuda_load(w, w_dtype, j)));
}

/* Rotation of pair j of one head (x: its hd values) of a token at position pos: angle in double
 * like the CPU backend (at 128K positions a float angle loses the low bits). */
__device__ __forceinline__ void rope_pair(float *x, int64_t pos, int j, int n_rot, float theta, int neox) {
  const int half = n_rot / 2;
  double a = (double)pos * pow((double)theta, -2.0 * j / n_rot);
  float cs = (float)cos(a), sn = (float)sin(a);
  int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
  float p = x[i0], q = x[i1];
  x[i0] = sub(mul(p, cs), mul(q, sn));
  x[i1] = add(mul(p, sn), mul(q, cs));
}

/* One thread per (token, head, pair): a thread that looped over the heads of a token waited for
 * each head's load in turn (its stores may alias the next loads), ~40 L2 round trips in a
 * decode step's rope; this way every load of the step is in flight at once. */
__global__ void rope_kernel(float *x, int64_t n, int64_t heads, int64_t hd, int64_t pos0, int n_rot, float theta,
                            int neox) {
  const size_t half = (size_t)(n_rot / 2), per_token = (size_t)heads * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)n * per_token;
       i += (size_t)gridDim.x * blockDim.x) {
    const int64_t t = (int64_t)(i / per_token), h = (int64_t)(i % per_token / half);
    rope_pair(x + (t * heads + h) * hd, pos0 + t, (int)(i % half), n_rot, theta, neox);
  }
}

/* rope(q), rope(k), then k and v into cache rows [row, row + n). Index space 1: one thread per
 * (token, head of q then k, pair); a k thread also stores the pair it rotated. Index space 2:
 * one thread per element of the [n, hkv, hd] k/v block, storing v and the k dims past n_rot,
 * which nobody rotates. No barrier: every element is read and written by one thread only. The
 * grid-stride loop runs over blocks [blk, blk + n_blk) of x. */
template <typename C>
__device__ __forceinline__ void rope_store_rows(float *q, float *k, const float *v, int64_t n, int64_t hq, int64_t hkv,
                                                int64_t hd, int64_t pos0, int n_rot, float theta, int neox, C *kc, C *vc,
                                                int64_t row) {
  const int half = n_rot / 2;
  const size_t per_token = (size_t)(hq + hkv) * (size_t)half, n_rot_threads = (size_t)n * per_token;
  const size_t kv_row = (size_t)hkv * (size_t)hd, total = n_rot_threads + (size_t)n * kv_row;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    if (i < n_rot_threads) {
      const int64_t t = (int64_t)(i / per_token), h = (int64_t)(i % per_token / (size_t)half);
      const int j = (int)(i % (size_t)half);
      if (h < hq) {
        rope_pair(q + (t * hq + h) * hd, pos0 + t, j, n_rot, theta, neox);
        continue;
      }
      const int64_t off = t * (int64_t)kv_row + (h - hq) * hd;
      rope_pair(k + off, pos0 + t, j, n_rot, theta, neox);
      const int i0 = neox ? j : 2 * j, i1 = neox ? j + half : 2 * j + 1;
      C *dst = kc + row * (int64_t)kv_row + off;
      dst[i0] = ra_cuda_from_f32<C>(k[off + i0]);
      dst[i1] = ra_cuda_from_f32<C>(k[off + i1]);
    } else {
      const size_t e = i - n_rot_threads; /* element of the [n, hkv, hd] k/v block */
      const size_t d = e % (size_t)hd, off = (size_t)row * kv_row + e;
      vc[off] = ra_cuda_from_f32<C>(v[e]);
      if (d >= (size_t)n_rot) kc[off] = ra_cuda_from_f32<C>(k[e]);
    }
  }
}

template <typename C>
__global__ void rope_store_kernel(float *q, float *k, const float *v, int64_t n, int64_t hq, int64_t hkv, int64_t hd,
                                  int64_t pos0, int n_rot, float theta, int neox, C *kc, C *vc, int64_t row) {
  ra_cuda_pdl_entry();
  rope_store_rows<C>(q, k, v, n, hq, hkv, hd, pos0, n_rot, theta, neox, kc, vc, row);
}

/* blockIdx.y is the item: its rows of q, k, v into its caches */
template <typename C> __global__ void rope_store_batch_kernel(const __grid_constant__ ra_cuda_rope_batch b) {
  ra_cuda_pdl_entry();
  const ra_cuda_rope_item &it = b.it[blockIdx.y];
  rope_store_rows<C>(b.q + it.r0 * b.hq * b.hd, b.k + it.r0 * b.hkv * b.hd, b.v + it.r0 * b.hkv * b.hd, it.n, b.hq,
                     b.hkv, b.hd, it.pos, b.n_rot, b.theta, b.neox, (C *)it.kc, (C *)it.vc, it.row);
}

__global__ void swiglu_kernel(const float *gate, const float *up, float *out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    out[i] = mul(__fdiv_rn(g, add(1.0f, expf(-g))), up[i]);
  }
}

/* One block per head: (o_acc, m_acc, l_acc) <- merge with (o, m, l), the arithmetic of
 * ra_partial_merge (common/merge.c) step for step. */
__global__ void attn_merge_kernel(float *o_acc, float *ml_acc, const float *o, const float *ml, int64_t hd) {
  ra_cuda_pdl_entry();
  int64_t h = blockIdx.x;
  float m1 = ml_acc[2 * h], l1 = ml_acc[2 * h + 1], m2 = ml[2 * h], l2 = ml[2 * h + 1];
  if (!(l2 > 0.0f)) return; /* the empty partial is the identity */
  bool copy = !(l1 > 0.0f);
  float m = m1 > m2 ? m1 : m2;
  float w1 = copy ? 0.0f : mul(l1, expf(m1 - m)), w2 = copy ? 0.0f : mul(l2, expf(m2 - m));
  float inv = copy ? 0.0f : __fdiv_rn(1.0f, add(w1, w2));
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float *a = o_acc + h * hd + d;
    *a = copy ? o[h * hd + d] : mul(add(mul(w1, *a), mul(w2, o[h * hd + d])), inv);
  }
  __syncthreads(); /* every thread read m1/l1 before thread 0 overwrites them */
  if (threadIdx.x == 0) {
    ml_acc[2 * h] = copy ? m2 : m;
    ml_acc[2 * h + 1] = copy ? l2 : add(w1, w2);
  }
}

} /* namespace */

cudaError_t ra_cuda_convert(cudaStream_t s, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n) {
  if (n == 0) return cudaSuccess;
  switch (dst_dtype) {
    case RA_DTYPE_F32: return convert_to(s, (float *)dst, src, src_dtype, n);
    case RA_DTYPE_F16: return convert_to(s, (__half *)dst, src, src_dtype, n);
    default: return convert_to(s, (__nv_bfloat16 *)dst, src, src_dtype, n);
  }
}

cudaError_t ra_cuda_fill_random(cudaStream_t s, void *dst, int dtype, size_t n, uint64_t base, float center,
                                float scale) {
  if (n == 0) return cudaSuccess;
  switch (dtype) {
    case RA_DTYPE_F32: fill_random_kernel<<<grid_for(n), kThreads, 0, s>>>((float *)dst, n, base, center, scale); break;
    case RA_DTYPE_F16: fill_random_kernel<<<grid_for(n), kThreads, 0, s>>>((__half *)dst, n, base, center, scale); break;
    default: fill_random_kernel<<<grid_for(n), kThreads, 0, s>>>((__nv_bfloat16 *)dst, n, base, center, scale); break;
  }
  return cudaGetLastError();
}

int ra_cuda_ggml_supported(uint32_t type, size_t *block_values, size_t *block_bytes) {
  size_t v = 0, b = 0;
  switch (type) {
    case GGML_F32: v = 1; b = 4; break;
    case GGML_F16: v = 1; b = 2; break;
    case GGML_BF16: v = 1; b = 2; break;
    case GGML_Q4_0: v = 32; b = 18; break;
    case GGML_Q4_1: v = 32; b = 20; break;
    case GGML_Q5_0: v = 32; b = 22; break;
    case GGML_Q5_1: v = 32; b = 24; break;
    case GGML_Q8_0: v = 32; b = 34; break;
    case GGML_Q2_K: v = 256; b = 84; break;
    case GGML_Q3_K: v = 256; b = 110; break;
    case GGML_Q4_K: v = 256; b = 144; break;
    case GGML_Q5_K: v = 256; b = 176; break;
    case GGML_Q6_K: v = 256; b = 210; break;
    default: return 0;
  }
  if (block_values) *block_values = v;
  if (block_bytes) *block_bytes = b;
  return 1;
}

cudaError_t ra_cuda_dequant(cudaStream_t s, const void *raw, uint32_t type, int64_t rows, int64_t cols,
                            size_t row_bytes, void *dst, int dst_dtype) {
  size_t bv = 0, bb = 0, n = (size_t)rows * (size_t)cols;
  ra_cuda_ggml_supported(type, &bv, &bb);
  if (type == GGML_F32) return ra_cuda_convert(s, dst, dst_dtype, raw, RA_DTYPE_F32, n);
  if (type == GGML_F16) return ra_cuda_convert(s, dst, dst_dtype, raw, RA_DTYPE_F16, n);
  if (type == GGML_BF16) return ra_cuda_convert(s, dst, dst_dtype, raw, RA_DTYPE_BF16, n);
  (void)row_bytes; /* rows are packed: block i of the tensor starts at i * bb */
  size_t nb = n / bv;
  /* 64 threads per block: each thread writes 32-256 outputs, so fewer, fuller blocks */
  unsigned grid = (unsigned)((nb + 63) / 64 < 65535u * 8u ? (nb + 63) / 64 : 65535u * 8u);
  if (dst_dtype == RA_DTYPE_F32)
    dequant_kernel<<<grid ? grid : 1, 64, 0, s>>>((const uint8_t *)raw, type, nb, bb, bv, (float *)dst);
  else
    dequant_kernel<<<grid ? grid : 1, 64, 0, s>>>((const uint8_t *)raw, type, nb, bb, bv, (__nv_bfloat16 *)dst);
  return cudaGetLastError();
}

cudaError_t ra_cuda_get_rows(cudaStream_t s, const void *table, int table_dtype, int64_t dim, const int32_t *host_ids,
                             const int32_t *d_ids, int64_t n, float *out) {
  if (n == 0) return cudaSuccess;
  inline_ids small = {};
  const int32_t *ids = d_ids;
  if (n <= RA_CUDA_INLINE_IDS) {
    for (int64_t i = 0; i < n; i++) small.v[i] = host_ids[i];
    ids = nullptr;
  }
  switch (table_dtype) {
    case RA_DTYPE_F32:
      return ra_cuda_launch(get_rows_kernel<float>, (unsigned)n, kThreads, 0, s, (const float *)table, dim, ids, small, out);
    case RA_DTYPE_F16:
      return ra_cuda_launch(get_rows_kernel<__half>, (unsigned)n, kThreads, 0, s, (const __half *)table, dim, ids, small,
                            out);
    default:
      return ra_cuda_launch(get_rows_kernel<__nv_bfloat16>, (unsigned)n, kThreads, 0, s, (const __nv_bfloat16 *)table, dim,
                            ids, small, out);
  }
}

cudaError_t ra_cuda_set_rows(cudaStream_t s, void *table, int table_dtype, int64_t dim, const int32_t *host_ids,
                             const int32_t *d_ids, int64_t n, const float *src) {
  if (n == 0) return cudaSuccess;
  inline_ids small = {};
  const int32_t *ids = d_ids;
  if (n <= RA_CUDA_INLINE_IDS) {
    for (int64_t i = 0; i < n; i++) small.v[i] = host_ids[i];
    ids = nullptr;
  }
  switch (table_dtype) {
    case RA_DTYPE_F32:
      return ra_cuda_launch(set_rows_kernel<float>, (unsigned)n, kThreads, 0, s, (float *)table, dim, ids, small, src);
    case RA_DTYPE_F16:
      return ra_cuda_launch(set_rows_kernel<__half>, (unsigned)n, kThreads, 0, s, (__half *)table, dim, ids, small,
                            src);
    default:
      return ra_cuda_launch(set_rows_kernel<__nv_bfloat16>, (unsigned)n, kThreads, 0, s, (__nv_bfloat16 *)table, dim,
                            ids, small, src);
  }
}

cudaError_t ra_cuda_bias_rows(cudaStream_t s, float *y, const void *bias, int bias_dtype, int64_t n, int64_t m,
                              int accumulate) {
  bias_rows_kernel<<<grid_for((size_t)n * (size_t)m), kThreads, 0, s>>>(y, bias, bias_dtype, n, m, accumulate);
  return cudaGetLastError();
}

cudaError_t ra_cuda_rmsnorm(cudaStream_t s, const float *x, const void *w, int w_dtype, float eps, float *y, int64_t n,
                            int64_t d) {
  if (n == 0) return cudaSuccess;
  return ra_cuda_launch(rmsnorm_kernel<float>, (unsigned)n, kThreads, 0, s, x, w, w_dtype, eps, y, d);
}

cudaError_t ra_cuda_rmsnorm_to(cudaStream_t s, const float *x, const void *w, int w_dtype, float eps, void *y,
                               int y_dtype, int64_t n, int64_t d) {
  if (n == 0) return cudaSuccess;
  switch (y_dtype) {
    case RA_DTYPE_F32: return ra_cuda_rmsnorm(s, x, w, w_dtype, eps, (float *)y, n, d);
    case RA_DTYPE_F16:
      return ra_cuda_launch(rmsnorm_kernel<__half>, (unsigned)n, kThreads, 0, s, x, w, w_dtype, eps, (__half *)y, d);
    default:
      return ra_cuda_launch(rmsnorm_kernel<__nv_bfloat16>, (unsigned)n, kThreads, 0, s, x, w, w_dtype, eps,
                            (__nv_bfloat16 *)y, d);
  }
}

cudaError_t ra_cuda_rope(cudaStream_t s, float *x, int64_t n, int64_t heads, int64_t hd, int64_t pos0, int n_rot,
                         float theta, int neox) {
  size_t total = (size_t)n * (size_t)heads * (size_t)(n_rot / 2);
  if (total == 0) return cudaSuccess;
  rope_kernel<<<grid_for(total), kThreads, 0, s>>>(x, n, heads, hd, pos0, n_rot, theta, neox);
  return cudaGetLastError();
}

cudaError_t ra_cuda_rope_store(cudaStream_t s, float *q, float *k, const float *v, int64_t n, int64_t hq, int64_t hkv,
                               int64_t hd, int64_t pos0, int n_rot, float theta, int neox, void *kc, void *vc,
                               int cache_dtype, int64_t row) {
  size_t total = (size_t)n * (size_t)(hq + hkv) * (size_t)(n_rot / 2) + (size_t)n * (size_t)hkv * (size_t)hd;
  if (total == 0) return cudaSuccess;
  const unsigned grid = grid_for(total);
  switch (cache_dtype) {
    case RA_DTYPE_F32:
      return ra_cuda_launch(rope_store_kernel<float>, grid, kThreads, 0, s, q, k, v, n, hq, hkv, hd, pos0, n_rot, theta,
                            neox, (float *)kc, (float *)vc, row);
    case RA_DTYPE_F16:
      return ra_cuda_launch(rope_store_kernel<__half>, grid, kThreads, 0, s, q, k, v, n, hq, hkv, hd, pos0, n_rot, theta,
                            neox, (__half *)kc, (__half *)vc, row);
    default:
      return ra_cuda_launch(rope_store_kernel<__nv_bfloat16>, grid, kThreads, 0, s, q, k, v, n, hq, hkv, hd, pos0, n_rot,
                            theta, neox, (__nv_bfloat16 *)kc, (__nv_bfloat16 *)vc, row);
  }
}

cudaError_t ra_cuda_rope_store_batch(cudaStream_t s, const ra_cuda_rope_batch *b, int cache_dtype) {
  if (b->n < 1 || b->n > RA_CUDA_ROPE_BATCH) return cudaErrorInvalidValue;
  int64_t most = 0;
  for (int i = 0; i < b->n; i++) most = b->it[i].n > most ? b->it[i].n : most;
  const size_t total = (size_t)most * (size_t)(b->hq + b->hkv) * (size_t)(b->n_rot / 2) +
                       (size_t)most * (size_t)b->hkv * (size_t)b->hd;
  const dim3 grid(grid_for(total), (unsigned)b->n);
  switch (cache_dtype) {
    case RA_DTYPE_F32: return ra_cuda_launch(rope_store_batch_kernel<float>, grid, kThreads, 0, s, *b);
    case RA_DTYPE_F16: return ra_cuda_launch(rope_store_batch_kernel<__half>, grid, kThreads, 0, s, *b);
    default: return ra_cuda_launch(rope_store_batch_kernel<__nv_bfloat16>, grid, kThreads, 0, s, *b);
  }
}

cudaError_t ra_cuda_swiglu(cudaStream_t s, const float *gate, const float *up, float *out, size_t n) {
  if (n == 0) return cudaSuccess;
  swiglu_kernel<<<grid_for(n), kThreads, 0, s>>>(gate, up, out, n);
  return cudaGetLastError();
}

cudaError_t ra_cuda_attn_merge(cudaStream_t s, float *o_acc, float *ml_acc, const float *o, const float *ml,
                               int64_t heads, int64_t hd) {
  return ra_cuda_launch(attn_merge_kernel, (unsigned)heads, 128, 0, s, o_acc, ml_acc, o, ml, hd);
}
