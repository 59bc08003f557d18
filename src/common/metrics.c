#include "common/metrics.h"

#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX_BOUNDS 64

/* Doubles live in atomic 64-bit words as their bit patterns: C11 has no portable
 * lock-free atomic double, but every target we build for has lock-free 64-bit words. */
static inline uint64_t d2u(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static inline double u2d(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void atomic_add_double(_Atomic uint64_t *slot, double v)
{
    uint64_t old = atomic_load_explicit(slot, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(slot, &old, d2u(u2d(old) + v),
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

/* Integer increments (the common case) are one fetch_add; fractional ones go to a
 * separate CAS-updated double so integer counts stay exact past 2^53. */
struct metrics_counter {
    _Atomic uint64_t ints;
    _Atomic uint64_t frac_bits;
};

struct metrics_gauge {
    _Atomic uint64_t bits;
};

struct metrics_histogram {
    const double *bounds; /* the family's, nbounds of them */
    size_t nbounds;
    _Atomic uint64_t *buckets; /* nbounds + 1 non-cumulative counts; last is +Inf */
    _Atomic uint64_t sum_bits;
};

struct child {
    char **values; /* family->nlabels strings */
    union {
        struct metrics_counter c;
        struct metrics_gauge g;
        struct metrics_histogram h;
    } u;
};

struct metrics_family {
    struct metrics_registry *reg;
    enum metrics_type type;
    char *name;
    char *help;
    char **labels;
    size_t nlabels;
    double *bounds;
    size_t nbounds;
    struct child **children;
    size_t nchildren, cap;
};

struct metrics_registry {
    pthread_mutex_t mu;
    struct metrics_family **fams;
    size_t nfams, cap;
};

static const double default_bounds[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10};

/* ---- validation --------------------------------------------------------------------- */

static bool is_alpha_(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool valid_metric_name(const char *s)
{
    if (!s || !*s || !(is_alpha_(*s) || *s == ':'))
        return false;
    for (s++; *s; s++)
        if (!(is_alpha_(*s) || is_digit(*s) || *s == ':'))
            return false;
    return true;
}

static bool valid_label_name(const char *s)
{
    if (!s || !*s || !is_alpha_(*s) || strncmp(s, "__", 2) == 0)
        return false;
    for (s++; *s; s++)
        if (!(is_alpha_(*s) || is_digit(*s)))
            return false;
    return true;
}

/* The exposition format is UTF-8 and scrapers reject a page with anything else. */
static bool valid_utf8(const char *s)
{
    while (*s) {
        size_t n = util_utf8_seq_len(s);
        if (n == 0)
            return false;
        s += n;
    }
    return true;
}

/* ---- registry ----------------------------------------------------------------------- */

struct metrics_registry *metrics_registry_new(void)
{
    struct metrics_registry *r = xcalloc(1, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void child_free(struct metrics_family *f, struct child *c)
{
    for (size_t i = 0; i < f->nlabels; i++)
        free(c->values[i]);
    free(c->values);
    if (f->type == METRICS_HISTOGRAM)
        free(c->u.h.buckets);
    free(c);
}

static void family_free(struct metrics_family *f)
{
    for (size_t i = 0; i < f->nchildren; i++)
        child_free(f, f->children[i]);
    free(f->children);
    for (size_t i = 0; i < f->nlabels; i++)
        free(f->labels[i]);
    free(f->labels);
    free(f->bounds);
    free(f->name);
    free(f->help);
    free(f);
}

void metrics_registry_free(struct metrics_registry *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nfams; i++)
        family_free(r->fams[i]);
    free(r->fams);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

static bool copy_bounds(struct metrics_family *f, const double *bounds, size_t n)
{
    if (!bounds || n == 0) {
        bounds = default_bounds;
        n = ARRAY_LEN(default_bounds);
    }
    if (n > 0 && isinf(bounds[n - 1]) && bounds[n - 1] > 0)
        n--;
    if (n > METRICS_MAX_BOUNDS)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return false;
    }
    f->bounds = xmalloc((n ? n : 1) * sizeof(double));
    if (n)
        memcpy(f->bounds, bounds, n * sizeof(double));
    f->nbounds = n;
    return true;
}

struct metrics_family *metrics_family_new(struct metrics_registry *r, enum metrics_type type,
                                          const char *name, const char *help,
                                          const double *bounds, size_t nbounds,
                                          const char *const *label_names)
{
    if (!r || !valid_metric_name(name) ||
        (type != METRICS_COUNTER && type != METRICS_GAUGE && type != METRICS_HISTOGRAM))
        return NULL;
    size_t nlabels = 0;
    while (label_names && label_names[nlabels]) {
        const char *l = label_names[nlabels];
        if (nlabels >= METRICS_MAX_LABELS || !valid_label_name(l) ||
            (type == METRICS_HISTOGRAM && strcmp(l, "le") == 0))
            return NULL;
        for (size_t j = 0; j < nlabels; j++)
            if (strcmp(label_names[j], l) == 0)
                return NULL;
        nlabels++;
    }
    struct metrics_family *f = xcalloc(1, sizeof(*f));
    f->reg = r;
    f->type = type;
    if (type == METRICS_HISTOGRAM && !copy_bounds(f, bounds, nbounds)) {
        free(f);
        return NULL;
    }
    f->name = xstrdup(name);
    f->help = xstrdup(help ? help : "");
    f->nlabels = nlabels;
    f->labels = xcalloc(nlabels ? nlabels : 1, sizeof(char *));
    for (size_t i = 0; i < nlabels; i++)
        f->labels[i] = xstrdup(label_names[i]);

    pthread_mutex_lock(&r->mu);
    bool dup = false;
    for (size_t i = 0; i < r->nfams && !dup; i++)
        dup = strcmp(r->fams[i]->name, name) == 0;
    if (!dup) {
        if (r->nfams == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 16;
            r->fams = xrealloc(r->fams, r->cap * sizeof(*r->fams));
        }
        r->fams[r->nfams++] = f;
    }
    pthread_mutex_unlock(&r->mu);
    if (dup) {
        family_free(f);
        return NULL;
    }
    return f;
}

/* Get-or-create the child for values (family label order). */
static struct child *child_get(struct metrics_family *f, enum metrics_type type,
                               const char *const *values)
{
    if (!f || f->type != type)
        return NULL;
    size_t n = 0;
    while (values && values[n]) {
        if (n >= f->nlabels || !valid_utf8(values[n]))
            return NULL;
        n++;
    }
    if (n != f->nlabels)
        return NULL;
    struct metrics_registry *r = f->reg;
    struct child *found = NULL;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < f->nchildren && !found; i++) {
        struct child *c = f->children[i];
        size_t j = 0;
        while (j < n && strcmp(c->values[j], values[j]) == 0)
            j++;
        if (j == n)
            found = c;
    }
    if (!found && f->nchildren < METRICS_MAX_CHILDREN) {
        struct child *c = xcalloc(1, sizeof(*c));
        c->values = xcalloc(n ? n : 1, sizeof(char *));
        for (size_t j = 0; j < n; j++)
            c->values[j] = xstrdup(values[j]);
        if (type == METRICS_HISTOGRAM) {
            c->u.h.bounds = f->bounds;
            c->u.h.nbounds = f->nbounds;
            c->u.h.buckets = xcalloc(f->nbounds + 1, sizeof(_Atomic uint64_t));
            atomic_init(&c->u.h.sum_bits, d2u(0.0));
        }
        /* Zero bits are 0.0 for counters and gauges: calloc initialised them. */
        if (f->nchildren == f->cap) {
            f->cap = f->cap ? f->cap * 2 : 4;
            f->children = xrealloc(f->children, f->cap * sizeof(*f->children));
        }
        f->children[f->nchildren++] = c;
        found = c;
    }
    pthread_mutex_unlock(&r->mu);
    return found;
}

/* Reorder name/value pairs into the family's label order. */
static struct child *child_get_kv(struct metrics_family *f, enum metrics_type type,
                                  const char *const *kv)
{
    if (!f || f->type != type)
        return NULL;
    const char *values[METRICS_MAX_LABELS + 1] = {0};
    size_t pairs = 0;
    for (; kv && kv[2 * pairs]; pairs++) {
        const char *k = kv[2 * pairs], *v = kv[2 * pairs + 1];
        if (!v || pairs >= f->nlabels)
            return NULL;
        size_t j = 0;
        while (j < f->nlabels && strcmp(f->labels[j], k) != 0)
            j++;
        if (j == f->nlabels || values[j])
            return NULL;
        values[j] = v;
    }
    if (pairs != f->nlabels)
        return NULL;
    return child_get(f, type, values);
}

static struct child *unlabelled(struct metrics_registry *r, enum metrics_type type,
                                const char *name, const char *help, const double *bounds,
                                size_t n)
{
    static const char *const none[] = {NULL};
    struct metrics_family *f = metrics_family_new(r, type, name, help, bounds, n, none);
    return f ? child_get(f, type, none) : NULL;
}

struct metrics_counter *metrics_counter_new(struct metrics_registry *r, const char *name,
                                            const char *help)
{
    struct child *c = unlabelled(r, METRICS_COUNTER, name, help, NULL, 0);
    return c ? &c->u.c : NULL;
}

struct metrics_gauge *metrics_gauge_new(struct metrics_registry *r, const char *name,
                                        const char *help)
{
    struct child *c = unlabelled(r, METRICS_GAUGE, name, help, NULL, 0);
    return c ? &c->u.g : NULL;
}

struct metrics_histogram *metrics_histogram_new(struct metrics_registry *r, const char *name,
                                                const char *help, const double *bounds,
                                                size_t n)
{
    struct child *c = unlabelled(r, METRICS_HISTOGRAM, name, help, bounds, n);
    return c ? &c->u.h : NULL;
}

struct metrics_counter *metrics_counter_labelsv(struct metrics_family *fam,
                                                const char *const *values)
{
    struct child *c = child_get(fam, METRICS_COUNTER, values);
    return c ? &c->u.c : NULL;
}

struct metrics_gauge *metrics_gauge_labelsv(struct metrics_family *fam, const char *const *values)
{
    struct child *c = child_get(fam, METRICS_GAUGE, values);
    return c ? &c->u.g : NULL;
}

struct metrics_histogram *metrics_histogram_labelsv(struct metrics_family *fam,
                                                    const char *const *values)
{
    struct child *c = child_get(fam, METRICS_HISTOGRAM, values);
    return c ? &c->u.h : NULL;
}

struct metrics_counter *metrics_counter_labels_(struct metrics_family *fam, const char *const *kv)
{
    struct child *c = child_get_kv(fam, METRICS_COUNTER, kv);
    return c ? &c->u.c : NULL;
}

struct metrics_gauge *metrics_gauge_labels_(struct metrics_family *fam, const char *const *kv)
{
    struct child *c = child_get_kv(fam, METRICS_GAUGE, kv);
    return c ? &c->u.g : NULL;
}

struct metrics_histogram *metrics_histogram_labels_(struct metrics_family *fam,
                                                    const char *const *kv)
{
    struct child *c = child_get_kv(fam, METRICS_HISTOGRAM, kv);
    return c ? &c->u.h : NULL;
}

/* ---- updates ------------------------------------------------------------------------ */

void metrics_counter_inc(struct metrics_counter *c)
{
    metrics_counter_add(c, 1);
}

void metrics_counter_add(struct metrics_counter *c, uint64_t n)
{
    if (c)
        atomic_fetch_add_explicit(&c->ints, n, memory_order_relaxed);
}

void metrics_counter_add_double(struct metrics_counter *c, double v)
{
    if (!c || !(v > 0) || isinf(v))
        return;
    atomic_add_double(&c->frac_bits, v);
}

double metrics_counter_value(const struct metrics_counter *c)
{
    if (!c)
        return 0;
    struct metrics_counter *m = (struct metrics_counter *)c;
    return (double)atomic_load_explicit(&m->ints, memory_order_relaxed) +
           u2d(atomic_load_explicit(&m->frac_bits, memory_order_relaxed));
}

void metrics_gauge_set(struct metrics_gauge *g, double v)
{
    if (g)
        atomic_store_explicit(&g->bits, d2u(v), memory_order_relaxed);
}

void metrics_gauge_add(struct metrics_gauge *g, double v)
{
    if (g)
        atomic_add_double(&g->bits, v);
}

void metrics_gauge_inc(struct metrics_gauge *g)
{
    metrics_gauge_add(g, 1.0);
}

void metrics_gauge_dec(struct metrics_gauge *g)
{
    metrics_gauge_add(g, -1.0);
}

double metrics_gauge_value(const struct metrics_gauge *g)
{
    if (!g)
        return 0;
    return u2d(atomic_load_explicit(&((struct metrics_gauge *)g)->bits, memory_order_relaxed));
}

void metrics_histogram_observe(struct metrics_histogram *h, double v)
{
    if (!h)
        return;
    /* Binary search for the first bound >= v; NaN compares false and lands in +Inf. */
    size_t lo = 0, hi = h->nbounds;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v <= h->bounds[mid])
            hi = mid;
        else
            lo = mid + 1;
    }
    if (isnan(v))
        lo = h->nbounds;
    atomic_fetch_add_explicit(&h->buckets[lo], 1, memory_order_relaxed);
    atomic_add_double(&h->sum_bits, v);
}

uint64_t metrics_histogram_count(const struct metrics_histogram *h)
{
    if (!h)
        return 0;
    uint64_t n = 0;
    for (size_t i = 0; i <= h->nbounds; i++)
        n += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    return n;
}

double metrics_histogram_sum(const struct metrics_histogram *h)
{
    if (!h)
        return 0;
    return u2d(atomic_load_explicit(&((struct metrics_histogram *)h)->sum_bits,
                                    memory_order_relaxed));
}

/* ---- rendering ---------------------------------------------------------------------- */

/* Prometheus float text: integers exactly, otherwise the shortest round-trip form. */
static void fmt_value(double v, char *buf, size_t cap)
{
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
    } else if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.0f", v);
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
}

/* HELP text escapes backslash and newline; label values also escape the double quote. */
static int put_escaped(struct strbuf *sb, const char *s, bool quote)
{
    int rc = 0;
    for (; *s && rc == 0; s++) {
        if (*s == '\\')
            rc = strbuf_append(sb, "\\\\", 2);
        else if (*s == '\n')
            rc = strbuf_append(sb, "\\n", 2);
        else if (quote && *s == '"')
            rc = strbuf_append(sb, "\\\"", 2);
        else
            rc = strbuf_putc(sb, *s);
    }
    return rc;
}

/* name{l1="v1",...,extra_name="extra_value"} value\n */
static int put_sample(struct strbuf *sb, const struct metrics_family *f, const char *suffix,
                      const struct child *c, const char *extra_name, const char *extra_value,
                      const char *value)
{
    int rc = strbuf_puts(sb, f->name);
    if (rc == 0)
        rc = strbuf_puts(sb, suffix);
    if (rc == 0 && (f->nlabels || extra_name)) {
        rc = strbuf_putc(sb, '{');
        for (size_t i = 0; i < f->nlabels && rc == 0; i++) {
            rc = strbuf_appendf(sb, "%s%s=\"", i ? "," : "", f->labels[i]);
            if (rc == 0)
                rc = put_escaped(sb, c->values[i], true);
            if (rc == 0)
                rc = strbuf_putc(sb, '"');
        }
        if (rc == 0 && extra_name) {
            rc = strbuf_appendf(sb, "%s%s=\"", f->nlabels ? "," : "", extra_name);
            if (rc == 0)
                rc = put_escaped(sb, extra_value, true);
            if (rc == 0)
                rc = strbuf_putc(sb, '"');
        }
        if (rc == 0)
            rc = strbuf_putc(sb, '}');
    }
    if (rc == 0)
        rc = strbuf_appendf(sb, " %s\n", value);
    return rc;
}

static int render_child(struct strbuf *sb, const struct metrics_family *f, struct child *c)
{
    char val[64];
    switch (f->type) {
    case METRICS_COUNTER: {
        uint64_t ints = atomic_load_explicit(&c->u.c.ints, memory_order_relaxed);
        double frac = u2d(atomic_load_explicit(&c->u.c.frac_bits, memory_order_relaxed));
        if (frac == 0)
            snprintf(val, sizeof(val), "%" PRIu64, ints);
        else
            fmt_value((double)ints + frac, val, sizeof(val));
        return put_sample(sb, f, "", c, NULL, NULL, val);
    }
    case METRICS_GAUGE:
        fmt_value(metrics_gauge_value(&c->u.g), val, sizeof(val));
        return put_sample(sb, f, "", c, NULL, NULL, val);
    case METRICS_HISTOGRAM: {
        /* _count is the +Inf bucket by construction, so one scrape is self-consistent
         * even while other threads observe. */
        uint64_t cum = 0;
        int rc = 0;
        char le[64];
        for (size_t i = 0; i <= f->nbounds && rc == 0; i++) {
            cum += atomic_load_explicit(&c->u.h.buckets[i], memory_order_relaxed);
            if (i < f->nbounds)
                fmt_value(f->bounds[i], le, sizeof(le));
            else
                snprintf(le, sizeof(le), "+Inf");
            snprintf(val, sizeof(val), "%" PRIu64, cum);
            rc = put_sample(sb, f, "_bucket", c, "le", le, val);
        }
        if (rc == 0) {
            fmt_value(metrics_histogram_sum(&c->u.h), val, sizeof(val));
            rc = put_sample(sb, f, "_sum", c, NULL, NULL, val);
        }
        if (rc == 0) {
            snprintf(val, sizeof(val), "%" PRIu64, cum);
            rc = put_sample(sb, f, "_count", c, NULL, NULL, val);
        }
        return rc;
    }
    }
    return 0;
}

static const char *type_name(enum metrics_type t)
{
    switch (t) {
    case METRICS_COUNTER:
        return "counter";
    case METRICS_GAUGE:
        return "gauge";
    case METRICS_HISTOGRAM:
        return "histogram";
    }
    return "untyped";
}

int metrics_render(struct metrics_registry *r, struct strbuf *sb)
{
    if (!r)
        return 0;
    int rc = 0;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->nfams && rc == 0; i++) {
        const struct metrics_family *f = r->fams[i];
        rc = strbuf_appendf(sb, "# HELP %s ", f->name);
        if (rc == 0)
            rc = put_escaped(sb, f->help, false);
        if (rc == 0)
            rc = strbuf_appendf(sb, "\n# TYPE %s %s\n", f->name, type_name(f->type));
        for (size_t j = 0; j < f->nchildren && rc == 0; j++)
            rc = render_child(sb, f, f->children[j]);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

char *metrics_render_alloc(struct metrics_registry *r, size_t cap, size_t *len_out)
{
    struct strbuf sb;
    strbuf_init(&sb, cap ? cap : 1);
    if (metrics_render(r, &sb) != 0) {
        strbuf_release(&sb);
        errno = E2BIG;
        return NULL;
    }
    if (len_out)
        *len_out = sb.len;
    return strbuf_take(&sb);
}
