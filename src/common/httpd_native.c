/* httpd_native — HTTP/1.1 connections driven directly by the reactor, over plain TCP or
 * TLS (conn.h: the transport is the only difference; parser, limits, slow-client rules,
 * pipelining and streaming are the same code for both).
 *
 * Built for the proxy's hot path: accept4 in a loop, TCP_NODELAY, one edge-triggered
 * epoll registration per connection for its whole life (EPOLLIN|EPOLLOUT|EPOLLRDHUP:
 * no epoll_ctl per request), a recv that usually brings head and body at once, and
 * the answer (status line, headers and body) handed to the kernel in one writev.
 * Late answers and stream data are sent from a reactor_defer callback, so several
 * writes in one loop pass go out together and callers are never re-entered.
 *
 * Per connection the state machine is: (TLS) the handshake -> read a head -> read the
 * body (Content-Length,
 * chunked, or discard an oversize one) -> the handler runs and the connection waits
 * for the answer (suspended) -> write it -> the request is finished (on_close) -> next
 * request, which may already be in the read buffer (pipelining: strictly one at a
 * time, in order). Edge-triggered readiness is remembered by the conn (conn_read_ready,
 * conn_write_ready), which also knows what OpenSSL buffered and waits for.
 *
 * TLS: a handshake must complete within one idle timeout (bytes of a handshake are not
 * progress: a client dripping a ClientHello is cut like any idle one); a failed one is
 * logged once (peer, OpenSSL's reason) and closes the connection, nothing else; a plain
 * HTTP request on a TLS port gets a plain 400. A TLS ClientHello on a plain port is
 * logged and closed. Graceful closes send close_notify.
 *
 * A client that goes away while its request waits for an answer or stream data is
 * noticed from EPOLLRDHUP/EPOLLHUP at once (a client that half-closes after sending
 * its request counts as gone; HTTP clients do not do that in practice).
 *
 * Slow clients: after the first idle timeout a request must keep arriving, and an answer
 * the socket will not take must keep draining, at HTTPD_MIN_RATE on average, or the
 * connection is closed (the request then ends with client_gone). A stream with nothing
 * to send is waiting for its producer, not for the client: only unsent bytes count.
 *
 * Every answer carries Date (RFC 9110 §6.6.1), formatted at most once a second per
 * server and reused in between, as nginx does. */
#include "common/conn.h"
#include "common/http1.h"
#include "common/httpd_core.h"
#include "common/list.h"
#include "common/log.h"
#include "common/tls.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define NATIVE_ACCEPT_BATCH 64         /* accepts per listener event (fairness) */
#define NATIVE_ACCEPT_PAUSE_MS 250     /* listener off after running out of fds */
#define NATIVE_SWEEP_MS 1000           /* idle-timeout sweep period */
#define NATIVE_LINGER_MS 2000          /* draining a closing connection at most this long */
#define NATIVE_LINGER_BYTES (256u << 10)
#define NATIVE_OUT_KEEP (64u << 10)    /* larger output buffers are freed when drained */
#define NATIVE_OUT_MAX (3 * HTTPD_STREAM_MAX)
/* Slow clients (h->min_rate, HTTPD_MIN_RATE = 500 B/s): reading a request, after the
 * first idle_timeout_s head and body must keep arriving at that average rate. The idle
 * timer alone is reset by every byte, so a client sending one byte a minute (slowloris)
 * held a connection slot forever. Writing an answer: the same rate, counted from the
 * first time the socket refused output, for the same reason (a client reading a big or
 * streamed answer slowly: the kernel wakes a writer only once a good part of its send
 * buffer has drained, so with the default 60 s idle timeout a reader taking a few
 * hundred bytes a second made progress often enough never to be idle). */
/* A Content-Length body gets this much memory up front and grows (doubling, never past
 * the announced length) as bytes arrive: a head announcing max_body costs nothing until
 * the body is really sent, so heads alone cannot reserve max_connections × max_body. */
#define NATIVE_BODY_FIRST (64u << 10)
/* "\r\nDate: Sun, 06 Nov 1994 08:49:37 GMT\r\n": the status line's end comes with it */
#define DATE_LINE_LEN 39

enum hc_state {
    C_HANDSHAKE, /* TLS: the handshake has not completed */
    C_HEAD,    /* waiting for / reading a request head */
    C_BODY,    /* reading the body into req->body */
    C_DISCARD, /* reading an oversize body to throw it away, then 413 */
    C_APP,     /* the request is with the application (answer or stream pending) */
    C_LINGER,  /* answer sent, write side shut: drain the peer's leftovers, then close */
};

struct native;

struct hconn {
    struct native *n;
    struct list_head link; /* in n->conns */
    struct conn c;         /* the transport (its fd is the connection's) */
    enum hc_state state;
    char peer[INET6_ADDRSTRLEN];

    char *rbuf; /* HTTP1_REQUEST_HEAD_MAX bytes */
    size_t rlen;

    struct httpd_req *req;
    bool http10;
    bool keep_alive;  /* may carry another request after the current one */
    bool chunked;     /* the current body */
    struct http1_chunked ch;
    uint64_t body_left; /* Content-Length bytes still to read (or discard) */
    size_t body_cap;
    size_t discarded;

    bool peer_closed;
    bool in_run;
    bool head_sent;  /* the response head went out (or is queued in out) */
    bool resp_done;  /* the whole response is in out/tail: finish when drained */
    bool close_after; /* no request follows: close once out is drained */

    struct strbuf out; /* head and framed stream data */
    size_t out_off;
    const char *tail; /* response body (owned by req), after out */
    size_t tail_len, tail_off;
    size_t lingered;

    int64_t last_io;
    int64_t read_deadline; /* the request being read must be complete by then; 0 = none */
    /* Output is waiting for the socket: it must have drained by then (pushed back by
     * every byte the client takes); 0 = nothing is held back. */
    int64_t write_deadline;
    struct reactor_deferred run;
};

