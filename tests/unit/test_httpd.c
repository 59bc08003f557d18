/* httpd against a client nobody here wrote: the curl command-line tool, run from a
 * second thread while the reactor runs on the test's main thread (CONVENTIONS §19: real
 * sockets on 127.0.0.1, port 0, everything bounded by deadlines). Every case runs twice:
 * over plain HTTP and over TLS (curl verifying the server against the test CA). The
 * routing tables, pure, run once. TLS-only cases are in test_httpd_tls.c. */
#include "common/httpd.h"
#include "common/httpd_internal.h"
#include "common/log.h"
#include "common/reactor.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tlsfix.h"

#define CLIENT_TIMEOUT_MS 8000
#define LOOP_DEADLINE_MS 15000

/* curl's exit codes (its CURLcode numbers) */
#define CURLE_OK 0
#define CURLE_WRITE_ERROR 23
#define CURLE_OPERATION_TIMEDOUT 28

extern char **environ;

/* This group's transport (TLS: the certificates of tlsfix.h). */
static bool tls_mode;

/* ---- client side ------------------------------------------------------------------- */

struct call {
    /* request */
    const char *method; /* NULL = GET */
    char url[256];
    const char *body;
    size_t body_len;
    size_t chunked_len; /* > 0: upload this many bytes with chunked encoding */
    const char *headers[4];
    int conn;           /* > 0: consecutive calls of a job with the same conn share one curl
                         * process, hence one kept-alive connection */
    const char *cainfo, *cert, *key;
    size_t abort_after;            /* > 0: stop reading once this many bytes arrived */
    long timeout_ms;               /* 0 = CLIENT_TIMEOUT_MS */
    bool keep_expect;              /* let curl send "Expect: 100-continue" */
    atomic_bool *first_chunk_seen; /* set once any body byte arrived */
    /* response */
    int rc; /* curl's exit code for this transfer */
    long status;
    long connects;
    struct strbuf body_in;
    char allow[128];
    char content_type[128];
    char content_length[32];
    char transfer_encoding[32];
};

static void copy_header_value(char *dst, size_t cap, const char *line, size_t len, size_t skip)
{
    size_t v = skip;
    while (v < len && line[v] == ' ')
        v++;
    size_t e = len;
    while (e > v && (line[e - 1] == '\r' || line[e - 1] == '\n'))
        e--;
    snprintf(dst, cap, "%.*s", (int)(e - v), line + v);
}

/* The last response head in curl's -D file (a 100 Continue may come first). */
static void read_headers(struct call *c, const char *path)
{
    char *t = util_read_file(path, 1 << 20, NULL);
    if (!t)
        return;
    const char *head = t;
    for (const char *p = t; (p = strstr(p, "HTTP/")) != NULL; p++)
        if (p == t || p[-1] == '\n')
            head = p;
    for (const char *line = head; *line;) {
        const char *nl = strchrnul(line, '\n');
        size_t len = (size_t)(nl - line);
        if (len > 6 && strncasecmp(line, "Allow:", 6) == 0)
            copy_header_value(c->allow, sizeof(c->allow), line, len, 6);
        if (len > 13 && strncasecmp(line, "Content-Type:", 13) == 0)
            copy_header_value(c->content_type, sizeof(c->content_type), line, len, 13);
        if (len > 15 && strncasecmp(line, "Content-Length:", 15) == 0)
            copy_header_value(c->content_length, sizeof(c->content_length), line, len, 15);
        if (len > 18 && strncasecmp(line, "Transfer-Encoding:", 18) == 0)
            copy_header_value(c->transfer_encoding, sizeof(c->transfer_encoding), line, len, 18);
        line = *nl ? nl + 1 : nl;
    }
    free(t);
}

struct argv {
    char *v[4096];
    int n;
};

static void argv_add(struct argv *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void argv_add(struct argv *a, const char *fmt, ...)
{
    if (a->n >= (int)ARRAY_LEN(a->v) - 1)
        abort(); /* no cmocka asserts off the main thread */
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&a->v[a->n], fmt, ap) < 0)
        abort();
    va_end(ap);
    a->v[++a->n] = NULL;
}

static void write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || util_write_all(fd, data, len) != 0)
        abort();
    close(fd);
}

/* The options of one transfer (files named after its index i in dir). */
static void transfer_args(struct argv *a, struct call *c, const char *dir, size_t i, bool to_pipe)
{
    strbuf_init(&c->body_in, 64 << 20);
    argv_add(a, "-sS");
    argv_add(a, "-g"); /* [::1] is a literal, not a glob */
    argv_add(a, "--http1.1");
    argv_add(a, "--noproxy");
    argv_add(a, "*");
    argv_add(a, "-N");
    argv_add(a, "-o");
    argv_add(a, to_pipe ? "-" : "%s/body%zu", dir, i);
    argv_add(a, "-D");
    argv_add(a, "%s/head%zu", dir, i);
    argv_add(a, "-w");
    argv_add(a, "%%{stderr}W %%{http_code} %%{num_connects} %%{exitcode}\\n");
    argv_add(a, "--max-time");
    argv_add(a, "%.3f", (double)(c->timeout_ms ? c->timeout_ms : CLIENT_TIMEOUT_MS) / 1000.0);
    for (size_t k = 0; k < ARRAY_LEN(c->headers) && c->headers[k]; k++) {
        argv_add(a, "-H");
        argv_add(a, "%s", c->headers[k]);
    }
    if (c->chunked_len) {
        char *up = xmalloc(c->chunked_len);
        memset(up, 'x', c->chunked_len);
        char *path = xasprintf("%s/up%zu", dir, i);
        write_file(path, up, c->chunked_len);
        free(up);
        argv_add(a, "-H");
        argv_add(a, "Transfer-Encoding: chunked");
        argv_add(a, "-H");
        argv_add(a, "Expect:");
        argv_add(a, "-X");
        argv_add(a, "%s", c->method ? c->method : "POST");
        argv_add(a, "--data-binary");
        argv_add(a, "@%s", path);
        free(path);
    } else if (c->body) {
        char *path = xasprintf("%s/up%zu", dir, i);
        write_file(path, c->body, c->body_len);
        argv_add(a, "--data-binary");
        argv_add(a, "@%s", path);
        free(path);
        argv_add(a, "-H");
        argv_add(a, "%s", c->keep_expect ? "Expect: 100-continue" : "Expect:");
        if (c->method) {
            argv_add(a, "-X");
            argv_add(a, "%s", c->method);
        }
    } else if (c->method && strcmp(c->method, "HEAD") == 0) {
        argv_add(a, "--head");
    } else if (c->method) {
        argv_add(a, "-X");
        argv_add(a, "%s", c->method);
    }
    const char *ca = c->cainfo ? c->cainfo : (tls_mode ? tlsfix("ca.crt") : NULL);
    if (ca) {
        argv_add(a, "--cacert");
        argv_add(a, "%s", ca);
    }
    if (c->cert) {
        argv_add(a, "--cert");
        argv_add(a, "%s", c->cert);
        argv_add(a, "--key");
        argv_add(a, "%s", c->key);
    }
    argv_add(a, "%s", c->url);
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : 0;
}

