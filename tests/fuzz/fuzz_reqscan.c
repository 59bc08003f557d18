/* libFuzzer: reqscan (the proxy's one-pass body scanner) against jansson, differential.
 * The scanner promises to accept exactly what json_loadb(JSON_DECODE_ANY) accepts and to
 * report the top-level fields the way jansson's tree gives them; any disagreement traps.
 * The scanner reads a heap copy of exactly the input's bytes, so a read past the end is
 * an ASan report rather than luck. */
#include "coordinator/pdreq.h"
#include "coordinator/reqscan.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MUST(c)                                                                                    \
    do {                                                                                           \
        if (!(c))                                                                                  \
            __builtin_trap();                                                                      \
    } while (0)

static enum reqscan_type type_of(const json_t *v)
{
    if (!v)
        return REQSCAN_ABSENT;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return REQSCAN_OBJECT;
    case JSON_ARRAY:
        return REQSCAN_ARRAY;
    case JSON_STRING:
        return REQSCAN_STRING;
    case JSON_INTEGER:
        return REQSCAN_INTEGER;
    case JSON_REAL:
        return REQSCAN_REAL;
    case JSON_TRUE:
        return REQSCAN_TRUE;
    case JSON_FALSE:
        return REQSCAN_FALSE;
    case JSON_NULL:
        return REQSCAN_NULL;
    }
    return REQSCAN_ABSENT;
}

/* The header's character rule over jansson's tree: string bytes, 4 per integer array
 * element, "content" and "text" of objects, nothing below depth 8. */
static size_t chars_of(const json_t *v, int depth)
{
    if (!v || depth > 8)
        return 0;
    if (json_is_string(v))
        return json_string_length(v);
    size_t n = 0;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *x = json_array_get(v, i);
            n += json_is_integer(x) ? 4 : chars_of(x, depth + 1);
        }
    } else if (json_is_object(v)) {
        n += chars_of(json_object_get(v, "content"), depth + 1);
        n += chars_of(json_object_get(v, "text"), depth + 1);
    }
    return n;
}

static void same_fields(const struct reqscan *s, const json_t *j)
{
    bool obj = json_is_object(j);
    MUST(s->top == type_of(j));
    static const char *const keys[] = {"stream",   "model",      "prompt",
                                       "messages", "max_tokens", "max_completion_tokens"};
    const enum reqscan_type got[] = {s->stream,   s->model,      s->prompt,
                                     s->messages, s->max_tokens, s->max_completion_tokens};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        MUST(got[i] == type_of(obj ? json_object_get(j, keys[i]) : NULL));

    const json_t *m = obj ? json_object_get(j, "model") : NULL;
    if (json_is_string(m))
        MUST(s->model_name && strcmp(s->model_name, json_string_value(m)) == 0);
    else
        MUST(!s->model_name);
    const json_t *mt = obj ? json_object_get(j, "max_tokens") : NULL;
    if (json_is_integer(mt))
        MUST(s->max_tokens_value == (int64_t)json_integer_value(mt));
    const json_t *mc = obj ? json_object_get(j, "max_completion_tokens") : NULL;
    if (json_is_integer(mc))
        MUST(s->max_completion_tokens_value == (int64_t)json_integer_value(mc));

    MUST(s->prompt_chars == (obj ? chars_of(json_object_get(j, "prompt"), 0) : 0));
    MUST(s->messages_chars == (obj ? chars_of(json_object_get(j, "messages"), 0) : 0));
    MUST(reqscan_estimate_tokens(s, true) == pdreq_estimate_tokens(j, true));
    MUST(reqscan_estimate_tokens(s, false) == pdreq_estimate_tokens(j, false));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);
    json_t *j = json_loadb(copy, size, JSON_DECODE_ANY, NULL);
    struct reqscan s;
    memset(&s, 0xa5, sizeof(s));
    char err[160];
    memset(err, 'x', sizeof(err));
    int rc = reqscan_parse(copy, size, &s, err, sizeof(err));
    free(copy);
    if (!j) {
        MUST(rc == -EINVAL);
        MUST(memchr(err, '\0', sizeof(err)) && strncmp(err, "invalid JSON at line ", 21) == 0);
        MUST(!s.model_name);
    } else {
        MUST(rc == 0);
        same_fields(&s, j);
        json_decref(j);
    }
    reqscan_release(&s);
    reqscan_release(&s);
    return 0;
}
