/* nm_ctrl — the Controller client (§5): registration with capped backoff, heartbeats,
 * re-registration on HTTP 503, software-fault reports.
 *
 * Everything is asynchronous over httpc on the reactor: a slow or dead Controller costs
 * requests in flight, never a blocked loop, so probes, arbitration and the API go on.
 * Every request is tracked (struct nm_call) so that shutdown can cancel it and free its
 * context. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"
#include "wire/wire_ranktable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Failed heartbeats are logged at most once per window (upstream: 60 s). */
#define HB_ERROR_LOG_WINDOW_MS 60000

typedef void (*call_done_fn)(struct nodemgr *nm, const struct httpc_response *resp, void *arg);

struct nm_call {
    struct nm_call *next, **pprev;
    struct nodemgr *nm;
    struct httpc_req *req;
    call_done_fn done;
    void *arg;
    void (*free_arg)(void *);
};

static void call_unlink(struct nm_call *c)
{
    *c->pprev = c->next;
    if (c->next)
        c->next->pprev = c->pprev;
}

static void call_done(const struct httpc_response *resp, void *arg)
{
    struct nm_call *c = arg;
    call_unlink(c);
    c->done(c->nm, resp, c->arg);
    free(c);
}

/* POST a JSON body (stolen) to the Controller. */
static void ctrl_post(struct nodemgr *nm, const char *path, json_t *body, int64_t timeout_ms,
                      call_done_fn done, void *arg, void (*free_arg)(void *))
{
    struct nm_ctrl *ct = &nm->ctrl;
    char *url = xasprintf("%s%s", ct->base_url, path);
    char *text = wire_json_compact(body);
    json_decref(body);
    struct nm_call *c = xcalloc(1, sizeof(*c));
    c->nm = nm;
    c->done = done;
    c->arg = arg;
    c->free_arg = free_arg;
    c->next = ct->calls;
    if (c->next)
        c->next->pprev = &c->next;
    c->pprev = &ct->calls;
    ct->calls = c;
    static const char *const headers[] = {"Accept: application/json", NULL};
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = text,
        .headers = headers,
        .timeout_ms = timeout_ms,
        .max_response = 1u << 20,
        .tls = ct->use_tls ? &ct->tls : NULL,
    };
    c->req = httpc_request(nm->ctl_http, &o, call_done, c);
    free(url);
    free(text);
}

/* Shutting down, or told to stop (POST /node-manager/stop accepted): the Controller must
 * hear nothing more from us — no heartbeat (it would carry the statuses of engines we
 * are taking down ourselves), no registration, no fault report. */
static bool ctrl_silenced(const struct nodemgr *nm)
{
    return nm_stopping(nm);
}

static bool status_2xx(const struct httpc_response *resp)
{
    return resp->error == 0 && resp->status >= 200 && resp->status < 300;
}

static json_t *resp_json(const struct httpc_response *resp)
{
    if (resp->error || !resp->body_len)
        return NULL;
    return json_loadb(resp->body, resp->body_len, 0, NULL);
}

/* Short description of a failed call for logs. */
static void resp_why(const struct httpc_response *resp, char *buf, size_t cap)
{
    if (resp->error)
        snprintf(buf, cap, "%s",
                 resp->error_text && *resp->error_text ? resp->error_text : strerror(-resp->error));
    else
        snprintf(buf, cap, "http %ld: %.200s", resp->status, resp->body ? resp->body : "");
}

/* ---- init ------------------------------------------------------------------------------ */

static char *read_password(const char *path)
{
    if (!path || !*path)
        return NULL;
    size_t len = 0;
    char *s = util_read_file(path, 4096, &len);
    if (!s)
        return NULL;
    while (len > 0 && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' '))
        s[--len] = '\0';
    return s;
}

