/* Prometheus metrics: counters, gauges and histograms in one registry, rendered in the text
 * exposition format (version 0.0.4). Thread-safe: every update and the rendering take the
 * registry's mutex, so a scrape sees each metric consistent with itself.
 *
 *   ra_metrics *r;  ra_metrics_new("ra_serve_", &r);
 *   ra_metric *req = ra_metrics_add(r, "requests_total", RA_METRIC_COUNTER, "requests by status", NULL, 0);
 *   ra_metric_add(req, "status=\"200\"", 1);
 *   ra_metrics_render(r, &text, &len);   // "# HELP ra_serve_requests_total ...\n..." */
#ifndef RA_METRICS_H
#define RA_METRICS_H

#include <stddef.h>

typedef enum ra_metric_kind { RA_METRIC_COUNTER, RA_METRIC_GAUGE, RA_METRIC_HISTOGRAM } ra_metric_kind;

#define RA_METRIC_MAX_SERIES 32 /* label values of one metric */
#define RA_METRIC_MAX_BUCKETS 24

typedef struct ra_metrics ra_metrics;
typedef struct ra_metric ra_metric;

/* prefix: prepended to every metric's name ("ra_serve_"). RA_OK or RA_ENOMEM. */
int ra_metrics_new(const char *prefix, ra_metrics **out);
void ra_metrics_free(ra_metrics *r);

/* A metric; for a histogram, `bounds` are its buckets' upper bounds, ascending (n_bounds <=
 * RA_METRIC_MAX_BUCKETS; +Inf is implied). NULL on a bad argument or out of memory. The metric
 * lives as long as the registry. */
ra_metric *ra_metrics_add(ra_metrics *r, const char *name, ra_metric_kind kind, const char *help, const double *bounds,
                          int n_bounds);

/* Counter / gauge of the series named by `labels` (Prometheus label syntax without the braces,
 * e.g. "status=\"200\""; NULL or "" for the unlabelled one): add v, or (gauges) set it to v.
 * A series beyond RA_METRIC_MAX_SERIES is dropped. */
void ra_metric_add(ra_metric *m, const char *labels, double v);
void ra_metric_set(ra_metric *m, const char *labels, double v);
/* Histogram: one observation. */
void ra_metric_observe(ra_metric *m, double v);
/* The current value of a series (tests; 0 for a series never written). */
double ra_metric_value(ra_metric *m, const char *labels);

/* The whole registry as text (malloc'ed, NUL-terminated). RA_OK or RA_ENOMEM. */
int ra_metrics_render(ra_metrics *r, char **out, size_t *len);

#endif
