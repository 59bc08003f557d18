/* libFuzzer: the response side of http1 (the one HTTP/1.1 parse module), no sockets.
 *
 * Input: byte 0 seeds the split points, the rest is a response as a server would send
 * it. Checked:
 *  - the head parser, fed every prefix at the split points (each in an exact-size heap
 *    copy, so ASan catches any over-read), never claims more than it was given nor more
 *    than HTTP1_RESPONSE_HEAD_MAX, and once it finds a head it finds the same head on longer
 *    input, and a Content-Type it reports holds no control byte (the field rule of requests);
 *  - the chunked decoder, fed the bytes after the head in arbitrary pieces, never
 *    points outside its piece, consumes at least one byte per call until done, and
 *    respects its caps;
 *  - round trip: the input re-encoded as valid chunked framing (chunk sizes from the
 *    seed, with extensions and trailers) decodes, split anywhere, to exactly itself. */
#include "common/http1.h"

#include <errno.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t rnd(uint32_t *s)
{
    *s = *s * 1103515245u + 12345u;
    return *s >> 16;
}

static char *dup_exact(const uint8_t *p, size_t n)
{
    char *b = malloc(n ? n : 1);
    if (n)
        memcpy(b, p, n);
    return b;
}

/* Decodes in[0..len) in random pieces; appends data to out (cap outcap). Returns 1 when
 * done, 0 when input ran out, -1 on a framing error. */
static int decode_split(const uint8_t *in, size_t len, uint32_t *seed, char *out, size_t outcap,
                        size_t *outlen)
{
    struct http1_chunked d;
    http1_chunked_init(&d, 0);
    size_t pos = 0;
    while (pos < len && !d.done) {
        size_t piece = 1 + rnd(seed) % 64;
        if (piece > len - pos)
            piece = len - pos;
        char *buf = dup_exact(in + pos, piece);
        size_t off = 0;
        while (off < piece && !d.done) {
            const char *data;
            size_t dl;
            ssize_t k = http1_chunked_step(&d, buf + off, piece - off, &data, &dl);
            if (k < 0) {
                if (k != -EBADMSG && k != -EMSGSIZE)
                    abort();
                free(buf);
                return -1;
            }
            if (k == 0 || (size_t)k > piece - off)
                abort();
            if (dl) {
                if (data < buf + off || data + dl > buf + off + (size_t)k)
                    abort();
                if (*outlen + dl <= outcap)
                    memcpy(out + *outlen, data, dl);
                *outlen += dl;
            }
            if (d.trailers > HTTP1_TRAILERS_MAX || d.line > HTTP1_CHUNK_LINE_MAX)
                abort();
            off += (size_t)k;
        }
        free(buf);
        pos += piece;
    }
    return d.done ? 1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t seed = data[0] * 2654435761u + (uint32_t)size;
    data++;
    size--;

    /* head parsing over growing prefixes */
    ssize_t found = 0;
    struct http1_response first;
    size_t pos = 0;
    for (;;) {
        pos += 1 + rnd(&seed) % 97;
        if (pos > size)
            pos = size;
        char *buf = dup_exact(data, pos);
        struct http1_response h;
        ssize_t r = http1_parse_response(buf, pos, &h);
        free(buf);
        if (r < 0 && r != -EBADMSG && r != -EMSGSIZE)
            abort();
        if (r > 0) {
            if ((size_t)r > pos || (size_t)r > HTTP1_RESPONSE_HEAD_MAX)
                abort();
            if (h.status < 100 || h.status > 999 || strlen(h.ctype) >= sizeof(h.ctype))
                abort();
            /* the field rule both directions share: no control byte in a value */
            for (const char *c = h.ctype; *c; c++)
                if (((unsigned char)*c < 0x20 && *c != '\t') || *c == 0x7f)
                    abort();
            if (found && (r != found || h.status != first.status))
                abort();
            if (!found) {
                found = r;
                first = h;
            }
        } else if (found) {
            abort(); /* a head found on a prefix must still be found */
        }
        if (pos == size)
            break;
    }

    /* the body after the head through the chunked decoder */
    size_t body_off = found > 0 ? (size_t)found : 0;
    size_t outlen = 0;
    char *out = malloc(size + 1);
    decode_split(data + body_off, size - body_off, &seed, out, size, &outlen);
    if (outlen > size)
        abort();

    /* round trip of valid chunked framing */
    size_t enc_cap = size * 2 + size / 1 * 24 + 256;
    char *enc = malloc(enc_cap);
    size_t e = 0;
    for (size_t i = 0; i < size;) {
        size_t n = 1 + rnd(&seed) % 300;
        if (n > size - i)
            n = size - i;
        int ext = rnd(&seed) % 4 == 0;
        e += (size_t)snprintf(enc + e, enc_cap - e, "%zx%s\r\n", n, ext ? ";x=y" : "");
        memcpy(enc + e, data + i, n);
        e += n;
        memcpy(enc + e, "\r\n", 2);
        e += 2;
        i += n;
    }
    e += (size_t)snprintf(enc + e, enc_cap - e, "0\r\n%s\r\n", rnd(&seed) % 2 ? "X-Trailer: 1\r\n" : "");
    size_t declen = 0;
    char *dec = malloc(size + 1);
    int rc = decode_split((const uint8_t *)enc, e, &seed, dec, size, &declen);
    if (rc != 1 || declen != size || (size && memcmp(dec, data, size) != 0))
        abort();
    free(dec);
    free(enc);
    free(out);
    return 0;
}
