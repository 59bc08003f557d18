/* sim_text — the simulator's deterministic "model": what token comes next, where an
 * answer ends, and the log-probabilities it reports.
 *
 * The generation rule (docs/engine-sim.md, "The generation rule"):
 *   - An answer is a sequence seeded by the context it started from: seed =
 *     mix(hash(context token ids), choice k). Token i of the answer is gen(seed, i), a
 *     word of the vocabulary in a form (capital after '.', a leading space after the
 *     first token, and on the first token when the context ends with a word).
 *   - Given any context, the engine first finds the longest suffix that is itself an
 *     answer of this rule to the context before it (sim_text_locate: the smallest split
 *     j such that ids[j..] == gen(seed(hash(ids[..j]), k), 0..) for some k < 16; j is
 *     never before the last token that is not a vocabulary word). The
 *     next token is then gen(seed, m) with m = the suffix length; no such suffix means
 *     m = 0 and the seed of the whole context.
 *   So the next token is a function of the preceding context alone, and a prompt that is
 *   P + the first m tokens of P's answer (as text or as token ids) continues that very
 *   answer: exactly, for every m >= 0, with the same natural end (its length belongs to
 *   the seed). The same prompt gives the same text everywhere; a shorter completion is a
 *   prefix of a longer one.
 *   - Fault modes (repeat, garbled, rare_chars) replace gen() with degenerate sequences
 *     of their own (still deterministic per seed and position) that have no natural end.
 *
 * Pure functions, thread-safe. */
#ifndef MOTOR_SIM_TEXT_H
#define MOTOR_SIM_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest token text sim_text_token() produces, including the NUL. */
#define SIM_TEXT_TOKEN_MAX 40
#define SIM_TEXT_MAX_K 16            /* choices searched by sim_text_locate */
#define SIM_TEXT_LOCATE_WINDOW 65536 /* longest answer suffix sim_text_locate looks for */
#define SIM_TEXT_MAX_TOP 20          /* top logprobs at most (vLLM's max_logprobs) */

enum sim_mode {
    SIM_MODE_GOOD,
    SIM_MODE_REPEAT,  /* a short loop of tokens, repeated with near-certainty */
    SIM_MODE_GARBLED, /* low-confidence tokens from a flat top-k: stray bytes, junk words */
    SIM_MODE_RARE,    /* mostly rare characters */
};

/* FNV-1a 64 over n bytes, continuing from h (start with SIM_TEXT_HASH_INIT). */
#define SIM_TEXT_HASH_INIT 0xcbf29ce484222325ULL
uint64_t sim_text_hash(uint64_t h, const void *data, size_t n);
/* The context hash: FNV-1a over the ids (4 bytes little-endian each). */
uint64_t sim_text_hash_ids(uint64_t h, const int32_t *ids, size_t n);

/* Whitespace-separated words in s. */
int sim_text_count_words(const char *s);

/* Seed of choice k of an answer to a context whose hash is h. */
uint64_t sim_text_seed(uint64_t h, int k);

/* Token i of the answer seeded by seed. first_space: the first token has a leading
 * space (the context ends with a word). */
int32_t sim_text_gen(uint64_t seed, int i, bool first_space);
/* The same in a fault mode. */
int32_t sim_text_gen_mode(enum sim_mode mode, uint64_t seed, int i, bool first_space);
/* Whether an answer after ids[0..n) starts with a space. */
bool sim_text_first_space(const int32_t *ids, size_t n);

/* Where the answer in a context started. */
struct sim_text_origin {
    size_t split;  /* ids[split..n) is the answer so far */
    int k;         /* its choice index */
    int m;         /* n - split: tokens of it already there */
    uint64_t hash; /* sim_text_hash_ids of ids[0..split) */
    bool found;    /* a non-empty answer suffix was found */
};
void sim_text_locate(const int32_t *ids, size_t n, struct sim_text_origin *o);

/* Where the sequence "emits end-of-sequence": the number of tokens after which an
 * answer without ignore_eos finishes with "stop" (between 8 and 127). */
int sim_text_natural_len(uint64_t seed);

/* How many tokens a choice produces when done tokens of it exist already (a
 * continuation): up to max_tokens, or fewer when the natural end comes first (never
 * before min_tokens; never with ignore_eos). *stopped: "stop" vs "length". */
int sim_text_plan_from(uint64_t seed, int done, int max_tokens, int min_tokens, bool ignore_eos,
                       bool *stopped);
/* The same with done = 0. */
int sim_text_plan(uint64_t seed, int max_tokens, int min_tokens, bool ignore_eos, bool *stopped);

/* Log-probabilities of one position, in vLLM's dict order: e[0] is the sampled token,
 * then the top-ranked tokens (without the sampled one). n = 1 + top. Plausible for the
 * mode: a confident peak for good text, near-certainty for loops, a flat low-confidence
 * spread for garbled text. */
struct sim_lp_entry {
    int32_t id;
    double lp;
};
struct sim_lp {
    int n;
    int rank; /* the sampled token's rank (1 = most likely) */
    struct sim_lp_entry e[SIM_TEXT_MAX_TOP + 1];
};
void sim_text_logprobs(enum sim_mode mode, uint64_t seed, int i, int32_t sampled, int top,
                       struct sim_lp *out);

/* Compatibility helpers (tests): text of token i with first_space = false, and of
 * tokens 0..n-1 as one heap string. */
size_t sim_text_token(uint64_t seed, int index, char *buf, size_t cap);
char *sim_text_completion(uint64_t seed, int n);

#endif
