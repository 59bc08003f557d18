/* nm_engine — the engine service: one supervised process per endpoint.
 *
 * Spawn (proc: own session, PDEATHSIG, pidfd), death the instant it happens (the pidfd
 * fires, the group is swept), /health probing of every endpoint concurrently (§6.5),
 * the runtime-state -> endpoint-status mapping (§2.9), the local restart policy, and the
 * engines' output (in-memory tail, rotated file, passthrough to the NM's stdout). */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "nodemgr/engine_cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- pure rules -------------------------------------------------------------------------- */

static const char *const rt_names[] = {
    [NM_RT_STARTING] = "starting",   [NM_RT_RUNNING] = "running",   [NM_RT_READY] = "ready",
    [NM_RT_UNHEALTHY] = "unhealthy", [NM_RT_STOPPING] = "stopping", [NM_RT_STOPPED] = "stopped",
};

const char *nm_runtime_str(enum nm_runtime rt)
{
    return (unsigned)rt < ARRAY_LEN(rt_names) ? rt_names[rt] : "?";
}

enum wire_ep_status nm_status_from_runtime(enum nm_runtime rt, enum wire_ep_status prev)
{
    /* PreStop: a paused endpoint stays paused until /resume, whatever the probes say. */
    if (prev == WIRE_EP_PAUSED)
        return WIRE_EP_PAUSED;
    switch (rt) {
    case NM_RT_RUNNING:
        return WIRE_EP_WAIT2START;
    case NM_RT_READY:
        return WIRE_EP_NORMAL;
    case NM_RT_UNHEALTHY:
    case NM_RT_STOPPED:
        return WIRE_EP_ABNORMAL;
    case NM_RT_STARTING:
    case NM_RT_STOPPING:
        break;
    }
    return prev;
}

enum nm_runtime nm_runtime_after_probe(enum nm_runtime cur, enum nm_probe_result res,
                                       int64_t since_spawn_ms, int64_t startup_timeout_ms)
{
    if (res == NM_PROBE_OK)
        return NM_RT_READY;
    if (cur == NM_RT_STARTING && since_spawn_ms < startup_timeout_ms)
        return NM_RT_STARTING;
    return NM_RT_UNHEALTHY;
}

int64_t nm_backoff_next(int64_t cur_ms, int64_t initial_ms, int64_t max_ms)
{
    if (initial_ms < 1)
        initial_ms = 1;
    if (max_ms < initial_ms)
        max_ms = initial_ms;
    if (cur_ms <= 0)
        return initial_ms;
    if (cur_ms >= max_ms / 2)
        return max_ms;
    return cur_ms * 2;
}

/* ---- endpoints ----------------------------------------------------------------------------- */

struct nm_endpoint *nm_engine_find(struct nodemgr *nm, int64_t id)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        if (nm->eps[i]->ep.id == id)
            return nm->eps[i];
    return NULL;
}

static void endpoint_free(struct nm_endpoint *e)
{
    struct nodemgr *nm = e->nm;
    reactor_timer_stop(nm->r, &e->restart_timer);
    if (e->probe) {
        httpc_cancel(nm->probe_http, e->probe);
        e->probe = NULL;
    }
    proc_free(e->proc);
    wire_endpoint_release(&e->ep);
    free(e->log_path);
    free(e);
}

void nm_engine_free_endpoints(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        endpoint_free(nm->eps[i]);
    free(nm->eps);
    nm->eps = NULL;
    nm->n_eps = 0;
}

static void restart_fire(struct reactor *r, void *arg);

void nm_engine_set_endpoints(struct nodemgr *nm, const struct wire_start_cmd *cmd)
{
    nm_engine_free_endpoints(nm);
    nm->n_eps = cmd->n_endpoints;
    nm->eps = xcalloc(nm->n_eps ? nm->n_eps : 1, sizeof(*nm->eps));
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = xcalloc(1, sizeof(*e));
        e->nm = nm;
        e->index = i;
        wire_endpoint_copy(&e->ep, &cmd->endpoints[i]);
        e->status = cmd->endpoints[i].status;
        e->rt = NM_RT_STOPPED;
        reactor_timer_init(&e->restart_timer, restart_fire, e);
        nm->eps[i] = e;
    }
}

