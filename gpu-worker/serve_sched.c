#include "serve_sched.h"

#include "batch.h"
#include "clock.h"
#include "log.h"
#include "sampler.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A context: the KV of tokens toks[0, n_fed) on the device (and at the stores), the rest of
 * toks waiting to be fed. Running when req is set, else idle in the cache. */
typedef struct seq {
  ra_state *st;   /* full mode */
  ra_offload *off; /* offload modes */
  int prefilling;  /* offload modes: its prefill is under way (ra_offload_prefill_begin) */
  int32_t *toks;
  size_t n_toks, n_fed, cap;
  ra_sched_req *req;
  double last_used;
  struct seq *next;
} seq;

struct ra_sched_req {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  /* input */
  int32_t *prompt;
  size_t n_prompt;
  ra_sched_params p;
  /* output, under mu */
  char *text;
  size_t len, cap, visible;
  int done, err_code, cancelled;
  const char *finish;
  char err_msg[RA_ERROR_MSG_MAX];
  size_t n_cached, n_gen;
  /* the engine's */
  ra_sampler smp;
  double t_submit, t_last;
  struct ra_sched_req *next;
};

struct ra_sched {
  ra_sched_config cfg;
  ra_batch *batch;
  ra_remote_batch *attend_batch; /* NULL: each sequence's requests on its own streams */
  int vocab, k_max;
  int32_t *ids;
  float *vals;
  ra_tensor picks; /* [max_seqs, vocab] when the model's output is wider than the tokenizer's
                    * vocabulary: the rows' sampled columns, gathered for one topk_rows */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv, idle_cv;
  int stop, draining, n_live;
  ra_sched_req *queue, *queue_tail; /* submitted, not yet joined */
  ra_sched_req *waiting, *waiting_tail; /* joined while no fresh context fitted: retried, in
                                         * order, once a context is freed (the engine's own) */
  int freed;                        /* a context was freed since the waiting ones last tried */
  size_t ctx_bytes;                 /* device bytes of a fresh context, once one was made */
  seq *running, *cached;            /* lists */
  double step_end;                  /* when the last step that ran sequences ended; 0 after an idle wait */
  double forward_s, logits_s;       /* the current step's time launching its forward, waiting for topk_rows */
  int n_cached;
};

/* ---------- requests ---------- */

static void req_unref(ra_sched_req *r) {
  pthread_mutex_lock(&r->mu);
  int last = --r->refs == 0;
  pthread_mutex_unlock(&r->mu);
  if (!last) return;
  pthread_mutex_destroy(&r->mu);
  pthread_cond_destroy(&r->cv);
  free(r->prompt);
  free(r->text);
  free(r);
}

