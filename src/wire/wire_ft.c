/* wire_ft — FT proxy bodies, engine-restart body, engine FT status entries. */
#include "wire/wire_ft.h"
#include "wire/wire_internal.h"

#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static const char *const instruction_names[] = {"retry", "scale_down"};

int wire_ft_instruction_from_str(const char *s, enum wire_ft_instruction *out)
{
    for (size_t i = 0; s && i < ARRAY_LEN(instruction_names); i++) {
        if (strcmp(s, instruction_names[i]) == 0) {
            *out = (enum wire_ft_instruction)i;
            return 0;
        }
    }
    return -EINVAL;
}

const char *wire_ft_instruction_str(enum wire_ft_instruction i)
{
    return (unsigned)i < ARRAY_LEN(instruction_names) ? instruction_names[i] : "?";
}

/* -ERANGE with a message when ids repeat. */
static int check_unique(const int64_t *ids, size_t n, const char *key, struct wire_err *err)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < i; k++) {
            if (ids[i] == ids[k]) {
                wire_err_set(err, "%s: duplicate endpoint id %" PRId64, key, ids[i]);
                return -ERANGE;
            }
        }
    }
    return 0;
}

static int id_list(json_t *j, const char *key, bool nonempty, int64_t **ids, size_t *n,
                   struct wire_err *err)
{
    if (wj_intlist(j, "", key, WJ_REQ, 0, WIRE_ID_MAX, ids, n, err) < 0)
        return -EINVAL;
    if (nonempty && *n == 0) {
        wire_err_set(err, "%s: must not be empty", key);
        return -EINVAL;
    }
    return check_unique(*ids, *n, key, err);
}

static json_t *id_list_json(const int64_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)ids[i]));
    return a;
}

/* ---- status ------------------------------------------------------------------------- */

int wire_ft_status_req_parse(json_t *j, struct wire_ft_status_req *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    int rc = wj_require_object(j, "", err);
    if (rc == 0)
        rc = id_list(j, "endpoint_ids", true, &out->endpoint_ids, &out->n_endpoint_ids, err);
    if (rc < 0)
        wire_ft_status_req_release(out);
    return rc;
}

json_t *wire_ft_status_req_to_json(const struct wire_ft_status_req *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "endpoint_ids", id_list_json(r->endpoint_ids, r->n_endpoint_ids));
    return o;
}

void wire_ft_status_req_release(struct wire_ft_status_req *r)
{
    if (!r)
        return;
    free(r->endpoint_ids);
    memset(r, 0, sizeof(*r));
}

/* ---- apply -------------------------------------------------------------------------- */

int wire_ft_apply_req_parse(json_t *j, struct wire_ft_apply_req *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    char *instr = NULL;
    json_t *params = NULL;
    int rc = wj_require_object(j, "", err);
    if (rc < 0)
        goto out;
    rc = -EINVAL;
    if (wj_intlist(j, "", "endpoint_ids", WJ_REQ, 0, WIRE_ID_MAX, &out->endpoint_ids,
                   &out->n_endpoint_ids, err) < 0)
        goto out;
    if (out->n_endpoint_ids == 0) {
        wire_err_set(err, "endpoint_ids: must not be empty");
        goto out;
    }
    if (wj_str(j, "", "instruction", WJ_REQ, &instr, err) < 0)
        goto out;
    if (wire_ft_instruction_from_str(instr, &out->instruction) < 0) {
        wire_err_set(err, "instruction: must be \"retry\" or \"scale_down\", got \"%.40s\"", instr);
        goto out;
    }
    if (wj_object(j, "", "params", WJ_OPT, &params, err) < 0)
        goto out;
    if (wj_str(j, "", "request_id", WJ_REQ, &out->request_id, err) < 0)
        goto out;
    out->params = params ? json_deep_copy(params) : json_object();
    /* Value rules last, so that any shape error is reported as such (400) first. */
    rc = check_unique(out->endpoint_ids, out->n_endpoint_ids, "endpoint_ids", err);
    if (rc == 0 && !*out->request_id) {
        wire_err_set(err, "request_id: must not be empty");
        rc = -ERANGE;
    }
out:
    free(instr);
    if (rc < 0)
        wire_ft_apply_req_release(out);
    return rc;
}

