/* nm_internal — the node manager's private contract between its modules.
 *
 * One `struct nodemgr` is created by node_manager_main() and passed to every module
 * (redis's `server`). Everything runs on one reactor thread: the HTTP API (httpd), the
 * Controller client and the engine probes (httpc), engine processes (proc, pidfds),
 * timers, signals and the config watch (inotify). Nothing here is thread-safe and
 * nothing needs to be.
 *
 * Modules and what they own:
 *   nm_main.c     command line, lifecycle, signals, shutdown (exit status 255), metrics
 *   nm_reload.c   config hot reload (inotify on the config file's directory)
 *   nm_api.c      the HTTP routes of spec §4 plus /metrics and /node-manager/engines
 *   nm_phase.c    the node manager's phase machine (table below) and the dispatcher of
 *                 engine events: the one place that drives the readiness wait, the
 *                 arbiter's freezes, FT polling and death reporting from what happened
 *   nm_launch.c   start commands (validation), launch-parameter persistence, the launch
 *                 and in-place relaunch (§7.1) mechanics the phase actions call, the
 *                 held requests they answer, the standalone boot start
 *   nm_engine.c   the engine service: the engine state machine (table below), one
 *                 supervised process per endpoint, death detection, /health probing
 *                 (§6.5), status mapping (§2.9), the local restart policy, engine output
 *   nm_death.c    fault reports of dead or abnormal engines to the Controller (§2.4):
 *                 dedup by pid and by fault episode, the freeze on acceptance, the
 *                 death-to-answer latency histogram
 *   nm_ctrl.c     the Controller client: register/backoff, heartbeat, reregister on 503,
 *                 software-fault reports (§5)
 *   nm_arbiter.c  suicide arbitration (§2.5), the freeze deadlines, the grace period
 *   nm_services.c the static service registry (§2.6): activation and the phases
 *   nm_kvstore.c  the kv_store service (§2.7): MMC_LOCAL_CONFIG_PATH for engines, the
 *                 KV local service process (local_service_command), restarts
 *   nm_ft.c       engine FT manager (§2.10): status polling, deduplicated reports
 *   nm_scaledown.c the DP scale-down proxy routes (§8.3: status/apply/guard/finalize)
 *
 * State machines (CONVENTIONS 16a; docs/node-manager.md has both tables):
 *   - an endpoint's engine is one `enum nm_engine_state`, changed only by
 *     nm_engine_event() through `nm_engine_table` (state x event -> action, next state);
 *   - the node manager itself is one `enum nm_phase`, changed only by nm_phase_event()
 *     through `nm_phase_table`.
 *   Each change is one log line (`engine_state` / `nm_phase`: from, to, event, cause);
 *   an event a state does not take is logged and ignored. nm_engine emits, the
 *   dispatcher (nm_phase_engine) fans out: readiness wait, restart policy or death
 *   report, grace.
 *
 * Extension points for later helpers:
 *   - struct nodemgr has opaque slots `ft`, `scaledown`, `kv`, `pool` for their state;
 *   - nm_route() registers extra routes on the NM's httpd (before the core's catch-alls:
 *     call it from the module's init, which runs before the core registers its routes);
 *   - the service registry (nm_services.c) is a static table of nm_service_ops;
 *   - retired endpoints (DP scale-down, nm_engine_retired()): the core leaves them out of
 *     heartbeats, probes, arbitration and death reports;
 *   - nm_freeze()/nm_unfreeze() with a cause: the FT guard uses NM_FREEZE_FT_GUARD. */
#ifndef MOTOR_NM_INTERNAL_H
#define MOTOR_NM_INTERNAL_H

#include "common/httpc.h"
#include "common/cfgwatch.h"
#include "common/httpd.h"
#include "common/metrics.h"
#include "common/proc.h"
#include "common/reactor.h"
#include "nodemgr/nm_config.h"
#include "wire/wire.h"
#include "wire/wire_msg.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct nodemgr;

/* Consecutive abnormal arbitration rounds before suicide (§2.5). */
#define NM_SUICIDE_THRESHOLD 5
/* Registration backoff (§2.8): 2, 4, 8, 16, 32, 32, ... seconds, forever. */
#define NM_REGISTER_BACKOFF_FIRST_MS 2000
#define NM_REGISTER_BACKOFF_MAX_MS 32000
/* Timeouts towards the Controller (§5.2, §5.6, §5.8). */
#define NM_REGISTER_TIMEOUT_MS 15000
#define NM_HEARTBEAT_TIMEOUT_MS 5000
#define NM_REPORT_TIMEOUT_MS 15000
/* Delay between answering POST /node-manager/stop and shutting down (§4). */
#define NM_STOP_EXIT_DELAY_MS 500
/* Probes of one endpoint in flight at once at most (each lives at most
 * health_collector_timeout; with upstream's 5 s and a 1 s period that is 5). More attempts
 * than this still count: a new probe waits for a free slot. */
#define NM_PROBES_MAX 8

/* Upper bound of the /health probe period (upstream's status thread: 1 s). */
#define NM_PROBE_PERIOD_MAX_MS 1000
/* Engine output: in-memory tail per endpoint and the longest line kept. */
#define NM_TAIL_RING_BYTES (128u * 1024u)
#define NM_TAIL_MAX_LINES 10000
/* Exit status of every shutdown path (upstream's sys.exit(-1)). */
#define NM_EXIT_STATUS 255

/* ---- runtime view of an engine (§5.9, §6.5) ------------------------------------------
 * The vocabulary of upstream's status mapping and of the `runtime_state` fault reports
 * carry: what an engine state (below) looks like from outside. */

enum nm_runtime {
    NM_RT_STARTING = 0, /* spawned, /health not yet OK, within startup_timeout */
    NM_RT_RUNNING,      /* headless endpoint alive (process-only probing) */
    NM_RT_READY,        /* /health OK */
    NM_RT_UNHEALTHY,    /* /health failing after having been ready, or startup timed out */
    NM_RT_STOPPING,     /* a stop was asked, the group is going down */
    NM_RT_STOPPED,      /* no process (never spawned, exited, or failed) */
};
const char *nm_runtime_str(enum nm_runtime rt);

/* §2.9: the endpoint status a runtime state maps to, given the previous status:
 * running => wait2start, ready => normal, unhealthy/stopped => abnormal,
 * starting/stopping => keep previous; a previous `paused` is kept whatever happens. */
enum wire_ep_status nm_status_from_runtime(enum nm_runtime rt, enum wire_ep_status prev);

