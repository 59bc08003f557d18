/* nm_scaledown — the DP scale-down proxy (§4, §8.3): the routes
 * /node-manager/fault-tolerance/{status,apply,guard,finalize}.
 *
 * Switch: nm_config ft.enable_dp_scale_down_proxy (= the Controller's
 * enable_fault_tolerance && enable_dp_scale_down).
 *   status    parse, switch (404), ids managed and not retired (502), then every engine
 *             queried concurrently; a failed query gives the poll_error entry. Entries
 *             also feed the FT manager's report dedup while it polls (nm_ft_feed_entry).
 *   apply     parse, switch, ids (502), the engine body (dp_store_port = dp_master_port
 *             + dp_master_rank, rank stripped), POST to every engine concurrently; all
 *             must answer 202, else 502 naming each failure.
 *   guard     switch first, then parse; another request id holding an unexpired guard
 *             => 502; else it owns the guard and suicide is frozen (NM_FREEZE_FT_GUARD)
 *             for the lease (the same id renews).
 *   finalize  parse, switch; a request id other than the guard owner => 502 (stale);
 *             commit: every retired id must be an endpoint of this pod (502 otherwise,
 *             nothing changed), then all are retired at once (nm_engine_retire: out of
 *             heartbeats, probes, arbitration, death reports; and out of FT polling,
 *             nm_ft_forget); then (commit or abort) the owner is cleared. Abort lifts the
 *             guard freeze at once; commit keeps it until no survivor is abnormal in the
 *             node manager's own view, bounded by the rest of the lease (at least one
 *             probe round plus one arbitration round): "settling", see
 *             commit_settle_begin.
 * status/apply answer asynchronously: the request is suspended until every engine
 * answered or timed out; a client that goes away cancels the fan-out. The fan-outs use
 * the FT manager's HTTP client (nm_ft_http). */
#include "nodemgr/nm_internal.h"

#include "common/list.h"
#include "common/log.h"
#include "common/util.h"
#include "wire/wire_ft.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct nm_scaledown {
    struct nodemgr *nm;
    char *guard_owner; /* request id owning the guard, NULL = none */
    char *last_finalized;
    /* After a commit the guard's freeze is kept until no survivor is abnormal in our own
     * view (or settle_until_ms): see commit_settle_begin. */
    bool settling;
    int64_t settle_until_ms;
    struct list_head calls; /* fan-outs in flight (struct ft_call) */
};

/* ---- fan-outs ------------------------------------------------------------------------ */

enum ft_kind { FT_STATUS = 0, FT_APPLY };

struct ft_call;

struct ft_sub {
    struct ft_call *call;
    int64_t id;
    struct httpc_req *hr;
    bool done;
    long status;
    json_t *entry; /* status: the engine's raw entry */
    char err[NM_FT_ERR_MAX];
};

struct ft_call {
    struct list_head link; /* in nm_scaledown.calls */
    struct nm_scaledown *sd;
    struct httpd_req *req;
    enum ft_kind kind;
    char *request_id;
    size_t n, pending;
    struct ft_sub subs[];
};

static void call_free(struct ft_call *c)
{
    list_remove(&c->link);
    for (size_t i = 0; i < c->n; i++) {
        if (c->subs[i].hr)
            httpc_cancel(nm_ft_http(c->sd->nm), c->subs[i].hr);
        json_decref(c->subs[i].entry);
    }
    free(c->request_id);
    free(c);
}

static void call_client_gone(struct httpd_req *req, void *arg)
{
    (void)req;
    struct ft_call *c = arg;
    log_info("ft_proxy_abandoned", LF_STR("op", c->kind == FT_STATUS ? "status" : "apply"),
             LF_INT("pending", c->pending));
    call_free(c);
}

