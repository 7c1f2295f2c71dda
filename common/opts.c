#include "opts.h"

#include "textfile.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define USAGE_HELP_COL 28 /* help text starts here */
#define USAGE_WIDTH 100   /* and wraps before this column */
#define CONFIG_MAX_BYTES (1u << 20)

/* ---- values ---- */

int ra_opts_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, ra_error *err) {
  if (!s || !*s || isspace((unsigned char)*s)) return ra_errorf(err, RA_EINVAL, "not an integer");
  errno = 0;
  char *end;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end) return ra_errorf(err, RA_EINVAL, "not an integer");
  if (errno == ERANGE || v < lo || v > hi) {
    if (hi == INT64_MAX) return ra_errorf(err, RA_EINVAL, "must be at least %" PRId64, lo);
    return ra_errorf(err, RA_EINVAL, "must be %" PRId64 " to %" PRId64, lo, hi);
  }
  *out = v;
  return RA_OK;
}

int ra_opts_parse_int_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max, int *n, ra_error *err) {
  const char *p = s ? s : "";
  char item[32];
  int k = 0;
  for (;;) {
    size_t len = strcspn(p, ",");
    if (k == max) return ra_errorf(err, RA_EINVAL, "at most %d values", max);
    if (len == 0 || len >= sizeof item) return ra_errorf(err, RA_EINVAL, "not a list of integers");
    memcpy(item, p, len);
    item[len] = '\0';
    int rc = ra_opts_parse_int(item, lo, hi, &out[k++], err);
    if (rc) return rc;
    if (!p[len]) break;
    p += len + 1;
  }
  *n = k;
  return RA_OK;
}

/* "64M" when v is a whole number of the largest such unit, else the plain number. */
static void fmt_u64(char *buf, size_t n, uint64_t v, int suffix) {
  static const char units[] = "KMGT";
  int u = -1;
  while (suffix && v && u < 3 && v % (1ull << (10 * (u + 2))) == 0) u++;
  if (u < 0) snprintf(buf, n, "%" PRIu64, v);
  else snprintf(buf, n, "%" PRIu64 "%c", v >> (10 * (u + 1)), units[u]);
}

static int u64_range_error(uint64_t lo, uint64_t hi, int suffix, ra_error *err) {
  char a[32], b[32];
  fmt_u64(a, sizeof a, lo, suffix);
  fmt_u64(b, sizeof b, hi, suffix);
  if (hi == UINT64_MAX) return ra_errorf(err, RA_EINVAL, "must be at least %s", a);
  return ra_errorf(err, RA_EINVAL, "must be %s to %s", a, b);
}

int ra_opts_parse_u64(const char *s, int suffix, uint64_t lo, uint64_t hi, uint64_t *out, ra_error *err) {
  const char *what = suffix ? "not a size like 64G or 512M" : "not an integer";
  if (!s || !isdigit((unsigned char)*s)) {
    /* "-1" is a number, only out of range */
    if (s && *s == '-' && isdigit((unsigned char)s[1])) return u64_range_error(lo, hi, suffix, err);
    return ra_errorf(err, RA_EINVAL, "%s", what);
  }
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno == ERANGE) return u64_range_error(lo, hi, suffix, err);
  unsigned shift = 0;
  if (suffix && *end) {
    const char *units = "KMGT", *u = strchr(units, toupper((unsigned char)*end));
    if (!u) return ra_errorf(err, RA_EINVAL, "%s", what);
    shift = 10 * (unsigned)(u - units + 1);
    end++;
    if (*end == 'B' || *end == 'b') end++;
  }
  if (*end) return ra_errorf(err, RA_EINVAL, "%s", what);
  if (shift && v > (UINT64_MAX >> shift)) return u64_range_error(lo, hi, suffix, err);
  v <<= shift;
  if (v < lo || v > hi) return u64_range_error(lo, hi, suffix, err);
  *out = v;
  return RA_OK;
}

static int parse_float(const ra_opt *r, const char *s, double *out, ra_error *err) {
  char *end;
  double v = strtod(s, &end);
  if (!*s || isspace((unsigned char)*s) || *end || !isfinite(v)) return ra_errorf(err, RA_EINVAL, "not a number");
  int open = (r->flags & RA_OPT_OPEN_LO) != 0;
  if ((open ? v > r->flo : v >= r->flo) && v <= r->fhi) {
    *out = v;
    return RA_OK;
  }
  if (r->fhi == HUGE_VAL) return ra_errorf(err, RA_EINVAL, "must be %s %g", open ? ">" : ">=", r->flo);
  return ra_errorf(err, RA_EINVAL, "must be %s %g and <= %g", open ? ">" : ">=", r->flo, r->fhi);
}

