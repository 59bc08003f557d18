/* ctl_api — the controller's HTTP API (spec §5.2, §5.6–§5.8, §5.10, §8.4) plus
 * Motor's GET /controller/instances and GET /metrics. Handlers answer at once: every
 * route is a bounded amount of in-memory work (long flows run as state machines). */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Routes that need the leader's state answer 503 on a standby or while loading. */
bool ctl_api_serving(struct ctl *c, struct httpd_req *req)
{
    if (c->leader && c->loaded)
        return true;
    httpd_respond_json(req, 503,
                       json_pack("{s:s, s:s}", "detail",
                                 c->leader ? "controller is loading its state"
                                           : "controller is a standby (not the leader)",
                                 "leader", store_leader_owner(c->store)));
    return false;
}

/* ---- durable answers ------------------------------------------------------------------------ */

/* A node manager stops retrying once its registration is acknowledged, so the answer
 * waits until what it acknowledges is in the store (immediate with SQLite, one etcd
 * round trip otherwise). */
struct deferred {
    struct httpd_req *req;
    json_t *body;
    int status;
};

static void deferred_closed(struct httpd_req *req, void *arg)
{
    (void)req;
    struct deferred *d = arg;
    d->req = NULL;
}

static void deferred_done(struct store *st, int err, void *arg)
{
    (void)st;
    struct deferred *d = arg;
    if (d->req) {
        httpd_req_on_close(d->req, NULL, NULL);
        if (err)
            httpd_respond_error(d->req, 503,
                                "controller shutting down before the state was stored");
        else
            httpd_respond_json(d->req, d->status, json_incref(d->body));
    }
    json_decref(d->body);
    free(d);
}

static void respond_durable(struct ctl *c, struct httpd_req *req, int status, json_t *body)
{
    if (!c->store || store_pending(c->store) == 0) {
        httpd_respond_json(req, status, body);
        return;
    }
    struct deferred *d = xcalloc(1, sizeof(*d));
    d->req = req;
    d->body = body;
    d->status = status;
    httpd_req_on_close(req, deferred_closed, d);
    store_barrier(c->store, deferred_done, d);
}

/* ---- register / reregister / heartbeat ---------------------------------------------------- */

static void h_register(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    char msg[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, msg, sizeof(msg));
    struct wire_register m;
    struct wire_err err = {{0}};
    if (!j || wire_register_parse(j, &m, &err) < 0) {
        metrics_counter_inc(c->m.register_errors);
        log_warn("register_invalid", LF_STR("peer", httpd_req_peer(req)),
                 LF_STR("error", j ? err.msg : msg));
        httpd_respond_json(req, 200,
                           json_pack("{s:s, s:s}", "error", "Invalid RegisterMsg format", "detail",
                                     j ? err.msg : msg));
        json_decref(j);
        return;
    }
    json_decref(j);
    int status = 200;
    json_t *body = ctl_register(c, &m, &status);
    wire_register_release(&m);
    respond_durable(c, req, status, body);
}

static void h_reregister(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    char msg[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, msg, sizeof(msg));
    struct wire_reregister m;
    struct wire_err err = {{0}};
    if (!j || wire_reregister_parse(j, WIRE_STRICT_ENDPOINT, &m, &err) < 0) {
        metrics_counter_inc(c->m.register_errors);
        log_warn("reregister_invalid", LF_STR("peer", httpd_req_peer(req)),
                 LF_STR("error", j ? err.msg : msg));
        httpd_respond_json(req, 200,
                           json_pack("{s:s, s:s}", "error", "Invalid ReregisterMsg format",
                                     "detail", j ? err.msg : msg));
        json_decref(j);
        return;
    }
    json_decref(j);
    int status = 200;
    json_t *body = ctl_reregister(c, &m, &status);
    wire_reregister_release(&m);
    respond_durable(c, req, status, body);
}

static void hb_reject(struct ctl *c, struct httpd_req *req, int status, const char *detail,
                      const struct wire_heartbeat *m)
{
    if (status == 503)
        metrics_counter_inc(c->m.hb_unknown);
    else
        metrics_counter_inc(c->m.hb_rejected);
    log_warn("heartbeat_rejected", LF_INT("status", status), LF_INT("instance_id", m->ins_id),
             LF_STR("ip", m->ip), LF_STR("detail", detail));
    httpd_respond_json(req, status, json_pack("{s:s}", "detail", detail));
}

