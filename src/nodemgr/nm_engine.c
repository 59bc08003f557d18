/* nm_engine — the engine service: one supervised process per endpoint, and its state
 * machine.
 *
 * Spawn (proc: own session, PDEATHSIG, pidfd), death the instant it happens (the pidfd
 * fires, the group is swept), /health probing of every endpoint concurrently (§6.5),
 * the runtime-state -> endpoint-status mapping (§2.9), the local restart policy, and the
 * engines' output (in-memory tail, rotated file, passthrough to the NM's stdout).
 *
 * Every change of an endpoint's engine state goes through nm_engine_event(): the
 * callbacks here (pidfd exit, probe answers, the backoff timer) and the group operations
 * (spawn, stop, kill, rollback, retire) only raise events; nm_engine_table says what each
 * does in each state. Actions do what is local to the engine (processes, timers,
 * status); everything else the node manager does about a transition is the
 * dispatcher's (nm_phase_engine), called after each one. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "nodemgr/engine_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the state table ------------------------------------------------------------------ */

/* One line per cell: the table reads as the table it is. */
/* clang-format off */
#define C(a, n) {NM_EA_##a, NM_ES_##n}
/* Rows: states; columns: events. A missing cell is {0, 0} = NM_EA_ILLEGAL. */
const struct nm_engine_cell nm_engine_table[NM_ES_COUNT][NM_EV_COUNT] = {
    [NM_ES_STOPPED] = {
        [NM_EV_SPAWNED] = C(SPAWNED, STARTING),
        [NM_EV_STOP] = C(NONE, STOPPED),
        [NM_EV_KILL] = C(NONE, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_BACKOFF] = C(BACKOFF, BACKOFF),
        [NM_EV_GIVE_UP] = C(GIVE_UP, FAILED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED_STOPPED),
        [NM_EV_RESET] = C(RESET, STOPPED),
    },
    [NM_ES_STARTING] = {
        [NM_EV_EXITED] = C(DIED, STOPPED),
        [NM_EV_GONE] = C(GONE, STOPPED),
        [NM_EV_PROBE_OK] = C(PROBED, READY),
        [NM_EV_PROBE_FAILED] = C(PROBED, STARTING),
        [NM_EV_STARTUP_TIMEOUT] = C(PROBED, UNHEALTHY),
        [NM_EV_ALIVE] = C(PROBED, RUNNING),
        [NM_EV_STOP] = C(STOP, STOPPING),
        [NM_EV_KILL] = C(KILL, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED),
        [NM_EV_RESET] = C(RESET, STARTING),
    },
    [NM_ES_RUNNING] = {
        [NM_EV_EXITED] = C(DIED, STOPPED),
        [NM_EV_GONE] = C(GONE, STOPPED),
        [NM_EV_ALIVE] = C(PROBED, RUNNING),
        [NM_EV_STOP] = C(STOP, STOPPING),
        [NM_EV_KILL] = C(KILL, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED),
        [NM_EV_RESET] = C(RESET, RUNNING),
    },
    [NM_ES_READY] = {
        [NM_EV_EXITED] = C(DIED, STOPPED),
        [NM_EV_GONE] = C(GONE, STOPPED),
        [NM_EV_PROBE_OK] = C(PROBED, READY),
        [NM_EV_PROBE_FAILED] = C(PROBED, UNHEALTHY),
        [NM_EV_STARTUP_TIMEOUT] = C(PROBED, UNHEALTHY),
        [NM_EV_STOP] = C(STOP, STOPPING),
        [NM_EV_KILL] = C(KILL, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED),
        [NM_EV_RESET] = C(RESET, READY),
    },
    [NM_ES_UNHEALTHY] = {
        [NM_EV_EXITED] = C(DIED, STOPPED),
        [NM_EV_GONE] = C(GONE, STOPPED),
        [NM_EV_PROBE_OK] = C(PROBED, READY),
        [NM_EV_PROBE_FAILED] = C(PROBED, UNHEALTHY),
        [NM_EV_STARTUP_TIMEOUT] = C(PROBED, UNHEALTHY),
        [NM_EV_STOP] = C(STOP, STOPPING),
        [NM_EV_KILL] = C(KILL, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED),
        [NM_EV_RESET] = C(RESET, UNHEALTHY),
    },
    [NM_ES_STOPPING] = {
        [NM_EV_EXITED] = C(STOPPED, STOPPED),
        [NM_EV_GONE] = C(NONE, STOPPING),
        [NM_EV_STOP] = C(NONE, STOPPING), /* counted by the first stop */
        [NM_EV_KILL] = C(KILL, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, STOPPED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED_STOPPING),
        [NM_EV_RESET] = C(RESET, STOPPING),
    },
    [NM_ES_BACKOFF] = {
        [NM_EV_SPAWNED] = C(SPAWNED, STARTING),
        [NM_EV_SPAWN_FAILED] = C(SPAWN_FAILED, STOPPED),
        [NM_EV_STOP] = C(CANCEL_RESTART, STOPPED),
        [NM_EV_KILL] = C(CANCEL_RESTART, STOPPED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, BACKOFF),
        [NM_EV_RESTART_DUE] = C(RESTART, BACKOFF),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED_STOPPED),
        [NM_EV_RESET] = C(RESET, STOPPED),
    },
    [NM_ES_FAILED] = {
        [NM_EV_SPAWNED] = C(SPAWNED, STARTING),
        [NM_EV_STOP] = C(NONE, FAILED),
        [NM_EV_KILL] = C(NONE, FAILED),
        [NM_EV_ROLLBACK] = C(ROLLBACK, FAILED),
        [NM_EV_RETIRE] = C(RETIRE, RETIRED_STOPPED),
        [NM_EV_RESET] = C(RESET, STOPPED),
    },
    [NM_ES_RETIRED] = {
        [NM_EV_EXITED] = C(DIED_RETIRED, RETIRED_STOPPED),
        [NM_EV_GONE] = C(GONE, RETIRED_STOPPED),
        [NM_EV_STOP] = C(STOP, RETIRED_STOPPING),
        [NM_EV_KILL] = C(KILL, RETIRED_STOPPED),
        [NM_EV_ROLLBACK] = C(NONE, RETIRED),
        [NM_EV_RETIRE] = C(NONE, RETIRED),
        [NM_EV_RESET] = C(RESET, RETIRED),
    },
    [NM_ES_RETIRED_STOPPING] = {
        [NM_EV_EXITED] = C(STOPPED, RETIRED_STOPPED),
        [NM_EV_GONE] = C(NONE, RETIRED_STOPPING),
        [NM_EV_STOP] = C(NONE, RETIRED_STOPPING),
        [NM_EV_KILL] = C(KILL, RETIRED_STOPPED),
        [NM_EV_ROLLBACK] = C(NONE, RETIRED_STOPPING),
        [NM_EV_RETIRE] = C(NONE, RETIRED_STOPPING),
        [NM_EV_RESET] = C(RESET, RETIRED_STOPPING),
    },
    [NM_ES_RETIRED_STOPPED] = {
        [NM_EV_STOP] = C(NONE, RETIRED_STOPPED),
        [NM_EV_KILL] = C(NONE, RETIRED_STOPPED),
        [NM_EV_ROLLBACK] = C(NONE, RETIRED_STOPPED),
        [NM_EV_RETIRE] = C(NONE, RETIRED_STOPPED),
        [NM_EV_RESET] = C(RESET, RETIRED_STOPPED),
    },
};
#undef C
/* clang-format on */

