#include "wire/wire_refresh.h"

#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const event_names[] = {"add", "del", "set"};

const char *wire_refresh_event_str(enum wire_refresh_event e)
{
    return (unsigned)e < ARRAY_LEN(event_names) ? event_names[e] : "?";
}

/* ---- parsing ---------------------------------------------------------------------- */

static int fail(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* A port given as an integer or a decimal string (upstream's business_port is a str). */
static int parse_port_value(json_t *v, int *out)
{
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (x < 1 || x > 65535)
            return -ERANGE;
        *out = (int)x;
        return 0;
    }
    if (json_is_string(v))
        return util_parse_int(json_string_value(v), 1, 65535, out);
    return -EINVAL;
}

static bool valid_name(const char *s)
{
    if (strlen(s) > WIRE_REFRESH_MAX_NAME)
        return false;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return false;
    return true;
}

static bool valid_ip(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253)
        return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                  c == '.' || c == ':' || c == '-' || c == '_' || c == '%';
        if (!ok)
            return false;
    }
    return true;
}

/* "host:port" split at the last colon; "[v6]:port" unbracketed. */
static int parse_address(const char *addr, char **ip, int *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return -EINVAL;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']')
            return -EINVAL;
        h++;
        hl -= 2;
    }
    if (util_parse_int(colon + 1, 1, 65535, port) < 0)
        return -EINVAL;
    char *s = xstrndup(h, hl);
    if (!valid_ip(s)) {
        free(s);
        return -EINVAL;
    }
    *ip = s;
    return 0;
}

static const char *const endpoint_fields[] = {
    "id",           "ip",           "business_port", "bootstrap_port", "status",
    "device_infos", "hb_timestamp", "workload",      "headless",       NULL};

static bool known_field(const char *k, const char *const *list)
{
    for (size_t i = 0; list[i]; i++)
        if (strcmp(k, list[i]) == 0)
            return true;
    return false;
}

static int parse_ctrl_endpoint(json_t *jep, const char *pod_ip, const char *where,
                               struct wire_refresh_ep *ep, char *err, size_t cap)
{
    if (!json_is_object(jep))
        return fail(err, cap, "%s: endpoint must be an object", where);
    const char *k;
    json_t *v;
    json_object_foreach(jep, k, v)
    {
        if (!known_field(k, endpoint_fields))
            return fail(err, cap, "%s: unknown endpoint field '%s'", where, k);
    }
    json_t *jid = json_object_get(jep, "id");
    if (!json_is_integer(jid) || json_integer_value(jid) < 0)
        return fail(err, cap, "%s: endpoint id must be a non-negative integer", where);
    ep->id = json_integer_value(jid);
    json_t *jip = json_object_get(jep, "ip");
    const char *ip = pod_ip;
    if (jip && !json_is_null(jip)) {
        if (!json_is_string(jip))
            return fail(err, cap, "%s: endpoint ip must be a string", where);
        ip = json_string_value(jip);
    }
    if (!valid_ip(ip))
        return fail(err, cap, "%s: invalid endpoint ip '%.64s'", where, ip);
    if (parse_port_value(json_object_get(jep, "business_port"), &ep->port) < 0)
        return fail(err, cap, "%s: business_port must be a port number (1-65535)", where);
    json_t *jb = json_object_get(jep, "bootstrap_port");
    if (jb && !json_is_null(jb)) {
        if (parse_port_value(jb, &ep->bootstrap_port) < 0)
            return fail(err, cap, "%s: bootstrap_port must be null or 1-65535", where);
    }
    json_t *js = json_object_get(jep, "status");
    ep->status = WIRE_EP_INITIAL;
    if (js && !json_is_null(js)) {
        const char *s = json_is_string(js) ? json_string_value(js) : NULL;
        if (wire_ep_status_from_str(s, &ep->status) < 0)
            return fail(err, cap, "%s: invalid endpoint status", where);
    }
    json_t *jh = json_object_get(jep, "headless");
    if (jh && !json_is_null(jh)) {
        if (!json_is_boolean(jh))
            return fail(err, cap, "%s: headless must be a boolean", where);
        ep->headless = json_is_true(jh);
    }
    ep->ip = xstrdup(ip);
    return 0;
}

