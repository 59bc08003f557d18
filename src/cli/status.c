/* status — see status.h. */
#include "cli/status.h"

#include "cli/commands.h"
#include "common/cliopt.h"
#include "common/cfg.h"
#include "common/log.h"
#include "common/reactor.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATUS_RECENT_ALARMS 5 /* cleared precision alarms shown */
#define STATUS_MAX_JSON (8u << 20)
#define STATUS_MAX_METRICS (4u << 20)
#define STATUS_DEFAULT_TIMEOUT_MS 3000

/* ---- table ------------------------------------------------------------------------ */

void status_table_init(struct status_table *t, size_t ncols)
{
    memset(t, 0, sizeof(*t));
    t->ncols = ncols ? ncols : 1;
}

void status_table_cell(struct status_table *t, const char *fmt, ...)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 32;
        t->cells = xrealloc(t->cells, t->cap * sizeof(char *));
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = xstrdup("?");
    va_end(ap);
    t->cells[t->n++] = s;
}

/* Display width: UTF-8 continuation bytes take no column. */
static size_t text_width(const char *s)
{
    size_t w = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80)
            w++;
    return w;
}

void status_table_render(const struct status_table *t, struct strbuf *out, const char *indent)
{
    size_t *w = xcalloc(t->ncols, sizeof(size_t));
    for (size_t i = 0; i < t->n; i++) {
        size_t tw = text_width(t->cells[i]);
        if (tw > w[i % t->ncols])
            w[i % t->ncols] = tw;
    }
    for (size_t i = 0; i < t->n; i++) {
        size_t col = i % t->ncols;
        if (col == 0)
            strbuf_puts(out, indent ? indent : "");
        strbuf_puts(out, t->cells[i]);
        bool last = col == t->ncols - 1 || i == t->n - 1;
        if (last) {
            strbuf_putc(out, '\n');
        } else {
            for (size_t k = text_width(t->cells[i]); k < w[col] + 2; k++)
                strbuf_putc(out, ' ');
        }
    }
    free(w);
}

void status_table_release(struct status_table *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof(*t));
}

/* ---- metrics ---------------------------------------------------------------------- */

double status_metric_sum(const char *text, const char *name)
{
    if (!text || !name)
        return -1;
    size_t nl = strlen(name);
    double sum = 0;
    bool seen = false;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (len > nl && strncmp(p, name, nl) == 0 && (p[nl] == '{' || p[nl] == ' ')) {
            /* The value follows the label set (labels may contain spaces in values). */
            const char *v = p + nl;
            const char *end = p + len;
            if (*v == '{') {
                bool inq = false;
                for (v++; v < end; v++) {
                    if (*v == '\\' && inq) {
                        v++;
                        continue;
                    }
                    if (*v == '"')
                        inq = !inq;
                    else if (*v == '}' && !inq)
                        break;
                }
                if (v < end)
                    v++;
            }
            char num[64];
            while (v < end && *v == ' ')
                v++;
            size_t k = 0;
            while (v < end && *v != ' ' && k < sizeof(num) - 1)
                num[k++] = *v++;
            num[k] = '\0';
            double d;
            if (k && util_parse_double(num, -1e300, 1e300, &d) == 0) {
                sum += d;
                seen = true;
            }
        }
        if (!eol)
            break;
        p = eol + 1;
    }
    return seen ? sum : -1;
}

/* ---- fetch ------------------------------------------------------------------------ */

enum { F_CTL_INST = 0, F_CTL_FT, F_CTL_PREC, F_COORD_INST, F_COORD_METRICS, F_COUNT };

struct fetch_slot {
    struct status_fetch *f;
    int which;
};

struct status_fetch {
    struct httpc *hc;
    char *ctl, *coord, *key_header;
    struct httpc_req *req[F_COUNT];
    struct fetch_slot slot[F_COUNT];
    int pending;
    struct status_docs docs;
    status_done_cb done;
    void *arg;
};

void status_docs_release(struct status_docs *d)
{
    if (!d)
        return;
    json_decref(d->ctl_instances);
    json_decref(d->ctl_ft);
    json_decref(d->ctl_prec);
    json_decref(d->coord_instances);
    free(d->ctl_error);
    free(d->coord_error);
    free(d->coord_metrics);
    memset(d, 0, sizeof(*d));
}

static void fetch_free(struct status_fetch *f)
{
    status_docs_release(&f->docs);
    free(f->ctl);
    free(f->coord);
    free(f->key_header);
    free(f);
}

static char *resp_error(const struct httpc_response *r)
{
    if (r->error)
        return xstrdup(r->error_text && *r->error_text ? r->error_text : strerror(-r->error));
    if (r->status < 200 || r->status > 299) {
        size_t n = r->body_len < 160 ? r->body_len : 160;
        return xasprintf("HTTP %ld: %.*s", r->status, (int)n, r->body ? r->body : "");
    }
    return NULL;
}

static void fetch_done(const struct httpc_response *resp, void *arg)
{
    struct fetch_slot *s = arg;
    struct status_fetch *f = s->f;
    f->req[s->which] = NULL;
    char *err = resp_error(resp);
    json_t *doc = NULL;
    if (!err && s->which != F_COORD_METRICS) {
        json_error_t je;
        doc = json_loadb(resp->body, resp->body_len, 0, &je);
        if (!doc)
            err = xasprintf("invalid JSON answer: %s", je.text);
    }
    switch (s->which) {
    case F_CTL_INST:
        f->docs.ctl_instances = doc;
        f->docs.ctl_error = err;
        err = NULL;
        break;
    case F_CTL_FT:
        f->docs.ctl_ft = doc;
        break;
    case F_CTL_PREC:
        f->docs.ctl_prec = doc;
        break;
    case F_COORD_INST:
        f->docs.coord_instances = doc;
        f->docs.coord_error = err;
        err = NULL;
        break;
    case F_COORD_METRICS:
        if (!err)
            f->docs.coord_metrics = xstrndup(resp->body, resp->body_len);
        break;
    }
    free(err);
    if (--f->pending == 0) {
        f->done(&f->docs, f->arg);
        fetch_free(f);
    }
}

