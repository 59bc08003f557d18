#include "common/strbuf.h"

#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void strbuf_init(struct strbuf *sb, size_t max)
{
    memset(sb, 0, sizeof(*sb));
    sb->max = max ? max : 1;
}

void strbuf_release(struct strbuf *sb)
{
    if (!sb)
        return;
    free(sb->buf);
    size_t max = sb->max;
    memset(sb, 0, sizeof(*sb));
    sb->max = max;
}

void strbuf_reset(struct strbuf *sb)
{
    sb->len = 0;
    sb->overflow = false;
    if (sb->buf)
        sb->buf[0] = '\0';
}

static int reserve(struct strbuf *sb, size_t extra)
{
    if (extra > sb->max || sb->len > sb->max - extra) {
        sb->overflow = true;
        return -E2BIG;
    }
    size_t need = sb->len + extra + 1;
    if (need > sb->cap) {
        size_t cap = sb->cap ? sb->cap : 64;
        while (cap < need)
            cap *= 2;
        sb->buf = xrealloc(sb->buf, cap);
        sb->cap = cap;
    }
    return 0;
}

int strbuf_grow(struct strbuf *sb, size_t extra)
{
    if (extra > sb->max || sb->len > sb->max - extra)
        return -E2BIG;
    return reserve(sb, extra);
}

int strbuf_append(struct strbuf *sb, const void *data, size_t n)
{
    int rc = reserve(sb, n);
    if (rc)
        return rc;
    if (n)
        memcpy(sb->buf + sb->len, data, n);
    sb->len += n;
    sb->buf[sb->len] = '\0';
    return 0;
}

int strbuf_puts(struct strbuf *sb, const char *s)
{
    return strbuf_append(sb, s, strlen(s));
}

int strbuf_putc(struct strbuf *sb, char c)
{
    return strbuf_append(sb, &c, 1);
}

int strbuf_appendf(struct strbuf *sb, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0) {
        va_end(ap2);
        return -EINVAL;
    }
    int rc = reserve(sb, (size_t)len);
    if (rc == 0) {
        vsnprintf(sb->buf + sb->len, (size_t)len + 1, fmt, ap2);
        sb->len += (size_t)len;
    }
    va_end(ap2);
    return rc;
}

int strbuf_put_json_string(struct strbuf *sb, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    /* All or nothing: half a string literal would corrupt the document being built. */
    size_t start = sb->len;
    int rc = strbuf_putc(sb, '"');
    const char *p = s;
    while (rc == 0 && *p) {
        unsigned char c = (unsigned char)*p;
        switch (c) {
        case '"':
            rc = strbuf_append(sb, "\\\"", 2);
            break;
        case '\\':
            rc = strbuf_append(sb, "\\\\", 2);
            break;
        case '\n':
            rc = strbuf_append(sb, "\\n", 2);
            break;
        case '\r':
            rc = strbuf_append(sb, "\\r", 2);
            break;
        case '\t':
            rc = strbuf_append(sb, "\\t", 2);
            break;
        default:
            if (c < 0x20) {
                char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                rc = strbuf_append(sb, esc, sizeof(esc));
            } else if (c >= 0x80) {
                /* Strict parsers reject invalid UTF-8: replace each bad byte. */
                size_t n = util_utf8_seq_len(p);
                if (n == 0) {
                    rc = strbuf_append(sb, "\\ufffd", 6);
                } else {
                    rc = strbuf_append(sb, p, n);
                    p += n - 1;
                }
            } else {
                rc = strbuf_putc(sb, (char)c);
            }
        }
        p++;
    }
    if (rc == 0)
        rc = strbuf_putc(sb, '"');
    if (rc != 0 && sb->buf) {
        sb->len = start;
        sb->buf[start] = '\0';
    }
    return rc;
}

const char *strbuf_str(const struct strbuf *sb)
{
    return sb->buf ? sb->buf : "";
}

char *strbuf_take(struct strbuf *sb)
{
    char *p = sb->buf ? sb->buf : xstrdup("");
    size_t max = sb->max;
    memset(sb, 0, sizeof(*sb));
    sb->max = max;
    return p;
}

void strbuf_consume(struct strbuf *sb, size_t n)
{
    if (n >= sb->len) {
        strbuf_reset(sb);
        return;
    }
    memmove(sb->buf, sb->buf + n, sb->len - n);
    sb->len -= n;
    sb->buf[sb->len] = '\0';
}

int strbuf_put_u64(struct strbuf *sb, unsigned long long v)
{
    char d[20];
    return strbuf_append(sb, d, util_fmt_u64(d, v));
}
