/* msgpk: every type's encodings (spec byte strings, as msgpack-python writes them),
 * writer == reference bytes, reader round trips, truncation at every byte of every
 * case, hostile lengths and counts, depth caps, skip and the typed helpers. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/msgpk.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct vcase {
    const char *name;
    const char *bytes; /* reference encoding */
    size_t len;
    enum msgpk_type type;
    uint64_t u;
    int64_t i;
    double f;
    uint32_t n; /* str/bin/ext length or container count */
};

#define B(s) s, sizeof(s) - 1

static const struct vcase cases[] = {
    {"nil", B("\xc0"), MSGPK_NIL},
    {"false", B("\xc2"), MSGPK_BOOL, 0},
    {"true", B("\xc3"), MSGPK_BOOL, 1},
    {"fixint 0", B("\x00"), MSGPK_UINT, 0},
    {"fixint 127", B("\x7f"), MSGPK_UINT, 127},
    {"uint8 128", B("\xcc\x80"), MSGPK_UINT, 128},
    {"uint8 255", B("\xcc\xff"), MSGPK_UINT, 255},
    {"uint16 256", B("\xcd\x01\x00"), MSGPK_UINT, 256},
    {"uint32 65536", B("\xce\x00\x01\x00\x00"), MSGPK_UINT, 65536},
    {"uint64 2^32", B("\xcf\x00\x00\x00\x01\x00\x00\x00\x00"), MSGPK_UINT, 1ULL << 32},
    {"uint64 max", B("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), MSGPK_UINT, UINT64_MAX},
    {"negfixint -1", B("\xff"), MSGPK_INT, 0, -1},
    {"negfixint -32", B("\xe0"), MSGPK_INT, 0, -32},
    {"int8 -33", B("\xd0\xdf"), MSGPK_INT, 0, -33},
    {"int8 -128", B("\xd0\x80"), MSGPK_INT, 0, -128},
    {"int16 -129", B("\xd1\xff\x7f"), MSGPK_INT, 0, -129},
    {"int32 -32769", B("\xd2\xff\xff\x7f\xff"), MSGPK_INT, 0, -32769},
    {"int64 min", B("\xd3\x80\x00\x00\x00\x00\x00\x00\x00"), MSGPK_INT, 0, INT64_MIN},
    {"float32 1.5", B("\xca\x3f\xc0\x00\x00"), MSGPK_FLOAT, 0, 0, 1.5},
    {"float64 -2.25", B("\xcb\xc0\x02\x00\x00\x00\x00\x00\x00"), MSGPK_FLOAT, 0, 0, -2.25},
    {"fixstr empty", B("\xa0"), MSGPK_STR, 0, 0, 0, 0},
    {"fixstr abc", B("\xa3" "abc"), MSGPK_STR, 0, 0, 0, 3},
    {"bin8", B("\xc4\x02\x00\xff"), MSGPK_BIN, 0, 0, 0, 2},
    {"fixext1", B("\xd4\x05\x01"), MSGPK_EXT, 0, 0, 0, 1},
    {"fixext16", B("\xd8\xff" "0123456789abcdef"), MSGPK_EXT, 0, 0, 0, 16},
    {"ext8", B("\xc7\x03\x07" "xyz"), MSGPK_EXT, 0, 0, 0, 3},
    {"fixarray 0", B("\x90"), MSGPK_ARRAY, 0, 0, 0, 0},
    {"fixmap 0", B("\x80"), MSGPK_MAP, 0, 0, 0, 0},
};

static void check_value(const struct vcase *c, const struct msgpk_obj *o)
{
    assert_int_equal(o->type, c->type);
    switch (c->type) {
    case MSGPK_BOOL:
        assert_int_equal(o->v.b, c->u != 0);
        break;
    case MSGPK_UINT:
        assert_true(o->v.u == c->u);
        break;
    case MSGPK_INT:
        assert_true(o->v.i == c->i);
        break;
    case MSGPK_FLOAT:
        assert_true(o->v.f == c->f);
        break;
    case MSGPK_STR:
    case MSGPK_BIN:
    case MSGPK_EXT:
        assert_int_equal(o->v.s.len, c->n);
        break;
    case MSGPK_ARRAY:
    case MSGPK_MAP:
        assert_int_equal(o->v.n, c->n);
        break;
    default:
        break;
    }
}

static void test_read_every_type(void **state)
{
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct vcase *c = &cases[k];
        struct msgpk_reader r;
        msgpk_reader_init(&r, c->bytes, c->len, 0, 0);
        struct msgpk_obj o;
        assert_int_equal(msgpk_read(&r, &o), 0);
        check_value(c, &o);
        assert_int_equal(msgpk_remaining(&r), 0);
        /* truncated at every byte: -ENODATA, never a value */
        for (size_t cut = 0; cut < c->len; cut++) {
            msgpk_reader_init(&r, c->bytes, cut, 0, 0);
            assert_int_equal(msgpk_read(&r, &o), -ENODATA);
            /* sticky */
            assert_int_equal(msgpk_read(&r, &o), -ENODATA);
        }
    }
}

/* The writer produces exactly the reference bytes (shortest form). */
static void test_write_reference(void **state)
{
    struct strbuf sb;
    strbuf_init(&sb, 4096);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        const struct vcase *c = &cases[k];
        strbuf_reset(&sb);
        int rc = 0;
        switch (c->type) {
        case MSGPK_NIL:
            rc = msgpk_put_nil(&sb);
            break;
        case MSGPK_BOOL:
            rc = msgpk_put_bool(&sb, c->u != 0);
            break;
        case MSGPK_UINT:
            rc = msgpk_put_uint(&sb, c->u);
            break;
        case MSGPK_INT:
            rc = msgpk_put_int(&sb, c->i);
            break;
        case MSGPK_FLOAT:
            rc = c->bytes[0] == '\xca' ? msgpk_put_float(&sb, (float)c->f)
                                       : msgpk_put_double(&sb, c->f);
            break;
        case MSGPK_STR:
            rc = msgpk_put_str(&sb, c->bytes + 1, c->n);
            break;
        case MSGPK_BIN:
            rc = msgpk_put_bin(&sb, c->bytes + 2, c->n);
            break;
        case MSGPK_EXT: {
            size_t hdr = c->bytes[0] == '\xc7' ? 3 : 2;
            rc = msgpk_put_ext(&sb, (int8_t)c->bytes[hdr - 1], c->bytes + hdr, c->n);
            break;
        }
        case MSGPK_ARRAY:
            rc = msgpk_put_array(&sb, c->n);
            break;
        case MSGPK_MAP:
            rc = msgpk_put_map(&sb, c->n);
            break;
        }
        assert_int_equal(rc, 0);
        assert_int_equal(sb.len, c->len);
        assert_memory_equal(sb.buf, c->bytes, c->len);
    }
    /* signed non-negative values take the unsigned forms; boundaries of each width */
    static const struct {
        int64_t v;
        size_t len;
    } ints[] = {{0, 1},           {127, 1},       {128, 2},         {255, 2},
                {256, 3},         {65535, 3},     {65536, 5},       {4294967295LL, 5},
                {4294967296LL, 9}, {-1, 1},       {-32, 1},         {-33, 2},
                {-128, 2},        {-129, 3},      {-32768, 3},      {-32769, 5},
                {INT32_MIN, 5},   {(int64_t)INT32_MIN - 1, 9}, {INT64_MIN, 9}, {INT64_MAX, 9}};
    for (size_t k = 0; k < sizeof(ints) / sizeof(ints[0]); k++) {
        strbuf_reset(&sb);
        assert_int_equal(msgpk_put_int(&sb, ints[k].v), 0);
        assert_int_equal(sb.len, ints[k].len);
        struct msgpk_reader r;
        msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
        int64_t back;
        assert_int_equal(msgpk_read_i64(&r, &back), 0);
        assert_true(back == ints[k].v);
    }
    strbuf_release(&sb);
}

