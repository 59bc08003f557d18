#include "coordinator/instances.h"

#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- names ------------------------------------------------------------------------ */

static const char *const role_names[INST_ROLE_COUNT] = {"prefill", "decode", "union", "encode"};

const char *inst_role_name(enum inst_role r)
{
    return (unsigned)r < INST_ROLE_COUNT ? role_names[r] : "unknown";
}

int inst_role_parse(const char *s, enum inst_role *out)
{
    if (!s)
        return -EINVAL;
    for (int i = 0; i < INST_ROLE_COUNT; i++) {
        if (strcmp(s, role_names[i]) == 0) {
            *out = (enum inst_role)i;
            return 0;
        }
    }
    if (strcmp(s, "both") == 0) {
        *out = INST_ROLE_UNION;
        return 0;
    }
    return -EINVAL;
}

static const char *const status_names[] = {"initial", "inactive", "active", "paused", "deleted"};

const char *inst_status_name(enum inst_status s)
{
    return (unsigned)s < ARRAY_LEN(status_names) ? status_names[s] : "unknown";
}

const char *inst_pool_name(enum inst_status s)
{
    switch (s) {
    case INST_ST_ACTIVE:
        return "available";
    case INST_ST_PAUSED:
        return "paused";
    case INST_ST_INITIAL:
    case INST_ST_INACTIVE:
        return "unavailable";
    case INST_ST_DELETED:
        break;
    }
    return "unknown";
}

const char *inst_event_name(enum inst_event e)
{
    switch (e) {
    case INST_EV_ADD:
        return "add";
    case INST_EV_DEL:
        return "del";
    case INST_EV_SET:
        return "set";
    }
    return "unknown";
}

static const char *const ep_status_names[] = {"initial", "normal", "abnormal", "paused",
                                              "wait2start"};

/* ---- shared objects --------------------------------------------------------------- */

static struct inst_load *load_new(void)
{
    struct inst_load *l = xcalloc(1, sizeof(*l));
    atomic_init(&l->refs, 1);
    return l;
}

static struct inst_load *load_ref(struct inst_load *l)
{
    atomic_fetch_add_explicit(&l->refs, 1, memory_order_relaxed);
    return l;
}

static void load_unref(struct inst_load *l)
{
    if (l && atomic_fetch_sub_explicit(&l->refs, 1, memory_order_acq_rel) == 1)
        free(l);
}

void inst_load_acquire(struct inst_load *l, int64_t tokens)
{
    if (!l)
        return;
    atomic_fetch_add_explicit(&l->tokens, tokens, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&l->served, 1, memory_order_relaxed);
}

void inst_load_release(struct inst_load *l, int64_t tokens)
{
    if (!l)
        return;
    atomic_fetch_sub_explicit(&l->tokens, tokens, memory_order_relaxed);
    atomic_fetch_sub_explicit(&l->requests, 1, memory_order_relaxed);
}

static struct inst_shared *shared_new(const struct brk_params *p)
{
    struct inst_shared *s = xcalloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->mu, NULL);
    brk_init(&s->brk, p);
    return s;
}

static struct inst_shared *shared_ref(struct inst_shared *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

static void shared_unref(struct inst_shared *s)
{
    if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_destroy(&s->mu);
        free(s);
    }
}

bool inst_breaker_peek(struct instance *in, int64_t now_ms)
{
    if (!in->shared)
        return true;
    pthread_mutex_lock(&in->shared->mu);
    bool ok = brk_peek(&in->shared->brk, now_ms);
    pthread_mutex_unlock(&in->shared->mu);
    return ok;
}

bool inst_breaker_acquire(struct instance *in, int64_t now_ms, bool *trial)
{
    *trial = false;
    if (!in->shared)
        return true;
    pthread_mutex_lock(&in->shared->mu);
    bool ok = brk_acquire(&in->shared->brk, now_ms, trial);
    pthread_mutex_unlock(&in->shared->mu);
    return ok;
}

