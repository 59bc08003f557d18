/* http1: the HTTP/1.1 syntax both directions share — request heads, response heads, the
 * chunked decoder in its strict (requests) and tolerant (responses) modes, URLs,
 * percent-decoding — as pure functions, table-driven. The wire behaviour on top of them
 * is in test_httpd_native.c and test_httpc_native.c. */
#include "common/http1.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <ctype.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ---- request heads ----------------------------------------------------------------------- */

static void test_parse_request(void **state)
{
    struct http1_request hd;
    const char *r = "\r\nPOST /a?b=c HTTP/1.1\r\nHost:  x \r\nContent-Length: 3\r\n"
                    "Connection: keep-alive, Close\r\nExpect: 100-Continue\r\n\r\nabc";
    int n = http1_parse_request(r, strlen(r), &hd);
    assert_int_equal(n, (int)(strstr(r, "abc") - r));
    assert_int_equal(hd.method_len, 4);
    assert_memory_equal(hd.target, "/a?b=c", 6);
    assert_int_equal(hd.minor, 1);
    assert_int_equal(hd.nfields, 4);
    assert_int_equal(hd.fields[0].value_len, 1);
    assert_true(hd.has_length);
    assert_int_equal(hd.content_length, 3);
    assert_false(hd.keep_alive);
    assert_true(hd.expect_continue);
    /* every prefix is "need more" */
    for (size_t i = 0; i < (size_t)n; i++)
        assert_int_equal(http1_parse_request(r, i, &hd), 0);
    assert_int_equal(hd.host_len, 1);
    assert_memory_equal(hd.host, "x", 1);
    assert_false(hd.absolute_form);
    /* Host: exactly the bytes of host[:port] (RFC 3986 reg-name, IPv4, IP-literal) */
    for (int ch = 1; ch < 256; ch++) {
        char req[64];
        int rl = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: a%cb\r\n\r\n", ch);
        bool want = (ch < 128 && isalnum(ch)) || strchr("-._~%!$&'()*+,;=:[]", ch);
        int got = http1_parse_request(req, (size_t)rl, &hd);
        if (ch == '\t' || ch == ' ') /* white space inside a value */
            want = false;
        if (ch == '\n' || ch == '\r')
            continue; /* ends the line: another case */
        if ((got > 0) != want)
            fail_msg("Host byte 0x%02x: parse gave %d", ch, got);
    }
    /* absolute-form: the authority stands in for Host, the rest is the target */
    const char *abs = "GET hTTp://h.example:80/a/b?c HTTP/1.1\r\nHost: other\r\n\r\n";
    assert_int_equal(http1_parse_request(abs, strlen(abs), &hd), (int)strlen(abs));
    assert_true(hd.absolute_form);
    assert_int_equal(hd.host_len, 12);
    assert_memory_equal(hd.host, "h.example:80", 12);
    assert_int_equal(hd.target_len, 6);
    assert_memory_equal(hd.target, "/a/b?c", 6);
    const char *abs2 = "GET https://h HTTP/1.1\r\n\r\n";
    assert_int_equal(http1_parse_request(abs2, strlen(abs2), &hd), (int)strlen(abs2));
    assert_int_equal(hd.target_len, 0);
    const char *nohost = "GET / HTTP/1.1\r\nA: b\r\n\r\n";
    assert_int_equal(http1_parse_request(nohost, strlen(nohost), &hd), -EBADMSG);
    const char *lf = "GET / HTTP/1.0\nA: b\n\n";
    assert_int_equal(http1_parse_request(lf, strlen(lf), &hd), (int)strlen(lf));
    assert_false(hd.keep_alive);
}

/* The error vocabulary: each flaw maps to its code (the server answers 400, 431, 501,
 * 505 from it). */
