/* The KV-cache index: KVEventBatch decoding (both encodings, both hash forms), chain
 * keys equal to what a prompt's tokens give, removals, clears, unknown parents, other
 * tiers, the memory bound and hostile payloads. Batches are written here with the
 * msgpack writer in vLLM's layouts (vllm/distributed/kv_events.py). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/msgpk.h"
#include "common/strbuf.h"
#include "coordinator/kvidx.h"

#include <errno.h>
#include <string.h>

#define BS 4

/* An engine hash: 32 bytes derived from n (any content will do: the index only needs
 * them distinct). */
static void put_hash(struct strbuf *sb, uint32_t n, bool int_hash)
{
    if (int_hash) {
        msgpk_put_uint(sb, 0x1000000000ULL + n);
        return;
    }
    uint8_t h[32];
    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(n * 31 + (uint32_t)i * 7 + (n >> 8));
    msgpk_put_bin(sb, h, sizeof(h));
}

/* One BlockStored of blocks first..first+n-1 (tokens: block b holds b*BS..b*BS+BS-1,
 * offset by salt), parent = block first-1 or nil. */
static void put_stored(struct strbuf *sb, uint32_t first, uint32_t n, int salt, bool map,
                       bool int_hash, const char *medium)
{
    if (map) {
        msgpk_put_map(sb, 8);
        msgpk_put_cstr(sb, "type");
        msgpk_put_cstr(sb, "BlockStored");
        msgpk_put_cstr(sb, "block_hashes");
    } else {
        msgpk_put_array(sb, 8);
        msgpk_put_cstr(sb, "BlockStored");
    }
    msgpk_put_array(sb, n);
    for (uint32_t i = 0; i < n; i++)
        put_hash(sb, first + i + (uint32_t)salt * 1000, int_hash);
    if (map)
        msgpk_put_cstr(sb, "parent_block_hash");
    if (first == 0)
        msgpk_put_nil(sb);
    else
        put_hash(sb, first - 1 + (uint32_t)salt * 1000, int_hash);
    if (map)
        msgpk_put_cstr(sb, "token_ids");
    msgpk_put_array(sb, n * BS);
    for (uint32_t i = 0; i < n * BS; i++)
        msgpk_put_uint(sb, (first * BS + i) + (uint32_t)salt * 100000);
    if (map)
        msgpk_put_cstr(sb, "block_size");
    msgpk_put_uint(sb, BS);
    if (map)
        msgpk_put_cstr(sb, "lora_id");
    msgpk_put_nil(sb);
    if (map)
        msgpk_put_cstr(sb, "medium");
    msgpk_put_cstr(sb, medium);
    if (map)
        msgpk_put_cstr(sb, "lora_name");
    msgpk_put_nil(sb);
}

static void put_batch_head(struct strbuf *sb, uint32_t n_events, bool map)
{
    if (map) {
        msgpk_put_map(sb, 3);
        msgpk_put_cstr(sb, "ts");
        msgpk_put_double(sb, 1.5);
        msgpk_put_cstr(sb, "events");
    } else {
        msgpk_put_array(sb, 3);
        msgpk_put_double(sb, 1.5);
    }
    msgpk_put_array(sb, n_events);
}

static void put_batch_tail(struct strbuf *sb, bool map)
{
    if (map)
        msgpk_put_cstr(sb, "data_parallel_rank");
    msgpk_put_uint(sb, 0);
}

static int apply_stored(struct kvidx *x, int slot, uint32_t first, uint32_t n, int salt, bool map,
                        bool int_hash, struct kvidx_stats *st)
{
    struct strbuf sb;
    strbuf_init(&sb, 1 << 22);
    put_batch_head(&sb, 1, map);
    put_stored(&sb, first, n, salt, map, int_hash, "GPU");
    put_batch_tail(&sb, map);
    int rank = 7;
    int rc = kvidx_apply(x, slot, sb.buf, sb.len, st, &rank);
    if (rc == 0)
        assert_int_equal(rank, 0);
    strbuf_release(&sb);
    return rc;
}

/* The keys a prompt of blocks 0..nb-1 (as put_stored numbers them) gives. */
static size_t prompt_keys(uint32_t nb, int salt, size_t extra_tokens, uint64_t *keys)
{
    uint32_t toks[1024];
    size_t n = nb * BS + extra_tokens;
    for (size_t i = 0; i < n; i++)
        toks[i] = (uint32_t)i + (uint32_t)salt * 100000;
    return kvidx_keys(toks, n, BS, keys, 256);
}

static void match2(struct kvidx *x, const uint64_t *k, size_t n, uint32_t *out)
{
    const char *hp[] = {"a:1", "b:1", "c:1"};
    kvidx_match(x, k, n, BS, hp, 3, out);
}

