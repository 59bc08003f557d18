/* sim_kvev — KV-cache events published the way vLLM's ZmqEventPublisher does
 * (vllm/distributed/kv_events.py), fed by sim_cache's events.
 *
 * --kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
 *   "endpoint": "tcp://" "*:5557" (one string), "replay_endpoint": ..., "buffer_steps": 10000,
 *   "hwm": 100000, "max_queue_size": 100000, "topic": ""}'  (vLLM's keys and defaults;
 * publisher defaults to "zmq" when enabled, "null" publishes nothing). Each DP rank
 * offsets both endpoints' ports by its rank (rank 0 keeps them), as vLLM's
 * offset_endpoint_port. An endpoint with "*" or "::" binds, any other connects.
 *
 * Wire: PUB multipart [topic, seq (8 bytes big-endian, from 0 per process), payload];
 * payload = msgpack KVEventBatch, one per loop iteration that produced events (vLLM:
 * one per scheduler step). Encoding "array" (msgspec array_like, the default of released
 * vLLM): [ts, [event...], data_parallel_rank] with
 *   ["BlockStored", [hash...], parent_hash|nil, [token_id...], block_size, lora_id=nil,
 *    medium="GPU", lora_name=nil]
 *   ["BlockRemoved", [hash...], medium="GPU"]
 *   ["AllBlocksCleared"]
 * or "map" (msgspec structs as maps, tag field "type"): {"ts", "events", 
 * "data_parallel_rank"} with {"type": "BlockStored", "block_hashes", ...}. A hash is the
 * 32-byte block hash as bin, or — with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 — its low
 * 64 bits as an unsigned integer (vLLM's maybe_convert_block_hash).
 * Replay (ROUTER at replay_endpoint): a DEALER/REQ sends ["", start_seq (8 bytes)]; the
 * engine answers ["", seq, payload] for every buffered batch with seq >= start_seq, then
 * ["", -1 (8 bytes), ""]. The buffer keeps the last buffer_steps batches (and at most
 * 64 MiB). At start the engine publishes one AllBlocksCleared batch (seq 0): a
 * subscriber replaying from 0 after a restart learns that the cache is empty.
 *
 * Reactor thread only. */
#ifndef MOTOR_SIM_KVEV_H
#define MOTOR_SIM_KVEV_H

#include "common/reactor.h"
#include "sim/sim_cache.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sim_kvev_config {
    bool enabled;
    char *publisher;       /* "zmq" | "null" */
    char *endpoint;        /* default: vLLM's, port 5557 on every interface */
    char *replay_endpoint; /* NULL = none */
    int buffer_steps;      /* 10000 */
    int hwm;               /* 100000 */
    int max_queue_size;    /* 100000 (accepted) */
    char *topic;           /* "" */
};

/* Parse the --kv-events-config JSON (unknown keys refused, as vLLM's config class
 * does). 0, or -EINVAL with a message. */
int sim_kvev_parse_config(const char *json, struct sim_kvev_config *out, char *err, size_t cap);
void sim_kvev_config_release(struct sim_kvev_config *c);
/* vLLM's offset_endpoint_port: "tcp://host:P" -> "tcp://host:P+rank" (heap). */
char *sim_kvev_offset_endpoint(const char *endpoint, int rank);

struct sim_kvev_opts {
    int dp_rank;
    bool int_hashes;   /* VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES */
    bool map_encoding; /* --kv-events-encoding map */
};

struct sim_kvev;

/* NULL when not enabled (or publisher "null"); NULL with *failed set when a socket
 * could not be set up (logged). */
struct sim_kvev *sim_kvev_start(struct reactor *r, const struct sim_kvev_config *cfg,
                                const struct sim_kvev_opts *o, bool *failed);
void sim_kvev_free(struct sim_kvev *k);
/* sim_cache's event callback (arg = the sim_kvev). Events are batched and published at
 * the end of the loop iteration. */
void sim_kvev_on_cache_event(void *arg, const struct sim_cache_event *ev);
/* Publish what is pending now (tests, shutdown). */
void sim_kvev_flush(struct sim_kvev *k);

struct sim_kvev_stats {
    uint64_t next_seq, batches, events, replays, replayed;
    uint16_t port, replay_port;
};
void sim_kvev_get_stats(const struct sim_kvev *k, struct sim_kvev_stats *out);

/* Encode one batch (tests): events as sim_cache reports them. Appends to *out/len. */
struct strbuf;
int sim_kvev_encode(const struct sim_cache_event *evs, size_t n, double ts, int dp_rank,
                    bool int_hashes, bool map_encoding, struct strbuf *out);

#endif
