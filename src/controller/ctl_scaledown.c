/* ctl_scaledown — DpScaleDownStrategy (spec §8.2): remove the DP ranks whose engines
 * died and let the survivors rebuild their communication domain and keep serving.
 *
 *   DECIDING          request id, gate, original ranks, candidates (DEAD engine ids
 *                     only), each verified through its NM's FT status (an engine that
 *                     answers for itself is not dead: no candidate left ends the
 *                     strategy without a change), dead = committed ∪ verified,
 *                     survivors = non-headless endpoints not dead, grouped per node
 *                     manager (every NM takes part, also headless-only ones)
 *   GUARD             /node-manager/fault-tolerance/guard on every NM, in parallel
 *   WAIT_APPLY_READY  poll the survivors through their NMs: newly `dead` ones join the
 *                     dead set; every survivor must be `unhealthy` without ft_state;
 *                     healthy / unhealthy+recovering / unknown => keep waiting (runtime
 *                     phase WAITING_ENGINE_FAULT); anything else fails; deadline fails
 *   WITHDRAW          the coordinator must confirm the instance is gone (SCALING_DOWN)
 *   APPLY             one `scale_down` per NM for its survivors {removed_dp_ranks,
 *                     dp_master_ip, dp_master_rank = lowest surviving rank}
 *   WAIT_HEALTHY      poll until every survivor is healthy without ft_state
 *   COMMIT            finalize commit on every NM (its pod-local retired ids, maybe none,
 *                     and the new master rank); dead_committed accumulates
 *   CLEANUP           POST_SCALE_CLEANUP (with enable_dp_scale_up: stop NMs left without
 *                     a rank), SCALED_DOWN_RUNNING, publish the survivors
 * A failure once the guard is held and before the commit sends finalize abort to every
 * NM (errors only logged); failures put the runtime in RECONFIGURING with a fallback
 * strategy. A single status blip ("unknown", a failed NM query) never retires a rank
 * (§12.4): only an engine-reported `dead` or a DEAD fault report is evidence.
 *
 * The steps are the states of sd_table (DECIDING is split into DECIDING and VERIFY,
 * plus the terminal SUCCESS, FAILED and DETACHED); every change goes through sd_to(),
 * which logs it (ctl_fsm_step) and runs what the new state does (sd_enter). Each state
 * reports its upstream phase name (sd_phase_names) to the runtime and the log. */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include "wire/wire_ft.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------------------ */

enum sd_state {
    SD_DECIDING = 0, /* gate, candidates */
    SD_VERIFY,       /* each candidate's engine asked through its NM: dead for real? */
    SD_GUARD,
    SD_WAIT_READY,
    SD_WITHDRAW,
    SD_APPLY,
    SD_WAIT_HEALTHY,
    SD_COMMIT,
    SD_CLEANUP,
    SD_SUCCESS,
    SD_FAILED,   /* finalize abort (once guarded, before the commit), RECONFIGURING */
    SD_DETACHED, /* the instance was removed: nothing reported */
};
#define SD_STATE_COUNT 12

enum sd_event {
    SD_EV_CANDIDATES = 0, /* valid DEAD candidates: verify them */
    SD_EV_NOTHING_DEAD,   /* every candidate's engine answered for itself */
    SD_EV_PLANNED,        /* dead set and survivors computed */
    SD_EV_ROUND_OK,       /* every NM accepted the round (guard, apply, commit) */
    SD_EV_NOT_READY,      /* a status round: some survivor is not there yet */
    SD_EV_READY,          /* a status round: every survivor is in the wanted state */
    SD_EV_WITHDRAWN,      /* the coordinator confirmed it dropped the instance */
    SD_EV_CLEANED_UP,     /* drained NMs stopped, the survivors serve */
    SD_EV_FAIL,           /* gate closed, a round failed, a deadline, no survivor, gone */
    SD_EV_DETACH,         /* the instance went away (ctl_strategy_detach) */
};
#define SD_EV_COUNT 10

static const char *const sd_state_names[SD_STATE_COUNT] = {
    "DECIDING", "VERIFY",  "GUARD",   "WAIT_APPLY_READY", "WITHDRAW", "APPLY",
    "WAIT_HEALTHY", "COMMIT", "CLEANUP", "SUCCESS",          "FAILED",   "DETACHED",
};
/* The upstream phase each state reports (strategy_phase, history): verification is part
 * of DECIDING. */
