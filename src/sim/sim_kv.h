/* sim_kv — the prefill engine's table of KV "tickets" awaiting their decode leg.
 *
 * A prefill leg stores a ticket (its block ids, the prompt hash, an expiry); the decode
 * engine later takes it over HTTP, which consumes it, like a KV connector pulling
 * blocks. The table is bounded: when full, the oldest ticket is evicted (as a KV cache
 * evicts unreferenced blocks), and tickets expire after a TTL.
 *
 * Time is passed in (monotonic ms) so the table is testable. Not thread-safe. */
#ifndef MOTOR_SIM_KV_H
#define MOTOR_SIM_KV_H

#include <stddef.h>
#include <stdint.h>

#define SIM_KV_BLOCK_TOKENS 16 /* tokens per simulated KV block */
#define SIM_KV_MAX_BLOCKS 256  /* block ids handed out per ticket */

struct sim_kv;

struct sim_kv_ticket {
    int64_t first_block; /* the ticket's key: block ids are first_block .. + n_blocks - 1 */
    int n_blocks;
    uint64_t prompt_hash;
    int prompt_tokens;
    int64_t expires_ms;
};

/* capacity: tickets kept at most (> 0); ttl_ms: lifetime; first_block: the first block id
 * handed out (ids then increase, never reused within a table). */
struct sim_kv *sim_kv_new(size_t capacity, int64_t ttl_ms, int64_t first_block);
void sim_kv_free(struct sim_kv *kv);

/* Store a ticket for a prefilled prompt; fills *out (block ids allocated). Returns the
 * number of tickets evicted to make room (0 or 1). */
int sim_kv_put(struct sim_kv *kv, uint64_t prompt_hash, int prompt_tokens, int64_t now_ms,
               struct sim_kv_ticket *out);
/* Take (and remove) the ticket whose first block id is first_block. 0, or -ENOENT when
 * unknown, already taken or expired. */
int sim_kv_take(struct sim_kv *kv, int64_t first_block, int64_t now_ms, struct sim_kv_ticket *out);
/* Drop expired tickets; returns how many. */
size_t sim_kv_expire(struct sim_kv *kv, int64_t now_ms);
/* Live tickets (expired ones not yet swept included). */
size_t sim_kv_count(const struct sim_kv *kv);

#endif
