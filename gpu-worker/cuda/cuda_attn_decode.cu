/* Decode attention: one query token (all q heads) over a union of cache ranges.
 *
 * Decode attention reads each K/V byte once and does ~2 flops per byte: it is a bandwidth
 * problem, and the kernel's only job is to keep DRAM busy. The fast kernel (16-bit caches,
 * head_dim 64 or 128, up to 8 q heads per kv head) has the layout of FlashInfer's decode:
 *   - a warp per (kv head, split), the kv heads of a split in one block, so a block reads
 *     whole cache rows ([n_ctx, hkv, hd]: a row is all kv heads) at about the same time;
 *   - a token is read by head_dim / 8 lanes, 16 bytes each (coalesced), so a warp reads 2
 *     (head_dim 128) or 4 tokens per step, and a round of U steps has all of its K and V loads
 *     in flight before any is used;
 *   - q stays in registers (each lane its 8 dims of every q head of the group); a score is the
 *     8-dim partial dot summed over the token's lanes by shuffles;
 *   - online softmax once per round with the max over the whole warp; each lane keeps l and o
 *     for its token slot and its 8 dims, relative to the shared max, summed once at the end.
 * The result per split is the unnormalized partial that ra_cuda_attn_reduce merges; with one
 * split the block writes the final (o, m, l) itself. Other geometries and fp32 caches take the
 * general split kernel of cuda_attn.cu. */
#include "ra_cuda.cuh"

#include <math.h>

