/* http1 — see http1.h. One character table, one line splitter and one field-line rule
 * serve requests and responses; the chunked decoder is one state machine with a strict
 * mode for request bodies. */
#include "common/http1.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* ---- characters -------------------------------------------------------------------------- */

enum {
    C_TCHAR = 0x01,   /* RFC 9110 token */
    C_HOST = 0x02,    /* host[:port] of a Host field or an authority (RFC 3986 reg-name,
                       * IPv4, "[IPv6]"); '/', '?', '#', '@', white space and quotes could
                       * make a host mean something else to a later reader */
    C_URLHOST = 0x04, /* a host name in a URL we send to (stricter: no escapes) */
    C_HEX = 0x08,
    C_VALUE = 0x10, /* field-value octet: HTAB, SP, VCHAR, obs-text (no CTL, no DEL) */
};

#define TH (C_TCHAR | C_HOST | C_VALUE)
#define TV (C_TCHAR | C_VALUE)
#define HV (C_HOST | C_VALUE)
#define ALNUM (C_TCHAR | C_HOST | C_URLHOST | C_VALUE)

/* A table: every request has a method, fields and a Host, and one load a byte is the
 * cheapest test. test_http1 checks it byte by byte against the RFC sets. */
/* clang-format off */
static const unsigned char chars[256] = {
    ['\t'] = C_VALUE, [' '] = C_VALUE,
    ['!'] = TH, ['"'] = C_VALUE, ['#'] = TV, ['$'] = TH, ['%'] = TH, ['&'] = TH, ['\''] = TH,
    ['('] = HV, [')'] = HV, ['*'] = TH, ['+'] = TH, [','] = HV,
    ['-'] = ALNUM, ['.'] = ALNUM, ['/'] = C_VALUE,
    ['0' ... '9'] = ALNUM | C_HEX,
    [':'] = HV, [';'] = HV, ['<'] = C_VALUE, ['='] = HV, ['>'] = C_VALUE, ['?'] = C_VALUE,
    ['@'] = C_VALUE,
    ['A' ... 'F'] = ALNUM | C_HEX, ['G' ... 'Z'] = ALNUM,
    ['['] = HV, ['\\'] = C_VALUE, [']'] = HV, ['^'] = TV, ['_'] = ALNUM, ['`'] = TV,
    ['a' ... 'f'] = ALNUM | C_HEX, ['g' ... 'z'] = ALNUM,
    ['{'] = C_VALUE, ['|'] = TV, ['}'] = C_VALUE, ['~'] = TH,
    [0x80 ... 0xff] = C_VALUE,
};
/* clang-format on */

static bool is(unsigned char c, unsigned cls)
{
    return (chars[c] & cls) != 0;
}

static bool is_ows(char c)
{
    return c == ' ' || c == '\t';
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

static bool span_is(const char *s, size_t len, unsigned cls)
{
    for (size_t i = 0; i < len; i++)
        if (!is((unsigned char)s[i], cls))
            return false;
    return true;
}

static bool token_eq(const char *s, size_t len, const char *lit)
{
    return strlen(lit) == len && strncasecmp(s, lit, len) == 0;
}

/* Does the comma-separated list v[0..len) contain the token lit (any case)? With
 * last_only, only its last element counts (Transfer-Encoding: the final coding). */
static bool list_has(const char *v, size_t len, const char *lit, bool last_only)
{
    bool found = false;
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && v[j] != ',')
            j++;
        size_t a = i, b = j;
        while (a < b && is_ows(v[a]))
            a++;
        while (b > a && is_ows(v[b - 1]))
            b--;
        bool eq = b > a && token_eq(v + a, b - a, lit);
        if (last_only)
            found = b > a ? eq : found; /* empty elements do not count (RFC 9110 §5.6.1) */
        else if (eq)
            return true;
        i = j + 1;
    }
    return found;
}

/* End of the line starting at p (its '\n'), or NULL; *content_len excludes an optional
 * '\r' before it. */
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

/* A field line p[0..n) (no line end): a non-empty token, ':' right after it (no white
 * space before the colon; a leading space is obsolete folding), a value of field
 * octets with surrounding white space trimmed. */
