/* kvsub — the KV-event subscriptions that feed the index (kvidx.h), on the management
 * reactor.
 *
 * With scheduler_type kv_cache_affinity (and no conductor_service), every endpoint of a
 * prefill or union instance that is not headless gets a ZMTP SUB connected to
 * tcp://<ip>:<P + endpoint id>, P the port of prefill_kv_event_config.endpoint — the
 * endpoint id is the engine's DP rank,
 * and each rank of vLLM publishes on the configured port plus its rank
 * (offset_endpoint_port), the address upstream registers with its conductor — and, when
 * replay_endpoint is set, a DEALER to the rank's replay ROUTER (its port + rank).
 *
 * Sequence numbers (the second frame, 8 bytes big-endian, from 0 per engine process):
 *   - the next one expected: applied;
 *   - lower than expected: the engine restarted (its cache is new): the slot is cleared,
 *     and the buffered history asked for again when there is a replay endpoint;
 *   - higher: batches were lost (the publisher's high-water mark): counted, and the
 *     missing range asked for from the replay endpoint when there is one;
 * A new connection (first contact, or after the engine went away) clears the slot when
 * a replay endpoint can give the history back (from 0), and otherwise keeps what it has
 * until the first batch tells whether the engine restarted. Replayed batches older than
 * the first live one are applied; the others were or will be seen live.
 *
 * An endpoint that leaves the table loses its slot (and its blocks). */
#include "coordinator/coord_internal.h"
#include "coordinator/kvidx.h"

#include "common/log.h"
#include "common/util.h"
#include "common/zmtp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct kvsub_ep {
    struct kvsub *ks;
    char *hostport; /* business address: the index's slot name */
    char *endpoint; /* tcp://ip:port+rank */
    char *replay;   /* NULL = none */
    int slot;
    struct zmtp_sock *sub, *dealer;
    int64_t next;        /* next sequence number expected, -1 = none seen */
    int64_t first_live;  /* first live seq since the last replay request, -1 = none yet */
    int64_t want_replay; /* start seq to ask for once the DEALER is up, -1 = none */
    bool mark;
};

struct kvsub {
    struct coord *c;
    struct kvsub_ep **v;
    size_t n;
    char *topic;
    struct kvidx_stats st;
    uint64_t batches, restarts, gaps, replays;
};

static void ep_free(struct kvsub_ep *e)
{
    if (!e)
        return;
    zmtp_close(e->sub);
    zmtp_close(e->dealer);
    free(e->hostport);
    free(e->endpoint);
    free(e->replay);
    free(e);
}

static struct kvidx *kv_index(struct coord *c)
{
    return atomic_load_explicit(&c->kvidx, memory_order_acquire);
}

static void ask_replay(struct kvsub_ep *e, int64_t from)
{
    if (!e->dealer)
        return;
    uint8_t seq[8];
    for (int i = 0; i < 8; i++)
        seq[i] = (uint8_t)((uint64_t)from >> (56 - 8 * i));
    struct zmtp_msg m = {.n = 2, .parts = {(const uint8_t *)"", seq}, .lens = {0, 8}};
    e->first_live = -1;
    if (zmtp_send(e->dealer, &m) < 0) {
        e->want_replay = from; /* not connected yet: sent at the handshake */
        return;
    }
    e->want_replay = -1;
    e->ks->replays++;
    log_info("kv_events_replay", LF_STR("endpoint", e->replay), LF_INT("from_seq", from));
}

static int64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return (int64_t)v;
}

static void apply(struct kvsub_ep *e, const uint8_t *payload, size_t len)
{
    struct coord *c = e->ks->c;
    int rank;
    int rc = kvidx_apply(kv_index(c), e->slot, payload, len, &e->ks->st, &rank);
    e->ks->batches++;
    if (rc < 0)
        log_warn("kv_events_bad_batch", LF_STR("endpoint", e->endpoint),
                 LF_INT("bytes", (int64_t)len), LF_STR("error", strerror(-rc)));
}

