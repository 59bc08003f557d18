/* tokreq — the engine's /tokenize, as cache-aware routing asks it: the request body
 * made from a client's completion or chat request, and the token ids read back.
 *
 * Why the engine's own tokenizer: the KV index is keyed by token ids, so the prompt's
 * ids must be exactly the engine's — its tokenizer and, for chat, its chat template
 * (a Jinja program shipped with the model). vLLM answers POST /tokenize with both
 * ({"prompt"} or {"messages", "add_generation_prompt", ...} -> {"tokens": [...]}), so
 * the coordinator needs no tokenizer of its own (docs/coordinator.md, "Tokenization").
 *
 * Pure; any thread. */
#ifndef MOTOR_TOKREQ_H
#define MOTOR_TOKREQ_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOKREQ_MAX_TOKENS (1u << 20)

/* The /tokenize body for req (a completion when !chat, else a chat request): the prompt
 * (no model name: see tokreq.c), or the messages with the chat options vLLM's tokenize route
 * accepts. NULL when the request is not one prompt (a batch of prompts). New reference. */
json_t *tokreq_body(const json_t *req, bool chat);

/* A completion whose prompt is already token ids (an integer array): 1 with *out (heap)
 * and *n set; 0 when it is not; -EINVAL for an id outside 0..2^32-1. */
int tokreq_prompt_ids(const json_t *req, uint32_t **out, size_t *n);

/* The answer of /tokenize: {"tokens": [ids...], ...}. 0 with *out (heap) and *n, or
 * -EINVAL (not JSON, no "tokens" array, an id that is not a non-negative integer, more
 * than TOKREQ_MAX_TOKENS). */
int tokreq_parse(const char *body, size_t len, uint32_t **out, size_t *n);

#endif
