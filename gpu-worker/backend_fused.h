/* The fused ops of the ops table (backend.h) as sequences of its basic ops: the definition a
 * fused implementation must match, and the implementation of a backend that does not fuse
 * (CPU) or of shapes a backend's fusion does not cover. */
#ifndef RA_BACKEND_FUSED_H
#define RA_BACKEND_FUSED_H

#include "backend.h"

int ra_backend_seq_norm_matmul(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                               int n_out, const ra_tensor *const *w, const ra_tensor *const *bias, ra_tensor *const *y,
                               ra_error *err);
int ra_backend_seq_norm_swiglu(ra_backend *be, const ra_tensor *x, const ra_tensor *norm_w, float eps, ra_tensor *xn,
                               const ra_tensor *w_gate, const ra_tensor *w_up, ra_tensor *up, ra_tensor *out,
                               ra_error *err);
int ra_backend_seq_rope_store(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v, int64_t pos0, int n_rot,
                              float theta, ra_rope_style style, ra_tensor *k_cache, ra_tensor *v_cache, int64_t row,
                              ra_error *err);
int ra_backend_seq_rope_store_batch(ra_backend *be, ra_tensor *q, ra_tensor *k, const ra_tensor *v,
                                    const ra_rope_store_item *items, int n_items, int n_rot, float theta,
                                    ra_rope_style style, ra_error *err);
/* Every item checked (backend_check_wave.h), then wave_select item by item. */
int ra_backend_seq_wave_select_batch(ra_backend *be, const ra_wave_select_item *items, int n_items, float scale,
                                     ra_error *err);

#endif
