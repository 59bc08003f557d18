/* sim_tok and the generation rule of sim_text: every vocabulary form round-trips, white
 * space is kept, unknown words are deterministic, UTF-8 split into byte tokens decodes
 * whole; sim_text_locate finds the answer in any prefix (every m, every choice) so a
 * continuation is exact; logprob distributions keep their invariants in every mode. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim/sim_text.h"
#include "sim/sim_tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void encode(const char *s, struct sim_ids *ids)
{
    sim_ids_init(ids, 1 << 16);
    sim_tok_encode(s, strlen(s), ids);
}

static void test_vocabulary_round_trip(void **state)
{
    for (int w = 0; w < sim_tok_n_words(); w++)
        for (int f = 0; f < SIM_TOK_FORMS; f++) {
            int32_t id = SIM_TOK_WORD_BASE + SIM_TOK_FORMS * w + f;
            char t[SIM_TOK_TEXT_MAX];
            size_t n = sim_tok_text(id, false, t, sizeof(t));
            struct sim_ids ids;
            sim_ids_init(&ids, 16);
            sim_tok_encode(t, n, &ids);
            if (ids.n != 1 || ids.v[0] != id)
                fail_msg("word form %d ('%s') does not round-trip", id, t);
            sim_ids_release(&ids);
            assert_true(sim_tok_valid(id));
        }
    static const struct {
        const char *text;
        size_t n;
        bool lossless;
    } cases[] = {
        {"the engine", 2, true},   {" the", 1, true},          {"the  engine", 3, true},
        {"a\nthe", 3, true},       {"\t\tx ", 4, false},       {"", 0, true},
        {"Token.", 1, true},       {"héllo wörld", 2, false},  {"Engine, decodes.", 2, true},
        {"   ", 3, true},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct sim_ids ids;
        encode(cases[i].text, &ids);
        if (ids.n != cases[i].n)
            fail_msg("'%s': %zu tokens, want %zu", cases[i].text, ids.n, cases[i].n);
        char *back = sim_tok_decode(ids.v, ids.n, false);
        /* everything but out-of-vocabulary words comes back as it was */
        if (cases[i].lossless && strcmp(back, cases[i].text) != 0)
            fail_msg("'%s' decoded as '%s'", cases[i].text, back);
        free(back);
        sim_ids_release(&ids);
    }
    /* unknown words: deterministic, space-aware, placeholder text */
    struct sim_ids a, b;
    encode("zebra zebra", &a);
    encode("zebra", &b);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.v[0], b.v[0]);
    assert_int_equal(a.v[1], a.v[0] + 1);
    char t[SIM_TOK_TEXT_MAX];
    sim_tok_text(a.v[1], false, t, sizeof(t));
    assert_true(t[0] == ' ' && t[1] == '[');
    sim_ids_release(&a);
    sim_ids_release(&b);
    /* specials render only when asked */
    assert_int_equal(sim_tok_text(SIM_TOK_END_USER, false, t, sizeof(t)), 0);
    sim_tok_text(SIM_TOK_END_USER, true, t, sizeof(t));
    assert_string_equal(t, "<|end_of_user|>");
    assert_int_equal(sim_tok_end_of("user"), SIM_TOK_END_USER);
    assert_int_equal(sim_tok_end_of("whatever"), SIM_TOK_END_TURN);
    /* a lone high byte token is U+FFFD alone, but two joined form their character */
    sim_tok_text(0xC3, false, t, sizeof(t));
    assert_string_equal(t, "\xEF\xBF\xBD");
    const int32_t eacute[] = {0xC3, 0xA9};
    char *s = sim_tok_decode(eacute, 2, false);
    assert_string_equal(s, "\xC3\xA9");
    free(s);
    /* validity */
    assert_false(sim_tok_valid(-1));
    assert_false(sim_tok_valid(300));
    assert_false(sim_tok_valid(SIM_TOK_VOCAB_SIZE));
    assert_true(sim_tok_valid(SIM_TOK_RARE_BASE));
    /* the cap */
    struct sim_ids capped;
    sim_ids_init(&capped, 2);
    sim_tok_encode("a b c d", 7, &capped);
    assert_int_equal(capped.n, 2);
    assert_true(capped.overflow);
    sim_ids_release(&capped);
}

