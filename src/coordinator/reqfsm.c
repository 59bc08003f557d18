#include "coordinator/reqfsm.h"

#include "common/strbuf.h"

#include <stdio.h>
#include <string.h>

static const char *const state_names[REQ_STATE_COUNT] = {
    [REQ_ROUTING] = "ROUTING",     [REQ_PREFILL] = "PREFILL",     [REQ_DECODE] = "DECODE",
    [REQ_BUFFERING] = "BUFFERING", [REQ_STREAMING] = "STREAMING", [REQ_BACKOFF] = "BACKOFF",
    [REQ_RESUMING] = "RESUMING",   [REQ_TOKENIZING] = "TOKENIZING", [REQ_DONE] = "DONE",
};

static const char *const event_names[REQ_EV_COUNT] = {
    [REQ_EV_HANDOFF] = "HANDOFF",
    [REQ_EV_SENT] = "SENT",
    [REQ_EV_TICKET] = "TICKET",
    [REQ_EV_PREFILL_DONE] = "PREFILL_DONE",
    [REQ_EV_BODY_START] = "BODY_START",
    [REQ_EV_STREAM_START] = "STREAM_START",
    [REQ_EV_RETRY] = "RETRY",
    [REQ_EV_RETRY_TIMER] = "RETRY_TIMER",
    [REQ_EV_COMPLETE] = "COMPLETE",
    [REQ_EV_PASS_THROUGH] = "PASS_THROUGH",
    [REQ_EV_GIVE_UP] = "GIVE_UP",
    [REQ_EV_REJECT] = "REJECT",
    [REQ_EV_FAIL] = "FAIL",
    [REQ_EV_BROKEN] = "BROKEN",
    [REQ_EV_FIRST_TIMEOUT] = "FIRST_TIMEOUT",
    [REQ_EV_TOTAL_TIMEOUT] = "TOTAL_TIMEOUT",
    [REQ_EV_CLIENT_GONE] = "CLIENT_GONE",
    [REQ_EV_RESCHEDULE] = "RESCHEDULE",
    [REQ_EV_TOKENIZE] = "TOKENIZE",
    [REQ_EV_TOKENIZED] = "TOKENIZED",
};

const char *reqfsm_state_name(enum reqfsm_state s)
{
    return (unsigned)s < REQ_STATE_COUNT ? state_names[s] : "?";
}

const char *reqfsm_event_name(enum reqfsm_event ev)
{
    return (unsigned)ev < REQ_EV_COUNT ? event_names[ev] : "?";
}

