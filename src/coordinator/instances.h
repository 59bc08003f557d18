/* instances — the coordinator's view of the fleet: instance/endpoint model (spec §5.9),
 * parsing of POST /instances/refresh bodies in both shapes (§9.2), the mutable table the
 * management thread owns, and the immutable snapshots the inference workers route on.
 *
 * Ownership and threads
 *   * struct instance is immutable once it is in a table; it is reference counted
 *     (inst_ref/inst_unref, any thread).
 *   * State that must survive a refresh — the circuit breaker of an instance and the
 *     in-flight load of each endpoint — lives in small shared objects that a new
 *     instance object with the same identity inherits. Load counters are C11 atomics;
 *     the breaker has its own mutex (its transitions are per attempt, not per byte).
 *   * struct inst_table: management thread only.
 *   * struct inst_snapshot: built by the management thread, immutable, reference
 *     counted; published through struct inst_pub and read by any thread. */
#ifndef MOTOR_INSTANCES_H
#define MOTOR_INSTANCES_H

#include "coordinator/breaker.h"
#include "wire/wire.h"
#include "wire/wire_refresh.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Roles, statuses, dispatch modes and refresh events are the wire's (wire/wire.h,
 * wire/wire_refresh.h); the engine kind is the coordinator's own reading of
 * engine_type. */
enum inst_engine { INST_ENGINE_VLLM = 0, INST_ENGINE_SGLANG, INST_ENGINE_OTHER };

/* In-flight work on one endpoint, shared by every snapshot that lists it. */
struct inst_load {
    atomic_int refs;
    atomic_llong tokens;  /* estimated tokens of the legs in flight */
    atomic_int requests;  /* legs in flight */
    atomic_ullong served; /* legs started, ever */
    /* What the engine's /metrics said at the last scrape (engscrape.c), valid until
     * eng_until_ms (CLOCK_MONOTONIC; 0 = never scraped): its requests running and
     * waiting (x1000), its KV-cache usage (x1000), and how many legs this coordinator
     * had in flight there when it asked. */
    atomic_llong eng_running_m, eng_waiting_m, eng_usage_m;
    atomic_int eng_ours;
    /* Requests the engine had beyond those legs (x1000), the smaller of the last two
     * readings: a skew of one round trip does not count, lasting foreign work does. */
    atomic_llong eng_foreign_m;
    long long eng_last_excess_m; /* the previous reading's (management thread) */
    _Atomic int64_t eng_until_ms;
    atomic_bool eng_scraping; /* a scrape is in flight (management thread) */
};

/* Per-instance state that survives refreshes. */
struct inst_shared {
    atomic_int refs;
    pthread_mutex_t mu;
    struct brk brk;
    /* precision sampling (precision.h): when this instance's window was last claimed
     * (CLOCK_MONOTONIC ms; INT64_MIN: never). Compare-and-swap by any worker, so one
     * claim per window, with no lock on the request path. */
    _Atomic int64_t prec_last_ms;
};

struct inst_endpoint {
    int64_t id;
    char *ip;
    int port;           /* business_port */
    int bootstrap_port; /* 0 = none */
    enum wire_ep_status status;
    bool headless;
    char *hostport;         /* "ip:port" or "[v6]:port", for URLs */
    struct inst_load *load; /* set once the instance is in a table */
};

struct instance {
    atomic_int refs;
    int64_t id;
    enum wire_role role;
    enum wire_ins_status status;
    enum wire_dispatch dispatch;
    enum inst_engine engine;
    char *job_name;    /* "" when not given */
    char *model_name;  /* "" when not given (then discovered) */
    char *engine_type; /* as given, "vllm" by default */
    struct inst_endpoint *eps;
    size_t n_eps;
    struct inst_shared *shared; /* set once the instance is in a table */
};

struct inst_refresh {
    enum wire_refresh_event ev;
    struct instance **v; /* owned references */
    size_t n;
};

/* ---- names ---------------------------------------------------------------------- */
const char *inst_pool_name(enum wire_ins_status s); /* available/unavailable/paused/unknown */

/* ---- objects (any thread) --------------------------------------------------------- */
struct instance *inst_ref(struct instance *in);
void inst_unref(struct instance *in); /* NULL-safe */
/* Same role, job name and endpoint set {(ip, port, headless)} (order-independent). */
bool inst_same_identity(const struct instance *a, const struct instance *b);
/* Endpoints that may receive traffic: not headless, status initial or normal. */
bool inst_ep_routable(const struct inst_endpoint *ep);
/* Status active and at least one routable endpoint. */
bool inst_routable(const struct instance *in);

