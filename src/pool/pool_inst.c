/* pool_inst — one worker process, as an explicit state machine:
 *
 *   starting --ready line + GET /health 200--> ready --idle TTL / stop--> stopping --> stopped
 *      |  (no line in time, /health failing, exit)      | (exit unasked)
 *      +-----------------------------------------------> error
 *
 * Every transition is logged, written to the instance's row and appended to the
 * transitions table with its wall-clock time and cause. An instance in error keeps its
 * reason and the last POOL_TAIL_LINES lines of its stderr; its process, if any, is
 * stopped like any other and it keeps counting against max_instances until reaped. */
#include "pool/pool_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

const char *pool_state_str(enum pool_state s)
{
    switch (s) {
    case POOL_STARTING:
        return "starting";
    case POOL_READY:
        return "ready";
    case POOL_STOPPING:
        return "stopping";
    case POOL_STOPPED:
        return "stopped";
    case POOL_ERROR:
        return "error";
    }
    return "unknown";
}

bool pool_inst_live(const struct pool_inst *i)
{
    switch (i->state) {
    case POOL_STARTING:
    case POOL_READY:
    case POOL_STOPPING:
        return true;
    case POOL_ERROR:
        return i->proc_alive;
    case POOL_STOPPED:
        return false;
    }
    return false;
}

bool pool_inst_exited(const struct pool_inst *i)
{
    if (i->pid <= 0 || !i->proc_alive)
        return true;
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)i->pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return true; /* ECHILD: not ours any more */
    return si.si_pid != 0;
}

char *pool_inst_tail(const struct pool_inst *i, size_t lines)
{
    if (i->ring_ok)
        return ring_tail(&i->err_ring, lines);
    const char *t = i->final_tail ? i->final_tail : "";
    size_t len = strlen(t);
    return xstrdup(t + ring_lines_start(t, len, lines));
}

void pool_inst_record(struct pool_inst *i)
{
    char *manifest = json_dumps(i->m->doc, JSON_COMPACT | JSON_SORT_KEYS);
    char *tail = NULL;
    if (i->state == POOL_ERROR || i->state == POOL_STOPPED)
        tail = pool_inst_tail(i, POOL_TAIL_LINES);
    struct pool_inst_rec rec = {
        .id = i->id,
        .node_id = i->node->id,
        .state = pool_state_str(i->state),
        .pid = i->pid,
        .address = i->address,
        .started_wall_ms = i->started_wall,
        .ready_wall_ms = i->ready_wall,
        .stopped_wall_ms = i->ended_wall,
        .last_used_wall_ms = i->last_used_wall,
        .calls = i->calls,
        .error = i->error,
        .stderr_tail = tail,
        .manifest = manifest,
    };
    pool_store_instance_put(i->pool->store, &rec);
    free(tail);
    free(manifest);
}

static void set_state(struct pool_inst *i, enum pool_state to, const char *cause)
{
    enum pool_state from = i->state;
    i->state = to;
    if (to == POOL_STOPPED || to == POOL_ERROR) {
        i->ended_ms = util_mono_ms();
        i->ended_wall = util_wall_ms();
    }
    pool_store_transition(i->pool->store, i->id, i->node->id, pool_state_str(from),
                          pool_state_str(to), cause, util_wall_ms());
    pool_inst_record(i);
    log_info("pool_instance_state", LF_STR("instance_id", i->id), LF_STR("node_id", i->node->id),
             LF_STR("from", pool_state_str(from)), LF_STR("to", pool_state_str(to)),
             LF_STR("cause", cause), LF_INT("pid", i->pid), LF_INT("port", i->port));
}

static void stop_timers(struct pool_inst *i)
{
    struct reactor *r = i->pool->r;
    reactor_timer_stop(r, &i->ready_timer);
    reactor_timer_stop(r, &i->health_timer);
    reactor_timer_stop(r, &i->idle_timer);
    if (i->health) {
        httpc_cancel(i->pool->http, i->health);
        i->health = NULL;
    }
}

