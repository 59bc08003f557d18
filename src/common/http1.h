/* http1 — HTTP/1.1 message syntax for both directions: request heads (the server),
 * response heads (the client), the one chunked decoder both use, http:// and https://
 * URLs, percent-decoding. Pure functions over caller buffers: no sockets, no allocation,
 * so the fuzzers can drive every byte (nginx has one parser file for both directions;
 * so do we: one character table, one decoder, one error vocabulary).
 *
 * Strict where ambiguity could desynchronise a proxy (request smuggling, response
 * splitting): both Content-Length and Transfer-Encoding in a request, conflicting
 * Content-Lengths, obsolete line folding, white space before a colon, control bytes in
 * a field value, and (in requests) a Transfer-Encoding other than "chunked" are refused
 * rather than guessed at. A bare LF still ends a head line (RFC 9112 §2.2 allows it).
 *
 * Error vocabulary, the same for every function here:
 *   -EBADMSG          malformed (a request head or body answers 400)
 *   -EMSGSIZE         a cap exceeded: head size, field count (431 for request heads),
 *                     chunk-size line, trailers
 *   -ENAMETOOLONG     a request line over HTTP1_REQUEST_LINE_MAX (414)
 *   -ENOTSUP          a request Transfer-Encoding other than chunked (501)
 *   -EPROTONOSUPPORT  not HTTP/1.x (505)
 * URL parsing adds -EINVAL (bad syntax) and -EPROTONOSUPPORT (another scheme).
 *
 * Threading: any thread (no state beyond the caller's structs). */
#ifndef MOTOR_HTTP1_H
#define MOTOR_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- request heads (server side) ------------------------------------------------------ */

/* A request head (request line + fields + blank line) larger than this, or with more
 * than HTTP1_REQUEST_FIELDS_MAX field lines, is refused with -EMSGSIZE (431). */
#define HTTP1_REQUEST_HEAD_MAX (16u * 1024)
#define HTTP1_REQUEST_FIELDS_MAX 128 /* clients behind corporate proxies send ~100 */
/* A request line longer than this (or one that does not end within the head cap) is
 * refused with -ENAMETOOLONG (414 URI Too Long, as nginx's 8 KiB line buffers). */
#define HTTP1_REQUEST_LINE_MAX (8u * 1024)

struct http1_field { /* views into the parsed buffer, not NUL-terminated */
    const char *name;
    size_t name_len;
    const char *value; /* surrounding white space trimmed */
    size_t value_len;
};

struct http1_request {
    const char *method;
    size_t method_len;
    /* Path and query. Origin-form: the whole target (starts with '/'). Absolute-form
     * ("http://authority/path?q", scheme http or https in any case): what follows the
     * authority, which may be empty or start with '?' (the path is then "/"). */
    const char *target;
    size_t target_len;
    bool absolute_form;
    /* The authority of an absolute-form target, else the Host field's value (possibly
     * empty); NULL when there is neither (HTTP/1.0 only: HTTP/1.1 requires a Host). */
    const char *host;
    size_t host_len;
    int minor; /* HTTP/1.<minor>: 0 or 1 */
    size_t nfields;
    struct http1_field fields[HTTP1_REQUEST_FIELDS_MAX];
    /* framing and connection handling, from the fields */
    bool has_length;
    uint64_t content_length;
    bool chunked;         /* Transfer-Encoding: chunked (Content-Length is then absent) */
    bool keep_alive;      /* the connection may carry another request after this one */
    bool expect_continue; /* Expect: 100-continue */
};

/* Parse a request head from buf[0..len). Returns the head's length in bytes (> 0, blank
 * line included; empty lines before the request line are skipped and counted) once
 * complete; 0 when more bytes are needed; or -EBADMSG (this includes an HTTP/1.1
 * request without Host and not in absolute-form, more than one Host, a Host or
 * authority with bytes no host:port has, an absolute-form target with another scheme,
 * an empty host or userinfo: RFC 9112 §3.2, §3.2.2), -EMSGSIZE, -ENOTSUP,
 * -EPROTONOSUPPORT. Never reads beyond buf[len-1]. */
int http1_parse_request(const char *buf, size_t len, struct http1_request *r);

/* ---- response heads (client side) ------------------------------------------------------ */

#define HTTP1_RESPONSE_HEAD_MAX (64u * 1024) /* status line + fields */
#define HTTP1_CTYPE_MAX 256

struct http1_response {
    int status;             /* 100..999 */
    int minor;              /* HTTP/1.<minor> */
    int64_t content_length; /* -1 when absent (or overridden by Transfer-Encoding) */
    bool chunked;           /* Transfer-Encoding ends in chunked */
    bool conn_close;        /* Connection: close, or a coding that runs to the close */
    bool keep_alive;        /* Connection: keep-alive (matters for HTTP/1.0) */
    bool has_ctype;
    char ctype[HTTP1_CTYPE_MAX]; /* Content-Type value (truncated to fit) */
};