namespace {

/* kv heads per block, one warp each; 3 blocks of 4 warps fit an SM's registers (<= 170 per
 * thread), which keeps ~100 KB of loads in flight per SM */
constexpr int kWarps = 4;
constexpr int kMinBlocks = 3;

struct warp_args {
  const float *q; /* [hq, HD] */
  const void *kc, *vc;
  int hq, hkv, group;
  float scale;
  ra_cuda_ranges r;
  int64_t chunk;
  int n_splits;
  float *part_o, *part_ml, *o, *ml;
};

/* HD: head_dim; G: register capacity in q heads (group <= G). Warp w of block (x, split)
 * is kv head x * kWarps + w. */
template <typename KT, int HD, int G>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) attn_decode_warp_kernel(warp_args a) {
  constexpr int LPT = HD / 8;       /* lanes per token: 16 bytes of the row each */
  constexpr int TPW = 32 / LPT;     /* tokens per warp and step */
  constexpr int U = G <= 4 ? 8 : 2; /* steps per round: U * 2 16-byte loads in flight per lane */
  constexpr int TW = TPW * U;       /* tokens per warp and round */

  /* the range table in shared memory (kernel parameters addressed through a pointer are slow
   * to read in the inner loop); tables beyond the inline size stay in device memory */
  __shared__ int64_t sm_begin[RA_CUDA_INLINE_RANGES], sm_start[RA_CUDA_INLINE_RANGES + 1];
  const bool inl = a.r.d_begin == nullptr;
  if (inl && threadIdx.x <= (unsigned)a.r.n) {
    if (threadIdx.x < (unsigned)a.r.n) sm_begin[threadIdx.x] = a.r.begin[threadIdx.x];
    sm_start[threadIdx.x] = a.r.start[threadIdx.x];
  }
  __syncthreads();
  const int64_t *rbeg = inl ? sm_begin : a.r.d_begin, *rst = inl ? sm_start : a.r.d_start;
  const int n_ranges = a.r.n;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = lane / LPT, sub = lane % LPT;
  const int g = a.group, kvh = blockIdx.x * kWarps + warp;
  if (kvh >= a.hkv) return;
  const int64_t v0 = (int64_t)blockIdx.y * a.chunk;
  const int64_t v1 = v0 + a.chunk < a.r.total ? v0 + a.chunk : a.r.total;
  const KT *kc = (const KT *)a.kc, *vc = (const KT *)a.vc;
  const int64_t row_stride = (int64_t)a.hkv * HD, lane_off = (int64_t)kvh * HD + 8 * sub;

  /* this lane's 8 dims of the group's q heads, pre-scaled */
  float qr[G][8];
#pragma unroll
  for (int h = 0; h < G; h++)
#pragma unroll
    for (int i = 0; i < 8; i++) qr[h][i] = h < g ? a.q[((int64_t)kvh * g + h) * HD + 8 * sub + i] * a.scale : 0.0f;
  /* running max (the same in every lane), and this lane's share of l and o: its token slot's
   * tokens, its 8 dims; slots are summed once at the end */
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int h = 0; h < G; h++) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) acc[h][i] = 0.0f;
  }

  for (int64_t b = v0; b < v1; b += TW) {
    /* every load of the round first: U steps of K and V, 16 bytes each, coalesced rows */
    uint4 kr[U], vr[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t t = b + u * TPW + grp;
      valid[u] = t < v1;
      const int64_t row = ra_cuda_range_row_in(rbeg, rst, n_ranges, valid[u] ? t : b);
      kr[u] = __ldg((const uint4 *)(kc + row * row_stride + lane_off));
      vr[u] = __ldg((const uint4 *)(vc + row * row_stride + lane_off));
    }
    /* scores: 8-dim partial dots summed over the token's LPT lanes */
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float kf[8];
      ra_cuda_cvt8(kr[u], kf, (const KT *)nullptr);
#pragma unroll
      for (int h = 0; h < G; h++) {
        float d = 0.0f;
        if (h < g) {
#pragma unroll
          for (int i = 0; i < 8; i++) d = fmaf(kf[i], qr[h][i], d);
#pragma unroll
          for (int o = LPT / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        }
        s[u][h] = valid[u] ? d : -INFINITY;
      }
    }
    /* online softmax: the round's max over all the warp's tokens (token b is valid) */
#pragma unroll
    for (int h = 0; h < G; h++) {
      if (h < g) {
        float mx = s[0][h];
#pragma unroll
        for (int u = 1; u < U; u++) mx = fmaxf(mx, s[u][h]);
#pragma unroll
        for (int o = LPT; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float mn = fmaxf(m[h], mx);
        const float al = __expf(m[h] - mn); /* 0 while m is still -inf */
        m[h] = mn;
        l[h] *= al;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[h][i] *= al;
#pragma unroll
        for (int u = 0; u < U; u++) s[u][h] = __expf(s[u][h] - mn); /* -inf -> 0 */
      }
    }
    /* P V */
#pragma unroll
    for (int u = 0; u < U; u++) {
      float vf[8];
      ra_cuda_cvt8(vr[u], vf, (const KT *)nullptr);
#pragma unroll
      for (int h = 0; h < G; h++) {
        if (h < g) {
          l[h] += s[u][h];
#pragma unroll
          for (int i = 0; i < 8; i++) acc[h][i] = fmaf(s[u][h], vf[i], acc[h][i]);
        }
      }
    }
  }

  /* the token slots share m: their l and o add up; slot 0 writes the kv head's partial */
#pragma unroll
  for (int h = 0; h < G; h++) {
    if (h < g) {
#pragma unroll
      for (int o = LPT; o < 32; o <<= 1) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], o);
#pragma unroll
        for (int i = 0; i < 8; i++) acc[h][i] += __shfl_xor_sync(0xffffffffu, acc[h][i], o);
      }
      if (grp != 0) continue;
      const int qh = kvh * g + h;
      if (a.n_splits == 1) {
#pragma unroll
        for (int i = 0; i < 8; i++) a.o[(int64_t)qh * HD + 8 * sub + i] = l[h] > 0.0f ? acc[h][i] / l[h] : 0.0f;
        if (sub == 0 && a.ml) {
          a.ml[2 * qh] = m[h];
          a.ml[2 * qh + 1] = l[h];
        }
      } else {
        float *po = a.part_o + ((int64_t)blockIdx.y * a.hq + qh) * HD + 8 * sub;
#pragma unroll
        for (int i = 0; i < 8; i++) po[i] = acc[h][i];
        if (sub == 0) {
          a.part_ml[((int64_t)blockIdx.y * a.hq + qh) * 2] = m[h];
          a.part_ml[((int64_t)blockIdx.y * a.hq + qh) * 2 + 1] = l[h];
        }
      }
    }
  }
}

