/* reqfsm: the proxied request's state table, cell by cell against an independent
 * listing of the legal transitions; illegal events are logged and ignored; DONE is
 * absorbing (so the exit path runs once); every live state has its way out. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/strbuf.h"
#include "common/xalloc.h"
#include "coordinator/reqfsm.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every legal cell; anything not listed must be illegal. Written from docs/coordinator.md
 * (the request state table), not from reqfsm.c. */
static const struct {
    enum reqfsm_state from;
    enum reqfsm_event ev;
    enum reqfsm_state to;
} legal[] = {
    {REQ_ROUTING, REQ_EV_HANDOFF, REQ_PREFILL},
    {REQ_ROUTING, REQ_EV_SENT, REQ_DECODE},
    {REQ_ROUTING, REQ_EV_GIVE_UP, REQ_DONE},
    {REQ_ROUTING, REQ_EV_REJECT, REQ_DONE},
    {REQ_ROUTING, REQ_EV_CLIENT_GONE, REQ_DONE},
    {REQ_ROUTING, REQ_EV_TOKENIZE, REQ_TOKENIZING},
    {REQ_TOKENIZING, REQ_EV_TOKENIZED, REQ_ROUTING},
    {REQ_TOKENIZING, REQ_EV_REJECT, REQ_DONE},
    {REQ_TOKENIZING, REQ_EV_FIRST_TIMEOUT, REQ_DONE},
    {REQ_TOKENIZING, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_TOKENIZING, REQ_EV_CLIENT_GONE, REQ_DONE},

    {REQ_PREFILL, REQ_EV_TICKET, REQ_DECODE},
    {REQ_PREFILL, REQ_EV_RETRY, REQ_BACKOFF},
    {REQ_PREFILL, REQ_EV_PASS_THROUGH, REQ_DONE},
    {REQ_PREFILL, REQ_EV_GIVE_UP, REQ_DONE},
    {REQ_PREFILL, REQ_EV_FIRST_TIMEOUT, REQ_DONE},
    {REQ_PREFILL, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_PREFILL, REQ_EV_CLIENT_GONE, REQ_DONE},

    {REQ_DECODE, REQ_EV_PREFILL_DONE, REQ_DECODE},
    {REQ_DECODE, REQ_EV_BODY_START, REQ_BUFFERING},
    {REQ_DECODE, REQ_EV_STREAM_START, REQ_STREAMING},
    {REQ_DECODE, REQ_EV_RETRY, REQ_BACKOFF},
    {REQ_DECODE, REQ_EV_PASS_THROUGH, REQ_DONE},
    {REQ_DECODE, REQ_EV_GIVE_UP, REQ_DONE},
    {REQ_DECODE, REQ_EV_FIRST_TIMEOUT, REQ_DONE},
    {REQ_DECODE, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_DECODE, REQ_EV_CLIENT_GONE, REQ_DONE},

    {REQ_BUFFERING, REQ_EV_PREFILL_DONE, REQ_BUFFERING},
    {REQ_BUFFERING, REQ_EV_RETRY, REQ_BACKOFF},
    {REQ_BUFFERING, REQ_EV_COMPLETE, REQ_DONE},
    {REQ_BUFFERING, REQ_EV_GIVE_UP, REQ_DONE},
    {REQ_BUFFERING, REQ_EV_FAIL, REQ_DONE},
    {REQ_BUFFERING, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_BUFFERING, REQ_EV_CLIENT_GONE, REQ_DONE},

    {REQ_STREAMING, REQ_EV_PREFILL_DONE, REQ_STREAMING},
    {REQ_STREAMING, REQ_EV_COMPLETE, REQ_DONE},
    {REQ_STREAMING, REQ_EV_BROKEN, REQ_DONE},
    {REQ_STREAMING, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_STREAMING, REQ_EV_CLIENT_GONE, REQ_DONE},
    {REQ_STREAMING, REQ_EV_RESCHEDULE, REQ_RESUMING},

    {REQ_RESUMING, REQ_EV_HANDOFF, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_SENT, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_TICKET, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_PREFILL_DONE, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_STREAM_START, REQ_STREAMING},
    {REQ_RESUMING, REQ_EV_RETRY, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_RETRY_TIMER, REQ_RESUMING},
    {REQ_RESUMING, REQ_EV_PASS_THROUGH, REQ_DONE},
    {REQ_RESUMING, REQ_EV_GIVE_UP, REQ_DONE},
    {REQ_RESUMING, REQ_EV_REJECT, REQ_DONE},
    {REQ_RESUMING, REQ_EV_BROKEN, REQ_DONE},
    {REQ_RESUMING, REQ_EV_FIRST_TIMEOUT, REQ_DONE},
    {REQ_RESUMING, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_RESUMING, REQ_EV_CLIENT_GONE, REQ_DONE},

    {REQ_BACKOFF, REQ_EV_RETRY_TIMER, REQ_ROUTING},
    {REQ_BACKOFF, REQ_EV_FIRST_TIMEOUT, REQ_DONE},
    {REQ_BACKOFF, REQ_EV_TOTAL_TIMEOUT, REQ_DONE},
    {REQ_BACKOFF, REQ_EV_CLIENT_GONE, REQ_DONE},
};

