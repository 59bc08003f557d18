/* pool_manifest — worker manifests: validation that reports every problem at once, the
 * normalized JSON we store and show, and the seed's venv conveniences. */
#include "pool/pool_internal.h"

#include "common/cfgtab.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

bool pool_id_valid(const char *id)
{
    if (!id || !*id || *id == '.')
        return false;
    size_t n = 0;
    for (const char *c = id; *c; c++, n++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_' || *c == '-' || *c == '.';
        if (!ok || n >= POOL_ID_MAX)
            return false;
    }
    return true;
}

json_t *pool_json_str(const char *s, size_t n)
{
    struct strbuf sb;
    strbuf_init(&sb, 3 * n + 1);
    size_t k = 0;
    while (k < n) {
        /* util_utf8_seq_len reads at most up to a NUL, and s[n] may not be one: copy the
         * candidate sequence into a terminated scratch buffer. */
        char seq[5] = {0};
        size_t avail = MOTOR_MIN(n - k, (size_t)4);
        memcpy(seq, s + k, avail);
        size_t len = util_utf8_seq_len(seq);
        if (len == 0) {
            (void)strbuf_puts(&sb, "\xef\xbf\xbd");
            k++;
        } else {
            (void)strbuf_append(&sb, s + k, len);
            k += len;
        }
    }
    json_t *j = json_stringn(strbuf_str(&sb), sb.len);
    strbuf_release(&sb);
    return j ? j : json_string("");
}

json_t *pool_lines_json(const char *t)
{
    json_t *arr = json_array();
    while (t && *t) {
        const char *nl = strchr(t, '\n');
        size_t n = nl ? (size_t)(nl - t) : strlen(t);
        json_array_append_new(arr, pool_json_str(t, n));
        t += n + (nl ? 1 : 0);
    }
    return arr;
}

json_t *pool_errors_json(const struct cfg_errors *errs)
{
    return pool_lines_json(cfg_errors_text(errs));
}

struct pool_manifest *pool_manifest_ref(struct pool_manifest *m)
{
    if (m)
        m->refs++;
    return m;
}

static int64_t seconds_to_ms(double s)
{
    return (int64_t)llround(s * 1000.0);
}

/* A string element/field with no NUL, 1..max bytes; records why not. */
static const char *plain_string(json_t *v, const char *path, size_t max, struct cfg_errors *e)
{
    if (!json_is_string(v)) {
        cfg_error(e, path, "must be a non-empty string");
        return NULL;
    }
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    if (strlen(s) != n) {
        cfg_error(e, path, "must not contain NUL characters");
        return NULL;
    }
    if (n == 0) {
        cfg_error(e, path, "must be a non-empty string");
        return NULL;
    }
    if (n > max) {
        cfg_error(e, path, "is longer than %zu bytes", max);
        return NULL;
    }
    return s;
}

/* command: argv, every element a non-empty string (required: the row's missing text). */
static void command_parse(const struct cfgtab_row *r, void *base, json_t *cmd, const char *path,
                          struct cfgtab_ctx *ctx)
{
    struct pool_manifest *m = base;
    struct cfg_errors *e = ctx->errs;
    if (!json_is_array(cmd) || json_array_size(cmd) == 0) {
        cfg_error(e, "command", "must be a non-empty array of strings (argv)");
        return;
    }
    size_t n = json_array_size(cmd);
    if (n > POOL_ARGV_MAX) {
        cfg_error(e, "command", "has %zu elements, at most %d allowed", n, POOL_ARGV_MAX);
        return;
    }
    m->argv = xcalloc(n + 1, sizeof(char *));
    size_t idx;
    json_t *v;
    json_array_foreach(cmd, idx, v)
    {
        char p[32];
        snprintf(p, sizeof(p), "command[%zu]", idx);
        const char *s = plain_string(v, p, POOL_ARG_LEN_MAX, e);
        if (s)
            m->argv[m->argc++] = xstrdup(s);
    }
}

static const struct cfgtab_ops command_ops = {.parse = command_parse};

static bool env_key_ok(const char *k)
{
    if (!*k || strchr(k, '='))
        return false;
    return strlen(k) <= POOL_ENV_KEY_MAX;
}

