/* httpd — libmicrohttpd in external-epoll mode on a reactor.
 *
 * Lifecycle of one request (struct httpd_req, MHD's per-request "req_cls"):
 *   call 1 of the access handler   create the req (no response yet: queueing a response
 *                                  on the first call makes MHD close the connection),
 *                                  except an announced oversize body => 413 at once;
 *   calls with upload data         append to the capped body buffer;
 *   final call (no upload data)    dispatch to the route's handler once; if the handler
 *                                  answered, queue that response; otherwise suspend;
 *   resume (answer/stream data)    MHD calls the handler again and we queue then;
 *   completion callback            access log, on_close, free — the only place a req
 *                                  is freed, because MHD may reference it until then.
 *
 * While a connection is suspended MHD does not see the client go away, so we watch its
 * socket for EPOLLRDHUP ourselves and resume it to let MHD tear it down. The watch is
 * per connection (MHD's connection notifications), edge-triggered, and registered
 * once for the connection's life, not once per request: two epoll_ctl calls per proxied
 * request were a visible part of its cost. */
#include "common/httpd.h"

#include "common/httpd_internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gnutls/gnutls.h>
#include <limits.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HTTPD_DEFAULT_MAX_BODY (1u << 20)
#define HTTPD_STREAM_MAX ((size_t)8 << 20)   /* buffered stream bytes before abort */
#define HTTPD_STREAM_BLOCK (16u * 1024)      /* MHD's read size for stream responses */
#define HTTPD_TLS_FILE_MAX ((size_t)1 << 20) /* PEM files */
#define HTTPD_SHUTDOWN_FLUSH_MS 1000         /* time given to answers at httpd_free */
/* After an oversize upload we keep reading (and discarding) up to this much more so
 * the client can still read the 413; beyond it the connection is dropped. */
#define HTTPD_DISCARD_MAX ((size_t)16 << 20)

struct httpd {
    struct reactor *r;
    struct MHD_Daemon *d;
    int epfd;
    struct reactor_timer timer;  /* MHD's own timeout (idle connections) */
    struct reactor_deferred kick; /* run MHD at the end of this loop pass */
    bool in_run;                  /* inside MHD_run: resumes just ask for another run */
    bool kick_pending;            /* a resume inside MHD_run asked for another run */
    bool stopping; /* httpd_free in progress: no new suspensions */
    bool verify_client;
    uint16_t port;
    size_t max_body;
    char *name;
    char *api_key_header;
    char *api_key;
    char **quiet_paths;
    struct httpd_route_entry *routes;
    size_t nroutes, routes_cap;
    struct httpd_req *live; /* every req not yet completed (for shutdown) */
};

/* Per TCP connection (MHD's socket_context). */
struct httpd_conn {
    struct httpd *h;
    int fd;                      /* watched for RDHUP; -1 if the watch failed */
    struct httpd_req *req;       /* its current request, if any */
    bool peer_closed;            /* FIN/RST seen */
    struct reactor_deferred hup; /* suspended after the FIN was seen: resume it */
};

struct httpd_hdr {
    char *name;
    char *value;
};

struct httpd_req {
    struct httpd *h;
    struct MHD_Connection *conn;
    struct httpd_req *prev, *next;
    struct httpd_conn *hc; /* NULL if unknown or already closed */
    char *method;
    char *path;
    char peer[INET6_ADDRSTRLEN];
    int64_t start_ms;

    size_t nparams;
    char *param_names[HTTPD_MAX_PARAMS];
    char *param_values[HTTPD_MAX_PARAMS];

    struct strbuf body;
    size_t discarded; /* upload bytes dropped after the body overflowed */
    bool too_large;

    bool handled; /* the route's handler (or an error answer) ran */
    bool queued;  /* a response was handed to MHD */
    bool suspended;
    bool completed; /* MHD's completion callback is running */
    bool client_gone;

    struct MHD_Response *resp; /* built, not yet queued */
    unsigned status;
    struct httpd_hdr *hdrs;
    size_t nhdrs;

    bool streaming;
    bool stream_ended;
    bool stream_abort;
    char *stream_ctype;
    struct strbuf sbuf;
    size_t soff; /* bytes of sbuf already handed to MHD */

    httpd_close_cb on_close;
    void *on_close_arg;
};

/* ---- pure matching (httpd_internal.h) -------------------------------------------- */

static bool seg_is_param(const char *s, size_t len)
{
    return len >= 2 && s[0] == '{' && s[len - 1] == '}';
}