static const char *const state_names[NM_ES_COUNT] = {
    [NM_ES_STOPPED] = "stopped",
    [NM_ES_STARTING] = "starting",
    [NM_ES_RUNNING] = "running",
    [NM_ES_READY] = "ready",
    [NM_ES_UNHEALTHY] = "unhealthy",
    [NM_ES_STOPPING] = "stopping",
    [NM_ES_BACKOFF] = "backoff",
    [NM_ES_FAILED] = "failed",
    [NM_ES_RETIRED] = "retired",
    [NM_ES_RETIRED_STOPPING] = "retired_stopping",
    [NM_ES_RETIRED_STOPPED] = "retired_stopped",
};

static const char *const event_names[NM_EV_COUNT] = {
    [NM_EV_SPAWNED] = "spawned",
    [NM_EV_SPAWN_FAILED] = "spawn_failed",
    [NM_EV_EXITED] = "exited",
    [NM_EV_GONE] = "gone",
    [NM_EV_PROBE_OK] = "probe_ok",
    [NM_EV_PROBE_FAILED] = "probe_failed",
    [NM_EV_STARTUP_TIMEOUT] = "startup_timeout",
    [NM_EV_ALIVE] = "alive",
    [NM_EV_STOP] = "stop",
    [NM_EV_KILL] = "kill",
    [NM_EV_ROLLBACK] = "rollback",
    [NM_EV_BACKOFF] = "backoff",
    [NM_EV_GIVE_UP] = "give_up",
    [NM_EV_RESTART_DUE] = "restart_due",
    [NM_EV_RETIRE] = "retire",
    [NM_EV_RESET] = "reset",
};

static const char *const action_names[NM_EA_COUNT] = {
    [NM_EA_ILLEGAL] = "illegal",   [NM_EA_NONE] = "none",
    [NM_EA_SPAWNED] = "spawned",   [NM_EA_SPAWN_FAILED] = "spawn_failed",
    [NM_EA_DIED] = "died",         [NM_EA_DIED_RETIRED] = "died_retired",
    [NM_EA_STOPPED] = "stopped",   [NM_EA_GONE] = "gone",
    [NM_EA_PROBED] = "probed",     [NM_EA_STOP] = "stop",
    [NM_EA_KILL] = "kill",         [NM_EA_CANCEL_RESTART] = "cancel_restart",
    [NM_EA_ROLLBACK] = "rollback", [NM_EA_BACKOFF] = "backoff",
    [NM_EA_GIVE_UP] = "give_up",   [NM_EA_RESTART] = "restart",
    [NM_EA_RETIRE] = "retire",     [NM_EA_RESET] = "reset",
};

const char *nm_engine_state_str(enum nm_engine_state s)
{
    return (unsigned)s < NM_ES_COUNT ? state_names[s] : "?";
}

const char *nm_engine_event_str(enum nm_engine_event ev)
{
    return (unsigned)ev < NM_EV_COUNT ? event_names[ev] : "?";
}

const char *nm_engine_action_str(enum nm_engine_action a)
{
    return (unsigned)a < NM_EA_COUNT ? action_names[a] : "?";
}

enum nm_runtime nm_engine_state_runtime(enum nm_engine_state s)
{
    switch (s) {
    case NM_ES_STARTING:
        return NM_RT_STARTING;
    case NM_ES_RUNNING:
        return NM_RT_RUNNING;
    case NM_ES_READY:
        return NM_RT_READY;
    case NM_ES_UNHEALTHY:
        return NM_RT_UNHEALTHY;
    case NM_ES_STOPPING:
    case NM_ES_RETIRED:
    case NM_ES_RETIRED_STOPPING:
        return NM_RT_STOPPING;
    case NM_ES_STOPPED:
    case NM_ES_BACKOFF:
    case NM_ES_FAILED:
    case NM_ES_RETIRED_STOPPED:
    case NM_ES_COUNT:
        break;
    }
    return NM_RT_STOPPED;
}

bool nm_engine_state_has_process(enum nm_engine_state s)
{
    switch (s) {
    case NM_ES_STARTING:
    case NM_ES_RUNNING:
    case NM_ES_READY:
    case NM_ES_UNHEALTHY:
    case NM_ES_STOPPING:
    case NM_ES_RETIRED:
    case NM_ES_RETIRED_STOPPING:
        return true;
    default:
        return false;
    }
}