/* Run calls[0..n) in one curl process (one connection kept alive across them). */
static void run_curl(struct call **calls, size_t n)
{
    char dir[] = "/tmp/motor-httpd-curl-XXXXXX";
    if (!mkdtemp(dir))
        abort();
    static _Thread_local struct argv a;
    a.n = 0;
    argv_add(&a, "curl");
    bool to_pipe = n == 1 && calls[0]->abort_after > 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            argv_add(&a, "--next");
        transfer_args(&a, calls[i], dir, i, to_pipe);
    }
    char *errpath = xasprintf("%s/stderr", dir);
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0)
        abort();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    if (posix_spawnp(&pid, "curl", &fa, NULL, a.v, environ) != 0)
        abort();
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    /* While it runs: stream bodies seen, and a body read from the pipe and dropped. */
    int st = 0;
    bool reading = true;
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            struct call *c = calls[i];
            if (c->first_chunk_seen && !atomic_load(c->first_chunk_seen)) {
                char *bp = xasprintf("%s/body%zu", dir, i);
                if (file_size(bp) > 0)
                    atomic_store(c->first_chunk_seen, true);
                free(bp);
            }
        }
        if (reading) {
            struct pollfd p = {.fd = out[0], .events = POLLIN};
            if (poll(&p, 1, 2) > 0) {
                char buf[65536];
                ssize_t r = read(out[0], buf, sizeof(buf));
                if (r > 0 && to_pipe) {
                    strbuf_append(&calls[0]->body_in, buf, (size_t)r);
                    if (calls[0]->body_in.len >= calls[0]->abort_after) {
                        close(out[0]); /* curl's next write fails: CURLE_WRITE_ERROR */
                        reading = false;
                    }
                } else if (r <= 0) {
                    close(out[0]);
                    reading = false;
                }
            }
        } else {
            usleep(2000);
        }
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            break;
    }
    if (reading)
        close(out[0]);
    /* one "W status connects exitcode" line per transfer, in order */
    char *err = util_read_file(errpath, 1 << 20, NULL);
    size_t k = 0;
    for (char *line = err; line && *line && k < n;) {
        char *nl = strchrnul(line, '\n');
        long status = 0, connects = 0;
        int rc = 0;
        if (sscanf(line, "W %ld %ld %d", &status, &connects, &rc) == 3) {
            calls[k]->status = status;
            calls[k]->connects = connects;
            calls[k]->rc = rc;
            k++;
        }
        line = *nl ? nl + 1 : nl;
    }
    if (k < n) /* curl died early: say so */
        fprintf(stderr, "curl ended early (status %d): %s\n", st, err ? err : "");
    for (; k < n; k++)
        calls[k]->rc = WIFEXITED(st) && WEXITSTATUS(st) ? WEXITSTATUS(st) : 255;
    for (size_t i = 0; i < n; i++) {
        char *hp = xasprintf("%s/head%zu", dir, i);
        read_headers(calls[i], hp);
        free(hp);
        bool head = calls[i]->method && strcmp(calls[i]->method, "HEAD") == 0;
        if (!to_pipe && !head) { /* with --head, curl writes the head there */
            char *bp = xasprintf("%s/body%zu", dir, i);
            size_t len = 0;
            char *b = util_read_file(bp, 64 << 20, &len);
            if (b)
                strbuf_append(&calls[i]->body_in, b, len);
            free(b);
            free(bp);
        }
    }
    free(err);
    free(errpath);
    for (int i = 0; i < a.n; i++)
        free(a.v[i]);
    char *rm = xasprintf("rm -rf %s", dir);
    if (system(rm) != 0)
        abort();
    free(rm);
}

static void call_release(struct call *c)
{
    strbuf_release(&c->body_in);
}

/* A client thread runs a list of calls in order. */
struct job {
    struct reactor *r;
    struct call **calls;
    size_t ncalls;
    atomic_bool done;
    pthread_t th;
};

static void wake(void *arg)
{
    (void)arg;
}

static void *job_main(void *jarg)
{
    struct job *j = jarg;
    for (size_t i = 0; i < j->ncalls;) {
        size_t n = 1;
        while (j->calls[i]->conn > 0 && i + n < j->ncalls &&
               j->calls[i + n]->conn == j->calls[i]->conn)
            n++;
        run_curl(j->calls + i, n);
        i += n;
    }
    atomic_store(&j->done, true);
    reactor_post(j->r, wake, NULL); /* wake the loop so it notices promptly */
    return NULL;
}

static void job_start(struct job *j, struct reactor *r, struct call **calls, size_t n)
{
    j->r = r;
    j->calls = calls;
    j->ncalls = n;
    atomic_init(&j->done, false);
    assert_int_equal(pthread_create(&j->th, NULL, job_main, j), 0);
}

/* Run the loop until pred() or every job is done; fails the test on the deadline. */
static void loop_until(struct reactor *r, bool (*pred)(void *), void *arg)
{
    int64_t deadline = util_mono_ms() + LOOP_DEADLINE_MS;
    while (!pred(arg)) {
        if (util_mono_ms() > deadline)
            fail_msg("deadline passed waiting for an event");
        reactor_run_once(r, 50);
    }
}

static bool job_done(void *arg)
{
    return atomic_load(&((struct job *)arg)->done);
}

static void job_wait(struct job *j)
{
    loop_until(j->r, job_done, j);
    pthread_join(j->th, NULL);
}

/* One request from a client thread while the reactor runs here. */
static void run_calls(struct reactor *r, struct call **calls, size_t n)
{
    struct job j;
    job_start(&j, r, calls, n);
    job_wait(&j);
}

