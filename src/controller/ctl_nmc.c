/* ctl_nmc — HTTP client helpers: every request the controller makes (node managers,
 * coordinator) goes through ctl_request, which applies the TLS settings and tracks the
 * request so that a shutdown (httpc_free drops answers) can still release contexts. */
#include "controller/ctl_internal.h"

#include "common/list.h"
#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

struct ctl_call {
    struct list_head link; /* on ctl->calls */
    struct ctl *c;
    ctl_resp_fn fn;
    ctl_drop_fn drop;
    void *arg;
    intptr_t tag;
    char *nm_target; /* "ip:port" of a node-manager call, NULL otherwise */
    char *nm_route;
};

/* ---- the node managers' management key ------------------------------------------------ */

static const char AUTH_HINT[] =
    "set motor_controller_config.node_manager_api_key_config (enable_api_key, api_key_file) "
    "to the node managers' management_api_key";

/* A node-manager URL: "scheme://host:port/node-manager/...". The target and the route, or
 * false. */
static bool nm_url_parts(const char *url, char **target, char **route)
{
    const char *h = strstr(url, "://");
    if (!h)
        return false;
    h += 3;
    const char *p = strchr(h, '/');
    if (!p || strncmp(p, "/node-manager/", 14) != 0)
        return false;
    *target = xstrndup(h, (size_t)(p - h));
    size_t n = strcspn(p, "?");
    *route = xstrndup(p, n);
    return true;
}

static ssize_t auth_find(const struct ctl *c, const char *target)
{
    for (size_t i = 0; i < c->n_auth_fails; i++)
        if (strcmp(c->auth_fails[i].target, target) == 0)
            return (ssize_t)i;
    return -1;
}

const struct ctl_auth_fail *ctl_auth_fail_of(const struct ctl *c, const char *target)
{
    ssize_t i = auth_find(c, target);
    return i < 0 ? NULL : &c->auth_fails[i];
}

static void auth_release(struct ctl_auth_fail *f)
{
    free(f->target);
    free(f->route);
    memset(f, 0, sizeof(*f));
}

void ctl_auth_fails_free(struct ctl *c)
{
    for (size_t i = 0; i < c->n_auth_fails; i++)
        auth_release(&c->auth_fails[i]);
    c->n_auth_fails = 0;
}

/* 401/403 from a node manager: the key is missing or wrong. Logged as an error the first
 * time and then every 30 s per node manager (a fleet of them must not flood the log), and
 * kept for GET /controller/instances and `motor status`. */
static void auth_failed(struct ctl *c, const char *target, const char *route, long status)
{
    int64_t now = reactor_now(c->r);
    metrics_counter_inc(c->m.nm_auth_failed);
    ssize_t i = auth_find(c, target);
    if (i < 0) {
        if (c->n_auth_fails == CTL_AUTH_FAIL_MAX) {
            auth_release(&c->auth_fails[0]);
            memmove(&c->auth_fails[0], &c->auth_fails[1],
                    (CTL_AUTH_FAIL_MAX - 1) * sizeof(c->auth_fails[0]));
            c->n_auth_fails--;
        }
        i = (ssize_t)c->n_auth_fails++;
        c->auth_fails[i] = (struct ctl_auth_fail){.target = xstrdup(target), .first_ms = now};
    }
    struct ctl_auth_fail *f = &c->auth_fails[i];
    free(f->route);
    f->route = xstrdup(route);
    f->status = status;
    f->count++;
    f->last_ms = now;
    if (f->count > 1 && now - f->logged_ms < 30000)
        return;
    f->logged_ms = now;
    log_error("node_manager_auth_failed", LF_STR("node_manager", target), LF_STR("route", route),
              LF_INT("status", status),
              LF_STR("reason", status == 401 ? "no management key sent (the node manager needs one)"
                                             : "the node manager refused the key (wrong key)"),
              LF_BOOL("key_sent", c->cfg.nm_key != NULL), LF_INT("refusals", (int64_t)f->count),
              LF_STR("fix", AUTH_HINT));
}

