/* httpc internals: the two backends behind httpc.h and the pure HTTP/1.1 response
 * parser the native backend uses (exposed for unit tests and the fuzzer).
 *
 * httpc.c owns the public API and dispatches by URL scheme: http:// goes to the native
 * backend (httpc_native.c, no libcurl), https:// to libcurl (httpc_curl.c), which is
 * loaded with dlopen on the first https request — a process that never makes one never
 * maps libcurl and its TLS/Kerberos/LDAP dependency chain.
 *
 * Every request handle (struct httpc_req) of either backend starts with a struct
 * httpc_req_hdr, so httpc_cancel() can tell which backend owns it.
 *
 * Threading: as httpc.h (the reactor's thread), except the parser (pure, any thread). */
#ifndef MOTOR_HTTPC_INTERNAL_H
#define MOTOR_HTTPC_INTERNAL_H

#include "common/httpc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define HTTPC_DEFAULT_TIMEOUT_MS 30000
#define HTTPC_DEFAULT_CONNECT_TIMEOUT_MS 5000
#define HTTPC_DEFAULT_MAX_RESPONSE (16u * 1024 * 1024)

struct httpc_req_hdr {
    bool is_curl;
};

/* ---- native backend (httpc_native.c) ---------------------------------------------- */

struct httpc_native;

struct httpc_native *httpc_native_new(struct reactor *r);
/* As httpc_free(): in-flight requests are dropped silently; deferred while one of its
 * callbacks is on the stack. NULL-safe. */
void httpc_native_free(struct httpc_native *n);
struct httpc_req *httpc_native_request(struct httpc_native *n, const struct httpc_opts *o,
                                       httpc_done_cb done, void *arg);
/* A request that completes (from the reactor, never from inside this call) with
 * error/text; text is copied. For failures found before any backend could run it. */
struct httpc_req *httpc_native_fail(struct httpc_native *n, int error, const char *text,
                                    httpc_done_cb done, void *arg);
void httpc_native_cancel(struct httpc_native *n, struct httpc_req *q);
size_t httpc_native_active(const struct httpc_native *n);

/* ---- libcurl backend (httpc_curl.c) ------------------------------------------------ */

struct httpc_curl;

/* Loads libcurl (once per process) and initializes it. 0, or -errno with *why set to a
 * static operator-facing message (dynlib_error()). */
int httpc_curl_load(const char **why);
/* NULL when libcurl could not be loaded or initialized (*why says why). */
struct httpc_curl *httpc_curl_new(struct reactor *r, const char **why);
void httpc_curl_free(struct httpc_curl *cu);
struct httpc_req *httpc_curl_request(struct httpc_curl *cu, const struct httpc_opts *o,
                                     httpc_done_cb done, void *arg);
void httpc_curl_cancel(struct httpc_curl *cu, struct httpc_req *q);
size_t httpc_curl_active(const struct httpc_curl *cu);

/* ---- URL parsing (httpc_parse.c) --------------------------------------------------- */

#define HTTPC_HOST_MAX 256

struct httpc_url {
    bool https;
    char host[HTTPC_HOST_MAX]; /* without brackets for IPv6 literals */
    bool ipv6;                 /* host was a [bracketed] literal */
    int port;                  /* default 80 / 443 */
    const char *path;          /* into the URL: "/..." path + query, "" = "/" */
    size_t path_len;
};

/* Parses "http[s]://host[:port][/path][?query]" (fragment dropped). 0, or -EINVAL
 * (bad syntax, CR/LF/space/control bytes, userinfo, port out of range) or
 * -EPROTONOSUPPORT (another scheme), with *why set to static text. */
int httpc_url_parse(const char *url, struct httpc_url *u, const char **why);

/* ---- response parsing (httpc_parse.c) ---------------------------------------------- */

#define HTTPC_HEAD_MAX (64u * 1024) /* status line + headers */
#define HTTPC_CTYPE_MAX 256

struct httpc_head {
    int status;             /* 100..999 */
    int minor;              /* HTTP/1.<minor> */
    int64_t content_length; /* -1 when absent */
    bool chunked;           /* Transfer-Encoding ends in chunked */
    bool conn_close;        /* Connection: close */
    bool keep_alive;        /* Connection: keep-alive (matters for HTTP/1.0) */
    bool has_ctype;
    char ctype[HTTPC_CTYPE_MAX]; /* Content-Type value (truncated to fit) */
};

/* Looks for a complete response head at buf[0..len). Returns the head's length (> 0,
 * including the blank line) with *h filled; 0 when more bytes are needed (and len <
 * HTTPC_HEAD_MAX); -EPROTO when malformed or when no head ends within HTTPC_HEAD_MAX
 * bytes. Never reads outside buf[0..len). Bare LF line ends are accepted. */
ssize_t httpc_parse_head(const char *buf, size_t len, struct httpc_head *h);

/* Body framing of a response to `method_head` (a HEAD request) with head h. */
enum httpc_body { HTTPC_BODY_NONE, HTTPC_BODY_LENGTH, HTTPC_BODY_CHUNKED, HTTPC_BODY_CLOSE };
enum httpc_body httpc_body_kind(const struct httpc_head *h, bool method_head);
/* May the connection carry another request after this response (framing permitting)? */
bool httpc_head_reusable(const struct httpc_head *h);

#define HTTPC_CHUNK_LINE_MAX 4096     /* size line incl. extensions */
#define HTTPC_TRAILERS_MAX (64u * 1024)

/* Chunked transfer decoding, incremental: state between arbitrary splits of input. */
struct httpc_chunked {
    int st;
    uint64_t left;  /* data bytes left in the current chunk */
    size_t line;    /* bytes of the current size or trailer line */
    size_t trailers;
    int digits;
    bool done;      /* the last chunk and the trailers were consumed */
};

void httpc_chunked_init(struct httpc_chunked *d);
/* Consumes a prefix of in[0..len). Returns the number of bytes consumed (> 0 unless
 * len == 0 or d->done), and when some of them are body data, points *data and *dlen at
 * them (inside in; at most one run per call); or -EPROTO on malformed framing or caps
 * exceeded. Call again with the rest until everything is consumed or done is set. */
ssize_t httpc_chunked_step(struct httpc_chunked *d, const char *in, size_t len, const char **data,
                           size_t *dlen);

#endif