static void run_call(struct reactor *r, struct call *c)
{
    run_calls(r, &c, 1);
}

/* ---- server side --------------------------------------------------------------------- */

struct srv {
    struct reactor *r;
    struct httpd *h;
    char base[64];
    /* async / stream state */
    struct reactor_timer timer;
    struct httpd_req *held;
    int closes;
    bool gone_at_close;
    int write_at_close;
    int handled;
    int stream_i;
    atomic_bool client_saw_first;
    int overflow_rc;
};

/* In TLS mode, make cfg a TLS listener (the test CA's server certificate). */
static void with_tls(struct httpd_config *cfg)
{
    if (tls_mode) {
        cfg->tls_cert_file = tlsfix("srv.crt");
        cfg->tls_key_file = tlsfix("srv.key");
    }
}

static void srv_start(struct srv *s, struct httpd_config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->r = reactor_new();
    assert_non_null(s->r);
    reactor_timer_init(&s->timer, NULL, s);
    cfg->host = cfg->host ? cfg->host : "127.0.0.1";
    with_tls(cfg);
    s->h = httpd_new(s->r, cfg);
    assert_non_null(s->h);
    assert_true(httpd_port(s->h) > 0);
    snprintf(s->base, sizeof(s->base), "%s://127.0.0.1:%u", tls_mode ? "https" : "http",
             httpd_port(s->h));
}

static void srv_stop(struct srv *s)
{
    reactor_timer_stop(s->r, &s->timer);
    httpd_free(s->h);
    reactor_free(s->r);
}

static void url(struct call *c, const struct srv *s, const char *path)
{
    snprintf(c->url, sizeof(c->url), "%s%s", s->base, path);
}

/* ---- handlers -------------------------------------------------------------------------- */

static void h_item(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    const char *q = httpd_req_query(req, "q");
    json_t *j = json_pack("{s:s, s:s, s:s?, s:s?, s:s, s:s?}", "id", httpd_req_param(req, "id"),
                          "name", httpd_req_param(req, "name"), "q", q, "ua",
                          httpd_req_header(req, "x-TEST-header"), "method", httpd_req_method(req),
                          "missing", httpd_req_param(req, "nope"));
    httpd_respond_json(req, 200, j);
}

static void h_echo_json(struct httpd_req *req, void *arg)
{
    char err[128];
    json_t *j = httpd_req_json(req, err, sizeof(err));
    if (!j) {
        httpd_respond_error(req, 422, err);
        return;
    }
    httpd_respond_json(req, 200, j);
}

static void h_body_len(struct httpd_req *req, void *arg)
{
    size_t len = 0;
    httpd_req_body(req, &len);
    char buf[32];
    int n = snprintf(buf, sizeof(buf), "%zu", len);
    httpd_respond(req, 200, "text/plain", buf, (size_t)n);
}

static void h_ok(struct httpd_req *req, void *arg)
{
    httpd_add_header(req, "X-Extra", "yes");
    httpd_respond(req, 200, "text/plain", "ok", 2);
}

static void on_close_count(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->closes++;
    s->gone_at_close = httpd_req_client_gone(req);
    if (req == s->held) {
        s->write_at_close = httpd_stream_write(req, "x", 1);
        s->held = NULL;
    }
}

static void answer_later(struct reactor *r, void *arg)
{
    struct srv *s = arg;
    assert_non_null(s->held);
    httpd_respond(s->held, 202, NULL, "{\"late\":true}", 13);
}

static void h_async(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->held = req;
    httpd_req_on_close(req, on_close_count, s);
    reactor_timer_init(&s->timer, answer_later, s);
    reactor_timer_start(s->r, &s->timer, 100, 0);
}

static void h_never(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    httpd_req_on_close(req, on_close_count, s);
}

/* Streams "data: i" events; after the first one it waits until the client has seen it,
 * which proves chunks are flushed while the stream is still open. */
static void stream_tick(struct reactor *r, void *arg)
{
    struct srv *s = arg;
    if (!s->held)
        return;
    if (s->stream_i >= 1 && !atomic_load(&s->client_saw_first)) {
        reactor_timer_start(r, &s->timer, 5, 0);
        return;
    }
    if (s->stream_i == 6) {
        httpd_stream_end(s->held, false);
        return;
    }
    char ev[32];
    int n = snprintf(ev, sizeof(ev), "data: %d\n\n", s->stream_i++);
    assert_int_equal(httpd_stream_write(s->held, ev, (size_t)n), 0);
    reactor_timer_start(r, &s->timer, 5, 0);
}

static void stream_close(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    on_close_count(req, arg);
    s->held = NULL;
}

static void h_sse(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->held = req;
    s->stream_i = 0;
    httpd_req_on_close(req, stream_close, s);
    httpd_add_header(req, "Cache-Control", "no-cache");
    httpd_stream_begin(req, 200, "text/event-stream");
    reactor_timer_init(&s->timer, stream_tick, s);
    reactor_timer_start(s->r, &s->timer, 0, 0);
}

/* Writes one event and then one more every 20 ms until the client is gone. */
static void drip_tick(struct reactor *r, void *arg)
{
    struct srv *s = arg;
    if (!s->held)
        return;
    int rc = httpd_stream_write(s->held, "data: more\n\n", 12);
    if (rc == 0)
        reactor_timer_start(r, &s->timer, 20, 0);
}

static void h_drip(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->held = req;
    httpd_req_on_close(req, on_close_count, s);
    httpd_stream_begin(req, 200, "text/event-stream");
    assert_int_equal(httpd_stream_write(req, "data: first\n\n", 13), 0);
    reactor_timer_init(&s->timer, drip_tick, s);
    reactor_timer_start(s->r, &s->timer, 20, 0);
}

static void h_stream_open(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    httpd_req_on_close(req, on_close_count, s);
    httpd_stream_begin(req, 200, "text/event-stream");
    assert_int_equal(httpd_stream_write(req, "data: 1\n\n", 9), 0);
}

static void h_overflow(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    httpd_stream_begin(req, 200, "application/octet-stream");
    size_t big = (8u << 20) + 1;
    char *buf = xcalloc(1, big);
    s->overflow_rc = httpd_stream_write(req, buf, big);
    free(buf);
    /* after an overflow the stream is finished: writes are refused */
    assert_int_not_equal(httpd_stream_write(req, "x", 1), 0);
}

