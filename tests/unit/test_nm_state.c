/* node manager state machines: the engine table (nm_engine_table) and the phase table
 * (nm_phase_table), cell by cell, their invariants, and the transition functions (one
 * log line per change; an illegal event logged and ignored, never a crash).
 *
 * The expected cells below are written per event (column by column), the tables per
 * state: two statements of the same specification, so a cell changed in one place and
 * not the other fails here. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/reactor.h"
#include "common/xalloc.h"
#include "nodemgr/nm_internal.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- log capture ------------------------------------------------------------------------- */

static int logp[2] = {-1, -1};

static void capture_begin(void)
{
    assert_int_equal(pipe2(logp, O_NONBLOCK | O_CLOEXEC), 0);
    (void)fcntl(logp[1], F_SETPIPE_SZ, 1 << 20);
    log_set_fd(logp[1]);
}

/* Everything logged since capture_begin (heap). */
static char *capture_end(void)
{
    log_set_fd(STDERR_FILENO);
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    ssize_t r;
    while (len + 1 < cap && (r = read(logp[0], buf + len, cap - len - 1)) > 0)
        len += (size_t)r;
    buf[len] = '\0';
    close(logp[0]);
    close(logp[1]);
    return buf;
}

/* ---- the engine table -------------------------------------------------------------------- */

#define S(x) NM_ES_##x
#define E(x) NM_EV_##x
#define A(x) NM_EA_##x

struct ecell {
    enum nm_engine_state s;
    enum nm_engine_event ev;
    enum nm_engine_action act;
    enum nm_engine_state next;
};