static int parse_ext_endpoint(json_t *jep, const char *where, struct wire_refresh_ep *ep,
                              char *err, size_t cap)
{
    if (!json_is_object(jep))
        return fail(err, cap, "%s: endpoint must be an object", where);
    json_t *jid = json_object_get(jep, "id");
    if (!json_is_integer(jid) || json_integer_value(jid) < 0)
        return fail(err, cap, "%s: endpoint id must be a non-negative integer", where);
    ep->id = json_integer_value(jid);
    json_t *jb = json_object_get(jep, "bootstrap_port");
    if (jb && !json_is_null(jb) && parse_port_value(jb, &ep->bootstrap_port) < 0)
        return fail(err, cap, "%s: bootstrap_port must be null or 1-65535", where);
    /* Last: the only allocation, so every failure above leaves nothing to free. */
    json_t *ja = json_object_get(jep, "address");
    if (!json_is_string(ja) || parse_address(json_string_value(ja), &ep->ip, &ep->port) < 0)
        return fail(err, cap, "%s: address must be \"host:port\"", where);
    ep->status = WIRE_EP_INITIAL;
    return 0;
}

static int parse_dispatch(json_t *v, enum wire_dispatch *out, const char *where, char *err,
                          size_t cap)
{
    *out = WIRE_DISPATCH_DEFAULT;
    if (!v || json_is_null(v))
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *one = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(one))
            return fail(err, cap, "%s: dispatch_capabilities must be strings", where);
        const char *s = json_string_value(one);
        if (strcmp(s, "prefill_handoff_decode") == 0)
            *out = WIRE_DISPATCH_HANDOFF;
        else if (strcmp(s, "concurrent_engine_sync") == 0)
            *out = WIRE_DISPATCH_TRIGGER;
        /* Other capabilities (future upstream values) do not change how we route. */
    }
    return 0;
}

static int get_opt_string(json_t *obj, const char *key, const char *def, char **out,
                          const char *where, char *err, size_t cap)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = xstrdup(def);
        return 0;
    }
    if (!json_is_string(v) || !valid_name(json_string_value(v)))
        return fail(err, cap, "%s: %s must be a string of at most %d printable characters", where,
                    key, WIRE_REFRESH_MAX_NAME);
    *out = xstrdup(json_string_value(v));
    return 0;
}

/* key of the instance, else of the top level (the External Deployer shape), else NULL. */
static json_t *inherited(json_t *ji, json_t *top, const char *key)
{
    json_t *v = json_object_get(ji, key);
    if ((!v || json_is_null(v)) && top)
        v = json_object_get(top, key);
    return v && !json_is_null(v) ? v : NULL;
}

static void inst_release(struct wire_refresh_inst *in)
{
    for (size_t i = 0; i < in->n_eps; i++)
        free(in->eps[i].ip);
    free(in->eps);
    free(in->job_name);
    free(in->model_name);
    free(in->engine_type);
    memset(in, 0, sizeof(*in));
}

static int parse_endpoints(json_t *jeps, const char *where, struct wire_refresh_inst *in,
                           char *err, size_t cap)
{
    bool external = json_is_array(jeps);
    size_t total = 0;
    if (external) {
        total = json_array_size(jeps);
    } else {
        const char *pod;
        json_t *m;
        json_object_foreach(jeps, pod, m)
        {
            if (!json_is_object(m))
                return fail(err, cap, "%s: endpoints[\"%.64s\"] must be {id: Endpoint}", where,
                            pod);
            total += json_object_size(m);
        }
    }
    if (total > WIRE_REFRESH_MAX_ENDPOINTS)
        return fail(err, cap, "%s: more than %d endpoints", where, WIRE_REFRESH_MAX_ENDPOINTS);
    in->eps = xcalloc(total + 1, sizeof(*in->eps));
    int rc;
    if (external) {
        size_t i;
        json_t *jep;
        json_array_foreach(jeps, i, jep)
        {
            char w[96];
            snprintf(w, sizeof(w), "%s.endpoints[%zu]", where, i);
            if ((rc = parse_ext_endpoint(jep, w, &in->eps[in->n_eps], err, cap)) < 0)
                return rc;
            in->n_eps++;
        }
    } else {
        const char *pod;
        json_t *m;
        json_object_foreach(jeps, pod, m)
        {
            const char *key;
            json_t *jep;
            json_object_foreach(m, key, jep)
            {
                char w[160];
                snprintf(w, sizeof(w), "%s.endpoints[\"%.48s\"][\"%.16s\"]", where, pod, key);
                if ((rc = parse_ctrl_endpoint(jep, pod, w, &in->eps[in->n_eps], err, cap)) < 0)
                    return rc;
                in->n_eps++;
            }
        }
    }
    for (size_t i = 0; i < in->n_eps; i++) {
        for (size_t j = i + 1; j < in->n_eps; j++) {
            if (in->eps[i].id == in->eps[j].id)
                return fail(err, cap, "%s: duplicate endpoint id %lld", where,
                            (long long)in->eps[i].id);
            if (strcmp(in->eps[i].ip, in->eps[j].ip) == 0 && in->eps[i].port == in->eps[j].port)
                return fail(err, cap, strchr(in->eps[i].ip, ':') ? "%s: endpoint [%s]:%d listed twice"
                                                                 : "%s: endpoint %s:%d listed twice",
                            where, in->eps[i].ip, in->eps[i].port);
        }
    }
    return 0;
}

