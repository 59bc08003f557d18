/* kvidx — the KV-cache index (see kvidx.h). */
#include "coordinator/kvidx.h"

#include "common/msgpk.h"
#include "common/util.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define SLOT_MAP (2 * KVIDX_MAX_SLOTS) /* open addressing, hostport -> slot */
/* Per event, what a batch may declare: counts are also checked against the bytes left
 * by the reader, these bound the scratch arrays. */
#define MAX_HASHES 65536
#define MAX_TOKENS (1u << 22)

/* One block known on one endpoint. Indices, not pointers: the pool grows by realloc. */
/* A list threaded through x->v by 32-bit index (an entry is on two: the global LRU and
 * its slot's); common/list.h's pointers would double the size of an entry. */
struct ilink {
    uint32_t prev, next;
};
struct ilist {
    uint32_t head, tail; /* most recently stored first */
};

struct kvb {
    uint64_t eh;  /* digest of the engine's block hash */
    uint64_t key; /* our chain key */
    uint32_t slot;
    struct ilink lru;        /* global, most recently stored first */
    struct ilink sl;         /* the slot's entries */
    uint32_t next_e, next_k; /* hash chains (by slot+eh, by key); next_e = free list */
};

struct kvslot {
    char *hostport; /* NULL = free */
    int block_size;
    struct ilist list;
    size_t n;
};

struct kvidx {
    pthread_rwlock_t lock;
    size_t max_blocks;
    struct kvb *v;
    size_t cap, used, entries;
    uint32_t free_head;
    uint32_t *be, *bk; /* bucket heads */
    size_t nb;         /* power of two */
    struct ilist lru;
    struct kvslot slots[KVIDX_MAX_SLOTS];
    size_t n_slots; /* high-water mark of used slot numbers */
    size_t live_slots;
    int16_t map[SLOT_MAP]; /* -1 empty, -2 deleted, else slot */
};

/* ---- hashing ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z ^= z >> 30;
    z *= 0xbf58476d1ce4e5b9ULL;
    z ^= z >> 27;
    z *= 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return z;
}

static uint64_t root_key(bool has_lora, uint64_t lora)
{
    return mix64(0x6d6f746f722d6b76ULL ^ (has_lora ? mix64(lora + 1) : 0));
}

static uint64_t chain_key(uint64_t parent, int bs, const uint32_t *t)
{
    uint64_t h = mix64(parent ^ ((uint64_t)bs * 0x9e3779b97f4a7c15ULL));
    for (int i = 0; i < bs; i++)
        h = mix64(h ^ ((uint64_t)t[i] + 0x632be59bd9b4e019ULL));
    return h;
}

static uint64_t bin_digest(const uint8_t *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    return mix64(h ^ n);
}

static uint64_t uint_digest(uint64_t u)
{
    return mix64(u ^ 0x5bd1e9955bd1e995ULL) + 1;
}

static size_t be_bucket(const struct kvidx *x, uint32_t slot, uint64_t eh)
{
    return (size_t)(mix64(eh ^ ((uint64_t)slot << 48)) & (x->nb - 1));
}

static size_t bk_bucket(const struct kvidx *x, uint64_t key)
{
    return (size_t)(mix64(key) & (x->nb - 1));
}

static size_t map_pos(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
    return (size_t)(mix64(h) % SLOT_MAP);
}

/* ---- lifecycle ---------------------------------------------------------------------- */

struct kvidx *kvidx_new(size_t max_blocks)
{
    struct kvidx *x = xcalloc(1, sizeof(*x));
    pthread_rwlock_init(&x->lock, NULL);
    x->max_blocks = max_blocks < 16 ? 16 : max_blocks;
    x->nb = 64;
    while (x->nb < x->max_blocks / 2)
        x->nb <<= 1;
    x->be = xmalloc(x->nb * sizeof(uint32_t));
    x->bk = xmalloc(x->nb * sizeof(uint32_t));
    for (size_t i = 0; i < x->nb; i++)
        x->be[i] = x->bk[i] = NIL;
    x->free_head = x->lru.head = x->lru.tail = NIL;
    for (size_t i = 0; i < SLOT_MAP; i++)
        x->map[i] = -1;
    return x;
}

