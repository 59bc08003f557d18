/* store_etcd — etcd v3 through the 3.4 JSON gateway (grpc-gateway) over httpc.
 *
 * Gateway traps (STACK.md): keys and values are base64; 64-bit integers arrive as
 * strings (lease ids exceed 2^53, so they are sent as strings too); fields holding
 * zero/false are omitted from answers ("succeeded" is absent when a transaction's
 * compare failed, "TTL" is absent when a lease no longer exists). */
#include "controller/store_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define ETCD_MAX_RESPONSE (64u << 20)

struct etcd {
    struct httpc *hc;
    char **eps;
    size_t n_eps, cur;
    char *prefix;
    char *leader_key; /* absolute */
    int ttl_s;
    int64_t timeout_ms;
    struct httpc_tls tls;
    bool use_tls;
    char lease[32]; /* "" = none */
    int64_t last_ka_ok;
    struct reactor_timer ka_timer;
    struct httpc_req *campaign_req, *ka_req, *write_req, *load_req;
    struct store_op *write_op;
    store_load_cb load_cb;
    void *load_arg;
};

typedef void (*etcd_done)(struct store *st, json_t *body, const struct httpc_response *resp);

struct call {
    struct store *st;
    etcd_done done;
    struct httpc_req **slot;
};

static void call_done(const struct httpc_response *resp, void *arg)
{
    struct call *c = arg;
    struct store *st = c->st;
    struct etcd *e = st->impl;
    if (c->slot)
        *c->slot = NULL;
    json_t *body = NULL;
    if (resp->error == 0 && resp->status == 200)
        body = json_loadb(resp->body, resp->body_len, 0, NULL);
    if (resp->error != 0 && e->n_eps > 1)
        e->cur = (e->cur + 1) % e->n_eps; /* try the next member next time */
    etcd_done done = c->done;
    free(c);
    done(st, body, resp);
    json_decref(body);
}

static void post(struct store *st, const char *path, json_t *body, etcd_done done,
                 struct httpc_req **slot)
{
    struct etcd *e = st->impl;
    char *url = xasprintf("%s%s", e->eps[e->cur], path);
    char *text = json_dumps(body, JSON_COMPACT);
    struct call *c = xcalloc(1, sizeof(*c));
    c->st = st;
    c->done = done;
    c->slot = slot;
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = text,
        .timeout_ms = e->timeout_ms,
        .max_response = ETCD_MAX_RESPONSE,
        .tls = e->use_tls ? &e->tls : NULL,
    };
    struct httpc_req *req = httpc_request(e->hc, &o, call_done, c);
    if (slot)
        *slot = req;
    free(url);
    free(text);
    json_decref(body);
}

static json_t *b64(const char *s)
{
    char *enc = store_b64_encode(s, strlen(s));
    json_t *j = json_string(enc);
    free(enc);
    return j;
}

static const char *resp_err(json_t *body, const struct httpc_response *resp)
{
    if (resp->error)
        return resp->error_text && *resp->error_text ? resp->error_text : strerror(-resp->error);
    if (resp->status != 200)
        return resp->body && *resp->body ? resp->body : "unexpected HTTP status";
    if (!body)
        return "unparsable answer";
    return "unexpected answer";
}

/* ---- leadership ---------------------------------------------------------------------- */

static void ka_tick(struct reactor *r, void *arg);

static void lose(struct store *st, const char *why)
{
    struct etcd *e = st->impl;
    log_error("store_etcd_leadership_lost", LF_STR("reason", why), LF_STR("lease", e->lease));
    reactor_timer_stop(st->r, &e->ka_timer);
    e->lease[0] = '\0';
    store_set_leader(st, false, "");
}

static void ka_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    struct etcd *e = st->impl;
    if (!st->leader)
        return;
    json_t *res = json_object_get(body, "result");
    const char *ttl = json_string_value(json_object_get(res, "TTL"));
    if (body && res) {
        int64_t v = 0;
        if (!ttl || util_parse_i64(ttl, 1, INT64_MAX, &v) < 0) {
            lose(st, "lease expired");
            return;
        }
        e->last_ka_ok = util_mono_ms();
        return;
    }
    log_warn("store_etcd_keepalive_failed", LF_STR("error", resp_err(body, resp)));
    if (util_mono_ms() - e->last_ka_ok >= (int64_t)e->ttl_s * 1000)
        lose(st, "keepalive failing for a whole TTL");
}