/* The request's end (under no lock): error code/message or finish reason, waking its waiter. */
static void req_finish(ra_sched_req *r, const char *finish, int code, const char *msg) {
  pthread_mutex_lock(&r->mu);
  r->done = 1;
  r->finish = finish;
  r->err_code = code;
  if (msg) snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
  if (!code) r->visible = r->len;
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Bytes of text that can go out: not a trailing partial UTF-8 character, nor a trailing piece
 * that could begin a stop string. */
static size_t visible_len(const ra_sched_req *r) {
  size_t n = r->len;
  for (size_t back = 1; back <= 3 && back <= n; back++) {
    unsigned char c = (unsigned char)r->text[n - back];
    if ((c & 0xc0) == 0x80) continue; /* continuation */
    size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (need > back) n -= back;
    break;
  }
  size_t keep = n;
  for (int i = 0; i < r->p.n_stop; i++) {
    size_t sl = strlen(r->p.stop[i]);
    for (size_t k = sl - 1; k >= 1; k--)
      if (k <= n && memcmp(r->text + n - k, r->p.stop[i], k) == 0) {
        if (n - k < keep) keep = n - k;
        break;
      }
  }
  return keep;
}

/* Appends a token's bytes; returns 1 when a stop string now occurs (the text is cut there). */
static int req_append(ra_sched_req *r, const char *piece, size_t n) {
  pthread_mutex_lock(&r->mu);
  int stopped = 0;
  if (r->len + n + 1 > r->cap) {
    size_t c = (r->len + n + 1) * 2;
    char *t = realloc(r->text, c);
    if (!t) {
      pthread_mutex_unlock(&r->mu);
      return -1;
    }
    r->text = t;
    r->cap = c;
  }
  memcpy(r->text + r->len, piece, n);
  r->len += n;
  r->text[r->len] = 0;
  r->n_gen++;
  /* a stop string can only end inside what was just added */
  size_t from = r->len > n + RA_SCHED_MAX_STOP_LEN ? r->len - n - RA_SCHED_MAX_STOP_LEN : 0;
  for (int i = 0; i < r->p.n_stop; i++) {
    char *hit = strstr(r->text + from, r->p.stop[i]);
    if (hit && (!stopped || (size_t)(hit - r->text) < r->len)) {
      r->len = (size_t)(hit - r->text);
      r->text[r->len] = 0;
      stopped = 1;
    }
  }
  r->visible = stopped ? r->len : visible_len(r);
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
  return stopped;
}

static int req_cancelled(ra_sched_req *r) {
  pthread_mutex_lock(&r->mu);
  int c = r->cancelled;
  pthread_mutex_unlock(&r->mu);
  return c;
}

/* ---------- contexts ---------- */

static size_t seq_kv_bytes(const seq *q) {
  const ra_state *st = q->st ? q->st : ra_offload_state(q->off);
  size_t b = 0;
  for (int l = 0; l < st->m->cfg.n_layers; l++) b += st->k_cache[l].nbytes + st->v_cache[l].nbytes;
  return b;
}

static void seq_free(seq *q) {
  if (!q) return;
  ra_state_free(q->st);
  ra_offload_free(q->off); /* closes its store sessions: the stores free its KV */
  free(q->toks);
  free(q);
}

static int seq_new(ra_sched *s, seq **out, ra_error *err) {
  seq *q = calloc(1, sizeof *q);
  if (!q) return ra_errorf(err, RA_ENOMEM, "serve: out of memory");
  int rc;
  if (s->cfg.off.mode == RA_MODE_FULL) {
    rc = ra_state_new(s->cfg.m, s->cfg.max_ctx, 1, s->cfg.kv_dtype, &q->st, err);
  } else {
    ra_offload_config oc = s->cfg.off;
    oc.kv_dtype = s->cfg.kv_dtype;
    oc.max_ctx = s->cfg.max_ctx;
    oc.max_prompt = s->cfg.max_ctx;
    rc = ra_offload_new(s->cfg.m, s->cfg.plan, &oc, &q->off, err);
  }
  if (rc) {
    seq_free(q);
    return rc;
  }
  *out = q;
  return RA_OK;
}

/* Device bytes of the running and cached contexts. */
static size_t contexts_bytes(const ra_sched *s) {
  size_t b = 0;
  for (const seq *q = s->running; q; q = q->next) b += seq_kv_bytes(q);
  for (const seq *q = s->cached; q; q = q->next) b += seq_kv_bytes(q);
  return b;
}

static void metrics_contexts(ra_sched *s) {
  ra_serve_metrics *m = s->cfg.metrics;
  ra_metric_set(m->device_bytes, "kind=\"kv\"", (double)contexts_bytes(s));
  ra_metric_set(m->cached_seqs, NULL, s->n_cached);
  pthread_mutex_lock(&s->mu);
  ra_metric_set(m->live_seqs, NULL, s->n_live);
  pthread_mutex_unlock(&s->mu);
}

/* Takes the best cached context for prompt p[0, n): *used is the tokens of it kept. NULL if none. */
static seq *cache_take(ra_sched *s, const int32_t *p, size_t n, size_t *used) {
  seq **best = NULL;
  size_t best_len = 0;
  for (seq **pq = &s->cached; *pq; pq = &(*pq)->next) {
    seq *q = *pq;
    size_t l = 0;
    while (l < q->n_fed && l < n && q->toks[l] == p[l]) l++;
    if (q->off && (l != q->n_fed || l >= n)) continue; /* offload: all of the context, then more */
    if (l > n - 1) l = n - 1;          /* the prompt's last token is fed again for its logits */
    /* a match keeping less than half the context would destroy more than it saves: two prompts
     * sharing a few leading tokens must not take each other's contexts */
    if (2 * l < q->n_fed) continue;
    if (l > best_len) best = pq, best_len = l;
  }
  if (!best) return NULL;
  seq *q = *best;
  *best = q->next;
  q->next = NULL;
  s->n_cached--;
  if (q->st) q->st->pos = (int64_t)best_len; /* the rows past it are overwritten as it goes */
  q->n_fed = best_len;
  *used = best_len;
  return q;
}

static void cache_evict(ra_sched *s, int keep, double now) {
  for (;;) {
    seq **lru = NULL, **pq;
    for (pq = &s->cached; *pq; pq = &(*pq)->next) {
      if (now - (*pq)->last_used > s->cfg.cache_ttl_s) {
        lru = pq;
        break;
      }
      if (!lru || (*pq)->last_used < (*lru)->last_used) lru = pq;
    }
    if (!lru || (s->n_cached <= keep && now - (*lru)->last_used <= s->cfg.cache_ttl_s)) return;
    seq *q = *lru;
    *lru = q->next;
    s->n_cached--;
    seq_free(q);
  }
}

/* A finished sequence: cached for reuse, or freed (failed, cancelled, reuse off). */
static void seq_retire(ra_sched *s, seq *q, int reusable) {
  q->req = NULL;
  q->n_toks = q->n_fed;
  q->last_used = ra_clock_now_s();
  if (!reusable || s->cfg.max_cached <= 0) {
    seq_free(q);
    return;
  }
  q->next = s->cached;
  s->cached = q;
  s->n_cached++;
  cache_evict(s, s->cfg.max_cached, q->last_used);
}

/* A request's admission slot (--max-seqs) given back. Before its client can see the request end:
 * a client that sends its next request as soon as the last one ended must find the slot free
 * (the sequence's memory is the engine thread's to retire before it admits another). */
static void live_release(ra_sched *s) {
  pthread_mutex_lock(&s->mu);
  s->n_live--;
  pthread_cond_broadcast(&s->idle_cv);
  pthread_mutex_unlock(&s->mu);
}

/* A fresh context within the device memory for contexts (cfg.kv_budget; the device's own
 * memory otherwise): idle cached contexts are freed for it, least recently used first. RA_ENOMEM
 * when it does not fit beside the running ones. */
static int seq_fresh(ra_sched *s, seq **out, ra_error *err) {
  /* an idle context goes first to make room for a fresh one, LRU */
  cache_evict(s, s->cfg.max_cached - 1 > 0 ? s->cfg.max_cached - 1 : 0, ra_clock_now_s());
  for (;;) {
    const size_t used = contexts_bytes(s);
    int rc = RA_OK;
    if (s->cfg.kv_budget && s->ctx_bytes && used + s->ctx_bytes > s->cfg.kv_budget)
      rc = ra_errorf(err, RA_ENOMEM, "serve: a context takes %zu bytes of device memory, %zu of the --kv-budget %zu "
                     "are held", s->ctx_bytes, used, s->cfg.kv_budget);
    if (rc == RA_OK) rc = seq_new(s, out, err);
    if (rc == RA_OK && !s->ctx_bytes) {
      s->ctx_bytes = seq_kv_bytes(*out);
      if (s->cfg.kv_budget && used + s->ctx_bytes > s->cfg.kv_budget) {
        seq_free(*out);
        *out = NULL;
        continue; /* now that its size is known */
      }
    }
    if (rc != RA_ENOMEM || !s->cached) return rc;
    cache_evict(s, s->n_cached - 1, ra_clock_now_s()); /* one more idle context, and again */
  }
}

/* ---------- the engine ---------- */

/* A new request becomes a running sequence. */
static void join(ra_sched *s, ra_sched_req *r) {
  ra_error err;
  ra_error_clear(&err);
  size_t used = 0;
  seq *q = cache_take(s, r->prompt, r->n_prompt, &used);
  int rc = q ? RA_OK : seq_fresh(s, &q, &err);
  if (rc == RA_ENOMEM && s->running) {
    /* the device holds no more contexts now: the request waits for a running one to end */
    r->next = NULL;
    if (s->waiting_tail) s->waiting_tail->next = r;
    else s->waiting = r;
    s->waiting_tail = r;
    return;
  }
  size_t need = r->n_prompt + (size_t)r->p.max_tokens + 1;
  if (rc == RA_OK && need > q->cap) {
    int32_t *t = realloc(q->toks, sizeof(int32_t) * need);
    if (!t) rc = ra_errorf(&err, RA_ENOMEM, "serve: out of memory");
    else q->toks = t, q->cap = need;
  }
  if (rc) {
    seq_free(q);
    live_release(s);
    req_finish(r, NULL, rc, err.msg);
    req_unref(r);
    return;
  }
  memcpy(q->toks, r->prompt, sizeof(int32_t) * r->n_prompt);
  q->n_toks = r->n_prompt;
  q->req = r;
  pthread_mutex_lock(&r->mu);
  r->n_cached = used;
  pthread_mutex_unlock(&r->mu);
  ra_metric_add(s->cfg.metrics->reused_tokens, NULL, (double)used);
  ra_metric_add(s->cfg.metrics->prompt_tokens, NULL, (double)r->n_prompt);
  q->next = s->running;
  s->running = q;
}

/* The end of a running sequence: leaves the running list. */
static void leave(ra_sched *s, seq *q, const char *finish, int code, const char *msg) {
  for (seq **pq = &s->running; *pq; pq = &(*pq)->next)
    if (*pq == q) {
      *pq = q->next;
      break;
    }
  q->next = NULL;
  ra_sched_req *r = q->req;
  int cancelled = req_cancelled(r);
  s->freed = 1;
  live_release(s);
  req_finish(r, finish, code, msg);
  seq_retire(s, q, code == RA_OK && !cancelled);
  req_unref(r);
}

/* Appends q's next token, picked from its k candidates (vals descending, ids parallel), or ends
 * the sequence. */
static void take_token(ra_sched *s, seq *q, const int32_t *ids, const float *vals, int k) {
  ra_sched_req *r = q->req;
  int32_t next = ra_sampler_pick(&r->smp, vals, ids, k);
  double now = ra_clock_now_s();
  ra_serve_metrics *m = s->cfg.metrics;
  if (r->n_gen == 0) ra_metric_observe(m->ttft, now - r->t_submit);
  else ra_metric_observe(m->inter_token, now - r->t_last);
  r->t_last = now;
  if (ra_tok_is_stop(s->cfg.tok, next)) {
    leave(s, q, "stop", RA_OK, NULL);
    return;
  }
  char piece[256];
  int n = ra_tok_piece(s->cfg.tok, next, piece, sizeof piece);
  if (n < 0) n = 0;
  if (n > (int)sizeof piece) n = (int)sizeof piece;
  ra_metric_add(m->generated_tokens, NULL, 1);
  int stopped = req_append(r, piece, (size_t)n);
  if (stopped < 0) {
    leave(s, q, NULL, RA_ENOMEM, "serve: out of memory");
    return;
  }
  q->toks[q->n_toks++] = next;
  if (stopped) leave(s, q, "stop", RA_OK, NULL);
  else if (r->n_gen >= (size_t)r->p.max_tokens || (int64_t)q->n_toks >= s->cfg.max_ctx) leave(s, q, "length", RA_OK, NULL);
}

/* The candidates a sequence samples from: its top k_max logits, or the top one when greedy. */
static int seq_k(const ra_sched *s, const seq *q) { return q->req->p.temperature > 0 ? s->k_max : 1; }

/* Samples the sequences who[0 .. n) from logits rows [row0, row0 + n): one topk_rows over all
 * the rows (one launch and one wait on a GPU, not one per sequence), k the largest they need. */
static void sample_rows(ra_sched *s, seq *const *who, int n, const ra_tensor *logits, int64_t row0) {
  ra_backend *be = s->cfg.m->be;
  ra_error err;
  int k = 1;
  for (int i = 0; i < n; i++) k = seq_k(s, who[i]) > k ? seq_k(s, who[i]) : k;
  /* the rows' first `vocab` columns: a padded vocabulary's tail is never sampled; such rows are
   * not contiguous, so they are gathered first (copies on the device, one wait for all) */
  ra_tensor rows = ra_tensor_rows(logits, row0, n), picks;
  const ra_tensor *x = &rows;
  int rc = RA_OK;
  double t0 = ra_clock_now_s();
  if (s->vocab != logits->shape[1]) {
    picks = ra_tensor_rows(&s->picks, 0, n);
    x = &picks;
    for (int i = 0; rc == RA_OK && i < n; i++)
      rc = be->ops->copy(be, &picks, (size_t)i * (size_t)s->vocab, logits,
                         (size_t)(row0 + i) * (size_t)logits->shape[1], (size_t)s->vocab, &err);
  }
  if (rc == RA_OK) rc = be->ops->topk_rows(be, x, k, s->ids, s->vals, &err);
  s->logits_s += ra_clock_now_s() - t0;
  for (int i = 0; i < n; i++) {
    if (rc) leave(s, who[i], NULL, rc, err.msg);
    else take_token(s, who[i], s->ids + (size_t)i * (size_t)k, s->vals + (size_t)i * (size_t)k, seq_k(s, who[i]));
  }
}

/* Full mode: one batched forward over every running sequence; how many ran. */
static int step_full(ra_sched *s) {
  ra_batch_item items[256];
  seq *who[256];
  int n = 0;
  int64_t tokens = 0, budget = s->cfg.prefill_chunk;
  /* decoders first (one token each), then the prompts' chunks within the step's budget */
  for (int pass = 0; pass < 2; pass++)
    for (seq *q = s->running; q && n < (int)(sizeof items / sizeof items[0]); q = q->next) {
      size_t pending = q->n_toks - q->n_fed;
      if ((pending == 1) != (pass == 0) || pending == 0) continue;
      int64_t take = (int64_t)pending;
      if (pass == 1) {
        if (budget <= 0) break;
        if (take > budget) take = budget;
        budget -= take;
      }
      items[n] = (ra_batch_item){q->st, q->toks + q->n_fed, take, NULL};
      who[n++] = q;
      tokens += take;
    }
  if (!n) return 0;
  ra_error err;
  ra_error_clear(&err);
  double t0 = ra_clock_now_s();
  int rc = ra_batch_forward(s->batch, items, n, &err);
  s->forward_s = ra_clock_now_s() - t0;
  ra_metric_observe(s->cfg.metrics->batch_size, n);
  ra_metric_observe(s->cfg.metrics->step_tokens, (double)tokens);
  /* the decoders (rows [0, n_dec)) sample together; a prompt chunk that ends its prompt
   * samples alone */
  int n_dec = 0;
  for (int i = 0; i < n; i++) {
    seq *q = who[i];
    if (rc) {
      leave(s, q, NULL, rc, err.msg);
      continue;
    }
    q->n_fed += (size_t)items[i].n;
    if (q->n_fed != q->n_toks) continue;
    if (n_dec == i && items[i].n == 1) n_dec++;
    else sample_rows(s, &who[i], 1, ra_batch_logits(s->batch), i);
  }
  if (!rc && n_dec > 0) sample_rows(s, who, n_dec, ra_batch_logits(s->batch), 0);
  return n;
}

/* A sequence's step result: its store's failure fails it alone. */
static void offload_done(ra_sched *s, seq *q, size_t take, int rc, const ra_error *err, const ra_offload_stats *st) {
  if (rc) {
    ra_metric_add(s->cfg.metrics->store_errors, NULL, 1);
    leave(s, q, NULL, rc, err->msg);
    return;
  }
  if (take == 1) {
    ra_serve_metrics *m = s->cfg.metrics;
    ra_metric_observe(m->store_wait, st->wait_us * 1e-6);
    const struct {
      const char *part;
      double us;
    } parts[] = {{"part=\"total\"", st->total_us},   {"part=\"wait\"", st->wait_us},
                 {"part=\"store\"", st->store_us},   {"part=\"select\"", st->select_us},
                 {"part=\"merge\"", st->merge_us},   {"part=\"append\"", st->append_us},
                 {"part=\"index\"", st->index_us},   {"part=\"retro\"", st->retro_us}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) ra_metric_add(m->decode_parts, parts[i].part, parts[i].us * 1e-6);
  }
  q->n_fed += take;
  if (q->n_fed == q->n_toks) {
    ra_state *rs = ra_offload_state(q->off);
    sample_rows(s, &q, 1, &rs->logits, rs->n_logits - 1);
  }
}

/* Offload modes: the prefill under way, or else the oldest new sequence's, advances by a piece
 * (prefill_chunk tokens' worth of rows of layers; all of it when nobody decodes), then one
 * batched decode step of every running sequence whose prefill is done
 * (ra_offload_decode_batch); how many ran. */
static int step_offload(ra_sched *s) {
  enum { MAX = 256 };
  ra_offload *offs[MAX];
  int32_t toks[MAX], rcs[MAX];
  ra_error errs[MAX];
  ra_offload_stats stats[MAX];
  seq *who[MAX];
  int n = 0, n_prefill = 0;
  seq *next, *first = NULL;
  for (seq *q = s->running; q; q = next) {
    next = q->next;
    if (q->n_fed == 0) {
      /* the one under way, else the oldest (the list runs from the newest) */
      if (!first || !first->prefilling) first = q;
    } else if (n < MAX) {
      offs[n] = q->off;
      toks[n] = q->toks[q->n_fed];
      who[n++] = q;
    }
  }
  if (first) {
    seq *q = first;
    ra_error err;
    ra_error_clear(&err);
    ra_offload_stats st = {0};
    int rc = RA_OK, done = 0;
    if (!q->prefilling) rc = ra_offload_prefill_begin(q->off, q->toks, (int64_t)q->n_toks, &err);
    q->prefilling = rc == RA_OK;
    /* a piece of prefill_chunk tokens' worth through every layer (rows of layers): a short
     * prompt in one step, a long one a layer or part of one at a time; all of it when nobody
     * waits */
    const int64_t L = s->cfg.m->cfg.n_layers, all = (int64_t)q->n_toks * L;
    const int64_t rows = n == 0 || s->cfg.prefill_chunk * L >= all ? all : s->cfg.prefill_chunk * L;
    if (rc == RA_OK) rc = ra_offload_prefill_next(q->off, rows, &done, &st, &err);
    n_prefill = 1;
    if (rc || done) {
      q->prefilling = 0;
      offload_done(s, q, q->n_toks, rc, &err, &st);
    }
  }
  if (n) {
    ra_error err;
    ra_error_clear(&err);
    memset(stats, 0, sizeof(ra_offload_stats) * (size_t)n);
    uint64_t msgs0 = 0, reqs0 = 0, msgs = 0, reqs = 0;
    if (s->attend_batch) ra_remote_batch_counts(s->attend_batch, &msgs0, &reqs0);
    ra_offload_decode_batch(offs, toks, n, s->batch, s->attend_batch, rcs, errs, stats, &err);
    if (s->attend_batch) {
      ra_remote_batch_counts(s->attend_batch, &msgs, &reqs);
      ra_metric_add(s->cfg.metrics->attend_batch, "kind=\"messages\"", (double)(msgs - msgs0));
      ra_metric_add(s->cfg.metrics->attend_batch, "kind=\"requests\"", (double)(reqs - reqs0));
    }
    for (int i = 0; i < n; i++) offload_done(s, who[i], 1, rcs[i], &errs[i], &stats[i]);
  }
  if (n + n_prefill) ra_metric_observe(s->cfg.metrics->batch_size, n + n_prefill);
  return n + n_prefill;
}

static void *engine(void *arg) {
  ra_sched *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->stop && !s->queue && !s->running && !s->waiting) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_sec += 1;
      pthread_cond_timedwait(&s->cv, &s->mu, &ts);
      s->step_end = 0.0;
      if (!s->queue && s->cached) break; /* idle: expire old contexts */
    }
    ra_sched_req *joining = s->queue;
    s->queue = s->queue_tail = NULL;
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    /* the waiting go first, in order, when a context was freed (or none runs: then one that
     * does not fit alone fails); a cancelled one leaves now */
    if (s->waiting && (s->freed || !s->running || stop)) {
      s->waiting_tail->next = joining;
      joining = s->waiting;
      s->waiting = s->waiting_tail = NULL;
      s->freed = 0;
    } else {
      for (ra_sched_req **pr = &s->waiting; *pr;) {
        ra_sched_req *r = *pr;
        if (!req_cancelled(r)) {
          pr = &r->next;
          continue;
        }
        *pr = r->next;
        live_release(s);
        req_finish(r, NULL, RA_ECANCELED, "serve: the client went away");
        req_unref(r);
      }
      s->waiting_tail = NULL;
      for (ra_sched_req *r = s->waiting; r; r = r->next) s->waiting_tail = r;
    }
    while (joining) {
      ra_sched_req *r = joining;
      joining = r->next;
      if (stop) {
        live_release(s);
        req_finish(r, NULL, RA_ECANCELED, "serve: shutting down");
        req_unref(r);
      } else {
        join(s, r);
      }
    }
    seq *next;
    for (seq *q = s->running; q; q = next) {
      next = q->next;
      if (stop) leave(s, q, NULL, RA_ECANCELED, "serve: shutting down");
      else if (req_cancelled(q->req)) leave(s, q, NULL, RA_ECANCELED, "serve: the client went away");
    }
    if (stop) break;
    ra_serve_metrics *m = s->cfg.metrics;
    double t0 = ra_clock_now_s();
    s->forward_s = s->logits_s = 0.0;
    int ran = s->cfg.off.mode == RA_MODE_FULL ? step_full(s) : step_offload(s);
    double t1 = ra_clock_now_s();
    if (ran) {
      if (s->step_end > 0.0) ra_metric_add(m->engine_parts, "part=\"between\"", t0 - s->step_end);
      ra_metric_add(m->engine_parts, "part=\"step\"", t1 - t0);
      if (s->cfg.off.mode == RA_MODE_FULL) {
        ra_metric_add(m->engine_parts, "part=\"forward\"", s->forward_s);
        ra_metric_add(m->engine_parts, "part=\"logits\"", s->logits_s);
        ra_metric_add(m->engine_parts, "part=\"sample\"", t1 - t0 - s->forward_s - s->logits_s);
      }
      ra_metric_add(m->engine_steps, NULL, 1);
    }
    s->step_end = ran ? t1 : 0.0;
    cache_evict(s, s->cfg.max_cached, ra_clock_now_s());
    metrics_contexts(s);
  }
  return NULL;
}

