/* motor up — see up.h. */
#include "cli/up.h"

#include "cli/commands.h"
#include "cli/status.h"
#include "cli/up_plan.h"
#include "cli/up_tls.h"
#include "common/cliopt.h"
#include "common/cfg.h"
#include "common/httpc.h"
#include "common/log.h"
#include "common/proc.h"
#include "common/reactor.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BACKOFF_FIRST_MS 1000
#define BACKOFF_MAX_MS 30000
#define BACKOFF_RESET_AFTER_MS 60000
#define EARLY_FAILURE_MS 5000
#define BOOT_TIMEOUT_MS 30000
#define BOOT_PROBE_MS 100
#define STOP_GRACE_MS 15000
#define STOP_SLACK_MS 5000
#define POLL_BOOT_MS 500
#define POLL_MS 1000
#define RECENT_MAX 8
#define CHILD_LOG_BYTES (20u << 20)
#define CHILD_LOG_KEEP 3

enum child_kind { K_COORD = 0, K_CTL, K_NM };
enum child_state { CS_IDLE = 0, CS_RUNNING, CS_BACKOFF, CS_STOPPING, CS_STOPPED };

static const char *child_state_name(enum child_state s)
{
    switch (s) {
    case CS_IDLE:
        return "not started";
    case CS_RUNNING:
        return "running";
    case CS_BACKOFF:
        return "restarting";
    case CS_STOPPING:
        return "stopping";
    case CS_STOPPED:
        return "stopped";
    }
    return "?";
}

struct up;

struct child {
    struct up *up;
    enum child_kind kind;
    char *name;     /* "coordinator", "controller", "prefill-0" */
    char *log_path; /* <state>/logs/<file>.log */
    char *listen;   /* what it listens on, for the view */
    char **argv;    /* NULL-terminated, heap */
    char **env;     /* overrides, NULL-terminated, heap */
    const struct up_pod *pod;
    struct proc *proc;
    enum child_state state;
    int starts;
    pid_t pid; /* current or last */
    int64_t started_ms;
    int64_t backoff_ms;
    struct reactor_timer timer;
};

enum up_phase { PH_BOOT_COORD = 0, PH_BOOT_CTL, PH_RUNNING, PH_STOPPING };

struct up {
    struct reactor *r;
    struct httpc *hc;
    struct up_plan plan;
    char *config_path, *state_dir, *eff_path, *motor_bin, *info_path, *log_path;
    char *openai_url, *infer_url, *mgmt_url, *ctl_url;
    char *mgmt_key;
    char *tls_dir; /* --tls: the throwaway PKI (up_tls.h); NULL without */
    /* motor up's own client towards each listener kind (the plan's files; borrowed) */
    struct httpc_tls ctl_tls, mgmt_tls, infer_tls;
    struct child *ch;
    size_t n_ch;
    enum up_phase phase;
    int exit_code;
    bool tty;
    int64_t start_ms;
    int64_t ready_timeout_ms;
    int lock_fd;

    /* boot: wait until a control-plane child answers HTTP */
    struct reactor_timer boot_timer;
    struct httpc_req *boot_req;
    int64_t boot_deadline;
    struct child *boot_child;

    /* fleet view */
    struct reactor_timer poll_timer;
    struct status_fetch *fetch;
    struct httpc_req *models_req;
    json_t *model;
    char *model_name;
    bool models_ok;
    bool ready, ever_ready;
    int routable;
    double req_total;
    int64_t req_ms;
    double rps;
    json_t *last_states; /* instance id -> status, for change events */

    /* stop */
    int stop_stage;
    int stop_pending;
    struct reactor_timer stop_timer;

    char *recent[RECENT_MAX];
    size_t n_recent;
};

/* ---- small helpers ------------------------------------------------------------------ */

static void recent(struct up *u, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void recent(struct up *u, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char ts[16];
    strftime(ts, sizeof(ts), "%H:%M:%S", &tm);
    if (u->n_recent == RECENT_MAX) {
        free(u->recent[0]);
        memmove(u->recent, u->recent + 1, (RECENT_MAX - 1) * sizeof(char *));
        u->n_recent--;
    }
    u->recent[u->n_recent++] = xasprintf("%s  %s", ts, msg);
}

static char **strv_new(const char *first, ...)
{
    size_t cap = 16, n = 0;
    char **v = xcalloc(cap, sizeof(char *));
    va_list ap;
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *)) {
        if (n + 1 >= cap)
            v = xrealloc(v, (cap *= 2) * sizeof(char *));
        v[n++] = xstrdup(s);
    }
    va_end(ap);
    v[n] = NULL;
    return v;
}

static void strv_push(char ***vp, char *owned)
{
    size_t n = 0;
    while ((*vp)[n])
        n++;
    *vp = xrealloc(*vp, (n + 2) * sizeof(char *));
    (*vp)[n] = owned;
    (*vp)[n + 1] = NULL;
}

