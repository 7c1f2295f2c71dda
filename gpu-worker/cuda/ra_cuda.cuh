/* Internal to the CUDA backend (CUDA C++ only): the backend context and the kernel launchers.
 * Launchers enqueue on the given stream and return cudaGetLastError(), so a bad launch
 * configuration is reported by the op that caused it; backend_cuda.cu turns it into RA_E*. */
#ifndef RA_CUDA_CUH
#define RA_CUDA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
#include "backend_cuda.h"
}

/* ---- programmatic dependent launch (PDL, sm_90+) ----
 * A decode step is ~200 short kernels. Launched the plain way, each waits for the one before it
 * to retire before it is even scheduled: the GPU idles ~1.5 us per kernel (measured on the
 * H200), ~0.3 ms a step, plus each kernel's ramp-up. ra_cuda_launch lets a kernel be scheduled
 * while the previous one in the stream finishes. Such a kernel must start with
 * ra_cuda_pdl_wait() before it touches any memory another kernel writes or reads (the wait
 * returns when the previous kernel has completed and its writes are visible), and should then
 * call ra_cuda_pdl_trigger() so that the next kernel can be scheduled in turn. Both are no-ops
 * in a kernel launched without the attribute. The setting is process-wide: on at backend
 * creation for sm_90+ devices, and switchable (ra_backend_cuda_set_pdl) for measurements. */
#include <utility>

__device__ __forceinline__ void ra_cuda_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void ra_cuda_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* Both, for kernels that have nothing to do before the wait. */
__device__ __forceinline__ void ra_cuda_pdl_entry() {
  ra_cuda_pdl_wait();
  ra_cuda_pdl_trigger();
}

void ra_cuda_set_pdl(bool on);
bool ra_cuda_pdl_enabled(void);

/* kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent launch when enabled. */
template <typename... KArgs, typename... Args>
cudaError_t ra_cuda_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                           Args &&...args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = ra_cuda_pdl_enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
}

/* ---- device element access (dtype-generic loads/stores through float) ---- */