static int expected(int s, int e)
{
    for (size_t i = 0; i < sizeof(legal) / sizeof(legal[0]); i++)
        if ((int)legal[i].from == s && (int)legal[i].ev == e)
            return (int)legal[i].to;
    return -1;
}

static void test_every_cell(void **state)
{
    (void)state;
    int n_legal = 0;
    for (int s = 0; s < REQ_STATE_COUNT; s++) {
        for (int e = 0; e < REQ_EV_COUNT; e++) {
            int want = expected(s, e);
            int got = reqfsm_next((enum reqfsm_state)s, (enum reqfsm_event)e);
            if (got != want)
                fail_msg("%s x %s: table says %d, expected %d",
                         reqfsm_state_name((enum reqfsm_state)s),
                         reqfsm_event_name((enum reqfsm_event)e), got, want);
            n_legal += got >= 0;
        }
    }
    assert_int_equal(n_legal, (int)(sizeof(legal) / sizeof(legal[0])));
    /* out of range: illegal, never a crash */
    assert_int_equal(reqfsm_next(REQ_STATE_COUNT, REQ_EV_SENT), -1);
    assert_int_equal(reqfsm_next(REQ_ROUTING, REQ_EV_COUNT), -1);
    assert_int_equal(reqfsm_next((enum reqfsm_state) - 1, REQ_EV_SENT), -1);
}

static void test_names(void **state)
{
    (void)state;
    /* unique, upper case, never "?" in range */
    for (int s = 0; s < REQ_STATE_COUNT; s++) {
        const char *n = reqfsm_state_name((enum reqfsm_state)s);
        assert_string_not_equal(n, "?");
        for (int t = 0; t < s; t++)
            assert_string_not_equal(n, reqfsm_state_name((enum reqfsm_state)t));
    }
    for (int e = 0; e < REQ_EV_COUNT; e++) {
        const char *n = reqfsm_event_name((enum reqfsm_event)e);
        assert_string_not_equal(n, "?");
        for (int f = 0; f < e; f++)
            assert_string_not_equal(n, reqfsm_event_name((enum reqfsm_event)f));
    }
    assert_string_equal(reqfsm_state_name(REQ_STREAMING), "STREAMING");
    assert_string_equal(reqfsm_event_name(REQ_EV_CLIENT_GONE), "CLIENT_GONE");
    assert_string_equal(reqfsm_state_name(REQ_STATE_COUNT), "?");
    assert_string_equal(reqfsm_event_name(REQ_EV_COUNT), "?");
}