static const char *const sd_phase_names[SD_STATE_COUNT] = {
    "DECIDING", "DECIDING", "GUARD",   "WAIT_APPLY_READY", "WITHDRAW", "APPLY",
    "WAIT_HEALTHY", "COMMIT", "CLEANUP", "SUCCESS",          "FAILED",   NULL,
};
static const char *const sd_event_names[SD_EV_COUNT] = {
    "CANDIDATES", "NOTHING_DEAD", "PLANNED",    "ROUND_OK", "NOT_READY",
    "READY",      "WITHDRAWN",    "CLEANED_UP", "FAIL",     "DETACH",
};

#define TO(x) ((int8_t)((x) + 1))
#define LIVE_EXITS [SD_EV_FAIL] = TO(SD_FAILED), [SD_EV_DETACH] = TO(SD_DETACHED)
static const int8_t sd_table[SD_STATE_COUNT][SD_EV_COUNT] = {
    [SD_DECIDING] = {[SD_EV_CANDIDATES] = TO(SD_VERIFY), LIVE_EXITS},
    [SD_VERIFY] = {[SD_EV_NOTHING_DEAD] = TO(SD_SUCCESS), [SD_EV_PLANNED] = TO(SD_GUARD),
                   LIVE_EXITS},
    [SD_GUARD] = {[SD_EV_ROUND_OK] = TO(SD_WAIT_READY), LIVE_EXITS},
    [SD_WAIT_READY] = {[SD_EV_NOT_READY] = TO(SD_WAIT_READY), [SD_EV_READY] = TO(SD_WITHDRAW),
                       LIVE_EXITS},
    [SD_WITHDRAW] = {[SD_EV_WITHDRAWN] = TO(SD_APPLY), LIVE_EXITS},
    [SD_APPLY] = {[SD_EV_ROUND_OK] = TO(SD_WAIT_HEALTHY), LIVE_EXITS},
    [SD_WAIT_HEALTHY] = {[SD_EV_NOT_READY] = TO(SD_WAIT_HEALTHY), [SD_EV_READY] = TO(SD_COMMIT),
                         LIVE_EXITS},
    [SD_COMMIT] = {[SD_EV_ROUND_OK] = TO(SD_CLEANUP), LIVE_EXITS},
    /* committed: nothing can fail any more */
    [SD_CLEANUP] = {[SD_EV_CLEANED_UP] = TO(SD_SUCCESS), [SD_EV_DETACH] = TO(SD_DETACHED)},
};
#undef LIVE_EXITS

const struct ctl_fsm ctl_scaledown_fsm = {
    .name = STRAT_SCALE_DOWN,
    .n_states = SD_STATE_COUNT,
    .n_events = SD_EV_COUNT,
    .states = sd_state_names,
    .events = sd_event_names,
    .table = &sd_table[0][0],
    .terminal = 1u << SD_SUCCESS | 1u << SD_FAILED | 1u << SD_DETACHED,
};

/* The node managers hold a guard (finalize abort is owed on failure) from a successful
 * GUARD round until the commit. */
static bool sd_guard_held(int st)
{
    return st >= SD_WAIT_READY && st <= SD_COMMIT;
}

struct sd_nm {
    char *base;
    char *key;
    char *ip;
    int64_t *local; /* every endpoint id of the pod */
    size_t n_local;
    int64_t *surv; /* its surviving non-headless ranks */
    size_t n_surv;
    int64_t *cand; /* its new removal candidates (verified first) */
    size_t n_cand;
};

struct scaledown {
    struct ctl_strategy base;
    char *request_id;
    struct sd_nm *nms;
    size_t n_nms;
    int64_t *dead;
    size_t n_dead;
    int64_t *surv;
    size_t n_surv;
    int64_t master;
    char *master_ip;
    size_t left;
    char *round_err; /* first hard failure of the round */
    int64_t *newly_dead;
    size_t n_newly_dead;
    int64_t *alive_cands; /* candidates whose engine answered: not dead after all */
    size_t n_alive_cands;
    size_t ready; /* survivors in the wanted state this round */
    int64_t deadline_ms;
};

static void sd_free(struct ctl_strategy *b)
{
    struct scaledown *s = (struct scaledown *)b;
    for (size_t i = 0; i < s->n_nms; i++) {
        free(s->nms[i].base);
        free(s->nms[i].key);
        free(s->nms[i].ip);
        free(s->nms[i].local);
        free(s->nms[i].surv);
        free(s->nms[i].cand);
    }
    free(s->nms);
    free(s->request_id);
    free(s->dead);
    free(s->surv);
    free(s->master_ip);
    free(s->round_err);
    free(s->newly_dead);
    free(s->alive_cands);
    free(s);
}

static struct ctl_ft_rt *rt_of(struct scaledown *s)
{
    return ctl_find_rt(s->base.c, s->base.instance_id);
}