static int parse_field(const char *p, size_t n, struct http1_field *f)
{
    size_t i = 0;
    while (i < n && is((unsigned char)p[i], C_TCHAR))
        i++;
    if (i == 0 || i >= n || p[i] != ':')
        return -EBADMSG;
    f->name = p;
    f->name_len = i;
    i++;
    while (i < n && is_ows(p[i]))
        i++;
    size_t e = n;
    while (e > i && is_ows(p[e - 1]))
        e--;
    if (!span_is(p + i, e - i, C_VALUE))
        return -EBADMSG; /* a CR, NUL or other control byte: a splitting vector */
    f->value = p + i;
    f->value_len = e - i;
    return 0;
}

/* A Content-Length value: 1..18 decimal digits (no sign, no white space inside). */
static int parse_length(const char *v, size_t len, uint64_t *out)
{
    if (len == 0 || len > 18)
        return -EBADMSG;
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -EBADMSG;
        n = n * 10 + (uint64_t)(v[i] - '0');
    }
    *out = n;
    return 0;
}

/* ---- request heads --------------------------------------------------------------------- */

/* t[0..tl) is not origin-form: accept "http://authority[/path][?query]" (or https), the
 * scheme in any case. The authority must be a non-empty host[:port] without userinfo
 * (RFC 9110 §4.2.1: an http URI with an empty host is invalid; §4.2.4: userinfo is
 * refused). Asterisk-form and authority-form stay refused (no OPTIONS * or CONNECT). */
static int parse_absolute_form(const char *t, size_t tl, struct http1_request *r)
{
    size_t s;
    if (tl > 7 && strncasecmp(t, "http://", 7) == 0)
        s = 7;
    else if (tl > 8 && strncasecmp(t, "https://", 8) == 0)
        s = 8;
    else
        return -EBADMSG;
    size_t e = s;
    while (e < tl && t[e] != '/' && t[e] != '?')
        e++;
    if (e == s || !span_is(t + s, e - s, C_HOST))
        return -EBADMSG; /* '@' (userinfo) and '#' are not host characters */
    r->absolute_form = true;
    r->host = t + s;
    r->host_len = e - s;
    r->target = t + e;
    r->target_len = tl - e;
    return 0;
}

static int parse_request_line(const char *p, size_t n, struct http1_request *r)
{
    size_t i = 0;
    while (i < n && is((unsigned char)p[i], C_TCHAR))
        i++;
    if (i == 0 || i > 32 || i >= n || p[i] != ' ')
        return -EBADMSG;
    r->method = p;
    r->method_len = i;
    size_t t = ++i;
    while (i < n && p[i] != ' ') {
        unsigned char c = (unsigned char)p[i];
        if (c <= 0x20 || c == 0x7f)
            return -EBADMSG;
        i++;
    }
    if (i == t || i >= n)
        return -EBADMSG;
    if (p[t] == '/') {
        r->target = p + t;
        r->target_len = i - t;
    } else if (parse_absolute_form(p + t, i - t, r) != 0) {
        return -EBADMSG;
    }
    i++;
    const char *v = p + i;
    size_t vl = n - i;
    if (vl != 8 || memcmp(v, "HTTP/", 5) != 0 || v[6] != '.' || v[5] < '0' || v[5] > '9' ||
        v[7] < '0' || v[7] > '9')
        return -EBADMSG;
    if (v[5] != '1')
        return -EPROTONOSUPPORT;
    r->minor = v[7] == '0' ? 0 : 1;
    return 0;
}