/* Every legal cell; all others must be NM_EA_ILLEGAL. */
static const struct ecell engine_cells[] = {
    /* a process was started: only where there is none and a start is allowed */
    {S(STOPPED), E(SPAWNED), A(SPAWNED), S(STARTING)},
    {S(BACKOFF), E(SPAWNED), A(SPAWNED), S(STARTING)},
    {S(FAILED), E(SPAWNED), A(SPAWNED), S(STARTING)},
    /* a local restart could not start one */
    {S(BACKOFF), E(SPAWN_FAILED), A(SPAWN_FAILED), S(STOPPED)},
    /* exit: a death where nobody asked, a stop where a stop was asked */
    {S(STARTING), E(EXITED), A(DIED), S(STOPPED)},
    {S(RUNNING), E(EXITED), A(DIED), S(STOPPED)},
    {S(READY), E(EXITED), A(DIED), S(STOPPED)},
    {S(UNHEALTHY), E(EXITED), A(DIED), S(STOPPED)},
    {S(STOPPING), E(EXITED), A(STOPPED), S(STOPPED)},
    {S(RETIRED), E(EXITED), A(DIED_RETIRED), S(RETIRED_STOPPED)},
    {S(RETIRED_STOPPING), E(EXITED), A(STOPPED), S(RETIRED_STOPPED)},
    /* lost exit event (health check); a stopping process is left to its stop */
    {S(STARTING), E(GONE), A(GONE), S(STOPPED)},
    {S(RUNNING), E(GONE), A(GONE), S(STOPPED)},
    {S(READY), E(GONE), A(GONE), S(STOPPED)},
    {S(UNHEALTHY), E(GONE), A(GONE), S(STOPPED)},
    {S(STOPPING), E(GONE), A(NONE), S(STOPPING)},
    {S(RETIRED), E(GONE), A(GONE), S(RETIRED_STOPPED)},
    {S(RETIRED_STOPPING), E(GONE), A(NONE), S(RETIRED_STOPPING)},
    /* /health (§6.5) */
    {S(STARTING), E(PROBE_OK), A(PROBED), S(READY)},
    {S(READY), E(PROBE_OK), A(PROBED), S(READY)},
    {S(UNHEALTHY), E(PROBE_OK), A(PROBED), S(READY)},
    {S(STARTING), E(PROBE_FAILED), A(PROBED), S(STARTING)},
    {S(READY), E(PROBE_FAILED), A(PROBED), S(UNHEALTHY)},
    {S(UNHEALTHY), E(PROBE_FAILED), A(PROBED), S(UNHEALTHY)},
    {S(STARTING), E(STARTUP_TIMEOUT), A(PROBED), S(UNHEALTHY)},
    {S(READY), E(STARTUP_TIMEOUT), A(PROBED), S(UNHEALTHY)},
    {S(UNHEALTHY), E(STARTUP_TIMEOUT), A(PROBED), S(UNHEALTHY)},
    /* headless: alive is all we know */
    {S(STARTING), E(ALIVE), A(PROBED), S(RUNNING)},
    {S(RUNNING), E(ALIVE), A(PROBED), S(RUNNING)},
    /* group stop */
    {S(STOPPED), E(STOP), A(NONE), S(STOPPED)},
    {S(STARTING), E(STOP), A(STOP), S(STOPPING)},
    {S(RUNNING), E(STOP), A(STOP), S(STOPPING)},
    {S(READY), E(STOP), A(STOP), S(STOPPING)},
    {S(UNHEALTHY), E(STOP), A(STOP), S(STOPPING)},
    {S(STOPPING), E(STOP), A(NONE), S(STOPPING)},
    {S(BACKOFF), E(STOP), A(CANCEL_RESTART), S(STOPPED)},
    {S(FAILED), E(STOP), A(NONE), S(FAILED)},
    {S(RETIRED), E(STOP), A(STOP), S(RETIRED_STOPPING)},
    {S(RETIRED_STOPPING), E(STOP), A(NONE), S(RETIRED_STOPPING)},
    {S(RETIRED_STOPPED), E(STOP), A(NONE), S(RETIRED_STOPPED)},
    /* kill now */
    {S(STOPPED), E(KILL), A(NONE), S(STOPPED)},
    {S(STARTING), E(KILL), A(KILL), S(STOPPED)},
    {S(RUNNING), E(KILL), A(KILL), S(STOPPED)},
    {S(READY), E(KILL), A(KILL), S(STOPPED)},
    {S(UNHEALTHY), E(KILL), A(KILL), S(STOPPED)},
    {S(STOPPING), E(KILL), A(KILL), S(STOPPED)},
    {S(BACKOFF), E(KILL), A(CANCEL_RESTART), S(STOPPED)},
    {S(FAILED), E(KILL), A(NONE), S(FAILED)},
    {S(RETIRED), E(KILL), A(KILL), S(RETIRED_STOPPED)},
    {S(RETIRED_STOPPING), E(KILL), A(KILL), S(RETIRED_STOPPED)},
    {S(RETIRED_STOPPED), E(KILL), A(NONE), S(RETIRED_STOPPED)},
    /* a launch rolled back: all or nothing; a pending restart or a give-up stays */
    {S(STOPPED), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(STARTING), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(RUNNING), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(READY), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(UNHEALTHY), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(STOPPING), E(ROLLBACK), A(ROLLBACK), S(STOPPED)},
    {S(BACKOFF), E(ROLLBACK), A(ROLLBACK), S(BACKOFF)},
    {S(FAILED), E(ROLLBACK), A(ROLLBACK), S(FAILED)},
    {S(RETIRED), E(ROLLBACK), A(NONE), S(RETIRED)},
    {S(RETIRED_STOPPING), E(ROLLBACK), A(NONE), S(RETIRED_STOPPING)},
    {S(RETIRED_STOPPED), E(ROLLBACK), A(NONE), S(RETIRED_STOPPED)},
    /* the local restart policy decides after a death */
    {S(STOPPED), E(BACKOFF), A(BACKOFF), S(BACKOFF)},
    {S(STOPPED), E(GIVE_UP), A(GIVE_UP), S(FAILED)},
    {S(BACKOFF), E(RESTART_DUE), A(RESTART), S(BACKOFF)},
    /* DP scale-down commit: idempotent */
    {S(STOPPED), E(RETIRE), A(RETIRE), S(RETIRED_STOPPED)},
    {S(STARTING), E(RETIRE), A(RETIRE), S(RETIRED)},
    {S(RUNNING), E(RETIRE), A(RETIRE), S(RETIRED)},
    {S(READY), E(RETIRE), A(RETIRE), S(RETIRED)},
    {S(UNHEALTHY), E(RETIRE), A(RETIRE), S(RETIRED)},
    {S(STOPPING), E(RETIRE), A(RETIRE), S(RETIRED_STOPPING)},
    {S(BACKOFF), E(RETIRE), A(RETIRE), S(RETIRED_STOPPED)},
    {S(FAILED), E(RETIRE), A(RETIRE), S(RETIRED_STOPPED)},
    {S(RETIRED), E(RETIRE), A(NONE), S(RETIRED)},
    {S(RETIRED_STOPPING), E(RETIRE), A(NONE), S(RETIRED_STOPPING)},
    {S(RETIRED_STOPPED), E(RETIRE), A(NONE), S(RETIRED_STOPPED)},
    /* relaunch: restart bookkeeping reset everywhere; a pending restart / give-up ends */
    {S(STOPPED), E(RESET), A(RESET), S(STOPPED)},
    {S(STARTING), E(RESET), A(RESET), S(STARTING)},
    {S(RUNNING), E(RESET), A(RESET), S(RUNNING)},
    {S(READY), E(RESET), A(RESET), S(READY)},
    {S(UNHEALTHY), E(RESET), A(RESET), S(UNHEALTHY)},
    {S(STOPPING), E(RESET), A(RESET), S(STOPPING)},
    {S(BACKOFF), E(RESET), A(RESET), S(STOPPED)},
    {S(FAILED), E(RESET), A(RESET), S(STOPPED)},
    {S(RETIRED), E(RESET), A(RESET), S(RETIRED)},
    {S(RETIRED_STOPPING), E(RESET), A(RESET), S(RETIRED_STOPPING)},
    {S(RETIRED_STOPPED), E(RESET), A(RESET), S(RETIRED_STOPPED)},
};

