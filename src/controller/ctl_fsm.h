/* ctl_fsm — the controller's state tables for its long flows: the fault-tolerance
 * strategies (engine relaunch, DP scale-down), the FT runtime's phase and the fault
 * manager's recovery of an instance. (The instance state table of §5.10 predates it and
 * lives in ctl_inst.c.)
 *
 * A machine is a table: state x event -> new state (or illegal), with names for both and
 * the set of terminal states. Every change goes through ctl_fsm_step(), which logs the
 * old state, the new state, the event and the cause; an illegal event is logged and
 * ignored. What a state does when entered (send a round of requests, arm a timer, finish)
 * is the owner's code, run after a successful step. Pure apart from the log; any thread
 * (the controller uses one). */
#ifndef MOTOR_CTL_FSM_H
#define MOTOR_CTL_FSM_H

#include <stdbool.h>
#include <stdint.h>

struct ctl_fsm {
    const char *name; /* the machine, e.g. "EngineRelaunchStrategy" (logged as "machine") */
    int n_states, n_events;
    const char *const *states; /* n_states names */
    const char *const *events; /* n_events names */
    const int8_t *table;       /* [n_states][n_events]: new state + 1; 0 = illegal */
    uint32_t terminal;         /* bit per terminal state (no way out) */
};

/* The new state for (from, ev), or -1 when illegal (or out of range). */
int ctl_fsm_next(const struct ctl_fsm *f, int from, int ev);
bool ctl_fsm_terminal(const struct ctl_fsm *f, int state);
const char *ctl_fsm_state_name(const struct ctl_fsm *f, int state); /* "?" if out of range */
const char *ctl_fsm_event_name(const struct ctl_fsm *f, int ev);

/* The one transition function of every machine: applies ev to *state. Logs
 * {"event":"state_transition","machine","instance_id","from","to","trigger","cause"}
 * (info; debug when the state stays the same, e.g. another poll round). Returns the old
 * state, or -1 when ev is illegal in *state: then *state is unchanged and
 * "state_event_ignored" is logged (warn). */
int ctl_fsm_step(const struct ctl_fsm *f, int *state, int ev, int64_t instance_id,
                 const char *cause);

#endif
