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

#include "common/list.h"
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/metrics.h"
#include "common/reactor.h"
#include "coordinator/balancer.h"
#include "coordinator/coord_config.h"
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
    CAUSE_COUNT
};

/* HTTP statuses whose request counters are cached (coordinator.c: coord_codes). */
#define COORD_CODES 10

struct coord_metrics {
    struct metrics_registry *reg;
    struct metrics_family *requests; /* {api, code} */
    struct metrics_counter *errors[CAUSE_COUNT];
    struct metrics_counter *retries;
    struct metrics_counter *breaker_trips;
    struct metrics_family *legs; /* {role, outcome} */
    /* Children looked up once at start (a lookup takes the registry mutex). */
    struct metrics_counter *req_cache[3][COORD_CODES];
    struct metrics_counter *leg_cache[WIRE_ROLE_COUNT][3];
    struct metrics_histogram *ttft;
    struct metrics_histogram *e2e;
    struct metrics_gauge *inflight;
    struct metrics_counter *refreshes;
};

struct coord;
struct preq;

struct coord_worker {
    struct coord *c;
    int idx;
    pthread_t thread;
    bool started;
    struct reactor *r;
    struct httpd *httpd;
    struct httpc *httpc;
    struct inst_snapshot *snap; /* this worker's cached reference */
    uint64_t snap_version;
    uint64_t seq;      /* request ids */
    char rid_prefix[32]; /* "motor-<boot>-<worker>-", formatted once (handle_infer) */
    size_t rid_prefix_len;
    struct list_head live; /* struct preq: proxied requests in progress */
    int n_live;
    struct reqfsm_stats fsm_stats; /* the requests' state-machine events (reqfsm.h) */
    struct reactor_timer sweep; /* request deadlines, while requests are live */
    int64_t sweep_ms;
    bool draining;
    int64_t drain_deadline;
    struct reactor_timer drain_timer;
};

struct mgmt_refresh; /* mgmt.c */

struct coord {
    struct ccfg cfg;
    enum bal_policy policy;
    struct inst_pub pub;
    atomic_uint rr[WIRE_ROLE_COUNT];
    struct coord_metrics m;
    int64_t start_wall_ms;
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
    atomic_bool stopping;
};

/* coordinator.c */
void coord_count_error(struct coord *c, enum coord_cause cause);
/* api: "completions", "chat_completions" or "models". */
void coord_count_request(struct coord *c, const char *api, int code);
/* outcome: 1 success, -1 failure, 0 abandoned. */
void coord_count_leg(struct coord *c, enum wire_role role, int outcome);
/* GET /metrics on either port. */
void coord_handle_metrics(struct httpd_req *req, void *arg);
/* {"status":"ok",...} probes, ready = something can be served. */
bool coord_ready(struct inst_snapshot *s);

/* mgmt.c — on the management reactor. */
int mgmt_start(struct coord *c);
void mgmt_stop(struct coord *c);
/* Publish a new snapshot of the table. */
void mgmt_publish(struct coord *c);

/* proxy.c — on a worker reactor. */
void proxy_register_routes(struct coord_worker *w);
/* Begin a graceful stop of the worker (posted to its reactor). */
void proxy_worker_drain(void *arg);
/* The worker's current snapshot (refreshed when a newer one was published). */
struct inst_snapshot *proxy_snapshot(struct coord_worker *w);

#endif
