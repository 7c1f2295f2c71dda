#include "tasks.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const task_names[RA_ACC_N_TASKS] = {
    "niah_single_number", "niah_single_word", "niah_single_uuid", "niah_multikey", "niah_multivalue",
    "niah_multiquery", "passkey", "kv_retrieval", "variable_tracking", "common_words", "longgen_needles"};

const char *ra_acc_task_name(ra_acc_task t) { return (unsigned)t < RA_ACC_N_TASKS ? task_names[t] : "?"; }

int ra_acc_task_parse(const char *name, ra_acc_task *out) {
  for (int i = 0; i < RA_ACC_N_TASKS; i++)
    if (strcmp(name, task_names[i]) == 0) {
      *out = (ra_acc_task)i;
      return RA_OK;
    }
  return RA_EINVAL;
}

int ra_acc_task_has_depth(ra_acc_task t) {
  return t != RA_ACC_VARIABLE_TRACKING && t != RA_ACC_COMMON_WORDS && t != RA_ACC_LONGGEN_NEEDLES;
}

int ra_acc_longgen_items(int target_len) {
  int k = target_len / 256;
  return k < 4 ? 4 : k > RA_ACC_MAX_VALUES ? RA_ACC_MAX_VALUES : k;
}

void ra_acc_item_label(int i, char *out, size_t cap) { snprintf(out, cap, "Item %d", i + 1); }

/* ---------- randomness: splitmix64, a pure function of the seed ---------- */

static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t rng_below(uint64_t *s, uint64_t n) { return rng_next(s) % n; }
static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

uint64_t ra_acc_sample_seed(uint64_t base, ra_acc_task task, int length, int depth_index, int sample_index) {
  uint64_t s = base ^ ((uint64_t)task << 56) ^ ((uint64_t)(uint32_t)length << 24) ^ ((uint64_t)(uint32_t)depth_index << 12) ^
               (uint64_t)(uint32_t)sample_index;
  return rng_next(&s);
}

/* ---------- a growable string ---------- */

typedef struct sb {
  char *s;
  size_t len, cap;
  int oom;
} sb;

static void sb_addn(sb *b, const char *t, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1) cap *= 2;
    char *g = realloc(b->s, cap);
    if (!g) {
      b->oom = 1;
      return;
    }
    b->s = g;
    b->cap = cap;
  }
  memcpy(b->s + b->len, t, n);
  b->len += n;
  b->s[b->len] = 0;
}

static void sb_add(sb *b, const char *t) { sb_addn(b, t, strlen(t)); }