static int request_field(struct http1_request *r, const struct http1_field *f, bool *has_te,
                         bool *has_host)
{
    /* every request has one: compared inline rather than through strncasecmp */
    const char *nm = f->name;
    if (f->name_len == 4 && (nm[0] | 0x20) == 'h' && (nm[1] | 0x20) == 'o' &&
        (nm[2] | 0x20) == 's' && (nm[3] | 0x20) == 't') {
        if (*has_host || !span_is(f->value, f->value_len, C_HOST))
            return -EBADMSG; /* a second Host, or one no host[:port] looks like */
        *has_host = true;
        if (!r->absolute_form) { /* else the target's authority wins (§3.2.2) */
            r->host = f->value;
            r->host_len = f->value_len;
        }
    } else if (token_eq(f->name, f->name_len, "Content-Length")) {
        uint64_t n = 0;
        if (parse_length(f->value, f->value_len, &n) != 0)
            return -EBADMSG;
        if (r->has_length && r->content_length != n)
            return -EBADMSG;
        r->has_length = true;
        r->content_length = n;
    } else if (token_eq(f->name, f->name_len, "Transfer-Encoding")) {
        if (*has_te)
            return -EBADMSG;
        if (!token_eq(f->value, f->value_len, "chunked"))
            return -ENOTSUP;
        *has_te = true;
        r->chunked = true;
    } else if (token_eq(f->name, f->name_len, "Connection")) {
        if (list_has(f->value, f->value_len, "close", false))
            r->keep_alive = false;
        else if (list_has(f->value, f->value_len, "keep-alive", false))
            r->keep_alive = true;
    } else if (token_eq(f->name, f->name_len, "Expect")) {
        if (token_eq(f->value, f->value_len, "100-continue"))
            r->expect_continue = true;
    }
    return 0;
}

int http1_parse_request(const char *buf, size_t len, struct http1_request *r)
{
    /* not the whole struct: fields[] is large and filled as parsed */
    memset(r, 0, offsetof(struct http1_request, fields));
    r->has_length = r->chunked = r->keep_alive = r->expect_continue = false;
    r->content_length = 0;
    size_t avail = len < HTTP1_REQUEST_HEAD_MAX ? len : HTTP1_REQUEST_HEAD_MAX;
    const char *p = buf, *end = buf + avail;
    /* Empty lines before the request line (a stray CRLF after a previous body). */
    while (p < end && (*p == '\r' || *p == '\n')) {
        if (*p == '\r' && (p + 1 >= end || p[1] != '\n'))
            break;
        p++;
    }
    /* A method that cannot be one fails now, not once a line end arrives: a TLS
     * ClientHello sent to a plain port is binary and may hold no LF for a long while. */
    for (const char *q = p; q < end && *q != ' '; q++) {
        if (*q == '\r' || *q == '\n')
            break;
        if (!is((unsigned char)*q, C_TCHAR) || q - p >= 32)
            return -EBADMSG;
    }
    size_t n = 0;
    const char *nl = line_end(p, end, &n);
    if (!nl)
        return (size_t)(end - p) > HTTP1_REQUEST_LINE_MAX || len >= HTTP1_REQUEST_HEAD_MAX
                   ? -ENAMETOOLONG
                   : 0;
    if (n > HTTP1_REQUEST_LINE_MAX)
        return -ENAMETOOLONG;
    int rc = parse_request_line(p, n, r);
    if (rc != 0)
        return rc;
    r->keep_alive = r->minor >= 1;
    p = nl + 1;
    bool has_te = false, has_host = false;
    for (;;) {
        nl = line_end(p, end, &n);
        if (!nl)
            goto incomplete;
        if (n == 0)
            break; /* blank line: end of the head */
        if (r->nfields == HTTP1_REQUEST_FIELDS_MAX)
            return -EMSGSIZE;
        struct http1_field *f = &r->fields[r->nfields++];
        rc = parse_field(p, n, f);
        if (rc == 0)
            rc = request_field(r, f, &has_te, &has_host);
        if (rc != 0)
            return rc;
        p = nl + 1;
    }
    if (r->chunked && (r->has_length || r->minor == 0))
        return -EBADMSG;
    if (!r->host && r->minor >= 1)
        return -EBADMSG; /* HTTP/1.1 without Host */
    return (int)(nl + 1 - buf);

incomplete:
    return len >= HTTP1_REQUEST_HEAD_MAX ? -EMSGSIZE : 0;
}

/* ---- response heads -------------------------------------------------------------------- */

/* Offset just past the blank line ending the head, or 0 when not yet there. */
static size_t head_end(const char *buf, size_t len)
{
    const char *p = buf, *e = buf + len;
    while ((p = memchr(p, '\n', (size_t)(e - p)))) {
        p++;
        if (p < e && *p == '\n')
            return (size_t)(p + 1 - buf);
        if (p + 1 < e && p[0] == '\r' && p[1] == '\n')
            return (size_t)(p + 2 - buf);
    }
    return 0;
}