/* The upstream phase of the current state, into the runtime and the log. */
static void sd_announce(struct scaledown *s, const char *detail)
{
    const char *phase = sd_phase_names[s->base.state];
    if (!phase)
        return;
    struct ctl_ft_rt *rt = rt_of(s);
    if (rt)
        ctl_ft_set_strategy(rt, STRAT_SCALE_DOWN, phase, detail);
    log_info("strategy_phase", LF_INT("instance_id", s->base.instance_id),
             LF_STR("strategy", STRAT_SCALE_DOWN), LF_STR("phase", phase), LF_STR("detail", detail),
             LF_STR("request_id", s->request_id));
}

/* An event of the FT runtime's own table (ctl_ft.c), saved when it changed the phase. */
static void rt_event(struct scaledown *s, enum ctl_ft_event ev, const char *detail)
{
    struct ctl_ft_rt *rt = rt_of(s);
    if (!rt)
        return;
    ctl_ft_event(rt, ev, detail);
    if (rt->dirty)
        ctl_save_rt(s->base.c, rt);
}

static json_t *ids_json(const int64_t *v, size_t n)
{
    return ctl_ids_json(v, n);
}

static void sd_round(struct scaledown *s);
static void sd_to(struct scaledown *s, enum sd_event ev, const char *cause);
static void sd_withdrawn(struct ctl *c, int64_t id, int err, void *arg);

/* SUCCESS / FAILED: report and let go. */
static void sd_finish(struct scaledown *s, bool ok, const char *why)
{
    struct ctl *c = s->base.c;
    reactor_timer_stop(c->r, &s->base.timer);
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    if (in && in->strategy == s)
        in->strategy = NULL;
    ctl_strategy_finished(c, s->base.instance_id, STRAT_SCALE_DOWN, ok, ok ? NULL : why);
    ctl_strategy_release(&s->base);
}

/* What a state does when entered (from: the previous state; cause: the transition's). */
static void sd_enter(struct scaledown *s, int from, const char *cause)
{
    struct ctl *c = s->base.c;
    int st = s->base.state;
    if (st == from) {
        /* WAIT_APPLY_READY / WAIT_HEALTHY: poll again */
        reactor_timer_start(c->r, &s->base.timer, c->cfg.sd_poll_ms, 0);
        return;
    }
    switch ((enum sd_state)st) {
    case SD_DECIDING:
        break;
    case SD_VERIFY:
    case SD_GUARD:
    case SD_APPLY:
    case SD_COMMIT:
        sd_announce(s, cause);
        sd_round(s);
        break;
    case SD_WAIT_READY:
        s->deadline_ms = reactor_now(c->r) + c->cfg.sd_deadline_ms;
        sd_announce(s, cause);
        sd_round(s);
        break;
    case SD_WAIT_HEALTHY:
        s->deadline_ms = reactor_now(c->r) + c->cfg.sd_deadline_ms;
        sd_announce(s, cause);
        reactor_timer_start(c->r, &s->base.timer, c->cfg.sd_poll_ms, 0);
        break;
    case SD_WITHDRAW: {
        sd_announce(s, cause);
        struct ctl_inst *in = ctl_find(c, s->base.instance_id);
        if (!in) {
            sd_to(s, SD_EV_FAIL, "instance gone");
            break;
        }
        s->base.inflight++;
        ctl_push_withdraw(c, in, sd_withdrawn, s);
        break;
    }
    case SD_CLEANUP: {
        sd_announce(s, cause);
        if (c->cfg.scale_up_enable) {
            /* Pods left without a rank give their resources back to the platform. */
            for (size_t i = 0; i < s->n_nms; i++) {
                bool drained = s->nms[i].n_local > 0;
                for (size_t k = 0; k < s->nms[i].n_local && drained; k++)
                    drained = ctl_ids_has(s->dead, s->n_dead, s->nms[i].local[k]);
                if (!drained)
                    continue;
                char *url = xasprintf("%s/node-manager/stop", s->nms[i].base);
                ctl_http_fire(c, "POST", url, NULL, c->cfg.sd_request_timeout_ms,
                              "drained_node_manager_stop", s->base.instance_id);
                free(url);
            }
        }
        rt_event(s, FT_EV_CLEANED_UP, "survivors serving");
        char why[128];
        snprintf(why, sizeof(why), "%zu rank(s) retired, %zu serving, master rank %lld",
                 s->n_dead, s->n_surv, (long long)s->master);
        sd_to(s, SD_EV_CLEANED_UP, why);
        break;
    }
    case SD_SUCCESS:
        sd_announce(s, cause);
        sd_finish(s, true, cause);
        break;
    case SD_FAILED: {
        log_warn("dp_scale_down_failed", LF_INT("instance_id", s->base.instance_id),
                 LF_STR("request_id", s->request_id), LF_STR("reason", cause));
        if (sd_guard_held(from)) {
            json_t *body = json_pack("{s:s, s:[], s:b}", "request_id", s->request_id,
                                     "retired_endpoint_ids", "commit", 0);
            for (size_t i = 0; i < s->n_nms; i++) {
                char *url = xasprintf("%s/node-manager/fault-tolerance/finalize", s->nms[i].base);
                ctl_http_fire(c, "POST", url, body, c->cfg.sd_request_timeout_ms,
                              "dp_scale_down_abort", s->base.instance_id);
                free(url);
            }
            json_decref(body);
        }
        struct ctl_ft_rt *rt = rt_of(s);
        if (rt) {
            free(rt->pending);
            rt->pending = NULL;
            rt->n_pending = 0;
            ctl_ft_set_error(rt, cause);
            ctl_ft_set_fallback(rt, c->cfg.relaunch_enable ? STRAT_RELAUNCH : STRAT_RECONFIG);
            ctl_ft_event(rt, FT_EV_FAILED, cause);
            ctl_save_rt(c, rt);
        }
        sd_announce(s, cause);
        sd_finish(s, false, cause);
        break;
    }
    case SD_DETACHED:
        reactor_timer_stop(c->r, &s->base.timer);
        ctl_strategy_release(&s->base);
        break;
    }
}

