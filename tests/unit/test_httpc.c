/* httpc against a tiny scripted HTTP/1.1 server running in threads of this process
 * (the real httpd is tested elsewhere; here the server must be able to misbehave on
 * cue: stall, stream slowly, send too much, hang up without answering). Every case runs
 * twice: over http:// and over https:// (the scripted server then speaks TLS through
 * OpenSSL, with the test CA's certificate, trusted through SSL_CERT_FILE as the system
 * store would be). TLS-only cases are in test_httpc_tls.c. */
#include "common/httpc.h"
#include "common/reactor.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tlsfix.h"

/* ---- the scripted server ---------------------------------------------------------- */

#define SRV_MAX_CONN 128

static bool tls_mode;
static const char *scheme(void)
{
    return tls_mode ? "https" : "http";
}

struct tsrv {
    int lfd;
    int port;
    pthread_t accept_thr;
    pthread_mutex_t mu;
    pthread_t thr[SRV_MAX_CONN];
    int fd[SRV_MAX_CONN]; /* -1 once the connection thread closed it */
    int nconn;
    atomic_int accepted;
    atomic_int requests; /* complete requests read */
    atomic_int aborted;  /* responses cut short because the client went away */
    atomic_bool stop;
    SSL_CTX *tls; /* TLS mode: the server's context */
    /* what the last /echo request looked like (under mu) */
    char last_method[16];
    char last_ctype[64];
    bool saw_expect;
    size_t last_body_len;
};

struct conn_arg {
    struct tsrv *s;
    int idx;
};

static int send_all(struct tio *t, const void *buf, size_t n)
{
    return tio_send_all(t, buf, n);
}

static int send_str(struct tio *t, const char *s)
{
    return send_all(t, s, strlen(s));
}

/* Waits ms; -1 when the client hung up (or sent anything: curl does not pipeline)
 * or the server is stopping. */
static int pause_or_abort(struct tsrv *s, struct tio *t, int ms)
{
    if (tio_pending(t))
        return -1;
    struct pollfd p = {.fd = t->fd, .events = POLLIN};
    int rc = poll(&p, 1, ms);
    if (rc != 0 || atomic_load(&s->stop))
        return -1;
    return 0;
}

static long query_param(const char *path, const char *name, long dflt)
{
    char key[32];
    snprintf(key, sizeof(key), "%s=", name);
    const char *q = strchr(path, '?');
    if (!q)
        return dflt;
    const char *p = strstr(q, key);
    if (!p)
        return dflt;
    char *end;
    long v = strtol(p + strlen(key), &end, 10);
    return end == p + strlen(key) ? dflt : v;
}

