/* httpc's TLS-only behaviour against servers nobody here wrote: `openssl s_server`, and
 * a scripted OpenSSL server in a thread of this test. Server verification (an expired
 * certificate, a wrong name, another CA, a revoked one with a CRL), client certificates
 * (encrypted keys), session resumption on a pool, a close-delimited body without
 * close_notify (possible truncation), a handshake that never completes (connect
 * timeout, cancel, free), a plain server behind an https:// URL, TLS 1.3 as the
 * minimum, unusable TLS settings. The cases shared with http:// run in test_httpc.c
 * and test_httpc_native.c (https groups). */
#include "common/httpc.h"
#include "common/reactor.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
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

extern char **environ;

/* ---- a scripted TLS server: one connection at a time, in a thread -------------------- */

enum mode {
    M_OK,          /* 200 with a length, keep-alive */
    M_CLOSE,       /* 200 with a length and Connection: close */
    M_UNTIL_CLOSE, /* a body that runs to the close, then close_notify */
    M_NO_NOTIFY,   /* a body that runs to the close, then a bare TCP close */
};

#define SSRV_CONNS 64

struct ssrv {
    int lfd, port;
    pthread_t thr;
    pthread_t cthr[SSRV_CONNS];
    int cfd[SSRV_CONNS];
    int nconn;    /* accept thread only, read after it is joined */
    SSL_CTX *ctx; /* NULL: plain HTTP (a server that does not speak TLS) */
    enum mode mode;
    atomic_bool stop;
    atomic_int accepted, handshakes, reused, requests, client_certs;
};

static void serve(struct ssrv *s, int fd)
{
    struct tio t;
    if (tio_accept(&t, fd, s->ctx) != 0)
        return;
    if (t.ssl) {
        atomic_fetch_add(&s->handshakes, 1);
        if (SSL_session_reused(t.ssl))
            atomic_fetch_add(&s->reused, 1);
        X509 *peer = SSL_get1_peer_certificate(t.ssl);
        if (peer) {
            atomic_fetch_add(&s->client_certs, 1);
            X509_free(peer);
        }
    }
    char buf[8192];
    size_t have = 0;
    for (;;) {
        char *end;
        while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
            ssize_t r = have < sizeof(buf) ? tio_recv(&t, buf + have, sizeof(buf) - have) : 0;
            if (r <= 0)
                goto out;
            have += (size_t)r;
            if (!t.ssl && (buf[0] < 'A' || buf[0] > 'Z')) { /* not HTTP: a real server says so */
                tio_send_all(&t, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", 47);
                goto out;
            }
        }
        size_t hl = (size_t)(end - buf) + 4;
        atomic_fetch_add(&s->requests, 1);
        memmove(buf, buf + hl, have - hl);
        have -= hl;
        switch (s->mode) {
        case M_OK:
            if (tio_send_all(&t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 40) != 0)
                goto out;
            continue;
        case M_CLOSE:
            tio_send_all(&t, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
                         59);
            tio_end(&t, true);
            return;
        case M_UNTIL_CLOSE:
            tio_send_all(&t, "HTTP/1.1 200 OK\r\n\r\nall of it", 29);
            tio_end(&t, true);
            return;
        case M_NO_NOTIFY:
            tio_send_all(&t, "HTTP/1.1 200 OK\r\n\r\nall of it", 29);
            tio_end(&t, false);
            return;
        }
    }
out:
    tio_end(&t, true);
}

struct carg {
    struct ssrv *s;
    int fd;
};

static void *conn_main(void *arg)
{
    struct carg *a = arg;
    serve(a->s, a->fd);
    free(a);
    return NULL;
}

/* A thread per connection (a client may keep one idle while it opens another). */
static void *ssrv_main(void *arg)
{
    struct ssrv *s = arg;
    while (!atomic_load(&s->stop) && s->nconn < SSRV_CONNS) {
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        if (poll(&p, 1, 20) <= 0)
            continue;
        int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        atomic_fetch_add(&s->accepted, 1);
        struct carg *a = xmalloc(sizeof(*a));
        a->s = s;
        a->fd = fd;
        s->cfd[s->nconn] = fd;
        if (pthread_create(&s->cthr[s->nconn], NULL, conn_main, a) != 0)
            abort();
        s->nconn++;
    }
    return NULL;
}

