/* util: number parsing, secrets, files, clocks. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct i64_case {
    const char *s;
    int64_t min, max;
    int rc;
    int64_t want;
};

static void test_parse_i64(void **state)
{
    (void)state;
    static const struct i64_case cases[] = {
        {"0", 0, 10, 0, 0},
        {"10", 0, 10, 0, 10},
        {"-5", -10, 10, 0, -5},
        {"+7", 0, 10, 0, 7},
        {"11", 0, 10, -ERANGE, 0},
        {"-1", 0, 10, -ERANGE, 0},
        {"9223372036854775807", INT64_MIN, INT64_MAX, 0, INT64_MAX},
        {"-9223372036854775808", INT64_MIN, INT64_MAX, 0, INT64_MIN},
        {"9223372036854775808", INT64_MIN, INT64_MAX, -ERANGE, 0},
        {"-9223372036854775809", INT64_MIN, INT64_MAX, -ERANGE, 0},
        {"99999999999999999999999", 0, 10, -ERANGE, 0},
        {"", 0, 10, -EINVAL, 0},
        {NULL, 0, 10, -EINVAL, 0},
        {"abc", 0, 10, -EINVAL, 0},
        {"5x", 0, 10, -EINVAL, 0},
        {"5 ", 0, 10, -EINVAL, 0},
        {" 5", 0, 10, -EINVAL, 0},
        {"\t5", 0, 10, -EINVAL, 0},
        {"\n5", 0, 10, -EINVAL, 0},
        {"0x10", 0, 100, -EINVAL, 0},
        {"1.0", 0, 10, -EINVAL, 0},
        {"1e3", 0, 10000, -EINVAL, 0},
        {"-", 0, 10, -EINVAL, 0},
        {"+", 0, 10, -EINVAL, 0},
        {"--1", -10, 10, -EINVAL, 0},
        {"007", 0, 10, 0, 7}, /* decimal, not octal */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct i64_case *c = &cases[i];
        int64_t out = 4242;
        print_message("i64 case %zu: %s\n", i, c->s ? c->s : "(null)");
        assert_int_equal(util_parse_i64(c->s, c->min, c->max, &out), c->rc);
        assert_true(out == (c->rc == 0 ? c->want : 4242)); /* untouched on error */
    }
}

static void test_parse_int(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int min, max, rc, want;
    } cases[] = {
        {"1026", 1, 65535, 0, 1026},
        {"65536", 1, 65535, -ERANGE, 0},
        {"0", 1, 65535, -ERANGE, 0},
        {"2147483647", INT32_MIN, INT32_MAX, 0, INT32_MAX},
        {"-2147483648", INT32_MIN, INT32_MAX, 0, INT32_MIN},
        {"2147483648", INT32_MIN, INT32_MAX, -ERANGE, 0},
        {"4294967297", INT32_MIN, INT32_MAX, -ERANGE, 0}, /* would wrap to 1 as int */
        {"x", 0, 1, -EINVAL, 0},
        {" 1", 0, 1, -EINVAL, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int out = 4242;
        print_message("int case %zu: %s\n", i, cases[i].s);
        assert_int_equal(util_parse_int(cases[i].s, cases[i].min, cases[i].max, &out), cases[i].rc);
        assert_int_equal(out, cases[i].rc == 0 ? cases[i].want : 4242);
    }
}