/* ---- tests: pure matching ------------------------------------------------------------------ */

static void test_path_match_table(void **state)
{
    static const struct {
        const char *pattern, *path;
        bool match;
        size_t nparams;
        const char *v0;
    } cases[] = {
        {"/", "/", true, 0, NULL},
        {"/a", "/a", true, 0, NULL},
        {"/a", "/a/", false, 0, NULL},
        {"/a/", "/a", false, 0, NULL},
        {"/a", "/b", false, 0, NULL},
        {"/a/b", "/a", false, 0, NULL},
        {"/a", "/ab", false, 0, NULL},
        {"/{id}", "/x", true, 1, "x"},
        {"/{id}", "/", false, 0, NULL},
        {"/e/{id}/logs", "/e/7/logs", true, 1, "7"},
        {"/e/{id}/logs", "/e//logs", false, 0, NULL},
        {"/e/{id}/logs", "/e/7/log", false, 0, NULL},
        {"/e/{id}", "/e/7/logs", false, 0, NULL},
        {"/{a}/{b}", "/1/2", true, 2, "1"},
        {"relative", "relative", false, 0, NULL},
        {"/a", "", false, 0, NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct httpd_params ps;
        bool m = httpd_path_match(cases[i].pattern, cases[i].path, &ps);
        if (m != cases[i].match)
            fail_msg("case %zu: %s vs %s", i, cases[i].pattern, cases[i].path);
        if (m) {
            assert_int_equal(ps.n, cases[i].nparams);
            if (cases[i].v0) {
                assert_int_equal(ps.p[0].value_len, strlen(cases[i].v0));
                assert_memory_equal(ps.p[0].value, cases[i].v0, strlen(cases[i].v0));
            }
        }
    }
    assert_true(httpd_pattern_valid("/a/{id}/b"));
    assert_false(httpd_pattern_valid("/a/{}/b"));
    assert_false(httpd_pattern_valid("/a/x{id}"));
    assert_false(httpd_pattern_valid("/a/{i{d}"));
    assert_false(httpd_pattern_valid("a"));
    assert_false(httpd_pattern_valid("/{a}/{b}/{c}/{d}/{e}/{f}/{g}/{h}/{i}"));
}

static void test_routes_find(void **state)
{
    struct httpd_route_entry rt[] = {
        {.method = "GET", .pattern = "/x/{id}"},
        {.method = "POST", .pattern = "/x/{id}"},
        {.method = "DELETE", .pattern = "/x/{other}"},
        {.method = "GET", .pattern = "/x/special"}, /* shadowed: first match wins */
    };
    struct httpd_params ps;
    size_t idx = 99;
    char allow[64];
    assert_int_equal(httpd_routes_find(rt, 4, "POST", "/x/1", &idx, &ps, allow, sizeof(allow)),
                     HTTPD_MATCH_FOUND);
    assert_int_equal(idx, 1);
    assert_int_equal(httpd_routes_find(rt, 4, "GET", "/x/special", &idx, &ps, allow, sizeof(allow)),
                     HTTPD_MATCH_FOUND);
    assert_int_equal(idx, 0);
    assert_int_equal(httpd_routes_find(rt, 4, "HEAD", "/x/1", &idx, &ps, allow, sizeof(allow)),
                     HTTPD_MATCH_FOUND);
    assert_int_equal(httpd_routes_find(rt, 4, "PUT", "/x/1", &idx, &ps, allow, sizeof(allow)),
                     HTTPD_MATCH_BAD_METHOD);
    assert_string_equal(allow, "GET, HEAD, POST, DELETE");
    assert_int_equal(httpd_routes_find(rt, 4, "GET", "/y", &idx, &ps, allow, sizeof(allow)),
                     HTTPD_MATCH_NO_PATH);
    /* a tiny Allow buffer is truncated, never overrun */
    char tiny[6];
    assert_int_equal(httpd_routes_find(rt, 4, "PUT", "/x/1", &idx, &ps, tiny, sizeof(tiny)),
                     HTTPD_MATCH_BAD_METHOD);
    assert_true(strlen(tiny) < sizeof(tiny));
}

/* ---- tests: over the wire ------------------------------------------------------------------- */

static void test_routing_query_404_405(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-routing"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/items/{id}/sub/{name}", h_item, &s, 0);
    httpd_route(s.h, "DELETE", "/items/{id}/sub/{name}", h_item, &s, 0);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);

    struct call a = {.headers = {"X-Test-Header: hdr-value"}};
    url(&a, &s, "/items/42/sub/al+pha?q=a+b%26c&z=1");
    struct call b = {0};
    url(&b, &s, "/nowhere");
    struct call c = {.method = "POST", .body = "{}", .body_len = 2};
    url(&c, &s, "/items/1/sub/2");
    struct call d = {.method = "HEAD"};
    url(&d, &s, "/ok");
    struct call e = {.method = "DELETE"};
    url(&e, &s, "/items/9/sub/z");
    struct call *calls[] = {&a, &b, &c, &d, &e};
    run_calls(s.r, calls, ARRAY_LEN(calls));

    assert_int_equal(a.rc, CURLE_OK);
    assert_int_equal(a.status, 200);
    assert_string_equal(a.content_type, "application/json");
    json_t *j = json_loads(strbuf_str(&a.body_in), 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "id")), "42");
    assert_string_equal(json_string_value(json_object_get(j, "name")), "al+pha");
    assert_string_equal(json_string_value(json_object_get(j, "q")), "a b&c");
    assert_string_equal(json_string_value(json_object_get(j, "ua")), "hdr-value");
    assert_true(json_is_null(json_object_get(j, "missing")));
    json_decref(j);

    assert_int_equal(b.status, 404);
    assert_string_equal(strbuf_str(&b.body_in), "{\"detail\":\"Not Found\"}");
    assert_int_equal(c.status, 405);
    assert_string_equal(strbuf_str(&c.body_in), "{\"detail\":\"Method Not Allowed\"}");
    assert_string_equal(c.allow, "GET, HEAD, DELETE");
    assert_int_equal(d.status, 200);
    /* HEAD: the GET's length, no body (test_httpd_native checks the bytes) */
    assert_string_equal(d.content_length, "2");
    assert_int_equal(e.status, 200);
    assert_int_equal(s.handled, 2);
    for (size_t i = 0; i < ARRAY_LEN(calls); i++)
        call_release(calls[i]);
    srv_stop(&s);
}

