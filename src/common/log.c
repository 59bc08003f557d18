#include "common/log.h"

#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096

static _Atomic int g_level = LOG_INFO;
static const char *g_component = "motor";
static _Atomic int g_fd = STDERR_FILENO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(enum log_level level)
{
    g_level = level;
}

enum log_level log_get_level(void)
{
    return (enum log_level)g_level;
}

bool log_enabled(enum log_level level)
{
    return (int)level >= g_level;
}

int log_parse_level(const char *s, enum log_level *out)
{
    static const struct {
        const char *name;
        enum log_level level;
    } table[] = {{"debug", LOG_DEBUG}, {"info", LOG_INFO},   {"warn", LOG_WARN},
                 {"warning", LOG_WARN}, {"error", LOG_ERROR}, {"critical", LOG_ERROR}};
    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < ARRAY_LEN(table); i++) {
        if (strcasecmp(s, table[i].name) == 0) {
            *out = table[i].level;
            return 0;
        }
    }
    return -EINVAL;
}

void log_set_component(const char *component)
{
    g_component = component ? component : "motor";
}

void log_set_fd(int fd)
{
    g_fd = fd;
}

/* A bounded line writer. Pieces go in whole or not at all, so an escape or a UTF-8
 * sequence is never cut; LINE_RESERVE bytes stay free for closing a cut string ("...\"")
 * and the final "}\n", so the line is valid JSON whatever was dropped. */
struct line {
    char buf[LOG_LINE_MAX];
    size_t len;
    bool full;
};

#define LINE_RESERVE 16
#define LINE_LIMIT (LOG_LINE_MAX - LINE_RESERVE)

static bool put(struct line *l, const char *s, size_t n)
{
    if (l->full || n > LINE_LIMIT - l->len) {
        l->full = true;
        return false;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
    return true;
}

static bool puts_(struct line *l, const char *s)
{
    return put(l, s, strlen(s));
}

/* Append s as a JSON string. Returns false when nothing could be written (no room for
 * the opening quote); a string cut short is closed with "...\"" and returns true with
 * l->full set. Invalid UTF-8 bytes become \ufffd so the line stays parseable. */
static bool put_json_string(struct line *l, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    if (!put(l, "\"", 1))
        return false;
    const char *p = s;
    while (*p && !l->full) {
        unsigned char c = (unsigned char)*p;
        char esc[6];
        size_t n = 1;
        switch (c) {
        case '"':
            put(l, "\\\"", 2);
            break;
        case '\\':
            put(l, "\\\\", 2);
            break;
        case '\n':
            put(l, "\\n", 2);
            break;
        case '\r':
            put(l, "\\r", 2);
            break;
        case '\t':
            put(l, "\\t", 2);
            break;
        default:
            if (c < 0x20) {
                esc[0] = '\\';
                esc[1] = 'u';
                esc[2] = '0';
                esc[3] = '0';
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                put(l, esc, 6);
            } else if (c >= 0x80) {
                n = util_utf8_seq_len(p);
                if (n == 0) {
                    put(l, "\\ufffd", 6);
                    n = 1;
                } else {
                    put(l, p, n);
                }
            } else {
                put(l, p, 1);
            }
        }
        p += n;
    }
    if (!l->full && put(l, "\"", 1))
        return true;
    /* Cut: close from the reserve. */
    memcpy(l->buf + l->len, "...\"", 4);
    l->len += 4;
    return true;
}

void log_emit(enum log_level level, const char *event, const struct log_field *fields, size_t n)
{
    if (!log_enabled(level))
        return;
    struct line l;
    l.len = 0;
    l.full = false;
    char ts[40];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    puts_(&l, "{\"ts\":\"");
    puts_(&l, ts);
    puts_(&l, "\",\"level\":\"");
    puts_(&l, level_names[level < 0 || level > LOG_ERROR ? LOG_ERROR : level]);
    puts_(&l, "\",\"component\":");
    put_json_string(&l, g_component);
    puts_(&l, ",\"event\":");
    put_json_string(&l, event ? event : "");
    for (size_t i = 0; i < n && !l.full; i++) {
        const struct log_field *f = &fields[i];
        if (!f->key)
            continue;
        /* A field that does not fit is dropped whole (a cut key or number would be
         * misleading); only a string value may be cut. */
        size_t mark = l.len;
        char num[64];
        bool ok = puts_(&l, ",");
        if (ok)
            ok = put_json_string(&l, f->key) && !l.full;
        if (ok)
            ok = puts_(&l, ":");
        if (ok) {
            switch (f->type) {
            case LOG_FIELD_STR:
                ok = f->v.s ? put_json_string(&l, f->v.s) : puts_(&l, "null");
                break;
            case LOG_FIELD_INT:
                snprintf(num, sizeof(num), "%lld", f->v.i);
                ok = puts_(&l, num);
                break;
            case LOG_FIELD_DBL:
                if (isfinite(f->v.d))
                    snprintf(num, sizeof(num), "%.6g", f->v.d);
                else
                    snprintf(num, sizeof(num), "null");
                ok = puts_(&l, num);
                break;
            case LOG_FIELD_BOOL:
                ok = puts_(&l, f->v.b ? "true" : "false");
                break;
            case LOG_FIELD_RAW:
                /* Pre-rendered JSON is only safe whole. */
                if (!f->v.s || !puts_(&l, f->v.s)) {
                    l.full = false;
                    ok = puts_(&l, "null");
                }
                break;
            default:
                ok = puts_(&l, "null");
            }
        }
        if (!ok) {
            l.len = mark;
            l.full = true;
        }
    }
    memcpy(l.buf + l.len, "}\n", 2);
    l.len += 2;
    (void)util_write_all(g_fd, l.buf, l.len);
}
