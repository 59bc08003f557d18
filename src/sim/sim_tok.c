#include "sim/sim_tok.h"

#include "common/util.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The generator's words: enough to look like prose in logs. */
static const char *const words[] = {
    "the",       "engine",    "decodes",    "a",          "token",     "while",
    "prefill",   "cache",     "blocks",     "move",       "between",   "nodes",
    "and",       "every",     "request",    "finds",      "its",       "way",
    "through",   "router",    "to",         "an",         "instance",  "that",
    "is",        "ready",     "model",      "weights",    "load",      "slowly",
    "but",       "streams",   "flow",       "quickly",    "over",      "network",
    "of",        "workers",   "with",       "fault",      "tolerance", "keeps",
    "serving",   "when",      "one",        "rank",       "fails",     "controller",
    "watches",   "heartbeat", "from",       "manager",    "on",        "host",
    "gateway",   "balances",  "across",     "replicas",   "in",        "cluster",
    "simulated", "text",      "deterministic", "for",     "same",      "prompt",
    "so",        "tests",     "compare",    "outputs",    "each",      "step",
    "attention", "layer",     "reads",      "keys",       "values",    "memory",
    "grows",     "as",        "context",    "extends",    "batch",     "scheduler",
    "picks",     "waiting",   "sequences",  "then",       "runs",      "them",
    "together",  "until",     "done",
};
#define N_WORDS ((int)(sizeof(words) / sizeof(words[0])))

/* Rare characters: 128 code points from each of four rarely used blocks (Egyptian
 * hieroglyphs, Yi syllables, cuneiform, Tangut), all assigned. */
static const uint32_t rare_blocks[] = {0x13000, 0xA000, 0x12000, 0x17000};
#define RARE_PER_BLOCK 128
#define N_RARE ((int)(sizeof(rare_blocks) / sizeof(rare_blocks[0])) * RARE_PER_BLOCK)

static const char *const special_names[] = {
    "<|endoftext|>",      "<|end_of_system|>", "<|end_of_user|>",
    "<|end_of_assistant|>", "<|end_of_tool|>", "<|end_of_turn|>",
};

int sim_tok_n_words(void)
{
    return N_WORDS;
}

int sim_tok_n_rare(void)
{
    return N_RARE;
}

void sim_ids_init(struct sim_ids *x, size_t max)
{
    memset(x, 0, sizeof(*x));
    x->max = max;
}

void sim_ids_release(struct sim_ids *x)
{
    free(x->v);
    memset(x, 0, sizeof(*x));
}

bool sim_ids_push(struct sim_ids *x, int32_t id)
{
    if (x->n >= x->max) {
        x->overflow = true;
        return false;
    }
    if (x->n == x->cap) {
        x->cap = x->cap ? x->cap * 2 : 64;
        if (x->cap > x->max)
            x->cap = x->max;
        x->v = xrealloc(x->v, x->cap * sizeof(*x->v));
    }
    x->v[x->n++] = id;
    return true;
}

int32_t sim_tok_word(int w, bool space, bool cap, int punct)
{
    return SIM_TOK_WORD_BASE + SIM_TOK_FORMS * w + (space ? 1 : 0) + (cap ? 2 : 0) + 4 * punct;
}

bool sim_tok_word_parts(int32_t id, int *w, bool *space, bool *cap, int *punct)
{
    if (id < SIM_TOK_WORD_BASE || id >= SIM_TOK_WORD_BASE + SIM_TOK_FORMS * N_WORDS)
        return false;
    int f = (id - SIM_TOK_WORD_BASE) % SIM_TOK_FORMS;
    *w = (id - SIM_TOK_WORD_BASE) / SIM_TOK_FORMS;
    *space = f & 1;
    *cap = f & 2;
    *punct = f >> 2;
    return true;
}

int32_t sim_tok_rare(int r)
{
    return SIM_TOK_RARE_BASE + (r % N_RARE);
}

bool sim_tok_valid(int64_t id)
{
    if (id < 0 || id >= (int64_t)SIM_TOK_VOCAB_SIZE)
        return false;
    if (id < 256 || (id >= SIM_TOK_EOS && id <= SIM_TOK_END_TURN))
        return true;
    if (id >= SIM_TOK_WORD_BASE && id < SIM_TOK_WORD_BASE + SIM_TOK_FORMS * N_WORDS)
        return true;
    if (id >= SIM_TOK_RARE_BASE && id < SIM_TOK_RARE_BASE + N_RARE)
        return true;
    return id >= SIM_TOK_UNK_BASE;
}

bool sim_tok_is_special(int32_t id)
{
    return id >= SIM_TOK_EOS && id <= SIM_TOK_END_TURN;
}

