/* httpc_native — the http:// backend of httpc: HTTP/1.1 over plain TCP on the reactor.
 *
 * Why not libcurl: the coordinator proxies every inference request through this
 * client, and libcurl's per-request cost (several microseconds) was most of the
 * gateway's added latency; and linking libcurl costs every daemon several MiB of RSS.
 *
 * Shape of the hot path (a keep-alive connection to an engine is idle in the pool):
 * httpc_native_request() serializes head and body into one buffer inside the request
 * object, pops the most recently used idle connection and sends the whole request with
 * one send(). The response is read into the connection's buffer, parsed in place
 * (httpc_parse.c), and on completion the connection goes back to the pool *before*
 * done runs, so a request started from done reuses it at once. Idle connections stay
 * registered with the reactor (EPOLLIN): reuse costs no epoll_ctl, and a server closing
 * an idle connection is noticed (readable) and the connection dropped. Timeouts are
 * reactor timers (a heap: no syscalls); errors are delivered through reactor_defer, so
 * done never runs inside httpc_request().
 *
 * Re-entrancy. User callbacks (on_status, on_chunk, done) may start or cancel any
 * request, including (status/chunk) their own, and may free the client. Rules:
 *  - Callbacks run only from entry points (fd event, timer, deferred, resolver result),
 *    each bracketed by enter()/leave(); httpc_native_free() with an entry point on the
 *    stack only sets `freeing`, and the outermost leave() frees everything.
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
#include "common/httpc_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

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

enum { GO_ON = 0, STOP = 1 };

enum nq_state {
    NQ_RESOLVING,  /* waiting for the resolver thread */
    NQ_CONNECTING, /* non-blocking connect in progress */
    NQ_SENDING,    /* part of the request is still unsent (EPOLLOUT) */
    NQ_RECEIVING,
    NQ_FAILED,     /* error recorded, done deferred */
    NQ_FINISHING,  /* out of every list; done is running */
};

struct npool;
struct nresolve;

struct nconn {
    struct httpc_native *n;
    struct npool *pool;
    struct nconn *prev, *next; /* in the pool's idle list */
    struct httpc_req *q;       /* the request using it; NULL when idle */
    int fd;
    bool connecting;
    bool idle;
    bool want_out; /* EPOLLOUT in the registered mask */
    unsigned uses; /* responses completed on it */
    char *buf;
    size_t len, cap;
};

struct npool {
    struct npool *next;
    char host[HTTPC_HOST_MAX];
    int port;
    bool ipv6;
    bool literal; /* sa is known without a resolver */
    struct sockaddr_storage sa;
    socklen_t salen;
    struct nconn *idle; /* most recently used first */
    size_t nidle;
};

struct httpc_req {
    struct httpc_req_hdr hdr; /* first: is_curl = false */
    struct httpc_native *n;
    struct httpc_req *prev, *next; /* every live request */
    enum nq_state st;
    struct npool *pool;
    struct nconn *conn;
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
    bool have_head;

    struct httpc_head head;
    enum httpc_body body;
    uint64_t body_left;
    struct httpc_chunked ck;
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
    char host[HTTPC_HOST_MAX];
};

struct httpc_native {
    struct reactor *r;
    struct httpc_req *reqs; /* live requests (not FINISHING) */
    struct npool *pools;
    struct resolve_hub *hub;
    size_t nactive;
    int depth;
    bool freeing;
};

/* ---- lists, lifecycle helpers ---------------------------------------------------- */

static void really_free(struct httpc_native *n);

static void enter(struct httpc_native *n)
{
    n->depth++;
}

static void leave(struct httpc_native *n)
{
    if (--n->depth == 0 && n->freeing)
        really_free(n);
}

static void req_link(struct httpc_req *q)
{
    struct httpc_native *n = q->n;
    q->prev = NULL;
    q->next = n->reqs;
    if (n->reqs)
        n->reqs->prev = q;
    n->reqs = q;
}

