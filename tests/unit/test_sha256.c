/* sha256: FIPS 180-4 / NIST test vectors, incremental updates split at every byte. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const uint8_t *d, char *out)
{
    for (int i = 0; i < SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void test_vectors(void **state)
{
    static const struct {
        const char *in, *out;
    } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++) {
        uint8_t d[SHA256_LEN];
        char h[65];
        sha256(v[k].in, strlen(v[k].in), d);
        hex(d, h);
        assert_string_equal(h, v[k].out);
        /* split at every byte */
        for (size_t cut = 0; cut <= strlen(v[k].in); cut++) {
            struct sha256 s;
            sha256_init(&s);
            sha256_update(&s, v[k].in, cut);
            sha256_update(&s, v[k].in + cut, strlen(v[k].in) - cut);
            sha256_final(&s, d);
            hex(d, h);
            assert_string_equal(h, v[k].out);
        }
    }
    /* one million 'a' */
    char *m = malloc(1000000);
    memset(m, 'a', 1000000);
    uint8_t d[SHA256_LEN];
    char h[65];
    sha256(m, 1000000, d);
    hex(d, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_vectors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
