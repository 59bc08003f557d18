/* log: every line is one valid JSON object of bounded size, whatever the input. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int pipefd[2] = {-1, -1};

static int setup(void **state)
{
    (void)state;
    if (pipe2(pipefd, O_NONBLOCK | O_CLOEXEC) != 0)
        return -1;
    /* Room for many long lines without blocking the writer. */
    (void)fcntl(pipefd[1], F_SETPIPE_SZ, 1 << 20);
    log_set_fd(pipefd[1]);
    log_set_level(LOG_DEBUG);
    log_set_component("test-comp");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    log_set_fd(STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    return 0;
}

/* Everything written so far (heap, NUL-terminated; "" when nothing). */
static char *drain(void)
{
    size_t cap = 8192, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (cap - len < 4096) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        ssize_t r = read(pipefd[0], buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    buf[len] = '\0';
    return buf;
}

/* Exactly one line: a JSON object of at most 4096 bytes including the newline. */
static json_t *one_line(void)
{
    char *text = drain();
    size_t len = strlen(text);
    if (len == 0)
        fail_msg("no log line written");
    assert_true(len <= 4096);
    assert_int_equal(text[len - 1], '\n');
    assert_ptr_equal(strchr(text, '\n'), text + len - 1);
    json_error_t err;
    json_t *obj = json_loadb(text, len, 0, &err);
    if (!obj)
        fail_msg("not JSON (%s at column %d): %s", err.text, err.column, text);
    assert_true(json_is_object(obj));
    free(text);
    return obj;
}

static void test_basic_fields(void **state)
{
    (void)state;
    log_info("engine_spawned", LF_INT("endpoint_id", 3), LF_INT("pid", -42),
             LF_STR("name", "vllm"), LF_STR("nothing", NULL), LF_DBL("ratio", 0.25),
             LF_DBL("bad", NAN), LF_BOOL("ok", true), LF_RAW("obj", "{\"a\":[1,2]}"),
             LF_INT("big", INT64_MIN));
    json_t *o = one_line();
    const char *ts = json_string_value(json_object_get(o, "ts"));
    assert_non_null(ts);
    assert_int_equal(strlen(ts), 24); /* 2026-11-30T06:28:31.123Z */
    assert_int_equal(ts[10], 'T');
    assert_int_equal(ts[23], 'Z');
    assert_string_equal(json_string_value(json_object_get(o, "level")), "info");
    assert_string_equal(json_string_value(json_object_get(o, "component")), "test-comp");
    assert_string_equal(json_string_value(json_object_get(o, "event")), "engine_spawned");
    assert_int_equal(json_integer_value(json_object_get(o, "endpoint_id")), 3);
    assert_int_equal(json_integer_value(json_object_get(o, "pid")), -42);
    assert_string_equal(json_string_value(json_object_get(o, "name")), "vllm");
    assert_true(json_is_null(json_object_get(o, "nothing")));
    assert_true(json_real_value(json_object_get(o, "ratio")) == 0.25);
    assert_true(json_is_null(json_object_get(o, "bad")));
    assert_true(json_is_true(json_object_get(o, "ok")));
    assert_int_equal(json_integer_value(json_array_get(
                         json_object_get(json_object_get(o, "obj"), "a"), 1)),
                     2);
    assert_true(json_integer_value(json_object_get(o, "big")) == INT64_MIN);
    /* Field order: the fixed keys first. */
    const char *key;
    json_t *v;
    const char *want[] = {"ts", "level", "component", "event", "endpoint_id"};
    size_t i = 0;
    json_object_foreach(o, key, v)
    {
        if (i < ARRAY_LEN(want))
            assert_string_equal(key, want[i]);
        i++;
    }
    json_decref(o);
}

static void test_zero_fields(void **state)
{
    (void)state;
    log_info("x");
    json_t *o = one_line();
    assert_string_equal(json_string_value(json_object_get(o, "event")), "x");
    assert_int_equal(json_object_size(o), 4);
    json_decref(o);
}

static void test_level_filtering(void **state)
{
    (void)state;
    static const struct {
        enum log_level threshold;
        bool debug, info, warn, error;
    } cases[] = {
        {LOG_DEBUG, true, true, true, true},
        {LOG_INFO, false, true, true, true},
        {LOG_WARN, false, false, true, true},
        {LOG_ERROR, false, false, false, true},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        log_set_level(cases[i].threshold);
        assert_int_equal(log_get_level(), cases[i].threshold);
        assert_int_equal(log_enabled(LOG_INFO), cases[i].info);
        log_debug("d");
        log_info("i");
        log_warn("w");
        log_error("e");
        char *text = drain();
        assert_int_equal(strstr(text, "\"event\":\"d\"") != NULL, cases[i].debug);
        assert_int_equal(strstr(text, "\"event\":\"i\"") != NULL, cases[i].info);
        assert_int_equal(strstr(text, "\"event\":\"w\"") != NULL, cases[i].warn);
        assert_int_equal(strstr(text, "\"event\":\"e\"") != NULL, cases[i].error);
        if (cases[i].warn)
            assert_non_null(strstr(text, "\"level\":\"warn\""));
        if (cases[i].debug)
            assert_non_null(strstr(text, "\"level\":\"debug\""));
        assert_non_null(strstr(text, "\"level\":\"error\""));
        free(text);
    }
    log_set_level(LOG_DEBUG);
}

static void test_parse_level(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int rc;
        enum log_level want;
    } cases[] = {
        {"debug", 0, LOG_DEBUG},  {"DEBUG", 0, LOG_DEBUG},   {"info", 0, LOG_INFO},
        {"Info", 0, LOG_INFO},    {"warn", 0, LOG_WARN},     {"warning", 0, LOG_WARN},
        {"WARNING", 0, LOG_WARN}, {"error", 0, LOG_ERROR},   {"ERROR", 0, LOG_ERROR},
        {"", -EINVAL, 0},         {"verbose", -EINVAL, 0},   {"info ", -EINVAL, 0},
        {NULL, -EINVAL, 0},       {"inf", -EINVAL, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        enum log_level out = (enum log_level)99;
        print_message("level case %zu: %s\n", i, cases[i].s ? cases[i].s : "(null)");
        assert_int_equal(log_parse_level(cases[i].s, &out), cases[i].rc);
        if (cases[i].rc == 0)
            assert_int_equal(out, cases[i].want);
        else
            assert_int_equal(out, 99);
    }
}

static void test_escaping(void **state)
{
    (void)state;
    const char *nasty = "q\"b\\n\nr\rt\tc\x01\x1f del\x7f é \xe2\x82\xac";
    log_warn("ev\"il\n", LF_STR("k\"ey", nasty));
    json_t *o = one_line();
    assert_string_equal(json_string_value(json_object_get(o, "event")), "ev\"il\n");
    assert_string_equal(json_string_value(json_object_get(o, "k\"ey")), nasty);
    json_decref(o);

    /* Invalid UTF-8 must not make the line unparseable. */
    log_info("bad_utf8", LF_STR("v", "a\xff\xfe" "b\xc3"), LF_STR("w", "\xe2\x82"));
    o = one_line();
    const char *v = json_string_value(json_object_get(o, "v"));
    assert_non_null(v);
    assert_int_equal(v[0], 'a');
    assert_non_null(strchr(v, 'b'));
    json_decref(o);
}

static void test_long_value_truncated(void **state)
{
    (void)state;
    char *big = xmalloc(10 * 1024 + 1);
    memset(big, 'x', 10 * 1024);
    big[10 * 1024] = '\0';
    log_info("long", LF_INT("before", 1), LF_STR("v", big), LF_INT("after", 2));
    json_t *o = one_line();
    const char *v = json_string_value(json_object_get(o, "v"));
    assert_non_null(v);
    assert_true(strlen(v) > 3000);
    assert_true(strlen(v) < 4096);
    assert_int_equal(json_integer_value(json_object_get(o, "before")), 1);
    json_decref(o);
    free(big);
}

/* Cut points land everywhere: inside escapes, multi-byte characters, keys and numbers.
 * Every line must stay valid JSON and within 4096 bytes. */
static void test_truncation_boundaries(void **state)
{
    (void)state;
    static const char *const units[] = {"\x01", "\"", "\\", "\xc3\xa9", "\xe2\x82\xac",
                                        "\xf0\x9f\x98\x80", "a"};
    for (size_t u = 0; u < ARRAY_LEN(units); u++) {
        for (size_t pad = 3950; pad < 4100; pad += 7) {
            /* A prefix shifts the cut point through every position of the unit. */
            size_t ulen = strlen(units[u]);
            size_t n = pad + 2000 * ulen;
            char *s = xmalloc(n + 1);
            memset(s, 'p', pad);
            for (size_t i = pad; i + ulen <= n; i += ulen)
                memcpy(s + i, units[u], ulen);
            s[n - (n - pad) % ulen] = '\0';
            log_info("cut", LF_STR("v", s + 3900), LF_INT("n", 123456789));
            json_decref(one_line());
            /* The same text as a key, followed by values of every type. */
            log_info("cut", LF_STR(s + (pad - 3900), "x"));
            json_decref(one_line());
            log_info("cut", LF_STR("pad", s + 3960), LF_INT(s + 3990, 1234567890123LL));
            json_decref(one_line());
            log_info("cut", LF_STR("pad", s + 3960), LF_BOOL(s + 4000, true));
            json_decref(one_line());
            log_info("cut", LF_STR("pad", s + 3960), LF_DBL("d", 1.5), LF_BOOL("b", false));
            json_decref(one_line());
            log_info(s + 3000, LF_RAW("raw", "{\"a\":1}"));
            json_decref(one_line());
            free(s);
        }
    }
}

/* Pre-rendered JSON too long for the line becomes null; later fields still appear. */
static void test_raw_too_long(void **state)
{
    (void)state;
    size_t n = 6000;
    char *raw = xmalloc(n + 1);
    raw[0] = '[';
    for (size_t i = 1; i < n - 1; i += 2) {
        raw[i] = '1';
        raw[i + 1] = ',';
    }
    raw[n - 2] = '1';
    raw[n - 1] = ']';
    raw[n] = '\0';
    json_t *check = json_loads(raw, 0, NULL);
    assert_non_null(check); /* the input itself is valid JSON */
    json_decref(check);
    log_info("raw", LF_RAW("big", raw), LF_RAW("small", "[1]"), LF_INT("after", 5));
    json_t *o = one_line();
    assert_true(json_is_null(json_object_get(o, "big")));
    assert_int_equal(json_array_size(json_object_get(o, "small")), 1);
    assert_int_equal(json_integer_value(json_object_get(o, "after")), 5);
    json_decref(o);
    free(raw);
}

static void test_many_fields_bounded(void **state)
{
    (void)state;
    struct log_field f[400];
    char keys[400][16];
    for (int i = 0; i < 400; i++) {
        snprintf(keys[i], sizeof(keys[i]), "key_%d", i);
        f[i] = LF_BOOL(keys[i], true);
    }
    log_emit(LOG_INFO, "many", f, 400);
    json_t *o = one_line();
    assert_true(json_object_size(o) > 100);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_fields),
        cmocka_unit_test(test_zero_fields),
        cmocka_unit_test(test_level_filtering),
        cmocka_unit_test(test_parse_level),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_long_value_truncated),
        cmocka_unit_test(test_truncation_boundaries),
        cmocka_unit_test(test_raw_too_long),
        cmocka_unit_test(test_many_fields_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
