#include "controller/ctl_ft.h"

#include "controller/ctl_fsm.h"
#include "controller/ctl_inst.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static const char *const phase_names[FT_PHASE_COUNT] = {
    "DISABLED",
    "NORMAL",
    "DECIDING",
    "WAITING_ENGINE_FAULT",
    "SCALING_DOWN",
    "POST_SCALE_CLEANUP",
    "SCALED_DOWN_RUNNING",
    "RECONFIGURING",
};

const char *ctl_ft_phase_name(enum ctl_ft_phase p)
{
    return (unsigned)p < FT_PHASE_COUNT ? phase_names[p] : "?";
}

static const char *const event_names[FT_EV_COUNT] = {
    [FT_EV_SCALE_DOWN] = "SCALE_DOWN",  [FT_EV_WAIT_FAULT] = "WAIT_FAULT",
    [FT_EV_WITHDRAWN] = "WITHDRAWN",    [FT_EV_COMMITTED] = "COMMITTED",
    [FT_EV_CLEANED_UP] = "CLEANED_UP",  [FT_EV_FAILED] = "FAILED",
    [FT_EV_RECONFIGURE] = "RECONFIGURE", [FT_EV_RESUME] = "RESUME",
    [FT_EV_RESUME_SCALED] = "RESUME_SCALED",
};

/* Cells: new phase + 1 (0 = illegal). A runtime serves (NORMAL, SCALED_DOWN_RUNNING),
 * runs one scale-down transaction (DECIDING .. POST_SCALE_CLEANUP) or waits for its
 * fallback / replacement (RECONFIGURING). DISABLED is never entered by Motor; a stored
 * one behaves like NORMAL. */
#define TO(p) ((int8_t)((p) + 1))
static const int8_t phase_table[FT_PHASE_COUNT][FT_EV_COUNT] = {
    [FT_DISABLED] = {[FT_EV_SCALE_DOWN] = TO(FT_DECIDING),
                     [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING),
                     [FT_EV_RESUME] = TO(FT_NORMAL),
                     [FT_EV_RESUME_SCALED] = TO(FT_SCALED_DOWN_RUNNING)},
    [FT_NORMAL] = {[FT_EV_SCALE_DOWN] = TO(FT_DECIDING),
                   [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING)},
    [FT_DECIDING] = {[FT_EV_WAIT_FAULT] = TO(FT_WAITING_ENGINE_FAULT),
                     [FT_EV_WITHDRAWN] = TO(FT_SCALING_DOWN),
                     [FT_EV_FAILED] = TO(FT_RECONFIGURING),
                     [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING),
                     [FT_EV_RESUME] = TO(FT_NORMAL),
                     [FT_EV_RESUME_SCALED] = TO(FT_SCALED_DOWN_RUNNING)},
    [FT_WAITING_ENGINE_FAULT] = {[FT_EV_WAIT_FAULT] = TO(FT_WAITING_ENGINE_FAULT),
                                 [FT_EV_WITHDRAWN] = TO(FT_SCALING_DOWN),
                                 [FT_EV_FAILED] = TO(FT_RECONFIGURING),
                                 [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING)},
    [FT_SCALING_DOWN] = {[FT_EV_COMMITTED] = TO(FT_POST_SCALE_CLEANUP),
                         [FT_EV_FAILED] = TO(FT_RECONFIGURING),
                         [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING)},
    [FT_POST_SCALE_CLEANUP] = {[FT_EV_CLEANED_UP] = TO(FT_SCALED_DOWN_RUNNING),
                               [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING)},
    [FT_SCALED_DOWN_RUNNING] = {[FT_EV_SCALE_DOWN] = TO(FT_DECIDING),
                                [FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING)},
    [FT_RECONFIGURING] = {[FT_EV_RECONFIGURE] = TO(FT_RECONFIGURING),
                          [FT_EV_RESUME] = TO(FT_NORMAL),
                          [FT_EV_RESUME_SCALED] = TO(FT_SCALED_DOWN_RUNNING)},
};

