/* Attention kernels: prefill, and the general decode path (cuda_attn_decode.cu has the fast
 * decode kernel for the common geometries and picks between them).
 *
 * Decode (flash-decoding): the token set of one query, an arbitrary union of cache ranges, is
 * numbered 0..T-1 ("virtual" tokens) and cut into n_splits chunks. Block (split s, kv head)
 * streams its chunk's K/V rows through shared memory in tiles of 32 tokens and keeps, for each
 * of the group's q heads, the online-softmax state (m, l, unnormalized o). One K/V read serves
 * all q heads of the group. A second kernel merges the splits exactly (log-sum-exp) into the
 * (o, m, l) triple of common/merge.h. The same kernel, with one split per query over rows
 * [0, pos0 + i], is the CUDA-core prefill for the head dims the tensor-core prefills
 * (cuda_attn_prefill_wgmma.cu on sm_90, cuda_attn_prefill.cu elsewhere and for F32 caches) do
 * not cover. */
#include "ra_cuda.cuh"

#include <math.h>

#include <atomic>

namespace {

/* ---------------- split-K decode ---------------- */

constexpr int kDecThreads = 128;
constexpr int kTile = 32; /* tokens per shared-memory tile; the softmax step assumes == warp size */
constexpr int kMaxAcc = RA_CUDA_ATTN_MAX_GROUP_DIM / kDecThreads;

struct split_args {
  const float *q;
  int64_t q_stride; /* floats between query rows (prefill); 0 for decode */
  const void *kc, *vc;
  int hq, hkv, group, hd;
  float scale;
  ra_cuda_ranges r; /* decode: the token set */
  int64_t chunk;    /* decode: virtual tokens per split */
  int n_splits;
  int prefill;      /* 1: blockIdx.x is query i, tokens [0, pos0 + i] */
  int64_t pos0;
  float *part_o, *part_ml; /* [n_splits, hq, hd], [n_splits, hq, 2] */
  float *o, *ml;           /* final: [.., hq, hd] (row stride q_stride), [hq, 2] or NULL */
};

size_t split_smem_bytes(int group, int hd) {
  size_t floats = (size_t)group * hd + (size_t)kTile * (hd + 1) + (size_t)kTile * hd + (size_t)group * kTile + 3 * group;
  floats = (floats + 1) & ~(size_t)1; /* 8-byte alignment for the int64 row table */
  return floats * sizeof(float) + kTile * sizeof(int64_t);
}

/* Dynamic shared memory of the split kernel: every layout with group * hd <= 4096 fits (the
 * largest, hd 8 with group 512, takes 90 KB; hd 256 with group 16 takes 84 KB). */
constexpr size_t kSplitSmemMax = 96 * 1024;

template <typename KT>
__global__ void __launch_bounds__(kDecThreads) attn_split_kernel(split_args a) {
  extern __shared__ float sm[];
  const int hd = a.hd, g = a.group, ldk = hd + 1;
  float *qs = sm;                  /* [g][hd], pre-scaled */
  float *ks = qs + g * hd;         /* [kTile][hd + 1] (odd stride: conflict-free dot products) */
  float *vs = ks + kTile * ldk;    /* [kTile][hd] */
  float *ps = vs + kTile * hd;     /* [g][kTile] scores, then probabilities */
  float *mrun = ps + g * kTile;    /* [g] running max */
  float *lrun = mrun + g;          /* [g] running sum */
  float *alpha = lrun + g;         /* [g] rescale of this tile */
  size_t nf = (size_t)g * hd + (size_t)kTile * (hd + 1) + (size_t)kTile * hd + (size_t)g * kTile + 3 * g;
  int64_t *trow = (int64_t *)(sm + ((nf + 1) & ~(size_t)1)); /* [kTile] cache row of each tile token */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int kvh = blockIdx.y;
  int64_t qi = 0, v0, v1;
  if (a.prefill) {
    qi = blockIdx.x;
    v0 = 0;
    v1 = a.pos0 + qi + 1;
  } else {
    v0 = (int64_t)blockIdx.x * a.chunk;
    v1 = v0 + a.chunk < a.r.total ? v0 + a.chunk : a.r.total;
  }
  const float *qrow = a.q + qi * a.q_stride + (int64_t)kvh * g * hd; /* the group's q heads are adjacent */
  for (int i = tid; i < g * hd; i += kDecThreads) qs[i] = qrow[i] * a.scale;
  for (int i = tid; i < g; i += kDecThreads) {
    mrun[i] = -INFINITY;
    lrun[i] = 0.0f;
  }
  float acc[kMaxAcc];
#pragma unroll
  for (int j = 0; j < kMaxAcc; j++) acc[j] = 0.0f;
  const int nacc = (g * hd + kDecThreads - 1) / kDecThreads;
  const KT *kc = (const KT *)a.kc, *vc = (const KT *)a.vc;
  const int64_t row_stride = (int64_t)a.hkv * hd;
  const int vpr = hd / 8;
  __syncthreads();

  for (int64_t t0 = v0; t0 < v1; t0 += kTile) {
    const int nt = v1 - t0 < kTile ? (int)(v1 - t0) : kTile;
    if (tid < kTile) trow[tid] = tid < nt ? (a.prefill ? t0 + tid : ra_cuda_range_row(a.r, t0 + tid)) : 0;
    __syncthreads();
    for (int e = tid; e < nt * vpr; e += kDecThreads) {
      const int t = e / vpr, c = (e % vpr) * 8;
      const int64_t off = trow[t] * row_stride + (int64_t)kvh * hd + c;
      float f[8];
      ra_cuda_load8(kc + off, f);
#pragma unroll
      for (int j = 0; j < 8; j++) ks[t * ldk + c + j] = f[j];
      ra_cuda_load8(vc + off, f);
#pragma unroll
      for (int j = 0; j < 8; j++) vs[t * hd + c + j] = f[j];
    }
    __syncthreads();
    for (int p = tid; p < g * kTile; p += kDecThreads) {
      const int h = p / kTile, t = p % kTile;
      float s = -INFINITY;
      if (t < nt) {
        s = 0.0f;
        const float *qh = qs + h * hd, *kr = ks + t * ldk;
        for (int d = 0; d < hd; d++) s = fmaf(qh[d], kr[d], s);
      }
      ps[p] = s;
    }
    __syncthreads();
    for (int h = warp; h < g; h += kDecThreads / 32) {
      const float s = ps[h * kTile + lane];
      float mx = s;
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mo = mrun[h], mn = fmaxf(mo, mx);
      const float p = s == -INFINITY ? 0.0f : expf(s - mn);
      float sum = p;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      ps[h * kTile + lane] = p;
      if (lane == 0) {
        const float al = mo == -INFINITY ? 0.0f : expf(mo - mn);
        alpha[h] = al;
        lrun[h] = lrun[h] * al + sum;
        mrun[h] = mn;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kMaxAcc; j++) {
      const int o = tid + j * kDecThreads;
      if (j < nacc && o < g * hd) {
        const int h = o / hd, d = o % hd;
        float s = acc[j] * alpha[h];
        const float *ph = ps + h * kTile;
        for (int t = 0; t < nt; t++) s = fmaf(ph[t], vs[t * hd + d], s);
        acc[j] = s;
      }
    }
    __syncthreads();
  }

  const bool final_out = a.prefill || a.n_splits == 1;
#pragma unroll
  for (int j = 0; j < kMaxAcc; j++) {
    const int o = tid + j * kDecThreads;
    if (j < nacc && o < g * hd) {
      const int h = o / hd, d = o % hd, qh = kvh * g + h;
      if (final_out) {
        const float l = lrun[h];
        a.o[qi * a.q_stride + (int64_t)qh * hd + d] = l > 0.0f ? acc[j] / l : 0.0f;
      } else {
        a.part_o[((int64_t)blockIdx.x * a.hq + qh) * hd + d] = acc[j];
      }
    }
  }
  for (int h = tid; h < g; h += kDecThreads) {
    const int qh = kvh * g + h;
    if (final_out) {
      if (a.ml) {
        a.ml[2 * qh] = mrun[h];
        a.ml[2 * qh + 1] = lrun[h];
      }
    } else {
      a.part_ml[((int64_t)blockIdx.x * a.hq + qh) * 2] = mrun[h];
      a.part_ml[((int64_t)blockIdx.x * a.hq + qh) * 2 + 1] = lrun[h];
    }
  }
}

/* Exact log-sum-exp merge of the splits' unnormalized partials; block (q head, 32-dim slice).
 * The sum over splits is a chain of dependent L2 reads per output element: it is cut into 8
 * interleaved chains (one per warp) of 4 independent accumulators each, so that reads overlap. */
constexpr int kRedThreads = 256;

__device__ __forceinline__ void reduce_body(const float *__restrict__ part_o, const float *__restrict__ part_ml,
                                            int n_splits, int hq, int hd, float *__restrict__ o,
                                            float *__restrict__ ml) {
  __shared__ float w[RA_CUDA_MAX_SPLITS];
  __shared__ float red[kRedThreads];
  ra_cuda_pdl_entry();
  const int h = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float mx = -INFINITY;
  for (int s = tid; s < n_splits; s += kRedThreads) mx = fmaxf(mx, part_ml[((int64_t)s * hq + h) * 2]);
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int i = 1; i < kRedThreads / 32; i++) mx = fmaxf(mx, red[i]);
  __syncthreads();
  float l = 0.0f;
  for (int s = tid; s < n_splits; s += kRedThreads) {
    const float ws = expf(part_ml[((int64_t)s * hq + h) * 2] - mx);
    w[s] = ws;
    l += part_ml[((int64_t)s * hq + h) * 2 + 1] * ws;
  }
  for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
  __syncthreads(); /* red[] is read above; w[] complete below */
  if (lane == 0) red[warp] = l;
  __syncthreads();
  l = 0.0f;
  for (int i = 0; i < kRedThreads / 32; i++) l += red[i];
  __syncthreads();
  /* block (head, 32-dim slice): thread (chain c, dim d) sums splits c, c + 8, c + 16, ... */
  const int d = blockIdx.y * 32 + lane, c = warp, nc = kRedThreads / 32;
  float acc = 0.0f;
  if (d < hd) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    const float *po = part_o + (int64_t)h * hd + d;
    const int64_t step = (int64_t)hq * hd;
    int s = c;
    for (; s + 3 * nc < n_splits; s += 4 * nc) {
      a0 = fmaf(po[(int64_t)s * step], w[s], a0);
      a1 = fmaf(po[(int64_t)(s + nc) * step], w[s + nc], a1);
      a2 = fmaf(po[(int64_t)(s + 2 * nc) * step], w[s + 2 * nc], a2);
      a3 = fmaf(po[(int64_t)(s + 3 * nc) * step], w[s + 3 * nc], a3);
    }
    for (; s < n_splits; s += nc) a0 = fmaf(po[(int64_t)s * step], w[s], a0);
    acc = (a0 + a1) + (a2 + a3);
  }
  red[tid] = acc;
  __syncthreads();
  if (tid < 32 && d < hd) {
    float sum = 0.0f;
    for (int i = 0; i < nc; i++) sum += red[i * 32 + tid];
    o[(int64_t)h * hd + d] = l > 0.0f ? sum / l : 0.0f;
  }
  if (blockIdx.y != 0) return;
  if (tid == 0) {
    ml[2 * h] = mx;
    ml[2 * h + 1] = l;
  }
}

