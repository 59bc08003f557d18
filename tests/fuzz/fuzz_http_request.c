/* libFuzzer: the request side of http1 (the one HTTP/1.1 parse module): the request head
 * parser and the chunked decoder in both modes (no sockets).
 *
 * Input: the first two bytes choose split points; the rest is a byte stream as a client
 * would send it. Every buffer handed to the code under test is an exact-size heap copy,
 * so ASan reports any read past the input. Invariants checked:
 *   head: the length returned is within the input and within HTTP1_REQUEST_HEAD_MAX; every view
 *     lies inside the head; header count within its cap; names non-empty; no CR/LF in
 *     values; chunked excludes Content-Length; an HTTP/1.1 head has a host; the target
 *     is origin-form ('/...') or, for absolute-form, empty or '/...' or '?...' after a
 *     non-empty authority free of '/', '?', '#', '@' and white space (so is the Host
 *     header's value); a complete head parses the same from any
 *     longer input (more bytes never change a finished head), and a prefix of it never
 *     parses as complete with a different length;
 *   chunked: feeding the body in two pieces gives the same result, the same output and
 *     the same consumed count as in one; output never exceeds input; strict mode (request
 *     bodies) accepts nothing the tolerant mode (responses) would not, and where both
 *     accept they agree byte for byte. */
#include "common/http1.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char *copy(const uint8_t *p, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (n)
        memcpy(b, p, n);
    return b;
}

static void check_view(const char *base, size_t len, const char *p, size_t n)
{
    if (n > 0 && (p < base || p + n > base + len))
        abort();
}

static void check_head(const uint8_t *data, size_t size, size_t cut)
{
    char *buf = copy(data, size);
    struct http1_request hd;
    int rc = http1_parse_request(buf, size, &hd);
    if (rc > 0) {
        size_t n = (size_t)rc;
        if (n > size || n > HTTP1_REQUEST_HEAD_MAX)
            abort();
        if (hd.nfields > HTTP1_REQUEST_FIELDS_MAX || hd.method_len == 0 ||
            (hd.minor != 0 && hd.minor != 1))
            abort();
        if (hd.absolute_form ? hd.target_len > 0 && hd.target[0] != '/' && hd.target[0] != '?'
                             : hd.target_len == 0 || hd.target[0] != '/')
            abort();
        if (hd.minor == 1 && !hd.host)
            abort();
        if (hd.absolute_form && hd.host_len == 0)
            abort();
        for (size_t i = 0; hd.host && i < hd.host_len; i++)
            if (strchr("/?#@ \t\r\n", hd.host[i]))
                abort();
        check_view(buf, n, hd.method, hd.method_len);
        check_view(buf, n, hd.target, hd.target_len);
        if (hd.host)
            check_view(buf, n, hd.host, hd.host_len);
        for (size_t i = 0; i < hd.nfields; i++) {
            const struct http1_field *h = &hd.fields[i];
            if (h->name_len == 0)
                abort();
            check_view(buf, n, h->name, h->name_len);
            check_view(buf, n, h->value, h->value_len);
            if (memchr(h->value, '\r', h->value_len) || memchr(h->value, '\n', h->value_len))
                abort();
        }
        if (hd.chunked && hd.has_length)
            abort();
        /* the exact head alone parses the same */
        char *exact = copy(data, n);
        struct http1_request h2;
        if (http1_parse_request(exact, n, &h2) != rc || h2.nfields != hd.nfields)
            abort();
        free(exact);
        /* a strict prefix is incomplete */
        if (cut < n) {
            char *pre = copy(data, cut);
            int prc = http1_parse_request(pre, cut, &h2);
            if (prc > 0)
                abort();
            free(pre);
        }
        /* decode the path and the query as the server does */
        char *dec = malloc(hd.target_len + 1);
        int dl = http1_url_decode(dec, hd.target, hd.target_len, true);
        if (dl > (int)hd.target_len || (dl >= 0 && dec[dl] != '\0'))
            abort();
        free(dec);
    } else if (rc != 0 && rc != -EBADMSG && rc != -EMSGSIZE && rc != -ENOTSUP &&
               rc != -EPROTONOSUPPORT) {
        abort();
    } else if (rc == 0 && size >= HTTP1_REQUEST_HEAD_MAX) {
        abort(); /* a full buffer never waits for more */
    }
    free(buf);
}

static int decode_all(const uint8_t *data, size_t size, size_t cut, unsigned flags, char **out,
                      size_t *out_len, size_t *consumed)
{
    struct http1_chunked c;
    http1_chunked_init(&c, flags);
    char *res = malloc(size + 1);
    size_t rl = 0, total = 0;
    size_t pieces[2] = {cut, size - cut};
    int rc = 0;
    for (int k = 0; k < 2 && rc == 0; k++) {
        char *b = copy(data + total, pieces[k]);
        size_t used = 0, o = 0;
        rc = http1_chunked_decode(&c, b, pieces[k], &used, &o);
        if (used > pieces[k] || o > used)
            abort();
        if (rc == 0 && used != pieces[k])
            abort();
        memcpy(res + rl, b, o);
        rl += o;
        total += used;
        free(b);
    }
    *out = res;
    *out_len = rl;
    *consumed = total;
    return rc;
}

static void check_chunked(const uint8_t *data, size_t size, size_t cut)
{
    char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0, ac = 0, bc = 0;
    int ra = decode_all(data, size, size, HTTP1_CHUNKED_STRICT, &a, &al, &ac);
    int rb = decode_all(data, size, cut, HTTP1_CHUNKED_STRICT, &b, &bl, &bc);
    if (ra != rb || (ra >= 0 && (al != bl || ac != bc || memcmp(a, b, al) != 0)))
        abort();
    if (al > size)
        abort();
    if (ra < 0 && ra != -EBADMSG && ra != -EMSGSIZE)
        abort();
    /* strict acceptance implies tolerant acceptance, of the same bytes */
    char *t = NULL;
    size_t tl = 0, tc = 0;
    int rt = decode_all(data, size, cut, 0, &t, &tl, &tc);
    if (ra == 1 && (rt != 1 || tl != al || tc != ac || memcmp(t, a, al) != 0))
        abort();
    if (rt == 1 && tl > size)
        abort();
    free(t);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t c1 = data[0], c2 = data[1];
    data += 2;
    size -= 2;
    size_t cut1 = size ? (c1 * 131) % (size + 1) : 0;
    size_t cut2 = size ? (c2 * 257) % (size + 1) : 0;
    check_head(data, size, cut1);
    check_chunked(data, size, cut2);
    /* the body after a head, as the server sees it */
    struct http1_request hd;
    char *buf = copy(data, size);
    int rc = http1_parse_request(buf, size, &hd);
    free(buf);
    if (rc > 0 && hd.chunked)
        check_chunked(data + rc, size - (size_t)rc, cut2 > (size_t)rc ? cut2 - (size_t)rc : 0);
    return 0;
}