void nm_engine_set_status(struct nm_endpoint *e, enum wire_ep_status st, const char *cause)
{
    struct nodemgr *nm = e->nm;
    if (st == WIRE_EP_NORMAL) {
        e->ever_normal = true;
        nm_grace_end(nm, "endpoint_normal");
    }
    if (st == e->status)
        return;
    log_info("endpoint_status", LF_INT("endpoint_id", e->ep.id),
             LF_STR("from", wire_ep_status_str(e->status)), LF_STR("to", wire_ep_status_str(st)),
             LF_STR("cause", cause));
    e->status = st;
}

static void set_runtime(struct nm_endpoint *e, enum nm_runtime rt, const char *cause)
{
    struct nodemgr *nm = e->nm;
    if (rt != e->rt) {
        log_info("engine_state", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                 LF_STR("from", nm_runtime_str(e->rt)), LF_STR("to", nm_runtime_str(rt)),
                 LF_STR("cause", cause));
        if (rt == NM_RT_READY)
            e->ready_since_ms = util_mono_ms();
        else if (e->rt == NM_RT_READY)
            e->ready_since_ms = 0;
        e->rt = rt;
    }
    nm_engine_set_status(e, nm_status_from_runtime(rt, e->status), cause);
    nm_launch_runtime_changed(nm);
}

/* ---- output --------------------------------------------------------------------------- */

void nm_engine_passthrough_init(struct nodemgr *nm)
{
    nm->passthrough_fd = -1;
    struct stat st;
    if (fstat(STDOUT_FILENO, &st) < 0)
        return;
    /* A pipe consumer (the container runtime) that stalls must not stall the reactor:
     * reopen the pipe as a separate open file description we can make non-blocking
     * without touching fd 1 (shared with whoever started us). */
    if (S_ISFIFO(st.st_mode)) {
        int fd = open("/proc/self/fd/1", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0) {
            nm->passthrough_fd = fd;
            return;
        }
    }
    /* A socket (journald's stdout stream) gets per-call MSG_DONTWAIT instead. */
    nm->passthrough_socket = S_ISSOCK(st.st_mode);
    nm->passthrough_fd = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
}

