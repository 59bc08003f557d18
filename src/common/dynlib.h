/* dynlib — load an optional shared library on first use (dlopen) and resolve a table
 * of its functions.
 *
 * Why: libssl (OpenSSL 3) is needed only for TLS (https:// upstreams, TLS listeners).
 * Linked normally it is mapped and relocated with libcrypto before main() runs, about
 * 1.9 MiB of a small daemon's resident memory; loaded through dynlib it costs nothing
 * until a TLS feature is configured.
 *
 * A table is a struct of function pointers plus a parallel array of symbol names; the
 * module that owns the table declares both (see tls.c). Loading is idempotent and
 * thread-safe; a failure is remembered and reported the same way every time.
 *
 * Threading: any thread. */
#ifndef MOTOR_DYNLIB_H
#define MOTOR_DYNLIB_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

struct dynlib {
    const char *what;              /* for messages: "libssl" */
    const char *const *sonames;    /* tried in order, NULL-terminated: "libssl.so.3", ... */
    const char *const *symbols;    /* n names, in the order of the function-pointer table */
    size_t n;
    void **table;                  /* n slots, filled on success */

    /* Filled by dynlib_load. */
    pthread_once_t once;
    void *handle;
    bool ok;
    char error[256];
};

#define DYNLIB_INIT(what_, sonames_, symbols_, table_)                                        \
    {                                                                                          \
        .what = (what_), .sonames = (sonames_), .symbols = (symbols_),                         \
        .n = sizeof(symbols_) / sizeof((symbols_)[0]), .table = (void **)(table_),             \
        .once = PTHREAD_ONCE_INIT,                                                             \
    }

/* Load the library and resolve every symbol (all or nothing). Returns 0, or -ENOENT
 * when no soname could be opened, -ENOSYS when a symbol is missing; dynlib_error() then
 * says which, ready for a log line or an operator-facing message. */
int dynlib_load(struct dynlib *lib);
/* True once loaded successfully (never loads). */
bool dynlib_loaded(const struct dynlib *lib);
/* Human text for the last failure ("" when none). */
const char *dynlib_error(const struct dynlib *lib);

#endif
