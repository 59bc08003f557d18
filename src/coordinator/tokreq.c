/* tokreq — /tokenize bodies and answers (see tokreq.h). */
#include "coordinator/tokreq.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>

/* What vLLM's TokenizeChatRequest takes besides the messages. */
static const char *const chat_keys[] = {"add_generation_prompt",
                                        "continue_final_message",
                                        "add_special_tokens",
                                        "chat_template",
                                        "chat_template_kwargs",
                                        "mm_processor_kwargs",
                                        "tools",
                                        NULL};

json_t *tokreq_body(const json_t *req, bool chat)
{
    /* No "model": optional in vLLM's tokenize requests, and the name a client uses at the
     * gateway need not be the engine's served name (an engine answers 404 to a name it
     * does not serve). */
    json_t *b = json_object();
    if (chat) {
        json_t *m = json_object_get(req, "messages");
        if (!json_is_array(m))
            goto none;
        json_object_set(b, "messages", m);
        for (int i = 0; chat_keys[i]; i++) {
            json_t *v = json_object_get(req, chat_keys[i]);
            if (v && !json_is_null(v))
                json_object_set(b, chat_keys[i], v);
        }
        return b;
    }
    json_t *p = json_object_get(req, "prompt");
    /* One prompt: a string (a list of one string is the same prompt). */
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (!json_is_string(p))
        goto none;
    json_object_set(b, "prompt", p);
    json_t *ast = json_object_get(req, "add_special_tokens");
    if (json_is_boolean(ast))
        json_object_set(b, "add_special_tokens", ast);
    return b;
none:
    json_decref(b);
    return NULL;
}

static int ids_of(const json_t *a, uint32_t **out, size_t *n)
{
    size_t len = json_array_size(a);
    if (len > TOKREQ_MAX_TOKENS)
        return -EINVAL;
    uint32_t *v = xmalloc((len ? len : 1) * sizeof(uint32_t));
    for (size_t i = 0; i < len; i++) {
        json_t *t = json_array_get(a, i);
        json_int_t x = json_is_integer(t) ? json_integer_value(t) : -1;
        if (x < 0 || x > (json_int_t)UINT32_MAX) {
            free(v);
            return -EINVAL;
        }
        v[i] = (uint32_t)x;
    }
    *out = v;
    *n = len;
    return 0;
}

int tokreq_prompt_ids(const json_t *req, uint32_t **out, size_t *n)
{
    json_t *p = json_object_get(req, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_array(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (!json_is_array(p) || json_array_size(p) == 0 || !json_is_integer(json_array_get(p, 0)))
        return 0;
    return ids_of(p, out, n) < 0 ? -EINVAL : 1;
}

int tokreq_parse(const char *body, size_t len, uint32_t **out, size_t *n)
{
    json_error_t e;
    json_t *j = json_loadb(body, len, 0, &e);
    json_t *t = json_object_get(j, "tokens");
    int rc = json_is_array(t) ? ids_of(t, out, n) : -EINVAL;
    json_decref(j);
    return rc;
}
