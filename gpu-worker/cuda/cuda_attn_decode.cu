/* Decode attention: one query token (all q heads) over a union of cache ranges.
 *
 * Decode attention reads each K/V byte once and does ~2 flops per byte per q head: it is a
 * bandwidth problem, and the kernel's job is to keep DRAM busy with as few instructions per
 * byte as it can. Two kernels for 16-bit caches and head_dim 64 or 128, both with FlashInfer's
 * decode layout:
 *   - a warp per (kv head, split), the kv heads of a split in one block, so a block reads
 *     whole cache rows ([n_ctx, hkv, hd]: a row is all kv heads) at about the same time;
 *   - a token is read by a group of lanes, 16 bytes per load (coalesced), and a round of U
 *     steps has all of its K and V loads in flight before any is used;
 *   - q stays in registers (each lane its dims of every q head of the group);
 *   - online softmax once per round with the max over the whole warp; each lane keeps l and o
 *     for its token slot and its dims, relative to the shared max, summed once at the end.
 * In g4, two rounds of K/V live in registers: the next round's loads are issued before the
 * current round is used. Asking L2 for a block's whole split up front (cp.async.bulk.prefetch
 * before the PDL wait) measured slower (bench/results/defaults/README.md).
 * g4 (groups of up to 4 q heads: Llama-3, SmolLM2, Qwen2): 8 lanes per token, 4 tokens per
 *   step. The 4 heads' partial dots are reduced over the 8 lanes by a transposed butterfly
 *   (each level sends half of the values: 4 shuffles for 4 heads, not 12), which leaves lane s
 *   with the score of head s / 2; the softmax runs on that one score per lane, and the token's
 *   weights are fetched back by 4 shuffles for P V. The rescale of o is skipped in the rounds
 *   where no head's max moved (most of them once the max settles). About 45 instructions per
 *   token and kv head.
 * g8 (groups of 5 to 8, e.g. Llama-3-70B): 16 (head_dim 128) or 8 lanes per token with a
 *   plain butterfly per head; with 8 heads there are not the registers for the g4 layout.
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
/* the g4 kernel holds q and o of 4 heads (2 x 64 floats per lane at head_dim 128) */
constexpr int kMinBlocksG4 = 2;

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

/* The range table in shared memory (kernel parameters addressed through a pointer are slow to
 * read in the inner loop); tables beyond the inline size stay in device memory. Every thread
 * of the block must call it (it ends with a barrier), first: it is the kernels' PDL entry. */
struct range_table {
  int64_t begin[RA_CUDA_INLINE_RANGES], start[RA_CUDA_INLINE_RANGES + 1];
};
__device__ __forceinline__ void stage_ranges(const ra_cuda_ranges &r, range_table *t, const int64_t **rbeg,
                                             const int64_t **rst) {
  ra_cuda_pdl_entry();
  const bool inl = r.d_begin == nullptr;
  if (inl && threadIdx.x <= (unsigned)r.n) {
    if (threadIdx.x < (unsigned)r.n) t->begin[threadIdx.x] = r.begin[threadIdx.x];
    t->start[threadIdx.x] = r.start[threadIdx.x];
  }
  __syncthreads();
  *rbeg = inl ? t->begin : r.d_begin;
  *rst = inl ? t->start : r.d_start;
}

/* HD: head_dim; G: register capacity in q heads (group <= G). Warp w of block (x, split)
 * is kv head x * kWarps + w. */
