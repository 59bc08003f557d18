/* metrics: exact exposition text, format rules, escaping and concurrent updates. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/metrics.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a checker for the text exposition format 0.0.4 ------------------------------------
 * Enforces what scrapers (and promtool) reject: TYPE before samples and at most once,
 * sample names belonging to the current family, label syntax and escapes, values that
 * parse as floats, no duplicate series, histogram buckets with increasing le ending at
 * +Inf, cumulative counts and _count equal to the +Inf bucket. Returns NULL when fine,
 * else a static description of the first problem. */

#define CHK_MAX_SERIES 512

struct checker {
    char family[128];
    char type[16];
    char series[CHK_MAX_SERIES][256];
    size_t nseries;
    char types_seen[64][128];
    size_t ntypes;
    /* histogram state for the current label set (without le) */
    char hist_labels[256];
    double last_le;
    double last_bucket;
    bool saw_inf;
    double inf_count;
};

static char chk_err[256];

static const char *chk_fail(int lineno, const char *what)
{
    snprintf(chk_err, sizeof(chk_err), "line %d: %s", lineno, what);
    return chk_err;
}

static bool name_char(char c, bool first, bool colon_ok)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_')
        return true;
    if (colon_ok && c == ':')
        return true;
    return !first && c >= '0' && c <= '9';
}

