#include "coordinator/reqscan.h"

#include "common/util.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jansson's own limit, so a body accepted here is never refused by the PD re-parse:
 * every value, scalars included, counts one level, the top-level value being level 1. */
#define REQSCAN_MAX_DEPTH JSON_PARSER_MAX_DEPTH
/* pdreq content_chars: values deeper than this under "prompt"/"messages" count 0. */
#define REQSCAN_COUNT_DEPTH 8
/* Keys we look for are short; a longer (escaped) key cannot be one of them. */
#define REQSCAN_KEY_MAX 32

struct scan {
    const unsigned char *p, *end, *start;
    int depth;
    const char *why;
    const unsigned char *err_at;
};

/* A scanned value: its type and, for strings and integers, where/what it is. */
struct val {
    enum reqscan_type type;
    const unsigned char *raw; /* string: the bytes between the quotes */
    size_t raw_len;
    size_t len;   /* string: bytes after unescaping */
    bool escaped; /* string: contains a backslash */
    int64_t ival;
};

static int fail(struct scan *s, const unsigned char *at, const char *why)
{
    if (!s->why) {
        s->why = why;
        s->err_at = at;
    }
    return -1;
}

static inline void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t'))
        s->p++;
}

static int hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t utf8_len(unsigned cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* True when none of the 8 bytes at p ends a plain ASCII run in a string: no control
 * character, no byte >= 0x80, no quote, no backslash. Bit tricks over a 64-bit word
 * (each term is nonzero exactly when some byte matches): a prompt is kilobytes of text,
 * and a byte-at-a-time loop costs the proxy microseconds nginx does not spend. */
static inline bool plain8(const unsigned char *p)
{
    const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    uint64_t x, quote, bslash;
    memcpy(&x, p, sizeof(x));
    quote = x ^ (ones * '"');
    bslash = x ^ (ones * '\\');
    uint64_t below_space = (x - ones * 0x20) & ~x;
    uint64_t is_quote = (quote - ones) & ~quote;
    uint64_t is_bslash = (bslash - ones) & ~bslash;
    return ((below_space | is_quote | is_bslash | x) & highs) == 0;
}

/* At the opening quote. Validates the string and fills v (type, raw span, unescaped
 * length); leaves p after the closing quote. */
static int scan_string(struct scan *s, struct val *v)
{
    const unsigned char *p = s->p + 1, *end = s->end;
    v->type = REQSCAN_STRING;
    v->raw = p;
    v->escaped = false;
    size_t len = 0;
    for (;;) {
        /* The common case, plain ASCII text: eight bytes at a time, then byte by byte. */
        const unsigned char *run = p;
        while (end - p >= 8 && plain8(p))
            p += 8;
        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\')
            p++;
        len += (size_t)(p - run);
        if (p >= end)
            return fail(s, p, "premature end of input in a string");
        unsigned c = *p;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(s, p, "control character in a string");
        if (c >= 0x80) {
            size_t n = util_utf8_seq_len_n((const char *)p, (size_t)(end - p));
            if (!n)
                return fail(s, p, "invalid UTF-8");
            p += n;
            len += n;
            continue;
        }
        /* a backslash */
        v->escaped = true;
        if (end - p < 2)
            return fail(s, p, "premature end of input in a string");
        c = p[1];
        if (c != 'u') {
            if (!strchr("\"\\/bfnrt", (int)c) || c == 0)
                return fail(s, p, "invalid escape");
            p += 2;
            len++;
            continue;
        }
        int u = end - p >= 6 ? hex4(p + 2) : -1;
        if (u < 0)
            return fail(s, p, "invalid escape");
        if (u == 0)
            return fail(s, p, "\\u0000 is not allowed");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return fail(s, p, "invalid Unicode escape (lone low surrogate)");
        if (u >= 0xD800 && u <= 0xDBFF) {
            int lo = end - p >= 12 && p[6] == '\\' && p[7] == 'u' ? hex4(p + 8) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF) {
                /* jansson checks the syntax of every escape before their meaning. */
                if (end - p >= 8 && p[6] == '\\' && p[7] == 'u' && (end - p < 12 || lo < 0))
                    return fail(s, p + 6, "invalid escape");
                return fail(s, p, "invalid Unicode escape (lone high surrogate)");
            }
            p += 12;
            len += 4;
            continue;
        }
        p += 6;
        len += utf8_len((unsigned)u);
    }
    v->raw_len = (size_t)(p - v->raw);
    v->len = len;
    s->p = p + 1;
    return 0;
}

