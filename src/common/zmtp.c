/* zmtp — see zmtp.h. Two layers: an I/O-free parser (zmtp_rx_*: greeting, frames,
 * commands, message assembly, every limit) and the sockets on the reactor (accept,
 * connect with backoff, output queues with a high-water mark, subscriptions). */
#include "common/zmtp.h"

#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define F_MORE 0x01
#define F_LONG 0x02
#define F_COMMAND 0x04
#define ZMTP_MAX_COMMAND ((size_t)64 << 10) /* READY with properties, PING, SUBSCRIBE */
#define ZMTP_MAX_TOPICS 256
#define ZMTP_MAX_TOPIC_LEN 255
#define ZMTP_READ_SLICE ((size_t)256 << 10)

/* ---- encoders --------------------------------------------------------------------- */

const char *zmtp_type_name(enum zmtp_type t)
{
    switch (t) {
    case ZMTP_PUB:
        return "PUB";
    case ZMTP_SUB:
        return "SUB";
    case ZMTP_ROUTER:
        return "ROUTER";
    default:
        return "DEALER";
    }
}

void zmtp_put_greeting(uint8_t out[64], bool as_server)
{
    memset(out, 0, 64);
    out[0] = 0xff;
    out[9] = 0x7f;
    out[10] = 3; /* major */
    out[11] = 1; /* minor: 3.1 */
    memcpy(out + 12, "NULL", 4);
    out[32] = as_server ? 1 : 0;
}

size_t zmtp_put_frame_header(uint8_t out[9], size_t len, bool more, bool command)
{
    uint8_t flags = (uint8_t)((more ? F_MORE : 0) | (command ? F_COMMAND : 0));
    if (len <= 255) {
        out[0] = flags;
        out[1] = (uint8_t)len;
        return 2;
    }
    out[0] = flags | F_LONG;
    for (int i = 0; i < 8; i++)
        out[1 + i] = (uint8_t)((uint64_t)len >> (8 * (7 - i)));
    return 9;
}

static size_t put_prop(uint8_t *out, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    out[0] = (uint8_t)nl;
    memcpy(out + 1, name, nl);
    out[1 + nl] = (uint8_t)(vl >> 24);
    out[2 + nl] = (uint8_t)(vl >> 16);
    out[3 + nl] = (uint8_t)(vl >> 8);
    out[4 + nl] = (uint8_t)vl;
    memcpy(out + 5 + nl, value, vl);
    return 5 + nl + vl;
}

size_t zmtp_put_ready(uint8_t *out, const char *socket_type, const char *identity)
{
    uint8_t body[480];
    size_t n = 0;
    body[n++] = 5;
    memcpy(body + n, "READY", 5);
    n += 5;
    n += put_prop(body + n, "Socket-Type", socket_type);
    if (identity && strlen(identity) <= 255)
        n += put_prop(body + n, "Identity", identity);
    size_t h = zmtp_put_frame_header(out, n, false, true);
    memcpy(out + h, body, n);
    return h + n;
}

/* ---- parser ----------------------------------------------------------------------- */

void zmtp_rx_init(struct zmtp_rx *rx, size_t max_frame, size_t max_parts, size_t max_msg)
{
    memset(rx, 0, sizeof(*rx));
    rx->max_frame = max_frame ? max_frame : (size_t)16 << 20;
    rx->max_parts = max_parts ? MOTOR_MIN(max_parts, ZMTP_MAX_PARTS_CEIL) : 16;
    rx->max_msg = max_msg ? max_msg : rx->max_frame + ((size_t)64 << 10);
    rx->peer_minor = -1;
}

void zmtp_rx_release(struct zmtp_rx *rx)
{
    free(rx->msg_buf);
    free(rx->cmd_buf);
    rx->msg_buf = rx->cmd_buf = NULL;
    rx->cmd_cap = 0;
}

