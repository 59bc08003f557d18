/* qcheck — the output-quality (precision) checker: is a completed decode answer the work
 * of a healthy model, or of an engine whose output has gone bad (corrupted weights or KV
 * cache, a faulty accelerator, a broken precision setting)? An engine in that state is
 * alive and answers 200, so no health check sees it; only its output shows it.
 *
 * Three detectors, each a pure function of the sampled answer:
 *   repetition  the answer ends in a loop: a period of 1..max_period tokens repeated
 *               over at least repeat_min_tokens (and 3 periods; in a short answer
 *               repeat_short_tokens that are 3/4 of it), or its distinct 4-grams
 *               are a small share of all 4-grams (loops that are not exactly periodic).
 *               Works on token ids; without ids a hash of each token string serves
 *               (identical strings are the same token for this purpose).
 *   garbled     the model lost confidence: a run of garbled_run tokens (or a share
 *               garbled_share of them) whose sampled logprob is below garbled_logprob
 *               while the top-k is flat (its best entry below garbled_top_logprob, or
 *               its normalised entropy above garbled_entropy); or invalid text: U+FFFD
 *               and invalid UTF-8 sequences in the detokenized content (a lone byte
 *               token of a split character is normal in a single token string, so only
 *               the content, where split characters have been joined again, counts).
 *               Needs top-k lists of at least 3 entries.
 *   rare chars  the share of code points of the content (white space excluded) outside
 *               the common set is at least rare_share (and at least rare_min of them).
 *               Code points, not token strings: with token ids the strings are
 *               "token_id:N", and a code point is the same for any tokenizer.
 * A sample is valid (it may count for a streak or a clear) only with at least
 * min_tokens tokens that carried logprobs.
 *
 * The accumulator collects a sample from the engine's responses in vLLM's shapes (chat
 * and completions, streamed chunks or the whole body): an untrusted peer's JSON, so
 * every type is checked and the sizes are capped (tests/fuzz/fuzz_qcheck.c).
 *
 * Everything here is pure and reentrant; an accumulator belongs to one request (one
 * thread at a time). */
#ifndef MOTOR_QCHECK_H
#define MOTOR_QCHECK_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCK_MAX_TOP 20 /* top-k entries kept per token (vLLM's default max-logprobs) */
#define QCK_MAX_RANGES 64

/* A set of code points: inclusive ranges. */
struct qck_charset {
    uint32_t lo[QCK_MAX_RANGES], hi[QCK_MAX_RANGES];
    int n;
};

struct qck_params {
    int min_tokens; /* a sample shorter than this is not valid */
    bool garbled;   /* garbled detection on (logprobs_count >= 3) */
    bool rare;      /* rare-character detection on (logprobs_count >= 5) */
    /* repetition */
    int max_period;
    int repeat_min_tokens;   /* a loop this long is bad in any answer */
    int repeat_short_tokens; /* one this long is bad when it is 3/4 of the answer */
    int ngram_min_tokens;    /* the 4-gram test needs this many tokens */
    double ngram_distinct;   /* bad below this share of distinct 4-grams */
    /* garbled */
    double garbled_logprob;
    double garbled_top_logprob;
    double garbled_entropy; /* normalised, 0..1 */
    int garbled_run;
    double garbled_share;
    int invalid_min;      /* invalid characters at least this many ... */
    double invalid_share; /* ... and at least this share of the tokens */
    /* rare characters */
    double rare_share;
    int rare_min;
    struct qck_charset common;
};

/* The defaults (garbled and rare off: the caller enables them from logprobs_count),
 * with qck_charset_default() as the common set. */
void qck_params_default(struct qck_params *p);

/* The built-in common set: the scripts and symbols of everyday text in the languages
 * models serve (Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, Indic, Thai, CJK,
 * kana, Hangul, punctuation, symbols, emoji). */
void qck_charset_default(struct qck_charset *cs);
/* Parse "HEX-HEX,HEX,..." (e.g. "0-24F,370-3FF,4E00-9FFF") into cs. 0, or -EINVAL with
 * a message in err (cap bytes) for a malformed list, a reversed range, a code point
 * above 10FFFF or more than QCK_MAX_RANGES ranges. */
