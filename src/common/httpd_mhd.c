/* httpd_mhd — TLS listeners: libmicrohttpd in external-epoll mode on a reactor.
 *
 * Only TLS listeners use it, and libmicrohttpd and GnuTLS are loaded through dynlib the
 * first time one starts: a process without a TLS listener never maps them (with
 * GnuTLS's chain they cost ~3 MiB RSS). <microhttpd.h> and <gnutls/gnutls.h> are
 * included for types only; every call goes through the tables below.
 *
 * Lifecycle of one request (the core's struct httpd_req is MHD's per-request
 * "req_cls"):
 *   call 1 of the access handler   create the req (no response yet: queueing a response
 *                                  on the first call makes MHD close the connection),
 *                                  except an announced oversize body => 413 at once;
 *   calls with upload data         append to the capped body;
 *   final call (no upload data)    dispatch once; if the handler answered, queue that
 *                                  response; otherwise suspend;
 *   resume (answer/stream data)    MHD calls the handler again and we queue then;
 *   completion callback            httpd_req_finish — the only place a req ends,
 *                                  because MHD may reference it until then.
 *
 * While a connection is suspended MHD does not see the client go away, so we watch its
 * socket for EPOLLRDHUP ourselves and resume it to let MHD tear it down. */
#include "common/dynlib.h"
#include "common/httpd_core.h"
#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <limits.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MHD_STREAM_BLOCK (16u * 1024)        /* MHD's read size for stream responses */
#define HTTPD_TLS_FILE_MAX ((size_t)1 << 20) /* PEM files */

/* ---- the libraries ----------------------------------------------------------------------- */

static struct {
    __typeof__(&MHD_start_daemon) start_daemon;
    __typeof__(&MHD_stop_daemon) stop_daemon;
    __typeof__(&MHD_quiesce_daemon) quiesce_daemon;
    __typeof__(&MHD_run) run;
    __typeof__(&MHD_get_timeout) get_timeout;
    __typeof__(&MHD_get_daemon_info) get_daemon_info;
    __typeof__(&MHD_get_connection_info) get_connection_info;
    __typeof__(&MHD_get_connection_values) get_connection_values;
    __typeof__(&MHD_lookup_connection_value) lookup_connection_value;
    __typeof__(&MHD_suspend_connection) suspend_connection;
    __typeof__(&MHD_resume_connection) resume_connection;
    __typeof__(&MHD_create_response_from_buffer_with_free_callback) response_from_buffer;
    __typeof__(&MHD_create_response_from_callback) response_from_callback;
    __typeof__(&MHD_add_response_header) add_response_header;
    __typeof__(&MHD_queue_response) queue_response;
    __typeof__(&MHD_destroy_response) destroy_response;
} mhd;

static const char *const mhd_symbols[] = {
    "MHD_start_daemon",
    "MHD_stop_daemon",
    "MHD_quiesce_daemon",
    "MHD_run",
    "MHD_get_timeout",
    "MHD_get_daemon_info",
    "MHD_get_connection_info",
    "MHD_get_connection_values",
    "MHD_lookup_connection_value",
    "MHD_suspend_connection",
    "MHD_resume_connection",
    "MHD_create_response_from_buffer_with_free_callback",
    "MHD_create_response_from_callback",
    "MHD_add_response_header",
    "MHD_queue_response",
    "MHD_destroy_response",
};
static const char *const mhd_sonames[] = {"libmicrohttpd.so.12", "libmicrohttpd.so", NULL};
static struct dynlib mhd_lib = DYNLIB_INIT("libmicrohttpd", mhd_sonames, mhd_symbols, &mhd);

static struct {
    __typeof__(&gnutls_certificate_get_peers) certificate_get_peers;
    __typeof__(&gnutls_certificate_verify_peers2) certificate_verify_peers2;
} gtls;

static const char *const gtls_symbols[] = {
    "gnutls_certificate_get_peers",
    "gnutls_certificate_verify_peers2",
};
static const char *const gtls_sonames[] = {"libgnutls.so.30", "libgnutls.so", NULL};
static struct dynlib gtls_lib = DYNLIB_INIT("GnuTLS", gtls_sonames, gtls_symbols, &gtls);

/* ---- state ---------------------------------------------------------------------------------- */

