/* ctl_faults — software-fault intake (§5.8), the strategy center that picks a
 * recovery for each instance (DP scale-down when the gate allows it, else engine
 * relaunch), escalation of failed strategies, and reconfiguration (the last resort:
 * stop the instance's node managers so the platform restarts them, drop the instance,
 * reassemble the job from fresh registrations). */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

/* ---- fault records ---------------------------------------------------------------------- */

void ctl_faults_free(struct ctl_inst *in)
{
    if (!in->faults)
        return;
    for (size_t i = 0; i < in->faults->n; i++)
        free(in->faults->v[i].type);
    free(in->faults->v);
    free(in->faults);
    in->faults = NULL;
}

static struct ctl_fault *fault_get(struct ctl_inst *in, int64_t engine_id, bool create)
{
    if (!in->faults) {
        if (!create)
            return NULL;
        in->faults = xcalloc(1, sizeof(*in->faults));
    }
    struct ctl_faults *f = in->faults;
    for (size_t i = 0; i < f->n; i++)
        if (f->v[i].engine_id == engine_id)
            return &f->v[i];
    if (!create)
        return NULL;
    f->v = xrealloc(f->v, (f->n + 1) * sizeof(*f->v));
    struct ctl_fault *x = &f->v[f->n++];
    memset(x, 0, sizeof(*x));
    x->engine_id = engine_id;
    return x;
}

static void fault_remove(struct ctl_inst *in, size_t i)
{
    struct ctl_faults *f = in->faults;
    free(f->v[i].type);
    f->v[i] = f->v[--f->n];
}

int64_t *ctl_retired(struct ctl *c, const struct ctl_inst *in, size_t *n)
{
    (void)c;
    int64_t *v = NULL;
    *n = 0;
    if (!in->ft)
        return NULL;
    /* Committed retired ranks are gone for good: the NM stops reporting them and they
     * take no part in the instance's health. */
    for (size_t i = 0; i < in->ft->n_committed; i++)
        ctl_ids_add(&v, n, in->ft->committed[i]);
    if (in->ft->phase == FT_SCALING_DOWN || in->ft->phase == FT_POST_SCALE_CLEANUP)
        for (size_t i = 0; i < in->ft->n_pending; i++)
            ctl_ids_add(&v, n, in->ft->pending[i]);
    return v;
}

static struct ctl_inst *locate(struct ctl *c, const struct wire_fault_report *r)
{
    if (r->has_instance_id)
        return ctl_find(c, r->instance_id);
    char port[16];
    snprintf(port, sizeof(port), "%d", r->node_manager_port);
    for (size_t i = 0; i < c->n_insts; i++) {
        struct ctl_inst *in = c->insts[i];
        size_t nm;
        if (!ctl_inst_endpoint(in, r->engine_id, &nm))
            continue;
        if (strcmp(in->nms[nm].pod_ip, r->pod_ip) != 0)
            continue;
        if (r->node_manager_port && strcmp(in->nms[nm].port, port) != 0)
            continue;
        return in;
    }
    return NULL;
}

static json_t *not_accepted(int code, const char *msg)
{
    if (code == 200)
        return wire_envelope_new(200, msg, json_pack("{s:b}", "accepted", 0));
    return wire_envelope_error_new(code, msg, json_pack("{s:b}", "accepted", 0));
}

