/* motor register — see register.h. */
#include "cli/register.h"

#include "common/cfg.h"
#include "common/httpc.h"
#include "common/reactor.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "wire/wire_refresh.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- pure parts ------------------------------------------------------------------- */

uint32_t register_crc32(const void *data, size_t len)
{
    static uint32_t table[256];
    static int ready;
    if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
    }
    const unsigned char *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++)
        crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

static int errf(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int errf(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

static int ep_cmp(const void *a, const void *b)
{
    const struct register_ep *x = a, *y = b;
    int c = strcmp(x->ip, y->ip);
    if (c)
        return c;
    return (x->port > y->port) - (x->port < y->port);
}

void register_eps_free(struct register_ep *eps, size_t n)
{
    for (size_t i = 0; eps && i < n; i++)
        free(eps[i].ip);
    free(eps);
}

int register_parse_group(const char *spec, struct register_ep **out, size_t *n_out, char *err,
                         size_t cap)
{
    *out = NULL;
    *n_out = 0;
    size_t n = 0, alloc = 4;
    struct register_ep *eps = xcalloc(alloc, sizeof(*eps));
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        char *item = xstrndup(p, len);
        char *s = item;
        while (*s == ' ')
            s++;
        char *e = s + strlen(s);
        while (e > s && e[-1] == ' ')
            *--e = '\0';
        char *colon = strrchr(s, ':');
        int port = 0;
        if (!*s || !colon || colon == s || util_parse_int(colon + 1, 1, 65535, &port) < 0) {
            errf(err, cap, "invalid endpoint '%s' (want IP:PORT)", item);
            free(item);
            register_eps_free(eps, n);
            return -EINVAL;
        }
        *colon = '\0';
        if (s[0] == '[' && colon - s >= 2 && colon[-1] == ']') {
            colon[-1] = '\0';
            s++;
        }
        if (!*s || strchr(s, '[') || strchr(s, ']') || strchr(s, '/') || strchr(s, ' ')) {
            errf(err, cap, "invalid endpoint host in '%.*s'", (int)len, p);
            free(item);
            register_eps_free(eps, n);
            return -EINVAL;
        }
        if (n == alloc) {
            alloc *= 2;
            eps = xrealloc(eps, alloc * sizeof(*eps));
        }
        eps[n].ip = xstrdup(s);
        eps[n].port = port;
        n++;
        free(item);
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    qsort(eps, n, sizeof(*eps), ep_cmp);
    for (size_t i = 1; i < n; i++) {
        if (ep_cmp(&eps[i - 1], &eps[i]) == 0) {
            errf(err, cap, "endpoint %s:%d listed twice", eps[i].ip, eps[i].port);
            register_eps_free(eps, n);
            return -EINVAL;
        }
    }
    *out = eps;
    *n_out = n;
    return 0;
}

int64_t register_instance_id(const char *role, const struct register_ep *eps, size_t n)
{
    struct strbuf b;
    strbuf_init(&b, 1 << 20);
    strbuf_puts(&b, role);
    for (size_t i = 0; i < n; i++)
        strbuf_appendf(&b, "|%s:%d", eps[i].ip, eps[i].port);
    uint32_t crc = register_crc32(strbuf_str(&b), b.len);
    strbuf_release(&b);
    return (int64_t)(0x40000000u | (crc & 0x3FFFFFFFu));
}

/* ---- HTTP (synchronous: a private reactor runs one request; this is a one-shot CLI) -- */

#define REG_RESP_MAX (64u << 20)
#define REG_REQ_TIMEOUT_MS 10000
#define REG_PROBE_TIMEOUT_MS 5000

struct reg_opts {
    const char *action;
    const char *coordinator;
    int mgmt_port;
    char *key;
    const char *model;
    const char *engine;
    double timeout_s;
    bool health_check;
    bool dry_run;
    /* https:// coordinator (and engines with engine_tls): CA and client certificate */
    struct httpc_tls tls;
    bool engine_tls; /* --engine-tls: the engines' /v1/models over https, same files */
    struct reg_group {
        const char *role;
        const char *spec;
        struct register_ep *eps;
        size_t n;
        int64_t id;
        char *job;
    } * groups;
    size_t n_groups;
    int64_t *ids;
    size_t n_ids;
};

struct http_wait {
    bool done;
    int error;
    long status;
    struct strbuf *resp;
    char text[256];
};

static void http_done(const struct httpc_response *r, void *arg)
{
    struct http_wait *w = arg;
    w->done = true;
    w->error = r->error;
    w->status = r->status;
    snprintf(w->text, sizeof(w->text), "%s", r->error_text ? r->error_text : "");
    if (r->error == 0 && strbuf_append(w->resp, r->body, r->body_len) != 0) {
        w->error = -E2BIG;
        snprintf(w->text, sizeof(w->text), "response too large");
    }
}

/* One request. 0 with *status set, or -EIO with a message on stderr-worthy err. */
static int http_do(const struct reg_opts *o, const struct httpc_tls *tls, const char *method,
                   const char *url, const char *body, long timeout_ms, long *status,
                   struct strbuf *resp, char *err, size_t cap)
{
    strbuf_reset(resp);
    struct reactor *r = reactor_new();
    struct httpc *c = r ? httpc_new(r) : NULL;
    if (!c) {
        reactor_free(r);
        snprintf(err, cap, "cannot start an HTTP client");
        return -EIO;
    }
    char *keyhdr = NULL;
    const char *hdrs[2] = {NULL, NULL};
    if (o && o->key) {
        keyhdr = xasprintf("X-Motor-Management-Key: %s", o->key);
        hdrs[0] = keyhdr;
    }
    struct http_wait w = {.resp = resp};
    struct httpc_opts ho = {
        .method = method,
        .url = url,
        .body = body,
        .body_len = body ? strlen(body) : 0,
        .content_type = body ? "application/json" : NULL,
        .headers = hdrs,
        .timeout_ms = timeout_ms,
        .connect_timeout_ms = MOTOR_MIN(timeout_ms, 3000L),
        .max_response = REG_RESP_MAX,
        .tls = tls,
    };
    httpc_request(c, &ho, http_done, &w);
    while (!w.done)
        if (reactor_run_once(r, 1000) < 0)
            break;
    httpc_free(c);
    reactor_free(r);
    if (keyhdr) {
        explicit_bzero(keyhdr, strlen(keyhdr));
        free(keyhdr);
    }
    if (!w.done || w.error) {
        snprintf(err, cap, "%s %s: %s", method, url, w.done ? w.text : "event loop failed");
        return -EIO;
    }
    *status = w.status;
    return 0;
}

static char *mgmt_url(const struct reg_opts *o, const char *path)
{
    size_t n = strlen(o->coordinator);
    while (n > 0 && o->coordinator[n - 1] == '/')
        n--;
    /* The base is meant to come without a port; one given anyway ("http://h:1026",
     * "http://[::1]:1026") wins over --mgmt-port. A bare host gets "http://". */
    const char *auth = strstr(o->coordinator, "://");
    const char *scheme = auth ? "" : "http://";
    auth = auth ? auth + 3 : o->coordinator;
    size_t alen = (size_t)(o->coordinator + n - auth);
    const char *slash = memchr(auth, '/', alen);
    if (slash)
        alen = (size_t)(slash - auth);
    const char *close = memchr(auth, ']', alen);
    const char *colon =
        memchr(close ? close : auth, ':', alen - (size_t)((close ? close : auth) - auth));
    if (colon)
        return xasprintf("%s%.*s%s", scheme, (int)n, o->coordinator, path);
    return xasprintf("%s%.*s:%d%s", scheme, (int)n, o->coordinator, o->mgmt_port, path);
}

static char *engine_url(const struct reg_opts *o, const struct register_ep *ep, const char *path)
{
    const char *scheme = o->engine_tls ? "https" : "http";
    if (strchr(ep->ip, ':'))
        return xasprintf("%s://[%s]:%d%s", scheme, ep->ip, ep->port, path);
    return xasprintf("%s://%s:%d%s", scheme, ep->ip, ep->port, path);
}

/* GET an engine's /v1/models: its model ids (NULL with a reason on failure). */
static json_t *engine_models(const struct reg_opts *o, const struct register_ep *ep, char *err,
                             size_t cap)
{
    char *url = engine_url(o, ep, "/v1/models");
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    long status = 0;
    json_t *ids = NULL;
    if (http_do(NULL, o->engine_tls ? &o->tls : NULL, "GET", url, NULL, REG_PROBE_TIMEOUT_MS,
                &status, &sb, err, cap) == 0) {
        if (status != 200) {
            snprintf(err, cap, "GET %s answered HTTP %ld", url, status);
        } else {
            json_t *j = json_loadb(strbuf_str(&sb), sb.len, 0, NULL);
            json_t *data = json_object_get(j, "data");
            if (!json_is_array(data)) {
                snprintf(err, cap, "GET %s: not an OpenAI model list", url);
            } else {
                ids = json_array();
                size_t i;
                json_t *m;
                json_array_foreach(data, i, m)
                {
                    if (json_is_string(json_object_get(m, "id")))
                        json_array_append(ids, json_object_get(m, "id"));
                }
            }
            json_decref(j);
        }
    }
    strbuf_release(&sb);
    free(url);
    return ids;
}

/* ---- instances ------------------------------------------------------------------------ */

/* One instance of a group in the controller shape (wire_refresh.h): the endpoints are
 * grouped by IP as a controller groups them by pod; ids are the positions in the group. */
static json_t *group_instance(const struct reg_opts *o, const struct reg_group *g)
{
    struct wire_endpoint *eps = xcalloc(g->n + 1, sizeof(*eps));
    char(*ports)[8] = xcalloc(g->n + 1, sizeof(*ports));
    struct wire_refresh_pod *pods = xcalloc(g->n + 1, sizeof(*pods));
    size_t n_pods = 0;
    /* register_parse_group sorted the endpoints by ip: each pod is a run of them. */
    for (size_t i = 0; i < g->n; i++) {
        snprintf(ports[i], sizeof(ports[i]), "%d", g->eps[i].port);
        eps[i] = (struct wire_endpoint){.id = (int64_t)i,
                                        .ip = g->eps[i].ip,
                                        .business_port = ports[i],
                                        .status = WIRE_EP_NORMAL};
        if (n_pods == 0 || strcmp(pods[n_pods - 1].pod_ip, g->eps[i].ip) != 0)
            pods[n_pods++] = (struct wire_refresh_pod){.pod_ip = g->eps[i].ip, .eps = &eps[i]};
        pods[n_pods - 1].n_eps++;
    }
    struct wire_strlist caps = {0};
    if (strcmp(o->engine, "vllm") == 0 && strcmp(g->role, "union") != 0)
        wire_strlist_push(&caps, "prefill_handoff_decode");
    enum wire_role role = WIRE_ROLE_UNION;
    wire_role_from_str(g->role, &role); /* validated when the options were read */
    struct wire_refresh_out out = {
        .id = g->id,
        .job_name = g->job,
        .model_name = o->model,
        .engine_type = o->engine,
        .role = role,
        .status = WIRE_INS_ACTIVE,
        .dispatch_caps = caps.n ? &caps : NULL,
        .multi_endpoints = true,
        .pods = pods,
        .n_pods = n_pods,
    };
    json_t *in = wire_refresh_instance_to_json(&out);
    wire_strlist_release(&caps);
    free(pods);
    free(ports);
    free(eps);
    return in;
}

/* The endpoint signature of a registered instance (GET /instances view), sorted. */
static char *view_signature(json_t *inst)
{
    json_t *eps = json_object_get(inst, "endpoints");
    size_t n = json_array_size(eps);
    struct register_ep *v = xcalloc(n + 1, sizeof(*v));
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(eps, i);
        const char *ip = json_string_value(json_object_get(e, "ip"));
        const char *port = json_string_value(json_object_get(e, "business_port"));
        int p = 0;
        if (!ip || !port || util_parse_int(port, 1, 65535, &p) < 0)
            continue;
        if (json_is_true(json_object_get(e, "headless")))
            continue; /* our registrations never have headless endpoints */
        v[k].ip = (char *)ip;
        v[k].port = p;
        k++;
    }
    qsort(v, k, sizeof(*v), ep_cmp);
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    for (size_t i = 0; i < k; i++)
        strbuf_appendf(&sb, "|%s:%d", v[i].ip, v[i].port);
    free(v);
    return strbuf_take(&sb);
}

static char *group_signature(const struct reg_group *g)
{
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    for (size_t i = 0; i < g->n; i++)
        strbuf_appendf(&sb, "|%s:%d", g->eps[i].ip, g->eps[i].port);
    return strbuf_take(&sb);
}

/* A del entry copied from the registered instance (role, job, model, endpoints). */
static json_t *del_entry(json_t *inst)
{
    json_t *eps = json_object();
    json_t *arr = json_object_get(inst, "endpoints");
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        const char *ip = json_string_value(json_object_get(e, "ip"));
        if (!ip)
            continue;
        json_t *m = json_object_get(eps, ip);
        if (!m) {
            m = json_object();
            json_object_set_new(eps, ip, m);
        }
        char id[24];
        snprintf(id, sizeof(id), "%lld", (long long)json_integer_value(json_object_get(e, "id")));
        json_object_set_new(m, id,
                            json_pack("{s:O, s:s, s:O, s:b}", "id", json_object_get(e, "id"), "ip",
                                      ip, "business_port", json_object_get(e, "business_port"),
                                      "headless", json_is_true(json_object_get(e, "headless"))));
    }
    json_t *out = json_pack("{s:O, s:O, s:o}", "id", json_object_get(inst, "id"), "role",
                            json_object_get(inst, "role"), "endpoints", eps);
    const char *keys[] = {"job_name", "model_name", "engine_type"};
    for (size_t k = 0; k < ARRAY_LEN(keys); k++) {
        json_t *v = json_object_get(inst, keys[k]);
        if (json_is_string(v))
            json_object_set(out, keys[k], v);
    }
    return out;
}