static void passthrough_write(struct nodemgr *nm, const char *line, size_t len)
{
    if (nm->passthrough_fd < 0)
        return;
    struct iovec iov[2] = {{(void *)line, len}, {"\n", 1}};
    ssize_t n;
    if (nm->passthrough_socket) {
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
        n = sendmsg(nm->passthrough_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
        n = writev(nm->passthrough_fd, iov, 2);
    }
    if (n < 0 || (size_t)n != len + 1)
        nm->passthrough_dropped++;
}

static void on_engine_line(struct proc *p, enum proc_stream stream, const char *line, size_t len,
                           void *arg)
{
    (void)p;
    (void)stream;
    struct nm_endpoint *e = arg;
    passthrough_write(e->nm, line, len);
}

void nm_engine_banner(struct nodemgr *nm, const char *text)
{
    passthrough_write(nm, text, strlen(text));
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (!e->log_path)
            continue;
        int fd = open(e->log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            continue;
        struct iovec iov[2] = {{(void *)text, strlen(text)}, {"\n", 1}};
        if (writev(fd, iov, 2) < 0)
            log_warn("banner_write_failed", LF_STR("path", e->log_path));
        close(fd);
    }
}

/* ---- spawn and death ------------------------------------------------------------------------ */

static void schedule_restart(struct nm_endpoint *e, int64_t healthy_ms);

static void on_engine_exit(struct proc *p, const struct proc_status *st, void *arg)
{
    struct nm_endpoint *e = arg;
    struct nodemgr *nm = e->nm;
    int64_t now = util_mono_ms();
    e->has_last_exit = true;
    e->last_exit = *st;
    e->last_exit_wall_ms = util_wall_ms();
    e->last_exit_uptime_ms = proc_uptime_ms(p);
    if (e->probe) {
        httpc_cancel(nm->probe_http, e->probe);
        e->probe = NULL;
    }
    if (e->stop_requested || nm->shutting_down) {
        log_info("engine_stopped", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                 LF_INT("exit_code", st->code), LF_INT("signal", st->signo));
        e->rt = NM_RT_STOPPED;
        nm_launch_runtime_changed(nm);
        return;
    }
    metrics_counter_inc(nm->m.deaths);
    int64_t healthy_ms = e->ready_since_ms ? now - e->ready_since_ms : 0;
    log_error("engine_exited", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
              LF_INT("exit_code", st->code), LF_INT("signal", st->signo),
              LF_BOOL("core_dumped", st->core_dumped), LF_INT("uptime_ms", e->last_exit_uptime_ms),
              LF_BOOL("retired", e->retired));
    set_runtime(e, NM_RT_STOPPED, "process exited");
    if (e->retired)
        return;
    if (nm->cfg->restart_policy == NM_RESTART_LOCAL) {
        schedule_restart(e, healthy_ms);
        return;
    }
    /* A dead engine is a hard fact: the cold-start grace no longer protects the pod. */
    nm_grace_end(nm, "engine_died");
    nm_report_death(e, st, now);
}

static char *endpoint_log_path(struct nodemgr *nm, const struct nm_endpoint *e)
{
    const char *dir = nm->cfg->engine_log_dir;
    if (!dir || !*dir)
        return NULL;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        log_warn("engine_log_dir_unusable", LF_STR("dir", dir), LF_STR("error", strerror(errno)));
    return xasprintf("%s/engine-%lld.log", dir, (long long)e->ep.id);
}

/* Spawn the process of one endpoint from nm->launch. 0 or -errno (err set). */
static int spawn_one(struct nm_endpoint *e, struct wire_err *err)
{
    struct nodemgr *nm = e->nm;
    const struct wire_start_cmd *L = nm->launch;
    if (!L) {
        wire_err_set(err, "no start command recorded");
        return -EINVAL;
    }
    struct engine_launch l = {
        .role = L->role,
        .instance_id = L->instance_id,
        .endpoint = &e->ep,
        .endpoint_index = (int)e->index,
        .node_rank = (int)L->node_rank,
        .master_dp_ip = L->master_dp_ip,
        .d2d_peer_ips = L->has_d2d_peer_ips ? &L->d2d_peer_ips : NULL,
    };
    struct engine_cmd cmd;
    int rc = engine_cmd_build(nm->cfg, &l, &cmd, err);
    if (rc < 0)
        return rc;
    char *rendered = engine_cmd_render(&cmd);
    const char *devs = engine_cmd_getenv(&cmd, "ASCEND_RT_VISIBLE_DEVICES");
    log_info("engine_spawning", LF_INT("endpoint_id", e->ep.id), LF_STR("argv", rendered),
             LF_STR("visible_devices", devs));
    free(rendered);

    if (e->proc) {
        proc_free(e->proc);
        e->proc = NULL;
    }
    free(e->log_path);
    e->log_path = endpoint_log_path(nm, e);
    char name[48];
    snprintf(name, sizeof(name), "engine-%lld", (long long)e->ep.id);
    int max_line = nm->cfg->log_max_line_length;
    /* Services' environment for engines (the KV store's MMC_LOCAL_CONFIG_PATH) first,
     * so that engine_cmd's own variables win. */
    const char **envv = xcalloc(nm->engine_env.n + cmd.envc + 1, sizeof(*envv));
    size_t nenv = 0;
    for (size_t k = 0; k < nm->engine_env.n; k++)
        envv[nenv++] = nm->engine_env.items[k];
    for (size_t k = 0; k < cmd.envc; k++)
        envv[nenv++] = cmd.env[k];
    struct proc_opts o = {
        .argv = (const char *const *)cmd.argv,
        .env_overrides = envv,
        .name = name,
        .ring_bytes = NM_TAIL_RING_BYTES,
        .max_line = max_line > 0 && (size_t)max_line < NM_TAIL_RING_BYTES ? (size_t)max_line : 0,
        .log_path = e->log_path,
        .log_max_bytes = (size_t)nm->cfg->engine_log_rotation_bytes,
        .log_keep = (unsigned)nm->cfg->engine_log_rotation_count,
        .on_line = on_engine_line,
        .on_exit = on_engine_exit,
        .arg = e,
    };
    struct proc *p = NULL;
    rc = proc_spawn(nm->r, &o, &p);
    free(envv);
    if (rc < 0) {
        wire_err_set(err, "endpoint %lld: cannot start %s: %s", (long long)e->ep.id, cmd.argv[0],
                     strerror(-rc));
        log_error("engine_spawn_failed", LF_INT("endpoint_id", e->ep.id),
                  LF_STR("argv0", cmd.argv[0]), LF_STR("error", strerror(-rc)));
        engine_cmd_release(&cmd);
        return rc;
    }
    engine_cmd_release(&cmd);
    e->proc = p;
    e->pid = proc_pid(p);
    e->spawned_ms = util_mono_ms();
    e->spawns++;
    e->stop_requested = false;
    e->failed = false;
    e->ready_since_ms = 0;
    metrics_counter_inc(nm->m.spawns);
    log_info("engine_spawned", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
             LF_INT("port", wire_endpoint_port(&e->ep)), LF_BOOL("headless", e->ep.headless));
    e->rt = NM_RT_STARTING;
    /* Fix of §12.9: a fresh process starts a fresh story — `initial` until the probes
     * say otherwise, so "relaxed" status really means "recovering". */
    if (e->status != WIRE_EP_PAUSED)
        nm_engine_set_status(e, WIRE_EP_INITIAL, "spawned");
    return 0;
}

int nm_engine_spawn_all(struct nodemgr *nm, struct wire_err *err)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        reactor_timer_stop(nm->r, &e->restart_timer);
        e->restart_pending = false;
        if (e->retired)
            continue;
        if (e->proc && proc_running(e->proc)) {
            wire_err_set(err, "endpoint %lld still has a running engine (pid %d)",
                         (long long)e->ep.id, (int)e->pid);
            goto rollback;
        }
        if (spawn_one(e, err) < 0)
            goto rollback;
    }
    nm_launch_runtime_changed(nm);
    return 0;
