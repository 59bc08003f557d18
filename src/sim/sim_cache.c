#include "sim/sim_cache.h"

#include "common/sha256.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define NIL UINT32_MAX

struct block {
    uint8_t hash[SIM_CACHE_HASH_LEN];
    int32_t refs;
    uint32_t prev, next; /* LRU list of unpinned cached blocks */
    uint32_t hnext;      /* hash chain */
    bool used;
    bool in_lru;
};

struct sim_cache {
    size_t cap;
    int block_size;
    struct block *b;
    uint32_t *buckets;
    size_t n_buckets; /* power of two */
    uint32_t free_head;
    uint32_t lru_head, lru_tail; /* head = least recently used */
    uint8_t none_hash[SIM_CACHE_HASH_LEN];
    sim_cache_event_cb cb;
    void *arg;
    struct sim_cache_stats st;
};

/* ---- hashing (vLLM's sha256_cbor) ------------------------------------------------ */

/* CBOR head: major type and argument in the shortest form (canonical). */
static size_t cbor_head(uint8_t *out, int major, uint64_t v)
{
    uint8_t m = (uint8_t)(major << 5);
    if (v < 24) {
        out[0] = m | (uint8_t)v;
        return 1;
    }
    int w = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffULL ? 4 : 8;
    out[0] = m | (uint8_t)(w == 1 ? 24 : w == 2 ? 25 : w == 4 ? 26 : 27);
    for (int i = 0; i < w; i++)
        out[1 + i] = (uint8_t)(v >> (8 * (w - 1 - i)));
    return (size_t)w + 1;
}

void sim_cache_none_hash(const char *seed, uint8_t out[SIM_CACHE_HASH_LEN])
{
    if (!seed) {
        if (getrandom(out, SIM_CACHE_HASH_LEN, 0) != SIM_CACHE_HASH_LEN) {
            uint64_t t = (uint64_t)util_wall_ms();
            sha256(&t, sizeof(t), out);
        }
        return;
    }
    struct sha256 s;
    sha256_init(&s);
    uint8_t h[9];
    size_t len = strlen(seed);
    sha256_update(&s, h, cbor_head(h, 3, len));
    sha256_update(&s, seed, len);
    sha256_final(&s, out);
}

void sim_cache_block_hash(const uint8_t parent[SIM_CACHE_HASH_LEN], const int32_t *tokens,
                          int block_size, uint8_t out[SIM_CACHE_HASH_LEN])
{
    struct sha256 s;
    sha256_init(&s);
    uint8_t h[9];
    sha256_update(&s, h, cbor_head(h, 4, 3)); /* (parent, tokens, extra_keys) */
    sha256_update(&s, h, cbor_head(h, 2, SIM_CACHE_HASH_LEN));
    sha256_update(&s, parent, SIM_CACHE_HASH_LEN);
    sha256_update(&s, h, cbor_head(h, 4, (uint64_t)block_size));
    for (int i = 0; i < block_size; i++)
        sha256_update(&s, h, cbor_head(h, 0, (uint64_t)(uint32_t)tokens[i]));
    uint8_t none = 0xf6; /* extra_keys = None */
    sha256_update(&s, &none, 1);
    sha256_final(&s, out);
}

/* ---- table ---------------------------------------------------------------------- */

static uint64_t key(const uint8_t *h)
{
    uint64_t k;
    memcpy(&k, h, sizeof(k));
    return k;
}

