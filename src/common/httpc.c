/* httpc — the asynchronous HTTP/1.1 client: http:// over TCP and https:// over TLS
 * (conn.h, tls.h), one code path, on the reactor.
 *
 * Why not libcurl: the coordinator proxies every inference request through this
 * client, and libcurl's per-request cost (several microseconds) was most of the
 * gateway's added latency; and linking libcurl costs every daemon several MiB of RSS.
 *
 * Shape of the hot path (a keep-alive connection to an engine is idle in the pool):
 * httpc_request() serializes head and body into one buffer inside the request object,
 * pops the most recently used idle connection and sends the whole request with one
 * write. The response is read into the connection's buffer, parsed in place (http1.h),
 * and on completion the connection goes back to the pool *before* done runs, so a
 * request started from done reuses it at once. Idle connections stay registered with
 * the reactor (EPOLLIN, level-triggered): reuse costs no epoll_ctl, and a server
 * closing an idle connection is noticed (readable) and the connection dropped. Timeouts
 * are reactor timers (a heap: no syscalls); errors are delivered through reactor_defer,
 * so done never runs inside httpc_request().
 *
 * TLS: a pool is per (scheme, host, port, TLS settings); its connections were made
 * with one context from the client's cache (one per distinct struct httpc_tls), and it
 * keeps the last resumable session so new connections resume (an abbreviated
 * handshake). The handshake counts against the connect timeout. A body that runs to
 * the close must end with the server's close_notify, else it may have been truncated
 * and the request fails.
 *
 * Re-entrancy. User callbacks (on_status, on_chunk, done) may start or cancel any
 * request, including (status/chunk) their own, and may free the client. Rules:
 *  - Callbacks run only from entry points (fd event, timer, deferred, resolver result),
 *    each bracketed by enter()/leave(); httpc_free() with an entry point on the stack
 *    only sets `freeing`, and the outermost leave() frees everything.
 *  - While a request's own status/chunk callback runs, q->in_cb is set: cancelling it
 *    only marks it, and the code that called the callback destroys it on return.
 *  - After any user callback the caller checks cancelled/freeing and unwinds at once
 *    (returning STOP), touching neither the request nor its connection again.
 *  - done runs with the request already out of every list (FINISHING) and its
 *    connection already pooled or closed; cancelling it from done is a no-op.
 *
 * Host names other than IP literals and "localhost" are resolved by a short-lived
 * thread (getaddrinfo blocks) that hands the result back with reactor_post(); a
 * request cancelled meanwhile just forgets its lookup, and a client freed meanwhile
 * tells the thread (through a small shared, refcounted hub) not to post at all. */
#include "common/httpc.h"

#include "common/conn.h"
#include "common/http1.h"
#include "common/httpc_internal.h"
#include "common/list.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/tls.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define CONN_BUF_INITIAL (16u * 1024)
#define POOL_IDLE_MAX 64 /* idle connections kept per host:port */
#define TLS_CTX_MAX 32   /* distinct TLS settings kept per client */

enum { GO_ON = 0, STOP = 1 };

enum nq_state {
    NQ_RESOLVING,  /* waiting for the resolver thread */
    NQ_CONNECTING, /* non-blocking connect in progress */
    NQ_HANDSHAKE,  /* TLS handshake in progress (still under the connect timeout) */
    NQ_SENDING,    /* part of the request is still unsent (EPOLLOUT) */
    NQ_RECEIVING,
    NQ_FAILED,     /* error recorded, done deferred */
    NQ_FINISHING,  /* out of every list; done is running */
};

struct npool;
struct nresolve;

struct cconn {
    struct httpc *n;
    struct npool *pool;
    struct list_head idle_link; /* in the pool's idle list while idle */
    struct httpc_req *q;        /* the request using it; NULL when idle */
    struct conn c;              /* the transport; c.fd is the socket */
    bool connecting;
    bool idle;
    bool want_out; /* EPOLLOUT in the registered mask */
    unsigned uses; /* responses completed on it */
    char *buf;
    size_t len, cap;
};

/* One context per distinct TLS settings a caller passed (compared by value: callers
 * often build their struct httpc_tls on the stack for each request). */
struct tls_entry {
    struct list_head link;
    char *ca_file, *cert_file, *key_file, *key_password, *crl_file;
    char *min_version, *ciphers, *ciphersuites;
    bool insecure;
    struct tls_ctx *ctx;
};

struct npool {
    struct list_head link; /* in httpc.pools */
    char host[HTTP1_HOST_MAX];
    int port;
    bool ipv6;
    bool literal; /* sa is known without a resolver */
    struct sockaddr_storage sa;
    socklen_t salen;
    struct tls_entry *tls;       /* https: the settings its connections were made with */
    struct tls_session *session; /* https: offered to new connections (resumption) */
    struct list_head idle;       /* most recently used first */
    size_t nidle;
};

struct httpc_req {
    struct httpc *n;
    struct list_head link; /* in httpc.reqs while live */
    enum nq_state st;
    struct npool *pool;
    struct cconn *conn;
    struct nresolve *res;
    struct reactor_timer timer;
    struct reactor_deferred dfr;

    httpc_done_cb done;
    httpc_status_cb on_status;
    httpc_chunk_cb on_chunk;
    void *arg;

    int64_t start_ms, deadline_ms, connect_timeout_ms;
    size_t max;
    bool method_head;
    bool cancelled;
    bool in_cb;
    bool retried;
    bool got_bytes; /* some response byte arrived on the current connection */
    bool reached;   /* the current connection was established (TCP connected) */
    bool have_head;

    struct http1_response head;
    enum http1_body body;
    uint64_t body_left;
    struct http1_chunked ck;
    struct strbuf resp;

