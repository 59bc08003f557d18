#include "common/reactor.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define MAX_EVENTS 128

struct fd_watch {
    int fd;
    uint32_t events;
    reactor_fd_cb cb;
    void *arg;
    bool dead; /* deleted during dispatch; freed after the batch */
    struct fd_watch *next_dead;
};

struct task {
    reactor_task_fn fn;
    void *arg;
    struct task *next;
};

struct reactor {
    int epfd;
    int timerfd;
    int eventfd;
    int sigfd;
    reactor_signal_cb sig_cb;
    void *sig_arg;
    _Atomic bool stopping;
    int64_t now_ms;

    struct fd_watch **watches; /* indexed by fd */
    size_t nwatches;
    struct fd_watch *dead_list;

    struct reactor_timer **heap;
    size_t heap_len, heap_cap;
    int64_t armed_due; /* what the timerfd is set to; INT64_MAX = disarmed */
    /* While run_due_timers() fires a batch: the batch's "now". A timer (re)started from a
     * callback is due no earlier than batch_now + 1, so a callback restarting its own
     * timer with delay 0 runs again next iteration, not 1024 times in this batch. */
    bool in_timer_batch;
    int64_t batch_now;
    /* A timer was pushed to batch_now + 1 by the rule above: the next batch runs as soon
     * as the loop comes round (its "now" is at least batch_now + 1), instead of sleeping
     * until the clock reaches the next millisecond. Without this every hand-off through
     * a zero-delay timer (httpd/httpc kicks) costs up to 1 ms of idle wait. */
    bool deferred;

    pthread_mutex_t inbox_lock;
    struct task *inbox_head, *inbox_tail;
};

/* Internal fds use watches too, with these callbacks. */
static void on_timerfd(struct reactor *r, int fd, uint32_t events, void *arg);
static void on_eventfd(struct reactor *r, int fd, uint32_t events, void *arg);
static void on_signalfd(struct reactor *r, int fd, uint32_t events, void *arg);

struct reactor *reactor_new(void)
{
    struct reactor *r = xcalloc(1, sizeof(*r));
    r->epfd = r->timerfd = r->eventfd = r->sigfd = -1;
    r->armed_due = INT64_MAX;
    pthread_mutex_init(&r->inbox_lock, NULL);
    r->now_ms = mono_ms();
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (r->epfd < 0)
        goto fail;
    r->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (r->timerfd < 0)
        goto fail;
    r->eventfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->eventfd < 0)
        goto fail;
    if (reactor_add_fd(r, r->timerfd, EPOLLIN, on_timerfd, NULL) != 0)
        goto fail;
    if (reactor_add_fd(r, r->eventfd, EPOLLIN, on_eventfd, NULL) != 0)
        goto fail;
    return r;
fail: {
    int saved = errno;
    reactor_free(r);
    errno = saved;
    return NULL;
}
}

static void run_inbox(struct reactor *r)
{
    for (;;) {
        pthread_mutex_lock(&r->inbox_lock);
        struct task *t = r->inbox_head;
        r->inbox_head = r->inbox_tail = NULL;
        pthread_mutex_unlock(&r->inbox_lock);
        if (!t)
            return;
        while (t) {
            struct task *next = t->next;
            t->fn(t->arg);
            free(t);
            t = next;
        }
    }
}

static void free_dead(struct reactor *r)
{
    while (r->dead_list) {
        struct fd_watch *w = r->dead_list;
        r->dead_list = w->next_dead;
        free(w);
    }
}

void reactor_free(struct reactor *r)
{
    if (!r)
        return;
    run_inbox(r);
    for (size_t i = 0; i < r->nwatches; i++)
        free(r->watches[i]);
    free(r->watches);
    free_dead(r);
    free(r->heap);
    if (r->epfd >= 0)
        close(r->epfd);
    if (r->timerfd >= 0)
        close(r->timerfd);
    if (r->eventfd >= 0)
        close(r->eventfd);
    if (r->sigfd >= 0)
        close(r->sigfd);
    pthread_mutex_destroy(&r->inbox_lock);
    free(r);
}

int64_t reactor_now(struct reactor *r)
{
    return r->now_ms;
}

/* ---- fd watches ---------------------------------------------------------------- */

int reactor_add_fd(struct reactor *r, int fd, uint32_t events, reactor_fd_cb cb, void *arg)
{
    if (fd < 0 || !cb)
        return -EINVAL;
    if ((size_t)fd < r->nwatches && r->watches[fd])
        return -EEXIST;
    if ((size_t)fd >= r->nwatches) {
        size_t n = r->nwatches ? r->nwatches : 64;
        while (n <= (size_t)fd)
            n *= 2;
        r->watches = xrealloc(r->watches, n * sizeof(*r->watches));
        memset(r->watches + r->nwatches, 0, (n - r->nwatches) * sizeof(*r->watches));
        r->nwatches = n;
    }
    struct fd_watch *w = xcalloc(1, sizeof(*w));
    w->fd = fd;
    w->events = events;
    w->cb = cb;
    w->arg = arg;
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        int rc = -errno;
        free(w);
        return rc;
    }
    r->watches[fd] = w;
    return 0;
}

