/* qcheck — see qcheck.h. */
#include "coordinator/qcheck.h"

#include "common/xalloc.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameters ------------------------------------------------------------------- */

static const uint32_t COMMON[][2] = {
    {0x0000, 0x036F},   /* Latin, IPA, modifiers, combining marks */
    {0x0370, 0x03FF},   /* Greek */
    {0x0400, 0x052F},   /* Cyrillic */
    {0x0530, 0x058F},   /* Armenian */
    {0x0590, 0x05FF},   /* Hebrew */
    {0x0600, 0x077F},   /* Arabic */
    {0x0900, 0x0DFF},   /* Indic scripts, Sinhala */
    {0x0E00, 0x0EFF},   /* Thai, Lao */
    {0x10A0, 0x10FF},   /* Georgian */
    {0x1100, 0x11FF},   /* Hangul Jamo */
    {0x1E00, 0x1FFF},   /* Latin Extended Additional, Greek Extended */
    {0x2000, 0x2BFF},   /* punctuation, super/subscripts, currency, letterlike, arrows,
                           math, technical, box drawing, shapes, dingbats */
    {0x2E80, 0x2FDF},   /* CJK radicals */
    {0x3000, 0x312F},   /* CJK punctuation, kana, Bopomofo */
    {0x3130, 0x318F},   /* Hangul compatibility Jamo */
    {0x31F0, 0x33FF},   /* kana extension, enclosed CJK, CJK compatibility */
    {0x3400, 0x4DBF},   /* CJK extension A */
    {0x4E00, 0x9FFF},   /* CJK unified ideographs */
    {0xAC00, 0xD7AF},   /* Hangul syllables */
    {0xF900, 0xFAFF},   /* CJK compatibility ideographs */
    {0xFE30, 0xFE4F},   /* CJK compatibility forms */
    {0xFF00, 0xFFEF},   /* half- and full-width forms */
    {0x1F000, 0x1FAFF}, /* emoji, symbols and pictographs */
};

void qck_charset_default(struct qck_charset *cs)
{
    cs->n = 0;
    for (size_t i = 0; i < sizeof(COMMON) / sizeof(COMMON[0]); i++) {
        cs->lo[cs->n] = COMMON[i][0];
        cs->hi[cs->n] = COMMON[i][1];
        cs->n++;
    }
}

void qck_params_default(struct qck_params *p)
{
    memset(p, 0, sizeof(*p));
    p->min_tokens = 24;
    p->max_period = 64;
    p->repeat_min_tokens = 32;
    p->repeat_short_tokens = 12;
    p->ngram_min_tokens = 64;
    p->ngram_distinct = 0.25;
    p->garbled_logprob = -4.0;
    p->garbled_top_logprob = -1.5;
    p->garbled_entropy = 0.9;
    p->garbled_run = 8;
    p->garbled_share = 0.5;
    p->invalid_min = 3;
    p->invalid_share = 0.05;
    p->rare_share = 0.2;
    p->rare_min = 8;
    qck_charset_default(&p->common);
}

static int parse_hex(const char **s, uint32_t *out)
{
    const char *p = *s;
    uint32_t v = 0;
    int digits = 0;
    for (;; p++, digits++) {
        int d;
        if (*p >= '0' && *p <= '9')
            d = *p - '0';
        else if (*p >= 'a' && *p <= 'f')
            d = *p - 'a' + 10;
        else if (*p >= 'A' && *p <= 'F')
            d = *p - 'A' + 10;
        else
            break;
        if (digits >= 6)
            return -EINVAL;
        v = v * 16 + (uint32_t)d;
    }
    if (digits == 0 || v > 0x10FFFF)
        return -EINVAL;
    *s = p;
    *out = v;
    return 0;
}

