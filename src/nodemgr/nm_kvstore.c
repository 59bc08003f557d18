/* nm_kvstore — the kv_store service (§2.6, §2.7): memcache / mooncake.
 *
 * What upstream's KV services do for the node manager, reduced to what a supervisor
 * needs and made explicit by configuration:
 *   prepare  (before every engine launch and relaunch): memcache exports
 *            MMC_LOCAL_CONFIG_PATH = kv_cache_store_config.local_config_path to the
 *            engines when that file exists (through nm->engine_env, not setenv: the
 *            environment of a process with library threads is not ours to mutate).
 *   pull     (after the engines in combined mode; at boot in separated mode): start the
 *            KV local service from kv_cache_store_config.local_service_command (Motor's
 *            argv; upstream hard-codes `python -m …memcache.worker` or
 *            `mooncake_store_service`). No command => nothing to run (in-process store).
 *            Idempotent: a running service is left alone (start commands repeat).
 *   health   (every daemon_loop_interval): a service that died is restarted in place,
 *            unless $MOTOR_RESTART_LOCAL_SERVICE is 0/false/no/off (default "1"). The
 *            death itself is known at once (pidfd) and logged; the restart waits for the
 *            tick, which bounds a crash loop to one spawn per interval.
 *   stop     SIGTERM to the service's process group, stop_grace_seconds, SIGKILL, sweep
 *            (upstream: SIGKILL and a 5 s wait).
 * The service process is spawned through proc like an engine (own session,
 * PR_SET_PDEATHSIG, output into a tail ring and, with engine_log_dir, kv-store.log).
 * GET /node-manager/kv-store shows its state; .../kv-store/logs?tail=N its output.
 *
 * Not done here: mooncake's generated store config (store_mode standalone) and the
 * A3-only rule for memcache's standalone worker — both are the command's business. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define KV_TAIL_RING_BYTES (64u * 1024u)
#define KV_TAIL_DEFAULT_LINES 100
#define KV_EXIT_TAIL_LINES 5
#define KV_ENV_NAME "MMC_LOCAL_CONFIG_PATH"

struct kv_waiter {
    struct kv_waiter *next;
    nm_done_fn done;
    void *arg;
};

struct nm_kv {
    struct nodemgr *nm;
    struct proc *proc; /* current or last process, NULL before the first spawn */
    pid_t pid;
    bool wanted;   /* pulled and not stopped: keep it running */
    bool stopping; /* a graceful stop is in progress */
    bool restart_refused_logged;
    unsigned spawns;
    int64_t spawned_ms;
    bool has_last_exit;
    struct proc_status last_exit;
    int64_t last_exit_wall_ms;
    int64_t last_exit_uptime_ms;
    char *log_path;
    struct kv_waiter *waiters; /* stop() callers waiting for the process to go */
};

static const char *backend_str(const struct nm_config *c)
{
    return c->kv.backend == NM_KV_MOONCAKE ? "mooncake" : "memcache";
}

static const char *mode_str(const struct nm_config *c)
{
    return c->kv.mode == NM_KV_SEPARATED ? "separated" : "combined";
}

static bool kv_running(const struct nm_kv *kv)
{
    return kv->proc && proc_running(kv->proc);
}

/* $MOTOR_RESTART_LOCAL_SERVICE (captured at config load): default on. */
static bool restart_enabled(const struct nm_config *c)
{
    const char *v = nm_config_env(c, "MOTOR_RESTART_LOCAL_SERVICE");
    if (!v)
        return true;
    static const char *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < ARRAY_LEN(off); i++)
        if (strcasecmp(v, off[i]) == 0)
            return false;
    return true;
}

/* ---- prepare: the engines' environment ------------------------------------------------ */

static void engine_env_set(struct nodemgr *nm, const char *name, const char *value)
{
    struct wire_strlist *l = &nm->engine_env;
    size_t klen = strlen(name);
    size_t w = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (strncmp(l->items[i], name, klen) == 0 && l->items[i][klen] == '=')
            free(l->items[i]);
        else
            l->items[w++] = l->items[i];
    }
    l->n = w;
    if (value) {
        char *kv = xasprintf("%s=%s", name, value);
        wire_strlist_push(l, kv);
        free(kv);
    }
}

/* Memcache's prepare: engines find the local store config through MMC_LOCAL_CONFIG_PATH
 * when the file is there; otherwise they use their defaults (and we say so). */
