/* resume: what a client got (scan), the continuation request, the splice of its events,
 * and the completeness checks of a non-streamed body. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/resume.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char completions_rec[] =
    "data: "
    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":7,\"choices\":[{\"index\":0,"
    "\"text\":\" Alpha\",\"logprobs\":{\"tokens\":[\"token_id:600\"]},\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"cmpl-1\",\"created\":7,\"choices\":[{\"index\":0,\"text\":\" beta\","
    "\"logprobs\":{\"tokens\":[\"token_id:601\"]},\"finish_reason\":null}]}\n\n";

static void test_scan_completions(void **state)
{
    (void)state;
    struct resume_state st;
    char err[128];
    assert_int_equal(
        resume_scan(completions_rec, strlen(completions_rec), false, &st, err, sizeof(err)), 0);
    assert_string_equal(strbuf_str(&st.text), " Alpha beta");
    assert_int_equal(st.tokens, 2);
    assert_string_equal(st.id, "cmpl-1");
    assert_true(st.have_created && st.created == 7);
    assert_false(st.finished);
    assert_non_null(st.ids);
    assert_int_equal(json_array_size(st.ids), 2);
    assert_int_equal(json_integer_value(json_array_get(st.ids, 1)), 601);

    /* a text prompt gets the text, max_tokens reduced, echo off */
    json_t *orig = json_pack("{s:s, s:s, s:i, s:b}", "model", "m", "prompt", "Say", "max_tokens",
                             10, "stream", 1);
    json_t *b = resume_body(orig, &st, err, sizeof(err));
    assert_non_null(b);
    assert_string_equal(json_string_value(json_object_get(b, "prompt")), "Say Alpha beta");
    assert_int_equal(json_integer_value(json_object_get(b, "max_tokens")), 8);
    assert_true(json_is_false(json_object_get(b, "echo")));
    assert_int_equal(json_integer_value(json_object_get(orig, "max_tokens")), 10); /* untouched */
    json_decref(b);
    json_decref(orig);

    /* a token-id prompt gets the ids; absent max_tokens is vLLM's 16 */
    orig = json_pack("{s:[i,i]}", "prompt", 65, 66);
    b = resume_body(orig, &st, err, sizeof(err));
    assert_non_null(b);
    json_t *p = json_object_get(b, "prompt");
    assert_int_equal(json_array_size(p), 4);
    assert_int_equal(json_integer_value(json_array_get(p, 2)), 600);
    assert_int_equal(json_integer_value(json_object_get(b, "max_tokens")), 14);
    json_decref(b);
    json_decref(orig);

    /* refused shapes */
    orig = json_pack("{s:[s,s]}", "prompt", "a", "b");
    assert_null(resume_body(orig, &st, err, sizeof(err)));
    assert_non_null(strstr(err, "batch"));
    json_decref(orig);
    orig = json_pack("{s:s, s:i}", "prompt", "a", "n", 2);
    assert_null(resume_body(orig, &st, err, sizeof(err)));
    json_decref(orig);

    /* the splice: the first answer's id, usage over the whole answer */
    json_t *ev =
        json_pack("{s:s, s:i, s:[], s:{s:i, s:i, s:i}}", "id", "cmpl-2", "created", 9, "choices",
                  "usage", "prompt_tokens", 12, "completion_tokens", 5, "total_tokens", 17);
    assert_true(resume_rewrite(ev, &st));
    assert_string_equal(json_string_value(json_object_get(ev, "id")), "cmpl-1");
    assert_int_equal(json_integer_value(json_object_get(ev, "created")), 7);
    json_t *u = json_object_get(ev, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")), 10);
    assert_int_equal(json_integer_value(json_object_get(u, "completion_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")), 17);
    json_decref(ev);
    resume_release(&st);
}

static void test_scan_chat(void **state)
{
    (void)state;
    static const char rec[] =
        "data: {\"id\":\"c1\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"role\":"
        "\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"
        "data: {\"id\":\"c1\",\"created\":1,\"choices\":[{\"index\":0,\"delta\":{\"content\":"
        "\"Hi\"},\"finish_reason\":null}]}\n\n";
    struct resume_state st;
    char err[128];
    assert_int_equal(resume_scan(rec, strlen(rec), true, &st, err, sizeof(err)), 0);
    assert_true(st.role_sent);
    assert_int_equal(st.tokens, 1);
    assert_null(st.ids);
    json_t *orig = json_pack("{s:[{s:s, s:s}], s:i}", "messages", "role", "user", "content", "yo",
                             "max_completion_tokens", 5);
    json_t *b = resume_body(orig, &st, err, sizeof(err));
    json_t *msgs = json_object_get(b, "messages");
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 1), "content")),
                        "Hi");
    assert_true(json_is_true(json_object_get(b, "continue_final_message")));
    assert_true(json_is_false(json_object_get(b, "add_generation_prompt")));
    assert_int_equal(json_integer_value(json_object_get(b, "max_completion_tokens")), 4);
    json_decref(b);
    json_decref(orig);
    /* the continuation's own role delta is dropped; a content chunk loses only its role */
    json_t *ev = json_pack("{s:[{s:i, s:{s:s, s:s}, s:n}], s:n}", "choices", "index", 0, "delta",
                           "role", "assistant", "content", "", "finish_reason", "usage");
    assert_false(resume_rewrite(ev, &st));
    json_decref(ev);
    ev = json_pack("{s:[{s:i, s:{s:s, s:s}, s:n}]}", "choices", "index", 0, "delta", "role",
                   "assistant", "content", " there", "finish_reason");
    assert_true(resume_rewrite(ev, &st));
    json_t *d = json_object_get(json_array_get(json_object_get(ev, "choices"), 0), "delta");
    assert_null(json_object_get(d, "role"));
    json_decref(ev);
    resume_release(&st);

    /* n > 1 on the wire: refused at the scan */
    static const char two[] = "data: {\"choices\":[{\"index\":1,\"text\":\"x\"}]}\n\n";
    assert_int_equal(resume_scan(two, strlen(two), false, &st, err, sizeof(err)), -EINVAL);
    resume_release(&st);
}

static void test_json_complete(void **state)
{
    (void)state;
    const char *whole[] = {"{}", " {\"a\":[1,{\"b\":\"}\"}]}\n", "[1,2]", "{\"s\":\"a\\\\\"}",
                           "{\"s\":\"q\\\"}\"}"};
    for (size_t i = 0; i < sizeof(whole) / sizeof(whole[0]); i++)
        assert_true(resume_json_complete(whole[i], strlen(whole[i])));
    const char *cut[] = {"",    "{", "{\"a\":\"}", "{\"a\":{\"b\":1}", "[1,2", "{\"s\":\"q\\\"}",
                         "{} x"};
    for (size_t i = 0; i < sizeof(cut) / sizeof(cut[0]); i++)
        assert_false(resume_json_complete(cut[i], strlen(cut[i])));
    assert_true(resume_json_closed("{\"a\":1}\n", 8));
    assert_false(resume_json_closed("{\"a\":\"x", 7));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan_completions),
        cmocka_unit_test(test_scan_chat),
        cmocka_unit_test(test_json_complete),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
