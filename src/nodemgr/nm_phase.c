/* nm_phase — the node manager's phase machine and the dispatcher of engine events.
 *
 * The phase says what the node manager as a whole is doing (idle, launching a start,
 * relaunching, exiting, ...). Requests (start, engine-restart, stop, shutdown) and
 * completions (a group stop is over, an engine changed state, the readiness wait timed
 * out) are phase events; nm_phase_table says what each does in each phase, and
 * phase_set() is the only writer of nm->phase. The actions call the mechanics of
 * nm_launch.c (launch, respawn, answers), nm_ft.c (polling), nm_arbiter.c (freezes,
 * episodes), nm_ctrl.c and nm_main.c (shutdown).
 *
 * nm_phase_engine() is the dispatcher of engine transitions (nm_engine.c raises them,
 * nm_engine_table decides them): the one place that turns an engine's change into what
 * the rest of the node manager does — the readiness wait, the restart policy or the
 * death report, the end of the grace period. docs/node-manager.md has both tables and
 * the event flow of one engine death. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <string.h>

/* ---- the phase table ------------------------------------------------------------------ */

/* One line per cell: the table reads as the table it is. */
/* clang-format off */
#define C(a, n) {NM_PA_##a, NM_PH_##n}
/* Requests refused while another is in progress (409) or while stopping (503); in those
 * cells the phase does not change. */
#define BUSY(p) C(REJECT_BUSY, p)
#define STOPPING(p) C(REJECT_STOPPING, p)
const struct nm_phase_cell nm_phase_table[NM_PH_COUNT][NM_PEV_COUNT] = {
    [NM_PH_IDLE] = {
        [NM_PEV_START] = C(STOP_FOR_START, STOPPING_FOR_START),
        [NM_PEV_LAUNCH] = C(LAUNCH, STARTING),
        [NM_PEV_RELAUNCH] = C(RELAUNCH_STOP, RELAUNCH_STOPPING),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, IDLE),
    },
    [NM_PH_STOPPING_FOR_START] = {
        [NM_PEV_START] = BUSY(STOPPING_FOR_START),
        [NM_PEV_LAUNCH] = BUSY(STOPPING_FOR_START),
        [NM_PEV_RELAUNCH] = BUSY(STOPPING_FOR_START),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_STOPPED] = C(LAUNCH, STARTING),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, STOPPING_FOR_START),
    },
    [NM_PH_STARTING] = {
        [NM_PEV_START] = C(STOP_FOR_START, STOPPING_FOR_START),
        [NM_PEV_LAUNCH] = C(LAUNCH, STARTING),
        [NM_PEV_RELAUNCH] = C(RELAUNCH_STOP, RELAUNCH_STOPPING),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_CHANGED] = C(CHECK_START, STARTING),
        [NM_PEV_READY] = C(STARTED, RUNNING),
        [NM_PEV_WAIT_TIMEOUT] = C(START_NOT_READY, RUNNING),
        [NM_PEV_LAUNCH_FAILED] = C(NONE, IDLE),
    },
    [NM_PH_RUNNING] = {
        [NM_PEV_START] = C(STOP_FOR_START, STOPPING_FOR_START),
        [NM_PEV_LAUNCH] = C(LAUNCH, STARTING),
        [NM_PEV_RELAUNCH] = C(RELAUNCH_STOP, RELAUNCH_STOPPING),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, RUNNING),
    },
    [NM_PH_RELAUNCH_STOPPING] = {
        [NM_PEV_START] = BUSY(RELAUNCH_STOPPING),
        [NM_PEV_LAUNCH] = BUSY(RELAUNCH_STOPPING),
        [NM_PEV_RELAUNCH] = BUSY(RELAUNCH_STOPPING),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_STOPPED] = C(RESPAWN, RELAUNCHING),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, RELAUNCH_STOPPING),
    },
    [NM_PH_RELAUNCHING] = {
        [NM_PEV_START] = BUSY(RELAUNCHING),
        [NM_PEV_LAUNCH] = BUSY(RELAUNCHING),
        [NM_PEV_RELAUNCH] = BUSY(RELAUNCHING),
        [NM_PEV_STOP] = C(EXIT, EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_CHANGED] = C(CHECK_RELAUNCH, RELAUNCHING),
        [NM_PEV_READY] = C(RELAUNCHED, RUNNING),
        [NM_PEV_ENGINE_LOST] = C(RELAUNCH_NOT_READY, RUNNING),
        [NM_PEV_WAIT_TIMEOUT] = C(RELAUNCH_NOT_READY, RUNNING),
        [NM_PEV_LAUNCH_FAILED] = C(NONE, RUNNING),
    },
    [NM_PH_EXITING] = {
        [NM_PEV_START] = STOPPING(EXITING),
        [NM_PEV_LAUNCH] = STOPPING(EXITING),
        [NM_PEV_RELAUNCH] = STOPPING(EXITING),
        [NM_PEV_STOP] = BUSY(EXITING),
        [NM_PEV_SHUTDOWN] = C(SHUTDOWN, SHUTTING_DOWN),
        [NM_PEV_ENGINES_STOPPED] = C(ABANDON, EXITING),
        [NM_PEV_SERVICES_STOPPED] = C(EXIT_SOON, EXITING),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, EXITING),
    },
    [NM_PH_SHUTTING_DOWN] = {
        [NM_PEV_START] = STOPPING(SHUTTING_DOWN),
        [NM_PEV_LAUNCH] = STOPPING(SHUTTING_DOWN),
        [NM_PEV_RELAUNCH] = STOPPING(SHUTTING_DOWN),
        [NM_PEV_STOP] = STOPPING(SHUTTING_DOWN),
        [NM_PEV_SHUTDOWN] = C(NONE, SHUTTING_DOWN),
        [NM_PEV_ENGINES_STOPPED] = C(ABANDON, SHUTTING_DOWN),
        [NM_PEV_SERVICES_STOPPED] = C(ANSWER_STOP, SHUTTING_DOWN),
        [NM_PEV_ENGINES_CHANGED] = C(NONE, SHUTTING_DOWN),
    },
};
#undef BUSY
#undef STOPPING
#undef C
/* clang-format on */