static void strv_free(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

static void fmt_duration(char *buf, size_t cap, int64_t ms)
{
    int64_t s = ms / 1000;
    if (s < 60)
        snprintf(buf, cap, "%llds", (long long)s);
    else if (s < 3600)
        snprintf(buf, cap, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
    else
        snprintf(buf, cap, "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
}

static int mkdir_p(const char *path)
{
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0755) < 0 && errno != EEXIST) {
                rc = -errno;
                break;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    free(p);
    return rc;
}

static void unlink_quiet(const char *dir, const char *name)
{
    char *p = xasprintf("%s/%s", dir, name);
    unlink(p);
    free(p);
}

/* ---- up.json: where a running fleet can be found (motor status reads it) ---------- */

static void write_info(struct up *u)
{
    json_t *kids = json_array();
    for (size_t i = 0; i < u->n_ch; i++) {
        struct child *c = &u->ch[i];
        json_array_append_new(kids, json_pack("{s:s,s:i,s:s,s:s,s:i}", "name", c->name, "pid",
                                              (int)c->pid, "state", child_state_name(c->state),
                                              "log", c->log_path, "restarts",
                                              c->starts > 0 ? c->starts - 1 : 0));
    }
    json_t *info = json_pack("{s:i,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:b,s:o}", "pid", (int)getpid(),
                             "config", u->config_path, "effective_config", u->eff_path, "state_dir",
                             u->state_dir, "openai_url", u->openai_url, "coordinator_url",
                             u->infer_url, "coordinator_mgmt_url", u->mgmt_url, "controller_url",
                             u->ctl_url, "ready", u->ready, "children", kids);
    /* For `motor status` and you: the files a client of this fleet needs. */
    const struct httpc_tls *ct = u->plan.mgmt_tls.on  ? &u->mgmt_tls
                                 : u->plan.ctl_tls.on ? &u->ctl_tls
                                                      : NULL;
    if (u->tls_dir) {
        json_t *t = json_object();
        json_object_set_new(info, "tls", t);
        json_object_set_new(t, "ca_file", json_sprintf("%s/%s", u->tls_dir, UP_TLS_CA));
        json_object_set_new(t, "cert_file", json_sprintf("%s/%s.crt", u->tls_dir, UP_TLS_CLIENT));
        json_object_set_new(t, "key_file", json_sprintf("%s/%s.key", u->tls_dir, UP_TLS_CLIENT));
    } else if (ct || u->plan.infer_tls.on) {
        json_t *t = json_object();
        const struct httpc_tls *src = ct ? ct : &u->infer_tls;
        if (src->ca_file)
            json_object_set_new(t, "ca_file", json_string(src->ca_file));
        if (src->cert_file)
            json_object_set_new(t, "cert_file", json_string(src->cert_file));
        if (src->key_file)
            json_object_set_new(t, "key_file", json_string(src->key_file));
        json_object_set_new(info, "tls", t);
    }
    char *s = json_dumps(info, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s && util_write_file_atomic(u->info_path, s, strlen(s), 0644) < 0)
        log_warn("up_info_write_failed", LF_STR("path", u->info_path),
                 LF_STR("error", strerror(errno)));
    free(s);
    json_decref(info);
}

/* ---- live view -------------------------------------------------------------------- */

static void render_view(struct up *u)
{
    if (!u->tty)
        return;
    struct strbuf sb;
    strbuf_init(&sb, 1u << 20);
    char up_for[32];
    fmt_duration(up_for, sizeof(up_for), util_mono_ms() - u->start_ms);
    strbuf_appendf(&sb, "motor up  %s  (state %s, up %s)  Ctrl-C stops everything\n",
                   u->config_path, u->state_dir, up_for);
    if (u->phase == PH_STOPPING)
        strbuf_appendf(&sb, "STOPPING: coordinator, controller, then node managers ...\n");
    else if (u->ready)
        strbuf_appendf(&sb, "OpenAI base URL: %s   model %s   %.1f req/s\n", u->openai_url,
                       u->model_name ? u->model_name : "?", u->rps);
    else
        strbuf_appendf(&sb, "waiting for the fleet: %d of %d instance(s) routable%s\n", u->routable,
                       u->plan.n_serving, u->ever_ready ? " (was ready before)" : "");

    struct status_table t;
    status_table_init(&t, 6);
    const char *h[] = {"PROCESS", "PID", "STATE", "RESTARTS", "UPTIME", "LISTENS"};
    for (size_t i = 0; i < 6; i++)
        status_table_cell(&t, "%s", h[i]);
    for (size_t i = 0; i < u->n_ch; i++) {
        struct child *c = &u->ch[i];
        char upt[32] = "-";
        if (c->state == CS_RUNNING)
            fmt_duration(upt, sizeof(upt), util_mono_ms() - c->started_ms);
        status_table_cell(&t, "%s", c->name);
        if (c->pid > 0 && c->state == CS_RUNNING)
            status_table_cell(&t, "%d", (int)c->pid);
        else
            status_table_cell(&t, "-");
        status_table_cell(&t, "%s", child_state_name(c->state));
        status_table_cell(&t, "%d", c->starts > 0 ? c->starts - 1 : 0);
        status_table_cell(&t, "%s", upt);
        status_table_cell(&t, "%s", c->listen);
    }
    strbuf_puts(&sb, "\nPROCESSES\n");
    status_table_render(&t, &sb, "  ");
    status_table_release(&t);
    if (u->model) {
        strbuf_putc(&sb, '\n');
        status_render(&sb, u->model);
    }
    if (u->n_recent) {
        strbuf_puts(&sb, "\nRECENT\n");
        for (size_t i = 0; i < u->n_recent; i++)
            strbuf_appendf(&sb, "  %s\n", u->recent[i]);
    }
    strbuf_appendf(&sb, "\nlogs: %s/logs/   status: motor status --state-dir %s\n", u->state_dir,
                   u->state_dir);
    /* Overwrite in place (clear each line's rest, then below the last one) rather than
     * clearing the screen first: no flicker. */
    struct strbuf scr;
    strbuf_init(&scr, 2u << 20);
    strbuf_puts(&scr, "\033[H");
    /* Never more lines than the terminal has: a scroll would break "home". */
    struct winsize ws;
    int rows = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 2 ? ws.ws_row - 1 : 1000;
    for (const char *s = strbuf_str(&sb); s && *s && rows-- > 0;) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        strbuf_append(&scr, s, n);
        strbuf_puts(&scr, "\033[K\n");
        s += n + (nl ? 1 : 0);
    }
    strbuf_puts(&scr, "\033[J");
    if (strbuf_str(&scr))
        util_write_all(STDOUT_FILENO, strbuf_str(&scr), scr.len);
    strbuf_release(&scr);
    strbuf_release(&sb);
}

/* ---- children ---------------------------------------------------------------------- */

static void begin_stop(struct up *u, int exit_code, const char *why);
static void start_child(struct up *u, struct child *c);

static void restart_due(struct reactor *r, void *arg)
{
    (void)r;
    struct child *c = arg;
    if (c->state != CS_BACKOFF || c->up->phase == PH_STOPPING)
        return;
    start_child(c->up, c);
}

static void on_child_exit(struct proc *p, const struct proc_status *st, void *arg)
{
    struct child *c = arg;
    struct up *u = c->up;
    if (c->state == CS_STOPPING)
        return; /* asked for: stop_done takes it from here */
    int64_t uptime = proc_uptime_ms(p);
    char how[64];
    if (st->signo)
        snprintf(how, sizeof(how), "killed by signal %d", st->signo);
    else
        snprintf(how, sizeof(how), "exit status %d", st->code);
    char *tail = proc_tail(p, 12);
    char *short_tail = proc_tail(p, 3);
    log_warn("up_child_exited", LF_STR("name", c->name), LF_INT("pid", c->pid),
             LF_INT("code", st->code), LF_INT("signal", st->signo), LF_INT("uptime_ms", uptime),
             LF_STR("log", c->log_path), LF_STR("tail", short_tail));
    free(short_tail);
    proc_free(p);
    c->proc = NULL;

    bool fatal = c->starts == 1 && uptime < EARLY_FAILURE_MS && !st->signo &&
                 (st->code == 1 || st->code == 2);
    if (fatal || u->phase == PH_STOPPING) {
        c->state = CS_STOPPED;
        if (fatal) {
            fprintf(stderr,
                    "motor up: %s failed to start (%s). Last lines of %s:\n%s"
                    "motor up: stopping everything.\n",
                    c->name, how, c->log_path, tail);
            recent(u, "%s failed to start (%s)", c->name, how);
            free(tail);
            begin_stop(u, 1, "child failed to start");
            return;
        }
        free(tail);
        return;
    }
    free(tail);
    if (uptime >= BACKOFF_RESET_AFTER_MS || c->backoff_ms <= 0)
        c->backoff_ms = BACKOFF_FIRST_MS;
    else
        c->backoff_ms = MOTOR_MIN(c->backoff_ms * 2, BACKOFF_MAX_MS);
    c->state = CS_BACKOFF;
    recent(u, "%s exited (%s) after %llds; restarting in %llds", c->name, how,
           (long long)(uptime / 1000), (long long)(c->backoff_ms / 1000));
    log_info("up_child_restart_scheduled", LF_STR("name", c->name),
             LF_INT("delay_ms", c->backoff_ms), LF_INT("restarts", c->starts));
    reactor_timer_start(u->r, &c->timer, c->backoff_ms, 0);
    write_info(u);
}

static void start_child(struct up *u, struct child *c)
{
    struct proc_opts o = {
        .argv = (const char *const *)c->argv,
        .env_overrides = (const char *const *)c->env,
        .name = c->name,
        .log_path = c->log_path,
        .log_max_bytes = CHILD_LOG_BYTES,
        .log_keep = CHILD_LOG_KEEP,
        .on_exit = on_child_exit,
        .arg = c,
    };
    struct proc *p = NULL;
    int rc = proc_spawn(u->r, &o, &p);
    c->starts++;
    if (rc < 0) {
        log_error("up_spawn_failed", LF_STR("name", c->name), LF_STR("argv0", c->argv[0]),
                  LF_STR("error", strerror(-rc)));
        fprintf(stderr, "motor up: cannot start %s (%s): %s\n", c->name, c->argv[0], strerror(-rc));
        c->state = CS_STOPPED;
        begin_stop(u, 1, "spawn failed");
        return;
    }
    c->proc = p;
    c->pid = proc_pid(p);
    c->state = CS_RUNNING;
    c->started_ms = util_mono_ms();
    write_info(u); /* before the event: whoever waits for it may read up.json */
    log_info("up_child_started", LF_STR("name", c->name), LF_INT("pid", c->pid),
             LF_STR("role", c->pod ? up_role_name(c->pod->role) : NULL),
             LF_STR("listen", c->listen), LF_STR("log", c->log_path), LF_INT("start", c->starts));
    if (c->starts > 1)
        recent(u, "%s restarted (pid %d)", c->name, (int)c->pid);
}

/* ---- boot: coordinator, then controller, then node managers --------------------- */

static void boot_next(struct up *u);

static void boot_probe_done(const struct httpc_response *resp, void *arg)
{
    struct up *u = arg;
    u->boot_req = NULL;
    if (resp->status > 0) {
        /* Any HTTP answer means it listens; readiness is judged by the fleet view. */
        reactor_timer_stop(u->r, &u->boot_timer);
        log_info("up_child_listening", LF_STR("name", u->boot_child->name),
                 LF_STR("listen", u->boot_child->listen));
        u->phase++;
        boot_next(u);
    }
}

static void boot_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct up *u = arg;
    if (u->phase == PH_STOPPING || u->boot_req)
        return;
    if (util_mono_ms() > u->boot_deadline) {
        reactor_timer_stop(u->r, &u->boot_timer);
        fprintf(stderr, "motor up: %s did not answer on %s within %d s (log: %s)\n",
                u->boot_child->name, u->boot_child->listen, BOOT_TIMEOUT_MS / 1000,
                u->boot_child->log_path);
        begin_stop(u, 1, "boot timeout");
        return;
    }
    if (u->boot_child->state != CS_RUNNING)
        return; /* restarting: keep waiting within the deadline */
    bool coord = u->boot_child->kind == K_COORD;
    char *url = xasprintf("%s/liveness", coord ? u->mgmt_url : u->ctl_url);
    struct httpc_opts o = {
        .url = url, .timeout_ms = 1000, .tls = coord ? &u->mgmt_tls : &u->ctl_tls};
    u->boot_req = httpc_request(u->hc, &o, boot_probe_done, u);
    free(url);
}