static void ka_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct store *st = arg;
    struct etcd *e = st->impl;
    if (!st->leader || e->ka_req)
        return;
    if (util_mono_ms() - e->last_ka_ok >= (int64_t)e->ttl_s * 1000) {
        lose(st, "no keepalive answer for a whole TTL");
        return;
    }
    post(st, "/v3/lease/keepalive", json_pack("{s:s}", "ID", e->lease), ka_done, &e->ka_req);
}

static void revoke_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    (void)st;
    (void)body;
    (void)resp;
}

static void txn_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    struct etcd *e = st->impl;
    if (!body) {
        log_warn("store_etcd_campaign_failed", LF_STR("error", resp_err(body, resp)));
        e->lease[0] = '\0';
        store_campaign_retry(st, NULL);
        return;
    }
    if (json_is_true(json_object_get(body, "succeeded"))) {
        e->last_ka_ok = util_mono_ms();
        int64_t every = (int64_t)e->ttl_s * 1000 / 3;
        reactor_timer_start(st->r, &e->ka_timer, every, every > 100 ? every : 100);
        store_set_leader(st, true, st->owner);
        return;
    }
    /* Somebody else holds it: learn who, give our lease back, try again later. */
    char *decoded = store_etcd_txn_owner(body);
    const char *owner = decoded;
    post(st, "/v3/lease/revoke", json_pack("{s:s}", "ID", e->lease), revoke_done, NULL);
    e->lease[0] = '\0';
    store_campaign_retry(st, owner ? owner : "");
    free(decoded);
}

static void grant_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    struct etcd *e = st->impl;
    const char *id = json_string_value(json_object_get(body, "ID"));
    int64_t v;
    if (!id || util_parse_i64(id, 1, INT64_MAX, &v) < 0 || strlen(id) >= sizeof(e->lease)) {
        log_warn("store_etcd_lease_grant_failed", LF_STR("error", resp_err(body, resp)));
        store_campaign_retry(st, NULL);
        return;
    }
    snprintf(e->lease, sizeof(e->lease), "%s", id);
    json_t *cmp = json_pack("[{s:o, s:s, s:s, s:s}]", "key", b64(e->leader_key), "result", "EQUAL",
                            "target", "CREATE", "create_revision", "0");
    json_t *ok = json_pack("[{s:{s:o, s:o, s:s}}]", "request_put", "key", b64(e->leader_key),
                           "value", b64(st->owner), "lease", e->lease);
    json_t *ko = json_pack("[{s:{s:o}}]", "request_range", "key", b64(e->leader_key));
    post(st, "/v3/kv/txn",
         json_pack("{s:o, s:o, s:o}", "compare", cmp, "success", ok, "failure", ko), txn_done,
         &e->campaign_req);
}

static void et_campaign(struct store *st)
{
    struct etcd *e = st->impl;
    if (e->campaign_req)
        return;
    post(st, "/v3/lease/grant", json_pack("{s:i}", "TTL", e->ttl_s), grant_done, &e->campaign_req);
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
        char *key = k ? store_b64_decode(k, NULL) : NULL;
        char *val = v ? store_b64_decode(v, NULL) : xstrdup("");
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
    return v ? store_b64_decode(v, NULL) : NULL;
}

static void load_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    struct etcd *e = st->impl;
    store_load_cb cb = e->load_cb;
    e->load_cb = NULL;
    struct store_kv *out = NULL;
    size_t got = 0;
    if (!body || store_etcd_parse_range(body, e->prefix, e->leader_key, &out, &got) < 0) {
        log_error("store_etcd_load_failed", LF_STR("error", resp_err(body, resp)));
        if (cb)
            cb(st, -EIO, NULL, 0, e->load_arg);
        return;
    }
    if (cb)
        cb(st, 0, out, got, e->load_arg);
    store_kvs_free(out, got);
}

static void et_load(struct store *st, store_load_cb cb, void *arg)
{
    struct etcd *e = st->impl;
    e->load_cb = cb;
    e->load_arg = arg;
    /* range_end = the prefix with its last byte incremented: every key under it. */
    char *end = xstrdup(e->prefix);
    size_t n = strlen(end);
    end[n - 1] = (char)(end[n - 1] + 1);
    post(st, "/v3/kv/range", json_pack("{s:o, s:o}", "key", b64(e->prefix), "range_end", b64(end)),
         load_done, &e->load_req);
    free(end);
}

