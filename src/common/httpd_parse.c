/* httpd_parse — HTTP/1.1 request heads and chunked bodies, pure (no sockets, no
 * allocation), so the fuzzer can drive every byte of it.
 *
 * Strict where ambiguity could desynchronise a proxy (request smuggling): both
 * Content-Length and Transfer-Encoding, conflicting Content-Lengths, obsolete line
 * folding, white space before a colon, a Transfer-Encoding other than "chunked" and,
 * inside a chunked body, any line end but CRLF are refused rather than guessed at.
 * (A bare LF still ends a head line, as RFC 9112 allows; chunk framing has no such
 * allowance, and proxies disagree about it there.)
 *
 * Request targets: origin-form ("/path?q") and absolute-form ("http://host:port/path?q",
 * which RFC 9112 §3.2.2 says a server MUST accept; its authority then replaces Host).
 * An HTTP/1.1 request must carry exactly one Host (§3.2); HTTP/1.0 may omit it. */
#include "common/httpd_internal.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

static bool is_tchar(unsigned char c)
{
    /* RFC 9110 token characters */
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return true;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static bool token_eq(const char *s, size_t len, const char *lit)
{
    return strlen(lit) == len && strncasecmp(s, lit, len) == 0;
}

/* Does a comma-separated header value contain the token lit? */
static bool list_has(const char *v, size_t len, const char *lit)
{
    size_t i = 0;
    while (i < len) {
        while (i < len && (is_ows(v[i]) || v[i] == ','))
            i++;
        size_t s = i;
        while (i < len && v[i] != ',')
            i++;
        size_t e = i;
        while (e > s && is_ows(v[e - 1]))
            e--;
        if (e > s && token_eq(v + s, e - s, lit))
            return true;
    }
    return false;
}

/* End of the line starting at p (the '\n'), or NULL. The line's content excludes an
 * optional '\r' before it. */
static const char *line_end(const char *p, const char *end, size_t *content_len)
{
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
        return NULL;
    size_t n = (size_t)(nl - p);
    if (n > 0 && p[n - 1] == '\r')
        n--;
    *content_len = n;
    return nl;
}

/* The bytes of host [":" port] (RFC 3986 reg-name, IPv4, "[IPv6]"): ALPHA DIGIT
 * - . _ ~ % ! $ & ' ( ) * + , ; = : [ ] (test_parse_head checks every byte). Anything
 * else ('/', '?', '#', '@', white space, quotes...) could make the host mean something
 * else to a later reader (a log, a redirect, a proxy) than it meant here. A table:
 * every request has a Host, and one load a byte is the cheapest test. */
static const unsigned char host_chars[256] = {
    ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1,
    ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1,
    ['Y'] = 1, ['Z'] = 1, ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
    ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1,
    ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1,
    ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1,
    ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['-'] = 1, ['.'] = 1,
    ['_'] = 1, ['~'] = 1, ['%'] = 1, ['!'] = 1, ['$'] = 1, ['&'] = 1, ['\''] = 1,
    ['('] = 1, [')'] = 1, ['*'] = 1, ['+'] = 1, [','] = 1, [';'] = 1, ['='] = 1, [':'] = 1,
    ['['] = 1, [']'] = 1
};

static bool host_valid(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!host_chars[(unsigned char)s[i]])
            return false;
    return true;
}

/* t[0..tl) is not origin-form: accept "http://authority[/path][?query]" (or https), the
 * scheme in any case. The authority must be a non-empty host[:port] without userinfo
 * (RFC 9110 §4.2.1: an http URI with an empty host is invalid; §4.2.4: userinfo is
 * refused). Only asterisk-form and authority-form remain refused (no OPTIONS * or
 * CONNECT here). */
static int parse_absolute_form(const char *t, size_t tl, struct httpd_head *hd)
{
    size_t s;
    if (tl > 7 && strncasecmp(t, "http://", 7) == 0)
        s = 7;
    else if (tl > 8 && strncasecmp(t, "https://", 8) == 0)
        s = 8;
    else
        return -EINVAL;
    size_t e = s;
    while (e < tl && t[e] != '/' && t[e] != '?')
        e++;
    if (e == s || !host_valid(t + s, e - s))
        return -EINVAL; /* '@' (userinfo) and '#' are not host characters */
    hd->absolute_form = true;
    hd->host = t + s;
    hd->host_len = e - s;
    hd->target = t + e;
    hd->target_len = tl - e;
    return 0;
}