    int err;
    char errtext[192];

    size_t out_len, out_off;
    char out[]; /* the serialized request: head and body, sent in one go */
};

struct resolve_hub {
    pthread_mutex_t mu;
    struct reactor *r; /* NULL once the client is gone */
    int refs;
};

struct nresolve {
    struct resolve_hub *hub;
    struct httpc_req *q; /* reactor thread only; NULL when the request went away */
    int port;
    int rc; /* getaddrinfo's */
    struct sockaddr_storage sa;
    socklen_t salen;
    char host[HTTP1_HOST_MAX];
};

struct httpc {
    struct reactor *r;
    struct list_head reqs;  /* live requests (not FINISHING) */
    struct list_head pools; /* struct npool */
    struct list_head tls;   /* struct tls_entry, most recently created first */
    size_t ntls;
    struct resolve_hub *hub;
    size_t nactive;
    int depth;
    bool freeing;
};

/* ---- lists, lifecycle helpers ---------------------------------------------------- */

static void really_free(struct httpc *n);

static void enter(struct httpc *n)
{
    n->depth++;
}

static void leave(struct httpc *n)
{
    if (--n->depth == 0 && n->freeing)
        really_free(n);
}

static void req_link(struct httpc_req *q)
{
    list_insert_head(&q->n->reqs, &q->link);
}

static void req_unlink(struct httpc_req *q)
{
    list_remove(&q->link);
}

static void idle_push(struct npool *p, struct cconn *c)
{
    c->idle = true;
    list_insert_head(&p->idle, &c->idle_link);
    p->nidle++;
}

static void idle_unlink(struct npool *p, struct cconn *c)
{
    list_remove(&c->idle_link);
    c->idle = false;
    p->nidle--;
}

/* graceful: the connection was in a clean state (idle, or a response complete), so a
 * TLS one says goodbye with close_notify. */
static void cc_close(struct cconn *c, bool graceful)
{
    if (c->idle)
        idle_unlink(c->pool, c);
    if (c->q)
        c->q->conn = NULL;
    reactor_del_fd(c->n->r, c->c.fd);
    if (graceful && conn_is_tls(&c->c) && conn_handshake_done(&c->c))
        conn_shutdown(&c->c);
    conn_close(&c->c);
    free(c->buf);
    free(c);
}

/* Frees q and everything it holds. No callback runs. */
static void req_destroy(struct httpc_req *q)
{
    struct httpc *n = q->n;
    reactor_timer_stop(n->r, &q->timer);
    reactor_defer_cancel(n->r, &q->dfr);
    if (q->res) {
        q->res->q = NULL; /* its result is dropped when it arrives */
        q->res = NULL;
    }
    if (q->conn)
        cc_close(q->conn, false); /* mid-request: never reusable */
    if (q->st != NQ_FINISHING)
        req_unlink(q);
    strbuf_release(&q->resp);
    free(q);
}

/* Records an error, drops the connection, and completes q from a deferred callback
 * (never inside httpc_request, and the same way from every path). */
static void fail(struct httpc_req *q, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct httpc_req *q, int err, const char *fmt, ...)
{
    struct httpc *n = q->n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->errtext, sizeof(q->errtext), fmt, ap);
    va_end(ap);
    q->err = err;
    if (q->conn)
        cc_close(q->conn, false);
    if (q->res) {
        q->res->q = NULL;
        q->res = NULL;
    }
    reactor_timer_stop(n->r, &q->timer);
    q->st = NQ_FAILED;
    reactor_defer(n->r, &q->dfr);
}

/* Calls done and frees q. Runs inside an entry point. */
static void finish(struct httpc_req *q, int err, const char *text)
{
    struct httpc *n = q->n;
    reactor_timer_stop(n->r, &q->timer);
    reactor_defer_cancel(n->r, &q->dfr);
    req_unlink(q);
    q->st = NQ_FINISHING;
    if (!q->cancelled && !n->freeing) {
        n->nactive--;
        q->cancelled = true; /* a cancel from inside done is a no-op */
        struct httpc_response resp = {
            .error = err,
            .error_text = err ? (text && text[0] ? text : "request failed") : "",
            .status = q->have_head ? q->head.status : 0,
            .body = strbuf_str(&q->resp),
            .body_len = q->resp.len,
            .content_type = q->have_head && q->head.has_ctype ? q->head.ctype : NULL,
            .elapsed_ms = util_mono_ms() - q->start_ms,
            .length_framed = q->have_head && q->body == HTTP1_BODY_LENGTH,
            .no_reply = err == -EIO && q->reached && !q->got_bytes,
        };
        if (q->done)
            q->done(&resp, q->arg);
    }
    req_destroy(q);
}

static void on_deferred(struct reactor *r, void *arg)
{
    struct httpc_req *q = arg;
    struct httpc *n = q->n;
    enter(n);
    finish(q, q->err, q->errtext);
    leave(n);
}

static void on_timer(struct reactor *r, void *arg)
{
    struct httpc_req *q = arg;
    struct httpc *n = q->n;
    enter(n);
    int64_t took = util_mono_ms() - q->start_ms;
    if (q->st == NQ_CONNECTING || q->st == NQ_RESOLVING)
        fail(q, -ETIMEDOUT, "connection to %s port %d timed out after %lld ms", q->pool->host,
             q->pool->port, (long long)took);
    else if (q->st == NQ_HANDSHAKE)
        fail(q, -ETIMEDOUT, "TLS handshake with %s port %d timed out after %lld ms",
             q->pool->host, q->pool->port, (long long)took);
    else
        fail(q, -ETIMEDOUT, "operation timed out after %lld ms", (long long)took);
    leave(n);
}

