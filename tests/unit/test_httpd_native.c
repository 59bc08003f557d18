/* httpd's HTTP/1.1 connections over raw sockets: the wire-level cases a ready-made
 * client never produces (pipelining, chunked uploads, Expect, malformed heads, HTTP/1.0,
 * slow clients). Every case runs twice, over plain TCP and over TLS (the second group:
 * the same requests through an OpenSSL client, so the one HTTP/1.1 code path is shown
 * to behave the same on both transports). The reactor runs on the test's thread; the
 * client side is non-blocking sockets on 127.0.0.1, everything bounded. The parser and
 * decoder on their own are in test_http1.c; TLS-only cases in test_httpd_tls.c. */
#include "common/http1.h"
#include "common/httpd.h"
#include "common/httpd_internal.h"
#include "common/log.h"
#include "common/reactor.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "tlsfix.h"

#define DEADLINE_MS 10000

/* The transport of this group's run: plain TCP, or TLS (server certificate from the
 * test CA, the client verifying it as any client would). */
static bool tls_mode;
static SSL_CTX *cli_ctx;
static SSL *cli_ssl[4096]; /* by client fd, in TLS mode */

struct srv {
    struct reactor *r;
    struct httpd *h;
    struct httpd_req *held;
    int handled;
    int closes;
    bool gone_at_close;
    int64_t stream_written;
};

static void srv_start(struct srv *s, struct httpd_config *cfg);
static void srv_stop(struct srv *s);

/* ---- handlers ------------------------------------------------------------------------ */

static void h_ok(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    httpd_respond(req, 200, "text/plain", "ok", 2);
}

static void h_echo(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    size_t len = 0;
    const char *b = httpd_req_body(req, &len);
    httpd_respond(req, 200, "application/octet-stream", b, len);
}

static void h_path(struct httpd_req *req, void *arg)
{
    const char *q = httpd_req_query(req, "x");
    char out[256];
    int n = snprintf(out, sizeof(out), "%s|%s|%s|%s", httpd_req_path(req), q ? q : "(null)",
                     httpd_req_query(req, "flag") ? "v" : "(null)", httpd_req_peer(req));
    httpd_respond(req, 200, "text/plain", out, (size_t)n);
}

static void on_close(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->closes++;
    s->gone_at_close = httpd_req_client_gone(req);
    if (req == s->held)
        s->held = NULL;
}

static void h_never(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    s->held = req;
    httpd_req_on_close(req, on_close, s);
}

#define BIG_CHUNK (64u * 1024)
#define BIG_TOTAL ((int64_t)4 << 20)

static void h_big_stream(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    s->held = req;
    httpd_req_on_close(req, on_close, s);
    httpd_stream_begin(req, 200, "application/octet-stream");
    char *buf = xmalloc(BIG_CHUNK);
    memset(buf, 'z', BIG_CHUNK);
    for (s->stream_written = 0; s->stream_written < BIG_TOTAL; s->stream_written += BIG_CHUNK)
        assert_int_equal(httpd_stream_write(req, buf, BIG_CHUNK), 0);
    free(buf);
    /* not ended here: the test ends it once it has seen the backpressure, so the body
     * goes out chunked rather than collapsed into one answer with a length */
}

#define BIG_RESP ((size_t)8 << 20) /* above the largest kernel send buffer (4 MiB) */

/* One 8 MiB answer with a length (not a stream). */
static void h_big_resp(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    httpd_req_on_close(req, on_close, s);
    char *buf = xmalloc(BIG_RESP);
    memset(buf, 'y', BIG_RESP);
    httpd_respond(req, 200, "application/octet-stream", buf, BIG_RESP);
    free(buf);
}

/* A stream that sends "first" and then waits for the test (a model between tokens). */
static void h_idle_stream(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    s->held = req;
    httpd_req_on_close(req, on_close, s);
    httpd_stream_begin(req, 200, "text/event-stream");
    assert_int_equal(httpd_stream_write(req, "first", 5), 0);
}

/* "<path>|<Host header>" */
static void h_host(struct httpd_req *req, void *arg)
{
    struct srv *s = arg;
    s->handled++;
    const char *host = httpd_req_header(req, "Host");
    char out[256];
    int n = snprintf(out, sizeof(out), "%s|%s", httpd_req_path(req), host ? host : "(none)");
    httpd_respond(req, 200, "text/plain", out, (size_t)n);
}

/* ---- plumbing -------------------------------------------------------------------------- */

static void srv_start(struct srv *s, struct httpd_config *cfg)
{
    memset(s, 0, sizeof(*s));
    s->r = reactor_new();
    assert_non_null(s->r);
    cfg->host = cfg->host ? cfg->host : "127.0.0.1";
    if (tls_mode) {
        cfg->tls_cert_file = tlsfix("srv.crt");
        cfg->tls_key_file = tlsfix("srv.key");
    }
    s->h = httpd_new(s->r, cfg);
    assert_non_null(s->h);
    assert_int_equal(httpd_is_tls(s->h), tls_mode);
    httpd_route(s->h, "GET", "/ok", h_ok, s, 0);
    httpd_route(s->h, "POST", "/echo", h_echo, s, 0);
    httpd_route(s->h, "GET", "/p/{x}", h_path, s, 0);
    httpd_route(s->h, "GET", "/never", h_never, s, 0);
    httpd_route(s->h, "GET", "/big", h_big_stream, s, 0);
    httpd_route(s->h, "GET", "/bigresp", h_big_resp, s, 0);
    httpd_route(s->h, "GET", "/idle", h_idle_stream, s, 0);
    httpd_route(s->h, "GET", "/host", h_host, s, 0);
    httpd_route(s->h, "GET", "/", h_host, s, 0);
}