template <typename KT, int HD, int G> __device__ __forceinline__ void warp_body(const warp_args &a) {
  constexpr int LPT = HD / 8;       /* lanes per token: 16 bytes of the row each */
  constexpr int TPW = 32 / LPT;     /* tokens per warp and step */
  constexpr int U = G <= 4 ? 8 : 2; /* steps per round: U * 2 16-byte loads in flight per lane */
  constexpr int TW = TPW * U;       /* tokens per warp and round */

  __shared__ range_table tab;
  const int64_t *rbeg, *rst;
  stage_ranges(a.r, &tab, &rbeg, &rst);
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

/* The g4 kernel (see the top). HD: head_dim. Lane = (token slot grp, sub), sub's dims are
 * [sub * HD / 8, (sub + 1) * HD / 8). (A variant that streamed K and V through a 4-deep
 * cp.async ring in shared memory, to overlap a round's loads with the previous round's math,
 * measured slower on the H200: bench/results/defaults/README.md.) */
template <typename KT, int HD> __device__ __forceinline__ void g4_body(const warp_args &a) {
  constexpr int DPL = HD / 8;             /* dims per lane */
  constexpr int NV = DPL / 8;             /* 16-byte loads per lane and row */
  constexpr int TPS = 4;                  /* tokens per warp and step */
  constexpr int U = HD == 128 ? 2 : 4;    /* steps per round: U * NV * 2 loads in flight per lane */
  constexpr int TW = TPS * U;             /* tokens per warp and round */
  constexpr unsigned kAll = 0xffffffffu;

  __shared__ range_table tab;
  const int64_t *rbeg, *rst;
  stage_ranges(a.r, &tab, &rbeg, &rst);
  const int n_ranges = a.r.n;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = lane >> 3, sub = lane & 7;
  const bool b2 = (sub & 4) != 0, b1 = (sub & 2) != 0;
  const int g = a.group, kvh = blockIdx.x * kWarps + warp;
  if (kvh >= a.hkv) return;
  const int64_t v0 = (int64_t)blockIdx.y * a.chunk;
  const int64_t v1 = v0 + a.chunk < a.r.total ? v0 + a.chunk : a.r.total;
  const KT *kc = (const KT *)a.kc, *vc = (const KT *)a.vc;
  const int64_t row_stride = (int64_t)a.hkv * HD, lane_off = (int64_t)kvh * HD + DPL * sub;

  /* this lane's dims of the group's q heads, pre-scaled; heads >= g are zero */
  float qr[4][DPL];
#pragma unroll
  for (int h = 0; h < 4; h++)
#pragma unroll
    for (int i = 0; i < DPL; i++) qr[h][i] = h < g ? a.q[((int64_t)kvh * g + h) * HD + DPL * sub + i] * a.scale : 0.0f;
  /* m, l: head sub / 2's running max (equal in all token slots) and this slot's sum; acc: this
   * slot's o for every head, this lane's dims */
  float m = -INFINITY, l = 0.0f, acc[4][DPL];
#pragma unroll
  for (int h = 0; h < 4; h++)
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[h][i] = 0.0f;

  /* Two rounds of K and V in registers: the next round's loads go out before the current one
   * is used, so a warp waits for memory once per round only when the math is faster. */
  auto load = [&](uint4(&kr)[U][NV], uint4(&vr)[U][NV], bool(&valid)[U], int64_t b) {
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t t = b + u * TPS + grp;
      valid[u] = t < v1;
      const int64_t row = ra_cuda_range_row_in(rbeg, rst, n_ranges, valid[u] ? t : b);
#pragma unroll
      for (int j = 0; j < NV; j++) {
        kr[u][j] = __ldg((const uint4 *)(kc + row * row_stride + lane_off + 8 * j));
        vr[u][j] = __ldg((const uint4 *)(vc + row * row_stride + lane_off + 8 * j));
      }
    }
  };
  auto use = [&](const uint4(&kr)[U][NV], const uint4(&vr)[U][NV], const bool(&valid)[U]) {
    /* scores: lane sub ends with head sub / 2's q.k of its slot's token */
    float sc[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < NV; j++) {
        float kf[8];
        ra_cuda_cvt8(kr[u][j], kf, (const KT *)nullptr);
#pragma unroll
        for (int h = 0; h < 4; h++)
#pragma unroll
          for (int i = 0; i < 8; i++) d[h] = fmaf(kf[i], qr[h][8 * j + i], d[h]);
      }
      /* level 4: keep heads (2 b2, 2 b2 + 1), send the other pair; level 2: keep head
       * 2 b2 + b1; level 1: both lanes of a pair hold the same head */
      float a0 = b2 ? d[2] : d[0], a1 = b2 ? d[3] : d[1];
      const float s0 = b2 ? d[0] : d[2], s1 = b2 ? d[1] : d[3];
      a0 += __shfl_xor_sync(kAll, s0, 4);
      a1 += __shfl_xor_sync(kAll, s1, 4);
      float c = b1 ? a1 : a0;
      c += __shfl_xor_sync(kAll, b1 ? a0 : a1, 2);
      c += __shfl_xor_sync(kAll, c, 1);
      sc[u] = valid[u] ? c : -INFINITY;
    }
    /* online softmax: the round's max over the warp's token slots (token b is valid) */
    float mx = sc[0];
#pragma unroll
    for (int u = 1; u < U; u++) mx = fmaxf(mx, sc[u]);
    mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, 16));
    const float mn = fmaxf(m, mx);
    const float al = __expf(m - mn); /* 0 while m is still -inf */
    m = mn;
    float p[U];
    l *= al;