/* ---- user callbacks ---------------------------------------------------------------- */

/* After a status/chunk callback: STOP when q (and so its connection) is gone or the
 * client is being freed. */
static int after_cb(struct httpc_req *q, int rc)
{
    q->in_cb = false;
    if (q->n->freeing)
        return STOP;
    if (q->cancelled) {
        req_destroy(q);
        return STOP;
    }
    if (rc != 0) {
        fail(q, -ECANCELED, "aborted by callback");
        return STOP;
    }
    return GO_ON;
}

static int deliver(struct httpc_req *q, const char *data, size_t len)
{
    if (!len)
        return GO_ON;
    if (q->on_chunk) {
        q->in_cb = true;
        int rc = q->on_chunk(data, len, q->arg);
        return after_cb(q, rc);
    }
    if (strbuf_append(&q->resp, data, len) != 0) {
        fail(q, -E2BIG, "response larger than max_response (%zu bytes)", q->max);
        return STOP;
    }
    return GO_ON;
}

/* ---- connections -------------------------------------------------------------------- */

static void on_conn_event(struct reactor *r, int fd, uint32_t events, void *arg);
static void start_connection(struct httpc_req *q);

/* Level-triggered: EPOLLIN always (an idle connection closed by the server must be
 * seen), EPOLLOUT only while something waits for the socket to take bytes (a connect,
 * a request larger than the send buffer, TLS wanting to write during a read). */
static int cc_sync_watch(struct cconn *c)
{
    bool want_out = c->connecting || conn_wants_write(&c->c);
    if (c->want_out == want_out)
        return 0;
    int rc = reactor_mod_fd(c->n->r, c->c.fd, EPOLLIN | (want_out ? EPOLLOUT : 0));
    if (rc == 0)
        c->want_out = want_out;
    return rc;
}

static bool retryable(const struct httpc_req *q)
{
    return q->conn && q->conn->uses > 0 && !q->got_bytes && !q->retried;
}

/* The reused connection died before answering (the server closed it while idle):
 * try once more on a fresh one. */
static void retry(struct httpc_req *q)
{
    cc_close(q->conn, true); /* close_notify unless TLS saw a fatal error: the session stays valid */
    q->retried = true;
    q->out_off = 0;
    start_connection(q);
}

static void watch_or_fail(struct httpc_req *q)
{
    if (cc_sync_watch(q->conn) != 0)
        fail(q, -EIO, "cannot watch connection to %s port %d", q->pool->host, q->pool->port);
}

static void send_request(struct httpc_req *q)
{
    struct cconn *c = q->conn;
    while (q->out_off < q->out_len) {
        if (!conn_write_ready(&c->c)) {
            q->st = NQ_SENDING;
            watch_or_fail(q);
            return;
        }
        ssize_t w = conn_write(&c->c, q->out + q->out_off, q->out_len - q->out_off);
        if (w > 0) {
            q->out_off += (size_t)w;
            continue;
        }
        if (w == -EAGAIN) {
            q->st = NQ_SENDING;
            watch_or_fail(q);
            return;
        }
        if (retryable(q)) {
            retry(q);
            return;
        }
        if (w == -EPROTO)
            fail(q, -EPROTO, "TLS error sending to %s port %d: %s", q->pool->host, q->pool->port,
                 conn_error(&c->c));
        else
            fail(q, -EIO, "send to %s port %d failed: %s", q->pool->host, q->pool->port,
                 strerror(w < 0 ? (int)-w : EPIPE));
        return;
    }
    q->st = NQ_RECEIVING;
    watch_or_fail(q);
}

/* The TCP connection is up: TLS shakes hands (under the connect timeout), then the
 * request goes out and the whole-request timeout takes over. */
static void connected(struct httpc_req *q)
{
    struct cconn *c = q->conn;
    struct httpc *n = q->n;
    q->reached = true;
    if (!conn_handshake_done(&c->c)) {
        q->st = NQ_HANDSHAKE;
        if (!conn_handshake_ready(&c->c)) {
            watch_or_fail(q);
            return;
        }
        int rc = conn_handshake(&c->c);
        if (rc == -EAGAIN) {
            watch_or_fail(q);
            return;
        }
        if (rc != 0) {
            if (rc == -ECONNABORTED || rc == -ECONNRESET)
                fail(q, -EIO, "TLS handshake with %s port %d failed: %s", q->pool->host,
                     q->pool->port, conn_error(&c->c));
            else
                fail(q, -EPROTO, "TLS handshake with %s port %d failed: %s", q->pool->host,
                     q->pool->port, conn_error(&c->c));
            return;
        }
    }
    int64_t left = q->deadline_ms - util_mono_ms();
    reactor_timer_start(n->r, &q->timer, left > 0 ? left : 0, 0);
    send_request(q);
}

