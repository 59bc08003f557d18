/* pool_core — the pool, its nodes, and the one decision that matters: which call gets
 * which slot.
 *
 * Dispatch (pool_pump) is the only place slots are handed out, so the rules hold
 * everywhere:
 *   1. the oldest waiter is served first (FIFO per node);
 *   2. it gets a READY instance of the node's current manifest with a free slot (the
 *      least busy; among equals the most recently used, so under light load one
 *      instance stays warm and the others reach their TTL);
 *   3. else, when the waiters outnumber the slots that instances already starting will
 *      bring, a new instance is started, as long as the node's live instances (starting,
 *      ready, stopping, or failed but not yet reaped: all hold resources) stay under
 *      max_instances;
 *   4. else it waits, until a slot frees, an instance becomes ready or ends, or its
 *      queue timeout.
 * The reaper only ever stops a READY instance with no call on it, and marks it STOPPING
 * before anything else happens; rule 2 takes READY instances only. Both run on the one
 * reactor thread, so no call can land on an instance being stopped. */
#include "pool/pool_internal.h"

#include "common/cfgtab.h"
#include "common/log.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>

void pool_new_id(const char *prefix, char *buf, size_t cap)
{
    unsigned char rnd[6];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        /* Not worth failing over: ids only need to be unique within the database. */
        uint64_t x =
            (uint64_t)util_wall_ms() ^ ((uint64_t)getpid() << 20) ^ (uint64_t)util_mono_us();
        for (size_t i = 0; i < sizeof(rnd); i++)
            rnd[i] = (unsigned char)(x >> (8 * i));
    }
    snprintf(buf, cap, "%s%02x%02x%02x%02x%02x%02x", prefix, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
             rnd[5]);
}

void pool_config_init(struct pool_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfgtab_defaults(&pool_defaults_cfgtab, &cfg->defaults, NULL);
    cfg->stop_grace_ms = 5000;
    cfg->max_response = 16u << 20;
    cfg->max_request = 16u << 20;
}

/* ---- nodes ---------------------------------------------------------------------------- */

struct pool_node *pool_node_find(struct pool *p, const char *id)
{
    struct list_head *pos;
    list_for_each(pos, &p->nodes)
    {
        struct pool_node *n = list_entry(pos, struct pool_node, link);
        if (strcmp(n->id, id) == 0)
            return n;
    }
    return NULL;
}

void pool_node_unref(struct pool_node *n)
{
    if (!n || --n->refs > 0)
        return;
    pool_manifest_unref(n->m);
    free(n->id);
    free(n->source);
    free(n);
}

static void node_persist(struct pool_node *n)
{
    char *text = json_dumps(n->m->doc, JSON_COMPACT | JSON_SORT_KEYS);
    if (text)
        pool_store_node_put(n->pool->store, n->id, text, n->source);
    free(text);
}

struct pool_node *pool_node_put(struct pool *p, struct pool_manifest *m, const char *source,
                                bool persist, bool *created)
{
    struct pool_node *n = pool_node_find(p, m->id);
    if (n) {
        *created = false;
        struct pool_manifest *old = n->m;
        n->m = m;
        free(n->source);
        n->source = xstrdup(source);
        /* Instances of the old version drain: idle and starting ones stop now, busy
         * ones when their last call returns (pool_release). A stop may end instances
         * and trim others from the list (never this one): the next node is read after
         * the body, so plain list_for_each, not the _safe walk. */
        struct list_head *pos;
        list_for_each(pos, &p->insts)
        {
            struct pool_inst *i = list_entry(pos, struct pool_inst, link);
            if (i->node == n && i->m == old && i->busy == 0 &&
                (i->state == POOL_READY || i->state == POOL_STARTING))
                pool_inst_stop(i, "manifest replaced");
        }
        pool_manifest_unref(old);
        log_info("pool_node_replaced", LF_STR("node_id", n->id), LF_STR("source", source));
    } else {
        *created = true;
        n = xcalloc(1, sizeof(*n));
        n->pool = p;
        n->id = xstrdup(m->id);
        n->m = m;
        n->source = xstrdup(source);
        n->refs = 1;
        n->registered_wall = util_wall_ms();
        list_init(&n->wq);
        list_insert_head(&p->nodes, &n->link);
        log_info("pool_node_registered", LF_STR("node_id", n->id), LF_STR("source", source),
                 LF_INT("max_instances", m->max_instances),
                 LF_INT("max_concurrency", m->max_concurrency),
                 LF_INT("idle_ttl_ms", m->idle_ttl_ms), LF_BOOL("keep_warm", m->keep_warm));
    }
    if (persist)
        node_persist(n);
    pool_pump(n);
    return n;
}

