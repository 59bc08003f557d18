/* Projection of logprobs back to the client's request: a table of engine answers and
 * the exact bytes the client must get. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/lpproj.h"

#include <errno.h>
#include <string.h>

static void test_table(void **state)
{
    (void)state;
    static const struct {
        bool chat, strip;
        int top;
        const char *in, *out; /* out NULL: -EINVAL */
    } rows[] = {
        /* no logprobs asked: null, every other byte kept (number spelling included) */
        {true, true, 0,
         "{\"id\":\"x\",\"choices\":[{\"index\":0,\"message\":{\"content\":\"a\"},\"logprobs\":"
         "{\"content\":[{\"token\":\"a\",\"logprob\":-0.10000}]},\"finish_reason\":\"stop\"}],"
         "\"usage\":{\"x\":1.50}}",
         "{\"id\":\"x\",\"choices\":[{\"index\":0,\"message\":{\"content\":\"a\"},\"logprobs\":"
         "null,\"finish_reason\":\"stop\"}],\"usage\":{\"x\":1.50}}"},
        {false, true, 0, "{ \"choices\" : [ { \"text\":\"a\", \"logprobs\" : {\"tokens\":[]} } ] }",
         "{ \"choices\" : [ { \"text\":\"a\", \"logprobs\" : null } ] }"},
        /* already null, or no choices (a usage chunk): unchanged */
        {true, true, 0, "{\"choices\":[{\"logprobs\":null}]}",
         "{\"choices\":[{\"logprobs\":null}]}"},
        {true, true, 0, "{\"choices\":[],\"usage\":{}}", "{\"choices\":[],\"usage\":{}}"},
        /* chat: the first k top entries */
        {true, false, 2,
         "{\"choices\":[{\"logprobs\":{\"content\":[{\"token\":\"a\",\"top_logprobs\":[{\"t\":1},"
         "{\"t\":2},{\"t\":3}]},{\"token\":\"b\",\"top_logprobs\":[{\"t\":4}]}]}}]}",
         "{\"choices\":[{\"logprobs\":{\"content\":[{\"token\":\"a\",\"top_logprobs\":[{\"t\":1},"
         "{\"t\":2}]},{\"token\":\"b\",\"top_logprobs\":[{\"t\":4}]}]}}]}"},
        {true, false, 0,
         "{\"choices\":[{\"logprobs\":{\"content\":[{\"top_logprobs\":[ {\"t\":1} , {\"t\":2} "
         "]}]}}]}",
         "{\"choices\":[{\"logprobs\":{\"content\":[{\"top_logprobs\":[]}]}}]}"},
        {true, false, 5, "{\"choices\":[{\"logprobs\":{\"content\":[{\"top_logprobs\":[1,2]}]}}]}",
         "{\"choices\":[{\"logprobs\":{\"content\":[{\"top_logprobs\":[1,2]}]}}]}"},
        /* completions: the sampled token and the top k; k + 1 entries only when the
         * sampled one ranked below k */
        {false, false, 1,
         "{\"choices\":[{\"text\":\"ab\",\"logprobs\":{\"text_offset\":[0,1],\"token_logprobs\":"
         "[-1,-2],\"tokens\":[\"a\",\"b\"],\"top_logprobs\":[{\"a\":-1,\"x\":-2,\"y\":-3},"
         "{\"b\":-2,\"c\":-0.5,\"d\":-3}]}}]}",
         "{\"choices\":[{\"text\":\"ab\",\"logprobs\":{\"text_offset\":[0,1],\"token_logprobs\":"
         "[-1,-2],\"tokens\":[\"a\",\"b\"],\"top_logprobs\":[{\"a\":-1},{\"b\":-2,\"c\":-0.5}]}}]"
         "}"},
        {false, false, 2,
         "{\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"s\":-2,\"a\":-1,\"b\":-3,\"c\":-4},"
         "{\"s\":-2,\"a\":-1,\"b\":-1.5,\"c\":-4}]}}]}",
         "{\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"s\":-2,\"a\":-1},"
         "{\"s\":-2,\"a\":-1,\"b\":-1.5}]}}]}"},
        {false, false, 0, "{\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"a\":-1,\"b\":-2}]}}]}",
         "{\"choices\":[{\"logprobs\":{\"top_logprobs\":[{\"a\":-1}]}}]}"},
        /* several choices */
        {true, true, 0, "{\"choices\":[{\"logprobs\":{}},{\"logprobs\":[1]}]}",
         "{\"choices\":[{\"logprobs\":null},{\"logprobs\":null}]}"},
        /* not the expected shape */
        {true, true, 0, "[]", NULL},
        {true, true, 0, "{\"choices\":[{\"logprobs\":", NULL},
        {true, true, 0, "{\"choices\":[]} x", NULL},
        {true, true, 0, "", NULL},
    };
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
        struct lpproj p = {.chat = rows[r].chat, .strip = rows[r].strip, .top = rows[r].top};
        struct strbuf sb;
        strbuf_init(&sb, 1 << 20);
        int rc = lpproj_rewrite(&p, rows[r].in, strlen(rows[r].in), &sb);
        if (!rows[r].out) {
            if (rc != -EINVAL)
                fail_msg("row %zu: rc %d, want -EINVAL", r, rc);
        } else if (rc != 0 || strcmp(strbuf_str(&sb), rows[r].out) != 0) {
            fail_msg("row %zu: rc %d\n got  %s\n want %s", r, rc, strbuf_str(&sb), rows[r].out);
        }
        strbuf_release(&sb);
    }
}

static void test_cap(void **state)
{
    (void)state;
    struct lpproj p = {.chat = true, .strip = true};
    struct strbuf sb;
    strbuf_init(&sb, 8);
    const char *in = "{\"choices\":[{\"logprobs\":{}}]}";
    assert_int_equal(lpproj_rewrite(&p, in, strlen(in), &sb), -E2BIG);
    strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_cap)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