rollback:
    /* All or nothing: a half-started instance is worse than none (§6.1). */
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (e->retired)
            continue;
        if (e->proc && proc_running(e->proc)) {
            e->stop_requested = true;
            proc_kill_now(e->proc);
        }
        e->rt = NM_RT_STOPPED;
        nm_engine_set_status(e, nm_status_from_runtime(NM_RT_STOPPED, e->status),
                             "launch rolled back");
    }
    return -EIO;
}

/* ---- local restart policy -------------------------------------------------------------------- */

static void restart_fire(struct reactor *r, void *arg)
{
    (void)r;
    struct nm_endpoint *e = arg;
    struct nodemgr *nm = e->nm;
    e->restart_pending = false;
    if (nm->shutting_down || e->retired || (e->proc && proc_running(e->proc)))
        return;
    e->window_starts++;
    metrics_counter_inc(nm->m.local_restarts);
    log_info("engine_local_restart", LF_INT("endpoint_id", e->ep.id),
             LF_INT("restart", e->window_starts), LF_INT("backoff_ms", e->backoff_ms));
    struct wire_err err = {{0}};
    if (spawn_one(e, &err) < 0) {
        set_runtime(e, NM_RT_STOPPED, "local restart failed");
        schedule_restart(e, 0);
        return;
    }
    nm_launch_runtime_changed(nm);
}

/* healthy_ms: how long the process that just died had been continuously ready. */
static void schedule_restart(struct nm_endpoint *e, int64_t healthy_ms)
{
    struct nodemgr *nm = e->nm;
    const struct nm_config *cfg = nm->cfg;
    int64_t now = util_mono_ms();
    /* Healthy long enough: the previous trouble is history. */
    if (healthy_ms >= nm_config_ms(cfg->restart_reset_after_sec)) {
        e->backoff_ms = 0;
        e->window_starts = 0;
    }
    if (cfg->restart_start_limit > 0 && e->window_starts >= cfg->restart_start_limit) {
        e->failed = true;
        log_error("engine_failed", LF_INT("endpoint_id", e->ep.id),
                  LF_INT("restarts", e->window_starts),
                  LF_STR("why", "restart_start_limit reached; not restarting again"));
        /* Now it is the Controller's (or the operator's) problem. */
        if (e->has_last_exit)
            nm_report_death(e, &e->last_exit, now);
        return;
    }
    e->backoff_ms = nm_backoff_next(e->backoff_ms, nm_config_ms(cfg->restart_backoff_initial_sec),
                                    nm_config_ms(cfg->restart_backoff_max_sec));
    e->restart_pending = true;
    log_info("engine_restart_scheduled", LF_INT("endpoint_id", e->ep.id),
             LF_INT("delay_ms", e->backoff_ms), LF_INT("restart", e->window_starts + 1));
    reactor_timer_start(nm->r, &e->restart_timer, e->backoff_ms, 0);
}

