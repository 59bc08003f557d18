/* zmtp: the wire parser (greetings, READY, frames, commands, every limit; a valid stream
 * fed in every split gives the same messages) and real sockets on a reactor over
 * loopback (PUB/SUB with topics, SUBSCRIBE/CANCEL, a stalled subscriber dropped at the
 * high-water mark, ROUTER/DEALER, reconnection after the publisher restarts, a
 * non-ZMTP peer refused). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/reactor.h"
#include "common/util.h"
#include "common/zmtp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- parser ----------------------------------------------------------------------- */

struct got {
    int ready, commands, messages;
    char type[16];
    char last[512]; /* parts joined with '|' */
    char cmd[32];
};

static int t_ready(void *arg, const uint8_t *type, size_t tl, const uint8_t *id, size_t il,
                   char *err, size_t cap)
{
    struct got *g = arg;
    g->ready++;
    snprintf(g->type, sizeof(g->type), "%.*s", (int)tl, (const char *)type);
    return 0;
}

static void t_command(void *arg, const uint8_t *name, size_t nl, const uint8_t *body, size_t bl)
{
    struct got *g = arg;
    g->commands++;
    snprintf(g->cmd, sizeof(g->cmd), "%.*s", (int)nl, (const char *)name);
}

static void t_message(void *arg, const struct zmtp_msg *m)
{
    struct got *g = arg;
    g->messages++;
    size_t off = 0;
    g->last[0] = '\0';
    for (size_t i = 0; i < m->n; i++)
        off += (size_t)snprintf(g->last + off, sizeof(g->last) - off, "%s%.*s", i ? "|" : "",
                                (int)m->lens[i], (const char *)m->parts[i]);
}

static const struct zmtp_rx_cbs cbs = {t_ready, t_command, t_message};

/* greeting + READY(PUB) + PING + ["topic","\0\0\0\0\0\0\0\1",payload(300 bytes, long)] */
static size_t build_stream(uint8_t *buf)
{
    size_t n = 0;
    zmtp_put_greeting(buf, false);
    n += 64;
    n += zmtp_put_ready(buf + n, "PUB", NULL);
    /* PING ttl=0 context "ab" */
    n += zmtp_put_frame_header(buf + n, 1 + 4 + 2 + 2, false, true);
    memcpy(buf + n, "\x04PING\x00\x00" "ab", 9);
    n += 9;
    n += zmtp_put_frame_header(buf + n, 5, true, false);
    memcpy(buf + n, "topic", 5);
    n += 5;
    n += zmtp_put_frame_header(buf + n, 8, true, false);
    memcpy(buf + n, "\0\0\0\0\0\0\0\1", 8);
    n += 8;
    n += zmtp_put_frame_header(buf + n, 300, false, false);
    memset(buf + n, 'z', 300);
    n += 300;
    return n;
}

static void test_rx_stream_any_split(void **state)
{
    uint8_t buf[1024];
    size_t len = build_stream(buf);
    for (size_t split = 0; split <= len; split++) {
        struct zmtp_rx rx;
        struct got g = {0};
        zmtp_rx_init(&rx, 0, 0, 0);
        assert_int_equal(zmtp_rx_feed(&rx, buf, split, &cbs, &g), 0);
        assert_int_equal(zmtp_rx_feed(&rx, buf + split, len - split, &cbs, &g), 0);
        assert_int_equal(g.ready, 1);
        assert_string_equal(g.type, "PUB");
        assert_int_equal(g.commands, 1);
        assert_string_equal(g.cmd, "PING");
        assert_int_equal(g.messages, 1);
        assert_int_equal(strlen(g.last), 5 + 1 + 1 + 300); /* the 8-byte part prints as "" */
        assert_int_equal(rx.peer_minor, 1);
        zmtp_rx_release(&rx);
    }
    /* byte by byte */
    struct zmtp_rx rx;
    struct got g = {0};
    zmtp_rx_init(&rx, 0, 0, 0);
    for (size_t i = 0; i < len; i++)
        assert_int_equal(zmtp_rx_feed(&rx, buf + i, 1, &cbs, &g), 0);
    assert_int_equal(g.messages, 1);
    zmtp_rx_release(&rx);
}

