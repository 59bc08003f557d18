/* httpc_parse — URL splitting and HTTP/1.1 response framing for the native client.
 * Pure functions over caller buffers (no allocation, no I/O), so the fuzzer can feed
 * them arbitrary bytes split at arbitrary points. Everything a peer controls is capped:
 * the head (HTTPC_HEAD_MAX), a chunk-size line, the trailers, hex digits of a size. */
#include "common/httpc_internal.h"

#include <errno.h>
#include <string.h>
#include <strings.h>

/* ---- URL ------------------------------------------------------------------------- */

static bool host_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '.' || ch == '_';
}

int httpc_url_parse(const char *url, struct httpc_url *u, const char **why)
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
            if (!(host_char(*k) || *k == ':' || *k == '%')) {
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
        for (const char *k = h; k < hend; k++)
            if (!host_char(*k)) {
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

/* ---- response head ----------------------------------------------------------------- */

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

static bool tchar(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool name_is(const char *name, size_t n, const char *want)
{
    return strlen(want) == n && strncasecmp(name, want, n) == 0;
}

/* Does the comma-separated list v[0..n) contain token tok (case-insensitive)? With
 * last_only, only the last element counts. */
static bool list_has(const char *v, size_t n, const char *tok, bool last_only)
{
    bool found = false;
    size_t tl = strlen(tok);
    size_t i = 0;
    while (i <= n) {
        size_t j = i;
        while (j < n && v[j] != ',')
            j++;
        size_t a = i, b = j;
        while (a < b && (v[a] == ' ' || v[a] == '\t'))
            a++;
        while (b > a && (v[b - 1] == ' ' || v[b - 1] == '\t'))
            b--;
        bool eq = b - a == tl && strncasecmp(v + a, tok, tl) == 0;
        if (last_only)
            found = eq;
        else if (eq)
            return true;
        i = j + 1;
    }
    return found;
}

static int parse_header(const char *line, size_t n, struct httpc_head *h, bool *te)
{
    const char *colon = memchr(line, ':', n);
    if (!colon || colon == line)
        return -EPROTO;
    size_t nl = (size_t)(colon - line);
    for (size_t i = 0; i < nl; i++)
        if (!tchar(line[i]))
            return -EPROTO; /* includes obsolete line folding (leading whitespace) */
    const char *v = colon + 1, *ve = line + n;
    while (v < ve && (*v == ' ' || *v == '\t'))
        v++;
    while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
        ve--;
    size_t vl = (size_t)(ve - v);
    if (name_is(line, nl, "Content-Length")) {
        if (vl == 0 || vl > 18)
            return -EPROTO;
        int64_t cl = 0;
        for (size_t i = 0; i < vl; i++) {
            if (v[i] < '0' || v[i] > '9')
                return -EPROTO;
            cl = cl * 10 + (v[i] - '0');
        }
        if (h->content_length >= 0 && h->content_length != cl)
            return -EPROTO; /* conflicting lengths: a smuggling vector */
        h->content_length = cl;
    } else if (name_is(line, nl, "Transfer-Encoding")) {
        *te = true;
        h->chunked = list_has(v, vl, "chunked", true);
    } else if (name_is(line, nl, "Connection")) {
        if (list_has(v, vl, "close", false))
            h->conn_close = true;
        if (list_has(v, vl, "keep-alive", false))
            h->keep_alive = true;
    } else if (name_is(line, nl, "Content-Type")) {
        size_t k = vl < sizeof(h->ctype) - 1 ? vl : sizeof(h->ctype) - 1;
        memcpy(h->ctype, v, k);
        h->ctype[k] = '\0';
        h->has_ctype = true;
    }
    return 0;
}

ssize_t httpc_parse_head(const char *buf, size_t len, struct httpc_head *h)
{
    size_t scan = len < HTTPC_HEAD_MAX ? len : HTTPC_HEAD_MAX;
    size_t end = head_end(buf, scan);
    if (!end)
        return len >= HTTPC_HEAD_MAX ? -EPROTO : 0;
    memset(h, 0, sizeof(*h));
    h->content_length = -1;
    /* Status line: HTTP/1.x SP 3DIGIT [SP reason] */
    const char *p = buf, *e = buf + end;
    const char *eol = memchr(p, '\n', (size_t)(e - p));
    size_t sl = (size_t)(eol - p);
    if (sl < 12 || memcmp(p, "HTTP/1.", 7) != 0 || p[7] < '0' || p[7] > '9' || p[8] != ' ')
        return -EPROTO;
    for (int i = 9; i < 12; i++)
        if (p[i] < '0' || p[i] > '9')
            return -EPROTO;
    if (sl > 12 && p[12] != ' ' && p[12] != '\r')
        return -EPROTO;
    if (p[9] == '0')
        return -EPROTO;
    h->minor = p[7] - '0';
    h->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    bool te = false;
    p = eol + 1;
    for (;;) {
        eol = memchr(p, '\n', (size_t)(e - p));
        size_t n = (size_t)(eol - p);
        if (n && p[n - 1] == '\r')
            n--;
        if (n == 0)
            break; /* the blank line */
        int rc = parse_header(p, n, h, &te);
        if (rc)
            return rc;
        p = eol + 1;
    }
    if (te && !h->chunked)
        h->conn_close = true; /* unknown coding: the body runs to the close */
    if (te)
        h->content_length = -1;
    return (ssize_t)end;
}

enum httpc_body httpc_body_kind(const struct httpc_head *h, bool method_head)
{
    if (method_head || h->status < 200 || h->status == 204 || h->status == 304)
        return HTTPC_BODY_NONE;
    if (h->chunked)
        return HTTPC_BODY_CHUNKED;
    if (h->content_length >= 0)
        return HTTPC_BODY_LENGTH;
    return HTTPC_BODY_CLOSE;
}

bool httpc_head_reusable(const struct httpc_head *h)
{
    return !h->conn_close && (h->minor >= 1 || h->keep_alive);
}

/* ---- chunked decoding --------------------------------------------------------------- */

enum {
    CK_SIZE,
    CK_EXT,
    CK_SIZE_LF,
    CK_DATA,
    CK_DATA_CR,
    CK_DATA_LF,
    CK_TRAILER_START,
    CK_TRAILER,
    CK_END_LF,
};

void httpc_chunked_init(struct httpc_chunked *d)
{
    memset(d, 0, sizeof(*d));
    d->st = CK_SIZE;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static void size_line_done(struct httpc_chunked *d)
{
    d->st = d->left ? CK_DATA : CK_TRAILER_START;
    d->line = 0;
    d->digits = 0;
}

ssize_t httpc_chunked_step(struct httpc_chunked *d, const char *in, size_t len, const char **data,
                           size_t *dlen)
{
    *data = NULL;
    *dlen = 0;
    size_t i = 0;
    while (i < len && !d->done) {
        char ch = in[i];
        switch (d->st) {
        case CK_SIZE: {
            if (++d->line > HTTPC_CHUNK_LINE_MAX)
                return -EPROTO;
            int v = hexval(ch);
            if (v >= 0) {
                if (++d->digits > 16)
                    return -EPROTO;
                d->left = d->left * 16 + (uint64_t)v;
            } else if (d->digits == 0) {
                return -EPROTO;
            } else if (ch == ';' || ch == ' ' || ch == '\t') {
                d->st = CK_EXT;
            } else if (ch == '\r') {
                d->st = CK_SIZE_LF;
            } else if (ch == '\n') {
                size_line_done(d);
            } else {
                return -EPROTO;
            }
            i++;
            break;
        }
        case CK_EXT:
            if (ch == '\n')
                size_line_done(d);
            else if (++d->line > HTTPC_CHUNK_LINE_MAX)
                return -EPROTO;
            i++;
            break;
        case CK_SIZE_LF:
            if (ch != '\n')
                return -EPROTO;
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
            else if (ch == '\n')
                d->st = CK_SIZE;
            else
                return -EPROTO;
            i++;
            break;
        case CK_DATA_LF:
            if (ch != '\n')
                return -EPROTO;
            d->st = CK_SIZE;
            i++;
            break;
        case CK_TRAILER_START:
            if (ch == '\r') {
                d->st = CK_END_LF;
            } else if (ch == '\n') {
                d->done = true;
            } else {
                if (++d->trailers > HTTPC_TRAILERS_MAX)
                    return -EPROTO;
                d->st = CK_TRAILER;
            }
            i++;
            break;
        case CK_TRAILER:
            if (++d->trailers > HTTPC_TRAILERS_MAX)
                return -EPROTO;
            if (ch == '\n')
                d->st = CK_TRAILER_START;
            i++;
            break;
        case CK_END_LF:
            if (ch != '\n')
                return -EPROTO;
            d->done = true;
            i++;
            break;
        default:
            return -EPROTO;
        }
    }
    return (ssize_t)i;
}