/* Strings, bins, arrays and maps at each header width, round-tripped. */
static void test_widths_round_trip(void **state)
{
    static const size_t lens[] = {0, 31, 32, 255, 256, 65535, 65536};
    char *data = malloc(70000);
    for (size_t i = 0; i < 70000; i++)
        data[i] = (char)('a' + i % 26);
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
        strbuf_reset(&sb);
        assert_int_equal(msgpk_put_str(&sb, data, lens[k]), 0);
        assert_int_equal(msgpk_put_bin(&sb, data, lens[k]), 0);
        assert_int_equal(msgpk_put_ext(&sb, -3, data, lens[k]), 0);
        struct msgpk_reader r;
        msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
        const uint8_t *p;
        uint32_t n;
        assert_int_equal(msgpk_read_str(&r, &p, &n), 0);
        assert_int_equal(n, lens[k]);
        if (lens[k])
            assert_memory_equal(p, data, lens[k]);
        assert_int_equal(msgpk_read_bin(&r, &p, &n), 0);
        assert_int_equal(n, lens[k]);
        struct msgpk_obj o;
        assert_int_equal(msgpk_read(&r, &o), 0);
        assert_int_equal(o.type, MSGPK_EXT);
        assert_int_equal(o.v.s.ext_type, -3);
        assert_int_equal(o.v.s.len, lens[k]);
        assert_int_equal(msgpk_remaining(&r), 0);
    }
    /* an array of 70000 small ints and a map of 20 pairs */
    strbuf_reset(&sb);
    assert_int_equal(msgpk_put_array(&sb, 70000), 0);
    for (int i = 0; i < 70000; i++)
        msgpk_put_uint(&sb, (uint64_t)i % 100);
    assert_int_equal(msgpk_put_map(&sb, 20), 0);
    for (int i = 0; i < 20; i++) {
        msgpk_put_cstr(&sb, "k");
        msgpk_put_int(&sb, -i);
    }
    struct msgpk_reader r;
    msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
    uint32_t n;
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 70000);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v;
        assert_int_equal(msgpk_read_u64(&r, &v), 0);
        assert_true(v == i % 100);
    }
    assert_int_equal(msgpk_reader_level(&r), 0);
    assert_int_equal(msgpk_read_map(&r, &n), 0);
    assert_int_equal(n, 20);
    assert_int_equal(msgpk_left(&r), 40);
    assert_int_equal(msgpk_skip_rest(&r), 0);
    assert_int_equal(msgpk_remaining(&r), 0);
    strbuf_release(&sb);
    free(data);
}

