#include "sim/sim_kv.h"

#include "common/util.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

/* A ring in insertion order. With one TTL for all tickets, insertion order is also
 * expiry order, so both eviction and expiry pop from the head. Taken tickets leave a
 * hole (used=false) that the head skips; a full ring with holes is compacted before
 * anything is evicted. Lookups scan: the table is small. */
struct slot {
    struct sim_kv_ticket t;
    bool used;
};

struct sim_kv {
    struct slot *ring;
    size_t cap;
    size_t head;  /* oldest slot (maybe a hole) */
    size_t span;  /* slots between head and tail, holes included */
    size_t count; /* used slots */
    int64_t ttl_ms;
    int64_t next_block;
};

struct sim_kv *sim_kv_new(size_t capacity, int64_t ttl_ms, int64_t first_block)
{
    struct sim_kv *kv = xcalloc(1, sizeof(*kv));
    kv->cap = capacity ? capacity : 1;
    kv->ring = xcalloc(kv->cap, sizeof(*kv->ring));
    kv->ttl_ms = ttl_ms;
    kv->next_block = first_block;
    return kv;
}

void sim_kv_free(struct sim_kv *kv)
{
    if (!kv)
        return;
    free(kv->ring);
    free(kv);
}

static void skip_holes(struct sim_kv *kv)
{
    while (kv->span > 0 && !kv->ring[kv->head].used) {
        kv->head = (kv->head + 1) % kv->cap;
        kv->span--;
    }
}

static void pop_head(struct sim_kv *kv)
{
    skip_holes(kv);
    if (kv->span == 0)
        return;
    kv->ring[kv->head].used = false;
    kv->count--;
    skip_holes(kv);
}

/* Squeeze out the holes left by takes in the middle, keeping insertion order, so the
 * table holds `cap` live tickets before it evicts. */
static void compact(struct sim_kv *kv)
{
    size_t out = 0;
    struct slot *tmp = xcalloc(kv->cap, sizeof(*tmp));
    for (size_t i = 0; i < kv->span; i++) {
        struct slot *s = &kv->ring[(kv->head + i) % kv->cap];
        if (s->used)
            tmp[out++] = *s;
    }
    free(kv->ring);
    kv->ring = tmp;
    kv->head = 0;
    kv->span = out;
}

int sim_kv_put(struct sim_kv *kv, uint64_t prompt_hash, int prompt_tokens, int64_t now_ms,
               struct sim_kv_ticket *out)
{
    int evicted = 0;
    sim_kv_expire(kv, now_ms);
    skip_holes(kv);
    if (kv->span == kv->cap && kv->count < kv->cap)
        compact(kv);
    /* Every slot holds a live ticket: evict the oldest. */
    while (kv->span == kv->cap) {
        pop_head(kv);
        evicted++;
    }
    int blocks =
        prompt_tokens > 0 ? (prompt_tokens + SIM_KV_BLOCK_TOKENS - 1) / SIM_KV_BLOCK_TOKENS : 1;
    if (blocks > SIM_KV_MAX_BLOCKS)
        blocks = SIM_KV_MAX_BLOCKS;
    struct slot *s = &kv->ring[(kv->head + kv->span) % kv->cap];
    s->used = true;
    s->t.first_block = kv->next_block;
    s->t.n_blocks = blocks;
    s->t.prompt_hash = prompt_hash;
    s->t.prompt_tokens = prompt_tokens;
    s->t.expires_ms = now_ms + kv->ttl_ms;
    kv->next_block += blocks;
    kv->span++;
    kv->count++;
    if (out)
        *out = s->t;
    return evicted;
}

int sim_kv_take(struct sim_kv *kv, int64_t first_block, int64_t now_ms, struct sim_kv_ticket *out)
{
    sim_kv_expire(kv, now_ms);
    for (size_t i = 0; i < kv->span; i++) {
        struct slot *s = &kv->ring[(kv->head + i) % kv->cap];
        if (s->used && s->t.first_block == first_block) {
            if (out)
                *out = s->t;
            s->used = false;
            kv->count--;
            skip_holes(kv);
            return 0;
        }
    }
    return -ENOENT;
}

size_t sim_kv_expire(struct sim_kv *kv, int64_t now_ms)
{
    size_t n = 0;
    skip_holes(kv);
    while (kv->span > 0 && kv->ring[kv->head].t.expires_ms <= now_ms) {
        pop_head(kv);
        n++;
    }
    return n;
}

size_t sim_kv_count(const struct sim_kv *kv)
{
    return kv->count;
}
