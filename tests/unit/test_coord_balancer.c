/* Balancers: least in-flight tokens (with the instance term) and round robin. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
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

/* Matched tokens per hostport, for the affinity tests. */
struct matches {
    const char *hp[4];
    uint32_t tok[4];
};

static void fixed_match(void *ctx, const char *const *hostports, size_t m, uint32_t *tokens)
{
    struct matches *x = ctx;
    for (size_t j = 0; j < m; j++) {
        tokens[j] = 0;
        for (int i = 0; i < 4 && x->hp[i]; i++)
            if (!strcmp(x->hp[i], hostports[j]))
                tokens[j] = x->tok[i];
    }
}

static void test_affinity_unified(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    atomic_uint rr = 0;
    struct bal_pick p;
    struct matches m = {{"b:1"}, {800}};
    struct bal_affinity aff = {
        .match = fixed_match, .ctx = &m, .prompt_tokens = 1000, .req_tokens = 1100, .gate = 1.5};
    /* b:1 saves 800 tokens of prefill: it wins while its load is below that. */
    inst_load_acquire(ep_of(f, 2, 0)->load, 700);
    assert_int_equal(bal_select_affinity(BAL_KV_UNIFIED, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_string_equal(p.ep->hostport, "b:1");
    assert_int_equal(aff.matched, 800);
    inst_load_acquire(ep_of(f, 2, 0)->load, 250); /* 950 in flight: no longer worth it */
    assert_int_equal(bal_select_affinity(BAL_KV_UNIFIED, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_int_equal(p.inst->id, 1);
    assert_int_equal(aff.matched, 0);
    inst_load_release(ep_of(f, 2, 0)->load, 950);
    /* Another policy: plain least tokens. */
    assert_int_equal(bal_select_affinity(BAL_LEAST_TOKENS, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_int_equal(aff.matched, 0);
}

static void test_affinity_load_gated(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    atomic_uint rr = 0;
    struct bal_pick p;
    struct matches m = {{"a:2", "b:1"}, {300, 600}};
    struct bal_affinity aff = {
        .match = fixed_match, .ctx = &m, .prompt_tokens = 1000, .req_tokens = 100, .gate = 1.5};
    /* The longest prefix wins within the gate, whatever the load below it. */
    inst_load_acquire(ep_of(f, 2, 0)->load, 200);
    inst_load_acquire(ep_of(f, 1, 0)->load, 100);
    assert_int_equal(bal_select_affinity(BAL_KV_LOAD_GATED, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_string_equal(p.ep->hostport, "b:1");
    /* b:1 beyond 1.5 x mean + the request: the next longest prefix inside. mean =
     * (100 + 0 + 2000) / 3 = 700, bound = 1150. */
    inst_load_acquire(ep_of(f, 2, 0)->load, 1800);
    assert_int_equal(bal_select_affinity(BAL_KV_LOAD_GATED, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_string_equal(p.ep->hostport, "a:2");
    assert_int_equal(aff.matched, 300);
    /* Nothing cached anywhere: the least loaded. */
    m.tok[0] = m.tok[1] = 0;
    assert_int_equal(bal_select_affinity(BAL_KV_LOAD_GATED, 0, v, n, NULL, NULL, &rr, &aff, &p), 0);
    assert_string_equal(p.ep->hostport, "a:2");
    inst_load_release(ep_of(f, 2, 0)->load, 2000);
    inst_load_release(ep_of(f, 1, 0)->load, 100);
}

static void test_foreign_load(void **state)
{
    struct fixture *f = *state;
    struct instance **v = f->s->routable[WIRE_ROLE_UNION];
    size_t n = f->s->n_routable[WIRE_ROLE_UNION];
    atomic_uint rr = 0;
    struct bal_pick p;
    /* a:1 and a:2 report 3 requests each that are not ours: b:1 is chosen every time. */
    for (int64_t e = 0; e < 2; e++) {
        struct inst_load *l = ep_of(f, 1, e)->load;
        atomic_store(&l->eng_foreign_m, 3000);
        atomic_store(&l->eng_until_ms, util_mono_ms() + 60000);
    }
    inst_load_acquire(ep_of(f, 2, 0)->load, 1000); /* ours: less than 3 x 512 */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0, v, n, NULL, NULL, &rr, &p), 0);
        assert_int_equal(p.inst->id, 2);
    }
    /* A stale reading counts for nothing. */
    for (int64_t e = 0; e < 2; e++)
        atomic_store(&ep_of(f, 1, e)->load->eng_until_ms, util_mono_ms() - 1);
    assert_int_equal(bal_select(BAL_LEAST_TOKENS, 0, v, n, NULL, NULL, &rr, &p), 0);
    assert_int_equal(p.inst->id, 1);
    inst_load_release(ep_of(f, 2, 0)->load, 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_least_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ties_rotate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_robin_and_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_affinity_unified, setup, teardown),
        cmocka_unit_test_setup_teardown(test_affinity_load_gated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_foreign_load, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
