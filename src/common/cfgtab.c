/* cfgtab — configuration keys as table rows (see cfgtab.h). */
#include "common/cfgtab.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cfgtab_skip[] = "skip";

/* Longest key path built from nested rows. */
#define CFGTAB_PATH_MAX 256

/* A row of a GROUP's table is read, dumped and diffed at the group's place: the group's
 * paths, its base offset and its reload class. */
struct where {
    const char *out; /* dump path prefix ("" at the top) */
    size_t off;      /* offset of the sub-struct in the table's base */
    unsigned live;   /* CFGTAB_LIVE of the group, or of the row itself at the top */
};

static void join(char *buf, const char *prefix, const char *path)
{
    if (!*prefix)
        snprintf(buf, CFGTAB_PATH_MAX, "%s", path);
    else if (!*path)
        snprintf(buf, CFGTAB_PATH_MAX, "%s", prefix);
    else
        snprintf(buf, CFGTAB_PATH_MAX, "%s.%s", prefix, path);
}

static void *field(void *base, const struct cfgtab_row *r)
{
    return (char *)base + r->off;
}

static const void *cfield(const void *base, const struct cfgtab_row *r)
{
    return (const char *)base + r->off;
}

static int64_t scale_of(const struct cfgtab_row *r)
{
    return r->scale ? r->scale : 1;
}

/* A group's rows take its class, except those marked RESTART (a live TLS block's files
 * are reloaded, its switch between plain and TLS is not). */
static unsigned live_of(const struct cfgtab_row *r, const struct where *w)
{
    if (w->live == UINT32_MAX)
        return r->flags & CFGTAB_LIVE;
    return (r->flags & CFGTAB_RESTART) ? 0 : w->live;
}

/* ---- given ---------------------------------------------------------------------------- */

static void given_add(struct cfgtab_ctx *ctx, size_t off)
{
    if (cfgtab_given(ctx, off))
        return;
    if (ctx->n_given == ctx->cap_given) {
        ctx->cap_given = ctx->cap_given ? 2 * ctx->cap_given : 32;
        ctx->given = xrealloc(ctx->given, ctx->cap_given * sizeof(size_t));
    }
    ctx->given[ctx->n_given++] = off;
}

bool cfgtab_given(const struct cfgtab_ctx *ctx, size_t off)
{
    for (size_t i = 0; ctx && i < ctx->n_given; i++)
        if (ctx->given[i] == off)
            return true;
    return false;
}

void cfgtab_ctx_release(struct cfgtab_ctx *ctx)
{
    free(ctx->given);
    ctx->given = NULL;
    ctx->n_given = ctx->cap_given = 0;
}

/* ---- string lists --------------------------------------------------------------------- */

static void list_free(void *base, const struct cfgtab_row *r)
{
    char ***items = field(base, r);
    size_t *n = (size_t *)((char *)base + r->off_n);
    for (size_t i = 0; *items && (*items)[i]; i++) {
        if (r->flags & CFGTAB_SECRET)
            explicit_bzero((*items)[i], strlen((*items)[i]));
        free((*items)[i]);
    }
    free(*items);
    *items = NULL;
    *n = 0;
}

/* Replace the list with n strings. */
static void list_set(void *base, const struct cfgtab_row *r, const char *const *v, size_t n)
{
    list_free(base, r);
    char **items = xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        items[i] = xstrdup(v[i]);
    *(char ***)field(base, r) = items;
    *(size_t *)((char *)base + r->off_n) = n;
}

/* ---- defaults ------------------------------------------------------------------------- */

static void set_string(void *base, const struct cfgtab_row *r, const char *s)
{
    char **dst = field(base, r);
    char *copy = s ? xstrdup(s) : NULL;
    if (*dst && (r->flags & CFGTAB_SECRET))
        explicit_bzero(*dst, strlen(*dst));
    free(*dst);
    *dst = copy;
}