bool httpd_path_match(const char *pattern, const char *path, struct httpd_params *params)
{
    params->n = 0;
    if (!pattern || !path || pattern[0] != '/' || path[0] != '/')
        return false;
    const char *p = pattern, *u = path;
    for (;;) {
        /* p and u both point at a '/' */
        p++;
        u++;
        const char *pe = strchrnul(p, '/');
        const char *ue = strchrnul(u, '/');
        size_t pl = (size_t)(pe - p), ul = (size_t)(ue - u);
        if (seg_is_param(p, pl)) {
            if (ul == 0 || params->n >= HTTPD_MAX_PARAMS)
                return false;
            params->p[params->n++] = (struct httpd_param_view){
                .name = p + 1, .name_len = pl - 2, .value = u, .value_len = ul};
        } else if (pl != ul || memcmp(p, u, pl) != 0) {
            return false;
        }
        if (*pe == '\0' || *ue == '\0')
            return *pe == *ue;
        p = pe;
        u = ue;
    }
}

bool httpd_pattern_valid(const char *pattern)
{
    if (!pattern || pattern[0] != '/')
        return false;
    size_t nparams = 0;
    const char *p = pattern;
    while (*p) {
        p++; /* skip '/' */
        const char *pe = strchrnul(p, '/');
        size_t pl = (size_t)(pe - p);
        const char *open = memchr(p, '{', pl), *close = memchr(p, '}', pl);
        if (open || close) {
            /* a parameter must be a whole segment with a non-empty, brace-free name */
            if (!seg_is_param(p, pl) || pl < 3 || memchr(p + 1, '{', pl - 2) ||
                memchr(p + 1, '}', pl - 2))
                return false;
            if (++nparams > HTTPD_MAX_PARAMS)
                return false;
        }
        p = pe;
    }
    return true;
}

static bool method_matches(const char *route_method, const char *method)
{
    if (strcmp(route_method, method) == 0)
        return true;
    return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

static void allow_add(char *allow, size_t cap, const char *method)
{
    if (cap == 0)
        return;
    /* skip duplicates: search whole comma-separated tokens */
    size_t ml = strlen(method);
    const char *s = allow;
    while (*s) {
        while (*s == ',' || *s == ' ') /* separators; the text may end truncated */
            s++;
        const char *e = strchrnul(s, ',');
        if ((size_t)(e - s) == ml && memcmp(s, method, ml) == 0)
            return;
        s = e;
    }
    size_t len = strlen(allow);
    snprintf(allow + len, cap - len, "%s%s", len ? ", " : "", method);
}

enum httpd_match httpd_routes_find(const struct httpd_route_entry *routes, size_t n,
                                   const char *method, const char *path, size_t *idx,
                                   struct httpd_params *params, char *allow, size_t cap)
{
    bool path_seen = false;
    if (cap > 0)
        allow[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!httpd_path_match(routes[i].pattern, path, params))
            continue;
        if (method_matches(routes[i].method, method)) {
            *idx = i;
            return HTTPD_MATCH_FOUND;
        }
        path_seen = true;
    }
    if (!path_seen)
        return HTTPD_MATCH_NO_PATH;
    /* Second pass for the Allow header (only on the error path). */
    struct httpd_params scratch;
    for (size_t i = 0; i < n; i++) {
        if (!httpd_path_match(routes[i].pattern, path, &scratch))
            continue;
        allow_add(allow, cap, routes[i].method);
        if (strcmp(routes[i].method, "GET") == 0)
            allow_add(allow, cap, "HEAD");
    }
    return HTTPD_MATCH_BAD_METHOD;
}

/* ---- driving MHD from the reactor ------------------------------------------------- */

/* After MHD_run: true when MHD wants to run again at once (a resume asked for it, or
 * timeout 0: a connection with buffered work, or one just resumed); otherwise MHD's
 * timeout (idle connections) arms the timer. */
static bool rearm(struct httpd *h)
{
    if (!h->d)
        return false;
    MHD_UNSIGNED_LONG_LONG to = 0;
    bool has_to = MHD_get_timeout(h->d, &to) == MHD_YES;
    if (h->kick_pending || (has_to && to == 0)) {
        h->kick_pending = false;
        return true;
    }
    if (has_to)
        reactor_timer_start(h->r, &h->timer, to > INT32_MAX ? INT32_MAX : (int64_t)to, 0);
    else
        reactor_timer_stop(h->r, &h->timer);
    return false;
}

/* MHD advances a connection one step per MHD_run (read the request, run the handler,
 * send, reset for the next request, ...) and reports timeout 0 while it has more to do.
 * That next run goes to the reactor's deferred queue: the next loop pass polls I/O
 * without blocking and runs MHD again — no timer, no timerfd. (Running MHD again
 * right here, a few times in a row, measured no better.) */
