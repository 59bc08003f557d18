#include "common/cfg.h"

#include "common/jval.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Configs are operator-written files, but a broken generator can produce one error per
 * array element: keep the report readable and bounded. */
#define CFG_ERRORS_TEXT_MAX (64 * 1024)
#define CFG_FILE_MAX (16u * 1024 * 1024)
/* Longest rendering of an offending value inside a message. */
#define CFG_VALUE_SHOW_MAX 64

void cfg_errors_init(struct cfg_errors *e, const char *prefix)
{
    memset(e, 0, sizeof(*e));
    e->prefix = xstrdup(prefix ? prefix : "");
}

void cfg_errors_release(struct cfg_errors *e)
{
    if (!e)
        return;
    free(e->prefix);
    free(e->text);
    memset(e, 0, sizeof(*e));
}

void cfg_errors_set_prefix(struct cfg_errors *e, const char *prefix)
{
    char *p = xstrdup(prefix ? prefix : "");
    free(e->prefix);
    e->prefix = p;
}

static void errors_append(struct cfg_errors *e, const char *line, size_t n)
{
    e->text = xrealloc(e->text, e->len + n + 1);
    memcpy(e->text + e->len, line, n);
    e->len += n;
    e->text[e->len] = '\0';
}

static void verror(struct cfg_errors *e, const char *path, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void verror(struct cfg_errors *e, const char *path, const char *fmt, va_list ap)
{
    if (!e)
        return;
    static const char more[] = "(further errors omitted)\n";
    e->count++;
    /* Once the report is full (marked by its last line), only the count grows. */
    if (e->len >= sizeof(more) - 1 &&
        memcmp(e->text + e->len - (sizeof(more) - 1), more, sizeof(more) - 1) == 0)
        return;
    char *msg = NULL;
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    const char *prefix = e->prefix ? e->prefix : "";
    const char *p = path ? path : "";
    const char *dot = (*prefix && *p) ? "." : "";
    const char *colon = (*prefix || *p) ? ": " : "";
    char *raw = xasprintf("%s%s%s%s%s", prefix, dot, p, colon, msg ? msg : "invalid");
    /* Keys come from the file: a newline or escape sequence in one must not forge
     * extra report lines or reach a terminal raw. */
    struct strbuf sb;
    strbuf_init(&sb, 4 * strlen(raw) + 2);
    for (const unsigned char *c = (const unsigned char *)raw; *c; c++) {
        if (*c < 0x20 || *c == 0x7f)
            (void)strbuf_appendf(&sb, "\\x%02x", *c);
        else
            (void)strbuf_putc(&sb, (char)*c);
    }
    (void)strbuf_putc(&sb, '\n');
    free(raw);
    char *line = strbuf_take(&sb);
    size_t n = strlen(line);
    if (e->len + n > CFG_ERRORS_TEXT_MAX) {
        errors_append(e, more, sizeof(more) - 1);
    } else {
        errors_append(e, line, n);
    }
    free(line);
    free(msg);
}

void cfg_error(struct cfg_errors *e, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(e, path, fmt, ap);
    va_end(ap);
}

int cfg_errors_count(const struct cfg_errors *e)
{
    return e ? e->count : 0;
}

const char *cfg_errors_text(const struct cfg_errors *e)
{
    return (e && e->text) ? e->text : "";
}

/* ---- value rendering ---------------------------------------------------------------- */

/* Shortest "%.*g" that reads back as the same double, so bounds and values print as
 * the operator wrote them (0.001, not 0.0010000000000000000208). */
void cfg_fmt_double(double v, char *buf, size_t cap)
{
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v < 0 ? "-inf" : "inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* A short, one-line rendering of a JSON value for an error message. */
static char *render_value(const json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return xstrdup("an object");
    case JSON_ARRAY:
        return xstrdup("an array");
    case JSON_TRUE:
        return xstrdup("true");
    case JSON_FALSE:
        return xstrdup("false");
    case JSON_NULL:
        return xstrdup("null");
    case JSON_INTEGER:
        snprintf(num, sizeof(num), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return xstrdup(num);
    case JSON_REAL:
        cfg_fmt_double(json_real_value(v), num, sizeof(num));
        return xstrdup(num);
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t len = json_string_length(v);
        bool cut = false;
        if (len > CFG_VALUE_SHOW_MAX) {
            len = CFG_VALUE_SHOW_MAX;
            cut = true;
            /* Do not split a UTF-8 sequence. */
            while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
                len--;
        }
        char *part = xstrndup(s, len);
        struct strbuf sb;
        strbuf_init(&sb, 8 * CFG_VALUE_SHOW_MAX);
        (void)strbuf_put_json_string(&sb, part);
        if (cut)
            (void)strbuf_puts(&sb, "...");
        free(part);
        return strbuf_take(&sb);
    }
    }
    return xstrdup("?");
}

/* ---- lookup ------------------------------------------------------------------------- */

/* Walk a dot path. Returns the value (NULL when missing or null). When an intermediate
 * component exists but is not an object, returns NULL and sets *bad to it and
 * *bad_len to the length of the path prefix naming it. */
static json_t *walk(json_t *obj, const char *path, json_t **bad, size_t *bad_len)
{
    if (bad)
        *bad = NULL;
    if (!obj || json_is_null(obj))
        return NULL;
    if (!path || !*path)
        return obj;
    json_t *cur = obj;
    const char *p = path;
    for (;;) {
        if (!json_is_object(cur)) {
            if (bad) {
                *bad = cur;
                *bad_len = p > path ? (size_t)(p - path - 1) : 0;
            }
            return NULL;
        }
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        json_t *next = json_object_getn(cur, p, n);
        if (!next || json_is_null(next))
            return NULL;
        if (!dot)
            return next;
        cur = next;
        p = dot + 1;
    }
}

json_t *cfg_lookup(json_t *obj, const char *path)
{
    return walk(obj, path, NULL, NULL);
}

json_t *cfg_get_value(json_t *obj, const char *path, struct cfg_errors *e)
{
    json_t *bad = NULL;
    size_t bad_len = 0;
    json_t *v = walk(obj, path, &bad, &bad_len);
    if (!v && bad) {
        char *where = xstrndup(path, bad_len);
        char *shown = render_value(bad);
        cfg_error(e, where, "must be an object, got %s", shown);
        free(shown);
        free(where);
    }
    return v;
}

static void type_error(struct cfg_errors *e, const char *path, const char *rule, const json_t *v)
{
    char *shown = render_value(v);
    cfg_error(e, path, "%s, got %s", rule, shown);
    free(shown);
}

/* ---- readers: the configuration's wording of jval's verdicts (common/jval.h) ---------- */

bool cfg_read_int(json_t *v, const char *path, int64_t min, int64_t max, int64_t *out,
                  struct cfg_errors *e)
{
    if (jval_int(v, min, max, 0, out) == JVAL_OK)
        return true;
    char rule[128];
    snprintf(rule, sizeof(rule), "must be an integer in [%" PRId64 ", %" PRId64 "]", min, max);
    type_error(e, path, rule, v);
    return false;
}

bool cfg_read_double(json_t *v, const char *path, double min, double max, double *out,
                     struct cfg_errors *e)
{
    if (jval_double(v, min, max, out) == JVAL_OK)
        return true;
    char lo[40], hi[40], rule[128];
    cfg_fmt_double(min, lo, sizeof(lo));
    cfg_fmt_double(max, hi, sizeof(hi));
    snprintf(rule, sizeof(rule), "must be a number in [%s, %s]", lo, hi);
    type_error(e, path, rule, v);
    return false;
}

bool cfg_read_bool(json_t *v, const char *path, bool *out, struct cfg_errors *e)
{
    if (jval_bool(v, out) == JVAL_OK)
        return true;
    type_error(e, path, "must be true or false", v);
    return false;
}

/* The error of a failed string read (JVAL_TYPE, JVAL_NUL or JVAL_NOMATCH). */
static void string_error(struct cfg_errors *e, const char *path, enum jval_rc rc, const char *rule,
                         const json_t *v)
{
    if (rc == JVAL_NUL)
        cfg_error(e, path, "must not contain NUL characters");
    else
        type_error(e, path, rule, v);
}

bool cfg_read_string(json_t *v, const char *path, const char **out, struct cfg_errors *e)
{
    enum jval_rc rc = jval_string(v, SIZE_MAX, out, NULL);
    if (rc == JVAL_OK)
        return true;
    string_error(e, path, rc, "must be a string", v);
    return false;
}

bool cfg_read_enum(json_t *v, const char *path, const char *const *allowed, int *index,
                   struct cfg_errors *e)
{
    enum jval_rc rc = jval_enum(v, allowed, index);
    if (rc == JVAL_OK)
        return true;
    struct strbuf rule;
    strbuf_init(&rule, 4096);
    (void)strbuf_puts(&rule, "must be one of ");
    for (size_t i = 0; allowed && allowed[i]; i++) {
        if (i)
            (void)strbuf_puts(&rule, ", ");
        (void)strbuf_put_json_string(&rule, allowed[i]);
    }
    if (rule.overflow) {
        strbuf_reset(&rule);
        (void)strbuf_puts(&rule, "must be one of the allowed values");
    }
    string_error(e, path, rc, strbuf_str(&rule), v);
    strbuf_release(&rule);
    return false;
}

/* ---- getters: lookup, then a reader ------------------------------------------------- */

int64_t cfg_get_int(json_t *obj, const char *path, int64_t def, int64_t min, int64_t max,
                    struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    int64_t x;
    return v && cfg_read_int(v, path, min, max, &x, e) ? x : def;
}

double cfg_get_double(json_t *obj, const char *path, double def, double min, double max,
                      struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    double d;
    return v && cfg_read_double(v, path, min, max, &d, e) ? d : def;
}

bool cfg_get_bool(json_t *obj, const char *path, bool def, struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    bool b;
    return v && cfg_read_bool(v, path, &b, e) ? b : def;
}

const char *cfg_get_string(json_t *obj, const char *path, const char *def, struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    const char *s;
    return v && cfg_read_string(v, path, &s, e) ? s : def;
}

int cfg_get_enum_index(json_t *obj, const char *path, int def, const char *const *allowed,
                       struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    int i;
    return v && cfg_read_enum(v, path, allowed, &i, e) ? i : def;
}

const char *cfg_get_enum(json_t *obj, const char *path, const char *def, const char *const *allowed,
                         struct cfg_errors *e)
{
    int i = cfg_get_enum_index(obj, path, -1, allowed, e);
    return i >= 0 ? allowed[i] : def;
}

bool cfg_read_object(json_t *v, const char *path, struct cfg_errors *e)
{
    if (json_is_object(v))
        return true;
    type_error(e, path, "must be an object", v);
    return false;
}

bool cfg_read_array(json_t *v, const char *path, struct cfg_errors *e)
{
    if (jval_array(v, SIZE_MAX) == JVAL_OK)
        return true;
    type_error(e, path, "must be an array", v);
    return false;
}

json_t *cfg_get_object(json_t *obj, const char *path, struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    return v && cfg_read_object(v, path, e) ? v : NULL;
}

json_t *cfg_get_array(json_t *obj, const char *path, struct cfg_errors *e)
{
    json_t *v = cfg_get_value(obj, path, e);
    return v && cfg_read_array(v, path, e) ? v : NULL;
}

/* ---- loading ------------------------------------------------------------------------ */

json_t *cfg_load_buffer(const char *data, size_t len, struct cfg_errors *e)
{
    if (len > CFG_FILE_MAX) {
        cfg_error(e, "", "config is larger than 16 MiB (%zu bytes)", len);
        return NULL;
    }
    json_error_t jerr;
    /* DECODE_ANY so a top-level array or scalar gets our clearer message below.
     * Duplicate keys are accepted (last wins), as upstream's Python loader does. */
    json_t *root = json_loadb(data ? data : "", data ? len : 0, JSON_DECODE_ANY, &jerr);
    if (!root) {
        cfg_error(e, "", "syntax error at line %d, column %d: %s", jerr.line, jerr.column,
                  jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        char *shown = render_value(root);
        cfg_error(e, "", "top level must be a JSON object, got %s", shown);
        free(shown);
        json_decref(root);
        return NULL;
    }
    return root;
}

json_t *cfg_load_file(const char *path, struct cfg_errors *e)
{
    size_t len = 0;
    char *data = util_read_file(path, CFG_FILE_MAX, &len);
    if (!data) {
        int err = errno;
        if (err == EFBIG)
            cfg_error(e, "", "%s: file is larger than 16 MiB", path);
        else
            cfg_error(e, "", "%s: cannot read: %s", path, strerror(err));
        return NULL;
    }
    struct cfg_errors sub;
    cfg_errors_init(&sub, "");
    json_t *root = cfg_load_buffer(data, len, &sub);
    free(data);
    if (!root) {
        /* Name the file in front of the parser's message. */
        const char *t = cfg_errors_text(&sub);
        size_t n = strlen(t);
        if (n && t[n - 1] == '\n')
            n--;
        cfg_error(e, "", "%s: %.*s", path, (int)n, t);
    }
    cfg_errors_release(&sub);
    return root;
}

int cfg_read_secret(const char *path, char **out)
{
    size_t len = 0;
    char *text = util_read_file(path, CFG_SECRET_MAX, &len);
    if (!text)
        return -errno;
    size_t n = strcspn(text, "\r\n");
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    int rc = 0;
    if (n == 0)
        rc = -EINVAL;
    else
        *out = xstrndup(text, n);
    /* The file held a secret: do not leave it in freed heap memory. */
    explicit_bzero(text, len);
    free(text);
    return rc;
}
