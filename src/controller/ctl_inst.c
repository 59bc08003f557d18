#include "controller/ctl_inst.h"
#include "wire/wire_refresh.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const event_names[CTL_EV_COUNT] = {
    [CTL_EV_INIT] = "INIT",         [CTL_EV_NORMAL] = "NORMAL",
    [CTL_EV_ABNORMAL] = "ABNORMAL", [CTL_EV_HB_TIMEOUT] = "HEARTBEAT_TIMEOUT",
    [CTL_EV_PAUSED] = "PAUSED",     [CTL_EV_RESUMED] = "RESUMED",
};

const char *ctl_event_name(enum ctl_event ev)
{
    return (unsigned)ev < CTL_EV_COUNT ? event_names[ev] : "?";
}

/* -1 = no transition. Rows: initial, inactive, active, paused (wire enum order). */
#define NO -1
static const int table[5][CTL_EV_COUNT] = {
    /*                 INIT              NORMAL           ABNORMAL           HB_TIMEOUT
                       PAUSED            RESUMED */
    [WIRE_INS_INITIAL] = {WIRE_INS_INITIAL, WIRE_INS_ACTIVE, WIRE_INS_INACTIVE, WIRE_INS_DELETED,
                          WIRE_INS_PAUSED, NO},
    [WIRE_INS_ACTIVE] = {NO, WIRE_INS_ACTIVE, WIRE_INS_INACTIVE, WIRE_INS_INACTIVE, WIRE_INS_PAUSED,
                         NO},
    [WIRE_INS_INACTIVE] = {WIRE_INS_INITIAL, WIRE_INS_ACTIVE, WIRE_INS_INACTIVE, WIRE_INS_DELETED,
                           WIRE_INS_PAUSED, NO},
    [WIRE_INS_PAUSED] = {NO, WIRE_INS_ACTIVE, WIRE_INS_INACTIVE, WIRE_INS_DELETED, WIRE_INS_PAUSED,
                         WIRE_INS_ACTIVE},
    [WIRE_INS_DELETED] = {NO, NO, NO, NO, NO, NO},
};

int ctl_transition(enum wire_ins_status from, enum ctl_event ev, enum wire_ins_status *to)
{
    if ((unsigned)from > WIRE_INS_DELETED || (unsigned)ev >= CTL_EV_COUNT)
        return -ENOENT;
    int t = table[from][ev];
    if (t == NO)
        return -ENOENT;
    *to = (enum wire_ins_status)t;
    return 0;
}

/* ---- objects ------------------------------------------------------------------------ */

struct ctl_inst *ctl_inst_new(int64_t id)
{
    /* The only process-wide counter here: an id source, not shared state. */
    static _Atomic uint64_t next_incarnation = 1;
    struct ctl_inst *in = xcalloc(1, sizeof(*in));
    in->id = id;
    in->incarnation = next_incarnation++;
    in->status = WIRE_INS_INITIAL;
    in->nnodes = 1;
    in->multi_ep = true;
    in->ft_cap_consistent = true;
    wire_parallel_config_default(&in->pc);
    return in;
}

void ctl_nm_release(struct ctl_nm *nm)
{
    if (!nm)
        return;
    free(nm->pod_ip);
    free(nm->port);
    wire_endpoints_free(nm->eps, nm->n_eps);
    if (nm->reg) {
        wire_register_release(nm->reg);
        free(nm->reg);
    }
    memset(nm, 0, sizeof(*nm));
}

void ctl_inst_free(struct ctl_inst *in)
{
    if (!in)
        return;
    free(in->job_name);
    free(in->model_name);
    free(in->engine_type);
    wire_strlist_release(&in->dispatch_caps);
    for (size_t i = 0; i < in->n_nms; i++)
        ctl_nm_release(&in->nms[i]);
    free(in->nms);
    free(in->master_dp_ip);
    wire_ranktable_free(in->ranktable);
    free(in->published_sig);
    free(in->published_body);
    free(in);
}

size_t ctl_inst_n_endpoints(const struct ctl_inst *in)
{
    size_t n = 0;
    for (size_t i = 0; i < in->n_nms; i++)
        n += in->nms[i].n_eps;
    return n;
}