/* Integers of any width: the low `size` bytes of v, which read back as v through a signed or an
 * unsigned field of that width whenever v is in the field's range. */
static int write_int(void *field, size_t size, int64_t v) {
  switch (size) {
    case 1: { uint8_t u = (uint8_t)v; memcpy(field, &u, 1); return RA_OK; }
    case 2: { uint16_t u = (uint16_t)v; memcpy(field, &u, 2); return RA_OK; }
    case 4: { uint32_t u = (uint32_t)v; memcpy(field, &u, 4); return RA_OK; }
    case 8: { uint64_t u = (uint64_t)v; memcpy(field, &u, 8); return RA_OK; }
  }
  return RA_EINTERNAL;
}

static int64_t read_int(const void *field, size_t size, int is_signed) {
  switch (size) {
    case 1: { uint8_t u; memcpy(&u, field, 1); return is_signed ? (int8_t)u : (int64_t)u; }
    case 2: { uint16_t u; memcpy(&u, field, 2); return is_signed ? (int16_t)u : (int64_t)u; }
    case 4: { uint32_t u; memcpy(&u, field, 4); return is_signed ? (int32_t)u : (int64_t)u; }
    case 8: { int64_t v; memcpy(&v, field, 8); return v; }
  }
  return 0;
}

/* "f32, f16 or bf16" (sep ", ") or "f32|f16|bf16" (sep "|"). */
static void enum_names(const ra_opt *r, const char *sep, const char *last_sep, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = '\0';
  for (int64_t v = r->lo; v <= r->hi && at < n; v++)
    at += (size_t)snprintf(buf + at, n - at, "%s%s", v == r->lo ? "" : v == r->hi ? last_sep : sep,
                           r->name_of((int)v));
}

/* Whether row r's field has a size its kind can write. */
static int row_size_ok(const ra_opt *r) {
  switch (r->kind) {
    case RA_OPT_FLAG:
    case RA_OPT_INT: return r->size == 1 || r->size == 2 || r->size == 4 || r->size == 8;
    case RA_OPT_U64:
    case RA_OPT_SIZE:
    case RA_OPT_FLOAT: return r->size == 4 || r->size == 8;
    case RA_OPT_STRING: return r->size == sizeof(const char *);
    case RA_OPT_ENUM: return r->size == sizeof(int) && r->name_of;
    case RA_OPT_CUSTOM: return r->parse != NULL;
  }
  return 0;
}

/* Writes `value` into row r's field; RA_EINVAL with the reason alone in err. */
static int row_set(const ra_opt *r, void *field, const char *value, ra_error *err) {
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  int rc;
  if (!row_size_ok(r)) return ra_errorf(err, RA_EINTERNAL, "kind %d, field of %zu bytes", (int)r->kind, r->size);
  switch (r->kind) {
    case RA_OPT_FLAG:
      return write_int(field, r->size, 1);
    case RA_OPT_INT:
      if ((rc = ra_opts_parse_int(value, r->lo, r->hi, &i, err))) return rc;
      return write_int(field, r->size, i);
    case RA_OPT_U64:
    case RA_OPT_SIZE:
      if ((rc = ra_opts_parse_u64(value, r->kind == RA_OPT_SIZE, r->ulo, r->uhi, &u, err))) return rc;
      return write_int(field, r->size, (int64_t)u);
    case RA_OPT_FLOAT:
      if ((rc = parse_float(r, value, &d, err))) return rc;
      if (r->size == sizeof(float)) {
        float f = (float)d;
        memcpy(field, &f, sizeof f);
      } else {
        memcpy(field, &d, sizeof d);
      }
      return RA_OK;
    case RA_OPT_STRING:
      memcpy(field, &value, sizeof value);
      return RA_OK;
    case RA_OPT_ENUM:
      for (int64_t v = r->lo; v <= r->hi; v++) {
        if (strcmp(value, r->name_of((int)v)) == 0) {
          int e = (int)v;
          memcpy(field, &e, sizeof e);
          return RA_OK;
        }
      }
      {
        char names[256];
        enum_names(r, ", ", " or ", names, sizeof names);
        return ra_errorf(err, RA_EINVAL, "must be %s", names);
      }
    case RA_OPT_CUSTOM:
      return r->parse(value, field, err);
  }
  return ra_errorf(err, RA_EINTERNAL, "option kind %d", (int)r->kind);
}

/* ---- rows ---- */

typedef struct found {
  const ra_opts_table *t;
  size_t i;
} found;

static int find_row(const ra_opts_set *s, const char *name, found *out) {
  for (size_t t = 0; t < s->n_tables; t++) {
    for (size_t i = 0; i < s->tables[t].n_rows; i++) {
      if (strcmp(s->tables[t].rows[i].name, name) == 0) {
        *out = (found){&s->tables[t], i};
        return 1;
      }
    }
  }
  return 0;
}