static const struct ecell *expected_engine(enum nm_engine_state s, enum nm_engine_event ev)
{
    for (size_t i = 0; i < sizeof(engine_cells) / sizeof(engine_cells[0]); i++)
        if (engine_cells[i].s == s && engine_cells[i].ev == ev)
            return &engine_cells[i];
    return NULL;
}

static void test_engine_every_cell(void **state)
{
    (void)state;
    size_t legal = 0;
    for (int s = 0; s < NM_ES_COUNT; s++) {
        for (int ev = 0; ev < NM_EV_COUNT; ev++) {
            const struct nm_engine_cell *c = &nm_engine_table[s][ev];
            const struct ecell *want = expected_engine(s, ev);
            if (!want) {
                if (c->act != NM_EA_ILLEGAL)
                    fail_msg("%s x %s: %s -> %s, want illegal", nm_engine_state_str(s),
                             nm_engine_event_str(ev), nm_engine_action_str(c->act),
                             nm_engine_state_str(c->next));
                continue;
            }
            legal++;
            if (c->act != want->act || c->next != want->next)
                fail_msg("%s x %s: %s -> %s, want %s -> %s", nm_engine_state_str(s),
                         nm_engine_event_str(ev), nm_engine_action_str(c->act),
                         nm_engine_state_str(c->next), nm_engine_action_str(want->act),
                         nm_engine_state_str(want->next));
        }
    }
    /* No duplicate in the expectation list. */
    assert_int_equal(legal, sizeof(engine_cells) / sizeof(engine_cells[0]));
}

/* Properties that hold whatever the table grows into. */
static void test_engine_invariants(void **state)
{
    (void)state;
    for (int s = 0; s < NM_ES_COUNT; s++) {
        assert_non_null(nm_engine_state_str(s));
        assert_string_not_equal(nm_engine_state_str(s), "?");
        for (int ev = 0; ev < NM_EV_COUNT; ev++) {
            const struct nm_engine_cell *c = &nm_engine_table[s][ev];
            if (c->act == NM_EA_ILLEGAL)
                continue;
            assert_true(c->act < NM_EA_COUNT && c->next < NM_ES_COUNT);
            bool had = nm_engine_state_has_process(s), has = nm_engine_state_has_process(c->next);
            /* Only a spawn creates a process. */
            if (!had && has)
                assert_int_equal(ev, NM_EV_SPAWNED);
            /* Only an exit, a lost exit, a kill or a rollback ends one. */
            if (had && !has)
                assert_true(ev == NM_EV_EXITED || ev == NM_EV_GONE || ev == NM_EV_KILL ||
                            ev == NM_EV_ROLLBACK);
            /* Retired is for good (until a new start replaces the endpoint), and only the
             * commit enters it. */
            if (nm_engine_state_retired(s))
                assert_true(nm_engine_state_retired(c->next));
            else if (nm_engine_state_retired(c->next))
                assert_int_equal(ev, NM_EV_RETIRE);
            /* A pending restart only from the restart policy's decision. */
            if (c->next == NM_ES_BACKOFF && s != NM_ES_BACKOFF)
                assert_int_equal(ev, NM_EV_BACKOFF);
            /* "nothing to do" never moves. */
            if (c->act == NM_EA_NONE)
                assert_int_equal(c->next, s);
        }
    }
    for (int ev = 0; ev < NM_EV_COUNT; ev++)
        assert_string_not_equal(nm_engine_event_str(ev), "?");
    for (int a = 0; a < NM_EA_COUNT; a++)
        assert_string_not_equal(nm_engine_action_str(a), "?");
    assert_string_equal(nm_engine_event_str(NM_EV_NONE), "?");
}

/* Every state is reachable from `stopped` (the state of a new endpoint). */
static void test_engine_reachable(void **state)
{
    (void)state;
    bool seen[NM_ES_COUNT] = {[NM_ES_STOPPED] = true};
    for (bool grew = true; grew;) {
        grew = false;
        for (int s = 0; s < NM_ES_COUNT; s++) {
            if (!seen[s])
                continue;
            for (int ev = 0; ev < NM_EV_COUNT; ev++) {
                const struct nm_engine_cell *c = &nm_engine_table[s][ev];
                if (c->act != NM_EA_ILLEGAL && !seen[c->next]) {
                    seen[c->next] = true;
                    grew = true;
                }
            }
        }
    }
    for (int s = 0; s < NM_ES_COUNT; s++)
        if (!seen[s])
            fail_msg("%s is unreachable", nm_engine_state_str(s));
}