struct wire_endpoint *ctl_inst_endpoint(const struct ctl_inst *in, int64_t id, size_t *nm_idx)
{
    for (size_t i = 0; i < in->n_nms; i++) {
        for (size_t j = 0; j < in->nms[i].n_eps; j++) {
            if (in->nms[i].eps[j].id == id) {
                if (nm_idx)
                    *nm_idx = i;
                return &in->nms[i].eps[j];
            }
        }
    }
    return NULL;
}

ssize_t ctl_inst_find_nm(const struct ctl_inst *in, const char *pod_ip, const char *port)
{
    for (size_t i = 0; i < in->n_nms; i++) {
        const struct ctl_nm *nm = &in->nms[i];
        if (strcmp(nm->pod_ip, pod_ip) == 0 && (!port || strcmp(nm->port, port) == 0))
            return (ssize_t)i;
    }
    return -1;
}

ssize_t ctl_inst_find_nm_for_ids(const struct ctl_inst *in, const char *ip,
                                 const struct wire_hb_status *st, size_t n, const int64_t *retired,
                                 size_t n_retired)
{
    ssize_t first = -1;
    size_t same_ip = 0;
    for (size_t i = 0; i < in->n_nms; i++) {
        if (strcmp(in->nms[i].pod_ip, ip) != 0)
            continue;
        if (first < 0)
            first = (ssize_t)i;
        same_ip++;
    }
    if (same_ip <= 1)
        return first;
    if (n == 0) {
        for (size_t i = 0; i < in->n_nms; i++) {
            const struct ctl_nm *nm = &in->nms[i];
            if (strcmp(nm->pod_ip, ip) != 0)
                continue;
            size_t left = 0;
            for (size_t j = 0; j < nm->n_eps; j++)
                left += !ctl_ids_has(retired, n_retired, nm->eps[j].id);
            if (left == 0)
                return (ssize_t)i;
        }
        return first;
    }
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < in->n_nms; i++) {
            const struct ctl_nm *nm = &in->nms[i];
            if (strcmp(nm->pod_ip, ip) != 0)
                continue;
            for (size_t j = 0; j < nm->n_eps; j++)
                if (nm->eps[j].id == st[k].endpoint_id)
                    return (ssize_t)i;
        }
    }
    return first;
}

enum ctl_event ctl_inst_evaluate(const struct ctl_inst *in, const int64_t *retired,
                                 size_t n_retired)
{
    size_t total = 0, paused = 0, ok = 0, abnormal = 0;
    for (size_t i = 0; i < in->n_nms; i++) {
        for (size_t j = 0; j < in->nms[i].n_eps; j++) {
            const struct wire_endpoint *ep = &in->nms[i].eps[j];
            if (retired && ctl_ids_has(retired, n_retired, ep->id))
                continue;
            total++;
            switch (ep->status) {
            case WIRE_EP_PAUSED:
                paused++;
                break;
            case WIRE_EP_ABNORMAL:
                abnormal++;
                break;
            case WIRE_EP_NORMAL:
                ok++;
                break;
            case WIRE_EP_WAIT2START:
                if (ep->headless)
                    ok++;
                break;
            case WIRE_EP_INITIAL:
                break;
            }
        }
    }
    if (total == 0)
        return CTL_EV_INIT;
    if (paused == total)
        return CTL_EV_PAUSED;
    if (ok == total)
        return CTL_EV_NORMAL;
    if (abnormal > 0)
        return CTL_EV_ABNORMAL;
    if (paused > 0)
        return CTL_EV_PAUSED;
    return CTL_EV_INIT;
}

bool ctl_nm_is_member(const struct ctl_nm *nm, const int64_t *retired, size_t n_retired)
{
    if (nm->n_eps == 0)
        return true;
    for (size_t j = 0; j < nm->n_eps; j++)
        if (!retired || !ctl_ids_has(retired, n_retired, nm->eps[j].id))
            return true;
    return false;
}

void ctl_inst_freshness(const struct ctl_inst *in, int64_t now_ms, int64_t timeout_ms,
                        const int64_t *retired, size_t n_retired, struct ctl_freshness *out)
{
    *out = (struct ctl_freshness){.worst = -1};
    for (size_t i = 0; i < in->n_nms; i++) {
        if (!ctl_nm_is_member(&in->nms[i], retired, n_retired))
            continue;
        out->members++;
        int64_t age = now_ms - in->nms[i].last_hb_ms;
        if (age <= timeout_ms && !in->nms[i].unconfirmed) {
            out->fresh++;
            continue;
        }
        out->stale++;
        if (out->worst < 0 || age > out->worst_age_ms) {
            out->worst = (ssize_t)i;
            out->worst_age_ms = age;
        }
    }
}

