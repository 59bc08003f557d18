/* motor node-manager — process lifecycle: command line, configuration, the one reactor,
 * signals, metrics, and the shutdown that always ends with exit status 255 (upstream's
 * sys.exit(-1): "restart this pod"). */
#include "nodemgr/nm_internal.h"
#include "nodemgr/nm_ports.h"

#include "nodemgr/nodemgr.h"
#include "common/cliopt.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* Extra time after the engines' stop grace before the shutdown stops waiting. */
#define SHUTDOWN_SLACK_MS 3000

int64_t nm_heartbeat_interval_ms(const struct nodemgr *nm)
{
    int64_t ms = nm_config_ms(nm->cfg->heartbeat_interval_seconds);
    return ms < 10 ? 10 : ms;
}

int64_t nm_stop_grace_ms(const struct nodemgr *nm)
{
    return nm_config_ms(nm->cfg->stop_grace_seconds);
}

int64_t nm_probe_period_ms(const struct nodemgr *nm)
{
    /* Upstream polls every second; with a shorter heartbeat interval probe at least as
     * often as we report, so a heartbeat never carries a status older than itself. */
    int64_t hb = nm_heartbeat_interval_ms(nm);
    int64_t p = hb < NM_PROBE_PERIOD_MAX_MS ? hb : NM_PROBE_PERIOD_MAX_MS;
    return p < 50 ? 50 : p;
}

/* ---- metrics --------------------------------------------------------------------------- */

static void metrics_setup(struct nodemgr *nm)
{
    struct nm_metrics *m = &nm->m;
    m->reg = metrics_registry_new();
    m->spawns =
        metrics_counter_new(m->reg, "motor_nm_engine_spawns_total", "Engine processes started.");
    m->deaths = metrics_counter_new(m->reg, "motor_nm_engine_deaths_total",
                                    "Engine processes that exited without being asked to.");
    m->local_restarts = metrics_counter_new(m->reg, "motor_nm_engine_local_restarts_total",
                                            "Engines restarted by the local restart policy.");
    m->relaunches = metrics_counter_new(m->reg, "motor_nm_relaunches_total",
                                        "In-place relaunches of all engines (engine-restart).");
    m->probe_failures =
        metrics_counter_new(m->reg, "motor_nm_probe_failures_total", "Failed /health probes.");
    struct metrics_family *rep =
        metrics_counter_family(m->reg, "motor_nm_fault_reports_total",
                               "Software-fault reports sent to the Controller.", "result");
    m->reports_accepted = metrics_counter_labels(rep, "result", "accepted");
    m->reports_rejected = metrics_counter_labels(rep, "result", "not_accepted");
    m->reports_failed = metrics_counter_labels(rep, "result", "failed");
    struct metrics_family *hb = metrics_counter_family(m->reg, "motor_nm_heartbeats_total",
                                                       "Heartbeats sent, by result.", "result");
    m->hb_ok = metrics_counter_labels(hb, "result", "ok");
    m->hb_failed = metrics_counter_labels(hb, "result", "failed");
    m->hb_503 = metrics_counter_labels(hb, "result", "unknown_instance");
    struct metrics_family *rg = metrics_counter_family(
        m->reg, "motor_nm_registrations_total", "Registration attempts, by result.", "result");
    m->reg_ok = metrics_counter_labels(rg, "result", "ok");
    m->reg_failed = metrics_counter_labels(rg, "result", "failed");
    struct metrics_family *rl = metrics_counter_family(
        m->reg, "motor_nm_config_reloads_total", "Configuration reloads, by result.", "result");
    m->reloads_ok = metrics_counter_labels(rl, "result", "ok");
    m->reloads_failed = metrics_counter_labels(rl, "result", "invalid");
    static const double lat[] = {.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5, 15};
    m->death_report_latency = metrics_histogram_new(
        m->reg, "motor_nm_death_report_seconds",
        "From an engine's exit to the Controller's answer to its fault report.", lat,
        ARRAY_LEN(lat));
}

/* ---- shutdown --------------------------------------------------------------------------- */

static void shutdown_done(struct nodemgr *nm, void *arg)
{
    (void)arg;
    log_info("nm_stopped", LF_INT("exit_code", nm->exit_code));
    reactor_stop(nm->r);
}

static void shutdown_deadline(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    log_warn("shutdown_deadline", LF_STR("action", "killing what is left"));
    nm_services_kill_now(nm);
    reactor_stop(nm->r);
}

static void stdin_unwatch(struct nodemgr *nm);