static void h_heartbeat(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    char msg[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, msg, sizeof(msg));
    struct wire_heartbeat m;
    struct wire_err err = {{0}};
    if (!j || wire_heartbeat_parse(j, &m, &err) < 0) {
        metrics_counter_inc(c->m.hb_invalid);
        log_warn("heartbeat_invalid", LF_STR("peer", httpd_req_peer(req)),
                 LF_STR("error", j ? err.msg : msg));
        httpd_respond_json(req, 200,
                           json_pack("{s:s, s:s}", "error", "Invalid HeartbeatMsg format", "detail",
                                     j ? err.msg : msg));
        json_decref(j);
        return;
    }
    json_decref(j);
    char detail[WIRE_ERR_MAX + 64];
    int64_t *retired = NULL;
    struct ctl_inst *in = ctl_find(c, m.ins_id);
    if (!in) {
        snprintf(detail, sizeof(detail), "instance %lld is not known: re-register",
                 (long long)m.ins_id);
        hb_reject(c, req, 503, detail, &m);
        goto out;
    }
    if (strcmp(in->job_name, m.job_name) != 0) {
        snprintf(detail, sizeof(detail), "instance %lld belongs to job %s, not %s",
                 (long long)m.ins_id, in->job_name, m.job_name);
        hb_reject(c, req, 500, detail, &m);
        goto out;
    }
    size_t n_retired;
    retired = ctl_retired(c, in, &n_retired);
    ssize_t idx = ctl_inst_find_nm_for_ids(in, m.ip, m.status, m.n_status, retired, n_retired);
    if (idx < 0) {
        snprintf(detail, sizeof(detail), "pod %s is not registered for instance %lld", m.ip,
                 (long long)m.ins_id);
        hb_reject(c, req, 500, detail, &m);
        goto out;
    }
    struct ctl_nm *nm = &in->nms[idx];
    if (ctl_nm_check_hb_ids(nm, m.status, m.n_status, retired, n_retired, &err) < 0) {
        hb_reject(c, req, 500, err.msg, &m);
        goto out;
    }
    double now_s = (double)util_wall_ms() / 1000.0;
    for (size_t k = 0; k < m.n_status; k++) {
        for (size_t e = 0; e < nm->n_eps; e++) {
            if (nm->eps[e].id == m.status[k].endpoint_id) {
                nm->eps[e].status = m.status[k].status;
                nm->eps[e].hb_timestamp = now_s;
            }
        }
    }
    nm->last_hb_ms = reactor_now(c->r);
    nm->guard_refreshed = false;
    nm->gate_logged = false;
    nm->unconfirmed = false;
    enum ctl_event ev = ctl_inst_evaluate(in, retired, n_retired);
    enum wire_ins_status before = in->status;
    /* A relaunch restarts the engines as fresh processes (`initial`): ACTIVE + INIT has
     * no transition, but the instance is not serving either. While a strategy owns the
     * instance, starting engines count as abnormal, so it goes INACTIVE and comes back
     * through INACTIVE + NORMAL like upstream's (which keeps reporting abnormal). */
    if (ev == CTL_EV_INIT && before == WIRE_INS_ACTIVE && in->strategy)
        ev = CTL_EV_ABNORMAL;
    if (ctl_apply_event(c, in, ev, in->strategy ? "heartbeat during recovery" : "heartbeat") < 0) {
        snprintf(detail, sizeof(detail), "instance %lld: no transition from %s on %s",
                 (long long)m.ins_id, wire_ins_status_str(before), ctl_event_name(ev));
        hb_reject(c, req, 500, detail, &m);
        goto out;
    }
    metrics_counter_inc(c->m.hb_ok);
    httpd_respond_json(req, 200, json_pack("{s:[b,i]}", "result", 1, 200));
out:
    free(retired);
    wire_heartbeat_release(&m);
}

/* ---- faults ---------------------------------------------------------------------------------- */

static void h_fault(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    if (!c->cfg.ft_enable) {
        httpd_respond_json(req, 200,
                           wire_envelope_new(200, "Fault tolerance is not enabled", NULL));
        return;
    }
    char msg[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, msg, sizeof(msg));
    struct wire_fault_report r;
    struct wire_err err = {{0}};
    if (!j || wire_fault_report_parse(j, &r, &err) < 0) {
        log_warn("fault_report_invalid", LF_STR("peer", httpd_req_peer(req)),
                 LF_STR("error", j ? err.msg : msg));
        httpd_respond_json(
            req, 400,
            wire_envelope_error_new(400, j ? err.msg : msg, json_pack("{s:b}", "accepted", 0)));
        json_decref(j);
        return;
    }
    json_decref(j);
    int status = 200;
    json_t *body = ctl_fault_report(c, &r, &status);
    wire_fault_report_release(&r);
    httpd_respond_json(req, status, body);
}

