/* nm_death — fault reports of dead or abnormal engines (§2.4, §5.8).
 *
 * A death is reported the instant the pidfd says so (the dispatcher, nm_phase_engine,
 * calls nm_death_report from the engine's transition), an endpoint arbitration finds
 * abnormal once per fault episode (nm_death_report_abnormal). Both are
 * `POST /controller/report_software_fault` with `EngineDeadError`, engine_status 1. The
 * dedup lives on the endpoint: reported_dead_pid (a death accepted for that pid is not
 * reported again), reported_abnormal (set while in flight, confirmed by acceptance;
 * cleared by arbitration when the episode is over). Only a report the Controller
 * accepted freezes suicide (enable_engine_relaunch: it will relaunch us). The histogram
 * motor_nm_death_report_seconds observes exit -> Controller's answer. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>

/* Context of a report in flight: the endpoint is looked up again by id when the answer
 * comes, since a new start command may have replaced the endpoint set meanwhile. */
struct report_ctx {
    int64_t endpoint_id;
    uint64_t generation;
    pid_t pid;
    bool death;
    int64_t exited_ms;
};

static struct nm_endpoint *ctx_endpoint(struct nodemgr *nm, const struct report_ctx *x)
{
    if (x->generation != nm->generation)
        return NULL;
    return nm_engine_find(nm, x->endpoint_id);
}

static void on_report_done(struct nodemgr *nm, bool accepted, void *arg)
{
    struct report_ctx *x = arg;
    struct nm_endpoint *e = ctx_endpoint(nm, x);
    if (x->death && x->exited_ms > 0)
        metrics_histogram_observe(nm->m.death_report_latency,
                                  (double)(util_mono_ms() - x->exited_ms) / 1000.0);
    if (e) {
        if (!x->death)
            e->reported_abnormal = false; /* the in-flight mark; set for real below */
        if (accepted) {
            /* One fault episode: a death already delivered is not reported again as
             * "abnormal" by the arbiter. */
            e->reported_abnormal = true;
            if (x->death)
                e->reported_dead_pid = x->pid;
        }
    }
    /* Freeze only when the Controller took it and will relaunch: otherwise the
     * container-restart fallback must stay live (§2.4). */
    if (accepted && nm->cfg->ft.enable_engine_relaunch && !nm_shutting_down(nm))
        nm_freeze(nm, NM_FREEZE_FAULT, nm_config_ms(nm->cfg->ft.engine_restart_wait_timeout_sec),
                  x->death ? "engine death reported" : "abnormal endpoint reported");
    free(x);
}

static void send_report(struct nodemgr *nm, struct nm_endpoint *e, const char *type,
                        const char *message, json_t *info, struct report_ctx *x)
{
    struct wire_fault_report rep = {0};
    rep.exception_type = xstrdup(type);
    rep.exception_message = xstrdup(message);
    rep.engine_id = e->ep.id;
    rep.engine_status = WIRE_ENGINE_DEAD;
    rep.pod_ip = xstrdup(nm->cfg->pod_ip);
    if (nm->launch) {
        rep.has_instance_id = true;
        rep.instance_id = nm->launch->instance_id;
    }
    rep.node_manager_port = nm->api_port;
    rep.additional_info = info;
    nm_ctrl_report_fault(nm, &rep, on_report_done, x, free);
}

void nm_death_report(struct nm_endpoint *e, int64_t exited_ms)
{
    struct nodemgr *nm = e->nm;
    if (nm_engine_retired(e) || !e->has_last_exit || e->reported_dead_pid == e->pid)
        return;
    const struct proc_status *st = &e->last_exit;
    char msg[256];
    if (st->signo > 0)
        snprintf(msg, sizeof(msg), "engine process %d of endpoint %lld was killed by signal %d%s",
                 (int)e->pid, (long long)e->ep.id, st->signo,
                 st->core_dumped ? " (core dumped)" : "");
    else
        snprintf(msg, sizeof(msg), "engine process %d of endpoint %lld exited with status %d",
                 (int)e->pid, (long long)e->ep.id, st->code);
    json_t *info = json_pack("{s:i, s:i, s:i, s:b, s:I, s:s}", "pid", (int)e->pid, "exit_code",
                             st->code, "signal", st->signo, "core_dumped", st->core_dumped,
                             "uptime_ms", (json_int_t)e->last_exit_uptime_ms, "source", "pidfd");
    struct report_ctx *x = xcalloc(1, sizeof(*x));
    x->endpoint_id = e->ep.id;
    x->generation = nm->generation;
    x->pid = e->pid;
    x->death = true;
    x->exited_ms = exited_ms;
    log_warn("engine_death_reporting", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
             LF_INT("exit_code", st->code), LF_INT("signal", st->signo));
    send_report(nm, e, "EngineDeadError", msg, info, x);
}

void nm_death_report_abnormal(struct nm_endpoint *e)
{
    struct nodemgr *nm = e->nm;
    const char *rt = nm_runtime_str(nm_engine_state_runtime(e->state));
    if (!nm->ctrl.enabled) {
        /* Standalone: nobody to tell; once per episode in the log is enough. */
        e->reported_abnormal = true;
        log_warn("endpoint_abnormal", LF_INT("endpoint_id", e->ep.id), LF_STR("runtime", rt));
        return;
    }
    char msg[256];
    snprintf(msg, sizeof(msg), "endpoint %lld is abnormal (engine %s)", (long long)e->ep.id, rt);
    json_t *info = json_pack("{s:s, s:s, s:i}", "runtime_state", rt, "source", "arbitration", "pid",
                             (int)e->pid);
    struct report_ctx *x = xcalloc(1, sizeof(*x));
    x->endpoint_id = e->ep.id;
    x->generation = nm->generation;
    x->pid = e->pid;
    e->reported_abnormal = true; /* in flight: no duplicate next round */
    log_warn("endpoint_abnormal_reporting", LF_INT("endpoint_id", e->ep.id), LF_STR("runtime", rt));
    send_report(nm, e, "EngineDeadError", msg, info, x);
}