static int rx_fail(struct zmtp_rx *rx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int rx_fail(struct zmtp_rx *rx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(rx->err, sizeof(rx->err), fmt, ap);
    va_end(ap);
    rx->stage = ZMTP_RX_FAILED;
    return -EPROTO;
}

/* The greeting, checked as soon as each field is in (a non-ZMTP peer is refused at its
 * first byte, not after 64). */
static int rx_greeting(struct zmtp_rx *rx)
{
    const uint8_t *g = rx->greeting;
    size_t n = rx->greeting_len;
    if (n >= 1 && g[0] != 0xff)
        return rx_fail(rx, "not a ZMTP 3 peer (first byte 0x%02x, expected 0xff)", g[0]);
    if (n >= 10 && !(g[9] & 0x01))
        return rx_fail(rx, "unversioned ZMTP 1.0 peer (signature byte 10 is 0x%02x)", g[9]);
    if (n >= 11 && g[10] < 3)
        return rx_fail(rx, "peer speaks ZMTP %u.x; 3.0 or later is required", g[10]);
    if (n < 64)
        return 0;
    rx->peer_minor = g[11] >= 1 ? 1 : 0;
    char mech[21];
    memcpy(mech, g + 12, 20);
    mech[20] = '\0';
    for (int i = 0; i < 20; i++)
        if ((unsigned char)mech[i] >= 0x80 || (mech[i] && mech[i] < 0x20))
            mech[i] = '?';
    if (memcmp(g + 12, "NULL", 4) != 0)
        return rx_fail(rx, "security mechanism '%s' is not supported (only NULL)", mech);
    for (int i = 16; i < 32; i++)
        if (g[i] != 0)
            return rx_fail(rx, "security mechanism '%s' is not supported (only NULL)", mech);
    rx->stage = ZMTP_RX_READY;
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int rx_ready(struct zmtp_rx *rx, const uint8_t *b, size_t len, const struct zmtp_rx_cbs *cbs,
                    void *arg)
{
    const uint8_t *type = NULL, *id = NULL;
    size_t type_len = 0, id_len = 0;
    size_t off = 0;
    while (off < len) {
        size_t nl = b[off];
        if (nl == 0 || off + 1 + nl + 4 > len)
            return rx_fail(rx, "malformed READY: property header at byte %zu", off);
        const uint8_t *name = b + off + 1;
        uint32_t vl = be32(b + off + 1 + nl);
        if ((uint64_t)off + 1 + nl + 4 + vl > len)
            return rx_fail(rx, "malformed READY: property value of %u bytes overruns", vl);
        const uint8_t *val = b + off + 1 + nl + 4;
        if (nl == 11 && !strncasecmp((const char *)name, "Socket-Type", 11)) {
            type = val;
            type_len = vl;
        } else if (nl == 8 && !strncasecmp((const char *)name, "Identity", 8)) {
            id = val;
            id_len = vl;
        }
        off += 1 + nl + 4 + vl;
    }
    if (!type)
        return rx_fail(rx, "READY without Socket-Type");
    /* Open before the callback, which may halt the parser (stage FAILED) itself. */
    rx->stage = ZMTP_RX_OPEN;
    if (cbs && cbs->ready && cbs->ready(arg, type, type_len, id, id_len, rx->err, sizeof(rx->err))) {
        if (!rx->err[0])
            snprintf(rx->err, sizeof(rx->err), "peer refused at READY");
        rx->stage = ZMTP_RX_FAILED;
        return -EPROTO;
    }
    return 0;
}

static void printable(char *dst, size_t cap, const uint8_t *s, size_t n)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 1 < cap; i++)
        dst[j++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    dst[j] = '\0';
}

static int rx_command(struct zmtp_rx *rx, const uint8_t *b, size_t len,
                      const struct zmtp_rx_cbs *cbs, void *arg)
{
    if (len < 1 || (size_t)b[0] + 1 > len || b[0] == 0)
        return rx_fail(rx, "malformed command frame (%zu bytes)", len);
    size_t nl = b[0];
    const uint8_t *name = b + 1, *body = b + 1 + nl;
    size_t blen = len - 1 - nl;
    char shown[64];
    if (nl == 5 && !memcmp(name, "ERROR", 5)) {
        size_t rl = blen > 0 ? body[0] : 0;
        if (rl + 1 > blen)
            rl = blen > 0 ? blen - 1 : 0;
        printable(shown, sizeof(shown), body + (blen > 0), rl);
        return rx_fail(rx, "peer sent ERROR: %s", shown);
    }
    if (rx->stage == ZMTP_RX_READY) {
        if (nl == 5 && !memcmp(name, "READY", 5))
            return rx_ready(rx, body, blen, cbs, arg);
        printable(shown, sizeof(shown), name, nl);
        return rx_fail(rx, "expected READY, got command '%s'", shown);
    }
    if (nl == 5 && !memcmp(name, "READY", 5))
        return rx_fail(rx, "a second READY");
    if (cbs && cbs->command)
        cbs->command(arg, name, nl, body, blen);
    return 0;
}

static int rx_frame_header(struct zmtp_rx *rx)
{
    uint8_t f = rx->hdr[0];
    if (f & 0xf8)
        return rx_fail(rx, "reserved flag bits set (0x%02x)", f);
    bool cmd = f & F_COMMAND;
    if (cmd && (f & F_MORE))
        return rx_fail(rx, "command frame with the MORE flag");
    uint64_t len = 0;
    if (f & F_LONG) {
        for (int i = 1; i < 9; i++)
            len = len << 8 | rx->hdr[i];
    } else {
        len = rx->hdr[1];
    }
    if (cmd) {
        if (rx->n_parts > 0)
            return rx_fail(rx, "command frame inside a multipart message");
        if (len > ZMTP_MAX_COMMAND)
            return rx_fail(rx, "command of %llu bytes exceeds the %zu-byte limit",
                           (unsigned long long)len, ZMTP_MAX_COMMAND);
        if (len > rx->cmd_cap) {
            rx->cmd_cap = MOTOR_MAX((size_t)len, (size_t)256);
            rx->cmd_buf = xrealloc(rx->cmd_buf, rx->cmd_cap);
        }
    } else {
        if (rx->stage != ZMTP_RX_OPEN)
            return rx_fail(rx, "message frame before the READY handshake");
        if (len > rx->max_frame)
            return rx_fail(rx, "frame of %llu bytes exceeds the %zu-byte limit",
                           (unsigned long long)len, rx->max_frame);
        if (rx->n_parts >= rx->max_parts)
            return rx_fail(rx, "message of more than %zu frames", rx->max_parts);
        if (rx->msg_len + len > rx->max_msg)
            return rx_fail(rx, "message of more than %zu bytes", rx->max_msg);
        if (rx->msg_len + len > rx->msg_cap) {
            size_t want = MOTOR_MAX(rx->msg_len + (size_t)len, rx->msg_cap * 2);
            want = MOTOR_MIN(MOTOR_MAX(want, (size_t)256), rx->max_msg);
            rx->msg_buf = xrealloc(rx->msg_buf, want);
            rx->msg_cap = want;
        }
        rx->part_off[rx->n_parts] = rx->msg_len;
    }
    rx->flags = f;
    rx->body_len = len;
    rx->body_got = 0;
    rx->in_body = true;
    return 0;
}

static int rx_frame_done(struct zmtp_rx *rx, const struct zmtp_rx_cbs *cbs, void *arg)
{
    rx->in_body = false;
    rx->hdr_len = 0;
    if (rx->flags & F_COMMAND)
        return rx_command(rx, rx->cmd_buf, (size_t)rx->body_len, cbs, arg);
    rx->part_len[rx->n_parts++] = (size_t)rx->body_len;
    rx->msg_len += (size_t)rx->body_len;
    if (rx->flags & F_MORE)
        return 0;
    struct zmtp_msg m;
    m.n = rx->n_parts;
    for (size_t i = 0; i < m.n; i++) {
        m.parts[i] = rx->msg_buf ? rx->msg_buf + rx->part_off[i] : (const uint8_t *)"";
        m.lens[i] = rx->part_len[i];
    }
    rx->n_parts = 0;
    rx->msg_len = 0;
    if (cbs && cbs->message)
        cbs->message(arg, &m);
    return 0;
}

int zmtp_rx_feed(struct zmtp_rx *rx, const void *data, size_t len, const struct zmtp_rx_cbs *cbs,
                 void *arg)
{
    const uint8_t *p = data;
    while (len > 0 || (rx->in_body && rx->body_got == rx->body_len)) {
        if (rx->stage == ZMTP_RX_FAILED)
            return -EPROTO;
        if (rx->stage == ZMTP_RX_GREETING) {
            size_t take = MOTOR_MIN(len, 64 - rx->greeting_len);
            /* Byte by byte up to the version, so a wrong peer is named at once. */
            if (rx->greeting_len < 11)
                take = MOTOR_MIN(take, (size_t)1);
            memcpy(rx->greeting + rx->greeting_len, p, take);
            rx->greeting_len += take;
            p += take;
            len -= take;
            if (rx_greeting(rx))
                return -EPROTO;
            continue;
        }
        if (!rx->in_body) {
            if (rx->hdr_len == 0) {
                rx->hdr[rx->hdr_len++] = *p++;
                len--;
                continue;
            }
            size_t need = (rx->hdr[0] & F_LONG) ? 9 : 2;
            size_t take = MOTOR_MIN(len, need - rx->hdr_len);
            memcpy(rx->hdr + rx->hdr_len, p, take);
            rx->hdr_len += take;
            p += take;
            len -= take;
            if (rx->hdr_len == need && rx_frame_header(rx))
                return -EPROTO;
            continue;
        }
        size_t take = (size_t)MOTOR_MIN((uint64_t)len, rx->body_len - rx->body_got);
        if (take) {
            uint8_t *dst = (rx->flags & F_COMMAND) ? rx->cmd_buf
                                                   : rx->msg_buf + rx->part_off[rx->n_parts];
            memcpy(dst + rx->body_got, p, take);
            rx->body_got += take;
            p += take;
            len -= take;
        }
        if (rx->body_got == rx->body_len) {
            if (rx_frame_done(rx, cbs, arg))
                return -EPROTO;
            if (rx->stage == ZMTP_RX_FAILED)
                return -EPROTO;
        }
    }
    return rx->stage == ZMTP_RX_FAILED ? -EPROTO : 0;
}

/* ---- sockets ---------------------------------------------------------------------- */

struct topic {
    uint8_t len;
    uint8_t refs;
    uint8_t data[ZMTP_MAX_TOPIC_LEN];
};

struct zmtp_peer {
    struct list_head link;
    struct zmtp_sock *s;
    int fd;
    bool connecting; /* TCP connect in progress */
    bool ready;      /* the peer's READY arrived (ours went out with the greeting) */
    bool dead;
    char addr[64];
    struct zmtp_rx rx;
    /* output: bytes [out_off, out_len) unsent; ends[] = absolute end offsets of queued
     * messages, to count them against the high-water mark */
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    uint64_t base; /* absolute offset of out[0] */
    uint64_t *ends;
    size_t ends_head, ends_n, ends_cap;
    struct topic *subs; /* PUB side: what this subscriber asked for */
    size_t n_subs;
    struct reactor_deferred more;
    struct reactor_timer hs_timer;
};

struct zmtp_sock {
    struct reactor *r;
    enum zmtp_type type;
    struct zmtp_opts o;
    char *name, *identity;
    zmtp_msg_cb on_msg;
    zmtp_event_cb on_event;
    void *arg;
    int lfd;
    uint16_t port;
    /* connect side */
    bool is_connect;
    char *host;
    char service[8];
    int backoff_ms;
    struct reactor_timer retry;
    struct list_head peers, dead;
    struct reactor_deferred reap;
    struct topic *topics; /* SUB */
    size_t n_topics;
    int cb_depth;
    bool closing;
    struct zmtp_stats st;
};

static void sock_free_now(struct zmtp_sock *s);
static void peer_io(struct reactor *r, int fd, uint32_t events, void *arg);
static void start_connect(struct zmtp_sock *s);

static const char *sock_name(const struct zmtp_sock *s)
{
    return s->name ? s->name : "zmtp";
}

static void emit(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev, const char *detail)
{
    if (!s->on_event || s->closing)
        return;
    s->cb_depth++;
    s->on_event(s, p, ev, detail, s->arg);
    s->cb_depth--;
}

static void peer_free(struct zmtp_peer *p)
{
    zmtp_rx_release(&p->rx);
    free(p->out);
    free(p->ends);
    free(p->subs);
    free(p);
}

static void on_reap(struct reactor *r, void *arg)
{
    struct zmtp_sock *s = arg;
    while (!list_empty(&s->dead)) {
        struct zmtp_peer *p = list_entry(list_first(&s->dead), struct zmtp_peer, link);
        list_remove(&p->link);
        peer_free(p);
    }
    if (s->closing && s->cb_depth == 0)
        sock_free_now(s);
}

static void retry_later(struct zmtp_sock *s)
{
    if (!s->is_connect || s->closing)
        return;
    reactor_timer_start(s->r, &s->retry, s->backoff_ms, 0);
    s->backoff_ms = MOTOR_MIN(s->backoff_ms * 2, s->o.reconnect_max_ms);
}

/* Close a peer; its memory lives until the reap (callbacks up the stack may hold it). */
static void peer_kill(struct zmtp_peer *p, enum zmtp_event ev, const char *why)
{
    if (p->dead)
        return;
    struct zmtp_sock *s = p->s;
    p->dead = true;
    reactor_del_fd(s->r, p->fd);
    close(p->fd);
    p->fd = -1;
    reactor_timer_stop(s->r, &p->hs_timer);
    reactor_defer_cancel(s->r, &p->more);
    list_remove(&p->link);
    list_insert_tail(&s->dead, &p->link);
    reactor_defer(s->r, &s->reap);
    bool was_ready = p->ready;
    if (was_ready) {
        s->st.peers--;
        s->st.disconnects++;
    }
    if (ev == ZMTP_EV_ERROR) {
        s->st.errors++;
        log_warn("zmtp_peer_error", LF_STR("socket", sock_name(s)), LF_STR("peer", p->addr),
                 LF_STR("error", why));
        emit(s, p, ZMTP_EV_ERROR, why);
    } else if (was_ready) {
        log_info("zmtp_peer_gone", LF_STR("socket", sock_name(s)), LF_STR("peer", p->addr),
                 LF_STR("why", why));
        emit(s, p, ZMTP_EV_DISCONNECTED, why);
    } else if (!s->is_connect) {
        log_debug("zmtp_peer_gone", LF_STR("socket", sock_name(s)), LF_STR("peer", p->addr),
                  LF_STR("why", why));
    }
    if (s->is_connect)
        retry_later(s);
}

static void peer_flush(struct zmtp_peer *p)
{
    while (!p->dead && !p->connecting && p->out_off < p->out_len) {
        ssize_t n = send(p->fd, p->out + p->out_off, p->out_len - p->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            p->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        char why[96];
        snprintf(why, sizeof(why), "send: %s", n < 0 ? strerror(errno) : "closed");
        peer_kill(p, ZMTP_EV_DISCONNECTED, why);
        return;
    }
    /* retire sent messages from the high-water count */
    uint64_t sent = p->base + p->out_off;
    while (p->ends_n > 0 && p->ends[p->ends_head] <= sent) {
        p->ends_head = (p->ends_head + 1) % p->ends_cap;
        p->ends_n--;
    }
    if (p->out_off == p->out_len) {
        p->base += p->out_len;
        p->out_off = p->out_len = 0;
    } else if (p->out_off > ((size_t)1 << 20) && p->out_off * 2 > p->out_len) {
        memmove(p->out, p->out + p->out_off, p->out_len - p->out_off);
        p->base += p->out_off;
        p->out_len -= p->out_off;
        p->out_off = 0;
    }
}

static void out_append(struct zmtp_peer *p, const void *data, size_t n)
{
    if (p->out_len + n > p->out_cap) {
        size_t want = MOTOR_MAX(p->out_len + n, MOTOR_MAX(p->out_cap * 2, (size_t)4096));
        p->out = xrealloc(p->out, want);
        p->out_cap = want;
    }
    memcpy(p->out + p->out_len, data, n);
    p->out_len += n;
}

/* Queue raw protocol bytes (greeting, commands): never subject to the HWM. */
static void peer_queue_raw(struct zmtp_peer *p, const void *data, size_t n)
{
    out_append(p, data, n);
    peer_flush(p);
}

static int peer_queue_msg(struct zmtp_peer *p, const struct zmtp_msg *m)
{
    struct zmtp_sock *s = p->s;
    size_t total = 0;
    for (size_t i = 0; i < m->n; i++)
        total += m->lens[i] + 9;
    if (p->ends_n >= s->o.hwm || (p->out_len - p->out_off) + total > s->o.max_queue_bytes) {
        s->st.dropped++;
        return -EAGAIN;
    }
    for (size_t i = 0; i < m->n; i++) {
        uint8_t h[9];
        size_t hn = zmtp_put_frame_header(h, m->lens[i], i + 1 < m->n, false);
        out_append(p, h, hn);
        if (m->lens[i])
            out_append(p, m->parts[i], m->lens[i]);
    }
    if (!p->ends) {
        p->ends_cap = s->o.hwm;
        p->ends = xcalloc(p->ends_cap, sizeof(*p->ends));
    }
    p->ends[(p->ends_head + p->ends_n) % p->ends_cap] = p->base + p->out_len;
    p->ends_n++;
    s->st.sent++;
    peer_flush(p);
    return 0;
}

static void send_command(struct zmtp_peer *p, const char *name, const void *body, size_t blen)
{
    size_t nl = strlen(name);
    uint8_t h[9];
    size_t hn = zmtp_put_frame_header(h, 1 + nl + blen, false, true);
    uint8_t nlb = (uint8_t)nl;
    out_append(p, h, hn);
    out_append(p, &nlb, 1);
    out_append(p, name, nl);
    if (blen)
        out_append(p, body, blen);
    peer_flush(p);
}

/* Tell a PUB what we want: 3.1 commands, or 3.0's 0x01/0x00-prefixed messages. */
static void send_subscription(struct zmtp_peer *p, const uint8_t *t, size_t len, bool sub)
{
    if (p->rx.peer_minor >= 1) {
        send_command(p, sub ? "SUBSCRIBE" : "CANCEL", t, len);
        return;
    }
    uint8_t buf[1 + ZMTP_MAX_TOPIC_LEN];
    buf[0] = sub ? 1 : 0;
    memcpy(buf + 1, t, len);
    uint8_t h[9];
    size_t hn = zmtp_put_frame_header(h, len + 1, false, false);
    out_append(p, h, hn);
    out_append(p, buf, len + 1);
    peer_flush(p);
}

static bool types_match(enum zmtp_type self, const uint8_t *t, size_t n)
{
#define IS(name) (n == sizeof(name) - 1 && !memcmp(t, name, n))
    switch (self) {
    case ZMTP_PUB:
        return IS("SUB") || IS("XSUB");
    case ZMTP_SUB:
        return IS("PUB") || IS("XPUB");
    case ZMTP_ROUTER:
        return IS("DEALER") || IS("REQ") || IS("ROUTER");
    default:
        return IS("ROUTER") || IS("REP") || IS("DEALER");
    }
#undef IS
}

static int cb_ready(void *arg, const uint8_t *type, size_t type_len, const uint8_t *identity,
                    size_t id_len, char *err, size_t cap)
{
    struct zmtp_peer *p = arg;
    struct zmtp_sock *s = p->s;
    if (!types_match(s->type, type, type_len)) {
        char shown[32];
        printable(shown, sizeof(shown), type, type_len);
        snprintf(err, cap, "peer socket type %s cannot talk to %s", shown, zmtp_type_name(s->type));
        /* RFC 37: say why before closing. */
        char reason[96];
        int rl = snprintf(reason, sizeof(reason), "%cInvalid socket type", 19);
        send_command(p, "ERROR", reason, (size_t)rl);
        return -EPROTO;
    }
    p->ready = true;
    reactor_timer_stop(s->r, &p->hs_timer);
    s->st.peers++;
    s->st.connects++;
    s->backoff_ms = s->o.reconnect_ms;
    if (s->type == ZMTP_SUB)
        for (size_t i = 0; i < s->n_topics; i++)
            send_subscription(p, s->topics[i].data, s->topics[i].len, true);
    log_debug("zmtp_peer_ready", LF_STR("socket", sock_name(s)), LF_STR("peer", p->addr),
              LF_INT("peer_minor", p->rx.peer_minor));
    emit(s, p, ZMTP_EV_CONNECTED, NULL);
    if (p->dead || s->closing)
        p->rx.stage = ZMTP_RX_FAILED; /* stop parsing: the peer or socket is gone */
    return 0;
}

/* PUB side: add or drop a subscriber's topic (reference-counted like libzmq's trie). */
static void peer_sub(struct zmtp_peer *p, const uint8_t *t, size_t len, bool add)
{
    if (len > ZMTP_MAX_TOPIC_LEN) {
        peer_kill(p, ZMTP_EV_ERROR, "subscription topic longer than 255 bytes");
        return;
    }
    for (size_t i = 0; i < p->n_subs; i++) {
        struct topic *x = &p->subs[i];
        if (x->len == len && !memcmp(x->data, t, len)) {
            if (add) {
                if (x->refs < 255)
                    x->refs++;
            } else if (--x->refs == 0) {
                p->subs[i] = p->subs[--p->n_subs];
            }
            return;
        }
    }
    if (!add)
        return;
    if (p->n_subs >= ZMTP_MAX_TOPICS) {
        peer_kill(p, ZMTP_EV_ERROR, "more than 256 subscriptions");
        return;
    }
    if (!p->subs)
        p->subs = xcalloc(ZMTP_MAX_TOPICS, sizeof(*p->subs));
    struct topic *x = &p->subs[p->n_subs++];
    x->len = (uint8_t)len;
    x->refs = 1;
    memcpy(x->data, t, len);
}

static void cb_command(void *arg, const uint8_t *name, size_t nl, const uint8_t *body, size_t blen)
{
    struct zmtp_peer *p = arg;
    if (nl == 4 && !memcmp(name, "PING", 4)) {
        /* PONG echoes the ping's context (after its 2-byte TTL), at most 16 bytes. */
        size_t ctx = blen > 2 ? MOTOR_MIN(blen - 2, (size_t)16) : 0;
        send_command(p, "PONG", body + 2, ctx);
    } else if (p->s->type == ZMTP_PUB && nl == 9 && !memcmp(name, "SUBSCRIBE", 9)) {
        peer_sub(p, body, blen, true);
    } else if (p->s->type == ZMTP_PUB && nl == 6 && !memcmp(name, "CANCEL", 6)) {
        peer_sub(p, body, blen, false);
    }
}

static bool topic_match(const struct topic *t, size_t n, const struct zmtp_msg *m)
{
    size_t len = m->n ? m->lens[0] : 0;
    for (size_t i = 0; i < n; i++)
        if (t[i].len <= len && (t[i].len == 0 || !memcmp(t[i].data, m->parts[0], t[i].len)))
            return true;
    return false;
}

static void cb_message(void *arg, const struct zmtp_msg *m)
{
    struct zmtp_peer *p = arg;
    struct zmtp_sock *s = p->s;
    if (p->dead || s->closing)
        return;
    if (s->type == ZMTP_PUB) {
        /* ZMTP 3.0 subscriptions; anything else a subscriber sends is ignored. */
        if (m->n == 1 && m->lens[0] >= 1 && (m->parts[0][0] == 1 || m->parts[0][0] == 0))
            peer_sub(p, m->parts[0] + 1, m->lens[0] - 1, m->parts[0][0] == 1);
        return;
    }
    if (s->type == ZMTP_SUB && !topic_match(s->topics, s->n_topics, m))
        return;
    s->st.received++;
    if (s->on_msg) {
        s->cb_depth++;
        s->on_msg(s, p, m, s->arg);
        s->cb_depth--;
    }
    if (p->dead || s->closing)
        p->rx.stage = ZMTP_RX_FAILED; /* stop parsing what is left */
}

static const struct zmtp_rx_cbs rx_cbs = {
    .ready = cb_ready, .command = cb_command, .message = cb_message};

static void peer_read(struct zmtp_peer *p)
{
    struct zmtp_sock *s = p->s;
    uint8_t buf[64 << 10];
    size_t budget = ZMTP_READ_SLICE;
    while (!p->dead && !s->closing) {
        if (budget == 0) {
            /* Edge-triggered: no new event will come for what is still buffered. */
            reactor_defer(s->r, &p->more);
            return;
        }
        ssize_t n = recv(p->fd, buf, MOTOR_MIN(sizeof(buf), budget), 0);
        if (n > 0) {
            budget -= (size_t)n;
            s->cb_depth++;
            int rc = zmtp_rx_feed(&p->rx, buf, (size_t)n, &rx_cbs, p);
            s->cb_depth--;
            if (p->dead || s->closing)
                break;
            if (rc) {
                peer_kill(p, ZMTP_EV_ERROR, p->rx.err);
                break;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        char why[96];
        snprintf(why, sizeof(why), "%s", n == 0 ? "peer closed the connection" : strerror(errno));
        peer_kill(p, ZMTP_EV_DISCONNECTED, why);
        break;
    }
    if (s->closing && s->cb_depth == 0)
        reactor_defer(s->r, &s->reap);
}

static void on_more(struct reactor *r, void *arg)
{
    peer_read(arg);
}

static void on_hs_timeout(struct reactor *r, void *arg)
{
    struct zmtp_peer *p = arg;
    char why[96];
    snprintf(why, sizeof(why), "handshake not completed within %d ms",
             p->s->o.handshake_timeout_ms);
    peer_kill(p, ZMTP_EV_ERROR, why);
}

static void peer_start_protocol(struct zmtp_peer *p)
{
    struct zmtp_sock *s = p->s;
    uint8_t g[64];
    zmtp_put_greeting(g, false);
    out_append(p, g, sizeof(g));
    uint8_t ready[512];
    size_t n = zmtp_put_ready(ready, zmtp_type_name(s->type),
                              (s->type == ZMTP_ROUTER || s->type == ZMTP_DEALER) ? s->identity
                                                                                   : NULL);
    peer_queue_raw(p, ready, n);
    reactor_timer_start(s->r, &p->hs_timer, s->o.handshake_timeout_ms, 0);
}

static void addr_text(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        port = ntohs(a->sin6_port);
    }
    snprintf(out, cap, "%s:%d", host, port);
}

static struct zmtp_peer *peer_new(struct zmtp_sock *s, int fd, bool connecting)
{
    struct zmtp_peer *p = xcalloc(1, sizeof(*p));
    p->s = s;
    p->fd = fd;
    p->connecting = connecting;
    zmtp_rx_init(&p->rx, s->o.max_frame, s->o.max_parts, s->o.max_msg);
    reactor_deferred_init(&p->more, on_more, p);
    reactor_timer_init(&p->hs_timer, on_hs_timeout, p);
    list_insert_tail(&s->peers, &p->link);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (reactor_add_fd(s->r, fd, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, peer_io, p)) {
        snprintf(p->addr, sizeof(p->addr), "?");
        peer_kill(p, ZMTP_EV_DISCONNECTED, "cannot watch the socket");
        return NULL;
    }
    return p;
}

static void peer_io(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct zmtp_peer *p = arg;
    if (p->connecting) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        int err = 0;
        socklen_t el = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            char why[96];
            snprintf(why, sizeof(why), "connect: %s", strerror(err));
            log_debug("zmtp_connect_failed", LF_STR("socket", sock_name(p->s)),
                      LF_STR("peer", p->addr), LF_STR("error", strerror(err)));
            peer_kill(p, ZMTP_EV_DISCONNECTED, why);
            return;
        }
        p->connecting = false;
        peer_start_protocol(p);
        if (p->dead)
            return;
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
        peer_read(p);
    if (!p->dead && (events & EPOLLOUT))
        peer_flush(p);
}

static void on_accept(struct reactor *r, int lfd, uint32_t events, void *arg)
{
    struct zmtp_sock *s = arg;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                log_warn("zmtp_accept_failed", LF_STR("socket", sock_name(s)),
                         LF_STR("error", strerror(errno)));
            return;
        }
        struct zmtp_peer *p = peer_new(s, fd, false);
        if (!p)
            continue;
        addr_text(&ss, p->addr, sizeof(p->addr));
        peer_start_protocol(p);
    }
}