/* crt/key: the server's certificate (NULL: a plain HTTP server); verify_ca: require
 * client certificates from it. */
static struct ssrv *ssrv_start(const char *crt, const char *key, const char *verify_ca,
                               enum mode mode)
{
    struct ssrv *s = xcalloc(1, sizeof(*s));
    s->ctx = crt ? tlsfix_server_ctx(tlsfix(crt), tlsfix(key), verify_ca) : NULL;
    s->mode = mode;
    s->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(s->lfd, 16), 0);
    socklen_t len = sizeof(sa);
    getsockname(s->lfd, (struct sockaddr *)&sa, &len);
    s->port = ntohs(sa.sin_port);
    assert_int_equal(pthread_create(&s->thr, NULL, ssrv_main, s), 0);
    return s;
}

static void ssrv_stop(struct ssrv *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->thr, NULL);
    for (int i = 0; i < s->nconn; i++)
        shutdown(s->cfd[i], SHUT_RDWR); /* wakes a blocked read */
    for (int i = 0; i < s->nconn; i++) {
        pthread_join(s->cthr[i], NULL);
        close(s->cfd[i]);
    }
    close(s->lfd);
    SSL_CTX_free(s->ctx);
    free(s);
}

/* ---- the client ---------------------------------------------------------------------- */

struct res {
    int ncalls, error;
    long status;
    char text[512];
    char body[256];
};

static void on_done(const struct httpc_response *resp, void *arg)
{
    struct res *x = arg;
    x->ncalls++;
    x->error = resp->error;
    x->status = resp->status;
    snprintf(x->text, sizeof(x->text), "%s", resp->error_text);
    snprintf(x->body, sizeof(x->body), "%.*s", (int)resp->body_len, resp->body);
}

struct fx {
    struct reactor *r;
    struct httpc *c;
};

static int fx_setup(void **state)
{
    struct fx *f = xcalloc(1, sizeof(*f));
    f->r = reactor_new();
    f->c = httpc_new(f->r);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    struct fx *f = *state;
    httpc_free(f->c);
    reactor_free(f->r);
    free(f);
    return 0;
}

/* GET url with tls settings t; waits for done. */
static struct res get(struct fx *f, const char *url, const struct httpc_tls *t, int64_t timeout)
{
    struct res x = {0};
    struct httpc_opts o = {.url = url, .tls = t, .timeout_ms = timeout ? timeout : 5000};
    httpc_request(f->c, &o, on_done, &x);
    int64_t deadline = util_mono_ms() + 10000;
    while (!x.ncalls && util_mono_ms() < deadline)
        reactor_run_once(f->r, 10);
    assert_int_equal(x.ncalls, 1);
    return x;
}

static char *url_for(const char *host, int port)
{
    return xasprintf("https://%s:%d/x", host, port);
}

static void expect_fail(struct fx *f, struct ssrv *s, const char *host, const struct httpc_tls *t,
                        int err, const char *why)
{
    char *u = url_for(host, s->port);
    struct res x = get(f, u, t, 0);
    free(u);
    if (x.error != err || !strstr(x.text, why))
        fail_msg("wanted %d \"%s\", got %d \"%s\"", err, why, x.error, x.text);
}

