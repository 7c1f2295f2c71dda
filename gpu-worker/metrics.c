#include "metrics.h"

#include "status.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct series {
  char *labels;
  double value;
} series;

struct ra_metric {
  ra_metrics *reg;
  char *name, *help;
  ra_metric_kind kind;
  series s[RA_METRIC_MAX_SERIES];
  int n_series;
  double bounds[RA_METRIC_MAX_BUCKETS];
  unsigned long long buckets[RA_METRIC_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last: +Inf */
  int n_bounds;
  double sum;
  unsigned long long count;
  struct ra_metric *next;
};

struct ra_metrics {
  pthread_mutex_t mu;
  char *prefix;
  ra_metric *first, *last;
};

int ra_metrics_new(const char *prefix, ra_metrics **out) {
  ra_metrics *r = calloc(1, sizeof *r);
  if (!r || !(r->prefix = strdup(prefix ? prefix : ""))) {
    free(r);
    return RA_ENOMEM;
  }
  pthread_mutex_init(&r->mu, NULL);
  *out = r;
  return RA_OK;
}

void ra_metrics_free(ra_metrics *r) {
  if (!r) return;
  for (ra_metric *m = r->first, *n; m; m = n) {
    n = m->next;
    for (int i = 0; i < m->n_series; i++) free(m->s[i].labels);
    free(m->name);
    free(m->help);
    free(m);
  }
  pthread_mutex_destroy(&r->mu);
  free(r->prefix);
  free(r);
}

ra_metric *ra_metrics_add(ra_metrics *r, const char *name, ra_metric_kind kind, const char *help, const double *bounds,
                          int n_bounds) {
  if (!r || !name || n_bounds < 0 || n_bounds > RA_METRIC_MAX_BUCKETS || (n_bounds && !bounds)) return NULL;
  for (int i = 1; i < n_bounds; i++)
    if (!(bounds[i] > bounds[i - 1])) return NULL;
  ra_metric *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  size_t nl = strlen(r->prefix) + strlen(name) + 1;
  m->name = malloc(nl);
  m->help = strdup(help ? help : "");
  if (!m->name || !m->help) {
    free(m->name);
    free(m->help);
    free(m);
    return NULL;
  }
  snprintf(m->name, nl, "%s%s", r->prefix, name);
  m->reg = r;
  m->kind = kind;
  m->n_bounds = n_bounds;
  if (n_bounds) memcpy(m->bounds, bounds, sizeof(double) * (size_t)n_bounds);
  pthread_mutex_lock(&r->mu);
  if (r->last) r->last->next = m;
  else r->first = m;
  r->last = m;
  pthread_mutex_unlock(&r->mu);
  return m;
}

/* The series of `labels`, created when new; NULL when the metric has no room. Under the mutex. */
static series *series_of(ra_metric *m, const char *labels) {
  if (!labels) labels = "";
  for (int i = 0; i < m->n_series; i++)
    if (strcmp(m->s[i].labels, labels) == 0) return &m->s[i];
  if (m->n_series == RA_METRIC_MAX_SERIES) return NULL;
  series *s = &m->s[m->n_series];
  if (!(s->labels = strdup(labels))) return NULL;
  s->value = 0;
  m->n_series++;
  return s;
}

static void update(ra_metric *m, const char *labels, double v, int set) {
  if (!m || m->kind == RA_METRIC_HISTOGRAM) return;
  pthread_mutex_lock(&m->reg->mu);
  series *s = series_of(m, labels);
  if (s) s->value = set ? v : s->value + v;
  pthread_mutex_unlock(&m->reg->mu);
}

void ra_metric_add(ra_metric *m, const char *labels, double v) { update(m, labels, v, 0); }
void ra_metric_set(ra_metric *m, const char *labels, double v) { update(m, labels, v, 1); }

void ra_metric_observe(ra_metric *m, double v) {
  if (!m || m->kind != RA_METRIC_HISTOGRAM) return;
  pthread_mutex_lock(&m->reg->mu);
  int b = 0;
  while (b < m->n_bounds && v > m->bounds[b]) b++;
  m->buckets[b]++;
  m->sum += v;
  m->count++;
  pthread_mutex_unlock(&m->reg->mu);
}

double ra_metric_value(ra_metric *m, const char *labels) {
  if (!m) return 0;
  pthread_mutex_lock(&m->reg->mu);
  double v = 0;
  if (m->kind == RA_METRIC_HISTOGRAM) v = (double)m->count;
  else
    for (int i = 0; i < m->n_series; i++)
      if (strcmp(m->s[i].labels, labels ? labels : "") == 0) v = m->s[i].value;
  pthread_mutex_unlock(&m->reg->mu);
  return v;
}

typedef struct out_buf {
  char *p;
  size_t len, cap;
  int failed;
} out_buf;

static void outf(out_buf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void outf(out_buf *o, const char *fmt, ...) {
  if (o->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
      o->failed = 1;
      return;
    }
    if ((size_t)n < o->cap - o->len) {
      o->len += (size_t)n;
      return;
    }
    size_t cap = (o->cap + (size_t)n + 1) * 2;
    char *p = realloc(o->p, cap);
    if (!p) {
      o->failed = 1;
      return;
    }
    o->p = p;
    o->cap = cap;
  }
}

/* A number as Prometheus reads it (integers without a fraction). */
static void out_num(out_buf *o, double v) {
  if (isinf(v)) outf(o, v > 0 ? "+Inf" : "-Inf");
  else if (v == floor(v) && fabs(v) < 1e15) outf(o, "%.0f", v);
  else outf(o, "%.9g", v);
}

int ra_metrics_render(ra_metrics *r, char **out, size_t *len) {
  static const char *const kinds[] = {"counter", "gauge", "histogram"};
  out_buf o = {malloc(4096), 0, 4096, 0};
  if (!o.p) return RA_ENOMEM;
  o.p[0] = 0;
  pthread_mutex_lock(&r->mu);
  for (ra_metric *m = r->first; m; m = m->next) {
    outf(&o, "# HELP %s %s\n# TYPE %s %s\n", m->name, m->help, m->name, kinds[m->kind]);
    if (m->kind == RA_METRIC_HISTOGRAM) {
      unsigned long long cum = 0;
      for (int b = 0; b <= m->n_bounds; b++) {
        cum += m->buckets[b];
        outf(&o, "%s_bucket{le=\"", m->name);
        out_num(&o, b < m->n_bounds ? m->bounds[b] : HUGE_VAL);
        outf(&o, "\"} %llu\n", cum);
      }
      outf(&o, "%s_sum ", m->name);
      out_num(&o, m->sum);
      outf(&o, "\n%s_count %llu\n", m->name, m->count);
      continue;
    }
    if (m->n_series == 0) outf(&o, "%s 0\n", m->name); /* a metric is listed before its first update */
    for (int i = 0; i < m->n_series; i++) {
      if (m->s[i].labels[0]) outf(&o, "%s{%s} ", m->name, m->s[i].labels);
      else outf(&o, "%s ", m->name);
      out_num(&o, m->s[i].value);
      outf(&o, "\n");
    }
  }
  pthread_mutex_unlock(&r->mu);
  if (o.failed) {
    free(o.p);
    return RA_ENOMEM;
  }
  *out = o.p;
  *len = o.len;
  return RA_OK;
}
