/* tls — see tls.h. The only file that touches OpenSSL. Its functions are reached
 * through a table filled by dynlib on first use; F(name) calls one, and macros of the
 * OpenSSL headers that hide a function (SSL_CTX_set_mode -> SSL_CTX_ctrl, ...) are
 * spelled out as the function they hide. */
#include "common/tls.h"

#include "common/dynlib.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define TLS_RECORD 16384 /* plaintext bytes per record (the protocol's maximum) */

/* ---- the library ------------------------------------------------------------------------- */

#define OSSL_FUNCS(X)                                                                              \
    X(OpenSSL_version_num)                                                                         \
    X(OPENSSL_init_ssl)                                                                            \
    X(TLS_server_method)                                                                           \
    X(TLS_client_method)                                                                           \
    X(SSL_CTX_new)                                                                                 \
    X(SSL_CTX_free)                                                                                \
    X(SSL_CTX_ctrl)                                                                                \
    X(SSL_CTX_set_options)                                                                         \
    X(SSL_CTX_set_cipher_list)                                                                     \
    X(SSL_CTX_set_ciphersuites)                                                                    \
    X(SSL_CTX_use_certificate_chain_file)                                                          \
    X(SSL_CTX_use_PrivateKey)                                                                      \
    X(SSL_CTX_check_private_key)                                                                   \
    X(SSL_CTX_load_verify_locations)                                                               \
    X(SSL_CTX_set_default_verify_paths)                                                            \
    X(SSL_CTX_set_verify)                                                                          \
    X(SSL_CTX_set_verify_depth)                                                                    \
    X(SSL_CTX_get_cert_store)                                                                      \
    X(SSL_load_client_CA_file)                                                                     \
    X(SSL_CTX_set_client_CA_list)                                                                  \
    X(SSL_CTX_set_session_id_context)                                                              \
    X(SSL_new)                                                                                     \
    X(SSL_free)                                                                                    \
    X(SSL_set_accept_state)                                                                        \
    X(SSL_set_connect_state)                                                                       \
    X(SSL_do_handshake)                                                                            \
    X(SSL_read_ex)                                                                                 \
    X(SSL_write_ex)                                                                                \
    X(SSL_get_error)                                                                               \
    X(SSL_shutdown)                                                                                \
    X(SSL_has_pending)                                                                             \
    X(SSL_ctrl)                                                                                    \
    X(SSL_set1_host)                                                                               \
    X(SSL_set_hostflags)                                                                           \
    X(SSL_get0_param)                                                                              \
    X(SSL_set_session)                                                                             \
    X(SSL_get1_session)                                                                            \
    X(SSL_session_reused)                                                                          \
    X(SSL_SESSION_free)                                                                            \
    X(SSL_SESSION_is_resumable)                                                                    \
    X(SSL_get_verify_result)                                                                       \
    X(SSL_get_version)                                                                             \
    X(SSL_get_current_cipher)                                                                      \
    X(SSL_CIPHER_get_name)                                                                         \
    X(ERR_get_error)                                                                               \
    X(ERR_peek_error)                                                                              \
    X(ERR_clear_error)                                                                             \
    X(ERR_reason_error_string)                                                                     \
    X(BIO_new_file)                                                                                \
    X(BIO_free)                                                                                    \
    X(PEM_read_bio_PrivateKey)                                                                     \
    X(PEM_read_bio_X509_CRL)                                                                       \
    X(EVP_PKEY_free)                                                                               \
    X(X509_CRL_free)                                                                               \
    X(X509_STORE_add_crl)                                                                          \
    X(X509_STORE_set_flags)                                                                        \
    X(X509_VERIFY_PARAM_set1_ip_asc)                                                               \
    X(X509_verify_cert_error_string)                                                               \
    X(BIO_get_new_index)                                                                           \
    X(BIO_meth_new)                                                                                \
    X(BIO_meth_set_write_ex)                                                                       \
    X(BIO_meth_set_read_ex)                                                                        \
    X(BIO_meth_set_ctrl)                                                                           \
    X(BIO_new)                                                                                     \
    X(BIO_set_data)                                                                                \
    X(BIO_get_data)                                                                                \
    X(BIO_set_init)                                                                                \
    X(BIO_set_flags)                                                                               \
    X(BIO_clear_flags)                                                                             \
    X(BIO_test_flags)                                                                              \
    X(SSL_set_bio)