/* ---------- API ---------- */

/* What ra_sched_new made before its engine started, and s. */
static void sched_release(ra_sched *s) {
  ra_remote_batch_free(s->attend_batch);
  ra_batch_free(s->batch);
  ra_tensor_free(&s->picks);
  free(s->ids);
  free(s->vals);
  free(s);
}

int ra_sched_new(const ra_sched_config *cfg, ra_sched **out, ra_error *err) {
  if (cfg->max_seqs < 1 || cfg->max_seqs > 256 || cfg->max_ctx < 2 || cfg->prefill_chunk < 1 || cfg->top_k < 1)
    return ra_errorf(err, RA_EINVAL, "serve: max sequences %d (1..256), context %lld, chunk %lld, top-k %d",
                     cfg->max_seqs, (long long)cfg->max_ctx, (long long)cfg->prefill_chunk, cfg->top_k);
  ra_sched *s = calloc(1, sizeof *s);
  if (!s) return ra_errorf(err, RA_ENOMEM, "serve: out of memory");
  s->cfg = *cfg;
  s->vocab = cfg->m->cfg.vocab;
  if (ra_tok_vocab(cfg->tok) < s->vocab) s->vocab = ra_tok_vocab(cfg->tok); /* padded vocabularies */
  s->k_max = cfg->top_k < s->vocab ? cfg->top_k : s->vocab;
  /* candidates of a step's sequences, k_max each */
  s->ids = malloc(sizeof(int32_t) * (size_t)s->k_max * (size_t)cfg->max_seqs);
  s->vals = malloc(sizeof(float) * (size_t)s->k_max * (size_t)cfg->max_seqs);
  int rc = RA_OK;
  if (!s->ids || !s->vals) rc = ra_errorf(err, RA_ENOMEM, "serve: out of memory");
  /* full: prompt chunks and decoders; offload modes: the decoders, one token each */
  if (rc == RA_OK)
    rc = ra_batch_new(cfg->m, cfg->off.mode == RA_MODE_FULL ? cfg->prefill_chunk + cfg->max_seqs : cfg->max_seqs,
                      cfg->max_seqs, &s->batch, err);
  if (rc == RA_OK && cfg->attend_batch && ra_mode_uses_stores(cfg->off.mode))
    rc = ra_remote_batch_new(&s->attend_batch, err);
  if (rc == RA_OK && s->vocab < cfg->m->cfg.vocab)
    rc = ra_tensor_new(cfg->m->be, &s->picks, RA_DTYPE_F32, 2, (int64_t[2]){cfg->max_seqs, s->vocab}, err);
  if (rc == RA_OK && cfg->kv_budget && cfg->off.mode == RA_MODE_FULL) {
    /* a budget that holds no context is refused here, not at every request (an offload
     * context's size is known at its first, without reaching the stores now) */
    seq *q = NULL;
    rc = seq_new(s, &q, err);
    if (rc == RA_OK) s->ctx_bytes = seq_kv_bytes(q);
    seq_free(q);
    if (rc == RA_OK && s->ctx_bytes > cfg->kv_budget)
      rc = ra_errorf(err, RA_EINVAL, "serve: --kv-budget %zu bytes holds no context: one of %lld tokens takes %zu",
                     cfg->kv_budget, (long long)cfg->max_ctx, s->ctx_bytes);
  }
  if (rc) {
    sched_release(s);
    return rc;
  }
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  if (pthread_create(&s->thread, NULL, engine, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->idle_cv);
    sched_release(s);
    return ra_errorf(err, RA_ENOMEM, "serve: cannot start the engine thread");
  }
  *out = s;
  return RA_OK;
}

