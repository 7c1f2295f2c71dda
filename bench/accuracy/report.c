#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ra_acc_mean(const ra_acc_results *r, ra_acc_task t, int mi, int len_lo, int len_hi, int di) {
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i < r->n; i++) {
    const ra_acc_record *x = &r->recs[i];
    if (x->task != t || x->length < len_lo || x->length > len_hi || (di >= 0 && x->depth_index != di)) continue;
    sum += x->modes[mi].score;
    n++;
  }
  return n ? sum / n : NAN;
}

int ra_acc_task_counts(const ra_acc_results *r, ra_acc_task t, int trained_ctx) {
  double full = ra_acc_mean(r, t, 0, 0, trained_ctx, -1);
  return !isnan(full) && full >= 0.5;
}

static void cell(FILE *f, double v) {
  if (isnan(v)) fputs(" – |", f);
  else fprintf(f, " %.0f |", 100 * v);
}

/* The modes as table columns. */
static void mode_header(FILE *f, const ra_acc_config *cfg) {
  char label[RA_ACC_LABEL_MAX];
  for (int i = 0; i < cfg->n_modes; i++) fprintf(f, " %s |", ra_acc_mode_label(cfg->modes[i], cfg->retro[i], label));
}

/* Sequential tasks: per answer position, the fraction of samples answering it right, per mode
 * (sparse attention's error accumulating over the generation shows as falling rows). */
static void sequential_table(FILE *f, const ra_acc_config *cfg, const ra_acc_results *r) {
  int k_max = 0;
  for (size_t j = 0; j < r->n; j++)
    if (r->recs[j].task == RA_ACC_LONGGEN_NEEDLES && r->recs[j].modes[0].n_items > k_max)
      k_max = r->recs[j].modes[0].n_items;
  if (k_max == 0) return;
  fprintf(f, "## %s: per answer, in the order generated\n\n| answer |", ra_acc_task_name(RA_ACC_LONGGEN_NEEDLES));
  mode_header(f, cfg);
  fputs("\n|---|", f);
  for (int i = 0; i < cfg->n_modes; i++) fputs("---|", f);
  fputc('\n', f);
  for (int k = 0; k < k_max; k++) {
    fprintf(f, "| %d |", k + 1);
    for (int i = 0; i < cfg->n_modes; i++) {
      int n = 0, hit = 0;
      for (size_t j = 0; j < r->n; j++) {
        const ra_acc_mode_result *m = &r->recs[j].modes[i];
        if (r->recs[j].task != RA_ACC_LONGGEN_NEEDLES || k >= m->n_items) continue;
        n++;
        hit += m->items[k];
      }
      cell(f, n ? (double)hit / n : NAN);
    }
    fputc('\n', f);
  }
  fputc('\n', f);
}

/* Task x mode table over lengths [lo, hi]. */
static void task_table(FILE *f, const ra_acc_config *cfg, const ra_acc_results *r, int lo, int hi, int trained_ctx) {
  fputs("| task | counts |", f);
  mode_header(f, cfg);
  fputs("\n|---|---|", f);
  for (int i = 0; i < cfg->n_modes; i++) fputs("---|", f);
  fputc('\n', f);
  double sum[RA_ACC_MAX_MODES] = {0};
  int n_counted = 0;
  for (int ti = 0; ti < cfg->n_tasks; ti++) {
    ra_acc_task t = cfg->tasks[ti];
    int counts = ra_acc_task_counts(r, t, trained_ctx);
    fprintf(f, "| %s | %s |", ra_acc_task_name(t), counts ? "yes" : "no");
    double v[RA_ACC_MAX_MODES];
    int any = 1;
    for (int i = 0; i < cfg->n_modes; i++) {
      v[i] = ra_acc_mean(r, t, i, lo, hi, -1);
      cell(f, v[i]);
      any &= !isnan(v[i]);
    }
    if (counts && any) {
      for (int i = 0; i < cfg->n_modes; i++) sum[i] += v[i];
      n_counted++;
    }
    fputc('\n', f);
  }
  fputs("| **mean, counted tasks** | |", f);
  for (int i = 0; i < cfg->n_modes; i++) cell(f, n_counted ? sum[i] / n_counted : NAN);
  fputs("\n\n", f);
}

