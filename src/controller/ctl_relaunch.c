/* ctl_relaunch — EngineRelaunchStrategy (spec §7.2): relaunch every engine of an
 * instance in place, without restarting containers.
 *
 *   INIT              resolve the instance and its node managers
 *   RELAUNCH_ENGINE   probe every NM (GET /node-manager/status; retries with backoff;
 *                     any unreachable => RESTART_CONTAINER without dispatching), send
 *                     {"action":"restart"} to every NM (retries; 409 = already under way
 *                     = accepted), then poll GET /node-manager/status?relaxed=true every
 *                     poll interval until every NM says true and the instance's own
 *                     heartbeats (stamped after the dispatch) evaluate NORMAL; an NM
 *                     failing `unreachable_threshold` polls in a row, or the deadline
 *                     (strategy start + complete timeout), => RESTART_CONTAINER; the
 *                     instance deleted meanwhile => SUCCESS
 *   RESTART_CONTAINER "abort" only to the NMs whose restart was not accepted (the others
 *                     keep their freeze, whose deadline is the fallback), then FAILED
 *   SUCCESS / FAILED  terminal; FAILED escalates to reconfiguration (ctl_faults.c).
 *
 * The steps are the states of rl_table (INIT, PROBE, DISPATCH, POLL, RESTART_CONTAINER,
 * SUCCESS, FAILED, DETACHED; PROBE..POLL all report RELAUNCH_ENGINE upstream); every
 * change goes through rl_to(), which logs it (ctl_fsm_step) and runs what the new state
 * does (rl_enter).
 *
 * Upstream polls the relaxed status only; requiring fresh NORMAL heartbeats as well
 * keeps a node manager that still reports its pre-relaunch statuses from ending the
 * strategy before the engines are actually back (§12.9, §12.22). */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------------------ */

enum rl_state {
    RL_INIT = 0,          /* resolved the instance and its NMs */
    RL_PROBE,             /* every NM's status, until all answer (retries, backoff) */
    RL_DISPATCH,          /* {"action":"restart"} to every NM, until all accepted */
    RL_POLL,              /* relaxed status + fresh NORMAL heartbeats, every poll interval */
    RL_RESTART_CONTAINER, /* "abort" to the NMs that did not accept, then FAILED */
    RL_SUCCESS,
    RL_FAILED, /* escalates (ctl_faults.c) */
    RL_DETACHED, /* the instance was removed: nothing reported */
};
#define RL_STATE_COUNT 8

enum rl_event {
    RL_EV_START = 0,         /* the instance was withdrawn: begin */
    RL_EV_ALL_OK,            /* every NM answered the round as wanted */
    RL_EV_RETRY,             /* some did not; attempts left: again after the backoff */
    RL_EV_EXHAUSTED,         /* some did not and no attempt is left */
    RL_EV_DEADLINE,          /* strategy start + relaunch timeout passed */
    RL_EV_NOT_YET,           /* a poll round without recovery: poll again */
    RL_EV_RECOVERED,         /* every NM relaxed-ready and the instance reports NORMAL */
    RL_EV_INSTANCE_GONE,     /* the instance was deleted meanwhile: nothing left to do */
    RL_EV_NM_UNREACHABLE,    /* an NM failed `unreachable_threshold` polls in a row */
    RL_EV_ABORTS_SENT,       /* RESTART_CONTAINER done */
    RL_EV_DETACH,            /* the instance went away (ctl_strategy_detach) */
};
#define RL_EV_COUNT 11

static const char *const rl_state_names[RL_STATE_COUNT] = {
    "INIT", "PROBE", "DISPATCH", "POLL", "RESTART_CONTAINER", "SUCCESS", "FAILED", "DETACHED",
};
/* The upstream phase each state reports (ft runtime strategy_phase, history, the
 * strategy_phase log line): probing, dispatching and polling are all RELAUNCH_ENGINE. */