void kvidx_free(struct kvidx *x)
{
    if (!x)
        return;
    for (size_t i = 0; i < x->n_slots; i++)
        free(x->slots[i].hostport);
    free(x->v);
    free(x->be);
    free(x->bk);
    pthread_rwlock_destroy(&x->lock);
    free(x);
}

/* ---- entries (write lock held) ------------------------------------------------------ */

static uint32_t find_e(const struct kvidx *x, uint32_t slot, uint64_t eh)
{
    for (uint32_t i = x->be[be_bucket(x, slot, eh)]; i != NIL; i = x->v[i].next_e)
        if (x->v[i].eh == eh && x->v[i].slot == slot)
            return i;
    return NIL;
}

static void chain_unlink(struct kvidx *x, uint32_t *head, uint32_t i, bool by_key)
{
    uint32_t *pp = head;
    while (*pp != NIL && *pp != i)
        pp = by_key ? &x->v[*pp].next_k : &x->v[*pp].next_e;
    if (*pp == i)
        *pp = by_key ? x->v[i].next_k : x->v[i].next_e;
}

/* The link of entry i at offset off (offsetof(struct kvb, lru) or sl). */
static struct ilink *ilink_of(struct kvidx *x, uint32_t i, size_t off)
{
    return (struct ilink *)((char *)&x->v[i] + off);
}

static void ilist_unlink(struct kvidx *x, struct ilist *l, uint32_t i, size_t off)
{
    struct ilink *k = ilink_of(x, i, off);
    if (k->prev != NIL)
        ilink_of(x, k->prev, off)->next = k->next;
    else
        l->head = k->next;
    if (k->next != NIL)
        ilink_of(x, k->next, off)->prev = k->prev;
    else
        l->tail = k->prev;
}

static void ilist_push(struct kvidx *x, struct ilist *l, uint32_t i, size_t off)
{
    struct ilink *k = ilink_of(x, i, off);
    k->prev = NIL;
    k->next = l->head;
    if (l->head != NIL)
        ilink_of(x, l->head, off)->prev = i;
    l->head = i;
    if (l->tail == NIL)
        l->tail = i;
}

#define LRU_OFF offsetof(struct kvb, lru)
#define SLOT_OFF offsetof(struct kvb, sl)

static void drop(struct kvidx *x, uint32_t i)
{
    struct kvb *b = &x->v[i];
    struct kvslot *s = &x->slots[b->slot];
    chain_unlink(x, &x->be[be_bucket(x, b->slot, b->eh)], i, false);
    chain_unlink(x, &x->bk[bk_bucket(x, b->key)], i, true);
    ilist_unlink(x, &x->lru, i, LRU_OFF);
    ilist_unlink(x, &s->list, i, SLOT_OFF);
    s->n--;
    b->slot = NIL;
    b->next_e = x->free_head;
    x->free_head = i;
    x->entries--;
}

static uint32_t alloc_entry(struct kvidx *x, struct kvidx_stats *st)
{
    if (x->entries >= x->max_blocks && x->lru.tail != NIL) {
        drop(x, x->lru.tail);
        st->evicted++;
    }
    if (x->free_head != NIL) {
        uint32_t i = x->free_head;
        x->free_head = x->v[i].next_e;
        return i;
    }
    if (x->used == x->cap) {
        size_t nc = x->cap ? x->cap * 2 : 1024;
        if (nc > x->max_blocks)
            nc = x->max_blocks;
        x->v = xrealloc(x->v, nc * sizeof(*x->v));
        x->cap = nc;
    }
    return (uint32_t)x->used++;
}