static void test_parse_double(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        double min, max;
        int rc;
        double want;
    } cases[] = {
        {"0.5", 0, 1, 0, 0.5},
        {"1", 0, 1, 0, 1},
        {"-0.25", -1, 1, 0, -0.25},
        {"1e-3", 0, 1, 0, 0.001},
        {"3600", 0.001, 3600, 0, 3600},
        {"3600.0001", 0.001, 3600, -ERANGE, 0},
        {"0.0001", 0.001, 3600, -ERANGE, 0},
        {"1e400", 0, INFINITY, -ERANGE, 0}, /* overflow is out of range, not junk */
        {"-1e400", -INFINITY, 0, -ERANGE, 0},
        {"inf", 0, INFINITY, -EINVAL, 0},
        {"-Infinity", -INFINITY, 0, -EINVAL, 0},
        {"nan", 0, 1, -EINVAL, 0},
        {"NAN", 0, 1, -EINVAL, 0},
        {"", 0, 1, -EINVAL, 0},
        {NULL, 0, 1, -EINVAL, 0},
        {"1.5x", 0, 2, -EINVAL, 0},
        {" 1", 0, 2, -EINVAL, 0},
        {"1 ", 0, 2, -EINVAL, 0},
        {"0x10", 0, 100, -EINVAL, 0}, /* hex floats are not decimal */
        {"-0x1p3", -100, 100, -EINVAL, 0},
        {".5", 0, 1, 0, 0.5},
        {"+2.", 0, 3, 0, 2},
        {".", 0, 1, -EINVAL, 0},
        {"e5", 0, 1, -EINVAL, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        double out = 42.0;
        print_message("double case %zu: %s\n", i, cases[i].s ? cases[i].s : "(null)");
        assert_int_equal(util_parse_double(cases[i].s, cases[i].min, cases[i].max, &out), cases[i].rc);
        assert_true(out == (cases[i].rc == 0 ? cases[i].want : 42.0));
    }
}

static void test_secret_equal(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        bool eq;
    } cases[] = {
        {"", "", true},
        {"s3cret", "s3cret", true},
        {"s3cret", "s3creT", false},
        {"s3cret", "s3cre", false},
        {"s3cre", "s3cret", false},
        {"", "x", false},
        {"x", "", false},
        {"a", "b", false},
        {NULL, "x", false},
        {"x", NULL, false},
        {NULL, NULL, false},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        print_message("secret case %zu\n", i);
        assert_int_equal(util_secret_equal(cases[i].a, cases[i].b), cases[i].eq);
    }
}

static void test_xasprintf_and_dup(void **state)
{
    (void)state;
    char *s = xasprintf("%s-%d-%05.1f", "a", -3, 2.25);
    assert_string_equal(s, "a--3-002.2");
    free(s);
    s = xasprintf("%s", "");
    assert_string_equal(s, "");
    free(s);
    char big[5000];
    memset(big, 'y', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    s = xasprintf("<%s>", big);
    assert_int_equal(strlen(s), sizeof(big) + 1);
    assert_int_equal(s[0], '<');
    assert_int_equal(s[sizeof(big)], '>');
    free(s);

    assert_null(xstrdup(NULL));
    s = xstrndup("abcdef", 3);
    assert_string_equal(s, "abc");
    free(s);
    s = xstrndup("ab", 10);
    assert_string_equal(s, "ab");
    free(s);
    void *p = xmalloc(0);
    assert_non_null(p);
    free(p);
}

static void test_clocks(void **state)
{
    (void)state;
    int64_t a = util_mono_ms(), b = util_mono_ms();
    assert_true(b >= a);
    assert_true(util_mono_us() / 1000 >= a);
    int64_t w = util_wall_ms();
    assert_true(w > 1600000000000LL); /* after 2020 */
    assert_true(llabs(w / 1000 - (int64_t)time(NULL)) <= 2);
}

static void test_wall_iso8601(void **state)
{
    (void)state;
    static const struct {
        int64_t ms;
        const char *want;
    } cases[] = {
        {0, "1970-01-01T00:00:00.000Z"},
        {1, "1970-01-01T00:00:00.001Z"},
        {999, "1970-01-01T00:00:00.999Z"},
        {1000, "1970-01-01T00:00:01.000Z"},
        {1795933711123LL, "2026-11-29T06:28:31.123Z"},
        {951782400000LL, "2000-02-29T00:00:00.000Z"}, /* leap day */
        {253402300799999LL, "9999-12-31T23:59:59.999Z"},
        {-1, "1969-12-31T23:59:59.999Z"}, /* before the epoch: no negative millis */
        {-1000, "1969-12-31T23:59:59.000Z"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char buf[40];
        memset(buf, 'Z', sizeof(buf));
        print_message("iso case %zu\n", i);
        util_wall_iso8601(cases[i].ms, buf, sizeof(buf));
        assert_string_equal(buf, cases[i].want);
    }
    /* The live clock renders in the same shape. */
    char buf[32];
    util_wall_iso8601(util_wall_ms(), buf, sizeof(buf));
    assert_int_equal(strlen(buf), 24);
    assert_int_equal(buf[4], '-');
    assert_int_equal(buf[10], 'T');
    assert_int_equal(buf[19], '.');
    assert_int_equal(buf[23], 'Z');
    /* A short buffer is truncated, never overrun. */
    char tiny[8];
    memset(tiny, 'x', sizeof(tiny));
    util_wall_iso8601(0, tiny, sizeof(tiny));
    assert_string_equal(tiny, "1970-01");
}

/* ---- files ---- */

static char tmpdir[64];

static int setup_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_util.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char *cmd = xasprintf("rm -rf '%s'", tmpdir);
    int rc = system(cmd);
    free(cmd);
    return rc == 0 ? 0 : -1;
}

/* Names in tmpdir other than `except`: must be none (no temp files left over). */
static int count_other_files(const char *except)
{
    DIR *d = opendir(tmpdir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, except)) {
            print_message("stray file: %s\n", de->d_name);
            n++;
        }
    }
    closedir(d);
    return n;
}