static void test_json_body(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-json"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "POST", "/echo", h_echo_json, &s, 0);
    const char *good = "{\"a\":[1,2,{\"b\":\"\\u00e9\"}],\"n\":null}";
    struct call a = {.method = "POST", .body = good, .body_len = strlen(good)};
    url(&a, &s, "/echo");
    struct call b = {.method = "POST", .body = "{\"a\":", .body_len = 5};
    url(&b, &s, "/echo");
    struct call c = {.method = "POST", .body = "", .body_len = 0};
    url(&c, &s, "/echo");
    struct call *calls[] = {&a, &b, &c};
    run_calls(s.r, calls, 3);
    assert_int_equal(a.status, 200);
    assert_string_equal(strbuf_str(&a.body_in), "{\"a\":[1,2,{\"b\":\"\xc3\xa9\"}],\"n\":null}");
    assert_int_equal(b.status, 422);
    json_t *j = json_loads(strbuf_str(&b.body_in), 0, NULL);
    assert_non_null(j);
    assert_non_null(strstr(json_string_value(json_object_get(j, "detail")), "invalid JSON"));
    json_decref(j);
    assert_int_equal(c.status, 422);
    for (size_t i = 0; i < 3; i++)
        call_release(calls[i]);
    srv_stop(&s);
}

static void test_body_cap_413(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-413", .max_body = 1024};
    srv_start(&s, &cfg);
    httpd_route(s.h, "POST", "/len", h_body_len, &s, 0);
    char *big = xmalloc(4096);
    memset(big, 'a', 4096);
    struct call ok = {.method = "POST", .body = big, .body_len = 1024};
    url(&ok, &s, "/len");
    struct call cl = {.method = "POST", .body = big, .body_len = 4096};
    url(&cl, &s, "/len");
    struct call ch = {.method = "POST", .chunked_len = 256 * 1024};
    url(&ch, &s, "/len");
    struct call chs = {.method = "POST", .chunked_len = 1000};
    url(&chs, &s, "/len");
    /* with "Expect: 100-continue" the 413 comes instead of the 100: no body is sent */
    struct call ex = {.method = "POST", .body = big, .body_len = 4096, .keep_expect = true};
    url(&ex, &s, "/len");
    struct call *calls[] = {&ok, &cl, &ch, &chs, &ex};
    run_calls(s.r, calls, ARRAY_LEN(calls));
    assert_int_equal(ok.status, 200);
    assert_string_equal(strbuf_str(&ok.body_in), "1024");
    assert_int_equal(cl.status, 413);
    assert_string_equal(strbuf_str(&cl.body_in), "{\"detail\":\"request body too large\"}");
    assert_int_equal(ch.status, 413);
    assert_string_equal(strbuf_str(&ch.body_in), "{\"detail\":\"request body too large\"}");
    assert_int_equal(chs.status, 200);
    assert_string_equal(strbuf_str(&chs.body_in), "1000");
    assert_int_equal(ex.status, 413);
    free(big);
    for (size_t i = 0; i < ARRAY_LEN(calls); i++)
        call_release(calls[i]);
    srv_stop(&s);
}

static void test_keep_alive(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-keepalive"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);
    httpd_route(s.h, "POST", "/echo", h_echo_json, &s, 0);
    httpd_route(s.h, "GET", "/sse", h_sse, &s, 0);
    struct call a = {.conn = 1};
    url(&a, &s, "/ok");
    struct call b = {.conn = 1};
    url(&b, &s, "/ok");
    struct call c = {.conn = 1, .method = "POST", .body = "[1]", .body_len = 3};
    url(&c, &s, "/echo");
    struct call d = {.conn = 1, .first_chunk_seen = &s.client_saw_first};
    url(&d, &s, "/sse");
    struct call f = {.conn = 1};
    url(&f, &s, "/ok");
    struct call *calls[] = {&a, &b, &c, &d, &f};
    atomic_init(&s.client_saw_first, false);
    run_calls(s.r, calls, ARRAY_LEN(calls));
    assert_int_equal(a.status, 200);
    assert_int_equal(a.connects, 1);
    assert_string_equal(strbuf_str(&a.body_in), "ok");
    /* every later request reused the first connection, a finished stream included */
    for (size_t i = 1; i < ARRAY_LEN(calls); i++) {
        assert_int_equal(calls[i]->rc, CURLE_OK);
        assert_int_equal(calls[i]->status, 200);
        assert_int_equal(calls[i]->connects, 0);
    }
    for (size_t i = 0; i < ARRAY_LEN(calls); i++)
        call_release(calls[i]);
    srv_stop(&s);
}

static bool closed_once(void *arg)
{
    return ((struct srv *)arg)->closes > 0;
}

static void test_async_answer(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-async"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/slow", h_async, &s, 0);
    struct call a = {0};
    url(&a, &s, "/slow");
    int64_t t0 = util_mono_ms();
    run_call(s.r, &a);
    int64_t took = util_mono_ms() - t0;
    assert_int_equal(a.rc, CURLE_OK);
    assert_int_equal(a.status, 202);
    assert_string_equal(strbuf_str(&a.body_in), "{\"late\":true}");
    assert_true(took >= 100);
    assert_true(took < 3000);         /* resumed promptly, not on some idle timeout */
    loop_until(s.r, closed_once, &s); /* completion may come a loop turn after the bytes */
    assert_int_equal(s.closes, 1);
    assert_false(s.gone_at_close);
    call_release(&a);
    srv_stop(&s);
}

static void test_sse_stream(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-sse"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/sse", h_sse, &s, 0);
    atomic_init(&s.client_saw_first, false);
    struct call a = {.first_chunk_seen = &s.client_saw_first};
    url(&a, &s, "/sse");
    run_call(s.r, &a);
    assert_int_equal(a.rc, CURLE_OK);
    assert_int_equal(a.status, 200);
    assert_string_equal(a.content_type, "text/event-stream");
    assert_string_equal(strbuf_str(&a.body_in),
                        "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\ndata: 5\n\n");
    /* the first event arrived on its own: the handler sent the rest only once the
     * client had it */
    assert_true(atomic_load(&s.client_saw_first));
    assert_string_equal(a.transfer_encoding, "chunked"); /* a live stream */
    loop_until(s.r, closed_once, &s);
    assert_int_equal(s.closes, 1);
    assert_false(s.gone_at_close);
    call_release(&a);
    srv_stop(&s);
}

