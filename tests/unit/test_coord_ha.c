/* The coordinator's master/standby state table, cell by cell against the listing in
 * docs/coordinator.md ("Master and standby"); the breaker's new parameters on reload;
 * the settings snapshot. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/breaker.h"
#include "coordinator/coord_internal.h"
#include "coordinator/coord_settings.h"

#include <string.h>

static const char *const states[] = {"standby", "syncing", "master", "stopped"};
static const char *const events[] = {"won", "busy", "failed", "synced", "lost", "stop"};

/* state, event -> next (NULL: refused). Written from the docs, not from the code. */
static const struct {
    const char *state, *event, *next;
} listing[] = {
    {"standby", "won", "syncing"},    {"standby", "busy", "standby"},
    {"standby", "failed", "standby"}, {"standby", "stop", "stopped"},
    {"syncing", "synced", "master"},  {"syncing", "lost", "standby"},
    {"syncing", "stop", "stopped"},   {"master", "lost", "standby"},
    {"master", "stop", "stopped"},
};

static void test_table(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof(states) / sizeof(states[0]); s++) {
        for (size_t e = 0; e < sizeof(events) / sizeof(events[0]); e++) {
            const char *want = NULL;
            for (size_t k = 0; k < sizeof(listing) / sizeof(listing[0]); k++)
                if (!strcmp(listing[k].state, states[s]) && !strcmp(listing[k].event, events[e]))
                    want = listing[k].next;
            const char *got = coord_ha_next(states[s], events[e]);
            if ((want == NULL) != (got == NULL) || (want && strcmp(want, got)))
                fail_msg("%s x %s: want %s, got %s", states[s], events[e], want ? want : "refused",
                         got ? got : "refused");
        }
    }
    assert_null(coord_ha_next("nonsense", "won"));
}

static void test_breaker_params(void **state)
{
    (void)state;
    struct brk_params p = {3, 1000, 8000};
    struct brk b;
    brk_init(&b, &p);
    /* closed, one failure: a threshold of 2 now trips on the next */
    assert_false(brk_failure(&b, 0, false));
    struct brk_params q = {2, 500, 4000};
    brk_set_params(&b, &q);
    assert_int_equal(b.cur_open_ms, 500);
    assert_true(brk_failure(&b, 10, false));
    assert_int_equal(b.open_until, 510);
    /* open: the running period stands; the next one follows the new cap */
    b.cur_open_ms = 4000;
    struct brk_params r = {2, 100, 1000};
    brk_set_params(&b, &r);
    assert_int_equal(b.open_until, 510);
    assert_int_equal(b.cur_open_ms, 1000);
    /* the open period cannot fall below the base */
    struct brk_params t = {1, 2000, 100};
    brk_set_params(&b, &t);
    assert_int_equal(b.p.max_open_ms, 2000);
    assert_int_equal(b.cur_open_ms, 2000);
}

static void test_settings_snapshot(void **state)
{
    (void)state;
    struct ccfg cfg;
    ccfg_init(&cfg);
    cfg.scheduler = CCFG_SCHED_ROUND_ROBIN;
    cfg.max_retry = 4;
    cfg.transport_max_retry = -1;
    cfg.first_token_timeout_ms = 300;
    cfg.infer_timeout_ms = 5000;
    struct csettings_pub pub;
    csettings_pub_init(&pub);
    csettings_pub_set(&pub, csettings_new(&cfg, 1));
    struct csettings *held = csettings_pub_get(&pub); /* a request in flight */
    assert_int_equal(held->policy, BAL_ROUND_ROBIN);
    assert_int_equal(csettings_retry_limit(held, true), 4);
    assert_int_equal(held->sweep_ms, 30);
    cfg.transport_max_retry = 1;
    cfg.scheduler = CCFG_SCHED_LOAD_BALANCE;
    csettings_pub_set(&pub, csettings_new(&cfg, 2));
    assert_int_equal(csettings_pub_version(&pub), 2);
    /* the held snapshot is unchanged; the new one has the new values */
    assert_int_equal(held->policy, BAL_ROUND_ROBIN);
    struct csettings *now = csettings_pub_get(&pub);
    assert_int_equal(now->policy, BAL_LEAST_TOKENS);
    assert_int_equal(csettings_retry_limit(now, true), 1);
    assert_int_equal(csettings_retry_limit(now, false), 4);
    csettings_unref(held);
    csettings_unref(now);
    csettings_pub_release(&pub);
    ccfg_release(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_breaker_params),
        cmocka_unit_test(test_settings_snapshot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
