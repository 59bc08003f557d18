/* dynlib: all-or-nothing symbol tables, remembered failures, clear messages. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/dynlib.h"

#include <errno.h>
#include <string.h>

static const char *const libm_names[] = {"libm.so.6", NULL};
static const char *const missing_names[] = {"libmotor-does-not-exist.so.1", "libnor-this.so", NULL};

struct math_api {
    double (*cos)(double);
    double (*sqrt)(double);
};
static const char *const math_symbols[] = {"cos", "sqrt"};

static void test_loads_and_resolves(void **state)
{
    (void)state;
    static struct math_api api;
    static struct dynlib lib = DYNLIB_INIT("libm", libm_names, math_symbols, &api);
    assert_false(dynlib_loaded(&lib));
    assert_int_equal(dynlib_load(&lib), 0);
    assert_true(dynlib_loaded(&lib));
    assert_true(api.sqrt(16.0) == 4.0);
    assert_true(api.cos(0.0) == 1.0);
    assert_int_equal(dynlib_load(&lib), 0); /* idempotent */
    assert_string_equal(dynlib_error(&lib), "");
}

static void test_missing_library_is_reported(void **state)
{
    (void)state;
    static struct math_api api;
    static struct dynlib lib = DYNLIB_INIT("libnothing", missing_names, math_symbols, &api);
    assert_int_equal(dynlib_load(&lib), -ENOENT);
    assert_false(dynlib_loaded(&lib));
    assert_non_null(strstr(dynlib_error(&lib), "libnothing is not available"));
    assert_int_equal(dynlib_load(&lib), -ENOENT); /* remembered, same answer */
    assert_null(api.cos);
}

static void test_missing_symbol_leaves_table_empty(void **state)
{
    (void)state;
    static struct {
        double (*cos)(double);
        void (*nope)(void);
    } api;
    static const char *const symbols[] = {"cos", "motor_no_such_function"};
    static struct dynlib lib = DYNLIB_INIT("libm", libm_names, symbols, &api);
    assert_int_equal(dynlib_load(&lib), -ENOSYS);
    assert_non_null(strstr(dynlib_error(&lib), "motor_no_such_function"));
    assert_null(api.cos); /* all or nothing */
    assert_false(dynlib_loaded(&lib));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loads_and_resolves),
        cmocka_unit_test(test_missing_library_is_reported),
        cmocka_unit_test(test_missing_symbol_leaves_table_empty),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