const struct ctl_fsm ctl_ft_phase_fsm = {
    .name = "ft_runtime",
    .n_states = FT_PHASE_COUNT,
    .n_events = FT_EV_COUNT,
    .states = phase_names,
    .events = event_names,
    .table = &phase_table[0][0],
    .terminal = 0,
};

int ctl_ft_phase_from_str(const char *s, enum ctl_ft_phase *out)
{
    for (int i = 0; s && i < FT_PHASE_COUNT; i++) {
        if (strcmp(s, phase_names[i]) == 0) {
            *out = (enum ctl_ft_phase)i;
            return 0;
        }
    }
    return -EINVAL;
}

static const char *const gate_names[FT_GATE_COUNT] = {
    "FEATURE_DISABLED",
    "ENGINE_FT_REQUIRED",
    "EXTERNAL_LB_REQUIRED",
    "AUTO_RECOVERY_CONFLICT",
    "ENGINE_SCALE_DOWN_UNSUPPORTED",
    "EPLB_REQUIRED",
    "EXPERT_REDUNDANCY_REQUIRED",
    "FT_CAPABILITY_INCONSISTENT",
};

unsigned ctl_ft_gate(bool ft_enable, bool scale_down_enable, const struct wire_ft_capability *cap,
                     bool cap_consistent)
{
    unsigned r = 0;
    if (!ft_enable || !scale_down_enable)
        r |= FT_GATE_FEATURE_DISABLED;
    if (!cap->enabled)
        r |= FT_GATE_ENGINE_FT_REQUIRED;
    if (!cap->external_lb)
        r |= FT_GATE_EXTERNAL_LB_REQUIRED;
    if (cap->auto_recovery)
        r |= FT_GATE_AUTO_RECOVERY_CONFLICT;
    if (!cap->scale_down_supported)
        r |= FT_GATE_ENGINE_SCALE_DOWN_UNSUPPORTED;
    if (!cap->eplb_enabled)
        r |= FT_GATE_EPLB_REQUIRED;
    if (cap->num_redundant_experts <= 0)
        r |= FT_GATE_EXPERT_REDUNDANCY_REQUIRED;
    if (!cap_consistent)
        r |= FT_GATE_CAPABILITY_INCONSISTENT;
    return r;
}

json_t *ctl_ft_gate_reasons_json(unsigned reasons)
{
    json_t *a = json_array();
    for (int i = 0; i < FT_GATE_COUNT; i++)
        if (reasons & (1u << i))
            json_array_append_new(a, json_string(gate_names[i]));
    return a;
}

struct ctl_ft_rt *ctl_ft_rt_new(int64_t instance_id, const char *job_name)
{
    struct ctl_ft_rt *rt = xcalloc(1, sizeof(*rt));
    rt->instance_id = instance_id;
    rt->job_name = xstrdup(job_name ? job_name : "");
    rt->phase = FT_NORMAL;
    rt->engine_statuses = json_object();
    rt->history = json_array();
    rt->dirty = true;
    return rt;
}

void ctl_ft_rt_free(struct ctl_ft_rt *rt)
{
    if (!rt)
        return;
    free(rt->job_name);
    free(rt->original);
    free(rt->request_id);
    free(rt->committed);
    free(rt->pending);
    free(rt->fallback);
    json_decref(rt->engine_statuses);
    free(rt->last_error);
    free(rt->strategy);
    free(rt->strategy_phase);
    json_decref(rt->history);
    free(rt);
}

/* History entry {"ts", "scope": "runtime" | <strategy name>, "phase", "detail"?}. */
static void history_add(struct ctl_ft_rt *rt, const char *scope, const char *phase,
                        const char *detail)
{
    char ts[32];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    json_t *e = json_pack("{s:s, s:s, s:s}", "ts", ts, "scope", scope, "phase", phase);
    if (detail && *detail)
        json_object_set_new(e, "detail", json_string(detail));
    json_array_append_new(rt->history, e);
    while (json_array_size(rt->history) > FT_HISTORY_MAX)
        json_array_remove(rt->history, 0);
}

