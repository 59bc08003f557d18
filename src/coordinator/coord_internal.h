/* The coordinator daemon's private structures, shared by coordinator.c (process,
 * threads, metrics), mgmt.c (management API, instance table) and proxy.c (inference
 * API, routing and the proxied-request state machine).
 *
 * Threads: one management reactor (the main thread: signals, management API, the
 * instance table, publishing snapshots) and N worker reactors, each with its own
 * inference server on the shared port (SO_REUSEPORT) and its own HTTP client. The only
 * state workers share is read-mostly: the published snapshot, atomics (load counters,
 * round-robin counters, metrics) and the per-instance breaker mutex. */
#ifndef MOTOR_COORD_INTERNAL_H
#define MOTOR_COORD_INTERNAL_H

#include "coordinator/otlp.h"
#include "common/cfgwatch.h"
#include "common/list.h"
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/metrics.h"
#include "common/reactor.h"
#include "coordinator/balancer.h"
#include "coordinator/coord_config.h"
#include "coordinator/coord_settings.h"
#include "coordinator/instances.h"
#include "coordinator/reqfsm.h"

#include <pthread.h>
#include <stdatomic.h>

/* Error causes counted in motor_coordinator_errors_total{cause}. */
enum coord_cause {
    CAUSE_BAD_REQUEST = 0,
    CAUSE_UNAUTHORIZED,
    CAUSE_MODEL_NOT_FOUND,
    CAUSE_NO_INSTANCE,
    CAUSE_UPSTREAM_TRANSPORT,
    CAUSE_UPSTREAM_STATUS,
    CAUSE_UPSTREAM_PROTOCOL,
    CAUSE_FIRST_TOKEN_TIMEOUT,
    CAUSE_INFER_TIMEOUT,
    CAUSE_CLIENT_DISCONNECT,
    CAUSE_SHUTDOWN,
    CAUSE_INTER_TOKEN_TIMEOUT,
    CAUSE_COUNT
};

/* HTTP statuses whose request counters are cached (coordinator.c: coord_codes). */
#define COORD_CODES 10

struct coord_metrics {
    struct metrics_registry *reg;
    struct metrics_family *requests; /* {api, code} */
    struct metrics_counter *errors[CAUSE_COUNT];
    struct metrics_counter *retries;
    struct metrics_counter *busy; /* legs an engine closed before answering (its cap) */
    struct metrics_counter *breaker_trips;
    struct metrics_counter *reschedules, *reschedule_refused; /* mid-stream (proxy.c) */
    struct metrics_histogram *reschedule_gap;
    struct metrics_family *legs; /* {role, outcome} */
    /* Children looked up once at start (a lookup takes the registry mutex). */
    struct metrics_counter *req_cache[3][COORD_CODES];
    struct metrics_counter *leg_cache[WIRE_ROLE_COUNT][3];
    struct metrics_histogram *ttft;
    struct metrics_histogram *e2e;
    struct metrics_gauge *inflight;
    struct metrics_counter *refreshes;
    struct metrics_counter *reloads_ok, *reloads_failed;
    struct metrics_counter *standby_refusals; /* inference requests a standby refused */
    struct metrics_gauge *is_master;          /* 1 while this coordinator serves */
    /* cache-aware routing: prompt tokens routed, and how many were cached where they went */
    struct metrics_counter *prefix_prompt_tokens, *prefix_matched_tokens;
    struct metrics_counter *tokenize_ok, *tokenize_failed;
    /* Per model and role (gwm_*, coordinator.c): histograms with vLLM's bucket edges so
     * one panel shows the gateway's and the engines' own; children through gwm_get. */
    struct metrics_family *gw_ttft, *gw_itl, *gw_tpot, *gw_e2e, *gw_queue, *gw_handoff;
    struct metrics_family *gw_prompt, *gw_completion;             /* token count histograms */
    struct metrics_family *gw_prompt_total, *gw_completion_total; /* tokens forwarded */
    struct metrics_counter *mem_trims;   /* mem_release calls that trimmed */
    struct metrics_counter *mem_trimmed; /* bytes they gave back */
    struct metrics_counter *conductor_ok, *conductor_failed;
};

struct coord;
struct preq;

/* One model's and role's gateway series (the children of the gw_* families). */
struct gwm {
    struct metrics_histogram *ttft, *itl, *tpot, *e2e, *queue, *handoff, *prompt, *completion;
    struct metrics_counter *prompt_total, *completion_total;
};
/* Distinct model_name values a coordinator labels (bounded cardinality): the rest are
 * counted under model_name="other". Per worker cache of the children. */
#define GWM_MAX_MODELS 32
struct gwm_cache {
    char model[64];
    struct gwm by_role[WIRE_ROLE_COUNT];
    bool resolved[WIRE_ROLE_COUNT];
};

