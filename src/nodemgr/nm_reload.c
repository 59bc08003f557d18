/* nm_reload — configuration hot reload (§3.7).
 *
 * The watch (common/cfgwatch.h, shared with the controller and the coordinator) is
 * inotify on the config file's *directory*: editors and Kubernetes replace files by
 * rename (ConfigMaps swap a `..data` symlink), which a watch on the file itself would
 * miss. Relevant events are debounced, then the file is reloaded with the same role,
 * environment snapshot and binary. An invalid file keeps the old config (and says why);
 * a valid one is swapped in whole. What takes effect at once: log level, heartbeat
 * interval (also the arbitration period, unlike upstream), the management key (its file
 * is watched too), probe settings
 * (health_check_config), the Controller address, FT polling switches, and everything read
 * when engines are next launched. What needs a restart is what the configuration table
 * marks so (rows without CFGTAB_LIVE: bind address and port, TLS material,
 * standalone/KV mode, the endpoint layout); the changed ones are logged
 * by key (nm_config_restart_keys). */
#include "nodemgr/nm_internal.h"
#include "nodemgr/nm_ports.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The config file, and the key file: rotating the key is writing that file. */
static void watch_files(struct nodemgr *nm)
{
    if (!nm->watch)
        return;
    const char *files[] = {nm->cfg->config_path, nm->cfg->management_api_key_file};
    (void)cfgwatch_set(nm->watch, files, files[1] ? 2 : 1, NULL, 0);
}

int nm_reload_now(struct nodemgr *nm)
{
    const char *path = nm->cfg->config_path;
    if (nm->watch && !cfgwatch_changed(nm->watch)) {
        log_debug("config_unchanged", LF_STR("path", path));
        return 0;
    }
    /* Marked before reading: a write racing the read is seen again, never lost. */
    if (nm->watch)
        cfgwatch_mark(nm->watch);
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *next = nm_config_reload(nm->cfg, &errs);
    if (!next) {
        metrics_counter_inc(nm->m.reloads_failed);
        log_error("config_reload_failed", LF_STR("path", path),
                  LF_INT("errors", cfg_errors_count(&errs)),
                  LF_STR("detail", cfg_errors_text(&errs)),
                  LF_STR("action", "keeping the previous configuration"));
        cfg_errors_release(&errs);
        return -EINVAL;
    }
    cfg_errors_release(&errs);
    struct nm_config *old = nm->cfg;
    nm_ports_carry(old, next);
    char *diff = nm_config_diff(old, next);
    char *restart = nm_config_restart_keys(old, next);
    nm->cfg = next;

    enum log_level lvl;
    if (log_parse_level(next->log_level, &lvl) == 0)
        log_set_level(lvl);
    /* The management key rotates at once (constant-time compare in httpd). */
    bool had = old->management_api_key != NULL, has = next->management_api_key != NULL;
    if (had != has ||
        (had && !util_secret_equal(old->management_api_key, next->management_api_key))) {
        httpd_set_api_key(nm->api, next->management_api_key);
        log_info("management_key_rotated", LF_BOOL("before", had), LF_BOOL("after", has),
                 LF_STR("from", next->management_api_key_file ? "file" : "config"));
    }
    watch_files(nm);
    if (nm->watch)
        cfgwatch_mark(nm->watch); /* the key file just read */
    nm_ctrl_reconfigure(nm);
    nm_ctrl_heartbeat_reconfigure(nm);
    nm_arb_reconfigure(nm);
    nm_engine_probes_reconfigure(nm);
    nm_ft_config_updated(nm);
    metrics_counter_inc(nm->m.reloads_ok);
    log_info("config_reloaded", LF_STR("path", path), LF_STR("changed", diff ? diff : ""),
             LF_STR("log_level", next->log_level),
             LF_DBL("heartbeat_interval_seconds", next->heartbeat_interval_seconds),
             LF_INT("health_collector_timeout", next->health.health_collector_timeout),
             LF_INT("startup_timeout", next->health.startup_timeout));
    if (restart)
        log_warn("config_reload_restart_required", LF_STR("settings", restart));
    for (size_t i = 0; i < next->warnings.n; i++)
        log_warn("config_warning", LF_STR("warning", next->warnings.items[i]));
    free(diff);
    free(restart);
    nm_config_free(old);
    return 0;
}

static void reload_fire(void *arg)
{
    struct nodemgr *nm = arg;
    if (!nm_shutting_down(nm))
        nm_reload_now(nm);
}

int nm_reload_init(struct nodemgr *nm)
{
    const char *path = nm->cfg->config_path;
    if (!path || !*path)
        return 0;
    /* With a snapshot nothing watches (§3.7): the identity alone, for SIGHUP. */
    bool snapshot = nm->cfg->enable_snapshot;
    nm->watch = cfgwatch_new(nm->r, "config", 0, snapshot ? NULL : reload_fire, nm);
    if (snapshot)
        log_info("config_watch_disabled", LF_STR("why", "snapshot enabled"));
    watch_files(nm);
    cfgwatch_mark(nm->watch); /* the files loaded at start */
    return 0;
}

void nm_reload_free(struct nodemgr *nm)
{
    cfgwatch_free(nm->watch);
    nm->watch = NULL;
}
