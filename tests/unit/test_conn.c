/* conn: the transport under httpd and httpc, on socketpairs — the readiness rules that
 * make TLS safe under edge-triggered epoll (OpenSSL's buffered records drained without
 * a new event, the retry rule of a blocked write, the end of stream with and without
 * close_notify), key updates, refused renegotiation, plain HTTP on a TLS port, and no
 * SIGPIPE. One side is our conn; the other our conn or OpenSSL itself. */
#include "common/conn.h"
#include "common/tls.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "tlsfix.h"

#define DEADLINE_MS 10000

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
}

/* What epoll would report for fd right now (level view), handed to the conn. */
static void poll_events(struct conn *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLOUT};
    if (poll(&p, 1, 0) > 0)
        conn_on_events(c, ((p.revents & POLLIN) ? EPOLLIN : 0) |
                              ((p.revents & POLLOUT) ? EPOLLOUT : 0) |
                              ((p.revents & POLLHUP) ? EPOLLHUP : 0));
}

static struct tls_ctx *server_ctx(const char *ca)
{
    struct tls_config tc = {
        .cert_file = tlsfix("srv.crt"), .key_file = tlsfix("srv.key"), .ca_file = ca};
    char err[256];
    struct tls_ctx *ctx = tls_ctx_new_server(&tc, err, sizeof(err));
    if (!ctx)
        fail_msg("server context: %s", err);
    return ctx;
}

static struct tls_ctx *client_ctx(void)
{
    struct tls_config tc = {.ca_file = tlsfix("ca.crt")};
    char err[256];
    struct tls_ctx *ctx = tls_ctx_new_client(&tc, err, sizeof(err));
    if (!ctx)
        fail_msg("client context: %s", err);
    return ctx;
}

/* Both ends ours: handshake them against each other. */
static void tls_pair(struct conn *srv, struct conn *cli)
{
    int sv[2];
    pair(sv);
    struct tls_ctx *sc = server_ctx(NULL), *cc = client_ctx();
    assert_int_equal(conn_init_tls_server(srv, sv[0], sc), 0);
    assert_int_equal(conn_init_tls_client(cli, sv[1], cc, "127.0.0.1", NULL), 0);
    tls_ctx_unref(sc); /* the connections hold their own references */
    tls_ctx_unref(cc);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    int rs = -EAGAIN, rc = -EAGAIN;
    while (rs == -EAGAIN || rc == -EAGAIN) {
        assert_true(util_mono_ms() < deadline);
        poll_events(srv);
        poll_events(cli);
        if (rc == -EAGAIN && conn_handshake_ready(cli))
            rc = conn_handshake(cli);
        if (rs == -EAGAIN && conn_handshake_ready(srv))
            rs = conn_handshake(srv);
    }
    assert_int_equal(rs, 0);
    assert_int_equal(rc, 0);
    assert_string_equal(conn_tls_version(srv), "TLSv1.3");
    assert_true(conn_is_tls(srv) && conn_is_tls(cli));
}

static void test_plain_readiness(void **state)
{
    int sv[2];
    pair(sv);
    struct conn a, b;
    conn_init_plain(&a, sv[0]);
    conn_init_plain(&b, sv[1]);
    assert_true(conn_handshake_done(&a));
    assert_int_equal(conn_handshake(&a), 0);
    assert_string_equal(conn_kind(&a), "tcp");
    /* nothing to read: -EAGAIN, and not ready until an event says so */
    char buf[64];
    assert_int_equal(conn_read(&b, buf, sizeof(buf)), -EAGAIN);
    assert_false(conn_read_ready(&b));
    assert_int_equal(conn_write(&a, "hello", 5), 5);
    conn_on_events(&b, EPOLLIN);
    assert_true(conn_read_ready(&b));
    /* a short read means drained: no syscall needed to learn it */
    assert_int_equal(conn_read(&b, buf, sizeof(buf)), 5);
    assert_false(conn_read_ready(&b));
    /* fill the socket: a short write or -EAGAIN clears write readiness */
    char *big = xcalloc(1, 4 << 20);
    ssize_t w;
    while ((w = conn_write(&a, big, 4 << 20)) == (ssize_t)(4 << 20))
        ;
    assert_false(conn_write_ready(&a));
    assert_true(conn_wants_write(&a));
    conn_on_events(&a, EPOLLOUT);
    assert_true(conn_write_ready(&a));
    /* the end: 0, again and again */
    conn_close(&a);
    conn_on_events(&b, EPOLLIN | EPOLLRDHUP);
    ssize_t r;
    while ((r = conn_read(&b, big, 4 << 20)) > 0)
        ;
    assert_int_equal(r, 0);
    assert_int_equal(conn_read(&b, buf, sizeof(buf)), 0);
    conn_close(&b);
    free(big);
}

