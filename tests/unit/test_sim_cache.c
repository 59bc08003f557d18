/* sim_cache and sim_kvev: vLLM's block hashes (reference values computed with hashlib
 * and an independent CBOR encoder), hits, pins, LRU eviction order, capacity full of
 * pinned blocks, reset, the event stream; KV-event batch encoding (array and map forms,
 * bin and int hashes, grouping of chained blocks), the config parser and vLLM's DP port
 * offset. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/msgpk.h"
#include "common/strbuf.h"
#include "sim/sim_cache.h"
#include "sim/sim_kvev.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < SIM_CACHE_HASH_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_vllm_hashes(void **state)
{
    uint8_t none[SIM_CACHE_HASH_LEN], h1[SIM_CACHE_HASH_LEN], h2[SIM_CACHE_HASH_LEN];
    char t[65];
    sim_cache_none_hash("0", none);
    hex(none, t);
    assert_string_equal(t, "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
    const int32_t toks[] = {1, 2, 3, 4, 5, 6, 7, 8};
    sim_cache_block_hash(none, toks, 4, h1);
    hex(h1, t);
    assert_string_equal(t, "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb");
    sim_cache_block_hash(h1, toks + 4, 4, h2);
    hex(h2, t);
    assert_string_equal(t, "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6");
    /* every CBOR integer width */
    const int32_t wide[] = {70000, 300, 65536, (int32_t)4294967295u};
    sim_cache_none_hash("42", none);
    sim_cache_block_hash(none, wide, 4, h1);
    hex(h1, t);
    assert_string_equal(t, "8ef95272ca6ac1e7cf7793551306fbbf3e2a5fe694d32d546ad3ff2ee31b9a89");
    /* no seed: random, and two are different */
    sim_cache_none_hash(NULL, h1);
    sim_cache_none_hash(NULL, h2);
    assert_memory_not_equal(h1, h2, SIM_CACHE_HASH_LEN);
}

struct evlog {
    int stored, removed, cleared;
    uint8_t last_removed[SIM_CACHE_HASH_LEN];
    bool stored_with_parent;
};

static void on_ev(void *arg, const struct sim_cache_event *ev)
{
    struct evlog *l = arg;
    if (ev->kind == SIM_CACHE_STORED) {
        l->stored++;
        l->stored_with_parent = ev->parent != NULL;
    } else if (ev->kind == SIM_CACHE_REMOVED) {
        l->removed++;
        memcpy(l->last_removed, ev->hash, SIM_CACHE_HASH_LEN);
    } else {
        l->cleared++;
    }
}

