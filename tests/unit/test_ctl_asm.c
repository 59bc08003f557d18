/* Controller assembly rules (§5.2, §5.3, §5.7): endpoint ids = global DP ranks in
 * registration order, readiness per mode, master_dp_ip = first NM, node_rank and
 * headless slaves for nnodes > 1, device truncation, ranktable concatenation, start
 * commands, re-registration. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "controller/ctl_asm.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A RegisterMsg: ip, nm port, business ports (comma list), dp, tp, device_num, nnodes,
 * multi-endpoint flag, extra JSON members (may be ""). */
static struct wire_register *reg(const char *ip, const char *nm_port, const char *ports, int dp,
                                 int tp, int device_num, int nnodes, bool multi, const char *extra)
{
    char portlist[256] = "";
    size_t o = 0;
    char *copy = xstrdup(ports);
    for (char *save = NULL, *p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save))
        o += (size_t)snprintf(portlist + o, sizeof(portlist) - o, "%s\"%s\"", o ? "," : "", p);
    free(copy);
    char *text = xasprintf("{\"job_name\":\"job-a\",\"model_name\":\"m\",\"engine_type\":\"vllm\","
                           "\"role\":\"prefill\",\"pod_ip\":\"%s\",\"nm_port\":\"%s\","
                           "\"business_port\":[%s],\"parallel_config\":{\"dp_size\":%d,"
                           "\"tp_size\":%d},\"device_num\":%d,\"nnodes\":%d,"
                           "\"enable_multi_endpoints\":%s%s%s}",
                           ip, nm_port, portlist, dp, tp, device_num, nnodes,
                           multi ? "true" : "false", extra[0] ? "," : "", extra);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("bad JSON %s: %s", text, je.text);
    struct wire_register *m = xcalloc(1, sizeof(*m));
    struct wire_err err = {{0}};
    if (wire_register_parse(j, m, &err) < 0)
        fail_msg("register parse: %s", err.msg);
    json_decref(j);
    free(text);
    return m;
}

static void reg_free(struct wire_register *m)
{
    wire_register_release(m);
    free(m);
}

static void test_dp_ranks_in_registration_order(void **state)
{
    (void)state;
    struct wire_register *a = reg("10.0.0.5", "1026", "10000,10002", 4, 1, 2, 1, true, "");
    struct wire_register *b = reg("10.0.0.6", "1026", "10000,10002", 4, 1, 2, 1, true, "");
    struct wire_err err = {{0}};
    struct ctl_inst *in = ctl_asm_new(3, a, 100.0, &err);
    assert_non_null(in);
    assert_int_equal(in->id, 3);
    const char *why = NULL;
    assert_false(ctl_asm_ready(in, &why));
    assert_non_null(why);
    assert_int_equal(ctl_asm_add(in, b, 101.0, &err), 0);
    /* The same pod again: acknowledged, nothing changes. */
    assert_int_equal(ctl_asm_add(in, a, 102.0, &err), 1);
    assert_int_equal(in->n_nms, 2);
    assert_int_equal(ctl_inst_n_endpoints(in), 4);
    assert_true(ctl_asm_ready(in, NULL));
    for (size_t i = 0; i < 2; i++)
        for (size_t j = 0; j < 2; j++) {
            struct wire_endpoint *ep = &in->nms[i].eps[j];
            assert_int_equal(ep->id, (int64_t)(i * 2 + j));
            assert_string_equal(ep->ip, i ? "10.0.0.6" : "10.0.0.5");
            assert_string_equal(ep->business_port, j ? "10002" : "10000");
            assert_int_equal(ep->status, WIRE_EP_INITIAL);
            /* Synthesized devices: local id, global rank = id * local_world_size. */
            assert_int_equal(ep->n_device_infos, 1);
            char want[8];
            snprintf(want, sizeof(want), "%d", (int)(i * 2 + j));
            assert_string_equal(ep->device_infos[0].rank_id, want);
        }
    ctl_asm_finalize(in);
    assert_true(in->assembled);
    assert_string_equal(in->master_dp_ip, "10.0.0.5");
    assert_int_equal(in->nms[0].node_rank, 0);
    assert_int_equal(in->nms[1].node_rank, 1);
    assert_false(in->nms[1].eps[0].headless);
    assert_null(in->nms[0].reg);
    assert_null(in->ranktable); /* nobody sent one */
    ctl_inst_free(in);
    reg_free(a);
    reg_free(b);
}

