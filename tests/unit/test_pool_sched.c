/* pool scheduling: acquire/release, starts up to max_instances, FIFO queueing, queue
 * timeouts, start failures, reaping, keep_warm, manifest replacement and deletion.
 *
 * The real pool runs on a real reactor with an in-memory database; only the spawn is
 * replaced by a fake that starts no process, so the test decides when an instance
 * becomes ready (pool_inst_mark_ready) or fails (pool_inst_fail). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/util.h"
#include "pool/pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* ---- fixtures ------------------------------------------------------------------------- */

#define MAX_SPAWNED 128

static struct pool_inst *spawned[MAX_SPAWNED];
static int n_spawned;
static int fail_spawns; /* the next N spawns fail synchronously */

static int fake_spawn(struct pool_inst *i)
{
    assert_true(n_spawned < MAX_SPAWNED);
    spawned[n_spawned++] = i;
    if (fail_spawns > 0) {
        fail_spawns--;
        pool_inst_fail(i, "spawn failed: No such file or directory");
        return -ENOENT;
    }
    return 0;
}

struct tw {
    struct pool_waiter w;
    int id;
    struct pool_inst *got;
    int status; /* 0 = pending, 200 = granted, else the failure */
    char msg[512];
    bool has_tail;
};

static int order[64];
static int n_order;

static void tw_granted(struct pool_waiter *w, struct pool_inst *i)
{
    struct tw *t = (struct tw *)w;
    assert_int_equal(t->status, 0);
    assert_int_equal(i->state, POOL_READY); /* never a stopping/starting instance */
    t->got = i;
    t->status = 200;
    order[n_order++] = t->id;
}

static void tw_failed(struct pool_waiter *w, int status, const char *msg, json_t *extra)
{
    struct tw *t = (struct tw *)w;
    assert_int_equal(t->status, 0);
    t->status = status;
    snprintf(t->msg, sizeof(t->msg), "%s", msg);
    t->has_tail = extra && json_is_array(json_object_get(extra, "stderr_tail"));
}

static void tw_init(struct tw *t, int id)
{
    memset(t, 0, sizeof(*t));
    t->id = id;
    t->w.granted = tw_granted;
    t->w.failed = tw_failed;
}

struct fx {
    struct reactor *r;
    struct pool *p;
};

static int setup(void **state)
{
    /* Keep the test output readable: the pool logs every transition. */
    log_set_level(LOG_ERROR);
    struct fx *f = xcalloc(1, sizeof(*f));
    f->r = reactor_new();
    assert_non_null(f->r);
    struct pool_config cfg;
    pool_config_init(&cfg);
    f->p = pool_new(f->r, &cfg);
    assert_non_null(f->p);
    f->p->spawn = fake_spawn;
    n_spawned = 0;
    n_order = 0;
    fail_spawns = 0;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    pool_free(f->p);
    reactor_free(f->r);
    free(f);
    return 0;
}

static struct pool_node *add_node(struct fx *f, const char *json)
{
    json_error_t jerr;
    json_t *j = json_loads(json, 0, &jerr);
    assert_non_null(j);
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    struct pool_manifest *m = pool_manifest_parse(j, &f->p->cfg.defaults, "/tmp", &e);
    json_decref(j);
    if (!m)
        fail_msg("manifest: %s", cfg_errors_text(&e));
    cfg_errors_release(&e);
    bool created;
    return pool_node_put(f->p, m, "test", true, &created);
}

static int count_state(struct fx *f, struct pool_node *n, enum pool_state s)
{
    int k = 0;
    struct list_head *pos;
    list_for_each(pos, &f->p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node == n && i->state == s)
            k++;
    }
    return k;
}

/* Run the loop until pred or the deadline (ms). */
static bool run_until(struct fx *f, bool (*pred)(void *), void *arg, int64_t ms)
{
    int64_t end = util_mono_ms() + ms;
    while (!pred(arg)) {
        if (util_mono_ms() >= end)
            return false;
        reactor_run_once(f->r, 5);
    }
    return true;
}