int qck_charset_parse(struct qck_charset *cs, const char *s, char *err, size_t cap);
bool qck_charset_has(const struct qck_charset *cs, uint32_t cp);

/* One generated token as sampled. */
struct qck_token {
    uint64_t id;    /* token id ("token_id:N"), or a hash of the token string */
    bool has_id;    /* id is a real token id */
    double logprob; /* of the sampled token */
    int n_top;      /* entries in top[] */
    double top[QCK_MAX_TOP];
};

/* A sample being collected. Caps: at most max_tokens tokens and max_text bytes of
 * content are kept (the rest is counted in dropped and ignored). */
struct qck_acc {
    struct qck_token *tok;
    size_t n, cap, max_tokens;
    char *text;
    size_t text_len, text_cap, max_text;
    size_t dropped;
    bool finished;  /* a finish_reason was seen */
    bool malformed; /* a response part had the wrong shape (the sample is not valid) */
};

void qck_acc_init(struct qck_acc *a, size_t max_tokens, size_t max_text);
void qck_acc_release(struct qck_acc *a); /* NULL-safe */

/* Add one engine response (a whole non-streamed body or one SSE chunk's JSON) in vLLM's
 * shapes: choices[0] with message.content / delta.content / text, and logprobs
 * {content: [{token, logprob, top_logprobs: [{logprob}]}]} (chat) or {tokens,
 * token_logprobs, top_logprobs: [{token: logprob}]} (completions). Only choice 0 is
 * sampled. A wrong shape sets malformed; returns false then. */
bool qck_acc_add_response(struct qck_acc *a, const json_t *resp);
/* Lower-level: add content text, or one token. */
void qck_acc_add_text(struct qck_acc *a, const char *s, size_t len);
void qck_acc_add_token(struct qck_acc *a, const struct qck_token *t);
/* The id of a token string: N for "token_id:N", else a hash of the string (*has_id
 * false). */
uint64_t qck_token_id(const char *s, size_t len, bool *has_id);

enum qck_fault {
    QCK_OK = 0,
    QCK_REPEAT = 1 << 0,
    QCK_GARBLED = 1 << 1,
    QCK_RARE = 1 << 2,
};

struct qck_verdict {
    bool valid;   /* enough tokens with logprobs, well formed */
    unsigned bad; /* enum qck_fault bits (0 = good); only set when valid */
    /* what the detectors measured (for logs and the bench) */
    int period;            /* the loop's period, 0 = none */
    size_t repeat_tokens;  /* tokens the loop covers */
    double distinct_4gram; /* share of distinct 4-grams, 1 when too short */
    size_t low_conf_run;   /* longest run of low-confidence tokens */
    double low_conf_share;
    size_t invalid_chars;
    double rare_share;
    size_t rare_chars;
};

/* Repetition over ids[0..n): the period of the loop the sequence ends in (0 = none)
 * and the tokens the loop covers. */
int qck_repetition(const uint64_t *ids, size_t n, int max_period, size_t *covered);
/* Distinct 4-grams over all 4-grams of ids[0..n) (1 when n < 4). */
double qck_distinct_4grams(const uint64_t *ids, size_t n);
/* Is this token low-confidence and its top-k flat? */
bool qck_token_low_conf(const struct qck_token *t, const struct qck_params *p);
/* Normalised entropy (0..1) of a top-k list plus the unlisted rest of the mass. */
double qck_top_entropy(const double *top, int n);
/* Invalid characters of s[0..len): U+FFFD and every invalid UTF-8 sequence. */
size_t qck_invalid_chars(const char *s, size_t len);
/* Code points of s[0..len) outside cs (white space not counted in *total). */
size_t qck_rare_chars(const char *s, size_t len, const struct qck_charset *cs, size_t *total);

/* Judge a collected sample. */
void qck_check(const struct qck_acc *a, const struct qck_params *p, struct qck_verdict *v);
/* "repeat", "garbled", "rare_chars" joined by '+', or "ok" (static storage). */
const char *qck_fault_name(unsigned bad);

#endif