/* ---- the flow ------------------------------------------------------------------------- */

static int wait_liveness(const struct reg_opts *o)
{
    char *url = mgmt_url(o, "/liveness");
    int64_t deadline = util_mono_ms() + (int64_t)(o->timeout_s * 1000);
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    char err[512] = "";
    int rc = -ETIMEDOUT;
    for (;;) {
        long status = 0;
        if (http_do(o, &o->tls, "GET", url, NULL, 2000, &status, &sb, err, sizeof(err)) == 0 &&
            status == 200) {
            rc = 0;
            break;
        }
        if (util_mono_ms() >= deadline)
            break;
        usleep(200 * 1000);
    }
    if (rc)
        fprintf(stderr, "motor register: coordinator not live at %s within %.0f s%s%s\n", url,
                o->timeout_s, err[0] ? ": " : "", err);
    strbuf_release(&sb);
    free(url);
    return rc;
}

static json_t *get_instances(const struct reg_opts *o)
{
    char *url = mgmt_url(o, "/instances");
    struct strbuf sb;
    strbuf_init(&sb, REG_RESP_MAX);
    char err[512];
    long status = 0;
    json_t *j = NULL;
    if (http_do(o, &o->tls, "GET", url, NULL, REG_REQ_TIMEOUT_MS, &status, &sb, err, sizeof(err)) <
        0) {
        fprintf(stderr, "motor register: %s\n", err);
    } else if (status != 200) {
        fprintf(stderr, "motor register: GET %s answered HTTP %ld: %.300s\n", url, status,
                strbuf_str(&sb));
    } else {
        j = json_loadb(strbuf_str(&sb), sb.len, 0, NULL);
        if (!json_is_array(json_object_get(j, "instances"))) {
            fprintf(stderr, "motor register: GET %s: unexpected answer\n", url);
            json_decref(j);
            j = NULL;
        }
    }
    strbuf_release(&sb);
    free(url);
    return j;
}

