/* nm_ft — the engine FT manager (§2.10) and the DP scale-down proxy (§4, §8.3).
 *
 * FT manager. Enabled when fault_tolerance_config.enable_fault_tolerance is on (the
 * config loader already ORs in "the engine advertises FT"). Polling starts only when
 * the engines of a start command became ready (nm_ft_engines_ready), pauses while a
 * relaunch takes the engines down and resumes with fresh per-endpoint state when they
 * are ready again. Every poll_interval_sec each eligible endpoint (not retired, not
 * headless, its process alive and past loading) gets `GET /v1/fault_tolerance/status`
 * (plain HTTP, poll_timeout_sec), all concurrently on the FT manager's own HTTP client;
 * an endpoint whose previous poll is still out is skipped. The endpoint's entry (id ==
 * endpoint id) goes through the nm_ft_track state machine: healthy => remembered;
 * anything else => reported once per status signature (POST
 * /controller/report_software_fault: engine_status healthy 0 / dead 1 / unhealthy 2,
 * exception_type fault_info / EngineDeadError / EngineUnhealthyError, the raw entry in
 * additional_info), remembered only once the Controller accepted it; max_poll_failures
 * consecutive failed polls => one EngineDeadError "unreachable"; max_consecutive_404
 * 404s => "unsupported", re-probed every unsupported_reprobe_interval_sec.
 * Engines whose process is gone are not polled: the pidfd already reported the death.
 *
 * Proxy (switch: nm_config ft.enable_dp_scale_down_proxy = Controller
 * enable_fault_tolerance && enable_dp_scale_down):
 *   status    parse, switch (404), ids managed and not retired (502), then every engine
 *             queried concurrently; a failed query gives the poll_error entry. Entries
 *             also feed the FT manager's report dedup while it polls.
 *   apply     parse, switch, ids (502), the engine body (dp_store_port = dp_master_port
 *             + dp_master_rank, rank stripped), POST to every engine concurrently; all
 *             must answer 202, else 502 naming each failure.
 *   guard     switch first, then parse; another request id holding an unexpired guard
 *             => 502; else it owns the guard and suicide is frozen (NM_FREEZE_FT_GUARD)
 *             for the lease (the same id renews).
 *   finalize  parse, switch; a request id other than the guard owner => 502 (stale);
 *             commit: every retired id must be an endpoint of this pod (502 otherwise,
 *             nothing changed), then all are retired at once (nm_engine_retire: out of
 *             heartbeats, probes, arbitration, death reports; and out of FT polling);
 *             then (commit or abort) the owner is cleared. Abort lifts the guard freeze
 *             at once; commit keeps it until no survivor is abnormal in the node
 *             manager's own view, bounded by the rest of the lease (at least one probe
 *             round plus one arbitration round): "settling", see commit_settle_begin.
 * status/apply answer asynchronously: the request is suspended until every engine
 * answered or timed out; a client that goes away cancels the fan-out.
 * GET /node-manager/fault-tolerance shows the manager's state (Motor addition). */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"
#include "wire/wire_ft.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FT_MAX_RESPONSE (1u << 20)
#define FT_MIN_POLL_MS 50
#define FT_EXCEPTION_TYPE_MAX 256
#define FT_ERR_MAX 600

/* ---- the pure part ------------------------------------------------------------------- */

enum wire_engine_status nm_ft_entry_engine_status(const struct wire_ft_engine_entry *e)
{
    switch (e->state) {
    case WIRE_FT_HEALTHY:
        return WIRE_ENGINE_HEALTHY;
    case WIRE_FT_DEAD:
        return WIRE_ENGINE_DEAD;
    default:
        /* unhealthy, and anything the engine invents: not healthy, not known dead. */
        return WIRE_ENGINE_UNHEALTHY;
    }
}

void nm_ft_entry_exception_type(const struct wire_ft_engine_entry *e, char *buf, size_t cap)
{
    if (!cap)
        return;
    if (e->state == WIRE_FT_DEAD) {
        snprintf(buf, cap, "EngineDeadError");
        return;
    }
    if (e->state != WIRE_FT_HEALTHY && e->fault_info) {
        if (json_is_string(e->fault_info) && json_string_length(e->fault_info) > 0) {
            snprintf(buf, cap, "%s", json_string_value(e->fault_info));
            return;
        }
        if (!json_is_string(e->fault_info)) {
            char *t = wire_json_compact(e->fault_info);
            snprintf(buf, cap, "%s", t);
            free(t);
            return;
        }
    }
    snprintf(buf, cap, "EngineUnhealthyError");
}