static void call_finish(struct ft_call *c)
{
    struct nodemgr *nm = c->sd->nm;
    struct httpd_req *req = c->req;
    httpd_req_on_close(req, NULL, NULL);
    if (c->kind == FT_STATUS) {
        json_t *o = json_object();
        size_t failed = 0;
        for (size_t i = 0; i < c->n; i++) {
            struct ft_sub *s = &c->subs[i];
            char key[24];
            snprintf(key, sizeof(key), "%" PRId64, s->id);
            if (s->entry) {
                json_object_set(o, key, s->entry);
                /* §8.3: known statuses also feed the FT manager's report dedup. */
                nm_ft_feed_entry(nm, s->id, s->entry);
            } else {
                failed++;
                json_object_set_new(o, key, wire_ft_poll_error_entry(s->id, s->err));
            }
        }
        log_info("ft_proxy_status", LF_INT("endpoints", c->n), LF_INT("unknown", failed));
        httpd_respond_json(req, 200, o);
        call_free(c);
        return;
    }
    char msg[1024];
    size_t len = 0, bad = 0;
    msg[0] = '\0';
    for (size_t i = 0; i < c->n; i++) {
        struct ft_sub *s = &c->subs[i];
        if (s->status == 202)
            continue;
        bad++;
        if (len < sizeof(msg))
            len += (size_t)snprintf(msg + len, sizeof(msg) - len, "%sendpoint %" PRId64 ": %s",
                                    bad > 1 ? "; " : "", s->id, s->err);
    }
    if (bad) {
        log_warn("ft_proxy_apply_failed", LF_STR("request_id", c->request_id),
                 LF_INT("failed", bad), LF_STR("detail", msg));
        nm_respond_detail(req, 502, "Engine FT apply failed: %s", msg);
    } else {
        log_info("ft_proxy_apply_accepted", LF_STR("request_id", c->request_id),
                 LF_INT("endpoints", c->n));
        httpd_respond_json(req, 200, json_pack("{s:s}", "status", "accepted"));
    }
    call_free(c);
}

static void on_sub_done(const struct httpc_response *resp, void *arg)
{
    struct ft_sub *s = arg;
    struct ft_call *c = s->call;
    s->hr = NULL;
    s->done = true;
    s->status = resp->error ? 0 : resp->status;
    if (c->kind == FT_STATUS) {
        if (resp->error || resp->status != 200)
            nm_ft_resp_error_text(resp, s->err, sizeof(s->err));
        else
            s->entry = nm_ft_find_entry(resp, s->id, s->err, sizeof(s->err));
        if (s->entry) {
            struct wire_ft_engine_entry entry;
            struct wire_err err = {{0}};
            if (wire_ft_engine_entry_parse(s->entry, &entry, &err) < 0) {
                snprintf(s->err, sizeof(s->err), "bad status entry: %s", err.msg);
                json_decref(s->entry);
                s->entry = NULL;
            } else {
                wire_ft_engine_entry_release(&entry);
            }
        }
    } else if (resp->error || resp->status != 202) {
        nm_ft_resp_error_text(resp, s->err, sizeof(s->err));
    }
    if (--c->pending == 0)
        call_finish(c);
}

/* Managed, not retired, ids: 0, or -ERANGE with the reason in err. */
static int check_ids(struct nodemgr *nm, const int64_t *ids, size_t n, struct wire_err *err)
{
    for (size_t i = 0; i < n; i++) {
        struct nm_endpoint *e = nm_engine_find(nm, ids[i]);
        if (!e) {
            wire_err_set(err, "endpoint %" PRId64 " is not managed by this node manager", ids[i]);
            return -ERANGE;
        }
        if (nm_engine_retired(e)) {
            wire_err_set(err, "endpoint %" PRId64 " is retired", ids[i]);
            return -ERANGE;
        }
    }
    return 0;
}