/* ---- instance routes ----------------------------------------------------------------------------
 */

static int body_instance_id(struct httpd_req *req, const char *key, int64_t *id, bool required,
                            char *msg, size_t cap)
{
    char jm[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, jm, sizeof(jm));
    if (!j) {
        snprintf(msg, cap, "%s", jm);
        return -EINVAL;
    }
    int rc = 0;
    json_t *v = json_is_object(j) ? json_object_get(j, key) : NULL;
    if (!json_is_object(j)) {
        snprintf(msg, cap, "body must be a JSON object");
        rc = -EINVAL;
    } else if (!v || json_is_null(v)) {
        if (required) {
            snprintf(msg, cap, "%s: required", key);
            rc = -EINVAL;
        } else {
            rc = -ENOENT;
        }
    } else if (!json_is_integer(v) || json_integer_value(v) < 0) {
        snprintf(msg, cap, "%s: must be a non-negative integer", key);
        rc = -EINVAL;
    } else {
        *id = json_integer_value(v);
    }
    json_decref(j);
    return rc;
}

static void h_check(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    int64_t id = 0;
    char msg[WIRE_ERR_MAX];
    if (body_instance_id(req, "instance_id", &id, true, msg, sizeof(msg)) < 0) {
        httpd_respond_error(req, 400, msg);
        return;
    }
    struct ctl_inst *in = ctl_find(c, id);
    httpd_respond_json(req, 200,
                       json_pack("{s:b}", "exists", in && in->status != WIRE_INS_DELETED));
}

void ctl_terminate_instance(struct ctl *c, struct ctl_inst *in, const char *reason)
{
    for (size_t i = 0; i < in->n_nms; i++) {
        char *url = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "/node-manager/stop");
        ctl_http_fire(c, "POST", url, NULL, c->cfg.start_cmd_timeout_ms, "node_manager_stop",
                      in->id);
        free(url);
    }
    ctl_set_status(c, in, WIRE_INS_DELETED, reason);
}

static void h_terminate(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    char jm[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, jm, sizeof(jm));
    json_t *jid = json_is_object(j) ? json_object_get(j, "instance_id") : NULL;
    json_t *jp = json_is_object(j) ? json_object_get(j, "p_instance_id") : NULL;
    json_t *jr = json_is_object(j) ? json_object_get(j, "reason") : NULL;
    json_t *jc = json_is_object(j) ? json_object_get(j, "precision_alarm_clear") : NULL;
    const char *bad =
        !j                                                  ? jm
        : !json_is_object(j)                                ? "body must be a JSON object"
        : !json_is_integer(jid)                             ? "instance_id: must be an integer"
        : (jp && !json_is_null(jp) && !json_is_integer(jp)) ? "p_instance_id: must be an integer"
        : (jr && !json_is_null(jr) && !json_is_string(jr))  ? "reason: must be a string"
        : (jc && !json_is_null(jc) && !json_is_boolean(jc))
            ? "precision_alarm_clear: must be a boolean"
            : NULL;
    if (bad) {
        httpd_respond_json(req, 400, wire_envelope_error_new(400, bad, NULL));
        json_decref(j);
        return;
    }
    int64_t ids[2] = {json_integer_value(jid), json_is_integer(jp) ? json_integer_value(jp) : -1};
    char reason[256];
    snprintf(reason, sizeof(reason), "terminated by request: %s",
             json_is_string(jr) ? json_string_value(jr) : "no reason given");
    bool prec_clear = json_is_true(jc);
    json_decref(j);
    struct ctl_inst *in = ctl_find(c, ids[0]);
    if (!in) {
        char m[96];
        snprintf(m, sizeof(m), "instance %lld not found", (long long)ids[0]);
        httpd_respond_json(req, 404, wire_envelope_error_new(404, m, NULL));
        return;
    }
    json_t *done = json_array();
    for (int k = 0; k < 2; k++) {
        struct ctl_inst *t = ids[k] >= 0 ? ctl_find(c, ids[k]) : NULL;
        if (!t)
            continue;
        log_warn("instance_terminated", LF_INT("instance_id", t->id), LF_STR("reason", reason));
        json_array_append_new(done, json_integer(t->id));
        if (prec_clear && t->status == WIRE_INS_ACTIVE)
            ctl_set_status(c, t, WIRE_INS_INACTIVE, "precision alarm: isolated");
        ctl_terminate_instance(c, t, reason);
    }
    json_t *data = json_pack("{s:I, s:o}", "instance_id", (json_int_t)ids[0], "terminated", done);
    if (prec_clear) { /* an operator's clear: the group's alarm and the scheduler state */
        ctl_prec_terminate_clear(c, req, ids[0], ids[1], data);
        return;
    }
    httpd_respond_json(req, 200, wire_envelope_new(200, "Instance terminated", data));
}