static void print_readiness(const struct reg_opts *o)
{
    char *url = mgmt_url(o, "/readiness");
    struct strbuf sb;
    strbuf_init(&sb, 1 << 16);
    char err[512];
    long status = 0;
    if (http_do(o, &o->tls, "GET", url, NULL, REG_REQ_TIMEOUT_MS, &status, &sb, err, sizeof(err)) ==
        0)
        printf("readiness: HTTP %ld %s\n", status, strbuf_str(&sb));
    strbuf_release(&sb);
    free(url);
}

static int post_refresh(const struct reg_opts *o, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT);
    char *url = mgmt_url(o, "/instances/refresh");
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    char err[512];
    long status = 0;
    int rc = 0;
    if (http_do(o, &o->tls, "POST", url, text, REG_REQ_TIMEOUT_MS, &status, &sb, err, sizeof(err)) <
        0) {
        fprintf(stderr, "motor register: %s\n", err);
        rc = -EIO;
    } else if (status != 200) {
        fprintf(stderr, "motor register: refresh rejected (HTTP %ld): %.500s\n", status,
                strbuf_str(&sb));
        rc = -EINVAL;
    }
    strbuf_release(&sb);
    free(url);
    free(text);
    return rc;
}

static int do_list(const struct reg_opts *o)
{
    if (wait_liveness(o) < 0)
        return 1;
    json_t *j = get_instances(o);
    if (!j)
        return 1;
    json_t *arr = json_object_get(j, "instances");
    printf("%-12s %-8s %-20s %-9s %-12s %-8s %-9s %s\n", "ID", "ROLE", "MODEL", "STATUS", "POOL",
           "HEALTHY", "BREAKER", "ENDPOINTS");
    size_t i;
    json_t *in;
    json_array_foreach(arr, i, in)
    {
        struct strbuf eps;
        strbuf_init(&eps, 1 << 20);
        size_t k;
        json_t *e;
        json_array_foreach(json_object_get(in, "endpoints"), k, e)
        {
            const char *ip = json_string_value(json_object_get(e, "ip"));
            const char *port = json_string_value(json_object_get(e, "business_port"));
            strbuf_appendf(&eps, "%s%s%s%s:%s", k ? "," : "", ip && strchr(ip, ':') ? "[" : "",
                           ip ? ip : "?", ip && strchr(ip, ':') ? "]" : "", port ? port : "?");
            if (json_is_true(json_object_get(e, "headless")))
                strbuf_puts(&eps, "(headless)");
        }
        json_t *cb = json_object_get(in, "circuit_breaker");
        printf("%-12lld %-8s %-20s %-9s %-12s %-8s %-9s %s\n",
               (long long)json_integer_value(json_object_get(in, "id")),
               json_string_value(json_object_get(in, "role")) ?: "?",
               json_string_value(json_object_get(in, "model_name")) ?: "",
               json_string_value(json_object_get(in, "status")) ?: "?",
               json_string_value(json_object_get(in, "pool")) ?: "?",
               json_is_true(json_object_get(in, "healthy")) ? "yes" : "no",
               json_string_value(json_object_get(cb, "state")) ?: "?", strbuf_str(&eps));
        strbuf_release(&eps);
    }
    printf("%zu instance(s)\n", json_array_size(arr));
    json_decref(j);
    return 0;
}

