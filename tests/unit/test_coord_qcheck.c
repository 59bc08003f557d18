/* The precision checker: each detector on hand-made tables, the JSON accumulator on
 * vLLM's shapes, and the whole check on samples the simulator's model generates for
 * every fault mode (the same generator the engine simulator answers with). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/qcheck.h"
#include "sim/sim_text.h"
#include "sim/sim_tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_repetition_table(void **state)
{
    (void)state;
    static const struct {
        const char *seq; /* one letter per token */
        int period;
        size_t covered;
    } rows[] = {
        {"", 0, 0},
        {"a", 0, 0},
        {"aa", 0, 0},
        {"aaa", 1, 3},
        {"abcdefgh", 0, 0},
        {"xyabab", 0, 0},   /* two periods only */
        {"xyababab", 2, 6}, /* three */
        {"qqabcabcabcabc", 3, 12},
        {"abcabcabcabd", 0, 0}, /* the loop must reach the end */
        {"zzzzzzzzzzzzzzzz", 1, 16},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        uint64_t ids[64];
        size_t n = strlen(rows[r].seq);
        for (size_t i = 0; i < n; i++)
            ids[i] = (uint64_t)rows[r].seq[i];
        size_t cov;
        int p = qck_repetition(ids, n, 8, &cov);
        if (p != rows[r].period || cov != rows[r].covered)
            fail_msg("row %zu \"%s\": period %d covered %zu", r, rows[r].seq, p, cov);
    }
    /* max_period bounds the search */
    uint64_t ids[40];
    for (int i = 0; i < 40; i++)
        ids[i] = (uint64_t)(i % 10);
    size_t cov;
    assert_int_equal(qck_repetition(ids, 40, 9, &cov), 0);
    assert_int_equal(qck_repetition(ids, 40, 10, &cov), 10);
    assert_int_equal(cov, 40);
}

static void test_distinct_4grams(void **state)
{
    (void)state;
    uint64_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = (uint64_t)i;
    assert_true(qck_distinct_4grams(ids, 100) == 1.0);
    assert_true(qck_distinct_4grams(ids, 3) == 1.0);
    for (int i = 0; i < 100; i++)
        ids[i] = (uint64_t)(i % 5);
    double d = qck_distinct_4grams(ids, 100);
    assert_true(fabs(d - 5.0 / 97.0) < 1e-9);
}

static void test_invalid_chars_table(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t n;
    } rows[] = {
        {"hello world", 0},
        {"caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", 0},
        {"\xef\xbf\xbd", 1}, /* U+FFFD itself */
        {"a\x80"
         "b",
         1},         /* lone continuation byte */
        {"\xc3", 1}, /* truncated at the end */
        {"\xe4\xbd"
         "x",
         1},                     /* truncated 3-byte sequence */
        {"\xc0\xaf", 2},         /* overlong: two invalid bytes */
        {"\xed\xa0\x80", 3},     /* a surrogate: three, as Python counts */
        {"\xf5\x80\x80\x80", 4}, /* above 10FFFF */
        {"\xff\xfe\xef\xbf\xbd", 3},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        size_t got = qck_invalid_chars(rows[r].s, strlen(rows[r].s));
        if (got != rows[r].n)
            fail_msg("row %zu: %zu invalid, want %zu", r, got, rows[r].n);
    }
}

static void test_charset(void **state)
{
    (void)state;
    struct qck_charset cs;
    char err[200];
    static const struct {
        const char *s;
        int rc, n;
    } rows[] = {
        {"0-7F", 0, 1},        {"0-24f, 370-3FF ,4E00-9FFF", 0, 3},
        {"41", 0, 1},          {"10FFFF", 0, 1},
        {"", -1, 0},           {"110000", -1, 0},
        {"7F-0", -1, 0},       {"0-7F,", -1, 0},
        {"0-7F;80-FF", -1, 0}, {"g", -1, 0},
        {"1234567", -1, 0},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        int rc = qck_charset_parse(&cs, rows[r].s, err, sizeof(err));
        if ((rc < 0) != (rows[r].rc < 0) || (rc == 0 && cs.n != rows[r].n))
            fail_msg("row %zu \"%s\": rc %d n %d (%s)", r, rows[r].s, rc, cs.n, err);
    }
    assert_int_equal(qck_charset_parse(&cs, "0-24f, 370-3FF", err, sizeof(err)), 0);
    assert_true(qck_charset_has(&cs, 'a'));
    assert_true(qck_charset_has(&cs, 0x3A9));
    assert_false(qck_charset_has(&cs, 0x4E2D));
    qck_charset_default(&cs);
    assert_true(qck_charset_has(&cs, 0x4E2D));   /* 中 */
    assert_true(qck_charset_has(&cs, 0x1F600));  /* an emoji */
    assert_false(qck_charset_has(&cs, 0x13000)); /* an Egyptian hieroglyph */
    assert_false(qck_charset_has(&cs, 0xA000));  /* Yi */
    assert_false(qck_charset_has(&cs, 0xFFFD));
    size_t total;
    assert_int_equal(qck_rare_chars("a \xf0\x93\x80\x80 b\n", 9, &cs, &total), 1);
    assert_int_equal(total, 3);
}

