/* nm_services — the static service registry (§2.6).
 *
 * Upstream discovers Python modules by decorator; a C daemon needs no more than a
 * static table of vtables. Activation follows kv_cache_store_config (§2.4): no KV store
 * => {engine}; mode "separated" => {the KV backend} only (no engine, so no registration
 * and no heartbeats); otherwise {engine, the KV backend}. Preparable services are
 * created first, by ascending prepare_priority, then the rest in table order. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const struct nm_service_ops *const registry[] = {
    &nm_engine_service_ops,
    &nm_kv_memcache_service_ops,
    &nm_kv_mooncake_service_ops,
};

/* Is a backend tag in the active list? */
static bool backend_active(const struct nm_config *cfg, const char *backend)
{
    const char *kv = cfg->kv.backend == NM_KV_MOONCAKE ? "mooncake" : "memcache";
    if (strcmp(backend, "engine") == 0)
        return !(cfg->kv.enabled && cfg->kv.mode == NM_KV_SEPARATED);
    return cfg->kv.enabled && strcmp(backend, kv) == 0;
}

static int cmp_priority(const void *a, const void *b)
{
    const struct nm_service_ops *x = *(const struct nm_service_ops *const *)a;
    const struct nm_service_ops *y = *(const struct nm_service_ops *const *)b;
    int px = x->prepare_priority < 0 ? 1 << 30 : x->prepare_priority;
    int py = y->prepare_priority < 0 ? 1 << 30 : y->prepare_priority;
    return (px > py) - (px < py);
}

int nm_services_create(struct nodemgr *nm)
{
    const struct nm_service_ops *active[ARRAY_LEN(registry)];
    size_t n = 0;
    for (size_t i = 0; i < ARRAY_LEN(registry); i++)
        if (!registry[i]->backend || backend_active(nm->cfg, registry[i]->backend))
            active[n++] = registry[i];
    /* Stable for equal priorities: insertion order of the table (qsort is not stable,
     * but the table has distinct priorities among preparable services). */
    qsort(active, n, sizeof(active[0]), cmp_priority);
    for (size_t i = 0; i < n && nm->n_services < NM_MAX_SERVICES; i++) {
        struct nm_service *s = &nm->services[nm->n_services];
        s->ops = active[i];
        s->state = NULL;
        if (s->ops->create) {
            int rc = s->ops->create(nm, &s->state);
            if (rc < 0) {
                log_error("service_create_failed", LF_STR("service", s->ops->name),
                          LF_STR("backend", s->ops->backend), LF_STR("error", strerror(-rc)));
                return rc;
            }
        }
        nm->n_services++;
        log_info("service_active", LF_STR("service", s->ops->name),
                 LF_STR("backend", s->ops->backend),
                 LF_INT("prepare_priority", s->ops->prepare_priority));
    }
    return 0;
}

int nm_services_prepare(struct nodemgr *nm, int endpoints_count)
{
    for (size_t i = 0; i < nm->n_services; i++) {
        struct nm_service *s = &nm->services[i];
        if (s->ops->prepare_priority < 0 || !s->ops->prepare)
            continue;
        int rc = s->ops->prepare(nm, s->state, endpoints_count);
        if (rc < 0) {
            log_error("service_prepare_failed", LF_STR("service", s->ops->name),
                      LF_STR("error", strerror(-rc)));
            return rc;
        }
    }
    return 0;
}

int nm_services_pull_others(struct nodemgr *nm, struct wire_err *err)
{
    for (size_t i = 0; i < nm->n_services; i++) {
        struct nm_service *s = &nm->services[i];
        if (s->ops == &nm_engine_service_ops || !s->ops->pull)
            continue;
        int rc = s->ops->pull(nm, s->state, err);
        if (rc < 0) {
            log_error("service_pull_failed", LF_STR("service", s->ops->name),
                      LF_STR("error", err ? err->msg : ""));
            return rc;
        }
    }
    return 0;
}

void nm_services_health_check(struct nodemgr *nm)
{
    for (size_t i = 0; i < nm->n_services; i++)
        if (nm->services[i].ops->health_check)
            nm->services[i].ops->health_check(nm, nm->services[i].state);
}

/* Reverse order, one after the other: each service's stop completes before the next. */
struct stop_chain {
    size_t next; /* services[0..next) still to stop, from the top */
    int64_t grace_ms;
    nm_done_fn done;
    void *arg;
};

static void stop_chain_step(struct nodemgr *nm, void *arg)
{
    struct stop_chain *c = arg;
    while (c->next > 0) {
        struct nm_service *s = &nm->services[--c->next];
        if (s->ops->stop) {
            s->ops->stop(nm, s->state, c->grace_ms, stop_chain_step, c);
            return;
        }
    }
    nm_done_fn done = c->done;
    void *darg = c->arg;
    free(c);
    if (done)
        done(nm, darg);
}

void nm_services_stop(struct nodemgr *nm, int64_t grace_ms, nm_done_fn done, void *arg)
{
    struct stop_chain *c = xcalloc(1, sizeof(*c));
    c->next = nm->n_services;
    c->grace_ms = grace_ms;
    c->done = done;
    c->arg = arg;
    stop_chain_step(nm, c);
}

void nm_services_kill_now(struct nodemgr *nm)
{
    for (size_t i = nm->n_services; i-- > 0;)
        if (nm->services[i].ops->kill_now)
            nm->services[i].ops->kill_now(nm, nm->services[i].state);
}

void nm_services_destroy(struct nodemgr *nm)
{
    for (size_t i = nm->n_services; i-- > 0;) {
        if (nm->services[i].ops->destroy)
            nm->services[i].ops->destroy(nm, nm->services[i].state);
        nm->services[i].state = NULL;
    }
    nm->n_services = 0;
}

void *nm_service_state(struct nodemgr *nm, const char *name)
{
    for (size_t i = 0; i < nm->n_services; i++)
        if (strcmp(nm->services[i].ops->name, name) == 0)
            return nm->services[i].state;
    return NULL;
}