void nm_shutdown(struct nodemgr *nm, const char *reason)
{
    nm_phase_event(nm, NM_PEV_SHUTDOWN, reason);
}

void nm_shutdown_run(struct nodemgr *nm, const char *reason)
{
    log_info("nm_shutdown", LF_STR("reason", reason), LF_INT("exit_code", nm->exit_code));
    stdin_unwatch(nm);
    nm_ctrl_stop(nm);
    nm_arb_stop(nm);
    nm_engine_probes_stop(nm);
    reactor_timer_stop(nm->r, &nm->tick_timer);
    nm_ft_stop(nm);
    nm_pool_shutdown(nm);
    nm_launch_shutdown(nm);
    int64_t grace = nm_stop_grace_ms(nm);
    nm_timer_start(nm->r, &nm->shutdown_timer, shutdown_deadline, nm, grace + SHUTDOWN_SLACK_MS, 0);
    /* Reverse registration order; engines get SIGTERM, the grace, SIGKILL, the sweep. */
    nm_services_stop(nm, grace, shutdown_done, NULL);
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct nodemgr *nm = arg;
    switch (signo) {
    case SIGCHLD:
        /* We are a subreaper: orphans of engine trees land here and must be reaped. */
        proc_reap_orphans();
        break;
    case SIGHUP:
        log_info("config_reload_signal");
        nm_reload_now(nm);
        break;
    case SIGINT:
    case SIGTERM:
        if (nm_shutting_down(nm)) {
            /* A second signal: no more grace. */
            log_warn("nm_kill_now", LF_INT("signal", signo));
            nm_services_kill_now(nm);
            reactor_stop(r);
            return;
        }
        nm_shutdown(nm, signo == SIGTERM ? "SIGTERM" : "SIGINT");
        break;
    }
}

/* ---- stdin (upstream §2.2: a line "stop", any case, ends the daemon loop) --------------- */

static void stdin_unwatch(struct nodemgr *nm)
{
    if (nm->stdin_watched)
        reactor_del_fd(nm->r, STDIN_FILENO);
    nm->stdin_watched = false;
}

static void stdin_line(struct nodemgr *nm, char *line)
{
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t'))
        line[--n] = '\0';
    char *p = line;
    while (*p == ' ' || *p == '\t')
        p++;
    if (strcasecmp(p, "stop") == 0)
        nm_shutdown(nm, "stdin stop");
    else if (*p)
        log_info("stdin_ignored", LF_STR("line", p), LF_STR("hint", "type stop to shut down"));
}

static void on_stdin(struct reactor *r, int fd, uint32_t events, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    char buf[256];
    /* One read per wake-up: epoll said readable, so it cannot block, and O_NONBLOCK is
     * not set because the descriptor (a terminal) may be shared with the shell. */
    ssize_t got = read(fd, buf, sizeof(buf));
    if (got <= 0) {
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            return;
        /* EOF (closed pipe, container without stdin): stop watching, no busy loop. */
        stdin_unwatch(nm);
        return;
    }
    for (ssize_t i = 0; i < got; i++) {
        if (buf[i] == '\n') {
            nm->stdin_line[nm->stdin_len] = '\0';
            stdin_line(nm, nm->stdin_line);
            nm->stdin_len = 0;
        } else if (nm->stdin_len + 1 < sizeof(nm->stdin_line)) {
            nm->stdin_line[nm->stdin_len++] = buf[i];
        } /* longer lines are cut: "stop" is short, anything long is not it */
    }
}

/* Watch stdin when it can carry a line: a pipe, socket or terminal. /dev/null, a
 * regular file or a closed descriptor are skipped (epoll refuses regular files, and
 * reading /dev/null is an immediate EOF). */
static void stdin_watch(struct nodemgr *nm)
{
    struct stat st;
    if (fstat(STDIN_FILENO, &st) < 0)
        return;
    bool usable = S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) ||
                  (S_ISCHR(st.st_mode) && isatty(STDIN_FILENO));
    if (!usable)
        return;
    if (reactor_add_fd(nm->r, STDIN_FILENO, EPOLLIN, on_stdin, nm) == 0)
        nm->stdin_watched = true;
}

static void tick(struct reactor *r, void *arg)
{
    (void)r;
    struct nodemgr *nm = arg;
    nm_services_health_check(nm);
    /* daemon_loop_interval is hot-reloadable (§2.2). */
    int64_t iv = nm_config_ms(nm->cfg->daemon_loop_interval);
    if (iv < 50)
        iv = 50;
    if (nm->tick_timer.interval_ms != iv)
        nm_timer_start(nm->r, &nm->tick_timer, tick, nm, iv, iv);
}

