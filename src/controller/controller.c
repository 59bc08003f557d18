/* motor controller — the process: arguments, configuration, metrics, TLS settings,
 * signals, the reactor and its timers, the HTTP API, then the leader campaign; and the
 * orderly teardown. The jobs live in their own files: leadership and state (ctl_leader.c),
 * the assembler driver (ctl_assemble.c), start commands (ctl_start.c), the instance
 * manager (ctl_instmgr.c), fault tolerance (ctl_faults.c and the strategies), the
 * coordinator push (ctl_push.c), the API (ctl_api.c). One reactor thread does everything. */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "controller/controller.h"
#include "common/list.h"
#include "common/cliopt.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- timers ----------------------------------------------------------------------------- */

/* The strategy center's period (and its kick, ctl_faults_kick). */
static void on_strat_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->loaded)
        ctl_faults_tick(c);
}

/* ---- metrics -------------------------------------------------------------------------- */

static void metrics_setup(struct ctl *c)
{
    struct ctl_metrics *m = &c->m;
    m->reg = metrics_registry_new();
    m->registrations = metrics_counter_new(m->reg, "motor_controller_registrations_total",
                                           "POST /controller/register calls.");
    m->reregistrations = metrics_counter_new(m->reg, "motor_controller_reregistrations_total",
                                             "POST /controller/reregister calls.");
    m->register_errors = metrics_counter_new(m->reg, "motor_controller_register_errors_total",
                                             "Registrations answered with an error.");
    m->heartbeats = metrics_counter_family(m->reg, "motor_controller_heartbeats_total",
                                           "Heartbeats by result.", "result");
    m->hb_ok = metrics_counter_labels(m->heartbeats, "result", "ok");
    m->hb_unknown = metrics_counter_labels(m->heartbeats, "result", "unknown_instance");
    m->hb_invalid = metrics_counter_labels(m->heartbeats, "result", "invalid");
    m->hb_rejected = metrics_counter_labels(m->heartbeats, "result", "rejected");
    m->faults = metrics_counter_family(m->reg, "motor_controller_software_faults_total",
                                       "Software fault reports by engine status.", "status");
    m->strategies = metrics_counter_family(m->reg, "motor_controller_strategies_total",
                                           "Fault-tolerance strategies finished, by result.",
                                           "strategy", "result");
    m->pushes = metrics_counter_family(m->reg, "motor_controller_coordinator_pushes_total",
                                       "POST /instances/refresh calls by event and result.",
                                       "event", "result");
    m->start_ok = metrics_counter_new(m->reg, "motor_controller_start_commands_total",
                                      "Start commands accepted by node managers.");
    m->start_failed = metrics_counter_new(m->reg, "motor_controller_start_command_failures_total",
                                          "Start commands that failed.");
    m->transitions = metrics_counter_family(m->reg, "motor_controller_instance_transitions_total",
                                            "Instance state changes by new state.", "to");
    m->isolation_suppressed =
        metrics_counter_new(m->reg, "motor_controller_isolation_suppressed_total",
                            "Heartbeat timeouts cancelled because every node manager answered.");
    m->freshness_gate =
        metrics_counter_new(m->reg, "motor_controller_freshness_gate_total",
                            "Transitions to active refused: a member's heartbeat was stale.");
    m->partial_loss = metrics_counter_family(
        m->reg, "motor_controller_partial_loss_total",
        "Instances deleted while some members still heartbeat, by action.", "action");
    m->nm_auth_failed =
        metrics_counter_new(m->reg, "motor_controller_node_manager_auth_failures_total",
                            "Node-manager calls refused for the management key (401 or 403).");
    m->coord_restarts =
        metrics_counter_new(m->reg, "motor_controller_coordinator_restarts_total",
                            "Coordinator restarts detected by a changed boot id (full set sent).");
    struct metrics_family *rl =
        metrics_counter_family(m->reg, "motor_controller_config_reloads_total",
                               "Configuration reloads, by result.", "result");
    m->reloads_ok = metrics_counter_labels(rl, "result", "ok");
    m->reloads_failed = metrics_counter_labels(rl, "result", "invalid");
}

