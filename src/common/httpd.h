/* httpd — an HTTP/1.1 server (GNU libmicrohttpd) driven by a reactor.
 *
 * MHD runs in "external epoll" mode: its epoll fd is watched by the reactor and its
 * timeout is a reactor timer, so handlers run on the reactor thread and may use every
 * other reactor-driven module (httpc, proc, timers) directly.
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
 *
 * Errors are JSON. httpd_respond_error() produces upstream's FastAPI shape
 * {"detail": "..."}; callers with other shapes build the JSON themselves.
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
    unsigned idle_timeout_s;   /* idle keep-alive connections closed after; 0 = 60 */
    unsigned max_connections;  /* 0 = 1024 */
    bool reuse_port;           /* SO_REUSEPORT: several servers (threads) on one port */
    /* TLS: enabled when cert_file and key_file are set (PEM). ca_file (optional) makes
     * the server request and verify client certificates. key_password for encrypted
     * keys (may be NULL). */
    const char *tls_cert_file;
    const char *tls_key_file;
    const char *tls_ca_file;
    const char *tls_key_password;
    /* API key: routes registered with HTTPD_ROUTE_AUTH require header api_key_header
     * to equal api_key (constant-time compare); missing => 401, wrong => 403.
     * NULL api_key disables the check. */
    const char *api_key_header;
    const char *api_key;
    /* Paths not logged per request (e.g. probes); NULL-terminated, may be NULL. */
    const char *const *quiet_paths;
};

/* Route flags. */
#define HTTPD_ROUTE_AUTH 0x1u /* requires the configured API key */

/* Start listening. NULL on failure (logged; errno set: EADDRINUSE, EINVAL, ...).
 * cfg strings are copied. */
struct httpd *httpd_new(struct reactor *r, const struct httpd_config *cfg);
/* Shut down in the safe order (quiesce, close streams and suspended requests — their
 * on_close callbacks run — then stop). NULL-safe. */
void httpd_free(struct httpd *h);
/* The bound TCP port (useful with port 0). */
uint16_t httpd_port(const struct httpd *h);

/* Register a route. method: "GET", "POST", ... ; pattern: an absolute path whose
 * segments may be "{name}" parameters, e.g. "/node-manager/engines/{id}/logs".
 * The first matching route wins. Unknown path => 404, known path with another
 * method => 405, both with {"detail": ...}. */
void httpd_route(struct httpd *h, const char *method, const char *pattern, httpd_handler fn,
                 void *arg, unsigned flags);

/* ---- request accessors (valid until on_close) ---------------------------------- */
const char *httpd_req_method(const struct httpd_req *req);
const char *httpd_req_path(const struct httpd_req *req);
/* Path parameter by name (from "{name}"), NULL if absent. */
const char *httpd_req_param(const struct httpd_req *req, const char *name);
/* Query argument (already URL-decoded), NULL if absent. */
const char *httpd_req_query(const struct httpd_req *req, const char *name);
/* Request header (case-insensitive), NULL if absent. */
const char *httpd_req_header(const struct httpd_req *req, const char *name);
/* The body (NUL-terminated; len may be 0). */
const char *httpd_req_body(const struct httpd_req *req, size_t *len);
/* Parse the body as JSON. NULL on error with a human message in err_msg (cap bytes).
 * Caller owns the returned reference. */
json_t *httpd_req_json(const struct httpd_req *req, char *err_msg, size_t cap);
/* Peer address as text ("127.0.0.1"). */
const char *httpd_req_peer(const struct httpd_req *req);
/* Monotonic ms when the request headers arrived. */
int64_t httpd_req_start_ms(const struct httpd_req *req);
struct httpd *httpd_req_server(const struct httpd_req *req);

/* Callback when the request ends (answered and sent, or client gone). */
void httpd_req_on_close(struct httpd_req *req, httpd_close_cb cb, void *arg);
/* True once the client disconnected (a stream's writes are then discarded). */
bool httpd_req_client_gone(const struct httpd_req *req);

/* ---- answering ------------------------------------------------------------------ */
/* Add a response header (before responding / before stream_begin). */
void httpd_add_header(struct httpd_req *req, const char *name, const char *value);
/* Answer with a body (copied). content_type NULL = "application/json". */
void httpd_respond(struct httpd_req *req, int status, const char *content_type, const void *body,
                   size_t len);
/* Answer with JSON; steals the reference to body. */
void httpd_respond_json(struct httpd_req *req, int status, json_t *body);
/* {"detail": detail} */
void httpd_respond_error(struct httpd_req *req, int status, const char *detail);

/* ---- streaming (SSE and other chunked bodies) ------------------------------------ */
/* Begin a chunked response (e.g. "text/event-stream"). Then any number of writes and
 * exactly one end. Writes are buffered and flushed as the socket allows; a slow client
 * never blocks the reactor (buffered bytes above 8 MiB => the stream is aborted). */
void httpd_stream_begin(struct httpd_req *req, int status, const char *content_type);
/* Returns 0, or -EPIPE when the client is gone (stop producing), -E2BIG on overflow. */
int httpd_stream_write(struct httpd_req *req, const void *data, size_t len);
/* Finish the stream; abort=true closes the connection without a clean chunked end. */
void httpd_stream_end(struct httpd_req *req, bool abort);
/* Bytes queued but not yet handed to the socket (backpressure signal). */
size_t httpd_stream_pending(const struct httpd_req *req);

#endif