struct fetch_todo {
    int which;
    const char *base, *path;
    size_t cap;
    const char *header;
};

struct status_fetch *status_fetch_start(struct httpc *hc, const struct status_targets *t,
                                        int64_t timeout_ms, status_done_cb done, void *arg)
{
    struct status_fetch *f = xcalloc(1, sizeof(*f));
    f->hc = hc;
    f->done = done;
    f->arg = arg;
    f->ctl = t->controller ? xstrdup(t->controller) : NULL;
    f->coord = t->coordinator ? xstrdup(t->coordinator) : NULL;
    if (t->mgmt_key)
        f->key_header = xasprintf("X-Motor-Management-Key: %s", t->mgmt_key);
    if (timeout_ms <= 0)
        timeout_ms = STATUS_DEFAULT_TIMEOUT_MS;
    /* Count every request first so that a synchronous completion cannot end the fetch
     * while others are still to be started. */
    struct fetch_todo todo[F_COUNT];
    size_t n = 0;
    if (f->ctl) {
        todo[n++] =
            (struct fetch_todo){F_CTL_INST, f->ctl, "/controller/instances", STATUS_MAX_JSON, NULL};
        todo[n++] = (struct fetch_todo){F_CTL_FT, f->ctl, "/controller/fault_tolerance/status",
                                        STATUS_MAX_JSON, NULL};
        todo[n++] = (struct fetch_todo){F_CTL_PREC, f->ctl, "/controller/precision/alarms",
                                        STATUS_MAX_JSON, NULL};
    }
    if (f->coord) {
        todo[n++] = (struct fetch_todo){F_COORD_INST, f->coord, "/instances", STATUS_MAX_JSON,
                                        f->key_header};
        todo[n++] =
            (struct fetch_todo){F_COORD_METRICS, f->coord, "/metrics", STATUS_MAX_METRICS, NULL};
    }
    f->pending = (int)n + 1; /* +1: held until every request is started */
    for (size_t i = 0; i < n; i++) {
        char *url = xasprintf("%s%s", todo[i].base, todo[i].path);
        const char *headers[] = {"Accept: */*", todo[i].header, NULL};
        struct httpc_opts o = {
            .url = url,
            .timeout_ms = timeout_ms,
            .max_response = todo[i].cap,
            .headers = headers,
            .tls = t->tls,
        };
        f->slot[todo[i].which] = (struct fetch_slot){f, todo[i].which};
        f->req[todo[i].which] = httpc_request(hc, &o, fetch_done, &f->slot[todo[i].which]);
        free(url);
    }
    if (--f->pending == 0) {
        /* Nothing asked at all: answer from the loop would need a timer; answer now. */
        f->done(&f->docs, f->arg);
        fetch_free(f);
        return NULL;
    }
    return f;
}

void status_fetch_cancel(struct status_fetch *f)
{
    if (!f)
        return;
    for (int i = 0; i < F_COUNT; i++)
        if (f->req[i])
            httpc_cancel(f->hc, f->req[i]);
    fetch_free(f);
}

/* ---- model ------------------------------------------------------------------------- */

/* An integer from a JSON integer, integral real or decimal string. */
static bool json_int_of(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e15) {
            *out = (int64_t)d;
            return true;
        }
        return false;
    }
    if (json_is_string(v))
        return util_parse_i64(json_string_value(v), INT64_MIN, INT64_MAX, out) == 0;
    return false;
}

static const char *str_or(const json_t *obj, const char *key, const char *def)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : def;
}

/* The instance list of a controller answer: [..], {"instances":[..]}, {"data":[..]} or
 * {"data":{"instances":[..]}}. Borrowed or NULL. */
static json_t *instance_list(json_t *doc)
{
    if (json_is_array(doc))
        return doc;
    if (!json_is_object(doc))
        return NULL;
    json_t *v = json_object_get(doc, "instances");
    if (json_is_array(v))
        return v;
    json_t *data = json_object_get(doc, "data");
    if (json_is_array(data))
        return data;
    v = json_object_get(data, "instances");
    return json_is_array(v) ? v : NULL;
}

static char *address_of(const json_t *ep, const char *ip_fallback)
{
    const char *addr = json_string_value(json_object_get(ep, "address"));
    if (addr)
        return xstrdup(addr);
    const char *ip = str_or(ep, "ip", ip_fallback ? ip_fallback : "?");
    int64_t port;
    const char *colon = strchr(ip, ':') ? "]" : "";
    if (json_int_of(json_object_get(ep, "business_port"), &port) ||
        json_int_of(json_object_get(ep, "port"), &port))
        return xasprintf("%s%s%s:%lld", *colon ? "[" : "", ip, colon, (long long)port);
    return xstrdup(ip);
}

static json_t *endpoint_model(const json_t *ep, const char *ip_fallback, double now)
{
    int64_t id = -1;
    json_int_of(json_object_get(ep, "id"), &id);
    char *addr = address_of(ep, ip_fallback);
    /* Motor's controller gives the age; upstream-shaped documents the time. */
    json_t *ha = json_object_get(ep, "heartbeat_age_s");
    json_t *hb = json_object_get(ep, "hb_timestamp");
    json_t *age = json_null();
    double a = -1;
    if (json_is_number(ha))
        a = json_number_value(ha);
    else if (json_is_number(hb) && json_number_value(hb) > 0)
        a = now - json_number_value(hb);
    if (a >= 0 || json_is_number(hb))
        age = json_real(a < 0 ? 0 : floor(a * 10 + 0.5) / 10);
    json_t *m = json_pack("{s:I,s:s,s:s,s:o,s:b,s:b}", "id", (json_int_t)id, "address", addr,
                          "status", str_or(ep, "status", "?"), "hb_age_s", age, "headless",
                          json_is_true(json_object_get(ep, "headless")), "retired",
                          json_is_true(json_object_get(ep, "retired")));
    free(addr);
    return m;
}

