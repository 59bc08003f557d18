/* httpd — an HTTP/1.1 server driven by a reactor.
 *
 * One implementation serves every listener (httpd_native.c, on the syntax of http1.h):
 * plain listeners over TCP, TLS listeners over the same code with OpenSSL underneath as
 * a transport (conn.h, tls.h; libssl is loaded when the first TLS listener starts). The
 * same parser, limits, slow-client rules, pipelining and streaming apply to both.
 * Handlers run on the reactor thread and may use every other reactor-driven module
 * (httpc, proc, timers) directly.
 *
 * Request lifecycle
 *   1. The route's handler is called once the whole body has arrived (bodies above
 *      `max_body` are answered 413 before the handler ever runs).
 *   2. The handler answers with exactly one of httpd_respond*(), or starts a stream
 *      with httpd_stream_begin(). If it returns without doing either, the connection is
 *      suspended and the request stays valid until the owner answers later (from the
 *      reactor thread) or the client goes away.
 *   3. When the request is finished or aborted, the on_close callback (if set) runs and
 *      the request is freed. Whoever keeps a `struct httpd_req *` beyond the handler
 *      must set on_close and forget the pointer when it fires.
 *      While a request is suspended (awaiting a late answer or stream data) its socket
 *      is watched, so a client that goes away is noticed at once: the request is torn
 *      down and on_close runs with httpd_req_client_gone() true. Inside on_close the
 *      request is still readable; answering is ignored and stream writes return -EPIPE.
 *      on_close runs exactly once, also from httpd_free().
 *
 * Errors are JSON. httpd_respond_error() produces upstream's FastAPI shape
 * {"detail": "..."}; callers with other shapes build the JSON themselves. Answers made
 * by the server itself: 404 {"detail":"Not Found"}, 405 {"detail":"Method Not
 * Allowed"} (with Allow), 413 {"detail":"request body too large"} (a body above the
 * cap is never stored: it is refused unread when the client awaits 100 Continue or the
 * excess is above 16 MiB, else read and dropped so the client sees the 413), 401/403
 * for API keys, 503 {"detail":"server shutting down"} for requests pending at httpd_free().
 * Each finished request is logged at debug level ("http_request": method, path,
 * status, duration_ms), except quiet_paths.
 *
 * Threading: everything on the reactor thread that owns the server. */
#ifndef MOTOR_HTTPD_H
#define MOTOR_HTTPD_H

#include "common/reactor.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct httpd;
struct httpd_req;

typedef void (*httpd_handler)(struct httpd_req *req, void *arg);
typedef void (*httpd_close_cb)(struct httpd_req *req, void *arg);

struct httpd_config {
    const char *name;          /* for logs, e.g. "node-manager-api" */
    const char *host;          /* bind address: "127.0.0.1", "0.0.0.0", "::"; NULL = 127.0.0.1 */
    uint16_t port;             /* 0 = ephemeral; read it back with httpd_port() */
    size_t max_body;           /* request body cap in bytes; 0 = 1 MiB */
    unsigned idle_timeout_s;   /* idle keep-alive connections closed after; 0 = 60. Also the
                                * time a client has to complete a TLS handshake, and to send
                                * a request (head and body) or take an answer the socket
                                * holds back before it must keep up 500 B/s on average */
    unsigned max_connections;  /* 0 = 1024 */
    /* At max_connections, a new connection closes the oldest idle keep-alive one (no
     * request in progress) instead of being refused (a gateway: a flood of idle
     * connections must not lock new clients out, as nginx does). Off: the new one is
     * closed at accept (an engine's connection cap). */
    bool evict_idle;
    /* The server's own error answers (400, 404, 405, 413, 414, 431, 503, …) in OpenAI's
     * shape {"error":{"message","type","param","code"}} instead of FastAPI's
     * {"detail"}: what an OpenAI SDK can show. */
    bool openai_errors;
    bool reuse_port;           /* SO_REUSEPORT: several servers (threads) on one port */
    /* TLS: enabled when cert_file and key_file are set (PEM; the certificate file may
     * hold the chain). ca_file (optional) makes the server require client certificates
     * and verify them (mutual TLS): a client without one, or with one that does not
     * verify, fails the handshake. key_password for an encrypted key (may be NULL).
     * crl_file (optional, needs ca_file): PEM CRL(s); a revoked client certificate
     * fails the handshake. min_version "TLSv1.2" (default) or "TLSv1.3"; ciphers (TLS
     * 1.2, OpenSSL syntax) and ciphersuites (TLS 1.3), NULL = the defaults of tls.h. */
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_ca_file;
    const char *tls_key_password;
    const char *tls_crl_file;
    const char *tls_min_version;
    const char *tls_ciphers;
    const char *tls_ciphersuites;
    /* API key: routes registered with HTTPD_ROUTE_AUTH require header api_key_header
     * (NULL = "X-Motor-Management-Key", upstream's) to equal api_key (constant-time
     * compare); missing => 401 {"detail":"missing management key"}, wrong => 403
     * {"detail":"invalid management key"}. NULL api_key disables the check. */
    const char *api_key_header;
    const char *api_key;
    /* Paths not logged per request (e.g. probes); NULL-terminated, may be NULL. */
    const char *const *quiet_paths;
};

/* Route flags. */
#define HTTPD_ROUTE_AUTH 0x1u /* requires the configured API key */

