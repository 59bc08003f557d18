/* conn — the transport under Motor's one HTTP/1.1 stack: read, writev, handshake and
 * shutdown over a plain TCP socket or a TLS session (OpenSSL 3, see tls.h), behind one
 * set of functions (nginx's c->recv = ngx_ssl_recv, redis's ConnectionType, haproxy's
 * xprt_ops). httpd and httpc drive a struct conn from their reactor callbacks and never
 * know which transport is underneath except for logging.
 *
 * Readiness. The caller registers the fd with the reactor (edge- or level-triggered)
 * and hands every event to conn_on_events(). The conn remembers what the socket can do
 * and what each operation waits for, so conn_read_ready() / conn_write_ready() /
 * conn_handshake_ready() answer "may this call make progress without a new event?".
 * They matter for TLS under edge-triggered epoll: OpenSSL buffers whole records (and
 * reads ahead), so a read only stops being ready once OpenSSL asked for more socket
 * input; a read can need the socket writable (a TLS 1.3 key update to answer) and a
 * write readable. With edge-triggered epoll, callers must call an operation again while
 * it is ready; conn_read() itself drains OpenSSL until it asks for input or the buffer
 * is full.
 *
 * Threading: a conn belongs to the thread that runs its reactor. */
#ifndef MOTOR_CONN_H
#define MOTOR_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

struct conn;
struct conn_tls; /* tls.c's per-connection state */

struct conn_ops {
    const char *name; /* "tcp", "tls" */
    ssize_t (*read)(struct conn *c, void *buf, size_t cap);
    ssize_t (*writev)(struct conn *c, const struct iovec *iov, int iovcnt);
    int (*handshake)(struct conn *c);
    bool (*handshake_done)(const struct conn *c);
    void (*shutdown)(struct conn *c);
    void (*release)(struct conn *c);
    const char *(*error)(const struct conn *c);
    /* Bytes already inside the transport (TLS: records OpenSSL read ahead or decrypted
     * and not yet handed out), readable whatever the socket says. */
    bool (*pending)(const struct conn *c);
};

/* Caller storage (embedded in httpd's and httpc's connection objects). Fields are
 * read-only outside conn.c / tls.c. */
struct conn {
    int fd;
    const struct conn_ops *ops;
    struct conn_tls *tls;  /* NULL on a plain connection */
    bool sock_rd, sock_wr; /* the socket may read / write without blocking, as far as known */
    uint8_t rd_wants;      /* what a blocked read waits for: CONN_WANT_* */
    uint8_t wr_wants;      /* ... a blocked write */
    uint8_t hs_wants;      /* ... the handshake */
};

#define CONN_WANT_READ 1
#define CONN_WANT_WRITE 2

/* Take fd (a connected, non-blocking TCP socket) as a plain connection. It starts
 * ready both ways: a first attempt costs one EAGAIN at worst. */
void conn_init_plain(struct conn *c, int fd);

/* Read up to cap bytes. Returns > 0 bytes; 0 at a clean end of stream (a TCP FIN; for
 * TLS a close_notify); -EAGAIN when nothing more can come before the next event;
 * -ECONNABORTED when a TLS peer closed the TCP connection without close_notify (what
 * came before may be truncated: fine between messages, not for a body that runs to the
 * close); -EPROTO for a TLS protocol failure (conn_error() says what); or another
 * -errno from the socket (-ECONNRESET, ...). After 0 or an error, every later call
 * returns the same. A TLS read returning fewer than cap bytes drained OpenSSL. */
ssize_t conn_read(struct conn *c, void *buf, size_t cap);

/* Write from iov. Returns the bytes taken (> 0; for TLS encrypted and handed to the
 * kernel), -EAGAIN when none could be, or -EPIPE / -EPROTO / -errno. After -EAGAIN
 * (or a short write) the next call must start with the bytes not yet taken, unchanged
 * (they may sit at another address and be followed by more): TLS retries the record it
 * built (OpenSSL's rule, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER). */
ssize_t conn_writev(struct conn *c, const struct iovec *iov, int iovcnt);
ssize_t conn_write(struct conn *c, const void *buf, size_t len);

/* Drive the TLS handshake: 0 once complete (at once for a plain connection), -EAGAIN
 * while it waits for the peer, or -EPROTO (the reason in conn_error(): verification,
 * version, alerts), -EBADMSG (the peer spoke plain HTTP to a TLS port),
 * -ECONNABORTED (the peer closed mid-handshake), -errno. */
int conn_handshake(struct conn *c);
bool conn_handshake_done(const struct conn *c);

/* End our side gracefully: TLS sends close_notify (once, best effort: never waits for
 * the peer's), then the socket's write side is shut. Reading may go on. */
void conn_shutdown(struct conn *c);

/* Release everything and close the fd (no close_notify: use conn_shutdown first for a
 * graceful close). The conn must not be used afterwards. NULL-safe. */
void conn_close(struct conn *c);

/* Hand a reactor event mask (EPOLLIN / EPOLLOUT / EPOLLERR / EPOLLHUP) to the conn. */
void conn_on_events(struct conn *c, uint32_t events);

/* Will the operation make progress (or fail) without a new readiness event? */
bool conn_read_ready(const struct conn *c);
bool conn_write_ready(const struct conn *c);
bool conn_handshake_ready(const struct conn *c);
/* Does any pending operation need the socket to become writable? (Level-triggered
 * callers watch EPOLLOUT only then.) */
bool conn_wants_write(const struct conn *c);

/* Read and discard whatever the socket holds, bypassing TLS (a closing connection's
 * leftovers). Returns the bytes dropped, 0 at EOF, -EAGAIN, or -errno. */
ssize_t conn_discard(struct conn *c, size_t max);

/* Text of the last TLS failure on this connection ("" if none / plain). */
const char *conn_error(const struct conn *c);
/* "tcp" or "tls". */
const char *conn_kind(const struct conn *c);
bool conn_is_tls(const struct conn *c);

#endif