static void auth_ok(struct ctl *c, const char *target)
{
    ssize_t i = auth_find(c, target);
    if (i < 0)
        return;
    log_info("node_manager_auth_ok", LF_STR("node_manager", target),
             LF_INT("refusals_before", (int64_t)c->auth_fails[i].count));
    auth_release(&c->auth_fails[i]);
    c->auth_fails[i] = c->auth_fails[--c->n_auth_fails];
}

json_t *ctl_auth_fails_json(struct ctl *c)
{
    if (!c->n_auth_fails)
        return NULL;
    int64_t now = reactor_now(c->r);
    json_t *a = json_array();
    for (size_t i = 0; i < c->n_auth_fails; i++) {
        const struct ctl_auth_fail *f = &c->auth_fails[i];
        json_array_append_new(a, json_pack("{s:s, s:s, s:i, s:I, s:f}", "node_manager", f->target,
                                           "route", f->route, "status", (int)f->status, "refusals",
                                           (json_int_t)f->count, "last_age_s",
                                           (double)(now - f->last_ms) / 1000.0));
    }
    return json_pack("{s:b, s:o, s:s}", "key_sent", c->cfg.nm_key != NULL, "refusing", a, "fix",
                     AUTH_HINT);
}

char *ctl_nm_url(struct ctl *c, const char *ip, const char *port, const char *path)
{
    const char *scheme = c->use_tls ? "https" : "http";
    if (strchr(ip, ':') && ip[0] != '[')
        return xasprintf("%s://[%s]:%s%s", scheme, ip, port, path);
    return xasprintf("%s://%s:%s%s", scheme, ip, port, path);
}

static void call_free(struct ctl_call *k)
{
    free(k->nm_target);
    free(k->nm_route);
    free(k);
}

static void call_done(const struct httpc_response *resp, void *arg)
{
    struct ctl_call *k = arg;
    list_remove(&k->link);
    if (k->nm_target && resp->error == 0 && resp->status > 0) {
        if (resp->status == 401 || resp->status == 403)
            auth_failed(k->c, k->nm_target, k->nm_route, resp->status);
        else
            auth_ok(k->c, k->nm_target);
    }
    k->fn(k->c, resp, k->arg, k->tag);
    call_free(k);
}

void ctl_request(struct ctl *c, const char *method, const char *url, const json_t *body,
                 int64_t timeout_ms, ctl_resp_fn fn, void *arg, intptr_t tag, ctl_drop_fn drop)
{
    struct ctl_call *k = xcalloc(1, sizeof(*k));
    k->c = c;
    k->fn = fn;
    k->drop = drop;
    k->arg = arg;
    k->tag = tag;
    list_insert_head(&c->calls, &k->link);
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    bool post = method && strcmp(method, "POST") == 0;
    struct httpc_opts o = {
        .method = method,
        .url = url,
        /* httpc turns a body-less request into GET: POSTs always carry a body. */
        .body = text ? text : (post ? "{}" : NULL),
        .timeout_ms = timeout_ms,
        .max_response = 4u << 20,
        .tls = c->use_tls ? &c->tls : NULL,
    };
    bool nm_call = nm_url_parts(url, &k->nm_target, &k->nm_route);
    /* Each peer gets its own key: the coordinator's on its management routes, the node
     * managers' on theirs (start, stop, engine-restart, the FT routes; the GETs too, which
     * is harmless). */
    const char *key =
        nm_call ? c->cfg.nm_key
        : strncmp(url, "http", 4) == 0 && (strstr(url, "/instances/") || strstr(url, "/precision/"))
            ? c->cfg.coordinator_key
            : NULL;
    if (key) {
        char *hdr = xasprintf("X-Motor-Management-Key: %s", key);
        const char *hdrs[] = {hdr, NULL};
        o.headers = hdrs;
        httpc_request(c->hc, &o, call_done, k);
        explicit_bzero(hdr, strlen(hdr));
        free(hdr);
    } else {
        httpc_request(c->hc, &o, call_done, k);
    }
    free(text);
}

void ctl_requests_drop_all(struct ctl *c)
{
    struct list_head *n;
    while ((n = list_first(&c->calls))) {
        struct ctl_call *k = list_entry(n, struct ctl_call, link);
        list_remove(n);
        if (k->drop)
            k->drop(k->arg, k->tag);
        call_free(k);
    }
}