/* The runtime view and the §2.9 status each state maps to (the upstream mapping itself
 * is pinned in test_nm_rules). */
static void test_engine_runtime_view(void **state)
{
    (void)state;
    static const struct {
        enum nm_engine_state s;
        enum nm_runtime rt;
        enum wire_ep_status from_normal;
    } v[] = {
        {S(STOPPED), NM_RT_STOPPED, WIRE_EP_ABNORMAL},
        {S(STARTING), NM_RT_STARTING, WIRE_EP_NORMAL},
        {S(RUNNING), NM_RT_RUNNING, WIRE_EP_WAIT2START},
        {S(READY), NM_RT_READY, WIRE_EP_NORMAL},
        {S(UNHEALTHY), NM_RT_UNHEALTHY, WIRE_EP_ABNORMAL},
        {S(STOPPING), NM_RT_STOPPING, WIRE_EP_NORMAL},
        {S(BACKOFF), NM_RT_STOPPED, WIRE_EP_ABNORMAL},
        {S(FAILED), NM_RT_STOPPED, WIRE_EP_ABNORMAL},
        {S(RETIRED), NM_RT_STOPPING, WIRE_EP_NORMAL},
        {S(RETIRED_STOPPING), NM_RT_STOPPING, WIRE_EP_NORMAL},
        {S(RETIRED_STOPPED), NM_RT_STOPPED, WIRE_EP_ABNORMAL},
    };
    assert_int_equal(sizeof(v) / sizeof(v[0]), NM_ES_COUNT);
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        assert_int_equal(nm_engine_state_runtime(v[i].s), v[i].rt);
        assert_int_equal(nm_status_from_runtime(nm_engine_state_runtime(v[i].s), WIRE_EP_NORMAL),
                         v[i].from_normal);
    }
    /* The probe outcome as an event: the startup window decides failed vs timed out. */
    assert_int_equal(nm_engine_probe_event(NM_PROBE_OK, 5000, 10), NM_EV_PROBE_OK);
    assert_int_equal(nm_engine_probe_event(NM_PROBE_FAILED, 9, 10), NM_EV_PROBE_FAILED);
    assert_int_equal(nm_engine_probe_event(NM_PROBE_FAILED, 10, 10), NM_EV_STARTUP_TIMEOUT);
    /* A probe result in a state no probe runs in changes nothing. */
    assert_int_equal(nm_runtime_after_probe(NM_RT_STOPPED, NM_PROBE_OK, 1, 10), NM_RT_STOPPED);
    assert_int_equal(nm_runtime_after_probe(NM_RT_STOPPING, NM_PROBE_OK, 1, 10), NM_RT_STOPPING);
}

/* A node manager with nothing running: enough for transitions whose actions touch only
 * the endpoint (and the phase machine, which the dispatcher tells). */
struct fixture {
    struct nodemgr nm;
    struct nm_config cfg;
    struct nm_endpoint *e;
};

static struct fixture *fixture_new(enum nm_engine_state s)
{
    struct fixture *f = xcalloc(1, sizeof(*f));
    f->nm.cfg = &f->cfg;
    f->nm.r = reactor_new();
    assert_non_null(f->nm.r);
    reactor_timer_init(&f->nm.wait_timer, NULL, NULL);
    f->e = xcalloc(1, sizeof(*f->e));
    f->e->nm = &f->nm;
    f->e->ep.id = 7;
    f->e->pid = 4242;
    f->e->state = s; /* the fixture's starting point */
    reactor_timer_init(&f->e->restart_timer, NULL, NULL);
    f->nm.eps = &f->e;
    f->nm.n_eps = 1;
    return f;
}

static void fixture_free(struct fixture *f)
{
    reactor_free(f->nm.r);
    free(f->e);
    free(f);
}

static void test_engine_illegal_event_ignored(void **state)
{
    (void)state;
    /* Every illegal cell of every state, through the real transition function. */
    for (int s = 0; s < NM_ES_COUNT; s++) {
        for (int ev = 0; ev < NM_EV_COUNT; ev++) {
            if (nm_engine_table[s][ev].act != NM_EA_ILLEGAL)
                continue;
            struct fixture *f = fixture_new(s);
            capture_begin();
            nm_engine_event(f->e, ev, "unit test");
            char *log = capture_end();
            assert_int_equal(f->e->state, s);
            assert_non_null(strstr(log, "\"event\":\"engine_event_ignored\""));
            char want[160];
            snprintf(want, sizeof(want), "\"state\":\"%s\",\"event\":\"%s\",\"cause\":\"unit test\"",
                     nm_engine_state_str(s), nm_engine_event_str(ev));
            if (!strstr(log, want))
                fail_msg("%s x %s: no ignore line in %s", nm_engine_state_str(s),
                         nm_engine_event_str(ev), log);
            assert_null(strstr(log, "\"engine_state\""));
            free(log);
            fixture_free(f);
        }
    }
    /* Out of range: ignored without a lookup. */
    struct fixture *f = fixture_new(NM_ES_READY);
    nm_engine_event(f->e, (enum nm_engine_event)(NM_EV_COUNT + 3), "garbage");
    nm_engine_event(f->e, NM_EV_NONE, "none");
    assert_int_equal(f->e->state, NM_ES_READY);
    fixture_free(f);
}

