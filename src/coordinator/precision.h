/* precision — output-quality (precision) fault detection in the coordinator: sampling
 * windows, streaks per PD group, the probe, and the alarm 0xFC001009 to the controller
 * (docs/precision-detection.md).
 *
 *   worker        prec_claim: the decode instance's sampling window (one per instance,
 *                 shared by every worker, claimed by compare-and-swap: one sampled
 *                 request per interval_seconds, never two from two workers);
 *                 the proxy asks the engine for logprobs, projects them away for the
 *                 client (lpproj.h) and collects the sample (qcheck.h);
 *                 prec_submit after the answer completed: the sample goes to the
 *                 management reactor. Any failure on this path drops the sample only.
 *   management    judges the sample (qck_check) and moves the PD group's state — the one
 *                 state of a group, on one thread, so there is no second probe:
 *
 *     CLEAN --issue_threshold bad samples in a row--> PROBING (the action token: the
 *       probe runs, then ALARM is reported whatever its outcome)
 *     PROBING --reported--> ALARMED          PROBING --report failed--> CLEAN
 *     ALARMED --clear_threshold valid good samples in a row--> CLEARING (CLEAR reported,
 *       with the raise's moi byte for byte)
 *     CLEARING --reported--> CLEAN            CLEARING --report failed--> ALARMED
 *     any --POST /precision/alarm_cleared (the controller recovered the group)--> CLEAN
 *
 * A group is (p_instance_id, d_instance_id), p = -1 for a union instance. */
#ifndef MOTOR_PRECISION_H
#define MOTOR_PRECISION_H

#include "coordinator/qcheck.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct coord;
struct csettings;

enum prec_state { PREC_CLEAN = 0, PREC_PROBING, PREC_ALARMED, PREC_CLEARING, PREC_STATE_COUNT };

enum prec_event {
    PREC_EV_ISSUE_THRESHOLD = 0,
    PREC_EV_RAISED,
    PREC_EV_RAISE_FAILED,
    PREC_EV_CLEAR_THRESHOLD,
    PREC_EV_CLEARED,
    PREC_EV_CLEAR_FAILED,
    PREC_EV_RECOVERED,
    PREC_EV_COUNT
};

/* The state table: the state after ev in s, or -1 when the table refuses it. */
int prec_next(enum prec_state s, enum prec_event ev);
const char *prec_state_name(enum prec_state s);
const char *prec_event_name(enum prec_event ev);

/* The alarm's contract (the controller matches on these). */
#define PREC_ALARM_ID "0xFC001009"
#define PREC_ALARM_NAME "Precision Anomaly Alarm"
/* moi of a group: "service name=Coordinator, service ip=<ip>, pId=<p>, instanceId=<d>"
 * (without P: "..., instanceId=<d>"). Heap. */
char *prec_moi(const char *service_ip, int64_t p_id, int64_t d_id);

/* Management reactor: set up (before the workers start) and free (after they stopped
 * and the management reactor ran its last tasks). */
void prec_init(struct coord *c);
void prec_release(struct coord *c);
/* The management routes: POST /precision/alarm_cleared, GET /precision/status. */
void prec_register_routes(struct coord *c);

/* Worker: claim the sampling window of decode instance d at now_ms. True once per
 * interval per instance across every worker (when precision_check_enabled): a
 * compare-and-swap on the instance's shared state (it outlives snapshots), or, for an
 * instance without one, a table under a mutex. */
struct instance;
bool prec_claim(struct coord *c, const struct csettings *set, struct instance *d, int64_t now_ms);
/* The same decision on a bare timestamp (for its unit test): claims *last at now. */
bool prec_window_claim(_Atomic int64_t *last, int64_t interval_ms, int64_t now_ms);
/* Worker: a completed sample of PD group (p_id, d_id); takes the accumulator (heap,
 * qck_acc_init'ed). Never fails visibly: a sample that cannot be posted is dropped. */
void prec_submit(struct coord *c, int64_t p_id, int64_t d_id, struct qck_acc *take);
/* Worker: the probe's pin header "X-Motor-Precision-Probe: <secret> <p> <d>" (p -1 for
 * none). True and the pair set only for this process's secret. */
bool prec_probe_pin(struct coord *c, const char *hdr, int64_t *p_id, int64_t *d_id);

#endif