static void poll_tick(struct reactor *r, void *arg);

static void boot_next(struct up *u)
{
    if (u->phase == PH_BOOT_COORD || u->phase == PH_BOOT_CTL) {
        struct child *c = &u->ch[u->phase == PH_BOOT_COORD ? 0 : 1];
        start_child(u, c);
        if (u->phase == PH_STOPPING)
            return;
        u->boot_child = c;
        u->boot_deadline = util_mono_ms() + BOOT_TIMEOUT_MS;
        reactor_timer_start(u->r, &u->boot_timer, BOOT_PROBE_MS, BOOT_PROBE_MS);
        return;
    }
    /* PH_RUNNING: every node manager at once. */
    for (size_t i = 2; i < u->n_ch && u->phase != PH_STOPPING; i++)
        start_child(u, &u->ch[i]);
    if (u->phase != PH_STOPPING)
        reactor_timer_start(u->r, &u->poll_timer, 0, POLL_BOOT_MS);
}

/* ---- fleet view: polling ----------------------------------------------------------- */

static void print_ready(struct up *u)
{
    int64_t secs = (util_mono_ms() - u->start_ms + 500) / 1000;
    const char *model = u->model_name ? u->model_name : "";
    log_info("up_ready", LF_STR("url", u->openai_url), LF_STR("model", model),
             LF_INT("instances", u->routable), LF_INT("seconds", secs));
    recent(u, "fleet ready after %llds: %s", (long long)secs, u->openai_url);
    if (u->tty)
        return;
    /* With --tls the inference port asks for a client certificate (mutual TLS). */
    char *tls_args = u->tls_dir ? xasprintf("--cacert %s/%s --cert %s/%s.crt --key %s/%s.key \\\n"
                                            "       ",
                                            u->tls_dir, UP_TLS_CA, u->tls_dir, UP_TLS_CLIENT,
                                            u->tls_dir, UP_TLS_CLIENT)
                                : xstrdup("");
    printf(
        "\nMotor is up after %llds: %d instance(s) routable, model \"%s\".\n"
        "OpenAI base URL: %s\n\n"
        "  curl %s%s/chat/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"model\":\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n"
        "  %s status --state-dir %s\n\n",
        (long long)secs, u->routable, model, u->openai_url, tls_args, u->openai_url, model,
        u->motor_bin, u->state_dir);
    free(tls_args);
    fflush(stdout);
}

