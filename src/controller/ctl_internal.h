/* ctl_internal — the controller daemon's one struct and the functions its files share
 * (controller.c: process lifecycle; ctl_leader.c: leadership, state reload, persistence;
 * ctl_assemble.c: registrations and the assembler driver; ctl_start.c: start commands;
 * ctl_instmgr.c: the instance manager; ctl_api.c: HTTP routes; ctl_push.c: coordinator
 * push; ctl_faults.c: fault intake, the recovery table, reconfiguration; ctl_relaunch.c /
 * ctl_scaledown.c: strategies; ctl_nmc.c: node-manager client helpers and probes).
 * Everything runs on the one reactor thread. */
#ifndef MOTOR_CTL_INTERNAL_H
#define MOTOR_CTL_INTERNAL_H

#include "controller/ctl_asm.h"
#include "controller/ctl_config.h"
#include "controller/ctl_fsm.h"
#include "controller/ctl_ft.h"
#include "controller/ctl_inst.h"
#include "controller/store.h"

#include "common/cfgwatch.h"
#include "common/list.h"
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/metrics.h"
#include "common/reactor.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Instances (assembled + assembling) one controller keeps: registrations beyond it are
 * refused, so a peer cannot grow the controller's memory without bound. */
#define CTL_MAX_INSTANCES 16384

/* A software fault collected for an instance (§5.8). */
struct ctl_fault {
    int64_t engine_id;
    enum wire_engine_status status;
    int64_t at_ms; /* monotonic, last report */
    char *type;
};

/* Per-instance runtime the fault manager keeps next to the instance. */
struct ctl_faults {
    struct ctl_fault *v;
    size_t n;
};

struct ctl_push_entry;
struct ctl_call;

struct ctl_restop {
    char *key; /* "ip port" */
    int64_t at;
};

/* A node manager that refused the controller's management key (401 none sent, 403 wrong
 * key): kept until the node manager answers a request with anything else. */
struct ctl_auth_fail {
    char *target; /* "ip:port" (IPv6 in brackets), as in the URL */
    char *route;  /* the path refused, e.g. "/node-manager/start" */
    long status;
    uint64_t count;
    int64_t first_ms, last_ms, logged_ms; /* monotonic */
};
#define CTL_AUTH_FAIL_MAX 64

struct ctl_metrics {
    struct metrics_registry *reg;
    struct metrics_counter *registrations, *reregistrations, *register_errors;
    struct metrics_family *heartbeats; /* result */
    struct metrics_counter *hb_ok, *hb_unknown, *hb_invalid, *hb_rejected;
    struct metrics_family *faults;     /* status */
    struct metrics_family *strategies; /* strategy, result */
    struct metrics_family *pushes;     /* event, result */
    struct metrics_counter *start_ok, *start_failed;
    struct metrics_family *transitions; /* to */
    struct metrics_counter *isolation_suppressed;
    struct metrics_counter *freshness_gate; /* transitions to active refused (stale member) */
    struct metrics_family *partial_loss;    /* action */
    struct metrics_counter *nm_auth_failed; /* node-manager calls refused 401/403 */
    struct metrics_counter *coord_restarts; /* coordinator restarts seen by boot id */
    struct metrics_counter *reloads_ok, *reloads_failed;
};

/* What the command line set: kept for reloads, which apply it again over the file. */
struct ctl_cli {
    char *config;          /* the file read (NULL: none, defaults only) */
    char *host;            /* --host (NULL: the file's) */
    int port;              /* --port (-1: the file's) */
    bool log_level_pinned; /* --log-level given: the file's level is not applied */
};

struct ctl {
    struct ctlcfg cfg;
    struct ctl_cli cli;
    struct cfgwatch *watch;            /* config and TLS files (ctl_reload.c) */
    struct reactor_timer daemon_timer; /* daemon_loop_interval */
    struct reactor *r;
    struct httpd *httpd;
    struct httpc *hc;
    struct store *store;
    struct httpc_tls tls;
    bool use_tls;
    struct httpc_tls etcd_tls; /* etcd_tls_config when enabled (ctl_tls_settings) */
    bool use_etcd_tls;
    char *owner;
    int port;
    bool leader;
    bool loaded;
    bool stopping;
    int exit_code;
    int64_t start_wall_ms;
    int64_t next_id;

