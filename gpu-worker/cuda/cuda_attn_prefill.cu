/* Causal GQA prefill attention on tensor cores (FlashAttention-2 scheme), head dims 64 and 128.
 *
 * Block (query tile, kv head), 8 warps. The block's 128 rows are the group's G q heads of
 * P = 128 / G consecutive query positions (row r: position i0 + r / G, q head kvh * G + r % G),
 * so one K/V tile in shared memory serves every q head of the group and a short chunk still
 * fills the rows. Each warp owns 16 rows: its Q fragments stay in registers for the whole key
 * walk, and S = Q K^T (16 x 64 per tile), the online softmax (running max and sum per row) and
 * O += P V (16 x D, fp32) never leave registers; P is re-packed from S's accumulator layout as
 * the A operand of the second product. K/V tiles of 64 keys stream through two shared-memory
 * stages with cp.async (the next tile loads while this one is computed). The block walks keys
 * [0, pos0 + last position] only (causal tile skipping); the per-element mask is applied only
 * on the tiles that cross a row's position. Nothing of size n x n is stored.
 *
 * Operands: mma.sync m16n8k16 with fp32 accumulation, BF16 for a BF16 cache (Q and P rounded
 * to BF16), F16 for F16 and F32 caches (an F32 cache is converted while it is staged). */
#include "ra_cuda.cuh"

#include <math.h>

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = kWarps * 16; /* rows (query position x q head) per block */
constexpr int kBK = 64;            /* keys per tile */

/* Shared-memory row stride (elements): 16 bytes of padding put the 8 rows an ldmatrix reads in
 * 8 different bank groups. */
template <int D> __host__ __device__ constexpr int ld_smem() { return D + 8; }
template <int D> constexpr size_t smem_bytes() {
  return (size_t)(kRows + 4 * kBK) * ld_smem<D>() * 2; /* Q, then K and V of 2 stages */
}