static void store(struct kvidx *x, uint32_t slot, uint64_t eh, uint64_t key, struct kvidx_stats *st)
{
    uint32_t i = find_e(x, slot, eh);
    if (i != NIL) {
        if (x->v[i].key != key) { /* same engine hash, other content: trust the engine */
            chain_unlink(x, &x->bk[bk_bucket(x, x->v[i].key)], i, true);
            x->v[i].key = key;
            size_t k = bk_bucket(x, key);
            x->v[i].next_k = x->bk[k];
            x->bk[k] = i;
        }
        struct ilist *sl = &x->slots[x->v[i].slot].list;
        ilist_unlink(x, &x->lru, i, LRU_OFF);
        ilist_push(x, &x->lru, i, LRU_OFF);
        ilist_unlink(x, sl, i, SLOT_OFF);
        ilist_push(x, sl, i, SLOT_OFF);
        st->stored++;
        return;
    }
    i = alloc_entry(x, st);
    struct kvb *b = &x->v[i];
    struct kvslot *s = &x->slots[slot];
    b->eh = eh;
    b->key = key;
    b->slot = slot;
    size_t e = be_bucket(x, slot, eh), k = bk_bucket(x, key);
    b->next_e = x->be[e];
    x->be[e] = i;
    b->next_k = x->bk[k];
    x->bk[k] = i;
    ilist_push(x, &x->lru, i, LRU_OFF);
    ilist_push(x, &s->list, i, SLOT_OFF);
    s->n++;
    x->entries++;
    st->stored++;
}

static void clear_locked(struct kvidx *x, int slot)
{
    while (x->slots[slot].list.head != NIL)
        drop(x, x->slots[slot].list.head);
}

/* ---- slots -------------------------------------------------------------------------- */

static int map_find(const struct kvidx *x, const char *hostport)
{
    size_t p = map_pos(hostport);
    for (size_t n = 0; n < SLOT_MAP; n++, p = (p + 1) % SLOT_MAP) {
        int v = x->map[p];
        if (v == -1)
            return -1;
        if (v >= 0 && strcmp(x->slots[v].hostport, hostport) == 0)
            return v;
    }
    return -1;
}

int kvidx_slot_get(struct kvidx *x, const char *hostport)
{
    pthread_rwlock_wrlock(&x->lock);
    int s = map_find(x, hostport);
    if (s >= 0)
        goto out;
    s = -ENOSPC;
    for (size_t i = 0; i < KVIDX_MAX_SLOTS; i++)
        if (!x->slots[i].hostport) {
            s = (int)i;
            break;
        }
    if (s < 0)
        goto out;
    x->slots[s] = (struct kvslot){.hostport = xstrdup(hostport), .list = {NIL, NIL}};
    if ((size_t)s >= x->n_slots)
        x->n_slots = (size_t)s + 1;
    x->live_slots++;
    size_t p = map_pos(hostport);
    while (x->map[p] >= 0)
        p = (p + 1) % SLOT_MAP;
    x->map[p] = (int16_t)s;
out:
    pthread_rwlock_unlock(&x->lock);
    return s;
}

static bool slot_ok(const struct kvidx *x, int slot)
{
    return slot >= 0 && slot < KVIDX_MAX_SLOTS && x->slots[slot].hostport;
}

void kvidx_slot_clear(struct kvidx *x, int slot)
{
    pthread_rwlock_wrlock(&x->lock);
    if (slot_ok(x, slot))
        clear_locked(x, slot);
    pthread_rwlock_unlock(&x->lock);
}

void kvidx_slot_remove(struct kvidx *x, int slot)
{
    pthread_rwlock_wrlock(&x->lock);
    if (slot_ok(x, slot)) {
        clear_locked(x, slot);
        size_t p = map_pos(x->slots[slot].hostport);
        for (size_t n = 0; n < SLOT_MAP; n++, p = (p + 1) % SLOT_MAP)
            if (x->map[p] == slot) {
                x->map[p] = -2;
                break;
            }
        free(x->slots[slot].hostport);
        x->slots[slot].hostport = NULL;
        x->live_slots--;
    }
    pthread_rwlock_unlock(&x->lock);
}

/* ---- decoding ----------------------------------------------------------------------- */

enum ev_kind { EV_UNKNOWN, EV_STORED, EV_REMOVED, EV_CLEARED };

struct ev {
    enum ev_kind kind;
    uint64_t *hashes;
    size_t n_hashes;
    bool has_parent;
    uint64_t parent;
    uint32_t *tokens;
    size_t n_tokens;
    int64_t block_size;
    bool has_lora;
    uint64_t lora;
    bool other_medium; /* a tier other than the GPU's (CPU offload): not routed on */
};

static void ev_release(struct ev *e)
{
    free(e->hashes);
    free(e->tokens);
    memset(e, 0, sizeof(*e));
}