/* ---- fault-tolerance status (§8.4) --------------------------------------------------------------
 */

static void h_ft_status(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    const char *q = httpd_req_query(req, "instance_id");
    int64_t id = -1;
    if (q && util_parse_i64(q, 0, WIRE_ID_MAX, &id) < 0) {
        httpd_respond_error(req, 400, "instance_id must be an integer");
        return;
    }
    if (!c->cfg.ft_enable) {
        httpd_respond_json(
            req, 200,
            wire_envelope_new(200, "Success",
                              json_pack("{s:s, s:[]}", "phase", "DISABLED", "instances")));
        return;
    }
    /* Seed 002: with DP scale-down off the runtime phase is DISABLED ("开关关闭返回
     * DISABLED"), whatever Motor's strategies did. Motor's own record of them (the
     * relaunch's strategy, strategy_phase, history, the phase the runtime would have)
     * stays observable beside it: motor_phase, motor_runtimes. */
    bool sd_on = c->cfg.scale_down_enable;
    if (q) {
        struct ctl_ft_rt *rt = ctl_find_rt(c, id);
        if (!rt) {
            httpd_respond_error(req, 404, "fault-tolerance runtime not found");
            return;
        }
        json_t *j = ctl_ft_rt_json(rt);
        if (!sd_on) {
            json_object_set(j, "motor_phase", json_object_get(j, "phase"));
            json_object_set_new(j, "phase", json_string("DISABLED"));
        }
        httpd_respond_json(req, 200, wire_envelope_new(200, "Success", j));
        return;
    }
    struct ctl_ft_rt **v;
    size_t n = ctl_all_runtimes(c, &v);
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, ctl_ft_rt_json(v[i]));
    free(v);
    if (!sd_on) {
        httpd_respond_json(
            req, 200,
            wire_envelope_new(200, "Success",
                              json_pack("{s:s, s:[], s:o, s:b, s:b}", "phase", "DISABLED",
                                        "instances", "motor_runtimes", arr, "dp_scale_down", 0,
                                        "engine_relaunch", c->cfg.relaunch_enable)));
        return;
    }
    httpd_respond_json(req, 200,
                       wire_envelope_new(200, "Success",
                                         json_pack("{s:o, s:b, s:b}", "instances", arr,
                                                   "dp_scale_down", c->cfg.scale_down_enable,
                                                   "engine_relaunch", c->cfg.relaunch_enable)));
}

/* ---- GET /controller/instances ------------------------------------------------------------------
 */

