/* unit_helpers — small helpers shared by unit tests (include after <cmocka.h>). */
#ifndef MOTOR_UNIT_HELPERS_H
#define MOTOR_UNIT_HELPERS_H

#include "common/util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* <repository>/rel (heap), found from this file's path. */
static inline char *repo_path(const char *rel)
{
    char *repo = xstrdup(__FILE__);
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(repo, '/');
        if (slash)
            *slash = '\0';
    }
    char *p = xasprintf("%s/%s", repo, rel);
    free(repo);
    return p;
}

/* JSON written with single quotes (new reference); a parse error fails the test. */
static inline json_t *J(const char *squoted)
{
    char *s = xstrdup(squoted);
    for (char *p = s; *p; p++)
        if (*p == '\'')
            *p = '"';
    json_error_t jerr;
    json_t *j = json_loads(s, 0, &jerr);
    if (!j)
        fail_msg("bad test JSON %s: %s", squoted, jerr.text);
    free(s);
    return j;
}

#endif