static int ep_cmp(const void *a, const void *b)
{
    json_t *const *x = a, *const *y = b;
    json_int_t i = json_integer_value(json_object_get(*x, "id"));
    json_int_t j = json_integer_value(json_object_get(*y, "id"));
    return (i > j) - (i < j);
}

/* Endpoints of a controller instance: "endpoints" as {pod_ip: {id: ep}} or [ep], else
 * gathered from "node_managers": [{pod_ip, endpoints: [ep]}]. Sorted by id. */
static json_t *endpoints_model(const json_t *inst, double now)
{
    size_t n = 0, cap = 8;
    json_t **v = xcalloc(cap, sizeof(json_t *));
    const char *ip;
    json_t *pod;
    size_t i;
    json_t *ep;
    json_t *eps = json_object_get(inst, "endpoints");
    json_t *nms = json_object_get(inst, "node_managers");
    if (!eps && json_is_array(nms)) {
        json_t *nm;
        json_array_foreach(nms, i, nm)
        {
            size_t k;
            json_array_foreach(json_object_get(nm, "endpoints"), k, ep)
            {
                if (!json_is_object(ep))
                    continue;
                if (n == cap)
                    v = xrealloc(v, (cap *= 2) * sizeof(json_t *));
                v[n++] = endpoint_model(ep, str_or(nm, "pod_ip", NULL), now);
            }
        }
    } else if (json_is_array(eps)) {
        json_array_foreach(eps, i, ep)
        {
            if (!json_is_object(ep))
                continue;
            if (n == cap)
                v = xrealloc(v, (cap *= 2) * sizeof(json_t *));
            v[n++] = endpoint_model(ep, NULL, now);
        }
    } else if (json_is_object(eps)) {
        json_object_foreach((json_t *)eps, ip, pod)
        {
            const char *eid;
            if (!json_is_object(pod))
                continue;
            json_object_foreach(pod, eid, ep)
            {
                if (!json_is_object(ep))
                    continue;
                if (n == cap)
                    v = xrealloc(v, (cap *= 2) * sizeof(json_t *));
                v[n++] = endpoint_model(ep, ip, now);
            }
        }
    }
    qsort(v, n, sizeof(json_t *), ep_cmp);
    json_t *arr = json_array();
    for (size_t k = 0; k < n; k++)
        json_array_append_new(arr, v[k]);
    free(v);
    return arr;
}

static void problem(json_t *problems, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void problem(json_t *problems, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    json_array_append_new(problems, json_string(s ? s : "?"));
    free(s);
}

/* FT phase of instance id from the controller's FT status, or the global "DISABLED". */
static const char *ft_phase_of(const json_t *ft, int64_t id)
{
    json_t *data = json_object_get(ft, "data");
    if (!json_is_object(data))
        return NULL;
    const char *global = json_string_value(json_object_get(data, "phase"));
    json_t *list = json_object_get(data, "instances");
    size_t i;
    json_t *rt;
    json_array_foreach(list, i, rt)
    {
        int64_t rid;
        if (json_int_of(json_object_get(rt, "instance_id"), &rid) && rid == id)
            return str_or(rt, "phase", NULL);
    }
    return global;
}

static bool ft_phase_ok(const char *ph)
{
    return !ph || strcmp(ph, "NORMAL") == 0 || strcmp(ph, "DISABLED") == 0 ||
           strcmp(ph, "SCALED_DOWN_RUNNING") == 0;
}

static int inst_cmp(const void *a, const void *b)
{
    json_t *const *x = a, *const *y = b;
    json_int_t i = json_integer_value(json_object_get(*x, "id"));
    json_int_t j = json_integer_value(json_object_get(*y, "id"));
    return (i > j) - (i < j);
}

static json_t *sorted(json_t *arr)
{
    size_t n = json_array_size(arr);
    json_t **v = xcalloc(n ? n : 1, sizeof(json_t *));
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof(json_t *), inst_cmp);
    json_t *out = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(out, v[i]);
    free(v);
    json_decref(arr);
    return out;
}

static json_t *find_by_id(json_t *arr, int64_t id)
{
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        if (json_integer_value(json_object_get(v, "id")) == id)
            return v;
    }
    return NULL;
}