bool nm_engine_state_probed(enum nm_engine_state s)
{
    return s == NM_ES_STARTING || s == NM_ES_RUNNING || s == NM_ES_READY || s == NM_ES_UNHEALTHY;
}

bool nm_engine_state_retired(enum nm_engine_state s)
{
    return s == NM_ES_RETIRED || s == NM_ES_RETIRED_STOPPING || s == NM_ES_RETIRED_STOPPED;
}

enum nm_engine_event nm_engine_probe_event(enum nm_probe_result res, int64_t since_spawn_ms,
                                           int64_t startup_timeout_ms)
{
    if (res == NM_PROBE_OK)
        return NM_EV_PROBE_OK;
    return since_spawn_ms < startup_timeout_ms ? NM_EV_PROBE_FAILED : NM_EV_STARTUP_TIMEOUT;
}

/* ---- pure rules -------------------------------------------------------------------------- */

static const char *const rt_names[] = {
    [NM_RT_STARTING] = "starting",   [NM_RT_RUNNING] = "running",   [NM_RT_READY] = "ready",
    [NM_RT_UNHEALTHY] = "unhealthy", [NM_RT_STOPPING] = "stopping", [NM_RT_STOPPED] = "stopped",
};

const char *nm_runtime_str(enum nm_runtime rt)
{
    return (unsigned)rt < ARRAY_LEN(rt_names) ? rt_names[rt] : "?";
}

enum wire_ep_status nm_status_from_runtime(enum nm_runtime rt, enum wire_ep_status prev)
{
    /* PreStop: a paused endpoint stays paused until /resume, whatever the probes say. */
    if (prev == WIRE_EP_PAUSED)
        return WIRE_EP_PAUSED;
    switch (rt) {
    case NM_RT_RUNNING:
        return WIRE_EP_WAIT2START;
    case NM_RT_READY:
        return WIRE_EP_NORMAL;
    case NM_RT_UNHEALTHY:
    case NM_RT_STOPPED:
        return WIRE_EP_ABNORMAL;
    case NM_RT_STARTING:
    case NM_RT_STOPPING:
        break;
    }
    return prev;
}

enum nm_runtime nm_runtime_after_probe(enum nm_runtime cur, enum nm_probe_result res,
                                       int64_t since_spawn_ms, int64_t startup_timeout_ms)
{
    static const enum nm_engine_state of_runtime[] = {
        [NM_RT_STARTING] = NM_ES_STARTING, [NM_RT_RUNNING] = NM_ES_RUNNING,
        [NM_RT_READY] = NM_ES_READY,       [NM_RT_UNHEALTHY] = NM_ES_UNHEALTHY,
        [NM_RT_STOPPING] = NM_ES_STOPPING, [NM_RT_STOPPED] = NM_ES_STOPPED,
    };
    if ((unsigned)cur >= ARRAY_LEN(of_runtime))
        return cur;
    enum nm_engine_event ev = nm_engine_probe_event(res, since_spawn_ms, startup_timeout_ms);
    const struct nm_engine_cell *c = &nm_engine_table[of_runtime[cur]][ev];
    return c->act == NM_EA_ILLEGAL ? cur : nm_engine_state_runtime(c->next);
}

int64_t nm_backoff_next(int64_t cur_ms, int64_t initial_ms, int64_t max_ms)
{
    if (initial_ms < 1)
        initial_ms = 1;
    if (max_ms < initial_ms)
        max_ms = initial_ms;
    if (cur_ms <= 0)
        return initial_ms;
    if (cur_ms >= max_ms / 2)
        return max_ms;
    return cur_ms * 2;
}

/* ---- endpoints ----------------------------------------------------------------------------- */

struct nm_endpoint *nm_engine_find(struct nodemgr *nm, int64_t id)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        if (nm->eps[i]->ep.id == id)
            return nm->eps[i];
    return NULL;
}

static void endpoint_free(struct nm_endpoint *e)
{
    struct nodemgr *nm = e->nm;
    reactor_timer_stop(nm->r, &e->restart_timer);
    nm_engine_probes_cancel(e);
    proc_free(e->proc);
    wire_endpoint_release(&e->ep);
    free(e->log_path);
    free(e);
}

void nm_engine_free_endpoints(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        endpoint_free(nm->eps[i]);
    free(nm->eps);
    nm->eps = NULL;
    nm->n_eps = 0;
}

static void restart_fire(struct reactor *r, void *arg);

void nm_engine_set_endpoints(struct nodemgr *nm, const struct wire_start_cmd *cmd)
{
    nm_engine_free_endpoints(nm);
    nm->n_eps = cmd->n_endpoints;
    nm->eps = xcalloc(nm->n_eps ? nm->n_eps : 1, sizeof(*nm->eps));
    for (size_t i = 0; i < nm->n_eps; i++) {
        /* Zeroed: state NM_ES_STOPPED, the initial state, not a transition. */
        struct nm_endpoint *e = xcalloc(1, sizeof(*e));
        e->nm = nm;
        e->index = i;
        wire_endpoint_copy(&e->ep, &cmd->endpoints[i]);
        e->status = cmd->endpoints[i].status;
        reactor_timer_init(&e->restart_timer, restart_fire, e);
        nm->eps[i] = e;
    }
}

void nm_engine_set_status(struct nm_endpoint *e, enum wire_ep_status st, const char *cause)
{
    struct nodemgr *nm = e->nm;
    if (st == WIRE_EP_NORMAL) {
        e->ever_normal = true;
        nm_grace_end(nm, "endpoint_normal");
    }
    if (st == e->status)
        return;
    log_info("endpoint_status", LF_INT("endpoint_id", e->ep.id),
             LF_STR("from", wire_ep_status_str(e->status)), LF_STR("to", wire_ep_status_str(st)),
             LF_STR("cause", cause));
    e->status = st;
}

