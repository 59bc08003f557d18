/* reactor — the epoll event loop every Motor daemon runs, one per thread.
 *
 * It owns: fd watches (epoll), monotonic timers (a min-heap; the earliest due time is
 * epoll_wait's timeout), a "run on this/next pass" queue (deferred callbacks), signals
 * (signalfd), child processes (pidfd readable = exited), and an eventfd inbox through
 * which other threads hand work to the loop.
 *
 * One iteration: epoll_wait (not blocking while deferred callbacks are queued) -> fd
 * callbacks -> due timers -> deferred callbacks queued so far.
 *
 * Threading: everything here must be called from the thread running reactor_run(),
 * except reactor_post() and reactor_stop(), which any thread may call.
 *
 * Callbacks may add or remove any watch or timer, including their own, and may free
 * the object that holds the timer once it is stopped. */
#ifndef MOTOR_REACTOR_H
#define MOTOR_REACTOR_H

#include "common/list.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>

struct reactor;

typedef void (*reactor_fd_cb)(struct reactor *r, int fd, uint32_t events, void *arg);
typedef void (*reactor_timer_cb)(struct reactor *r, void *arg);
typedef void (*reactor_signal_cb)(struct reactor *r, int signo, void *arg);
typedef void (*reactor_task_fn)(void *arg);
typedef void (*reactor_deferred_cb)(struct reactor *r, void *arg);

/* A timer lives in caller storage (libuv style): init once, start/stop any number of
 * times; stop is idempotent, so the owner can always stop before freeing. */
struct reactor_timer {
    reactor_timer_cb cb;
    void *arg;
    int64_t due_ms;      /* absolute CLOCK_MONOTONIC ms */
    int64_t interval_ms; /* > 0: periodic */
    size_t heap_index;   /* SIZE_MAX when not armed */
    uint64_t seq;        /* start order: ties on due_ms fire first-started first */
};

/* A deferred callback, also in caller storage: "run cb soon, on this loop thread,
 * without a syscall". Queued from an fd or timer callback it runs at the end of the
 * same iteration; queued from a deferred callback (itself included) it runs in the next
 * iteration, after I/O has been polled without blocking, so a callback that keeps
 * re-queueing itself cannot starve I/O. Queueing an already queued one is a no-op.
 * Cancel before freeing the holder (cancel is idempotent). */
struct reactor_deferred {
    reactor_deferred_cb cb;
    void *arg;
    struct list_head link; /* on the reactor's queue while pending; self-linked or zeroed
                            * otherwise */
};

/* NULL on failure (errno set). */
struct reactor *reactor_new(void);
/* Closes the reactor's own fds; watched fds are NOT closed (their owners close them).
 * NULL-safe. */
void reactor_free(struct reactor *r);

/* Runs until reactor_stop(). Returns 0, or -errno if epoll failed. */
int reactor_run(struct reactor *r);
/* Asks the loop to return after the current iteration. Any thread; async-signal-safe. */
void reactor_stop(struct reactor *r);
/* Run one iteration waiting at most timeout_ms (-1 = forever; less when a timer is due
 * sooner or deferred callbacks are queued). Tests use this. Returns the number of fd
 * events dispatched (timers and deferred callbacks not counted) or -errno. */
int reactor_run_once(struct reactor *r, int timeout_ms);

/* Watch fd for events (EPOLLIN|EPOLLOUT|...). One watch per fd. 0, -EEXIST, -errno. */
int reactor_add_fd(struct reactor *r, int fd, uint32_t events, reactor_fd_cb cb, void *arg);
/* Change the event mask of a watched fd. 0 or -ENOENT/-errno. */
int reactor_mod_fd(struct reactor *r, int fd, uint32_t events);
/* Stop watching fd (does not close it). Safe from inside that fd's own callback:
 * pending events for it in the current batch are dropped. 0 or -ENOENT. */
int reactor_del_fd(struct reactor *r, int fd);
bool reactor_has_fd(struct reactor *r, int fd);

void reactor_timer_init(struct reactor_timer *t, reactor_timer_cb cb, void *arg);
/* (Re)arm: first expiry after delay_ms, then every interval_ms if > 0. Restarting an
 * armed timer reschedules it. Delay 0 fires in the next timer pass (from an fd callback:
 * this iteration's); a timer started from a timer callback (e.g. restarting itself
 * with 0) waits for the next iteration, never fires twice in one pass. For "as soon as
 * possible" prefer reactor_defer. */
void reactor_timer_start(struct reactor *r, struct reactor_timer *t, int64_t delay_ms,
                         int64_t interval_ms);
void reactor_timer_stop(struct reactor *r, struct reactor_timer *t);
bool reactor_timer_active(const struct reactor_timer *t);

void reactor_deferred_init(struct reactor_deferred *d, reactor_deferred_cb cb, void *arg);
void reactor_defer(struct reactor *r, struct reactor_deferred *d);
void reactor_defer_cancel(struct reactor *r, struct reactor_deferred *d);
bool reactor_deferred_pending(const struct reactor_deferred *d);

/* Block these signals for the calling thread (call in main before threads exist) and
 * deliver them through a signalfd to cb. Call once per reactor. 0 or -errno. */
int reactor_watch_signals(struct reactor *r, const int *signals, size_t n, reactor_signal_cb cb,
                          void *arg);

/* Queue fn(arg) to run on the loop thread. Any thread. 0 or -errno. Tasks still queued
 * when the reactor is freed are run (so their resources are released). */
int reactor_post(struct reactor *r, reactor_task_fn fn, void *arg);

/* Cached monotonic time of the current iteration (ms). */
int64_t reactor_now(struct reactor *r);

#endif