int qck_charset_parse(struct qck_charset *cs, const char *s, char *err, size_t cap)
{
    struct qck_charset r = {.n = 0};
    const char *p = s;
    while (*p == ' ')
        p++;
    if (*p == '\0') {
        snprintf(err, cap, "empty list of code point ranges");
        return -EINVAL;
    }
    for (;;) {
        uint32_t lo, hi;
        const char *at = p;
        if (parse_hex(&p, &lo) < 0)
            goto bad;
        hi = lo;
        if (*p == '-') {
            p++;
            if (parse_hex(&p, &hi) < 0)
                goto bad;
        }
        if (hi < lo) {
            snprintf(err, cap, "reversed code point range at offset %zu", (size_t)(at - s));
            return -EINVAL;
        }
        if (r.n >= QCK_MAX_RANGES) {
            snprintf(err, cap, "more than %d code point ranges", QCK_MAX_RANGES);
            return -EINVAL;
        }
        r.lo[r.n] = lo;
        r.hi[r.n] = hi;
        r.n++;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        if (*p != ',')
            goto bad;
        p++;
        while (*p == ' ')
            p++;
    }
    *cs = r;
    return 0;
bad:
    snprintf(err, cap,
             "bad code point range at offset %zu (want HEX or HEX-HEX, at most 10FFFF, "
             "separated by commas)",
             (size_t)(p - s));
    return -EINVAL;
}

bool qck_charset_has(const struct qck_charset *cs, uint32_t cp)
{
    for (int i = 0; i < cs->n; i++)
        if (cp >= cs->lo[i] && cp <= cs->hi[i])
            return true;
    return false;
}

/* ---- the accumulator ---------------------------------------------------------------- */

void qck_acc_init(struct qck_acc *a, size_t max_tokens, size_t max_text)
{
    memset(a, 0, sizeof(*a));
    a->max_tokens = max_tokens;
    a->max_text = max_text;
}

void qck_acc_release(struct qck_acc *a)
{
    if (!a)
        return;
    free(a->tok);
    free(a->text);
    memset(a, 0, sizeof(*a));
}

void qck_acc_add_text(struct qck_acc *a, const char *s, size_t len)
{
    size_t room = a->max_text - a->text_len;
    if (len > room) {
        a->dropped += len - room;
        len = room;
    }
    if (len == 0)
        return;
    if (a->text_len + len > a->text_cap) {
        size_t c = a->text_cap ? a->text_cap : 256;
        while (c < a->text_len + len)
            c *= 2;
        if (c > a->max_text)
            c = a->max_text;
        a->text = xrealloc(a->text, c);
        a->text_cap = c;
    }
    memcpy(a->text + a->text_len, s, len);
    a->text_len += len;
}

void qck_acc_add_token(struct qck_acc *a, const struct qck_token *t)
{
    if (a->n >= a->max_tokens) {
        a->dropped++;
        return;
    }
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 64;
        if (c > a->max_tokens)
            c = a->max_tokens;
        a->tok = xrealloc(a->tok, c * sizeof(*a->tok));
        a->cap = c;
    }
    a->tok[a->n++] = *t;
}

uint64_t qck_token_id(const char *s, size_t len, bool *has_id)
{
    static const char pfx[] = "token_id:";
    size_t pl = sizeof(pfx) - 1;
    if (len > pl && len <= pl + 10 && memcmp(s, pfx, pl) == 0) {
        uint64_t v = 0;
        size_t i = pl;
        for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
            v = v * 10 + (uint64_t)(s[i] - '0');
        if (i == len && v <= INT32_MAX) {
            *has_id = true;
            return v;
        }
    }
    /* FNV-1a; the top bit set so that a hash never equals a small real id */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ULL;
    }
    *has_id = false;
    return h | (1ULL << 63);
}

static bool get_logprob(const json_t *v, double *out)
{
    if (!json_is_number(v))
        return false;
    double d = json_number_value(v);
    if (isnan(d) || d > 0.0)
        return false;
    *out = d < -1e4 ? -1e4 : d; /* vLLM sends -9999.0 for -inf */
    return true;
}