static void req_unlink(struct httpc_req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else if (q->n->reqs == q)
        q->n->reqs = q->next;
    if (q->next)
        q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void idle_push(struct npool *p, struct nconn *c)
{
    c->idle = true;
    c->prev = NULL;
    c->next = p->idle;
    if (p->idle)
        p->idle->prev = c;
    p->idle = c;
    p->nidle++;
}

static void idle_unlink(struct npool *p, struct nconn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        p->idle = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->idle = false;
    p->nidle--;
}

static void conn_close(struct nconn *c)
{
    if (c->idle)
        idle_unlink(c->pool, c);
    if (c->q)
        c->q->conn = NULL;
    reactor_del_fd(c->n->r, c->fd);
    close(c->fd);
    free(c->buf);
    free(c);
}

/* Frees q and everything it holds. No callback runs. */
static void req_destroy(struct httpc_req *q)
{
    struct httpc_native *n = q->n;
    reactor_timer_stop(n->r, &q->timer);
    reactor_defer_cancel(n->r, &q->dfr);
    if (q->res) {
        q->res->q = NULL; /* its result is dropped when it arrives */
        q->res = NULL;
    }
    if (q->conn)
        conn_close(q->conn); /* mid-request: never reusable */
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
    struct httpc_native *n = q->n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->errtext, sizeof(q->errtext), fmt, ap);
    va_end(ap);
    q->err = err;
    if (q->conn)
        conn_close(q->conn);
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
    struct httpc_native *n = q->n;
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
        };
        if (q->done)
            q->done(&resp, q->arg);
    }
    req_destroy(q);
}

static void on_deferred(struct reactor *r, void *arg)
{
    struct httpc_req *q = arg;
    struct httpc_native *n = q->n;
    enter(n);
    finish(q, q->err, q->errtext);
    leave(n);
}

