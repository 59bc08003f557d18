/* wire_ranktable — HCCL ranktable parse/serialize/write. */
#include "wire/wire_ranktable.h"
#include "wire/wire_internal.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define RANKTABLE_FILE_MAX (16u * 1024 * 1024)

static void server_release(struct wire_rt_server *s)
{
    free(s->server_id);
    free(s->container_ip);
    for (size_t i = 0; i < s->n_devices; i++)
        wire_device_info_release(&s->devices[i]);
    free(s->devices);
    memset(s, 0, sizeof(*s));
}

static int server_parse(json_t *j, const char *path, struct wire_rt_server *out,
                        struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    json_t *devs = NULL;
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (wj_numstr(j, path, "server_id", WJ_REQ, &out->server_id, err) < 0 ||
        wj_str(j, path, "container_ip", WJ_OPT, &out->container_ip, err) < 0 ||
        wj_array(j, path, "device", WJ_OPT, &devs, err) < 0)
        goto fail;
    if (devs) {
        char p[WIRE_PATH_MAX];
        if (wire_device_list_parse_at(devs, wj_path_key(p, sizeof(p), path, "device"),
                                      &out->devices, &out->n_devices, err) < 0)
            goto fail;
    }
    return 0;
fail:
    server_release(out);
    return -EINVAL;
}

int wire_ranktable_parse(json_t *j, struct wire_ranktable *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    json_t *list = NULL;
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_numstr(j, "", "version", WJ_OPT, &out->version, err) < 0 ||
        wj_str(j, "", "status", WJ_OPT, &out->status, err) < 0 ||
        wj_numstr(j, "", "server_count", WJ_OPT, &out->server_count, err) < 0 ||
        wj_array(j, "", "server_list", WJ_REQ, &list, err) < 0)
        goto fail;
    size_t n = json_array_size(list);
    out->servers = xcalloc(n + 1, sizeof(*out->servers));
    char p[WIRE_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        if (server_parse(json_array_get(list, i), wj_path_idx(p, sizeof(p), "server_list", i),
                         &out->servers[i], err) < 0)
            goto fail;
        out->n_servers = i + 1;
    }
    return 0;
fail:
    wire_ranktable_release(out);
    return -EINVAL;
}

json_t *wire_ranktable_to_json(const struct wire_ranktable *rt)
{
    json_t *o = json_object();
    wj_set_str(o, "version", rt->version);
    wj_set_str(o, "status", rt->status);
    wj_set_str(o, "server_count", rt->server_count);
    json_t *list = json_array();
    for (size_t i = 0; i < rt->n_servers; i++) {
        const struct wire_rt_server *s = &rt->servers[i];
        json_t *so = json_object();
        wj_set_str(so, "server_id", s->server_id);
        wj_set_str(so, "container_ip", s->container_ip);
        json_t *devs = json_array();
        for (size_t k = 0; k < s->n_devices; k++)
            json_array_append_new(devs, wire_device_info_to_json(&s->devices[k]));
        json_object_set_new(so, "device", devs);
        json_array_append_new(list, so);
    }
    json_object_set_new(o, "server_list", list);
    return o;
}

void wire_ranktable_release(struct wire_ranktable *rt)
{
    if (!rt)
        return;
    free(rt->version);
    free(rt->status);
    free(rt->server_count);
    for (size_t i = 0; i < rt->n_servers; i++)
        server_release(&rt->servers[i]);
    free(rt->servers);
    memset(rt, 0, sizeof(*rt));
}

void wire_ranktable_free(struct wire_ranktable *rt)
{
    wire_ranktable_release(rt);
    free(rt);
}

struct wire_ranktable *wire_ranktable_dup(const struct wire_ranktable *src)
{
    if (!src)
        return NULL;
    struct wire_ranktable *rt = xcalloc(1, sizeof(*rt));
    rt->version = xstrdup(src->version);
    rt->status = xstrdup(src->status);
    rt->server_count = xstrdup(src->server_count);
    rt->servers = xcalloc(src->n_servers + 1, sizeof(*rt->servers));
    rt->n_servers = src->n_servers;
    for (size_t i = 0; i < src->n_servers; i++) {
        const struct wire_rt_server *s = &src->servers[i];
        struct wire_rt_server *d = &rt->servers[i];
        d->server_id = xstrdup(s->server_id);
        d->container_ip = xstrdup(s->container_ip);
        d->devices = xcalloc(s->n_devices + 1, sizeof(*d->devices));
        d->n_devices = s->n_devices;
        for (size_t k = 0; k < s->n_devices; k++)
            wire_device_info_copy(&d->devices[k], &s->devices[k]);
    }
    return rt;
}

int wire_ranktable_load_file(const char *path, struct wire_ranktable *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    size_t len = 0;
    char *data = util_read_file(path, RANKTABLE_FILE_MAX, &len);
    if (!data) {
        int e = errno ? errno : EIO;
        wire_err_set(err, "%s: cannot read: %s", path, strerror(e));
        return -e;
    }
    json_error_t jerr;
    json_t *j = json_loadb(data, len, 0, &jerr);
    free(data);
    if (!j) {
        wire_err_set(err, "%s: line %d, column %d: %s", path, jerr.line, jerr.column, jerr.text);
        return -EINVAL;
    }
    struct wire_err sub;
    int rc = wire_ranktable_parse(j, out, &sub);
    json_decref(j);
    if (rc < 0)
        wire_err_set(err, "%s: %s", path, sub.msg);
    return rc;
}

int wire_ranktable_write_file(const struct wire_ranktable *rt, const char *path)
{
    json_t *j = wire_ranktable_to_json(rt);
    char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text)
        return -ENOMEM;
    size_t n = strlen(text);
    char *withnl = xmalloc(n + 2);
    memcpy(withnl, text, n);
    withnl[n] = '\n';
    withnl[n + 1] = '\0';
    free(text);
    int rc = util_write_file_atomic(path, withnl, n + 1, 0644);
    free(withnl);
    return rc;
}