/* §2.9 for the state the endpoint is in now. */
static void map_status(struct nm_endpoint *e, const char *cause)
{
    nm_engine_set_status(e, nm_status_from_runtime(nm_engine_state_runtime(e->state), e->status),
                         cause);
}

/* A process the state says is there, reaped without its exit event reaching us. */
static bool lost_exit(const struct nm_endpoint *e)
{
    return nm_engine_state_has_process(e->state) && e->proc && !proc_running(e->proc);
}

/* ---- the transition function ------------------------------------------------------------ */

/* What an event brings besides its kind. */
struct engine_input {
    enum nm_engine_event ev;
    const char *cause;
    int64_t grace_ms; /* NM_EV_STOP */
};

/* The only writer of e->state. Leaving a state ends what belongs to it: the restart
 * timer (backoff) and a probe in flight (probed states); entering/leaving ready keeps
 * ready_since_ms. */
static void set_state(struct nm_endpoint *e, enum nm_engine_state to, enum nm_engine_event ev,
                      const char *cause)
{
    struct nodemgr *nm = e->nm;
    enum nm_engine_state from = e->state;
    if (from == to)
        return;
    log_info("engine_state", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
             LF_STR("from", nm_engine_state_str(from)), LF_STR("to", nm_engine_state_str(to)),
             LF_STR("event", nm_engine_event_str(ev)), LF_STR("cause", cause));
    if (to == NM_ES_READY)
        e->ready_since_ms = util_mono_ms();
    else if (from == NM_ES_READY)
        e->ready_since_ms = 0;
    if (from == NM_ES_BACKOFF)
        reactor_timer_stop(nm->r, &e->restart_timer);
    if (nm_engine_state_probed(from) && !nm_engine_state_probed(to))
        nm_engine_probes_cancel(e);
    e->state = to;
}

static int spawn_one(struct nm_endpoint *e, struct wire_err *err);
static void on_engine_stopped(struct proc *p, void *arg);

static void log_death(struct nm_endpoint *e, bool retired)
{
    const struct proc_status *st = &e->last_exit;
    metrics_counter_inc(e->nm->m.deaths);
    log_error("engine_exited", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
              LF_INT("exit_code", st->code), LF_INT("signal", st->signo),
              LF_BOOL("core_dumped", st->core_dumped), LF_INT("uptime_ms", e->last_exit_uptime_ms),
              LF_BOOL("retired", retired));
}

/* The engine-local part of a transition (the state is already the new one). Returns a
 * follow-up event or NM_EV_NONE. */
static enum nm_engine_event run_action(struct nm_endpoint *e, enum nm_engine_action act,
                                       const struct engine_input *in)
{
    struct nodemgr *nm = e->nm;
    const struct nm_config *cfg = nm->cfg;
    switch (act) {
    case NM_EA_ILLEGAL:
    case NM_EA_NONE:
    case NM_EA_COUNT:
        break;
    case NM_EA_SPAWNED:
        /* Fix of §12.9: a fresh process starts a fresh story — `initial` until the probes
         * say otherwise, so "relaxed" status really means "recovering". */
        if (e->status != WIRE_EP_PAUSED)
            nm_engine_set_status(e, WIRE_EP_INITIAL, "spawned");
        break;
    case NM_EA_SPAWN_FAILED:
    case NM_EA_GONE:
    case NM_EA_PROBED:
        map_status(e, in->cause);
        break;
    case NM_EA_DIED:
    case NM_EA_DIED_RETIRED:
        log_death(e, act == NM_EA_DIED_RETIRED);
        map_status(e, in->cause);
        break;
    case NM_EA_STOPPED:
        log_info("engine_stopped", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                 LF_INT("exit_code", e->last_exit.code), LF_INT("signal", e->last_exit.signo));
        break;
    case NM_EA_STOP:
        log_info("engine_stopping", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                 LF_INT("grace_ms", in->grace_ms));
        nm->stops_pending++;
        proc_stop(e->proc, in->grace_ms, on_engine_stopped, e);
        break;
    case NM_EA_KILL:
        if (e->proc && proc_running(e->proc)) {
            log_warn("engine_killed", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid));
            proc_kill_now(e->proc);
        }
        break;
    case NM_EA_CANCEL_RESTART:
        log_debug("engine_restart_cancelled", LF_INT("endpoint_id", e->ep.id),
                  LF_STR("cause", in->cause));
        break;
    case NM_EA_ROLLBACK:
        if (e->proc && proc_running(e->proc))
            proc_kill_now(e->proc);
        map_status(e, in->cause);
        break;
    case NM_EA_BACKOFF:
        e->backoff_ms =
            nm_backoff_next(e->backoff_ms, nm_config_ms(cfg->restart_backoff_initial_sec),
                            nm_config_ms(cfg->restart_backoff_max_sec));
        log_info("engine_restart_scheduled", LF_INT("endpoint_id", e->ep.id),
                 LF_INT("delay_ms", e->backoff_ms), LF_INT("restart", e->window_starts + 1));
        reactor_timer_start(nm->r, &e->restart_timer, e->backoff_ms, 0);
        break;
    case NM_EA_GIVE_UP:
        log_error("engine_failed", LF_INT("endpoint_id", e->ep.id),
                  LF_INT("restarts", e->window_starts),
                  LF_STR("why", "restart_start_limit reached; not restarting again"));
        break;
    case NM_EA_RESTART: {
        e->window_starts++;
        metrics_counter_inc(nm->m.local_restarts);
        log_info("engine_local_restart", LF_INT("endpoint_id", e->ep.id),
                 LF_INT("restart", e->window_starts), LF_INT("backoff_ms", e->backoff_ms));
        struct wire_err err = {{0}};
        return spawn_one(e, &err) < 0 ? NM_EV_SPAWN_FAILED : NM_EV_SPAWNED;
    }
    case NM_EA_RETIRE:
        log_info("endpoint_retired", LF_INT("endpoint_id", e->ep.id));
        break;
    case NM_EA_RESET:
        e->backoff_ms = 0;
        e->window_starts = 0;
        break;
    }
    return NM_EV_NONE;
}

