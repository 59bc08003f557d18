/* etcd — the JSON gateway client and the lease lock (see etcd.h). */
#include "common/etcd.h"

#include "common/list.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the client ----------------------------------------------------------------------- */

struct etcd {
    struct reactor *r;
    struct httpc *hc;
    char **eps;
    size_t n_eps, cur;
    int64_t timeout_ms;
    struct httpc_tls tls;
    bool use_tls;
    struct list_head calls; /* struct etcd_call in flight */
    size_t n_calls;
};

struct etcd_call {
    struct list_head link;
    struct etcd *e;
    struct httpc_req *req;
    etcd_cb cb;
    void *arg;
};

static void call_free(struct etcd_call *c)
{
    list_remove(&c->link);
    c->e->n_calls--;
    free(c);
}

static void on_done(const struct httpc_response *resp, void *arg)
{
    struct etcd_call *c = arg;
    struct etcd *e = c->e;
    etcd_cb cb = c->cb;
    void *cb_arg = c->arg;
    call_free(c);
    if (resp->error != 0 && e->n_eps > 1)
        e->cur = (e->cur + 1) % e->n_eps; /* try the next member next time */
    json_t *body = NULL;
    char why[256] = "";
    if (resp->error) {
        snprintf(why, sizeof(why), "%s",
                 resp->error_text && *resp->error_text ? resp->error_text : strerror(-resp->error));
    } else if (resp->status != 200) {
        snprintf(why, sizeof(why), "HTTP %ld: %.160s", resp->status, resp->body ? resp->body : "");
    } else if (!(body = json_loadb(resp->body, resp->body_len, 0, NULL)) || !json_is_object(body)) {
        json_decref(body);
        body = NULL;
        snprintf(why, sizeof(why), "unparsable answer");
    }
    cb(cb_arg, body, body ? NULL : why);
    json_decref(body);
}

struct etcd_call *etcd_post(struct etcd *e, const char *path, json_t *body, etcd_cb cb, void *arg)
{
    char *url = xasprintf("%s%s", e->eps[e->cur], path);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct etcd_call *c = xcalloc(1, sizeof(*c));
    c->e = e;
    c->cb = cb;
    c->arg = arg;
    list_insert_tail(&e->calls, &c->link);
    e->n_calls++;
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = text ? text : "{}",
        .timeout_ms = e->timeout_ms,
        .max_response = ETCD_MAX_RESPONSE,
        .tls = e->use_tls ? &e->tls : NULL,
    };
    c->req = httpc_request(e->hc, &o, on_done, c);
    free(url);
    free(text);
    return c;
}

void etcd_cancel(struct etcd *e, struct etcd_call *c)
{
    if (!c)
        return;
    httpc_cancel(e->hc, c->req);
    call_free(c);
}

size_t etcd_active(const struct etcd *e)
{
    return e ? e->n_calls : 0;
}

struct etcd *etcd_new(struct reactor *r, const struct etcd_opts *o, char *err, size_t cap)
{
    if (!o->endpoints || o->n_endpoints == 0) {
        snprintf(err, cap, "etcd: no endpoint");
        return NULL;
    }
    struct etcd *e = xcalloc(1, sizeof(*e));
    e->r = r;
    e->hc = httpc_new(r);
    if (!e->hc) {
        free(e);
        snprintf(err, cap, "etcd: cannot create the HTTP client");
        return NULL;
    }
    list_init(&e->calls);
    e->eps = xcalloc(o->n_endpoints, sizeof(char *));
    for (size_t i = 0; i < o->n_endpoints; i++) {
        /* Base URLs without a trailing slash: paths are appended. */
        size_t n = strlen(o->endpoints[i]);
        while (n > 0 && o->endpoints[i][n - 1] == '/')
            n--;
        e->eps[i] = xstrndup(o->endpoints[i], n);
        if (strncmp(e->eps[i], "https://", 8) == 0)
            e->use_tls = true;
    }
    e->n_eps = o->n_endpoints;
    e->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
    if (o->tls) {
        e->tls.ca_file = xstrdup(o->tls->ca_file);
        e->tls.cert_file = xstrdup(o->tls->cert_file);
        e->tls.key_file = xstrdup(o->tls->key_file);
        e->tls.key_password = xstrdup(o->tls->key_password);
        e->tls.insecure = o->tls->insecure;
    }
    return e;
}