struct mhd_srv {
    struct httpd *h;
    struct MHD_Daemon *d;
    int epfd;
    struct reactor_timer timer;   /* MHD's own timeout (idle connections) */
    struct reactor_deferred kick; /* run MHD at the end of this loop pass */
    bool in_run;                  /* inside MHD_run: resumes just ask for another run */
    bool kick_pending;            /* a resume inside MHD_run asked for another run */
    bool verify_client;
};

/* Per TCP connection (MHD's socket_context). */
struct mhd_conn {
    struct mhd_srv *m;
    int fd;                      /* watched for RDHUP; -1 if the watch failed */
    struct httpd_req *req;       /* its current request, if any */
    bool peer_closed;            /* FIN/RST seen */
    struct reactor_deferred hup; /* suspended after the FIN was seen: resume it */
};

/* ---- driving MHD from the reactor ----------------------------------------------------------- */

/* After MHD_run: true when MHD wants to run again at once (a resume asked for it, or
 * timeout 0); otherwise MHD's timeout (idle connections) arms the timer. */
static bool rearm(struct mhd_srv *m)
{
    if (!m->d)
        return false;
    MHD_UNSIGNED_LONG_LONG to = 0;
    bool has_to = mhd.get_timeout(m->d, &to) == MHD_YES;
    if (m->kick_pending || (has_to && to == 0)) {
        m->kick_pending = false;
        return true;
    }
    if (has_to)
        reactor_timer_start(m->h->r, &m->timer, to > INT32_MAX ? INT32_MAX : (int64_t)to, 0);
    else
        reactor_timer_stop(m->h->r, &m->timer);
    return false;
}

static void pump(struct mhd_srv *m)
{
    if (m->in_run) {
        m->kick_pending = true;
        return;
    }
    reactor_defer_cancel(m->h->r, &m->kick);
    m->in_run = true;
    mhd.run(m->d);
    m->in_run = false;
    if (rearm(m))
        reactor_defer(m->h->r, &m->kick);
}

static void on_epoll_ready(struct reactor *r, int fd, uint32_t events, void *arg)
{
    pump(arg);
}

static void on_timer(struct reactor *r, void *arg)
{
    pump(arg);
}

static void on_kick(struct reactor *r, void *arg)
{
    pump(arg);
}

/* ---- suspend / resume ------------------------------------------------------------------------ */

static void suspend_req(struct httpd_req *req)
{
    struct mhd_conn *hc = req->mhd_hc;
    mhd.suspend_connection(req->conn);
    req->mhd_suspended = true;
    /* The edge came before this suspension: act on it now (after MHD_run). */
    if (hc && hc->peer_closed)
        reactor_defer(req->h->r, &hc->hup);
}

static void resume_req(struct httpd_req *req)
{
    struct mhd_srv *m = req->h->tp_state;
    if (!req->mhd_suspended)
        return;
    req->mhd_suspended = false;
    mhd.resume_connection(req->conn);
    if (m->in_run)
        m->kick_pending = true;
    else
        reactor_defer(req->h->r, &m->kick);
}

static void conn_gone(struct mhd_conn *hc)
{
    hc->peer_closed = true;
    struct httpd_req *req = hc->req;
    if (!req || !req->mhd_suspended)
        return; /* MHD sees the EOF itself when it next reads */
    req->client_gone = true;
    log_debug("http_client_gone", LF_STR("server", req->h->name), LF_STR("path", req->path));
    resume_req(req);
}

static void on_peer_hup(struct reactor *r, int fd, uint32_t events, void *arg)
{
    conn_gone(arg);
}

static void on_hup_deferred(struct reactor *r, void *arg)
{
    conn_gone(arg);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct mhd_srv *m = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct mhd_conn *hc = xcalloc(1, sizeof(*hc));
        hc->m = m;
        hc->fd = -1;
        reactor_deferred_init(&hc->hup, on_hup_deferred, hc);
        const union MHD_ConnectionInfo *ci =
            mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci && ci->connect_fd >= 0) {
            int rc = reactor_add_fd(m->h->r, ci->connect_fd, EPOLLRDHUP | EPOLLET, on_peer_hup, hc);
            if (rc == 0)
                hc->fd = ci->connect_fd;
            else
                log_warn("httpd_watch_failed", LF_STR("server", m->h->name),
                         LF_INT("fd", ci->connect_fd), LF_INT("errno", -rc));
        }
        *socket_context = hc;
        return;
    }
    /* MHD_CONNECTION_NOTIFY_CLOSED: the socket is still open (MHD closes it next). */
    struct mhd_conn *hc = *socket_context;
    if (!hc)
        return;
    *socket_context = NULL;
    if (hc->fd >= 0)
        reactor_del_fd(m->h->r, hc->fd);
    reactor_defer_cancel(m->h->r, &hc->hup);
    if (hc->req) /* MHD completes requests before closing; just in case */
        hc->req->mhd_hc = NULL;
    free(hc);
}

