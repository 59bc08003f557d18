/* sim_resp — OpenAI/vLLM-shaped response bodies and SSE framing for the simulator.
 *
 * Builders return new jansson references (caller owns them); arguments documented as
 * "stolen" are consumed even on failure. Pure, thread-safe. */
#ifndef MOTOR_SIM_RESP_H
#define MOTOR_SIM_RESP_H

#include "common/strbuf.h"
#include "sim/sim_req.h"

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

/* {"error":{"message","type","param","code"}}; type derives from status
 * (400 invalid_request_error, 404 not_found_error, 5xx server errors). param NULL or ""
 * => null. */
json_t *sim_resp_error(int status, const char *message, const char *param);
json_t *sim_resp_error_from(const struct sim_err *err);

/* {"prompt_tokens","total_tokens","completion_tokens"} */
json_t *sim_resp_usage(int prompt_tokens, int completion_tokens);

/* One choice of a non-streamed answer: completions {"index","text",…}, chat
 * {"index","message":{"role":"assistant","content"},…}. */
json_t *sim_resp_choice(enum sim_api api, int index, const char *text, const char *finish_reason);
/* The whole non-streamed body; choices and usage are stolen. */
json_t *sim_resp_body(const struct sim_resp_meta *m, json_t *choices, json_t *usage);

/* A streamed chunk for one choice. text may be NULL (no content, e.g. chat's opening
 * role chunk when with_role); finish_reason NULL while generating; usage (stolen) may be
 * NULL. */
json_t *sim_resp_chunk(const struct sim_resp_meta *m, int index, const char *text, bool with_role,
                       const char *finish_reason, json_t *usage);
/* The closing usage chunk of stream_options.include_usage: "choices": [] (usage
 * stolen). */
json_t *sim_resp_usage_chunk(const struct sim_resp_meta *m, json_t *usage);

/* Append one SSE event "data: <compact json>\n\n". 0 or -E2BIG (nothing appended beyond
 * what fit; the caller treats it as a failed stream). */
int sim_sse_event(struct strbuf *sb, const json_t *obj);
/* Append "data: [DONE]\n\n". */
int sim_sse_done(struct strbuf *sb);

#endif