static int do_del(struct reg_opts *o)
{
    if (o->n_groups == 0 && o->n_ids == 0) {
        fprintf(stderr, "motor register: del needs --id or --prefill/--decode\n");
        return 2;
    }
    if (wait_liveness(o) < 0)
        return 1;
    json_t *j = get_instances(o);
    if (!j)
        return 1;
    json_t *arr = json_object_get(j, "instances");
    json_t *dels = json_array();
    int rc = 0;
    for (size_t k = 0; k < o->n_ids && rc == 0; k++) {
        json_t *found = NULL, *in;
        size_t i;
        json_array_foreach(arr, i, in)
        {
            if (json_integer_value(json_object_get(in, "id")) == o->ids[k])
                found = in;
        }
        if (!found) {
            fprintf(stderr, "motor register: no registered instance has id %lld\n",
                    (long long)o->ids[k]);
            rc = 1;
            break;
        }
        json_array_append_new(dels, del_entry(found));
    }
    for (size_t g = 0; g < o->n_groups && rc == 0; g++) {
        char *want = group_signature(&o->groups[g]);
        json_t *found = NULL, *in;
        size_t i;
        json_array_foreach(arr, i, in)
        {
            const char *role = json_string_value(json_object_get(in, "role"));
            char *sig = view_signature(in);
            if (role && strcmp(role, o->groups[g].role) == 0 && strcmp(sig, want) == 0)
                found = in;
            free(sig);
        }
        if (!found) {
            fprintf(stderr, "motor register: no registered %s instance has endpoints %s\n",
                    o->groups[g].role, o->groups[g].spec);
            rc = 1;
        } else {
            json_array_append_new(dels, del_entry(found));
        }
        free(want);
    }
    if (rc == 0) {
        json_t *body = wire_refresh_body(WIRE_REFRESH_DEL, json_incref(dels));
        if (o->dry_run) {
            char *s = json_dumps(body, JSON_INDENT(2));
            printf("%s\n", s);
            free(s);
        } else if (post_refresh(o, body) < 0) {
            rc = 1;
        } else {
            size_t i;
            json_t *d;
            json_array_foreach(dels, i, d)
                printf("deleted instance %lld (%s)\n",
                       (long long)json_integer_value(json_object_get(d, "id")),
                       json_string_value(json_object_get(d, "role")));
        }
        json_decref(body);
    }
    json_decref(dels);
    json_decref(j);
    return rc;
}

