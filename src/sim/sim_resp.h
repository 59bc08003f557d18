/* sim_resp — OpenAI/vLLM-shaped response bodies and SSE framing for the simulator.
 *
 * Builders return new jansson references (caller owns them); arguments documented as
 * "stolen" are consumed even on failure. Pure, thread-safe. */
#ifndef MOTOR_SIM_RESP_H
#define MOTOR_SIM_RESP_H

#include "common/strbuf.h"
#include "sim/sim_req.h"
#include "sim/sim_text.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* What every body and chunk of one response shares. */
struct sim_resp_meta {
    enum sim_api api;
    const char *id;  /* "cmpl-…" / "chatcmpl-…" */
    int64_t created; /* unix seconds */
    const char *model;
    bool usage_null; /* streaming with include_usage: chunks carry "usage": null */
};

/* {"error":{"message","type","param","code"}}; type is vLLM's name for the status
 * (sim_resp_error_type: 400 BadRequestError, 404 NotFoundError, 500
 * InternalServerError, 503 ServiceUnavailableError, ...). param NULL or "" => null. */
const char *sim_resp_error_type(int status);
json_t *sim_resp_error(int status, const char *message, const char *param);
json_t *sim_resp_error_from(const struct sim_err *err);

/* {"prompt_tokens","total_tokens","completion_tokens"} */
json_t *sim_resp_usage(int prompt_tokens, int completion_tokens);

/* One choice of a non-streamed answer: completions {"index","text",…}, chat
 * {"index","message":{"role":"assistant","content"},…}. */
json_t *sim_resp_choice(enum sim_api api, int index, const char *text, const char *finish_reason);
/* The same with a logprobs object (stolen; NULL => null). */
json_t *sim_resp_choice_lp(enum sim_api api, int index, const char *text, const char *finish_reason,
                           json_t *logprobs);
/* The whole non-streamed body; choices and usage are stolen. */
json_t *sim_resp_body(const struct sim_resp_meta *m, json_t *choices, json_t *usage);

/* A streamed chunk for one choice. text may be NULL (no content, e.g. chat's opening
 * role chunk when with_role); finish_reason NULL while generating; usage (stolen) may be
 * NULL. */
json_t *sim_resp_chunk(const struct sim_resp_meta *m, int index, const char *text, bool with_role,
                       const char *finish_reason, json_t *usage);
json_t *sim_resp_chunk_lp(const struct sim_resp_meta *m, int index, const char *text,
                          bool with_role, const char *finish_reason, json_t *usage,
                          json_t *logprobs);
/* The closing usage chunk of stream_options.include_usage: "choices": [] (usage
 * stolen). */
json_t *sim_resp_usage_chunk(const struct sim_resp_meta *m, json_t *usage);

/* Logprobs in vLLM's shapes. Chat: one entry of choices[].logprobs.content[]
 * {token, logprob, bytes, top_logprobs[{token, logprob, bytes}] (the first `top`
 * entries of vLLM's sampled-first order)}; wrap a content array as {"content": [...]}.
 * Completions: {text_offset[], token_logprobs[], tokens[], top_logprobs[{token: lp}]}
 * (up to top + 1 entries each, sampled first); offset counts code points of the tokens'
 * strings, as vLLM does. as_ids: tokens are "token_id:N" (return_tokens_as_token_ids). */
struct sim_lp;
json_t *sim_resp_chat_lp_entry(const struct sim_lp *lp, int top, bool as_ids);
json_t *sim_resp_chat_lp_wrap(json_t *content);
json_t *sim_resp_cmpl_lp_new(void);
void sim_resp_cmpl_lp_add(json_t *lp_obj, const struct sim_lp *lp, int top, bool as_ids,
                          int64_t *offset);

/* Append one SSE event "data: <compact json>\n\n". 0 or -E2BIG (nothing appended beyond
 * what fit; the caller treats it as a failed stream). */
int sim_sse_event(struct strbuf *sb, const json_t *obj);
/* Append "data: [DONE]\n\n". */
int sim_sse_done(struct strbuf *sb);

#endif
