/* httpd_internal — the pure parts of httpd (route and path matching, the HTTP/1.1
 * request head parser and the chunked body decoder), exposed so the unit tests and the
 * libFuzzer targets can drive them without sockets.
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
 * after the first idle timeout, sending a request or reading an answer (plain
 * listeners). For tests: on loopback the kernel wakes a writer only after tens of KiB
 * drained, so a reader slower than 500 B/s yet never idle for a whole timeout needs a
 * long timeout; a higher rate shows the same rule in a second. */
void httpd_set_min_rate(struct httpd *h, unsigned bytes_per_s);

/* ---- request head parser (httpd_parse.c) ------------------------------------------ */

/* A request head (request line + header block + blank line) larger than this is
 * refused with 431; so is one with more than HTTPD_MAX_HEADERS header lines. */
#define HTTPD_HEAD_MAX (16u * 1024)
#define HTTPD_MAX_HEADERS 64

struct httpd_hdr_view { /* views into the parsed buffer, not NUL-terminated */
    const char *name;
    size_t name_len;
    const char *value; /* surrounding white space trimmed */
    size_t value_len;
};

struct httpd_head {
    const char *method;
    size_t method_len;
    /* Path and query. Origin-form: the whole target (starts with '/'). Absolute-form
     * ("http://authority/path?q", scheme http or https in any case): what follows the
     * authority, which may be empty or start with '?' (the path is then "/"). */
    const char *target;
    size_t target_len;
    bool absolute_form;
    /* The authority of an absolute-form target, else the Host header's value (possibly
     * empty); NULL when there is neither (HTTP/1.0 only: HTTP/1.1 requires a Host). */
    const char *host;
    size_t host_len;
    int minor; /* HTTP/1.<minor>: 0 or 1 */
    size_t nhdrs;
    struct httpd_hdr_view hdrs[HTTPD_MAX_HEADERS];
    /* framing and connection handling, from the headers */
    bool has_length;
    uint64_t content_length;
    bool chunked;         /* Transfer-Encoding: chunked (Content-Length is then absent) */
    bool keep_alive;      /* the connection may carry another request after this one */
    bool expect_continue; /* Expect: 100-continue */
};

/* Parse a request head from buf[0..len). Returns the head's length in bytes (> 0,
 * blank line included; empty lines before the request line are skipped and counted)
 * once complete; 0 when more bytes are needed; or -EINVAL (malformed: answer 400 —
 * this includes an HTTP/1.1 request without Host and not in absolute-form, more than
 * one Host, a Host or authority with characters no host:port has, an absolute-form
 * target with another scheme, an empty host or userinfo; RFC 9112 §3.2, §3.2.2),
 * -EMSGSIZE (head above HTTPD_HEAD_MAX or too many headers: 431), -ENOTSUP (a
 * Transfer-Encoding other than chunked: 501), -EPROTONOSUPPORT (not HTTP/1.x: 505).
 * Never reads beyond buf[len-1]. Line ends may be CRLF or a bare LF. */
int httpd_parse_head(const char *buf, size_t len, struct httpd_head *head);

/* Percent-decode src[0..len) into dst (room for len + 1 bytes), NUL-terminated;
 * plus_space turns '+' into ' ' (query strings). Invalid escapes are kept literally.
 * Returns the decoded length, or -EINVAL when the result would contain a NUL byte. */
int httpd_url_decode(char *dst, const char *src, size_t len, bool plus_space);

/* Chunked request body decoder, resumable at any byte boundary. */
struct httpd_chunked {
    int state;
    uint64_t left;   /* bytes of chunk data still to come */
    size_t digits;   /* hex digits of the current size */
    size_t line;     /* bytes in the current extension / trailer line */
    size_t trailers; /* trailer bytes so far */
};

/* Decode buf[0..len) in place: chunk data is moved to buf[0..*out_len) (never ahead of
 * the input, so in place is safe); *consumed says how much input was used. Returns 1
 * when the terminating chunk and trailers are complete (input after *consumed belongs to
 * the next request), 0 when all input was used and more is needed, -EINVAL when
 * malformed (bad size line, more than 16 size digits, size above 2^60, missing CRLF
 * after data, a line ended by anything but CRLF, an extension or trailer line above
 * 4 KiB, trailers above 8 KiB). The caller caps the total size. */
int httpd_chunked_decode(struct httpd_chunked *c, char *buf, size_t len, size_t *consumed,
                         size_t *out_len);

#endif
