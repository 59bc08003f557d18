/* reqscan: the one-pass body scanner against jansson, the language it must match.
 *
 * Every body in the tables goes through check_same(), which parses it with both
 * json_loadb(JSON_DECODE_ANY) and reqscan_parse() from a heap copy of exactly len bytes
 * (so ASan catches a read past the end, the scanner must not rely on a terminator) and
 * asserts they agree on acceptance and on every field the proxy reads. The tables also
 * carry the expected acceptance written by hand, so a change in either implementation
 * shows up, and a few tests pin exact values. Where jansson surprises (a NUL byte right
 * after a number or a literal is dropped; a scalar counts as a nesting level), the
 * expectation follows jansson — the proxy used to parse with it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/pdreq.h"
#include "coordinator/reqscan.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A body with its length (bodies may hold NUL bytes) and the acceptance we expect. */
struct body {
    const char *s;
    size_t len;
    bool ok;
};
/* clang-format off */
#define OK(lit) {lit, sizeof(lit) - 1, true}
#define BAD(lit) {lit, sizeof(lit) - 1, false}
/* clang-format on */

static const char *tname(enum reqscan_type t)
{
    static const char *const n[] = {"absent",  "null", "false", "true",  "string",
                                    "integer", "real", "array", "object"};
    return (unsigned)t < sizeof(n) / sizeof(n[0]) ? n[t] : "?";
}

static enum reqscan_type jtype(const json_t *v)
{
    if (!v)
        return REQSCAN_ABSENT;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return REQSCAN_OBJECT;
    case JSON_ARRAY:
        return REQSCAN_ARRAY;
    case JSON_STRING:
        return REQSCAN_STRING;
    case JSON_INTEGER:
        return REQSCAN_INTEGER;
    case JSON_REAL:
        return REQSCAN_REAL;
    case JSON_TRUE:
        return REQSCAN_TRUE;
    case JSON_FALSE:
        return REQSCAN_FALSE;
    case JSON_NULL:
        return REQSCAN_NULL;
    }
    return REQSCAN_ABSENT;
}

/* The documented character count, written from the header's words (not pdreq's code):
 * string bytes, 4 per integer array element, "content" + "text" of objects, nothing
 * below depth 8. Checked against pdreq_estimate_tokens through the estimate. */
static size_t ref_chars(const json_t *v, int depth)
{
    if (!v || depth > 8)
        return 0;
    if (json_is_string(v))
        return json_string_length(v);
    size_t n = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *x = json_array_get(v, i);
            n += json_is_integer(x) ? 4 : ref_chars(x, depth + 1);
        }
    } else if (json_is_object(v)) {
        n += ref_chars(json_object_get(v, "content"), depth + 1);
        n += ref_chars(json_object_get(v, "text"), depth + 1);
    }
    return n;
}

static void show(char *out, size_t cap, const char *s, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (o + 8 >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 4);
    else
        out[o] = '\0';
}

#define DIFF(what, ...)                                                                            \
    do {                                                                                           \
        char shown_[200];                                                                          \
        show(shown_, sizeof(shown_), body, len);                                                   \
        fail_msg("%s:%d body \"%s\" (%zu bytes): " what, file, line, shown_, len, __VA_ARGS__);    \
    } while (0)

