/* tlsfix — TLS fixtures for the unit tests: throwaway certificates made by
 * tests/fixtures/mkcerts.sh (see the list there), and OpenSSL itself as the peer of the
 * code under test (raw TLS clients, scripted TLS servers), so that a fault our client
 * and our server share cannot hide behind a passing test.
 *
 * Header-only (every test file is its own program); needs MOTOR_SOURCE_DIR. */
#ifndef MOTOR_TEST_TLSFIX_H
#define MOTOR_TEST_TLSFIX_H

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char tlsfix_dir[64];

/* Make the certificates once per process. 0 or -1. */
static inline int tlsfix_make(void)
{
    if (tlsfix_dir[0])
        return 0;
    snprintf(tlsfix_dir, sizeof(tlsfix_dir), "/tmp/motor-tlsfix-XXXXXX");
    if (!mkdtemp(tlsfix_dir)) {
        tlsfix_dir[0] = '\0';
        return -1;
    }
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s/tests/fixtures/mkcerts.sh %s", MOTOR_SOURCE_DIR, tlsfix_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static inline void tlsfix_cleanup(void)
{
    if (!tlsfix_dir[0])
        return;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tlsfix_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tlsfix_dir);
    tlsfix_dir[0] = '\0';
}

/* Path of a fixture file; the result stays valid for the next 15 calls. */
static inline const char *tlsfix(const char *name)
{
    static char bufs[16][128];
    static unsigned next;
    char *b = bufs[next++ % 16];
    snprintf(b, sizeof(bufs[0]), "%s/%s", tlsfix_dir, name);
    return b;
}

/* A server context (crt/key; verify_ca: require client certificates from that CA). */
static inline SSL_CTX *tlsfix_server_ctx(const char *crt, const char *key, const char *verify_ca)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx || SSL_CTX_use_certificate_chain_file(ctx, crt) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1)
        abort();
    if (verify_ca) {
        if (SSL_CTX_load_verify_locations(ctx, verify_ca, NULL) != 1)
            abort();
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    static const unsigned char sid[] = "tlsfix";
    SSL_CTX_set_session_id_context(ctx, sid, sizeof(sid) - 1);
    return ctx;
}

/* A client context verifying against ca (NULL: no verification), with an optional
 * client certificate. */
static inline SSL_CTX *tlsfix_client_ctx(const char *ca, const char *crt, const char *key)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx)
        abort();
    if (ca) {
        if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
            abort();
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    }
    if (crt && (SSL_CTX_use_certificate_chain_file(ctx, crt) != 1 ||
                SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1))
        abort();
    return ctx;
}

/* A blocking connection of a scripted server: plain, or TLS when ssl is set. */
struct tio {
    int fd;
    SSL *ssl;
};

/* Take an accepted socket; with ctx, shake hands (blocking). 0, or -1 (closed). */
static inline int tio_accept(struct tio *t, int fd, SSL_CTX *ctx)
{
    t->fd = fd;
    t->ssl = NULL;
    if (!ctx)
        return 0;
    t->ssl = SSL_new(ctx);
    SSL_set_fd(t->ssl, fd);
    if (SSL_accept(t->ssl) != 1) {
        ERR_clear_error();
        SSL_free(t->ssl);
        t->ssl = NULL;
        return -1;
    }
    return 0;
}

static inline ssize_t tio_send(struct tio *t, const void *p, size_t n)
{
    if (!t->ssl)
        return send(t->fd, p, n, MSG_NOSIGNAL);
    size_t w = 0;
    if (SSL_write_ex(t->ssl, p, n, &w) != 1) {
        ERR_clear_error();
        return -1;
    }
    return (ssize_t)w;
}

static inline int tio_send_all(struct tio *t, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = tio_send(t, c, n);
        if (w < 0 && errno == EINTR && !t->ssl)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* > 0 bytes, 0 at the end (or a failure: the scripted servers just stop). */
static inline ssize_t tio_recv(struct tio *t, void *p, size_t n)
{
    if (!t->ssl) {
        ssize_t r;
        do
            r = recv(t->fd, p, n, 0);
        while (r < 0 && errno == EINTR);
        return r < 0 ? 0 : r;
    }
    size_t got = 0;
    if (SSL_read_ex(t->ssl, p, n, &got) != 1) {
        ERR_clear_error();
        return 0;
    }
    return (ssize_t)got;
}

/* Decrypted bytes already waiting (a poll on the socket would not see them). */
static inline bool tio_pending(struct tio *t)
{
    return t->ssl && SSL_pending(t->ssl) > 0;
}

/* End the connection: close_notify first when notify (a clean TLS end), then the socket
 * is shut both ways (the fd itself is the caller's). */
static inline void tio_end(struct tio *t, bool notify)
{
    if (t->ssl) {
        if (notify)
            (void)SSL_shutdown(t->ssl);
        ERR_clear_error();
        SSL_free(t->ssl);
        t->ssl = NULL;
    }
    shutdown(t->fd, SHUT_RDWR);
}

/* ---- a non-blocking client whose server runs on this thread --------------------------- */

/* Shake hands over fd (connected or connecting, non-blocking); pump(arg) runs the
 * server's loop once between attempts. The session, or NULL when it failed or ms
 * passed. host: checked against the server's certificate (NULL: not checked). */
static inline SSL *tlsfix_handshake(SSL_CTX *ctx, int fd, const char *host, void (*pump)(void *),
                                    void *arg, int ms)
{
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    if (host)
        SSL_set1_host(ssl, host);
    for (int waited = 0;; waited++) {
        int rc = SSL_connect(ssl);
        if (rc == 1)
            return ssl;
        int e = SSL_get_error(ssl, rc);
        ERR_clear_error();
        if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE &&
             !(e == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == ENOTCONN))) ||
            waited > ms) {
            SSL_free(ssl);
            return NULL;
        }
        pump(arg); /* about a millisecond or more */
    }
}

/* As recv(2) with MSG_DONTWAIT: > 0, 0 at the end (close_notify, or a FIN without it),
 * -1 with errno EAGAIN or ECONNRESET (any other failure). */
static inline ssize_t tlsfix_read(SSL *ssl, void *p, size_t n)
{
    size_t got = 0;
    errno = 0;
    if (SSL_read_ex(ssl, p, n, &got) == 1)
        return (ssize_t)got;
    int e = SSL_get_error(ssl, 0);
    unsigned long q = ERR_peek_error();
    ERR_clear_error();
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN ||
        (e == SSL_ERROR_SSL && ERR_GET_REASON(q) == SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
        (e == SSL_ERROR_SYSCALL && errno == 0))
        return 0;
    errno = ECONNRESET;
    return -1;
}

/* As send(2) with MSG_NOSIGNAL on a non-blocking fd: > 0, or -1 with errno EAGAIN/EPIPE. */
static inline ssize_t tlsfix_write(SSL *ssl, const void *p, size_t n)
{
    size_t w = 0;
    if (SSL_write_ex(ssl, p, n, &w) == 1)
        return (ssize_t)w;
    int e = SSL_get_error(ssl, 0);
    ERR_clear_error();
    errno = e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? EAGAIN : EPIPE;
    return -1;
}

#endif