static void srv_stop(struct srv *s)
{
    httpd_free(s->h);
    reactor_free(s->r);
}

/* A TCP connection to the server, nothing more (non-blocking). */
static int cli_connect_raw(const struct srv *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(httpd_port(s->h)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(fd >= 0 && fd < (int)ARRAY_LEN(cli_ssl));
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || errno == EINPROGRESS);
    return fd;
}

static void pump(void *arg)
{
    reactor_run_once(((struct srv *)arg)->r, 2);
}

/* TLS mode: shake hands over fd (connected or connecting) while the server's loop runs. */
static void cli_upgrade(struct srv *s, int fd)
{
    if (!tls_mode)
        return;
    cli_ssl[fd] = tlsfix_handshake(cli_ctx, fd, "127.0.0.1", pump, s, DEADLINE_MS);
    assert_non_null(cli_ssl[fd]);
}

/* A connection ready for requests (TLS mode: after the handshake). */
static int cli_connect(struct srv *s)
{
    int fd = cli_connect_raw(s);
    cli_upgrade(s, fd);
    return fd;
}

static void cli_close(int fd)
{
    if (cli_ssl[fd]) {
        SSL_free(cli_ssl[fd]); /* no close_notify: like a client that just goes away */
        cli_ssl[fd] = NULL;
    }
    close(fd);
}

/* As send(2) with MSG_NOSIGNAL on the non-blocking fd: > 0, or -1 with errno (EAGAIN). */
static ssize_t cli_try_send(int fd, const void *p, size_t n)
{
    return cli_ssl[fd] ? tlsfix_write(cli_ssl[fd], p, n) : send(fd, p, n, MSG_NOSIGNAL);
}

/* As recv(2) with MSG_DONTWAIT: > 0, 0 at the end (a TLS close_notify or FIN), -1 with
 * errno (EAGAIN, ECONNRESET). */
static ssize_t cli_recv(int fd, void *p, size_t n)
{
    return cli_ssl[fd] ? tlsfix_read(cli_ssl[fd], p, n) : recv(fd, p, n, MSG_DONTWAIT);
}

static void cli_send(struct srv *s, int fd, const char *data, size_t len)
{
    size_t off = 0;
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (off < len) {
        ssize_t w = cli_try_send(fd, data + off, len - off);
        if (w > 0)
            off += (size_t)w;
        else
            assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s->r, 0);
    }
}

static void cli_sends(struct srv *s, int fd, const char *text)
{
    cli_send(s, fd, text, strlen(text));
}

/* Run the loop and read until `want` occurs `times` times in what arrived, or EOF
 * (*eof set). Returns what arrived (in sb). */
static void cli_read_until(struct srv *s, int fd, struct strbuf *sb, const char *want, int times,
                           bool *eof)
{
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    if (eof)
        *eof = false;
    for (;;) {
        int seen = 0;
        const char *p = strbuf_str(sb);
        while (want && (p = strstr(p, want)) != NULL) {
            seen++;
            p += strlen(want);
        }
        if (want && seen >= times)
            return;
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s->r, 10);
        char buf[65536];
        ssize_t n;
        while ((n = cli_recv(fd, buf, sizeof(buf))) > 0)
            assert_int_equal(strbuf_append(sb, buf, (size_t)n), 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            if (eof)
                *eof = true;
            return;
        }
    }
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void loop_until_closes(struct srv *s, int n)
{
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (s->closes < n) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s->r, 10);
    }
}

/* ---- wire tests ------------------------------------------------------------------------- */

static void test_pipelined_requests(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-pipe"};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    cli_sends(&s, fd,
              "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
              "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
              "GET /p/a%20b?x=1+2%26&flag HTTP/1.1\r\nHost: x\r\n\r\n");
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_read_until(&s, fd, &in, "HTTP/1.1 200 OK\r\n", 3, NULL);
    cli_read_until(&s, fd, &in, "127.0.0.1", 1, NULL);
    const char *t = strbuf_str(&in);
    /* in order, all three on the one connection */
    const char *a = strstr(t, "\r\n\r\nok"), *b = strstr(t, "\r\n\r\nhello"),
               *c = strstr(t, "/p/a b|1 2&|(null)|127.0.0.1");
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    assert_true(a < b && b < c);
    assert_int_equal(count(t, "Content-Length: "), 3);
    assert_null(strstr(t, "Connection: close"));
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

/* A Content-Length body larger than the first allocation (64 KiB) grows as it arrives
 * and comes out intact, whether it arrives with the head or in pieces afterwards. */