static const char *const rl_phase_names[RL_STATE_COUNT] = {
    "INIT",    "RELAUNCH_ENGINE", "RELAUNCH_ENGINE", "RELAUNCH_ENGINE", "RESTART_CONTAINER",
    "SUCCESS", "FAILED",          NULL,
};
static const char *const rl_event_names[RL_EV_COUNT] = {
    "START",    "ALL_OK",       "RETRY",           "EXHAUSTED",      "DEADLINE",    "NOT_YET",
    "RECOVERED", "INSTANCE_GONE", "NM_UNREACHABLE", "ABORTS_SENT", "DETACH",
};

#define TO(s) ((int8_t)((s) + 1))
static const int8_t rl_table[RL_STATE_COUNT][RL_EV_COUNT] = {
    [RL_INIT] = {[RL_EV_START] = TO(RL_PROBE), [RL_EV_DETACH] = TO(RL_DETACHED)},
    [RL_PROBE] = {[RL_EV_ALL_OK] = TO(RL_DISPATCH),
                  [RL_EV_RETRY] = TO(RL_PROBE),
                  [RL_EV_EXHAUSTED] = TO(RL_RESTART_CONTAINER),
                  [RL_EV_DEADLINE] = TO(RL_RESTART_CONTAINER),
                  [RL_EV_DETACH] = TO(RL_DETACHED)},
    [RL_DISPATCH] = {[RL_EV_ALL_OK] = TO(RL_POLL),
                     [RL_EV_RETRY] = TO(RL_DISPATCH),
                     [RL_EV_EXHAUSTED] = TO(RL_RESTART_CONTAINER),
                     [RL_EV_DEADLINE] = TO(RL_RESTART_CONTAINER),
                     [RL_EV_DETACH] = TO(RL_DETACHED)},
    [RL_POLL] = {[RL_EV_DEADLINE] = TO(RL_RESTART_CONTAINER),
                 [RL_EV_NOT_YET] = TO(RL_POLL),
                 [RL_EV_RECOVERED] = TO(RL_SUCCESS),
                 [RL_EV_INSTANCE_GONE] = TO(RL_SUCCESS),
                 [RL_EV_NM_UNREACHABLE] = TO(RL_RESTART_CONTAINER),
                 [RL_EV_DETACH] = TO(RL_DETACHED)},
    [RL_RESTART_CONTAINER] = {[RL_EV_ABORTS_SENT] = TO(RL_FAILED),
                              [RL_EV_DETACH] = TO(RL_DETACHED)},
};

const struct ctl_fsm ctl_relaunch_fsm = {
    .name = STRAT_RELAUNCH,
    .n_states = RL_STATE_COUNT,
    .n_events = RL_EV_COUNT,
    .states = rl_state_names,
    .events = rl_event_names,
    .table = &rl_table[0][0],
    .terminal = 1u << RL_SUCCESS | 1u << RL_FAILED | 1u << RL_DETACHED,
};

struct relaunch {
    struct ctl_strategy base;
    size_t n;
    char **base_urls;
    char **keys;
    bool *ok;         /* this round's answer per NM */
    bool *dispatched; /* the NM accepted the restart (it then keeps its freeze) */
    int *fails;       /* consecutive failed polls per NM */
    int attempts;
    size_t left;
    int64_t started_ms;
    int64_t deadline_ms;
    double dispatch_wall_s;
};

static void rl_free(struct ctl_strategy *b)
{
    struct relaunch *s = (struct relaunch *)b;
    for (size_t i = 0; i < s->n; i++) {
        free(s->base_urls[i]);
        free(s->keys[i]);
    }
    free(s->base_urls);
    free(s->keys);
    free(s->ok);
    free(s->dispatched);
    free(s->fails);
    free(s);
}

/* The upstream phase of the current state, into the runtime and the log. */
static void rl_announce(struct relaunch *s, const char *detail)
{
    const char *phase = rl_phase_names[s->base.state];
    if (!phase)
        return;
    struct ctl *c = s->base.c;
    struct ctl_ft_rt *rt = ctl_find_rt(c, s->base.instance_id);
    if (rt)
        ctl_ft_set_strategy(rt, STRAT_RELAUNCH, phase, detail);
    log_info("strategy_phase", LF_INT("instance_id", s->base.instance_id),
             LF_STR("strategy", STRAT_RELAUNCH), LF_STR("phase", phase), LF_STR("detail", detail));
}

