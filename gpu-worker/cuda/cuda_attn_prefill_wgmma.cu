/* Causal GQA prefill attention with Hopper warpgroup MMA (wgmma, sm_90a), head dims 64 and 128,
 * BF16 and F16 caches: the FlashAttention-3 scheme, simplified.
 *
 * Block (query tile, kv head) of 384 threads, one block per SM: two consumer warpgroups of 64 rows
 * each and a producer warpgroup, which gives its registers to the consumers (setmaxnreg: 24 and
 * 240 per thread). The block's 128 rows are those of the mma.sync kernel (cuda_attn_prefill.cu):
 * row r is (position i0 + r / G, q head kvh * G + r % G), so one K/V tile serves every q head of
 * the group. Keys stream in tiles of 128 through a 2-stage ring in shared memory: one producer
 * thread loads each K and V tile with the tensor copy engine (TMA, 128-byte swizzle, rows past
 * pos0 + n zero-filled) and signals an mbarrier per tile and operand; each consumer warp releases
 * a stage through an "empty" mbarrier once its MMAs have read it. Consumer warpgroup w, per key
 * tile t:
 *   S = Q K_t^T      wgmma m64n128k16, A (Q, BF16/F16) and B (K) both from shared memory;
 *   online softmax   on S's fp32 accumulators in registers (exp2, running max and sum per row,
 *                    the causal mask only on tiles that cross a row's position);
 *   O += P_t V_t     wgmma m64nDk16, A = P from registers (S's accumulator layout is that of an
 *                    A fragment once packed to 16-bit pairs), B = V from shared memory, N-major.
 * The two warpgroups take turns issuing their MMAs (a named-barrier ping-pong): one issues
 * "O += P_{t-1} V_{t-1}; S = Q K_t^T" while the other runs its softmax, so the tensor cores
 * and the exp2 units overlap. Nothing of size n x n is stored; O / l goes out in fp32.
 *
 * Shared memory (D = 128): Q 2 x 16 KB, K 2 stages x 32 KB, V 2 x 32 KB, 160 KB in all. Every
 * operand tile is made of 64-element (128-byte) column slabs, [rows][128 B] each, swizzled in
 * 8-row x 128-byte atoms (16-byte chunk c of row r stored at chunk c ^ (r % 8)): the layout the
 * TMA's SWIZZLE_128B writes and wgmma's 128-byte-swizzle descriptors read. Q is converted from
 * fp32 and written into that layout by the consumers themselves.
 * Measured on the H200 (attn-prefill-bench, Llama-3-8B geometry, BF16 KV, 128K): 574-584 TFLOP/s
 * against the mma.sync kernel's 346-356. A third stage measured no faster. */
#include "ra_cuda.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <math.h>

#include <atomic>
#include <type_traits>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "cuda_attn_prefill_wgmma.cu holds sm_90a code (wgmma) and must be built for sm_90a only (CMakeLists.txt)"
#endif

