/* CUDA implementation of the backend ops table (backend.h).
 *
 * One device, one non-blocking stream and one cuBLAS handle per backend; every op is issued on
 * that stream, so ops run in call order and download()/sync() are the only host waits (plus
 * host-to-device copies from pageable memory, which CUDA orders after queued work).
 * Storage choices:
 *   - load_weight keeps matrices as BF16 (GGUF quant types are dequantized on the device);
 *     1-row weights (norms, biases) stay F32 since element-wise ops read them at full precision.
 *   - matmul: up to RA_CUDA_GEMV_MAX_X tokens (a decode step) run a bandwidth-bound GEMV over
 *     the weights; up to RA_CUDA_MMA_MAX_X (a batched step) a bandwidth-bound mma.sync kernel
 *     with x rounded to BF16; more tokens go to cublasGemmEx with BF16 inputs and FP32
 *     accumulation.
 *   - attn_prefill is a flash-attention kernel on tensor cores (BF16 operands for a BF16 cache,
 *     F16 otherwise; FP32 accumulation and softmax) for head_dim 64 and 128: warpgroup MMA
 *     (wgmma) on sm_90 for BF16/F16 caches, mma.sync elsewhere and for F32 caches; other head
 *     dims use a CUDA-core kernel.
 * This header exposes no CUDA type, so C code includes it freely. */
#ifndef RA_BACKEND_CUDA_H
#define RA_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of x that matmul's GEMV takes (bench/results/h200/gemv-rows/); up to RA_CUDA_MMA_MAX_X
 * can take the tensor-core kernel of a few rows, up to RA_CUDA_MMA_DEFAULT_X do by default (on
 * the H200 it streams the weights faster than cuBLAS up to 10 rows, ties at 11 and trails from
 * 12: gemv-rows/cuda-bench-057e4e6.json); more go to cuBLAS. */
#define RA_CUDA_GEMV_MAX_X 3
#define RA_CUDA_MMA_MAX_X 16
#define RA_CUDA_MMA_DEFAULT_X 10

/* Creates the CUDA backend on cfg->device (0 when cfg is NULL). RA_EUNAVAIL when there is no
 * usable device (no driver, no GPU, bad ordinal); err says which. */
int ra_backend_cuda_create(const ra_backend_config *cfg, ra_backend **out, ra_error *err);

/* Describes the backend's device: name (e.g. "NVIDIA H200"), SM count and memory size. */
int ra_backend_cuda_device_info(ra_backend *be, char *name, size_t name_len, int *n_sm, size_t *mem_bytes,
                                ra_error *err);

/* Programmatic dependent launch of the decode kernels (sm_90+: on by default there): each may
 * be scheduled while the kernel before it finishes. Process-wide; off gives the plain launch
 * order, for measuring what PDL buys. RA_EUNSUPPORTED to turn it on before sm_90. */
int ra_backend_cuda_set_pdl(ra_backend *be, int on, ra_error *err);

/* Rows of x up to which matmul takes the GEMV (1 .. RA_CUDA_GEMV_MAX_X, the default); more go to
 * cuBLAS. For measuring one path against the other. */
int ra_backend_cuda_set_gemv_rows(ra_backend *be, int max_rows, ra_error *err);

/* Rows of x up to which matmul and the fused norm + matmul ops take the tensor-core kernel of a
 * few rows (up to RA_CUDA_MMA_MAX_X; RA_CUDA_MMA_DEFAULT_X by default; 0: none) past the GEMV's;
 * more go to cuBLAS. For
 * measuring one path against the other. */
int ra_backend_cuda_set_mma_rows(ra_backend *be, int max_rows, ra_error *err);

/* attn_decode_batch of several sequences splits each one's tokens so that the launch holds about
 * `waves` x (resident warps per SM x SMs) warps in all (bench/results/h200/decode-batch/). For
 * measuring one setting against another. */
#define RA_CUDA_DECODE_BATCH_WAVES 1
#define RA_CUDA_DECODE_BATCH_MAX_WAVES 16
int ra_backend_cuda_set_decode_batch_waves(ra_backend *be, int waves, ra_error *err);

/* attn_prefill's kernels: AUTO takes the wgmma kernel where it applies (sm_90 devices), MMA
 * never does (the mma.sync kernel instead), for measuring one against the other. Process-wide,
 * like set_pdl; RA_EUNSUPPORTED for an unknown mode. */
enum { RA_CUDA_PREFILL_AUTO = 0, RA_CUDA_PREFILL_MMA = 1 };
int ra_backend_cuda_set_prefill_kernel(ra_backend *be, int mode, ra_error *err);
/* The kernel attn_prefill runs for this geometry (keys: pos0 + n) under the current setting, on
 * the calling thread's current device: "wgmma", "mma" or "cuda-cores". */
const char *ra_backend_cuda_prefill_kernel(ra_backend *be, int hq, int hkv, int hd, ra_dtype kv_dtype, int64_t n_keys);

/* Makes the backend's device current for the calling thread (a tensor-parallel rank's thread
 * issues every op of its backend; CUDA's current device is per thread). */
int ra_backend_cuda_bind(ra_backend *be, ra_error *err);
/* The backend's device ordinal, and its stream as a cudaStream_t (for NCCL on the same order). */
int ra_backend_cuda_device(ra_backend *be);
void *ra_backend_cuda_stream(ra_backend *be);

/* Event timing on the backend's stream: start records an event, stop records another, waits
 * for it and returns the milliseconds between the two. */
typedef struct ra_cuda_timer ra_cuda_timer;
int ra_cuda_timer_create(ra_backend *be, ra_cuda_timer **out, ra_error *err);
int ra_cuda_timer_start(ra_cuda_timer *t, ra_error *err);
int ra_cuda_timer_stop(ra_cuda_timer *t, float *ms, ra_error *err);
void ra_cuda_timer_destroy(ra_cuda_timer *t);

#ifdef __cplusplus
}
#endif

#endif