json_t *ctl_fault_report(struct ctl *c, const struct wire_fault_report *r, int *status)
{
    const char *st_name = wire_engine_status_str(r->engine_status);
    metrics_counter_inc(metrics_counter_labels(c->m.faults, "status", st_name));
    struct ctl_inst *in = locate(c, r);
    if (!in) {
        *status = 404;
        log_warn("fault_report_unmatched", LF_INT("engine_id", r->engine_id),
                 LF_STR("pod_ip", r->pod_ip),
                 LF_INT("instance_id", r->has_instance_id ? r->instance_id : -1));
        return not_accepted(404, "no instance owns this engine");
    }
    size_t nm_idx;
    if (!ctl_inst_endpoint(in, r->engine_id, &nm_idx) ||
        strcmp(in->nms[nm_idx].pod_ip, r->pod_ip) != 0) {
        *status = 404;
        return not_accepted(404, "engine_id is not an endpoint of this pod in the instance");
    }
    log_warn("fault_reported", LF_INT("instance_id", in->id), LF_STR("job_name", in->job_name),
             LF_INT("engine_id", r->engine_id), LF_STR("engine_status", st_name),
             LF_STR("exception_type", r->exception_type),
             LF_STR("exception_message", r->exception_message), LF_STR("pod_ip", r->pod_ip));
    *status = 200;
    if (in->ft && ctl_ids_has(in->ft->committed, in->ft->n_committed, r->engine_id)) {
        /* A rank retired by a committed scale-down: its death is old news. */
        return wire_envelope_new(200, "Fault ignored: the rank was retired by a DP scale-down",
                                 json_pack("{s:b}", "accepted", 1));
    }
    if (!in->ever_ready) {
        /* Cold start: model loading is not a fault (the NM then keeps its own fallback). */
        return not_accepted(200, "Fault ignored: the instance has not been ready yet");
    }
    int64_t now = reactor_now(c->r);
    if (r->engine_status == WIRE_ENGINE_HEALTHY) {
        struct ctl_fault *f = fault_get(in, r->engine_id, false);
        if (f)
            fault_remove(in, (size_t)(f - in->faults->v));
        if ((!in->faults || in->faults->n == 0) && !in->strategy && in->withdrawn &&
            !(in->ft && ctl_ft_in_transaction(in->ft))) {
            in->withdrawn = false;
            log_info("instance_fault_cleared", LF_INT("instance_id", in->id));
            ctl_push_reconcile(c, in);
        }
    } else {
        struct ctl_fault *f = fault_get(in, r->engine_id, true);
        /* DEAD is authoritative: a later UNHEALTHY of the same engine does not demote it. */
        if (f->status != WIRE_ENGINE_DEAD || r->engine_status == WIRE_ENGINE_DEAD)
            f->status = r->engine_status;
        f->at_ms = now;
        free(f->type);
        f->type = xstrdup(r->exception_type);
        if (!in->withdrawn) {
            log_warn("instance_withdrawn", LF_INT("instance_id", in->id),
                     LF_STR("reason", "software fault reported"));
            ctl_push_withdraw(c, in, NULL, NULL);
        }
        if (r->engine_status == WIRE_ENGINE_DEAD)
            ctl_faults_kick(c);
    }
    return wire_envelope_new(200, "Software fault reported successfully",
                             json_pack("{s:b}", "accepted", 1));
}

/* ---- the recovery table ---------------------------------------------------------------- */

/* What the fault manager is doing about an instance: nothing (IDLE), running one of the
 * strategies, or rebuilding it (RECONFIGURE: the instance is deleted, terminal). The
 * data-dependent choices (is the gate open, is relaunch enabled, what is the fallback)
 * are made where the evidence is and arrive as distinct events. */
static const char *const rec_state_names[REC_STATE_COUNT] = {
    [REC_IDLE] = "IDLE",
    [REC_SCALE_DOWN] = STRAT_SCALE_DOWN,
    [REC_RELAUNCH] = STRAT_RELAUNCH,
    [REC_RECONFIGURE] = STRAT_RECONFIG,
};
static const char *const rec_event_names[REC_EV_COUNT] = {
    [REC_EV_DEAD_SCALABLE] = "DEAD_SCALABLE",
    [REC_EV_DEAD_RELAUNCH] = "DEAD_RELAUNCH",
    [REC_EV_DEAD_NO_STRATEGY] = "DEAD_NO_STRATEGY",
    [REC_EV_FALLBACK_RELAUNCH] = "FALLBACK_RELAUNCH",
    [REC_EV_FALLBACK_RECONFIGURE] = "FALLBACK_RECONFIGURE",
    [REC_EV_RECOVERED] = "RECOVERED",
    [REC_EV_FAILED_RECONFIGURE] = "FAILED_RECONFIGURE",
    [REC_EV_EXHAUSTED] = "EXHAUSTED",
    [REC_EV_START_FAILED] = "START_FAILED",
    [REC_EV_RECONFIGURE] = "RECONFIGURE",
};

