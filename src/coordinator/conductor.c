/* conductor — an upstream KV Conductor in place of Motor's own index
 * (prefill_kv_event_config.conductor_service with kv_cache_affinity): the management
 * thread registers each prefill/union endpoint with it and unregisters those that leave
 * the table; workers ask it for prefix matches (proxy.c). The wire (docs/coordinator.md,
 * "With a KV Conductor"):
 *   POST <service>/register   {"instance_id", "endpoint_id", "dp_rank", "role",
 *                              "model_name", "engine_type", "address": "ip:port",
 *                              "kv_event_endpoint": "tcp://ip:P+rank",
 *                              "replay_endpoint": "tcp://ip:R+rank" | null, "block_size"}
 *   POST <service>/unregister {"instance_id", "endpoint_id", "address"}
 *   POST <service>/query      {"model", "prompt" | "messages", ...}
 *                          -> {"scores": {"ip:port": matched prompt tokens, ...}}
 * A conductor that is down costs registrations (tried again at the next table change
 * and every re_register_interval_sec) and affinity (requests are balanced on load), never
 * a client request. */
#include "coordinator/coord_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

struct cond_ep {
    int64_t inst, ep;
    char *address;
    bool mark;
};

struct conductor {
    struct coord *c;
    char *service; /* base URL */
    struct cond_ep *v;
    size_t n;
    struct reactor_timer rereg;
    struct list_head calls; /* in flight */
    uint64_t failures;
};

struct cond_call {
    struct list_head link;
    struct conductor *k;
    struct httpc_req *h;
    char what[16];
};

char *conductor_url(const char *service, const char *route)
{
    bool scheme = !strncmp(service, "http://", 7) || !strncmp(service, "https://", 8);
    size_t n = strlen(service);
    while (n && service[n - 1] == '/')
        n--;
    return xasprintf("%s%.*s%s", scheme ? "" : "http://", (int)n, service, route);
}

static void call_done(const struct httpc_response *resp, void *arg)
{
    struct cond_call *k = arg;
    if (resp->error || resp->status / 100 != 2) {
        uint64_t f = ++k->k->failures;
        if ((f & (f - 1)) == 0)
            log_warn("kv_conductor_unreachable", LF_STR("call", k->what),
                     LF_STR("service", k->k->service), LF_INT("status", resp->status),
                     LF_STR("error", resp->error ? resp->error_text : ""),
                     LF_INT("failures", (int64_t)f));
    }
    list_remove(&k->link);
    free(k);
}

static void post(struct conductor *k, const char *route, json_t *body)
{
    char *url = conductor_url(k->service, route);
    struct cond_call *call = xcalloc(1, sizeof(*call));
    call->k = k;
    snprintf(call->what, sizeof(call->what), "%s", route + 1);
    list_insert_tail(&k->calls, &call->link);
    call->h = httpc_post_json(k->c->mgmt_httpc, url, body, 5000, call_done, call);
    json_decref(body);
    free(url);
}

static char *zmq_at(const char *ip, int port)
{
    return strchr(ip, ':') ? xasprintf("tcp://[%s]:%d", ip, port)
                           : xasprintf("tcp://%s:%d", ip, port);
}

static void reg(struct conductor *k, const struct instance *in, const struct inst_endpoint *ep)
{
    struct coord *c = k->c;
    char *kv = zmq_at(ep->ip, c->cfg.kv_event_port + (int)ep->id);
    char *rp =
        c->cfg.kv_replay_port > 0 ? zmq_at(ep->ip, c->cfg.kv_replay_port + (int)ep->id) : NULL;
    json_t *b = json_pack("{s:I, s:I, s:I, s:s, s:s, s:s, s:s, s:s, s:o, s:i}", "instance_id",
                          (json_int_t)in->id, "endpoint_id", (json_int_t)ep->id, "dp_rank",
                          (json_int_t)ep->id, "role", wire_role_str(in->role), "model_name",
                          in->model_name, "engine_type", in->engine_type, "address", ep->hostport,
                          "kv_event_endpoint", kv, "replay_endpoint",
                          rp ? json_string(rp) : json_null(), "block_size", c->cfg.kv_block_size);
    free(kv);
    free(rp);
    post(k, "/register", b);
}

