/* pool — the worker pool: manifest-defined worker ("node") processes started on demand,
 * reused up to a concurrency cap, reaped when idle, invoked over HTTP, all recorded.
 *
 * The pool is the single owner of its worker processes (seed 003): nothing else starts
 * or kills them. A manifest names a command; a call to POST
 * /node-manager/pool/nodes/{id}/invoke acquires an instance of that node (a ready one
 * with a free slot, else a new one up to max_instances, else a FIFO wait), forwards the
 * body to the instance's POST /invoke, streams the answer back and releases the slot.
 * Idle instances are stopped after their TTL; a crash is seen through the pidfd at once.
 * Manifests, instance records and every state transition are kept in SQLite.
 *
 * It is self-contained: it runs on any reactor and registers its routes on any httpd,
 * so `motor node-manager` embeds it and `motor worker-pool` runs it alone.
 * Routes (all JSON; errors {"detail": ...}):
 *   POST   /node-manager/pool/nodes                  register or replace a manifest
 *   GET    /node-manager/pool/nodes                  list
 *   GET    /node-manager/pool/nodes/{id}             one (manifest + instance counts)
 *   DELETE /node-manager/pool/nodes/{id}             stop its instances, then forget it
 *   POST   /node-manager/pool/nodes/{id}/invoke      call a worker
 *   GET    /node-manager/pool/instances              live and recent instances
 *   GET    /node-manager/pool/instances/{id}         one, with its recorded transitions
 *   POST   /node-manager/pool/instances/{id}/stop    stop one instance
 * docs/worker-pool.md describes the manifest, the worker protocol and every answer.
 *
 * Threading: everything on the thread running the reactor given to pool_new(); worker
 * processes are spawned from it (proc.h: spawn from the main thread's reactor). */
#ifndef MOTOR_POOL_H
#define MOTOR_POOL_H

#include "common/httpd.h"
#include "common/reactor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pool;

/* Values a manifest gets for the fields it leaves out. */
struct pool_defaults {
    int max_concurrency;           /* calls in flight per instance */
    int max_instances;             /* live instances per node */
    double idle_ttl_seconds;       /* idle time before reaping; negative = never */
    bool keep_warm;                /* never reaped */
    double ready_timeout_seconds;  /* spawn -> ready line + /health 200 */
    double invoke_timeout_seconds; /* one forwarded call */
    double queue_timeout_seconds;  /* wait for a slot; negative = invoke_timeout */
};

struct pool_config {
    /* Directory of *.json manifests registered at start (NULL = none). A missing
     * directory is an error; an invalid file is logged with all its errors and skipped. */
    const char *manifests_dir;
    /* SQLite database (created when missing). NULL or "" = in memory (nothing survives
     * a restart). */
    const char *db_path;
    /* Relative workdirs (and manifests without one) resolve here. NULL = manifests_dir,
     * or the process's working directory when there is none. */
    const char *base_dir;
    struct pool_defaults defaults;
    int64_t stop_grace_ms; /* SIGTERM -> SIGKILL of a worker's process group */
    size_t max_response;   /* cap on a buffered worker reply (bytes) */
    size_t max_request;    /* cap on an invoke body the pool accepts (bytes) */
    /* httpd route flags (HTTPD_ROUTE_AUTH) for the routes that change something
     * (register, delete, stop) and for invoke; the GET routes take none. */
    unsigned admin_route_flags;
    unsigned invoke_route_flags;
};

/* Built-in defaults: concurrency 1, instances 1, TTL 300 s, not warm, ready 60 s,
 * invoke 300 s, queue = invoke, grace 5 s, reply cap 16 MiB, request cap 16 MiB, no
 * manifests, in-memory database, no route flags. */
void pool_config_init(struct pool_config *cfg);

/* The rows of struct pool_defaults (common/cfgtab.h), for a daemon that reads them from
 * its configuration (the node manager's worker_pool.defaults); the built-in defaults
 * are theirs. */
struct cfgtab;
extern const struct cfgtab pool_defaults_cfgtab;

/* Create the pool: open (or create) the database, mark instances a previous run left
 * live as stopped, load the stored manifests, then the manifests directory (a file
 * replaces a stored manifest of the same id). cfg is copied. NULL on failure (logged;
 * errno set: the database cannot be opened, the manifests directory cannot be read). */
struct pool *pool_new(struct reactor *r, const struct pool_config *cfg);

/* Register the routes above on h (call before h's own catch-all routes, if any).
 * 0 or -errno. Requests the pool holds are answered and forgotten by pool_shutdown /
 * pool_free; freeing h first is also fine (their on_close callbacks release them). */
int pool_register_routes(struct pool *p, struct httpd *h);

struct strbuf;
/* Append the pool's Prometheus families (motor_pool_*: calls, failures, cold starts,
 * queue depth and wait, instances by state, per node) to sb: the standalone pool serves
 * them on GET /metrics, a node manager running the pool appends them to its own. */
void pool_render_metrics(const struct pool *p, struct strbuf *sb);

/* Graceful stop of everything: calls waiting or in flight are answered 503, new ones
 * refused, every worker gets SIGTERM, SIGKILL after the grace; done(arg) once all are
 * reaped (from the loop, never from inside this call). Idempotent: a second call only
 * replaces done. */
void pool_shutdown(struct pool *p, void (*done)(void *arg), void *arg);

/* Free the pool. Workers still running get SIGTERM, at most min(grace, 2 s) to exit
 * (blocking), then SIGKILL; every instance is recorded stopped. No process is left
 * behind. Not from inside the pool's own callbacks. NULL-safe. */
void pool_free(struct pool *p);

/* Instances not stopped/error (starting, ready, stopping). */
size_t pool_live_instances(const struct pool *p);

/* `motor worker-pool`: the pool alone on its own HTTP server. */
int pool_main(int argc, char **argv);

#endif