static bool tw_done(void *arg)
{
    return ((struct tw *)arg)->status != 0;
}

struct state_wait {
    struct pool_inst *i;
    enum pool_state s;
};

static bool inst_in(void *arg)
{
    struct state_wait *sw = arg;
    return sw->i->state == sw->s;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_cold_start_then_warm_reuse(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"a\",\"command\":[\"x\"]}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    assert_int_equal(n_spawned, 1); /* cold: one start */
    assert_int_equal(w1.status, 0); /* waiting for it */
    assert_int_equal(n->n_waiting, 1);
    assert_int_equal(spawned[0]->state, POOL_STARTING);
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w1.status, 200);
    assert_ptr_equal(w1.got, spawned[0]);
    assert_int_equal(spawned[0]->busy, 1);
    pool_release(w1.got);
    assert_int_equal(spawned[0]->busy, 0);
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(w2.status, 200); /* warm: at once, same instance */
    assert_ptr_equal(w2.got, spawned[0]);
    assert_int_equal(n_spawned, 1);
    assert_int_equal(spawned[0]->calls, 2);
    pool_release(w2.got);
}

static void test_concurrency_cap_and_fifo(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"a\",\"command\":[\"x\"],\"max_concurrency\":2,\"max_instances\":1}");
    struct tw w[5];
    for (int k = 0; k < 5; k++) {
        tw_init(&w[k], k);
        pool_acquire(n, &w[k].w);
    }
    assert_int_equal(n_spawned, 1); /* max_instances 1 */
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w[0].status, 200);
    assert_int_equal(w[1].status, 200);
    assert_int_equal(w[2].status, 0); /* cap 2 */
    assert_int_equal(spawned[0]->busy, 2);
    assert_int_equal(n->n_waiting, 3);
    pool_release(spawned[0]);
    assert_int_equal(w[2].status, 200);
    assert_int_equal(w[3].status, 0);
    pool_release(spawned[0]);
    pool_release(spawned[0]);
    assert_int_equal(w[3].status, 200);
    assert_int_equal(w[4].status, 200);
    /* Served strictly in arrival order. */
    for (int k = 0; k < 5; k++)
        assert_int_equal(order[k], k);
    assert_int_equal(n_spawned, 1);
}

static void test_starts_up_to_max_instances(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"a\",\"command\":[\"x\"],\"max_concurrency\":1,\"max_instances\":3}");
    struct tw w[5];
    for (int k = 0; k < 5; k++) {
        tw_init(&w[k], k);
        pool_acquire(n, &w[k].w);
    }
    assert_int_equal(n_spawned, 3);
    pool_inst_mark_ready(spawned[1], 5001);
    assert_int_equal(w[0].status, 200); /* the oldest waiter takes the first slot */
    assert_ptr_equal(w[0].got, spawned[1]);
    pool_inst_mark_ready(spawned[0], 5000);
    pool_inst_mark_ready(spawned[2], 5002);
    assert_int_equal(w[1].status, 200);
    assert_int_equal(w[2].status, 200);
    assert_int_equal(w[3].status, 0);
    pool_release(w[1].got);
    assert_int_equal(w[3].status, 200);
    assert_ptr_equal(w[3].got, w[1].got);
    assert_int_equal(n_spawned, 3);
    pool_waiter_cancel(&w[4].w); /* stack waiters must not outlive the test */
}

static void test_starting_capacity_counts(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"a\",\"command\":[\"x\"],\"max_concurrency\":4,\"max_instances\":3}");
    struct tw w[6];
    for (int k = 0; k < 4; k++) {
        tw_init(&w[k], k);
        pool_acquire(n, &w[k].w);
    }
    /* One starting instance will bring 4 slots: no second start for 4 waiters. */
    assert_int_equal(n_spawned, 1);
    tw_init(&w[4], 4);
    pool_acquire(n, &w[4].w);
    assert_int_equal(n_spawned, 2);
    pool_inst_mark_ready(spawned[0], 5000);
    for (int k = 0; k < 4; k++)
        assert_int_equal(w[k].status, 200);
    assert_int_equal(w[4].status, 0);
    /* Least busy first: the fifth goes to the second instance once ready. */
    pool_inst_mark_ready(spawned[1], 5001);
    assert_int_equal(w[4].status, 200);
    assert_ptr_equal(w[4].got, spawned[1]);
    tw_init(&w[5], 5);
    pool_acquire(n, &w[5].w);
    assert_ptr_equal(w[5].got, spawned[1]); /* 1 busy < 4 busy */
}