/* "tcp://host:port" -> host (brackets stripped; "*" kept) and port text. */
static int parse_endpoint(const char *ep, char **host, char service[8])
{
    if (!ep || strncmp(ep, "tcp://", 6) != 0)
        return -EINVAL;
    const char *h = ep + 6;
    const char *colon = strrchr(h, ':');
    if (!colon || colon == h || !colon[1] || strlen(colon + 1) > 5)
        return -EINVAL;
    int port;
    if (util_parse_int(colon + 1, 0, 65535, &port))
        return -EINVAL;
    size_t hl = (size_t)(colon - h);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return -EINVAL;
        h++;
        hl -= 2;
    }
    *host = xcalloc(1, hl + 1);
    memcpy(*host, h, hl);
    snprintf(service, 8, "%d", port);
    return 0;
}

static struct zmtp_sock *sock_new(struct reactor *r, enum zmtp_type type,
                                  const struct zmtp_opts *o, zmtp_msg_cb on_msg,
                                  zmtp_event_cb on_event, void *arg)
{
    struct zmtp_sock *s = xcalloc(1, sizeof(*s));
    s->r = r;
    s->type = type;
    if (o)
        s->o = *o;
    if (!s->o.max_frame)
        s->o.max_frame = (size_t)16 << 20;
    if (!s->o.max_parts || s->o.max_parts > ZMTP_MAX_PARTS_CEIL)
        s->o.max_parts = s->o.max_parts ? ZMTP_MAX_PARTS_CEIL : 16;
    if (!s->o.max_msg)
        s->o.max_msg = s->o.max_frame + ((size_t)64 << 10);
    if (!s->o.hwm)
        s->o.hwm = 1000;
    if (!s->o.max_queue_bytes)
        s->o.max_queue_bytes = (size_t)64 << 20;
    if (s->o.reconnect_ms <= 0)
        s->o.reconnect_ms = 100;
    if (s->o.reconnect_max_ms <= 0)
        s->o.reconnect_max_ms = 5000;
    if (s->o.handshake_timeout_ms <= 0)
        s->o.handshake_timeout_ms = 10000;
    s->name = o && o->name ? xstrdup(o->name) : NULL;
    s->identity = o && o->identity ? xstrdup(o->identity) : NULL;
    s->o.name = s->name;
    s->o.identity = s->identity;
    s->on_msg = on_msg;
    s->on_event = on_event;
    s->arg = arg;
    s->lfd = -1;
    s->backoff_ms = s->o.reconnect_ms;
    list_init(&s->peers);
    list_init(&s->dead);
    reactor_deferred_init(&s->reap, on_reap, s);
    reactor_timer_init(&s->retry, NULL, s);
    return s;
}