static bool has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Returns 0 to keep the connection, -1 to close it. */
static int serve_one(struct tsrv *s, struct tio *fd, const char *method, const char *path,
                     const char *headers, const char *body, size_t body_len)
{
    char hdr[512];
    if (has_prefix(path, "/hello")) {
        return send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                            "Content-Length: 11\r\n\r\nhello world");
    }
    if (has_prefix(path, "/echo")) {
        char ctype[64] = "";
        const char *ct = strcasestr(headers, "\r\nContent-Type:");
        if (ct) {
            ct += strlen("\r\nContent-Type:");
            while (*ct == ' ')
                ct++;
            size_t n = strcspn(ct, "\r\n");
            if (n >= sizeof(ctype))
                n = sizeof(ctype) - 1;
            memcpy(ctype, ct, n);
            ctype[n] = '\0';
        }
        pthread_mutex_lock(&s->mu);
        snprintf(s->last_method, sizeof(s->last_method), "%s", method);
        snprintf(s->last_ctype, sizeof(s->last_ctype), "%s", ctype);
        s->saw_expect = strcasestr(headers, "\r\nExpect:") != NULL;
        s->last_body_len = body_len;
        pthread_mutex_unlock(&s->mu);
        snprintf(hdr, sizeof(hdr),
                 "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n",
                 ctype[0] ? ctype : "application/octet-stream", body_len);
        if (send_str(fd, hdr))
            return -1;
        return send_all(fd, body, body_len);
    }
    if (has_prefix(path, "/delay")) {
        if (pause_or_abort(s, fd, (int)query_param(path, "ms", 100))) {
            atomic_fetch_add(&s->aborted, 1);
            return -1;
        }
        return send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                            "Content-Length: 4\r\n\r\nlate");
    }
    if (has_prefix(path, "/stream")) {
        long n = query_param(path, "n", 5), gap = query_param(path, "gap", 20);
        if (send_str(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         "Transfer-Encoding: chunked\r\n\r\n"))
            return -1;
        for (long i = 0; i < n; i++) {
            char ev[64], chunk[96];
            int len = snprintf(ev, sizeof(ev), "data: %ld\n\n", i);
            snprintf(chunk, sizeof(chunk), "%x\r\n%s\r\n", len, ev);
            if (send_str(fd, chunk) || (gap > 0 && pause_or_abort(s, fd, (int)gap))) {
                atomic_fetch_add(&s->aborted, 1);
                return -1;
            }
        }
        return send_str(fd, "0\r\n\r\n");
    }
    if (has_prefix(path, "/bigchunked") || has_prefix(path, "/big")) {
        bool chunked = has_prefix(path, "/bigchunked");
        long n = query_param(path, "n", 1000);
        if (chunked)
            snprintf(hdr, sizeof(hdr), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        else
            snprintf(hdr, sizeof(hdr), "HTTP/1.1 200 OK\r\nContent-Length: %ld\r\n\r\n", n);
        if (send_str(fd, hdr))
            return -1;
        char piece[1024];
        memset(piece, 'x', sizeof(piece));
        for (long left = n; left > 0;) {
            size_t k = left > (long)sizeof(piece) ? sizeof(piece) : (size_t)left;
            if (chunked) {
                snprintf(hdr, sizeof(hdr), "%zx\r\n", k);
                if (send_str(fd, hdr))
                    return -1;
            }
            if (send_all(fd, piece, k) || (chunked && send_str(fd, "\r\n")))
                return -1;
            left -= (long)k;
        }
        return chunked ? send_str(fd, "0\r\n\r\n") : 0;
    }
    if (has_prefix(path, "/close"))
        return -1;
    if (has_prefix(path, "/bye")) {
        /* a keep-alive answer, then the server drops the idle connection */
        send_str(fd, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbye");
        return -1;
    }
    if (has_prefix(path, "/nocontent"))
        return send_str(fd, "HTTP/1.1 204 No Content\r\n\r\n");
    if (has_prefix(path, "/status")) {
        snprintf(hdr, sizeof(hdr), "HTTP/1.1 %ld Whatever\r\nContent-Length: 2\r\n\r\nno",
                 query_param(path, "code", 200));
        return send_str(fd, hdr);
    }
    return send_str(fd, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
}

static void *conn_main(void *argp)
{
    struct conn_arg *a = argp;
    struct tsrv *s = a->s;
    int idx = a->idx;
    free(a);
    pthread_mutex_lock(&s->mu);
    int fd = s->fd[idx];
    pthread_mutex_unlock(&s->mu);
    struct tio t;
    if (tio_accept(&t, fd, s->tls) != 0)
        goto done;

    /* grows to hold one whole request (head + body), up to a cap */
    size_t cap = 16384, have = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        char *end = NULL;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            if (have == cap)
                goto out;
            ssize_t r = tio_recv(&t, buf + have, cap - have);
            if (r <= 0)
                goto out;
            have += (size_t)r;
        }
        size_t head_len = (size_t)(end - buf) + 4;
        char head[4096];
        if (head_len >= sizeof(head))
            goto out;
        memcpy(head, buf, head_len);
        head[head_len] = '\0';
        size_t body_len = 0;
        const char *cl = strcasestr(head, "\r\nContent-Length:");
        if (cl)
            body_len = (size_t)strtoul(cl + strlen("\r\nContent-Length:"), NULL, 10);
        if (body_len > 4u * 1024 * 1024)
            goto out;
        if (head_len + body_len > cap) {
            cap = head_len + body_len;
            buf = xrealloc(buf, cap);
        }
        while (have < head_len + body_len) {
            ssize_t r = tio_recv(&t, buf + have, cap - have);
            if (r <= 0)
                goto out;
            have += (size_t)r;
        }
        char method[16] = "", path[1024] = "";
        if (sscanf(head, "%15s %1023s", method, path) != 2)
            goto out;
        atomic_fetch_add(&s->requests, 1);
        if (serve_one(s, &t, method, path, head, buf + head_len, body_len) != 0)
            goto out;
        memmove(buf, buf + head_len + body_len, have - head_len - body_len);
        have -= head_len + body_len;
    }
out:
    free(buf);
    tio_end(&t, true); /* a TLS server says goodbye properly */
done:
    pthread_mutex_lock(&s->mu);
    s->fd[idx] = -1;
    pthread_mutex_unlock(&s->mu);
    close(fd);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct tsrv *s = arg;
    for (;;) {
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL; /* shut down */
        }
        if (atomic_load(&s->stop)) {
            close(fd);
            return NULL;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        atomic_fetch_add(&s->accepted, 1);
        pthread_mutex_lock(&s->mu);
        if (s->nconn == SRV_MAX_CONN) {
            pthread_mutex_unlock(&s->mu);
            close(fd);
            continue;
        }
        int idx = s->nconn++;
        s->fd[idx] = fd;
        struct conn_arg *a = xmalloc(sizeof(*a));
        a->s = s;
        a->idx = idx;
        if (pthread_create(&s->thr[idx], NULL, conn_main, a) != 0) {
            s->fd[idx] = -1;
            s->nconn--;
            close(fd);
            free(a);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

static struct tsrv *tsrv_start(void)
{
    struct tsrv *s = xcalloc(1, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    if (tls_mode)
        s->tls = tlsfix_server_ctx(tlsfix("srv.crt"), tlsfix("srv.key"), NULL);
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(s->lfd, 128), 0);
    socklen_t len = sizeof(sa);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&sa, &len), 0);
    s->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&s->accept_thr, NULL, accept_main, s), 0);
    return s;
}

static void tsrv_stop(struct tsrv *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, true);
    shutdown(s->lfd, SHUT_RDWR); /* wakes accept() */
    pthread_join(s->accept_thr, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->nconn; i++)
        if (s->fd[i] >= 0)
            shutdown(s->fd[i], SHUT_RDWR); /* wakes recv()/poll() */
    int n = s->nconn;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
        pthread_join(s->thr[i], NULL);
    pthread_mutex_destroy(&s->mu);
    SSL_CTX_free(s->tls);
    free(s);
}