/* ---- command line ------------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor node-manager [options]\n\n"
            "Supervises the inference engines of one pod/host: registers with the Controller,\n"
            "launches engines on its start command, probes them, heartbeats, reports faults,\n"
            "relaunches engines in place, and exits 255 when they stay broken.\n\n"
            "  --config PATH       user_config.json (default: $USER_CONFIG_PATH, $CONFIG_PATH)\n"
            "  --role ROLE         prefill, decode, union, encode (default: $ROLE)\n"
            "  --check-config      print the effective configuration as JSON and exit\n"
            "  --port N            API port override (0 = ephemeral; default: the config's)\n"
            "  --state-file PATH   launch-parameter file (default: $MOTOR_NM_STATE_FILE, else\n"
            "                      /tmp/motor-node-manager-<port>.json; \"\" disables it)\n"
            "  --log-level LEVEL   debug, info, warn, error (default: logging_config.log_level)\n"
            "  -h, --help          this text\n\n"
            "The bound port is logged as {\"event\":\"nm_listening\",...}. SIGHUP reloads the\n"
            "configuration; SIGTERM stops the engines and exits 255.\n");
}

struct cli_args {
    const char *config, *role, *state_file, *log_level;
    int port;
    bool check;
};

static int parse_args(int argc, char **argv, struct cli_args *a)
{
    const struct cliopt opts[] = {
        {"config", 0, CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"role", 0, CLIOPT_STRING, &a->role, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &a->port, 0, 65535, "0-65535"},
        {"state-file", 0, CLIOPT_STRING, &a->state_file, 0, 0, NULL},
        {"log-level", 0, CLIOPT_STRING, &a->log_level, 0, 0, NULL},
        {"check-config", 0, CLIOPT_FLAG, &a->check, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    a->port = -1;
    return cliopt_parse("motor node-manager", argc, argv, opts, usage);
}

/* ---- main ------------------------------------------------------------------------------- */

static void nm_free(struct nodemgr *nm)
{
    nm_services_kill_now(nm);
    nm_pool_free(nm);
    httpd_free(nm->api);
    nm->api = NULL;
    nm_scaledown_free(nm);
    nm_ft_free(nm);
    nm_ctrl_free(nm);
    nm_engine_probes_stop(nm);
    nm_services_destroy(nm);
    nm_engine_free_endpoints(nm);
    httpc_free(nm->ctl_http);
    httpc_free(nm->probe_http);
    nm->ctl_http = nm->probe_http = NULL;
    nm_reload_free(nm);
    nm_launch_shutdown(nm);
    if (nm->launch) {
        wire_start_cmd_release(nm->launch);
        free(nm->launch);
        nm->launch = NULL;
    }
    /* Queued tasks (deferred report callbacks) run here, with nm still valid. */
    reactor_free(nm->r);
    nm->r = NULL;
    metrics_registry_free(nm->m.reg);
    nm_config_free(nm->cfg);
    if (nm->passthrough_fd >= 0)
        close(nm->passthrough_fd);
    free(nm->state_path);
    free(nm);
}

static char *default_state_path(const struct cli_args *a, int port)
{
    if (a->state_file)
        return xstrdup(a->state_file);
    const char *env = getenv("MOTOR_NM_STATE_FILE");
    if (env)
        return xstrdup(env);
    return xasprintf("/tmp/motor-node-manager-%d.json", port);
}

