/* The PD-group state table of precision detection and the alarm's moi. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/precision.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_moi)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
