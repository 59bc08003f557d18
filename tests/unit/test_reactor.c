/* Unit tests for the reactor: fd watches, timers, the cross-thread inbox, stop, signals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/reactor.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEADLINE_MS 5000

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Run iterations until *flag or the deadline; returns whether flag became true. */
static bool run_until(struct reactor *r, const bool *flag, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (!*flag && util_mono_ms() < deadline)
        assert_true(reactor_run_once(r, 20) >= 0);
    return *flag;
}

static int setup(void **state)
{
    struct reactor *r = reactor_new();
    if (!r)
        return -1;
    *state = r;
    return 0;
}

static int teardown(void **state)
{
    reactor_free(*state);
    return 0;
}

/* ---- fd watches ---------------------------------------------------------------- */

struct fd_rec {
    int calls;
    int fd;
    uint32_t events;
    void *arg;
};

static void rec_cb(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct fd_rec *rec = arg;
    rec->calls++;
    rec->fd = fd;
    rec->events = events;
    rec->arg = arg;
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
}

static void test_fd_delivery(void **state)
{
    struct reactor *r = *state;
    int p[2];
    assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    struct fd_rec rec = {0};
    assert_int_equal(reactor_add_fd(r, p[0], EPOLLIN, rec_cb, &rec), 0);
    assert_true(reactor_has_fd(r, p[0]));
    assert_int_equal(reactor_add_fd(r, p[0], EPOLLIN, rec_cb, &rec), -EEXIST);

    /* Nothing readable: no call. */
    assert_int_equal(reactor_run_once(r, 0), 0);
    assert_int_equal(rec.calls, 0);

    assert_int_equal(write(p[1], "x", 1), 1);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_int_equal(rec.calls, 1);
    assert_int_equal(rec.fd, p[0]);
    assert_true(rec.events & EPOLLIN);
    assert_ptr_equal(rec.arg, &rec);

    /* Drained: level-triggered, so no further call. */
    assert_int_equal(reactor_run_once(r, 0), 0);
    assert_int_equal(rec.calls, 1);

    /* mod_fd: watch the write end for EPOLLOUT, then switch it off. */
    struct fd_rec wrec = {0};
    assert_int_equal(reactor_add_fd(r, p[1], 0, rec_cb, &wrec), 0);
    assert_int_equal(reactor_run_once(r, 0), 0);
    assert_int_equal(reactor_mod_fd(r, p[1], EPOLLOUT), 0);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_int_equal(wrec.calls, 1);
    assert_true(wrec.events & EPOLLOUT);
    assert_int_equal(reactor_mod_fd(r, p[1], 0), 0);
    assert_int_equal(reactor_run_once(r, 0), 0);
    assert_int_equal(wrec.calls, 1);

    /* Writer closed: EPOLLHUP is reported. */
    assert_int_equal(reactor_del_fd(r, p[1]), 0);
    close(p[1]);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_true(rec.events & EPOLLHUP);

    assert_int_equal(reactor_del_fd(r, p[0]), 0);
    assert_false(reactor_has_fd(r, p[0]));
    assert_int_equal(reactor_del_fd(r, p[0]), -ENOENT);
    assert_int_equal(reactor_mod_fd(r, p[0], EPOLLIN), -ENOENT);
    assert_int_equal(reactor_add_fd(r, -1, EPOLLIN, rec_cb, &rec), -EINVAL);
    close(p[0]);
}

/* Two fds readable in the same batch; whichever callback runs first deletes both watches
 * (and closes/reuses the other's fd number): the second must never be called. */
struct del_ctx {
    int a[2], b[2];
    int calls;
    struct fd_rec reused;
};

static void del_both_cb(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct del_ctx *c = arg;
    c->calls++;
    int other = fd == c->a[0] ? c->b[0] : c->a[0];
    assert_int_equal(reactor_del_fd(r, fd), 0);    /* itself */
    assert_int_equal(reactor_del_fd(r, other), 0); /* its peer, pending in this batch */
    /* Reuse the peer's fd number for a new watch at once: the stale event of the batch
     * must not reach the new watch either. */
    close(other);
    int np[2];
    assert_int_equal(pipe2(np, O_NONBLOCK | O_CLOEXEC), 0);
    if (np[0] != other) {
        assert_int_equal(dup3(np[0], other, O_CLOEXEC), other);
        close(np[0]);
    }
    assert_int_equal(reactor_add_fd(r, other, EPOLLIN, rec_cb, &c->reused), 0);
    close(np[1]);
}