bool inst_breaker_report(struct instance *in, int64_t now_ms, int outcome, bool trial)
{
    if (!in->shared)
        return false;
    bool tripped = false;
    pthread_mutex_lock(&in->shared->mu);
    if (outcome > 0)
        brk_success(&in->shared->brk, trial);
    else if (outcome < 0)
        tripped = brk_failure(&in->shared->brk, now_ms, trial);
    else
        brk_abandon(&in->shared->brk, trial);
    pthread_mutex_unlock(&in->shared->mu);
    return tripped;
}

void inst_breaker_read(struct instance *in, struct brk *out)
{
    if (!in->shared) {
        struct brk_params p = {3, 30000, 300000};
        brk_init(out, &p);
        return;
    }
    pthread_mutex_lock(&in->shared->mu);
    *out = in->shared->brk;
    pthread_mutex_unlock(&in->shared->mu);
}

/* ---- instances -------------------------------------------------------------------- */

struct instance *inst_ref(struct instance *in)
{
    atomic_fetch_add_explicit(&in->refs, 1, memory_order_relaxed);
    return in;
}

static void inst_free(struct instance *in)
{
    for (size_t i = 0; i < in->n_eps; i++) {
        free(in->eps[i].ip);
        free(in->eps[i].hostport);
        load_unref(in->eps[i].load);
    }
    free(in->eps);
    free(in->job_name);
    free(in->model_name);
    free(in->engine_type);
    shared_unref(in->shared);
    free(in);
}

void inst_unref(struct instance *in)
{
    if (in && atomic_fetch_sub_explicit(&in->refs, 1, memory_order_acq_rel) == 1)
        inst_free(in);
}

bool inst_ep_routable(const struct inst_endpoint *ep)
{
    return !ep->headless && (ep->status == EP_ST_INITIAL || ep->status == EP_ST_NORMAL);
}

bool inst_routable(const struct instance *in)
{
    if (in->status != INST_ST_ACTIVE)
        return false;
    for (size_t i = 0; i < in->n_eps; i++)
        if (inst_ep_routable(&in->eps[i]))
            return true;
    return false;
}

static int ep_sig_cmp(const void *a, const void *b)
{
    const struct inst_endpoint *x = *(const struct inst_endpoint *const *)a;
    const struct inst_endpoint *y = *(const struct inst_endpoint *const *)b;
    int c = strcmp(x->ip, y->ip);
    if (c)
        return c;
    if (x->port != y->port)
        return x->port < y->port ? -1 : 1;
    return (int)x->headless - (int)y->headless;
}

static const struct inst_endpoint **sorted_eps(const struct instance *in)
{
    const struct inst_endpoint **v = xcalloc(in->n_eps + 1, sizeof(*v));
    for (size_t i = 0; i < in->n_eps; i++)
        v[i] = &in->eps[i];
    qsort(v, in->n_eps, sizeof(*v), ep_sig_cmp);
    return v;
}

static bool same_endpoints(const struct instance *a, const struct instance *b)
{
    if (a->n_eps != b->n_eps)
        return false;
    const struct inst_endpoint **x = sorted_eps(a), **y = sorted_eps(b);
    bool same = true;
    for (size_t i = 0; i < a->n_eps && same; i++)
        same = ep_sig_cmp(&x[i], &y[i]) == 0;
    free(x);
    free(y);
    return same;
}