int ctl_nm_check_hb_ids(const struct ctl_nm *nm, const struct wire_hb_status *st, size_t n,
                        const int64_t *may_miss, size_t n_may_miss, struct wire_err *err)
{
    /* Every reported id must be one of the pod's endpoints... */
    for (size_t k = 0; k < n; k++) {
        bool found = false;
        for (size_t j = 0; j < nm->n_eps && !found; j++)
            found = nm->eps[j].id == st[k].endpoint_id;
        if (!found) {
            wire_err_set(err, "status: endpoint %lld is not registered for pod %s",
                         (long long)st[k].endpoint_id, nm->pod_ip);
            return -EINVAL;
        }
    }
    /* ...and every endpoint must be reported unless it is a committed retired rank. */
    size_t missing = 0;
    for (size_t j = 0; j < nm->n_eps; j++) {
        bool found = false;
        for (size_t k = 0; k < n && !found; k++)
            found = st[k].endpoint_id == nm->eps[j].id;
        if (found)
            continue;
        if (may_miss && ctl_ids_has(may_miss, n_may_miss, nm->eps[j].id))
            continue;
        missing++;
    }
    if (missing) {
        wire_err_set(err, "status: %zu endpoint(s) reported, pod %s has %zu registered endpoint(s)",
                     n, nm->pod_ip, nm->n_eps);
        return -EINVAL;
    }
    return 0;
}

/* ---- id sets ----------------------------------------------------------------------- */

bool ctl_ids_has(const int64_t *v, size_t n, int64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == id)
            return true;
    return false;
}

void ctl_ids_add(int64_t **v, size_t *n, int64_t id)
{
    if (ctl_ids_has(*v, *n, id))
        return;
    *v = xrealloc(*v, (*n + 1) * sizeof(int64_t));
    size_t i = *n;
    while (i > 0 && (*v)[i - 1] > id) {
        (*v)[i] = (*v)[i - 1];
        i--;
    }
    (*v)[i] = id;
    (*n)++;
}

void ctl_ids_remove(int64_t *v, size_t *n, int64_t id)
{
    for (size_t i = 0; i < *n; i++) {
        if (v[i] == id) {
            memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(int64_t));
            (*n)--;
            return;
        }
    }
}

json_t *ctl_ids_json(const int64_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

int ctl_ids_parse(json_t *a, int64_t **v, size_t *n)
{
    *v = NULL;
    *n = 0;
    if (!a || json_is_null(a))
        return 0;
    if (!json_is_array(a) || json_array_size(a) > WIRE_LIST_MAX)
        return -EINVAL;
    size_t i;
    json_t *x;
    json_array_foreach(a, i, x)
    {
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            free(*v);
            *v = NULL;
            *n = 0;
            return -EINVAL;
        }
        ctl_ids_add(v, n, json_integer_value(x));
    }
    return 0;
}

/* ---- persistence ------------------------------------------------------------------- */

static json_t *nm_store_json(const struct ctl_nm *nm)
{
    json_t *eps = json_array();
    for (size_t j = 0; j < nm->n_eps; j++)
        json_array_append_new(eps, wire_endpoint_to_json(&nm->eps[j]));
    json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:b, s:o}", "pod_ip", nm->pod_ip, "port", nm->port,
                          "device_num", (json_int_t)nm->device_num, "node_rank",
                          (json_int_t)nm->node_rank, "start_ok", nm->start_ok, "endpoints", eps);
    if (nm->reg)
        json_object_set_new(o, "register", wire_register_to_json(nm->reg));
    return o;
}

