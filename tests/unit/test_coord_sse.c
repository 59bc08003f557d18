/* SSE framing: events split at every byte boundary, line-end variants, caps. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/sse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct rec {
    char data[16][128];
    bool has[16];
    int n;
    struct strbuf raw;
};

static int on_event(const char *raw, size_t raw_len, const char *data, size_t data_len,
                    bool has_data, void *arg)
{
    struct rec *r = arg;
    assert_int_equal(strlen(data), data_len);
    if (r->n < 16) {
        snprintf(r->data[r->n], sizeof(r->data[0]), "%s", data);
        r->has[r->n] = has_data;
    }
    r->n++;
    strbuf_append(&r->raw, raw, raw_len);
    return 0;
}

static const char stream[] = ": ping\n\n"
                             "data: {\"a\":1}\n\n"
                             "event: x\r\ndata:two\r\ndata: lines\r\n\r\n"
                             "id: 7\rdata: cr\r\r"
                             "data: [DONE]\n\n";

static void check(struct rec *r)
{
    assert_int_equal(r->n, 5);
    assert_false(r->has[0]);
    assert_string_equal(r->data[1], "{\"a\":1}");
    assert_string_equal(r->data[2], "two\nlines");
    assert_string_equal(r->data[3], "cr");
    assert_string_equal(r->data[4], "[DONE]");
    /* the raw bytes of all events reproduce the stream */
    assert_int_equal(r->raw.len, sizeof(stream) - 1);
    assert_memory_equal(r->raw.buf, stream, sizeof(stream) - 1);
}

static void test_whole_and_split(void **state)
{
    (void)state;
    size_t len = sizeof(stream) - 1;
    /* every split point, and byte by byte */
    for (size_t cut = 0; cut <= len; cut++) {
        struct sse_parser p;
        struct rec r = {0};
        strbuf_init(&r.raw, 1 << 16);
        sse_init(&p, 256, 4096);
        assert_int_equal(sse_feed(&p, stream, cut, on_event, &r), 0);
        assert_int_equal(sse_feed(&p, stream + cut, len - cut, on_event, &r), 0);
        check(&r);
        sse_release(&p);
        strbuf_release(&r.raw);
    }
    struct sse_parser p;
    struct rec r = {0};
    strbuf_init(&r.raw, 1 << 16);
    sse_init(&p, 256, 4096);
    for (size_t i = 0; i < len; i++)
        assert_int_equal(sse_feed(&p, stream + i, 1, on_event, &r), 0);
    check(&r);
    sse_release(&p);
    strbuf_release(&r.raw);
}

static void test_pending_and_caps(void **state)
{
    (void)state;
    struct sse_parser p;
    struct rec r = {0};
    strbuf_init(&r.raw, 1 << 16);
    sse_init(&p, 16, 64);
    assert_int_equal(sse_feed(&p, "data: x\ndata: y", 15, on_event, &r), 0);
    assert_int_equal(r.n, 0);
    size_t n;
    const char *pend = sse_pending(&p, &n);
    assert_int_equal(n, 15);
    assert_memory_equal(pend, "data: x\ndata: y", 15);
    /* a line over 16 bytes */
    assert_int_equal(sse_feed(&p, "0123456789abcdef", 16, on_event, &r), -E2BIG);
    sse_release(&p);

    /* an event over 64 bytes made of short lines */
    sse_init(&p, 16, 64);
    int rc = 0;
    for (int i = 0; i < 20 && rc == 0; i++)
        rc = sse_feed(&p, "data: 0123456\n", 14, on_event, &r);
    assert_int_equal(rc, -E2BIG);
    sse_release(&p);
    strbuf_release(&r.raw);
}

static int stop_cb(const char *raw, size_t raw_len, const char *data, size_t data_len,
                   bool has_data, void *arg)
{
    (*(int *)arg)++;
    return 7;
}

static void test_callback_stops(void **state)
{
    (void)state;
    struct sse_parser p;
    sse_init(&p, 64, 64);
    int calls = 0;
    assert_int_equal(sse_feed(&p, "data: a\n\ndata: b\n\n", 18, stop_cb, &calls), 7);
    assert_int_equal(calls, 1);
    sse_release(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_and_split),
        cmocka_unit_test(test_pending_and_caps),
        cmocka_unit_test(test_callback_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