static bool parse_value(const char *s, double *out)
{
    if (strcmp(s, "+Inf") == 0) {
        *out = INFINITY;
        return true;
    }
    if (strcmp(s, "-Inf") == 0) {
        *out = -INFINITY;
        return true;
    }
    if (strcmp(s, "NaN") == 0) {
        *out = NAN;
        return true;
    }
    return util_parse_double(s, -INFINITY, INFINITY, out) == 0;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static const char *check_line(struct checker *c, char *line, int lineno)
{
    if (line[0] == '#') {
        char name[128], rest[64];
        if (strncmp(line, "# HELP ", 7) == 0) {
            if (sscanf(line + 7, "%127s", name) != 1)
                return chk_fail(lineno, "HELP without name");
            /* HELP text may only contain \\ and \n escapes. */
            for (const char *p = strchr(line + 7, ' '); p && *p; p++) {
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != 'n')
                        return chk_fail(lineno, "bad escape in HELP");
                    p++;
                }
            }
            return NULL;
        }
        if (strncmp(line, "# TYPE ", 7) == 0) {
            if (sscanf(line + 7, "%127s %63s", name, rest) != 2)
                return chk_fail(lineno, "TYPE needs name and type");
            if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                strcmp(rest, "summary") && strcmp(rest, "untyped"))
                return chk_fail(lineno, "unknown type");
            for (size_t i = 0; i < c->ntypes; i++)
                if (strcmp(c->types_seen[i], name) == 0)
                    return chk_fail(lineno, "second TYPE for a family");
            if (c->ntypes < ARRAY_LEN(c->types_seen))
                snprintf(c->types_seen[c->ntypes++], sizeof(c->types_seen[0]), "%s", name);
            snprintf(c->family, sizeof(c->family), "%s", name);
            snprintf(c->type, sizeof(c->type), "%.15s", rest);
            c->hist_labels[0] = '\0';
            c->saw_inf = true; /* nothing pending */
            return NULL;
        }
        return NULL; /* other comments are allowed */
    }
    /* name */
    char *p = line;
    if (!name_char(*p, true, true))
        return chk_fail(lineno, "bad metric name start");
    while (name_char(*p, false, true))
        p++;
    char name[128];
    snprintf(name, sizeof(name), "%.*s", (int)(p - line), line);
    /* labels */
    char labels_wo_le[256] = "";
    size_t lw = 0;
    char le[64] = "";
    bool has_le = false;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            char *ln = p;
            if (!name_char(*p, true, false))
                return chk_fail(lineno, "bad label name");
            while (name_char(*p, false, false))
                p++;
            size_t lnlen = (size_t)(p - ln);
            if (*p++ != '=' || *p++ != '"')
                return chk_fail(lineno, "label needs =\"");
            char val[256];
            size_t vl = 0;
            while (*p != '"') {
                if (!*p)
                    return chk_fail(lineno, "unterminated label value");
                if (*p == '\\') {
                    if (p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                        return chk_fail(lineno, "bad escape in label value");
                    if (vl < sizeof(val) - 2) {
                        val[vl++] = p[0];
                        val[vl++] = p[1];
                    }
                    p += 2;
                    continue;
                }
                if (*p == '\n')
                    return chk_fail(lineno, "raw newline in label value");
                if (vl < sizeof(val) - 1)
                    val[vl++] = *p;
                p++;
            }
            val[vl] = '\0';
            p++;
            if (lnlen == 2 && strncmp(ln, "le", 2) == 0) {
                has_le = true;
                snprintf(le, sizeof(le), "%.63s", val);
            } else {
                int w = snprintf(labels_wo_le + lw, sizeof(labels_wo_le) - lw, "%.*s=%s;",
                                 (int)lnlen, ln, val);
                if (w > 0)
                    lw += (size_t)w;
            }
            if (*p == ',')
                p++;
            else if (*p != '}')
                return chk_fail(lineno, "expected , or }");
        }
        p++;
    }
    if (*p++ != ' ')
        return chk_fail(lineno, "expected one space before value");
    double v;
    if (!parse_value(p, &v))
        return chk_fail(lineno, "value is not a float");

    /* The sample must belong to the family declared by the last TYPE. */
    if (!c->family[0])
        return chk_fail(lineno, "sample before any TYPE");
    bool is_hist = strcmp(c->type, "histogram") == 0;
    if (is_hist) {
        size_t fl = strlen(c->family);
        if (strncmp(name, c->family, fl) != 0 ||
            (strcmp(name + fl, "_bucket") && strcmp(name + fl, "_sum") &&
             strcmp(name + fl, "_count")))
            return chk_fail(lineno, "histogram sample with foreign name");
        if (ends_with(name, "_bucket")) {
            if (!has_le)
                return chk_fail(lineno, "bucket without le");
            double lev;
            if (!parse_value(le, &lev))
                return chk_fail(lineno, "le is not a float");
            if (strcmp(c->hist_labels, labels_wo_le) != 0 || c->saw_inf) {
                if (!c->saw_inf)
                    return chk_fail(lineno, "bucket series without +Inf");
                snprintf(c->hist_labels, sizeof(c->hist_labels), "%s", labels_wo_le);
                c->last_le = -INFINITY;
                c->last_bucket = 0;
                c->saw_inf = false;
                if (lev == -INFINITY)
                    return chk_fail(lineno, "le -Inf");
            } else if (!(lev > c->last_le)) {
                return chk_fail(lineno, "le not increasing");
            }
            if (v < c->last_bucket)
                return chk_fail(lineno, "bucket counts not cumulative");
            c->last_le = lev;
            c->last_bucket = v;
            if (isinf(lev) && lev > 0) {
                c->saw_inf = true;
                c->inf_count = v;
            }
        } else {
            if (has_le)
                return chk_fail(lineno, "le on _sum/_count");
            if (!c->saw_inf || strcmp(c->hist_labels, labels_wo_le) != 0)
                return chk_fail(lineno, "_sum/_count before complete buckets");
            if (ends_with(name, "_count") && v != c->inf_count)
                return chk_fail(lineno, "_count differs from +Inf bucket");
        }
    } else {
        if (strcmp(name, c->family) != 0)
            return chk_fail(lineno, "sample name differs from family");
        if (has_le)
            return chk_fail(lineno, "le label outside histogram");
        if (strcmp(c->type, "counter") == 0 && (v < 0 || isnan(v)))
            return chk_fail(lineno, "negative counter");
    }
    /* Duplicate series. */
    char key[256];
    snprintf(key, sizeof(key), "%s|%s|%s", name, labels_wo_le, le);
    for (size_t i = 0; i < c->nseries; i++)
        if (strcmp(c->series[i], key) == 0)
            return chk_fail(lineno, "duplicate series");
    if (c->nseries < CHK_MAX_SERIES)
        snprintf(c->series[c->nseries++], sizeof(c->series[0]), "%s", key);
    return NULL;
}