static void test_stream_client_disconnect(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-disconnect"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/drip", h_drip, &s, 0);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);
    struct call a = {.abort_after = 1};
    url(&a, &s, "/drip");
    run_call(s.r, &a);
    assert_int_equal(a.rc, CURLE_WRITE_ERROR);
    assert_int_equal(a.status, 200);
    loop_until(s.r, closed_once, &s);
    assert_int_equal(s.closes, 1);
    assert_true(s.gone_at_close);
    assert_int_equal(s.write_at_close, -EPIPE);
    assert_null(s.held);
    /* the server is still fine */
    struct call b = {0};
    url(&b, &s, "/ok");
    run_call(s.r, &b);
    assert_int_equal(b.status, 200);
    assert_int_equal(s.closes, 1); /* exactly once */
    call_release(&a);
    call_release(&b);
    srv_stop(&s);
}

static void test_pending_client_disconnect(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-pending-gone"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/never", h_never, &s, 0);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);
    /* the client gives up while its request is suspended awaiting an answer */
    struct call a = {.timeout_ms = 200};
    url(&a, &s, "/never");
    run_call(s.r, &a);
    assert_int_equal(a.rc, CURLE_OPERATION_TIMEDOUT);
    loop_until(s.r, closed_once, &s);
    assert_int_equal(s.closes, 1);
    assert_true(s.gone_at_close);
    struct call b = {0};
    url(&b, &s, "/ok");
    run_call(s.r, &b);
    assert_int_equal(b.status, 200);
    call_release(&a);
    call_release(&b);
    srv_stop(&s);
}

/* Answers arrive from zero-delay timers in a FIFO, several requests suspended at once. */
struct later {
    struct srv *s;
    struct httpd_req *q[64];
    size_t n;
    struct reactor_timer t;
    int answered;
};

static void later_flush(struct reactor *r, void *arg)
{
    struct later *l = arg;
    for (size_t i = 0; i < l->n; i++) {
        const char *id = httpd_req_param(l->q[i], "id");
        httpd_respond(l->q[i], 200, "text/plain", id, strlen(id));
        l->answered++;
    }
    l->n = 0;
}

static void h_later(struct httpd_req *req, void *arg)
{
    struct later *l = arg;
    assert_true(l->n < ARRAY_LEN(l->q));
    l->q[l->n++] = req;
    reactor_timer_start(l->s->r, &l->t, 1, 0);
}

#define CONC_CLIENTS 4
#define CONC_CALLS 40

static void test_concurrent_clients(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-concurrent"};
    srv_start(&s, &cfg);
    struct later l = {.s = &s};
    reactor_timer_init(&l.t, later_flush, &l);
    httpd_route(s.h, "GET", "/later/{id}", h_later, &l, 0);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);
    static struct call calls[CONC_CLIENTS][CONC_CALLS];
    static struct call *ptrs[CONC_CLIENTS][CONC_CALLS];
    struct job jobs[CONC_CLIENTS];
    memset(calls, 0, sizeof(calls));
    for (int c = 0; c < CONC_CLIENTS; c++) {
        for (int i = 0; i < CONC_CALLS; i++) {
            struct call *k = &calls[c][i];
            k->conn = c + 1;
            if (i % 2)
                snprintf(k->url, sizeof(k->url), "%s/later/%d-%d", s.base, c, i);
            else
                url(k, &s, "/ok");
            ptrs[c][i] = k;
        }
        job_start(&jobs[c], s.r, ptrs[c], CONC_CALLS);
    }
    for (int c = 0; c < CONC_CLIENTS; c++)
        job_wait(&jobs[c]);
    for (int c = 0; c < CONC_CLIENTS; c++) {
        for (int i = 0; i < CONC_CALLS; i++) {
            struct call *k = &calls[c][i];
            assert_int_equal(k->rc, CURLE_OK);
            assert_int_equal(k->status, 200);
            assert_int_equal(k->connects, i == 0 ? 1 : 0);
            char want[32];
            snprintf(want, sizeof(want), "%d-%d", c, i);
            assert_string_equal(strbuf_str(&k->body_in), i % 2 ? want : "ok");
            call_release(k);
        }
    }
    assert_int_equal(l.answered, CONC_CLIENTS * CONC_CALLS / 2);
    reactor_timer_stop(s.r, &l.t);
    srv_stop(&s);
}

/* The stream starts after the handler returned (headers known later, as a proxy does). */
static void late_stream(struct reactor *r, void *arg)
{
    struct srv *s = arg;
    httpd_stream_begin(s->held, 201, NULL);
    assert_int_equal(httpd_stream_write(s->held, "data: a\n\n", 9), 0);
    assert_int_equal(httpd_stream_pending(s->held), 9);
    assert_int_equal(httpd_stream_write(s->held, "data: b\n\n", 9), 0);
    httpd_stream_end(s->held, false);
    assert_int_equal(httpd_stream_write(s->held, "x", 1), -EINVAL); /* after end */
}

static void h_late_stream(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->held = req;
    httpd_req_on_close(req, stream_close, s);
    reactor_timer_init(&s->timer, late_stream, s);
    reactor_timer_start(s->r, &s->timer, 20, 0);
}

static void test_late_stream(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-late-stream"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "POST", "/gen", h_late_stream, &s, 0);
    struct call a = {.method = "POST", .body = "{}", .body_len = 2};
    url(&a, &s, "/gen");
    run_call(s.r, &a);
    assert_int_equal(a.rc, CURLE_OK);
    assert_int_equal(a.status, 201);
    assert_string_equal(a.content_type, "text/event-stream");
    assert_string_equal(strbuf_str(&a.body_in), "data: a\n\ndata: b\n\n");
    /* Begun, written and ended before the server sent anything: it went out as one
     * response with a length, not chunked. */
    assert_string_equal(a.content_length, "18");
    assert_string_equal(a.transfer_encoding, "");
    loop_until(s.r, closed_once, &s);
    assert_false(s.gone_at_close);
    call_release(&a);
    srv_stop(&s);
}

static void test_stream_overflow(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-overflow"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/big", h_overflow, &s, 0);
    struct call a = {0};
    url(&a, &s, "/big");
    run_call(s.r, &a);
    assert_int_equal(s.overflow_rc, -E2BIG);
    assert_int_not_equal(a.rc, CURLE_OK); /* aborted: no clean chunked end */
    call_release(&a);
    srv_stop(&s);
}