#define TO(x) ((int8_t)((x) + 1))
static const int8_t rec_table[REC_STATE_COUNT][REC_EV_COUNT] = {
    [REC_IDLE] = {[REC_EV_DEAD_SCALABLE] = TO(REC_SCALE_DOWN),
                  [REC_EV_DEAD_RELAUNCH] = TO(REC_RELAUNCH),
                  [REC_EV_DEAD_NO_STRATEGY] = TO(REC_IDLE),
                  /* an interrupted transaction (controller restart) resumes its fallback */
                  [REC_EV_FALLBACK_RELAUNCH] = TO(REC_RELAUNCH),
                  [REC_EV_FALLBACK_RECONFIGURE] = TO(REC_RECONFIGURE),
                  [REC_EV_RECONFIGURE] = TO(REC_RECONFIGURE)},
    [REC_SCALE_DOWN] = {[REC_EV_RECOVERED] = TO(REC_IDLE),
                        [REC_EV_FALLBACK_RELAUNCH] = TO(REC_RELAUNCH),
                        [REC_EV_FALLBACK_RECONFIGURE] = TO(REC_RECONFIGURE),
                        [REC_EV_START_FAILED] = TO(REC_IDLE),
                        [REC_EV_RECONFIGURE] = TO(REC_RECONFIGURE)},
    [REC_RELAUNCH] = {[REC_EV_RECOVERED] = TO(REC_IDLE),
                      [REC_EV_FAILED_RECONFIGURE] = TO(REC_RECONFIGURE),
                      [REC_EV_EXHAUSTED] = TO(REC_IDLE),
                      [REC_EV_START_FAILED] = TO(REC_IDLE),
                      [REC_EV_RECONFIGURE] = TO(REC_RECONFIGURE)},
};

const struct ctl_fsm ctl_recovery_fsm = {
    .name = "recovery",
    .n_states = REC_STATE_COUNT,
    .n_events = REC_EV_COUNT,
    .states = rec_state_names,
    .events = rec_event_names,
    .table = &rec_table[0][0],
    .terminal = 1u << REC_RECONFIGURE,
};

/* The one transition function of the recovery table; the caller then does what the new
 * state means (start a strategy, reconfigure, serve again). */
static bool rec_to(struct ctl_inst *in, enum ctl_rec_event ev, const char *cause)
{
    return ctl_fsm_step(&ctl_recovery_fsm, &in->recovery, (int)ev, in->id, cause) >= 0;
}

static void reconfigure_now(struct ctl *c, struct ctl_inst *in, const char *reason,
                            ssize_t except_idx);

/* ---- strategy center ---------------------------------------------------------------------- */

void ctl_faults_kick(struct ctl *c)
{
    if (!reactor_timer_active(&c->strat_kick))
        reactor_timer_start(c->r, &c->strat_kick, 0, 0);
}

static void run_fallback(struct ctl *c, struct ctl_inst *in)
{
    const char *fb = in->ft && in->ft->fallback ? in->ft->fallback : STRAT_RECONFIG;
    log_warn("fallback_strategy", LF_INT("instance_id", in->id), LF_STR("strategy", fb));
    const char *reason =
        in->ft && in->ft->last_error ? in->ft->last_error : "fallback after a failed strategy";
    if (strcmp(fb, STRAT_RELAUNCH) == 0 && c->cfg.relaunch_enable && in->ever_ready) {
        if (!rec_to(in, REC_EV_FALLBACK_RELAUNCH, reason))
            return;
        if (ctl_relaunch_start(c, in) == 0)
            return;
        if (!rec_to(in, REC_EV_START_FAILED, "engine relaunch could not start"))
            return;
    }
    if (rec_to(in, REC_EV_FALLBACK_RECONFIGURE, reason))
        reconfigure_now(c, in, reason, -1);
}