static void test_mismatch_and_truncation(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    struct wire_register *a =
        reg("10.0.0.5", "1026", "10000,10002,10004,10006", 4, 2, 4, 1, true, "");
    struct ctl_inst *in = ctl_asm_new(1, a, 0, &err);
    /* device_num 4 / local_world_size 2 => 2 endpoints although 4 ports were sent. */
    assert_int_equal(ctl_inst_n_endpoints(in), 2);
    assert_int_equal(in->nms[0].eps[0].n_device_infos, 2);
    assert_string_equal(in->nms[0].eps[1].device_infos[0].device_id, "2");
    assert_string_equal(in->nms[0].eps[1].device_infos[1].rank_id, "3");
    struct wire_register *other = reg("10.0.0.6", "1026", "10000", 8, 2, 4, 1, true, "");
    assert_int_equal(ctl_asm_add(in, other, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "dp_size"));
    struct wire_register *role =
        reg("10.0.0.7", "1026", "10000", 4, 2, 4, 1, true, "\"role\":\"decode\"");
    /* jansson keeps the last duplicate key: role is decode. */
    assert_int_equal(role->role, WIRE_ROLE_DECODE);
    assert_int_equal(ctl_asm_add(in, role, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "role"));
    assert_int_equal(in->n_nms, 1);
    ctl_inst_free(in);
    /* Too few devices for one endpoint. */
    struct wire_register *small = reg("10.0.0.8", "1026", "10000", 1, 4, 2, 1, true, "");
    assert_null(ctl_asm_new(2, small, 0, &err));
    assert_non_null(strstr(err.msg, "device_num"));
    reg_free(a);
    reg_free(other);
    reg_free(role);
    reg_free(small);
}

static void test_nnodes_headless(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    /* dp 2 across nnodes 2: four single-endpoint pods. */
    struct wire_register *r[4];
    for (int i = 0; i < 4; i++) {
        char ip[32];
        snprintf(ip, sizeof(ip), "10.2.0.%d", i + 1);
        r[i] = reg(ip, "1026", "10000", 2, 1, 1, 2, true, "");
    }
    struct ctl_inst *in = ctl_asm_new(9, r[0], 0, &err);
    for (int i = 1; i < 4; i++) {
        assert_false(ctl_asm_ready(in, NULL));
        assert_int_equal(ctl_asm_add(in, r[i], 0, &err), 0);
    }
    assert_true(ctl_asm_ready(in, NULL));
    ctl_asm_finalize(in);
    assert_string_equal(in->master_dp_ip, "10.2.0.1");
    for (int i = 0; i < 4; i++) {
        assert_int_equal(in->nms[i].node_rank, i % 2);
        assert_int_equal(in->nms[i].eps[0].headless, i % 2 != 0);
        assert_int_equal(in->nms[i].eps[0].id, i);
    }
    ctl_inst_free(in);
    for (int i = 0; i < 4; i++)
        reg_free(r[i]);

    /* The smallest case: dp 1, nnodes 2 => master + one headless slave. */
    struct wire_register *m0 = reg("127.0.0.1", "2001", "11000", 1, 1, 1, 2, true, "");
    struct wire_register *m1 = reg("127.0.0.1", "2002", "11100", 1, 1, 1, 2, true, "");
    in = ctl_asm_new(1, m0, 0, &err);
    assert_false(ctl_asm_ready(in, NULL));
    /* Same host, another NM port: a second pod, not a duplicate. */
    assert_int_equal(ctl_asm_add(in, m1, 0, &err), 0);
    assert_true(ctl_asm_ready(in, NULL));
    ctl_asm_finalize(in);
    assert_false(in->nms[0].eps[0].headless);
    assert_true(in->nms[1].eps[0].headless);
    assert_int_equal(in->nms[1].node_rank, 1);
    ctl_inst_free(in);
    reg_free(m0);
    reg_free(m1);
}

static void test_single_endpoint_mode(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    /* One engine over world 16 with 8 devices per pod: 2 pods, 1 endpoint each. */
    struct wire_register *a = reg("10.3.0.1", "1026", "10000,10002", 1, 16, 8, 1, false, "");
    struct wire_register *b = reg("10.3.0.2", "1026", "10000", 1, 16, 8, 1, false, "");
    struct ctl_inst *in = ctl_asm_new(4, a, 0, &err);
    assert_int_equal(ctl_inst_n_endpoints(in), 1);
    assert_false(ctl_asm_ready(in, NULL));
    assert_int_equal(ctl_asm_add(in, b, 0, &err), 0);
    assert_true(ctl_asm_ready(in, NULL));
    assert_int_equal(in->nms[1].eps[0].id, 1);
    assert_int_equal(in->nms[0].eps[0].n_device_infos, 8);
    ctl_inst_free(in);
    reg_free(a);
    reg_free(b);
}