#define CHECK_TYPE(field)                                                                          \
    do {                                                                                           \
        enum reqscan_type want_ = jtype(obj ? json_object_get(j, #field) : NULL);                  \
        if (s.field != want_)                                                                      \
            DIFF("%s: reqscan %s, jansson %s", #field, tname(s.field), tname(want_));              \
    } while (0)

/* Parse body[0..len) with both; assert they agree. Returns whether jansson accepted. */
static bool check_same_at(const char *file, int line, const char *body, size_t len)
{
    char *copy = malloc(len ? len : 1); /* exactly len bytes: over-reads trip ASan */
    assert_non_null(copy);
    memcpy(copy, body, len);
    json_error_t jerr;
    json_t *j = json_loadb(copy, len, JSON_DECODE_ANY, &jerr);
    struct reqscan s;
    memset(&s, 0xa5, sizeof(s)); /* the scanner must fill everything itself */
    char err[256];
    memset(err, 'x', sizeof(err));
    int rc = reqscan_parse(copy, len, &s, err, sizeof(err));
    free(copy);

    if (!j) {
        if (rc == 0)
            DIFF("reqscan accepts, jansson rejects (%s)", jerr.text);
        if (rc != -EINVAL)
            DIFF("rc %d, want -EINVAL%s", rc, "");
        if (!memchr(err, '\0', sizeof(err)) || strncmp(err, "invalid JSON at line ", 21) != 0)
            DIFF("error message \"%.60s\"", err);
        if (s.model_name)
            DIFF("model_name %p left after a failure%s", (void *)s.model_name, "");
        reqscan_release(&s);
        return false;
    }
    if (rc != 0)
        DIFF("reqscan rejects (%s), jansson accepts", err);

    bool obj = json_is_object(j);
    if (s.top != jtype(j))
        DIFF("top: reqscan %s, jansson %s", tname(s.top), tname(jtype(j)));
    CHECK_TYPE(stream);
    CHECK_TYPE(model);
    CHECK_TYPE(prompt);
    CHECK_TYPE(messages);
    CHECK_TYPE(max_tokens);
    CHECK_TYPE(max_completion_tokens);

    json_t *m = obj ? json_object_get(j, "model") : NULL;
    if (json_is_string(m)) {
        if (!s.model_name || strcmp(s.model_name, json_string_value(m)) != 0)
            DIFF("model \"%s\", jansson \"%s\"", s.model_name ? s.model_name : "(null)",
                 json_string_value(m));
    } else if (s.model_name) {
        DIFF("model_name \"%s\" but model is not a string%s", s.model_name, "");
    }
    json_t *mt = obj ? json_object_get(j, "max_tokens") : NULL;
    if (json_is_integer(mt) && s.max_tokens_value != (int64_t)json_integer_value(mt))
        DIFF("max_tokens %lld, jansson %lld", (long long)s.max_tokens_value,
             (long long)json_integer_value(mt));
    json_t *mc = obj ? json_object_get(j, "max_completion_tokens") : NULL;
    if (json_is_integer(mc) && s.max_completion_tokens_value != (int64_t)json_integer_value(mc))
        DIFF("max_completion_tokens %lld, jansson %lld", (long long)s.max_completion_tokens_value,
             (long long)json_integer_value(mc));

    size_t pc = obj ? ref_chars(json_object_get(j, "prompt"), 0) : 0;
    size_t mcc = obj ? ref_chars(json_object_get(j, "messages"), 0) : 0;
    if (s.prompt_chars != pc || s.messages_chars != mcc)
        DIFF("chars prompt %zu messages %zu, want %zu %zu", s.prompt_chars, s.messages_chars, pc,
             mcc);
    for (int pre = 0; pre < 2; pre++) {
        int64_t got = reqscan_estimate_tokens(&s, pre);
        int64_t want = pdreq_estimate_tokens(j, pre);
        if (got != want)
            DIFF("estimate(prefill_only=%d) %lld, pdreq %lld", pre, (long long)got,
                 (long long)want);
        /* and the reference count agrees with pdreq's, so ref_chars is the same rule */
        if (pre && want != (int64_t)((pc + mcc) / 4) + 1)
            DIFF("ref_chars %zu disagrees with pdreq's estimate %lld", pc + mcc, (long long)want);
    }
    reqscan_release(&s);
    if (s.model_name)
        DIFF("model_name not cleared by release%s", "");
    json_decref(j);
    return true;
}
#define check_same(b, n) check_same_at(__FILE__, __LINE__, (b), (n))

static void run_table(const char *file, int line, const struct body *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool ok = check_same_at(file, line, t[i].s, t[i].len);
        if (ok != t[i].ok) {
            char shown[200];
            show(shown, sizeof(shown), t[i].s, t[i].len);
            fail_msg("row %zu \"%s\": jansson %s it, the table says %s", i, shown,
                     ok ? "accepts" : "rejects", t[i].ok ? "accept" : "reject");
        }
    }
}
#define RUN(t) run_table(__FILE__, __LINE__, (t), sizeof(t) / sizeof((t)[0]))

/* Request-shaped bodies, reused by the truncation test. */
static const struct body requests[] = {
    OK("{\"model\":\"llama-3-8b\",\"prompt\":\"Once upon a time\",\"max_tokens\":64,"
       "\"stream\":true,\"temperature\":0.7}"),
    OK("{\"model\":\"qwen\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
       "{\"role\":\"user\",\"content\":\"Hi there\"}],\"max_completion_tokens\":128,"
       "\"stream\":false,\"stream_options\":{\"include_usage\":true}}"),
    OK("{\"prompt\":[1,2,3,40000,-1],\"max_tokens\":null,\"model\":null}"),
    OK("{\"prompt\":[[1,2],[3,4.5,\"ab\"]],\"model\":\"m\"}"),
    OK("{\"prompt\":[\"batch one\",\"batch two\",{\"text\":\"not a prompt\"}]}"),
    OK("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"abcd\"},"
       "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:x\"}},"
       "{\"type\":\"text\",\"text\":\"ef\",\"content\":\"gh\"}]},"
       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[]}]}"),
    OK("{\"str\\u0065am\":true,\"\\u006dodel\":\"m\\u00e9\\ud83d\\ude00\","
       "\"max_\\u0074okens\":5}"),
    /* every byte of a key escaped: 126 raw bytes, 21 decoded; escaped counted keys */
    OK("{\"\\u006d\\u0061\\u0078\\u005f\\u0063\\u006f\\u006d\\u0070\\u006c\\u0065\\u0074"
       "\\u0069\\u006f\\u006e\\u005f\\u0074\\u006f\\u006b\\u0065\\u006e\\u0073\":42,"
       "\"\\u0070rompt\":[{\"c\\u006fntent\":\"abc\",\"te\\u0078t\":\"de\"}],"
       "\"max_tokens_but_longer_than_the_key_buffer_of_32\":1,\"m\\u006fdel\":2}"),
    OK("{\"model\":\"caf\\u00e9\",\"prompt\":\"\\\"q\\\" \\\\ \\/ \\b\\f\\n\\r\\t\"}"),
    OK("{\"model\":\"\\uD834\\uDD1E clef\",\"prompt\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}"),
    OK("{\"model\":\"a\",\"model\":\"b\",\"stream\":1,\"stream\":false,"
       "\"max_tokens\":1.5,\"max_tokens\":9}"),
    OK("{\"max_tokens\":9223372036854775807,\"max_completion_tokens\":-9223372036854775808}"),
    OK("{\"max_tokens\":-5,\"prompt\":\"x\"}"),
    OK("{\"max_completion_tokens\":2000000,\"max_tokens\":3}"),
    OK("{\"max_completion_tokens\":\"7\",\"max_tokens\":3}"),
    OK("{\"max_completion_tokens\":7.0,\"max_tokens\":-0}"),
    OK("{\"max_tokens\":1e-400,\"prompt\":1e-400,\"messages\":-1E-400}"),
    OK(" \t\r\n{ \n\"model\" \t:\r\"m\" ,\n\"prompt\"\n:\n[ 1 , 2 ]\t,\"messages\" : [ ] } \r\n\t"),
    OK("{\"messages\":{\"content\":\"obj, not array\",\"text\":[1]}}"),
    /* duplicates inside counted objects: the last member counts, alone */
    OK("{\"messages\":[{\"content\":\"aaaaaaaa\",\"text\":\"t\",\"content\":\"bb\","
       "\"text\":[1,2]}],\"prompt\":\"first\",\"prompt\":[9]}"),
    OK("{\"prompt\":{\"text\":\"aaaaaaaaaaaa\",\"text\":null},\"messages\":[],"
       "\"messages\":[{\"content\":{\"text\":\"x\",\"text\":\"yy\"}}]}"),
    OK("{\"prompt\":{\"content\":{\"content\":{\"text\":\"deep\"}}}}"),
    /* content nested past depth 8 stops counting */
    OK("{\"prompt\":[[[[[[[[\"eight\"]]]]]]]],\"messages\":[[[[[[[[[\"nine\",1]]]]]]]]]}"),
    OK("{\"prompt\":[[[[[[[[1,2]]]]]]]],\"messages\":[[[[[[[[[3]]]]]]]]]}"),
    OK("{\"prompt\":{\"content\":{\"content\":{\"content\":{\"content\":{\"content\":"
       "{\"content\":{\"content\":{\"content\":\"d8\",\"text\":{\"text\":\"d9\"}}}}}}}}}}"),
    OK("{\"prompt\":\"\",\"messages\":\"\",\"model\":\"\"}"),
    OK("{\"\":1,\"prompt\":{\"\":2,\"text\":\"t\"},\"messages\":[{\"content\":[]}]}"),
};

