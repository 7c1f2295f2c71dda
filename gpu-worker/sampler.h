/* Token sampling over candidate logits (the top-k of a row, descending, from the backend's
 * topk_rows): greedy, or temperature + nucleus (top-p) sampling with a seeded PRNG. */
#ifndef RA_SAMPLER_H
#define RA_SAMPLER_H

#include <stdint.h>

typedef struct ra_sampler {
  float temperature; /* <= 0: greedy */
  float top_p;       /* keep the smallest prefix of candidates with probability mass >= top_p */
  uint64_t rng;      /* xorshift state; any seed (0 is remapped) */
} ra_sampler;

void ra_sampler_init(ra_sampler *s, float temperature, float top_p, uint64_t seed);
/* A uniform float in [0, 1) from the sampler's PRNG. */
float ra_sampler_uniform(ra_sampler *s);
/* Picks one of n candidates (vals descending, ids parallel); n >= 1. */
int32_t ra_sampler_pick(ra_sampler *s, const float *vals, const int32_t *ids, int n);

#endif