unsigned nm_ft_track_observe(struct nm_ft_track *t, enum nm_ft_event ev,
                             const struct wire_ft_engine_entry *entry, int max_failures,
                             int max_404, char **sig_out)
{
    unsigned out = 0;
    if (sig_out)
        *sig_out = NULL;
    switch (ev) {
    case NM_FT_EV_OK: {
        t->failures = 0;
        t->n404 = 0;
        t->unreachable_reported = false;
        if (t->unsupported) {
            t->unsupported = false;
            out |= NM_FT_NOW_SUPPORTED;
        }
        if (!entry)
            break;
        char *sig = wire_ft_engine_entry_signature(entry);
        if (entry->state == WIRE_FT_HEALTHY) {
            free(t->sig);
            t->sig = sig;
        } else if (t->sig && strcmp(t->sig, sig) == 0) {
            free(sig); /* this very status was delivered already */
        } else if (sig_out) {
            *sig_out = sig;
            out |= NM_FT_REPORT_STATUS;
        } else {
            free(sig);
            out |= NM_FT_REPORT_STATUS;
        }
        break;
    }
    case NM_FT_EV_NOT_FOUND:
        t->failures = 0;
        t->n404++;
        if (!t->unsupported && t->n404 >= (max_404 > 0 ? max_404 : 1)) {
            t->unsupported = true;
            out |= NM_FT_NOW_UNSUPPORTED;
        }
        break;
    case NM_FT_EV_FAILED:
        t->n404 = 0;
        t->failures++;
        if (t->failures >= (max_failures > 0 ? max_failures : 1) && !t->unreachable_reported)
            out |= NM_FT_REPORT_UNREACHABLE;
        break;
    }
    return out;
}

void nm_ft_track_delivered(struct nm_ft_track *t, bool unreachable, char *sig)
{
    if (unreachable) {
        t->unreachable_reported = true;
        free(sig);
        return;
    }
    if (sig) {
        free(t->sig);
        t->sig = sig;
    }
}

void nm_ft_track_release(struct nm_ft_track *t)
{
    if (!t)
        return;
    free(t->sig);
    memset(t, 0, sizeof(*t));
}

/* ---- state ------------------------------------------------------------------------------ */

struct ft_poll;

struct ft_ep {
    int64_t id;
    struct nm_ft_track track;
    struct httpc_req *poll; /* poll in flight */
    struct ft_poll *poll_ctx;
    int64_t reprobe_at_ms; /* unsupported: next probe */
    bool report_inflight;
    uint64_t polls;
};

struct ft_call;

struct nm_ft {
    struct nodemgr *nm;
    struct httpc *http;
    bool started; /* the engines of the current start command became ready */
    bool paused;  /* a relaunch took them down */
    bool stopped; /* shutdown */
    bool polling;
    struct reactor_timer poll_timer;
    uint64_t epoch; /* bumped whenever per-endpoint state is dropped */
    struct ft_ep *eps;
    size_t n_eps, cap_eps;
    char *guard_owner; /* request id owning the guard, NULL = none */
    char *last_finalized;
    /* After a commit the guard's freeze is kept until no survivor is abnormal in our own
     * view (or settle_until_ms): see commit_settle_begin. */
    bool settling;
    int64_t settle_until_ms;
    struct ft_call *calls; /* proxy fan-outs in flight */

    struct metrics_counter *polls_ok, *polls_failed, *polls_404;
    struct metrics_counter *reports_accepted, *reports_not_accepted;
};

static bool ft_enabled(const struct nodemgr *nm)
{
    return nm->cfg->ft.enable_fault_tolerance && nm->has_engine;
}

static int64_t poll_interval_ms(const struct nodemgr *nm)
{
    int64_t ms = nm_config_ms(nm->cfg->ft.poll_interval_sec);
    return ms < FT_MIN_POLL_MS ? FT_MIN_POLL_MS : ms;
}

static int64_t poll_timeout_ms(const struct nodemgr *nm)
{
    int64_t ms = nm_config_ms(nm->cfg->ft.poll_timeout_sec);
    return ms < 1 ? 1 : ms;
}

static struct ft_ep *ep_find(struct nm_ft *ft, int64_t id)
{
    for (size_t i = 0; i < ft->n_eps; i++)
        if (ft->eps[i].id == id)
            return &ft->eps[i];
    return NULL;
}

static struct ft_ep *ep_get(struct nm_ft *ft, int64_t id)
{
    struct ft_ep *fe = ep_find(ft, id);
    if (fe)
        return fe;
    if (ft->n_eps == ft->cap_eps) {
        /* Polls in flight point at their context, not at the array: growing is safe. */
        ft->cap_eps = ft->cap_eps ? ft->cap_eps * 2 : 8;
        ft->eps = xrealloc(ft->eps, ft->cap_eps * sizeof(*ft->eps));
    }
    fe = &ft->eps[ft->n_eps++];
    memset(fe, 0, sizeof(*fe));
    fe->id = id;
    return fe;
}

struct ft_poll {
    struct nodemgr *nm;
    int64_t id;
    uint64_t epoch;
};