/* Start a fan-out to ids; body NULL = GET status, else POST apply. Suspends req. */
static void fan_out(struct nm_scaledown *sd, struct httpd_req *req, enum ft_kind kind,
                    const int64_t *ids, size_t n, const char *body, const char *request_id)
{
    struct nodemgr *nm = sd->nm;
    struct ft_call *c = xcalloc(1, sizeof(*c) + n * sizeof(c->subs[0]));
    c->sd = sd;
    c->req = req;
    c->kind = kind;
    c->request_id = request_id ? xstrdup(request_id) : NULL;
    c->n = n;
    c->pending = n;
    list_insert_head(&sd->calls, &c->link);
    httpd_req_on_close(req, call_client_gone, c);
    static const char *const headers[] = {"Accept: application/json", NULL};
    for (size_t i = 0; i < n; i++) {
        struct ft_sub *s = &c->subs[i];
        s->call = c;
        s->id = ids[i];
        struct nm_endpoint *e = nm_engine_find(nm, ids[i]);
        char *url = nm_ft_endpoint_url(e, kind == FT_STATUS ? "/v1/fault_tolerance/status"
                                                            : "/v1/fault_tolerance/apply");
        struct httpc_tls tls;
        bool use_tls = nm_engine_client_tls(nm, &tls);
        struct httpc_opts o = {
            .method = kind == FT_STATUS ? "GET" : "POST",
            .url = url,
            .body = body,
            .headers = headers,
            .timeout_ms = nm_ft_poll_timeout_ms(nm),
            .max_response = NM_FT_MAX_RESPONSE,
            .tls = use_tls ? &tls : NULL,
        };
        s->hr = httpc_request(nm_ft_http(nm), &o, on_sub_done, s);
        free(url);
    }
}

/* ---- routes ---------------------------------------------------------------------------------- */

static bool proxy_on(const struct nodemgr *nm)
{
    return nm->cfg->ft.enable_dp_scale_down_proxy;
}

static void respond_disabled(struct httpd_req *req)
{
    httpd_respond_error(req, 404, "fault tolerance proxy disabled");
}

/* The body as JSON, or NULL after answering 400. */
static json_t *body_json(struct httpd_req *req)
{
    char jerr[200];
    json_t *j = httpd_req_json(req, jerr, sizeof(jerr));
    if (!j)
        nm_respond_detail(req, 400, "Invalid request body: %s", jerr);
    return j;
}

static void h_status(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_scaledown *sd = nm->scaledown;
    json_t *j = body_json(req);
    if (!j)
        return;
    struct wire_ft_status_req r;
    struct wire_err err = {{0}};
    int rc = wire_ft_status_req_parse(j, &r, &err);
    json_decref(j);
    if (rc == -EINVAL) {
        nm_respond_detail(req, 400, "Invalid request body: %s", err.msg);
        return;
    }
    if (!proxy_on(nm)) {
        wire_ft_status_req_release(&r);
        respond_disabled(req);
        return;
    }
    if (rc == 0)
        rc = check_ids(nm, r.endpoint_ids, r.n_endpoint_ids, &err);
    if (rc < 0) {
        log_warn("ft_proxy_status_rejected", LF_STR("why", err.msg));
        nm_respond_detail(req, 502, "Engine FT status query failed: %s", err.msg);
        wire_ft_status_req_release(&r);
        return;
    }
    fan_out(sd, req, FT_STATUS, r.endpoint_ids, r.n_endpoint_ids, NULL, NULL);
    wire_ft_status_req_release(&r);
}