/* ---- requests -------------------------------------------------------------------------------- */

struct kv_copy {
    struct httpd_req *req; /* NULL: only measure */
    size_t n, bytes, off;
    bool query;
};

static enum MHD_Result kv_iter(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value)
{
    struct kv_copy *k = cls;
    if (!key)
        return MHD_YES;
    size_t kl = strlen(key) + 1, vl = value ? strlen(value) + 1 : 0;
    if (!k->req) {
        k->n++;
        k->bytes += kl + vl;
        return MHD_YES;
    }
    char *a = k->req->arena + k->off;
    memcpy(a, key, kl);
    char *v = NULL;
    if (value) {
        v = a + kl;
        memcpy(v, value, vl);
    }
    k->off += kl + vl;
    struct httpd_kv *dst = k->query ? &k->req->query[k->req->nquery++]
                                    : &k->req->hdrs[k->req->nhdrs++];
    *dst = (struct httpd_kv){a, v};
    return MHD_YES;
}

static void peer_to_text(struct MHD_Connection *conn, char *out, size_t cap)
{
    out[0] = '\0';
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)cap);
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a))
            inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, a, out, (socklen_t)cap);
    }
}

static struct httpd_req *req_new(struct mhd_srv *m, struct MHD_Connection *conn, const char *url,
                                 const char *method)
{
    struct kv_copy hk = {0}, qk = {.query = true};
    mhd.get_connection_values(conn, MHD_HEADER_KIND, kv_iter, &hk);
    mhd.get_connection_values(conn, MHD_GET_ARGUMENT_KIND, kv_iter, &qk);
    method = method ? method : "";
    url = url ? url : "/";
    size_t ml = strlen(method) + 1, ul = strlen(url) + 1;
    struct httpd_req *req = httpd_req_new(m->h, conn, hk.n, qk.n, hk.bytes + qk.bytes + ml + ul);
    memcpy(req->arena, method, ml);
    memcpy(req->arena + ml, url, ul);
    req->method = req->arena;
    req->path = req->arena + ml;
    hk.req = qk.req = req;
    hk.off = ml + ul;
    hk.n = 0;
    mhd.get_connection_values(conn, MHD_HEADER_KIND, kv_iter, &hk);
    qk.off = hk.off;
    mhd.get_connection_values(conn, MHD_GET_ARGUMENT_KIND, kv_iter, &qk);
    req->is_head = strcmp(method, "HEAD") == 0;
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct mhd_conn *hc = ci ? ci->socket_context : NULL;
    req->mhd_hc = hc;
    if (hc)
        hc->req = req;
    peer_to_text(conn, req->peer, sizeof(req->peer));
    return req;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct httpd_req *req = *req_cls;
    if (!req)
        return;
    *req_cls = NULL;
    struct mhd_conn *hc = req->mhd_hc;
    if (hc && hc->req == req)
        hc->req = NULL;
    req->mhd_hc = NULL;
    req->mhd_suspended = false;
    if (req->mhd_resp) {
        mhd.destroy_response(req->mhd_resp);
        req->mhd_resp = NULL;
    }
    httpd_req_finish(req, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK);
}

/* ---- building responses ------------------------------------------------------------------------ */