    struct ctl_inst **insts; /* assembled (the instance manager's table) */
    size_t n_insts;
    struct ctl_inst **pending; /* assembling */
    size_t n_pending;
    struct ctl_ft_rt **ghosts; /* runtimes of deleted instances still reconfiguring */
    size_t n_ghosts;

    struct reactor_timer asm_timer;   /* periodic assembler check */
    struct reactor_timer asm_kick;    /* assembler check soon (after a registration) */
    struct reactor_timer send_timer;  /* start-command retries */
    struct reactor_timer mgr_timer;   /* heartbeat timeouts */
    struct reactor_timer strat_timer; /* strategy center */
    struct reactor_timer strat_kick;
    struct reactor_timer load_retry;

    /* coordinator push */
    struct ctl_push_entry *push_head, *push_tail;
    bool push_inflight;
    bool push_full_set_queued;
    bool push_dirty; /* the last full set failed: the coordinator's view is unknown */
    /* The coordinator process (boot_id of its probes and refresh answers; motor
     * coordinators) whose table our last full set replaced; NULL = not known yet. A
     * different boot id means it restarted with an empty table: set it again at once. */
    char *coord_boot_id;
    int coord_lost;
    bool coord_hb_inflight;
    struct reactor_timer push_retry;
    struct reactor_timer coord_hb_timer;
    struct reactor_timer coord_sync_timer;

    struct list_head calls;     /* struct ctl_call in flight (ctl_request) */
    struct ctl_restop *restops; /* NMs recently told to stop again (rate limit) */
    size_t n_restops;
    /* Instances deleted for partial loss (survivors told to stop): a re-registration of one
     * is refused with 410 and the stop repeated (bounded ring, ids are never reused). */
    int64_t lost[64];
    size_t n_lost;
    struct ctl_auth_fail auth_fails[CTL_AUTH_FAIL_MAX];
    size_t n_auth_fails;

    struct ctl_metrics m;
    struct ctl_obs *obs;   /* alarms and the observability listener (ctl_obs.c) */
    struct ctl_prec *prec; /* precision alarms (ctl_prec.c) */
};

/* ---- ctl_instmgr.c: the instance manager --------------------------------------------- */
struct ctl_inst *ctl_find(struct ctl *c, int64_t id); /* assembled */
struct ctl_inst *ctl_find_pending(struct ctl *c, int64_t id);
struct ctl_inst *ctl_find_job(struct ctl *c, const char *job); /* assembled, not deleted */
struct ctl_inst *ctl_find_pending_job(struct ctl *c, const char *job);
/* Apply a state-table event: logs, persists, pushes, and (to deleted) removes and frees
 * the instance — do not touch `in` afterwards when the result is WIRE_INS_DELETED.
 * Returns 0, or -ENOENT when the table has no transition (nothing changed). */
int ctl_apply_event(struct ctl *c, struct ctl_inst *in, enum ctl_event ev, const char *cause);
/* Force a status (reconfiguration, terminate): same side effects as a transition. */
void ctl_set_status(struct ctl *c, struct ctl_inst *in, enum wire_ins_status to, const char *cause);
/* Give the instance its FT runtime (new: its original non-headless ranks) and refresh the
 * scale-down gate from the configuration. */
void ctl_rt_attach(struct ctl *c, struct ctl_inst *in);
/* Every FT runtime (instances' and ghosts'), sorted by instance id. Borrowed. */
size_t ctl_all_runtimes(struct ctl *c, struct ctl_ft_rt ***out);
struct ctl_ft_rt *ctl_find_rt(struct ctl *c, int64_t id);
/* Keep the runtime of a deleted instance (RECONFIGURING) observable: c owns it. */
void ctl_ghost_add(struct ctl *c, struct ctl_ft_rt *rt);
/* Drop ghost runtimes of job (a replacement instance became ready). */
void ctl_drop_ghosts_of_job(struct ctl *c, const char *job, int64_t keep_id);
/* Timer: heartbeat timeouts (manager_check period). */
void ctl_instmgr_on_timer(struct reactor *r, void *arg);
/* Teardown: every instance, assembly and ghost runtime. */
void ctl_instmgr_free_all(struct ctl *c);

/* ---- ctl_leader.c: leadership, state reload, persistence ---------------------------- */
/* The store of the configuration (NULL with the error logged and printed). */
struct store *ctl_leader_open_store(struct ctl *c);
/* Campaign for leadership: when elected, load the state and go live; when the leadership
 * is lost, stop the reactor with exit code 1. */
