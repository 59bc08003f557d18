#include "sim/sim_kvev.h"

#include "common/log.h"
#include "common/msgpk.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "common/zmtp.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KVEV_BATCH_MAX ((size_t)32 << 20)  /* one encoded batch */
#define KVEV_BUFFER_BYTES ((size_t)64 << 20) /* replay buffer, all batches */

/* ---- configuration ------------------------------------------------------------- */

void sim_kvev_config_release(struct sim_kvev_config *c)
{
    if (!c)
        return;
    free(c->publisher);
    free(c->endpoint);
    free(c->replay_endpoint);
    free(c->topic);
    memset(c, 0, sizeof(*c));
}

int sim_kvev_parse_config(const char *text, struct sim_kvev_config *c, char *err, size_t cap)
{
    memset(c, 0, sizeof(*c));
    c->buffer_steps = 10000;
    c->hwm = 100000;
    c->max_queue_size = 100000;
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    int rc = 0;
    if (!json_is_object(o)) {
        snprintf(err, cap, "--kv-events-config must be a JSON object");
        rc = -EINVAL;
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        bool ok = true;
        if (!strcmp(k, "enable_kv_cache_events")) {
            ok = json_is_boolean(v);
            c->enabled = json_is_true(v);
        } else if (!strcmp(k, "publisher")) {
            ok = json_is_null(v) || (json_is_string(v) && (!strcmp(json_string_value(v), "zmq") ||
                                                          !strcmp(json_string_value(v), "null")));
            if (json_is_string(v))
                c->publisher = xstrdup(json_string_value(v));
        } else if (!strcmp(k, "endpoint")) {
            ok = json_is_string(v);
            if (ok)
                c->endpoint = xstrdup(json_string_value(v));
        } else if (!strcmp(k, "replay_endpoint")) {
            ok = json_is_null(v) || json_is_string(v);
            if (json_is_string(v))
                c->replay_endpoint = xstrdup(json_string_value(v));
        } else if (!strcmp(k, "topic")) {
            ok = json_is_string(v) && json_string_length(v) <= 255;
            if (ok)
                c->topic = xstrdup(json_string_value(v));
        } else if (!strcmp(k, "buffer_steps") || !strcmp(k, "hwm") ||
                   !strcmp(k, "max_queue_size")) {
            ok = json_is_integer(v) && json_integer_value(v) >= 1 &&
                 json_integer_value(v) <= 10000000;
            int *dst = !strcmp(k, "buffer_steps") ? &c->buffer_steps
                       : !strcmp(k, "hwm")        ? &c->hwm
                                                  : &c->max_queue_size;
            if (ok)
                *dst = (int)json_integer_value(v);
        } else {
            snprintf(err, cap, "--kv-events-config: unknown key '%s'", k);
            rc = -EINVAL;
            goto out;
        }
        if (!ok) {
            snprintf(err, cap, "--kv-events-config: invalid value for '%s'", k);
            rc = -EINVAL;
            goto out;
        }
    }
    if (!c->publisher)
        c->publisher = xstrdup(c->enabled ? "zmq" : "null");
    if (!c->endpoint)
        c->endpoint = xstrdup("tcp://*:5557");
    if (!c->topic)
        c->topic = xstrdup("");
out:
    json_decref(o);
    if (rc)
        sim_kvev_config_release(c);
    return rc;
}

char *sim_kvev_offset_endpoint(const char *ep, int rank)
{
    if (!ep)
        return NULL;
    const char *colon = strrchr(ep, ':');
    int port;
    if (rank == 0 || strncmp(ep, "tcp", 3) != 0 || !colon || util_parse_int(colon + 1, 0, 65535, &port))
        return xstrdup(ep);
    return xasprintf("%.*s:%d", (int)(colon - ep), ep, port + rank);
}

/* ---- encoding ------------------------------------------------------------------- */

