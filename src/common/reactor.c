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
    int eventfd;
    int sigfd;
    reactor_signal_cb sig_cb;
    void *sig_arg;
    _Atomic bool stopping;
    int64_t now_ms;

    struct fd_watch **watches; /* indexed by fd */
    size_t nwatches;
    struct fd_watch *dead_list;

    /* Timers: a min-heap on (due_ms, seq). There is no timerfd: the earliest due time
     * becomes epoll_wait's timeout, so starting, stopping and rescheduling a timer costs
     * no syscall (timerfd_settime was the largest item of a proxied request's profile —
     * in a VM each one that fires at once costs an interrupt round trip). */
    struct reactor_timer **heap;
    size_t heap_len, heap_cap;
    uint64_t timer_seq; /* last seq handed out */

    /* Deferred callbacks: circular lists with sentinels. `deferred` collects; a pass
     * moves it to `running` first, so what is queued meanwhile waits for the next pass. */
    struct list_head deferred;
    struct list_head running;

    pthread_mutex_t inbox_lock;
    struct task *inbox_head, *inbox_tail;
};

/* Internal fds use watches too, with these callbacks. */
static void on_eventfd(struct reactor *r, int fd, uint32_t events, void *arg);
static void on_signalfd(struct reactor *r, int fd, uint32_t events, void *arg);

struct reactor *reactor_new(void)
{
    struct reactor *r = xcalloc(1, sizeof(*r));
    r->epfd = r->eventfd = r->sigfd = -1;
    list_init(&r->deferred);
    list_init(&r->running);
    pthread_mutex_init(&r->inbox_lock, NULL);
    r->now_ms = util_mono_ms();
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (r->epfd < 0)
        goto fail;
    r->eventfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->eventfd < 0)
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
    /* Deferred callbacks still queued belong to their owners: just forget them. */
    struct list_head *n;
    while ((n = list_first(&r->deferred)))
        list_remove(n);
    while ((n = list_first(&r->running)))
        list_remove(n);
    if (r->epfd >= 0)
        close(r->epfd);
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

/* ---- timers: a binary min-heap on (due time, start order) ---------------------- */

static bool earlier(const struct reactor_timer *a, const struct reactor_timer *b)
{
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->seq < b->seq);
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

static void heap_insert(struct reactor *r, struct reactor_timer *t)
{
    if (r->heap_len == r->heap_cap) {
        r->heap_cap = r->heap_cap ? r->heap_cap * 2 : 16;
        r->heap = xrealloc(r->heap, r->heap_cap * sizeof(*r->heap));
    }
    t->seq = ++r->timer_seq;
    t->heap_index = r->heap_len;
    r->heap[r->heap_len++] = t;
    heap_up(r, t->heap_index);
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
    t->due_ms = util_mono_ms() + delay_ms;
    t->interval_ms = interval_ms > 0 ? interval_ms : 0;
    heap_insert(r, t);
}

void reactor_timer_stop(struct reactor *r, struct reactor_timer *t)
{
    if (!reactor_timer_active(t))
        return;
    heap_remove(r, t);
}

static void run_due_timers(struct reactor *r)
{
    int64_t now = util_mono_ms();
    r->now_ms = now;
    /* Only timers started before this pass fire in it: one (re)started from a callback
     * here has a larger seq. Heap order is (due, seq), and a timer started now is due no
     * earlier than `now`, so every older due timer sorts before it and stopping at the
     * first newer one skips nothing. This is what makes a timer that restarts itself
     * with delay 0 run once per iteration instead of spinning inside this loop. */
    uint64_t last_seq = r->timer_seq;
    /* Bound the pass so a storm of due timers cannot starve I/O. */
    for (int fired = 0; r->heap_len && fired < 1024; fired++) {
        struct reactor_timer *t = r->heap[0];
        if (t->due_ms > now || t->seq > last_seq)
            break;
        heap_remove(r, t);
        if (t->interval_ms > 0) {
            t->due_ms += t->interval_ms;
            if (t->due_ms <= now) /* we fell behind: skip missed ticks */
                t->due_ms = now + t->interval_ms;
            heap_insert(r, t);
        }
        t->cb(r, t->arg); /* may stop/restart/free t */
    }
}

/* epoll_wait's timeout: the caller's, shortened to the earliest timer; 0 when there is
 * something to do right away. */
static int wait_timeout(struct reactor *r, int timeout_ms)
{
    if (!list_empty(&r->deferred))
        return 0;
    if (!r->heap_len)
        return timeout_ms;
    int64_t until = r->heap[0]->due_ms - util_mono_ms();
    if (until <= 0)
        return 0;
    if (until > INT32_MAX)
        until = INT32_MAX;
    /* util_mono_ms truncates, so waiting `until` whole ms never wakes before the due time. */
    if (timeout_ms < 0 || until < timeout_ms)
        return (int)until;
    return timeout_ms;
}

/* ---- deferred callbacks -------------------------------------------------------- */

void reactor_deferred_init(struct reactor_deferred *d, reactor_deferred_cb cb, void *arg)
{
    d->cb = cb;
    d->arg = arg;
    list_init(&d->link);
}

bool reactor_deferred_pending(const struct reactor_deferred *d)
{
    return list_linked(&d->link);
}

void reactor_defer(struct reactor *r, struct reactor_deferred *d)
{
    if (list_linked(&d->link))
        return; /* queued already (for this pass or the next one) */
    list_insert_tail(&r->deferred, &d->link);
}

void reactor_defer_cancel(struct reactor *r, struct reactor_deferred *d)
{
    (void)r;
    list_remove(&d->link);
}

static void run_deferred(struct reactor *r)
{
    if (list_empty(&r->deferred))
        return;
    /* Move the queue to `running` (splice), then pop one at a time: a callback may
     * cancel others still waiting in `running`, or queue new ones (they go to
     * `deferred`, i.e. the next pass). */
    list_splice_tail(&r->running, &r->deferred);
    struct list_head *n;
    while ((n = list_first(&r->running))) {
        struct reactor_deferred *d = list_entry(n, struct reactor_deferred, link);
        list_remove(n);
        d->cb(r, d->arg); /* may re-queue d, or free its holder */
    }
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
    int n = epoll_wait(r->epfd, events, MAX_EVENTS, wait_timeout(r, timeout_ms));
    if (n < 0) {
        if (errno != EINTR)
            return -errno;
        n = 0;
    }
    r->now_ms = util_mono_ms();
    for (int i = 0; i < n; i++) {
        struct fd_watch *w = events[i].data.ptr;
        if (w->dead)
            continue;
        w->cb(r, w->fd, events[i].events, w->arg);
    }
    free_dead(r);
    if (r->heap_len && r->heap[0]->due_ms <= util_mono_ms())
        run_due_timers(r);
    run_deferred(r);
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