struct sim_cache *sim_cache_new(size_t num_blocks, int block_size,
                                const uint8_t none_hash[SIM_CACHE_HASH_LEN], sim_cache_event_cb cb,
                                void *arg)
{
    if (num_blocks == 0 || num_blocks >= NIL || block_size < 1 ||
        block_size > SIM_CACHE_MAX_BLOCK_SIZE)
        return NULL;
    struct sim_cache *c = xcalloc(1, sizeof(*c));
    c->cap = num_blocks;
    c->block_size = block_size;
    c->b = xcalloc(num_blocks, sizeof(*c->b));
    c->n_buckets = 16;
    while (c->n_buckets < num_blocks * 2)
        c->n_buckets *= 2;
    c->buckets = xmalloc(c->n_buckets * sizeof(*c->buckets));
    for (size_t i = 0; i < c->n_buckets; i++)
        c->buckets[i] = NIL;
    for (size_t i = 0; i < num_blocks; i++)
        c->b[i].next = i + 1 < num_blocks ? (uint32_t)(i + 1) : NIL;
    c->free_head = 0;
    c->lru_head = c->lru_tail = NIL;
    memcpy(c->none_hash, none_hash, SIM_CACHE_HASH_LEN);
    c->cb = cb;
    c->arg = arg;
    c->st.capacity = num_blocks;
    return c;
}

void sim_cache_free(struct sim_cache *c)
{
    if (!c)
        return;
    free(c->b);
    free(c->buckets);
    free(c);
}

int sim_cache_block_size(const struct sim_cache *c)
{
    return c->block_size;
}

static void emit(struct sim_cache *c, enum sim_cache_ev kind, const uint8_t *hash,
                 const uint8_t *parent, const int32_t *tokens)
{
    if (!c->cb)
        return;
    struct sim_cache_event ev = {
        .kind = kind, .hash = hash, .parent = parent, .tokens = tokens,
        .block_size = c->block_size};
    c->cb(c->arg, &ev);
}

static void lru_unlink(struct sim_cache *c, uint32_t i)
{
    struct block *b = &c->b[i];
    if (!b->in_lru)
        return;
    b->in_lru = false;
    if (b->prev != NIL)
        c->b[b->prev].next = b->next;
    else
        c->lru_head = b->next;
    if (b->next != NIL)
        c->b[b->next].prev = b->prev;
    else
        c->lru_tail = b->prev;
    b->prev = b->next = NIL;
}

static void lru_push_tail(struct sim_cache *c, uint32_t i)
{
    struct block *b = &c->b[i];
    b->in_lru = true;
    b->next = NIL;
    b->prev = c->lru_tail;
    if (c->lru_tail != NIL)
        c->b[c->lru_tail].next = i;
    else
        c->lru_head = i;
    c->lru_tail = i;
}

static uint32_t find(const struct sim_cache *c, const uint8_t *h)
{
    for (uint32_t i = c->buckets[key(h) & (c->n_buckets - 1)]; i != NIL; i = c->b[i].hnext)
        if (!memcmp(c->b[i].hash, h, SIM_CACHE_HASH_LEN))
            return i;
    return NIL;
}

static void table_remove(struct sim_cache *c, uint32_t i)
{
    uint32_t *pp = &c->buckets[key(c->b[i].hash) & (c->n_buckets - 1)];
    while (*pp != NIL && *pp != i)
        pp = &c->b[*pp].hnext;
    if (*pp == i)
        *pp = c->b[i].hnext;
}

static void pin(struct sim_cache *c, struct sim_cache_seq *q, uint32_t i)
{
    struct block *b = &c->b[i];
    if (b->refs++ == 0) {
        lru_unlink(c, i);
        c->st.pinned++;
    }
    if (q->n_pins == q->cap_pins) {
        q->cap_pins = q->cap_pins ? q->cap_pins * 2 : 16;
        q->pins = xrealloc(q->pins, q->cap_pins * sizeof(*q->pins));
    }
    q->pins[q->n_pins++] = i;
}

/* A free slot, evicting the least recently used unpinned block if needed; NIL when
 * every block is pinned. */
static uint32_t slot(struct sim_cache *c)
{
    if (c->free_head != NIL) {
        uint32_t i = c->free_head;
        c->free_head = c->b[i].next;
        return i;
    }
    uint32_t i = c->lru_head;
    if (i == NIL)
        return NIL;
    lru_unlink(c, i);
    table_remove(c, i);
    c->b[i].used = false;
    c->st.cached--;
    c->st.evicted++;
    emit(c, SIM_CACHE_REMOVED, c->b[i].hash, NULL, NULL);
    return i;
}

/* Store (or find) the block of tokens that follows q's chain and pin it. Returns
 * whether it was cached already. */
