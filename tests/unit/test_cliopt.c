/* cliopt: typed destinations, range errors, help, stray arguments, config path order. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/cliopt.h"

#include <stdlib.h>
#include <string.h>

static int usage_calls;
static void usage(FILE *out)
{
    (void)out;
    usage_calls++;
}

struct args {
    const char *config, *name;
    int port;
    int64_t big;
    double secs;
    bool flag;
};

static int parse(struct args *a, int argc, const char **argv)
{
    const struct cliopt opts[] = {
        {"config", 'c', CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"name", 0, CLIOPT_STRING, &a->name, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &a->port, 0, 65535, "0-65535"},
        {"big", 0, CLIOPT_I64, &a->big, 0, 1e12, NULL},
        {"secs", 0, CLIOPT_DOUBLE, &a->secs, 0.1, 600, NULL},
        {"flag", 0, CLIOPT_FLAG, &a->flag, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    return cliopt_parse("motor test", argc, (char **)argv, opts, usage);
}

static void test_every_kind_is_stored(void **state)
{
    (void)state;
    struct args a = {.port = -1};
    const char *argv[] = {"test", "-c", "f.json", "--name=x", "--port", "8080", "--big",
                          "5000000000", "--secs", "2.5", "--flag", NULL};
    assert_int_equal(parse(&a, 11, argv), 0);
    assert_string_equal(a.config, "f.json");
    assert_string_equal(a.name, "x");
    assert_int_equal(a.port, 8080);
    assert_true(a.big == 5000000000LL);
    assert_true(a.secs == 2.5);
    assert_true(a.flag);
}

static void test_defaults_untouched(void **state)
{
    (void)state;
    struct args a = {.port = -1, .secs = 7};
    const char *argv[] = {"test", NULL};
    assert_int_equal(parse(&a, 1, argv), 0);
    assert_int_equal(a.port, -1);
    assert_true(a.secs == 7);
    assert_null(a.config);
}

static void test_out_of_range_and_junk_are_usage_errors(void **state)
{
    (void)state;
    const char *bad[][3] = {{"test", "--port", "65536"}, {"test", "--port", "12x"},
                            {"test", "--secs", "0"},     {"test", "--big", "-1"},
                            {"test", "--secs", "nan"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct args a = {.port = -1};
        const char *argv[] = {bad[i][0], bad[i][1], bad[i][2], NULL};
        assert_int_equal(parse(&a, 3, argv), 2);
    }
}

static void test_help_unknown_and_stray(void **state)
{
    (void)state;
    struct args a = {0};
    usage_calls = 0;
    const char *help[] = {"test", "--help", NULL};
    assert_int_equal(parse(&a, 2, help), 1);
    const char *h[] = {"test", "-h", NULL};
    assert_int_equal(parse(&a, 2, h), 1);
    assert_int_equal(usage_calls, 2);
    const char *unknown[] = {"test", "--nope", NULL};
    assert_int_equal(parse(&a, 2, unknown), 2);
    assert_int_equal(usage_calls, 3);
    const char *stray[] = {"test", "--flag", "extra", NULL};
    assert_int_equal(parse(&a, 3, stray), 2);
    const char *missing[] = {"test", "--port", NULL};
    assert_int_equal(parse(&a, 2, missing), 2);
}

static void test_config_path_order(void **state)
{
    (void)state;
    unsetenv("USER_CONFIG_PATH");
    unsetenv("CONFIG_PATH");
    assert_null(cliopt_config_path(NULL));
    assert_null(cliopt_config_path(""));
    setenv("CONFIG_PATH", "/b", 1);
    assert_string_equal(cliopt_config_path(NULL), "/b");
    setenv("USER_CONFIG_PATH", "/a", 1);
    assert_string_equal(cliopt_config_path(""), "/a");
    assert_string_equal(cliopt_config_path("/flag"), "/flag");
    setenv("USER_CONFIG_PATH", "", 1);
    assert_string_equal(cliopt_config_path(NULL), "/b");
    unsetenv("USER_CONFIG_PATH");
    unsetenv("CONFIG_PATH");
}

static void test_log_level(void **state)
{
    (void)state;
    assert_int_equal(cliopt_log_level("motor test", NULL), 0);
    assert_int_equal(cliopt_log_level("motor test", "debug"), 0);
    assert_int_equal(cliopt_log_level("motor test", "loud"), 2);
    assert_int_equal(cliopt_log_level("motor test", "info"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind_is_stored),
        cmocka_unit_test(test_defaults_untouched),
        cmocka_unit_test(test_out_of_range_and_junk_are_usage_errors),
        cmocka_unit_test(test_help_unknown_and_stray),
        cmocka_unit_test(test_config_path_order),
        cmocka_unit_test(test_log_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