static const char *check_exposition(const char *text)
{
    static struct checker c;
    memset(&c, 0, sizeof(c));
    c.saw_inf = true;
    size_t n = strlen(text);
    if (n && text[n - 1] != '\n')
        return "missing final newline";
    char *copy = xstrdup(text);
    char *save = copy;
    int lineno = 0;
    const char *err = NULL;
    for (char *line = copy; *line && !err;) {
        char *nl = strchr(line, '\n');
        *nl = '\0';
        lineno++;
        if (!*line)
            err = chk_fail(lineno, "empty line");
        else
            err = check_line(&c, line, lineno);
        line = nl + 1;
    }
    if (!err && !c.saw_inf)
        err = "histogram without +Inf bucket at end";
    free(save);
    return err;
}

static char *render(struct metrics_registry *r)
{
    char *t = metrics_render_alloc(r, 1 << 20, NULL);
    assert_non_null(t);
    const char *err = check_exposition(t);
    if (err)
        fail_msg("exposition check: %s\n%s", err, t);
    return t;
}

/* The checker itself must reject broken text, or the tests below prove nothing. */
static void test_checker_rejects(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "x 1\n",                                               /* no TYPE */
        "# TYPE x counter\ny 1\n",                             /* foreign name */
        "# TYPE x counter\nx{a=\"b} 1\n",                       /* unterminated */
        "# TYPE x counter\nx{a=\"\\t\"} 1\n",                  /* bad escape */
        "# TYPE x counter\nx abc\n",                           /* value */
        "# TYPE x counter\nx 1\nx 2\n",                        /* duplicate */
        "# TYPE x counter\nx -1\n",                            /* negative counter */
        "# TYPE x counter\n# TYPE x counter\n",                /* two TYPEs */
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
        "h_sum 1\nh_count 1\n",                                /* not cumulative */
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", /* no +Inf */
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n", /* count */
        "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n"
        "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",      /* le order */
        "# TYPE x counter\nx{a=\"b\"c=\"d\"} 1\n",                /* missing comma */
        "# TYPE x counter\nx 1",                               /* no final newline */
    };
    assert_null(check_exposition("# HELP x a\\nb\n# TYPE x counter\nx{a=\"\\\"\"} 1\n"));
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        print_message("bad %zu\n", i);
        assert_non_null(check_exposition(bad[i]));
    }
}

static void test_counter_gauge_exact(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    struct metrics_counter *c = metrics_counter_new(r, "motor_restarts_total", "Engine restarts.");
    struct metrics_gauge *g = metrics_gauge_new(r, "motor_engines", "Engines running.");
    assert_non_null(c);
    assert_non_null(g);
    char *t = render(r);
    assert_string_equal(t, "# HELP motor_restarts_total Engine restarts.\n"
                           "# TYPE motor_restarts_total counter\n"
                           "motor_restarts_total 0\n"
                           "# HELP motor_engines Engines running.\n"
                           "# TYPE motor_engines gauge\n"
                           "motor_engines 0\n");
    free(t);

    metrics_counter_inc(c);
    metrics_counter_add(c, 41);
    metrics_gauge_set(g, 3);
    metrics_gauge_inc(g);
    metrics_gauge_dec(g);
    metrics_gauge_dec(g);
    metrics_gauge_add(g, 0.25);
    assert_true(metrics_counter_value(c) == 42);
    assert_true(metrics_gauge_value(g) == 2.25);
    t = render(r);
    assert_string_equal(t, "# HELP motor_restarts_total Engine restarts.\n"
                           "# TYPE motor_restarts_total counter\n"
                           "motor_restarts_total 42\n"
                           "# HELP motor_engines Engines running.\n"
                           "# TYPE motor_engines gauge\n"
                           "motor_engines 2.25\n");
    free(t);

    /* Fractional counter increments; negative and NaN are ignored. */
    metrics_counter_add_double(c, 0.5);
    metrics_counter_add_double(c, -7);
    metrics_counter_add_double(c, NAN);
    assert_true(metrics_counter_value(c) == 42.5);
    /* Gauge special values render as Prometheus spells them. */
    metrics_gauge_set(g, -INFINITY);
    t = render(r);
    assert_non_null(strstr(t, "\nmotor_restarts_total 42.5\n"));
    assert_non_null(strstr(t, "\nmotor_engines -Inf\n"));
    free(t);
    metrics_gauge_set(g, NAN);
    t = render(r);
    assert_non_null(strstr(t, "\nmotor_engines NaN\n"));
    free(t);
    metrics_gauge_set(g, 1e20);
    t = render(r);
    assert_non_null(strstr(t, "\nmotor_engines 1e+20\n"));
    free(t);
    metrics_registry_free(r);
}