template <typename MT> struct mma_traits;
template <> struct mma_traits<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *(uint32_t *)&h;
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct mma_traits<__half> {
  static __device__ __forceinline__ uint32_t pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
  }
  static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* 16 bytes global -> shared, zero-filled when !valid (keys past the block's last position). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* Stages keys [kb, kb + kBK) of kv head kvh (rows >= kv_len zero) into Ks, Vs: [kBK][LD] MT.
 * A cache of the operand type is copied asynchronously; an F32 cache is converted here. */
template <typename KT, typename MT, int D>
__device__ __forceinline__ void stage_tile(const KT *__restrict__ kc, const KT *__restrict__ vc, int64_t row_stride,
                                           int kvh, int64_t kb, int64_t kv_len, MT *Ks, MT *Vs, int tid) {
  constexpr int LD = ld_smem<D>(), VPR = D / 8; /* 16-byte vectors of MT per row */
#pragma unroll
  for (int i = 0; i < kBK * VPR / kThreads; i++) {
    const int e = tid + i * kThreads, t = e / VPR, c = (e % VPR) * 8;
    const int64_t key = kb + t;
    const bool valid = key < kv_len;
    const int64_t off = (valid ? key : 0) * row_stride + (int64_t)kvh * D + c;
    if constexpr (sizeof(KT) == sizeof(MT)) {
      cp_async16(smem_addr(Ks + t * LD + c), kc + off, valid);
      cp_async16(smem_addr(Vs + t * LD + c), vc + off, valid);
    } else {
      uint4 kp = make_uint4(0, 0, 0, 0), vp = kp;
      if (valid) {
        float f[8];
        ra_cuda_load8(kc + off, f);
        uint32_t *u = (uint32_t *)&kp;
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = mma_traits<MT>::pack(f[2 * j], f[2 * j + 1]);
        ra_cuda_load8(vc + off, f);
        u = (uint32_t *)&vp;
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = mma_traits<MT>::pack(f[2 * j], f[2 * j + 1]);
      }
      *(uint4 *)(Ks + t * LD + c) = kp;
      *(uint4 *)(Vs + t * LD + c) = vp;
    }
  }
}

/* q, out: [n, hq, D] F32; kc, vc: [n_ctx, hkv, D] of KT. Grid (ceil(n / (kRows / G)), hkv). */
template <typename KT, typename MT, int D>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_mma_kernel(const float *__restrict__ q, const KT *__restrict__ kc, const KT *__restrict__ vc,
                            int64_t n, int hq, int hkv, int64_t pos0, float scale_log2, float *__restrict__ out) {
  constexpr int LD = ld_smem<D>(), KS = D / 16, NB = kBK / 8, DB = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  MT *Qs = (MT *)smem_raw;   /* [kRows][LD] */
  MT *KVs = Qs + kRows * LD; /* stage s: K at KVs + 2 s kBK LD, V after it */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = hq / hkv, P = kRows / G, kvh = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * P; /* longest (last) tiles start first */
  const int64_t np = n - i0 < P ? n - i0 : P;                     /* positions in this block */
  const int64_t kv_len = pos0 + i0 + np;                          /* keys [0, kv_len) are visible to some row */
  const int64_t row_stride = (int64_t)hkv * D;
  const int n_tiles = (int)((kv_len + kBK - 1) / kBK);

  stage_tile<KT, MT, D>(kc, vc, row_stride, kvh, 0, kv_len, KVs, KVs + kBK * LD, tid);
  cp_async_commit();

  /* Q tile: row r is (position i0 + r / G, q head kvh * G + r % G); rows past the block's
   * positions are zero. The group's G heads of a position are adjacent in q: G * D floats. */
  for (int e = tid; e < kRows * D / 4; e += kThreads) {
    const int r = e / (D / 4), c = (e % (D / 4)) * 4, pl = r / G;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (pl < np) v = __ldg((const float4 *)(q + ((i0 + pl) * hq + (int64_t)kvh * G + r % G) * D + c));
    uint2 u;
    u.x = mma_traits<MT>::pack(v.x, v.y);
    u.y = mma_traits<MT>::pack(v.z, v.w);
    *(uint2 *)(Qs + r * LD + c) = u;
  }
  __syncthreads();

  /* This thread's rows: rl[0] = warp * 16 + lane / 4 and rl[1] = rl[0] + 8. A padding row takes
   * the block's last position (finite results, never written). */
  int64_t qpos[2];
  int rl[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    rl[h] = warp * 16 + (lane >> 2) + 8 * h;
    const int64_t pl = rl[h] / G;
    qpos[h] = pos0 + i0 + (pl < np ? pl : np - 1);
  }
  const int64_t first_masked = pos0 + i0 + 1; /* tiles ending at or before it need no mask */

  uint32_t qf[KS][4];
  {
    const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, c = (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm_x4(qf[kk], smem_addr(Qs + r * LD + kk * 16 + c));
  }

  float o[DB][4];
#pragma unroll
  for (int j = 0; j < DB; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* l: this thread's columns only */

  /* ldmatrix lane offsets. K (B of Q K^T, non-transposed): matrix mi = lane / 8 covers keys
   * (2 j + mi / 2) * 8 + lane % 8, dims kk * 16 + (mi % 2) * 8. V (B of P V, transposed):
   * keys t * 16 + (mi % 2) * 8 + lane % 8, dims (2 j + mi / 2) * 8. */
  const int mi = lane >> 3, r8 = lane & 7;
  const int k_off = ((mi >> 1) * 8 + r8) * LD + (mi & 1) * 8;
  const int v_off = ((mi & 1) * 8 + r8) * LD + (mi >> 1) * 8;

  for (int t = 0; t < n_tiles; t++) {
    const int64_t kb = (int64_t)t * kBK;
    if (t + 1 < n_tiles) {
      MT *ks = KVs + ((t + 1) & 1) * 2 * kBK * LD;
      stage_tile<KT, MT, D>(kc, vc, row_stride, kvh, kb + kBK, kv_len, ks, ks + kBK * LD, tid);
    }
    cp_async_commit();
    cp_async_wait1();
    __syncthreads();
    const MT *Ks = KVs + (t & 1) * 2 * kBK * LD, *Vs = Ks + kBK * LD;

    /* S[16 rows][kBK] = Q K^T */
    float s[NB][4];
#pragma unroll
    for (int j = 0; j < NB; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
#pragma unroll
      for (int j = 0; j < NB / 2; j++) {
        uint32_t b[4];
        ldsm_x4(b, smem_addr(Ks + j * 16 * LD + kk * 16 + k_off));
        mma_traits<MT>::mma(s[2 * j], qf[kk], b[0], b[1]);
        mma_traits<MT>::mma(s[2 * j + 1], qf[kk], b[2], b[3]);
      }
    }

    /* log2-domain scores; causal mask on the tiles that cross a row's position (and on the zero
     * rows past kv_len) */
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) s[j][e] *= scale_log2;
    if (kb + kBK > first_masked) {
#pragma unroll
      for (int j = 0; j < NB; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int64_t key = kb + j * 8 + (lane & 3) * 2 + (e & 1);
          if (key > qpos[e >> 1]) s[j][e] = -INFINITY;
        }
    }

    /* online softmax; a row's 4 threads (lane / 4 equal) reduce by shuffles */
    float alpha[2], mb[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mx = m[h];
#pragma unroll
      for (int j = 0; j < NB; j++) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mb[h] = mx == -INFINITY ? 0.0f : mx;
      alpha[h] = ex2(m[h] - mb[h]); /* m = -inf: 0 */
      m[h] = mx;
    }
    uint32_t pa[NB / 2][4]; /* P as the A operand: k16 block kt = n8 blocks 2 kt, 2 kt + 1 */
#pragma unroll
    for (int j = 0; j < NB; j++) {
      const float p0 = ex2(s[j][0] - mb[0]), p1 = ex2(s[j][1] - mb[0]);
      const float p2 = ex2(s[j][2] - mb[1]), p3 = ex2(s[j][3] - mb[1]);
      l[0] = (j == 0 ? l[0] * alpha[0] : l[0]) + p0 + p1;
      l[1] = (j == 0 ? l[1] * alpha[1] : l[1]) + p2 + p3;
      pa[j / 2][(j & 1) * 2] = mma_traits<MT>::pack(p0, p1);
      pa[j / 2][(j & 1) * 2 + 1] = mma_traits<MT>::pack(p2, p3);
    }
#pragma unroll
    for (int j = 0; j < DB; j++) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }

    /* O[16 rows][D] += P V */
#pragma unroll
    for (int kt = 0; kt < kBK / 16; kt++) {
#pragma unroll
      for (int j = 0; j < DB / 2; j++) {
        uint32_t b[4];
        ldsm_x4_t(b, smem_addr(Vs + kt * 16 * LD + j * 16 + v_off));
        mma_traits<MT>::mma(o[2 * j], pa[kt], b[0], b[1]);
        mma_traits<MT>::mma(o[2 * j + 1], pa[kt], b[2], b[3]);
      }
    }
    __syncthreads(); /* this stage is reloaded two tiles on */
  }

#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int pl = rl[h] / G;
    if (rl[h] >= P * G || pl >= np) continue;
    const float inv = 1.0f / l[h];
    float *orow = out + ((i0 + pl) * hq + (int64_t)kvh * G + rl[h] % G) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < DB; j++) *(float2 *)(orow + j * 8) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
  }
}