void ctl_leader_campaign(struct ctl *c);
/* Timer: retry loading the state. */
void ctl_leader_on_load_retry(struct reactor *r, void *arg);
/* Persistence (no-ops unless leader and loaded). */
void ctl_save_inst(struct ctl *c, struct ctl_inst *in);
void ctl_forget_inst(struct ctl *c, int64_t id);
void ctl_save_rt(struct ctl *c, struct ctl_ft_rt *rt);
void ctl_forget_rt(struct ctl *c, int64_t id);
void ctl_save_meta(struct ctl *c);

/* ---- ctl_assemble.c: the assembler driver and registration intake -------------------- */
/* Register / reregister intake (called by the API). Return the HTTP answer body. */
json_t *ctl_register(struct ctl *c, const struct wire_register *m, int *status);
json_t *ctl_reregister(struct ctl *c, const struct wire_reregister *m, int *status);
/* Wake the assembler. */
void ctl_asm_kick(struct ctl *c);
/* Timer: the assembler check (periodic, and the kick). */
void ctl_asm_on_timer(struct reactor *r, void *arg);

/* ---- ctl_start.c: start commands ----------------------------------------------------- */
/* Instances of the same role that are active: d2d peers "<endpoint_id>:<ip>". */
void ctl_d2d_peers(struct ctl *c, const struct ctl_inst *in, struct wire_strlist *out);
/* One round of start commands to the NMs of `in` that have not accepted yet (no-op while
 * a round is in flight or when nothing is pending). */
void ctl_start_send(struct ctl *c, struct ctl_inst *in);
/* Timer: start-command retries. */
void ctl_start_on_timer(struct reactor *r, void *arg);

/* ---- ctl_reload.c: hot reload ---------------------------------------------------------- */
/* The watch on the config file and the TLS files (common/cfgwatch.h). */
void ctl_reload_init(struct ctl *c);
void ctl_reload_free(struct ctl *c);
/* Reload now (SIGHUP, the watch): 0 when applied or unchanged, -EINVAL when the file is
 * invalid (the running configuration stays, the errors are logged). */
int ctl_reload_now(struct ctl *c, const char *why);
/* Read the configuration (path NULL: defaults) and apply the command line's overrides.
 * 0, or -EINVAL with every error in errs. */
int ctl_config_read(const struct ctl_cli *cli, struct ctlcfg *out, struct cfg_errors *errs);
/* The TLS settings of the API and the clients from the configuration (start, reload). */
void ctl_tls_settings(struct ctl *c);
/* The daemon loop (daemon_loop_interval): housekeeping. */
void ctl_daemon_tick(struct reactor *r, void *arg);

/* ---- ctl_api.c -------------------------------------------------------------------- */
void ctl_api_register_routes(struct ctl *c);
/* False (and a 503 answered) unless this controller leads and has loaded its state. */
bool ctl_api_serving(struct ctl *c, struct httpd_req *req);
/* Stop an instance's engines through its node managers and delete it (`in` is freed). */
void ctl_terminate_instance(struct ctl *c, struct ctl_inst *in, const char *reason);

/* ---- ctl_prec.c: precision alarms (persisted under "precision/<seq>") ----------------- */
void ctl_prec_init(struct ctl *c); /* after the metrics registry */
void ctl_prec_free(struct ctl *c);
void ctl_prec_register_routes(struct ctl *c);
/* A persisted record (state load): 0, or -EINVAL when it is not one. */
int ctl_prec_load(struct ctl *c, const char *key, json_t *j);
/* terminate_instance with precision_alarm_clear: clear the group's active alarm, reset
 * the coordinator's state, and answer req (later) with data (taken) plus
 * precision_alarm_cleared, scheduler_state_cleared and moi. */
void ctl_prec_terminate_clear(struct ctl *c, struct httpd_req *req, int64_t d_id, int64_t p_id,
                              json_t *data);
/* The active alarms (motor status, /controller/precision/alarms). New reference. */
json_t *ctl_prec_active_json(struct ctl *c);

/* ---- ctl_nmc.c: HTTP client helpers ------------------------------------------------ */
/* "http(s)://ip:port<path>" of an NM (IPv6 bracketed). Heap. */
char *ctl_nm_url(struct ctl *c, const char *ip, const char *port, const char *path);
/* The answer of a request: resp is httpc's; arg/tag as given. */
typedef void (*ctl_resp_fn)(struct ctl *c, const struct httpc_response *resp, void *arg,
                            intptr_t tag);
