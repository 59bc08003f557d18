/* motor-kvroute-cost: the cache-aware routing decision's own cost, per request, with
 * the KV index holding S cached sessions over E endpoints (bench/coord_kv_routing.py
 * prints it as a row).
 *
 * Each session is a shared system prompt (one of 8) plus its own turns: P prompt tokens
 * in blocks of B. The index is filled the way the engines' events fill it (BlockStored
 * batches through kvidx_apply, one session's chain on one endpoint); then each timed
 * request is one session's next turn: its block keys (kvidx_keys over its token ids) and
 * the choice among the endpoints (bal_select_affinity, unified, which asks kvidx_match).
 * Tokenization is not in it (the engine's /tokenize: a round trip, measured by the TTFT
 * rows).
 *
 * usage: motor-kvroute-cost [--sessions 10000] [--endpoints 8] [--tokens 2048]
 *        [--block 16] [--requests 20000]  -> one JSON line on stdout */
#include "common/msgpk.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "coordinator/balancer.h"
#include "coordinator/kvidx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long opt(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return strtol(argv[i + 1], NULL, 10);
    return def;
}

static void session_tokens(uint32_t s, uint32_t *t, size_t n)
{
    size_t shared = n / 2; /* the system prompt: shared by sessions with the same s % 8 */
    for (size_t i = 0; i < n; i++)
        t[i] = i < shared ? (uint32_t)(1000 + (s % 8) * 7919 + i) : (uint32_t)(s * 131 + i) % 50000;
}

static void put_hash(struct strbuf *sb, uint64_t h)
{
    msgpk_put_uint(sb, h);
}

static uint64_t ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct mctx {
    struct kvidx *x;
    const uint64_t *keys;
    size_t n;
    int bs;
};

static void match(void *ctx, const char *const *hp, size_t m, uint32_t *tokens)
{
    struct mctx *c = ctx;
    kvidx_match(c->x, c->keys, c->n, c->bs, hp, m, tokens);
    for (size_t j = 0; j < m; j++)
        tokens[j] *= (uint32_t)c->bs;
}

int main(int argc, char **argv)
{
    long sessions = opt(argc, argv, "--sessions", 10000);
    long eps = opt(argc, argv, "--endpoints", 8);
    long ntok = opt(argc, argv, "--tokens", 2048);
    int bs = (int)opt(argc, argv, "--block", 16);
    long requests = opt(argc, argv, "--requests", 20000);
    size_t nb = (size_t)ntok / (size_t)bs;
    struct kvidx *x = kvidx_new((size_t)sessions * nb + 1024);
    char names[64][32];
    /* A fleet of one instance with eps endpoints (the balancer's input). */
    struct instance in = {.n_eps = (size_t)eps};
    struct inst_endpoint *ev = calloc((size_t)eps, sizeof(*ev));
    struct inst_load *loads = calloc((size_t)eps, sizeof(*loads));
    for (long e = 0; e < eps; e++) {
        snprintf(names[e], sizeof(names[e]), "10.0.0.%ld:8000", e + 1);
        kvidx_slot_get(x, names[e]);
        ev[e] = (struct inst_endpoint){
            .id = e, .hostport = names[e], .load = &loads[e], .status = WIRE_EP_NORMAL};
    }
    in.eps = ev;
    uint32_t *t = malloc((size_t)ntok * sizeof(uint32_t));
    struct strbuf sb;
    strbuf_init(&sb, 64u << 20);
    struct kvidx_stats st = {0};
    uint64_t t0 = ns();
    for (long s = 0; s < sessions; s++) {
        session_tokens((uint32_t)s, t, (size_t)ntok);
        strbuf_reset(&sb);
        msgpk_put_array(&sb, 3);
        msgpk_put_double(&sb, 0);
        msgpk_put_array(&sb, 1);
        msgpk_put_array(&sb, 5);
        msgpk_put_cstr(&sb, "BlockStored");
        msgpk_put_array(&sb, (uint32_t)nb);
        /* The engine's hashes are content hashes: the shared head has the same ones. */
        for (size_t b = 0; b < nb; b++)
            put_hash(&sb, b < nb / 2 ? ((uint64_t)(s % 8) << 40) + b + 1
                                     : ((uint64_t)(s + 8) << 20) + b + 1);
        msgpk_put_nil(&sb);
        msgpk_put_array(&sb, (uint32_t)(nb * (size_t)bs));
        for (size_t i = 0; i < nb * (size_t)bs; i++)
            msgpk_put_uint(&sb, t[i]);
        msgpk_put_uint(&sb, (uint64_t)bs);
        msgpk_put_uint(&sb, 0);
        kvidx_apply(x, (int)(s % eps), sb.buf, sb.len, &st, NULL);
    }
    uint64_t fill_ns = ns() - t0;
    uint64_t *keys = malloc((nb + 8) * sizeof(uint64_t));
    struct instance *insts[] = {&in};
    atomic_uint rr = 0;
    uint64_t matched = 0, spent = 0;
    for (long r = 0; r < requests; r++) {
        uint32_t s = (uint32_t)((r * 7919) % sessions);
        session_tokens(s, t, (size_t)ntok);
        uint64_t a = ns();
        struct mctx mc = {x, keys, 0, bs};
        mc.n = kvidx_keys(t, (size_t)ntok, bs, keys, nb + 8);
        struct bal_affinity aff = {.match = match,
                                   .ctx = &mc,
                                   .prompt_tokens = ntok,
                                   .req_tokens = ntok + 64,
                                   .gate = 1.5};
        struct bal_pick p;
        bal_select_affinity(BAL_KV_UNIFIED, 0.05, insts, 1, NULL, NULL, &rr, &aff, &p);
        spent += ns() - a;
        matched += aff.matched;
    }
    struct kvidx_info info;
    kvidx_info(x, &info);
    printf("{\"sessions\":%ld,\"endpoints\":%ld,\"prompt_tokens\":%ld,\"block_size\":%d,"
           "\"requests\":%ld,\"us_per_request\":%.3f,\"fill_us_per_session\":%.3f,"
           "\"matched_fraction\":%.4f,\"index_blocks\":%zu,\"index_bytes\":%zu}\n",
           sessions, eps, ntok, bs, requests, (double)spent / 1000.0 / (double)requests,
           (double)fill_ns / 1000.0 / (double)sessions,
           (double)matched / ((double)requests * (double)ntok), info.entries, info.bytes);
    strbuf_release(&sb);
    free(keys);
    free(t);
    free(ev);
    free(loads);
    kvidx_free(x);
    return 0;
}