struct zmtp_sock *zmtp_bind(struct reactor *r, enum zmtp_type type, const char *endpoint,
                            const struct zmtp_opts *o, zmtp_msg_cb on_msg, zmtp_event_cb on_event,
                            void *arg)
{
    char *host = NULL;
    char service[8];
    if (parse_endpoint(endpoint, &host, service)) {
        log_error("zmtp_bad_endpoint", LF_STR("endpoint", endpoint),
                  LF_STR("expected", "tcp://HOST:PORT (HOST '*', an address or a name)"));
        errno = EINVAL;
        return NULL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    bool any = !strcmp(host, "*");
    int gai = getaddrinfo(any ? "0.0.0.0" : host, service, &hints, &ai);
    if (gai || !ai) {
        log_error("zmtp_bind_failed", LF_STR("endpoint", endpoint),
                  LF_STR("error", gai_strerror(gai)));
        free(host);
        errno = EINVAL;
        return NULL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    int e = 0;
    if (fd < 0)
        e = errno;
    else if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
             bind(fd, ai->ai_addr, ai->ai_addrlen) || listen(fd, 128))
        e = errno;
    freeaddrinfo(ai);
    free(host);
    if (e) {
        log_error("zmtp_bind_failed", LF_STR("endpoint", endpoint), LF_STR("error", strerror(e)));
        if (fd >= 0)
            close(fd);
        errno = e;
        return NULL;
    }
    struct zmtp_sock *s = sock_new(r, type, o, on_msg, on_event, arg);
    s->lfd = fd;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    if (reactor_add_fd(r, fd, EPOLLIN | EPOLLET, on_accept, s)) {
        e = errno ? errno : EIO;
        sock_free_now(s);
        errno = e;
        return NULL;
    }
    log_info("zmtp_bound", LF_STR("socket", sock_name(s)), LF_STR("type", zmtp_type_name(type)),
             LF_STR("endpoint", endpoint), LF_INT("port", s->port));
    return s;
}

static void on_retry(struct reactor *r, void *arg)
{
    start_connect(arg);
}

static void start_connect(struct zmtp_sock *s)
{
    if (s->closing || !list_empty(&s->peers))
        return;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(s->host, s->service, &hints, &ai);
    if (gai || !ai) {
        log_debug("zmtp_resolve_failed", LF_STR("socket", sock_name(s)), LF_STR("host", s->host),
                  LF_STR("error", gai_strerror(gai)));
        retry_later(s);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        retry_later(s);
        return;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    struct sockaddr_storage ss;
    memcpy(&ss, ai->ai_addr, MOTOR_MIN((size_t)ai->ai_addrlen, sizeof(ss)));
    freeaddrinfo(ai);
    if (rc && errno != EINPROGRESS) {
        log_debug("zmtp_connect_failed", LF_STR("socket", sock_name(s)), LF_STR("host", s->host),
                  LF_STR("error", strerror(errno)));
        close(fd);
        retry_later(s);
        return;
    }
    struct zmtp_peer *p = peer_new(s, fd, true);
    if (p)
        addr_text(&ss, p->addr, sizeof(p->addr));
}

struct zmtp_sock *zmtp_connect(struct reactor *r, enum zmtp_type type, const char *endpoint,
                               const struct zmtp_opts *o, zmtp_msg_cb on_msg,
                               zmtp_event_cb on_event, void *arg)
{
    char *host = NULL;
    char service[8];
    if (parse_endpoint(endpoint, &host, service) || !strcmp(host, "*") ||
        !strcmp(service, "0")) {
        log_error("zmtp_bad_endpoint", LF_STR("endpoint", endpoint),
                  LF_STR("expected", "tcp://HOST:PORT with a host and a port"));
        free(host);
        errno = EINVAL;
        return NULL;
    }
    struct zmtp_sock *s = sock_new(r, type, o, on_msg, on_event, arg);
    s->is_connect = true;
    s->host = host;
    memcpy(s->service, service, sizeof(s->service));
    reactor_timer_init(&s->retry, on_retry, s);
    start_connect(s);
    return s;
}

static void sock_free_now(struct zmtp_sock *s)
{
    reactor_defer_cancel(s->r, &s->reap);
    reactor_timer_stop(s->r, &s->retry);
    while (!list_empty(&s->dead)) {
        struct zmtp_peer *p = list_entry(list_first(&s->dead), struct zmtp_peer, link);
        list_remove(&p->link);
        peer_free(p);
    }
    if (s->lfd >= 0) {
        reactor_del_fd(s->r, s->lfd);
        close(s->lfd);
    }
    free(s->topics);
    free(s->name);
    free(s->identity);
    free(s->host);
    free(s);
}

void zmtp_close(struct zmtp_sock *s)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    while (!list_empty(&s->peers)) {
        struct zmtp_peer *p = list_entry(list_first(&s->peers), struct zmtp_peer, link);
        peer_kill(p, ZMTP_EV_DISCONNECTED, "socket closed");
    }
    reactor_timer_stop(s->r, &s->retry);
    if (s->lfd >= 0) {
        reactor_del_fd(s->r, s->lfd);
        close(s->lfd);
        s->lfd = -1;
    }
    if (s->cb_depth > 0)
        reactor_defer(s->r, &s->reap);
    else
        sock_free_now(s);
}

uint16_t zmtp_port(const struct zmtp_sock *s)
{
    return s ? s->port : 0;
}

void zmtp_get_stats(const struct zmtp_sock *s, struct zmtp_stats *out)
{
    *out = s->st;
}

const char *zmtp_peer_addr(const struct zmtp_peer *p)
{
    return p ? p->addr : "";
}

static int topic_change(struct zmtp_sock *s, const void *topic, size_t len, bool add)
{
    if (s->type != ZMTP_SUB)
        return -EINVAL;
    if (len > ZMTP_MAX_TOPIC_LEN || (len && !topic))
        return -E2BIG;
    size_t i;
    for (i = 0; i < s->n_topics; i++)
        if (s->topics[i].len == len && !memcmp(s->topics[i].data, topic, len))
            break;
    if (add) {
        if (i < s->n_topics)
            return 0;
        if (s->n_topics >= ZMTP_MAX_TOPICS)
            return -E2BIG;
        if (!s->topics)
            s->topics = xcalloc(ZMTP_MAX_TOPICS, sizeof(*s->topics));
        s->topics[s->n_topics].len = (uint8_t)len;
        s->topics[s->n_topics].refs = 1;
        if (len)
            memcpy(s->topics[s->n_topics].data, topic, len);
        s->n_topics++;
    } else {
        if (i == s->n_topics)
            return 0;
        s->topics[i] = s->topics[--s->n_topics];
    }
    struct list_head *pos, *tmp;
    list_for_each_safe(pos, tmp, &s->peers)
    {
        struct zmtp_peer *p = list_entry(pos, struct zmtp_peer, link);
        if (p->ready)
            send_subscription(p, topic, len, add);
    }
    return 0;
}

int zmtp_subscribe(struct zmtp_sock *s, const void *topic, size_t len)
{
    return topic_change(s, topic, len, true);
}

int zmtp_unsubscribe(struct zmtp_sock *s, const void *topic, size_t len)
{
    return topic_change(s, topic, len, false);
}

static bool msg_ok(const struct zmtp_sock *s, const struct zmtp_msg *m)
{
    return m && m->n >= 1 && m->n <= s->o.max_parts;
}

int zmtp_send(struct zmtp_sock *s, const struct zmtp_msg *m)
{
    if (!msg_ok(s, m) || s->type == ZMTP_ROUTER || s->type == ZMTP_SUB || s->closing)
        return -EINVAL;
    struct list_head *pos, *tmp;
    if (s->type == ZMTP_DEALER) {
        list_for_each(pos, &s->peers)
        {
            struct zmtp_peer *p = list_entry(pos, struct zmtp_peer, link);
            if (p->ready)
                return peer_queue_msg(p, m);
        }
        return -ENOTCONN;
    }
    list_for_each_safe(pos, tmp, &s->peers)
    {
        struct zmtp_peer *p = list_entry(pos, struct zmtp_peer, link);
        if (p->ready && topic_match(p->subs, p->n_subs, m))
            peer_queue_msg(p, m); /* a slow subscriber misses it (counted) */
    }
    return 0;
}

int zmtp_send_to(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m)
{
    if (!msg_ok(s, m) || !p || p->s != s || s->closing)
        return -EINVAL;
    if (p->dead || !p->ready)
        return -ENOTCONN;
    return peer_queue_msg(p, m);
}