/* Address and TLS from the live config (init and hot reload). */
static void ctrl_configure(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    const struct nm_config *cfg = nm->cfg;
    free(ct->base_url);
    free(ct->tls_password);
    ct->tls_password = NULL;
    memset(&ct->tls, 0, sizeof(ct->tls));
    ct->use_tls = cfg->mgmt_tls.enable_tls;
    const char *host = cfg->controller_host ? cfg->controller_host : "127.0.0.1";
    bool v6 = strchr(host, ':') != NULL;
    ct->base_url = xasprintf("%s://%s%s%s:%d", ct->use_tls ? "https" : "http", v6 ? "[" : "", host,
                             v6 ? "]" : "", cfg->controller_port);
    if (ct->use_tls) {
        ct->tls_password = read_password(cfg->mgmt_tls.passwd_file);
        ct->tls.ca_file =
            cfg->mgmt_tls.ca_file && *cfg->mgmt_tls.ca_file ? cfg->mgmt_tls.ca_file : NULL;
        ct->tls.cert_file =
            cfg->mgmt_tls.cert_file && *cfg->mgmt_tls.cert_file ? cfg->mgmt_tls.cert_file : NULL;
        ct->tls.key_file =
            cfg->mgmt_tls.key_file && *cfg->mgmt_tls.key_file ? cfg->mgmt_tls.key_file : NULL;
        ct->tls.key_password = ct->tls_password;
    }
}

void nm_ctrl_init(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    /* No Controller: standalone hosts and KV-only (separated) pods. */
    ct->enabled = !nm->cfg->standalone && nm->has_engine;
    ctrl_configure(nm);
}

void nm_ctrl_reconfigure(struct nodemgr *nm)
{
    char *before = xstrdup(nm->ctrl.base_url);
    ctrl_configure(nm);
    if (strcmp(before, nm->ctrl.base_url) != 0)
        log_info("controller_address_changed", LF_STR("from", before),
                 LF_STR("to", nm->ctrl.base_url));
    free(before);
}

void nm_ctrl_stop(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->ctrl.register_timer);
    reactor_timer_stop(nm->r, &nm->ctrl.hb_timer);
}

void nm_ctrl_free(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    nm_ctrl_stop(nm);
    while (ct->calls) {
        struct nm_call *c = ct->calls;
        call_unlink(c);
        if (nm->ctl_http && c->req)
            httpc_cancel(nm->ctl_http, c->req);
        if (c->free_arg)
            c->free_arg(c->arg);
        free(c);
    }
    free(ct->base_url);
    free(ct->tls_password);
    memset(ct, 0, sizeof(*ct));
}

/* ---- registration (§5.2) ------------------------------------------------------------ */

static const char *wire_engine_type(const struct nm_config *cfg)
{
    /* The simulator speaks vLLM's surface, so the Controller treats it as vLLM. */
    switch (cfg->engine_type) {
    case NM_ENGINE_VLLM:
    case NM_ENGINE_SIM:
        return "vllm";
    case NM_ENGINE_SGLANG:
        return "sglang";
    case NM_ENGINE_CMD:
        return "cmd";
    }
    return NULL;
}

json_t *nm_ctrl_register_body(struct nodemgr *nm)
{
    const struct nm_config *cfg = nm->cfg;
    struct wire_register m = {0};
    m.job_name = xstrdup(cfg->job_name ? cfg->job_name : "");
    m.model_name = xstrdup(cfg->model_name ? cfg->model_name : "");
    m.engine_type = xstrdup(wire_engine_type(cfg));
    wire_strlist_copy(&m.dispatch_capabilities, &cfg->dispatch_capabilities);
    m.ft_capability = cfg->ft_capability;
    m.role = cfg->role;
    m.pod_ip = xstrdup(cfg->pod_ip);
    for (int i = 0; i < cfg->endpoint_num; i++) {
        char p[16];
        snprintf(p, sizeof(p), "%d", cfg->service_ports[i]);
        wire_strlist_push(&m.business_port, p);
    }
    m.bootstrap_port = cfg->bootstrap_port;
    m.nm_port = xasprintf("%u", (unsigned)nm->api_port);
    m.parallel_config = cfg->parallel;
    m.enable_multi_endpoints = cfg->enable_multi_endpoints;
    m.device_num = cfg->device_num;
    m.nnodes = cfg->nnodes;
    m.is_master = false;
    /* The MindCluster ranktable, not on A5 (§2.8). */
    if (cfg->hccl_path && *cfg->hccl_path &&
        !(cfg->hardware_type && strcmp(cfg->hardware_type, "Ascend950") == 0)) {
        struct wire_ranktable rt;
        struct wire_err err = {{0}};
        if (wire_ranktable_load_file(cfg->hccl_path, &rt, &err) == 0) {
            m.ranktable = xmalloc(sizeof(*m.ranktable));
            *m.ranktable = rt;
        } else {
            log_warn("hccl_ranktable_unreadable", LF_STR("path", cfg->hccl_path),
                     LF_STR("error", err.msg));
        }
    }
    json_t *j = wire_register_to_json(&m);
    wire_register_release(&m);
    return j;
}