/* Unescape a string scan_string accepted into out (v->len + 1 bytes), NUL-terminated. */
static void decode_string(const struct val *v, char *out)
{
    const unsigned char *p = v->raw, *end = v->raw + v->raw_len;
    if (!v->escaped) {
        memcpy(out, p, v->raw_len);
        out[v->raw_len] = '\0';
        return;
    }
    char *o = out;
    while (p < end) {
        if (*p != '\\') {
            *o++ = (char)*p++;
            continue;
        }
        unsigned c = p[1];
        if (c != 'u') {
            static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
            *o++ = to[strchr(from, (int)c) - from];
            p += 2;
            continue;
        }
        unsigned cp = (unsigned)hex4(p + 2);
        p += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned)hex4(p + 2) - 0xDC00);
            p += 6;
        }
        if (cp < 0x80) {
            *o++ = (char)cp;
        } else if (cp < 0x800) {
            *o++ = (char)(0xC0 | (cp >> 6));
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            *o++ = (char)(0xE0 | (cp >> 12));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        } else {
            *o++ = (char)(0xF0 | (cp >> 18));
            *o++ = (char)(0x80 | ((cp >> 12) & 0x3F));
            *o++ = (char)(0x80 | ((cp >> 6) & 0x3F));
            *o++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *o = '\0';
}

/* jansson reads one byte past a number or a literal (true, false, null) and pushes it
 * back into its look-ahead buffer, which is NUL-terminated: a NUL byte pushed back reads
 * as "buffer empty" and is lost. So json_loadb accepts "1\0" and "[true\0]" — exactly
 * one NUL right after such a token vanishes — and the scanner must accept them too. */
static const unsigned char *skip_pushed_back_nul(const unsigned char *p, const unsigned char *end)
{
    return p < end && *p == '\0' ? p + 1 : p;
}

static bool is_digit(int c)
{
    return c >= '0' && c <= '9';
}

/* JSON number grammar; integers must fit int64 and reals must not overflow a double,
 * as in jansson (which rejects both rather than lose the value). */
static int scan_number(struct scan *s, struct val *v)
{
    const unsigned char *p = s->p, *end = s->end, *begin = p;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    if (p >= end || !is_digit(*p))
        return fail(s, begin, "invalid number");
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p))
            return fail(s, begin, "invalid number (leading zero)");
    } else {
        while (p < end && is_digit(*p))
            p++;
    }
    bool real = false;
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return fail(s, begin, "invalid number");
        while (p < end && is_digit(*p))
            p++;
        real = true;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit(*p))
            return fail(s, begin, "invalid number");
        while (p < end && is_digit(*p))
            p++;
        real = true;
    }
    s->p = skip_pushed_back_nul(p, end);
    if (!real) {
        /* Accumulate negatively: INT64_MIN has no positive counterpart. */
        int64_t acc = 0;
        for (const unsigned char *d = begin + neg; d < p; d++) {
            int digit = *d - '0';
            if (acc < (INT64_MIN + digit) / 10)
                return fail(s, begin, neg ? "too big negative integer" : "too big integer");
            acc = acc * 10 - digit;
        }
        if (!neg && acc == INT64_MIN)
            return fail(s, begin, "too big integer");
        v->type = REQSCAN_INTEGER;
        v->ival = neg ? acc : -acc;
        return 0;
    }
    size_t n = (size_t)(p - begin);
    char small[64];
    char *buf = n < sizeof(small) ? small : xmalloc(n + 1);
    memcpy(buf, begin, n);
    buf[n] = '\0';
    errno = 0;
    double d = strtod(buf, NULL);
    bool overflow = errno == ERANGE && isinf(d);
    if (buf != small)
        free(buf);
    if (overflow)
        return fail(s, begin, "real number overflow");
    v->type = REQSCAN_REAL;
    return 0;
}

