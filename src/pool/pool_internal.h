/* pool_internal — the worker pool's private contract between its files.
 *
 *   pool_manifest.c  manifest validation (every error collected) and its JSON
 *   pool_store.c     SQLite: manifests, instance records, state transitions
 *   pool_core.c      pool/node lifetime, the acquire queue and dispatch (pool_pump)
 *   pool_inst.c      one worker process: spawn, readiness, idle reaping, stop, crash
 *   pool_api.c       the HTTP routes and the invoke forwarder
 *   pool_main.c      `motor worker-pool`
 *
 * Everything runs on the reactor thread. Unit tests link this directly: they replace
 * p->spawn with a fake that never starts a process, then drive instances with
 * pool_inst_mark_ready() / pool_inst_fail(). */
#ifndef MOTOR_POOL_INTERNAL_H
#define MOTOR_POOL_INTERNAL_H

#include "common/cfg.h"
#include "common/cfgwatch.h"
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/list.h"
#include "common/proc.h"
#include "common/reactor.h"
#include "common/ring.h"
#include "pool/pool.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Limits on what a manifest may ask for (validation bounds). */
#define POOL_ID_MAX 64
#define POOL_ARGV_MAX 256
#define POOL_ARG_LEN_MAX 4096
#define POOL_ENV_MAX 256
#define POOL_ENV_KEY_MAX 256
#define POOL_ENV_VAL_MAX 32768
#define POOL_CONCURRENCY_MAX 1024
#define POOL_INSTANCES_MAX 256
#define POOL_TIMEOUT_MAX_S 86400.0
#define POOL_TTL_MAX_S (30.0 * 86400.0)

/* Worker output kept in memory: the stderr tail (lines) and its byte budget. */
#define POOL_TAIL_LINES 200
#define POOL_TAIL_RING_BYTES (128u * 1024u)
#define POOL_MAX_LINE 2048
/* Ended instances kept in memory for the admin API (the database keeps all). */
#define POOL_KEEP_ENDED 64
/* /health retries while the port refuses connections (the ready line may come a moment
 * before the server listens). */
#define POOL_HEALTH_RETRY_MS 50
#define POOL_HEALTH_TIMEOUT_MAX_MS 5000

/* ---- manifests (pool_manifest.c) ----------------------------------------------------- */

/* An immutable, reference-counted manifest: instances keep the one they were started
 * with, so replacing a node's manifest never changes a running instance. */
struct pool_manifest {
    int refs;
    char *id;
    char **argv; /* NULL-terminated */
    size_t argc;
    char *workdir; /* absolute */
    char **env;    /* NULL-terminated "K=V" */
    size_t n_env;
    int max_concurrency;
    int max_instances;
    int64_t idle_ttl_ms; /* < 0 = never */
    bool keep_warm;
    int64_t ready_timeout_ms;
    int64_t invoke_timeout_ms;
    int64_t queue_timeout_ms;
    struct pool_defaults given; /* the limits as the manifest (or the defaults) gave them */
    json_t *doc; /* the normalized manifest as stored and shown (input fields kept) */
};

/* Validate a manifest object. Every problem is recorded in errs (paths relative to the
 * manifest: "command[2]: must be a non-empty string"); returns the manifest (refs 1) or
 * NULL when there was any error. base_dir resolves a relative or missing workdir. */
struct pool_manifest *pool_manifest_parse(json_t *obj, const struct pool_defaults *defs,
                                          const char *base_dir, struct cfg_errors *errs);
struct pool_manifest *pool_manifest_ref(struct pool_manifest *m);
void pool_manifest_unref(struct pool_manifest *m); /* NULL-safe */
/* The manifest's fields as a configuration table (docs/worker-pool.md's table). */
struct cfgtab;
extern const struct cfgtab pool_manifest_cfgtab;
/* true when id is a valid node id ([A-Za-z0-9_.-]{1,64}, not starting with '.'). */
bool pool_id_valid(const char *id);
/* Errors text ("a\nb\n") as a JSON array of lines. */
json_t *pool_errors_json(const struct cfg_errors *errs);
/* A JSON string from n bytes that may not be valid UTF-8 (worker output): each bad byte
 * becomes U+FFFD, NUL too. Never NULL. */
