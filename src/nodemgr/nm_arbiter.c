/* nm_arbiter — suicide arbitration (§2.5): the single decision point for asking
 * Kubernetes to restart the pod (exit 255), the freeze deadlines and the grace period.
 *
 * The round itself is a pure function over a snapshot of the endpoints
 * (nm_arbiter_round, unit-tested); the glue below feeds it from the daemon every
 * heartbeat_interval_seconds, has the endpoints it found abnormal reported
 * (nm_death_report_abnormal) and acts on the suicide flag. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- the pure state machine ---------------------------------------------------------- */

static const char *const freeze_names[NM_FREEZE_COUNT] = {
    [NM_FREEZE_FAULT] = "fault_report",
    [NM_FREEZE_RELAUNCH] = "relaunch",
    [NM_FREEZE_FT_GUARD] = "ft_guard",
};

const char *nm_freeze_cause_str(enum nm_freeze_cause c)
{
    return (unsigned)c < NM_FREEZE_COUNT ? freeze_names[c] : "?";
}

void nm_arbiter_init(struct nm_arbiter *a)
{
    memset(a, 0, sizeof(*a));
}

void nm_arbiter_reset(struct nm_arbiter *a)
{
    a->counter = 0;
    a->suicide = false;
}

void nm_arbiter_freeze(struct nm_arbiter *a, enum nm_freeze_cause c, int64_t now_ms,
                       int64_t duration_ms)
{
    if ((unsigned)c >= NM_FREEZE_COUNT)
        return;
    int64_t until = now_ms + (duration_ms > 0 ? duration_ms : 0);
    /* Never shortens: a longer window granted earlier (e.g. a relaunch) stays. */
    if (until > a->freeze_until[c])
        a->freeze_until[c] = until;
    nm_arbiter_reset(a);
}

void nm_arbiter_unfreeze(struct nm_arbiter *a, enum nm_freeze_cause c)
{
    if ((unsigned)c < NM_FREEZE_COUNT)
        a->freeze_until[c] = 0;
}

bool nm_arbiter_frozen(const struct nm_arbiter *a, int64_t now_ms)
{
    for (int i = 0; i < NM_FREEZE_COUNT; i++)
        if (now_ms < a->freeze_until[i])
            return true;
    return false;
}

enum nm_arb_outcome nm_arbiter_round(struct nm_arbiter *a, const struct nm_arb_input *in,
                                     size_t *report_idx, size_t *n_report)
{
    *n_report = 0;
    /* Step 1: a new start command begins a new story. */
    if (in->generation != a->generation) {
        a->generation = in->generation;
        nm_arbiter_reset(a);
        return NM_ARB_GENERATION_RESET;
    }
    /* Step 2: frozen (a recovery is in the Controller's hands) or cold start. */
    if (nm_arbiter_frozen(a, in->now_ms) || in->in_grace) {
        a->counter = 0;
        return NM_ARB_SKIPPED;
    }
    /* Step 3: remember who has been NORMAL at least once. */
    for (size_t i = 0; i < in->n_eps; i++) {
        struct nm_arb_ep *e = &in->eps[i];
        if (!e->excluded && e->status == WIRE_EP_NORMAL)
            e->ever_normal = true;
    }
    bool any_abnormal = false;
    for (size_t i = 0; i < in->n_eps; i++) {
        struct nm_arb_ep *e = &in->eps[i];
        if (e->excluded || e->status != WIRE_EP_ABNORMAL)
            continue;
        any_abnormal = true;
        /* A cold-starting engine that never became ready is loading, not dead: it
         * counts (below) but is not reported. */
        if (e->ever_normal && !e->reported)
            report_idx[(*n_report)++] = i;
    }
    if (any_abnormal) {
        a->counter++;
        if (a->counter >= NM_SUICIDE_THRESHOLD && in->suicide_enabled)
            a->suicide = true;
        return NM_ARB_ABNORMAL;
    }
    a->counter = 0;
    for (size_t i = 0; i < in->n_eps; i++)
        in->eps[i].reported = false;
    return NM_ARB_HEALTHY;
}

/* ---- daemon glue --------------------------------------------------------------------- */

bool nm_frozen(const struct nodemgr *nm)
{
    return nm_arbiter_frozen(&nm->arb, util_mono_ms());
}