static void unreg(struct conductor *k, const struct cond_ep *e)
{
    post(k, "/unregister",
         json_pack("{s:I, s:I, s:s}", "instance_id", (json_int_t)e->inst, "endpoint_id",
                   (json_int_t)e->ep, "address", e->address));
}

/* Register what is new (everything when all), unregister what left. */
static void sync_table(struct conductor *k, bool all)
{
    struct coord *c = k->c;
    for (size_t i = 0; i < k->n; i++)
        k->v[i].mark = false;
    for (size_t i = 0; i < c->table.n; i++) {
        struct instance *in = c->table.v[i];
        if (in->role != WIRE_ROLE_PREFILL && in->role != WIRE_ROLE_UNION)
            continue;
        for (size_t j = 0; j < in->n_eps; j++) {
            struct inst_endpoint *ep = &in->eps[j];
            if (ep->headless)
                continue;
            struct cond_ep *e = NULL;
            for (size_t x = 0; x < k->n && !e; x++)
                if (k->v[x].inst == in->id && k->v[x].ep == ep->id &&
                    !strcmp(k->v[x].address, ep->hostport))
                    e = &k->v[x];
            if (!e) {
                k->v = xrealloc(k->v, (k->n + 1) * sizeof(*k->v));
                e = &k->v[k->n++];
                *e = (struct cond_ep){in->id, ep->id, xstrdup(ep->hostport), false};
                reg(k, in, ep);
            } else if (all) {
                reg(k, in, ep);
            }
            e->mark = true;
        }
    }
    size_t w = 0;
    for (size_t i = 0; i < k->n; i++) {
        if (k->v[i].mark) {
            k->v[w++] = k->v[i];
            continue;
        }
        unreg(k, &k->v[i]);
        free(k->v[i].address);
    }
    k->n = w;
}

static void on_rereg(struct reactor *r, void *arg)
{
    (void)r;
    sync_table(arg, true);
}

static bool wanted(const struct coord *c)
{
    return c->cfg.scheduler == CCFG_SCHED_KV_AFFINITY && c->cfg.conductor_service &&
           *c->cfg.conductor_service;
}

void conductor_sync(struct coord *c)
{
    struct conductor *k = c->cond;
    if (k && k->n && (!wanted(c) || strcmp(k->service, c->cfg.conductor_service) != 0)) {
        /* Off, or another conductor: the old one hears every endpoint go. */
        for (size_t i = 0; i < k->n; i++) {
            unreg(k, &k->v[i]);
            free(k->v[i].address);
        }
        k->n = 0;
    }
    if (k)
        reactor_timer_stop(c->r, &k->rereg);
    if (!wanted(c))
        return;
    if (!k) {
        k = c->cond = xcalloc(1, sizeof(*k));
        k->c = c;
        list_init(&k->calls);
        reactor_timer_init(&k->rereg, on_rereg, k);
    }
    if (!k->service || strcmp(k->service, c->cfg.conductor_service) != 0) {
        free(k->service);
        k->service = xstrdup(c->cfg.conductor_service);
        log_info("kv_conductor", LF_STR("service", k->service));
    }
    if (c->cfg.conductor_rereg_ms > 0)
        reactor_timer_start(c->r, &k->rereg, c->cfg.conductor_rereg_ms, c->cfg.conductor_rereg_ms);
    sync_table(k, false);
}

void conductor_stop(struct coord *c)
{
    struct conductor *k = c->cond;
    if (!k)
        return;
    reactor_timer_stop(c->r, &k->rereg);
    /* Calls in flight are abandoned (the unregistrations just posted included: a
     * conductor must expire endpoints it stops hearing about anyway). */
    struct list_head *n, *tmp;
    list_for_each_safe(n, tmp, &k->calls)
    {
        struct cond_call *call = list_entry(n, struct cond_call, link);
        httpc_cancel(c->mgmt_httpc, call->h);
        list_remove(&call->link);
        free(call);
    }
    for (size_t i = 0; i < k->n; i++)
        free(k->v[i].address);
    free(k->v);
    free(k->service);
    free(k);
    c->cond = NULL;
}
