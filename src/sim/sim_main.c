/* motor engine-sim — process lifecycle of the engine simulator: arguments, model
 * "loading", worker children, signals, and the faults that end or freeze the process.
 * The HTTP surface is in sim_engine.c. */
#include "sim/sim.h"
#include "common/log.h"
#include "common/util.h"
#include "sim/sim_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#define SIM_KV_TICKETS 4096
#define SIM_KV_TTL_MS 120000
#define SIM_KV_SWEEP_MS 5000
#define SIM_WORKER_GRACE_MS 3000
#define SIM_END_FALLBACK_MS 1000 /* a process-ending fault acts even if its answer stalls */

const char *sim_fault_name(enum sim_fault f)
{
    switch (f) {
    case SIM_FAULT_UNHEALTHY:
        return "unhealthy";
    case SIM_FAULT_FT_DEAD:
        return "ft_dead";
    case SIM_FAULT_HANG:
        return "hang";
    case SIM_FAULT_ERROR:
        return "error";
    default:
        return "none";
    }
}

void sim_shutdown(struct sim *s, int code, const char *cause)
{
    if (s->phase == SIM_STOPPING)
        return;
    log_info("sim_stopping", LF_STR("cause", cause), LF_INT("exit_code", code),
             LF_INT("running", s->running.count));
    s->phase = SIM_STOPPING;
    s->exit_code = code;
    reactor_stop(s->r);
}

/* ---- faults that end or freeze the process ------------------------------------------- */

static void end_crash(struct sim *s)
{
    log_error("sim_crash", LF_STR("cause", "injected fault"), LF_INT("pid", getpid()));
    /* An abnormal death nobody can intercept; workers follow through PDEATHSIG. */
    kill(getpid(), SIGKILL);
    _exit(137);
}

static void end_exit0(struct sim *s)
{
    sim_shutdown(s, 0, "injected fault exit0");
}

/* Freeze the reactor thread: the kernel still accepts connections, nothing answers.
 * SIGTERM/SIGINT (blocked for the signalfd) are taken here directly so the process can
 * still be stopped, unless the fault asked to ignore them (then only SIGKILL works). */
static void end_hang(struct sim *s)
{
    log_warn("sim_hang", LF_INT("pid", getpid()),
             LF_BOOL("ignore_sigterm", s->hang_ignores_sigterm));
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig < 0)
            continue;
        if (!s->hang_ignores_sigterm)
            break;
        log_info("sim_hang_signal_ignored", LF_INT("signal", sig));
    }
    s->fault = SIM_FAULT_NONE;
    sim_shutdown(s, 0, "signal while hung");
}

static void on_end_timer(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    void (*fn)(struct sim *) = s->pending_end;
    s->pending_end = NULL;
    if (fn)
        fn(s);
}

int sim_fault_apply(struct sim *s, const char *mode, bool ignore_sigterm)
{
    enum sim_fault old = s->fault;
    void (*end)(struct sim *) = NULL;
    if (!strcmp(mode, "crash")) {
        end = end_crash;
    } else if (!strcmp(mode, "exit0")) {
        end = end_exit0;
    } else if (!strcmp(mode, "hang")) {
        end = end_hang;
        s->fault = SIM_FAULT_HANG;
        s->hang_ignores_sigterm = ignore_sigterm;
    } else if (!strcmp(mode, "unhealthy")) {
        s->fault = SIM_FAULT_UNHEALTHY;
    } else if (!strcmp(mode, "ft_dead")) {
        s->fault = SIM_FAULT_FT_DEAD;
    } else if (!strcmp(mode, "error")) {
        s->fault = SIM_FAULT_ERROR;
    } else if (!strcmp(mode, "recover") || !strcmp(mode, "none")) {
        s->fault = SIM_FAULT_NONE;
        s->ft_recovering = false;
        reactor_timer_stop(s->r, &s->ft_timer);
    } else {
        return -EINVAL;
    }
    if (!end) { /* a new mode: the old reason (e.g. a lost DP peer) no longer applies */
        free(s->fault_info);
        s->fault_info = NULL;
    }
    log_warn("sim_fault", LF_STR("mode", mode), LF_STR("previous", sim_fault_name(old)));
    if (end) {
        s->pending_end = end;
        reactor_timer_start(s->r, &s->end_timer, SIM_END_FALLBACK_MS, 0);
    }
    return 0;
}