static const char *const phase_names[NM_PH_COUNT] = {
    [NM_PH_IDLE] = "idle",
    [NM_PH_STOPPING_FOR_START] = "stopping_for_start",
    [NM_PH_STARTING] = "starting",
    [NM_PH_RUNNING] = "running",
    [NM_PH_RELAUNCH_STOPPING] = "relaunch_stopping",
    [NM_PH_RELAUNCHING] = "relaunching",
    [NM_PH_EXITING] = "exiting",
    [NM_PH_SHUTTING_DOWN] = "shutting_down",
};

static const char *const event_names[NM_PEV_COUNT] = {
    [NM_PEV_START] = "start",
    [NM_PEV_LAUNCH] = "launch",
    [NM_PEV_RELAUNCH] = "relaunch",
    [NM_PEV_STOP] = "stop",
    [NM_PEV_SHUTDOWN] = "shutdown",
    [NM_PEV_ENGINES_STOPPED] = "engines_stopped",
    [NM_PEV_SERVICES_STOPPED] = "services_stopped",
    [NM_PEV_ENGINES_CHANGED] = "engines_changed",
    [NM_PEV_READY] = "ready",
    [NM_PEV_ENGINE_LOST] = "engine_lost",
    [NM_PEV_WAIT_TIMEOUT] = "wait_timeout",
    [NM_PEV_LAUNCH_FAILED] = "launch_failed",
};

static const char *const action_names[NM_PA_COUNT] = {
    [NM_PA_ILLEGAL] = "illegal",
    [NM_PA_NONE] = "none",
    [NM_PA_REJECT_BUSY] = "reject_busy",
    [NM_PA_REJECT_STOPPING] = "reject_stopping",
    [NM_PA_STOP_FOR_START] = "stop_for_start",
    [NM_PA_LAUNCH] = "launch",
    [NM_PA_RELAUNCH_STOP] = "relaunch_stop",
    [NM_PA_RESPAWN] = "respawn",
    [NM_PA_EXIT] = "exit",
    [NM_PA_EXIT_SOON] = "exit_soon",
    [NM_PA_ANSWER_STOP] = "answer_stop",
    [NM_PA_SHUTDOWN] = "shutdown",
    [NM_PA_ABANDON] = "abandon",
    [NM_PA_CHECK_START] = "check_start",
    [NM_PA_CHECK_RELAUNCH] = "check_relaunch",
    [NM_PA_STARTED] = "started",
    [NM_PA_START_NOT_READY] = "start_not_ready",
    [NM_PA_RELAUNCHED] = "relaunched",
    [NM_PA_RELAUNCH_NOT_READY] = "relaunch_not_ready",
};