static void open_connection(struct httpc_req *q, const struct sockaddr *sa, socklen_t salen)
{
    struct httpc *n = q->n;
    struct npool *p = q->pool;
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fail(q, -EIO, "socket: %s", strerror(errno));
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bool connecting = false;
    if (connect(fd, sa, salen) != 0) {
        if (errno != EINPROGRESS) {
            int e = errno;
            close(fd);
            fail(q, -ECONNREFUSED, "failed to connect to %s port %d: %s", p->host, p->port,
                 strerror(e));
            return;
        }
        connecting = true;
    }
    struct cconn *c = xcalloc(1, sizeof(*c));
    c->n = n;
    c->pool = p;
    list_init(&c->idle_link);
    if (p->tls) {
        int trc = conn_init_tls_client(&c->c, fd, p->tls->ctx, p->host, p->session);
        if (trc != 0) {
            conn_close(&c->c);
            free(c);
            fail(q, -EIO, "cannot set up TLS for %s port %d: %s", p->host, p->port,
                 strerror(-trc));
            return;
        }
    } else {
        conn_init_plain(&c->c, fd);
    }
    c->connecting = connecting;
    c->want_out = true;
    c->cap = CONN_BUF_INITIAL;
    c->buf = xmalloc(c->cap);
    int rc = reactor_add_fd(n->r, fd, EPOLLIN | EPOLLOUT, on_conn_event, c);
    if (rc != 0) {
        conn_close(&c->c);
        free(c->buf);
        free(c);
        fail(q, -EIO, "cannot watch connection: %s", strerror(-rc));
        return;
    }
    c->q = q;
    q->conn = c;
    q->got_bytes = false;
    q->reached = false;
    /* connect and (TLS) handshake share the connect timeout */
    int64_t left = q->deadline_ms - util_mono_ms();
    int64_t ct = MOTOR_MIN(left, q->connect_timeout_ms);
    reactor_timer_start(n->r, &q->timer, ct > 0 ? ct : 0, 0);
    if (connecting) {
        q->st = NQ_CONNECTING;
        return;
    }
    connected(q);
}

static void on_resolved(void *arg)
{
    struct nresolve *res = arg;
    struct httpc_req *q = res->q;
    if (q) {
        struct httpc *n = q->n;
        enter(n);
        q->res = NULL;
        if (res->rc != 0)
            fail(q, -EIO, "could not resolve host %s: %s", res->host, gai_strerror(res->rc));
        else
            open_connection(q, (const struct sockaddr *)&res->sa, res->salen);
        leave(n);
    }
    free(res);
}

static void hub_unref(struct resolve_hub *hub)
{
    pthread_mutex_lock(&hub->mu);
    int left = --hub->refs;
    pthread_mutex_unlock(&hub->mu);
    if (left == 0) {
        pthread_mutex_destroy(&hub->mu);
        free(hub);
    }
}