static void expect_ok(struct fx *f, struct ssrv *s, const char *host, const struct httpc_tls *t)
{
    char *u = url_for(host, s->port);
    struct res x = get(f, u, t, 0);
    free(u);
    if (x.error || x.status != 200)
        fail_msg("wanted 200, got %d \"%s\"", x.error, x.text);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_server_verification(void **state)
{
    struct fx *f = *state;
    struct httpc_tls ca = {.ca_file = tlsfix("ca.crt")};
    struct httpc_tls ca_crl = {.ca_file = tlsfix("ca.crt"), .crl_file = tlsfix("crl.pem")};
    struct httpc_tls insecure = {.insecure = true};
    struct ssrv *s = ssrv_start("srv.crt", "srv.key", NULL, M_OK);
    expect_ok(f, s, "127.0.0.1", &ca);
    expect_ok(f, s, "localhost", &ca); /* the DNS name of the certificate */
    expect_ok(f, s, "127.0.0.1", &ca_crl);
    /* no CA given: the system's store, which does not know the test CA */
    unsetenv("SSL_CERT_FILE");
    expect_fail(f, s, "127.0.0.1", NULL, -EPROTO, "certificate verify failed");
    ssrv_stop(s);
    s = ssrv_start("srv-expired.crt", "srv-expired.key", NULL, M_OK);
    expect_fail(f, s, "127.0.0.1", &ca, -EPROTO, "certificate has expired");
    expect_ok(f, s, "127.0.0.1", &insecure);
    ssrv_stop(s);
    s = ssrv_start("srv-wrongname.crt", "srv-wrongname.key", NULL, M_OK);
    expect_fail(f, s, "127.0.0.1", &ca, -EPROTO, "IP address mismatch");
    expect_fail(f, s, "localhost", &ca, -EPROTO, "hostname mismatch");
    ssrv_stop(s);
    s = ssrv_start("other-srv.crt", "other-srv.key", NULL, M_OK);
    expect_fail(f, s, "127.0.0.1", &ca, -EPROTO, "unable to get local issuer certificate");
    ssrv_stop(s);
    s = ssrv_start("srv-revoked.crt", "srv-revoked.key", NULL, M_OK);
    expect_ok(f, s, "127.0.0.1", &ca); /* without the CRL nobody knows */
    expect_fail(f, s, "127.0.0.1", &ca_crl, -EPROTO, "certificate revoked");
    ssrv_stop(s);
}

static void test_client_certificate(void **state)
{
    struct fx *f = *state;
    struct ssrv *s = ssrv_start("srv.crt", "srv.key", tlsfix("ca.crt"), M_OK);
    struct httpc_tls with = {
        .ca_file = tlsfix("ca.crt"), .cert_file = tlsfix("cli.crt"), .key_file = tlsfix("cli.key")};
    struct httpc_tls enc = {.ca_file = tlsfix("ca.crt"),
                            .cert_file = tlsfix("cli.crt"),
                            .key_file = tlsfix("cli-enc.key"),
                            .key_password = "hunter2"};
    struct httpc_tls badpw = enc;
    badpw.key_password = "hunter3";
    struct httpc_tls without = {.ca_file = tlsfix("ca.crt")};
    struct httpc_tls foreign = {.ca_file = tlsfix("ca.crt"),
                                .cert_file = tlsfix("other-cli.crt"),
                                .key_file = tlsfix("other-cli.key")};
    expect_ok(f, s, "127.0.0.1", &with);
    expect_ok(f, s, "127.0.0.1", &enc);
    assert_int_equal(atomic_load(&s->client_certs), 2);
    expect_fail(f, s, "127.0.0.1", &badpw, -EIO, "wrong password");
    /* TLS 1.3: the refusal comes after our handshake completed, as an alert */
    char *u = url_for("127.0.0.1", s->port);
    struct res x = get(f, u, &without, 0);
    assert_true(x.error == -EPROTO || x.error == -EIO);
    assert_true(strlen(x.text) > 0);
    x = get(f, u, &foreign, 0);
    assert_true(x.error == -EPROTO || x.error == -EIO);
    free(u);
    ssrv_stop(s);
}

/* A pool keeps the session of its first connection; the next connection resumes it. */
static void test_session_resumption(void **state)
{
    struct fx *f = *state;
    struct ssrv *s = ssrv_start("srv.crt", "srv.key", NULL, M_CLOSE);
    struct httpc_tls ca = {.ca_file = tlsfix("ca.crt")};
    for (int i = 0; i < 4; i++)
        expect_ok(f, s, "127.0.0.1", &ca);
    assert_int_equal(atomic_load(&s->handshakes), 4);
    assert_int_equal(atomic_load(&s->reused), 3);
    ssrv_stop(s);
    /* keep-alive: one connection, one handshake */
    s = ssrv_start("srv.crt", "srv.key", NULL, M_OK);
    for (int i = 0; i < 5; i++)
        expect_ok(f, s, "127.0.0.1", &ca);
    assert_int_equal(atomic_load(&s->accepted), 1);
    assert_int_equal(atomic_load(&s->requests), 5);
    ssrv_stop(s);
}

/* A body that runs to the close is only whole when the close is TLS's. */
static void test_close_delimited_needs_close_notify(void **state)
{
    struct fx *f = *state;
    struct httpc_tls ca = {.ca_file = tlsfix("ca.crt")};
    struct ssrv *s = ssrv_start("srv.crt", "srv.key", NULL, M_UNTIL_CLOSE);
    char *u = url_for("127.0.0.1", s->port);
    struct res x = get(f, u, &ca, 0);
    assert_int_equal(x.error, 0);
    assert_string_equal(x.body, "all of it");
    free(u);
    ssrv_stop(s);
    s = ssrv_start("srv.crt", "srv.key", NULL, M_NO_NOTIFY);
    expect_fail(f, s, "127.0.0.1", &ca, -EIO, "may be truncated");
    ssrv_stop(s);
}

/* A listener that never answers the ClientHello (the kernel accepts, nobody reads). */
static int silent_listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t len = sizeof(sa);
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *port = ntohs(sa.sin_port);
    return fd;
}