static int in_scope(const ra_opts_set *s, const ra_opt *r) {
  return !s->scope || !r->scope || (r->scope & s->scope);
}

/* "generate/dump-qk" for the bits of mask. */
static void scope_list(const ra_opts_set *s, unsigned mask, const char *sep, char *buf, size_t n) {
  size_t at = 0;
  buf[0] = '\0';
  for (unsigned b = 0; b < 32 && at < n; b++)
    if (mask & (1u << b))
      at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? sep : "", s->scope_names ? s->scope_names[b] : "?");
}

/* Sets the row called `name` (pfx: "--" on the command line, "" in a file) to value (NULL:
 * none given). */
static int set_option(const ra_opts_set *s, const char *pfx, const char *name, const char *value, int in_file,
                      ra_error *err) {
  found f;
  if (!find_row(s, name, &f)) return ra_errorf(err, RA_EINVAL, "unknown option %s%s", pfx, name);
  const ra_opt *r = &f.t->rows[f.i];
  if (!in_scope(s, r)) {
    char mine[128], here[128];
    scope_list(s, r->scope, "/", mine, sizeof mine);
    scope_list(s, s->scope, "/", here, sizeof here);
    return ra_errorf(err, RA_EINVAL, "%s%s is a %s option, not %s", pfx, name, mine, here);
  }
  if (in_file && (r->flags & RA_OPT_ARGV_ONLY))
    return ra_errorf(err, RA_EINVAL, "%s cannot be set in a config file", name);
  if (r->kind == RA_OPT_FLAG && value) return ra_errorf(err, RA_EINVAL, "%s%s takes no value", pfx, name);
  if (r->kind != RA_OPT_FLAG && !value) return ra_errorf(err, RA_EINVAL, "%s%s needs a value", pfx, name);
  ra_error why;
  ra_error_clear(&why);
  int rc = row_set(r, (char *)f.t->target + r->offset, value, &why);
  if (rc == RA_EINTERNAL) return ra_errorf(err, rc, "%s%s: bad option row (%s)", pfx, name, why.msg);
  if (rc) return ra_errorf(err, rc, "bad %s%s %s: %s", pfx, name, value ? value : "", why.msg);
  if (f.t->given) f.t->given[f.i] = 1;
  return RA_OK;
}

int ra_opts_parse_args(const ra_opts_set *s, int argc, char *const *argv, ra_error *err) {
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (strncmp(a, "--", 2) != 0 || !a[2]) return ra_errorf(err, RA_EINVAL, "unexpected argument '%s'", a);
    found f;
    /* a flag takes no value; any other option takes the next argument, whatever it looks like */
    const char *value = NULL;
    if (find_row(s, a + 2, &f) && f.t->rows[f.i].kind != RA_OPT_FLAG && i + 1 < argc) value = argv[++i];
    int rc = set_option(s, "--", a + 2, value, 0, err);
    if (rc) return rc;
  }
  return RA_OK;
}

int ra_opts_given(const ra_opts_set *s, const char *name) {
  found f;
  return find_row(s, name, &f) && f.t->given && f.t->given[f.i];
}

/* ---- config files ---- */

static char *trim(char *p) {
  while (*p == ' ' || *p == '\t') p++;
  char *e = p + strlen(p);
  while (e > p && isspace((unsigned char)e[-1])) *--e = '\0';
  return p;
}

int ra_opts_parse_file(const ra_opts_set *s, const char *path, char **text, ra_error *err) {
  int rc = ra_textfile_read(path, CONFIG_MAX_BYTES, text, NULL, err);
  if (rc) {
    if (err) ra_error_wrap(err, "config file");
    return rc;
  }
  int line = 0;
  for (char *p = *text, *next; p; p = next) {
    line++;
    next = strchr(p, '\n');
    if (next) *next++ = '\0';
    char *name = trim(p);
    if (!*name || *name == '#') continue;
    char *value = name + strcspn(name, " \t");
    if (*value) {
      *value++ = '\0';
      value = trim(value);
    }
    rc = set_option(s, "", name, *value ? value : NULL, 1, err);
    if (rc) {
      if (err) ra_error_wrap(err, "%s:%d", path, line);
      return rc;
    }
  }
  return RA_OK;
}

/* ---- usage ---- */

/* Writes `text` from column `col` on, breaking lines before USAGE_WIDTH and at '\n'; continued
 * lines start at USAGE_HELP_COL. Returns the column it ends at. */