static void test_engine_transition_logged(void **state)
{
    (void)state;
    /* failed --reset--> stopped: the restart bookkeeping goes back to zero. */
    struct fixture *f = fixture_new(NM_ES_FAILED);
    f->e->backoff_ms = 4000;
    f->e->window_starts = 3;
    capture_begin();
    nm_engine_event(f->e, NM_EV_RESET, "unit test");
    char *log = capture_end();
    assert_int_equal(f->e->state, NM_ES_STOPPED);
    assert_int_equal(f->e->backoff_ms, 0);
    assert_int_equal(f->e->window_starts, 0);
    assert_non_null(strstr(log, "\"event\":\"engine_state\",\"endpoint_id\":7,\"pid\":4242,"
                                "\"from\":\"failed\",\"to\":\"stopped\",\"event\":\"reset\","
                                "\"cause\":\"unit test\""));
    free(log);
    /* A legal cell that does not move logs nothing. */
    capture_begin();
    nm_engine_event(f->e, NM_EV_STOP, "unit test");
    log = capture_end();
    assert_int_equal(f->e->state, NM_ES_STOPPED);
    assert_null(strstr(log, "engine_state"));
    free(log);
    /* retire: logged once, idempotent after. */
    capture_begin();
    nm_engine_event(f->e, NM_EV_RETIRE, "unit test");
    nm_engine_event(f->e, NM_EV_RETIRE, "unit test");
    log = capture_end();
    assert_int_equal(f->e->state, NM_ES_RETIRED_STOPPED);
    assert_true(nm_engine_retired(f->e));
    char *first = strstr(log, "\"endpoint_retired\"");
    assert_non_null(first);
    assert_null(strstr(first + 1, "\"endpoint_retired\""));
    free(log);
    fixture_free(f);
}

/* ---- the phase table --------------------------------------------------------------------- */

#define P(x) NM_PH_##x
#define PE(x) NM_PEV_##x
#define PA(x) NM_PA_##x

struct pcell {
    enum nm_phase p;
    enum nm_phase_event ev;
    enum nm_phase_action act;
    enum nm_phase next;
};