static void register_send(struct nodemgr *nm);

static void register_retry(struct reactor *r, void *arg)
{
    (void)r;
    register_send(arg);
}

static void on_register_done(struct nodemgr *nm, const struct httpc_response *resp, void *arg)
{
    (void)arg;
    struct nm_ctrl *ct = &nm->ctrl;
    ct->register_inflight = false;
    json_t *body = resp_json(resp);
    bool ok = status_2xx(resp) && wire_register_reply_ok(body);
    json_decref(body);
    if (ok) {
        ct->registered = true;
        ct->register_backoff_ms = 0;
        metrics_counter_inc(nm->m.reg_ok);
        log_info("registered", LF_STR("controller", ct->base_url),
                 LF_INT("attempts", ct->register_attempts));
        return;
    }
    metrics_counter_inc(nm->m.reg_failed);
    /* 2, 4, 8, 16, 32, 32, ... seconds, forever (§2.8). */
    ct->register_backoff_ms =
        ct->register_backoff_ms == 0
            ? NM_REGISTER_BACKOFF_FIRST_MS
            : MOTOR_MIN(ct->register_backoff_ms * 2, (int64_t)NM_REGISTER_BACKOFF_MAX_MS);
    char why[300];
    resp_why(resp, why, sizeof(why));
    log_warn("register_failed", LF_STR("controller", ct->base_url), LF_STR("error", why),
             LF_INT("attempt", ct->register_attempts),
             LF_INT("retry_in_ms", ct->register_backoff_ms));
    if (!ctrl_silenced(nm) && !ct->registered) {
        nm_timer_start(nm->r, &ct->register_timer, register_retry, nm, ct->register_backoff_ms, 0);
    }
}

static void register_send(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    if (ctrl_silenced(nm) || ct->registered || ct->register_inflight)
        return;
    ct->register_inflight = true;
    ct->register_attempts++;
    json_t *body = nm_ctrl_register_body(nm);
    log_info("register_sending", LF_STR("controller", ct->base_url),
             LF_INT("attempt", ct->register_attempts));
    ctrl_post(nm, "/controller/register", body, NM_REGISTER_TIMEOUT_MS, on_register_done, NULL,
              NULL);
}

void nm_ctrl_start_register(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    if (!ct->enabled)
        return;
    if (!nm->cfg->job_name || !*nm->cfg->job_name) {
        /* Upstream refuses locally too (§2.8): without a job the Controller cannot
         * assemble an instance. The API stays up so the operator can see why. */
        log_error("register_skipped", LF_STR("why", "basic_config.job_name / $JOB_NAME unset"));
        return;
    }
    register_send(nm);
}

/* ---- re-registration (§5.7) ----------------------------------------------------------- */

static void on_reregister_done(struct nodemgr *nm, const struct httpc_response *resp, void *arg)
{
    (void)arg;
    nm->ctrl.reregister_inflight = false;
    if (status_2xx(resp)) {
        nm->ctrl.registered = true;
        log_info("reregistered", LF_STR("controller", nm->ctrl.base_url));
    } else {
        char why[300];
        resp_why(resp, why, sizeof(why));
        log_warn("reregister_failed", LF_STR("error", why));
    }
}