static bool tag_is(const uint8_t *p, uint32_t n, const char *s)
{
    return n == strlen(s) && memcmp(p, s, n) == 0;
}

static int read_hash(struct msgpk_reader *r, uint64_t *out)
{
    struct msgpk_obj o;
    int rc = msgpk_read(r, &o);
    if (rc)
        return rc;
    if (o.type == MSGPK_BIN && o.v.s.len >= 1 && o.v.s.len <= 64) {
        *out = bin_digest(o.v.s.ptr, o.v.s.len);
        return 0;
    }
    if (o.type == MSGPK_UINT) {
        *out = uint_digest(o.v.u);
        return 0;
    }
    if (o.type == MSGPK_INT) {
        *out = uint_digest((uint64_t)o.v.i);
        return 0;
    }
    return -EBADMSG;
}

static int read_hashes(struct msgpk_reader *r, struct ev *e)
{
    uint32_t n;
    int rc = msgpk_read_array(r, &n);
    if (rc)
        return rc;
    if (n > MAX_HASHES)
        return -E2BIG;
    e->hashes = xmalloc((n ? n : 1) * sizeof(uint64_t));
    for (uint32_t i = 0; i < n; i++)
        if ((rc = read_hash(r, &e->hashes[i])))
            return rc;
    e->n_hashes = n;
    return 0;
}

static int read_tokens(struct msgpk_reader *r, struct ev *e)
{
    uint32_t n;
    int rc = msgpk_read_array(r, &n);
    if (rc)
        return rc;
    if (n > MAX_TOKENS)
        return -E2BIG;
    e->tokens = xmalloc((n ? n : 1) * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        uint64_t t;
        if ((rc = msgpk_read_u64(r, &t)))
            return rc;
        if (t > UINT32_MAX)
            return -ERANGE;
        e->tokens[i] = (uint32_t)t;
    }
    e->n_tokens = n;
    return 0;
}

static int read_parent(struct msgpk_reader *r, struct ev *e)
{
    if (msgpk_try_nil(r))
        return 0;
    e->has_parent = true;
    return read_hash(r, &e->parent);
}

static int read_lora(struct msgpk_reader *r, struct ev *e)
{
    if (msgpk_try_nil(r))
        return 0;
    int64_t v;
    int rc = msgpk_read_i64(r, &v);
    if (rc)
        return rc;
    e->has_lora = true;
    e->lora = (uint64_t)v;
    return 0;
}

static int read_medium(struct msgpk_reader *r, struct ev *e)
{
    if (msgpk_try_nil(r))
        return 0;
    const uint8_t *p;
    uint32_t n;
    int rc = msgpk_read_str(r, &p, &n);
    if (rc)
        return rc;
    e->other_medium = !tag_is(p, n, "GPU");
    return 0;
}

static enum ev_kind kind_of(const uint8_t *p, uint32_t n)
{
    if (tag_is(p, n, "BlockStored"))
        return EV_STORED;
    if (tag_is(p, n, "BlockRemoved"))
        return EV_REMOVED;
    if (tag_is(p, n, "AllBlocksCleared"))
        return EV_CLEARED;
    return EV_UNKNOWN;
}

/* array_like: [tag, fields in declaration order...]; trailing fields may be missing
 * (older vLLM has no medium / lora_name), extra ones are skipped. */
static int read_event_array(struct msgpk_reader *r, uint32_t n, struct ev *e)
{
    if (n == 0)
        return -EBADMSG;
    const uint8_t *tag;
    uint32_t tl;
    int rc = msgpk_read_str(r, &tag, &tl);
    if (rc)
        return rc;
    e->kind = kind_of(tag, tl);
    uint32_t f = 1;
    if (e->kind == EV_STORED) {
        if (n < 5)
            return -EBADMSG;
        if ((rc = read_hashes(r, e)) || (rc = read_parent(r, e)) || (rc = read_tokens(r, e)) ||
            (rc = msgpk_read_i64(r, &e->block_size)))
            return rc;
        f = 5;
        if (n > 5 && (rc = read_lora(r, e)))
            return rc;
        if (n > 6 && (rc = read_medium(r, e)))
            return rc;
        f = n > 7 ? 7 : n;
    } else if (e->kind == EV_REMOVED) {
        if (n < 2)
            return -EBADMSG;
        if ((rc = read_hashes(r, e)))
            return rc;
        f = 2;
        if (n > 2 && (rc = read_medium(r, e)))
            return rc;
        f = n > 3 ? 3 : n;
    }
    for (; f < n; f++)
        if ((rc = msgpk_skip(r)))
            return rc;
    return 0;
}