bool inst_same_identity(const struct instance *a, const struct instance *b)
{
    return a->role == b->role && strcmp(a->job_name, b->job_name) == 0 && same_endpoints(a, b);
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

static char *make_hostport(const char *ip, int port)
{
    if (strchr(ip, ':'))
        return xasprintf("[%s]:%d", ip, port);
    return xasprintf("%s:%d", ip, port);
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
    if (strlen(s) > INST_MAX_NAME)
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
                               struct inst_endpoint *ep, char *err, size_t cap)
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
    ep->status = EP_ST_INITIAL;
    if (js && !json_is_null(js)) {
        const char *s = json_is_string(js) ? json_string_value(js) : NULL;
        size_t i;
        for (i = 0; s && i < ARRAY_LEN(ep_status_names); i++)
            if (strcmp(s, ep_status_names[i]) == 0)
                break;
        if (!s || i == ARRAY_LEN(ep_status_names))
            return fail(err, cap, "%s: invalid endpoint status", where);
        ep->status = (enum ep_status)i;
    }
    json_t *jh = json_object_get(jep, "headless");
    if (jh && !json_is_null(jh)) {
        if (!json_is_boolean(jh))
            return fail(err, cap, "%s: headless must be a boolean", where);
        ep->headless = json_is_true(jh);
    }
    ep->ip = xstrdup(ip);
    ep->hostport = make_hostport(ep->ip, ep->port);
    return 0;
}

static int parse_ext_endpoint(json_t *jep, const char *where, struct inst_endpoint *ep, char *err,
                              size_t cap)
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
    ep->status = EP_ST_INITIAL;
    ep->hostport = make_hostport(ep->ip, ep->port);
    return 0;
}

static int parse_dispatch(json_t *v, enum inst_dispatch *out, const char *where, char *err,
                          size_t cap)
{
    *out = INST_DISPATCH_DEFAULT;
    if (!v || json_is_null(v))
        return 0;
    json_t *one = NULL;
    size_t n = 1;
    if (json_is_array(v))
        n = json_array_size(v);
    for (size_t i = 0; i < n; i++) {
        one = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_string(one))
            return fail(err, cap, "%s: dispatch_capabilities must be strings", where);
        const char *s = json_string_value(one);
        if (strcmp(s, "prefill_handoff_decode") == 0)
            *out = INST_DISPATCH_HANDOFF;
        else if (strcmp(s, "concurrent_engine_sync") == 0)
            *out = INST_DISPATCH_TRIGGER;
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
                    key, INST_MAX_NAME);
    *out = xstrdup(json_string_value(v));
    return 0;
}