static void reregister_send(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    const struct nm_config *cfg = nm->cfg;
    if (ctrl_silenced(nm) || ct->reregister_inflight || !nm->launch ||
        nm->launch->n_endpoints == 0 || nm->launch->instance_id <= 0)
        return;
    struct wire_reregister m = {0};
    m.job_name = xstrdup(cfg->job_name ? cfg->job_name : "");
    m.model_name = xstrdup(cfg->model_name ? cfg->model_name : "");
    m.engine_type = xstrdup(wire_engine_type(cfg));
    wire_strlist_copy(&m.dispatch_capabilities, &cfg->dispatch_capabilities);
    m.ft_capability = cfg->ft_capability;
    m.instance_id = nm->launch->instance_id;
    m.role = nm->launch->role;
    m.pod_ip = xstrdup(cfg->pod_ip);
    m.nm_port = xasprintf("%u", (unsigned)nm->api_port);
    m.parallel_config = cfg->parallel;
    m.enable_multi_endpoints = cfg->enable_multi_endpoints;
    m.device_num = cfg->device_num;
    m.n_endpoints = nm->launch->n_endpoints;
    m.endpoints = xcalloc(m.n_endpoints, sizeof(*m.endpoints));
    for (size_t i = 0; i < m.n_endpoints; i++) {
        wire_endpoint_copy(&m.endpoints[i], &nm->launch->endpoints[i]);
        struct nm_endpoint *e = nm_engine_find(nm, m.endpoints[i].id);
        if (e)
            m.endpoints[i].status = e->status;
    }
    m.nnodes = cfg->nnodes;
    m.node_rank = nm->launch->node_rank;
    json_t *body = wire_reregister_to_json(&m);
    wire_reregister_release(&m);
    ct->reregister_inflight = true;
    log_info("reregister_sending", LF_INT("instance_id", nm->launch->instance_id));
    ctrl_post(nm, "/controller/reregister", body, NM_REGISTER_TIMEOUT_MS, on_reregister_done, NULL,
              NULL);
}

/* ---- heartbeats (§5.6) ---------------------------------------------------------------- */

json_t *nm_ctrl_heartbeat_body(struct nodemgr *nm)
{
    struct wire_heartbeat m = {0};
    m.job_name = nm->cfg->job_name ? nm->cfg->job_name : "";
    m.ins_id = nm->launch ? nm->launch->instance_id : -1;
    m.ip = nm->cfg->pod_ip;
    struct wire_hb_status *st = xcalloc(nm->n_eps ? nm->n_eps : 1, sizeof(*st));
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        if (nm_engine_retired(nm->eps[i]))
            continue; /* committed scale-down: the Controller expects them absent */
        st[n].endpoint_id = nm->eps[i]->ep.id;
        st[n].status = nm->eps[i]->status;
        n++;
    }
    m.status = st;
    m.n_status = n;
    json_t *j = wire_heartbeat_to_json(&m);
    free(st);
    return j;
}

static void on_heartbeat_done(struct nodemgr *nm, const struct httpc_response *resp, void *arg)
{
    (void)arg;
    struct nm_ctrl *ct = &nm->ctrl;
    ct->hb_inflight = false;
    if (status_2xx(resp)) {
        metrics_counter_inc(nm->m.hb_ok);
        if (ct->hb_last_error_log_ms) {
            log_info("heartbeat_recovered", LF_INT("suppressed_errors", ct->hb_errors_suppressed));
            ct->hb_last_error_log_ms = 0;
            ct->hb_errors_suppressed = 0;
        }
        return;
    }
    /* The Controller does not know our instance (it restarted, or timed us out): tell
     * it again who we are. Decided on the status code, not on text (fix of §12.10). */
    if (resp->error == 0 && resp->status == 503) {
        metrics_counter_inc(nm->m.hb_503);
        log_warn("heartbeat_unknown_instance", LF_STR("action", "reregister"));
        reregister_send(nm);
        return;
    }
    metrics_counter_inc(nm->m.hb_failed);
    int64_t now = util_mono_ms();
    if (!ct->hb_last_error_log_ms || now - ct->hb_last_error_log_ms >= HB_ERROR_LOG_WINDOW_MS) {
        char why[300];
        resp_why(resp, why, sizeof(why));
        log_warn("heartbeat_failed", LF_STR("error", why),
                 LF_INT("suppressed_errors", ct->hb_errors_suppressed));
        ct->hb_last_error_log_ms = now;
        ct->hb_errors_suppressed = 0;
    } else {
        ct->hb_errors_suppressed++;
    }
}

static void hb_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    struct nm_ctrl *ct = &nm->ctrl;
    if (ctrl_silenced(nm) || !nm->launch)
        return;
    /* One heartbeat at a time: a slow Controller gets the next one when it has answered
     * (or timed out) instead of a pile of stale ones. */
    if (ct->hb_inflight) {
        log_debug("heartbeat_skipped", LF_STR("why", "previous one still in flight"));
        return;
    }
    ct->hb_inflight = true;
    int64_t timeout = NM_HEARTBEAT_TIMEOUT_MS;
    ctrl_post(nm, "/controller/heartbeat", nm_ctrl_heartbeat_body(nm), timeout, on_heartbeat_done,
              NULL, NULL);
}