/* top: the chat form [{token, logprob, ...}] or the completions form {token: logprob}. */
static bool add_top(struct qck_token *t, const json_t *top)
{
    if (json_is_null(top) || !top)
        return true;
    if (json_is_array(top)) {
        size_t i;
        const json_t *e;
        json_array_foreach(top, i, e)
        {
            double lp;
            if (!json_is_object(e) || !get_logprob(json_object_get(e, "logprob"), &lp))
                return false;
            if (t->n_top < QCK_MAX_TOP)
                t->top[t->n_top++] = lp;
        }
        return true;
    }
    if (json_is_object(top)) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)top, k, v)
        {
            double lp;
            if (!get_logprob(v, &lp))
                return false;
            if (t->n_top < QCK_MAX_TOP)
                t->top[t->n_top++] = lp;
        }
        return true;
    }
    return false;
}

static bool add_chat_logprobs(struct qck_acc *a, const json_t *lp)
{
    const json_t *content = json_object_get(lp, "content");
    if (!content || json_is_null(content))
        return true;
    if (!json_is_array(content))
        return false;
    size_t i;
    const json_t *e;
    json_array_foreach(content, i, e)
    {
        struct qck_token t = {0};
        const json_t *tok = json_object_get(e, "token");
        if (!json_is_object(e) || !json_is_string(tok) ||
            !get_logprob(json_object_get(e, "logprob"), &t.logprob))
            return false;
        t.id = qck_token_id(json_string_value(tok), json_string_length(tok), &t.has_id);
        if (!add_top(&t, json_object_get(e, "top_logprobs")))
            return false;
        qck_acc_add_token(a, &t);
    }
    return true;
}

static bool add_completion_logprobs(struct qck_acc *a, const json_t *lp)
{
    const json_t *tokens = json_object_get(lp, "tokens");
    const json_t *lps = json_object_get(lp, "token_logprobs");
    const json_t *tops = json_object_get(lp, "top_logprobs");
    if (!json_is_array(tokens) || !json_is_array(lps) ||
        json_array_size(tokens) != json_array_size(lps))
        return false;
    if (tops && !json_is_null(tops) &&
        (!json_is_array(tops) || json_array_size(tops) != json_array_size(tokens)))
        return false;
    for (size_t i = 0; i < json_array_size(tokens); i++) {
        struct qck_token t = {0};
        const json_t *tok = json_array_get(tokens, i);
        const json_t *l = json_array_get(lps, i);
        if (!json_is_string(tok))
            return false;
        if (json_is_null(l)) /* the echoed prompt's first token has none */
            continue;
        if (!get_logprob(l, &t.logprob))
            return false;
        t.id = qck_token_id(json_string_value(tok), json_string_length(tok), &t.has_id);
        if (json_is_array(tops) && !add_top(&t, json_array_get(tops, i)))
            return false;
        qck_acc_add_token(a, &t);
    }
    return true;
}

bool qck_acc_add_response(struct qck_acc *a, const json_t *resp)
{
    const json_t *choices = json_object_get(resp, "choices");
    if (!json_is_object(resp) || !json_is_array(choices))
        goto bad;
    const json_t *c = NULL;
    size_t i;
    const json_t *e;
    json_array_foreach(choices, i, e)
    {
        if (!json_is_object(e))
            goto bad;
        const json_t *idx = json_object_get(e, "index");
        if (!idx || (json_is_integer(idx) && json_integer_value(idx) == 0)) {
            c = e;
            break;
        }
    }
    if (!c) /* a usage-only chunk, or other choices' chunk */
        return true;
    const json_t *text = json_object_get(c, "text");
    const json_t *msg = json_object_get(c, "message");
    if (!msg)
        msg = json_object_get(c, "delta");
    if (msg && !json_is_object(msg))
        goto bad;
    if (!text && msg)
        text = json_object_get(msg, "content");
    if (text && !json_is_null(text)) {
        if (!json_is_string(text))
            goto bad;
        qck_acc_add_text(a, json_string_value(text), json_string_length(text));
    }
    const json_t *lp = json_object_get(c, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (!json_is_object(lp))
            goto bad;
        bool ok = json_object_get(lp, "tokens") ? add_completion_logprobs(a, lp)
                                                : add_chat_logprobs(a, lp);
        if (!ok)
            goto bad;
    }
    const json_t *fr = json_object_get(c, "finish_reason");
    if (json_is_string(fr))
        a->finished = true;
    return true;
bad:
    a->malformed = true;
    return false;
}

