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
    free(req->prompts);
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

static void add_prompt(struct sim_req *req, uint64_t hash, int tokens)
{
    req->prompts = xrealloc(req->prompts, (req->n_prompts + 1) * sizeof(*req->prompts));
    req->prompts[req->n_prompts].hash = hash;
    req->prompts[req->n_prompts].tokens = tokens;
    req->n_prompts++;
}

static int text_prompt(struct sim_req *req, const json_t *s, struct sim_err *err)
{
    if (json_string_length(s) == 0)
        return sim_err_set(err, 400, "prompt", "'prompt' must not be empty");
    const char *t = json_string_value(s);
    int words = sim_text_count_words(t);
    add_prompt(req, sim_text_hash(SIM_TEXT_HASH_INIT, t, json_string_length(s)),
               words > 0 ? words : 1);
    return 0;
}

/* A pre-tokenized prompt: a non-empty list of token ids. */
static int ids_prompt(struct sim_req *req, const json_t *arr, struct sim_err *err)
{
    size_t n = json_array_size(arr);
    if (n == 0)
        return sim_err_set(err, 400, "prompt", "'prompt' must not be empty");
    uint64_t h = sim_text_hash(SIM_TEXT_HASH_INIT, "ids:", 4);
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t)
    {
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return sim_err_set(err, 400, "prompt", "token ids in 'prompt' must be integers >= 0");
        char num[24];
        int len = snprintf(num, sizeof(num), "%lld,", (long long)json_integer_value(t));
        h = sim_text_hash(h, num, (size_t)len);
    }
    add_prompt(req, h, n > INT32_MAX ? INT32_MAX : (int)n);
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

/* Chat: the conversation is folded into one prompt (role and content of every message),
 * and each message costs one token of template overhead plus its words. */
static int parse_messages(struct sim_req *req, const json_t *body, struct sim_err *err)
{
    const json_t *msgs = json_object_get(body, "messages");
    if (is_null_or_absent(msgs))
        return sim_err_set(err, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs))
        return sim_err_set(err, 400, "messages", "'messages' must be a list");
    if (json_array_size(msgs) == 0)
        return sim_err_set(err, 400, "messages", "'messages' must not be empty");
    uint64_t h = sim_text_hash(SIM_TEXT_HASH_INIT, "chat:", 5);
    int64_t tokens = 0;
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m)
    {
        if (!json_is_object(m))
            return sim_err_set(err, 400, "messages", "messages[%zu] must be an object", i);
        const json_t *role = json_object_get(m, "role");
        if (!json_is_string(role) || json_string_length(role) == 0)
            return sim_err_set(err, 400, "messages", "messages[%zu].role must be a string", i);
        h = sim_text_hash(h, json_string_value(role), json_string_length(role));
        h = sim_text_hash(h, "\x1f", 1);
        tokens += 1;
        const json_t *content = json_object_get(m, "content");
        if (json_is_string(content)) {
            h = sim_text_hash(h, json_string_value(content), json_string_length(content));
            tokens += sim_text_count_words(json_string_value(content));
        } else if (json_is_array(content)) {
            size_t j;
            const json_t *part;
            json_array_foreach(content, j, part)
            {
                const json_t *type = json_object_get(part, "type");
                const json_t *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type))
                    return sim_err_set(err, 400, "messages",
                                       "messages[%zu].content[%zu] must have a 'type'", i, j);
                if (strcmp(json_string_value(type), "text") != 0)
                    return sim_err_set(err, 400, "messages",
                                       "messages[%zu].content[%zu]: only 'text' parts are "
                                       "supported by this model",
                                       i, j);
                if (!json_is_string(text))
                    return sim_err_set(err, 400, "messages",
                                       "messages[%zu].content[%zu].text must be a string", i, j);
                h = sim_text_hash(h, json_string_value(text), json_string_length(text));
                tokens += sim_text_count_words(json_string_value(text));
            }
        } else if (!is_null_or_absent(content)) {
            return sim_err_set(err, 400, "messages",
                               "messages[%zu].content must be a string or a list of parts", i);
        }
        h = sim_text_hash(h, "\x1e", 1);
    }
    add_prompt(req, h, tokens > INT32_MAX ? INT32_MAX : (int)tokens);
    return 0;
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
    if ((rc = get_int(body, "max_tokens", 1, cap, &v, &present, err)))
        return rc;
    if (present && !have_max) {
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
        return sim_err_set(err, 400, req->api == SIM_API_CHAT ? "messages" : "prompt",
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

int sim_req_parse(const json_t *body, enum sim_api api, const struct sim_req_limits *lim,
                  struct sim_req *out, struct sim_err *err)
{
    memset(out, 0, sizeof(*out));
    memset(err, 0, sizeof(*err));
    out->api = api;
    out->n = 1;
    int rc;
    if (!json_is_object(body)) {
        rc = sim_err_set(err, 400, "", "the request body must be a JSON object");
        goto fail;
    }
    if ((rc = parse_model(out, body, lim, err)))
        goto fail;
    rc = api == SIM_API_CHAT ? parse_messages(out, body, err)
                             : parse_completion_prompt(out, body, err);
    if (rc)
        goto fail;

    int64_t v;
    bool present;
    if ((rc = get_int(body, "n", 1, SIM_REQ_MAX_N, &v, &present, err)))
        goto fail;
    if (present)
        out->n = (int)v;
    if ((rc = parse_lengths(out, body, lim, err)) || (rc = parse_stream(out, body, err)) ||
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