const char *nm_phase_str(enum nm_phase p)
{
    return (unsigned)p < NM_PH_COUNT ? phase_names[p] : "?";
}

const char *nm_phase_event_str(enum nm_phase_event ev)
{
    return (unsigned)ev < NM_PEV_COUNT ? event_names[ev] : "?";
}

const char *nm_phase_action_str(enum nm_phase_action a)
{
    return (unsigned)a < NM_PA_COUNT ? action_names[a] : "?";
}

enum nm_phase_action nm_phase_verdict(const struct nodemgr *nm, enum nm_phase_event ev)
{
    if ((unsigned)ev >= NM_PEV_COUNT)
        return NM_PA_ILLEGAL;
    return nm_phase_table[nm->phase][ev].act;
}

/* ---- the transition function ---------------------------------------------------------- */

static bool waiting(enum nm_phase p)
{
    return p == NM_PH_STARTING || p == NM_PH_RELAUNCHING;
}

/* The only writer of nm->phase. Leaving a readiness wait ends its timer. */
static void phase_set(struct nodemgr *nm, enum nm_phase to, enum nm_phase_event ev,
                      const char *cause)
{
    enum nm_phase from = nm->phase;
    if (from == to)
        return;
    log_info("nm_phase", LF_STR("from", nm_phase_str(from)), LF_STR("to", nm_phase_str(to)),
             LF_STR("event", nm_phase_event_str(ev)), LF_STR("cause", cause));
    if (waiting(from))
        reactor_timer_stop(nm->r, &nm->wait_timer);
    nm->phase = to;
}

static void wait_timeout(struct reactor *r, void *arg)
{
    (void)r;
    nm_phase_event(arg, NM_PEV_WAIT_TIMEOUT, "startup_timeout elapsed");
}

static void wait_begin(struct nodemgr *nm)
{
    nm_timer_start(nm->r, &nm->wait_timer, wait_timeout, nm,
                   (int64_t)nm->cfg->health.startup_timeout * 1000, 0);
}

static void engines_stopped(struct nodemgr *nm, void *arg)
{
    (void)arg;
    nm_phase_event(nm, NM_PEV_ENGINES_STOPPED, "group stop over");
}

static void services_stopped(struct nodemgr *nm, void *arg)
{
    (void)arg;
    nm_phase_event(nm, NM_PEV_SERVICES_STOPPED, "services stopped");
}

static void stop_exit_fire(struct reactor *r, void *arg)
{
    (void)r;
    nm_shutdown(arg, "stop requested");
}

static void relaunch_failed(struct nodemgr *nm, const char *why)
{
    nm_unfreeze(nm, NM_FREEZE_RELAUNCH, "relaunch failed");
    nm_ft_resume(nm);
    log_error("relaunch_failed", LF_STR("why", why));
}

/* The action of a cell (the phase is already the new one). Returns a follow-up event
 * (its cause in *cause) or NM_PEV_NONE. */
