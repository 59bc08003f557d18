/* wire_refresh: what the controller writes is what the coordinator reads (round trip
 * through the controller shape, excluded ranks, statuses, dispatch); the body wrapper;
 * ownership on failure (ASan/LSan). The parse rules themselves are table-tested through
 * the coordinator's adapter in test_coord_instances.c. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "wire/wire_refresh.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct wire_endpoint make_ep(int64_t id, const char *ip, const char *port,
                                    enum wire_ep_status st, bool headless)
{
    struct wire_endpoint e;
    memset(&e, 0, sizeof(e));
    e.id = id;
    e.ip = (char *)ip;
    e.business_port = (char *)port;
    e.status = st;
    e.headless = headless;
    return e;
}

static void test_round_trip(void **state)
{
    (void)state;
    struct wire_endpoint pod0[] = {make_ep(0, "10.0.0.1", "8000", WIRE_EP_NORMAL, false),
                                   make_ep(1, "10.0.0.1", "8001", WIRE_EP_NORMAL, false)};
    struct wire_endpoint pod1[] = {make_ep(2, "10.0.0.2", "8000", WIRE_EP_INITIAL, false),
                                   make_ep(3, "10.0.0.2", "8001", WIRE_EP_ABNORMAL, true)};
    struct wire_refresh_pod pods[] = {
        {.pod_ip = "10.0.0.1", .port = "1026", .device_num = 2, .eps = pod0, .n_eps = 2},
        {.pod_ip = "10.0.0.2", .port = "1026", .device_num = 2, .eps = pod1, .n_eps = 2},
    };
    struct wire_strlist caps = {0};
    wire_strlist_push(&caps, "prefill_handoff_decode");
    struct wire_parallel_config pc;
    wire_parallel_config_default(&pc);
    pc.dp_size = 4;
    struct wire_ft_capability ft = {.enabled = true};
    const int64_t exclude[] = {1};
    struct wire_refresh_out out = {
        .id = 7,
        .job_name = "job-d",
        .model_name = "m",
        .engine_type = "vllm",
        .role = WIRE_ROLE_DECODE,
        .status = WIRE_INS_ACTIVE,
        .dispatch_caps = &caps,
        .pc = &pc,
        .multi_endpoints = true,
        .ft_cap = &ft,
        .pods = pods,
        .n_pods = 2,
        .exclude = exclude,
        .n_exclude = 1,
    };
    json_t *arr = json_array();
    json_array_append_new(arr, wire_refresh_instance_to_json(&out));
    json_t *body = wire_refresh_body(WIRE_REFRESH_ADD, arr);
    assert_string_equal(json_string_value(json_object_get(body, "event")), "add");
    /* upstream's extra keys are written for upstream coordinators */
    json_t *ji = json_array_get(json_object_get(body, "instances"), 0);
    assert_non_null(json_object_get(ji, "parallel_config"));
    assert_non_null(json_object_get(ji, "node_managers"));
    assert_non_null(json_object_get(ji, "ft_capability"));

    struct wire_refresh r;
    char err[256] = "";
    assert_int_equal(wire_refresh_parse(body, &r, err, sizeof(err)), 0);
    assert_int_equal(r.ev, WIRE_REFRESH_ADD);
    assert_int_equal(r.n, 1);
    struct wire_refresh_inst *in = &r.v[0];
    assert_int_equal(in->id, 7);
    assert_int_equal(in->role, WIRE_ROLE_DECODE);
    assert_int_equal(in->status, WIRE_INS_ACTIVE);
    assert_int_equal(in->dispatch, WIRE_DISPATCH_HANDOFF);
    assert_string_equal(in->job_name, "job-d");
    assert_string_equal(in->model_name, "m");
    assert_string_equal(in->engine_type, "vllm");
    assert_int_equal(in->n_eps, 3); /* rank 1 excluded */
    bool seen[4] = {false};
    for (size_t i = 0; i < in->n_eps; i++) {
        const struct wire_refresh_ep *e = &in->eps[i];
        assert_true(e->id >= 0 && e->id < 4);
        seen[e->id] = true;
        assert_string_equal(e->ip, e->id < 2 ? "10.0.0.1" : "10.0.0.2");
        assert_int_equal(e->port, e->id % 2 ? 8001 : 8000);
        if (e->id == 3) {
            assert_true(e->headless);
            assert_int_equal(e->status, WIRE_EP_ABNORMAL);
        }
    }
    assert_true(seen[0] && !seen[1] && seen[2] && seen[3]);
    wire_refresh_release(&r);
    wire_refresh_release(&r); /* released twice: harmless */
    json_decref(body);
    wire_strlist_release(&caps);
}

static void test_defaults_and_external_shape(void **state)
{
    (void)state;
    json_error_t je;
    json_t *body = json_loads(
        "{\"event\":\"Set\",\"model_name\":\"top\",\"dispatch_capabilities\":"
        "[\"x\",\"concurrent_engine_sync\"],\"instances\":[{\"id\":1,\"role\":\"both\","
        "\"endpoints\":[{\"id\":0,\"address\":\"[::1]:9000\",\"bootstrap_port\":\"8998\"}]}]}",
        0, &je);
    assert_non_null(body);
    struct wire_refresh r;
    char err[256] = "";
    assert_int_equal(wire_refresh_parse(body, &r, err, sizeof(err)), 0);
    assert_int_equal(r.ev, WIRE_REFRESH_SET);
    assert_int_equal(r.v[0].role, WIRE_ROLE_UNION);
    assert_int_equal(r.v[0].status, WIRE_INS_ACTIVE); /* no status: wanted served */
    assert_int_equal(r.v[0].dispatch, WIRE_DISPATCH_TRIGGER);
    assert_string_equal(r.v[0].model_name, "top");
    assert_string_equal(r.v[0].engine_type, "vllm");
    assert_string_equal(r.v[0].job_name, "");
    assert_string_equal(r.v[0].eps[0].ip, "::1");
    assert_int_equal(r.v[0].eps[0].port, 9000);
    assert_int_equal(r.v[0].eps[0].bootstrap_port, 8998);
    wire_refresh_release(&r);
    json_decref(body);
}

/* A failure after some instances and endpoints were built frees them all (LSan). */
static void test_failure_releases(void **state)
{
    (void)state;
    json_error_t je;
    json_t *body = json_loads(
        "{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"job_name\":\"a\","
        "\"endpoints\":{\"10.0.0.1\":{\"0\":{\"id\":0,\"business_port\":8000}}}},"
        "{\"id\":2,\"role\":\"decode\",\"job_name\":\"b\",\"endpoints\":{\"10.0.0.2\":"
        "{\"0\":{\"id\":0,\"business_port\":8000},\"1\":{\"id\":1,\"business_port\":8000}}}}]}",
        0, &je);
    assert_non_null(body);
    struct wire_refresh r;
    char err[256] = "";
    assert_int_equal(wire_refresh_parse(body, &r, err, sizeof(err)), -EINVAL);
    assert_non_null(strstr(err, "instances[1]"));
    assert_non_null(strstr(err, "10.0.0.2:8000 listed twice"));
    assert_int_equal(r.n, 0);
    assert_null(r.v);
    json_decref(body);
    assert_string_equal(wire_refresh_event_str(WIRE_REFRESH_DEL), "del");
    assert_string_equal(wire_refresh_event_str((enum wire_refresh_event)9), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_defaults_and_external_shape),
        cmocka_unit_test(test_failure_releases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