static void sb_addf(sb *b, const char *fmt, ...) {
  char tmp[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  sb_addn(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---------- the prose corpus ---------- */

static const char *const corpus_files[] = {"GPL-3", "Apache-2.0", "GPL-2", "LGPL-2.1", "MPL-2.0",
                                           "GFDL-1.3", "Artistic", "CC0-1.0", NULL};

const char *const *ra_acc_corpus_files(void) { return corpus_files; }

void ra_acc_corpus_free(ra_acc_corpus *c) {
  free(c->text);
  free(c->lines);
  if (c->words)
    for (size_t i = 0; i < c->n_words; i++) free(c->words[i]);
  free(c->words);
  memset(c, 0, sizeof *c);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The distinct lowercase words of 4+ letters of the text (before it is cut into lines). */
static int corpus_words(ra_acc_corpus *c, ra_error *err) {
  size_t cap = 4096, n = 0;
  char **w = malloc(cap * sizeof *w);
  if (!w) return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  for (const char *p = c->text; *p;) {
    while (*p && !isalpha((unsigned char)*p)) p++;
    const char *q = p;
    while (isalpha((unsigned char)*q)) q++;
    size_t len = (size_t)(q - p);
    if (len >= 4 && len < 32) {
      if (n == cap) {
        char **g = realloc(w, 2 * cap * sizeof *w);
        if (!g) break;
        w = g;
        cap *= 2;
      }
      char *s = malloc(len + 1);
      if (!s) break;
      for (size_t i = 0; i < len; i++) s[i] = (char)tolower((unsigned char)p[i]);
      s[len] = 0;
      w[n++] = s;
    }
    p = q;
  }
  qsort(w, n, sizeof *w, cmp_str);
  size_t u = 0;
  for (size_t i = 0; i < n; i++) {
    if (u > 0 && strcmp(w[u - 1], w[i]) == 0) {
      free(w[i]);
      continue;
    }
    w[u++] = w[i];
  }
  c->words = w;
  c->n_words = u;
  return RA_OK;
}

int ra_acc_corpus_load(const char *dir, ra_acc_corpus *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  sb all = {0};
  for (const char *const *f = corpus_files; *f; f++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
      free(all.s);
      return ra_errorf(err, RA_ENOTFOUND, "accuracy: cannot open %s (the prose haystack; Debian's base-files)", path);
    }
    char buf[8192];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, fp)) > 0) sb_addn(&all, buf, n);
    fclose(fp);
    sb_add(&all, "\n");
  }
  if (all.oom) {
    free(all.s);
    return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory for the corpus");
  }
  out->text = all.s;
  int rc = corpus_words(out, err);
  size_t cap = 1024;
  out->lines = rc == RA_OK ? malloc(cap * sizeof *out->lines) : NULL;
  if (rc == RA_OK && !out->lines) rc = ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  for (char *p = out->text; rc == RA_OK && *p;) {
    char *e = strchr(p, '\n');
    if (e) *e = 0;
    while (isspace((unsigned char)*p)) p++;
    char *t = p + strlen(p);
    while (t > p && isspace((unsigned char)t[-1])) *--t = 0;
    if (*p) {
      if (out->n_lines == cap) {
        char **g = realloc(out->lines, 2 * cap * sizeof *g);
        if (!g) {
          rc = ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
          break;
        }
        out->lines = g;
        cap *= 2;
      }
      out->lines[out->n_lines++] = p;
    }
    if (!e) break;
    p = e + 1;
  }
  if (rc != RA_OK) ra_acc_corpus_free(out);
  return rc;
}

/* ---------- needles, keys and values ---------- */

/* Keys are adjective-noun pairs and word values nouns, as in RULER; none is a word of the
 * license texts' legal vocabulary, and a value is re-drawn if the haystack contains it. */
static const char *const adjectives[] = {
    "abundant", "bitter",  "brave",   "breezy",  "bright",  "calm",    "chilly",  "clever",  "cloudy",
    "cozy",     "crimson", "curious", "dusty",   "eager",   "elegant", "fancy",   "fluffy",  "fragrant",
    "gentle",   "giant",   "glossy",  "golden",  "grumpy",  "hollow",  "humble",  "icy",     "jolly",
    "lively",   "lucky",   "misty",   "nimble",  "noisy",   "odd",     "polite",  "proud",   "quiet",
    "rapid",    "rusty",   "shiny",   "silent",  "sleepy",  "smoky",   "sunny",   "swift",   "tiny",
    "velvet",   "wild",    "witty"};
static const char *const nouns[] = {
    "anchor",   "badger",   "balloon",  "banjo",    "beetle",   "biscuit",  "blanket",  "bucket",   "cactus",
    "canoe",    "carrot",   "castle",   "cherry",   "chimney",  "cobra",    "comet",    "cookie",   "dolphin",
    "donkey",   "dragon",   "falcon",   "feather",  "ferret",   "giraffe",  "glacier",  "goblet",   "harbor",
    "hedgehog", "iceberg",  "igloo",    "jaguar",   "kettle",   "kiwi",     "lantern",  "lemon",    "lobster",
    "mango",    "meadow",   "mitten",   "mushroom", "napkin",   "octopus",  "orchid",   "otter",    "panda",
    "parrot",   "peacock",  "pebble",   "penguin",  "pepper",   "pickle",   "pillow",   "pineapple","pumpkin",
    "puzzle",   "rabbit",   "raccoon",  "saddle",   "salmon",   "scarf",    "seashell", "squirrel", "teapot",
    "tiger",    "tornado",  "trumpet",  "tulip",    "turtle",   "umbrella", "violin",   "volcano",  "walnut",
    "walrus",   "whistle",  "wizard",   "yogurt",   "zebra",    "zucchini"};