static const struct pcell phase_cells[] = {
    /* start: old engines first when some are alive */
    {P(IDLE), PE(START), PA(STOP_FOR_START), P(STOPPING_FOR_START)},
    {P(STARTING), PE(START), PA(STOP_FOR_START), P(STOPPING_FOR_START)},
    {P(RUNNING), PE(START), PA(STOP_FOR_START), P(STOPPING_FOR_START)},
    {P(STOPPING_FOR_START), PE(START), PA(REJECT_BUSY), P(STOPPING_FOR_START)},
    {P(RELAUNCH_STOPPING), PE(START), PA(REJECT_BUSY), P(RELAUNCH_STOPPING)},
    {P(RELAUNCHING), PE(START), PA(REJECT_BUSY), P(RELAUNCHING)},
    {P(EXITING), PE(START), PA(REJECT_STOPPING), P(EXITING)},
    {P(SHUTTING_DOWN), PE(START), PA(REJECT_STOPPING), P(SHUTTING_DOWN)},
    /* start, nothing alive: at once */
    {P(IDLE), PE(LAUNCH), PA(LAUNCH), P(STARTING)},
    {P(STARTING), PE(LAUNCH), PA(LAUNCH), P(STARTING)},
    {P(RUNNING), PE(LAUNCH), PA(LAUNCH), P(STARTING)},
    {P(STOPPING_FOR_START), PE(LAUNCH), PA(REJECT_BUSY), P(STOPPING_FOR_START)},
    {P(RELAUNCH_STOPPING), PE(LAUNCH), PA(REJECT_BUSY), P(RELAUNCH_STOPPING)},
    {P(RELAUNCHING), PE(LAUNCH), PA(REJECT_BUSY), P(RELAUNCHING)},
    {P(EXITING), PE(LAUNCH), PA(REJECT_STOPPING), P(EXITING)},
    {P(SHUTTING_DOWN), PE(LAUNCH), PA(REJECT_STOPPING), P(SHUTTING_DOWN)},
    /* relaunch (serialized until its engines are ready) */
    {P(IDLE), PE(RELAUNCH), PA(RELAUNCH_STOP), P(RELAUNCH_STOPPING)},
    {P(STARTING), PE(RELAUNCH), PA(RELAUNCH_STOP), P(RELAUNCH_STOPPING)},
    {P(RUNNING), PE(RELAUNCH), PA(RELAUNCH_STOP), P(RELAUNCH_STOPPING)},
    {P(STOPPING_FOR_START), PE(RELAUNCH), PA(REJECT_BUSY), P(STOPPING_FOR_START)},
    {P(RELAUNCH_STOPPING), PE(RELAUNCH), PA(REJECT_BUSY), P(RELAUNCH_STOPPING)},
    {P(RELAUNCHING), PE(RELAUNCH), PA(REJECT_BUSY), P(RELAUNCHING)},
    {P(EXITING), PE(RELAUNCH), PA(REJECT_STOPPING), P(EXITING)},
    {P(SHUTTING_DOWN), PE(RELAUNCH), PA(REJECT_STOPPING), P(SHUTTING_DOWN)},
    /* POST /stop: from anything but itself and the shutdown */
    {P(IDLE), PE(STOP), PA(EXIT), P(EXITING)},
    {P(STOPPING_FOR_START), PE(STOP), PA(EXIT), P(EXITING)},
    {P(STARTING), PE(STOP), PA(EXIT), P(EXITING)},
    {P(RUNNING), PE(STOP), PA(EXIT), P(EXITING)},
    {P(RELAUNCH_STOPPING), PE(STOP), PA(EXIT), P(EXITING)},
    {P(RELAUNCHING), PE(STOP), PA(EXIT), P(EXITING)},
    {P(EXITING), PE(STOP), PA(REJECT_BUSY), P(EXITING)},
    {P(SHUTTING_DOWN), PE(STOP), PA(REJECT_STOPPING), P(SHUTTING_DOWN)},
    /* shutdown: from everywhere, once */
    {P(IDLE), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(STOPPING_FOR_START), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(STARTING), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(RUNNING), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(RELAUNCH_STOPPING), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(RELAUNCHING), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(EXITING), PE(SHUTDOWN), PA(SHUTDOWN), P(SHUTTING_DOWN)},
    {P(SHUTTING_DOWN), PE(SHUTDOWN), PA(NONE), P(SHUTTING_DOWN)},
    /* the group stop a phase asked for is over */
    {P(STOPPING_FOR_START), PE(ENGINES_STOPPED), PA(LAUNCH), P(STARTING)},
    {P(RELAUNCH_STOPPING), PE(ENGINES_STOPPED), PA(RESPAWN), P(RELAUNCHING)},
    {P(EXITING), PE(ENGINES_STOPPED), PA(ABANDON), P(EXITING)},
    {P(SHUTTING_DOWN), PE(ENGINES_STOPPED), PA(ABANDON), P(SHUTTING_DOWN)},
    /* /stop's services are down */
    {P(EXITING), PE(SERVICES_STOPPED), PA(EXIT_SOON), P(EXITING)},
    {P(SHUTTING_DOWN), PE(SERVICES_STOPPED), PA(ANSWER_STOP), P(SHUTTING_DOWN)},
    /* an engine changed: only the readiness waits look */
    {P(IDLE), PE(ENGINES_CHANGED), PA(NONE), P(IDLE)},
    {P(STOPPING_FOR_START), PE(ENGINES_CHANGED), PA(NONE), P(STOPPING_FOR_START)},
    {P(STARTING), PE(ENGINES_CHANGED), PA(CHECK_START), P(STARTING)},
    {P(RUNNING), PE(ENGINES_CHANGED), PA(NONE), P(RUNNING)},
    {P(RELAUNCH_STOPPING), PE(ENGINES_CHANGED), PA(NONE), P(RELAUNCH_STOPPING)},
    {P(RELAUNCHING), PE(ENGINES_CHANGED), PA(CHECK_RELAUNCH), P(RELAUNCHING)},
    {P(EXITING), PE(ENGINES_CHANGED), PA(NONE), P(EXITING)},
    {P(SHUTTING_DOWN), PE(ENGINES_CHANGED), PA(NONE), P(SHUTTING_DOWN)},
    /* the waits end */
    {P(STARTING), PE(READY), PA(STARTED), P(RUNNING)},
    {P(RELAUNCHING), PE(READY), PA(RELAUNCHED), P(RUNNING)},
    {P(RELAUNCHING), PE(ENGINE_LOST), PA(RELAUNCH_NOT_READY), P(RUNNING)},
    {P(STARTING), PE(WAIT_TIMEOUT), PA(START_NOT_READY), P(RUNNING)},
    {P(RELAUNCHING), PE(WAIT_TIMEOUT), PA(RELAUNCH_NOT_READY), P(RUNNING)},
    {P(STARTING), PE(LAUNCH_FAILED), PA(NONE), P(IDLE)},
    {P(RELAUNCHING), PE(LAUNCH_FAILED), PA(NONE), P(RUNNING)},
};