#pragma unroll
    for (int u = 0; u < U; u++) {
      p[u] = __expf(sc[u] - mn); /* -inf -> 0 */
      l += p[u];
    }
    if (__any_sync(kAll, al != 1.0f)) {
#pragma unroll
      for (int h = 0; h < 4; h++) {
        const float ah = __shfl_sync(kAll, al, 2 * h);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[h][i] *= ah;
      }
    }
    /* P V: the slot's token weight for each head from the lane that holds it */
#pragma unroll
    for (int u = 0; u < U; u++) {
      float ph[4];
#pragma unroll
      for (int h = 0; h < 4; h++) ph[h] = __shfl_sync(kAll, p[u], (grp << 3) | (2 * h));
#pragma unroll
      for (int j = 0; j < NV; j++) {
        float vf[8];
        ra_cuda_cvt8(vr[u][j], vf, (const KT *)nullptr);
#pragma unroll
        for (int h = 0; h < 4; h++)
#pragma unroll
          for (int i = 0; i < 8; i++) acc[h][8 * j + i] = fmaf(ph[h], vf[i], acc[h][8 * j + i]);
      }
    }
  };
  uint4 kA[U][NV], vA[U][NV], kB[U][NV], vB[U][NV];
  bool okA[U], okB[U];
  if (v0 < v1) load(kA, vA, okA, v0);
  for (int64_t b = v0; b < v1; b += 2 * TW) {
    if (b + TW < v1) load(kB, vB, okB, b + TW);
    use(kA, vA, okA);
    if (b + TW >= v1) break;
    if (b + 2 * TW < v1) load(kA, vA, okA, b + 2 * TW);
    use(kB, vB, okB);
  }

  /* the token slots share m: their l and o add up; slot 0 writes the kv head's partial */
  l += __shfl_xor_sync(kAll, l, 8);
  l += __shfl_xor_sync(kAll, l, 16);
  float lh[4], mh[4];
#pragma unroll
  for (int h = 0; h < 4; h++) {
    lh[h] = __shfl_sync(kAll, l, 2 * h);
    mh[h] = __shfl_sync(kAll, m, 2 * h);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
      acc[h][i] += __shfl_xor_sync(kAll, acc[h][i], 8);
      acc[h][i] += __shfl_xor_sync(kAll, acc[h][i], 16);
    }
  }
  if (grp != 0) return;
#pragma unroll
  for (int h = 0; h < 4; h++) {
    if (h >= g) break;
    const int qh = kvh * g + h;
    if (a.n_splits == 1) {
#pragma unroll
      for (int i = 0; i < DPL; i++) a.o[(int64_t)qh * HD + DPL * sub + i] = lh[h] > 0.0f ? acc[h][i] / lh[h] : 0.0f;
      if (sub == 0 && a.ml) {
        a.ml[2 * qh] = mh[h];
        a.ml[2 * qh + 1] = lh[h];
      }
    } else {
      float *po = a.part_o + ((int64_t)blockIdx.y * a.hq + qh) * HD + DPL * sub;
#pragma unroll
      for (int i = 0; i < DPL; i++) po[i] = acc[h][i];
      if (sub == 0) {
        a.part_ml[((int64_t)blockIdx.y * a.hq + qh) * 2] = mh[h];
        a.part_ml[((int64_t)blockIdx.y * a.hq + qh) * 2 + 1] = lh[h];
      }
    }
  }
}

template <typename KT, int HD, int G>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) attn_decode_warp_kernel(warp_args a) {
  warp_body<KT, HD, G>(a);
}

template <typename KT, int HD>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksG4) attn_decode_g4_kernel(warp_args a) {
  g4_body<KT, HD>(a);
}

/* Batched decode: blockIdx.z is the sequence, each over its cache rows [0, total) with its own
 * splits; blocks past a sequence's splits have nothing to do. One launch for a step's batch
 * instead of one per sequence: at 32K tokens a sequence's layer is ~40 us of DRAM time, close
 * to a launch's ramp-up and tail. */
struct batch_args {
  int hq, hkv, group;
  float scale;
  ra_cuda_decode_item it[RA_CUDA_DECODE_BATCH];
};

