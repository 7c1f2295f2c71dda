/* The accuracy runner: ONE prefill per sample, then the answer decoded greedily in every
 * requested attention mode, scored by exact match; and the teacher-forced text-fidelity
 * measurement.
 *
 * Per sample: a full-attention prefill on an ordinary state, captured (prefill_capture.h); full
 * mode decodes on that state; every other mode gets a fresh runtime seeded from the capture
 * (ra_offload_seed: K/V to a new store session, kNN of the captured queries on the backend,
 * index build) and decodes from there. The transformer runs over the prompt once. */
#ifndef RA_ACC_RUNNER_H
#define RA_ACC_RUNNER_H

#include "offload.h"
#include "tasks.h"

#include <stdio.h>

/* A run's modes: each attention mode, with and without --retro */
#define RA_ACC_MAX_MODES (2 * RA_MODE_COUNT)
#define RA_ACC_MAX_AXIS 16
#define RA_ACC_LABEL_MAX 32

typedef struct ra_acc_config {
  ra_acc_task tasks[RA_ACC_N_TASKS];
  int n_tasks;
  int lengths[RA_ACC_MAX_AXIS]; /* target prompt tokens */
  int n_lengths;
  double depths[RA_ACC_MAX_AXIS]; /* of the target needle (tasks without one run once per length) */
  int n_depths;
  int samples;                  /* per (task, length, depth) */
  uint64_t seed;
  ra_mode modes[RA_ACC_MAX_MODES]; /* full must be first: it is the reference */
  uint32_t retro[RA_ACC_MAX_MODES]; /* per mode: its retrospective correction window (0: off) */
  int n_modes;
  ra_offload_config off;        /* sink, window, top_k, ef, nprobe, knn_nq, build_queries, dtypes */
  const ra_offload_plan *plan;  /* the stores; NULL when only full / streaming run */
  FILE *jsonl;                  /* optional: one JSON object per sample, written as it finishes */
  FILE *log;                    /* optional: a progress line per sample */
} ra_acc_config;

typedef struct ra_acc_mode_result {
  char output[512]; /* the decoded answer (truncated) */
  double score;     /* fraction of expected values found */
  int items[RA_ACC_MAX_VALUES]; /* per expected value: found (in its own answer, if sequential) */
  int n_items;
  uint64_t retro_rows; /* retro: supplementary rows over the decode, all layers */
  double seed_s;    /* seeding the mode's runtime from the capture: K/V puts, kNN, index build */
  double decode_s;  /* the greedy decode */
  int n_generated;
} ra_acc_mode_result;

typedef struct ra_acc_record {
  ra_acc_task task;
  int length;        /* target */
  int n_tokens;      /* actual */
  double depth;      /* -1 for tasks without one */
  int depth_index;   /* into cfg.depths; 0 for tasks without one */
  int sample;
  int64_t needle_token; /* where the target needle starts; -1 without one */
  double prefill_s;
  ra_acc_mode_result modes[RA_ACC_MAX_MODES]; /* parallel to cfg.modes */
} ra_acc_record;

typedef struct ra_acc_results {
  ra_acc_record *recs;
  size_t n, cap;
} ra_acc_results;

/* A --modes entry: NAME or NAME+retroW (the mode with --retro W). 0 or RA_EINVAL. */
int ra_acc_mode_parse(const char *spec, ra_mode *mode, uint32_t *retro);
/* A mode as its --modes entry is written ("flat", "flat+retro2"): the key in the reports. */
const char *ra_acc_mode_label(ra_mode mode, uint32_t retro, char out[RA_ACC_LABEL_MAX]);

/* Validates the modes (full first and once, stores for the store modes, retro only for the
 * modes that take it, no entry twice); ra_acc_run also wants non-empty axes. */
int ra_acc_config_check(const ra_acc_config *cfg, ra_error *err);

/* One sample in every mode of cfg; rec->modes follow cfg->modes. */
int ra_acc_run_sample(const ra_model *m, const ra_tokenizer *tok, const ra_acc_config *cfg,
                      const ra_acc_sample *s, ra_acc_record *rec, ra_error *err);

/* The whole sweep: tasks x lengths x depths x samples (appends to out). */
int ra_acc_run(const ra_model *m, const ra_tokenizer *tok, const ra_acc_corpus *corpus, const ra_acc_config *cfg,
               ra_acc_results *out, ra_error *err);
void ra_acc_results_free(ra_acc_results *r);
/* Appends the records of a samples.jsonl (a finished or interrupted run) to out; cfg gives the
 * run's depths and modes, in order (a record without one of them is an error). */
int ra_acc_results_read(const char *path, const ra_acc_config *cfg, ra_acc_results *out, ra_error *err);

/* Text fidelity, per mode: teacher-forced decode of n_forced tokens of natural text after a
 * prompt of n_prompt tokens (one captured prefill), against full attention at every step. */
typedef struct ra_acc_fidelity {
  ra_mode mode;
  uint32_t retro;     /* the mode's --retro window */
  int positions;
  double top1;        /* fraction of steps whose argmax equals full's */
  double kl_mean;     /* mean KL(full || mode) of the next-token distributions */
  double *att_rel;    /* [n_layers]: mean ||att_mode - att_full|| / ||att_full|| of the layer's
                         attention output [n_heads, head_dim]; errors of earlier layers propagate */
  int n_layers;
} ra_acc_fidelity;

/* out: [cfg->n_modes - 1], the modes after full. ids: at least n_prompt + n_forced tokens. With
 * self_forced, ids[n_prompt ..] are overwritten with full attention's own greedy continuation
 * (no stop token), which every mode is then forced along: fidelity over generated text. */
int ra_acc_fidelity_run(const ra_model *m, const ra_acc_config *cfg, int32_t *ids, int n_prompt, int n_forced,
                        int self_forced, ra_acc_fidelity *out, ra_error *err);
void ra_acc_fidelity_free(ra_acc_fidelity *f);
/* Reads a fidelity.json (as accuracy-bench writes it) into out [cfg->n_modes - 1], in cfg's mode
 * order after full; *prompt and *forced from its entries. A mode of cfg missing from the file,
 * or of another layer count, is an error. */
int ra_acc_fidelity_read(const char *path, const ra_acc_config *cfg, int n_layers, ra_acc_fidelity *out,
                         uint32_t *prompt, uint32_t *forced, ra_error *err);

/* KL(p || q) of two logit vectors and whether their argmax agree. */
double ra_acc_kl_logits(const float *p_logits, const float *q_logits, int vocab, int *same_top1);

#endif