static void test_hits_pins_eviction(void **state)
{
    uint8_t none[SIM_CACHE_HASH_LEN];
    sim_cache_none_hash("0", none);
    struct evlog l = {0};
    struct sim_cache *c = sim_cache_new(4, 4, none, on_ev, &l);
    int32_t a[10], b[8], x[8];
    for (int i = 0; i < 10; i++)
        a[i] = 100 + i;
    for (int i = 0; i < 8; i++) {
        b[i] = 200 + i;
        x[i] = 300 + i;
    }
    struct sim_cache_seq qa, qb, qx;
    sim_cache_seq_init(&qa);
    assert_int_equal(sim_cache_begin(c, &qa, a, 10, true), 0); /* 2 full blocks + 2 pending */
    assert_int_equal(l.stored, 2);
    sim_cache_append(c, &qa, 1);
    sim_cache_append(c, &qa, 2); /* completes block 3 */
    assert_int_equal(l.stored, 3);
    assert_true(l.stored_with_parent);
    struct sim_cache_stats st;
    sim_cache_get_stats(c, &st);
    assert_int_equal(st.pinned, 3);
    /* a second sequence of the same prompt: hits, no new blocks */
    sim_cache_seq_init(&qb);
    assert_int_equal(sim_cache_begin(c, &qb, a, 10, true), 8);
    assert_int_equal(l.stored, 3);
    sim_cache_end(c, &qb);
    sim_cache_end(c, &qa);
    sim_cache_get_stats(c, &st);
    assert_int_equal(st.pinned, 0);
    assert_int_equal(st.cached, 3);
    assert_true(st.queries == 20 && st.hits == 8);
    /* b needs 2 blocks, 1 free: evicts a's least recently used block (its tail) */
    sim_cache_seq_init(&qb);
    sim_cache_begin(c, &qb, b, 8, true);
    assert_int_equal(l.removed, 1);
    uint8_t tail[SIM_CACHE_HASH_LEN], h[SIM_CACHE_HASH_LEN];
    sim_cache_block_hash(none, a, 4, h);
    sim_cache_block_hash(h, a + 4, 4, h);
    const int32_t third[] = {108, 109, 1, 2};
    sim_cache_block_hash(h, third, 4, tail);
    assert_memory_equal(l.last_removed, tail, SIM_CACHE_HASH_LEN);
    /* every block pinned (b holds 2, and x pins 2 more): x's later blocks are not cached */
    sim_cache_seq_init(&qx);
    sim_cache_begin(c, &qx, x, 8, false);
    sim_cache_get_stats(c, &st);
    assert_int_equal(st.pinned, 4);
    assert_int_equal(sim_cache_reset(c), -EBUSY);
    struct sim_cache_seq qy;
    sim_cache_seq_init(&qy);
    int32_t y[4] = {9, 9, 9, 9};
    sim_cache_begin(c, &qy, y, 4, false);
    assert_true(qy.broken);
    sim_cache_get_stats(c, &st);
    assert_int_equal(st.cached, 4);
    sim_cache_end(c, &qy);
    sim_cache_end(c, &qx);
    sim_cache_end(c, &qb);
    assert_int_equal(sim_cache_reset(c), 0);
    assert_int_equal(l.cleared, 1);
    sim_cache_get_stats(c, &st);
    assert_int_equal(st.cached, 0);
    /* usable again after the reset */
    sim_cache_seq_init(&qa);
    assert_int_equal(sim_cache_begin(c, &qa, a, 8, true), 0);
    sim_cache_end(c, &qa);
    sim_cache_free(c);
    assert_null(sim_cache_new(0, 16, none, NULL, NULL));
    assert_null(sim_cache_new(4, 0, none, NULL, NULL));
}

static void test_kvev_encode(void **state)
{
    uint8_t h1[SIM_CACHE_HASH_LEN], h2[SIM_CACHE_HASH_LEN], h3[SIM_CACHE_HASH_LEN];
    memset(h1, 1, sizeof(h1));
    memset(h2, 2, sizeof(h2));
    memset(h3, 3, sizeof(h3));
    h3[31] = 7;
    int32_t t1[2] = {5, 6}, t2[2] = {7, 8};
    struct sim_cache_event evs[] = {
        {.kind = SIM_CACHE_STORED, .hash = h1, .parent = NULL, .tokens = t1, .block_size = 2},
        {.kind = SIM_CACHE_STORED, .hash = h2, .parent = h1, .tokens = t2, .block_size = 2},
        {.kind = SIM_CACHE_REMOVED, .hash = h3},
        {.kind = SIM_CACHE_REMOVED, .hash = h1},
        {.kind = SIM_CACHE_CLEARED},
    };
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    assert_int_equal(sim_kvev_encode(evs, 5, 1.5, 2, false, false, &sb), 0);
    struct msgpk_reader r;
    msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
    uint32_t n;
    double ts;
    const uint8_t *p;
    uint32_t len;
    uint64_t u;
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(msgpk_read_double(&r, &ts), 0);
    assert_true(ts == 1.5);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 3); /* chained stores grouped, removals grouped, cleared */
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 8);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "BlockStored", 11);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(msgpk_read_bin(&r, &p, &len), 0);
    assert_int_equal(len, 32);
    assert_memory_equal(p, h1, 32);
    assert_int_equal(msgpk_read_bin(&r, &p, &len), 0);
    assert_memory_equal(p, h2, 32);
    assert_int_equal(msgpk_read_nil(&r), 0); /* parent of the first */
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(msgpk_read_u64(&r, &u), 0);
        assert_true(u == (uint64_t)(5 + i));
    }
    assert_int_equal(msgpk_read_u64(&r, &u), 0);
    assert_true(u == 2);
    assert_int_equal(msgpk_read_nil(&r), 0);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "GPU", 3);
    assert_int_equal(msgpk_read_nil(&r), 0);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "BlockRemoved", 12);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(msgpk_skip(&r), 0);
    assert_int_equal(msgpk_skip(&r), 0);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0); /* medium */
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "AllBlocksCleared", 16);
    assert_int_equal(msgpk_read_u64(&r, &u), 0); /* data_parallel_rank */
    assert_true(u == 2);
    assert_int_equal(msgpk_remaining(&r), 0);

    /* map form with int hashes (the low 64 bits, big-endian) */
    strbuf_reset(&sb);
    assert_int_equal(sim_kvev_encode(evs + 2, 1, 0, 0, true, true, &sb), 0);
    msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
    assert_int_equal(msgpk_read_map(&r, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "ts", 2);
    assert_int_equal(msgpk_skip(&r), 0);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "events", 6);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(msgpk_read_map(&r, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "type", 4);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "BlockRemoved", 12);
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_memory_equal(p, "block_hashes", 12);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(msgpk_read_u64(&r, &u), 0);
    assert_true(u == 0x0303030303030307ULL);
    strbuf_release(&sb);
}

