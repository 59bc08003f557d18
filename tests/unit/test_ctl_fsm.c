/* ctl_fsm: the controller's strategy tables (engine relaunch, DP scale-down), the FT
 * runtime's phase table and the fault manager's recovery table, every state x event cell
 * against an independent listing (docs/controller.md); the one transition function logs
 * old/new/trigger/cause, and logs and ignores illegal events; terminal states have no
 * way out, every state is reachable. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/xalloc.h"
#include "controller/ctl_ft.h"
#include "controller/ctl_fsm.h"
#include "controller/ctl_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cell {
    const char *from, *event, *to;
};

/* Every legal cell of a machine, by name. */
struct listing {
    const struct ctl_fsm *fsm;
    const struct cell *cells;
    size_t n;
    const char *const *terminal; /* NULL-terminated */
    const char *initial;
};

static const struct cell relaunch_cells[] = {
    {"INIT", "START", "PROBE"},
    {"INIT", "DETACH", "DETACHED"},
    {"PROBE", "ALL_OK", "DISPATCH"},
    {"PROBE", "RETRY", "PROBE"},
    {"PROBE", "EXHAUSTED", "RESTART_CONTAINER"},
    {"PROBE", "DEADLINE", "RESTART_CONTAINER"},
    {"PROBE", "DETACH", "DETACHED"},
    {"DISPATCH", "ALL_OK", "POLL"},
    {"DISPATCH", "RETRY", "DISPATCH"},
    {"DISPATCH", "EXHAUSTED", "RESTART_CONTAINER"},
    {"DISPATCH", "DEADLINE", "RESTART_CONTAINER"},
    {"DISPATCH", "DETACH", "DETACHED"},
    {"POLL", "DEADLINE", "RESTART_CONTAINER"},
    {"POLL", "NOT_YET", "POLL"},
    {"POLL", "RECOVERED", "SUCCESS"},
    {"POLL", "INSTANCE_GONE", "SUCCESS"},
    {"POLL", "NM_UNREACHABLE", "RESTART_CONTAINER"},
    {"POLL", "DETACH", "DETACHED"},
    {"RESTART_CONTAINER", "ABORTS_SENT", "FAILED"},
    {"RESTART_CONTAINER", "DETACH", "DETACHED"},
};
static const char *const relaunch_terminal[] = {"SUCCESS", "FAILED", "DETACHED", NULL};

#define LIVE(s)                                                                                    \
    {s, "FAIL", "FAILED"},                                                                         \
    {                                                                                              \
        s, "DETACH", "DETACHED"                                                                    \
    }
static const struct cell scaledown_cells[] = {
    {"DECIDING", "CANDIDATES", "VERIFY"},
    LIVE("DECIDING"),
    {"VERIFY", "NOTHING_DEAD", "SUCCESS"},
    {"VERIFY", "PLANNED", "GUARD"},
    LIVE("VERIFY"),
    {"GUARD", "ROUND_OK", "WAIT_APPLY_READY"},
    LIVE("GUARD"),
    {"WAIT_APPLY_READY", "NOT_READY", "WAIT_APPLY_READY"},
    {"WAIT_APPLY_READY", "READY", "WITHDRAW"},
    LIVE("WAIT_APPLY_READY"),
    {"WITHDRAW", "WITHDRAWN", "APPLY"},
    LIVE("WITHDRAW"),
    {"APPLY", "ROUND_OK", "WAIT_HEALTHY"},
    LIVE("APPLY"),
    {"WAIT_HEALTHY", "NOT_READY", "WAIT_HEALTHY"},
    {"WAIT_HEALTHY", "READY", "COMMIT"},
    LIVE("WAIT_HEALTHY"),
    {"COMMIT", "ROUND_OK", "CLEANUP"},
    LIVE("COMMIT"),
    {"CLEANUP", "CLEANED_UP", "SUCCESS"},
    {"CLEANUP", "DETACH", "DETACHED"},
};
#undef LIVE
static const char *const scaledown_terminal[] = {"SUCCESS", "FAILED", "DETACHED", NULL};

#define RECONF(s)                                                                                  \
    {                                                                                              \
        s, "RECONFIGURE", "RECONFIGURING"                                                          \
    }