static void test_low_conf(void **state)
{
    (void)state;
    struct qck_params p;
    qck_params_default(&p);
    struct qck_token t = {.logprob = -6.0, .n_top = 3, .top = {-2.9, -2.9, -3.0}};
    assert_true(qck_token_low_conf(&t, &p));
    t.logprob = -3.0; /* not low enough */
    assert_false(qck_token_low_conf(&t, &p));
    t.logprob = -6.0;
    t.n_top = 2; /* too few entries to judge */
    assert_false(qck_token_low_conf(&t, &p));
    /* a confident peak: the sampled token was an unlikely pick, not a broken model */
    struct qck_token peak = {.logprob = -6.0, .n_top = 3, .top = {-0.05, -4.0, -5.0}};
    assert_false(qck_token_low_conf(&peak, &p));
    double flat[4] = {-1.0, -1.0, -1.0, -1.0};
    assert_true(fabs(qck_top_entropy(flat, 4) - 1.0) < 1e-9);
    double sharp[3] = {-0.001, -12.0, -12.0};
    assert_true(qck_top_entropy(sharp, 3) < 0.05);
}

static void test_token_id(void **state)
{
    (void)state;
    bool has;
    assert_int_equal(qck_token_id("token_id:42", 11, &has), 42);
    assert_true(has);
    uint64_t a = qck_token_id(" hello", 6, &has);
    assert_false(has);
    assert_true(a >> 63);
    assert_true(qck_token_id(" hello", 6, &has) == a);
    assert_true(qck_token_id(" hellp", 6, &has) != a);
    qck_token_id("token_id:", 9, &has);
    assert_false(has);
    qck_token_id("token_id:12x", 12, &has);
    assert_false(has);
    qck_token_id("token_id:99999999999", 20, &has);
    assert_false(has);
}

static void add_json(struct qck_acc *a, const char *s, bool ok)
{
    json_error_t e;
    json_t *j = json_loads(s, 0, &e);
    if (!j)
        fail_msg("bad test JSON: %s", e.text);
    bool got = qck_acc_add_response(a, j);
    json_decref(j);
    if (got != ok)
        fail_msg("add_response %s gave %d", s, got);
}