static void prepare_env(struct nodemgr *nm)
{
    const struct nm_config *c = nm->cfg;
    if (c->kv.backend != NM_KV_MEMCACHE) {
        engine_env_set(nm, KV_ENV_NAME, NULL);
        return;
    }
    const char *path = c->kv.local_config_path;
    if (path && *path && access(path, R_OK) == 0) {
        engine_env_set(nm, KV_ENV_NAME, path);
        log_info("kv_engine_env", LF_STR("name", KV_ENV_NAME), LF_STR("value", path));
    } else {
        engine_env_set(nm, KV_ENV_NAME, NULL);
        log_info("kv_engine_env_skipped", LF_STR("name", KV_ENV_NAME), LF_STR("path", path),
                 LF_STR("why", "local_config_path is not a readable file"));
    }
}

/* ---- the local service process ---------------------------------------------------------- */

static void run_waiters(struct nm_kv *kv)
{
    struct kv_waiter *w = kv->waiters;
    kv->waiters = NULL;
    while (w) {
        struct kv_waiter *next = w->next;
        nm_done_fn done = w->done;
        void *arg = w->arg;
        free(w);
        if (done)
            done(kv->nm, arg);
        w = next;
    }
}

static void on_kv_exit(struct proc *p, const struct proc_status *st, void *arg)
{
    struct nm_kv *kv = arg;
    struct nodemgr *nm = kv->nm;
    kv->has_last_exit = true;
    kv->last_exit = *st;
    kv->last_exit_wall_ms = util_wall_ms();
    kv->last_exit_uptime_ms = proc_uptime_ms(p);
    if (kv->stopping || !kv->wanted || nm_shutting_down(nm)) {
        log_info("kv_service_stopped", LF_INT("pid", kv->pid), LF_INT("exit_code", st->code),
                 LF_INT("signal", st->signo));
        return;
    }
    char *tail = proc_tail(p, KV_EXIT_TAIL_LINES);
    log_error("kv_service_exited", LF_INT("pid", kv->pid), LF_INT("exit_code", st->code),
              LF_INT("signal", st->signo), LF_INT("uptime_ms", kv->last_exit_uptime_ms),
              LF_BOOL("will_restart", restart_enabled(nm->cfg)), LF_STR("tail", tail));
    free(tail);
}

static void on_kv_stopped(struct proc *p, void *arg)
{
    (void)p;
    struct nm_kv *kv = arg;
    kv->stopping = false;
    run_waiters(kv);
}

static int kv_spawn(struct nm_kv *kv, struct wire_err *err)
{
    struct nodemgr *nm = kv->nm;
    const struct nm_config *c = nm->cfg;
    const struct wire_strlist *cmd = &c->kv.local_service_command;
    if (cmd->n == 0) {
        wire_err_set(err, "kv_cache_store_config.local_service_command is empty");
        return -EINVAL;
    }
    const char **argv = xcalloc(cmd->n + 1, sizeof(*argv));
    for (size_t i = 0; i < cmd->n; i++)
        argv[i] = cmd->items[i];
    free(kv->log_path);
    kv->log_path = NULL;
    if (c->engine_log_dir && *c->engine_log_dir) {
        if (mkdir(c->engine_log_dir, 0755) < 0 && errno != EEXIST)
            log_warn("kv_log_dir_unusable", LF_STR("dir", c->engine_log_dir),
                     LF_STR("error", strerror(errno)));
        kv->log_path = xasprintf("%s/kv-store.log", c->engine_log_dir);
    }
    /* The service sees what the engines see (wire_strlist is not NULL-terminated). */
    const char **envv = xcalloc(nm->engine_env.n + 1, sizeof(*envv));
    for (size_t i = 0; i < nm->engine_env.n; i++)
        envv[i] = nm->engine_env.items[i];
    struct proc_opts o = {
        .argv = argv,
        .env_overrides = envv,
        .name = "kv-store",
        .ring_bytes = KV_TAIL_RING_BYTES,
        .log_path = kv->log_path,
        .log_max_bytes = (size_t)c->engine_log_rotation_bytes,
        .log_keep = (unsigned)c->engine_log_rotation_count,
        .on_exit = on_kv_exit,
        .arg = kv,
    };
    proc_free(kv->proc);
    kv->proc = NULL;
    struct proc *p = NULL;
    int rc = proc_spawn(nm->r, &o, &p);
    free(envv);
    free(argv);
    if (rc < 0) {
        wire_err_set(err, "cannot start the KV local service %s: %s", cmd->items[0], strerror(-rc));
        log_error("kv_service_spawn_failed", LF_STR("argv0", cmd->items[0]),
                  LF_STR("error", strerror(-rc)));
        return rc;
    }
    kv->proc = p;
    kv->pid = proc_pid(p);
    kv->spawned_ms = util_mono_ms();
    kv->spawns++;
    kv->restart_refused_logged = false;
    log_info("kv_service_spawned", LF_INT("pid", kv->pid), LF_STR("argv0", cmd->items[0]),
             LF_INT("spawns", kv->spawns), LF_STR("backend", backend_str(c)),
             LF_STR("mode", mode_str(c)));
    return 0;
}