static void test_request_errors(void **state)
{
    static const struct {
        const char *req;
        int rc;
    } cases[] = {
        {"GET\r\n\r\n", -EBADMSG},
        {"GET /ok HTTP/1.1 extra\r\nHost: x\r\n\r\n", -EBADMSG},
        {"GET /ok HTTP/1.1\r\nHost: x\r\nA: b\r\n folded\r\n\r\n", -EBADMSG},
        {"GET /ok HTTP/1.1\r\nHost: x\r\nBad Name: x\r\n\r\n", -EBADMSG},
        {"GET /ok HTTP/1.1\r\nHost: x\r\nA: b\x01c\r\n\r\n", -EBADMSG},
        {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", -EBADMSG},
        {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
         -EBADMSG},
        {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", -ENOTSUP},
        {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: "
         "chunked\r\n\r\n",
         -EBADMSG},
        {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", -EPROTONOSUPPORT},
        {"GET / FTP/1.1\r\nHost: x\r\n\r\n", -EBADMSG},
        {"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", -EBADMSG},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct http1_request hd;
        int rc = http1_parse_request(cases[i].req, strlen(cases[i].req), &hd);
        if (rc != cases[i].rc)
            fail_msg("case %zu: got %d, want %d", i, rc, cases[i].rc);
    }
    /* caps: a head above 16 KiB, more than 64 fields */
    size_t big = HTTP1_REQUEST_HEAD_MAX + 100;
    char *b = xmalloc(big);
    int n = snprintf(b, big, "GET / HTTP/1.1\r\nX-Big: ");
    memset(b + n, 'a', big - (size_t)n);
    struct http1_request hd;
    assert_int_equal(http1_parse_request(b, big, &hd), -EMSGSIZE);
    assert_int_equal(http1_parse_request(b, HTTP1_REQUEST_HEAD_MAX - 1, &hd), 0);
    free(b);
    char many[4096];
    size_t off = (size_t)snprintf(many, sizeof(many), "GET / HTTP/1.1\r\nHost: x\r\n");
    for (int i = 0; i < HTTP1_REQUEST_FIELDS_MAX; i++)
        off += (size_t)snprintf(many + off, sizeof(many) - off, "X-%d: v\r\n", i);
    off += (size_t)snprintf(many + off, sizeof(many) - off, "\r\n");
    assert_int_equal(http1_parse_request(many, off, &hd), -EMSGSIZE);
}

/* A request line that cannot become one is refused at its first impossible byte, not
 * once a line end arrives: a TLS ClientHello sent to a plain port is binary and may
 * hold no LF for a long while (the client then waits for a ServerHello forever). */
static void test_request_refused_early(void **state)
{
    static const unsigned char hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc};
    struct http1_request hd;
    for (size_t n = 1; n <= sizeof(hello); n++)
        assert_int_equal(http1_parse_request((const char *)hello, n, &hd), -EBADMSG);
    assert_int_equal(http1_parse_request("GE(", 3, &hd), -EBADMSG);
    assert_int_equal(http1_parse_request("GET", 3, &hd), 0); /* still a possible method */
    char longm[40];
    memset(longm, 'A', sizeof(longm));
    assert_int_equal(http1_parse_request(longm, sizeof(longm), &hd), -EBADMSG);
}

static void test_url_decode(void **state)
{
    char dec[32];
    assert_int_equal(http1_url_decode(dec, "a%20b+c%zz%4", 12, true), 10);
    assert_string_equal(dec, "a b c%zz%4");
    assert_int_equal(http1_url_decode(dec, "a+b", 3, false), 3);
    assert_string_equal(dec, "a+b");
    assert_int_equal(http1_url_decode(dec, "%00", 3, false), -EBADMSG);
}

/* ---- response heads ---------------------------------------------------------------------- */

static void test_parse_response(void **state)
{
    struct http1_response h;
    const char *r = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 12\r\n"
                    "Connection: keep-alive\r\n\r\nbody";
    ssize_t n = http1_parse_response(r, strlen(r), &h);
    assert_int_equal(n, strlen(r) - 4);
    assert_int_equal(h.status, 200);
    assert_int_equal(h.content_length, 12);
    assert_true(h.has_ctype);
    assert_string_equal(h.ctype, "text/event-stream");
    assert_int_equal(http1_response_body(&h, false), HTTP1_BODY_LENGTH);
    assert_int_equal(http1_response_body(&h, true), HTTP1_BODY_NONE);
    assert_true(http1_response_reusable(&h));
    /* every proper prefix is incomplete */
    for (size_t k = 0; k < (size_t)n; k++)
        assert_int_equal(http1_parse_response(r, k, &h), 0);

    r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n";
    assert_true(http1_parse_response(r, strlen(r), &h) > 0);
    assert_int_equal(http1_response_body(&h, false), HTTP1_BODY_CHUNKED);
    r = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n";
    assert_true(http1_parse_response(r, strlen(r), &h) > 0);
    assert_int_equal(http1_response_body(&h, false), HTTP1_BODY_CLOSE);
    assert_false(http1_response_reusable(&h));
    r = "HTTP/1.0 200 OK\nServer: x\n\n";
    assert_int_equal(http1_parse_response(r, strlen(r), &h), strlen(r));
    assert_int_equal(http1_response_body(&h, false), HTTP1_BODY_CLOSE);
    assert_false(http1_response_reusable(&h));
    r = "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n";
    assert_true(http1_parse_response(r, strlen(r), &h) > 0);
    assert_int_equal(http1_response_body(&h, false), HTTP1_BODY_NONE);
    assert_false(http1_response_reusable(&h));
    r = "HTTP/1.1 100 Continue\r\n\r\n";
    assert_true(http1_parse_response(r, strlen(r), &h) > 0);
    assert_int_equal(h.status, 100);

    const char *bad[] = {
        "HTTP/2 200 OK\r\n\r\n",
        "HTTP/1.1 20 OK\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 099 x\r\n\r\n",
        "ICY 200 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
        "HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        /* the field rule requests have: no control byte in a value (a CR could split the
         * headers of an answer that copies this one's Content-Type) */
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\rX-Evil: 1\r\n\r\n",
        "HTTP/1.1 200 OK\r\nX-A: a\x01\r\n\r\n",
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++)
        if (http1_parse_response(bad[i], strlen(bad[i]), &h) != -EBADMSG)
            fail_msg("accepted bad response %zu", i);

    /* no end within the cap */
    size_t big = HTTP1_RESPONSE_HEAD_MAX + 10;
    char *b = xmalloc(big);
    memset(b, 'a', big);
    memcpy(b, "HTTP/1.1 200 OK\r\nX: ", 20);
    assert_int_equal(http1_parse_response(b, big, &h), -EMSGSIZE);
    assert_int_equal(http1_parse_response(b, HTTP1_RESPONSE_HEAD_MAX - 1, &h), 0);
    free(b);
}

/* ---- chunked bodies ------------------------------------------------------------------------ */

/* Decodes s fed in pieces of `piece` bytes with the view API; the decoder's verdict. */
static int decode(const char *s, size_t piece, unsigned flags, char *out, size_t *outlen)
{
    struct http1_chunked d;
    http1_chunked_init(&d, flags);
    size_t len = strlen(s), pos = 0;
    *outlen = 0;
    while (pos < len && !d.done) {
        size_t k = MOTOR_MIN(piece, len - pos);
        size_t off = 0;
        while (off < k && !d.done) {
            const char *data;
            size_t dl;
            ssize_t r = http1_chunked_step(&d, s + pos + off, k - off, &data, &dl);
            if (r < 0)
                return (int)r;
            if (dl)
                memcpy(out + *outlen, data, dl);
            *outlen += dl;
            off += (size_t)r;
        }
        pos += k;
    }
    return d.done ? 1 : 0;
}

static void test_chunked_views(void **state)
{
    const char *enc =
        "5\r\nhello\r\n6;name=value\r\n world\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\n";
    char out[64];
    size_t n;
    for (unsigned flags = 0; flags <= HTTP1_CHUNKED_STRICT; flags++) {
        for (size_t piece = 1; piece <= strlen(enc); piece++) {
            assert_int_equal(decode(enc, piece, flags, out, &n), 1);
            assert_int_equal(n, 21);
            assert_memory_equal(out, "hello world0123456789", 21);
        }
    }
    assert_int_equal(decode("3\nabc\n0\n\n", 1, 0, out, &n), 1); /* tolerant: bare LF */
    assert_int_equal(decode("5\r\nhel", 2, 0, out, &n), 0);      /* incomplete */
    const char *bad[] = {"x\r\n", "\r\n", "5\r\nhelloX\r\n", "5\rx", "5;a\x01\r\n"};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++)
        assert_int_equal(decode(bad[i], 3, 0, out, &n), -EBADMSG);
    /* caps: 17 digits, a size of 2^60, a line above 4 KiB, trailers above 64 KiB */
    assert_true(decode("12345678901234567\r\n", 3, 0, out, &n) < 0);
    assert_int_equal(decode("00000000000000005\r\n", 3, 0, out, &n), -EMSGSIZE);
    assert_int_equal(decode("1000000000000000\r\n", 3, 0, out, &n), -EBADMSG);
    char *longext = xmalloc(HTTP1_CHUNK_LINE_MAX + 16);
    memset(longext, 'e', HTTP1_CHUNK_LINE_MAX + 15);
    memcpy(longext, "1;", 2);
    longext[HTTP1_CHUNK_LINE_MAX + 15] = '\0';
    assert_int_equal(decode(longext, 100, 0, out, &n), -EMSGSIZE);
    free(longext);
    size_t tl = 0, cap = HTTP1_TRAILERS_MAX + 4096;
    char *tr = xmalloc(cap + 16);
    tl += (size_t)snprintf(tr, cap, "0\r\n");
    while (tl < HTTP1_TRAILERS_MAX + 100)
        tl += (size_t)snprintf(tr + tl, cap - tl, "X-Trailer: 0123456789012345678901234567\r\n");
    assert_int_equal(decode(tr, 512, 0, out, &n), -EMSGSIZE);
    free(tr);
}

static void test_chunked_in_place(void **state)
{
    const char *in =
        "4\r\nWiki\r\n5;x=y\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nT: v\r\n\r\nNEXT";
    size_t len = strlen(in);
    /* every split point gives the same result */
    for (size_t cut = 0; cut <= len; cut++) {
        char *buf = xmalloc(len);
        memcpy(buf, in, len);
        struct http1_chunked c;
        http1_chunked_init(&c, HTTP1_CHUNKED_STRICT);
        char out[64];
        size_t olen = 0, used = 0, o = 0;
        int rc = http1_chunked_decode(&c, buf, cut, &used, &o);
        assert_true(rc == 0 || rc == 1);
        memcpy(out, buf, o);
        olen = o;
        size_t total = used;
        if (rc == 0) {
            assert_int_equal(used, cut);
            rc = http1_chunked_decode(&c, buf + cut, len - cut, &used, &o);
            memcpy(out + olen, buf + cut, o);
            olen += o;
            total += used;
        }
        assert_int_equal(rc, 1);
        assert_int_equal(total, len - 4); /* "NEXT" is the next request's */
        assert_int_equal(olen, 23);
        assert_memory_equal(out, "Wikipedia in\r\n\r\nchunks.", 23);
        free(buf);
    }
    static const char *const bad[] = {"x\r\n", "\r\n", "5\r\nabcdeX", "FFFFFFFFFFFFFFFFF\r\n",
                                      "0\r\n\rX"};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        char buf[64];
        size_t bl = strlen(bad[i]), used = 0, o = 0;
        memcpy(buf, bad[i], bl);
        struct http1_chunked c;
        http1_chunked_init(&c, HTTP1_CHUNKED_STRICT);
        assert_true(http1_chunked_decode(&c, buf, bl, &used, &o) < 0);
    }
}