static void test_valid(void **state)
{
    (void)state;
    RUN(requests);
    static const struct body more[] = {
        /* non-object top levels */
        OK("1"),
        OK("-0"),
        OK("0"),
        OK("-12.5e+3"),
        OK("1E-5"),
        OK("0.0e0"),
        OK("\"s\""),
        OK("true"),
        OK("false"),
        OK("null"),
        OK("[]"),
        OK("[{}]"),
        OK("  []  "),
        OK("[{\"model\":\"nested, not top\"}]"),
        /* int64 limits, underflow, reals at the edge of double */
        OK("9223372036854775807"),
        OK("-9223372036854775808"),
        OK("1e-400"),
        OK("-1e-400"),
        OK("1.7976931348623157e308"),
        OK("1.7976931348623158e308"),
        OK("0.00000000000000000000000000000000000000000000000000000000000000000001"),
        OK("123456789012345678901234567890.5"),
        OK("1e308"),
        OK("4.9e-324"),
        OK("2e-324"),
        OK("{\"a\":{},\"b\":[],\"c\":{\"d\":[{}]}}"),
        /* a raw DEL and non-ASCII pass through strings; a BOM inside a string is text */
        OK("\"\x7f\""),
        OK("\"\xef\xbb\xbf\""),
        OK("\"\xf4\x8f\xbf\xbf\""),
        OK("\"\xdf\xbf\""),
        OK("{\"model\":\"\xe4\xb8\xad\xe6\x96\x87\"}"),
        /* jansson drops one NUL byte right after a number or a literal (it ungets the
         * byte into a NUL-terminated look-ahead buffer, where it reads as empty) */
        OK("1\0"),
        OK("[1\0,2]"),
        OK("[true\0]"),
        OK("{\"a\":null\0}"),
        OK("-1.5e3\0"),
        OK("[0\0]"),
        OK("[1\0 ]"),
        OK("{\"max_tokens\":7\0,\"model\":\"m\"}"),
        OK("false\0"),
    };
    RUN(more);
}