static void defaults_rows(const struct cfgtab *t, char *base, struct cfgtab_ctx *ctx)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & (CFGTAB_DERIVED | CFGTAB_OVERRIDE | CFGTAB_ACCEPTED) ||
            (r->ops && r->ops->parse))
            continue;
        void *f = field(base, r);
        switch (r->type) {
        case CFGTAB_BOOL:
            *(bool *)f = r->def_i != 0;
            break;
        case CFGTAB_INT:
        case CFGTAB_ENUM:
            *(int *)f = (int)r->def_i;
            break;
        case CFGTAB_INT64:
            *(int64_t *)f = r->def_i * scale_of(r);
            break;
        case CFGTAB_SIZE:
            *(size_t *)f = (size_t)r->def_i;
            break;
        case CFGTAB_DOUBLE:
            *(double *)f = r->def_d;
            break;
        case CFGTAB_MS:
            *(int64_t *)f = llround(r->def_d * 1000.0);
            break;
        case CFGTAB_STRING: {
            const char *env = NULL;
            if (r->env)
                env = ctx && ctx->env ? ctx->env(ctx->env_ud, r->env) : getenv(r->env);
            set_string(base, r, env && *env ? env : r->def_s);
            break;
        }
        case CFGTAB_STRLIST: {
            size_t n = 0;
            while (r->def_list && r->def_list[n])
                n++;
            list_set(base, r, r->def_list, n);
            break;
        }
        case CFGTAB_GROUP:
            defaults_rows(r->sub, (char *)f, ctx);
            break;
        case CFGTAB_CUSTOM:
            break;
        }
    }
}

void cfgtab_defaults(const struct cfgtab *t, void *base, struct cfgtab_ctx *ctx)
{
    defaults_rows(t, base, ctx);
}

void cfgtab_init(const struct cfgtab *t, void *base, size_t size, struct cfgtab_ctx *ctx)
{
    memset(base, 0, size);
    defaults_rows(t, base, ctx);
}

/* ---- parsing -------------------------------------------------------------------------- */

/* A string that passed its type: the row's rules, then stored (unless ACCEPTED). */
static void take_string(const struct cfgtab_row *r, void *base, const char *s, const char *path,
                        struct cfg_errors *e)
{
    if ((r->flags & CFGTAB_NONEMPTY) && !*s) {
        cfg_error(e, path, "must not be empty");
        return;
    }
    char buf[256];
    const char *msg = r->check ? r->check(&s, buf, sizeof(buf)) : NULL;
    if (msg == cfgtab_skip)
        return;
    if (msg) {
        cfg_error(e, path, "%s", msg);
        return;
    }
    if (!(r->flags & CFGTAB_ACCEPTED))
        set_string(base, r, s);
}

static void read_list(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                      struct cfg_errors *e)
{
    char buf[256];
    const char *msg = NULL;
    if ((r->flags & CFGTAB_ONE_OR_LIST) && json_is_string(v)) {
        const char *s;
        if (!cfg_read_string(v, path, &s, e))
            return;
        if (r->check && (msg = r->check(&s, buf, sizeof(buf))) != NULL)
            cfg_error(e, path, "%s", msg);
        else if (!(r->flags & CFGTAB_ACCEPTED))
            list_set(base, r, &s, 1);
        return;
    }
    if (!cfg_read_array(v, path, e))
        return;
    json_t *arr = v;
    size_t n = json_array_size(arr);
    if ((r->flags & CFGTAB_NONEMPTY) && n == 0) {
        cfg_error(e, path, "must not be empty");
        return;
    }
    const char **items = xcalloc(n + 1, sizeof(char *));
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        char p[CFGTAB_PATH_MAX + 24];
        snprintf(p, sizeof(p), "%s[%zu]", path, i);
        if (!cfg_read_string(json_array_get(arr, i), p, &items[i], e)) {
            ok = false;
        } else if (r->check && (msg = r->check(&items[i], buf, sizeof(buf))) != NULL) {
            ok = false;
            cfg_error(e, p, "%s", msg);
        }
    }
    if (ok && !(r->flags & CFGTAB_ACCEPTED))
        list_set(base, r, items, n);
    free(items);
}