static void test_api_key(void **state)
{
    struct srv s;
    struct httpd_config cfg = {
        .name = "t-auth", .api_key_header = "X-Mgmt-Key", .api_key = "s3cret-key"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/secure", h_ok, &s, HTTPD_ROUTE_AUTH);
    httpd_route(s.h, "GET", "/open", h_ok, &s, 0);
    struct call none = {0};
    url(&none, &s, "/secure");
    struct call wrong = {.headers = {"X-Mgmt-Key: s3cret-kez"}};
    url(&wrong, &s, "/secure");
    struct call shorter = {.headers = {"x-mgmt-key: s3cret"}};
    url(&shorter, &s, "/secure");
    struct call right = {.headers = {"x-mgmt-KEY: s3cret-key"}};
    url(&right, &s, "/secure");
    struct call open = {0};
    url(&open, &s, "/open");
    struct call *calls[] = {&none, &wrong, &shorter, &right, &open};
    run_calls(s.r, calls, ARRAY_LEN(calls));
    assert_int_equal(none.status, 401);
    assert_string_equal(strbuf_str(&none.body_in), "{\"detail\":\"missing management key\"}");
    assert_int_equal(wrong.status, 403);
    assert_int_equal(shorter.status, 403);
    assert_int_equal(right.status, 200);
    assert_string_equal(strbuf_str(&right.body_in), "ok");
    assert_int_equal(open.status, 200);
    for (size_t i = 0; i < ARRAY_LEN(calls); i++)
        call_release(calls[i]);
    srv_stop(&s);
}

/* ---- binding ------------------------------------------------------------------------------- */

static void test_bind_errors_and_ipv6(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-bind"};
    srv_start(&s, &cfg);
    /* the same port again: EADDRINUSE */
    struct httpd_config dup = {.name = "t-bind-dup", .host = "127.0.0.1", .port = httpd_port(s.h)};
    with_tls(&dup);
    errno = 0;
    struct httpd *h2 = httpd_new(s.r, &dup);
    assert_null(h2);
    assert_int_equal(errno, EADDRINUSE);
    /* with reuse_port on both, several servers share a port */
    struct httpd_config rp = {.name = "t-rp1", .host = "127.0.0.1", .reuse_port = true};
    with_tls(&rp);
    struct httpd *a = httpd_new(s.r, &rp);
    assert_non_null(a);
    rp.port = httpd_port(a);
    struct httpd *b = httpd_new(s.r, &rp);
    assert_non_null(b);
    assert_int_equal(httpd_port(b), httpd_port(a));
    httpd_free(b);
    httpd_free(a);
    struct httpd_config bad = {.name = "t-badhost", .host = "not an address"};
    assert_null(httpd_new(s.r, &bad));
    srv_stop(&s);

    /* IPv6 loopback, when the kernel has it */
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have_v6 = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
        close(fd);
    if (!have_v6) {
        print_message("no IPv6 loopback here: IPv6 bind not tested\n");
        return;
    }
    struct reactor *r = reactor_new();
    struct httpd_config v6 = {.name = "t-v6", .host = "::1"};
    with_tls(&v6);
    struct httpd *h = httpd_new(r, &v6);
    assert_non_null(h);
    httpd_route(h, "GET", "/ok", h_ok, NULL, 0);
    struct call c = {0};
    snprintf(c.url, sizeof(c.url), "%s://[::1]:%u/ok", tls_mode ? "https" : "http", httpd_port(h));
    run_call(r, &c);
    assert_int_equal(c.status, 200);
    call_release(&c);
    httpd_free(h);
    reactor_free(r);
}

/* ---- access log ---------------------------------------------------------------------------- */

static void test_access_log(void **state)
{
    int p[2];
    assert_int_equal(pipe2(p, O_NONBLOCK), 0);
    enum log_level old = log_get_level();
    log_set_level(LOG_DEBUG);
    log_set_fd(p[1]);
    struct srv s;
    static const char *const quiet[] = {"/health", NULL};
    struct httpd_config cfg = {.name = "t-log", .quiet_paths = quiet};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/health", h_ok, &s, 0);
    httpd_route(s.h, "GET", "/ok", h_ok, &s, 0);
    struct call a = {0};
    url(&a, &s, "/health");
    struct call b = {0};
    url(&b, &s, "/ok");
    struct call *calls[] = {&a, &b};
    run_calls(s.r, calls, 2);
    srv_stop(&s);
    log_set_fd(STDERR_FILENO);
    log_set_level(old);
    char buf[16384];
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    assert_true(n > 0);
    buf[n] = '\0';
    close(p[0]);
    close(p[1]);
    int req_lines = 0;
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchrnul(line, '\n');
        bool last = *nl == '\0';
        *nl = '\0';
        json_t *j = json_loads(line, 0, NULL);
        if (j && strcmp(json_string_value(json_object_get(j, "event")), "http_request") == 0) {
            req_lines++;
            assert_string_equal(json_string_value(json_object_get(j, "path")), "/ok");
            assert_string_equal(json_string_value(json_object_get(j, "method")), "GET");
            assert_int_equal(json_integer_value(json_object_get(j, "status")), 200);
            assert_true(json_is_integer(json_object_get(j, "duration_ms")));
        }
        json_decref(j);
        if (last)
            break;
    }
    assert_int_equal(req_lines, 1);
    call_release(&a);
    call_release(&b);
}

/* ---- shutdown ------------------------------------------------------------------------------- */

static bool both_handled(void *arg)
{
    return ((struct srv *)arg)->handled >= 2;
}

static void test_free_with_suspended_and_stream(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-shutdown"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/never", h_never, &s, 0);
    httpd_route(s.h, "GET", "/stream", h_stream_open, &s, 0);
    struct call a = {0};
    url(&a, &s, "/never");
    struct call b = {0};
    url(&b, &s, "/stream");
    struct call *ca[] = {&a}, *cb[] = {&b};
    struct job ja, jb;
    job_start(&ja, s.r, ca, 1);
    job_start(&jb, s.r, cb, 1);
    loop_until(s.r, both_handled, &s);
    /* both connections are suspended now (one awaiting an answer, one awaiting data) */
    httpd_free(s.h);
    s.h = NULL;
    assert_int_equal(s.closes, 2);
    job_wait(&ja);
    job_wait(&jb);
    assert_int_equal(a.status, 503);
    assert_string_equal(strbuf_str(&a.body_in), "{\"detail\":\"server shutting down\"}");
    assert_int_equal(b.status, 200);
    assert_string_equal(strbuf_str(&b.body_in), "data: 1\n\n");
    call_release(&a);
    call_release(&b);
    reactor_free(s.r);
}