static void h_apply(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_scaledown *sd = nm->scaledown;
    json_t *j = body_json(req);
    if (!j)
        return;
    struct wire_ft_apply_req r;
    struct wire_err err = {{0}};
    int rc = wire_ft_apply_req_parse(j, &r, &err);
    json_decref(j);
    if (rc == -EINVAL) {
        nm_respond_detail(req, 400, "Invalid request body: %s", err.msg);
        return;
    }
    if (!proxy_on(nm)) {
        wire_ft_apply_req_release(&r);
        respond_disabled(req);
        return;
    }
    if (rc == 0)
        rc = check_ids(nm, r.endpoint_ids, r.n_endpoint_ids, &err);
    json_t *body = rc == 0 ? wire_ft_apply_engine_body(&r, nm->cfg->dp_master_port, &err) : NULL;
    if (!body) {
        log_warn("ft_proxy_apply_rejected", LF_STR("why", err.msg));
        nm_respond_detail(req, 502, "Engine FT apply failed: %s", err.msg);
        wire_ft_apply_req_release(&r);
        return;
    }
    char *text = wire_json_compact(body);
    log_info("ft_proxy_apply", LF_STR("request_id", r.request_id),
             LF_STR("instruction", wire_ft_instruction_str(r.instruction)),
             LF_INT("endpoints", r.n_endpoint_ids), LF_RAW("body", text));
    json_decref(body);
    fan_out(sd, req, FT_APPLY, r.endpoint_ids, r.n_endpoint_ids, text, r.request_id);
    free(text);
    wire_ft_apply_req_release(&r);
}

static int64_t guard_left_ms(const struct nodemgr *nm)
{
    int64_t left = nm->arb.freeze_until[NM_FREEZE_FT_GUARD] - util_mono_ms();
    return left > 0 ? left : 0;
}

static void h_guard(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_scaledown *sd = nm->scaledown;
    if (!proxy_on(nm)) {
        respond_disabled(req);
        return;
    }
    json_t *j = body_json(req);
    if (!j)
        return;
    struct wire_ft_guard_req r;
    struct wire_err err = {{0}};
    int rc = wire_ft_guard_req_parse(j, &r, &err);
    json_decref(j);
    if (rc == -EINVAL) {
        nm_respond_detail(req, 400, "Invalid request body: %s", err.msg);
        return;
    }
    if (rc < 0) {
        log_warn("ft_guard_rejected", LF_STR("why", err.msg));
        nm_respond_detail(req, 502, "Engine FT guard failed: %s", err.msg);
        return;
    }
    int64_t left = guard_left_ms(nm);
    if (sd->guard_owner && left > 0 && strcmp(sd->guard_owner, r.request_id) != 0) {
        log_warn("ft_guard_rejected", LF_STR("request_id", r.request_id),
                 LF_STR("owner", sd->guard_owner), LF_INT("left_ms", left));
        nm_respond_detail(req, 502,
                          "Engine FT guard failed: transaction %.200s owns the guard for "
                          "another %.1f s",
                          sd->guard_owner, (double)left / 1000.0);
        wire_ft_guard_req_release(&r);
        return;
    }
    bool renew = sd->guard_owner && strcmp(sd->guard_owner, r.request_id) == 0;
    if (!renew && sd->guard_owner)
        log_info("ft_guard_expired_owner_replaced", LF_STR("previous", sd->guard_owner));
    free(sd->guard_owner);
    sd->guard_owner = r.request_id;
    r.request_id = NULL;
    /* A new transaction owns the freeze from now on; a commit still settling must not
     * lift it. */
    sd->settling = false;
    int64_t lease_ms = (int64_t)(r.lease_sec * 1000.0 + 0.5);
    nm_freeze(nm, NM_FREEZE_FT_GUARD, lease_ms < 1 ? 1 : lease_ms, "ft guard");
    log_info("ft_guarded", LF_STR("request_id", sd->guard_owner), LF_DBL("lease_sec", r.lease_sec),
             LF_BOOL("renewed", renew));
    wire_ft_guard_req_release(&r);
    httpd_respond_json(req, 200, json_pack("{s:s}", "status", "guarded"));
}

/* Any survivor (not retired, not waiting for a local restart: what arbitration counts)
 * abnormal in the node manager's own view. */
static bool survivor_abnormal(const struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        const struct nm_endpoint *e = nm->eps[i];
        if (!nm_engine_excluded(e) && e->status == WIRE_EP_ABNORMAL)
            return true;
    }
    return false;
}

