/* The /tokenize bodies made from client requests, integer prompts, and the answers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/tokreq.h"

#include <stdlib.h>
#include <string.h>

static json_t *js(const char *s)
{
    json_t *j = json_loads(s, 0, NULL);
    assert_non_null(j);
    return j;
}

static void expect_body(const char *req, bool chat, const char *want)
{
    json_t *r = js(req);
    json_t *b = tokreq_body(r, chat);
    if (!want) {
        assert_null(b);
    } else {
        json_t *w = js(want);
        assert_non_null(b);
        if (!json_equal(b, w)) {
            char *got = json_dumps(b, JSON_SORT_KEYS);
            fail_msg("got %s", got);
        }
        json_decref(w);
    }
    json_decref(b);
    json_decref(r);
}

static void test_bodies(void **st)
{
    (void)st;
    expect_body("{\"model\":\"m\",\"prompt\":\"hi there\",\"max_tokens\":3}", false,
                "{\"prompt\":\"hi there\"}");
    expect_body("{\"prompt\":[\"one\"],\"add_special_tokens\":false}", false,
                "{\"prompt\":\"one\",\"add_special_tokens\":false}");
    expect_body("{\"prompt\":[\"a\",\"b\"]}", false, NULL); /* a batch */
    expect_body("{\"prompt\":[1,2,3]}", false, NULL);       /* ids: no call needed */
    expect_body("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"function\"}],\"chat_template_kwargs\":{\"a\":1},"
                "\"temperature\":0,\"add_generation_prompt\":null}",
                true,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                "\"tools\":[{\"type\":\"function\"}],\"chat_template_kwargs\":{\"a\":1}}");
    expect_body("{\"messages\":\"no\"}", true, NULL);
}

static void test_ids_and_answers(void **st)
{
    (void)st;
    uint32_t *ids;
    size_t n;
    json_t *r = js("{\"prompt\":[5,6,7]}");
    assert_int_equal(tokreq_prompt_ids(r, &ids, &n), 1);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 7);
    free(ids);
    json_decref(r);
    r = js("{\"prompt\":[[5,-1]]}");
    assert_int_equal(tokreq_prompt_ids(r, &ids, &n), -22);
    json_decref(r);
    r = js("{\"prompt\":\"text\"}");
    assert_int_equal(tokreq_prompt_ids(r, &ids, &n), 0);
    json_decref(r);
    const char *ok = "{\"count\":2,\"max_model_len\":9,\"tokens\":[10,4294967295]}";
    assert_int_equal(tokreq_parse(ok, strlen(ok), &ids, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 4294967295u);
    free(ids);
    const char *bad[] = {
        "",     "{}", "{\"tokens\":[1,\"x\"]}", "{\"tokens\":[4294967296]}", "{\"tokens\":[1.5]}",
        "[1,2]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(tokreq_parse(bad[i], strlen(bad[i]), &ids, &n), -22);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bodies),
        cmocka_unit_test(test_ids_and_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
