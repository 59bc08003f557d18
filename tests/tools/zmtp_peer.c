/* motor-zmtp-peer — a test tool that puts src/common/zmtp on the wire against peers
 * nobody here wrote (pyzmq/libzmq, tests/integration/test_zmtp_interop.py).
 *
 *   motor-zmtp-peer sub ENDPOINT TOPIC COUNT     SUB: print COUNT messages, then exit 0
 *   motor-zmtp-peer pub ENDPOINT                 PUB: print {"port":N}; publish each stdin
 *                                                line (space-separated hex parts); EOF ends
 *   motor-zmtp-peer dealer ENDPOINT SEQ          DEALER: send ["", SEQ as 8 bytes big-endian]
 *                                                print replies until seq -1, then exit 0
 *
 * Messages are printed one JSON line each: {"parts":["<hex>",...]}. Any failure or 15 s
 * without progress: exit 1. */
#include "common/log.h"
#include "common/reactor.h"
#include "common/util.h"
#include "common/zmtp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct reactor *R;
static long want = -1, got;
static int rc_exit = 1;
static char line[1 << 20];
static size_t line_len;
static struct zmtp_sock *S;
static uint8_t seq_bytes[8];

static void print_msg(const struct zmtp_msg *m)
{
    fputs("{\"parts\":[", stdout);
    for (size_t i = 0; i < m->n; i++) {
        fputs(i ? ",\"" : "\"", stdout);
        for (size_t k = 0; k < m->lens[i]; k++)
            printf("%02x", m->parts[i][k]);
        fputc('"', stdout);
    }
    fputs("]}\n", stdout);
    fflush(stdout);
}

static void on_msg(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m, void *arg)
{
    print_msg(m);
    got++;
    const char *mode = arg;
    if (!strcmp(mode, "dealer") && m->n >= 2 && m->lens[1] == 8 &&
        !memcmp(m->parts[1], "\xff\xff\xff\xff\xff\xff\xff\xff", 8)) {
        rc_exit = 0;
        reactor_stop(R);
    }
    if (!strcmp(mode, "sub") && got >= want) {
        rc_exit = 0;
        reactor_stop(R);
    }
}

static void on_ev(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev, const char *d,
                  void *arg)
{
    const char *mode = arg;
    fprintf(stderr, "event %d %s\n", (int)ev, d ? d : "");
    if (ev == ZMTP_EV_CONNECTED && !strcmp(mode, "dealer")) {
        struct zmtp_msg m = {.n = 2};
        m.parts[0] = (const uint8_t *)"";
        m.lens[0] = 0;
        m.parts[1] = seq_bytes;
        m.lens[1] = 8;
        zmtp_send(s, &m);
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void publish_line(char *l)
{
    static uint8_t bufs[8][1 << 17];
    struct zmtp_msg m = {.n = 0};
    char *save = NULL;
    for (char *tok = strtok_r(l, " ", &save); tok && m.n < 8; tok = strtok_r(NULL, " ", &save)) {
        size_t n = strlen(tok) / 2;
        if (!strcmp(tok, "-"))
            n = 0;
        for (size_t i = 0; i < n && i < sizeof(bufs[0]); i++)
            bufs[m.n][i] = (uint8_t)(hexval(tok[2 * i]) << 4 | hexval(tok[2 * i + 1]));
        m.parts[m.n] = bufs[m.n];
        m.lens[m.n] = n;
        m.n++;
    }
    if (m.n)
        zmtp_send(S, &m);
}

static void on_stdin(struct reactor *r, int fd, uint32_t events, void *arg)
{
    ssize_t n = read(0, line + line_len, sizeof(line) - line_len - 1);
    if (n <= 0) {
        rc_exit = 0;
        reactor_stop(r);
        return;
    }
    line_len += (size_t)n;
    char *nl;
    while ((nl = memchr(line, '\n', line_len))) {
        *nl = '\0';
        publish_line(line);
        size_t used = (size_t)(nl - line) + 1;
        memmove(line, nl + 1, line_len - used);
        line_len -= used;
    }
}

static void on_timeout(struct reactor *r, void *arg)
{
    fprintf(stderr, "timeout: %ld of %ld messages\n", got, want);
    reactor_stop(r);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: see the header of tests/tools/zmtp_peer.c\n");
        return 2;
    }
    log_set_component("zmtp-peer");
    R = reactor_new();
    const char *mode = argv[1];
    struct reactor_timer t;
    reactor_timer_init(&t, on_timeout, NULL);
    struct zmtp_opts o = {.name = mode};
    if (!strcmp(mode, "sub") && argc >= 5) {
        want = strtol(argv[4], NULL, 10);
        S = zmtp_connect(R, ZMTP_SUB, argv[2], &o, on_msg, on_ev, (void *)mode);
        if (!S)
            return 1;
        zmtp_subscribe(S, argv[3], strlen(argv[3]));
        reactor_timer_start(R, &t, 15000, 0);
    } else if (!strcmp(mode, "pub")) {
        S = zmtp_bind(R, ZMTP_PUB, argv[2], &o, NULL, on_ev, (void *)mode);
        if (!S)
            return 1;
        printf("{\"port\":%u}\n", zmtp_port(S));
        fflush(stdout);
        reactor_add_fd(R, 0, EPOLLIN, on_stdin, NULL);
    } else if (!strcmp(mode, "dealer") && argc >= 4) {
        S = zmtp_connect(R, ZMTP_DEALER, argv[2], &o, on_msg, on_ev, (void *)mode);
        if (!S)
            return 1;
        unsigned long long seq = (unsigned long long)strtoll(argv[3], NULL, 10);
        for (int i = 0; i < 8; i++)
            seq_bytes[i] = (uint8_t)(seq >> (8 * (7 - i)));
        reactor_timer_start(R, &t, 15000, 0);
    } else {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    reactor_run(R);
    reactor_timer_stop(R, &t);
    if (reactor_has_fd(R, 0))
        reactor_del_fd(R, 0);
    zmtp_close(S);
    reactor_free(R);
    return rc_exit;
}