/* ---- the vtable -------------------------------------------------------------------------- */

static int kv_create(struct nodemgr *nm, void **state)
{
    struct nm_kv *kv = xcalloc(1, sizeof(*kv));
    kv->nm = nm;
    nm->kv = kv;
    *state = kv;
    const struct nm_config *c = nm->cfg;
    log_info("kv_store_active", LF_STR("backend", backend_str(c)), LF_STR("mode", mode_str(c)),
             LF_INT("local_service_command_args", c->kv.local_service_command.n),
             LF_STR("local_service_mode", c->kv.local_service_mode));
    return 0;
}

static int kv_prepare(struct nodemgr *nm, void *state, int endpoints_count)
{
    (void)state;
    (void)endpoints_count;
    prepare_env(nm);
    return 0;
}

static int kv_pull(struct nodemgr *nm, void *state, struct wire_err *err)
{
    struct nm_kv *kv = state;
    if (nm->cfg->kv.local_service_command.n == 0) {
        log_info("kv_service_none", LF_STR("why", "no local_service_command: in-process store"));
        return 0;
    }
    kv->wanted = true;
    if (kv_running(kv))
        return 0;
    if (!nm->has_engine)
        prepare_env(nm); /* separated mode: no start command ran prepare */
    return kv_spawn(kv, err);
}

static void kv_stop(struct nodemgr *nm, void *state, int64_t grace_ms, nm_done_fn done, void *arg)
{
    struct nm_kv *kv = state;
    kv->wanted = false;
    if (!kv_running(kv)) {
        if (done)
            done(nm, arg);
        return;
    }
    struct kv_waiter *w = xcalloc(1, sizeof(*w));
    w->done = done;
    w->arg = arg;
    w->next = kv->waiters;
    kv->waiters = w;
    if (kv->stopping)
        return; /* the stop in progress answers every waiter */
    kv->stopping = true;
    log_info("kv_service_stopping", LF_INT("pid", kv->pid), LF_INT("grace_ms", grace_ms));
    proc_stop(kv->proc, grace_ms, on_kv_stopped, kv);
}

static void kv_kill_now(struct nodemgr *nm, void *state)
{
    (void)nm;
    struct nm_kv *kv = state;
    kv->wanted = false;
    if (kv_running(kv)) {
        log_info("kv_service_killed", LF_INT("pid", kv->pid));
        proc_kill_now(kv->proc);
    }
    /* proc_kill_now cancels a pending stop without its callback: answer the waiters. */
    kv->stopping = false;
    run_waiters(kv);
}

static void kv_health_check(struct nodemgr *nm, void *state)
{
    struct nm_kv *kv = state;
    if (!kv->wanted || kv->stopping || nm_shutting_down(nm) || kv_running(kv))
        return;
    if (!restart_enabled(nm->cfg)) {
        if (!kv->restart_refused_logged)
            log_warn("kv_service_not_restarted", LF_STR("why", "MOTOR_RESTART_LOCAL_SERVICE"));
        kv->restart_refused_logged = true;
        return;
    }
    log_info("kv_service_restarting", LF_INT("restarts", kv->spawns));
    struct wire_err err = {{0}};
    if (kv_spawn(kv, &err) < 0)
        log_warn("kv_service_restart_failed", LF_STR("error", err.msg));
}

static void kv_destroy(struct nodemgr *nm, void *state)
{
    struct nm_kv *kv = state;
    if (!kv)
        return;
    proc_free(kv->proc);
    kv->proc = NULL;
    kv->stopping = false;
    /* Waiters left at destroy belong to a shutdown that is over: drop them. */
    while (kv->waiters) {
        struct kv_waiter *w = kv->waiters;
        kv->waiters = w->next;
        free(w);
    }
    free(kv->log_path);
    free(kv);
    if (nm->kv == kv)
        nm->kv = NULL;
    wire_strlist_release(&nm->engine_env);
}

