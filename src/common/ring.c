#include "common/ring.h"

#include "common/util.h"

#include <stdlib.h>
#include <string.h>

void ring_init(struct ring *r, size_t cap)
{
    memset(r, 0, sizeof(*r));
    r->cap = cap ? cap : 1;
    r->buf = xmalloc(r->cap);
}

void ring_release(struct ring *r)
{
    if (!r)
        return;
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

void ring_reset(struct ring *r)
{
    r->start = 0;
    r->len = 0;
    r->total = 0;
    r->head_partial = false;
}

void ring_write(struct ring *r, const void *data, size_t n)
{
    const char *p = data;
    if (n == 0 || r->cap == 0)
        return;
    r->total += n;
    if (n >= r->cap) {
        /* Only the newest cap bytes survive; what precedes them tells whether the
         * oldest kept byte starts a line. */
        size_t skip = n - r->cap;
        bool prev_nl = true; /* an empty ring: the stream starts here */
        if (skip)
            prev_nl = p[skip - 1] == '\n';
        else if (r->len)
            prev_nl = r->buf[(r->start + r->len - 1) % r->cap] == '\n';
        memcpy(r->buf, p + skip, r->cap);
        r->start = 0;
        r->len = r->cap;
        r->head_partial = !prev_nl;
        return;
    }
    size_t drop = r->len + n > r->cap ? r->len + n - r->cap : 0;
    if (drop) {
        r->head_partial = r->buf[(r->start + drop - 1) % r->cap] != '\n';
        r->start = (r->start + drop) % r->cap;
        r->len -= drop;
    }
    size_t end = (r->start + r->len) % r->cap;
    size_t first = MOTOR_MIN(n, r->cap - end);
    memcpy(r->buf + end, p, first);
    memcpy(r->buf, p + first, n - first);
    r->len += n;
}

size_t ring_len(const struct ring *r)
{
    return r->len;
}

uint64_t ring_total(const struct ring *r)
{
    return r->total;
}

size_t ring_copy(const struct ring *r, char *dst, size_t dst_cap, bool whole_lines)
{
    size_t skip = 0;
    if (whole_lines && r->head_partial) {
        /* Drop up to and including the first newline; no newline = one partial line,
         * which is all there is, so keep it. */
        for (size_t i = 0; i < r->len; i++) {
            if (r->buf[(r->start + i) % r->cap] == '\n') {
                skip = i + 1;
                break;
            }
        }
    }
    size_t n = r->len - skip;
    if (n > dst_cap) {
        skip += n - dst_cap;
        n = dst_cap;
    }
    size_t from = (r->start + skip) % (r->cap ? r->cap : 1);
    size_t first = MOTOR_MIN(n, r->cap - from);
    memcpy(dst, r->buf + from, first);
    memcpy(dst + first, r->buf, n - first);
    return n;
}

size_t ring_lines_start(const char *buf, size_t len, size_t nlines)
{
    if (nlines == 0)
        return len;
    size_t end = len;
    if (end && buf[end - 1] == '\n')
        end--; /* the final newline terminates the last line; it does not start one */
    size_t seen = 0;
    for (size_t i = end; i > 0; i--) {
        if (buf[i - 1] == '\n' && ++seen == nlines)
            return i;
    }
    return 0;
}

char *ring_tail(const struct ring *r, size_t nlines)
{
    char *buf = xmalloc(r->len + 1);
    size_t n = ring_copy(r, buf, r->len, true);
    size_t off = ring_lines_start(buf, n, nlines);
    memmove(buf, buf + off, n - off);
    buf[n - off] = '\0';
    return buf;
}