json_t *ctl_inst_store_json(const struct ctl_inst *in)
{
    json_t *nms = json_array();
    for (size_t i = 0; i < in->n_nms; i++)
        json_array_append_new(nms, nm_store_json(&in->nms[i]));
    json_t *o = json_object();
    json_object_set_new(o, "id", json_integer(in->id));
    json_object_set_new(o, "job_name", json_string(in->job_name ? in->job_name : ""));
    json_object_set_new(o, "model_name", json_string(in->model_name ? in->model_name : ""));
    json_object_set_new(o, "engine_type",
                        in->engine_type ? json_string(in->engine_type) : json_null());
    json_object_set_new(o, "dispatch_capabilities", wire_strlist_to_json(&in->dispatch_caps));
    json_object_set_new(o, "ft_capability", wire_ft_capability_to_json(&in->ft_cap));
    json_object_set_new(o, "ft_capability_consistent", json_boolean(in->ft_cap_consistent));
    json_object_set_new(o, "role", json_string(wire_role_str(in->role)));
    json_object_set_new(o, "status", json_string(wire_ins_status_str(in->status)));
    json_object_set_new(o, "parallel_config", wire_parallel_config_to_json(&in->pc));
    json_object_set_new(o, "enable_multi_endpoints", json_boolean(in->multi_ep));
    json_object_set_new(o, "nnodes", json_integer(in->nnodes));
    if (in->master_dp_ip)
        json_object_set_new(o, "master_dp_ip", json_string(in->master_dp_ip));
    if (in->ranktable)
        json_object_set_new(o, "ranktable", wire_ranktable_to_json(in->ranktable));
    json_object_set_new(o, "assembled", json_boolean(in->assembled));
    json_object_set_new(o, "reregistered", json_boolean(in->reregistered));
    json_object_set_new(o, "start_pending", json_boolean(in->start_pending));
    json_object_set_new(o, "start_attempts", json_integer(in->start_attempts));
    json_object_set_new(o, "ever_ready", json_boolean(in->ever_ready));
    json_object_set_new(o, "separated", json_boolean(in->separated));
    json_object_set_new(o, "created_wall_ms", json_integer(in->created_wall_ms));
    json_object_set_new(o, "status_wall_ms", json_integer(in->status_wall_ms));
    json_object_set_new(o, "node_managers", nms);
    return o;
}