static void test_labels_exact(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    struct metrics_family *f =
        metrics_counter_family(r, "motor_requests_total", "Requests.", "endpoint_id", "code");
    assert_non_null(f);
    struct metrics_counter *a = metrics_counter_labels(f, "endpoint_id", "0", "code", "200");
    /* Pairs in any order name the same child. */
    struct metrics_counter *a2 = metrics_counter_labels(f, "code", "200", "endpoint_id", "0");
    static const char *const vals[] = {"0", "200", NULL};
    struct metrics_counter *a3 = metrics_counter_labelsv(f, vals);
    assert_non_null(a);
    assert_ptr_equal(a, a2);
    assert_ptr_equal(a, a3);
    struct metrics_counter *b = metrics_counter_labels(f, "endpoint_id", "1", "code", "503");
    assert_non_null(b);
    assert_ptr_not_equal(a, b);
    metrics_counter_add(a, 3);
    metrics_counter_inc(b);

    /* Mismatches: missing, extra, unknown, repeated label; wrong family type. */
    assert_null(metrics_counter_labels(f, "endpoint_id", "0"));
    assert_null(metrics_counter_labels(f, "endpoint_id", "0", "code", "1", "x", "y"));
    assert_null(metrics_counter_labels(f, "endpoint_id", "0", "nope", "1"));
    assert_null(metrics_counter_labels(f, "endpoint_id", "0", "endpoint_id", "1"));
    assert_null(metrics_gauge_labels(f, "endpoint_id", "0", "code", "200"));
    static const char *const short_vals[] = {"0", NULL};
    assert_null(metrics_counter_labelsv(f, short_vals));

    struct metrics_family *gf = metrics_gauge_family(r, "motor_queue", "Queue.", "role");
    metrics_gauge_set(metrics_gauge_labels(gf, "role", "prefill"), 7);
    /* A family without children renders HELP and TYPE only. */
    assert_non_null(metrics_gauge_family(r, "motor_empty", "Nothing yet.", "x"));

    char *t = render(r);
    assert_string_equal(t, "# HELP motor_requests_total Requests.\n"
                           "# TYPE motor_requests_total counter\n"
                           "motor_requests_total{endpoint_id=\"0\",code=\"200\"} 3\n"
                           "motor_requests_total{endpoint_id=\"1\",code=\"503\"} 1\n"
                           "# HELP motor_queue Queue.\n"
                           "# TYPE motor_queue gauge\n"
                           "motor_queue{role=\"prefill\"} 7\n"
                           "# HELP motor_empty Nothing yet.\n"
                           "# TYPE motor_empty gauge\n");
    free(t);
    metrics_registry_free(r);
}