static void env_parse(const struct cfgtab_row *r, void *base, json_t *env, const char *path,
                      struct cfgtab_ctx *ctx)
{
    struct pool_manifest *m = base;
    struct cfg_errors *e = ctx->errs;
    if (!cfg_read_object(env, path, e))
        return;
    size_t n = json_object_size(env);
    if (n > POOL_ENV_MAX) {
        cfg_error(e, "env", "has %zu variables, at most %d allowed", n, POOL_ENV_MAX);
        return;
    }
    m->env = xcalloc(n + 1, sizeof(char *));
    const char *key;
    json_t *v;
    json_object_foreach(env, key, v)
    {
        /* Keys may hold '.', so paths are built by hand rather than looked up. */
        char *p = xasprintf("env.%s", key);
        if (!env_key_ok(key)) {
            cfg_error(e, p, "is not a valid variable name (non-empty, no '=', <= %d bytes)",
                      POOL_ENV_KEY_MAX);
        } else if (!json_is_string(v)) {
            cfg_error(e, p, "must be a string");
        } else if (strlen(json_string_value(v)) != json_string_length(v)) {
            cfg_error(e, p, "must not contain NUL characters");
        } else if (json_string_length(v) > POOL_ENV_VAL_MAX) {
            cfg_error(e, p, "is longer than %d bytes", POOL_ENV_VAL_MAX);
        } else {
            m->env[m->n_env++] = xasprintf("%s=%s", key, json_string_value(v));
        }
        free(p);
    }
}

/* As an object again ("K=V" split at the first '=', which no key holds). */
static json_t *env_dump(const struct cfgtab_row *r, const void *base)
{
    const struct pool_manifest *m = base;
    json_t *o = json_object();
    for (size_t i = 0; i < m->n_env; i++) {
        const char *eq = strchr(m->env[i], '=');
        json_object_setn_new(o, m->env[i], (size_t)(eq - m->env[i]), json_string(eq + 1));
    }
    return o;
}

static const struct cfgtab_ops env_ops = {.parse = env_parse, .dump = env_dump};

/* Lexically clean an absolute path in place: "//", "/./" and "x/.." go away, so what we
 * show and store reads like the directory it is ("/srv/w/manifests/.." => "/srv/w").
 * Symlinks are not resolved: the directory may not exist yet. */
static void normalize_path(char *path)
{
    if (path[0] != '/')
        return;
    size_t n = strlen(path);
    char *out = xmalloc(n + 2);
    size_t len = 0; /* out holds "" or "/a/b" (no trailing slash) */
    const char *p = path;
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *seg = p;
        while (*p && *p != '/')
            p++;
        size_t sl = (size_t)(p - seg);
        if (sl == 1 && seg[0] == '.')
            continue;
        if (sl == 2 && seg[0] == '.' && seg[1] == '.') {
            while (len > 0 && out[len - 1] != '/')
                len--;
            if (len > 0)
                len--; /* the slash before the dropped segment */
            continue;
        }
        out[len++] = '/';
        memcpy(out + len, seg, sl);
        len += sl;
    }
    if (len == 0)
        out[len++] = '/';
    out[len] = '\0';
    memcpy(path, out, len + 1);
    free(out);
}

static char *resolve_workdir(const char *wd, const char *base_dir)
{
    if (wd && wd[0] == '/') {
        char *abs = xstrdup(wd);
        normalize_path(abs);
        return abs;
    }
    char *base = NULL;
    if (base_dir && *base_dir) {
        base = xstrdup(base_dir);
    } else {
        base = getcwd(NULL, 0);
        if (!base)
            base = xstrdup("/");
    }
    char *out;
    if (!wd || !*wd)
        out = xstrdup(base);
    else
        out = xasprintf("%s/%s", base, wd);
    free(base);
    normalize_path(out);
    return out;
}

static void id_parse(const struct cfgtab_row *r, void *base, json_t *idv, const char *path,
                     struct cfgtab_ctx *ctx)
{
    struct pool_manifest *m = base;
    if (!json_is_string(idv))
        cfg_error(ctx->errs, "id", "must be a string");
    else if (!pool_id_valid(json_string_value(idv)) ||
             strlen(json_string_value(idv)) != json_string_length(idv))
        cfg_error(ctx->errs, "id",
                  "must be 1-%d characters of [A-Za-z0-9_.-], not starting with '.'", POOL_ID_MAX);
    else
        m->id = xstrdup(json_string_value(idv));
}

static const struct cfgtab_ops id_ops = {.parse = id_parse};

static const char *workdir_rule(const char **s, char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    return **s && strlen(*s) <= 4096 ? NULL : "must be a non-empty path of at most 4096 bytes";
}

/* What a manifest leaves out comes from the daemon's defaults (worker_pool.defaults of
 * the node manager, the built-in ones of pool_config_init): the same rows serve both. */