static int parse_instance(json_t *ji, size_t idx, json_t *top, struct instance **out, char *err,
                          size_t cap)
{
    char where[48];
    snprintf(where, sizeof(where), "instances[%zu]", idx);
    if (!json_is_object(ji))
        return fail(err, cap, "%s: must be an object", where);
    struct instance *in = xcalloc(1, sizeof(*in));
    atomic_init(&in->refs, 1);
    int rc = -EINVAL;

    json_t *jid = json_object_get(ji, "id");
    if (!json_is_integer(jid) || json_integer_value(jid) < 0) {
        rc = fail(err, cap, "%s: id must be a non-negative integer", where);
        goto fail;
    }
    in->id = json_integer_value(jid);
    json_t *jr = json_object_get(ji, "role");
    if (!json_is_string(jr) || inst_role_parse(json_string_value(jr), &in->role) < 0) {
        rc = fail(err, cap, "%s: role must be one of prefill, decode, union, both, encode", where);
        goto fail;
    }
    json_t *jeps = json_object_get(ji, "endpoints");
    bool external = json_is_array(jeps);
    if (!external && !json_is_object(jeps)) {
        rc = fail(err, cap, "%s: endpoints must be {pod_ip: {id: Endpoint}} or [{id, address}]",
                  where);
        goto fail;
    }
    /* The External Deployer shape carries model, engine and capabilities once at the
     * top level; an instance may still override them. */
    json_t *src_model = json_object_get(ji, "model_name");
    if ((!src_model || json_is_null(src_model)) && top)
        src_model = json_object_get(top, "model_name");
    if (src_model && !json_is_null(src_model)) {
        if (!json_is_string(src_model) || !valid_name(json_string_value(src_model))) {
            rc = fail(err, cap, "%s: model_name must be a short string", where);
            goto fail;
        }
        in->model_name = xstrdup(json_string_value(src_model));
    } else {
        in->model_name = xstrdup("");
    }
    json_t *src_engine = json_object_get(ji, "engine_type");
    if ((!src_engine || json_is_null(src_engine)) && top)
        src_engine = json_object_get(top, "engine_type");
    if (src_engine && !json_is_null(src_engine)) {
        if (!json_is_string(src_engine) || !valid_name(json_string_value(src_engine))) {
            rc = fail(err, cap, "%s: engine_type must be a string", where);
            goto fail;
        }
        in->engine_type = xstrdup(json_string_value(src_engine));
    } else {
        in->engine_type = xstrdup("vllm");
    }
    if (strcasecmp(in->engine_type, "vllm") == 0)
        in->engine = INST_ENGINE_VLLM;
    else if (strcasecmp(in->engine_type, "sglang") == 0)
        in->engine = INST_ENGINE_SGLANG;
    else
        in->engine = INST_ENGINE_OTHER;
    json_t *src_disp = json_object_get(ji, "dispatch_capabilities");
    if ((!src_disp || json_is_null(src_disp)) && top)
        src_disp = json_object_get(top, "dispatch_capabilities");
    if ((rc = parse_dispatch(src_disp, &in->dispatch, where, err, cap)) < 0)
        goto fail;
    rc = -EINVAL;
    if (get_opt_string(ji, "job_name", "", &in->job_name, where, err, cap) < 0)
        goto fail;

    json_t *js = json_object_get(ji, "status");
    /* Whoever pushes an instance without a status wants it served: the controller sends
     * routable instances, and the External Deployer shape has no status at all. */
    in->status = INST_ST_ACTIVE;
    if (js && !json_is_null(js)) {
        const char *s = json_is_string(js) ? json_string_value(js) : NULL;
        size_t i;
        for (i = 0; s && i < ARRAY_LEN(status_names); i++)
            if (strcmp(s, status_names[i]) == 0)
                break;
        if (!s || i == ARRAY_LEN(status_names)) {
            rc = fail(err, cap,
                      "%s: status must be one of initial, inactive, active, paused, "
                      "deleted",
                      where);
            goto fail;
        }
        in->status = (enum inst_status)i;
    }

    size_t total = 0;
    if (external) {
        total = json_array_size(jeps);
    } else {
        const char *pod;
        json_t *m;
        json_object_foreach(jeps, pod, m)
        {
            if (!json_is_object(m)) {
                rc = fail(err, cap, "%s: endpoints[\"%.64s\"] must be {id: Endpoint}", where, pod);
                goto fail;
            }
            total += json_object_size(m);
        }
    }
    if (total > INST_MAX_ENDPOINTS) {
        rc = fail(err, cap, "%s: more than %d endpoints", where, INST_MAX_ENDPOINTS);
        goto fail;
    }
    in->eps = xcalloc(total + 1, sizeof(*in->eps));
    if (external) {
        size_t i;
        json_t *jep;
        json_array_foreach(jeps, i, jep)
        {
            char w[96];
            snprintf(w, sizeof(w), "%s.endpoints[%zu]", where, i);
            if ((rc = parse_ext_endpoint(jep, w, &in->eps[in->n_eps], err, cap)) < 0)
                goto fail;
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
                    goto fail;
                in->n_eps++;
            }
        }
    }
    for (size_t i = 0; i < in->n_eps; i++) {
        for (size_t j = i + 1; j < in->n_eps; j++) {
            if (in->eps[i].id == in->eps[j].id) {
                rc = fail(err, cap, "%s: duplicate endpoint id %lld", where,
                          (long long)in->eps[i].id);
                goto fail;
            }
            if (strcmp(in->eps[i].ip, in->eps[j].ip) == 0 && in->eps[i].port == in->eps[j].port) {
                rc = fail(err, cap, "%s: endpoint %s listed twice", where, in->eps[i].hostport);
                goto fail;
            }
        }
    }
    *out = in;
    return 0;
fail:
    inst_unref(in);
    return rc;
}

