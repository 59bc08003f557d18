/* ctl_leader — leadership and the controller's state: the store (SQLite, etcd or
 * memory), the leader campaign, loading the persisted instances and FT runtimes when
 * elected, going live (timers, coordinator push, resumed work), stepping out when the
 * leadership is lost, and the persistence glue every module writes through (only the
 * leader, once loaded, writes). On the controller's reactor thread. */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- persistence ------------------------------------------------------------------------ */

static bool can_write(struct ctl *c)
{
    return c->store && c->leader && c->loaded;
}

void ctl_save_inst(struct ctl *c, struct ctl_inst *in)
{
    if (!can_write(c))
        return;
    json_t *j = ctl_inst_store_json(in);
    char *text = json_dumps(j, JSON_COMPACT);
    char key[48];
    snprintf(key, sizeof(key), "instances/%lld", (long long)in->id);
    store_put(c->store, key, text);
    free(text);
    json_decref(j);
}

void ctl_forget_inst(struct ctl *c, int64_t id)
{
    if (!can_write(c))
        return;
    char key[48];
    snprintf(key, sizeof(key), "instances/%lld", (long long)id);
    store_del(c->store, key);
}

void ctl_save_rt(struct ctl *c, struct ctl_ft_rt *rt)
{
    rt->dirty = false;
    if (!can_write(c))
        return;
    json_t *j = ctl_ft_rt_store_json(rt);
    char *text = json_dumps(j, JSON_COMPACT);
    char key[48];
    snprintf(key, sizeof(key), "ft/%lld", (long long)rt->instance_id);
    store_put(c->store, key, text);
    free(text);
    json_decref(j);
}

void ctl_forget_rt(struct ctl *c, int64_t id)
{
    if (!can_write(c))
        return;
    char key[48];
    snprintf(key, sizeof(key), "ft/%lld", (long long)id);
    store_del(c->store, key);
}

void ctl_save_meta(struct ctl *c)
{
    if (!can_write(c))
        return;
    char v[32];
    snprintf(v, sizeof(v), "%lld", (long long)c->next_id);
    store_put(c->store, "meta/next_id", v);
}

/* ---- the store and leadership ----------------------------------------------------------- */

struct store *ctl_leader_open_store(struct ctl *c)
{
    struct ctlcfg *k = &c->cfg;
    struct store_opts o = {
        .backend = k->store == CTLCFG_STORE_ETCD     ? STORE_ETCD
                   : k->store == CTLCFG_STORE_MEMORY ? STORE_MEMORY
                                                     : STORE_SQLITE,
        .sqlite_path = k->sqlite_path,
        .etcd_endpoints = (const char *const *)k->etcd_endpoints,
        .n_etcd_endpoints = k->n_etcd_endpoints,
        .prefix = k->etcd_prefix,
        .lease_ttl_s = k->etcd_lease_ttl_s,
        .timeout_ms = k->etcd_timeout_ms,
        .retry_ms = k->leader_retry_ms,
        .owner = c->owner,
        .tls = c->use_etcd_tls ? &c->etcd_tls
               : c->use_tls    ? &c->tls
                               : NULL,
    };
    char err[512] = "";
    struct store *st = store_open(c->r, &o, err, sizeof(err));
    if (!st) {
        log_error("store_open_failed", LF_STR("backend", ctlcfg_store_name(k->store)),
                  LF_STR("error", err));
        fprintf(stderr, "motor controller: cannot open the %s store: %s\n",
                ctlcfg_store_name(k->store), err);
    }
    return st;
}

static void go_live(struct ctl *c)
{
    c->loaded = true;
    int64_t now = reactor_now(c->r);
    for (size_t i = 0; i < c->n_insts; i++) {
        struct ctl_inst *in = c->insts[i];
        in->status_mono_ms = now;
        for (size_t k = 0; k < in->n_nms; k++) {
            in->nms[k].last_hb_ms = now; /* a fresh window: NMs heartbeat a new leader */
            /* ... but not yet a proof of life: until it heartbeats, the freshness gate
             * keeps a non-active instance from becoming routable (an active one stays) */
            in->nms[k].unconfirmed = true;
        }
        ctl_rt_attach(c, in);
        if (in->ft->dirty)
            ctl_save_rt(c, in->ft);
    }
    for (size_t i = 0; i < c->n_pending; i++)
        c->pending[i]->last_reg_ms = now;
    reactor_timer_start(c->r, &c->asm_timer, c->cfg.assembler_check_ms, c->cfg.assembler_check_ms);
    reactor_timer_start(c->r, &c->mgr_timer, c->cfg.manager_check_ms, c->cfg.manager_check_ms);
    reactor_timer_start(c->r, &c->send_timer, c->cfg.cmd_send_interval_ms,
                        c->cfg.cmd_send_interval_ms);
    reactor_timer_start(c->r, &c->strat_timer, c->cfg.strategy_check_ms, c->cfg.strategy_check_ms);
    ctl_push_start(c);
    log_info("controller_ready", LF_INT("instances", c->n_insts),
             LF_INT("assembling", c->n_pending), LF_INT("reconfiguring", c->n_ghosts),
             LF_INT("next_id", c->next_id),
             LF_STR("store", store_backend_name(store_get_backend(c->store))),
             LF_STR("owner", c->owner));
    ctl_asm_kick(c);
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->start_pending)
            ctl_start_send(c, c->insts[i]);
    ctl_faults_kick(c); /* interrupted transactions resume with their fallback */
}