static void read_value(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                       struct cfgtab_ctx *ctx)
{
    struct cfg_errors *e = ctx->errs;
    /* ACCEPTED rows are validated into a scratch field. */
    union {
        bool b;
        int i;
        int64_t i64;
        size_t z;
        double d;
    } scratch;
    void *f = (r->flags & CFGTAB_ACCEPTED) ? (void *)&scratch : field(base, r);
    int64_t x;
    double d;
    int idx;
    const char *s;
    switch (r->type) {
    case CFGTAB_BOOL:
        (void)cfg_read_bool(v, path, (bool *)f, e);
        break;
    case CFGTAB_INT:
        if (cfg_read_int(v, path, (int64_t)r->min, (int64_t)r->max, &x, e))
            *(int *)f = (int)x;
        break;
    case CFGTAB_INT64:
        if (cfg_read_int(v, path, (int64_t)r->min, (int64_t)r->max, &x, e))
            *(int64_t *)f = x * scale_of(r);
        break;
    case CFGTAB_SIZE:
        if (cfg_read_int(v, path, (int64_t)r->min, (int64_t)r->max, &x, e))
            *(size_t *)f = (size_t)x;
        break;
    case CFGTAB_DOUBLE:
        (void)cfg_read_double(v, path, r->min, r->max, (double *)f, e);
        break;
    case CFGTAB_MS:
        if (cfg_read_double(v, path, r->min, r->max, &d, e))
            *(int64_t *)f = llround(d * 1000.0);
        break;
    case CFGTAB_ENUM:
        if (cfg_read_enum(v, path, r->names, &idx, e))
            *(int *)f = idx;
        break;
    case CFGTAB_STRING:
        if (r->names ? cfg_read_enum(v, path, r->names, &idx, e) : cfg_read_string(v, path, &s, e))
            take_string(r, base, r->names ? r->names[idx] : s, path, e);
        break;
    case CFGTAB_STRLIST:
        read_list(r, base, v, path, e);
        break;
    case CFGTAB_GROUP:
    case CFGTAB_CUSTOM:
        break;
    }
}

static void apply_rows(const struct cfgtab *t, bool any_src, unsigned src, char *base,
                       size_t base_off, json_t *blk, const char *prefix, struct cfgtab_ctx *ctx)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if ((!any_src && r->src != src) || (r->flags & CFGTAB_DERIVED))
            continue;
        char path[CFGTAB_PATH_MAX];
        join(path, prefix, r->path);
        if (r->type == CFGTAB_GROUP) {
            if ((r->flags & CFGTAB_OBJECT) && !cfg_get_object(blk, path, ctx->errs))
                continue;
            if ((r->flags & CFGTAB_IFPRESENT) && !cfg_lookup(blk, path))
                continue;
            apply_rows(r->sub, true, 0, base + r->off, base_off + r->off, blk, path, ctx);
            continue;
        }
        json_t *v =
            (r->flags & CFGTAB_QUIET) ? cfg_lookup(blk, path) : cfg_get_value(blk, path, ctx->errs);
        if (!v && r->alias) {
            join(path, prefix, r->alias);
            v = (r->flags & CFGTAB_QUIET) ? cfg_lookup(blk, path)
                                          : cfg_get_value(blk, path, ctx->errs);
        }
        if (!v) {
            if (r->missing) {
                join(path, prefix, r->path);
                cfg_error(ctx->errs, path, "%s", r->missing);
            }
            continue;
        }
        if (!(r->flags & CFGTAB_ACCEPTED))
            given_add(ctx, base_off + r->off);
        if (r->ops && r->ops->parse)
            r->ops->parse(r, base, v, path, ctx);
        else
            read_value(r, base, v, path, ctx);
    }
}

void cfgtab_apply(const struct cfgtab *t, unsigned src, void *base, json_t *blk,
                  struct cfgtab_ctx *ctx)
{
    if (blk)
        apply_rows(t, false, src, base, 0, blk, "", ctx);
}

/* ---- dump ----------------------------------------------------------------------------- */

/* Put v at a dot path of out, creating the objects on the way. */
static void put_path(json_t *out, const char *path, json_t *v)
{
    json_t *cur = out;
    const char *p = path;
    for (const char *dot; (dot = strchr(p, '.')) != NULL; p = dot + 1) {
        json_t *next = json_object_getn(cur, p, (size_t)(dot - p));
        if (!json_is_object(next)) {
            next = json_object();
            json_object_setn_new(cur, p, (size_t)(dot - p), next);
        }
        cur = next;
    }
    json_object_set_new(cur, p, v);
}

static json_t *number(const struct cfgtab_row *r, double v)
{
    if ((r->flags & CFGTAB_NUMBER) && isfinite(v) && floor(v) == v && fabs(v) < 9e15)
        return json_integer((json_int_t)v);
    return json_real(v);
}