bool warp_kernel_fits(int group, int hd, int kv_dtype) {
  return (kv_dtype == RA_DTYPE_F16 || kv_dtype == RA_DTYPE_BF16) && (hd == 64 || hd == 128) && group >= 1 &&
         group <= 8;
}

template <typename KT, int HD>
cudaError_t launch_hd(cudaStream_t s, dim3 grid, const warp_args &a) {
  if (a.group <= 4)
    attn_decode_warp_kernel<KT, HD, 4><<<grid, kWarps * 32, 0, s>>>(a);
  else
    attn_decode_warp_kernel<KT, HD, 8><<<grid, kWarps * 32, 0, s>>>(a);
  return cudaGetLastError();
}

template <typename KT> cudaError_t launch_kt(cudaStream_t s, int hd, dim3 grid, const warp_args &a) {
  return hd == 64 ? launch_hd<KT, 64>(s, grid, a) : launch_hd<KT, 128>(s, grid, a);
}

} /* namespace */

void ra_cuda_decode_plan(int64_t total, int hkv, int group, int hd, int kv_dtype, int n_sm, int *n_splits,
                         int64_t *chunk) {
  if (total <= 0) {
    *n_splits = 0;
    *chunk = 0;
    return;
  }
  /* the warp kernel: ~12 warps (one per kv head and split) per SM, at least 32 tokens each;
   * the split kernel: ~4 blocks per SM, at least two 32-token tiles each; at most
   * RA_CUDA_MAX_SPLITS splits */
  const bool warp = warp_kernel_fits(group, hd, kv_dtype);
  const int64_t unit = warp ? 32 : 64;
  const int64_t want = ((int64_t)(warp ? 12 : 4) * (n_sm > 0 ? n_sm : 1) + hkv - 1) / hkv;
  int64_t c = (total + want - 1) / want;
  if (c < unit) c = unit;
  if (c * RA_CUDA_MAX_SPLITS < total) c = (total + RA_CUDA_MAX_SPLITS - 1) / RA_CUDA_MAX_SPLITS;
  c = (c + 31) / 32 * 32;
  *chunk = c;
  *n_splits = (int)((total + c - 1) / c);
}

cudaError_t ra_cuda_attn_decode(cudaStream_t s, const float *q, const void *kc, const void *vc, int kv_dtype, int hq,
                                int hkv, int hd, const ra_cuda_ranges *r, int n_splits, int64_t chunk, float scale,
                                float *part_o, float *part_ml, float *o, float *ml) {
  if (n_splits == 0) return ra_cuda_attn_empty(s, hq, hd, o, ml);
  const int group = hq / hkv;
  if (!warp_kernel_fits(group, hd, kv_dtype))
    return ra_cuda_attn_decode_split(s, q, kc, vc, kv_dtype, hq, hkv, hd, r, n_splits, chunk, scale, part_o, part_ml,
                                     o, ml);
  warp_args a = {};
  a.q = q;
  a.kc = kc;
  a.vc = vc;
  a.hq = hq;
  a.hkv = hkv;
  a.group = group;
  a.scale = scale;
  a.r = *r;
  a.chunk = chunk;
  a.n_splits = n_splits;
  a.part_o = part_o;
  a.part_ml = part_ml;
  a.o = o;
  a.ml = ml;
  const dim3 grid((unsigned)((hkv + kWarps - 1) / kWarps), (unsigned)n_splits);
  cudaError_t e = kv_dtype == RA_DTYPE_F16 ? launch_kt<__half>(s, hd, grid, a) : launch_kt<__nv_bfloat16>(s, hd, grid, a);
  if (e != cudaSuccess || n_splits == 1) return e;
  return ra_cuda_attn_reduce(s, part_o, part_ml, n_splits, hq, hd, o, ml);
}