json_t *pool_json_str(const char *s, size_t n);
/* "a\nb\n" as ["a", "b"] (sanitized like pool_json_str). text may be NULL. */
json_t *pool_lines_json(const char *text);

/* The seed's conveniences, resolved at spawn time against the workdir:
 * argv[0] "python"/"python3" => <workdir>/.venv/bin/python when that is executable;
 * LD_LIBRARY_PATH gets <workdir>/.venv/lib/python3*\/site-packages/nvidia/\*\/lib first.
 * Returns the new argv[0] (heap) or NULL to keep it. */
char *pool_venv_python(const char *workdir, const char *argv0);
/* The LD_LIBRARY_PATH value to set (heap), or NULL when the venv has no CUDA folders.
 * current: the value the worker would otherwise get (may be NULL). */
char *pool_cuda_library_path(const char *workdir, const char *current);

/* ---- store (pool_store.c) -------------------------------------------------------------- */

struct pool_store;

/* What the store keeps of an instance (strings borrowed for the call). */
struct pool_inst_rec {
    const char *id;
    const char *node_id;
    const char *state;
    pid_t pid;
    const char *address;
    int64_t started_wall_ms, ready_wall_ms, stopped_wall_ms, last_used_wall_ms; /* 0 = none */
    uint64_t calls;
    const char *error;
    const char *stderr_tail;
    const char *manifest; /* JSON text of the manifest it was started with */
};

/* NULL on failure (logged, errno set). path NULL/"" = in memory. */
struct pool_store *pool_store_open(const char *path);
void pool_store_close(struct pool_store *s);
int pool_store_node_put(struct pool_store *s, const char *id, const char *manifest_json,
                        const char *source);
int pool_store_node_delete(struct pool_store *s, const char *id);
typedef void (*pool_store_node_cb)(const char *id, const char *manifest_json, const char *source,
                                   void *arg);
int pool_store_nodes_each(struct pool_store *s, pool_store_node_cb cb, void *arg);
int pool_store_instance_put(struct pool_store *s, const struct pool_inst_rec *rec);
int pool_store_transition(struct pool_store *s, const char *inst_id, const char *node_id,
                          const char *from, const char *to, const char *cause,
                          int64_t util_wall_ms);
/* Instances a previous process left starting/ready/stopping: recorded stopped with
 * cause. Returns how many (or -errno). */
int pool_store_close_orphans(struct pool_store *s, const char *cause, int64_t util_wall_ms);
/* Recorded instances, newest first (node_id NULL = all). New reference. */
json_t *pool_store_instances_json(struct pool_store *s, const char *node_id, int limit);
/* One recorded instance with its "transitions" (oldest first), or NULL. */
json_t *pool_store_instance_json(struct pool_store *s, const char *inst_id);

/* ---- instances (pool_inst.c) --------------------------------------------------------- */

enum pool_state {
    POOL_STARTING = 0, /* spawned; waiting for the ready line and /health */
    POOL_READY,        /* serving calls */
    POOL_STOPPING,     /* SIGTERM sent (reaped idle, admin stop, delete, shutdown) */
    POOL_STOPPED,      /* exited after a stop */
    POOL_ERROR,        /* failed to become ready, or died unasked */
};
const char *pool_state_str(enum pool_state s);

struct pool;
struct pool_node;
struct pool_call;

struct pool_inst {
    struct pool *pool;
    struct pool_node *node;
    struct pool_manifest *m; /* the manifest it was started with */
    struct list_head link;   /* on pool->insts */
    char id[24];             /* "ni_" + 12 hex */
    enum pool_state state;

    struct proc *proc; /* NULL before spawn, after reaping, or in unit tests */
    bool proc_alive;   /* the process (group) is not yet reaped */
    pid_t pid;
    int port;
    char *address; /* "http://127.0.0.1:PORT" once the ready line came */
    char *health_url;
    char *invoke_url;

    int busy;                    /* calls holding a slot */
    uint64_t calls;              /* calls granted over the lifetime */
    struct list_head calls_head; /* pool_call.ilink: calls in flight on it (crash => failed
                                  * at once) */

    int64_t started_ms, ready_ms, last_used_ms, ended_ms; /* CLOCK_MONOTONIC */
    int64_t started_wall, ready_wall, last_used_wall, ended_wall;