static void put_hash(struct strbuf *sb, const uint8_t *h, bool int_hashes)
{
    if (!int_hashes) {
        msgpk_put_bin(sb, h, SIM_CACHE_HASH_LEN);
        return;
    }
    /* int.from_bytes(hash, "big") & (2**64 - 1): the last 8 bytes */
    uint64_t v = 0;
    for (int i = SIM_CACHE_HASH_LEN - 8; i < SIM_CACHE_HASH_LEN; i++)
        v = v << 8 | h[i];
    msgpk_put_uint(sb, v);
}

static void put_key(struct strbuf *sb, bool map, const char *k)
{
    if (map)
        msgpk_put_cstr(sb, k);
}

/* Length of the group starting at i: a run of STORED events each continuing the
 * previous one's chain, or a run of REMOVED, or one CLEARED. */
static size_t group_len(const struct sim_cache_event *evs, size_t n, size_t i)
{
    size_t j = i + 1;
    if (evs[i].kind == SIM_CACHE_STORED) {
        while (j < n && evs[j].kind == SIM_CACHE_STORED && evs[j].parent &&
               !memcmp(evs[j].parent, evs[j - 1].hash, SIM_CACHE_HASH_LEN) &&
               evs[j].block_size == evs[i].block_size)
            j++;
    } else if (evs[i].kind == SIM_CACHE_REMOVED) {
        while (j < n && evs[j].kind == SIM_CACHE_REMOVED)
            j++;
    }
    return j - i;
}

int sim_kvev_encode(const struct sim_cache_event *evs, size_t n, double ts, int dp_rank,
                    bool int_hashes, bool map, struct strbuf *sb)
{
    size_t groups = 0;
    for (size_t i = 0; i < n; i += group_len(evs, n, i))
        groups++;
    if (map)
        msgpk_put_map(sb, 3);
    else
        msgpk_put_array(sb, 3);
    put_key(sb, map, "ts");
    msgpk_put_double(sb, ts);
    put_key(sb, map, "events");
    msgpk_put_array(sb, (uint32_t)groups);
    for (size_t i = 0; i < n;) {
        size_t g = group_len(evs, n, i);
        const struct sim_cache_event *e = &evs[i];
        if (e->kind == SIM_CACHE_STORED) {
            if (map)
                msgpk_put_map(sb, 8);
            else
                msgpk_put_array(sb, 8);
            put_key(sb, map, "type");
            msgpk_put_cstr(sb, "BlockStored");
            put_key(sb, map, "block_hashes");
            msgpk_put_array(sb, (uint32_t)g);
            for (size_t k = 0; k < g; k++)
                put_hash(sb, evs[i + k].hash, int_hashes);
            put_key(sb, map, "parent_block_hash");
            if (e->parent)
                put_hash(sb, e->parent, int_hashes);
            else
                msgpk_put_nil(sb);
            put_key(sb, map, "token_ids");
            msgpk_put_array(sb, (uint32_t)(g * (size_t)e->block_size));
            for (size_t k = 0; k < g; k++)
                for (int t = 0; t < e->block_size; t++)
                    msgpk_put_uint(sb, (uint64_t)(uint32_t)evs[i + k].tokens[t]);
            put_key(sb, map, "block_size");
            msgpk_put_uint(sb, (uint64_t)e->block_size);
            put_key(sb, map, "lora_id");
            msgpk_put_nil(sb);
            put_key(sb, map, "medium");
            msgpk_put_cstr(sb, "GPU");
            put_key(sb, map, "lora_name");
            msgpk_put_nil(sb);
        } else if (e->kind == SIM_CACHE_REMOVED) {
            if (map)
                msgpk_put_map(sb, 3);
            else
                msgpk_put_array(sb, 3);
            put_key(sb, map, "type");
            msgpk_put_cstr(sb, "BlockRemoved");
            put_key(sb, map, "block_hashes");
            msgpk_put_array(sb, (uint32_t)g);
            for (size_t k = 0; k < g; k++)
                put_hash(sb, evs[i + k].hash, int_hashes);
            put_key(sb, map, "medium");
            msgpk_put_cstr(sb, "GPU");
        } else {
            if (map)
                msgpk_put_map(sb, 1);
            else
                msgpk_put_array(sb, 1);
            put_key(sb, map, "type");
            msgpk_put_cstr(sb, "AllBlocksCleared");
        }
        i += g;
    }
    put_key(sb, map, "data_parallel_rank");
    msgpk_put_int(sb, dp_rank);
    return sb->overflow ? -E2BIG : 0;
}