template <typename KT, typename MT, int D>
cudaError_t launch(cudaStream_t s, const float *q, const void *kc, const void *vc, int64_t n, int hq, int hkv,
                   int64_t pos0, float scale, float *out) {
  const int64_t P = kRows / (hq / hkv);
  dim3 grid((unsigned)((n + P - 1) / P), (unsigned)hkv);
  attn_prefill_mma_kernel<KT, MT, D><<<grid, kThreads, smem_bytes<D>(), s>>>(
      q, (const KT *)kc, (const KT *)vc, n, hq, hkv, pos0, scale * 1.4426950408889634f, out);
  return cudaGetLastError();
}

template <typename KT, typename MT, int D> cudaError_t set_smem() {
  return cudaFuncSetAttribute(attn_prefill_mma_kernel<KT, MT, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)smem_bytes<D>());
}

} /* namespace */

int ra_cuda_attn_prefill_mma_ok(int group, int hd) { return (hd == 64 || hd == 128) && group >= 1 && group <= kRows; }

cudaError_t ra_cuda_attn_prefill_init(void) {
  cudaError_t e;
  if ((e = set_smem<__nv_bfloat16, __nv_bfloat16, 64>()) != cudaSuccess) return e;
  if ((e = set_smem<__nv_bfloat16, __nv_bfloat16, 128>()) != cudaSuccess) return e;
  if ((e = set_smem<__half, __half, 64>()) != cudaSuccess) return e;
  if ((e = set_smem<__half, __half, 128>()) != cudaSuccess) return e;
  if ((e = set_smem<float, __half, 64>()) != cudaSuccess) return e;
  return set_smem<float, __half, 128>();
}

cudaError_t ra_cuda_attn_prefill_mma(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                     int64_t n, int hq, int hkv, int hd, int64_t pos0, float scale, float *out) {
  if (n == 0) return cudaSuccess;
  const bool d64 = hd == 64;
  switch (kv_dtype) {
    case RA_DTYPE_F32:
      return d64 ? launch<float, __half, 64>(s, q, kc, vc, n, hq, hkv, pos0, scale, out)
                 : launch<float, __half, 128>(s, q, kc, vc, n, hq, hkv, pos0, scale, out);
    case RA_DTYPE_F16:
      return d64 ? launch<__half, __half, 64>(s, q, kc, vc, n, hq, hkv, pos0, scale, out)
                 : launch<__half, __half, 128>(s, q, kc, vc, n, hq, hkv, pos0, scale, out);
    default:
      return d64 ? launch<__nv_bfloat16, __nv_bfloat16, 64>(s, q, kc, vc, n, hq, hkv, pos0, scale, out)
                 : launch<__nv_bfloat16, __nv_bfloat16, 128>(s, q, kc, vc, n, hq, hkv, pos0, scale, out);
  }
}