static void track_instances(struct up *u)
{
    json_t *insts = json_object_get(u->model, "instances");
    size_t i;
    json_t *in;
    json_array_foreach(insts, i, in)
    {
        char key[32];
        snprintf(key, sizeof(key), "%lld",
                 (long long)json_integer_value(json_object_get(in, "id")));
        const char *st = json_string_value(json_object_get(in, "status"));
        const char *was = json_string_value(json_object_get(u->last_states, key));
        if (st && (!was || strcmp(st, was) != 0)) {
            const char *role = json_string_value(json_object_get(in, "role"));
            log_info("up_instance_state",
                     LF_INT("instance_id", json_integer_value(json_object_get(in, "id"))),
                     LF_STR("role", role),
                     LF_STR("job_name", json_string_value(json_object_get(in, "job_name"))),
                     LF_STR("from", was), LF_STR("to", st));
            recent(u, "instance %s (%s) %s -> %s", key, role ? role : "?", was ? was : "new", st);
            json_object_set_new(u->last_states, key, json_string(st));
        }
    }
}

static void evaluate(struct up *u)
{
    int routable = 0;
    size_t i;
    json_t *p;
    json_array_foreach(json_object_get(u->model, "pools"), i, p)
    {
        if (json_is_true(json_object_get(p, "healthy")))
            routable++;
    }
    u->routable = routable;
    double total = -1;
    json_t *rt = json_object_get(json_object_get(u->model, "coordinator"), "requests_total");
    if (json_is_integer(rt))
        total = (double)json_integer_value(rt);
    int64_t now = util_mono_ms();
    if (total >= 0) {
        if (u->req_ms > 0 && now > u->req_ms && total >= u->req_total)
            u->rps = (total - u->req_total) * 1000.0 / (double)(now - u->req_ms);
        u->req_total = total;
        u->req_ms = now;
    }
    bool ready = routable >= u->plan.n_serving && u->models_ok;
    if (ready && !u->ready) {
        u->ready = true;
        if (!u->ever_ready) {
            u->ever_ready = true;
            write_info(u);
            print_ready(u);
            reactor_timer_start(u->r, &u->poll_timer, POLL_MS, POLL_MS);
        } else {
            log_info("up_routable_again", LF_INT("instances", routable));
            recent(u, "all %d instance(s) routable again", routable);
        }
        write_info(u);
    } else if (!ready && u->ready) {
        u->ready = false;
        json_t *probs = json_object_get(u->model, "problems");
        char *ps = json_dumps(probs, JSON_COMPACT);
        log_warn("up_degraded", LF_INT("routable", routable), LF_INT("expected", u->plan.n_serving),
                 LF_RAW("problems", ps ? ps : "[]"));
        free(ps);
        recent(u, "degraded: %d of %d instance(s) routable", routable, u->plan.n_serving);
        write_info(u);
    }
    if (!u->ever_ready && u->ready_timeout_ms > 0 && now - u->start_ms > u->ready_timeout_ms) {
        struct strbuf sb;
        strbuf_init(&sb, 1u << 20);
        if (u->model)
            status_render(&sb, u->model);
        fprintf(stderr, "motor up: the fleet was not ready within %lld s:\n%s",
                (long long)(u->ready_timeout_ms / 1000), strbuf_str(&sb) ? strbuf_str(&sb) : "");
        strbuf_release(&sb);
        begin_stop(u, 1, "ready timeout");
    }
}

static void on_status(const struct status_docs *d, void *arg)
{
    struct up *u = arg;
    u->fetch = NULL;
    struct status_targets t = {
        .controller = u->ctl_url, .coordinator = u->mgmt_url, .mgmt_key = u->mgmt_key};
    json_decref(u->model);
    u->model = status_model(&t, d, (double)util_wall_ms() / 1000.0);
    track_instances(u);
    if (!u->models_req)
        evaluate(u);
    render_view(u);
}

static void on_models(const struct httpc_response *resp, void *arg)
{
    struct up *u = arg;
    u->models_req = NULL;
    u->models_ok = false;
    if (resp->status == 200) {
        json_t *doc = json_loadb(resp->body, resp->body_len, 0, NULL);
        json_t *first = json_array_get(json_object_get(doc, "data"), 0);
        const char *id = json_string_value(json_object_get(first, "id"));
        if (id) {
            u->models_ok = true;
            if (!u->model_name || strcmp(u->model_name, id) != 0) {
                free(u->model_name);
                u->model_name = xstrdup(id);
            }
        }
        json_decref(doc);
    }
    if (!u->fetch)
        evaluate(u);
}

static void poll_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct up *u = arg;
    if (u->phase != PH_RUNNING)
        return;
    if (!u->fetch) {
        /* One TLS setting for both sides: they differ only in a hand-made file that
         * switches one of them alone, and then the coordinator's wins. */
        struct status_targets t = {.controller = u->ctl_url,
                                   .coordinator = u->mgmt_url,
                                   .mgmt_key = u->mgmt_key,
                                   .tls = u->plan.mgmt_tls.on ? &u->mgmt_tls : &u->ctl_tls};
        u->fetch = status_fetch_start(u->hc, &t, 2000, on_status, u);
    }
    if (!u->models_req) {
        char *url = xasprintf("%s/models", u->openai_url);
        struct httpc_opts o = {.url = url, .timeout_ms = 2000, .tls = &u->infer_tls};
        u->models_req = httpc_request(u->hc, &o, on_models, u);
        free(url);
    }
}