static void engine_step(struct nm_endpoint *e, const struct engine_input *first)
{
    struct engine_input in = *first;
    while (in.ev != NM_EV_NONE) {
        if ((unsigned)in.ev >= NM_EV_COUNT)
            return;
        const struct nm_engine_cell *c = &nm_engine_table[e->state][in.ev];
        if (c->act == NM_EA_ILLEGAL) {
            log_warn("engine_event_ignored", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                     LF_STR("state", nm_engine_state_str(e->state)),
                     LF_STR("event", nm_engine_event_str(in.ev)), LF_STR("cause", in.cause));
            return;
        }
        struct nm_engine_change ch = {
            .from = e->state,
            .to = c->next,
            .ev = in.ev,
            .act = c->act,
            .cause = in.cause,
        };
        set_state(e, ch.to, ch.ev, ch.cause);
        enum nm_engine_event next = run_action(e, ch.act, &in);
        nm_phase_engine(e, &ch);
        in.ev = next;
        in.cause = next == NM_EV_SPAWNED ? "local restart" : "local restart failed";
    }
}

void nm_engine_event(struct nm_endpoint *e, enum nm_engine_event ev, const char *cause)
{
    struct engine_input in = {.ev = ev, .cause = cause};
    engine_step(e, &in);
}

/* ---- local restart policy -------------------------------------------------------------------- */

static void restart_fire(struct reactor *r, void *arg)
{
    (void)r;
    nm_engine_event(arg, NM_EV_RESTART_DUE, "backoff elapsed");
}

void nm_engine_restart_policy(struct nm_endpoint *e, int64_t healthy_ms)
{
    const struct nm_config *cfg = e->nm->cfg;
    /* Healthy long enough: the previous trouble is history. */
    if (healthy_ms >= nm_config_ms(cfg->restart_reset_after_sec)) {
        e->backoff_ms = 0;
        e->window_starts = 0;
    }
    if (cfg->restart_start_limit > 0 && e->window_starts >= cfg->restart_start_limit)
        nm_engine_event(e, NM_EV_GIVE_UP, "restart_start_limit reached");
    else
        nm_engine_event(e, NM_EV_BACKOFF, "local restart policy");
}

void nm_engine_reset_restart_state(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        nm_engine_event(nm->eps[i], NM_EV_RESET, "relaunch");
}

/* ---- output --------------------------------------------------------------------------- */

void nm_engine_passthrough_init(struct nodemgr *nm)
{
    nm->passthrough_fd = -1;
    struct stat st;
    if (fstat(STDOUT_FILENO, &st) < 0)
        return;
    /* A pipe consumer (the container runtime) that stalls must not stall the reactor:
     * reopen the pipe as a separate open file description we can make non-blocking
     * without touching fd 1 (shared with whoever started us). */
    if (S_ISFIFO(st.st_mode)) {
        int fd = open("/proc/self/fd/1", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
            nm->passthrough_fd = fd;
            return;
        }
    }
    /* A socket (journald's stdout stream) gets per-call MSG_DONTWAIT instead. */
    nm->passthrough_socket = S_ISSOCK(st.st_mode);
    nm->passthrough_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
}

static void passthrough_write(struct nodemgr *nm, const char *line, size_t len)
{
    if (nm->passthrough_fd < 0)
        return;
    struct iovec iov[2] = {{(void *)line, len}, {"\n", 1}};
    ssize_t n;
    if (nm->passthrough_socket) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        n = sendmsg(nm->passthrough_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
        n = writev(nm->passthrough_fd, iov, 2);
    }
    if (n < 0 || (size_t)n != len + 1)
        nm->passthrough_dropped++;
}

static void on_engine_line(struct proc *p, enum proc_stream stream, const char *line, size_t len,
                           void *arg)
{
    (void)p;
    (void)stream;
    struct nm_endpoint *e = arg;
    passthrough_write(e->nm, line, len);
}

void nm_engine_banner(struct nodemgr *nm, const char *text)
{
    passthrough_write(nm, text, strlen(text));
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (!e->log_path)
            continue;
        int fd = open(e->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            continue;
        struct iovec iov[2] = {{(void *)text, strlen(text)}, {"\n", 1}};
        if (writev(fd, iov, 2) < 0)
            log_warn("banner_write_failed", LF_STR("path", e->log_path));
        close(fd);
    }
}

/* ---- spawn and death ------------------------------------------------------------------------ */

static void on_engine_exit(struct proc *p, const struct proc_status *st, void *arg)
{
    struct nm_endpoint *e = arg;
    int64_t now = util_mono_ms();
    e->has_last_exit = true;
    e->last_exit = *st;
    e->last_exit_wall_ms = util_wall_ms();
    e->last_exit_mono_ms = now;
    e->last_exit_uptime_ms = proc_uptime_ms(p);
    e->last_exit_healthy_ms = e->ready_since_ms ? now - e->ready_since_ms : 0;
    nm_engine_event(e, NM_EV_EXITED, "process exited");
}

static char *endpoint_log_path(struct nodemgr *nm, const struct nm_endpoint *e)
{
    const char *dir = nm->cfg->engine_log_dir;
    if (!dir || !*dir)
        return NULL;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        log_warn("engine_log_dir_unusable", LF_STR("dir", dir), LF_STR("error", strerror(errno)));
    return xasprintf("%s/engine-%lld.log", dir, (long long)e->ep.id);
}

/* Spawn the process of one endpoint from nm->launch. 0 or -errno (err set). The state
 * is not touched: the caller raises NM_EV_SPAWNED (or handles the failure). */
