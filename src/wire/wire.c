/* wire — shared wire types and the field getters behind every wire_* parser. */
#include "wire/wire.h"
#include "wire/wire_internal.h"

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

/* ---- errors ------------------------------------------------------------------------ */

/* snprintf whose truncation is intended: messages and paths are capped on purpose. */
static void capped(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void capped(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

void wire_err_set(struct wire_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
}

void wj_err(struct wire_err *err, const char *path, const char *key, const char *fmt, ...)
{
    if (!err)
        return;
    char where[WIRE_PATH_MAX];
    wj_path_key(where, sizeof(where), path, key);
    char msg[WIRE_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (where[0])
        capped(err->msg, sizeof(err->msg), "%s: %s", where, msg);
    else
        capped(err->msg, sizeof(err->msg), "%s", msg);
}

const char *wj_path_key(char *buf, size_t cap, const char *path, const char *key)
{
    const char *p = path ? path : "";
    if (!key || !*key)
        capped(buf, cap, "%s", p);
    else if (*p)
        capped(buf, cap, "%s.%s", p, key);
    else
        capped(buf, cap, "%s", key);
    return buf;
}

const char *wj_path_idx(char *buf, size_t cap, const char *path, size_t i)
{
    capped(buf, cap, "%s[%zu]", path ? path : "", i);
    return buf;
}

int wj_require_object(json_t *j, const char *path, struct wire_err *err)
{
    if (json_is_object(j))
        return 0;
    wj_err(err, path, NULL, "must be a JSON object, got %s", jval_type_name(j));
    if (err && (!path || !*path))
        snprintf(err->msg, sizeof(err->msg), "body must be a JSON object, got %s",
                 jval_type_name(j));
    return -EINVAL;
}

/* ---- getters: the wire's wording of jval's verdicts (common/jval.h) ----------------- */

json_t *wj_get(json_t *obj, const char *path, const char *key, int req, struct wire_err *err,
               int *rc)
{
    *rc = 0;
    json_t *v = json_object_get(obj, key);
    if (v && !json_is_null(v))
        return v;
    if (req) {
        wj_err(err, path, key, v ? "must not be null" : "missing");
        *rc = -EINVAL;
    }
    return NULL;
}

/* The message of a failed string-like read of v at path. */
static int string_fail(enum jval_rc rc, json_t *v, const char *path, const char *want,
                       struct wire_err *err)
{
    if (rc == JVAL_LONG)
        wj_err(err, path, NULL, "too long (%zu bytes, max %d)", json_string_length(v),
               WIRE_STR_MAX);
    else if (rc == JVAL_NUL)
        wj_err(err, path, NULL, "must not contain NUL characters");
    else if (rc == JVAL_NEGATIVE)
        wj_err(err, path, NULL, "must be a non-negative number, got %" JSON_INTEGER_FORMAT,
               json_integer_value(v));
    else
        wj_err(err, path, NULL, "must be %s, got %s", want, jval_type_name(v));
    return -EINVAL;
}

int wj_value_str(json_t *v, const char *path, char **out, struct wire_err *err)
{
    const char *s;
    size_t len;
    enum jval_rc rc = jval_string(v, WIRE_STR_MAX, &s, &len);
    if (rc != JVAL_OK)
        return string_fail(rc, v, path, "a string", err);
    free(*out);
    *out = xstrndup(s, len);
    return 0;
}

/* Getters of one member: look key up, then read the value at "<path>.<key>". */
#define WJ_MEMBER(read)                                                                            \
    int rc;                                                                                        \
    json_t *v = wj_get(obj, path, key, req, err, &rc);                                             \
    if (!v)                                                                                        \
        return rc;                                                                                 \
    char p[WIRE_PATH_MAX];                                                                         \
    wj_path_key(p, sizeof(p), path, key);                                                          \
    return read

int wj_str(json_t *obj, const char *path, const char *key, int req, char **out,
           struct wire_err *err)
{
    WJ_MEMBER(wj_value_str(v, p, out, err));
}

int wj_str_nonempty(json_t *obj, const char *path, const char *key, int req, char **out,
                    struct wire_err *err)
{
    char *s = NULL;
    int rc = wj_str(obj, path, key, req, &s, err);
    if (rc < 0)
        return rc;
    if (s && !*s) {
        free(s);
        wj_err(err, path, key, "must not be empty");
        return -EINVAL;
    }
    if (s) {
        free(*out);
        *out = s;
    }
    return 0;
}

int wj_value_numstr(json_t *v, const char *path, char **out, struct wire_err *err)
{
    char *s = NULL;
    enum jval_rc rc = jval_numstr(v, WIRE_STR_MAX, &s);
    if (rc != JVAL_OK)
        return string_fail(rc, v, path, "a string or an integer", err);
    free(*out);
    *out = s;
    return 0;
}

int wj_value_portstr(json_t *v, const char *path, char **out, struct wire_err *err)
{
    char *s = NULL;
    enum jval_rc rc = jval_portstr(v, WIRE_STR_MAX, &s);
    if (rc == JVAL_NOT_PORT) {
        wj_err(err, path, NULL, "must be a port number 1-65535, got \"%.40s\"", s);
        free(s);
        return -EINVAL;
    }
    if (rc != JVAL_OK)
        return string_fail(rc, v, path, "a string or an integer", err);
    free(*out);
    *out = s;
    return 0;
}

int wj_numstr(json_t *obj, const char *path, const char *key, int req, char **out,
              struct wire_err *err)
{
    WJ_MEMBER(wj_value_numstr(v, p, out, err));
}

int wj_portstr(json_t *obj, const char *path, const char *key, int req, char **out,
               struct wire_err *err)
{
    WJ_MEMBER(wj_value_portstr(v, p, out, err));
}

int wj_value_int(json_t *v, const char *path, int64_t min, int64_t max, int64_t *out,
                 struct wire_err *err)
{
    int64_t x = 0;
    enum jval_rc rc = jval_int(v, min, max, JVAL_INT_EXACT, &x);
    if (rc == JVAL_TYPE) {
        wj_err(err, path, NULL, "must be an integer, got %s", jval_type_name(v));
        return -EINVAL;
    }
    if (rc == JVAL_RANGE) {
        wj_err(err, path, NULL, "must be in [%" PRId64 ", %" PRId64 "], got %" PRId64, min, max, x);
        return -EINVAL;
    }
    *out = x;
    return 0;
}

int wj_int(json_t *obj, const char *path, const char *key, int req, int64_t min, int64_t max,
           int64_t *out, struct wire_err *err)
{
    WJ_MEMBER(wj_value_int(v, p, min, max, out, err));
}

int wj_int32(json_t *obj, const char *path, const char *key, int req, int min, int max, int *out,
             struct wire_err *err)
{
    int64_t x = *out;
    int rc = wj_int(obj, path, key, req, min, max, &x, err);
    if (rc == 0)
        *out = (int)x;
    return rc;
}

int wj_double(json_t *obj, const char *path, const char *key, int req, double min, double max,
              double *out, struct wire_err *err)
{
    int rc;
    json_t *v = wj_get(obj, path, key, req, err, &rc);
    if (!v)
        return rc;
    double d = 0;
    enum jval_rc jrc = jval_double(v, min, max, &d);
    if (jrc == JVAL_TYPE) {
        wj_err(err, path, key, "must be a number, got %s", jval_type_name(v));
        return -EINVAL;
    }
    if (jrc == JVAL_RANGE) {
        char got[40], lo[40], hi[40];
        wire_fmt_double(d, got, sizeof(got));
        wire_fmt_double(min, lo, sizeof(lo));
        wire_fmt_double(max, hi, sizeof(hi));
        wj_err(err, path, key, "must be in [%s, %s], got %s", lo, hi, got);
        return -EINVAL;
    }
    *out = d;
    return 0;
}

int wj_bool(json_t *obj, const char *path, const char *key, int req, bool *out,
            struct wire_err *err)
{
    int rc;
    json_t *v = wj_get(obj, path, key, req, err, &rc);
    if (!v)
        return rc;
    if (jval_bool(v, out) != JVAL_OK) {
        wj_err(err, path, key, "must be true or false, got %s", jval_type_name(v));
        return -EINVAL;
    }
    return 0;
}

int wj_array(json_t *obj, const char *path, const char *key, int req, json_t **out,
             struct wire_err *err)
{
    int rc;
    *out = NULL;
    json_t *v = wj_get(obj, path, key, req, err, &rc);
    if (!v)
        return rc;
    enum jval_rc jrc = jval_array(v, WIRE_LIST_MAX);
    if (jrc == JVAL_TYPE) {
        wj_err(err, path, key, "must be an array, got %s", jval_type_name(v));
        return -EINVAL;
    }
    if (jrc == JVAL_LONG) {
        wj_err(err, path, key, "too many elements (%zu, max %d)", json_array_size(v),
               WIRE_LIST_MAX);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int wj_object(json_t *obj, const char *path, const char *key, int req, json_t **out,
              struct wire_err *err)
{
    int rc;
    *out = NULL;
    json_t *v = wj_get(obj, path, key, req, err, &rc);
    if (!v)
        return rc;
    if (!json_is_object(v)) {
        wj_err(err, path, key, "must be an object, got %s", jval_type_name(v));
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int wj_strlist(json_t *obj, const char *path, const char *key, int req, bool ports,
               struct wire_strlist *l, struct wire_err *err)
{
    json_t *arr;
    int rc = wj_array(obj, path, key, req, &arr, err);
    if (rc < 0 || !arr)
        return rc;
    struct wire_strlist tmp = {0};
    tmp.items = xcalloc(json_array_size(arr) + 1, sizeof(char *));
    char base[WIRE_PATH_MAX], p[WIRE_PATH_MAX];
    wj_path_key(base, sizeof(base), path, key);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        wj_path_idx(p, sizeof(p), base, i);
        char *s = NULL;
        rc = ports ? wj_value_portstr(v, p, &s, err) : wj_value_str(v, p, &s, err);
        if (rc < 0) {
            wire_strlist_release(&tmp);
            return rc;
        }
        tmp.items[tmp.n++] = s;
    }
    wire_strlist_release(l);
    *l = tmp;
    return 0;
}

int wj_intlist(json_t *obj, const char *path, const char *key, int req, int64_t min, int64_t max,
               int64_t **out, size_t *n, struct wire_err *err)
{
    json_t *arr;
    int rc = wj_array(obj, path, key, req, &arr, err);
    if (rc < 0 || !arr)
        return rc;
    int64_t *ids = xcalloc(json_array_size(arr) + 1, sizeof(int64_t));
    char base[WIRE_PATH_MAX], p[WIRE_PATH_MAX];
    wj_path_key(base, sizeof(base), path, key);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        /* Booleans are not ids even though Python's bool is an int. */
        if (wj_value_int(v, wj_path_idx(p, sizeof(p), base, i), min, max, &ids[i], err) < 0) {
            free(ids);
            return -EINVAL;
        }
    }
    free(*out);
    *out = ids;
    *n = json_array_size(arr);
    return 0;
}

int wj_role(json_t *obj, const char *path, const char *key, int req, enum wire_role *out,
            struct wire_err *err)
{
    char *s = NULL;
    int rc = wj_str(obj, path, key, req, &s, err);
    if (rc < 0 || !s)
        return rc;
    rc = wire_role_from_str(s, out);
    if (rc < 0)
        wj_err(err, path, key,
               "must be one of \"encode\", \"prefill\", \"decode\", \"union\", \"both\", got "
               "\"%.40s\"",
               s);
    free(s);
    return rc;
}

void wj_set_str(json_t *o, const char *key, const char *s)
{
    if (s)
        json_object_set_new(o, key, json_string(s));
}

void wj_set_int(json_t *o, const char *key, int64_t v)
{
    json_object_set_new(o, key, json_integer((json_int_t)v));
}

/* ---- enums -------------------------------------------------------------------------- */

static const char *const role_names[] = {"encode", "prefill", "decode", "union"};
static const char *const ep_status_names[] = {"initial", "normal", "abnormal", "paused",
                                              "wait2start"};
static const char *const ins_status_names[] = {"initial", "inactive", "active", "paused",
                                               "deleted"};
static const char *const engine_status_names[] = {"healthy", "dead", "unhealthy"};

static int enum_from(const char *const *names, size_t n, const char *s, int *out)
{
    if (!s)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (int)i;
            return 0;
        }
    }
    return -EINVAL;
}

int wire_role_from_str(const char *s, enum wire_role *out)
{
    int v;
    if (s && strcmp(s, "both") == 0) {
        *out = WIRE_ROLE_UNION;
        return 0;
    }
    if (enum_from(role_names, ARRAY_LEN(role_names), s, &v) < 0)
        return -EINVAL;
    *out = (enum wire_role)v;
    return 0;
}

const char *wire_role_str(enum wire_role r)
{
    return (unsigned)r < ARRAY_LEN(role_names) ? role_names[r] : "?";
}

int wire_ep_status_from_str(const char *s, enum wire_ep_status *out)
{
    int v;
    if (enum_from(ep_status_names, ARRAY_LEN(ep_status_names), s, &v) < 0)
        return -EINVAL;
    *out = (enum wire_ep_status)v;
    return 0;
}

const char *wire_ep_status_str(enum wire_ep_status s)
{
    return (unsigned)s < ARRAY_LEN(ep_status_names) ? ep_status_names[s] : "?";
}

int wire_ins_status_from_str(const char *s, enum wire_ins_status *out)
{
    int v;
    if (enum_from(ins_status_names, ARRAY_LEN(ins_status_names), s, &v) < 0)
        return -EINVAL;
    *out = (enum wire_ins_status)v;
    return 0;
}

const char *wire_ins_status_str(enum wire_ins_status s)
{
    return (unsigned)s < ARRAY_LEN(ins_status_names) ? ins_status_names[s] : "?";
}

int wire_engine_status_from_str(const char *s, enum wire_engine_status *out)
{
    int v;
    if (enum_from(engine_status_names, ARRAY_LEN(engine_status_names), s, &v) < 0)
        return -EINVAL;
    *out = (enum wire_engine_status)v;
    return 0;
}

const char *wire_engine_status_str(enum wire_engine_status s)
{
    return (unsigned)s < ARRAY_LEN(engine_status_names) ? engine_status_names[s] : "?";
}

/* ---- string lists ------------------------------------------------------------------- */

void wire_strlist_release(struct wire_strlist *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

void wire_strlist_push(struct wire_strlist *l, const char *s)
{
    l->items = xrealloc(l->items, (l->n + 2) * sizeof(char *));
    l->items[l->n++] = xstrdup(s ? s : "");
    l->items[l->n] = NULL;
}

void wire_strlist_copy(struct wire_strlist *dst, const struct wire_strlist *src)
{
    dst->items = NULL;
    dst->n = 0;
    for (size_t i = 0; src && i < src->n; i++)
        wire_strlist_push(dst, src->items[i]);
}

json_t *wire_strlist_to_json(const struct wire_strlist *l)
{
    json_t *a = json_array();
    for (size_t i = 0; l && i < l->n; i++)
        json_array_append_new(a, json_string(l->items[i]));
    return a;
}

/* ---- DeviceInfo --------------------------------------------------------------------- */

static int device_info_parse_at(json_t *j, const char *path, struct wire_device_info *out,
                                struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (wj_numstr(j, path, "device_id", WJ_REQ, &out->device_id, err) < 0 ||
        wj_numstr(j, path, "rank_id", WJ_REQ, &out->rank_id, err) < 0 ||
        wj_str(j, path, "device_ip", WJ_OPT, &out->device_ip, err) < 0 ||
        wj_numstr(j, path, "super_device_id", WJ_OPT, &out->super_device_id, err) < 0) {
        wire_device_info_release(out);
        return -EINVAL;
    }
    return 0;
}

int wire_device_info_parse(json_t *j, struct wire_device_info *out, struct wire_err *err)
{
    return device_info_parse_at(j, "", out, err);
}

json_t *wire_device_info_to_json(const struct wire_device_info *d)
{
    json_t *o = json_object();
    wj_set_str(o, "device_id", d->device_id);
    wj_set_str(o, "rank_id", d->rank_id);
    wj_set_str(o, "device_ip", d->device_ip);
    wj_set_str(o, "super_device_id", d->super_device_id);
    return o;
}

void wire_device_info_release(struct wire_device_info *d)
{
    if (!d)
        return;
    free(d->device_id);
    free(d->rank_id);
    free(d->device_ip);
    free(d->super_device_id);
    memset(d, 0, sizeof(*d));
}

void wire_device_info_copy(struct wire_device_info *dst, const struct wire_device_info *src)
{
    dst->device_id = xstrdup(src->device_id);
    dst->rank_id = xstrdup(src->rank_id);
    dst->device_ip = xstrdup(src->device_ip);
    dst->super_device_id = xstrdup(src->super_device_id);
}

/* Parse an array of DeviceInfo (shared with the ranktable's `device`). */
int wire_device_list_parse_at(json_t *arr, const char *path, struct wire_device_info **out,
                              size_t *n, struct wire_err *err)
{
    size_t count = json_array_size(arr);
    struct wire_device_info *v = xcalloc(count + 1, sizeof(*v));
    char p[WIRE_PATH_MAX];
    for (size_t i = 0; i < count; i++) {
        if (device_info_parse_at(json_array_get(arr, i), wj_path_idx(p, sizeof(p), path, i), &v[i],
                                 err) < 0) {
            for (size_t k = 0; k < i; k++)
                wire_device_info_release(&v[k]);
            free(v);
            return -EINVAL;
        }
    }
    *out = v;
    *n = count;
    return 0;
}

/* ---- Endpoint ----------------------------------------------------------------------- */

static const char *const endpoint_keys[] = {
    "id",           "ip",           "business_port", "bootstrap_port", "status",
    "device_infos", "hb_timestamp", "workload",      "headless"};

int wire_endpoint_parse_at(json_t *j, const char *path, unsigned flags, struct wire_endpoint *out,
                           struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (flags & WIRE_STRICT_ENDPOINT) {
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v)
        {
            bool known = false;
            for (size_t i = 0; i < ARRAY_LEN(endpoint_keys); i++)
                known = known || strcmp(key, endpoint_keys[i]) == 0;
            if (!known) {
                wj_err(err, path, NULL, "unknown field \"%.40s\"", key);
                return -EINVAL;
            }
        }
    }
    char *status = NULL;
    json_t *devs = NULL, *workload = NULL;
    int64_t bootstrap = 0;
    int rc = -EINVAL;
    if (wj_int(j, path, "id", WJ_REQ, 0, WIRE_ID_MAX, &out->id, err) < 0 ||
        wj_str_nonempty(j, path, "ip", WJ_REQ, &out->ip, err) < 0)
        goto fail;
    /* Older Controllers send `port`; the newest key wins when both are present. */
    if (json_object_get(j, "business_port") || !json_object_get(j, "port")) {
        if (wj_portstr(j, path, "business_port", WJ_REQ, &out->business_port, err) < 0)
            goto fail;
    } else if (wj_portstr(j, path, "port", WJ_REQ, &out->business_port, err) < 0) {
        goto fail;
    }
    if (wj_int(j, path, "bootstrap_port", WJ_OPT, 1, 65535, &bootstrap, err) < 0 ||
        wj_str(j, path, "status", WJ_OPT, &status, err) < 0)
        goto fail;
    out->bootstrap_port = (int)bootstrap;
    if (status && wire_ep_status_from_str(status, &out->status) < 0) {
        wj_err(err, path, "status",
               "must be one of \"initial\", \"normal\", \"abnormal\", \"paused\", "
               "\"wait2start\", got \"%.40s\"",
               status);
        goto fail;
    }
    if (wj_array(j, path, "device_infos", WJ_OPT, &devs, err) < 0)
        goto fail;
    if (devs) {
        char p[WIRE_PATH_MAX];
        if (wire_device_list_parse_at(devs, wj_path_key(p, sizeof(p), path, "device_infos"),
                                      &out->device_infos, &out->n_device_infos, err) < 0)
            goto fail;
    }
    if (wj_double(j, path, "hb_timestamp", WJ_OPT, 0, 1e15, &out->hb_timestamp, err) < 0 ||
        wj_object(j, path, "workload", WJ_OPT, &workload, err) < 0)
        goto fail;
    if (workload) {
        char p[WIRE_PATH_MAX];
        if (wj_double(workload, wj_path_key(p, sizeof(p), path, "workload"), "active_tokens",
                      WJ_OPT, 0, 1e18, &out->active_tokens, err) < 0)
            goto fail;
    }
    if (wj_bool(j, path, "headless", WJ_OPT, &out->headless, err) < 0)
        goto fail;
    rc = 0;
fail:
    free(status);
    if (rc < 0)
        wire_endpoint_release(out);
    return rc;
}

int wire_endpoint_parse(json_t *j, unsigned flags, struct wire_endpoint *out, struct wire_err *err)
{
    return wire_endpoint_parse_at(j, "", flags, out, err);
}

json_t *wire_endpoint_to_json(const struct wire_endpoint *e)
{
    json_t *o = json_object();
    wj_set_int(o, "id", e->id);
    wj_set_str(o, "ip", e->ip ? e->ip : "");
    wj_set_str(o, "business_port", e->business_port ? e->business_port : "");
    if (e->bootstrap_port > 0)
        wj_set_int(o, "bootstrap_port", e->bootstrap_port);
    wj_set_str(o, "status", wire_ep_status_str(e->status));
    json_t *devs = json_array();
    for (size_t i = 0; i < e->n_device_infos; i++)
        json_array_append_new(devs, wire_device_info_to_json(&e->device_infos[i]));
    json_object_set_new(o, "device_infos", devs);
    json_object_set_new(o, "hb_timestamp", json_real(e->hb_timestamp));
    json_t *wl = json_object();
    json_object_set_new(wl, "active_tokens", json_real(e->active_tokens));
    json_object_set_new(o, "workload", wl);
    json_object_set_new(o, "headless", json_boolean(e->headless));
    return o;
}

void wire_endpoint_release(struct wire_endpoint *e)
{
    if (!e)
        return;
    free(e->ip);
    free(e->business_port);
    for (size_t i = 0; i < e->n_device_infos; i++)
        wire_device_info_release(&e->device_infos[i]);
    free(e->device_infos);
    memset(e, 0, sizeof(*e));
}

void wire_endpoint_copy(struct wire_endpoint *dst, const struct wire_endpoint *src)
{
    *dst = *src;
    dst->ip = xstrdup(src->ip);
    dst->business_port = xstrdup(src->business_port);
    dst->device_infos = xcalloc(src->n_device_infos + 1, sizeof(*dst->device_infos));
    for (size_t i = 0; i < src->n_device_infos; i++)
        wire_device_info_copy(&dst->device_infos[i], &src->device_infos[i]);
}

void wire_endpoints_free(struct wire_endpoint *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        wire_endpoint_release(&v[i]);
    free(v);
}

int wire_endpoint_port(const struct wire_endpoint *e)
{
    return e ? jval_port_value(e->business_port) : 0;
}

/* Parse an array of Endpoint (shared by StartCmdMsg and ReregisterMsg). */
int wire_endpoint_list_parse_at(json_t *arr, const char *path, unsigned flags,
                                struct wire_endpoint **out, size_t *n, struct wire_err *err)
{
    size_t count = json_array_size(arr);
    struct wire_endpoint *v = xcalloc(count + 1, sizeof(*v));
    char p[WIRE_PATH_MAX];
    for (size_t i = 0; i < count; i++) {
        if (wire_endpoint_parse_at(json_array_get(arr, i), wj_path_idx(p, sizeof(p), path, i),
                                   flags, &v[i], err) < 0) {
            wire_endpoints_free(v, i);
            return -EINVAL;
        }
    }
    *out = v;
    *n = count;
    return 0;
}

/* ---- ParallelConfig ----------------------------------------------------------------- */

void wire_parallel_config_default(struct wire_parallel_config *p)
{
    *p = (struct wire_parallel_config){
        .dp_size = 1, .pcp_size = 1, .tp_size = 1, .ep_size = 1, .pp_size = 1};
}

int wire_parallel_config_parse_at(json_t *j, const char *path, struct wire_parallel_config *out,
                                  struct wire_err *err)
{
    struct wire_parallel_config p;
    wire_parallel_config_default(&p);
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (wj_int32(j, path, "dp_size", WJ_OPT, 1, WIRE_SIZE_MAX, &p.dp_size, err) < 0 ||
        wj_int32(j, path, "pcp_size", WJ_OPT, 1, WIRE_SIZE_MAX, &p.pcp_size, err) < 0 ||
        wj_int32(j, path, "tp_size", WJ_OPT, 1, WIRE_SIZE_MAX, &p.tp_size, err) < 0 ||
        wj_int32(j, path, "ep_size", WJ_OPT, 1, WIRE_SIZE_MAX, &p.ep_size, err) < 0 ||
        wj_int32(j, path, "pp_size", WJ_OPT, 1, WIRE_SIZE_MAX, &p.pp_size, err) < 0 ||
        wj_int32(j, path, "world_size", WJ_OPT, 0, WIRE_SIZE_MAX, &p.world_size, err) < 0 ||
        wj_int32(j, path, "local_world_size", WJ_OPT, 0, WIRE_SIZE_MAX, &p.local_world_size, err) <
            0)
        return -EINVAL;
    *out = p;
    return 0;
}

int wire_parallel_config_parse(json_t *j, struct wire_parallel_config *out, struct wire_err *err)
{
    return wire_parallel_config_parse_at(j, "", out, err);
}

json_t *wire_parallel_config_to_json(const struct wire_parallel_config *p)
{
    json_t *o = json_object();
    wj_set_int(o, "dp_size", p->dp_size);
    wj_set_int(o, "pcp_size", p->pcp_size);
    wj_set_int(o, "tp_size", p->tp_size);
    wj_set_int(o, "ep_size", p->ep_size);
    wj_set_int(o, "pp_size", p->pp_size);
    wj_set_int(o, "world_size", p->world_size);
    wj_set_int(o, "local_world_size", p->local_world_size);
    return o;
}

int wire_parallel_config_fill(struct wire_parallel_config *p, struct wire_err *err)
{
    int64_t local = (int64_t)p->pcp_size * p->tp_size * p->pp_size;
    int64_t world = local * p->dp_size;
    if (p->local_world_size == 0) {
        if (local > WIRE_SIZE_MAX) {
            wire_err_set(err, "local_world_size: pcp*tp*pp = %" PRId64 " exceeds %d", local,
                         WIRE_SIZE_MAX);
            return -ERANGE;
        }
        p->local_world_size = (int)local;
    }
    if (p->world_size == 0) {
        if (world > WIRE_SIZE_MAX) {
            wire_err_set(err, "world_size: dp*pcp*tp*pp = %" PRId64 " exceeds %d", world,
                         WIRE_SIZE_MAX);
            return -ERANGE;
        }
        p->world_size = (int)world;
    }
    return 0;
}

/* ---- FtCapabilitySnapshot ----------------------------------------------------------- */

int wire_ft_capability_parse_at(json_t *j, const char *path, struct wire_ft_capability *out,
                                struct wire_err *err)
{
    struct wire_ft_capability c = {0};
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (wj_bool(j, path, "enabled", WJ_OPT, &c.enabled, err) < 0 ||
        wj_bool(j, path, "scale_down_supported", WJ_OPT, &c.scale_down_supported, err) < 0 ||
        wj_bool(j, path, "external_lb", WJ_OPT, &c.external_lb, err) < 0 ||
        wj_bool(j, path, "auto_recovery", WJ_OPT, &c.auto_recovery, err) < 0 ||
        wj_bool(j, path, "fused_mc2_enabled", WJ_OPT, &c.fused_mc2_enabled, err) < 0 ||
        wj_bool(j, path, "eplb_enabled", WJ_OPT, &c.eplb_enabled, err) < 0 ||
        wj_int(j, path, "num_redundant_experts", WJ_OPT, 0, WIRE_ID_MAX, &c.num_redundant_experts,
               err) < 0)
        return -EINVAL;
    *out = c;
    return 0;
}

int wire_ft_capability_parse(json_t *j, struct wire_ft_capability *out, struct wire_err *err)
{
    return wire_ft_capability_parse_at(j, "", out, err);
}

json_t *wire_ft_capability_to_json(const struct wire_ft_capability *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(c->enabled));
    json_object_set_new(o, "scale_down_supported", json_boolean(c->scale_down_supported));
    json_object_set_new(o, "external_lb", json_boolean(c->external_lb));
    json_object_set_new(o, "auto_recovery", json_boolean(c->auto_recovery));
    json_object_set_new(o, "fused_mc2_enabled", json_boolean(c->fused_mc2_enabled));
    json_object_set_new(o, "eplb_enabled", json_boolean(c->eplb_enabled));
    wj_set_int(o, "num_redundant_experts", c->num_redundant_experts);
    return o;
}

/* ---- NodeManagerInfo ---------------------------------------------------------------- */

int wire_nm_info_parse(json_t *j, struct wire_nm_info *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str_nonempty(j, "", "pod_ip", WJ_REQ, &out->pod_ip, err) < 0 ||
        wj_portstr(j, "", "port", WJ_REQ, &out->port, err) < 0 ||
        wj_int(j, "", "device_num", WJ_OPT, 0, WIRE_SIZE_MAX, &out->device_num, err) < 0) {
        wire_nm_info_release(out);
        return -EINVAL;
    }
    return 0;
}

json_t *wire_nm_info_to_json(const struct wire_nm_info *n)
{
    json_t *o = json_object();
    wj_set_str(o, "pod_ip", n->pod_ip ? n->pod_ip : "");
    wj_set_str(o, "port", n->port ? n->port : "");
    wj_set_int(o, "device_num", n->device_num);
    return o;
}

void wire_nm_info_release(struct wire_nm_info *n)
{
    if (!n)
        return;
    free(n->pod_ip);
    free(n->port);
    memset(n, 0, sizeof(*n));
}

/* ---- JSON text ---------------------------------------------------------------------- */

void wire_fmt_double(double v, char *buf, size_t cap)
{
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    /* Python's repr keeps floats recognisable: 1.0, not 1. */
    if (!strpbrk(buf, ".eEn")) {
        size_t n = strlen(buf);
        if (n + 2 < cap) {
            buf[n] = '.';
            buf[n + 1] = '0';
            buf[n + 2] = '\0';
        }
    }
}

static void compact_into(struct strbuf *sb, const json_t *j)
{
    char num[64];
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *key;
        json_t *v;
        bool first = true;
        (void)strbuf_putc(sb, '{');
        json_object_foreach((json_t *)j, key, v)
        {
            if (!first)
                (void)strbuf_putc(sb, ',');
            first = false;
            (void)strbuf_put_json_string(sb, key);
            (void)strbuf_putc(sb, ':');
            compact_into(sb, v);
        }
        (void)strbuf_putc(sb, '}');
        break;
    }
    case JSON_ARRAY: {
        (void)strbuf_putc(sb, '[');
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i)
                (void)strbuf_putc(sb, ',');
            compact_into(sb, json_array_get(j, i));
        }
        (void)strbuf_putc(sb, ']');
        break;
    }
    case JSON_STRING:
        (void)strbuf_put_json_string(sb, json_string_value(j));
        break;
    case JSON_INTEGER:
        (void)strbuf_appendf(sb, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        break;
    case JSON_REAL:
        wire_fmt_double(json_real_value(j), num, sizeof(num));
        (void)strbuf_puts(sb, num);
        break;
    case JSON_TRUE:
        (void)strbuf_puts(sb, "true");
        break;
    case JSON_FALSE:
        (void)strbuf_puts(sb, "false");
        break;
    case JSON_NULL:
        (void)strbuf_puts(sb, "null");
        break;
    }
}

char *wire_json_compact(const json_t *j)
{
    struct strbuf sb;
    /* Inputs are already-parsed, capped documents; the cap only guards against misuse. */
    strbuf_init(&sb, 64u * 1024 * 1024);
    if (j)
        compact_into(&sb, j);
    else
        (void)strbuf_puts(&sb, "null");
    return strbuf_take(&sb);
}