static SSL_CTX *raw_ctx;
static SSL *raw_ssl[1024]; /* by fd, in TLS mode */

static void pump(void *arg)
{
    reactor_run_once(arg, 2);
}

/* A connection for raw bytes (TLS mode: after an OpenSSL handshake while r runs). */
static int raw_connect(struct reactor *r, uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(fd >= 0 && fd < (int)ARRAY_LEN(raw_ssl));
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || errno == EINPROGRESS);
    if (tls_mode) {
        raw_ssl[fd] = tlsfix_handshake(raw_ctx, fd, "127.0.0.1", pump, r, LOOP_DEADLINE_MS);
        assert_non_null(raw_ssl[fd]);
    } else {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        assert_int_equal(poll(&p, 1, LOOP_DEADLINE_MS), 1);
    }
    return fd;
}

static void raw_write(int fd, const char *text)
{
    size_t n = strlen(text);
    while (n) {
        ssize_t w = raw_ssl[fd] ? tlsfix_write(raw_ssl[fd], text, n) : send(fd, text, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 100);
            continue;
        }
        assert_true(w > 0);
        text += w;
        n -= (size_t)w;
    }
}

/* As recv(2) with MSG_DONTWAIT. */
static ssize_t raw_read(int fd, char *buf, size_t n)
{
    return raw_ssl[fd] ? tlsfix_read(raw_ssl[fd], buf, n) : recv(fd, buf, n, MSG_DONTWAIT);
}

/* Everything until the end, after the server went away (bounded). */
static size_t raw_read_all(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    int64_t deadline = util_mono_ms() + LOOP_DEADLINE_MS;
    for (;;) {
        ssize_t n = raw_read(fd, buf + got, cap - 1 - got);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EAGAIN && util_mono_ms() < deadline) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            poll(&p, 1, 50);
            continue;
        }
        break;
    }
    buf[got] = '\0';
    return got;
}

static void raw_close(int fd)
{
    if (raw_ssl[fd]) {
        SSL_free(raw_ssl[fd]);
        raw_ssl[fd] = NULL;
    }
    close(fd);
}

static bool handled_once(void *arg)
{
    return ((struct srv *)arg)->handled >= 1;
}

/* Connections in every other state at shutdown: mid-upload, idle keep-alive, and a
 * request that arrived but was never answered, all over raw sockets. */
static void test_free_with_partial_and_idle(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-shutdown-raw"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "POST", "/len", h_body_len, &s, 0);
    httpd_route(s.h, "GET", "/never", h_never, &s, 0);
    uint16_t port = httpd_port(s.h);

    int partial = raw_connect(s.r, port);
    raw_write(partial, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789");

    int idle = raw_connect(s.r, port);
    raw_write(idle, "POST /len HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab");

    int pending = raw_connect(s.r, port);
    raw_write(pending, "GET /never HTTP/1.1\r\nHost: x\r\n\r\n");
    loop_until(s.r, handled_once, &s);

    /* the idle connection got its answer and stays open (keep-alive) */
    char buf[4096];
    size_t got = 0;
    int64_t deadline = util_mono_ms() + LOOP_DEADLINE_MS;
    while (!memmem(buf, got, "\r\n\r\n2", 5)) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s.r, 20);
        ssize_t n = raw_read(idle, buf + got, sizeof(buf) - 1 - got);
        if (n > 0)
            got += (size_t)n;
    }
    buf[got] = '\0';
    assert_non_null(strstr(buf, "HTTP/1.1 200"));
    assert_null(strcasestr(buf, "Connection: close"));

    httpd_free(s.h);
    s.h = NULL;
    assert_int_equal(s.closes, 1); /* the pending request's on_close */
    /* the pending request was answered 503 before the server went away */
    raw_read_all(pending, buf, sizeof(buf));
    assert_non_null(strstr(buf, "HTTP/1.1 503"));
    assert_non_null(strstr(buf, "server shutting down"));
    /* the other two were closed */
    assert_int_equal(raw_read_all(idle, buf, sizeof(buf)), 0);
    assert_int_equal(raw_read_all(partial, buf, sizeof(buf)), 0);
    raw_close(partial);
    raw_close(idle);
    raw_close(pending);
    reactor_free(s.r);
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
    raw_ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    return 0;
}

static int group_tls_end(void **state)
{
    SSL_CTX_free(raw_ctx);
    raw_ctx = NULL;
    tlsfix_cleanup();
    return 0;
}

int main(void)
{
    log_set_level(LOG_WARN);
    if (system("which curl >/dev/null 2>&1") != 0) {
        fprintf(stderr, "the curl command-line tool is required (an independent client)\n");
        return 1;
    }
    if (getenv("TEST_ONLY")) /* a glob, for working on one case */
        cmocka_set_test_filter(getenv("TEST_ONLY"));
    const struct CMUnitTest pure[] = {
        cmocka_unit_test(test_path_match_table),
        cmocka_unit_test(test_routes_find),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_routing_query_404_405),
        cmocka_unit_test(test_json_body),
        cmocka_unit_test(test_body_cap_413),
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test(test_async_answer),
        cmocka_unit_test(test_sse_stream),
        cmocka_unit_test(test_stream_client_disconnect),
        cmocka_unit_test(test_pending_client_disconnect),
        cmocka_unit_test(test_stream_overflow),
        cmocka_unit_test(test_concurrent_clients),
        cmocka_unit_test(test_late_stream),
        cmocka_unit_test(test_api_key),
        cmocka_unit_test(test_bind_errors_and_ipv6),
        cmocka_unit_test(test_access_log),
        cmocka_unit_test(test_free_with_suspended_and_stream),
        cmocka_unit_test(test_free_with_partial_and_idle),
    };
    int failed = cmocka_run_group_tests_name("routes", pure, NULL, NULL);
    failed += cmocka_run_group_tests_name("plain", tests, group_plain, NULL);
    failed += cmocka_run_group_tests_name("tls", tests, group_tls, group_tls_end);
    return failed;
}