/* ---- the publisher -------------------------------------------------------------- */

struct pev { /* an owned copy of a cache event */
    enum sim_cache_ev kind;
    uint8_t hash[SIM_CACHE_HASH_LEN], parent[SIM_CACHE_HASH_LEN];
    bool has_parent;
    int32_t *tokens;
    int block_size;
};

struct buffered {
    uint64_t seq;
    uint8_t *payload;
    size_t len;
};

struct sim_kvev {
    struct reactor *r;
    struct sim_kvev_opts o;
    char *topic;
    struct zmtp_sock *pub, *replay;
    struct pev *pending;
    size_t n_pending, cap_pending;
    struct reactor_deferred flush;
    struct buffered *ring;
    size_t ring_cap, ring_head, ring_n, ring_bytes;
    struct sim_kvev_stats st;
};

static void ring_drop_oldest(struct sim_kvev *k)
{
    struct buffered *b = &k->ring[k->ring_head];
    k->ring_bytes -= b->len;
    free(b->payload);
    b->payload = NULL;
    k->ring_head = (k->ring_head + 1) % k->ring_cap;
    k->ring_n--;
}

static void ring_push(struct sim_kvev *k, uint64_t seq, const void *p, size_t len)
{
    while (k->ring_n > 0 && (k->ring_n == k->ring_cap || k->ring_bytes + len > KVEV_BUFFER_BYTES))
        ring_drop_oldest(k);
    if (len > KVEV_BUFFER_BYTES)
        return;
    struct buffered *b = &k->ring[(k->ring_head + k->ring_n) % k->ring_cap];
    b->seq = seq;
    b->payload = xmalloc(len ? len : 1);
    memcpy(b->payload, p, len);
    b->len = len;
    k->ring_n++;
    k->ring_bytes += len;
}

static void be64(uint64_t v, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(v >> (56 - 8 * i));
}

void sim_kvev_flush(struct sim_kvev *k)
{
    if (!k || k->n_pending == 0)
        return;
    struct sim_cache_event *evs = xcalloc(k->n_pending, sizeof(*evs));
    for (size_t i = 0; i < k->n_pending; i++) {
        struct pev *p = &k->pending[i];
        evs[i] = (struct sim_cache_event){.kind = p->kind,
                                          .hash = p->hash,
                                          .parent = p->has_parent ? p->parent : NULL,
                                          .tokens = p->tokens,
                                          .block_size = p->block_size};
    }
    struct strbuf sb;
    strbuf_init(&sb, KVEV_BATCH_MAX);
    int rc = sim_kvev_encode(evs, k->n_pending, (double)util_wall_ms() / 1000.0, k->o.dp_rank,
                             k->o.int_hashes, k->o.map_encoding, &sb);
    if (rc) {
        log_warn("sim_kv_events_batch_dropped", LF_INT("events", k->n_pending),
                 LF_STR("why", "batch larger than 32 MiB"));
    } else {
        uint64_t seq = k->st.next_seq++;
        uint8_t sq[8];
        be64(seq, sq);
        struct zmtp_msg m = {.n = 3};
        m.parts[0] = (const uint8_t *)k->topic;
        m.lens[0] = strlen(k->topic);
        m.parts[1] = sq;
        m.lens[1] = 8;
        m.parts[2] = (const uint8_t *)sb.buf;
        m.lens[2] = sb.len;
        zmtp_send(k->pub, &m);
        ring_push(k, seq, sb.buf, sb.len);
        k->st.batches++;
        k->st.events += k->n_pending;
    }
    strbuf_release(&sb);
    free(evs);
    for (size_t i = 0; i < k->n_pending; i++)
        free(k->pending[i].tokens);
    k->n_pending = 0;
}