/* ---- client-side fixture ---------------------------------------------------------- */

struct fx {
    struct reactor *r;
    struct httpc *c;
    struct tsrv *s;
};

static int setup(void **state)
{
    struct fx *f = xcalloc(1, sizeof(*f));
    f->r = reactor_new();
    assert_non_null(f->r);
    f->c = httpc_new(f->r);
    assert_non_null(f->c);
    f->s = tsrv_start();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    httpc_free(f->c);
    tsrv_stop(f->s);
    reactor_free(f->r);
    free(f);
    return 0;
}

/* What the last /echo request looked like (copied out: a failing assert must not
 * leave the server's mutex locked). */
struct echo_seen {
    char method[16];
    char ctype[64];
    bool expect;
    size_t body_len;
};

static struct echo_seen echo_seen(struct tsrv *s)
{
    struct echo_seen e;
    pthread_mutex_lock(&s->mu);
    memcpy(e.method, s->last_method, sizeof(e.method));
    memcpy(e.ctype, s->last_ctype, sizeof(e.ctype));
    e.expect = s->saw_expect;
    e.body_len = s->last_body_len;
    pthread_mutex_unlock(&s->mu);
    return e;
}

static char *url(struct fx *f, const char *path)
{
    return xasprintf("%s://127.0.0.1:%d%s", scheme(), f->s->port, path);
}

/* What one request saw. */
struct res {
    struct fx *f;
    struct httpc_req *req;
    int ncalls;
    int error;
    char error_text[256];
    long status;
    char *body;
    size_t body_len;
    char ctype[64];
    bool ctype_null;
    int64_t elapsed;
    /* streaming */
    char events[64]; /* 'S' status, 'C' chunk, 'D' done, in order */
    size_t nevents;
    int nstatus, nchunks;
    long st_status;
    char st_ctype[64];
    char stream[4096];
    size_t stream_len;
    int abort_at_chunk;  /* >0: return non-zero on that chunk */
    int cancel_at_chunk; /* >0: httpc_cancel own request on that chunk */
    int free_at_chunk;   /* >0: httpc_free the client on that chunk */
    bool abort_status;
    bool cancel_in_status;
    /* done actions */
    struct httpc_req *cancel_in_done; /* cancel this other request in done */
    bool free_in_done;
    int chain_left; /* start another /hello from done while > 0 */
    struct res *chain_next;
};

static void push_event(struct res *x, char e)
{
    if (x->nevents < sizeof(x->events) - 1)
        x->events[x->nevents++] = e;
}

static void on_done(const struct httpc_response *resp, void *arg)
{
    struct res *x = arg;
    x->ncalls++;
    push_event(x, 'D');
    x->error = resp->error;
    snprintf(x->error_text, sizeof(x->error_text), "%s",
             resp->error_text ? resp->error_text : "(null)");
    x->status = resp->status;
    free(x->body);
    x->body = xstrndup(resp->body, resp->body_len);
    x->body_len = resp->body_len;
    x->ctype_null = resp->content_type == NULL;
    snprintf(x->ctype, sizeof(x->ctype), "%s", resp->content_type ? resp->content_type : "");
    x->elapsed = resp->elapsed_ms;
    if (x->cancel_in_done)
        httpc_cancel(x->f->c, x->cancel_in_done);
    if (x->free_in_done) {
        httpc_free(x->f->c);
        x->f->c = NULL;
    }
    if (x->chain_left > 0 && x->chain_next) {
        struct res *n = x->chain_next;
        n->chain_left = x->chain_left - 1;
        char *u = url(x->f, "/hello");
        n->req = httpc_get(x->f->c, u, 5000, on_done, n);
        free(u);
    }
}

static int on_status(long status, const char *ctype, void *arg)
{
    struct res *x = arg;
    x->nstatus++;
    push_event(x, 'S');
    x->st_status = status;
    snprintf(x->st_ctype, sizeof(x->st_ctype), "%s", ctype ? ctype : "");
    if (x->cancel_in_status)
        httpc_cancel(x->f->c, x->req);
    return x->abort_status ? 1 : 0;
}

static int on_chunk(const char *data, size_t len, void *arg)
{
    struct res *x = arg;
    x->nchunks++;
    push_event(x, 'C');
    if (x->stream_len + len < sizeof(x->stream)) {
        memcpy(x->stream + x->stream_len, data, len);
        x->stream_len += len;
    }
    if (x->cancel_at_chunk && x->nchunks == x->cancel_at_chunk)
        httpc_cancel(x->f->c, x->req);
    if (x->free_at_chunk && x->nchunks == x->free_at_chunk) {
        httpc_free(x->f->c);
        x->f->c = NULL;
    }
    return x->abort_at_chunk && x->nchunks == x->abort_at_chunk ? 1 : 0;
}

static void res_release(struct res *x)
{
    free(x->body);
    x->body = NULL;
}

/* Runs the loop until *counter >= want or timeout_ms passes. */
static void run_until_int(struct fx *f, const int *counter, int want, int timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (*counter < want && util_mono_ms() < deadline)
        reactor_run_once(f->r, 20);
}

