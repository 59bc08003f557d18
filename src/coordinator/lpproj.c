/* lpproj — see lpproj.h. A small JSON scanner that knows spans, not values: the
 * projection copies the input up to a value it changes, writes the change, and goes on
 * after that value. */
#include "coordinator/lpproj.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64

struct scan {
    const char *p, *e;
    int err;
};

static void ws(struct scan *s)
{
    while (s->p < s->e && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static bool eat(struct scan *s, char c)
{
    ws(s);
    if (s->p < s->e && *s->p == c) {
        s->p++;
        return true;
    }
    return false;
}

static bool peek(struct scan *s, char c)
{
    ws(s);
    return s->p < s->e && *s->p == c;
}

/* A string at s->p (after white space): [*a, *b) is its raw content between quotes. */
static bool string(struct scan *s, const char **a, const char **b)
{
    ws(s);
    if (s->p >= s->e || *s->p != '"')
        return false;
    const char *q = ++s->p;
    while (s->p < s->e && *s->p != '"') {
        if ((unsigned char)*s->p < 0x20)
            return false;
        if (*s->p == '\\') {
            s->p++;
            if (s->p >= s->e)
                return false;
        }
        s->p++;
    }
    if (s->p >= s->e)
        return false;
    if (a) {
        *a = q;
        *b = s->p;
    }
    s->p++;
    return true;
}

static bool value(struct scan *s, int depth);

static bool container(struct scan *s, int depth, bool obj)
{
    if (depth > MAX_DEPTH)
        return false;
    s->p++; /* the opening bracket */
    if (eat(s, obj ? '}' : ']'))
        return true;
    for (;;) {
        if (obj && (!string(s, NULL, NULL) || !eat(s, ':')))
            return false;
        if (!value(s, depth + 1))
            return false;
        if (eat(s, ','))
            continue;
        return eat(s, obj ? '}' : ']');
    }
}

static bool literal(struct scan *s, const char *lit)
{
    size_t n = strlen(lit);
    if ((size_t)(s->e - s->p) < n || memcmp(s->p, lit, n) != 0)
        return false;
    s->p += n;
    return true;
}

static bool value(struct scan *s, int depth)
{
    ws(s);
    if (s->p >= s->e)
        return false;
    switch (*s->p) {
    case '{':
        return container(s, depth, true);
    case '[':
        return container(s, depth, false);
    case '"':
        return string(s, NULL, NULL);
    case 't':
        return literal(s, "true");
    case 'f':
        return literal(s, "false");
    case 'n':
        return literal(s, "null");
    default: {
        const char *q = s->p;
        while (s->p < s->e && (strchr("+-.eE", *s->p) || (*s->p >= '0' && *s->p <= '9')))
            s->p++;
        return s->p > q;
    }
    }
}

static bool key_is(const char *a, const char *b, const char *k)
{
    size_t n = strlen(k);
    return (size_t)(b - a) == n && memcmp(a, k, n) == 0;
}

/* Output: everything from `from` up to the scanner's position not yet copied. */
struct out {
    struct strbuf *sb;
    const char *from;
    int err;
};

static void flush(struct out *o, const char *to)
{
    if (to > o->from && strbuf_append(o->sb, o->from, (size_t)(to - o->from)) < 0)
        o->err = -E2BIG;
    o->from = to;
}

static void emit(struct out *o, const char *s)
{
    if (strbuf_puts(o->sb, s) < 0)
        o->err = -E2BIG;
}

/* An array (obj false) or object at s->p keeping only its first `keep` elements or
 * members: the text from the separator before element `keep` up to the closing bracket
 * is dropped. */
static bool trim(struct scan *s, struct out *o, int keep, bool obj, int depth)
{
    if (!peek(s, obj ? '{' : '['))
        return value(s, depth);
    if (depth > MAX_DEPTH)
        return false;
    s->p++;
    const char *cut = s->p; /* after the bracket, then at each separator */
    if (eat(s, obj ? '}' : ']'))
        return true;
    for (int i = 0;; i++) {
        if (i == keep)
            flush(o, cut);
        if (obj && (!string(s, NULL, NULL) || !eat(s, ':')))
            return false;
        if (!value(s, depth + 1))
            return false;
        ws(s);
        cut = s->p;
        if (eat(s, ','))
            continue;
        if (!peek(s, obj ? '}' : ']'))
            return false;
        if (i >= keep)
            o->from = s->p; /* the dropped part is skipped; the bracket is copied */
        s->p++;
        return true;
    }
}

/* Walk an object, calling member() at each member's value (positioned at it). */
typedef bool (*member_fn)(struct scan *s, struct out *o, const char *ka, const char *kb,
                          const struct lpproj *p, int depth);

static bool object(struct scan *s, struct out *o, member_fn member, const struct lpproj *p,
                   int depth)
{
    if (depth > MAX_DEPTH || !peek(s, '{'))
        return false;
    s->p++;
    if (eat(s, '}'))
        return true;
    for (;;) {
        const char *ka, *kb;
        if (!string(s, &ka, &kb) || !eat(s, ':'))
            return false;
        ws(s);
        if (!member(s, o, ka, kb, p, depth + 1))
            return false;
        if (eat(s, ','))
            continue;
        return eat(s, '}');
    }
}

/* Every element of an array through elem(); a non-array value is skipped. */
typedef bool (*elem_fn)(struct scan *s, struct out *o, const struct lpproj *p, int depth);

static bool each(struct scan *s, struct out *o, elem_fn elem, const struct lpproj *p, int depth)
{
    if (!peek(s, '['))
        return value(s, depth);
    s->p++;
    if (eat(s, ']'))
        return true;
    for (;;) {
        if (!elem(s, o, p, depth + 1))
            return false;
        if (eat(s, ','))
            continue;
        return eat(s, ']');
    }
}

static bool content_member(struct scan *s, struct out *o, const char *ka, const char *kb,
                           const struct lpproj *p, int depth)
{
    if (key_is(ka, kb, "top_logprobs"))
        return trim(s, o, p->top, false, depth);
    return value(s, depth);
}

static bool content_elem(struct scan *s, struct out *o, const struct lpproj *p, int depth)
{
    if (!peek(s, '{'))
        return value(s, depth);
    return object(s, o, content_member, p, depth);
}

/* A completions top_logprobs dict: the sampled token first, then the best others (the
 * sampled one left out). For k, vLLM lists the sampled token and the top k, which holds
 * the sampled one unless it ranked below k: k + 1 entries then, k otherwise. Its rank
 * is read from the values: it ranked below k when the k-th other entry is more likely. */
static int dict_keep(struct scan s, int k)
{
    if (k == 0)
        return 1;
    double lp[2] = {0, 0}; /* the sampled one's, the k-th other's */
    int seen = 0;
    if (!peek(&s, '{'))
        return k + 1;
    s.p++;
    if (eat(&s, '}'))
        return k + 1;
    for (int i = 0; i <= k; i++) {
        if (!string(&s, NULL, NULL) || !eat(&s, ':'))
            return k + 1;
        ws(&s);
        /* the input is not NUL-terminated: strtod reads a bounded copy of the span */
        const char *num = s.p;
        if (!value(&s, 1))
            return k + 1;
        char buf[64];
        size_t nl = (size_t)(s.p - num);
        if (nl == 0 || nl >= sizeof(buf))
            return k + 1;
        memcpy(buf, num, nl);
        buf[nl] = '\0';
        char *end;
        double v = strtod(buf, &end);
        if (end != buf + nl)
            return k + 1;
        if (i == 0 || i == k)
            lp[seen++] = v;
        if (!eat(&s, ','))
            break;
    }
    if (seen < 2)
        return k + 1; /* fewer than k others: everything is kept anyway */
    return lp[1] > lp[0] ? k + 1 : k;
}

static bool dict_elem(struct scan *s, struct out *o, const struct lpproj *p, int depth)
{
    return trim(s, o, dict_keep(*s, p->top), true, depth);
}

static bool logprobs_member(struct scan *s, struct out *o, const char *ka, const char *kb,
                            const struct lpproj *p, int depth)
{
    if (p->chat && key_is(ka, kb, "content"))
        return each(s, o, content_elem, p, depth);
    if (!p->chat && key_is(ka, kb, "top_logprobs"))
        return each(s, o, dict_elem, p, depth);
    return value(s, depth);
}

static bool choice_member(struct scan *s, struct out *o, const char *ka, const char *kb,
                          const struct lpproj *p, int depth)
{
    if (!key_is(ka, kb, "logprobs"))
        return value(s, depth);
    if (p->strip) {
        flush(o, s->p);
        if (!value(s, depth))
            return false;
        emit(o, "null");
        o->from = s->p;
        return true;
    }
    if (!peek(s, '{'))
        return value(s, depth); /* null: nothing to project */
    return object(s, o, logprobs_member, p, depth);
}

static bool choice_elem(struct scan *s, struct out *o, const struct lpproj *p, int depth)
{
    if (!peek(s, '{'))
        return value(s, depth);
    return object(s, o, choice_member, p, depth);
}

static bool top_member(struct scan *s, struct out *o, const char *ka, const char *kb,
                       const struct lpproj *p, int depth)
{
    if (key_is(ka, kb, "choices"))
        return each(s, o, choice_elem, p, depth);
    return value(s, depth);
}

int lpproj_rewrite(const struct lpproj *p, const char *in, size_t len, struct strbuf *out)
{
    struct scan s = {.p = in, .e = in + len};
    struct out o = {.sb = out, .from = in};
    if (!object(&s, &o, top_member, p, 0))
        return -EINVAL;
    ws(&s);
    if (s.p != s.e)
        return -EINVAL;
    flush(&o, s.e);
    return o.err;
}
