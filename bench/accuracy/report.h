/* Reports of an accuracy run: the Markdown summary (per task and mode, per length, the
 * extrapolation lengths apart, text fidelity) and one heat map PNG per mode (needle depth x
 * length), drawn by gnuplot.
 *
 * Comparisons count only the tasks where full attention scores >= 50 % in-distribution (a 135M
 * model fails some tasks outright; a mode cannot be judged on them). */
#ifndef RA_ACC_REPORT_H
#define RA_ACC_REPORT_H

#include "runner.h"

/* Mean score of task t in mode index mi (into cfg.modes) over the records with length in
 * [len_lo, len_hi] (and depth index di, or any when di < 0); NAN when there is none. */
double ra_acc_mean(const ra_acc_results *r, ra_acc_task t, int mi, int len_lo, int len_hi, int di);

/* Whether task t counts for comparisons: full (mode 0) >= 0.5 over lengths <= trained_ctx. */
int ra_acc_task_counts(const ra_acc_results *r, ra_acc_task t, int trained_ctx);

typedef struct ra_acc_report_info {
  const char *model;     /* the model file, for the title */
  const char *backend;
  int trained_ctx;       /* lengths above it are reported as extrapolation */
  const ra_acc_fidelity *fidelity; /* [n_fidelity] or NULL */
  int n_fidelity, fidelity_prompt, fidelity_forced;
  int fidelity_generated; /* forced along full attention's own continuation, not the corpus */
} ra_acc_report_info;

/* dir/summary.md, and dir/heatmap_<mode>.png (+ .dat, .gp) for every mode when gnuplot runs
 * (a missing gnuplot is reported in the summary and with RA_EUNAVAIL after writing the rest). */
int ra_acc_report_write(const char *dir, const ra_acc_config *cfg, const ra_acc_results *r,
                        const ra_acc_report_info *info, ra_error *err);

#endif