static void run_until_atomic(struct fx *f, atomic_int *counter, int want, int timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (atomic_load(counter) < want && util_mono_ms() < deadline)
        reactor_run_once(f->r, 20);
}

/* ---- tests -------------------------------------------------------------------------- */

static void test_get(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/hello");
    x.req = httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    assert_non_null(x.req);
    assert_int_equal(httpc_active(f->c), 1);
    assert_int_equal(x.ncalls, 0); /* never from inside httpc_request */
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, 0);
    assert_string_equal(x.error_text, "");
    assert_int_equal(x.status, 200);
    assert_string_equal(x.body, "hello world");
    assert_int_equal(x.body_len, 11);
    assert_string_equal(x.ctype, "text/plain");
    assert_true(x.elapsed >= 0 && x.elapsed < 5000);
    assert_int_equal(httpc_active(f->c), 0);
    res_release(&x);

    /* by name (curl's resolver runs on the loop too); done cancelling its own request
     * is a no-op that must not upset the count */
    struct res y = {.f = f};
    u = xasprintf("%s://localhost:%d/hello", scheme(), f->s->port);
    y.req = httpc_get(f->c, u, 5000, on_done, &y);
    y.cancel_in_done = y.req;
    free(u);
    run_until_int(f, &y.ncalls, 1, 5000);
    assert_int_equal(y.error, 0);
    assert_string_equal(y.body, "hello world");
    assert_int_equal(httpc_active(f->c), 0);
    res_release(&y);
}

static void test_post_json(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    json_t *body = json_pack("{s:i,s:s,s:[i,i]}", "a", 1, "b", "x y", "c", 2, 3);
    char *u = url(f, "/echo");
    httpc_post_json(f->c, u, body, 5000, on_done, &x);
    json_decref(body);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, 0);
    assert_int_equal(x.status, 200);
    assert_string_equal(x.body, "{\"a\":1,\"b\":\"x y\",\"c\":[2,3]}");
    assert_string_equal(x.ctype, "application/json");
    struct echo_seen e = echo_seen(f->s);
    assert_string_equal(e.method, "POST");
    assert_string_equal(e.ctype, "application/json");
    assert_false(e.expect);

    /* NULL body: a POST with an empty body */
    struct res y = {.f = f};
    httpc_post_json(f->c, u, NULL, 5000, on_done, &y);
    run_until_int(f, &y.ncalls, 1, 5000);
    assert_int_equal(y.error, 0);
    assert_int_equal(y.body_len, 0);
    e = echo_seen(f->s);
    assert_string_equal(e.method, "POST");
    assert_int_equal(e.body_len, 0);

    /* a body large enough (> 1 MiB) that curl would add "Expect: 100-continue" on its
     * own and then wait a second for a "100 Continue" this server never sends */
    struct res z = {.f = f};
    size_t big_len = 1100 * 1024;
    char *big = xmalloc(big_len + 1);
    memset(big, 'a', big_len);
    big[big_len] = '\0';
    struct httpc_opts o = {.method = "PUT", .url = u, .body = big, .content_type = "text/plain"};
    httpc_request(f->c, &o, on_done, &z);
    run_until_int(f, &z.ncalls, 1, 5000);
    assert_int_equal(z.error, 0);
    assert_int_equal(z.body_len, big_len);
    assert_memory_equal(z.body, big, big_len);
    free(big);
    e = echo_seen(f->s);
    assert_string_equal(e.method, "PUT");
    assert_string_equal(e.ctype, "text/plain");
    assert_false(e.expect);

    /* caller headers: sent, a caller Content-Type wins, CR/LF refused */
    struct res h = {.f = f}, bad = {.f = f};
    const char *hdrs[] = {"Content-Type: application/x-test", "X-Extra: 1", NULL};
    struct httpc_opts ho = {.url = u, .body = "{}", .headers = hdrs};
    httpc_request(f->c, &ho, on_done, &h);
    const char *bad_hdrs[] = {"X-A: 1\r\nX-B: 2", NULL};
    struct httpc_opts bo = {.url = u, .headers = bad_hdrs};
    httpc_request(f->c, &bo, on_done, &bad);
    run_until_int(f, &h.ncalls, 1, 5000);
    run_until_int(f, &bad.ncalls, 1, 5000);
    assert_int_equal(h.error, 0);
    assert_string_equal(h.ctype, "application/x-test");
    assert_string_equal(h.body, "{}");
    assert_int_equal(bad.error, -EINVAL);
    res_release(&h);
    res_release(&bad);
    free(u);
    res_release(&x);
    res_release(&y);
    res_release(&z);
}

static void test_concurrent_50(void **state)
{
    struct fx *f = *state;
    enum { N = 50 };
    struct res *x = xcalloc(N, sizeof(*x));
    char *u = url(f, "/delay?ms=200");
    int64_t t0 = util_mono_ms();
    for (int i = 0; i < N; i++) {
        x[i].f = f;
        httpc_get(f->c, u, 10000, on_done, &x[i]);
    }
    free(u);
    assert_int_equal(httpc_active(f->c), N);
    int64_t deadline = util_mono_ms() + 10000;
    for (;;) {
        int done = 0;
        for (int i = 0; i < N; i++)
            done += x[i].ncalls;
        if (done == N || util_mono_ms() > deadline)
            break;
        reactor_run_once(f->r, 20);
    }
    int64_t took = util_mono_ms() - t0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(x[i].ncalls, 1);
        assert_int_equal(x[i].error, 0);
        assert_int_equal(x[i].status, 200);
        assert_string_equal(x[i].body, "late");
        res_release(&x[i]);
    }
    /* One at a time would take 50 x 200 ms = 10 s. */
    assert_true(took < 6000);
    assert_true(atomic_load(&f->s->accepted) > 1);
    assert_int_equal(httpc_active(f->c), 0);
    free(x);
}

