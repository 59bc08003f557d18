/* sim_fmt — the answer shapes of the Responses API (/v1/responses) and of Anthropic's
 * Messages API (/v1/messages), as vLLM serves them, for one generated text.
 *
 * Streams are SSE with named events ("event: <type>\ndata: <json>\n\n"):
 *   Responses: response.created, response.in_progress, response.output_item.added,
 *     response.content_part.added, response.output_text.delta (one per token),
 *     response.output_text.done, response.content_part.done, response.output_item.done,
 *     response.completed (or response.incomplete when max_output_tokens cut it); each
 *     with "sequence_number"; no [DONE].
 *   Messages: message_start, content_block_start, ping, content_block_delta (one per
 *     token, "text_delta"), content_block_stop, message_delta (stop_reason, usage),
 *     message_stop.
 * Builders return new references; arguments documented "stolen" are consumed. Pure. */
#ifndef MOTOR_SIM_FMT_H
#define MOTOR_SIM_FMT_H

#include "common/strbuf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct sim_fmt_meta {
    const char *id;      /* "resp_…" / "msg_…" */
    const char *item_id; /* Responses: the message item "msg_…" */
    int64_t created;
    const char *model;
    const char *instructions; /* Responses, may be NULL */
    int max_output_tokens;    /* Responses, 0 = null */
};

struct sim_fmt_usage {
    int input, output, cached;
};

/* Responses: the response object. status "completed", "incomplete" (with
 * incomplete_details.reason "max_output_tokens") or "in_progress" (text NULL: no
 * output yet). logprobs (stolen) may be NULL. */
json_t *sim_fmt_response(const struct sim_fmt_meta *m, const char *status, const char *text,
                         const struct sim_fmt_usage *u, json_t *logprobs);
/* Append one named SSE event; obj (stolen) gets "type" and, for Responses,
 * "sequence_number" (*seq, incremented; seq NULL = Messages, none). */
int sim_fmt_event(struct strbuf *sb, const char *type, json_t *obj, int *seq);
/* Responses stream events around the text. */
void sim_fmt_resp_open(struct strbuf *sb, const struct sim_fmt_meta *m, int *seq);
void sim_fmt_resp_delta(struct strbuf *sb, const struct sim_fmt_meta *m, const char *delta,
                        int *seq);
void sim_fmt_resp_close(struct strbuf *sb, const struct sim_fmt_meta *m, const char *status,
                        const char *text, const struct sim_fmt_usage *u, int *seq);

/* Messages: the message object; stop "end_turn" or "max_tokens". */
json_t *sim_fmt_message(const struct sim_fmt_meta *m, const char *text, const char *stop,
                        const struct sim_fmt_usage *u);
void sim_fmt_msg_open(struct strbuf *sb, const struct sim_fmt_meta *m,
                      const struct sim_fmt_usage *u);
void sim_fmt_msg_delta(struct strbuf *sb, const char *delta);
void sim_fmt_msg_close(struct strbuf *sb, const char *stop, const struct sim_fmt_usage *u);
/* Anthropic's error body {"type":"error","error":{"type","message"}}. */
json_t *sim_fmt_anthropic_error(int status, const char *message);

#endif
