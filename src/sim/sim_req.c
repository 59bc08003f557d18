#include "sim/sim_req.h"

#include "common/util.h"
#include "sim/sim_text.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* snprintf may cut a multi-byte UTF-8 sequence; jansson refuses such strings, so drop a
 * trailing partial sequence. */
static void utf8_trim(char *s)
{
    size_t len = strlen(s);
    size_t i = len;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
        i--;
    if (i == 0)
        return;
    unsigned char lead = (unsigned char)s[i - 1];
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (lead >= 0x80 && len - (i - 1) < need)
        s[i - 1] = '\0';
}

int sim_err_set(struct sim_err *err, int status, const char *param, const char *fmt, ...)
{
    err->status = status;
    snprintf(err->param, sizeof(err->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    utf8_trim(err->message);
    return -EINVAL;
}

void sim_req_release(struct sim_req *req)
{
    if (!req)
        return;
    free(req->model);
    for (size_t i = 0; i < req->n_prompts; i++)
        sim_ids_release(&req->prompts[i].ids);
    free(req->prompts);
    free(req->instructions);
    free(req->metaserver);
    free(req->request_id);
    free(req->remote_engine_id);
    free(req->remote_host);
    free(req->remote_block_ids);
    memset(req, 0, sizeof(*req));
}

int sim_req_prompt_tokens(const struct sim_req *req)
{
    int64_t total = 0;
    for (size_t i = 0; i < req->n_prompts; i++)
        total += req->prompts[i].tokens;
    return total > INT32_MAX ? INT32_MAX : (int)total;
}

static bool is_null_or_absent(const json_t *v)
{
    return !v || json_is_null(v);
}

/* An integer field: JSON integers, or reals with an integral value (pydantic's lax
 * mode accepts 16.0 for an int). present=false when absent or null. */
static int get_int(const json_t *obj, const char *key, int64_t min, int64_t max, int64_t *out,
                   bool *present, struct sim_err *err)
{
    const json_t *v = json_object_get(obj, key);
    *present = false;
    if (is_null_or_absent(v))
        return 0;
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) &&
               fabs(json_real_value(v)) < 9.0e15) {
        x = (int64_t)json_real_value(v);
    } else {
        return sim_err_set(err, 400, key, "'%s' must be an integer", key);
    }
    if (x < min || x > max)
        return sim_err_set(err, 400, key, "'%s' must be between %lld and %lld, got %lld", key,
                           (long long)min, (long long)max, (long long)x);
    *out = x;
    *present = true;
    return 0;
}

static int get_bool(const json_t *obj, const char *key, bool *out, struct sim_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v))
        return 0;
    if (!json_is_boolean(v))
        return sim_err_set(err, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

/* Sampling knobs do not change the simulated text, but their types and ranges are
 * checked like upstream so bad clients see the same 400s. */
static int check_number(const json_t *obj, const char *key, double min, double max,
                        struct sim_err *err)
{
    const json_t *v = json_object_get(obj, key);
    if (is_null_or_absent(v))
        return 0;
    if (!json_is_number(v))
        return sim_err_set(err, 400, key, "'%s' must be a number", key);
    double d = json_number_value(v);
    if (!(d >= min && d <= max))
        return sim_err_set(err, 400, key, "'%s' must be between %g and %g", key, min, max);
    return 0;
}

static int check_stop(const json_t *obj, struct sim_err *err)
{
    const json_t *v = json_object_get(obj, "stop");
    if (is_null_or_absent(v) || json_is_string(v))
        return 0;
    if (!json_is_array(v))
        return sim_err_set(err, 400, "stop", "'stop' must be a string or a list of strings");
    size_t i;
    const json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s))
            return sim_err_set(err, 400, "stop", "'stop' must be a string or a list of strings");
    }
    return 0;
}