static void test_remove_renumbers(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    struct wire_register *a = reg("10.4.0.1", "1026", "10000,10002", 6, 1, 2, 1, true, "");
    struct wire_register *b = reg("10.4.0.2", "1026", "10000,10002", 6, 1, 2, 1, true, "");
    struct wire_register *c = reg("10.4.0.3", "1026", "10000,10002", 6, 1, 2, 1, true, "");
    struct ctl_inst *in = ctl_asm_new(5, a, 0, &err);
    ctl_asm_add(in, b, 0, &err);
    ctl_asm_add(in, c, 0, &err);
    assert_true(ctl_asm_ready(in, NULL));
    ctl_asm_remove_nm(in, 0, 0);
    assert_int_equal(in->n_nms, 2);
    assert_string_equal(in->nms[0].pod_ip, "10.4.0.2");
    assert_int_equal(in->nms[0].eps[0].id, 0);
    assert_int_equal(in->nms[1].eps[1].id, 3);
    assert_false(ctl_asm_ready(in, NULL));
    ctl_inst_free(in);
    reg_free(a);
    reg_free(b);
    reg_free(c);
}

static void test_ranktable_and_start_cmd(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    const char *rt_a = "\"ranktable\":{\"version\":\"1.2\",\"status\":\"completed\","
                       "\"server_count\":\"1\",\"server_list\":[{\"server_id\":\"10.5.0.1\","
                       "\"container_ip\":\"10.5.0.1\",\"device\":[{\"device_id\":\"0\","
                       "\"rank_id\":\"0\",\"device_ip\":\"192.168.0.1\"},{\"device_id\":\"1\","
                       "\"rank_id\":\"1\"}]}]}";
    const char *rt_b = "\"ranktable\":{\"version\":\"1.2\",\"status\":\"completed\","
                       "\"server_count\":\"1\",\"server_list\":[{\"server_id\":\"10.5.0.2\","
                       "\"device\":[{\"device_id\":\"0\",\"rank_id\":\"2\"},{\"device_id\":\"1\","
                       "\"rank_id\":\"3\"}]}]}";
    struct wire_register *a = reg("10.5.0.1", "1026", "10000,10002", 4, 1, 2, 1, true, rt_a);
    struct wire_register *b = reg("10.5.0.2", "1026", "10000,10002", 4, 1, 2, 1, true, rt_b);
    struct ctl_inst *in = ctl_asm_new(11, a, 0, &err);
    ctl_asm_add(in, b, 0, &err);
    /* Each endpoint gets its own slice of the pod's devices (§12.15 fix). */
    assert_int_equal(in->nms[0].eps[1].n_device_infos, 1);
    assert_string_equal(in->nms[0].eps[1].device_infos[0].rank_id, "1");
    assert_string_equal(in->nms[0].eps[0].device_infos[0].device_ip, "192.168.0.1");
    ctl_asm_finalize(in);
    assert_non_null(in->ranktable);
    assert_int_equal(in->ranktable->n_servers, 2);
    assert_string_equal(in->ranktable->server_count, "2");
    assert_string_equal(in->ranktable->servers[1].server_id, "10.5.0.2");

    struct wire_strlist d2d = {0};
    wire_strlist_push(&d2d, "0:10.9.0.1");
    json_t *cmd = ctl_asm_start_cmd_json(in, 1, &d2d);
    struct wire_start_cmd sc;
    if (wire_start_cmd_parse(cmd, WIRE_STRICT_ENDPOINT, &sc, &err) < 0)
        fail_msg("start cmd does not parse strictly: %s", err.msg);
    assert_string_equal(sc.job_name, "job-a");
    assert_int_equal(sc.role, WIRE_ROLE_PREFILL);
    assert_int_equal(sc.instance_id, 11);
    assert_string_equal(sc.master_dp_ip, "10.5.0.1");
    assert_int_equal(sc.node_rank, 1);
    assert_int_equal(sc.n_endpoints, 2);
    assert_int_equal(sc.endpoints[0].id, 2);
    assert_string_equal(sc.endpoints[0].ip, "10.5.0.2");
    assert_true(sc.has_d2d_peer_ips);
    assert_int_equal(sc.d2d_peer_ips.n, 1);
    assert_non_null(sc.ranktable);
    assert_int_equal(sc.ranktable->n_servers, 2);
    wire_start_cmd_release(&sc);
    json_decref(cmd);
    /* No peers: the field is omitted (dumped without nulls). */
    cmd = ctl_asm_start_cmd_json(in, 0, NULL);
    assert_null(json_object_get(cmd, "d2d_peer_ips"));
    json_decref(cmd);
    wire_strlist_release(&d2d);
    ctl_inst_free(in);
    reg_free(a);
    reg_free(b);
}