static void pump(struct httpd *h)
{
    if (h->in_run) {
        h->kick_pending = true;
        return;
    }
    reactor_defer_cancel(h->r, &h->kick);
    h->in_run = true;
    MHD_run(h->d);
    h->in_run = false;
    if (rearm(h))
        reactor_defer(h->r, &h->kick);
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

/* ---- suspend / resume --------------------------------------------------------------- */

/* Suspend; the connection's RDHUP watch resumes it if the peer goes away, which MHD
 * cannot see while the connection is suspended. (A client that half-closes its side
 * after sending the request is taken as gone too; HTTP clients do not do that in
 * practice.) */
static void suspend_req(struct httpd_req *req)
{
    struct httpd *h = req->h;
    MHD_suspend_connection(req->conn);
    req->suspended = true;
    /* The edge came before this suspension: act on it now (after MHD_run). */
    if (req->hc && req->hc->peer_closed)
        reactor_defer(h->r, &req->hc->hup);
}

static void resume_req(struct httpd_req *req)
{
    struct httpd *h = req->h;
    if (!req->suspended)
        return;
    req->suspended = false;
    MHD_resume_connection(req->conn);
    /* Run MHD at the end of this loop pass (MHD's inter-thread channel also makes its
     * epoll fd readable, but that would cost another pass). */
    if (h->in_run)
        h->kick_pending = true;
    else
        reactor_defer(h->r, &h->kick);
}

static void conn_gone(struct httpd_conn *hc)
{
    hc->peer_closed = true;
    struct httpd_req *req = hc->req;
    if (!req || !req->suspended)
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
    struct httpd *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        struct httpd_conn *hc = xcalloc(1, sizeof(*hc));
        hc->h = h;
        hc->fd = -1;
        reactor_deferred_init(&hc->hup, on_hup_deferred, hc);
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (ci && ci->connect_fd >= 0) {
            int rc = reactor_add_fd(h->r, ci->connect_fd, EPOLLRDHUP | EPOLLET, on_peer_hup, hc);
            if (rc == 0)
                hc->fd = ci->connect_fd;
            else
                log_warn("httpd_watch_failed", LF_STR("server", h->name),
                         LF_INT("fd", ci->connect_fd), LF_INT("errno", -rc));
        }
        *socket_context = hc;
        return;
    }
    /* MHD_CONNECTION_NOTIFY_CLOSED: the socket is still open (MHD closes it next). */
    struct httpd_conn *hc = *socket_context;
    if (!hc)
        return;
    *socket_context = NULL;
    if (hc->fd >= 0)
        reactor_del_fd(h->r, hc->fd);
    reactor_defer_cancel(h->r, &hc->hup);
    if (hc->req) /* MHD completes requests before closing; just in case */
        hc->req->hc = NULL;
    free(hc);
}

/* ---- requests ------------------------------------------------------------------------ */

static void req_free(struct httpd_req *req)
{
    if (!req)
        return;
    for (size_t i = 0; i < req->nparams; i++) {
        free(req->param_names[i]);
        free(req->param_values[i]);
    }
    for (size_t i = 0; i < req->nhdrs; i++) {
        free(req->hdrs[i].name);
        free(req->hdrs[i].value);
    }
    free(req->hdrs);
    if (req->resp)
        MHD_destroy_response(req->resp);
    strbuf_release(&req->body);
    strbuf_release(&req->sbuf);
    free(req->stream_ctype);
    free(req->method);
    free(req->path);
    free(req);
}

static void peer_to_text(struct MHD_Connection *conn, char *out, size_t cap)
{
    out[0] = '\0';
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr)
        return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, out,
                  (socklen_t)cap);
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) /* dual-stack listener: show the IPv4 peer */
            inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)cap);
        else
            inet_ntop(AF_INET6, a, out, (socklen_t)cap);
    }
}

static struct httpd_req *req_new(struct httpd *h, struct MHD_Connection *conn, const char *url,
                                 const char *method)
{
    struct httpd_req *req = xcalloc(1, sizeof(*req));
    req->h = h;
    req->conn = conn;
    req->method = xstrdup(method ? method : "");
    req->path = xstrdup(url ? url : "/");
    req->start_ms = mono_ms();
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    req->hc = ci ? ci->socket_context : NULL;
    if (req->hc)
        req->hc->req = req;
    strbuf_init(&req->body, h->max_body);
    /* sbuf may hold consumed-but-not-compacted bytes in front of the pending ones. */
    strbuf_init(&req->sbuf, 2 * HTTPD_STREAM_MAX);
    peer_to_text(conn, req->peer, sizeof(req->peer));
    req->next = h->live;
    if (h->live)
        h->live->prev = req;
    h->live = req;
    return req;
}

static void req_unlink(struct httpd_req *req)
{
    struct httpd *h = req->h;
    if (req->prev)
        req->prev->next = req->next;
    else if (h->live == req)
        h->live = req->next;
    if (req->next)
        req->next->prev = req->prev;
    req->prev = req->next = NULL;
}