static void test_queue_timeout_503(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(
        f, "{\"id\":\"q\",\"command\":[\"x\"],\"max_instances\":1,\"queue_timeout_seconds\":0.05}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w1.status, 200);
    tw_init(&w2, 2);
    int64_t t0 = util_mono_ms();
    pool_acquire(n, &w2.w);
    assert_int_equal(w2.status, 0);
    assert_true(run_until(f, tw_done, &w2, 2000));
    int64_t waited = util_mono_ms() - t0;
    assert_true(waited >= 45);
    assert_int_equal(w2.status, 503);
    assert_non_null(strstr(w2.msg, "no capacity for node 'q'"));
    assert_non_null(strstr(w2.msg, "1/1 slots busy"));
    assert_int_equal(n->n_waiting, 0);
    assert_int_equal(n->queue_timeouts, 1);
    /* Releasing later still works and nothing is granted to the gone waiter. */
    pool_release(w1.got);
    assert_int_equal(spawned[0]->busy, 0);
}

static void test_queue_timeout_zero_fails_at_once(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(
        f, "{\"id\":\"z\",\"command\":[\"x\"],\"max_instances\":1,\"queue_timeout_seconds\":0}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    assert_int_equal(w1.status, 503); /* nothing ready, and no waiting allowed */
    pool_inst_mark_ready(spawned[0], 5000);
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(w2.status, 200);
}

static void test_cancelled_waiter_is_skipped(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"a\",\"command\":[\"x\"]}");
    struct tw w1, w2, w3;
    tw_init(&w1, 1);
    tw_init(&w2, 2);
    tw_init(&w3, 3);
    pool_acquire(n, &w1.w);
    pool_acquire(n, &w2.w);
    pool_acquire(n, &w3.w);
    pool_waiter_cancel(&w1.w); /* client gone while queued */
    assert_int_equal(n->n_waiting, 2);
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w1.status, 0);
    assert_int_equal(w2.status, 200);
    pool_release(w2.got);
    assert_int_equal(w3.status, 200);
}

static void test_sync_start_failure_fails_waiters(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"b\",\"command\":[\"x\"],\"max_concurrency\":1,\"max_instances\":2}");
    fail_spawns = 100;
    struct tw w1;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    assert_int_equal(w1.status, 503);
    assert_non_null(strstr(w1.msg, "failed to start: spawn failed"));
    assert_true(w1.has_tail);
    assert_int_equal(spawned[0]->state, POOL_ERROR);
    assert_int_equal(n->start_failures, 1);
    /* The next call tries again (a replacement), and succeeds once spawns work. */
    fail_spawns = 0;
    struct tw w2;
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(n_spawned, 2);
    pool_inst_mark_ready(spawned[1], 5000);
    assert_int_equal(w2.status, 200);
}

static void test_ready_timeout_fails_all_when_alone(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"c\",\"command\":[\"x\"],\"max_concurrency\":1,"
                                      "\"max_instances\":1,\"ready_timeout_seconds\":0.05}");
    struct tw w[3];
    for (int k = 0; k < 3; k++) {
        tw_init(&w[k], k);
        pool_acquire(n, &w[k].w);
    }
    assert_true(run_until(f, tw_done, &w[2], 2000));
    for (int k = 0; k < 3; k++) {
        assert_int_equal(w[k].status, 503);
        assert_non_null(strstr(w[k].msg, "no 'MOTOR_NODE_READY port=N' line"));
    }
    assert_int_equal(spawned[0]->state, POOL_ERROR);
    assert_int_equal(n_spawned, 1); /* no retry storm */
}