static void test_keepalive_reuse(void **state)
{
    struct fx *f = *state;
    enum { N = 10 };
    char *u = url(f, "/hello");
    for (int i = 0; i < N; i++) {
        struct res x = {.f = f};
        httpc_get(f->c, u, 5000, on_done, &x);
        run_until_int(f, &x.ncalls, 1, 5000);
        assert_int_equal(x.error, 0);
        assert_string_equal(x.body, "hello world");
        res_release(&x);
    }
    free(u);
    assert_int_equal(atomic_load(&f->s->requests), N);
    assert_int_equal(atomic_load(&f->s->accepted), 1);
}

/* The server drops an idle keep-alive connection. The client stops watching it without
 * spinning on its level-triggered EOF, and the next request opens a new connection
 * (likely on the same fd number) and completes. */
static void test_idle_connection_closed_by_server(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/bye");
    httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.error, 0);
    assert_string_equal(x.body, "bye");
    res_release(&x);
    /* the server thread closes its end after answering */
    int64_t deadline = util_mono_ms() + 5000;
    for (;;) {
        pthread_mutex_lock(&f->s->mu);
        bool closed = f->s->nconn == 1 && f->s->fd[0] == -1;
        pthread_mutex_unlock(&f->s->mu);
        if (closed || util_mono_ms() > deadline)
            break;
        reactor_run_once(f->r, 5);
    }
    /* No busy loop on the dead idle socket: iterations of 20 ms each, not thousands. */
    int iterations = 0;
    int64_t t0 = util_mono_ms();
    while (util_mono_ms() - t0 < 200) {
        reactor_run_once(f->r, 20);
        iterations++;
    }
    assert_true(iterations < 50);
    for (int i = 0; i < 3; i++) {
        struct res y = {.f = f};
        u = url(f, "/hello");
        httpc_get(f->c, u, 5000, on_done, &y);
        free(u);
        run_until_int(f, &y.ncalls, 1, 5000);
        assert_int_equal(y.ncalls, 1);
        assert_int_equal(y.error, 0);
        assert_string_equal(y.body, "hello world");
        res_release(&y);
    }
    assert_int_equal(atomic_load(&f->s->accepted), 2);
}

static void test_request_from_done(void **state)
{
    struct fx *f = *state;
    enum { N = 6 };
    struct res x[N];
    memset(x, 0, sizeof(x));
    for (int i = 0; i < N; i++) {
        x[i].f = f;
        x[i].chain_next = i + 1 < N ? &x[i + 1] : NULL;
    }
    x[0].chain_left = N - 1;
    char *u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &x[0]);
    free(u);
    run_until_int(f, &x[N - 1].ncalls, 1, 5000);
    for (int i = 0; i < N; i++) {
        assert_int_equal(x[i].ncalls, 1);
        assert_int_equal(x[i].error, 0);
        assert_string_equal(x[i].body, "hello world");
        res_release(&x[i]);
    }
    /* the connection went back to the cache before done ran, so it is reused */
    assert_int_equal(atomic_load(&f->s->accepted), 1);
    assert_int_equal(httpc_active(f->c), 0);
}

static void test_timeout(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/delay?ms=5000");
    int64_t t0 = util_mono_ms();
    httpc_get(f->c, u, 300, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    int64_t took = util_mono_ms() - t0;
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, -ETIMEDOUT);
    assert_true(strlen(x.error_text) > 0);
    assert_int_equal(x.status, 0);
    assert_true(x.elapsed >= 300);
    assert_true(took >= 300);
    assert_true(took < 1500);
    /* the server noticed the connection going away */
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    res_release(&x);
}

static void test_refused(void **state)
{
    struct fx *f = *state;
    /* a port that was free a moment ago and has no listener */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    socklen_t len = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    close(fd);
    char *u = xasprintf("%s://127.0.0.1:%d/x", scheme(), ntohs(sa.sin_port));
    struct res x = {.f = f};
    httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, -ECONNREFUSED);
    assert_int_equal(x.status, 0);
    assert_true(strlen(x.error_text) > 0);
    res_release(&x);
}

static void test_max_response(void **state)
{
    struct fx *f = *state;
    const char *paths[] = {"/big?n=5000", "/bigchunked?n=5000", "/big?n=1000",
                           "/bigchunked?n=1000"};
    const int want[] = {-E2BIG, -E2BIG, 0, 0};
    for (size_t i = 0; i < ARRAY_LEN(paths); i++) {
        struct res x = {.f = f};
        char *u = url(f, paths[i]);
        struct httpc_opts o = {.url = u, .max_response = 1000, .timeout_ms = 5000};
        httpc_request(f->c, &o, on_done, &x);
        free(u);
        run_until_int(f, &x.ncalls, 1, 5000);
        assert_int_equal(x.ncalls, 1);
        assert_int_equal(x.error, want[i]);
        if (want[i] == 0) {
            assert_int_equal(x.body_len, 1000);
            assert_int_equal(strlen(x.body), 1000);
        } else {
            assert_true(x.body_len <= 1000);
        }
        res_release(&x);
    }
}