static int spawn_one(struct nm_endpoint *e, struct wire_err *err)
{
    struct nodemgr *nm = e->nm;
    const struct wire_start_cmd *L = nm->launch;
    if (!L) {
        wire_err_set(err, "no start command recorded");
        return -EINVAL;
    }
    struct engine_launch l = {
        .role = L->role,
        .instance_id = L->instance_id,
        .endpoint = &e->ep,
        .endpoint_index = (int)e->index,
        .node_rank = (int)L->node_rank,
        .master_dp_ip = L->master_dp_ip,
        .d2d_peer_ips = L->has_d2d_peer_ips ? &L->d2d_peer_ips : NULL,
    };
    struct engine_cmd cmd;
    int rc = engine_cmd_build(nm->cfg, &l, &cmd, err);
    if (rc < 0)
        return rc;
    char *rendered = engine_cmd_render(&cmd);
    const char *devs = engine_cmd_getenv(&cmd, "ASCEND_RT_VISIBLE_DEVICES");
    log_info("engine_spawning", LF_INT("endpoint_id", e->ep.id), LF_STR("argv", rendered),
             LF_STR("visible_devices", devs));
    free(rendered);

    if (e->proc) {
        proc_free(e->proc);
        e->proc = NULL;
    }
    free(e->log_path);
    e->log_path = endpoint_log_path(nm, e);
    char name[48];
    snprintf(name, sizeof(name), "engine-%lld", (long long)e->ep.id);
    int max_line = nm->cfg->log_max_line_length;
    /* Services' environment for engines (the KV store's MMC_LOCAL_CONFIG_PATH) first,
     * so that engine_cmd's own variables win. */
    const char **envv = xcalloc(nm->engine_env.n + cmd.envc + 1, sizeof(*envv));
    size_t nenv = 0;
    for (size_t k = 0; k < nm->engine_env.n; k++)
        envv[nenv++] = nm->engine_env.items[k];
    for (size_t k = 0; k < cmd.envc; k++)
        envv[nenv++] = cmd.env[k];
    struct proc_opts o = {
        .argv = (const char *const *)cmd.argv,
        .env_overrides = envv,
        .name = name,
        .ring_bytes = NM_TAIL_RING_BYTES,
        .max_line = max_line > 0 && (size_t)max_line < NM_TAIL_RING_BYTES ? (size_t)max_line : 0,
        .log_path = e->log_path,
        .log_max_bytes = (size_t)nm->cfg->engine_log_rotation_bytes,
        .log_keep = (unsigned)nm->cfg->engine_log_rotation_count,
        .on_line = on_engine_line,
        .on_exit = on_engine_exit,
        .arg = e,
    };
    struct proc *p = NULL;
    rc = proc_spawn(nm->r, &o, &p);
    free(envv);
    if (rc < 0) {
        wire_err_set(err, "endpoint %lld: cannot start %s: %s", (long long)e->ep.id, cmd.argv[0],
                     strerror(-rc));
        log_error("engine_spawn_failed", LF_INT("endpoint_id", e->ep.id),
                  LF_STR("argv0", cmd.argv[0]), LF_STR("error", strerror(-rc)));
        engine_cmd_release(&cmd);
        return rc;
    }
    engine_cmd_release(&cmd);
    e->proc = p;
    e->pid = proc_pid(p);
    e->spawned_ms = util_mono_ms();
    e->spawns++;
    e->ready_since_ms = 0;
    metrics_counter_inc(nm->m.spawns);
    log_info("engine_spawned", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
             LF_INT("port", wire_endpoint_port(&e->ep)), LF_BOOL("headless", e->ep.headless));
    return 0;
}

int nm_engine_spawn_all(struct nodemgr *nm, struct wire_err *err)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (nm_engine_retired(e))
            continue;
        if (e->proc && proc_running(e->proc)) {
            wire_err_set(err, "endpoint %lld still has a running engine (pid %d)",
                         (long long)e->ep.id, (int)e->pid);
            goto rollback;
        }
        if (lost_exit(e))
            nm_engine_event(e, NM_EV_GONE, "process gone");
        if (spawn_one(e, err) < 0)
            goto rollback;
        nm_engine_event(e, NM_EV_SPAWNED, "launch");
    }
    return 0;
rollback:
    /* All or nothing: a half-started instance is worse than none (§6.1). */
    for (size_t i = 0; i < nm->n_eps; i++)
        nm_engine_event(nm->eps[i], NM_EV_ROLLBACK, "launch rolled back");
    return -EIO;
}

/* ---- group stop -------------------------------------------------------------------------------
 */

struct nm_stop_waiter {
    struct nm_stop_waiter *next;
    nm_done_fn done;
    void *arg;
};

static void run_stop_waiters(struct nodemgr *nm)
{
    struct nm_stop_waiter *w = nm->stop_waiters;
    nm->stop_waiters = NULL;
    while (w) {
        struct nm_stop_waiter *next = w->next;
        w->done(nm, w->arg);
        free(w);
        w = next;
    }
}

static void on_engine_stopped(struct proc *p, void *arg)
{
    (void)p;
    struct nm_endpoint *e = arg;
    struct nodemgr *nm = e->nm;
    if (nm->stops_pending > 0)
        nm->stops_pending--;
    if (nm->stops_pending == 0)
        run_stop_waiters(nm);
}

bool nm_engine_any_alive(const struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        if (nm->eps[i]->proc && proc_running(nm->eps[i]->proc))
            return true;
    return false;
}

void nm_engine_stop_all(struct nodemgr *nm, int64_t grace_ms, nm_done_fn done, void *arg)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (lost_exit(e))
            continue; /* nothing to stop; the health check's NM_EV_GONE catches it */
        struct engine_input in = {.ev = NM_EV_STOP, .cause = "group stop", .grace_ms = grace_ms};
        engine_step(e, &in);
    }
    if (nm->stops_pending == 0) {
        if (done)
            done(nm, arg);
        return;
    }
    if (done) {
        struct nm_stop_waiter *w = xcalloc(1, sizeof(*w));
        w->done = done;
        w->arg = arg;
        w->next = nm->stop_waiters;
        nm->stop_waiters = w;
    }
}