/* The dump of one row's value (never NULL except for ops that leave it out). */
static json_t *dump_value(const struct cfgtab_row *r, const void *base)
{
    if (r->ops && r->ops->dump)
        return r->ops->dump(r, base);
    const void *f = cfield(base, r);
    switch (r->type) {
    case CFGTAB_BOOL:
        return json_boolean(*(const bool *)f);
    case CFGTAB_INT:
        return json_integer(*(const int *)f);
    case CFGTAB_INT64:
        return json_integer((json_int_t)(*(const int64_t *)f / scale_of(r)));
    case CFGTAB_SIZE:
        return json_integer((json_int_t) * (const size_t *)f);
    case CFGTAB_DOUBLE:
        return number(r, *(const double *)f);
    case CFGTAB_MS:
        return number(r, (double)*(const int64_t *)f / 1000.0);
    case CFGTAB_ENUM: {
        int i = *(const int *)f;
        size_t n = 0;
        while (r->names && r->names[n])
            n++;
        return i >= 0 && (size_t)i < n ? json_string(r->names[i]) : json_null();
    }
    case CFGTAB_STRING: {
        const char *s = *(char *const *)f;
        if (!s)
            return json_null();
        return json_string((r->flags & CFGTAB_SECRET) ? "<redacted>" : s);
    }
    case CFGTAB_STRLIST: {
        char *const *items = *(char **const *)f;
        size_t n = *(const size_t *)((const char *)base + r->off_n);
        if (r->flags & CFGTAB_SECRET)
            return json_integer((json_int_t)n);
        json_t *a = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(a, json_string(items[i]));
        return a;
    }
    case CFGTAB_GROUP:
    case CFGTAB_CUSTOM:
        break;
    }
    return NULL;
}

static void dump_rows(const struct cfgtab *t, const char *base, const char *prefix, json_t *out)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & (CFGTAB_NODUMP | CFGTAB_OVERRIDE | CFGTAB_ACCEPTED))
            continue;
        char path[CFGTAB_PATH_MAX];
        join(path, prefix, r->dump ? r->dump : r->path);
        if (r->type == CFGTAB_GROUP && r->ops && r->ops->dump) {
            json_t *v = r->ops->dump(r, base);
            if (v)
                put_path(out, path, v);
            continue;
        }
        if (r->type == CFGTAB_GROUP) {
            if (!*path) {
                dump_rows(r->sub, base + r->off, "", out);
                continue;
            }
            /* Into the object at path (two groups may share it); none when empty. */
            json_t *o = cfg_lookup(out, path);
            bool fresh = !o;
            if (fresh)
                o = json_object();
            dump_rows(r->sub, base + r->off, "", o);
            if (fresh && json_object_size(o) == 0)
                json_decref(o);
            else if (fresh)
                put_path(out, path, o);
            continue;
        }
        json_t *v = dump_value(r, base);
        if (v)
            put_path(out, path, v);
    }
}

void cfgtab_dump_into(const struct cfgtab *t, const void *base, json_t *out)
{
    dump_rows(t, base, "", out);
}

json_t *cfgtab_dump(const struct cfgtab *t, const void *base)
{
    json_t *o = json_object();
    dump_rows(t, base, "", o);
    return o;
}

/* ---- diff ----------------------------------------------------------------------------- */

/* Offsets already compared or released: rows that share a field count once. */
struct seen {
    size_t *off;
    size_t n, cap;
};

static bool seen_add(struct seen *s, size_t off)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->off[i] == off)
            return false;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->off = xrealloc(s->off, s->cap * sizeof(size_t));
    }
    s->off[s->n++] = off;
    return true;
}

static bool str_eq(const char *a, const char *b)
{
    return (!a || !b) ? a == b : strcmp(a, b) == 0;
}

static bool row_equal(const struct cfgtab_row *r, const char *a, const char *b)
{
    if (r->ops && r->ops->dump) {
        json_t *ja = r->ops->dump(r, a), *jb = r->ops->dump(r, b);
        bool eq = json_equal(ja, jb) || (!ja && !jb);
        json_decref(ja);
        json_decref(jb);
        return eq;
    }
    const void *fa = cfield(a, r), *fb = cfield(b, r);
    switch (r->type) {
    case CFGTAB_BOOL:
        return *(const bool *)fa == *(const bool *)fb;
    case CFGTAB_INT:
    case CFGTAB_ENUM:
        return *(const int *)fa == *(const int *)fb;
    case CFGTAB_INT64:
    case CFGTAB_MS:
        return *(const int64_t *)fa == *(const int64_t *)fb;
    case CFGTAB_SIZE:
        return *(const size_t *)fa == *(const size_t *)fb;
    case CFGTAB_DOUBLE:
        return *(const double *)fa == *(const double *)fb;
    case CFGTAB_STRING:
        return str_eq(*(char *const *)fa, *(char *const *)fb);
    case CFGTAB_STRLIST: {
        size_t na = *(const size_t *)(a + r->off_n), nb = *(const size_t *)(b + r->off_n);
        if (na != nb)
            return false;
        for (size_t i = 0; i < na; i++)
            if (!str_eq((*(char **const *)fa)[i], (*(char **const *)fb)[i]))
                return false;
        return true;
    }
    case CFGTAB_GROUP:
    case CFGTAB_CUSTOM:
        break;
    }
    return true;
}