/* The edge-triggered trap: OpenSSL reads ahead, so the socket can be empty while
 * records wait inside OpenSSL. No epoll event will come for them: conn_read_ready must
 * stay true until OpenSSL asked for more input, and reads must deliver all of it. */
static void test_tls_buffered_records_need_no_event(void **state)
{
    struct conn srv, cli;
    tls_pair(&srv, &cli);
    char msg[5 * 1000];
    for (size_t i = 0; i < sizeof(msg); i++)
        msg[i] = (char)('a' + i % 26);
    for (int k = 0; k < 5; k++) /* five records */
        assert_int_equal(conn_write(&cli, msg + k * 1000, 1000), 1000);
    poll_events(&srv);
    char got[sizeof(msg)];
    size_t have = 0;
    /* 100 bytes at a time, never another event */
    while (have < sizeof(msg) && conn_read_ready(&srv)) {
        ssize_t r = conn_read(&srv, got + have, 100);
        if (r == -EAGAIN)
            break;
        assert_true(r > 0);
        have += (size_t)r;
    }
    assert_int_equal(have, sizeof(msg));
    assert_memory_equal(got, msg, sizeof(msg));
    /* even if the socket is believed empty, what OpenSSL holds counts (SSL_has_pending) */
    for (int k = 0; k < 2; k++)
        assert_int_equal(conn_write(&cli, msg, 1000), 1000);
    poll_events(&srv);
    assert_int_equal(conn_read(&srv, got, 10), 10);
    srv.sock_rd = false; /* as a write that wanted input would leave it */
    assert_true(conn_read_ready(&srv));
    have = 10;
    while (have < 2000) {
        ssize_t r = conn_read(&srv, got + have, 2000 - have);
        assert_true(r > 0);
        have += (size_t)r;
    }
    assert_memory_equal(got + 1000, msg, 1000);
    /* and now it is drained */
    assert_int_equal(conn_read(&srv, got, sizeof(got)), -EAGAIN);
    assert_false(conn_read_ready(&srv));
    conn_close(&srv);
    conn_close(&cli);
}

/* A blocked write: the next call brings the same bytes, perhaps from elsewhere (an
 * output buffer compacted meanwhile) and with more after them; everything arrives
 * once, in order. Small pieces are gathered into records. */
static void test_tls_write_retry_moved_buffer(void **state)
{
    struct conn srv, cli;
    tls_pair(&srv, &cli);
    size_t total = 3u << 20;
    char *data = xmalloc(total);
    for (size_t i = 0; i < total; i++)
        data[i] = (char)(i * 7 + i / 4096);
    char *copy = xmalloc(total);
    char *recv_buf = xmalloc(total);
    size_t sent = 0, got = 0, blocked = 0;
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    bool use_copy = false;
    while (got < total) {
        assert_true(util_mono_ms() < deadline);
        poll_events(&cli);
        poll_events(&srv);
        if (sent < total && conn_write_ready(&cli)) {
            /* iov: a small head, a middle piece, the rest; from the copy every other
             * attempt, so a retried record comes from another address */
            const char *base = (use_copy ? copy : data) + sent;
            if (use_copy)
                memcpy(copy + sent, data + sent, total - sent);
            size_t left = total - sent;
            size_t a = MOTOR_MIN(left, (size_t)37), b = MOTOR_MIN(left - a, (size_t)5000);
            struct iovec iov[3] = {
                {(void *)base, a}, {(void *)(base + a), b}, {(void *)(base + a + b), left - a - b}};
            ssize_t w = conn_writev(&cli, iov, 3);
            if (w == -EAGAIN || (w > 0 && (size_t)w < left)) /* a record is pending */
                blocked++;
            else
                assert_true(w > 0);
            if (w > 0)
                sent += (size_t)w;
            use_copy = !use_copy;
        }
        while (got < total && conn_read_ready(&srv)) {
            ssize_t r = conn_read(&srv, recv_buf + got, MOTOR_MIN(total - got, (size_t)3000));
            if (r == -EAGAIN)
                break;
            if (r <= 0)
                fail_msg("read %zd after %zu bytes: %s", r, got, conn_error(&srv));
            got += (size_t)r;
        }
    }
    assert_true(blocked > 0); /* the retry path ran */
    assert_memory_equal(recv_buf, data, total);
    free(data);
    free(copy);
    free(recv_buf);
    conn_close(&srv);
    conn_close(&cli);
}