static const struct pcell *expected_phase(enum nm_phase p, enum nm_phase_event ev)
{
    for (size_t i = 0; i < sizeof(phase_cells) / sizeof(phase_cells[0]); i++)
        if (phase_cells[i].p == p && phase_cells[i].ev == ev)
            return &phase_cells[i];
    return NULL;
}

static void test_phase_every_cell(void **state)
{
    (void)state;
    size_t legal = 0;
    for (int p = 0; p < NM_PH_COUNT; p++) {
        for (int ev = 0; ev < NM_PEV_COUNT; ev++) {
            const struct nm_phase_cell *c = &nm_phase_table[p][ev];
            const struct pcell *want = expected_phase(p, ev);
            if (!want) {
                if (c->act != NM_PA_ILLEGAL)
                    fail_msg("%s x %s: %s -> %s, want illegal", nm_phase_str(p),
                             nm_phase_event_str(ev), nm_phase_action_str(c->act),
                             nm_phase_str(c->next));
                continue;
            }
            legal++;
            if (c->act != want->act || c->next != want->next)
                fail_msg("%s x %s: %s -> %s, want %s -> %s", nm_phase_str(p),
                         nm_phase_event_str(ev), nm_phase_action_str(c->act),
                         nm_phase_str(c->next), nm_phase_action_str(want->act),
                         nm_phase_str(want->next));
        }
    }
    assert_int_equal(legal, sizeof(phase_cells) / sizeof(phase_cells[0]));
}

static void test_phase_invariants(void **state)
{
    (void)state;
    bool seen[NM_PH_COUNT] = {[NM_PH_IDLE] = true};
    for (int p = 0; p < NM_PH_COUNT; p++) {
        assert_string_not_equal(nm_phase_str(p), "?");
        /* A start and a launch are refused alike (the handler reads one verdict). */
        assert_int_equal(nm_phase_table[p][NM_PEV_START].act == NM_PA_REJECT_BUSY,
                         nm_phase_table[p][NM_PEV_LAUNCH].act == NM_PA_REJECT_BUSY);
        assert_int_equal(nm_phase_table[p][NM_PEV_START].act == NM_PA_REJECT_STOPPING,
                         nm_phase_table[p][NM_PEV_LAUNCH].act == NM_PA_REJECT_STOPPING);
        /* Every phase can be shut down, and the shutdown is final. */
        assert_int_equal(nm_phase_table[p][NM_PEV_SHUTDOWN].next, NM_PH_SHUTTING_DOWN);
        for (int ev = 0; ev < NM_PEV_COUNT; ev++) {
            const struct nm_phase_cell *c = &nm_phase_table[p][ev];
            if (c->act == NM_PA_ILLEGAL)
                continue;
            assert_true(c->act < NM_PA_COUNT && c->next < NM_PH_COUNT);
            if (c->act == NM_PA_NONE && ev != NM_PEV_LAUNCH_FAILED)
                assert_int_equal(c->next, p);
            if (c->act == NM_PA_REJECT_BUSY || c->act == NM_PA_REJECT_STOPPING)
                assert_int_equal(c->next, p);
            if (p == NM_PH_SHUTTING_DOWN)
                assert_int_equal(c->next, NM_PH_SHUTTING_DOWN);
            /* Once /stop is accepted nothing but the shutdown follows. */
            if (p == NM_PH_EXITING)
                assert_true(c->next == NM_PH_EXITING || c->next == NM_PH_SHUTTING_DOWN);
            /* Requests are refused with 503 once stopping. */
            if ((p == NM_PH_EXITING || p == NM_PH_SHUTTING_DOWN) &&
                (ev == NM_PEV_START || ev == NM_PEV_LAUNCH || ev == NM_PEV_RELAUNCH))
                assert_int_equal(c->act, NM_PA_REJECT_STOPPING);
        }
    }
    /* Every phase reachable from idle. */
    for (bool grew = true; grew;) {
        grew = false;
        for (int p = 0; p < NM_PH_COUNT; p++)
            for (int ev = 0; seen[p] && ev < NM_PEV_COUNT; ev++) {
                const struct nm_phase_cell *c = &nm_phase_table[p][ev];
                if (c->act != NM_PA_ILLEGAL && !seen[c->next])
                    grew = seen[c->next] = true;
            }
    }
    for (int p = 0; p < NM_PH_COUNT; p++)
        if (!seen[p])
            fail_msg("%s is unreachable", nm_phase_str(p));
    /* Both readiness waits always end: ready, timeout, or a failed launch. */
    static const enum nm_phase waits[] = {NM_PH_STARTING, NM_PH_RELAUNCHING};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(nm_phase_table[waits[i]][NM_PEV_READY].next, NM_PH_RUNNING);
        assert_int_not_equal(nm_phase_table[waits[i]][NM_PEV_WAIT_TIMEOUT].next, waits[i]);
        assert_int_not_equal(nm_phase_table[waits[i]][NM_PEV_LAUNCH_FAILED].next, waits[i]);
    }
    for (int ev = 0; ev < NM_PEV_COUNT; ev++)
        assert_string_not_equal(nm_phase_event_str(ev), "?");
    for (int a = 0; a < NM_PA_COUNT; a++)
        assert_string_not_equal(nm_phase_action_str(a), "?");
}