struct coord_worker {
    struct coord *c;
    int idx;
    pthread_t thread;
    bool started;
    struct reactor *r;
    struct httpd *httpd;
    struct httpd *meta_httpd; /* trigger mode's metaserver (POST /v1/metaserver) */
    uint16_t meta_port;
    struct httpc *httpc;
    struct inst_snapshot *snap; /* this worker's cached reference */
    uint64_t snap_version;
    struct csettings *set; /* this worker's cached settings (proxy_settings) */
    uint64_t set_version;
    /* Liveness for /readiness: the management thread posts a beat every second and the
     * worker's loop stamps it (HEARTBEAT_STALE when it stops); exited once its reactor
     * returned (DAEMON_EXITED unless the coordinator is stopping). */
    _Atomic int64_t beat_ms;
    atomic_bool exited;
    uint64_t seq;        /* request ids */
    char rid_prefix[32]; /* "motor-<boot>-<worker>-", formatted once (handle_infer) */
    size_t rid_prefix_len;
    struct list_head live; /* struct preq: proxied requests in progress */
    int n_live;
    struct reqfsm_stats fsm_stats; /* the requests' state-machine events (reqfsm.h) */
    struct reactor_timer sweep;    /* request deadlines, while requests are live */
    int64_t sweep_ms;
    bool draining;
    int64_t drain_deadline;
    struct reactor_timer drain_timer;
    struct gwm_cache gwm[GWM_MAX_MODELS + 1]; /* + "other" */
    int n_gwm;
    uint64_t rng; /* span and trace ids (otlp.c), seeded on first use */
};

/* The series of model (NULL: "unknown") and role for this worker. */
const struct gwm *gwm_get(struct coord_worker *w, const char *model, enum wire_role role);

struct mgmt_refresh; /* mgmt.c */
struct kvsub;        /* kvsub.c */
struct conductor;    /* conductor.c */
struct kvidx;
struct coord_ha; /* coord_ha.c */
struct prec;     /* precision.c */

/* What the command line set: kept for reloads, which apply it again over the file. */
struct coord_cli {
    char *config;                 /* the file read (NULL: none) */
    char *host;                   /* --host */
    int port, mgmt_port, workers; /* -1: the file's */
    bool log_level_pinned;
};

struct coord {
    struct otlp_cfg otlp; /* span export (otlp.h), read from the environment at start */
    struct ccfg cfg;      /* management thread only: workers read `settings` */
    struct coord_cli cli;
    struct csettings_pub settings; /* published for the workers (coord_settings.h) */
    uint64_t settings_version;
    struct cfgwatch *watch; /* config and TLS files (coord_reload.c) */
    struct inst_pub pub;
    atomic_uint rr[WIRE_ROLE_COUNT];
    struct coord_metrics m;
    int64_t start_wall_ms;
    long rss_baseline_kib;        /* RSS once listening (mem_release) */
    long retained_after_trim_kib; /* resident but not in use after the last trim */
    int idle_beats;               /* beats in a row without a request in flight */
    /* Random per process start (32 hex digits): in the management probes and refresh
     * answers, so a Controller sees a restart (and an empty table) at its next heartbeat
     * however fast the restart was. */
    char boot_id[33];

    struct reactor *r; /* management reactor (main thread) */
    struct httpd *mgmt;
    struct httpc *mgmt_httpc;
    struct inst_table table;
    struct mgmt_refresh *refresh_head, *refresh_tail; /* one at a time, in order */
    uint16_t infer_port, mgmt_port;

    struct coord_worker *workers;
    int n_workers;
    unsigned conn_per_worker; /* client connection slots of each worker's server */
    atomic_bool stopping;
    struct reactor_timer beat_timer; /* workers' liveness beats */

    /* master/standby (coord_ha.c). Workers read serve_until (CLOCK_MONOTONIC ms): they
     * serve inference only before it — INT64_MAX without HA, the lease's sure end on a
     * master, 0 on a standby — so a master frozen past its lease refuses the moment it
     * runs again, before any timer of its own could step it down. */
    struct coord_ha *ha;
    _Atomic int64_t serve_until;

    /* precision detection (precision.h): sampling windows shared with the workers,
     * PD-group states on the management reactor */
    struct prec *prec;

    /* The KV-cache index (kvidx.h): created by the management thread the first time
     * kv_cache_affinity needs it, read by workers (its own lock), freed after they
     * stopped. kv: the subscriptions that feed it (management thread). */
    _Atomic(struct kvidx *) kvidx;
    struct kvsub *kv;
    struct conductor *cond; /* an upstream KV Conductor (conductor.c), management thread */
    /* engines' /metrics (engscrape.c) */
    struct reactor_timer scrape_timer;
    bool scrape_timer_init;
    struct list_head scrapes; /* in flight */
};

/* coordinator.c */
void coord_count_error(struct coord *c, enum coord_cause cause);
/* api: "completions", "chat_completions" or "models". */
void coord_count_request(struct coord *c, const char *api, int code);
/* outcome: 1 success, -1 failure, 0 abandoned. */
void coord_count_leg(struct coord *c, enum wire_role role, int outcome);
/* GET /metrics on either port. */
void coord_handle_metrics(struct httpd_req *req, void *arg);
/* Something can be served: routable instances of the roles a request needs. */
bool coord_ready(struct inst_snapshot *s);
/* The /readiness answer (status 200, or 503 with a reason: NOT_MASTER, SYNCING,
 * HEARTBEAT_STALE, DAEMON_EXITED, SHUTTING_DOWN) for either port; s the caller's
 * snapshot. New reference. Any thread. */