/* ---- stop ------------------------------------------------------------------------ */

static void stop_stage(struct up *u);

/* Kill and reap every process that was reparented to us (we are a subreaper): what is
 * left of a killed child's tree. Bounded: a few rounds. */
static void sweep_orphans(void)
{
    pid_t self = getpid();
    for (int round = 0; round < 200; round++) {
        proc_reap_orphans();
        DIR *d = opendir("/proc");
        if (!d)
            return;
        int found = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            int pid;
            if (util_parse_int(de->d_name, 1, INT_MAX, &pid) < 0)
                continue;
            char path[64], buf[512];
            snprintf(path, sizeof(path), "/proc/%d/stat", pid);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, buf, sizeof(buf) - 1);
            close(fd);
            if (n <= 0)
                continue;
            buf[n] = '\0';
            char *rp = strrchr(buf, ')');
            char state;
            int ppid;
            if (!rp || sscanf(rp + 1, " %c %d", &state, &ppid) != 2 || ppid != self)
                continue;
            found++;
            if (state != 'Z') {
                log_warn("up_orphan_killed", LF_INT("pid", pid));
                kill(pid, SIGKILL);
            }
        }
        closedir(d);
        if (!found)
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static void finish(struct up *u)
{
    reactor_timer_stop(u->r, &u->stop_timer);
    sweep_orphans();
    log_info("up_stopped", LF_INT("exit_code", u->exit_code));
    recent(u, "stopped");
    render_view(u);
    reactor_stop(u->r);
}

static void stop_done(struct proc *p, void *arg)
{
    struct child *c = arg;
    struct up *u = c->up;
    struct proc_status st;
    bool have = proc_exit_status(p, &st);
    log_info("up_child_stopped", LF_STR("name", c->name), LF_INT("pid", c->pid),
             LF_INT("code", have ? st.code : -1), LF_INT("signal", have ? st.signo : 0),
             LF_INT("ms", util_mono_ms() - u->start_ms));
    proc_free(p);
    c->proc = NULL;
    c->state = CS_STOPPED;
    if (--u->stop_pending == 0 && u->phase == PH_STOPPING) {
        u->stop_stage++;
        stop_stage(u);
    }
}

static void stop_deadline(struct reactor *r, void *arg)
{
    (void)r;
    struct up *u = arg;
    /* proc_stop SIGKILLs after the grace; this is for a child the kernel cannot kill
     * promptly (D state). Do not wait forever. */
    log_warn("up_stop_deadline", LF_INT("stage", u->stop_stage));
    for (size_t i = 0; i < u->n_ch; i++) {
        struct child *c = &u->ch[i];
        if (c->proc) {
            proc_kill_now(c->proc);
            proc_free(c->proc);
            c->proc = NULL;
            c->state = CS_STOPPED;
        }
    }
    u->stop_pending = 0;
    finish(u);
}

static void stop_stage(struct up *u)
{
    static const enum child_kind order[] = {K_COORD, K_CTL, K_NM};
    static const char *const names[] = {"coordinator", "controller", "node managers"};
    while (u->stop_stage < 3) {
        enum child_kind k = order[u->stop_stage];
        u->stop_pending = 0;
        for (size_t i = 0; i < u->n_ch; i++) {
            struct child *c = &u->ch[i];
            if (c->kind != k)
                continue;
            reactor_timer_stop(u->r, &c->timer);
            if (c->proc && proc_running(c->proc)) {
                c->state = CS_STOPPING;
                u->stop_pending++;
            } else {
                if (c->proc) {
                    proc_free(c->proc);
                    c->proc = NULL;
                }
                c->state = CS_STOPPED;
            }
        }
        if (u->stop_pending) {
            log_info("up_stopping", LF_STR("what", names[u->stop_stage]),
                     LF_INT("processes", u->stop_pending));
            render_view(u);
            reactor_timer_start(u->r, &u->stop_timer, STOP_GRACE_MS + STOP_SLACK_MS, 0);
            /* Start them only after counting: a done callback may come from the loop
             * at the earliest, but keep the count exact regardless. */
            for (size_t i = 0; i < u->n_ch; i++) {
                struct child *c = &u->ch[i];
                if (c->kind == k && c->state == CS_STOPPING)
                    proc_stop(c->proc, STOP_GRACE_MS, stop_done, c);
            }
            return;
        }
        u->stop_stage++;
    }
    finish(u);
}

static void kill_all_now(struct up *u)
{
    for (size_t i = 0; i < u->n_ch; i++) {
        struct child *c = &u->ch[i];
        reactor_timer_stop(u->r, &c->timer);
        if (c->proc) {
            proc_kill_now(c->proc);
            proc_free(c->proc);
            c->proc = NULL;
        }
        c->state = CS_STOPPED;
    }
    u->stop_pending = 0;
}

static void begin_stop(struct up *u, int exit_code, const char *why)
{
    if (u->phase == PH_STOPPING)
        return;
    u->phase = PH_STOPPING;
    u->exit_code = exit_code;
    log_info("up_stop", LF_STR("reason", why), LF_INT("exit_code", exit_code));
    recent(u, "stopping (%s)", why);
    reactor_timer_stop(u->r, &u->boot_timer);
    reactor_timer_stop(u->r, &u->poll_timer);
    if (u->boot_req) {
        httpc_cancel(u->hc, u->boot_req);
        u->boot_req = NULL;
    }
    if (u->models_req) {
        httpc_cancel(u->hc, u->models_req);
        u->models_req = NULL;
    }
    status_fetch_cancel(u->fetch);
    u->fetch = NULL;
    u->stop_stage = 0;
    stop_stage(u);
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    (void)r;
    struct up *u = arg;
    if (signo == SIGCHLD) {
        proc_reap_orphans();
        return;
    }
    if (signo == SIGWINCH) {
        render_view(u);
        return;
    }
    if (u->phase == PH_STOPPING) {
        log_warn("up_kill_now", LF_INT("signal", signo));
        kill_all_now(u);
        u->exit_code = 130;
        finish(u);
        return;
    }
    begin_stop(u, 0, signo == SIGINT ? "SIGINT" : signo == SIGHUP ? "SIGHUP" : "SIGTERM");
}

/* ---- setup --------------------------------------------------------------------------- */