static void test_chain_both_encodings(void **st_)
{
    (void)st_;
    for (int variant = 0; variant < 4; variant++) {
        bool map = variant & 1, ih = variant & 2;
        struct kvidx *x = kvidx_new(1024);
        int a = kvidx_slot_get(x, "a:1"), b = kvidx_slot_get(x, "b:1");
        assert_true(a >= 0 && b >= 0 && a != b);
        assert_int_equal(kvidx_slot_get(x, "a:1"), a);
        struct kvidx_stats st = {0};
        /* a: blocks 0..5 in two events (the second chained on the first's last hash);
         * b: blocks 0..2. */
        assert_int_equal(apply_stored(x, a, 0, 3, 0, map, ih, &st), 0);
        assert_int_equal(apply_stored(x, a, 3, 3, 0, map, ih, &st), 0);
        assert_int_equal(apply_stored(x, b, 0, 3, 0, map, ih, &st), 0);
        assert_int_equal(st.stored, 9);
        assert_int_equal(st.bad, 0);
        assert_int_equal(kvidx_block_size(x, "a:1"), BS);
        uint64_t k[256];
        size_t n = prompt_keys(8, 0, 3, k); /* 8 full blocks + a partial one */
        assert_int_equal(n, 8);
        uint32_t got[3];
        match2(x, k, n, got);
        assert_int_equal(got[0], 6);
        assert_int_equal(got[1], 3);
        assert_int_equal(got[2], 0); /* no slot */
        /* Other content: nothing. */
        n = prompt_keys(8, 1, 0, k);
        match2(x, k, n, got);
        assert_int_equal(got[0], 0);
        assert_int_equal(got[1], 0);
        /* Another block size: nothing. */
        n = prompt_keys(8, 0, 0, k);
        const char *hp[] = {"a:1"};
        kvidx_match(x, k, n, BS * 2, hp, 1, got);
        assert_int_equal(got[0], 0);
        kvidx_free(x);
    }
}

static void put_removed(struct strbuf *sb, uint32_t block)
{
    msgpk_put_array(sb, 3);
    msgpk_put_cstr(sb, "BlockRemoved");
    msgpk_put_array(sb, 1);
    put_hash(sb, block, false);
    msgpk_put_cstr(sb, "GPU");
}

static void test_removed_cleared(void **st_)
{
    (void)st_;
    struct kvidx *x = kvidx_new(1024);
    int a = kvidx_slot_get(x, "a:1");
    struct kvidx_stats st = {0};
    assert_int_equal(apply_stored(x, a, 0, 6, 0, false, false, &st), 0);
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    put_batch_head(&sb, 2, false);
    put_removed(&sb, 3);
    put_removed(&sb, 99); /* unknown: ignored */
    put_batch_tail(&sb, false);
    assert_int_equal(kvidx_apply(x, a, sb.buf, sb.len, &st, NULL), 0);
    assert_int_equal(st.removed, 1);
    uint64_t k[256];
    size_t n = prompt_keys(6, 0, 0, k);
    uint32_t got[3];
    match2(x, k, n, got);
    assert_int_equal(got[0], 3); /* the chain breaks at the removed block */
    assert_int_equal(kvidx_slot_entries(x, a), 5);
    /* A block stored on a removed parent cannot be keyed. */
    assert_int_equal(apply_stored(x, a, 4, 1, 0, false, false, &st), 0);
    assert_int_equal(st.unkeyed, 1);
    strbuf_reset(&sb);
    put_batch_head(&sb, 1, false);
    msgpk_put_array(&sb, 1);
    msgpk_put_cstr(&sb, "AllBlocksCleared");
    put_batch_tail(&sb, false);
    assert_int_equal(kvidx_apply(x, a, sb.buf, sb.len, &st, NULL), 0);
    assert_int_equal(st.cleared, 1);
    assert_int_equal(kvidx_slot_entries(x, a), 0);
    match2(x, k, n, got);
    assert_int_equal(got[0], 0);
    strbuf_release(&sb);
    kvidx_free(x);
}