static int parse_instance(json_t *ji, size_t idx, json_t *top, struct wire_refresh_inst *in,
                          char *err, size_t cap)
{
    char where[48];
    snprintf(where, sizeof(where), "instances[%zu]", idx);
    if (!json_is_object(ji))
        return fail(err, cap, "%s: must be an object", where);

    json_t *jid = json_object_get(ji, "id");
    if (!json_is_integer(jid) || json_integer_value(jid) < 0)
        return fail(err, cap, "%s: id must be a non-negative integer", where);
    in->id = json_integer_value(jid);
    json_t *jr = json_object_get(ji, "role");
    if (!json_is_string(jr) || wire_role_from_str(json_string_value(jr), &in->role) < 0)
        return fail(err, cap, "%s: role must be one of prefill, decode, union, both, encode",
                    where);
    json_t *jeps = json_object_get(ji, "endpoints");
    if (!json_is_array(jeps) && !json_is_object(jeps))
        return fail(err, cap, "%s: endpoints must be {pod_ip: {id: Endpoint}} or [{id, address}]",
                    where);
    /* The External Deployer shape carries model, engine and capabilities once at the top
     * level; an instance may still override them. */
    json_t *model = inherited(ji, top, "model_name");
    if (model && (!json_is_string(model) || !valid_name(json_string_value(model))))
        return fail(err, cap, "%s: model_name must be a short string", where);
    json_t *engine = inherited(ji, top, "engine_type");
    if (engine && (!json_is_string(engine) || !valid_name(json_string_value(engine))))
        return fail(err, cap, "%s: engine_type must be a string", where);
    int rc = parse_dispatch(inherited(ji, top, "dispatch_capabilities"), &in->dispatch, where,
                            err, cap);
    if (rc < 0)
        return rc;

    /* Whoever pushes an instance without a status wants it served: the controller sends
     * routable instances, and the External Deployer shape has no status at all. */
    in->status = WIRE_INS_ACTIVE;
    json_t *js = json_object_get(ji, "status");
    if (js && !json_is_null(js)) {
        const char *s = json_is_string(js) ? json_string_value(js) : NULL;
        if (wire_ins_status_from_str(s, &in->status) < 0)
            return fail(err, cap,
                        "%s: status must be one of initial, inactive, active, paused, deleted",
                        where);
    }
    if ((rc = get_opt_string(ji, "job_name", "", &in->job_name, where, err, cap)) < 0)
        return rc;
    in->model_name = xstrdup(model ? json_string_value(model) : "");
    in->engine_type = xstrdup(engine ? json_string_value(engine) : "vllm");
    return parse_endpoints(jeps, where, in, err, cap);
}