/* Mean over the counted tasks of one length (and depth index, or any), for mode mi. */
static double counted_mean(const ra_acc_config *cfg, const ra_acc_results *r, int mi, int len, int di, int need_depth,
                           int trained_ctx) {
  double sum = 0;
  int n = 0;
  for (int ti = 0; ti < cfg->n_tasks; ti++) {
    ra_acc_task t = cfg->tasks[ti];
    if (!ra_acc_task_counts(r, t, trained_ctx) || (need_depth && !ra_acc_task_has_depth(t))) continue;
    double v = ra_acc_mean(r, t, mi, len, len, di);
    if (isnan(v)) continue;
    sum += v;
    n++;
  }
  return n ? sum / n : NAN;
}

/* *drawn: 0 when no cell has data (no counted needle task): nothing to plot. */
static int heatmap(const char *dir, const ra_acc_config *cfg, const ra_acc_results *r, int mi, int trained_ctx,
                   int *drawn, ra_error *err) {
  char mode[RA_ACC_LABEL_MAX];
  ra_acc_mode_label(cfg->modes[mi], cfg->retro[mi], mode);
  char dat[1024], gp[1024], png[1024];
  snprintf(dat, sizeof dat, "%s/heatmap_%s.dat", dir, mode);
  snprintf(gp, sizeof gp, "%s/heatmap_%s.gp", dir, mode);
  snprintf(png, sizeof png, "%s/heatmap_%s.png", dir, mode);
  FILE *f = fopen(dat, "w");
  if (!f) return ra_errorf(err, RA_EIO, "accuracy: cannot write %s", dat);
  /* matrix: one row per depth, one column per length; percent, NaN where nothing counted */
  *drawn = 0;
  for (int d = 0; d < cfg->n_depths; d++) {
    for (int l = 0; l < cfg->n_lengths; l++) {
      double v = counted_mean(cfg, r, mi, cfg->lengths[l], d, 1, trained_ctx);
      *drawn |= !isnan(v);
      fprintf(f, "%s%s", l ? " " : "", isnan(v) ? "NaN" : "");
      if (!isnan(v)) fprintf(f, "%.1f", 100 * v);
    }
    fputc('\n', f);
  }
  fclose(f);
  if (!*drawn) return RA_OK;
  if (!(f = fopen(gp, "w"))) return ra_errorf(err, RA_EIO, "accuracy: cannot write %s", gp);
  fprintf(f, "set terminal pngcairo size 720,480\nset output '%s'\n", png);
  fprintf(f, "set title '%s: exact match %%, counted needle tasks (> %d tokens: extrapolation)'\n", mode,
          trained_ctx);
  fputs("set xlabel 'context length (tokens)'\nset ylabel 'needle depth'\nset cbrange [0:100]\n"
        "set palette defined (0 '#b2182b', 50 '#fee08b', 100 '#1a9850')\nset xtics (", f);
  for (int l = 0; l < cfg->n_lengths; l++) fprintf(f, "%s\"%d\" %d", l ? ", " : "", cfg->lengths[l], l);
  fputs(")\nset ytics (", f);
  for (int d = 0; d < cfg->n_depths; d++) fprintf(f, "%s\"%.2f\" %d", d ? ", " : "", cfg->depths[d], d);
  fprintf(f, ")\nset xrange [-0.5:%d.5]\nset yrange [-0.5:%d.5]\nunset key\n", cfg->n_lengths - 1, cfg->n_depths - 1);
  /* one box per cell (not `with image`, which needs a 2 x 2 grid at least); '-' where nothing counted */
  fprintf(f,
          "plot '%s' matrix using 1:2:($1-0.5):($1+0.5):($2-0.5):($2+0.5):3 with boxxy fc palette fs solid 1.0 "
          "noborder, '' matrix using 1:2:($3 == $3 ? sprintf('%%.0f', $3) : '-') with labels\n",
          dat);
  fclose(f);
  char cmd[2200];
  snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>/dev/null", gp);
  if (system(cmd) != 0) return ra_errorf(err, RA_EUNAVAIL, "accuracy: gnuplot failed on %s (deploy/setup.sh installs gnuplot-nox)", gp);
  return RA_OK;
}

