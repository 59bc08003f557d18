/* ctl_reload — the controller's configuration hot reload, the node manager's way
 * (common/cfgwatch.h: inotify on the directories of the config file and of the TLS
 * files, debounce, identity; SIGHUP as well).
 *
 * A reload reads the whole file again with the same command-line overrides. An invalid
 * file changes nothing and says why (config_reload_failed, every error). A valid one is
 * adopted through the configuration table's classes (common/cfgtab.h): every live key
 * takes its new value at once, every restart key keeps its running value and is named
 * in config_reload_restart_required — one list, the table's, which docs/controller.md
 * shows. Effects of the live keys:
 *   * periods: the assembler, start-command, instance-manager and strategy timers, the
 *     coordinator heartbeat and periodic set, the daemon loop — restarted at the new
 *     period (a shorter one takes effect at once, not after the old period);
 *   * timeouts, retry counts, fault-tolerance switches: read where they are used, so the
 *     next use sees them (a strategy already running finishes under the values it
 *     started with where it copied them); the scale-down gate of every instance is
 *     recomputed;
 *   * the coordinator's address, port and key: the next push goes there, with a full set
 *     (its view is unknown);
 *   * the log level (unless --log-level pinned it);
 *   * TLS files: the API (and observability) listener builds a new context for the
 *     connections it accepts from now on — open ones keep theirs, none is dropped —
 *     and the HTTP client rebuilds its contexts for new connections (a rotated client
 *     certificate). A certificate rotated in place (same path, new content: what
 *     cert-manager does to a mounted Secret) is a reload too: the TLS files are
 *     watched with the config file.
 * Nothing of this touches a request in flight or a connection. On the reactor thread. */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "common/cfgtab.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- reading ---------------------------------------------------------------------------- */

int ctl_config_read(const struct ctl_cli *cli, struct ctlcfg *out, struct cfg_errors *errs)
{
    ctlcfg_init(out);
    if (cli->config) {
        json_t *root = cfg_load_file(cli->config, errs);
        if (root) {
            ctlcfg_apply(out, root, errs);
            json_decref(root);
        }
    }
    if (cli->host) {
        free(out->host);
        out->host = xstrdup(cli->host);
    }
    if (cli->port >= 0)
        out->port = cli->port;
    return cfg_errors_count(errs) ? -EINVAL : 0;
}

void ctl_tls_settings(struct ctl *c)
{
    struct ctlcfg_tls *t = &c->cfg.tls;
    c->use_tls = t->enable;
    c->tls.ca_file = t->ca_file && *t->ca_file ? t->ca_file : NULL;
    c->tls.cert_file = t->cert_file;
    c->tls.key_file = t->key_file;
    c->tls.key_password = t->key_password;
    struct ctlcfg_tls *et = &c->cfg.etcd_tls;
    c->use_etcd_tls = et->enable;
    c->etcd_tls = (struct httpc_tls){
        .ca_file = et->ca_file && *et->ca_file ? et->ca_file : NULL,
        .cert_file = et->cert_file && *et->cert_file ? et->cert_file : NULL,
        .key_file = et->key_file && *et->key_file ? et->key_file : NULL,
        .key_password = et->key_password,
    };
}

/* ---- the daemon loop -------------------------------------------------------------------- */

/* Writes the store has not applied beyond this are reported: the store is slow or down
 * and the controller's view is not durable. */
#define CTL_STORE_BACKLOG_WARN 256

void ctl_daemon_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    int64_t now = reactor_now(c->r);
    /* Stop records older than their rate-limit window (ctl_assemble.c) are dead weight. */
    for (size_t i = 0; i < c->n_restops;) {
        if (now - c->restops[i].at > 10000) {
            free(c->restops[i].key);
            c->restops[i] = c->restops[--c->n_restops];
        } else {
            i++;
        }
    }
    if (c->store && c->leader) {
        size_t pending = store_pending(c->store);
        if (pending >= CTL_STORE_BACKLOG_WARN)
            log_warn("store_backlog", LF_INT("pending_writes", pending),
                     LF_STR("store", store_backend_name(store_get_backend(c->store))));
    }
}

