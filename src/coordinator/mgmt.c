/* The management API (spec §9.2) on the management reactor: GET /instances,
 * POST /instances/refresh (with model discovery), probes, metrics. It owns the instance
 * table and publishes a new immutable snapshot after every accepted refresh. */
#include "coordinator/coord_internal.h"
#include "coordinator/precision.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MGMT_MAX_BODY (10u << 20)      /* refresh bodies, upstream's limit */
#define MGMT_DISCOVERY_TIMEOUT_MS 2000 /* per engine /v1/models, as upstream */
#define MGMT_DISCOVERY_MAX_EPS 16      /* probed endpoints per instance */
#define MGMT_MAX_QUEUED 64             /* refreshes waiting behind a discovery */

struct probe {
    struct mgmt_refresh *f;
    size_t inst; /* index in f->r.v */
    size_t ep;   /* index in that instance's endpoints */
    struct httpc_req *h;
    char *model; /* the single model listed, or NULL */
    char *error;
};

struct mgmt_refresh {
    struct coord *c;
    struct httpd_req *req; /* NULL once the client went away */
    struct inst_refresh r;
    struct probe *probes;
    size_t n_probes, probes_left;
    bool started;
    struct mgmt_refresh *next;
};

static void publish_locked(struct coord *c)
{
    inst_pub_set(&c->pub, inst_snapshot_build(&c->table));
    kvsub_sync(c);
}

void mgmt_publish(struct coord *c)
{
    publish_locked(c);
}

/* ---- probes ------------------------------------------------------------------------- */

/* Upstream's fields plus (motor) boot_id and started_at: a Controller compares the boot
 * id with the one it last pushed a full `set` to, and replaces the table of a
 * coordinator that restarted (empty) however quickly it came back. */
static json_t *probe_body(const struct coord *c, const char *status, const char *message,
                          bool ready, bool with_ready)
{
    json_t *j = json_pack("{s:s, s:s}", "status", status, "message", message);
    if (with_ready)
        json_object_set_new(j, "ready", json_boolean(ready));
    json_object_set_new(j, "boot_id", json_string(c->boot_id));
    json_object_set_new(j, "started_at", json_real((double)c->start_wall_ms / 1000.0));
    return j;
}

static void h_alive(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    coord_ha_standby_close(c, req);
    httpd_respond_json(req, 200, probe_body(c, "ok", "Coordinator is alive", false, false));
}

/* 200 while this coordinator serves ("ready": whether anything is routable), 503 with a
 * reason otherwise (NOT_MASTER on a standby: Kubernetes then routes to the master). */
static void h_readiness(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    coord_ha_standby_close(c, req);
    struct inst_snapshot *s = inst_pub_get(&c->pub);
    int status;
    json_t *body = coord_readiness(c, s, true, &status);
    inst_snapshot_unref(s);
    httpd_respond_json(req, status, body);
}

static void h_root(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s, s:i, s:i}", "service", "motor-coordinator", "version",
                                 MOTOR_VERSION, "infer_port", c->infer_port, "mgmt_port",
                                 c->mgmt_port));
}

static void h_instances(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    coord_ha_standby_close(c, req);
    httpd_respond_json(req, 200, inst_table_to_json(&c->table, util_mono_ms()));
}

/* (motor) The KV-cache index and its subscriptions: {"index": null} when no
 * kv_cache_affinity ever needed one. */
static void h_kv_index(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    json_t *j = json_object();
    json_object_set_new(j, "index", kvsub_to_json(c));
    httpd_respond_json(req, 200, j);
}

/* ---- refresh ------------------------------------------------------------------------ */

static void refresh_free(struct mgmt_refresh *f)
{
    for (size_t i = 0; i < f->n_probes; i++) {
        if (f->probes[i].h)
            httpc_cancel(f->c->mgmt_httpc, f->probes[i].h);
        free(f->probes[i].model);
        free(f->probes[i].error);
    }
    free(f->probes);
    inst_refresh_release(&f->r);
    free(f);
}