struct native {
    struct httpd *h;
    int lfd;
    struct list_head conns; /* struct hconn.link */
    size_t nconns;
    struct reactor_timer sweep;
    struct reactor_deferred accept_more;
    struct reactor_timer rearm; /* turns the listener back on after a pause */
    bool paused;
    /* "\r\nDate: <IMF-fixdate>\r\n" of the current second, valid until date_until (a
     * reactor_now time: the next second boundary of the wall clock). */
    int64_t date_until;
    char date[DATE_LINE_LEN + 1];
};

static void hc_run(struct hconn *c);
static size_t out_pending(const struct hconn *c);

/* ---- connection lifetime ----------------------------------------------------------------- */

static void hc_close(struct hconn *c, bool ok)
{
    struct native *n = c->n;
    if (c->req) {
        struct httpd_req *req = c->req;
        c->req = NULL;
        httpd_req_finish(req, ok);
    }
    reactor_del_fd(n->h->r, c->c.fd);
    /* A graceful close of a TLS connection says so (close_notify); an abort does not. */
    if (ok && conn_is_tls(&c->c) && conn_handshake_done(&c->c) && c->state != C_LINGER)
        conn_shutdown(&c->c);
    conn_close(&c->c);
    reactor_defer_cancel(n->h->r, &c->run);
    list_remove(&c->link);
    n->nconns--;
    strbuf_release(&c->out);
    free(c->rbuf);
    free(c);
}

static void on_conn_deferred(struct reactor *r, void *arg)
{
    hc_run(arg);
}

static void on_conn_event(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct hconn *c = arg;
    if (events & (EPOLLERR | EPOLLHUP)) {
        if (c->state == C_LINGER || (!c->req && c->out.len == c->out_off)) {
            hc_close(c, true);
            return;
        }
        if (c->req && c->req->handled) {
            c->req->client_gone = true;
            log_debug("http_client_gone", LF_STR("server", c->n->h->name),
                      LF_STR("path", c->req->path));
        }
        hc_close(c, false);
        return;
    }
    if (events & EPOLLRDHUP)
        c->peer_closed = true;
    conn_on_events(&c->c, events);
    hc_run(c);
}

static void peer_text(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    out[0] = '\0';
    if (ss->ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)ss)->sin_addr, out,
                  (socklen_t)cap);
    } else if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) /* dual-stack listener: show the IPv4 peer */
            inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, a, out, (socklen_t)cap);
    }
}

/* At the limit (evict_idle): close the connection idle longest — between requests,
 * nothing read, nothing to write — to make room. A scan of the connections, but only at
 * the limit; false when none is idle (every slot busy: the new one is refused). */
static bool evict_oldest_idle(struct native *n)
{
    struct hconn *oldest = NULL;
    struct list_head *pos;
    list_for_each(pos, &n->conns) {
        struct hconn *c = list_entry(pos, struct hconn, link);
        if (c->state == C_HEAD && c->rlen == 0 && !c->req && out_pending(c) == 0 &&
            (!oldest || c->last_io < oldest->last_io))
            oldest = c;
    }
    if (!oldest)
        return false;
    log_debug("http_idle_evicted", LF_STR("server", n->h->name), LF_STR("peer", oldest->peer),
              LF_INT("idle_ms", reactor_now(n->h->r) - oldest->last_io));
    hc_close(oldest, true);
    return true;
}