static void rl_round(struct relaunch *s);

static void rl_later(struct relaunch *s, int64_t delay_ms)
{
    reactor_timer_start(s->base.c->r, &s->base.timer, delay_ms, 0);
}

static void rl_to(struct relaunch *s, enum rl_event ev, const char *cause);

/* What a state does when entered (from: the previous state; cause: the transition's). */
static void rl_enter(struct relaunch *s, int from, const char *cause)
{
    struct ctl *c = s->base.c;
    int st = s->base.state;
    if (st == from) {
        /* another round of the same state */
        rl_later(s, st == RL_POLL ? c->cfg.relaunch_poll_ms : c->cfg.relaunch_backoff_ms);
        return;
    }
    rl_announce(s, cause);
    switch ((enum rl_state)st) {
    case RL_INIT:
        break;
    case RL_PROBE:
        rl_round(s);
        break;
    case RL_DISPATCH:
        s->attempts = 0;
        memset(s->ok, 0, s->n * sizeof(bool));
        rl_round(s);
        break;
    case RL_POLL:
        s->attempts = 0;
        s->dispatch_wall_s = (double)util_wall_ms() / 1000.0;
        memset(s->ok, 0, s->n * sizeof(bool));
        rl_later(s, c->cfg.relaunch_poll_ms);
        break;
    case RL_RESTART_CONTAINER: {
        /* Only the NMs that did not accept a restart get "abort": the others are
         * relaunching and keep their freeze, whose deadline is their own fallback. */
        json_t *body = json_pack("{s:s, s:I}", "action", "abort", "instance_id",
                                 (json_int_t)s->base.instance_id);
        for (size_t i = 0; i < s->n; i++) {
            if (s->dispatched[i])
                continue;
            char *url = xasprintf("%s/node-manager/engine-restart", s->base_urls[i]);
            ctl_http_fire(c, "POST", url, body, c->cfg.nm_probe_timeout_ms, "engine_restart_abort",
                          s->base.instance_id);
            free(url);
        }
        json_decref(body);
        rl_to(s, RL_EV_ABORTS_SENT, cause);
        break;
    }
    case RL_SUCCESS:
    case RL_FAILED: {
        reactor_timer_stop(c->r, &s->base.timer);
        struct ctl_inst *in = ctl_find(c, s->base.instance_id);
        if (in && in->strategy == s)
            in->strategy = NULL;
        bool ok = st == RL_SUCCESS;
        ctl_strategy_finished(c, s->base.instance_id, STRAT_RELAUNCH, ok, ok ? NULL : cause);
        ctl_strategy_release(&s->base);
        break;
    }
    case RL_DETACHED:
        reactor_timer_stop(c->r, &s->base.timer);
        ctl_strategy_release(&s->base);
        break;
    }
}

/* The one transition function. */
static void rl_to(struct relaunch *s, enum rl_event ev, const char *cause)
{
    int from = ctl_fsm_step(&ctl_relaunch_fsm, &s->base.state, (int)ev, s->base.instance_id, cause);
    if (from >= 0)
        rl_enter(s, from, cause);
}

static void rl_detach(struct ctl_strategy *b)
{
    rl_to((struct relaunch *)b, RL_EV_DETACH, "instance removed");
}

static void rl_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct relaunch *s = arg;
    if (!ctl_strategy_over(&s->base))
        rl_round(s);
}


static bool recovered(struct ctl *c, struct ctl_inst *in, double since_s)
{
    size_t n_retired;
    int64_t *retired = ctl_retired(c, in, &n_retired);
    bool fresh = true;
    for (size_t i = 0; i < in->n_nms && fresh; i++)
        for (size_t j = 0; j < in->nms[i].n_eps && fresh; j++) {
            const struct wire_endpoint *ep = &in->nms[i].eps[j];
            if (!ctl_ids_has(retired, n_retired, ep->id) && ep->hb_timestamp < since_s)
                fresh = false;
        }
    bool ok = fresh && ctl_inst_evaluate(in, retired, n_retired) == CTL_EV_NORMAL;
    free(retired);
    return ok;
}