#define N_ADJ (sizeof adjectives / sizeof adjectives[0])
#define N_NOUN (sizeof nouns / sizeof nouns[0])

static const char noise_unit[] =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

static void draw_key(uint64_t *r, char *out, size_t cap) {
  snprintf(out, cap, "%s-%s", adjectives[rng_below(r, N_ADJ)], nouns[rng_below(r, N_NOUN)]);
}

static void draw_uuid(uint64_t *r, char *out) {
  uint64_t a = rng_next(r), b = rng_next(r);
  /* version 4, variant 10xx, as a real random UUID */
  snprintf(out, 37, "%08x-%04x-4%03x-%04x-%012llx", (unsigned)(a >> 32), (unsigned)(a >> 16) & 0xffff,
           (unsigned)a & 0xfff, (unsigned)(0x8000 | ((b >> 48) & 0x3fff)), (unsigned long long)(b & 0xffffffffffffull));
}

#define MAX_NEEDLES RA_ACC_MAX_VALUES

typedef enum hay_kind { HAY_NOISE, HAY_PROSE, HAY_JSON, HAY_WORDS } hay_kind;

/* Everything of a sample but the haystack's length. */
typedef struct spec {
  ra_acc_task task;
  hay_kind hay;
  const ra_acc_corpus *corpus;
  uint64_t seed;
  sb intro, question, answer_prefix;
  char needles[MAX_NEEDLES][640];
  double depths[MAX_NEEDLES];
  int n_needles; /* needle 0 is the target */
  char values[RA_ACC_MAX_VALUES][64];
  int n_values;
  size_t line0;           /* prose: first line */
  const char *cw[10];     /* common_words: the frequent words, then the pool of rare ones */
  const char **rare;
  size_t n_rare;
  int freq_common;
} spec;

/* common_words: 10 frequent words; RULER's 30 repetitions each do not fit a 1K prompt, so the
 * frequency grows with the length (6 at 1K, 27 at 8K, at most 30) and stays >= 2x the rare 3. */
enum { CWE_COMMON = 10, CWE_FREQ_RARE = 3 };

static int word_in_corpus(const ra_acc_corpus *c, const char *w) {
  return bsearch(&w, c->words, c->n_words, sizeof *c->words, cmp_str) != NULL;
}

static void niah_texts(spec *s, const char *type, const char *query) {
  sb_addf(&s->intro,
          "Some special magic %s are hidden within the following text. Make sure to memorize it. I will quiz you "
          "about the %s afterwards.\n",
          type, type);
  sb_addf(&s->question, "\nWhat are all the special magic %s for %s mentioned in the provided text?", type, query);
  sb_addf(&s->answer_prefix, "The special magic %s for %s mentioned in the provided text are", type, query);
}

/* Draws a key not used yet among keys[0, n). */
static void distinct_key(uint64_t *r, char keys[][64], int n) {
  for (;;) {
    draw_key(r, keys[n], 64);
    int dup = 0;
    for (int i = 0; i < n; i++) dup |= strcmp(keys[i], keys[n]) == 0;
    if (!dup) return;
  }
}

static void number_value(uint64_t *r, char *out, int digits) {
  uint64_t lo = digits == 7 ? 1000000 : 10000;
  snprintf(out, 64, "%llu", (unsigned long long)(lo + rng_below(r, 9 * lo)));
}

