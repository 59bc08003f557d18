/* httpd's TLS-only behaviour, against OpenSSL clients (not our code) on 127.0.0.1:
 * mutual TLS with expired, foreign and revoked client certificates (CRL), encrypted
 * keys, bad material, certificate reload without touching open connections, session
 * resumption, TLS 1.3 as the minimum, close_notify on graceful closes — and bad input:
 * plain HTTP on a TLS port, a ClientHello on a plain port, a handshake that stops
 * halfway or trickles (slowloris over TLS), a truncated record, a peer that never sends
 * close_notify. Each bad input must give one clear log line and a closed connection,
 * and leave the slot free (max_connections 1: the next client is served). The cases
 * shared with plain HTTP run in test_httpd_native.c and test_httpd.c (TLS groups). */
#include "common/httpd.h"
#include "common/log.h"
#include "common/reactor.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tlsfix.h"

#define DEADLINE_MS 10000

/* ---- the server and its log ---------------------------------------------------------- */

struct srv {
    struct reactor *r;
    struct httpd *h;
    int handled;
    int logfd[2];
    struct strbuf log;
};

static void h_ok(struct httpd_req *req, void *arg)
{
    ((struct srv *)arg)->handled++;
    httpd_respond(req, 200, "text/plain", "ok", 2);
}

/* A TLS listener on the test CA's server certificate unless cfg names its own
 * certificate, or (a plain listener) a name. */
static void srv_start(struct srv *s, struct httpd_config *cfg)
{
    memset(s, 0, sizeof(*s));
    assert_int_equal(pipe2(s->logfd, O_NONBLOCK | O_CLOEXEC), 0);
    strbuf_init(&s->log, 4 << 20);
    log_set_level(LOG_DEBUG);
    log_set_fd(s->logfd[1]);
    s->r = reactor_new();
    cfg->host = "127.0.0.1";
    if (!cfg->tls_cert_file && !cfg->name) {
        cfg->tls_cert_file = tlsfix("srv.crt");
        cfg->tls_key_file = tlsfix("srv.key");
    }
    s->h = httpd_new(s->r, cfg);
    assert_non_null(s->h);
    httpd_route(s->h, "GET", "/ok", h_ok, s, 0);
}

static void srv_stop(struct srv *s)
{
    httpd_free(s->h);
    reactor_free(s->r);
    log_set_fd(STDERR_FILENO);
    log_set_level(LOG_ERROR);
    close(s->logfd[0]);
    close(s->logfd[1]);
    strbuf_release(&s->log);
}

static void pump(void *arg)
{
    reactor_run_once(((struct srv *)arg)->r, 2);
}

/* The log lines so far (JSON, one per line). */
static const char *logs(struct srv *s)
{
    char buf[65536];
    ssize_t n;
    while ((n = read(s->logfd[0], buf, sizeof(buf))) > 0)
        strbuf_append(&s->log, buf, (size_t)n);
    return strbuf_str(&s->log);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Run the loop until a log line holding both texts appears. */
static void wait_log(struct srv *s, const char *event, const char *text)
{
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    for (;;) {
        const char *l = logs(s);
        for (const char *p = l; (p = strstr(p, event)) != NULL; p++) {
            const char *eol = strchrnul(p, '\n');
            const char *t = text ? strstr(p, text) : p;
            if (t && t < eol)
                return;
        }
        if (util_mono_ms() > deadline)
            fail_msg("no log line %s with \"%s\" in:\n%s", event, text ? text : "", l);
        reactor_run_once(s->r, 10);
    }
}

/* ---- clients ---------------------------------------------------------------------------- */

static int tcp_connect(struct srv *s)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(httpd_port(s->h)),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_true(fd >= 0);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    assert_true(rc == 0 || errno == EINPROGRESS);
    return fd;
}

/* A TLS client connection (NULL: the handshake failed). */
static SSL *tls_connect(struct srv *s, SSL_CTX *ctx, int *fd_out)
{
    int fd = tcp_connect(s);
    SSL *ssl = tlsfix_handshake(ctx, fd, "127.0.0.1", pump, s, DEADLINE_MS);
    if (!ssl) {
        close(fd);
        *fd_out = -1;
        return NULL;
    }
    /* take the server's session tickets now: a socket closed with unread bytes sends
     * a reset, and a test of how we close would see that instead */
    for (int i = 0; i < 3; i++) {
        pump(s);
        char b[64];
        if (tlsfix_read(ssl, b, sizeof(b)) >= 0) /* data or an end: the test will see */
            break;
    }
    *fd_out = fd;
    return ssl;
}