static void expect_fail(const uint8_t *b, size_t len, size_t max_frame, size_t max_parts,
                        const char *needle)
{
    struct zmtp_rx rx;
    struct got g = {0};
    zmtp_rx_init(&rx, max_frame, max_parts, 0);
    int rc = zmtp_rx_feed(&rx, b, len, &cbs, &g);
    if (rc != -EPROTO || !strstr(rx.err, needle))
        fail_msg("expected failure containing '%s', got rc %d '%s'", needle, rc, rx.err);
    assert_int_equal(g.messages, 0);
    /* refuses further input */
    assert_int_equal(zmtp_rx_feed(&rx, "x", 1, &cbs, &g), -EPROTO);
    zmtp_rx_release(&rx);
}

static void test_rx_bad_greetings(void **state)
{
    uint8_t g[64];
    expect_fail((const uint8_t *)"GET / HTTP/1.1\r\n", 16, 0, 0, "not a ZMTP 3 peer");
    zmtp_put_greeting(g, false);
    g[9] = 0x7e;
    expect_fail(g, 64, 0, 0, "unversioned");
    zmtp_put_greeting(g, false);
    g[10] = 2;
    expect_fail(g, 64, 0, 0, "ZMTP 2.x");
    zmtp_put_greeting(g, false);
    memcpy(g + 12, "CURVE", 5);
    expect_fail(g, 64, 0, 0, "'CURVE' is not supported");
    zmtp_put_greeting(g, false);
    g[20] = 'X'; /* junk after "NULL" in the mechanism field */
    expect_fail(g, 64, 0, 0, "not supported");
}

static void test_rx_bad_frames(void **state)
{
    uint8_t b[2048];
    size_t n;
#define START()                                                                                    \
    do {                                                                                           \
        zmtp_put_greeting(b, false);                                                               \
        n = 64;                                                                                    \
    } while (0)
    /* data before READY */
    START();
    n += zmtp_put_frame_header(b + n, 1, false, false);
    b[n++] = 'x';
    expect_fail(b, n, 0, 0, "before the READY");
    /* another command instead of READY */
    START();
    n += zmtp_put_frame_header(b + n, 5, false, true);
    memcpy(b + n, "\x04PING", 5);
    n += 5;
    expect_fail(b, n, 0, 0, "expected READY");
    /* READY without Socket-Type */
    START();
    n += zmtp_put_frame_header(b + n, 6, false, true);
    memcpy(b + n, "\x05READY", 6);
    n += 6;
    expect_fail(b, n, 0, 0, "without Socket-Type");
    /* READY property overrunning the frame */
    START();
    n += zmtp_put_frame_header(b + n, 6 + 12 + 4, false, true);
    memcpy(b + n, "\x05READY\x0bSocket-Type\xff\xff\xff\xff", 22);
    n += 22;
    expect_fail(b, n, 0, 0, "overruns");
    /* ERROR from the peer */
    START();
    n += zmtp_put_frame_header(b + n, 6 + 1 + 4, false, true);
    memcpy(b + n, "\x05" "ERROR\x04nope", 11);
    n += 11;
    expect_fail(b, n, 0, 0, "peer sent ERROR: nope");
    /* after a good READY: reserved flags, command with MORE, oversize frame, too many
     * parts, command inside a multipart message, a second READY */
    size_t base;
    START();
    n += zmtp_put_ready(b + n, "PUB", NULL);
    base = n;
    b[n++] = 0x10;
    b[n++] = 0;
    expect_fail(b, n, 0, 0, "reserved flag bits");
    n = base;
    b[n++] = 0x05;
    b[n++] = 0;
    expect_fail(b, n, 0, 0, "MORE flag");
    n = base;
    n += zmtp_put_frame_header(b + n, 5000, false, false);
    expect_fail(b, n, 4096, 0, "exceeds the 4096-byte limit");
    n = base;
    b[n++] = 0x02; /* long frame of 2^63 bytes */
    memcpy(b + n, "\x80\0\0\0\0\0\0\0", 8);
    n += 8;
    expect_fail(b, n, 0, 0, "exceeds");
    n = base;
    for (int i = 0; i < 4; i++) {
        n += zmtp_put_frame_header(b + n, 1, true, false);
        b[n++] = 'p';
    }
    expect_fail(b, n, 0, 3, "more than 3 frames");
    n = base;
    n += zmtp_put_frame_header(b + n, 1, true, false);
    b[n++] = 'p';
    n += zmtp_put_frame_header(b + n, 5, false, true);
    memcpy(b + n, "\x04PING", 5);
    n += 5;
    expect_fail(b, n, 0, 0, "inside a multipart");
    n = base;
    n += zmtp_put_ready(b + n, "PUB", NULL);
    expect_fail(b, n, 0, 0, "second READY");
    n = base;
    n += zmtp_put_frame_header(b + n, 3, false, true);
    memcpy(b + n, "\x09PI", 3);
    n += 3;
    expect_fail(b, n, 0, 0, "malformed command");
#undef START
}