/* map encoding: {"type": tag, field: value...} in any order. */
static int read_event_map(struct msgpk_reader *r, uint32_t n, struct ev *e)
{
    bool have_bs = false;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *k;
        uint32_t kl;
        int rc = msgpk_read_str(r, &k, &kl);
        if (rc)
            return rc;
        if (tag_is(k, kl, "type")) {
            const uint8_t *tag;
            uint32_t tl;
            if ((rc = msgpk_read_str(r, &tag, &tl)))
                return rc;
            e->kind = kind_of(tag, tl);
        } else if (tag_is(k, kl, "block_hashes") && !e->hashes) {
            rc = read_hashes(r, e);
        } else if (tag_is(k, kl, "parent_block_hash") && !e->has_parent) {
            rc = read_parent(r, e);
        } else if (tag_is(k, kl, "token_ids") && !e->tokens) {
            rc = read_tokens(r, e);
        } else if (tag_is(k, kl, "block_size")) {
            rc = msgpk_read_i64(r, &e->block_size);
            have_bs = true;
        } else if (tag_is(k, kl, "lora_id") && !e->has_lora) {
            rc = read_lora(r, e);
        } else if (tag_is(k, kl, "medium")) {
            rc = read_medium(r, e);
        } else {
            rc = msgpk_skip(r);
        }
        if (rc)
            return rc;
    }
    if (e->kind == EV_STORED && (!e->hashes || !e->tokens || !have_bs))
        return -EBADMSG;
    if (e->kind == EV_REMOVED && !e->hashes)
        return -EBADMSG;
    return 0;
}

static void apply_event(struct kvidx *x, uint32_t slot, const struct ev *e, struct kvidx_stats *st)
{
    struct kvslot *s = &x->slots[slot];
    switch (e->kind) {
    case EV_STORED: {
        if (e->other_medium)
            return;
        if (e->block_size < 1 || e->block_size > KVIDX_MAX_BLOCK_SIZE ||
            e->n_tokens != e->n_hashes * (size_t)e->block_size) {
            st->bad++;
            return;
        }
        int bs = (int)e->block_size;
        uint64_t key = root_key(e->has_lora, e->lora);
        if (e->has_parent) {
            uint32_t p = find_e(x, slot, e->parent);
            if (p == NIL) {
                st->unkeyed += e->n_hashes;
                return;
            }
            key = x->v[p].key;
        }
        if (s->block_size != bs) {
            if (s->block_size)
                clear_locked(x, (int)slot); /* keys of another block size never match */
            s->block_size = bs;
        }
        for (size_t i = 0; i < e->n_hashes; i++) {
            key = chain_key(key, bs, e->tokens + i * (size_t)bs);
            store(x, slot, e->hashes[i], key, st);
        }
        return;
    }
    case EV_REMOVED:
        if (e->other_medium)
            return;
        for (size_t i = 0; i < e->n_hashes; i++) {
            uint32_t j = find_e(x, slot, e->hashes[i]);
            if (j != NIL) {
                drop(x, j);
                st->removed++;
            }
        }
        return;
    case EV_CLEARED:
        clear_locked(x, (int)slot);
        st->cleared++;
        return;
    case EV_UNKNOWN:
        return; /* an event type of a newer engine: nothing the index needs */
    }
}

/* A batch's events, decoded before the index is locked (the workers' lookups wait only
 * for the applying, not for the msgpack). */
struct evlist {
    struct ev *v;
    size_t n, cap;
};

static void evlist_release(struct evlist *l)
{
    for (size_t i = 0; i < l->n; i++)
        ev_release(&l->v[i]);
    free(l->v);
}

