/* libFuzzer: bytes -> JSON -> sim_req_parse as a completions and as a chat body (the
 * simulator's untrusted input), then every response shape built from an accepted request
 * (body, stream chunks, SSE framing, error bodies). Checks the parser's promises: an
 * accepted request is within the limits, a rejected one has a 4xx status and a message
 * that is valid UTF-8 (it goes into a JSON error body). */
#include "common/strbuf.h"
#include "sim/sim_req.h"
#include "sim/sim_resp.h"
#include "sim/sim_text.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const models[] = {"sim-model", "alias"};
static const struct sim_req_limits lim = {.max_model_len = 512, .models = models, .n_models = 2};

static void exercise(const struct sim_req *r)
{
    if (r->n_prompts < 1 || r->n < 1 || r->n > SIM_REQ_MAX_N || r->max_tokens < 1 ||
        r->max_tokens > lim.max_model_len || r->min_tokens > r->max_tokens || !r->model)
        abort();
    for (size_t i = 0; i < r->n_prompts; i++)
        if (r->prompts[i].tokens < 0 || r->prompts[i].tokens + r->max_tokens > lim.max_model_len)
            abort();
    if (r->leg == SIM_LEG_DECODE &&
        (!r->remote_host || r->n_remote_block_ids == 0 || r->remote_port < 1))
        abort();
    struct sim_resp_meta m = {.api = r->api,
                              .id = "cmpl-x",
                              .created = 1,
                              .model = r->model,
                              .usage_null = r->include_usage};
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    json_t *choices = json_array();
    for (size_t p = 0; p < r->n_prompts && p < 4; p++) {
        uint64_t seed = sim_text_seed(r->prompts[p].hash, 0);
        bool stopped;
        int n = sim_text_plan(seed, r->max_tokens, r->min_tokens, r->ignore_eos, &stopped);
        if (n < 1 || n > r->max_tokens)
            abort();
        int shown = n < 8 ? n : 8;
        char *text = sim_text_completion(seed, shown);
        json_array_append_new(choices,
                              sim_resp_choice(r->api, (int)p, text, stopped ? "stop" : "length"));
        json_t *chunk = sim_resp_chunk(&m, (int)p, text, p == 0, NULL, NULL);
        if (!chunk || sim_sse_event(&sb, chunk) != 0)
            abort();
        json_decref(chunk);
        free(text);
    }
    /* logprobs in both shapes for the first prompt's answer */
    if (r->n_prompts > 0 && r->logprobs >= 0) {
        if (r->logprobs > SIM_REQ_MAX_LOGPROBS)
            abort();
        const struct sim_prompt *p0 = &r->prompts[0];
        struct sim_text_origin o;
        sim_text_locate(p0->ids.v, p0->ids.n, &o);
        if (o.split > p0->ids.n || (o.found && (size_t)o.m != p0->ids.n - o.split))
            abort();
        uint64_t seed = sim_text_seed(o.hash, o.k);
        json_t *cl = sim_resp_cmpl_lp_new();
        json_t *content = json_array();
        int64_t off = 0;
        for (int i = 0; i < 4; i++) {
            int32_t id = sim_text_gen_mode((enum sim_mode)(i % 4), seed, o.m + i,
                                           sim_text_first_space(p0->ids.v, o.split));
            struct sim_lp lp;
            sim_text_logprobs((enum sim_mode)(i % 4), seed, o.m + i, id, r->logprobs, &lp);
            sim_resp_cmpl_lp_add(cl, &lp, r->logprobs, r->return_token_ids, &off);
            json_array_append_new(content, sim_resp_chat_lp_entry(&lp, r->logprobs, true));
        }
        char *a = json_dumps(cl, JSON_COMPACT);
        json_t *w = sim_resp_chat_lp_wrap(content);
        char *b = json_dumps(w, JSON_COMPACT);
        if (!a || !b)
            abort();
        free(a);
        free(b);
        json_decref(cl);
        json_decref(w);
    }
    json_t *body = sim_resp_body(&m, choices, sim_resp_usage(sim_req_prompt_tokens(r), 1));
    char *s = json_dumps(body, JSON_COMPACT);
    if (!s)
        abort();
    free(s);
    json_decref(body);
    sim_sse_done(&sb);
    strbuf_release(&sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *body = json_loadb((const char *)data, size, JSON_DECODE_ANY, &je);
    if (!body)
        return 0;
    for (int api = SIM_API_COMPLETIONS; api <= SIM_API_MESSAGES; api++) {
        struct sim_req r;
        struct sim_err err;
        if (sim_req_parse(body, (enum sim_api)api, &lim, &r, &err) == 0) {
            exercise(&r);
            sim_req_release(&r);
        } else {
            if (err.status < 400 || err.status > 499 || err.message[0] == '\0')
                abort();
            json_t *e = sim_resp_error_from(&err);
            json_t *msg = json_object_get(json_object_get(e, "error"), "message");
            if (!e || strcmp(json_string_value(msg), err.message) != 0)
                abort();
            json_decref(e);
        }
    }
    json_decref(body);
    return 0;
}