static void test_invalid(void **state)
{
    (void)state;
    static const struct body bad[] = {
        BAD(""),
        BAD(" "),
        BAD("\n\t"),
        BAD("{"),
        BAD("}"),
        BAD("["),
        BAD("\""),
        BAD("{\"a\"}"),
        BAD("{\"a\":}"),
        BAD("{\"a\" 1}"),
        BAD("{1:2}"),
        BAD("{\"a\":1 \"b\":2}"),
        BAD("[1 2]"),
        /* numbers */
        BAD("01"),
        BAD("-01"),
        BAD("00"),
        BAD("-"),
        BAD("1."),
        BAD("1.e5"),
        BAD(".5"),
        BAD("1e"),
        BAD("1e+"),
        BAD("1E-"),
        BAD("+1"),
        BAD("NaN"),
        BAD("Infinity"),
        BAD("-Infinity"),
        BAD("0x10"),
        BAD("1e5.5"),
        BAD("--1"),
        BAD("9223372036854775808"),
        BAD("-9223372036854775809"),
        BAD("99999999999999999999999"),
        BAD("{\"max_tokens\":9223372036854775808}"),
        BAD("1e400"),
        BAD("-1e400"),
        BAD("1.7976931348623159e308"),
        BAD("1e309"),
        BAD("{\"prompt\":[1e999]}"),
        /* literals */
        BAD("tru"),
        BAD("truex"),
        BAD("True"),
        BAD("nul"),
        BAD("[true1]"),
        BAD("undefined"),
        /* commas and trailing garbage */
        BAD("[1,]"),
        BAD("{\"a\":1,}"),
        BAD("[,1]"),
        BAD("{,}"),
        BAD("[1,,2]"),
        BAD("1 x"),
        BAD("{} {}"),
        BAD("{}x"),
        BAD("[]]"),
        BAD("\"a\"\"b\""),
        BAD("{}\0"),
        BAD("[1]\0"),
        BAD("\"a\"\0"),
        BAD("1\0\0"),
        BAD("1 \0"),
        BAD("[1 \0]"),
        BAD("{\"a\"\0:1}"),
        BAD("1.\0"),
        BAD("\0"),
        BAD("\0{}"),
        BAD("/*c*/{}"),
        BAD("{}//"),
        /* whitespace jansson does not know */
        BAD("1\f"),
        BAD("[1\v]"),
        BAD("\xef\xbb\xbf{}"),
        BAD("\xc2\xa0{}"),
        /* escapes */
        BAD("\"\\x\""),
        BAD("\"\\u12\""),
        BAD("\"\\u12g4\""),
        BAD("\"\\U0041\""),
        BAD("\"\\\""),
        BAD("\"\\'\""),
        BAD("\"\\ud800\""),
        BAD("\"\\udc00\""),
        BAD("\"\\ud800\\u0041\""),
        BAD("\"\\ud800\\ud800\""),
        BAD("\"\\udc00\\ud800\""),
        BAD("\"\\ud800x\""),
        BAD("\"\\ud800\\\""),
        BAD("{\"model\":\"\\udfff\"}"),
        BAD("\"\\u0000\""),
        BAD("\"a\\u0000b\""),
        BAD("{\"\\u0000\":1}"),
        BAD("{\"prompt\\u0000x\":1}"),
        BAD("{\"model\":\"\\u0000\"}"),
        BAD("\"\\u0000x\""),
        BAD("{\"\":1,\"prompt\\u0000x\":2}"),
        /* raw control characters in strings and keys */
        BAD("\"\x01\""),
        BAD("\"\x1f\""),
        BAD("\"a\nb\""),
        BAD("\"\t\""),
        BAD("{\"a\x00\":1}"),
        BAD("\"\0\""),
        /* invalid UTF-8 */
        BAD("\"\xc0\x80\""),
        BAD("\"\xc1\xbf\""),
        BAD("\"\xe0\x80\x80\""),
        BAD("\"\xf0\x80\x80\x80\""),
        BAD("\"\xed\xa0\x80\""),
        BAD("\"\xed\xbf\xbf\""),
        BAD("\"\xf4\x90\x80\x80\""),
        BAD("\"\xf5\x80\x80\x80\""),
        BAD("\"\xf8\x88\x80\x80\x80\""),
        BAD("\"\xff\""),
        BAD("\"\x80\""),
        BAD("\"\xbf\""),
        BAD("\"\xc3\""),
        BAD("\"\xe2\x82\""),
        BAD("\"\xf0\x9f\x98\""),
        BAD("\xc3"),
        BAD("\"\xc3\x28\""),
        BAD("\"\xe2\x28\xa1\""),
        BAD("{\"model\":\"\xc3\"}"),
        BAD("{\"\xed\xa0\x80\":1}"),
        BAD("[\"\xc3\xa9\"\xc3]"),
    };
    RUN(bad);
}