static void *resolve_main(void *arg)
{
    struct nresolve *res = arg;
    /* No AI_ADDRCONFIG: it hides IPv4 answers on hosts whose only address is loopback. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    char port[8];
    snprintf(port, sizeof(port), "%d", res->port);
    res->rc = getaddrinfo(res->host, port, &hints, &ai);
    if (res->rc == 0) {
        if (ai && ai->ai_addrlen <= sizeof(res->sa)) {
            memcpy(&res->sa, ai->ai_addr, ai->ai_addrlen);
            res->salen = ai->ai_addrlen;
        } else {
            res->rc = EAI_FAIL;
        }
        freeaddrinfo(ai);
    }
    struct resolve_hub *hub = res->hub;
    bool posted = false;
    pthread_mutex_lock(&hub->mu);
    if (hub->r)
        posted = reactor_post(hub->r, on_resolved, res) == 0;
    pthread_mutex_unlock(&hub->mu);
    if (!posted)
        free(res);
    hub_unref(hub);
    return NULL;
}

static void start_resolve(struct httpc_req *q)
{
    struct httpc *n = q->n;
    struct nresolve *res = xcalloc(1, sizeof(*res));
    res->hub = n->hub;
    res->q = q;
    res->port = q->pool->port;
    memcpy(res->host, q->pool->host, sizeof(res->host));
    pthread_mutex_lock(&n->hub->mu);
    n->hub->refs++;
    pthread_mutex_unlock(&n->hub->mu);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &attr, resolve_main, res);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        hub_unref(n->hub);
        free(res);
        fail(q, -EIO, "cannot start resolver thread: %s", strerror(rc));
        return;
    }
    q->res = res;
    q->st = NQ_RESOLVING;
    int64_t left = q->deadline_ms - util_mono_ms();
    int64_t ct = MOTOR_MIN(left, q->connect_timeout_ms);
    reactor_timer_start(n->r, &q->timer, ct > 0 ? ct : 0, 0);
}

static void start_connection(struct httpc_req *q)
{
    if (q->pool->literal)
        open_connection(q, (const struct sockaddr *)&q->pool->sa, q->pool->salen);
    else
        start_resolve(q);
}

/* Hands q a connection: the most recently used idle one, or a new one. */
static void dispatch(struct httpc_req *q)
{
    struct npool *p = q->pool;
    struct list_head *first = list_first(&p->idle);
    if (!first) {
        start_connection(q);
        return;
    }
    struct cconn *c = list_entry(first, struct cconn, idle_link);
    idle_unlink(p, c);
    c->q = q;
    q->conn = c;
    q->got_bytes = false;
    q->reached = true;
    send_request(q);
}

/* A TLS connection's first response: keep its session for the pool's next connection. */
static void keep_session(struct cconn *c)
{
    struct tls_session *s = conn_tls_session(&c->c);
    if (!s)
        return;
    tls_session_free(c->pool->session);
    c->pool->session = s;
}

/* Nothing but protocol messages (session tickets, a key update) is waiting inside
 * OpenSSL or the socket: true. Response bytes beyond the response, an end, an error:
 * false (the connection cannot carry another request). */
static bool tls_quiet(struct cconn *c)
{
    char scratch[64];
    if (!conn_read_ready(&c->c))
        return true;
    return conn_read(&c->c, scratch, sizeof(scratch)) == -EAGAIN; /* it drains OpenSSL */
}

/* The response is complete: pool or close the connection, then done. */
static void complete(struct httpc_req *q, bool reusable)
{
    struct cconn *c = q->conn;
    struct httpc *n = q->n;
    if (c) {
        q->conn = NULL;
        c->q = NULL;
        if (conn_is_tls(&c->c) && c->uses == 0)
            keep_session(c);
        c->uses++;
        c->len = 0;
        /* OpenSSL may hold bytes no epoll event will announce: make sure it holds none. */
        if (reusable && conn_is_tls(&c->c))
            reusable = tls_quiet(c);
        if (reusable && !n->freeing && c->pool->nidle < POOL_IDLE_MAX && cc_sync_watch(c) == 0 &&
            !c->want_out)
            idle_push(c->pool, c);
        else
            cc_close(c, true);
    }
    finish(q, 0, "");
}

/* Parses what the connection's buffer holds. STOP when q or its connection went away
 * (completed, failed, cancelled, client freed); GO_ON when more bytes are needed. */
static int process(struct httpc_req *q)
{
    struct cconn *c = q->conn;
    size_t off = 0;
    while (!q->have_head) {
        ssize_t h = http1_parse_response(c->buf + off, c->len - off, &q->head);
        if (h == 0) {
            if (off) {
                memmove(c->buf, c->buf + off, c->len - off);
                c->len -= off;
            }
            return GO_ON;
        }
        if (h < 0) {
            fail(q, -EPROTO, "malformed response head from %s port %d", q->pool->host,
                 q->pool->port);
            return STOP;
        }
        off += (size_t)h;
        if (q->head.status < 200) {
            if (q->head.status == 101) {
                fail(q, -EPROTO, "unexpected protocol switch from %s port %d", q->pool->host,
                     q->pool->port);
                return STOP;
            }
            continue; /* 1xx interim response: the real one follows */
        }
        q->have_head = true;
        q->body = http1_response_body(&q->head, q->method_head);
        q->body_left = q->body == HTTP1_BODY_LENGTH ? (uint64_t)q->head.content_length : 0;
        if (q->body == HTTP1_BODY_CHUNKED)
            http1_chunked_init(&q->ck, 0);
        if (!q->on_chunk && q->body == HTTP1_BODY_LENGTH && q->body_left > q->max) {
            fail(q, -E2BIG, "response larger than max_response (%zu bytes)", q->max);
            return STOP;
        }
        if (q->on_status) {
            q->in_cb = true;
            int rc = q->on_status(q->head.status, q->head.has_ctype ? q->head.ctype : NULL, q->arg);
            if (after_cb(q, rc) == STOP)
                return STOP;
        }
    }
    const char *data = c->buf + off;
    size_t avail = c->len - off;
    c->len = 0; /* everything below is consumed (the decoders keep their own state) */
    bool reusable = http1_response_reusable(&q->head);
    switch (q->body) {
    case HTTP1_BODY_NONE:
        complete(q, reusable && avail == 0);
        return STOP;
    case HTTP1_BODY_LENGTH: {
        size_t take = (uint64_t)avail > q->body_left ? (size_t)q->body_left : avail;
        if (deliver(q, data, take) == STOP)
            return STOP;
        q->body_left -= take;
        if (q->body_left == 0) {
            complete(q, reusable && take == avail);
            return STOP;
        }
        return GO_ON;
    }
    case HTTP1_BODY_CHUNKED:
        while (avail) {
            const char *d;
            size_t dl;
            ssize_t k = http1_chunked_step(&q->ck, data, avail, &d, &dl);
            if (k < 0) {
                fail(q, -EPROTO, "malformed chunked body from %s port %d", q->pool->host,
                     q->pool->port);
                return STOP;
            }
            data += k;
            avail -= (size_t)k;
            if (deliver(q, d, dl) == STOP)
                return STOP;
            if (q->ck.done)
                break;
        }
        if (q->ck.done) {
            complete(q, reusable && avail == 0);
            return STOP;
        }
        return GO_ON;
    case HTTP1_BODY_CLOSE:
        return deliver(q, data, avail);
    }
    return GO_ON;
}

static void cc_read(struct cconn *c)
{
    struct httpc_req *q = c->q;
    while (conn_read_ready(&c->c)) {
        if (c->len == c->cap) {
            /* Only an incomplete head accumulates: the parser caps it. */
            size_t ncap = MOTOR_MIN(c->cap * 2, (size_t)HTTP1_RESPONSE_HEAD_MAX);
            if (ncap <= c->cap) {
                fail(q, -EPROTO, "response head too large");
                return;
            }
            c->buf = xrealloc(c->buf, ncap);
            c->cap = ncap;
        }
        size_t room = c->cap - c->len;
        ssize_t got = conn_read(&c->c, c->buf + c->len, room);
        if (got == -EAGAIN)
            break;
        if (got < 0 && got != -ECONNABORTED) {
            if (retryable(q)) {
                retry(q);
                return;
            }
            if (got == -EPROTO)
                fail(q, -EPROTO, "TLS error from %s port %d: %s", q->pool->host, q->pool->port,
                     conn_error(&c->c));
            else
                fail(q, -EIO, "receive from %s port %d failed: %s", q->pool->host, q->pool->port,
                     strerror((int)-got));
            return;
        }
        if (got <= 0) { /* the end: a FIN, a close_notify, or (-ECONNABORTED) a TLS FIN
                         * without close_notify */
            if (retryable(q)) {
                retry(q);
                return;
            }
            if (q->have_head && q->body == HTTP1_BODY_CLOSE) {
                if (got < 0) { /* the close is the body's end: without close_notify it
                                * may be an attacker's */
                    fail(q, -EIO,
                         "%s port %d closed the connection without TLS close_notify: the "
                         "response may be truncated",
                         q->pool->host, q->pool->port);
                    return;
                }
                complete(q, false);
                return;
            }
            if (!q->got_bytes)
                fail(q, -EIO, "empty reply from %s port %d", q->pool->host, q->pool->port);
            else
                fail(q, -EIO, "connection to %s port %d closed before the response was complete",
                     q->pool->host, q->pool->port);
            return;
        }
        q->got_bytes = true;
        c->len += (size_t)got;
        if (process(q) == STOP)
            return;
    }
    watch_or_fail(q); /* a TLS read may wait for the socket to become writable */
}

/* Idle in the pool and the socket has news: the server closed it, or sent garbage
 * (the connection is then unusable), or (TLS) sent a session ticket or key update. */
static void idle_event(struct cconn *c)
{
    if (conn_is_tls(&c->c) && tls_quiet(c) && cc_sync_watch(c) == 0)
        return;
    /* graceful: our close_notify (even to a peer that left) keeps the pool's TLS
     * session resumable; OpenSSL voids the sessions of unclean closes */
    cc_close(c, true);
}

static void on_conn_event(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct cconn *c = arg;
    struct httpc *n = c->n;
    enter(n);
    conn_on_events(&c->c, events);
    struct httpc_req *q = c->q;
    if (!q) {
        idle_event(c);
        goto out;
    }
    if (c->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err == 0 && !(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            goto out;
        if (err != 0 || (events & (EPOLLERR | EPOLLHUP))) {
            fail(q, -ECONNREFUSED, "failed to connect to %s port %d: %s", q->pool->host,
                 q->pool->port, strerror(err ? err : ECONNREFUSED));
            goto out;
        }
        c->connecting = false;
        connected(q);
        goto out;
    }
    if (q->st == NQ_HANDSHAKE) {
        connected(q);
        goto out;
    }
    if (q->st == NQ_SENDING) {
        send_request(q);
        if (q->conn != c) /* failed (c is freed) or retried elsewhere */
            goto out;
    }
    if (q->st == NQ_SENDING || q->st == NQ_RECEIVING)
        cc_read(c);
out:
    leave(n);
}

/* ---- TLS settings and pools ---------------------------------------------------------- */

static bool same(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

static bool entry_is(const struct tls_entry *e, const struct httpc_tls *t)
{
    return e->insecure == t->insecure && same(e->ca_file, t->ca_file) &&
           same(e->cert_file, t->cert_file) && same(e->key_file, t->key_file) &&
           same(e->key_password, t->key_password) && same(e->crl_file, t->crl_file) &&
           same(e->min_version, t->min_version) && same(e->ciphers, t->ciphers) &&
           same(e->ciphersuites, t->ciphersuites);
}

static void entry_free(struct tls_entry *e)
{
    list_remove(&e->link);
    tls_ctx_unref(e->ctx);
    if (e->key_password)
        explicit_bzero(e->key_password, strlen(e->key_password));
    free(e->ca_file);
    free(e->cert_file);
    free(e->key_file);
    free(e->key_password);
    free(e->crl_file);
    free(e->min_version);
    free(e->ciphers);
    free(e->ciphersuites);
    free(e);
}

/* The context for settings t (NULL = the defaults: verify against the system store),
 * built on first use: the files are read then. NULL with err filled on failure (not
 * remembered: a file may appear later). */
static struct tls_entry *tls_entry_get(struct httpc *n, const struct httpc_tls *t, char *err,
                                       size_t cap)
{
    static const struct httpc_tls defaults;
    if (!t)
        t = &defaults;
    struct list_head *pos;
    list_for_each(pos, &n->tls) {
        struct tls_entry *e = list_entry(pos, struct tls_entry, link);
        if (entry_is(e, t))
            return e;
    }
    struct tls_config tc = {
        .cert_file = t->cert_file,
        .key_file = t->key_file,
        .key_password = t->key_password,
        .ca_file = t->ca_file,
        .crl_file = t->crl_file,
        .min_version = t->min_version,
        .ciphers = t->ciphers,
        .ciphersuites = t->ciphersuites,
        .insecure = t->insecure,
    };
    struct tls_ctx *ctx = tls_ctx_new_client(&tc, err, cap);
    if (!ctx)
        return NULL;
    struct tls_entry *e = xcalloc(1, sizeof(*e));
    e->ctx = ctx;
    e->insecure = t->insecure;
    e->ca_file = xstrdup(t->ca_file);
    e->cert_file = xstrdup(t->cert_file);
    e->key_file = xstrdup(t->key_file);
    e->key_password = xstrdup(t->key_password);
    e->crl_file = xstrdup(t->crl_file);
    e->min_version = xstrdup(t->min_version);
    e->ciphers = xstrdup(t->ciphers);
    e->ciphersuites = xstrdup(t->ciphersuites);
    list_insert_head(&n->tls, &e->link);
    return e;
}

int httpc_tls_reload(struct httpc *n)
{
    int failed = 0;
    struct list_head *pos;
    list_for_each(pos, &n->tls)
    {
        struct tls_entry *e = list_entry(pos, struct tls_entry, link);
        struct tls_config tc = {
            .cert_file = e->cert_file,
            .key_file = e->key_file,
            .key_password = e->key_password,
            .ca_file = e->ca_file,
            .crl_file = e->crl_file,
            .min_version = e->min_version,
            .ciphers = e->ciphers,
            .ciphersuites = e->ciphersuites,
            .insecure = e->insecure,
        };
        char err[256] = "";
        struct tls_ctx *ctx = tls_ctx_new_client(&tc, err, sizeof(err));
        if (!ctx) {
            failed++;
            log_warn("tls_client_context_failed", LF_STR("cert_file", e->cert_file),
                     LF_STR("error", err));
            continue;
        }
        /* Connections made from the old context hold a reference to it. */
        tls_ctx_unref(e->ctx);
        e->ctx = ctx;
    }
    /* Sessions belong to the contexts they were made with: new connections start fresh. */
    list_for_each(pos, &n->pools)
    {
        struct npool *p = list_entry(pos, struct npool, link);
        tls_session_free(p->session);
        p->session = NULL;
    }
    return failed;
}

static struct npool *pool_get(struct httpc *n, const struct http1_url *u, struct tls_entry *tls)
{
    struct list_head *pos;
    list_for_each(pos, &n->pools) {
        struct npool *p = list_entry(pos, struct npool, link);
        if (p->port == u->port && p->tls == tls && strcmp(p->host, u->host) == 0)
            return p;
    }
    struct npool *p = xcalloc(1, sizeof(*p));
    memcpy(p->host, u->host, sizeof(p->host));
    p->port = u->port;
    p->ipv6 = u->ipv6;
    p->tls = tls;
    list_init(&p->idle);
    struct sockaddr_in *s4 = (struct sockaddr_in *)&p->sa;
    struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&p->sa;
    if (inet_pton(AF_INET, u->host, &s4->sin_addr) == 1 || strcasecmp(u->host, "localhost") == 0) {
        /* localhost is loopback by definition (RFC 6761): no resolver round trip. */
        if (strcasecmp(u->host, "localhost") == 0)
            s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)u->port);
        p->salen = sizeof(*s4);
        p->literal = true;
    } else if (inet_pton(AF_INET6, u->host, &s6->sin6_addr) == 1) {
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)u->port);
        p->salen = sizeof(*s6);
        p->literal = true;
    }
    list_insert_head(&n->pools, &p->link);
    return p;
}

