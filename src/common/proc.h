/* proc — supervised child processes: spawn, watch, capture output, stop, reap.
 *
 * The node manager runs inference engines with it, the worker pool its workers. A child
 * is started with fork + exec from the reactor thread and lives in its own session and
 * process group (pgid == pid), so the whole tree it starts can be signalled at once. The
 * parent holds a pidfd watched by the reactor: death is known the instant it happens and
 * the exit is reaped with waitid(P_PIDFD), never by polling.
 *
 * Child setup, in this order (everything after fork is async-signal-safe):
 *   setsid(); prctl(PR_SET_PDEATHSIG, SIGKILL), then exit if the parent already died;
 *   every signal disposition to SIG_DFL (ignored signals survive exec otherwise) and an
 *   empty signal mask; stdin = /dev/null, stdout/stderr = pipes to the parent; every
 *   other fd closed; chdir(workdir); exec. A failure of any step (chdir, exec not found,
 *   permission) is sent back over a close-on-exec pipe, so proc_spawn() returns it
 *   synchronously (-ENOENT, -EACCES, ...) and no zombie is left.
 * PR_SET_PDEATHSIG fires when the parent *thread* exits: spawn from the thread that
 * lives as long as the process (the reactor thread of main).
 *
 * Output: stdout and stderr are read non-blocking by the reactor, cut into lines ('\n'
 * or '\r' ends a line; lines longer than max_line are truncated, the rest of the line
 * dropped) and each line goes to (a) a fixed-size ring shared by both streams (the tail
 * retrievable with proc_tail), (b) optionally a size-rotated log file, (c) optionally
 * the owner's line callback. Memory per child is fixed at spawn whatever the child
 * writes, and a read callback consumes a bounded amount per wakeup, so a child flooding
 * its output never starves timers or other fds.
 *
 * Lifetime: proc_spawn() returns a heap object the caller owns and frees with
 * proc_free(). Callbacks (line, exit, stop-done) may call any proc function on the proc
 * they are about, including proc_free(): the free is then deferred until the callback
 * returns and no further callback is made for it.
 *
 * Reaping: the children of a process are a process-wide set, so this module keeps a
 * process-wide registry of live supervised children (so proc_reap_orphans() can tell
 * them from reparented orphans). Every other child of the process (one forked without
 * proc) counts as an orphan for proc_reap_orphans(): a process using it forks only
 * through proc.
 *
 * Threading: every function except proc_group_alive() and proc_group_pids() must be
 * called on the thread running the reactor the procs were spawned on (one reactor
 * spawns all procs of a process). */
#ifndef MOTOR_PROC_H
#define MOTOR_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct reactor;
struct proc;

enum proc_stream { PROC_STDOUT = 1, PROC_STDERR = 2 };

enum proc_state {
    PROC_RUNNING = 1, /* started, not asked to stop */
    PROC_STOPPING,    /* SIGTERM sent to the group, grace timer running */
    PROC_KILLING,     /* grace expired (or grace 0): SIGKILL sent to the group */
    PROC_EXITED,      /* leader reaped, group swept; the status is final */
};

/* How the leader ended. Exited normally: code >= 0, signo 0. Killed: signo > 0, code -1.
 * Unknown (somebody else reaped it, e.g. SIGCHLD set to SIG_IGN): code -1, signo 0. */
struct proc_status {
    int code;
    int signo;
    bool core_dumped;
};

/* A complete line without its terminator, NUL-terminated (line[len] == '\0'); valid
 * only during the call. */
typedef void (*proc_line_cb)(struct proc *p, enum proc_stream stream, const char *line, size_t len,
                             void *arg);
/* The leader was reaped (and its group swept): st is final, the pidfd closed. Output
 * already in the pipes has been read (and delivered to on_line) before this call; what
 * surviving group members still write keeps arriving until EOF. */
typedef void (*proc_exit_cb)(struct proc *p, const struct proc_status *st, void *arg);
/* proc_stop() finished: the leader is reaped and the group was sent SIGKILL. */
typedef void (*proc_done_cb)(struct proc *p, void *arg);

struct proc_opts {
    /* argv[0] is run like execvp: with a '/' it is a path, else it is searched in PATH
     * of the child's environment (default "/usr/local/bin:/usr/bin:/bin"). Required,
     * NULL-terminated; copied as needed during the call. */
    const char *const *argv;
    /* Base environment: NULL = inherit the parent's environ; else this full
     * NULL-terminated "K=V" array. */
    const char *const *envp;
    /* Applied on top of the base: "K=V" sets K, "K" (no '=') removes it. May be NULL. */
    const char *const *env_overrides;
    const char *workdir; /* NULL = the parent's cwd */
    const char *name;    /* for log lines; NULL = basename of argv[0] */