int ctl_ft_event(struct ctl_ft_rt *rt, enum ctl_ft_event ev, const char *detail)
{
    int phase = (int)rt->phase;
    int from = ctl_fsm_step(&ctl_ft_phase_fsm, &phase, (int)ev, rt->instance_id, detail);
    if (from < 0)
        return -ENOENT;
    if (phase == from)
        return 0;
    rt->phase = (enum ctl_ft_phase)phase;
    rt->dirty = true;
    history_add(rt, "runtime", ctl_ft_phase_name(rt->phase), detail);
    return 0;
}

enum ctl_ft_event ctl_ft_resume_event(const struct ctl_ft_rt *rt)
{
    return rt->n_committed ? FT_EV_RESUME_SCALED : FT_EV_RESUME;
}

void ctl_ft_set_strategy(struct ctl_ft_rt *rt, const char *strategy, const char *phase,
                         const char *detail)
{
    if (!rt->strategy || strcmp(rt->strategy, strategy) != 0) {
        free(rt->strategy);
        rt->strategy = xstrdup(strategy);
    }
    free(rt->strategy_phase);
    rt->strategy_phase = xstrdup(phase);
    history_add(rt, strategy, phase, detail);
}

void ctl_ft_set_error(struct ctl_ft_rt *rt, const char *err)
{
    free(rt->last_error);
    rt->last_error = xstrdup(err);
}

void ctl_ft_set_request_id(struct ctl_ft_rt *rt, const char *id)
{
    free(rt->request_id);
    rt->request_id = xstrdup(id);
}

void ctl_ft_set_fallback(struct ctl_ft_rt *rt, const char *name)
{
    free(rt->fallback);
    rt->fallback = xstrdup(name);
    rt->dirty = true;
}

int64_t *ctl_ft_alive(const struct ctl_ft_rt *rt, size_t *n)
{
    int64_t *v = xcalloc(rt->n_original + 1, sizeof(int64_t));
    *n = 0;
    for (size_t i = 0; i < rt->n_original; i++) {
        int64_t id = rt->original[i];
        if (ctl_ids_has(rt->committed, rt->n_committed, id) ||
            ctl_ids_has(rt->pending, rt->n_pending, id))
            continue;
        v[(*n)++] = id;
    }
    return v;
}

bool ctl_ft_can_serve(const struct ctl_ft_rt *rt)
{
    return (rt->phase == FT_NORMAL || rt->phase == FT_SCALED_DOWN_RUNNING) && rt->serving_published;
}

bool ctl_ft_in_transaction(const struct ctl_ft_rt *rt)
{
    switch (rt->phase) {
    case FT_DECIDING:
    case FT_WAITING_ENGINE_FAULT:
    case FT_SCALING_DOWN:
    case FT_POST_SCALE_CLEANUP:
    case FT_RECONFIGURING:
        return true;
    default:
        return false;
    }
}

json_t *ctl_ft_rt_json(const struct ctl_ft_rt *rt)
{
    size_t n_alive;
    int64_t *alive = ctl_ft_alive(rt, &n_alive);
    json_t *o = json_object();
    json_object_set_new(o, "instance_id", json_integer(rt->instance_id));
    json_object_set_new(o, "job_name", json_string(rt->job_name));
    json_object_set_new(o, "phase", json_string(ctl_ft_phase_name(rt->phase)));
    json_object_set_new(o, "original_dp_ranks", ctl_ids_json(rt->original, rt->n_original));
    json_object_set_new(o, "request_id",
                        rt->request_id ? json_string(rt->request_id) : json_null());
    json_object_set_new(o, "dead_committed", ctl_ids_json(rt->committed, rt->n_committed));
    json_object_set_new(o, "pending_removed_ranks", ctl_ids_json(rt->pending, rt->n_pending));
    json_object_set_new(o, "fallback_strategy",
                        rt->fallback ? json_string(rt->fallback) : json_null());
    json_object_set_new(o, "gate",
                        json_pack("{s:b, s:o}", "allowed", rt->gate == 0, "reason_codes",
                                  ctl_ft_gate_reasons_json(rt->gate)));
    json_object_set_new(o, "engine_statuses", json_deep_copy(rt->engine_statuses));
    json_object_set_new(o, "serving_published", json_boolean(rt->serving_published));
    json_object_set_new(o, "reconfiguration_dispatched",
                        json_boolean(rt->reconfiguration_dispatched));
    json_object_set_new(o, "last_error",
                        rt->last_error ? json_string(rt->last_error) : json_null());
    json_object_set_new(o, "alive_dp_ranks", ctl_ids_json(alive, n_alive));
    json_object_set_new(o, "can_serve", json_boolean(ctl_ft_can_serve(rt)));
    json_object_set_new(o, "strategy", rt->strategy ? json_string(rt->strategy) : json_null());
    json_object_set_new(o, "strategy_phase",
                        rt->strategy_phase ? json_string(rt->strategy_phase) : json_null());
    json_object_set_new(o, "history", json_deep_copy(rt->history));
    free(alive);
    return o;
}

