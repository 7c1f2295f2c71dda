/* qk-synth: writes a synthetic Q/K dump (qkdump.h's format) whose queries are out of the keys'
 * distribution the way real attention's are, to develop and benchmark indexes before real model
 * dumps exist.
 *
 * Model. One "text" for all layers: a stream of topic segments (lengths uniform in [64, 448]);
 * a segment revisits an earlier topic with probability 1/2, else opens a new one; token content
 * z_t = mu_topic(t) + 0.7 eps in R^r, r = D/4. Per layer and kv head g (RoPE pairs (i, i + D/2),
 * frequency theta^(-2i/D), theta = 1e5 as SmolLM2; "low-frequency" pairs barely turn over 32K):
 *   keys     k_t = RoPE_t(c_g + s_k * (P_g z_t) + 0.25 eps)
 *            c_g: a large shared offset on the low-frequency pairs (as real keys' bias);
 *            s_k: per-dimension scale, high-frequency pairs damped to 0.3, two low-frequency
 *            outlier pairs x6 ("massive activations");
 *            2 % of tokens (delimiters) add 3 u_g: heavy hitters many queries attend to;
 *            tokens 0..3 are sinks: c_g + 8 u_g.
 *   queries  q_t = RoPE_t(b_h + s_q * (Q_h y_t) + 0.25 eps) for query head h of group g, where
 *            y_t is what token t looks for: its own topic's mean (p = 0.6) or the content of a
 *            uniformly chosen earlier token (a retrieval), plus noise;
 *            Q_h = P_g (I + 0.6 G_h) + 0.5 N_h: the key subspace mixed and partly left (G_h, N_h
 *            Gaussian), b_h an offset of its own with a component along u_g, s_q its own scales.
 *   decode   queries of positions N .. N + Nd - 1, same process.
 *   values   v_t = W_g z_t + 0.5 eps (W_g Gaussian): what a token carries follows its content.
 * Key-key inner products are dominated by c_g, the outlier pairs and the heavy hitters, while
 * q·k ranks keys by a bilinear form in z: key-key neighborhoods are not query-key ones. */
#include "npy.h"
#include "qkdump.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
  uint64_t s;
} rng;