static void test_acc_shapes(void **state)
{
    (void)state;
    struct qck_acc a;
    /* chat, not streamed */
    qck_acc_init(&a, 100, 1000);
    add_json(&a,
             "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
             "\"Hi there\"},\"logprobs\":{\"content\":[{\"token\":\"token_id:7\",\"logprob\":"
             "-0.1,\"bytes\":[1],\"top_logprobs\":[{\"token\":\"token_id:7\",\"logprob\":-0.1},"
             "{\"token\":\"token_id:8\",\"logprob\":-3}]},{\"token\":\" there\",\"logprob\":"
             "-9999.0,\"top_logprobs\":[]}]},\"finish_reason\":\"stop\"}]}",
             true);
    assert_int_equal(a.n, 2);
    assert_true(a.tok[0].has_id);
    assert_int_equal(a.tok[0].id, 7);
    assert_int_equal(a.tok[0].n_top, 2);
    assert_true(a.tok[0].top[1] == -3.0);
    assert_false(a.tok[1].has_id);
    assert_true(a.tok[1].logprob == -9999.0);
    assert_int_equal(a.text_len, 8);
    assert_true(a.finished);
    assert_false(a.malformed);
    qck_acc_release(&a);

    /* chat, streamed: role chunk, token chunks, a usage chunk without choices */
    qck_acc_init(&a, 100, 1000);
    add_json(&a,
             "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
             "\"logprobs\":null,\"finish_reason\":null}]}",
             true);
    add_json(&a,
             "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\"},\"logprobs\":{"
             "\"content\":[{\"token\":\"A\",\"logprob\":-0.5,\"top_logprobs\":[]}]},"
             "\"finish_reason\":null}]}",
             true);
    /* choice 1 of n = 2 is not sampled */
    add_json(&a,
             "{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"Z\"},\"logprobs\":{"
             "\"content\":[{\"token\":\"Z\",\"logprob\":-0.5}]}}]}",
             true);
    add_json(&a,
             "{\"choices\":[{\"index\":0,\"delta\":{\"content\":\" b\"},\"logprobs\":{"
             "\"content\":[{\"token\":\" b\",\"logprob\":-0.2}]},\"finish_reason\":"
             "\"length\"}]}",
             true);
    add_json(&a, "{\"choices\":[],\"usage\":{\"completion_tokens\":2}}", true);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.text_len, 3);
    assert_memory_equal(a.text, "A b", 3);
    assert_true(a.finished);
    qck_acc_release(&a);

    /* completions with the echoed prompt's null first logprob */
    qck_acc_init(&a, 100, 1000);
    add_json(&a,
             "{\"choices\":[{\"index\":0,\"text\":\"x y\",\"logprobs\":{\"tokens\":[\"p\","
             "\"x\",\" y\"],\"token_logprobs\":[null,-0.3,-1],\"top_logprobs\":[null,{\"x\":"
             "-0.3,\"q\":-2},{\" y\":-1,\" z\":-1.2,\" w\":-1.3}],\"text_offset\":[0,1,2]},"
             "\"finish_reason\":\"length\"}]}",
             true);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.tok[0].n_top, 2);
    assert_int_equal(a.tok[1].n_top, 3);
    qck_acc_release(&a);

    /* wrong shapes */
    static const char *bad[] = {
        "[]",
        "{\"choices\":{}}",
        "{\"choices\":[1]}",
        "{\"choices\":[{\"index\":0,\"message\":\"x\"}]}",
        "{\"choices\":[{\"index\":0,\"text\":5}]}",
        "{\"choices\":[{\"index\":0,\"logprobs\":[]}]}",
        "{\"choices\":[{\"index\":0,\"logprobs\":{\"content\":[{\"token\":1,\"logprob\":0}]}}]}",
        "{\"choices\":[{\"index\":0,\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":1}]}}]"
        "}",
        "{\"choices\":[{\"index\":0,\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[]}}]}",
        ("{\"choices\":[{\"index\":0,\"logprobs\":{\"tokens\":[\"a\"],\"token_logprobs\":[-1],"
         "\"top_logprobs\":[{\"a\":\"x\"}]}}]}"),
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        qck_acc_init(&a, 100, 1000);
        add_json(&a, bad[i], false);
        assert_true(a.malformed);
        qck_acc_release(&a);
    }

    /* caps */
    qck_acc_init(&a, 1, 4);
    add_json(&a,
             "{\"choices\":[{\"text\":\"abcdef\",\"logprobs\":{\"tokens\":[\"a\",\"b\"],"
             "\"token_logprobs\":[-1,-1]}}]}",
             true);
    assert_int_equal(a.n, 1);
    assert_int_equal(a.text_len, 4);
    assert_int_equal(a.dropped, 3);
    qck_acc_release(&a);
}

/* A sample as the simulator's engine would answer it in `mode`. */
static void sim_sample(struct qck_acc *a, enum sim_mode mode, uint64_t seed, int n, int top,
                       bool ids)
{
    int32_t *tok = calloc((size_t)n, sizeof(*tok));
    for (int i = 0; i < n; i++) {
        tok[i] = sim_text_gen_mode(mode, seed, i, true);
        struct sim_lp lp;
        sim_text_logprobs(mode, seed, i, tok[i], top, &lp);
        struct qck_token t = {.logprob = lp.e[0].lp};
        char txt[SIM_TOK_TEXT_MAX], idtxt[32];
        size_t tl = sim_tok_text(tok[i], false, txt, sizeof(txt));
        if (ids) {
            int l = snprintf(idtxt, sizeof(idtxt), "token_id:%d", tok[i]);
            t.id = qck_token_id(idtxt, (size_t)l, &t.has_id);
        } else {
            t.id = qck_token_id(txt, tl, &t.has_id);
        }
        /* the chat shape: k entries, the sampled one first */
        for (int j = 0; j < top && j < lp.n; j++)
            t.top[t.n_top++] = lp.e[j].lp;
        qck_acc_add_token(a, &t);
    }
    char *text = sim_tok_decode(tok, (size_t)n, false);
    qck_acc_add_text(a, text, strlen(text));
    free(text);
    free(tok);
}

