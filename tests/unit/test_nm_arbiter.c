/* nm_arbiter: the suicide-arbitration round (§2.5) and the freeze deadlines. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "nodemgr/nm_internal.h"

#include <string.h>

/* A tiny scenario driver: endpoints as a status string, one char each
 * (n = normal, a = abnormal, i = initial, p = paused, x = abnormal but excluded). */
struct scen {
    struct nm_arbiter a;
    struct nm_arb_ep eps[8];
    size_t n;
    uint64_t gen;
    int64_t now;
};

static void scen_init(struct scen *s, const char *st)
{
    memset(s, 0, sizeof(*s));
    nm_arbiter_init(&s->a);
    s->n = strlen(st);
    for (size_t i = 0; i < s->n; i++)
        s->eps[i].id = (int64_t)i;
    s->now = 1000000;
}

static void scen_status(struct scen *s, const char *st)
{
    for (size_t i = 0; i < s->n; i++) {
        s->eps[i].excluded = st[i] == 'x';
        switch (st[i]) {
        case 'n':
            s->eps[i].status = WIRE_EP_NORMAL;
            break;
        case 'a':
        case 'x':
            s->eps[i].status = WIRE_EP_ABNORMAL;
            break;
        case 'p':
            s->eps[i].status = WIRE_EP_PAUSED;
            break;
        default:
            s->eps[i].status = WIRE_EP_INITIAL;
            break;
        }
    }
}

/* One round; returns the outcome, *nrep the reported count (first index in *first). */
static enum nm_arb_outcome round_(struct scen *s, bool grace, size_t *nrep, size_t *first)
{
    size_t idx[8];
    struct nm_arb_input in = {.now_ms = s->now,
                              .generation = s->gen,
                              .in_grace = grace,
                              .suicide_enabled = true,
                              .eps = s->eps,
                              .n_eps = s->n};
    enum nm_arb_outcome o = nm_arbiter_round(&s->a, &in, idx, nrep);
    if (first)
        *first = *nrep ? idx[0] : (size_t)-1;
    /* The daemon marks reported endpoints once the Controller accepted. */
    for (size_t k = 0; k < *nrep; k++)
        s->eps[idx[k]].reported = true;
    s->now += 200;
    return o;
}

static void test_generation_change_resets(void **state)
{
    (void)state;
    struct scen s;
    scen_init(&s, "a");
    scen_status(&s, "a");
    size_t n;
    s.gen = 1;
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_GENERATION_RESET);
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_ABNORMAL);
    assert_int_equal(s.a.counter, 1);
    s.gen = 2; /* a new start command */
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_GENERATION_RESET);
    assert_int_equal(s.a.counter, 0);
    assert_false(s.a.suicide);
}

static void test_threshold_and_ever_normal_rule(void **state)
{
    (void)state;
    struct scen s;
    scen_init(&s, "nn");
    size_t n, first;
    round_(&s, false, &n, NULL); /* generation 0 == initial: no reset round */
    /* Endpoint 1 never NORMAL (loading): counted, never reported. */
    scen_status(&s, "ni");
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_HEALTHY);
    assert_true(s.eps[0].ever_normal);
    assert_false(s.eps[1].ever_normal);
    scen_status(&s, "aa");
    for (int i = 1; i <= 4; i++) {
        assert_int_equal(round_(&s, false, &n, &first), NM_ARB_ABNORMAL);
        assert_int_equal(s.a.counter, i);
        assert_false(s.a.suicide);
        /* Only endpoint 0 (ever NORMAL), only once per episode. */
        assert_int_equal(n, i == 1 ? 1 : 0);
        if (i == 1)
            assert_int_equal(first, 0);
    }
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_ABNORMAL);
    assert_int_equal(s.a.counter, NM_SUICIDE_THRESHOLD);
    assert_true(s.a.suicide);
}

static void test_healthy_round_resets_counter_and_dedup(void **state)
{
    (void)state;
    struct scen s;
    scen_init(&s, "n");
    size_t n;
    scen_status(&s, "n");
    round_(&s, false, &n, NULL);
    scen_status(&s, "a");
    round_(&s, false, &n, NULL);
    assert_int_equal(n, 1);
    round_(&s, false, &n, NULL);
    assert_int_equal(n, 0);
    assert_int_equal(s.a.counter, 2);
    scen_status(&s, "n");
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_HEALTHY);
    assert_int_equal(s.a.counter, 0);
    assert_false(s.eps[0].reported);
    /* A new episode is reported again. */
    scen_status(&s, "a");
    round_(&s, false, &n, NULL);
    assert_int_equal(n, 1);
}

