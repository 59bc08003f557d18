/* Coordinator instance table: refresh parsing (both shapes), add/del/set semantics,
 * 400/409 rules, routability, shared state across refreshes, snapshots. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/instances.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct brk_params BP = {3, 30000, 300000};

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test json: %s: %s", e.text, text);
    return j;
}

static int parse(const char *text, struct inst_refresh *r, char *err, size_t cap)
{
    json_t *j = J(text);
    int rc = inst_refresh_parse(j, r, err, cap);
    json_decref(j);
    return rc;
}

#define CTRL_P1                                                                                    \
    "{\"id\":1,\"role\":\"prefill\",\"job_name\":\"jp\",\"model_name\":\"m\",\"status\":"          \
    "\"active\","                                                                                  \
    "\"endpoints\":{\"10.0.0.1\":{\"0\":{\"id\":0,\"ip\":\"10.0.0.1\",\"business_port\":\"8000\"}" \
    ","                                                                                            \
    "\"1\":{\"id\":1,\"ip\":\"10.0.0.1\",\"business_port\":8002,\"status\":\"normal\"}}}}"
#define CTRL_D2                                                                                    \
    "{\"id\":2,\"role\":\"decode\",\"job_name\":\"jd\",\"model_name\":\"m\",\"status\":"           \
    "\"active\","                                                                                  \
    "\"endpoints\":{\"10.0.0.2\":{\"0\":{\"id\":0,\"ip\":\"10.0.0.2\",\"business_port\":\"9000\"," \
    "\"headless\":false,\"device_infos\":[],\"hb_timestamp\":1.5,\"workload\":{}}}}}"

/* Table-driven: body => expected return and a fragment of the message. */
static const struct {
    const char *body;
    int rc;
    const char *msg;
} parse_cases[] = {
    {"{\"event\":\"add\",\"instances\":[" CTRL_P1 "," CTRL_D2 "]}", 0, NULL},
    {"{\"event\":\"SET\",\"instances\":[]}", 0, NULL},
    {"{\"event\":\"set\",\"model_name\":\"m\",\"dispatch_capabilities\":\"prefill_handoff_decode\","
     "\"instances\":[{\"id\":5,\"role\":\"prefill\",\"endpoints\":[{\"id\":0,\"address\":"
     "\"127.0.0.1:8000\"},{\"id\":1,\"address\":\"[::1]:8001\"}]}]}",
     0, NULL},
    {"[]", -EINVAL, "object"},
    {"{\"event\":\"upsert\",\"instances\":[]}", -EINVAL, "event"},
    {"{\"event\":\"add\"}", -EINVAL, "instances"},
    {"{\"event\":\"add\",\"instances\":[" CTRL_P1 "," CTRL_P1 "]}", -EINVAL,
     "duplicate instance id 1"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":-1,\"role\":\"prefill\",\"endpoints\":[]}]}",
     -EINVAL, "id"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"boss\",\"endpoints\":[]}]}", -EINVAL,
     "role"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":7}]}", -EINVAL,
     "endpoints"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":{\"h\":{\"0\":"
     "{\"id\":0,\"ip\":\"h\",\"business_port\":\"8000\",\"mgmt_port\":\"8001\"}}}}]}",
     -EINVAL, "unknown endpoint field 'mgmt_port'"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":{\"h\":{\"0\":"
     "{\"id\":0,\"ip\":\"h\",\"business_port\":\"99999\"}}}}]}",
     -EINVAL, "business_port"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":[{\"id\":0,"
     "\"address\":\"nohost\"}]}]}",
     -EINVAL, "address"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":[{\"id\":0,"
     "\"address\":\"h:1\"},{\"id\":0,\"address\":\"h:2\"}]}]}",
     -EINVAL, "duplicate endpoint id"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"status\":\"zombie\","
     "\"endpoints\":[]}]}",
     -EINVAL, "status"},
    {"{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"endpoints\":{\"h\":{\"0\":"
     "{\"id\":0,\"ip\":\"h\",\"business_port\":\"1\",\"headless\":\"no\"}}}}]}",
     -EINVAL, "headless"},
};