/* Pick the model: --model-name, else the first reachable engine listing exactly one. */
static int resolve_model(struct reg_opts *o, char **owned)
{
    if (o->model)
        return 0;
    char err[512] = "no engine answered";
    for (size_t g = 0; g < o->n_groups; g++) {
        for (size_t i = 0; i < o->groups[g].n; i++) {
            char e[512];
            json_t *ids = engine_models(o, &o->groups[g].eps[i], e, sizeof(e));
            if (!ids) {
                snprintf(err, sizeof(err), "%s", e);
                continue;
            }
            if (json_array_size(ids) != 1) {
                fprintf(stderr, "motor register: %s:%d lists %zu models; pass --model-name\n",
                        o->groups[g].eps[i].ip, o->groups[g].eps[i].port, json_array_size(ids));
                json_decref(ids);
                return -EINVAL;
            }
            *owned = xstrdup(json_string_value(json_array_get(ids, 0)));
            o->model = *owned;
            json_decref(ids);
            fprintf(stderr, "model: %s (from %s:%d)\n", o->model, o->groups[g].eps[i].ip,
                    o->groups[g].eps[i].port);
            return 0;
        }
    }
    fprintf(stderr, "motor register: cannot find the model name (%s); pass --model-name\n", err);
    return -EIO;
}