static bool is_quiet(const struct httpd *h, const char *path)
{
    for (char **q = h->quiet_paths; q && *q; q++)
        if (strcmp(*q, path) == 0)
            return true;
    return false;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct httpd *h = cls;
    struct httpd_req *req = *req_cls;
    if (!req)
        return;
    *req_cls = NULL;
    req->completed = true;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        req->client_gone = true;
    if (req->hc && req->hc->req == req)
        req->hc->req = NULL;
    req->hc = NULL;
    req->suspended = false;
    if (log_enabled(LOG_DEBUG) && !is_quiet(h, req->path))
        log_debug("http_request", LF_STR("server", h->name), LF_STR("method", req->method),
                  LF_STR("path", req->path), LF_INT("status", req->status),
                  LF_INT("duration_ms", mono_ms() - req->start_ms), LF_STR("peer", req->peer),
                  LF_BOOL("ok", toe == MHD_REQUEST_TERMINATED_COMPLETED_OK));
    if (req->on_close) {
        httpd_close_cb cb = req->on_close;
        req->on_close = NULL; /* exactly once */
        cb(req, req->on_close_arg);
    }
    req_unlink(req);
    req_free(req);
}

/* ---- building responses --------------------------------------------------------------- */

static void apply_headers(struct httpd_req *req, struct MHD_Response *resp,
                          const char *content_type)
{
    if (content_type)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    for (size_t i = 0; i < req->nhdrs; i++)
        MHD_add_response_header(resp, req->hdrs[i].name, req->hdrs[i].value);
}

static bool can_answer(struct httpd_req *req, const char *what)
{
    if (req->completed || req->resp || req->queued || req->streaming) {
        log_warn("httpd_answer_ignored", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_STR("call", what),
                 LF_STR("why", req->completed ? "request closed" : "already answered"));
        return false;
    }
    return true;
}

/* Take ownership of a malloc'd body and answer with it. */
static void respond_take(struct httpd_req *req, int status, const char *content_type, char *body,
                         size_t len)
{
    if (!can_answer(req, "respond")) {
        free(body);
        return;
    }
    struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(len, body, free);
    if (!resp) { /* only on OOM inside MHD */
        free(body);
        log_error("httpd_response_alloc_failed", LF_STR("server", req->h->name));
        return;
    }
    apply_headers(req, resp, content_type ? content_type : "application/json");
    req->resp = resp;
    req->status = (unsigned)status;
    resume_req(req);
}

static size_t stream_pending(const struct httpd_req *req);

/* A stream that already ended before MHD got to send anything (a short answer that
 * arrived in one piece) goes out as one buffer response: headers and body in a single
 * send with a Content-Length, instead of three sends (headers, one chunk, the last
 * chunk) for MHD's chunked callback response. */
static void stream_collapse(struct httpd_req *req)
{
    if (!req->streaming || !req->stream_ended || req->stream_abort || req->client_gone ||
        req->soff != 0)
        return;
    size_t n = stream_pending(req);
    char *body = xmalloc(n + 1);
    if (n)
        memcpy(body, req->sbuf.buf, n); /* sbuf.buf may be NULL when nothing was written */
    body[n] = '\0';
    struct MHD_Response *b = MHD_create_response_from_buffer_with_free_callback(n, body, free);
    if (!b) {
        free(body);
        return; /* keep the callback response */
    }
    apply_headers(req, b, req->stream_ctype);
    MHD_destroy_response(req->resp);
    req->resp = b;
    strbuf_reset(&req->sbuf);
}

/* Queue the prepared response (we are inside the access handler). */
static enum MHD_Result queue_prepared(struct httpd_req *req)
{
    stream_collapse(req);
    enum MHD_Result ok = MHD_queue_response(req->conn, req->status, req->resp);
    MHD_destroy_response(req->resp);
    req->resp = NULL;
    req->queued = true;
    if (ok != MHD_YES)
        log_warn("httpd_queue_failed", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_INT("status", req->status));
    return ok;
}

static void shutdown_answer(struct httpd_req *req)
{
    httpd_add_header(req, MHD_HTTP_HEADER_CONNECTION, "close");
    httpd_respond_error(req, 503, "server shutting down");
}

/* ---- dispatch --------------------------------------------------------------------------- */

static void dispatch(struct httpd_req *req)
{
    struct httpd *h = req->h;
    struct httpd_params ps;
    size_t idx = 0;
    char allow[128];
    enum httpd_match m = httpd_routes_find(h->routes, h->nroutes, req->method, req->path, &idx, &ps,
                                           allow, sizeof(allow));
    if (m == HTTPD_MATCH_NO_PATH) {
        httpd_respond_error(req, 404, "Not Found");
        return;
    }
    if (m == HTTPD_MATCH_BAD_METHOD) {
        httpd_add_header(req, "Allow", allow);
        httpd_respond_error(req, 405, "Method Not Allowed");
        return;
    }
    const struct httpd_route_entry *rt = &h->routes[idx];
    if ((rt->flags & HTTPD_ROUTE_AUTH) && h->api_key) {
        const char *got = httpd_req_header(req, h->api_key_header);
        if (!got || !*got) {
            httpd_respond_error(req, 401, "missing management key");
            return;
        }
        if (!secret_equal(got, h->api_key)) {
            httpd_respond_error(req, 403, "invalid management key");
            return;
        }
    }
    req->nparams = ps.n;
    for (size_t i = 0; i < ps.n; i++) {
        req->param_names[i] = xstrndup(ps.p[i].name, ps.p[i].name_len);
        req->param_values[i] = xstrndup(ps.p[i].value, ps.p[i].value_len);
    }
    rt->fn(req, rt->arg);
}