/* Send req and read the answer up to `until` or the end. Returns what arrived; *end
 * says whether the connection ended and *clean whether with close_notify. */
static void exchange(struct srv *s, SSL *ssl, const char *req, const char *until, struct strbuf *in,
                     bool *end, bool *clean)
{
    size_t n = strlen(req);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (n) {
        ssize_t w = tlsfix_write(ssl, req, n);
        if (w > 0) {
            req += w;
            n -= (size_t)w;
        } else if (errno != EAGAIN) {
            break;
        }
        pump(s);
        assert_true(util_mono_ms() < deadline);
    }
    *end = false;
    if (clean)
        *clean = false;
    for (;;) {
        if (until && strstr(strbuf_str(in), until))
            return;
        char buf[16384];
        size_t got = 0;
        if (SSL_read_ex(ssl, buf, sizeof(buf), &got) == 1) {
            strbuf_append(in, buf, got);
            continue;
        }
        int e = SSL_get_error(ssl, 0);
        ERR_clear_error();
        if (e != SSL_ERROR_WANT_READ) {
            *end = true;
            if (clean)
                *clean = e == SSL_ERROR_ZERO_RETURN;
            return;
        }
        assert_true(util_mono_ms() < deadline);
        pump(s);
    }
}

static void tls_close(SSL *ssl, int fd)
{
    SSL_free(ssl);
    close(fd);
}

/* One request on a new connection with ctx: true when it was answered 200. */
static bool served(struct srv *s, SSL_CTX *ctx)
{
    int fd;
    SSL *ssl = tls_connect(s, ctx, &fd);
    if (!ssl)
        return false;
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool end = false;
    exchange(s, ssl, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, NULL);
    bool ok = strstr(strbuf_str(&in), "HTTP/1.1 200 OK") != NULL;
    strbuf_release(&in);
    tls_close(ssl, fd);
    return ok;
}

/* A ClientHello as OpenSSL writes it (memory BIOs: nothing is sent). */
static size_t client_hello(char *out, size_t cap)
{
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL *ssl = SSL_new(ctx);
    BIO *in = BIO_new(BIO_s_mem()), *wb = BIO_new(BIO_s_mem());
    SSL_set_bio(ssl, in, wb);
    SSL_set_connect_state(ssl);
    (void)SSL_do_handshake(ssl);
    ERR_clear_error();
    int n = BIO_read(wb, out, (int)cap);
    SSL_free(ssl);
    SSL_CTX_free(ctx);
    assert_true(n > 50);
    return (size_t)n;
}

/* ---- tests -------------------------------------------------------------------------------- */

/* Mutual TLS with a CRL: the CA's client certificate is served; none, an expired one,
 * one from another CA and a revoked one fail the handshake, each logged once with the
 * peer and OpenSSL's reason, and the handler never runs for them. */
static void test_mutual_tls_and_crl(void **state)
{
    struct srv s;
    struct httpd_config cfg = {
        .tls_ca_file = tlsfix("ca.crt"), .tls_crl_file = tlsfix("crl.pem"), .max_connections = 1};
    srv_start(&s, &cfg);
    wait_log(&s, "http_listening", "\"mutual_tls\":true");
    static const struct {
        const char *crt, *key, *reason;
    } bad[] = {
        {NULL, NULL, "peer did not return a certificate"},
        {"expired.crt", "expired.key", "certificate has expired"},
        {"other-cli.crt", "other-cli.key", "unable to get local issuer certificate"},
        {"revoked.crt", "revoked.key", "certificate revoked"},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), bad[i].crt ? tlsfix(bad[i].crt) : NULL,
                                         bad[i].key ? tlsfix(bad[i].key) : NULL);
        int before = count(logs(&s), "tls_handshake_failed");
        assert_false(served(&s, ctx)); /* TLS 1.3: the client may finish first, then fails */
        wait_log(&s, "tls_handshake_failed", bad[i].reason);
        assert_int_equal(count(logs(&s), "tls_handshake_failed"), before + 1); /* once */
        assert_non_null(strstr(logs(&s), "\"peer\":\"127.0.0.1\""));
        SSL_CTX_free(ctx);
    }
    assert_int_equal(s.handled, 0);
    /* the slot is free again: a proper client is served */
    SSL_CTX *good = tlsfix_client_ctx(tlsfix("ca.crt"), tlsfix("cli.crt"), tlsfix("cli.key"));
    assert_true(served(&s, good));
    assert_int_equal(s.handled, 1);
    SSL_CTX_free(good);
    srv_stop(&s);
}