static enum sim_mode quality_of(const char *mode)
{
    if (!strcmp(mode, "repeat"))
        return SIM_MODE_REPEAT;
    if (!strcmp(mode, "garbled"))
        return SIM_MODE_GARBLED;
    if (!strcmp(mode, "rare_chars"))
        return SIM_MODE_RARE;
    return SIM_MODE_GOOD;
}

int sim_fault_apply2(struct sim *s, const char *mode, bool ignore_sigterm, long tokens, long ms)
{
    bool known = true;
    if (quality_of(mode) != SIM_MODE_GOOD) {
        s->quality = quality_of(mode);
    } else if (!strcmp(mode, "stall")) {
        s->sf = SIM_SF_STALL;
        s->sf_after = tokens < 0 ? 0 : tokens;
    } else if (!strcmp(mode, "cut")) {
        s->sf = SIM_SF_CUT;
        s->sf_after = tokens < 0 ? 0 : tokens;
    } else if (!strcmp(mode, "crash_after_tokens")) {
        if (tokens < 0)
            return -ERANGE;
        s->sf = SIM_SF_CRASH;
        s->sf_after = tokens;
    } else if (!strcmp(mode, "metaserver_fail")) {
        s->meta_fault = SIM_META_FAIL;
    } else if (!strcmp(mode, "metaserver_delay")) {
        s->meta_fault = SIM_META_DELAY;
        s->meta_delay_ms = ms < 0 ? 1000 : (int)MOTOR_MIN(ms, 3600000L);
    } else {
        known = false;
    }
    if (known) {
        log_warn("sim_fault", LF_STR("mode", mode), LF_INT("after_tokens", tokens),
                 LF_INT("ms", ms));
        return 0;
    }
    int rc = sim_fault_apply(s, mode, ignore_sigterm);
    if (!rc && (!strcmp(mode, "recover") || !strcmp(mode, "none"))) {
        s->quality = SIM_MODE_GOOD;
        bool was_stalled = s->sf == SIM_SF_STALL;
        s->sf = SIM_SF_NONE;
        s->sf_after = -1;
        s->meta_fault = SIM_META_OK;
        if (was_stalled && s->httpd)
            sim_engine_resume(s);
    }
    return rc;
}

enum sim_stream_fault sim_stream_fault_now(const struct sim *s)
{
    return s->sf != SIM_SF_NONE && s->sf_after == 0 ? s->sf : SIM_SF_NONE;
}

enum sim_stream_fault sim_token_sent(struct sim *s)
{
    s->tokens_total++;
    if (s->args.crash_after_tokens > 0 && s->tokens_total >= (uint64_t)s->args.crash_after_tokens)
        return SIM_SF_CRASH;
    if (s->sf != SIM_SF_NONE && s->sf_after > 0 && --s->sf_after == 0)
        return s->sf;
    return SIM_SF_NONE;
}

/* ---- workers ----------------------------------------------------------------------------- */

/* A worker is a forked copy that only waits: it stands for EngineCore / TP worker
 * processes, which share the engine's process group and must not outlive it. */
static void worker_body(int index, pid_t parent)
{
    /* Die with the parent even if it is SIGKILLed; it may already be gone. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(0);
    char name[32]; /* the kernel keeps the first 15 bytes */
    snprintf(name, sizeof(name), "sim-worker-%d", index);
    prctl(PR_SET_NAME, name);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    log_info("sim_worker_started", LF_INT("index", index), LF_INT("pid", getpid()),
             LF_INT("parent", parent));
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig == SIGTERM || sig == SIGINT) {
            log_info("sim_worker_exit", LF_INT("index", index), LF_INT("pid", getpid()),
                     LF_INT("signal", sig));
            _exit(0);
        }
    }
}

/* Fork before the reactor, client or server exist: the children inherit no fds or
 * threads of ours. */
static int spawn_workers(struct sim *s)
{
    int n = s->args.workers;
    s->workers = xcalloc((size_t)(n > 0 ? n : 1), sizeof(*s->workers));
    pid_t self = getpid();
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            int e = errno;
            log_error("sim_worker_fork_failed", LF_STR("error", strerror(e)));
            return -e;
        }
        if (pid == 0)
            worker_body(i, self);
        int fd = pidfd_open(pid, 0);
        s->workers[i].pid = pid;
        s->workers[i].pidfd = fd;
        s->n_workers = i + 1;
        if (fd < 0) {
            int e = errno;
            log_error("sim_worker_pidfd_failed", LF_STR("error", strerror(e)));
            return -e;
        }
    }
    return 0;
}