static void fail_all_waiters(struct pool_node *n, int status, const char *msg)
{
    while (!list_empty(&n->wq)) {
        struct pool_waiter *w = list_entry(n->wq.next, struct pool_waiter, link);
        pool_waiter_cancel(w);
        w->failed(w, status, msg, NULL);
    }
}

static bool node_has_live(const struct pool_node *n)
{
    const struct list_head *pos;
    list_for_each(pos, &n->pool->insts)
    {
        const struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node == n && pool_inst_live(i))
            return true;
    }
    return false;
}

/* Out of the registry and the store; queued calls fail 404. drain: busy instances stop
 * when their last call returns (pool_release), the others now; else all stop now. */
static void node_remove(struct pool_node *n, bool drain, const char *why)
{
    struct pool *p = n->pool;
    n->deleted = true;
    list_remove(&n->link);
    pool_store_node_delete(p->store, n->id);
    log_info(drain ? "pool_node_retired" : "pool_node_deleted", LF_STR("node_id", n->id),
             LF_STR("why", why));
    char *msg = xasprintf("node '%s' was deleted", n->id);
    fail_all_waiters(n, 404, msg);
    free(msg);
    struct list_head *pos;
    list_for_each(pos, &p->insts) /* not _safe: see pool_node_put */
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node == n && (!drain || i->busy == 0))
            pool_inst_stop(i, "node deleted");
    }
}

void pool_node_retire(struct pool_node *n, const char *why)
{
    node_remove(n, true, why);
    pool_node_unref(n); /* the registry's reference; instances keep theirs */
}

void pool_node_delete(struct pool_node *n, void (*done)(void *arg), void *arg)
{
    node_remove(n, false, "DELETE");
    n->del_done = done;
    n->del_arg = arg;
    if (!node_has_live(n)) {
        n->del_done = NULL;
        if (done)
            done(arg);
    }
    pool_node_unref(n); /* the registry's reference */
}

json_t *pool_node_json(const struct pool_node *n)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(n->id));
    json_object_set_new(o, "source", json_string(n->source));
    char ts[40];
    util_wall_iso8601(n->registered_wall, ts, sizeof(ts));
    json_object_set_new(o, "registered_at", json_string(ts));
    json_object_set_new(o, "manifest", json_deep_copy(n->m->doc));
    int counts[5] = {0};
    int busy = 0;
    const struct list_head *pos;
    list_for_each(pos, &n->pool->insts)
    {
        const struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node != n)
            continue;
        if (pool_inst_live(i) || i->state == POOL_READY)
            counts[i->state]++;
        busy += i->busy;
    }
    json_t *ins = json_object();
    json_object_set_new(ins, "starting", json_integer(counts[POOL_STARTING]));
    json_object_set_new(ins, "ready", json_integer(counts[POOL_READY]));
    json_object_set_new(ins, "stopping", json_integer(counts[POOL_STOPPING]));
    json_object_set_new(ins, "busy_slots", json_integer(busy));
    json_object_set_new(o, "instances", ins);
    json_object_set_new(o, "queued", json_integer((json_int_t)n->n_waiting));
    json_t *c = json_object();
    json_object_set_new(c, "calls", json_integer((json_int_t)n->calls));
    json_object_set_new(c, "calls_failed", json_integer((json_int_t)n->calls_failed));
    json_object_set_new(c, "starts", json_integer((json_int_t)n->starts));
    json_object_set_new(c, "start_failures", json_integer((json_int_t)n->start_failures));
    json_object_set_new(c, "queue_timeouts", json_integer((json_int_t)n->queue_timeouts));
    json_object_set_new(o, "counters", c);
    return o;
}

