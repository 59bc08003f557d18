/* zmtp — ZeroMQ's wire protocol (ZMTP 3.0 / 3.1, RFC 23 and 37) over TCP on a reactor,
 * NULL security mechanism, socket types PUB, SUB, ROUTER and DEALER.
 *
 * Why not libzmq: Motor's daemons are single-reactor C processes whose RSS is budgeted;
 * libzmq is C++ with its own I/O threads and its own queues. What Motor needs — vLLM's
 * KV-event stream (PUB/SUB) and its replay endpoint (ROUTER, asked by a DEALER) — is a
 * few hundred lines on the reactor every daemon already runs (docs/architecture.md,
 * "ZMQ and msgpack"). The wire is the contract: pyzmq/libzmq peers interoperate
 * (tests/integration/test_zmtp_interop.py).
 *
 * Behaviour
 *   - A socket either binds (accepts any number of peers) or connects (one peer, re-
 *     connected after a loss or a refusal with exponential backoff from reconnect_ms to
 *     reconnect_max_ms). Endpoints: "tcp://HOST:PORT" with HOST "*", an IPv4 literal,
 *     "[IPv6]" or a name (resolved with getaddrinfo when (re)connecting: blocking, so use
 *     literals on hot paths); PORT 0 binds an ephemeral port (zmtp_port()).
 *   - Greeting: ours (64 bytes, version 3.1, "NULL", as-server 0) goes out at once; the
 *     peer's must be ZMTP 3.x with the NULL mechanism. Then READY both ways with
 *     Socket-Type (and Identity for ROUTER/DEALER); incompatible socket types (RFC 37's
 *     table: PUB-SUB, ROUTER-DEALER, ROUTER-ROUTER, DEALER-DEALER, plus REQ/REP/XPUB/
 *     XSUB peers where the pattern allows) get an ERROR command and are closed.
 *   - PUB: a message goes to every peer with a matching subscription (prefix match on the
 *     first frame; SUBSCRIBE/CANCEL commands of 3.1 and the 0x01/0x00 messages of 3.0 are
 *     both honoured). A peer whose queue holds hwm messages (or max_queue_bytes) misses
 *     the new message (counted in zmtp_stats.dropped) — the publisher never blocks.
 *   - SUB: zmtp_subscribe() topics are (re)sent on every new connection (as SUBSCRIBE
 *     commands to a 3.1 peer, 0x01-prefixed messages to a 3.0 peer); messages arrive
 *     whole (all frames) through on_msg. Messages not matching any subscription are
 *     dropped here too (a PUB may over-deliver).
 *   - ROUTER: on_msg gets the peer that sent it; zmtp_send_to() answers that peer. The
 *     routing identity stays local (no identity frame on the wire, as ZMTP has none).
 *   - DEALER: zmtp_send() sends to the connected peer (-ENOTCONN before the handshake).
 *   - PING is answered with PONG (the ping's context echoed); other commands ignored.
 *   - Limits (a peer fills every buffer): a frame above max_frame, a message of more
 *     than max_parts frames or max_msg bytes, a malformed greeting, command or flags
 *     byte => the peer is closed with a clear reason (on_event ZMTP_EV_ERROR, and a
 *     "zmtp_peer_error" log line). Reads are edge-triggered, drained until EAGAIN in
 *     slices of 256 KiB per loop iteration (a flood cannot starve the reactor).
 *
 * Callbacks run on the reactor thread; any zmtp_* call is allowed inside them, including
 * zmtp_close() of the socket itself (freed after the callback returns).
 * Threading: everything on the reactor thread that owns the socket. */
#ifndef MOTOR_ZMTP_H
#define MOTOR_ZMTP_H

#include "common/reactor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum zmtp_type { ZMTP_PUB, ZMTP_SUB, ZMTP_ROUTER, ZMTP_DEALER };

#define ZMTP_MAX_PARTS_CEIL 64

/* A multipart message: parts[i] / lens[i], i < n. On receive the parts point into the
 * connection's buffer and are valid during the callback only. */
struct zmtp_msg {
    size_t n;
    const uint8_t *parts[ZMTP_MAX_PARTS_CEIL];
    size_t lens[ZMTP_MAX_PARTS_CEIL];
};

struct zmtp_sock;
struct zmtp_peer;

enum zmtp_event {
    ZMTP_EV_CONNECTED,    /* handshake with a peer completed */
    ZMTP_EV_DISCONNECTED, /* a peer went away (detail: why); connect sockets retry */
    ZMTP_EV_ERROR,        /* a peer broke the protocol or a limit, and was closed */
};

typedef void (*zmtp_msg_cb)(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m,
                            void *arg);
typedef void (*zmtp_event_cb)(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev,
                              const char *detail, void *arg);

struct zmtp_opts {
    size_t max_frame;         /* largest frame accepted (0 = 16 MiB) */
    size_t max_parts;         /* frames per message (0 = 16; at most ZMTP_MAX_PARTS_CEIL) */
    size_t max_msg;           /* bytes per message, all frames (0 = max_frame + 64 KiB) */
    size_t hwm;               /* messages queued per peer before dropping (0 = 1000) */
    size_t max_queue_bytes;   /* bytes queued per peer before dropping (0 = 64 MiB) */
    int reconnect_ms;         /* first reconnect delay (0 = 100) */
    int reconnect_max_ms;     /* backoff ceiling (0 = 5000) */
    int handshake_timeout_ms; /* greeting + READY must complete within (0 = 10000) */
    const char *identity;     /* ROUTER/DEALER Identity property (NULL = none) */
    const char *name;         /* for logs (NULL = "zmtp") */
};