static void test_parse_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]); i++) {
        struct inst_refresh r;
        char err[256] = "";
        int rc = parse(parse_cases[i].body, &r, err, sizeof(err));
        if (rc != parse_cases[i].rc)
            fail_msg("case %zu: rc %d want %d (%s)", i, rc, parse_cases[i].rc, err);
        if (parse_cases[i].msg && !strstr(err, parse_cases[i].msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, err, parse_cases[i].msg);
        if (rc == 0)
            inst_refresh_release(&r);
    }
}

static void test_parse_fields(void **state)
{
    (void)state;
    struct inst_refresh r;
    char err[256];
    assert_int_equal(parse("{\"event\":\"add\",\"instances\":[" CTRL_P1 "]}", &r, err, sizeof(err)),
                     0);
    assert_int_equal(r.ev, WIRE_REFRESH_ADD);
    assert_int_equal(r.n, 1);
    struct instance *in = r.v[0];
    assert_int_equal(in->id, 1);
    assert_int_equal(in->role, WIRE_ROLE_PREFILL);
    assert_string_equal(in->job_name, "jp");
    assert_string_equal(in->engine_type, "vllm");
    assert_int_equal(in->engine, INST_ENGINE_VLLM);
    assert_int_equal(in->n_eps, 2);
    assert_int_equal(in->eps[0].port + in->eps[1].port, 16002);
    assert_false(inst_refresh_needs_model(&r));
    inst_refresh_release(&r);

    assert_int_equal(
        parse("{\"event\":\"set\",\"engine_type\":\"sglang\",\"instances\":[{\"id\":9,"
              "\"role\":\"both\",\"endpoints\":[{\"id\":3,\"address\":\"[fe80::1]:30000\","
              "\"bootstrap_port\":8998}]}]}",
              &r, err, sizeof(err)),
        0);
    in = r.v[0];
    assert_int_equal(in->role, WIRE_ROLE_UNION);
    assert_int_equal(in->engine, INST_ENGINE_SGLANG);
    assert_int_equal(in->status, WIRE_INS_ACTIVE);
    assert_string_equal(in->eps[0].ip, "fe80::1");
    assert_string_equal(in->eps[0].hostport, "[fe80::1]:30000");
    assert_int_equal(in->eps[0].bootstrap_port, 8998);
    assert_true(inst_refresh_needs_model(&r));
    inst_refresh_release(&r);
}

static int apply(struct inst_table *t, const char *body, char *err, size_t cap)
{
    struct inst_refresh r;
    int rc = parse(body, &r, err, cap);
    if (rc < 0)
        fail_msg("parse: %s", err);
    rc = inst_table_apply(t, &r, err, cap);
    inst_refresh_release(&r);
    return rc;
}