/* Declared lengths that the bytes cannot back, or beyond max_len, cost nothing. */
static void test_hostile_lengths(void **state)
{
    static const struct {
        const char *b;
        size_t len;
        int err;
    } bad[] = {
        {B("\xdb\xff\xff\xff\xff"), -ENODATA},         /* str32 of 4 GiB */
        {B("\xc6\x7f\xff\xff\xff" "x"), -ENODATA},     /* bin32 */
        {B("\xc9\xff\xff\xff\xff\x01"), -ENODATA},     /* ext32 */
        {B("\xdd\xff\xff\xff\xff\x00\x00"), -ENODATA}, /* array32 of 4G elements */
        {B("\xdd\x00\x00\x10\x00\x00\x00"), -ENODATA}, /* 4096 elements, 2 bytes */
        {B("\xdf\x00\x00\x00\x02\x00\x00\x00"), -ENODATA}, /* map: 4 items, 3 bytes */
        {B("\xc1"), -EBADMSG},
        {B("\xd9"), -ENODATA},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        struct msgpk_reader r;
        msgpk_reader_init(&r, bad[k].b, bad[k].len, 0, UINT32_MAX);
        struct msgpk_obj o;
        assert_int_equal(msgpk_read(&r, &o), bad[k].err);
    }
    /* max_len caps a string the buffer does hold */
    char buf[300];
    buf[0] = (char)0xd9;
    buf[1] = (char)200;
    memset(buf + 2, 'x', 200);
    struct msgpk_reader r;
    msgpk_reader_init(&r, buf, 202, 0, 100);
    struct msgpk_obj o;
    assert_int_equal(msgpk_read(&r, &o), -E2BIG);
    msgpk_reader_init(&r, buf, 202, 0, 200);
    assert_int_equal(msgpk_read(&r, &o), 0);
    /* and a count */
    msgpk_reader_init(&r, "\xdc\x00\x05\x01\x01\x01\x01\x01", 8, 0, 4);
    assert_int_equal(msgpk_read(&r, &o), -E2BIG);
}

static void test_depth(void **state)
{
    uint8_t deep[100];
    memset(deep, 0x91, sizeof(deep)); /* [[[[...]]]] */
    deep[99] = 0xc0;
    struct msgpk_reader r;
    msgpk_reader_init(&r, deep, sizeof(deep), 8, 0);
    assert_int_equal(msgpk_skip(&r), -ELOOP);
    msgpk_reader_init(&r, deep + 92, 8, 8, 0); /* 7 levels + nil: fine */
    assert_int_equal(msgpk_skip(&r), 0);
    assert_int_equal(msgpk_remaining(&r), 0);
    /* an empty container at the depth limit still counts */
    uint8_t e[] = {0x91, 0x91, 0x90};
    msgpk_reader_init(&r, e, sizeof(e), 2, 0);
    assert_int_equal(msgpk_skip(&r), -ELOOP);
    msgpk_reader_init(&r, e, sizeof(e), 3, 0);
    assert_int_equal(msgpk_skip(&r), 0);
}