json_t *wire_ft_apply_req_to_json(const struct wire_ft_apply_req *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "endpoint_ids", id_list_json(r->endpoint_ids, r->n_endpoint_ids));
    wj_set_str(o, "instruction", wire_ft_instruction_str(r->instruction));
    json_object_set_new(o, "params", r->params ? json_deep_copy(r->params) : json_object());
    wj_set_str(o, "request_id", r->request_id ? r->request_id : "");
    return o;
}

void wire_ft_apply_req_release(struct wire_ft_apply_req *r)
{
    if (!r)
        return;
    free(r->endpoint_ids);
    json_decref(r->params);
    free(r->request_id);
    memset(r, 0, sizeof(*r));
}

json_t *wire_ft_apply_engine_body(const struct wire_ft_apply_req *r, int dp_master_port,
                                  struct wire_err *err)
{
    json_t *params = r->params ? json_deep_copy(r->params) : json_object();
    if (r->instruction == WIRE_FT_SCALE_DOWN) {
        int64_t rank = 0;
        if (wj_int(params, "params", "dp_master_rank", WJ_OPT, 0, WIRE_ID_MAX, &rank, err) < 0) {
            json_decref(params);
            return NULL;
        }
        int64_t port = (int64_t)dp_master_port + rank;
        if (dp_master_port < 1 || port > 65535) {
            wire_err_set(err,
                         "params.dp_master_rank: dp_store_port = dp_master_port %d + rank %" PRId64
                         " is not a valid port",
                         dp_master_port, rank);
            json_decref(params);
            return NULL;
        }
        json_object_del(params, "dp_master_rank");
        json_object_set_new(params, "dp_store_port", json_integer((json_int_t)port));
    }
    json_t *o = json_object();
    wj_set_str(o, "instruction", wire_ft_instruction_str(r->instruction));
    json_object_set_new(o, "params", params);
    wj_set_str(o, "request_id", r->request_id ? r->request_id : "");
    return o;
}

/* ---- guard -------------------------------------------------------------------------- */

int wire_ft_guard_req_parse(json_t *j, struct wire_ft_guard_req *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    int rc = wj_require_object(j, "", err);
    if (rc < 0)
        return rc;
    json_t *lease = json_object_get(j, "lease_sec");
    if (wj_str(j, "", "request_id", WJ_REQ, &out->request_id, err) < 0) {
        rc = -EINVAL;
    } else if (!lease || json_is_null(lease)) {
        wire_err_set(err, "lease_sec: missing");
        rc = -EINVAL;
    } else if (!json_is_number(lease)) {
        wire_err_set(err, "lease_sec: must be a number, got %s", jval_type_name(lease));
        rc = -EINVAL;
    } else if (!*out->request_id) {
        wire_err_set(err, "request_id: must not be empty");
        rc = -ERANGE;
    } else {
        double d = json_number_value(lease);
        if (!(d > 0 && d <= WIRE_FT_LEASE_MAX_SEC)) {
            char got[40];
            wire_fmt_double(d, got, sizeof(got));
            wire_err_set(err, "lease_sec: must be in (0, 300], got %s", got);
            rc = -ERANGE;
        } else {
            out->lease_sec = d;
        }
    }
    if (rc < 0)
        wire_ft_guard_req_release(out);
    return rc;
}

json_t *wire_ft_guard_req_to_json(const struct wire_ft_guard_req *r)
{
    json_t *o = json_object();
    wj_set_str(o, "request_id", r->request_id ? r->request_id : "");
    json_object_set_new(o, "lease_sec", json_real(r->lease_sec));
    return o;
}

void wire_ft_guard_req_release(struct wire_ft_guard_req *r)
{
    if (!r)
        return;
    free(r->request_id);
    memset(r, 0, sizeof(*r));
}

/* ---- finalize ----------------------------------------------------------------------- */

int wire_ft_finalize_req_parse(json_t *j, struct wire_ft_finalize_req *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    int rc = wj_require_object(j, "", err);
    if (rc < 0)
        return rc;
    rc = -EINVAL;
    json_t *rank = json_object_get(j, "dp_master_rank");
    if (wj_str(j, "", "request_id", WJ_REQ, &out->request_id, err) < 0 ||
        wj_intlist(j, "", "retired_endpoint_ids", WJ_REQ, 0, WIRE_ID_MAX,
                   &out->retired_endpoint_ids, &out->n_retired, err) < 0 ||
        wj_bool(j, "", "commit", WJ_REQ, &out->commit, err) < 0)
        goto out;
    if (rank && !json_is_null(rank)) {
        if (wj_int(j, "", "dp_master_rank", WJ_OPT, 0, WIRE_ID_MAX, &out->dp_master_rank, err) < 0)
            goto out;
        out->has_dp_master_rank = true;
    }
    rc = check_unique(out->retired_endpoint_ids, out->n_retired, "retired_endpoint_ids", err);
    if (rc == 0 && !*out->request_id) {
        wire_err_set(err, "request_id: must not be empty");
        rc = -ERANGE;
    }
out:
    if (rc < 0)
        wire_ft_finalize_req_release(out);
    return rc;
}