static void on_live(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m, void *arg)
{
    (void)s;
    (void)p;
    struct kvsub_ep *e = arg;
    if (m->n != 3 || m->lens[1] != 8) {
        e->ks->st.bad++;
        return;
    }
    int64_t seq = be64(m->parts[1]);
    if (seq < 0) {
        e->ks->st.bad++;
        return;
    }
    if (e->first_live < 0)
        e->first_live = seq;
    if (e->next >= 0 && seq < e->next) {
        e->ks->restarts++;
        log_info("kv_events_engine_restarted", LF_STR("endpoint", e->endpoint), LF_INT("seq", seq),
                 LF_INT("expected", e->next));
        kvidx_slot_clear(kv_index(e->ks->c), e->slot);
        if (e->replay && seq > 0) {
            ask_replay(e, 0);
            e->first_live = seq;
        }
    } else if (e->next >= 0 && seq > e->next) {
        e->ks->gaps++;
        log_warn("kv_events_lost", LF_STR("endpoint", e->endpoint), LF_INT("from_seq", e->next),
                 LF_INT("to_seq", seq - 1), LF_BOOL("replay", e->replay != NULL));
        if (e->replay) {
            ask_replay(e, e->next);
            e->first_live = seq;
        }
    }
    apply(e, m->parts[2], m->lens[2]);
    e->next = seq + 1;
}

/* Replay answers: ["", seq, payload] (or without the empty delimiter), ending with
 * seq -1. */
static void on_replay(struct zmtp_sock *s, struct zmtp_peer *p, const struct zmtp_msg *m, void *arg)
{
    (void)s;
    (void)p;
    struct kvsub_ep *e = arg;
    size_t o = m->n == 3 && m->lens[0] == 0 ? 1 : 0;
    if (m->n - o != 2 || m->lens[o] != 8) {
        e->ks->st.bad++;
        return;
    }
    int64_t seq = be64(m->parts[o]);
    if (seq < 0)
        return; /* the end of the replay */
    if (e->first_live >= 0 && seq >= e->first_live)
        return; /* seen live */
    apply(e, m->parts[o + 1], m->lens[o + 1]);
    if (e->first_live < 0 && seq + 1 > e->next)
        e->next = seq + 1;
}

static void on_sub_event(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev,
                         const char *detail, void *arg)
{
    (void)s;
    (void)p;
    struct kvsub_ep *e = arg;
    if (ev == ZMTP_EV_CONNECTED) {
        log_info("kv_events_connected", LF_STR("endpoint", e->endpoint),
                 LF_STR("hostport", e->hostport));
        e->first_live = -1;
        if (e->replay) {
            kvidx_slot_clear(kv_index(e->ks->c), e->slot);
            e->next = -1;
            ask_replay(e, 0);
        }
    } else {
        log_info("kv_events_disconnected", LF_STR("endpoint", e->endpoint),
                 LF_STR("detail", detail ? detail : ""));
    }
}

static void on_dealer_event(struct zmtp_sock *s, struct zmtp_peer *p, enum zmtp_event ev,
                            const char *detail, void *arg)
{
    (void)s;
    (void)p;
    (void)detail;
    struct kvsub_ep *e = arg;
    if (ev == ZMTP_EV_CONNECTED && e->want_replay >= 0)
        ask_replay(e, e->want_replay);
}

static char *zmq_endpoint(const char *ip, int port)
{
    return strchr(ip, ':') ? xasprintf("tcp://[%s]:%d", ip, port)
                           : xasprintf("tcp://%s:%d", ip, port);
}

