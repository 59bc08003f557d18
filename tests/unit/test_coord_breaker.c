/* Circuit breaker transitions with an injected clock. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/breaker.h"

static const struct brk_params P = {.threshold = 3, .open_ms = 30000, .max_open_ms = 300000};

static void test_trips_after_threshold(void **state)
{
    (void)state;
    struct brk b;
    brk_init(&b, &P);
    bool trial;
    assert_true(brk_acquire(&b, 0, &trial));
    assert_false(trial);
    assert_false(brk_failure(&b, 0, false));
    assert_false(brk_failure(&b, 0, false));
    brk_success(&b, false); /* success resets the consecutive count */
    assert_false(brk_failure(&b, 0, false));
    assert_false(brk_failure(&b, 0, false));
    assert_true(brk_failure(&b, 1000, false));
    assert_int_equal(b.state, BRK_OPEN);
    assert_int_equal(b.trip_count, 1);
    assert_false(brk_peek(&b, 1000));
    assert_false(brk_acquire(&b, 30999, &trial));
    assert_int_equal(brk_state_at(&b, 30999), BRK_OPEN);
    assert_int_equal(brk_state_at(&b, 31000), BRK_HALF_OPEN);
}

static void test_half_open_single_trial(void **state)
{
    (void)state;
    struct brk b;
    brk_init(&b, &P);
    for (int i = 0; i < 3; i++)
        brk_failure(&b, 0, false);
    bool trial;
    assert_true(brk_peek(&b, 30000));
    assert_true(brk_acquire(&b, 30000, &trial));
    assert_true(trial);
    /* the trial is out: nobody else passes */
    assert_false(brk_peek(&b, 30001));
    assert_false(brk_acquire(&b, 30001, &trial));
    /* late outcomes of older requests do not decide */
    brk_success(&b, false);
    assert_int_equal(b.state, BRK_HALF_OPEN);
    assert_false(brk_failure(&b, 30002, false));
    assert_int_equal(b.state, BRK_HALF_OPEN);
    brk_success(&b, true);
    assert_int_equal(b.state, BRK_CLOSED);
    assert_int_equal(b.cur_open_ms, 30000);
    assert_true(brk_acquire(&b, 30003, &trial));
    assert_false(trial);
}

static void test_doubling_and_cap(void **state)
{
    (void)state;
    struct brk b;
    brk_init(&b, &P);
    int64_t now = 0;
    for (int i = 0; i < 3; i++)
        brk_failure(&b, now, false);
    int64_t want[] = {60000, 120000, 240000, 300000, 300000};
    for (size_t k = 0; k < sizeof(want) / sizeof(want[0]); k++) {
        now = b.open_until;
        bool trial;
        assert_true(brk_acquire(&b, now, &trial));
        assert_true(trial);
        assert_true(brk_failure(&b, now, true));
        assert_int_equal(b.state, BRK_OPEN);
        assert_int_equal(b.cur_open_ms, want[k]);
        assert_int_equal(b.open_until, now + want[k]);
    }
    assert_int_equal(b.trip_count, 6);
    /* recovery resets the period */
    now = b.open_until;
    bool trial;
    assert_true(brk_acquire(&b, now, &trial));
    brk_success(&b, trial);
    assert_int_equal(b.state, BRK_CLOSED);
    for (int i = 0; i < 3; i++)
        brk_failure(&b, now, false);
    assert_int_equal(b.open_until, now + 30000);
}

static void test_abandon_frees_trial(void **state)
{
    (void)state;
    struct brk b;
    brk_init(&b, &P);
    for (int i = 0; i < 3; i++)
        brk_failure(&b, 0, false);
    bool trial;
    assert_true(brk_acquire(&b, 40000, &trial));
    assert_true(trial);
    assert_false(brk_peek(&b, 40000));
    brk_abandon(&b, true);
    assert_true(brk_peek(&b, 40000));
    assert_true(brk_acquire(&b, 40000, &trial));
    assert_true(trial);
}

static void test_threshold_one(void **state)
{
    (void)state;
    struct brk_params p = {.threshold = 0, .open_ms = 100, .max_open_ms = 50};
    struct brk b;
    brk_init(&b, &p); /* clamped: threshold 1, max >= open */
    assert_true(brk_failure(&b, 5, false));
    assert_int_equal(b.open_until, 105);
    assert_int_equal(b.p.max_open_ms, 100);
    assert_string_equal(brk_state_name(brk_state_at(&b, 5)), "open");
    assert_string_equal(brk_state_name(brk_state_at(&b, 105)), "half_open");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trips_after_threshold), cmocka_unit_test(test_half_open_single_trial),
        cmocka_unit_test(test_doubling_and_cap),      cmocka_unit_test(test_abandon_frees_trial),
        cmocka_unit_test(test_threshold_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