static void child_init(struct up *u, struct child *c, enum child_kind kind, const char *name,
                       const char *file, char **argv)
{
    c->up = u;
    c->kind = kind;
    c->name = xstrdup(name);
    c->log_path = xasprintf("%s/logs/%s.log", u->state_dir, file);
    c->argv = argv;
    /* The children see one host: no cluster service names, the file we wrote. */
    c->env = strv_new("POD_IP=127.0.0.1", "CONFIG_PATH", "KUBERNETES_SERVICE_HOST", "POD_NAMESPACE",
                      "CONTROLLER_SERVICE", "COORDINATOR_SERVICE", "MOTOR_NM_STATE_FILE", NULL);
    strv_push(&c->env, xasprintf("USER_CONFIG_PATH=%s", u->eff_path));
    reactor_timer_init(&c->timer, restart_due, c);
}

static void build_children(struct up *u)
{
    u->n_ch = 2 + u->plan.n_pods;
    u->ch = xcalloc(u->n_ch, sizeof(*u->ch));
    child_init(u, &u->ch[0], K_COORD, "coordinator", "coordinator",
               strv_new(u->motor_bin, "coordinator", "--config", u->eff_path, NULL));
    u->ch[0].listen =
        xasprintf("127.0.0.1:%d (mgmt %d)", u->plan.coord_port, u->plan.coord_mgmt_port);
    child_init(u, &u->ch[1], K_CTL, "controller", "controller",
               strv_new(u->motor_bin, "controller", "--config", u->eff_path, NULL));
    u->ch[1].listen = xasprintf("127.0.0.1:%d", u->plan.ctl_port);
    for (size_t i = 0; i < u->plan.n_pods; i++) {
        const struct up_pod *d = &u->plan.pods[i];
        struct child *c = &u->ch[2 + i];
        char *file = xasprintf("nm-%s", d->name);
        char *state = xasprintf("%s/%s.nm-state.json", u->state_dir, d->name);
        child_init(u, c, K_NM, d->name, file,
                   strv_new(u->motor_bin, "node-manager", "--config", u->eff_path, "--role",
                            up_role_name(d->role), "--state-file", state, NULL));
        strv_push(&c->env, xasprintf("ROLE=%s", up_role_name(d->role)));
        strv_push(&c->env, xasprintf("INDEX=%d", d->index));
        strv_push(&c->env, xasprintf("JOB_NAME=%s", d->job_name));
        c->pod = d;
        struct strbuf sb;
        strbuf_init(&sb, 4096);
        strbuf_appendf(&sb, "127.0.0.1:%d, engines", d->nm_port);
        for (int k = 0; k < d->endpoint_num; k++)
            strbuf_appendf(&sb, "%s%d", k ? "," : " ", d->ports[k]);
        c->listen = strbuf_take(&sb);
        strbuf_release(&sb);
        free(file);
        free(state);
    }
}

static void free_children(struct up *u)
{
    for (size_t i = 0; i < u->n_ch; i++) {
        struct child *c = &u->ch[i];
        if (c->proc) {
            proc_kill_now(c->proc);
            proc_free(c->proc);
        }
        if (u->r)
            reactor_timer_stop(u->r, &c->timer);
        free(c->name);
        free(c->log_path);
        free(c->listen);
        strv_free(c->argv);
        strv_free(c->env);
    }
    free(u->ch);
    u->ch = NULL;
    u->n_ch = 0;
}

/* Plan as JSON, for --dry-run. */
static json_t *plan_json(const struct up *u)
{
    json_t *pods = json_array();
    for (size_t i = 0; i < u->plan.n_pods; i++) {
        const struct up_pod *d = &u->plan.pods[i];
        json_t *ports = json_array();
        for (int k = 0; k < d->endpoint_num; k++)
            json_array_append_new(ports, json_integer(d->ports[k]));
        json_t *pj = json_pack("{s:s,s:s,s:i,s:i,s:i,s:s,s:i,s:o,s:i,s:i,s:i,s:s,s:s}", "name",
                               d->name, "role", up_role_name(d->role), "instance", d->instance,
                               "pod", d->pod, "index", d->index, "job_name", d->job_name,
                               "node_manager_port", d->nm_port, "engine_ports", ports, "dp_size",
                               d->dp_size, "dp_rpc_port", d->dp_rpc_port, "dp_master_port",
                               d->dp_master_port, "engine_type", d->engine_type, "model", d->model);
        /* Only where the node manager derives one (0 in the plan = none). */
        if (d->kv_port) {
            json_object_set_new(pj, "kv_port", json_integer(d->kv_port));
            json_object_set_new(pj, "kv_span", json_integer(d->kv_span));
        }
        if (d->bootstrap_port)
            json_object_set_new(pj, "bootstrap_port", json_integer(d->bootstrap_port));
        json_array_append_new(pods, pj);
    }
    return json_pack("{s:s,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:O}", "openai_url", u->openai_url,
                     "coordinator_port", u->plan.coord_port, "coordinator_mgmt_port",
                     u->plan.coord_mgmt_port, "controller_port", u->plan.ctl_port, "instances",
                     u->plan.n_instances, "pods", pods, "notes",
                     wire_strlist_to_json(&u->plan.notes), "warnings",
                     wire_strlist_to_json(&u->plan.warnings), "effective_config", u->plan.config);
}