static enum nm_phase_event run_action(struct nodemgr *nm, enum nm_phase_action act,
                                      const char **cause)
{
    char why[WIRE_ERR_MAX + 64];
    switch (act) {
    case NM_PA_ILLEGAL:
    case NM_PA_NONE:
    case NM_PA_REJECT_BUSY:
    case NM_PA_REJECT_STOPPING:
    case NM_PA_COUNT:
        break;
    case NM_PA_STOP_FOR_START:
        /* Another spec: the old engines go first (upstream refuses with a 500 and the
         * instance times out; the Controller's newest word wins here). */
        log_info("start_replacing_engines",
                 LF_INT("instance_id", nm->pending_start ? nm->pending_start->instance_id : -1));
        nm_engine_stop_all(nm, nm_stop_grace_ms(nm), engines_stopped, NULL);
        break;
    case NM_PA_RELAUNCH_STOP:
        nm_engine_stop_all(nm, nm_stop_grace_ms(nm), engines_stopped, NULL);
        break;
    case NM_PA_LAUNCH:
        if (nm_launch_begin(nm, why, sizeof(why)) < 0) {
            log_warn("start_failed", LF_STR("why", why));
            nm_launch_answer_error(nm, 500, why);
            *cause = "launch failed";
            return NM_PEV_LAUNCH_FAILED;
        }
        wait_begin(nm);
        nm_launch_answer_json(nm, 200, json_object());
        *cause = "launched";
        return NM_PEV_ENGINES_CHANGED;
    case NM_PA_RESPAWN:
        if (nm_launch_respawn(nm, why, sizeof(why)) < 0) {
            char detail[sizeof(why) + 32];
            snprintf(detail, sizeof(detail), "Engine restart failed: %s", why);
            relaunch_failed(nm, why);
            nm_launch_answer_error(nm, 500, detail);
            *cause = "respawn failed";
            return NM_PEV_LAUNCH_FAILED;
        }
        wait_begin(nm);
        nm_launch_answer_json(nm, 200, json_pack("{s:s}", "message", "engine restart accepted"));
        *cause = "relaunched";
        return NM_PEV_ENGINES_CHANGED;
    case NM_PA_EXIT:
        /* From the moment the stop is accepted the Controller hears nothing more from us:
         * it has written this pod off, and heartbeats would keep reporting the engines we
         * are stopping (their last probed status) for the whole grace. Arbitration and FT
         * polling end too: the engines going down now is what was asked for, not a
         * fault. */
        nm_ctrl_stop(nm);
        nm_arb_stop(nm);
        nm_ft_stop(nm);
        /* ... and the launch it gave us is void: the next start (the pod rescheduled, or a
         * supervisor restarting us with the same files) registers afresh instead of
         * re-registering an instance the Controller deleted (a partially lost one is
         * refused with 410 and stopped again: an endless loop otherwise). */
        nm_launch_forget(nm);
        nm_services_stop(nm, nm_stop_grace_ms(nm), services_stopped, NULL);
        break;
    case NM_PA_EXIT_SOON:
        log_info("engines_stopped", LF_STR("cause", "stop route"));
        nm_launch_answer_stop(nm);
        /* Upstream SIGTERMs itself 0.5 s later: the answer gets out, then the pod
         * restarts. */
        nm_timer_start(nm->r, &nm->stop_exit_timer, stop_exit_fire, nm, NM_STOP_EXIT_DELAY_MS, 0);
        break;
    case NM_PA_ANSWER_STOP:
        nm_launch_answer_stop(nm);
        break;
    case NM_PA_SHUTDOWN:
        nm_shutdown_run(nm, *cause);
        break;
    case NM_PA_ABANDON:
        nm_launch_abandon(nm);
        break;
    case NM_PA_CHECK_START:
        if (nm_engine_all_ready(nm)) {
            *cause = "every endpoint ready";
            return NM_PEV_READY;
        }
        break;
    case NM_PA_CHECK_RELAUNCH:
        if (nm_engine_all_ready(nm)) {
            *cause = "every endpoint ready";
            return NM_PEV_READY;
        }
        if (nm->cfg->restart_policy == NM_RESTART_CONTROLLER && nm_engine_any_stopped(nm)) {
            *cause = "an engine died while loading";
            return NM_PEV_ENGINE_LOST;
        }
        break;
    case NM_PA_STARTED:
        log_info("engines_ready", LF_INT("instance_id", nm->launch ? nm->launch->instance_id : -1),
                 LF_INT("endpoints", nm->n_eps));
        /* FT polling only for engines that made it: a cold-start failure never enters the
         * runtime FT pipeline (§2.4 phase 3). */
        nm_ft_engines_ready(nm);
        break;
    case NM_PA_START_NOT_READY:
        log_warn("engines_not_ready", LF_STR("why", *cause));
        break;
    case NM_PA_RELAUNCHED:
        /* The newest upstream fix (§12.1): a successful relaunch closes the fault episode,
         * so a re-failure inside the old window is reported again. */
        nm_unfreeze(nm, NM_FREEZE_RELAUNCH, "relaunch ready");
        nm_unfreeze(nm, NM_FREEZE_FAULT, "relaunch ready");
        nm_arb_new_episode(nm);
        nm_ft_resume(nm);
        log_info("relaunch_ready", LF_INT("relaunch", nm->relaunch_count));
        break;
    case NM_PA_RELAUNCH_NOT_READY:
        /* FT polling stays paused; the relaunch freeze expires by itself and the
         * container-restart fallback comes back. */
        log_warn("relaunch_not_ready", LF_INT("relaunch", nm->relaunch_count),
                 LF_STR("why", *cause));
        break;
    }
    return NM_PEV_NONE;
}