/* The Controller commits once the survivors' FT status is healthy (§8.2 step 6), but our
 * endpoint statuses come from /health probes, which lag that by up to a probe round (and
 * a real engine's /health may lag its FT status): right after the commit the survivors
 * can still be `abnormal` here. Lifting the guard's freeze at once (upstream) lets the
 * next arbitration round report those recovering survivors as EngineDeadError, a bogus
 * second fault episode. So after a commit the guard's freeze stays until no survivor is
 * abnormal in our view (checked right before each arbitration round). It stays bounded
 * by the window the Controller asked for — what is left of the guard's lease, sized by
 * the Controller to cover the transaction including the survivors' recovery — and at
 * least what our view can lag (a probe period, the probe's timeout and retries, one
 * arbitration round); at the deadline arbitration counts the survivors again. The owner
 * is cleared at once: a new transaction may guard meanwhile and takes the freeze over.
 * Deaths (pidfd) and FT-poll faults are reported throughout, as before. */
static void commit_settle_begin(struct nm_scaledown *sd)
{
    struct nodemgr *nm = sd->nm;
    if (!survivor_abnormal(nm)) {
        sd->settling = false;
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft finalize commit");
        return;
    }
    const struct nm_health *h = &nm->cfg->health;
    int attempts = h->health_collector_timeout_retry_attempts > 0
                       ? h->health_collector_timeout_retry_attempts
                       : 1;
    /* The probes' attempts overlap, one per period (nm_engine.c, "probing"). */
    int64_t lag_ms = nm_probe_period_ms(nm) + (int64_t)h->health_collector_timeout * 1000 +
                     (int64_t)(attempts - 1) * nm_probe_period_ms(nm) +
                     nm_heartbeat_interval_ms(nm);
    int64_t left = guard_left_ms(nm);
    if (left < lag_ms)
        nm_freeze(nm, NM_FREEZE_FT_GUARD, lag_ms, "ft commit: survivors still recovering");
    sd->settling = true;
    sd->settle_until_ms = nm->arb.freeze_until[NM_FREEZE_FT_GUARD];
    log_info("ft_commit_settling", LF_INT("max_ms", left > lag_ms ? left : lag_ms),
             LF_STR("why", "survivors still abnormal in the node manager's view"));
}

static void h_finalize(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_scaledown *sd = nm->scaledown;
    json_t *j = body_json(req);
    if (!j)
        return;
    struct wire_ft_finalize_req r;
    struct wire_err err = {{0}};
    int rc = wire_ft_finalize_req_parse(j, &r, &err);
    json_decref(j);
    if (rc == -EINVAL) {
        nm_respond_detail(req, 400, "Invalid request body: %s", err.msg);
        return;
    }
    if (!proxy_on(nm)) {
        wire_ft_finalize_req_release(&r);
        respond_disabled(req);
        return;
    }
    if (rc == 0 && (!sd->guard_owner || strcmp(sd->guard_owner, r.request_id) != 0)) {
        wire_err_set(&err, "stale request id %.200s (guard owner: %.200s)", r.request_id,
                     sd->guard_owner ? sd->guard_owner : "none");
        rc = -ERANGE;
    }
    /* Commit: validate every id before retiring any (all or nothing). Already retired
     * ids are fine: a repeated commit is idempotent. */
    for (size_t i = 0; rc == 0 && r.commit && i < r.n_retired; i++) {
        if (!nm_engine_find(nm, r.retired_endpoint_ids[i])) {
            wire_err_set(&err, "endpoint %" PRId64 " is not managed by this node manager",
                         r.retired_endpoint_ids[i]);
            rc = -ERANGE;
        }
    }
    if (rc < 0) {
        log_warn("ft_finalize_rejected", LF_STR("why", err.msg));
        nm_respond_detail(req, 502, "Engine FT finalize failed: %s", err.msg);
        wire_ft_finalize_req_release(&r);
        return;
    }
    if (r.commit) {
        for (size_t i = 0; i < r.n_retired; i++)
            nm_ft_forget(nm, r.retired_endpoint_ids[i]);
        nm_engine_retire(nm, r.retired_endpoint_ids, r.n_retired);
    }
    json_t *ids = json_array();
    for (size_t i = 0; i < r.n_retired; i++)
        json_array_append_new(ids, json_integer((json_int_t)r.retired_endpoint_ids[i]));
    char *ids_text = wire_json_compact(ids);
    json_decref(ids);
    log_info(r.commit ? "ft_finalize_committed" : "ft_finalize_aborted",
             LF_STR("request_id", r.request_id), LF_RAW("retired_endpoint_ids", ids_text),
             LF_INT("dp_master_rank", r.has_dp_master_rank ? r.dp_master_rank : -1));
    free(ids_text);
    free(sd->last_finalized);
    sd->last_finalized = sd->guard_owner;
    sd->guard_owner = NULL;
    if (r.commit)
        commit_settle_begin(sd);
    else
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft finalize abort");
    httpd_respond_json(req, 200, json_pack("{s:s}", "status", r.commit ? "committed" : "aborted"));
    wire_ft_finalize_req_release(&r);
}

