/* store_etcd — the controller's store on etcd v3: its records under a prefix, leadership
 * through the shared lease lock and every write guarded by it (common/etcd.h, which the
 * coordinator's master/standby uses too). */
#include "controller/store_internal.h"

#include "common/etcd.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

struct etcd_store {
    struct etcd *e;
    struct etcd_lock *lock;
    char *prefix;
    char *leader_key; /* absolute */
    struct etcd_call *write_call, *load_call;
    struct store_op *write_op;
    store_load_cb load_cb;
    void *load_arg;
};

/* ---- leadership ---------------------------------------------------------------------- */

static void on_lock(struct etcd_lock *l, enum etcd_lock_event ev, const char *detail, void *arg)
{
    (void)l;
    struct store *st = arg;
    switch (ev) {
    case ETCD_LOCK_WON:
        store_set_leader(st, true, st->owner);
        break;
    case ETCD_LOCK_BUSY:
        store_campaign_retry(st, detail ? detail : "");
        break;
    case ETCD_LOCK_FAILED:
        store_campaign_retry(st, NULL);
        break;
    case ETCD_LOCK_LOST:
        store_set_leader(st, false, "");
        break;
    case ETCD_LOCK_RENEWED:
        break;
    }
}

static void et_campaign(struct store *st)
{
    struct etcd_store *s = st->impl;
    etcd_lock_try(s->lock);
}

/* ---- data ------------------------------------------------------------------------------ */

int store_etcd_parse_range(const json_t *body, const char *prefix, const char *leader_key,
                           struct store_kv **out_kvs, size_t *out_n)
{
    json_t *kvs = json_object_get(body, "kvs");
    *out_kvs = NULL;
    *out_n = 0;
    if (!json_is_object(body) || (kvs && !json_is_array(kvs)))
        return -EIO;
    size_t n = json_array_size(kvs), got = 0;
    struct store_kv *out = xcalloc(n + 1, sizeof(*out));
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < n; i++) {
        json_t *kv = json_array_get(kvs, i);
        const char *k = json_string_value(json_object_get(kv, "key"));
        const char *v = json_string_value(json_object_get(kv, "value"));
        char *key = k ? etcd_b64_decode(k, NULL) : NULL;
        char *val = v ? etcd_b64_decode(v, NULL) : xstrdup("");
        if (!key || !val || strncmp(key, prefix, plen) != 0 || strcmp(key, leader_key) == 0) {
            free(key);
            free(val);
            continue;
        }
        out[got].key = xstrdup(key + plen);
        out[got].value = val;
        got++;
        free(key);
    }
    *out_kvs = out;
    *out_n = got;
    return 0;
}

void store_kvs_free(struct store_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

char *store_etcd_txn_owner(const json_t *body)
{
    json_t *rs = json_object_get(body, "responses");
    json_t *rr = json_object_get(json_array_get(rs, 0), "response_range");
    json_t *kv = json_array_get(json_object_get(rr, "kvs"), 0);
    const char *v = json_string_value(json_object_get(kv, "value"));
    return v ? etcd_b64_decode(v, NULL) : NULL;
}

static void load_done(void *arg, json_t *body, const char *error)
{
    struct store *st = arg;
    struct etcd_store *s = st->impl;
    s->load_call = NULL;
    store_load_cb cb = s->load_cb;
    s->load_cb = NULL;
    struct store_kv *out = NULL;
    size_t got = 0;
    if (!body || store_etcd_parse_range(body, s->prefix, s->leader_key, &out, &got) < 0) {
        log_error("store_etcd_load_failed", LF_STR("error", error ? error : "unexpected answer"));
        if (cb)
            cb(st, -EIO, NULL, 0, s->load_arg);
        return;
    }
    if (cb)
        cb(st, 0, out, got, s->load_arg);
    store_kvs_free(out, got);
}

static void et_load(struct store *st, store_load_cb cb, void *arg)
{
    struct etcd_store *s = st->impl;
    s->load_cb = cb;
    s->load_arg = arg;
    s->load_call = etcd_post(s->e, "/v3/kv/range", etcd_range_body(s->prefix, true), load_done, st);
}

static void write_done(void *arg, json_t *body, const char *error)
{
    struct store *st = arg;
    struct etcd_store *s = st->impl;
    s->write_call = NULL;
    struct store_op *op = s->write_op;
    s->write_op = NULL;
    if (!op)
        return;
    if (!body) {
        log_warn("store_etcd_write_failed", LF_STR("key", op->key), LF_STR("error", error));
        store_write_done(st, op, -EIO);
        return;
    }
    if (!etcd_txn_succeeded(body)) {
        /* The leader key no longer holds our id: someone else leads now. */
        store_write_done(st, op, -EPERM);
        etcd_lock_lost(s->lock, "leader key changed hands");
        return;
    }
    store_write_done(st, op, 0);
}

static void et_write(struct store *st, struct store_op *op)
{
    struct etcd_store *s = st->impl;
    s->write_op = op;
    char *key = xasprintf("%s%s", s->prefix, op->key);
    json_t *req = op->value ? etcd_op_put(key, op->value, NULL) : etcd_op_delete(key);
    s->write_call = etcd_post(s->e, "/v3/kv/txn",
                              etcd_txn_body(etcd_lock_guard(s->lock), json_pack("[o]", req), NULL),
                              write_done, st);
    free(key);
}

static void et_free(struct store *st)
{
    struct etcd_store *s = st->impl;
    if (!s)
        return;
    /* The lock first (it cancels its own calls), then the client (aborts the rest). */
    etcd_lock_free(s->lock);
    etcd_free(s->e);
    free(s->prefix);
    free(s->leader_key);
    free(s);
    st->impl = NULL;
}

static const struct store_backend_ops et_ops = {
    .campaign = et_campaign,
    .load = et_load,
    .write = et_write,
    .free = et_free,
};

int store_etcd_open(struct store *st, const struct store_opts *o, char *err, size_t cap)
{
    struct etcd_opts eo = {
        .endpoints = o->etcd_endpoints,
        .n_endpoints = o->n_etcd_endpoints,
        .timeout_ms = o->timeout_ms,
        .tls = o->tls,
    };
    struct etcd *e = etcd_new(st->r, &eo, err, cap);
    if (!e)
        return -EINVAL;
    struct etcd_store *s = xcalloc(1, sizeof(*s));
    s->e = e;
    const char *p = o->prefix && *o->prefix ? o->prefix : "/motor/controller/";
    size_t pl = strlen(p);
    s->prefix = p[pl - 1] == '/' ? xstrdup(p) : xasprintf("%s/", p);
    s->leader_key = xasprintf("%sleader", s->prefix);
    struct etcd_lock_opts lo = {
        .key = s->leader_key,
        .owner = st->owner,
        .ttl_s = o->lease_ttl_s > 0 ? o->lease_ttl_s : 15,
        .log_prefix = "store_etcd",
    };
    s->lock = etcd_lock_new(e, st->r, &lo, on_lock, st);
    st->impl = s;
    st->ops = &et_ops;
    return 0;
}