void etcd_free(struct etcd *e)
{
    if (!e)
        return;
    httpc_free(e->hc); /* aborts every request without callbacks */
    while (!list_empty(&e->calls))
        call_free(list_entry(e->calls.next, struct etcd_call, link));
    for (size_t i = 0; i < e->n_eps; i++)
        free(e->eps[i]);
    free(e->eps);
    free((char *)e->tls.ca_file);
    free((char *)e->tls.cert_file);
    free((char *)e->tls.key_file);
    if (e->tls.key_password)
        explicit_bzero((char *)e->tls.key_password, strlen(e->tls.key_password));
    free((char *)e->tls.key_password);
    free(e);
}

/* ---- base64 and bodies ------------------------------------------------------------------ */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *etcd_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    size_t out_len = 4 * ((len + 2) / 3);
    char *out = xmalloc(out_len + 1);
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16;
        if (i + 1 < len)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < len)
            v |= p[i + 2];
        out[o++] = b64_alphabet[(v >> 18) & 63];
        out[o++] = b64_alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < len ? b64_alphabet[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? b64_alphabet[v & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int b64_val(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

char *etcd_b64_decode(const char *s, size_t *out_len)
{
    size_t n = strlen(s);
    if (n % 4 != 0)
        return NULL;
    char *out = xmalloc(n / 4 * 3 + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = -2;
            } else {
                v[k] = b64_val(s[i + k]);
                if (v[k] < 0)
                    goto bad;
            }
        }
        if (v[2] == -2 && v[3] != -2)
            goto bad;
        unsigned x = ((unsigned)v[0] << 18) | ((unsigned)v[1] << 12) |
                     ((unsigned)(v[2] < 0 ? 0 : v[2]) << 6) | (unsigned)(v[3] < 0 ? 0 : v[3]);
        out[o++] = (char)((x >> 16) & 0xff);
        if (v[2] >= 0)
            out[o++] = (char)((x >> 8) & 0xff);
        if (v[3] >= 0)
            out[o++] = (char)(x & 0xff);
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
bad:
    free(out);
    return NULL;
}

json_t *etcd_b64(const char *s)
{
    char *enc = etcd_b64_encode(s, strlen(s));
    json_t *j = json_string(enc);
    free(enc);
    return j;
}

json_t *etcd_range_body(const char *key, bool prefix)
{
    if (!prefix)
        return json_pack("{s:o}", "key", etcd_b64(key));
    /* range_end = the prefix with its last byte incremented: every key under it. */
    char *end = xstrdup(key);
    size_t n = strlen(end);
    if (n)
        end[n - 1] = (char)(end[n - 1] + 1);
    json_t *b = json_pack("{s:o, s:o}", "key", etcd_b64(key), "range_end", etcd_b64(end));
    free(end);
    return b;
}

int etcd_range_first(const json_t *body, char **value, int64_t *mod_revision, char *lease,
                     size_t lease_cap)
{
    if (value)
        *value = NULL;
    if (lease && lease_cap)
        lease[0] = '\0';
    json_t *kvs = json_object_get(body, "kvs");
    if (!json_is_object(body) || (kvs && !json_is_array(kvs)))
        return -EIO;
    json_t *kv = json_array_get(kvs, 0);
    if (!json_is_object(kv))
        return 0;
    const char *v = json_string_value(json_object_get(kv, "value"));
    if (value) {
        *value = v ? etcd_b64_decode(v, NULL) : xstrdup("");
        if (!*value)
            return -EIO;
    }
    if (mod_revision) {
        const char *mr = json_string_value(json_object_get(kv, "mod_revision"));
        int64_t x = 0;
        *mod_revision = mr && util_parse_i64(mr, 0, INT64_MAX, &x) == 0 ? x : 0;
    }
    const char *ls = json_string_value(json_object_get(kv, "lease"));
    if (lease && ls && strlen(ls) < lease_cap)
        snprintf(lease, lease_cap, "%s", ls);
    return 1;
}

json_t *etcd_txn_body(json_t *compare, json_t *success, json_t *failure)
{
    json_t *b = json_pack("{s:o}", "compare", compare);
    if (success)
        json_object_set_new(b, "success", success);
    if (failure)
        json_object_set_new(b, "failure", failure);
    return b;
}

bool etcd_txn_succeeded(const json_t *body)
{
    return json_is_true(json_object_get(body, "succeeded"));
}

json_t *etcd_op_put(const char *key, const char *value, const char *lease)
{
    json_t *p = json_pack("{s:o, s:o}", "key", etcd_b64(key), "value", etcd_b64(value));
    if (lease && *lease)
        json_object_set_new(p, "lease", json_string(lease));
    return json_pack("{s:o}", "request_put", p);
}

json_t *etcd_op_delete(const char *key)
{
    return json_pack("{s:{s:o}}", "request_delete_range", "key", etcd_b64(key));
}

json_t *etcd_op_range(const char *key)
{
    return json_pack("{s:{s:o}}", "request_range", "key", etcd_b64(key));
}

/* ---- the lock ----------------------------------------------------------------------------- */

struct etcd_lock {
    struct etcd *e;
    struct reactor *r;
    char *key, *owner, *prefix;
    int ttl_s;
    int64_t renew_ms;
    int max_failures;
    bool want_holder_ttl;
    etcd_lock_cb cb;
    void *arg;

    char lease[32]; /* "" = none */
    bool held;
    int64_t valid_until;
    int64_t attempt_sent; /* when the current attempt's grant was sent */
    int64_t ka_sent;
    int failures;
    char *holder;
    int64_t holder_ttl_ms;
    struct etcd_call *attempt; /* grant, txn or timetolive in flight */
    struct etcd_call *ka;
    struct reactor_timer ka_timer;
};

static void ignore_answer(void *arg, json_t *body, const char *error)
{
    (void)arg;
    (void)body;
    (void)error;
}

static void revoke(struct etcd_lock *l)
{
    if (!l->lease[0])
        return;
    etcd_post(l->e, "/v3/lease/revoke", json_pack("{s:s}", "ID", l->lease), ignore_answer, NULL);
    l->lease[0] = '\0';
}

static void set_holder(struct etcd_lock *l, const char *h)
{
    free(l->holder);
    l->holder = xstrdup(h ? h : "");
}

static void event_name(const struct etcd_lock *l, const char *what, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s_%s", l->prefix, what);
}

static void lose(struct etcd_lock *l, const char *why)
{
    if (!l->held)
        return;
    char ev[64];
    event_name(l, "leadership_lost", ev, sizeof(ev));
    log_error(ev, LF_STR("reason", why), LF_STR("lease", l->lease), LF_STR("key", l->key));
    l->held = false;
    l->valid_until = 0;
    reactor_timer_stop(l->r, &l->ka_timer);
    etcd_cancel(l->e, l->ka);
    l->ka = NULL;
    revoke(l); /* best effort: the key goes now if etcd hears us */
    set_holder(l, "");
    l->cb(l, ETCD_LOCK_LOST, why, l->arg);
}

static void ka_done(void *arg, json_t *body, const char *error)
{
    struct etcd_lock *l = arg;
    l->ka = NULL;
    if (!l->held)
        return;
    int64_t now = util_mono_ms();
    json_t *res = json_object_get(body, "result");
    if (body && json_is_object(res)) {
        const char *ttl = json_string_value(json_object_get(res, "TTL"));
        int64_t v = 0;
        if (!ttl || util_parse_i64(ttl, 1, INT64_MAX, &v) < 0) {
            lose(l, "lease expired");
            return;
        }
        l->failures = 0;
        l->valid_until = l->ka_sent + v * 1000;
        l->cb(l, ETCD_LOCK_RENEWED, NULL, l->arg);
        return;
    }
    l->failures++;
    char ev[64];
    event_name(l, "keepalive_failed", ev, sizeof(ev));
    log_warn(ev, LF_STR("error", error ? error : "unexpected answer"),
             LF_INT("failures", l->failures));
    if (l->max_failures > 0 && l->failures >= l->max_failures) {
        char why[96];
        snprintf(why, sizeof(why), "%d renewals failed in a row", l->failures);
        lose(l, why);
    } else if (now >= l->valid_until) {
        lose(l, "keepalive failing for a whole TTL");
    }
}

static void ka_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct etcd_lock *l = arg;
    if (!l->held)
        return;
    int64_t now = util_mono_ms();
    if (now >= l->valid_until) {
        lose(l, "no keepalive answer for a whole TTL");
        return;
    }
    if (l->ka)
        return;
    l->ka_sent = now;
    l->ka = etcd_post(l->e, "/v3/lease/keepalive", json_pack("{s:s}", "ID", l->lease), ka_done, l);
}

static void ttl_done(void *arg, json_t *body, const char *error)
{
    (void)error;
    struct etcd_lock *l = arg;
    l->attempt = NULL;
    /* The gateway omits a zero TTL: an answer without one is a lease in its last
     * second; -1 (expired, unknown) stays unknown. */
    const char *ttl = json_string_value(json_object_get(body, "TTL"));
    int64_t v = body && json_object_get(body, "ID") && !ttl ? 0 : -1;
    if (ttl && util_parse_i64(ttl, -1, INT64_MAX, &v) < 0)
        v = -1;
    if (v >= 0)
        l->holder_ttl_ms = v * 1000;
    l->cb(l, ETCD_LOCK_BUSY, l->holder, l->arg);
}

static void txn_done(void *arg, json_t *body, const char *error)
{
    struct etcd_lock *l = arg;
    l->attempt = NULL;
    char ev[64];
    if (!body) {
        event_name(l, "campaign_failed", ev, sizeof(ev));
        log_warn(ev, LF_STR("error", error));
        revoke(l); /* the txn may have applied: do not leave a key nobody renews */
        l->cb(l, ETCD_LOCK_FAILED, error, l->arg);
        return;
    }
    if (etcd_txn_succeeded(body)) {
        l->held = true;
        l->failures = 0;
        l->valid_until = l->attempt_sent + (int64_t)l->ttl_s * 1000;
        set_holder(l, l->owner);
        reactor_timer_start(l->r, &l->ka_timer, l->renew_ms, l->renew_ms);
        l->cb(l, ETCD_LOCK_WON, l->owner, l->arg);
        return;
    }
    /* Somebody else holds it: learn who, give our lease back. */
    json_t *rr =
        json_object_get(json_array_get(json_object_get(body, "responses"), 0), "response_range");
    char *holder = NULL;
    char holder_lease[32] = "";
    (void)etcd_range_first(rr, &holder, NULL, holder_lease, sizeof(holder_lease));
    set_holder(l, holder);
    free(holder);
    revoke(l);
    l->holder_ttl_ms = -1;
    if (l->want_holder_ttl && holder_lease[0]) {
        l->attempt = etcd_post(l->e, "/v3/lease/timetolive", json_pack("{s:s}", "ID", holder_lease),
                               ttl_done, l);
        return;
    }
    l->cb(l, ETCD_LOCK_BUSY, l->holder, l->arg);
}

static void grant_done(void *arg, json_t *body, const char *error)
{
    struct etcd_lock *l = arg;
    l->attempt = NULL;
    const char *id = json_string_value(json_object_get(body, "ID"));
    int64_t v;
    if (!id || util_parse_i64(id, 1, INT64_MAX, &v) < 0 || strlen(id) >= sizeof(l->lease)) {
        char ev[64];
        event_name(l, "lease_grant_failed", ev, sizeof(ev));
        log_warn(ev, LF_STR("error", error ? error : "unexpected answer"));
        l->cb(l, ETCD_LOCK_FAILED, error ? error : "lease grant refused", l->arg);
        return;
    }
    snprintf(l->lease, sizeof(l->lease), "%s", id);
    json_t *cmp = json_pack("[{s:o, s:s, s:s, s:s}]", "key", etcd_b64(l->key), "result", "EQUAL",
                            "target", "CREATE", "create_revision", "0");
    json_t *ok = json_pack("[o]", etcd_op_put(l->key, l->owner, l->lease));
    json_t *ko = json_pack("[o]", etcd_op_range(l->key));
    l->attempt = etcd_post(l->e, "/v3/kv/txn", etcd_txn_body(cmp, ok, ko), txn_done, l);
}

void etcd_lock_try(struct etcd_lock *l)
{
    if (l->held || l->attempt)
        return;
    l->attempt_sent = util_mono_ms();
    l->attempt =
        etcd_post(l->e, "/v3/lease/grant", json_pack("{s:i}", "TTL", l->ttl_s), grant_done, l);
}

struct etcd_lock *etcd_lock_new(struct etcd *e, struct reactor *r, const struct etcd_lock_opts *o,
                                etcd_lock_cb cb, void *arg)
{
    struct etcd_lock *l = xcalloc(1, sizeof(*l));
    l->e = e;
    l->r = r;
    l->key = xstrdup(o->key);
    l->owner = xstrdup(o->owner);
    l->prefix = xstrdup(o->log_prefix ? o->log_prefix : "etcd_lock");
    l->ttl_s = o->ttl_s > 0 ? o->ttl_s : 15;
    int64_t third = (int64_t)l->ttl_s * 1000 / 3;
    l->renew_ms = o->renew_ms > 0 ? MOTOR_MIN(o->renew_ms, third) : third;
    if (l->renew_ms < 100)
        l->renew_ms = 100;
    l->max_failures = o->max_failures;
    l->want_holder_ttl = o->holder_ttl;
    l->cb = cb;
    l->arg = arg;
    l->holder = xstrdup("");
    l->holder_ttl_ms = -1;
    reactor_timer_init(&l->ka_timer, ka_tick, l);
    return l;
}

bool etcd_lock_held(const struct etcd_lock *l)
{
    return l && l->held;
}

int64_t etcd_lock_valid_until(const struct etcd_lock *l)
{
    return l && l->held ? l->valid_until : 0;
}

const char *etcd_lock_holder(const struct etcd_lock *l)
{
    return l && l->holder ? l->holder : "";
}

int64_t etcd_lock_holder_ttl_ms(const struct etcd_lock *l)
{
    return l ? l->holder_ttl_ms : -1;
}

json_t *etcd_lock_guard(const struct etcd_lock *l)
{
    return json_pack("[{s:o, s:s, s:s, s:o}]", "key", etcd_b64(l->key), "result", "EQUAL", "target",
                     "VALUE", "value", etcd_b64(l->owner));
}

void etcd_lock_lost(struct etcd_lock *l, const char *why)
{
    lose(l, why);
}

void etcd_lock_resign(struct etcd_lock *l)
{
    if (!l || !l->held)
        return;
    l->held = false;
    l->valid_until = 0;
    reactor_timer_stop(l->r, &l->ka_timer);
    etcd_cancel(l->e, l->ka);
    l->ka = NULL;
    char ev[64];
    event_name(l, "resigned", ev, sizeof(ev));
    log_info(ev, LF_STR("key", l->key), LF_STR("lease", l->lease));
    revoke(l);
    set_holder(l, "");
}

void etcd_lock_free(struct etcd_lock *l)
{
    if (!l)
        return;
    reactor_timer_stop(l->r, &l->ka_timer);
    etcd_cancel(l->e, l->ka);
    etcd_cancel(l->e, l->attempt);
    free(l->key);
    free(l->owner);
    free(l->prefix);
    free(l->holder);
    free(l);
}
