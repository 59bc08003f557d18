/* The pure parts of `motor up` and `motor status`: the plan (pods, indexes, ports,
 * collisions, port base) and the status model (documents -> model, health verdict,
 * metrics sums, tables). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cli/status.h"
#include "cli/up_plan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- plan ------------------------------------------------------------------------- */

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("bad test JSON: %s (line %d)", je.text, je.line);
    return j;
}

#define ENGINE(role)                                                                               \
    "\"motor_engine_" role "_config\": {\"engine_type\": \"sim\", \"engine_config\": "             \
    "{\"model\": \"m\", \"data_parallel_size\": 2, \"kv_transfer_config\": "                       \
    "{\"kv_connector\": \"NixlConnector\"}}}"

static const char *const PD =
    "{\"motor_deploy_config\": {\"p_instances_num\": 2, \"d_instances_num\": 1},"
    " \"motor_controller_config\": {\"api_config\": {\"controller_api_port\": 2026,"
    "   \"controller_api_dns\": \"controller.svc\"}},"
    " \"motor_coordinator_config\": {\"api_config\": {\"coordinator_api_infer_port\": 1025,"
    "   \"coordinator_api_mgmt_port\": 1026}},"
    " \"motor_nodemanger_config\": {\"api_config\": {\"node_manager_port\": 3026},"
    "   \"endpoint_config\": {\"base_port\": 10000}}," ENGINE("prefill") "," ENGINE("decode") "}";

static const struct up_plan_opts OPTS = {.state_dir = "/state", .motor_bin = "/bin/motor"};

static void test_plan_pd(void **state)
{
    (void)state;
    json_t *cfg = parse(PD);
    struct up_plan p;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    int rc = up_plan_build(cfg, &OPTS, &p, &e);
    if (rc)
        fail_msg("%s", cfg_errors_text(&e));
    assert_int_equal(p.n_pods, 3);
    assert_int_equal(p.n_instances, 3);
    /* Prefill g = INDEX = 0, 1; decode g = p_instances_num + INDEX = 2 with INDEX 0. */
    assert_string_equal(p.pods[0].name, "prefill-0");
    assert_string_equal(p.pods[1].name, "prefill-1");
    assert_string_equal(p.pods[2].name, "decode-0");
    assert_int_equal(p.pods[1].index, 1);
    assert_int_equal(p.pods[2].index, 0);
    assert_int_equal(p.pods[2].g, 2);
    assert_int_equal(p.pods[0].nm_port, 3026);
    assert_int_equal(p.pods[1].nm_port, 3027);
    assert_int_equal(p.pods[2].nm_port, 3028);
    /* base_port + g * 2 * dp, then 2 per rank. */
    assert_int_equal(p.pods[1].ports[0], 10004);
    assert_int_equal(p.pods[1].ports[1], 10006);
    assert_int_equal(p.pods[2].ports[0], 10008);
    assert_string_equal(p.pods[0].job_name, "motor-prefill-0");
    assert_string_equal(p.pods[2].job_name, "motor-decode-0");
    assert_int_equal(p.coord_port, 1025);
    assert_int_equal(p.ctl_port, 2026);
    /* Localized: single container, loopback, SQLite in the state directory. */
    assert_string_equal(json_string_value(cfg_lookup(p.config, "motor_deploy_config.deploy_mode")),
                        "single_container");
    assert_string_equal(json_string_value(cfg_lookup(
                            p.config, "motor_controller_config.api_config.controller_api_dns")),
                        "127.0.0.1");
    assert_string_equal(p.sqlite_path, "/state/controller.db");
    assert_true(p.notes.n >= 2); /* deploy_mode and controller_api_dns changed */
    /* The user's document is untouched. */
    assert_null(cfg_lookup(cfg, "motor_deploy_config.deploy_mode"));
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);
}

