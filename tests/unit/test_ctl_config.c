/* motor_controller_config: defaults (upstream's 10 s / 300 s heartbeat timeouts),
 * upstream keys, the coordinator address, store section and upstream etcd_config,
 * every error reported in one pass. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "controller/ctl_config.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static json_t *J(const char *t)
{
    json_error_t e;
    json_t *j = json_loads(t, 0, &e);
    if (!j)
        fail_msg("bad json %s: %s", t, e.text);
    return j;
}

static void test_defaults(void **state)
{
    (void)state;
    unsetenv("POD_IP");
    unsetenv("COORDINATOR_SERVICE");
    struct ctlcfg c;
    ctlcfg_init(&c);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 1026);
    assert_int_equal(c.hb_timeout_active_ms, 10000);
    assert_int_equal(c.hb_timeout_other_ms, 300000);
    assert_int_equal(c.assemble_timeout_ms, 600000);
    assert_int_equal(c.send_cmd_retry_times, 3);
    assert_true(c.ft_enable);
    assert_true(c.relaunch_enable);
    assert_false(c.scale_down_enable);
    assert_int_equal(c.relaunch_timeout_ms, 600000);
    assert_int_equal(c.relaunch_poll_ms, 5000);
    assert_int_equal(c.relaunch_retries, 3);
    assert_int_equal(c.relaunch_unreachable, 3);
    assert_int_equal(c.sd_request_timeout_ms, 11000);
    assert_int_equal(c.store, CTLCFG_STORE_SQLITE);
    assert_string_equal(c.coordinator_host, "127.0.0.1");
    assert_int_equal(c.coordinator_port, 1026);
    /* Guard lease: 2*30 + 4*11 + max(5, 1) = 109 s (§8.2). */
    assert_true(ctlcfg_guard_lease_s(&c) > 108.99 && ctlcfg_guard_lease_s(&c) < 109.01);
    ctlcfg_release(&c);
}

static void test_keys(void **state)
{
    (void)state;
    struct ctlcfg c;
    ctlcfg_init(&c);
    json_t *root =
        J("{\"motor_controller_config\":{"
          "\"api_config\":{\"controller_api_host\":\"0.0.0.0\",\"controller_api_port\":2026},"
          "\"instance_config\":{\"instance_heartbeat_timeout\":2.5,"
          "\"instance_heartbeat_timeout_inactive\":7,\"instance_assembler_check_interval\":0.1,"
          "\"send_cmd_retry_times\":5},"
          "\"event_config\":{\"coordinator_set_sync_interval\":0},"
          "\"fault_tolerance_config\":{\"enable_engine_relaunch\":false,"
          "\"engine_relaunch_poll_interval_sec\":0.2,\"enable_dp_scale_down\":true,"
          "\"dp_scale_down_config\":{\"request_timeout_sec\":2,\"poll_interval_sec\":0.1,"
          "\"execution_deadline_sec\":5}},"
          "\"store_config\":{\"backend\":\"etcd\",\"etcd_endpoints\":[\"http://127.0.0.1:1\","
          "\"http://127.0.0.1:2\"],\"etcd_prefix\":\"/t/\",\"etcd_lease_ttl\":2}},"
          "\"motor_coordinator_config\":{\"api_config\":{\"coordinator_api_dns\":\"coord\","
          "\"coordinator_api_mgmt_port\":3026}}}");
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    ctlcfg_apply(&c, root, &e);
    if (cfg_errors_count(&e))
        fail_msg("%s", cfg_errors_text(&e));
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 2026);
    assert_int_equal(c.hb_timeout_active_ms, 2500);
    assert_int_equal(c.hb_timeout_other_ms, 7000);
    assert_int_equal(c.assembler_check_ms, 100);
    assert_int_equal(c.send_cmd_retry_times, 5);
    assert_int_equal(c.coordinator_sync_ms, 0);
    assert_false(c.relaunch_enable);
    assert_int_equal(c.relaunch_poll_ms, 200);
    assert_true(c.scale_down_enable);
    assert_int_equal(c.sd_poll_ms, 100);
    assert_int_equal(c.sd_deadline_ms, 5000);
    assert_int_equal(c.store, CTLCFG_STORE_ETCD);
    assert_int_equal(c.n_etcd_endpoints, 2);
    assert_string_equal(c.etcd_endpoints[1], "http://127.0.0.1:2");
    assert_string_equal(c.etcd_prefix, "/t/");
    assert_int_equal(c.etcd_lease_ttl_s, 2);
    assert_string_equal(c.coordinator_host, "coord");
    assert_int_equal(c.coordinator_port, 3026);
    cfg_errors_release(&e);
    json_decref(root);
    ctlcfg_release(&c);
}