static void poll_cancel(struct nm_ft *ft, struct ft_ep *fe)
{
    if (fe->poll) {
        httpc_cancel(ft->http, fe->poll);
        fe->poll = NULL;
    }
    free(fe->poll_ctx);
    fe->poll_ctx = NULL;
}

static void cancel_all_polls(struct nm_ft *ft)
{
    for (size_t i = 0; i < ft->n_eps; i++)
        poll_cancel(ft, &ft->eps[i]);
}

/* Forget every endpoint's bookkeeping (new start, resume after a relaunch). Reports in
 * flight find nothing when they come back (epoch). */
static void drop_state(struct nm_ft *ft)
{
    cancel_all_polls(ft);
    for (size_t i = 0; i < ft->n_eps; i++)
        nm_ft_track_release(&ft->eps[i].track);
    ft->n_eps = 0;
    ft->epoch++;
}

static void drop_endpoint(struct nm_ft *ft, int64_t id)
{
    struct ft_ep *fe = ep_find(ft, id);
    if (!fe)
        return;
    poll_cancel(ft, fe);
    nm_ft_track_release(&fe->track);
    size_t i = (size_t)(fe - ft->eps);
    memmove(&ft->eps[i], &ft->eps[i + 1], (ft->n_eps - i - 1) * sizeof(*ft->eps));
    ft->n_eps--;
}

static char *endpoint_url(const struct nm_endpoint *e, const char *path)
{
    bool v6 = strchr(e->ep.ip, ':') != NULL;
    return xasprintf("http://%s%s%s:%d%s", v6 ? "[" : "", e->ep.ip, v6 ? "]" : "",
                     wire_endpoint_port(&e->ep), path);
}

static void resp_error_text(const struct httpc_response *resp, char *buf, size_t cap)
{
    if (resp->error)
        snprintf(buf, cap, "%s",
                 resp->error_text && *resp->error_text ? resp->error_text : strerror(-resp->error));
    else
        snprintf(buf, cap, "http %ld: %.200s", resp->status, resp->body ? resp->body : "");
}

/* The endpoint's raw entry in an engine's status reply (new reference), or NULL with
 * the reason in why. */
static json_t *find_entry(const struct httpc_response *resp, int64_t id, char *why, size_t cap)
{
    json_error_t jerr;
    json_t *j = json_loadb(resp->body, resp->body_len, 0, &jerr);
    if (!j) {
        snprintf(why, cap, "status reply is not JSON: %s", jerr.text);
        return NULL;
    }
    json_t *arr = json_object_get(j, "engines");
    if (!json_is_array(arr)) {
        snprintf(why, cap, "status reply has no \"engines\" list");
        json_decref(j);
        return NULL;
    }
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        json_t *vid = json_object_get(v, "id");
        if (json_is_integer(vid) && json_integer_value(vid) == id) {
            json_incref(v);
            json_decref(j);
            return v;
        }
    }
    snprintf(why, cap, "status reply has no entry with id %" PRId64, id);
    json_decref(j);
    return NULL;
}

/* ---- reports ------------------------------------------------------------------------------ */

struct ft_report {
    int64_t id;
    uint64_t epoch;
    bool unreachable;
    char *sig; /* status reports: the signature delivered on acceptance */
};

static void report_free(void *p)
{
    struct ft_report *x = p;
    if (!x)
        return;
    free(x->sig);
    free(x);
}

static void on_report_done(struct nodemgr *nm, bool accepted, void *arg)
{
    struct ft_report *x = arg;
    struct nm_ft *ft = nm->ft;
    struct ft_ep *fe = ft && x->epoch == ft->epoch ? ep_find(ft, x->id) : NULL;
    if (ft)
        metrics_counter_inc(accepted ? ft->reports_accepted : ft->reports_not_accepted);
    if (fe) {
        fe->report_inflight = false;
        if (accepted) {
            nm_ft_track_delivered(&fe->track, x->unreachable, x->sig);
            x->sig = NULL;
        }
    }
    report_free(x);
}

/* Send one report. With no Controller (standalone) the log line is the report and the
 * status counts as delivered (nobody will ever accept it). */