static void names_of(struct relaunch *s, const bool *flags, bool want, char *buf, size_t cap)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < s->n && o + 2 < cap; i++) {
        if (flags[i] != want)
            continue;
        int w = snprintf(buf + o, cap - o, "%s%s", o ? ", " : "", s->keys[i]);
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

/* Every answer of a round is in: what happened, as an event. */
static void rl_round_done(struct relaunch *s)
{
    struct ctl *c = s->base.c;
    int64_t now = reactor_now(c->r);
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    char names[512], why[768];
    size_t n_ok = 0;
    for (size_t i = 0; i < s->n; i++)
        n_ok += s->ok[i];
    switch ((enum rl_state)s->base.state) {
    case RL_PROBE:
    case RL_DISPATCH: {
        bool probe = s->base.state == RL_PROBE;
        if (n_ok == s->n) {
            rl_to(s, RL_EV_ALL_OK,
                  probe ? "every node manager reachable: dispatching restart"
                        : "restart accepted everywhere: polling relaxed status");
            return;
        }
        names_of(s, s->ok, false, names, sizeof(names));
        if (++s->attempts >= c->cfg.relaunch_retries) {
            snprintf(why, sizeof(why),
                     probe ? "node manager(s) unreachable: %s" : "restart not accepted by: %s",
                     names);
            rl_to(s, RL_EV_EXHAUSTED, why);
            return;
        }
        rl_to(s, RL_EV_RETRY, names);
        return;
    }
    case RL_POLL:
        if (!in) {
            rl_to(s, RL_EV_INSTANCE_GONE, "instance deleted meanwhile");
            return;
        }
        for (size_t i = 0; i < s->n; i++) {
            if (s->fails[i] >= c->cfg.relaunch_unreachable) {
                snprintf(why, sizeof(why), "node manager %s failed %d status polls in a row",
                         s->keys[i], s->fails[i]);
                rl_to(s, RL_EV_NM_UNREACHABLE, why);
                return;
            }
        }
        if (n_ok == s->n && recovered(c, in, s->dispatch_wall_s)) {
            rl_to(s, RL_EV_RECOVERED, "every engine relaunched and the instance reports NORMAL");
            return;
        }
        if (now >= s->deadline_ms) {
            snprintf(why, sizeof(why), "relaunch not complete within %lld ms",
                     (long long)c->cfg.relaunch_timeout_ms);
            rl_to(s, RL_EV_DEADLINE, why);
            return;
        }
        memset(s->ok, 0, s->n * sizeof(bool));
        rl_to(s, RL_EV_NOT_YET, NULL);
        return;
    default:
        return;
    }
}

static void rl_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    struct relaunch *s = arg;
    size_t i = (size_t)tag;
    s->base.inflight--;
    if (ctl_strategy_over(&s->base)) {
        ctl_strategy_release(&s->base);
        return;
    }
    s->left--;
    switch ((enum rl_state)s->base.state) {
    case RL_PROBE:
        s->ok[i] = resp->error == 0 && resp->status > 0;
        break;
    case RL_DISPATCH:
        s->ok[i] = ctl_http_ok(resp) || (resp->error == 0 && resp->status == 409);
        s->dispatched[i] = s->ok[i];
        if (!s->ok[i])
            log_warn("engine_restart_dispatch_failed", LF_INT("instance_id", s->base.instance_id),
                     LF_STR("node_manager", s->keys[i]), LF_STR("error", ctl_http_err(resp)));
        else
            log_info("engine_restart_dispatched", LF_INT("instance_id", s->base.instance_id),
                     LF_STR("node_manager", s->keys[i]), LF_INT("status", resp->status));
        break;
    case RL_POLL:
        if (ctl_http_ok(resp)) {
            json_t *j = ctl_http_json(resp);
            s->ok[i] = json_is_true(json_object_get(j, "status"));
            s->fails[i] = 0;
            json_decref(j);
        } else {
            s->fails[i]++;
            log_warn("engine_relaunch_poll_failed", LF_INT("instance_id", s->base.instance_id),
                     LF_STR("node_manager", s->keys[i]), LF_INT("consecutive", s->fails[i]),
                     LF_STR("error", ctl_http_err(resp)));
        }
        break;
    default:
        break;
    }
    if (s->left == 0)
        rl_round_done(s);
    (void)c;
}