int inst_refresh_parse(json_t *body, struct inst_refresh *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(body))
        return fail(err, cap, "body must be a JSON object");
    json_t *jev = json_object_get(body, "event");
    const char *ev = json_is_string(jev) ? json_string_value(jev) : NULL;
    struct inst_refresh r = {0};
    if (ev && strcasecmp(ev, "add") == 0)
        r.ev = INST_EV_ADD;
    else if (ev && strcasecmp(ev, "del") == 0)
        r.ev = INST_EV_DEL;
    else if (ev && strcasecmp(ev, "set") == 0)
        r.ev = INST_EV_SET;
    else
        return fail(err, cap, "event must be one of \"add\", \"del\", \"set\"");
    json_t *arr = json_object_get(body, "instances");
    if (!json_is_array(arr))
        return fail(err, cap, "instances must be an array");
    size_t n = json_array_size(arr);
    if (n > INST_MAX_PER_REFRESH)
        return fail(err, cap, "more than %d instances in one refresh", INST_MAX_PER_REFRESH);
    json_t *top_model = json_object_get(body, "model_name");
    if (top_model && !json_is_null(top_model) && !json_is_string(top_model))
        return fail(err, cap, "model_name must be a string");
    r.v = xcalloc(n + 1, sizeof(*r.v));
    size_t i;
    json_t *ji;
    json_array_foreach(arr, i, ji)
    {
        int rc = parse_instance(ji, i, body, &r.v[r.n], err, cap);
        if (rc < 0) {
            inst_refresh_release(&r);
            return rc;
        }
        r.n++;
    }
    for (size_t a = 0; a < r.n; a++) {
        for (size_t b = a + 1; b < r.n; b++) {
            if (r.v[a]->id == r.v[b]->id) {
                long long id = (long long)r.v[a]->id;
                inst_refresh_release(&r);
                return fail(err, cap, "duplicate instance id %lld in one refresh", id);
            }
        }
    }
    *out = r;
    return 0;
}

void inst_refresh_release(struct inst_refresh *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        inst_unref(r->v[i]);
    free(r->v);
    memset(r, 0, sizeof(*r));
}

bool inst_refresh_needs_model(const struct inst_refresh *r)
{
    if (r->ev == INST_EV_DEL)
        return false;
    for (size_t i = 0; i < r->n; i++)
        if (r->v[i]->model_name[0] == '\0')
            return true;
    return false;
}

/* ---- table ------------------------------------------------------------------------ */

void inst_table_init(struct inst_table *t, const struct brk_params *brk)
{
    memset(t, 0, sizeof(*t));
    t->brk = *brk;
    t->v = xcalloc(1, sizeof(*t->v));
}

static void free_vec(struct instance **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        inst_unref(v[i]);
    free(v);
}

void inst_table_release(struct inst_table *t)
{
    if (!t)
        return;
    free_vec(t->v, t->n);
    memset(t, 0, sizeof(*t));
}

struct instance *inst_table_find(const struct inst_table *t, int64_t id)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i]->id == id)
            return t->v[i];
    return NULL;
}