static const struct cell ft_cells[] = {
    {"DISABLED", "SCALE_DOWN", "DECIDING"},
    RECONF("DISABLED"),
    {"DISABLED", "RESUME", "NORMAL"},
    {"DISABLED", "RESUME_SCALED", "SCALED_DOWN_RUNNING"},
    {"NORMAL", "SCALE_DOWN", "DECIDING"},
    RECONF("NORMAL"),
    {"DECIDING", "WAIT_FAULT", "WAITING_ENGINE_FAULT"},
    {"DECIDING", "WITHDRAWN", "SCALING_DOWN"},
    {"DECIDING", "FAILED", "RECONFIGURING"},
    RECONF("DECIDING"),
    {"DECIDING", "RESUME", "NORMAL"},
    {"DECIDING", "RESUME_SCALED", "SCALED_DOWN_RUNNING"},
    {"WAITING_ENGINE_FAULT", "WAIT_FAULT", "WAITING_ENGINE_FAULT"},
    {"WAITING_ENGINE_FAULT", "WITHDRAWN", "SCALING_DOWN"},
    {"WAITING_ENGINE_FAULT", "FAILED", "RECONFIGURING"},
    RECONF("WAITING_ENGINE_FAULT"),
    {"SCALING_DOWN", "COMMITTED", "POST_SCALE_CLEANUP"},
    {"SCALING_DOWN", "FAILED", "RECONFIGURING"},
    RECONF("SCALING_DOWN"),
    {"POST_SCALE_CLEANUP", "CLEANED_UP", "SCALED_DOWN_RUNNING"},
    RECONF("POST_SCALE_CLEANUP"),
    {"SCALED_DOWN_RUNNING", "SCALE_DOWN", "DECIDING"},
    RECONF("SCALED_DOWN_RUNNING"),
    RECONF("RECONFIGURING"),
    {"RECONFIGURING", "RESUME", "NORMAL"},
    {"RECONFIGURING", "RESUME_SCALED", "SCALED_DOWN_RUNNING"},
};
#undef RECONF
static const char *const ft_terminal[] = {NULL};

static const struct cell recovery_cells[] = {
    {"IDLE", "DEAD_SCALABLE", "DpScaleDownStrategy"},
    {"IDLE", "DEAD_RELAUNCH", "EngineRelaunchStrategy"},
    {"IDLE", "DEAD_NO_STRATEGY", "IDLE"},
    {"IDLE", "FALLBACK_RELAUNCH", "EngineRelaunchStrategy"},
    {"IDLE", "FALLBACK_RECONFIGURE", "InstanceReconfigurationStrategy"},
    {"IDLE", "RECONFIGURE", "InstanceReconfigurationStrategy"},
    {"DpScaleDownStrategy", "RECOVERED", "IDLE"},
    {"DpScaleDownStrategy", "FALLBACK_RELAUNCH", "EngineRelaunchStrategy"},
    {"DpScaleDownStrategy", "FALLBACK_RECONFIGURE", "InstanceReconfigurationStrategy"},
    {"DpScaleDownStrategy", "START_FAILED", "IDLE"},
    {"DpScaleDownStrategy", "RECONFIGURE", "InstanceReconfigurationStrategy"},
    {"EngineRelaunchStrategy", "RECOVERED", "IDLE"},
    {"EngineRelaunchStrategy", "FAILED_RECONFIGURE", "InstanceReconfigurationStrategy"},
    {"EngineRelaunchStrategy", "EXHAUSTED", "IDLE"},
    {"EngineRelaunchStrategy", "START_FAILED", "IDLE"},
    {"EngineRelaunchStrategy", "RECONFIGURE", "InstanceReconfigurationStrategy"},
};
static const char *const recovery_terminal[] = {"InstanceReconfigurationStrategy", NULL};

#define N(a) (sizeof(a) / sizeof((a)[0]))
static const struct listing listings[] = {
    {&ctl_relaunch_fsm, relaunch_cells, N(relaunch_cells), relaunch_terminal, "INIT"},
    {&ctl_scaledown_fsm, scaledown_cells, N(scaledown_cells), scaledown_terminal, "DECIDING"},
    {&ctl_ft_phase_fsm, ft_cells, N(ft_cells), ft_terminal, "NORMAL"},
    {&ctl_recovery_fsm, recovery_cells, N(recovery_cells), recovery_terminal, "IDLE"},
};

static int state_of(const struct ctl_fsm *f, const char *name)
{
    for (int s = 0; s < f->n_states; s++)
        if (strcmp(ctl_fsm_state_name(f, s), name) == 0)
            return s;
    fail_msg("%s: no state %s", f->name, name);
    return -1;
}

static int event_of(const struct ctl_fsm *f, const char *name)
{
    for (int e = 0; e < f->n_events; e++)
        if (strcmp(ctl_fsm_event_name(f, e), name) == 0)
            return e;
    fail_msg("%s: no event %s", f->name, name);
    return -1;
}