static void apply_headers(struct httpd_req *req, struct MHD_Response *resp)
{
    /* req->rhdrs holds "Name: value\r\n" lines (validated by httpd_add_header). */
    const char *p = req->rhdrs.buf;
    const char *end = p ? p + req->rhdrs.len : NULL;
    while (p && p < end) {
        const char *eol = memchr(p, '\r', (size_t)(end - p));
        const char *colon = memchr(p, ':', (size_t)(end - p));
        if (!eol || !colon || colon > eol)
            break;
        char *name = xstrndup(p, (size_t)(colon - p));
        const char *v = colon + 1;
        while (v < eol && *v == ' ')
            v++;
        char *value = xstrndup(v, (size_t)(eol - v));
        mhd.add_response_header(resp, name, value);
        free(name);
        free(value);
        p = eol + 2;
    }
    if (req->resp_close)
        mhd.add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

static size_t stream_pending(const struct httpd_req *req)
{
    return req->sbuf.len - req->soff;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct httpd_req *req = cls;
    if (req->client_gone || req->stream_abort)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t pending = stream_pending(req);
    if (pending > 0) {
        size_t n = MOTOR_MIN(pending, max);
        memcpy(buf, req->sbuf.buf + req->soff, n);
        req->soff += n;
        if (req->soff == req->sbuf.len) {
            strbuf_reset(&req->sbuf);
            req->soff = 0;
        } else if (req->soff >= HTTPD_STREAM_MAX) {
            strbuf_consume(&req->sbuf, req->soff);
            req->soff = 0;
        }
        return (ssize_t)n;
    }
    if (req->stream_ended)
        return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing to send yet: returning 0 without suspending would make MHD spin. */
    suspend_req(req);
    return 0;
}

/* Turn the core's prepared answer into an MHD response. A stream that already ended
 * goes out as one buffer response with a Content-Length. */
static struct MHD_Response *build_response(struct httpd_req *req)
{
    struct MHD_Response *resp = NULL;
    if (!req->streaming) {
        resp = mhd.response_from_buffer(req->resp_len, req->resp_body, free);
        if (resp)
            req->resp_body = NULL; /* MHD owns it now */
    } else if (req->stream_ended && !req->stream_abort && !req->client_gone) {
        size_t n = stream_pending(req);
        char *body = xmalloc(n + 1);
        if (n)
            memcpy(body, req->sbuf.buf + req->soff, n);
        body[n] = '\0';
        resp = mhd.response_from_buffer(n, body, free);
        if (!resp)
            free(body);
        strbuf_reset(&req->sbuf);
        req->soff = 0;
    } else {
        resp = mhd.response_from_callback(MHD_SIZE_UNKNOWN, MHD_STREAM_BLOCK, stream_read, req,
                                          NULL);
    }
    if (!resp) {
        log_error("httpd_response_alloc_failed", LF_STR("server", req->h->name));
        return NULL;
    }
    apply_headers(req, resp);
    return resp;
}

static enum MHD_Result queue_answer(struct httpd_req *req)
{
    struct MHD_Response *resp = build_response(req);
    if (!resp)
        return MHD_NO;
    enum MHD_Result ok = mhd.queue_response(req->conn, (unsigned)req->status, resp);
    mhd.destroy_response(resp);
    req->mhd_queued = true;
    if (ok != MHD_YES)
        log_warn("httpd_queue_failed", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_INT("status", req->status));
    return ok;
}

/* ---- the access handler -------------------------------------------------------------------------- */

/* With a client CA configured, MHD only *requests* a certificate; verify it here. */
static bool client_cert_ok(struct httpd_req *req)
{
    const union MHD_ConnectionInfo *ci =
        mhd.get_connection_info(req->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!ci || !ci->tls_session)
        return false;
    gnutls_session_t s = (gnutls_session_t)ci->tls_session;
    unsigned int n = 0;
    if (!gtls.certificate_get_peers(s, &n) || n == 0)
        return false;
    unsigned int status = 0;
    return gtls.certificate_verify_peers2(s, &status) == GNUTLS_E_SUCCESS && status == 0;
}

static void body_append(struct httpd_req *req, const char *data, size_t n)
{
    size_t max = req->h->max_body;
    if (req->too_large || req->body_len + n > max) {
        req->too_large = true;
        free(req->body);
        req->body = NULL;
        req->body_len = 0;
        req->mhd_discarded += n;
        return;
    }
    req->body = xrealloc(req->body, req->body_len + n + 1);
    memcpy(req->body + req->body_len, data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **req_cls)
{
    struct mhd_srv *m = cls;
    struct httpd *h = m->h;
    struct httpd_req *req = *req_cls;

    if (!req) {
        req = req_new(m, conn, url, method);
        *req_cls = req;
        if (m->verify_client && !client_cert_ok(req)) {
            req->handled = true;
            httpd_respond_error(req, 403, "client certificate required");
            return queue_answer(req);
        }
        const char *cl =
            mhd.lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        int64_t n = 0;
        if (cl && util_parse_i64(cl, 0, INT64_MAX, &n) == 0 && (uint64_t)n > h->max_body) {
            req->too_large = true;
            const char *expect =
                mhd.lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            if ((uint64_t)n - h->max_body > HTTPD_DISCARD_MAX || expect) {
                httpd_req_dispatch(req); /* 413 */
                return queue_answer(req);
            }
        }
        return MHD_YES;
    }

    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (req->mhd_queued)
            return MHD_YES; /* answered early: MHD discards the rest */
        body_append(req, upload_data, n);
        if (req->too_large && req->mhd_discarded > HTTPD_DISCARD_MAX)
            return MHD_NO;
        return MHD_YES;
    }

    /* The whole request has arrived (or we were resumed). */
    httpd_req_dispatch(req);
    if (req->mhd_queued)
        return MHD_YES;
    if (req->answered)
        return queue_answer(req);
    if (req->client_gone)
        return MHD_NO; /* nobody to answer: close the connection */
    if (h->stopping) {
        httpd_req_shutdown_answer(req);
        return queue_answer(req);
    }
    suspend_req(req);
    return MHD_YES;
}

/* ---- transport interface ---------------------------------------------------------------------------- */

static void mhd_kick(struct httpd_req *req)
{
    if (req->completed)
        return;
    resume_req(req);
}

static size_t mhd_unsent(const struct httpd_req *req)
{
    return 0; /* MHD reads straight from req->sbuf */
}

static bool any_unfinished(const struct httpd *h)
{
    for (const struct httpd_req *q = h->live; q; q = q->next)
        if (q->mhd_suspended || (q->answered && !q->mhd_queued) || (q->mhd_queued && !q->completed))
            return true;
    return false;
}

static void mhd_shutdown(struct httpd *h)
{
    struct mhd_srv *m = h->tp_state;
    if (!m)
        return;
    if (m->d) {
        MHD_socket ls = mhd.quiesce_daemon(m->d);
        if (ls != MHD_INVALID_SOCKET)
            close(ls);
        /* Nothing may stay suspended at MHD_stop_daemon (it aborts the process):
         * answer pending requests, end streams, then let MHD flush for a while. */
        for (struct httpd_req *q = h->live; q; q = q->next) {
            if (q->completed)
                continue;
            if (q->handled && !q->answered)
                httpd_req_shutdown_answer(q);
            if (q->streaming && !q->stream_ended)
                httpd_stream_end(q, false);
            resume_req(q);
        }
        int64_t deadline = util_mono_ms() + HTTPD_SHUTDOWN_FLUSH_MS;
        for (;;) {
            m->in_run = true;
            mhd.run(m->d);
            m->in_run = false;
            if (!any_unfinished(h))
                break;
            int64_t left = deadline - util_mono_ms();
            if (left <= 0)
                break;
            for (struct httpd_req *q = h->live; q; q = q->next)
                if (q->mhd_suspended) {
                    q->client_gone = true;
                    resume_req(q);
                }
            MHD_UNSIGNED_LONG_LONG to = 0;
            int wait = (int)MOTOR_MIN(left, 50);
            if (mhd.get_timeout(m->d, &to) == MHD_YES && (int64_t)to < wait)
                wait = (int)to;
            struct pollfd pfd = {.fd = m->epfd, .events = POLLIN};
            (void)poll(&pfd, 1, wait);
        }
        for (struct httpd_req *q = h->live; q; q = q->next)
            if (q->mhd_suspended) { /* last resort, still must not stop while suspended */
                q->client_gone = true;
                resume_req(q);
            }
        mhd.run(m->d);
        if (m->epfd >= 0)
            reactor_del_fd(h->r, m->epfd);
        reactor_timer_stop(h->r, &m->timer);
        reactor_defer_cancel(h->r, &m->kick);
        /* Remaining connections are closed; their on_close callbacks run in here. */
        mhd.stop_daemon(m->d);
        m->d = NULL;
    }
    reactor_timer_stop(h->r, &m->timer);
    reactor_defer_cancel(h->r, &m->kick);
    free(m);
    h->tp_state = NULL;
}

static const struct httpd_transport mhd_transport = {
    .kick = mhd_kick,
    .unsent = mhd_unsent,
    .shutdown = mhd_shutdown,
};

/* ---- start ------------------------------------------------------------------------------------------ */

static void mhd_logger(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    struct mhd_srv *m = cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t len = strlen(msg);
    while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        msg[--len] = '\0';
    /* Connections MHD drops (clients gone, streams we aborted) are routine. */
    bool routine = strncmp(msg, "Closing connection", 18) == 0 ||
                   strncmp(msg, "Application reported internal error", 35) == 0;
    enum log_level lvl = routine ? LOG_DEBUG : LOG_WARN;
    log_at(lvl, "httpd_mhd", LF_STR("server", m ? m->h->name : NULL), LF_STR("msg", msg));
}

static char *read_pem(const char *name, const char *what, const char *path)
{
    char *s = util_read_file(path, HTTPD_TLS_FILE_MAX, NULL);
    if (!s) {
        int e = errno;
        log_error("httpd_tls_file_unreadable", LF_STR("server", name), LF_STR("file", what),
                  LF_STR("path", path), LF_STR("error", strerror(e)));
        errno = e;
    }
    return s;
}

static void wipe_free(char *s)
{
    if (s)
        explicit_bzero(s, strlen(s));
    free(s);
}

int httpd_mhd_start(struct httpd *h, const struct httpd_config *cfg,
                    const struct sockaddr_storage *ss, bool v6)
{
    int rc = dynlib_load(&mhd_lib);
    if (rc == 0)
        rc = dynlib_load(&gtls_lib);
    if (rc != 0) {
        log_error("httpd_tls_unavailable", LF_STR("server", h->name),
                  LF_STR("error", dynlib_loaded(&mhd_lib) ? dynlib_error(&gtls_lib)
                                                          : dynlib_error(&mhd_lib)));
        return -ENOTSUP;
    }
    char *cert = read_pem(h->name, "certificate", cfg->tls_cert_file);
    char *key = cert ? read_pem(h->name, "key", cfg->tls_key_file) : NULL;
    char *ca = NULL;
    if (!cert || !key) {
        int e = errno ? errno : EINVAL;
        free(cert);
        wipe_free(key);
        return -e;
    }
    struct mhd_srv *m = xcalloc(1, sizeof(*m));
    m->h = h;
    m->epfd = -1;
    if (cfg->tls_ca_file && *cfg->tls_ca_file) {
        ca = read_pem(h->name, "client CA", cfg->tls_ca_file);
        if (!ca) {
            int e = errno ? errno : EINVAL;
            free(cert);
            wipe_free(key);
            free(m);
            return -e;
        }
        m->verify_client = true;
    }
    reactor_timer_init(&m->timer, on_timer, m);
    reactor_deferred_init(&m->kick, on_kick, m);

    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_TLS;
    if (v6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)ss)->sin6_addr;
        flags |= IN6_IS_ADDR_UNSPECIFIED(a) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    }
    struct MHD_OptionItem opts[16];
    size_t no = 0;
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, (void *)ss};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, h->idle_timeout_s, NULL};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT, h->max_connections, NULL};
    if (cfg->reuse_port)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, NULL};
    if (cfg->tls_key_password)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_KEY_PASSWORD, 0,
                                             (void *)cfg->tls_key_password};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, key};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, cert};
    if (ca)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, ca};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};

    errno = 0;
    m->d = mhd.start_daemon(flags, cfg->port, NULL, NULL, on_access, m, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_logger, m, MHD_OPTION_NOTIFY_COMPLETED, on_completed, m,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, m, MHD_OPTION_ARRAY,
                            opts, MHD_OPTION_END);
    int err = errno ? errno : EINVAL;
    /* MHD copied the key material into GnuTLS; wipe our copy of the key. */
    free(cert);
    wipe_free(key);
    free(ca);
    if (!m->d) {
        log_error("httpd_start_failed", LF_STR("server", h->name), LF_INT("port", cfg->port),
                  LF_BOOL("tls", true), LF_STR("error", strerror(err)));
        free(m);
        return -err;
    }
    h->tp = &mhd_transport;
    h->tp_state = m;
    const union MHD_DaemonInfo *di = mhd.get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    di = mhd.get_daemon_info(m->d, MHD_DAEMON_INFO_EPOLL_FD);
    rc = di && di->epoll_fd >= 0 ? reactor_add_fd(h->r, di->epoll_fd, EPOLLIN, on_epoll_ready, m)
                                 : -ENOTSUP;
    if (rc != 0) {
        mhd_shutdown(h);
        h->tp = NULL;
        return rc;
    }
    m->epfd = di->epoll_fd;
    if (rearm(m))
        reactor_defer(h->r, &m->kick);
    return 0;
}
