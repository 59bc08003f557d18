/* httpd_core — what httpd.c (routes, requests, answers) shares with httpd_native.c (the
 * connections: HTTP/1.1 over plain TCP or TLS through conn.h, on the reactor).
 *
 * The core owns struct httpd_req: the request as parsed (method, path, headers, query,
 * body), the answer as prepared (status, header lines, body or stream buffer) and the
 * close callback. The connection code creates requests with httpd_req_new(), runs the
 * route with httpd_req_dispatch() once the body is complete, is told through
 * httpd_native_kick() that an answer or stream data is ready, and ends every request
 * with httpd_req_finish() (exactly once: that runs on_close and frees it).
 *
 * Private to httpd*.c. Threading: the reactor thread. */
#ifndef MOTOR_HTTPD_CORE_H
#define MOTOR_HTTPD_CORE_H

#include "common/httpd.h"
#include "common/httpd_internal.h"
#include "common/list.h"
#include "common/strbuf.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HTTPD_DEFAULT_MAX_BODY (1u << 20)
#define HTTPD_STREAM_MAX ((size_t)8 << 20) /* buffered stream bytes before abort */
#define HTTPD_SHUTDOWN_FLUSH_MS 1000       /* time given to answers at httpd_free */
/* After an oversize upload we keep reading (and discarding) up to this much more so
 * the client can still read the 413; beyond it the connection is dropped. */
#define HTTPD_DISCARD_MAX ((size_t)16 << 20)
/* Slow clients: after the first idle timeout a request must arrive, and held-back output
 * must drain, at this average rate (bytes per second; every listener). */
#define HTTPD_MIN_RATE 500

struct httpd_kv {
    const char *name;
    const char *value; /* may be NULL for a query key without '=' */
};

struct native;
struct tls_ctx;

struct httpd {
    struct reactor *r;
    struct native *native; /* the listener and its connections (httpd_native.c) */
    struct tls_ctx *tls;   /* TLS listener: the context for new connections; NULL = plain */
    char *name;
    size_t max_body;
    unsigned idle_timeout_s;
    unsigned min_rate; /* HTTPD_MIN_RATE; tests raise it (httpd_set_min_rate) */
    unsigned max_connections;
    bool evict_idle;
    bool openai_errors;
    uint16_t port;
    bool stopping; /* httpd_free in progress: handlers no longer run */
    char *api_key_header;
    char *api_key;
    char **quiet_paths;
    struct httpd_route_entry *routes;
    size_t nroutes, routes_cap;
    struct list_head live; /* every request not yet finished (httpd_req.link) */
};

struct httpd_req {
    struct httpd *h;
    struct list_head link; /* in h->live */
    void *conn; /* the connection carrying it (httpd_native.c); NULL once detached */
    const char *method;
    const char *path; /* percent-decoded */
    char peer[INET6_ADDRSTRLEN];
    int64_t start_ms;
    bool is_head;

    struct httpd_kv *hdrs;
    size_t nhdrs;
    struct httpd_kv *query;
    size_t nquery;
    char *arena; /* strings of the above, in the same allocation as the request */

    size_t nparams;
    const char *param_names[HTTPD_MAX_PARAMS];
    const char *param_values[HTTPD_MAX_PARAMS];
    char *param_store;

    char *body; /* NUL-terminated when non-NULL */
    size_t body_len;
    bool too_large; /* answer 413 instead of running the handler */

    bool handled;   /* dispatch ran */
    bool answered;  /* respond or stream_begin happened */
    bool completed; /* finishing: on_close running or done */
    bool client_gone;

    int status;
    struct strbuf rhdrs; /* response header lines "Name: value\r\n", Content-Type last */
    bool resp_close;     /* the answer asked for Connection: close */
    char *resp_body;
    size_t resp_len;

    bool streaming;
    bool stream_ended;
    bool stream_abort;
    struct strbuf sbuf;
    size_t soff; /* bytes of sbuf already taken by the transport */

    httpd_close_cb on_close;
    void *on_close_arg;
};

/* A zeroed request linked into h->live, with room for nhdrs headers, nquery query
 * arguments and arena_len bytes of strings, all in one allocation. */
struct httpd_req *httpd_req_new(struct httpd *h, void *conn, size_t nhdrs, size_t nquery,
                                size_t arena_len);
/* Route it (or answer 413 / 503 / 404 / 405 / 401 / 403) and run the handler. Once. */
void httpd_req_dispatch(struct httpd_req *req);
/* The request is over (ok: answered and sent; else the client went away or the answer
 * was aborted): access log, on_close (exactly once), unlink, free. */
void httpd_req_finish(struct httpd_req *req, bool ok);
/* The body of a server-made error answer (detail: plain text without quotes), in the
 * server's error shape (openai_errors or FastAPI's); its length. */
int httpd_error_json(const struct httpd *h, int status, const char *detail, char *buf,
                     size_t cap);
/* 503 with Connection: close, for requests pending at httpd_free. */
void httpd_req_shutdown_answer(struct httpd_req *req);
/* Reason phrase for a status code ("OK"; "" for unknown codes). */
const char *httpd_status_text(int status);
/* Parse the query string (after '?', without it) of len bytes into req->query, decoding
 * into the arena at *arena_off. Returns the number of arguments. */
size_t httpd_req_parse_query(struct httpd_req *req, const char *qs, size_t len, size_t *arena_off);
/* Upper bound on the query arguments in qs[0..len). */
size_t httpd_query_count(const char *qs, size_t len);

/* ---- httpd_native.c ---------------------------------------------------------------- */

/* Listen on sa and serve connections (TLS ones when h->tls is set). 0 or -errno. */
int httpd_native_start(struct httpd *h, const struct sockaddr *sa, socklen_t salen,
                       bool reuse_port);
/* An answer was prepared, or stream data/end arrived: send it (later on this loop pass,
 * never re-entering the caller). */
void httpd_native_kick(struct httpd_req *req);
/* Stream bytes taken from req->sbuf but not yet written to the socket. */
size_t httpd_native_unsent(const struct httpd_req *req);
/* httpd_free: answer/flush/close everything and release the connection state. */
void httpd_native_shutdown(struct httpd *h);

#endif