/* With a client CA configured, MHD only *requests* a certificate; verify it here. */
static bool client_cert_ok(struct httpd_req *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!ci || !ci->tls_session)
        return false;
    gnutls_session_t s = (gnutls_session_t)ci->tls_session;
    unsigned int n = 0;
    if (!gnutls_certificate_get_peers(s, &n) || n == 0)
        return false;
    unsigned int status = 0;
    return gnutls_certificate_verify_peers2(s, &status) == GNUTLS_E_SUCCESS && status == 0;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
                                 const char *method, const char *version, const char *upload_data,
                                 size_t *upload_size, void **req_cls)
{
    struct httpd *h = cls;
    struct httpd_req *req = *req_cls;

    if (!req) {
        req = req_new(h, conn, url, method);
        *req_cls = req;
        if (h->verify_client && !client_cert_ok(req)) {
            req->handled = true;
            httpd_respond_error(req, 403, "client certificate required");
            return queue_prepared(req);
        }
        /* An announced oversize body: when the excess is small enough we read and
         * discard it, so a client that writes its whole body before reading (most do)
         * still gets a clean 413 instead of a reset. A huge one is refused before it is
         * read (MHD then closes the connection, as the body was not consumed). */
        const char *cl =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        int64_t n = 0;
        if (cl && parse_i64(cl, 0, INT64_MAX, &n) == 0 && (uint64_t)n > h->max_body) {
            req->too_large = true;
            strbuf_release(&req->body);
            strbuf_init(&req->body, 1);
            const char *expect =
                MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            /* "Expect: 100-continue" clients wait: answering now saves them the upload. */
            if ((uint64_t)n - h->max_body > HTTPD_DISCARD_MAX || expect) {
                req->handled = true;
                httpd_respond_error(req, 413, "request body too large");
                return queue_prepared(req);
            }
        }
        return MHD_YES;
    }

    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (req->queued)
            return MHD_YES; /* answered early: MHD discards the rest */
        if (!req->too_large && strbuf_append(&req->body, upload_data, n) != 0) {
            req->too_large = true;
            strbuf_release(&req->body);
            strbuf_init(&req->body, 1);
        }
        if (req->too_large) {
            req->discarded += n;
            if (req->discarded > HTTPD_DISCARD_MAX)
                return MHD_NO;
        }
        return MHD_YES;
    }

    /* The whole request has arrived (or we were resumed). */
    if (!req->handled) {
        req->handled = true;
        if (req->too_large)
            httpd_respond_error(req, 413, "request body too large");
        else if (h->stopping) /* owners are tearing down: handlers must not run now */
            shutdown_answer(req);
        else
            dispatch(req);
    }
    if (req->resp)
        return queue_prepared(req);
    if (req->queued)
        return MHD_YES;
    if (req->client_gone)
        return MHD_NO; /* nobody to answer: close the connection */
    if (h->stopping) {
        shutdown_answer(req);
        return queue_prepared(req);
    }
    suspend_req(req);
    return MHD_YES;
}

/* ---- streaming ------------------------------------------------------------------------ */

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
            /* compact rarely: the memmove is amortised over >= 8 MiB of output */
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

/* ---- public API -------------------------------------------------------------------------- */

static void mhd_logger(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void mhd_logger(void *cls, const char *fmt, va_list ap)
{
    struct httpd *h = cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    size_t len = strlen(msg);
    while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        msg[--len] = '\0';
    /* Connections MHD drops (clients gone, streams we aborted) are routine. */
    bool routine = strncmp(msg, "Closing connection", 18) == 0 ||
                   strncmp(msg, "Application reported internal error", 35) == 0;
    enum log_level lvl = routine ? LOG_DEBUG : LOG_WARN;
    log_at(lvl, "httpd_mhd", LF_STR("server", h ? h->name : NULL), LF_STR("msg", msg));
}

static int resolve_host(const char *host, uint16_t port, struct sockaddr_storage *ss, bool *is_v6)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        *is_v6 = false;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        *is_v6 = true;
        return 0;
    }
    /* A name ("localhost"): resolve once at startup, first address wins. */
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return -EINVAL;
    memcpy(ss, res->ai_addr, MOTOR_MIN((size_t)res->ai_addrlen, sizeof(*ss)));
    *is_v6 = res->ai_family == AF_INET6;
    if (*is_v6)
        v6->sin6_port = htons(port);
    else
        v4->sin_port = htons(port);
    freeaddrinfo(res);
    return 0;
}