json_t *ctl_ft_rt_store_json(const struct ctl_ft_rt *rt)
{
    json_t *o = json_object();
    json_object_set_new(o, "instance_id", json_integer(rt->instance_id));
    json_object_set_new(o, "job_name", json_string(rt->job_name));
    json_object_set_new(o, "phase", json_string(ctl_ft_phase_name(rt->phase)));
    json_object_set_new(o, "original_dp_ranks", ctl_ids_json(rt->original, rt->n_original));
    json_object_set_new(o, "dead_committed", ctl_ids_json(rt->committed, rt->n_committed));
    json_object_set_new(o, "fallback_strategy",
                        rt->fallback ? json_string(rt->fallback) : json_null());
    json_object_set_new(o, "reconfiguration_dispatched",
                        json_boolean(rt->reconfiguration_dispatched));
    return o;
}

struct ctl_ft_rt *ctl_ft_rt_from_store_json(int64_t instance_id, json_t *j)
{
    if (!json_is_object(j))
        return NULL;
    enum ctl_ft_phase phase;
    if (ctl_ft_phase_from_str(json_string_value(json_object_get(j, "phase")), &phase) < 0)
        return NULL;
    struct ctl_ft_rt *rt =
        ctl_ft_rt_new(instance_id, json_string_value(json_object_get(j, "job_name")));
    if (ctl_ids_parse(json_object_get(j, "original_dp_ranks"), &rt->original, &rt->n_original) <
            0 ||
        ctl_ids_parse(json_object_get(j, "dead_committed"), &rt->committed, &rt->n_committed) < 0) {
        ctl_ft_rt_free(rt);
        return NULL;
    }
    json_t *fb = json_object_get(j, "fallback_strategy");
    if (json_is_string(fb))
        rt->fallback = xstrdup(json_string_value(fb));
    rt->reconfiguration_dispatched = json_is_true(json_object_get(j, "reconfiguration_dispatched"));
    switch (phase) {
    case FT_DECIDING:
    case FT_WAITING_ENGINE_FAULT:
    case FT_SCALING_DOWN:
    case FT_POST_SCALE_CLEANUP:
        /* Interrupted: never replay an apply; the fallback takes over. */
        rt->phase = FT_RECONFIGURING;
        history_add(rt, "runtime", "RECONFIGURING", "interrupted by a controller restart");
        break;
    default:
        rt->phase = phase;
        if (phase == FT_NORMAL && rt->n_committed)
            rt->phase = FT_SCALED_DOWN_RUNNING;
        break;
    }
    rt->dirty = false;
    return rt;
}

char *ctl_ft_new_request_id(void)
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n <= 0) {
            /* getrandom cannot fail for 16 bytes once the pool is ready; mix time if it does. */
            int64_t t = util_mono_us();
            for (size_t i = got; i < sizeof(b); i++)
                b[i] = (unsigned char)(t >> ((i % 8) * 8)) ^ (unsigned char)i;
            break;
        }
        got += (size_t)n;
    }
    char hex[33];
    for (size_t i = 0; i < sizeof(b); i++)
        snprintf(hex + 2 * i, 3, "%02x", b[i]);
    return xasprintf("scale-down-%s", hex);
}
