/* Long-context accuracy tasks (RULER and InfiniteBench constructions), generated offline from a
 * seed and tokenized with the model's own tokenizer and chat template.
 *
 * A sample is a prompt of about target_len tokens: an instruction, a haystack (the repeated
 * "grass is green" noise, natural prose, a JSON object or a word list) with the task's needles
 * inserted, a question, and the start of the answer after the chat template's assistant turn
 * (RULER's answer prefix), so that the first generated tokens are the answer. The expected
 * values are scored by exact match (ra_acc_score). Everything is a pure function of (task,
 * target_len, depth, seed, tokenizer, prose corpus): no downloads, no clock. */
#ifndef RA_ACC_TASKS_H
#define RA_ACC_TASKS_H

#include "status.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ra_acc_task {
  RA_ACC_NIAH_SINGLE_NUMBER = 0, /* noise haystack, one needle, 7-digit number value */
  RA_ACC_NIAH_SINGLE_WORD,       /* prose haystack, one needle, an English word as value */
  RA_ACC_NIAH_SINGLE_UUID,       /* prose haystack, one needle, a UUID as value */
  RA_ACC_NIAH_MULTIKEY,          /* prose haystack, the needle among 3 distractor needles of other keys */
  RA_ACC_NIAH_MULTIVALUE,        /* prose haystack, 4 needles of the same key; all 4 values asked */
  RA_ACC_NIAH_MULTIQUERY,        /* prose haystack, 4 needles of different keys; 2 of them asked */
  RA_ACC_PASSKEY,                /* InfiniteBench passkey: noise haystack, 5-digit pass key */
  RA_ACC_KV_RETRIEVAL,           /* InfiniteBench kv_retrieval: JSON of UUID pairs, one key asked */
  RA_ACC_VARIABLE_TRACKING,      /* RULER vt: a chain of 4 assignments in noise; all 5 names asked */
  RA_ACC_COMMON_WORDS,           /* RULER cwe: numbered word list; the 10 most frequent asked */
  RA_ACC_LONGGEN_NEEDLES,        /* LongGenBench-style: k coded items in prose, all k asked in sequence in
                                    one generation ("Item 1: CODE / Item 2: CODE ..."), each scored alone */
  RA_ACC_N_TASKS
} ra_acc_task;

const char *ra_acc_task_name(ra_acc_task t);
int ra_acc_task_parse(const char *name, ra_acc_task *out); /* 0 or RA_EINVAL */
/* Whether the task's target needle is placed at a requested depth (else depth is ignored). */
int ra_acc_task_has_depth(ra_acc_task t);

/* The natural-prose haystack: Debian's license texts, one line per haystack unit. */
typedef struct ra_acc_corpus {
  char *text;    /* the files concatenated */
  char **lines;  /* non-empty lines (trimmed), pointers into text */
  size_t n_lines;
  char **words;  /* distinct lowercase alphabetic words of 4+ letters, sorted (the cwe pool) */
  size_t n_words;
} ra_acc_corpus;

/* Reads the license texts ra_acc_corpus_files names from dir (normally /usr/share/common-licenses). */
int ra_acc_corpus_load(const char *dir, ra_acc_corpus *out, ra_error *err);
void ra_acc_corpus_free(ra_acc_corpus *c);
/* The NULL-terminated list of file names read, in order. */
const char *const *ra_acc_corpus_files(void);

#define RA_ACC_MAX_VALUES 16

typedef struct ra_acc_sample {
  ra_acc_task task;
  int target_len;        /* tokens asked for */
  double depth;          /* of the target needle, 0 (start of the haystack) .. 1 (end) */
  uint64_t seed;
  char *text;            /* the formatted prompt (chat template + answer prefix) */
  int32_t *tokens;       /* its tokens (BOS when the model wants it) */
  size_t n_tokens;
  char *values[RA_ACC_MAX_VALUES]; /* expected values, all of which the answer must contain */
  int n_values;
  char *needle;          /* the target needle's text (NULL for tasks without one) */
  int64_t needle_token;  /* token index where the needle starts; -1 without one */
  int64_t hay_begin, hay_end; /* token range of the haystack (needles included) */
  int answer_tokens;     /* tokens of the values written as a list, plus slack: a decode budget */
  int sequential;        /* the values are answers asked in order, value i after the label
                            ra_acc_item_label(i) (the answer prefix holds label 0) */
} ra_acc_sample;

/* Items of longgen_needles at a target length: target_len / 256, from 4 to RA_ACC_MAX_VALUES. */
int ra_acc_longgen_items(int target_len);
/* "Item <i + 1>": the label of sequential answer i, as the question asks for it. */
void ra_acc_item_label(int i, char *out, size_t cap);

/* Generates one sample. Lengths below ~200 tokens are refused (the instruction alone is ~100). */
int ra_acc_generate(const ra_tokenizer *tok, const ra_acc_corpus *corpus, ra_acc_task task, int target_len,
                    double depth, uint64_t seed, ra_acc_sample *out, ra_error *err);
void ra_acc_sample_free(ra_acc_sample *s);

/* The fraction of the expected values found in `output` (case-insensitive, each as a whole token:
 * not preceded or followed by a letter or digit). 1 is an exact match; RULER's string_match_all.
 * A sequential sample scores each answer alone (ra_acc_score_items). */
double ra_acc_score(const ra_acc_sample *s, const char *output);

/* Per answer of a sequential sample: hit[i] = 1 when value i is in answer i's own segment of the
 * output, from label i (the output's start for i = 0) to the first label i + 1 after it (or the
 * end); a label the output never writes leaves its answer unscored (0). Other samples: hit[i] =
 * value i found anywhere. Returns the hits; hit has n_values entries. */
int ra_acc_score_items(const ra_acc_sample *s, const char *output, int *hit);

/* A deterministic seed per (base, task, length, depth index, sample index). */
uint64_t ra_acc_sample_seed(uint64_t base, ra_acc_task task, int length, int depth_index, int sample_index);

#endif