static char *dup_str(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

static bool get_bool(json_t *o, const char *key, bool def)
{
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : def;
}

static int64_t get_int(json_t *o, const char *key, int64_t def)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

static int nm_from_store(json_t *j, struct ctl_nm *nm, struct wire_err *err)
{
    memset(nm, 0, sizeof(*nm));
    nm->pod_ip = dup_str(j, "pod_ip");
    nm->port = dup_str(j, "port");
    if (!nm->pod_ip || !nm->port) {
        wire_err_set(err, "node_managers: pod_ip and port are required");
        return -EINVAL;
    }
    nm->device_num = get_int(j, "device_num", 0);
    nm->node_rank = get_int(j, "node_rank", 0);
    nm->start_ok = get_bool(j, "start_ok", false);
    json_t *eps = json_object_get(j, "endpoints");
    if (!json_is_array(eps)) {
        wire_err_set(err, "node_managers: endpoints must be an array");
        return -EINVAL;
    }
    nm->eps = xcalloc(json_array_size(eps) + 1, sizeof(*nm->eps));
    size_t i;
    json_t *x;
    json_array_foreach(eps, i, x)
    {
        if (wire_endpoint_parse(x, 0, &nm->eps[nm->n_eps], err) < 0)
            return -EINVAL;
        nm->n_eps++;
    }
    json_t *reg = json_object_get(j, "register");
    if (reg && !json_is_null(reg)) {
        nm->reg = xcalloc(1, sizeof(*nm->reg));
        if (wire_register_parse(reg, nm->reg, err) < 0) {
            free(nm->reg);
            nm->reg = NULL;
            return -EINVAL;
        }
    }
    return 0;
}

struct ctl_inst *ctl_inst_from_store_json(json_t *j, struct wire_err *err)
{
    if (!json_is_object(j) || !json_is_integer(json_object_get(j, "id"))) {
        wire_err_set(err, "instance: not an object with an integer id");
        return NULL;
    }
    struct ctl_inst *in = ctl_inst_new(json_integer_value(json_object_get(j, "id")));
    in->job_name = dup_str(j, "job_name");
    in->model_name = dup_str(j, "model_name");
    in->engine_type = dup_str(j, "engine_type");
    if (!in->job_name || !in->model_name)
        goto bad_field;
    json_t *caps = json_object_get(j, "dispatch_capabilities");
    size_t i;
    json_t *x;
    if (json_is_array(caps)) {
        json_array_foreach(caps, i, x)
        {
            if (json_is_string(x))
                wire_strlist_push(&in->dispatch_caps, json_string_value(x));
        }
    }
    json_t *fc = json_object_get(j, "ft_capability");
    if (fc && wire_ft_capability_parse(fc, &in->ft_cap, err) < 0)
        goto fail;
    in->ft_cap_consistent = get_bool(j, "ft_capability_consistent", true);
    if (wire_role_from_str(json_string_value(json_object_get(j, "role")), &in->role) < 0 ||
        wire_ins_status_from_str(json_string_value(json_object_get(j, "status")), &in->status) < 0)
        goto bad_field;
    json_t *pc = json_object_get(j, "parallel_config");
    if (pc && wire_parallel_config_parse(pc, &in->pc, err) < 0)
        goto fail;
    in->multi_ep = get_bool(j, "enable_multi_endpoints", true);
    in->nnodes = get_int(j, "nnodes", 1);
    in->master_dp_ip = dup_str(j, "master_dp_ip");
    json_t *rt = json_object_get(j, "ranktable");
    if (rt && !json_is_null(rt)) {
        in->ranktable = xcalloc(1, sizeof(*in->ranktable));
        if (wire_ranktable_parse(rt, in->ranktable, err) < 0) {
            free(in->ranktable);
            in->ranktable = NULL;
            goto fail;
        }
    }
    in->assembled = get_bool(j, "assembled", false);
    in->reregistered = get_bool(j, "reregistered", false);
    in->start_pending = get_bool(j, "start_pending", false);
    in->start_attempts = (int)get_int(j, "start_attempts", 0);
    in->ever_ready = get_bool(j, "ever_ready", false);
    in->separated = get_bool(j, "separated", false);
    in->created_wall_ms = get_int(j, "created_wall_ms", 0);
    in->status_wall_ms = get_int(j, "status_wall_ms", 0);
    json_t *nms = json_object_get(j, "node_managers");
    if (!json_is_array(nms))
        goto bad_field;
    in->nms = xcalloc(json_array_size(nms) + 1, sizeof(*in->nms));
    json_array_foreach(nms, i, x)
    {
        if (nm_from_store(x, &in->nms[in->n_nms], err) < 0) {
            ctl_nm_release(&in->nms[in->n_nms]);
            goto fail;
        }
        in->n_nms++;
    }
    return in;
bad_field:
    wire_err_set(err, "instance %lld: missing or malformed field", (long long)in->id);
fail:
    ctl_inst_free(in);
    return NULL;
}

json_t *ctl_inst_coord_json(const struct ctl_inst *in, const int64_t *exclude, size_t n_exclude,
                            int status)
{
    struct wire_refresh_pod *pods = xcalloc(in->n_nms + 1, sizeof(*pods));
    for (size_t i = 0; i < in->n_nms; i++) {
        const struct ctl_nm *nm = &in->nms[i];
        pods[i] = (struct wire_refresh_pod){.pod_ip = nm->pod_ip,
                                            .port = nm->port,
                                            .device_num = nm->device_num,
                                            .eps = nm->eps,
                                            .n_eps = nm->n_eps};
    }
    struct wire_refresh_out out = {
        .id = in->id,
        .job_name = in->job_name,
        .model_name = in->model_name,
        .engine_type = in->engine_type,
        .role = in->role,
        .status = status >= 0 ? (enum wire_ins_status)status : in->status,
        .dispatch_caps = &in->dispatch_caps,
        .pc = &in->pc,
        .multi_endpoints = in->multi_ep,
        .ft_cap = &in->ft_cap,
        .pods = pods,
        .n_pods = in->n_nms,
        .exclude = exclude,
        .n_exclude = n_exclude,
    };
    json_t *o = wire_refresh_instance_to_json(&out);
    free(pods);
    return o;
}

void ctl_inst_vec_push(struct ctl_inst ***v, size_t *n, struct ctl_inst *in)
{
    *v = xrealloc(*v, (*n + 1) * sizeof(**v));
    (*v)[(*n)++] = in;
}

void ctl_inst_vec_remove(struct ctl_inst **v, size_t *n, struct ctl_inst *in)
{
    for (size_t i = 0; i < *n; i++) {
        if (v[i] == in) {
            memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(*v));
            (*n)--;
            return;
        }
    }
}
