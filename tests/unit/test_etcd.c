/* common/etcd: the gateway's bodies and answers (base64 keys, range_end of a prefix, the
 * first record of a range, a txn's verdict, the lock's guard). The client and the lock
 * run against a real etcd in test_controller_store.py and test_coordinator_ha.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/etcd.h"
#include "unit_helpers.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static char *b64(const char *s)
{
    return etcd_b64_encode(s, strlen(s));
}

static void test_range_body(void **state)
{
    (void)state;
    json_t *b = etcd_range_body("/a/", true);
    char *k = b64("/a/"), *e = b64("/a0"); /* '/' + 1 = '0' */
    assert_string_equal(json_string_value(json_object_get(b, "key")), k);
    assert_string_equal(json_string_value(json_object_get(b, "range_end")), e);
    json_decref(b);
    b = etcd_range_body("/x", false);
    assert_null(json_object_get(b, "range_end"));
    json_decref(b);
    free(k);
    free(e);
}

static void test_range_first(void **state)
{
    (void)state;
    char *v = b64("{\"version\":3}");
    char *text = xasprintf("{\"kvs\":[{\"key\":\"eA==\",\"value\":\"%s\",\"mod_revision\":\"42\","
                           "\"lease\":\"7587862\"}],\"count\":\"1\"}",
                           v);
    json_t *body = json_loads(text, 0, NULL);
    char *value;
    int64_t rev;
    char lease[32];
    assert_int_equal(etcd_range_first(body, &value, &rev, lease, sizeof(lease)), 1);
    assert_string_equal(value, "{\"version\":3}");
    assert_int_equal(rev, 42);
    assert_string_equal(lease, "7587862");
    free(value);
    json_decref(body);
    /* absent key: zero fields omitted by the gateway */
    body = J("{'header':{'revision':'9'}}");
    assert_int_equal(etcd_range_first(body, &value, &rev, lease, sizeof(lease)), 0);
    assert_null(value);
    assert_string_equal(lease, "");
    json_decref(body);
    /* not a range answer; a value that is not base64 */
    body = J("{'kvs':3}");
    assert_int_equal(etcd_range_first(body, &value, NULL, NULL, 0), -EIO);
    json_decref(body);
    body = J("{'kvs':[{'key':'eA==','value':'!!!'}]}");
    assert_int_equal(etcd_range_first(body, &value, NULL, NULL, 0), -EIO);
    json_decref(body);
    free(v);
    free(text);
}

static void test_txn(void **state)
{
    (void)state;
    json_t *ok = J("{'succeeded':true}"), *ko = J("{'header':{}}");
    assert_true(etcd_txn_succeeded(ok));
    assert_false(etcd_txn_succeeded(ko)); /* false is omitted */
    json_decref(ok);
    json_decref(ko);
    json_t *put = etcd_op_put("/k", "v", "123");
    json_t *rp = json_object_get(put, "request_put");
    char *k = b64("/k");
    assert_string_equal(json_string_value(json_object_get(rp, "key")), k);
    assert_string_equal(json_string_value(json_object_get(rp, "lease")), "123");
    json_decref(put);
    put = etcd_op_put("/k", "v", NULL);
    assert_null(json_object_get(json_object_get(put, "request_put"), "lease"));
    json_decref(put);
    json_t *t = etcd_txn_body(json_array(), json_array(), NULL);
    assert_non_null(json_object_get(t, "compare"));
    assert_null(json_object_get(t, "failure"));
    json_decref(t);
    free(k);
}

static void test_b64(void **state)
{
    (void)state;
    const char *v[] = {"", "f", "fo", "foo", "foob", "/motor/controller/leader"};
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        char *e = b64(v[i]);
        size_t n;
        char *d = etcd_b64_decode(e, &n);
        assert_non_null(d);
        assert_int_equal(n, strlen(v[i]));
        assert_string_equal(d, v[i]);
        free(e);
        free(d);
    }
    assert_null(etcd_b64_decode("abc", NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_range_body),
        cmocka_unit_test(test_range_first),
        cmocka_unit_test(test_txn),
        cmocka_unit_test(test_b64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
