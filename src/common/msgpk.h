/* msgpk — a bounded MessagePack reader and writer (the msgpack spec, every type).
 *
 * Why it exists: vLLM publishes KV-cache events as msgpack (msgspec) over ZMQ; the
 * coordinator decodes them from untrusted peers and the simulator encodes them. The
 * name avoids msgpack-c's and ludocode's mpack's symbols.
 *
 * Reader: pull-style over one caller-owned buffer, zero-copy (str/bin/ext payloads
 * point into the buffer). It keeps a stack of the containers it is inside, so
 *   - nesting deeper than max_depth is refused (-ELOOP) without recursion;
 *   - a declared array/map count or str/bin/ext length is checked against the bytes
 *     actually left (each element needs >= 1 byte) and against max_len, before anything
 *     trusts it: a hostile 0xdd ffffffff costs nothing;
 *   - msgpk_reader_level() / msgpk_left() tell the caller where it is.
 * Errors are sticky: after the first one every call returns it again.
 *   -ENODATA  the buffer ended inside a value (truncated input)
 *   -EBADMSG  0xc1 (never used) or a type the caller's helper did not expect
 *   -ELOOP    deeper than max_depth
 *   -E2BIG    a length or count beyond max_len
 *   -ERANGE   a typed helper's value does not fit (e.g. uint64 > INT64_MAX as int64)
 *
 * Writer: appends to a strbuf (whose cap bounds it); the shortest encoding for each
 * value, as msgpack-python and msgspec produce. Returns 0 or -E2BIG (strbuf full;
 * the buffer then holds a truncated document: discard it).
 *
 * Pure, no I/O; a reader or writer is used by one thread at a time. */
#ifndef MOTOR_MSGPK_H
#define MOTOR_MSGPK_H

#include "common/strbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MSGPK_MAX_DEPTH 64 /* hard ceiling for max_depth */

enum msgpk_type {
    MSGPK_NIL,
    MSGPK_BOOL,
    MSGPK_INT,   /* a negative integer (int64) */
    MSGPK_UINT,  /* a non-negative integer (uint64), whatever its encoding */
    MSGPK_FLOAT, /* float 32 or float 64, as a double */
    MSGPK_STR,
    MSGPK_BIN,
    MSGPK_ARRAY,
    MSGPK_MAP,
    MSGPK_EXT,
};

struct msgpk_obj {
    enum msgpk_type type;
    union {
        bool b;
        int64_t i;  /* MSGPK_INT */
        uint64_t u; /* MSGPK_UINT */
        double f;
        struct {
            const uint8_t *ptr; /* into the reader's buffer; not NUL-terminated */
            uint32_t len;
            int8_t ext_type; /* MSGPK_EXT only */
        } s;
        uint32_t n; /* MSGPK_ARRAY: elements, MSGPK_MAP: key/value pairs */
    } v;
};

struct msgpk_reader {
    const uint8_t *p, *end;
    int err;          /* sticky first error, 0 */
    int max_depth;    /* containers nested at most (1..MSGPK_MAX_DEPTH) */
    uint32_t max_len; /* largest str/bin/ext length and array/map count accepted */
    int depth;        /* containers currently open */
    /* items still to read in each open container (a map counts keys and values) */
    uint64_t left[MSGPK_MAX_DEPTH];
};

/* max_depth 0 => 32, max_len 0 => 1 << 24. */
void msgpk_reader_init(struct msgpk_reader *r, const void *buf, size_t len, int max_depth,
                       uint32_t max_len);
/* Read the next value's header. For arrays and maps the container is entered: the next
 * reads are its elements. 0 or a negative errno (see above). */
int msgpk_read(struct msgpk_reader *r, struct msgpk_obj *o);
/* Skip the next value whole (containers included), iteratively. 0 or -errno. */
int msgpk_skip(struct msgpk_reader *r);
/* Skip what is left of the innermost open container. 0 or -errno. */
int msgpk_skip_rest(struct msgpk_reader *r);
/* Items left to read in the innermost open container (a map's keys and values both
 * count); at top level: 1 if bytes remain, else 0. */
uint64_t msgpk_left(const struct msgpk_reader *r);
/* Containers still open with items left to read (0 = top level). */
int msgpk_reader_level(const struct msgpk_reader *r);
/* Bytes not consumed yet. */
size_t msgpk_remaining(const struct msgpk_reader *r);

/* Typed helpers: read the next value, which must be of the given kind (else -EBADMSG;
 * the reader is then in error). */
int msgpk_read_nil(struct msgpk_reader *r);
/* true when the next value is nil (then consumed), false otherwise (not consumed). */
bool msgpk_try_nil(struct msgpk_reader *r);
int msgpk_read_bool(struct msgpk_reader *r, bool *out);
/* Any integer encoding that fits; -ERANGE otherwise. */
int msgpk_read_i64(struct msgpk_reader *r, int64_t *out);
int msgpk_read_u64(struct msgpk_reader *r, uint64_t *out);
/* float 32/64, or an integer (converted). */
int msgpk_read_double(struct msgpk_reader *r, double *out);
int msgpk_read_str(struct msgpk_reader *r, const uint8_t **ptr, uint32_t *len);
int msgpk_read_bin(struct msgpk_reader *r, const uint8_t **ptr, uint32_t *len);
int msgpk_read_array(struct msgpk_reader *r, uint32_t *n);
int msgpk_read_map(struct msgpk_reader *r, uint32_t *n);

/* ---- writer ---------------------------------------------------------------------- */
int msgpk_put_nil(struct strbuf *sb);
int msgpk_put_bool(struct strbuf *sb, bool v);
int msgpk_put_int(struct strbuf *sb, int64_t v);
int msgpk_put_uint(struct strbuf *sb, uint64_t v);
int msgpk_put_float(struct strbuf *sb, float v);
int msgpk_put_double(struct strbuf *sb, double v);
int msgpk_put_str(struct strbuf *sb, const void *s, size_t len);
int msgpk_put_cstr(struct strbuf *sb, const char *s);
int msgpk_put_bin(struct strbuf *sb, const void *p, size_t len);
int msgpk_put_ext(struct strbuf *sb, int8_t type, const void *p, size_t len);
/* Headers only: the caller then writes n elements (a map: n key/value pairs). */
int msgpk_put_array(struct strbuf *sb, uint32_t n);
int msgpk_put_map(struct strbuf *sb, uint32_t n);

#endif
