/* store_internal — the pieces shared by store.c (queue, dispatch) and the backends. */
#ifndef MOTOR_STORE_INTERNAL_H
#define MOTOR_STORE_INTERNAL_H

#include "controller/store.h"

#include <jansson.h>

struct store_op {
    struct store_op *next;
    char *key;   /* NULL = a barrier */
    char *value; /* NULL = delete */
    bool inflight;
    store_barrier_cb barrier_cb;
    void *barrier_arg;
};

struct store_backend_ops {
    /* Try to become leader once; report through store_set_leader / store_campaign_failed. */
    void (*campaign)(struct store *st);
    void (*load)(struct store *st, store_load_cb cb, void *arg);
    /* Apply op; report through store_write_done (may be called synchronously). */
    void (*write)(struct store *st, struct store_op *op);
    void (*free)(struct store *st);
};

struct store {
    struct reactor *r;
    enum store_backend backend;
    const struct store_backend_ops *ops;
    void *impl;
    char *owner;
    char *leader_owner;
    int64_t retry_ms;
    bool leader;
    bool campaigning;
    store_leader_cb leader_cb;
    void *leader_arg;
    struct reactor_timer campaign_timer;
    struct reactor_timer retry_timer;
    struct store_op *head, *tail;
    size_t n_ops;
    bool pumping;
    struct store_stats stats;
};

/* Backend constructors: 0 or -errno with a message in err. */
int store_sqlite_open(struct store *st, const struct store_opts *o, char *err, size_t cap);
int store_etcd_open(struct store *st, const struct store_opts *o, char *err, size_t cap);
int store_memory_open(struct store *st, const struct store_opts *o, char *err, size_t cap);

/* etcd reply parsing, pure (unit tests and tests/fuzz/fuzz_etcd_reply.c drive it).
 * A /v3/kv/range answer: the records under prefix, prefix stripped, the leader key
 * skipped, undecodable entries skipped. 0 with a fresh array (free with
 * store_kvs_free), or -EIO when the body is not a range answer. */
int store_etcd_parse_range(const json_t *body, const char *prefix, const char *leader_key,
                           struct store_kv **out_kvs, size_t *out_n);
void store_kvs_free(struct store_kv *kvs, size_t n);
/* The current leader's owner string from a failed campaign txn answer; NULL when absent
 * or undecodable. Caller frees. */
char *store_etcd_txn_owner(const json_t *body);

/* Backends report: */
void store_set_leader(struct store *st, bool leader, const char *owner);
/* A campaign attempt did not win: retry after retry_ms. */
void store_campaign_retry(struct store *st, const char *current_owner);
void store_write_done(struct store *st, struct store_op *op, int err);

#endif