static int read_events(struct msgpk_reader *r, struct evlist *l)
{
    uint32_t n;
    int rc = msgpk_read_array(r, &n);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < n; i++) {
        struct msgpk_obj o;
        struct ev e = {0};
        if ((rc = msgpk_read(r, &o)))
            return rc;
        if (o.type == MSGPK_ARRAY)
            rc = read_event_array(r, o.v.n, &e);
        else if (o.type == MSGPK_MAP)
            rc = read_event_map(r, o.v.n, &e);
        else
            rc = -EBADMSG;
        if (rc) {
            ev_release(&e);
            return rc;
        }
        if (l->n == l->cap) {
            l->cap = l->cap ? l->cap * 2 : 8;
            l->v = xrealloc(l->v, l->cap * sizeof(*l->v));
        }
        l->v[l->n++] = e;
    }
    return 0;
}

static int read_rank(struct msgpk_reader *r, int *dp_rank)
{
    if (msgpk_try_nil(r))
        return 0;
    int64_t v;
    int rc = msgpk_read_i64(r, &v);
    if (rc)
        return rc;
    if (dp_rank && v >= 0 && v <= 65535)
        *dp_rank = (int)v;
    return 0;
}

int kvidx_apply(struct kvidx *x, int slot, const void *payload, size_t len, struct kvidx_stats *st,
                int *dp_rank)
{
    if (dp_rank)
        *dp_rank = -1;
    struct msgpk_reader r;
    msgpk_reader_init(&r, payload, len, 8, MAX_TOKENS);
    struct evlist l = {0};
    struct msgpk_obj o;
    int rc = msgpk_read(&r, &o);
    if (rc)
        goto decoded;
    if (o.type == MSGPK_ARRAY) {
        /* [ts, events, data_parallel_rank?] */
        double ts;
        if (o.v.n < 2)
            rc = -EBADMSG;
        else if (!(rc = msgpk_read_double(&r, &ts)) && !(rc = read_events(&r, &l)) && o.v.n > 2)
            rc = read_rank(&r, dp_rank);
    } else if (o.type == MSGPK_MAP) {
        bool events = false;
        for (uint32_t i = 0; i < o.v.n && !rc; i++) {
            const uint8_t *k;
            uint32_t kl;
            if ((rc = msgpk_read_str(&r, &k, &kl)))
                break;
            if (tag_is(k, kl, "events") && !events) {
                events = true;
                rc = read_events(&r, &l);
            } else if (tag_is(k, kl, "data_parallel_rank")) {
                rc = read_rank(&r, dp_rank);
            } else {
                rc = msgpk_skip(&r);
            }
        }
        if (!rc && !events)
            rc = -EBADMSG;
    } else {
        rc = -EBADMSG;
    }
decoded:
    pthread_rwlock_wrlock(&x->lock);
    if (!slot_ok(x, slot)) {
        rc = -ENOENT;
    } else {
        /* The events before an error are applied (each one whole). */
        for (size_t i = 0; i < l.n; i++)
            apply_event(x, (uint32_t)slot, &l.v[i], st);
        if (rc)
            st->bad++;
    }
    pthread_rwlock_unlock(&x->lock);
    evlist_release(&l);
    return rc;
}

/* ---- queries ------------------------------------------------------------------------ */

size_t kvidx_keys(const uint32_t *tokens, size_t n, int block_size, uint64_t *out, size_t cap)
{
    if (block_size < 1 || block_size > KVIDX_MAX_BLOCK_SIZE)
        return 0;
    size_t nb = n / (size_t)block_size;
    if (nb > cap)
        nb = cap;
    uint64_t key = root_key(false, 0);
    for (size_t i = 0; i < nb; i++) {
        key = chain_key(key, block_size, tokens + i * (size_t)block_size);
        out[i] = key;
    }
    return nb;
}

int kvidx_block_size(struct kvidx *x, const char *hostport)
{
    pthread_rwlock_rdlock(&x->lock);
    int s = map_find(x, hostport);
    int bs = s >= 0 ? x->slots[s].block_size : 0;
    pthread_rwlock_unlock(&x->lock);
    return bs;
}

#define MATCH_MAX 256 /* candidates scored at once (beyond: 0) */

