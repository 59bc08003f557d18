/* ctl_instmgr — the instance manager (§5.10): the controller's tables of instances
 * (assembled, assembling) and of FT runtimes (ghosts: runtimes of deleted instances still
 * reconfiguring), the instance state transitions with their side effects (log, metrics,
 * alarms, persistence, coordinator push, removal), and the heartbeat timeouts with the
 * guarded isolation probe. On the controller's reactor thread. */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lookup --------------------------------------------------------------------------- */

struct ctl_inst *ctl_find(struct ctl *c, int64_t id)
{
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->id == id)
            return c->insts[i];
    return NULL;
}

struct ctl_inst *ctl_find_pending(struct ctl *c, int64_t id)
{
    for (size_t i = 0; i < c->n_pending; i++)
        if (c->pending[i]->id == id)
            return c->pending[i];
    return NULL;
}

struct ctl_inst *ctl_find_job(struct ctl *c, const char *job)
{
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->status != WIRE_INS_DELETED && strcmp(c->insts[i]->job_name, job) == 0)
            return c->insts[i];
    return NULL;
}

struct ctl_inst *ctl_find_pending_job(struct ctl *c, const char *job)
{
    for (size_t i = 0; i < c->n_pending; i++)
        if (strcmp(c->pending[i]->job_name, job) == 0)
            return c->pending[i];
    return NULL;
}

/* ---- FT runtimes ------------------------------------------------------------------------ */

void ctl_rt_attach(struct ctl *c, struct ctl_inst *in)
{
    if (!in->ft) {
        in->ft = ctl_ft_rt_new(in->id, in->job_name);
        for (size_t i = 0; i < in->n_nms; i++)
            for (size_t j = 0; j < in->nms[i].n_eps; j++)
                if (!in->nms[i].eps[j].headless)
                    ctl_ids_add(&in->ft->original, &in->ft->n_original, in->nms[i].eps[j].id);
    }
    in->ft->gate =
        ctl_ft_gate(c->cfg.ft_enable, c->cfg.scale_down_enable, &in->ft_cap, in->ft_cap_consistent);
}

static int rt_order(const void *a, const void *b)
{
    const struct ctl_ft_rt *x = *(struct ctl_ft_rt *const *)a, *y = *(struct ctl_ft_rt *const *)b;
    return x->instance_id < y->instance_id ? -1 : x->instance_id > y->instance_id;
}

size_t ctl_all_runtimes(struct ctl *c, struct ctl_ft_rt ***out)
{
    struct ctl_ft_rt **v = xcalloc(c->n_insts + c->n_ghosts + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->ft)
            v[n++] = c->insts[i]->ft;
    for (size_t i = 0; i < c->n_ghosts; i++)
        v[n++] = c->ghosts[i];
    qsort(v, n, sizeof(*v), rt_order);
    *out = v;
    return n;
}

struct ctl_ft_rt *ctl_find_rt(struct ctl *c, int64_t id)
{
    struct ctl_inst *in = ctl_find(c, id);
    if (in && in->ft)
        return in->ft;
    for (size_t i = 0; i < c->n_ghosts; i++)
        if (c->ghosts[i]->instance_id == id)
            return c->ghosts[i];
    return NULL;
}

void ctl_ghost_add(struct ctl *c, struct ctl_ft_rt *rt)
{
    c->ghosts = xrealloc(c->ghosts, (c->n_ghosts + 1) * sizeof(*c->ghosts));
    c->ghosts[c->n_ghosts++] = rt;
}

void ctl_drop_ghosts_of_job(struct ctl *c, const char *job, int64_t keep_id)
{
    for (size_t i = 0; i < c->n_ghosts;) {
        struct ctl_ft_rt *rt = c->ghosts[i];
        if (rt->instance_id != keep_id && strcmp(rt->job_name, job) == 0) {
            log_info("ft_runtime_dropped", LF_INT("instance_id", rt->instance_id),
                     LF_STR("job_name", job), LF_INT("replaced_by", keep_id));
            ctl_forget_rt(c, rt->instance_id);
            ctl_ft_rt_free(rt);
            memmove(&c->ghosts[i], &c->ghosts[i + 1], (c->n_ghosts - i - 1) * sizeof(*c->ghosts));
            c->n_ghosts--;
            continue;
        }
        i++;
    }
}

/* ---- transitions ------------------------------------------------------------------------ */

