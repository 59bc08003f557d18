/* kvidx — the coordinator's KV-cache index: which engine endpoint holds which prompt
 * prefix, fed by the engines' KV events (vLLM's KVEventBatch: BlockStored, BlockRemoved,
 * AllBlocksCleared; SGLang publishes the same wire), queried per request with the
 * prompt's token ids.
 *
 * Keys: the engine's block hash cannot be recomputed here — vLLM seeds its chain with
 * NONE_HASH, random per process unless PYTHONHASHSEED is set, and the algorithm is a
 * flag (sha256, sha256_cbor, builtin). But every BlockStored carries the blocks' token
 * ids and the parent's hash, so the index computes its own chain key per block,
 *   key(block i) = H(key(block i-1), block_size, token ids of block i)  (root: H(lora_id))
 * and remembers, per endpoint, engine hash -> key. A prompt's keys are computed the same
 * way from its token ids (kvidx_keys): the content rule is vLLM's exactly (full blocks
 * only, each block's identity its whole prefix), whatever the seed or hash algorithm.
 * An event whose parent hash is unknown here (its parent was evicted from the index, or
 * its events lost) cannot be keyed and is counted, not guessed.
 *
 * Memory: at most max_blocks (endpoint, block) entries, allocated as they are needed;
 * beyond it the least recently stored entry is forgotten (a cache hit the router then
 * misses, never a wrong one). The hash tables are sized once from max_blocks.
 *
 * Slots: one per engine endpoint (one DP rank) whose events are applied, named by the
 * endpoint's business "ip:port" (what the balancer knows an endpoint by).
 *
 * Threads: writers (slot changes, batches) take the write lock, kvidx_match the read
 * lock: events come from the management reactor, queries from any worker. */
#ifndef MOTOR_KVIDX_H
#define MOTOR_KVIDX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVIDX_MAX_BLOCK_SIZE 4096
#define KVIDX_MAX_SLOTS 4096

struct kvidx;

/* max_blocks: entries at most (>= 16). Never NULL (aborts on OOM). */
struct kvidx *kvidx_new(size_t max_blocks);
void kvidx_free(struct kvidx *x); /* NULL-safe */

/* The slot of hostport, created empty when absent. Slot numbers are reused after
 * kvidx_slot_remove. -ENOSPC beyond KVIDX_MAX_SLOTS. */
int kvidx_slot_get(struct kvidx *x, const char *hostport);
/* Forget every block of a slot (AllBlocksCleared, an engine restart, lost events). */
void kvidx_slot_clear(struct kvidx *x, int slot);
/* Clear and free the slot (its endpoint left the table). */
void kvidx_slot_remove(struct kvidx *x, int slot);

/* What one batch did (summed into the caller's counters). */
struct kvidx_stats {
    uint64_t stored, removed, cleared; /* blocks stored / removed, clear events */
    uint64_t unkeyed; /* blocks of a BlockStored whose parent the index does not know */
    uint64_t evicted; /* entries forgotten for max_blocks */
    uint64_t bad;     /* events refused (malformed, inconsistent) */
};

/* Decode one msgpack KVEventBatch (array_like or map encoding) and apply it to slot.
 * 0, or a negative errno when the payload is not a KVEventBatch (-EBADMSG, -ENODATA,
 * -E2BIG...): events before the error stay applied (each event is applied whole or not
 * at all). dp_rank: the batch's data_parallel_rank when present (else -1). */
int kvidx_apply(struct kvidx *x, int slot, const void *payload, size_t len, struct kvidx_stats *st,
                int *dp_rank);

/* The chain keys of a token sequence: one per full block, at most cap. Pure. */
size_t kvidx_keys(const uint32_t *tokens, size_t n, int block_size, uint64_t *out, size_t cap);

/* The block size a slot's engine reported (0 = none seen yet). */
int kvidx_block_size(struct kvidx *x, const char *hostport);

/* Longest cached prefix, in blocks, of keys[0..n) on each of hostports[0..m) (0 for an
 * endpoint the index has no slot for, or whose block size is not block_size). */
void kvidx_match(struct kvidx *x, const uint64_t *keys, size_t n, int block_size,
                 const char *const *hostports, size_t m, uint32_t *blocks_out);

struct kvidx_info {
    size_t entries, max_blocks, slots;
    size_t bytes; /* memory held by the index */
};
void kvidx_info(struct kvidx *x, struct kvidx_info *out);
/* Entries of one slot (tests, /instances). */
size_t kvidx_slot_entries(struct kvidx *x, int slot);
int kvidx_slot_find(struct kvidx *x, const char *hostport); /* -1 when none */

/* ---- approximate prefixes (no engine events) ------------------------------------
 * For engines that publish nothing, the index remembers what the coordinator sent
 * where, SGLang-router style: a request's prompt text cut in KVIDX_TEXT_CHUNK-byte
 * chunks, chained like blocks (a trie with chunk-sized edges: a chunk's key is its
 * whole prefix), learned by the endpoint it was routed to. Each endpoint keeps at most
 * slot_cap chunks, the least recently routed forgotten first (what an engine's LRU
 * cache would have dropped); max_blocks still bounds the whole. */
#define KVIDX_TEXT_CHUNK 64
/* Keys of text's full chunks, at most cap. Pure. */
size_t kvidx_text_keys(const char *text, size_t len, uint64_t *out, size_t cap);
/* Record that hostport was sent keys[0..n) (created as a slot when new). */
void kvidx_learn(struct kvidx *x, const char *hostport, const uint64_t *keys, size_t n,
                 int block_size, size_t slot_cap, struct kvidx_stats *st);
/* Remove every slot whose name is not in hostports[0..n) (endpoints that left). */
void kvidx_retain(struct kvidx *x, const char *const *hostports, size_t n);

#endif
