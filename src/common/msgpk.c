#include "common/msgpk.h"

#include <errno.h>
#include <string.h>

/* ---- reader ----------------------------------------------------------------------- */

void msgpk_reader_init(struct msgpk_reader *r, const void *buf, size_t len, int max_depth,
                       uint32_t max_len)
{
    memset(r, 0, sizeof(*r));
    static const uint8_t none[1];
    r->p = buf ? buf : none;
    r->end = r->p + (buf ? len : 0);
    r->max_depth = max_depth <= 0 ? 32 : max_depth > MSGPK_MAX_DEPTH ? MSGPK_MAX_DEPTH : max_depth;
    r->max_len = max_len ? max_len : (uint32_t)1 << 24;
}

size_t msgpk_remaining(const struct msgpk_reader *r)
{
    return (size_t)(r->end - r->p);
}

uint64_t msgpk_left(const struct msgpk_reader *r)
{
    if (r->depth == 0)
        return r->p < r->end ? 1 : 0;
    return r->left[r->depth - 1];
}

int msgpk_reader_level(const struct msgpk_reader *r)
{
    int d = r->depth;
    while (d > 0 && r->left[d - 1] == 0)
        d--;
    return d;
}

static int fail(struct msgpk_reader *r, int e)
{
    if (!r->err)
        r->err = e;
    return r->err;
}