static void remove_instance(struct ctl *c, struct ctl_inst *in)
{
    ctl_push_forget(c, in);
    ctl_strategy_detach(c, in);
    ctl_faults_free(in);
    if (in->ft) {
        if (in->ft->phase == FT_RECONFIGURING) {
            /* Keep it observable until a replacement of the job is ready. */
            ctl_ghost_add(c, in->ft);
            ctl_save_rt(c, in->ft);
        } else {
            ctl_forget_rt(c, in->id);
            ctl_ft_rt_free(in->ft);
        }
        in->ft = NULL;
    }
    ctl_forget_inst(c, in->id);
    ctl_inst_vec_remove(c->insts, &c->n_insts, in);
    ctl_inst_free(in);
}

static void change_status(struct ctl *c, struct ctl_inst *in, enum wire_ins_status to,
                          const char *event, const char *cause)
{
    enum wire_ins_status from = in->status;
    if (from == to)
        return;
    in->status = to;
    in->status_wall_ms = util_wall_ms();
    in->status_mono_ms = reactor_now(c->r);
    log_info("instance_state", LF_INT("instance_id", in->id), LF_STR("job_name", in->job_name),
             LF_STR("role", wire_role_str(in->role)), LF_STR("from", wire_ins_status_str(from)),
             LF_STR("to", wire_ins_status_str(to)), LF_STR("trigger", event),
             LF_STR("cause", cause));
    metrics_counter_inc(metrics_counter_labels(c->m.transitions, "to", wire_ins_status_str(to)));
    if (from == WIRE_INS_ACTIVE && in->ever_ready) {
        char msg[256];
        snprintf(msg, sizeof(msg), "instance %lld left active (now %s): %s", (long long)in->id,
                 wire_ins_status_str(to), cause ? cause : event);
        ctl_obs_raise(c, "instance_unavailable", "critical", in->id, in->job_name, msg);
    }
    if (to == WIRE_INS_DELETED) {
        remove_instance(c, in);
        return;
    }
    if (to == WIRE_INS_ACTIVE) {
        ctl_obs_clear(c, "instance_unavailable", in->id, in->job_name, "instance active again");
        in->ever_ready = true;
        /* The job is served again: runtimes of the instances it replaced go away. */
        ctl_drop_ghosts_of_job(c, in->job_name, in->id);
    }
    ctl_save_inst(c, in);
    ctl_push_reconcile(c, in);
}

/* ---- partial loss (seeds 001, 002) ------------------------------------------------------- */

static const char GATE_RULE[] =
    "active needs every member's last heartbeat within instance_heartbeat_timeout";
static const char LOSS_RULE[] = "a member silent past the heartbeat timeout while others "
                                "heartbeat: the survivors exit so the pod group is rescheduled";

static void member_name(const struct ctl_nm *nm, char *buf, size_t cap)
{
    snprintf(buf, cap, strchr(nm->pod_ip, ':') ? "[%s]:%s" : "%s:%s", nm->pod_ip, nm->port);
}

/* A DP scale-down transaction is under way: its pods come and go on purpose (seed 002:
 * "缩容事务中抑制 partial-loss shutdown"). */
static bool in_scale_down(const struct ctl_inst *in)
{
    if (!in->ft)
        return false;
    switch (in->ft->phase) {
    case FT_DECIDING:
    case FT_WAITING_ENGINE_FAULT:
    case FT_SCALING_DOWN:
    case FT_POST_SCALE_CLEANUP:
        return true;
    default:
        return false;
    }
}

static void freshness_of(struct ctl *c, const struct ctl_inst *in, int64_t timeout_ms,
                         struct ctl_freshness *f)
{
    size_t n_retired;
    int64_t *retired = ctl_retired(c, in, &n_retired);
    ctl_inst_freshness(in, reactor_now(c->r), timeout_ms, retired, n_retired, f);
    free(retired);
}

/* The freshness gate: a healthy peer's heartbeat must not make an instance routable while
 * another member is silent (its last reported `normal` is no evidence). false = refused,
 * logged once per member until it heartbeats again. */
static bool gate_open(struct ctl *c, struct ctl_inst *in, const char *trigger)
{
    struct ctl_freshness f;
    freshness_of(c, in, c->cfg.hb_timeout_active_ms, &f);
    if (!f.stale)
        return true;
    struct ctl_nm *nm = &in->nms[f.worst];
    if (!nm->gate_logged) {
        nm->gate_logged = true;
        char member[96];
        member_name(nm, member, sizeof(member));
        metrics_counter_inc(c->m.freshness_gate);
        log_warn("instance_freshness_gate", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name),
                 LF_STR("status", wire_ins_status_str(in->status)), LF_STR("member", member),
                 LF_INT("heartbeat_age_ms", f.worst_age_ms), LF_INT("stale_members", f.stale),
                 LF_INT("members", f.members), LF_STR("trigger", trigger),
                 LF_STR("rule", GATE_RULE), LF_STR("decision", "kept out of the coordinator"));
    }
    return false;
}