/* Every prefix of a valid body: the scanner must agree with jansson on each (and not read
 * past the cut). The request bodies are objects: a prefix is valid once it holds the
 * closing brace (trailing whitespace may follow). Prefixes of the scalars below are
 * sometimes valid ("-123.4" of "-123.456e-7"). */
static void test_truncated(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(requests) / sizeof(requests[0]); i++) {
        const char *close = memrchr(requests[i].s, '}', requests[i].len);
        assert_non_null(close);
        size_t need = (size_t)(close - requests[i].s) + 1;
        for (size_t cut = 0; cut <= requests[i].len; cut++)
            if (check_same(requests[i].s, cut) != (cut >= need))
                fail_msg("row %zu cut at %zu of %zu: jansson disagrees with the table", i, cut,
                         requests[i].len);
    }
    static const struct body tails[] = {
        OK("-123.456e-7"), OK("[\"\\ud83d\\ude00\xc3\xa9\"]"), OK("{\"a\":[true,false,null]}"),
        OK("[1\0,2]"),     OK("\"\xf0\x9f\x98\x80\""),
    };
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++)
        for (size_t cut = 0; cut <= tails[i].len; cut++)
            (void)check_same(tails[i].s, cut);
}

static char *nest(const char *open, const char *mid, const char *close, int depth, size_t *len)
{
    size_t lo = strlen(open), lm = strlen(mid), lc = strlen(close);
    size_t n = (lo + lc) * (size_t)depth + lm;
    char *b = malloc(n + 1);
    assert_non_null(b);
    size_t o = 0;
    for (int i = 0; i < depth; i++, o += lo)
        memcpy(b + o, open, lo);
    memcpy(b + o, mid, lm);
    o += lm;
    for (int i = 0; i < depth; i++, o += lc)
        memcpy(b + o, close, lc);
    b[o] = '\0';
    *len = o;
    return b;
}