bool ctl_http_ok(const struct httpc_response *resp)
{
    return resp->error == 0 && resp->status >= 200 && resp->status < 300;
}

json_t *ctl_http_json(const struct httpc_response *resp)
{
    if (resp->error || !resp->body || resp->body_len == 0)
        return NULL;
    return json_loadb(resp->body, resp->body_len, 0, NULL);
}

const char *ctl_http_err(const struct httpc_response *resp)
{
    static __thread char buf[256];
    if (resp->error)
        snprintf(buf, sizeof(buf), "%s",
                 resp->error_text && *resp->error_text ? resp->error_text : "transport error");
    else
        snprintf(buf, sizeof(buf), "HTTP %ld %.200s", resp->status, resp->body ? resp->body : "");
    return buf;
}

struct fire {
    char *what;
    char *url;
    int64_t instance_id;
};

static void fire_free(void *arg, intptr_t tag)
{
    (void)tag;
    struct fire *f = arg;
    free(f->what);
    free(f->url);
    free(f);
}

static void fire_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    (void)c;
    struct fire *f = arg;
    if (ctl_http_ok(resp))
        log_info(f->what, LF_INT("instance_id", f->instance_id), LF_STR("url", f->url),
                 LF_INT("status", resp->status));
    else
        log_warn(f->what, LF_INT("instance_id", f->instance_id), LF_STR("url", f->url),
                 LF_INT("status", resp->status), LF_STR("error", ctl_http_err(resp)));
    fire_free(f, tag);
}

void ctl_http_fire(struct ctl *c, const char *method, const char *url, const json_t *body,
                   int64_t timeout_ms, const char *what, int64_t instance_id)
{
    struct fire *f = xcalloc(1, sizeof(*f));
    f->what = xstrdup(what);
    f->url = xstrdup(url);
    f->instance_id = instance_id;
    ctl_request(c, method, url, body, timeout_ms, fire_done, f, 0, fire_free);
}

/* ---- reachability probes (any HTTP answer counts) ---------------------------------------- */

struct probe_round {
    struct ctl_probe p;
    ctl_probe_fn fn;
    size_t left;
};

static void probe_free(struct probe_round *r)
{
    for (size_t i = 0; i < r->p.n; i++)
        free(r->p.keys[i]);
    free(r->p.keys);
    free(r->p.ok);
    free(r);
}

static void probe_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct probe_round *r = arg;
    if (--r->left == 0)
        probe_free(r);
}

static void probe_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    struct probe_round *r = arg;
    r->p.ok[tag] = resp->error == 0 && resp->status > 0;
    if (!r->p.ok[tag])
        log_warn("node_manager_probe_failed", LF_INT("instance_id", r->p.id),
                 LF_STR("node_manager", r->p.keys[tag]), LF_STR("error", ctl_http_err(resp)));
    if (--r->left > 0)
        return;
    r->fn(c, &r->p);
    probe_free(r);
}

void ctl_probe_start(struct ctl *c, struct ctl_inst *in, ctl_probe_fn done)
{
    struct probe_round *r = xcalloc(1, sizeof(*r));
    r->fn = done;
    r->p.id = in->id;
    r->p.incarnation = in->incarnation;
    r->p.n = r->left = in->n_nms;
    r->p.ok = xcalloc(in->n_nms + 1, sizeof(bool));
    r->p.keys = xcalloc(in->n_nms + 1, sizeof(char *));
    in->probing = true;
    for (size_t i = 0; i < in->n_nms; i++)
        r->p.keys[i] = xasprintf("%s %s", in->nms[i].pod_ip, in->nms[i].port);
    for (size_t i = 0; i < in->n_nms; i++) {
        char *url = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "/node-manager/status");
        ctl_request(c, "GET", url, NULL, c->cfg.nm_probe_timeout_ms, probe_done, r, (intptr_t)i,
                    probe_drop);
        free(url);
    }
}

ssize_t ctl_nm_by_key(const struct ctl_inst *in, const char *key)
{
    for (size_t i = 0; i < in->n_nms; i++) {
        char *k = xasprintf("%s %s", in->nms[i].pod_ip, in->nms[i].port);
        bool eq = strcmp(k, key) == 0;
        free(k);
        if (eq)
            return (ssize_t)i;
    }
    return -1;
}