static void test_grace_and_freeze_skip(void **state)
{
    (void)state;
    struct scen s;
    scen_init(&s, "n");
    size_t n;
    scen_status(&s, "n");
    round_(&s, false, &n, NULL);
    scen_status(&s, "a");
    round_(&s, false, &n, NULL);
    assert_int_equal(s.a.counter, 1);
    assert_int_equal(round_(&s, true, &n, NULL), NM_ARB_SKIPPED);
    assert_int_equal(s.a.counter, 0);
    /* Freeze for 1 s: rounds are skipped until the deadline, then counting resumes. */
    nm_arbiter_freeze(&s.a, NM_FREEZE_FAULT, s.now, 1000);
    assert_true(nm_arbiter_frozen(&s.a, s.now));
    for (int i = 0; i < 5; i++)
        assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_SKIPPED);
    assert_false(nm_arbiter_frozen(&s.a, s.now));
    assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_ABNORMAL);
    assert_int_equal(s.a.counter, 1);
}

static void test_freeze_never_shortens_and_unfreeze_is_per_cause(void **state)
{
    (void)state;
    struct nm_arbiter a;
    nm_arbiter_init(&a);
    a.counter = 3;
    a.suicide = true;
    nm_arbiter_freeze(&a, NM_FREEZE_RELAUNCH, 0, 720000);
    assert_int_equal(a.counter, 0);
    assert_false(a.suicide);
    nm_arbiter_freeze(&a, NM_FREEZE_RELAUNCH, 0, 1000); /* shorter: ignored */
    assert_true(nm_arbiter_frozen(&a, 700000));
    nm_arbiter_freeze(&a, NM_FREEZE_FAULT, 0, 180000);
    /* An FT finalize/abort cancels its own cause only (fix of §12.11). */
    nm_arbiter_unfreeze(&a, NM_FREEZE_FAULT);
    assert_true(nm_arbiter_frozen(&a, 1000));
    nm_arbiter_unfreeze(&a, NM_FREEZE_RELAUNCH);
    assert_false(nm_arbiter_frozen(&a, 1000));
    assert_string_equal(nm_freeze_cause_str(NM_FREEZE_FT_GUARD), "ft_guard");
}

static void test_excluded_endpoints_do_not_count(void **state)
{
    (void)state;
    struct scen s;
    scen_init(&s, "nn");
    size_t n;
    scen_status(&s, "nn");
    round_(&s, false, &n, NULL);
    scen_status(&s, "nx"); /* retired / awaiting a local restart */
    for (int i = 0; i < 10; i++)
        assert_int_equal(round_(&s, false, &n, NULL), NM_ARB_HEALTHY);
    assert_false(s.a.suicide);
}

static void test_suicide_disabled(void **state)
{
    (void)state;
    struct nm_arbiter a;
    nm_arbiter_init(&a);
    struct nm_arb_ep ep = {.id = 0, .status = WIRE_EP_ABNORMAL, .ever_normal = true};
    size_t idx[1], n;
    struct nm_arb_input in = {
        .now_ms = 1, .generation = 0, .suicide_enabled = false, .eps = &ep, .n_eps = 1};
    for (int i = 0; i < 20; i++)
        nm_arbiter_round(&a, &in, idx, &n);
    assert_int_equal(a.counter, 20);
    assert_false(a.suicide); /* container_restart_managed false: stay up */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generation_change_resets),
        cmocka_unit_test(test_threshold_and_ever_normal_rule),
        cmocka_unit_test(test_healthy_round_resets_counter_and_dedup),
        cmocka_unit_test(test_grace_and_freeze_skip),
        cmocka_unit_test(test_freeze_never_shortens_and_unfreeze_is_per_cause),
        cmocka_unit_test(test_excluded_endpoints_do_not_count),
        cmocka_unit_test(test_suicide_disabled),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
