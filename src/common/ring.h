/* ring — a fixed-size byte ring that keeps the newest bytes of a stream.
 *
 * Used for the in-memory tail of a child's output: memory is allocated once at init and
 * never grows, however much is written (a child flooding its stdout costs CPU, never
 * memory). Writes overwrite the oldest bytes. The ring knows lines only when asked for a
 * tail: a line is text ending in '\n'; an unterminated last line counts as a line; the
 * oldest line is dropped when its beginning was overwritten.
 *
 * Caller-owned storage (init/release). Not thread-safe: one owner thread. */
#ifndef MOTOR_RING_H
#define MOTOR_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct ring {
    char *buf;
    size_t cap;        /* bytes allocated; fixed */
    size_t start;      /* index of the oldest byte */
    size_t len;        /* bytes held, <= cap */
    uint64_t total;    /* bytes ever written (len + overwritten) */
    bool head_partial; /* the oldest held byte is in the middle of a line */
};

/* Allocates cap bytes (cap > 0; aborts on OOM like xmalloc). */
void ring_init(struct ring *r, size_t cap);
/* Frees the storage; the ring may be init'ed again. NULL-safe. */
void ring_release(struct ring *r);
/* Forget the content (keeps the storage). */
void ring_reset(struct ring *r);

/* Append n bytes, overwriting the oldest ones when full. Never fails. */
void ring_write(struct ring *r, const void *data, size_t n);

size_t ring_len(const struct ring *r);
/* Bytes ever written, including those since overwritten. */
uint64_t ring_total(const struct ring *r);

/* Copy the content, oldest first, into dst (at most dst_cap bytes, the newest ones when
 * it does not fit; no NUL added). whole_lines: skip a partial oldest line. Returns the
 * number of bytes copied. */
size_t ring_copy(const struct ring *r, char *dst, size_t dst_cap, bool whole_lines);

/* The last nlines lines as a NUL-terminated heap string (caller frees; never NULL, ""
 * when empty or nlines == 0). */
char *ring_tail(const struct ring *r, size_t nlines);

/* Offset in buf[0..len) where its last nlines lines begin (an unterminated last line
 * counts). Returns 0 when buf holds nlines lines or fewer, len when nlines == 0. */
size_t ring_lines_start(const char *buf, size_t len, size_t nlines);

#endif