    char *error;          /* why it is in error */
    char *error_tail;     /* the stderr tail when the error happened */
    struct ring err_ring; /* stderr lines, newest POOL_TAIL_RING_BYTES */
    bool ring_ok;         /* false once ended: final_tail holds the last lines */
    char *final_tail;

    /* readiness */
    bool ready_line;
    int64_t ready_deadline_ms;
    struct httpc_req *health;
    struct reactor_timer ready_timer;  /* ready_timeout */
    struct reactor_timer health_timer; /* retry after a refused connection */
    /* reaping */
    struct reactor_timer idle_timer;
    const char *stop_cause;
    bool ended; /* counted in pool->n_ended (stopped/error and reaped) */
};

/* A stdout line: 1 and *port for "MOTOR_NODE_READY port=N" / "WOV_NODE_READY port=N"
 * (leading blanks allowed, other words may follow), 0 when it is not a ready line,
 * -EINVAL for a ready line without a valid port (1..65535). */
int pool_parse_ready_line(const char *line, int *port);
/* Create an instance of node (STARTING, recorded) and spawn it through p->spawn. On a
 * synchronous spawn failure the instance is already in POOL_ERROR when this returns. */
struct pool_inst *pool_inst_start(struct pool_node *n);
/* The real spawn (p->spawn's default): 0 or -errno (the instance is then failed). */
int pool_inst_spawn(struct pool_inst *i);
/* Readiness reached (ready line parsed and /health answered 200), or for tests. */
void pool_inst_mark_ready(struct pool_inst *i, int port);
/* Enter POOL_ERROR with why (the stderr tail is captured), kill the process if any,
 * fail the calls on it, and let the node re-dispatch. */
void pool_inst_fail(struct pool_inst *i, const char *why);
/* Stop (STARTING/READY -> STOPPING; SIGTERM, grace, SIGKILL). cause is a static
 * string. No-op for an instance already stopping or ended. */
void pool_inst_stop(struct pool_inst *i, const char *cause);
/* A slot was released: arm the idle timer when nothing runs on it. */
void pool_inst_became_idle(struct pool_inst *i);
/* A slot was taken: disarm the idle timer. */
void pool_inst_became_busy(struct pool_inst *i);
/* The worker's leader has exited (maybe not yet reaped: its pidfd event is then
 * about to be handled). Does not reap. */
bool pool_inst_exited(const struct pool_inst *i);
/* Shutdown: kill now, record stopped, free. */
void pool_inst_destroy(struct pool_inst *i);
/* Write the instance's record to the store. */
void pool_inst_record(struct pool_inst *i);
/* The tail of its stderr (heap, '\n'-separated, at most lines lines). */
char *pool_inst_tail(const struct pool_inst *i, size_t lines);
/* JSON for the admin API. tail_lines: stderr lines to include. */
json_t *pool_inst_json(const struct pool_inst *i, size_t tail_lines);
/* STARTING, READY, STOPPING, or an error whose process is still being reaped: it holds
 * resources, so it counts against max_instances. */
bool pool_inst_live(const struct pool_inst *i);

/* ---- nodes, queue, dispatch (pool_core.c) ------------------------------------------ */

/* A call waiting for (or holding) a slot. Embedded in the caller's object. */
struct pool_waiter {
    struct list_head link; /* on node->wq while queued (linked <=> queued) */
    struct pool_node *node;
    int64_t enq_ms;
    struct reactor_timer timer; /* queue deadline */
    /* A slot on inst was taken for this waiter (inst->busy already counted). */
    void (*granted)(struct pool_waiter *w, struct pool_inst *inst);
    /* No slot: status (503, 404) and a message; extra (may be NULL) is borrowed JSON to
     * merge into the answer (stderr_tail, instance_id). The waiter is out of the queue. */
    void (*failed)(struct pool_waiter *w, int status, const char *msg, json_t *extra);
};