static void test_encrypted_key(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.tls_cert_file = tlsfix("srv.crt"),
                               .tls_key_file = tlsfix("srv-enc.key"),
                               .tls_key_password = "hunter2"};
    srv_start(&s, &cfg);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    assert_true(served(&s, ctx));
    SSL_CTX_free(ctx);
    srv_stop(&s);
    struct reactor *r = reactor_new();
    struct httpd_config wrong = cfg;
    wrong.tls_key_password = "hunter3";
    errno = 0;
    assert_null(httpd_new(r, &wrong));
    assert_int_equal(errno, EINVAL);
    struct httpd_config none = cfg;
    none.tls_key_password = NULL; /* refused, not a prompt on the terminal */
    assert_null(httpd_new(r, &none));
    assert_int_equal(errno, EINVAL);
    reactor_free(r);
}

static void test_bad_material(void **state)
{
    struct reactor *r = reactor_new();
    static const struct {
        const char *cert, *key, *ca, *crl, *minv, *ciphers;
        int err;
    } cases[] = {
        {"/nonexistent/motor.crt", "srv.key", NULL, NULL, NULL, NULL, ENOENT},
        {"srv.crt", "/nonexistent/motor.key", NULL, NULL, NULL, NULL, ENOENT},
        {"srv.crt", NULL, NULL, NULL, NULL, NULL, EINVAL},      /* half */
        {"srv.crt", "srv.crt", NULL, NULL, NULL, NULL, EINVAL}, /* a certificate as key */
        {"srv.crt", "cli.key", NULL, NULL, NULL, NULL, EINVAL}, /* another key */
        {"srv.crt", "srv.key", "/nonexistent/ca.crt", NULL, NULL, NULL, ENOENT},
        {"srv.crt", "srv.key", NULL, "crl.pem", NULL, NULL, EINVAL},    /* CRL without a CA */
        {"srv.crt", "srv.key", "ca.crt", "ca.crt", NULL, NULL, EINVAL}, /* not a CRL */
        {"srv.crt", "srv.key", NULL, NULL, "TLSv1.1", NULL, EINVAL},
        {"srv.crt", "srv.key", NULL, NULL, NULL, "NO-SUCH-CIPHER", EINVAL},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char c1[128], c2[128], c3[128], c4[128];
#define FIX(buf, name)                                                                             \
    ((name) && (name)[0] != '/' ? (snprintf(buf, sizeof(buf), "%s", tlsfix(name)), buf) : (name))
        struct httpd_config cfg = {.name = "t-bad",
                                   .tls_cert_file = FIX(c1, cases[i].cert),
                                   .tls_key_file = FIX(c2, cases[i].key),
                                   .tls_ca_file = FIX(c3, cases[i].ca),
                                   .tls_crl_file = FIX(c4, cases[i].crl),
                                   .tls_min_version = cases[i].minv,
                                   .tls_ciphers = cases[i].ciphers};
#undef FIX
        errno = 0;
        struct httpd *h = httpd_new(r, &cfg);
        if (h || errno != cases[i].err)
            fail_msg("case %zu: %p errno %d, want %d", i, (void *)h, errno, cases[i].err);
    }
    reactor_free(r);
}

/* A reload swaps the certificate for new connections; one already open keeps its
 * session and goes on working; a failed reload keeps the last good context. */