static void refresh_respond_error(struct mgmt_refresh *f, int status, const char *detail)
{
    if (!f->req)
        return;
    httpd_req_on_close(f->req, NULL, NULL);
    httpd_respond_error(f->req, status, detail);
    f->req = NULL;
}

static void refresh_apply(struct mgmt_refresh *f)
{
    struct coord *c = f->c;
    char err[512] = "";
    int rc = inst_table_apply(&c->table, &f->r, err, sizeof(err));
    if (rc < 0) {
        int status = rc == -EEXIST ? 409 : 400;
        log_warn("instances_refresh_rejected",
                 LF_STR("refresh_event", wire_refresh_event_str(f->r.ev)), LF_INT("status", status),
                 LF_STR("reason", err));
        refresh_respond_error(f, status, err);
        return;
    }
    publish_locked(c);
    metrics_counter_inc(c->m.refreshes);
    coord_ha_table_changed(c);
    struct strbuf ids;
    strbuf_init(&ids, 2048);
    for (size_t i = 0; i < f->r.n; i++)
        strbuf_appendf(&ids, "%s%lld", i ? "," : "", (long long)f->r.v[i]->id);
    log_info("instances_refreshed", LF_STR("refresh_event", wire_refresh_event_str(f->r.ev)),
             LF_INT("instances", (long long)f->r.n), LF_STR("ids", strbuf_str(&ids)),
             LF_INT("table_size", (long long)c->table.n),
             LF_INT("version", (long long)c->table.version));
    strbuf_release(&ids);
    if (!f->req)
        return;
    char ts[40], rid[40];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    snprintf(rid, sizeof(rid), "refresh-%llu", (unsigned long long)c->table.version);
    /* data.boot_id (motor): which coordinator process now holds this view. */
    json_t *body = json_pack("{s:s, s:s, s:s, s:{s:s, s:s, s:I, s:s}}", "request_id", rid, "status",
                             "success", "message", "Instance refresh completed", "data",
                             "timestamp", ts, "event_type", wire_refresh_event_str(f->r.ev),
                             "instance_count", (json_int_t)f->r.n, "boot_id", c->boot_id);
    httpd_req_on_close(f->req, NULL, NULL);
    httpd_respond_json(f->req, 200, body);
    f->req = NULL;
}

static void queue_next(struct coord *c);

static void refresh_finish(struct mgmt_refresh *f)
{
    struct coord *c = f->c;
    /* f is the queue head. */
    c->refresh_head = f->next;
    if (!c->refresh_head)
        c->refresh_tail = NULL;
    refresh_free(f);
    queue_next(c);
}

/* All probes answered: pick each instance's model, then apply. */
static void discovery_done(struct mgmt_refresh *f)
{
    /* A model seen anywhere in this refresh, when it is the only one seen. */
    const char *only = NULL;
    bool several = false;
    for (size_t i = 0; i < f->n_probes; i++) {
        const char *m = f->probes[i].model;
        if (!m)
            continue;
        if (!only)
            only = m;
        else if (strcmp(only, m) != 0)
            several = true;
    }
    for (size_t k = 0; k < f->r.n; k++) {
        struct instance *in = f->r.v[k];
        if (in->model_name[0])
            continue;
        const char *found = NULL;
        const char *why = "no endpoint answered";
        for (size_t i = 0; i < f->n_probes && !found; i++) {
            if (f->probes[i].inst != k)
                continue;
            if (f->probes[i].model)
                found = f->probes[i].model;
            else if (f->probes[i].error)
                why = f->probes[i].error;
        }
        if (!found && only && !several)
            found = only;
        if (!found) {
            char msg[384];
            snprintf(msg, sizeof(msg),
                     "instance %lld: model_name missing and discovery through /v1/models "
                     "failed (%s)",
                     (long long)in->id, why);
            log_warn("model_discovery_failed", LF_INT("instance_id", in->id),
                     LF_STR("reason", why));
            refresh_respond_error(f, 400, msg);
            refresh_finish(f);
            return;
        }
        free(in->model_name);
        in->model_name = xstrdup(found);
        log_info("model_discovered", LF_INT("instance_id", in->id), LF_STR("model", found));
    }
    refresh_apply(f);
    refresh_finish(f);
}