static struct kvsub_ep *ep_open(struct kvsub *ks, const struct inst_endpoint *iep)
{
    struct coord *c = ks->c;
    int slot = kvidx_slot_get(kv_index(c), iep->hostport);
    if (slot < 0) {
        log_warn("kv_events_too_many_endpoints", LF_STR("hostport", iep->hostport));
        return NULL;
    }
    struct kvsub_ep *e = xcalloc(1, sizeof(*e));
    e->ks = ks;
    e->slot = slot;
    e->next = e->first_live = e->want_replay = -1;
    e->hostport = xstrdup(iep->hostport);
    e->endpoint = zmq_endpoint(iep->ip, c->cfg.kv_event_port + (int)iep->id);
    if (c->cfg.kv_replay_port > 0)
        e->replay = zmq_endpoint(iep->ip, c->cfg.kv_replay_port + (int)iep->id);
    /* A batch is one engine step: tens of KiB; 16 MiB leaves room for a huge prompt. */
    struct zmtp_opts o = {.name = "kv-events", .max_frame = 16 << 20, .hwm = 1000};
    e->sub = zmtp_connect(c->r, ZMTP_SUB, e->endpoint, &o, on_live, on_sub_event, e);
    if (e->sub)
        zmtp_subscribe(e->sub, ks->topic, strlen(ks->topic));
    if (e->replay) {
        struct zmtp_opts ro = {.name = "kv-events-replay",
                               .max_frame = 16 << 20,
                               .max_queue_bytes = (size_t)64 << 20,
                               .hwm = 100000};
        e->dealer = zmtp_connect(c->r, ZMTP_DEALER, e->replay, &ro, on_replay, on_dealer_event, e);
    }
    if (!e->sub) {
        log_warn("kv_events_bad_endpoint", LF_STR("endpoint", e->endpoint));
        kvidx_slot_remove(kv_index(c), slot);
        ep_free(e);
        return NULL;
    }
    log_info("kv_events_subscribed", LF_STR("endpoint", e->endpoint),
             LF_STR("replay_endpoint", e->replay), LF_STR("hostport", e->hostport));
    return e;
}

static bool wanted(const struct coord *c)
{
    return c->cfg.scheduler == CCFG_SCHED_KV_AFFINITY && !c->cfg.kv_approx &&
           c->cfg.kv_event_port > 0 && !(c->cfg.conductor_service && *c->cfg.conductor_service);
}

/* Approximate prefixes: the workers create the slots as they route; the endpoints that
 * left the table are dropped here. */
static void approx_sync(struct coord *c)
{
    if (!kv_index(c))
        atomic_store_explicit(&c->kvidx, kvidx_new(c->cfg.kv_max_blocks), memory_order_release);
    size_t n = 0;
    for (size_t i = 0; i < c->table.n; i++)
        n += c->table.v[i]->n_eps;
    const char **hp = xcalloc(n + 1, sizeof(*hp));
    n = 0;
    for (size_t i = 0; i < c->table.n; i++)
        for (size_t j = 0; j < c->table.v[i]->n_eps; j++)
            hp[n++] = c->table.v[i]->eps[j].hostport;
    kvidx_retain(kv_index(c), hp, n);
    free(hp);
}

static struct kvsub_ep *find(struct kvsub *ks, const char *hostport, const char *endpoint)
{
    for (size_t i = 0; i < ks->n; i++)
        if (!strcmp(ks->v[i]->hostport, hostport) && !strcmp(ks->v[i]->endpoint, endpoint))
            return ks->v[i];
    return NULL;
}