/* ---- detectors ---------------------------------------------------------------------- */

int qck_repetition(const uint64_t *ids, size_t n, int max_period, size_t *covered)
{
    int best = 0;
    size_t best_cover = 0;
    for (int p = 1; p <= max_period && (size_t)p < n; p++) {
        size_t run = 0;
        for (size_t i = n; i > (size_t)p && ids[i - 1] == ids[i - 1 - p]; i--)
            run++;
        /* three periods at least: a pair of equal halves is not yet a loop */
        if (run < 2 * (size_t)p)
            continue;
        size_t cover = run + (size_t)p;
        if (cover > best_cover) {
            best_cover = cover;
            best = p;
        }
    }
    *covered = best_cover;
    return best;
}

static uint64_t mix64(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

double qck_distinct_4grams(const uint64_t *ids, size_t n)
{
    if (n < 4)
        return 1.0;
    size_t grams = n - 3;
    size_t cap = 64;
    while (cap < grams * 2)
        cap *= 2;
    uint64_t *set = xcalloc(cap, sizeof(*set)); /* 0 = empty slot */
    size_t distinct = 0;
    for (size_t i = 0; i < grams; i++) {
        uint64_t h = mix64(ids[i]);
        h = mix64(h ^ ids[i + 1]);
        h = mix64(h ^ ids[i + 2]);
        h = mix64(h ^ ids[i + 3]);
        if (h == 0)
            h = 1;
        size_t s = (size_t)h & (cap - 1);
        while (set[s] && set[s] != h)
            s = (s + 1) & (cap - 1);
        if (!set[s]) {
            set[s] = h;
            distinct++;
        }
    }
    free(set);
    return (double)distinct / (double)grams;
}

double qck_top_entropy(const double *top, int n)
{
    if (n < 2)
        return 0.0;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += exp(top[i]);
    if (!(sum > 0.0))
        return 1.0; /* every listed entry has probability 0: nothing stands out */
    double h = 0.0;
    for (int i = 0; i < n; i++) {
        double q = exp(top[i]) / sum;
        if (q > 0.0)
            h -= q * log(q);
    }
    double e = h / log((double)n);
    return e < 0.0 ? 0.0 : e > 1.0 ? 1.0 : e;
}

bool qck_token_low_conf(const struct qck_token *t, const struct qck_params *p)
{
    if (t->logprob >= p->garbled_logprob || t->n_top < 3)
        return false;
    double best = t->top[0];
    for (int i = 1; i < t->n_top; i++)
        if (t->top[i] > best)
            best = t->top[i];
    return best < p->garbled_top_logprob || qck_top_entropy(t->top, t->n_top) > p->garbled_entropy;
}

/* Decode one UTF-8 sequence at s[0..len): its length, or 0 when invalid (then the
 * maximal invalid subpart, at least 1 byte, is in *skip). */
static size_t utf8_next(const unsigned char *s, size_t len, uint32_t *cp, size_t *skip)
{
    unsigned char c = s[0];
    size_t need;
    uint32_t v, min;
    *skip = 1;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        need = 1, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        if (i >= len || (s[i] & 0xC0) != 0x80) {
            *skip = i;
            return 0;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *skip = 1;
        return 0;
    }
    *cp = v;
    return need + 1;
}

size_t qck_invalid_chars(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t bad = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t skip;
        size_t l = utf8_next(u + i, len - i, &cp, &skip);
        if (l == 0) {
            bad++;
            i += skip;
            continue;
        }
        if (cp == 0xFFFD)
            bad++;
        i += l;
    }
    return bad;
}