int node_manager_main(int argc, char **argv)
{
    struct cli_args a = {0};
    int rc = parse_args(argc, argv, &a);
    if (rc == 1)
        return 0;
    if (rc)
        return rc;
    if (a.check)
        return nm_check_config_main(argc, argv);

    log_set_component("node-manager");
    struct nm_config_opts opts = {.config_path = a.config, .role = a.role};
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *cfg = nm_config_load(&opts, &errs);
    if (!cfg) {
        fprintf(stderr, "invalid node manager configuration (%d error%s):\n%s",
                cfg_errors_count(&errs), cfg_errors_count(&errs) == 1 ? "" : "s",
                cfg_errors_text(&errs));
        log_error("config_invalid", LF_INT("errors", cfg_errors_count(&errs)),
                  LF_STR("detail", cfg_errors_text(&errs)));
        cfg_errors_release(&errs);
        return 1;
    }
    cfg_errors_release(&errs);
    enum log_level lvl;
    if (a.log_level) {
        if (cliopt_log_level("motor node-manager", a.log_level)) {
            nm_config_free(cfg);
            return 2;
        }
    } else if (log_parse_level(cfg->log_level, &lvl) == 0) {
        log_set_level(lvl);
    }
    for (size_t i = 0; i < cfg->warnings.n; i++)
        log_warn("config_warning", LF_STR("warning", cfg->warnings.items[i]));
    char port_err[256];
    if (nm_ports_allocate(cfg, a.port >= 0, port_err, sizeof(port_err)) < 0) {
        fprintf(stderr, "motor node-manager: %s\n", port_err);
        log_error("port_allocation_failed", LF_STR("error", port_err));
        nm_config_free(cfg);
        return 1;
    }

    struct nodemgr *nm = xcalloc(1, sizeof(*nm));
    nm->cfg = cfg;
    nm->exit_code = NM_EXIT_STATUS;
    nm->port_override = a.port;
    nm->passthrough_fd = -1;
    nm->boot_ms = util_mono_ms();
    struct reactor_timer *timers[] = {
        &nm->stop_exit_timer, &nm->shutdown_timer, &nm->tick_timer,          &nm->probe_timer,
        &nm->wait_timer,      &nm->arb_timer,      &nm->ctrl.register_timer, &nm->ctrl.hb_timer,
    };
    for (size_t i = 0; i < ARRAY_LEN(timers); i++)
        reactor_timer_init(timers[i], NULL, NULL);
    nm_arbiter_init(&nm->arb);

    nm->r = reactor_new();
    if (!nm->r) {
        log_error("reactor_failed", LF_STR("error", strerror(errno)));
        nm_config_free(cfg);
        free(nm);
        return 1;
    }
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
    rc = reactor_watch_signals(nm->r, sigs, ARRAY_LEN(sigs), on_signal, nm);
    if (rc < 0) {
        log_error("signals_failed", LF_STR("error", strerror(-rc)));
        goto fail;
    }
    /* Orphans of engine process trees are ours to reap (§12.21: no zombies even when
     * the node manager runs as the container's PID 1 or under a shell). */
    rc = proc_become_subreaper();
    if (rc < 0)
        log_warn("subreaper_failed", LF_STR("error", strerror(-rc)));
    nm->ctl_http = httpc_new(nm->r);
    nm->probe_http = httpc_new(nm->r);
    if (!nm->ctl_http || !nm->probe_http) {
        log_error("http_client_failed");
        goto fail;
    }
    metrics_setup(nm);
    if (nm_services_create(nm) < 0)
        goto fail;
    if (nm_api_init(nm) < 0)
        goto fail;
    nm->state_path = default_state_path(&a, nm->api_port);
    nm_ctrl_init(nm);
    nm_engine_passthrough_init(nm);
    stdin_watch(nm);
    nm_launch_restore(nm);
    if (nm_reload_init(nm) < 0)
        goto fail;
    int64_t iv = nm_config_ms(cfg->daemon_loop_interval);
    nm_timer_start(nm->r, &nm->tick_timer, tick, nm, iv < 50 ? 50 : iv, iv < 50 ? 50 : iv);
    nm_arb_start(nm);

    log_info(
        "nm_started", LF_STR("label", "NodeManager"), LF_STR("role", wire_role_str(cfg->role)),
        LF_STR("job_name", cfg->job_name),
        LF_STR("engine_type", nm_engine_type_str(cfg->engine_type)),
        LF_INT("endpoints", cfg->endpoint_num), LF_INT("port", nm->api_port),
        LF_STR("controller", nm->ctrl.enabled ? nm->ctrl.base_url : NULL),
        LF_BOOL("standalone", cfg->standalone), LF_BOOL("has_engine", nm->has_engine),
        LF_STR("restart_policy", cfg->restart_policy == NM_RESTART_LOCAL ? "local" : "controller"),
        LF_BOOL("container_restart_managed", cfg->ft.container_restart_managed),
        LF_STR("state_file", nm->state_path), LF_INT("pid", getpid()));

    if (!nm->has_engine) {
        /* KV-only pod (§2.3): the KV service runs, nothing registers or heartbeats. */
        struct wire_err err = {{0}};
        if (nm_services_pull_others(nm, &err) < 0)
            log_error("kv_store_start_failed", LF_STR("error", err.msg));
    } else if (cfg->standalone) {
        nm_launch_standalone(nm);
    } else {
        nm_ctrl_start_register(nm);
    }

    rc = reactor_run(nm->r);
    if (rc < 0)
        log_error("reactor_failed", LF_STR("error", strerror(-rc)));
    int code = nm->exit_code;
    nm_free(nm);
    return code;

fail:
    nm_free(nm);
    return 1;
}
