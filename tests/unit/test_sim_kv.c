/* sim_kv: the prefill engine's ticket table (take-once, TTL, bounded with eviction). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim/sim_kv.h"

#include <errno.h>

static void test_put_take(void **state)
{
    struct sim_kv *kv = sim_kv_new(8, 1000, 100);
    struct sim_kv_ticket t, got;
    assert_int_equal(sim_kv_put(kv, 0xabc, 40, 0, &t), 0);
    assert_int_equal(t.first_block, 100);
    assert_int_equal(t.n_blocks, 3); /* 40 tokens / 16 per block, rounded up */
    assert_int_equal(t.expires_ms, 1000);
    struct sim_kv_ticket t2;
    sim_kv_put(kv, 0xdef, 0, 0, &t2);
    assert_int_equal(t2.first_block, 103); /* ids never reused */
    assert_int_equal(t2.n_blocks, 1);
    assert_int_equal(sim_kv_count(kv), 2);

    assert_int_equal(sim_kv_take(kv, 101, 10, &got), -ENOENT); /* not a first block */
    assert_int_equal(sim_kv_take(kv, 100, 10, &got), 0);
    assert_true(got.prompt_hash == 0xabc);
    assert_int_equal(got.prompt_tokens, 40);
    assert_int_equal(sim_kv_take(kv, 100, 10, &got), -ENOENT); /* consumed */
    assert_int_equal(sim_kv_count(kv), 1);
    assert_int_equal(sim_kv_take(kv, 103, 10, NULL), 0);
    assert_int_equal(sim_kv_count(kv), 0);

    struct sim_kv_ticket big;
    sim_kv_put(kv, 1, 1 << 20, 0, &big);
    assert_int_equal(big.n_blocks, SIM_KV_MAX_BLOCKS);
    sim_kv_free(kv);
    sim_kv_free(NULL);
}

static void test_expiry(void **state)
{
    struct sim_kv *kv = sim_kv_new(8, 100, 1);
    struct sim_kv_ticket a, b;
    sim_kv_put(kv, 1, 1, 0, &a);
    sim_kv_put(kv, 2, 1, 50, &b);
    assert_int_equal(sim_kv_expire(kv, 99), 0);
    assert_int_equal(sim_kv_expire(kv, 100), 1);
    assert_int_equal(sim_kv_take(kv, a.first_block, 100, NULL), -ENOENT);
    /* take expires lazily too */
    assert_int_equal(sim_kv_take(kv, b.first_block, 150, NULL), -ENOENT);
    assert_int_equal(sim_kv_count(kv), 0);
    sim_kv_free(kv);
}

static void test_bounded(void **state)
{
    struct sim_kv *kv = sim_kv_new(3, 1000, 1);
    struct sim_kv_ticket t[10];
    for (int i = 0; i < 3; i++)
        assert_int_equal(sim_kv_put(kv, (uint64_t)i, 1, 0, &t[i]), 0);
    /* full: the oldest goes */
    assert_int_equal(sim_kv_put(kv, 3, 1, 0, &t[3]), 1);
    assert_int_equal(sim_kv_count(kv), 3);
    assert_int_equal(sim_kv_take(kv, t[0].first_block, 0, NULL), -ENOENT);
    /* a hole in the middle, then wrap around many times */
    assert_int_equal(sim_kv_take(kv, t[2].first_block, 0, NULL), 0);
    for (int round = 0; round < 20; round++) {
        struct sim_kv_ticket x;
        sim_kv_put(kv, 100 + (uint64_t)round, 1, 0, &x);
        assert_true(sim_kv_count(kv) <= 3);
        assert_int_equal(sim_kv_take(kv, x.first_block, 0, NULL), 0);
        sim_kv_put(kv, 200 + (uint64_t)round, 1, 0, &x);
    }
    assert_int_equal(sim_kv_count(kv), 3);
    sim_kv_free(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_take),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