static int health_check(const struct reg_opts *o)
{
    int bad = 0;
    for (size_t g = 0; g < o->n_groups; g++) {
        for (size_t i = 0; i < o->groups[g].n; i++) {
            const struct register_ep *ep = &o->groups[g].eps[i];
            char err[512];
            json_t *ids = engine_models(o, ep, err, sizeof(err));
            if (!ids) {
                fprintf(stderr, "motor register: health check failed: %s\n", err);
                bad++;
                continue;
            }
            bool has = false;
            size_t k;
            json_t *id;
            json_array_foreach(ids, k, id)
            {
                has |= strcmp(json_string_value(id), o->model) == 0;
            }
            if (!has) {
                fprintf(stderr,
                        "motor register: health check failed: %s:%d does not serve model '%s'%s\n",
                        ep->ip, ep->port, o->model,
                        json_array_size(ids) ? "" : " (its /v1/models list is empty)");
                bad++;
            }
            json_decref(ids);
        }
    }
    return bad ? -EIO : 0;
}

static int do_set_add(struct reg_opts *o)
{
    if (o->n_groups == 0) {
        fprintf(stderr, "motor register: %s needs at least one --prefill, --decode or --union\n",
                o->action);
        return 2;
    }
    if (o->n_ids) {
        fprintf(stderr, "motor register: --id is only for del\n");
        return 2;
    }
    char *model_owned = NULL;
    int rc = 1;
    if (resolve_model(o, &model_owned) < 0)
        goto out;
    for (size_t g = 0; g < o->n_groups; g++) {
        struct reg_group *grp = &o->groups[g];
        grp->id = register_instance_id(grp->role, grp->eps, grp->n);
        grp->job = xasprintf("%s-%s-%s-%d", o->model, grp->role, grp->eps[0].ip, grp->eps[0].port);
    }
    json_t *insts = json_array();
    for (size_t g = 0; g < o->n_groups; g++)
        json_array_append_new(insts, group_instance(o, &o->groups[g]));
    enum wire_refresh_event ev = strcmp(o->action, "add") == 0 ? WIRE_REFRESH_ADD : WIRE_REFRESH_SET;
    json_t *body = wire_refresh_body(ev, insts);
    if (o->dry_run) {
        char *s = json_dumps(body, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(body);
        rc = 0;
        goto out;
    }
    if (o->health_check && health_check(o) < 0) {
        fprintf(stderr, "motor register: aborted (use --no-health-check to skip the probe)\n");
        json_decref(body);
        goto out;
    }
    if (wait_liveness(o) < 0) {
        json_decref(body);
        goto out;
    }
    json_t *cur = get_instances(o);
    if (!cur) {
        json_decref(body);
        goto out;
    }
    bool clash = false;
    for (size_t g = 0; g < o->n_groups; g++) {
        const struct reg_group *grp = &o->groups[g];
        size_t i;
        json_t *in;
        json_array_foreach(json_object_get(cur, "instances"), i, in)
        {
            if (json_integer_value(json_object_get(in, "id")) != grp->id)
                continue;
            const char *role = json_string_value(json_object_get(in, "role"));
            const char *job = json_string_value(json_object_get(in, "job_name"));
            char *sig = view_signature(in), *want = group_signature(grp);
            bool same = role && strcmp(role, grp->role) == 0 && strcmp(sig, want) == 0;
            if (same && strcmp(o->action, "add") == 0 && (!job || strcmp(job, grp->job) != 0))
                same = false;
            if (!same) {
                fprintf(stderr,
                        "motor register: instance id %lld is already registered as %s %s (job "
                        "%s); it would collide with %s %s\n",
                        (long long)grp->id, role ? role : "?", sig, job ? job : "?", grp->role,
                        want);
                clash = true;
            }
            free(sig);
            free(want);
        }
    }
    json_decref(cur);
    if (clash) {
        json_decref(body);
        goto out;
    }
    if (post_refresh(o, body) < 0) {
        json_decref(body);
        goto out;
    }
    json_decref(body);
    for (size_t g = 0; g < o->n_groups; g++)
        printf("%s instance %lld (%s): %s\n", strcmp(o->action, "set") == 0 ? "set" : "added",
               (long long)o->groups[g].id, o->groups[g].role, o->groups[g].spec);
    print_readiness(o);
    rc = 0;
out:
    free(model_owned);
    return rc;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor register [set|add|del|list] [options]\n\n"
            "Register engines that run without a controller with a coordinator (standalone\n"
            "deployment). set (default) replaces every instance, add adds, del removes, list\n"
            "prints the registered instances.\n\n"
            "  --prefill IP:PORT[,IP:PORT...]  one prefill instance (its DP ranks); repeatable\n"
            "  --decode IP:PORT[,IP:PORT...]   one decode instance; repeatable\n"
            "  --union IP:PORT[,IP:PORT...]    one union (PD-mixed) instance; repeatable\n"
            "  --id N                 del: the instance id (repeatable)\n"
            "  --coordinator URL      base URL without port (default http://127.0.0.1)\n"
            "  --mgmt-port N          management port (default 1026)\n"
            "  --mgmt-api-key-file F  file holding X-Motor-Management-Key\n"
            "  --ca-file F            https:// coordinator: verify it against this CA (PEM)\n"
            "  --cert-file F --key-file F  client certificate (mutual TLS)\n"
            "  --engine-tls           the engines serve https: probe them with the same files\n"
            "  --model-name NAME      default: the engines' /v1/models\n"
            "  --engine-type TYPE     vllm (default) or sglang\n"
            "  --timeout S            wait for the coordinator this long (default 60)\n"
            "  --no-health-check      do not probe the engines' /v1/models\n"
            "  --dry-run              print the refresh body instead of sending it\n\n"
            "Instance ids: 0x40000000 | (CRC32(\"role|ip:port|...\") & 0x3FFFFFFF) over the\n"
            "endpoints sorted by (ip, port), so the order given does not matter.\n");
}