static void send_report(struct nm_ft *ft, struct nm_endpoint *e, struct ft_ep *fe,
                        enum wire_engine_status status, const char *type, const char *message,
                        json_t *info, char *sig, bool unreachable)
{
    struct nodemgr *nm = ft->nm;
    log_warn("ft_fault_reporting", LF_INT("endpoint_id", e->ep.id), LF_STR("exception_type", type),
             LF_INT("engine_status", (int)status), LF_STR("message", message),
             LF_BOOL("controller", nm->ctrl.enabled));
    if (!nm->ctrl.enabled) {
        nm_ft_track_delivered(&fe->track, unreachable, sig);
        json_decref(info);
        return;
    }
    struct ft_report *x = xcalloc(1, sizeof(*x));
    x->id = e->ep.id;
    x->epoch = ft->epoch;
    x->unreachable = unreachable;
    x->sig = sig;
    struct wire_fault_report rep = {0};
    rep.exception_type = xstrdup(type);
    rep.exception_message = xstrdup(message);
    rep.engine_id = e->ep.id;
    rep.engine_status = status;
    rep.pod_ip = xstrdup(nm->cfg->pod_ip);
    if (nm->launch) {
        rep.has_instance_id = true;
        rep.instance_id = nm->launch->instance_id;
    }
    rep.node_manager_port = nm->api_port;
    rep.additional_info = info;
    fe->report_inflight = true;
    nm_ctrl_report_fault(nm, &rep, on_report_done, x, report_free);
}

static void report_entry(struct nm_ft *ft, struct nm_endpoint *e, struct ft_ep *fe,
                         const struct wire_ft_engine_entry *entry, json_t *raw, char *sig)
{
    char type[FT_EXCEPTION_TYPE_MAX];
    nm_ft_entry_exception_type(entry, type, sizeof(type));
    enum wire_engine_status st = nm_ft_entry_engine_status(entry);
    char msg[512];
    char *fi = entry->fault_info ? wire_json_compact(entry->fault_info) : NULL;
    snprintf(msg, sizeof(msg), "engine FT status of endpoint %lld: %s%s%s%s%s", (long long)e->ep.id,
             entry->status, entry->ft_state ? "/" : "", entry->ft_state ? entry->ft_state : "",
             fi ? ", fault_info " : "", fi ? fi : "");
    free(fi);
    json_t *info = json_object();
    json_object_set_new(info, "source", json_string("ft_poll"));
    json_object_set_new(info, "ft_entry", json_deep_copy(raw));
    json_object_set_new(info, "status", json_string(entry->status));
    json_object_set_new(info, "fault_info",
                        entry->fault_info ? json_deep_copy(entry->fault_info) : json_null());
    json_object_set_new(info, "ft_state",
                        entry->ft_state ? json_string(entry->ft_state) : json_null());
    json_object_set_new(info, "last_ft_request_id",
                        entry->last_ft_request_id ? json_string(entry->last_ft_request_id)
                                                  : json_null());
    json_object_set_new(info, "ft_error",
                        entry->ft_error ? json_deep_copy(entry->ft_error) : json_null());
    json_object_set_new(info, "mask", entry->mask ? json_deep_copy(entry->mask) : json_null());
    send_report(ft, e, fe, st, type, msg, info, sig, false);
}

static void report_unreachable(struct nm_ft *ft, struct nm_endpoint *e, struct ft_ep *fe,
                               const char *why)
{
    char msg[FT_ERR_MAX + 128];
    snprintf(msg, sizeof(msg),
             "engine FT status of endpoint %lld unreachable after %d consecutive polls: %s",
             (long long)e->ep.id, fe->track.failures, why);
    json_t *info = json_pack("{s:s, s:i, s:s, s:i}", "source", "ft_poll", "consecutive_failures",
                             fe->track.failures, "error", why, "pid", (int)e->pid);
    send_report(ft, e, fe, WIRE_ENGINE_DEAD, "EngineDeadError", msg, info, NULL, true);
}

/* One observed outcome for endpoint e (poll or proxy query). entry/raw for EV_OK. */
static void observe(struct nm_ft *ft, struct nm_endpoint *e, struct ft_ep *fe, enum nm_ft_event ev,
                    const struct wire_ft_engine_entry *entry, json_t *raw, const char *why)
{
    struct nodemgr *nm = ft->nm;
    const struct nm_ft_config *fc = &nm->cfg->ft;
    char *sig = NULL;
    unsigned act = nm_ft_track_observe(&fe->track, ev, entry, fc->max_poll_failures,
                                       fc->max_consecutive_404, &sig);
    if (act & NM_FT_NOW_SUPPORTED)
        log_info("ft_supported", LF_INT("endpoint_id", e->ep.id));
    if (act & NM_FT_NOW_UNSUPPORTED)
        log_warn("ft_unsupported", LF_INT("endpoint_id", e->ep.id),
                 LF_INT("consecutive_404", fe->track.n404),
                 LF_DBL("reprobe_interval_sec", fc->unsupported_reprobe_interval_sec));
    if (ev == NM_FT_EV_FAILED && fe->track.failures == 1)
        log_warn("ft_poll_failed", LF_INT("endpoint_id", e->ep.id), LF_STR("error", why));
    if (nm->shutting_down || fe->report_inflight) {
        /* The answer to the report in flight decides; the next poll sees again. */
        free(sig);
        return;
    }
    if (act & NM_FT_REPORT_STATUS)
        report_entry(ft, e, fe, entry, raw, sig);
    else
        free(sig);
    if (act & NM_FT_REPORT_UNREACHABLE)
        report_unreachable(ft, e, fe, why ? why : "");
}