static void test_kvev_config(void **state)
{
    struct sim_kvev_config c;
    char err[160];
    assert_int_equal(sim_kvev_parse_config("{\"enable_kv_cache_events\": true}", &c, err,
                                           sizeof(err)),
                     0);
    assert_true(c.enabled);
    assert_string_equal(c.publisher, "zmq"); /* vLLM: zmq when enabled */
    assert_string_equal(c.endpoint, "tcp://*:5557");
    assert_null(c.replay_endpoint);
    assert_int_equal(c.buffer_steps, 10000);
    assert_int_equal(c.hwm, 100000);
    assert_string_equal(c.topic, "");
    sim_kvev_config_release(&c);
    assert_int_equal(sim_kvev_parse_config("{}", &c, err, sizeof(err)), 0);
    assert_string_equal(c.publisher, "null");
    sim_kvev_config_release(&c);
    static const struct {
        const char *json, *needle;
    } bad[] = {
        {"[]", "JSON object"},
        {"{\"enable_kv_cache_events\": 1}", "enable_kv_cache_events"},
        {"{\"publisher\": \"kafka\"}", "publisher"},
        {"{\"buffer_steps\": 0}", "buffer_steps"},
        {"{\"topic\": 5}", "topic"},
        {"{\"nope\": 5}", "unknown key 'nope'"},
        {"{\"a\": 1, \"a\": 2}", "JSON object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(sim_kvev_parse_config(bad[i].json, &c, err, sizeof(err)), -EINVAL);
        if (!strstr(err, bad[i].needle))
            fail_msg("%s: %s", bad[i].json, err);
    }
    static const struct {
        const char *in;
        int rank;
        const char *out;
    } off[] = {
        {"tcp://*:5557", 0, "tcp://*:5557"},
        {"tcp://*:5557", 3, "tcp://*:5560"},
        {"tcp://10.0.0.1:6000", 1, "tcp://10.0.0.1:6001"},
        {"inproc://x", 2, "inproc://x"},
    };
    for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); i++) {
        char *o = sim_kvev_offset_endpoint(off[i].in, off[i].rank);
        assert_string_equal(o, off[i].out);
        free(o);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_hashes),
        cmocka_unit_test(test_hits_pins_eviction),
        cmocka_unit_test(test_kvev_encode),
        cmocka_unit_test(test_kvev_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
