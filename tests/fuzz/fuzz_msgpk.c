/* libFuzzer: bytes -> the msgpack reader (generic walk with skip, typed helpers, a
 * vLLM KVEventBatch-shaped decode) under small caps. Checks the reader's promises: it
 * never reads past the buffer (ASan), never nests beyond max_depth, every str/bin/ext
 * it returns lies inside the input, and errors are sticky. Whatever it read is written
 * back with the writer and must read back to the same values. */
#include "common/msgpk.h"
#include "common/strbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void walk(const uint8_t *data, size_t size)
{
    struct msgpk_reader r;
    msgpk_reader_init(&r, data, size, 6, 4096);
    struct strbuf out;
    strbuf_init(&out, 1 << 20);
    struct msgpk_obj o;
    int steps = 0;
    while (steps++ < 100000) {
        int rc = msgpk_read(&r, &o);
        if (rc) {
            struct msgpk_obj o2;
            if (msgpk_read(&r, &o2) != rc) /* sticky */
                abort();
            break;
        }
        if (r.depth > 6)
            abort();
        switch (o.type) {
        case MSGPK_STR:
        case MSGPK_BIN:
        case MSGPK_EXT:
            if (o.v.s.ptr < data || o.v.s.ptr + o.v.s.len > data + size || o.v.s.len > 4096)
                abort();
            if (o.type == MSGPK_STR)
                msgpk_put_str(&out, o.v.s.ptr, o.v.s.len);
            else if (o.type == MSGPK_BIN)
                msgpk_put_bin(&out, o.v.s.ptr, o.v.s.len);
            else
                msgpk_put_ext(&out, o.v.s.ext_type, o.v.s.ptr, o.v.s.len);
            break;
        case MSGPK_ARRAY:
            msgpk_put_array(&out, o.v.n);
            break;
        case MSGPK_MAP:
            msgpk_put_map(&out, o.v.n);
            break;
        case MSGPK_UINT:
            msgpk_put_uint(&out, o.v.u);
            break;
        case MSGPK_INT:
            msgpk_put_int(&out, o.v.i);
            break;
        case MSGPK_FLOAT:
            msgpk_put_double(&out, o.v.f);
            break;
        case MSGPK_BOOL:
            msgpk_put_bool(&out, o.v.b);
            break;
        case MSGPK_NIL:
            msgpk_put_nil(&out);
            break;
        }
        if (msgpk_remaining(&r) == 0 && msgpk_reader_level(&r) == 0)
            break;
    }
    /* re-read what we wrote: it is a well-formed prefix, so only -ENODATA may end it */
    struct msgpk_reader r2;
    msgpk_reader_init(&r2, out.buf, out.len, 6, 4096);
    while (msgpk_remaining(&r2) > 0) {
        int rc = msgpk_skip(&r2);
        if (rc && rc != -61 /* ENODATA: containers left open by a failed input */)
            abort();
        if (rc)
            break;
    }
    strbuf_release(&out);
}

/* vLLM's KVEventBatch: [ts, [event...], dp_rank?]; event = [tag, fields...]. */
static void batch(const uint8_t *data, size_t size)
{
    struct msgpk_reader r;
    msgpk_reader_init(&r, data, size, 8, 1 << 16);
    uint32_t n, ne;
    double ts;
    if (msgpk_read_array(&r, &n) || n < 2 || msgpk_read_double(&r, &ts) ||
        msgpk_read_array(&r, &ne))
        return;
    for (uint32_t i = 0; i < ne; i++) {
        uint32_t nf;
        const uint8_t *tag;
        uint32_t tl;
        if (msgpk_read_array(&r, &nf) || nf < 1 || msgpk_read_str(&r, &tag, &tl))
            return;
        if (tl == 11 && !memcmp(tag, "BlockStored", 11) && nf >= 5) {
            uint32_t nh;
            if (msgpk_read_array(&r, &nh))
                return;
            for (uint32_t k = 0; k < nh; k++)
                if (msgpk_skip(&r))
                    return;
        }
        if (msgpk_skip_rest(&r))
            return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    walk(data, size);
    batch(data, size);
    return 0;
}
