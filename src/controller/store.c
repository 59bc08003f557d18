/* store — the write queue, leadership bookkeeping and backend dispatch. */
#include "controller/store_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *store_backend_name(enum store_backend b)
{
    switch (b) {
    case STORE_SQLITE:
        return "sqlite";
    case STORE_ETCD:
        return "etcd";
    case STORE_MEMORY:
        return "memory";
    }
    return "?";
}

static void pump(struct store *st);

static void on_retry(struct reactor *r, void *arg)
{
    (void)r;
    pump(arg);
}

static void on_campaign(struct reactor *r, void *arg)
{
    (void)r;
    struct store *st = arg;
    if (!st->leader && st->campaigning)
        st->ops->campaign(st);
}

struct store *store_open(struct reactor *r, const struct store_opts *o, char *err, size_t cap)
{
    struct store *st = xcalloc(1, sizeof(*st));
    st->r = r;
    st->backend = o->backend;
    st->owner = xstrdup(o->owner ? o->owner : "motor-controller");
    st->leader_owner = xstrdup("");
    st->retry_ms = o->retry_ms > 0 ? o->retry_ms : 1000;
    reactor_timer_init(&st->campaign_timer, on_campaign, st);
    reactor_timer_init(&st->retry_timer, on_retry, st);
    int rc;
    switch (o->backend) {
    case STORE_SQLITE:
        rc = store_sqlite_open(st, o, err, cap);
        break;
    case STORE_ETCD:
        rc = store_etcd_open(st, o, err, cap);
        break;
    case STORE_MEMORY:
        rc = store_memory_open(st, o, err, cap);
        break;
    default:
        snprintf(err, cap, "unknown store backend");
        rc = -EINVAL;
    }
    if (rc < 0) {
        free(st->owner);
        free(st->leader_owner);
        free(st);
        return NULL;
    }
    return st;
}

static void op_free(struct store_op *op)
{
    free(op->key);
    free(op->value);
    free(op);
}

void store_free(struct store *st)
{
    if (!st)
        return;
    reactor_timer_stop(st->r, &st->campaign_timer);
    reactor_timer_stop(st->r, &st->retry_timer);
    if (st->ops && st->ops->free)
        st->ops->free(st);
    struct store_op *op = st->head;
    st->head = st->tail = NULL;
    while (op) {
        struct store_op *next = op->next;
        if (!op->key && op->barrier_cb)
            op->barrier_cb(st, -ECANCELED, op->barrier_arg);
        op_free(op);
        op = next;
    }
    free(st->owner);
    free(st->leader_owner);
    free(st);
}

enum store_backend store_get_backend(const struct store *st)
{
    return st->backend;
}

void store_campaign(struct store *st, store_leader_cb cb, void *arg)
{
    st->leader_cb = cb;
    st->leader_arg = arg;
    st->campaigning = true;
    reactor_timer_start(st->r, &st->campaign_timer, 0, 0);
}

bool store_is_leader(const struct store *st)
{
    return st->leader;
}

const char *store_leader_owner(const struct store *st)
{
    return st->leader_owner ? st->leader_owner : "";
}

void store_set_leader(struct store *st, bool leader, const char *owner)
{
    free(st->leader_owner);
    st->leader_owner = xstrdup(owner ? owner : "");
    if (st->leader == leader)
        return;
    st->leader = leader;
    log_info(leader ? "store_leader_acquired" : "store_leader_lost",
             LF_STR("backend", store_backend_name(st->backend)), LF_STR("owner", st->owner));
    if (!leader && st->campaigning)
        reactor_timer_start(st->r, &st->campaign_timer, st->retry_ms, 0);
    if (st->leader_cb)
        st->leader_cb(st, leader, st->leader_arg);
    if (leader)
        pump(st);
}

void store_campaign_retry(struct store *st, const char *current_owner)
{
    if (current_owner) {
        free(st->leader_owner);
        st->leader_owner = xstrdup(current_owner);
    }
    if (st->campaigning && !st->leader)
        reactor_timer_start(st->r, &st->campaign_timer, st->retry_ms, 0);
}

void store_load(struct store *st, store_load_cb cb, void *arg)
{
    st->stats.loads++;
    st->ops->load(st, cb, arg);
}

static struct store_op *find_queued(struct store *st, const char *key)
{
    /* Only the tail run after the last barrier may be coalesced into: a write must not
     * jump ahead of a barrier that was promised everything queued before it. */
    struct store_op *from = st->head;
    for (struct store_op *op = st->head; op; op = op->next)
        if (!op->key)
            from = op->next;
    for (struct store_op *op = from; op; op = op->next)
        if (op->key && !op->inflight && strcmp(op->key, key) == 0)
            return op;
    return NULL;
}

static void enqueue(struct store *st, const char *key, const char *value)
{
    struct store_op *op = find_queued(st, key);
    if (op) {
        /* Coalesce: only the latest value of a queued key matters, and it keeps the
         * queue bounded by the number of keys while the backend is down. */
        free(op->value);
        op->value = xstrdup(value);
    } else {
        op = xcalloc(1, sizeof(*op));
        op->key = xstrdup(key);
        op->value = xstrdup(value);
        if (st->tail)
            st->tail->next = op;
        else
            st->head = op;
        st->tail = op;
        st->n_ops++;
    }
    pump(st);
}

void store_put(struct store *st, const char *key, const char *value)
{
    enqueue(st, key, value ? value : "");
}

void store_del(struct store *st, const char *key)
{
    enqueue(st, key, NULL);
}

size_t store_pending(const struct store *st)
{
    return st->n_ops;
}

void store_barrier(struct store *st, store_barrier_cb cb, void *arg)
{
    if (!st->head) {
        cb(st, 0, arg);
        return;
    }
    struct store_op *op = xcalloc(1, sizeof(*op));
    op->barrier_cb = cb;
    op->barrier_arg = arg;
    st->tail->next = op;
    st->tail = op;
}

static void pump(struct store *st)
{
    /* Synchronous backends complete inside write(): loop instead of recursing. */
    if (st->pumping)
        return;
    st->pumping = true;
    while (st->leader && st->head && !st->head->inflight &&
           !reactor_timer_active(&st->retry_timer)) {
        struct store_op *op = st->head;
        if (!op->key) {
            st->head = op->next;
            if (!st->head)
                st->tail = NULL;
            if (op->barrier_cb)
                op->barrier_cb(st, 0, op->barrier_arg);
            op_free(op);
            continue;
        }
        op->inflight = true;
        st->ops->write(st, op);
    }
    st->pumping = false;
}

void store_write_done(struct store *st, struct store_op *op, int err)
{
    if (op != st->head)
        return; /* cannot happen: one write in flight, always the head */
    op->inflight = false;
    if (err < 0) {
        st->stats.writes_failed++;
        log_warn("store_write_failed", LF_STR("backend", store_backend_name(st->backend)),
                 LF_STR("key", op->key), LF_STR("error", strerror(-err)));
        reactor_timer_start(st->r, &st->retry_timer, st->retry_ms, 0);
        return;
    }
    st->stats.writes_ok++;
    st->head = op->next;
    if (!st->head)
        st->tail = NULL;
    st->n_ops--;
    op_free(op);
    if (!st->pumping)
        pump(st);
}

size_t store_flush(struct store *st, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (st->n_ops && st->leader && util_mono_ms() < deadline) {
        if (reactor_timer_active(&st->retry_timer))
            break; /* the backend is failing: do not stall the shutdown */
        reactor_run_once(st->r, 50);
    }
    return st->n_ops;
}

void store_get_stats(const struct store *st, struct store_stats *out)
{
    *out = st->stats;
}