/* ---- live sockets ------------------------------------------------------------------ */

struct peer_log {
    int connected, disconnected, errors, msgs;
    char last[512];
    char err[200];
    struct zmtp_peer *from;
};

static void on_msg(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m, void *arg)
{
    struct peer_log *l = arg;
    l->msgs++;
    l->from = p;
    size_t off = 0;
    for (size_t i = 0; i < m->n && off < sizeof(l->last); i++)
        off += (size_t)snprintf(l->last + off, sizeof(l->last) - off, "%s%.*s", i ? "|" : "",
                                (int)m->lens[i], (const char *)m->parts[i]);
}

static void on_ev(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev, const char *d,
                  void *arg)
{
    struct peer_log *l = arg;
    if (ev == ZMTP_EV_CONNECTED)
        l->connected++;
    else if (ev == ZMTP_EV_DISCONNECTED)
        l->disconnected++;
    else {
        l->errors++;
        snprintf(l->err, sizeof(l->err), "%s", d ? d : "");
    }
}

/* Run the loop until *flag >= want or 3 s pass. */
static bool spin(struct reactor *r, const int *flag, int want)
{
    int64_t end = util_mono_ms() + 3000;
    while (*flag < want && util_mono_ms() < end)
        reactor_run_once(r, 20);
    return *flag >= want;
}

static struct zmtp_msg msg3(const char *a, const char *b, const char *c)
{
    struct zmtp_msg m = {.n = 3};
    m.parts[0] = (const uint8_t *)a;
    m.lens[0] = strlen(a);
    m.parts[1] = (const uint8_t *)b;
    m.lens[1] = strlen(b);
    m.parts[2] = (const uint8_t *)c;
    m.lens[2] = strlen(c);
    return m;
}

