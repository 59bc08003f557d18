/* nm_pool — the worker pool (pool.h) inside `motor node-manager`: one daemon serves both
 * inference engines and on-demand workers.
 *
 * Configuration: the key `worker_pool` of the NM block (found like nm_config finds the
 * block: the role section's motor_node(manager|manger)_config first, then the top
 * level's, else the file's root when the file has neither), read once at start through
 * the table below (its defaults' rows are the pool's own, pool_defaults_cfgtab):
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
#include "common/cfgtab.h"
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
        *where =
            xasprintf("%s.%s.worker_pool", secname,
                      json_object_get(sec, "motor_nodemanager_config") ? "motor_nodemanager_config"
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

/* The worker_pool block: the pool's own settings and, under defaults, the rows of
 * struct pool_defaults (pool.h). Read once at start: every key takes a restart. */
struct pool_block {
    bool enable, invoke_requires_key;
    char *manifests_dir, *db_path, *base_dir;
    int64_t stop_grace_ms;
    struct pool_defaults defaults;
};

#define OFF(f) offsetof(struct pool_block, f)
static const struct cfgtab_row pool_rows[] = {
    {"enable", CFGTAB_BOOL, OFF(enable), .doc = "the pool exists only when true"},
    {"manifests_dir", CFGTAB_STRING, OFF(manifests_dir),
     .doc = "`*.json` manifests registered at start"},
    {"db_path", CFGTAB_STRING, OFF(db_path), .def_doc = "in memory",
     .doc = "SQLite file (\"\" = in memory)"},
    {"base_dir", CFGTAB_STRING, OFF(base_dir), .def_doc = "`manifests_dir`",
     .doc = "relative workdirs resolve here"},
    {"stop_grace_seconds", CFGTAB_MS, OFF(stop_grace_ms), .min = 0, .max = 3600, .def_d = 5,
     .doc = "SIGTERM → SIGKILL of a worker"},
    {"invoke_requires_key", CFGTAB_BOOL, OFF(invoke_requires_key),
     .doc = "invoke behind the management key too"},
    {"defaults", CFGTAB_GROUP, OFF(defaults), .flags = CFGTAB_OBJECT, .sub = &pool_defaults_cfgtab},
};
const struct cfgtab nm_pool_cfgtab = CFGTAB_TABLE("worker_pool", pool_rows, NULL);

/* The block's keys into cfg (strings owned by blk: the pool copies what it keeps). */
static int read_config(json_t *wp, struct pool_block *blk, struct pool_config *cfg,
                       struct cfg_errors *e)
{
    cfgtab_defaults(&nm_pool_cfgtab, blk, NULL);
    if (!json_is_object(wp)) {
        cfg_error(e, "", "must be an object");
        return -EINVAL;
    }
    struct cfgtab_ctx ctx = {.errs = e};
    cfgtab_apply(&nm_pool_cfgtab, 0, blk, wp, &ctx);
    cfgtab_ctx_release(&ctx);
    cfg->manifests_dir = blk->manifests_dir;
    cfg->db_path = blk->db_path;
    cfg->base_dir = blk->base_dir;
    cfg->stop_grace_ms = blk->stop_grace_ms;
    cfg->defaults = blk->defaults;
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
        struct pool_block blk = {0};
        rc = read_config(wp, &blk, &pc, &e);
        bool enable = blk.enable, invoke_key = blk.invoke_requires_key;
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
        cfgtab_release(&nm_pool_cfgtab, &blk);
    }
    free(where);
    json_decref(root);
    cfg_errors_release(&e);
    return rc;
}

void nm_pool_render_metrics(struct nodemgr *nm, struct strbuf *sb)
{
    if (nm->pool)
        pool_render_metrics(nm->pool, sb);
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