static struct sim_worker *worker_by_fd(struct sim *s, int fd)
{
    for (int i = 0; i < s->n_workers; i++)
        if (s->workers[i].pidfd == fd)
            return &s->workers[i];
    return NULL;
}

/* Reap a worker whose pidfd is readable; returns how it ended for the log. */
static void reap_worker(struct sim_worker *w, const char *why)
{
    siginfo_t info;
    memset(&info, 0, sizeof(info));
    if (waitid(P_PIDFD, (id_t)w->pidfd, &info, WEXITED | WNOHANG) == 0 && info.si_pid != 0) {
        bool signaled = info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED;
        log_info("sim_worker_reaped", LF_INT("pid", w->pid), LF_STR("why", why),
                 LF_INT(signaled ? "signal" : "exit_code", info.si_status));
    }
    close(w->pidfd);
    w->pidfd = -1;
}

static void on_worker_exit(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct sim *s = arg;
    struct sim_worker *w = worker_by_fd(s, fd);
    reactor_del_fd(r, fd);
    if (!w) {
        close(fd);
        return;
    }
    pid_t pid = w->pid;
    reap_worker(w, "exited");
    if (s->phase != SIM_STOPPING) {
        /* Like vLLM when EngineCore dies: the engine cannot serve any more. */
        log_error("sim_worker_died", LF_INT("pid", pid),
                  LF_STR("effect", "engine exits, as vLLM does when a core process dies"));
        sim_shutdown(s, 1, "worker died");
    }
}

/* SIGTERM every live worker, wait up to the grace, SIGKILL the rest, reap all. */
static void stop_workers(struct sim *s)
{
    int alive = 0;
    for (int i = 0; i < s->n_workers; i++) {
        struct sim_worker *w = &s->workers[i];
        if (w->pidfd < 0)
            continue;
        if (s->r && reactor_has_fd(s->r, w->pidfd))
            reactor_del_fd(s->r, w->pidfd);
        pidfd_send_signal(w->pidfd, SIGTERM, NULL, 0);
        alive++;
    }
    int64_t deadline = util_mono_ms() + SIM_WORKER_GRACE_MS;
    while (alive > 0) {
        struct pollfd pfd[64];
        struct sim_worker *who[64];
        int n = 0;
        for (int i = 0; i < s->n_workers && n < 64; i++) {
            if (s->workers[i].pidfd >= 0) {
                pfd[n] = (struct pollfd){.fd = s->workers[i].pidfd, .events = POLLIN};
                who[n++] = &s->workers[i];
            }
        }
        int64_t left = deadline - util_mono_ms();
        if (n == 0 || left <= 0)
            break;
        if (poll(pfd, (nfds_t)n, (int)left) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            if (pfd[i].revents) {
                reap_worker(who[i], "stopped");
                alive--;
            }
        }
    }
    for (int i = 0; i < s->n_workers; i++) {
        struct sim_worker *w = &s->workers[i];
        if (w->pidfd < 0)
            continue;
        log_warn("sim_worker_kill", LF_INT("pid", w->pid),
                 LF_STR("why", "did not exit within the grace period"));
        pidfd_send_signal(w->pidfd, SIGKILL, NULL, 0);
        struct pollfd pfd = {.fd = w->pidfd, .events = POLLIN};
        poll(&pfd, 1, 1000);
        reap_worker(w, "killed");
    }
}

/* ---- timers and signals ---------------------------------------------------------------- */

static void on_loaded(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    if (s->phase != SIM_LOADING)
        return;
    if (s->args.fail_load) {
        log_error("sim_load_failed", LF_STR("model", s->args.model),
                  LF_STR("why", "--fail-load: simulated model loading failure"));
        sim_shutdown(s, 1, "model load failed");
        return;
    }
    s->phase = SIM_READY;
    if (s->args.headless)
        log_info("sim_ready", LF_BOOL("headless", true), LF_STR("engine_id", s->engine_id),
                 LF_STR("model", s->args.model), LF_INT("dp_rank", s->args.dp_rank),
                 LF_INT("pid", getpid()), LF_INT("load_ms", reactor_now(r) - s->start_ms));
    else
        log_info("sim_ready", LF_INT("port", s->port), LF_STR("host", s->args.host),
                 LF_STR("engine_id", s->engine_id), LF_STR("model", s->args.model),
                 LF_INT("dp_rank", s->args.dp_rank), LF_INT("pid", getpid()),
                 LF_BOOL("tls", s->args.ssl_certfile != NULL),
                 LF_INT("load_ms", reactor_now(r) - s->start_ms));
}