static struct wire_reregister *rereg(const char *ip, const char *port, int id0, int n,
                                     int node_rank, const char *job)
{
    char eps[512] = "";
    size_t o = 0;
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(
            eps + o, sizeof(eps) - o,
            "%s{\"id\":%d,\"ip\":\"%s\",\"business_port\":\"%d\",\"status\":\"normal\"}",
            i ? "," : "", id0 + i, ip, 10000 + 2 * i);
    char *text = xasprintf("{\"job_name\":\"%s\",\"model_name\":\"m\",\"instance_id\":42,"
                           "\"role\":\"decode\",\"pod_ip\":\"%s\",\"nm_port\":\"%s\","
                           "\"parallel_config\":{\"dp_size\":4},\"endpoints\":[%s],"
                           "\"node_rank\":%d}",
                           job, ip, port, eps, node_rank);
    json_t *j = json_loads(text, 0, NULL);
    struct wire_reregister *m = xcalloc(1, sizeof(*m));
    struct wire_err err = {{0}};
    if (wire_reregister_parse(j, WIRE_STRICT_ENDPOINT, m, &err) < 0)
        fail_msg("reregister parse: %s", err.msg);
    json_decref(j);
    free(text);
    return m;
}

static void test_reregister(void **state)
{
    (void)state;
    struct wire_err err = {{0}};
    struct wire_reregister *b = rereg("10.6.0.2", "1026", 2, 2, 1, "job-d");
    struct wire_reregister *a = rereg("10.6.0.1", "1026", 0, 2, 0, "job-d");
    struct wire_reregister *x = rereg("10.6.0.3", "1026", 1, 1, 0, "job-d");
    struct wire_reregister *wrong = rereg("10.6.0.4", "1026", 5, 1, 0, "job-x");
    struct ctl_inst *in = ctl_asm_new_rereg(b, 5.0);
    assert_int_equal(in->id, 42);
    assert_true(in->reregistered);
    assert_true(in->nms[0].eps[0].headless); /* node_rank 1 */
    assert_true(in->nms[0].start_ok);
    assert_false(ctl_asm_ready(in, NULL));
    assert_int_equal(ctl_asm_add_rereg(in, a, 5.0, &err), 0);
    /* Again: endpoints refreshed, not duplicated. */
    assert_int_equal(ctl_asm_add_rereg(in, a, 6.0, &err), 1);
    assert_int_equal(in->n_nms, 2);
    /* An endpoint id owned by another pod. */
    assert_int_equal(ctl_asm_add_rereg(in, x, 6.0, &err), -EINVAL);
    assert_int_equal(ctl_asm_add_rereg(in, wrong, 6.0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "job_name"));
    assert_true(ctl_asm_ready(in, NULL));
    ctl_asm_finalize_rereg(in);
    /* Ordered by lowest endpoint id: the node_rank 0 pod leads, and is the DP master. */
    assert_string_equal(in->nms[0].pod_ip, "10.6.0.1");
    assert_string_equal(in->master_dp_ip, "10.6.0.1");
    assert_false(in->start_pending);
    assert_true(in->assembled);
    ctl_inst_free(in);
    wire_reregister_release(a);
    wire_reregister_release(b);
    wire_reregister_release(x);
    wire_reregister_release(wrong);
    free(a);
    free(b);
    free(x);
    free(wrong);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dp_ranks_in_registration_order),
        cmocka_unit_test(test_mismatch_and_truncation),
        cmocka_unit_test(test_nnodes_headless),
        cmocka_unit_test(test_single_endpoint_mode),
        cmocka_unit_test(test_remove_renumbers),
        cmocka_unit_test(test_ranktable_and_start_cmd),
        cmocka_unit_test(test_reregister),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