namespace {

constexpr int kConsumers = 2;                    /* warpgroups of 64 rows */
constexpr int kRows = 64 * kConsumers;           /* rows (query position x q head) per block */
constexpr int kThreads = (kConsumers + 1) * 128; /* + the producer warpgroup (one thread of it works) */
constexpr int kBK = 128;                         /* keys per tile */
constexpr int kStages = 2;
constexpr int kSlabBytes = kBK * 128;            /* one 64-column slab of a K or V tile */
/* Registers per thread after setmaxnreg: 128 x 24 + 256 x 240 <= 64K, the register file */
constexpr int kProducerRegs = 24, kConsumerRegs = 240;

/* Named barriers: 0 is __syncthreads; kTurn + w is warpgroup w's turn to issue MMAs; kQReady + w
 * its Q tile. */
constexpr int kTurn = 1, kQReady = 3;

/* Byte offsets in the (1024-aligned) dynamic shared memory. */
template <int D> struct layout {
  static constexpr int kQBytes = 64 * D * 2;   /* one warpgroup's Q: D / 64 slabs of [64][128 B] */
  static constexpr int kTileBytes = kBK * D * 2; /* one K or V tile: D / 64 slabs of [kBK][128 B] */
  static constexpr int kQ = 0;
  static constexpr int kK = kQ + kConsumers * kQBytes;
  static constexpr int kV = kK + kStages * kTileBytes;
  static constexpr int kBar = kV + kStages * kTileBytes; /* mbarriers: K full, V full, K empty, V empty */
  static constexpr size_t kAlloc = (size_t)kBar + 4 * kStages * 8 + 1024; /* + rounding the base up */
};

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- mbarriers, TMA, named barriers, proxy fence ---- */

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
/* Arrives once and expects `bytes` more from the copy engine before the phase completes. */
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* Returns once the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
/* Box {64 elements, 1 head, kBK rows} at (c0, c1, c2) of a 3-d tensor map into shared memory at
 * dst, completing `bar`'s transaction bytes. */
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
/* Orders this thread's ordinary shared-memory stores before later reads by wgmma (async proxy). */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* ---- wgmma ---- */

/* Matrix descriptor of a 128-byte-swizzled operand at shared address addr (PTX ISA, "Matrix
 * Descriptor Format"): bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4,
 * 32-45 stride-dimension byte offset >> 4, 49-51 base offset (0: atoms start 1024-aligned),
 * 62-63 swizzle mode (1 = 128B). */
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(sbo >> 4) << 32 | 1ull << 62;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

/* Keeps the compiler from moving accesses of registers an in-flight wgmma owns across the
 * fence/commit/wait (the same device as CUTLASS's warpgroup_fence_operand). */
template <int N> __device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}

#define RA_ACC8(d, i) \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define RA_ACC32(d) RA_ACC8(d, 0), RA_ACC8(d, 8), RA_ACC8(d, 16), RA_ACC8(d, 24)
#define RA_ACC64(d) RA_ACC32(d), RA_ACC8(d, 32), RA_ACC8(d, 40), RA_ACC8(d, 48), RA_ACC8(d, 56)
#define RA_REGS32                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define RA_REGS64                                                                                                    \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "  \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d[64 x 128] (= or +=) A[64 x 16] B[16 x 128]: A and B K-major in shared memory (tnspA = tnspB
 * = 0); d is zeroed first when !accumulate. Accumulator layout (PTX ISA, "Matrix Fragments for
 * wgmma.m64nNk16", and CUTLASS's SM90 GMMA C layout): warp w of the warpgroup, lane l, holds
 * d[4 j + 2 h + e] = D[16 w + l / 4 + 8 h][8 j + 2 (l % 4) + e]. */
#define RA_WGMMA_SS_N128(T)                                                                           \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"                                         \
               " wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " RA_REGS64                 \
               ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                                      \
               : RA_ACC64(d)                                                                          \
               : "l"(a), "l"(b), "r"(accumulate))
/* d[64 x N] += A[64 x 16] B[16 x N]: A from registers (a[0..3], each two 16-bit values: per
 * warp the A fragment of mma.m16n8k16, rows 16 w + l / 4 (+ 8 for a[1], a[3]), k 2 (l % 4) (+ 8
 * for a[2], a[3])), B N-major in shared memory (imm-trans-b = 1). */
#define RA_WGMMA_RS_N128(T)                                                                                 \
  asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." T "." T " " RA_REGS64                        \
               ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"                                                 \
               : RA_ACC64(d)                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
#define RA_WGMMA_RS_N64(T)                                                                                  \
  asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " " RA_REGS32                         \
               ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"                                                 \
               : RA_ACC32(d)                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))

template <typename T> __device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (std::is_same<T, __half>::value)
    RA_WGMMA_SS_N128("f16");
  else
    RA_WGMMA_SS_N128("bf16");
}
/* O += P V for D = 128 (d[64]) and D = 64 (d[32]) */
template <typename T> __device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (std::is_same<T, __half>::value)
    RA_WGMMA_RS_N128("f16");
  else
    RA_WGMMA_RS_N128("bf16");
}
template <typename T> __device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  if constexpr (std::is_same<T, __half>::value)
    RA_WGMMA_RS_N64("f16");
  else
    RA_WGMMA_RS_N64("bf16");
}
#undef RA_WGMMA_SS_N128
#undef RA_WGMMA_RS_N128
#undef RA_WGMMA_RS_N64
#undef RA_ACC8
#undef RA_ACC32
#undef RA_ACC64
#undef RA_REGS32
#undef RA_REGS64

