/* metrics — a Prometheus registry rendered as text exposition format 0.0.4.
 *
 *   struct metrics_registry *reg = metrics_registry_new();
 *   struct metrics_counter *up = metrics_counter_new(reg, "motor_restarts_total", "Restarts.");
 *   struct metrics_family *req = metrics_counter_family(reg, "motor_requests_total",
 *                                                       "Requests per endpoint.", "endpoint_id");
 *   struct metrics_counter *ep0 = metrics_counter_labels(req, "endpoint_id", "0");
 *   metrics_counter_inc(ep0);                              // any thread, lock-free
 *   char *text = metrics_render_alloc(reg, 1 << 20, NULL); // for GET /metrics
 *
 * Threading: metric updates (inc/add/set/observe) and value reads are lock-free C11
 * atomics and may be called from any thread at any time. Registration, child lookup
 * (metrics_*_labels) and rendering take the registry's mutex: call them from any thread,
 * but cache child pointers instead of looking them up on every hot-path update.
 * Families and children live until metrics_registry_free, which must not race with
 * anything else.
 *
 * Errors are programming errors or hostile label values, so constructors return NULL
 * (invalid name, duplicate name, label mismatch, invalid UTF-8, too many children) and
 * every update function accepts NULL as a no-op: a metric never takes a daemon down. */
#ifndef MOTOR_METRICS_H
#define MOTOR_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct strbuf;

struct metrics_registry;
struct metrics_family;
struct metrics_counter;
struct metrics_gauge;
struct metrics_histogram;

enum metrics_type { METRICS_COUNTER = 1, METRICS_GAUGE, METRICS_HISTOGRAM };

/* Children per labelled family; beyond it *_labels returns NULL (bounds memory when a
 * label value comes from a peer). */
#define METRICS_MAX_CHILDREN 4096
/* Label names per family. */
#define METRICS_MAX_LABELS 8

struct metrics_registry *metrics_registry_new(void);
/* Frees the registry, its families and children. NULL-safe. */
void metrics_registry_free(struct metrics_registry *r);

/* --- unlabelled metrics: one family with a single child ---------------------------------
 * name: [a-zA-Z_:][a-zA-Z0-9_:]*, unique in the registry. help: any text (escaped on
 * output). Both are copied. NULL on invalid or duplicate name. */
struct metrics_counter *metrics_counter_new(struct metrics_registry *r, const char *name,
                                            const char *help);
struct metrics_gauge *metrics_gauge_new(struct metrics_registry *r, const char *name,
                                        const char *help);
/* bounds: upper bounds, strictly increasing and finite (a trailing +Inf is accepted and
 * ignored; +Inf is always implicit). bounds == NULL or n == 0: the Prometheus defaults
 * .005 .01 .025 .05 .1 .25 .5 1 2.5 5 10. At most 64 bounds. Copied. */
struct metrics_histogram *metrics_histogram_new(struct metrics_registry *r, const char *name,
                                                const char *help, const double *bounds,
                                                size_t n);

/* --- labelled families -------------------------------------------------------------------
 * label_names: NULL-terminated, 1..METRICS_MAX_LABELS names [a-zA-Z_][a-zA-Z0-9_]*, not
 * starting with "__", unique, and not "le" for histograms. The macros add the NULL. */
struct metrics_family *metrics_family_new(struct metrics_registry *r, enum metrics_type type,
                                          const char *name, const char *help,
                                          const double *bounds, size_t nbounds,
                                          const char *const *label_names);
#define METRICS_NAMES_(...) ((const char *const[]){__VA_ARGS__, NULL})
#define metrics_counter_family(r, name, help, ...)                                               \
    metrics_family_new((r), METRICS_COUNTER, (name), (help), NULL, 0, METRICS_NAMES_(__VA_ARGS__))
#define metrics_gauge_family(r, name, help, ...)                                                 \
    metrics_family_new((r), METRICS_GAUGE, (name), (help), NULL, 0, METRICS_NAMES_(__VA_ARGS__))
#define metrics_histogram_family(r, name, help, bounds, nbounds, ...)                            \
    metrics_family_new((r), METRICS_HISTOGRAM, (name), (help), (bounds), (nbounds),              \
                       METRICS_NAMES_(__VA_ARGS__))

/* The child for one set of label values, created on first use (get-or-create).
 * values: one per label name, in the family's label order, NULL-terminated array of
 * valid UTF-8 strings (escaped on output). NULL when fam is NULL or of another type,
 * the count is wrong, a value is not UTF-8 or the family is full. */
struct metrics_counter *metrics_counter_labelsv(struct metrics_family *fam,
                                                const char *const *values);
struct metrics_gauge *metrics_gauge_labelsv(struct metrics_family *fam, const char *const *values);
struct metrics_histogram *metrics_histogram_labelsv(struct metrics_family *fam,
                                                    const char *const *values);
/* Same with name/value pairs in any order: metrics_counter_labels(fam, "endpoint_id", "0").
 * Every label of the family must be named exactly once. */
struct metrics_counter *metrics_counter_labels_(struct metrics_family *fam, const char *const *kv);
struct metrics_gauge *metrics_gauge_labels_(struct metrics_family *fam, const char *const *kv);
struct metrics_histogram *metrics_histogram_labels_(struct metrics_family *fam,
                                                    const char *const *kv);
#define metrics_counter_labels(fam, ...) metrics_counter_labels_((fam), METRICS_NAMES_(__VA_ARGS__))
#define metrics_gauge_labels(fam, ...) metrics_gauge_labels_((fam), METRICS_NAMES_(__VA_ARGS__))
#define metrics_histogram_labels(fam, ...)                                                       \
    metrics_histogram_labels_((fam), METRICS_NAMES_(__VA_ARGS__))

/* --- updates: lock-free, any thread, NULL is a no-op ------------------------------------ */
void metrics_counter_inc(struct metrics_counter *c);
void metrics_counter_add(struct metrics_counter *c, uint64_t n);
/* Fractional increase (e.g. seconds); negative or NaN is ignored (counters never drop). */
void metrics_counter_add_double(struct metrics_counter *c, double v);
double metrics_counter_value(const struct metrics_counter *c);

void metrics_gauge_set(struct metrics_gauge *g, double v);
void metrics_gauge_add(struct metrics_gauge *g, double v);
void metrics_gauge_inc(struct metrics_gauge *g);
void metrics_gauge_dec(struct metrics_gauge *g);
double metrics_gauge_value(const struct metrics_gauge *g);

/* Counts v in the first bucket whose bound is >= v (le semantics) and adds it to _sum. */
void metrics_histogram_observe(struct metrics_histogram *h, double v);
uint64_t metrics_histogram_count(const struct metrics_histogram *h);
double metrics_histogram_sum(const struct metrics_histogram *h);

/* --- rendering (takes the registry mutex) ---------------------------------------------- */

/* Append the whole exposition to sb: families in registration order, children in
 * creation order, "# HELP" and "# TYPE" before each family's samples. 0, or -E2BIG when
 * sb's cap was hit (sb->overflow set; the content is then incomplete). */
int metrics_render(struct metrics_registry *r, struct strbuf *sb);
/* Render into a fresh heap string (caller frees) of at most cap bytes, e.g. for an HTTP
 * handler answering Content-Type "text/plain; version=0.0.4; charset=utf-8".
 * NULL with errno = E2BIG when the text exceeds cap. len_out may be NULL. */
char *metrics_render_alloc(struct metrics_registry *r, size_t cap, size_t *len_out);

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
