/* Unit tests for proc (supervised children), ring and logfile.
 *
 * Real children (/bin/sh scripts) on a real reactor. The test process is a child
 * subreaper and reaps orphans on SIGCHLD, so grandchildren killed by a sweep do not
 * linger as zombies of init; every test's teardown frees (= kills) what it spawned. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/log.h"
#include "common/logfile.h"
#include "common/proc.h"
#include "common/reactor.h"
#include "common/ring.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEADLINE_MS 10000
#define MAXPROCS 16

struct fx {
    int nfds_before; /* fds open before the test: the same number must remain after */
    struct reactor *r;
    struct proc *procs[MAXPROCS];
    char dir[64];
    int orphans_reaped;
};

struct rec {
    struct fx *f;
    int slot;
    int exits;
    struct proc_status st;
    int order; /* sequence counter shared by on_exit and done */
    int exit_seq, done_seq;
    int done;
    int lines;
    int out_lines, err_lines;
    char first[256];
    char last[256];
    const char *want;
    bool seen;
    int seen_count;
    bool free_on_first_line;
};

/* ---- helpers ------------------------------------------------------------------- */

static void on_sig(struct reactor *r, int signo, void *arg)
{
    struct fx *f = arg;
    if (signo == SIGCHLD)
        f->orphans_reaped += proc_reap_orphans();
}