static void test_start_failure_with_others_fails_only_its_share(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"d\",\"command\":[\"x\"],\"max_concurrency\":1,\"max_instances\":2}");
    struct tw w[3];
    for (int k = 0; k < 3; k++) {
        tw_init(&w[k], k);
        pool_acquire(n, &w[k].w);
    }
    assert_int_equal(n_spawned, 2);
    pool_inst_fail(spawned[0], "health check failed: GET /health answered HTTP 500");
    /* One waiter (its share: max_concurrency) fails; the others wait for the second. */
    assert_int_equal(w[0].status, 503);
    assert_int_equal(w[1].status, 0);
    assert_int_equal(w[2].status, 0);
    pool_inst_mark_ready(spawned[1], 5001);
    assert_int_equal(w[1].status, 200);
    /* The failed one was reaped (no process here): a replacement starts for w[2]. */
    assert_int_equal(n_spawned, 3);
    pool_inst_mark_ready(spawned[2], 5002);
    assert_int_equal(w[2].status, 200);
}

static void test_idle_reaping_and_keep_warm(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"r\",\"command\":[\"x\"],\"idle_ttl_seconds\":0.1}");
    struct pool_node *k =
        add_node(f, "{\"id\":\"k\",\"command\":[\"x\"],\"idle_ttl_seconds\":0.1,\"keep_warm\":true}");
    struct pool_node *never =
        add_node(f, "{\"id\":\"v\",\"command\":[\"x\"],\"idle_ttl_seconds\":-1}");
    struct tw w1, w2, w3;
    tw_init(&w1, 1);
    tw_init(&w2, 2);
    tw_init(&w3, 3);
    pool_acquire(n, &w1.w);
    pool_acquire(k, &w2.w);
    pool_acquire(never, &w3.w);
    for (int i = 0; i < 3; i++)
        pool_inst_mark_ready(spawned[i], 5000 + i);
    /* Busy instances are never reaped, however long the call. */
    int64_t t0 = util_mono_ms();
    while (util_mono_ms() - t0 < 200)
        reactor_run_once(f->r, 10);
    assert_int_equal(w1.got->state, POOL_READY);
    int64_t released = util_mono_ms();
    pool_release(w1.got);
    pool_release(w2.got);
    pool_release(w3.got);
    struct state_wait sw = {spawned[0], POOL_STOPPED};
    assert_true(run_until(f, inst_in, &sw, 2000));
    int64_t after = util_mono_ms() - released;
    assert_true(after >= 95 && after < 1000); /* within the TTL's precision */
    assert_string_equal(spawned[0]->stop_cause, "idle ttl expired");
    t0 = util_mono_ms();
    while (util_mono_ms() - t0 < 200)
        reactor_run_once(f->r, 10);
    assert_int_equal(spawned[1]->state, POOL_READY); /* keep_warm */
    assert_int_equal(spawned[2]->state, POOL_READY); /* negative TTL */
    /* A call after reaping starts a new instance. */
    struct tw w4;
    tw_init(&w4, 4);
    pool_acquire(n, &w4.w);
    assert_int_equal(n_spawned, 4);
    assert_int_equal(count_state(f, n, POOL_STOPPED), 1);
    pool_waiter_cancel(&w4.w);
}

