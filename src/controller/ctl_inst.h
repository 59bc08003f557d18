/* ctl_inst — the controller's instance model (spec §5.9) and its state table (§5.10).
 *
 * An instance is what the assembler builds from node-manager registrations: one job,
 * one role, the node managers (pods) in registration order, each with its endpoints
 * (one per DP rank it hosts; endpoint ids are global DP ranks within the instance).
 *
 * Everything here is pure: no sockets, no timers, no globals. The daemon owns the
 * instances and calls these functions from its reactor thread; the unit tests call
 * them directly. Time comes in as arguments (monotonic ms for timeouts, wall seconds
 * for the hb_timestamp the wire carries). */
#ifndef MOTOR_CTL_INST_H
#define MOTOR_CTL_INST_H

#include "wire/wire.h"
#include "wire/wire_msg.h"
#include "wire/wire_ranktable.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Instance events (§5.10). */
enum ctl_event {
    CTL_EV_INIT = 0,
    CTL_EV_NORMAL,
    CTL_EV_ABNORMAL,
    CTL_EV_HB_TIMEOUT,
    CTL_EV_PAUSED,
    CTL_EV_RESUMED,
};
#define CTL_EV_COUNT 6
const char *ctl_event_name(enum ctl_event ev); /* "INIT", "NORMAL", ... */

/* The 19-entry table: 0 with *to set, or -ENOENT when (from, ev) has no transition
 * (deleted has none). */
int ctl_transition(enum wire_ins_status from, enum ctl_event ev, enum wire_ins_status *to);

/* One node manager (pod) of an instance. */
struct ctl_nm {
    char *pod_ip;
    char *port; /* NM API port, decimal string */
    int64_t device_num;
    int64_t node_rank;
    struct wire_endpoint *eps; /* this pod's endpoints */
    size_t n_eps;
    struct wire_register *reg; /* the registration (pending assemblies), NULL otherwise */
    /* runtime, not persisted */
    int64_t last_hb_ms;   /* monotonic; the load/assembly time until the first heartbeat */
    bool guard_refreshed; /* timestamps refreshed by the isolation probe, no heartbeat since */
    bool start_ok;        /* the start command was accepted */
    bool gate_logged;     /* the freshness gate logged this member; cleared by a heartbeat */
    bool unconfirmed;     /* loaded from the store, no heartbeat to this controller yet */
};

struct ctl_ft_rt;
struct ctl_faults;

struct ctl_inst {
    int64_t id;
    /* Unique per object for the life of the process: replies to requests sent on behalf
     * of an instance (probes, start commands) carry it, so a reply that arrives after the
     * instance was deleted and rebuilt under the same id is recognised as stale. */
    uint64_t incarnation;
    char *job_name;
    char *model_name;
    char *engine_type; /* NULL = null */
    struct wire_strlist dispatch_caps;
    struct wire_ft_capability ft_cap;
    bool ft_cap_consistent; /* every pod announced the same capability */
    enum wire_role role;
    enum wire_ins_status status;
    struct wire_parallel_config pc;
    bool multi_ep;
    int64_t nnodes;
    struct ctl_nm *nms;
    size_t n_nms;
    char *master_dp_ip;               /* set at assembly */
    struct wire_ranktable *ranktable; /* instance ranktable, NULL when no pod sent one */
    bool assembled;                   /* handed to the instance manager */
    bool reregistered;  /* rebuilt from re-registrations: never sent a start command */
    bool start_pending; /* start commands not yet accepted by every NM */
    int start_attempts;
    bool ever_ready; /* reached active once: arms fault handling (§5.8) */
    bool separated;  /* kept from returning to active (reconfiguration under way) */
    int64_t created_wall_ms;
    int64_t status_wall_ms; /* when the current status began (wall ms) */
    /* runtime, not persisted */
    int64_t last_reg_ms; /* monotonic, last registration (assemble timeout) */
    int64_t status_mono_ms;
    bool withdrawn;            /* kept off the coordinator by the fault manager */
    bool published;            /* the coordinator has it (last push succeeded) */
    char *published_sig;       /* signature of what the coordinator has (status, endpoints) */
    char *published_body;      /* the Instance JSON pushed last (for a later del) */
    struct ctl_ft_rt *ft;      /* fault-tolerance runtime (owned by the daemon) */
    void *strategy;            /* running strategy (owned by the daemon) */
    int recovery;              /* the fault manager's enum ctl_rec_state (ctl_faults.c) */
    struct ctl_faults *faults; /* collected software faults (owned by the daemon) */
    int start_inflight;        /* start commands in flight */
    bool probing;              /* reachability / isolation probe in flight */
};