static void test_streaming(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/stream?n=5&gap=30");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, 0);
    assert_int_equal(x.status, 200);
    assert_int_equal(x.body_len, 0);
    assert_string_equal(x.body, "");
    assert_int_equal(x.nstatus, 1);
    assert_int_equal(x.st_status, 200);
    assert_string_equal(x.st_ctype, "text/event-stream");
    x.stream[x.stream_len] = '\0';
    assert_string_equal(x.stream, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
    /* delivered as it arrived, not at the end */
    assert_true(x.nchunks >= 3);
    assert_int_equal(x.events[0], 'S');
    assert_int_equal(x.events[x.nevents - 1], 'D');
    for (size_t i = 1; i + 1 < x.nevents; i++)
        assert_int_equal(x.events[i], 'C');
    res_release(&x);
}

static void test_streaming_no_body(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/nocontent");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.error, 0);
    assert_int_equal(x.status, 204);
    assert_int_equal(x.nstatus, 1);
    assert_int_equal(x.st_status, 204);
    assert_int_equal(x.nchunks, 0);
    x.events[x.nevents] = '\0';
    assert_string_equal(x.events, "SD");
    res_release(&x);
}

static void test_status_not_2xx(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/status?code=503");
    httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.error, 0); /* an HTTP error is a response, not a transport error */
    assert_int_equal(x.status, 503);
    assert_string_equal(x.body, "no");
    assert_true(x.ctype_null);
    res_release(&x);
}

static void test_abort_from_chunk(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f, .abort_at_chunk = 1};
    char *u = url(f, "/stream?n=20&gap=20");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, -ECANCELED);
    assert_int_equal(x.nchunks, 1);
    assert_int_equal(x.nstatus, 1);
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.nchunks, 1);
    res_release(&x);
}

static void test_abort_from_status(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f, .abort_status = true};
    char *u = url(f, "/stream?n=20&gap=20");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_int_equal(x.error, -ECANCELED);
    assert_int_equal(x.nstatus, 1);
    assert_int_equal(x.nchunks, 0);
    res_release(&x);
}

static void test_cancel_in_flight(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/delay?ms=5000");
    x.req = httpc_get(f->c, u, 10000, on_done, &x);
    run_until_atomic(f, &f->s->requests, 1, 5000);
    assert_int_equal(atomic_load(&f->s->requests), 1);
    httpc_cancel(f->c, x.req);
    assert_int_equal(httpc_active(f->c), 0);
    /* the connection is closed: the server sees it */
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    /* cancel of a request not yet started (no loop iteration in between) */
    struct res y = {.f = f};
    y.req = httpc_get(f->c, u, 10000, on_done, &y);
    httpc_cancel(f->c, y.req);
    /* the client goes on working, and neither cancelled request calls back */
    struct res z = {.f = f};
    free(u);
    u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &z);
    free(u);
    run_until_int(f, &z.ncalls, 1, 5000);
    assert_int_equal(z.error, 0);
    assert_int_equal(x.ncalls, 0);
    assert_int_equal(y.ncalls, 0);
    res_release(&z);
}

static void test_cancel_from_own_chunk(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f, .cancel_at_chunk = 2};
    char *u = url(f, "/stream?n=50&gap=20");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    x.req = httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.nchunks, 2, 5000);
    assert_int_equal(x.nchunks, 2);
    assert_int_equal(httpc_active(f->c), 0);
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    struct res z = {.f = f};
    u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &z);
    free(u);
    run_until_int(f, &z.ncalls, 1, 5000);
    assert_int_equal(z.error, 0);
    assert_int_equal(x.ncalls, 0);
    assert_int_equal(x.nchunks, 2);
    res_release(&z);
}

static void test_cancel_from_own_status(void **state)
{
    struct fx *f = *state;
    const char *paths[] = {"/stream?n=50&gap=20", "/nocontent"};
    for (size_t i = 0; i < ARRAY_LEN(paths); i++) {
        struct res x = {.f = f, .cancel_in_status = true};
        char *u = url(f, paths[i]);
        struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
        x.req = httpc_request(f->c, &o, on_done, &x);
        free(u);
        run_until_int(f, &x.nstatus, 1, 5000);
        assert_int_equal(x.nstatus, 1);
        assert_int_equal(httpc_active(f->c), 0);
        /* the client goes on working; the cancelled one never calls back */
        struct res z = {.f = f};
        u = url(f, "/hello");
        httpc_get(f->c, u, 5000, on_done, &z);
        free(u);
        run_until_int(f, &z.ncalls, 1, 5000);
        assert_int_equal(z.error, 0);
        assert_int_equal(x.ncalls, 0);
        assert_int_equal(x.nchunks, 0);
        res_release(&z);
    }
}

/* A chunk callback starts a request (curl is on the stack: it must be deferred). */
static int chunk_starts_request(const char *data, size_t len, void *arg)
{
    struct res *x = arg;
    if (x->nchunks++ == 0) {
        char *u = url(x->f, "/hello");
        x->chain_next->req = httpc_get(x->f->c, u, 5000, on_done, x->chain_next);
        free(u);
    }
    return 0;
}