/* Close the containers whose items have all been read. */
static void settle(struct msgpk_reader *r)
{
    while (r->depth > 0 && r->left[r->depth - 1] == 0)
        r->depth--;
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* Take n bytes of fixed-size header data. */
static const uint8_t *take(struct msgpk_reader *r, size_t n)
{
    if ((size_t)(r->end - r->p) < n) {
        fail(r, -ENODATA);
        return NULL;
    }
    const uint8_t *q = r->p;
    r->p += n;
    return q;
}

static int payload(struct msgpk_reader *r, struct msgpk_obj *o, enum msgpk_type t, uint64_t len)
{
    if (len > r->max_len)
        return fail(r, -E2BIG);
    if (len > (uint64_t)(r->end - r->p))
        return fail(r, -ENODATA);
    o->type = t;
    o->v.s.ptr = r->p;
    o->v.s.len = (uint32_t)len;
    r->p += len;
    return 0;
}

static int container(struct msgpk_reader *r, struct msgpk_obj *o, enum msgpk_type t, uint64_t n)
{
    if (n > r->max_len)
        return fail(r, -E2BIG);
    uint64_t items = t == MSGPK_MAP ? n * 2 : n;
    /* Every element takes at least one byte: a count beyond the bytes left is a lie. */
    if (items > (uint64_t)(r->end - r->p))
        return fail(r, -ENODATA);
    if (r->depth >= r->max_depth)
        return fail(r, -ELOOP);
    o->type = t;
    o->v.n = (uint32_t)n;
    if (items > 0)
        r->left[r->depth++] = items;
    return 0;
}

static int ext(struct msgpk_reader *r, struct msgpk_obj *o, uint64_t len)
{
    const uint8_t *t = take(r, 1);
    if (!t)
        return r->err;
    int rc = payload(r, o, MSGPK_EXT, len);
    if (!rc)
        o->v.s.ext_type = (int8_t)t[0];
    return rc;
}

static int set_int(struct msgpk_obj *o, int64_t v)
{
    if (v >= 0) {
        o->type = MSGPK_UINT;
        o->v.u = (uint64_t)v;
    } else {
        o->type = MSGPK_INT;
        o->v.i = v;
    }
    return 0;
}

int msgpk_read(struct msgpk_reader *r, struct msgpk_obj *o)
{
    memset(o, 0, sizeof(*o));
    if (r->err)
        return r->err;
    settle(r);
    if (r->p >= r->end)
        return fail(r, -ENODATA);
    if (r->depth > 0)
        r->left[r->depth - 1]--;
    uint8_t c = *r->p++;
    const uint8_t *q;
    if (c <= 0x7f)
        return set_int(o, c);
    if (c >= 0xe0)
        return set_int(o, (int8_t)c);
    if (c <= 0x8f)
        return container(r, o, MSGPK_MAP, c & 0x0f);
    if (c <= 0x9f)
        return container(r, o, MSGPK_ARRAY, c & 0x0f);
    if (c <= 0xbf)
        return payload(r, o, MSGPK_STR, c & 0x1f);
    /* lengths/values of 1, 2, 4, 8 bytes follow */
    static const uint8_t width[32] = {
        [0x04] = 1, [0x05] = 2, [0x06] = 4,                         /* bin */
        [0x07] = 1, [0x08] = 2, [0x09] = 4,                         /* ext */
        [0x0a] = 4, [0x0b] = 8,                                     /* float */
        [0x0c] = 1, [0x0d] = 2, [0x0e] = 4, [0x0f] = 8,             /* uint */
        [0x10] = 1, [0x11] = 2, [0x12] = 4, [0x13] = 8,             /* int */
        [0x19] = 1, [0x1a] = 2, [0x1b] = 4,                         /* str */
        [0x1c] = 2, [0x1d] = 4, [0x1e] = 2, [0x1f] = 4,             /* array, map */
    };
    switch (c) {
    case 0xc0:
        o->type = MSGPK_NIL;
        return 0;
    case 0xc1:
        return fail(r, -EBADMSG);
    case 0xc2:
    case 0xc3:
        o->type = MSGPK_BOOL;
        o->v.b = c == 0xc3;
        return 0;
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        return ext(r, o, (uint64_t)1 << (c - 0xd4));
    default:
        break;
    }
    int w = width[c - 0xc0];
    if (!(q = take(r, (size_t)w)))
        return r->err;
    uint64_t v = be(q, w);
    switch (c) {
    case 0xc4:
    case 0xc5:
    case 0xc6:
        return payload(r, o, MSGPK_BIN, v);
    case 0xc7:
    case 0xc8:
    case 0xc9:
        return ext(r, o, v);
    case 0xca: {
        uint32_t bits = (uint32_t)v;
        float f;
        memcpy(&f, &bits, sizeof(f));
        o->type = MSGPK_FLOAT;
        o->v.f = f;
        return 0;
    }
    case 0xcb:
        o->type = MSGPK_FLOAT;
        memcpy(&o->v.f, &v, sizeof(o->v.f));
        return 0;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
        o->type = MSGPK_UINT;
        o->v.u = v;
        return 0;
    case 0xd0:
        return set_int(o, (int8_t)v);
    case 0xd1:
        return set_int(o, (int16_t)v);
    case 0xd2:
        return set_int(o, (int32_t)v);
    case 0xd3:
        return set_int(o, (int64_t)v);
    case 0xd9:
    case 0xda:
    case 0xdb:
        return payload(r, o, MSGPK_STR, v);
    case 0xdc:
    case 0xdd:
        return container(r, o, MSGPK_ARRAY, v);
    default: /* 0xde, 0xdf */
        return container(r, o, MSGPK_MAP, v);
    }
}

int msgpk_skip(struct msgpk_reader *r)
{
    if (r->err)
        return r->err;
    settle(r);
    int d0 = r->depth;
    struct msgpk_obj o;
    int rc = msgpk_read(r, &o);
    while (!rc) {
        settle(r);
        if (r->depth <= d0)
            break;
        rc = msgpk_read(r, &o);
    }
    return rc;
}

int msgpk_skip_rest(struct msgpk_reader *r)
{
    if (r->err)
        return r->err;
    int d = r->depth;
    if (d == 0)
        return 0;
    while (r->depth >= d && r->left[d - 1] > 0) {
        int rc = msgpk_skip(r);
        if (rc)
            return rc;
    }
    settle(r);
    return 0;
}

/* ---- typed helpers ---------------------------------------------------------------- */

static int expect(struct msgpk_reader *r, struct msgpk_obj *o, enum msgpk_type t)
{
    int rc = msgpk_read(r, o);
    if (rc)
        return rc;
    return o->type == t ? 0 : fail(r, -EBADMSG);
}

int msgpk_read_nil(struct msgpk_reader *r)
{
    struct msgpk_obj o;
    return expect(r, &o, MSGPK_NIL);
}

bool msgpk_try_nil(struct msgpk_reader *r)
{
    if (r->err)
        return false;
    settle(r);
    if (r->p < r->end && *r->p == 0xc0) {
        struct msgpk_obj o;
        return msgpk_read(r, &o) == 0;
    }
    return false;
}

int msgpk_read_bool(struct msgpk_reader *r, bool *out)
{
    struct msgpk_obj o;
    int rc = expect(r, &o, MSGPK_BOOL);
    if (!rc)
        *out = o.v.b;
    return rc;
}

int msgpk_read_i64(struct msgpk_reader *r, int64_t *out)
{
    struct msgpk_obj o;
    int rc = msgpk_read(r, &o);
    if (rc)
        return rc;
    if (o.type == MSGPK_INT) {
        *out = o.v.i;
        return 0;
    }
    if (o.type != MSGPK_UINT)
        return fail(r, -EBADMSG);
    if (o.v.u > (uint64_t)INT64_MAX)
        return fail(r, -ERANGE);
    *out = (int64_t)o.v.u;
    return 0;
}

int msgpk_read_u64(struct msgpk_reader *r, uint64_t *out)
{
    struct msgpk_obj o;
    int rc = msgpk_read(r, &o);
    if (rc)
        return rc;
    if (o.type == MSGPK_INT)
        return fail(r, -ERANGE);
    if (o.type != MSGPK_UINT)
        return fail(r, -EBADMSG);
    *out = o.v.u;
    return 0;
}

int msgpk_read_double(struct msgpk_reader *r, double *out)
{
    struct msgpk_obj o;
    int rc = msgpk_read(r, &o);
    if (rc)
        return rc;
    if (o.type == MSGPK_FLOAT)
        *out = o.v.f;
    else if (o.type == MSGPK_UINT)
        *out = (double)o.v.u;
    else if (o.type == MSGPK_INT)
        *out = (double)o.v.i;
    else
        return fail(r, -EBADMSG);
    return 0;
}

static int read_bytes(struct msgpk_reader *r, enum msgpk_type t, const uint8_t **ptr,
                      uint32_t *len)
{
    struct msgpk_obj o;
    int rc = expect(r, &o, t);
    if (!rc) {
        *ptr = o.v.s.ptr;
        *len = o.v.s.len;
    }
    return rc;
}

int msgpk_read_str(struct msgpk_reader *r, const uint8_t **ptr, uint32_t *len)
{
    return read_bytes(r, MSGPK_STR, ptr, len);
}

int msgpk_read_bin(struct msgpk_reader *r, const uint8_t **ptr, uint32_t *len)
{
    return read_bytes(r, MSGPK_BIN, ptr, len);
}

int msgpk_read_array(struct msgpk_reader *r, uint32_t *n)
{
    struct msgpk_obj o;
    int rc = expect(r, &o, MSGPK_ARRAY);
    if (!rc)
        *n = o.v.n;
    return rc;
}

int msgpk_read_map(struct msgpk_reader *r, uint32_t *n)
{
    struct msgpk_obj o;
    int rc = expect(r, &o, MSGPK_MAP);
    if (!rc)
        *n = o.v.n;
    return rc;
}

/* ---- writer ----------------------------------------------------------------------- */

/* One marker byte followed by v in w big-endian bytes. */
static int put_be(struct strbuf *sb, uint8_t marker, uint64_t v, int w)
{
    uint8_t b[9];
    b[0] = marker;
    for (int i = 0; i < w; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (w - 1 - i)));
    return strbuf_append(sb, b, (size_t)w + 1);
}