static int get_string(const json_t *obj, const char *key, size_t max_len, const char **out,
                      struct sim_err *err)
{
    const json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (is_null_or_absent(v))
        return 0;
    if (!json_is_string(v))
        return sim_err_set(err, 400, key, "'%s' must be a string", key);
    if (json_string_length(v) > max_len)
        return sim_err_set(err, 400, key, "'%s' is longer than %zu bytes", key, max_len);
    *out = json_string_value(v);
    return 0;
}

#define SIM_REQ_MAX_PROMPT_IDS ((size_t)1 << 21) /* a 1 MiB body holds fewer */

static struct sim_prompt *add_prompt(struct sim_req *req)
{
    req->prompts = xrealloc(req->prompts, (req->n_prompts + 1) * sizeof(*req->prompts));
    struct sim_prompt *p = &req->prompts[req->n_prompts++];
    memset(p, 0, sizeof(*p));
    sim_ids_init(&p->ids, SIM_REQ_MAX_PROMPT_IDS);
    return p;
}

static void seal_prompt(struct sim_prompt *p)
{
    p->tokens = (int)p->ids.n;
    p->hash = sim_text_hash_ids(SIM_TEXT_HASH_INIT, p->ids.v, p->ids.n);
}

static int text_prompt(struct sim_req *req, const json_t *s, struct sim_err *err)
{
    if (json_string_length(s) == 0)
        return sim_err_set(err, 400, "prompt", "'prompt' must not be empty");
    struct sim_prompt *p = add_prompt(req);
    sim_tok_encode(json_string_value(s), json_string_length(s), &p->ids);
    if (p->ids.n == 0) /* white space only still is one token's worth of prompt */
        sim_ids_push(&p->ids, ' ');
    seal_prompt(p);
    return 0;
}

/* A pre-tokenized prompt: a non-empty list of token ids of the vocabulary. */
static int ids_prompt(struct sim_req *req, const json_t *arr, struct sim_err *err)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return sim_err_set(err, 400, "prompt", "'prompt' must not be empty");
    struct sim_prompt *p = add_prompt(req);
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t)
    {
        if (!json_is_integer(t) || json_integer_value(t) < 0)
            return sim_err_set(err, 400, "prompt", "token ids in 'prompt' must be integers >= 0");
        if (!sim_tok_valid(json_integer_value(t)))
            return sim_err_set(err, 400, "prompt",
                               "Token id %lld is out of vocabulary (vocabulary size %d)",
                               (long long)json_integer_value(t), (int)SIM_TOK_VOCAB_SIZE);
        sim_ids_push(&p->ids, (int32_t)json_integer_value(t));
    }
    seal_prompt(p);
    return 0;
}

static int parse_completion_prompt(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    const json_t *p = json_object_get(body, "prompt");
    if (is_null_or_absent(p))
        return sim_err_set(err, 400, "prompt", "'prompt' is required");
    if (json_is_string(p))
        return text_prompt(req, p, err);
    if (!json_is_array(p))
        return sim_err_set(err, 400, "prompt",
                           "'prompt' must be a string, a list of strings or a list of token ids");
    if (json_array_size(p) == 0)
        return sim_err_set(err, 400, "prompt", "'prompt' must not be empty");
    const json_t *first = json_array_get(p, 0);
    if (json_is_integer(first))
        return ids_prompt(req, p, err);
    if (json_array_size(p) > SIM_REQ_MAX_PROMPTS)
        return sim_err_set(err, 400, "prompt", "at most %d prompts per request",
                           SIM_REQ_MAX_PROMPTS);
    size_t i;
    const json_t *e;
    json_array_foreach(p, i, e)
    {
        int rc;
        if (json_is_string(e) && json_is_string(first))
            rc = text_prompt(req, e, err);
        else if (json_is_array(e) && json_is_array(first))
            rc = ids_prompt(req, e, err);
        else
            return sim_err_set(
                err, 400, "prompt",
                "'prompt' must be a string, a list of strings or a list of token ids");
        if (rc)
            return rc;
    }
    return 0;
}