static void test_request_from_chunk(void **state)
{
    struct fx *f = *state;
    struct res y = {.f = f};
    struct res x = {.f = f, .chain_next = &y};
    char *u = url(f, "/stream?n=3&gap=10");
    struct httpc_opts o = {.url = u, .on_chunk = chunk_starts_request};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    run_until_int(f, &y.ncalls, 1, 5000);
    assert_int_equal(x.error, 0);
    assert_int_equal(y.ncalls, 1);
    assert_int_equal(y.error, 0);
    assert_string_equal(y.body, "hello world");
    res_release(&x);
    res_release(&y);
}

static void test_cancel_other_from_done(void **state)
{
    struct fx *f = *state;
    struct res b = {.f = f};
    char *u = url(f, "/delay?ms=5000");
    b.req = httpc_get(f->c, u, 10000, on_done, &b);
    free(u);
    run_until_atomic(f, &f->s->requests, 1, 5000);
    struct res a = {.f = f, .cancel_in_done = b.req};
    u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &a);
    free(u);
    run_until_int(f, &a.ncalls, 1, 5000);
    assert_int_equal(a.error, 0);
    assert_int_equal(httpc_active(f->c), 0);
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    assert_int_equal(b.ncalls, 0);
    res_release(&a);
}

static void test_free_in_flight(void **state)
{
    struct fx *f = *state;
    enum { N = 5 };
    struct res x[N + 1];
    memset(x, 0, sizeof(x));
    char *u = url(f, "/delay?ms=5000");
    for (int i = 0; i < N; i++) {
        x[i].f = f;
        httpc_get(f->c, u, 10000, on_done, &x[i]);
    }
    free(u);
    x[N].f = f;
    u = url(f, "/stream?n=100&gap=20");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x[N]);
    free(u);
    run_until_int(f, &x[N].nchunks, 1, 5000);
    run_until_atomic(f, &f->s->requests, N + 1, 5000);
    assert_int_equal(atomic_load(&f->s->requests), N + 1);
    /* one that never got to curl */
    struct res late = {.f = f};
    httpc_get(f->c, tls_mode ? "https://127.0.0.1:1/" : "http://127.0.0.1:1/", 1000, on_done,
              &late);
    int chunks = x[N].nchunks;
    httpc_free(f->c);
    f->c = NULL;
    /* every connection is closed, and nothing calls back while the loop goes on */
    run_until_atomic(f, &f->s->aborted, N + 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), N + 1);
    for (int i = 0; i < 5; i++)
        reactor_run_once(f->r, 10);
    for (int i = 0; i <= N; i++)
        assert_int_equal(x[i].ncalls, 0);
    assert_int_equal(x[N].nchunks, chunks);
    assert_int_equal(late.ncalls, 0);
}

static void test_free_from_done(void **state)
{
    struct fx *f = *state;
    struct res b = {.f = f};
    char *u = url(f, "/delay?ms=5000");
    httpc_get(f->c, u, 10000, on_done, &b);
    free(u);
    run_until_atomic(f, &f->s->requests, 1, 5000);
    struct res a = {.f = f, .free_in_done = true};
    u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &a);
    free(u);
    run_until_int(f, &a.ncalls, 1, 5000);
    assert_int_equal(a.ncalls, 1);
    assert_null(f->c);
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    assert_int_equal(b.ncalls, 0);
    res_release(&a);
}

static void test_free_from_chunk(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f, .free_at_chunk = 2};
    char *u = url(f, "/stream?n=50&gap=20");
    struct httpc_opts o = {.url = u, .on_status = on_status, .on_chunk = on_chunk};
    httpc_request(f->c, &o, on_done, &x);
    free(u);
    run_until_int(f, &x.nchunks, 2, 5000);
    assert_null(f->c);
    run_until_atomic(f, &f->s->aborted, 1, 5000);
    assert_int_equal(atomic_load(&f->s->aborted), 1);
    assert_int_equal(x.nchunks, 2);
    assert_int_equal(x.ncalls, 0);
}

/* A mixed crowd: successes, timeouts, aborts, early and late cancels, all at once.
 * Every request not cancelled calls back exactly once, and the count returns to 0. */