template <typename T> __device__ __forceinline__ uint32_t pack2(float x, float y) {
  if constexpr (std::is_same<T, __half>::value) {
    __half2 h = __floats2half2_rn(x, y);
    return *(uint32_t *)&h;
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *(uint32_t *)&h;
  }
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* q, out: [n, hq, D] F32; the tensor maps describe kc, vc: [pos0 + n, hkv, D] of T (rows past
 * them read as zeros). Grid (ceil(n / (kRows / G)), hkv). */
template <typename T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    attn_prefill_wgmma_kernel(const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                              const float *__restrict__ q, int64_t n, int hq, int hkv, int64_t pos0, float scale_log2,
                              float *__restrict__ out) {
  using L = layout<D>;
  constexpr int kSlabs = D / 64, DB = D / 8;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char *smem = smem_raw + (base - raw);
  const uint32_t bars = base + L::kBar;
  const auto k_full = [&](int s) { return bars + 8 * s; };
  const auto v_full = [&](int s) { return bars + 8 * (kStages + s); };
  const auto k_empty = [&](int s) { return bars + 8 * (2 * kStages + s); };
  const auto v_empty = [&](int s) { return bars + 8 * (3 * kStages + s); };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = hq / hkv, P = kRows / G, kvh = blockIdx.y;
  const int64_t i0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * P; /* longest (last) tiles start first */
  const int np = (int)(n - i0 < P ? n - i0 : P);                  /* positions in this block */
  const int kv_len = (int)(pos0 + i0 + np); /* keys [0, kv_len) are visible to some row (< 2^31: host) */
  const int n_tiles = (kv_len + kBK - 1) / kBK;

  if (tid == 0) {
    for (int s = 0; s < kStages; s++) {
      mbar_init(k_full(s), 1); /* the producer's arrive + the tile's bytes */
      mbar_init(v_full(s), 1);
      mbar_init(k_empty(s), kConsumers * 4); /* one arrive per consumer warp */
      mbar_init(v_empty(s), kConsumers * 4);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (warp >= kConsumers * 4) {
    /* The producer warpgroup hands its registers to the consumers (setmaxnreg works per
     * warpgroup: a block of 384 threads starts at 168 registers each).
     * Producer: tile t goes to stage t % kStages once both warpgroups released tile t - kStages
     * (K after its S = Q K^T, V after its P V). */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumers * 4 && lane == 0) {
      for (int t = 0; t < n_tiles; t++) {
        const int s = t % kStages, k = t / kStages;
        if (k > 0) mbar_wait(k_empty(s), (k - 1) & 1);
        mbar_arrive_tx(k_full(s), L::kTileBytes);
#pragma unroll
        for (int c = 0; c < kSlabs; c++)
          tma_load_3d(base + L::kK + s * L::kTileBytes + c * kSlabBytes, &tm_k, 64 * c, kvh, t * kBK, k_full(s));
        if (k > 0) mbar_wait(v_empty(s), (k - 1) & 1);
        mbar_arrive_tx(v_full(s), L::kTileBytes);
#pragma unroll
        for (int c = 0; c < kSlabs; c++)
          tma_load_3d(base + L::kV + s * L::kTileBytes + c * kSlabBytes, &tm_v, 64 * c, kvh, t * kBK, v_full(s));
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int wg = warp >> 2, wl = warp & 3, wtid = tid & 127;
  const uint32_t q_smem = base + L::kQ + wg * L::kQBytes;

  /* Q rows 64 wg .. 64 wg + 63 of the block, rounded to T, into the swizzled K-major layout:
   * 16-byte chunk c8 (elements 8 c8 .. 8 c8 + 7) of row rl lands in slab c8 / 8, chunk
   * (c8 % 8) ^ (rl % 8). Rows past the block's positions are zero. The group's G heads of a
   * position are adjacent in q. */
  for (int e = wtid; e < 64 * DB; e += 128) {
    const int rl = e / DB, c8 = e % DB, r = 64 * wg + rl, pl = r / G;
    float4 v0 = make_float4(0.f, 0.f, 0.f, 0.f), v1 = v0;
    if (pl < np) {
      const float4 *src = (const float4 *)(q + ((i0 + pl) * hq + (int64_t)kvh * G + r % G) * D + c8 * 8);
      v0 = __ldg(src);
      v1 = __ldg(src + 1);
    }
    const uint4 u = make_uint4(pack2<T>(v0.x, v0.y), pack2<T>(v0.z, v0.w), pack2<T>(v1.x, v1.y), pack2<T>(v1.z, v1.w));
    *(uint4 *)(smem + L::kQ + wg * L::kQBytes + (c8 >> 3) * (64 * 128) + rl * 128 + (((c8 & 7) ^ (rl & 7)) << 4)) = u;
  }
  fence_proxy_async();
  bar_sync(kQReady + wg, 128);

  /* This thread's two rows (h = 0, 1): block row 64 wg + 16 wl + l / 4 + 8 h. A padding row
   * (past the block's positions) takes the block's last position: finite, never written. */
  int qpos[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int pl = (64 * wg + 16 * wl + (lane >> 2) + 8 * h) / G;
    qpos[h] = (int)(pos0 + i0) + (pl < np ? pl : np - 1);
  }
  /* tiles wholly at or before this warpgroup's first position need no mask */
  const int first_pl = (64 * wg) / G < np ? (64 * wg) / G : np - 1;
  const int n_plain_raw = ((int)(pos0 + i0) + first_pl + 1) / kBK;
  const int n_plain = n_plain_raw < n_tiles ? n_plain_raw : n_tiles;

  /* Descriptors. Q (A, K-major) and K (B of Q K^T, K-major): rows of 128 B, 8-row groups 1024 B
   * apart (stride byte offset); the leading byte offset is unused for swizzled K-major layouts
   * (set to 16, i.e. 1). k-step kk (16 elements) starts in slab kk / 4 at byte 32 (kk % 4) of
   * the row: inside a 128-byte swizzle atom the start address moves by 32 B per k-step.
   * V (B of P V, N-major, tnspB = 1): rows are keys (the K dimension of P V) of 128 B; 8-key
   * groups 1024 B apart (stride byte offset); the next 64 columns of D are the next slab,
   * kSlabBytes on (leading byte offset); k-step kt (16 keys) starts 2048 B further. */
  const uint64_t dq = desc_sw128(q_smem, 16, 1024);
  const uint64_t dk = desc_sw128(base + L::kK, 16, 1024);
  const uint64_t dv = desc_sw128(base + L::kV, kSlabBytes, 1024);

  float o[D / 2], s[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  uint32_t pa[kBK / 16][4]; /* P as A fragments: k-step kt = S's 8-column blocks 2 kt, 2 kt + 1 */
#pragma unroll
  for (int i = 0; i < D / 2; i++) o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; i++) s[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < kBK / 16; i++) pa[i][0] = pa[i][1] = pa[i][2] = pa[i][3] = 0u;

  /* The online softmax of tile t (S in s): P into pa, O rescaled, m and l updated. Masked: the
   * tiles that cross a row's position (and hold the zero rows past kv_len). */
  auto softmax = [&](const int t, auto masked_tag) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    if constexpr (kMasked) {
      const int kc = t * kBK + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < kBK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
          if (kc + 8 * j + (e & 1) > qpos[e >> 1]) s[4 * j + e] = -INFINITY;
    }
    /* a row's 4 threads (lane / 4 equal) reduce by shuffles */
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int j = 0; j < kBK / 8; j++) {
      mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    float mb[2], alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      mb[h] = mx[h] == -INFINITY ? 0.0f : mx[h] * scale_log2; /* log2-domain max */
      alpha[h] = ex2(m[h] * scale_log2 - mb[h]);                /* m = -inf: 0 */
      m[h] = mx[h];
    }
    float ls[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < kBK / 8; j++) {
      const float p0 = ex2(fmaf(s[4 * j], scale_log2, -mb[0])), p1 = ex2(fmaf(s[4 * j + 1], scale_log2, -mb[0]));
      const float p2 = ex2(fmaf(s[4 * j + 2], scale_log2, -mb[1])), p3 = ex2(fmaf(s[4 * j + 3], scale_log2, -mb[1]));
      ls[0] += p0 + p1;
      ls[1] += p2 + p3;
      pa[j / 2][(j & 1) * 2] = pack2<T>(p0, p1);     /* row l / 4:     a0 (even j), a2 (odd j) */
      pa[j / 2][(j & 1) * 2 + 1] = pack2<T>(p2, p3); /* row l / 4 + 8: a1, a3 */
    }
    l[0] = l[0] * alpha[0] + ls[0];
    l[1] = l[1] * alpha[1] + ls[1];
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < D / 8; j++) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    }
  };

  /* Step t issues O += P_{t-1} V_{t-1} (t > 0) and S = Q K_t^T (t < n_tiles) as one group, in
   * this warpgroup's turn at the tensor cores; the turn passes to the other warpgroup right after,
   * and the softmax of S runs while the other warpgroup's group computes. Warpgroup 1 gives
   * warpgroup 0 the first turn and takes its own last without passing it on (each bar.sync
   * meets exactly one bar.arrive). The first and last steps are separate instances so that no wgmma sits under a
   * branch. */
  auto step = [&](const int t, auto pv_tag, auto s_tag) {
    constexpr bool kPV = decltype(pv_tag)::value, kS = decltype(s_tag)::value;
    const int ss = t % kStages, sv = (t + kStages - 1) % kStages;
    if constexpr (kS) mbar_wait(k_full(ss), (t / kStages) & 1);
    if constexpr (kPV) mbar_wait(v_full(sv), ((t - 1) / kStages) & 1);
    bar_sync(kTurn + wg, 256);
    reg_fence(o);
    reg_fence(s);
    reg_fence(pa);
    wgmma_fence();
    if constexpr (kPV) {
      const uint64_t dvs = dv + (uint64_t)((sv * L::kTileBytes) >> 4);
#pragma unroll
      for (int kt = 0; kt < kBK / 16; kt++) wgmma_rs<T>(o, pa[kt], dvs + (uint64_t)((kt * 16 * 128) >> 4));
    }
    if constexpr (kS) {
      const uint64_t dks = dk + (uint64_t)((ss * L::kTileBytes) >> 4);
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++)
        wgmma_ss_n128<T>(s, dq + (uint64_t)(((kk >> 2) * 64 * 128 + (kk & 3) * 32) >> 4),
                         dks + (uint64_t)(((kk >> 2) * kSlabBytes + (kk & 3) * 32) >> 4), kk > 0);
    }
    wgmma_commit();
    if (kS || wg == 0) bar_arrive(kTurn + (wg ^ 1), 256);
    wgmma_wait_all();
    reg_fence(o);
    reg_fence(s);
    reg_fence(pa);
    /* this warp's reads of the stages are done */
    __syncwarp();
    if (lane == 0) {
      if constexpr (kS) mbar_arrive(k_empty(ss));
      if constexpr (kPV) mbar_arrive(v_empty(sv));
    }
    if constexpr (kS) {
      if (t < n_plain)
        softmax(t, std::false_type());
      else
        softmax(t, std::true_type());
    }
  };
  if (wg == 1) bar_arrive(kTurn, 256);
  step(0, std::false_type(), std::true_type());
  for (int t = 1; t < n_tiles; t++) step(t, std::true_type(), std::true_type());
  step(n_tiles, std::true_type(), std::false_type());

  /* O / l, fp32, to the rows' (position, head) */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    float lt = l[h];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int r = 64 * wg + 16 * wl + (lane >> 2) + 8 * h, pl = r / G;
    if (r >= P * G || pl >= np) continue;
    const float inv = 1.0f / lt;
    float *orow = out + ((i0 + pl) * hq + (int64_t)kvh * G + r % G) * D + (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < D / 8; j++)
      *(float2 *)(orow + j * 8) = make_float2(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
  }
}