/* Load accounting on an endpoint (any thread, lock-free). */
void inst_load_acquire(struct inst_load *l, int64_t tokens);
struct inst_load *inst_load_ref(struct inst_load *l);
void inst_load_unref(struct inst_load *l); /* NULL-safe */
void inst_load_release(struct inst_load *l, int64_t tokens);

/* Breaker access (any thread; serialized by the instance's mutex). */
bool inst_breaker_peek(struct instance *in, int64_t now_ms);
bool inst_breaker_acquire(struct instance *in, int64_t now_ms, bool *trial);
/* outcome: 1 success, -1 failure, 0 abandoned. Returns true when the breaker tripped. */
bool inst_breaker_report(struct instance *in, int64_t now_ms, int outcome, bool trial);
void inst_breaker_read(struct instance *in, struct brk *out);

/* ---- refresh bodies ------------------------------------------------------------- */
/* Parse a refresh body (Controller shape or External Deployer shape; may be mixed per
 * instance). 0, or -EINVAL with a message in err (HTTP 400): bad types, unknown
 * Endpoint fields, duplicate instance ids, bad addresses. out is filled only on 0;
 * release it with inst_refresh_release. */
int inst_refresh_parse(json_t *body, struct inst_refresh *out, char *err, size_t cap);
void inst_refresh_release(struct inst_refresh *r);
/* True when an add/set instance has no model name (discovery needed). */
bool inst_refresh_needs_model(const struct inst_refresh *r);

/* ---- the table (management thread) ---------------------------------------------- */
struct inst_table {
    struct instance **v; /* owned, sorted by (role name, id) */
    size_t n;
    struct brk_params brk;
    uint64_t version; /* bumped by every successful apply */
};

void inst_table_init(struct inst_table *t, const struct brk_params *brk);
void inst_table_release(struct inst_table *t);
/* Apply a refresh atomically (all or nothing). 0, -EINVAL (400: e.g. role "encode" in a
 * routing table is fine, but nothing else is invalid at this point), or -EEXIST (409:
 * add with the same id but another identity; del whose role/job/endpoints do not match
 * the registered instance). Instances with an unchanged identity keep their breaker
 * and load counters. */
int inst_table_apply(struct inst_table *t, const struct inst_refresh *r, char *err, size_t cap);
struct instance *inst_table_find(const struct inst_table *t, int64_t id);
/* New breaker parameters (hot reload) for the instances added from now on and for every
 * breaker of the table (brk_set_params, under each instance's mutex). */
void inst_table_set_breaker(struct inst_table *t, const struct brk_params *p);
/* {"count":N,"instances":[...]} as GET /instances answers. New reference. */
json_t *inst_table_to_json(const struct inst_table *t, int64_t now_ms);
/* The whole table as a refresh body that recreates it (event "set", controller shape:
 * roles, statuses, names, dispatch, every endpoint with its status): what a master
 * coordinator replicates to its standbys (coord_ha.c). New reference. */
json_t *inst_table_to_refresh(const struct inst_table *t);
/* One instance as GET /instances shows it. New reference. */
json_t *inst_to_json(struct instance *in, int64_t now_ms);

/* ---- snapshots ------------------------------------------------------------------- */
struct inst_snapshot {
    atomic_int refs;
    uint64_t version;
    struct instance **all; /* every instance of the table (refs) */
    size_t n_all;
    struct instance **routable[WIRE_ROLE_COUNT]; /* borrowed from all[] */
    size_t n_routable[WIRE_ROLE_COUNT];
    char **models; /* distinct model names of routable instances */
    size_t n_models;
};

/* Build an immutable snapshot of the table (refs = 1). Management thread. */
struct inst_snapshot *inst_snapshot_build(const struct inst_table *t);
struct inst_snapshot *inst_snapshot_ref(struct inst_snapshot *s);
void inst_snapshot_unref(struct inst_snapshot *s); /* any thread, NULL-safe */

/* The published snapshot. Readers on the hot path compare inst_pub_version() with the
 * version they hold (one atomic load) and only on a change take the mutex in
 * inst_pub_get(): the pointer load and the reference increment must be one step, or a
 * reader could increment a snapshot the writer is freeing. */
struct inst_pub {
    pthread_mutex_t mu;
    struct inst_snapshot *cur;
    _Atomic uint64_t version;
};

void inst_pub_init(struct inst_pub *p);
void inst_pub_release(struct inst_pub *p);
/* Publish (takes the caller's reference). Any thread, normally management. */
void inst_pub_set(struct inst_pub *p, struct inst_snapshot *take);
/* A new reference to the current snapshot (never NULL after the first set). */
struct inst_snapshot *inst_pub_get(struct inst_pub *p);
uint64_t inst_pub_version(struct inst_pub *p);

#endif