/* Append the text of a message's content (a string, null, or a list of text parts
 * joined by "\n"). */
static int content_ids(const json_t *content, size_t i, const char *what, struct sim_ids *out,
                       struct sim_err *err)
{
    if (json_is_string(content)) {
        sim_tok_encode(json_string_value(content), json_string_length(content), out);
        return 0;
    }
    if (is_null_or_absent(content))
        return 0;
    if (!json_is_array(content))
        return sim_err_set(err, 400, what, "%s[%zu].content must be a string or a list of parts",
                           what, i);
    size_t j;
    const json_t *part;
    json_array_foreach(content, j, part)
    {
        const json_t *type = json_object_get(part, "type");
        const json_t *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return sim_err_set(err, 400, what, "%s[%zu].content[%zu] must have a 'type'", what, i,
                               j);
        const char *t = json_string_value(type);
        if (strcmp(t, "text") && strcmp(t, "input_text") && strcmp(t, "output_text"))
            return sim_err_set(err, 400, what,
                               "%s[%zu].content[%zu]: only 'text' parts are supported by this "
                               "model (not '%s')",
                               what, i, j, t);
        if (!json_is_string(text))
            return sim_err_set(err, 400, what, "%s[%zu].content[%zu].text must be a string", what,
                               i, j);
        if (j > 0)
            sim_ids_push(out, '\n');
        sim_tok_encode(json_string_value(text), json_string_length(text), out);
    }
    return 0;
}

int sim_req_render_chat(const json_t *msgs, const json_t *system, bool continue_final,
                        struct sim_ids *out, struct sim_err *err)
{
    if (is_null_or_absent(msgs))
        return sim_err_set(err, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs))
        return sim_err_set(err, 400, "messages", "'messages' must be a list");
    if (json_array_size(msgs) == 0)
        return sim_err_set(err, 400, "messages", "'messages' must not be empty");
    if (json_array_size(msgs) > SIM_REQ_MAX_MESSAGES)
        return sim_err_set(err, 400, "messages", "at most %d messages", SIM_REQ_MAX_MESSAGES);
    int rc;
    if (!is_null_or_absent(system)) {
        /* Anthropic's top-level system prompt: the first message of the template. */
        if ((rc = content_ids(system, 0, "system", out, err)))
            return rc;
        sim_ids_push(out, SIM_TOK_END_SYSTEM);
    }
    size_t last = json_array_size(msgs) - 1;
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return sim_err_set(err, 400, "messages", "messages[%zu] must be an object", i);
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || json_string_length(role) == 0)
            return sim_err_set(err, 400, "messages", "messages[%zu].role must be a string", i);
        if ((rc = content_ids(json_object_get(m, "content"), i, "messages", out, err)))
            return rc;
        /* continue_final_message leaves the last message open: no end marker */
        if (!(continue_final && i == last))
            sim_ids_push(out, sim_tok_end_of(json_string_value(role)));
    }
    return 0;
}

static int parse_messages(struct sim_req *req, const json_t *body, const json_t *system,
                          struct sim_err *err)
{
    struct sim_prompt *p = add_prompt(req);
    int rc = sim_req_render_chat(json_object_get(body, "messages"), system, req->continue_final,
                                 &p->ids, err);
    if (rc)
        return rc;
    seal_prompt(p);
    return 0;
}

/* The Responses API's input: a string (one user message) or a list of items
 * ({"type":"message"?, "role", "content"}); "instructions" is a system message first. */