static void test_large_body_grows(void **state)
{
    (void)state;
    struct srv s;
    struct httpd_config cfg = {.name = "t-bigbody", .max_body = 4 << 20};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    size_t n = (3u << 20) + 123;
    char *body = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        body[i] = (char)('a' + (i * 7919) % 26);
    char head[160];
    int hl = snprintf(head, sizeof(head),
                      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", n);
    cli_send(&s, fd, head, (size_t)hl);
    cli_send(&s, fd, body, 1000); /* a first piece, then the rest */
    cli_send(&s, fd, body + 1000, n - 1000);
    struct strbuf in;
    strbuf_init(&in, 8 << 20);
    char want[64];
    snprintf(want, sizeof(want), "Content-Length: %zu\r\n\r\n", n);
    cli_read_until(&s, fd, &in, want, 1, NULL);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    const char *hdr_end = strstr(strbuf_str(&in), "\r\n\r\n");
    assert_non_null(hdr_end);
    size_t head_len = (size_t)(hdr_end - strbuf_str(&in)) + 4;
    while (in.len < head_len + n) {
        char buf[65536];
        ssize_t r = cli_recv(fd, buf, sizeof(buf));
        if (r > 0)
            strbuf_append(&in, buf, (size_t)r);
        reactor_run_once(s.r, 1);
        assert_true(util_mono_ms() < deadline);
    }
    assert_int_equal(in.len, head_len + n);
    assert_memory_equal(strbuf_str(&in) + head_len, body, n);
    strbuf_release(&in);
    cli_close(fd);
    free(body);
    srv_stop(&s);
}

static void test_chunked_request_body(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-chunked", .max_body = 64};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    /* split across sends, with an extension and a trailer */
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
    cli_sends(&s, fd, "lo\r\n6;name=val\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n");
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_read_until(&s, fd, &in, "hello world", 1, NULL);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(strbuf_str(&in), "Content-Length: 11\r\n"));
    /* over the cap (64): 413, and the connection stays usable */
    strbuf_reset(&in);
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "50\r\n");
    char pad[0x50];
    memset(pad, 'p', sizeof(pad));
    cli_send(&s, fd, pad, sizeof(pad));
    cli_sends(&s, fd, "\r\n0\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, NULL);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 413 "));
    assert_non_null(strstr(strbuf_str(&in), "request body too large"));
    /* a malformed chunk size: 400 and close */
    strbuf_reset(&in);
    bool eof = false;
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 400 "));
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

static void test_expect_continue(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-expect", .max_body = 1024};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                      "Expect: 100-continue\r\n\r\n");
    cli_read_until(&s, fd, &in, "HTTP/1.1 100 Continue\r\n\r\n", 1, NULL);
    assert_int_equal(s.handled, 0);
    cli_sends(&s, fd, "ping");
    cli_read_until(&s, fd, &in, "ping", 1, NULL);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    /* an announced body over the cap is refused without reading it: no 100, a 413 and
     * the connection closes */
    strbuf_reset(&in);
    bool eof = false;
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
                      "Expect: 100-continue\r\n\r\n");
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_null(strstr(strbuf_str(&in), "100 Continue"));
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 413 "));
    assert_non_null(strstr(strbuf_str(&in), "{\"detail\":\"request body too large\"}"));
    assert_int_equal(s.handled, 1);
    cli_close(fd);
    /* a huge announced body without Expect: 413 at once, nothing of it is sent */
    fd = cli_connect(&s);
    strbuf_reset(&in);
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n");
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 413 "));
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