static bool is_space(uint32_t cp)
{
    return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || cp == 0x85 || cp == 0xA0 ||
           (cp >= 0x2000 && cp <= 0x200B) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

size_t qck_rare_chars(const char *s, size_t len, const struct qck_charset *cs, size_t *total)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t rare = 0, all = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t skip;
        size_t l = utf8_next(u + i, len - i, &cp, &skip);
        if (l == 0) { /* invalid bytes are the garbled detector's */
            i += skip;
            continue;
        }
        i += l;
        if (is_space(cp))
            continue;
        all++;
        if (cp != 0xFFFD && !qck_charset_has(cs, cp))
            rare++;
    }
    *total = all;
    return rare;
}

void qck_check(const struct qck_acc *a, const struct qck_params *p, struct qck_verdict *v)
{
    memset(v, 0, sizeof(*v));
    v->distinct_4gram = 1.0;
    v->valid = !a->malformed && a->n >= (size_t)p->min_tokens && p->min_tokens > 0;
    if (!v->valid)
        return;
    /* repetition */
    uint64_t *ids = xmalloc(a->n * sizeof(*ids));
    for (size_t i = 0; i < a->n; i++)
        ids[i] = a->tok[i].id;
    v->period = qck_repetition(ids, a->n, p->max_period, &v->repeat_tokens);
    if (a->n >= (size_t)p->ngram_min_tokens)
        v->distinct_4gram = qck_distinct_4grams(ids, a->n);
    free(ids);
    /* a long loop, or a short answer that is mostly one (at least repeat_short_tokens,
     * three quarters of it: a loop that started early and ran into max_tokens) */
    bool loop =
        v->period > 0 &&
        (v->repeat_tokens >= (size_t)p->repeat_min_tokens ||
         (v->repeat_tokens >= (size_t)p->repeat_short_tokens && 4 * v->repeat_tokens >= 3 * a->n));
    if (loop || v->distinct_4gram < p->ngram_distinct)
        v->bad |= QCK_REPEAT;
    /* garbled */
    if (p->garbled) {
        size_t run = 0, low = 0;
        for (size_t i = 0; i < a->n; i++) {
            if (qck_token_low_conf(&a->tok[i], p)) {
                low++;
                if (++run > v->low_conf_run)
                    v->low_conf_run = run;
            } else {
                run = 0;
            }
        }
        v->low_conf_share = (double)low / (double)a->n;
        v->invalid_chars = qck_invalid_chars(a->text, a->text_len);
        if (v->low_conf_run >= (size_t)p->garbled_run || v->low_conf_share >= p->garbled_share ||
            (v->invalid_chars >= (size_t)p->invalid_min &&
             (double)v->invalid_chars >= p->invalid_share * (double)a->n))
            v->bad |= QCK_GARBLED;
    }
    /* rare characters */
    if (p->rare) {
        size_t total;
        v->rare_chars = qck_rare_chars(a->text, a->text_len, &p->common, &total);
        v->rare_share = total ? (double)v->rare_chars / (double)total : 0.0;
        if (v->rare_chars >= (size_t)p->rare_min && v->rare_share >= p->rare_share)
            v->bad |= QCK_RARE;
    }
}

const char *qck_fault_name(unsigned bad)
{
    static const char *names[8] = {
        "ok",
        "repeat",
        "garbled",
        "repeat+garbled",
        "rare_chars",
        "repeat+rare_chars",
        "garbled+rare_chars",
        "repeat+garbled+rare_chars",
    };
    return names[bad & 7];
}