void nm_engine_kill_all_now(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        nm_engine_event(nm->eps[i], NM_EV_KILL, "kill now");
    /* proc_kill_now cancels pending stops without their callbacks. */
    nm->stops_pending = 0;
    run_stop_waiters(nm);
}

/* ---- probing (§6.5) -----------------------------------------------------------------------------
 */

/* Upstream runs a probe's attempts back to back — a hung engine costs timeout x attempts
 * (15 s with its defaults) before anyone knows. Here the attempts overlap: while a probe
 * is outstanding the next period's probe is sent anyway, each with the full timeout, and
 * the endpoint failed once `attempts` probes in a row timed out. A hang is then found
 * timeout + (attempts - 1) x period after the first unanswered probe (7 s with the
 * defaults: 5 s, 3 attempts, 1 s period). A healthy engine answers each probe within
 * the period, so it sees the same one probe per period as before; and as before only
 * timeouts count as attempts — an answer, even a 503 or a refused connection, is the
 * round's outcome at once. */

static void probe_send(struct nm_endpoint *e);

/* Cancel the probes sent before seq (all with UINT64_MAX): an answer to a later one
 * made them moot. */
static void probes_cancel_before(struct nm_endpoint *e, uint64_t seq)
{
    for (int i = 0; i < NM_PROBES_MAX && e->n_probes > 0; i++) {
        struct nm_probe *p = &e->probes[i];
        if (p->req && p->seq < seq) {
            httpc_cancel(e->nm->probe_http, p->req);
            p->req = NULL;
            e->n_probes--;
        }
    }
}

void nm_engine_probes_cancel(struct nm_endpoint *e)
{
    probes_cancel_before(e, UINT64_MAX);
    e->probe_timeouts = 0;
}

static void on_probe_done(const struct httpc_response *resp, void *arg)
{
    struct nm_probe *p = arg;
    struct nm_endpoint *e = p->e;
    struct nodemgr *nm = e->nm;
    uint64_t seq = p->seq;
    p->req = NULL;
    e->n_probes--;
    if (!nm_engine_state_probed(e->state) || !e->proc || !proc_running(e->proc))
        return;
    if (resp->error == -ETIMEDOUT) {
        int attempts = nm->cfg->health.health_collector_timeout_retry_attempts;
        if (++e->probe_timeouts < attempts) {
            log_debug("probe_timeout", LF_INT("endpoint_id", e->ep.id),
                      LF_INT("timeouts", e->probe_timeouts), LF_INT("attempts", attempts));
            return;
        }
    }
    /* The round's outcome: an answer, or the last allowed timeout. Probes sent before this
     * one are moot; later ones start the next round. */
    probes_cancel_before(e, seq);
    e->probe_timeouts = 0;
    bool ok = resp->error == 0 && resp->status >= 200 && resp->status < 300;
    if (!ok) {
        metrics_counter_inc(nm->m.probe_failures);
        log_debug("probe_failed", LF_INT("endpoint_id", e->ep.id), LF_INT("status", resp->status),
                  LF_STR("error", resp->error ? resp->error_text : ""));
    }
    enum nm_engine_event ev =
        nm_engine_probe_event(ok ? NM_PROBE_OK : NM_PROBE_FAILED, util_mono_ms() - e->spawned_ms,
                              (int64_t)nm->cfg->health.startup_timeout * 1000);
    nm_engine_event(e, ev, ok ? "health ok" : "health failed");
}

bool nm_engine_client_tls(const struct nodemgr *nm, struct httpc_tls *out)
{
    const struct nm_tls *t = &nm->cfg->infer_tls;
    *out = (struct httpc_tls){
        .ca_file = t->ca_file && *t->ca_file ? t->ca_file : NULL,
        .cert_file = t->cert_file && *t->cert_file ? t->cert_file : NULL,
        .key_file = t->key_file && *t->key_file ? t->key_file : NULL,
    };
    return t->enable_tls && t->engine_tls;
}

static void probe_send(struct nm_endpoint *e)
{
    struct nodemgr *nm = e->nm;
    struct nm_probe *slot = NULL;
    for (int i = 0; i < NM_PROBES_MAX && !slot; i++)
        if (!e->probes[i].req)
            slot = &e->probes[i];
    if (!slot)
        return; /* NM_PROBES_MAX outstanding: the oldest times out first */
    struct httpc_tls ht;
    bool tls = nm_engine_client_tls(nm, &ht);
    bool v6 = strchr(e->ep.ip, ':') != NULL;
    char *url = xasprintf("%s://%s%s%s:%d/health", tls ? "https" : "http", v6 ? "[" : "", e->ep.ip,
                          v6 ? "]" : "", wire_endpoint_port(&e->ep));
    int64_t timeout = (int64_t)nm->cfg->health.health_collector_timeout * 1000;
    struct httpc_opts o = {
        .url = url,
        .timeout_ms = timeout,
        .connect_timeout_ms = timeout,
        .max_response = 64 * 1024,
        .tls = tls ? &ht : NULL,
    };
    slot->e = e;
    slot->seq = ++e->probe_seq;
    slot->req = httpc_request(nm->probe_http, &o, on_probe_done, slot);
    if (slot->req)
        e->n_probes++;
    free(url);
}

static void probe_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    if (nm_shutting_down(nm))
        return;
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        /* Probed states only: not retired, not stopping, not without a process. */
        if (!nm_engine_state_probed(e->state) || !e->proc || !proc_running(e->proc))
            continue;
        if (e->ep.headless) {
            /* PCP followers serve no HTTP: alive is all we can know. */
            nm_engine_event(e, NM_EV_ALIVE, "headless alive");
            continue;
        }
        /* No more in flight than attempts: the oldest decides before a newer one would. */
        if (e->n_probes < nm->cfg->health.health_collector_timeout_retry_attempts)
            probe_send(e);
    }
}