/* The outcome of one /health probe round (§6.5). */
enum nm_probe_result { NM_PROBE_OK = 0, NM_PROBE_FAILED };
/* §6.5 state function after a probe of a live, non-headless process, read off the
 * engine table: ok => ready; failed => starting while the state is still starting and
 * the startup window (startup_timeout_ms since spawn) is open, else unhealthy. A runtime
 * no probe runs in (stopping, stopped) is returned unchanged. */
enum nm_runtime nm_runtime_after_probe(enum nm_runtime cur, enum nm_probe_result res,
                                       int64_t since_spawn_ms, int64_t startup_timeout_ms);

/* Local restart policy: the delay after `cur` (0 = first restart => initial), doubled
 * and capped at max. */
int64_t nm_backoff_next(int64_t cur_ms, int64_t initial_ms, int64_t max_ms);

/* ---- the engine state machine (nm_engine.c) ------------------------------------------
 * One state per endpoint. The states with a process (nm_engine_state_has_process) are
 * exactly those in which the endpoint's proc has not been reaped yet; a new engine
 * state is one enum value plus its row of nm_engine_table. */

enum nm_engine_state {
    NM_ES_STOPPED = 0,      /* no process: never spawned, exited (restart_policy
                               controller), stopped by a group stop, rolled back */
    NM_ES_STARTING,         /* spawned, /health not OK yet */
    NM_ES_RUNNING,          /* headless endpoint, its process alive (nothing to probe) */
    NM_ES_READY,            /* /health OK */
    NM_ES_UNHEALTHY,        /* /health failing after ready, or past startup_timeout */
    NM_ES_STOPPING,         /* a group stop takes the process down (SIGTERM, grace, SIGKILL) */
    NM_ES_BACKOFF,          /* local restart policy: dead, its restart timer armed */
    NM_ES_FAILED,           /* local restart policy gave up (restart_start_limit) */
    NM_ES_RETIRED,          /* DP scale-down committed; its process still runs, left alone */
    NM_ES_RETIRED_STOPPING, /* retired, and a group stop takes its process down */
    NM_ES_RETIRED_STOPPED,  /* retired, no process */
    NM_ES_COUNT,
};

enum nm_engine_event {
    NM_EV_NONE = -1,       /* no follow-up */
    NM_EV_SPAWNED = 0,     /* a process was started for the endpoint */
    NM_EV_SPAWN_FAILED,    /* a local restart could not start one */
    NM_EV_EXITED,          /* the pidfd fired: the process exited and was reaped */
    NM_EV_GONE,            /* the health check found it reaped without an exit event */
    NM_EV_PROBE_OK,        /* GET /health answered 2xx */
    NM_EV_PROBE_FAILED,    /* GET /health failed, within startup_timeout since the spawn */
    NM_EV_STARTUP_TIMEOUT, /* GET /health failed and startup_timeout since the spawn is over */
    NM_EV_ALIVE,           /* a probe round saw a headless endpoint's process alive */
    NM_EV_STOP,            /* a group stop (stop, relaunch, a start with another spec,
                              shutdown): stop the process, drop a pending restart */
    NM_EV_KILL,            /* kill now (shutdown deadline, second signal) */
    NM_EV_ROLLBACK,        /* a launch failed half-way: all or nothing (§6.1) */
    NM_EV_BACKOFF,         /* local restart policy: restart after the next backoff */
    NM_EV_GIVE_UP,         /* local restart policy: restart_start_limit reached */
    NM_EV_RESTART_DUE,     /* the backoff timer fired */
    NM_EV_RETIRE,          /* DP scale-down commit */
    NM_EV_RESET,           /* relaunch: restart bookkeeping back to zero */
    NM_EV_COUNT,
};

/* What a transition does besides changing the state (nm_engine.c runs the engine-local
 * part; the dispatcher reacts to DIED, SPAWN_FAILED and GIVE_UP). */
enum nm_engine_action {
    NM_EA_ILLEGAL = 0,    /* not an event this state takes: logged and ignored */
    NM_EA_NONE,           /* legal, nothing to do */
    NM_EA_SPAWNED,        /* a fresh story: status initial (unless paused) */
    NM_EA_SPAWN_FAILED,   /* status from `stopped`; dispatcher: restart policy again */
    NM_EA_DIED,           /* unexpected death: counted, logged, status; dispatcher: report
                             it (restart_policy controller) or the local restart policy */
    NM_EA_DIED_RETIRED,   /* a retired engine died: counted, logged, status; nobody told */
    NM_EA_STOPPED,        /* the exit a group stop asked for: logged */
    NM_EA_GONE,           /* lost exit event: status from `stopped` */
    NM_EA_PROBED,         /* status from the new state's runtime view */
    NM_EA_STOP,           /* SIGTERM the group (grace, SIGKILL), counted by the group stop */
    NM_EA_KILL,           /* SIGKILL the group and reap it now */
    NM_EA_CANCEL_RESTART, /* the pending restart is dropped */
    NM_EA_ROLLBACK,       /* kill now if alive; status from `stopped` */
    NM_EA_BACKOFF,        /* next backoff delay, restart timer armed */
    NM_EA_GIVE_UP,        /* logged; dispatcher: report the last death */
    NM_EA_RESTART,        /* count the restart, spawn: follow-up SPAWNED or SPAWN_FAILED */
    NM_EA_RETIRE,         /* logged */
    NM_EA_RESET,          /* backoff and restart window back to zero */
    NM_EA_COUNT,
};

/* One cell of the table: act == NM_EA_ILLEGAL for an event the state does not take. */
struct nm_engine_cell {
    uint8_t act;  /* enum nm_engine_action */
    uint8_t next; /* enum nm_engine_state */
};
extern const struct nm_engine_cell nm_engine_table[NM_ES_COUNT][NM_EV_COUNT];

const char *nm_engine_state_str(enum nm_engine_state s);
const char *nm_engine_event_str(enum nm_engine_event ev);
const char *nm_engine_action_str(enum nm_engine_action a);
/* The runtime view of a state: backoff/failed/retired_stopped look `stopped`; retired
 * and retired_stopping look `stopping` (status kept as it was). */
enum nm_runtime nm_engine_state_runtime(enum nm_engine_state s);
bool nm_engine_state_has_process(enum nm_engine_state s);
/* States that are probed (their /health, or the liveness of a headless process). */
bool nm_engine_state_probed(enum nm_engine_state s);
bool nm_engine_state_retired(enum nm_engine_state s);
/* The event a /health probe outcome is, since_spawn_ms after the spawn. */
enum nm_engine_event nm_engine_probe_event(enum nm_probe_result res, int64_t since_spawn_ms,
                                           int64_t startup_timeout_ms);