/* Both ended and reaped: the pool may re-dispatch, trim, finish a delete/shutdown. */
static void maybe_ended(struct pool_inst *i)
{
    if (i->ended || pool_inst_live(i) || i->state == POOL_READY)
        return;
    i->ended = true;
    /* Its output is complete: keep the tail, give the ring's memory back (ended
     * instances stay listed for a while). */
    if (i->ring_ok) {
        i->final_tail = ring_tail(&i->err_ring, POOL_TAIL_LINES);
        ring_release(&i->err_ring);
        i->ring_ok = false;
    }
    pool_inst_ended(i);
}

void pool_inst_fail(struct pool_inst *i, const char *why)
{
    if (i->state == POOL_ERROR || i->state == POOL_STOPPED)
        return;
    enum pool_state was = i->state;
    stop_timers(i);
    free(i->error);
    i->error = xstrdup(why);
    free(i->error_tail);
    i->error_tail = pool_inst_tail(i, POOL_TAIL_LINES);
    set_state(i, POOL_ERROR, why);
    log_warn("pool_instance_error", LF_STR("instance_id", i->id), LF_STR("node_id", i->node->id),
             LF_INT("pid", i->pid), LF_STR("error", why), LF_STR("stderr_tail", i->error_tail));
    if (i->proc && i->proc_alive)
        (void)proc_stop(i->proc, i->pool->cfg.stop_grace_ms, NULL, NULL);
    char *msg = xasprintf("instance %s failed during the call: %s", i->id, why);
    pool_api_inst_gone(i, msg);
    free(msg);
    if (was == POOL_STARTING)
        pool_start_failed(i->node, i);
    maybe_ended(i);
}

void pool_inst_stop(struct pool_inst *i, const char *cause)
{
    if (i->state != POOL_STARTING && i->state != POOL_READY)
        return;
    stop_timers(i);
    i->stop_cause = cause;
    set_state(i, POOL_STOPPING, cause);
    if (i->proc && i->proc_alive) {
        (void)proc_stop(i->proc, i->pool->cfg.stop_grace_ms, NULL, NULL);
        return;
    }
    /* No process (unit tests' fake spawn): stopped at once. */
    set_state(i, POOL_STOPPED, cause);
    char *msg = xasprintf("instance %s was stopped during the call (%s)", i->id, cause);
    pool_api_inst_gone(i, msg);
    free(msg);
    maybe_ended(i);
}

static void on_idle(struct reactor *r, void *arg)
{
    struct pool_inst *i = arg;
    if (i->state != POOL_READY || i->busy > 0)
        return;
    log_info("pool_instance_reaped", LF_STR("instance_id", i->id), LF_STR("node_id", i->node->id),
             LF_INT("idle_ms", util_mono_ms() - i->last_used_ms), LF_INT("ttl_ms", i->m->idle_ttl_ms));
    pool_inst_stop(i, "idle ttl expired");
}

void pool_inst_became_idle(struct pool_inst *i)
{
    if (i->state != POOL_READY || i->busy > 0 || i->m->keep_warm || i->m->idle_ttl_ms < 0)
        return;
    reactor_timer_start(i->pool->r, &i->idle_timer, i->m->idle_ttl_ms, 0);
}

void pool_inst_became_busy(struct pool_inst *i)
{
    reactor_timer_stop(i->pool->r, &i->idle_timer);
}

static void set_address(struct pool_inst *i, int port)
{
    i->port = port;
    free(i->address);
    free(i->health_url);
    free(i->invoke_url);
    i->address = xasprintf("http://127.0.0.1:%d", port);
    i->health_url = xasprintf("%s/health", i->address);
    i->invoke_url = xasprintf("%s/invoke", i->address);
}