int ra_acc_report_write(const char *dir, const ra_acc_config *cfg, const ra_acc_results *r,
                        const ra_acc_report_info *info, ra_error *err) {
  char path[1024];
  snprintf(path, sizeof path, "%s/summary.md", dir);
  FILE *f = fopen(path, "w");
  if (!f) return ra_errorf(err, RA_EIO, "accuracy: cannot write %s", path);
  int tc = info->trained_ctx;
  fprintf(f, "# Long-context accuracy: %s (%s backend)\n\n", info->model ? info->model : "?",
          info->backend ? info->backend : "?");
  fprintf(f, "Sink %u, window %u, top-k %u, index build: %u queries x top-%u; %d sample(s) per (task, length, "
             "depth), seed %llu. Scores: %% of expected values matched exactly (greedy decode), one prefill per "
             "sample. A task *counts* when full attention scores >= 50 %% at lengths <= %d; the means are over "
             "counted tasks only.\n\n",
          cfg->off.n_sink, cfg->off.n_window, cfg->off.top_k, cfg->off.build_queries, cfg->off.knn_nq, cfg->samples,
          (unsigned long long)cfg->seed, tc);
  fprintf(f, "## Lengths up to %d (trained context)\n\n", tc);
  task_table(f, cfg, r, 0, tc, tc);
  fputs("### Per length, counted tasks\n\n| length |", f);
  mode_header(f, cfg);
  fputs("\n|---|", f);
  for (int i = 0; i < cfg->n_modes; i++) fputs("---|", f);
  fputc('\n', f);
  int extrapolated = 0;
  for (int l = 0; l < cfg->n_lengths; l++) {
    if (cfg->lengths[l] > tc) extrapolated = 1;
    fprintf(f, "| %d%s |", cfg->lengths[l], cfg->lengths[l] > tc ? " (extrapolation)" : "");
    for (int i = 0; i < cfg->n_modes; i++) cell(f, counted_mean(cfg, r, i, cfg->lengths[l], -1, 0, tc));
    fputc('\n', f);
  }
  fputc('\n', f);
  if (extrapolated) {
    fprintf(f, "## Extrapolation: lengths above %d (beyond the trained context)\n\n", tc);
    task_table(f, cfg, r, tc + 1, 1 << 30, tc);
  }
  sequential_table(f, cfg, r);
  if (info->fidelity && info->n_fidelity > 0) {
    fprintf(f, "## Text fidelity\n\nTeacher-forced: %d tokens of %s after a %d-token prompt, every "
               "mode against full attention at every step. Attention error: ||att_mode - att_full|| / ||att_full|| "
               "of a layer's output, mean over steps (earlier layers' errors propagate into it).\n\n"
               "| mode | top-1 = full | mean KL(full ‖ mode) | att. rel. error: mean | layer 0 | middle | last |\n"
               "|---|---|---|---|---|---|---|\n",
            info->fidelity_forced,
            info->fidelity_generated ? "full attention's own greedy continuation" : "license text",
            info->fidelity_prompt);
    for (int i = 0; i < info->n_fidelity; i++) {
      const ra_acc_fidelity *x = &info->fidelity[i];
      double mean = 0;
      for (int l = 0; l < x->n_layers; l++) mean += x->att_rel[l] / x->n_layers;
      char label[RA_ACC_LABEL_MAX];
      fprintf(f, "| %s | %.1f %% | %.3e | %.3e | %.3e | %.3e | %.3e |\n", ra_acc_mode_label(x->mode, x->retro, label),
              100 * x->top1,
              x->kl_mean, mean, x->att_rel[0], x->att_rel[x->n_layers / 2], x->att_rel[x->n_layers - 1]);
    }
    fputc('\n', f);
  }
  int rc = RA_OK, drawn = 0;
  for (int i = 0; i < cfg->n_modes && rc == RA_OK; i++) rc = heatmap(dir, cfg, r, i, tc, &drawn, err);
  fprintf(f, "Heat maps (needle depth x length, counted needle tasks): %s\n",
          rc != RA_OK ? "not drawn (gnuplot failed)"
          : drawn     ? "`heatmap_<mode>.png`"
                      : "none (no needle task counts)");
  fclose(f);
  return rc;
}
