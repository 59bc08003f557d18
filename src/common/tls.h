/* tls — TLS for the connection layer: OpenSSL 3 contexts (certificates, keys, trust,
 * revocation, versions, ciphers) and the TLS transport behind struct conn (conn.h).
 *
 * libssl is loaded on first use (dlopen through dynlib): linked, OpenSSL's relocations
 * cost every process ~1.9 MiB of RSS before main() (measured: libssl + libcrypto on
 * Debian 12), most of a node manager's budget, though most processes never use TLS.
 * tls_available() loads it; every other function requires it loaded (a context
 * cannot exist otherwise).
 *
 * Defaults (both directions): TLS 1.2 and 1.3 only; TLS 1.2 cipher list
 * TLS_DEFAULT_CIPHERS (ECDHE with AES-GCM or ChaCha20-Poly1305: forward secrecy,
 * AEAD only); TLS 1.3 suites OpenSSL's; no compression, no renegotiation, read-ahead
 * on, buffers released when idle. Server: session tickets on, client certificates
 * required and verified when a CA file is given, a CRL checked against the client's
 * certificate when given. Client: the server's certificate and name (DNS name, or the
 * IP address for an IP literal) are verified against the CA file, or the system's
 * store (OpenSSL's default paths, /etc/ssl/certs on Debian) when none is given.
 *
 * Threading: contexts may be shared by threads (reference-counted, immutable once
 * built); a TLS conn belongs to its reactor's thread. Loading is thread-safe. */
#ifndef MOTOR_TLS_H
#define MOTOR_TLS_H

#include "common/conn.h"

#include <stdbool.h>
#include <stddef.h>

#define TLS_DEFAULT_CIPHERS                                                                        \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"                                   \
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"                                   \
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

struct tls_config {
    const char *cert_file;    /* PEM certificate (chain); the server's, or the client's own */
    const char *key_file;     /* PEM private key, possibly encrypted */
    const char *key_password; /* for an encrypted key; NULL = none */
    const char *ca_file;      /* PEM trust anchors. Server: asks for and verifies client
                               * certificates (mutual TLS). Client: verifies the server
                               * (NULL = the system store) */
    const char *crl_file;     /* PEM CRL(s) of the peer's issuer: a revoked peer
                               * certificate fails the handshake (needs ca_file on a server) */
    const char *min_version;  /* "TLSv1.2" (default) or "TLSv1.3" */
    const char *ciphers;      /* TLS 1.2 cipher list (OpenSSL syntax); NULL = TLS_DEFAULT_CIPHERS */
    const char *ciphersuites; /* TLS 1.3 suites; NULL = OpenSSL's default */
    bool insecure;            /* client: no verification at all (tests only) */
};

struct tls_ctx;
struct tls_session; /* a resumable client session (OpenSSL SSL_SESSION) */

/* Load libssl once per process. 0, or -ENOTSUP with *why (static text) set when it
 * cannot be loaded (not installed, too old). */
int tls_available(const char **why);
/* True once loaded (never loads). */
bool tls_loaded(void);

/* Build a context. NULL on failure with errno (ENOENT / EACCES: a file cannot be read;
 * EINVAL: unusable material, a wrong password, a bad version or cipher list; ENOTSUP:
 * no libssl) and a one-line reason in err[cap]. The files are read now; the context
 * never looks at them again (rebuild it to pick up new files). */
struct tls_ctx *tls_ctx_new_server(const struct tls_config *cfg, char *err, size_t cap);
struct tls_ctx *tls_ctx_new_client(const struct tls_config *cfg, char *err, size_t cap);
/* Contexts are reference-counted; connections made from one keep it alive. */
struct tls_ctx *tls_ctx_ref(struct tls_ctx *ctx);
void tls_ctx_unref(struct tls_ctx *ctx); /* NULL-safe */
/* Does the server context verify client certificates? */
bool tls_ctx_verifies_peer(const struct tls_ctx *ctx);

/* Make c (initialized by the caller's fd) a TLS connection over the connected,
 * non-blocking socket fd, from ctx. Server side: the handshake waits for the peer's
 * ClientHello. Client side: host (a DNS name or an IP literal, no brackets) is checked
 * against the server's certificate unless the context is insecure, and sent as SNI
 * when it is a name; session (may be NULL) is offered for resumption. On failure
 * (-ENOMEM, -EINVAL) c is left plain on fd, so conn_close still closes it. */
int conn_init_tls_server(struct conn *c, int fd, struct tls_ctx *ctx);
int conn_init_tls_client(struct conn *c, int fd, struct tls_ctx *ctx, const char *host,
                         struct tls_session *session);

/* After a completed handshake and some traffic: the session to offer on the next
 * connection to the same server (a new reference; NULL when none is resumable yet). */
struct tls_session *conn_tls_session(struct conn *c);
/* Did this connection resume a session (abbreviated handshake)? */
bool conn_tls_resumed(const struct conn *c);
void tls_session_free(struct tls_session *s); /* NULL-safe */

/* Protocol and cipher of an established TLS connection ("TLSv1.3",
 * "TLS_AES_256_GCM_SHA384"); "" when not TLS / not established. */
const char *conn_tls_version(const struct conn *c);
const char *conn_tls_cipher(const struct conn *c);

#endif