static bool add_block(struct sim_cache *c, struct sim_cache_seq *q, const int32_t *tokens)
{
    uint8_t h[SIM_CACHE_HASH_LEN];
    uint8_t parent[SIM_CACHE_HASH_LEN];
    memcpy(parent, q->has_last ? q->last : c->none_hash, SIM_CACHE_HASH_LEN);
    sim_cache_block_hash(parent, tokens, c->block_size, h);
    memcpy(q->last, h, SIM_CACHE_HASH_LEN);
    bool had_parent = q->has_last;
    q->has_last = true;
    if (q->broken)
        return false;
    uint32_t i = find(c, h);
    if (i != NIL) {
        pin(c, q, i);
        return true;
    }
    i = slot(c);
    if (i == NIL) {
        q->broken = true; /* every block is in use: nothing more of this sequence is cached */
        return false;
    }
    struct block *b = &c->b[i];
    memcpy(b->hash, h, SIM_CACHE_HASH_LEN);
    b->used = true;
    b->in_lru = false;
    b->refs = 0;
    b->prev = b->next = NIL;
    uint32_t *bucket = &c->buckets[key(h) & (c->n_buckets - 1)];
    b->hnext = *bucket;
    *bucket = i;
    c->st.cached++;
    c->st.stored++;
    pin(c, q, i);
    emit(c, SIM_CACHE_STORED, h, had_parent ? parent : NULL, tokens);
    return false;
}

void sim_cache_seq_init(struct sim_cache_seq *q)
{
    memset(q, 0, sizeof(*q));
}

size_t sim_cache_begin(struct sim_cache *c, struct sim_cache_seq *q, const int32_t *ids, size_t n,
                       bool count_stats)
{
    size_t bs = (size_t)c->block_size;
    size_t full = n / bs, hit = 0;
    bool leading = true;
    for (size_t k = 0; k < full; k++) {
        bool was = add_block(c, q, ids + k * bs);
        if (was && leading)
            hit += bs;
        else
            leading = false;
    }
    if (!q->pending)
        q->pending = xmalloc(bs * sizeof(*q->pending));
    q->n_pending = n - full * bs;
    memcpy(q->pending, ids + full * bs, q->n_pending * sizeof(*ids));
    if (count_stats) {
        c->st.queries += n;
        c->st.hits += hit;
    }
    return hit;
}

void sim_cache_append(struct sim_cache *c, struct sim_cache_seq *q, int32_t id)
{
    if (!q->pending)
        q->pending = xmalloc((size_t)c->block_size * sizeof(*q->pending));
    q->pending[q->n_pending++] = id;
    if (q->n_pending == (size_t)c->block_size) {
        add_block(c, q, q->pending);
        q->n_pending = 0;
    }
}

void sim_cache_end(struct sim_cache *c, struct sim_cache_seq *q)
{
    /* unpin in reverse order: the tail of a sequence becomes least recently used first,
     * its head (shared prefixes) last */
    for (size_t k = q->n_pins; k-- > 0;) {
        uint32_t i = q->pins[k];
        if (--c->b[i].refs == 0) {
            c->st.pinned--;
            lru_push_tail(c, i);
        }
    }
    free(q->pins);
    free(q->pending);
    memset(q, 0, sizeof(*q));
}

int sim_cache_reset(struct sim_cache *c)
{
    if (c->st.pinned > 0)
        return -EBUSY;
    for (size_t i = 0; i < c->n_buckets; i++)
        c->buckets[i] = NIL;
    for (size_t i = 0; i < c->cap; i++) {
        c->b[i].used = false;
        c->b[i].in_lru = false;
        c->b[i].next = i + 1 < c->cap ? (uint32_t)(i + 1) : NIL;
    }
    c->free_head = 0;
    c->lru_head = c->lru_tail = NIL;
    c->st.cached = 0;
    emit(c, SIM_CACHE_CLEARED, NULL, NULL, NULL);
    return 0;
}

void sim_cache_get_stats(const struct sim_cache *c, struct sim_cache_stats *out)
{
    *out = c->st;
}
