/* wire_msg — Controller <-> NodeManager messages. */
#include "wire/wire_msg.h"
#include "wire/wire_internal.h"

#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared pieces ------------------------------------------------------------------ */

static int ranktable_field(json_t *j, struct wire_ranktable **out, struct wire_err *err)
{
    json_t *v = json_object_get(j, "ranktable");
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v)) {
        wire_err_set(err, "ranktable: must be an object or null, got %s", jval_type_name(v));
        return -EINVAL;
    }
    struct wire_ranktable *rt = xcalloc(1, sizeof(*rt));
    struct wire_err sub = {{0}};
    if (wire_ranktable_parse(v, rt, &sub) < 0) {
        free(rt);
        /* Re-root the nested message under "ranktable". */
        wire_err_set(err, "ranktable.%s", sub.msg);
        return -EINVAL;
    }
    *out = rt;
    return 0;
}

static int endpoints_field(json_t *j, unsigned flags, struct wire_endpoint **out, size_t *n,
                           struct wire_err *err)
{
    json_t *arr;
    if (wj_array(j, "", "endpoints", WJ_REQ, &arr, err) < 0)
        return -EINVAL;
    if (wire_endpoint_list_parse_at(arr, "endpoints", flags, out, n, err) < 0)
        return -EINVAL;
    for (size_t i = 0; i < *n; i++) {
        for (size_t k = 0; k < i; k++) {
            if ((*out)[i].id == (*out)[k].id) {
                wire_err_set(err, "endpoints[%zu].id: duplicate endpoint id %" PRId64, i,
                             (*out)[i].id);
                wire_endpoints_free(*out, *n);
                *out = NULL;
                *n = 0;
                return -EINVAL;
            }
        }
    }
    return 0;
}

static json_t *endpoints_to_json(const struct wire_endpoint *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, wire_endpoint_to_json(&v[i]));
    return a;
}

static int parallel_field(json_t *j, struct wire_parallel_config *out, struct wire_err *err)
{
    wire_parallel_config_default(out);
    json_t *v = json_object_get(j, "parallel_config");
    if (!v || json_is_null(v))
        return 0;
    return wire_parallel_config_parse_at(v, "parallel_config", out, err);
}

static int ft_capability_field(json_t *j, struct wire_ft_capability *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    json_t *v = json_object_get(j, "ft_capability");
    if (!v || json_is_null(v))
        return 0;
    return wire_ft_capability_parse_at(v, "ft_capability", out, err);
}

/* ---- StartCmdMsg -------------------------------------------------------------------- */

int wire_start_cmd_parse(json_t *j, unsigned flags, struct wire_start_cmd *out,
                         struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str_nonempty(j, "", "job_name", WJ_REQ, &out->job_name, err) < 0 ||
        wj_role(j, "", "role", WJ_REQ, &out->role, err) < 0 ||
        wj_int(j, "", "instance_id", WJ_REQ, 0, WIRE_ID_MAX, &out->instance_id, err) < 0 ||
        endpoints_field(j, flags, &out->endpoints, &out->n_endpoints, err) < 0 ||
        wj_str(j, "", "master_dp_ip", WJ_OPT, &out->master_dp_ip, err) < 0 ||
        ranktable_field(j, &out->ranktable, err) < 0)
        goto fail;
    json_t *peers = json_object_get(j, "d2d_peer_ips");
    if (peers && !json_is_null(peers)) {
        if (wj_strlist(j, "", "d2d_peer_ips", WJ_OPT, false, &out->d2d_peer_ips, err) < 0)
            goto fail;
        out->has_d2d_peer_ips = true;
    }
    if (wj_int(j, "", "node_rank", WJ_OPT, 0, 65535, &out->node_rank, err) < 0)
        goto fail;
    return 0;
fail:
    wire_start_cmd_release(out);
    return -EINVAL;
}