    size_t ring_bytes; /* tail ring size; 0 = 64 KiB */
    size_t max_line;   /* longer lines are truncated; 0 = 4096, capped to ring_bytes */

    /* Optional rotated log of both streams: path, path.1 .. path.log_keep, each file
     * <= log_max_bytes (0 = 10 MiB). log_keep is used as given (0 = no history). */
    const char *log_path;
    size_t log_max_bytes;
    unsigned log_keep;

    /* Kill what is left of the process group as soon as the leader exits, even when
     * nobody asked to stop (a crashed engine must not leave workers holding its GPU
     * or port). Set true to let group members outlive the leader. */
    bool keep_group_on_exit;

    proc_line_cb on_line; /* may be NULL */
    proc_exit_cb on_exit; /* may be NULL */
    void *arg;            /* passed to on_line and on_exit */
};

/* Start a child. On success returns 0 and *out (state PROC_RUNNING). On failure returns
 * -errno with nothing left behind: -EINVAL (bad opts), -ENOENT/-EACCES/-ENOEXEC/...
 * (exec or chdir failed in the child; the child has been reaped), -EMFILE, or the
 * error of opening log_path. */
int proc_spawn(struct reactor *r, const struct proc_opts *opts, struct proc **out);

/* Free p. A child still running is first killed synchronously (proc_kill_now). Safe
 * inside p's own callbacks (deferred, see above). NULL-safe. */
void proc_free(struct proc *p);

/* Graceful stop: SIGTERM to the process group, SIGKILL to the group after grace_ms
 * (0 = at once), and when the leader exits, SIGKILL to the group again (the sweep, sent
 * before the leader is reaped so the pgid cannot have been reused). Then on_exit (if
 * set at spawn) and done(p, arg) are called, in this order. done may be NULL.
 * Returns 0; -EALREADY when a stop is already in progress (the first one's done still
 * fires; use proc_kill_now to cut the grace short). When the child has already been
 * reaped, done is still called, from the loop (never from inside proc_stop). */
int proc_stop(struct proc *p, int64_t grace_ms, proc_done_cb done, void *arg);

/* Shutdown path: SIGKILL the group and reap the leader synchronously (blocks until the
 * kernel has killed it, normally well under a millisecond). No callback is made; a
 * pending proc_stop is cancelled without calling its done. 0 when dead and reaped (also
 * when it already was), or -errno. */
int proc_kill_now(struct proc *p);

/* Send signo to the whole process group (0 = probe). 0, -ESRCH when reaped, -errno. */
int proc_signal(struct proc *p, int signo);

/* Queries. */
pid_t proc_pid(const struct proc *p);
pid_t proc_pgid(const struct proc *p); /* == pid (the child is a session leader) */
const char *proc_name(const struct proc *p);
enum proc_state proc_get_state(const struct proc *p);
const char *proc_state_name(enum proc_state s);
bool proc_running(const struct proc *p);       /* not yet reaped */
int64_t proc_started_at(const struct proc *p); /* CLOCK_MONOTONIC ms */
int64_t proc_exited_at(const struct proc *p);  /* 0 while running */
int64_t proc_uptime_ms(const struct proc *p);  /* until now, or until the exit */
/* true and *st once reaped; false while running. */
bool proc_exit_status(const struct proc *p, struct proc_status *st);
/* Bytes read so far from one stream (before line cutting/truncation). */
uint64_t proc_output_bytes(const struct proc *p, enum proc_stream stream);

/* The last nlines lines of output (both streams, in arrival order, each ending in '\n';
 * a pending unterminated line is included last). Heap string the caller frees; never
 * NULL ("" when nothing was written). */
char *proc_tail(const struct proc *p, size_t nlines);

/* Make this process a child subreaper: orphaned descendants are reparented to it, not
 * to init, and must be reaped with proc_reap_orphans(). 0 or -errno. */
int proc_become_subreaper(void);
/* Reap every zombie child: a supervised child is handled exactly as if its pidfd had
 * fired (its exit callback runs now), any other child is reaped and logged. Never
 * blocks. Call on SIGCHLD (from a reactor signal callback). Returns the number of
 * non-supervised children reaped. */
int proc_reap_orphans(void);

/* true when some process (zombies included) is in process group pgid. Any thread. */
bool proc_group_alive(pid_t pgid);
/* Scan /proc for the processes of group pgid (zombies included): up to cap pids into
 * out. Returns how many there are (may exceed cap) or -errno. Any thread. */
int proc_group_pids(pid_t pgid, pid_t *out, size_t cap);

#endif
