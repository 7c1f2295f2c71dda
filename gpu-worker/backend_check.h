/* The ops table's argument contract (backend.h), checked the same way by every backend, so the
 * CPU and CUDA backends refuse the same calls with the same RA_EINVAL. be_name ("cpu", "cuda")
 * and op prefix the messages. A backend adds only what its kernels need beyond the contract. */
#ifndef RA_BACKEND_CHECK_H
#define RA_BACKEND_CHECK_H

#include "backend.h"

/* t is allocated and of dtype dt. */
int ra_backend_check_dtype(const char *be_name, const ra_tensor *t, ra_dtype dt, const char *op,
                           const char *name, ra_error *err);

/* q [n, n_q_heads, head_dim] and out (as many elements) F32; k/v caches [n_ctx, n_kv_heads,
 * head_dim] with n_kv_heads dividing n_q_heads; positions [pos0, pos0 + n) inside both caches. */
/* set_rows: table a tensor, src [>= n, last_dim(table)] F32, ids in [0, rows of table). */
int ra_backend_check_set_rows(const char *be_name, const ra_tensor *table, const int32_t *ids, int64_t n,
                              const ra_tensor *src, ra_error *err);
int ra_backend_check_attn_prefill(const char *be_name, const ra_tensor *q, const ra_tensor *kc,
                                  const ra_tensor *vc, int64_t pos0, const ra_tensor *out,
                                  ra_error *err);

/* q [.., head_dim] (n_q_heads rows), o as many and ml [n_q_heads, 2], all F32; caches as for
 * prefill; every range inside the shorter cache. */
int ra_backend_check_attn_decode(const char *be_name, const ra_tensor *q, const ra_tensor *kc,
                                 const ra_tensor *vc, const ra_token_range *ranges, int n_ranges,
                                 const ra_tensor *o, const ra_tensor *ml, ra_error *err);
/* attn_decode_batch: at least one item, each a valid attn_decode over [0, n), all with item 0's
 * geometry and cache dtype. */
int ra_backend_check_attn_decode_batch(const char *be_name, const ra_attn_decode_item *items, int n_items,
                                       ra_error *err);

/* o_acc, ml_acc, o, ml all F32; ml and ml_acc [n_heads, 2]; o and o_acc as many elements, a
 * whole number per head. */
int ra_backend_check_attn_merge(const char *be_name, const ra_tensor *o_acc, const ra_tensor *ml_acc,
                                const ra_tensor *o, const ra_tensor *ml, ra_error *err);

#endif