/* A transition that happened, as the dispatcher sees it. cause: static string. */
struct nm_engine_change {
    enum nm_engine_state from, to;
    enum nm_engine_event ev;
    enum nm_engine_action act;
    const char *cause;
};

/* ---- one endpoint ------------------------------------------------------------------ */

struct nm_endpoint {
    struct nodemgr *nm;
    size_t index;               /* position in this pod (device pinning, ports) */
    struct wire_endpoint ep;    /* from the start command (owned copy) */
    enum wire_ep_status status; /* what heartbeats report */
    enum nm_engine_state state; /* changed by nm_engine_event() only */

    struct proc *proc;      /* current or last process; NULL before the first spawn */
    pid_t pid;              /* of proc (kept after exit for logs/API) */
    char *log_path;         /* rotated output file, NULL = none */
    int64_t spawned_ms;     /* CLOCK_MONOTONIC of the last spawn */
    int64_t ready_since_ms; /* since when continuously ready, 0 = not ready */
    unsigned spawns;        /* processes started for this endpoint */

    /* The last exit (API, reports, restart policy); has_last_exit says it is filled. */
    bool has_last_exit;
    struct proc_status last_exit;
    int64_t last_exit_wall_ms;
    int64_t last_exit_mono_ms; /* when the pidfd said so (death report latency) */
    int64_t last_exit_uptime_ms;
    int64_t last_exit_healthy_ms; /* how long it had been continuously ready */

    /* /health probing, overlapped (nm_engine.c, "probing"): a new probe every probe
     * period while earlier ones are outstanding, each with its own timeout; the hang is
     * the attempts-th timeout in a row. Only probed states have probes in flight. */
    struct nm_probe {
        struct nm_endpoint *e;
        struct httpc_req *req; /* in flight, NULL when the slot is free */
        uint64_t seq;          /* send order */
    } probes[NM_PROBES_MAX];
    int n_probes;       /* slots in flight */
    uint64_t probe_seq; /* last seq sent */
    int probe_timeouts; /* timeouts in a row since the last answer */

    /* Facts about the endpoint's history, not phases of its engine (they outlive every
     * state change and are reset by other rules): */
    bool ever_normal;        /* §2.5 ever-NORMAL rule: it has been `normal` at least once
                                since the start command (arbitration reports only those) */
    bool reported_abnormal;  /* §2.5 dedup: reported in this fault episode (nm_death.c);
                                cleared by a healthy arbitration round or a relaunch */
    pid_t reported_dead_pid; /* dedup: the death of this pid was accepted already */

    /* local restart policy (restart_timer armed exactly while state == NM_ES_BACKOFF) */
    struct reactor_timer restart_timer;
    int64_t backoff_ms; /* delay used by the last restart, 0 = none yet */
    int window_starts;  /* restarts since the backoff was last reset */
};

static inline bool nm_engine_retired(const struct nm_endpoint *e)
{
    return nm_engine_state_retired(e->state);
}

/* ---- service registry (§2.6) ------------------------------------------------------- */

typedef void (*nm_done_fn)(struct nodemgr *nm, void *arg);

/* A service vtable. All callbacks run on the reactor thread; any may be NULL.
 *   create:       allocate the service state (*state); 0 or -errno (the NM then exits 1).
 *   prepare:      before engines are (re)launched, lowest prepare_priority first;
 *                 idempotent (re-run on relaunch). 0 or -errno (start fails with 500).
 *   pull:         launch the service for the current start command (nm->launch; NULL in
 *                 separated mode at boot). 0 or -errno; err gets a message.
 *   stop:         stop everything, gracefully (grace_ms), then call done(nm, arg)
 *                 exactly once (from the loop or synchronously). Idempotent.
 *   kill_now:     shutdown path: kill everything synchronously.
 *   health_check: called every basic_config.daemon_loop_interval; the service handles
 *                 its own recovery.
 *   destroy:      free the state (after stop/kill_now). */
struct nm_service_ops {
    const char *name;     /* "engine", "kv_store" */
    const char *backend;  /* activation tag: "engine", "memcache", "mooncake" */
    int prepare_priority; /* lower first; < 0 = not preparable */
    int (*create)(struct nodemgr *nm, void **state);
    int (*prepare)(struct nodemgr *nm, void *state, int endpoints_count);
    int (*pull)(struct nodemgr *nm, void *state, struct wire_err *err);
    void (*stop)(struct nodemgr *nm, void *state, int64_t grace_ms, nm_done_fn done, void *arg);
    void (*kill_now)(struct nodemgr *nm, void *state);
    void (*health_check)(struct nodemgr *nm, void *state);
    void (*destroy)(struct nodemgr *nm, void *state);
};

struct nm_service {
    const struct nm_service_ops *ops;
    void *state;
};

#define NM_MAX_SERVICES 4

/* The registry's static table (nm_services.c) and the kv_store entries (nm_kvstore.c). */
extern const struct nm_service_ops nm_engine_service_ops;
extern const struct nm_service_ops nm_kv_memcache_service_ops;
extern const struct nm_service_ops nm_kv_mooncake_service_ops;

/* Activate the services the config asks for (§2.4: no KV => engine; separated => the KV
 * backend only; else engine + KV backend), create them in registration order, preparable
 * ones first by ascending priority. 0 or -errno (logged). */
int nm_services_create(struct nodemgr *nm);
/* prepare() on every preparable service. 0 or the first -errno. */
int nm_services_prepare(struct nodemgr *nm, int endpoints_count);
/* pull() on every non-engine service (the engine is pulled by nm_launch). */
int nm_services_pull_others(struct nodemgr *nm, struct wire_err *err);
/* health_check() on all. */
void nm_services_health_check(struct nodemgr *nm);
/* Stop all services in reverse order, then done(nm, arg). */
void nm_services_stop(struct nodemgr *nm, int64_t grace_ms, nm_done_fn done, void *arg);
void nm_services_kill_now(struct nodemgr *nm);
void nm_services_destroy(struct nodemgr *nm);
/* The state of the service named `name`, or NULL when inactive. */
void *nm_service_state(struct nodemgr *nm, const char *name);

/* ---- freeze (§2.5) ------------------------------------------------------------------
 * Deadline-based; a freeze never shortens an existing deadline of the same cause. Unlike
 * upstream (one global deadline, §12.11) each cause has its own deadline, so an unfreeze
 * cancels only its own cause's freeze. Any active deadline freezes arbitration. */