static void on_timer(struct reactor *r, void *arg)
{
    struct httpc_req *q = arg;
    struct httpc_native *n = q->n;
    enter(n);
    int64_t took = util_mono_ms() - q->start_ms;
    if (q->st == NQ_CONNECTING || q->st == NQ_RESOLVING)
        fail(q, -ETIMEDOUT, "connection to %s port %d timed out after %lld ms", q->pool->host,
             q->pool->port, (long long)took);
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

static int conn_watch(struct nconn *c, bool want_out)
{
    if (c->want_out == want_out)
        return 0;
    int rc = reactor_mod_fd(c->n->r, c->fd, EPOLLIN | (want_out ? EPOLLOUT : 0));
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
    conn_close(q->conn);
    q->retried = true;
    q->out_off = 0;
    start_connection(q);
}

static void send_request(struct httpc_req *q)
{
    struct nconn *c = q->conn;
    while (q->out_off < q->out_len) {
        ssize_t w = send(c->fd, q->out + q->out_off, q->out_len - q->out_off, MSG_NOSIGNAL);
        if (w > 0) {
            q->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            q->st = NQ_SENDING;
            if (conn_watch(c, true) != 0)
                fail(q, -EIO, "cannot watch connection to %s port %d", q->pool->host, q->pool->port);
            return;
        }
        int e = w < 0 ? errno : EPIPE;
        if (retryable(q)) {
            retry(q);
            return;
        }
        fail(q, -EIO, "send to %s port %d failed: %s", q->pool->host, q->pool->port, strerror(e));
        return;
    }
    q->st = NQ_RECEIVING;
    if (c->want_out && conn_watch(c, false) != 0)
        fail(q, -EIO, "cannot watch connection to %s port %d", q->pool->host, q->pool->port);
}

static void open_connection(struct httpc_req *q, const struct sockaddr *sa, socklen_t salen)
{
    struct httpc_native *n = q->n;
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
    struct nconn *c = xcalloc(1, sizeof(*c));
    c->n = n;
    c->pool = p;
    c->fd = fd;
    c->connecting = connecting;
    c->want_out = true;
    c->cap = CONN_BUF_INITIAL;
    c->buf = xmalloc(c->cap);
    int rc = reactor_add_fd(n->r, fd, EPOLLIN | EPOLLOUT, on_conn_event, c);
    if (rc != 0) {
        close(fd);
        free(c->buf);
        free(c);
        fail(q, -EIO, "cannot watch connection: %s", strerror(-rc));
        return;
    }
    c->q = q;
    q->conn = c;
    q->got_bytes = false;
    if (connecting) {
        q->st = NQ_CONNECTING;
        int64_t left = q->deadline_ms - util_mono_ms();
        int64_t ct = MOTOR_MIN(left, q->connect_timeout_ms);
        reactor_timer_start(n->r, &q->timer, ct > 0 ? ct : 0, 0);
        return;
    }
    send_request(q);
}

static void on_resolved(void *arg)
{
    struct nresolve *res = arg;
    struct httpc_req *q = res->q;
    if (q) {
        struct httpc_native *n = q->n;
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
    struct httpc_native *n = q->n;
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
    struct nconn *c = p->idle;
    if (!c) {
        start_connection(q);
        return;
    }
    idle_unlink(p, c);
    c->q = q;
    q->conn = c;
    q->got_bytes = false;
    send_request(q);
}

/* The response is complete: pool or close the connection, then done. */
static void complete(struct httpc_req *q, bool reusable)
{
    struct nconn *c = q->conn;
    struct httpc_native *n = q->n;
    if (c) {
        q->conn = NULL;
        c->q = NULL;
        c->uses++;
        c->len = 0;
        if (reusable && !n->freeing && c->pool->nidle < POOL_IDLE_MAX && !c->want_out)
            idle_push(c->pool, c);
        else
            conn_close(c);
    }
    finish(q, 0, "");
}

/* Parses what the connection's buffer holds. STOP when q or its connection went away
 * (completed, failed, cancelled, client freed); GO_ON when more bytes are needed. */
static int process(struct httpc_req *q)
{
    struct nconn *c = q->conn;
    size_t off = 0;
    while (!q->have_head) {
        ssize_t h = httpc_parse_head(c->buf + off, c->len - off, &q->head);
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
        q->body = httpc_body_kind(&q->head, q->method_head);
        q->body_left = q->body == HTTPC_BODY_LENGTH ? (uint64_t)q->head.content_length : 0;
        if (q->body == HTTPC_BODY_CHUNKED)
            httpc_chunked_init(&q->ck);
        if (!q->on_chunk && q->body == HTTPC_BODY_LENGTH && q->body_left > q->max) {
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
    bool reusable = httpc_head_reusable(&q->head);
    switch (q->body) {
    case HTTPC_BODY_NONE:
        complete(q, reusable && avail == 0);
        return STOP;
    case HTTPC_BODY_LENGTH: {
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
    case HTTPC_BODY_CHUNKED:
        while (avail) {
            const char *d;
            size_t dl;
            ssize_t k = httpc_chunked_step(&q->ck, data, avail, &d, &dl);
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
    case HTTPC_BODY_CLOSE:
        return deliver(q, data, avail);
    }
    return GO_ON;
}

static void conn_read(struct nconn *c)
{
    struct httpc_req *q = c->q;
    for (;;) {
        if (c->len == c->cap) {
            /* Only an incomplete head accumulates: the parser caps it. */
            size_t ncap = MOTOR_MIN(c->cap * 2, (size_t)HTTPC_HEAD_MAX);
            if (ncap <= c->cap) {
                fail(q, -EPROTO, "response head too large");
                return;
            }
            c->buf = xrealloc(c->buf, ncap);
            c->cap = ncap;
        }
        size_t room = c->cap - c->len;
        ssize_t got = recv(c->fd, c->buf + c->len, room, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            int e = errno;
            if (retryable(q)) {
                retry(q);
                return;
            }
            fail(q, -EIO, "receive from %s port %d failed: %s", q->pool->host, q->pool->port,
                 strerror(e));
            return;
        }
        if (got == 0) {
            if (retryable(q)) {
                retry(q);
                return;
            }
            if (q->have_head && q->body == HTTPC_BODY_CLOSE) {
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
        if ((size_t)got < room)
            return; /* drained: level-triggered epoll says when there is more */
    }
}

static void on_conn_event(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct nconn *c = arg;
    struct httpc_native *n = c->n;
    enter(n);
    struct httpc_req *q = c->q;
    if (!q) {
        /* Idle and readable: the server closed it (or sent garbage). Either way it
         * cannot carry a request any more. */
        conn_close(c);
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
        int64_t left = q->deadline_ms - util_mono_ms();
        reactor_timer_start(n->r, &q->timer, left > 0 ? left : 0, 0);
        send_request(q);
        goto out;
    }
    if (q->st == NQ_SENDING && (events & EPOLLOUT)) {
        send_request(q);
        if (q->conn != c) /* failed (c is freed) or retried elsewhere */
            goto out;
    }
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
        conn_read(c);
out:
    leave(n);
}

/* ---- pools -------------------------------------------------------------------------- */

static struct npool *pool_get(struct httpc_native *n, const struct httpc_url *u)
{
    for (struct npool *p = n->pools; p; p = p->next)
        if (p->port == u->port && strcmp(p->host, u->host) == 0)
            return p;
    struct npool *p = xcalloc(1, sizeof(*p));
    memcpy(p->host, u->host, sizeof(p->host));
    p->port = u->port;
    p->ipv6 = u->ipv6;
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
    p->next = n->pools;
    n->pools = p;
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
static void build(struct outbuf *o, const char *method, const struct httpc_url *u,
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
        if (u->port != 80) {
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

static struct httpc_req *req_new(struct httpc_native *n, size_t out_len, httpc_done_cb done,
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

struct httpc_req *httpc_native_fail(struct httpc_native *n, int error, const char *text,
                                    httpc_done_cb done, void *arg)
{
    struct httpc_req *q = req_new(n, 0, done, arg);
    fail(q, error, "%s", text);
    return q;
}

struct httpc_req *httpc_native_request(struct httpc_native *n, const struct httpc_opts *o,
                                       httpc_done_cb done, void *arg)
{
    if (!o || !o->url || !o->url[0])
        return httpc_native_fail(n, -EINVAL, "no url", done, arg);
    struct httpc_url u;
    const char *why;
    int rc = httpc_url_parse(o->url, &u, &why);
    if (rc == 0 && u.https)
        rc = -EPROTONOSUPPORT, why = "https urls go through libcurl";
    if (rc != 0)
        return httpc_native_fail(n, rc == -EPROTONOSUPPORT ? -EINVAL : rc, why, done, arg);
    const char *method = o->method;
    bool has_body = o->body != NULL;
    if (!method)
        method = has_body ? "POST" : "GET";
    if (!token(method))
        return httpc_native_fail(n, -EINVAL, "bad method", done, arg);
    for (const char *const *h = o->headers; h && *h; h++) {
        /* A CR or LF would let a caller's value smuggle headers or a second request. */
        if (strpbrk(*h, "\r\n") || !strchr(*h, ':'))
            return httpc_native_fail(n, -EINVAL, "header contains CR or LF, or no colon", done,
                                     arg);
    }
    bool send_body = has_body || strcasecmp(method, "POST") == 0;
    size_t body_len = has_body ? (o->body_len ? o->body_len : strlen(o->body)) : 0;
    if (o->content_type && strpbrk(o->content_type, "\r\n"))
        return httpc_native_fail(n, -EINVAL, "content type contains CR or LF", done, arg);

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
    q->pool = pool_get(n, &u);
    reactor_timer_start(n->r, &q->timer, timeout, 0);
    dispatch(q);
    return q;
}

void httpc_native_cancel(struct httpc_native *n, struct httpc_req *q)
{
    if (!n || !q || q->cancelled)
        return;
    q->cancelled = true;
    n->nactive--;
    if (q->st == NQ_FINISHING || q->in_cb)
        return; /* whoever runs its callback frees it on return */
    req_destroy(q);
}

size_t httpc_native_active(const struct httpc_native *n)
{
    return n ? n->nactive : 0;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

struct httpc_native *httpc_native_new(struct reactor *r)
{
    struct httpc_native *n = xcalloc(1, sizeof(*n));
    n->r = r;
    n->hub = xcalloc(1, sizeof(*n->hub));
    pthread_mutex_init(&n->hub->mu, NULL);
    n->hub->r = r;
    n->hub->refs = 1;
    return n;
}

static void really_free(struct httpc_native *n)
{
    while (n->reqs)
        req_destroy(n->reqs);
    while (n->pools) {
        struct npool *p = n->pools;
        n->pools = p->next;
        while (p->idle)
            conn_close(p->idle);
        free(p);
    }
    pthread_mutex_lock(&n->hub->mu);
    n->hub->r = NULL; /* resolver threads still running drop their results */
    pthread_mutex_unlock(&n->hub->mu);
    hub_unref(n->hub);
    free(n);
}

void httpc_native_free(struct httpc_native *n)
{
    if (!n)
        return;
    if (n->depth > 0) {
        n->freeing = true;
        return;
    }
    really_free(n);
}