/* Is the manager polling (and so interested in statuses)? */
static bool ft_active(const struct nm_ft *ft)
{
    return ft->polling;
}

/* ---- polling ----------------------------------------------------------------------------- */

static void on_poll_done(const struct httpc_response *resp, void *arg)
{
    struct ft_poll *ctx = arg;
    struct nodemgr *nm = ctx->nm;
    struct nm_ft *ft = nm->ft;
    struct ft_ep *fe = ft && ctx->epoch == ft->epoch ? ep_find(ft, ctx->id) : NULL;
    if (!fe || fe->poll_ctx != ctx) {
        free(ctx);
        return;
    }
    fe->poll = NULL;
    fe->poll_ctx = NULL;
    int64_t id = ctx->id;
    free(ctx);
    fe->polls++;
    struct nm_endpoint *e = nm_engine_find(nm, id);
    if (!e || e->retired || !ft_active(ft))
        return;
    char why[FT_ERR_MAX];
    if (resp->error == 0 && resp->status == 404) {
        metrics_counter_inc(ft->polls_404);
        observe(ft, e, fe, NM_FT_EV_NOT_FOUND, NULL, NULL, "http 404");
        if (fe->track.unsupported)
            fe->reprobe_at_ms =
                util_mono_ms() + nm_config_ms(nm->cfg->ft.unsupported_reprobe_interval_sec);
        return;
    }
    if (resp->error || resp->status != 200) {
        metrics_counter_inc(ft->polls_failed);
        resp_error_text(resp, why, sizeof(why));
        observe(ft, e, fe, NM_FT_EV_FAILED, NULL, NULL, why);
        return;
    }
    json_t *raw = find_entry(resp, id, why, sizeof(why));
    struct wire_ft_engine_entry entry;
    struct wire_err err = {{0}};
    if (raw && wire_ft_engine_entry_parse(raw, &entry, &err) < 0) {
        snprintf(why, sizeof(why), "bad status entry: %s", err.msg);
        json_decref(raw);
        raw = NULL;
    }
    if (!raw) {
        metrics_counter_inc(ft->polls_failed);
        observe(ft, e, fe, NM_FT_EV_FAILED, NULL, NULL, why);
        return;
    }
    metrics_counter_inc(ft->polls_ok);
    observe(ft, e, fe, NM_FT_EV_OK, &entry, raw, NULL);
    wire_ft_engine_entry_release(&entry);
    json_decref(raw);
}

/* Worth polling: its process runs and is past loading (a loading or restarting engine
 * refuses connections, which is not an FT fault). */
static bool pollable(const struct nm_endpoint *e)
{
    if (e->retired || e->ep.headless || !e->proc || !proc_running(e->proc))
        return false;
    return e->rt == NM_RT_READY || e->rt == NM_RT_UNHEALTHY;
}

static void poll_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nm_ft *ft = arg;
    struct nodemgr *nm = ft->nm;
    if (!ft->polling)
        return;
    int64_t now = util_mono_ms();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (!pollable(e))
            continue;
        struct ft_ep *fe = ep_get(ft, e->ep.id);
        if (fe->poll || (fe->track.unsupported && now < fe->reprobe_at_ms))
            continue;
        char *url = endpoint_url(e, "/v1/fault_tolerance/status");
        struct ft_poll *ctx = xcalloc(1, sizeof(*ctx));
        ctx->nm = nm;
        ctx->id = e->ep.id;
        ctx->epoch = ft->epoch;
        static const char *const headers[] = {"Accept: application/json", NULL};
        struct httpc_opts o = {
            .method = "GET",
            .url = url,
            .headers = headers,
            .timeout_ms = poll_timeout_ms(nm),
            .max_response = FT_MAX_RESPONSE,
        };
        fe->poll_ctx = ctx;
        fe->poll = httpc_request(ft->http, &o, on_poll_done, ctx);
        free(url);
    }
}

/* Bring polling in line with the state: on iff enabled, started, not paused, not
 * stopped. Reschedules on an interval change. */