void nm_freeze(struct nodemgr *nm, enum nm_freeze_cause c, int64_t duration_ms, const char *why)
{
    nm_arbiter_freeze(&nm->arb, c, util_mono_ms(), duration_ms);
    log_info("suicide_frozen", LF_STR("cause", nm_freeze_cause_str(c)),
             LF_INT("seconds", duration_ms / 1000), LF_STR("why", why));
}

void nm_unfreeze(struct nodemgr *nm, enum nm_freeze_cause c, const char *why)
{
    bool was = nm->arb.freeze_until[c] > util_mono_ms();
    nm_arbiter_unfreeze(&nm->arb, c);
    if (was)
        log_info("suicide_unfrozen", LF_STR("cause", nm_freeze_cause_str(c)), LF_STR("why", why));
}

void nm_arb_new_episode(struct nodemgr *nm)
{
    nm_arbiter_reset(&nm->arb);
    for (size_t i = 0; i < nm->n_eps; i++)
        nm->eps[i]->reported_abnormal = false;
}

void nm_grace_end(struct nodemgr *nm, const char *cause)
{
    if (!nm->grace)
        return;
    nm->grace = false;
    log_info("grace_period_ended", LF_STR("cause", cause),
             LF_INT("after_ms", util_mono_ms() - nm->grace_since_ms));
}

static void arb_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    if (nm_shutting_down(nm) || nm->n_eps == 0)
        return;
    nm_scaledown_before_arbitration(nm);
    int64_t now = util_mono_ms();
    /* Fix of §12.8: the grace period also ends when the startup window is over, so an
     * engine that hangs while loading counts as abnormal instead of blocking forever. */
    if (nm->grace && now - nm->grace_since_ms >= (int64_t)nm->cfg->health.startup_timeout * 1000)
        nm_grace_end(nm, "startup_timeout");

    struct nm_arb_ep *v = xcalloc(nm->n_eps, sizeof(*v));
    size_t *idx = xcalloc(nm->n_eps, sizeof(*idx));
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        v[i].id = e->ep.id;
        v[i].status = e->status;
        v[i].excluded = nm_engine_excluded(e);
        v[i].ever_normal = e->ever_normal;
        v[i].reported = e->reported_abnormal;
    }
    struct nm_arb_input in = {
        .now_ms = now,
        .generation = nm->generation,
        .in_grace = nm->grace,
        .suicide_enabled = nm->cfg->ft.container_restart_managed,
        .eps = v,
        .n_eps = nm->n_eps,
    };
    int before = nm->arb.counter;
    size_t n_report = 0;
    enum nm_arb_outcome out = nm_arbiter_round(&nm->arb, &in, idx, &n_report);
    for (size_t i = 0; i < nm->n_eps; i++) {
        nm->eps[i]->ever_normal = v[i].ever_normal;
        if (out == NM_ARB_HEALTHY)
            nm->eps[i]->reported_abnormal = false;
    }
    for (size_t k = 0; k < n_report; k++)
        nm_death_report_abnormal(nm->eps[idx[k]]);
    free(v);
    free(idx);
    if (out == NM_ARB_ABNORMAL)
        log_warn("arbitration_abnormal", LF_INT("counter", nm->arb.counter),
                 LF_INT("threshold", NM_SUICIDE_THRESHOLD),
                 LF_BOOL("suicide_enabled", in.suicide_enabled));
    else if (before > 0 && nm->arb.counter == 0)
        log_info("arbitration_reset", LF_STR("outcome", out == NM_ARB_HEALTHY   ? "healthy"
                                                        : out == NM_ARB_SKIPPED ? "skipped"
                                                                                : "generation"));
    if (nm->arb.suicide) {
        log_error("suicide", LF_INT("counter", nm->arb.counter),
                  LF_STR("why", "endpoints stayed abnormal; exiting so the pod is restarted"));
        nm_shutdown(nm, "suicide");
    }
}

void nm_arb_start(struct nodemgr *nm)
{
    int64_t iv = nm_heartbeat_interval_ms(nm);
    nm_timer_start(nm->r, &nm->arb_timer, arb_tick, nm, iv, iv);
}

void nm_arb_stop(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->arb_timer);
}

void nm_arb_reconfigure(struct nodemgr *nm)
{
    /* Unlike upstream (§12.16) the period follows a reloaded heartbeat interval. */
    if (!reactor_timer_active(&nm->arb_timer))
        return;
    int64_t iv = nm_heartbeat_interval_ms(nm);
    if (nm->arb_timer.interval_ms != iv)
        reactor_timer_start(nm->r, &nm->arb_timer, iv, iv);
}