static void expect_status_and_close(struct srv *s, const char *req, size_t len, const char *status)
{
    int fd = cli_connect(s);
    cli_send(s, fd, req, len);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool eof = false;
    cli_read_until(s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    if (!strstr(strbuf_str(&in), status))
        fail_msg("wanted %s, got: %s", status, strbuf_str(&in));
    assert_non_null(strstr(strbuf_str(&in), "Connection: close"));
    strbuf_release(&in);
    cli_close(fd);
}

static void test_malformed_heads(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-malformed"};
    srv_start(&s, &cfg);
    /* each with a Host, so that only the flaw named is what is refused */
    static const char *const bad400[] = {
        "GET\r\n\r\n",
        "GET /ok\r\nHost: x\r\n\r\n",
        "GET /ok HTTP/1.1 extra\r\nHost: x\r\n\r\n",
        "GET ok HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /o k HTTP/1.1\r\nHost: x\r\n\r\n",
        "G(T /ok HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: x\r\nNo-Colon\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: x\r\nBad Name: x\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: x\r\nA: b\r\n folded\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        "GET /a%00b HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /ok FTP/1.1\r\nHost: x\r\n\r\n",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad400); i++)
        expect_status_and_close(&s, bad400[i], strlen(bad400[i]), "HTTP/1.1 400 ");
    const char *v2 = "GET /ok HTTP/2.0\r\nHost: x\r\n\r\n";
    expect_status_and_close(&s, v2, strlen(v2), "HTTP/1.1 505 ");
    const char *te = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n";
    expect_status_and_close(&s, te, strlen(te), "HTTP/1.1 501 ");
    /* a header block above 16 KiB: 431 */
    size_t big = 20 * 1024;
    char *req = xmalloc(big);
    int n = snprintf(req, big, "GET /ok HTTP/1.1\r\nX-Big: ");
    memset(req + n, 'a', big - (size_t)n);
    expect_status_and_close(&s, req, big, "HTTP/1.1 431 ");
    /* too many header lines: 431 too */
    struct strbuf many;
    strbuf_init(&many, 1 << 20);
    strbuf_puts(&many, "GET /ok HTTP/1.1\r\n");
    for (int i = 0; i < HTTP1_REQUEST_FIELDS_MAX + 1; i++)
        strbuf_appendf(&many, "X-H%d: v\r\n", i);
    strbuf_puts(&many, "\r\n");
    expect_status_and_close(&s, many.buf, many.len, "HTTP/1.1 431 ");
    strbuf_release(&many);
    free(req);
    assert_int_equal(s.handled, 0);
    srv_stop(&s);
}

static void test_http10_and_keepalive(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-http10"};
    srv_start(&s, &cfg);
    /* HTTP/1.0 closes after the answer */
    int fd = cli_connect(&s);
    cli_sends(&s, fd, "GET /ok HTTP/1.0\r\n\r\n");
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool eof = false;
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_non_null(strstr(strbuf_str(&in), "200 OK"));
    assert_non_null(strstr(strbuf_str(&in), "\r\n\r\nok"));
    cli_close(fd);
    /* ... unless it asks for keep-alive */
    fd = cli_connect(&s);
    strbuf_reset(&in);
    cli_sends(&s, fd, "GET /ok HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, &eof);
    assert_false(eof);
    assert_non_null(strstr(strbuf_str(&in), "Connection: keep-alive\r\n"));
    cli_close(fd);
    /* HTTP/1.1 "Connection: close" is honoured */
    fd = cli_connect(&s);
    strbuf_reset(&in);
    cli_sends(&s, fd, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(strbuf_str(&in), "Connection: close\r\n"));
    cli_close(fd);
    /* many requests, one connection, one at a time */
    fd = cli_connect(&s);
    int before = s.handled;
    for (int i = 0; i < 200; i++) {
        strbuf_reset(&in);
        cli_sends(&s, fd, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
        cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, &eof);
        assert_false(eof);
    }
    assert_int_equal(s.handled - before, 200);
    /* HEAD: the GET route answers with the length and no body; the connection stays in
     * sync for the next request */
    strbuf_reset(&in);
    cli_sends(&s, fd, "HEAD /ok HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, fd, &in, "HTTP/1.1 200 OK", 2, &eof);
    cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, &eof);
    const char *t = strbuf_str(&in);
    assert_int_equal(count(t, "Content-Length: 2\r\n"), 2);
    assert_int_equal(count(t, "ok"), 1);
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

static void test_disconnect_while_suspended(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-gone"};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    cli_sends(&s, fd, "GET /never HTTP/1.1\r\nHost: x\r\n\r\n");
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (s.handled < 1) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s.r, 10);
    }
    assert_int_equal(s.closes, 0);
    cli_close(fd);
    loop_until_closes(&s, 1);
    assert_true(s.gone_at_close);
    assert_null(s.held);
    srv_stop(&s);
    assert_int_equal(s.closes, 1); /* exactly once */
}

static void test_stream_backpressure(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-backpressure"};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    int rcv = 16 * 1024;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    cli_sends(&s, fd, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n");
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (s.handled < 1) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s.r, 10);
    }
    for (int i = 0; i < 5; i++)
        reactor_run_once(s.r, 5);
    /* the client reads nothing: the socket is full and the rest waits in the server,
     * without blocking the loop */
    assert_non_null(s.held);
    size_t pending = httpd_stream_pending(s.held);
    assert_true(pending > 0);
    assert_true(pending < (size_t)BIG_TOTAL + 4096);
    httpd_stream_end(s.held, false);
    /* now read it all: 4 MiB of 'z' in one chunk, then the terminating chunk. A normal
     * receive buffer again: a 16 KiB window holds one TLS record at most, and waiting
     * for delayed ACKs record by record takes seconds. */
    rcv = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    size_t body = 0;
    bool end = false;
    char buf[65536];
    char tailbuf[16] = {0};
    while (!end) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s.r, 1);
        ssize_t n;
        while ((n = cli_recv(fd, buf, sizeof(buf))) > 0) {
            for (ssize_t i = 0; i < n; i++)
                body += buf[i] == 'z';
            size_t keep = MOTOR_MIN((size_t)n, sizeof(tailbuf) - 1);
            memmove(tailbuf, tailbuf + keep, sizeof(tailbuf) - 1 - keep);
            memcpy(tailbuf + sizeof(tailbuf) - 1 - keep, buf + n - (ssize_t)keep, keep);
            end = strstr(tailbuf, "\r\n0\r\n\r\n") != NULL;
        }
    }
    assert_int_equal(body, (size_t)BIG_TOTAL);
    loop_until_closes(&s, 1);
    assert_false(s.gone_at_close);
    cli_close(fd);
    srv_stop(&s);
}

