/* Causal GQA prefill attention on tensor cores (FlashAttention-2 scheme), head dims 64 and 128.
 *
 * Block (query tile, kv head), 4 warps, 2 blocks per SM. The block's 128 rows are the group's G
 * q heads of P = 128 / G consecutive query positions (row r: position i0 + r / G, q head
 * kvh * G + r % G), so one K/V tile in shared memory serves every q head of the group and a short
 * chunk still fills the rows. Each warp owns 32 rows (two m16 tiles, so every K and V fragment
 * it reads from shared memory feeds two MMAs: shared-memory bandwidth is what bounds mma.sync
 * attention). S = Q K^T (32 x 64 per tile), the online softmax (running max and sum per row)
 * and O += P V (32 x D, fp32) never leave registers; P is re-packed from S's accumulator layout
 * as the A operand of the second product; Q fragments are re-read from shared memory (registers
 * hold O and S). K/V tiles of 64 keys stream through two shared-memory stages with cp.async (the
 * next tile loads while this one is computed; one barrier per tile). The block walks keys
 * [0, pos0 + last position] only (causal tile skipping); the tiles before the first row's
 * position run without the per-element mask. O is rescaled only when a row's max moved.
 * Nothing of size n x n is stored. Measured: bench/results/prefill-h200/README.md.
 *
 * Operands: mma.sync m16n8k16 with fp32 accumulation, BF16 for a BF16 cache (Q and P rounded
 * to BF16), F16 for F16 and F32 caches (an F32 cache is converted while it is staged). */
#include "cuda_mma.cuh"
#include "ra_cuda.cuh"

#include <math.h>

#include <type_traits>

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMT = 2;                   /* m16 tiles per warp: each K/V fragment read serves both */
constexpr int kRows = kWarps * 16 * kMT; /* rows (query position x q head) per block */
constexpr int kBK = 64;                  /* keys per tile */

/* Shared-memory row stride (elements): 16 bytes of padding put the 8 rows an ldmatrix reads in
 * 8 different bank groups. */
template <int D> __host__ __device__ constexpr int ld_smem() { return D + 8; }
template <int D> constexpr size_t smem_bytes() {
  return (size_t)(kRows + 4 * kBK) * ld_smem<D>() * 2; /* Q, then K and V of 2 stages */
}


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
__device__ __forceinline__ void cp_async_wait0() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* Stages keys [kb, kb + kBK) of one kv head (rows >= kv_len zero) into Ks, Vs: [kBK][LD] MT.
 * kh, vh point at the head's row 0 in the caches. Thread tid moves the 16-byte vector c of rows
 * tid / VPR + i * (kThreads / VPR). A cache of the operand type is copied asynchronously; an
 * F32 cache is converted here. */
template <typename KT, typename MT, int D>
__device__ __forceinline__ void stage_tile(const KT *__restrict__ kh, const KT *__restrict__ vh, int64_t row_stride,
                                           int kb, int kv_len, MT *Ks, MT *Vs, int tid) {
  constexpr int LD = ld_smem<D>(), VPR = D / 8, RSTEP = kThreads / VPR; /* 16-byte vectors per row */
  const int t0 = tid / VPR, c = (tid % VPR) * 8;
  const KT *kp = kh + (int64_t)(kb + t0) * row_stride + c, *vp = vh + (int64_t)(kb + t0) * row_stride + c;
  const uint32_t ks = smem_addr(Ks + t0 * LD + c), vs = smem_addr(Vs + t0 * LD + c);
#pragma unroll
  for (int i = 0; i < kBK / RSTEP; i++) {
    const bool valid = kb + t0 + i * RSTEP < kv_len;
    const int64_t off = valid ? (int64_t)i * RSTEP * row_stride : -(int64_t)(kb + t0) * row_stride;
    if constexpr (sizeof(KT) == sizeof(MT)) {
      cp_async16(ks + i * RSTEP * LD * 2, kp + off, valid);
      cp_async16(vs + i * RSTEP * LD * 2, vp + off, valid);
    } else {
      uint4 ku = make_uint4(0, 0, 0, 0), vu = ku;
      if (valid) {
        float f[8];
        ra_cuda_load8(kp + off, f);
        uint32_t *u = (uint32_t *)&ku;
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = ra_mma_traits<MT>::pack(f[2 * j], f[2 * j + 1]);
        ra_cuda_load8(vp + off, f);
        u = (uint32_t *)&vu;
#pragma unroll
        for (int j = 0; j < 4; j++) u[j] = ra_mma_traits<MT>::pack(f[2 * j], f[2 * j + 1]);
      }
      *(uint4 *)(Ks + (t0 + i * RSTEP) * LD + c) = ku;
      *(uint4 *)(Vs + (t0 + i * RSTEP) * LD + c) = vu;
    }
  }
}