/* ---- arguments, configuration, signals -------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor controller [options]\n\n"
            "The fleet's brain: assembles instances from node-manager registrations, starts\n"
            "them, tracks their health, runs the fault-tolerance strategies and tells the\n"
            "coordinator which instances are routable.\n\n"
            "  --config PATH      user_config.json (default: $USER_CONFIG_PATH, $CONFIG_PATH)\n"
            "  --check-config     print the effective configuration as JSON and exit 0, or\n"
            "                     every error and exit 1\n"
            "  --host ADDR        bind address (api_config.controller_api_host)\n"
            "  --port N           API port (default 1026; 0 = ephemeral)\n"
            "  --log-level LEVEL  debug, info, warn, error (default info)\n"
            "  -h, --help         this text\n\n"
            "The bound port is logged as {\"event\":\"controller_listening\",...}. SIGHUP, or a\n"
            "change of the file (or of its TLS files), reloads the configuration: live keys\n"
            "apply at once, restart keys are named and keep their running values.\n");
}

struct cli_args {
    const char *config;
    const char *host;
    const char *log_level;
    int port;
    bool check;
};

static int parse_args(int argc, char **argv, struct cli_args *a)
{
    const struct cliopt opts[] = {
        {"config", 0, CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"host", 0, CLIOPT_STRING, &a->host, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &a->port, 0, 65535, "0-65535"},
        {"log-level", 0, CLIOPT_STRING, &a->log_level, 0, 0, NULL},
        {"check-config", 0, CLIOPT_FLAG, &a->check, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    a->port = -1;
    return cliopt_parse("motor controller", argc, argv, opts, usage);
}

static int load_config(struct ctl *c, const struct cli_args *a)
{
    const char *path = cliopt_config_path(a->config);
    c->cli.config = path ? xstrdup(path) : NULL;
    c->cli.host = a->host ? xstrdup(a->host) : NULL;
    c->cli.port = a->port;
    c->cli.log_level_pinned = a->log_level != NULL;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    int rc = ctl_config_read(&c->cli, &c->cfg, &e);
    if (rc) {
        int n = cfg_errors_count(&e);
        log_error("config_invalid", LF_STR("path", path), LF_STR("errors", cfg_errors_text(&e)));
        fprintf(stderr, "motor controller: invalid configuration %s (%d error%s):\n%s",
                path ? path : "", n, n == 1 ? "" : "s", cfg_errors_text(&e));
        cfg_errors_release(&e);
        return -EINVAL;
    }
    cfg_errors_release(&e);
    if (!c->cli.log_level_pinned) {
        enum log_level lvl;
        if (log_parse_level(c->cfg.log_level, &lvl) == 0)
            log_set_level(lvl);
    }
    if (a->check)
        return ctlcfg_print_check(&c->cfg, path) == 0 ? 1 : -EIO;
    log_info("config_loaded", LF_STR("path", path), LF_STR("host", c->cfg.host),
             LF_INT("port", c->cfg.port), LF_STR("store", ctlcfg_store_name(c->cfg.store)),
             LF_STR("coordinator", c->cfg.coordinator_host),
             LF_INT("coordinator_port", c->cfg.coordinator_port),
             LF_BOOL("fault_tolerance", c->cfg.ft_enable),
             LF_BOOL("engine_relaunch", c->cfg.relaunch_enable),
             LF_BOOL("dp_scale_down", c->cfg.scale_down_enable),
             LF_INT("heartbeat_timeout_ms", c->cfg.hb_timeout_active_ms),
             LF_INT("heartbeat_timeout_inactive_ms", c->cfg.hb_timeout_other_ms));
    return 0;
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct ctl *c = arg;
    if (signo == SIGHUP) {
        log_info("config_reload_signal");
        ctl_reload_now(c, "SIGHUP");
        return;
    }
    log_info("controller_stopping", LF_INT("signal", signo));
    c->stopping = true;
    reactor_stop(r);
}

static const char *const quiet_paths[] = {
    "/liveness", "/readiness", "/startup", "/metrics", "/controller/heartbeat", NULL};

int controller_main(int argc, char **argv)
{
    struct cli_args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc == 1 ? 0 : 2;
    log_set_component("controller");
    if (cliopt_log_level("motor controller", a.log_level))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    long nofile = util_raise_nofile_limit();
    if (nofile >= 0 && nofile < 8192)
        log_warn("open_files_limit_low", LF_INT("limit", nofile),
                 LF_STR("why", "each client, node manager and engine connection holds one; raise "
                               "the hard limit (ulimit -Hn, LimitNOFILE=)"));

    struct ctl *c = xcalloc(1, sizeof(*c));
    list_init(&c->calls);
    int exit_code = 1;
    /* Timers first: the cleanup path stops them whatever failed. */
    reactor_timer_init(&c->asm_timer, ctl_asm_on_timer, c);
    reactor_timer_init(&c->asm_kick, ctl_asm_on_timer, c);
    reactor_timer_init(&c->send_timer, ctl_start_on_timer, c);
    reactor_timer_init(&c->mgr_timer, ctl_instmgr_on_timer, c);
    reactor_timer_init(&c->strat_timer, on_strat_timer, c);
    reactor_timer_init(&c->strat_kick, on_strat_timer, c);
    reactor_timer_init(&c->load_retry, ctl_leader_on_load_retry, c);
    reactor_timer_init(&c->daemon_timer, ctl_daemon_tick, c);
    int lrc = load_config(c, &a);
    if (lrc != 0) {
        ctlcfg_release(&c->cfg);
        free(c->cli.config);
        free(c->cli.host);
        free(c);
        return lrc == 1 ? 0 : 1;
    }
    c->start_wall_ms = util_wall_ms();
    c->next_id = 1;
    ctl_tls_settings(c);
    metrics_setup(c);
    ctl_prec_init(c);
    ctl_push_init(c);
    c->r = reactor_new();
    if (!c->r) {
        log_error("reactor_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    if (reactor_watch_signals(c->r, sigs, ARRAY_LEN(sigs), on_signal, c) < 0) {
        log_error("signals_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    c->hc = httpc_new(c->r);
    if (!c->hc) {
        log_error("http_client_failed");
        goto out;
    }
    struct httpd_config hc = {
        .name = "controller-api",
        .host = c->cfg.host,
        .port = (uint16_t)c->cfg.port,
        .max_body = 8u << 20,
        .max_connections = 4096,
        .quiet_paths = quiet_paths,
    };
    if (c->use_tls) {
        hc.tls_cert_file = c->cfg.tls.cert_file;
        hc.tls_key_file = c->cfg.tls.key_file;
        hc.tls_ca_file = c->cfg.tls.ca_file;
        hc.tls_key_password = c->cfg.tls.key_password;
    }
    c->httpd = httpd_new(c->r, &hc);
    if (!c->httpd) {
        log_error("listen_failed", LF_STR("host", c->cfg.host), LF_INT("port", c->cfg.port),
                  LF_STR("error", strerror(errno)));
        fprintf(stderr, "motor controller: cannot listen on %s:%d: %s\n", c->cfg.host, c->cfg.port,
                strerror(errno));
        goto out;
    }
    c->port = httpd_port(c->httpd);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    c->owner = xasprintf("%s:%d:%d", host, (int)getpid(), c->port);
    ctl_api_register_routes(c);
    if (ctl_obs_listen(c) < 0) {
        fprintf(stderr, "motor controller: cannot listen on the observability port %d\n",
                c->cfg.obs_port);
        goto out;
    }
    c->store = ctl_leader_open_store(c);
    if (!c->store)
        goto out;
    log_info("controller_listening", LF_STR("host", c->cfg.host), LF_INT("port", c->port),
             LF_INT("pid", getpid()), LF_STR("store", ctlcfg_store_name(c->cfg.store)),
             LF_STR("owner", c->owner));
    ctl_reload_init(c);
    ctl_leader_campaign(c);

    int rc = reactor_run(c->r);
    exit_code = rc < 0 ? 1 : c->exit_code;
out:
    c->stopping = true;
    if (c->store && c->leader) {
        size_t left = store_flush(c->store, 2000);
        if (left)
            log_warn("store_flush_incomplete", LF_INT("pending", left));
    }
    if (c->r) {
        reactor_timer_stop(c->r, &c->asm_timer);
        reactor_timer_stop(c->r, &c->asm_kick);
        reactor_timer_stop(c->r, &c->send_timer);
        reactor_timer_stop(c->r, &c->mgr_timer);
        reactor_timer_stop(c->r, &c->strat_timer);
        reactor_timer_stop(c->r, &c->strat_kick);
        reactor_timer_stop(c->r, &c->load_retry);
        ctl_reload_free(c);
        ctl_push_stop(c);
    }
    ctl_obs_free(c);
    httpd_free(c->httpd);
    httpc_free(c->hc);
    ctl_requests_drop_all(c);
    ctl_instmgr_free_all(c);
    ctl_prec_free(c);
    ctl_auth_fails_free(c);
    for (size_t i = 0; i < c->n_restops; i++)
        free(c->restops[i].key);
    free(c->restops);
    store_free(c->store);
    reactor_free(c->r);
    metrics_registry_free(c->m.reg);
    free(c->owner);
    ctlcfg_release(&c->cfg);
    free(c->cli.config);
    free(c->cli.host);
    free(c);
    log_info("controller_stopped", LF_INT("exit_code", exit_code));
    return exit_code;
}
