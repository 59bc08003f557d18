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
 * Upstream polls the relaxed status only; requiring fresh NORMAL heartbeats as well
 * keeps a node manager that still reports its pre-relaunch statuses from ending the
 * strategy before the engines are actually back (§12.9, §12.22). */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

enum rl_step { RL_PROBE = 0, RL_DISPATCH, RL_POLL, RL_DONE };

struct relaunch {
    struct ctl_strategy base;
    enum rl_step step;
    size_t n;
    char **base_urls;
    char **keys;
    bool *ok;
    bool *dispatched;
    int *fails;
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

static void rl_phase(struct relaunch *s, const char *phase, const char *detail)
{
    struct ctl *c = s->base.c;
    struct ctl_ft_rt *rt = ctl_find_rt(c, s->base.instance_id);
    if (rt)
        ctl_ft_set_strategy(rt, STRAT_RELAUNCH, phase, detail);
    log_info("strategy_phase", LF_INT("instance_id", s->base.instance_id),
             LF_STR("strategy", STRAT_RELAUNCH), LF_STR("phase", phase), LF_STR("detail", detail));
}

static void rl_finish(struct relaunch *s, bool ok, const char *why)
{
    struct ctl *c = s->base.c;
    rl_phase(s, ok ? "SUCCESS" : "FAILED", why);
    s->step = RL_DONE;
    s->base.finished = true;
    reactor_timer_stop(c->r, &s->base.timer);
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    if (in && in->strategy == s)
        in->strategy = NULL;
    ctl_strategy_finished(c, s->base.instance_id, STRAT_RELAUNCH, ok, ok ? NULL : why);
    ctl_strategy_release(&s->base);
}

static void rl_restart_container(struct relaunch *s, const char *why)
{
    struct ctl *c = s->base.c;
    rl_phase(s, "RESTART_CONTAINER", why);
    /* Only the NMs that did not accept a restart get "abort": the others are relaunching
     * and keep their freeze, whose deadline is their own fallback. */
    json_t *body =
        json_pack("{s:s, s:I}", "action", "abort", "instance_id", (json_int_t)s->base.instance_id);
    for (size_t i = 0; i < s->n; i++) {
        if (s->dispatched[i])
            continue;
        char *url = xasprintf("%s/node-manager/engine-restart", s->base_urls[i]);
        ctl_http_fire(c, "POST", url, body, c->cfg.nm_probe_timeout_ms, "engine_restart_abort",
                      s->base.instance_id);
        free(url);
    }
    json_decref(body);
    rl_finish(s, false, why);
}

static void rl_round(struct relaunch *s);

static void rl_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct relaunch *s = arg;
    if (!s->base.finished)
        rl_round(s);
}