json_t *coord_readiness(struct coord *c, struct inst_snapshot *s, bool mgmt, int *status);
/* Whether this coordinator serves inference now (master or no HA). Any thread. */
bool coord_serving(struct coord *c, int64_t now_ms);
/* Inference on a standby: false after answering 503 (reason NOT_MASTER, counted);
 * true when the request may go on. Worker thread. */
bool coord_refuse_standby(struct coord *c, struct httpd_req *req, const char *api);

/* coord_reload.c — on the management reactor. */
/* Read the configuration (path NULL: defaults) with the command line's overrides. 0, or
 * -EINVAL with every error in errs. */
int coord_config_read(const struct coord_cli *cli, struct ccfg *out, struct cfg_errors *errs);
/* Publish a settings snapshot of c->cfg for the workers. */
void coord_publish_settings(struct coord *c);
void coord_reload_init(struct coord *c);
void coord_reload_free(struct coord *c);
/* SIGHUP or the watch: 0 when applied or unchanged, -EINVAL when the file is invalid
 * (the running configuration stays, the errors are logged). */
int coord_reload_now(struct coord *c, const char *why);

/* coord_ha.c — master/standby over etcd, on the management reactor. */
/* Start (standby_config.enable_master_standby): campaign, replicate. Without it the
 * coordinator serves as a single one. 0 or -errno (logged: no etcd endpoint). */
int coord_ha_start(struct coord *c);
/* The table changed (an accepted refresh): a master replicates it. */
void coord_ha_table_changed(struct coord *c);
/* A refresh reached a standby: false (answered 503 NOT_MASTER) or true to go on. */
bool coord_ha_accepts_refresh(struct coord *c, struct httpd_req *req);
/* On a standby, end the connection after this answer: a client kept alive on it (the
 * controller through a Service, from when this one was master) reconnects, and the
 * Service sends it to the master. */
void coord_ha_standby_close(struct coord *c, struct httpd_req *req);
/* The state for probes: "single", "standby", "syncing", "master"; holder = who holds the
 * lock as last seen ("" unknown). */
const char *coord_ha_role(struct coord *c, const char **holder);
/* The state table, for its unit test: the state after event in state (names as logged),
 * NULL when the table refuses it. */
const char *coord_ha_next(const char *state, const char *event);
/* Shutdown: a master gives the lock back (its standby takes over at once) and waits up
 * to wait_ms for etcd to hear it; then everything is freed. */
void coord_ha_stop(struct coord *c, int64_t wait_ms);

/* kvsub.c — on the management reactor. */
/* Subscribe to the KV events of the table's prefill/union endpoints (and drop those that
 * left), per the configuration: after every table change and reload. */
void kvsub_sync(struct coord *c);
void kvsub_stop(struct coord *c);
/* The index and its subscriptions (GET /kv_index). New reference. */
json_t *kvsub_to_json(struct coord *c);

/* conductor.c — on the management reactor: register the table's prefill/union endpoints
 * with prefill_kv_event_config.conductor_service (after every table change and reload),
 * and free everything at the end. conductor_url: "<service><route>" with http:// added
 * when the service has no scheme (heap; pure, any thread). */
void conductor_sync(struct coord *c);
void conductor_stop(struct coord *c);
char *conductor_url(const char *service, const char *route);

/* engscrape.c — on the management reactor: (re)arm the /metrics scrapes per the
 * configuration (start, reload), and stop them. */
void engscrape_sync(struct coord *c);
void engscrape_stop(struct coord *c);

/* mgmt.c — on the management reactor. */
int mgmt_start(struct coord *c);
void mgmt_stop(struct coord *c);
/* Publish a new snapshot of the table. */
void mgmt_publish(struct coord *c);

/* fanout.c — n > 1, best_of, batch prompts over PD hand-offs; on a worker reactor. */
/* Sub-requests body needs (prompts × max(n, best_of)); 1 = none. Sets the shape. */
int fanout_shape(const json_t *body, bool chat, int *n_prompts, int *n, int *best_of);
/* Serve req as one sub-request per (prompt, choice) to this coordinator (takes body). */
void fanout_start(struct coord_worker *w, struct httpd_req *req, bool chat, json_t *body,
                  const char *api, const char *rid);

/* proxy.c — on a worker reactor. */
void proxy_register_routes(struct coord_worker *w);
/* Begin a graceful stop of the worker (posted to its reactor). */
void proxy_worker_drain(void *arg);
/* The worker's current snapshot (refreshed when a newer one was published). */
struct inst_snapshot *proxy_snapshot(struct coord_worker *w);
/* The worker's current settings (refreshed when newer ones were published). */
struct csettings *proxy_settings(struct coord_worker *w);
/* A request served outside the proxied-request machine (a fan-out) began / ended: the
 * worker's in-flight count (a drain waits for it) and the inflight gauge. */
void proxy_live_add(struct coord_worker *w);
void proxy_live_done(struct coord_worker *w);

#endif