static void test_read_file(void **state)
{
    (void)state;
    char *path = xasprintf("%s/r.txt", tmpdir);
    static const char text[] = "hello\0world"; /* binary-safe */
    assert_int_equal(util_write_file_atomic(path, text, sizeof(text) - 1, 0600), 0);

    size_t len = 0;
    char *data = util_read_file(path, 100, &len);
    assert_non_null(data);
    assert_int_equal(len, sizeof(text) - 1);
    assert_memory_equal(data, text, len);
    assert_int_equal(data[len], '\0');
    free(data);

    /* Exactly at the cap is fine, one byte under is EFBIG. */
    data = util_read_file(path, sizeof(text) - 1, NULL);
    assert_non_null(data);
    free(data);
    errno = 0;
    assert_null(util_read_file(path, sizeof(text) - 2, &len));
    assert_int_equal(errno, EFBIG);

    /* Larger than the first read chunk. */
    size_t big = 100000;
    char *blob = xmalloc(big);
    for (size_t i = 0; i < big; i++)
        blob[i] = (char)('a' + i % 26);
    assert_int_equal(util_write_file_atomic(path, blob, big, 0600), 0);
    data = util_read_file(path, big, &len);
    assert_non_null(data);
    assert_int_equal(len, big);
    assert_memory_equal(data, blob, big);
    free(data);
    errno = 0;
    assert_null(util_read_file(path, big - 1, NULL));
    assert_int_equal(errno, EFBIG);
    free(blob);

    /* Empty file. */
    assert_int_equal(util_write_file_atomic(path, "", 0, 0600), 0);
    data = util_read_file(path, 0, &len);
    assert_non_null(data);
    assert_int_equal(len, 0);
    assert_string_equal(data, "");
    free(data);

    errno = 0;
    char *missing = xasprintf("%s/missing", tmpdir);
    assert_null(util_read_file(missing, 100, NULL));
    assert_int_equal(errno, ENOENT);
    free(missing);
    errno = 0;
    assert_null(util_read_file(tmpdir, 100, NULL));
    assert_int_equal(errno, EISDIR);
    assert_int_equal(unlink(path), 0);
    free(path);
}

