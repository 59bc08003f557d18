/* store — the controller's persistence: a small key/value interface with leader
 * election, and three backends.
 *
 *   sqlite  one file in WAL mode (table kv(key PRIMARY KEY, value)); leadership is an
 *           exclusive flock on "<path>.lock", so two controllers sharing a file (one
 *           host) elect one leader; the lock dies with its process.
 *   etcd    etcd v3 through its 3.4 JSON gateway (common/etcd.h: base64 keys and
 *           values, /v3/kv/range|deleterange|txn, /v3/lease/grant|keepalive|revoke). Keys
 *           live under `prefix`. Leadership: the shared lease lock (common/etcd.h) on
 *           "<prefix>leader" — a lease of lease_ttl_s seconds kept alive every ttl/3,
 *           and a transaction creating the key bound to it only if it does not exist.
 *           Every write is a transaction guarded by "the leader key still holds our
 *           owner id", so a deposed leader cannot overwrite its successor.
 *   memory  nothing persists (benchmarks, tests); always leader.
 *
 * Keys given to the interface are relative (e.g. "instances/3"); values are text.
 * Writes are asynchronous, applied in order, coalesced per key while queued (only the
 * latest value of a key is written), and retried every retry_ms while they fail. Loads
 * are asynchronous too (the etcd backend cannot block the loop).
 *
 * Threading: everything on the reactor thread that owns the store. */
#ifndef MOTOR_STORE_H
#define MOTOR_STORE_H

#include "common/httpc.h"
#include "common/reactor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum store_backend { STORE_SQLITE = 0, STORE_ETCD, STORE_MEMORY };

struct store;

struct store_kv {
    char *key; /* relative to the prefix */
    char *value;
};

struct store_opts {
    enum store_backend backend;
    const char *sqlite_path;           /* sqlite */
    const char *const *etcd_endpoints; /* etcd: base URLs, tried in turn on failure */
    size_t n_etcd_endpoints;
    const char *prefix;          /* etcd key prefix, e.g. "/motor/controller/" */
    int lease_ttl_s;             /* etcd leader lease */
    int64_t timeout_ms;          /* etcd request timeout */
    int64_t retry_ms;            /* campaign retry and write retry period */
    const char *owner;           /* this process's identity (leader key value) */
    const struct httpc_tls *tls; /* https:// etcd endpoints */
};

struct store_stats {
    uint64_t writes_ok;
    uint64_t writes_failed; /* attempts that failed (and were retried) */
    uint64_t loads;
};

/* Leadership changes: leader=true once this process holds the lock, false when a held
 * lock was lost (etcd lease expired or the leader key changed hands). */
typedef void (*store_leader_cb)(struct store *st, bool leader, void *arg);
/* A load finished: err 0 and the pairs (owned by the store, valid during the call), or
 * -errno. */
typedef void (*store_load_cb)(struct store *st, int err, const struct store_kv *kvs, size_t n,
                              void *arg);

/* NULL with a message in err on failure (sqlite: cannot open/initialize the file; etcd:
 * no endpoint). Strings in opts are copied. */
struct store *store_open(struct reactor *r, const struct store_opts *opts, char *err, size_t cap);
/* Stops timers and requests (queued writes are dropped: call store_flush first).
 * Releases the leadership (sqlite unlocks; etcd revokes nothing — the lease expires).
 * NULL-safe. */
void store_free(struct store *st);

const char *store_backend_name(enum store_backend b);
enum store_backend store_get_backend(const struct store *st);

/* Start campaigning; cb is called on every leadership change. sqlite/memory may call
 * it from a timer right away. */
void store_campaign(struct store *st, store_leader_cb cb, void *arg);
bool store_is_leader(const struct store *st);
/* Who holds the leadership as far as this process knows ("" when unknown). */
const char *store_leader_owner(const struct store *st);

/* Read every key (under the prefix). cb is always called later, from the loop. */
void store_load(struct store *st, store_load_cb cb, void *arg);

/* Queue a write (value copied) / a deletion. */
void store_put(struct store *st, const char *key, const char *value);
void store_del(struct store *st, const char *key);
/* Call cb once every write queued before this call has been applied (err 0), or with
 * -ECANCELED when the store is freed first. sqlite/memory: at once when nothing is
 * queued. Used to answer a client only when what it was told is durable. */
typedef void (*store_barrier_cb)(struct store *st, int err, void *arg);
void store_barrier(struct store *st, store_barrier_cb cb, void *arg);
/* Writes queued or in flight (barriers not counted). */
size_t store_pending(const struct store *st);
/* Run the reactor until no write is pending or timeout_ms passed. Only outside reactor
 * callbacks (e.g. after reactor_run returned, at shutdown). Returns the writes left. */
size_t store_flush(struct store *st, int64_t timeout_ms);

void store_get_stats(const struct store *st, struct store_stats *out);

#endif