static void ft_update(struct nm_ft *ft, const char *cause)
{
    struct nodemgr *nm = ft->nm;
    bool want = ft_enabled(nm) && ft->started && !ft->paused && !ft->stopped && !nm->shutting_down;
    if (want) {
        int64_t iv = poll_interval_ms(nm);
        if (!ft->polling) {
            ft->polling = true;
            reactor_timer_start(nm->r, &ft->poll_timer, 0, iv);
            log_info("ft_polling_started", LF_STR("cause", cause), LF_INT("interval_ms", iv),
                     LF_INT("timeout_ms", poll_timeout_ms(nm)),
                     LF_INT("max_poll_failures", nm->cfg->ft.max_poll_failures),
                     LF_INT("max_consecutive_404", nm->cfg->ft.max_consecutive_404));
        } else if (ft->poll_timer.interval_ms != iv) {
            reactor_timer_start(nm->r, &ft->poll_timer, iv, iv);
            log_info("ft_poll_interval_changed", LF_INT("interval_ms", iv));
        }
        return;
    }
    if (ft->polling) {
        ft->polling = false;
        reactor_timer_stop(nm->r, &ft->poll_timer);
        cancel_all_polls(ft);
        log_info("ft_polling_stopped", LF_STR("cause", cause));
    }
}

/* ---- proxy fan-outs ------------------------------------------------------------------------ */

enum ft_kind { FT_STATUS = 0, FT_APPLY };

struct ft_sub {
    struct ft_call *call;
    int64_t id;
    struct httpc_req *hr;
    bool done;
    long status;
    json_t *entry; /* status: the engine's raw entry */
    char err[FT_ERR_MAX];
};

struct ft_call {
    struct ft_call *next, **pprev;
    struct nm_ft *ft;
    struct httpd_req *req;
    enum ft_kind kind;
    char *request_id;
    size_t n, pending;
    struct ft_sub subs[];
};

static void call_unlink(struct ft_call *c)
{
    if (c->pprev) {
        *c->pprev = c->next;
        if (c->next)
            c->next->pprev = c->pprev;
        c->pprev = NULL;
    }
}