int wire_refresh_parse(json_t *body, struct wire_refresh *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(body))
        return fail(err, cap, "body must be a JSON object");
    json_t *jev = json_object_get(body, "event");
    const char *ev = json_is_string(jev) ? json_string_value(jev) : NULL;
    struct wire_refresh r = {0};
    size_t e;
    for (e = 0; ev && e < ARRAY_LEN(event_names); e++)
        if (strcasecmp(ev, event_names[e]) == 0)
            break;
    if (!ev || e == ARRAY_LEN(event_names))
        return fail(err, cap, "event must be one of \"add\", \"del\", \"set\"");
    r.ev = (enum wire_refresh_event)e;
    json_t *arr = json_object_get(body, "instances");
    if (!json_is_array(arr))
        return fail(err, cap, "instances must be an array");
    size_t n = json_array_size(arr);
    if (n > WIRE_REFRESH_MAX_INSTANCES)
        return fail(err, cap, "more than %d instances in one refresh", WIRE_REFRESH_MAX_INSTANCES);
    json_t *top_model = json_object_get(body, "model_name");
    if (top_model && !json_is_null(top_model) && !json_is_string(top_model))
        return fail(err, cap, "model_name must be a string");
    r.v = xcalloc(n + 1, sizeof(*r.v));
    size_t i;
    json_t *ji;
    json_array_foreach(arr, i, ji)
    {
        int rc = parse_instance(ji, i, body, &r.v[r.n], err, cap);
        r.n++; /* counted even on failure: release frees what it allocated */
        if (rc < 0) {
            wire_refresh_release(&r);
            return rc;
        }
    }
    for (size_t a = 0; a < r.n; a++) {
        for (size_t b = a + 1; b < r.n; b++) {
            if (r.v[a].id == r.v[b].id) {
                long long id = (long long)r.v[a].id;
                wire_refresh_release(&r);
                return fail(err, cap, "duplicate instance id %lld in one refresh", id);
            }
        }
    }
    *out = r;
    return 0;
}

void wire_refresh_release(struct wire_refresh *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        inst_release(&r->v[i]);
    free(r->v);
    memset(r, 0, sizeof(*r));
}

/* ---- writing ---------------------------------------------------------------------- */

static bool excluded(const struct wire_refresh_out *in, int64_t id)
{
    for (size_t i = 0; i < in->n_exclude; i++)
        if (in->exclude[i] == id)
            return true;
    return false;
}

json_t *wire_refresh_instance_to_json(const struct wire_refresh_out *in)
{
    json_t *eps = json_object();
    json_t *nms = json_array();
    for (size_t i = 0; i < in->n_pods; i++) {
        const struct wire_refresh_pod *pod = &in->pods[i];
        if (pod->port)
            json_array_append_new(nms, json_pack("{s:s, s:s, s:I}", "pod_ip", pod->pod_ip, "port",
                                                 pod->port, "device_num",
                                                 (json_int_t)pod->device_num));
        json_t *per_ip = json_object_get(eps, pod->pod_ip);
        for (size_t j = 0; j < pod->n_eps; j++) {
            const struct wire_endpoint *ep = &pod->eps[j];
            if (excluded(in, ep->id))
                continue;
            if (!per_ip) {
                per_ip = json_object();
                json_object_set_new(eps, pod->pod_ip, per_ip);
            }
            char key[24];
            snprintf(key, sizeof(key), "%lld", (long long)ep->id);
            json_object_set_new(per_ip, key, wire_endpoint_to_json(ep));
        }
    }
    json_t *o = json_object();
    json_object_set_new(o, "job_name", json_string(in->job_name ? in->job_name : ""));
    json_object_set_new(o, "model_name", json_string(in->model_name ? in->model_name : ""));
    if (in->engine_type)
        json_object_set_new(o, "engine_type", json_string(in->engine_type));
    if (in->dispatch_caps)
        json_object_set_new(o, "dispatch_capabilities", wire_strlist_to_json(in->dispatch_caps));
    json_object_set_new(o, "id", json_integer(in->id));
    json_object_set_new(o, "role", json_string(wire_role_str(in->role)));
    json_object_set_new(o, "status", json_string(wire_ins_status_str(in->status)));
    if (in->pc)
        json_object_set_new(o, "parallel_config", wire_parallel_config_to_json(in->pc));
    json_object_set_new(o, "enable_multi_endpoints", json_boolean(in->multi_endpoints));
    if (json_array_size(nms))
        json_object_set_new(o, "node_managers", nms);
    else
        json_decref(nms);
    json_object_set_new(o, "endpoints", eps);
    if (in->ft_cap)
        json_object_set_new(o, "ft_capability", wire_ft_capability_to_json(in->ft_cap));
    return o;
}

json_t *wire_refresh_body(enum wire_refresh_event ev, json_t *instances)
{
    return json_pack("{s:s, s:o}", "event", wire_refresh_event_str(ev), "instances", instances);
}
