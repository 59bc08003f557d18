/* cfg — typed access to JSON configuration with validation that collects every error.
 *
 * Getters take a dot-separated path relative to an object ("api_config.pod_ip"). A
 * missing key (or JSON null) yields the default. A present key with the wrong type or
 * out of range records an error naming the full path, the rule and the value found,
 * and yields the default, so one pass reports all problems at once:
 *
 *   struct cfg_errors errs; cfg_errors_init(&errs, "motor_nodemanger_config");
 *   int port = cfg_get_int(nm, "api_config.node_manager_port", 1026, 1, 65535, &errs);
 *   ...
 *   if (cfg_errors_count(&errs)) { fprintf(stderr, "%s\n", cfg_errors_text(&errs)); exit(1); }
 *
 * Types are strict: booleans are not numbers, numbers are not booleans; an integer
 * getter accepts a JSON real only when it has no fraction (2.0). The checks themselves
 * are common/jval.h's, shared with the wire parsers; this module words them (the
 * offending value shown) and collects them. A path through a
 * non-object ("a.b" where a is 5) is reported once at the offending prefix ("a: must be
 * an object, got 5"). Keys containing '.' cannot be addressed by a path. Strings with
 * an embedded NUL are rejected. Control characters in recorded lines are shown as \xNN
 * so a key from the file cannot forge report lines. Not thread-safe. */
#ifndef MOTOR_CFG_H
#define MOTOR_CFG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cfg_errors {
    char *prefix; /* prepended to every path ("" for none) */
    char *text;   /* "path: message\n" lines */
    size_t len;
    int count;
};

void cfg_errors_init(struct cfg_errors *e, const char *prefix);
void cfg_errors_release(struct cfg_errors *e);
/* Record an error at path (relative to the prefix). */
void cfg_error(struct cfg_errors *e, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cfg_errors_count(const struct cfg_errors *e);
/* Replace the prefix for errors recorded from now on, e.g. "cfg.servers[2]" while
 * validating one array element with element-relative paths. */
void cfg_errors_set_prefix(struct cfg_errors *e, const char *prefix);
/* All errors, one per line ("" when none). Valid until the next cfg_error/release. */
const char *cfg_errors_text(const struct cfg_errors *e);

/* Read and parse a JSON file (max 16 MiB) whose top level must be an object. On error
 * returns NULL and records why (missing file, syntax error with line/column). */
json_t *cfg_load_file(const char *path, struct cfg_errors *e);
/* Parse len bytes of JSON text (max 16 MiB; need not be NUL-terminated) with the same
 * rules and messages as cfg_load_file. New reference or NULL (error recorded). */
json_t *cfg_load_buffer(const char *data, size_t len, struct cfg_errors *e);

/* Look up a dot path; NULL when missing or null. Borrowed reference. */
json_t *cfg_lookup(json_t *obj, const char *path);
/* The same for getters: a non-object on the way is reported once, at its own path
 * ("a: must be an object, got 5"). */
json_t *cfg_get_value(json_t *obj, const char *path, struct cfg_errors *e);

/* Readers of one value v (not NULL) found at path, for callers that walked to it
 * themselves (cfgtab.h): true with *out set, or false with the error recorded. The
 * messages are the getters'. *out of cfg_read_string is borrowed from v. */
bool cfg_read_int(json_t *v, const char *path, int64_t min, int64_t max, int64_t *out,
                  struct cfg_errors *e);
bool cfg_read_double(json_t *v, const char *path, double min, double max, double *out,
                     struct cfg_errors *e);
bool cfg_read_bool(json_t *v, const char *path, bool *out, struct cfg_errors *e);
bool cfg_read_string(json_t *v, const char *path, const char **out, struct cfg_errors *e);
bool cfg_read_enum(json_t *v, const char *path, const char *const *allowed, int *index,
                   struct cfg_errors *e);
bool cfg_read_object(json_t *v, const char *path, struct cfg_errors *e);
bool cfg_read_array(json_t *v, const char *path, struct cfg_errors *e);

int64_t cfg_get_int(json_t *obj, const char *path, int64_t def, int64_t min, int64_t max,
                    struct cfg_errors *e);
double cfg_get_double(json_t *obj, const char *path, double def, double min, double max,
                      struct cfg_errors *e);
bool cfg_get_bool(json_t *obj, const char *path, bool def, struct cfg_errors *e);
/* Borrowed string (owned by obj) or def. */
const char *cfg_get_string(json_t *obj, const char *path, const char *def, struct cfg_errors *e);
/* One of allowed (NULL-terminated list; compared case-sensitively; the result is the
 * allowed[] entry) or def. */
const char *cfg_get_enum(json_t *obj, const char *path, const char *def, const char *const *allowed,
                         struct cfg_errors *e);
/* The same as an index into allowed, def when missing or invalid. */
int cfg_get_enum_index(json_t *obj, const char *path, int def, const char *const *allowed,
                       struct cfg_errors *e);
/* An object (borrowed) or NULL when missing; wrong type => error and NULL. */
json_t *cfg_get_object(json_t *obj, const char *path, struct cfg_errors *e);
json_t *cfg_get_array(json_t *obj, const char *path, struct cfg_errors *e);

/* The shortest "%g" rendering of v that reads back as v (0.001, not 0.00100000000000000002),
 * as messages show numbers. */
void cfg_fmt_double(double v, char *buf, size_t cap);

/* Secret files (API keys, key passwords): at most this many bytes are read. */
#define CFG_SECRET_MAX 4096
/* Read a secret from a file: its first line, trailing blanks dropped. 0 with *out a
 * fresh string; -errno when unreadable, -EINVAL when empty, -EFBIG above
 * CFG_SECRET_MAX. The file's bytes are wiped from freed memory. */
int cfg_read_secret(const char *path, char **out);

#endif