/* q, out: [n, hq, D] F32; kc, vc: [n_ctx, hkv, D] of KT. Grid (ceil(n / (kRows / G)), hkv). */
template <typename KT, typename MT, int D>
__global__ void __launch_bounds__(kThreads, 2)
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
  const int kv_len = (int)(pos0 + i0 + np); /* keys [0, kv_len) are visible to some row (< 2^31: host) */
  const int64_t row_stride = (int64_t)hkv * D;
  const int n_tiles = (kv_len + kBK - 1) / kBK;
  const KT *kh = kc + (int64_t)kvh * D, *vh = vc + (int64_t)kvh * D;

  stage_tile<KT, MT, D>(kh, vh, row_stride, 0, kv_len, KVs, KVs + kBK * LD, tid);
  cp_async_commit();

  /* Q tile: row r is (position i0 + r / G, q head kvh * G + r % G); rows past the block's
   * positions are zero. The group's G heads of a position are adjacent in q: G * D floats. */
  for (int e = tid; e < kRows * D / 4; e += kThreads) {
    const int r = e / (D / 4), c = (e % (D / 4)) * 4, pl = r / G;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (pl < np) v = __ldg((const float4 *)(q + ((i0 + pl) * hq + (int64_t)kvh * G + r % G) * D + c));
    uint2 u;
    u.x = ra_mma_traits<MT>::pack(v.x, v.y);
    u.y = ra_mma_traits<MT>::pack(v.z, v.w);
    *(uint2 *)(Qs + r * LD + c) = u;
  }

  const int first_masked = (int)(pos0 + i0 + 1); /* tiles ending at or before it need no mask */
  const int n_plain = first_masked / kBK < n_tiles ? first_masked / kBK : n_tiles; /* tiles without a mask */

  float o[kMT][DB][4];
#pragma unroll
  for (int mt = 0; mt < kMT; mt++)
#pragma unroll
    for (int j = 0; j < DB; j++) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.0f;
  float m[kMT][2], l[kMT][2]; /* l: this thread's columns only */
#pragma unroll
  for (int mt = 0; mt < kMT; mt++) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  /* ldmatrix lane offsets. Q (A): matrix mi = lane / 8 covers rows (mi % 2) * 8 + lane % 8,
   * dims (mi / 2) * 8. K (B of Q K^T, non-transposed): keys (2 j + mi / 2) * 8 + lane % 8, dims
   * kk * 16 + (mi % 2) * 8. V (B of P V, transposed): keys t * 16 + (mi % 2) * 8 + lane % 8,
   * dims (2 j + mi / 2) * 8. */
  const int mi = lane >> 3, r8 = lane & 7;
  const int q_off = (warp * 16 * kMT + (mi & 1) * 8 + r8) * LD + (mi >> 1) * 8;
  const int k_off = ((mi >> 1) * 8 + r8) * LD + (mi & 1) * 8;
  const int v_off = ((mi & 1) * 8 + r8) * LD + (mi >> 1) * 8;

  /* one tile; Masked: apply the causal mask (the tiles that cross a row's position, and the zero
   * rows past kv_len) */
  auto tile = [&](const int t, auto masked_tag) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    const int kb = t * kBK;
    /* tile t has landed for every thread, and every thread is done with tile t - 1, whose
     * stage the next tile now loads into while this one is computed */
    cp_async_wait0();
    __syncthreads();
    if (t + 1 < n_tiles) {
      MT *ks = KVs + ((t + 1) & 1) * 2 * kBK * LD;
      stage_tile<KT, MT, D>(kh, vh, row_stride, kb + kBK, kv_len, ks, ks + kBK * LD, tid);
      cp_async_commit();
    }
    const MT *Ks = KVs + (t & 1) * 2 * kBK * LD, *Vs = Ks + kBK * LD;

    /* S[32 rows][kBK] = Q K^T: each K fragment serves both m-tiles */
    float s[kMT][NB][4];
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
      for (int j = 0; j < NB; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
      uint32_t qf[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; mt++) ldsm_x4(qf[mt], smem_addr(Qs + q_off + mt * 16 * LD + kk * 16));
#pragma unroll
      for (int j = 0; j < NB / 2; j++) {
        uint32_t b[4];
        ldsm_x4(b, smem_addr(Ks + j * 16 * LD + kk * 16 + k_off));
#pragma unroll
        for (int mt = 0; mt < kMT; mt++) ra_mma_traits<MT>::mma_n16(s[mt][2 * j], s[mt][2 * j + 1], qf[mt], b);
      }
    }

    /* log2-domain scores, masked */
    uint32_t pa[kMT][NB / 2][4]; /* P as the A operand: k16 block kt = n8 blocks 2 kt, 2 kt + 1 */