/* JSON_PARSER_MAX_DEPTH is 2048 and jansson counts every value, scalars included: 2048
 * empty arrays are fine, 2048 arrays around a 1 are one level too deep. */
static void test_depth(void **state)
{
    (void)state;
    static const struct {
        const char *open, *mid, *close;
        int depth;
        bool ok;
    } t[] = {
        {"[", "", "]", 2048, true},
        {"[", "", "]", 2049, false},
        {"[", "1", "]", 2047, true},
        {"[", "1", "]", 2048, false},
        {"[", "{}", "]", 2047, true},
        {"[", "{}", "]", 2048, false},
        {"{\"a\":", "1", "}", 2047, true},
        {"{\"a\":", "1", "}", 2048, false},
        {"{\"a\":", "[]", "}", 2047, true},
        {"{\"a\":", "{}", "}", 2048, false},
        {"[1,", "\"x\"", "]", 2047, true},
        {"[1,", "\"x\"", "]", 2048, false},
        {"{\"prompt\":[", "\"x\"", "]}", 1023, true},
        {"{\"prompt\":[", "\"x\"", "]}", 1024, false},
        {"[", "", "", 3000, false}, /* unterminated and too deep */
        {"[", "", "]", 100000, false},
    };
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        size_t len;
        char *b = nest(t[i].open, t[i].mid, t[i].close, t[i].depth, &len);
        bool ok = check_same(b, len);
        free(b);
        if (ok != t[i].ok)
            fail_msg("row %zu (%s%s%s x %d): jansson %s", i, t[i].open, t[i].mid, t[i].close,
                     t[i].depth, ok ? "accepts" : "rejects");
    }
}