static int parse_responses_input(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    const json_t *input = json_object_get(body, "input");
    const json_t *ins = json_object_get(body, "instructions");
    if (!is_null_or_absent(ins) && !json_is_string(ins))
        return sim_err_set(err, 400, "instructions", "'instructions' must be a string");
    if (is_null_or_absent(input))
        return sim_err_set(err, 400, "input", "'input' is required");
    json_t *msgs = json_array();
    if (json_is_string(ins)) {
        req->instructions = xstrdup(json_string_value(ins));
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    }
    int rc = 0;
    if (json_is_string(input)) {
        if (json_string_length(input) == 0)
            rc = sim_err_set(err, 400, "input", "'input' must not be empty");
        else
            json_array_append_new(msgs,
                                  json_pack("{s:s, s:O}", "role", "user", "content", input));
    } else if (json_is_array(input) && json_array_size(input) > 0) {
        size_t i;
        const json_t *it;
        json_array_foreach(input, i, it)
        {
            const json_t *type = json_object_get(it, "type");
            if (!json_is_object(it) ||
                (type && (!json_is_string(type) || strcmp(json_string_value(type), "message")))) {
                rc = sim_err_set(err, 400, "input",
                                 "input[%zu]: only message items are supported by this model", i);
                break;
            }
            json_array_append(msgs, (json_t *)it);
        }
    } else {
        rc = sim_err_set(err, 400, "input", "'input' must be a string or a non-empty list");
    }
    if (!rc) {
        struct sim_prompt *p = add_prompt(req);
        rc = sim_req_render_chat(msgs, NULL, false, &p->ids, err);
        if (!rc)
            seal_prompt(p);
        else if (!strcmp(err->param, "messages"))
            snprintf(err->param, sizeof(err->param), "input");
    }
    json_decref(msgs);
    return rc;
}

static int parse_kv(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    const json_t *kv = json_object_get(body, "kv_transfer_params");
    if (is_null_or_absent(kv))
        return 0;
    if (!json_is_object(kv))
        return sim_err_set(err, 400, "kv_transfer_params",
                           "'kv_transfer_params' must be an object");
    bool remote_decode = false, remote_prefill = false;
    int rc = get_bool(kv, "do_remote_decode", &remote_decode, err);
    if (!rc)
        rc = get_bool(kv, "do_remote_prefill", &remote_prefill, err);
    if (rc)
        return rc;
    if (remote_decode && remote_prefill)
        return sim_err_set(err, 400, "kv_transfer_params",
                           "do_remote_decode and do_remote_prefill are exclusive");
    if (remote_decode) {
        req->leg = SIM_LEG_PREFILL;
        return 0;
    }
    if (!remote_prefill)
        return 0;

    const char *meta = NULL;
    if ((rc = get_string(kv, "metaserver", SIM_REQ_MAX_URL_LEN, &meta, err)))
        return rc;
    const json_t *rh = json_object_get(kv, "remote_host");
    if (meta && is_null_or_absent(rh)) {
        /* Trigger mode (layerwise connectors): no ticket yet; the decode engine asks the
         * metaserver to run the prefill for it. */
        if (strncmp(meta, "http://", 7) != 0 || strlen(meta) <= 7)
            return sim_err_set(err, 400, "kv_transfer_params",
                               "kv_transfer_params.metaserver must be an http:// URL");
        req->leg = SIM_LEG_TRIGGER;
        req->metaserver = xstrdup(meta);
        return 0;
    }
    req->leg = SIM_LEG_DECODE;
    const char *host = NULL, *engine = NULL;
    if ((rc = get_string(kv, "remote_host", SIM_REQ_MAX_ID_LEN, &host, err)) ||
        (rc = get_string(kv, "remote_engine_id", SIM_REQ_MAX_ID_LEN, &engine, err)))
        return rc;
    if (!host || !*host)
        return sim_err_set(err, 400, "kv_transfer_params",
                           "kv_transfer_params.remote_host is required with do_remote_prefill");
    int64_t port;
    bool present;
    if ((rc = get_int(kv, "remote_port", 1, 65535, &port, &present, err)))
        return rc;
    if (!present)
        return sim_err_set(err, 400, "kv_transfer_params",
                           "kv_transfer_params.remote_port is required with do_remote_prefill");
    const json_t *ids = json_object_get(kv, "remote_block_ids");
    if (!json_is_array(ids) || json_array_size(ids) == 0 ||
        json_array_size(ids) > SIM_REQ_MAX_BLOCK_IDS)
        return sim_err_set(err, 400, "kv_transfer_params",
                           "kv_transfer_params.remote_block_ids must be a non-empty list of "
                           "at most %d integers",
                           SIM_REQ_MAX_BLOCK_IDS);
    req->remote_block_ids = xcalloc(json_array_size(ids), sizeof(int64_t));
    size_t i;
    const json_t *id;
    json_array_foreach(ids, i, id)
    {
        if (!json_is_integer(id) || json_integer_value(id) < 0)
            return sim_err_set(err, 400, "kv_transfer_params",
                               "kv_transfer_params.remote_block_ids must be integers >= 0");
        req->remote_block_ids[i] = json_integer_value(id);
    }
    req->n_remote_block_ids = json_array_size(ids);
    req->remote_host = xstrdup(host);
    req->remote_engine_id = xstrdup(engine);
    req->remote_port = (int)port;
    return 0;
}