/* ---- the queue -------------------------------------------------------------------------- */

void pool_waiter_cancel(struct pool_waiter *w)
{
    struct pool_node *n = w->node;
    if (n && list_linked(&w->link)) {
        list_remove(&w->link);
        n->n_waiting--;
    }
    if (n)
        reactor_timer_stop(n->pool->r, &w->timer);
}

static struct pool_waiter *pop_head(struct pool_node *n)
{
    struct list_head *first = list_first(&n->wq);
    if (!first)
        return NULL;
    struct pool_waiter *w = list_entry(first, struct pool_waiter, link);
    pool_waiter_cancel(w);
    return w;
}

/* Why there is no slot, for the 503 a caller gets: enough to act on. */
static char *no_capacity_msg(struct pool_node *n, int64_t waited_ms)
{
    int ready = 0, starting = 0, stopping = 0, busy = 0;
    struct list_head *pos;
    list_for_each(pos, &n->pool->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node != n || !pool_inst_live(i))
            continue;
        if (i->state == POOL_READY) {
            ready++;
            busy += i->busy;
        } else if (i->state == POOL_STARTING) {
            starting++;
        } else {
            stopping++;
        }
    }
    return xasprintf("no capacity for node '%s': waited %.1f s in the queue "
                     "(queue_timeout_seconds=%.3g); %d ready instance(s) with %d/%d slots busy, "
                     "%d starting, %d stopping; max_instances=%d, max_concurrency=%d, "
                     "%zu call(s) still queued",
                     n->id, (double)waited_ms / 1000.0, (double)n->m->queue_timeout_ms / 1000.0,
                     ready, busy, ready * n->m->max_concurrency, starting, stopping,
                     n->m->max_instances, n->m->max_concurrency, n->n_waiting);
}

static void on_queue_timeout(struct reactor *r, void *arg)
{
    struct pool_waiter *w = arg;
    struct pool_node *n = w->node;
    if (!list_linked(&w->link))
        return;
    pool_waiter_cancel(w);
    n->queue_timeouts++;
    n->calls_failed++;
    char *msg = no_capacity_msg(n, reactor_now(r) - w->enq_ms);
    log_warn("pool_queue_timeout", LF_STR("node_id", n->id),
             LF_INT("waited_ms", reactor_now(r) - w->enq_ms),
             LF_INT("queued", (int64_t)n->n_waiting));
    w->failed(w, 503, msg, NULL);
    free(msg);
}

void pool_acquire(struct pool_node *n, struct pool_waiter *w)
{
    struct pool *p = n->pool;
    w->node = n;
    list_init(&w->link);
    reactor_timer_init(&w->timer, on_queue_timeout, w);
    if (p->shutting_down) {
        w->failed(w, 503, "the worker pool is shutting down", NULL);
        return;
    }
    if (n->deleted) {
        w->failed(w, 404, "node was deleted", NULL);
        return;
    }
    w->enq_ms = util_mono_ms();
    list_insert_tail(&n->wq, &w->link);
    n->n_waiting++;
    if (n->m->queue_timeout_ms > 0)
        reactor_timer_start(p->r, &w->timer, n->m->queue_timeout_ms, 0);
    n->refs++;
    pool_pump(n);
    if (list_linked(&w->link) && n->m->queue_timeout_ms <= 0)
        on_queue_timeout(p->r, w); /* queue_timeout 0: a slot now or nothing */
    pool_node_unref(n);
}

/* Rule 2: the least busy READY instance of the current manifest with a free slot. */
static struct pool_inst *pick(struct pool_node *n)
{
    struct pool_inst *best = NULL;
    struct list_head *pos;
    list_for_each(pos, &n->pool->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node != n || i->state != POOL_READY || i->m != n->m ||
            i->busy >= n->m->max_concurrency)
            continue;
        if (!best || i->busy < best->busy ||
            (i->busy == best->busy && i->last_used_ms > best->last_used_ms))
            best = i;
    }
    return best;
}

