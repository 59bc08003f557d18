/* reqscan — one pass over an inference request body, without building a JSON tree.
 *
 * Why: the union route forwards the client's body byte for byte; all the proxy needs
 * from it is a validity check and a handful of top-level fields (stream, model, prompt,
 * messages, the generation budget, a size estimate for the balancer). jansson builds a
 * tree at ~200 instructions per input byte: for a 16 KiB prompt that is milliseconds on
 * the hot path, for a field nobody reads. This scanner validates the same language as
 * json_loadb(body, len, JSON_DECODE_ANY, …) — RFC 8259 plus jansson's own limits: strict
 * UTF-8, no \u0000, paired surrogates, integers that fit int64, reals that do not
 * overflow a double, nesting at most JSON_PARSER_MAX_DEPTH, duplicate keys allowed with
 * the last one winning — and reports the fields as jansson would (tests/fuzz/
 * fuzz_reqscan.c checks that equivalence on arbitrary input).
 *
 * Pure function of its input; any thread. */
#ifndef MOTOR_REQSCAN_H
#define MOTOR_REQSCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum reqscan_type {
    REQSCAN_ABSENT = 0,
    REQSCAN_NULL,
    REQSCAN_FALSE,
    REQSCAN_TRUE,
    REQSCAN_STRING,
    REQSCAN_INTEGER,
    REQSCAN_REAL,
    REQSCAN_ARRAY,
    REQSCAN_OBJECT,
};

struct reqscan {
    enum reqscan_type top; /* type of the whole body */
    /* Types of the top-level members (the last occurrence of a duplicated key), all
     * REQSCAN_ABSENT when the body is not an object. */
    enum reqscan_type stream, model, prompt, messages, max_tokens, max_completion_tokens;
    char *model_name;         /* "model" when a string: unescaped, NUL-terminated, heap */
    int64_t max_tokens_value; /* valid when max_tokens == REQSCAN_INTEGER */
    int64_t max_completion_tokens_value;
    /* pdreq_estimate_tokens' character count of "prompt" and "messages": string bytes
     * (unescaped), 4 per integer element of an array, the "content" and "text" members
     * of objects, at most 8 levels deep. */
    size_t prompt_chars, messages_chars;
};

/* Scan body[0..len). 0 on success (*out filled; release it with reqscan_release), or
 * -EINVAL when the body is not valid JSON: *out is released, and err (cap bytes) holds
 * "invalid JSON at line L column C: <reason>". */
int reqscan_parse(const char *body, size_t len, struct reqscan *out, char *err, size_t cap);

/* Free what reqscan_parse allocated; accepts a zeroed or released struct. */
void reqscan_release(struct reqscan *s);

/* The balancer's estimate for this request, equal to pdreq_estimate_tokens() of the same
 * body parsed by jansson: characters / 4 + 1, plus the generation budget
 * (max_completion_tokens when an integer, else max_tokens when an integer, else 256;
 * clamped to 0..2^20) unless prefill_only. */
int64_t reqscan_estimate_tokens(const struct reqscan *s, bool prefill_only);

#endif
