#include "model_bf16.h"

static int to_bf16(ra_backend *be, ra_tensor *t, ra_error *err) {
  if (!t->data || t->ndim != 2 || t->shape[0] <= 1 || t->dtype == RA_DTYPE_BF16) return RA_OK;
  ra_tensor b;
  int rc = ra_tensor_new(be, &b, RA_DTYPE_BF16, 2, t->shape, err);
  if (rc) return rc;
  if ((rc = be->ops->copy(be, &b, 0, t, 0, ra_tensor_nelem(t), err))) {
    ra_tensor_free(&b);
    return rc;
  }
  ra_tensor_free(t);
  *t = b;
  return RA_OK;
}

int ra_cuda_model_to_bf16(ra_model *m, ra_error *err) {
  int rc;
  if ((rc = to_bf16(m->be, &m->tok_embd, err)) || (rc = to_bf16(m->be, &m->output, err))) return rc;
  for (int l = 0; l < m->cfg.n_layers; l++) {
    ra_layer_weights *w = &m->layers[l];
    ra_tensor *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
      if ((rc = to_bf16(m->be, all[i], err))) return ra_error_wrap(err, "layer %d", l);
  }
  return RA_OK;
}