/* cuTensorMapEncodeTiled through the runtime (no link against the driver library); set once by
 * init. Devices (ordinals below kMaxDevices) whose init found sm_90 and set the kernels'
 * shared-memory limits. */
std::atomic<PFN_cuTensorMapEncodeTiled_v12000> g_encode{nullptr};
constexpr int kMaxDevices = 64;
std::atomic<bool> g_ready[kMaxDevices];

/* The rows [0, rows) of one cache [rows, hkv, D] of T, boxes of {64 dims, 1 head, kBK rows},
 * 128-byte swizzle, out-of-range rows read as zeros. */
template <typename T, int D> cudaError_t encode(CUtensorMap *map, const void *cache, int64_t rows, int hkv) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = g_encode.load();
  if (!fn) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)hkv, (cuuint64_t)rows};
  const cuuint64_t strides[2] = {(cuuint64_t)D * sizeof(T), (cuuint64_t)hkv * D * sizeof(T)};
  const cuuint32_t box[3] = {64, 1, kBK}, elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dt =
      std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const CUresult r = fn(map, dt, 3, const_cast<void *>(cache), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int D>
cudaError_t launch(cudaStream_t s, const float *q, const void *kc, const void *vc, int64_t n, int hq, int hkv,
                   int64_t pos0, float scale, float *out) {
  CUtensorMap tk, tv;
  cudaError_t e;
  if ((e = encode<T, D>(&tk, kc, pos0 + n, hkv)) != cudaSuccess) return e;
  if ((e = encode<T, D>(&tv, vc, pos0 + n, hkv)) != cudaSuccess) return e;
  const int64_t P = kRows / (hq / hkv);
  dim3 grid((unsigned)((n + P - 1) / P), (unsigned)hkv);
  attn_prefill_wgmma_kernel<T, D><<<grid, kThreads, layout<D>::kAlloc, s>>>(tk, tv, q, n, hq, hkv, pos0,
                                                                           scale * 1.4426950408889634f, out);
  return cudaGetLastError();
}

template <typename T, int D> cudaError_t set_smem() {
  return cudaFuncSetAttribute(attn_prefill_wgmma_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)layout<D>::kAlloc);
}

} /* namespace */