static void test_call_racing_the_reaper(void **state)
{
    struct fx *f = *state;
    /* TTL 0: the idle timer is due on the next loop iteration after a release. */
    struct pool_node *n = add_node(f, "{\"id\":\"t\",\"command\":[\"x\"],\"idle_ttl_seconds\":0}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    pool_inst_mark_ready(spawned[0], 5000);
    pool_release(w1.got);
    /* A call arriving before the loop runs the reaper takes the instance: the reaper
     * then sees it busy and leaves it. */
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(w2.status, 200);
    assert_ptr_equal(w2.got, spawned[0]);
    for (int k = 0; k < 5; k++)
        reactor_run_once(f->r, 5);
    assert_int_equal(spawned[0]->state, POOL_READY);
    pool_release(w2.got);
    struct state_wait sw = {spawned[0], POOL_STOPPED};
    assert_true(run_until(f, inst_in, &sw, 1000));
    /* After the reaper won, a new call gets a new instance (tw_granted asserts READY). */
    struct tw w3;
    tw_init(&w3, 3);
    pool_acquire(n, &w3.w);
    assert_int_equal(w3.status, 0);
    assert_int_equal(n_spawned, 2);
    pool_inst_mark_ready(spawned[1], 5001);
    assert_ptr_equal(w3.got, spawned[1]);
}

static void test_crash_is_replaced_on_next_call(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"c\",\"command\":[\"x\"],\"keep_warm\":true}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    pool_inst_mark_ready(spawned[0], 5000);
    pool_release(w1.got);
    pool_inst_fail(spawned[0], "crashed (killed by signal 9 (Killed))");
    assert_int_equal(spawned[0]->state, POOL_ERROR);
    assert_string_equal(spawned[0]->error, "crashed (killed by signal 9 (Killed))");
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(n_spawned, 2);
    pool_inst_mark_ready(spawned[1], 5001);
    assert_ptr_equal(w2.got, spawned[1]);
}

static void test_replace_manifest_drains_old(void **state)
{
    struct fx *f = *state;
    struct pool_node *n =
        add_node(f, "{\"id\":\"m\",\"command\":[\"x\"],\"max_instances\":3,\"max_concurrency\":1}");
    struct tw w1, w2, w3;
    tw_init(&w1, 1);
    tw_init(&w2, 2);
    pool_acquire(n, &w1.w);
    pool_acquire(n, &w2.w);
    pool_inst_mark_ready(spawned[0], 5000);
    pool_inst_mark_ready(spawned[1], 5001);
    pool_release(w2.got); /* spawned[1] idle, spawned[0] busy */
    struct pool_node *n2 = add_node(
        f, "{\"id\":\"m\",\"command\":[\"y\"],\"max_instances\":3,\"max_concurrency\":1}");
    assert_ptr_equal(n, n2);
    assert_int_equal(spawned[1]->state, POOL_STOPPED); /* idle old: stopped now */
    assert_int_equal(spawned[0]->state, POOL_READY);   /* busy old: drains */
    tw_init(&w3, 3);
    pool_acquire(n, &w3.w);
    assert_int_equal(w3.status, 0); /* not on the old version */
    assert_int_equal(n_spawned, 3);
    assert_string_equal(spawned[2]->m->argv[0], "y");
    pool_release(w1.got);
    assert_int_equal(spawned[0]->state, POOL_STOPPED);
    pool_inst_mark_ready(spawned[2], 5002);
    assert_ptr_equal(w3.got, spawned[2]);
}

static int deleted_calls;
static void on_deleted(void *arg)
{
    deleted_calls++;
}

static void test_delete_fails_queue_and_stops_instances(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"del\",\"command\":[\"x\"]}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    tw_init(&w2, 2);
    pool_acquire(n, &w1.w);
    pool_acquire(n, &w2.w);
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w1.status, 200);
    deleted_calls = 0;
    pool_node_delete(n, on_deleted, NULL);
    assert_int_equal(w2.status, 404);
    assert_null(pool_node_find(f->p, "del"));
    assert_int_equal(deleted_calls, 1); /* no process: stopped at once */
    assert_int_equal(spawned[0]->state, POOL_STOPPED);
    pool_release(w1.got); /* a late release on a deleted node is harmless */
}