static void on_crash_timer(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    log_error("sim_crash", LF_STR("cause", "--crash-after"), LF_DBL("after_s", s->args.crash_after),
              LF_INT("pid", getpid()));
    kill(getpid(), SIGKILL);
    _exit(137);
}

static void on_kv_sweep(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    size_t n = sim_kv_expire(s->kv, reactor_now(r));
    if (n)
        log_info("sim_kv_tickets_expired", LF_INT("count", n));
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct sim *s = arg;
    if (signo == SIGHUP) {
        log_info("sim_signal_ignored", LF_STR("signal", "SIGHUP"));
        return;
    }
    log_info("sim_signal", LF_STR("signal", signo == SIGTERM ? "SIGTERM" : "SIGINT"));
    sim_shutdown(s, 0, signo == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* ---- main ------------------------------------------------------------------------------ */

static void make_engine_id(struct sim *s)
{
    if (s->args.kv_engine_id)
        s->engine_id = xasprintf("%s-dp%d", s->args.kv_engine_id, s->args.dp_rank);
    else
        s->engine_id =
            xasprintf("sim-%s-%u-dp%d", s->args.host, (unsigned)s->port, s->args.dp_rank);
}

static bool env_true(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

/* The prefix cache and, with --kv-events-config, its event publisher. */
static int start_cache(struct sim *s)
{
    if (s->args.kv_events_config) {
        struct sim_kvev_config kc;
        char msg[160];
        if (sim_kvev_parse_config(s->args.kv_events_config, &kc, msg, sizeof(msg)))
            return -EINVAL; /* validated with the arguments already */
        struct sim_kvev_opts ko = {
            .dp_rank = s->args.dp_rank,
            .int_hashes = env_true("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"),
            .map_encoding = s->args.kv_events_encoding &&
                            !strcmp(s->args.kv_events_encoding, "map")};
        bool failed;
        s->kvev = sim_kvev_start(s->r, &kc, &ko, &failed);
        sim_kvev_config_release(&kc);
        if (failed)
            return -EADDRINUSE;
        if (s->kvev && !s->args.prefix_caching)
            log_warn("sim_kv_events_without_prefix_caching",
                     LF_STR("why", "--no-enable-prefix-caching: no blocks are cached, so no "
                                   "BlockStored events"));
    }
    if (s->args.prefix_hash_algo && strcmp(s->args.prefix_hash_algo, "sha256_cbor") != 0)
        log_info("sim_flag_ignored", LF_STR("arg", "--prefix-caching-hash-algo"),
                 LF_STR("value", s->args.prefix_hash_algo),
                 LF_STR("why", "the simulator always hashes blocks with sha256_cbor"));
    if (!s->args.prefix_caching)
        return 0;
    uint8_t none[SIM_CACHE_HASH_LEN];
    sim_cache_none_hash(getenv("PYTHONHASHSEED"), none);
    s->cache = sim_cache_new((size_t)s->args.num_gpu_blocks, s->args.block_size, none,
                             s->kvev ? sim_kvev_on_cache_event : NULL, s->kvev);
    return s->cache ? 0 : -EINVAL;
}

static void sim_release(struct sim *s)
{
    sim_engine_stop(s);
    sim_kvev_free(s->kvev);
    s->kvev = NULL;
    sim_cache_free(s->cache);
    s->cache = NULL;
    sim_dp_free(s);
    stop_workers(s);
    if (s->r) {
        reactor_timer_stop(s->r, &s->load_timer);
        reactor_timer_stop(s->r, &s->crash_timer);
        reactor_timer_stop(s->r, &s->kv_timer);
        reactor_timer_stop(s->r, &s->end_timer);
    }
    reactor_free(s->r);
    sim_kv_free(s->kv);
    metrics_registry_free(s->metrics);
    free(s->workers);
    free(s->engine_id);
    free(s->kv_host);
    free(s->ft_last_request_id);
    free(s->ft_instruction);
    free(s->fault_info);
    sim_args_release(&s->args);
}

int sim_main(int argc, char **argv)
{
    log_set_component("engine-sim");
    struct sim sim;
    struct sim *s = &sim;
    memset(s, 0, sizeof(*s));
    list_init(&s->waiting.head);
    list_init(&s->fetching.head);
    list_init(&s->running.head);
    char err[256];
    if (sim_args_parse(&s->args, argc, argv, err, sizeof(err))) {
        fprintf(stderr, "engine-sim: %s\n(see 'motor engine-sim --help')\n", err);
        return 2;
    }
    if (s->args.help) {
        sim_args_usage(stdout);
        sim_args_release(&s->args);
        return 0;
    }
    enum log_level lvl;
    if (s->args.log_level && log_parse_level(s->args.log_level, &lvl) == 0)
        log_set_level(lvl);
    for (size_t i = 0; i < s->args.n_ignored; i++)
        log_info("sim_flag_ignored", LF_STR("arg", s->args.ignored[i]));
    const char *env_fault = getenv("MOTOR_SIM_FAULT");
    if (!s->args.fault && env_fault && *env_fault)
        s->args.fault = xstrdup(env_fault);

    int rc = 0;
    s->exit_code = 1;
    s->start_ms = util_mono_ms();
    s->sf_after = -1;
    util_raise_nofile_limit();
    s->start_wall_ms = util_wall_ms();
    if (getrandom(&s->id_base, sizeof(s->id_base), 0) != sizeof(s->id_base))
        s->id_base = (uint64_t)util_wall_ms() ^ ((uint64_t)getpid() << 32);
    s->kv = sim_kv_new(SIM_KV_TICKETS, SIM_KV_TTL_MS, 1 + (int64_t)(s->id_base % 1000000) * 1000);
    if ((rc = spawn_workers(s)))
        goto out;

    s->r = reactor_new();
    if (!s->r) {
        log_error("sim_reactor_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
    if ((rc = reactor_watch_signals(s->r, sigs, ARRAY_LEN(sigs), on_signal, s)))
        goto out;
    for (int i = 0; i < s->n_workers; i++)
        reactor_add_fd(s->r, s->workers[i].pidfd, EPOLLIN, on_worker_exit, s);
    reactor_timer_init(&s->load_timer, on_loaded, s);
    reactor_timer_init(&s->crash_timer, on_crash_timer, s);
    reactor_timer_init(&s->kv_timer, on_kv_sweep, s);
    reactor_timer_init(&s->end_timer, on_end_timer, s);
    reactor_timer_init(&s->ft_timer, NULL, s);
    reactor_timer_init(&s->dying_timer, NULL, s);
    sim_metrics_init(s);

    s->phase = SIM_LOADING;
    if (s->args.headless) {
        make_engine_id(s);
        log_info("sim_headless", LF_STR("engine_id", s->engine_id), LF_INT("pid", getpid()),
                 LF_INT("dp_rank", s->args.dp_rank), LF_INT("node_rank", s->args.node_rank),
                 LF_STR("why", "headless: no HTTP server, alive until signalled"));
    } else {
        s->httpc = httpc_new(s->r);
        if (!s->httpc) {
            log_error("sim_httpc_failed", LF_STR("error", strerror(errno)));
            goto out;
        }
        if ((rc = sim_engine_start(s)))
            goto out;
        if ((rc = start_cache(s)))
            goto out;
        make_engine_id(s);
        sim_dp_start(s);
        log_info("sim_listening", LF_INT("port", s->port), LF_STR("host", s->args.host),
                 LF_STR("engine_id", s->engine_id), LF_INT("pid", getpid()),
                 LF_DBL("load_seconds", s->args.load_seconds), LF_INT("workers", s->n_workers),
                 LF_BOOL("ft", s->args.ft),
                 LF_STR("kv_role", s->args.kv_role ? s->args.kv_role : NULL));
    }
    reactor_timer_start(s->r, &s->load_timer, (int64_t)(s->args.load_seconds * 1000.0), 0);
    if (s->args.crash_after >= 0)
        reactor_timer_start(s->r, &s->crash_timer, (int64_t)(s->args.crash_after * 1000.0), 0);
    reactor_timer_start(s->r, &s->kv_timer, SIM_KV_SWEEP_MS, SIM_KV_SWEEP_MS);
    if (s->args.fault) {
        sim_fault_apply2(s, s->args.fault, false, -1, -1);
        if (s->pending_end) /* hang from the start: act on the first iteration */
            reactor_timer_start(s->r, &s->end_timer, 0, 0);
    }

    rc = reactor_run(s->r);
    if (rc)
        log_error("sim_reactor_error", LF_STR("error", strerror(-rc)));
out:
    if (s->phase != SIM_STOPPING && rc)
        s->exit_code = 1;
    int code = s->exit_code;
    sim_release(s);
    log_info("sim_exit", LF_INT("exit_code", code), LF_INT("pid", getpid()));
    return code;
}