static int put_wrapped(FILE *f, const char *text, int col) {
  int space = 0; /* a blank is due before the next word */
  for (const char *p = text; *p;) {
    if (*p == ' ') {
      space = col > USAGE_HELP_COL;
      p++;
    } else if (*p == '\n') {
      fprintf(f, "\n%*s", USAGE_HELP_COL, "");
      col = USAGE_HELP_COL;
      space = 0;
      p++;
    } else {
      int word = (int)strcspn(p, " \n");
      if (space && col + 1 + word >= USAGE_WIDTH) {
        fprintf(f, "\n%*s", USAGE_HELP_COL, "");
        col = USAGE_HELP_COL;
      } else if (space) {
        fputc(' ', f);
        col++;
      }
      fwrite(p, 1, (size_t)word, f);
      col += word;
      p += word;
      space = 0;
    }
  }
  return col;
}

/* The default of row r as found in its field; "" when there is none to show. */
static void row_default(const ra_opt *r, const void *field, char *buf, size_t n) {
  buf[0] = '\0';
  if (r->dflt) {
    snprintf(buf, n, "%s", r->dflt);
    return;
  }
  switch (r->kind) {
    case RA_OPT_FLAG:
      break;
    case RA_OPT_INT: {
      int64_t v = read_int(field, r->size, r->lo < 0);
      if (v >= r->lo && v <= r->hi) snprintf(buf, n, "%" PRId64, v); /* else a sentinel */
      break;
    }
    case RA_OPT_U64:
    case RA_OPT_SIZE: {
      uint64_t v = (uint64_t)read_int(field, r->size, 0);
      if (v >= r->ulo && v <= r->uhi) fmt_u64(buf, n, v, r->kind == RA_OPT_SIZE);
      break;
    }
    case RA_OPT_FLOAT: {
      double v;
      if (r->size == sizeof(float)) {
        float x;
        memcpy(&x, field, sizeof x);
        v = x;
      } else {
        memcpy(&v, field, sizeof v);
      }
      snprintf(buf, n, "%g", v);
      break;
    }
    case RA_OPT_STRING: {
      const char *v;
      memcpy(&v, field, sizeof v);
      if (v) snprintf(buf, n, "%s", v);
      break;
    }
    case RA_OPT_ENUM: {
      int v;
      memcpy(&v, field, sizeof v);
      if (v >= r->lo && v <= r->hi) snprintf(buf, n, "%s", r->name_of(v));
      break;
    }
    case RA_OPT_CUSTOM: {
      const char *v = r->show ? r->show(field) : NULL;
      if (v) snprintf(buf, n, "%s", v);
      break;
    }
  }
}

static void usage_row(const ra_opt *r, const void *target, FILE *f) {
  char meta[256], lhs[320], dflt[128];
  if (r->kind == RA_OPT_ENUM && !r->meta) enum_names(r, "|", "|", meta, sizeof meta);
  else snprintf(meta, sizeof meta, "%s", r->meta ? r->meta : r->kind == RA_OPT_FLAG ? "" : "VALUE");
  int col = snprintf(lhs, sizeof lhs, "  --%s%s%s", r->name, *meta ? " " : "", meta);
  fputs(lhs, f);
  if (col + 2 > USAGE_HELP_COL) {
    fprintf(f, "\n%*s", USAGE_HELP_COL, "");
  } else {
    fprintf(f, "%*s", USAGE_HELP_COL - col, "");
  }
  row_default(r, (const char *)target + r->offset, dflt, sizeof dflt);
  col = put_wrapped(f, r->help ? r->help : "", USAGE_HELP_COL);
  if (*dflt) {
    /* "(default X)" is one unit: never broken between its words */
    int len = (int)strlen(dflt) + 10;
    if (col > USAGE_HELP_COL && col + 1 + len >= USAGE_WIDTH) fprintf(f, "\n%*s", USAGE_HELP_COL, "");
    else if (col > USAGE_HELP_COL) fputc(' ', f);
    fprintf(f, "(default %s)", dflt);
  }
  fputc('\n', f);
}

void ra_opts_usage(const ra_opts_set *s, FILE *f) {
  unsigned heading = ~0u;
  int one_scope = s->scope && !(s->scope & (s->scope - 1)); /* one heading: every row is its */
  if (one_scope) fputs("options:\n", f);
  for (size_t t = 0; t < s->n_tables; t++) {
    for (size_t i = 0; i < s->tables[t].n_rows; i++) {
      const ra_opt *r = &s->tables[t].rows[i];
      if (!in_scope(s, r)) continue;
      if (!one_scope && r->scope != heading) {
        char names[256];
        scope_list(s, r->scope, ", ", names, sizeof names);
        if (r->scope) fprintf(f, "options of %s:\n", names);
        else fputs("options:\n", f);
        heading = r->scope;
      }
      usage_row(r, s->tables[t].target, f);
    }
  }
}
