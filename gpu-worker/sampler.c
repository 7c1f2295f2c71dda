#include "sampler.h"

#include <math.h>

void ra_sampler_init(ra_sampler *s, float temperature, float top_p, uint64_t seed) {
  s->temperature = temperature;
  s->top_p = top_p > 0.0f && top_p <= 1.0f ? top_p : 1.0f;
  s->rng = seed ? seed : 0x853c49e6748fea9bull;
}

float ra_sampler_uniform(ra_sampler *s) {
  /* xorshift64* */
  s->rng ^= s->rng >> 12;
  s->rng ^= s->rng << 25;
  s->rng ^= s->rng >> 27;
  return (float)((s->rng * 0x2545f4914f6cdd1dull) >> 40) * 0x1p-24f;
}

int32_t ra_sampler_pick(ra_sampler *s, const float *vals, const int32_t *ids, int n) {
  if (s->temperature <= 0.0f || n == 1) return ids[0];
  /* softmax over candidates at temperature T; probabilities are relative to the best */
  double total = 0.0;
  for (int i = 0; i < n; i++) total += exp((double)(vals[i] - vals[0]) / s->temperature);
  /* nucleus: the shortest prefix whose mass reaches top_p */
  double mass = 0.0;
  int keep = n;
  for (int i = 0; i < n; i++) {
    mass += exp((double)(vals[i] - vals[0]) / s->temperature) / total;
    if (mass >= s->top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0.0;
  for (int i = 0; i < keep; i++) kept += exp((double)(vals[i] - vals[0]) / s->temperature);
  double r = ra_sampler_uniform(s) * kept;
  for (int i = 0; i < keep; i++) {
    r -= exp((double)(vals[i] - vals[0]) / s->temperature);
    if (r < 0.0) return ids[i];
  }
  return ids[keep - 1];
}