static char *read_pem(const char *name, const char *what, const char *path)
{
    char *s = read_file(path, HTTPD_TLS_FILE_MAX, NULL);
    if (!s) {
        int e = errno;
        log_error("httpd_tls_file_unreadable", LF_STR("server", name), LF_STR("file", what),
                  LF_STR("path", path), LF_STR("error", strerror(e)));
        errno = e;
    }
    return s;
}

struct httpd *httpd_new(struct reactor *r, const struct httpd_config *cfg)
{
    struct httpd *h = xcalloc(1, sizeof(*h));
    char *cert = NULL, *key = NULL, *ca = NULL;
    int err = EINVAL;
    h->r = r;
    h->epfd = -1;
    h->name = xstrdup(cfg->name ? cfg->name : "httpd");
    h->max_body = cfg->max_body ? cfg->max_body : HTTPD_DEFAULT_MAX_BODY;
    h->api_key = xstrdup(cfg->api_key);
    h->api_key_header =
        xstrdup(cfg->api_key_header ? cfg->api_key_header : "X-Motor-Management-Key");
    if (cfg->quiet_paths) {
        size_t n = 0;
        while (cfg->quiet_paths[n])
            n++;
        h->quiet_paths = xcalloc(n + 1, sizeof(char *));
        for (size_t i = 0; i < n; i++)
            h->quiet_paths[i] = xstrdup(cfg->quiet_paths[i]);
    }
    reactor_timer_init(&h->timer, on_timer, h);
    reactor_deferred_init(&h->kick, on_kick, h);

    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    struct sockaddr_storage ss;
    bool v6 = false;
    if (resolve_host(host, cfg->port, &ss, &v6) != 0) {
        log_error("httpd_bad_host", LF_STR("server", h->name), LF_STR("host", host));
        err = EINVAL;
        goto fail;
    }

    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (v6) {
        /* "::" means every address, IPv4 included (as uvicorn does on Linux). */
        const struct in6_addr *a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
        flags |= IN6_IS_ADDR_UNSPECIFIED(a) ? MHD_USE_DUAL_STACK : MHD_USE_IPv6;
    }

    struct MHD_OptionItem opts[16];
    size_t no = 0;
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &ss};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                         cfg->idle_timeout_s ? cfg->idle_timeout_s : 60, NULL};
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                         cfg->max_connections ? cfg->max_connections : 1024, NULL};
    if (cfg->reuse_port)
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_LISTENING_ADDRESS_REUSE, 1, NULL};

    bool tls = cfg->tls_cert_file && *cfg->tls_cert_file && cfg->tls_key_file && *cfg->tls_key_file;
    if (!tls && ((cfg->tls_cert_file && *cfg->tls_cert_file) ||
                 (cfg->tls_key_file && *cfg->tls_key_file))) {
        log_error("httpd_tls_incomplete", LF_STR("server", h->name),
                  LF_STR("detail", "TLS needs both a certificate and a key file"));
        err = EINVAL;
        goto fail;
    }
    if (tls) {
        cert = read_pem(h->name, "certificate", cfg->tls_cert_file);
        key = cert ? read_pem(h->name, "key", cfg->tls_key_file) : NULL;
        if (!cert || !key) {
            err = errno ? errno : EINVAL;
            goto fail;
        }
        if (cfg->tls_ca_file && *cfg->tls_ca_file) {
            ca = read_pem(h->name, "client CA", cfg->tls_ca_file);
            if (!ca) {
                err = errno ? errno : EINVAL;
                goto fail;
            }
            h->verify_client = true;
        }
        flags |= MHD_USE_TLS;
        if (cfg->tls_key_password)
            opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_KEY_PASSWORD, 0,
                                                 (void *)cfg->tls_key_password};
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, key};
        opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, cert};
        if (ca)
            opts[no++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0, ca};
    }
    opts[no++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};

    errno = 0;
    h->d = MHD_start_daemon(flags, cfg->port, NULL, NULL, on_access, h, MHD_OPTION_EXTERNAL_LOGGER,
                            mhd_logger, h, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                            MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!h->d) {
        err = errno ? errno : EINVAL;
        log_error("httpd_start_failed", LF_STR("server", h->name), LF_STR("host", host),
                  LF_INT("port", cfg->port), LF_BOOL("tls", tls), LF_STR("error", strerror(err)));
        goto fail;
    }
    /* MHD copied the key material into GnuTLS; wipe our copy of the key. */
    if (key)
        explicit_bzero(key, strlen(key));
    free(cert);
    free(key);
    free(ca);
    cert = key = ca = NULL;

    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : cfg->port;
    di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!di || di->epoll_fd < 0) {
        err = ENOTSUP;
        goto fail;
    }
    h->epfd = di->epoll_fd;
    int rc = reactor_add_fd(r, h->epfd, EPOLLIN, on_epoll_ready, h);
    if (rc != 0) {
        h->epfd = -1;
        err = -rc;
        goto fail;
    }
    if (rearm(h))
        reactor_defer(r, &h->kick);
    log_info("http_listening", LF_STR("server", h->name), LF_STR("host", host),
             LF_INT("port", h->port), LF_BOOL("tls", tls));
    return h;