__global__ void __launch_bounds__(kRedThreads) attn_reduce_kernel(const float *__restrict__ part_o,
                                                                  const float *__restrict__ part_ml, int n_splits,
                                                                  int hq, int hd, float *__restrict__ o,
                                                                  float *__restrict__ ml) {
  reduce_body(part_o, part_ml, n_splits, hq, hd, o, ml);
}

struct reduce_batch_args {
  ra_cuda_decode_item it[RA_CUDA_DECODE_BATCH];
};

/* blockIdx.z: the item; items written whole by the decode kernel (one split) have no reduce */
__global__ void __launch_bounds__(kRedThreads) attn_reduce_batch_kernel(const __grid_constant__ reduce_batch_args b,
                                                                        int hq, int hd) {
  const ra_cuda_decode_item &it = b.it[blockIdx.z];
  if (it.n_splits <= 1) return;
  reduce_body(it.part_o, it.part_ml, it.n_splits, hq, hd, it.o, it.ml);
}

/* The partial of an empty token set: m = -inf, l = 0, o = 0. */
__global__ void attn_empty_kernel(float *o, float *ml, int hq, int hd) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < hq * hd; i += gridDim.x * blockDim.x) o[i] = 0.0f;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < hq; i += gridDim.x * blockDim.x) {
    ml[2 * i] = -INFINITY;
    ml[2 * i + 1] = 0.0f;
  }
}