/* Called instead of fn for requests that never get an answer because the controller
 * shuts down (httpc_free drops them): release what arg holds for this request. */
typedef void (*ctl_drop_fn)(void *arg, intptr_t tag);
/* One request (method "GET"/"POST"; body NULL = none) with the controller's TLS
 * settings; every request is tracked so that shutdown can release its context. */
/* The node managers refusing the key, for GET /controller/instances (NULL when none), and
 * the refusal recorded for one node manager ("ip:port"), NULL when none. */
json_t *ctl_auth_fails_json(struct ctl *c);
const struct ctl_auth_fail *ctl_auth_fail_of(const struct ctl *c, const char *target);
void ctl_auth_fails_free(struct ctl *c);
void ctl_request(struct ctl *c, const char *method, const char *url, const json_t *body,
                 int64_t timeout_ms, ctl_resp_fn fn, void *arg, intptr_t tag, ctl_drop_fn drop);
/* Release the contexts of every request still in flight (after httpc_free). */
void ctl_requests_drop_all(struct ctl *c);
/* 2xx */
bool ctl_http_ok(const struct httpc_response *resp);
/* Parse a JSON answer body (NULL when not JSON). New reference. */
json_t *ctl_http_json(const struct httpc_response *resp);
/* A short text for logs: the transport error or the status and the body's start. */
const char *ctl_http_err(const struct httpc_response *resp);
/* Fire and forget: logs the outcome as event `what`. */
void ctl_http_fire(struct ctl *c, const char *method, const char *url, const json_t *body,
                   int64_t timeout_ms, const char *what, int64_t instance_id);
/* Reachability probe of every NM of an instance (GET /node-manager/status, any HTTP
 * answer counts): sets in->probing, then calls done once with every NM's result. The
 * instance may be gone by then: done looks it up by id and incarnation. */
struct ctl_probe {
    int64_t id;
    uint64_t incarnation;
    size_t n;
    bool *ok;
    char **keys; /* "ip port" of each NM, in the instance's order at the start */
};
typedef void (*ctl_probe_fn)(struct ctl *c, const struct ctl_probe *p);
void ctl_probe_start(struct ctl *c, struct ctl_inst *in, ctl_probe_fn done);
/* The NM whose "ip port" key this is, -1 when none. */
ssize_t ctl_nm_by_key(const struct ctl_inst *in, const char *key);

/* ---- ctl_push.c --------------------------------------------------------------------- */
void ctl_push_init(struct ctl *c);
void ctl_push_start(struct ctl *c); /* timers, initial full set */
void ctl_push_stop(struct ctl *c);
/* The push settings were reloaded: timers at their new periods, started or stopped with
 * coordinator_push; target_changed (address, port or key): a full set to the new one. */
void ctl_push_reconfigure(struct ctl *c, bool target_changed);
/* Bring the coordinator's view of `in` in line with what it should see. */
void ctl_push_reconcile(struct ctl *c, struct ctl_inst *in);
/* The instance is being removed: withdraw it (del) if the coordinator has it. */
void ctl_push_forget(struct ctl *c, struct ctl_inst *in);
/* Queue one full set (coalesced). */
void ctl_push_full_set(struct ctl *c);
typedef void (*ctl_push_cb)(struct ctl *c, int64_t instance_id, int err, void *arg);
/* Withdraw `in` from the coordinator and call cb once the coordinator confirmed it
 * (err 0) or the push failed (err < 0). Sets in->withdrawn. cb may run synchronously. */
void ctl_push_withdraw(struct ctl *c, struct ctl_inst *in, ctl_push_cb cb, void *arg);
/* Whether `in` should be routable now, and the endpoints left out. */
bool ctl_push_wanted(struct ctl *c, const struct ctl_inst *in);

/* ---- ctl_faults.c ------------------------------------------------------------------ */
/* report_software_fault intake: answer status + body. */
json_t *ctl_fault_report(struct ctl *c, const struct wire_fault_report *r, int *status);
void ctl_faults_tick(struct ctl *c);
void ctl_faults_kick(struct ctl *c);
void ctl_faults_free(struct ctl_inst *in);
/* Escalation target: stop the instance's NMs (except `except_idx` >= 0) so the platform
 * restarts them, delete the instance, keep its runtime RECONFIGURING until a
 * replacement of the job is ready. `in` is freed. */