static int lock_state_dir(struct up *u)
{
    char *path = xasprintf("%s/up.lock", u->state_dir);
    u->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    free(path);
    if (u->lock_fd < 0)
        return -errno;
    if (flock(u->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(u->lock_fd);
        u->lock_fd = -1;
        return e == EWOULDBLOCK ? -EBUSY : -e;
    }
    return 0;
}

static void clean_state(struct up *u, bool keep)
{
    if (!keep && u->plan.sqlite_path) {
        static const char *const sfx[] = {"", "-wal", "-shm", "-journal"};
        for (size_t i = 0; i < ARRAY_LEN(sfx); i++) {
            char *p = xasprintf("%s%s", u->plan.sqlite_path, sfx[i]);
            unlink(p);
            free(p);
        }
    }
    if (!keep) {
        for (size_t i = 0; i < u->plan.n_pods; i++) {
            char *n = xasprintf("%s.nm-state.json", u->plan.pods[i].name);
            unlink_quiet(u->state_dir, n);
            free(n);
        }
    }
}

static char *read_mgmt_key(const json_t *cfg)
{
    if (!json_is_true(cfg_lookup((json_t *)cfg,
                                 "motor_coordinator_config.mgmt_api_key_config.enable_api_key")))
        return NULL;
    const char *f = json_string_value(
        cfg_lookup((json_t *)cfg, "motor_coordinator_config.mgmt_api_key_config.api_key_file"));
    if (!f)
        return NULL;
    char *raw = util_read_file(f, 4096, NULL);
    if (raw)
        raw[strcspn(raw, "\r\n")] = '\0';
    return raw;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor up [-c FILE] [options]\n\n"
            "Runs a whole fleet on this host from one upstream user_config.json: the\n"
            "coordinator, the controller and one node manager per pod, which launch the\n"
            "engines the file names. Prints the OpenAI base URL once every instance is\n"
            "routable; Ctrl-C (or SIGTERM) stops everything.\n\n"
            "  -c, --config FILE     user_config.json (default: $USER_CONFIG_PATH)\n"
            "  --state-dir DIR       logs, the controller's store, up.json (default .motor-up)\n"
            "  --port-base N         move every port into N.. (N coordinator, N+1 its\n"
            "                        management API, N+3 controller, N+10.. node managers,\n"
            "                        then DP RPC and engine ports)\n"
            "  --keep-state          keep the controller's store from the last run\n"
            "  --ready-timeout S     exit 1 when the fleet is not ready after S seconds\n"
            "                        (default: wait)\n"
            "  --plain               log lines instead of the live view on a terminal\n"
            "  --dry-run             print the plan (pods, ports, effective config) and exit\n"
            "  --tls                 every listener on TLS (mutual TLS) with a throwaway local\n"
            "                        CA and certificates made in STATE_DIR/tls (openssl CLI);\n"
            "                        use tls/ca.crt and tls/client.{crt,key} as a client\n"
            "  --log-level LEVEL     motor up's own log level (default info)\n"
            "  -h, --help            this text\n");
}

struct up_args {
    const char *config, *state_dir, *log_level;
    int port_base;
    bool keep, plain, dry_run, tls;
    double ready_timeout;
};

static int parse_args(int argc, char **argv, struct up_args *a)
{
    const struct cliopt opts[] = {
        {"config", 'c', CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"state-dir", 0, CLIOPT_STRING, &a->state_dir, 0, 0, NULL},
        {"port-base", 0, CLIOPT_INT, &a->port_base, 1024, 65000, "an integer in [1024, 65000]"},
        {"keep-state", 0, CLIOPT_FLAG, &a->keep, 0, 0, NULL},
        {"ready-timeout", 0, CLIOPT_DOUBLE, &a->ready_timeout, 0, 86400, "seconds in [0, 86400]"},
        {"plain", 0, CLIOPT_FLAG, &a->plain, 0, 0, NULL},
        {"dry-run", 0, CLIOPT_FLAG, &a->dry_run, 0, 0, NULL},
        {"tls", 0, CLIOPT_FLAG, &a->tls, 0, 0, NULL},
        {"log-level", 0, CLIOPT_STRING, &a->log_level, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    return cliopt_parse("motor up", argc, argv, opts, usage);
}

/* motor up's client towards a listener kind: the block's files (a daemon's certificate
 * serves both ways, so it is also the client certificate mutual TLS asks for). */
static void client_tls(struct httpc_tls *t, const struct up_tls_side *s)
{
    *t = (struct httpc_tls){.ca_file = s->ca_file,
                            .cert_file = s->cert_file,
                            .key_file = s->key_file,
                            .key_password = s->key_password};
}

static char *self_exe(void)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0)
        return xstrdup("motor");
    buf[n] = '\0';
    return xstrdup(buf);
}

static void up_release(struct up *u)
{
    free_children(u);
    json_decref(u->model);
    json_decref(u->last_states);
    httpc_free(u->hc);
    reactor_free(u->r);
    up_plan_release(&u->plan);
    for (size_t i = 0; i < u->n_recent; i++)
        free(u->recent[i]);
    if (u->lock_fd >= 0)
        close(u->lock_fd);
    free(u->config_path);
    free(u->state_dir);
    free(u->eff_path);
    free(u->motor_bin);
    free(u->info_path);
    free(u->log_path);
    free(u->openai_url);
    free(u->infer_url);
    free(u->mgmt_url);
    free(u->ctl_url);
    free(u->mgmt_key);
    free(u->tls_dir);
    free(u->model_name);
}