enum nm_freeze_cause {
    NM_FREEZE_FAULT = 0, /* a death/abnormal report accepted: wait for the Controller */
    NM_FREEZE_RELAUNCH,  /* an in-place relaunch is running */
    NM_FREEZE_FT_GUARD,  /* a DP scale-down transaction owns the guard */
    NM_FREEZE_COUNT,
};
const char *nm_freeze_cause_str(enum nm_freeze_cause c);

/* ---- suicide arbitration (§2.5), a pure state machine ------------------------------ */

struct nm_arbiter {
    uint64_t generation; /* last endpoints generation seen */
    int counter;         /* consecutive abnormal rounds */
    bool suicide;        /* the flag */
    int64_t freeze_until[NM_FREEZE_COUNT];
};

/* What a round sees of one endpoint. ever_normal / reported are updated in place. */
struct nm_arb_ep {
    int64_t id;
    enum wire_ep_status status;
    bool excluded;    /* retired, or awaiting a local restart: not counted */
    bool ever_normal; /* in/out */
    bool reported;    /* in/out: reported abnormal in this episode */
};

struct nm_arb_input {
    int64_t now_ms;
    uint64_t generation;
    bool in_grace;
    bool suicide_enabled; /* container_restart_managed */
    struct nm_arb_ep *eps;
    size_t n_eps;
};

enum nm_arb_outcome {
    NM_ARB_GENERATION_RESET = 0, /* step 1 */
    NM_ARB_SKIPPED,              /* step 2: frozen or in grace */
    NM_ARB_ABNORMAL,             /* step 4a */
    NM_ARB_HEALTHY,              /* step 4b */
};

void nm_arbiter_init(struct nm_arbiter *a);
/* One round. Endpoints to report (ABNORMAL, ever NORMAL, not yet reported) get their
 * index written to report_idx (capacity n_eps) and counted in *n_report; the caller
 * marks them `reported` only once the Controller accepted (here `reported` is not set).
 * Returns what happened; a->suicide is set when the threshold is reached (and
 * suicide_enabled). */
enum nm_arb_outcome nm_arbiter_round(struct nm_arbiter *a, const struct nm_arb_input *in,
                                     size_t *report_idx, size_t *n_report);
void nm_arbiter_freeze(struct nm_arbiter *a, enum nm_freeze_cause c, int64_t now_ms,
                       int64_t duration_ms);
void nm_arbiter_unfreeze(struct nm_arbiter *a, enum nm_freeze_cause c);
bool nm_arbiter_frozen(const struct nm_arbiter *a, int64_t now_ms);
/* Counter and flag back to zero (after a successful relaunch: a new fault episode). */
void nm_arbiter_reset(struct nm_arbiter *a);

/* ---- Controller client state ------------------------------------------------------- */

struct nm_call; /* a tracked request to the Controller (nm_ctrl.c) */

struct nm_ctrl {
    bool enabled;         /* false: standalone / separated (no Controller at all) */
    char *base_url;       /* "http(s)://host:port" */
    struct httpc_tls tls; /* client TLS (mgmt_tls_config) */
    char *tls_password;
    bool use_tls;

    /* registration */
    bool registered;
    bool register_inflight;
    int64_t register_backoff_ms;
    unsigned register_attempts;
    struct reactor_timer register_timer;

    /* heartbeats (started by the first start command) */
    bool hb_started;
    bool hb_inflight;
    struct reactor_timer hb_timer;
    bool reregister_inflight;
    int64_t hb_last_error_log_ms; /* rate limit of heartbeat error logs */
    unsigned hb_errors_suppressed;

    struct nm_call *calls; /* every request in flight (freed on shutdown) */
};

/* ---- metrics ----------------------------------------------------------------------- */

struct nm_metrics {
    struct metrics_registry *reg;
    struct metrics_counter *spawns, *deaths, *local_restarts, *relaunches, *probe_failures;
    struct metrics_counter *reports_accepted, *reports_rejected, *reports_failed;
    struct metrics_counter *hb_ok, *hb_failed, *hb_503, *reg_ok, *reg_failed;
    struct metrics_counter *reloads_ok, *reloads_failed;
    struct metrics_histogram *death_report_latency;
};

/* ---- the node manager's phase machine (nm_phase.c) ------------------------------------
 * What the node manager as a whole is doing. Requests and callbacks turn into phase
 * events; nm_phase_event() looks the (phase, event) cell up in nm_phase_table, moves to
 * the cell's next phase (one `nm_phase` log line), runs the cell's action (which may
 * yield one follow-up event, processed at once). Events raised while an action runs
 * (a group stop that is over at once, an engine that changed state) are queued and
 * processed after it, in order, each kind at most once (run to completion). */

enum nm_phase {
    NM_PH_IDLE = 0,           /* no start carried out (boot, or the last start failed) */
    NM_PH_STOPPING_FOR_START, /* a start with another spec: the old engines go first */
    NM_PH_STARTING,           /* engines of a start launched: readiness wait */
    NM_PH_RUNNING,            /* a start carried out, nothing in progress */
    NM_PH_RELAUNCH_STOPPING,  /* engine-restart accepted: every engine group stops */
    NM_PH_RELAUNCHING,        /* engines relaunched in place: readiness wait (§7.1) */
    NM_PH_EXITING,            /* POST /node-manager/stop accepted: services stop, then
                                 the shutdown (no more starts or relaunches) */
    NM_PH_SHUTTING_DOWN,      /* the shutdown (exit status 255) */
    NM_PH_COUNT,
};

enum nm_phase_event {
    NM_PEV_NONE = -1,
    NM_PEV_START = 0,        /* a valid start command while engines are alive */
    NM_PEV_LAUNCH,           /* a valid start command with no engine alive */
    NM_PEV_RELAUNCH,         /* a valid engine-restart (services prepared) */
    NM_PEV_STOP,             /* POST /node-manager/stop */
    NM_PEV_SHUTDOWN,         /* nm_shutdown(): signal, suicide, stdin "stop", /stop's end */
    NM_PEV_ENGINES_STOPPED,  /* the group stop a phase asked for is over */
    NM_PEV_SERVICES_STOPPED, /* /stop: every service stopped */
    NM_PEV_ENGINES_CHANGED,  /* an engine changed state: re-evaluate the readiness wait */
    NM_PEV_READY,            /* every (non-retired) endpoint ready (headless: running) */
    NM_PEV_ENGINE_LOST,      /* an engine died while loading (restart_policy controller) */
    NM_PEV_WAIT_TIMEOUT,     /* startup_timeout elapsed in a readiness wait */
    NM_PEV_LAUNCH_FAILED,    /* the launch or the relaunch's respawn failed */
    NM_PEV_COUNT,
};