json_t *wire_ft_finalize_req_to_json(const struct wire_ft_finalize_req *r)
{
    json_t *o = json_object();
    wj_set_str(o, "request_id", r->request_id ? r->request_id : "");
    json_object_set_new(o, "retired_endpoint_ids",
                        id_list_json(r->retired_endpoint_ids, r->n_retired));
    json_object_set_new(o, "commit", json_boolean(r->commit));
    if (r->has_dp_master_rank)
        wj_set_int(o, "dp_master_rank", r->dp_master_rank);
    return o;
}

void wire_ft_finalize_req_release(struct wire_ft_finalize_req *r)
{
    if (!r)
        return;
    free(r->request_id);
    free(r->retired_endpoint_ids);
    memset(r, 0, sizeof(*r));
}

/* ---- engine-restart ----------------------------------------------------------------- */

int wire_engine_restart_req_parse(json_t *j, struct wire_engine_restart_req *out,
                                  struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    char *action = NULL;
    int rc = wj_require_object(j, "", err);
    if (rc < 0)
        return rc;
    rc = -EINVAL;
    if (wj_str(j, "", "action", WJ_REQ, &action, err) < 0)
        goto out;
    if (strcmp(action, "restart") == 0) {
        out->action = WIRE_RESTART;
    } else if (strcmp(action, "abort") == 0) {
        out->action = WIRE_RESTART_ABORT;
    } else {
        wire_err_set(err, "action: must be \"restart\" or \"abort\", got \"%.40s\"", action);
        goto out;
    }
    json_t *iid = json_object_get(j, "instance_id");
    if (iid && !json_is_null(iid)) {
        if (wj_int(j, "", "instance_id", WJ_OPT, 0, WIRE_ID_MAX, &out->instance_id, err) < 0)
            goto out;
        out->has_instance_id = true;
    }
    rc = 0;
out:
    free(action);
    if (rc < 0)
        memset(out, 0, sizeof(*out));
    return rc;
}

json_t *wire_engine_restart_req_to_json(const struct wire_engine_restart_req *r)
{
    json_t *o = json_object();
    wj_set_str(o, "action", r->action == WIRE_RESTART_ABORT ? "abort" : "restart");
    if (r->has_instance_id)
        wj_set_int(o, "instance_id", r->instance_id);
    return o;
}

/* ---- engine FT status entries ------------------------------------------------------- */

static json_t *any_field(json_t *j, const char *key)
{
    json_t *v = json_object_get(j, key);
    return (v && !json_is_null(v)) ? json_deep_copy(v) : NULL;
}

static int entry_parse_at(json_t *j, const char *path, bool id_required, int64_t default_id,
                          struct wire_ft_engine_entry *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    out->id = default_id;
    if (wj_require_object(j, path, err) < 0)
        return -EINVAL;
    if (wj_int(j, path, "id", id_required ? WJ_REQ : WJ_OPT, 0, WIRE_ID_MAX, &out->id, err) < 0 ||
        wj_str(j, path, "status", WJ_REQ, &out->status, err) < 0 ||
        wj_str(j, path, "ft_state", WJ_OPT, &out->ft_state, err) < 0 ||
        wj_str(j, path, "last_ft_request_id", WJ_OPT, &out->last_ft_request_id, err) < 0 ||
        wj_str(j, path, "source", WJ_OPT, &out->source, err) < 0) {
        wire_ft_engine_entry_release(out);
        return -EINVAL;
    }
    static const char *const names[] = {"healthy", "unhealthy", "dead", "unknown"};
    out->state = WIRE_FT_OTHER;
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        if (strcmp(out->status, names[i]) == 0)
            out->state = (enum wire_ft_engine_state)i;
    out->fault_info = any_field(j, "fault_info");
    out->ft_error = any_field(j, "ft_error");
    out->mask = any_field(j, "mask");
    return 0;
}

