/* ctl_ft — the fault-tolerance runtime of one instance (spec §8.4) and the DP
 * scale-down gate (§8.1). Pure data and JSON; the strategies that move it live in
 * ctl_relaunch.c, ctl_scaledown.c and ctl_faults.c.
 *
 * The runtime's `phase` is upstream's DP scale-down phase. Motor adds `strategy` and
 * `strategy_phase` (the strategy running or last run and its own phase, e.g.
 * EngineRelaunchStrategy / RELAUNCH_ENGINE) and a bounded `history` of every phase
 * change of either, so that a whole recovery can be followed through the status API. */
#ifndef MOTOR_CTL_FT_H
#define MOTOR_CTL_FT_H

#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ctl_ft_phase {
    FT_DISABLED = 0,
    FT_NORMAL,
    FT_DECIDING,
    FT_WAITING_ENGINE_FAULT,
    FT_SCALING_DOWN,
    FT_POST_SCALE_CLEANUP,
    FT_SCALED_DOWN_RUNNING,
    FT_RECONFIGURING,
};
#define FT_PHASE_COUNT 8
const char *ctl_ft_phase_name(enum ctl_ft_phase p);
int ctl_ft_phase_from_str(const char *s, enum ctl_ft_phase *out);

/* What moves the phase (the table in ctl_ft.c; docs/controller.md shows it). */
enum ctl_ft_event {
    FT_EV_SCALE_DOWN = 0, /* DEAD engines: a DP scale-down begins (-> DECIDING) */
    FT_EV_WAIT_FAULT,     /* the survivors are not ready for apply yet (-> WAITING_ENGINE_FAULT) */
    FT_EV_WITHDRAWN,      /* the coordinator dropped the instance (-> SCALING_DOWN) */
    FT_EV_COMMITTED,      /* finalize commit on every node manager (-> POST_SCALE_CLEANUP) */
    FT_EV_CLEANED_UP,     /* the survivors serve (-> SCALED_DOWN_RUNNING) */
    FT_EV_FAILED,         /* the scale-down failed: its fallback follows (-> RECONFIGURING) */
    FT_EV_RECONFIGURE,    /* escalation: the instance is rebuilt (any phase -> RECONFIGURING) */
    FT_EV_RESUME,         /* recovered, or recovery given up; no rank retired (-> NORMAL) */
    FT_EV_RESUME_SCALED,  /* the same with retired ranks (-> SCALED_DOWN_RUNNING) */
};
#define FT_EV_COUNT 9

struct ctl_fsm;
extern const struct ctl_fsm ctl_ft_phase_fsm; /* the table, for tests and docs */

/* Gate reason codes (bit flags). */
enum {
    FT_GATE_FEATURE_DISABLED = 1u << 0,
    FT_GATE_ENGINE_FT_REQUIRED = 1u << 1,
    FT_GATE_EXTERNAL_LB_REQUIRED = 1u << 2,
    FT_GATE_AUTO_RECOVERY_CONFLICT = 1u << 3,
    FT_GATE_ENGINE_SCALE_DOWN_UNSUPPORTED = 1u << 4,
    FT_GATE_EPLB_REQUIRED = 1u << 5,
    FT_GATE_EXPERT_REDUNDANCY_REQUIRED = 1u << 6,
    FT_GATE_CAPABILITY_INCONSISTENT = 1u << 7, /* (motor) pods disagree: fail closed */
};
#define FT_GATE_COUNT 8

/* §8.1: 0 = allowed, else the OR of the failed reasons. */
unsigned ctl_ft_gate(bool ft_enable, bool scale_down_enable, const struct wire_ft_capability *cap,
                     bool cap_consistent);
/* JSON array of the reason code names. */
json_t *ctl_ft_gate_reasons_json(unsigned reasons);

#define FT_HISTORY_MAX 32

struct ctl_ft_rt {
    int64_t instance_id;
    char *job_name;
    enum ctl_ft_phase phase;
    int64_t *original; /* original non-headless DP ranks */
    size_t n_original;
    char *request_id;
    int64_t *committed; /* dead_committed (cumulative) */
    size_t n_committed;
    int64_t *pending; /* pending_removed_ranks */
    size_t n_pending;
    char *fallback;          /* fallback_strategy name or NULL */
    unsigned gate;           /* last gate result (0 = allowed) */
    json_t *engine_statuses; /* {"rank": entry} (owned) */
    bool serving_published;
    bool reconfiguration_dispatched;
    char *last_error;
    /* (motor) */
    char *strategy;
    char *strategy_phase;
    json_t *history; /* array, at most FT_HISTORY_MAX entries (oldest dropped) */
    bool dirty;      /* persisted fields changed since the last save */
};

struct ctl_ft_rt *ctl_ft_rt_new(int64_t instance_id, const char *job_name);
void ctl_ft_rt_free(struct ctl_ft_rt *rt); /* NULL-safe */

/* The one way the phase changes: the table decides, the change is logged (ctl_fsm_step),
 * recorded in the history and marks the runtime dirty (a self-transition records
 * nothing). 0, or -ENOENT when ev is illegal in the current phase (logged, ignored).
 * ctl_ft_rt_from_store_json sets the restored phase directly: a restore is not a
 * transition. */
int ctl_ft_event(struct ctl_ft_rt *rt, enum ctl_ft_event ev, const char *detail);
/* FT_EV_RESUME or FT_EV_RESUME_SCALED, whichever fits the runtime's committed ranks. */
enum ctl_ft_event ctl_ft_resume_event(const struct ctl_ft_rt *rt);
/* Record the running strategy and its phase (history entry). */
void ctl_ft_set_strategy(struct ctl_ft_rt *rt, const char *strategy, const char *phase,
                         const char *detail);
void ctl_ft_set_error(struct ctl_ft_rt *rt, const char *err); /* NULL clears */
void ctl_ft_set_request_id(struct ctl_ft_rt *rt, const char *id);
void ctl_ft_set_fallback(struct ctl_ft_rt *rt, const char *name);

/* alive_dp_ranks = original - committed - pending (heap array). */
int64_t *ctl_ft_alive(const struct ctl_ft_rt *rt, size_t *n);
/* can_serve: phase NORMAL or SCALED_DOWN_RUNNING, and published. */
bool ctl_ft_can_serve(const struct ctl_ft_rt *rt);
/* A scale-down or reconfiguration is under way (the instance must not be routed). */
bool ctl_ft_in_transaction(const struct ctl_ft_rt *rt);

/* The §8.4 runtime object (plus Motor's strategy fields). now_wall_ms for ages. */
json_t *ctl_ft_rt_json(const struct ctl_ft_rt *rt);

/* Persisted subset: job_name, phase, original ranks, committed, fallback,
 * reconfiguration_dispatched (§8.4). */
json_t *ctl_ft_rt_store_json(const struct ctl_ft_rt *rt);
/* Restore: committed phases come back as SCALED_DOWN_RUNNING, an interrupted
 * transaction (DECIDING .. POST_SCALE_CLEANUP) as RECONFIGURING keeping its fallback.
 * NULL when malformed. */
struct ctl_ft_rt *ctl_ft_rt_from_store_json(int64_t instance_id, json_t *j);

/* "scale-down-<32 hex>" from the kernel's random source (heap). */
char *ctl_ft_new_request_id(void);

#endif