/* The one transition function. */
static void sd_to(struct scaledown *s, enum sd_event ev, const char *cause)
{
    int from =
        ctl_fsm_step(&ctl_scaledown_fsm, &s->base.state, (int)ev, s->base.instance_id, cause);
    if (from >= 0)
        sd_enter(s, from, cause);
}

static void sd_detach(struct ctl_strategy *b)
{
    sd_to((struct scaledown *)b, SD_EV_DETACH, "instance removed");
}

static void sd_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct scaledown *s = arg;
    if (!ctl_strategy_over(&s->base))
        sd_round(s);
}

static void round_err(struct scaledown *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void round_err(struct scaledown *s, const char *fmt, ...)
{
    if (s->round_err)
        return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    s->round_err = xstrdup(buf);
}

/* Classify one survivor's FT entry. Returns 1 wanted state, 0 keep waiting, -1 failure
 * (round_err set); newly dead survivors are collected. */
static int classify(struct scaledown *s, const struct wire_ft_engine_entry *e)
{
    if (!e)
        return 0;
    switch (e->state) {
    case WIRE_FT_DEAD:
        if (s->base.state == SD_WAIT_READY) {
            ctl_ids_add(&s->newly_dead, &s->n_newly_dead, e->id);
            return 0;
        }
        round_err(s, "rank %lld died during the scale-down", (long long)e->id);
        return -1;
    case WIRE_FT_UNKNOWN:
        return 0;
    case WIRE_FT_HEALTHY:
        if (s->base.state == SD_WAIT_HEALTHY && !e->ft_state)
            return 1;
        if (s->base.state == SD_WAIT_READY)
            return 0;
        break;
    case WIRE_FT_UNHEALTHY:
        if (!e->ft_state)
            return s->base.state == SD_WAIT_READY ? 1 : 0;
        if (strcmp(e->ft_state, "recovering") == 0)
            return 0;
        break;
    case WIRE_FT_OTHER:
        break;
    }
    round_err(s, "rank %lld: unexpected status %s%s%s", (long long)e->id, e->status,
              e->ft_state ? "/" : "", e->ft_state ? e->ft_state : "");
    return -1;
}

static void record_entry(struct scaledown *s, const struct wire_ft_engine_entry *e)
{
    struct ctl_ft_rt *rt = rt_of(s);
    if (!rt)
        return;
    char key[24];
    snprintf(key, sizeof(key), "%lld", (long long)e->id);
    json_object_set_new(rt->engine_statuses, key, wire_ft_engine_entry_to_json(e));
}

static void status_reply(struct scaledown *s, size_t i, const struct httpc_response *resp)
{
    struct sd_nm *nm = &s->nms[i];
    if (!ctl_http_ok(resp)) {
        /* One failed query is no evidence (§12.4): wait for the next poll. */
        log_warn("dp_scale_down_status_failed", LF_INT("instance_id", s->base.instance_id),
                 LF_STR("node_manager", nm->key), LF_STR("error", ctl_http_err(resp)));
        return;
    }
    json_t *j = ctl_http_json(resp);
    struct wire_ft_engines l = {0};
    struct wire_err err = {{0}};
    if (!j || wire_ft_status_reply_parse(j, &l, &err) < 0) {
        log_warn("dp_scale_down_status_invalid", LF_INT("instance_id", s->base.instance_id),
                 LF_STR("node_manager", nm->key), LF_STR("error", j ? err.msg : "not JSON"));
        json_decref(j);
        return;
    }
    json_decref(j);
    for (size_t k = 0; k < nm->n_surv; k++) {
        const struct wire_ft_engine_entry *e = wire_ft_engines_find(&l, nm->surv[k]);
        if (e)
            record_entry(s, e);
        if (classify(s, e) == 1)
            s->ready++;
    }
    wire_ft_engines_release(&l);
}

/* A candidate whose engine answers its FT status itself (healthy, unhealthy, any
 * engine-reported state but `dead`) is alive: node managers also report engines that
 * are merely unhealthy as dead (suicide arbitration) — upstream ones e.g. survivors still
 * recovering from the previous scale-down (motor node managers hold arbitration after a
 * commit until the survivors are healthy; this check stays for the others and for any
 * other alive-but-abnormal report). Only `dead`, `unknown` (no answer: the process is
 * gone) or no entry keep a candidate. */
static void verify_reply(struct scaledown *s, size_t i, const struct httpc_response *resp)
{
    struct sd_nm *nm = &s->nms[i];
    if (!ctl_http_ok(resp))
        return;
    json_t *j = ctl_http_json(resp);
    struct wire_ft_engines l = {0};
    if (!j || wire_ft_status_reply_parse(j, &l, NULL) < 0) {
        json_decref(j);
        return;
    }
    json_decref(j);
    for (size_t k = 0; k < nm->n_cand; k++) {
        const struct wire_ft_engine_entry *e = wire_ft_engines_find(&l, nm->cand[k]);
        if (!e || e->state == WIRE_FT_DEAD || e->state == WIRE_FT_UNKNOWN)
            continue;
        record_entry(s, e);
        log_warn("dp_scale_down_candidate_alive", LF_INT("instance_id", s->base.instance_id),
                 LF_INT("rank", e->id), LF_STR("status", e->status));
        ctl_ids_add(&s->alive_cands, &s->n_alive_cands, e->id);
    }
    wire_ft_engines_release(&l);
}

static void sd_remove_survivor(struct scaledown *s, int64_t id)
{
    ctl_ids_remove(s->surv, &s->n_surv, id);
    for (size_t i = 0; i < s->n_nms; i++)
        ctl_ids_remove(s->nms[i].surv, &s->nms[i].n_surv, id);
    ctl_ids_add(&s->dead, &s->n_dead, id);
}

static void sd_withdrawn(struct ctl *c, int64_t id, int err, void *arg)
{
    (void)c;
    (void)id;
    struct scaledown *s = arg;
    s->base.inflight--;
    if (ctl_strategy_over(&s->base)) {
        ctl_strategy_release(&s->base);
        return;
    }
    if (err < 0) {
        sd_to(s, SD_EV_FAIL, "the coordinator did not confirm the withdrawal");
        return;
    }
    rt_event(s, FT_EV_WITHDRAWN, "withdrawn from the coordinator");
    sd_to(s, SD_EV_WITHDRAWN, "scale_down sent once to every node manager with survivors");
}

/* Every survivor is ready for the apply: the ranks being removed become pending in the
 * runtime and the lowest survivor is the new master. False when the instance is gone. */
static bool sd_prepare_apply(struct scaledown *s)
{
    struct ctl *c = s->base.c;
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    struct ctl_ft_rt *rt = rt_of(s);
    if (!in || !rt)
        return false;
    free(rt->pending);
    rt->pending = NULL;
    rt->n_pending = 0;
    for (size_t i = 0; i < s->n_dead; i++)
        if (!ctl_ids_has(rt->committed, rt->n_committed, s->dead[i]))
            ctl_ids_add(&rt->pending, &rt->n_pending, s->dead[i]);
    s->master = s->surv[0]; /* sorted: the lowest surviving global rank */
    struct wire_endpoint *ep = ctl_inst_endpoint(in, s->master, NULL);
    free(s->master_ip);
    s->master_ip = xstrdup(ep ? ep->ip : in->master_dp_ip);
    return true;
}

/* Committed on every NM: the dead ranks are retired for good. */
static void sd_record_commit(struct scaledown *s)
{
    struct ctl_ft_rt *rt = rt_of(s);
    if (rt) {
        for (size_t i = 0; i < s->n_dead; i++)
            ctl_ids_add(&rt->committed, &rt->n_committed, s->dead[i]);
        free(rt->pending);
        rt->pending = NULL;
        rt->n_pending = 0;
        rt->dirty = true;
    }
    rt_event(s, FT_EV_COMMITTED, "committed on every node manager");
}

enum sd_plan { PLAN_OK, PLAN_NOTHING_DEAD, PLAN_GONE, PLAN_NO_SURVIVOR };

/* After verification: dead = committed ∪ verified candidates, survivors = the other
 * non-headless endpoints, grouped per NM. */
static enum sd_plan sd_plan(struct scaledown *s)
{
    struct ctl *c = s->base.c;
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    struct ctl_ft_rt *rt = rt_of(s);
    if (!in || !rt)
        return PLAN_GONE;
    for (size_t i = 0; i < rt->n_committed; i++)
        ctl_ids_add(&s->dead, &s->n_dead, rt->committed[i]);
    size_t fresh = 0;
    for (size_t i = 0; i < s->n_nms; i++)
        for (size_t k = 0; k < s->nms[i].n_cand; k++)
            if (!ctl_ids_has(s->alive_cands, s->n_alive_cands, s->nms[i].cand[k])) {
                ctl_ids_add(&s->dead, &s->n_dead, s->nms[i].cand[k]);
                fresh++;
            }
    if (fresh == 0)
        return PLAN_NOTHING_DEAD; /* every reported engine answered for itself */
    for (size_t i = 0; i < in->n_nms; i++)
        for (size_t j = 0; j < in->nms[i].n_eps; j++) {
            const struct wire_endpoint *ep = &in->nms[i].eps[j];
            if (!ep->headless && !ctl_ids_has(s->dead, s->n_dead, ep->id))
                ctl_ids_add(&s->surv, &s->n_surv, ep->id);
        }
    if (s->n_surv == 0)
        return PLAN_NO_SURVIVOR;
    for (size_t i = 0; i < s->n_nms; i++) {
        struct sd_nm *nm = &s->nms[i];
        for (size_t k = 0; k < nm->n_local; k++)
            if (ctl_ids_has(s->surv, s->n_surv, nm->local[k]))
                ctl_ids_add(&nm->surv, &nm->n_surv, nm->local[k]);
    }
    return PLAN_OK;
}

/* Every answer of a round is in: what happened, as an event. */
static void sd_round_done(struct scaledown *s)
{
    struct ctl *c = s->base.c;
    int64_t now = reactor_now(c->r);
    if (!ctl_find(c, s->base.instance_id)) {
        sd_to(s, SD_EV_FAIL, "instance deleted during the scale-down");
        return;
    }
    char *err = s->round_err;
    s->round_err = NULL;
    switch ((enum sd_state)s->base.state) {
    case SD_VERIFY:
        switch (sd_plan(s)) {
        case PLAN_GONE:
            sd_to(s, SD_EV_FAIL, "instance gone");
            break;
        case PLAN_NOTHING_DEAD:
            sd_to(s, SD_EV_NOTHING_DEAD, "no candidate is dead: every reported engine answered");
            break;
        case PLAN_NO_SURVIVOR:
            sd_to(s, SD_EV_FAIL, "no surviving rank would be left");
            break;
        case PLAN_OK: {
            char detail[160];
            snprintf(detail, sizeof(detail), "guarding %zu node manager(s), lease %.0f s",
                     s->n_nms, ctlcfg_guard_lease_s(&c->cfg));
            sd_to(s, SD_EV_PLANNED, detail);
            break;
        }
        }
        break;
    case SD_GUARD:
        if (err)
            sd_to(s, SD_EV_FAIL, err);
        else
            sd_to(s, SD_EV_ROUND_OK,
                  "waiting for every survivor to be unhealthy without ft_state");
        break;
    case SD_WAIT_READY:
        for (size_t i = 0; i < s->n_newly_dead; i++) {
            log_warn("dp_scale_down_rank_dead", LF_INT("instance_id", s->base.instance_id),
                     LF_INT("rank", s->newly_dead[i]));
            sd_remove_survivor(s, s->newly_dead[i]);
        }
        s->n_newly_dead = 0;
        if (err) {
            sd_to(s, SD_EV_FAIL, err);
            break;
        }
        if (s->n_surv == 0) {
            sd_to(s, SD_EV_FAIL, "no surviving rank left");
            break;
        }
        if (s->ready >= s->n_surv) {
            if (!sd_prepare_apply(s))
                sd_to(s, SD_EV_FAIL, "instance gone");
            else
                sd_to(s, SD_EV_READY, "waiting for the coordinator to drop the instance");
            break;
        }
        rt_event(s, FT_EV_WAIT_FAULT, "survivors not ready for apply yet");
        if (now >= s->deadline_ms) {
            sd_to(s, SD_EV_FAIL, "survivors not ready for apply before the execution deadline");
            break;
        }
        sd_to(s, SD_EV_NOT_READY, NULL);
        break;
    case SD_APPLY:
        if (err)
            sd_to(s, SD_EV_FAIL, err);
        else
            sd_to(s, SD_EV_ROUND_OK, "waiting for every survivor to be healthy");
        break;
    case SD_WAIT_HEALTHY:
        if (err) {
            sd_to(s, SD_EV_FAIL, err);
            break;
        }
        if (s->ready >= s->n_surv) {
            sd_to(s, SD_EV_READY, "finalize commit on every node manager");
            break;
        }
        if (now >= s->deadline_ms) {
            sd_to(s, SD_EV_FAIL, "survivors not healthy before the execution deadline");
            break;
        }
        sd_to(s, SD_EV_NOT_READY, NULL);
        break;
    case SD_COMMIT:
        if (err) {
            sd_to(s, SD_EV_FAIL, err);
            break;
        }
        sd_record_commit(s);
        sd_to(s, SD_EV_ROUND_OK, NULL);
        break;
    default:
        break;
    }
    free(err);
}

static void sd_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    (void)c;
    struct scaledown *s = arg;
    size_t i = (size_t)tag;
    s->base.inflight--;
    if (ctl_strategy_over(&s->base)) {
        ctl_strategy_release(&s->base);
        return;
    }
    s->left--;
    switch ((enum sd_state)s->base.state) {
    case SD_VERIFY:
        verify_reply(s, i, resp);
        break;
    case SD_GUARD:
    case SD_APPLY:
    case SD_COMMIT:
        if (!ctl_http_ok(resp))
            round_err(s, "%s failed on %s: %s",
                      s->base.state == SD_GUARD   ? "guard"
                      : s->base.state == SD_APPLY ? "apply"
                                                  : "commit",
                      s->nms[i].key, ctl_http_err(resp));
        break;
    case SD_WAIT_READY:
    case SD_WAIT_HEALTHY:
        status_reply(s, i, resp);
        break;
    default:
        break;
    }
    if (s->left == 0)
        sd_round_done(s);
}