enum nm_phase_action {
    NM_PA_ILLEGAL = 0,        /* not an event this phase takes: logged and ignored */
    NM_PA_NONE,               /* legal, nothing to do */
    NM_PA_REJECT_BUSY,        /* a request refused: 409 (another one in progress) */
    NM_PA_REJECT_STOPPING,    /* a request refused: 503 "Node manager is stopping" */
    NM_PA_STOP_FOR_START,     /* stop every engine group, then ENGINES_STOPPED */
    NM_PA_LAUNCH,             /* launch the held start command, answer it, arm the wait */
    NM_PA_RELAUNCH_STOP,      /* stop every engine group, then ENGINES_STOPPED */
    NM_PA_RESPAWN,            /* banner, respawn from the launch parameters, answer, wait */
    NM_PA_EXIT,               /* the Controller hears nothing more; every service stops */
    NM_PA_EXIT_SOON,          /* answer /stop; the shutdown NM_STOP_EXIT_DELAY_MS later */
    NM_PA_ANSWER_STOP,        /* answer /stop (already shutting down) */
    NM_PA_SHUTDOWN,           /* the shutdown itself (nm_shutdown_run) */
    NM_PA_ABANDON,            /* a held start/relaunch answered 503 (stopping) */
    NM_PA_CHECK_START,        /* all ready? => READY */
    NM_PA_CHECK_RELAUNCH,     /* all ready? => READY; an engine lost? => ENGINE_LOST */
    NM_PA_STARTED,            /* engines ready after a start: FT polling may begin */
    NM_PA_START_NOT_READY,    /* logged; the engines stay what they are */
    NM_PA_RELAUNCHED,         /* freezes lifted, new fault episode, FT polling resumed */
    NM_PA_RELAUNCH_NOT_READY, /* logged; FT stays paused, the relaunch freeze expires */
    NM_PA_COUNT,
};

struct nm_phase_cell {
    uint8_t act;  /* enum nm_phase_action */
    uint8_t next; /* enum nm_phase */
};
extern const struct nm_phase_cell nm_phase_table[NM_PH_COUNT][NM_PEV_COUNT];

const char *nm_phase_str(enum nm_phase p);
const char *nm_phase_event_str(enum nm_phase_event ev);
const char *nm_phase_action_str(enum nm_phase_action a);

/* Pending phase events (see above): each kind at most once, so NM_PEV_COUNT slots. */
struct nm_phase_queue {
    int8_t ev[NM_PEV_COUNT];
    const char *cause[NM_PEV_COUNT];
    unsigned n;
    unsigned running; /* nesting depth of nm_phase_event() (0 = not processing) */
};

/* ---- the daemon -------------------------------------------------------------------- */

struct nodemgr {
    struct reactor *r;
    struct nm_config *cfg; /* live config; swapped whole on reload */
    char *state_path;      /* launch-parameter file */
    int port_override;     /* --port (-1 = from the config; 0 = ephemeral) */
    uint16_t api_port;     /* bound port */
    struct httpd *api;
    struct httpc *ctl_http;   /* Controller */
    struct httpc *probe_http; /* engine /health probes */
    struct nm_metrics m;
    int64_t boot_ms;

    /* lifecycle: the phase, changed by nm_phase_event() only */
    enum nm_phase phase;
    struct nm_phase_queue phq;
    int exit_code;
    struct reactor_timer stop_exit_timer; /* POST /stop => shutdown 0.5 s later */
    struct reactor_timer shutdown_timer;  /* deadline of the graceful shutdown */
    struct reactor_timer tick_timer;      /* daemon_loop_interval: health checks */
    struct reactor_timer wait_timer;      /* startup_timeout of a readiness wait, armed
                                             only in NM_PH_STARTING / NM_PH_RELAUNCHING */

    /* services */
    struct nm_service services[NM_MAX_SERVICES];
    size_t n_services;
    bool has_engine; /* configuration fact: the engine service is active */

    /* the current start command (RegisterManager) and its endpoints (HeartbeatManager) */
    struct wire_start_cmd *launch; /* stored launch params, NULL = no start recorded */
    struct nm_endpoint **eps;      /* endpoints of the current start, n_eps of them */
    size_t n_eps;
    uint64_t generation; /* bumped by every accepted (non-identical) start */
    /* §2.5's cold-start grace period: an input of arbitration that runs alongside the
     * phases, from a start (or the first relaunch of restored parameters) to its end
     * condition (first normal endpoint, startup_timeout, a death) — not a phase. */
    bool grace;
    int64_t grace_since_ms;
    struct reactor_timer probe_timer;

    /* group stop of every engine (stop, relaunch, restart with another spec) */
    unsigned stops_pending;
    struct nm_stop_waiter *stop_waiters;

    /* Requests held until a phase is over (data the phase actions answer; the phase,
     * not these pointers, says what is going on — a client may go away meanwhile). */
    unsigned relaunch_count;
    struct httpd_req *pending_req;        /* the start/relaunch answered after its stop */
    struct wire_start_cmd *pending_start; /* the start command waiting to be launched */
    struct httpd_req *stop_req;           /* POST /stop, answered once everything stopped */

    struct nm_ctrl ctrl;
    struct nm_arbiter arb;
    struct reactor_timer arb_timer;

    /* hot reload: the watch on the config file's directory (common/cfgwatch.h) */
    struct cfgwatch *watch;

    /* engine output passthrough to the NM's stdout */
    int passthrough_fd; /* -1 = none */
    /* Upstream's daemon loop reads stdin: a line "stop" ends it (nm_main.c). */
    bool stdin_watched;
    char stdin_line[64];
    size_t stdin_len;
    bool passthrough_socket; /* stdout is a socket: send with MSG_DONTWAIT */
    uint64_t passthrough_dropped;

    /* Extra environment of engine processes ("NAME=value"), set by services' prepare
     * (the KV store's MMC_LOCAL_CONFIG_PATH) and owned by the service that sets it;
     * applied under engine_cmd's own variables at every spawn. */
    struct wire_strlist engine_env;

    /* extension slots (opaque to the core) */
    void *ft;
    void *scaledown;
    void *kv;
    void *pool;
};

/* Arm a timer of struct nodemgr (all are reactor_timer_init'ed once at creation, so
 * arming an already armed one just reschedules it). */
static inline void nm_timer_start(struct reactor *r, struct reactor_timer *t, reactor_timer_cb cb,
                                  void *arg, int64_t delay_ms, int64_t interval_ms)
{
    t->cb = cb;
    t->arg = arg;
    reactor_timer_start(r, t, delay_ms, interval_ms);
}

