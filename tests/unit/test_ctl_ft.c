/* Controller FT runtime (§8.1, §8.4): the gate's reason codes, the runtime object
 * (alive ranks, can_serve, history), persistence and the restore rules. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "controller/ctl_ft.h"
#include "controller/ctl_inst.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

static bool has_reason(unsigned r, const char *name)
{
    json_t *a = ctl_ft_gate_reasons_json(r);
    bool found = false;
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) found = found || strcmp(json_string_value(v), name) == 0;
    json_decref(a);
    return found;
}

static void test_gate(void **state)
{
    (void)state;
    struct wire_ft_capability ok = {.enabled = true,
                                    .scale_down_supported = true,
                                    .external_lb = true,
                                    .eplb_enabled = true,
                                    .num_redundant_experts = 2};
    assert_int_equal(ctl_ft_gate(true, true, &ok, true), 0);
    assert_true(has_reason(ctl_ft_gate(true, false, &ok, true), "FEATURE_DISABLED"));
    assert_true(has_reason(ctl_ft_gate(false, true, &ok, true), "FEATURE_DISABLED"));
    assert_true(has_reason(ctl_ft_gate(true, true, &ok, false), "FT_CAPABILITY_INCONSISTENT"));
    struct wire_ft_capability c = ok;
    c.enabled = false;
    assert_true(has_reason(ctl_ft_gate(true, true, &c, true), "ENGINE_FT_REQUIRED"));
    c = ok;
    c.external_lb = false;
    assert_true(has_reason(ctl_ft_gate(true, true, &c, true), "EXTERNAL_LB_REQUIRED"));
    c = ok;
    c.auto_recovery = true;
    assert_true(has_reason(ctl_ft_gate(true, true, &c, true), "AUTO_RECOVERY_CONFLICT"));
    c = ok;
    c.scale_down_supported = false;
    assert_true(has_reason(ctl_ft_gate(true, true, &c, true), "ENGINE_SCALE_DOWN_UNSUPPORTED"));
    c = ok;
    c.eplb_enabled = false;
    assert_true(has_reason(ctl_ft_gate(true, true, &c, true), "EPLB_REQUIRED"));
    c = ok;
    c.num_redundant_experts = 0;
    unsigned r = ctl_ft_gate(true, true, &c, true);
    assert_true(has_reason(r, "EXPERT_REDUNDANCY_REQUIRED"));
    assert_false(has_reason(r, "EPLB_REQUIRED"));
    /* Everything wrong at once: every code is listed. */
    struct wire_ft_capability none = {.auto_recovery = true};
    json_t *all = ctl_ft_gate_reasons_json(ctl_ft_gate(false, false, &none, false));
    assert_int_equal(json_array_size(all), 8);
    json_decref(all);
}