void nm_engine_reset_restart_state(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        reactor_timer_stop(nm->r, &e->restart_timer);
        e->restart_pending = false;
        e->backoff_ms = 0;
        e->window_starts = 0;
        e->failed = false;
    }
}

/* ---- group stop -------------------------------------------------------------------------------
 */

struct nm_stop_waiter {
    struct nm_stop_waiter *next;
    nm_done_fn done;
    void *arg;
};

static void run_stop_waiters(struct nodemgr *nm)
{
    struct nm_stop_waiter *w = nm->stop_waiters;
    nm->stop_waiters = NULL;
    while (w) {
        struct nm_stop_waiter *next = w->next;
        w->done(nm, w->arg);
        free(w);
        w = next;
    }
}

static void on_engine_stopped(struct proc *p, void *arg)
{
    (void)p;
    struct nm_endpoint *e = arg;
    struct nodemgr *nm = e->nm;
    if (nm->stops_pending > 0)
        nm->stops_pending--;
    if (nm->stops_pending == 0)
        run_stop_waiters(nm);
}

bool nm_engine_any_alive(const struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        if (nm->eps[i]->proc && proc_running(nm->eps[i]->proc))
            return true;
    return false;
}

void nm_engine_stop_all(struct nodemgr *nm, int64_t grace_ms, nm_done_fn done, void *arg)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        reactor_timer_stop(nm->r, &e->restart_timer);
        e->restart_pending = false;
        if (!e->proc || !proc_running(e->proc))
            continue;
        e->stop_requested = true;
        if (proc_get_state(e->proc) != PROC_RUNNING)
            continue; /* already stopping: counted by the first stop */
        log_info("engine_stopping", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid),
                 LF_INT("grace_ms", grace_ms));
        e->rt = NM_RT_STOPPING;
        if (e->probe) {
            httpc_cancel(nm->probe_http, e->probe);
            e->probe = NULL;
        }
        nm->stops_pending++;
        proc_stop(e->proc, grace_ms, on_engine_stopped, e);
    }
    if (nm->stops_pending == 0) {
        if (done)
            done(nm, arg);
        return;
    }
    if (done) {
        struct nm_stop_waiter *w = xcalloc(1, sizeof(*w));
        w->done = done;
        w->arg = arg;
        w->next = nm->stop_waiters;
        nm->stop_waiters = w;
    }
}

void nm_engine_kill_all_now(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        reactor_timer_stop(nm->r, &e->restart_timer);
        e->restart_pending = false;
        if (e->proc && proc_running(e->proc)) {
            e->stop_requested = true;
            log_warn("engine_killed", LF_INT("endpoint_id", e->ep.id), LF_INT("pid", e->pid));
            proc_kill_now(e->proc);
            e->rt = NM_RT_STOPPED;
        }
    }
    /* proc_kill_now cancels pending stops without their callbacks. */
    nm->stops_pending = 0;
    run_stop_waiters(nm);
}

/* ---- probing (§6.5) -----------------------------------------------------------------------------
 */

static void probe_send(struct nm_endpoint *e);

static void on_probe_done(const struct httpc_response *resp, void *arg)
{
    struct nm_endpoint *e = arg;
    struct nodemgr *nm = e->nm;
    e->probe = NULL;
    if (!e->proc || !proc_running(e->proc) || e->stop_requested)
        return;
    int attempts = nm->cfg->health.health_collector_timeout_retry_attempts;
    /* Only timeouts are retried (an answer, even a 503, is an answer). */
    if (resp->error == -ETIMEDOUT && e->probe_attempt < attempts) {
        e->probe_attempt++;
        probe_send(e);
        return;
    }
    bool ok = resp->error == 0 && resp->status >= 200 && resp->status < 300;
    if (!ok) {
        metrics_counter_inc(nm->m.probe_failures);
        log_debug("probe_failed", LF_INT("endpoint_id", e->ep.id), LF_INT("status", resp->status),
                  LF_STR("error", resp->error ? resp->error_text : ""));
    }
    enum nm_runtime rt =
        nm_runtime_after_probe(e->rt, ok ? NM_PROBE_OK : NM_PROBE_FAILED, util_mono_ms() - e->spawned_ms,
                               (int64_t)nm->cfg->health.startup_timeout * 1000);
    set_runtime(e, rt, ok ? "health ok" : "health failed");
}