/* Cells hold new state + 1, so that an unlisted cell (0) is illegal. */
#define TO(s) ((int8_t)((s) + 1))
const int8_t reqfsm_table_[REQ_STATE_COUNT][REQ_EV_COUNT] = {
    [REQ_ROUTING] =
        {
            [REQ_EV_HANDOFF] = TO(REQ_PREFILL),
            [REQ_EV_SENT] = TO(REQ_DECODE),
            [REQ_EV_TOKENIZE] = TO(REQ_TOKENIZING),
            [REQ_EV_GIVE_UP] = TO(REQ_DONE),
            [REQ_EV_REJECT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_PREFILL] =
        {
            [REQ_EV_TICKET] = TO(REQ_DECODE),
            [REQ_EV_RETRY] = TO(REQ_BACKOFF),
            [REQ_EV_PASS_THROUGH] = TO(REQ_DONE),
            [REQ_EV_GIVE_UP] = TO(REQ_DONE),
            [REQ_EV_FIRST_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_DECODE] =
        {
            [REQ_EV_PREFILL_DONE] = TO(REQ_DECODE),
            [REQ_EV_BODY_START] = TO(REQ_BUFFERING),
            [REQ_EV_STREAM_START] = TO(REQ_STREAMING),
            [REQ_EV_RETRY] = TO(REQ_BACKOFF),
            [REQ_EV_PASS_THROUGH] = TO(REQ_DONE),
            [REQ_EV_GIVE_UP] = TO(REQ_DONE),
            [REQ_EV_FIRST_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_BUFFERING] =
        {
            [REQ_EV_PREFILL_DONE] = TO(REQ_BUFFERING),
            [REQ_EV_RETRY] = TO(REQ_BACKOFF),
            [REQ_EV_COMPLETE] = TO(REQ_DONE),
            [REQ_EV_GIVE_UP] = TO(REQ_DONE),
            [REQ_EV_FAIL] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_STREAMING] =
        {
            [REQ_EV_PREFILL_DONE] = TO(REQ_STREAMING),
            [REQ_EV_COMPLETE] = TO(REQ_DONE),
            [REQ_EV_BROKEN] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
            [REQ_EV_RESCHEDULE] = TO(REQ_RESUMING),
        },
    [REQ_BACKOFF] =
        {
            [REQ_EV_RETRY_TIMER] = TO(REQ_ROUTING),
            [REQ_EV_FIRST_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_DONE] = {0},
    /* The continuation goes through the same routing steps as a first attempt, but the
     * head is out: every way out that answers the client answers it in-band. */
    [REQ_RESUMING] =
        {
            [REQ_EV_HANDOFF] = TO(REQ_RESUMING),
            [REQ_EV_SENT] = TO(REQ_RESUMING),
            [REQ_EV_TICKET] = TO(REQ_RESUMING),
            [REQ_EV_PREFILL_DONE] = TO(REQ_RESUMING),
            [REQ_EV_STREAM_START] = TO(REQ_STREAMING),
            [REQ_EV_RETRY] = TO(REQ_RESUMING),
            [REQ_EV_RETRY_TIMER] = TO(REQ_RESUMING),
            [REQ_EV_PASS_THROUGH] = TO(REQ_DONE),
            [REQ_EV_GIVE_UP] = TO(REQ_DONE),
            [REQ_EV_REJECT] = TO(REQ_DONE),
            [REQ_EV_BROKEN] = TO(REQ_DONE),
            [REQ_EV_FIRST_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
    [REQ_TOKENIZING] =
        {
            [REQ_EV_TOKENIZED] = TO(REQ_ROUTING),
            [REQ_EV_REJECT] = TO(REQ_DONE),
            [REQ_EV_FIRST_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_TOTAL_TIMEOUT] = TO(REQ_DONE),
            [REQ_EV_CLIENT_GONE] = TO(REQ_DONE),
        },
};

int reqfsm_next(enum reqfsm_state from, enum reqfsm_event ev)
{
    if ((unsigned)from >= REQ_STATE_COUNT || (unsigned)ev >= REQ_EV_COUNT)
        return -1;
    return reqfsm_table_[from][ev] - 1;
}

void reqfsm_init(struct reqfsm *m)
{
    memset(m, 0, sizeof(*m));
    m->state = REQ_ROUTING;
}

int reqfsm_ignored_(const struct reqfsm *m, enum reqfsm_event ev, const char *rid,
                    const char *cause)
{
    log_warn("request_event_ignored", LF_STR("request_id", rid),
             LF_STR("state", reqfsm_state_name((enum reqfsm_state)m->state)),
             LF_STR("trigger", reqfsm_event_name(ev)), LF_STR("cause", cause));
    return -1;
}

void reqfsm_log_(int from, int to, enum reqfsm_event ev, const char *rid, const char *cause)
{
    log_debug("request_state", LF_STR("request_id", rid),
              LF_STR("from", reqfsm_state_name((enum reqfsm_state)from)),
              LF_STR("to", reqfsm_state_name((enum reqfsm_state)to)),
              LF_STR("trigger", reqfsm_event_name(ev)), LF_STR("cause", cause));
}

void reqfsm_trail(const struct reqfsm *m, char *buf, size_t cap)
{
    if (!cap)
        return;
    size_t o = 0;
    size_t n = m->n_trail, kept = n < REQFSM_TRAIL ? n : REQFSM_TRAIL;
    /* (n_trail wraps after 65536 transitions, a multiple of the ring: still in order) */
    int w = snprintf(buf, cap, "%s", n > kept ? "..." : reqfsm_state_name(REQ_ROUTING));
    o = w > 0 ? (size_t)w : 0;
    for (size_t i = n - kept; i < n && o + 1 < cap; i++) {
        w = snprintf(buf + o, cap - o, ">%s",
                     reqfsm_state_name((enum reqfsm_state)m->trail[i % REQFSM_TRAIL]));
        if (w < 0)
            break;
        o += (size_t)w;
    }
}

void reqfsm_render(struct strbuf *sb, const struct reqfsm_stats *const *st, size_t n)
{
    uint64_t sum[REQ_STATE_COUNT][REQ_EV_COUNT];
    memset(sum, 0, sizeof(sum));
    for (size_t w = 0; w < n; w++)
        for (int s = 0; s < REQ_STATE_COUNT; s++)
            for (int e = 0; e < REQ_EV_COUNT; e++)
                sum[s][e] += atomic_load_explicit(&st[w]->cell[s][e], memory_order_relaxed);
    strbuf_puts(sb, "# HELP motor_coordinator_request_events_total Events applied by the "
                    "proxied-request state machine, by old state, event and new state.\n"
                    "# TYPE motor_coordinator_request_events_total counter\n");
    for (int s = 0; s < REQ_STATE_COUNT; s++)
        for (int e = 0; e < REQ_EV_COUNT; e++) {
            int to = reqfsm_next((enum reqfsm_state)s, (enum reqfsm_event)e);
            if (to >= 0 && sum[s][e])
                strbuf_appendf(sb,
                               "motor_coordinator_request_events_total{from=\"%s\",event=\"%s\","
                               "to=\"%s\"} %llu\n",
                               state_names[s], event_names[e], state_names[to],
                               (unsigned long long)sum[s][e]);
        }
    strbuf_puts(sb, "# HELP motor_coordinator_request_events_ignored_total Events the proxied-"
                    "request state machine ignored as illegal in the state they met (a bug).\n"
                    "# TYPE motor_coordinator_request_events_ignored_total counter\n");
    for (int s = 0; s < REQ_STATE_COUNT; s++)
        for (int e = 0; e < REQ_EV_COUNT; e++)
            if (reqfsm_next((enum reqfsm_state)s, (enum reqfsm_event)e) < 0 && sum[s][e])
                strbuf_appendf(sb,
                               "motor_coordinator_request_events_ignored_total{state=\"%s\","
                               "event=\"%s\"} %llu\n",
                               state_names[s], event_names[e], (unsigned long long)sum[s][e]);
}