json_t *status_model(const struct status_targets *t, const struct status_docs *d, double now_wall_s)
{
    json_t *problems = json_array();
    json_t *insts = json_array();
    json_t *pools = json_array();

    /* controller */
    bool ctl_ok = t->controller && !d->ctl_error && d->ctl_instances;
    json_t *ctl = json_pack("{s:s?,s:b,s:s?}", "url", t->controller, "reachable", ctl_ok, "error",
                            t->controller ? d->ctl_error : NULL);
    if (t->controller && !ctl_ok) {
        problem(problems, "controller %s: %s", t->controller,
                d->ctl_error ? d->ctl_error : "no answer");
    }
    json_t *list = ctl_ok ? instance_list(d->ctl_instances) : NULL;
    if (ctl_ok && !list)
        problem(problems, "controller %s: /controller/instances answer has no instance list",
                t->controller);
    size_t i;
    json_t *in;
    /* Assembled instances, then those still assembling (Motor's controller lists them
     * apart, with status "assembling"). */
    json_t *all = json_array();
    if (list)
        json_array_extend(all, list);
    json_t *assembling = json_object_get(d->ctl_instances, "assembling");
    if (ctl_ok && json_is_array(assembling))
        json_array_extend(all, assembling);
    json_array_foreach(all, i, in)
    {
        if (!json_is_object(in))
            continue;
        int64_t id = -1;
        json_int_of(json_object_get(in, "id"), &id);
        const char *role = str_or(in, "role", "?");
        const char *st = str_or(in, "status", "?");
        const char *ph = json_is_string(json_object_get(in, "ft_phase"))
                             ? json_string_value(json_object_get(in, "ft_phase"))
                             : ft_phase_of(d->ctl_ft, id);
        json_t *eps = endpoints_model(in, now_wall_s);
        json_t *m =
            json_pack("{s:I,s:s,s:s,s:s,s:s,s:s?,s:o}", "id", (json_int_t)id, "role", role,
                      "job_name", str_or(in, "job_name", ""), "model_name",
                      str_or(in, "model_name", ""), "status", st, "ft_phase", ph, "endpoints", eps);
        const char *strat = str_or(in, "strategy", NULL);
        if (strat)
            json_object_set_new(m, "strategy", json_string(strat));
        json_array_append_new(insts, m);
        if (strcmp(st, "active") != 0)
            problem(problems, "instance %lld (%s) is %s", (long long)id, role, st);
        else if (json_is_true(json_object_get(in, "withdrawn")))
            problem(problems, "instance %lld (%s) is withdrawn from the coordinator%s%s",
                    (long long)id, role, strat ? " while running " : "", strat ? strat : "");
        if (!ft_phase_ok(ph))
            problem(problems, "instance %lld (%s) fault tolerance: %s", (long long)id, role, ph);
        size_t k;
        json_t *ep;
        json_array_foreach(eps, k, ep)
        {
            const char *es = str_or(ep, "status", "?");
            if (!json_is_true(json_object_get(ep, "headless")) &&
                !json_is_true(json_object_get(ep, "retired")) && strcmp(es, "normal") != 0)
                problem(problems, "instance %lld (%s) endpoint %lld at %s is %s", (long long)id,
                        role, (long long)json_integer_value(json_object_get(ep, "id")),
                        str_or(ep, "address", "?"), es);
        }
    }
    json_decref(all);
    /* Node managers refusing the controller's management key: every call the controller
     * makes to them (start, stop, relaunch, FT) fails until the keys agree. */
    json_t *auth = ctl_ok ? json_object_get(d->ctl_instances, "node_manager_auth") : NULL;
    json_t *refusing = json_object_get(auth, "refusing");
    json_t *rf;
    json_array_foreach(refusing, i, rf)
    {
        long code = (long)json_integer_value(json_object_get(rf, "status"));
        problem(problems,
                "controller cannot authenticate to node manager %s: HTTP %ld on %s (%s); %s",
                str_or(rf, "node_manager", "?"), code, str_or(rf, "route", "?"),
                code == 401 ? "no management key sent" : "management key refused",
                str_or(auth, "fix", "check the management keys"));
    }
    insts = sorted(insts);
    if (ctl_ok && list && json_array_size(insts) == 0)
        problem(problems, "no instance is registered with the controller");

    /* coordinator */
    bool co_ok = t->coordinator && !d->coord_error && d->coord_instances;
    double reqs = status_metric_sum(d->coord_metrics, "motor_coordinator_requests_total");
    double infl = status_metric_sum(d->coord_metrics, "motor_coordinator_inflight_requests");
    json_t *co =
        json_pack("{s:s?,s:b,s:s?,s:o,s:o}", "url", t->coordinator, "reachable", co_ok, "error",
                  t->coordinator ? d->coord_error : NULL, "requests_total",
                  reqs >= 0 ? json_integer((json_int_t)reqs) : json_null(), "inflight_requests",
                  infl >= 0 ? json_integer((json_int_t)infl) : json_null());
    if (t->coordinator && !co_ok)
        problem(problems, "coordinator %s: %s", t->coordinator,
                d->coord_error ? d->coord_error : "no answer");
    json_t *clist = co_ok ? instance_list(d->coord_instances) : NULL;
    json_array_foreach(clist, i, in)
    {
        if (!json_is_object(in))
            continue;
        int64_t id = -1;
        json_int_of(json_object_get(in, "id"), &id);
        json_t *cb = json_object_get(in, "circuit_breaker");
        const char *role = str_or(in, "role", "?");
        const char *pool = str_or(in, "pool", "?");
        const char *brk = str_or(cb, "state", "?");
        bool healthy = json_is_true(json_object_get(in, "healthy"));
        int64_t trips = 0;
        json_int_of(json_object_get(cb, "trip_count"), &trips);
        json_t *eps = json_array();
        size_t k;
        json_t *ep;
        json_array_foreach(json_object_get(in, "endpoints"), k, ep)
        {
            int64_t eid = -1, infl_ep = 0;
            json_int_of(json_object_get(ep, "id"), &eid);
            json_int_of(json_object_get(ep, "inflight_requests"), &infl_ep);
            char *addr = address_of(ep, NULL);
            json_array_append_new(eps,
                                  json_pack("{s:I,s:s,s:s,s:I}", "id", (json_int_t)eid, "address",
                                            addr, "status", str_or(ep, "status", "?"),
                                            "inflight_requests", (json_int_t)infl_ep));
            free(addr);
        }
        json_array_append_new(
            pools, json_pack("{s:I,s:s,s:s,s:s,s:s,s:s,s:b,s:s,s:I,s:o}", "id", (json_int_t)id,
                             "role", role, "job_name", str_or(in, "job_name", ""), "model_name",
                             str_or(in, "model_name", ""), "status", str_or(in, "status", "?"),
                             "pool", pool, "healthy", healthy, "breaker", brk, "trip_count",
                             (json_int_t)trips, "endpoints", eps));
        if (!healthy)
            problem(problems,
                    "coordinator: instance %lld (%s) is not routable (pool %s, breaker %s)",
                    (long long)id, role, pool, brk);
    }
    pools = sorted(pools);
    if (co_ok && clist && ctl_ok) {
        json_array_foreach(insts, i, in)
        {
            int64_t id = json_integer_value(json_object_get(in, "id"));
            if (strcmp(str_or(in, "status", ""), "active") == 0 && !find_by_id(pools, id))
                problem(problems, "coordinator does not know active instance %lld (%s)",
                        (long long)id, str_or(in, "role", "?"));
        }
    }
    if (co_ok && !t->controller && json_array_size(pools) == 0)
        problem(problems, "the coordinator has no instance");

    /* active precision alarms: an engine that answers garbage is a problem however
     * healthy its process looks; the last cleared ones are shown, not problems */
    json_t *alarms = json_array();
    json_t *recent_alarms = json_array();
    json_t *act = ctl_ok ? json_object_get(d->ctl_prec, "active") : NULL;
    json_t *rec = ctl_ok ? json_object_get(d->ctl_prec, "recent") : NULL;
    json_array_foreach(json_is_array(rec) ? rec : NULL, i, in)
    {
        if (i >= STATUS_RECENT_ALARMS)
            break;
        const json_t *al = json_object_get(in, "alarm");
        int64_t did = -1, at = 0;
        json_int_of(json_object_get(in, "d_instance_id"), &did);
        json_int_of(json_object_get(in, "cleared_at_ms"), &at);
        json_array_append_new(
            recent_alarms,
            json_pack("{s:s,s:I,s:s,s:s,s:I}", "alarm_id", str_or(al, "alarm_id", "?"),
                      "d_instance_id", (json_int_t)did, "moi", str_or(in, "moi", ""), "cleared_by",
                      str_or(in, "cleared_by", ""), "cleared_at_ms", (json_int_t)at));
    }
    json_array_foreach(json_is_array(act) ? act : NULL, i, in)
    {
        const json_t *al = json_object_get(in, "alarm");
        int64_t did = -1, pid = -1, at = 0;
        json_int_of(json_object_get(in, "d_instance_id"), &did);
        json_int_of(json_object_get(in, "p_instance_id"), &pid);
        json_int_of(json_object_get(in, "raised_at_ms"), &at);
        json_t *a = json_pack("{s:s,s:s,s:I,s:s,s:I}", "alarm_id", str_or(al, "alarm_id", "?"),
                              "alarm_name", str_or(al, "alarm_name", "precision alarm"),
                              "d_instance_id", (json_int_t)did, "moi", str_or(in, "moi", ""),
                              "raised_at_ms", (json_int_t)at);
        json_object_set_new(a, "p_instance_id", pid >= 0 ? json_integer(pid) : json_null());
        json_array_append_new(alarms, a);
        if (pid >= 0)
            problem(problems, "%s %s on decode instance %lld (prefill %lld)",
                    str_or(al, "alarm_name", "precision alarm"), str_or(al, "alarm_id", "?"),
                    (long long)did, (long long)pid);
        else
            problem(problems, "%s %s on instance %lld", str_or(al, "alarm_name", "precision alarm"),
                    str_or(al, "alarm_id", "?"), (long long)did);
    }

    bool healthy = json_array_size(problems) == 0;
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o,s:o,s:b}", "controller", ctl, "coordinator", co,
                     "instances", insts, "pools", pools, "alarms", alarms, "recent_alarms",
                     recent_alarms, "problems", problems, "healthy", healthy);
}