void ctl_reconfigure(struct ctl *c, struct ctl_inst *in, const char *reason, ssize_t except_idx);
/* A strategy finished: result true = recovered. Called by the strategies. */
void ctl_strategy_finished(struct ctl *c, int64_t instance_id, const char *strategy, bool ok,
                           const char *error);
/* Ids the heartbeat size rule lets an NM omit and the evaluation skips: committed
 * retired ranks, and the ranks a scale-down is removing (a node manager may commit
 * before the controller has heard every commit answer). Heap array (caller frees). */
int64_t *ctl_retired(struct ctl *c, const struct ctl_inst *in, size_t *n);
/* Stop the instance's running strategy (instance removed). */
void ctl_strategy_detach(struct ctl *c, struct ctl_inst *in);
/* Partial loss: remember / ask whether an instance was deleted with its survivors told
 * to stop (ctl_instmgr.c). */
void ctl_lost_add(struct ctl *c, int64_t id);
bool ctl_lost_has(const struct ctl *c, int64_t id);

/* ---- strategies --------------------------------------------------------------------- */
#define STRAT_RELAUNCH "EngineRelaunchStrategy"
#define STRAT_SCALE_DOWN "DpScaleDownStrategy"
#define STRAT_RECONFIG "InstanceReconfigurationStrategy"

/* The common head of every strategy object (in->strategy points at it). Each strategy
 * is a state table (ctl_fsm.h): its states, events and table live in its own file. */
struct ctl_strategy {
    const char *name;
    struct ctl *c;
    int64_t instance_id;
    const struct ctl_fsm *fsm; /* the strategy's table */
    int state;                 /* in fsm; a terminal state = finished */
    int inflight;              /* requests in flight: the object lives until they all finished */
    struct reactor_timer timer;
    void (*free_fn)(struct ctl_strategy *s);
    /* The instance went away: move to the strategy's DETACHED state (terminal, nothing
     * reported). */
    void (*detach_fn)(struct ctl_strategy *s);
};
/* In a terminal state (SUCCESS, FAILED, DETACHED): answers still in flight are dropped. */
bool ctl_strategy_over(const struct ctl_strategy *s);
/* Free a finished strategy once nothing is in flight. */
void ctl_strategy_release(struct ctl_strategy *s);

/* Start a strategy on `in` (0), or -1 when one runs already or it cannot apply. A start
 * that fails at once reports through ctl_strategy_finished() before returning 0, which
 * may free `in`. */
int ctl_relaunch_start(struct ctl *c, struct ctl_inst *in);
int ctl_scaledown_start(struct ctl *c, struct ctl_inst *in, const int64_t *candidates, size_t n);

/* The tables (ctl_fsm.h), for the unit tests and the docs. */
extern const struct ctl_fsm ctl_relaunch_fsm;
extern const struct ctl_fsm ctl_scaledown_fsm;

/* ---- the fault manager's recovery of an instance (ctl_faults.c) --------------------- */
enum ctl_rec_state {
    REC_IDLE = 0,    /* no strategy runs */
    REC_SCALE_DOWN,  /* DpScaleDownStrategy */
    REC_RELAUNCH,    /* EngineRelaunchStrategy */
    REC_RECONFIGURE, /* InstanceReconfigurationStrategy: the instance is deleted (terminal) */
};
#define REC_STATE_COUNT 4
enum ctl_rec_event {
    REC_EV_DEAD_SCALABLE = 0,    /* DEAD engines and the scale-down gate is open */
    REC_EV_DEAD_RELAUNCH,        /* DEAD engines, gate closed, engine relaunch enabled */
    REC_EV_DEAD_NO_STRATEGY,     /* DEAD engines and nothing applies (logged no_strategy) */
    REC_EV_FALLBACK_RELAUNCH,    /* a failed / interrupted scale-down falls back to relaunch */
    REC_EV_FALLBACK_RECONFIGURE, /* ... or to reconfiguration */
    REC_EV_RECOVERED,            /* the strategy succeeded: serve again */
    REC_EV_FAILED_RECONFIGURE,   /* engine relaunch failed: reconfiguration */
    REC_EV_EXHAUSTED,            /* engine relaunch failed, reconfiguration disabled */
    REC_EV_START_FAILED,         /* the strategy could not start */
    REC_EV_RECONFIGURE,          /* rebuild now (a member restarted and registered again) */
};
#define REC_EV_COUNT 10
extern const struct ctl_fsm ctl_recovery_fsm;

#endif