void pool_inst_mark_ready(struct pool_inst *i, int port)
{
    if (i->state != POOL_STARTING)
        return;
    if (!i->address || i->port != port)
        set_address(i, port);
    stop_timers(i);
    i->ready_ms = util_mono_ms();
    i->ready_wall = util_wall_ms();
    i->last_used_ms = i->ready_ms;
    i->last_used_wall = i->ready_wall;
    set_state(i, POOL_READY, "ready line and /health OK");
    log_info("pool_instance_ready", LF_STR("instance_id", i->id), LF_STR("node_id", i->node->id),
             LF_INT("pid", i->pid), LF_INT("port", port),
             LF_INT("startup_ms", i->ready_ms - i->started_ms));
    pool_inst_became_idle(i);
    pool_pump(i->node);
}

/* ---- readiness -------------------------------------------------------------------------- */

int pool_parse_ready_line(const char *line, int *port)
{
    static const char *const tokens[] = {"MOTOR_NODE_READY", "WOV_NODE_READY"};
    while (*line == ' ' || *line == '\t')
        line++;
    const char *rest = NULL;
    for (size_t k = 0; k < ARRAY_LEN(tokens); k++) {
        size_t n = strlen(tokens[k]);
        if (strncmp(line, tokens[k], n) == 0 &&
            (line[n] == '\0' || line[n] == ' ' || line[n] == '\t')) {
            rest = line + n;
            break;
        }
    }
    if (!rest)
        return 0;
    const char *pp = strstr(rest, "port=");
    if (!pp)
        return -EINVAL;
    pp += 5;
    size_t len = strspn(pp, "0123456789");
    if (len == 0 || len > 5 || (pp[len] != '\0' && pp[len] != ' ' && pp[len] != '\t' &&
                                pp[len] != '\r'))
        return -EINVAL;
    char digits[8];
    memcpy(digits, pp, len);
    digits[len] = '\0';
    int v;
    if (util_parse_int(digits, 1, 65535, &v) != 0)
        return -EINVAL;
    *port = v;
    return 1;
}

static void health_check(struct pool_inst *i);

static void on_health(const struct httpc_response *resp, void *arg)
{
    struct pool_inst *i = arg;
    i->health = NULL;
    if (i->state != POOL_STARTING)
        return;
    if (resp->error == 0 && resp->status == 200) {
        pool_inst_mark_ready(i, i->port);
        return;
    }
    if (resp->error == 0) {
        char *why = xasprintf("health check failed: GET %s answered HTTP %ld", i->health_url,
                              resp->status);
        pool_inst_fail(i, why);
        free(why);
        return;
    }
    /* Refused: the ready line may have been printed just before the server listens. */
    int64_t left = i->ready_deadline_ms - util_mono_ms();
    if (resp->error == -ECONNREFUSED && left > POOL_HEALTH_RETRY_MS) {
        reactor_timer_start(i->pool->r, &i->health_timer, POOL_HEALTH_RETRY_MS, 0);
        return;
    }
    char *why = xasprintf("health check failed: GET %s: %s", i->health_url, resp->error_text);
    pool_inst_fail(i, why);
    free(why);
}

static void health_check(struct pool_inst *i)
{
    int64_t left = i->ready_deadline_ms - util_mono_ms();
    int64_t timeout = MOTOR_MIN(MOTOR_MAX(left, 100), POOL_HEALTH_TIMEOUT_MAX_MS);
    i->health = httpc_get(i->pool->http, i->health_url, timeout, on_health, i);
}

static void on_health_retry(struct reactor *r, void *arg)
{
    struct pool_inst *i = arg;
    if (i->state == POOL_STARTING && !i->health)
        health_check(i);
}

static void on_ready_timeout(struct reactor *r, void *arg)
{
    struct pool_inst *i = arg;
    if (i->state != POOL_STARTING)
        return;
    double s = (double)i->m->ready_timeout_ms / 1000.0;
    char *why;
    if (!i->ready_line)
        why = xasprintf("not ready: no 'MOTOR_NODE_READY port=N' line on stdout within %.3g s "
                        "(ready_timeout_seconds)",
                        s);
    else
        why = xasprintf("not ready: GET %s did not answer 200 within %.3g s "
                        "(ready_timeout_seconds)",
                        i->health_url, s);
    pool_inst_fail(i, why);
    free(why);
}