bool status_model_healthy(const json_t *model)
{
    return json_is_true(json_object_get(model, "healthy"));
}

/* ---- render ----------------------------------------------------------------------- */

static void render_side(struct strbuf *out, const char *label, const json_t *side, size_t n,
                        const char *what)
{
    const char *url = json_string_value(json_object_get(side, "url"));
    if (!url) {
        strbuf_appendf(out, "%-12s (not asked)\n", label);
        return;
    }
    if (json_is_true(json_object_get(side, "reachable")))
        strbuf_appendf(out, "%-12s %s  ok, %zu %s\n", label, url, n, what);
    else
        strbuf_appendf(out, "%-12s %s  UNREACHABLE: %s\n", label, url,
                       str_or(side, "error", "no answer"));
}

void status_render(struct strbuf *out, const json_t *m)
{
    json_t *insts = json_object_get(m, "instances");
    json_t *pools = json_object_get(m, "pools");
    json_t *co = json_object_get(m, "coordinator");
    render_side(out, "controller", json_object_get(m, "controller"), json_array_size(insts),
                "instance(s)");
    render_side(out, "coordinator", co, json_array_size(pools), "instance(s)");
    json_t *reqs = json_object_get(co, "requests_total");
    if (json_is_integer(reqs))
        strbuf_appendf(out, "%-12s %lld served, %lld in flight\n", "requests",
                       (long long)json_integer_value(reqs),
                       (long long)json_integer_value(json_object_get(co, "inflight_requests")));

    size_t i, k;
    json_t *in, *ep;
    if (json_array_size(insts)) {
        struct status_table t;
        status_table_init(&t, 6);
        const char *h[] = {"ID", "ROLE", "STATUS", "FT PHASE", "MODEL", "JOB"};
        for (size_t c = 0; c < 6; c++)
            status_table_cell(&t, "%s", h[c]);
        json_array_foreach(insts, i, in)
        {
            status_table_cell(&t, "%lld", (long long)json_integer_value(json_object_get(in, "id")));
            status_table_cell(&t, "%s", str_or(in, "role", "?"));
            status_table_cell(&t, "%s", str_or(in, "status", "?"));
            if (json_object_get(in, "strategy"))
                status_table_cell(&t, "%s (%s)", str_or(in, "ft_phase", "-"),
                                  str_or(in, "strategy", ""));
            else
                status_table_cell(&t, "%s", str_or(in, "ft_phase", "-"));
            status_table_cell(&t, "%s", str_or(in, "model_name", ""));
            status_table_cell(&t, "%s", str_or(in, "job_name", ""));
        }
        strbuf_puts(out, "\nINSTANCES (controller)\n");
        status_table_render(&t, out, "  ");
        status_table_release(&t);

        status_table_init(&t, 5);
        const char *he[] = {"INSTANCE", "ENDPOINT", "ADDRESS", "STATUS", "HEARTBEAT"};
        for (size_t c = 0; c < 5; c++)
            status_table_cell(&t, "%s", he[c]);
        json_array_foreach(insts, i, in)
        {
            json_array_foreach(json_object_get(in, "endpoints"), k, ep)
            {
                status_table_cell(&t, "%lld",
                                  (long long)json_integer_value(json_object_get(in, "id")));
                status_table_cell(&t, "%lld",
                                  (long long)json_integer_value(json_object_get(ep, "id")));
                status_table_cell(&t, "%s", str_or(ep, "address", "?"));
                status_table_cell(&t, "%s%s", str_or(ep, "status", "?"),
                                  json_is_true(json_object_get(ep, "headless")) ? " (headless)"
                                                                                : "");
                json_t *age = json_object_get(ep, "hb_age_s");
                if (json_is_number(age))
                    status_table_cell(&t, "%.1fs ago", json_number_value(age));
                else
                    status_table_cell(&t, "-");
            }
        }
        strbuf_puts(out, "\nENDPOINTS (controller)\n");
        status_table_render(&t, out, "  ");
        status_table_release(&t);
    }
    if (json_array_size(pools)) {
        struct status_table t;
        status_table_init(&t, 8);
        const char *h[] = {"ID",       "ROLE",    "STATUS", "POOL",
                           "ROUTABLE", "BREAKER", "TRIPS",  "ENDPOINTS (in flight)"};
        for (size_t c = 0; c < 8; c++)
            status_table_cell(&t, "%s", h[c]);
        json_array_foreach(pools, i, in)
        {
            status_table_cell(&t, "%lld", (long long)json_integer_value(json_object_get(in, "id")));
            status_table_cell(&t, "%s", str_or(in, "role", "?"));
            status_table_cell(&t, "%s", str_or(in, "status", "?"));
            status_table_cell(&t, "%s", str_or(in, "pool", "?"));
            status_table_cell(&t, "%s",
                              json_is_true(json_object_get(in, "healthy")) ? "yes" : "NO");
            status_table_cell(&t, "%s", str_or(in, "breaker", "?"));
            status_table_cell(&t, "%lld",
                              (long long)json_integer_value(json_object_get(in, "trip_count")));
            struct strbuf eb;
            strbuf_init(&eb, 4096);
            json_array_foreach(json_object_get(in, "endpoints"), k, ep)
            {
                strbuf_appendf(
                    &eb, "%s%s (%lld)", k ? ", " : "", str_or(ep, "address", "?"),
                    (long long)json_integer_value(json_object_get(ep, "inflight_requests")));
            }
            status_table_cell(&t, "%s", strbuf_str(&eb) ? strbuf_str(&eb) : "");
            strbuf_release(&eb);
        }
        strbuf_puts(out, "\nCOORDINATOR POOLS\n");
        status_table_render(&t, out, "  ");
        status_table_release(&t);
    }
    json_t *alarms = json_object_get(m, "alarms");
    if (json_array_size(alarms)) {
        struct status_table t;
        status_table_init(&t, 5);
        const char *h[] = {"ALARM", "NAME", "INSTANCE", "PREFILL", "MOI"};
        for (size_t c = 0; c < 5; c++)
            status_table_cell(&t, "%s", h[c]);
        json_array_foreach(alarms, i, in)
        {
            status_table_cell(&t, "%s", str_or(in, "alarm_id", "?"));
            status_table_cell(&t, "%s", str_or(in, "alarm_name", ""));
            status_table_cell(&t, "%lld",
                              (long long)json_integer_value(json_object_get(in, "d_instance_id")));
            json_t *pv = json_object_get(in, "p_instance_id");
            if (json_is_integer(pv))
                status_table_cell(&t, "%lld", (long long)json_integer_value(pv));
            else
                status_table_cell(&t, "-");
            status_table_cell(&t, "%s", str_or(in, "moi", ""));
        }
        strbuf_puts(out, "\nACTIVE ALARMS (controller)\n");
        status_table_render(&t, out, "  ");
        status_table_release(&t);
    }
    json_t *recent = json_object_get(m, "recent_alarms");
    if (json_array_size(recent)) {
        struct status_table t;
        status_table_init(&t, 4);
        const char *h[] = {"ALARM", "INSTANCE", "CLEARED BY", "MOI"};
        for (size_t c = 0; c < 4; c++)
            status_table_cell(&t, "%s", h[c]);
        json_array_foreach(recent, i, in)
        {
            status_table_cell(&t, "%s", str_or(in, "alarm_id", "?"));
            status_table_cell(&t, "%lld",
                              (long long)json_integer_value(json_object_get(in, "d_instance_id")));
            status_table_cell(&t, "%s", str_or(in, "cleared_by", ""));
            status_table_cell(&t, "%s", str_or(in, "moi", ""));
        }
        strbuf_puts(out, "\nRECENTLY CLEARED ALARMS (controller)\n");
        status_table_render(&t, out, "  ");
        status_table_release(&t);
    }
    json_t *problems = json_object_get(m, "problems");
    if (json_array_size(problems)) {
        strbuf_appendf(out, "\nUNHEALTHY: %zu problem(s)\n", json_array_size(problems));
        json_t *p;
        json_array_foreach(problems, i, p) strbuf_appendf(out, "  - %s\n", json_string_value(p));
    } else {
        strbuf_puts(out, "\nhealthy\n");
    }
}