__device__ __forceinline__ warp_args batch_item_args(const batch_args &b) {
  const ra_cuda_decode_item &it = b.it[blockIdx.z];
  warp_args a = {};
  a.q = it.q;
  a.kc = it.kc;
  a.vc = it.vc;
  a.hq = b.hq;
  a.hkv = b.hkv;
  a.group = b.group;
  a.scale = b.scale;
  a.r.n = 1;
  a.r.total = it.total;
  a.r.start[1] = it.total;
  a.chunk = it.chunk;
  a.n_splits = it.n_splits;
  a.part_o = it.part_o;
  a.part_ml = it.part_ml;
  a.o = it.o;
  a.ml = it.ml;
  return a;
}

template <typename KT, int HD, int G>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) attn_decode_warp_batch_kernel(const __grid_constant__ batch_args b) {
  if ((int)blockIdx.y >= b.it[blockIdx.z].n_splits) return;
  warp_body<KT, HD, G>(batch_item_args(b));
}

template <typename KT, int HD>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocksG4) attn_decode_g4_batch_kernel(const __grid_constant__ batch_args b) {
  if ((int)blockIdx.y >= b.it[blockIdx.z].n_splits) return;
  g4_body<KT, HD>(batch_item_args(b));
}

template <typename KT, int HD>
cudaError_t launch_batch_hd(cudaStream_t s, dim3 grid, const batch_args &b) {
  if (b.group <= 4) return ra_cuda_launch(attn_decode_g4_batch_kernel<KT, HD>, grid, kWarps * 32, 0, s, b);
  return ra_cuda_launch(attn_decode_warp_batch_kernel<KT, HD, 8>, grid, kWarps * 32, 0, s, b);
}

bool warp_kernel_fits(int group, int hd, int kv_dtype) {
  return (kv_dtype == RA_DTYPE_F16 || kv_dtype == RA_DTYPE_BF16) && (hd == 64 || hd == 128) && group >= 1 &&
         group <= 8;
}

template <typename KT, int HD>
cudaError_t launch_hd(cudaStream_t s, dim3 grid, const warp_args &a) {
  if (a.group <= 4) return ra_cuda_launch(attn_decode_g4_kernel<KT, HD>, grid, kWarps * 32, 0, s, a);
  return ra_cuda_launch(attn_decode_warp_kernel<KT, HD, 8>, grid, kWarps * 32, 0, s, a);
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
  /* the warp kernels: one warp per kv head and split, as many as fit an SM at once (8 for g4,
   * 12 for g8: one wave; a second wave of short warps measured slower), at least 32 tokens
   * each; the split kernel: ~4 blocks per SM, at least two 32-token tiles each; at most
   * RA_CUDA_MAX_SPLITS splits */
  const bool warp = warp_kernel_fits(group, hd, kv_dtype);
  const int64_t unit = warp ? 32 : 64;
  const int per_sm = warp ? (group <= 4 ? kWarps * kMinBlocksG4 : kWarps * kMinBlocks) : 4;
  const int64_t want = ((int64_t)per_sm * (n_sm > 0 ? n_sm : 1) + hkv - 1) / hkv;
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

int ra_cuda_decode_batch_ok(int group, int hd, int kv_dtype) { return warp_kernel_fits(group, hd, kv_dtype); }

cudaError_t ra_cuda_attn_decode_batch(cudaStream_t s, int kv_dtype, int hq, int hkv, int hd, float scale,
                                      const ra_cuda_decode_item *items, int n) {
  if (n < 1 || n > RA_CUDA_DECODE_BATCH || !warp_kernel_fits(hq / hkv, hd, kv_dtype)) return cudaErrorInvalidValue;
  batch_args b = {};
  b.hq = hq;
  b.hkv = hkv;
  b.group = hq / hkv;
  b.scale = scale;
  int max_splits = 0, reduce = 0;
  for (int i = 0; i < n; i++) {
    if (items[i].n_splits < 1) return cudaErrorInvalidValue;
    b.it[i] = items[i];
    max_splits = items[i].n_splits > max_splits ? items[i].n_splits : max_splits;
    reduce |= items[i].n_splits > 1;
  }
  const dim3 grid((unsigned)((hkv + kWarps - 1) / kWarps), (unsigned)max_splits, (unsigned)n);
  cudaError_t e = kv_dtype == RA_DTYPE_F16 ? (hd == 64 ? launch_batch_hd<__half, 64>(s, grid, b)
                                                       : launch_batch_hd<__half, 128>(s, grid, b))
                                           : (hd == 64 ? launch_batch_hd<__nv_bfloat16, 64>(s, grid, b)
                                                       : launch_batch_hd<__nv_bfloat16, 128>(s, grid, b));
  if (e != cudaSuccess || !reduce) return e;
  return ra_cuda_attn_reduce_batch(s, items, n, hq, hd);
}