static void test_unknown_parent_and_tiers(void **st_)
{
    (void)st_;
    struct kvidx *x = kvidx_new(1024);
    int a = kvidx_slot_get(x, "a:1");
    struct kvidx_stats st = {0};
    /* Blocks 3..4 whose parent (block 2) the index never saw. */
    assert_int_equal(apply_stored(x, a, 3, 2, 0, false, false, &st), 0);
    assert_int_equal(st.unkeyed, 2);
    assert_int_equal(st.stored, 0);
    /* A CPU-tier store is not routed on. */
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    put_batch_head(&sb, 1, false);
    put_stored(&sb, 0, 2, 0, false, false, "CPU");
    put_batch_tail(&sb, false);
    assert_int_equal(kvidx_apply(x, a, sb.buf, sb.len, &st, NULL), 0);
    assert_int_equal(kvidx_slot_entries(x, a), 0);
    /* Token count inconsistent with the hashes: refused, counted. */
    strbuf_reset(&sb);
    put_batch_head(&sb, 1, false);
    msgpk_put_array(&sb, 5);
    msgpk_put_cstr(&sb, "BlockStored");
    msgpk_put_array(&sb, 2);
    put_hash(&sb, 0, false);
    put_hash(&sb, 1, false);
    msgpk_put_nil(&sb);
    msgpk_put_array(&sb, 3);
    for (int i = 0; i < 3; i++)
        msgpk_put_uint(&sb, (uint64_t)i);
    msgpk_put_uint(&sb, BS);
    put_batch_tail(&sb, false);
    assert_int_equal(kvidx_apply(x, a, sb.buf, sb.len, &st, NULL), 0);
    assert_int_equal(st.bad, 1);
    assert_int_equal(kvidx_slot_entries(x, a), 0);
    /* An unknown event type is skipped, the batch goes on. */
    strbuf_reset(&sb);
    put_batch_head(&sb, 2, false);
    msgpk_put_array(&sb, 2);
    msgpk_put_cstr(&sb, "SomethingNew");
    msgpk_put_map(&sb, 0);
    put_stored(&sb, 0, 1, 0, false, false, "GPU");
    put_batch_tail(&sb, false);
    assert_int_equal(kvidx_apply(x, a, sb.buf, sb.len, &st, NULL), 0);
    assert_int_equal(kvidx_slot_entries(x, a), 1);
    strbuf_release(&sb);
    kvidx_free(x);
}

static void test_memory_bound(void **st_)
{
    (void)st_;
    struct kvidx *x = kvidx_new(64);
    int a = kvidx_slot_get(x, "a:1"), b = kvidx_slot_get(x, "b:1");
    struct kvidx_stats st = {0};
    for (int salt = 0; salt < 20; salt++) {
        assert_int_equal(apply_stored(x, a, 0, 8, salt, false, false, &st), 0);
        assert_int_equal(apply_stored(x, b, 0, 8, salt, true, true, &st), 0);
    }
    struct kvidx_info in;
    kvidx_info(x, &in);
    assert_int_equal(in.entries, 64);
    assert_int_equal(in.max_blocks, 64);
    assert_int_equal(st.evicted, 320 - 64);
    assert_true(in.bytes < 256 * 1024);
    /* The most recent sessions are the ones kept. */
    uint64_t k[256];
    size_t n = prompt_keys(8, 19, 0, k);
    uint32_t got[3];
    match2(x, k, n, got);
    assert_int_equal(got[0], 8);
    assert_int_equal(got[1], 8);
    n = prompt_keys(8, 0, 0, k);
    match2(x, k, n, got);
    assert_int_equal(got[0], 0);
    /* Removing a slot frees its entries; its number is reused. */
    kvidx_slot_remove(x, a);
    kvidx_info(x, &in);
    assert_int_equal(in.entries, kvidx_slot_entries(x, b));
    assert_int_equal(in.slots, 1);
    assert_int_equal(kvidx_slot_get(x, "c:1"), a);
    assert_int_equal(kvidx_slot_entries(x, a), 0);
    kvidx_free(x);
}

static void test_hostile(void **st_)
{
    (void)st_;
    struct kvidx *x = kvidx_new(1024);
    int a = kvidx_slot_get(x, "a:1");
    struct kvidx_stats st = {0};
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    put_batch_head(&sb, 1, false);
    put_stored(&sb, 0, 4, 0, false, false, "GPU");
    put_batch_tail(&sb, false);
    /* Every truncation fails cleanly (or, at the very end, only loses the rank). */
    for (size_t cut = 0; cut < sb.len; cut++) {
        struct kvidx *y = kvidx_new(64);
        int s = kvidx_slot_get(y, "a:1");
        int rc = kvidx_apply(y, s, sb.buf, cut, &st, NULL);
        assert_true(rc < 0);
        kvidx_free(y);
    }
    /* Huge declared counts cost nothing. */
    static const uint8_t huge[] = {0x93, 0xcb, 0,    0,    0,    0,    0,   0,
                                   0,    0,    0xdd, 0xff, 0xff, 0xff, 0xff};
    assert_true(kvidx_apply(x, a, huge, sizeof(huge), &st, NULL) < 0);
    static const uint8_t not_batch[] = {0xa3, 'a', 'b', 'c'};
    assert_int_equal(kvidx_apply(x, a, not_batch, sizeof(not_batch), &st, NULL), -EBADMSG);
    /* Unknown slot. */
    assert_int_equal(kvidx_apply(x, 4000, sb.buf, sb.len, &st, NULL), -ENOENT);
    strbuf_release(&sb);
    kvidx_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_both_encodings),
        cmocka_unit_test(test_removed_cleared),
        cmocka_unit_test(test_unknown_parent_and_tiers),
        cmocka_unit_test(test_memory_bound),
        cmocka_unit_test(test_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