static void test_idle_timeout_and_max_connections(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-idle", .idle_timeout_s = 1, .max_connections = 2};
    srv_start(&s, &cfg);
    int a = cli_connect(&s), b = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool eof = false;
    cli_sends(&s, a, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, a, &in, "\r\n\r\nok", 1, &eof);
    cli_sends(&s, b, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, b, &in, "\r\n\r\nok", 2, &eof);
    assert_false(eof);
    /* a third connection is over the limit: closed at once */
    int c = cli_connect_raw(&s);
    strbuf_reset(&in);
    cli_read_until(&s, c, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_int_equal(in.len, 0);
    cli_close(c);
    /* the idle ones are closed after ~1 s */
    int64_t t0 = util_mono_ms();
    cli_read_until(&s, a, &in, NULL, 0, &eof);
    assert_true(eof);
    assert_true(util_mono_ms() - t0 < 4000);
    cli_close(a);
    cli_close(b);
    strbuf_release(&in);
    srv_stop(&s);
}

/* evict_idle: at the limit a new client closes the connection idle longest (not one
 * with a request in progress) instead of being refused. */
static void run_for(struct srv *s, int64_t ms)
{
    int64_t end = util_mono_ms() + ms;
    while (util_mono_ms() < end)
        reactor_run_once(s->r, 5);
}

static void test_max_connections_evicts_oldest_idle(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-evict", .max_connections = 3, .evict_idle = true};
    srv_start(&s, &cfg);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool eof = false;
    int a = cli_connect(&s);
    cli_sends(&s, a, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, a, &in, "\r\n\r\nok", 1, &eof);
    run_for(&s, 30); /* b is idle for less time than a */
    int b = cli_connect(&s);
    cli_sends(&s, b, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, b, &in, "\r\n\r\nok", 2, &eof);
    /* m is mid-request (half a head): never evicted */
    int m = cli_connect(&s);
    cli_sends(&s, m, "GET /ok HTTP/1.1\r\n");
    run_for(&s, 30);
    int c = cli_connect(&s);
    strbuf_reset(&in);
    cli_sends(&s, c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, c, &in, "\r\n\r\nok", 1, &eof);
    assert_false(eof); /* served */
    strbuf_reset(&in);
    cli_read_until(&s, a, &in, NULL, 0, &eof);
    assert_true(eof); /* the oldest idle one made room */
    /* b and m stay: m finishes its request */
    cli_sends(&s, m, "Host: x\r\n\r\n");
    strbuf_reset(&in);
    eof = false;
    cli_read_until(&s, m, &in, "\r\n\r\nok", 1, &eof);
    assert_false(eof);
    cli_close(a);
    cli_close(b);
    cli_close(c);
    cli_close(m);
    strbuf_release(&in);
    srv_stop(&s);
}

static void dummy_cb(struct reactor *r, int fd, uint32_t events, void *arg)
{
}

/* Another module closed an fd without leaving the reactor (httpc does after a curl
 * connect timeout); the accepted connection that gets the number must still be served. */
static void test_stale_watch_on_accepted_fd(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-stale"};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    int stale = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(stale >= 0);
    assert_int_equal(reactor_add_fd(s.r, stale, EPOLLIN, dummy_cb, NULL), 0);
    close(stale); /* the lowest free number: accept4 hands it out next */
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
    bool eof = false;
    cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, &eof);
    assert_false(eof);
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

/* Feed `prefix`, then one more byte every 100 ms, as a slowloris client does, until the
 * server closes the connection or max_ms pass. Returns the ms until the close, or -1. */
static int64_t trickle_until_closed(struct srv *s, const char *prefix, int64_t max_ms)
{
    int fd = cli_connect(s);
    cli_sends(s, fd, prefix);
    int64_t t0 = util_mono_ms(), next = t0;
    int64_t closed_after = -1;
    while (util_mono_ms() - t0 < max_ms) {
        reactor_run_once(s->r, 10);
        char buf[4096];
        ssize_t n = cli_recv(fd, buf, sizeof(buf));
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            closed_after = util_mono_ms() - t0;
            break;
        }
        if (util_mono_ms() >= next) {
            next += 100;
            if (cli_try_send(fd, "a", 1) < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                closed_after = util_mono_ms() - t0;
                break;
            }
        }
    }
    cli_close(fd);
    return closed_after;
}

/* Each byte resets the idle timer, so before the request-read deadline a client that
 * sent its head (or body) one byte at a time held a connection slot forever. */