/* Strict mode (request bodies): chunk framing is CRLF only — a bare LF where a size
 * line, a chunk's data, a trailer or the final blank line ends is refused, as are
 * absurd runs of leading zeros and trailers above 8 KiB. A front proxy that does not
 * take LF alone as a line end would frame such a body differently from us (request
 * smuggling). The tolerant mode (responses) accepts the LF cases. */
static void test_chunked_strict(void **state)
{
    static const struct {
        const char *body;
        bool tolerant_ok;
    } cases[] = {
        {"5\nhello\r\n0\r\n\r\n", true},                       /* size line ended by LF */
        {"5;a=b\nhello\r\n0\r\n\r\n", true},                   /* extension ended by LF */
        {"5\r\nhello\n0\r\n\r\n", true},                       /* data ended by LF */
        {"5\r\nhello\r\n0\n\r\n", true},                       /* last-chunk line ended by LF */
        {"5\r\nhello\r\n0\r\n\n", true},                       /* final blank line is LF */
        {"5\r\nhello\r\n0\r\nT: v\n\r\n", true},               /* trailer line ended by LF */
        {"5\r\nhello\r\n0\r\nT: v\rx\r\n\r\n", true},          /* bare CR inside a trailer */
        {"00000000000000000005\r\nhello\r\n0\r\n\r\n", false}, /* 20 digits */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        char buf[64];
        size_t bl = strlen(cases[i].body), used = 0, o = 0;
        memcpy(buf, cases[i].body, bl);
        struct http1_chunked c;
        http1_chunked_init(&c, HTTP1_CHUNKED_STRICT);
        if (http1_chunked_decode(&c, buf, bl, &used, &o) >= 0)
            fail_msg("strict accepted: case %zu", i);
        memcpy(buf, cases[i].body, bl);
        http1_chunked_init(&c, 0);
        int rc = http1_chunked_decode(&c, buf, bl, &used, &o);
        if ((rc == 1) != cases[i].tolerant_ok)
            fail_msg("tolerant case %zu: %d", i, rc);
    }
    const char *good = "0005;a=b\r\nhello\r\n0\r\nT: v\r\n\r\n";
    char buf[64];
    size_t gl = strlen(good), used = 0, o = 0;
    memcpy(buf, good, gl);
    struct http1_chunked c;
    http1_chunked_init(&c, HTTP1_CHUNKED_STRICT);
    assert_int_equal(http1_chunked_decode(&c, buf, gl, &used, &o), 1);
    assert_int_equal(used, gl);
    assert_int_equal(o, 5);
    assert_memory_equal(buf, "hello", 5);
    /* trailers: 8 KiB strict, 64 KiB tolerant */
    size_t cap = 16 * 1024;
    char *tr = xmalloc(cap);
    size_t tl = (size_t)snprintf(tr, cap, "0\r\n");
    while (tl < HTTP1_TRAILERS_MAX_STRICT + 1000)
        tl += (size_t)snprintf(tr + tl, cap - tl, "X-Trailer: 0123456789012345678901234567\r\n");
    tl += (size_t)snprintf(tr + tl, cap - tl, "\r\n");
    char *copy = xmalloc(tl);
    memcpy(copy, tr, tl);
    http1_chunked_init(&c, HTTP1_CHUNKED_STRICT);
    int strict_rc = http1_chunked_decode(&c, copy, tl, &used, &o);
    memcpy(copy, tr, tl);
    http1_chunked_init(&c, 0);
    int tolerant_rc = http1_chunked_decode(&c, copy, tl, &used, &o);
    free(copy);
    free(tr);
    assert_int_equal(strict_rc, -EMSGSIZE);
    assert_int_equal(tolerant_rc, 1);
}