static void test_certificate_reload(void **state)
{
    struct srv s;
    struct httpd_config cfg = {0};
    srv_start(&s, &cfg);
    SSL_CTX *ours = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL_CTX *theirs = tlsfix_client_ctx(tlsfix("other-ca.crt"), NULL, NULL);
    int old_fd;
    SSL *old = tls_connect(&s, ours, &old_fd);
    assert_non_null(old);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool end = false;
    exchange(&s, old, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, NULL);
    assert_non_null(strstr(strbuf_str(&in), "200 OK"));

    struct httpd_config next = {.tls_cert_file = tlsfix("other-srv.crt"),
                                .tls_key_file = tlsfix("other-srv.key")};
    assert_int_equal(httpd_tls_reload(s.h, &next), 0);
    wait_log(&s, "httpd_tls_reloaded", NULL);
    assert_false(served(&s, ours));
    assert_true(served(&s, theirs));
    /* the connection opened before the reload is untouched */
    strbuf_reset(&in);
    exchange(&s, old, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, NULL);
    assert_non_null(strstr(strbuf_str(&in), "200 OK"));
    assert_false(end);
    tls_close(old, old_fd);
    /* a bad reload is refused and changes nothing */
    struct httpd_config broken = {.tls_cert_file = tlsfix("srv.crt"),
                                  .tls_key_file = "/nonexistent/key.pem"};
    assert_int_equal(httpd_tls_reload(s.h, &broken), -ENOENT);
    struct httpd_config half = {.tls_cert_file = tlsfix("srv.crt")};
    assert_int_equal(httpd_tls_reload(s.h, &half), -EINVAL);
    assert_true(served(&s, theirs));
    strbuf_release(&in);
    SSL_CTX_free(ours);
    SSL_CTX_free(theirs);
    srv_stop(&s);
    /* a plain listener cannot become a TLS one */
    struct reactor *r = reactor_new();
    struct httpd_config plain = {.name = "t-plain"};
    struct httpd *h = httpd_new(r, &plain);
    assert_non_null(h);
    assert_int_equal(httpd_tls_reload(h, &next), -EINVAL);
    httpd_free(h);
    reactor_free(r);
}

/* Tickets resume sessions, client certificates verified or not. */
static void test_session_resumption(void **state)
{
    for (int mtls = 0; mtls < 2; mtls++) {
        struct srv s;
        struct httpd_config cfg = {.tls_ca_file = mtls ? tlsfix("ca.crt") : NULL};
        srv_start(&s, &cfg);
        SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), mtls ? tlsfix("cli.crt") : NULL,
                                         mtls ? tlsfix("cli.key") : NULL);
        SSL_SESSION *sess = NULL;
        for (int i = 0; i < 2; i++) {
            int fd = tcp_connect(&s);
            SSL *ssl = SSL_new(ctx);
            SSL_set_fd(ssl, fd);
            if (sess)
                SSL_set_session(ssl, sess);
            int64_t deadline = util_mono_ms() + DEADLINE_MS;
            while (SSL_connect(ssl) != 1) {
                ERR_clear_error();
                assert_true(util_mono_ms() < deadline);
                pump(&s);
            }
            struct strbuf in;
            strbuf_init(&in, 1 << 20);
            bool end;
            exchange(&s, ssl, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, NULL);
            assert_non_null(strstr(strbuf_str(&in), "200 OK"));
            strbuf_release(&in);
            if (SSL_session_reused(ssl) != (i == 1))
                fail_msg("round %d mtls %d: reused %d, resumable %d, ticket %d", i, mtls,
                         SSL_session_reused(ssl), sess ? SSL_SESSION_is_resumable(sess) : -1,
                         sess ? SSL_SESSION_has_ticket(sess) : -1);
            if (!sess)
                sess = SSL_get1_session(ssl);
            (void)SSL_shutdown(ssl); /* OpenSSL drops the sessions of unclean closes */
            tls_close(ssl, fd);
        }
        wait_log(&s, "tls_handshake_done", "\"resumed\":true");
        SSL_SESSION_free(sess);
        SSL_CTX_free(ctx);
        srv_stop(&s);
    }
}