/* Values pinned by hand, so the test does not only compare two implementations. */
static void test_expected_values(void **state)
{
    (void)state;
    struct reqscan s;
    char err[128];
    const char *b = "{\"model\":\"llama\",\"stream\":true,\"max_tokens\":50,"
                    "\"prompt\":\"hello world\"}";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), 0);
    assert_int_equal(s.top, REQSCAN_OBJECT);
    assert_int_equal(s.stream, REQSCAN_TRUE);
    assert_int_equal(s.model, REQSCAN_STRING);
    assert_string_equal(s.model_name, "llama");
    assert_int_equal(s.prompt, REQSCAN_STRING);
    assert_int_equal(s.messages, REQSCAN_ABSENT);
    assert_int_equal(s.max_tokens, REQSCAN_INTEGER);
    assert_int_equal(s.max_tokens_value, 50);
    assert_int_equal(s.max_completion_tokens, REQSCAN_ABSENT);
    assert_int_equal(s.prompt_chars, 11);
    assert_int_equal(s.messages_chars, 0);
    assert_int_equal(reqscan_estimate_tokens(&s, true), 11 / 4 + 1);
    assert_int_equal(reqscan_estimate_tokens(&s, false), 11 / 4 + 1 + 50);
    reqscan_release(&s);

    b = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"abcd\"},"
        "{\"type\":\"image_url\"}]},{\"role\":\"assistant\",\"content\":\"xy\"}],"
        "\"max_completion_tokens\":10,\"max_tokens\":99,\"model\":\"caf\\u00e9\","
        "\"str\\u0065am\":false,\"stream\":null}";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), 0);
    assert_int_equal(s.messages, REQSCAN_ARRAY);
    assert_int_equal(s.messages_chars, 6);
    assert_int_equal(s.stream, REQSCAN_NULL); /* last duplicate wins */
    assert_string_equal(s.model_name, "caf\xc3\xa9");
    assert_int_equal(s.max_completion_tokens_value, 10);
    assert_int_equal(reqscan_estimate_tokens(&s, false), 6 / 4 + 1 + 10);
    reqscan_release(&s);

    b = "{\"prompt\":[1,2,3],\"model\":\"\\ud83d\\ude00\",\"max_tokens\":9223372036854775807,"
        "\"max_completion_tokens\":1.0}";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), 0);
    assert_int_equal(s.prompt_chars, 12);
    assert_string_equal(s.model_name, "\xf0\x9f\x98\x80");
    assert_int_equal(s.max_completion_tokens, REQSCAN_REAL);
    assert_true(s.max_tokens_value == INT64_MAX);
    assert_int_equal(reqscan_estimate_tokens(&s, false), 12 / 4 + 1 + (1 << 20));
    reqscan_release(&s);

    b = "{\"max_tokens\":-9223372036854775808,\"prompt\":[[[[[[[[[\"deep\"]]]]]]]]]}";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), 0);
    assert_true(s.max_tokens_value == INT64_MIN);
    assert_int_equal(s.prompt_chars, 0);
    assert_int_equal(reqscan_estimate_tokens(&s, false), 1);
    reqscan_release(&s);

    b = "[{\"model\":\"m\",\"max_tokens\":3}]";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), 0);
    assert_int_equal(s.top, REQSCAN_ARRAY);
    assert_int_equal(s.model, REQSCAN_ABSENT);
    assert_null(s.model_name);
    assert_int_equal(s.max_tokens, REQSCAN_ABSENT);
    assert_int_equal(reqscan_estimate_tokens(&s, false), 1 + 256);
    reqscan_release(&s);

    assert_int_equal(reqscan_parse("1e-400", 6, &s, err, sizeof(err)), 0);
    assert_int_equal(s.top, REQSCAN_REAL);
    reqscan_release(&s);
    assert_int_equal(reqscan_parse("-0", 2, &s, err, sizeof(err)), 0);
    assert_int_equal(s.top, REQSCAN_INTEGER);
    reqscan_release(&s);
}

static void test_errors(void **state)
{
    (void)state;
    struct reqscan s;
    char err[128];
    const char *b = "{\n  \"model\": \"m\",\n  \"prompt\": tru\n}";
    assert_int_equal(reqscan_parse(b, strlen(b), &s, err, sizeof(err)), -EINVAL);
    assert_true(strncmp(err, "invalid JSON at line 3 column ", 30) == 0);
    assert_null(s.model_name); /* the "m" already scanned is freed */
    reqscan_release(&s);
    reqscan_release(&s);

    /* a small buffer truncates, still terminated */
    char small[20];
    memset(small, 'x', sizeof(small));
    assert_int_equal(reqscan_parse("{", 1, &s, small, sizeof(small)), -EINVAL);
    assert_non_null(memchr(small, '\0', sizeof(small)));
    assert_true(strncmp(small, "invalid JSON at line", strlen(small)) == 0);
    assert_true(strlen(small) > 0);
}

