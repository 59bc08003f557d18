/* httpc — an asynchronous HTTP client driven by a reactor.
 *
 * Many requests run concurrently on one thread, over one HTTP/1.1 implementation
 * (httpc.c, on the syntax of http1.h): http:// over TCP, https:// over TLS (conn.h,
 * tls.h; libssl is loaded on the first https request, so a process without TLS
 * upstreams never maps it). Connections are kept alive and reused per host (and, for
 * https, per TLS settings, resuming TLS sessions on new connections). Each request has
 * its own timeout. Responses are accumulated up to a cap, or streamed to a chunk
 * callback (SSE).
 *
 * Callbacks run on the reactor thread. For every request started, `done` is called
 * exactly once — unless the request was cancelled with httpc_cancel() first, or the
 * client is freed. A request handle is valid until its `done` returns or it is
 * cancelled.
 *
 * Threading: everything on the owning reactor's thread. */
#ifndef MOTOR_HTTPC_H
#define MOTOR_HTTPC_H

#include "common/reactor.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct httpc;
struct httpc_req;

struct httpc_response {
    int error;              /* 0, or -errno: -ETIMEDOUT, -ECONNREFUSED, -ECANCELED (a chunk
                               callback asked to stop), -E2BIG (over max_response),
                               -EPROTO (a malformed response; a TLS handshake or record
                               failure: verification, version, alert), -EIO (other
                               transport failures, TLS unusable or not installed) */
    const char *error_text; /* human text for error != 0, else "" */
    long status;            /* HTTP status, 0 when no response arrived */
    const char *body;       /* NUL-terminated accumulated body ("" when streamed) */
    size_t body_len;
    const char *content_type; /* may be NULL */
    int64_t elapsed_ms;
    /* The body's end was set by Content-Length (so, without error, the whole body the
     * server meant arrived); false for a chunked or close-delimited body, which a server
     * can end cleanly before its content is complete. */
    bool length_framed;
    /* The connection was established, then closed or reset before any byte of an answer
     * (-EIO): what a server at its connection cap does at accept — or one that died with
     * the request. */
    bool no_reply;
};

typedef void (*httpc_done_cb)(const struct httpc_response *resp, void *arg);
/* Status line and headers are complete (before the first body chunk). Return 0 to go
 * on, non-zero to abort (done then gets -ECANCELED). */
typedef int (*httpc_status_cb)(long status, const char *content_type, void *arg);
/* A piece of the body as it arrives (streaming mode). Return 0 to go on, non-zero to
 * abort (done then gets -ECANCELED). */
typedef int (*httpc_chunk_cb)(const char *data, size_t len, void *arg);

/* https:// settings. The server's certificate chain is verified against ca_file, or
 * the system's trusted certificates (OpenSSL's default paths, /etc/ssl/certs on Debian)
 * when ca_file is NULL, and its name against the URL's host (the DNS name, or the IP
 * address for an IP literal). The files are read on the first request with these
 * settings and kept for the client's lifetime. */
struct httpc_tls {
    const char *ca_file;   /* verify the server against this CA (PEM); NULL = system store */
    const char *cert_file; /* client certificate (PEM), optional */
    const char *key_file;  /* its key (NULL = in cert_file) */
    const char *key_password;
    const char *crl_file;     /* PEM CRL(s): a revoked server certificate fails, optional */
    const char *min_version;  /* "TLSv1.2" (default) or "TLSv1.3" */
    const char *ciphers;      /* TLS 1.2 cipher list, NULL = the default of tls.h */
    const char *ciphersuites; /* TLS 1.3 suites, NULL = OpenSSL's */
    bool insecure;            /* skip verification (tests only) */
};

struct httpc_opts {
    const char *method;        /* NULL = GET, or POST when body is set */
    const char *url;           /* required */
    const char *body;          /* copied; may be NULL */
    size_t body_len;           /* 0 with body set = strlen(body) */
    const char *content_type;  /* default "application/json" when body is set */
    const char *const *headers;/* NULL-terminated "Name: value" strings, may be NULL; "Name:"
                                  (no value) suppresses a default header; Content-Length and
                                  Transfer-Encoding are computed, never taken from here */
    int64_t timeout_ms;        /* whole request; 0 = 30 s */
    int64_t connect_timeout_ms;/* TCP connect + TLS handshake; 0 = min(timeout, 5 s) */
    size_t max_response;       /* accumulated body cap; 0 = 16 MiB */
    httpc_status_cb on_status; /* optional */
    httpc_chunk_cb on_chunk;   /* optional: when set, the body is streamed, not kept */
    const struct httpc_tls *tls; /* optional, for https:// URLs */
};

/* NULL on failure. */
struct httpc *httpc_new(struct reactor *r);
/* Aborts every request in flight without calling their callbacks. NULL-safe. */
void httpc_free(struct httpc *c);

/* Start a request. Returns its handle (never NULL); done(arg) later. opts and all its
 * strings are copied. */
struct httpc_req *httpc_request(struct httpc *c, const struct httpc_opts *opts, httpc_done_cb done,
                                void *arg);
/* Abort a request in flight; its callbacks will not be called. Safe from inside that
 * request's own status/chunk callback. */
void httpc_cancel(struct httpc *c, struct httpc_req *req);

/* Conveniences over httpc_request. body may be NULL (POST with empty body). */
struct httpc_req *httpc_get(struct httpc *c, const char *url, int64_t timeout_ms, httpc_done_cb done,
                            void *arg);
struct httpc_req *httpc_post_json(struct httpc *c, const char *url, const json_t *body,
                                  int64_t timeout_ms, httpc_done_cb done, void *arg);

/* Certificate reload: every TLS context this client built is built again from its
 * settings (the files are read again), for connections opened from now on; open and
 * idle pooled connections keep theirs. Returns how many could not be rebuilt (logged;
 * those keep the old context). */
int httpc_tls_reload(struct httpc *c);

/* Requests in flight. */
size_t httpc_active(const struct httpc *c);

#endif