static void phase_step(struct nodemgr *nm, enum nm_phase_event ev, const char *cause)
{
    while (ev != NM_PEV_NONE) {
        if ((unsigned)ev >= NM_PEV_COUNT)
            return;
        const struct nm_phase_cell *c = &nm_phase_table[nm->phase][ev];
        if (c->act == NM_PA_ILLEGAL) {
            log_warn("nm_phase_event_ignored", LF_STR("phase", nm_phase_str(nm->phase)),
                     LF_STR("event", nm_phase_event_str(ev)), LF_STR("cause", cause));
            return;
        }
        if (c->act == NM_PA_REJECT_BUSY || c->act == NM_PA_REJECT_STOPPING) {
            /* A verdict for the request handlers (nm_phase_verdict); raised, it is a
             * no-op. */
            log_debug("nm_phase_event_refused", LF_STR("phase", nm_phase_str(nm->phase)),
                      LF_STR("event", nm_phase_event_str(ev)), LF_STR("cause", cause));
            return;
        }
        phase_set(nm, c->next, ev, cause);
        const char *next_cause = cause;
        ev = run_action(nm, c->act, &next_cause);
        cause = next_cause;
    }
}

void nm_phase_event(struct nodemgr *nm, enum nm_phase_event ev, const char *cause)
{
    struct nm_phase_queue *q = &nm->phq;
    if ((unsigned)ev >= NM_PEV_COUNT)
        return;
    /* Each kind at most once: every event is a fact or a "look again", so a second one
     * pending adds nothing (and the queue can never overflow). */
    for (unsigned i = 0; i < q->n; i++)
        if (q->ev[i] == (int8_t)ev)
            return;
    q->ev[q->n] = (int8_t)ev;
    q->cause[q->n] = cause;
    q->n++;
    if (q->running)
        return; /* an action is running: after it, in order */
    q->running++;
    while (q->n > 0) {
        enum nm_phase_event next = (enum nm_phase_event)q->ev[0];
        const char *why = q->cause[0];
        q->n--;
        memmove(&q->ev[0], &q->ev[1], q->n * sizeof(q->ev[0]));
        memmove(&q->cause[0], &q->cause[1], q->n * sizeof(q->cause[0]));
        phase_step(nm, next, why);
    }
    q->running--;
}

/* ---- the dispatcher of engine transitions ------------------------------------------------- */

void nm_phase_engine(struct nm_endpoint *e, const struct nm_engine_change *c)
{
    struct nodemgr *nm = e->nm;
    /* The readiness wait looks only at states: only a change can end it. */
    if (c->from != c->to)
        nm_phase_event(nm, NM_PEV_ENGINES_CHANGED, c->cause);
    switch (c->act) {
    case NM_EA_DIED:
        if (nm->cfg->restart_policy == NM_RESTART_LOCAL) {
            /* The node manager owns the recovery: no report while it restarts. */
            nm_engine_restart_policy(e, e->last_exit_healthy_ms);
            break;
        }
        /* A dead engine is a hard fact: the cold-start grace no longer protects the pod. */
        nm_grace_end(nm, "engine_died");
        nm_death_report(e, e->last_exit_mono_ms);
        break;
    case NM_EA_SPAWN_FAILED:
        nm_engine_restart_policy(e, 0);
        break;
    case NM_EA_GIVE_UP:
        /* Now it is the Controller's (or the operator's) problem. */
        if (e->has_last_exit)
            nm_death_report(e, util_mono_ms());
        break;
    default:
        break;
    }
}