void kvidx_match(struct kvidx *x, const uint64_t *keys, size_t n, int block_size,
                 const char *const *hostports, size_t m, uint32_t *blocks_out)
{
    int slot_of[MATCH_MAX];
    memset(blocks_out, 0, m * sizeof(*blocks_out));
    if (m > MATCH_MAX)
        m = MATCH_MAX;
    pthread_rwlock_rdlock(&x->lock);
    size_t live = 0;
    for (size_t j = 0; j < m; j++) {
        int s = map_find(x, hostports[j]);
        slot_of[j] = s >= 0 && x->slots[s].block_size == block_size ? s : -1;
        live += slot_of[j] >= 0;
    }
    for (size_t i = 0; i < n && live; i++) {
        bool advanced = false;
        for (uint32_t e = x->bk[bk_bucket(x, keys[i])]; e != NIL; e = x->v[e].next_k) {
            if (x->v[e].key != keys[i])
                continue;
            for (size_t j = 0; j < m; j++)
                if (slot_of[j] == (int)x->v[e].slot && blocks_out[j] == i) {
                    blocks_out[j] = (uint32_t)i + 1;
                    advanced = true;
                }
        }
        if (!advanced)
            break;
    }
    pthread_rwlock_unlock(&x->lock);
}

void kvidx_info(struct kvidx *x, struct kvidx_info *out)
{
    pthread_rwlock_rdlock(&x->lock);
    out->entries = x->entries;
    out->max_blocks = x->max_blocks;
    out->slots = x->live_slots;
    out->bytes = sizeof(*x) + x->cap * sizeof(struct kvb) + 2 * x->nb * sizeof(uint32_t);
    pthread_rwlock_unlock(&x->lock);
}

size_t kvidx_slot_entries(struct kvidx *x, int slot)
{
    pthread_rwlock_rdlock(&x->lock);
    size_t n = slot_ok(x, slot) ? x->slots[slot].n : 0;
    pthread_rwlock_unlock(&x->lock);
    return n;
}

/* ---- approximate prefixes ---------------------------------------------------------- */

void kvidx_learn(struct kvidx *x, const char *hostport, const uint64_t *keys, size_t n,
                 int block_size, size_t slot_cap, struct kvidx_stats *st)
{
    int slot = kvidx_slot_get(x, hostport);
    if (slot < 0 || n == 0)
        return;
    pthread_rwlock_wrlock(&x->lock);
    struct kvslot *s = &x->slots[slot];
    if (s->hostport) {
        if (s->block_size != block_size) {
            clear_locked(x, slot);
            s->block_size = block_size;
        }
        /* The head last: it is the most shared part, the last to be forgotten. */
        for (size_t i = n; i-- > 0;)
            store(x, (uint32_t)slot, keys[i], keys[i], st);
        while (slot_cap && s->n > slot_cap) {
            drop(x, s->list.tail);
            st->evicted++;
        }
    }
    pthread_rwlock_unlock(&x->lock);
}

size_t kvidx_text_keys(const char *text, size_t len, uint64_t *out, size_t cap)
{
    size_t nb = len / KVIDX_TEXT_CHUNK;
    if (nb > cap)
        nb = cap;
    uint64_t key = root_key(true, UINT64_MAX); /* apart from every token chain */
    uint32_t chunk[KVIDX_TEXT_CHUNK];
    for (size_t i = 0; i < nb; i++) {
        for (size_t j = 0; j < KVIDX_TEXT_CHUNK; j++)
            chunk[j] = (uint8_t)text[i * KVIDX_TEXT_CHUNK + j];
        key = chain_key(key, KVIDX_TEXT_CHUNK, chunk);
        out[i] = key;
    }
    return nb;
}

void kvidx_retain(struct kvidx *x, const char *const *hostports, size_t n)
{
    for (size_t i = 0; i < KVIDX_MAX_SLOTS; i++) {
        pthread_rwlock_rdlock(&x->lock);
        const char *hp = x->slots[i].hostport;
        bool keep = !hp;
        for (size_t j = 0; hp && !keep && j < n; j++)
            keep = strcmp(hp, hostports[j]) == 0;
        pthread_rwlock_unlock(&x->lock);
        if (!keep)
            kvidx_slot_remove(x, (int)i);
    }
}

int kvidx_slot_find(struct kvidx *x, const char *hostport)
{
    pthread_rwlock_rdlock(&x->lock);
    int s = map_find(x, hostport);
    pthread_rwlock_unlock(&x->lock);
    return s;
}