static void on_flush(struct reactor *r, void *arg)
{
    sim_kvev_flush(arg);
}

void sim_kvev_on_cache_event(void *arg, const struct sim_cache_event *ev)
{
    struct sim_kvev *k = arg;
    if (!k)
        return;
    if (k->n_pending == k->cap_pending) {
        k->cap_pending = k->cap_pending ? k->cap_pending * 2 : 64;
        k->pending = xrealloc(k->pending, k->cap_pending * sizeof(*k->pending));
    }
    struct pev *p = &k->pending[k->n_pending++];
    memset(p, 0, sizeof(*p));
    p->kind = ev->kind;
    p->block_size = ev->block_size;
    if (ev->hash)
        memcpy(p->hash, ev->hash, SIM_CACHE_HASH_LEN);
    if (ev->parent) {
        memcpy(p->parent, ev->parent, SIM_CACHE_HASH_LEN);
        p->has_parent = true;
    }
    if (ev->kind == SIM_CACHE_STORED) {
        p->tokens = xmalloc((size_t)ev->block_size * sizeof(int32_t));
        memcpy(p->tokens, ev->tokens, (size_t)ev->block_size * sizeof(int32_t));
    }
    /* one batch per loop iteration, like vLLM's one per scheduler step */
    reactor_defer(k->r, &k->flush);
}

static void on_replay(struct zmtp_sock *s, struct zmtp_peer *peer, const struct zmtp_msg *m,
                      void *arg)
{
    struct sim_kvev *k = arg;
    if (m->n != 2 || m->lens[0] != 0 || m->lens[1] != 8) {
        log_warn("sim_kv_replay_invalid", LF_STR("peer", zmtp_peer_addr(peer)),
                 LF_INT("frames", m->n),
                 LF_STR("expected", "[\"\", start_seq as 8 bytes big-endian]"));
        return;
    }
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | m->parts[1][i];
    k->st.replays++;
    uint64_t sent = 0;
    for (size_t i = 0; i < k->ring_n; i++) {
        struct buffered *b = &k->ring[(k->ring_head + i) % k->ring_cap];
        if (b->seq < start)
            continue;
        uint8_t sq[8];
        be64(b->seq, sq);
        struct zmtp_msg out = {.n = 3};
        out.parts[0] = (const uint8_t *)"";
        out.lens[0] = 0;
        out.parts[1] = sq;
        out.lens[1] = 8;
        out.parts[2] = b->payload;
        out.lens[2] = b->len;
        if (zmtp_send_to(s, peer, &out) == 0)
            sent++;
    }
    struct zmtp_msg end = {.n = 3};
    end.parts[0] = (const uint8_t *)"";
    end.lens[0] = 0;
    end.parts[1] = (const uint8_t *)"\xff\xff\xff\xff\xff\xff\xff\xff";
    end.lens[1] = 8;
    end.parts[2] = (const uint8_t *)"";
    end.lens[2] = 0;
    zmtp_send_to(s, peer, &end);
    k->st.replayed += sent;
    log_info("sim_kv_replay", LF_STR("peer", zmtp_peer_addr(peer)), LF_INT("from_seq", start),
             LF_INT("batches", sent));
}

static bool binds(const char *ep)
{
    return strchr(ep, '*') || strstr(ep, "::");
}