static void sd_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct scaledown *s = arg;
    s->base.inflight--;
    ctl_strategy_release(&s->base);
}

static void sd_round(struct scaledown *s)
{
    struct ctl *c = s->base.c;
    const char *path;
    switch ((enum sd_state)s->base.state) {
    case SD_VERIFY:
        path = "/node-manager/fault-tolerance/status";
        break;
    case SD_GUARD:
        path = "/node-manager/fault-tolerance/guard";
        break;
    case SD_WAIT_READY:
    case SD_WAIT_HEALTHY:
        path = "/node-manager/fault-tolerance/status";
        break;
    case SD_APPLY:
        path = "/node-manager/fault-tolerance/apply";
        break;
    case SD_COMMIT:
        path = "/node-manager/fault-tolerance/finalize";
        break;
    default:
        return;
    }
    s->ready = 0;
    /* Count first: a round completes when `left` drops to zero. */
    bool *go = xcalloc(s->n_nms + 1, sizeof(bool));
    s->left = 0;
    int st = s->base.state;
    bool needs_survivors = st == SD_WAIT_READY || st == SD_WAIT_HEALTHY || st == SD_APPLY;
    for (size_t i = 0; i < s->n_nms; i++) {
        go[i] = st == SD_VERIFY ? s->nms[i].n_cand > 0 : !needs_survivors || s->nms[i].n_surv > 0;
        s->left += go[i];
    }
    if (s->left == 0) {
        free(go);
        sd_round_done(s);
        return;
    }
    for (size_t i = 0; i < s->n_nms; i++) {
        if (!go[i])
            continue;
        struct sd_nm *nm = &s->nms[i];
        json_t *body = NULL;
        switch ((enum sd_state)s->base.state) {
        case SD_VERIFY:
            body = json_pack("{s:o}", "endpoint_ids", ids_json(nm->cand, nm->n_cand));
            break;
        case SD_GUARD:
            body = json_pack("{s:s, s:f}", "request_id", s->request_id, "lease_sec",
                             ctlcfg_guard_lease_s(&c->cfg));
            break;
        case SD_WAIT_READY:
        case SD_WAIT_HEALTHY:
            body = json_pack("{s:o}", "endpoint_ids", ids_json(nm->surv, nm->n_surv));
            break;
        case SD_APPLY:
            body = json_pack("{s:o, s:s, s:{s:o, s:s, s:I}, s:s}", "endpoint_ids",
                             ids_json(nm->surv, nm->n_surv), "instruction", "scale_down", "params",
                             "removed_dp_ranks", ids_json(s->dead, s->n_dead), "dp_master_ip",
                             s->master_ip, "dp_master_rank", (json_int_t)s->master, "request_id",
                             s->request_id);
            break;
        case SD_COMMIT: {
            int64_t *mine = NULL;
            size_t n_mine = 0;
            for (size_t k = 0; k < nm->n_local; k++)
                if (ctl_ids_has(s->dead, s->n_dead, nm->local[k]))
                    ctl_ids_add(&mine, &n_mine, nm->local[k]);
            body = json_pack("{s:s, s:o, s:b, s:I}", "request_id", s->request_id,
                             "retired_endpoint_ids", ids_json(mine, n_mine), "commit", 1,
                             "dp_master_rank", (json_int_t)s->master);
            free(mine);
            break;
        }
        default:
            break;
        }
        char *url = xasprintf("%s%s", nm->base, path);
        s->base.inflight++;
        ctl_request(c, "POST", url, body, c->cfg.sd_request_timeout_ms, sd_done, s, (intptr_t)i,
                    sd_drop);
        free(url);
        json_decref(body);
    }
    free(go);
}