static void test_pub_sub(void **state)
{
    struct reactor *r = reactor_new();
    struct peer_log pl = {0}, sl = {0}, sl2 = {0};
    struct zmtp_sock *pub = zmtp_bind(r, ZMTP_PUB, "tcp://127.0.0.1:0", NULL, on_msg, on_ev, &pl);
    assert_non_null(pub);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", zmtp_port(pub));
    struct zmtp_sock *sub = zmtp_connect(r, ZMTP_SUB, ep, NULL, on_msg, on_ev, &sl);
    struct zmtp_sock *sub2 = zmtp_connect(r, ZMTP_SUB, ep, NULL, on_msg, on_ev, &sl2);
    assert_int_equal(zmtp_subscribe(sub, "kv", 2), 0);
    assert_int_equal(zmtp_subscribe(sub2, "", 0), 0);
    assert_true(spin(r, &pl.connected, 2));
    assert_true(spin(r, &sl.connected, 1));
    assert_true(spin(r, &sl2.connected, 1));
    /* the subscription reaches the publisher asynchronously: send until it arrives */
    struct zmtp_msg m = msg3("kv", "seq", "payload");
    int64_t end = util_mono_ms() + 3000;
    while (sl.msgs == 0 && util_mono_ms() < end) {
        zmtp_send(pub, &m);
        reactor_run_once(r, 20);
    }
    assert_true(sl.msgs > 0);
    assert_string_equal(sl.last, "kv|seq|payload");
    /* another topic: only the catch-all subscriber */
    int before = sl.msgs, before2 = sl2.msgs;
    struct zmtp_msg other = msg3("xx", "1", "2");
    zmtp_send(pub, &other);
    assert_true(spin(r, &sl2.msgs, before2 + 1));
    for (int i = 0; i < 10; i++)
        reactor_run_once(r, 5);
    assert_int_equal(sl.msgs, before);
    /* unsubscribe: nothing more for sub */
    assert_int_equal(zmtp_unsubscribe(sub, "kv", 2), 0);
    for (int i = 0; i < 10; i++)
        reactor_run_once(r, 5);
    before = sl.msgs;
    before2 = sl2.msgs;
    zmtp_send(pub, &m);
    assert_true(spin(r, &sl2.msgs, before2 + 1));
    for (int i = 0; i < 10; i++)
        reactor_run_once(r, 5);
    assert_int_equal(sl.msgs, before);
    /* the publisher restarts on the same port: subscribers reconnect by themselves */
    uint16_t port = zmtp_port(pub);
    zmtp_close(pub);
    assert_true(spin(r, &sl2.disconnected, 1));
    char bind_ep[64];
    snprintf(bind_ep, sizeof(bind_ep), "tcp://127.0.0.1:%u", port);
    pub = zmtp_bind(r, ZMTP_PUB, bind_ep, NULL, on_msg, on_ev, &pl);
    assert_non_null(pub);
    assert_true(spin(r, &sl2.connected, 2));
    before2 = sl2.msgs;
    end = util_mono_ms() + 3000;
    while (sl2.msgs == before2 && util_mono_ms() < end) {
        zmtp_send(pub, &m);
        reactor_run_once(r, 20);
    }
    assert_true(sl2.msgs > before2);
    struct zmtp_stats st;
    zmtp_get_stats(sub2, &st);
    assert_true(st.connects == 2);
    zmtp_close(sub);
    zmtp_close(sub2);
    zmtp_close(pub);
    reactor_free(r);
}

/* A subscriber that handshakes, subscribes, then never reads: the publisher drops
 * messages past the high-water mark instead of buffering without end or blocking. */
static void test_pub_drops_for_stalled_subscriber(void **state)
{
    struct reactor *r = reactor_new();
    struct peer_log pl = {0};
    struct zmtp_opts o = {.hwm = 50};
    struct zmtp_sock *pub = zmtp_bind(r, ZMTP_PUB, "tcp://127.0.0.1:0", &o, NULL, on_ev, &pl);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(zmtp_port(pub))};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    uint8_t b[600];
    zmtp_put_greeting(b, false);
    size_t n = 64 + zmtp_put_ready(b + 64, "SUB", NULL);
    n += zmtp_put_frame_header(b + n, 1, false, false); /* 3.0-style subscribe-all */
    b[n++] = 1;
    assert_int_equal(write(fd, b, n), (ssize_t)n);
    assert_true(spin(r, &pl.connected, 1));
    for (int i = 0; i < 20; i++)
        reactor_run_once(r, 5);
    char big[8192];
    memset(big, 'q', sizeof(big));
    struct zmtp_msg m = {.n = 1};
    m.parts[0] = (const uint8_t *)big;
    m.lens[0] = sizeof(big);
    for (int i = 0; i < 2000; i++) {
        zmtp_send(pub, &m);
        if (i % 100 == 0)
            reactor_run_once(r, 0);
    }
    struct zmtp_stats st;
    zmtp_get_stats(pub, &st);
    assert_true(st.dropped > 1000);
    assert_true(st.sent < 1000);
    close(fd);
    zmtp_close(pub);
    reactor_free(r);
}

static void test_router_dealer(void **state)
{
    struct reactor *r = reactor_new();
    struct peer_log rl = {0}, dl = {0};
    struct zmtp_sock *router =
        zmtp_bind(r, ZMTP_ROUTER, "tcp://127.0.0.1:0", NULL, on_msg, on_ev, &rl);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", zmtp_port(router));
    struct zmtp_opts o = {.identity = "me"};
    struct zmtp_sock *dealer = zmtp_connect(r, ZMTP_DEALER, ep, &o, on_msg, on_ev, &dl);
    struct zmtp_msg req = {.n = 2};
    req.parts[0] = (const uint8_t *)"";
    req.lens[0] = 0;
    req.parts[1] = (const uint8_t *)"\0\0\0\0\0\0\0\0";
    req.lens[1] = 8;
    assert_int_equal(zmtp_send(dealer, &req), -ENOTCONN);
    assert_true(spin(r, &dl.connected, 1));
    assert_int_equal(zmtp_send(dealer, &req), 0);
    assert_true(spin(r, &rl.msgs, 1));
    assert_non_null(rl.from);
    struct zmtp_msg rep = msg3("", "seq", "batch");
    assert_int_equal(zmtp_send_to(router, rl.from, &rep), 0);
    assert_true(spin(r, &dl.msgs, 1));
    assert_string_equal(dl.last, "|seq|batch");
    assert_int_equal(zmtp_send(router, &rep), -EINVAL);
    zmtp_close(dealer);
    zmtp_close(router);
    reactor_free(r);
}

