/* libFuzzer: an upstream SSE byte stream, split at fuzzer-chosen points, through the
 * coordinator's SSE framing parser and the internal-field filter. Checks: the raw bytes
 * of the dispatched events plus the pending tail reproduce the input exactly (the proxy
 * forwards them unchanged), data is terminated, and the filter strips what it finds. */
#include "common/strbuf.h"
#include "coordinator/pdreq.h"
#include "coordinator/sse.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int on_event(const char *raw, size_t raw_len, const char *data, size_t data_len,
                    bool has_data, void *arg)
{
    struct strbuf *out = arg;
    if (data[data_len] != '\0') /* data may hold NULs; it is always terminated */
        abort();
    strbuf_append(out, raw, raw_len);
    if (has_data && pdreq_has_internal(data, data_len)) {
        json_t *j = json_loadb(data, data_len, 0, NULL);
        if (j) {
            pdreq_strip_response(j);
            if (json_object_get(j, "kv_transfer_params"))
                abort();
            json_decref(j);
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = (size_t)data[0] % 17 + 1; /* chunk size chosen by the input */
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    struct sse_parser sp;
    sse_init(&sp, 512, 4096);
    struct strbuf out;
    strbuf_init(&out, 1 << 20);
    int rc = 0;
    for (size_t off = 0; off < n && rc == 0; off += step)
        rc = sse_feed(&sp, p + off, off + step > n ? n - off : step, on_event, &out);
    if (rc == 0) {
        size_t pl;
        const char *pend = sse_pending(&sp, &pl);
        strbuf_append(&out, pend, pl);
        if (out.len != n || memcmp(out.buf ? out.buf : "", p, n) != 0)
            abort();
    } else if (rc != -E2BIG) {
        abort();
    }
    strbuf_release(&out);
    sse_release(&sp);
    return 0;
}
