/* cliopt — table-driven command-line parsing for the motor subcommands.
 *
 * Every daemon and tool used to carry the same getopt_long loop, range checks, messages
 * and "config from flag or environment" rule. A subcommand now declares its options as a
 * table of typed destinations; the messages are uniform:
 *   "motor controller: --port must be 0-65535"
 *   "motor controller: unexpected argument 'x'"
 *
 * Threading: main thread only (getopt state is global). */
#ifndef MOTOR_CLIOPT_H
#define MOTOR_CLIOPT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum cliopt_kind {
    CLIOPT_STRING, /* const char **out = optarg (points into argv) */
    CLIOPT_FLAG,   /* bool *out = true */
    CLIOPT_INT,    /* int *out, within [min, max] */
    CLIOPT_I64,    /* int64_t *out, within [min, max] */
    CLIOPT_DOUBLE, /* double *out, within [min, max] */
};

struct cliopt {
    const char *name;  /* long name without "--"; NULL ends the table */
    char short_name;   /* 0 = none; e.g. 'c' for -c */
    enum cliopt_kind kind;
    void *out;
    double min, max;   /* numeric kinds */
    const char *must;  /* numeric kinds: what the value must be, for the message, e.g.
                        * "0-65535"; NULL = "a number in [min, max]" */
};

/* Parse argv (argv[0] is the subcommand) against opts; "-h"/"--help" is built in.
 * prog names the tool in messages ("motor controller"); usage(out) prints its help.
 * Returns 0 to go on, 1 when help was printed to stdout (exit 0), 2 after printing a
 * usage error (exit 2). Destinations of options not given are left untouched, so
 * callers preset their defaults. At most 32 options. */
int cliopt_parse(const char *prog, int argc, char **argv, const struct cliopt *opts,
                 void (*usage)(FILE *out));

/* Apply a --log-level value (NULL = not given: nothing to do). Returns 0, or 2 after
 * printing "<prog>: invalid --log-level '<value>'" (exit 2). */
int cliopt_log_level(const char *prog, const char *value);

/* The configuration file to read: the flag's value when non-empty, else
 * $USER_CONFIG_PATH, else $CONFIG_PATH (upstream's order), else NULL. */
const char *cliopt_config_path(const char *flag_value);

struct cfg_errors;
typedef void (*cliopt_apply_fn)(void *cfg, json_t *root, struct cfg_errors *e);

/* A daemon's configuration step: read `path` (NULL = none: defaults only) and hand the
 * document to apply(cfg, ...), collecting every problem under `section` (the cfg_errors
 * prefix). Problems are printed to stderr ("<prog>: invalid configuration PATH (N
 * errors):" and the list) and logged (config_invalid). 0, or -EINVAL. */
int cliopt_load_config(const char *prog, const char *path, const char *section,
                       cliopt_apply_fn apply, void *cfg);

#endif