static struct zmtp_sock *open_sock(struct reactor *r, enum zmtp_type t, const char *ep,
                                   const struct zmtp_opts *o, zmtp_msg_cb cb, void *arg)
{
    return binds(ep) ? zmtp_bind(r, t, ep, o, cb, NULL, arg) : zmtp_connect(r, t, ep, o, cb, NULL, arg);
}

struct sim_kvev *sim_kvev_start(struct reactor *r, const struct sim_kvev_config *cfg,
                                const struct sim_kvev_opts *o, bool *failed)
{
    *failed = false;
    if (!cfg || !cfg->enabled || !cfg->publisher || strcmp(cfg->publisher, "zmq") != 0)
        return NULL;
    struct sim_kvev *k = xcalloc(1, sizeof(*k));
    k->r = r;
    k->o = *o;
    k->topic = xstrdup(cfg->topic ? cfg->topic : "");
    k->ring_cap = (size_t)(cfg->buffer_steps > 0 ? cfg->buffer_steps : 10000);
    k->ring = xcalloc(k->ring_cap, sizeof(*k->ring));
    reactor_deferred_init(&k->flush, on_flush, k);
    char *ep = sim_kvev_offset_endpoint(cfg->endpoint, o->dp_rank);
    /* subscribers only ever send subscriptions: small frames suffice */
    struct zmtp_opts po = {.name = "kv-events", .hwm = (size_t)cfg->hwm, .max_frame = 4096};
    k->pub = open_sock(r, ZMTP_PUB, ep, &po, NULL, k);
    if (!k->pub) {
        log_error("sim_kv_events_failed", LF_STR("endpoint", ep), LF_STR("error", strerror(errno)));
        free(ep);
        sim_kvev_free(k);
        *failed = true;
        return NULL;
    }
    k->st.port = zmtp_port(k->pub);
    char *rep = NULL;
    if (cfg->replay_endpoint) {
        rep = sim_kvev_offset_endpoint(cfg->replay_endpoint, o->dp_rank);
        struct zmtp_opts ro = {.name = "kv-events-replay",
                               .max_frame = 4096, /* requests are 8 bytes */
                               .hwm = k->ring_cap + 2,
                               .max_queue_bytes = (size_t)128 << 20};
        k->replay = open_sock(r, ZMTP_ROUTER, rep, &ro, on_replay, k);
        if (!k->replay) {
            log_error("sim_kv_events_failed", LF_STR("replay_endpoint", rep),
                      LF_STR("error", strerror(errno)));
            free(ep);
            free(rep);
            sim_kvev_free(k);
            *failed = true;
            return NULL;
        }
        k->st.replay_port = zmtp_port(k->replay);
    }
    log_info("sim_kv_events", LF_STR("endpoint", ep), LF_INT("port", k->st.port),
             LF_STR("replay_endpoint", rep), LF_INT("replay_port", k->st.replay_port),
             LF_STR("topic", k->topic), LF_BOOL("int_hashes", o->int_hashes),
             LF_STR("encoding", o->map_encoding ? "map" : "array"));
    free(ep);
    free(rep);
    /* a fresh engine's cache is empty: say so first (seq 0, kept for replay) */
    struct sim_cache_event cleared = {.kind = SIM_CACHE_CLEARED};
    sim_kvev_on_cache_event(k, &cleared);
    sim_kvev_flush(k);
    reactor_defer_cancel(r, &k->flush);
    return k;
}

void sim_kvev_free(struct sim_kvev *k)
{
    if (!k)
        return;
    reactor_defer_cancel(k->r, &k->flush);
    for (size_t i = 0; i < k->n_pending; i++)
        free(k->pending[i].tokens);
    free(k->pending);
    while (k->ring_n > 0)
        ring_drop_oldest(k);
    free(k->ring);
    zmtp_close(k->pub);
    zmtp_close(k->replay);
    free(k->topic);
    free(k);
}

void sim_kvev_get_stats(const struct sim_kvev *k, struct sim_kvev_stats *out)
{
    if (!k) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = k->st;
}