static void test_slow_request_is_closed(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-slowloris", .idle_timeout_s = 1};
    srv_start(&s, &cfg);
    int64_t head = trickle_until_closed(&s, "GET /ok HTTP/1.1\r\nX-Slow: ", 6000);
    assert_true(head >= 0);
    assert_true(head < 4000);
    int64_t body = trickle_until_closed(
        &s, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n", 6000);
    assert_true(body >= 0);
    assert_true(body < 4000);
    int64_t chunked = trickle_until_closed(
        &s, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nfff\r\n", 6000);
    assert_true(chunked >= 0);
    assert_true(chunked < 4000);
    assert_int_equal(s.handled, 0);
    /* a client that sends at a normal pace is not affected */
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello");
    cli_read_until(&s, fd, &in, "\r\n\r\nhello", 1, NULL);
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

static void h_big_header(struct httpd_req *req, void *arg)
{
    /* "X-B: " + value fills the 64 KiB header buffer but for its CRLF */
    size_t vlen = 64 * 1024 - 5 - 1;
    char *v = xmalloc(vlen + 1);
    memset(v, 'v', vlen);
    v[vlen] = '\0';
    httpd_add_header(req, "X-B", v);
    free(v);
    httpd_add_header(req, "X-After", "1");
    httpd_respond(req, 200, "text/plain", "ok", 2);
}

/* A header that does not fit must be dropped whole: a header line left without its CRLF
 * swallowed the Content-Length line that follows it (the answer lost its framing). */
static void test_oversized_response_header_dropped_whole(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-bighdr"};
    srv_start(&s, &cfg);
    httpd_route(s.h, "GET", "/bighdr", h_big_header, &s, 0);
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd, "GET /bighdr HTTP/1.1\r\nHost: x\r\n\r\n");
    cli_read_until(&s, fd, &in, "\r\n\r\nok", 1, NULL);
    const char *t = strbuf_str(&in);
    assert_non_null(strstr(t, "\r\nContent-Length: 2\r\n"));
    assert_non_null(strstr(t, "\r\nX-After: 1\r\n"));
    assert_null(strstr(t, "vvvvContent-Length"));
    strbuf_release(&in);
    cli_close(fd);
    srv_stop(&s);
}

/* Out of file descriptors, accept4 fails with EMFILE and leaves the connection queued, so
 * the level-triggered listener fired again at once: the loop spun at full CPU (logging
 * each turn) until an fd came free. The listener must pause instead, and serve the
 * queued clients once descriptors are back. */
static void test_accept_emfile_does_not_spin(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-emfile"};
    srv_start(&s, &cfg);
    int cl[3];
    for (int i = 0; i < 3; i++) {
        cl[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        assert_true(cl[i] >= 0);
    }
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* the lowest free number */
    assert_true(probe >= 0);
    close(probe);
    struct rlimit old;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    struct rlimit low = {.rlim_cur = (rlim_t)probe, .rlim_max = old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(httpd_port(s.h)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < 3; i++) {
        int rc = connect(cl[i], (struct sockaddr *)&sa, sizeof(sa));
        assert_true(rc == 0 || errno == EINPROGRESS);
    }
    int turns = 0;
    int64_t t0 = util_mono_ms();
    while (util_mono_ms() - t0 < 400) {
        reactor_run_once(s.r, 50);
        turns++;
    }
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (turns > 100)
        fail_msg("the loop spun: %d turns in 400 ms", turns);
    /* descriptors are back: the queued clients are served */
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    for (int i = 0; i < 3; i++) {
        strbuf_reset(&in);
        cli_upgrade(&s, cl[i]);
        cli_sends(&s, cl[i], "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n");
        cli_read_until(&s, cl[i], &in, "\r\n\r\nok", 1, NULL);
        cli_close(cl[i]);
    }
    strbuf_release(&in);
    srv_stop(&s);
}

/* One request on a new connection; the answer up to the close, or (keep-alive) up to
 * `until`. */
static void one_request(struct srv *s, const char *req, const char *until, struct strbuf *in)
{
    int fd = cli_connect(s);
    strbuf_reset(in);
    cli_sends(s, fd, req);
    bool eof = false;
    cli_read_until(s, fd, in, until, 1, &eof);
    cli_close(fd);
}

/* RFC 9112 §3.2: an HTTP/1.1 request without Host, and any request with two, is refused
 * with 400; HTTP/1.0 may omit it. */
static void test_host_required(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-host"};
    srv_start(&s, &cfg);
    static const char *const bad[] = {
        "GET /ok HTTP/1.1\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
        "GET /ok HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: a/b\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: user@a\r\n\r\n",
        "GET /ok HTTP/1.1\r\nHost: a b\r\n\r\n",
        "POST /echo HTTP/1.1\r\nContent-Length: 2\r\n\r\nab",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++)
        expect_status_and_close(&s, bad[i], strlen(bad[i]), "HTTP/1.1 400 ");
    assert_int_equal(s.handled, 0);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    one_request(&s, "GET /host HTTP/1.0\r\n\r\n", NULL, &in);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    assert_non_null(strstr(strbuf_str(&in), "\r\n\r\n/host|(none)"));
    one_request(&s, "GET /host HTTP/1.1\r\nhOST: [::1]:8080\r\n\r\n", "|[::1]:8080", &in);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    /* empty: what a client sends for a URI without authority (§3.2) */
    one_request(&s, "GET /host HTTP/1.1\r\nHost:\r\n\r\n", "/host|", &in);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 200 OK\r\n"));
    assert_int_equal(s.handled, 3);
    strbuf_release(&in);
    srv_stop(&s);
}

/* RFC 9112 §3.2.2: absolute-form targets are accepted, routed on their path and query,
 * and their authority replaces Host. */
static void test_absolute_form(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-absolute"};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd,
              "GET http://example.com:8080/p/a%20b?x=1+2&flag HTTP/1.1\r\nHost: other\r\n\r\n"
              "GET HTTP://Example.com/host?x=1 HTTP/1.1\r\nHost: other\r\n\r\n"
              "GET https://h:1?x=1 HTTP/1.1\r\n\r\n"
              "GET http://h:2 HTTP/1.1\r\n\r\n");
    bool eof = false;
    cli_read_until(&s, fd, &in, "HTTP/1.1 200 OK\r\n", 4, &eof);
    cli_read_until(&s, fd, &in, "\r\n\r\n/|h:2", 1, &eof);
    assert_false(eof);
    const char *t = strbuf_str(&in);
    const char *a = strstr(t, "\r\n\r\n/p/a b|1 2|(null)|127.0.0.1"), *b = strstr(t, "\r\n\r\n/host|Example.com"),
               *c = strstr(t, "\r\n\r\n/|h:1"), *d = strstr(t, "\r\n\r\n/|h:2");
    if (!a || !b || !c || !d)
        fail_msg("got: %s", t);
    assert_true(a < b && b < c && c < d);
    assert_null(strstr(t, "other"));
    cli_close(fd);
    static const char *const bad[] = {
        "GET ftp://h/ok HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http:///ok HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http:/ok HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http:// HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http://user@h/ok HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http://h#f/ok HTTP/1.1\r\nHost: h\r\n\r\n",
        "GET http://h/ok HTTP/1.1\r\nHost: h\r\nHost: h\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
        "CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++)
        expect_status_and_close(&s, bad[i], strlen(bad[i]), "HTTP/1.1 400 ");
    assert_int_equal(s.handled, 3); /* h_host's: h_path does not count */
    strbuf_release(&in);
    srv_stop(&s);
}

/* Every "Date: " in t is an IMF-fixdate within 2 s of now; returns how many there are. */
static int check_dates(const char *t)
{
    int n = 0;
    time_t now = time(NULL);
    for (const char *p = t; (p = strstr(p, "\r\nDate: ")) != NULL; p += 8) {
        n++;
        const char *v = p + 8;
        const char *e = strstr(v, "\r\n");
        assert_non_null(e);
        if (e - v != 29)
            fail_msg("Date is not IMF-fixdate: %.*s", (int)(e - v), v);
        struct tm tm = {0};
        const char *end = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        if (end != e)
            fail_msg("Date is not IMF-fixdate: %.29s", v);
        time_t d = timegm(&tm);
        if (d < now - 2 || d > now + 2)
            fail_msg("Date %.29s is not now", v);
    }
    return n;
}

/* RFC 9110 §6.6.1: an origin server with a clock sends Date in every answer. */
static void test_date_header(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-date", .max_body = 8};
    srv_start(&s, &cfg);
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    /* 200, HEAD, 404 from the router, 413, a stream; then a malformed head (400) */
    cli_sends(&s, fd,
              "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
              "HEAD /ok HTTP/1.1\r\nHost: x\r\n\r\n"
              "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
              "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n123456789"
              "GET /idle HTTP/1.1\r\nHost: x\r\n\r\n");
    bool eof = false;
    cli_read_until(&s, fd, &in, "first", 1, &eof);
    assert_non_null(s.held);
    httpd_stream_end(s.held, false);
    cli_read_until(&s, fd, &in, "0\r\n\r\n", 1, &eof);
    cli_sends(&s, fd, "GET /ok HTTP/1.1 x\r\n\r\n");
    cli_read_until(&s, fd, &in, NULL, 0, &eof);
    assert_true(eof);
    const char *t = strbuf_str(&in);
    assert_int_equal(count(t, "HTTP/1.1 "), 6);
    assert_non_null(strstr(t, "HTTP/1.1 404 "));
    assert_non_null(strstr(t, "HTTP/1.1 413 "));
    assert_non_null(strstr(t, "HTTP/1.1 400 "));
    assert_int_equal(check_dates(t), 6);
    /* every answer's Date sits in its head, right after the status line */
    assert_int_equal(count(t, " OK\r\nDate: "), 3);
    cli_close(fd);
    strbuf_release(&in);
    srv_stop(&s);
}

/* The server's end of client socket cfd (same process): its SO_SNDBUF is set to `bytes`,
 * which also stops the kernel growing it. Loopback otherwise gives a sender megabytes
 * of buffer, and a writer is woken only when a good part of it has drained. */
static void shrink_server_sndbuf(struct srv *s, int cfd, int bytes)
{
    struct sockaddr_in me, peer;
    socklen_t l = sizeof(me);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (getpeername(cfd, (struct sockaddr *)&peer, &l) != 0) {
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s->r, 5);
        l = sizeof(peer);
    }
    l = sizeof(me);
    assert_int_equal(getsockname(cfd, (struct sockaddr *)&me, &l), 0);
    for (;;) {
        reactor_run_once(s->r, 5); /* the server accepts */
        for (int fd = 3; fd < 4096; fd++) {
            struct sockaddr_in a, b;
            socklen_t al = sizeof(a), bl = sizeof(b);
            if (fd == cfd || getsockname(fd, (struct sockaddr *)&a, &al) != 0 ||
                getpeername(fd, (struct sockaddr *)&b, &bl) != 0 || al != sizeof(a) ||
                bl != sizeof(b) || a.sin_family != AF_INET || b.sin_family != AF_INET)
                continue;
            if (a.sin_port == peer.sin_port && b.sin_port == me.sin_port &&
                a.sin_addr.s_addr == peer.sin_addr.s_addr) {
                assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)), 0);
                return;
            }
        }
        assert_true(util_mono_ms() < deadline);
    }
}