struct pool_node {
    struct pool *pool;
    struct list_head link; /* on pool->nodes */
    char *id;
    struct pool_manifest *m; /* current manifest */
    char *source;            /* "api" or the file it came from */
    int64_t registered_wall;
    struct list_head wq; /* pool_waiter.link, FIFO: oldest first */
    size_t n_waiting;
    bool deleted; /* removed from the registry; freed when no instance refers to it */
    int refs;     /* instances referring to it + 1 while registered */
    bool pumping, repump;
    /* DELETE waits for its instances to be reaped (one at a time: the node is gone from
     * lookups, so no second DELETE can find it). */
    void (*del_done)(void *arg);
    void *del_arg;
    /* counters for the API */
    uint64_t calls, calls_failed, starts, start_failures, queue_timeouts;
};

/* Upper bounds (s) of motor_pool_queue_wait_seconds' buckets (pool_api.c). */
#define POOL_WAIT_BUCKETS 11
extern const double pool_wait_bounds[POOL_WAIT_BUCKETS];

struct pool {
    struct reactor *r;
    struct pool_config cfg; /* strings below are owned copies */
    char *manifests_dir, *db_path, *base_dir;
    struct pool_store *store;
    struct httpc *http;     /* health checks and invokes */
    struct list_head nodes; /* pool_node.link, newest first */
    struct list_head insts; /* pool_inst.link: every instance in memory, newest first */
    size_t n_ended;         /* stopped/error instances kept in memory */
    struct list_head calls; /* pool_call.link: every invoke request the pool holds, newest
                             * first */
    bool shutting_down;
    void (*shutdown_done)(void *arg);
    void *shutdown_arg;
    struct reactor_timer shutdown_timer;
    /* spawn hook: pool_inst_spawn, replaced by unit tests */
    int (*spawn)(struct pool_inst *i);
    /* the manifests directory, watched (pool_core.c: rescan) */
    struct cfgwatch *watch;
    struct pool_file *files;
    size_t n_files;
    /* queue wait of granted calls (motor_pool_queue_wait_seconds), this thread only */
    uint64_t wait_bucket[POOL_WAIT_BUCKETS + 1];
    uint64_t wait_count;
    double wait_sum;
};

struct pool_node *pool_node_find(struct pool *p, const char *id);
/* Register or replace (takes the manifest reference). Replacing drains the old
 * version's instances: idle ones stop now, busy ones when released. Returns the node;
 * *created tells which. Persists it. */
struct pool_node *pool_node_put(struct pool *p, struct pool_manifest *m, const char *source,
                                bool persist, bool *created);
/* Delete: queued calls fail 404, instances stop; done(arg) once all are reaped (at
 * once, from inside this call, when none is live). The node is gone from lookups at
 * once. */
void pool_node_delete(struct pool_node *n, void (*done)(void *arg), void *arg);
/* Retire (its manifest file was removed): gone from lookups and the store at once,
 * queued calls fail 404, idle and starting instances stop now, busy ones when their
 * last call returns — a drain, unlike DELETE. */
void pool_node_retire(struct pool_node *n, const char *why);
void pool_node_unref(struct pool_node *n);
/* JSON of a node (manifest, source, counters, instances by state). */
json_t *pool_node_json(const struct pool_node *n);

/* Ask for a slot: granted at once (from inside this call), or queued, or failed. */
void pool_acquire(struct pool_node *n, struct pool_waiter *w);
/* Leave the queue (client gone). No callback. */
void pool_waiter_cancel(struct pool_waiter *w);
/* Give a slot back. */
void pool_release(struct pool_inst *i);
/* Match waiters with slots, start instances as needed. Re-entrant safe. */
void pool_pump(struct pool_node *n);
/* An instance failed to start: fail the waiters it was meant to serve. */
void pool_start_failed(struct pool_node *n, struct pool_inst *i);
/* An instance ended (stopped or error, reaped): maybe forget old ended instances,
 * maybe finish a shutdown or delete. */
void pool_inst_ended(struct pool_inst *i);
/* A fresh id "<prefix>" + 12 hex into buf. */
void pool_new_id(const char *prefix, char *buf, size_t cap);

/* ---- API (pool_api.c) ------------------------------------------------------------- */

/* Answer every held invoke 503 and forget it (shutdown). */
void pool_api_drop_calls(struct pool *p, const char *why);
/* An instance died or stopped under its calls: fail them with why. */
void pool_api_inst_gone(struct pool_inst *i, const char *why);

#endif