static void test_every_cell(void **state)
{
    (void)state;
    for (size_t m = 0; m < N(listings); m++) {
        const struct listing *l = &listings[m];
        const struct ctl_fsm *f = l->fsm;
        /* the listing's own cells resolve, and are unique */
        int *want = xcalloc((size_t)(f->n_states * f->n_events), sizeof(int));
        for (int i = 0; i < f->n_states * f->n_events; i++)
            want[i] = -1;
        for (size_t i = 0; i < l->n; i++) {
            int s = state_of(f, l->cells[i].from), e = event_of(f, l->cells[i].event);
            assert_int_equal(want[s * f->n_events + e], -1);
            want[s * f->n_events + e] = state_of(f, l->cells[i].to);
        }
        for (int s = 0; s < f->n_states; s++)
            for (int e = 0; e < f->n_events; e++) {
                int got = ctl_fsm_next(f, s, e);
                if (got != want[s * f->n_events + e])
                    fail_msg("%s: %s x %s -> %s, expected %s", f->name, ctl_fsm_state_name(f, s),
                             ctl_fsm_event_name(f, e), ctl_fsm_state_name(f, got),
                             ctl_fsm_state_name(f, want[s * f->n_events + e]));
            }
        free(want);
        /* out of range is illegal, never a crash */
        assert_int_equal(ctl_fsm_next(f, -1, 0), -1);
        assert_int_equal(ctl_fsm_next(f, f->n_states, 0), -1);
        assert_int_equal(ctl_fsm_next(f, 0, f->n_events), -1);
        assert_string_equal(ctl_fsm_state_name(f, f->n_states), "?");
        assert_string_equal(ctl_fsm_event_name(f, -1), "?");
    }
}

