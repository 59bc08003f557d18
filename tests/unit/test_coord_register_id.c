/* motor register: endpoint group parsing and the instance id formula. Expected values
 * were computed independently with Python's zlib.crc32. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cli/register.h"

#include <stdlib.h>
#include <string.h>

static void test_crc32_known(void **state)
{
    (void)state;
    assert_int_equal(register_crc32("123456789", 9), 0xcbf43926u);
    assert_int_equal(register_crc32("", 0), 0);
    assert_int_equal(register_crc32("prefill|127.0.0.1:8000", 22), 0x48d34932u);
}

static const struct {
    const char *role;
    const char *spec;
    int64_t id;
} id_cases[] = {
    {"prefill", "127.0.0.1:8000", 1221806386},
    {"decode", "10.0.0.2:9000,10.0.0.1:9000", 1099448691},
    {"decode", "10.0.0.1:9000, 10.0.0.2:9000", 1099448691},
    /* sorted by integer port: 80 before 8000, 9000 before 10000 */
    {"prefill", "10.0.0.1:8000,10.0.0.1:80", 1512857104},
    {"prefill", "127.0.0.1:10000,127.0.0.1:9000", 1367903807},
    {"union", "127.0.0.1:10000", 1767831180},
};

static void test_id_formula(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(id_cases) / sizeof(id_cases[0]); i++) {
        struct register_ep *eps;
        size_t n;
        char err[128];
        assert_int_equal(register_parse_group(id_cases[i].spec, &eps, &n, err, sizeof(err)), 0);
        int64_t id = register_instance_id(id_cases[i].role, eps, n);
        if (id != id_cases[i].id)
            fail_msg("case %zu: got %lld want %lld", i, (long long)id, (long long)id_cases[i].id);
        assert_true(id >= 0x40000000 && id <= 0x7fffffff);
        register_eps_free(eps, n);
    }
}

static void test_parse_group(void **state)
{
    (void)state;
    struct register_ep *eps;
    size_t n;
    char err[128];
    assert_int_equal(register_parse_group("[::1]:8000,127.0.0.1:7", &eps, &n, err, sizeof(err)), 0);
    assert_int_equal(n, 2);
    assert_string_equal(eps[0].ip, "127.0.0.1");
    assert_int_equal(eps[0].port, 7);
    assert_string_equal(eps[1].ip, "::1");
    assert_int_equal(eps[1].port, 8000);
    register_eps_free(eps, n);

    static const char *bad[] = {
        "",    "127.0.0.1", "127.0.0.1:",    "127.0.0.1:0", "127.0.0.1:65536",
        ":80", "a:1,a:1",   "127.0.0.1:80,", "h:x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        if (register_parse_group(bad[i], &eps, &n, err, sizeof(err)) != -22)
            fail_msg("'%s' accepted", bad[i]);
        assert_true(err[0] != 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32_known),
        cmocka_unit_test(test_id_formula),
        cmocka_unit_test(test_parse_group),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
