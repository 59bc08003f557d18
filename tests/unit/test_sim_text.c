/* sim_text and sim_resp: deterministic generation, response shapes and SSE framing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/strbuf.h"
#include "sim/sim_resp.h"
#include "sim/sim_text.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void test_hash_and_words(void **state)
{
    /* FNV-1a 64 reference values */
    assert_true(sim_text_hash(SIM_TEXT_HASH_INIT, "", 0) == 0xcbf29ce484222325ULL);
    assert_true(sim_text_hash(SIM_TEXT_HASH_INIT, "a", 1) == 0xaf63dc4c8601ec8cULL);
    struct {
        const char *s;
        int words;
    } cases[] = {{"", 0}, {"   ", 0}, {"a", 1}, {" a  b\tc\n", 3}, {"héllo wörld", 2}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(sim_text_count_words(cases[i].s), cases[i].words);
}

static void test_tokens_deterministic(void **state)
{
    uint64_t seed = sim_text_seed(sim_text_hash(SIM_TEXT_HASH_INIT, "hello", 5), 0);
    assert_true(seed == sim_text_seed(sim_text_hash(SIM_TEXT_HASH_INIT, "hello", 5), 0));
    assert_true(seed != sim_text_seed(sim_text_hash(SIM_TEXT_HASH_INIT, "hello", 5), 1));
    char *a = sim_text_completion(seed, 40);
    char *b = sim_text_completion(seed, 40);
    assert_string_equal(a, b);
    /* the concatenation of single tokens is the completion (what a stream delivers) */
    char joined[40 * SIM_TEXT_TOKEN_MAX + 1];
    size_t len = 0;
    for (int i = 0; i < 40; i++) {
        char tok[SIM_TEXT_TOKEN_MAX];
        size_t n = sim_text_token(seed, i, tok, sizeof(tok));
        assert_int_equal(n, strlen(tok));
        assert_true(n > 0);
        assert_int_equal(tok[0] == ' ', i > 0);
        memcpy(joined + len, tok, n);
        len += n;
    }
    joined[len] = '\0';
    assert_string_equal(joined, a);
    /* a prefix of a longer completion: token i never depends on the length */
    char *c = sim_text_completion(seed, 10);
    assert_true(strncmp(a, c, strlen(c)) == 0);
    /* another prompt, another text */
    uint64_t other = sim_text_seed(sim_text_hash(SIM_TEXT_HASH_INIT, "hellO", 5), 0);
    char *d = sim_text_completion(other, 40);
    assert_string_not_equal(a, d);
    char *e = sim_text_completion(seed, 0);
    assert_string_equal(e, "");
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
    /* a tiny buffer is never overrun */
    char small[3];
    assert_true(sim_text_token(seed, 5, small, sizeof(small)) <= 2);
    assert_true(strlen(small) <= 2);
}

static void test_plan(void **state)
{
    int stops = 0, lengths = 0;
    for (int i = 0; i < 200; i++) {
        uint64_t seed = sim_text_seed((uint64_t)i * 7919u, 0);
        int nat = sim_text_natural_len(seed);
        assert_in_range(nat, 8, 127);
        bool stopped;
        int n = sim_text_plan(seed, 64, 0, false, &stopped);
        if (stopped) {
            assert_int_equal(n, nat);
            assert_true(n < 64);
            stops++;
        } else {
            assert_int_equal(n, 64);
            lengths++;
        }
        assert_int_equal(sim_text_plan(seed, 64, 0, true, &stopped), 64);
        assert_false(stopped);
        /* min_tokens postpones the natural end */
        n = sim_text_plan(seed, 200, 150, false, &stopped);
        assert_int_equal(n, 150);
        assert_true(stopped);
    }
    assert_true(stops > 0 && lengths > 0);
}

static json_t *parse(const char *s, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(s, n, 0, &je);
    assert_non_null(j);
    return j;
}