int ra_cuda_attn_prefill_wgmma_ok(int group, int hd, int kv_dtype, int64_t n_keys) {
  return (hd == 64 || hd == 128) && (kv_dtype == RA_DTYPE_BF16 || kv_dtype == RA_DTYPE_F16) && group >= 1 &&
         group <= kRows && n_keys <= INT32_MAX;
}

cudaError_t ra_cuda_attn_prefill_wgmma_init(void) {
  int dev = 0, major = 0, minor = 0;
  cudaError_t e;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess) return e;
  /* sm_90a code runs on compute capability 9.0 only; other devices keep the mma.sync kernel */
  if (major != 9 || minor != 0 || dev >= kMaxDevices) return cudaSuccess;
  if (!g_encode.load()) {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult qr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qr) !=
            cudaSuccess ||
        qr != cudaDriverEntryPointSuccess || !fn)
      return cudaSuccess; /* no tensor maps from this driver: the mma.sync kernel */
    g_encode.store((PFN_cuTensorMapEncodeTiled_v12000)fn);
  }
  if ((e = set_smem<__nv_bfloat16, 64>()) != cudaSuccess) return e;
  if ((e = set_smem<__nv_bfloat16, 128>()) != cudaSuccess) return e;
  if ((e = set_smem<__half, 64>()) != cudaSuccess) return e;
  if ((e = set_smem<__half, 128>()) != cudaSuccess) return e;
  g_ready[dev].store(true);
  return cudaSuccess;
}

int ra_cuda_attn_prefill_wgmma_ready(void) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) return 0;
  return g_ready[dev].load();
}

cudaError_t ra_cuda_attn_prefill_wgmma(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                       int64_t n, int hq, int hkv, int hd, int64_t pos0, float scale, float *out) {
  if (n == 0) return cudaSuccess;
  if (!ra_cuda_attn_prefill_wgmma_ready() || !ra_cuda_attn_prefill_wgmma_ok(hq / hkv, hd, kv_dtype, pos0 + n))
    return cudaErrorNotSupported;
  const bool d64 = hd == 64;
  if (kv_dtype == RA_DTYPE_F16)
    return d64 ? launch<__half, 64>(s, q, kc, vc, n, hq, hkv, pos0, scale, out)
               : launch<__half, 128>(s, q, kc, vc, n, hq, hkv, pos0, scale, out);
  return d64 ? launch<__nv_bfloat16, 64>(s, q, kc, vc, n, hq, hkv, pos0, scale, out)
             : launch<__nv_bfloat16, 128>(s, q, kc, vc, n, hq, hkv, pos0, scale, out);
}