/* A PUB talking to a PUB: refused with an ERROR command on both sides. */
static void test_incompatible_types(void **state)
{
    struct reactor *r = reactor_new();
    struct peer_log a = {0}, b = {0};
    struct zmtp_sock *pub = zmtp_bind(r, ZMTP_PUB, "tcp://127.0.0.1:0", NULL, on_msg, on_ev, &a);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", zmtp_port(pub));
    struct zmtp_opts o = {.reconnect_ms = 5000};
    struct zmtp_sock *wrong = zmtp_connect(r, ZMTP_PUB, ep, &o, on_msg, on_ev, &b);
    assert_true(spin(r, &a.errors, 1));
    assert_non_null(strstr(a.err, "cannot talk to PUB"));
    assert_true(spin(r, &b.errors, 1));
    zmtp_close(wrong);
    zmtp_close(pub);
    reactor_free(r);
}

/* Closing the socket from inside its own callback is safe. */
static struct zmtp_sock *self_close_sock;
static int self_closed;
static void close_on_msg(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m,
                         void *arg)
{
    zmtp_close(s);
    self_closed++;
}

static void test_close_inside_callback(void **state)
{
    struct reactor *r = reactor_new();
    struct peer_log pl = {0}, sl = {0};
    struct zmtp_sock *pub = zmtp_bind(r, ZMTP_PUB, "tcp://127.0.0.1:0", NULL, NULL, on_ev, &pl);
    char ep[64];
    snprintf(ep, sizeof(ep), "tcp://127.0.0.1:%u", zmtp_port(pub));
    self_close_sock = zmtp_connect(r, ZMTP_SUB, ep, NULL, close_on_msg, on_ev, &sl);
    zmtp_subscribe(self_close_sock, "", 0);
    assert_true(spin(r, &pl.connected, 1));
    struct zmtp_msg m = msg3("a", "b", "c");
    int64_t end = util_mono_ms() + 3000;
    while (!self_closed && util_mono_ms() < end) {
        zmtp_send(pub, &m);
        zmtp_send(pub, &m);
        reactor_run_once(r, 20);
    }
    assert_int_equal(self_closed, 1);
    for (int i = 0; i < 5; i++)
        reactor_run_once(r, 5);
    zmtp_close(pub);
    reactor_free(r);
}

static void test_bad_endpoints(void **state)
{
    struct reactor *r = reactor_new();
    static const char *const bad[] = {"ipc:///tmp/x", "tcp://", "tcp://host", "tcp://:5",
                                      "tcp://h:99999", "tcp://[::1:5", NULL};
    for (int i = 0; bad[i]; i++) {
        assert_null(zmtp_bind(r, ZMTP_PUB, bad[i], NULL, NULL, NULL, NULL));
        assert_null(zmtp_connect(r, ZMTP_SUB, bad[i], NULL, NULL, NULL, NULL));
    }
    assert_null(zmtp_connect(r, ZMTP_SUB, "tcp://*:5557", NULL, NULL, NULL, NULL));
    reactor_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rx_stream_any_split),
        cmocka_unit_test(test_rx_bad_greetings),
        cmocka_unit_test(test_rx_bad_frames),
        cmocka_unit_test(test_pub_sub),
        cmocka_unit_test(test_pub_drops_for_stalled_subscriber),
        cmocka_unit_test(test_router_dealer),
        cmocka_unit_test(test_incompatible_types),
        cmocka_unit_test(test_close_inside_callback),
        cmocka_unit_test(test_bad_endpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