static void test_histogram_exact(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    static const double bounds[] = {0.1, 1, 2.5};
    struct metrics_histogram *h = metrics_histogram_new(r, "lat_seconds", "Latency.", bounds, 3);
    assert_non_null(h);
    metrics_histogram_observe(h, 0.05);
    metrics_histogram_observe(h, 0.1); /* le is inclusive */
    metrics_histogram_observe(h, 0.5);
    metrics_histogram_observe(h, 3);
    metrics_histogram_observe(h, 100);
    assert_int_equal(metrics_histogram_count(h), 5);
    assert_true(fabs(metrics_histogram_sum(h) - 103.65) < 1e-9);

    struct metrics_family *f = metrics_histogram_family(r, "ttft_seconds", "TTFT.", bounds, 3,
                                                        "endpoint_id");
    assert_non_null(f);
    struct metrics_histogram *h0 = metrics_histogram_labels(f, "endpoint_id", "0");
    metrics_histogram_observe(h0, 2);
    metrics_histogram_observe(h0, 2);
    metrics_histogram_labels(f, "endpoint_id", "1");

    char *t = render(r);
    assert_string_equal(t, "# HELP lat_seconds Latency.\n"
                           "# TYPE lat_seconds histogram\n"
                           "lat_seconds_bucket{le=\"0.1\"} 2\n"
                           "lat_seconds_bucket{le=\"1\"} 3\n"
                           "lat_seconds_bucket{le=\"2.5\"} 3\n"
                           "lat_seconds_bucket{le=\"+Inf\"} 5\n"
                           "lat_seconds_sum 103.65\n"
                           "lat_seconds_count 5\n"
                           "# HELP ttft_seconds TTFT.\n"
                           "# TYPE ttft_seconds histogram\n"
                           "ttft_seconds_bucket{endpoint_id=\"0\",le=\"0.1\"} 0\n"
                           "ttft_seconds_bucket{endpoint_id=\"0\",le=\"1\"} 0\n"
                           "ttft_seconds_bucket{endpoint_id=\"0\",le=\"2.5\"} 2\n"
                           "ttft_seconds_bucket{endpoint_id=\"0\",le=\"+Inf\"} 2\n"
                           "ttft_seconds_sum{endpoint_id=\"0\"} 4\n"
                           "ttft_seconds_count{endpoint_id=\"0\"} 2\n"
                           "ttft_seconds_bucket{endpoint_id=\"1\",le=\"0.1\"} 0\n"
                           "ttft_seconds_bucket{endpoint_id=\"1\",le=\"1\"} 0\n"
                           "ttft_seconds_bucket{endpoint_id=\"1\",le=\"2.5\"} 0\n"
                           "ttft_seconds_bucket{endpoint_id=\"1\",le=\"+Inf\"} 0\n"
                           "ttft_seconds_sum{endpoint_id=\"1\"} 0\n"
                           "ttft_seconds_count{endpoint_id=\"1\"} 0\n");
    free(t);
    metrics_registry_free(r);
}

static void test_histogram_bounds(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    /* Defaults. */
    struct metrics_histogram *h = metrics_histogram_new(r, "d", "", NULL, 0);
    assert_non_null(h);
    char *t = render(r);
    assert_non_null(strstr(t, "d_bucket{le=\"0.005\"} 0\nd_bucket{le=\"0.01\"} 0\n"));
    assert_non_null(strstr(t, "d_bucket{le=\"10\"} 0\nd_bucket{le=\"+Inf\"} 0\n"));
    free(t);
    /* A trailing +Inf is accepted and not doubled. */
    static const double with_inf[] = {1, INFINITY};
    assert_non_null(metrics_histogram_new(r, "e", "", with_inf, 2));
    t = render(r);
    assert_non_null(strstr(t, "e_bucket{le=\"1\"} 0\ne_bucket{le=\"+Inf\"} 0\ne_sum 0\n"));
    free(t);
    /* Rejected: not increasing, duplicate, NaN, le as a label. */
    static const double dec[] = {2, 1};
    static const double dup[] = {1, 1};
    static const double nan_b[] = {1, NAN};
    assert_null(metrics_histogram_new(r, "f1", "", dec, 2));
    assert_null(metrics_histogram_new(r, "f2", "", dup, 2));
    assert_null(metrics_histogram_new(r, "f3", "", nan_b, 2));
    assert_null(metrics_histogram_family(r, "f4", "", NULL, 0, "le"));
    /* NaN observations land in +Inf. */
    metrics_histogram_observe(h, NAN);
    assert_int_equal(metrics_histogram_count(h), 1);
    metrics_registry_free(r);
}