static void probe_send(struct nm_endpoint *e)
{
    struct nodemgr *nm = e->nm;
    const struct nm_tls *t = &nm->cfg->infer_tls;
    bool tls = t->enable_tls;
    bool v6 = strchr(e->ep.ip, ':') != NULL;
    char *url = xasprintf("%s://%s%s%s:%d/health", tls ? "https" : "http", v6 ? "[" : "", e->ep.ip,
                          v6 ? "]" : "", wire_endpoint_port(&e->ep));
    struct httpc_tls ht = {
        .ca_file = t->ca_file && *t->ca_file ? t->ca_file : NULL,
        .cert_file = t->cert_file && *t->cert_file ? t->cert_file : NULL,
        .key_file = t->key_file && *t->key_file ? t->key_file : NULL,
    };
    int64_t timeout = (int64_t)nm->cfg->health.health_collector_timeout * 1000;
    struct httpc_opts o = {
        .url = url,
        .timeout_ms = timeout,
        .connect_timeout_ms = timeout,
        .max_response = 64 * 1024,
        .tls = tls ? &ht : NULL,
    };
    e->probe = httpc_request(nm->probe_http, &o, on_probe_done, e);
    free(url);
}

static void probe_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    if (nm->shutting_down)
        return;
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (e->retired || !e->proc || !proc_running(e->proc) || e->probe)
            continue;
        if (e->stop_requested || proc_get_state(e->proc) != PROC_RUNNING) {
            set_runtime(e, NM_RT_STOPPING, "stopping");
            continue;
        }
        if (e->ep.headless) {
            /* PCP followers serve no HTTP: alive is all we can know. */
            set_runtime(e, NM_RT_RUNNING, "headless alive");
            continue;
        }
        e->probe_attempt = 1;
        probe_send(e);
    }
}

void nm_engine_probes_start(struct nodemgr *nm)
{
    int64_t p = nm_probe_period_ms(nm);
    nm_timer_start(nm->r, &nm->probe_timer, probe_tick, nm, 0, p);
}

void nm_engine_probes_stop(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->probe_timer);
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (e->probe) {
            httpc_cancel(nm->probe_http, e->probe);
            e->probe = NULL;
        }
    }
}

void nm_engine_probes_reconfigure(struct nodemgr *nm)
{
    if (!reactor_timer_active(&nm->probe_timer))
        return;
    int64_t p = nm_probe_period_ms(nm);
    if (nm->probe_timer.interval_ms != p)
        reactor_timer_start(nm->r, &nm->probe_timer, p, p);
}

/* ---- status predicates
 * --------------------------------------------------------------------------- */

bool nm_engine_all_normal(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        if (nm->eps[i]->retired)
            continue;
        if (nm->eps[i]->status != WIRE_EP_NORMAL)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_none_abnormal(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        if (nm->eps[i]->retired)
            continue;
        if (nm->eps[i]->status == WIRE_EP_ABNORMAL)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_all_ready(const struct nodemgr *nm)
{
    size_t n = 0;
    for (size_t i = 0; i < nm->n_eps; i++) {
        const struct nm_endpoint *e = nm->eps[i];
        if (e->retired)
            continue;
        bool ok = e->ep.headless ? e->rt == NM_RT_RUNNING : e->rt == NM_RT_READY;
        if (!ok)
            return false;
        n++;
    }
    return n > 0;
}

bool nm_engine_any_stopped(const struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_eps; i++)
        if (!nm->eps[i]->retired && nm->eps[i]->rt == NM_RT_STOPPED)
            return true;
    return false;
}

void nm_engine_retire(struct nodemgr *nm, const int64_t *ids, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        struct nm_endpoint *e = nm_engine_find(nm, ids[k]);
        if (!e || e->retired)
            continue;
        e->retired = true;
        reactor_timer_stop(nm->r, &e->restart_timer);
        e->restart_pending = false;
        if (e->probe) {
            httpc_cancel(nm->probe_http, e->probe);
            e->probe = NULL;
        }
        log_info("endpoint_retired", LF_INT("endpoint_id", e->ep.id));
    }
}

