/* conn — see conn.h. This file is the dispatch and the plain TCP transport; the TLS
 * transport is in tls.c (it alone touches OpenSSL). */
#include "common/conn.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- plain TCP ----------------------------------------------------------------------------- */

static ssize_t plain_read(struct conn *c, void *buf, size_t cap)
{
    for (;;) {
        ssize_t r = recv(c->fd, buf, cap, 0);
        if (r > 0) {
            /* A stream socket returns less than asked only when that was all it had:
             * the next arrival raises a new edge, no need to find EAGAIN first. */
            if ((size_t)r < cap)
                c->sock_rd = false;
            return r;
        }
        if (r == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->sock_rd = false;
            return -EAGAIN;
        }
        return -errno;
    }
}

static ssize_t plain_writev(struct conn *c, const struct iovec *iov, int iovcnt)
{
    size_t total = 0;
    for (int i = 0; i < iovcnt; i++)
        total += iov[i].iov_len;
    struct msghdr mh = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)iovcnt};
    for (;;) {
        ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (w >= 0) {
            if ((size_t)w < total) {
                c->sock_wr = false; /* the send buffer is full: wait for EPOLLOUT */
                c->wr_wants = CONN_WANT_WRITE;
            } else {
                c->wr_wants = 0;
            }
            return w;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            c->sock_wr = false;
            c->wr_wants = CONN_WANT_WRITE;
            return -EAGAIN;
        }
        return -errno;
    }
}

static int plain_handshake(struct conn *c)
{
    return 0;
}

static bool plain_handshake_done(const struct conn *c)
{
    return true;
}

static void plain_shutdown(struct conn *c)
{
    (void)shutdown(c->fd, SHUT_WR);
}

static void plain_release(struct conn *c)
{
}

static const char *plain_error(const struct conn *c)
{
    return "";
}

static bool plain_pending(const struct conn *c)
{
    return false;
}

static const struct conn_ops plain_ops = {
    .name = "tcp",
    .read = plain_read,
    .writev = plain_writev,
    .handshake = plain_handshake,
    .handshake_done = plain_handshake_done,
    .shutdown = plain_shutdown,
    .release = plain_release,
    .error = plain_error,
    .pending = plain_pending,
};

void conn_init_plain(struct conn *c, int fd)
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->ops = &plain_ops;
    c->sock_rd = c->sock_wr = true;
}

/* ---- dispatch ------------------------------------------------------------------------------ */

ssize_t conn_read(struct conn *c, void *buf, size_t cap)
{
    if (cap == 0)
        return -ENOBUFS;
    return c->ops->read(c, buf, cap);
}

ssize_t conn_writev(struct conn *c, const struct iovec *iov, int iovcnt)
{
    return c->ops->writev(c, iov, iovcnt);
}

ssize_t conn_write(struct conn *c, const void *buf, size_t len)
{
    struct iovec iov = {(void *)buf, len};
    return c->ops->writev(c, &iov, 1);
}

int conn_handshake(struct conn *c)
{
    return c->ops->handshake(c);
}

bool conn_handshake_done(const struct conn *c)
{
    return c->ops->handshake_done(c);
}

void conn_shutdown(struct conn *c)
{
    c->ops->shutdown(c);
}

void conn_close(struct conn *c)
{
    if (!c || !c->ops)
        return;
    c->ops->release(c);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->ops = NULL;
}

void conn_on_events(struct conn *c, uint32_t events)
{
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLERR | EPOLLHUP))
        c->sock_rd = true;
    if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
        c->sock_wr = true;
}

static bool can(const struct conn *c, uint8_t wants, bool dflt)
{
    switch (wants) {
    case CONN_WANT_READ:
        return c->sock_rd;
    case CONN_WANT_WRITE:
        return c->sock_wr;
    default:
        return dflt;
    }
}

bool conn_read_ready(const struct conn *c)
{
    /* SSL_has_pending: a read that stopped (the caller's buffer full, or a write that
     * wanted input meanwhile) may have left records inside OpenSSL no event announces */
    return can(c, c->rd_wants, c->sock_rd) || c->ops->pending(c);
}

bool conn_write_ready(const struct conn *c)
{
    return can(c, c->wr_wants, c->sock_wr);
}

bool conn_handshake_ready(const struct conn *c)
{
    return can(c, c->hs_wants, c->sock_rd);
}

bool conn_wants_write(const struct conn *c)
{
    return c->rd_wants == CONN_WANT_WRITE || c->wr_wants == CONN_WANT_WRITE ||
           c->hs_wants == CONN_WANT_WRITE;
}

ssize_t conn_discard(struct conn *c, size_t max)
{
    char buf[16384];
    size_t got = 0;
    while (got < max) {
        size_t want = max - got < sizeof(buf) ? max - got : sizeof(buf);
        ssize_t r = recv(c->fd, buf, want, 0);
        if (r > 0) {
            got += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            c->sock_rd = false;
            return got ? (ssize_t)got : -EAGAIN;
        }
        if (got)
            return (ssize_t)got; /* the EOF or error shows on the next call */
        return r == 0 ? 0 : -errno;
    }
    return (ssize_t)got;
}

const char *conn_error(const struct conn *c)
{
    return c->ops ? c->ops->error(c) : "";
}

const char *conn_kind(const struct conn *c)
{
    return c->ops ? c->ops->name : "";
}

bool conn_is_tls(const struct conn *c)
{
    return c->tls != NULL;
}
