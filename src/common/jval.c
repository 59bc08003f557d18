/* jval — one JSON value, typed and range-checked (see jval.h). */
#include "common/jval.h"

#include "common/util.h"

#include <math.h>
#include <string.h>

enum jval_rc jval_int(const json_t *v, int64_t min, int64_t max, unsigned flags, int64_t *out)
{
    int64_t x;
    if (json_is_integer(v)) {
        x = (int64_t)json_integer_value(v);
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        /* 2^63 is exactly representable; anything at or above it does not fit. */
        bool fits = (flags & JVAL_INT_EXACT)
                        ? d >= -9007199254740992.0 && d <= 9007199254740992.0
                        : d >= -9223372036854775808.0 && d < 9223372036854775808.0;
        if (!isfinite(d) || floor(d) != d || !fits)
            return JVAL_TYPE;
        x = (int64_t)d;
    } else {
        return JVAL_TYPE;
    }
    *out = x;
    return x < min || x > max ? JVAL_RANGE : JVAL_OK;
}

enum jval_rc jval_double(const json_t *v, double min, double max, double *out)
{
    if (!json_is_number(v))
        return JVAL_TYPE;
    double d = json_number_value(v);
    *out = d;
    return !isfinite(d) || d < min || d > max ? JVAL_RANGE : JVAL_OK;
}

enum jval_rc jval_bool(const json_t *v, bool *out)
{
    if (!json_is_boolean(v))
        return JVAL_TYPE;
    *out = json_is_true(v);
    return JVAL_OK;
}

enum jval_rc jval_string(const json_t *v, size_t max_len, const char **out, size_t *len)
{
    if (!json_is_string(v))
        return JVAL_TYPE;
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (n > max_len)
        return JVAL_LONG;
    if (strlen(s) != n)
        return JVAL_NUL;
    *out = s;
    if (len)
        *len = n;
    return JVAL_OK;
}

enum jval_rc jval_enum(const json_t *v, const char *const *names, int *index)
{
    const char *s;
    enum jval_rc rc = jval_string(v, SIZE_MAX, &s, NULL);
    if (rc != JVAL_OK)
        return rc;
    for (int i = 0; names && names[i]; i++) {
        if (strcmp(s, names[i]) == 0) {
            *index = i;
            return JVAL_OK;
        }
    }
    return JVAL_NOMATCH;
}

enum jval_rc jval_numstr(const json_t *v, size_t max_len, char **out)
{
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0)
            return JVAL_NEGATIVE;
        *out = xasprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return JVAL_OK;
    }
    const char *s;
    size_t n;
    enum jval_rc rc = jval_string(v, max_len, &s, &n);
    if (rc == JVAL_OK)
        *out = xstrndup(s, n);
    return rc;
}

int jval_port_value(const char *s)
{
    int port = 0;
    if (!s || util_parse_int(s, 1, 65535, &port) < 0)
        return 0;
    return port;
}

enum jval_rc jval_portstr(const json_t *v, size_t max_len, char **out)
{
    char *s = NULL;
    enum jval_rc rc = jval_numstr(v, max_len, &s);
    if (rc != JVAL_OK)
        return rc;
    bool digits = *s != '\0';
    for (const char *c = s; *c; c++)
        if (*c < '0' || *c > '9')
            digits = false;
    *out = s;
    return digits && jval_port_value(s) ? JVAL_OK : JVAL_NOT_PORT;
}

enum jval_rc jval_array(const json_t *v, size_t max_n)
{
    if (!json_is_array(v))
        return JVAL_TYPE;
    return json_array_size(v) > max_n ? JVAL_LONG : JVAL_OK;
}

const char *jval_type_name(const json_t *v)
{
    if (!v)
        return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "an unknown value";
}