/* ---- API view
 * --------------------------------------------------------------------------------------- */

json_t *nm_engine_list_json(struct nodemgr *nm)
{
    json_t *arr = json_array();
    int64_t now = util_mono_ms();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        bool alive = e->proc && proc_running(e->proc);
        json_t *o = json_pack("{s:I, s:i, s:s, s:i, s:b, s:s, s:s, s:i, s:b}", "id",
                              (json_int_t)e->ep.id, "index", (int)e->index, "ip", e->ep.ip, "port",
                              wire_endpoint_port(&e->ep), "headless", e->ep.headless, "state",
                              nm_runtime_str(e->rt), "status", wire_ep_status_str(e->status),
                              "restarts", e->spawns > 0 ? (int)e->spawns - 1 : 0, "alive", alive);
        json_object_set_new(o, "pid", alive ? json_integer(e->pid) : json_null());
        json_object_set_new(o, "uptime_seconds",
                            alive ? json_real((double)(now - e->spawned_ms) / 1000.0)
                                  : json_null());
        if (e->has_last_exit) {
            char ts[40];
            util_wall_iso8601(e->last_exit_wall_ms, ts, sizeof(ts));
            json_object_set_new(
                o, "last_exit",
                json_pack("{s:I, s:o, s:o, s:b, s:s, s:f}", "pid", (json_int_t)e->pid, "code",
                          e->last_exit.code >= 0 ? json_integer(e->last_exit.code) : json_null(),
                          "signal",
                          e->last_exit.signo > 0 ? json_integer(e->last_exit.signo) : json_null(),
                          "core_dumped", e->last_exit.core_dumped, "at", ts, "uptime_seconds",
                          (double)e->last_exit_uptime_ms / 1000.0));
        } else {
            json_object_set_new(o, "last_exit", json_null());
        }
        json_object_set_new(o, "retired", json_boolean(e->retired));
        json_object_set_new(o, "failed", json_boolean(e->failed));
        json_object_set_new(o, "restart_pending", json_boolean(e->restart_pending));
        json_object_set_new(o, "ever_normal", json_boolean(e->ever_normal));
        json_object_set_new(o, "log_file", e->log_path ? json_string(e->log_path) : json_null());
        json_array_append_new(arr, o);
    }
    return arr;
}

/* ---- the service vtable
 * ------------------------------------------------------------------------------ */

static int engine_create(struct nodemgr *nm, void **state)
{
    nm->has_engine = true;
    *state = nm;
    return 0;
}

static int engine_pull(struct nodemgr *nm, void *state, struct wire_err *err)
{
    (void)state;
    return nm_engine_spawn_all(nm, err);
}

static void engine_stop(struct nodemgr *nm, void *state, int64_t grace_ms, nm_done_fn done,
                        void *arg)
{
    (void)state;
    nm_engine_stop_all(nm, grace_ms, done, arg);
}

static void engine_kill_now(struct nodemgr *nm, void *state)
{
    (void)state;
    nm_engine_kill_all_now(nm);
}

static void engine_health_check(struct nodemgr *nm, void *state)
{
    (void)state;
    /* Deaths arrive through pidfds the instant they happen; this periodic pass only
     * catches what a lost wakeup would hide (a reaped leader still marked alive). */
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (e->proc && !proc_running(e->proc) && e->rt != NM_RT_STOPPED && !e->stop_requested)
            set_runtime(e, NM_RT_STOPPED, "health check: process gone");
    }
}

static void engine_destroy(struct nodemgr *nm, void *state)
{
    (void)state;
    nm_engine_free_endpoints(nm);
}

const struct nm_service_ops nm_engine_service_ops = {
    .name = "engine",
    .backend = "engine",
    .prepare_priority = -1,
    .create = engine_create,
    .pull = engine_pull,
    .stop = engine_stop,
    .kill_now = engine_kill_now,
    .health_check = engine_health_check,
    .destroy = engine_destroy,
};