void nm_ctrl_heartbeat_start(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    if (!ct->enabled || ctrl_silenced(nm))
        return;
    int64_t iv = nm_heartbeat_interval_ms(nm);
    if (!ct->hb_started) {
        ct->hb_started = true;
        log_info("heartbeat_started", LF_INT("interval_ms", iv));
    }
    if (!reactor_timer_active(&ct->hb_timer))
        nm_timer_start(nm->r, &ct->hb_timer, hb_tick, nm, 0, iv);
}

void nm_ctrl_heartbeat_reconfigure(struct nodemgr *nm)
{
    struct nm_ctrl *ct = &nm->ctrl;
    if (!ct->hb_started || !reactor_timer_active(&ct->hb_timer))
        return;
    int64_t iv = nm_heartbeat_interval_ms(nm);
    if (ct->hb_timer.interval_ms != iv) {
        reactor_timer_start(nm->r, &ct->hb_timer, iv, iv);
        log_info("heartbeat_interval_changed", LF_INT("interval_ms", iv));
    }
}

/* ---- software-fault reports (§5.8) ----------------------------------------------------- */

struct report_call {
    nm_report_cb cb;
    void *arg;
    void (*free_arg)(void *);
    int64_t engine_id;
};

static void report_call_free(void *p)
{
    struct report_call *rc = p;
    if (rc->free_arg)
        rc->free_arg(rc->arg);
    free(rc);
}

static void on_report_done(struct nodemgr *nm, const struct httpc_response *resp, void *arg)
{
    struct report_call *rc = arg;
    json_t *body = resp_json(resp);
    /* Delivered only when the Controller says so (data.accepted == true): with its FT
     * off it answers 200 without it, and nothing will relaunch the engine. */
    bool accepted = status_2xx(resp) && wire_envelope_accepted(body);
    json_decref(body);
    if (accepted) {
        metrics_counter_inc(nm->m.reports_accepted);
        log_info("fault_report_accepted", LF_INT("endpoint_id", rc->engine_id),
                 LF_INT("elapsed_ms", resp->elapsed_ms));
    } else if (status_2xx(resp)) {
        metrics_counter_inc(nm->m.reports_rejected);
        log_warn("fault_report_not_accepted", LF_INT("endpoint_id", rc->engine_id),
                 LF_STR("body", resp->body));
    } else {
        metrics_counter_inc(nm->m.reports_failed);
        char why[300];
        resp_why(resp, why, sizeof(why));
        log_warn("fault_report_failed", LF_INT("endpoint_id", rc->engine_id), LF_STR("error", why));
    }
    rc->cb(nm, accepted, rc->arg);
    free(rc);
}

struct deferred_report {
    struct nodemgr *nm;
    struct report_call *rc;
};

static void deferred_report_run(void *arg)
{
    struct deferred_report *d = arg;
    d->rc->cb(d->nm, false, d->rc->arg);
    free(d->rc);
    free(d);
}

void nm_ctrl_report_fault(struct nodemgr *nm, struct wire_fault_report *rep, nm_report_cb cb,
                          void *arg, void (*free_arg)(void *))
{
    struct report_call *rc = xcalloc(1, sizeof(*rc));
    rc->cb = cb;
    rc->arg = arg;
    rc->free_arg = free_arg;
    rc->engine_id = rep->engine_id;
    if (!nm->ctrl.enabled || ctrl_silenced(nm)) {
        wire_fault_report_release(rep);
        /* Nobody to tell: "not accepted", from the loop so callers see one order. */
        struct deferred_report *d = xcalloc(1, sizeof(*d));
        d->nm = nm;
        d->rc = rc;
        if (reactor_post(nm->r, deferred_report_run, d) < 0)
            deferred_report_run(d);
        return;
    }
    json_t *body = wire_fault_report_to_json(rep);
    wire_fault_report_release(rep);
    ctrl_post(nm, "/controller/report_software_fault", body, NM_REPORT_TIMEOUT_MS, on_report_done,
              rc, report_call_free);
}
