#include "coordinator/sse.h"

#include <errno.h>
#include <string.h>

void sse_init(struct sse_parser *p, size_t max_line, size_t max_event)
{
    memset(p, 0, sizeof(*p));
    strbuf_init(&p->line, max_line);
    strbuf_init(&p->raw, max_event);
    strbuf_init(&p->data, max_event);
}

void sse_release(struct sse_parser *p)
{
    strbuf_release(&p->line);
    strbuf_release(&p->raw);
    strbuf_release(&p->data);
}

static int end_line(struct sse_parser *p, sse_event_cb cb, void *arg)
{
    const char *l = strbuf_str(&p->line);
    size_t n = p->line.len;
    int rc = 0;
    if (n == 0) {
        if (p->raw.len > 0) {
            size_t dl = p->data.len;
            /* The last data line's '\n' is not part of the data. */
            if (p->has_data && dl > 0)
                dl--;
            char *d = p->data.buf ? p->data.buf : (char *)"";
            char saved = d[dl];
            if (p->data.buf)
                d[dl] = '\0';
            p->events++;
            rc = cb(strbuf_str(&p->raw), p->raw.len, d, dl, p->has_data, arg);
            if (p->data.buf)
                d[dl] = saved;
        }
        strbuf_reset(&p->raw);
        strbuf_reset(&p->data);
        p->has_data = false;
        return rc;
    }
    if (l[0] == ':')
        return 0;
    const char *colon = memchr(l, ':', n);
    size_t fl = colon ? (size_t)(colon - l) : n;
    if (fl == 4 && memcmp(l, "data", 4) == 0) {
        const char *v = colon ? colon + 1 : l + n;
        if (v < l + n && *v == ' ')
            v++;
        if (strbuf_append(&p->data, v, (size_t)(l + n - v)) < 0 || strbuf_putc(&p->data, '\n') < 0)
            return -E2BIG;
        p->has_data = true;
    }
    /* event, id, retry and unknown fields stay in the raw bytes only. */
    return 0;
}

int sse_feed(struct sse_parser *p, const char *buf, size_t len, sse_event_cb cb, void *arg)
{
    while (len > 0) {
        if (p->cr_pending) {
            p->cr_pending = false;
            if (buf[0] == '\n') {
                if (strbuf_putc(&p->raw, '\n') < 0)
                    return -E2BIG;
                buf++;
                len--;
                continue;
            }
        }
        size_t i = 0;
        while (i < len && buf[i] != '\n' && buf[i] != '\r')
            i++;
        if (strbuf_append(&p->line, buf, i) < 0 || strbuf_append(&p->raw, buf, i) < 0)
            return -E2BIG;
        if (i == len)
            return 0;
        if (strbuf_putc(&p->raw, buf[i]) < 0)
            return -E2BIG;
        if (buf[i] == '\r')
            p->cr_pending = true;
        buf += i + 1;
        len -= i + 1;
        int rc = end_line(p, cb, arg);
        strbuf_reset(&p->line);
        if (rc)
            return rc;
    }
    return 0;
}

const char *sse_pending(const struct sse_parser *p, size_t *len)
{
    *len = p->raw.len;
    return strbuf_str(&p->raw);
}