/* Start listening. NULL on failure (logged; errno set: EADDRINUSE, EINVAL for a bad
 * host or unusable TLS material (a wrong password, a key that does not fit, a bad
 * version or cipher list), ENOENT/EACCES for unreadable TLS files, ENOTSUP when TLS is
 * configured but libssl cannot be loaded, ...).
 * host may be an IPv4/IPv6 literal or a name (resolved once, first address); "::"
 * listens dual-stack. cfg strings are copied. */
struct httpd *httpd_new(struct reactor *r, const struct httpd_config *cfg);
/* Shut down in the safe order (quiesce, close streams and suspended requests — their
 * on_close callbacks run — then stop). Pending requests are answered 503, open streams
 * are ended cleanly and flushed for up to 1 s; no handler runs during the call.
 * NULL-safe. Call it before freeing the reactor, and not from inside one of this
 * server's handlers or callbacks. */
void httpd_free(struct httpd *h);
/* The bound TCP port (useful with port 0). */
uint16_t httpd_port(const struct httpd *h);
/* Is this a TLS listener? */
bool httpd_is_tls(const struct httpd *h);

/* Certificate reload: build a new TLS context from cfg's tls_* fields (the files are
 * read again) for connections accepted from now on; connections already open keep
 * theirs, untouched. 0, or -errno as httpd_new (logged) with the old context kept.
 * -EINVAL for a plain listener or a cfg without certificate and key (a listener
 * cannot change between plain and TLS). */
int httpd_tls_reload(struct httpd *h, const struct httpd_config *cfg);

/* Replace the API key of HTTPD_ROUTE_AUTH routes (copied; NULL disables the check) for
 * the requests that arrive from now on. */
void httpd_set_api_key(struct httpd *h, const char *key);

/* Register a route. method: "GET", "POST", ... ; pattern: an absolute path whose
 * segments may be "{name}" parameters, e.g. "/node-manager/engines/{id}/logs".
 * The first matching route wins; a GET route also answers HEAD. Segments match
 * exactly after percent-decoding ("/a/" is not "/a"); a parameter matches one
 * non-empty segment. Unknown path => 404, known path with another method => 405, both
 * with {"detail": ...}. An invalid pattern (not absolute, "{...}" not a whole segment,
 * more than 8 parameters) is logged and ignored. */
void httpd_route(struct httpd *h, const char *method, const char *pattern, httpd_handler fn,
                 void *arg, unsigned flags);

/* ---- request accessors (valid until on_close) ---------------------------------- */
const char *httpd_req_method(const struct httpd_req *req);
const char *httpd_req_path(const struct httpd_req *req);
/* Path parameter by name (from "{name}"), NULL if absent. */
const char *httpd_req_param(const struct httpd_req *req, const char *name);
/* Query argument (already URL-decoded, '+' = space), NULL if absent. */
const char *httpd_req_query(const struct httpd_req *req, const char *name);
/* Request header (case-insensitive), NULL if absent. */
const char *httpd_req_header(const struct httpd_req *req, const char *name);
/* The body (NUL-terminated; len may be 0). */
const char *httpd_req_body(const struct httpd_req *req, size_t *len);
/* Parse the body as JSON (any JSON value; callers check the type). NULL on error
 * (including an empty body) with a human message in err_msg (cap bytes).
 * Caller owns the returned reference. */
json_t *httpd_req_json(const struct httpd_req *req, char *err_msg, size_t cap);
/* Peer address as text ("127.0.0.1"). */
const char *httpd_req_peer(const struct httpd_req *req);
/* Monotonic ms when the request headers arrived. */
int64_t httpd_req_start_ms(const struct httpd_req *req);
struct httpd *httpd_req_server(const struct httpd_req *req);

/* Callback when the request ends (answered and sent, or client gone). cb NULL clears
 * it (e.g. before answering a request whose owner no longer needs to hear about it). */
void httpd_req_on_close(struct httpd_req *req, httpd_close_cb cb, void *arg);
/* True once the client disconnected or the request ended abnormally (then stream
 * writes return -EPIPE). */
bool httpd_req_client_gone(const struct httpd_req *req);

/* ---- answering ------------------------------------------------------------------ */
/* Add a response header (before responding / before stream_begin). */
void httpd_add_header(struct httpd_req *req, const char *name, const char *value);
/* Answer with a body (copied). content_type NULL = "application/json". Callable from
 * the handler or later (from the reactor thread); a second answer is ignored (logged). */
void httpd_respond(struct httpd_req *req, int status, const char *content_type, const void *body,
                   size_t len);
/* Answer with JSON; steals the reference to body. */
void httpd_respond_json(struct httpd_req *req, int status, json_t *body);
/* {"detail": detail} */
void httpd_respond_error(struct httpd_req *req, int status, const char *detail);

/* ---- streaming (SSE and other chunked bodies) ------------------------------------ */
/* Begin a chunked response (content_type NULL = "text/event-stream"). Then any number
 * of writes and one end; an end after the client went away (e.g. from on_close) is a
 * harmless no-op. Writes are buffered and flushed as the socket allows; a slow client
 * never blocks the reactor (buffered bytes above 8 MiB => the stream is aborted). */
void httpd_stream_begin(struct httpd_req *req, int status, const char *content_type);
/* Returns 0, or -EPIPE when the client is gone (stop producing), -E2BIG on overflow
 * (the stream is then aborted), -EINVAL when no stream is open / it was ended. */
int httpd_stream_write(struct httpd_req *req, const void *data, size_t len);
/* Finish the stream; abort=true closes the connection without a clean chunked end. */
void httpd_stream_end(struct httpd_req *req, bool abort);
/* Bytes queued but not yet handed to the socket (backpressure signal). */
size_t httpd_stream_pending(const struct httpd_req *req);

#endif