static int spec_init(spec *s, const ra_acc_corpus *corpus, ra_acc_task task, int target_len, double depth,
                     uint64_t seed, ra_error *err) {
  memset(s, 0, sizeof *s);
  s->task = task;
  s->corpus = corpus;
  s->seed = seed;
  uint64_t r = seed;
  s->line0 = corpus->n_lines ? (size_t)rng_below(&r, corpus->n_lines) : 0;
  s->depths[0] = depth;
  char keys[4][64]; /* the niah tasks: at most 4 keys */
  switch (task) {
    case RA_ACC_NIAH_SINGLE_NUMBER:
    case RA_ACC_NIAH_SINGLE_WORD:
    case RA_ACC_NIAH_SINGLE_UUID: {
      const char *type = task == RA_ACC_NIAH_SINGLE_NUMBER ? "numbers" : task == RA_ACC_NIAH_SINGLE_WORD ? "words" : "uuids";
      s->hay = task == RA_ACC_NIAH_SINGLE_NUMBER ? HAY_NOISE : HAY_PROSE;
      distinct_key(&r, keys, 0);
      if (task == RA_ACC_NIAH_SINGLE_NUMBER) number_value(&r, s->values[0], 7);
      else if (task == RA_ACC_NIAH_SINGLE_UUID) draw_uuid(&r, s->values[0]);
      else
        do snprintf(s->values[0], 64, "%s", nouns[rng_below(&r, N_NOUN)]);
        while (strstr(keys[0], s->values[0]) || word_in_corpus(corpus, s->values[0]));
      s->n_values = 1;
      snprintf(s->needles[0], sizeof s->needles[0], "One of the special magic %s for %s is: %s.", type, keys[0],
               s->values[0]);
      s->n_needles = 1;
      niah_texts(s, type, keys[0]);
      break;
    }
    case RA_ACC_NIAH_MULTIKEY:
    case RA_ACC_NIAH_MULTIVALUE:
    case RA_ACC_NIAH_MULTIQUERY: {
      s->hay = HAY_PROSE;
      s->n_needles = 4;
      for (int i = 0; i < 4; i++) {
        if (i == 0 || task != RA_ACC_NIAH_MULTIVALUE) distinct_key(&r, keys, i);
        else memcpy(keys[i], keys[0], sizeof keys[0]);
        char v[64];
        number_value(&r, v, 7);
        snprintf(s->needles[i], sizeof s->needles[i], "One of the special magic numbers for %s is: %s.", keys[i], v);
        if (i > 0) s->depths[i] = rng_unit(&r);
        int asked = task == RA_ACC_NIAH_MULTIKEY ? i == 0 : task == RA_ACC_NIAH_MULTIVALUE ? 1 : i < 2;
        if (asked) memcpy(s->values[s->n_values++], v, sizeof v);
      }
      char query[160];
      if (task == RA_ACC_NIAH_MULTIQUERY) snprintf(query, sizeof query, "%s and %s", keys[0], keys[1]);
      else snprintf(query, sizeof query, "%s", keys[0]);
      niah_texts(s, "numbers", query);
      break;
    }
    case RA_ACC_PASSKEY:
      s->hay = HAY_NOISE;
      number_value(&r, s->values[0], 5);
      s->n_values = 1;
      snprintf(s->needles[0], sizeof s->needles[0], "The pass key is %s. Remember it. %s is the pass key.",
               s->values[0], s->values[0]);
      s->n_needles = 1;
      sb_add(&s->intro, "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
                        "I will quiz you about the important information there.\n\n");
      sb_add(&s->question, "\n\nWhat is the pass key?");
      sb_add(&s->answer_prefix, "The pass key is");
      break;
    case RA_ACC_KV_RETRIEVAL: {
      s->hay = HAY_JSON;
      char key[37];
      draw_uuid(&r, key);
      draw_uuid(&r, s->values[0]);
      s->n_values = 1;
      snprintf(s->needles[0], sizeof s->needles[0], "\"%s\": \"%s\"", key, s->values[0]);
      s->n_needles = 1;
      sb_add(&s->intro, "Extract the value corresponding to the specified key in the JSON object below.\n\nJSON data:\n{");
      sb_addf(&s->question, "}\n\nKey: \"%s\"\nWhat is the value associated with the specified key?", key);
      sb_add(&s->answer_prefix, "The value associated with the specified key is:");
      break;
    }
    case RA_ACC_VARIABLE_TRACKING: {
      s->hay = HAY_NOISE;
      char num[64];
      number_value(&r, num, 5);
      s->n_values = 5;
      s->n_needles = 5;
      for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 5; j++) s->values[i][j] = (char)('A' + rng_below(&r, 26));
        s->values[i][5] = 0;
        if (i == 0) snprintf(s->needles[i], sizeof s->needles[i], "VAR %s = %s.", s->values[i], num);
        else snprintf(s->needles[i], sizeof s->needles[i], "VAR %s = VAR %s.", s->values[i], s->values[i - 1]);
      }
      /* the chain in order, at sorted random depths */
      for (int i = 0; i < 5; i++) s->depths[i] = rng_unit(&r);
      for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && s->depths[j - 1] > s->depths[j]; j--) {
          double t = s->depths[j];
          s->depths[j] = s->depths[j - 1];
          s->depths[j - 1] = t;
        }
      sb_add(&s->intro, "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n");
      sb_addf(&s->question, "\nQuestion: Find all variables that are assigned the value %s in the text above.", num);
      sb_addf(&s->answer_prefix,
              "Answer: According to the chain(s) of variable assignment in the text above, 5 variables are assigned "
              "the value %s, they are:",
              num);
      break;
    }
    case RA_ACC_COMMON_WORDS: {
      s->hay = HAY_WORDS;
      s->freq_common = target_len / 300 < 6 ? 6 : target_len / 300 > 30 ? 30 : target_len / 300;
      if (corpus->n_words < 2 * CWE_COMMON) return ra_errorf(err, RA_EINVAL, "accuracy: the corpus has too few words");
      s->rare = malloc(corpus->n_words * sizeof *s->rare);
      if (!s->rare) return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
      for (size_t i = 0; i < corpus->n_words; i++) s->rare[i] = corpus->words[i];
      for (size_t i = corpus->n_words - 1; i > 0; i--) {
        size_t j = (size_t)rng_below(&r, i + 1);
        const char *t = s->rare[i];
        s->rare[i] = s->rare[j];
        s->rare[j] = t;
      }
      for (int i = 0; i < CWE_COMMON; i++) {
        s->cw[i] = s->rare[i];
        snprintf(s->values[i], 64, "%s", s->cw[i]);
      }
      s->n_values = CWE_COMMON;
      s->rare += CWE_COMMON;
      s->n_rare = corpus->n_words - CWE_COMMON;
      sb_add(&s->intro, "Below is a numbered list of words. In these words, some appear more often than others. "
                        "Memorize the ones that appear most often.\n");
      sb_add(&s->question, "\nQuestion: What are the 10 most common words in the above list?");
      sb_add(&s->answer_prefix, "Answer: The top 10 words that appear most often in the list are:");
      break;
    }
    case RA_ACC_LONGGEN_NEEDLES: {
      /* the items at independent random depths, so the order asked is not the order written */
      s->hay = HAY_PROSE;
      s->n_needles = s->n_values = ra_acc_longgen_items(target_len);
      for (int i = 0; i < s->n_needles; i++) {
        int dup;
        do {
          number_value(&r, s->values[i], 7);
          dup = 0;
          for (int j = 0; j < i; j++) dup |= strcmp(s->values[j], s->values[i]) == 0;
        } while (dup);
        s->depths[i] = rng_unit(&r);
        snprintf(s->needles[i], sizeof s->needles[i], "The code of item %d is %s.", i + 1, s->values[i]);
      }
      sb_addf(&s->intro, "The following text hides the codes of %d numbered items. Memorize them. I will ask you "
                         "for every code afterwards.\n", s->n_needles);
      sb_addf(&s->question, "\nList the code of item 1, then the code of item 2, and so on up to item %d, one item "
                            "per line, as \"Item N: CODE\".", s->n_needles);
      sb_add(&s->answer_prefix, "Item 1:");
      break;
    }
    default:
      return ra_errorf(err, RA_EINVAL, "accuracy: unknown task %d", (int)task);
  }
  return RA_OK;
}

