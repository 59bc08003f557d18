/* libFuzzer: httpd's route table and path matching (no sockets).
 *
 * Input: lines. "+METHOD PATTERN" registers a route (only if httpd_pattern_valid, as
 * httpd_route() does); any other line "METHOD PATH" is looked up. Every pattern and path
 * is also matched raw, to check the matcher on invalid input. Invariants checked:
 * a match substitutes back to exactly the path; captured values are non-empty and
 * contain no '/'; the Allow buffer is always NUL-terminated within its cap. */
#include "common/httpd_internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROUTES 16

static void check_match(const char *pattern, const char *path, const struct httpd_params *ps)
{
    /* Rebuild the path from the pattern and the captured values. */
    size_t cap = strlen(pattern) + strlen(path) + 1;
    char *out = malloc(cap);
    size_t o = 0, k = 0;
    const char *p = pattern;
    while (*p) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            if (!close || k >= ps->n)
                abort();
            const struct httpd_param_view *v = &ps->p[k++];
            if ((size_t)(close - p - 1) != v->name_len || memcmp(p + 1, v->name, v->name_len))
                abort();
            if (v->value_len == 0 || memchr(v->value, '/', v->value_len))
                abort();
            if (o + v->value_len >= cap)
                abort();
            memcpy(out + o, v->value, v->value_len);
            o += v->value_len;
            p = close + 1;
        } else {
            if (o + 1 >= cap)
                abort();
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    if (k != ps->n || strcmp(out, path) != 0)
        abort();
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';

    struct httpd_route_entry routes[MAX_ROUTES];
    size_t nroutes = 0;
    char *line = buf;
    while (line) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        bool def = line[0] == '+';
        char *method = def ? line + 1 : line;
        char *sp = strchr(method, ' ');
        if (sp) {
            *sp = '\0';
            char *target = sp + 1;
            struct httpd_params ps;
            /* raw matching of the text against itself and a fixed pattern */
            if (httpd_path_match(target, target, &ps) && httpd_pattern_valid(target))
                check_match(target, target, &ps);
            if (httpd_path_match("/a/{x}/b", target, &ps))
                check_match("/a/{x}/b", target, &ps);
            if (def) {
                /* httpd_route() refuses empty methods and invalid patterns */
                if (*method && httpd_pattern_valid(target) && nroutes < MAX_ROUTES)
                    routes[nroutes++] =
                        (struct httpd_route_entry){.method = method, .pattern = target};
            } else {
                size_t idx = SIZE_MAX;
                char allow[24];
                enum httpd_match m = httpd_routes_find(routes, nroutes, method, target, &idx, &ps,
                                                       allow, sizeof(allow));
                if (m == HTTPD_MATCH_FOUND) {
                    if (idx >= nroutes)
                        abort();
                    check_match(routes[idx].pattern, target, &ps);
                } else if (m == HTTPD_MATCH_BAD_METHOD) {
                    if (memchr(allow, '\0', sizeof(allow)) == NULL || allow[0] == '\0')
                        abort();
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return 0;
}
