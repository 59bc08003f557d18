/* nm_kvstore — the kv_store service (§2.7): memcache / mooncake local services.
 *
 * Placeholder: the registry entries exist so activation and prepare ordering are real
 * (prepare_priority 10, before the engine), but the services do nothing yet beyond
 * logging. The KV-store helper replaces this file (deliverable 8). */
#include "nodemgr/nm_internal.h"

#include "common/log.h"

static int kv_create(struct nodemgr *nm, void **state)
{
    *state = NULL;
    log_warn("kv_store_not_implemented",
             LF_STR("backend", nm->cfg->kv.backend == NM_KV_MOONCAKE ? "mooncake" : "memcache"),
             LF_STR("mode", nm->cfg->kv.mode == NM_KV_SEPARATED ? "separated" : "combined"));
    return 0;
}

static int kv_prepare(struct nodemgr *nm, void *state, int endpoints_count)
{
    (void)nm;
    (void)state;
    (void)endpoints_count;
    return 0;
}

static void kv_stop(struct nodemgr *nm, void *state, int64_t grace_ms, nm_done_fn done, void *arg)
{
    (void)state;
    (void)grace_ms;
    if (done)
        done(nm, arg);
}

const struct nm_service_ops nm_kv_memcache_service_ops = {
    .name = "kv_store",
    .backend = "memcache",
    .prepare_priority = 10,
    .create = kv_create,
    .prepare = kv_prepare,
    .stop = kv_stop,
};

const struct nm_service_ops nm_kv_mooncake_service_ops = {
    .name = "kv_store",
    .backend = "mooncake",
    .prepare_priority = 10,
    .create = kv_create,
    .prepare = kv_prepare,
    .stop = kv_stop,
};