static int group_setup(void **state)
{
    log_set_level(LOG_WARN);
    return proc_become_subreaper() == 0 ? 0 : -1;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static int setup(void **state)
{
    struct fx *f = xcalloc(1, sizeof(*f));
    f->nfds_before = count_fds();
    f->r = reactor_new();
    if (!f->r)
        return -1;
    int sigs[] = {SIGCHLD};
    if (reactor_watch_signals(f->r, sigs, 1, on_sig, f) != 0)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/motor-test-proc-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    *state = f;
    return 0;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char *p = xasprintf("%s/%s", dir, de->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    for (int i = 0; i < MAXPROCS; i++)
        proc_free(f->procs[i]);
    /* Whatever those groups left behind was SIGKILLed: collect the zombies. */
    int64_t deadline = util_mono_ms() + 2000;
    do
        proc_reap_orphans();
    while (waitid(P_ALL, 0, &(siginfo_t){0}, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           util_mono_ms() < deadline);
    rm_dir(f->dir);
    reactor_free(f->r);
    int leaked = count_fds() - f->nfds_before;
    free(f);
    if (leaked != 0) {
        print_error("%d fd(s) leaked\n", leaked);
        return -1;
    }
    return 0;
}

static void rec_line(struct proc *p, enum proc_stream s, const char *line, size_t len, void *arg)
{
    struct rec *rc = arg;
    assert_int_equal(strlen(line), len);
    if (rc->lines == 0)
        snprintf(rc->first, sizeof(rc->first), "%s", line);
    rc->lines++;
    if (s == PROC_STDOUT)
        rc->out_lines++;
    else
        rc->err_lines++;
    snprintf(rc->last, sizeof(rc->last), "%s", line);
    if (rc->want && strstr(line, rc->want)) {
        rc->seen = true;
        rc->seen_count++;
    }
    if (rc->free_on_first_line) {
        rc->free_on_first_line = false;
        rc->f->procs[rc->slot] = NULL;
        proc_free(p);
        proc_free(p); /* still deferred: must not double free */
    }
}

static void rec_exit(struct proc *p, const struct proc_status *st, void *arg)
{
    struct rec *rc = arg;
    rc->exits++;
    rc->st = *st;
    rc->exit_seq = ++rc->order;
    assert_false(proc_running(p));
}

static void rec_done(struct proc *p, void *arg)
{
    struct rec *rc = arg;
    rc->done++;
    rc->done_seq = ++rc->order;
}

static int free_slot(struct fx *f)
{
    for (int i = 0; i < MAXPROCS; i++)
        if (!f->procs[i])
            return i;
    fail_msg("too many procs");
    return -1;
}

/* Spawn argv with rec callbacks; o may preset other options. Returns the proc. */
static struct proc *spawn_opts(struct fx *f, struct proc_opts *o, struct rec *rc)
{
    int slot = free_slot(f);
    if (rc) {
        rc->f = f;
        rc->slot = slot;
        o->on_line = rec_line;
        o->on_exit = rec_exit;
        o->arg = rc;
    }
    struct proc *p = NULL;
    int err = proc_spawn(f->r, o, &p);
    assert_int_equal(err, 0);
    assert_non_null(p);
    f->procs[slot] = p;
    return p;
}

static struct proc *spawn_sh(struct fx *f, const char *script, struct rec *rc)
{
    const char *argv[] = {"/bin/sh", "-c", script, NULL};
    struct proc_opts o = {.argv = argv};
    return spawn_opts(f, &o, rc);
}

static bool run_until_int(struct fx *f, const int *v, int want, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (*v < want && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    return *v >= want;
}

static bool run_until_flag(struct fx *f, const bool *v, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    while (!*v && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    return *v;
}

/* State letter of /proc/<pid>/stat, 0 when the process does not exist. */
static char pid_state(pid_t pid, pid_t *ppid_out, pid_t *pgrp_out, pid_t *sid_out)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    char st = 0;
    int ppid = 0, pgrp = 0, sid = 0;
    if (!rp || sscanf(rp + 1, " %c %d %d %d", &st, &ppid, &pgrp, &sid) != 4)
        return 0;
    if (ppid_out)
        *ppid_out = ppid;
    if (pgrp_out)
        *pgrp_out = pgrp;
    if (sid_out)
        *sid_out = sid;
    return st;
}

/* Poll (running the loop, whose SIGCHLD handler reaps orphans) until nothing of group
 * pgid exists any more, zombies included. */
static bool group_gone(struct fx *f, pid_t pgid, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    for (;;) {
        proc_reap_orphans();
        pid_t pids[64];
        int n = proc_group_pids(pgid, pids, 64);
        assert_true(n >= 0);
        if (n == 0 && !proc_group_alive(pgid))
            return true;
        if (util_mono_ms() >= deadline)
            return false;
        assert_true(reactor_run_once(f->r, 20) >= 0);
    }
}

static long rss_kb(void)
{
    char *s = util_read_file("/proc/self/status", 1 << 16, NULL);
    assert_non_null(s);
    long kb = -1;
    char *p = strstr(s, "VmRSS:");
    if (p)
        kb = strtol(p + 6, NULL, 10);
    free(s);
    return kb;
}

/* ---- ring ---------------------------------------------------------------------- */

static void test_ring_basics(void **state)
{
    (void)state;
    struct ring r;
    ring_init(&r, 16);
    char *t = ring_tail(&r, 3);
    assert_string_equal(t, "");
    free(t);

    ring_write(&r, "a\nbb\nccc\n", 9);
    assert_int_equal(ring_len(&r), 9);
    t = ring_tail(&r, 2);
    assert_string_equal(t, "bb\nccc\n");
    free(t);
    t = ring_tail(&r, 0);
    assert_string_equal(t, "");
    free(t);
    t = ring_tail(&r, 99);
    assert_string_equal(t, "a\nbb\nccc\n");
    free(t);

    /* Wrap: 9 + 10 = 19 > 16 drops 3 bytes ("a\nb"): the oldest line is now partial. */
    ring_write(&r, "dddd\neeee\n", 10);
    assert_int_equal(ring_len(&r), 16);
    assert_int_equal(ring_total(&r), 19);
    t = ring_tail(&r, 99);
    assert_string_equal(t, "ccc\ndddd\neeee\n");
    free(t);
    char raw[32];
    size_t n = ring_copy(&r, raw, sizeof(raw), false);
    assert_int_equal(n, 16);
    assert_memory_equal(raw, "b\nccc\ndddd\neeee\n", 16);
    /* dst too small: the newest bytes. */
    n = ring_copy(&r, raw, 5, false);
    assert_int_equal(n, 5);
    assert_memory_equal(raw, "eeee\n", 5);

    /* Unterminated last line counts as a line. */
    ring_write(&r, "ff", 2);
    t = ring_tail(&r, 2);
    assert_string_equal(t, "eeee\nff");
    free(t);

    /* A write larger than the ring keeps the newest bytes; the cut lands mid-line. */
    ring_write(&r, "0123456789\nabcdefghij\nZ\n", 24);
    assert_int_equal(ring_len(&r), 16);
    t = ring_tail(&r, 99);
    assert_string_equal(t, "abcdefghij\nZ\n");
    free(t);
    /* The cut lands exactly after a newline: nothing partial. */
    ring_reset(&r);
    ring_write(&r, "x\n0123456\n0123456\n", 18);
    t = ring_tail(&r, 99);
    assert_string_equal(t, "0123456\n0123456\n");
    free(t);
    ring_release(&r);
    ring_release(NULL);
}

static void test_ring_lines_start(void **state)
{
    (void)state;
    static const struct {
        const char *buf;
        size_t nlines;
        size_t want;
    } cases[] = {
        {"", 1, 0},       {"a", 1, 0},          {"a\n", 1, 0},          {"a\nb\n", 1, 2},
        {"a\nb\n", 2, 0}, {"a\nb", 1, 2},       {"a\nb", 5, 0},         {"\n\n\n", 1, 2},
        {"\n\n\n", 2, 1}, {"ab\ncd\nef", 2, 3}, {"ab\ncd\nef\n", 0, 9},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        size_t got = ring_lines_start(cases[i].buf, strlen(cases[i].buf), cases[i].nlines);
        if (got != cases[i].want)
            fail_msg("case %zu: got %zu want %zu", i, got, cases[i].want);
    }
}

/* ---- logfile ------------------------------------------------------------------- */

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

static void test_logfile_rotation(void **state)
{
    struct fx *f = *state;
    char *path = xasprintf("%s/direct.log", f->dir);
    struct logfile *lf = NULL;
    assert_int_equal(logfile_open(path, 0, 2, &lf), -EINVAL);
    assert_int_equal(logfile_open(path, 100, 2, &lf), 0);
    char line[32];
    for (int i = 0; i < 20; i++) {
        int len = snprintf(line, sizeof(line), "line %02d xxxxxxxxxxxxxxxxxxxxx\n", i); /* 30 B */
        assert_int_equal(len, 30);
        assert_int_equal(logfile_write(lf, line, (size_t)len), 0);
        assert_true(logfile_size(lf) <= 100);
    }
    char *p1 = xasprintf("%s.1", path), *p2 = xasprintf("%s.2", path),
         *p3 = xasprintf("%s.3", path);
    assert_true(file_size(path) > 0 && file_size(path) <= 100);
    assert_int_equal(file_size(p1), 90); /* three whole lines; a fourth does not fit */
    assert_int_equal(file_size(p2), 90);
    assert_int_equal(file_size(p3), -1); /* keep = 2 */
    /* Newest data in path, in order, split only at line boundaries. */
    char *cur = util_read_file(path, 4096, NULL), *old = util_read_file(p1, 4096, NULL);
    assert_non_null(cur);
    assert_non_null(old);
    assert_memory_equal(cur, "line 18", 7);
    assert_non_null(strstr(cur, "line 19"));
    assert_memory_equal(old, "line 15", 7);
    free(cur);
    free(old);

    /* A multi-line write larger than max_bytes is spread over files, none oversize. */
    char big[1000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (i % 25 == 24) ? '\n' : 'b';
    assert_int_equal(logfile_write(lf, big, sizeof(big)), 0);
    assert_true(file_size(path) <= 100);
    assert_true(file_size(p1) <= 100);
    assert_true(file_size(p2) <= 100);
    logfile_close(lf);

    /* Reopen appends and knows the current size. */
    off_t before = file_size(path);
    assert_int_equal(logfile_open(path, 100, 2, &lf), 0);
    assert_int_equal(logfile_size(lf), (size_t)before);
    logfile_close(lf);
    logfile_close(NULL);

    /* keep = 0: rotation truncates in place. */
    char *p0 = xasprintf("%s/nokeep.log", f->dir);
    assert_int_equal(logfile_open(p0, 50, 0, &lf), 0);
    for (int i = 0; i < 10; i++)
        assert_int_equal(logfile_write(lf, "0123456789\n", 11), 0);
    assert_true(file_size(p0) <= 50);
    char *p01 = xasprintf("%s.1", p0);
    assert_int_equal(file_size(p01), -1);
    logfile_close(lf);

    char *bad = xasprintf("%s/no/such/dir.log", f->dir);
    assert_int_equal(logfile_open(bad, 100, 1, &lf), -ENOENT);
    free(bad);
    free(p0);
    free(p01);
    free(p1);
    free(p2);
    free(p3);
    free(path);
}

/* ---- spawn, exit, output ------------------------------------------------------- */

static void test_exit_code_and_output(void **state)
{
    struct fx *f = *state;
    struct rec rc = {0};
    int64_t t0 = util_mono_ms();
    struct proc *p = spawn_sh(f, "echo hello; echo oops >&2; exit 42", &rc);
    assert_true(proc_pid(p) > 0);
    assert_int_equal(proc_pgid(p), proc_pid(p));
    assert_string_equal(proc_name(p), "sh");
    assert_true(proc_started_at(p) >= t0);
    assert_int_equal(proc_exited_at(p), 0);
    assert_false(proc_exit_status(p, NULL));

    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_int_equal(rc.exits, 1);
    assert_int_equal(rc.st.code, 42);
    assert_int_equal(rc.st.signo, 0);
    assert_false(proc_running(p));
    assert_int_equal(proc_get_state(p), PROC_EXITED);
    struct proc_status st;
    assert_true(proc_exit_status(p, &st));
    assert_int_equal(st.code, 42);
    assert_true(proc_exited_at(p) >= proc_started_at(p));
    assert_int_equal(proc_uptime_ms(p), proc_exited_at(p) - proc_started_at(p));

    /* Output read before on_exit: both lines are already there. */
    assert_int_equal(rc.out_lines, 1);
    assert_int_equal(rc.err_lines, 1);
    assert_int_equal(proc_output_bytes(p, PROC_STDOUT), 6);
    assert_int_equal(proc_output_bytes(p, PROC_STDERR), 5);
    char *t = proc_tail(p, 10);
    assert_non_null(strstr(t, "hello\n"));
    assert_non_null(strstr(t, "oops\n"));
    free(t);
    assert_int_equal(proc_signal(p, 0), -ESRCH);
}

static void test_exit_by_signal(void **state)
{
    struct fx *f = *state;
    struct rec a = {0}, b = {0};
    spawn_sh(f, "kill -TERM $$", &a);
    spawn_sh(f, "kill -KILL $$", &b);
    assert_true(run_until_int(f, &a.exits, 1, DEADLINE_MS));
    assert_true(run_until_int(f, &b.exits, 1, DEADLINE_MS));
    assert_int_equal(a.st.signo, SIGTERM);
    assert_int_equal(a.st.code, -1);
    assert_int_equal(b.st.signo, SIGKILL);
    assert_int_equal(b.st.code, -1);
    assert_false(b.st.core_dumped);
}

static void test_exec_failure(void **state)
{
    struct fx *f = *state;
    struct proc *p = NULL;
    static const struct {
        const char *argv0;
        const char *workdir;
        int want;
    } cases[] = {
        {"/nonexistent/motor-no-such-binary", NULL, -ENOENT},
        {"motor-no-such-binary-in-path", NULL, -ENOENT},
        {"/etc/passwd", NULL, -EACCES}, /* not executable */
        {"/tmp", NULL, -EACCES},        /* a directory */
        {"/bin/true", "/nonexistent/dir", -ENOENT},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const char *argv[] = {cases[i].argv0, NULL};
        struct proc_opts o = {.argv = argv, .workdir = cases[i].workdir};
        int64_t t0 = util_mono_ms();
        int rc = proc_spawn(f->r, &o, &p);
        if (rc != cases[i].want)
            fail_msg("case %zu (%s): got %d want %d", i, cases[i].argv0, rc, cases[i].want);
        assert_null(p);
        assert_true(util_mono_ms() - t0 < 2000); /* synchronous, no timeout involved */
    }
    /* The failed children were reaped by proc_spawn: no child at all is left. */
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    int w = waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT);
    assert_true((w < 0 && errno == ECHILD) || (w == 0 && si.si_pid == 0));
    assert_int_equal(proc_reap_orphans(), 0);

    /* Bad options. */
    const char *empty[] = {NULL};
    struct proc_opts o = {.argv = empty};
    assert_int_equal(proc_spawn(f->r, &o, &p), -EINVAL);
    o.argv = NULL;
    assert_int_equal(proc_spawn(f->r, &o, &p), -EINVAL);
    const char *ok[] = {"/bin/true", NULL};
    char *badlog = xasprintf("%s/missing/x.log", f->dir);
    struct proc_opts lo = {.argv = ok, .log_path = badlog};
    assert_int_equal(proc_spawn(f->r, &lo, &p), -ENOENT);
    free(badlog);
}

static void test_env_and_workdir(void **state)
{
    struct fx *f = *state;
    setenv("MOTOR_T_KEEP", "kept", 1);
    setenv("MOTOR_T_DROP", "parent", 1);
    setenv("MOTOR_T_OVR", "parent", 1);
    const char *over[] = {"MOTOR_T_OVR=child", "MOTOR_T_DROP", "MOTOR_T_NEW=new", NULL};
    const char *argv[] = {"sh", "-c",
                          "echo \"K=$MOTOR_T_KEEP D=${MOTOR_T_DROP-unset} O=$MOTOR_T_OVR "
                          "N=$MOTOR_T_NEW W=$(pwd)\"",
                          NULL};
    struct rec rc = {0};
    struct proc_opts o = {
        .argv = argv, .env_overrides = over, .workdir = f->dir, .name = "envtest"};
    struct proc *p = spawn_opts(f, &o, &rc);
    assert_string_equal(proc_name(p), "envtest");
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_int_equal(rc.st.code, 0);
    char want[256];
    snprintf(want, sizeof(want), "K=kept D=unset O=child N=new W=%s", f->dir);
    assert_string_equal(rc.last, want);
    unsetenv("MOTOR_T_KEEP");
    unsetenv("MOTOR_T_DROP");
    unsetenv("MOTOR_T_OVR");

    /* Full environment: nothing inherited; argv[0] found through the default PATH. */
    const char *envp[] = {"ONLY=1", "ALSO=two", NULL};
    const char *over2[] = {"ALSO=three", NULL};
    const char *argv2[] = {"sh", "-c", "echo \"ONLY=$ONLY ALSO=$ALSO HOME=${HOME-unset}\"", NULL};
    struct rec rc2 = {0};
    struct proc_opts o2 = {.argv = argv2, .envp = envp, .env_overrides = over2};
    spawn_opts(f, &o2, &rc2);
    assert_true(run_until_int(f, &rc2.exits, 1, DEADLINE_MS));
    assert_string_equal(rc2.last, "ONLY=1 ALSO=three HOME=unset");

    /* PATH of the child's environment is the one searched. */
    const char *envp3[] = {"PATH=/nonexistent", NULL};
    const char *argv3[] = {"sh", "-c", "true", NULL};
    struct proc_opts o3 = {.argv = argv3, .envp = envp3};
    struct proc *p3 = NULL;
    assert_int_equal(proc_spawn(f->r, &o3, &p3), -ENOENT);
}

/* The child starts clean: own session, /dev/null stdin, only fds 0-2, default signal
 * dispositions, empty mask -- whatever the parent has. */
static void test_child_hygiene(void **state)
{
    struct fx *f = *state;
    /* Dirty the parent: a leaked fd, an ignored and a blocked signal. */
    int leak = open("/dev/null", O_RDONLY); /* no O_CLOEXEC on purpose */
    assert_true(leak >= 0);
    assert_int_equal(dup2(leak, 100), 100);
    close(leak);
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_pipe, old_usr1;
    sigaction(SIGPIPE, &ign, &old_pipe);
    sigaction(SIGUSR1, &ign, &old_usr1);
    sigset_t blk, old_mask;
    sigemptyset(&blk);
    sigaddset(&blk, SIGUSR2);
    sigaddset(&blk, SIGHUP);
    sigprocmask(SIG_BLOCK, &blk, &old_mask);

    const char *argv_fd[] = {"ls", "/proc/self/fd", NULL};
    const char *argv_sig[] = {"grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status", NULL};
    const char *argv_in[] = {"readlink", "/proc/self/fd/0", NULL};
    struct rec rfd = {0}, rsig = {0}, rin = {0};
    struct proc_opts ofd = {.argv = argv_fd}, osig = {.argv = argv_sig}, oin = {.argv = argv_in};
    struct proc *pfd = spawn_opts(f, &ofd, &rfd);
    spawn_opts(f, &osig, &rsig);
    spawn_opts(f, &oin, &rin);

    /* A long-running one to look at from outside. */
    const char *argv_sl[] = {"sleep", "30", NULL};
    struct proc_opts osl = {.argv = argv_sl};
    struct proc *psl = spawn_opts(f, &osl, NULL);

    close(100);
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigaction(SIGUSR1, &old_usr1, NULL);
    sigprocmask(SIG_SETMASK, &old_mask, NULL);

    assert_true(run_until_int(f, &rfd.exits, 1, DEADLINE_MS));
    assert_true(run_until_int(f, &rsig.exits, 1, DEADLINE_MS));
    assert_true(run_until_int(f, &rin.exits, 1, DEADLINE_MS));

    /* ls sees 0,1,2 and the directory fd it opened itself: 4 entries, no 100. */
    char *t = proc_tail(pfd, 100);
    assert_int_equal(rfd.lines, 4);
    assert_null(strstr(t, "100"));
    free(t);
    assert_int_equal(rsig.lines, 2);
    assert_string_equal(rsig.first, "SigBlk:\t0000000000000000");
    assert_string_equal(rsig.last, "SigIgn:\t0000000000000000");
    assert_string_equal(rin.last, "/dev/null");

    /* Session and group leader; parent is us. */
    pid_t pid = proc_pid(psl), ppid = 0, pgrp = 0, sid = 0;
    char st = pid_state(pid, &ppid, &pgrp, &sid);
    assert_true(st != 0 && st != 'Z');
    assert_int_equal(ppid, getpid());
    assert_int_equal(pgrp, pid);
    assert_int_equal(sid, pid);
    assert_true(proc_group_alive(proc_pgid(psl)));
    pid_t pids[8];
    assert_int_equal(proc_group_pids(proc_pgid(psl), pids, 8), 1);
    assert_int_equal(pids[0], pid);
    assert_int_equal(proc_signal(psl, 0), 0);
    assert_int_equal(proc_get_state(psl), PROC_RUNNING);
    assert_true(proc_uptime_ms(psl) >= 0);
}

static void test_tail_and_lines(void **state)
{
    struct fx *f = *state;
    struct rec rc = {0};
    struct proc *p = spawn_sh(f, "i=1; while [ $i -le 50 ]; do echo line$i; i=$((i+1)); done", &rc);
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_int_equal(rc.lines, 50);
    char *t = proc_tail(p, 3);
    assert_string_equal(t, "line48\nline49\nline50\n");
    free(t);
    t = proc_tail(p, 0);
    assert_string_equal(t, "");
    free(t);
    t = proc_tail(p, 1000);
    assert_memory_equal(t, "line1\nline2\n", 12);
    free(t);

    /* Small ring: the tail holds whole lines only, the newest ones. */
    const char *argv[] = {"/bin/sh", "-c",
                          "i=1; while [ $i -le 50 ]; do echo line$i; i=$((i+1)); done", NULL};
    struct rec rs = {0};
    struct proc_opts os = {.argv = argv, .ring_bytes = 64};
    struct proc *ps = spawn_opts(f, &os, &rs);
    assert_true(run_until_int(f, &rs.exits, 1, DEADLINE_MS));
    t = proc_tail(ps, 1000);
    assert_true(strlen(t) <= 64);
    assert_memory_equal(t, "line", 4); /* starts at a line start */
    assert_non_null(strstr(t, "line50\n"));
    free(t);

    /* Truncation, \r handling, CRLF, empty lines. */
    const char *argv2[] = {"/bin/sh", "-c",
                           "printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\\nshort\\n"
                           "p1\\rp2\\r\\n\\nend\\n'",
                           NULL};
    struct rec r2 = {0};
    struct proc_opts o2 = {.argv = argv2, .max_line = 16};
    struct proc *p2 = spawn_opts(f, &o2, &r2);
    assert_true(run_until_int(f, &r2.exits, 1, DEADLINE_MS));
    t = proc_tail(p2, 100);
    assert_string_equal(t, "aaaaaaaaaaaaaaaa\nshort\np1\np2\n\nend\n");
    free(t);
    assert_int_equal(r2.lines, 6);
    assert_string_equal(r2.first, "aaaaaaaaaaaaaaaa");

    /* A pending unterminated line shows up in the tail before it is complete, and is
     * delivered when the stream ends. */
    struct rec r3 = {0};
    struct proc *p3 = spawn_sh(f, "echo first; printf partial; sleep 30", &r3);
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (proc_output_bytes(p3, PROC_STDOUT) < 13 && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    assert_int_equal(r3.lines, 1);
    t = proc_tail(p3, 1);
    assert_string_equal(t, "partial\n");
    free(t);
    t = proc_tail(p3, 5);
    assert_string_equal(t, "first\npartial\n");
    free(t);
    assert_int_equal(proc_kill_now(p3), 0);
    /* The writer is dead: EOF flushes the partial line. */
    deadline = util_mono_ms() + DEADLINE_MS;
    while (r3.lines < 2 && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    assert_int_equal(r3.lines, 2);
    assert_string_equal(r3.last, "partial");
}

static void test_rotated_log(void **state)
{
    struct fx *f = *state;
    char *path = xasprintf("%s/eng.log", f->dir);
    const char *argv[] = {
        "/bin/sh", "-c", "i=1; while [ $i -le 2000 ]; do echo \"line $i\"; i=$((i+1)); done", NULL};
    struct rec rc = {0};
    struct proc_opts o = {.argv = argv, .log_path = path, .log_max_bytes = 4096, .log_keep = 3};
    spawn_opts(f, &o, &rc);
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_int_equal(rc.st.code, 0);
    /* ~20 KB written: 4 files in use, the oldest rotated away. */
    for (int k = 0; k <= 4; k++) {
        char *pk = k ? xasprintf("%s.%d", path, k) : xstrdup(path);
        off_t sz = file_size(pk);
        if (k == 4) {
            assert_int_equal(sz, -1);
        } else {
            assert_true(sz > 0);
            assert_true(sz <= 4096);
            char *c = util_read_file(pk, 8192, NULL);
            assert_non_null(c);
            /* Split at line boundaries only. */
            assert_true(c[strlen(c) - 1] == '\n');
            assert_true(strncmp(c, "line ", 5) == 0);
            if (k == 0) {
                assert_non_null(strstr(c, "line 2000\n"));
            }
            free(c);
        }
        free(pk);
    }
    free(path);
}

/* A child writing 50 MB: memory stays flat and timers keep firing meanwhile. */
struct flood {
    struct proc *p;
    int ticks;
    int ticks_during;
};

static void flood_tick(struct reactor *r, void *arg)
{
    struct flood *fl = arg;
    fl->ticks++;
    uint64_t b = proc_output_bytes(fl->p, PROC_STDOUT);
    if (proc_running(fl->p) && b > 0 && b < 50ull * 1024 * 1024)
        fl->ticks_during++;
}

static void test_flood(void **state)
{
    struct fx *f = *state;
    struct rec rc = {0};
    char *path = xasprintf("%s/flood.log", f->dir);
    const char *argv[] = {"/bin/sh", "-c",
                          "yes 0123456789012345678901234567890123456789012345678901234567890123"
                          "4567890123456789012345678901234567890123456789012345678901234567890123"
                          "456789012345678901234567890123456789012345678901234567890123456789 | "
                          "head -c 52428800",
                          NULL};
    struct proc_opts o = {.argv = argv, .log_path = path, .log_max_bytes = 1 << 20, .log_keep = 2};
    long rss0 = rss_kb();
    int64_t t0 = util_mono_ms();
    struct proc *p = spawn_opts(f, &o, &rc);
    struct flood fl = {.p = p};
    struct reactor_timer tick;
    reactor_timer_init(&tick, flood_tick, &fl);
    reactor_timer_start(f->r, &tick, 5, 5);
    bool ok = run_until_int(f, &rc.exits, 1, 60000);
    reactor_timer_stop(f->r, &tick);
    assert_true(ok);
    int64_t el = util_mono_ms() - t0;
    long rss1 = rss_kb();
    assert_int_equal(rc.st.code, 0);
    assert_int_equal(proc_output_bytes(p, PROC_STDOUT), 52428800ull);
    /* 50 MB went through; resident memory grew by a small fraction of it. */
    assert_true(rss1 - rss0 < 16 * 1024);
    char *t = proc_tail(p, 1000000);
    assert_true(strlen(t) <= 64 * 1024);
    free(t);
    /* The loop was not stalled: the 5 ms timer kept ticking during the flood. */
    assert_true(fl.ticks_during >= 3);
    if (el > 500)
        assert_true(fl.ticks >= el / 5 / 4);
    char *p1 = xasprintf("%s.1", path), *p3 = xasprintf("%s.3", path);
    assert_true(file_size(path) <= (1 << 20));
    assert_true(file_size(p1) <= (1 << 20) && file_size(p1) > 0);
    assert_int_equal(file_size(p3), -1);
    free(p1);
    free(p3);
    free(path);
}

/* proc_free from inside the line callback of a chatty child: deferred, kills it. */
static void test_free_inside_callback(void **state)
{
    struct fx *f = *state;
    struct rec rc = {.free_on_first_line = true};
    struct proc *p = spawn_sh(f, "yes", &rc);
    pid_t pid = proc_pid(p);
    assert_true(run_until_int(f, &rc.lines, 1, DEADLINE_MS));
    assert_int_equal(rc.lines, 1); /* nothing delivered after the free */
    assert_int_equal(rc.exits, 0); /* no callback after the free */
    assert_true(group_gone(f, pid, DEADLINE_MS));
}

/* ---- stop ---------------------------------------------------------------------- */

static void test_stop_term_ignored(void **state)
{
    struct fx *f = *state;
    struct rec rc = {.want = "ready"};
    struct proc *p = spawn_sh(f, "trap '' TERM; echo ready; while :; do sleep 1; done", &rc);
    assert_true(run_until_flag(f, &rc.seen, DEADLINE_MS));
    int64_t t0 = util_mono_ms();
    assert_int_equal(proc_stop(p, 300, rec_done, &rc), 0);
    assert_int_equal(proc_get_state(p), PROC_STOPPING);
    assert_int_equal(proc_stop(p, 300, rec_done, &rc), -EALREADY);
    /* Still alive after TERM: it ignores it. */
    assert_int_equal(reactor_run_once(f->r, 100), 0);
    assert_true(proc_running(p));
    assert_true(run_until_int(f, &rc.done, 1, DEADLINE_MS));
    int64_t el = util_mono_ms() - t0;
    assert_true(el >= 290);
    assert_true(el < 5000);
    assert_int_equal(rc.exits, 1);
    assert_int_equal(rc.done, 1);
    assert_true(rc.exit_seq < rc.done_seq); /* on_exit first, then done */
    assert_int_equal(rc.st.signo, SIGKILL);
    assert_int_equal(proc_get_state(p), PROC_EXITED);
    assert_true(group_gone(f, proc_pgid(p), DEADLINE_MS));
}

static void test_stop_graceful(void **state)
{
    struct fx *f = *state;
    struct rec rc = {.want = "ready"};
    /* The TERM also kills the shell's `sleep` (the whole group is signalled), and sh
     * reports that on stderr ("Terminated"), a pipe of its own that may be read after
     * stdout's "bye": stderr is silenced so the last line is the trap's. */
    struct proc *p = spawn_sh(f,
                              "trap 'echo bye; exit 0' TERM; exec 2>/dev/null; echo ready; "
                              "while :; do sleep 0.05; done",
                              &rc);
    assert_true(run_until_flag(f, &rc.seen, DEADLINE_MS));
    assert_int_equal(proc_stop(p, 5000, rec_done, &rc), 0);
    assert_true(run_until_int(f, &rc.done, 1, DEADLINE_MS));
    assert_int_equal(rc.st.code, 0);
    assert_int_equal(rc.st.signo, 0);
    assert_string_equal(rc.last, "bye");
    assert_true(proc_uptime_ms(p) < 5000);
}

/* script prints "up" nready times once its members are set up. */
static void check_group_swept(struct fx *f, const char *script, int nready)
{
    struct rec rc = {.want = "up"};
    struct proc *p = spawn_sh(f, script, &rc);
    pid_t pgid = proc_pgid(p);
    assert_true(run_until_int(f, &rc.seen_count, nready, DEADLINE_MS));
    pid_t pids[16];
    int n = proc_group_pids(pgid, pids, 16);
    assert_true(n >= 3); /* the shell and two sleeps */
    int64_t t0 = util_mono_ms();
    assert_int_equal(proc_stop(p, 5000, rec_done, &rc), 0);
    assert_true(run_until_int(f, &rc.done, 1, DEADLINE_MS));
    /* Well before the grace: the leader died of TERM and the sweep took the rest. */
    assert_true(util_mono_ms() - t0 < 4000);
    assert_int_equal(rc.st.signo, SIGTERM);
    assert_true(group_gone(f, pgid, DEADLINE_MS));
    for (int i = 0; i < n && i < 16; i++)
        assert_int_equal(pid_state(pids[i], NULL, NULL, NULL), 0);
}

static void test_stop_kills_grandchildren(void **state)
{
    struct fx *f = *state;
    check_group_swept(f, "sleep 100 & sleep 100 & echo up; wait", 1);
    /* Grandchildren that ignore TERM while the leader obeys it: only the sweep gets them. */
    check_group_swept(f,
                      "(trap '' TERM; echo up; exec sleep 100) & "
                      "(trap '' TERM; echo up; exec sleep 100) & echo up; wait",
                      3);
}

static void test_stop_already_dead(void **state)
{
    struct fx *f = *state;
    struct rec rc = {0};
    struct proc *p = spawn_sh(f, "exit 3", &rc);
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_int_equal(proc_stop(p, 1000, rec_done, &rc), 0);
    assert_int_equal(rc.done, 0); /* never from inside proc_stop */
    assert_int_equal(proc_stop(p, 1000, rec_done, &rc), -EALREADY);
    assert_true(run_until_int(f, &rc.done, 1, DEADLINE_MS));
    assert_int_equal(rc.done, 1);
    assert_int_equal(rc.exits, 1);
    assert_int_equal(rc.st.code, 3);
    assert_int_equal(proc_kill_now(p), 0);

    /* Grace 0: SIGKILL at once. */
    struct rec r2 = {.want = "ready"};
    struct proc *p2 = spawn_sh(f, "trap '' TERM; echo ready; sleep 100", &r2);
    assert_true(run_until_flag(f, &r2.seen, DEADLINE_MS));
    assert_int_equal(proc_stop(p2, 0, NULL, NULL), 0);
    assert_int_equal(proc_get_state(p2), PROC_KILLING);
    assert_true(run_until_int(f, &r2.exits, 1, DEADLINE_MS));
    assert_int_equal(r2.st.signo, SIGKILL);
}

static void test_kill_now(void **state)
{
    struct fx *f = *state;
    struct rec rc = {.want = "ready"};
    struct proc *p = spawn_sh(f, "sleep 100 & echo ready; sleep 100", &rc);
    pid_t pgid = proc_pgid(p);
    assert_true(run_until_flag(f, &rc.seen, DEADLINE_MS));
    assert_int_equal(proc_stop(p, 5000, rec_done, &rc), 0);
    assert_int_equal(proc_kill_now(p), 0);
    assert_false(proc_running(p));
    struct proc_status st;
    assert_true(proc_exit_status(p, &st));
    assert_true(st.signo == SIGKILL || st.signo == SIGTERM);
    assert_int_equal(proc_kill_now(p), 0);
    assert_true(group_gone(f, pgid, DEADLINE_MS));
    /* No callback from kill_now, and the pending stop was cancelled. */
    assert_true(reactor_run_once(f->r, 50) >= 0);
    assert_true(reactor_run_once(f->r, 50) >= 0);
    assert_int_equal(rc.exits, 0);
    assert_int_equal(rc.done, 0);
}

/* Leader exits on its own: by default its group is swept; keep_group_on_exit leaves it. */
static void test_exit_sweeps_group(void **state)
{
    struct fx *f = *state;
    struct rec rc = {0};
    struct proc *p = spawn_sh(f, "sleep 100 & echo $!; exit 0", &rc);
    pid_t pgid = proc_pgid(p);
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    assert_true(group_gone(f, pgid, DEADLINE_MS));

    struct rec rk = {0};
    const char *argv[] = {"/bin/sh", "-c", "sleep 100 & echo $!; exit 0", NULL};
    struct proc_opts o = {.argv = argv, .keep_group_on_exit = true};
    struct proc *pk = spawn_opts(f, &o, &rk);
    assert_true(run_until_int(f, &rk.exits, 1, DEADLINE_MS));
    int gpid = 0;
    assert_int_equal(util_parse_int(rk.last, 1, INT32_MAX, &gpid), 0);
    /* Survived the leader, reparented to us (the subreaper). */
    pid_t ppid = 0;
    char st = pid_state(gpid, &ppid, NULL, NULL);
    assert_true(st != 0 && st != 'Z');
    assert_int_equal(ppid, getpid());
    assert_int_equal(kill(gpid, SIGKILL), 0);
    assert_true(group_gone(f, proc_pgid(pk), DEADLINE_MS));
}

/* ---- death of the parent, orphans ---------------------------------------------- */

static void test_pdeathsig(void **state)
{
    struct fx *f = *state;
    int pp[2];
    assert_int_equal(pipe2(pp, O_CLOEXEC), 0);
    pid_t helper = fork();
    assert_true(helper >= 0);
    if (helper == 0) {
        /* The helper: spawn a supervised child, report its pid, wait to be killed. */
        close(pp[0]);
        struct reactor *hr = reactor_new();
        const char *argv[] = {"sleep", "100", NULL};
        struct proc_opts o = {.argv = argv};
        struct proc *hp = NULL;
        if (!hr || proc_spawn(hr, &o, &hp) != 0)
            _exit(1);
        pid_t cpid = proc_pid(hp);
        if (write(pp[1], &cpid, sizeof(cpid)) != (ssize_t)sizeof(cpid))
            _exit(1);
        for (;;)
            pause();
    }
    close(pp[1]);
    struct pollfd pfd = {.fd = pp[0], .events = POLLIN};
    pid_t gpid = 0;
    int pr = poll(&pfd, 1, DEADLINE_MS);
    ssize_t n = pr == 1 ? read(pp[0], &gpid, sizeof(gpid)) : -1;
    close(pp[0]);
    if (n != (ssize_t)sizeof(gpid)) {
        kill(helper, SIGKILL);
        waitpid(helper, NULL, 0);
        fail_msg("helper did not report");
    }
    pid_t ppid = 0;
    char st = pid_state(gpid, &ppid, NULL, NULL);
    assert_true(st != 0 && st != 'Z');
    assert_int_equal(ppid, helper);

    assert_int_equal(kill(helper, SIGKILL), 0);
    assert_int_equal(waitpid(helper, NULL, 0), helper);
    /* The grandchild gets SIGKILL from PR_SET_PDEATHSIG; we are the subreaper it is
     * handed to, and the loop's SIGCHLD handler reaps it. */
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (kill(gpid, 0) == 0 && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    assert_int_equal(kill(gpid, 0), -1);
    assert_int_equal(errno, ESRCH);
    assert_true(f->orphans_reaped >= 1);
}

static void test_subreaper_reaps_orphan(void **state)
{
    struct fx *f = *state;
    /* The orphan outlives its parent (keep_group_on_exit), then exits by itself. */
    struct rec rc = {0};
    const char *argv[] = {"/bin/sh", "-c", "(sleep 0.3; exit 5) & echo $!; exit 0", NULL};
    struct proc_opts o = {.argv = argv, .keep_group_on_exit = true};
    spawn_opts(f, &o, &rc);
    assert_true(run_until_int(f, &rc.exits, 1, DEADLINE_MS));
    int orphan = 0;
    assert_int_equal(util_parse_int(rc.last, 1, INT32_MAX, &orphan), 0);
    pid_t ppid = 0;
    char st = pid_state(orphan, &ppid, NULL, NULL);
    assert_true(st != 0);
    assert_int_equal(ppid, getpid()); /* reparented to us */
    int before = f->orphans_reaped;
    int64_t deadline = util_mono_ms() + DEADLINE_MS;
    while (pid_state(orphan, NULL, NULL, NULL) != 0 && util_mono_ms() < deadline)
        assert_true(reactor_run_once(f->r, 20) >= 0);
    assert_int_equal(pid_state(orphan, NULL, NULL, NULL), 0); /* no zombie left */
    assert_true(f->orphans_reaped > before);

    /* A supervised child that is a zombie when proc_reap_orphans runs is not stolen:
     * its own exit path reports the real status. */
    struct rec rt = {0};
    struct proc *pt = spawn_sh(f, "exit 7", &rt);
    deadline = util_mono_ms() + DEADLINE_MS;
    while (pid_state(proc_pid(pt), NULL, NULL, NULL) != 'Z' && util_mono_ms() < deadline) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(pid_state(proc_pid(pt), NULL, NULL, NULL), 'Z');
    assert_int_equal(rt.exits, 0);
    assert_int_equal(proc_reap_orphans(), 0);
    assert_int_equal(rt.exits, 1);
    assert_int_equal(rt.st.code, 7);
    assert_int_equal(pid_state(proc_pid(pt), NULL, NULL, NULL), 0);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_ring_basics),
        T(test_ring_lines_start),
        T(test_logfile_rotation),
        T(test_exit_code_and_output),
        T(test_exit_by_signal),
        T(test_exec_failure),
        T(test_env_and_workdir),
        T(test_child_hygiene),
        T(test_tail_and_lines),
        T(test_rotated_log),
        T(test_flood),
        T(test_free_inside_callback),
        T(test_stop_term_ignored),
        T(test_stop_graceful),
        T(test_stop_kills_grandchildren),
        T(test_stop_already_dead),
        T(test_kill_now),
        T(test_exit_sweeps_group),
        T(test_pdeathsig),
        T(test_subreaper_reaps_orphan),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