static void test_runtime_json(void **state)
{
    (void)state;
    struct ctl_ft_rt *rt = ctl_ft_rt_new(12, "job-x");
    for (int i = 0; i < 4; i++)
        ctl_ids_add(&rt->original, &rt->n_original, i);
    ctl_ids_add(&rt->committed, &rt->n_committed, 1);
    ctl_ids_add(&rt->pending, &rt->n_pending, 3);
    assert_int_equal(ctl_ft_event(rt, FT_EV_SCALE_DOWN, "test"), 0);
    assert_int_equal(ctl_ft_event(rt, FT_EV_WITHDRAWN, "test"), 0);
    ctl_ft_set_strategy(rt, "DpScaleDownStrategy", "APPLY", NULL);
    assert_true(ctl_ft_in_transaction(rt));
    json_t *j = ctl_ft_rt_json(rt);
    assert_int_equal(json_integer_value(json_object_get(j, "instance_id")), 12);
    assert_string_equal(json_string_value(json_object_get(j, "phase")), "SCALING_DOWN");
    json_t *alive = json_object_get(j, "alive_dp_ranks");
    assert_int_equal(json_array_size(alive), 2);
    assert_int_equal(json_integer_value(json_array_get(alive, 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(alive, 1)), 2);
    assert_false(json_is_true(json_object_get(j, "can_serve")));
    assert_true(json_is_true(json_object_get(json_object_get(j, "gate"), "allowed")));
    assert_string_equal(json_string_value(json_object_get(j, "strategy_phase")), "APPLY");
    json_t *h = json_object_get(j, "history");
    assert_int_equal(json_array_size(h), 3);
    assert_string_equal(json_string_value(json_object_get(json_array_get(h, 0), "phase")),
                        "DECIDING");
    assert_string_equal(json_string_value(json_object_get(json_array_get(h, 1), "phase")),
                        "SCALING_DOWN");
    assert_string_equal(json_string_value(json_object_get(json_array_get(h, 2), "scope")),
                        "DpScaleDownStrategy");
    json_decref(j);
    /* can_serve: SCALED_DOWN_RUNNING and published. */
    assert_int_equal(ctl_ft_event(rt, FT_EV_COMMITTED, NULL), 0);
    assert_int_equal(ctl_ft_event(rt, FT_EV_CLEANED_UP, NULL), 0);
    assert_int_equal(rt->phase, FT_SCALED_DOWN_RUNNING);
    assert_false(ctl_ft_can_serve(rt));
    rt->serving_published = true;
    assert_true(ctl_ft_can_serve(rt));
    assert_false(ctl_ft_in_transaction(rt));
    /* The history is bounded. */
    for (int i = 0; i < 100; i++)
        ctl_ft_set_strategy(rt, "X", "P", NULL);
    j = ctl_ft_rt_json(rt);
    assert_int_equal(json_array_size(json_object_get(j, "history")), FT_HISTORY_MAX);
    json_decref(j);
    ctl_ft_rt_free(rt);
}

static struct ctl_ft_rt *restore(const char *phase, const char *committed)
{
    char *t = xasprintf("{\"job_name\":\"j\",\"phase\":\"%s\",\"original_dp_ranks\":[0,1,2,3],"
                        "\"dead_committed\":%s,\"fallback_strategy\":\"EngineRelaunchStrategy\","
                        "\"reconfiguration_dispatched\":false}",
                        phase, committed);
    json_t *j = json_loads(t, 0, NULL);
    struct ctl_ft_rt *rt = ctl_ft_rt_from_store_json(5, j);
    json_decref(j);
    free(t);
    return rt;
}

static void test_persist_restore(void **state)
{
    (void)state;
    struct ctl_ft_rt *rt = ctl_ft_rt_new(5, "j");
    ctl_ids_add(&rt->original, &rt->n_original, 0);
    ctl_ids_add(&rt->original, &rt->n_original, 1);
    ctl_ids_add(&rt->committed, &rt->n_committed, 1);
    rt->phase = FT_SCALED_DOWN_RUNNING; /* as a restore would leave it */
    rt->reconfiguration_dispatched = true;
    json_t *j = ctl_ft_rt_store_json(rt);
    /* Only the persisted subset. */
    assert_null(json_object_get(j, "history"));
    assert_null(json_object_get(j, "request_id"));
    struct ctl_ft_rt *back = ctl_ft_rt_from_store_json(5, j);
    assert_non_null(back);
    assert_int_equal(back->phase, FT_SCALED_DOWN_RUNNING);
    assert_int_equal(back->n_committed, 1);
    assert_true(back->reconfiguration_dispatched);
    assert_false(back->dirty);
    ctl_ft_rt_free(back);
    json_decref(j);
    ctl_ft_rt_free(rt);

    /* Interrupted transactions come back RECONFIGURING with their fallback. */
    const char *interrupted[] = {"DECIDING", "WAITING_ENGINE_FAULT", "SCALING_DOWN",
                                 "POST_SCALE_CLEANUP"};
    for (size_t i = 0; i < ARRAY_LEN(interrupted); i++) {
        struct ctl_ft_rt *x = restore(interrupted[i], "[]");
        assert_non_null(x);
        assert_int_equal(x->phase, FT_RECONFIGURING);
        assert_string_equal(x->fallback, "EngineRelaunchStrategy");
        ctl_ft_rt_free(x);
    }
    /* Committed ranks restore as SCALED_DOWN_RUNNING. */
    struct ctl_ft_rt *x = restore("NORMAL", "[2]");
    assert_int_equal(x->phase, FT_SCALED_DOWN_RUNNING);
    ctl_ft_rt_free(x);
    x = restore("NORMAL", "[]");
    assert_int_equal(x->phase, FT_NORMAL);
    ctl_ft_rt_free(x);
    assert_null(restore("BOGUS", "[]"));
    assert_null(restore("NORMAL", "[-1]"));
}

static void test_request_id(void **state)
{
    (void)state;
    char *a = ctl_ft_new_request_id();
    char *b = ctl_ft_new_request_id();
    assert_int_equal(strlen(a), strlen("scale-down-") + 32);
    assert_int_equal(strncmp(a, "scale-down-", 11), 0);
    for (const char *p = a + 11; *p; p++)
        assert_non_null(strchr("0123456789abcdef", *p));
    assert_string_not_equal(a, b);
    free(a);
    free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate),
        cmocka_unit_test(test_runtime_json),
        cmocka_unit_test(test_persist_restore),
        cmocka_unit_test(test_request_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