static void rl_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct relaunch *s = arg;
    s->base.inflight--;
    ctl_strategy_release(&s->base);
}

/* One round of the current state's requests (PROBE, DISPATCH: to the NMs not ok yet;
 * POLL: to every NM). */
static void rl_round(struct relaunch *s)
{
    struct ctl *c = s->base.c;
    int st = s->base.state;
    if (st != RL_PROBE && st != RL_DISPATCH && st != RL_POLL)
        return;
    if (reactor_now(c->r) >= s->deadline_ms && st != RL_POLL) {
        rl_to(s, RL_EV_DEADLINE, "relaunch deadline passed before dispatch completed");
        return;
    }
    json_t *body = NULL;
    if (st == RL_DISPATCH)
        body = json_pack("{s:s, s:I}", "action", "restart", "instance_id",
                         (json_int_t)s->base.instance_id);
    s->left = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (st != RL_POLL && s->ok[i])
            continue;
        s->left++;
    }
    size_t todo = s->left;
    for (size_t i = 0; i < s->n && todo; i++) {
        if (st != RL_POLL && s->ok[i])
            continue;
        char *url;
        int64_t timeout = c->cfg.nm_probe_timeout_ms;
        if (st == RL_PROBE) {
            url = xasprintf("%s/node-manager/status", s->base_urls[i]);
        } else if (st == RL_DISPATCH) {
            url = xasprintf("%s/node-manager/engine-restart", s->base_urls[i]);
            /* The NM answers after stopping the old engines (SIGTERM grace) and spawning
             * the new ones: allow for that. */
            timeout = MOTOR_MAX(c->cfg.start_cmd_timeout_ms, 30000);
        } else {
            url = xasprintf("%s/node-manager/status?relaxed=true", s->base_urls[i]);
        }
        s->base.inflight++;
        todo--;
        ctl_request(c, st == RL_DISPATCH ? "POST" : "GET", url, body, timeout, rl_done, s,
                    (intptr_t)i, rl_drop);
        free(url);
    }
    json_decref(body);
}

int ctl_relaunch_start(struct ctl *c, struct ctl_inst *in)
{
    if (in->strategy || in->n_nms == 0)
        return -1;
    struct relaunch *s = xcalloc(1, sizeof(*s));
    s->base.name = STRAT_RELAUNCH;
    s->base.c = c;
    s->base.instance_id = in->id;
    s->base.fsm = &ctl_relaunch_fsm;
    s->base.state = RL_INIT;
    s->base.free_fn = rl_free;
    s->base.detach_fn = rl_detach;
    reactor_timer_init(&s->base.timer, rl_timer, s);
    s->n = in->n_nms;
    s->base_urls = xcalloc(s->n, sizeof(char *));
    s->keys = xcalloc(s->n, sizeof(char *));
    s->ok = xcalloc(s->n, sizeof(bool));
    s->dispatched = xcalloc(s->n, sizeof(bool));
    s->fails = xcalloc(s->n, sizeof(int));
    for (size_t i = 0; i < s->n; i++) {
        s->base_urls[i] = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "");
        s->keys[i] = xasprintf("%s:%s", in->nms[i].pod_ip, in->nms[i].port);
    }
    s->started_ms = reactor_now(c->r);
    s->deadline_ms = s->started_ms + c->cfg.relaunch_timeout_ms;
    in->strategy = s;
    log_warn("strategy_started", LF_INT("instance_id", in->id), LF_STR("job_name", in->job_name),
             LF_STR("strategy", STRAT_RELAUNCH), LF_INT("node_managers", s->n));
    rl_announce(s, "resolved the instance and its node managers");
    if (!in->withdrawn)
        ctl_push_withdraw(c, in, NULL, NULL);
    rl_to(s, RL_EV_START, "probing every node manager");
    return 0;
}