template <typename KT> cudaError_t launch_split(cudaStream_t s, dim3 grid, const split_args &a) {
  attn_split_kernel<KT><<<grid, kDecThreads, split_smem_bytes(a.group, a.hd), s>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_split_dtype(cudaStream_t s, int kv_dtype, dim3 grid, const split_args &a) {
  switch (kv_dtype) {
    case RA_DTYPE_F32: return launch_split<float>(s, grid, a);
    case RA_DTYPE_F16: return launch_split<__half>(s, grid, a);
    default: return launch_split<__nv_bfloat16>(s, grid, a);
  }
}

template <typename KT> cudaError_t init_for() {
  /* the largest split layout any allowed geometry (hd % 8 == 0, hd <= 256, group * hd <=
   * RA_CUDA_ATTN_MAX_GROUP_DIM) needs; ra_cuda_attn_split_smem_ok() rejects the rest */
  return cudaFuncSetAttribute(attn_split_kernel<KT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              (int)kSplitSmemMax);
}

/* ra_cuda_attn_prefill_set_kernel's mode (RA_CUDA_PREFILL_AUTO / _MMA) */
std::atomic<int> g_prefill_mode{RA_CUDA_PREFILL_AUTO};

} /* namespace */

int ra_cuda_attn_geometry_ok(int group, int hd) {
  return hd % 8 == 0 && hd >= 8 && hd <= 256 && group >= 1 && group * hd <= RA_CUDA_ATTN_MAX_GROUP_DIM &&
         split_smem_bytes(group, hd) <= kSplitSmemMax;
}

