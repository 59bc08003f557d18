/* libFuzzer: bytes -> the ZMTP wire parser as one stream and again split at a
 * data-dependent point (greeting, READY, commands, frames, message assembly), with
 * small limits. Checks: the parser never accepts a frame, message or command beyond
 * its limits, delivered parts lie inside the message buffer, a failure comes with a
 * reason, and feeding in two pieces gives the same outcome as feeding at once. */
#include "common/zmtp.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct count {
    int ready, commands, messages;
    size_t bytes;
};

static int f_ready(void *arg, const uint8_t *type, size_t tl, const uint8_t *id, size_t il,
                   char *err, size_t cap)
{
    struct count *c = arg;
    c->ready++;
    return 0;
}

static void f_command(void *arg, const uint8_t *name, size_t nl, const uint8_t *body, size_t bl)
{
    struct count *c = arg;
    c->commands++;
    if (nl == 0 || nl > 255)
        abort();
}

static void f_message(void *arg, const struct zmtp_msg *m)
{
    struct count *c = arg;
    c->messages++;
    if (m->n == 0 || m->n > 4)
        abort();
    size_t total = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (m->lens[i] > 1024)
            abort();
        total += m->lens[i];
        if (m->lens[i])
            c->bytes += (size_t)m->parts[i][0] + m->parts[i][m->lens[i] - 1];
    }
    if (total > 2048)
        abort();
}

static const struct zmtp_rx_cbs cbs = {f_ready, f_command, f_message};

static int run(const uint8_t *data, size_t size, size_t split, struct count *c, char *err)
{
    struct zmtp_rx rx;
    zmtp_rx_init(&rx, 1024, 4, 2048);
    int rc = zmtp_rx_feed(&rx, data, split, &cbs, c);
    if (!rc)
        rc = zmtp_rx_feed(&rx, data + split, size - split, &cbs, c);
    if (rc && (rc != -EPROTO || !rx.err[0]))
        abort();
    memcpy(err, rx.err, sizeof(rx.err));
    zmtp_rx_release(&rx);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Most inputs should get past the greeting: prepend a valid one unless the input
     * starts with 0xff (then it brings its own). */
    uint8_t *buf = malloc(size + 64);
    size_t len = size;
    if (size == 0 || data[0] != 0xff) {
        zmtp_put_greeting(buf, false);
        memcpy(buf + 64, data, size);
        len += 64;
    } else {
        memcpy(buf, data, size);
    }
    struct count a = {0}, b = {0};
    char ea[160], eb[160];
    int ra = run(buf, len, len, &a, ea);
    size_t split = size ? (size_t)data[size - 1] * 7 % (len + 1) : 0;
    int rb = run(buf, len, split, &b, eb);
    if (ra != rb || a.ready != b.ready || a.commands != b.commands || a.messages != b.messages ||
        a.bytes != b.bytes || (ra && strcmp(ea, eb)))
        abort();
    if (a.ready > 1)
        abort();
    free(buf);
    return 0;
}