static void test_mixed_crowd(void **state)
{
    struct fx *f = *state;
    enum { N = 120 };
    struct res *x = xcalloc(N, sizeof(*x));
    bool *cancelled = xcalloc(N, sizeof(*cancelled));
    unsigned seed = 12345;
    for (int i = 0; i < N; i++) {
        x[i].f = f;
        seed = seed * 1103515245u + 12345u;
        int mode = (int)((seed >> 16) % 6);
        struct httpc_opts o = {.timeout_ms = 5000};
        char *u;
        switch (mode) {
        case 0:
            u = url(f, "/hello");
            break;
        case 1: /* times out */
            u = url(f, "/delay?ms=2000");
            o.timeout_ms = 100;
            break;
        case 2: /* aborted by its chunk callback */
            u = url(f, "/stream?n=10&gap=5");
            o.on_chunk = on_chunk;
            x[i].abort_at_chunk = 2;
            break;
        case 3: /* cancelled from its chunk callback */
            u = url(f, "/stream?n=10&gap=5");
            o.on_chunk = on_chunk;
            x[i].cancel_at_chunk = 1;
            cancelled[i] = true;
            break;
        default: /* cancelled from outside, now or later */
            u = url(f, "/delay?ms=50");
            break;
        }
        o.url = u;
        x[i].req = httpc_request(f->c, &o, on_done, &x[i]);
        free(u);
        if (mode == 4) {
            httpc_cancel(f->c, x[i].req);
            cancelled[i] = true;
        }
    }
    for (int iter = 0; iter < 3; iter++)
        reactor_run_once(f->r, 10);
    for (int i = 0; i < N; i++) {
        if (!cancelled[i] && x[i].ncalls == 0 && i % 6 == 5) {
            httpc_cancel(f->c, x[i].req);
            cancelled[i] = true;
        }
    }
    int64_t deadline = util_mono_ms() + 10000;
    while (httpc_active(f->c) > 0 && util_mono_ms() < deadline)
        reactor_run_once(f->r, 20);
    assert_int_equal(httpc_active(f->c), 0);
    int ok = 0, timedout = 0, aborted = 0;
    for (int i = 0; i < N; i++) {
        if (cancelled[i]) {
            assert_int_equal(x[i].ncalls, 0);
        } else {
            assert_int_equal(x[i].ncalls, 1);
            ok += x[i].error == 0;
            timedout += x[i].error == -ETIMEDOUT;
            aborted += x[i].error == -ECANCELED;
        }
        res_release(&x[i]);
    }
    assert_true(ok > 0 && timedout > 0 && aborted > 0);
    free(x);
    free(cancelled);
}

static void test_close_without_response(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f};
    char *u = url(f, "/close");
    httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    assert_int_equal(x.ncalls, 1);
    assert_true(x.error == -EIO || x.error == -EPROTO);
    assert_int_equal(x.status, 0);
    assert_true(strlen(x.error_text) > 0);
    res_release(&x);
}

static void test_bad_request(void **state)
{
    struct fx *f = *state;
    struct res x = {.f = f}, y = {.f = f};
    struct httpc_opts o = {.url = NULL};
    struct httpc_req *q = httpc_request(f->c, &o, on_done, &x);
    assert_non_null(q);
    assert_int_equal(x.ncalls, 0); /* not from inside httpc_request */
    assert_int_equal(httpc_active(f->c), 1);
    /* alone: nothing but the client itself can wake the loop for it */
    run_until_int(f, &x.ncalls, 1, 2000);
    assert_int_equal(x.error, -EINVAL);
    assert_int_equal(httpc_active(f->c), 0);
    httpc_get(f->c, "ftp://127.0.0.1/x", 1000, on_done, &y);
    run_until_int(f, &y.ncalls, 1, 2000);
    assert_true(y.error < 0);
    assert_int_equal(httpc_active(f->c), 0);
    res_release(&x);
    res_release(&y);
}

static void test_proxy_env_ignored(void **state)
{
    struct fx *f = *state;
    /* an operator's proxy (here: nothing listens there) must not capture our traffic */
    setenv("http_proxy", "http://127.0.0.1:1", 1);
    setenv("HTTP_PROXY", "http://127.0.0.1:1", 1);
    setenv("https_proxy", "http://127.0.0.1:1", 1);
    setenv("HTTPS_PROXY", "http://127.0.0.1:1", 1);
    setenv("ALL_PROXY", "http://127.0.0.1:1", 1);
    struct res x = {.f = f};
    char *u = url(f, "/hello");
    httpc_get(f->c, u, 5000, on_done, &x);
    free(u);
    run_until_int(f, &x.ncalls, 1, 5000);
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("https_proxy");
    unsetenv("HTTPS_PROXY");
    unsetenv("ALL_PROXY");
    assert_int_equal(x.error, 0);
    assert_string_equal(x.body, "hello world");
    res_release(&x);
}

static int group_plain(void **state)
{
    tls_mode = false;
    return 0;
}

static int group_tls(void **state)
{
    tls_mode = true;
    if (tlsfix_make() != 0)
        return -1;
    /* the "system store" of httpc_get/httpc_post_json, which pass no TLS settings */
    setenv("SSL_CERT_FILE", tlsfix("ca.crt"), 1);
    return 0;
}

static int group_tls_end(void **state)
{
    unsetenv("SSL_CERT_FILE");
    tlsfix_cleanup();
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the scripted server's OpenSSL writes with write(2) */
    if (getenv("TEST_ONLY")) /* a glob, for working on one case */
        cmocka_set_test_filter(getenv("TEST_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_get, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_50, setup, teardown),
        cmocka_unit_test_setup_teardown(test_keepalive_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_connection_closed_by_server, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_from_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming_no_body, setup, teardown),
        cmocka_unit_test_setup_teardown(test_status_not_2xx, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_from_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_from_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_from_own_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_from_own_status, setup, teardown),
        cmocka_unit_test_setup_teardown(test_request_from_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancel_other_from_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_from_done, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_from_chunk, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mixed_crowd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_without_response, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_request, setup, teardown),
        cmocka_unit_test_setup_teardown(test_proxy_env_ignored, setup, teardown),
    };
    int failed = cmocka_run_group_tests_name("http", tests, group_plain, NULL);
    failed += cmocka_run_group_tests_name("https", tests, group_tls, group_tls_end);
    return failed;
}