static int expect_word(struct scan *s, const char *word, size_t n, enum reqscan_type t,
                       struct val *v)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return fail(s, s->p, "invalid token");
    s->p = skip_pushed_back_nul(s->p + n, s->end);
    v->type = t;
    return 0;
}

static int scan_value(struct scan *s, int cdepth, size_t *chars, struct val *v);

/* Which counted member of an object a key is (pdreq content_chars looks at these). */
enum member { M_OTHER, M_CONTENT, M_TEXT };

static int scan_array(struct scan *s, int cdepth, size_t *chars)
{
    s->p++; /* '[' */
    skip_ws(s);
    if (s->p < s->end && *s->p == ']') {
        s->p++;
        return 0;
    }
    for (;;) {
        struct val el;
        size_t el_chars = 0;
        int child = cdepth >= 0 && cdepth < REQSCAN_COUNT_DEPTH ? cdepth + 1 : -1;
        if (scan_value(s, child, &el_chars, &el) < 0)
            return -1;
        if (cdepth >= 0)
            *chars += el.type == REQSCAN_INTEGER ? 4 : el_chars;
        skip_ws(s);
        if (s->p >= s->end)
            return fail(s, s->p, "premature end of input in an array");
        if (*s->p == ']') {
            s->p++;
            return 0;
        }
        if (*s->p != ',')
            return fail(s, s->p, "',' or ']' expected");
        s->p++;
    }
}

/* A key scan_string accepted, unescaped into buf when it is short enough to matter. */
static bool key_is(const struct val *k, const char *name, size_t n, const char *decoded)
{
    if (!k->escaped)
        return k->raw_len == n && memcmp(k->raw, name, n) == 0;
    return decoded && k->len == n && memcmp(decoded, name, n) == 0;
}

/* Scan an object. top: the request's own object (fills out); otherwise, when counting
 * (cdepth >= 0), adds the last "content" and "text" members' characters to *chars. */
static int scan_object(struct scan *s, int cdepth, size_t *chars, struct reqscan *top)
{
    size_t content = 0, text = 0;
    s->p++; /* '{' */
    skip_ws(s);
    if (s->p < s->end && *s->p == '}') {
        s->p++;
        return 0;
    }
    for (;;) {
        if (s->p >= s->end || *s->p != '"')
            return fail(s, s->p, "string or '}' expected");
        struct val k;
        if (scan_string(s, &k) < 0)
            return -1;
        char kbuf[REQSCAN_KEY_MAX];
        const char *decoded = NULL;
        if (k.escaped && k.len < sizeof(kbuf)) {
            decode_string(&k, kbuf);
            decoded = kbuf;
        }
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return fail(s, s->p, "':' expected");
        s->p++;
        struct val v;
        size_t v_chars = 0;
        if (top) {
            bool is_prompt = key_is(&k, "prompt", 6, decoded);
            bool is_messages = !is_prompt && key_is(&k, "messages", 8, decoded);
            if (scan_value(s, is_prompt || is_messages ? 0 : -1, &v_chars, &v) < 0)
                return -1;
            if (is_prompt) {
                top->prompt = v.type;
                top->prompt_chars = v_chars;
            } else if (is_messages) {
                top->messages = v.type;
                top->messages_chars = v_chars;
            } else if (key_is(&k, "stream", 6, decoded)) {
                top->stream = v.type;
            } else if (key_is(&k, "model", 5, decoded)) {
                top->model = v.type;
                free(top->model_name);
                top->model_name = NULL;
                if (v.type == REQSCAN_STRING) {
                    top->model_name = xmalloc(v.len + 1);
                    decode_string(&v, top->model_name);
                }
            } else if (key_is(&k, "max_tokens", 10, decoded)) {
                top->max_tokens = v.type;
                top->max_tokens_value = v.ival;
            } else if (key_is(&k, "max_completion_tokens", 21, decoded)) {
                top->max_completion_tokens = v.type;
                top->max_completion_tokens_value = v.ival;
            }
        } else {
            enum member m = M_OTHER;
            if (cdepth >= 0 && key_is(&k, "content", 7, decoded))
                m = M_CONTENT;
            else if (cdepth >= 0 && key_is(&k, "text", 4, decoded))
                m = M_TEXT;
            int child = m != M_OTHER && cdepth < REQSCAN_COUNT_DEPTH ? cdepth + 1 : -1;
            if (scan_value(s, child, &v_chars, &v) < 0)
                return -1;
            /* A duplicated key: the last one is the member jansson keeps. */
            if (m == M_CONTENT)
                content = v_chars;
            else if (m == M_TEXT)
                text = v_chars;
        }
        skip_ws(s);
        if (s->p >= s->end)
            return fail(s, s->p, "premature end of input in an object");
        if (*s->p == '}') {
            s->p++;
            if (cdepth >= 0)
                *chars += content + text;
            return 0;
        }
        if (*s->p != ',')
            return fail(s, s->p, "',' or '}' expected");
        s->p++;
        skip_ws(s);
    }
}