void nm_engine_probes_start(struct nodemgr *nm)
{
    int64_t p = nm_probe_period_ms(nm);
    nm_timer_start(nm->r, &nm->probe_timer, probe_tick, nm, 0, p);
}

void nm_engine_probes_stop(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->probe_timer);
    for (size_t i = 0; i < nm->n_eps; i++)
        nm_engine_probes_cancel(nm->eps[i]);
}

void nm_engine_probes_reconfigure(struct nodemgr *nm)
{
    if (!reactor_timer_active(&nm->probe_timer))
        return;
    int64_t p = nm_probe_period_ms(nm);
    if (nm->probe_timer.interval_ms != p)
        reactor_timer_start(nm->r, &nm->probe_timer, p, p);
}

/* ---- status predicates
 * --------------------------------------------------------------------------- */

bool nm_engine_all_normal(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        if (nm_engine_retired(nm->eps[i]))
            continue;
        if (nm->eps[i]->status != WIRE_EP_NORMAL)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_none_abnormal(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        if (nm_engine_retired(nm->eps[i]))
            continue;
        if (nm->eps[i]->status == WIRE_EP_ABNORMAL)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_all_ready(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        const struct nm_endpoint *e = nm->eps[i];
        if (nm_engine_retired(e))
            continue;
        bool ok = e->ep.headless ? e->state == NM_ES_RUNNING : e->state == NM_ES_READY;
        if (!ok)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_any_stopped(const struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        const struct nm_endpoint *e = nm->eps[i];
        if (!nm_engine_retired(e) && nm_engine_state_runtime(e->state) == NM_RT_STOPPED)
            return true;
    }
    return false;
}

bool nm_engine_excluded(const struct nm_endpoint *e)
{
    return nm_engine_retired(e) || e->state == NM_ES_BACKOFF;
}

void nm_engine_retire(struct nodemgr *nm, const int64_t *ids, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        struct nm_endpoint *e = nm_engine_find(nm, ids[k]);
        if (e)
            nm_engine_event(e, NM_EV_RETIRE, "dp scale-down commit");
    }
}

/* ---- API view
 * --------------------------------------------------------------------------------------- */

json_t *nm_engine_list_json(struct nodemgr *nm)
{
    json_t *arr = json_array();
    int64_t now = util_mono_ms();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        bool alive = e->proc && proc_running(e->proc);
        json_t *o =
            json_pack("{s:I, s:i, s:s, s:i, s:b, s:s, s:s, s:i, s:b}", "id", (json_int_t)e->ep.id,
                      "index", (int)e->index, "ip", e->ep.ip, "port", wire_endpoint_port(&e->ep),
                      "headless", e->ep.headless, "state", nm_engine_state_str(e->state), "status",
                      wire_ep_status_str(e->status), "restarts",
                      e->spawns > 0 ? (int)e->spawns - 1 : 0, "alive", alive);
        json_object_set_new(o, "pid", alive ? json_integer(e->pid) : json_null());
        json_object_set_new(o, "uptime_seconds",
                            alive ? json_real((double)(now - e->spawned_ms) / 1000.0)
                                  : json_null());
        if (e->has_last_exit) {
            char ts[40];
            util_wall_iso8601(e->last_exit_wall_ms, ts, sizeof(ts));
            json_object_set_new(
                o, "last_exit",
                json_pack("{s:I, s:o, s:o, s:b, s:s, s:f}", "pid", (json_int_t)e->pid, "code",
                          e->last_exit.code >= 0 ? json_integer(e->last_exit.code) : json_null(),
                          "signal",
                          e->last_exit.signo > 0 ? json_integer(e->last_exit.signo) : json_null(),
                          "core_dumped", e->last_exit.core_dumped, "at", ts, "uptime_seconds",
                          (double)e->last_exit_uptime_ms / 1000.0));
        } else {
            json_object_set_new(o, "last_exit", json_null());
        }
        json_object_set_new(o, "retired", json_boolean(nm_engine_retired(e)));
        json_object_set_new(o, "failed", json_boolean(e->state == NM_ES_FAILED));
        json_object_set_new(o, "restart_pending", json_boolean(e->state == NM_ES_BACKOFF));
        json_object_set_new(o, "ever_normal", json_boolean(e->ever_normal));
        json_object_set_new(o, "log_file", e->log_path ? json_string(e->log_path) : json_null());
        json_array_append_new(arr, o);
    }
    return arr;
}

/* ---- the service vtable
 * ------------------------------------------------------------------------------ */

static int engine_create(struct nodemgr *nm, void **state)
{
    nm->has_engine = true;
    *state = nm;
    return 0;
}

static int engine_pull(struct nodemgr *nm, void *state, struct wire_err *err)
{
    (void)state;
    return nm_engine_spawn_all(nm, err);
}

static void engine_stop(struct nodemgr *nm, void *state, int64_t grace_ms, nm_done_fn done,
                        void *arg)
{
    (void)state;
    nm_engine_stop_all(nm, grace_ms, done, arg);
}

static void engine_kill_now(struct nodemgr *nm, void *state)
{
    (void)state;
    nm_engine_kill_all_now(nm);
}

static void engine_health_check(struct nodemgr *nm, void *state)
{
    (void)state;
    /* Deaths arrive through pidfds the instant they happen; this periodic pass only
     * catches what a lost wakeup would hide (a reaped leader still marked alive). */
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (lost_exit(e))
            nm_engine_event(e, NM_EV_GONE, "health check: process gone");
    }
}

static void engine_destroy(struct nodemgr *nm, void *state)
{
    (void)state;
    nm_engine_free_endpoints(nm);
}

const struct nm_service_ops nm_engine_service_ops = {
    .name = "engine",
    .backend = "engine",
    .prepare_priority = -1,
    .create = engine_create,
    .pull = engine_pull,
    .stop = engine_stop,
    .kill_now = engine_kill_now,
    .health_check = engine_health_check,
    .destroy = engine_destroy,
};