static void test_locate_every_prefix(void **state)
{
    for (int trial = 0; trial < 20; trial++) {
        struct sim_ids p;
        char prompt[64];
        snprintf(prompt, sizeof(prompt), "the prompt number %d", trial);
        encode(prompt, &p);
        struct sim_text_origin o;
        sim_text_locate(p.v, p.n, &o);
        assert_false(o.found);
        assert_int_equal(o.split, p.n);
        int k = trial % 3;
        uint64_t seed = sim_text_seed(o.hash, k);
        bool fs = sim_text_first_space(p.v, p.n);
        assert_true(fs);
        int len = 40;
        size_t base = p.n;
        for (int m = 0; m <= len; m++) {
            struct sim_text_origin q;
            sim_text_locate(p.v, p.n, &q);
            if (m == 0) {
                assert_false(q.found);
            } else {
                assert_true(q.found);
                assert_int_equal(q.split, base);
                assert_int_equal(q.m, m);
                assert_int_equal(q.k, k);
                assert_true(q.hash == o.hash);
            }
            sim_ids_push(&p, sim_text_gen(seed, m, fs));
        }
        sim_ids_release(&p);
    }
    /* after an end marker the answer starts without a space, capitalised */
    int32_t ctx[] = {SIM_TOK_WORD_BASE, SIM_TOK_END_USER};
    assert_false(sim_text_first_space(ctx, 2));
    int w, punct;
    bool space, cap;
    assert_true(sim_tok_word_parts(sim_text_gen(42, 0, false), &w, &space, &cap, &punct));
    assert_false(space);
    assert_true(cap);
    assert_true(sim_tok_word_parts(sim_text_gen(42, 1, false), &w, &space, &cap, &punct));
    assert_true(space);
}

static void test_plan_from(void **state)
{
    for (int i = 0; i < 100; i++) {
        uint64_t seed = sim_text_seed((uint64_t)i * 7919u, 0);
        int nat = sim_text_natural_len(seed);
        bool stopped;
        /* continuing after m tokens ends at the same place */
        for (int m = 0; m <= nat; m += 7) {
            int n = sim_text_plan_from(seed, m, 500, 0, false, &stopped);
            assert_true(stopped);
            assert_int_equal(m + n, nat);
        }
        assert_int_equal(sim_text_plan_from(seed, nat + 5, 500, 0, false, &stopped), 0);
        assert_true(stopped);
        assert_int_equal(sim_text_plan_from(seed, 3, 10, 0, true, &stopped), 10);
        assert_false(stopped);
    }
}

static void test_logprob_invariants(void **state)
{
    static const enum sim_mode modes[] = {SIM_MODE_GOOD, SIM_MODE_REPEAT, SIM_MODE_GARBLED,
                                          SIM_MODE_RARE};
    for (size_t mi = 0; mi < 4; mi++) {
        double mean = 0;
        for (int i = 0; i < 200; i++) {
            int32_t id = sim_text_gen_mode(modes[mi], 99, i, true);
            assert_true(sim_tok_valid(id));
            assert_int_equal(id, sim_text_gen_mode(modes[mi], 99, i, true)); /* deterministic */
            for (int top = 0; top <= SIM_TEXT_MAX_TOP; top += 5) {
                struct sim_lp lp;
                sim_text_logprobs(modes[mi], 99, i, id, top, &lp);
                assert_int_equal(lp.e[0].id, id);
                assert_true(lp.n >= 1 && lp.n <= top + 1);
                if (top > 0)
                    assert_true(lp.n >= top);
                double sum = 0;
                for (int k = 0; k < lp.n; k++) {
                    assert_true(lp.e[k].lp <= 0 && lp.e[k].lp >= -9999);
                    sum += exp(lp.e[k].lp);
                    for (int q = 0; q < k; q++)
                        assert_true(lp.e[q].id != lp.e[k].id);
                }
                assert_true(sum <= 1.0 + 1e-9);
                /* after the sampled token, the rest are in decreasing order */
                for (int k = 2; k < lp.n; k++)
                    assert_true(lp.e[k].lp <= lp.e[k - 1].lp + 1e-12);
                if (top == 5)
                    mean += lp.e[0].lp / 200;
            }
        }
        if (modes[mi] == SIM_MODE_GOOD)
            assert_true(mean > -1.0);
        if (modes[mi] == SIM_MODE_REPEAT)
            assert_true(mean > -0.1);
        if (modes[mi] == SIM_MODE_GARBLED)
            assert_true(mean < -4.0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocabulary_round_trip),
        cmocka_unit_test(test_locate_every_prefix),
        cmocka_unit_test(test_plan_from),
        cmocka_unit_test(test_logprob_invariants),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