static void test_handshake_never_completes(void **state)
{
    struct fx *f = *state;
    int port;
    int lfd = silent_listener(&port);
    char *u = url_for("127.0.0.1", port);
    struct httpc_tls ca = {.ca_file = tlsfix("ca.crt")};
    /* the connect timeout covers the handshake */
    struct res x = {0};
    struct httpc_opts o = {.url = u, .tls = &ca, .timeout_ms = 5000, .connect_timeout_ms = 300};
    int64_t t0 = util_mono_ms();
    httpc_request(f->c, &o, on_done, &x);
    while (!x.ncalls && util_mono_ms() - t0 < 5000)
        reactor_run_once(f->r, 10);
    int64_t took = util_mono_ms() - t0;
    assert_int_equal(x.error, -ETIMEDOUT);
    assert_non_null(strstr(x.text, "TLS handshake"));
    assert_true(took >= 300 && took < 2000);
    /* cancelled mid-handshake: no callback; freed mid-handshake: nothing leaks */
    struct res y = {0}, z = {0};
    struct httpc_req *q = httpc_request(f->c, &o, on_done, &y);
    for (int i = 0; i < 5; i++)
        reactor_run_once(f->r, 10);
    httpc_cancel(f->c, q);
    httpc_request(f->c, &o, on_done, &z);
    for (int i = 0; i < 5; i++)
        reactor_run_once(f->r, 10);
    assert_int_equal(httpc_active(f->c), 1);
    httpc_free(f->c);
    f->c = NULL;
    for (int i = 0; i < 5; i++)
        reactor_run_once(f->r, 10);
    assert_int_equal(y.ncalls, 0);
    assert_int_equal(z.ncalls, 0);
    free(u);
    close(lfd);
}

static void test_plain_server_behind_https(void **state)
{
    struct fx *f = *state;
    struct ssrv *s = ssrv_start(NULL, NULL, NULL, M_OK);
    struct httpc_tls ca = {.ca_file = tlsfix("ca.crt")};
    int64_t t0 = util_mono_ms();
    expect_fail(f, s, "127.0.0.1", &ca, -EPROTO, "TLS handshake");
    assert_true(util_mono_ms() - t0 < 3000);
    ssrv_stop(s);
}

static void test_min_version_and_bad_settings(void **state)
{
    struct fx *f = *state;
    struct ssrv *s = ssrv_start("srv.crt", "srv.key", NULL, M_OK);
    SSL_CTX_set_max_proto_version(s->ctx, TLS1_2_VERSION);
    struct httpc_tls v13 = {.ca_file = tlsfix("ca.crt"), .min_version = "TLSv1.3"};
    struct httpc_tls v12 = {.ca_file = tlsfix("ca.crt")};
    expect_fail(f, s, "127.0.0.1", &v13, -EPROTO, "TLS handshake");
    expect_ok(f, s, "127.0.0.1", &v12);
    struct httpc_tls missing = {.ca_file = "/nonexistent/ca.crt"};
    expect_fail(f, s, "127.0.0.1", &missing, -EIO, "No such file");
    struct httpc_tls badver = {.ca_file = tlsfix("ca.crt"), .min_version = "SSLv3"};
    expect_fail(f, s, "127.0.0.1", &badver, -EIO, "unsupported minimum TLS version");
    struct httpc_tls notcrl = {.ca_file = tlsfix("ca.crt"), .crl_file = tlsfix("ca.crt")};
    expect_fail(f, s, "127.0.0.1", &notcrl, -EIO, "no CRL");
    ssrv_stop(s);
}