const struct nm_service_ops nm_kv_memcache_service_ops = {
    .name = "kv_store",
    .backend = "memcache",
    .prepare_priority = 10,
    .create = kv_create,
    .prepare = kv_prepare,
    .pull = kv_pull,
    .stop = kv_stop,
    .kill_now = kv_kill_now,
    .health_check = kv_health_check,
    .destroy = kv_destroy,
};

const struct nm_service_ops nm_kv_mooncake_service_ops = {
    .name = "kv_store",
    .backend = "mooncake",
    .prepare_priority = 10,
    .create = kv_create,
    .prepare = kv_prepare,
    .pull = kv_pull,
    .stop = kv_stop,
    .kill_now = kv_kill_now,
    .health_check = kv_health_check,
    .destroy = kv_destroy,
};

/* ---- routes ---------------------------------------------------------------------------- */

static void h_kv_state(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_kv *kv = nm->kv;
    const struct nm_config *c = nm->cfg;
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(kv != NULL));
    if (!kv) {
        httpd_respond_json(req, 200, o);
        return;
    }
    bool alive = kv_running(kv);
    json_object_set_new(o, "backend", json_string(backend_str(c)));
    json_object_set_new(o, "mode", json_string(mode_str(c)));
    json_object_set_new(o, "command", wire_strlist_to_json(&c->kv.local_service_command));
    json_object_set_new(o, "wanted", json_boolean(kv->wanted));
    json_object_set_new(o, "alive", json_boolean(alive));
    json_object_set_new(o, "pid", alive ? json_integer(kv->pid) : json_null());
    json_object_set_new(o, "spawns", json_integer(kv->spawns));
    json_object_set_new(o, "restarts", json_integer(kv->spawns > 0 ? kv->spawns - 1 : 0));
    json_object_set_new(o, "restart_enabled", json_boolean(restart_enabled(c)));
    json_object_set_new(o, "uptime_seconds",
                        alive ? json_real((double)(util_mono_ms() - kv->spawned_ms) / 1000.0)
                              : json_null());
    if (kv->has_last_exit) {
        char ts[40];
        util_wall_iso8601(kv->last_exit_wall_ms, ts, sizeof(ts));
        json_object_set_new(
            o, "last_exit",
            json_pack("{s:o, s:o, s:s, s:f}", "code",
                      kv->last_exit.code >= 0 ? json_integer(kv->last_exit.code) : json_null(),
                      "signal",
                      kv->last_exit.signo > 0 ? json_integer(kv->last_exit.signo) : json_null(),
                      "at", ts, "uptime_seconds", (double)kv->last_exit_uptime_ms / 1000.0));
    } else {
        json_object_set_new(o, "last_exit", json_null());
    }
    json_t *env = json_object();
    for (size_t i = 0; i < nm->engine_env.n; i++) {
        const char *item = nm->engine_env.items[i];
        const char *eq = strchr(item, '=');
        if (!eq)
            continue;
        char name[128];
        size_t k = (size_t)(eq - item) < sizeof(name) - 1 ? (size_t)(eq - item) : sizeof(name) - 1;
        memcpy(name, item, k);
        name[k] = '\0';
        json_object_set_new(env, name, json_string(eq + 1));
    }
    json_object_set_new(o, "engine_env", env);
    json_object_set_new(o, "log_file", kv->log_path ? json_string(kv->log_path) : json_null());
    httpd_respond_json(req, 200, o);
}

static void h_kv_logs(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct nm_kv *kv = nm->kv;
    int lines = KV_TAIL_DEFAULT_LINES;
    const char *t = httpd_req_query(req, "tail");
    if (t && util_parse_int(t, 0, NM_TAIL_MAX_LINES, &lines) < 0) {
        nm_respond_detail(req, 400, "tail must be an integer in [0, %d]", NM_TAIL_MAX_LINES);
        return;
    }
    if (!kv) {
        nm_respond_detail(req, 404, "no KV store service on this node manager");
        return;
    }
    char *text = kv->proc ? proc_tail(kv->proc, (size_t)lines) : xstrdup("");
    httpd_respond(req, 200, "text/plain; charset=utf-8", text, strlen(text));
    free(text);
}

void nm_kv_init_routes(struct nodemgr *nm)
{
    nm_route(nm, "GET", "/node-manager/kv-store", h_kv_state, nm, 0);
    nm_route(nm, "GET", "/node-manager/kv-store/logs", h_kv_logs, nm, 0);
}