static int parse_request_line(const char *p, size_t n, struct httpd_head *hd)
{
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)p[i]))
        i++;
    if (i == 0 || i > 32 || i >= n || p[i] != ' ')
        return -EINVAL;
    hd->method = p;
    hd->method_len = i;
    size_t t = ++i;
    while (i < n && p[i] != ' ') {
        unsigned char c = (unsigned char)p[i];
        if (c <= 0x20 || c == 0x7f)
            return -EINVAL;
        i++;
    }
    if (i == t || i >= n)
        return -EINVAL;
    if (p[t] == '/') {
        hd->target = p + t;
        hd->target_len = i - t;
    } else if (parse_absolute_form(p + t, i - t, hd) != 0) {
        return -EINVAL;
    }
    i++;
    const char *v = p + i;
    size_t vl = n - i;
    if (vl != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
        v[7] < '0' || v[7] > '9')
        return -EINVAL;
    if (v[5] != '1')
        return -EPROTONOSUPPORT;
    hd->minor = v[7] == '0' ? 0 : 1;
    return 0;
}

static int parse_length(const char *v, size_t len, uint64_t *out)
{
    if (len == 0 || len > 18)
        return -EINVAL;
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -EINVAL;
        n = n * 10 + (uint64_t)(v[i] - '0');
    }
    *out = n;
    return 0;
}

static int header_semantics(struct httpd_head *hd, const struct httpd_hdr_view *h, bool *has_te,
                            bool *has_host)
{
    /* every request has one: compared inline rather than through strncasecmp */
    const char *nm = h->name;
    if (h->name_len == 4 && (nm[0] | 0x20) == 'h' && (nm[1] | 0x20) == 'o' &&
        (nm[2] | 0x20) == 's' && (nm[3] | 0x20) == 't') {
        if (*has_host || !host_valid(h->value, h->value_len))
            return -EINVAL; /* a second Host, or one no host[:port] looks like */
        *has_host = true;
        if (!hd->absolute_form) { /* else the target's authority wins (§3.2.2) */
            hd->host = h->value;
            hd->host_len = h->value_len;
        }
    } else if (token_eq(h->name, h->name_len, "Content-Length")) {
        uint64_t n = 0;
        if (parse_length(h->value, h->value_len, &n) != 0)
            return -EINVAL;
        if (hd->has_length && hd->content_length != n)
            return -EINVAL;
        hd->has_length = true;
        hd->content_length = n;
    } else if (token_eq(h->name, h->name_len, "Transfer-Encoding")) {
        if (*has_te || !token_eq(h->value, h->value_len, "chunked"))
            return *has_te ? -EINVAL : -ENOTSUP;
        *has_te = true;
        hd->chunked = true;
    } else if (token_eq(h->name, h->name_len, "Connection")) {
        if (list_has(h->value, h->value_len, "close"))
            hd->keep_alive = false;
        else if (list_has(h->value, h->value_len, "keep-alive"))
            hd->keep_alive = true;
    } else if (token_eq(h->name, h->name_len, "Expect")) {
        if (token_eq(h->value, h->value_len, "100-continue"))
            hd->expect_continue = true;
    }
    return 0;
}

int httpd_parse_head(const char *buf, size_t len, struct httpd_head *hd)
{
    /* not the whole struct: hdrs[] is large and filled as parsed */
    memset(hd, 0, offsetof(struct httpd_head, hdrs));
    hd->has_length = hd->chunked = hd->keep_alive = hd->expect_continue = false;
    hd->content_length = 0;
    size_t avail = len < HTTPD_HEAD_MAX ? len : HTTPD_HEAD_MAX;
    const char *p = buf, *end = buf + avail;
    /* Empty lines before the request line (a stray CRLF after a previous body). */
    while (p < end && (*p == '\r' || *p == '\n')) {
        if (*p == '\r' && (p + 1 >= end || p[1] != '\n'))
            break;
        p++;
    }
    size_t n = 0;
    const char *nl = line_end(p, end, &n);
    if (!nl)
        goto incomplete;
    int rc = parse_request_line(p, n, hd);
    if (rc != 0)
        return rc;
    hd->keep_alive = hd->minor >= 1;
    p = nl + 1;
    bool has_te = false, has_host = false;
    for (;;) {
        nl = line_end(p, end, &n);
        if (!nl)
            goto incomplete;
        if (n == 0)
            break; /* blank line: end of the head */
        if (is_ows(p[0]))
            return -EINVAL; /* obsolete line folding */
        if (hd->nhdrs == HTTPD_MAX_HEADERS)
            return -EMSGSIZE;
        size_t i = 0;
        while (i < n && is_tchar((unsigned char)p[i]))
            i++;
        if (i == 0 || i >= n || p[i] != ':')
            return -EINVAL;
        struct httpd_hdr_view *h = &hd->hdrs[hd->nhdrs++];
        h->name = p;
        h->name_len = i;
        i++;
        while (i < n && is_ows(p[i]))
            i++;
        size_t e = n;
        while (e > i && is_ows(p[e - 1]))
            e--;
        for (size_t k = i; k < e; k++) {
            unsigned char c = (unsigned char)p[k];
            if ((c < 0x20 && c != '\t') || c == 0x7f)
                return -EINVAL;
        }
        h->value = p + i;
        h->value_len = e - i;
        rc = header_semantics(hd, h, &has_te, &has_host);
        if (rc != 0)
            return rc;
        p = nl + 1;
    }
    if (hd->chunked && (hd->has_length || hd->minor == 0))
        return -EINVAL;
    if (!hd->host && hd->minor >= 1)
        return -EINVAL; /* HTTP/1.1 without Host */
    return (int)(nl + 1 - buf);

incomplete:
    return len >= HTTPD_HEAD_MAX ? -EMSGSIZE : 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int httpd_url_decode(char *dst, const char *src, size_t len, bool plus_space)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '%' && len - i >= 3) {
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi >= 0 && lo >= 0) {
                c = (char)(hi * 16 + lo);
                if (c == '\0')
                    return -EINVAL;
                i += 2;
            }
        } else if (c == '+' && plus_space) {
            c = ' ';
        }
        dst[o++] = c;
    }
    dst[o] = '\0';
    return (int)o;
}