static int parse_stream(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    int rc = get_bool(body, "stream", &req->stream, err);
    if (rc)
        return rc;
    const json_t *so = json_object_get(body, "stream_options");
    if (is_null_or_absent(so))
        return 0;
    if (!json_is_object(so))
        return sim_err_set(err, 400, "stream_options", "'stream_options' must be an object");
    if (!req->stream)
        return sim_err_set(err, 400, "stream_options",
                           "Stream options can only be defined when `stream=True`.");
    if ((rc = get_bool(so, "include_usage", &req->include_usage, err)) ||
        (rc = get_bool(so, "continuous_usage_stats", &req->continuous_usage, err)))
        return rc;
    return 0;
}

const char *sim_req_model(const json_t *body, const struct sim_req_limits *lim,
                          struct sim_err *err)
{
    const char *model;
    if (get_string(body, "model", SIM_REQ_MAX_ID_LEN, &model, err))
        return NULL;
    if (!model)
        return lim->n_models ? lim->models[0] : "";
    for (size_t i = 0; i < lim->n_models; i++)
        if (strcmp(lim->models[i], model) == 0)
            return lim->models[i];
    /* vLLM answers an unknown model with 404 NotFoundError. */
    sim_err_set(err, 404, "model", "The model `%s` does not exist.", model);
    return NULL;
}

static int parse_model(struct sim_req *req, const json_t *body, const struct sim_req_limits *lim,
                       struct sim_err *err)
{
    const char *model;
    int rc = get_string(body, "model", SIM_REQ_MAX_ID_LEN, &model, err);
    if (rc)
        return rc;
    if (!model) {
        req->model = xstrdup(lim->n_models ? lim->models[0] : "");
        return 0;
    }
    for (size_t i = 0; i < lim->n_models; i++) {
        if (strcmp(lim->models[i], model) == 0) {
            req->model = xstrdup(model);
            return 0;
        }
    }
    /* vLLM answers an unknown model with 404 NotFoundError. */
    return sim_err_set(err, 404, "model", "The model `%s` does not exist.", model);
}

static int parse_lengths(struct sim_req *req, const json_t *body, const struct sim_req_limits *lim,
                         struct sim_err *err)
{
    int64_t v;
    bool present;
    int rc;
    int64_t cap = lim->max_model_len;
    bool have_max = false;
    const char *max_key = "max_tokens";
    if (req->api == SIM_API_RESPONSES) {
        max_key = "max_output_tokens";
        if ((rc = get_int(body, max_key, 1, cap, &v, &present, err)))
            return rc;
        if (present) {
            req->max_tokens = (int)v;
            have_max = true;
        }
    } else if (req->api == SIM_API_MESSAGES) {
        /* Anthropic's max_tokens is required */
        if ((rc = get_int(body, "max_tokens", 1, cap, &v, &present, err)))
            return rc;
        if (!present)
            return sim_err_set(err, 400, "max_tokens", "'max_tokens' is required");
    }
    if (req->api == SIM_API_CHAT) {
        /* max_completion_tokens supersedes the deprecated max_tokens in chat. */
        if ((rc = get_int(body, "max_completion_tokens", 1, cap, &v, &present, err)))
            return rc;
        if (present) {
            req->max_tokens = (int)v;
            have_max = true;
            max_key = "max_completion_tokens";
        }
    }
    if (req->api != SIM_API_RESPONSES &&
        (rc = get_int(body, "max_tokens", 1, cap, &v, &present, err)))
        return rc;
    if (req->api != SIM_API_RESPONSES && present && !have_max) {
        req->max_tokens = (int)v;
        have_max = true;
    }
    if ((rc = get_int(body, "min_tokens", 0, cap, &v, &present, err)))
        return rc;
    req->min_tokens = present ? (int)v : 0;