static void test_phase_illegal_event_ignored(void **state)
{
    (void)state;
    for (int p = 0; p < NM_PH_COUNT; p++) {
        for (int ev = 0; ev < NM_PEV_COUNT; ev++) {
            enum nm_phase_action a = nm_phase_table[p][ev].act;
            if (a != NM_PA_ILLEGAL && a != NM_PA_REJECT_BUSY && a != NM_PA_REJECT_STOPPING)
                continue;
            struct fixture *f = fixture_new(NM_ES_STOPPED);
            f->nm.phase = p;
            assert_int_equal(nm_phase_verdict(&f->nm, ev), a);
            enum log_level old = log_get_level();
            log_set_level(LOG_DEBUG);
            capture_begin();
            nm_phase_event(&f->nm, ev, "unit test");
            char *log = capture_end();
            log_set_level(old);
            assert_int_equal(f->nm.phase, p);
            assert_int_equal(f->nm.phq.n, 0);
            assert_int_equal(f->nm.phq.running, 0);
            char want[160];
            snprintf(want, sizeof(want), "\"phase\":\"%s\",\"event\":\"%s\",\"cause\":\"unit test\"",
                     nm_phase_str(p), nm_phase_event_str(ev));
            assert_non_null(strstr(log, a == NM_PA_ILLEGAL ? "\"nm_phase_event_ignored\""
                                                            : "\"nm_phase_event_refused\""));
            if (!strstr(log, want))
                fail_msg("%s x %s: no ignore line in %s", nm_phase_str(p), nm_phase_event_str(ev),
                         log);
            assert_null(strstr(log, "\"event\":\"nm_phase\""));
            free(log);
            fixture_free(f);
        }
    }
    struct fixture *f = fixture_new(NM_ES_STOPPED);
    f->nm.phase = NM_PH_RUNNING;
    nm_phase_event(&f->nm, (enum nm_phase_event)(NM_PEV_COUNT + 1), "garbage");
    nm_phase_event(&f->nm, NM_PEV_NONE, "none");
    assert_int_equal(nm_phase_verdict(&f->nm, (enum nm_phase_event)NM_PEV_COUNT), NM_PA_ILLEGAL);
    assert_int_equal(f->nm.phase, NM_PH_RUNNING);
    fixture_free(f);
}

static void test_phase_transition_logged(void **state)
{
    (void)state;
    /* starting --launch_failed--> idle: one line, and the readiness timer is over. */
    struct fixture *f = fixture_new(NM_ES_STOPPED);
    f->nm.phase = NM_PH_STARTING;
    reactor_timer_start(f->nm.r, &f->nm.wait_timer, 60000, 0);
    assert_true(reactor_timer_active(&f->nm.wait_timer));
    capture_begin();
    nm_phase_event(&f->nm, NM_PEV_LAUNCH_FAILED, "unit test");
    char *log = capture_end();
    assert_int_equal(f->nm.phase, NM_PH_IDLE);
    assert_false(reactor_timer_active(&f->nm.wait_timer));
    assert_non_null(strstr(log, "\"event\":\"nm_phase\",\"from\":\"starting\",\"to\":\"idle\","
                                "\"event\":\"launch_failed\",\"cause\":\"unit test\""));
    free(log);
    /* An engine transition reaches the phase machine (the dispatcher): in starting, the
     * readiness check runs; the one endpoint is not ready, so nothing moves. */
    f->nm.phase = NM_PH_STARTING;
    capture_begin();
    nm_engine_event(f->e, NM_EV_RETIRE, "unit test");
    log = capture_end();
    assert_int_equal(f->e->state, NM_ES_RETIRED_STOPPED);
    assert_int_equal(f->nm.phase, NM_PH_STARTING);
    assert_null(strstr(log, "ignored"));
    free(log);
    fixture_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_every_cell),
        cmocka_unit_test(test_engine_invariants),
        cmocka_unit_test(test_engine_reachable),
        cmocka_unit_test(test_engine_runtime_view),
        cmocka_unit_test(test_engine_illegal_event_ignored),
        cmocka_unit_test(test_engine_transition_logged),
        cmocka_unit_test(test_phase_every_cell),
        cmocka_unit_test(test_phase_invariants),
        cmocka_unit_test(test_phase_illegal_event_ignored),
        cmocka_unit_test(test_phase_transition_logged),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
