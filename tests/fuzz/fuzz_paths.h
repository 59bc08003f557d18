/* fuzz_paths.h — shared by the configuration fuzz targets (chaos helper).
 *
 * Config loaders read the files a document names (API key files, TLS files). A fuzzer
 * that lets the input choose those paths could make a loader read /dev/stdin or a FIFO
 * and hang, or depend on whatever happens to exist on the machine. So before a document
 * reaches a loader, every string under a key that names a file or directory is replaced:
 * a value starting with 'k' (so the fuzzer can still choose) becomes a real one-line key
 * file created once per process, anything else a path that cannot exist. Both branches
 * of "is the file there" stay reachable. */
#ifndef MOTOR_FUZZ_PATHS_H
#define MOTOR_FUZZ_PATHS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char fuzz_key_path[64];

/* A key file with one line of secret, removed at exit. */
static void fuzz_paths_init(void)
{
    if (fuzz_key_path[0])
        return;
    snprintf(fuzz_key_path, sizeof(fuzz_key_path), "/tmp/motor-fuzz-key-XXXXXX");
    int fd = mkstemp(fuzz_key_path);
    if (fd < 0)
        abort();
    static const char secret[] = "fuzz-secret-key\n";
    if (write(fd, secret, sizeof(secret) - 1) != (ssize_t)(sizeof(secret) - 1))
        abort();
    close(fd);
}

static void fuzz_paths_cleanup(void)
{
    if (fuzz_key_path[0])
        unlink(fuzz_key_path);
}

static bool fuzz_is_path_key(const char *key)
{
    size_t n = strlen(key);
    static const char *const sfx[] = {"_file", "_path", "_dir", "_root", "_files"};
    for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++) {
        size_t m = strlen(sfx[i]);
        if (n >= m && strcmp(key + n - m, sfx[i]) == 0)
            return true;
    }
    return false;
}

/* Rewrite file-naming strings in place (bounded depth: deeper values are left, the
 * loaders only read files at shallow, known places). */
static void fuzz_sanitize_paths(json_t *j, int depth)
{
    if (depth > 12)
        return;
    if (json_is_object(j)) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v)
        {
            if (json_is_string(v) && fuzz_is_path_key(key)) {
                const char *s = json_string_value(v);
                json_string_set(v, s[0] == 'k' ? fuzz_key_path : (s[0] ? "/nonexistent/motor-fuzz" : ""));
            } else if (json_is_array(v) && fuzz_is_path_key(key)) {
                size_t i;
                json_t *el;
                json_array_foreach(v, i, el)
                {
                    if (json_is_string(el))
                        json_string_set(el, "/nonexistent/motor-fuzz");
                }
            } else {
                fuzz_sanitize_paths(v, depth + 1);
            }
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *el;
        json_array_foreach(j, i, el)
        {
            fuzz_sanitize_paths(el, depth + 1);
        }
    }
}

#endif