fail:
    if (key)
        explicit_bzero(key, strlen(key));
    free(cert);
    free(key);
    free(ca);
    httpd_free(h);
    errno = err;
    return NULL;
}

static bool any_unfinished(const struct httpd *h)
{
    for (const struct httpd_req *q = h->live; q; q = q->next)
        if (q->suspended || q->resp || (q->queued && !q->completed))
            return true;
    return false;
}

void httpd_free(struct httpd *h)
{
    if (!h)
        return;
    h->stopping = true;
    if (h->d) {
        MHD_socket ls = MHD_quiesce_daemon(h->d);
        if (ls != MHD_INVALID_SOCKET)
            close(ls);
        /* Nothing may stay suspended at MHD_stop_daemon (it aborts the process):
         * answer pending requests, end streams, then let MHD flush for a while. */
        for (struct httpd_req *q = h->live; q; q = q->next) {
            if (q->completed)
                continue;
            if (q->handled && !q->resp && !q->queued && !q->streaming)
                shutdown_answer(q);
            if (q->streaming && !q->stream_ended)
                httpd_stream_end(q, false);
            resume_req(q);
        }
        int64_t deadline = mono_ms() + HTTPD_SHUTDOWN_FLUSH_MS;
        for (;;) {
            h->in_run = true;
            MHD_run(h->d);
            h->in_run = false;
            if (!any_unfinished(h))
                break;
            int64_t left = deadline - mono_ms();
            if (left <= 0)
                break;
            /* Anything still suspended now can only be a client that never reads;
             * mark it gone so its next resume tears it down. */
            for (struct httpd_req *q = h->live; q; q = q->next)
                if (q->suspended) {
                    q->client_gone = true;
                    resume_req(q);
                }
            MHD_UNSIGNED_LONG_LONG to = 0;
            int wait = (int)MOTOR_MIN(left, 50);
            if (MHD_get_timeout(h->d, &to) == MHD_YES && (int64_t)to < wait)
                wait = (int)to;
            struct pollfd pfd = {.fd = h->epfd, .events = POLLIN};
            (void)poll(&pfd, 1, wait);
        }
        for (struct httpd_req *q = h->live; q; q = q->next)
            if (q->suspended) { /* last resort, still must not stop while suspended */
                q->client_gone = true;
                resume_req(q);
            }
        MHD_run(h->d);
        if (h->epfd >= 0)
            reactor_del_fd(h->r, h->epfd);
        reactor_timer_stop(h->r, &h->timer);
        reactor_defer_cancel(h->r, &h->kick);
        /* Remaining connections are closed; their on_close callbacks run in here. */
        MHD_stop_daemon(h->d);
        h->d = NULL;
    }
    reactor_timer_stop(h->r, &h->timer);
    reactor_defer_cancel(h->r, &h->kick);
    for (size_t i = 0; i < h->nroutes; i++) {
        free(h->routes[i].method);
        free(h->routes[i].pattern);
    }
    free(h->routes);
    for (char **q = h->quiet_paths; q && *q; q++)
        free(*q);
    free(h->quiet_paths);
    free(h->name);
    free(h->api_key_header);
    if (h->api_key)
        explicit_bzero(h->api_key, strlen(h->api_key));
    free(h->api_key);
    free(h);
}

uint16_t httpd_port(const struct httpd *h)
{
    return h->port;
}

void httpd_route(struct httpd *h, const char *method, const char *pattern, httpd_handler fn,
                 void *arg, unsigned flags)
{
    if (!method || !*method || !fn || !httpd_pattern_valid(pattern)) {
        log_error("httpd_bad_route", LF_STR("server", h->name), LF_STR("method", method),
                  LF_STR("pattern", pattern));
        return;
    }
    if (h->nroutes == h->routes_cap) {
        h->routes_cap = h->routes_cap ? 2 * h->routes_cap : 16;
        h->routes = xrealloc(h->routes, h->routes_cap * sizeof(*h->routes));
    }
    h->routes[h->nroutes++] = (struct httpd_route_entry){.method = xstrdup(method),
                                                         .pattern = xstrdup(pattern),
                                                         .fn = fn,
                                                         .arg = arg,
                                                         .flags = flags};
}

const char *httpd_req_method(const struct httpd_req *req)
{
    return req->method;
}

const char *httpd_req_path(const struct httpd_req *req)
{
    return req->path;
}