/* ---- building the request ----------------------------------------------------------- */

struct outbuf {
    char *p;
    size_t len;
};

static void put(struct outbuf *o, const char *s, size_t n)
{
    if (o->p)
        memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void puts_(struct outbuf *o, const char *s)
{
    put(o, s, strlen(s));
}

static bool header_named(const char *h, const char *name)
{
    size_t n = strlen(name);
    return strncasecmp(h, name, n) == 0 && h[n] == ':';
}

/* A "Name:" with nothing after it asks for the header not to be sent (libcurl's
 * convention, which callers already use, e.g. "Expect:"). */
static bool header_empty(const char *h)
{
    const char *colon = strchr(h, ':');
    if (!colon)
        return false;
    for (const char *v = colon + 1; *v; v++)
        if (*v != ' ' && *v != '\t')
            return false;
    return true;
}

/* Writes the request (or, with o->p NULL, measures it). */
static void build(struct outbuf *o, const char *method, const struct http1_url *u,
                  const struct httpc_opts *opts, bool send_body, const char *body, size_t body_len)
{
    bool user_host = false, user_ctype = false, user_accept = false;
    for (const char *const *h = opts->headers; h && *h; h++) {
        user_host |= header_named(*h, "Host");
        user_ctype |= header_named(*h, "Content-Type");
        user_accept |= header_named(*h, "Accept");
    }
    puts_(o, method);
    puts_(o, " ");
    if (u->path_len == 0 || u->path[0] != '/')
        puts_(o, "/");
    put(o, u->path, u->path_len);
    puts_(o, " HTTP/1.1\r\n");
    if (!user_host) {
        puts_(o, "Host: ");
        if (u->ipv6)
            puts_(o, "[");
        puts_(o, u->host);
        if (u->ipv6)
            puts_(o, "]");
        if (u->port != (u->https ? 443 : 80)) { /* the scheme's default port is implied */
            char port[24] = ":";
            put(o, port, 1 + util_fmt_u64(port + 1, (uint64_t)u->port));
        }
        puts_(o, "\r\n");
    }
    if (!user_accept)
        puts_(o, "Accept: */*\r\n");
    for (const char *const *h = opts->headers; h && *h; h++) {
        /* The framing is computed here; a caller's copy would contradict it. */
        if (header_empty(*h) || header_named(*h, "Content-Length") ||
            header_named(*h, "Transfer-Encoding"))
            continue;
        puts_(o, *h);
        puts_(o, "\r\n");
    }
    if (send_body) {
        if (!user_ctype) {
            puts_(o, "Content-Type: ");
            puts_(o, opts->content_type ? opts->content_type : "application/json");
            puts_(o, "\r\n");
        }
        char cl[24];
        puts_(o, "Content-Length: ");
        put(o, cl, util_fmt_u64(cl, body_len));
        puts_(o, "\r\n");
    }
    puts_(o, "\r\n");
    if (send_body && body_len)
        put(o, body, body_len);
}

static bool token(const char *s)
{
    if (!*s)
        return false;
    for (; *s; s++)
        if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_'))
            return false;
    return true;
}

static struct httpc_req *req_new(struct httpc *n, size_t out_len, httpc_done_cb done,
                                 void *arg)
{
    /* build() writes all out_len bytes of the request: only the struct needs zeroing
     * (the body can be megabytes). */
    struct httpc_req *q = xmalloc(sizeof(*q) + out_len);
    memset(q, 0, sizeof(*q));
    q->n = n;
    q->done = done;
    q->arg = arg;
    q->start_ms = util_mono_ms();
    q->out_len = out_len;
    reactor_timer_init(&q->timer, on_timer, q);
    reactor_deferred_init(&q->dfr, on_deferred, q);
    strbuf_init(&q->resp, 1);
    req_link(q);
    n->nactive++;
    return q;
}

/* A request that completes (from the reactor, never from inside this call) with
 * error/text (copied): for failures found before any connection could be tried. */
static struct httpc_req *req_fail(struct httpc *n, int error, const char *text,
                                  httpc_done_cb done, void *arg)
{
    struct httpc_req *q = req_new(n, 0, done, arg);
    fail(q, error, "%s", text);
    return q;
}

struct httpc_req *httpc_request(struct httpc *n, const struct httpc_opts *o, httpc_done_cb done,
                                void *arg)
{
    if (!o || !o->url || !o->url[0])
        return req_fail(n, -EINVAL, "no url", done, arg);
    struct http1_url u;
    const char *why;
    int rc = http1_url_parse(o->url, &u, &why);
    if (rc != 0)
        return req_fail(n, rc == -EPROTONOSUPPORT ? -EINVAL : rc, why, done, arg);
    const char *method = o->method;
    bool has_body = o->body != NULL;
    if (!method)
        method = has_body ? "POST" : "GET";
    if (!token(method))
        return req_fail(n, -EINVAL, "bad method", done, arg);
    for (const char *const *h = o->headers; h && *h; h++) {
        /* A CR or LF would let a caller's value smuggle headers or a second request. */
        if (strpbrk(*h, "\r\n") || !strchr(*h, ':'))
            return req_fail(n, -EINVAL, "header contains CR or LF, or no colon", done, arg);
    }
    bool send_body = has_body || strcasecmp(method, "POST") == 0;
    size_t body_len = has_body ? (o->body_len ? o->body_len : strlen(o->body)) : 0;
    if (o->content_type && strpbrk(o->content_type, "\r\n"))
        return req_fail(n, -EINVAL, "content type contains CR or LF", done, arg);
    struct tls_entry *tls = NULL;
    if (u.https) {
        char err[256];
        tls = tls_entry_get(n, o->tls, err, sizeof(err));
        if (!tls) {
            char text[300];
            snprintf(text, sizeof(text), "TLS is not usable for %s: %s", o->url, err);
            return req_fail(n, -EIO, text, done, arg);
        }
    }

    struct outbuf ob = {0};
    build(&ob, method, &u, o, send_body, o->body, body_len);
    struct httpc_req *q = req_new(n, ob.len, done, arg);
    ob = (struct outbuf){.p = q->out};
    build(&ob, method, &u, o, send_body, o->body, body_len);

    q->on_status = o->on_status;
    q->on_chunk = o->on_chunk;
    q->method_head = strcasecmp(method, "HEAD") == 0;
    int64_t timeout = o->timeout_ms > 0 ? o->timeout_ms : HTTPC_DEFAULT_TIMEOUT_MS;
    q->connect_timeout_ms = o->connect_timeout_ms > 0
                                ? o->connect_timeout_ms
                                : MOTOR_MIN(timeout, HTTPC_DEFAULT_CONNECT_TIMEOUT_MS);
    q->deadline_ms = q->start_ms + timeout;
    q->max = o->max_response ? o->max_response : HTTPC_DEFAULT_MAX_RESPONSE;
    strbuf_init(&q->resp, q->max);
    q->pool = pool_get(n, &u, tls);
    reactor_timer_start(n->r, &q->timer, timeout, 0);
    dispatch(q);
    return q;
}

void httpc_cancel(struct httpc *n, struct httpc_req *q)
{
    if (!n || !q || q->cancelled)
        return;
    q->cancelled = true;
    n->nactive--;
    if (q->st == NQ_FINISHING || q->in_cb)
        return; /* whoever runs its callback frees it on return */
    req_destroy(q);
}

size_t httpc_active(const struct httpc *n)
{
    return n ? n->nactive : 0;
}

struct httpc_req *httpc_get(struct httpc *c, const char *url, int64_t timeout_ms,
                            httpc_done_cb done, void *arg)
{
    struct httpc_opts o = {.url = url, .timeout_ms = timeout_ms};
    return httpc_request(c, &o, done, arg);
}

struct httpc_req *httpc_post_json(struct httpc *c, const char *url, const json_t *body,
                                  int64_t timeout_ms, httpc_done_cb done, void *arg)
{
    char *s = NULL;
    if (body) {
        s = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s)
            return req_fail(c, -EINVAL, "body is not serializable JSON", done, arg);
    }
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = s ? s : "",
        .body_len = s ? strlen(s) : 0,
        .content_type = "application/json",
        .timeout_ms = timeout_ms,
    };
    struct httpc_req *q = httpc_request(c, &o, done, arg);
    free(s);
    return q;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