static void test_write_file_atomic(void **state)
{
    (void)state;
    char *path = xasprintf("%s/state.json", tmpdir);
    assert_int_equal(util_write_file_atomic(path, "first version\n", 14, 0640), 0);
    /* Keep the old inode open: a replace-by-rename leaves it intact. */
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat before, after;
    assert_int_equal(fstat(fd, &before), 0);
    mode_t um = umask(0);
    umask(um);
    assert_int_equal(before.st_mode & 0777, 0640 & ~um);

    assert_int_equal(util_write_file_atomic(path, "second", 6, 0600), 0);
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_ino != before.st_ino);
    assert_int_equal(after.st_mode & 0777, 0600 & ~um);
    char old[32] = {0};
    assert_int_equal(read(fd, old, sizeof(old) - 1), 14);
    assert_string_equal(old, "first version\n");
    close(fd);

    size_t len;
    char *data = util_read_file(path, 100, &len);
    assert_non_null(data);
    assert_string_equal(data, "second");
    free(data);
    assert_int_equal(count_other_files("state.json"), 0);

    /* Failure (directory missing) leaves nothing behind and returns -errno. */
    char *bad = xasprintf("%s/no/such/dir", tmpdir);
    assert_int_equal(util_write_file_atomic(bad, "x", 1, 0600), -ENOENT);
    free(bad);
    /* Renaming over a directory fails: the temp file is removed, the target kept. */
    char *dirpath = xasprintf("%s/adir", tmpdir);
    assert_int_equal(mkdir(dirpath, 0700), 0);
    char *inner = xasprintf("%s/keep", dirpath);
    assert_int_equal(util_write_file_atomic(inner, "k", 1, 0600), 0);
    assert_true(util_write_file_atomic(dirpath, "x", 1, 0600) < 0);
    assert_int_equal(unlink(inner), 0);
    assert_int_equal(rmdir(dirpath), 0);
    assert_int_equal(count_other_files("state.json"), 0);
    free(inner);
    free(dirpath);
    assert_int_equal(unlink(path), 0);
    free(path);
}

/* Threads writing the same file concurrently: every result is one complete version. */
struct writer_arg {
    const char *path;
    char fill;
};

#define WRITE_SIZE 65536

static void *writer(void *p)
{
    struct writer_arg *a = p;
    char *buf = xmalloc(WRITE_SIZE);
    memset(buf, a->fill, WRITE_SIZE);
    for (int i = 0; i < 20; i++)
        if (util_write_file_atomic(a->path, buf, WRITE_SIZE, 0600) != 0)
            break;
    free(buf);
    return NULL;
}

static void test_write_file_atomic_threads(void **state)
{
    (void)state;
    char *path = xasprintf("%s/shared", tmpdir);
    pthread_t th[4];
    struct writer_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i].path = path;
        args[i].fill = (char)('A' + i);
        assert_int_equal(pthread_create(&th[i], NULL, writer, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    size_t len;
    char *data = util_read_file(path, WRITE_SIZE * 2, &len);
    assert_non_null(data);
    assert_int_equal(len, WRITE_SIZE);
    for (size_t i = 1; i < len; i++)
        if (data[i] != data[0])
            fail_msg("mixed content at %zu", i);
    free(data);
    assert_int_equal(count_other_files("shared"), 0);
    assert_int_equal(unlink(path), 0);
    free(path);
}

static void test_write_all(void **state)
{
    (void)state;
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(util_write_all(p[1], "abc", 3), 0);
    char buf[4] = {0};
    assert_int_equal(read(p[0], buf, 3), 3);
    assert_string_equal(buf, "abc");
    close(p[0]);
    close(p[1]);
    assert_int_equal(util_write_all(-1, "x", 1), -EBADF);
}

static void test_fmt_numbers(void **state)
{
    (void)state;
    char b[24];
    const uint64_t vals[] = {0, 7, 10, 255, 4096, 1234567890123ULL, UINT64_MAX};
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        char want[32];
        size_t n = util_fmt_u64(b, vals[i]);
        snprintf(want, sizeof(want), "%llu", (unsigned long long)vals[i]);
        assert_int_equal(n, strlen(want));
        assert_memory_equal(b, want, n);
        n = util_fmt_hex64(b, vals[i]);
        snprintf(want, sizeof(want), "%llx", (unsigned long long)vals[i]);
        assert_int_equal(n, strlen(want));
        assert_memory_equal(b, want, n);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fmt_numbers),
        cmocka_unit_test(test_parse_i64),
        cmocka_unit_test(test_parse_int),
        cmocka_unit_test(test_parse_double),
        cmocka_unit_test(test_secret_equal),
        cmocka_unit_test(test_xasprintf_and_dup),
        cmocka_unit_test(test_clocks),
        cmocka_unit_test(test_wall_iso8601),
        cmocka_unit_test(test_read_file),
        cmocka_unit_test(test_write_file_atomic),
        cmocka_unit_test(test_write_file_atomic_threads),
        cmocka_unit_test(test_write_all),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