/* ---- applying ----------------------------------------------------------------------------- */

static void restart_timer(struct ctl *c, struct reactor_timer *t, int64_t ms)
{
    if (reactor_timer_active(t))
        reactor_timer_start(c->r, t, ms, ms);
}

static bool changed(const char *keys, const char *prefix)
{
    if (!keys)
        return false;
    size_t n = strlen(prefix);
    for (const char *p = keys; p && *p;) {
        if (strncmp(p, prefix, n) == 0)
            return true;
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return false;
}

static void watch_files(struct ctl *c)
{
    if (!c->watch)
        return;
    /* The key files too: rotating a key is writing its file, the config stays the same. */
    const char *files[6] = {c->cli.config};
    size_t n = 1;
    if (c->cfg.nm_key_enable && c->cfg.nm_key_file && *c->cfg.nm_key_file)
        files[n++] = c->cfg.nm_key_file;
    if (c->cfg.coordinator_key_enable && c->cfg.coordinator_key_file &&
        *c->cfg.coordinator_key_file)
        files[n++] = c->cfg.coordinator_key_file;
    if (c->cfg.tls.enable) {
        files[n++] = c->cfg.tls.cert_file;
        files[n++] = c->cfg.tls.key_file;
        files[n++] = c->cfg.tls.ca_file;
    }
    (void)cfgwatch_set(c->watch, files, n, NULL, 0);
}

static void apply_tls(struct ctl *c)
{
    if (!c->use_tls)
        return;
    struct httpd_config hc = {
        .tls_cert_file = c->cfg.tls.cert_file,
        .tls_key_file = c->cfg.tls.key_file,
        .tls_ca_file = c->cfg.tls.ca_file,
        .tls_key_password = c->cfg.tls.key_password,
    };
    int rc = httpd_tls_reload(c->httpd, &hc);
    if (rc == 0)
        log_info("tls_reloaded", LF_STR("server", "controller-api"),
                 LF_STR("cert_file", c->cfg.tls.cert_file));
    ctl_obs_reload_tls(c, &hc);
    int failed = httpc_tls_reload(c->hc);
    if (failed > 0)
        log_warn("tls_client_reload_failed", LF_INT("contexts", failed),
                 LF_STR("action", "those keep their previous context"));
}

static void apply(struct ctl *c, const char *live)
{
    if (!c->cli.log_level_pinned) {
        enum log_level lvl;
        if (log_parse_level(c->cfg.log_level, &lvl) == 0)
            log_set_level(lvl);
    }
    ctl_tls_settings(c);
    apply_tls(c);
    reactor_timer_start(c->r, &c->daemon_timer, c->cfg.daemon_loop_ms, c->cfg.daemon_loop_ms);
    /* The leader's timers run only once it is live (go_live arms them). */
    restart_timer(c, &c->asm_timer, c->cfg.assembler_check_ms);
    restart_timer(c, &c->mgr_timer, c->cfg.manager_check_ms);
    restart_timer(c, &c->send_timer, c->cfg.cmd_send_interval_ms);
    restart_timer(c, &c->strat_timer, c->cfg.strategy_check_ms);
    if (c->leader && c->loaded) {
        for (size_t i = 0; i < c->n_insts; i++)
            ctl_rt_attach(c, c->insts[i]); /* the scale-down gate follows the switches */
    }
    bool target = changed(live, "motor_coordinator_config.");
    if (target || changed(live, "event_config."))
        ctl_push_reconfigure(c, target);
}

int ctl_reload_now(struct ctl *c, const char *why)
{
    const char *path = c->cli.config;
    if (!path) {
        log_info("config_reload_skipped", LF_STR("why", "no configuration file"),
                 LF_STR("trigger", why));
        return 0;
    }
    if (c->watch && !cfgwatch_changed(c->watch)) {
        log_info("config_unchanged", LF_STR("path", path), LF_STR("trigger", why));
        return 0;
    }
    /* Marked before reading: a write racing the read is seen again, never lost. */
    if (c->watch)
        cfgwatch_mark(c->watch);
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct ctlcfg next;
    if (ctl_config_read(&c->cli, &next, &errs) < 0) {
        metrics_counter_inc(c->m.reloads_failed);
        log_error("config_reload_failed", LF_STR("path", path), LF_STR("trigger", why),
                  LF_INT("errors", cfg_errors_count(&errs)),
                  LF_STR("detail", cfg_errors_text(&errs)),
                  LF_STR("action", "keeping the running configuration"));
        cfg_errors_release(&errs);
        ctlcfg_release(&next);
        return -EINVAL;
    }
    cfg_errors_release(&errs);
    char *live = cfgtab_diff(&ctlcfg_cfgtab, &c->cfg, &next, CFGTAB_LIVE, CFGTAB_LIVE);
    char *restart = cfgtab_diff(&ctlcfg_cfgtab, &c->cfg, &next, CFGTAB_LIVE, 0);
    if (cfgtab_keep_restart(&ctlcfg_cfgtab, &next, &c->cfg) < 0)
        log_error("config_table_bug", LF_STR("why", "a restart row cannot be kept"));
    struct ctlcfg old = c->cfg;
    c->cfg = next;
    /* Keys are secrets: the diff cannot name a changed one, so say it here. */
    const char *keys[][3] = {{old.nm_key, next.nm_key, "node_manager"},
                             {old.coordinator_key, next.coordinator_key, "coordinator"}};
    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        bool was = keys[i][0] != NULL, is = keys[i][1] != NULL;
        if (was != is || (was && !util_secret_equal(keys[i][0], keys[i][1])))
            log_info("management_key_rotated", LF_STR("peer", keys[i][2]), LF_BOOL("before", was),
                     LF_BOOL("after", is));
    }
    if (!c->cfg.nm_key || !old.nm_key || !util_secret_equal(old.nm_key, c->cfg.nm_key))
        ctl_auth_fails_free(c); /* judged again with the new key */
    apply(c, live);
    watch_files(c);
    if (c->watch)
        cfgwatch_mark(c->watch); /* the TLS files just read */
    ctlcfg_release(&old);
    metrics_counter_inc(c->m.reloads_ok);
    log_info("config_reloaded", LF_STR("path", path), LF_STR("trigger", why),
             LF_STR("changed", live ? live : ""), LF_STR("log_level", c->cfg.log_level),
             LF_INT("daemon_loop_interval_ms", c->cfg.daemon_loop_ms),
             LF_INT("instance_manager_check_interval_ms", c->cfg.manager_check_ms),
             LF_INT("strategy_center_check_interval_ms", c->cfg.strategy_check_ms),
             LF_INT("heartbeat_timeout_ms", c->cfg.hb_timeout_active_ms),
             LF_BOOL("fault_tolerance", c->cfg.ft_enable));
    if (restart)
        log_warn("config_reload_restart_required", LF_STR("settings", restart),
                 LF_STR("action", "keeping their running values until a restart"));
    free(live);
    free(restart);
    return 0;
}

static void on_watch(void *arg)
{
    struct ctl *c = arg;
    if (!c->stopping)
        ctl_reload_now(c, "file changed");
}

void ctl_reload_init(struct ctl *c)
{
    reactor_timer_start(c->r, &c->daemon_timer, c->cfg.daemon_loop_ms, c->cfg.daemon_loop_ms);
    if (!c->cli.config)
        return;
    c->watch = cfgwatch_new(c->r, "config", 0, on_watch, c);
    watch_files(c);
    cfgwatch_mark(c->watch);
}

void ctl_reload_free(struct ctl *c)
{
    reactor_timer_stop(c->r, &c->daemon_timer);
    cfgwatch_free(c->watch);
    c->watch = NULL;
}
