/* nm_ft — the engine FT manager (§2.10): FT status polling and its fault reports.
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
 * additional_info), remembered only once the Controller accepted it; the first failed
 * poll during runtime => one EngineDeadError "unreachable" (seed 002); max_consecutive_404
 * 404s => "unsupported", re-probed every unsupported_reprobe_interval_sec.
 * Engines whose process is gone are not polled: the pidfd already reported the death.
 *
 * The DP scale-down proxy (nm_scaledown.c) shares this manager's HTTP client, feeds its
 * dedup with the statuses it sees and drops the state of the endpoints it retires.
 * GET /node-manager/fault-tolerance shows the manager's state and the proxy's (Motor
 * addition). */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"
#include "wire/wire_ft.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FT_MIN_POLL_MS 50
#define NM_FT_DEAD_AFTER_FAILED_POLLS 1
#define FT_EXCEPTION_TYPE_MAX 256

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

int64_t nm_ft_poll_timeout_ms(const struct nodemgr *nm)
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

char *nm_ft_endpoint_url(const struct nm_endpoint *e, const char *path)
{
    bool v6 = strchr(e->ep.ip, ':') != NULL;
    struct httpc_tls t;
    bool tls = nm_engine_client_tls(e->nm, &t);
    return xasprintf("%s://%s%s%s:%d%s", tls ? "https" : "http", v6 ? "[" : "", e->ep.ip,
                     v6 ? "]" : "", wire_endpoint_port(&e->ep), path);
}

void nm_ft_resp_error_text(const struct httpc_response *resp, char *buf, size_t cap)
{
    if (resp->error)
        snprintf(buf, cap, "%s",
                 resp->error_text && *resp->error_text ? resp->error_text : strerror(-resp->error));
    else
        snprintf(buf, cap, "http %ld: %.200s", resp->status, resp->body ? resp->body : "");
}

json_t *nm_ft_find_entry(const struct httpc_response *resp, int64_t id, char *why, size_t cap)
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
    char msg[NM_FT_ERR_MAX + 128];
    snprintf(msg, sizeof(msg),
             "engine FT status of endpoint %lld unreachable at a failed poll during runtime "
             "(%d in a row): %s",
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
    /* Seed 002: the manager runs only once the engines are ready, so the first failed status
     * request during runtime reports DEAD; max_poll_failures is accepted and not used
     * ("遗留 max_poll_failures 当前不参与判定"). A DP scale-down verifies each DEAD
     * candidate against the engine's own FT answer before it retires it (ctl_scaledown.c). */
    unsigned act = nm_ft_track_observe(&fe->track, ev, entry, NM_FT_DEAD_AFTER_FAILED_POLLS,
                                       fc->max_consecutive_404, &sig);
    if (act & NM_FT_NOW_SUPPORTED)
        log_info("ft_supported", LF_INT("endpoint_id", e->ep.id));
    if (act & NM_FT_NOW_UNSUPPORTED)
        log_warn("ft_unsupported", LF_INT("endpoint_id", e->ep.id),
                 LF_INT("consecutive_404", fe->track.n404),
                 LF_DBL("reprobe_interval_sec", fc->unsupported_reprobe_interval_sec));
    if (ev == NM_FT_EV_FAILED && fe->track.failures == 1)
        log_warn("ft_poll_failed", LF_INT("endpoint_id", e->ep.id), LF_STR("error", why));
    if (nm_shutting_down(nm) || fe->report_inflight) {
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
    if (!e || nm_engine_retired(e) || !ft_active(ft))
        return;
    char why[NM_FT_ERR_MAX];
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
        nm_ft_resp_error_text(resp, why, sizeof(why));
        observe(ft, e, fe, NM_FT_EV_FAILED, NULL, NULL, why);
        return;
    }
    json_t *raw = nm_ft_find_entry(resp, id, why, sizeof(why));
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
    if (e->ep.headless || !e->proc || !proc_running(e->proc))
        return false;
    return e->state == NM_ES_READY || e->state == NM_ES_UNHEALTHY; /* retired: never */
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
        char *url = nm_ft_endpoint_url(e, "/v1/fault_tolerance/status");
        struct ft_poll *ctx = xcalloc(1, sizeof(*ctx));
        ctx->nm = nm;
        ctx->id = e->ep.id;
        ctx->epoch = ft->epoch;
        static const char *const headers[] = {"Accept: application/json", NULL};
        struct httpc_tls tls;
        bool use_tls = nm_engine_client_tls(nm, &tls); /* upstream polls plain HTTP only */
        struct httpc_opts o = {
            .method = "GET",
            .url = url,
            .headers = headers,
            .timeout_ms = nm_ft_poll_timeout_ms(nm),
            .max_response = NM_FT_MAX_RESPONSE,
            .tls = use_tls ? &tls : NULL,
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
    bool want =
        ft_enabled(nm) && ft->started && !ft->paused && !ft->stopped && !nm_shutting_down(nm);
    if (want) {
        int64_t iv = poll_interval_ms(nm);
        if (!ft->polling) {
            ft->polling = true;
            reactor_timer_start(nm->r, &ft->poll_timer, 0, iv);
            log_info("ft_polling_started", LF_STR("cause", cause), LF_INT("interval_ms", iv),
                     LF_INT("timeout_ms", nm_ft_poll_timeout_ms(nm)),
                     LF_INT("dead_after_failed_polls", NM_FT_DEAD_AFTER_FAILED_POLLS),
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
    nm_scaledown_state_json(nm, o);
    json_t *eps = json_array();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        struct ft_ep *fe = ep_find(ft, e->ep.id);
        json_t *x =
            json_pack("{s:I, s:b}", "id", (json_int_t)e->ep.id, "retired", nm_engine_retired(e));
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
    nm_route(nm, "GET", "/node-manager/fault-tolerance", h_state, nm, 0);
    return 0;
}

void nm_ft_free(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    if (!ft)
        return;
    reactor_timer_stop(nm->r, &ft->poll_timer);
    drop_state(ft);
    free(ft->eps);
    httpc_free(ft->http);
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
    ft_update(ft, "new start command");
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

/* ---- for the scale-down proxy ------------------------------------------------------------- */

struct httpc *nm_ft_http(struct nodemgr *nm)
{
    struct nm_ft *ft = nm->ft;
    return ft ? ft->http : NULL;
}

void nm_ft_feed_entry(struct nodemgr *nm, int64_t id, json_t *raw)
{
    /* §8.3: known statuses also feed the normal fault-report dedup. */
    struct nm_ft *ft = nm->ft;
    if (!ft || !ft_active(ft) || !raw)
        return;
    struct nm_endpoint *e = nm_engine_find(nm, id);
    if (!e || nm_engine_retired(e))
        return;
    struct wire_ft_engine_entry entry;
    struct wire_err err = {{0}};
    if (wire_ft_engine_entry_parse(raw, &entry, &err) < 0)
        return;
    observe(ft, e, ep_get(ft, id), NM_FT_EV_OK, &entry, raw, NULL);
    wire_ft_engine_entry_release(&entry);
}

void nm_ft_forget(struct nodemgr *nm, int64_t id)
{
    if (nm->ft)
        drop_endpoint(nm->ft, id);
}
