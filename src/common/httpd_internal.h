/* httpd_internal — the pure parts of httpd (route and path matching), exposed so the
 * unit tests and the libFuzzer targets can drive them without sockets. (The HTTP/1.1
 * syntax both directions share is in http1.h.)
 * Not part of the public contract: only httpd*.c, tests and fuzzers include this. */
#ifndef MOTOR_HTTPD_INTERNAL_H
#define MOTOR_HTTPD_INTERNAL_H

#include "common/httpd.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Path parameters per route: "{name}" segments beyond this make the route unmatchable
 * (httpd_route() refuses such patterns, so in practice it never happens). */
#define HTTPD_MAX_PARAMS 8

/* One "{name}" capture: views into the pattern and the path (not NUL-terminated). */
struct httpd_param_view {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};

struct httpd_params {
    size_t n;
    struct httpd_param_view p[HTTPD_MAX_PARAMS];
};

struct httpd_route_entry {
    char *method;
    char *pattern;
    httpd_handler fn;
    void *arg;
    unsigned flags;
};

enum httpd_match {
    HTTPD_MATCH_FOUND = 0,
    HTTPD_MATCH_NO_PATH,    /* => 404 */
    HTTPD_MATCH_BAD_METHOD, /* => 405; allow lists the methods that would match */
};

/* Match an absolute path against a pattern whose segments may be "{name}" (matching
 * any non-empty segment). Segments are compared exactly (so "/a/" differs from "/a").
 * On success fills params (views into pattern and path); on failure params->n is
 * unspecified. */
bool httpd_path_match(const char *pattern, const char *path, struct httpd_params *params);

/* Check a pattern is usable: starts with '/', "{...}" only as whole segments with a
 * non-empty name, at most HTTPD_MAX_PARAMS of them. */
bool httpd_pattern_valid(const char *pattern);

/* Find the first route whose pattern matches path and whose method equals method
 * (a GET route also answers HEAD, as Starlette does). On HTTPD_MATCH_FOUND *idx and
 * params are set. On HTTPD_MATCH_BAD_METHOD, allow (if cap > 0) receives the
 * comma-separated methods of the routes matching the path (truncated to cap-1 bytes,
 * always NUL-terminated). */
enum httpd_match httpd_routes_find(const struct httpd_route_entry *routes, size_t n,
                                   const char *method, const char *path, size_t *idx,
                                   struct httpd_params *params, char *allow, size_t cap);

/* The average rate (bytes per second, 0 = the default 500) a slow client must keep up
 * after the first idle timeout, sending a request or reading an answer (plain and TLS
 * listeners alike). For tests: on loopback the kernel wakes a writer only after tens of KiB
 * drained, so a reader slower than 500 B/s yet never idle for a whole timeout needs a
 * long timeout; a higher rate shows the same rule in a second. */
void httpd_set_min_rate(struct httpd *h, unsigned bytes_per_s);

#endif
