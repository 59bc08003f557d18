/* lpproj — project an engine's answer back to the logprobs its client asked for.
 *
 * Why: a request sampled by the precision checker (qcheck.h) is sent with more logprobs
 * than its client asked for (max of the client's count and Motor's). The client must
 * see exactly what it would have got: no logprobs when it asked none, its own k
 * entries when it asked fewer than Motor. vLLM lists the sampled token first and then
 * the best others, for any k, so the answer for k is a prefix of the answer for a larger
 * k: chat `top_logprobs` keeps its first k entries; a completions `top_logprobs` dict
 * (the sampled token and the top k, which may hold it) its first k + 1 entries when the
 * sampled token ranked below k, else its first k (its rank read from the values).
 *
 * The rewrite splices the JSON text instead of parsing and re-serialising it: every
 * byte outside the projected values is the engine's own (a re-serialisation would
 * print numbers differently), so a sampled answer is byte-identical to an unsampled
 * one. Applies to a whole non-streamed body or one SSE chunk's JSON.
 *
 * Pure; any thread. */
#ifndef MOTOR_LPPROJ_H
#define MOTOR_LPPROJ_H

#include "common/strbuf.h"

#include <stdbool.h>
#include <stddef.h>

struct lpproj {
    bool chat;  /* chat shape (content[].top_logprobs) rather than completions */
    bool strip; /* the client asked for no logprobs: every choice's logprobs is null */
    int top;    /* else: the client's count (chat top_logprobs, completions logprobs) */
};

/* Append the projection of in[0..len) to out. 0, or -EINVAL when in is not JSON of the
 * expected shape (out then holds a partial result the caller discards), -E2BIG when out
 * is full. Values the projection does not touch are copied byte for byte. */
int lpproj_rewrite(const struct lpproj *p, const char *in, size_t len, struct strbuf *out);

#endif