void pool_pump(struct pool_node *n)
{
    if (n->pumping) {
        n->repump = true;
        return;
    }
    struct pool *p = n->pool;
    n->pumping = true;
    n->refs++;
    do {
        n->repump = false;
        while (!list_empty(&n->wq)) {
            if (p->shutting_down) {
                fail_all_waiters(n, 503, "the worker pool is shutting down");
                break;
            }
            if (n->deleted) {
                fail_all_waiters(n, 404, "node was deleted");
                break;
            }
            struct pool_inst *i = pick(n);
            if (i) {
                struct pool_waiter *w = pop_head(n);
                double waited = (double)(util_mono_ms() - w->enq_ms) / 1000.0;
                int b = 0;
                while (b < POOL_WAIT_BUCKETS && waited > pool_wait_bounds[b])
                    b++;
                p->wait_bucket[b]++;
                p->wait_count++;
                p->wait_sum += waited;
                i->busy++;
                i->calls++;
                n->calls++;
                i->last_used_ms = util_mono_ms();
                i->last_used_wall = util_wall_ms();
                pool_inst_became_busy(i);
                w->granted(w, i);
                continue;
            }
            size_t starting = 0, live = 0;
            struct list_head *pos;
            list_for_each(pos, &p->insts)
            {
                struct pool_inst *j = list_entry(pos, struct pool_inst, link);
                if (j->node != n || !pool_inst_live(j))
                    continue;
                live++;
                if (j->state == POOL_STARTING && j->m == n->m)
                    starting++;
            }
            if (n->n_waiting > starting * (size_t)n->m->max_concurrency &&
                live < (size_t)n->m->max_instances) {
                /* A synchronous spawn failure fails at least one waiter (start_failed),
                 * so this loop always makes progress. */
                pool_inst_start(n);
                continue;
            }
            break;
        }
    } while (n->repump);
    n->pumping = false;
    pool_node_unref(n);
}

void pool_start_failed(struct pool_node *n, struct pool_inst *i)
{
    n->start_failures++;
    bool others = false;
    struct list_head *pos;
    list_for_each(pos, &n->pool->insts)
    {
        struct pool_inst *j = list_entry(pos, struct pool_inst, link);
        if (j != i && j->node == n && j->m == n->m &&
            (j->state == POOL_READY || j->state == POOL_STARTING))
            others = true;
    }
    /* With no other instance coming, every waiter would only wait for the next start
     * of a worker that just failed: fail them all, the next call tries again. */
    size_t k = others ? MOTOR_MIN(n->n_waiting, (size_t)i->m->max_concurrency) : n->n_waiting;
    if (k == 0)
        return;
    char *msg = xasprintf("instance %s of node '%s' failed to start: %s", i->id, n->id,
                          i->error ? i->error : "unknown error");
    json_t *extra = json_object();
    json_object_set_new(extra, "instance_id", json_string(i->id));
    json_object_set_new(extra, "stderr_tail", pool_lines_json(i->error_tail));
    for (size_t j = 0; j < k && !list_empty(&n->wq); j++) {
        struct pool_waiter *w = pop_head(n);
        n->calls_failed++;
        w->failed(w, 503, msg, extra);
    }
    json_decref(extra);
    free(msg);
}

void pool_release(struct pool_inst *i)
{
    struct pool_node *n = i->node;
    if (i->busy > 0)
        i->busy--;
    i->last_used_ms = util_mono_ms();
    i->last_used_wall = util_wall_ms();
    if (i->busy == 0) {
        if (i->state == POOL_READY && (n->deleted || i->m != n->m))
            pool_inst_stop(i, n->deleted ? "node deleted" : "manifest replaced");
        else
            pool_inst_became_idle(i);
    }
    pool_pump(n);
}

size_t pool_live_instances(const struct pool *p)
{
    size_t k = 0;
    const struct list_head *pos;
    list_for_each(pos, &p->insts)
    {
        if (pool_inst_live(list_entry(pos, struct pool_inst, link)))
            k++;
    }
    return k;
}

static void on_shutdown_timer(struct reactor *r, void *arg)
{
    struct pool *p = arg;
    void (*done)(void *) = p->shutdown_done;
    p->shutdown_done = NULL;
    if (done)
        done(p->shutdown_arg);
}