static void test_add_del_set(void **state)
{
    (void)state;
    struct inst_table t;
    inst_table_init(&t, &BP);
    char err[256];
    assert_int_equal(apply(&t, "{\"event\":\"add\",\"instances\":[" CTRL_P1 "]}", err, sizeof(err)),
                     0);
    assert_int_equal(t.n, 1);
    assert_int_equal(t.version, 1);
    struct instance *p1 = inst_table_find(&t, 1);
    struct inst_shared *sh = p1->shared;
    struct inst_load *l0 = p1->eps[0].load;
    assert_non_null(sh);
    assert_non_null(l0);

    /* same identity again: accepted, state kept */
    assert_int_equal(
        apply(&t, "{\"event\":\"add\",\"instances\":[" CTRL_P1 "," CTRL_D2 "]}", err, sizeof(err)),
        0);
    assert_int_equal(t.n, 2);
    assert_ptr_equal(inst_table_find(&t, 1)->shared, sh);
    /* sorted by role name: decode before prefill */
    assert_int_equal(t.v[0]->id, 2);

    /* same id, other identity => 409, table unchanged */
    assert_int_equal(
        apply(&t,
              "{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"decode\",\"job_name\":\"jp\","
              "\"endpoints\":[{\"id\":0,\"address\":\"10.0.0.1:8000\"}]}]}",
              err, sizeof(err)),
        -EEXIST);
    assert_non_null(strstr(err, "instance 1"));
    assert_int_equal(t.version, 2);
    assert_int_equal(
        apply(
            &t,
            "{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\",\"job_name\":\"jp\","
            "\"endpoints\":[{\"id\":0,\"address\":\"10.0.0.1:8000\"}]}]}",
            err, sizeof(err)),
        -EEXIST);

    /* del with mismatching identity => 409; unknown id ignored */
    assert_int_equal(apply(&t,
                           "{\"event\":\"del\",\"instances\":[{\"id\":2,\"role\":\"prefill\","
                           "\"endpoints\":[]}]}",
                           err, sizeof(err)),
                     -EEXIST);
    assert_int_equal(apply(&t,
                           "{\"event\":\"del\",\"instances\":[{\"id\":2,\"role\":\"decode\","
                           "\"endpoints\":[{\"id\":0,\"address\":\"10.0.0.9:9000\"}]}]}",
                           err, sizeof(err)),
                     -EEXIST);
    assert_int_equal(t.n, 2);
    assert_int_equal(apply(&t,
                           "{\"event\":\"del\",\"instances\":[{\"id\":2,\"role\":\"decode\","
                           "\"endpoints\":[{\"id\":7,\"address\":\"10.0.0.2:9000\"}]},"
                           "{\"id\":77,\"role\":\"decode\",\"endpoints\":[]}]}",
                           err, sizeof(err)),
                     0);
    assert_int_equal(t.n, 1);
    assert_null(inst_table_find(&t, 2));

    /* set replaces everything; an instance with the same identity keeps its state */
    assert_int_equal(
        apply(&t, "{\"event\":\"set\",\"instances\":[" CTRL_D2 "," CTRL_P1 "]}", err, sizeof(err)),
        0);
    assert_int_equal(t.n, 2);
    assert_ptr_equal(inst_table_find(&t, 1)->shared, sh);
    assert_ptr_equal(inst_table_find(&t, 1)->eps[0].load, l0);
    /* set with the id reused by another identity: accepted (set is authoritative), state new */
    assert_int_equal(
        apply(&t,
              "{\"event\":\"set\",\"instances\":[{\"id\":1,\"role\":\"union\",\"model_name\":\"m\","
              "\"endpoints\":[{\"id\":0,\"address\":\"10.0.0.1:8000\"}]}]}",
              err, sizeof(err)),
        0);
    assert_int_equal(t.n, 1);
    assert_ptr_not_equal(inst_table_find(&t, 1)->shared, sh);
    inst_table_release(&t);
}

static void test_identity_order_independent(void **state)
{
    (void)state;
    struct inst_refresh a, b;
    char err[128];
    assert_int_equal(parse("{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\","
                           "\"endpoints\":[{\"id\":0,\"address\":\"h:1\"},{\"id\":1,\"address\":"
                           "\"h:2\"}]}]}",
                           &a, err, sizeof(err)),
                     0);
    assert_int_equal(parse("{\"event\":\"add\",\"instances\":[{\"id\":1,\"role\":\"prefill\","
                           "\"endpoints\":{\"h\":{\"5\":{\"id\":5,\"ip\":\"h\",\"business_port\":"
                           "\"2\"},\"6\":{\"id\":6,\"ip\":\"h\",\"business_port\":\"1\"}}}}]}",
                           &b, err, sizeof(err)),
                     0);
    assert_true(inst_same_identity(a.v[0], b.v[0]));
    inst_refresh_release(&a);
    inst_refresh_release(&b);
}