/* ---- nm_main.c ---------------------------------------------------------------------- */
/* Ask for the graceful shutdown (idempotent): NM_PEV_SHUTDOWN. The process exits with
 * NM_EXIT_STATUS. reason: a static string. */
void nm_shutdown(struct nodemgr *nm, const char *reason);
/* The shutdown itself (the action of NM_PEV_SHUTDOWN): stop heartbeats and
 * registration, the FT manager, the services (engines: SIGTERM, grace, SIGKILL,
 * sweep), then end the loop. */
void nm_shutdown_run(struct nodemgr *nm, const char *reason);
/* Register a route on the NM's API server (see httpd_route). */
void nm_route(struct nodemgr *nm, const char *method, const char *pattern, httpd_handler fn,
              void *arg, unsigned flags);
/* Interval helpers from the live config. */
int64_t nm_heartbeat_interval_ms(const struct nodemgr *nm);
int64_t nm_probe_period_ms(const struct nodemgr *nm);
/* Cancel an endpoint's /health probes in flight (state change, stop, free). */
void nm_engine_probes_cancel(struct nm_endpoint *e);
int64_t nm_stop_grace_ms(const struct nodemgr *nm);

/* ---- nm_reload.c -------------------------------------------------------------------- */
int nm_reload_init(struct nodemgr *nm);
void nm_reload_free(struct nodemgr *nm);
/* Reload now (SIGHUP, tests). Returns 0 when a new config was applied or nothing
 * changed, -EINVAL when the new file is invalid (old config kept). */
int nm_reload_now(struct nodemgr *nm);