cudaError_t ra_cuda_attn_init(void) {
  cudaError_t e;
  if ((e = ra_cuda_attn_prefill_init()) != cudaSuccess) return e;
  if ((e = ra_cuda_attn_prefill_wgmma_init()) != cudaSuccess) return e;
  if ((e = init_for<float>()) != cudaSuccess) return e;
  if ((e = init_for<__half>()) != cudaSuccess) return e;
  return init_for<__nv_bfloat16>();
}

void ra_cuda_attn_prefill_set_kernel(int mode) { g_prefill_mode.store(mode); }

int ra_cuda_attn_prefill_kernel(int group, int hd, int kv_dtype, int64_t n_keys) {
  if (g_prefill_mode.load() != RA_CUDA_PREFILL_MMA && ra_cuda_attn_prefill_wgmma_ok(group, hd, kv_dtype, n_keys) &&
      ra_cuda_attn_prefill_wgmma_ready())
    return RA_CUDA_PREFILL_WITH_WGMMA;
  return ra_cuda_attn_prefill_mma_ok(group, hd, n_keys) ? RA_CUDA_PREFILL_WITH_MMA : RA_CUDA_PREFILL_WITH_CORES;
}

cudaError_t ra_cuda_attn_prefill(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype, int64_t n,
                                 int hq, int hkv, int hd, int64_t pos0, float scale, float *out) {
  if (n == 0) return cudaSuccess;
  const int which = ra_cuda_attn_prefill_kernel(hq / hkv, hd, kv_dtype, pos0 + n);
  /* the tensor maps of the wgmma kernel need 16-byte aligned caches (a cache from cudaMalloc is) */
  if (which == RA_CUDA_PREFILL_WITH_WGMMA && (((uintptr_t)kc | (uintptr_t)vc) & 15) == 0)
    return ra_cuda_attn_prefill_wgmma(s, q, kc, vc, kv_dtype, n, hq, hkv, hd, pos0, scale, out);
  if (which != RA_CUDA_PREFILL_WITH_CORES)
    return ra_cuda_attn_prefill_mma(s, q, kc, vc, kv_dtype, n, hq, hkv, hd, pos0, scale, out);
  split_args a = {};
  a.q = q;
  a.q_stride = (int64_t)hq * hd;
  a.kc = kc;
  a.vc = vc;
  a.hq = hq;
  a.hkv = hkv;
  a.group = hq / hkv;
  a.hd = hd;
  a.scale = scale;
  a.n_splits = 1;
  a.prefill = 1;
  a.pos0 = pos0;
  a.o = out;
  return launch_split_dtype(s, kv_dtype, dim3((unsigned)n, (unsigned)hkv), a);
}

