/* The PD-group state table of precision detection and the alarm's moi. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/precision.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static void test_table(void **state)
{
    (void)state;
    static const struct {
        enum prec_state from;
        enum prec_event ev;
        int to; /* -1: refused */
    } rows[] = {
        {PREC_CLEAN, PREC_EV_ISSUE_THRESHOLD, PREC_PROBING},
        {PREC_CLEAN, PREC_EV_RAISED, -1},
        {PREC_CLEAN, PREC_EV_CLEAR_THRESHOLD, -1},
        {PREC_CLEAN, PREC_EV_CLEARED, -1},
        {PREC_CLEAN, PREC_EV_RECOVERED, PREC_CLEAN},
        /* one action at a time: no second probe while probing */
        {PREC_PROBING, PREC_EV_ISSUE_THRESHOLD, -1},
        {PREC_PROBING, PREC_EV_RAISED, PREC_ALARMED},
        {PREC_PROBING, PREC_EV_RAISE_FAILED, PREC_CLEAN},
        {PREC_PROBING, PREC_EV_CLEAR_THRESHOLD, -1},
        {PREC_PROBING, PREC_EV_RECOVERED, PREC_CLEAN},
        {PREC_ALARMED, PREC_EV_ISSUE_THRESHOLD, -1},
        {PREC_ALARMED, PREC_EV_CLEAR_THRESHOLD, PREC_CLEARING},
        {PREC_ALARMED, PREC_EV_CLEARED, -1},
        {PREC_ALARMED, PREC_EV_RECOVERED, PREC_CLEAN},
        {PREC_CLEARING, PREC_EV_CLEAR_THRESHOLD, -1},
        {PREC_CLEARING, PREC_EV_CLEARED, PREC_CLEAN},
        {PREC_CLEARING, PREC_EV_CLEAR_FAILED, PREC_ALARMED},
        {PREC_CLEARING, PREC_EV_RECOVERED, PREC_CLEAN},
        {PREC_CLEARING, PREC_EV_RAISED, -1},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        int to = prec_next(rows[r].from, rows[r].ev);
        if (to != rows[r].to)
            fail_msg("%s + %s: %d, want %d", prec_state_name(rows[r].from),
                     prec_event_name(rows[r].ev), to, rows[r].to);
    }
    /* every state leaves on the controller's clear; none is a dead end */
    for (int s = 0; s < PREC_STATE_COUNT; s++)
        assert_int_equal(prec_next((enum prec_state)s, PREC_EV_RECOVERED), PREC_CLEAN);
    assert_int_equal(prec_next(PREC_STATE_COUNT, PREC_EV_RAISED), -1);
    assert_int_equal(prec_next(PREC_CLEAN, PREC_EV_COUNT), -1);
    assert_string_equal(prec_state_name(PREC_ALARMED), "alarmed");
    assert_string_equal(prec_event_name(PREC_EV_RECOVERED), "recovered");
}

static void test_moi(void **state)
{
    (void)state;
    char *m = prec_moi("10.0.0.7", 3, 12);
    assert_string_equal(m, "service name=Coordinator, service ip=10.0.0.7, pId=3, instanceId=12");
    free(m);
    m = prec_moi("10.0.0.7", -1, 12);
    assert_string_equal(m, "service name=Coordinator, service ip=10.0.0.7, instanceId=12");
    free(m);
}

/* One claim per window, whoever asks; the first ever claim always wins. */
static void test_window(void **state)
{
    (void)state;
    _Atomic int64_t last = INT64_MIN;
    assert_true(prec_window_claim(&last, 30000, -5)); /* monotonic time may be anything */
    assert_false(prec_window_claim(&last, 30000, -5));
    assert_false(prec_window_claim(&last, 30000, 29994));
    assert_true(prec_window_claim(&last, 30000, 29995));
    assert_false(prec_window_claim(&last, 30000, 29995));
    /* interval 0: every request */
    assert_true(prec_window_claim(&last, 0, 29995));
    assert_true(prec_window_claim(&last, 0, 29995));
}

/* Threads racing for one window: exactly one claim per window. */
struct race {
    _Atomic int64_t *last;
    _Atomic int *wins;
};

static void *racer(void *arg)
{
    struct race *r = arg;
    for (int64_t t = 0; t < 20000; t++)
        if (prec_window_claim(r->last, 1000, t))
            atomic_fetch_add(r->wins, 1);
    return NULL;
}

static void test_window_race(void **state)
{
    (void)state;
    _Atomic int64_t last = INT64_MIN;
    _Atomic int wins = 0;
    struct race r = {&last, &wins};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, racer, &r);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    /* windows start at 0, 1000, ..., 19000 at the earliest: at most 20 claims, and at
     * least one per 2000 ms whatever the interleaving */
    assert_true(atomic_load(&wins) <= 20);
    assert_true(atomic_load(&wins) >= 10);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_moi),
                                       cmocka_unit_test(test_window),
                                       cmocka_unit_test(test_window_race)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