static void consider(struct ctl *c, struct ctl_inst *in, int64_t now)
{
    struct ctl_faults *f = in->faults;
    for (size_t i = 0; f && i < f->n;) {
        if (now - f->v[i].at_ms > c->cfg.fault_window_ms) {
            log_info("fault_expired", LF_INT("instance_id", in->id),
                     LF_INT("engine_id", f->v[i].engine_id));
            fault_remove(in, i);
            continue;
        }
        i++;
    }
    if (in->strategy)
        return;
    /* An interrupted transaction (controller restart) or a failed one resumes with its
     * fallback. */
    if (in->ft && in->ft->phase == FT_RECONFIGURING && !in->ft->reconfiguration_dispatched) {
        run_fallback(c, in);
        return;
    }
    size_t n_dead = 0;
    int64_t *dead = NULL;
    for (size_t i = 0; f && i < f->n;) {
        /* Faults of ranks retired meanwhile (reported during the scale-down that
         * retired them) are settled. */
        if (in->ft && ctl_ids_has(in->ft->committed, in->ft->n_committed, f->v[i].engine_id)) {
            fault_remove(in, i);
            continue;
        }
        if (f->v[i].status == WIRE_ENGINE_DEAD)
            ctl_ids_add(&dead, &n_dead, f->v[i].engine_id);
        i++;
    }
    if (n_dead == 0) {
        if ((!f || f->n == 0) && in->withdrawn && !(in->ft && ctl_ft_in_transaction(in->ft))) {
            /* The evidence cleared itself: serve again. */
            in->withdrawn = false;
            log_info("instance_fault_cleared", LF_INT("instance_id", in->id));
            ctl_push_reconcile(c, in);
        }
        free(dead);
        return;
    }
    if (in->ft) {
        in->ft->gate = ctl_ft_gate(c->cfg.ft_enable, c->cfg.scale_down_enable, &in->ft_cap,
                                   in->ft_cap_consistent);
    }
    /* The strategy owns this episode: reports arriving meanwhile start the next one. The
     * faults are dropped first because a strategy that fails at once may escalate and
     * free the instance (so nothing touches `in` after a start that succeeded). */
    ctl_faults_free(in);
    if (in->ft && in->ft->gate == 0) {
        if (rec_to(in, REC_EV_DEAD_SCALABLE, "DEAD engines reported, the gate allows it") &&
            ctl_scaledown_start(c, in, dead, n_dead) < 0)
            rec_to(in, REC_EV_START_FAILED, "DP scale-down could not start");
    } else if (c->cfg.relaunch_enable) {
        if (rec_to(in, REC_EV_DEAD_RELAUNCH, "DEAD engines reported") &&
            ctl_relaunch_start(c, in) < 0)
            rec_to(in, REC_EV_START_FAILED, "engine relaunch could not start");
    } else if (rec_to(in, REC_EV_DEAD_NO_STRATEGY, "DEAD engines reported")) {
        log_warn("no_strategy", LF_INT("instance_id", in->id),
                 LF_STR("reason", "engine relaunch disabled and DP scale-down not applicable"));
    }
    free(dead);
}

