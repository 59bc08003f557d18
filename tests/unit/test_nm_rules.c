/* node manager pure rules: runtime -> status mapping (§2.9), the probe state function
 * (§6.5), the local-restart backoff, and the persisted launch parameters. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "nodemgr/nm_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct map_case {
    enum nm_runtime rt;
    enum wire_ep_status prev, want;
};

static void test_status_mapping(void **state)
{
    (void)state;
    static const struct map_case cases[] = {
        {NM_RT_RUNNING, WIRE_EP_INITIAL, WIRE_EP_WAIT2START},
        {NM_RT_READY, WIRE_EP_INITIAL, WIRE_EP_NORMAL},
        {NM_RT_READY, WIRE_EP_ABNORMAL, WIRE_EP_NORMAL},
        {NM_RT_UNHEALTHY, WIRE_EP_NORMAL, WIRE_EP_ABNORMAL},
        {NM_RT_STOPPED, WIRE_EP_NORMAL, WIRE_EP_ABNORMAL},
        {NM_RT_STARTING, WIRE_EP_INITIAL, WIRE_EP_INITIAL},
        {NM_RT_STARTING, WIRE_EP_ABNORMAL, WIRE_EP_ABNORMAL},
        {NM_RT_STOPPING, WIRE_EP_NORMAL, WIRE_EP_NORMAL},
        /* paused survives every probe result (PreStop) */
        {NM_RT_READY, WIRE_EP_PAUSED, WIRE_EP_PAUSED},
        {NM_RT_STOPPED, WIRE_EP_PAUSED, WIRE_EP_PAUSED},
        {NM_RT_UNHEALTHY, WIRE_EP_PAUSED, WIRE_EP_PAUSED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        enum wire_ep_status got = nm_status_from_runtime(cases[i].rt, cases[i].prev);
        if (got != cases[i].want)
            fail_msg("case %zu: %s/%s -> %s, want %s", i, nm_runtime_str(cases[i].rt),
                     wire_ep_status_str(cases[i].prev), wire_ep_status_str(got),
                     wire_ep_status_str(cases[i].want));
    }
}

static void test_probe_state_function(void **state)
{
    (void)state;
    const int64_t win = 1800000;
    assert_int_equal(nm_runtime_after_probe(NM_RT_STARTING, NM_PROBE_OK, 10, win), NM_RT_READY);
    assert_int_equal(nm_runtime_after_probe(NM_RT_STARTING, NM_PROBE_FAILED, 10, win),
                     NM_RT_STARTING);
    assert_int_equal(nm_runtime_after_probe(NM_RT_STARTING, NM_PROBE_FAILED, win, win),
                     NM_RT_UNHEALTHY);
    assert_int_equal(nm_runtime_after_probe(NM_RT_READY, NM_PROBE_FAILED, 10, win),
                     NM_RT_UNHEALTHY);
    assert_int_equal(nm_runtime_after_probe(NM_RT_UNHEALTHY, NM_PROBE_OK, 10, win), NM_RT_READY);
    assert_int_equal(nm_runtime_after_probe(NM_RT_UNHEALTHY, NM_PROBE_FAILED, 10, win),
                     NM_RT_UNHEALTHY);
    assert_string_equal(nm_runtime_str(NM_RT_STOPPING), "stopping");
}

static void test_backoff(void **state)
{
    (void)state;
    int64_t d = 0;
    const int64_t want[] = {1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        d = nm_backoff_next(d, 1000, 60000);
        assert_int_equal(d, want[i]);
    }
    assert_int_equal(nm_backoff_next(0, 300, 100), 300); /* max below initial */
    assert_int_equal(nm_backoff_next(0, 0, 10), 1);
}

static const char *start_json =
    "{\"job_name\":\"j\",\"role\":\"prefill\",\"instance_id\":3,\"master_dp_ip\":\"10.0.0.5\","
    "\"node_rank\":1,\"d2d_peer_ips\":[\"0:10.0.0.6\"],"
    "\"endpoints\":[{\"id\":4,\"ip\":\"10.0.0.5\",\"business_port\":\"10000\","
    "\"status\":\"normal\",\"device_infos\":[],\"headless\":true}]}";

static void test_launch_state_roundtrip(void **state)
{
    (void)state;
    json_t *j = json_loads(start_json, 0, NULL);
    assert_non_null(j);
    struct wire_start_cmd cmd;
    struct wire_err err = {{0}};
    assert_int_equal(wire_start_cmd_parse(j, 0, &cmd, &err), 0);
    json_decref(j);
    json_t *st = nm_launch_state_to_json(&cmd, 2);
    char *text = json_dumps(st, 0);
    json_decref(st);
    json_t *back = json_loads(text, 0, NULL);
    free(text);
    struct wire_start_cmd got;
    assert_int_equal(nm_launch_state_parse(back, &got, &err), 0);
    json_decref(back);
    assert_string_equal(got.job_name, "j");
    assert_int_equal(got.role, WIRE_ROLE_PREFILL);
    assert_int_equal(got.instance_id, 3);
    assert_int_equal(got.node_rank, 1);
    assert_string_equal(got.master_dp_ip, "10.0.0.5");
    assert_int_equal(got.n_endpoints, 1);
    assert_int_equal(got.endpoints[0].id, 4);
    assert_true(got.endpoints[0].headless);
    assert_int_equal(got.d2d_peer_ips.n, 1);
    wire_start_cmd_release(&got);
    wire_start_cmd_release(&cmd);
}

static void test_launch_state_rejects_garbage(void **state)
{
    (void)state;
    static const char *bad[] = {"[]", "{}", "{\"version\":2,\"start\":{}}", "{\"version\":1}",
                                "{\"version\":1,\"start\":{\"job_name\":1}}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        struct wire_start_cmd got;
        struct wire_err err = {{0}};
        assert_int_equal(nm_launch_state_parse(j, &got, &err), -EINVAL);
        assert_true(err.msg[0] != '\0');
        json_decref(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_mapping),
        cmocka_unit_test(test_probe_state_function),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_launch_state_roundtrip),
        cmocka_unit_test(test_launch_state_rejects_garbage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
