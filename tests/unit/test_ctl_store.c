/* Controller store: SQLite backend (put/del/coalescing/reload across reopen, WAL file,
 * leadership through the lock file between two stores), memory backend, base64. The
 * etcd backend is exercised by the integration tests against a real etcd. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/etcd.h"
#include "controller/store.h"
#include "common/reactor.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct probe {
    int leader_calls;
    bool leader;
    bool loaded;
    int err;
    char *dump; /* "k=v;" sorted as the backend returns them */
};

static void on_leader(struct store *st, bool leader, void *arg)
{
    (void)st;
    struct probe *p = arg;
    p->leader_calls++;
    p->leader = leader;
}

static void on_load(struct store *st, int err, const struct store_kv *kvs, size_t n, void *arg)
{
    (void)st;
    struct probe *p = arg;
    p->loaded = true;
    p->err = err;
    size_t cap = 1;
    for (size_t i = 0; i < n; i++)
        cap += strlen(kvs[i].key) + strlen(kvs[i].value) + 2;
    free(p->dump);
    p->dump = xcalloc(cap, 1);
    for (size_t i = 0; i < n; i++) {
        strncat(p->dump, kvs[i].key, cap - strlen(p->dump) - 1);
        strncat(p->dump, "=", cap - strlen(p->dump) - 1);
        strncat(p->dump, kvs[i].value, cap - strlen(p->dump) - 1);
        strncat(p->dump, ";", cap - strlen(p->dump) - 1);
    }
}

static void spin(struct reactor *r, bool *flag, int ms)
{
    int64_t end = util_mono_ms() + ms;
    while (!*flag && util_mono_ms() < end)
        reactor_run_once(r, 10);
}

static struct store *open_sqlite(struct reactor *r, const char *path, const char *owner)
{
    struct store_opts o = {
        .backend = STORE_SQLITE, .sqlite_path = path, .owner = owner, .retry_ms = 50};
    char err[256] = "";
    struct store *st = store_open(r, &o, err, sizeof(err));
    if (!st)
        fail_msg("open: %s", err);
    return st;
}

static char *tmpdir(void)
{
    char tmpl[] = "/tmp/motor-ctl-store-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return xstrdup(d);
}

static void rmrf(const char *dir)
{
    char *cmd = xasprintf("rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", dir);
    free(cmd);
}

static void test_sqlite_roundtrip(void **state)
{
    (void)state;
    char *dir = tmpdir();
    char *path = xasprintf("%s/c.db", dir);
    struct reactor *r = reactor_new();
    struct store *st = open_sqlite(r, path, "one");
    struct probe p = {0};
    store_campaign(st, on_leader, &p);
    spin(r, &p.leader, 1000);
    assert_true(p.leader);
    assert_true(store_is_leader(st));
    store_put(st, "instances/1", "{\"a\":1}");
    store_put(st, "instances/2", "two");
    store_put(st, "meta/next_id", "3");
    store_put(st, "instances/2", "TWO");
    store_del(st, "instances/1");
    assert_int_equal(store_pending(st), 0); /* sqlite completes synchronously */
    struct store_stats ss;
    store_get_stats(st, &ss);
    assert_true(ss.writes_ok >= 4);
    assert_int_equal(ss.writes_failed, 0);
    store_load(st, on_load, &p);
    spin(r, &p.loaded, 1000);
    assert_true(p.loaded);
    assert_int_equal(p.err, 0);
    assert_string_equal(p.dump, "instances/2=TWO;meta/next_id=3;");
    store_free(st);
    /* WAL mode leaves its side file while open; reopen and read everything back. */
    struct store *again = open_sqlite(r, path, "two");
    struct probe q = {0};
    store_campaign(again, on_leader, &q);
    spin(r, &q.leader, 1000);
    assert_true(q.leader);
    store_load(again, on_load, &q);
    spin(r, &q.loaded, 1000);
    assert_string_equal(q.dump, "instances/2=TWO;meta/next_id=3;");
    store_free(again);
    free(p.dump);
    free(q.dump);
    reactor_free(r);
    rmrf(dir);
    free(path);
    free(dir);
}

static void test_sqlite_leadership(void **state)
{
    (void)state;
    char *dir = tmpdir();
    char *path = xasprintf("%s/c.db", dir);
    struct reactor *r = reactor_new();
    struct store *a = open_sqlite(r, path, "controller-a");
    struct store *b = open_sqlite(r, path, "controller-b");
    struct probe pa = {0}, pb = {0};
    store_campaign(a, on_leader, &pa);
    spin(r, &pa.leader, 1000);
    assert_true(pa.leader);
    store_campaign(b, on_leader, &pb);
    /* b keeps retrying while a holds the lock. */
    int64_t end = util_mono_ms() + 300;
    while (util_mono_ms() < end)
        reactor_run_once(r, 10);
    assert_false(pb.leader);
    assert_string_equal(store_leader_owner(b), "controller-a");
    /* a goes away: b takes over. */
    store_free(a);
    spin(r, &pb.leader, 2000);
    assert_true(pb.leader);
    assert_int_equal(pb.leader_calls, 1);
    store_free(b);
    reactor_free(r);
    rmrf(dir);
    free(path);
    free(dir);
}

static void test_sqlite_bad_path(void **state)
{
    (void)state;
    struct reactor *r = reactor_new();
    struct store_opts o = {.backend = STORE_SQLITE, .sqlite_path = "/nonexistent-dir/x/c.db"};
    char err[256] = "";
    assert_null(store_open(r, &o, err, sizeof(err)));
    assert_non_null(strstr(err, "sqlite"));
    reactor_free(r);
}

static void test_memory(void **state)
{
    (void)state;
    struct reactor *r = reactor_new();
    struct store_opts o = {.backend = STORE_MEMORY};
    char err[64];
    struct store *st = store_open(r, &o, err, sizeof(err));
    struct probe p = {0};
    store_campaign(st, on_leader, &p);
    spin(r, &p.leader, 500);
    store_put(st, "a", "1");
    store_put(st, "b", "2");
    store_del(st, "a");
    store_load(st, on_load, &p);
    spin(r, &p.loaded, 500);
    assert_string_equal(p.dump, "b=2;");
    free(p.dump);
    store_free(st);
    reactor_free(r);
}

static void test_base64(void **state)
{
    (void)state;
    static const struct {
        const char *plain, *enc;
    } v[] = {{"", ""},
             {"f", "Zg=="},
             {"fo", "Zm8="},
             {"foo", "Zm9v"},
             {"foob", "Zm9vYg=="},
             {"/motor/controller/leader", "L21vdG9yL2NvbnRyb2xsZXIvbGVhZGVy"}};
    for (size_t i = 0; i < ARRAY_LEN(v); i++) {
        char *e = etcd_b64_encode(v[i].plain, strlen(v[i].plain));
        assert_string_equal(e, v[i].enc);
        size_t n;
        char *d = etcd_b64_decode(e, &n);
        assert_non_null(d);
        assert_int_equal(n, strlen(v[i].plain));
        assert_memory_equal(d, v[i].plain, n);
        free(e);
        free(d);
    }
    assert_null(etcd_b64_decode("abc", NULL));
    assert_null(etcd_b64_decode("a=bc", NULL));
    assert_null(etcd_b64_decode("ab!c", NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sqlite_roundtrip), cmocka_unit_test(test_sqlite_leadership),
        cmocka_unit_test(test_sqlite_bad_path),  cmocka_unit_test(test_memory),
        cmocka_unit_test(test_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