static void test_typed_helpers(void **state)
{
    struct msgpk_reader r;
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    /* uint64 above INT64_MAX as int64: -ERANGE; negative as uint64: -ERANGE */
    msgpk_reader_init(&r, "\xcf\xff\xff\xff\xff\xff\xff\xff\xff", 9, 0, 0);
    assert_int_equal(msgpk_read_i64(&r, &i), -ERANGE);
    msgpk_reader_init(&r, "\xff", 1, 0, 0);
    assert_int_equal(msgpk_read_u64(&r, &u), -ERANGE);
    msgpk_reader_init(&r, "\x05", 1, 0, 0);
    assert_int_equal(msgpk_read_double(&r, &d), 0);
    assert_true(d == 5.0);
    msgpk_reader_init(&r, "\xa1x", 2, 0, 0);
    assert_int_equal(msgpk_read_bool(&r, &b), -EBADMSG);
    /* try_nil: consumes nil only */
    msgpk_reader_init(&r, "\xc0\x07", 2, 0, 0);
    assert_true(msgpk_try_nil(&r));
    assert_false(msgpk_try_nil(&r));
    assert_int_equal(msgpk_read_u64(&r, &u), 0);
    assert_true(u == 7);
    /* a vLLM-shaped batch: [ts, [["BlockStored", [h], nil, [1,2], 16, nil, "GPU"]], 0] */
    struct strbuf sb;
    strbuf_init(&sb, 4096);
    msgpk_put_array(&sb, 3);
    msgpk_put_double(&sb, 1.25);
    msgpk_put_array(&sb, 1);
    msgpk_put_array(&sb, 7);
    msgpk_put_cstr(&sb, "BlockStored");
    msgpk_put_array(&sb, 1);
    msgpk_put_bin(&sb, "\x01\x02", 2);
    msgpk_put_nil(&sb);
    msgpk_put_array(&sb, 2);
    msgpk_put_uint(&sb, 1);
    msgpk_put_uint(&sb, 2);
    msgpk_put_uint(&sb, 16);
    msgpk_put_nil(&sb);
    msgpk_put_cstr(&sb, "GPU");
    msgpk_put_uint(&sb, 0);
    msgpk_reader_init(&r, sb.buf, sb.len, 0, 0);
    uint32_t n;
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(msgpk_read_double(&r, &d), 0);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(msgpk_read_array(&r, &n), 0);
    assert_int_equal(n, 7);
    const uint8_t *p;
    uint32_t len;
    assert_int_equal(msgpk_read_str(&r, &p, &len), 0);
    assert_int_equal(len, 11);
    assert_int_equal(msgpk_reader_level(&r), 3);
    assert_int_equal(msgpk_skip_rest(&r), 0); /* the rest of the event */
    assert_int_equal(msgpk_read_u64(&r, &u), 0); /* data_parallel_rank */
    assert_int_equal(msgpk_remaining(&r), 0);
    /* truncated at every byte: some call fails with -ENODATA, none crashes */
    for (size_t cut = 0; cut < sb.len; cut++) {
        msgpk_reader_init(&r, sb.buf, cut, 0, 0);
        assert_int_equal(msgpk_skip(&r), -ENODATA);
    }
    strbuf_release(&sb);
}

static void test_writer_cap(void **state)
{
    struct strbuf sb;
    strbuf_init(&sb, 8);
    assert_int_equal(msgpk_put_str(&sb, "0123456789", 10), -E2BIG);
    assert_int_equal(sb.len, 0); /* all or nothing */
    assert_int_equal(msgpk_put_str(&sb, "0123456", 7), 0);
    assert_int_equal(sb.len, 8);
    strbuf_release(&sb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_every_type),   cmocka_unit_test(test_write_reference),
        cmocka_unit_test(test_widths_round_trip), cmocka_unit_test(test_hostile_lengths),
        cmocka_unit_test(test_depth),             cmocka_unit_test(test_typed_helpers),
        cmocka_unit_test(test_writer_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
