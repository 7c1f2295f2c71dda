#include "serve_stores.h"

#include "client.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct ra_serve_stores {
  pthread_mutex_t mu;
  const ra_offload_plan *plan;
  ra_kvclient **clients; /* [n_stores], NULL until connected */
};

int ra_serve_stores_new(const ra_offload_plan *plan, ra_serve_stores **out) {
  ra_serve_stores *s = calloc(1, sizeof *s);
  if (!s) return RA_ENOMEM;
  s->plan = plan;
  if (plan && plan->n_stores && !(s->clients = calloc(plan->n_stores, sizeof *s->clients))) {
    free(s);
    return RA_ENOMEM;
  }
  pthread_mutex_init(&s->mu, NULL);
  *out = s;
  return RA_OK;
}

void ra_serve_stores_free(ra_serve_stores *s) {
  if (!s) return;
  for (size_t i = 0; s->plan && i < s->plan->n_stores; i++) ra_kvclient_close(s->clients[i]);
  free(s->clients);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Store i's client (connected now if need be); NULL with err set. Under mu. */
static ra_kvclient *client(ra_serve_stores *s, size_t i, ra_error *err) {
  if (!s->clients[i]) {
    ra_kvclient_options opt = {.timeout_ms = 2000};
    if (ra_kvclient_connect(s->plan->stores[i].addr, &opt, &s->clients[i], err) != RA_OK) s->clients[i] = NULL;
  }
  return s->clients[i];
}

int ra_serve_stores_healthy(ra_serve_stores *s, char *why, size_t why_len) {
  if (!s->plan) return 1;
  pthread_mutex_lock(&s->mu);
  int ok = 1;
  for (size_t i = 0; ok && i < s->plan->n_stores; i++) {
    ra_error err;
    ra_error_clear(&err);
    int serving = 0;
    ra_kvclient *c = client(s, i, &err);
    if (!c || ra_kvclient_health(c, &serving, &err) != RA_OK || !serving) {
      ok = 0;
      snprintf(why, why_len, "kv-store %s: %s", s->plan->stores[i].addr, err.msg[0] ? err.msg : "not serving");
    }
  }
  pthread_mutex_unlock(&s->mu);
  return ok;
}

void ra_serve_stores_metrics(ra_serve_stores *s, ra_serve_metrics *m) {
  if (!s->plan) return;
  pthread_mutex_lock(&s->mu);
  for (size_t i = 0; i < s->plan->n_stores; i++) {
    const char *addr = s->plan->stores[i].addr;
    char lab[320];
    ra_error err;
    ra_kvclient_store_stats st;
    ra_kvclient *c = client(s, i, &err);
    int up = c && ra_kvclient_stats(c, &st, &err) == RA_OK;
    snprintf(lab, sizeof lab, "store=\"%s\"", addr);
    ra_metric_set(m->store_up, lab, up);
    if (!up) continue;
    snprintf(lab, sizeof lab, "store=\"%s\",kind=\"used\"", addr);
    ra_metric_set(m->store_bytes, lab, (double)st.bytes_used);
    snprintf(lab, sizeof lab, "store=\"%s\",kind=\"budget\"", addr);
    ra_metric_set(m->store_bytes, lab, (double)st.bytes_budget);
  }
  pthread_mutex_unlock(&s->mu);
}