static size_t put_utf8(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The raw text of a token (bytes; a byte token may be a lone non-UTF-8 byte). */
static size_t raw_text(int32_t id, bool with_special, char *buf, size_t cap)
{
    size_t n = 0;
    if (cap < SIM_TOK_TEXT_MAX) {
        if (cap)
            buf[0] = '\0';
        return 0;
    }
    if (id >= 0 && id < 256) {
        buf[n++] = (char)id;
    } else if (sim_tok_is_special(id)) {
        if (with_special)
            n = (size_t)snprintf(buf, cap, "%s", special_names[id - SIM_TOK_EOS]);
    } else if (id >= SIM_TOK_WORD_BASE && id < SIM_TOK_WORD_BASE + SIM_TOK_FORMS * N_WORDS) {
        int w, punct;
        bool space, capital;
        sim_tok_word_parts(id, &w, &space, &capital, &punct);
        if (space)
            buf[n++] = ' ';
        for (const char *p = words[w]; *p; p++)
            buf[n++] = (char)(p == words[w] && capital ? toupper((unsigned char)*p) : *p);
        if (punct)
            buf[n++] = punct == 1 ? '.' : ',';
    } else if (id >= SIM_TOK_RARE_BASE && id < SIM_TOK_RARE_BASE + N_RARE) {
        int r = id - SIM_TOK_RARE_BASE;
        n = put_utf8(rare_blocks[r / RARE_PER_BLOCK] + (uint32_t)(r % RARE_PER_BLOCK), buf);
    } else if (id >= SIM_TOK_UNK_BASE && (int64_t)id < (int64_t)SIM_TOK_VOCAB_SIZE) {
        uint32_t k = (uint32_t)(id - SIM_TOK_UNK_BASE);
        n = (size_t)snprintf(buf, cap, "%s[w%05x]", (k & 1) ? " " : "", k >> 1);
    }
    buf[n] = '\0';
    return n;
}

size_t sim_tok_bytes(int32_t id, uint8_t *buf, size_t cap)
{
    char t[SIM_TOK_TEXT_MAX];
    size_t n = raw_text(id, true, t, sizeof(t));
    if (n > cap)
        n = cap;
    memcpy(buf, t, n);
    return n;
}

/* Append s (len bytes) to out as valid UTF-8: invalid sequences become U+FFFD. */
static size_t sanitize(const char *s, size_t len, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t k = util_utf8_seq_len_n(s + i, len - i);
        if (k == 0 || (k == 1 && s[i] == '\0')) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
            continue;
        }
        memcpy(out + o, s + i, k);
        o += k;
        i += k;
    }
    out[o] = '\0';
    return o;
}

size_t sim_tok_text(int32_t id, bool with_special, char *buf, size_t cap)
{
    char raw[SIM_TOK_TEXT_MAX];
    size_t n = raw_text(id, with_special, raw, sizeof(raw));
    if (cap < SIM_TOK_TEXT_MAX) {
        if (cap)
            buf[0] = '\0';
        return 0;
    }
    /* a 1-byte raw text expands to at most 3 bytes; other texts are valid already */
    if (n == 1 && (unsigned char)raw[0] >= 0x80)
        return sanitize(raw, n, buf);
    memcpy(buf, raw, n + 1);
    return n;
}

char *sim_tok_decode(const int32_t *ids, size_t n, bool with_special)
{
    /* raw bytes first (3x for the worst-case U+FFFD expansion) */
    size_t cap = n * SIM_TOK_TEXT_MAX + 1;
    char *raw = xmalloc(cap);
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += raw_text(ids[i], with_special, raw + len, SIM_TOK_TEXT_MAX);
    char *out = xmalloc(len * 3 + 1);
    sanitize(raw, len, out);
    free(raw);
    return out;
}

int32_t sim_tok_end_of(const char *role)
{
    if (!role)
        return SIM_TOK_END_TURN;
    if (!strcmp(role, "system") || !strcmp(role, "developer"))
        return SIM_TOK_END_SYSTEM;
    if (!strcmp(role, "user"))
        return SIM_TOK_END_USER;
    if (!strcmp(role, "assistant"))
        return SIM_TOK_END_ASSISTANT;
    if (!strcmp(role, "tool"))
        return SIM_TOK_END_TOOL;
    return SIM_TOK_END_TURN;
}

/* ---- word lookup --------------------------------------------------------------- */

#define TABLE_SIZE 4096 /* > 2 * N_WORDS * SIM_TOK_FORMS, a power of two */
static int32_t table[TABLE_SIZE];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static uint64_t fnv(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void table_build(void)
{
    for (int i = 0; i < TABLE_SIZE; i++)
        table[i] = -1;
    for (int32_t id = SIM_TOK_WORD_BASE; id < SIM_TOK_WORD_BASE + SIM_TOK_FORMS * N_WORDS; id++) {
        char t[SIM_TOK_TEXT_MAX];
        size_t n = raw_text(id, false, t, sizeof(t));
        /* Words appear in several forms but never twice in one form. */
        size_t k = fnv(t, n) & (TABLE_SIZE - 1);
        while (table[k] >= 0)
            k = (k + 1) & (TABLE_SIZE - 1);
        table[k] = id;
    }
}

/* The vocabulary id of a piece (leading space included), or -1. */
static int32_t lookup(const char *piece, size_t n)
{
    pthread_once(&table_once, table_build);
    if (n >= SIM_TOK_TEXT_MAX)
        return -1;
    size_t k = fnv(piece, n) & (TABLE_SIZE - 1);
    while (table[k] >= 0) {
        char t[SIM_TOK_TEXT_MAX];
        size_t tn = raw_text(table[k], false, t, sizeof(t));
        if (tn == n && !memcmp(t, piece, n))
            return table[k];
        k = (k + 1) & (TABLE_SIZE - 1);
    }
    return -1;
}

static bool is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

void sim_tok_encode(const char *s, size_t len, struct sim_ids *out)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        size_t start = i;
        bool space = false;
        if (is_ws(c)) {
            if (c == ' ' && i + 1 < len && !is_ws((unsigned char)s[i + 1])) {
                space = true;
                i++;
            } else {
                sim_ids_push(out, c);
                i++;
                continue;
            }
        }
        while (i < len && !is_ws((unsigned char)s[i]))
            i++;
        int32_t id = lookup(s + start, i - start);
        if (id < 0) {
            uint64_t h = fnv(s + start + (space ? 1 : 0), i - start - (space ? 1 : 0));
            id = (int32_t)(SIM_TOK_UNK_BASE + 2 * (h % SIM_TOK_UNK_RANGE) + (space ? 1 : 0));
        }
        sim_ids_push(out, id);
    }
}