/* ---- motor status ----------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: motor status [options]\n\n"
                 "One view of a fleet: the controller's instances (state, fault-tolerance phase),\n"
                 "their endpoints (address, status, heartbeat age), and the coordinator's pools\n"
                 "and circuit breakers. Exit status 0 when everything is healthy, 1 otherwise.\n\n"
                 "  --controller URL        controller API (\"none\" to skip)\n"
                 "  --coordinator URL       coordinator management API (\"none\" to skip)\n"
                 "  -c, --config FILE       take both addresses from a user_config.json\n"
                 "  --state-dir DIR         take them from a running `motor up` (default\n"
                 "                          ./.motor-up when it exists)\n"
                 "  --mgmt-api-key-file F   coordinator management key (X-Motor-Management-Key)\n"
                 "  --ca-file F             https:// targets: verify them against this CA (PEM;\n"
                 "                          default: the system's trusted CAs)\n"
                 "  --cert-file F --key-file F  client certificate for mutual TLS\n"
                 "  --timeout SECONDS       per request (default 3)\n"
                 "  --json                  the model as JSON instead of tables\n"
                 "  -h, --help              this text\n\n"
                 "Without any of these: http://127.0.0.1:1026 for both (upstream defaults).\n");
}

struct status_run {
    struct reactor *r;
    json_t *model;
    struct status_targets t;
};

static void on_docs(const struct status_docs *d, void *arg)
{
    struct status_run *run = arg;
    run->model = status_model(&run->t, d, (double)util_wall_ms() / 1000.0);
    reactor_stop(run->r);
}

/* TLS files named by a user_config.json or an up.json (heap copies; NULL when absent). */
struct status_tls_files {
    char *ca, *cert, *key;
};