struct zmtp_stats {
    uint64_t sent, received, dropped; /* messages */
    uint64_t connects, disconnects, errors;
    size_t peers; /* connected (handshake done) */
};

/* Bind: every type may bind (vLLM's PUB and ROUTER do). NULL on failure with errno
 * (EINVAL bad endpoint, EADDRINUSE, ...) and a log line. */
struct zmtp_sock *zmtp_bind(struct reactor *r, enum zmtp_type type, const char *endpoint,
                            const struct zmtp_opts *o, zmtp_msg_cb on_msg, zmtp_event_cb on_event,
                            void *arg);
/* Connect (with reconnection). NULL only for a malformed endpoint (errno EINVAL). */
struct zmtp_sock *zmtp_connect(struct reactor *r, enum zmtp_type type, const char *endpoint,
                               const struct zmtp_opts *o, zmtp_msg_cb on_msg,
                               zmtp_event_cb on_event, void *arg);
/* Close every connection and free the socket (deferred when called from one of its own
 * callbacks). Queued output is dropped (linger 0). NULL-safe. */
void zmtp_close(struct zmtp_sock *s);

/* Bound TCP port of a binding socket (0 otherwise). */
uint16_t zmtp_port(const struct zmtp_sock *s);
void zmtp_get_stats(const struct zmtp_sock *s, struct zmtp_stats *out);

/* SUB only: add/remove a topic prefix ("" = everything). 0, -EINVAL (not SUB),
 * -E2BIG (over 255 topics or a topic over 255 bytes). */
int zmtp_subscribe(struct zmtp_sock *s, const void *topic, size_t len);
int zmtp_unsubscribe(struct zmtp_sock *s, const void *topic, size_t len);

/* PUB: to every matching subscriber (returns 0 even if nobody matched). DEALER: to the
 * peer (-ENOTCONN when not connected). ROUTER: -EINVAL (use zmtp_send_to). -EINVAL for
 * an empty message or one over max_parts. */
int zmtp_send(struct zmtp_sock *s, const struct zmtp_msg *m);
/* To one peer (any type; the peer pointer is valid until its DISCONNECTED/ERROR event).
 * -EAGAIN when its queue is at the high-water mark (message dropped). */
int zmtp_send_to(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m);
/* The peer's address "ip:port" (for logs). */
const char *zmtp_peer_addr(const struct zmtp_peer *p);

/* ---- the wire parser, I/O-free (unit tests and fuzzers drive it directly) --------- */

enum zmtp_rx_stage { ZMTP_RX_GREETING, ZMTP_RX_READY, ZMTP_RX_OPEN, ZMTP_RX_FAILED };

struct zmtp_rx_cbs {
    /* The peer's READY: socket type name (not NUL-terminated) and identity. Return 0 to
     * accept, or -EPROTO after writing a reason into err. */
    int (*ready)(void *arg, const uint8_t *type, size_t type_len, const uint8_t *identity,
                 size_t id_len, char *err, size_t cap);
    /* A command after READY (name without its length byte). */
    void (*command)(void *arg, const uint8_t *name, size_t name_len, const uint8_t *body,
                    size_t body_len);
    /* A complete message. */
    void (*message)(void *arg, const struct zmtp_msg *m);
};

struct zmtp_rx {
    enum zmtp_rx_stage stage;
    uint8_t greeting[64];
    size_t greeting_len;
    int peer_minor; /* the peer's ZMTP minor version (0 or 1, capped) */
    size_t max_frame, max_parts, max_msg;
    /* the message being assembled */
    uint8_t *msg_buf;
    size_t msg_len, msg_cap;
    size_t part_off[ZMTP_MAX_PARTS_CEIL], part_len[ZMTP_MAX_PARTS_CEIL];
    size_t n_parts;
    /* the frame header being read (flags + up to 8 size bytes) and the body */
    uint8_t hdr[9];
    size_t hdr_len;
    bool in_body;
    uint8_t flags;
    uint64_t body_len, body_got;
    uint8_t *cmd_buf; /* command bodies (at most 64 KiB) */
    size_t cmd_cap;
    char err[160];
};

/* limits as in zmtp_opts (0 = defaults). */
void zmtp_rx_init(struct zmtp_rx *rx, size_t max_frame, size_t max_parts, size_t max_msg);
void zmtp_rx_release(struct zmtp_rx *rx);
/* Feed bytes; callbacks fire as items complete. 0, or -EPROTO (reason in rx->err; the
 * parser then refuses further input). */
int zmtp_rx_feed(struct zmtp_rx *rx, const void *data, size_t len, const struct zmtp_rx_cbs *cbs,
                 void *arg);

/* Encoders (append to a heap buffer of *len bytes, *cap allocated; abort on OOM). */
void zmtp_put_greeting(uint8_t out[64], bool as_server);
/* READY with Socket-Type (and Identity when not NULL). Returns bytes written into out
 * (which must hold 512 bytes). */
size_t zmtp_put_ready(uint8_t *out, const char *socket_type, const char *identity);
/* Frame header for a frame of len bytes: returns header bytes (2 or 9). */
size_t zmtp_put_frame_header(uint8_t out[9], size_t len, bool more, bool command);
const char *zmtp_type_name(enum zmtp_type t);

#endif