#define DOFF(f) offsetof(struct pool_defaults, f)
static const struct cfgtab_row limit_rows[] = {
    {"max_concurrency", CFGTAB_INT, DOFF(max_concurrency), .flags = CFGTAB_LIVE, .min = 1,
     .max = POOL_CONCURRENCY_MAX, .def_i = 1, .doc = "calls in flight per instance"},
    {"max_instances", CFGTAB_INT, DOFF(max_instances), .flags = CFGTAB_LIVE, .min = 1,
     .max = POOL_INSTANCES_MAX, .def_i = 1,
     .doc = "instances alive at once (starting, ready, stopping, or failed and not yet reaped)"},
    {"idle_ttl_seconds", CFGTAB_DOUBLE, DOFF(idle_ttl_seconds),
     .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = -POOL_TTL_MAX_S, .max = POOL_TTL_MAX_S,
     .def_d = 300, .doc = "an instance with no call for this long is stopped; negative = never"},
    {"keep_warm", CFGTAB_BOOL, DOFF(keep_warm), .flags = CFGTAB_LIVE,
     .doc = "never stopped for idleness"},
    {"ready_timeout_seconds", CFGTAB_DOUBLE, DOFF(ready_timeout_seconds),
     .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = 0.001, .max = POOL_TIMEOUT_MAX_S, .def_d = 60,
     .doc = "spawn → ready line and `/health` 200"},
    {"invoke_timeout_seconds", CFGTAB_DOUBLE, DOFF(invoke_timeout_seconds),
     .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = 0.001, .max = POOL_TIMEOUT_MAX_S, .def_d = 300,
     .doc = "one forwarded call"},
};
static const struct cfgtab limits_table = CFGTAB_TABLE("", limit_rows, NULL);

/* queue_timeout_seconds differs: a default may say "as the invoke timeout" (negative), a
 * manifest may not. */
static const struct cfgtab_row defaults_rows[] = {
    {"", CFGTAB_GROUP, 0, .flags = CFGTAB_LIVE, .sub = &limits_table},
    {"queue_timeout_seconds", CFGTAB_DOUBLE, DOFF(queue_timeout_seconds),
     .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = -1, .max = POOL_TIMEOUT_MAX_S, .def_d = -1,
     .doc = "how long a call waits for a slot (negative = `invoke_timeout_seconds`)"},
};
const struct cfgtab pool_defaults_cfgtab =
    CFGTAB_TABLE("worker pool defaults", defaults_rows, NULL);

#define MOFF(f) offsetof(struct pool_manifest, f)

static const struct cfgtab_row manifest_rows[] = {
    {"id", CFGTAB_STRING, MOFF(id), .flags = CFGTAB_LIVE, .missing = "is required", .ops = &id_ops,
     .type_doc = "string", .doc = "`[A-Za-z0-9_.-]{1,64}`, not starting with `.`; the URL name"},
    {"command", CFGTAB_STRLIST, MOFF(argv), MOFF(argc), .flags = CFGTAB_LIVE,
     .missing = "is required (an array: the program and its arguments)", .ops = &command_ops,
     .doc = "argv; `argv[0]` without `/` is looked up in `PATH`"},
    {"workdir", CFGTAB_STRING, MOFF(workdir), .flags = CFGTAB_LIVE, .alias = "repo_dir",
     .check = workdir_rule, .def_doc = "base dir",
     .doc = "the worker's cwd; relative paths resolve against the base dir (`--base-dir`, else "
            "the manifests directory, else the daemon's cwd)"},
    {"env", CFGTAB_STRLIST, MOFF(env), MOFF(n_env), .flags = CFGTAB_LIVE, .ops = &env_ops,
     .type_doc = "object of strings", .def_doc = "`{}`",
     .doc = "added to the daemon's environment"},
    {"", CFGTAB_GROUP, MOFF(given), .flags = CFGTAB_LIVE, .sub = &limits_table},
    {"queue_timeout_seconds", CFGTAB_DOUBLE, MOFF(given.queue_timeout_seconds),
     .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = 0, .max = POOL_TIMEOUT_MAX_S,
     .def_doc = "`invoke_timeout_seconds`",
     .doc = "how long a call waits for a slot; 0 = fail at once when none is free"},
};
const struct cfgtab pool_manifest_cfgtab = CFGTAB_TABLE("worker manifest", manifest_rows, NULL);

static void manifest_free(struct pool_manifest *m)
{
    cfgtab_release(&pool_manifest_cfgtab, m);
    json_decref(m->doc);
    free(m);
}

void pool_manifest_unref(struct pool_manifest *m)
{
    if (m && --m->refs <= 0)
        manifest_free(m);
}