/* Ask for `path` and read the answer `per_tick` bytes every 50 ms until the server
 * finishes the request (on_close) or max_ms pass. small_bufs: 16 KiB socket buffers on
 * both ends, so the server soon holds output back and is woken often. Returns the ms
 * until on_close, or -1. */
static int64_t read_slowly(struct srv *s, const char *path, bool small_bufs, size_t per_tick,
                           int64_t max_ms, size_t *got)
{
    int fd = cli_connect(s);
    if (small_bufs) {
        int rcv = 16 * 1024;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
        shrink_server_sndbuf(s, fd, 16 * 1024);
    }
    char req[128];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
    int closes = s->closes;
    cli_sends(s, fd, req);
    int64_t t0 = util_mono_ms(), next = t0;
    int64_t done_after = -1;
    *got = 0;
    while (util_mono_ms() - t0 < max_ms) {
        reactor_run_once(s->r, 5);
        if (s->closes > closes) {
            done_after = util_mono_ms() - t0;
            break;
        }
        if (util_mono_ms() < next)
            continue;
        next += 50;
        char buf[65536];
        for (size_t tick = 0; tick < per_tick;) {
            /* the socket's bytes as they are (TLS: records still encrypted): an OpenSSL
             * read would pull a whole record off the socket for one byte asked */
            ssize_t n = recv(fd, buf, MOTOR_MIN(per_tick - tick, sizeof(buf)), MSG_DONTWAIT);
            if (n <= 0)
                break;
            tick += (size_t)n;
            *got += (size_t)n;
        }
    }
    cli_close(fd);
    return done_after;
}