static void accept_batch(struct native *n)
{
    struct httpd *h = n->h;
    for (int i = 0; i < NATIVE_ACCEPT_BATCH; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(n->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The connection stays queued, so the level-triggered listener would
                 * report it again at once: the loop would spin (and log) until an fd is
                 * free. Stop listening for a moment instead. */
                int e = errno;
                if (!n->paused && reactor_mod_fd(h->r, n->lfd, 0) == 0) {
                    n->paused = true;
                    reactor_timer_start(h->r, &n->rearm, NATIVE_ACCEPT_PAUSE_MS, 0);
                    log_warn("httpd_accept_paused", LF_STR("server", h->name),
                             LF_STR("error", strerror(e)));
                }
                return;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn("httpd_accept_failed", LF_STR("server", h->name),
                         LF_STR("error", strerror(errno)));
            return;
        }
        if (n->nconns >= h->max_connections && !(h->evict_idle && evict_oldest_idle(n))) {
            close(fd); /* over the limit: refused at once, before any byte is read */
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct hconn *c = xcalloc(1, sizeof(*c));
        c->n = n;
        list_init(&c->link);
        if (h->tls) {
            int trc = conn_init_tls_server(&c->c, fd, h->tls);
            if (trc != 0) {
                log_warn("tls_session_failed", LF_STR("server", h->name), LF_INT("errno", -trc));
                conn_close(&c->c);
                free(c);
                continue;
            }
            c->state = C_HANDSHAKE;
        } else {
            conn_init_plain(&c->c, fd);
            c->state = C_HEAD;
        }
        c->rbuf = xmalloc(HTTP1_REQUEST_HEAD_MAX);
        c->last_io = reactor_now(h->r);
        strbuf_init(&c->out, NATIVE_OUT_MAX);
        peer_text(&ss, c->peer, sizeof(c->peer));
        reactor_deferred_init(&c->run, on_conn_deferred, c);
        uint32_t ev = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
        int rc = reactor_add_fd(h->r, fd, ev, on_conn_event, c);
        if (rc == -EEXIST) {
            /* accept4 just handed us this number, so whoever registered it before has
             * closed it without telling the reactor: that watch is dead (epoll dropped
             * it with the old socket). Replace it rather than refuse the client. */
            log_warn("httpd_stale_watch", LF_STR("server", h->name), LF_INT("fd", fd));
            reactor_del_fd(h->r, fd);
            rc = reactor_add_fd(h->r, fd, ev, on_conn_event, c);
        }
        if (rc != 0) {
            log_warn("httpd_watch_failed", LF_STR("server", h->name), LF_INT("errno", -rc));
            conn_close(&c->c);
            strbuf_release(&c->out);
            free(c->rbuf);
            free(c);
            continue;
        }
        list_insert_head(&n->conns, &c->link);
        n->nconns++;
    }
    /* More may be waiting: let other connections run first. */
    reactor_defer(h->r, &n->accept_more);
}

static void on_listen(struct reactor *r, int fd, uint32_t events, void *arg)
{
    accept_batch(arg);
}

static void on_accept_more(struct reactor *r, void *arg)
{
    accept_batch(arg);
}

static void on_rearm(struct reactor *r, void *arg)
{
    struct native *n = arg;
    n->paused = false;
    (void)reactor_mod_fd(r, n->lfd, EPOLLIN);
}

/* ---- output --------------------------------------------------------------------------------- */

static void put2(char *p, unsigned v)
{
    p[0] = (char)('0' + v / 10 % 10);
    p[1] = (char)('0' + v % 10);
}

/* The Date line of this second, after the CRLF that ends the status line (one append
 * for both): formatted when the second changes, so gmtime runs once a second at most
 * however many answers go out. The reactor's clock is the one taken when this loop
 * pass began, so a pass that straddles a second may stamp the one before (by the
 * pass's length at worst); a refresh that comes early formats the same second again. */
static const char *date_line(struct native *n)
{
    int64_t now = reactor_now(n->h->r);
    if (now < n->date_until)
        return n->date;
    static const char days[] = "SunMonTueWedThuFriSat";
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!gmtime_r(&ts.tv_sec, &tm)) {
        memset(&tm, 0, sizeof(tm));
        tm.tm_year = 70;
        tm.tm_mday = 1;
        tm.tm_wday = 4;
    }
    char *p = n->date + 2;
    memcpy(n->date, "\r\nDate: ", 8);
    memcpy(p + 6, days + 3 * tm.tm_wday, 3);
    memcpy(p + 9, ", ", 2);
    put2(p + 11, (unsigned)tm.tm_mday);
    p[13] = ' ';
    memcpy(p + 14, months + 3 * tm.tm_mon, 3);
    p[17] = ' ';
    unsigned y = (unsigned)(tm.tm_year + 1900) % 10000;
    put2(p + 18, y / 100);
    put2(p + 20, y % 100);
    p[22] = ' ';
    put2(p + 23, (unsigned)tm.tm_hour);
    p[25] = ':';
    put2(p + 26, (unsigned)tm.tm_min);
    p[28] = ':';
    put2(p + 29, (unsigned)tm.tm_sec);
    memcpy(p + 31, " GMT\r\n", 6);
    n->date[DATE_LINE_LEN] = '\0';
    /* valid until the wall clock's next whole second, measured on the monotonic clock */
    n->date_until = now + 1000 - ts.tv_nsec / 1000000;
    return n->date;
}

/* n more bytes moved: a deadline that is not yet set opens a window of idle_timeout_s;
 * a set one moves on by 1/min_rate s per byte (never beyond a full window from now), so
 * only a client slower than min_rate on average runs out of time. */
static void rate_progress(struct hconn *c, int64_t *deadline, size_t n)
{
    struct httpd *h = c->n->h;
    int64_t now = reactor_now(h->r);
    int64_t window = (int64_t)h->idle_timeout_s * 1000;
    if (!*deadline) {
        *deadline = now + window;
        return;
    }
    *deadline += (int64_t)MOTOR_MIN(n, (size_t)1 << 30) * 1000 / h->min_rate;
    if (*deadline > now + window)
        *deadline = now + window;
}

static size_t out_pending(const struct hconn *c)
{
    return c->out.len - c->out_off + c->tail_len - c->tail_off;
}

/* Write what is queued. 0 (all written or the socket is full), -EPIPE on error. */
static int hc_flush(struct hconn *c)
{
    while (out_pending(c) > 0 && conn_write_ready(&c->c)) {
        struct iovec iov[2];
        int k = 0;
        if (c->out.len > c->out_off)
            iov[k++] = (struct iovec){c->out.buf + c->out_off, c->out.len - c->out_off};
        if (c->tail_len > c->tail_off)
            iov[k++] = (struct iovec){(void *)(c->tail + c->tail_off), c->tail_len - c->tail_off};
        ssize_t w = conn_writev(&c->c, iov, k);
        if (w < 0) {
            if (w == -EAGAIN)
                break;
            if (w != -EPIPE && w != -ECONNRESET && conn_is_tls(&c->c))
                log_info("tls_write_failed", LF_STR("server", c->n->h->name),
                         LF_STR("peer", c->peer), LF_STR("error", conn_error(&c->c)));
            return -EPIPE;
        }
        c->last_io = reactor_now(c->n->h->r);
        if (c->write_deadline)
            rate_progress(c, &c->write_deadline, (size_t)w);
        size_t left = (size_t)w;
        size_t o = MOTOR_MIN(left, c->out.len - c->out_off);
        c->out_off += o;
        left -= o;
        c->tail_off += left;
    }
    if (out_pending(c) > 0 && !c->write_deadline) /* held back from now on: the clock starts */
        rate_progress(c, &c->write_deadline, 0);
    if (out_pending(c) == 0)
        c->write_deadline = 0; /* nothing held back: an idle stream is not a slow client */
    if (c->out_off == c->out.len) {
        if (c->out.cap > NATIVE_OUT_KEEP)
            strbuf_release(&c->out);
        else
            strbuf_reset(&c->out);
        c->out_off = 0;
    } else if (c->out_off > (1u << 20) && c->out_off * 2 > c->out.len) {
        strbuf_consume(&c->out, c->out_off); /* amortised over >= 1 MiB sent */
        c->out_off = 0;
    }
    return 0;
}