static void test_large_body(void **state)
{
    (void)state;
    const size_t n = 1u << 20;
    const char head[] = "{\"model\":\"m\",\"prompt\":\"", tail[] = "\",\"max_tokens\":8}";
    size_t len = sizeof(head) - 1 + n + sizeof(tail) - 1;
    char *b = malloc(len);
    assert_non_null(b);
    memcpy(b, head, sizeof(head) - 1);
    for (size_t i = 0; i < n; i++)
        b[sizeof(head) - 1 + i] = (char)('a' + i % 26);
    memcpy(b + sizeof(head) - 1 + n, tail, sizeof(tail) - 1);
    struct reqscan s;
    char err[128];
    assert_int_equal(reqscan_parse(b, len, &s, err, sizeof(err)), 0);
    assert_int_equal(s.prompt_chars, n);
    assert_int_equal(reqscan_estimate_tokens(&s, false), (int64_t)(n / 4) + 1 + 8);
    reqscan_release(&s);
    assert_true(check_same(b, len));
    /* a 1 MiB model name is copied whole */
    memcpy(b, "{\"prompt\":1,\"model\":\"xx", sizeof(head) - 1); /* same length as head */
    assert_int_equal(reqscan_parse(b, len, &s, err, sizeof(err)), 0);
    assert_non_null(s.model_name);
    assert_int_equal(strlen(s.model_name), 2 + n);
    reqscan_release(&s);
    assert_true(check_same(b, len));
    free(b);
}

static void test_release_twice(void **state)
{
    (void)state;
    struct reqscan s;
    memset(&s, 0, sizeof(s));
    reqscan_release(&s); /* zeroed */
    char err[64];
    assert_int_equal(reqscan_parse("{\"model\":\"abc\"}", 15, &s, err, sizeof(err)), 0);
    assert_string_equal(s.model_name, "abc");
    reqscan_release(&s);
    assert_null(s.model_name);
    reqscan_release(&s);
}

/* The scanner reads plain ASCII eight bytes at a time: a byte that ends the plain run
 * (quote, backslash, control, non-ASCII) must be seen at every offset of the word, with
 * runs of every length before and after it. */
static void test_word_boundaries(void **state)
{
    (void)state;
    static const struct {
        const char *bytes;
        bool ok;
    } specials[] = {
        {"\"", false},       /* ends the prompt early: what follows is not JSON */
        {"\\n", true},       /* an escape */
        {"\\u00e9", true},   /* an escape that decodes to two bytes */
        {"\x01", false},     /* a control character */
        {"\x7f", true},      /* DEL is plain */
        {"\xc3\xa9", true},  /* é */
        {"\x80", false},     /* a lone continuation byte */
        {"\xe2\x82", false}, /* a cut sequence */
    };
    char body[128];
    for (size_t k = 0; k < sizeof(specials) / sizeof(specials[0]); k++) {
        for (int before = 0; before < 20; before++) {
            for (int after = 0; after < 12; after++) {
                int n = snprintf(body, sizeof(body), "{\"prompt\":\"%.*s%s%.*s\",\"model\":\"m\"}",
                                 before, "abcdefghijklmnopqrstuvwxyz", specials[k].bytes, after,
                                 "ABCDEFGHIJKLMNOPQRSTUVWXYZ");
                assert_true(n > 0 && (size_t)n < sizeof(body));
                bool ok = check_same(body, (size_t)n);
                if (ok != specials[k].ok)
                    fail_msg("special %zu at offset %d (+%d after): jansson %s", k, before, after,
                             ok ? "accepts" : "rejects");
            }
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),           cmocka_unit_test(test_invalid),
        cmocka_unit_test(test_truncated),       cmocka_unit_test(test_depth),
        cmocka_unit_test(test_expected_values), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_large_body),      cmocka_unit_test(test_release_twice),
        cmocka_unit_test(test_word_boundaries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