#define OSSL_PTR(name) __typeof__(&name) name;
#define OSSL_NAME(name) #name,

/* Written once, under dynlib's pthread_once, before any reader can exist. */
static struct {
    OSSL_FUNCS(OSSL_PTR)
} ossl;
static const char *const ossl_symbols[] = {OSSL_FUNCS(OSSL_NAME)};
static const char *const ossl_sonames[] = {"libssl.so.3", NULL};
static struct dynlib ossl_lib =
    DYNLIB_INIT("libssl (OpenSSL 3)", ossl_sonames, ossl_symbols, &ossl);

#define F(name) (ossl.name)

/* ---- the socket BIO ---------------------------------------------------------------------- */

/* OpenSSL's own socket BIO writes with write(2): a peer gone raises SIGPIPE, which a
 * library must not inflict on its host. Ours sends with MSG_NOSIGNAL (and reads with
 * recv), and marks the end of stream so OpenSSL can tell a missing close_notify. */
static BIO_METHOD *sock_method; /* built once under sock_once, never freed */
static pthread_once_t sock_once = PTHREAD_ONCE_INIT;

static int sock_fd(BIO *b)
{
    return (int)(intptr_t)F(BIO_get_data)(b);
}

static int sock_write(BIO *b, const char *buf, size_t len, size_t *written)
{
    F(BIO_clear_flags)(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
    for (;;) {
        ssize_t w = send(sock_fd(b), buf, len, MSG_NOSIGNAL);
        if (w >= 0) {
            *written = (size_t)w;
            return 1;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            F(BIO_set_flags)(b, BIO_FLAGS_WRITE | BIO_FLAGS_SHOULD_RETRY);
        *written = 0;
        return 0; /* errno tells the rest (SSL_ERROR_SYSCALL) */
    }
}

static int sock_read(BIO *b, char *buf, size_t len, size_t *got)
{
    F(BIO_clear_flags)(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
    *got = 0;
    for (;;) {
        ssize_t r = recv(sock_fd(b), buf, len, 0);
        if (r > 0) {
            *got = (size_t)r;
            return 1;
        }
        if (r == 0) {
            F(BIO_set_flags)(b, BIO_FLAGS_IN_EOF);
            return 0;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            F(BIO_set_flags)(b, BIO_FLAGS_READ | BIO_FLAGS_SHOULD_RETRY);
        return 0;
    }
}

static long sock_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    switch (cmd) {
    case BIO_CTRL_FLUSH: /* nothing is buffered here */
        return 1;
    case BIO_CTRL_EOF:
        return F(BIO_test_flags)(b, BIO_FLAGS_IN_EOF) != 0;
    default:
        return 0;
    }
}

static void sock_method_make(void)
{
    BIO_METHOD *m = F(BIO_meth_new)(F(BIO_get_new_index)() | BIO_TYPE_SOURCE_SINK, "motor socket");
    if (m && F(BIO_meth_set_write_ex)(m, sock_write) == 1 &&
        F(BIO_meth_set_read_ex)(m, sock_read) == 1 && F(BIO_meth_set_ctrl)(m, sock_ctrl) == 1)
        sock_method = m;
    F(ERR_clear_error)();
}

int tls_available(const char **why)
{
    int rc = dynlib_load(&ossl_lib);
    if (rc != 0) {
        *why = dynlib_error(&ossl_lib);
        return -ENOTSUP;
    }
    /* Initialising is idempotent and thread-safe; it reads the system's openssl.cnf,
     * so the distribution's policy (its security level) applies. */
    if (F(OpenSSL_version_num)() < 0x30000000L) {
        *why = "libssl is older than OpenSSL 3";
        return -ENOTSUP;
    }
    if (F(OPENSSL_init_ssl)(OPENSSL_INIT_LOAD_SSL_STRINGS | OPENSSL_INIT_LOAD_CRYPTO_STRINGS,
                            NULL) != 1) {
        *why = "OpenSSL failed to initialise";
        return -ENOTSUP;
    }
    pthread_once(&sock_once, sock_method_make);
    if (!sock_method) {
        *why = "OpenSSL refused a socket BIO";
        return -ENOTSUP;
    }
    return 0;
}

bool tls_loaded(void)
{
    return dynlib_loaded(&ossl_lib);
}

/* The oldest error of the queue as text (later ones only elaborate), then the queue is
 * emptied so the next operation starts clean. */
static void take_errors(char *out, size_t cap, const char *fallback)
{
    unsigned long first = F(ERR_get_error)();
    while (F(ERR_get_error)() != 0)
        ;
    if (!cap)
        return;
    if (!first) {
        snprintf(out, cap, "%s", fallback);
        return;
    }
    const char *r = F(ERR_reason_error_string)(first);
    if (r)
        snprintf(out, cap, "%s", r);
    else
        snprintf(out, cap, "OpenSSL error %lx", first);
}

/* ---- contexts ---------------------------------------------------------------------------- */

struct tls_ctx {
    SSL_CTX *ssl;
    int refs;
    bool server;
    bool verify_peer; /* server: client certificates required */
    bool insecure;    /* client: no verification */
};

static int readable(const char *what, const char *path, char *err, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, cap, "cannot read %s %s: %s", what, path, strerror(e));
        return -e;
    }
    close(fd);
    return 0;
}

static int password_cb(char *buf, int size, int rwflag, void *u)
{
    const char *pw = u;
    if (!pw || size <= 0)
        return 0; /* no password: an encrypted key fails instead of prompting on a tty */
    size_t n = strlen(pw);
    if (n > (size_t)size)
        n = (size_t)size;
    memcpy(buf, pw, n);
    return (int)n;
}

static int load_key(SSL_CTX *ctx, const struct tls_config *cfg, char *err, size_t cap)
{
    const char *path = cfg->key_file && *cfg->key_file ? cfg->key_file : cfg->cert_file;
    int rc = readable("key", path, err, cap);
    if (rc != 0)
        return rc;
    BIO *b = F(BIO_new_file)(path, "r");
    if (!b) {
        take_errors(err, cap, "cannot open key");
        return -EINVAL;
    }
    EVP_PKEY *pk = F(PEM_read_bio_PrivateKey)(b, NULL, password_cb, (void *)cfg->key_password);
    F(BIO_free)(b);
    if (!pk) {
        char why[128];
        take_errors(why, sizeof(why), "no key found");
        snprintf(err, cap, "cannot load key %s: %s%s", path, why,
                 cfg->key_password ? " (wrong password?)" : " (encrypted without a password?)");
        return -EINVAL;
    }
    int ok = F(SSL_CTX_use_PrivateKey)(ctx, pk);
    F(EVP_PKEY_free)(pk);
    if (ok != 1 || F(SSL_CTX_check_private_key)(ctx) != 1) {
        char why[128];
        take_errors(why, sizeof(why), "key does not match");
        snprintf(err, cap, "key %s does not fit the certificate: %s", path, why);
        return -EINVAL;
    }
    return 0;
}

static int load_crl(SSL_CTX *ctx, const char *path, char *err, size_t cap)
{
    int rc = readable("CRL", path, err, cap);
    if (rc != 0)
        return rc;
    BIO *b = F(BIO_new_file)(path, "r");
    if (!b) {
        take_errors(err, cap, "cannot open CRL");
        return -EINVAL;
    }
    X509_STORE *store = F(SSL_CTX_get_cert_store)(ctx);
    int n = 0;
    X509_CRL *crl;
    while ((crl = F(PEM_read_bio_X509_CRL)(b, NULL, NULL, NULL)) != NULL) {
        int ok = F(X509_STORE_add_crl)(store, crl);
        F(X509_CRL_free)(crl);
        if (ok != 1) {
            F(BIO_free)(b);
            char why[128];
            take_errors(why, sizeof(why), "rejected");
            snprintf(err, cap, "cannot use CRL %s: %s", path, why);
            return -EINVAL;
        }
        n++;
    }
    F(BIO_free)(b);
    F(ERR_clear_error)(); /* the end of the file reads as "no start line" */
    if (n == 0) {
        snprintf(err, cap, "no CRL in %s", path);
        return -EINVAL;
    }
    /* The peer's certificate is checked against its issuer's CRL; a CA of the chain
     * without one is not (X509_V_FLAG_CRL_CHECK_ALL would demand a CRL for each). */
    F(X509_STORE_set_flags)(store, X509_V_FLAG_CRL_CHECK);
    return 0;
}

static int set_common(SSL_CTX *ctx, const struct tls_config *cfg, char *err, size_t cap)
{
    long min = TLS1_2_VERSION;
    const char *v = cfg->min_version;
    if (v && *v) {
        if (strcmp(v, "TLSv1.2") == 0 || strcmp(v, "1.2") == 0) {
            min = TLS1_2_VERSION;
        } else if (strcmp(v, "TLSv1.3") == 0 || strcmp(v, "1.3") == 0) {
            min = TLS1_3_VERSION;
        } else {
            snprintf(err, cap, "unsupported minimum TLS version \"%s\" (TLSv1.2 or TLSv1.3)", v);
            return -EINVAL;
        }
    }
    F(SSL_CTX_ctrl)(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, min, NULL);
    F(SSL_CTX_set_options)(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
    /* Partial writes: one record per SSL_write, so conn_writev can report progress;
     * moving buffer: a retried record may come from a compacted output buffer. */
    F(SSL_CTX_ctrl)
    (ctx, SSL_CTRL_MODE,
     SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS,
     NULL);
    /* Read whole socket buffers, not a record header then its body (two syscalls);
     * conn_read drains what OpenSSL buffered, so edge-triggered epoll loses nothing. */
    F(SSL_CTX_ctrl)(ctx, SSL_CTRL_SET_READ_AHEAD, 1, NULL);
    const char *ciphers = cfg->ciphers && *cfg->ciphers ? cfg->ciphers : TLS_DEFAULT_CIPHERS;
    if (F(SSL_CTX_set_cipher_list)(ctx, ciphers) != 1) {
        F(ERR_clear_error)();
        snprintf(err, cap, "no usable TLS 1.2 cipher in \"%s\"", ciphers);
        return -EINVAL;
    }
    if (cfg->ciphersuites && *cfg->ciphersuites &&
        F(SSL_CTX_set_ciphersuites)(ctx, cfg->ciphersuites) != 1) {
        F(ERR_clear_error)();
        snprintf(err, cap, "no usable TLS 1.3 cipher suite in \"%s\"", cfg->ciphersuites);
        return -EINVAL;
    }
    return 0;
}

static int load_ca(SSL_CTX *ctx, const char *ca, char *err, size_t cap)
{
    int rc = readable("CA file", ca, err, cap);
    if (rc != 0)
        return rc;
    if (F(SSL_CTX_load_verify_locations)(ctx, ca, NULL) != 1) {
        char why[128];
        take_errors(why, sizeof(why), "no certificate");
        snprintf(err, cap, "cannot load CA file %s: %s", ca, why);
        return -EINVAL;
    }
    return 0;
}

static struct tls_ctx *ctx_new(const struct tls_config *cfg, bool server, char *err, size_t cap)
{
    const char *why = "";
    if (err && cap)
        err[0] = '\0';
    char scratch[8];
    if (!err || !cap) {
        err = scratch;
        cap = sizeof(scratch);
    }
    if (tls_available(&why) != 0) {
        snprintf(err, cap, "%s", why);
        errno = ENOTSUP;
        return NULL;
    }
    F(ERR_clear_error)();
    SSL_CTX *ssl = F(SSL_CTX_new)(server ? F(TLS_server_method)() : F(TLS_client_method)());
    if (!ssl) {
        take_errors(err, cap, "cannot create a TLS context");
        errno = ENOMEM;
        return NULL;
    }
    struct tls_ctx *ctx = xcalloc(1, sizeof(*ctx));
    ctx->ssl = ssl;
    ctx->refs = 1;
    ctx->server = server;
    int rc = set_common(ssl, cfg, err, cap);
    bool has_cert = cfg->cert_file && *cfg->cert_file;
    if (rc == 0 && server && !has_cert) {
        snprintf(err, cap, "a TLS server needs a certificate and a key");
        rc = -EINVAL;
    }
    if (rc == 0 && has_cert) {
        rc = readable("certificate", cfg->cert_file, err, cap);
        if (rc == 0 && F(SSL_CTX_use_certificate_chain_file)(ssl, cfg->cert_file) != 1) {
            char w[128];
            take_errors(w, sizeof(w), "no certificate");
            snprintf(err, cap, "cannot load certificate %s: %s", cfg->cert_file, w);
            rc = -EINVAL;
        }
        if (rc == 0)
            rc = load_key(ssl, cfg, err, cap);
    }
    const char *ca = cfg->ca_file && *cfg->ca_file ? cfg->ca_file : NULL;
    bool has_crl = cfg->crl_file && *cfg->crl_file;
    if (rc == 0 && server) {
        /* Resumed sessions must carry this or OpenSSL refuses them once client
         * certificates are verified. */
        static const unsigned char sid[] = "motor-httpd";
        F(SSL_CTX_set_session_id_context)(ssl, sid, sizeof(sid) - 1);
        if (has_crl && !ca) {
            snprintf(err, cap, "a CRL needs a CA file (client certificates)");
            rc = -EINVAL;
        }
        if (rc == 0 && ca) {
            rc = load_ca(ssl, ca, err, cap);
            if (rc == 0) {
                /* Tell clients which issuers we accept (the CA file's subjects). */
                STACK_OF(X509_NAME) *names = F(SSL_load_client_CA_file)(ca);
                if (names)
                    F(SSL_CTX_set_client_CA_list)(ssl, names);
                F(ERR_clear_error)();
                F(SSL_CTX_set_verify)(ssl, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
                F(SSL_CTX_set_verify_depth)(ssl, 8);
                ctx->verify_peer = true;
            }
        }
    } else if (rc == 0) {
        ctx->insecure = cfg->insecure;
        if (cfg->insecure) {
            F(SSL_CTX_set_verify)(ssl, SSL_VERIFY_NONE, NULL);
        } else {
            if (ca) {
                rc = load_ca(ssl, ca, err, cap);
            } else if (F(SSL_CTX_set_default_verify_paths)(ssl) != 1) {
                take_errors(err, cap, "cannot load the system's trusted certificates");
                rc = -EINVAL;
            }
            F(SSL_CTX_set_verify)(ssl, SSL_VERIFY_PEER, NULL);
            F(SSL_CTX_set_verify_depth)(ssl, 8);
        }
        /* Sessions are kept by the caller (httpc's pools), not in the context. */
        F(SSL_CTX_ctrl)
        (ssl, SSL_CTRL_SET_SESS_CACHE_MODE,
         SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE, NULL);
    }
    if (rc == 0 && has_crl && !(!server && cfg->insecure))
        rc = load_crl(ssl, cfg->crl_file, err, cap);
    if (rc != 0) {
        F(ERR_clear_error)();
        tls_ctx_unref(ctx);
        errno = -rc;
        return NULL;
    }
    return ctx;
}

struct tls_ctx *tls_ctx_new_server(const struct tls_config *cfg, char *err, size_t cap)
{
    return ctx_new(cfg, true, err, cap);
}

struct tls_ctx *tls_ctx_new_client(const struct tls_config *cfg, char *err, size_t cap)
{
    return ctx_new(cfg, false, err, cap);
}

struct tls_ctx *tls_ctx_ref(struct tls_ctx *ctx)
{
    __atomic_add_fetch(&ctx->refs, 1, __ATOMIC_RELAXED);
    return ctx;
}

void tls_ctx_unref(struct tls_ctx *ctx)
{
    if (!ctx || __atomic_sub_fetch(&ctx->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    F(SSL_CTX_free)(ctx->ssl); /* SSL objects still alive hold their own reference */
    free(ctx);
}

bool tls_ctx_verifies_peer(const struct tls_ctx *ctx)
{
    return ctx && ctx->verify_peer;
}

/* ---- the transport ----------------------------------------------------------------------- */

struct conn_tls {
    SSL *ssl;
    struct tls_ctx *ctx;
    bool handshaken;
    bool fatal;   /* SSL_shutdown must not follow a fatal error */
    bool shut;    /* close_notify sent (or given up) */
    bool ended;   /* the read side reached its end: `end` is returned from now on */
    ssize_t end;  /* 0 (close_notify) or -errno */
    int hs_error; /* a failed handshake's result, returned again */
    size_t wpend; /* bytes of the record OpenSSL holds for a retried SSL_write */
    char *stage;  /* TLS_RECORD bytes: small pieces gathered into one record */
    char err[192];
};

/* What an OpenSSL failure means for us; the text goes to t->err. */
static ssize_t failure(struct conn *c, int sslerr, int sys_errno, const char *op)
{
    struct conn_tls *t = c->tls;
    if (sslerr == SSL_ERROR_ZERO_RETURN) {
        F(ERR_clear_error)();
        return 0; /* close_notify: a clean end */
    }
    t->fatal = true;
    unsigned long q = F(ERR_peek_error)();
    if (sslerr == SSL_ERROR_SYSCALL && !q) {
        F(ERR_clear_error)();
        if (sys_errno == 0 || sys_errno == EPIPE) {
            snprintf(t->err, sizeof(t->err), "peer closed the connection during %s", op);
            return -ECONNABORTED;
        }
        snprintf(t->err, sizeof(t->err), "%s failed: %s", op, strerror(sys_errno));
        return -sys_errno;
    }
    if (ERR_GET_LIB(q) == ERR_LIB_SSL && ERR_GET_REASON(q) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        F(ERR_clear_error)();
        snprintf(t->err, sizeof(t->err), "peer closed the connection without close_notify");
        return -ECONNABORTED;
    }
    bool http = ERR_GET_LIB(q) == ERR_LIB_SSL && ERR_GET_REASON(q) == SSL_R_HTTP_REQUEST;
    char why[128];
    take_errors(why, sizeof(why), "TLS error");
    long v = t->handshaken ? X509_V_OK : F(SSL_get_verify_result)(t->ssl);
    if (v != X509_V_OK)
        snprintf(t->err, sizeof(t->err), "%s: %s", why, F(X509_verify_cert_error_string)(v));
    else
        snprintf(t->err, sizeof(t->err), "%s", why);
    if (http) {
        snprintf(t->err, sizeof(t->err), "plain HTTP request on a TLS port");
        return -EBADMSG;
    }
    return -EPROTO;
}

static ssize_t tls_read(struct conn *c, void *buf, size_t cap)
{
    struct conn_tls *t = c->tls;
    if (t->ended)
        return t->end;
    size_t got = 0;
    while (got < cap) {
        size_t n = 0;
        errno = 0;
        F(ERR_clear_error)();
        if (F(SSL_read_ex)(t->ssl, (char *)buf + got, cap - got, &n) == 1) {
            got += n;
            c->rd_wants = 0;
            continue;
        }
        int se = errno; /* the socket's, for SSL_ERROR_SYSCALL */
        int e = F(SSL_get_error)(t->ssl, 0);
        if (e == SSL_ERROR_WANT_READ) {
            c->sock_rd = false;
            c->rd_wants = CONN_WANT_READ;
            break;
        }
        if (e == SSL_ERROR_WANT_WRITE) {
            c->sock_wr = false;
            c->rd_wants = CONN_WANT_WRITE;
            break;
        }
        t->end = failure(c, e, se, "read");
        t->ended = true;
        c->rd_wants = 0;
        c->sock_rd = true; /* ready: the next call reports the end at once */
        break;
    }
    if (got)
        return (ssize_t)got;
    return t->ended ? t->end : -EAGAIN;
}

/* Copy n bytes starting at iov[i] + off into the stage. */
static const char *gather(struct conn_tls *t, const struct iovec *iov, int iovcnt, int i,
                          size_t off, size_t n)
{
    if (!t->stage)
        t->stage = xmalloc(TLS_RECORD);
    size_t k = 0;
    for (; i < iovcnt && k < n; i++, off = 0) {
        size_t take = iov[i].iov_len - off;
        if (take > n - k)
            take = n - k;
        memcpy(t->stage + k, (const char *)iov[i].iov_base + off, take);
        k += take;
    }
    return t->stage;
}

static ssize_t tls_writev(struct conn *c, const struct iovec *iov, int iovcnt)
{
    struct conn_tls *t = c->tls;
    if (t->fatal)
        return -EPIPE;
    size_t total = 0;
    for (int k = 0; k < iovcnt; k++)
        total += iov[k].iov_len;
    if (total == 0)
        return 0;
    if (t->wpend > total)
        return -EINVAL; /* the caller broke the retry rule */
    size_t done = 0, off = 0;
    int i = 0;
    ssize_t rc = 0;
    while (done < total) {
        while (i < iovcnt && off == iov[i].iov_len) {
            i++;
            off = 0;
        }
        /* A retry resends the same record; else the next up to TLS_RECORD bytes, small
         * pieces (a head and a short body) gathered so they leave as one record. */
        size_t want = t->wpend ? t->wpend : total - done;
        if (want > TLS_RECORD)
            want = TLS_RECORD;
        size_t contig = iov[i].iov_len - off;
        const char *p = contig >= want ? (const char *)iov[i].iov_base + off
                                       : gather(t, iov, iovcnt, i, off, want);
        size_t w = 0;
        errno = 0;
        F(ERR_clear_error)();
        if (F(SSL_write_ex)(t->ssl, p, want, &w) == 1) {
            t->wpend = 0;
            done += w;
            for (size_t adv = w; adv > 0;) { /* move the cursor past what was taken */
                size_t room = iov[i].iov_len - off;
                if (adv < room) {
                    off += adv;
                    adv = 0;
                } else {
                    adv -= room;
                    i++;
                    off = 0;
                }
            }
            continue;
        }
        int se = errno;
        int e = F(SSL_get_error)(t->ssl, 0);
        if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
            t->wpend = want;
            if (e == SSL_ERROR_WANT_WRITE) {
                c->sock_wr = false;
                c->wr_wants = CONN_WANT_WRITE;
            } else {
                c->sock_rd = false;
                c->wr_wants = CONN_WANT_READ;
            }
            rc = -EAGAIN;
            break;
        }
        rc = failure(c, e, se, "write");
        if (rc == 0)
            rc = -EPIPE; /* close_notify while we write: the peer is gone */
        break;
    }
    if (done == total)
        c->wr_wants = 0;
    if (!t->wpend && t->stage) {
        free(t->stage); /* only a pending record needs it kept */
        t->stage = NULL;
    }
    return done ? (ssize_t)done : rc;
}

static int tls_handshake(struct conn *c)
{
    struct conn_tls *t = c->tls;
    if (t->handshaken)
        return 0;
    if (t->hs_error)
        return t->hs_error;
    errno = 0;
    F(ERR_clear_error)();
    int r = F(SSL_do_handshake)(t->ssl);
    if (r == 1) {
        t->handshaken = true;
        c->hs_wants = 0;
        return 0;
    }
    int se = errno;
    int e = F(SSL_get_error)(t->ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
        c->sock_rd = false;
        c->hs_wants = CONN_WANT_READ;
        return -EAGAIN;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        c->sock_wr = false;
        c->hs_wants = CONN_WANT_WRITE;
        return -EAGAIN;
    }
    ssize_t rc = failure(c, e, se, "handshake");
    if (rc == 0) {
        snprintf(t->err, sizeof(t->err), "peer closed the connection during handshake");
        rc = -ECONNABORTED;
    }
    t->fatal = true;
    t->hs_error = (int)rc;
    c->hs_wants = 0;
    return (int)rc;
}

static bool tls_handshake_done(const struct conn *c)
{
    return c->tls->handshaken;
}

static void tls_shutdown(struct conn *c)
{
    struct conn_tls *t = c->tls;
    if (t->handshaken && !t->fatal && !t->shut) {
        /* One close_notify, without waiting for the peer's: HTTP needs only ours to
         * show the response was not truncated. A full socket just loses it. */
        F(ERR_clear_error)();
        (void)F(SSL_shutdown)(t->ssl);
        F(ERR_clear_error)();
    }
    t->shut = true;
    (void)shutdown(c->fd, SHUT_WR);
}

static void tls_release(struct conn *c)
{
    struct conn_tls *t = c->tls;
    if (!t)
        return;
    F(SSL_free)(t->ssl);
    tls_ctx_unref(t->ctx);
    free(t->stage);
    free(t);
    c->tls = NULL;
}

static const char *tls_error(const struct conn *c)
{
    return c->tls ? c->tls->err : "";
}

static bool tls_pending(const struct conn *c)
{
    return c->tls && !c->tls->ended && c->tls->handshaken && F(SSL_has_pending)(c->tls->ssl) == 1;
}

static const struct conn_ops tls_ops = {
    .name = "tls",
    .read = tls_read,
    .writev = tls_writev,
    .handshake = tls_handshake,
    .handshake_done = tls_handshake_done,
    .shutdown = tls_shutdown,
    .release = tls_release,
    .error = tls_error,
    .pending = tls_pending,
};

static int init_tls(struct conn *c, int fd, struct tls_ctx *ctx)
{
    conn_init_plain(c, fd);
    if (!ctx)
        return -EINVAL;
    F(ERR_clear_error)();
    SSL *ssl = F(SSL_new)(ctx->ssl);
    if (!ssl) {
        F(ERR_clear_error)();
        return -ENOMEM;
    }
    BIO *bio = F(BIO_new)(sock_method);
    if (!bio) {
        F(ERR_clear_error)();
        F(SSL_free)(ssl);
        return -ENOMEM;
    }
    F(BIO_set_data)(bio, (void *)(intptr_t)fd);
    F(BIO_set_init)(bio, 1);
    F(SSL_set_bio)(ssl, bio, bio); /* one reference, owned by ssl */
    struct conn_tls *t = xcalloc(1, sizeof(*t));
    t->ssl = ssl;
    t->ctx = tls_ctx_ref(ctx);
    c->tls = t;
    c->ops = &tls_ops;
    return 0;
}

int conn_init_tls_server(struct conn *c, int fd, struct tls_ctx *ctx)
{
    int rc = init_tls(c, fd, ctx);
    if (rc == 0)
        F(SSL_set_accept_state)(c->tls->ssl);
    return rc;
}

int conn_init_tls_client(struct conn *c, int fd, struct tls_ctx *ctx, const char *host,
                         struct tls_session *session)
{
    int rc = init_tls(c, fd, ctx);
    if (rc != 0)
        return rc;
    SSL *ssl = c->tls->ssl;
    F(SSL_set_connect_state)(ssl);
    unsigned char addr[16];
    bool ip = host && (inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1);
    if (host && *host && !ctx->insecure) {
        int ok = ip ? F(X509_VERIFY_PARAM_set1_ip_asc)(F(SSL_get0_param)(ssl), host)
                    : F(SSL_set1_host)(ssl, host);
        if (ok != 1) {
            F(ERR_clear_error)();
            tls_release(c);
            c->ops = NULL;
            conn_init_plain(c, fd);
            return -EINVAL;
        }
        if (!ip)
            F(SSL_set_hostflags)(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    }
    if (host && *host && !ip) /* SNI carries names only (RFC 6066 §3) */
        F(SSL_ctrl)(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, (void *)host);
    if (session)
        F(SSL_set_session)(ssl, (SSL_SESSION *)session);
    F(ERR_clear_error)();
    return 0;
}

struct tls_session *conn_tls_session(struct conn *c)
{
    if (!c->tls || !c->tls->handshaken)
        return NULL;
    SSL_SESSION *s = F(SSL_get1_session)(c->tls->ssl);
    if (s && !F(SSL_SESSION_is_resumable)(s)) {
        F(SSL_SESSION_free)(s);
        return NULL;
    }
    return (struct tls_session *)s;
}

bool conn_tls_resumed(const struct conn *c)
{
    return c->tls && c->tls->handshaken && F(SSL_session_reused)(c->tls->ssl) == 1;
}

void tls_session_free(struct tls_session *s)
{
    if (s)
        F(SSL_SESSION_free)((SSL_SESSION *)s);
}

const char *conn_tls_version(const struct conn *c)
{
    return c->tls && c->tls->handshaken ? F(SSL_get_version)(c->tls->ssl) : "";
}

const char *conn_tls_cipher(const struct conn *c)
{
    if (!c->tls || !c->tls->handshaken)
        return "";
    const SSL_CIPHER *ci = F(SSL_get_current_cipher)(c->tls->ssl);
    return ci ? F(SSL_CIPHER_get_name)(ci) : "";
}