/* ---- URLs ---------------------------------------------------------------------------------- */

static void test_url_parse(void **state)
{
    struct http1_url u;
    const char *why;
    assert_int_equal(http1_url_parse("http://127.0.0.1:8080/v1/x?y=1#frag", &u, &why), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8080);
    assert_int_equal(u.path_len, strlen("/v1/x?y=1"));
    assert_memory_equal(u.path, "/v1/x?y=1", u.path_len);
    assert_int_equal(http1_url_parse("HTTP://Example.com", &u, &why), 0);
    assert_int_equal(u.port, 80);
    assert_int_equal(u.path_len, 0);
    assert_int_equal(http1_url_parse("http://[::1]:9/a", &u, &why), 0);
    assert_true(u.ipv6);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9);
    assert_int_equal(http1_url_parse("http://h?q", &u, &why), 0);
    assert_memory_equal(u.path, "?q", 2);
    assert_int_equal(http1_url_parse("https://h/", &u, &why), 0);
    assert_true(u.https);
    assert_int_equal(u.port, 443);
    const char *bad[] = {"",
                         "h:80/x",
                         "http://",
                         "http://:80/",
                         "http://h:0/",
                         "http://h:65536/",
                         "http://h:8x/",
                         "http://u@h/",
                         "http://h/a b",
                         "http://h/\r\nX: y",
                         "http://[::1/",
                         "http://h!/",
                         "http://[]/"};
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        assert_int_equal(http1_url_parse(bad[i], &u, &why), -EINVAL);
        assert_true(strlen(why) > 0);
    }
    assert_int_equal(http1_url_parse("ftp://h/", &u, &why), -EPROTONOSUPPORT);
}

