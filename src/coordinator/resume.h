/* resume — continuing a streamed answer elsewhere (mid-stream rescheduling): what the
 * client already got, the continuation's request, and the splice of its events.
 *
 * When a streamed leg fails after events reached the client, the proxy (proxy.c) hands
 * resume_scan() the complete events it sent. From them come the answer so far (choice
 * 0's text, and its token ids when every token carried one: "token_id:N" logprobs
 * tokens, return_tokens_as_token_ids), the number of tokens generated, the response id
 * and created time the client saw, and whether the answer had in fact finished.
 * resume_body() makes the continuation request from the client's body:
 *   completions  prompt + the text so far (or, for a prompt of token ids, + the ids);
 *                max_tokens (default 16, as vLLM) and min_tokens reduced by the tokens
 *                generated; echo off (the prompt went out already)
 *   chat         the conversation + an assistant message holding the text so far, with
 *                continue_final_message: true, add_generation_prompt: false;
 *                max_tokens / max_completion_tokens / min_tokens reduced
 * An engine whose output is a function of its context continues exactly where the
 * failed one stopped (the engine simulator guarantees it; a real model does with greedy
 * decoding, and otherwise continues plausibly). Refused (NULL, with the reason): n > 1,
 * best_of > 1, a batch of prompts, a token-id prompt without token ids in the stream.
 * resume_rewrite() makes each continuation event part of the first answer: the same id
 * and created, no second assistant role delta, usage counted over the whole answer
 * (prompt_tokens without the re-sent prefix, completion_tokens with it).
 *
 * Pure functions of their inputs (jansson trees); any thread. */
#ifndef MOTOR_RESUME_H
#define MOTOR_RESUME_H

#include "common/strbuf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct resume_state {
    bool chat;
    struct strbuf text; /* choice 0's text so far */
    json_t *ids;        /* its token ids (array), NULL unless every token carried one */
    int64_t tokens;     /* tokens generated so far (usage when the stream had it) */
    bool role_sent;     /* chat: the assistant role delta went out */
    bool finished;      /* choice 0 already has a finish_reason */
    char *id;           /* the response id the client saw (NULL: none yet) */
    json_int_t created;
    bool have_created;
};

/* Read the complete SSE events rec[0..len) (what the client got). 0, or -EINVAL with
 * the reason in err: an event that is not an OpenAI chunk, more than one choice.
 * Release st with resume_release either way. */
int resume_scan(const char *rec, size_t len, bool chat, struct resume_state *st, char *err,
                size_t cap);
void resume_release(struct resume_state *st);

/* The continuation of orig (the client's body, not modified): a new object, or NULL and
 * the reason in err when this request cannot be continued. */
json_t *resume_body(const json_t *orig, const struct resume_state *st, char *err, size_t cap);

/* Make one continuation event (a parsed data object) part of the first answer, in
 * place. False: drop the event (the continuation's own opening role delta). */
bool resume_rewrite(json_t *ev, const struct resume_state *st);

/* Is body[0..len) one whole JSON value (an object or array closed at the end, trailing
 * white space allowed)? A cheap structural scan (no tree, strings skipped), to tell a
 * non-streamed answer the engine cut short from a complete one. */
bool resume_json_complete(const char *body, size_t len);
/* The cheap half: does body[0..len) end (white space aside) with '}' or ']'? */
bool resume_json_closed(const char *body, size_t len);

#endif