static void spec_free(spec *s) {
  free(s->intro.s);
  free(s->question.s);
  free(s->answer_prefix.s);
  if (s->rare) free(s->rare - CWE_COMMON);
}

/* The user turn with n_units haystack units; *hay0 / *hay1 delimit the haystack in it. */
static void build_user(const spec *s, size_t n_units, sb *u, size_t *hay0, size_t *hay1) {
  u->len = 0;
  if (u->s) u->s[0] = 0;
  sb_add(u, s->intro.s ? s->intro.s : "");
  *hay0 = u->len;
  const char *sep = s->hay == HAY_PROSE ? "\n" : s->hay == HAY_JSON ? ",\n" : " ";
  int first = 1;
  size_t slot[MAX_NEEDLES];
  for (int i = 0; i < s->n_needles; i++) {
    double d = s->depths[i] < 0 ? 0 : s->depths[i] > 1 ? 1 : s->depths[i];
    slot[i] = (size_t)(d * (double)n_units + 0.5);
  }
  /* common_words: every word of the list, shuffled per length */
  const char **list = NULL;
  size_t n_list = 0;
  if (s->hay == HAY_WORDS) {
    size_t n_rare = n_units < s->n_rare ? n_units : s->n_rare;
    n_list = (size_t)CWE_COMMON * (size_t)s->freq_common + n_rare * CWE_FREQ_RARE;
    list = malloc(n_list * sizeof *list);
    if (!list) {
      u->oom = 1;
      return;
    }
    size_t k = 0;
    for (int i = 0; i < CWE_COMMON; i++)
      for (int j = 0; j < s->freq_common; j++) list[k++] = s->cw[i];
    for (size_t i = 0; i < n_rare; i++)
      for (int j = 0; j < CWE_FREQ_RARE; j++) list[k++] = s->rare[i];
    uint64_t r = s->seed ^ 0x5eedull;
    for (size_t i = n_list - 1; i > 0; i--) {
      size_t j = (size_t)rng_below(&r, i + 1);
      const char *t = list[i];
      list[i] = list[j];
      list[j] = t;
    }
    for (size_t i = 0; i < n_list; i++) {
      if (i) sb_add(u, " ");
      sb_addf(u, "%zu. %s", i + 1, list[i]);
    }
    free(list);
    *hay1 = u->len;
    sb_add(u, s->question.s);
    return;
  }
  for (size_t k = 0; k <= n_units; k++) {
    for (int i = 0; i < s->n_needles; i++)
      if (slot[i] == k) {
        if (!first) sb_add(u, sep);
        sb_add(u, s->needles[i]);
        first = 0;
      }
    if (k == n_units) break;
    if (!first) sb_add(u, sep);
    first = 0;
    if (s->hay == HAY_NOISE) {
      sb_add(u, noise_unit);
    } else if (s->hay == HAY_PROSE) {
      sb_add(u, s->corpus->lines[(s->line0 + k) % s->corpus->n_lines]);
    } else {
      /* a JSON pair of UUIDs, a function of (seed, k) only: the prefix does not change with n_units */
      uint64_t r = s->seed ^ (0x9e3779b97f4a7c15ull * (k + 1));
      char a[37], b[37];
      draw_uuid(&r, a);
      draw_uuid(&r, b);
      sb_addf(u, "\"%s\": \"%s\"", a, b);
    }
  }
  *hay1 = u->len;
  sb_add(u, s->question.s);
}