static void put_head(struct hconn *c, struct httpd_req *req, bool chunked, size_t length)
{
    struct strbuf *o = &c->out;
    const char *reason = httpd_status_text(req->status);
    /* Built by hand: this runs for every answer and printf was a visible share of it. */
    strbuf_puts(o, "HTTP/1.1 ");
    strbuf_put_u64(o, (unsigned)req->status);
    strbuf_putc(o, ' ');
    strbuf_puts(o, *reason ? reason : "Status");
    strbuf_append(o, date_line(c->n), DATE_LINE_LEN); /* CRLF, Date */
    strbuf_append(o, req->rhdrs.buf ? req->rhdrs.buf : "", req->rhdrs.len);
    if (chunked)
        strbuf_puts(o, "Transfer-Encoding: chunked\r\n");
    else if (length != SIZE_MAX)
    {
        strbuf_puts(o, "Content-Length: ");
        strbuf_put_u64(o, length);
        strbuf_puts(o, "\r\n");
    }
    if (!c->keep_alive)
        strbuf_puts(o, "Connection: close\r\n");
    else if (c->http10)
        strbuf_puts(o, "Connection: keep-alive\r\n");
    strbuf_puts(o, "\r\n");
    c->head_sent = true;
}

/* Move the prepared answer / new stream data of the current request into the output. */
static void hc_fill(struct hconn *c)
{
    struct httpd_req *req = c->req;
    struct httpd *h = c->n->h;
    if (!req || !req->answered || c->resp_done)
        return;
    if (req->resp_close || h->stopping)
        c->keep_alive = false;
    if (!req->streaming) {
        /* 1xx, 204 and 304 have no body and must not announce one */
        bool bodiless = req->status < 200 || req->status == 204 || req->status == 304;
        put_head(c, req, false, bodiless ? SIZE_MAX : req->resp_len);
        if (!req->is_head && !bodiless && req->resp_len > 0) {
            c->tail = req->resp_body;
            c->tail_len = req->resp_len;
            c->tail_off = 0;
        }
        c->resp_done = true;
        return;
    }
    if (req->stream_abort)
        return; /* hc_step closes the connection */
    size_t pending = req->sbuf.len - req->soff;
    const char *data = req->sbuf.buf ? req->sbuf.buf + req->soff : "";
    if (!c->head_sent && req->stream_ended) {
        /* Ended before anything was sent: one answer with a length, in one write. */
        put_head(c, req, false, pending);
        if (!req->is_head)
            strbuf_append(&c->out, data, pending);
        strbuf_reset(&req->sbuf);
        req->soff = 0;
        c->resp_done = true;
        return;
    }
    /* HTTP/1.0 has no chunked encoding: the body ends when the connection does. */
    bool chunked = !c->http10;
    if (c->http10)
        c->keep_alive = false;
    if (!c->head_sent)
        put_head(c, req, chunked && !req->is_head, SIZE_MAX);
    if (pending > 0 && !req->is_head) {
        if (chunked) {
            strbuf_appendf(&c->out, "%zx\r\n", pending);
            strbuf_append(&c->out, data, pending);
            strbuf_puts(&c->out, "\r\n");
        } else {
            strbuf_append(&c->out, data, pending);
        }
    }
    strbuf_reset(&req->sbuf);
    req->soff = 0;
    if (req->stream_ended) {
        if (chunked && !req->is_head)
            strbuf_puts(&c->out, "0\r\n\r\n");
        c->resp_done = true;
    }
}

/* An answer made before any request object exists (malformed head). */
static void hc_error(struct hconn *c, int status, const char *detail)
{
    const char *reason = httpd_status_text(status);
    char body[256];
    int bl = httpd_error_json(c->n->h, status, detail, body, sizeof(body));
    strbuf_appendf(&c->out, "HTTP/1.1 %d %s", status, reason);
    strbuf_append(&c->out, date_line(c->n), DATE_LINE_LEN);
    strbuf_appendf(&c->out,
                   "Content-Type: application/json\r\nContent-Length: %d\r\n"
                   "Connection: close\r\n\r\n%s",
                   bl, body);
    c->close_after = true;
    c->keep_alive = false;
    log_debug("http_bad_request", LF_STR("server", c->n->h->name), LF_INT("status", status),
              LF_STR("peer", c->peer));
}

/* ---- input ---------------------------------------------------------------------------------- */

/* Read into buf: >0 bytes, 0 = nothing before the next event, -1 = the peer's end
 * (EOF, or a TLS peer that closed without close_notify), -2 = an error (a TLS
 * protocol failure is logged: a bad record, a truncated one, a refused renegotiation). */
static ssize_t hc_recv(struct hconn *c, char *buf, size_t cap)
{
    if (cap == 0 || !conn_read_ready(&c->c))
        return 0;
    ssize_t r = conn_read(&c->c, buf, cap);
    if (r > 0) {
        c->last_io = reactor_now(c->n->h->r);
        return r;
    }
    if (r == -EAGAIN)
        return 0;
    if (r == 0)
        return -1;
    if (r == -ECONNABORTED) {
        /* Harmless between requests (many clients skip close_notify); a request cut
         * short this way may have been truncated by an attacker. */
        bool mid = c->req || c->rlen > 0;
        log_at(mid ? LOG_INFO : LOG_DEBUG, "tls_closed_without_close_notify",
               LF_STR("server", c->n->h->name), LF_STR("peer", c->peer),
               LF_BOOL("mid_request", mid));
        return -1;
    }
    if (conn_is_tls(&c->c) && r != -ECONNRESET)
        log_warn("tls_read_failed", LF_STR("server", c->n->h->name), LF_STR("peer", c->peer),
                 LF_STR("error", conn_error(&c->c)));
    return -2;
}

static void rbuf_consume(struct hconn *c, size_t n)
{
    if (n >= c->rlen) {
        c->rlen = 0;
        return;
    }
    memmove(c->rbuf, c->rbuf + n, c->rlen - n);
    c->rlen -= n;
}

/* n bytes of the request being read arrived (the first ones start its clock). */
static void read_progress(struct hconn *c, size_t n)
{
    rate_progress(c, &c->read_deadline, n);
}