/* ---- the nm_scaledown_* contract ------------------------------------------------------------ */

int nm_scaledown_init(struct nodemgr *nm)
{
    struct nm_scaledown *sd = xcalloc(1, sizeof(*sd));
    sd->nm = nm;
    list_init(&sd->calls);
    nm->scaledown = sd;
    nm_route(nm, "POST", "/node-manager/fault-tolerance/status", h_status, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/apply", h_apply, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/guard", h_guard, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/finalize", h_finalize, nm,
             HTTPD_ROUTE_AUTH);
    return 0;
}

void nm_scaledown_free(struct nodemgr *nm)
{
    struct nm_scaledown *sd = nm->scaledown;
    if (!sd)
        return;
    /* Fan-outs still here lost their HTTP request with the server (httpd_free runs
     * their on_close first); whatever remains is only freed. */
    while (!list_empty(&sd->calls))
        call_free(list_entry(list_first(&sd->calls), struct ft_call, link));
    free(sd->guard_owner);
    free(sd->last_finalized);
    free(sd);
    nm->scaledown = NULL;
}

void nm_scaledown_endpoints_reset(struct nodemgr *nm)
{
    struct nm_scaledown *sd = nm->scaledown;
    /* A new start command begins a new story (arbitration resets on the generation). */
    if (sd && sd->settling) {
        sd->settling = false;
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "new start command");
    }
}

void nm_scaledown_before_arbitration(struct nodemgr *nm)
{
    struct nm_scaledown *sd = nm->scaledown;
    if (!sd || !sd->settling)
        return;
    if (!survivor_abnormal(nm)) {
        sd->settling = false;
        log_info("ft_commit_settled", LF_STR("why", "no survivor abnormal"));
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft commit: survivors recovered");
    } else if (util_mono_ms() >= sd->settle_until_ms) {
        /* The freeze ran out by itself: arbitration counts the survivors again. */
        sd->settling = false;
        log_warn("ft_commit_settle_expired",
                 LF_STR("why", "survivors still abnormal after the post-commit window"));
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft commit: post-commit window over");
    }
}

void nm_scaledown_state_json(struct nodemgr *nm, json_t *o)
{
    struct nm_scaledown *sd = nm->scaledown;
    json_object_set_new(o, "proxy_enabled", json_boolean(proxy_on(nm)));
    json_object_set_new(o, "guard_owner",
                        sd && sd->guard_owner ? json_string(sd->guard_owner) : json_null());
    json_object_set_new(o, "guard_left_seconds", json_real((double)guard_left_ms(nm) / 1000.0));
    json_object_set_new(o, "commit_settling", json_boolean(sd && sd->settling));
}