struct ctl_inst *ctl_inst_new(int64_t id);
/* Frees everything the instance owns except ft/strategy (the daemon's). NULL-safe. */
void ctl_inst_free(struct ctl_inst *in);
/* Free the NM's contents (not the struct itself). */
void ctl_nm_release(struct ctl_nm *nm);

/* Endpoints of the whole instance. */
size_t ctl_inst_n_endpoints(const struct ctl_inst *in);
/* Endpoint by id, NULL if none; *nm_idx (may be NULL) receives its NM index. */
struct wire_endpoint *ctl_inst_endpoint(const struct ctl_inst *in, int64_t id, size_t *nm_idx);
/* NM by pod IP and NM port (port NULL = any port), -1 when none. */
ssize_t ctl_inst_find_nm(const struct ctl_inst *in, const char *pod_ip, const char *port);
/* The NM a heartbeat comes from: the pod IP must match, and when several NMs share the
 * IP (several NMs on one host) the one that owns the first reported endpoint id wins;
 * an empty report goes to an NM whose every endpoint is in `retired` (a pod left
 * without ranks by a scale-down), else to the first NM of the IP. -1 when none. */
ssize_t ctl_inst_find_nm_for_ids(const struct ctl_inst *in, const char *ip,
                                 const struct wire_hb_status *st, size_t n, const int64_t *retired,
                                 size_t n_retired);

/* Event evaluation (§5.6, newest): over every endpoint not in `retired` (sorted or not):
 *   all paused => PAUSED; all routable endpoints normal and headless ones normal or
 *   wait2start => NORMAL; any abnormal => ABNORMAL; some paused => PAUSED; else INIT.
 * An instance without endpoints evaluates INIT. */
enum ctl_event ctl_inst_evaluate(const struct ctl_inst *in, const int64_t *retired,
                                 size_t n_retired);

/* Heartbeat freshness of an instance's members (seed 001: partial loss). A member is a
 * node manager that still hosts a rank not in `retired` (a pod a scale-down left without
 * ranks is no longer one); it is stale when its last heartbeat is older than timeout_ms,
 * or when it has not heartbeated this controller since it loaded the instance (after a
 * restart or failover every member's window starts afresh; a silent one must not count
 * as fresh for a timeout).
 * `worst` is the stalest stale member (-1 when none) and worst_age_ms its age. */
struct ctl_freshness {
    size_t members, stale, fresh;
    ssize_t worst;
    int64_t worst_age_ms;
};
bool ctl_nm_is_member(const struct ctl_nm *nm, const int64_t *retired, size_t n_retired);
void ctl_inst_freshness(const struct ctl_inst *in, int64_t now_ms, int64_t timeout_ms,
                        const int64_t *retired, size_t n_retired, struct ctl_freshness *out);

/* Heartbeat size rule (§5.6, newest): the reported ids must be exactly the NM's
 * endpoint ids, except that ids in `may_miss` may be absent. 0, or -EINVAL with a
 * human message in err. */
int ctl_nm_check_hb_ids(const struct ctl_nm *nm, const struct wire_hb_status *st, size_t n,
                        const int64_t *may_miss, size_t n_may_miss, struct wire_err *err);

/* Persistence: the instance as a JSON document (everything not marked runtime) and
 * back. from_json: NULL with a message in err when the document is malformed. */
json_t *ctl_inst_store_json(const struct ctl_inst *in);
struct ctl_inst *ctl_inst_from_store_json(json_t *j, struct wire_err *err);

/* The Controller-shape Instance of a POST /instances/refresh body (§9.2): endpoints
 * {pod_ip: {id: Endpoint}} without headless-free filtering; endpoints whose id is in
 * `exclude` (retired or being removed DP ranks) are left out. status overrides the
 * instance's own when >= 0. */
json_t *ctl_inst_coord_json(const struct ctl_inst *in, const int64_t *exclude, size_t n_exclude,
                            int status);

/* ---- arrays of instances (the daemon's tables) -------------------------------------- */
void ctl_inst_vec_push(struct ctl_inst ***v, size_t *n, struct ctl_inst *in);
/* Remove `in` (keeping the order); no-op when absent. */
void ctl_inst_vec_remove(struct ctl_inst **v, size_t *n, struct ctl_inst *in);

/* ---- small sets of ids (sorted, unique heap arrays) --------------------------------- */
bool ctl_ids_has(const int64_t *v, size_t n, int64_t id);
/* Insert keeping order; no-op when present. */
void ctl_ids_add(int64_t **v, size_t *n, int64_t id);
void ctl_ids_remove(int64_t *v, size_t *n, int64_t id);
json_t *ctl_ids_json(const int64_t *v, size_t n);
/* Parse a JSON array of non-negative integers; -EINVAL when not one. */
int ctl_ids_parse(json_t *a, int64_t **v, size_t *n);

#endif