static void test_upstream_etcd_config(void **state)
{
    (void)state;
    struct ctlcfg c;
    ctlcfg_init(&c);
    json_t *root =
        J("{\"motor_controller_config\":{\"etcd_config\":{\"etcd_host\":\"etcd.x\","
          "\"etcd_port\":2399,\"enable_etcd_persistence\":true},"
          "\"standby_config\":{\"master_lock_ttl\":4,\"master_lock_retry_interval\":1}}}");
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    ctlcfg_apply(&c, root, &e);
    assert_int_equal(cfg_errors_count(&e), 0);
    assert_int_equal(c.store, CTLCFG_STORE_ETCD);
    assert_string_equal(c.etcd_endpoints[0], "http://etcd.x:2399");
    assert_int_equal(c.etcd_lease_ttl_s, 4);
    assert_int_equal(c.leader_retry_ms, 1000);
    cfg_errors_release(&e);
    json_decref(root);
    ctlcfg_release(&c);
}

static void test_errors_collected(void **state)
{
    (void)state;
    struct ctlcfg c;
    ctlcfg_init(&c);
    json_t *root =
        J("{\"motor_controller_config\":{"
          "\"api_config\":{\"controller_api_port\":70000},"
          "\"instance_config\":{\"instance_heartbeat_timeout\":\"ten\"},"
          "\"fault_tolerance_config\":{\"enable_engine_relaunch\":1,"
          "\"dp_scale_down_config\":{\"execution_deadline_sec\":0.5}},"
          "\"store_config\":{\"backend\":\"redis\",\"etcd_endpoints\":[\"127.0.0.1:2379\"]},"
          "\"mgmt_tls_config\":{\"enable_tls\":true,\"cert_file\":\"/nonexistent/c.pem\"}},"
          "\"motor_coordinator_config\":{\"api_config\":{\"coordinator_api_mgmt_port\":0}}}");
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    ctlcfg_apply(&c, root, &e);
    const char *t = cfg_errors_text(&e);
    static const char *const want[] = {
        "motor_controller_config.api_config.controller_api_port",
        "motor_controller_config.instance_config.instance_heartbeat_timeout",
        "motor_controller_config.fault_tolerance_config.enable_engine_relaunch",
        "fault_tolerance_config.dp_scale_down_config.execution_deadline_sec",
        "motor_controller_config.store_config.backend",
        "motor_controller_config.store_config.etcd_endpoints",
        "motor_controller_config.mgmt_tls_config.cert_file",
        "motor_controller_config.mgmt_tls_config.key_file",
        "motor_coordinator_config.api_config.coordinator_api_mgmt_port",
    };
    for (size_t i = 0; i < ARRAY_LEN(want); i++)
        if (!strstr(t, want[i]))
            fail_msg("missing error for %s in:\n%s", want[i], t);
    assert_int_equal(cfg_errors_count(&e), (int)ARRAY_LEN(want));
    cfg_errors_release(&e);
    json_decref(root);
    ctlcfg_release(&c);
}

static void test_whole_file_is_block(void **state)
{
    (void)state;
    struct ctlcfg c;
    ctlcfg_init(&c);
    json_t *root = J("{\"api_config\":{\"controller_api_port\":0}}");
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    ctlcfg_apply(&c, root, &e);
    assert_int_equal(cfg_errors_count(&e), 0);
    assert_int_equal(c.port, 0);
    cfg_errors_release(&e);
    json_decref(root);
    ctlcfg_release(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_upstream_etcd_config),
        cmocka_unit_test(test_errors_collected),
        cmocka_unit_test(test_whole_file_is_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