/* close_notify reads as a clean 0; a TCP close without it as -ECONNABORTED. */
static void test_tls_end_of_stream(void **state)
{
    struct conn srv, cli;
    char buf[64];
    tls_pair(&srv, &cli);
    conn_shutdown(&cli);
    poll_events(&srv);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    ssize_t r;
    while ((r = conn_read(&srv, buf, sizeof(buf))) == -EAGAIN) {
        assert_true(util_mono_ms() < deadline);
        usleep(1000);
        poll_events(&srv);
    }
    assert_int_equal(r, 0);
    assert_int_equal(conn_read(&srv, buf, sizeof(buf)), 0); /* and stays so */
    conn_close(&srv);
    conn_close(&cli);

    tls_pair(&srv, &cli);
    poll_events(&cli);
    assert_int_equal(conn_read(&cli, buf, sizeof(buf)), -EAGAIN); /* take the session
                                                                   * tickets: closing with
                                                                   * unread bytes resets */
    assert_int_equal(conn_write(&cli, "partial", 7), 7);
    conn_close(&cli); /* no close_notify */
    poll_events(&srv);
    assert_int_equal(conn_read(&srv, buf, sizeof(buf)), 7);
    while ((r = conn_read(&srv, buf, sizeof(buf))) == -EAGAIN) {
        assert_true(util_mono_ms() < deadline);
        usleep(1000);
        poll_events(&srv);
    }
    assert_int_equal(r, -ECONNABORTED);
    assert_non_null(strstr(conn_error(&srv), "close_notify"));
    conn_close(&srv);
}

/* A truncated record (its header promises more than comes before the close) and a
 * corrupted one: -ECONNABORTED and -EPROTO, with a reason, never a crash. */