int wire_ft_engine_entry_parse(json_t *j, struct wire_ft_engine_entry *out, struct wire_err *err)
{
    return entry_parse_at(j, "", true, 0, out, err);
}

json_t *wire_ft_engine_entry_to_json(const struct wire_ft_engine_entry *e)
{
    json_t *o = json_object();
    wj_set_int(o, "id", e->id);
    wj_set_str(o, "status", e->status ? e->status : "");
    if (e->fault_info)
        json_object_set_new(o, "fault_info", json_deep_copy(e->fault_info));
    wj_set_str(o, "ft_state", e->ft_state);
    wj_set_str(o, "last_ft_request_id", e->last_ft_request_id);
    if (e->ft_error)
        json_object_set_new(o, "ft_error", json_deep_copy(e->ft_error));
    if (e->mask)
        json_object_set_new(o, "mask", json_deep_copy(e->mask));
    wj_set_str(o, "source", e->source);
    return o;
}

void wire_ft_engine_entry_release(struct wire_ft_engine_entry *e)
{
    if (!e)
        return;
    free(e->status);
    json_decref(e->fault_info);
    free(e->ft_state);
    free(e->last_ft_request_id);
    json_decref(e->ft_error);
    json_decref(e->mask);
    free(e->source);
    memset(e, 0, sizeof(*e));
}

char *wire_ft_engine_entry_signature(const struct wire_ft_engine_entry *e)
{
    json_t *a = json_array();
    json_array_append_new(a, e->status ? json_string(e->status) : json_null());
    json_array_append_new(a, e->fault_info ? json_incref(e->fault_info) : json_null());
    json_array_append_new(a, e->ft_state ? json_string(e->ft_state) : json_null());
    json_array_append_new(a,
                          e->last_ft_request_id ? json_string(e->last_ft_request_id) : json_null());
    json_array_append_new(a, e->ft_error ? json_incref(e->ft_error) : json_null());
    json_array_append_new(a, e->mask ? json_incref(e->mask) : json_null());
    char *s = wire_json_compact(a);
    json_decref(a);
    return s;
}

json_t *wire_ft_poll_error_entry(int64_t id, const char *error)
{
    json_t *o = json_object();
    wj_set_int(o, "id", id);
    wj_set_str(o, "status", "unknown");
    wj_set_str(o, "fault_info", error ? error : "");
    wj_set_str(o, "source", "poll_error");
    return o;
}

void wire_ft_engines_release(struct wire_ft_engines *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n; i++)
        wire_ft_engine_entry_release(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int wire_ft_engines_parse(json_t *j, struct wire_ft_engines *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    json_t *arr;
    if (wj_require_object(j, "", err) < 0 || wj_array(j, "", "engines", WJ_REQ, &arr, err) < 0)
        return -EINVAL;
    out->v = xcalloc(json_array_size(arr) + 1, sizeof(*out->v));
    char p[WIRE_PATH_MAX];
    for (size_t i = 0; i < json_array_size(arr); i++) {
        if (entry_parse_at(json_array_get(arr, i), wj_path_idx(p, sizeof(p), "engines", i), true, 0,
                           &out->v[i], err) < 0) {
            wire_ft_engines_release(out);
            return -EINVAL;
        }
        out->n = i + 1;
    }
    return 0;
}

int wire_ft_status_reply_parse(json_t *j, struct wire_ft_engines *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (wj_require_object(j, "", err) < 0)
        return -EINVAL;
    if (json_object_size(j) > WIRE_LIST_MAX) {
        wire_err_set(err, "too many entries (%zu, max %d)", json_object_size(j), WIRE_LIST_MAX);
        return -EINVAL;
    }
    out->v = xcalloc(json_object_size(j) + 1, sizeof(*out->v));
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        int64_t id;
        if (util_parse_i64(key, 0, WIRE_ID_MAX, &id) < 0) {
            wire_err_set(err, "key \"%.40s\" is not an endpoint id", key);
            wire_ft_engines_release(out);
            return -EINVAL;
        }
        if (entry_parse_at(v, key, false, id, &out->v[out->n], err) < 0) {
            wire_ft_engines_release(out);
            return -EINVAL;
        }
        out->n++;
    }
    return 0;
}

const struct wire_ft_engine_entry *wire_ft_engines_find(const struct wire_ft_engines *l, int64_t id)
{
    for (size_t i = 0; l && i < l->n; i++)
        if (l->v[i].id == id)
            return &l->v[i];
    return NULL;
}