/* The formatted prompt (chat template + answer prefix) of a user turn, and its token count. */
static int format_prompt(const ra_tokenizer *tok, const spec *s, const char *user, char **text, int32_t **ids,
                         size_t *n, ra_error *err) {
  char *chat;
  int rc = ra_tok_chat_format(tok, NULL, user, &chat, err);
  if (rc) return rc;
  sb t = {0};
  sb_add(&t, chat);
  sb_add(&t, s->answer_prefix.s);
  free(chat);
  if (t.oom) {
    free(t.s);
    return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  }
  rc = ra_tok_encode(tok, t.s, t.len, ra_tok_add_bos(tok), 1, ids, n, err);
  if (rc) {
    free(t.s);
    return rc;
  }
  *text = t.s;
  return RA_OK;
}

/* Tokens of the first `len` bytes of text (a prefix of the prompt). */
static int prefix_tokens(const ra_tokenizer *tok, const char *text, size_t len, int64_t *out, ra_error *err) {
  int32_t *ids;
  size_t n;
  int rc = ra_tok_encode(tok, text, len, ra_tok_add_bos(tok), 1, &ids, &n, err);
  if (rc) return rc;
  free(ids);
  *out = (int64_t)n;
  return RA_OK;
}

static int count_tokens(const ra_tokenizer *tok, const spec *s, size_t n_units, sb *u, size_t *n, ra_error *err) {
  size_t h0, h1;
  build_user(s, n_units, u, &h0, &h1);
  if (u->oom) return ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
  char *text;
  int32_t *ids;
  int rc = format_prompt(tok, s, u->s, &text, &ids, n, err);
  if (rc) return rc;
  free(text);
  free(ids);
  return RA_OK;
}