static void test_tls_bad_records(void **state)
{
    int sv[2];
    pair(sv);
    struct tls_ctx *sc = server_ctx(NULL);
    struct conn srv;
    assert_int_equal(conn_init_tls_server(&srv, sv[0], sc), 0);
    tls_ctx_unref(sc);
    /* the peer: OpenSSL on memory BIOs, so its records can be cut and corrupted */
    SSL_CTX *pc = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL *p = SSL_new(pc);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    SSL_set_bio(p, in, out);
    SSL_set_connect_state(p);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    char buf[32768];
    int hs = -EAGAIN;
    for (;;) {
        assert_true(util_mono_ms() < deadline);
        int prc = SSL_do_handshake(p);
        int n;
        while ((n = BIO_read(out, buf, sizeof(buf))) > 0)
            assert_int_equal(util_write_all(sv[1], buf, (size_t)n), 0);
        poll_events(&srv);
        if (hs == -EAGAIN)
            hs = conn_handshake(&srv);
        ssize_t k;
        while ((k = recv(sv[1], buf, sizeof(buf), 0)) > 0)
            BIO_write(in, buf, (int)k);
        if (prc == 1 && hs == 0)
            break;
    }
    /* a record, cut short and followed by the close */
    assert_int_equal(SSL_write(p, "GET / HTTP/1.1\r\n", 16), 16);
    int n = BIO_read(out, buf, sizeof(buf));
    assert_true(n > 10);
    assert_int_equal(util_write_all(sv[1], buf, (size_t)n - 5), 0);
    shutdown(sv[1], SHUT_WR);
    poll_events(&srv);
    ssize_t r;
    while ((r = conn_read(&srv, buf, sizeof(buf))) == -EAGAIN) {
        assert_true(util_mono_ms() < deadline);
        usleep(1000);
        poll_events(&srv);
    }
    assert_int_equal(r, -ECONNABORTED);
    conn_close(&srv);
    close(sv[1]);
    SSL_free(p);
    SSL_CTX_free(pc);

    /* a corrupted record: the MAC fails */
    struct conn cli;
    tls_pair(&srv, &cli);
    int raw = cli.fd;
    char junk[64] = {0x17, 0x03, 0x03, 0x00, 0x3b}; /* application data, 59 bytes */
    memset(junk + 5, 0x5a, sizeof(junk) - 5);
    assert_int_equal(util_write_all(raw, junk, sizeof(junk)), 0);
    poll_events(&srv);
    while ((r = conn_read(&srv, buf, sizeof(buf))) == -EAGAIN) {
        assert_true(util_mono_ms() < deadline);
        usleep(1000);
        poll_events(&srv);
    }
    assert_int_equal(r, -EPROTO);
    assert_true(strlen(conn_error(&srv)) > 0);
    conn_close(&srv);
    conn_close(&cli);
}

/* Our server conn against an OpenSSL client on a non-blocking socket. */
static void peer_handshake(struct conn *srv, SSL *p, int64_t deadline)
{
    int hs = -EAGAIN, ph = 0;
    while (hs != 0 || ph != 1) {
        assert_true(util_mono_ms() < deadline);
        if (ph != 1) {
            ph = SSL_do_handshake(p);
            if (ph != 1)
                ERR_clear_error();
        }
        poll_events(srv);
        if (hs == -EAGAIN && conn_handshake_ready(srv))
            hs = conn_handshake(srv);
        assert_true(hs == 0 || hs == -EAGAIN);
    }
}

/* TLS 1.3 key updates from the peer, asking for ours: data keeps flowing both ways. */
static void test_tls_key_update(void **state)
{
    int sv[2];
    pair(sv);
    struct tls_ctx *sc = server_ctx(NULL);
    struct conn srv;
    assert_int_equal(conn_init_tls_server(&srv, sv[0], sc), 0);
    tls_ctx_unref(sc);
    SSL_CTX *pc = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    SSL *p = SSL_new(pc);
    SSL_set_fd(p, sv[1]);
    SSL_set_connect_state(p);
    peer_handshake(&srv, p, deadline);
    char buf[256];
    for (int round = 0; round < 3; round++) {
        assert_int_equal(SSL_key_update(p, SSL_KEY_UPDATE_REQUESTED), 1);
        assert_int_equal(SSL_write(p, "ping", 4), 4);
        poll_events(&srv);
        ssize_t r;
        while ((r = conn_read(&srv, buf, sizeof(buf))) == -EAGAIN) {
            assert_true(util_mono_ms() < deadline);
            usleep(1000);
            poll_events(&srv);
        }
        assert_int_equal(r, 4);
        assert_memory_equal(buf, "ping", 4);
        /* our answer goes out under our updated keys; OpenSSL reads it */
        assert_int_equal(conn_write(&srv, "pong", 4), 4);
        int n;
        while ((n = SSL_read(p, buf, sizeof(buf))) <= 0) {
            assert_int_equal(SSL_get_error(p, n), SSL_ERROR_WANT_READ);
            assert_true(util_mono_ms() < deadline);
            usleep(1000);
        }
        assert_int_equal(n, 4);
        assert_memory_equal(buf, "pong", 4);
    }
    SSL_free(p);
    SSL_CTX_free(pc);
    close(sv[1]);
    conn_close(&srv);
}

/* A TLS 1.2 peer asking to renegotiate is refused (no_renegotiation); the session
 * goes on carrying data. */