void ra_sched_free(ra_sched *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  cache_evict(s, 0, 1e300);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  pthread_cond_destroy(&s->idle_cv);
  sched_release(s);
}

int ra_sched_submit(ra_sched *s, const int32_t *prompt, size_t n_prompt, const ra_sched_params *p, ra_sched_req **out,
                    ra_error *err) {
  if (n_prompt == 0) return ra_errorf(err, RA_EINVAL, "the prompt is empty");
  if (p->max_tokens < 1) return ra_errorf(err, RA_EINVAL, "max_tokens must be at least 1");
  if ((int64_t)n_prompt + p->max_tokens > s->cfg.max_ctx)
    return ra_errorf(err, RA_EINVAL,
                     "this model's maximum context length is %lld tokens; the request has %zu prompt tokens and "
                     "max_tokens %d",
                     (long long)s->cfg.max_ctx, n_prompt, p->max_tokens);
  ra_sched_req *r = calloc(1, sizeof *r);
  if (!r || !(r->prompt = malloc(sizeof(int32_t) * n_prompt))) {
    free(r);
    return ra_errorf(err, RA_ENOMEM, "serve: out of memory");
  }
  memcpy(r->prompt, prompt, sizeof(int32_t) * n_prompt);
  r->n_prompt = n_prompt;
  r->p = *p;
  r->refs = 2; /* the caller's and the engine's */
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  ra_sampler_init(&r->smp, p->temperature, p->top_p, p->seed);
  r->t_submit = ra_clock_now_s();
  pthread_mutex_lock(&s->mu);
  int rc = RA_OK;
  if (s->draining || s->stop) rc = ra_errorf(err, RA_ECANCELED, "the server is shutting down");
  else if (s->n_live >= s->cfg.max_seqs)
    rc = ra_errorf(err, RA_EUNAVAIL, "%d sequences are running, the server's limit (--max-seqs)", s->n_live);
  if (rc == RA_OK) {
    s->n_live++;
    if (s->queue_tail) s->queue_tail->next = r;
    else s->queue = r;
    s->queue_tail = r;
    pthread_cond_broadcast(&s->cv);
  }
  pthread_mutex_unlock(&s->mu);
  if (rc) {
    r->refs = 1;
    req_unref(r);
    return rc;
  }
  *out = r;
  return RA_OK;
}