static void start_app(struct hconn *c)
{
    c->read_deadline = 0; /* the request is read; the handler takes its own time */
    c->state = C_APP;
    httpd_req_dispatch(c->req);
}

static void send_continue(struct hconn *c)
{
    strbuf_puts(&c->out, "HTTP/1.1 100 Continue\r\n\r\n");
}

/* An absolute-form target's authority takes the place of Host (RFC 9112 §3.2.2: a
 * received Host is ignored), so handlers asking for "Host" see what the client aimed
 * at. The request was sized for one more header and the authority's bytes. */
static void set_authority(struct httpd_req *req, const struct http1_request *hd, char *a,
                          size_t *off)
{
    char *v = a + *off;
    memcpy(v, hd->host, hd->host_len);
    v[hd->host_len] = '\0';
    *off += hd->host_len + 1;
    for (size_t i = 0; i < req->nhdrs; i++) {
        if (strcasecmp(req->hdrs[i].name, "Host") == 0) {
            req->hdrs[i].value = v;
            return;
        }
    }
    char *nm = a + *off;
    memcpy(nm, "Host", 5);
    *off += 5;
    req->hdrs[req->nhdrs++] = (struct httpd_kv){nm, v};
}

/* A complete head of head_len bytes is at the front of rbuf: build the request. */
static int start_request(struct hconn *c, const struct http1_request *hd, size_t head_len)
{
    struct httpd *h = c->n->h;
    const char *qmark = memchr(hd->target, '?', hd->target_len);
    size_t path_len = qmark ? (size_t)(qmark - hd->target) : hd->target_len;
    const char *qs = qmark ? qmark + 1 : NULL;
    size_t qs_len = qmark ? hd->target_len - path_len - 1 : 0;
    size_t nq = httpd_query_count(qs, qs_len);
    size_t arena = head_len + 2 * hd->nfields + 2 * nq + 16;
    /* absolute-form: room for a "Host" entry carrying the authority, and for the "/"
     * of an empty path */
    size_t nh = hd->nfields + (hd->absolute_form ? 1 : 0);
    if (hd->absolute_form)
        arena += hd->host_len + 16;
    struct httpd_req *req = httpd_req_new(h, c, nh, nq, arena);
    char *a = req->arena;
    size_t off = 0;
    memcpy(a, hd->method, hd->method_len);
    a[hd->method_len] = '\0';
    req->method = a;
    off += hd->method_len + 1;
    int pl = path_len ? http1_url_decode(a + off, hd->target, path_len, false)
                      : http1_url_decode(a + off, "/", 1, false); /* "http://h?q" */
    if (pl < 0) {
        httpd_req_finish(req, true);
        hc_error(c, 400, "Bad Request");
        return -EINVAL;
    }
    req->path = a + off;
    off += (size_t)pl + 1;
    if (qs)
        httpd_req_parse_query(req, qs, qs_len, &off);
    for (size_t i = 0; i < hd->nfields; i++) {
        const struct http1_field *v = &hd->fields[i];
        char *nm = a + off;
        memcpy(nm, v->name, v->name_len);
        nm[v->name_len] = '\0';
        off += v->name_len + 1;
        char *val = a + off;
        memcpy(val, v->value, v->value_len);
        val[v->value_len] = '\0';
        off += v->value_len + 1;
        req->hdrs[i] = (struct httpd_kv){nm, val};
    }
    req->nhdrs = hd->nfields;
    if (hd->absolute_form)
        set_authority(req, hd, a, &off);
    memcpy(req->peer, c->peer, sizeof(req->peer));
    req->is_head = strcmp(req->method, "HEAD") == 0;
    c->req = req;
    c->http10 = hd->minor == 0;
    c->keep_alive = hd->keep_alive && !h->stopping;
    c->head_sent = c->resp_done = false;
    c->chunked = hd->chunked;
    c->discarded = 0;
    http1_chunked_init(&c->ch, HTTP1_CHUNKED_STRICT);
    rbuf_consume(c, head_len);

    if (hd->chunked) {
        c->body_left = 0;
        c->body_cap = 0;
        c->state = C_BODY;
        if (hd->expect_continue && !c->http10 && c->rlen == 0)
            send_continue(c);
        return 0;
    }
    uint64_t cl = hd->has_length ? hd->content_length : 0;
    if (cl == 0) {
        start_app(c);
        return 0;
    }
    if (cl > h->max_body) {
        req->too_large = true;
        /* A small excess is read and dropped, so a client that sends its whole body
         * before reading (most do) still sees a clean 413; a client that waits for
         * "100 Continue", or a huge body, is refused without reading it. */
        if (hd->expect_continue || cl - h->max_body > HTTPD_DISCARD_MAX) {
            c->keep_alive = false;
            c->close_after = true;
            start_app(c);
            return 0;
        }
        c->body_left = cl;
        c->state = C_DISCARD;
        return 0;
    }
    size_t first = (size_t)MOTOR_MIN(cl, (uint64_t)NATIVE_BODY_FIRST);
    req->body = xmalloc(first + 1);
    req->body[0] = '\0';
    c->body_cap = first + 1;
    c->body_left = cl;
    c->state = C_BODY;
    if (hd->expect_continue && !c->http10 && c->rlen == 0)
        send_continue(c);
    return 0;
}

enum step { STEP_AGAIN, STEP_WAIT, STEP_CLOSED };