static void on_probe_done(const struct httpc_response *resp, void *arg)
{
    struct probe *p = arg;
    struct mgmt_refresh *f = p->f;
    p->h = NULL;
    if (resp->error) {
        p->error = xasprintf("%s: %s", f->r.v[p->inst]->eps[p->ep].hostport, resp->error_text);
    } else if (resp->status != 200) {
        p->error = xasprintf("%s: HTTP %ld", f->r.v[p->inst]->eps[p->ep].hostport, resp->status);
    } else {
        json_error_t je;
        json_t *j = json_loadb(resp->body, resp->body_len, 0, &je);
        json_t *data = json_object_get(j, "data");
        if (json_is_array(data) && json_array_size(data) == 1 &&
            json_is_string(json_object_get(json_array_get(data, 0), "id")))
            p->model = xstrdup(json_string_value(json_object_get(json_array_get(data, 0), "id")));
        else
            p->error = xasprintf("%s: /v1/models does not list exactly one model",
                                 f->r.v[p->inst]->eps[p->ep].hostport);
        json_decref(j);
    }
    if (--f->probes_left == 0)
        discovery_done(f);
}

static void refresh_start(struct mgmt_refresh *f)
{
    struct coord *c = f->c;
    f->started = true;
    if (!inst_refresh_needs_model(&f->r)) {
        refresh_apply(f);
        refresh_finish(f);
        return;
    }
    size_t n = 0;
    for (size_t k = 0; k < f->r.n; k++)
        if (!f->r.v[k]->model_name[0])
            n += MOTOR_MIN(f->r.v[k]->n_eps, (size_t)MGMT_DISCOVERY_MAX_EPS);
    if (n == 0) {
        /* Instances without endpoints cannot tell their model. */
        refresh_respond_error(f, 400,
                              "model_name missing and the instance has no endpoint to "
                              "ask through /v1/models");
        refresh_finish(f);
        return;
    }
    f->probes = xcalloc(n, sizeof(*f->probes));
    for (size_t k = 0; k < f->r.n; k++) {
        struct instance *in = f->r.v[k];
        if (in->model_name[0])
            continue;
        for (size_t e = 0; e < in->n_eps && e < MGMT_DISCOVERY_MAX_EPS; e++) {
            struct probe *p = &f->probes[f->n_probes++];
            p->f = f;
            p->inst = k;
            p->ep = e;
        }
    }
    f->probes_left = f->n_probes;
    /* Engines are asked the way the workers will talk to them (infer_tls_config). */
    struct csettings *set = csettings_pub_get(&c->settings);
    for (size_t i = 0; i < f->n_probes; i++) {
        struct probe *p = &f->probes[i];
        char *url = xasprintf("%s://%s/v1/models", set->engine_tls ? "https" : "http",
                              f->r.v[p->inst]->eps[p->ep].hostport);
        struct httpc_opts o = {
            .url = url,
            .timeout_ms = MGMT_DISCOVERY_TIMEOUT_MS,
            .tls = set->engine_tls ? &set->engine_tls_opts : NULL,
        };
        p->h = httpc_request(c->mgmt_httpc, &o, on_probe_done, p);
        free(url);
    }
    csettings_unref(set);
}

static void queue_next(struct coord *c)
{
    struct mgmt_refresh *f = c->refresh_head;
    if (f && !f->started)
        refresh_start(f);
}

static void on_refresh_close(struct httpd_req *req, void *arg)
{
    struct mgmt_refresh *f = arg;
    f->req = NULL; /* the refresh still completes: the caller may retry or re-sync */
}