json_t *wire_start_cmd_to_json(const struct wire_start_cmd *m)
{
    json_t *o = json_object();
    wj_set_str(o, "job_name", m->job_name ? m->job_name : "");
    wj_set_str(o, "role", wire_role_str(m->role));
    wj_set_int(o, "instance_id", m->instance_id);
    json_object_set_new(o, "endpoints", endpoints_to_json(m->endpoints, m->n_endpoints));
    wj_set_str(o, "master_dp_ip", m->master_dp_ip);
    if (m->ranktable)
        json_object_set_new(o, "ranktable", wire_ranktable_to_json(m->ranktable));
    if (m->has_d2d_peer_ips)
        json_object_set_new(o, "d2d_peer_ips", wire_strlist_to_json(&m->d2d_peer_ips));
    wj_set_int(o, "node_rank", m->node_rank);
    return o;
}

void wire_start_cmd_release(struct wire_start_cmd *m)
{
    if (!m)
        return;
    free(m->job_name);
    wire_endpoints_free(m->endpoints, m->n_endpoints);
    free(m->master_dp_ip);
    wire_ranktable_free(m->ranktable);
    wire_strlist_release(&m->d2d_peer_ips);
    memset(m, 0, sizeof(*m));
}

void wire_start_cmd_copy(struct wire_start_cmd *dst, const struct wire_start_cmd *src)
{
    *dst = *src;
    dst->job_name = xstrdup(src->job_name);
    dst->endpoints = xcalloc(src->n_endpoints + 1, sizeof(*dst->endpoints));
    for (size_t i = 0; i < src->n_endpoints; i++)
        wire_endpoint_copy(&dst->endpoints[i], &src->endpoints[i]);
    dst->master_dp_ip = xstrdup(src->master_dp_ip);
    dst->ranktable = wire_ranktable_dup(src->ranktable);
    wire_strlist_copy(&dst->d2d_peer_ips, &src->d2d_peer_ips);
}

void wire_d2d_peers_for(const struct wire_strlist *peers, int64_t endpoint_id,
                        struct wire_strlist *out)
{
    for (size_t i = 0; peers && i < peers->n; i++) {
        const char *e = peers->items[i];
        const char *colon = strchr(e, ':');
        if (!colon || colon == e)
            continue;
        char *id_text = xstrndup(e, (size_t)(colon - e));
        int64_t id;
        int rc = util_parse_i64(id_text, 0, WIRE_ID_MAX, &id);
        free(id_text);
        if (rc == 0 && id == endpoint_id)
            wire_strlist_push(out, colon + 1);
    }
}

/* ---- RegisterMsg -------------------------------------------------------------------- */

int wire_register_parse(json_t *j, struct wire_register *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    out->enable_multi_endpoints = true;
    out->nnodes = 1;
    int64_t bootstrap = 0;
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str_nonempty(j, "", "job_name", WJ_REQ, &out->job_name, err) < 0 ||
        wj_str(j, "", "model_name", WJ_OPT, &out->model_name, err) < 0 ||
        wj_str(j, "", "engine_type", WJ_OPT, &out->engine_type, err) < 0 ||
        wj_strlist(j, "", "dispatch_capabilities", WJ_OPT, false, &out->dispatch_capabilities,
                   err) < 0 ||
        ft_capability_field(j, &out->ft_capability, err) < 0 ||
        wj_role(j, "", "role", WJ_REQ, &out->role, err) < 0 ||
        wj_str_nonempty(j, "", "pod_ip", WJ_REQ, &out->pod_ip, err) < 0 ||
        wj_strlist(j, "", "business_port", WJ_REQ, true, &out->business_port, err) < 0 ||
        wj_int(j, "", "bootstrap_port", WJ_OPT, 1, 65535, &bootstrap, err) < 0 ||
        wj_portstr(j, "", "nm_port", WJ_REQ, &out->nm_port, err) < 0 ||
        parallel_field(j, &out->parallel_config, err) < 0 ||
        wj_bool(j, "", "enable_multi_endpoints", WJ_OPT, &out->enable_multi_endpoints, err) < 0 ||
        wj_int(j, "", "device_num", WJ_OPT, 0, WIRE_SIZE_MAX, &out->device_num, err) < 0 ||
        ranktable_field(j, &out->ranktable, err) < 0 ||
        wj_int(j, "", "nnodes", WJ_OPT, 1, WIRE_SIZE_MAX, &out->nnodes, err) < 0 ||
        wj_bool(j, "", "is_master", WJ_OPT, &out->is_master, err) < 0) {
        wire_register_release(out);
        return -EINVAL;
    }
    out->bootstrap_port = (int)bootstrap;
    if (!out->model_name)
        out->model_name = xstrdup("");
    return 0;
}