static int response_field(struct http1_response *r, const struct http1_field *f, bool *te)
{
    if (token_eq(f->name, f->name_len, "Content-Length")) {
        uint64_t cl = 0;
        if (parse_length(f->value, f->value_len, &cl) != 0)
            return -EBADMSG;
        if (r->content_length >= 0 && (uint64_t)r->content_length != cl)
            return -EBADMSG; /* conflicting lengths: a smuggling vector */
        r->content_length = (int64_t)cl;
    } else if (token_eq(f->name, f->name_len, "Transfer-Encoding")) {
        *te = true;
        r->chunked = list_has(f->value, f->value_len, "chunked", true);
    } else if (token_eq(f->name, f->name_len, "Connection")) {
        if (list_has(f->value, f->value_len, "close", false))
            r->conn_close = true;
        if (list_has(f->value, f->value_len, "keep-alive", false))
            r->keep_alive = true;
    } else if (token_eq(f->name, f->name_len, "Content-Type")) {
        size_t k = f->value_len < sizeof(r->ctype) - 1 ? f->value_len : sizeof(r->ctype) - 1;
        memcpy(r->ctype, f->value, k);
        r->ctype[k] = '\0';
        r->has_ctype = true;
    }
    return 0;
}

ssize_t http1_parse_response(const char *buf, size_t len, struct http1_response *r)
{
    size_t scan = len < HTTP1_RESPONSE_HEAD_MAX ? len : HTTP1_RESPONSE_HEAD_MAX;
    size_t end = head_end(buf, scan);
    if (!end)
        return len >= HTTP1_RESPONSE_HEAD_MAX ? -EMSGSIZE : 0;
    memset(r, 0, sizeof(*r));
    r->content_length = -1;
    /* Status line: HTTP/1.x SP 3DIGIT [SP reason] */
    const char *p = buf, *e = buf + end;
    const char *eol = memchr(p, '\n', (size_t)(e - p));
    size_t sl = (size_t)(eol - p);
    if (sl < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[7] < '0' || p[7] > '9' || p[8] != ' ')
        return -EBADMSG;
    for (int i = 9; i < 12; i++)
        if (p[i] < '0' || p[i] > '9')
            return -EBADMSG;
    if (sl > 12 && p[12] != ' ' && p[12] != '\r')
        return -EBADMSG;
    if (p[9] == '0')
        return -EBADMSG;
    r->minor = p[7] - '0';
    r->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    bool te = false;
    p = eol + 1;
    for (;;) {
        size_t n = 0;
        eol = line_end(p, e, &n);
        if (n == 0)
            break; /* the blank line */
        struct http1_field f;
        int rc = parse_field(p, n, &f);
        if (rc == 0)
            rc = response_field(r, &f, &te);
        if (rc != 0)
            return rc;
        p = eol + 1;
    }
    if (te && !r->chunked)
        r->conn_close = true; /* an unknown coding: the body runs to the close */
    if (te)
        r->content_length = -1;
    return (ssize_t)end;
}

enum http1_body http1_response_body(const struct http1_response *r, bool head_request)
{
    if (head_request || r->status < 200 || r->status == 204 || r->status == 304)
        return HTTP1_BODY_NONE;
    if (r->chunked)
        return HTTP1_BODY_CHUNKED;
    if (r->content_length >= 0)
        return HTTP1_BODY_LENGTH;
    return HTTP1_BODY_CLOSE;
}

bool http1_response_reusable(const struct http1_response *r)
{
    return !r->conn_close && (r->minor >= 1 || r->keep_alive);
}

/* ---- chunked bodies -------------------------------------------------------------------- */

enum {
    CK_SIZE = 0,
    CK_EXT,
    CK_SIZE_LF,
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER_START,
    CK_TRAILER,
    CK_TRAILER_LF,
    CK_END_LF,
};

#define CK_SIZE_LIMIT ((uint64_t)1 << 60)

void http1_chunked_init(struct http1_chunked *d, unsigned flags)
{
    memset(d, 0, sizeof(*d));
    d->st = CK_SIZE;
    d->flags = flags;
}

static void size_line_done(struct http1_chunked *d)
{
    d->st = d->left ? CK_DATA : CK_TRAILER_START;
    d->line = 0;
    d->digits = 0;
}

