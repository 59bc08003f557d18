/* etcd — etcd v3 through its 3.4 JSON gateway (grpc-gateway) over httpc, and a lease
 * lock on it: what the controller's store (leader election, guarded writes) and the
 * coordinator's master/standby (coord_ha.c) both need.
 *
 * Gateway traps (STACK.md): keys and values are base64; 64-bit integers arrive as
 * strings (lease ids exceed 2^53, so they are sent as strings too); fields holding
 * zero/false are omitted from answers ("succeeded" is absent when a transaction's
 * compare failed, "TTL" is absent when a lease no longer exists).
 *
 * The client tries its endpoints in turn: a transport failure moves it to the next
 * member for the following request. Every answer is capped (ETCD_MAX_RESPONSE).
 *
 * The lock: a lease of ttl seconds and a transaction that creates the key, bound to the
 * lease, only when it does not exist. Holding it means renewing the lease (keepalive)
 * at least every renew period; the lock is lost when the lease expired (a keepalive
 * answer without TTL), when renewals failed max_failures times in a row, or when no
 * renewal succeeded for a whole TTL. The holder knows how long the lease surely lives:
 * etcd_lock_valid_until() is the send time of the last successful grant or renewal plus
 * the TTL (etcd counts from receipt, later), a fence a holder checks before acting as
 * one — a process frozen (SIGSTOP) past its lease sees, the moment it runs again, that
 * it no longer holds anything, before any timer could tell it.
 *
 * Threading: everything on the thread of the reactor given to etcd_new. */
#ifndef MOTOR_ETCD_H
#define MOTOR_ETCD_H

#include "common/httpc.h"
#include "common/reactor.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ETCD_MAX_RESPONSE (64u << 20)

struct etcd;
struct etcd_call;

struct etcd_opts {
    const char *const *endpoints; /* base URLs (http:// or https://), tried in turn */
    size_t n_endpoints;
    int64_t timeout_ms;          /* per request; 0 = 5 s */
    const struct httpc_tls *tls; /* for https:// endpoints (copied); NULL = system store */
};

/* NULL with a message in err when there is no endpoint or no HTTP client. */
struct etcd *etcd_new(struct reactor *r, const struct etcd_opts *o, char *err, size_t cap);
/* Aborts every request in flight without calling back. NULL-safe. */
void etcd_free(struct etcd *e);
/* Requests in flight. */
size_t etcd_active(const struct etcd *e);

/* An answer: body is the parsed 200 answer (borrowed for the call), or NULL with a
 * one-line error (transport error, HTTP status and body start, unparsable answer). */
typedef void (*etcd_cb)(void *arg, json_t *body, const char *error);
/* POST path ("/v3/kv/range", ...) with body (the reference is stolen). cb(arg) later,
 * exactly once, unless cancelled or the client is freed. */
struct etcd_call *etcd_post(struct etcd *e, const char *path, json_t *body, etcd_cb cb, void *arg);
/* Forget a call in flight: its callback will not run. NULL-safe. */
void etcd_cancel(struct etcd *e, struct etcd_call *call);

/* ---- request bodies and answers (pure) ------------------------------------------- */
/* Base64 (RFC 4648, padded). decode: NULL on malformed input; *out_len the length. */
char *etcd_b64_encode(const void *data, size_t len);
char *etcd_b64_decode(const char *s, size_t *out_len);
/* s as a base64 JSON string (new reference). */
json_t *etcd_b64(const char *s);
/* {"key": key} or, with prefix, every key starting with it (range_end). */
json_t *etcd_range_body(const char *key, bool prefix);
/* The first record of a range answer: its value (heap, NUL-terminated), mod_revision
 * and lease id ("" when none). 1 when found, 0 when the key is absent, -EIO when body is
 * not a range answer. out pointers may be NULL. */
int etcd_range_first(const json_t *body, char **value, int64_t *mod_revision, char *lease,
                     size_t lease_cap);
/* A transaction: compare (array, stolen), success and failure (arrays or NULL, stolen). */
json_t *etcd_txn_body(json_t *compare, json_t *success, json_t *failure);
/* Whether a txn answer says its compare held. */
bool etcd_txn_succeeded(const json_t *body);
/* Request ops for a transaction's success/failure lists (new references). lease may be
 * NULL. */
json_t *etcd_op_put(const char *key, const char *value, const char *lease);
json_t *etcd_op_delete(const char *key);
json_t *etcd_op_range(const char *key);

/* ---- the lock -------------------------------------------------------------------- */
struct etcd_lock;

enum etcd_lock_event {
    ETCD_LOCK_WON,     /* this process holds the lock now */
    ETCD_LOCK_BUSY,    /* an attempt found it held by someone else (etcd_lock_holder) */
    ETCD_LOCK_FAILED,  /* an attempt could not be made (etcd unreachable, bad answer) */
    ETCD_LOCK_LOST,    /* a held lock is gone (detail says why) */
    ETCD_LOCK_RENEWED, /* a renewal succeeded: etcd_lock_valid_until moved on */
};

struct etcd_lock_opts {
    const char *key;        /* absolute */
    const char *owner;      /* the key's value while we hold it (this process's identity) */
    int ttl_s;              /* the lease; >= 1 */
    int64_t renew_ms;       /* keepalive period; 0 = ttl/3 (at least 100 ms) */
    int max_failures;       /* renewals failing in a row that lose the lock; 0 = only the TTL */
    bool holder_ttl;        /* on BUSY, ask how long the holder's lease has left
                             * (etcd_lock_holder_ttl_ms): a standby can try right then */
    const char *log_prefix; /* event names: "<prefix>_keepalive_failed", ... */
};

typedef void (*etcd_lock_cb)(struct etcd_lock *l, enum etcd_lock_event ev, const char *detail,
                             void *arg);

/* The lock does not campaign by itself: the owner calls etcd_lock_try and decides when
 * to try again. Strings copied. */
struct etcd_lock *etcd_lock_new(struct etcd *e, struct reactor *r, const struct etcd_lock_opts *o,
                                etcd_lock_cb cb, void *arg);
/* One attempt (a no-op while one is in flight or the lock is held): WON, BUSY or FAILED
 * follows, from the loop. */
void etcd_lock_try(struct etcd_lock *l);
bool etcd_lock_held(const struct etcd_lock *l);
/* CLOCK_MONOTONIC ms until which the lease surely lives (0 when not held). */
int64_t etcd_lock_valid_until(const struct etcd_lock *l);
/* The holder as last seen ("" unknown); while held, our owner. */
const char *etcd_lock_holder(const struct etcd_lock *l);
/* After BUSY with holder_ttl: ms the holder's lease had left (-1 unknown or expired). */
int64_t etcd_lock_holder_ttl_ms(const struct etcd_lock *l);
/* The compare of a write guarded by the lock: the key still holds our owner (new
 * reference, an array for etcd_txn_body). */
json_t *etcd_lock_guard(const struct etcd_lock *l);
/* The owner learned the lock is gone (a guarded write failed its compare): LOST is
 * reported with why, the keepalive stops. No-op when not held. */
void etcd_lock_lost(struct etcd_lock *l, const char *why);
/* Give the lock back (revoke the lease: the key goes at once, a standby can take over
 * without waiting for the TTL). The request runs on; etcd_active tells when it is done.
 * No callback. No-op when not held. */
void etcd_lock_resign(struct etcd_lock *l);
/* NULL-safe. Nothing is revoked (the lease expires): resign first to hand over. */
void etcd_lock_free(struct etcd_lock *l);

#endif