static void test_sse_framing(void **state)
{
    struct sim_resp_meta m = {
        .api = SIM_API_CHAT, .id = "chatcmpl-1", .created = 1700000000, .model = "m"};
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    json_t *c1 = sim_resp_chunk(&m, 0, "", true, NULL, NULL);
    json_t *c2 = sim_resp_chunk(&m, 0, " tok\n\"x\"", false, "length", NULL);
    assert_int_equal(sim_sse_event(&sb, c1), 0);
    assert_int_equal(sim_sse_event(&sb, c2), 0);
    assert_int_equal(sim_sse_done(&sb), 0);
    json_decref(c1);
    json_decref(c2);
    /* every event is one "data: " line followed by a blank line; [DONE] last */
    const char *p = sb.buf;
    int events = 0;
    while (*p) {
        assert_true(strncmp(p, "data: ", 6) == 0);
        const char *nl = strstr(p, "\n\n");
        assert_non_null(nl);
        assert_null(memchr(p, '\n', (size_t)(nl - p)));
        const char *payload = p + 6;
        if (nl[2] == '\0') {
            assert_true(strncmp(payload, "[DONE]", 6) == 0);
        } else {
            json_t *j = parse(payload, (size_t)(nl - payload));
            assert_string_equal(json_string_value(json_object_get(j, "object")),
                                "chat.completion.chunk");
            assert_string_equal(json_string_value(json_object_get(j, "id")), "chatcmpl-1");
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            json_t *delta = json_object_get(ch, "delta");
            if (events == 0) {
                assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
                assert_true(json_is_null(json_object_get(ch, "finish_reason")));
            } else {
                assert_string_equal(json_string_value(json_object_get(delta, "content")),
                                    " tok\n\"x\"");
                assert_string_equal(json_string_value(json_object_get(ch, "finish_reason")),
                                    "length");
            }
            assert_null(json_object_get(j, "usage"));
            json_decref(j);
        }
        events++;
        p = nl + 2;
    }
    assert_int_equal(events, 3);

    /* an event that does not fit leaves the buffer as it was */
    struct strbuf tiny;
    strbuf_init(&tiny, 20);
    json_t *big = sim_resp_usage(1, 2);
    assert_int_equal(sim_sse_event(&tiny, big), -E2BIG);
    assert_int_equal(tiny.len, 0);
    json_decref(big);
    strbuf_release(&tiny);
    strbuf_release(&sb);
}

static void test_bodies(void **state)
{
    struct sim_resp_meta m = {
        .api = SIM_API_COMPLETIONS, .id = "cmpl-9", .created = 5, .model = "m", .usage_null = true};
    json_t *choices = json_array();
    json_array_append_new(choices, sim_resp_choice(SIM_API_COMPLETIONS, 0, "hi", "stop"));
    json_t *b = sim_resp_body(&m, choices, sim_resp_usage(3, 4));
    assert_string_equal(json_string_value(json_object_get(b, "object")), "text_completion");
    json_t *u = json_object_get(b, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 7);
    json_t *c0 = json_array_get(json_object_get(b, "choices"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "text")), "hi");
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    json_decref(b);

    json_t *chat = sim_resp_choice(SIM_API_CHAT, 2, "yo", "length");
    json_t *msg = json_object_get(chat, "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")), "yo");
    assert_int_equal(json_integer_value(json_object_get(chat, "index")), 2);
    json_decref(chat);

    /* include_usage: usage null on token chunks, a closing chunk with no choices */
    json_t *k = sim_resp_chunk(&m, 0, "a", false, NULL, NULL);
    assert_true(json_is_null(json_object_get(k, "usage")));
    json_decref(k);
    json_t *uc = sim_resp_usage_chunk(&m, sim_resp_usage(1, 1));
    assert_int_equal(json_array_size(json_object_get(uc, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(uc, "usage"), "total_tokens")), 2);
    json_decref(uc);

    json_t *e = sim_resp_error(400, "bad", "max_tokens");
    json_t *eo = json_object_get(e, "error");
    assert_string_equal(json_string_value(json_object_get(eo, "message")), "bad");
    assert_string_equal(json_string_value(json_object_get(eo, "type")), "BadRequestError");
    assert_string_equal(json_string_value(json_object_get(eo, "param")), "max_tokens");
    assert_int_equal(json_integer_value(json_object_get(eo, "code")), 400);
    json_decref(e);
    e = sim_resp_error(503, "x", NULL);
    assert_true(json_is_null(json_object_get(json_object_get(e, "error"), "param")));
    json_decref(e);
    /* invalid UTF-8 never yields NULL */
    e = sim_resp_error(400, "\xff\xfe", "");
    assert_non_null(e);
    json_decref(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hash_and_words), cmocka_unit_test(test_tokens_deterministic),
        cmocka_unit_test(test_plan),           cmocka_unit_test(test_sse_framing),
        cmocka_unit_test(test_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