static void diff_rows(const struct cfgtab *t, const char *a, const char *b, const struct where *w,
                      unsigned mask, unsigned want, struct seen *seen, struct strbuf *sb)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & (CFGTAB_OVERRIDE | CFGTAB_ACCEPTED))
            continue;
        char path[CFGTAB_PATH_MAX];
        join(path, w->out, (r->flags & CFGTAB_NODUMP) ? r->path : r->dump ? r->dump : r->path);
        unsigned live = live_of(r, w);
        if (r->type == CFGTAB_GROUP) {
            struct where sub = {path, w->off + r->off, live};
            diff_rows(r->sub, a + r->off, b + r->off, &sub, mask, want, seen, sb);
            continue;
        }
        unsigned flags = (r->flags & ~CFGTAB_LIVE) | live;
        if ((flags & mask) != want || !seen_add(seen, w->off + r->off) || row_equal(r, a, b))
            continue;
        if (sb->len)
            (void)strbuf_putc(sb, ',');
        (void)strbuf_puts(sb, path);
    }
}

char *cfgtab_diff(const struct cfgtab *t, const void *a, const void *b, unsigned mask,
                  unsigned want)
{
    struct strbuf sb;
    strbuf_init(&sb, 64 * 1024);
    struct seen seen = {0};
    struct where top = {"", 0, UINT32_MAX};
    diff_rows(t, a, b, &top, mask, want, &seen, &sb);
    free(seen.off);
    if (sb.len == 0) {
        strbuf_release(&sb);
        return NULL;
    }
    return strbuf_take(&sb);
}

/* ---- reload: the running values of restart rows ------------------------------------ */

static size_t field_size(const struct cfgtab_row *r)
{
    switch (r->type) {
    case CFGTAB_BOOL:
        return sizeof(bool);
    case CFGTAB_INT:
    case CFGTAB_ENUM:
        return sizeof(int);
    case CFGTAB_INT64:
    case CFGTAB_MS:
        return sizeof(int64_t);
    case CFGTAB_SIZE:
        return sizeof(size_t);
    case CFGTAB_DOUBLE:
        return sizeof(double);
    case CFGTAB_STRING:
    case CFGTAB_STRLIST:
        return sizeof(char *);
    case CFGTAB_CUSTOM:
        return r->size;
    case CFGTAB_GROUP:
        break;
    }
    return 0;
}

static void swap_bytes(char *a, char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char t = a[i];
        a[i] = b[i];
        b[i] = t;
    }
}

static void keep_rows(const struct cfgtab *t, char *next, char *old, const struct where *w,
                      struct seen *seen, int *missing)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & (CFGTAB_OVERRIDE | CFGTAB_ACCEPTED))
            continue;
        unsigned live = live_of(r, w);
        if (r->type == CFGTAB_GROUP) {
            struct where sub = {"", w->off + r->off, live};
            keep_rows(r->sub, next + r->off, old + r->off, &sub, seen, missing);
            continue;
        }
        if (live || !seen_add(seen, w->off + r->off))
            continue;
        size_t n = field_size(r);
        if (n == 0) {
            (*missing)++; /* a restart CUSTOM row without .size: a table bug */
            continue;
        }
        swap_bytes(next + r->off, old + r->off, n);
        if (r->type == CFGTAB_STRLIST)
            swap_bytes(next + r->off_n, old + r->off_n, sizeof(size_t));
    }
}

int cfgtab_keep_restart(const struct cfgtab *t, void *next, void *old)
{
    struct seen seen = {0};
    struct where top = {"", 0, UINT32_MAX};
    int missing = 0;
    keep_rows(t, next, old, &top, &seen, &missing);
    free(seen.off);
    return missing ? -EINVAL : 0;
}

/* ---- release -------------------------------------------------------------------------- */

