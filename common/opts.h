/* Command-line options from tables: each option is one row (name, kind, bounds, the field it
 * writes, help); the parser, the config-file reader and the usage text all read the rows, and
 * the defaults the usage shows are read from a default-initialized target struct, so that an
 * option's name, bounds and default are each stated once.
 *
 *   static const ra_opt rows[] = {
 *       {"window", RA_OPT_INT, RA_OPT_AT(my_opts, window), .lo = 1, .hi = 1 << 20, .meta = "N",
 *        .help = "recent tokens kept"},
 *   };
 *   my_opts o = my_defaults();
 *   ra_opts_table t = {rows, RA_OPTS_COUNT(rows), &o, NULL};
 *   ra_opts_set s = {&t, 1, NULL, 0};
 *   rc = ra_opts_parse_args(&s, argc - 1, argv + 1, &err);
 *
 * A set holds several tables, each with its own target, so that a program can add rows it
 * builds at run time (from another table of parameters) next to its static ones. */
#ifndef RA_OPTS_H
#define RA_OPTS_H

#include "status.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum ra_opt_kind {
  RA_OPT_FLAG,   /* no value: the int field is set to 1 */
  RA_OPT_INT,    /* decimal integer in [lo, hi]; a signed or unsigned field of 1, 2, 4 or 8 bytes */
  RA_OPT_U64,    /* decimal integer in [ulo, uhi]; a uint64_t field */
  RA_OPT_SIZE,   /* bytes with an optional K/M/G/T suffix (binary, optional B) in [ulo, uhi];
                  * a uint64_t or size_t field */
  RA_OPT_FLOAT,  /* finite number in [flo, fhi] (or (flo, fhi] with RA_OPT_OPEN_LO); float or
                  * double field */
  RA_OPT_STRING, /* const char *: points into argv, or into the config file's text */
  RA_OPT_ENUM,   /* one of the names name_of(lo) .. name_of(hi); an int-sized enum field */
  RA_OPT_CUSTOM, /* parse(value, field, err) writes the field; show(field) names it in the usage */
} ra_opt_kind;

enum {
  RA_OPT_OPEN_LO = 1u << 0,   /* RA_OPT_FLOAT: the value must be above flo, not equal */
  RA_OPT_ARGV_ONLY = 1u << 1, /* refused in a config file (e.g. the option naming the file) */
};

typedef struct ra_opt {
  const char *name; /* the long flag without "--"; also its name in a config file */
  ra_opt_kind kind;
  size_t offset;    /* the field in the table's target struct: RA_OPT_AT(type, member) */
  size_t size;
  int64_t lo, hi;   /* RA_OPT_INT bounds, RA_OPT_ENUM values */
  uint64_t ulo, uhi; /* RA_OPT_U64 / RA_OPT_SIZE bounds */
  double flo, fhi;  /* RA_OPT_FLOAT bounds; fhi may be HUGE_VAL */
  const char *(*name_of)(int value); /* RA_OPT_ENUM */
  /* RA_OPT_CUSTOM: RA_OK, or RA_EINVAL with the reason in err ("not HOST:PORT"). */
  int (*parse)(const char *value, void *field, ra_error *err);
  const char *(*show)(const void *field); /* RA_OPT_CUSTOM: the default in the usage; NULL: none */
  const char *meta;  /* the value's placeholder in the usage ("N", "PATH"); enums list their names */
  const char *help;  /* '\n' starts a new line of help */
  const char *dflt;  /* shown as the default instead of the field (a computed one: "all cores") */
  unsigned scope;    /* bit i: the option belongs to scope i (a command); 0: to every scope */
  unsigned flags;    /* RA_OPT_* */
} ra_opt;

/* .offset and .size of a member of the table's target struct (nested members allowed). */
#define RA_OPT_AT(type, member) .offset = offsetof(type, member), .size = sizeof(((type *)0)->member)
#define RA_OPTS_COUNT(rows) (sizeof(rows) / sizeof((rows)[0]))

typedef struct ra_opts_table {
  const ra_opt *rows;
  size_t n_rows;
  void *target;         /* the struct the rows write; the usage reads the defaults from it */
  unsigned char *given; /* optional, [n_rows]: set to 1 for every row given; see ra_opts_given */
} ra_opts_table;

typedef struct ra_opts_set {
  const ra_opts_table *tables;
  size_t n_tables;
  const char *const *scope_names; /* scope bit i's name, for messages and usage headings */
  unsigned scope; /* the scopes in effect: a row of other scopes is refused by the parsers and
                   * left out of the usage; 0: every row applies */
} ra_opts_set;

/* Parses argv[0 .. argc): "--name value", or "--name" for a flag; a later value overrides an
 * earlier one. RA_OK, or RA_EINVAL with a message ("unknown option --x", "--ctx needs a value",
 * "bad --window 0: must be 1 to 1048576", "--out is a dump-qk option, not generate"). */
int ra_opts_parse_args(const ra_opts_set *s, int argc, char *const *argv, ra_error *err);

/* Reads the options of a config file: one per line, "name value" (the value is the rest of the
 * line, trimmed) or "name" for a flag; lines whose first non-blank is '#' and blank lines are
 * skipped. String options point into *text, which the caller frees (it is set whenever the file
 * was read, also on failure). Errors name the file and the line ("kv.conf:3: ..."); RA_EIO when
 * the file cannot be read. */
int ra_opts_parse_file(const ra_opts_set *s, const char *path, char **text, ra_error *err);

/* Whether the row `name` was given (tables without `given` never report it). */
int ra_opts_given(const ra_opts_set *s, const char *name);

/* Writes one line per row in the set's scope: "  --name META  help (default X)", rows grouped
 * under a heading whenever the scope changes, defaults read from the tables' targets. */
void ra_opts_usage(const ra_opts_set *s, FILE *f);

/* The project's one integer parser: a decimal integer (optional sign, no blanks) in [lo, hi].
 * RA_EINVAL with the reason in err ("not an integer", "must be 1 to 8"). */
int ra_opts_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out, ra_error *err);
/* A comma-separated list of 1 .. max such integers ("1,4,16") into out[0 .. *n). */
int ra_opts_parse_int_list(const char *s, int64_t lo, int64_t hi, int64_t *out, int max, int *n, ra_error *err);
/* As ra_opts_parse_int for unsigned values; with `suffix`, a K/M/G/T (x 2^10 .. 2^40) suffix,
 * optionally followed by B, is allowed ("512M" -> 536870912). */
int ra_opts_parse_u64(const char *s, int suffix, uint64_t lo, uint64_t hi, uint64_t *out, ra_error *err);

#endif