static void on_loaded(struct store *st, int err, const struct store_kv *kvs, size_t n, void *arg);

void ctl_leader_on_load_retry(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->leader && !c->loaded)
        store_load(c->store, on_loaded, c);
}

static void on_loaded(struct store *st, int err, const struct store_kv *kvs, size_t n, void *arg)
{
    (void)st;
    struct ctl *c = arg;
    if (!c->leader || c->loaded)
        return;
    if (err) {
        log_error("state_load_failed", LF_STR("error", strerror(-err)));
        reactor_timer_start(c->r, &c->load_retry, c->cfg.leader_retry_ms, 0);
        return;
    }
    struct ctl_ft_rt **rts = xcalloc(n + 1, sizeof(*rts));
    size_t n_rts = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        const char *k = kvs[i].key;
        if (strcmp(k, "meta/next_id") == 0) {
            int64_t v;
            if (util_parse_i64(kvs[i].value, 1, WIRE_ID_MAX, &v) == 0 && v > c->next_id)
                c->next_id = v;
            continue;
        }
        json_t *j = json_loads(kvs[i].value, 0, NULL);
        if (strncmp(k, "instances/", 10) == 0) {
            struct wire_err werr = {{0}};
            struct ctl_inst *in = j ? ctl_inst_from_store_json(j, &werr) : NULL;
            if (!in) {
                log_error("state_record_invalid", LF_STR("key", k), LF_STR("error", werr.msg));
                bad++;
            } else if (ctl_find(c, in->id) || ctl_find_pending(c, in->id)) {
                ctl_inst_free(in);
            } else {
                if (in->id >= c->next_id)
                    c->next_id = in->id + 1;
                if (in->assembled)
                    ctl_inst_vec_push(&c->insts, &c->n_insts, in);
                else
                    ctl_inst_vec_push(&c->pending, &c->n_pending, in);
            }
        } else if (strncmp(k, "precision/", 10) == 0) {
            if (!j || ctl_prec_load(c, k, j) < 0) {
                log_error("state_record_invalid", LF_STR("key", k),
                          LF_STR("error", "not a precision alarm record"));
                bad++;
            }
        } else if (strncmp(k, "ft/", 3) == 0) {
            int64_t id;
            struct ctl_ft_rt *rt = NULL;
            if (j && util_parse_i64(k + 3, 0, WIRE_ID_MAX, &id) == 0)
                rt = ctl_ft_rt_from_store_json(id, j);
            if (rt)
                rts[n_rts++] = rt;
            else
                bad++;
        }
        json_decref(j);
    }
    c->loaded = true; /* from here on writes go to the store */
    for (size_t i = 0; i < n_rts; i++) {
        struct ctl_inst *in = ctl_find(c, rts[i]->instance_id);
        if (in && !in->ft) {
            in->ft = rts[i];
        } else if (!in && rts[i]->phase == FT_RECONFIGURING) {
            ctl_ghost_add(c, rts[i]);
        } else {
            ctl_forget_rt(c, rts[i]->instance_id);
            ctl_ft_rt_free(rts[i]);
        }
    }
    free(rts);
    log_info("state_loaded", LF_INT("records", n), LF_INT("invalid", bad),
             LF_INT("instances", c->n_insts), LF_INT("assembling", c->n_pending));
    go_live(c);
}

static void on_leader(struct store *st, bool leader, void *arg)
{
    (void)st;
    struct ctl *c = arg;
    if (leader) {
        c->leader = true;
        log_info("controller_leader", LF_STR("owner", c->owner));
        store_load(c->store, on_loaded, c);
        return;
    }
    if (c->leader) {
        /* Whatever we hold in memory may now be stale: step out, let the platform
         * restart us as a standby. */
        log_error("controller_leadership_lost", LF_STR("owner", c->owner));
        c->leader = false;
        c->loaded = false;
        c->exit_code = 1;
        reactor_stop(c->r);
    }
}

void ctl_leader_campaign(struct ctl *c)
{
    store_campaign(c->store, on_leader, c);
}