void pool_inst_ended(struct pool_inst *i)
{
    struct pool *p = i->pool;
    struct pool_node *n = i->node;
    n->refs++;
    p->n_ended++;
    /* Keep the newest ended instances for the admin API; the database has them all. */
    if (p->n_ended > POOL_KEEP_ENDED) {
        /* Oldest first: from the tail towards the head, the previous node read before
         * this one may be freed. */
        struct list_head *pos, *prev;
        for (pos = p->insts.prev; pos != &p->insts && p->n_ended > POOL_KEEP_ENDED; pos = prev) {
            prev = pos->prev;
            struct pool_inst *j = list_entry(pos, struct pool_inst, link);
            if (j != i && !pool_inst_live(j) && j->state != POOL_READY && j->busy == 0 &&
                list_empty(&j->calls_head)) {
                list_remove(&j->link);
                p->n_ended--;
                pool_inst_destroy(j);
            }
        }
    }
    if (n->deleted && n->del_done && !node_has_live(n)) {
        void (*done)(void *) = n->del_done;
        n->del_done = NULL;
        done(n->del_arg);
    }
    if (!n->deleted)
        pool_pump(n);
    if (p->shutting_down && pool_live_instances(p) == 0 && p->shutdown_done)
        reactor_timer_start(p->r, &p->shutdown_timer, 0, 0);
    pool_node_unref(n);
}

/* ---- lifetime ------------------------------------------------------------------------- */

static void load_stored(const char *id, const char *text, const char *source, void *arg)
{
    struct pool *p = arg;
    struct cfg_errors errs;
    cfg_errors_init(&errs, id);
    json_t *doc = cfg_load_buffer(text, strlen(text), &errs);
    struct pool_manifest *m =
        doc ? pool_manifest_parse(doc, &p->cfg.defaults, p->base_dir, &errs) : NULL;
    json_decref(doc);
    if (!m) {
        log_error("pool_stored_manifest_invalid", LF_STR("node_id", id),
                  LF_STR("errors", cfg_errors_text(&errs)));
    } else {
        bool created;
        pool_node_put(p, m, source ? source : "api", false, &created);
    }
    cfg_errors_release(&errs);
}

static int json_file_filter(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return d->d_name[0] != '.' && n > 5 && strcmp(d->d_name + n - 5, ".json") == 0;
}

/* The manifests directory as last read: every *.json file with its identity (valid or
 * not, so an unchanged invalid file is not reported again) and the node it defines. */
struct pool_file {
    char *path;
    char *sig;
    char *node_id; /* NULL: invalid */
};

static void files_free(struct pool_file *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(f[i].path);
        free(f[i].sig);
        free(f[i].node_id);
    }
    free(f);
}

static const struct pool_file *file_find(const struct pool_file *f, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].path, path) == 0)
            return &f[i];
    return NULL;
}

/* A node that came from a file of the manifests directory (its source is the path). */
static bool from_dir(const struct pool *p, const struct pool_node *n)
{
    size_t d = strlen(p->manifests_dir);
    return strncmp(n->source, p->manifests_dir, d) == 0 && n->source[d] == '/' &&
           !strchr(n->source + d + 1, '/');
}

/* Read the directory: a new or changed file is validated and, when valid, registers or
 * replaces its node (the old version drains); an invalid one is reported and the node
 * it defined before keeps serving; a removed file's node is retired (queued calls 404,
 * running calls finish, then its instances stop). At start (first), a missing directory
 * is an error; later it is reported and nothing changes. */