static int inst_order(const void *a, const void *b)
{
    const struct instance *x = *(const struct instance *const *)a;
    const struct instance *y = *(const struct instance *const *)b;
    int c = strcmp(inst_role_name(x->role), inst_role_name(y->role));
    if (c)
        return c;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Give a fresh instance (not yet shared) the breaker and per-endpoint loads of its
 * predecessor when the identity is unchanged, new ones otherwise. */
static void attach_state(struct instance *fresh, struct instance *old, const struct brk_params *p)
{
    if (fresh->shared)
        return; /* already attached: the same object in two places */
    bool keep = old && inst_same_identity(fresh, old);
    fresh->shared = keep ? shared_ref(old->shared) : shared_new(p);
    for (size_t i = 0; i < fresh->n_eps; i++) {
        struct inst_endpoint *ep = &fresh->eps[i];
        ep->load = NULL;
        for (size_t j = 0; keep && j < old->n_eps; j++) {
            if (old->eps[j].port == ep->port && strcmp(old->eps[j].ip, ep->ip) == 0) {
                ep->load = load_ref(old->eps[j].load);
                break;
            }
        }
        if (!ep->load)
            ep->load = load_new();
    }
}

int inst_table_apply(struct inst_table *t, const struct inst_refresh *r, char *err, size_t cap)
{
    struct instance **nv = NULL;
    size_t nn = 0;

    if (r->ev == INST_EV_DEL) {
        /* Validate every deletion first: all or nothing. */
        for (size_t i = 0; i < r->n; i++) {
            const struct instance *want = r->v[i];
            struct instance *have = inst_table_find(t, want->id);
            if (!have)
                continue; /* already gone: a del is idempotent */
            bool ok = have->role == want->role &&
                      (want->job_name[0] == '\0' || strcmp(have->job_name, want->job_name) == 0) &&
                      (want->n_eps == 0 || same_endpoints(have, want));
            if (!ok) {
                snprintf(err, cap,
                         "instance %lld: identity does not match the registered instance "
                         "(role %s, job %s)",
                         (long long)want->id, inst_role_name(have->role), have->job_name);
                return -EEXIST;
            }
        }
        nv = xcalloc(t->n + 1, sizeof(*nv));
        for (size_t i = 0; i < t->n; i++) {
            bool gone = false;
            for (size_t j = 0; j < r->n && !gone; j++)
                gone = r->v[j]->id == t->v[i]->id;
            if (!gone)
                nv[nn++] = inst_ref(t->v[i]);
        }
    } else if (r->ev == INST_EV_ADD) {
        for (size_t i = 0; i < r->n; i++) {
            struct instance *have = inst_table_find(t, r->v[i]->id);
            if (have && !inst_same_identity(have, r->v[i])) {
                snprintf(err, cap,
                         "instance %lld is already registered with another identity "
                         "(role %s, job %s, %zu endpoints)",
                         (long long)have->id, inst_role_name(have->role), have->job_name,
                         have->n_eps);
                return -EEXIST;
            }
        }
        nv = xcalloc(t->n + r->n + 1, sizeof(*nv));
        for (size_t i = 0; i < t->n; i++) {
            bool replaced = false;
            for (size_t j = 0; j < r->n && !replaced; j++)
                replaced = r->v[j]->id == t->v[i]->id;
            if (!replaced)
                nv[nn++] = inst_ref(t->v[i]);
        }
        for (size_t j = 0; j < r->n; j++) {
            attach_state(r->v[j], inst_table_find(t, r->v[j]->id), &t->brk);
            nv[nn++] = inst_ref(r->v[j]);
        }
    } else {
        nv = xcalloc(r->n + 1, sizeof(*nv));
        for (size_t j = 0; j < r->n; j++) {
            attach_state(r->v[j], inst_table_find(t, r->v[j]->id), &t->brk);
            nv[nn++] = inst_ref(r->v[j]);
        }
    }
    qsort(nv, nn, sizeof(*nv), inst_order);
    free_vec(t->v, t->n);
    t->v = nv;
    t->n = nn;
    t->version++;
    return 0;
}

json_t *inst_to_json(struct instance *in, int64_t now_ms)
{
    struct brk b;
    inst_breaker_read(in, &b);
    enum brk_state bs = brk_state_at(&b, now_ms);
    json_t *eps = json_array();
    for (size_t i = 0; i < in->n_eps; i++) {
        const struct inst_endpoint *ep = &in->eps[i];
        char port[8];
        snprintf(port, sizeof(port), "%d", ep->port);
        json_t *je = json_pack("{s:I, s:s, s:s, s:b, s:s}", "id", (json_int_t)ep->id, "ip", ep->ip,
                               "business_port", port, "headless", ep->headless, "status",
                               ep_status_names[ep->status]);
        if (ep->bootstrap_port)
            json_object_set_new(je, "bootstrap_port", json_integer(ep->bootstrap_port));
        if (ep->load) {
            json_object_set_new(
                je, "inflight_requests",
                json_integer(atomic_load_explicit(&ep->load->requests, memory_order_relaxed)));
            json_object_set_new(
                je, "inflight_tokens",
                json_integer(atomic_load_explicit(&ep->load->tokens, memory_order_relaxed)));
        }
        json_array_append_new(eps, je);
    }
    bool healthy = in->status == INST_ST_ACTIVE && bs == BRK_CLOSED;
    /* Upstream reports a breaker as closed/open only; half-open counts as open. */
    const char *bname = bs == BRK_CLOSED ? "closed" : "open";
    json_t *cb =
        json_pack("{s:s, s:i, s:i, s:f}", "state", bname, "trip_count", b.trip_count,
                  "failure_count", b.failures, "current_timeout", (double)b.cur_open_ms / 1000.0);
    return json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:o, s:o}", "id", (json_int_t)in->id,
                     "role", inst_role_name(in->role), "job_name", in->job_name, "model_name",
                     in->model_name, "engine_type", in->engine_type, "status",
                     inst_status_name(in->status), "pool", inst_pool_name(in->status), "healthy",
                     healthy, "circuit_breaker", cb, "endpoints", eps);
}