enum {
    CH_SIZE = 0, /* must be 0: a zeroed decoder starts here */
    CH_EXT,
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER,
    CH_TRAILER_LINE,
    CH_TRAILER_LF,
    CH_END_LF,
    CH_DONE,
};

#define CH_LINE_MAX 4096
#define CH_TRAILERS_MAX 8192
#define CH_SIZE_MAX ((uint64_t)1 << 60)
#define CH_DIGITS_MAX 16 /* leading zeros included: an endless "000..." is not a size */

static void size_line_done(struct httpd_chunked *c)
{
    c->state = c->left == 0 ? CH_TRAILER : CH_DATA;
    c->line = 0;
}

int httpd_chunked_decode(struct httpd_chunked *c, char *buf, size_t len, size_t *consumed,
                         size_t *out_len)
{
    size_t i = 0, o = 0;
    int rc = 0;
    while (i < len && rc == 0) {
        char ch = buf[i];
        switch (c->state) {
        case CH_SIZE: {
            int v = hexval(ch);
            if (v >= 0) {
                if (c->left >= CH_SIZE_MAX / 16 || c->digits >= CH_DIGITS_MAX)
                    rc = -EINVAL;
                c->left = c->left * 16 + (uint64_t)v;
                c->digits++;
            } else if (c->digits == 0) {
                rc = -EINVAL;
            } else if (ch == ';' || is_ows(ch)) {
                c->state = CH_EXT;
            } else if (ch == '\r') {
                c->state = CH_SIZE_LF;
            } else {
                rc = -EINVAL; /* a bare LF included: chunk lines end in CRLF */
            }
            i++;
            break;
        }
        case CH_EXT:
            if (ch == '\r')
                c->state = CH_SIZE_LF;
            else if (((unsigned char)ch < 0x20 && ch != '\t') || ++c->line > CH_LINE_MAX)
                rc = -EINVAL; /* a bare LF included */
            i++;
            break;
        case CH_SIZE_LF:
            if (ch != '\n')
                rc = -EINVAL;
            else
                size_line_done(c);
            i++;
            break;
        case CH_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > c->left)
                n = (size_t)c->left;
            if (o != i)
                memmove(buf + o, buf + i, n);
            o += n;
            i += n;
            c->left -= n;
            if (c->left == 0)
                c->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
            if (ch == '\r')
                c->state = CH_DATA_LF;
            else
                rc = -EINVAL;
            i++;
            break;
        case CH_DATA_LF:
            if (ch != '\n')
                rc = -EINVAL;
            c->state = CH_SIZE;
            c->digits = 0;
            i++;
            break;
        case CH_TRAILER:
            if (ch == '\r') {
                c->state = CH_END_LF;
            } else if (ch == '\n') {
                rc = -EINVAL;
            } else {
                c->state = CH_TRAILER_LINE;
                c->line = 1;
                if (++c->trailers > CH_TRAILERS_MAX)
                    rc = -EINVAL;
            }
            i++;
            break;
        case CH_TRAILER_LINE:
            if (ch == '\n')
                rc = -EINVAL;
            else if (++c->line > CH_LINE_MAX || ++c->trailers > CH_TRAILERS_MAX)
                rc = -EINVAL;
            else if (ch == '\r')
                c->state = CH_TRAILER_LF;
            i++;
            break;
        case CH_TRAILER_LF:
            if (ch != '\n')
                rc = -EINVAL;
            c->state = CH_TRAILER;
            i++;
            break;
        case CH_END_LF:
            if (ch != '\n') {
                rc = -EINVAL;
            } else {
                c->state = CH_DONE;
                rc = 1;
            }
            i++;
            break;
        default: /* CH_DONE: nothing more belongs to this body */
            rc = 1;
            break;
        }
    }
    if (rc == 0 && c->state == CH_DONE)
        rc = 1;
    *consumed = i;
    *out_len = o;
    return rc;
}