/* The properties the proxy relies on. */
static void test_shape(void **state)
{
    (void)state;
    /* DONE is absorbing: a second terminal event (a second exit) is refused. */
    for (int e = 0; e < REQ_EV_COUNT; e++)
        assert_int_equal(reqfsm_next(REQ_DONE, (enum reqfsm_event)e), -1);
    /* The client may leave in every live state, and the total timeout applies wherever a
     * timer can observe the request (all but the synchronous ROUTING). */
    for (int s = 0; s < REQ_STATE_COUNT; s++) {
        if (s == REQ_DONE)
            continue;
        assert_int_equal(reqfsm_next((enum reqfsm_state)s, REQ_EV_CLIENT_GONE), REQ_DONE);
        if (s != REQ_ROUTING)
            assert_int_equal(reqfsm_next((enum reqfsm_state)s, REQ_EV_TOTAL_TIMEOUT), REQ_DONE);
    }
    /* Retries only before anything reached the client. */
    assert_int_equal(reqfsm_next(REQ_STREAMING, REQ_EV_RETRY), -1);
    assert_int_equal(reqfsm_next(REQ_BUFFERING, REQ_EV_FIRST_TIMEOUT), -1);
    /* Every state is reachable from ROUTING. */
    bool seen[REQ_STATE_COUNT] = {[REQ_ROUTING] = true};
    for (int round = 0; round < REQ_STATE_COUNT; round++)
        for (int s = 0; s < REQ_STATE_COUNT; s++)
            for (int e = 0; seen[s] && e < REQ_EV_COUNT; e++) {
                int to = reqfsm_next((enum reqfsm_state)s, (enum reqfsm_event)e);
                if (to >= 0)
                    seen[to] = true;
            }
    for (int s = 0; s < REQ_STATE_COUNT; s++)
        assert_true(seen[s]);
}

static int pipefd[2] = {-1, -1};