void kvsub_sync(struct coord *c)
{
    conductor_sync(c);
    if (c->cfg.scheduler == CCFG_SCHED_KV_AFFINITY && c->cfg.kv_approx) {
        kvsub_stop(c); /* no events in this mode */
        approx_sync(c);
        return;
    }
    if (!wanted(c) && !c->kv)
        return;
    if (!kv_index(c))
        atomic_store_explicit(&c->kvidx, kvidx_new(c->cfg.kv_max_blocks), memory_order_release);
    struct kvsub *ks = c->kv;
    const char *topic = c->cfg.kv_topic ? c->cfg.kv_topic : "";
    if (ks && strcmp(ks->topic, topic) != 0) {
        kvsub_stop(c); /* another topic: subscribe again from scratch */
        ks = NULL;
    }
    if (!ks) {
        ks = c->kv = xcalloc(1, sizeof(*ks));
        ks->c = c;
        ks->topic = xstrdup(topic);
    }
    for (size_t i = 0; i < ks->n; i++)
        ks->v[i]->mark = false;
    for (size_t i = 0; wanted(c) && i < c->table.n; i++) {
        struct instance *in = c->table.v[i];
        if (in->role != WIRE_ROLE_PREFILL && in->role != WIRE_ROLE_UNION)
            continue;
        for (size_t j = 0; j < in->n_eps; j++) {
            const struct inst_endpoint *iep = &in->eps[j];
            if (iep->headless)
                continue;
            char *want = zmq_endpoint(iep->ip, c->cfg.kv_event_port + (int)iep->id);
            struct kvsub_ep *e = find(ks, iep->hostport, want);
            free(want);
            if (e && !!e->replay != (c->cfg.kv_replay_port > 0))
                e = NULL; /* replay turned on or off: the old one is dropped below */
            if (!e) {
                e = ep_open(ks, iep);
                if (!e)
                    continue;
                ks->v = xrealloc(ks->v, (ks->n + 1) * sizeof(*ks->v));
                ks->v[ks->n++] = e;
            }
            e->mark = true;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < ks->n; i++) {
        struct kvsub_ep *e = ks->v[i];
        if (e->mark) {
            ks->v[k++] = e;
            continue;
        }
        log_info("kv_events_unsubscribed", LF_STR("endpoint", e->endpoint));
        /* Another subscription of the same slot (a changed port) keeps the slot. */
        bool shared = false;
        for (size_t j = 0; j < ks->n; j++)
            if (ks->v[j] != e && ks->v[j]->mark && ks->v[j]->slot == e->slot)
                shared = true;
        if (!shared)
            kvidx_slot_remove(kv_index(c), e->slot);
        ep_free(e);
    }
    ks->n = k;
}

void kvsub_stop(struct coord *c)
{
    struct kvsub *ks = c->kv;
    if (!ks)
        return;
    for (size_t i = 0; i < ks->n; i++) {
        if (kv_index(c))
            kvidx_slot_remove(kv_index(c), ks->v[i]->slot);
        ep_free(ks->v[i]);
    }
    free(ks->v);
    free(ks->topic);
    free(ks);
    c->kv = NULL;
}

json_t *kvsub_to_json(struct coord *c)
{
    struct kvidx *x = kv_index(c);
    struct kvsub *ks = c->kv;
    if (!x)
        return json_null();
    struct kvidx_info in;
    kvidx_info(x, &in);
    json_t *j = json_pack("{s:I, s:I, s:I, s:I}", "blocks", (json_int_t)in.entries, "max_blocks",
                          (json_int_t)in.max_blocks, "bytes", (json_int_t)in.bytes, "slots",
                          (json_int_t)in.slots);
    if (ks) {
        json_object_set_new(
            j, "events",
            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "batches",
                      (json_int_t)ks->batches, "stored", (json_int_t)ks->st.stored, "removed",
                      (json_int_t)ks->st.removed, "cleared", (json_int_t)ks->st.cleared, "unkeyed",
                      (json_int_t)ks->st.unkeyed, "evicted", (json_int_t)ks->st.evicted, "bad",
                      (json_int_t)ks->st.bad, "restarts", (json_int_t)ks->restarts, "gaps",
                      (json_int_t)ks->gaps, "replays", (json_int_t)ks->replays));
        json_t *subs = json_array();
        for (size_t i = 0; i < ks->n; i++) {
            struct kvsub_ep *e = ks->v[i];
            struct zmtp_stats zs;
            zmtp_get_stats(e->sub, &zs);
            json_array_append_new(
                subs, json_pack("{s:s, s:s, s:o, s:b, s:I, s:I}", "hostport", e->hostport,
                                "endpoint", e->endpoint, "replay_endpoint",
                                e->replay ? json_string(e->replay) : json_null(), "connected",
                                zs.peers > 0, "next_seq", (json_int_t)e->next, "blocks",
                                (json_int_t)kvidx_slot_entries(x, e->slot)));
        }
        json_object_set_new(j, "subscriptions", subs);
    }
    return j;
}