static void call_free(struct ft_call *c)
{
    call_unlink(c);
    for (size_t i = 0; i < c->n; i++) {
        if (c->subs[i].hr)
            httpc_cancel(c->ft->http, c->subs[i].hr);
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

static void status_feed(struct nm_ft *ft, struct ft_sub *s)
{
    /* §8.3: known statuses also feed the normal fault-report dedup. */
    if (!ft_active(ft) || !s->entry)
        return;
    struct nm_endpoint *e = nm_engine_find(ft->nm, s->id);
    if (!e || e->retired)
        return;
    struct wire_ft_engine_entry entry;
    struct wire_err err = {{0}};
    if (wire_ft_engine_entry_parse(s->entry, &entry, &err) < 0)
        return;
    observe(ft, e, ep_get(ft, s->id), NM_FT_EV_OK, &entry, s->entry, NULL);
    wire_ft_engine_entry_release(&entry);
}

static void call_finish(struct ft_call *c)
{
    struct nm_ft *ft = c->ft;
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
                status_feed(ft, s);
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
            resp_error_text(resp, s->err, sizeof(s->err));
        else
            s->entry = find_entry(resp, s->id, s->err, sizeof(s->err));
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
        resp_error_text(resp, s->err, sizeof(s->err));
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
        if (e->retired) {
            wire_err_set(err, "endpoint %" PRId64 " is retired", ids[i]);
            return -ERANGE;
        }
    }
    return 0;
}

/* Start a fan-out to ids; body NULL = GET status, else POST apply. Suspends req. */
static void fan_out(struct nm_ft *ft, struct httpd_req *req, enum ft_kind kind, const int64_t *ids,
                    size_t n, const char *body, const char *request_id)
{
    struct nodemgr *nm = ft->nm;
    struct ft_call *c = xcalloc(1, sizeof(*c) + n * sizeof(c->subs[0]));
    c->ft = ft;
    c->req = req;
    c->kind = kind;
    c->request_id = request_id ? xstrdup(request_id) : NULL;
    c->n = n;
    c->pending = n;
    c->next = ft->calls;
    if (c->next)
        c->next->pprev = &c->next;
    c->pprev = &ft->calls;
    ft->calls = c;
    httpd_req_on_close(req, call_client_gone, c);
    static const char *const headers[] = {"Accept: application/json", NULL};
    for (size_t i = 0; i < n; i++) {
        struct ft_sub *s = &c->subs[i];
        s->call = c;
        s->id = ids[i];
        struct nm_endpoint *e = nm_engine_find(nm, ids[i]);
        char *url = endpoint_url(e, kind == FT_STATUS ? "/v1/fault_tolerance/status"
                                                      : "/v1/fault_tolerance/apply");
        struct httpc_opts o = {
            .method = kind == FT_STATUS ? "GET" : "POST",
            .url = url,
            .body = body,
            .headers = headers,
            .timeout_ms = poll_timeout_ms(nm),
            .max_response = FT_MAX_RESPONSE,
        };
        s->hr = httpc_request(ft->http, &o, on_sub_done, s);
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
    struct nm_ft *ft = nm->ft;
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
    fan_out(ft, req, FT_STATUS, r.endpoint_ids, r.n_endpoint_ids, NULL, NULL);
    wire_ft_status_req_release(&r);
}

static void h_apply(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_ft *ft = nm->ft;
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
    fan_out(ft, req, FT_APPLY, r.endpoint_ids, r.n_endpoint_ids, text, r.request_id);
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
    struct nm_ft *ft = nm->ft;
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
    if (ft->guard_owner && left > 0 && strcmp(ft->guard_owner, r.request_id) != 0) {
        log_warn("ft_guard_rejected", LF_STR("request_id", r.request_id),
                 LF_STR("owner", ft->guard_owner), LF_INT("left_ms", left));
        nm_respond_detail(req, 502,
                          "Engine FT guard failed: transaction %.200s owns the guard for "
                          "another %.1f s",
                          ft->guard_owner, (double)left / 1000.0);
        wire_ft_guard_req_release(&r);
        return;
    }
    bool renew = ft->guard_owner && strcmp(ft->guard_owner, r.request_id) == 0;
    if (!renew && ft->guard_owner)
        log_info("ft_guard_expired_owner_replaced", LF_STR("previous", ft->guard_owner));
    free(ft->guard_owner);
    ft->guard_owner = r.request_id;
    r.request_id = NULL;
    /* A new transaction owns the freeze from now on; a commit still settling must not
     * lift it. */
    ft->settling = false;
    int64_t lease_ms = (int64_t)(r.lease_sec * 1000.0 + 0.5);
    nm_freeze(nm, NM_FREEZE_FT_GUARD, lease_ms < 1 ? 1 : lease_ms, "ft guard");
    log_info("ft_guarded", LF_STR("request_id", ft->guard_owner), LF_DBL("lease_sec", r.lease_sec),
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
        if (!e->retired && !e->restart_pending && e->status == WIRE_EP_ABNORMAL)
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
static void commit_settle_begin(struct nm_ft *ft)
{
    struct nodemgr *nm = ft->nm;
    if (!survivor_abnormal(nm)) {
        ft->settling = false;
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft finalize commit");
        return;
    }
    const struct nm_health *h = &nm->cfg->health;
    int attempts = h->health_collector_timeout_retry_attempts > 0
                       ? h->health_collector_timeout_retry_attempts
                       : 1;
    int64_t lag_ms = nm_probe_period_ms(nm) +
                     (int64_t)h->health_collector_timeout * 1000 * attempts +
                     nm_heartbeat_interval_ms(nm);
    int64_t left = guard_left_ms(nm);
    if (left < lag_ms)
        nm_freeze(nm, NM_FREEZE_FT_GUARD, lag_ms, "ft commit: survivors still recovering");
    ft->settling = true;
    ft->settle_until_ms = nm->arb.freeze_until[NM_FREEZE_FT_GUARD];
    log_info("ft_commit_settling", LF_INT("max_ms", left > lag_ms ? left : lag_ms),
             LF_STR("why", "survivors still abnormal in the node manager's view"));
}

static void h_finalize(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_ft *ft = nm->ft;
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
    if (rc == 0 && (!ft->guard_owner || strcmp(ft->guard_owner, r.request_id) != 0)) {
        wire_err_set(&err, "stale request id %.200s (guard owner: %.200s)", r.request_id,
                     ft->guard_owner ? ft->guard_owner : "none");
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
            drop_endpoint(ft, r.retired_endpoint_ids[i]);
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
    free(ft->last_finalized);
    ft->last_finalized = ft->guard_owner;
    ft->guard_owner = NULL;
    if (r.commit)
        commit_settle_begin(ft);
    else
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft finalize abort");
    httpd_respond_json(req, 200, json_pack("{s:s}", "status", r.commit ? "committed" : "aborted"));
    wire_ft_finalize_req_release(&r);
}

static void h_state(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_ft *ft = nm->ft;
    int64_t now = util_mono_ms();
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(ft_enabled(nm)));
    json_object_set_new(o, "polling", json_boolean(ft->polling));
    json_object_set_new(o, "started", json_boolean(ft->started));
    json_object_set_new(o, "paused", json_boolean(ft->paused));
    json_object_set_new(o, "proxy_enabled", json_boolean(proxy_on(nm)));
    json_object_set_new(o, "guard_owner",
                        ft->guard_owner ? json_string(ft->guard_owner) : json_null());
    json_object_set_new(o, "guard_left_seconds", json_real((double)guard_left_ms(nm) / 1000.0));
    json_object_set_new(o, "commit_settling", json_boolean(ft->settling));
    json_t *eps = json_array();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        struct ft_ep *fe = ep_find(ft, e->ep.id);
        json_t *x = json_pack("{s:I, s:b}", "id", (json_int_t)e->ep.id, "retired", e->retired);
        json_object_set_new(x, "polls", json_integer(fe ? (json_int_t)fe->polls : 0));
        json_object_set_new(x, "consecutive_failures", json_integer(fe ? fe->track.failures : 0));
        json_object_set_new(x, "consecutive_404", json_integer(fe ? fe->track.n404 : 0));
        json_object_set_new(x, "unsupported", json_boolean(fe && fe->track.unsupported));
        json_object_set_new(x, "reprobe_in_seconds",
                            fe && fe->track.unsupported
                                ? json_real((double)(fe->reprobe_at_ms - now) / 1000.0)
                                : json_null());
        json_t *sig = NULL;
        if (fe && fe->track.sig)
            sig = json_loads(fe->track.sig, 0, NULL);
        json_object_set_new(x, "last_signature", sig ? sig : json_null());
        json_object_set_new(x, "report_inflight", json_boolean(fe && fe->report_inflight));
        json_array_append_new(eps, x);
    }
    json_object_set_new(o, "endpoints", eps);
    httpd_respond_json(req, 200, o);
}

/* ---- the nm_ft_* contract ------------------------------------------------------------------- */

int nm_ft_init(struct nodemgr *nm)
{
    struct nm_ft *ft = xcalloc(1, sizeof(*ft));
    ft->nm = nm;
    ft->http = httpc_new(nm->r);
    if (!ft->http) {
        log_error("ft_http_client_failed");
        free(ft);
        return -ENOMEM;
    }
    reactor_timer_init(&ft->poll_timer, poll_tick, ft);
    struct metrics_family *pf = metrics_counter_family(
        nm->m.reg, "motor_nm_ft_polls_total",
        "Engine FT status polls (GET /v1/fault_tolerance/status), by result.", "result");
    ft->polls_ok = metrics_counter_labels(pf, "result", "ok");
    ft->polls_failed = metrics_counter_labels(pf, "result", "failed");
    ft->polls_404 = metrics_counter_labels(pf, "result", "not_found");
    struct metrics_family *rf = metrics_counter_family(
        nm->m.reg, "motor_nm_ft_reports_total",
        "Fault reports sent by the FT manager, by the Controller's answer.", "result");
    ft->reports_accepted = metrics_counter_labels(rf, "result", "accepted");
    ft->reports_not_accepted = metrics_counter_labels(rf, "result", "not_accepted");
    nm->ft = ft;
    nm_route(nm, "POST", "/node-manager/fault-tolerance/status", h_status, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/apply", h_apply, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/guard", h_guard, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/fault-tolerance/finalize", h_finalize, nm,
             HTTPD_ROUTE_AUTH);
    nm_route(nm, "GET", "/node-manager/fault-tolerance", h_state, nm, 0);
    return 0;
}

void nm_ft_free(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    reactor_timer_stop(nm->r, &ft->poll_timer);
    /* Fan-outs still here lost their HTTP request with the server (httpd_free runs
     * their on_close first); whatever remains is only freed. */
    while (ft->calls)
        call_free(ft->calls);
    drop_state(ft);
    free(ft->eps);
    httpc_free(ft->http);
    free(ft->guard_owner);
    free(ft->last_finalized);
    free(ft);
    nm->ft = NULL;
}

void nm_ft_engines_ready(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    ft->started = true;
    if (!ft_enabled(nm))
        log_debug("ft_polling_disabled",
                  LF_STR("why", "fault_tolerance_config.enable_fault_tolerance is off and "
                                "the engine does not advertise FT"));
    ft_update(ft, "engines ready");
}

void nm_ft_pause(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    ft->paused = true;
    ft_update(ft, "relaunch");
}

void nm_ft_resume(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    /* A relaunched engine is a new story: no dedup, no failure run carried over. */
    drop_state(ft);
    ft->paused = false;
    if (nm_engine_all_ready(nm))
        ft->started = true;
    ft_update(ft, "resume");
}

void nm_ft_endpoints_reset(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    drop_state(ft);
    ft->started = false;
    ft->paused = false;
    /* A new start command begins a new story (arbitration resets on the generation). */
    if (ft->settling) {
        ft->settling = false;
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "new start command");
    }
    ft_update(ft, "new start command");
}

void nm_ft_before_arbitration(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft || !ft->settling)
        return;
    if (!survivor_abnormal(nm)) {
        ft->settling = false;
        log_info("ft_commit_settled", LF_STR("why", "no survivor abnormal"));
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft commit: survivors recovered");
    } else if (util_mono_ms() >= ft->settle_until_ms) {
        /* The freeze ran out by itself: arbitration counts the survivors again. */
        ft->settling = false;
        log_warn("ft_commit_settle_expired",
                 LF_STR("why", "survivors still abnormal after the post-commit window"));
        nm_unfreeze(nm, NM_FREEZE_FT_GUARD, "ft commit: post-commit window over");
    }
}

void nm_ft_config_updated(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    ft_update(ft, "config reloaded");
}

void nm_ft_stop(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    ft->stopped = true;
    ft_update(ft, "shutdown");
}