static void on_line(struct proc *pr, enum proc_stream stream, const char *line, size_t len,
                    void *arg)
{
    struct pool_inst *i = arg;
    if (stream == PROC_STDERR) {
        if (!i->ring_ok)
            return;
        ring_write(&i->err_ring, line, len);
        ring_write(&i->err_ring, "\n", 1);
        return;
    }
    if (i->state != POOL_STARTING || i->ready_line)
        return;
    int port = 0;
    int rc = pool_parse_ready_line(line, &port);
    if (rc == 0)
        return;
    if (rc < 0) {
        char *why = xasprintf("invalid ready line on stdout: '%.200s' (expected "
                              "'MOTOR_NODE_READY port=N', 1 <= N <= 65535)",
                              line);
        pool_inst_fail(i, why);
        free(why);
        return;
    }
    i->ready_line = true;
    set_address(i, port);
    log_info("pool_instance_ready_line", LF_STR("instance_id", i->id), LF_INT("port", port),
             LF_INT("after_ms", util_mono_ms() - i->started_ms));
    health_check(i);
}

static char *exit_text(const struct proc_status *st)
{
    if (st->signo > 0)
        return xasprintf("killed by signal %d (%s)%s", st->signo, strsignal(st->signo),
                         st->core_dumped ? ", core dumped" : "");
    if (st->code >= 0)
        return xasprintf("exit code %d", st->code);
    return xstrdup("exit status unknown");
}

static void on_exit_cb(struct proc *pr, const struct proc_status *st, void *arg)
{
    struct pool_inst *i = arg;
    i->proc_alive = false;
    char *how = exit_text(st);
    log_info("pool_instance_exited", LF_STR("instance_id", i->id), LF_STR("node_id", i->node->id),
             LF_INT("pid", i->pid), LF_STR("state", pool_state_str(i->state)), LF_STR("how", how));
    switch (i->state) {
    case POOL_STARTING: {
        char *why = xasprintf("exited before it was ready (%s)", how);
        pool_inst_fail(i, why);
        free(why);
        break;
    }
    case POOL_READY: {
        char *why = xasprintf("crashed (%s)", how);
        pool_inst_fail(i, why);
        free(why);
        break;
    }
    case POOL_STOPPING: {
        set_state(i, POOL_STOPPED, i->stop_cause ? i->stop_cause : "stopped");
        char *msg = xasprintf("instance %s was stopped during the call (%s)", i->id,
                              i->stop_cause ? i->stop_cause : "stopped");
        pool_api_inst_gone(i, msg);
        free(msg);
        break;
    }
    case POOL_ERROR:
    case POOL_STOPPED:
        /* Killed after a failure: keep the reason, refresh the record's tail. */
        pool_inst_record(i);
        break;
    }
    free(how);
    /* Deferred by proc until this callback returns. */
    proc_free(i->proc);
    i->proc = NULL;
    maybe_ended(i);
}

