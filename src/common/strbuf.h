/* strbuf — a growable byte buffer with a hard cap.
 *
 * Every buffer filled by a peer has a cap (CONVENTIONS §8): an append that would exceed
 * it appends nothing, sets `overflow` and returns -E2BIG, so callers answer 413/502
 * instead of growing without bound. The content is always NUL-terminated.
 * Not thread-safe; caller-owned storage (init/release). */
#ifndef MOTOR_STRBUF_H
#define MOTOR_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
    char *buf;     /* NUL-terminated; NULL until the first append */
    size_t len;    /* bytes in use, excluding the NUL */
    size_t cap;    /* allocated bytes */
    size_t max;    /* hard cap on len */
    bool overflow; /* set once an append was refused */
};

/* max: the hard cap on len in bytes (must be > 0). */
void strbuf_init(struct strbuf *sb, size_t max);
/* Frees the storage; the buffer may be init'ed again. NULL-safe. */
void strbuf_release(struct strbuf *sb);
/* Empties the buffer (keeps storage, clears overflow). */
void strbuf_reset(struct strbuf *sb);

/* Append n bytes. 0, or -E2BIG when len + n > max (nothing appended). */
int strbuf_append(struct strbuf *sb, const void *data, size_t n);
/* Make room for `extra` more bytes now (one allocation instead of several doublings
 * when the caller knows roughly what is coming). 0, or -E2BIG past max (nothing
 * changed, the overflow flag is not set: nothing was cut). */
int strbuf_grow(struct strbuf *sb, size_t extra);
int strbuf_puts(struct strbuf *sb, const char *s);
int strbuf_putc(struct strbuf *sb, char c);
/* Append v in decimal (no printf). 0 or -E2BIG. */
int strbuf_put_u64(struct strbuf *sb, unsigned long long v);
int strbuf_appendf(struct strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Append s as a JSON string literal (with quotes and escapes; each byte of invalid
 * UTF-8 becomes \ufffd). All or nothing, like every append. */
int strbuf_put_json_string(struct strbuf *sb, const char *s);

/* The content ("" when empty); valid until the next append/release. */
const char *strbuf_str(const struct strbuf *sb);
/* Hand the heap string to the caller (never NULL) and reset the buffer. */
char *strbuf_take(struct strbuf *sb);
/* Drop the first n bytes (n > len drops everything). */
void strbuf_consume(struct strbuf *sb, size_t n);

#endif