    int longest = 0;
    for (size_t i = 0; i < req->n_prompts; i++)
        longest = req->prompts[i].tokens > longest ? req->prompts[i].tokens : longest;
    if (longest >= lim->max_model_len)
        return sim_err_set(err, 400,
                           req->api == SIM_API_COMPLETIONS ? "prompt"
                           : req->api == SIM_API_RESPONSES ? "input"
                                                           : "messages",
                           "This model's maximum context length is %d tokens. However, your "
                           "request has %d input tokens.",
                           lim->max_model_len, longest);
    if (!have_max) {
        /* Completions default to 16 like OpenAI; chat to the rest of the context, which
         * the generator's natural end bounds. */
        int rest = lim->max_model_len - longest;
        req->max_tokens = req->api == SIM_API_COMPLETIONS
                              ? MOTOR_MIN(SIM_COMPLETIONS_DEFAULT_MAX_TOKENS, rest)
                              : rest;
    } else if ((int64_t)longest + req->max_tokens > lim->max_model_len) {
        return sim_err_set(err, 400, max_key,
                           "This model's maximum context length is %d tokens. However, you "
                           "requested %lld tokens (%d in the prompt, %d for the completion).",
                           lim->max_model_len, (long long)longest + req->max_tokens, longest,
                           req->max_tokens);
    }
    if (req->min_tokens > req->max_tokens)
        return sim_err_set(err, 400, "min_tokens", "'min_tokens' must not exceed '%s'", max_key);
    return 0;
}

/* logprobs: completions take a count; chat a boolean plus top_logprobs; the Responses
 * API top_logprobs. */
static int parse_logprobs(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    int64_t v;
    bool present;
    int rc;
    req->logprobs = -1;
    if (req->api == SIM_API_COMPLETIONS) {
        if ((rc = get_int(body, "logprobs", 0, INT32_MAX, &v, &present, err)))
            return rc;
        if (present)
            req->logprobs = (int)v;
    } else if (req->api == SIM_API_CHAT) {
        bool lp = false;
        if ((rc = get_bool(body, "logprobs", &lp, err)) ||
            (rc = get_int(body, "top_logprobs", 0, INT32_MAX, &v, &present, err)))
            return rc;
        if (present && !lp && v > 0)
            return sim_err_set(err, 400, "top_logprobs",
                               "when using `top_logprobs`, `logprobs` must be set to true.");
        if (lp)
            req->logprobs = present ? (int)v : 0;
    } else if (req->api == SIM_API_RESPONSES) {
        if ((rc = get_int(body, "top_logprobs", 0, INT32_MAX, &v, &present, err)))
            return rc;
        if (present)
            req->logprobs = (int)v;
    }
    if (req->logprobs > SIM_REQ_MAX_LOGPROBS)
        return sim_err_set(err, 400, req->api == SIM_API_COMPLETIONS ? "logprobs" : "top_logprobs",
                           "Requested sample logprobs of %d, which is greater than max allowed: "
                           "%d",
                           req->logprobs, SIM_REQ_MAX_LOGPROBS);
    return get_bool(body, "return_tokens_as_token_ids", &req->return_token_ids, err);
}

