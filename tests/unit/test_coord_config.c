/* motor_coordinator_config: defaults, upstream keys, validation errors, key files. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/coord_config.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static json_t *J(const char *t)
{
    json_error_t e;
    json_t *j = json_loads(t, 0, &e);
    if (!j)
        fail_msg("bad json %s", t);
    return j;
}

static void test_defaults(void **state)
{
    (void)state;
    unsetenv("POD_IP");
    struct ccfg c;
    ccfg_init(&c);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.infer_port, 1025);
    assert_int_equal(c.mgmt_port, 1026);
    assert_int_equal(c.max_retry, 5);
    assert_int_equal(c.retry_delay_ms, 200);
    assert_int_equal(c.first_token_timeout_ms, 600000);
    assert_int_equal(c.infer_timeout_ms, 3600000);
    assert_int_equal(c.breaker_threshold, 3);
    assert_int_equal(c.breaker_open_ms, 30000);
    assert_int_equal(c.breaker_max_open_ms, 300000);
    assert_int_equal(c.scheduler, CCFG_SCHED_LOAD_BALANCE);
    assert_true(c.pd_fallback_to_hybrid);
    assert_false(c.api_key_enable);
    assert_null(c.api_keys[0]);
    ccfg_release(&c);
}

static void test_keys(void **state)
{
    (void)state;
    char kpath[] = "/tmp/coordcfgXXXXXX";
    int fd = mkstemp(kpath);
    assert_true(fd >= 0);
    assert_int_equal(util_write_all(fd, "s3cret  \nignored\n", 17), 0);
    close(fd);
    char ipath[] = "/tmp/coordcfgXXXXXX";
    fd = mkstemp(ipath);
    assert_int_equal(util_write_all(fd, "# comment\nk1\n\n  k2 \n", 20), 0);
    close(fd);
    char *text = xasprintf(
        "{\"motor_coordinator_config\":{\"api_config\":{\"coordinator_api_host\":\"0.0.0.0\","
        "\"coordinator_api_infer_port\":0,\"coordinator_api_mgmt_port\":2026},"
        "\"scheduler_config\":{\"scheduler_type\":\"round_robin\"},"
        "\"exception_config\":{\"max_retry\":2,\"retry_delay\":0.05,\"transport_max_retry\":4,"
        "\"circuit_breaker_open_timeout\":1.5},"
        "\"timeout_config\":{\"first_token_timeout\":2,\"infer_timeout\":10.5},"
        "\"api_key_config\":{\"enable_api_key\":true,\"api_keys\":[\"k0\"],\"api_key_file\":\"%s\"}"
        ","
        "\"mgmt_api_key_config\":{\"enable_api_key\":true,\"api_key_file\":\"%s\"},"
        "\"inference_workers_config\":{\"num_workers\":3}}}",
        ipath, kpath);
    json_t *root = J(text);
    free(text);
    struct ccfg c;
    ccfg_init(&c);
    struct cfg_errors e;
    cfg_errors_init(&e, "motor_coordinator_config");
    ccfg_apply(&c, root, &e);
    assert_int_equal(cfg_errors_count(&e), 0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.infer_port, 0);
    assert_int_equal(c.mgmt_port, 2026);
    assert_int_equal(c.scheduler, CCFG_SCHED_ROUND_ROBIN);
    assert_int_equal(c.max_retry, 2);
    assert_int_equal(c.retry_delay_ms, 50);
    assert_int_equal(c.transport_max_retry, 4);
    assert_int_equal(c.breaker_open_ms, 1500);
    assert_int_equal(c.breaker_max_open_ms, 300000);
    assert_int_equal(c.first_token_timeout_ms, 2000);
    assert_int_equal(c.infer_timeout_ms, 10500);
    assert_int_equal(c.n_api_keys, 3);
    assert_string_equal(c.api_keys[0], "k0");
    assert_string_equal(c.api_keys[1], "k1");
    assert_string_equal(c.api_keys[2], "k2");
    assert_string_equal(c.mgmt_key, "s3cret");
    assert_int_equal(c.workers, 3);
    cfg_errors_release(&e);
    ccfg_release(&c);
    json_decref(root);
    unlink(kpath);
    unlink(ipath);
}

static void test_errors_collected(void **state)
{
    (void)state;
    /* the block may also be the whole file */
    json_t *root = J("{\"api_config\":{\"coordinator_api_infer_port\":70000},"
                     "\"exception_config\":{\"max_retry\":\"5\"},"
                     "\"scheduler_config\":{\"scheduler_type\":\"random\"},"
                     "\"mgmt_api_key_config\":{\"enable_api_key\":true},"
                     "\"api_key_config\":{\"enable_api_key\":true}}");
    struct ccfg c;
    ccfg_init(&c);
    struct cfg_errors e;
    cfg_errors_init(&e, "motor_coordinator_config");
    ccfg_apply(&c, root, &e);
    assert_int_equal(cfg_errors_count(&e), 5);
    const char *t = cfg_errors_text(&e);
    assert_non_null(strstr(t, "coordinator_api_infer_port"));
    assert_non_null(strstr(t, "max_retry"));
    assert_non_null(strstr(t, "scheduler_type"));
    assert_non_null(strstr(t, "mgmt_api_key_config.api_key_file"));
    assert_int_equal(c.infer_port, 1025);
    cfg_errors_release(&e);
    ccfg_release(&c);
    json_decref(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_errors_collected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
