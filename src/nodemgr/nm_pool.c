/* nm_pool — the worker pool (pool.h) inside `motor node-manager`: one daemon serves both
 * inference engines and on-demand workers.
 *
 * Configuration: the key `worker_pool` of the NM block (found like nm_config finds the
 * block: the role section's motor_node(manager|manger)_config first, then the top
 * level's, else the file's root when the file has neither), read once at start:
 *   "worker_pool": {
 *     "enable": false,              the pool exists only when true
 *     "manifests_dir": "",          *.json manifests registered at start
 *     "db_path": "",                SQLite file ("" = in memory)
 *     "base_dir": "",               relative workdirs ("" = manifests_dir)
 *     "stop_grace_seconds": 5,      SIGTERM -> SIGKILL of a worker
 *     "invoke_requires_key": false, invoke behind the management key too
 *     "defaults": {max_concurrency, max_instances, idle_ttl_seconds, keep_warm,
 *                  ready_timeout_seconds, invoke_timeout_seconds,
 *                  queue_timeout_seconds}   for manifests that leave them out
 *   }
 * Management routes that change state take the NM's management key (like the engine
 * routes); invoke does not unless invoke_requires_key. Errors in the block are all
 * reported and stop the node manager from starting. */
#include "nodemgr/nm_internal.h"
#include "pool/pool.h"

#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *nm_block(json_t *obj)
{
    json_t *b = json_object_get(obj, "motor_nodemanager_config");
    if (!json_is_object(b))
        b = json_object_get(obj, "motor_nodemanger_config");
    return json_is_object(b) ? b : NULL;
}

/* The worker_pool object and its path for error messages; NULL when absent. */
static json_t *find_block(json_t *root, const char *secname, char **where)
{
    json_t *sec = secname ? json_object_get(root, secname) : NULL;
    json_t *sec_nm = json_is_object(sec) ? nm_block(sec) : NULL;
    json_t *top_nm = nm_block(root);
    json_t *wp;
    if (sec_nm && (wp = json_object_get(sec_nm, "worker_pool"))) {
        *where = xasprintf("%s.%s.worker_pool", secname,
                           json_object_get(sec, "motor_nodemanager_config")
                               ? "motor_nodemanager_config"
                               : "motor_nodemanger_config");
        return wp;
    }
    if (top_nm && (wp = json_object_get(top_nm, "worker_pool"))) {
        *where = xstrdup(json_object_get(root, "motor_nodemanager_config")
                             ? "motor_nodemanager_config.worker_pool"
                             : "motor_nodemanger_config.worker_pool");
        return wp;
    }
    if (!sec_nm && !top_nm && !json_is_object(sec) && (wp = json_object_get(root, "worker_pool"))) {
        *where = xstrdup("worker_pool");
        return wp;
    }
    return NULL;
}

/* Strings in cfg point into doc: the pool copies what it keeps. */
static int read_config(json_t *wp, struct pool_config *cfg, bool *enable, bool *invoke_key,
                       struct cfg_errors *e)
{
    if (!json_is_object(wp)) {
        cfg_error(e, "", "must be an object");
        return -EINVAL;
    }
    *enable = cfg_get_bool(wp, "enable", false, e);
    cfg->manifests_dir = cfg_get_string(wp, "manifests_dir", NULL, e);
    cfg->db_path = cfg_get_string(wp, "db_path", NULL, e);
    cfg->base_dir = cfg_get_string(wp, "base_dir", NULL, e);
    double grace = cfg_get_double(wp, "stop_grace_seconds", (double)cfg->stop_grace_ms / 1000.0,
                                  0, 3600, e);
    cfg->stop_grace_ms = (int64_t)(grace * 1000.0);
    *invoke_key = cfg_get_bool(wp, "invoke_requires_key", false, e);
    struct pool_defaults *d = &cfg->defaults;
    /* Paths from the block itself, so errors name "worker_pool.defaults.x". */
    (void)cfg_get_object(wp, "defaults", e);
    d->max_concurrency =
        (int)cfg_get_int(wp, "defaults.max_concurrency", d->max_concurrency, 1, 1024, e);
    d->max_instances = (int)cfg_get_int(wp, "defaults.max_instances", d->max_instances, 1, 256, e);
    d->idle_ttl_seconds = cfg_get_double(wp, "defaults.idle_ttl_seconds", d->idle_ttl_seconds,
                                         -2592000.0, 2592000.0, e);
    d->keep_warm = cfg_get_bool(wp, "defaults.keep_warm", d->keep_warm, e);
    d->ready_timeout_seconds = cfg_get_double(wp, "defaults.ready_timeout_seconds",
                                              d->ready_timeout_seconds, 0.001, 86400, e);
    d->invoke_timeout_seconds = cfg_get_double(wp, "defaults.invoke_timeout_seconds",
                                               d->invoke_timeout_seconds, 0.001, 86400, e);
    d->queue_timeout_seconds = cfg_get_double(wp, "defaults.queue_timeout_seconds",
                                              d->queue_timeout_seconds, -1, 86400, e);
    return cfg_errors_count(e) ? -EINVAL : 0;
}

int nm_pool_init(struct nodemgr *nm)
{
    nm->pool = NULL;
    const char *path = nm->cfg->config_path;
    if (!path || !*path)
        return 0;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    json_t *root = cfg_load_file(path, &e);
    if (!root) {
        /* nm_config read this file a moment ago; a failure now is a race with an
         * edit. The engines must not depend on the pool: log and go on without it. */
        log_warn("pool_config_unreadable", LF_STR("path", path),
                 LF_STR("error", cfg_errors_text(&e)));
        cfg_errors_release(&e);
        return 0;
    }
    char *where = NULL;
    json_t *wp = find_block(root, nm->cfg->role_section, &where);
    int rc = 0;
    if (wp) {
        cfg_errors_set_prefix(&e, where);
        struct pool_config pc;
        pool_config_init(&pc);
        bool enable = false, invoke_key = false;
        rc = read_config(wp, &pc, &enable, &invoke_key, &e);
        if (rc < 0) {
            fprintf(stderr, "invalid worker_pool configuration (%d error%s):\n%s",
                    cfg_errors_count(&e), cfg_errors_count(&e) == 1 ? "" : "s",
                    cfg_errors_text(&e));
            log_error("pool_config_invalid", LF_INT("errors", cfg_errors_count(&e)),
                      LF_STR("detail", cfg_errors_text(&e)));
        } else if (enable) {
            pc.admin_route_flags = HTTPD_ROUTE_AUTH;
            pc.invoke_route_flags = invoke_key ? HTTPD_ROUTE_AUTH : 0;
            struct pool *p = pool_new(nm->r, &pc);
            if (!p) {
                rc = -(errno ? errno : EIO);
            } else {
                nm->pool = p;
                rc = pool_register_routes(p, nm->api);
            }
        }
    }
    free(where);
    json_decref(root);
    cfg_errors_release(&e);
    return rc;
}

void nm_pool_shutdown(struct nodemgr *nm)
{
    if (nm->pool)
        pool_shutdown(nm->pool, NULL, NULL);
}

void nm_pool_free(struct nodemgr *nm)
{
    pool_free(nm->pool);
    nm->pool = NULL;
}
