/* dynlib — see dynlib.h. pthread_once makes the load race-free without a lock on the
 * hot path; the once routine has no argument, so the library being loaded is handed
 * over through a thread-local pointer. */
#include "common/dynlib.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local struct dynlib *loading;

static void load_once(void)
{
    struct dynlib *lib = loading;
    const char *last_error = "no candidate name";
    for (const char *const *so = lib->sonames; *so; so++) {
        /* RTLD_LOCAL: the library's symbols never interpose on ours or each other's. */
        lib->handle = dlopen(*so, RTLD_NOW | RTLD_LOCAL);
        if (lib->handle)
            break;
        const char *e = dlerror();
        last_error = e ? e : "dlopen failed";
    }
    if (!lib->handle) {
        snprintf(lib->error, sizeof(lib->error), "%s is not available (%s); install it to use this feature",
                 lib->what, last_error);
        return;
    }
    for (size_t i = 0; i < lib->n; i++) {
        void *sym = dlsym(lib->handle, lib->symbols[i]);
        if (!sym) {
            snprintf(lib->error, sizeof(lib->error), "%s lacks symbol %s (version too old?)",
                     lib->what, lib->symbols[i]);
            memset(lib->table, 0, lib->n * sizeof(void *));
            return; /* keep the handle: unloading libraries with TLS destructors is unsafe */
        }
        lib->table[i] = sym;
    }
    __atomic_store_n(&lib->ok, true, __ATOMIC_RELEASE);
}

int dynlib_load(struct dynlib *lib)
{
    loading = lib;
    pthread_once(&lib->once, load_once);
    loading = NULL;
    if (lib->ok)
        return 0;
    return lib->handle ? -ENOSYS : -ENOENT;
}

bool dynlib_loaded(const struct dynlib *lib)
{
    return __atomic_load_n(&lib->ok, __ATOMIC_ACQUIRE);
}

const char *dynlib_error(const struct dynlib *lib)
{
    return lib->error;
}