static void test_records_in_store(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"rec\",\"command\":[\"x\"]}");
    struct tw w1;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    pool_inst_mark_ready(spawned[0], 5000);
    pool_release(w1.got);
    pool_inst_stop(spawned[0], "stopped by admin");
    json_t *rec = pool_store_instance_json(f->p->store, spawned[0]->id);
    assert_non_null(rec);
    assert_string_equal(json_string_value(json_object_get(rec, "state")), "stopped");
    json_t *tr = json_object_get(rec, "transitions");
    assert_int_equal(json_array_size(tr), 4);
    static const char *const to[] = {"starting", "ready", "stopping", "stopped"};
    for (size_t k = 0; k < 4; k++) {
        json_t *t = json_array_get(tr, k);
        assert_string_equal(json_string_value(json_object_get(t, "to")), to[k]);
        assert_true(json_integer_value(json_object_get(t, "at_ms")) > 0);
    }
    assert_string_equal(json_string_value(json_object_get(json_array_get(tr, 3), "cause")),
                        "stopped by admin");
    json_decref(rec);
}

static void test_shutdown_fails_waiters(void **state)
{
    struct fx *f = *state;
    struct pool_node *n = add_node(f, "{\"id\":\"s\",\"command\":[\"x\"]}");
    struct tw w1, w2;
    tw_init(&w1, 1);
    pool_acquire(n, &w1.w);
    pool_shutdown(f->p, NULL, NULL);
    assert_int_equal(w1.status, 503);
    assert_int_equal(spawned[0]->state, POOL_STOPPED);
    tw_init(&w2, 2);
    pool_acquire(n, &w2.w);
    assert_int_equal(w2.status, 503);
    assert_non_null(strstr(w2.msg, "shutting down"));
}

/* Only the newest POOL_KEEP_ENDED ended instances stay in memory: trimming walks from
 * the oldest (the list's tail) and skips live ones, so what is left is the newest ended
 * ones, newest first, plus an older live instance. */
static void test_trims_oldest_ended_first(void **state)
{
    struct fx *f = *state;
    struct pool_node *warm = add_node(f, "{\"id\":\"w\",\"command\":[\"x\"],\"keep_warm\":true}");
    struct tw w0;
    tw_init(&w0, 0);
    pool_acquire(warm, &w0.w);
    pool_inst_mark_ready(spawned[0], 5000);
    assert_int_equal(w0.status, 200);
    pool_release(w0.got); /* ready and idle: live, the oldest instance */

    struct pool_node *n = add_node(f, "{\"id\":\"e\",\"command\":[\"x\"]}");
    enum { EXTRA = 5 };
    const int total = POOL_KEEP_ENDED + EXTRA;
    assert_true(1 + total <= MAX_SPAWNED);
    for (int k = 0; k < total; k++) {
        struct tw w;
        tw_init(&w, k + 1);
        fail_spawns = 1; /* each call's instance fails to start: ended at once */
        pool_acquire(n, &w.w);
        assert_int_equal(w.status, 503);
    }
    assert_int_equal(n_spawned, 1 + total);
    assert_int_equal(f->p->n_ended, POOL_KEEP_ENDED);
    /* Newest first: spawned[total], ..., spawned[1 + EXTRA], then the warm one. */
    int idx = total;
    struct list_head *pos;
    list_for_each(pos, &f->p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (idx > EXTRA)
            assert_ptr_equal(i, spawned[idx--]);
        else
            assert_ptr_equal(i, spawned[0]);
    }
    assert_int_equal(idx, EXTRA);
    assert_int_equal(list_count(&f->p->insts), POOL_KEEP_ENDED + 1);
    assert_int_equal(spawned[0]->state, POOL_READY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cold_start_then_warm_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrency_cap_and_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_starts_up_to_max_instances, setup, teardown),
        cmocka_unit_test_setup_teardown(test_starting_capacity_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_timeout_503, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_timeout_zero_fails_at_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancelled_waiter_is_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sync_start_failure_fails_waiters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ready_timeout_fails_all_when_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_start_failure_with_others_fails_only_its_share, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_idle_reaping_and_keep_warm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_racing_the_reaper, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crash_is_replaced_on_next_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replace_manifest_drains_old, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete_fails_queue_and_stops_instances, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_records_in_store, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_fails_waiters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_trims_oldest_ended_first, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
