/* coord_reload — the coordinator's configuration hot reload, the node manager's way
 * (common/cfgwatch.h: inotify on the directories of the config file and of the TLS
 * files, debounce, identity; SIGHUP as well), on the management reactor.
 *
 * A reload reads the whole file again with the same command-line overrides. An invalid
 * file changes nothing and says why (config_reload_failed, every error). A valid one is
 * adopted through the configuration table's classes (common/cfgtab.h): the live keys
 * take their new values, the restart keys keep their running values and are named in
 * config_reload_restart_required — the table's list, shown in docs/coordinator.md.
 *
 * What the live keys reach, and how without a race or a dropped connection:
 *   * the workers' settings (scheduler, score weight, PD fallback, retries and their
 *     delay, every timeout, the inference API keys): a new immutable snapshot is
 *     published (coord_settings.h); each request takes the current one when it arrives
 *     and keeps it to its end, so a request in flight finishes under the rules it
 *     started with and the next one uses the new;
 *   * the circuit breakers: new parameters for every instance's breaker under its mutex
 *     (an open breaker finishes its current period, a closed one trips by the new
 *     threshold);
 *   * the management key: the management server checks the new one from the next
 *     request;
 *   * TLS files: each server (management here, inference on each worker's own thread)
 *     builds a new context for the connections it accepts from now on; open connections
 *     — streams included — keep theirs. Certificates rotated in place are a reload too
 *     (the TLS files are watched);
 *   * the log level (unless --log-level pinned it). */
#include "coordinator/coord_internal.h"

#include "common/cfgtab.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int coord_config_read(const struct coord_cli *cli, struct ccfg *out, struct cfg_errors *errs)
{
    ccfg_init(out);
    if (cli->config) {
        json_t *root = cfg_load_file(cli->config, errs);
        if (root) {
            ccfg_apply(out, root, errs);
            json_decref(root);
        }
    }
    if (cli->host) {
        free(out->host);
        out->host = xstrdup(cli->host);
    }
    if (cli->port >= 0)
        out->infer_port = cli->port;
    if (cli->mgmt_port >= 0)
        out->mgmt_port = cli->mgmt_port;
    if (cli->workers > 0)
        out->workers = cli->workers;
    if (out->workers <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        out->workers = n > 0 ? (int)MOTOR_MIN(n, 64) : 1;
    }
    return cfg_errors_count(errs) ? -EINVAL : 0;
}

void coord_publish_settings(struct coord *c)
{
    csettings_pub_set(&c->settings, csettings_new(&c->cfg, ++c->settings_version));
}

/* ---- TLS --------------------------------------------------------------------------------- */

/* What a worker needs to rebuild its listener's context: copies, posted to its thread. */
struct tls_job {
    struct coord_worker *w;
    char *cert, *key, *ca, *password;
};

static void tls_job_free(struct tls_job *j)
{
    free(j->cert);
    free(j->key);
    free(j->ca);
    if (j->password)
        explicit_bzero(j->password, strlen(j->password));
    free(j->password);
    free(j);
}

static void tls_job_run(void *arg)
{
    struct tls_job *j = arg;
    if (j->w->httpd && !atomic_load(&j->w->exited)) {
        struct httpd_config hc = {
            .tls_cert_file = j->cert,
            .tls_key_file = j->key,
            .tls_ca_file = j->ca,
            .tls_key_password = j->password,
        };
        if (httpd_tls_reload(j->w->httpd, &hc) == 0)
            log_info("tls_reloaded", LF_STR("server", "coordinator-infer"),
                     LF_INT("worker", j->w->idx), LF_STR("cert_file", j->cert));
        /* The client contexts towards engines (https with engine_tls), same files. */
        if (j->w->httpc)
            httpc_tls_reload(j->w->httpc);
    }
    tls_job_free(j);
}

static void apply_tls(struct coord *c)
{
    const struct ccfg_tls *m = &c->cfg.mgmt_tls;
    if (m->enable && c->mgmt) {
        struct httpd_config hc = {
            .tls_cert_file = m->cert_file,
            .tls_key_file = m->key_file,
            .tls_ca_file = m->ca_file,
            .tls_key_password = m->key_password,
        };
        if (httpd_tls_reload(c->mgmt, &hc) == 0)
            log_info("tls_reloaded", LF_STR("server", "coordinator-mgmt"),
                     LF_STR("cert_file", m->cert_file));
    }
    const struct ccfg_tls *t = &c->cfg.infer_tls;
    if (!t->enable)
        return;
    if (t->engine_tls && c->mgmt_httpc)
        httpc_tls_reload(c->mgmt_httpc); /* model discovery's https to engines */
    for (int i = 0; i < c->n_workers; i++) {
        struct coord_worker *w = &c->workers[i];
        if (!w->started)
            continue;
        struct tls_job *j = xcalloc(1, sizeof(*j));
        j->w = w;
        j->cert = xstrdup(t->cert_file);
        j->key = xstrdup(t->key_file);
        j->ca = t->ca_file ? xstrdup(t->ca_file) : NULL;
        j->password = t->key_password ? xstrdup(t->key_password) : NULL;
        /* Queued tasks run even when the worker stops, so the job is always freed. */
        if (reactor_post(w->r, tls_job_run, j) < 0)
            tls_job_free(j);
    }
}