/* Look for a complete response head at buf[0..len). Returns the head's length (> 0,
 * blank line included) with *r filled; 0 when more bytes are needed (and len <
 * HTTP1_RESPONSE_HEAD_MAX); -EBADMSG when malformed, -EMSGSIZE when no head ends
 * within HTTP1_RESPONSE_HEAD_MAX bytes. Never reads outside buf[0..len). */
ssize_t http1_parse_response(const char *buf, size_t len, struct http1_response *r);

/* Body framing of a response to a HEAD request (head_request) or another one. */
enum http1_body { HTTP1_BODY_NONE, HTTP1_BODY_LENGTH, HTTP1_BODY_CHUNKED, HTTP1_BODY_CLOSE };
enum http1_body http1_response_body(const struct http1_response *r, bool head_request);
/* May the connection carry another request after this response (framing permitting)? */
bool http1_response_reusable(const struct http1_response *r);

/* ---- chunked bodies (both directions) ---------------------------------------------------- */

#define HTTP1_CHUNK_LINE_MAX 4096 /* a chunk-size line with its extensions; a trailer line */
#define HTTP1_CHUNK_DIGITS_MAX 16 /* leading zeros included: "000..." forever is no size */
/* Trailers: requests (strict mode) 8 KiB, responses 64 KiB in all. */
#define HTTP1_TRAILERS_MAX_STRICT (8u * 1024)
#define HTTP1_TRAILERS_MAX (64u * 1024)

/* Decoder flags. STRICT (request bodies): every line must end in CRLF — a front proxy
 * that does not take a bare LF as a line end would frame the body differently from us
 * (smuggling) — and trailers are capped at 8 KiB. Without it (responses), a bare LF
 * ends a line, as tolerant clients accept from upstream servers. */
#define HTTP1_CHUNKED_STRICT 0x1u

/* Incremental decoder: any split of the input gives the same result. */
struct http1_chunked {
    int st;
    unsigned flags;
    uint64_t left;   /* data bytes left in the current chunk */
    size_t line;     /* bytes of the current size or trailer line */
    size_t trailers; /* trailer bytes so far */
    unsigned digits; /* hex digits of the current size */
    bool done;       /* the last chunk and the trailers were consumed */
};

void http1_chunked_init(struct http1_chunked *d, unsigned flags);
/* Consume a prefix of in[0..len). Returns the number of bytes consumed (> 0 unless
 * len == 0 or d->done) and, when some of them are body data, points *data / *dlen at
 * them (inside in; at most one run per call); or -EBADMSG (bad size line, missing CRLF
 * after data, a control byte in an extension, a bare LF in strict mode, a size of 2^60
 * or more) or -EMSGSIZE (more than 16 size digits, a line above 4 KiB, trailers above
 * their cap). Call again with the rest until everything is consumed or d->done. */
ssize_t http1_chunked_step(struct http1_chunked *d, const char *in, size_t len, const char **data,
                           size_t *dlen);
/* The same decoder in place, as a server keeps a body: chunk data is moved to
 * buf[0..*out_len) (never ahead of the input, so in place is safe); *consumed says how
 * much input was used. Returns 1 when the body is complete (input after *consumed
 * belongs to the next message), 0 when all input was used and more is needed, or the
 * negative errors of http1_chunked_step. The caller caps the total size. */
int http1_chunked_decode(struct http1_chunked *d, char *buf, size_t len, size_t *consumed,
                         size_t *out_len);

/* ---- URLs and percent-encoding ------------------------------------------------------------ */

#define HTTP1_HOST_MAX 256

struct http1_url {
    bool https;
    char host[HTTP1_HOST_MAX]; /* without brackets for IPv6 literals */
    bool ipv6;                 /* host was a [bracketed] literal */
    int port;                  /* default 80 / 443 */
    const char *path;          /* into the URL: "/..." path + query, "" = "/" */
    size_t path_len;
};

/* Parse "http[s]://host[:port][/path][?query]" (fragment dropped). 0, or -EINVAL (bad
 * syntax, a space or control byte anywhere, userinfo, port out of range) or
 * -EPROTONOSUPPORT (another scheme), with *why set to static text. */
int http1_url_parse(const char *url, struct http1_url *u, const char **why);

/* Percent-decode src[0..len) into dst (room for len + 1 bytes), NUL-terminated;
 * plus_space turns '+' into ' ' (query strings). Invalid escapes are kept literally.
 * Returns the decoded length, or -EBADMSG when the result would contain a NUL byte. */
int http1_url_decode(char *dst, const char *src, size_t len, bool plus_space);

/* The OpenAI error `type` for an HTTP status, as vLLM's server names it
 * (BadRequestError, NotFoundError, ServiceUnavailableError, GatewayTimeoutError, ...):
 * the coordinator and the engine simulator answer with the same values. */
const char *http1_openai_error_type(int status);

#endif