json_t *inst_table_to_json(const struct inst_table *t, int64_t now_ms)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < t->n; i++)
        json_array_append_new(arr, inst_to_json(t->v[i], now_ms));
    return json_pack("{s:I, s:o}", "count", (json_int_t)t->n, "instances", arr);
}

/* ---- snapshots -------------------------------------------------------------------- */

struct inst_snapshot *inst_snapshot_build(const struct inst_table *t)
{
    struct inst_snapshot *s = xcalloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    s->version = t->version;
    s->all = xcalloc(t->n + 1, sizeof(*s->all));
    for (int r = 0; r < INST_ROLE_COUNT; r++)
        s->routable[r] = xcalloc(t->n + 1, sizeof(*s->routable[r]));
    s->models = xcalloc(t->n + 1, sizeof(*s->models));
    for (size_t i = 0; i < t->n; i++) {
        struct instance *in = inst_ref(t->v[i]);
        s->all[s->n_all++] = in;
        if (!inst_routable(in))
            continue;
        s->routable[in->role][s->n_routable[in->role]++] = in;
        if (in->role == INST_ROLE_ENCODE || in->model_name[0] == '\0')
            continue;
        bool seen = false;
        for (size_t m = 0; m < s->n_models && !seen; m++)
            seen = strcmp(s->models[m], in->model_name) == 0;
        if (!seen)
            s->models[s->n_models++] = xstrdup(in->model_name);
    }
    return s;
}

struct inst_snapshot *inst_snapshot_ref(struct inst_snapshot *s)
{
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void inst_snapshot_unref(struct inst_snapshot *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    free_vec(s->all, s->n_all);
    for (int r = 0; r < INST_ROLE_COUNT; r++)
        free(s->routable[r]);
    for (size_t m = 0; m < s->n_models; m++)
        free(s->models[m]);
    free(s->models);
    free(s);
}

void inst_pub_init(struct inst_pub *p)
{
    pthread_mutex_init(&p->mu, NULL);
    p->cur = NULL;
    atomic_init(&p->version, 0);
}

void inst_pub_release(struct inst_pub *p)
{
    inst_snapshot_unref(p->cur);
    p->cur = NULL;
    pthread_mutex_destroy(&p->mu);
}

void inst_pub_set(struct inst_pub *p, struct inst_snapshot *take)
{
    pthread_mutex_lock(&p->mu);
    struct inst_snapshot *old = p->cur;
    p->cur = take;
    atomic_fetch_add_explicit(&p->version, 1, memory_order_release);
    pthread_mutex_unlock(&p->mu);
    inst_snapshot_unref(old);
}

struct inst_snapshot *inst_pub_get(struct inst_pub *p)
{
    pthread_mutex_lock(&p->mu);
    struct inst_snapshot *s = p->cur ? inst_snapshot_ref(p->cur) : NULL;
    pthread_mutex_unlock(&p->mu);
    return s;
}

uint64_t inst_pub_version(struct inst_pub *p)
{
    return atomic_load_explicit(&p->version, memory_order_acquire);
}