static void test_min_version(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.tls_cert_file = tlsfix("srv.crt"),
                               .tls_key_file = tlsfix("srv.key"),
                               .tls_min_version = "TLSv1.3"};
    srv_start(&s, &cfg);
    SSL_CTX *old = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL_CTX_set_max_proto_version(old, TLS1_2_VERSION);
    assert_false(served(&s, old));
    wait_log(&s, "tls_handshake_failed", "unsupported protocol");
    SSL_CTX *cur = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    assert_true(served(&s, cur));
    /* and by default TLS 1.2 is the floor: 1.1 is refused */
    srv_stop(&s);
    struct httpd_config dflt = {0};
    srv_start(&s, &dflt);
    SSL_CTX *ancient = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL_CTX_set_min_proto_version(ancient, TLS1_VERSION);
    SSL_CTX_set_max_proto_version(ancient, TLS1_1_VERSION);
    SSL_CTX_set_security_level(ancient, 0);
    assert_false(served(&s, ancient));
    assert_true(served(&s, old)); /* 1.2 */
    SSL_CTX_free(ancient);
    SSL_CTX_free(old);
    SSL_CTX_free(cur);
    srv_stop(&s);
}

/* A graceful close says so: after "Connection: close" the client reads close_notify. */
static void test_close_notify_sent(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.idle_timeout_s = 1};
    srv_start(&s, &cfg);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    int fd;
    SSL *ssl = tls_connect(&s, ctx, &fd);
    assert_non_null(ssl);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool end = false, clean = false;
    exchange(&s, ssl, "GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", NULL, &in, &end,
             &clean);
    assert_non_null(strstr(strbuf_str(&in), "\r\n\r\nok"));
    assert_true(end);
    assert_true(clean);
    tls_close(ssl, fd);
    /* an idle keep-alive connection timed out: close_notify too */
    ssl = tls_connect(&s, ctx, &fd);
    strbuf_reset(&in);
    exchange(&s, ssl, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, &clean);
    exchange(&s, ssl, "", NULL, &in, &end, &clean); /* wait for the idle close */
    assert_true(end);
    assert_true(clean);
    tls_close(ssl, fd);
    strbuf_release(&in);
    SSL_CTX_free(ctx);
    srv_stop(&s);
}

static void test_plain_http_on_tls_port(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.max_connections = 1};
    srv_start(&s, &cfg);
    int fd = tcp_connect(&s);
    const char *req = "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(util_write_all(fd, req, strlen(req)), 0);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    for (;;) {
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            strbuf_append(&in, buf, (size_t)n);
            continue;
        }
        if (n == 0 || (n < 0 && errno != EAGAIN))
            break;
        assert_true(util_mono_ms() < deadline);
        reactor_run_once(s.r, 10);
    }
    close(fd);
    assert_non_null(strstr(strbuf_str(&in), "HTTP/1.1 400 Bad Request"));
    assert_non_null(strstr(strbuf_str(&in), "plain HTTP request sent to a TLS port"));
    wait_log(&s, "tls_handshake_failed", "plain HTTP request on a TLS port");
    assert_int_equal(s.handled, 0);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    assert_true(served(&s, ctx)); /* the slot is free */
    SSL_CTX_free(ctx);
    strbuf_release(&in);
    srv_stop(&s);
}

/* A ClientHello on a plain port: closed at once (not after the idle timeout), logged. */
static void test_client_hello_on_plain_port(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.name = "t-plain", .idle_timeout_s = 30};
    srv_start(&s, &cfg);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    int64_t t0 = util_mono_ms();
    int fd;
    SSL *ssl = tls_connect(&s, ctx, &fd);
    assert_null(ssl);
    assert_true(util_mono_ms() - t0 < 5000);
    wait_log(&s, "http_tls_on_plain_port", "127.0.0.1");
    SSL_CTX_free(ctx);
    srv_stop(&s);
}

/* Feed the first `len` bytes of hello, then one more every gap_ms (0: none), until
 * the server closes or max_ms pass. Returns ms until the close, or -1. */
static int64_t stall(struct srv *s, const char *hello, size_t len, size_t total, int gap_ms,
                     int64_t max_ms)
{
    int fd = tcp_connect(s);
    int64_t t0 = util_mono_ms(), next = t0 + gap_ms, closed = -1;
    size_t sent = 0;
    while (util_mono_ms() - t0 < max_ms) {
        if (sent < len || (gap_ms && util_mono_ms() >= next && sent < total)) {
            size_t n = sent < len ? len - sent : 1;
            ssize_t w = send(fd, hello + sent, n, MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            next += gap_ms;
        }
        reactor_run_once(s->r, 10);
        char buf[256];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            closed = util_mono_ms() - t0;
            break;
        }
    }
    close(fd);
    return closed;
}