static void tls_files_release(struct status_tls_files *f)
{
    free(f->ca);
    free(f->cert);
    free(f->key);
    memset(f, 0, sizeof(*f));
}

static char *dup_nonempty(const char *s)
{
    return s && *s ? xstrdup(s) : NULL;
}

/* A mgmt_tls_config block (enable_tls true) into files. */
static void tls_files_from_block(const json_t *b, struct status_tls_files *f)
{
    tls_files_release(f);
    f->ca = dup_nonempty(json_string_value(json_object_get(b, "ca_file")));
    f->cert = dup_nonempty(json_string_value(json_object_get(b, "cert_file")));
    f->key = dup_nonempty(json_string_value(json_object_get(b, "key_file")));
}

/* Addresses from a user_config.json: "http://<dns>:<port>", https:// when the
 * controller's mgmt_tls_config (or the deploy block's, which wins as in the daemons) is
 * enabled; the coordinator's management port follows the deploy block's. */
static int targets_from_config(const char *path, char **ctl, char **coord,
                               struct status_tls_files *tf)
{
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    json_t *root = cfg_load_file(path, &e);
    if (!root) {
        fprintf(stderr, "motor status: %s", cfg_errors_text(&e));
        cfg_errors_release(&e);
        return -EINVAL;
    }
    const char *cdns = cfg_get_string(root, "motor_controller_config.api_config.controller_api_dns",
                                      "127.0.0.1", &e);
    int64_t cport = cfg_get_int(root, "motor_controller_config.api_config.controller_api_port",
                                1026, 1, 65535, &e);
    const char *odns = cfg_get_string(
        root, "motor_coordinator_config.api_config.coordinator_api_dns", "127.0.0.1", &e);
    int64_t oport = cfg_get_int(
        root, "motor_coordinator_config.api_config.coordinator_api_mgmt_port", 1026, 1, 65535, &e);
    const json_t *ctl_tls = cfg_lookup(root, "motor_controller_config.mgmt_tls_config");
    const json_t *dep_tls = cfg_lookup(root, "motor_deploy_config.tls_config.mgmt_tls_config");
    bool dep_on = json_is_true(json_object_get(dep_tls, "enable_tls"));
    bool ctl_on = dep_tls && json_object_get(dep_tls, "enable_tls")
                      ? dep_on
                      : json_is_true(json_object_get(ctl_tls, "enable_tls"));
    if (ctl_on || dep_on)
        tls_files_from_block(dep_on ? dep_tls : ctl_tls, tf);
    int rc = 0;
    if (cfg_errors_count(&e)) {
        fprintf(stderr, "motor status: %s: %s", path, cfg_errors_text(&e));
        rc = -EINVAL;
    } else {
        *ctl = xasprintf("%s://%s:%lld", ctl_on ? "https" : "http", cdns, (long long)cport);
        *coord = xasprintf("%s://%s:%lld", dep_on ? "https" : "http", odns, (long long)oport);
    }
    json_decref(root);
    cfg_errors_release(&e);
    return rc;
}

/* Addresses from a motor up state directory (its up.json; with `motor up --tls` also
 * its "tls" files). 0, -ENOENT, -EINVAL. */
static int targets_from_state(const char *dir, char **ctl, char **coord, char **key_file,
                              struct status_tls_files *tf)
{
    char *path = xasprintf("%s/up.json", dir);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    free(path);
    if (!root)
        return errno == ENOENT || access(dir, F_OK) != 0 ? -ENOENT : -EINVAL;
    const char *c = json_string_value(json_object_get(root, "controller_url"));
    const char *o = json_string_value(json_object_get(root, "coordinator_mgmt_url"));
    const char *k = json_string_value(json_object_get(root, "mgmt_api_key_file"));
    int rc = c && o ? 0 : -EINVAL;
    if (!rc) {
        *ctl = xstrdup(c);
        *coord = xstrdup(o);
        if (k && key_file && !*key_file)
            *key_file = xstrdup(k);
        json_t *tls = json_object_get(root, "tls");
        if (json_is_object(tls))
            tls_files_from_block(tls, tf);
    }
    json_decref(root);
    return rc;
}