static void test_names_validated(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    assert_non_null(metrics_counter_new(r, "ok_name:sub_total", ""));
    assert_null(metrics_counter_new(r, "ok_name:sub_total", "")); /* duplicate */
    assert_null(metrics_gauge_new(r, "ok_name:sub_total", ""));   /* duplicate across types */
    assert_null(metrics_counter_new(r, "", ""));
    assert_null(metrics_counter_new(r, NULL, ""));
    assert_null(metrics_counter_new(r, "9lives", ""));
    assert_null(metrics_counter_new(r, "has-dash", ""));
    assert_null(metrics_counter_new(r, "has space", ""));
    assert_null(metrics_counter_family(r, "a1", "", "__reserved"));
    assert_null(metrics_counter_family(r, "a2", "", "has:colon"));
    assert_null(metrics_counter_family(r, "a3", "", "dup", "dup"));
    assert_null(metrics_counter_family(r, "a4", "", "1x"));
    assert_null(metrics_counter_family(r, "a5", "", "a", "b", "c", "d", "e", "f", "g", "h", "i"));
    assert_non_null(metrics_counter_family(r, "a6", "", "a", "b", "c", "d", "e", "f", "g", "h"));
    /* NULL everywhere is harmless. */
    metrics_counter_inc(NULL);
    metrics_counter_add(NULL, 3);
    metrics_counter_add_double(NULL, 1);
    metrics_gauge_set(NULL, 1);
    metrics_gauge_inc(NULL);
    metrics_histogram_observe(NULL, 1);
    assert_null(metrics_counter_labels(NULL, "a", "b"));
    assert_true(metrics_counter_value(NULL) == 0);
    metrics_registry_free(r);
    metrics_registry_free(NULL);
}

static void test_escaping(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    struct metrics_family *f =
        metrics_counter_family(r, "esc_total", "Help with \\ backslash\nand \"quotes\".", "v");
    metrics_counter_inc(metrics_counter_labels(f, "v", "a\\b\"c\nd"));
    metrics_counter_inc(metrics_counter_labels(f, "v", "ünïcødé"));
    /* Not UTF-8: refused (scrapers would reject the whole page). */
    assert_null(metrics_counter_labels(f, "v", "\xff\xfe"));
    assert_null(metrics_counter_labels(f, "v", "\xc0\xaf")); /* overlong '/' */
    char *t = render(r);
    assert_string_equal(t, "# HELP esc_total Help with \\\\ backslash\\nand \"quotes\".\n"
                           "# TYPE esc_total counter\n"
                           "esc_total{v=\"a\\\\b\\\"c\\nd\"} 1\n"
                           "esc_total{v=\"ünïcødé\"} 1\n");
    free(t);
    metrics_registry_free(r);
}

static void test_render_cap(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    struct metrics_family *f = metrics_gauge_family(r, "g", "", "i");
    char v[16];
    for (int i = 0; i < 100; i++) {
        snprintf(v, sizeof(v), "%d", i);
        metrics_gauge_set(metrics_gauge_labels(f, "i", v), i);
    }
    size_t len = 0;
    char *full = metrics_render_alloc(r, 1 << 20, &len);
    assert_non_null(full);
    assert_int_equal(len, strlen(full));
    errno = 0;
    assert_null(metrics_render_alloc(r, len - 1, NULL));
    assert_int_equal(errno, E2BIG);
    char *exact = metrics_render_alloc(r, len, NULL);
    assert_non_null(exact);
    assert_string_equal(exact, full);

    struct strbuf sb;
    strbuf_init(&sb, 100);
    assert_int_equal(metrics_render(r, &sb), -E2BIG);
    assert_true(sb.overflow);
    assert_true(sb.len <= 100);
    strbuf_release(&sb);
    free(exact);
    free(full);
    metrics_registry_free(r);
}