/* The instance is about to be deleted for a heartbeat timeout: if some members still
 * heartbeat, the instance is partially lost. Its survivors cannot serve alone and would
 * re-register forever; they are told to exit through /node-manager/stop (exit 255 hands
 * the pod group to the orchestrator, which reschedules it as one), except inside a DP
 * scale-down transaction. */
static void partial_loss(struct ctl *c, struct ctl_inst *in)
{
    struct ctl_freshness f;
    freshness_of(c, in, c->cfg.hb_timeout_active_ms, &f);
    if (!f.stale || !f.fresh)
        return;
    char member[96];
    member_name(&in->nms[f.worst], member, sizeof(member));
    bool suppress = in_scale_down(in);
    metrics_counter_inc(
        metrics_counter_labels(c->m.partial_loss, "action", suppress ? "suppressed" : "stop"));
    log_warn("instance_partial_loss", LF_INT("instance_id", in->id),
             LF_STR("job_name", in->job_name), LF_STR("member", member),
             LF_INT("heartbeat_age_ms", f.worst_age_ms), LF_INT("stale_members", f.stale),
             LF_INT("survivors", f.fresh), LF_STR("rule", LOSS_RULE),
             LF_STR("action", suppress ? "suppressed_in_dp_scale_down" : "stop_survivors"),
             LF_STR("ft_phase", in->ft ? ctl_ft_phase_name(in->ft->phase) : "none"));
    if (suppress)
        return;
    size_t n_retired;
    int64_t *retired = ctl_retired(c, in, &n_retired);
    int64_t now = reactor_now(c->r);
    for (size_t i = 0; i < in->n_nms; i++) {
        struct ctl_nm *nm = &in->nms[i];
        int64_t age = now - nm->last_hb_ms;
        if (!ctl_nm_is_member(nm, retired, n_retired) || age > c->cfg.hb_timeout_active_ms)
            continue;
        member_name(nm, member, sizeof(member));
        log_warn("partial_loss_survivor_stop", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_STR("member", member),
                 LF_INT("heartbeat_age_ms", age), LF_STR("rule", LOSS_RULE));
        char *url = ctl_nm_url(c, nm->pod_ip, nm->port, "/node-manager/stop");
        ctl_http_fire(c, "POST", url, NULL, c->cfg.start_cmd_timeout_ms, "node_manager_stop",
                      in->id);
        free(url);
    }
    free(retired);
    ctl_lost_add(c, in->id);
}

void ctl_lost_add(struct ctl *c, int64_t id)
{
    if (ctl_lost_has(c, id))
        return;
    size_t cap = sizeof(c->lost) / sizeof(c->lost[0]);
    if (c->n_lost == cap) {
        memmove(&c->lost[0], &c->lost[1], (cap - 1) * sizeof(c->lost[0]));
        c->n_lost--;
    }
    c->lost[c->n_lost++] = id;
}

bool ctl_lost_has(const struct ctl *c, int64_t id)
{
    for (size_t i = 0; i < c->n_lost; i++)
        if (c->lost[i] == id)
            return true;
    return false;
}

int ctl_apply_event(struct ctl *c, struct ctl_inst *in, enum ctl_event ev, const char *cause)
{
    enum wire_ins_status to;
    if (ctl_transition(in->status, ev, &to) < 0)
        return -ENOENT;
    if (to == WIRE_INS_ACTIVE && in->separated && in->status != WIRE_INS_ACTIVE)
        return 0; /* forcibly separated instances are kept from returning to active */
    if (to == WIRE_INS_ACTIVE && in->status != WIRE_INS_ACTIVE && !gate_open(c, in, cause))
        return 0;
    if (to == WIRE_INS_DELETED && ev == CTL_EV_HB_TIMEOUT)
        partial_loss(c, in);
    change_status(c, in, to, ctl_event_name(ev), cause);
    return 0;
}

void ctl_set_status(struct ctl *c, struct ctl_inst *in, enum wire_ins_status to, const char *cause)
{
    change_status(c, in, to, "FORCED", cause);
}

/* ---- heartbeat timeouts ----------------------------------------------------------------- */