static void release_rows(const struct cfgtab *t, char *base, size_t base_off, struct seen *seen)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & (CFGTAB_OVERRIDE | CFGTAB_ACCEPTED))
            continue;
        if (r->type == CFGTAB_GROUP) {
            release_rows(r->sub, base + r->off, base_off + r->off, seen);
            continue;
        }
        if (!seen_add(seen, base_off + r->off))
            continue;
        if (r->ops && r->ops->release)
            r->ops->release(r, base);
        else if (r->type == CFGTAB_STRING)
            set_string(base, r, NULL);
        else if (r->type == CFGTAB_STRLIST)
            list_free(base, r);
    }
}

void cfgtab_release(const struct cfgtab *t, void *base)
{
    struct seen seen = {0};
    release_rows(t, base, 0, &seen);
    free(seen.off);
}

/* ---- docs ----------------------------------------------------------------------------- */

static void put_num(struct strbuf *sb, double v)
{
    char buf[48];
    if (v >= 1e15 || v <= -1e15 || v != v)
        snprintf(buf, sizeof(buf), "%g", v);
    else
        cfg_fmt_double(v, buf, sizeof(buf));
    (void)strbuf_puts(sb, buf);
}

static void put_names(struct strbuf *sb, const char *const *names)
{
    for (size_t i = 0; names && names[i]; i++)
        (void)strbuf_appendf(sb, "%s`%s`", i ? ", " : "", *names[i] ? names[i] : "\"\"");
}

static void put_type(struct strbuf *sb, const struct cfgtab_row *r)
{
    if (r->type_doc) {
        (void)strbuf_puts(sb, r->type_doc);
        return;
    }
    switch (r->type) {
    case CFGTAB_BOOL:
        (void)strbuf_puts(sb, "boolean");
        return;
    case CFGTAB_INT:
    case CFGTAB_INT64:
    case CFGTAB_SIZE:
    case CFGTAB_DOUBLE:
    case CFGTAB_MS:
        (void)strbuf_puts(sb, r->type == CFGTAB_MS       ? "seconds ["
                              : r->type == CFGTAB_DOUBLE ? "number ["
                                                         : "integer [");
        put_num(sb, r->min);
        (void)strbuf_puts(sb, ", ");
        put_num(sb, r->max);
        (void)strbuf_puts(sb, "]");
        return;
    case CFGTAB_ENUM:
        put_names(sb, r->names);
        return;
    case CFGTAB_STRING:
        if (r->names)
            put_names(sb, r->names);
        else
            (void)strbuf_puts(sb, "string");
        return;
    case CFGTAB_STRLIST:
        (void)strbuf_puts(sb, (r->flags & CFGTAB_ONE_OR_LIST) ? "string or list of strings"
                                                              : "list of strings");
        return;
    case CFGTAB_GROUP:
    case CFGTAB_CUSTOM:
        (void)strbuf_puts(sb, "object");
        return;
    }
}

static void put_default(struct strbuf *sb, const struct cfgtab_row *r, bool override)
{
    if (override)
        return;
    if (r->def_doc) {
        (void)strbuf_puts(sb, r->def_doc);
        return;
    }
    /* An override's default is its primary row's; a custom parser's is its own. */
    if (r->flags & (CFGTAB_ACCEPTED | CFGTAB_OVERRIDE) || (r->ops && r->ops->parse) || r->missing) {
        (void)strbuf_puts(sb, r->missing ? "required" : "");
        return;
    }
    switch (r->type) {
    case CFGTAB_BOOL:
        (void)strbuf_puts(sb, r->def_i ? "true" : "false");
        return;
    case CFGTAB_INT:
    case CFGTAB_INT64:
    case CFGTAB_SIZE:
        (void)strbuf_appendf(sb, "%" PRId64, r->def_i);
        return;
    case CFGTAB_DOUBLE:
    case CFGTAB_MS:
        put_num(sb, r->def_d);
        return;
    case CFGTAB_ENUM:
        if (r->def_i >= 0)
            (void)strbuf_appendf(sb, "`%s`", r->names[r->def_i]);
        else
            (void)strbuf_puts(sb, "unset");
        return;
    case CFGTAB_STRING:
        if (r->env)
            (void)strbuf_appendf(sb, "`$%s` or ", r->env);
        if (r->def_s)
            (void)strbuf_appendf(sb, "`\"%s\"`", r->def_s);
        else
            (void)strbuf_puts(sb, "unset");
        return;
    case CFGTAB_STRLIST:
        (void)strbuf_puts(sb, "`[");
        for (size_t i = 0; r->def_list && r->def_list[i]; i++)
            (void)strbuf_appendf(sb, "%s\"%s\"", i ? ", " : "", r->def_list[i]);
        (void)strbuf_puts(sb, "]`");
        return;
    case CFGTAB_GROUP:
    case CFGTAB_CUSTOM:
        return;
    }
}

