/* list: insert/remove order, self-linked removal (twice is harmless), safe walks that
 * free, splice, and the zeroed-node rule. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/list.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct item {
    int v;
    struct list_head link;
};

/* The values of l in order, as a string "1,2,3". */
static void values(const struct list_head *l, char *out, size_t cap)
{
    size_t off = 0;
    out[0] = '\0';
    const struct list_head *p;
    list_for_each(p, l)
    {
        const struct item *it = list_entry(p, struct item, link);
        off += (size_t)snprintf(out + off, cap - off, "%s%d", off ? "," : "", it->v);
    }
}

static void test_order(void **state)
{
    (void)state;
    struct list_head l = LIST_INIT(l);
    struct item a = {.v = 1}, b = {.v = 2}, c = {.v = 3};
    char buf[64];
    assert_true(list_empty(&l));
    assert_null(list_first(&l));
    assert_null(list_last(&l));
    list_insert_tail(&l, &b.link);
    list_insert_tail(&l, &c.link);
    list_insert_head(&l, &a.link);
    values(&l, buf, sizeof(buf));
    assert_string_equal(buf, "1,2,3");
    assert_int_equal(list_count(&l), 3);
    assert_ptr_equal(list_first(&l), &a.link);
    assert_ptr_equal(list_last(&l), &c.link);
    assert_true(list_linked(&b.link));

    list_remove(&b.link);
    assert_false(list_linked(&b.link));
    values(&l, buf, sizeof(buf));
    assert_string_equal(buf, "1,3");
    list_remove(&b.link); /* twice: no effect on the list */
    values(&l, buf, sizeof(buf));
    assert_string_equal(buf, "1,3");
    list_remove(&a.link);
    list_remove(&c.link);
    assert_true(list_empty(&l));
    assert_int_equal(list_count(&l), 0);
}

static void test_zeroed_node(void **state)
{
    (void)state;
    struct item z;
    memset(&z, 0, sizeof(z));
    assert_false(list_linked(&z.link));
    list_remove(&z.link); /* a never-linked node: harmless, leaves it self-linked */
    assert_ptr_equal(z.link.next, &z.link);
    struct list_head l = LIST_INIT(l);
    list_insert_tail(&l, &z.link);
    assert_true(list_linked(&z.link));
    assert_int_equal(list_count(&l), 1);
}

static void test_safe_walk_frees(void **state)
{
    (void)state;
    struct list_head l;
    list_init(&l);
    for (int i = 0; i < 10; i++) {
        struct item *it = calloc(1, sizeof(*it));
        it->v = i;
        list_insert_tail(&l, &it->link);
    }
    struct list_head *p, *t;
    list_for_each_safe(p, t, &l)
    {
        struct item *it = list_entry(p, struct item, link);
        if (it->v % 2) {
            list_remove(p);
            free(it);
        }
    }
    char buf[64];
    values(&l, buf, sizeof(buf));
    assert_string_equal(buf, "0,2,4,6,8");
    list_for_each_safe(p, t, &l)
    {
        list_remove(p);
        free(list_entry(p, struct item, link));
    }
    assert_true(list_empty(&l));
}

static void test_splice(void **state)
{
    (void)state;
    struct list_head a = LIST_INIT(a), b = LIST_INIT(b);
    struct item x[4] = {{.v = 1}, {.v = 2}, {.v = 3}, {.v = 4}};
    list_insert_tail(&a, &x[0].link);
    list_insert_tail(&b, &x[1].link);
    list_insert_tail(&b, &x[2].link);
    list_splice_tail(&a, &b);
    assert_true(list_empty(&b));
    list_splice_tail(&a, &b); /* empty source: nothing changes */
    list_insert_tail(&a, &x[3].link);
    char buf[64];
    values(&a, buf, sizeof(buf));
    assert_string_equal(buf, "1,2,3,4");
    /* splice into an empty list */
    list_splice_tail(&b, &a);
    values(&b, buf, sizeof(buf));
    assert_string_equal(buf, "1,2,3,4");
    assert_true(list_empty(&a));
    assert_ptr_equal(list_last(&b), &x[3].link);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_zeroed_node),
        cmocka_unit_test(test_safe_walk_frees),
        cmocka_unit_test(test_splice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