static json_t *inst_view(struct ctl *c, struct ctl_inst *in)
{
    int64_t now = reactor_now(c->r);
    double now_s = (double)util_wall_ms() / 1000.0;
    json_t *nms = json_array();
    for (size_t i = 0; i < in->n_nms; i++) {
        struct ctl_nm *nm = &in->nms[i];
        json_t *eps = json_array();
        for (size_t k = 0; k < nm->n_eps; k++) {
            struct wire_endpoint *ep = &nm->eps[k];
            json_t *e = json_pack("{s:I, s:s, s:s, s:s, s:b}", "id", (json_int_t)ep->id, "ip",
                                  ep->ip, "business_port", ep->business_port, "status",
                                  wire_ep_status_str(ep->status), "headless", ep->headless);
            json_object_set_new(e, "heartbeat_age_s",
                                json_real(ep->hb_timestamp > 0 ? now_s - ep->hb_timestamp : -1));
            if (in->ft && ctl_ids_has(in->ft->committed, in->ft->n_committed, ep->id))
                json_object_set_new(e, "retired", json_true());
            json_array_append_new(eps, e);
        }
        json_t *n = json_pack("{s:s, s:s, s:I, s:I, s:o}", "pod_ip", nm->pod_ip, "port", nm->port,
                              "device_num", (json_int_t)nm->device_num, "node_rank",
                              (json_int_t)nm->node_rank, "endpoints", eps);
        char target[96];
        snprintf(target, sizeof(target), strchr(nm->pod_ip, ':') ? "[%s]:%s" : "%s:%s", nm->pod_ip,
                 nm->port);
        const struct ctl_auth_fail *af = ctl_auth_fail_of(c, target);
        if (af)
            json_object_set_new(n, "auth_error",
                                json_sprintf("HTTP %ld on %s: %s", af->status, af->route,
                                             af->status == 401 ? "no management key sent"
                                                               : "management key refused"));
        if (in->assembled) {
            json_object_set_new(n, "heartbeat_age_ms", json_integer(now - nm->last_hb_ms));
            json_object_set_new(n, "start_ok", json_boolean(nm->start_ok));
        }
        json_array_append_new(nms, n);
    }
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(in->id));
    json_object_set_new(o, "job_name", json_string(in->job_name));
    json_object_set_new(o, "model_name", json_string(in->model_name ? in->model_name : ""));
    json_object_set_new(o, "engine_type",
                        in->engine_type ? json_string(in->engine_type) : json_null());
    json_object_set_new(o, "role", json_string(wire_role_str(in->role)));
    json_object_set_new(
        o, "status", json_string(in->assembled ? wire_ins_status_str(in->status) : "assembling"));
    json_object_set_new(o, "parallel_config", wire_parallel_config_to_json(&in->pc));
    json_object_set_new(o, "nnodes", json_integer(in->nnodes));
    json_object_set_new(o, "master_dp_ip",
                        in->master_dp_ip ? json_string(in->master_dp_ip) : json_null());
    json_object_set_new(o, "reregistered", json_boolean(in->reregistered));
    json_object_set_new(o, "ever_ready", json_boolean(in->ever_ready));
    if (in->assembled) {
        json_object_set_new(o, "status_age_s",
                            json_real((double)(now - in->status_mono_ms) / 1000.0));
        json_object_set_new(o, "start_pending", json_boolean(in->start_pending));
        json_object_set_new(o, "withdrawn", json_boolean(in->withdrawn));
        json_object_set_new(o, "published", json_boolean(in->published));
        json_object_set_new(o, "routable", json_boolean(ctl_push_wanted(c, in)));
    }
    json_object_set_new(o, "ft_phase",
                        in->ft ? json_string(ctl_ft_phase_name(in->ft->phase)) : json_null());
    json_object_set_new(o, "strategy",
                        in->ft && in->strategy && in->ft->strategy ? json_string(in->ft->strategy)
                                                                   : json_null());
    json_object_set_new(o, "node_managers", nms);
    return o;
}

void ctl_api_instances(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    json_t *arr = json_array();
    for (size_t i = 0; i < c->n_insts; i++)
        json_array_append_new(arr, inst_view(c, c->insts[i]));
    json_t *pend = json_array();
    for (size_t i = 0; i < c->n_pending; i++)
        json_array_append_new(pend, inst_view(c, c->pending[i]));
    json_t *o = json_pack("{s:I, s:o, s:o, s:I}", "count", (json_int_t)c->n_insts, "instances", arr,
                          "assembling", pend, "next_id", (json_int_t)c->next_id);
    json_t *auth = ctl_auth_fails_json(c);
    if (auth)
        json_object_set_new(o, "node_manager_auth", auth);
    httpd_respond_json(req, 200, o);
}

/* ---- probes and metrics
 * ---------------------------------------------------------------------------- */

static void h_liveness(struct httpd_req *req, void *arg)
{
    (void)arg;
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s}", "status", "ok", "message", "Controller is alive"));
}

static void h_startup(struct httpd_req *req, void *arg)
{
    (void)arg;
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s}", "status", "ok", "message", "Controller started"));
}

static void h_readiness(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (c->leader && c->loaded) {
        httpd_respond_json(req, 200,
                           json_pack("{s:s, s:s, s:b, s:s}", "status", "ok", "message",
                                     "Controller is ready", "leader", 1, "owner", c->owner));
        return;
    }
    httpd_respond_json(
        req, 503,
        json_pack("{s:{s:s, s:s, s:s}}", "detail", "message", "Controller is not ready", "reason",
                  c->leader ? "loading state" : "standby", "leader", store_leader_owner(c->store)));
}