static char *drain(void)
{
    size_t cap = 65536, len = 0;
    char *buf = xmalloc(cap);
    ssize_t n;
    while (len + 1 < cap && (n = read(pipefd[0], buf + len, cap - len - 1)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    return buf;
}

static void test_step(void **state)
{
    (void)state;
    assert_int_equal(pipe2(pipefd, O_NONBLOCK | O_CLOEXEC), 0);
    log_set_fd(pipefd[1]);
    log_set_level(LOG_DEBUG);
    struct reqfsm_stats *st = xcalloc(1, sizeof(*st));
    struct reqfsm m;
    reqfsm_init(&m);
    assert_int_equal(reqfsm_state(&m), REQ_ROUTING);

    /* a retried union request, streamed on its second attempt */
    assert_int_equal(reqfsm_step(&m, REQ_EV_SENT, st, "r1", "single"), REQ_ROUTING);
    assert_int_equal(reqfsm_step(&m, REQ_EV_RETRY, st, "r1", "HTTP 503"), REQ_DECODE);
    assert_int_equal(reqfsm_state(&m), REQ_BACKOFF);
    assert_int_equal(reqfsm_step(&m, REQ_EV_RETRY_TIMER, st, "r1", NULL), REQ_BACKOFF);
    assert_int_equal(reqfsm_step(&m, REQ_EV_SENT, st, "r1", NULL), REQ_ROUTING);
    assert_int_equal(reqfsm_step(&m, REQ_EV_STREAM_START, st, "r1", NULL), REQ_DECODE);
    char *out = drain();
    /* every transition logged with old state, new state, event and cause */
    assert_non_null(strstr(out, "\"event\":\"request_state\",\"request_id\":\"r1\","
                                "\"from\":\"DECODE\",\"to\":\"BACKOFF\",\"trigger\":\"RETRY\","
                                "\"cause\":\"HTTP 503\""));
    free(out);

    /* an illegal event: logged at warn, counted, ignored */
    assert_int_equal(reqfsm_step(&m, REQ_EV_TICKET, st, "r1", "late ticket"), -1);
    assert_int_equal(reqfsm_state(&m), REQ_STREAMING);
    out = drain();
    assert_non_null(strstr(out, "\"level\":\"warn\""));
    assert_non_null(strstr(out, "\"event\":\"request_event_ignored\""));
    assert_non_null(strstr(out, "\"state\":\"STREAMING\",\"trigger\":\"TICKET\""));
    free(out);

    /* the end, once: a second terminal event is ignored */
    assert_int_equal(reqfsm_step(&m, REQ_EV_COMPLETE, st, "r1", NULL), REQ_STREAMING);
    assert_int_equal(reqfsm_step(&m, REQ_EV_CLIENT_GONE, st, "r1", NULL), -1);
    assert_int_equal(reqfsm_state(&m), REQ_DONE);

    char trail[128];
    reqfsm_trail(&m, trail, sizeof(trail));
    assert_string_equal(trail, "ROUTING>DECODE>BACKOFF>ROUTING>DECODE>STREAMING>DONE");
    reqfsm_trail(&m, trail, 12); /* truncated, terminated */
    assert_int_equal(strlen(trail), 11);

    /* counters by cell, rendered as Prometheus text */
    assert_int_equal(st->cell[REQ_ROUTING][REQ_EV_SENT], 2);
    assert_int_equal(st->cell[REQ_STREAMING][REQ_EV_TICKET], 1);
    assert_int_equal(st->cell[REQ_DONE][REQ_EV_CLIENT_GONE], 1);
    struct reqfsm_stats *st2 = xcalloc(1, sizeof(*st2));
    st2->cell[REQ_ROUTING][REQ_EV_SENT] = 5;
    const struct reqfsm_stats *all[] = {st, st2};
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    reqfsm_render(&sb, all, 2);
    const char *text = strbuf_str(&sb);
    assert_non_null(strstr(text, "# TYPE motor_coordinator_request_events_total counter\n"));
    assert_non_null(strstr(text, "motor_coordinator_request_events_total{from=\"ROUTING\","
                                 "event=\"SENT\",to=\"DECODE\"} 7\n"));
    assert_non_null(strstr(text, "motor_coordinator_request_events_total{from=\"STREAMING\","
                                 "event=\"COMPLETE\",to=\"DONE\"} 1\n"));
    assert_non_null(strstr(text, "motor_coordinator_request_events_ignored_total{state=\"DONE\","
                                 "event=\"CLIENT_GONE\"} 1\n"));
    assert_non_null(strstr(text, "motor_coordinator_request_events_ignored_total{state="
                                 "\"STREAMING\",event=\"TICKET\"} 1\n"));
    /* cells never hit are left out */
    assert_null(strstr(text, "PASS_THROUGH"));
    strbuf_release(&sb);

    /* no counters: still a transition */
    reqfsm_init(&m);
    assert_int_equal(reqfsm_step(&m, REQ_EV_HANDOFF, NULL, "r2", NULL), REQ_ROUTING);
    assert_int_equal(reqfsm_state(&m), REQ_PREFILL);
    /* the trail keeps the last REQFSM_TRAIL states */
    reqfsm_init(&m);
    for (int i = 0; i < 20; i++) {
        reqfsm_step(&m, REQ_EV_SENT, NULL, "r3", NULL);
        reqfsm_step(&m, REQ_EV_RETRY, NULL, "r3", NULL);
        reqfsm_step(&m, REQ_EV_RETRY_TIMER, NULL, "r3", NULL);
    }
    reqfsm_trail(&m, trail, sizeof(trail));
    assert_true(strncmp(trail, "...>", 4) == 0);
    assert_true(strlen(trail) > 4 * REQFSM_TRAIL);
    out = drain();
    free(out);
    log_set_fd(STDERR_FILENO);
    log_set_level(LOG_INFO);
    close(pipefd[0]);
    close(pipefd[1]);
    free(st);
    free(st2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cell),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
