/* cfgwatch: a write in place, a rename over the file and a Kubernetes-style `..data`
 * symlink swap each fire the callback once after the debounce; unrelated files in the
 * directory do not; the identity follows the file's content through symlinks; a
 * watched directory counts every entry; identity-only watches (fn NULL) never fire. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/cfgwatch.h"
#include "common/util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct fx {
    char dir[64];
    struct reactor *r;
    int fired;
};

static int setup(void **state)
{
    struct fx *f = xcalloc(1, sizeof(*f));
    snprintf(f->dir, sizeof(f->dir), "/tmp/motor-cfgwatch-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    f->r = reactor_new();
    assert_non_null(f->r);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    reactor_free(f->r);
    char *cmd = xasprintf("rm -rf '%s'", f->dir);
    assert_int_equal(system(cmd), 0);
    free(cmd);
    free(f);
    return 0;
}

static void on_fire(void *arg)
{
    ((struct fx *)arg)->fired++;
}

static void put(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

/* Run the loop until fired reaches want or ms pass; then a little longer to see that
 * nothing more comes (debounce: one callback per burst). */
static void run_until(struct fx *f, int want, int64_t ms)
{
    int64_t end = util_mono_ms() + ms;
    while (f->fired < want && util_mono_ms() < end)
        reactor_run_once(f->r, 20);
    int64_t quiet = util_mono_ms() + 3 * CFGWATCH_DEBOUNCE_MS;
    while (util_mono_ms() < quiet)
        reactor_run_once(f->r, 20);
}

static void test_file_changes(void **state)
{
    struct fx *f = *state;
    char *cfg = xasprintf("%s/user_config.json", f->dir);
    char *tmp = xasprintf("%s/user_config.json.new", f->dir);
    char *other = xasprintf("%s/unrelated.txt", f->dir);
    put(cfg, "{}");
    struct cfgwatch *w = cfgwatch_new(f->r, "config", 0, on_fire, f);
    const char *files[] = {cfg};
    assert_int_equal(cfgwatch_set(w, files, 1, NULL, 0), 0);
    assert_true(cfgwatch_active(w));
    assert_true(cfgwatch_changed(w)); /* never marked */
    cfgwatch_mark(w);
    assert_false(cfgwatch_changed(w));

    /* An unrelated file: nothing. */
    put(other, "x");
    run_until(f, 1, 300);
    assert_int_equal(f->fired, 0);

    /* In place, several writes: one callback. */
    put(cfg, "{\"a\":1}");
    put(cfg, "{\"a\":2}");
    run_until(f, 1, 3000);
    assert_int_equal(f->fired, 1);
    assert_true(cfgwatch_changed(w));
    cfgwatch_mark(w);

    /* Renamed over. */
    put(tmp, "{\"a\":3}");
    assert_int_equal(rename(tmp, cfg), 0);
    run_until(f, 2, 3000);
    assert_int_equal(f->fired, 2);
    assert_true(cfgwatch_changed(w));
    cfgwatch_mark(w);
    cfgwatch_free(w);
    free(cfg);
    free(tmp);
    free(other);
}

/* What a ConfigMap volume looks like: user_config.json -> ..data/user_config.json,
 * ..data -> ..2024_x (a directory); an update writes a new ..2024_y and swaps ..data. */
static void test_configmap_swap(void **state)
{
    struct fx *f = *state;
    char *v1 = xasprintf("%s/..v1", f->dir), *v2 = xasprintf("%s/..v2", f->dir);
    char *data = xasprintf("%s/..data", f->dir), *data_tmp = xasprintf("%s/..data_tmp", f->dir);
    char *cfg = xasprintf("%s/user_config.json", f->dir);
    assert_int_equal(mkdir(v1, 0755), 0);
    assert_int_equal(mkdir(v2, 0755), 0);
    char *f1 = xasprintf("%s/user_config.json", v1), *f2 = xasprintf("%s/user_config.json", v2);
    put(f1, "{\"v\":1}");
    put(f2, "{\"v\":2}");
    assert_int_equal(symlink("..v1", data), 0);
    assert_int_equal(symlink("..data/user_config.json", cfg), 0);

    struct cfgwatch *w = cfgwatch_new(f->r, "config", 0, on_fire, f);
    const char *files[] = {cfg};
    assert_int_equal(cfgwatch_set(w, files, 1, NULL, 0), 0);
    cfgwatch_mark(w);
    char *sig1 = cfgwatch_file_sig(cfg);

    assert_int_equal(symlink("..v2", data_tmp), 0);
    assert_int_equal(rename(data_tmp, data), 0); /* the atomic swap */
    run_until(f, 1, 3000);
    assert_int_equal(f->fired, 1);
    assert_true(cfgwatch_changed(w));
    char *sig2 = cfgwatch_file_sig(cfg);
    assert_string_not_equal(sig1, sig2); /* the file behind the links */
    cfgwatch_free(w);
    free(sig1);
    free(sig2);
    free(v1);
    free(v2);
    free(data);
    free(data_tmp);
    free(cfg);
    free(f1);
    free(f2);
}

static void test_dir_and_identity_only(void **state)
{
    struct fx *f = *state;
    char *m = xasprintf("%s/manifests", f->dir);
    assert_int_equal(mkdir(m, 0755), 0);
    struct cfgwatch *w = cfgwatch_new(f->r, "manifests", 0, on_fire, f);
    const char *dirs[] = {m};
    assert_int_equal(cfgwatch_set(w, NULL, 0, dirs, 1), 0);
    char *one = xasprintf("%s/a.json", m);
    put(one, "{}");
    run_until(f, 1, 3000);
    assert_int_equal(f->fired, 1);
    assert_int_equal(unlink(one), 0);
    run_until(f, 2, 3000);
    assert_int_equal(f->fired, 2);
    cfgwatch_free(w);

    /* fn NULL: the identity, no watch. */
    char *cfg = xasprintf("%s/c.json", f->dir);
    put(cfg, "{}");
    w = cfgwatch_new(f->r, "config", 0, NULL, NULL);
    const char *files[] = {cfg};
    assert_int_equal(cfgwatch_set(w, files, 1, NULL, 0), 0);
    assert_false(cfgwatch_active(w));
    cfgwatch_mark(w);
    unlink(cfg);
    assert_true(cfgwatch_changed(w)); /* now "missing" */
    put(cfg, "{}");
    run_until(f, 3, 300);
    assert_int_equal(f->fired, 2);
    cfgwatch_free(w);
    free(m);
    free(one);
    free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_file_changes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_configmap_swap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dir_and_identity_only, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
