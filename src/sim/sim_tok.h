/* sim_tok — the simulated model's tokenizer: a fixed vocabulary with token ids, text <->
 * ids, and the chat template.
 *
 * Vocabulary (ids are the contract of /tokenize, /detokenize, token-id prompts and
 * "token_id:N" logprobs):
 *   0..255              one raw byte (whitespace other than a single space before a
 *                       word; a byte that is not valid UTF-8 alone renders as U+FFFD)
 *   256                 <|endoftext|> (EOS; never in output text)
 *   257..261            end-of-message markers of the chat template: <|end_of_system|>,
 *                       <|end_of_user|>, <|end_of_assistant|>, <|end_of_tool|>,
 *                       <|end_of_turn|> (any other role)
 *   512 + 12*w + f      word w of the generator's vocabulary in form f: bit 0 a leading
 *                       space, bit 1 capitalised, f >> 2: no punctuation, '.' or ','
 *   4096 + r            rare character r (one code point from rarely used Unicode
 *                       blocks; the rare_chars fault emits them)
 *   65536 + 2*h + s     any other word (h = FNV-1a of its bytes mod 2^20, s = leading
 *                       space): tokenizing is deterministic everywhere, but such ids
 *                       detokenize to a placeholder "[w%05x]" (lossy)
 * Text is cut at white space: a word with the single space before it is one token;
 * every other white-space byte is a byte token. So the simulator's own output (words
 * of its vocabulary) always round-trips: tokenize(detokenize(ids)) == ids.
 * No BOS: add_special_tokens changes nothing (like models without a BOS token).
 *
 * Chat template: each message is its content's tokens (text parts joined by "\n")
 * followed by its role's end marker; the generation prompt is empty; with
 * continue_final_message the last message's end marker is left out (the model continues
 * that message). So a conversation that grows by whole turns keeps its token prefix —
 * what prefix caching needs.
 *
 * Pure, thread-safe. */
#ifndef MOTOR_SIM_TOK_H
#define MOTOR_SIM_TOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_TOK_EOS 256
#define SIM_TOK_END_SYSTEM 257
#define SIM_TOK_END_USER 258
#define SIM_TOK_END_ASSISTANT 259
#define SIM_TOK_END_TOOL 260
#define SIM_TOK_END_TURN 261
#define SIM_TOK_WORD_BASE 512
#define SIM_TOK_RARE_BASE 4096
#define SIM_TOK_UNK_BASE 65536
#define SIM_TOK_UNK_RANGE (1u << 20)
#define SIM_TOK_VOCAB_SIZE (SIM_TOK_UNK_BASE + 2 * SIM_TOK_UNK_RANGE)
#define SIM_TOK_TEXT_MAX 40 /* longest text of one token, NUL included */

/* A growable vector of token ids with a hard cap. */
struct sim_ids {
    int32_t *v;
    size_t n, cap;
    size_t max;    /* appends beyond this are refused */
    bool overflow; /* set once an append was refused */
};

void sim_ids_init(struct sim_ids *x, size_t max);
void sim_ids_release(struct sim_ids *x);
/* false (and overflow set) when full. */
bool sim_ids_push(struct sim_ids *x, int32_t id);

/* Number of words in the generator vocabulary; forms per word. */
int sim_tok_n_words(void);
#define SIM_TOK_FORMS 12
int sim_tok_n_rare(void);
/* The id of word w in form (space, cap, punct 0 none / 1 '.' / 2 ','). */
int32_t sim_tok_word(int w, bool space, bool cap, int punct);
/* Decompose a word id; false when id is not a word form. */
bool sim_tok_word_parts(int32_t id, int *w, bool *space, bool *cap, int *punct);
int32_t sim_tok_rare(int r);

bool sim_tok_valid(int64_t id);
bool sim_tok_is_special(int32_t id);

/* Tokenize len bytes of UTF-8 text, appending to out. */
void sim_tok_encode(const char *s, size_t len, struct sim_ids *out);
/* Token text into buf (cap >= SIM_TOK_TEXT_MAX), NUL-terminated, valid UTF-8 (a lone
 * byte token that is not UTF-8 gives U+FFFD). Specials render as their names when
 * with_special, else as "". Returns the length. */
size_t sim_tok_text(int32_t id, bool with_special, char *buf, size_t cap);
/* Raw bytes of a token (what a byte token stands for; other tokens = their text).
 * Returns the length (<= SIM_TOK_TEXT_MAX - 1). */
size_t sim_tok_bytes(int32_t id, uint8_t *buf, size_t cap);
/* Detokenize: heap string, valid UTF-8 (consecutive byte tokens are joined before
 * UTF-8 is checked, so a multi-byte character split into byte tokens comes back whole;
 * invalid sequences become U+FFFD). Specials included when with_special. */
char *sim_tok_decode(const int32_t *ids, size_t n, bool with_special);

/* The end-of-message marker of a chat role. */
int32_t sim_tok_end_of(const char *role);

#endif