int ctl_scaledown_start(struct ctl *c, struct ctl_inst *in, const int64_t *candidates, size_t n)
{
    if (in->strategy || !in->ft)
        return -1;
    struct ctl_ft_rt *rt = in->ft;
    struct scaledown *s = xcalloc(1, sizeof(*s));
    s->base.name = STRAT_SCALE_DOWN;
    s->base.c = c;
    s->base.instance_id = in->id;
    s->base.free_fn = sd_free;
    reactor_timer_init(&s->base.timer, sd_timer, s);
    s->base.fsm = &ctl_scaledown_fsm;
    s->base.state = SD_DECIDING;
    s->base.detach_fn = sd_detach;
    s->request_id = ctl_ft_new_request_id();
    in->strategy = s;
    ctl_ft_set_request_id(rt, s->request_id);
    json_object_clear(rt->engine_statuses);
    ctl_ft_set_error(rt, NULL);
    /* The fallback if this fails: what the instance would have got without scale-down. */
    ctl_ft_set_fallback(rt, c->cfg.relaunch_enable ? STRAT_RELAUNCH : STRAT_RECONFIG);
    rt_event(s, FT_EV_SCALE_DOWN, "DEAD engines reported");
    log_warn("strategy_started", LF_INT("instance_id", in->id), LF_STR("job_name", in->job_name),
             LF_STR("strategy", STRAT_SCALE_DOWN), LF_STR("request_id", s->request_id));
    sd_announce(s, NULL);
    rt->gate =
        ctl_ft_gate(c->cfg.ft_enable, c->cfg.scale_down_enable, &in->ft_cap, in->ft_cap_consistent);
    if (rt->gate) {
        sd_to(s, SD_EV_FAIL, "gate closed");
        return 0;
    }
    size_t valid = 0;
    int64_t *cands = NULL;
    size_t n_cands = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t id = candidates[i];
        struct wire_endpoint *ep = ctl_inst_endpoint(in, id, NULL);
        if (!ep || ep->headless || !ctl_ids_has(rt->original, rt->n_original, id) ||
            ctl_ids_has(rt->committed, rt->n_committed, id)) {
            log_warn("dp_scale_down_candidate_ignored", LF_INT("instance_id", in->id),
                     LF_INT("rank", id));
            continue;
        }
        ctl_ids_add(&cands, &n_cands, id);
        valid++;
    }
    if (valid == 0) {
        free(cands);
        sd_to(s, SD_EV_FAIL, "no valid DEAD candidate rank");
        return 0;
    }
    s->n_nms = in->n_nms;
    s->nms = xcalloc(s->n_nms + 1, sizeof(*s->nms));
    for (size_t i = 0; i < in->n_nms; i++) {
        struct sd_nm *nm = &s->nms[i];
        nm->base = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "");
        nm->key = xasprintf("%s:%s", in->nms[i].pod_ip, in->nms[i].port);
        nm->ip = xstrdup(in->nms[i].pod_ip);
        for (size_t j = 0; j < in->nms[i].n_eps; j++) {
            const struct wire_endpoint *ep = &in->nms[i].eps[j];
            ctl_ids_add(&nm->local, &nm->n_local, ep->id);
            if (ctl_ids_has(cands, n_cands, ep->id))
                ctl_ids_add(&nm->cand, &nm->n_cand, ep->id);
        }
    }
    free(cands);
    if (!in->withdrawn)
        ctl_push_withdraw(c, in, NULL, NULL);
    sd_to(s, SD_EV_CANDIDATES, "verifying that the candidates' engines are dead");
    return 0;
}