int pool_inst_spawn(struct pool_inst *i)
{
    struct pool_manifest *m = i->m;
    struct stat st;
    if (stat(m->workdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        char *why = xasprintf("workdir not found: %s", m->workdir);
        pool_inst_fail(i, why);
        free(why);
        return -ENOENT;
    }
    char *py = pool_venv_python(m->workdir, m->argv[0]);
    const char **argv = xcalloc(m->argc + 1, sizeof(char *));
    for (size_t k = 0; k < m->argc; k++)
        argv[k] = m->argv[k];
    if (py)
        argv[0] = py;

    /* Manifest env on top of ours, then what the pool tells every worker. */
    const char **ov = xcalloc(m->n_env + 8, sizeof(char *));
    size_t n = 0;
    const char *ld_cur = getenv("LD_LIBRARY_PATH");
    bool unbuffered_set = false;
    for (size_t k = 0; k < m->n_env; k++) {
        ov[n++] = m->env[k];
        if (strncmp(m->env[k], "LD_LIBRARY_PATH=", 16) == 0)
            ld_cur = m->env[k] + 16;
        if (strncmp(m->env[k], "PYTHONUNBUFFERED=", 17) == 0)
            unbuffered_set = true;
    }
    char *ld = pool_cuda_library_path(m->workdir, ld_cur);
    char *ld_kv = ld ? xasprintf("LD_LIBRARY_PATH=%s", ld) : NULL;
    char *node_kv = xasprintf("MOTOR_POOL_NODE_ID=%s", i->node->id);
    char *inst_kv = xasprintf("MOTOR_POOL_INSTANCE_ID=%s", i->id);
    if (ld_kv)
        ov[n++] = ld_kv;
    ov[n++] = node_kv;
    ov[n++] = inst_kv;
    /* Python block-buffers a piped stdout: the ready line would sit in the buffer. */
    if (!unbuffered_set)
        ov[n++] = "PYTHONUNBUFFERED=1";
    ov[n] = NULL;

    struct proc_opts o = {
        .argv = argv,
        .env_overrides = ov,
        .workdir = m->workdir,
        .name = i->node->id,
        .ring_bytes = 16u * 1024u,
        .max_line = POOL_MAX_LINE,
        .on_line = on_line,
        .on_exit = on_exit_cb,
        .arg = i,
    };
    int rc = proc_spawn(i->pool->r, &o, &i->proc);
    if (rc == 0) {
        i->proc_alive = true;
        i->pid = proc_pid(i->proc);
        log_info("pool_instance_spawned", LF_STR("instance_id", i->id),
                 LF_STR("node_id", i->node->id), LF_INT("pid", i->pid), LF_STR("argv0", argv[0]),
                 LF_STR("workdir", m->workdir), LF_STR("ld_library_path", ld));
    }
    char *why = rc ? xasprintf("spawn failed: %s (command '%s', workdir %s)", strerror(-rc),
                               argv[0], m->workdir)
                   : NULL;
    free(ld);
    free(ld_kv);
    free(node_kv);
    free(inst_kv);
    free(ov);
    free(argv);
    free(py);
    if (rc) {
        i->proc = NULL;
        pool_inst_fail(i, why);
        free(why);
        return rc;
    }
    return 0;
}

struct pool_inst *pool_inst_start(struct pool_node *n)
{
    struct pool *p = n->pool;
    struct pool_inst *i = xcalloc(1, sizeof(*i));
    i->pool = p;
    i->node = n;
    n->refs++;
    i->m = pool_manifest_ref(n->m);
    pool_new_id("ni_", i->id, sizeof(i->id));
    i->state = POOL_STARTING;
    ring_init(&i->err_ring, POOL_TAIL_RING_BYTES);
    i->ring_ok = true;
    reactor_timer_init(&i->ready_timer, on_ready_timeout, i);
    reactor_timer_init(&i->health_timer, on_health_retry, i);
    reactor_timer_init(&i->idle_timer, on_idle, i);
    i->started_ms = util_mono_ms();
    i->started_wall = util_wall_ms();
    i->ready_deadline_ms = i->started_ms + i->m->ready_timeout_ms;
    list_init(&i->calls_head);
    list_insert_head(&p->insts, &i->link);
    n->starts++;
    pool_store_transition(p->store, i->id, n->id, NULL, "starting", "call waiting",
                          i->started_wall);
    pool_inst_record(i);
    log_info("pool_instance_starting", LF_STR("instance_id", i->id), LF_STR("node_id", n->id),
             LF_INT("waiting", (int64_t)n->n_waiting));
    reactor_timer_start(p->r, &i->ready_timer, i->m->ready_timeout_ms, 0);
    p->spawn(i); /* failures leave it in error (and fail waiters) */
    return i;
}

void pool_inst_destroy(struct pool_inst *i)
{
    struct pool *p = i->pool;
    struct pool_node *n = i->node;
    stop_timers(i);
    if (i->proc) {
        (void)proc_kill_now(i->proc);
        proc_free(i->proc);
        i->proc = NULL;
        i->proc_alive = false;
    }
    if (i->state != POOL_STOPPED && i->state != POOL_ERROR) {
        i->stop_cause = "pool shutdown";
        set_state(i, POOL_STOPPED, "pool shutdown");
    }
    if (n->deleted && n->del_done) {
        bool live = false;
        struct list_head *pos;
        list_for_each(pos, &p->insts)
        {
            struct pool_inst *j = list_entry(pos, struct pool_inst, link);
            if (j != i && j->node == n && pool_inst_live(j))
                live = true;
        }
        if (!live) {
            void (*done)(void *) = n->del_done;
            n->del_done = NULL;
            done(n->del_arg);
        }
    }
    if (i->ring_ok)
        ring_release(&i->err_ring);
    free(i->address);
    free(i->health_url);
    free(i->invoke_url);
    free(i->error);
    free(i->error_tail);
    free(i->final_tail);
    pool_manifest_unref(i->m);
    pool_node_unref(n);
    free(i);
}

json_t *pool_inst_json(const struct pool_inst *i, size_t tail_lines)
{
    json_t *o = json_object();
    char ts[40];
    json_object_set_new(o, "id", json_string(i->id));
    json_object_set_new(o, "node_id", json_string(i->node->id));
    json_object_set_new(o, "state", json_string(pool_state_str(i->state)));
    json_object_set_new(o, "pid", i->pid > 0 ? json_integer(i->pid) : json_null());
    json_object_set_new(o, "alive", json_boolean(i->proc_alive));
    json_object_set_new(o, "address", i->address ? json_string(i->address) : json_null());
    json_object_set_new(o, "port", i->port ? json_integer(i->port) : json_null());
    json_object_set_new(o, "busy", json_integer(i->busy));
    json_object_set_new(o, "max_concurrency", json_integer(i->m->max_concurrency));
    json_object_set_new(o, "calls", json_integer((json_int_t)i->calls));
    json_object_set_new(o, "keep_warm", json_boolean(i->m->keep_warm));
    json_object_set_new(o, "current_manifest", json_boolean(i->m == i->node->m));
    int64_t now = util_mono_ms();
    double idle = (i->state == POOL_READY && i->busy == 0) ? (double)(now - i->last_used_ms) / 1e3
                                                           : 0.0;
    json_object_set_new(o, "idle_seconds", json_real(idle));
    int64_t end = i->ended_ms ? i->ended_ms : now;
    json_object_set_new(o, "uptime_seconds", json_real((double)(end - i->started_ms) / 1e3));
    util_wall_iso8601(i->started_wall, ts, sizeof(ts));
    json_object_set_new(o, "started_at", json_string(ts));
    if (i->ready_wall) {
        util_wall_iso8601(i->ready_wall, ts, sizeof(ts));
        json_object_set_new(o, "ready_at", json_string(ts));
    } else {
        json_object_set_new(o, "ready_at", json_null());
    }
    if (i->last_used_wall) {
        util_wall_iso8601(i->last_used_wall, ts, sizeof(ts));
        json_object_set_new(o, "last_used_at", json_string(ts));
    } else {
        json_object_set_new(o, "last_used_at", json_null());
    }
    if (i->ended_wall) {
        util_wall_iso8601(i->ended_wall, ts, sizeof(ts));
        json_object_set_new(o, "ended_at", json_string(ts));
    } else {
        json_object_set_new(o, "ended_at", json_null());
    }
    json_object_set_new(o, "error",
                        i->error ? pool_json_str(i->error, strlen(i->error)) : json_null());
    json_object_set_new(o, "stop_cause", i->stop_cause ? json_string(i->stop_cause) : json_null());
    char *t = tail_lines > 0 ? pool_inst_tail(i, tail_lines) : NULL;
    json_object_set_new(o, "stderr_tail", pool_lines_json(t));
    free(t);
    return o;
}