static int rescan(struct pool *p, bool first)
{
    struct dirent **list = NULL;
    int n = scandir(p->manifests_dir, &list, json_file_filter, alphasort);
    if (n < 0) {
        int err = errno;
        log_error("pool_manifests_dir_unreadable", LF_STR("dir", p->manifests_dir),
                  LF_STR("error", strerror(err)),
                  LF_STR("action", first ? "cannot start" : "keeping every node as it is"));
        return -err;
    }
    struct pool_file *seen = xcalloc((size_t)n + 1, sizeof(*seen));
    size_t n_seen = 0;
    int loaded = 0, bad = 0, unchanged = 0;
    for (int k = 0; k < n; k++) {
        char *path = xasprintf("%s/%s", p->manifests_dir, list[k]->d_name);
        free(list[k]);
        struct pool_file *f = &seen[n_seen++];
        f->path = path;
        f->sig = cfgwatch_file_sig(path);
        const struct pool_file *was = file_find(p->files, p->n_files, path);
        if (was && strcmp(was->sig, f->sig) == 0) {
            f->node_id = was->node_id ? xstrdup(was->node_id) : NULL;
            unchanged++;
            continue;
        }
        struct cfg_errors errs;
        cfg_errors_init(&errs, path + strlen(p->manifests_dir) + 1); /* the file's name */
        json_t *doc = cfg_load_file(path, &errs);
        struct pool_manifest *m =
            doc ? pool_manifest_parse(doc, &p->cfg.defaults, p->base_dir, &errs) : NULL;
        json_decref(doc);
        if (m) {
            f->node_id = xstrdup(m->id);
            bool created;
            pool_node_put(p, m, path, true, &created);
            loaded++;
        } else {
            /* The node this file defined before (if any) keeps its last valid version. */
            f->node_id = was && was->node_id ? xstrdup(was->node_id) : NULL;
            bad++;
            log_error(
                "pool_manifest_invalid", LF_STR("file", path),
                LF_INT("errors", cfg_errors_count(&errs)), LF_STR("detail", cfg_errors_text(&errs)),
                LF_STR("action", f->node_id ? "the node keeps its previous manifest" : "skipped"));
        }
        cfg_errors_release(&errs);
    }
    free(list);
    /* Nodes whose file is gone, or whose file now defines another id: retired. */
    int retired = 0;
    struct list_head *pos, *tmp;
    list_for_each_safe(pos, tmp, &p->nodes)
    {
        struct pool_node *node = list_entry(pos, struct pool_node, link);
        if (!from_dir(p, node))
            continue;
        const struct pool_file *f = file_find(seen, n_seen, node->source);
        if (f && f->node_id && strcmp(f->node_id, node->id) == 0)
            continue;
        pool_node_retire(node, f ? "its file defines another node now" : "its file was removed");
        retired++;
    }
    files_free(p->files, p->n_files);
    p->files = seen;
    p->n_files = n_seen;
    if (first || loaded || bad || retired)
        log_info(first ? "pool_manifests_loaded" : "pool_manifests_reloaded",
                 LF_STR("dir", p->manifests_dir), LF_INT("loaded", loaded), LF_INT("invalid", bad),
                 LF_INT("unchanged", unchanged), LF_INT("retired", retired));
    return 0;
}

static void on_manifests_changed(void *arg)
{
    struct pool *p = arg;
    if (!p->shutting_down)
        (void)rescan(p, false);
}

/* Absolute, so a manifest's workdir and source do not depend on the cwd of the moment;
 * a path that does not resolve (yet) is kept as given and reported when used. */
static char *abs_path(const char *path)
{
    if (!path || !*path)
        return NULL;
    char *real = realpath(path, NULL);
    return real ? real : xstrdup(path);
}

struct pool *pool_new(struct reactor *r, const struct pool_config *cfg)
{
    struct pool *p = xcalloc(1, sizeof(*p));
    list_init(&p->nodes);
    list_init(&p->insts);
    list_init(&p->calls);
    p->r = r;
    p->cfg = *cfg;
    p->manifests_dir = abs_path(cfg->manifests_dir);
    p->db_path = xstrdup(cfg->db_path ? cfg->db_path : "");
    if (cfg->base_dir && *cfg->base_dir)
        p->base_dir = abs_path(cfg->base_dir);
    else if (p->manifests_dir)
        p->base_dir = xstrdup(p->manifests_dir);
    p->cfg.manifests_dir = p->manifests_dir;
    p->cfg.db_path = p->db_path;
    p->cfg.base_dir = p->base_dir;
    if (p->cfg.stop_grace_ms < 0)
        p->cfg.stop_grace_ms = 0;
    if (!p->cfg.max_response)
        p->cfg.max_response = 16u << 20;
    if (!p->cfg.max_request)
        p->cfg.max_request = 16u << 20;
    p->spawn = pool_inst_spawn;
    reactor_timer_init(&p->shutdown_timer, on_shutdown_timer, p);