json_t *wire_register_to_json(const struct wire_register *m)
{
    json_t *o = json_object();
    wj_set_str(o, "job_name", m->job_name ? m->job_name : "");
    wj_set_str(o, "model_name", m->model_name ? m->model_name : "");
    wj_set_str(o, "engine_type", m->engine_type);
    json_object_set_new(o, "dispatch_capabilities",
                        wire_strlist_to_json(&m->dispatch_capabilities));
    json_object_set_new(o, "ft_capability", wire_ft_capability_to_json(&m->ft_capability));
    wj_set_str(o, "role", wire_role_str(m->role));
    wj_set_str(o, "pod_ip", m->pod_ip ? m->pod_ip : "");
    json_object_set_new(o, "business_port", wire_strlist_to_json(&m->business_port));
    if (m->bootstrap_port > 0)
        wj_set_int(o, "bootstrap_port", m->bootstrap_port);
    wj_set_str(o, "nm_port", m->nm_port ? m->nm_port : "");
    json_object_set_new(o, "parallel_config", wire_parallel_config_to_json(&m->parallel_config));
    json_object_set_new(o, "enable_multi_endpoints", json_boolean(m->enable_multi_endpoints));
    wj_set_int(o, "device_num", m->device_num);
    if (m->ranktable)
        json_object_set_new(o, "ranktable", wire_ranktable_to_json(m->ranktable));
    wj_set_int(o, "nnodes", m->nnodes);
    json_object_set_new(o, "is_master", json_boolean(m->is_master));
    return o;
}

void wire_register_release(struct wire_register *m)
{
    if (!m)
        return;
    free(m->job_name);
    free(m->model_name);
    free(m->engine_type);
    wire_strlist_release(&m->dispatch_capabilities);
    free(m->pod_ip);
    wire_strlist_release(&m->business_port);
    free(m->nm_port);
    wire_ranktable_free(m->ranktable);
    memset(m, 0, sizeof(*m));
}

/* ---- ReregisterMsg ------------------------------------------------------------------ */

int wire_reregister_parse(json_t *j, unsigned flags, struct wire_reregister *out,
                          struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    out->enable_multi_endpoints = true;
    out->nnodes = 1;
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str_nonempty(j, "", "job_name", WJ_REQ, &out->job_name, err) < 0 ||
        wj_str(j, "", "model_name", WJ_OPT, &out->model_name, err) < 0 ||
        wj_str(j, "", "engine_type", WJ_OPT, &out->engine_type, err) < 0 ||
        wj_strlist(j, "", "dispatch_capabilities", WJ_OPT, false, &out->dispatch_capabilities,
                   err) < 0 ||
        ft_capability_field(j, &out->ft_capability, err) < 0 ||
        wj_int(j, "", "instance_id", WJ_REQ, 0, WIRE_ID_MAX, &out->instance_id, err) < 0 ||
        wj_role(j, "", "role", WJ_REQ, &out->role, err) < 0 ||
        wj_str_nonempty(j, "", "pod_ip", WJ_REQ, &out->pod_ip, err) < 0 ||
        wj_portstr(j, "", "nm_port", WJ_REQ, &out->nm_port, err) < 0 ||
        parallel_field(j, &out->parallel_config, err) < 0 ||
        wj_bool(j, "", "enable_multi_endpoints", WJ_OPT, &out->enable_multi_endpoints, err) < 0 ||
        wj_int(j, "", "device_num", WJ_OPT, 0, WIRE_SIZE_MAX, &out->device_num, err) < 0 ||
        endpoints_field(j, flags, &out->endpoints, &out->n_endpoints, err) < 0 ||
        wj_int(j, "", "nnodes", WJ_OPT, 1, WIRE_SIZE_MAX, &out->nnodes, err) < 0 ||
        wj_int(j, "", "node_rank", WJ_OPT, 0, 65535, &out->node_rank, err) < 0) {
        wire_reregister_release(out);
        return -EINVAL;
    }
    if (!out->model_name)
        out->model_name = xstrdup("");
    return 0;
}