void ra_acc_sample_free(ra_acc_sample *s) {
  free(s->text);
  free(s->tokens);
  for (int i = 0; i < s->n_values; i++) free(s->values[i]);
  free(s->needle);
  memset(s, 0, sizeof *s);
}

int ra_acc_generate(const ra_tokenizer *tok, const ra_acc_corpus *corpus, ra_acc_task task, int target_len,
                    double depth, uint64_t seed, ra_acc_sample *out, ra_error *err) {
  memset(out, 0, sizeof *out);
  if ((unsigned)task >= RA_ACC_N_TASKS) return ra_errorf(err, RA_EINVAL, "accuracy: unknown task %d", (int)task);
  if (target_len < 200) return ra_errorf(err, RA_EINVAL, "accuracy: a prompt of %d tokens is too short", target_len);
  if (!(depth >= 0 && depth <= 1)) return ra_errorf(err, RA_EINVAL, "accuracy: depth %g outside [0, 1]", depth);
  if (!corpus->n_lines) return ra_errorf(err, RA_EINVAL, "accuracy: empty prose corpus");
  spec s;
  int rc = spec_init(&s, corpus, task, target_len, depth, seed, err);
  sb u = {0};
  /* Fit the number of units: tokens grow about linearly with them, so a few secant steps from
   * the empty haystack land within one unit of the target; then step down until it fits. */
  size_t t0 = 0, t1 = 0, units = 16, n = 0;
  if (rc == RA_OK) rc = count_tokens(tok, &s, 0, &u, &t0, err);
  if (rc == RA_OK && t0 + 16 > (size_t)target_len)
    rc = ra_errorf(err, RA_EINVAL, "accuracy: %s needs more than %d tokens (%zu without a haystack)",
                   ra_acc_task_name(task), target_len, t0);
  if (rc == RA_OK) rc = count_tokens(tok, &s, units, &u, &t1, err);
  double per_unit = rc == RA_OK ? (double)(t1 - t0) / (double)units : 1;
  for (int it = 0; rc == RA_OK && it < 8; it++) {
    size_t next = (size_t)((double)(target_len - (int64_t)t0) / per_unit);
    if (next < 1) next = 1;
    if (next == units && it > 0) break;
    units = next;
    if ((rc = count_tokens(tok, &s, units, &u, &n, err))) break;
    per_unit = (double)(n - t0) / (double)units;
  }
  while (rc == RA_OK && n > (size_t)target_len && units > 1) {
    size_t step = (size_t)((double)(n - (size_t)target_len) / per_unit) + 1;
    units = units > step ? units - step : 1;
    rc = count_tokens(tok, &s, units, &u, &n, err);
  }
  size_t h0 = 0, h1 = 0;
  if (rc == RA_OK) {
    build_user(&s, units, &u, &h0, &h1);
    rc = u.oom ? ra_errorf(err, RA_ENOMEM, "accuracy: out of memory") : format_prompt(tok, &s, u.s, &out->text, &out->tokens, &out->n_tokens, err);
  }
  if (rc == RA_OK) {
    out->task = task;
    out->target_len = target_len;
    out->depth = ra_acc_task_has_depth(task) ? depth : -1;
    out->seed = seed;
    out->needle_token = -1;
    /* the user turn appears verbatim in the formatted prompt */
    const char *user_at = strstr(out->text, u.s);
    size_t base = user_at ? (size_t)(user_at - out->text) : 0;
    rc = user_at ? prefix_tokens(tok, out->text, base + h0, &out->hay_begin, err)
                 : ra_errorf(err, RA_EINTERNAL, "accuracy: the chat template changed the user text");
    if (rc == RA_OK) rc = prefix_tokens(tok, out->text, base + h1, &out->hay_end, err);
    if (rc == RA_OK && s.n_needles > 0 && ra_acc_task_has_depth(task)) {
      const char *at = strstr(out->text, s.needles[0]);
      out->needle = strdup(s.needles[0]);
      if (!at || !out->needle) rc = ra_errorf(err, RA_EINTERNAL, "accuracy: the needle is not in the prompt");
      else rc = prefix_tokens(tok, out->text, (size_t)(at - out->text), &out->needle_token, err);
    }
  }
  sb ans = {0};
  for (int i = 0; rc == RA_OK && i < s.n_values; i++) {
    out->values[i] = strdup(s.values[i]);
    if (!out->values[i]) rc = ra_errorf(err, RA_ENOMEM, "accuracy: out of memory");
    out->n_values = i + 1;
    if (task == RA_ACC_LONGGEN_NEEDLES && i > 0) {
      char label[32];
      ra_acc_item_label(i, label, sizeof label);
      sb_addf(&ans, "\n%s: ", label);
    } else {
      sb_add(&ans, i ? ", " : " ");
    }
    sb_add(&ans, s.values[i]);
  }
  out->sequential = task == RA_ACC_LONGGEN_NEEDLES;
  if (rc == RA_OK) {
    int32_t *ids;
    size_t na;
    rc = ans.oom ? ra_errorf(err, RA_ENOMEM, "accuracy: out of memory") : ra_tok_encode(tok, ans.s, ans.len, 0, 0, &ids, &na, err);
    if (rc == RA_OK) {
      free(ids);
      /* sequential answers: a few more for the model's own separators between them */
      out->answer_tokens = (int)na + 4 + (out->sequential ? 2 * out->n_values : 0);
    }
  }
  free(ans.s);
  free(u.s);
  spec_free(&s);
  if (rc != RA_OK) ra_acc_sample_free(out);
  return rc;
}