ssize_t http1_chunked_step(struct http1_chunked *d, const char *in, size_t len, const char **data,
                           size_t *dlen)
{
    bool strict = (d->flags & HTTP1_CHUNKED_STRICT) != 0;
    size_t tmax = strict ? HTTP1_TRAILERS_MAX_STRICT : HTTP1_TRAILERS_MAX;
    *data = NULL;
    *dlen = 0;
    size_t i = 0;
    while (i < len && !d->done) {
        char ch = in[i];
        switch (d->st) {
        case CK_SIZE: {
            if (++d->line > HTTP1_CHUNK_LINE_MAX)
                return -EMSGSIZE;
            int v = hexval(ch);
            if (v >= 0) {
                if (++d->digits > HTTP1_CHUNK_DIGITS_MAX)
                    return -EMSGSIZE;
                if (d->left >= CK_SIZE_LIMIT / 16)
                    return -EBADMSG;
                d->left = d->left * 16 + (uint64_t)v;
            } else if (d->digits == 0) {
                return -EBADMSG;
            } else if (ch == ';' || is_ows(ch)) {
                d->st = CK_EXT;
            } else if (ch == '\r') {
                d->st = CK_SIZE_LF;
            } else if (ch == '\n' && !strict) {
                size_line_done(d);
            } else {
                return -EBADMSG; /* a bare LF in strict mode included */
            }
            i++;
            break;
        }
        case CK_EXT:
            if (ch == '\r')
                d->st = CK_SIZE_LF;
            else if (ch == '\n' && !strict)
                size_line_done(d);
            else if (!is((unsigned char)ch, C_VALUE))
                return -EBADMSG;
            else if (++d->line > HTTP1_CHUNK_LINE_MAX)
                return -EMSGSIZE;
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n')
                return -EBADMSG;
            size_line_done(d);
            i++;
            break;
        case CK_DATA: {
            size_t n = len - i;
            if ((uint64_t)n > d->left)
                n = (size_t)d->left;
            *data = in + i;
            *dlen = n;
            d->left -= n;
            if (d->left == 0)
                d->st = CK_DATA_CR;
            return (ssize_t)(i + n);
        }
        case CK_DATA_CR:
            if (ch == '\r')
                d->st = CK_DATA_LF;
            else if (ch == '\n' && !strict)
                d->st = CK_SIZE;
            else
                return -EBADMSG;
            i++;
            break;
        case CK_DATA_LF:
            if (ch != '\n')
                return -EBADMSG;
            d->st = CK_SIZE;
            i++;
            break;
        case CK_TRAILER_START:
            if (ch == '\r') {
                d->st = CK_END_LF;
            } else if (ch == '\n') {
                if (strict)
                    return -EBADMSG;
                d->done = true;
            } else {
                if (++d->trailers > tmax)
                    return -EMSGSIZE;
                d->line = 1;
                d->st = CK_TRAILER;
            }
            i++;
            break;
        case CK_TRAILER:
            if (++d->trailers > tmax || ++d->line > HTTP1_CHUNK_LINE_MAX)
                return -EMSGSIZE;
            if (ch == '\n') {
                if (strict)
                    return -EBADMSG;
                d->st = CK_TRAILER_START;
            } else if (ch == '\r' && strict) {
                d->st = CK_TRAILER_LF; /* strict: a CR only before its LF */
            }
            i++;
            break;
        case CK_TRAILER_LF:
            if (ch != '\n')
                return -EBADMSG;
            d->st = CK_TRAILER_START;
            i++;
            break;
        case CK_END_LF:
            if (ch != '\n')
                return -EBADMSG;
            d->done = true;
            i++;
            break;
        default:
            return -EBADMSG;
        }
    }
    return (ssize_t)i;
}

int http1_chunked_decode(struct http1_chunked *d, char *buf, size_t len, size_t *consumed,
                         size_t *out_len)
{
    size_t i = 0, o = 0;
    int rc = 0;
    while (i < len && !d->done) {
        const char *data;
        size_t dl;
        ssize_t k = http1_chunked_step(d, buf + i, len - i, &data, &dl);
        if (k < 0) {
            rc = (int)k;
            break;
        }
        if (dl) {
            if (data != buf + o)
                memmove(buf + o, data, dl);
            o += dl;
        }
        i += (size_t)k;
    }
    *consumed = i;
    *out_len = o;
    if (rc < 0)
        return rc;
    return d->done ? 1 : 0;
}