static int parse_prompt(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    int rc;
    switch (req->api) {
    case SIM_API_COMPLETIONS:
        return parse_completion_prompt(req, body, err);
    case SIM_API_RESPONSES:
        return parse_responses_input(req, body, err);
    case SIM_API_MESSAGES: {
        const json_t *sys = json_object_get(body, "system");
        if (!is_null_or_absent(sys) && !json_is_string(sys) && !json_is_array(sys))
            return sim_err_set(err, 400, "system", "'system' must be a string or a list");
        return parse_messages(req, body, sys, err);
    }
    default: {
        bool agp = true, cfm = false;
        if ((rc = get_bool(body, "add_generation_prompt", &agp, err)) ||
            (rc = get_bool(body, "continue_final_message", &cfm, err)))
            return rc;
        if (agp && cfm && json_is_true(json_object_get(body, "add_generation_prompt")))
            return sim_err_set(err, 400, "continue_final_message",
                               "Cannot set both `continue_final_message` and "
                               "`add_generation_prompt` to True.");
        req->continue_final = cfm;
        return parse_messages(req, body, NULL, err);
    }
    }
}

int sim_req_parse(const json_t *body, enum sim_api api, const struct sim_req_limits *lim,
                  struct sim_req *out, struct sim_err *err)
{
    memset(out, 0, sizeof(*out));
    memset(err, 0, sizeof(*err));
    out->api = api;
    out->n = 1;
    out->logprobs = -1;
    int rc;
    if (!json_is_object(body)) {
        rc = sim_err_set(err, 400, "", "the request body must be a JSON object");
        goto fail;
    }
    if ((rc = parse_model(out, body, lim, err)) || (rc = parse_prompt(out, body, err)))
        goto fail;

    int64_t v;
    bool present;
    if (api == SIM_API_COMPLETIONS || api == SIM_API_CHAT) {
        if ((rc = get_int(body, "n", 1, SIM_REQ_MAX_N, &v, &present, err)))
            goto fail;
        if (present)
            out->n = (int)v;
    }
    if ((rc = parse_lengths(out, body, lim, err)) || (rc = parse_stream(out, body, err)) ||
        (rc = parse_logprobs(out, body, err)) ||
        (rc = get_bool(body, "ignore_eos", &out->ignore_eos, err)) ||
        (rc = check_number(body, "temperature", 0.0, 1.0e6, err)) ||
        (rc = check_number(body, "top_p", 1e-9, 1.0, err)) ||
        (rc = check_number(body, "presence_penalty", -2.0, 2.0, err)) ||
        (rc = check_number(body, "frequency_penalty", -2.0, 2.0, err)) ||
        (rc = get_int(body, "seed", INT64_MIN, INT64_MAX, &v, &present, err)) ||
        (rc = check_stop(body, err)))
        goto fail;
    const char *rid;
    if ((rc = get_string(body, "request_id", SIM_REQ_MAX_ID_LEN, &rid, err)))
        goto fail;
    if (!rid && json_is_string(json_object_get(body, "rid")) &&
        json_string_length(json_object_get(body, "rid")) <= SIM_REQ_MAX_ID_LEN)
        rid = json_string_value(json_object_get(body, "rid")); /* SGLang's request id */
    out->request_id = xstrdup(rid);
    if ((rc = parse_kv(out, body, err)))
        goto fail;
    if (out->leg != SIM_LEG_NONE && (out->n_prompts != 1 || out->n != 1)) {
        rc = sim_err_set(err, 400, "kv_transfer_params",
                         "a prefill/decode hand-off takes exactly one prompt and n=1");
        goto fail;
    }
    if (out->leg == SIM_LEG_PREFILL && out->stream) {
        rc = sim_err_set(err, 400, "stream",
                         "a prefill leg (do_remote_decode) must not stream: its answer carries "
                         "the kv_transfer_params ticket");
        goto fail;
    }
    return 0;
fail:
    sim_req_release(out);
    return rc;
}
