#include "sim/sim_text.h"

#include "common/util.h"
#include "sim/sim_tok.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#define LOCATE_BUDGET 4000000 /* token comparisons at most per sim_text_locate */

uint64_t sim_text_hash(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t hash_id(uint64_t h, int32_t id)
{
    uint32_t u = (uint32_t)id;
    for (int b = 0; b < 4; b++) {
        h ^= (u >> (8 * b)) & 0xff;
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t sim_text_hash_ids(uint64_t h, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = hash_id(h, ids[i]);
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

/* splitmix64: a well-mixed 64-bit value per input. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

uint64_t sim_text_seed(uint64_t h, int k)
{
    return mix(h ^ mix((uint64_t)(unsigned)k + 0x51ed2701ULL));
}

static uint64_t rnd(uint64_t seed, int index)
{
    return mix(seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(unsigned)(index + 1));
}

/* A uniform double in [0, 1). */
static double unit(uint64_t x)
{
    return (double)(x >> 11) / 9007199254740992.0;
}

/* Punctuation after token i: 1 '.', 2 ',' or 0. */
static int punct(uint64_t seed, int index)
{
    unsigned k = (unsigned)((rnd(seed, index) >> 40) % 12);
    return k == 0 ? 1 : k == 1 ? 2 : 0;
}

int32_t sim_text_gen(uint64_t seed, int i, bool first_space)
{
    int w = (int)(rnd(seed, i) % (uint64_t)sim_tok_n_words());
    bool cap = i == 0 || punct(seed, i - 1) == 1;
    bool space = i > 0 || first_space;
    return sim_tok_word(w, space, cap, punct(seed, i));
}

int32_t sim_text_gen_mode(enum sim_mode mode, uint64_t seed, int i, bool first_space)
{
    uint64_t r = rnd(seed ^ 0xfa017ULL, i);
    switch (mode) {
    case SIM_MODE_REPEAT: {
        if (i < 3)
            return sim_text_gen(seed, i, first_space);
        int period = 2 + (int)(mix(seed ^ 0x5eedULL) % 5);
        return sim_text_gen(seed ^ 0x10095ULL, 1 + (i - 3) % period, true);
    }
    case SIM_MODE_GARBLED: {
        unsigned cls = (unsigned)(r % 100);
        if (cls < 35)
            return (int32_t)(0x80 + (r >> 8) % 0x80); /* a lone non-UTF-8 byte */
        if (cls < 60)
            return (int32_t)(SIM_TOK_UNK_BASE + (r >> 8) % (2 * SIM_TOK_UNK_RANGE));
        if (cls < 80)
            return sim_tok_rare((int)((r >> 8) % (uint64_t)sim_tok_n_rare()));
        return sim_tok_word((int)((r >> 8) % (uint64_t)sim_tok_n_words()), (r >> 40) & 1,
                            (r >> 41) & 1, (int)((r >> 42) % 3));
    }
    case SIM_MODE_RARE:
        if (r % 100 < 80)
            return sim_tok_rare((int)((r >> 8) % (uint64_t)sim_tok_n_rare()));
        return sim_text_gen(seed, i, first_space);
    default:
        return sim_text_gen(seed, i, first_space);
    }
}

static bool is_ws_byte(int32_t id)
{
    return id == ' ' || id == '\t' || id == '\n' || id == '\r' || id == '\v' || id == '\f';
}

bool sim_text_first_space(const int32_t *ids, size_t n)
{
    if (n == 0)
        return false;
    int32_t last = ids[n - 1];
    return !sim_tok_is_special(last) && !is_ws_byte(last);
}

void sim_text_locate(const int32_t *ids, size_t n, struct sim_text_origin *o)
{
    memset(o, 0, sizeof(*o));
    size_t window = n < SIM_TEXT_LOCATE_WINDOW ? n : SIM_TEXT_LOCATE_WINDOW;
    size_t start = n - window;
    /* An answer is made of word forms only: it cannot start before the last token
     * that is not one (an unknown word, a byte, a chat end marker). */
    int w, punct;
    bool sp, cap;
    for (size_t i = n; i > start; i--) {
        if (!sim_tok_word_parts(ids[i - 1], &w, &sp, &cap, &punct)) {
            start = i;
            break;
        }
    }
    uint64_t h = sim_text_hash_ids(SIM_TEXT_HASH_INIT, ids, start);
    long budget = LOCATE_BUDGET;
    /* The smallest split wins: the longest answer suffix (see the header). */
    for (size_t j = start; j < n && budget > 0; j++) {
        bool fs = sim_text_first_space(ids, j);
        for (int k = 0; k < SIM_TEXT_MAX_K; k++) {
            uint64_t seed = sim_text_seed(h, k);
            budget--;
            if (sim_text_gen(seed, 0, fs) != ids[j])
                continue;
            size_t t = 1;
            while (j + t < n && budget > 0 && sim_text_gen(seed, (int)t, fs) == ids[j + t]) {
                t++;
                budget--;
            }
            if (j + t == n) {
                o->split = j;
                o->k = k;
                o->m = (int)(n - j);
                o->hash = h;
                o->found = true;
                return;
            }
        }
        h = hash_id(h, ids[j]);
    }
    o->split = n;
    o->k = 0;
    o->m = 0;
    o->hash = sim_text_hash_ids(SIM_TEXT_HASH_INIT, ids, n);
}

int sim_text_natural_len(uint64_t seed)
{
    return 8 + (int)(mix(seed ^ 0xe05ULL) % 120);
}

int sim_text_plan_from(uint64_t seed, int done, int max_tokens, int min_tokens, bool ignore_eos,
                       bool *stopped)
{
    int natural = sim_text_natural_len(seed) - done;
    if (natural < 0)
        natural = 0;
    if (natural < min_tokens)
        natural = min_tokens;
    if (ignore_eos || natural >= max_tokens) {
        *stopped = false;
        return max_tokens;
    }
    *stopped = true;
    return natural;
}

int sim_text_plan(uint64_t seed, int max_tokens, int min_tokens, bool ignore_eos, bool *stopped)
{
    return sim_text_plan_from(seed, 0, max_tokens, min_tokens, ignore_eos, stopped);
}

/* ---- log-probabilities ------------------------------------------------------------- */

/* An alternative token for rank slot j (never the sampled one, never a repeat). */
static int32_t alternative(enum sim_mode mode, uint64_t r, int32_t sampled)
{
    int w, p;
    bool sp, cap;
    bool is_word = sim_tok_word_parts(sampled, &w, &sp, &cap, &p);
    switch (mode) {
    case SIM_MODE_GARBLED:
        return (r & 1) ? (int32_t)(0x80 + (r >> 8) % 0x80)
                       : (int32_t)(SIM_TOK_UNK_BASE + (r >> 8) % (2 * SIM_TOK_UNK_RANGE));
    case SIM_MODE_RARE:
        if (r % 3)
            return sim_tok_rare((int)((r >> 8) % (uint64_t)sim_tok_n_rare()));
        break;
    default:
        break;
    }
    int alt = (int)((r >> 8) % (uint64_t)sim_tok_n_words());
    return is_word ? sim_tok_word(alt, sp, cap, p) : sim_tok_word(alt, true, false, 0);
}

void sim_text_logprobs(enum sim_mode mode, uint64_t seed, int i, int32_t sampled, int top,
                       struct sim_lp *out)
{
    if (top < 0)
        top = 0;
    if (top > SIM_TEXT_MAX_TOP)
        top = SIM_TEXT_MAX_TOP;
    uint64_t r = rnd(seed ^ 0x109b7ULL, i);
    double p[SIM_TEXT_MAX_TOP + 1];
    /* The whole distribution is made whatever `top` asks for: a real engine's logprobs
     * do not depend on how many of them a request lists (a gateway that asks for more
     * and projects them back relies on it). */
    int slots = SIM_TEXT_MAX_TOP;
    int rank; /* 1-based; > slots means outside the top list */
    double p_sampled;
    switch (mode) {
    case SIM_MODE_REPEAT:
        rank = 1;
        p[0] = 1.0 - exp(-(4.0 + 4.0 * unit(mix(r))));
        for (int j = 1; j < slots; j++)
            p[j] = exp(-(8.0 + j + 2.0 * unit(mix(r + (uint64_t)j))));
        p_sampled = p[0];
        break;
    case SIM_MODE_GARBLED:
        /* flat and low: the sampled token is far down the list */
        for (int j = 0; j < slots; j++)
            p[j] = 0.055 * (1.0 - 0.015 * j) * (0.85 + 0.3 * unit(mix(r + (uint64_t)j)));
        rank = 30 + (int)(mix(r ^ 7) % 400);
        p_sampled = exp(-(5.0 + 4.0 * unit(mix(r ^ 9))));
        break;
    case SIM_MODE_RARE:
        p[0] = 0.18 + 0.17 * unit(mix(r));
        for (int j = 1; j < slots; j++)
            p[j] = p[j - 1] * (0.6 + 0.3 * unit(mix(r + (uint64_t)j)));
        rank = 1 + (int)(mix(r ^ 3) % 3);
        p_sampled = rank <= slots ? p[rank - 1] : p[slots - 1] * 0.8;
        break;
    default: {
        double u = unit(mix(r));
        p[0] = 0.45 + 0.53 * sqrt(u);
        for (int j = 1; j < slots; j++)
            p[j] = p[j - 1] * (0.1 + 0.5 * unit(mix(r + (uint64_t)j)));
        rank = unit(mix(r ^ 5)) < 0.9 ? 1 : 2;
        if (rank == 2 && slots < 2)
            p_sampled = p[0] * (0.5 + 0.45 * unit(mix(r ^ 6)));
        else
            p_sampled = p[rank - 1];
        break;
    }
    }
    /* ranked: descending; the sampled token takes its rank's probability */
    for (int a = 1; a < slots; a++)
        for (int b = a; b > 0 && p[b] > p[b - 1]; b--) {
            double t = p[b];
            p[b] = p[b - 1];
            p[b - 1] = t;
        }
    if (rank <= slots && !(mode == SIM_MODE_GOOD && rank == 2 && slots < 2))
        p_sampled = p[rank - 1];
    /* keep the listed mass (and the sampled token's) below 1 */
    double sum = p_sampled;
    for (int j = 0; j < slots; j++)
        if (j != rank - 1)
            sum += p[j];
    if (sum > 0.995) {
        double f = 0.995 / sum;
        for (int j = 0; j < slots; j++)
            p[j] *= f;
        p_sampled *= f;
    }
    out->rank = rank;
    out->n = 0;
    out->e[out->n].id = sampled;
    out->e[out->n++].lp = fmax(log(p_sampled), -9999.0);
    if (top == 0)
        return;
    uint64_t ar = mix(r ^ 0xa17ULL);
    for (int j = 0; j < top; j++) {
        if (j == rank - 1)
            continue; /* the sampled token holds this rank: it is e[0] */
        int32_t id;
        for (int tries = 0;; tries++) {
            ar = mix(ar);
            id = alternative(mode, ar, sampled);
            bool dup = id == sampled;
            for (int q = 0; q < out->n && !dup; q++)
                dup = out->e[q].id == id;
            if (!dup || tries > 50)
                break;
        }
        out->e[out->n].id = id;
        out->e[out->n++].lp = fmax(log(p[j]), -9999.0);
    }
}

/* ---- compatibility ---------------------------------------------------------------- */

size_t sim_text_token(uint64_t seed, int index, char *buf, size_t cap)
{
    char t[SIM_TOK_TEXT_MAX];
    size_t n = sim_tok_text(sim_text_gen(seed, index, false), false, t, sizeof(t));
    if (!buf || cap == 0)
        return 0;
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, t, n);
    buf[n] = '\0';
    return n;
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