static uint64_t next_u64(rng *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double unif(rng *r) { return ((double)(next_u64(r) >> 11) + 0.5) / 9007199254740992.0; }
static float gauss(rng *r) {
  return (float)(sqrt(-2.0 * log(unif(r))) * cos(6.283185307179586 * unif(r)));
}
static uint32_t below(rng *r, uint32_t n) { return (uint32_t)(unif(r) * n) % n; }

typedef struct {
  const char *out;
  uint32_t tokens, decode;
  int layers, q_heads, kv_heads, dim;
  uint64_t seed;
  ra_dtype dtype;
} opts;

static void usage(void) {
  fprintf(stderr,
          "usage: qk-synth --out DIR --tokens N [--layers L] [--q-heads H] [--kv-heads G]\n"
          "                [--head-dim D] [--seed S] [--decode N] [--dtype f16|f32]\n"
          "defaults: 1 layer, 9 q heads, 3 kv heads, head_dim 64 (SmolLM2-135M), seed 1, f16\n");
}

/* x (D floats) rotated by RoPE at position t, NeoX pairing (i, i + D/2). */
static void rope(float *x, int D, uint32_t t, const double *freq) {
  for (int i = 0; i < D / 2; i++) {
    double a = (double)t * freq[i], c = cos(a), s = sin(a);
    float x0 = x[i], x1 = x[i + D / 2];
    x[i] = (float)(x0 * c - x1 * s);
    x[i + D / 2] = (float)(x0 * s + x1 * c);
  }
}

static int write_rows(const opts *o, const char *what, int layer, int head, const float *x,
                      uint32_t rows) {
  char path[4096];
  ra_error err;
  ra_qk_path(path, sizeof path, o->out, what, layer, head);
  if (ra_npy_write_f32(path, o->dtype, rows, (uint64_t)o->dim, x, &err)) {
    fprintf(stderr, "qk-synth: %s\n", err.msg);
    return 1;
  }
  return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  o->layers = 1;
  o->q_heads = 9;
  o->kv_heads = 3;
  o->dim = 64;
  o->seed = 1;
  o->dtype = RA_DTYPE_F16;
  /* Every option takes a value: options stand at odd indices, values after them. */
  for (int i = 1; i < argc; i += 2) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return -1;
    if (!strcmp(a, "--out")) o->out = v;
    else if (!strcmp(a, "--tokens")) o->tokens = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--decode")) o->decode = (uint32_t)strtoul(v, NULL, 10);
    else if (!strcmp(a, "--layers")) o->layers = atoi(v);
    else if (!strcmp(a, "--q-heads")) o->q_heads = atoi(v);
    else if (!strcmp(a, "--kv-heads")) o->kv_heads = atoi(v);
    else if (!strcmp(a, "--head-dim")) o->dim = atoi(v);
    else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--dtype")) {
      if (ra_dtype_parse(v, &o->dtype) || (o->dtype != RA_DTYPE_F32 && o->dtype != RA_DTYPE_F16)) return -1;
    } else {
      return -1;
    }
  }
  if (!o->out || o->tokens < 8 || o->layers < 1 || o->q_heads < 1 || o->kv_heads < 1 ||
      o->q_heads % o->kv_heads || o->dim < 8 || o->dim % 4 || o->dim > 1024)
    return -1;
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse_args(argc, argv, &o)) {
    usage();
    return 2;
  }
  if (mkdir(o.out, 0755) && errno != EEXIST) {
    fprintf(stderr, "qk-synth: %s: %s\n", o.out, strerror(errno));
    return 1;
  }
  const int D = o.dim, r = D / 4, G = o.q_heads / o.kv_heads;
  const uint32_t N = o.tokens, T = o.tokens + o.decode;
  rng R = {o.seed}, RV = {o.seed ^ 0x76616C7565730000ull};
  enum { MAX_TOPICS = 4096 };
  double *freq = malloc((size_t)D / 2 * sizeof *freq);
  float *mu = malloc((size_t)MAX_TOPICS * r * sizeof *mu);
  uint32_t *topic = malloc((size_t)T * sizeof *topic);
  float *z = malloc((size_t)T * r * sizeof *z);
  float *y = malloc((size_t)T * r * sizeof *y);
  uint8_t *heavy = malloc(T);
  float *out = malloc((size_t)T * D * sizeof *out);
  float *P = malloc((size_t)D * r * sizeof *P), *Q = malloc((size_t)D * r * sizeof *Q);
  float *Gm = malloc((size_t)r * r * sizeof *Gm);
  float *c = malloc((size_t)D * sizeof *c), *u = malloc((size_t)D * sizeof *u);
  float *sk = malloc((size_t)D * sizeof *sk), *sq = malloc((size_t)D * sizeof *sq);
  float *b = malloc((size_t)D * sizeof *b);
  uint8_t *nuis = malloc((size_t)D);
  if (!freq || !mu || !topic || !z || !y || !heavy || !out || !P || !Q || !Gm || !c ||
      !u || !sk || !sq || !b || !nuis) {
    fprintf(stderr, "qk-synth: out of memory\n");
    return 1;
  }
  for (int i = 0; i < D / 2; i++) freq[i] = pow(1e5, -2.0 * i / D);

  /* The text: topic segments, token contents, what each token looks for, heavy hitters. */
  uint32_t n_topics = 0;
  for (uint32_t t = 0; t < T;) {
    uint32_t len = 64 + below(&R, 385), tp;
    if (n_topics > 0 && (unif(&R) < 0.5 || n_topics == MAX_TOPICS)) {
      tp = below(&R, n_topics);
    } else {
      tp = n_topics++;
      for (int j = 0; j < r; j++) mu[(size_t)tp * r + j] = gauss(&R);
    }
    for (uint32_t e = t + len; t < e && t < T; t++) topic[t] = tp;
  }
  for (uint32_t t = 0; t < T; t++) {
    for (int j = 0; j < r; j++)
      z[(size_t)t * r + j] = 0.6f * mu[(size_t)topic[t] * r + j] + 0.8f * gauss(&R);
    heavy[t] = unif(&R) < 0.02;
  }
  for (uint32_t t = 0; t < T; t++) {
    int own = t == 0 || unif(&R) < 0.6;
    const float *src = own ? mu + (size_t)topic[t] * r : z + (size_t)below(&R, t) * r;
    for (int j = 0; j < r; j++) y[(size_t)t * r + j] = src[j] + 0.3f * gauss(&R);
  }

  /* Low-frequency pairs are the upper half of i < D/2 (freq falls with i). */
  for (int L = 0; L < o.layers; L++) {
    for (int g = 0; g < o.kv_heads; g++) {
      for (int i = 0; i < D * r; i++) P[i] = gauss(&R) / sqrtf((float)r);
      for (int i = 0; i < D; i++) {
        int pair = i % (D / 2), low = pair >= D / 4;
        nuis[i] = !low;
        sk[i] = low ? 1.0f : 0.3f;
        c[i] = low ? 2.5f * gauss(&R) : 0.3f * gauss(&R);
        u[i] = low ? gauss(&R) : 0.0f;
      }
      for (int k = 0; k < 2; k++) { /* two outlier pairs among the low frequencies */
        int pair = D / 4 + (int)below(&R, (uint32_t)(D / 4));
        sk[pair] *= 6.0f;
        sk[pair + D / 2] *= 6.0f;
        c[pair] *= 3.0f;
      }
      float un = 0.0f;
      for (int i = 0; i < D; i++) un += u[i] * u[i];
      for (int i = 0; i < D; i++) u[i] /= sqrtf(un);
      for (uint32_t t = 0; t < N; t++) {
        float *k = out + (size_t)t * D;
        for (int i = 0; i < D; i++) {
          float s = 0.0f;
          for (int j = 0; j < r; j++) s += P[(size_t)i * r + j] * z[(size_t)t * r + j];
          k[i] = c[i] + sk[i] * s + (nuis[i] ? 2.0f : 0.25f) * gauss(&R);
          if (t < 4) k[i] = c[i] + 8.0f * u[i];
          else if (heavy[t]) k[i] += 3.0f * u[i];
        }
        rope(k, D, t, freq);
      }
      if (write_rows(&o, "k", L, g, out, N)) return 1;
      /* values v_t = W z_t + 0.5 eps (W Gaussian [D, r], in Q's room until the queries), from
       * their own stream so that the keys and queries of a seed do not depend on them */
      for (int i = 0; i < D * r; i++) Q[i] = gauss(&RV) / sqrtf((float)r);
      for (uint32_t t = 0; t < N; t++)
        for (int i = 0; i < D; i++) {
          float s = 0.0f;
          for (int j = 0; j < r; j++) s += Q[(size_t)i * r + j] * z[(size_t)t * r + j];
          out[(size_t)t * D + i] = s + 0.5f * gauss(&RV);
        }
      if (write_rows(&o, "v", L, g, out, N)) return 1;

      for (int hh = 0; hh < G; hh++) {
        int h = g * G + hh;
        for (int i = 0; i < r * r; i++) Gm[i] = 0.6f * gauss(&R) / sqrtf((float)r);
        for (int i = 0; i < r; i++) Gm[i * r + i] += 1.0f;
        for (int i = 0; i < D; i++) {
          for (int j = 0; j < r; j++) {
            float s = 0.0f;
            for (int l = 0; l < r; l++) s += P[(size_t)i * r + l] * Gm[l * r + j];
            Q[(size_t)i * r + j] = s + 0.5f * gauss(&R) / sqrtf((float)r);
          }
          sq[i] = nuis[i] ? 0.15f : 0.5f + (float)unif(&R);
          b[i] = 1.5f * gauss(&R) + 2.0f * u[i];
        }
        for (uint32_t t = 0; t < T; t++) {
          float *q = out + (size_t)t * D;
          for (int i = 0; i < D; i++) {
            float s = 0.0f;
            for (int j = 0; j < r; j++) s += Q[(size_t)i * r + j] * y[(size_t)t * r + j];
            q[i] = b[i] + sq[i] * s + 0.25f * gauss(&R);
          }
          rope(q, D, t, freq);
        }
        if (write_rows(&o, "q", L, h, out, N)) return 1;
        if (o.decode && write_rows(&o, "qdec", L, h, out + (size_t)N * D, o.decode)) return 1;
      }
    }
  }
  ra_qk_meta m = {.layers = o.layers, .q_heads = o.q_heads, .kv_heads = o.kv_heads,
                  .head_dim = D, .n_tokens = N, .n_decode = o.decode, .rope_applied = 1};
  snprintf(m.model, sizeof m.model, "synthetic");
  char extra[128];
  snprintf(extra, sizeof extra, "\"generator\": \"qk-synth\", \"seed\": %llu",
           (unsigned long long)o.seed);
  ra_error err;
  if (ra_qk_meta_write(o.out, &m, o.dtype == RA_DTYPE_F16 ? "float16" : "float32", extra, &err)) {
    fprintf(stderr, "qk-synth: %s\n", err.msg);
    return 1;
  }
  printf("qk-synth: wrote %s: %d layers, %d q heads, %d kv heads, dim %d, %u tokens, %u decode\n",
         o.out, o.layers, o.q_heads, o.kv_heads, D, N, o.decode);
  free(freq);
  free(mu);
  free(topic);
  free(z);
  free(y);
  free(heavy);
  free(out);
  free(P);
  free(Q);
  free(Gm);
  free(c);
  free(u);
  free(sk);
  free(sq);
  free(b);
  free(nuis);
  return 0;
}
