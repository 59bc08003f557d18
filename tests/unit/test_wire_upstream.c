/* wire vs the upstream sample data in ../shared/spec/upstream-examples (read in place,
 * never copied): both test start commands parse as StartCmdMsg (older shape: endpoint
 * `port`, no `workload`), and test-hccl_a2.json reads as a ranktable.
 * When the folder is missing the tests say so loudly and are reported as skipped. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "wire/wire_msg.h"
#include "wire/wire_ranktable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* $MOTOR_UPSTREAM_EXAMPLES, else <repo>/../shared/spec/upstream-examples where <repo> is
 * three levels above this source file. */
static char *upstream_dir(void)
{
    const char *env = getenv("MOTOR_UPSTREAM_EXAMPLES");
    if (env && *env)
        return xstrdup(env);
    char *repo = xstrdup(__FILE__);
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(repo, '/');
        if (slash)
            *slash = '\0';
    }
    char *dir = xasprintf("%s/../shared/spec/upstream-examples", repo);
    free(repo);
    return dir;
}

static char *upstream_file(const char *name)
{
    char *dir = upstream_dir();
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr,
                "*** upstream examples folder not found: %s\n"
                "*** the upstream compatibility checks did NOT run (set MOTOR_UPSTREAM_EXAMPLES)\n",
                dir);
        free(dir);
        return NULL;
    }
    char *p = xasprintf("%s/%s", dir, name);
    free(dir);
    return p;
}

static json_t *load_json(const char *path)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j)
        fail_msg("%s: %s", path, jerr.text);
    return j;
}

static void check_start_command(const char *name, bool a3)
{
    char *path = upstream_file(name);
    if (!path) {
        skip();
        return;
    }
    json_t *j = load_json(path);
    struct wire_start_cmd m;
    struct wire_err err = {{0}};
    if (wire_start_cmd_parse(j, 0, &m, &err) < 0)
        fail_msg("%s: %s", path, err.msg);
    assert_string_equal(m.job_name, "testSendStartCommand");
    assert_int_equal(m.role, WIRE_ROLE_PREFILL);
    assert_int_equal(m.instance_id, 0);
    assert_null(m.master_dp_ip);
    assert_int_equal(m.node_rank, 0);
    assert_false(m.has_d2d_peer_ips);
    assert_int_equal(m.n_endpoints, 2);
    assert_int_equal(m.endpoints[0].id, 2);
    assert_int_equal(m.endpoints[1].id, 3);
    assert_string_equal(m.endpoints[0].ip, "127.0.0.2");
    /* `port` of the older shape became business_port */
    assert_string_equal(m.endpoints[0].business_port, "8080");
    assert_string_equal(m.endpoints[1].business_port, "8084");
    assert_int_equal(m.endpoints[0].status, WIRE_EP_INITIAL);
    assert_true(m.endpoints[0].hb_timestamp > 1.7e9);
    assert_true(m.endpoints[0].active_tokens == 0.0);
    assert_int_equal(m.endpoints[1].n_device_infos, 2);
    assert_string_equal(m.endpoints[1].device_infos[1].device_id, "3");
    assert_string_equal(m.endpoints[1].device_infos[1].rank_id, "7");
    if (a3)
        assert_string_equal(m.endpoints[1].device_infos[1].super_device_id, "0");
    else
        assert_null(m.endpoints[1].device_infos[1].super_device_id);
    assert_non_null(m.ranktable);
    assert_string_equal(m.ranktable->server_count, "2");
    assert_int_equal(m.ranktable->n_servers, 2);
    assert_string_equal(m.ranktable->servers[1].server_id, "127.0.0.2");
    assert_null(m.ranktable->servers[1].container_ip); /* only host_ip upstream: dropped */
    assert_int_equal(m.ranktable->servers[1].n_devices, 4);

    /* round trip through our serializer: newest shape, same content */
    json_t *out = wire_start_cmd_to_json(&m);
    json_t *ep0 = json_array_get(json_object_get(out, "endpoints"), 0);
    assert_string_equal(json_string_value(json_object_get(ep0, "business_port")), "8080");
    assert_null(json_object_get(ep0, "port"));
    assert_non_null(json_object_get(ep0, "workload"));
    assert_null(json_object_get(
        json_array_get(json_object_get(json_object_get(out, "ranktable"), "server_list"), 0),
        "host_ip"));
    struct wire_start_cmd m2;
    assert_int_equal(wire_start_cmd_parse(out, WIRE_STRICT_ENDPOINT, &m2, &err), 0);
    json_t *out2 = wire_start_cmd_to_json(&m2);
    assert_true(json_equal(out, out2));

    /* the newest Controller's strictness would reject the older shape */
    struct wire_start_cmd m3;
    assert_int_equal(wire_start_cmd_parse(j, WIRE_STRICT_ENDPOINT, &m3, &err), -EINVAL);
    assert_string_equal(err.msg, "endpoints[0]: unknown field \"port\"");

    wire_start_cmd_release(&m2);
    wire_start_cmd_release(&m);
    json_decref(out2);
    json_decref(out);
    json_decref(j);
    free(path);
}

static void test_start_command_a2(void **state)
{
    (void)state;
    check_start_command("test-start_command_a2.json", false);
}

static void test_start_command_a3(void **state)
{
    (void)state;
    check_start_command("test-start_command_a3.json", true);
}

static void test_hccl_ranktable(void **state)
{
    (void)state;
    char *path = upstream_file("test-hccl_a2.json");
    if (!path) {
        skip();
        return;
    }
    struct wire_ranktable rt;
    struct wire_err err = {{0}};
    if (wire_ranktable_load_file(path, &rt, &err) < 0)
        fail_msg("%s", err.msg);
    assert_string_equal(rt.version, "1.0");
    assert_string_equal(rt.status, "completed");
    assert_string_equal(rt.server_count, "1");
    assert_int_equal(rt.n_servers, 1);
    assert_string_equal(rt.servers[0].server_id, "192.168.101.101");
    assert_string_equal(rt.servers[0].container_ip, "192.168.149.101");
    assert_int_equal(rt.servers[0].n_devices, 3);
    assert_string_equal(rt.servers[0].devices[2].device_id, "3");
    assert_string_equal(rt.servers[0].devices[2].device_ip, "192.168.103.3");
    assert_string_equal(rt.servers[0].devices[2].rank_id, "2");

    /* the written file drops hardware_type and reads back identically */
    char dir[] = "/tmp/test_wire_upstream_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *out = xasprintf("%s/ranktable.json", dir);
    assert_int_equal(wire_ranktable_write_file(&rt, out), 0);
    json_t *written = load_json(out);
    assert_null(json_object_get(json_array_get(json_object_get(written, "server_list"), 0),
                                "hardware_type"));
    json_t *want = wire_ranktable_to_json(&rt);
    assert_true(json_equal(written, want));
    unlink(out);
    rmdir(dir);
    free(out);
    json_decref(written);
    json_decref(want);
    wire_ranktable_release(&rt);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_command_a2),
        cmocka_unit_test(test_start_command_a3),
        cmocka_unit_test(test_hccl_ranktable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