/* A handshake that stops halfway, and one that trickles a byte every 100 ms: both are
 * cut by the idle rule (a handshake's bytes are no progress), logged, and the slot is
 * free for the next client. */
static void test_handshake_stalls(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.idle_timeout_s = 1, .max_connections = 1};
    srv_start(&s, &cfg);
    char hello[4096];
    size_t n = client_hello(hello, sizeof(hello));
    int64_t t = stall(&s, hello, n / 2, n, 0, 8000);
    if (t < 900 || t > 4000)
        fail_msg("a half handshake was closed after %lld ms", (long long)t);
    wait_log(&s, "tls_handshake_timeout", "127.0.0.1");
    t = stall(&s, hello, 10, n, 100, 8000);
    if (t < 900 || t > 4000)
        fail_msg("a trickling handshake was closed after %lld ms", (long long)t);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    assert_true(served(&s, ctx));
    SSL_CTX_free(ctx);
    srv_stop(&s);
}

/* After the handshake: a record cut short by the close, a corrupted record, and a
 * client that closes without close_notify (mid-request and between requests). */
static void test_bad_records_and_no_close_notify(void **state)
{
    struct srv s;
    struct httpd_config cfg = {.max_connections = 1};
    srv_start(&s, &cfg);
    SSL_CTX *ctx = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    char buf[256];

    /* a record header promising 100 bytes, 20 of them, the close */
    int fd;
    SSL *ssl = tls_connect(&s, ctx, &fd);
    assert_non_null(ssl);
    memcpy(buf, "\x17\x03\x03\x00\x64", 5);
    memset(buf + 5, 0x41, 20);
    assert_int_equal(util_write_all(fd, buf, 25), 0);
    shutdown(fd, SHUT_WR);
    wait_log(&s, "tls_closed_without_close_notify", NULL);
    tls_close(ssl, fd);

    /* a corrupted record: its MAC fails */
    ssl = tls_connect(&s, ctx, &fd);
    assert_non_null(ssl);
    memcpy(buf, "\x17\x03\x03\x00\x30", 5);
    memset(buf + 5, 0x5a, 0x30);
    assert_int_equal(util_write_all(fd, buf, 5 + 0x30), 0);
    wait_log(&s, "tls_read_failed", "127.0.0.1");
    tls_close(ssl, fd);

    /* half a request, then the TCP close without close_notify */
    ssl = tls_connect(&s, ctx, &fd);
    assert_non_null(ssl);
    assert_true(tlsfix_write(ssl, "GET /ok HTTP/1.1\r\nHo", 20) == 20);
    for (int i = 0; i < 5; i++)
        pump(&s);
    tls_close(ssl, fd);
    wait_log(&s, "tls_closed_without_close_notify", "\"mid_request\":true");

    /* a whole exchange, then the same close: harmless, logged at debug */
    ssl = tls_connect(&s, ctx, &fd);
    struct strbuf in;
    strbuf_init(&in, 1 << 20);
    bool end;
    exchange(&s, ssl, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n", "\r\n\r\nok", &in, &end, NULL);
    strbuf_release(&in);
    tls_close(ssl, fd);
    wait_log(&s, "tls_closed_without_close_notify", "\"mid_request\":false");

    /* nothing is stuck: the single slot serves the next client */
    assert_true(served(&s, ctx));
    assert_int_equal(s.handled, 2);
    SSL_CTX_free(ctx);
    srv_stop(&s);
}

static int setup(void **state)
{
    return tlsfix_make();
}

static int teardown(void **state)
{
    tlsfix_cleanup();
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the OpenSSL clients write with write(2) */
    log_set_level(LOG_ERROR);
    if (getenv("TEST_ONLY")) /* a glob, for working on one case */
        cmocka_set_test_filter(getenv("TEST_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutual_tls_and_crl),
        cmocka_unit_test(test_encrypted_key),
        cmocka_unit_test(test_bad_material),
        cmocka_unit_test(test_certificate_reload),
        cmocka_unit_test(test_session_resumption),
        cmocka_unit_test(test_min_version),
        cmocka_unit_test(test_close_notify_sent),
        cmocka_unit_test(test_plain_http_on_tls_port),
        cmocka_unit_test(test_client_hello_on_plain_port),
        cmocka_unit_test(test_handshake_stalls),
        cmocka_unit_test(test_bad_records_and_no_close_notify),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