const char *httpd_req_param(const struct httpd_req *req, const char *name)
{
    for (size_t i = 0; i < req->nparams; i++)
        if (strcmp(req->param_names[i], name) == 0)
            return req->param_values[i];
    return NULL;
}

const char *httpd_req_query(const struct httpd_req *req, const char *name)
{
    if (!name)
        return NULL;
    return MHD_lookup_connection_value(req->conn, MHD_GET_ARGUMENT_KIND, name);
}

const char *httpd_req_header(const struct httpd_req *req, const char *name)
{
    if (!name)
        return NULL;
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *httpd_req_body(const struct httpd_req *req, size_t *len)
{
    if (len)
        *len = req->body.len;
    return strbuf_str(&req->body);
}

json_t *httpd_req_json(const struct httpd_req *req, char *err_msg, size_t cap)
{
    if (req->body.len == 0) {
        if (cap)
            snprintf(err_msg, cap, "request body is empty");
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loadb(req->body.buf, req->body.len, JSON_DECODE_ANY, &e);
    if (!j && cap)
        snprintf(err_msg, cap, "invalid JSON at line %d column %d: %s", e.line, e.column, e.text);
    return j;
}

const char *httpd_req_peer(const struct httpd_req *req)
{
    return req->peer;
}

int64_t httpd_req_start_ms(const struct httpd_req *req)
{
    return req->start_ms;
}

struct httpd *httpd_req_server(const struct httpd_req *req)
{
    return req->h;
}

void httpd_req_on_close(struct httpd_req *req, httpd_close_cb cb, void *arg)
{
    if (req->completed)
        return; /* already closing: the caller sees no further callback */
    req->on_close = cb;
    req->on_close_arg = arg;
}

bool httpd_req_client_gone(const struct httpd_req *req)
{
    return req->client_gone;
}

void httpd_add_header(struct httpd_req *req, const char *name, const char *value)
{
    if (!name || !value || req->queued || req->resp)
        return;
    req->hdrs = xrealloc(req->hdrs, (req->nhdrs + 1) * sizeof(*req->hdrs));
    req->hdrs[req->nhdrs++] = (struct httpd_hdr){xstrdup(name), xstrdup(value)};
}

void httpd_respond(struct httpd_req *req, int status, const char *content_type, const void *body,
                   size_t len)
{
    char *copy = xmalloc(len + 1);
    if (len)
        memcpy(copy, body, len);
    copy[len] = '\0';
    respond_take(req, status, content_type, copy, len);
}

void httpd_respond_json(struct httpd_req *req, int status, json_t *body)
{
    char *s = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(body);
    if (!s) {
        httpd_respond_error(req, 500, "response serialization failed");
        return;
    }
    respond_take(req, status, "application/json", s, strlen(s));
}

void httpd_respond_error(struct httpd_req *req, int status, const char *detail)
{
    struct strbuf sb;
    strbuf_init(&sb, 64 * 1024);
    strbuf_puts(&sb, "{\"detail\":");
    if (strbuf_put_json_string(&sb, detail ? detail : "") != 0) {
        strbuf_reset(&sb);
        strbuf_puts(&sb, "{\"detail\":\"error\"");
    }
    strbuf_putc(&sb, '}');
    size_t len = sb.len;
    respond_take(req, status, "application/json", strbuf_take(&sb), len);
}

void httpd_stream_begin(struct httpd_req *req, int status, const char *content_type)
{
    if (!can_answer(req, "stream_begin"))
        return;
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, HTTPD_STREAM_BLOCK, stream_read, req, NULL);
    if (!resp) {
        log_error("httpd_response_alloc_failed", LF_STR("server", req->h->name));
        return;
    }
    req->stream_ctype = xstrdup(content_type ? content_type : "text/event-stream");
    apply_headers(req, resp, req->stream_ctype);
    req->streaming = true;
    req->resp = resp;
    req->status = (unsigned)status;
    resume_req(req);
}

int httpd_stream_write(struct httpd_req *req, const void *data, size_t len)
{
    if (req->completed || req->client_gone)
        return -EPIPE;
    if (!req->streaming || req->stream_ended)
        return -EINVAL;
    if (len == 0)
        return 0;
    if (stream_pending(req) + len > HTTPD_STREAM_MAX || strbuf_append(&req->sbuf, data, len) != 0) {
        log_warn("httpd_stream_overflow", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_INT("pending", stream_pending(req)));
        req->stream_ended = true;
        req->stream_abort = true;
        resume_req(req);
        return -E2BIG;
    }
    resume_req(req);
    return 0;
}

void httpd_stream_end(struct httpd_req *req, bool abort)
{
    if (!req->streaming || req->stream_ended || req->completed)
        return;
    req->stream_ended = true;
    req->stream_abort = abort;
    resume_req(req);
}

size_t httpd_stream_pending(const struct httpd_req *req)
{
    return req->streaming ? stream_pending(req) : 0;
}
