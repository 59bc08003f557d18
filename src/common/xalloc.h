/* xalloc — allocation that aborts on OOM (prefix x, as redis's zmalloc).
 *
 * Small allocations abort on OOM (CONVENTIONS §8), so error paths are about input and
 * I/O; every buffer a peer fills still has its own hard cap. Thread-safe. */
#ifndef MOTOR_XALLOC_H
#define MOTOR_XALLOC_H

#include <stddef.h>

/* Allocators: never return NULL (abort with a message on OOM). */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s); /* NULL in, NULL out */
char *xstrndup(const char *s, size_t n);
/* printf into a fresh heap string (the replacement for sprintf). */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
