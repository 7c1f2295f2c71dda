/* metrics: counters by label, gauges, histogram buckets (cumulative) in the Prometheus text. */
#include "metrics.h"
#include "status.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_render(void **state) {
  (void)state;
  ra_metrics *r;
  assert_int_equal(ra_metrics_new("t_", &r), RA_OK);
  ra_metric *c = ra_metrics_add(r, "requests_total", RA_METRIC_COUNTER, "requests", NULL, 0);
  ra_metric *g = ra_metrics_add(r, "live", RA_METRIC_GAUGE, "live sequences", NULL, 0);
  double bounds[] = {0.1, 1};
  ra_metric *h = ra_metrics_add(r, "ttft_seconds", RA_METRIC_HISTOGRAM, "ttft", bounds, 2);
  double bad[] = {1, 0.5};
  assert_null(ra_metrics_add(r, "bad", RA_METRIC_HISTOGRAM, "x", bad, 2));
  assert_non_null(c);
  ra_metric_add(c, "status=\"200\"", 2);
  ra_metric_add(c, "status=\"400\"", 1);
  ra_metric_add(c, "status=\"200\"", 1);
  ra_metric_set(g, NULL, 5);
  ra_metric_set(g, NULL, 3);
  ra_metric_observe(h, 0.05);
  ra_metric_observe(h, 0.5);
  ra_metric_observe(h, 7);
  assert_true(ra_metric_value(c, "status=\"200\"") == 3);
  char *text;
  size_t len;
  assert_int_equal(ra_metrics_render(r, &text, &len), RA_OK);
  assert_int_equal(strlen(text), len);
  assert_non_null(strstr(text, "# TYPE t_requests_total counter\n"));
  assert_non_null(strstr(text, "t_requests_total{status=\"200\"} 3\n"));
  assert_non_null(strstr(text, "t_requests_total{status=\"400\"} 1\n"));
  assert_non_null(strstr(text, "t_live 3\n"));
  assert_non_null(strstr(text, "t_ttft_seconds_bucket{le=\"0.1\"} 1\nt_ttft_seconds_bucket{le=\"1\"} 2\n"
                               "t_ttft_seconds_bucket{le=\"+Inf\"} 3\nt_ttft_seconds_sum 7.55\nt_ttft_seconds_count 3\n"));
  free(text);
  ra_metrics_free(r);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_render)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