static void test_plan_port_base(void **state)
{
    (void)state;
    json_t *cfg = parse(PD);
    struct up_plan p;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    struct up_plan_opts o = OPTS;
    o.port_base = 40000;
    assert_int_equal(up_plan_build(cfg, &o, &p, &e), 0);
    assert_int_equal(p.coord_port, 40000);
    assert_int_equal(p.coord_mgmt_port, 40001);
    assert_int_equal(p.ctl_port, 40003);
    int *ports;
    char **owners;
    size_t n = up_plan_ports(&p, &ports, &owners);
    assert_int_equal(n, 3 + 3 + 3 * 2 + 3); /* control plane, NMs, engines, DP RPC */
    for (size_t i = 0; i < n; i++) {
        assert_true(ports[i] >= 40000 && ports[i] < 40064);
        for (size_t k = 0; k < i; k++)
            if (ports[k] == ports[i])
                fail_msg("port %d twice: %s, %s", ports[i], owners[k], owners[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(owners[i]);
    free(owners);
    free(ports);
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);
}

static void test_plan_errors(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        const char *expect;
    } cases[] = {
        {"{}", "nothing to start"},
        {"{\"motor_deploy_config\": {\"d_instances_num\": 0, \"p_instances_num\": 0}," ENGINE(
             "prefill") "}",
         "nothing to start"},
        /* Upstream defaults: controller, coordinator management and NM all on 1026. */
        {"{\"motor_deploy_config\": {\"d_instances_num\": 0}," ENGINE("prefill") "}",
         "1026 is used by both"},
        {"{\"motor_deploy_config\": {\"p_instances_num\": \"two\"}," ENGINE("prefill") "}",
         "p_instances_num"},
        {"{\"motor_engine_union_config\": 5}", "must be an object"},
        {"{\"motor_deploy_config\": {\"tls_config\": {\"mgmt_tls_config\": {\"enable_tls\": "
         "true}}}," ENGINE("union") "}",
         "TLS is not supported"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *cfg = parse(cases[i].json);
        struct up_plan p;
        struct cfg_errors e;
        cfg_errors_init(&e, "");
        assert_int_equal(up_plan_build(cfg, &OPTS, &p, &e), -EINVAL);
        if (!strstr(cfg_errors_text(&e), cases[i].expect))
            fail_msg("case %zu: expected '%s' in:\n%s", i, cases[i].expect, cfg_errors_text(&e));
        up_plan_release(&p);
        cfg_errors_release(&e);
        json_decref(cfg);
    }
}

/* ---- status ------------------------------------------------------------------------ */

static void test_metric_sum(void **state)
{
    (void)state;
    const char *text = "# HELP motor_coordinator_requests_total x\n"
                       "# TYPE motor_coordinator_requests_total counter\n"
                       "motor_coordinator_requests_total{api=\"chat\",code=\"200\"} 7\n"
                       "motor_coordinator_requests_total{api=\"a b}\",code=\"503\"} 2.5\n"
                       "motor_coordinator_requests_total_other 100\n"
                       "motor_coordinator_inflight_requests 3\n";
    assert_true(status_metric_sum(text, "motor_coordinator_requests_total") == 9.5);
    assert_true(status_metric_sum(text, "motor_coordinator_inflight_requests") == 3);
    assert_true(status_metric_sum(text, "absent") == -1);
    assert_true(status_metric_sum(NULL, "x") == -1);
}

static const char *const CTL_DOC =
    "{\"count\": 2, \"instances\": ["
    " {\"id\": 2, \"role\": \"decode\", \"job_name\": \"j-d\", \"model_name\": \"m\","
    "  \"status\": \"inactive\", \"ft_phase\": \"NORMAL\", \"strategy\": "
    "\"EngineRelaunchStrategy\","
    "  \"node_managers\": [{\"pod_ip\": \"10.0.0.2\", \"endpoints\": ["
    "    {\"id\": 1, \"ip\": \"10.0.0.2\", \"business_port\": \"10006\", \"status\": \"abnormal\","
    "     \"heartbeat_age_s\": 0.42},"
    "    {\"id\": 0, \"ip\": \"10.0.0.2\", \"business_port\": \"10004\", \"status\": \"normal\","
    "     \"heartbeat_age_s\": 0.4}]}]},"
    " {\"id\": 1, \"role\": \"prefill\", \"job_name\": \"j-p\", \"model_name\": \"m\","
    "  \"status\": \"active\", \"ft_phase\": null,"
    "  \"endpoints\": {\"10.0.0.1\": {\"0\": {\"id\": 0, \"ip\": \"10.0.0.1\","
    "   \"business_port\": 10000, \"status\": \"normal\", \"hb_timestamp\": 995.0}}}}],"
    " \"assembling\": []}";

static const char *const COORD_DOC =
    "{\"count\": 1, \"instances\": [{\"id\": 1, \"role\": \"prefill\", \"job_name\": \"j-p\","
    " \"status\": \"active\", \"pool\": \"available\", \"healthy\": true,"
    " \"circuit_breaker\": {\"state\": \"closed\", \"trip_count\": 0},"
    " \"endpoints\": [{\"id\": 0, \"ip\": \"10.0.0.1\", \"business_port\": \"10000\","
    "   \"status\": \"normal\", \"inflight_requests\": 2}]}]}";

static void test_model(void **state)
{
    (void)state;
    struct status_docs d = {0};
    d.ctl_instances = parse(CTL_DOC);
    d.coord_instances = parse(COORD_DOC);
    d.coord_metrics = strdup("motor_coordinator_requests_total{api=\"chat\"} 5\n");
    struct status_targets t = {.controller = "http://c", .coordinator = "http://o"};
    json_t *m = status_model(&t, &d, 1000.0);
    assert_false(status_model_healthy(m));
    json_t *insts = json_object_get(m, "instances");
    assert_int_equal(json_array_size(insts), 2);
    json_t *i0 = json_array_get(insts, 0), *i1 = json_array_get(insts, 1);
    assert_int_equal(json_integer_value(json_object_get(i0, "id")), 1); /* sorted by id */
    json_t *ep = json_array_get(json_object_get(i0, "endpoints"), 0);
    assert_string_equal(json_string_value(json_object_get(ep, "address")), "10.0.0.1:10000");
    assert_true(json_real_value(json_object_get(ep, "hb_age_s")) == 5.0);
    json_t *eps1 = json_object_get(i1, "endpoints");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(eps1, 0), "id")), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(eps1, 1), "address")),
                        "10.0.0.2:10006");
    assert_string_equal(json_string_value(json_object_get(i1, "strategy")),
                        "EngineRelaunchStrategy");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(m, "coordinator"), "requests_total")),
        5);
    /* Problems: decode inactive, its endpoint 1 abnormal. The coordinator not knowing an
     * inactive instance is expected, not a problem. */
    json_t *probs = json_object_get(m, "problems");
    assert_int_equal(json_array_size(probs), 2);
    assert_non_null(strstr(json_string_value(json_array_get(probs, 0)), "is inactive"));
    assert_non_null(
        strstr(json_string_value(json_array_get(probs, 1)), "10.0.0.2:10006 is abnormal"));

    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    status_render(&sb, m);
    const char *out = strbuf_str(&sb);
    assert_non_null(strstr(out, "INSTANCES (controller)"));
    assert_non_null(strstr(out, "NORMAL (EngineRelaunchStrategy)"));
    assert_non_null(strstr(out, "10.0.0.1:10000 (2)"));
    assert_non_null(strstr(out, "UNHEALTHY: 2 problem(s)"));
    strbuf_release(&sb);
    json_decref(m);

    /* Everything fine: healthy. */
    json_decref(d.ctl_instances);
    d.ctl_instances = parse("{\"instances\": [{\"id\": 1, \"role\": \"prefill\", \"status\":"
                            " \"active\", \"endpoints\": []}]}");
    m = status_model(&t, &d, 1000.0);
    assert_true(status_model_healthy(m));
    json_decref(m);

    /* Unreachable sides. */
    struct status_docs bad = {.ctl_error = strdup("Connection refused"),
                              .coord_error = strdup("HTTP 500: x")};
    m = status_model(&t, &bad, 1000.0);
    assert_false(status_model_healthy(m));
    assert_int_equal(json_array_size(json_object_get(m, "problems")), 2);
    json_decref(m);
    status_docs_release(&bad);
    status_docs_release(&d);
}

static void test_table(void **state)
{
    (void)state;
    struct status_table t;
    status_table_init(&t, 2);
    status_table_cell(&t, "A");
    status_table_cell(&t, "B");
    status_table_cell(&t, "long %d", 1);
    status_table_cell(&t, "x");
    struct strbuf sb;
    strbuf_init(&sb, 4096);
    status_table_render(&t, &sb, "> ");
    assert_string_equal(strbuf_str(&sb), "> A       B\n> long 1  x\n");
    strbuf_release(&sb);
    status_table_release(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_pd),     cmocka_unit_test(test_plan_port_base),
        cmocka_unit_test(test_plan_errors), cmocka_unit_test(test_metric_sum),
        cmocka_unit_test(test_model),       cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