void ctl_api_metrics(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    struct strbuf sb;
    strbuf_init(&sb, 8u << 20);
    metrics_render(c->m.reg, &sb);
    size_t by_status[5] = {0};
    for (size_t i = 0; i < c->n_insts; i++)
        if ((unsigned)c->insts[i]->status < 5)
            by_status[c->insts[i]->status]++;
    strbuf_puts(&sb, "# HELP motor_controller_instances Instances by status.\n"
                     "# TYPE motor_controller_instances gauge\n");
    for (int s = 0; s < 5; s++)
        strbuf_appendf(&sb, "motor_controller_instances{status=\"%s\"} %zu\n",
                       wire_ins_status_str((enum wire_ins_status)s), by_status[s]);
    size_t nms = 0, eps = 0;
    for (size_t i = 0; i < c->n_insts; i++) {
        nms += c->insts[i]->n_nms;
        eps += ctl_inst_n_endpoints(c->insts[i]);
    }
    struct store_stats ss = {0};
    if (c->store)
        store_get_stats(c->store, &ss);
    strbuf_appendf(
        &sb,
        "# HELP motor_controller_assembling Instances being assembled.\n"
        "# TYPE motor_controller_assembling gauge\nmotor_controller_assembling %zu\n"
        "# HELP motor_controller_node_managers Node managers of assembled instances.\n"
        "# TYPE motor_controller_node_managers gauge\nmotor_controller_node_managers %zu\n"
        "# HELP motor_controller_endpoints Endpoints of assembled instances.\n"
        "# TYPE motor_controller_endpoints gauge\nmotor_controller_endpoints %zu\n"
        "# HELP motor_controller_leader 1 when this controller is the leader.\n"
        "# TYPE motor_controller_leader gauge\nmotor_controller_leader %d\n"
        "# HELP motor_controller_store_pending_writes Store writes queued or in flight.\n"
        "# TYPE motor_controller_store_pending_writes gauge\n"
        "motor_controller_store_pending_writes %zu\n"
        "# HELP motor_controller_store_writes_total Store writes applied.\n"
        "# TYPE motor_controller_store_writes_total counter\n"
        "motor_controller_store_writes_total %llu\n"
        "# HELP motor_controller_store_write_failures_total Store write attempts that failed.\n"
        "# TYPE motor_controller_store_write_failures_total counter\n"
        "motor_controller_store_write_failures_total %llu\n",
        c->n_pending, nms, eps, c->leader ? 1 : 0, c->store ? store_pending(c->store) : 0,
        (unsigned long long)ss.writes_ok, (unsigned long long)ss.writes_failed);
    if (sb.overflow) {
        strbuf_release(&sb);
        httpd_respond_error(req, 500, "metrics exposition too large");
        return;
    }
    httpd_respond(req, 200, METRICS_CONTENT_TYPE, strbuf_str(&sb), sb.len);
    strbuf_release(&sb);
}

void ctl_api_register_routes(struct ctl *c)
{
    struct httpd *h = c->httpd;
    httpd_route(h, "POST", "/controller/register", h_register, c, 0);
    httpd_route(h, "POST", "/controller/reregister", h_reregister, c, 0);
    httpd_route(h, "POST", "/controller/heartbeat", h_heartbeat, c, 0);
    httpd_route(h, "POST", "/controller/report_software_fault", h_fault, c, 0);
    httpd_route(h, "POST", "/controller/terminate_instance", h_terminate, c, 0);
    httpd_route(h, "POST", "/controller/check_instance", h_check, c, 0);
    httpd_route(h, "GET", "/controller/fault_tolerance/status", h_ft_status, c, 0);
    httpd_route(h, "GET", "/controller/instances", ctl_api_instances, c, 0);
    httpd_route(h, "GET", "/startup", h_startup, c, 0);
    httpd_route(h, "GET", "/readiness", h_readiness, c, 0);
    httpd_route(h, "GET", "/liveness", h_liveness, c, 0);
    httpd_route(h, "GET", "/metrics", ctl_api_metrics, c, 0);
    ctl_obs_register_routes(c);
    ctl_prec_register_routes(c);
}