int register_main(int argc, char **argv)
{
    struct reg_opts o = {
        .action = "set",
        .coordinator = "http://127.0.0.1",
        .mgmt_port = 1026,
        .engine = "vllm",
        .timeout_s = 60,
        .health_check = true,
    };
    static const struct option opts[] = {
        {"prefill", required_argument, NULL, 'P'},
        {"decode", required_argument, NULL, 'D'},
        {"union", required_argument, NULL, 'U'},
        {"id", required_argument, NULL, 'i'},
        {"coordinator", required_argument, NULL, 'c'},
        {"mgmt-port", required_argument, NULL, 'm'},
        {"mgmt-api-key-file", required_argument, NULL, 'k'},
        {"model-name", required_argument, NULL, 'n'},
        {"engine-type", required_argument, NULL, 'e'},
        {"timeout", required_argument, NULL, 't'},
        {"no-health-check", no_argument, NULL, 'H'},
        {"ca-file", required_argument, NULL, 'A'},
        {"cert-file", required_argument, NULL, 'C'},
        {"key-file", required_argument, NULL, 'K'},
        {"engine-tls", no_argument, NULL, 'T'},
        {"dry-run", no_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int rc = 2;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'P':
        case 'D':
        case 'U': {
            o.groups = xrealloc(o.groups, (o.n_groups + 1) * sizeof(*o.groups));
            struct reg_group *g = &o.groups[o.n_groups];
            memset(g, 0, sizeof(*g));
            g->role = ch == 'P' ? "prefill" : ch == 'D' ? "decode" : "union";
            g->spec = optarg;
            char err[256];
            if (register_parse_group(optarg, &g->eps, &g->n, err, sizeof(err)) < 0) {
                fprintf(stderr, "motor register: --%s: %s\n", g->role, err);
                goto out;
            }
            o.n_groups++;
            break;
        }
        case 'i': {
            int64_t id;
            if (util_parse_i64(optarg, 0, INT64_MAX, &id) < 0) {
                fprintf(stderr, "motor register: --id must be a non-negative integer\n");
                goto out;
            }
            o.ids = xrealloc(o.ids, (o.n_ids + 1) * sizeof(*o.ids));
            o.ids[o.n_ids++] = id;
            break;
        }
        case 'c':
            o.coordinator = optarg;
            break;
        case 'm':
            if (util_parse_int(optarg, 1, 65535, &o.mgmt_port) < 0) {
                fprintf(stderr, "motor register: --mgmt-port must be 1-65535\n");
                goto out;
            }
            break;
        case 'k': {
            int krc = cfg_read_secret(optarg, &o.key);
            if (krc < 0) {
                fprintf(stderr, "motor register: cannot read --mgmt-api-key-file %s: %s\n", optarg,
                        krc == -EINVAL ? "empty" : strerror(-krc));
                goto out;
            }
            break;
        }
        case 'n':
            o.model = optarg;
            break;
        case 'e':
            if (strcmp(optarg, "vllm") != 0 && strcmp(optarg, "sglang") != 0) {
                fprintf(stderr, "motor register: --engine-type must be vllm or sglang\n");
                goto out;
            }
            o.engine = optarg;
            break;
        case 't':
            if (util_parse_double(optarg, 0, 86400, &o.timeout_s) < 0) {
                fprintf(stderr, "motor register: --timeout must be seconds (0-86400)\n");
                goto out;
            }
            break;
        case 'H':
            o.health_check = false;
            break;
        case 'A':
            o.tls.ca_file = optarg;
            break;
        case 'C':
            o.tls.cert_file = optarg;
            break;
        case 'K':
            o.tls.key_file = optarg;
            break;
        case 'T':
            o.engine_tls = true;
            break;
        case 'd':
            o.dry_run = true;
            break;
        case 'h':
            usage(stdout);
            rc = 0;
            goto out;
        default:
            usage(stderr);
            goto out;
        }
    }
    if (optind < argc)
        o.action = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "motor register: unexpected argument '%s'\n", argv[optind]);
        goto out;
    }
    if (strcmp(o.action, "set") && strcmp(o.action, "add") && strcmp(o.action, "del") &&
        strcmp(o.action, "list")) {
        fprintf(stderr, "motor register: unknown action '%s' (set, add, del, list)\n", o.action);
        goto out;
    }
    for (size_t a = 0; a < o.n_groups; a++)
        for (size_t b = a; b < o.n_groups; b++)
            for (size_t i = 0; i < o.groups[a].n; i++)
                for (size_t j = (a == b ? i + 1 : 0); j < o.groups[b].n; j++)
                    if (strcmp(o.groups[a].eps[i].ip, o.groups[b].eps[j].ip) == 0 &&
                        o.groups[a].eps[i].port == o.groups[b].eps[j].port) {
                        fprintf(stderr, "motor register: endpoint %s:%d is in two instances\n",
                                o.groups[a].eps[i].ip, o.groups[a].eps[i].port);
                        goto out;
                    }
    if (strcmp(o.action, "list") == 0)
        rc = do_list(&o);
    else if (strcmp(o.action, "del") == 0)
        rc = do_del(&o);
    else
        rc = do_set_add(&o);
out:
    for (size_t g = 0; g < o.n_groups; g++) {
        register_eps_free(o.groups[g].eps, o.groups[g].n);
        free(o.groups[g].job);
    }
    free(o.groups);
    free(o.ids);
    if (o.key) {
        explicit_bzero(o.key, strlen(o.key));
        free(o.key);
    }
    fflush(stdout);
    return rc;
}