__device__ __forceinline__ float ra_cuda_to_f32(float v) { return v; }
__device__ __forceinline__ float ra_cuda_to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ra_cuda_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T ra_cuda_from_f32(float v);
template <> __device__ __forceinline__ float ra_cuda_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half ra_cuda_from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 ra_cuda_from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/* Element i of a buffer of run-time dtype (small vectors: norm weights, biases). */
__device__ __forceinline__ float ra_cuda_load(const void *p, int dtype, int64_t i) {
  if (dtype == RA_DTYPE_F32) return ((const float *)p)[i];
  if (dtype == RA_DTYPE_F16) return __half2float(((const __half *)p)[i]);
  return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

/* 8 values from 16 bytes of BF16/F16 already in registers (the type argument only selects). */
__device__ __forceinline__ void ra_cuda_cvt8(const uint4 &u, float out[8], const __nv_bfloat16 *) {
  const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void ra_cuda_cvt8(const uint4 &u, float out[8], const __half *) {
  const __half2 *h = (const __half2 *)&u;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    float2 f = __half22float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/* 8 consecutive elements (16 bytes of BF16/F16, 32 of F32) starting at an 8-aligned index. */
__device__ __forceinline__ void ra_cuda_load8(const __nv_bfloat16 *p, float out[8]) {
  ra_cuda_cvt8(__ldg((const uint4 *)p), out, p);
}
__device__ __forceinline__ void ra_cuda_load8(const __half *p, float out[8]) { ra_cuda_cvt8(__ldg((const uint4 *)p), out, p); }
__device__ __forceinline__ void ra_cuda_load8(const float *p, float out[8]) {
  float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
  out[0] = a.x; out[1] = a.y; out[2] = a.z; out[3] = a.w;
  out[4] = b.x; out[5] = b.y; out[6] = b.z; out[7] = b.w;
}

/* ---- token ranges of attn_decode, passed by value when few ---- */

#define RA_CUDA_INLINE_RANGES 16
typedef struct ra_cuda_ranges {
  int n;           /* ranges */
  int64_t total;   /* tokens in all ranges */
  /* range i covers cache rows [begin[i], begin[i] + (start[i+1] - start[i])) and virtual
   * token indices [start[i], start[i+1]); the arrays live here when n <= INLINE, else in
   * device memory at d_begin/d_start */
  int64_t begin[RA_CUDA_INLINE_RANGES];
  int64_t start[RA_CUDA_INLINE_RANGES + 1];
  const int64_t *d_begin, *d_start;
} ra_cuda_ranges;

/* Cache row of virtual token v (< total) in a range table (begin[n], start[n + 1]): binary
 * search for the last range starting <= v. */
__device__ __forceinline__ int64_t ra_cuda_range_row_in(const int64_t *bg, const int64_t *st, int n, int64_t v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (st[mid] <= v)
      lo = mid;
    else
      hi = mid - 1;
  }
  return bg[lo] + (v - st[lo]);
}
__device__ __forceinline__ int64_t ra_cuda_range_row(const ra_cuda_ranges &r, int64_t v) {
  return ra_cuda_range_row_in(r.d_begin ? r.d_begin : r.begin, r.d_start ? r.d_start : r.start, r.n, v);
}

/* ---- launchers (one stream; each returns cudaGetLastError()) ---- */

/* dst[i] = (dst dtype) src[i], i < n; dtypes are ra_dtype. */
cudaError_t ra_cuda_convert(cudaStream_t s, void *dst, int dst_dtype, const void *src, int src_dtype, size_t n);
/* t[i] = center + scale * (2u - 1), u = (splitmix64(base ^ i) >> 40) * 2^-24 (backend_cpu.c). */
cudaError_t ra_cuda_fill_random(cudaStream_t s, void *dst, int dtype, size_t n, uint64_t base, float center,
                                float scale);
/* True for the ggml types ra_cuda_dequant handles; block geometry for them. */
int ra_cuda_ggml_supported(uint32_t type, size_t *block_values, size_t *block_bytes);
/* raw: rows x row_bytes of ggml `type` (device), dst: [rows, cols] BF16 or F32 (dst_dtype). */
cudaError_t ra_cuda_dequant(cudaStream_t s, const void *raw, uint32_t type, int64_t rows, int64_t cols,
                            size_t row_bytes, void *dst, int dst_dtype);
/* out[i, :] = table[ids[i], :].  table: [vocab, dim] of table_dtype, out F32. Up to
 * RA_CUDA_INLINE_IDS ids travel in the kernel's arguments (host ids, no copy: decode steps
 * stay asynchronous); more are read from device memory d_ids. */
#define RA_CUDA_INLINE_IDS 64
cudaError_t ra_cuda_get_rows(cudaStream_t s, const void *table, int table_dtype, int64_t dim, const int32_t *host_ids,
                             const int32_t *d_ids, int64_t n, float *out);
/* table[ids[i], :] = src[i, :], converted to table_dtype; ids as for ra_cuda_get_rows. */
cudaError_t ra_cuda_set_rows(cudaStream_t s, void *table, int table_dtype, int64_t dim, const int32_t *host_ids,
                             const int32_t *d_ids, int64_t n, const float *src);
/* y[i, :] (= or +=) bias.  y: [n, m] F32, bias: [m] of bias_dtype */
cudaError_t ra_cuda_bias_rows(cudaStream_t s, float *y, const void *bias, int bias_dtype, int64_t n, int64_t m,
                              int accumulate);
/* Shared-memory limits of the GEMV kernels; once per device before the first launch. */
cudaError_t ra_cuda_gemv_init(void);
/* x stays in shared memory up to this many columns; a fused RMSNorm needs it there. */
#define RA_CUDA_GEMV_SMEM_COLS 16384
/* The fused GEMV (cuda_gemv.cu): segments s < 3 with m[s] rows (unused: m = 0) share x [k];
 * y_s[j] = (norm ? rmsnorm(x) : x) . w_s[j] (+ bias_s[j]) (+ y_s[j] if accumulate); with
 * swiglu (2 segments of equal m, no accumulate) y_0[j] = silu(gate_j) * up_j instead.
 * Weights w_dtype (BF16/F16), 16-byte aligned rows, k % 8 == 0; norm needs
 * k <= RA_CUDA_GEMV_SMEM_COLS. */
typedef struct ra_cuda_gemv_args {
  const void *w[3];
  const void *bias[3];
  int bias_dtype[3];
  float *y[3];
  int64_t m[3];
  int w_dtype;
  const float *x;
  int64_t k;
  const void *norm_w; /* NULL: no norm */
  int norm_dtype;
  float eps;
  int accumulate, swiglu;
  int n_sm; /* the device's SMs: the kernel is persistent, its grid a multiple of them */
  int n_x;  /* 0 or 1: x [k]; up to RA_CUDA_GEMV_MAX_X: x [n_x, k], y_s [n_x, m_s] (no norm, no swiglu) */
} ra_cuda_gemv_args;
cudaError_t ra_cuda_gemv_fused(cudaStream_t s, const ra_cuda_gemv_args *a);
/* y[i, j] = sum_c w[j, c] x[i, c] (+ bias[j]) (+ y[i, j]).  w: [m, k] of w_dtype (BF16/F16),
 * x: [n_x, k] F32, 1 <= n_x <= RA_CUDA_GEMV_MAX_X. Needs k % 8 == 0 and 16-byte aligned w and x
 * (checked by the caller). */
cudaError_t ra_cuda_gemv(cudaStream_t s, int n_sm, const void *w, int w_dtype, const float *x, int n_x,
                         const void *bias, int bias_dtype, float *y, int64_t m, int64_t k, int accumulate);
/* The fused GEMV's plain, segmented and swiglu forms (no norm) for x of 1 <= n_x <=
 * RA_CUDA_MMA_MAX_X rows on tensor cores (cuda_gemm_rows.cu): xh [n_x, k] of w_dtype (x rounded
 * to the weights' type, as cuBLAS takes it), y_s [n_x, m_s]; a->x is not read. Needs k % 8 == 0
 * and 16-byte aligned w and xh (checked by the caller). */
cudaError_t ra_cuda_gemm_rows(cudaStream_t s, const ra_cuda_gemv_args *a, const void *xh);
/* y = x / sqrt(mean(x^2) + eps) * w.  x, y: [n, d] F32 (may alias), w: [d] of w_dtype */
cudaError_t ra_cuda_rmsnorm(cudaStream_t s, const float *x, const void *w, int w_dtype, float eps, float *y, int64_t n,
                            int64_t d);
/* As ra_cuda_rmsnorm, y of y_dtype (F32, F16 or BF16: rounded as ra_cuda_convert rounds): the
 * input of a 16-bit GEMM without a conversion pass of its own. */
cudaError_t ra_cuda_rmsnorm_to(cudaStream_t s, const float *x, const void *w, int w_dtype, float eps, void *y,
                               int y_dtype, int64_t n, int64_t d);
/* In place.  x: [n, heads, hd] F32 */
cudaError_t ra_cuda_rope(cudaStream_t s, float *x, int64_t n, int64_t heads, int64_t hd, int64_t pos0, int n_rot,
                         float theta, int neox);
/* rope of q [n, hq, hd] and k [n, hkv, hd] in place (F32), then k and v [n, hkv, hd] into the
 * cache rows [row, row + n) of kc, vc ([n_ctx, hkv, hd] of cache_dtype). */
cudaError_t ra_cuda_rope_store(cudaStream_t s, float *q, float *k, const float *v, int64_t n, int64_t hq, int64_t hkv,
                               int64_t hd, int64_t pos0, int n_rot, float theta, int neox, void *kc, void *vc,
                               int cache_dtype, int64_t row);
/* rope_store of up to RA_CUDA_ROPE_BATCH items in one launch: item i's rows [r0, r0 + n) of q
 * [T, hq, hd] and k, v [T, hkv, hd] at positions pos.., into rows [row, row + n) of its caches
 * (all of cache_dtype). */
#define RA_CUDA_ROPE_BATCH 32
struct ra_cuda_rope_item {
  int64_t r0, n, pos, row;
  void *kc, *vc;
};
struct ra_cuda_rope_batch {
  float *q, *k;
  const float *v;
  int64_t hq, hkv, hd;
  int n_rot, neox, n;
  float theta;
  ra_cuda_rope_item it[RA_CUDA_ROPE_BATCH];
};
cudaError_t ra_cuda_rope_store_batch(cudaStream_t s, const ra_cuda_rope_batch *b, int cache_dtype);
/* out = silu(gate) * up, n elements, F32 */
cudaError_t ra_cuda_swiglu(cudaStream_t s, const float *gate, const float *up, float *out, size_t n);
/* Per head: (o_acc, ml_acc) <- merge((o_acc, ml_acc), (o, ml)).  o*: [heads, hd], ml*: [heads, 2] */
cudaError_t ra_cuda_attn_merge(cudaStream_t s, float *o_acc, float *ml_acc, const float *o, const float *ml,
                               int64_t heads, int64_t hd);

/* Attention. Caches: [n_ctx, hkv, hd] of kv_dtype; hd % 8 == 0, hd <= 256; hq % hkv == 0;
 * (hq / hkv) * hd <= RA_CUDA_ATTN_MAX_GROUP_DIM. */
#define RA_CUDA_ATTN_MAX_GROUP_DIM 4096
/* True when the kernels handle `group` q heads per kv head of dimension hd. */
int ra_cuda_attn_geometry_ok(int group, int hd);
/* Shared-memory limits need setting once per device before the first launch. */
cudaError_t ra_cuda_attn_init(void);
/* q: [n, hq, hd] F32, out: [n, hq, hd] F32; query i sees cache rows [0, pos0 + i]. The wgmma
 * kernel where it applies (sm_90), else the mma.sync kernel, else the split kernel on CUDA
 * cores (ra_cuda_attn_prefill_kernel says which). */
cudaError_t ra_cuda_attn_prefill(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype, int64_t n,
                                 int hq, int hkv, int hd, int64_t pos0, float scale, float *out);
/* The tensor-core prefill (cuda_attn_prefill.cu): head dims 64 and 128, group <= 128, keys
 * (pos0 + n) < 2^31, any KV dtype; init sets its shared-memory limits (once per device). */
int ra_cuda_attn_prefill_mma_ok(int group, int hd, int64_t n_keys);
cudaError_t ra_cuda_attn_prefill_init(void);
cudaError_t ra_cuda_attn_prefill_mma(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                     int64_t n, int hq, int hkv, int hd, int64_t pos0, float scale, float *out);
/* The wgmma prefill (cuda_attn_prefill_wgmma.cu, built for sm_90a): head dims 64 and 128, BF16
 * and F16 caches, group <= 128, keys (pos0 + n) < 2^31, 16-byte aligned caches. Its init (once
 * per device, from ra_cuda_attn_init) readies it on compute capability 9.0 and does nothing on
 * other devices; ready says whether the current device has it. Same arguments as _mma. */
int ra_cuda_attn_prefill_wgmma_ok(int group, int hd, int kv_dtype, int64_t n_keys);
cudaError_t ra_cuda_attn_prefill_wgmma_init(void);
int ra_cuda_attn_prefill_wgmma_ready(void);
cudaError_t ra_cuda_attn_prefill_wgmma(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                       int64_t n, int hq, int hkv, int hd, int64_t pos0, float scale, float *out);
/* Prefill kernel choice, process-wide like PDL: mode RA_CUDA_PREFILL_AUTO or _MMA
 * (backend_cuda.h). ra_cuda_attn_prefill_kernel: the kernel ra_cuda_attn_prefill takes for this
 * geometry on the current device under the mode, for 16-byte aligned caches. */
enum { RA_CUDA_PREFILL_WITH_WGMMA, RA_CUDA_PREFILL_WITH_MMA, RA_CUDA_PREFILL_WITH_CORES };
void ra_cuda_attn_prefill_set_kernel(int mode);
int ra_cuda_attn_prefill_kernel(int group, int hd, int kv_dtype, int64_t n_keys);
/* Decode (flash-decoding): the token set is cut into n_splits chunks, each block of a chunk and
 * kv head writes an unnormalized partial, and a reduce merges them by log-sum-exp.
 * Splits for a decode over `total` tokens: n_splits (<= RA_CUDA_MAX_SPLITS) and tokens per
 * split, for the kernel ra_cuda_attn_decode will pick for this geometry. */
#define RA_CUDA_MAX_SPLITS 4096
void ra_cuda_decode_plan(int64_t total, int hkv, int group, int hd, int kv_dtype, int n_sm, int *n_splits,
                         int64_t *chunk);
/* q: [hq, hd] F32, o: [hq, hd], ml: [hq, 2]. part_o/part_ml: scratch of n_splits*hq*hd and
 * n_splits*hq*2 floats when n_splits > 1. n_splits and chunk come from ra_cuda_decode_plan. */
cudaError_t ra_cuda_attn_decode(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype, int hq,
                                int hkv, int hd, const ra_cuda_ranges *r, int n_splits, int64_t chunk, float scale,
                                float *part_o, float *part_ml, float *o, float *ml);
/* The pieces ra_cuda_attn_decode is made of (cuda_attn.cu): the general split kernel (any
 * geometry the split kernel accepts, chunk a multiple of 32), the partials' reduce, and the
 * empty token set (m = -inf, l = 0, o = 0). */
cudaError_t ra_cuda_attn_decode_split(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                      int hq, int hkv, int hd, const ra_cuda_ranges *r, int n_splits, int64_t chunk,
                                      float scale, float *part_o, float *part_ml, float *o, float *ml);
cudaError_t ra_cuda_attn_reduce(cudaStream_t s, const float *part_o, const float *part_ml, int n_splits, int hq, int hd,
                                float *o, float *ml);
cudaError_t ra_cuda_attn_empty(cudaStream_t s, int hq, int hd, float *o, float *ml);
/* Batched decode: up to RA_CUDA_DECODE_BATCH sequences of one geometry in one launch, each one
 * query over its cache rows [0, total) (total >= 1) with its own plan (n_splits >= 1, chunk)
 * and scratch; for the geometries of the warp kernels (ra_cuda_decode_batch_ok). */
#define RA_CUDA_DECODE_BATCH 32
typedef struct ra_cuda_decode_item {
  const float *q;          /* [hq, hd] */
  const void *kc, *vc;     /* [n_ctx, hkv, hd] */
  float *part_o, *part_ml; /* [n_splits, hq, hd], [n_splits, hq, 2] when n_splits > 1 */
  float *o, *ml;           /* [hq, hd], [hq, 2] */
  int64_t total, chunk;
  int n_splits;
} ra_cuda_decode_item;
int ra_cuda_decode_batch_ok(int group, int hd, int kv_dtype);
cudaError_t ra_cuda_attn_decode_batch(cudaStream_t s, int kv_dtype, int hq, int hkv, int hd, float scale,
                                      const ra_cuda_decode_item *items, int n);
/* The reduce of every item with n_splits > 1 (blockIdx.z the item). */
cudaError_t ra_cuda_attn_reduce_batch(cudaStream_t s, const ra_cuda_decode_item *items, int n, int hq, int hd);

/* Top-k of every row, descending, ties to the lower index.  x: [n, m] F32 (device),
 * idx, val: device [n, k]. k <= RA_CUDA_TOPK_MAX. */
#define RA_CUDA_TOPK_MAX 4096
cudaError_t ra_cuda_topk_rows(cudaStream_t s, const float *x, int64_t n, int64_t m, int k, int32_t *idx, float *val);

#endif