static void test_shape(void **state)
{
    (void)state;
    for (size_t m = 0; m < N(listings); m++) {
        const struct listing *l = &listings[m];
        const struct ctl_fsm *f = l->fsm;
        assert_true(f->n_states <= 32);
        /* names unique */
        for (int s = 0; s < f->n_states; s++)
            for (int t = 0; t < s; t++)
                assert_string_not_equal(ctl_fsm_state_name(f, s), ctl_fsm_state_name(f, t));
        for (int e = 0; e < f->n_events; e++)
            for (int g = 0; g < e; g++)
                assert_string_not_equal(ctl_fsm_event_name(f, e), ctl_fsm_event_name(f, g));
        /* terminal exactly as listed, and terminal states have no way out */
        for (int s = 0; s < f->n_states; s++) {
            bool listed = false;
            for (const char *const *t = l->terminal; *t; t++)
                listed |= strcmp(*t, ctl_fsm_state_name(f, s)) == 0;
            assert_int_equal(ctl_fsm_terminal(f, s), listed);
            for (int e = 0; listed && e < f->n_events; e++)
                assert_int_equal(ctl_fsm_next(f, s, e), -1);
        }
        /* every state reachable from the initial one (DISABLED is never entered) */
        bool seen[32] = {false};
        seen[state_of(f, l->initial)] = true;
        for (int round = 0; round < f->n_states; round++)
            for (int s = 0; s < f->n_states; s++)
                for (int e = 0; seen[s] && e < f->n_events; e++) {
                    int to = ctl_fsm_next(f, s, e);
                    if (to >= 0)
                        seen[to] = true;
                }
        for (int s = 0; s < f->n_states; s++)
            if (!seen[s] && strcmp(ctl_fsm_state_name(f, s), "DISABLED") != 0)
                fail_msg("%s: %s unreachable", f->name, ctl_fsm_state_name(f, s));
    }
    /* The strategies can be detached in every live state. */
    const struct ctl_fsm *strategies[] = {&ctl_relaunch_fsm, &ctl_scaledown_fsm};
    for (size_t m = 0; m < N(strategies); m++) {
        const struct ctl_fsm *f = strategies[m];
        int detach = event_of(f, "DETACH"), detached = state_of(f, "DETACHED");
        for (int s = 0; s < f->n_states; s++)
            if (!ctl_fsm_terminal(f, s))
                assert_int_equal(ctl_fsm_next(f, s, detach), detached);
    }
    /* The FT runtime can be escalated from every phase. */
    for (int p = 0; p < FT_PHASE_COUNT; p++)
        assert_int_equal(ctl_fsm_next(&ctl_ft_phase_fsm, p, FT_EV_RECONFIGURE), FT_RECONFIGURING);
    /* the table's phase names are the runtime's */
    for (int p = 0; p < FT_PHASE_COUNT; p++)
        assert_string_equal(ctl_fsm_state_name(&ctl_ft_phase_fsm, p),
                            ctl_ft_phase_name((enum ctl_ft_phase)p));
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

static void test_step_logs(void **state)
{
    (void)state;
    assert_int_equal(pipe2(pipefd, O_NONBLOCK | O_CLOEXEC), 0);
    log_set_fd(pipefd[1]);
    log_set_level(LOG_DEBUG);
    const struct ctl_fsm *f = &ctl_relaunch_fsm;
    int st = state_of(f, "INIT");
    assert_int_equal(ctl_fsm_step(f, &st, event_of(f, "START"), 7, "probing"), 0);
    assert_string_equal(ctl_fsm_state_name(f, st), "PROBE");
    char *out = drain();
    assert_non_null(strstr(out, "\"level\":\"info\""));
    assert_non_null(strstr(out, "\"event\":\"state_transition\",\"machine\":"
                                "\"EngineRelaunchStrategy\",\"instance_id\":7,\"from\":\"INIT\","
                                "\"to\":\"PROBE\",\"trigger\":\"START\",\"cause\":\"probing\""));
    free(out);
    /* staying in a state (another round) is logged at debug */
    assert_int_equal(ctl_fsm_step(f, &st, event_of(f, "RETRY"), 7, "nm down"),
                     state_of(f, "PROBE"));
    out = drain();
    assert_non_null(strstr(out, "\"level\":\"debug\""));
    assert_non_null(strstr(out, "\"from\":\"PROBE\",\"to\":\"PROBE\""));
    free(out);
    /* illegal: logged at warn, state unchanged */
    assert_int_equal(ctl_fsm_step(f, &st, event_of(f, "RECOVERED"), 7, "late"), -1);
    assert_string_equal(ctl_fsm_state_name(f, st), "PROBE");
    out = drain();
    assert_non_null(strstr(out, "\"level\":\"warn\""));
    assert_non_null(strstr(out, "\"event\":\"state_event_ignored\""));
    assert_non_null(strstr(out, "\"state\":\"PROBE\",\"trigger\":\"RECOVERED\""));
    free(out);
    assert_int_equal(ctl_fsm_step(f, &st, 99, 7, NULL), -1);

    /* The FT runtime: through the table, into the history; illegal ignored. */
    struct ctl_ft_rt *rt = ctl_ft_rt_new(3, "job");
    rt->dirty = false;
    assert_int_equal(ctl_ft_event(rt, FT_EV_COMMITTED, "out of order"), -ENOENT);
    assert_int_equal(rt->phase, FT_NORMAL);
    assert_false(rt->dirty);
    assert_int_equal(json_array_size(rt->history), 0);
    assert_int_equal(ctl_ft_event(rt, FT_EV_SCALE_DOWN, "dead"), 0);
    assert_int_equal(ctl_ft_event(rt, FT_EV_WAIT_FAULT, "wait"), 0);
    assert_int_equal(ctl_ft_event(rt, FT_EV_WAIT_FAULT, "wait"), 0); /* stays: no history */
    assert_int_equal(rt->phase, FT_WAITING_ENGINE_FAULT);
    assert_true(rt->dirty);
    assert_int_equal(json_array_size(rt->history), 2);
    assert_int_equal(ctl_ft_event(rt, FT_EV_FAILED, "x"), 0);
    assert_int_equal(ctl_ft_resume_event(rt), FT_EV_RESUME);
    ctl_ids_add(&rt->committed, &rt->n_committed, 1);
    assert_int_equal(ctl_ft_resume_event(rt), FT_EV_RESUME_SCALED);
    assert_int_equal(ctl_ft_event(rt, ctl_ft_resume_event(rt), "given up"), 0);
    assert_int_equal(rt->phase, FT_SCALED_DOWN_RUNNING);
    out = drain();
    assert_non_null(strstr(out, "\"machine\":\"ft_runtime\",\"instance_id\":3,\"state\":"
                                "\"NORMAL\",\"trigger\":\"COMMITTED\""));
    assert_non_null(strstr(out, "\"from\":\"RECONFIGURING\",\"to\":\"SCALED_DOWN_RUNNING\","
                                "\"trigger\":\"RESUME_SCALED\",\"cause\":\"given up\""));
    free(out);
    ctl_ft_rt_free(rt);
    log_set_fd(STDERR_FILENO);
    log_set_level(LOG_INFO);
    close(pipefd[0]);
    close(pipefd[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cell),
        cmocka_unit_test(test_shape),
        cmocka_unit_test(test_step_logs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
