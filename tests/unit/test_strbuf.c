/* strbuf: the hard cap, refusal without side effects, JSON escaping, take/consume/reset. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static void test_empty(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 16);
    assert_string_equal(strbuf_str(&sb), "");
    assert_int_equal(sb.len, 0);
    assert_false(sb.overflow);
    char *t = strbuf_take(&sb);
    assert_string_equal(t, "");
    free(t);
    strbuf_release(&sb);
    strbuf_release(NULL);
}

static void test_cap(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 8);
    assert_int_equal(strbuf_puts(&sb, "abcd"), 0);
    assert_int_equal(strbuf_append(&sb, "efgh", 4), 0); /* exactly the cap */
    assert_string_equal(strbuf_str(&sb), "abcdefgh");
    assert_false(sb.overflow);
    /* Every kind of append is refused whole and leaves the content untouched. */
    assert_int_equal(strbuf_putc(&sb, 'x'), -E2BIG);
    assert_true(sb.overflow);
    assert_int_equal(strbuf_append(&sb, "x", 1), -E2BIG);
    assert_int_equal(strbuf_puts(&sb, "xy"), -E2BIG);
    assert_int_equal(strbuf_appendf(&sb, "%d", 7), -E2BIG);
    assert_int_equal(strbuf_put_json_string(&sb, ""), -E2BIG);
    assert_int_equal(strbuf_append(&sb, "x", SIZE_MAX), -E2BIG); /* no wraparound */
    assert_string_equal(strbuf_str(&sb), "abcdefgh");
    assert_int_equal(sb.len, 8);
    /* Appending nothing at the cap is fine. */
    assert_int_equal(strbuf_append(&sb, "", 0), 0);
    /* reset clears content and the overflow flag, keeps the cap */
    strbuf_reset(&sb);
    assert_false(sb.overflow);
    assert_string_equal(strbuf_str(&sb), "");
    assert_int_equal(strbuf_puts(&sb, "123456789"), -E2BIG);
    assert_string_equal(strbuf_str(&sb), "");
    strbuf_release(&sb);
}

static void test_partial_refusal_json(void **state)
{
    (void)state;
    /* A JSON string that does not fit must not leave half a literal behind. */
    struct strbuf sb;
    strbuf_init(&sb, 10);
    assert_int_equal(strbuf_puts(&sb, "[1,"), 0);
    assert_int_equal(strbuf_put_json_string(&sb, "abcdefghij"), -E2BIG);
    assert_true(sb.overflow);
    assert_string_equal(strbuf_str(&sb), "[1,");
    assert_int_equal(sb.len, 3);
    /* An escape that would cross the cap. */
    assert_int_equal(strbuf_put_json_string(&sb, "ab\x01"), -E2BIG);
    assert_string_equal(strbuf_str(&sb), "[1,");
    assert_int_equal(strbuf_put_json_string(&sb, "a\n"), 0); /* 6 bytes: fits */
    assert_string_equal(strbuf_str(&sb), "[1,\"a\\n\"");
    strbuf_release(&sb);
}

static void test_appendf(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    assert_int_equal(strbuf_appendf(&sb, "%s=%d;", "a", 1), 0);
    assert_int_equal(strbuf_appendf(&sb, "%s", ""), 0);
    /* Growth across many reallocations keeps earlier content. */
    for (int i = 0; i < 1000; i++)
        assert_int_equal(strbuf_appendf(&sb, "%04d", i), 0);
    assert_int_equal(sb.len, 4 + 4000);
    assert_memory_equal(strbuf_str(&sb), "a=1;0000000100020003", 20);
    assert_string_equal(strbuf_str(&sb) + sb.len - 4, "0999");
    assert_int_equal(strlen(strbuf_str(&sb)), sb.len);
    strbuf_release(&sb);
}

static void test_binary_append(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 64);
    assert_int_equal(strbuf_append(&sb, "a\0b", 3), 0);
    assert_int_equal(sb.len, 3);
    assert_memory_equal(sb.buf, "a\0b\0", 4);
    strbuf_release(&sb);
}

static void test_json_string(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"", "\"\""},
        {"plain", "\"plain\""},
        {"q\"uote", "\"q\\\"uote\""},
        {"back\\slash", "\"back\\\\slash\""},
        {"nl\ncr\rtab\t", "\"nl\\ncr\\rtab\\t\""},
        {"\x01\x1f", "\"\\u0001\\u001f\""},
        {"\b\f", "\"\\u0008\\u000c\""},
        {"del\x7f", "\"del\x7f\""},
        {"\xc3\xa9\xe2\x82\xac", "\"\xc3\xa9\xe2\x82\xac\""},
        {"/", "\"/\""},
        {"bad\xff", "\"bad\\ufffd\""},       /* invalid byte */
        {"cut\xe2\x82", "\"cut\\ufffd\\ufffd\""}, /* truncated sequence */
        {"\xc0\xaf", "\"\\ufffd\\ufffd\""},   /* overlong */
        {"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""}, /* surrogate */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct strbuf sb;
        strbuf_init(&sb, 256);
        print_message("json case %zu\n", i);
        assert_int_equal(strbuf_put_json_string(&sb, cases[i].in), 0);
        assert_string_equal(strbuf_str(&sb), cases[i].out);
        /* And a strict parser agrees. */
        json_error_t err;
        json_t *v = json_loads(strbuf_str(&sb), JSON_DECODE_ANY, &err);
        assert_non_null(v);
        assert_true(json_is_string(v));
        json_decref(v);
        strbuf_release(&sb);
    }
}

static void test_take(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 32);
    assert_int_equal(strbuf_puts(&sb, "hello"), 0);
    char *t = strbuf_take(&sb);
    assert_string_equal(t, "hello");
    /* The buffer is empty and reusable with the same cap. */
    assert_int_equal(sb.len, 0);
    assert_null(sb.buf);
    assert_string_equal(strbuf_str(&sb), "");
    assert_int_equal(sb.max, 32);
    assert_int_equal(strbuf_puts(&sb, "again"), 0);
    assert_string_equal(strbuf_str(&sb), "again");
    free(t);
    strbuf_release(&sb);
}

static void test_consume(void **state)
{
    (void)state;
    static const struct {
        size_t n;
        const char *left;
    } cases[] = {{0, "abcdef"}, {1, "bcdef"}, {5, "f"}, {6, ""}, {100, ""}};
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct strbuf sb;
        strbuf_init(&sb, 6);
        assert_int_equal(strbuf_puts(&sb, "abcdef"), 0);
        assert_int_equal(strbuf_putc(&sb, 'g'), -E2BIG);
        strbuf_consume(&sb, cases[i].n);
        assert_string_equal(strbuf_str(&sb), cases[i].left);
        assert_int_equal(sb.len, strlen(cases[i].left));
        /* Consuming makes room under the cap again. */
        assert_int_equal(strbuf_puts(&sb, "Z"), cases[i].n ? 0 : -E2BIG);
        strbuf_release(&sb);
    }
    struct strbuf sb;
    strbuf_init(&sb, 4);
    strbuf_consume(&sb, 3); /* empty, never allocated */
    assert_string_equal(strbuf_str(&sb), "");
    strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_cap),
        cmocka_unit_test(test_partial_refusal_json),
        cmocka_unit_test(test_appendf),
        cmocka_unit_test(test_binary_append),
        cmocka_unit_test(test_json_string),
        cmocka_unit_test(test_take),
        cmocka_unit_test(test_consume),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