static void h_refresh(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    if (!coord_ha_accepts_refresh(c, req))
        return;
    char err[512];
    json_t *body = httpd_req_json(req, err, sizeof(err));
    if (!body) {
        httpd_respond_error(req, 400, err);
        return;
    }
    struct mgmt_refresh *f = xcalloc(1, sizeof(*f));
    f->c = c;
    int rc = inst_refresh_parse(body, &f->r, err, sizeof(err));
    json_decref(body);
    if (rc < 0) {
        log_warn("instances_refresh_rejected", LF_INT("status", 400), LF_STR("reason", err));
        free(f);
        httpd_respond_error(req, 400, err);
        return;
    }
    size_t queued = 0;
    for (struct mgmt_refresh *q = c->refresh_head; q; q = q->next)
        queued++;
    if (queued >= MGMT_MAX_QUEUED) {
        inst_refresh_release(&f->r);
        free(f);
        httpd_respond_error(req, 503, "too many refreshes in progress");
        return;
    }
    f->req = req;
    httpd_req_on_close(req, on_refresh_close, f);
    if (c->refresh_tail)
        c->refresh_tail->next = f;
    else
        c->refresh_head = f;
    c->refresh_tail = f;
    queue_next(c);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

static const char *const quiet_paths[] = {"/health",  "/liveness", "/readiness",
                                          "/startup", "/metrics",  NULL};

int mgmt_start(struct coord *c)
{
    struct httpd_config hc = {
        .name = "coordinator-mgmt",
        .host = c->cfg.host,
        .port = (uint16_t)c->cfg.mgmt_port,
        .max_body = MGMT_MAX_BODY,
        .quiet_paths = quiet_paths,
        .api_key_header = "X-Motor-Management-Key",
        .api_key = c->cfg.mgmt_key_enable ? c->cfg.mgmt_key : NULL,
    };
    if (c->cfg.mgmt_tls.enable) {
        hc.tls_cert_file = c->cfg.mgmt_tls.cert_file;
        hc.tls_key_file = c->cfg.mgmt_tls.key_file;
        hc.tls_ca_file = c->cfg.mgmt_tls.ca_file;
        hc.tls_key_password = c->cfg.mgmt_tls.key_password;
    }
    c->mgmt = httpd_new(c->r, &hc);
    if (!c->mgmt) {
        log_error("listen_failed", LF_STR("server", "management"), LF_STR("host", c->cfg.host),
                  LF_INT("port", c->cfg.mgmt_port), LF_STR("error", strerror(errno)));
        return -EIO;
    }
    c->mgmt_port = httpd_port(c->mgmt);
    c->mgmt_httpc = httpc_new(c->r);
    if (!c->mgmt_httpc)
        return -ENOMEM;
    httpd_route(c->mgmt, "GET", "/", h_root, c, 0);
    httpd_route(c->mgmt, "GET", "/startup", h_alive, c, 0);
    httpd_route(c->mgmt, "GET", "/liveness", h_alive, c, 0);
    httpd_route(c->mgmt, "GET", "/health", h_alive, c, 0);
    httpd_route(c->mgmt, "GET", "/readiness", h_readiness, c, 0);
    httpd_route(c->mgmt, "GET", "/metrics", coord_handle_metrics, c, 0);
    httpd_route(c->mgmt, "GET", "/instances", h_instances, c, HTTPD_ROUTE_AUTH);
    httpd_route(c->mgmt, "GET", "/kv_index", h_kv_index, c, HTTPD_ROUTE_AUTH);
    httpd_route(c->mgmt, "POST", "/instances/refresh", h_refresh, c, HTTPD_ROUTE_AUTH);
    prec_register_routes(c);
    return 0;
}

void mgmt_stop(struct coord *c)
{
    /* Queued refreshes: their requests are answered 503 by httpd_free. */
    httpd_free(c->mgmt);
    c->mgmt = NULL;
    while (c->refresh_head) {
        struct mgmt_refresh *f = c->refresh_head;
        c->refresh_head = f->next;
        refresh_free(f);
    }
    c->refresh_tail = NULL;
    httpc_free(c->mgmt_httpc);
    c->mgmt_httpc = NULL;
}