int reactor_mod_fd(struct reactor *r, int fd, uint32_t events)
{
    if (fd < 0 || (size_t)fd >= r->nwatches || !r->watches[fd])
        return -ENOENT;
    struct fd_watch *w = r->watches[fd];
    if (w->events == events)
        return 0;
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(r->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
        return -errno;
    w->events = events;
    return 0;
}

int reactor_del_fd(struct reactor *r, int fd)
{
    if (fd < 0 || (size_t)fd >= r->nwatches || !r->watches[fd])
        return -ENOENT;
    struct fd_watch *w = r->watches[fd];
    /* The fd may already be closed by its owner: ignore EBADF/ENOENT here. */
    (void)epoll_ctl(r->epfd, EPOLL_CTL_DEL, fd, NULL);
    r->watches[fd] = NULL;
    w->dead = true;
    w->next_dead = r->dead_list;
    r->dead_list = w;
    return 0;
}

bool reactor_has_fd(struct reactor *r, int fd)
{
    return fd >= 0 && (size_t)fd < r->nwatches && r->watches[fd];
}

/* ---- timers: a binary min-heap on due time ------------------------------------- */

static bool earlier(const struct reactor_timer *a, const struct reactor_timer *b)
{
    return a->due_ms < b->due_ms;
}

static void heap_swap(struct reactor *r, size_t i, size_t j)
{
    struct reactor_timer *t = r->heap[i];
    r->heap[i] = r->heap[j];
    r->heap[j] = t;
    r->heap[i]->heap_index = i;
    r->heap[j]->heap_index = j;
}

static void heap_up(struct reactor *r, size_t i)
{
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!earlier(r->heap[i], r->heap[parent]))
            break;
        heap_swap(r, i, parent);
        i = parent;
    }
}

static void heap_down(struct reactor *r, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, rr = l + 1, m = i;
        if (l < r->heap_len && earlier(r->heap[l], r->heap[m]))
            m = l;
        if (rr < r->heap_len && earlier(r->heap[rr], r->heap[m]))
            m = rr;
        if (m == i)
            return;
        heap_swap(r, i, m);
        i = m;
    }
}

static void heap_remove(struct reactor *r, struct reactor_timer *t)
{
    size_t i = t->heap_index;
    size_t last = r->heap_len - 1;
    if (i != last)
        heap_swap(r, i, last);
    r->heap_len--;
    t->heap_index = SIZE_MAX;
    if (i < r->heap_len) {
        heap_up(r, i);
        heap_down(r, i);
    }
}

static void rearm_timerfd(struct reactor *r)
{
    int64_t due = r->heap_len ? r->heap[0]->due_ms : INT64_MAX;
    if (due == r->armed_due)
        return;
    /* Armed for earlier than needed (a timer was stopped or a later one started): let it
     * fire early — the batch finds nothing due and re-arms — rather than pay one
     * timerfd_settime per timer start/stop, which dominated a proxied request's CPU
     * profile. armed_due < 0 means "must re-arm" (the timerfd just expired); with no
     * timer left it is disarmed at once, so an idle loop gets no spurious wakeup. */
    if (r->armed_due >= 0 && due != INT64_MAX && due > r->armed_due)
        return;
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    if (due != INT64_MAX) {
        /* TFD_TIMER_ABSTIME with 0 would disarm: a due time in the past fires at once. */
        int64_t at = due > 0 ? due : 1;
        if (r->deferred && due <= r->batch_now + 1)
            at = 1; /* deferred from the last batch: fire on the next iteration */
        its.it_value.tv_sec = at / 1000;
        its.it_value.tv_nsec = (at % 1000) * 1000000L;
    }
    timerfd_settime(r->timerfd, TFD_TIMER_ABSTIME, &its, NULL);
    r->armed_due = due;
}

void reactor_timer_init(struct reactor_timer *t, reactor_timer_cb cb, void *arg)
{
    memset(t, 0, sizeof(*t));
    t->cb = cb;
    t->arg = arg;
    t->heap_index = SIZE_MAX;
}

bool reactor_timer_active(const struct reactor_timer *t)
{
    return t->heap_index != SIZE_MAX;
}

void reactor_timer_start(struct reactor *r, struct reactor_timer *t, int64_t delay_ms,
                         int64_t interval_ms)
{
    if (reactor_timer_active(t))
        heap_remove(r, t);
    if (delay_ms < 0)
        delay_ms = 0;
    t->due_ms = mono_ms() + delay_ms;
    if (r->in_timer_batch && t->due_ms <= r->batch_now) {
        t->due_ms = r->batch_now + 1;
        r->deferred = true;
    }
    t->interval_ms = interval_ms > 0 ? interval_ms : 0;
    if (r->heap_len == r->heap_cap) {
        r->heap_cap = r->heap_cap ? r->heap_cap * 2 : 16;
        r->heap = xrealloc(r->heap, r->heap_cap * sizeof(*r->heap));
    }
    t->heap_index = r->heap_len;
    r->heap[r->heap_len++] = t;
    heap_up(r, t->heap_index);
    rearm_timerfd(r);
}