static void test_children_capped(void **state)
{
    (void)state;
    struct metrics_registry *r = metrics_registry_new();
    struct metrics_family *f = metrics_counter_family(r, "c_total", "", "id");
    char v[16];
    for (int i = 0; i < METRICS_MAX_CHILDREN; i++) {
        snprintf(v, sizeof(v), "%d", i);
        assert_non_null(metrics_counter_labels(f, "id", v));
    }
    assert_null(metrics_counter_labels(f, "id", "one-too-many"));
    /* Existing children are still found. */
    assert_non_null(metrics_counter_labels(f, "id", "7"));
    metrics_registry_free(r);
}

/* ---- concurrency ---- */

#define THREADS 4
#define ITERS 100000

struct shared {
    struct metrics_registry *r;
    struct metrics_counter *c;
    struct metrics_family *fam;
    struct metrics_gauge *g;
    struct metrics_histogram *h;
    _Atomic int done;
};

static void *worker(void *arg)
{
    struct shared *s = arg;
    /* Every thread resolves the same child concurrently: must get one child. */
    struct metrics_counter *lc = metrics_counter_labels(s->fam, "endpoint_id", "0");
    for (int i = 0; i < ITERS; i++) {
        metrics_counter_inc(s->c);
        metrics_counter_add_double(s->c, 0.5);
        metrics_counter_inc(lc);
        metrics_gauge_inc(s->g);
        metrics_histogram_observe(s->h, (double)(i % 4)); /* 0,1,2,3: sums exactly */
    }
    return NULL;
}

static void *scraper(void *arg)
{
    struct shared *s = arg;
    while (!s->done) {
        char *t = metrics_render_alloc(s->r, 1 << 20, NULL);
        free(t);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    struct shared s = {0};
    s.r = metrics_registry_new();
    s.c = metrics_counter_new(s.r, "ops_total", "");
    s.fam = metrics_counter_family(s.r, "ep_total", "", "endpoint_id");
    s.g = metrics_gauge_new(s.r, "inflight", "");
    static const double bounds[] = {0.5, 1.5, 2.5};
    s.h = metrics_histogram_new(s.r, "h", "", bounds, 3);
    pthread_t th[THREADS], scr;
    assert_int_equal(pthread_create(&scr, NULL, scraper, &s), 0);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, worker, &s), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    s.done = 1;
    pthread_join(scr, NULL);

    const double n = (double)THREADS * ITERS;
    assert_true(metrics_counter_value(s.c) == n * 1.5);
    assert_true(metrics_counter_value(metrics_counter_labels(s.fam, "endpoint_id", "0")) == n);
    assert_true(metrics_gauge_value(s.g) == n);
    assert_int_equal(metrics_histogram_count(s.h), (uint64_t)n);
    assert_true(metrics_histogram_sum(s.h) == n / 4 * (0 + 1 + 2 + 3));
    char *t = render(s.r);
    assert_non_null(strstr(t, "\nops_total 600000\n"));
    assert_non_null(strstr(t, "\nep_total{endpoint_id=\"0\"} 400000\n"));
    assert_non_null(strstr(t, "\nh_bucket{le=\"0.5\"} 100000\nh_bucket{le=\"1.5\"} 200000\n"
                              "h_bucket{le=\"2.5\"} 300000\nh_bucket{le=\"+Inf\"} 400000\n"
                              "h_sum 600000\nh_count 400000\n"));
    free(t);
    metrics_registry_free(s.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_rejects),
        cmocka_unit_test(test_counter_gauge_exact),
        cmocka_unit_test(test_labels_exact),
        cmocka_unit_test(test_histogram_exact),
        cmocka_unit_test(test_histogram_bounds),
        cmocka_unit_test(test_names_validated),
        cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_render_cap),
        cmocka_unit_test(test_children_capped),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
