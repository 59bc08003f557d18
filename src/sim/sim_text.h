/* sim_text — the simulator's deterministic "model": prompt hashing, token counting and a
 * seeded word generator.
 *
 * The same prompt always yields the same tokens, on every simulator instance, so a test
 * can compare the output of a union engine with a prefill/decode pair, or of two
 * replicas. Token i of a sequence depends only on (seed, i), which lets a stream produce
 * token after token without keeping the text around.
 *
 * Pure functions, thread-safe. */
#ifndef MOTOR_SIM_TEXT_H
#define MOTOR_SIM_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Longest token text sim_text_token() produces, including the NUL. */
#define SIM_TEXT_TOKEN_MAX 32

/* FNV-1a 64 over n bytes, continuing from h (start with SIM_TEXT_HASH_INIT). */
#define SIM_TEXT_HASH_INIT 0xcbf29ce484222325ULL
uint64_t sim_text_hash(uint64_t h, const void *data, size_t n);

/* Whitespace-separated words in s (the simulator's notion of prompt tokens). */
int sim_text_count_words(const char *s);

/* Seed of choice `index` of a prompt whose hash is prompt_hash. */
uint64_t sim_text_seed(uint64_t prompt_hash, int index);

/* Text of token `index` (0-based) of the sequence seeded by seed, written NUL-terminated
 * into buf (cap >= SIM_TEXT_TOKEN_MAX). Tokens after the first start with a space, so
 * concatenating tokens 0..n-1 gives the text of an n-token completion. Returns the
 * length. */
size_t sim_text_token(uint64_t seed, int index, char *buf, size_t cap);

/* Where the sequence "emits end-of-sequence": the number of tokens after which a
 * request without ignore_eos finishes with "stop" (between 8 and 127). */
int sim_text_natural_len(uint64_t seed);

/* How many tokens a choice produces: max_tokens, or fewer when the sequence ends
 * naturally first (never before min_tokens; never with ignore_eos). *stopped says which:
 * true => finish_reason "stop", false => "length". */
int sim_text_plan(uint64_t seed, int max_tokens, int min_tokens, bool ignore_eos, bool *stopped);

/* The text of tokens 0..n-1 as one heap string (caller frees). */
char *sim_text_completion(uint64_t seed, int n);

#endif
