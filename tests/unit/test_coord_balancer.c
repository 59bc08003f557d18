/* Balancers: least in-flight tokens (with the instance term) and round robin. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/balancer.h"

#include <errno.h>
#include <string.h>

static const struct brk_params BP = {3, 30000, 300000};

struct fixture {
    struct inst_table t;
    struct inst_snapshot *s;
};

static int setup(void **state)
{
    static struct fixture f;
    memset(&f, 0, sizeof(f));
    inst_table_init(&f.t, &BP);
    json_error_t je;
    json_t *j = json_loads(
        "{\"event\":\"set\",\"model_name\":\"m\",\"instances\":["
        "{\"id\":1,\"role\":\"union\",\"endpoints\":[{\"id\":0,\"address\":\"a:1\"},"
        "{\"id\":1,\"address\":\"a:2\"}]},"
        "{\"id\":2,\"role\":\"union\",\"endpoints\":[{\"id\":0,\"address\":\"b:1\"}]},"
        "{\"id\":3,\"role\":\"union\",\"endpoints\":{\"c\":{\"0\":{\"id\":0,\"ip\":\"c\","
        "\"business_port\":\"1\",\"headless\":true}}}}]}",
        0, &je);
    assert_non_null(j);
    struct inst_refresh r;
    char err[128];
    assert_int_equal(inst_refresh_parse(j, &r, err, sizeof(err)), 0);
    assert_int_equal(inst_table_apply(&f.t, &r, err, sizeof(err)), 0);
    inst_refresh_release(&r);
    json_decref(j);
    f.s = inst_snapshot_build(&f.t);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    inst_snapshot_unref(f->s);
    inst_table_release(&f->t);
    return 0;
}

static struct inst_endpoint *ep_of(struct fixture *f, int64_t inst, int64_t ep)
{
    struct instance *in = inst_table_find(&f->t, inst);
    for (size_t i = 0; i < in->n_eps; i++)
        if (in->eps[i].id == ep)
            return &in->eps[i];
    return NULL;
}

static void test_least_tokens(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    assert_int_equal(n, 2); /* instance 3 has only a headless endpoint */
    atomic_uint rr = 0;
    struct bal_pick p;
    inst_load_acquire(ep_of(f, 1, 0)->load, 100);
    inst_load_acquire(ep_of(f, 2, 0)->load, 50);
    /* a:2 has 0 tokens (+0.05*50 instance term) */
    for (int i = 0; i < 5; i++) {
        assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, n, NULL, NULL, &rr, &p), 0);
        assert_int_equal(p.inst->id, 1);
        assert_int_equal(p.ep->id, 1);
    }
    inst_load_acquire(ep_of(f, 1, 1)->load, 60);
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, n, NULL, NULL, &rr, &p), 0);
    assert_int_equal(p.inst->id, 2);
    /* the instance term decides between equal endpoint loads: 1/1 = 60 + .05*80 = 64,
     * 2/0 = 60 + .05*60 = 63 */
    inst_load_acquire(ep_of(f, 2, 0)->load, 10);
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, n, NULL, NULL, &rr, &p), 0);
    assert_int_equal(p.inst->id, 2);
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 1.0, v, n, NULL, NULL, &rr, &p), 0);
    assert_int_equal(p.inst->id, 2);
    inst_load_release(ep_of(f, 1, 0)->load, 100);
    inst_load_release(ep_of(f, 2, 0)->load, 60);
    inst_load_release(ep_of(f, 1, 1)->load, 60);
}

static void test_ties_rotate(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    atomic_uint rr = 0;
    int hits[3] = {0};
    for (int i = 0; i < 30; i++) {
        struct bal_pick p;
        assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, n, NULL, NULL, &rr, &p), 0);
        hits[(p.inst->id - 1) * 2 + p.ep->id]++;
    }
    assert_int_equal(hits[0], 10);
    assert_int_equal(hits[1], 10);
    assert_int_equal(hits[2], 10);
}

static bool not_b(struct instance *in, const struct inst_endpoint *ep, void *arg)
{
    (void)ep;
    return in->id != *(int64_t *)arg;
}

static void test_round_robin_and_filter(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    atomic_uint rr = 0;
    inst_load_acquire(ep_of(f, 1, 0)->load, 1000); /* ignored by round robin */
    const char *seq[6];
    for (int i = 0; i < 6; i++) {
        struct bal_pick p;
        assert_int_equal(bal_select(BAL_ROUND_ROBIN, 0.05, v, n, NULL, NULL, &rr, &p), 0);
        seq[i] = p.ep->hostport;
    }
    assert_string_equal(seq[0], "a:1");
    assert_string_equal(seq[1], "a:2");
    assert_string_equal(seq[2], "b:1");
    assert_string_equal(seq[3], "a:1");
    int64_t skip = 2;
    struct bal_pick p;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(bal_select(BAL_ROUND_ROBIN, 0.05, v, n, not_b, &skip, &rr, &p), 0);
        assert_int_equal(p.inst->id, 1);
    }
    skip = 1;
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, 1, not_b, &skip, &rr, &p), -ENOENT);
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0.05, v, 0, NULL, NULL, &rr, &p), -ENOENT);
    inst_load_release(ep_of(f, 1, 0)->load, 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_least_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ties_rotate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_robin_and_filter, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