static void test_routable_and_snapshot(void **state)
{
    (void)state;
    struct inst_table t;
    inst_table_init(&t, &BP);
    char err[256];
    assert_int_equal(
        apply(&t,
              "{\"event\":\"set\",\"instances\":[" CTRL_P1 "," CTRL_D2 ","
              "{\"id\":3,\"role\":\"union\",\"model_name\":\"m2\",\"status\":\"inactive\","
              "\"endpoints\":[{\"id\":0,\"address\":\"h:1\"}]},"
              "{\"id\":4,\"role\":\"union\",\"model_name\":\"m3\",\"endpoints\":{\"h\":{\"0\":"
              "{\"id\":0,\"ip\":\"h\",\"business_port\":\"5\",\"headless\":true}}}},"
              "{\"id\":5,\"role\":\"union\",\"model_name\":\"m4\",\"endpoints\":{\"h\":{\"0\":"
              "{\"id\":0,\"ip\":\"h\",\"business_port\":\"6\",\"status\":\"abnormal\"},\"1\":"
              "{\"id\":1,\"ip\":\"h\",\"business_port\":\"7\",\"status\":\"normal\"}}}}]}",
              err, sizeof(err)),
        0);
    struct inst_snapshot *s = inst_snapshot_build(&t);
    assert_int_equal(s->n_all, 5);
    assert_int_equal(s->n_routable[WIRE_ROLE_PREFILL], 1);
    assert_int_equal(s->n_routable[WIRE_ROLE_DECODE], 1);
    assert_int_equal(s->n_routable[WIRE_ROLE_UNION], 1); /* 3 inactive, 4 headless only */
    assert_int_equal(s->routable[WIRE_ROLE_UNION][0]->id, 5);
    assert_int_equal(s->n_models, 2); /* m, m4 */

    struct inst_pub pub;
    inst_pub_init(&pub);
    uint64_t v0 = inst_pub_version(&pub);
    inst_pub_set(&pub, s);
    assert_true(inst_pub_version(&pub) != v0);
    struct inst_snapshot *held = inst_pub_get(&pub);
    assert_ptr_equal(held, s);

    /* the table changes and a new snapshot is published: the held one stays valid */
    assert_int_equal(apply(&t, "{\"event\":\"set\",\"instances\":[]}", err, sizeof(err)), 0);
    inst_pub_set(&pub, inst_snapshot_build(&t));
    inst_table_release(&t);
    assert_int_equal(held->n_all, 5);
    assert_string_equal(held->routable[WIRE_ROLE_PREFILL][0]->job_name, "jp");
    inst_load_acquire(held->routable[WIRE_ROLE_PREFILL][0]->eps[0].load, 10);
    inst_load_release(held->routable[WIRE_ROLE_PREFILL][0]->eps[0].load, 10);
    inst_snapshot_unref(held);
    struct inst_snapshot *now = inst_pub_get(&pub);
    assert_int_equal(now->n_all, 0);
    inst_snapshot_unref(now);
    inst_pub_release(&pub);
}

static void test_json_view(void **state)
{
    (void)state;
    struct inst_table t;
    inst_table_init(&t, &BP);
    char err[256];
    assert_int_equal(apply(&t, "{\"event\":\"set\",\"instances\":[" CTRL_P1 "]}", err, sizeof(err)),
                     0);
    struct instance *in = inst_table_find(&t, 1);
    for (int i = 0; i < 3; i++)
        inst_breaker_report(in, 100, -1, false);
    json_t *j = inst_table_to_json(&t, 200);
    assert_int_equal(json_integer_value(json_object_get(j, "count")), 1);
    json_t *i0 = json_array_get(json_object_get(j, "instances"), 0);
    assert_string_equal(json_string_value(json_object_get(i0, "pool")), "available");
    assert_false(json_is_true(json_object_get(i0, "healthy")));
    json_t *cb = json_object_get(i0, "circuit_breaker");
    assert_string_equal(json_string_value(json_object_get(cb, "state")), "open");
    assert_int_equal(json_integer_value(json_object_get(cb, "trip_count")), 1);
    json_t *e0 = json_array_get(json_object_get(i0, "endpoints"), 0);
    assert_true(json_is_string(json_object_get(e0, "business_port")));
    json_decref(j);
    inst_table_release(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_table),
        cmocka_unit_test(test_parse_fields),
        cmocka_unit_test(test_add_del_set),
        cmocka_unit_test(test_identity_order_independent),
        cmocka_unit_test(test_routable_and_snapshot),
        cmocka_unit_test(test_json_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