int up_main(int argc, char **argv)
{
    struct up_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc == 1 ? 0 : 2;
    log_set_component("up");
    if (cliopt_log_level("motor up", a.log_level))
        return 2;
    const char *cfg_path = a.config ? a.config : getenv("USER_CONFIG_PATH");
    if (!cfg_path || !*cfg_path) {
        fprintf(stderr, "motor up: no configuration: use -c FILE (for example "
                        "examples/local.json) or set USER_CONFIG_PATH\n");
        return 2;
    }

    struct up u = {.lock_fd = -1, .exit_code = 1};
    u.start_ms = util_mono_ms();
    u.config_path = xstrdup(cfg_path);
    u.motor_bin = self_exe();
    u.ready_timeout_ms = (int64_t)(a.ready_timeout * 1000);
    const char *sd = a.state_dir ? a.state_dir : ".motor-up";
    if (!a.dry_run && mkdir_p(sd) < 0) {
        fprintf(stderr, "motor up: cannot create the state directory %s: %s\n", sd,
                strerror(errno));
        goto out;
    }
    char *abs = realpath(sd, NULL);
    if (abs) {
        u.state_dir = abs;
    } else if (sd[0] == '/') {
        u.state_dir = xstrdup(sd);
    } else {
        char cwd[PATH_MAX];
        u.state_dir = getcwd(cwd, sizeof(cwd)) ? xasprintf("%s/%s", cwd, sd) : xstrdup(sd);
    }
    u.eff_path = xasprintf("%s/user_config.json", u.state_dir);
    u.info_path = xasprintf("%s/up.json", u.state_dir);
    if (a.tls)
        u.tls_dir = xasprintf("%s/tls", u.state_dir);

    /* The plan. */
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    json_t *user = cfg_load_file(cfg_path, &errs);
    if (user) {
        struct up_plan_opts po = {.port_base = a.port_base,
                                  .state_dir = u.state_dir,
                                  .motor_bin = u.motor_bin,
                                  .tls_dir = u.tls_dir};
        up_plan_build(user, &po, &u.plan, &errs);
        json_decref(user);
    }
    if (cfg_errors_count(&errs)) {
        fprintf(stderr, "motor up: %s: cannot run this configuration (%d problem%s):\n%s", cfg_path,
                cfg_errors_count(&errs), cfg_errors_count(&errs) == 1 ? "" : "s",
                cfg_errors_text(&errs));
        cfg_errors_release(&errs);
        goto out;
    }
    u.infer_url =
        xasprintf("%s://127.0.0.1:%d", u.plan.infer_tls.on ? "https" : "http", u.plan.coord_port);
    u.openai_url = xasprintf("%s/v1", u.infer_url);
    u.mgmt_url = xasprintf("%s://127.0.0.1:%d", u.plan.mgmt_tls.on ? "https" : "http",
                           u.plan.coord_mgmt_port);
    u.ctl_url =
        xasprintf("%s://127.0.0.1:%d", u.plan.ctl_tls.on ? "https" : "http", u.plan.ctl_port);
    client_tls(&u.ctl_tls, &u.plan.ctl_tls);
    client_tls(&u.mgmt_tls, &u.plan.mgmt_tls);
    client_tls(&u.infer_tls, &u.plan.infer_tls);
    if (a.dry_run) {
        json_t *pj = plan_json(&u);
        char *s = json_dumps(pj, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        printf("%s\n", s ? s : "null");
        free(s);
        json_decref(pj);
        cfg_errors_release(&errs);
        u.exit_code = 0;
        goto out;
    }

    rc = lock_state_dir(&u);
    if (rc < 0) {
        fprintf(stderr, "motor up: %s: %s\n", u.state_dir,
                rc == -EBUSY ? "another `motor up` is running with this state directory"
                             : strerror(-rc));
        cfg_errors_release(&errs);
        goto out;
    }
    if (up_plan_check_free(&u.plan, &errs) < 0) {
        fprintf(stderr,
                "motor up: ports needed by %s are in use (stop what holds them, or "
                "move the fleet with --port-base N):\n%s",
                cfg_path, cfg_errors_text(&errs));
        cfg_errors_release(&errs);
        goto out;
    }
    cfg_errors_release(&errs);
    clean_state(&u, a.keep);
    if (u.tls_dir) {
        char terr[512];
        if (up_tls_make(u.tls_dir, a.keep, terr, sizeof(terr)) < 0) {
            fprintf(stderr, "motor up: --tls: %s\n", terr);
            goto out;
        }
    }
    char *logs = xasprintf("%s/logs", u.state_dir);
    rc = mkdir_p(logs);
    free(logs);
    char *eff = json_dumps(u.plan.config, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (rc < 0 || !eff || util_write_file_atomic(u.eff_path, eff, strlen(eff), 0644) < 0) {
        fprintf(stderr, "motor up: cannot write %s: %s\n", u.eff_path, strerror(errno));
        free(eff);
        goto out;
    }
    free(eff);
    u.mgmt_key = read_mgmt_key(u.plan.config);

    /* Output: the live view owns a terminal; our log then goes to a file. */
    const char *term = getenv("TERM");
    u.tty = !a.plain && isatty(STDOUT_FILENO) && term && strcmp(term, "dumb") != 0;
    int log_fd = -1;
    if (u.tty) {
        u.log_path = xasprintf("%s/up.log", u.state_dir);
        log_fd = open(u.log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (log_fd >= 0)
            log_set_fd(log_fd);
        else
            u.tty = false;
    }
    log_info("up_starting", LF_STR("config", cfg_path), LF_STR("effective_config", u.eff_path),
             LF_STR("state_dir", u.state_dir), LF_INT("instances", u.plan.n_instances),
             LF_INT("pods", u.plan.n_pods), LF_STR("openai_url", u.openai_url),
             LF_INT("pid", getpid()));
    for (size_t i = 0; i < u.plan.notes.n; i++)
        log_info("up_config_adjusted", LF_STR("change", u.plan.notes.items[i]));
    for (size_t i = 0; i < u.plan.warnings.n; i++)
        log_warn("up_config_warning", LF_STR("warning", u.plan.warnings.items[i]));

    u.r = reactor_new();
    if (!u.r) {
        fprintf(stderr, "motor up: reactor: %s\n", strerror(errno));
        goto out_log;
    }
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGWINCH};
    rc = reactor_watch_signals(u.r, sigs, ARRAY_LEN(sigs), on_signal, &u);
    if (rc < 0) {
        fprintf(stderr, "motor up: signals: %s\n", strerror(-rc));
        goto out_log;
    }
    rc = proc_become_subreaper();
    if (rc < 0)
        log_warn("up_subreaper_failed", LF_STR("error", strerror(-rc)));
    u.hc = httpc_new(u.r);
    if (!u.hc) {
        fprintf(stderr, "motor up: cannot create the HTTP client\n");
        goto out_log;
    }
    u.last_states = json_object();
    reactor_timer_init(&u.boot_timer, boot_tick, &u);
    reactor_timer_init(&u.poll_timer, poll_tick, &u);
    reactor_timer_init(&u.stop_timer, stop_deadline, &u);
    build_children(&u);
    write_info(&u);
    if (!u.tty)
        fprintf(stderr,
                "motor up: starting %d instance(s) (%zu node manager(s)) from %s; "
                "logs in %s/logs\n",
                u.plan.n_instances, u.plan.n_pods, cfg_path, u.state_dir);
    u.phase = PH_BOOT_COORD;
    u.exit_code = 0;
    boot_next(&u);
    render_view(&u);
    rc = reactor_run(u.r);
    if (rc < 0) {
        log_error("up_reactor_failed", LF_STR("error", strerror(-rc)));
        kill_all_now(&u);
        sweep_orphans();
        u.exit_code = 1;
    }
    unlink(u.info_path);
    if (u.tty)
        fprintf(stdout, "\nmotor up: stopped (exit %d); logs in %s/logs\n", u.exit_code,
                u.state_dir);
    else
        fprintf(stderr, "motor up: stopped (exit %d)\n", u.exit_code);
out_log:
    log_set_fd(STDERR_FILENO);
    if (log_fd >= 0)
        close(log_fd);
out:
    rc = u.exit_code;
    up_release(&u);
    return rc;
}
