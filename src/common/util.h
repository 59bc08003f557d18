/* util — clocks, checked number parsing, small formatting and file helpers.
 *
 * Every exported function carries the util_ prefix; the allocators that abort on OOM
 * are their own module (xalloc, prefix x), included here because nearly every user of
 * util allocates. Every function here is thread-safe. */
#ifndef MOTOR_UTIL_H
#define MOTOR_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/xalloc.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define MOTOR_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MOTOR_MAX(a, b) ((a) > (b) ? (a) : (b))

/* CLOCK_MONOTONIC in milliseconds: every timeout and duration. */
int64_t util_mono_ms(void);
/* CLOCK_MONOTONIC in microseconds, for latency measurements. */
int64_t util_mono_us(void);
/* Wall clock in milliseconds since the epoch: logs and API timestamps only. */
int64_t util_wall_ms(void);
/* ISO-8601 UTC with milliseconds ("2026-11-30T06:28:31.123Z") into buf (>= 32 bytes). */
void util_wall_iso8601(int64_t wall_millis, char *buf, size_t cap);

/* Parse a whole decimal string into [min, max]. Returns 0, -EINVAL (not a number,
 * leading white space, trailing junk, empty, NULL) or -ERANGE (outside the bounds).
 * *out untouched on error. */
int util_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out);
int util_parse_int(const char *s, int min, int max, int *out);
/* Parse a finite decimal double in [min, max]; same return codes (hex floats, inf and
 * nan are -EINVAL; overflow like 1e400 is -ERANGE). */
int util_parse_double(const char *s, double min, double max, double *out);

/* Raise the soft RLIMIT_NOFILE to the hard limit (a gateway or a controller holds one
 * descriptor per client, node manager and engine connection; distributions default the
 * soft limit to 1024). Returns the soft limit now in force, or -errno. */
long util_raise_nofile_limit(void);

/* Resident set size of this process in KiB (/proc/self/statm), or -1. */
long util_rss_kib(void);

/* Heap bytes in use (glibc mallinfo2: every arena's allocated chunks plus mmapped ones)
 * in KiB, or -1 without glibc. It walks every arena's free lists, locking each in
 * turn: call it seldom (once a second), not per request. */
long util_heap_in_use_kib(void);

/* malloc_trim(0): give the pages of every free chunk of every arena back to the kernel
 * (MADV_DONTNEED; the addresses stay mapped, a later allocation faults them in again).
 * glibc by itself only shrinks a heap from its top, so the free pages below a live chunk
 * stay resident until this. Returns 0, or -1 without glibc. Thread-safe. */
int util_heap_trim(void);

/* Decimal / lower-case hex digits of v into buf (no NUL), returning how many (1..20).
 * For per-request hot paths where a printf round trip is a visible cost. buf >= 20. */
size_t util_fmt_u64(char *buf, uint64_t v);
size_t util_fmt_hex64(char *buf, uint64_t v);

/* Length (1..4) of the valid UTF-8 sequence starting at s; 0 when s is at the NUL or
 * starts an invalid, overlong, surrogate or truncated sequence. For JSON/exposition
 * writers that must never emit invalid UTF-8. */
size_t util_utf8_seq_len(const char *s);
/* The same for a buffer of which only `avail` bytes may be read (no NUL needed): a
 * sequence cut by the end of the buffer is invalid (0). */
size_t util_utf8_seq_len_n(const char *s, size_t avail);

/* Constant-time comparison of two NUL-terminated secrets (length leaks only); false
 * when either is NULL. */
bool util_secret_equal(const char *a, const char *b);

/* Write all of buf to fd, retrying on EINTR/partial writes. 0 or -errno. */
int util_write_all(int fd, const void *buf, size_t n);
/* Read a whole file (at most max_bytes) into a NUL-terminated heap buffer.
 * Returns NULL with errno set (EFBIG when larger than max_bytes). */
char *util_read_file(const char *path, size_t max_bytes, size_t *len_out);
/* Write a file atomically: write to a fresh "<path>.tmp.<pid>.<seq>", fsync, rename over
 * path, fsync the directory. The temp file is removed on failure. 0 or -errno. */
int util_write_file_atomic(const char *path, const void *data, size_t n, int mode);

#endif