/* ---- against `openssl s_server` --------------------------------------------------------- */

static int run_wait_quiet(char *const argv[])
{
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -rc;
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

/* s_server requiring a client certificate from the test CA; its pid and port. */
static pid_t start_s_server(int *port)
{
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    char *argv[] = {"openssl", "s_server",
                    "-accept", "127.0.0.1:0",
                    "-cert",   (char *)tlsfix("srv.crt"),
                    "-key",    (char *)tlsfix("srv.key"),
                    "-Verify", "1",
                    "-CAfile", (char *)tlsfix("ca.crt"),
                    "-www",    NULL};
    pid_t pid;
    assert_int_equal(posix_spawnp(&pid, "openssl", &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    char line[256];
    size_t have = 0;
    *port = 0;
    int64_t deadline = util_mono_ms() + 10000;
    while (!*port && util_mono_ms() < deadline && have < sizeof(line) - 1) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = read(pfd[0], line + have, sizeof(line) - 1 - have);
        if (r <= 0)
            break;
        have += (size_t)r;
        line[have] = '\0';
        const char *a = strstr(line, "ACCEPT 127.0.0.1:");
        if (a && strchr(a, '\n'))
            *port = (int)strtol(a + strlen("ACCEPT 127.0.0.1:"), NULL, 10);
    }
    close(pfd[0]);
    return pid;
}

static void test_openssl_s_server(void **state)
{
    struct fx *f = *state;
    char *ver[] = {"openssl", "version", NULL};
    assert_int_equal(run_wait_quiet(ver), 0);
    int port;
    pid_t pid = start_s_server(&port);
    assert_true(port > 0);
    char *u = xasprintf("https://127.0.0.1:%d/", port);
    struct httpc_tls ok = {
        .ca_file = tlsfix("ca.crt"), .cert_file = tlsfix("cli.crt"), .key_file = tlsfix("cli.key")};
    struct httpc_tls no_client_cert = {.ca_file = tlsfix("ca.crt")};
    struct httpc_tls insecure = {
        .cert_file = tlsfix("cli.crt"), .key_file = tlsfix("cli.key"), .insecure = true};
    struct httpc_tls no_ca = {.cert_file = tlsfix("cli.crt"), .key_file = tlsfix("cli.key")};
    const struct httpc_tls *cases[] = {&ok, &no_client_cert, &insecure, &no_ca, NULL};
    const bool want_ok[] = {true, false, true, false, false};
    unsetenv("SSL_CERT_FILE");
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct res x = get(f, u, cases[i], 5000);
        if (want_ok[i]) {
            if (x.error != 0 || x.status != 200 || !strstr(x.body, "s_server"))
                fail_msg("case %zu: %d %s", i, x.error, x.text);
        } else {
            assert_true(x.error < 0);
            assert_true(strlen(x.text) > 0);
        }
    }
    free(u);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static int group_setup(void **state)
{
    return tlsfix_make();
}

static int group_teardown(void **state)
{
    tlsfix_cleanup();
    return 0;
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN); /* the scripted server's OpenSSL writes with write(2) */
    if (getenv("TEST_ONLY"))  /* a glob, for working on one case */
        cmocka_set_test_filter(getenv("TEST_ONLY"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_server_verification, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_client_certificate, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_session_resumption, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_close_delimited_needs_close_notify, fx_setup,
                                        fx_teardown),
        cmocka_unit_test_setup_teardown(test_handshake_never_completes, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_plain_server_behind_https, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_min_version_and_bad_settings, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(test_openssl_s_server, fx_setup, fx_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