static enum step step_head(struct hconn *c)
{
    if (c->rlen > 0 && !c->read_deadline)
        read_progress(c, c->rlen); /* a pipelined head: its time starts now */
    if (c->rlen > 0) {
        struct http1_request hd;
        int rc = http1_parse_request(c->rbuf, c->rlen, &hd);
        if (rc > 0) {
            (void)start_request(c, &hd, (size_t)rc); /* on error it queued the 400 */
            return STEP_AGAIN;
        }
        if (rc < 0) {
            if (!c->n->h->tls && (unsigned char)c->rbuf[0] == 0x16) {
                /* A TLS record (handshake) where a request line should be: a client
                 * configured for https. An HTTP answer would only puzzle it. */
                log_warn("http_tls_on_plain_port", LF_STR("server", c->n->h->name),
                         LF_STR("peer", c->peer));
                hc_close(c, false);
                return STEP_CLOSED;
            }
            if (rc == -EMSGSIZE)
                hc_error(c, 431, "Request Header Fields Too Large");
            else if (rc == -ENAMETOOLONG)
                hc_error(c, 414, "URI Too Long");
            else if (rc == -ENOTSUP)
                hc_error(c, 501, "Not Implemented");
            else if (rc == -EPROTONOSUPPORT)
                hc_error(c, 505, "HTTP Version Not Supported");
            else
                hc_error(c, 400, "Bad Request");
            return STEP_AGAIN;
        }
    }
    if (c->n->h->stopping) {
        hc_close(c, true);
        return STEP_CLOSED;
    }
    ssize_t r = hc_recv(c, c->rbuf + c->rlen, HTTP1_REQUEST_HEAD_MAX - c->rlen);
    if (r > 0) {
        c->rlen += (size_t)r;
        read_progress(c, (size_t)r);
        return STEP_AGAIN;
    }
    if (r < 0) {
        hc_close(c, true); /* EOF between requests (or mid-head): just close */
        return STEP_CLOSED;
    }
    return STEP_WAIT;
}

/* The oversize or malformed body is over: 413 (keep-alive unless told otherwise). */
static enum step body_too_large(struct hconn *c, bool close_conn)
{
    struct httpd_req *req = c->req;
    req->too_large = true;
    free(req->body);
    req->body = NULL;
    req->body_len = 0;
    if (close_conn) {
        c->keep_alive = false;
        c->close_after = true;
    }
    start_app(c);
    return STEP_AGAIN;
}

static enum step step_chunked(struct hconn *c)
{
    struct httpd *h = c->n->h;
    struct httpd_req *req = c->req;
    for (;;) {
        if (c->rlen > 0) {
            size_t used = 0, out = 0;
            int rc = http1_chunked_decode(&c->ch, c->rbuf, c->rlen, &used, &out);
            if (rc < 0) {
                c->keep_alive = false;
                c->close_after = true;
                httpd_req_finish(req, true);
                c->req = NULL;
                hc_error(c, 400, "Bad Request");
                c->state = C_HEAD;
                return STEP_AGAIN;
            }
            if (!req->too_large && req->body_len + out > h->max_body)
                req->too_large = true; /* keep decoding to find the end, dropping data */
            if (req->too_large) {
                c->discarded += out;
                free(req->body);
                req->body = NULL;
                req->body_len = 0;
            } else if (out > 0) {
                if (req->body_len + out + 1 > c->body_cap) {
                    size_t cap = c->body_cap ? c->body_cap : 4096;
                    while (cap < req->body_len + out + 1)
                        cap *= 2;
                    cap = MOTOR_MIN(cap, h->max_body + 1);
                    req->body = xrealloc(req->body, cap);
                    c->body_cap = cap;
                }
                memcpy(req->body + req->body_len, c->rbuf, out);
                req->body_len += out;
                req->body[req->body_len] = '\0';
            }
            rbuf_consume(c, used);
            if (rc == 1)
                return req->too_large ? body_too_large(c, false) : (start_app(c), STEP_AGAIN);
            if (c->discarded > HTTPD_DISCARD_MAX)
                return body_too_large(c, true);
        }
        ssize_t r = hc_recv(c, c->rbuf + c->rlen, HTTP1_REQUEST_HEAD_MAX - c->rlen);
        if (r > 0) {
            c->rlen += (size_t)r;
            read_progress(c, (size_t)r);
            continue;
        }
        if (r < 0) {
            hc_close(c, false);
            return STEP_CLOSED;
        }
        return STEP_WAIT;
    }
}


/* Room for `more` body bytes (plus the NUL) in a Content-Length body. */
static void body_reserve(struct hconn *c, struct httpd_req *req, size_t more)
{
    size_t need = req->body_len + more + 1;
    if (need <= c->body_cap)
        return;
    size_t total = req->body_len + (size_t)c->body_left + 1; /* the announced length */
    size_t cap = c->body_cap * 2;
    if (cap < need)
        cap = need;
    if (cap > total)
        cap = total;
    req->body = xrealloc(req->body, cap);
    c->body_cap = cap;
}

static enum step step_body(struct hconn *c)
{
    if (c->n->h->stopping) { /* a partial upload at shutdown: drop it */
        hc_close(c, false);
        return STEP_CLOSED;
    }
    if (c->chunked)
        return step_chunked(c);
    struct httpd_req *req = c->req;
    bool discard = c->state == C_DISCARD;
    for (;;) {
        if (c->rlen > 0) {
            size_t n = (size_t)MOTOR_MIN((uint64_t)c->rlen, c->body_left);
            if (!discard) {
                body_reserve(c, req, n);
                memcpy(req->body + req->body_len, c->rbuf, n);
            }
            req->body_len += discard ? 0 : n;
            c->body_left -= n;
            rbuf_consume(c, n);
        }
        if (c->body_left == 0) {
            if (discard)
                return body_too_large(c, false);
            req->body[req->body_len] = '\0';
            start_app(c);
            return STEP_AGAIN;
        }
        ssize_t r;
        if (discard) {
            r = hc_recv(c, c->rbuf, HTTP1_REQUEST_HEAD_MAX);
            if (r > 0) {
                c->rlen = (size_t)r;
                read_progress(c, (size_t)r);
                continue;
            }
        } else {
            /* straight into the body: no copy through rbuf for big uploads */
            if (req->body_len + 1 >= c->body_cap)
                body_reserve(c, req, (size_t)MOTOR_MIN(c->body_left, (uint64_t)NATIVE_BODY_FIRST));
            size_t room = c->body_cap - 1 - req->body_len;
            r = hc_recv(c, req->body + req->body_len, (size_t)MOTOR_MIN((uint64_t)room, c->body_left));
            if (r > 0) {
                req->body_len += (size_t)r;
                c->body_left -= (size_t)r;
                read_progress(c, (size_t)r);
                continue;
            }
        }
        if (r < 0) {
            hc_close(c, false);
            return STEP_CLOSED;
        }
        return STEP_WAIT;
    }
}