struct httpc *httpc_new(struct reactor *r)
{
    if (!r)
        return NULL;
    struct httpc *n = xcalloc(1, sizeof(*n));
    n->r = r;
    list_init(&n->reqs);
    list_init(&n->pools);
    list_init(&n->tls);
    n->hub = xcalloc(1, sizeof(*n->hub));
    pthread_mutex_init(&n->hub->mu, NULL);
    n->hub->r = r;
    n->hub->refs = 1;
    return n;
}

static void really_free(struct httpc *n)
{
    while (!list_empty(&n->reqs))
        req_destroy(list_entry(list_first(&n->reqs), struct httpc_req, link));
    while (!list_empty(&n->pools)) {
        struct npool *p = list_entry(list_first(&n->pools), struct npool, link);
        list_remove(&p->link);
        while (!list_empty(&p->idle))
            cc_close(list_entry(list_first(&p->idle), struct cconn, idle_link), true);
        tls_session_free(p->session);
        free(p);
    }
    while (!list_empty(&n->tls))
        entry_free(list_entry(list_first(&n->tls), struct tls_entry, link));
    pthread_mutex_lock(&n->hub->mu);
    n->hub->r = NULL; /* resolver threads still running drop their results */
    pthread_mutex_unlock(&n->hub->mu);
    hub_unref(n->hub);
    free(n);
}

void httpc_free(struct httpc *n)
{
    if (!n)
        return;
    if (n->depth > 0) {
        n->freeing = true;
        return;
    }
    really_free(n);
}
