#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define HARNESS_MAX_ARGS 32
#define HARNESS_START_MS 10000

/* Stores still running when the test process exits (a failed assertion jumps past the stop):
 * killed at exit, or they would keep the test's output pipe open and ctest would wait on it. */
enum { MAX_LIVE = 64 };
static pid_t live[MAX_LIVE];

static void kill_live(void) {
  for (int i = 0; i < MAX_LIVE; i++)
    if (live[i] > 0) {
      kill(live[i], SIGKILL);
      waitpid(live[i], NULL, 0);
      live[i] = 0;
    }
}

static void track(pid_t pid, int on) {
  static int registered;
  if (!registered) registered = atexit(kill_live) == 0;
  for (int i = 0; i < MAX_LIVE; i++)
    if (on ? live[i] == 0 : live[i] == pid) {
      live[i] = on ? pid : 0;
      return;
    }
}

static void sleep_ms(int ms) {
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Reads "HOST:PORT\n" from the ready file; 1 when it is there. */
static int read_ready(harness_store *s) {
  FILE *f = fopen(s->ready_file, "r");
  if (!f) return 0;
  int ok = fgets(s->addr, sizeof s->addr, f) != NULL;
  fclose(f);
  if (!ok) return 0;
  s->addr[strcspn(s->addr, "\n")] = '\0';
  return s->addr[0] != '\0';
}

int harness_store_start(harness_store *s, const char *const *extra_args) {
  static int counter;
  memset(s, 0, sizeof *s);
  const char *bin_dir = getenv("RA_BIN_DIR");
  if (!bin_dir) {
    fprintf(stderr, "harness: RA_BIN_DIR is not set\n");
    return -1;
  }
  char bin[512];
  snprintf(bin, sizeof bin, "%s/kv-store", bin_dir);
  snprintf(s->ready_file, sizeof s->ready_file, "/tmp/ra-itest-%d-%d.ready", (int)getpid(),
           counter++);
  unlink(s->ready_file);

  const char *argv[HARNESS_MAX_ARGS + 8];
  int n = 0;
  argv[n++] = bin;
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  argv[n++] = "--ready-file";
  argv[n++] = s->ready_file;
  argv[n++] = "--log-level";
  argv[n++] = "warn";
  for (int i = 0; extra_args && extra_args[i] && i < HARNESS_MAX_ARGS; i++) argv[n++] = extra_args[i];
  argv[n] = NULL;
  int rc = posix_spawn(&s->pid, bin, NULL, NULL, (char *const *)argv, environ);
  if (rc != 0) {
    fprintf(stderr, "harness: cannot spawn %s: %s\n", bin, strerror(rc));
    return -1;
  }
  track(s->pid, 1);
  for (int waited = 0; waited < HARNESS_START_MS; waited += 10) {
    if (read_ready(s)) return 0;
    int status;
    if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
      fprintf(stderr, "harness: kv-store exited before it was ready (status %d)\n", status);
      track(s->pid, 0);
      s->pid = 0;
      return -1;
    }
    sleep_ms(10);
  }
  fprintf(stderr, "harness: kv-store not ready after %d ms\n", HARNESS_START_MS);
  kill(s->pid, SIGKILL);
  waitpid(s->pid, NULL, 0);
  track(s->pid, 0);
  s->pid = 0;
  return -1;
}

int harness_store_stop(harness_store *s, int timeout_ms) {
  if (s->pid <= 0) return -1;
  kill(s->pid, SIGTERM);
  int status = 0, result = -1;
  for (int waited = 0;; waited += 10) {
    pid_t r = waitpid(s->pid, &status, WNOHANG);
    if (r == s->pid) {
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (r < 0 && errno != EINTR) break;
    if (waited >= timeout_ms) {
      kill(s->pid, SIGKILL);
      waitpid(s->pid, NULL, 0);
      break;
    }
    sleep_ms(10);
  }
  unlink(s->ready_file);
  track(s->pid, 0);
  s->pid = 0;
  return result;
}