cudaError_t ra_cuda_attn_empty(cudaStream_t s, int hq, int hd, float *o, float *ml) {
  attn_empty_kernel<<<(unsigned)((hq * hd + 255) / 256), 256, 0, s>>>(o, ml, hq, hd);
  return cudaGetLastError();
}

cudaError_t ra_cuda_attn_reduce(cudaStream_t s, const float *part_o, const float *part_ml, int n_splits, int hq, int hd,
                                float *o, float *ml) {
  return ra_cuda_launch(attn_reduce_kernel, dim3((unsigned)hq, (unsigned)((hd + 31) / 32)), kRedThreads, 0, s, part_o,
                        part_ml, n_splits, hq, hd, o, ml);
}

cudaError_t ra_cuda_attn_reduce_batch(cudaStream_t s, const ra_cuda_decode_item *items, int n, int hq, int hd) {
  if (n < 1 || n > RA_CUDA_DECODE_BATCH) return cudaErrorInvalidValue;
  reduce_batch_args b = {};
  for (int i = 0; i < n; i++) b.it[i] = items[i];
  return ra_cuda_launch(attn_reduce_batch_kernel, dim3((unsigned)hq, (unsigned)((hd + 31) / 32), (unsigned)n),
                        kRedThreads, 0, s, b, hq, hd);
}

cudaError_t ra_cuda_attn_decode_split(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype,
                                      int hq, int hkv, int hd, const ra_cuda_ranges *r, int n_splits, int64_t chunk,
                                      float scale, float *part_o, float *part_ml, float *o, float *ml) {
  split_args a = {};
  a.q = q;
  a.q_stride = 0;
  a.kc = kc;
  a.vc = vc;
  a.hq = hq;
  a.hkv = hkv;
  a.group = hq / hkv;
  a.hd = hd;
  a.scale = scale;
  a.r = *r;
  a.chunk = chunk;
  a.n_splits = n_splits;
  a.part_o = part_o;
  a.part_ml = part_ml;
  a.o = o;
  a.ml = ml;
  cudaError_t e = launch_split_dtype(s, kv_dtype, dim3((unsigned)n_splits, (unsigned)hkv), a);
  if (e != cudaSuccess || n_splits == 1) return e;
  return ra_cuda_attn_reduce(s, part_o, part_ml, n_splits, hq, hd, o, ml);
}
