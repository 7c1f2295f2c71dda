/* Random models in BF16: ra_model_random allocates F32 weights (what the CPU backend wants);
 * on CUDA the weights of real models are BF16 (load_weight), so tests and benchmarks convert
 * the random matrices to BF16 on the device to run the same kernels as a loaded model. */
#ifndef RA_CUDA_MODEL_BF16_H
#define RA_CUDA_MODEL_BF16_H

#include "model.h"

/* Replaces every weight matrix of m (2-D, more than one row) by a BF16 copy on m->be, one at
 * a time (peak memory: the F32 model plus one BF16 matrix). Vectors (norms, biases) stay F32. */
int ra_cuda_model_to_bf16(ra_model *m, ra_error *err);

#endif