/* ---- URLs -------------------------------------------------------------------------------- */

int http1_url_parse(const char *url, struct http1_url *u, const char **why)
{
    memset(u, 0, sizeof(*u));
    *why = "";
    if (!url || !url[0]) {
        *why = "no url";
        return -EINVAL;
    }
    for (const unsigned char *p = (const unsigned char *)url; *p; p++)
        if (*p <= 0x20 || *p == 0x7f) {
            /* A space or CR/LF would let a URL smuggle a second request line. */
            *why = "url contains a space or control character";
            return -EINVAL;
        }
    const char *p;
    if (strncasecmp(url, "http://", 7) == 0) {
        p = url + 7;
        u->port = 80;
    } else if (strncasecmp(url, "https://", 8) == 0) {
        p = url + 8;
        u->https = true;
        u->port = 443;
    } else if (strstr(url, "://")) {
        *why = "unsupported url scheme (http:// or https:// only)";
        return -EPROTONOSUPPORT;
    } else {
        *why = "malformed url (no scheme)";
        return -EINVAL;
    }
    size_t auth_len = strcspn(p, "/?#");
    const char *end = p + auth_len;
    if (memchr(p, '@', auth_len)) {
        *why = "user info in urls is not supported";
        return -EINVAL;
    }
    const char *h = p, *hend;
    if (*p == '[') {
        h = p + 1;
        hend = memchr(h, ']', (size_t)(end - h));
        if (!hend || hend == h) {
            *why = "malformed IPv6 literal in url";
            return -EINVAL;
        }
        for (const char *k = h; k < hend; k++)
            if (!(is((unsigned char)*k, C_URLHOST) || *k == ':' || *k == '%')) {
                *why = "malformed IPv6 literal in url";
                return -EINVAL;
            }
        u->ipv6 = true;
        p = hend + 1;
    } else {
        hend = h;
        while (hend < end && *hend != ':')
            hend++;
        if (hend == h) {
            *why = "no host in url";
            return -EINVAL;
        }
        if (!span_is(h, (size_t)(hend - h), C_URLHOST)) {
            *why = "bad character in url host";
            return -EINVAL;
        }
        p = hend;
    }
    if ((size_t)(hend - h) >= sizeof(u->host)) {
        *why = "url host too long";
        return -EINVAL;
    }
    memcpy(u->host, h, (size_t)(hend - h));
    u->host[hend - h] = '\0';
    if (p < end) {
        if (*p != ':') {
            *why = "malformed url authority";
            return -EINVAL;
        }
        p++;
        if (p < end) {
            long port = 0;
            for (; p < end; p++) {
                if (*p < '0' || *p > '9' || port > 65535) {
                    *why = "bad port in url";
                    return -EINVAL;
                }
                port = port * 10 + (*p - '0');
            }
            if (port < 1 || port > 65535) {
                *why = "bad port in url";
                return -EINVAL;
            }
            u->port = (int)port;
        }
    }
    u->path = end;
    u->path_len = strcspn(end, "#");
    return 0;
}

int http1_url_decode(char *dst, const char *src, size_t len, bool plus_space)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        char c = src[i];
        if (c == '%' && len - i >= 3) {
            int hi = hexval(src[i + 1]), lo = hexval(src[i + 2]);
            if (hi >= 0 && lo >= 0) {
                c = (char)(hi * 16 + lo);
                if (c == '\0')
                    return -EBADMSG;
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

const char *http1_openai_error_type(int status)
{
    switch (status) {
    case 400:
        return "BadRequestError";
    case 401:
        return "UnauthorizedError";
    case 403:
        return "PermissionDeniedError";
    case 404:
        return "NotFoundError";
    case 405:
        return "MethodNotAllowedError";
    case 408:
        return "RequestTimeoutError";
    case 409:
        return "ConflictError";
    case 413:
        return "RequestEntityTooLargeError";
    case 414:
        return "URITooLongError";
    case 429:
        return "TooManyRequestsError";
    case 431:
        return "RequestHeaderFieldsTooLargeError";
    case 501:
        return "NotImplementedError";
    case 502:
        return "BadGatewayError";
    case 503:
        return "ServiceUnavailableError";
    case 504:
        return "GatewayTimeoutError";
    case 505:
        return "HTTPVersionNotSupportedError";
    default:
        return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}