static void isolation_probed(struct ctl *c, const struct ctl_probe *pr)
{
    struct ctl_inst *in = ctl_find(c, pr->id);
    if (!in || in->incarnation != pr->incarnation)
        return;
    in->probing = false;
    if (in->status != WIRE_INS_ACTIVE)
        return;
    bool all = true;
    for (size_t k = 0; k < pr->n; k++)
        all = all && pr->ok[k];
    int64_t now = reactor_now(c->r);
    if (all) {
        /* Every NM answers: the gap was ours (e.g. a controller failover), not theirs. */
        for (size_t i = 0; i < in->n_nms; i++) {
            if (now - in->nms[i].last_hb_ms > c->cfg.hb_timeout_active_ms) {
                in->nms[i].last_hb_ms = now;
                in->nms[i].guard_refreshed = true;
            }
        }
        metrics_counter_inc(c->m.isolation_suppressed);
        log_warn("heartbeat_timeout_suppressed", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name),
                 LF_STR("reason", "every node manager answered the probe"));
        return;
    }
    for (size_t k = 0; k < pr->n; k++) {
        ssize_t i = pr->ok[k] ? -1 : ctl_nm_by_key(in, pr->keys[k]);
        if (i < 0)
            continue;
        char member[96];
        member_name(&in->nms[i], member, sizeof(member));
        log_warn("heartbeat_timeout_confirmed", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_STR("member", member),
                 LF_INT("heartbeat_age_ms", now - in->nms[i].last_hb_ms),
                 LF_STR("rule", "silent and unreachable: the instance leaves the coordinator"));
    }
    ctl_apply_event(c, in, CTL_EV_HB_TIMEOUT, "heartbeat timeout and node manager(s) unreachable");
}

static void mgr_check(struct ctl *c)
{
    int64_t now = reactor_now(c->r);
    size_t n = c->n_insts;
    int64_t *ids = xcalloc(n + 1, sizeof(int64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = c->insts[i]->id;
    for (size_t i = 0; i < n; i++) {
        struct ctl_inst *in = ctl_find(c, ids[i]);
        if (!in || in->probing)
            continue;
        int64_t timeout = in->status == WIRE_INS_ACTIVE ? c->cfg.hb_timeout_active_ms
                                                        : c->cfg.hb_timeout_other_ms;
        size_t stale = 0, refreshed = 0;
        int64_t worst = 0;
        ssize_t worst_k = -1;
        size_t n_retired;
        int64_t *retired = ctl_retired(c, in, &n_retired);
        for (size_t k = 0; k < in->n_nms; k++) {
            /* A pod a scale-down left without ranks is no member: it may be gone. */
            if (!ctl_nm_is_member(&in->nms[k], retired, n_retired))
                continue;
            int64_t age = now - in->nms[k].last_hb_ms;
            if (age > timeout) {
                stale++;
                refreshed += in->nms[k].guard_refreshed;
                if (age > worst || worst_k < 0) {
                    worst = age;
                    worst_k = (ssize_t)k;
                }
            }
        }
        free(retired);
        if (!stale)
            continue;
        char cause[128];
        snprintf(cause, sizeof(cause), "no heartbeat from %zu node manager(s) for %lld ms", stale,
                 (long long)worst);
        char member[96];
        member_name(&in->nms[worst_k], member, sizeof(member));
        if (in->status == WIRE_INS_ACTIVE && refreshed < stale) {
            log_warn("heartbeat_timeout_probe", LF_INT("instance_id", in->id),
                     LF_STR("job_name", in->job_name), LF_STR("cause", cause),
                     LF_STR("member", member), LF_INT("heartbeat_age_ms", worst),
                     LF_STR("rule", "an active instance's member silent past "
                                    "instance_heartbeat_timeout: probe every node manager"));
            ctl_probe_start(c, in, isolation_probed);
            continue;
        }
        log_warn("heartbeat_timeout", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name),
                 LF_STR("status", wire_ins_status_str(in->status)), LF_STR("member", member),
                 LF_INT("heartbeat_age_ms", worst), LF_INT("stale_members", stale),
                 LF_STR("rule", in->status == WIRE_INS_ACTIVE
                                    ? "silent again after the probe refreshed it: isolated"
                                    : "silent past instance_heartbeat_timeout_inactive: deleted"));
        ctl_apply_event(c, in, CTL_EV_HB_TIMEOUT, cause);
    }
    free(ids);
}

void ctl_instmgr_on_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->loaded)
        mgr_check(c);
}

void ctl_instmgr_free_all(struct ctl *c)
{
    for (size_t i = 0; i < c->n_insts; i++) {
        struct ctl_inst *in = c->insts[i];
        ctl_strategy_detach(c, in);
        ctl_faults_free(in);
        ctl_ft_rt_free(in->ft);
        in->ft = NULL;
        ctl_inst_free(in);
    }
    free(c->insts);
    c->insts = NULL;
    c->n_insts = 0;
    for (size_t i = 0; i < c->n_pending; i++)
        ctl_inst_free(c->pending[i]);
    free(c->pending);
    c->pending = NULL;
    c->n_pending = 0;
    for (size_t i = 0; i < c->n_ghosts; i++)
        ctl_ft_rt_free(c->ghosts[i]);
    free(c->ghosts);
    c->ghosts = NULL;
    c->n_ghosts = 0;
}