/* One line per key; a group's rows at the group's path and reload class (an override
 * group's without defaults: they are the primary rows'), the group's doc in front of its
 * first row's. */
static void markdown_rows(const struct cfgtab *t, const char *prefix, unsigned live, bool override,
                          const char *group_doc, bool top, struct strbuf *sb)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct cfgtab_row *r = &t->rows[i];
        if (r->flags & CFGTAB_DERIVED)
            continue;
        char key[CFGTAB_PATH_MAX], pre[CFGTAB_PATH_MAX];
        const char *src = top && t->src_names ? t->src_names[r->src] : "";
        join(pre, prefix, src);
        join(key, pre, r->path);
        unsigned l = top ? (r->flags & CFGTAB_LIVE) : (r->flags & CFGTAB_RESTART) ? 0 : live;
        if (r->type == CFGTAB_GROUP) {
            markdown_rows(r->sub, key, l, override || (r->flags & CFGTAB_OVERRIDE), r->doc, false,
                          sb);
            continue;
        }
        (void)strbuf_appendf(sb, "| `%s`", key);
        if (r->alias)
            (void)strbuf_appendf(sb, " (or `%s`)", r->alias);
        (void)strbuf_puts(sb, " | ");
        put_type(sb, r);
        (void)strbuf_puts(sb, " | ");
        put_default(sb, r, override);
        (void)strbuf_appendf(sb, " | %s |", l ? "live" : "restart");
        const char *parts[] = {
            (r->flags & CFGTAB_MOTOR) ? "(motor)" : NULL,
            group_doc,
            (r->flags & CFGTAB_ACCEPTED) ? "accepted, unused" : NULL,
            r->doc,
            (r->flags & CFGTAB_SECRET) ? "(secret)" : NULL,
        };
        const char *sep = " ";
        for (size_t k = 0; k < ARRAY_LEN(parts); k++) {
            if (!parts[k])
                continue;
            (void)strbuf_appendf(sb, "%s%s", sep, parts[k]);
            /* "(motor) text", "group: text", "accepted, unused: text", "text (secret)" */
            sep = k == 1 || k == 2 ? ": " : " ";
        }
        (void)strbuf_puts(sb, " |\n");
        group_doc = NULL;
    }
}

void cfgtab_markdown(const struct cfgtab *t, struct strbuf *sb)
{
    (void)strbuf_puts(sb, "| key | type | default | reload | meaning |\n"
                          "| --- | --- | --- | --- | --- |\n");
    markdown_rows(t, "", 0, false, NULL, true, sb);
}

/* ---- shared ops ----------------------------------------------------------------------- */

const char *cfgtab_check_log_level(const char **s, char *buf, size_t cap)
{
    static const char *const canon[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    enum log_level parsed;
    if (log_parse_level(*s, &parsed) < 0) {
        snprintf(buf, cap, "must be one of DEBUG, INFO, WARNING, ERROR, got \"%.160s\"", *s);
        return buf;
    }
    *s = canon[parsed];
    return NULL;
}

static json_t *loaded_dump(const struct cfgtab_row *r, const void *base)
{
    return json_boolean(*(char *const *)cfield(base, r) != NULL);
}

static void loaded_release(const struct cfgtab_row *r, void *base)
{
    char **s = field(base, r);
    if (*s)
        explicit_bzero(*s, strlen(*s));
    free(*s);
    *s = NULL;
}

const struct cfgtab_ops cfgtab_ops_loaded = {.dump = loaded_dump, .release = loaded_release};

static json_t *json_dump(const struct cfgtab_row *r, const void *base)
{
    return json_deep_copy(*(json_t *const *)cfield(base, r));
}

static void json_release(const struct cfgtab_row *r, void *base)
{
    json_t **j = field(base, r);
    json_decref(*j);
    *j = NULL;
}

const struct cfgtab_ops cfgtab_ops_json = {.dump = json_dump, .release = json_release};