int msgpk_put_nil(struct strbuf *sb)
{
    return strbuf_putc(sb, (char)0xc0);
}

int msgpk_put_bool(struct strbuf *sb, bool v)
{
    return strbuf_putc(sb, (char)(v ? 0xc3 : 0xc2));
}

int msgpk_put_uint(struct strbuf *sb, uint64_t v)
{
    if (v < 0x80)
        return strbuf_putc(sb, (char)v);
    if (v <= 0xff)
        return put_be(sb, 0xcc, v, 1);
    if (v <= 0xffff)
        return put_be(sb, 0xcd, v, 2);
    if (v <= 0xffffffffULL)
        return put_be(sb, 0xce, v, 4);
    return put_be(sb, 0xcf, v, 8);
}

int msgpk_put_int(struct strbuf *sb, int64_t v)
{
    if (v >= 0)
        return msgpk_put_uint(sb, (uint64_t)v);
    if (v >= -32)
        return strbuf_putc(sb, (char)(uint8_t)(int8_t)v);
    if (v >= INT8_MIN)
        return put_be(sb, 0xd0, (uint64_t)v & 0xff, 1);
    if (v >= INT16_MIN)
        return put_be(sb, 0xd1, (uint64_t)v & 0xffff, 2);
    if (v >= INT32_MIN)
        return put_be(sb, 0xd2, (uint64_t)v & 0xffffffffULL, 4);
    return put_be(sb, 0xd3, (uint64_t)v, 8);
}

