#include "sim/sim_text.h"

#include "common/util.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>

/* A small vocabulary is enough: the text only has to look like prose in logs and be a
 * pure function of the prompt. */
static const char *const words[] = {
    "the",       "engine",    "decodes",    "a",         "token",
    "while",     "prefill",   "cache",      "blocks",    "move",
    "between",   "nodes",     "and",        "every",     "request",
    "finds",     "its",       "way",        "through",   "router",
    "to",        "an",        "instance",   "that",      "is",
    "ready",     "model",     "weights",    "load",      "slowly",
    "but",       "streams",   "flow",       "quickly",   "over",
    "network",   "of",        "workers",    "with",      "fault",
    "tolerance", "keeps",     "serving",    "when",      "one",
    "rank",      "fails",     "controller", "watches",   "heartbeat",
    "from",      "manager",   "on",         "host",      "gateway",
    "balances",  "load",      "across",     "replicas",  "in",
    "cluster",   "simulated", "text",       "is",        "deterministic",
    "for",       "same",      "prompt",     "so",        "tests",
    "compare",   "outputs",   "each",       "step",      "attention",
    "layer",     "reads",     "keys",       "values",    "memory",
    "grows",     "as",        "context",    "extends",   "batch",
    "scheduler", "picks",     "waiting",    "sequences", "then",
    "runs",      "them",      "together",   "until",     "done",
};

uint64_t sim_text_hash(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int sim_text_count_words(const char *s)
{
    int n = 0;
    bool in_word = false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (isspace(*p)) {
            in_word = false;
        } else if (!in_word) {
            in_word = true;
            if (n < (1 << 30))
                n++;
        }
    }
    return n;
}

/* splitmix64: a well-mixed 64-bit value per (seed, index). */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t sim_text_seed(uint64_t prompt_hash, int index)
{
    return mix(prompt_hash ^ mix((uint64_t)(unsigned)index + 0x51ed2701ULL));
}

static uint64_t rnd(uint64_t seed, int index)
{
    return mix(seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(unsigned)(index + 1));
}

/* Punctuation after token i: '.', ',' or none. */
static char punct(uint64_t seed, int index)
{
    unsigned k = (unsigned)((rnd(seed, index) >> 40) % 12);
    return k == 0 ? '.' : k == 1 ? ',' : '\0';
}

size_t sim_text_token(uint64_t seed, int index, char *buf, size_t cap)
{
    if (!buf || cap == 0)
        return 0;
    const char *w = words[rnd(seed, index) % (sizeof(words) / sizeof(words[0]))];
    bool capital = index == 0 || punct(seed, index - 1) == '.';
    size_t len = 0;
    if (index > 0 && len + 1 < cap)
        buf[len++] = ' ';
    for (size_t i = 0; w[i] && len + 1 < cap; i++)
        buf[len++] = (char)(i == 0 && capital ? toupper((unsigned char)w[i]) : w[i]);
    char p = punct(seed, index);
    if (p && len + 1 < cap)
        buf[len++] = p;
    buf[len] = '\0';
    return len;
}

int sim_text_natural_len(uint64_t seed)
{
    return 8 + (int)(mix(seed ^ 0xe05ULL) % 120);
}

int sim_text_plan(uint64_t seed, int max_tokens, int min_tokens, bool ignore_eos, bool *stopped)
{
    int natural = sim_text_natural_len(seed);
    if (natural < min_tokens)
        natural = min_tokens;
    if (ignore_eos || natural >= max_tokens) {
        *stopped = false;
        return max_tokens;
    }
    *stopped = true;
    return natural;
}

char *sim_text_completion(uint64_t seed, int n)
{
    size_t cap = (size_t)(n > 0 ? n : 0) * SIM_TEXT_TOKEN_MAX + 1;
    char *out = xmalloc(cap);
    size_t len = 0;
    for (int i = 0; i < n; i++)
        len += sim_text_token(seed, i, out + len, cap - len);
    out[len] = '\0';
    return out;
}