static enum step step_linger(struct hconn *c)
{
    for (;;) {
        /* raw: what the client still sends (a TLS one's close_notify too) is dropped */
        ssize_t r = conn_discard(&c->c, HTTP1_REQUEST_HEAD_MAX);
        if (r == -EAGAIN)
            return STEP_WAIT;
        if (r > 0) {
            c->lingered += (size_t)r;
            if (c->lingered > NATIVE_LINGER_BYTES) {
                hc_close(c, true);
                return STEP_CLOSED;
            }
            continue;
        }
        if (r < 0) {
            hc_close(c, true);
            return STEP_CLOSED;
        }
        return STEP_WAIT;
    }
}

/* The answer is out and nothing else follows: close, letting the client read it. */
static enum step hc_done(struct hconn *c)
{
    if (c->n->h->stopping || c->peer_closed) {
        hc_close(c, true);
        return STEP_CLOSED;
    }
    /* Closing with unread input would send a reset that can destroy the answer in
     * flight; shut our side (after close_notify on TLS) and drain the client's
     * leftovers for a moment instead. */
    conn_shutdown(&c->c);
    c->state = C_LINGER;
    c->rlen = 0;
    c->last_io = reactor_now(c->n->h->r);
    return STEP_AGAIN;
}

/* A plain HTTP request on a TLS port: answer it in plain text, as nginx does, so the
 * operator sees why, then linger like any closing connection. */