static void write_done(struct store *st, json_t *body, const struct httpc_response *resp)
{
    struct etcd *e = st->impl;
    struct store_op *op = e->write_op;
    e->write_op = NULL;
    if (!op)
        return;
    if (!body) {
        log_warn("store_etcd_write_failed", LF_STR("key", op->key),
                 LF_STR("error", resp_err(body, resp)));
        store_write_done(st, op, -EIO);
        return;
    }
    if (!json_is_true(json_object_get(body, "succeeded"))) {
        /* The leader key no longer holds our id: someone else leads now. */
        store_write_done(st, op, -EPERM);
        lose(st, "leader key changed hands");
        return;
    }
    store_write_done(st, op, 0);
}

static void et_write(struct store *st, struct store_op *op)
{
    struct etcd *e = st->impl;
    e->write_op = op;
    char *key = xasprintf("%s%s", e->prefix, op->key);
    json_t *cmp = json_pack("[{s:o, s:s, s:s, s:o}]", "key", b64(e->leader_key), "result", "EQUAL",
                            "target", "VALUE", "value", b64(st->owner));
    json_t *req;
    if (op->value)
        req = json_pack("{s:{s:o, s:o}}", "request_put", "key", b64(key), "value", b64(op->value));
    else
        req = json_pack("{s:{s:o}}", "request_delete_range", "key", b64(key));
    post(st, "/v3/kv/txn", json_pack("{s:o, s:[o]}", "compare", cmp, "success", req), write_done,
         &e->write_req);
    free(key);
}

static void et_free(struct store *st)
{
    struct etcd *e = st->impl;
    if (!e)
        return;
    reactor_timer_stop(st->r, &e->ka_timer);
    httpc_free(e->hc); /* aborts every request without callbacks */
    for (size_t i = 0; i < e->n_eps; i++)
        free(e->eps[i]);
    free(e->eps);
    free(e->prefix);
    free(e->leader_key);
    free((char *)e->tls.ca_file);
    free((char *)e->tls.cert_file);
    free((char *)e->tls.key_file);
    free((char *)e->tls.key_password);
    free(e);
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
    if (o->n_etcd_endpoints == 0 || !o->etcd_endpoints) {
        snprintf(err, cap, "etcd: no endpoint");
        return -EINVAL;
    }
    struct etcd *e = xcalloc(1, sizeof(*e));
    e->hc = httpc_new(st->r);
    if (!e->hc) {
        free(e);
        snprintf(err, cap, "etcd: cannot create the HTTP client");
        return -ENOMEM;
    }
    e->eps = xcalloc(o->n_etcd_endpoints, sizeof(char *));
    for (size_t i = 0; i < o->n_etcd_endpoints; i++) {
        /* Base URLs without a trailing slash: paths are appended. */
        size_t n = strlen(o->etcd_endpoints[i]);
        while (n > 0 && o->etcd_endpoints[i][n - 1] == '/')
            n--;
        e->eps[i] = xstrndup(o->etcd_endpoints[i], n);
        if (strncmp(e->eps[i], "https://", 8) == 0)
            e->use_tls = true;
    }
    e->n_eps = o->n_etcd_endpoints;
    const char *p = o->prefix && *o->prefix ? o->prefix : "/motor/controller/";
    size_t pl = strlen(p);
    e->prefix = p[pl - 1] == '/' ? xstrdup(p) : xasprintf("%s/", p);
    e->leader_key = xasprintf("%sleader", e->prefix);
    e->ttl_s = o->lease_ttl_s > 0 ? o->lease_ttl_s : 15;
    e->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
    if (o->tls) {
        e->tls.ca_file = xstrdup(o->tls->ca_file);
        e->tls.cert_file = xstrdup(o->tls->cert_file);
        e->tls.key_file = xstrdup(o->tls->key_file);
        e->tls.key_password = xstrdup(o->tls->key_password);
        e->tls.insecure = o->tls->insecure;
    }
    reactor_timer_init(&e->ka_timer, ka_tick, st);
    st->impl = e;
    st->ops = &et_ops;
    return 0;
}