int msgpk_put_float(struct strbuf *sb, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return put_be(sb, 0xca, bits, 4);
}

int msgpk_put_double(struct strbuf *sb, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    return put_be(sb, 0xcb, bits, 8);
}

/* A header then the bytes, all or nothing. */
static int put_hdr_data(struct strbuf *sb, size_t before, int rc, const void *p, size_t len)
{
    if (!rc && len)
        rc = strbuf_append(sb, p, len);
    if (rc && sb->len > before) {
        sb->len = before;
        sb->buf[before] = '\0';
    }
    return rc;
}

int msgpk_put_str(struct strbuf *sb, const void *s, size_t len)
{
    if (len > 0xffffffffULL)
        return -E2BIG;
    size_t before = sb->len;
    int rc;
    if (len < 32)
        rc = strbuf_putc(sb, (char)(0xa0 | len));
    else if (len <= 0xff)
        rc = put_be(sb, 0xd9, len, 1);
    else if (len <= 0xffff)
        rc = put_be(sb, 0xda, len, 2);
    else
        rc = put_be(sb, 0xdb, len, 4);
    return put_hdr_data(sb, before, rc, s, len);
}

int msgpk_put_cstr(struct strbuf *sb, const char *s)
{
    return msgpk_put_str(sb, s, strlen(s));
}

int msgpk_put_bin(struct strbuf *sb, const void *p, size_t len)
{
    if (len > 0xffffffffULL)
        return -E2BIG;
    size_t before = sb->len;
    int rc;
    if (len <= 0xff)
        rc = put_be(sb, 0xc4, len, 1);
    else if (len <= 0xffff)
        rc = put_be(sb, 0xc5, len, 2);
    else
        rc = put_be(sb, 0xc6, len, 4);
    return put_hdr_data(sb, before, rc, p, len);
}

int msgpk_put_ext(struct strbuf *sb, int8_t type, const void *p, size_t len)
{
    if (len > 0xffffffffULL)
        return -E2BIG;
    size_t before = sb->len;
    uint8_t h[6];
    size_t hn;
    if (len == 1 || len == 2 || len == 4 || len == 8 || len == 16) {
        h[0] = (uint8_t)(0xd4 + (len == 1 ? 0 : len == 2 ? 1 : len == 4 ? 2 : len == 8 ? 3 : 4));
        hn = 1;
    } else if (len <= 0xff) {
        h[0] = 0xc7;
        h[1] = (uint8_t)len;
        hn = 2;
    } else if (len <= 0xffff) {
        h[0] = 0xc8;
        h[1] = (uint8_t)(len >> 8);
        h[2] = (uint8_t)len;
        hn = 3;
    } else {
        h[0] = 0xc9;
        for (int i = 0; i < 4; i++)
            h[1 + i] = (uint8_t)(len >> (8 * (3 - i)));
        hn = 5;
    }
    h[hn++] = (uint8_t)type;
    int rc = strbuf_append(sb, h, hn);
    return put_hdr_data(sb, before, rc, p, len);
}

int msgpk_put_array(struct strbuf *sb, uint32_t n)
{
    if (n < 16)
        return strbuf_putc(sb, (char)(0x90 | n));
    if (n <= 0xffff)
        return put_be(sb, 0xdc, n, 2);
    return put_be(sb, 0xdd, n, 4);
}

int msgpk_put_map(struct strbuf *sb, uint32_t n)
{
    if (n < 16)
        return strbuf_putc(sb, (char)(0x80 | n));
    if (n <= 0xffff)
        return put_be(sb, 0xde, n, 2);
    return put_be(sb, 0xdf, n, 4);
}