/* ---------- scoring ---------- */

/* The first whole-token, case-insensitive occurrence of needle in hay[0, len), or NULL. */
static const char *find_whole(const char *hay, size_t len, const char *needle) {
  size_t n = strlen(needle);
  if (!n) return NULL;
  for (const char *p = hay; p + n <= hay + len; p++) {
    if (strncasecmp(p, needle, n) != 0) continue;
    int before = p > hay && isalnum((unsigned char)p[-1]);
    int after = p + n < hay + len && isalnum((unsigned char)p[n]);
    if (!before && !after) return p;
  }
  return NULL;
}

int ra_acc_score_items(const ra_acc_sample *s, const char *output, int *hit) {
  size_t len = strlen(output);
  int hits = 0;
  if (!s->sequential) {
    for (int i = 0; i < s->n_values; i++) hits += hit[i] = find_whole(output, len, s->values[i]) != NULL;
    return hits;
  }
  /* answer i is output[begin, end): from after label i to the first label i + 1 after it */
  const char *begin = output;
  for (int i = 0; i < s->n_values; i++) {
    hit[i] = 0;
    char label[32];
    const char *end = output + len, *next = NULL;
    if (begin && i + 1 < s->n_values) {
      ra_acc_item_label(i + 1, label, sizeof label);
      if ((next = find_whole(begin, (size_t)(end - begin), label))) end = next;
    }
    if (begin) hits += hit[i] = find_whole(begin, (size_t)(end - begin), s->values[i]) != NULL;
    begin = next ? next + strlen(label) : NULL;
  }
  return hits;
}

double ra_acc_score(const ra_acc_sample *s, const char *output) {
  if (s->n_values == 0) return 0;
  int hit[RA_ACC_MAX_VALUES];
  return (double)ra_acc_score_items(s, output, hit) / (double)s->n_values;
}