void reactor_timer_stop(struct reactor *r, struct reactor_timer *t)
{
    if (!reactor_timer_active(t))
        return;
    heap_remove(r, t);
    rearm_timerfd(r);
}

static void run_due_timers(struct reactor *r)
{
    int64_t now = mono_ms();
    if (r->deferred) {
        /* Timers deferred by the previous batch are due now, even within the same ms. */
        r->deferred = false;
        if (now <= r->batch_now)
            now = r->batch_now + 1;
    }
    r->now_ms = now;
    bool nested = r->in_timer_batch;
    r->in_timer_batch = true;
    r->batch_now = now;
    /* Bound the batch so a 0-interval storm cannot starve I/O. */
    for (int fired = 0; r->heap_len && r->heap[0]->due_ms <= now && fired < 1024; fired++) {
        struct reactor_timer *t = r->heap[0];
        heap_remove(r, t);
        if (t->interval_ms > 0) {
            t->due_ms += t->interval_ms;
            if (t->due_ms <= now) /* we fell behind: skip missed ticks */
                t->due_ms = now + t->interval_ms;
            if (r->heap_len == r->heap_cap) {
                r->heap_cap = r->heap_cap ? r->heap_cap * 2 : 16;
                r->heap = xrealloc(r->heap, r->heap_cap * sizeof(*r->heap));
            }
            t->heap_index = r->heap_len;
            r->heap[r->heap_len++] = t;
            heap_up(r, t->heap_index);
        }
        t->cb(r, t->arg); /* may stop/restart/free t */
    }
    r->in_timer_batch = nested;
    r->armed_due = -1; /* force a rearm: the timerfd expired */
    rearm_timerfd(r);
}

static void on_timerfd(struct reactor *r, int fd, uint32_t events, void *arg)
{
    uint64_t expirations;
    while (read(fd, &expirations, sizeof(expirations)) > 0) {
    }
    run_due_timers(r);
}

/* ---- inbox --------------------------------------------------------------------- */

int reactor_post(struct reactor *r, reactor_task_fn fn, void *arg)
{
    struct task *t = malloc(sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->fn = fn;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&r->inbox_lock);
    if (r->inbox_tail)
        r->inbox_tail->next = t;
    else
        r->inbox_head = t;
    r->inbox_tail = t;
    pthread_mutex_unlock(&r->inbox_lock);
    uint64_t one = 1;
    if (write(r->eventfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        return -errno;
    return 0;
}

static void on_eventfd(struct reactor *r, int fd, uint32_t events, void *arg)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) > 0) {
    }
    run_inbox(r);
}

void reactor_stop(struct reactor *r)
{
    r->stopping = true;
    uint64_t one = 1;
    /* write(2) is async-signal-safe; EAGAIN means a wakeup is already pending. */
    (void)!write(r->eventfd, &one, sizeof(one));
}

/* ---- signals ------------------------------------------------------------------- */

int reactor_watch_signals(struct reactor *r, const int *signals, size_t n, reactor_signal_cb cb,
                          void *arg)
{
    if (r->sigfd >= 0)
        return -EEXIST;
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < n; i++)
        sigaddset(&set, signals[i]);
    if (pthread_sigmask(SIG_BLOCK, &set, NULL) != 0)
        return -EINVAL;
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    r->sigfd = fd;
    r->sig_cb = cb;
    r->sig_arg = arg;
    int rc = reactor_add_fd(r, fd, EPOLLIN, on_signalfd, NULL);
    if (rc) {
        close(fd);
        r->sigfd = -1;
    }
    return rc;
}

static void on_signalfd(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct signalfd_siginfo si;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (r->sig_cb)
            r->sig_cb(r, (int)si.ssi_signo, r->sig_arg);
    }
}

/* ---- loop ---------------------------------------------------------------------- */

int reactor_run_once(struct reactor *r, int timeout_ms)
{
    struct epoll_event events[MAX_EVENTS];
    int n = epoll_wait(r->epfd, events, MAX_EVENTS, timeout_ms);
    if (n < 0) {
        if (errno == EINTR)
            return 0;
        return -errno;
    }
    r->now_ms = mono_ms();
    for (int i = 0; i < n; i++) {
        struct fd_watch *w = events[i].data.ptr;
        if (w->dead)
            continue;
        w->cb(r, w->fd, events[i].events, w->arg);
    }
    free_dead(r);
    /* Timers already due run even if the timerfd event is in the next batch. */
    if (r->heap_len && r->heap[0]->due_ms <= mono_ms())
        run_due_timers(r);
    return n;
}

int reactor_run(struct reactor *r)
{
    /* The flag is cleared on the way out, not on entry: a reactor_stop() that lands
     * before the loop starts (a signal during startup, another thread racing ahead)
     * must still stop it. */
    int rc = 0;
    while (!r->stopping) {
        rc = reactor_run_once(r, -1);
        if (rc < 0) {
            log_error("reactor_epoll_failed", LF_INT("errno", -rc));
            break;
        }
        rc = 0;
    }
    r->stopping = false;
    return rc;
}