static void test_tls_renegotiation_refused(void **state)
{
    int sv[2];
    pair(sv);
    struct tls_ctx *sc = server_ctx(NULL);
    struct conn srv;
    assert_int_equal(conn_init_tls_server(&srv, sv[0], sc), 0);
    tls_ctx_unref(sc);
    SSL_CTX *pc = tlsfix_client_ctx(tlsfix("ca.crt"), NULL, NULL);
    SSL_CTX_set_max_proto_version(pc, TLS1_2_VERSION);
    SSL *p = SSL_new(pc);
    SSL_set_fd(p, sv[1]);
    SSL_set_connect_state(p);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    peer_handshake(&srv, p, deadline);
    assert_string_equal(conn_tls_version(&srv), "TLSv1.2");
    assert_int_equal(SSL_renegotiate(p), 1);
    (void)SSL_do_handshake(p); /* sends the new ClientHello; cannot finish */
    ERR_clear_error();
    char buf[256];
    /* our side reads through it (answering no_renegotiation) */
    for (int i = 0; i < 50; i++) {
        poll_events(&srv);
        ssize_t r = conn_read(&srv, buf, sizeof(buf));
        assert_true(r == -EAGAIN || r == -EPROTO);
        if (r == -EPROTO)
            break;
        usleep(1000);
    }
    /* the peer learns it was refused */
    int n = SSL_read(p, buf, sizeof(buf));
    for (int i = 0; n <= 0 && SSL_get_error(p, n) == SSL_ERROR_WANT_READ && i < 1000; i++) {
        usleep(1000);
        n = SSL_read(p, buf, sizeof(buf));
    }
    assert_true(n <= 0);
    unsigned long e = ERR_peek_error();
    ERR_clear_error();
    assert_int_equal(ERR_GET_REASON(e), SSL_R_NO_RENEGOTIATION);
    SSL_free(p);
    SSL_CTX_free(pc);
    close(sv[1]);
    conn_close(&srv);
}

/* Plain HTTP where a handshake should be: -EBADMSG, said in words. */
static void test_tls_plain_http_to_tls(void **state)
{
    int sv[2];
    pair(sv);
    struct tls_ctx *sc = server_ctx(NULL);
    struct conn srv;
    assert_int_equal(conn_init_tls_server(&srv, sv[0], sc), 0);
    tls_ctx_unref(sc);
    const char *req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_int_equal(util_write_all(sv[1], req, strlen(req)), 0);
    poll_events(&srv);
    assert_int_equal(conn_handshake(&srv), -EBADMSG);
    assert_non_null(strstr(conn_error(&srv), "plain HTTP"));
    assert_int_equal(conn_handshake(&srv), -EBADMSG); /* remembered */
    conn_close(&srv);
    close(sv[1]);
}

/* Writing to a peer that has gone: -EPIPE, and the process lives (no SIGPIPE: the
 * default action is in force in this test). */
static void test_tls_no_sigpipe(void **state)
{
    signal(SIGPIPE, SIG_DFL);
    struct conn srv, cli;
    tls_pair(&srv, &cli);
    conn_close(&srv);
    char *big = xcalloc(1, 1 << 20);
    ssize_t w = 0;
    for (int i = 0; i < 20 && w >= 0; i++) {
        poll_events(&cli);
        w = conn_write(&cli, big, 1 << 20);
        if (w == -EAGAIN)
            w = 0;
    }
    assert_true(w < 0);
    free(big);
    conn_close(&cli);
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
    signal(SIGPIPE, SIG_IGN); /* OpenSSL peers of this test write with write(2) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_readiness),
        cmocka_unit_test(test_tls_buffered_records_need_no_event),
        cmocka_unit_test(test_tls_write_retry_moved_buffer),
        cmocka_unit_test(test_tls_end_of_stream),
        cmocka_unit_test(test_tls_bad_records),
        cmocka_unit_test(test_tls_key_update),
        cmocka_unit_test(test_tls_renegotiation_refused),
        cmocka_unit_test(test_tls_plain_http_to_tls),
        cmocka_unit_test(test_tls_no_sigpipe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