/* One character table serves both directions: check its classes byte by byte against
 * the RFC sets, through the parsers that use them. */
static void test_character_classes(void **state)
{
    for (int ch = 0; ch < 256; ch++) {
        /* token (RFC 9110 §5.6.2): as a method */
        bool tchar = (ch < 128 && isalnum(ch)) || (ch && strchr("!#$%&'*+-.^_`|~", ch));
        char req[64];
        int n = snprintf(req, sizeof(req), "G%cT / HTTP/1.1\r\nHost: x\r\n\r\n", ch ? ch : '?');
        if (ch == 0)
            req[1] = '\0';
        struct http1_request hd;
        int rc = http1_parse_request(req, (size_t)n, &hd);
        if (ch != ' ' && ch != '\r' && ch != '\n' && (rc > 0) != tchar)
            fail_msg("method byte 0x%02x: %d", ch, rc);
        /* field value (§5.5): HTAB, SP, VCHAR, obs-text */
        bool vchar = ch == '\t' || ch == ' ' || (ch >= 0x21 && ch != 0x7f);
        n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: x\r\nA: a%cb\r\n\r\n",
                     ch ? ch : '?');
        if (ch == 0)
            req[strlen("GET / HTTP/1.1\r\nHost: x\r\nA: a")] = '\0';
        rc = http1_parse_request(req, (size_t)n, &hd);
        if (ch != '\n' && ch != '\r' && (rc > 0) != vchar)
            fail_msg("value byte 0x%02x: %d", ch, rc);
        /* URL host names: letters, digits, '-', '.', '_' */
        bool uh = (ch < 128 && isalnum(ch)) || ch == '-' || ch == '.' || ch == '_';
        char url[32];
        snprintf(url, sizeof(url), "http://a%cb/", ch ? ch : '?');
        if (ch == 0)
            url[8] = '\0';
        struct http1_url u;
        const char *why;
        if (ch != '/' && ch != '?' && ch != '#' && ch != ':' && ch != '@' && ch != 0 &&
            (http1_url_parse(url, &u, &why) == 0) != uh)
            fail_msg("url host byte 0x%02x", ch);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_request),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_request_refused_early),
        cmocka_unit_test(test_url_decode),
        cmocka_unit_test(test_parse_response),
        cmocka_unit_test(test_chunked_views),
        cmocka_unit_test(test_chunked_in_place),
        cmocka_unit_test(test_chunked_strict),
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_character_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
