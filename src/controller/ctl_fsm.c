#include "controller/ctl_fsm.h"

#include "common/log.h"

int ctl_fsm_next(const struct ctl_fsm *f, int from, int ev)
{
    if (from < 0 || from >= f->n_states || ev < 0 || ev >= f->n_events)
        return -1;
    return f->table[from * f->n_events + ev] - 1;
}

bool ctl_fsm_terminal(const struct ctl_fsm *f, int state)
{
    return state >= 0 && state < f->n_states && state < 32 && (f->terminal >> state) & 1u;
}

const char *ctl_fsm_state_name(const struct ctl_fsm *f, int state)
{
    return state >= 0 && state < f->n_states ? f->states[state] : "?";
}

const char *ctl_fsm_event_name(const struct ctl_fsm *f, int ev)
{
    return ev >= 0 && ev < f->n_events ? f->events[ev] : "?";
}

int ctl_fsm_step(const struct ctl_fsm *f, int *state, int ev, int64_t instance_id,
                 const char *cause)
{
    int from = *state;
    int to = ctl_fsm_next(f, from, ev);
    if (to < 0) {
        log_warn("state_event_ignored", LF_STR("machine", f->name),
                 LF_INT("instance_id", instance_id), LF_STR("state", ctl_fsm_state_name(f, from)),
                 LF_STR("trigger", ctl_fsm_event_name(f, ev)), LF_STR("cause", cause));
        return -1;
    }
    *state = to;
    log_at(to == from ? LOG_DEBUG : LOG_INFO, "state_transition", LF_STR("machine", f->name),
           LF_INT("instance_id", instance_id), LF_STR("from", ctl_fsm_state_name(f, from)),
           LF_STR("to", ctl_fsm_state_name(f, to)), LF_STR("trigger", ctl_fsm_event_name(f, ev)),
           LF_STR("cause", cause));
    return from;
}