static void test_fd_del_inside_callback(void **state)
{
    struct reactor *r = *state;
    struct del_ctx c = {0};
    assert_int_equal(pipe2(c.a, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(pipe2(c.b, O_NONBLOCK | O_CLOEXEC), 0);
    int aw = c.a[1], bw = c.b[1];
    assert_int_equal(reactor_add_fd(r, c.a[0], EPOLLIN, del_both_cb, &c), 0);
    assert_int_equal(reactor_add_fd(r, c.b[0], EPOLLIN, del_both_cb, &c), 0);
    assert_int_equal(write(aw, "a", 1), 1);
    assert_int_equal(write(bw, "b", 1), 1);
    /* Both are ready before the wait: one epoll batch holds both events. */
    int n = reactor_run_once(r, 1000);
    assert_int_equal(n, 2);
    assert_int_equal(c.calls, 1);
    /* The replacement watch is on a fresh pipe whose writer is closed: it gets HUP in a
     * later iteration, not the stale "readable" of the old pipe in the same batch. */
    assert_int_equal(c.reused.calls, 0);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_int_equal(c.reused.calls, 1);
    assert_true(c.reused.events & EPOLLHUP);

    int reused_fd = c.reused.fd;
    assert_int_equal(reactor_del_fd(r, reused_fd), 0);
    close(reused_fd);
    /* The deleter's own read end is still open (only unwatched). */
    int own = reused_fd == c.a[0] ? c.b[0] : c.a[0];
    close(own);
    close(aw);
    close(bw);
}

/* ---- timers -------------------------------------------------------------------- */

struct order {
    int seq[64];
    int n;
};

struct tagged {
    struct reactor_timer t;
    struct order *ord;
    int tag;
    int fired;
};

static void tagged_cb(struct reactor *r, void *arg)
{
    struct tagged *tg = arg;
    tg->fired++;
    if (tg->ord->n < 64)
        tg->ord->seq[tg->ord->n++] = tg->tag;
}

static void test_timer_order_oneshot(void **state)
{
    struct reactor *r = *state;
    struct order ord = {0};
    struct tagged t[3];
    int64_t delays[3] = {60, 20, 40};
    for (int i = 0; i < 3; i++) {
        t[i] = (struct tagged){.ord = &ord, .tag = i};
        reactor_timer_init(&t[i].t, tagged_cb, &t[i]);
        assert_false(reactor_timer_active(&t[i].t));
        reactor_timer_start(r, &t[i].t, delays[i], 0);
        assert_true(reactor_timer_active(&t[i].t));
    }
    int64_t start = util_mono_ms();
    while (ord.n < 3 && util_mono_ms() - start < DEADLINE_MS)
        assert_true(reactor_run_once(r, 100) >= 0);
    assert_int_equal(ord.n, 3);
    assert_int_equal(ord.seq[0], 1);
    assert_int_equal(ord.seq[1], 2);
    assert_int_equal(ord.seq[2], 0);
    assert_true(util_mono_ms() - start >= 55);
    /* One-shot: inactive after firing, and never fires again. */
    for (int i = 0; i < 3; i++)
        assert_false(reactor_timer_active(&t[i].t));
    assert_true(reactor_run_once(r, 80) >= 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(t[i].fired, 1);
    /* reactor_now follows the loop. */
    assert_true(reactor_now(r) >= start + 55);
}

static void test_timer_periodic_and_stop(void **state)
{
    struct reactor *r = *state;
    struct order ord = {0};
    struct tagged per = {.ord = &ord, .tag = 7};
    reactor_timer_init(&per.t, tagged_cb, &per);
    int64_t start = util_mono_ms();
    reactor_timer_start(r, &per.t, 10, 10);
    while (per.fired < 5 && util_mono_ms() - start < DEADLINE_MS)
        assert_true(reactor_run_once(r, 100) >= 0);
    assert_int_equal(per.fired, 5);
    assert_true(util_mono_ms() - start >= 45);
    assert_true(reactor_timer_active(&per.t)); /* periodic stays armed */
    reactor_timer_stop(r, &per.t);
    reactor_timer_stop(r, &per.t); /* idempotent */
    assert_false(reactor_timer_active(&per.t));
    assert_int_equal(reactor_run_once(r, 60), 0);
    assert_int_equal(per.fired, 5);

    /* A stopped timer never fires. */
    struct tagged never = {.ord = &ord, .tag = 8};
    reactor_timer_init(&never.t, tagged_cb, &never);
    reactor_timer_start(r, &never.t, 5, 0);
    reactor_timer_stop(r, &never.t);
    assert_int_equal(reactor_run_once(r, 40), 0);
    assert_int_equal(never.fired, 0);
}

static void test_timer_restart(void **state)
{
    struct reactor *r = *state;
    struct order ord = {0};
    struct tagged t = {.ord = &ord, .tag = 1};
    reactor_timer_init(&t.t, tagged_cb, &t);
    int64_t start = util_mono_ms();
    reactor_timer_start(r, &t.t, 20, 0);
    reactor_timer_start(r, &t.t, 150, 0); /* reschedules, does not add a second expiry */
    while (t.fired == 0 && util_mono_ms() - start < DEADLINE_MS)
        assert_true(reactor_run_once(r, 100) >= 0);
    assert_int_equal(t.fired, 1);
    assert_true(util_mono_ms() - start >= 145);
    assert_true(reactor_run_once(r, 50) >= 0);
    assert_int_equal(t.fired, 1);

    /* Restart to an earlier time. */
    start = util_mono_ms();
    reactor_timer_start(r, &t.t, 1000, 0);
    reactor_timer_start(r, &t.t, 10, 0);
    while (t.fired == 1 && util_mono_ms() - start < DEADLINE_MS)
        assert_true(reactor_run_once(r, 100) >= 0);
    assert_int_equal(t.fired, 2);
    assert_true(util_mono_ms() - start < 900);
}

struct selfstop {
    struct reactor_timer t;
    int fired;
    int stop_after;
    bool restart_zero;
    bool free_self;
    bool *freed;
};

static void selfstop_cb(struct reactor *r, void *arg)
{
    struct selfstop *s = arg;
    s->fired++;
    if (s->restart_zero) {
        reactor_timer_start(r, &s->t, 0, 0);
        return;
    }
    if (s->fired >= s->stop_after) {
        reactor_timer_stop(r, &s->t);
        if (s->free_self) {
            *s->freed = true;
            free(s);
        }
    }
}

static void test_timer_stop_from_own_callback(void **state)
{
    struct reactor *r = *state;
    struct selfstop s = {.stop_after = 3};
    reactor_timer_init(&s.t, selfstop_cb, &s);
    reactor_timer_start(r, &s.t, 5, 5);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (reactor_timer_active(&s.t) && util_mono_ms() < deadline)
        assert_true(reactor_run_once(r, 50) >= 0);
    assert_false(reactor_timer_active(&s.t));
    assert_int_equal(s.fired, 3);
    assert_int_equal(reactor_run_once(r, 30), 0);
    assert_int_equal(s.fired, 3);

    /* Stop and free the holder from inside its own callback (ASan checks the rest). */
    bool freed = false;
    struct selfstop *h = xcalloc(1, sizeof(*h));
    h->stop_after = 2;
    h->free_self = true;
    h->freed = &freed;
    reactor_timer_init(&h->t, selfstop_cb, h);
    reactor_timer_start(r, &h->t, 1, 1);
    assert_true(run_until(r, &freed, DEADLINE_MS));
    assert_true(reactor_run_once(r, 20) >= 0);
}

/* A timer restarting itself with delay 0 runs again in the next iteration — exactly
 * once per iteration, not in a tight loop inside the same one — and the loop does not
 * sleep in between. */
static void test_timer_restart_zero_from_callback(void **state)
{
    struct reactor *r = *state;
    struct selfstop s = {.restart_zero = true};
    reactor_timer_init(&s.t, selfstop_cb, &s);
    reactor_timer_start(r, &s.t, 0, 0);
    int64_t t0 = util_mono_ms();
    for (int i = 1; i <= 50; i++) {
        assert_true(reactor_run_once(r, 1000) >= 0);
        assert_int_equal(s.fired, i);
    }
    assert_true(util_mono_ms() - t0 < 500); /* 50 iterations, none waited for the timeout */
    assert_true(reactor_timer_active(&s.t)); /* still rescheduling itself */
    reactor_timer_stop(r, &s.t);
    assert_int_equal(reactor_run_once(r, 20), 0);
    assert_int_equal(s.fired, 50);
}

/* A zero-delay timer started from an fd callback fires in that same iteration; timers
 * due at the same millisecond fire in the order they were started. */
struct zero_from_fd {
    struct order ord;
    struct tagged t[3];
};

static void start_three_cb(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct zero_from_fd *z = arg;
    char buf[8];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    for (int i = 0; i < 3; i++)
        reactor_timer_start(r, &z->t[i].t, 0, 0);
}

static void test_timer_zero_from_fd_same_iteration(void **state)
{
    struct reactor *r = *state;
    struct zero_from_fd z = {0};
    for (int i = 0; i < 3; i++) {
        z.t[i] = (struct tagged){.ord = &z.ord, .tag = i};
        reactor_timer_init(&z.t[i].t, tagged_cb, &z.t[i]);
    }
    int p[2];
    assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(reactor_add_fd(r, p[0], EPOLLIN, start_three_cb, &z), 0);
    assert_int_equal(write(p[1], "x", 1), 1);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_int_equal(z.ord.n, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(z.ord.seq[i], i);
    reactor_del_fd(r, p[0]);
    close(p[0]);
    close(p[1]);
}

/* With a timer armed, reactor_run_once waits until it is due (not the whole timeout,
 * not less); with nothing armed it waits the whole timeout. */
static void test_timer_bounds_wait(void **state)
{
    struct reactor *r = *state;
    struct order ord = {0};
    struct tagged t = {.ord = &ord, .tag = 1};
    reactor_timer_init(&t.t, tagged_cb, &t);
    int64_t t0 = util_mono_ms();
    reactor_timer_start(r, &t.t, 40, 0);
    while (t.fired == 0 && util_mono_ms() - t0 < DEADLINE_MS)
        assert_true(reactor_run_once(r, 5000) >= 0);
    int64_t el = util_mono_ms() - t0;
    assert_int_equal(t.fired, 1);
    assert_true(el >= 40);
    assert_true(el < 2000);
}

/* ---- deferred callbacks -------------------------------------------------------- */

struct dtest {
    struct reactor_deferred d;
    int runs;
    int requeue;                    /* re-queue itself this many times */
    struct reactor_deferred *cancel; /* cancel this one when run */
    bool free_self;
    bool *freed;
    int *order;
    int *norder;
    int tag;
};

static void dtest_cb(struct reactor *r, void *arg)
{
    struct dtest *t = arg;
    t->runs++;
    if (t->order)
        t->order[(*t->norder)++] = t->tag;
    if (t->cancel)
        reactor_defer_cancel(r, t->cancel);
    if (t->requeue > 0) {
        t->requeue--;
        reactor_defer(r, &t->d);
        assert_true(reactor_deferred_pending(&t->d));
    }
    if (t->free_self) {
        *t->freed = true;
        free(t);
    }
}

static void defer_from_fd_cb(struct reactor *r, int fd, uint32_t events, void *arg)
{
    char buf[8];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    reactor_defer(r, arg);
}

/* Queued from an fd callback: runs at the end of that same iteration, once even if
 * queued twice. */
static void test_deferred_same_iteration(void **state)
{
    struct reactor *r = *state;
    struct dtest t = {0};
    reactor_deferred_init(&t.d, dtest_cb, &t);
    assert_false(reactor_deferred_pending(&t.d));
    int p[2];
    assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(reactor_add_fd(r, p[0], EPOLLIN, defer_from_fd_cb, &t.d), 0);
    assert_int_equal(write(p[1], "x", 1), 1);
    assert_int_equal(reactor_run_once(r, 1000), 1);
    assert_int_equal(t.runs, 1);
    assert_false(reactor_deferred_pending(&t.d));

    /* Queued twice from outside the loop: one run, in the next iteration, which does
     * not wait for I/O. */
    reactor_defer(r, &t.d);
    reactor_defer(r, &t.d);
    int64_t t0 = util_mono_ms();
    assert_int_equal(reactor_run_once(r, 2000), 0);
    assert_true(util_mono_ms() - t0 < 1000);
    assert_int_equal(t.runs, 2);
    assert_int_equal(reactor_run_once(r, 20), 0);
    assert_int_equal(t.runs, 2);
    reactor_del_fd(r, p[0]);
    close(p[0]);
    close(p[1]);
}

/* A callback re-queueing itself runs once per iteration, and each of those iterations
 * still polls I/O (a pipe written meanwhile is served while the chain goes on). */
static void test_deferred_requeue_next_iteration(void **state)
{
    struct reactor *r = *state;
    struct dtest t = {.requeue = 5};
    reactor_deferred_init(&t.d, dtest_cb, &t);
    reactor_defer(r, &t.d);
    int p[2];
    assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
    struct fd_rec rec = {0};
    assert_int_equal(reactor_add_fd(r, p[0], EPOLLIN, rec_cb, &rec), 0);
    for (int i = 1; i <= 6; i++) {
        if (i == 3)
            assert_int_equal(write(p[1], "x", 1), 1);
        assert_true(reactor_run_once(r, 2000) >= 0);
        assert_int_equal(t.runs, i);
        if (i >= 3)
            assert_int_equal(rec.calls, 1);
    }
    assert_false(reactor_deferred_pending(&t.d));
    assert_int_equal(reactor_run_once(r, 20), 0);
    assert_int_equal(t.runs, 6);
    reactor_del_fd(r, p[0]);
    close(p[0]);
    close(p[1]);
}

/* Run in queue order; one callback cancels another queued for the same pass; cancel is
 * idempotent; a callback may free its holder; a cancelled one can be queued again. */
static void test_deferred_cancel_and_free(void **state)
{
    struct reactor *r = *state;
    int order[8], n = 0;
    struct dtest a = {.tag = 1, .order = order, .norder = &n};
    struct dtest b = {.tag = 2, .order = order, .norder = &n};
    struct dtest c = {.tag = 3, .order = order, .norder = &n};
    reactor_deferred_init(&a.d, dtest_cb, &a);
    reactor_deferred_init(&b.d, dtest_cb, &b);
    reactor_deferred_init(&c.d, dtest_cb, &c);
    a.cancel = &c.d;
    bool freed = false;
    struct dtest *h = xcalloc(1, sizeof(*h));
    h->free_self = true;
    h->freed = &freed;
    reactor_deferred_init(&h->d, dtest_cb, h);
    reactor_defer(r, &a.d);
    reactor_defer(r, &b.d);
    reactor_defer(r, &c.d);
    reactor_defer(r, &h->d);
    reactor_defer_cancel(r, &b.d);
    reactor_defer_cancel(r, &b.d);
    assert_false(reactor_deferred_pending(&b.d));
    assert_int_equal(reactor_run_once(r, 1000), 0);
    assert_int_equal(n, 1);
    assert_int_equal(order[0], 1);
    assert_int_equal(b.runs + c.runs, 0);
    assert_true(freed);
    a.cancel = NULL;
    reactor_defer(r, &c.d);
    reactor_defer(r, &a.d);
    assert_int_equal(reactor_run_once(r, 1000), 0);
    assert_int_equal(n, 3);
    assert_int_equal(order[1], 3);
    assert_int_equal(order[2], 1);

    /* Still queued when its reactor is freed: forgotten (not run), left unqueued. */
    struct reactor *r2 = reactor_new();
    assert_non_null(r2);
    reactor_defer(r2, &b.d);
    reactor_free(r2);
    assert_false(reactor_deferred_pending(&b.d));
    assert_int_equal(b.runs, 0);
}

/* One timer's callback stops another one due in the same batch. */
struct killer {
    struct reactor_timer t;
    struct tagged *victim;
};

static void killer_cb(struct reactor *r, void *arg)
{
    struct killer *k = arg;
    reactor_timer_stop(r, &k->victim->t);
}

static void test_timer_stop_other_in_batch(void **state)
{
    struct reactor *r = *state;
    struct order ord = {0};
    struct tagged victim = {.ord = &ord, .tag = 1};
    struct killer k = {.victim = &victim};
    reactor_timer_init(&victim.t, tagged_cb, &victim);
    reactor_timer_init(&k.t, killer_cb, &k);
    /* The killer is due strictly earlier; both are due when the loop looks, so they
     * are in the same batch. */
    reactor_timer_start(r, &k.t, 5, 0);
    reactor_timer_start(r, &victim.t, 15, 0);
    sleep_ms(25);
    assert_true(reactor_run_once(r, 100) >= 0);
    assert_true(reactor_run_once(r, 30) >= 0);
    assert_int_equal(victim.fired, 0);
    assert_false(reactor_timer_active(&victim.t));
}

#define MANY 2000

struct many {
    struct reactor_timer t;
    int64_t due;
    int fired;
    int64_t *last_due;
    int *order_violations;
    int *total;
};

static void many_cb(struct reactor *r, void *arg)
{
    struct many *m = arg;
    m->fired++;
    (*m->total)++;
    if (m->due < *m->last_due)
        (*m->order_violations)++;
    *m->last_due = m->due;
}

static void test_many_timers(void **state)
{
    struct reactor *r = *state;
    struct many *ms = xcalloc(MANY, sizeof(*ms));
    int64_t last_due = 0;
    int violations = 0, total = 0;
    srand(12345);
    int64_t base = util_mono_ms();
    for (int i = 0; i < MANY; i++) {
        ms[i].last_due = &last_due;
        ms[i].order_violations = &violations;
        ms[i].total = &total;
        reactor_timer_init(&ms[i].t, many_cb, &ms[i]);
        int64_t d = rand() % 200;
        reactor_timer_start(r, &ms[i].t, d, 0);
        ms[i].due = ms[i].t.due_ms;
    }
    /* Stop every 10th before it fires. */
    int stopped = 0;
    for (int i = 0; i < MANY; i += 10) {
        reactor_timer_stop(r, &ms[i].t);
        stopped++;
    }
    int64_t deadline = base + DEADLINE_MS;
    while (total < MANY - stopped && util_mono_ms() < deadline)
        assert_true(reactor_run_once(r, 50) >= 0);
    assert_int_equal(total, MANY - stopped);
    assert_int_equal(violations, 0);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(ms[i].fired, i % 10 == 0 ? 0 : 1);
        assert_false(reactor_timer_active(&ms[i].t));
    }
    free(ms);
}

/* ---- run_once timeout ---------------------------------------------------------- */

static void test_run_once_timeout(void **state)
{
    struct reactor *r = *state;
    int64_t t0 = util_mono_ms();
    assert_int_equal(reactor_run_once(r, 60), 0);
    int64_t el = util_mono_ms() - t0;
    assert_true(el >= 55);
    assert_true(el < 2000);
    t0 = util_mono_ms();
    assert_int_equal(reactor_run_once(r, 0), 0);
    assert_true(util_mono_ms() - t0 < 50);
}

/* ---- inbox and stop from other threads ----------------------------------------- */

#define NPOST 1000

struct post_ctx {
    struct reactor *r;
    pthread_t loop_thread;
    int next;
    int ran;
    bool in_order;
    bool on_loop_thread;
    int vals[NPOST];
};

struct post_item {
    struct post_ctx *c;
    int v;
};

static void post_task(void *arg)
{
    struct post_item *it = arg;
    struct post_ctx *c = it->c;
    if (it->v != c->next)
        c->in_order = false;
    c->next = it->v + 1;
    if (!pthread_equal(pthread_self(), c->loop_thread))
        c->on_loop_thread = false;
    c->ran++;
    if (c->ran == NPOST)
        reactor_stop(c->r);
}

static void *poster(void *arg)
{
    struct post_ctx *c = arg;
    static struct post_item items[NPOST];
    for (int i = 0; i < NPOST; i++) {
        items[i] = (struct post_item){.c = c, .v = i};
        if (reactor_post(c->r, post_task, &items[i]) != 0)
            return NULL;
        if (i % 100 == 0)
            sleep_ms(1);
    }
    return NULL;
}

static void test_post_from_thread(void **state)
{
    struct reactor *r = *state;
    struct post_ctx c = {
        .r = r, .loop_thread = pthread_self(), .in_order = true, .on_loop_thread = true};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, poster, &c), 0);
    pthread_join(th, NULL);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (c.ran < NPOST && util_mono_ms() < deadline)
        assert_true(reactor_run_once(r, 50) >= 0);
    assert_int_equal(c.ran, NPOST);
    assert_true(c.in_order);
    assert_true(c.on_loop_thread);
}

static void count_task(void *arg)
{
    (*(int *)arg)++;
}

static void test_post_runs_on_free(void **state)
{
    (void)state;
    struct reactor *r2 = reactor_new();
    assert_non_null(r2);
    int n = 0;
    assert_int_equal(reactor_post(r2, count_task, &n), 0);
    assert_int_equal(reactor_post(r2, count_task, &n), 0);
    reactor_free(r2);
    assert_int_equal(n, 2);
}

struct stopper {
    struct reactor *r;
    int delay_ms;
};

static void *stopper_thread(void *arg)
{
    struct stopper *s = arg;
    sleep_ms(s->delay_ms);
    reactor_stop(s->r);
    return NULL;
}

static void watchdog_cb(struct reactor *r, void *arg)
{
    *(bool *)arg = true;
    reactor_stop(r);
}

static void test_stop_from_thread(void **state)
{
    struct reactor *r = *state;
    bool watchdog = false;
    struct reactor_timer wd;
    reactor_timer_init(&wd, watchdog_cb, &watchdog);
    reactor_timer_start(r, &wd, DEADLINE_MS, 0);
    struct stopper s = {.r = r, .delay_ms = 50};
    pthread_t th;
    int64_t t0 = util_mono_ms();
    assert_int_equal(pthread_create(&th, NULL, stopper_thread, &s), 0);
    assert_int_equal(reactor_run(r), 0);
    pthread_join(th, NULL);
    assert_false(watchdog);
    assert_true(util_mono_ms() - t0 >= 45);

    /* The loop can run again after a stop. */
    s.delay_ms = 20;
    assert_int_equal(pthread_create(&th, NULL, stopper_thread, &s), 0);
    assert_int_equal(reactor_run(r), 0);
    pthread_join(th, NULL);
    assert_false(watchdog);

    /* A stop that lands before reactor_run() starts is not lost. */
    reactor_stop(r);
    assert_int_equal(reactor_run(r), 0);
    assert_false(watchdog);
    reactor_timer_stop(r, &wd);
}

/* ---- signals ------------------------------------------------------------------- */

struct sig_rec {
    int signo[8];
    int n;
    bool got;
};

static void sig_cb(struct reactor *r, int signo, void *arg)
{
    struct sig_rec *s = arg;
    if (s->n < 8)
        s->signo[s->n++] = signo;
    s->got = true;
}

static void test_signals(void **state)
{
    struct reactor *r = *state;
    struct sig_rec rec = {0};
    int sigs[] = {SIGUSR1, SIGUSR2};
    assert_int_equal(reactor_watch_signals(r, sigs, 2, sig_cb, &rec), 0);
    assert_int_equal(reactor_watch_signals(r, sigs, 2, sig_cb, &rec), -EEXIST);
    sigset_t cur;
    assert_int_equal(pthread_sigmask(SIG_BLOCK, NULL, &cur), 0);
    assert_true(sigismember(&cur, SIGUSR1));
    assert_true(sigismember(&cur, SIGUSR2));

    assert_int_equal(raise(SIGUSR1), 0);
    assert_true(run_until(r, &rec.got, DEADLINE_MS));
    assert_int_equal(rec.n, 1);
    assert_int_equal(rec.signo[0], SIGUSR1);

    rec.got = false;
    assert_int_equal(kill(getpid(), SIGUSR2), 0);
    assert_true(run_until(r, &rec.got, DEADLINE_MS));
    assert_int_equal(rec.signo[rec.n - 1], SIGUSR2);

    /* Leave the process as we found it. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_fd_delivery, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_del_inside_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_order_oneshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_periodic_and_stop, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_stop_from_own_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_restart_zero_from_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_zero_from_fd_same_iteration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_bounds_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timer_stop_other_in_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_timers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_run_once_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_same_iteration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_requeue_next_iteration, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deferred_cancel_and_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_from_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_post_runs_on_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_from_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_signals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