static void watch_files(struct coord *c)
{
    if (!c->watch)
        return;
    const struct ccfg_tls *i = &c->cfg.infer_tls, *m = &c->cfg.mgmt_tls;
    const char *files[] = {c->cli.config,
                           i->enable ? i->cert_file : NULL,
                           i->enable ? i->key_file : NULL,
                           i->enable ? i->ca_file : NULL,
                           m->enable ? m->cert_file : NULL,
                           m->enable ? m->key_file : NULL,
                           m->enable ? m->ca_file : NULL};
    (void)cfgwatch_set(c->watch, files, ARRAY_LEN(files), NULL, 0);
}

/* ---- the reload ------------------------------------------------------------------------- */

static void apply(struct coord *c)
{
    if (!c->cli.log_level_pinned) {
        enum log_level lvl;
        if (log_parse_level(c->cfg.log_level, &lvl) == 0)
            log_set_level(lvl);
    }
    coord_publish_settings(c);
    struct brk_params bp = {c->cfg.breaker_threshold, c->cfg.breaker_open_ms,
                            c->cfg.breaker_max_open_ms};
    inst_table_set_breaker(&c->table, &bp);
    if (c->mgmt)
        httpd_set_api_key(c->mgmt, c->cfg.mgmt_key_enable ? c->cfg.mgmt_key : NULL);
    apply_tls(c);
    kvsub_sync(c); /* scheduler or KV-event settings may have changed */
    engscrape_sync(c);
}

int coord_reload_now(struct coord *c, const char *why)
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
    cfg_errors_init(&errs, "motor_coordinator_config");
    struct ccfg next;
    if (coord_config_read(&c->cli, &next, &errs) < 0) {
        metrics_counter_inc(c->m.reloads_failed);
        log_error("config_reload_failed", LF_STR("path", path), LF_STR("trigger", why),
                  LF_INT("errors", cfg_errors_count(&errs)),
                  LF_STR("detail", cfg_errors_text(&errs)),
                  LF_STR("action", "keeping the running configuration"));
        cfg_errors_release(&errs);
        ccfg_release(&next);
        return -EINVAL;
    }
    cfg_errors_release(&errs);
    char *live = cfgtab_diff(&ccfg_cfgtab, &c->cfg, &next, CFGTAB_LIVE, CFGTAB_LIVE);
    char *restart = cfgtab_diff(&ccfg_cfgtab, &c->cfg, &next, CFGTAB_LIVE, 0);
    if (cfgtab_keep_restart(&ccfg_cfgtab, &next, &c->cfg) < 0)
        log_error("config_table_bug", LF_STR("why", "a restart row cannot be kept"));
    struct ccfg old = c->cfg;
    c->cfg = next;
    apply(c);
    watch_files(c);
    if (c->watch)
        cfgwatch_mark(c->watch); /* the TLS files just read */
    ccfg_release(&old);
    metrics_counter_inc(c->m.reloads_ok);
    log_info("config_reloaded", LF_STR("path", path), LF_STR("trigger", why),
             LF_STR("changed", live ? live : ""), LF_STR("log_level", c->cfg.log_level),
             LF_STR("scheduler", c->cfg.scheduler_type),
             LF_INT("max_retry", c->cfg.max_retry),
             LF_INT("breaker_threshold", c->cfg.breaker_threshold),
             LF_INT("first_token_timeout_ms", c->cfg.first_token_timeout_ms),
             LF_INT("infer_timeout_ms", c->cfg.infer_timeout_ms),
             LF_INT("settings_version", (int64_t)c->settings_version),
             LF_BOOL("api_key", c->cfg.api_key_enable),
             LF_BOOL("mgmt_api_key", c->cfg.mgmt_key_enable));
    if (restart)
        log_warn("config_reload_restart_required", LF_STR("settings", restart),
                 LF_STR("action", "keeping their running values until a restart"));
    free(live);
    free(restart);
    return 0;
}

static void on_watch(void *arg)
{
    struct coord *c = arg;
    if (!atomic_load(&c->stopping))
        coord_reload_now(c, "file changed");
}

void coord_reload_init(struct coord *c)
{
    if (!c->cli.config)
        return;
    c->watch = cfgwatch_new(c->r, "config", 0, on_watch, c);
    watch_files(c);
    cfgwatch_mark(c->watch);
}

void coord_reload_free(struct coord *c)
{
    cfgwatch_free(c->watch);
    c->watch = NULL;
}