/* One value at the current position. cdepth: its content_chars depth, or -1 when it is
 * not counted; counted characters are added to *chars. */
static int scan_value(struct scan *s, int cdepth, size_t *chars, struct val *v)
{
    v->type = REQSCAN_ABSENT;
    v->ival = 0;
    skip_ws(s);
    if (s->p >= s->end)
        return fail(s, s->p, "premature end of input");
    if (++s->depth > REQSCAN_MAX_DEPTH)
        return fail(s, s->p, "maximum parsing depth reached");
    int rc;
    switch (*s->p) {
    case '{':
        v->type = REQSCAN_OBJECT;
        rc = scan_object(s, cdepth, chars, NULL);
        break;
    case '[':
        v->type = REQSCAN_ARRAY;
        rc = scan_array(s, cdepth, chars);
        break;
    case '"':
        rc = scan_string(s, v);
        if (rc == 0 && cdepth >= 0)
            *chars += v->len;
        break;
    case 't':
        rc = expect_word(s, "true", 4, REQSCAN_TRUE, v);
        break;
    case 'f':
        rc = expect_word(s, "false", 5, REQSCAN_FALSE, v);
        break;
    case 'n':
        rc = expect_word(s, "null", 4, REQSCAN_NULL, v);
        break;
    default:
        if (*s->p == '-' || is_digit(*s->p))
            rc = scan_number(s, v);
        else
            rc = fail(s, s->p, "invalid token");
        break;
    }
    s->depth--;
    return rc;
}

void reqscan_release(struct reqscan *s)
{
    free(s->model_name);
    memset(s, 0, sizeof(*s));
}

int reqscan_parse(const char *body, size_t len, struct reqscan *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    struct scan s = {.p = (const unsigned char *)body,
                     .end = (const unsigned char *)body + len,
                     .start = (const unsigned char *)body};
    skip_ws(&s);
    struct val v = {0};
    int rc;
    size_t ignored = 0;
    if (s.p < s.end && *s.p == '{') {
        /* The top-level object is level 1, as scan_value would count it. */
        s.depth = 1;
        out->top = REQSCAN_OBJECT;
        rc = scan_object(&s, -1, &ignored, out);
        s.depth = 0;
    } else {
        rc = scan_value(&s, -1, &ignored, &v);
        out->top = v.type;
    }
    if (rc == 0) {
        skip_ws(&s);
        if (s.p < s.end)
            rc = fail(&s, s.p, "end of file expected");
    }
    if (rc == 0)
        return 0;
    if (cap) {
        int line = 1;
        const unsigned char *bol = s.start;
        for (const unsigned char *q = s.start; q < s.err_at; q++)
            if (*q == '\n') {
                line++;
                bol = q + 1;
            }
        snprintf(err, cap, "invalid JSON at line %d column %d: %s", line, (int)(s.err_at - bol) + 1,
                 s.why);
    }
    reqscan_release(out);
    return -EINVAL;
}

int64_t reqscan_estimate_tokens(const struct reqscan *s, bool prefill_only)
{
    int64_t t = (int64_t)((s->prompt_chars + s->messages_chars) / 4) + 1;
    if (!prefill_only) {
        int64_t gen = 256;
        if (s->max_completion_tokens == REQSCAN_INTEGER)
            gen = s->max_completion_tokens_value;
        else if (s->max_tokens == REQSCAN_INTEGER)
            gen = s->max_tokens_value;
        if (gen < 0)
            gen = 0;
        if (gen > 1 << 20)
            gen = 1 << 20;
        t += gen;
    }
    return t;
}