json_t *wire_reregister_to_json(const struct wire_reregister *m)
{
    json_t *o = json_object();
    wj_set_str(o, "job_name", m->job_name ? m->job_name : "");
    wj_set_str(o, "model_name", m->model_name ? m->model_name : "");
    wj_set_str(o, "engine_type", m->engine_type);
    json_object_set_new(o, "dispatch_capabilities",
                        wire_strlist_to_json(&m->dispatch_capabilities));
    json_object_set_new(o, "ft_capability", wire_ft_capability_to_json(&m->ft_capability));
    wj_set_int(o, "instance_id", m->instance_id);
    wj_set_str(o, "role", wire_role_str(m->role));
    wj_set_str(o, "pod_ip", m->pod_ip ? m->pod_ip : "");
    wj_set_str(o, "nm_port", m->nm_port ? m->nm_port : "");
    json_object_set_new(o, "parallel_config", wire_parallel_config_to_json(&m->parallel_config));
    json_object_set_new(o, "enable_multi_endpoints", json_boolean(m->enable_multi_endpoints));
    wj_set_int(o, "device_num", m->device_num);
    json_object_set_new(o, "endpoints", endpoints_to_json(m->endpoints, m->n_endpoints));
    wj_set_int(o, "nnodes", m->nnodes);
    wj_set_int(o, "node_rank", m->node_rank);
    return o;
}

void wire_reregister_release(struct wire_reregister *m)
{
    if (!m)
        return;
    free(m->job_name);
    free(m->model_name);
    free(m->engine_type);
    wire_strlist_release(&m->dispatch_capabilities);
    free(m->pod_ip);
    free(m->nm_port);
    wire_endpoints_free(m->endpoints, m->n_endpoints);
    memset(m, 0, sizeof(*m));
}

/* ---- HeartbeatMsg ------------------------------------------------------------------- */

int wire_heartbeat_parse(json_t *j, struct wire_heartbeat *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    json_t *st = NULL;
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str_nonempty(j, "", "job_name", WJ_REQ, &out->job_name, err) < 0 ||
        wj_int(j, "", "ins_id", WJ_REQ, 0, WIRE_ID_MAX, &out->ins_id, err) < 0 ||
        wj_str_nonempty(j, "", "ip", WJ_REQ, &out->ip, err) < 0 ||
        wj_object(j, "", "status", WJ_REQ, &st, err) < 0)
        goto fail;
    if (json_object_size(st) > WIRE_LIST_MAX) {
        wire_err_set(err, "status: too many endpoints (%zu, max %d)", json_object_size(st),
                     WIRE_LIST_MAX);
        goto fail;
    }
    out->status = xcalloc(json_object_size(st) + 1, sizeof(*out->status));
    const char *key;
    json_t *v;
    json_object_foreach(st, key, v)
    {
        int64_t id;
        bool digits = *key != '\0';
        for (const char *c = key; *c; c++)
            digits = digits && *c >= '0' && *c <= '9';
        if (!digits || util_parse_i64(key, 0, WIRE_ID_MAX, &id) < 0) {
            wire_err_set(err, "status: key \"%.40s\" is not an endpoint id", key);
            goto fail;
        }
        for (size_t i = 0; i < out->n_status; i++) {
            if (out->status[i].endpoint_id == id) {
                wire_err_set(err, "status: duplicate endpoint id %" PRId64, id);
                goto fail;
            }
        }
        if (!json_is_string(v) ||
            wire_ep_status_from_str(json_string_value(v), &out->status[out->n_status].status) < 0) {
            wire_err_set(err,
                         "status.%.40s: must be one of \"initial\", \"normal\", \"abnormal\", "
                         "\"paused\", \"wait2start\"",
                         key);
            goto fail;
        }
        out->status[out->n_status++].endpoint_id = id;
    }
    return 0;
fail:
    wire_heartbeat_release(out);
    return -EINVAL;
}

json_t *wire_heartbeat_to_json(const struct wire_heartbeat *m)
{
    json_t *o = json_object();
    wj_set_str(o, "job_name", m->job_name ? m->job_name : "");
    wj_set_int(o, "ins_id", m->ins_id);
    wj_set_str(o, "ip", m->ip ? m->ip : "");
    json_t *st = json_object();
    for (size_t i = 0; i < m->n_status; i++) {
        char key[24];
        snprintf(key, sizeof(key), "%" PRId64, m->status[i].endpoint_id);
        json_object_set_new(st, key, json_string(wire_ep_status_str(m->status[i].status)));
    }
    json_object_set_new(o, "status", st);
    return o;
}

