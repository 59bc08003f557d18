/* sim_cache — the simulated engine's prefix cache: fixed-size KV blocks, content-hashed
 * like vLLM's, with LRU eviction of unreferenced blocks and a fixed capacity.
 *
 * Block hashes are vLLM's sha256_cbor rule exactly (vllm/v1/core/kv_cache_utils.py):
 *   hash(block) = sha256(CBOR canonical encoding of (parent_hash, tuple(token_ids), None))
 *   where parent_hash is the previous block's hash, and for the first block NONE_HASH =
 *   sha256(CBOR(text string $PYTHONHASHSEED)) — or 32 random bytes when PYTHONHASHSEED
 *   is unset (as vLLM: not reproducible across processes then).
 * Only full blocks are cached. A request (a sequence) pins the blocks it uses; pinned
 * blocks are never evicted; an unpinned block stays cached until the capacity is needed
 * (least recently used first). Events (stored, removed, cleared) go to a callback, in
 * the order they happen — what the KV-event publisher batches.
 *
 * Not thread-safe (one reactor thread). */
#ifndef MOTOR_SIM_CACHE_H
#define MOTOR_SIM_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_CACHE_HASH_LEN 32
#define SIM_CACHE_MAX_BLOCK_SIZE 1024

enum sim_cache_ev { SIM_CACHE_STORED, SIM_CACHE_REMOVED, SIM_CACHE_CLEARED };

struct sim_cache_event {
    enum sim_cache_ev kind;
    const uint8_t *hash;   /* STORED/REMOVED: the block */
    const uint8_t *parent; /* STORED: the previous block, NULL for the first */
    const int32_t *tokens; /* STORED: the block's block_size token ids */
    int block_size;
};

typedef void (*sim_cache_event_cb)(void *arg, const struct sim_cache_event *ev);

struct sim_cache;

/* What one sequence (a prompt and its generated tokens) holds. Caller storage; init with
 * sim_cache_seq_init, end with sim_cache_end. */
struct sim_cache_seq {
    uint8_t last[SIM_CACHE_HASH_LEN]; /* hash of the last full block */
    bool has_last;
    bool broken;      /* the cache was full of pinned blocks: caching stopped here */
    uint32_t *pins;   /* block slots pinned */
    size_t n_pins, cap_pins;
    int32_t *pending; /* tokens of the partial block */
    size_t n_pending;
};

/* num_blocks > 0, 1 <= block_size <= SIM_CACHE_MAX_BLOCK_SIZE. cb may be NULL. */
struct sim_cache *sim_cache_new(size_t num_blocks, int block_size,
                                const uint8_t none_hash[SIM_CACHE_HASH_LEN], sim_cache_event_cb cb,
                                void *arg);
void sim_cache_free(struct sim_cache *c);

/* NONE_HASH as vLLM computes it: from seed (PYTHONHASHSEED) when not NULL, else random. */
void sim_cache_none_hash(const char *seed, uint8_t out[SIM_CACHE_HASH_LEN]);
/* vLLM's hash of one block (parent NULL = NONE_HASH of the cache). */
void sim_cache_block_hash(const uint8_t parent[SIM_CACHE_HASH_LEN], const int32_t *tokens,
                          int block_size, uint8_t out[SIM_CACHE_HASH_LEN]);

void sim_cache_seq_init(struct sim_cache_seq *q);
/* Start a sequence with its prompt: pins every full block (storing the missing ones) and
 * returns how many leading prompt tokens were already cached (whole blocks). Counted in
 * the query/hit statistics when count_stats. */
size_t sim_cache_begin(struct sim_cache *c, struct sim_cache_seq *q, const int32_t *ids, size_t n,
                       bool count_stats);
/* One more token of the sequence (a generated one): a completed block is stored. */
void sim_cache_append(struct sim_cache *c, struct sim_cache_seq *q, int32_t id);
/* Unpin the sequence's blocks (they stay cached) and free its memory. */
void sim_cache_end(struct sim_cache *c, struct sim_cache_seq *q);
/* Drop every cached block (AllBlocksCleared). -EBUSY while blocks are pinned. */
int sim_cache_reset(struct sim_cache *c);

struct sim_cache_stats {
    size_t capacity, cached, pinned;
    uint64_t queries, hits; /* prompt tokens looked up / found cached */
    uint64_t stored, evicted;
};
void sim_cache_get_stats(const struct sim_cache *c, struct sim_cache_stats *out);
int sim_cache_block_size(const struct sim_cache *c);

#endif