#pragma unroll
    for (int mt = 0; mt < kMT; mt++) {
#pragma unroll
      for (int j = 0; j < NB; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[mt][j][e] *= scale_log2;
      if constexpr (kMasked) {
        /* row (warp * 32 + mt * 16 + lane / 4 + 8 h) / G; a padding row takes the block's last
         * position (finite results, never written) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int pl = (warp * 16 * kMT + mt * 16 + (lane >> 2) + 8 * h) / G;
          const int qpos = (int)(pos0 + i0) + (pl < np ? pl : (int)np - 1);
#pragma unroll
          for (int j = 0; j < NB; j++)
#pragma unroll
            for (int e = 0; e < 2; e++)
              if (kb + j * 8 + (lane & 3) * 2 + e > qpos) s[mt][j][2 * h + e] = -INFINITY;
        }
      }
      /* online softmax; a row's 4 threads (lane / 4 equal) reduce by shuffles */
      float alpha[2], mb[2];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = m[mt][h];
#pragma unroll
        for (int j = 0; j < NB; j++) mx = fmaxf(mx, fmaxf(s[mt][j][2 * h], s[mt][j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mb[h] = mx == -INFINITY ? 0.0f : mx;
        alpha[h] = ex2(m[mt][h] - mb[h]); /* m = -inf: 0 */
        m[mt][h] = mx;
      }
      float ls[2] = {0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < NB; j++) {
        const float p0 = ex2(s[mt][j][0] - mb[0]), p1 = ex2(s[mt][j][1] - mb[0]);
        const float p2 = ex2(s[mt][j][2] - mb[1]), p3 = ex2(s[mt][j][3] - mb[1]);
        ls[0] += p0 + p1;
        ls[1] += p2 + p3;
        pa[mt][j / 2][(j & 1) * 2] = ra_mma_traits<MT>::pack(p0, p1);
        pa[mt][j / 2][(j & 1) * 2 + 1] = ra_mma_traits<MT>::pack(p2, p3);
      }
      l[mt][0] = l[mt][0] * alpha[0] + ls[0];
      l[mt][1] = l[mt][1] * alpha[1] + ls[1];
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
        for (int j = 0; j < DB; j++) {
          o[mt][j][0] *= alpha[0];
          o[mt][j][1] *= alpha[0];
          o[mt][j][2] *= alpha[1];
          o[mt][j][3] *= alpha[1];
        }
      }
    }

    /* O[32 rows][D] += P V: each V fragment serves both m-tiles */
#pragma unroll
    for (int kt = 0; kt < kBK / 16; kt++) {
#pragma unroll
      for (int j = 0; j < DB / 2; j++) {
        uint32_t b[4];
        ldsm_x4_t(b, smem_addr(Vs + kt * 16 * LD + j * 16 + v_off));
#pragma unroll
        for (int mt = 0; mt < kMT; mt++) ra_mma_traits<MT>::mma_n16(o[mt][2 * j], o[mt][2 * j + 1], pa[mt][kt], b);
      }
    }
  };
  for (int t = 0; t < n_plain; t++) tile(t, std::false_type());
  for (int t = n_plain; t < n_tiles; t++) tile(t, std::true_type());

#pragma unroll
  for (int mt = 0; mt < kMT; mt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float lt = l[mt][h];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int r = warp * 16 * kMT + mt * 16 + (lane >> 2) + 8 * h, pl = r / G;
      if (r >= P * G || pl >= np) continue;
      const float inv = 1.0f / lt;
      float *orow = out + ((i0 + pl) * hq + (int64_t)kvh * G + r % G) * D + (lane & 3) * 2;
#pragma unroll
      for (int j = 0; j < DB; j++)
        *(float2 *)(orow + j * 8) = make_float2(o[mt][j][2 * h] * inv, o[mt][j][2 * h + 1] * inv);
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

int ra_cuda_attn_prefill_mma_ok(int group, int hd, int64_t n_keys) {
  return (hd == 64 || hd == 128) && group >= 1 && group <= kRows && n_keys <= INT32_MAX;
}

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