static char *trim_url(const char *u)
{
    if (!u || strcmp(u, "none") == 0 || !*u)
        return NULL;
    size_t n = strlen(u);
    while (n > 0 && u[n - 1] == '/')
        n--;
    if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
        return xasprintf("http://%.*s", (int)n, u);
    return xstrndup(u, n);
}

int status_main(int argc, char **argv)
{
    const char *ctl_arg = NULL, *coord_arg = NULL, *config = NULL, *state_dir = NULL;
    const char *key_arg = NULL, *ca_arg = NULL, *cert_arg = NULL, *tkey_arg = NULL;
    double timeout_s = STATUS_DEFAULT_TIMEOUT_MS / 1000.0;
    bool json_out = false;
    const struct cliopt opts[] = {
        {"controller", 0, CLIOPT_STRING, &ctl_arg, 0, 0, NULL},
        {"coordinator", 0, CLIOPT_STRING, &coord_arg, 0, 0, NULL},
        {"config", 'c', CLIOPT_STRING, &config, 0, 0, NULL},
        {"state-dir", 0, CLIOPT_STRING, &state_dir, 0, 0, NULL},
        {"mgmt-api-key-file", 0, CLIOPT_STRING, &key_arg, 0, 0, NULL},
        {"ca-file", 0, CLIOPT_STRING, &ca_arg, 0, 0, NULL},
        {"cert-file", 0, CLIOPT_STRING, &cert_arg, 0, 0, NULL},
        {"key-file", 0, CLIOPT_STRING, &tkey_arg, 0, 0, NULL},
        {"timeout", 0, CLIOPT_DOUBLE, &timeout_s, 0.1, 600, "a number of seconds in [0.1, 600]"},
        {"json", 0, CLIOPT_FLAG, &json_out, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    int prc = cliopt_parse("motor status", argc, argv, opts, usage);
    if (prc)
        return prc == 1 ? 0 : prc;
    char *key_file = xstrdup(key_arg);

    char *ctl = NULL, *coord = NULL;
    struct status_tls_files tf = {0};
    int rc = 0;
    if (config) {
        rc = targets_from_config(config, &ctl, &coord, &tf);
    } else if (state_dir) {
        rc = targets_from_state(state_dir, &ctl, &coord, &key_file, &tf);
        if (rc < 0)
            fprintf(stderr, "motor status: %s/up.json: %s\n", state_dir,
                    rc == -ENOENT ? "not found (is `motor up` running there?)"
                                  : "unreadable or incomplete");
    } else if (!ctl_arg || !coord_arg) {
        if (targets_from_state(".motor-up", &ctl, &coord, &key_file, &tf) < 0) {
            ctl = xstrdup("http://127.0.0.1:1026");
            coord = xstrdup("http://127.0.0.1:1026");
        }
    }
    if (rc < 0) {
        free(ctl);
        free(coord);
        free(key_file);
        tls_files_release(&tf);
        return 2;
    }
    /* The command line wins over what a file said. */
    if (ca_arg) {
        free(tf.ca);
        tf.ca = xstrdup(ca_arg);
    }
    if (cert_arg) {
        free(tf.cert);
        tf.cert = xstrdup(cert_arg);
    }
    if (tkey_arg) {
        free(tf.key);
        tf.key = xstrdup(tkey_arg);
    }
    struct httpc_tls tls = {.ca_file = tf.ca, .cert_file = tf.cert, .key_file = tf.key};
    if (ctl_arg) {
        free(ctl);
        ctl = trim_url(ctl_arg);
    }
    if (coord_arg) {
        free(coord);
        coord = trim_url(coord_arg);
    }
    char *key = NULL;
    if (key_file) {
        char *raw = util_read_file(key_file, 4096, NULL);
        if (!raw) {
            fprintf(stderr, "motor status: %s: %s\n", key_file, strerror(errno));
            free(ctl);
            free(coord);
            free(key_file);
            tls_files_release(&tf);
            return 2;
        }
        raw[strcspn(raw, "\r\n")] = '\0';
        key = raw;
    }
    if (!ctl && !coord) {
        fprintf(stderr, "motor status: nothing to ask (both sides are \"none\")\n");
        free(key_file);
        free(key);
        tls_files_release(&tf);
        return 2;
    }

    log_set_component("status");
    log_set_level(LOG_ERROR);
    struct status_run run = {
        .t = {.controller = ctl, .coordinator = coord, .mgmt_key = key, .tls = &tls}};
    int exit_code = 1;
    run.r = reactor_new();
    struct httpc *hc = run.r ? httpc_new(run.r) : NULL;
    if (!hc) {
        fprintf(stderr, "motor status: cannot start the HTTP client\n");
        goto out;
    }
    status_fetch_start(hc, &run.t, (int64_t)(timeout_s * 1000), on_docs, &run);
    if (!run.model)
        reactor_run(run.r);
    if (!run.model)
        goto out;
    if (json_out) {
        char *s = json_dumps(run.model, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s)
            printf("%s\n", s);
        free(s);
    } else {
        struct strbuf sb;
        strbuf_init(&sb, 16u << 20);
        status_render(&sb, run.model);
        fputs(strbuf_str(&sb) ? strbuf_str(&sb) : "", stdout);
        strbuf_release(&sb);
    }
    fflush(stdout);
    exit_code = status_model_healthy(run.model) ? 0 : 1;
out:
    json_decref(run.model);
    httpc_free(hc);
    reactor_free(run.r);
    free(ctl);
    free(coord);
    free(key_file);
    free(key);
    tls_files_release(&tf);
    return exit_code;
}
