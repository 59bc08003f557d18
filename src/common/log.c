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

/* A bounded line writer: appends until the cap, then silently drops the rest; `full`
 * tells the caller the line was cut so it can close the JSON object cleanly. */
struct line {
    char buf[LOG_LINE_MAX];
    size_t len;
    bool full;
};

/* Room kept at the end for `..."}` + newline when a value is cut. */
#define LINE_RESERVE 16

static void put(struct line *l, const char *s, size_t n)
{
    size_t room = sizeof(l->buf) - LINE_RESERVE - l->len;
    if (n > room) {
        n = room;
        l->full = true;
    }
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void puts_(struct line *l, const char *s)
{
    put(l, s, strlen(s));
}

static void put_json_string(struct line *l, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    put(l, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p && !l->full; p++) {
        char esc[6];
        switch (*p) {
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
            if (*p < 0x20) {
                esc[0] = '\\';
                esc[1] = 'u';
                esc[2] = '0';
                esc[3] = '0';
                esc[4] = hex[*p >> 4];
                esc[5] = hex[*p & 15];
                put(l, esc, 6);
            } else {
                put(l, (const char *)p, 1);
            }
        }
    }
    if (l->full) {
        /* Never leave half a UTF-8 sequence or escape behind: back up to a safe point. */
        while (l->len > 0 && ((unsigned char)l->buf[l->len - 1] & 0xC0) == 0x80)
            l->len--;
        if (l->len > 0 && ((unsigned char)l->buf[l->len - 1] & 0x80))
            l->len--;
        size_t bs = 0;
        while (bs < l->len && l->buf[l->len - 1 - bs] == '\\')
            bs++;
        if (bs % 2)
            l->len--;
        memcpy(l->buf + l->len, "...\"", 4);
        l->len += 4;
        return;
    }
    put(l, "\"", 1);
}

void log_emit(enum log_level level, const char *event, const struct log_field *fields, size_t n)
{
    if (!log_enabled(level))
        return;
    struct line l;
    l.len = 0;
    l.full = false;
    char ts[40];
    wall_iso8601(wall_ms(), ts, sizeof(ts));
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
        char num[64];
        puts_(&l, ",");
        put_json_string(&l, f->key);
        puts_(&l, ":");
        switch (f->type) {
        case LOG_FIELD_STR:
            if (f->v.s)
                put_json_string(&l, f->v.s);
            else
                puts_(&l, "null");
            break;
        case LOG_FIELD_INT:
            snprintf(num, sizeof(num), "%lld", f->v.i);
            puts_(&l, num);
            break;
        case LOG_FIELD_DBL:
            if (isfinite(f->v.d))
                snprintf(num, sizeof(num), "%.6g", f->v.d);
            else
                snprintf(num, sizeof(num), "null");
            puts_(&l, num);
            break;
        case LOG_FIELD_BOOL:
            puts_(&l, f->v.b ? "true" : "false");
            break;
        case LOG_FIELD_RAW:
            /* Pre-rendered JSON is only safe whole: cut => replaced by null. */
            if (f->v.s && strlen(f->v.s) < sizeof(l.buf) - LINE_RESERVE - l.len)
                puts_(&l, f->v.s);
            else
                puts_(&l, "null");
            break;
        default:
            puts_(&l, "null");
        }
    }
    memcpy(l.buf + l.len, "}\n", 2);
    l.len += 2;
    (void)write_all(g_fd, l.buf, l.len);
}
