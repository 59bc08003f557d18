/* pool_manifest — worker manifests: validation that reports every problem at once, the
 * normalized JSON we store and show, and the seed's venv conveniences. */
#include "pool/pool_internal.h"

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

static void manifest_free(struct pool_manifest *m)
{
    free(m->id);
    for (size_t i = 0; i < m->argc; i++)
        free(m->argv[i]);
    free(m->argv);
    free(m->workdir);
    for (size_t i = 0; i < m->n_env; i++)
        free(m->env[i]);
    free(m->env);
    json_decref(m->doc);
    free(m);
}

void pool_manifest_unref(struct pool_manifest *m)
{
    if (m && --m->refs <= 0)
        manifest_free(m);
}

/* A number as the operator would write it: 300 rather than 300.0. */
static json_t *num_json(double v)
{
    if (isfinite(v) && floor(v) == v && fabs(v) < 9e15)
        return json_integer((json_int_t)v);
    return json_real(v);
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

static void parse_command(json_t *obj, struct pool_manifest *m, struct cfg_errors *e)
{
    json_t *cmd = json_object_get(obj, "command");
    if (!cmd || json_is_null(cmd)) {
        cfg_error(e, "command", "is required (an array: the program and its arguments)");
        return;
    }
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
        char path[32];
        snprintf(path, sizeof(path), "command[%zu]", idx);
        const char *s = plain_string(v, path, POOL_ARG_LEN_MAX, e);
        if (s)
            m->argv[m->argc++] = xstrdup(s);
    }
}

static bool env_key_ok(const char *k)
{
    if (!*k || strchr(k, '='))
        return false;
    return strlen(k) <= POOL_ENV_KEY_MAX;
}

static void parse_env(json_t *obj, struct pool_manifest *m, json_t *env_out,
                      struct cfg_errors *e)
{
    json_t *env = cfg_get_object(obj, "env", e);
    if (!env)
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
        char *path = xasprintf("env.%s", key);
        if (!env_key_ok(key)) {
            cfg_error(e, path, "is not a valid variable name (non-empty, no '=', <= %d bytes)",
                      POOL_ENV_KEY_MAX);
        } else if (!json_is_string(v)) {
            cfg_error(e, path, "must be a string");
        } else if (strlen(json_string_value(v)) != json_string_length(v)) {
            cfg_error(e, path, "must not contain NUL characters");
        } else if (json_string_length(v) > POOL_ENV_VAL_MAX) {
            cfg_error(e, path, "is longer than %d bytes", POOL_ENV_VAL_MAX);
        } else {
            m->env[m->n_env++] = xasprintf("%s=%s", key, json_string_value(v));
            json_object_set_new(env_out, key, json_string(json_string_value(v)));
        }
        free(path);
    }
}

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

    json_t *idv = json_object_get(obj, "id");
    if (!idv || json_is_null(idv)) {
        cfg_error(e, "id", "is required");
    } else if (!json_is_string(idv)) {
        cfg_error(e, "id", "must be a string");
    } else if (!pool_id_valid(json_string_value(idv)) ||
               strlen(json_string_value(idv)) != json_string_length(idv)) {
        cfg_error(e, "id", "must be 1-%d characters of [A-Za-z0-9_.-], not starting with '.'",
                  POOL_ID_MAX);
    } else {
        m->id = xstrdup(json_string_value(idv));
    }

    parse_command(obj, m, e);

    /* The seed's manifests name the directory repo_dir; accept it as an alias. */
    const char *wd_key = json_object_get(obj, "workdir") ? "workdir" : "repo_dir";
    const char *wd = cfg_get_string(obj, wd_key, NULL, e);
    if (wd && (!*wd || strlen(wd) > 4096)) {
        cfg_error(e, wd_key, "must be a non-empty path of at most 4096 bytes");
        wd = NULL;
    }
    m->workdir = resolve_workdir(wd, base_dir);

    json_t *env_out = json_object();
    parse_env(obj, m, env_out, e);

    m->max_concurrency = (int)cfg_get_int(obj, "max_concurrency", d->max_concurrency, 1,
                                          POOL_CONCURRENCY_MAX, e);
    m->max_instances =
        (int)cfg_get_int(obj, "max_instances", d->max_instances, 1, POOL_INSTANCES_MAX, e);
    double ttl = cfg_get_double(obj, "idle_ttl_seconds", d->idle_ttl_seconds, -POOL_TTL_MAX_S,
                                POOL_TTL_MAX_S, e);
    m->keep_warm = cfg_get_bool(obj, "keep_warm", d->keep_warm, e);
    double ready = cfg_get_double(obj, "ready_timeout_seconds", d->ready_timeout_seconds, 0.001,
                                  POOL_TIMEOUT_MAX_S, e);
    double invoke = cfg_get_double(obj, "invoke_timeout_seconds", d->invoke_timeout_seconds,
                                   0.001, POOL_TIMEOUT_MAX_S, e);
    double qdef = d->queue_timeout_seconds < 0 ? invoke : d->queue_timeout_seconds;
    double queue = cfg_get_double(obj, "queue_timeout_seconds", qdef, 0, POOL_TIMEOUT_MAX_S, e);
    m->idle_ttl_ms = ttl < 0 ? -1 : seconds_to_ms(ttl);
    m->ready_timeout_ms = MOTOR_MAX(seconds_to_ms(ready), 1);
    m->invoke_timeout_ms = MOTOR_MAX(seconds_to_ms(invoke), 1);
    m->queue_timeout_ms = seconds_to_ms(queue);

    if (cfg_errors_count(e) > before) {
        json_decref(env_out);
        manifest_free(m);
        return NULL;
    }

    /* Unknown fields (name, description, inputs, ...) are kept: they are the
     * operator's, we only normalize ours. */
    m->doc = json_deep_copy(obj);
    json_object_set_new(m->doc, "id", json_string(m->id));
    json_t *argv = json_array();
    for (size_t i = 0; i < m->argc; i++)
        json_array_append_new(argv, json_string(m->argv[i]));
    json_object_set_new(m->doc, "command", argv);
    json_object_set_new(m->doc, "workdir", json_string(m->workdir));
    json_object_set_new(m->doc, "env", env_out);
    json_object_set_new(m->doc, "max_concurrency", json_integer(m->max_concurrency));
    json_object_set_new(m->doc, "max_instances", json_integer(m->max_instances));
    json_object_set_new(m->doc, "idle_ttl_seconds", num_json(ttl < 0 ? -1 : ttl));
    json_object_set_new(m->doc, "keep_warm", json_boolean(m->keep_warm));
    json_object_set_new(m->doc, "ready_timeout_seconds", num_json(ready));
    json_object_set_new(m->doc, "invoke_timeout_seconds", num_json(invoke));
    json_object_set_new(m->doc, "queue_timeout_seconds", num_json(queue));
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