const char *ra_sched_wait(ra_sched_req *r, size_t seen, int timeout_ms, ra_sched_view *v) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += timeout_ms / 1000;
  ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_mutex_lock(&r->mu);
  while (!r->done && r->visible <= seen)
    if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) == ETIMEDOUT) break;
  v->visible = r->visible;
  v->done = r->done;
  v->finish = r->finish;
  v->err_code = r->err_code;
  snprintf(v->err_msg, sizeof v->err_msg, "%s", r->err_msg);
  v->prompt_tokens = r->n_prompt;
  v->completion_tokens = r->n_gen;
  v->cached_tokens = r->n_cached;
  const char *text = r->text ? r->text : "";
  pthread_mutex_unlock(&r->mu);
  return text;
}

void ra_sched_cancel(ra_sched_req *r) {
  pthread_mutex_lock(&r->mu);
  r->cancelled = 1;
  pthread_mutex_unlock(&r->mu);
}

void ra_sched_release(ra_sched_req *r) {
  if (!r) return;
  ra_sched_cancel(r);
  req_unref(r);
}

int ra_sched_drain(ra_sched *s, int timeout_ms) {
  double end = ra_clock_now_s() + timeout_ms * 1e-3;
  pthread_mutex_lock(&s->mu);
  s->draining = 1;
  while (s->n_live > 0 && ra_clock_now_s() < end) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&s->idle_cv, &s->mu, &ts);
  }
  int rc = s->n_live > 0 ? RA_ETIMEDOUT : RA_OK;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int ra_sched_live(ra_sched *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n_live;
  pthread_mutex_unlock(&s->mu);
  return n;
}