/* Each write reset the idle timer, so a client reading a big answer slowly, but steadily
 * enough that the server could write something within every idle timeout, kept its
 * connection (and, for a stream, the upstream work behind it) forever. After the first
 * idle timeout held-back output must now drain at min_rate on average. With the default
 * 500 B/s that takes a long timeout to show (see httpd_set_min_rate); here the rate is
 * 200 KB/s and the reader takes 40 KB/s, in pieces that let the server write every few
 * hundred ms: never idle for the 1 s timeout, yet far below the rate. */
static void test_slow_reader_is_closed(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-slowreader", .idle_timeout_s = 1};
    srv_start(&s, &cfg);
    size_t got = 0;
    /* at the default rate: a reader of 20 B/s is closed within bounds */
    int64_t t = read_slowly(&s, "/bigresp", true, 1, 8000, &got);
    if (t < 0 || t > 4000)
        fail_msg("a trickling reader was closed after %lld ms", (long long)t);
    assert_true(s.gone_at_close);
    httpd_set_min_rate(s.h, 200 * 1000);
    /* an answer with a length */
    t = read_slowly(&s, "/bigresp", true, 2000, 8000, &got);
    if (t < 0 || t > 4500 || !s.gone_at_close)
        fail_msg("a slow reader of an answer: closed after %lld ms (%zu bytes read)", (long long)t,
                 got);
    assert_true(got < BIG_RESP);
    /* a stream: finished with client_gone, so its producer stops */
    t = read_slowly(&s, "/big", true, 2000, 8000, &got);
    if (t < 0 || t > 4500 || !s.gone_at_close)
        fail_msg("a slow reader of a stream: closed after %lld ms (%zu bytes read)", (long long)t,
                 got);
    assert_null(s.held);
    /* a reader that keeps up (5 MB/s: 1.6 s for 8 MiB, past the 1 s idle timeout) gets
     * everything */
    t = read_slowly(&s, "/bigresp", false, 256 * 1024, 8000, &got);
    if (t < 0 || s.gone_at_close)
        fail_msg("a normal reader: %lld ms, %zu bytes", (long long)t, got);
    srv_stop(&s);
}

/* A stream with nothing to send is waiting for its producer, not for its client: it
 * outlives the idle timeout however long the model thinks. */
static void test_idle_stream_is_kept(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-idlestream", .idle_timeout_s = 1};
    srv_start(&s, &cfg);
    httpd_set_min_rate(s.h, 200 * 1000);
    int fd = cli_connect(&s);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    cli_sends(&s, fd, "GET /idle HTTP/1.1\r\nHost: x\r\n\r\n");
    bool eof = false;
    cli_read_until(&s, fd, &in, "first", 1, &eof);
    int64_t t0 = util_mono_ms();
    while (util_mono_ms() - t0 < 3000)
        reactor_run_once(s.r, 50);
    assert_int_equal(s.closes, 0);
    assert_non_null(s.held);
    assert_int_equal(httpd_stream_write(s.held, "second", 6), 0);
    httpd_stream_end(s.held, false);
    cli_read_until(&s, fd, &in, "0\r\n\r\n", 1, &eof);
    assert_false(eof);
    assert_non_null(strstr(strbuf_str(&in), "second"));
    loop_until_closes(&s, 1);
    assert_false(s.gone_at_close);
    cli_close(fd);
    strbuf_release(&in);
    srv_stop(&s);
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
    cli_ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    return 0;
}

static int group_tls_end(void **state)
{
    SSL_CTX_free(cli_ctx);
    cli_ctx = NULL;
    tlsfix_cleanup();
    return 0;
}

int main(void)
{
    log_set_level(getenv("TEST_LOG_DEBUG") ? LOG_DEBUG : LOG_ERROR);
    if (getenv("TEST_ONLY")) /* a glob, for working on one case */
        cmocka_set_test_filter(getenv("TEST_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipelined_requests),
        cmocka_unit_test(test_large_body_grows),
        cmocka_unit_test(test_chunked_request_body),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_malformed_heads),
        cmocka_unit_test(test_http10_and_keepalive),
        cmocka_unit_test(test_disconnect_while_suspended),
        cmocka_unit_test(test_stream_backpressure),
        cmocka_unit_test(test_idle_timeout_and_max_connections),
        cmocka_unit_test(test_max_connections_evicts_oldest_idle),
        cmocka_unit_test(test_stale_watch_on_accepted_fd),
        cmocka_unit_test(test_slow_request_is_closed),
        cmocka_unit_test(test_oversized_response_header_dropped_whole),
        cmocka_unit_test(test_accept_emfile_does_not_spin),
        cmocka_unit_test(test_host_required),
        cmocka_unit_test(test_absolute_form),
        cmocka_unit_test(test_date_header),
        cmocka_unit_test(test_slow_reader_is_closed),
        cmocka_unit_test(test_idle_stream_is_kept),
    };
    int failed = cmocka_run_group_tests_name("plain", tests, group_plain, NULL);
    failed += cmocka_run_group_tests_name("tls", tests, group_tls, group_tls_end);
    return failed;
}