/* ---- nm_api.c ----------------------------------------------------------------------- */
int nm_api_init(struct nodemgr *nm); /* creates nm->api and registers the routes */
/* Body helpers shared with the FT/KV/pool modules. */
void nm_respond_detail(struct httpd_req *req, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- nm_phase.c --------------------------------------------------------------------- */
/* Raise a phase event (see the table above). cause: a static string (logged). */
void nm_phase_event(struct nodemgr *nm, enum nm_phase_event ev, const char *cause);
/* What the current phase would do with ev, without doing it (requests read their
 * verdict — NM_PA_REJECT_* — before they validate further). */
enum nm_phase_action nm_phase_verdict(const struct nodemgr *nm, enum nm_phase_event ev);
/* Phase queries for the other modules. */
static inline bool nm_shutting_down(const struct nodemgr *nm)
{
    return nm->phase == NM_PH_SHUTTING_DOWN;
}
/* /stop accepted or shutting down: the Controller hears nothing more. */
static inline bool nm_stopping(const struct nodemgr *nm)
{
    return nm->phase == NM_PH_EXITING || nm->phase == NM_PH_SHUTTING_DOWN;
}
static inline bool nm_relaunching(const struct nodemgr *nm)
{
    return nm->phase == NM_PH_RELAUNCH_STOPPING || nm->phase == NM_PH_RELAUNCHING;
}
/* The dispatcher: every engine transition (nm_engine_event) ends here. It re-evaluates
 * the readiness wait (NM_PEV_ENGINES_CHANGED), and for a death applies the restart
 * policy: local => the backoff (nm_engine_restart_policy), controller => the grace ends
 * and the death is reported (nm_death_report); a local give-up is reported too. */
void nm_phase_engine(struct nm_endpoint *e, const struct nm_engine_change *c);

/* ---- nm_launch.c -------------------------------------------------------------------- */
/* POST /node-manager/start, /engine-restart, /stop: validation, then a phase event (the
 * request may be held and answered by the phase's action). */
void nm_launch_handle_start(struct nodemgr *nm, struct httpd_req *req);
void nm_launch_handle_restart(struct nodemgr *nm, struct httpd_req *req);
void nm_launch_handle_stop(struct nodemgr *nm, struct httpd_req *req);
/* Load the persisted launch parameters (boot). Missing file: fine. */
void nm_launch_restore(struct nodemgr *nm);
/* The stop route: remove the launch-parameter file (the launch is void). */
void nm_launch_forget(struct nodemgr *nm);
/* Standalone boot start: synthesize a start from the config and launch. 0 or -errno. */
int nm_launch_standalone(struct nodemgr *nm);
/* The launch of nm->pending_start (taken): services prepared, endpoints set,
 * generation bumped, grace begun, engines spawned, other services pulled, parameters
 * saved, probes and heartbeats started. 0, or -errno with the answer's detail in why
 * (nothing is left launched). */
int nm_launch_begin(struct nodemgr *nm, char *why, size_t cap);
/* The relaunch's respawn after its group stop: banner, restart state reset, engines
 * spawned from nm->launch, parameters saved, probes and heartbeats started. 0, or
 * -errno with the engine error in why. */
int nm_launch_respawn(struct nodemgr *nm, char *why, size_t cap);
/* Answer the held start/relaunch request (if its client is still there); body taken. */
void nm_launch_answer_json(struct nodemgr *nm, int status, json_t *body);
void nm_launch_answer_error(struct nodemgr *nm, int status, const char *detail);
/* Answer the held /stop request, if any. */
void nm_launch_answer_stop(struct nodemgr *nm);
/* A held start/relaunch will not happen (stopping): 503, pending start freed. */
void nm_launch_abandon(struct nodemgr *nm);
/* Shutdown: drop the pending start, stop the exit timer. */
void nm_launch_shutdown(struct nodemgr *nm);
/* Serialize / parse the persisted launch parameters (pure; unit-tested). */
json_t *nm_launch_state_to_json(const struct wire_start_cmd *launch, unsigned relaunch_count);
int nm_launch_state_parse(json_t *j, struct wire_start_cmd *out, struct wire_err *err);

/* ---- nm_engine.c -------------------------------------------------------------------- */
/* The one way an engine changes state: look up (e->state, ev), log the change, run the
 * action (and its follow-up), tell the dispatcher. An illegal event is logged
 * (`engine_event_ignored`) and ignored. cause: a static string. */
void nm_engine_event(struct nm_endpoint *e, enum nm_engine_event ev, const char *cause);
/* Local restart policy after a death (healthy_ms: how long the dead process had been
 * ready) or a failed restart (0): NM_EV_BACKOFF, or NM_EV_GIVE_UP at the start limit. */
void nm_engine_restart_policy(struct nm_endpoint *e, int64_t healthy_ms);
/* Replace the endpoint set by the start command's endpoints (all statuses as received,
 * normally initial; every engine `stopped`). Frees the old endpoints (their processes
 * must be gone). */
void nm_engine_set_endpoints(struct nodemgr *nm, const struct wire_start_cmd *cmd);
void nm_engine_free_endpoints(struct nodemgr *nm);
/* Spawn one process per (non-retired) endpoint from nm->launch. On failure every
 * process started by this call is killed and -errno returned with err set. */
int nm_engine_spawn_all(struct nodemgr *nm, struct wire_err *err);
/* Graceful stop of every live engine group; done(nm, arg) once all are reaped (maybe
 * synchronously when nothing runs). */
void nm_engine_stop_all(struct nodemgr *nm, int64_t grace_ms, nm_done_fn done, void *arg);
void nm_engine_kill_all_now(struct nodemgr *nm);
bool nm_engine_any_alive(const struct nodemgr *nm);
/* Start/stop the probe timer. */
void nm_engine_probes_start(struct nodemgr *nm);
void nm_engine_probes_stop(struct nodemgr *nm);
void nm_engine_probes_reconfigure(struct nodemgr *nm);
/* Print the relaunch banner to stdout and every endpoint's log file. */
void nm_engine_banner(struct nodemgr *nm, const char *text);
/* Endpoint by id (NULL if none). */
struct nm_endpoint *nm_engine_find(struct nodemgr *nm, int64_t id);
/* Set a status (keeps ever_normal/grace bookkeeping). */
void nm_engine_set_status(struct nm_endpoint *e, enum wire_ep_status st, const char *cause);
/* Status predicates (§2.9, non-retired endpoints): strict = non-empty and all normal;
 * relaxed = non-empty and none abnormal. */
bool nm_engine_all_normal(const struct nodemgr *nm);
bool nm_engine_none_abnormal(const struct nodemgr *nm);
/* Every endpoint ready (headless: running). */
bool nm_engine_all_ready(const struct nodemgr *nm);
/* Some non-retired endpoint looks `stopped` (no process: stopped, backoff, failed). */
bool nm_engine_any_stopped(const struct nodemgr *nm);
/* Not counted by arbitration: retired, or awaiting a local restart. */
bool nm_engine_excluded(const struct nm_endpoint *e);
/* Retire endpoints (DP scale-down commit): validated by the caller. */
void nm_engine_retire(struct nodemgr *nm, const int64_t *ids, size_t n);
/* JSON for GET /node-manager/engines. */
json_t *nm_engine_list_json(struct nodemgr *nm);
/* Reset the local restart state (a relaunch): NM_EV_RESET to every endpoint. */
void nm_engine_reset_restart_state(struct nodemgr *nm);
/* Open the passthrough fd (stdout, non-blocking where possible). */
void nm_engine_passthrough_init(struct nodemgr *nm);

/* ---- nm_death.c ---------------------------------------------------------------------- */
/* Report the death of e's last process (EngineDeadError, engine_status 1, pid, exit
 * code, signal in additional_info, source "pidfd") right away (§2.4 process monitor).
 * Not for a retired endpoint, nor twice for one pid once accepted. exited_ms: the
 * monotonic time of the death (the latency histogram observes it at the answer). */
void nm_death_report(struct nm_endpoint *e, int64_t exited_ms);
/* Report an endpoint arbitration found abnormal (§2.5), once per fault episode (marked
 * in flight; confirmed by acceptance). Standalone: logged only. */
void nm_death_report_abnormal(struct nm_endpoint *e);

/* ---- nm_ctrl.c ---------------------------------------------------------------------- */
void nm_ctrl_init(struct nodemgr *nm);
void nm_ctrl_free(struct nodemgr *nm);
/* The config was swapped: rebuild the Controller URL and client TLS from it. */
void nm_ctrl_reconfigure(struct nodemgr *nm);
/* Begin registering (no-op when disabled or no job name). */
void nm_ctrl_start_register(struct nodemgr *nm);
/* Start heartbeats (idempotent); first one at once. */
void nm_ctrl_heartbeat_start(struct nodemgr *nm);
void nm_ctrl_heartbeat_reconfigure(struct nodemgr *nm);
/* Stop timers (shutdown); requests in flight are cancelled by nm_ctrl_free. */
void nm_ctrl_stop(struct nodemgr *nm);
/* Report a software fault. rep is consumed (released). cb(nm, accepted, arg) is called
 * once, unless the NM shuts down first (then free_arg(arg) is called instead when
 * set). No Controller => cb(nm, false, arg) from the loop. */
typedef void (*nm_report_cb)(struct nodemgr *nm, bool accepted, void *arg);
void nm_ctrl_report_fault(struct nodemgr *nm, struct wire_fault_report *rep, nm_report_cb cb,
                          void *arg, void (*free_arg)(void *));
/* Build the RegisterMsg / HeartbeatMsg bodies (unit-tested). */
json_t *nm_ctrl_register_body(struct nodemgr *nm);
json_t *nm_ctrl_heartbeat_body(struct nodemgr *nm);

/* ---- nm_arbiter.c (daemon glue; the pure part is above) ----------------------------- */
void nm_arb_start(struct nodemgr *nm);
void nm_arb_stop(struct nodemgr *nm);
void nm_arb_reconfigure(struct nodemgr *nm);
void nm_freeze(struct nodemgr *nm, enum nm_freeze_cause c, int64_t duration_ms, const char *why);
void nm_unfreeze(struct nodemgr *nm, enum nm_freeze_cause c, const char *why);
bool nm_frozen(const struct nodemgr *nm);
/* A new fault episode: counter and flag reset, reported-abnormal set cleared. */
void nm_arb_new_episode(struct nodemgr *nm);
/* Grace bookkeeping: ends at the first NORMAL, at startup_timeout, or at a death. */
void nm_grace_end(struct nodemgr *nm, const char *cause);

/* ---- nm_pool.c (the worker pool of nodemgr/pool.h; config key worker_pool) --------- */
/* Append the worker pool's motor_pool_* families to a /metrics answer (none without). */
void nm_pool_render_metrics(struct nodemgr *nm, struct strbuf *sb);
/* Create nm->pool and register its routes when worker_pool.enable (before the core
 * routes, from nm_api_init). 0 or -errno (invalid block: the NM does not start). */
int nm_pool_init(struct nodemgr *nm);
/* Shutdown: answer held calls 503, SIGTERM every worker (nm_shutdown). */
void nm_pool_shutdown(struct nodemgr *nm);
/* Stop what is left (bounded wait, then SIGKILL) and free; before httpd_free. */
void nm_pool_free(struct nodemgr *nm);
/* The worker_pool block's keys (docs: common/cfgtab.h). */
extern const struct cfgtab nm_pool_cfgtab;

/* ---- nm_ft.c ------------------------------------------------------------------------ */
/* Create nm->ft (its HTTP client, metrics) and register GET /node-manager/fault-tolerance.
 * Called before the core routes. 0 or -errno. */
int nm_ft_init(struct nodemgr *nm);
void nm_ft_free(struct nodemgr *nm);
/* Engines became ready after a start (start polling when FT is enabled). */
void nm_ft_engines_ready(struct nodemgr *nm);
/* Relaunch: pause polling while engines are down; resume (dedup/failure state cleared). */
void nm_ft_pause(struct nodemgr *nm);
void nm_ft_resume(struct nodemgr *nm);
/* A new start command replaced the endpoints: per-endpoint state dropped, polling
 * waits for the new engines. */
void nm_ft_endpoints_reset(struct nodemgr *nm);
/* The config was reloaded (start/stop polling on an enable flip). */
void nm_ft_config_updated(struct nodemgr *nm);
/* Shutdown: stop polling. */
void nm_ft_stop(struct nodemgr *nm);
/* For the scale-down proxy (nm_scaledown.c), which shares the FT manager's HTTP client
 * and feeds its dedup. Both cap an engine's FT answer and an error text alike: */
#define NM_FT_MAX_RESPONSE (1u << 20)
#define NM_FT_ERR_MAX 600
struct httpc *nm_ft_http(struct nodemgr *nm);
int64_t nm_ft_poll_timeout_ms(const struct nodemgr *nm);
/* http://<ip>:<port><path> of an endpoint's engine (heap). */
/* An engine's URL for path: https:// when the engines serve TLS (nm_engine_client_tls). */
char *nm_ft_endpoint_url(const struct nm_endpoint *e, const char *path);
/* infer_tls_config as the node manager's client towards its engines (probes, FT polls,
 * scale-down calls): *out filled (borrowed strings); true when the engines serve TLS. */
bool nm_engine_client_tls(const struct nodemgr *nm, struct httpc_tls *out);
/* A failed answer as text: transport error, or "http <status>: <body>". */
void nm_ft_resp_error_text(const struct httpc_response *resp, char *buf, size_t cap);
/* The endpoint's raw entry in an engine's status reply (new reference), or NULL with
 * the reason in why. */
json_t *nm_ft_find_entry(const struct httpc_response *resp, int64_t id, char *why, size_t cap);
/* A status entry the proxy saw (§8.3: feeds the report dedup while polling). */
void nm_ft_feed_entry(struct nodemgr *nm, int64_t id, json_t *raw);
/* A committed retirement: the endpoint's poll state is dropped. */
void nm_ft_forget(struct nodemgr *nm, int64_t id);
/* GET /node-manager/fault-tolerance: the scale-down proxy adds its keys (below). */

/* ---- nm_scaledown.c ------------------------------------------------------------------ */
/* Register the DP scale-down proxy routes (/node-manager/fault-tolerance/{status,apply,
 * guard,finalize}) and create nm->scaledown; after nm_ft_init. 0 or -errno. */
int nm_scaledown_init(struct nodemgr *nm);
/* Fan-outs in flight freed (their HTTP requests went with the server); after httpd_free,
 * before nm_ft_free. */
void nm_scaledown_free(struct nodemgr *nm);
/* A new start command: a commit still settling ends (its freeze lifted). */
void nm_scaledown_endpoints_reset(struct nodemgr *nm);
/* Right before each arbitration round: ends the post-commit freeze of a DP scale-down
 * once no survivor is abnormal (or its bounded window is over). */
void nm_scaledown_before_arbitration(struct nodemgr *nm);
/* proxy_enabled, guard_owner, guard_left_seconds, commit_settling into o. */
void nm_scaledown_state_json(struct nodemgr *nm, json_t *o);

/* The FT manager's per-endpoint poll bookkeeping (§2.10), a pure state machine
 * (unit-tested): consecutive transport failures => one EngineDeadError; consecutive
 * 404s => "unsupported"; non-healthy statuses reported once per signature. */
struct wire_ft_engine_entry;
struct nm_ft_track {
    int failures;              /* consecutive failed polls (transport, HTTP, body) */
    int n404;                  /* consecutive 404 answers */
    bool unsupported;          /* the engine has no FT API: re-probed now and then */
    bool unreachable_reported; /* the "unreachable" report of this failure run went out */
    char *sig;                 /* signature last seen healthy or delivered; NULL = none */
};
enum nm_ft_event { NM_FT_EV_OK = 0, NM_FT_EV_NOT_FOUND, NM_FT_EV_FAILED };
#define NM_FT_REPORT_STATUS 0x1u      /* report entry (signature in *sig_out) */
#define NM_FT_REPORT_UNREACHABLE 0x2u /* report EngineDeadError: failures reached the max */
#define NM_FT_NOW_UNSUPPORTED 0x4u    /* 404 streak reached max_consecutive_404 */
#define NM_FT_NOW_SUPPORTED 0x8u      /* an unsupported engine answered again */
/* One poll outcome. entry is the endpoint's entry for NM_FT_EV_OK (else NULL). Returns
 * NM_FT_* flags; with NM_FT_REPORT_STATUS *sig_out gets the entry's signature (heap,
 * the caller frees it or hands it to nm_ft_track_delivered), else NULL. The track only
 * remembers a non-healthy signature once nm_ft_track_delivered says the Controller took
 * it (a report that was not accepted is sent again at the next poll). */
unsigned nm_ft_track_observe(struct nm_ft_track *t, enum nm_ft_event ev,
                             const struct wire_ft_engine_entry *entry, int max_failures,
                             int max_404, char **sig_out);
/* A report was accepted: sig (taken) is now the delivered signature; or, for the
 * unreachable report (sig NULL), the failure run is reported. */
void nm_ft_track_delivered(struct nm_ft_track *t, bool unreachable, char *sig);
void nm_ft_track_release(struct nm_ft_track *t);
/* The fault report fields of an engine entry (§2.10): engine_status healthy 0, dead 1,
 * anything else 2; exception_type = fault_info (unhealthy with info; strings verbatim,
 * other JSON compact; capped) / EngineDeadError / EngineUnhealthyError. */
enum wire_engine_status nm_ft_entry_engine_status(const struct wire_ft_engine_entry *e);
void nm_ft_entry_exception_type(const struct wire_ft_engine_entry *e, char *buf, size_t cap);

/* ---- nm_kvstore.c -------------------------------------------------------------------- */
/* Register the KV store's read-only route (GET /node-manager/kv-store); called by
 * nm_api_init after nm_ft_init. */
void nm_kv_init_routes(struct nodemgr *nm);

#endif