struct pool_manifest *pool_manifest_parse(json_t *obj, const struct pool_defaults *d,
                                          const char *base_dir, struct cfg_errors *e)
{
    if (!json_is_object(obj)) {
        cfg_error(e, "", "a manifest must be a JSON object");
        return NULL;
    }
    int before = cfg_errors_count(e);
    struct pool_manifest *m = xcalloc(1, sizeof(*m));
    m->refs = 1;
    m->given = *d;
    struct cfgtab_ctx ctx = {.errs = e};
    cfgtab_apply(&pool_manifest_cfgtab, 0, m, obj, &ctx);
    struct pool_defaults *g = &m->given;
    if (!cfgtab_given(&ctx, MOFF(given.queue_timeout_seconds)) && d->queue_timeout_seconds < 0)
        g->queue_timeout_seconds = g->invoke_timeout_seconds;
    cfgtab_ctx_release(&ctx);
    char *wd = m->workdir;
    m->workdir = resolve_workdir(wd, base_dir);
    free(wd);
    if (cfg_errors_count(e) > before) {
        manifest_free(m);
        return NULL;
    }
    m->max_concurrency = g->max_concurrency;
    m->max_instances = g->max_instances;
    if (g->idle_ttl_seconds < 0)
        g->idle_ttl_seconds = -1;
    m->idle_ttl_ms = g->idle_ttl_seconds < 0 ? -1 : seconds_to_ms(g->idle_ttl_seconds);
    m->keep_warm = g->keep_warm;
    m->ready_timeout_ms = MOTOR_MAX(seconds_to_ms(g->ready_timeout_seconds), 1);
    m->invoke_timeout_ms = MOTOR_MAX(seconds_to_ms(g->invoke_timeout_seconds), 1);
    m->queue_timeout_ms = seconds_to_ms(g->queue_timeout_seconds);

    /* Unknown fields (name, description, inputs, ...) are kept: they are the
     * operator's, we only normalize ours. */
    m->doc = json_deep_copy(obj);
    cfgtab_dump_into(&pool_manifest_cfgtab, m, m->doc);
    return m;
}

/* ---- venv conveniences (seed 003) -------------------------------------------------- */

char *pool_venv_python(const char *workdir, const char *argv0)
{
    if (!workdir || !argv0)
        return NULL;
    if (strcasecmp(argv0, "python") != 0 && strcasecmp(argv0, "python3") != 0)
        return NULL;
    char *py = xasprintf("%s/.venv/bin/python", workdir);
    struct stat st;
    if (stat(py, &st) == 0 && S_ISREG(st.st_mode) && access(py, X_OK) == 0)
        return py;
    free(py);
    return NULL;
}

/* glob(3) pattern characters in a literal path must be escaped. */
static void put_glob_literal(struct strbuf *sb, const char *s)
{
    for (; *s; s++) {
        if (strchr("*?[]\\", *s))
            (void)strbuf_putc(sb, '\\');
        (void)strbuf_putc(sb, *s);
    }
}

static bool path_list_has(const char *list, const char *dir)
{
    size_t n = strlen(dir);
    for (const char *c = list; c && *c;) {
        const char *colon = strchr(c, ':');
        size_t len = colon ? (size_t)(colon - c) : strlen(c);
        if (len == n && memcmp(c, dir, n) == 0)
            return true;
        if (!colon)
            break;
        c = colon + 1;
    }
    return false;
}

char *pool_cuda_library_path(const char *workdir, const char *current)
{
    if (!workdir)
        return NULL;
    struct strbuf pat;
    strbuf_init(&pat, 16384);
    put_glob_literal(&pat, workdir);
    (void)strbuf_puts(&pat, "/.venv/lib/python3*/site-packages/nvidia/*/lib");
    if (pat.overflow) {
        strbuf_release(&pat);
        return NULL;
    }
    glob_t g;
    memset(&g, 0, sizeof(g));
    int rc = glob(strbuf_str(&pat), GLOB_ONLYDIR, NULL, &g);
    strbuf_release(&pat);
    if (rc != 0) {
        globfree(&g);
        return NULL;
    }
    struct strbuf out;
    strbuf_init(&out, 1u << 20);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct stat st;
        const char *dir = g.gl_pathv[i];
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (path_list_has(current, dir) || path_list_has(strbuf_str(&out), dir))
            continue;
        if (out.len)
            (void)strbuf_putc(&out, ':');
        (void)strbuf_puts(&out, dir);
    }
    globfree(&g);
    if (out.len == 0) {
        strbuf_release(&out);
        return NULL;
    }
    /* The venv's libraries first: they are the ones the worker was installed with. */
    if (current && *current) {
        (void)strbuf_putc(&out, ':');
        (void)strbuf_puts(&out, current);
    }
    return strbuf_take(&out);
}