static void test_sim_modes(void **state)
{
    (void)state;
    static const struct {
        enum sim_mode mode;
        int top, n;
        bool ids;
        unsigned want;  /* the fault that must be flagged (every seed) */
        unsigned never; /* faults that must never be flagged */
    } rows[] = {
        {SIM_MODE_GOOD, 5, 24, true, 0, QCK_REPEAT | QCK_GARBLED | QCK_RARE},
        {SIM_MODE_GOOD, 5, 128, true, 0, QCK_REPEAT | QCK_GARBLED | QCK_RARE},
        {SIM_MODE_GOOD, 20, 512, false, 0, QCK_REPEAT | QCK_GARBLED | QCK_RARE},
        {SIM_MODE_GOOD, 1, 256, true, 0, QCK_REPEAT | QCK_GARBLED | QCK_RARE},
        {SIM_MODE_REPEAT, 1, 48, true, QCK_REPEAT, QCK_GARBLED | QCK_RARE},
        {SIM_MODE_REPEAT, 5, 24, true, QCK_REPEAT, QCK_GARBLED | QCK_RARE}, /* short answer */
        {SIM_MODE_GOOD, 5, 30, false, 0, QCK_REPEAT | QCK_GARBLED | QCK_RARE},
        {SIM_MODE_REPEAT, 5, 256, false, QCK_REPEAT, QCK_GARBLED | QCK_RARE},
        {SIM_MODE_GARBLED, 3, 24, true, QCK_GARBLED, 0},
        {SIM_MODE_GARBLED, 5, 128, false, QCK_GARBLED, QCK_REPEAT},
        {SIM_MODE_RARE, 5, 32, true, QCK_RARE, QCK_REPEAT | QCK_GARBLED},
        {SIM_MODE_RARE, 5, 256, false, QCK_RARE, QCK_REPEAT | QCK_GARBLED},
        /* below the top-k the detector needs: nothing flagged */
        {SIM_MODE_GARBLED, 2, 64, true, 0, QCK_GARBLED},
        {SIM_MODE_RARE, 4, 64, true, 0, QCK_RARE},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        struct qck_params p;
        qck_params_default(&p);
        p.garbled = rows[r].top >= 3;
        p.rare = rows[r].top >= 5;
        for (uint64_t s = 1; s <= 300; s++) {
            struct qck_acc a;
            qck_acc_init(&a, 4096, 65536);
            sim_sample(&a, rows[r].mode, s * 0x9e3779b97f4a7c15ULL, rows[r].n, rows[r].top,
                       rows[r].ids);
            struct qck_verdict v;
            qck_check(&a, &p, &v);
            qck_acc_release(&a);
            if (!v.valid || (v.bad & rows[r].want) != rows[r].want || (v.bad & rows[r].never))
                fail_msg("row %zu seed %llu: valid %d bad %s (period %d cover %zu, 4g %.2f, "
                         "run %zu share %.2f inv %zu, rare %.2f)",
                         r, (unsigned long long)s, v.valid, qck_fault_name(v.bad), v.period,
                         v.repeat_tokens, v.distinct_4gram, v.low_conf_run, v.low_conf_share,
                         v.invalid_chars, v.rare_share);
        }
    }
}

static void test_validity(void **state)
{
    (void)state;
    struct qck_params p;
    qck_params_default(&p);
    struct qck_acc a;
    struct qck_verdict v;
    qck_acc_init(&a, 100, 100);
    sim_sample(&a, SIM_MODE_REPEAT, 5, 23, 1, true); /* one token short */
    qck_check(&a, &p, &v);
    assert_false(v.valid);
    assert_int_equal(v.bad, 0);
    sim_sample(&a, SIM_MODE_GOOD, 5, 1, 1, true);
    qck_check(&a, &p, &v);
    assert_true(v.valid);
    a.malformed = true;
    qck_check(&a, &p, &v);
    assert_false(v.valid);
    qck_acc_release(&a);
    assert_string_equal(qck_fault_name(QCK_OK), "ok");
    assert_string_equal(qck_fault_name(QCK_REPEAT | QCK_RARE), "repeat+rare_chars");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repetition_table),
        cmocka_unit_test(test_distinct_4grams),
        cmocka_unit_test(test_invalid_chars_table),
        cmocka_unit_test(test_charset),
        cmocka_unit_test(test_low_conf),
        cmocka_unit_test(test_token_id),
        cmocka_unit_test(test_acc_shapes),
        cmocka_unit_test(test_sim_modes),
        cmocka_unit_test(test_validity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