void wire_heartbeat_release(struct wire_heartbeat *m)
{
    if (!m)
        return;
    free(m->job_name);
    free(m->ip);
    free(m->status);
    memset(m, 0, sizeof(*m));
}

/* ---- software-fault report ---------------------------------------------------------- */

int wire_fault_report_parse(json_t *j, struct wire_fault_report *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    int64_t status = 0, nm_port = 0;
    json_t *info = NULL;
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (wj_str(j, "", "exception_type", WJ_OPT, &out->exception_type, err) < 0 ||
        wj_str(j, "", "exception_message", WJ_OPT, &out->exception_message, err) < 0 ||
        wj_int(j, "", "engine_id", WJ_REQ, 0, WIRE_ID_MAX, &out->engine_id, err) < 0 ||
        wj_int(j, "", "engine_status", WJ_REQ, 0, 2, &status, err) < 0 ||
        wj_str_nonempty(j, "", "pod_ip", WJ_REQ, &out->pod_ip, err) < 0)
        goto fail;
    out->engine_status = (enum wire_engine_status)status;
    json_t *iid = json_object_get(j, "instance_id");
    if (iid && !json_is_null(iid)) {
        if (wj_int(j, "", "instance_id", WJ_OPT, 0, WIRE_ID_MAX, &out->instance_id, err) < 0)
            goto fail;
        out->has_instance_id = true;
    }
    if (wj_int(j, "", "node_manager_port", WJ_OPT, 1, 65535, &nm_port, err) < 0 ||
        wj_object(j, "", "additional_info", WJ_OPT, &info, err) < 0)
        goto fail;
    out->node_manager_port = (int)nm_port;
    if (info)
        out->additional_info = json_deep_copy(info);
    if (!out->exception_type)
        out->exception_type = xstrdup("");
    if (!out->exception_message)
        out->exception_message = xstrdup("");
    return 0;
fail:
    wire_fault_report_release(out);
    return -EINVAL;
}

json_t *wire_fault_report_to_json(const struct wire_fault_report *m)
{
    json_t *o = json_object();
    wj_set_str(o, "exception_type", m->exception_type ? m->exception_type : "");
    wj_set_str(o, "exception_message", m->exception_message ? m->exception_message : "");
    wj_set_int(o, "engine_id", m->engine_id);
    wj_set_int(o, "engine_status", (int64_t)m->engine_status);
    wj_set_str(o, "pod_ip", m->pod_ip ? m->pod_ip : "");
    if (m->has_instance_id)
        wj_set_int(o, "instance_id", m->instance_id);
    if (m->node_manager_port > 0)
        wj_set_int(o, "node_manager_port", m->node_manager_port);
    if (m->additional_info)
        json_object_set_new(o, "additional_info", json_deep_copy(m->additional_info));
    return o;
}

void wire_fault_report_release(struct wire_fault_report *m)
{
    if (!m)
        return;
    free(m->exception_type);
    free(m->exception_message);
    free(m->pod_ip);
    json_decref(m->additional_info);
    memset(m, 0, sizeof(*m));
}

/* ---- envelopes ---------------------------------------------------------------------- */

static json_t *envelope_body(int code, const char *message, json_t *data)
{
    json_t *o = json_object();
    wj_set_int(o, "code", code);
    wj_set_str(o, "message", message ? message : "");
    json_object_set_new(o, "data", data ? data : json_object());
    return o;
}

json_t *wire_envelope_new(int code, const char *message, json_t *data)
{
    return envelope_body(code, message, data);
}

json_t *wire_envelope_error_new(int code, const char *message, json_t *data)
{
    json_t *o = json_object();
    json_object_set_new(o, "detail", envelope_body(code, message, data));
    return o;
}

bool wire_envelope_accepted(const json_t *body)
{
    if (!json_is_object(body))
        return false;
    json_t *data = json_object_get(body, "data");
    return json_is_object(data) && json_is_true(json_object_get(data, "accepted"));
}

bool wire_register_reply_ok(const json_t *body)
{
    return json_is_object(body) && !json_object_get(body, "error");
}