void ctl_faults_tick(struct ctl *c)
{
    if (!c->cfg.ft_enable)
        return;
    int64_t now = reactor_now(c->r);
    size_t n = c->n_insts;
    int64_t *ids = xcalloc(n + 1, sizeof(int64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = c->insts[i]->id;
    for (size_t i = 0; i < n; i++) {
        struct ctl_inst *in = ctl_find(c, ids[i]);
        if (in)
            consider(c, in, now);
    }
    free(ids);
}

/* ---- strategies: common ------------------------------------------------------------------- */

bool ctl_strategy_over(const struct ctl_strategy *s)
{
    return ctl_fsm_terminal(s->fsm, s->state);
}

void ctl_strategy_release(struct ctl_strategy *s)
{
    if (!ctl_strategy_over(s) || s->inflight > 0)
        return;
    reactor_timer_stop(s->c->r, &s->timer);
    s->free_fn(s);
}

void ctl_strategy_detach(struct ctl *c, struct ctl_inst *in)
{
    (void)c;
    struct ctl_strategy *s = in->strategy;
    if (!s)
        return;
    in->strategy = NULL;
    s->detach_fn(s); /* DETACHED: terminal, released once nothing is in flight */
}

void ctl_strategy_finished(struct ctl *c, int64_t instance_id, const char *strategy, bool ok,
                           const char *error)
{
    metrics_counter_inc(metrics_counter_labels(c->m.strategies, "strategy", strategy, "result",
                                               ok ? "success" : "failed"));
    struct ctl_inst *in = ctl_find(c, instance_id);
    struct ctl_ft_rt *rt = in ? in->ft : ctl_find_rt(c, instance_id);
    if (in) {
        in->strategy = NULL;
        ctl_faults_free(in); /* settle this episode before planning the next */
    }
    log_info("strategy_finished", LF_INT("instance_id", instance_id), LF_STR("strategy", strategy),
             LF_BOOL("ok", ok), LF_STR("error", error));
    if (ok) {
        if (rt) {
            ctl_ft_set_error(rt, NULL);
            if (rt->fallback)
                ctl_ft_set_fallback(rt, NULL);
            if (rt->phase != FT_SCALED_DOWN_RUNNING && rt->phase != FT_NORMAL)
                ctl_ft_event(rt, ctl_ft_resume_event(rt), "recovered");
            ctl_save_rt(c, rt);
        }
        if (in && rec_to(in, REC_EV_RECOVERED, strategy)) {
            in->withdrawn = false;
            ctl_push_reconcile(c, in);
        }
        return;
    }
    if (rt) {
        ctl_ft_set_error(rt, error);
        ctl_save_rt(c, rt);
    }
    if (!in)
        return;
    if (strcmp(strategy, STRAT_SCALE_DOWN) == 0) {
        run_fallback(c, in);
        return;
    }
    if (c->cfg.reconfig_enable) {
        if (rec_to(in, REC_EV_FAILED_RECONFIGURE, error))
            reconfigure_now(c, in, error ? error : "strategy failed", -1);
        return;
    }
    if (!rec_to(in, REC_EV_EXHAUSTED, "reconfiguration disabled"))
        return;
    log_error("recovery_exhausted", LF_INT("instance_id", in->id),
              LF_STR("reason", "reconfiguration disabled"));
    if (rt && rt->phase == FT_RECONFIGURING)
        ctl_ft_event(rt, ctl_ft_resume_event(rt), "given up");
    in->withdrawn = false;
    ctl_push_reconcile(c, in);
}

/* ---- reconfiguration ---------------------------------------------------------------------- */

void ctl_reconfigure(struct ctl *c, struct ctl_inst *in, const char *reason, ssize_t except_idx)
{
    if (rec_to(in, REC_EV_RECONFIGURE, reason))
        reconfigure_now(c, in, reason, except_idx);
}

/* RECONFIGURE entered. */
static void reconfigure_now(struct ctl *c, struct ctl_inst *in, const char *reason,
                            ssize_t except_idx)
{
    if (!in->ft) {
        in->ft = ctl_ft_rt_new(in->id, in->job_name);
    }
    struct ctl_ft_rt *rt = in->ft;
    bool repeat = rt->reconfiguration_dispatched;
    log_warn("instance_reconfiguring", LF_INT("instance_id", in->id),
             LF_STR("job_name", in->job_name), LF_STR("reason", reason), LF_BOOL("repeat", repeat));
    ctl_ft_set_error(rt, reason);
    ctl_ft_event(rt, FT_EV_RECONFIGURE, reason);
    if (!repeat && c->cfg.reconfig_enable) {
        ctl_ft_set_strategy(rt, STRAT_RECONFIG, "STOP_NODE_MANAGERS", reason);
        for (size_t i = 0; i < in->n_nms; i++) {
            if ((ssize_t)i == except_idx)
                continue;
            char *url = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "/node-manager/stop");
            ctl_http_fire(c, "POST", url, NULL, c->cfg.start_cmd_timeout_ms, "node_manager_stop",
                          in->id);
            free(url);
        }
        rt->reconfiguration_dispatched = true;
        rt->dirty = true;
        ctl_ft_set_strategy(rt, STRAT_RECONFIG, "DISPATCHED",
                            "node managers told to stop; the job reassembles when they register");
        metrics_counter_inc(metrics_counter_labels(c->m.strategies, "strategy", STRAT_RECONFIG,
                                                   "result", "dispatched"));
    }
    ctl_save_rt(c, rt);
    in->separated = true;
    ctl_strategy_detach(c, in);
    ctl_set_status(c, in, WIRE_INS_DELETED, reason);
}