static enum step plain_on_tls_port(struct hconn *c)
{
    static const char body[] = "{\"detail\":\"plain HTTP request sent to a TLS port\"}";
    char ans[256];
    int n = snprintf(ans, sizeof(ans),
                     "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     sizeof(body) - 1, body);
    (void)send(c->c.fd, ans, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT); /* best effort */
    (void)shutdown(c->c.fd, SHUT_WR);
    c->state = C_LINGER;
    c->last_io = reactor_now(c->n->h->r);
    return STEP_AGAIN;
}

static enum step step_handshake(struct hconn *c)
{
    struct httpd *h = c->n->h;
    if (h->stopping) {
        hc_close(c, false);
        return STEP_CLOSED;
    }
    if (!conn_handshake_ready(&c->c))
        return STEP_WAIT;
    int rc = conn_handshake(&c->c);
    if (rc == -EAGAIN)
        return STEP_WAIT;
    if (rc == 0) {
        c->state = C_HEAD;
        c->last_io = reactor_now(h->r); /* the idle clock starts again for the request */
        log_debug("tls_handshake_done", LF_STR("server", h->name), LF_STR("peer", c->peer),
                  LF_STR("version", conn_tls_version(&c->c)),
                  LF_STR("cipher", conn_tls_cipher(&c->c)), LF_BOOL("resumed", conn_tls_resumed(&c->c)));
        return STEP_AGAIN;
    }
    /* Logged once, here; the connection is closed and costs nothing more. */
    log_warn("tls_handshake_failed", LF_STR("server", h->name), LF_STR("peer", c->peer),
             LF_STR("error", conn_error(&c->c)));
    if (rc == -EBADMSG)
        return plain_on_tls_port(c);
    hc_close(c, false);
    return STEP_CLOSED;
}

static enum step hc_step(struct hconn *c)
{
    struct httpd_req *req = c->req;
    if (req && req->streaming && req->stream_abort) {
        hc_close(c, false);
        return STEP_CLOSED;
    }
    hc_fill(c);
    if (out_pending(c) > 0) {
        if (hc_flush(c) != 0) {
            if (c->req)
                c->req->client_gone = true;
            hc_close(c, false);
            return STEP_CLOSED;
        }
        if (out_pending(c) > 0) {
            /* still a chance to hear that the client left while we wait to write */
            if (c->peer_closed && c->req && c->req->streaming) {
                c->req->client_gone = true;
                hc_close(c, false);
                return STEP_CLOSED;
            }
            return STEP_WAIT;
        }
    }
    if (c->req && c->resp_done) {
        struct httpd_req *done = c->req;
        c->req = NULL;
        c->tail = NULL;
        c->tail_len = c->tail_off = 0;
        httpd_req_finish(done, true);
        if (!c->keep_alive)
            return hc_done(c);
        c->state = C_HEAD;
        return STEP_AGAIN;
    }
    if (!c->req && c->close_after && c->state != C_LINGER)
        return hc_done(c);
    switch (c->state) {
    case C_HANDSHAKE:
        return step_handshake(c);
    case C_HEAD:
        return step_head(c);
    case C_BODY:
    case C_DISCARD:
        return step_body(c);
    case C_LINGER:
        return step_linger(c);
    case C_APP:
        if (c->peer_closed) {
            c->req->client_gone = true;
            log_debug("http_client_gone", LF_STR("server", c->n->h->name),
                      LF_STR("path", c->req->path));
            hc_close(c, false);
            return STEP_CLOSED;
        }
        return STEP_WAIT;
    }
    return STEP_WAIT;
}

static void hc_run(struct hconn *c)
{
    if (c->in_run)
        return;
    c->in_run = true;
    for (;;) {
        enum step s = hc_step(c);
        if (s == STEP_CLOSED)
            return;
        if (s == STEP_WAIT)
            break;
    }
    c->in_run = false;
}

/* ---- interface to the core (httpd_core.h) ------------------------------------------------------- */

void httpd_native_kick(struct httpd_req *req)
{
    struct hconn *c = req->conn;
    if (!c || c->in_run)
        return; /* the running state machine picks it up */
    reactor_defer(c->n->h->r, &c->run);
}

size_t httpd_native_unsent(const struct httpd_req *req)
{
    const struct hconn *c = req->conn;
    return c && c->req == req ? out_pending(c) : 0;
}

static void on_sweep(struct reactor *r, void *arg)
{
    struct native *n = arg;
    int64_t now = reactor_now(r);
    int64_t idle = (int64_t)n->h->idle_timeout_s * 1000;
    struct list_head *pos, *tmp;
    list_for_each_safe(pos, tmp, &n->conns) {
        struct hconn *c = list_entry(pos, struct hconn, link);
        int64_t quiet = now - c->last_io;
        bool waiting_app = c->state == C_APP && out_pending(c) == 0;
        bool reading = (c->state == C_HEAD && c->rlen > 0) || c->state == C_BODY ||
                       c->state == C_DISCARD;
        bool too_slow = reading && c->read_deadline && now > c->read_deadline;
        bool slow_reader = c->write_deadline && now > c->write_deadline && out_pending(c) > 0;
        if (slow_reader) /* its request ends with client_gone: the producer stops */
            log_debug("http_slow_reader", LF_STR("server", n->h->name), LF_STR("peer", c->peer),
                      LF_INT("unsent", out_pending(c)));
        if (c->state == C_LINGER ? quiet > NATIVE_LINGER_MS
                                 : too_slow || slow_reader || (!waiting_app && quiet > idle)) {
            if (c->state == C_HANDSHAKE) /* a handshake that stalls (slowloris over TLS) */
                log_info("tls_handshake_timeout", LF_STR("server", n->h->name),
                         LF_STR("peer", c->peer), LF_INT("after_ms", quiet));
            hc_close(c, c->state == C_LINGER || !c->req);
        }
    }
}

static void close_listener(struct native *n)
{
    if (n->lfd >= 0) {
        reactor_del_fd(n->h->r, n->lfd);
        close(n->lfd);
        n->lfd = -1;
    }
}

void httpd_native_shutdown(struct httpd *h)
{
    struct native *n = h->native;
    if (!n)
        return;
    close_listener(n);
    reactor_defer_cancel(h->r, &n->accept_more);
    reactor_timer_stop(h->r, &n->sweep);
    reactor_timer_stop(h->r, &n->rearm);
    /* Answer what is pending, end streams, close idle and half-read connections. */
    struct list_head *pos, *tmp;
    list_for_each_safe(pos, tmp, &n->conns) {
        struct hconn *c = list_entry(pos, struct hconn, link);
        c->keep_alive = false;
        struct httpd_req *req = c->req;
        if (!req || !req->handled) {
            if (out_pending(c) == 0) {
                hc_close(c, false);
                continue;
            }
        } else if (!req->answered) {
            httpd_req_shutdown_answer(req);
        } else if (req->streaming && !req->stream_ended) {
            httpd_stream_end(req, false);
        }
        conn_on_events(&c->c, EPOLLOUT);
        hc_run(c); /* may close c (the safe walk allows it) */
    }
    int64_t deadline = util_mono_ms() + HTTPD_SHUTDOWN_FLUSH_MS;
    while (!list_empty(&n->conns)) {
        int64_t left = deadline - util_mono_ms();
        if (left <= 0)
            break;
        struct pollfd pf[64];
        struct hconn *pc[64];
        nfds_t k = 0;
        list_for_each(pos, &n->conns) {
            if (k == 64)
                break;
            struct hconn *c = list_entry(pos, struct hconn, link);
            pf[k] = (struct pollfd){.fd = c->c.fd, .events = POLLOUT | POLLIN};
            pc[k++] = c;
        }
        if (poll(pf, k, (int)MOTOR_MIN(left, 50)) < 0 && errno != EINTR)
            break;
        for (nfds_t i = 0; i < k; i++) {
            if (!pf[i].revents)
                continue;
            struct hconn *c = pc[i];
            if (pf[i].revents & (POLLERR | POLLHUP)) {
                hc_close(c, c->state == C_LINGER);
                continue;
            }
            conn_on_events(&c->c, ((pf[i].revents & POLLOUT) ? EPOLLOUT : 0) |
                                      ((pf[i].revents & POLLIN) ? EPOLLIN : 0));
            hc_run(c);
        }
    }
    while (!list_empty(&n->conns)) /* a client that never read its answer */
        hc_close(list_entry(list_first(&n->conns), struct hconn, link), false);
    free(n);
    h->native = NULL;
}

int httpd_native_start(struct httpd *h, const struct sockaddr *sa, socklen_t salen, bool reuse_port)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1, zero = 0;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (sa->sa_family == AF_INET6) {
        /* "::" means every address, IPv4 included (as uvicorn does on Linux). */
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        int v6only = IN6_IS_ADDR_UNSPECIFIED(a) ? zero : one;
        (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    if (bind(fd, sa, salen) != 0 || listen(fd, 511) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct sockaddr_storage bound;
    socklen_t bl = sizeof(bound);
    if (getsockname(fd, (struct sockaddr *)&bound, &bl) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    h->port = ntohs(bound.ss_family == AF_INET6
                        ? ((struct sockaddr_in6 *)&bound)->sin6_port
                        : ((struct sockaddr_in *)&bound)->sin_port);
    struct native *n = xcalloc(1, sizeof(*n));
    n->h = h;
    n->lfd = fd;
    list_init(&n->conns);
    reactor_deferred_init(&n->accept_more, on_accept_more, n);
    reactor_timer_init(&n->rearm, on_rearm, n);
    int rc = reactor_add_fd(h->r, fd, EPOLLIN, on_listen, n);
    if (rc != 0) {
        close(fd);
        free(n);
        return rc;
    }
    reactor_timer_init(&n->sweep, on_sweep, n);
    reactor_timer_start(h->r, &n->sweep, NATIVE_SWEEP_MS, NATIVE_SWEEP_MS);
    h->native = n;
    return 0;
}