    int err = 0;
    p->store = pool_store_open(p->db_path);
    if (!p->store) {
        err = EIO;
        goto fail;
    }
    p->http = httpc_new(r);
    if (!p->http) {
        err = errno ? errno : ENOMEM;
        goto fail;
    }
    int orphans = pool_store_close_orphans(
        p->store, "worker pool restarted (the previous process ended without stopping it)",
        util_wall_ms());
    if (orphans > 0)
        log_warn("pool_orphan_records_closed", LF_INT("instances", orphans));
    pool_store_nodes_each(p->store, load_stored, p);
    if (p->manifests_dir) {
        int rc = rescan(p, true);
        if (rc < 0) {
            err = -rc;
            goto fail;
        }
        /* Changes to the directory apply while running (cfgwatch.h). */
        p->watch = cfgwatch_new(r, "manifests", 0, on_manifests_changed, p);
        const char *dirs[] = {p->manifests_dir};
        (void)cfgwatch_set(p->watch, NULL, 0, dirs, 1);
    }
    size_t nn = list_count(&p->nodes);
    log_info("pool_started", LF_STR("db", *p->db_path ? p->db_path : ":memory:"),
             LF_STR("manifests_dir", p->manifests_dir), LF_INT("nodes", (int64_t)nn));
    return p;
fail:
    pool_free(p);
    errno = err;
    return NULL;
}

void pool_shutdown(struct pool *p, void (*done)(void *arg), void *arg)
{
    p->shutdown_done = done;
    p->shutdown_arg = arg;
    if (!p->shutting_down) {
        p->shutting_down = true;
        log_info("pool_shutting_down", LF_INT("live_instances", (int64_t)pool_live_instances(p)));
        pool_api_drop_calls(p, "the worker pool is shutting down");
        struct list_head *pos;
        list_for_each(pos, &p->nodes)
        {
            fail_all_waiters(list_entry(pos, struct pool_node, link), 503,
                             "the worker pool is shutting down");
        }
        list_for_each(pos, &p->insts) /* not _safe: see pool_node_put */
        {
            pool_inst_stop(list_entry(pos, struct pool_inst, link), "pool shutdown");
        }
    }
    if (pool_live_instances(p) == 0)
        reactor_timer_start(p->r, &p->shutdown_timer, 0, 0);
}

void pool_free(struct pool *p)
{
    if (!p)
        return;
    p->shutting_down = true;
    pool_api_drop_calls(p, "the worker pool is shutting down");
    struct list_head *pos;
    list_for_each(pos, &p->nodes)
    {
        fail_all_waiters(list_entry(pos, struct pool_node, link), 503,
                         "the worker pool is shutting down");
    }
    /* A last chance to exit cleanly (flush, remove temp files), bounded: shutdown
     * must not hang on a worker that ignores SIGTERM. */
    bool any = false;
    list_for_each(pos, &p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->proc && i->proc_alive && proc_signal(i->proc, SIGTERM) == 0)
            any = true;
    }
    if (any) {
        int64_t deadline = util_mono_ms() + MOTOR_MIN(p->cfg.stop_grace_ms, 2000);
        for (;;) {
            bool all = true;
            for (pos = p->insts.next; pos != &p->insts && all; pos = pos->next) {
                struct pool_inst *i = list_entry(pos, struct pool_inst, link);
                if (i->proc && i->proc_alive && !pool_inst_exited(i))
                    all = false;
            }
            if (all || util_mono_ms() >= deadline)
                break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    while (!list_empty(&p->insts)) {
        struct pool_inst *i = list_entry(p->insts.next, struct pool_inst, link);
        list_remove(&i->link);
        pool_inst_destroy(i);
    }
    while (!list_empty(&p->nodes)) {
        struct pool_node *n = list_entry(p->nodes.next, struct pool_node, link);
        list_remove(&n->link);
        n->deleted = true;
        pool_node_unref(n);
    }
    if (p->r)
        reactor_timer_stop(p->r, &p->shutdown_timer);
    cfgwatch_free(p->watch);
    files_free(p->files, p->n_files);
    httpc_free(p->http);
    pool_store_close(p->store);
    free(p->manifests_dir);
    free(p->db_path);
    free(p->base_dir);
    free(p);
}