static void rl_later(struct relaunch *s, int64_t delay_ms)
{
    reactor_timer_start(s->base.c->r, &s->base.timer, delay_ms, 0);
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

static void rl_round_done(struct relaunch *s)
{
    struct ctl *c = s->base.c;
    int64_t now = reactor_now(c->r);
    struct ctl_inst *in = ctl_find(c, s->base.instance_id);
    char names[512], why[768];
    size_t n_ok = 0;
    for (size_t i = 0; i < s->n; i++)
        n_ok += s->ok[i];
    switch (s->step) {
    case RL_PROBE:
        if (n_ok == s->n) {
            s->step = RL_DISPATCH;
            s->attempts = 0;
            memset(s->ok, 0, s->n * sizeof(bool));
            rl_phase(s, "RELAUNCH_ENGINE", "every node manager reachable: dispatching restart");
            rl_round(s);
            return;
        }
        names_of(s, s->ok, false, names, sizeof(names));
        if (++s->attempts >= c->cfg.relaunch_retries) {
            snprintf(why, sizeof(why), "node manager(s) unreachable: %s", names);
            rl_restart_container(s, why);
            return;
        }
        rl_later(s, c->cfg.relaunch_backoff_ms);
        return;
    case RL_DISPATCH:
        if (n_ok == s->n) {
            s->step = RL_POLL;
            s->attempts = 0;
            s->dispatch_wall_s = (double)util_wall_ms() / 1000.0;
            rl_phase(s, "RELAUNCH_ENGINE", "restart accepted everywhere: polling relaxed status");
            memset(s->ok, 0, s->n * sizeof(bool));
            rl_later(s, c->cfg.relaunch_poll_ms);
            return;
        }
        names_of(s, s->ok, false, names, sizeof(names));
        if (++s->attempts >= c->cfg.relaunch_retries) {
            snprintf(why, sizeof(why), "restart not accepted by: %s", names);
            rl_restart_container(s, why);
            return;
        }
        rl_later(s, c->cfg.relaunch_backoff_ms);
        return;
    case RL_POLL:
        if (!in) {
            rl_finish(s, true, "instance deleted meanwhile");
            return;
        }
        for (size_t i = 0; i < s->n; i++) {
            if (s->fails[i] >= c->cfg.relaunch_unreachable) {
                snprintf(why, sizeof(why), "node manager %s failed %d status polls in a row",
                         s->keys[i], s->fails[i]);
                rl_restart_container(s, why);
                return;
            }
        }
        if (n_ok == s->n && recovered(c, in, s->dispatch_wall_s)) {
            rl_finish(s, true, "every engine relaunched and the instance reports NORMAL");
            return;
        }
        if (now >= s->deadline_ms) {
            snprintf(why, sizeof(why), "relaunch not complete within %lld ms",
                     (long long)c->cfg.relaunch_timeout_ms);
            rl_restart_container(s, why);
            return;
        }
        memset(s->ok, 0, s->n * sizeof(bool));
        rl_later(s, c->cfg.relaunch_poll_ms);
        return;
    case RL_DONE:
        return;
    }
}

static void rl_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    struct relaunch *s = arg;
    size_t i = (size_t)tag;
    s->base.inflight--;
    if (s->base.finished) {
        ctl_strategy_release(&s->base);
        return;
    }
    s->left--;
    switch (s->step) {
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
    case RL_DONE:
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

static void rl_round(struct relaunch *s)
{
    struct ctl *c = s->base.c;
    if (s->step != RL_PROBE && s->step != RL_DISPATCH && s->step != RL_POLL)
        return;
    if (reactor_now(c->r) >= s->deadline_ms && s->step != RL_POLL) {
        rl_restart_container(s, "relaunch deadline passed before dispatch completed");
        return;
    }
    json_t *body = NULL;
    if (s->step == RL_DISPATCH)
        body = json_pack("{s:s, s:I}", "action", "restart", "instance_id",
                         (json_int_t)s->base.instance_id);
    s->left = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (s->step != RL_POLL && s->ok[i])
            continue;
        s->left++;
    }
    size_t todo = s->left;
    for (size_t i = 0; i < s->n && todo; i++) {
        if (s->step != RL_POLL && s->ok[i])
            continue;
        char *url;
        int64_t timeout = c->cfg.nm_probe_timeout_ms;
        if (s->step == RL_PROBE) {
            url = xasprintf("%s/node-manager/status", s->base_urls[i]);
        } else if (s->step == RL_DISPATCH) {
            url = xasprintf("%s/node-manager/engine-restart", s->base_urls[i]);
            /* The NM answers after stopping the old engines (SIGTERM grace) and spawning
             * the new ones: allow for that. */
            timeout = MOTOR_MAX(c->cfg.start_cmd_timeout_ms, 30000);
        } else {
            url = xasprintf("%s/node-manager/status?relaxed=true", s->base_urls[i]);
        }
        s->base.inflight++;
        todo--;
        ctl_request(c, s->step == RL_DISPATCH ? "POST" : "GET", url, body, timeout, rl_done, s,
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
    s->base.free_fn = rl_free;
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
    rl_phase(s, "INIT", "resolved the instance and its node managers");
    if (!in->withdrawn)
        ctl_push_withdraw(c, in, NULL, NULL);
    s->step = RL_PROBE;
    rl_phase(s, "RELAUNCH_ENGINE", "probing every node manager");
    rl_round(s);
    return 0;
}
