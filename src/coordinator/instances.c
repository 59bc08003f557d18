#include "coordinator/instances.h"

#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- names ------------------------------------------------------------------------ */

const char *inst_pool_name(enum wire_ins_status s)
{
    switch (s) {
    case WIRE_INS_ACTIVE:
        return "available";
    case WIRE_INS_PAUSED:
        return "paused";
    case WIRE_INS_INITIAL:
    case WIRE_INS_INACTIVE:
        return "unavailable";
    case WIRE_INS_DELETED:
        break;
    }
    return "unknown";
}

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

struct inst_load *inst_load_ref(struct inst_load *l)
{
    return load_ref(l);
}

void inst_load_unref(struct inst_load *l)
{
    load_unref(l);
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
    atomic_init(&s->prec_last_ms, INT64_MIN);
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
    return !ep->headless && (ep->status == WIRE_EP_INITIAL || ep->status == WIRE_EP_NORMAL);
}

bool inst_routable(const struct instance *in)
{
    if (in->status != WIRE_INS_ACTIVE)
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

/* ---- refresh bodies (parsed by src/wire) ------------------------------------------ */

static char *make_hostport(const char *ip, int port)
{
    if (strchr(ip, ':'))
        return xasprintf("[%s]:%d", ip, port);
    return xasprintf("%s:%d", ip, port);
}

/* The coordinator's immutable instance from a parsed one (whose strings it takes). */
static struct instance *inst_from_wire(struct wire_refresh_inst *w)
{
    struct instance *in = xcalloc(1, sizeof(*in));
    atomic_init(&in->refs, 1);
    in->id = w->id;
    in->role = w->role;
    in->status = w->status;
    in->dispatch = w->dispatch;
    in->job_name = w->job_name;
    in->model_name = w->model_name;
    in->engine_type = w->engine_type;
    w->job_name = w->model_name = w->engine_type = NULL;
    if (strcasecmp(in->engine_type, "vllm") == 0)
        in->engine = INST_ENGINE_VLLM;
    else if (strcasecmp(in->engine_type, "sglang") == 0)
        in->engine = INST_ENGINE_SGLANG;
    else
        in->engine = INST_ENGINE_OTHER;
    in->eps = xcalloc(w->n_eps + 1, sizeof(*in->eps));
    for (size_t i = 0; i < w->n_eps; i++) {
        struct wire_refresh_ep *we = &w->eps[i];
        struct inst_endpoint *ep = &in->eps[in->n_eps++];
        ep->id = we->id;
        ep->ip = we->ip;
        we->ip = NULL;
        ep->port = we->port;
        ep->bootstrap_port = we->bootstrap_port;
        ep->status = we->status;
        ep->headless = we->headless;
        ep->hostport = make_hostport(ep->ip, ep->port);
    }
    return in;
}

int inst_refresh_parse(json_t *body, struct inst_refresh *out, char *err, size_t cap)
{
    memset(out, 0, sizeof(*out));
    struct wire_refresh w;
    int rc = wire_refresh_parse(body, &w, err, cap);
    if (rc < 0)
        return rc;
    out->ev = w.ev;
    out->v = xcalloc(w.n + 1, sizeof(*out->v));
    for (size_t i = 0; i < w.n; i++)
        out->v[out->n++] = inst_from_wire(&w.v[i]);
    wire_refresh_release(&w);
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
    if (r->ev == WIRE_REFRESH_DEL)
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
    int c = strcmp(wire_role_str(x->role), wire_role_str(y->role));
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

void inst_table_set_breaker(struct inst_table *t, const struct brk_params *p)
{
    t->brk = *p;
    for (size_t i = 0; i < t->n; i++) {
        struct inst_shared *s = t->v[i]->shared;
        if (!s)
            continue;
        pthread_mutex_lock(&s->mu);
        brk_set_params(&s->brk, p);
        pthread_mutex_unlock(&s->mu);
    }
}

int inst_table_apply(struct inst_table *t, const struct inst_refresh *r, char *err, size_t cap)
{
    struct instance **nv = NULL;
    size_t nn = 0;

    if (r->ev == WIRE_REFRESH_DEL) {
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
                         (long long)want->id, wire_role_str(have->role), have->job_name);
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
    } else if (r->ev == WIRE_REFRESH_ADD) {
        for (size_t i = 0; i < r->n; i++) {
            struct instance *have = inst_table_find(t, r->v[i]->id);
            if (have && !inst_same_identity(have, r->v[i])) {
                snprintf(err, cap,
                         "instance %lld is already registered with another identity "
                         "(role %s, job %s, %zu endpoints)",
                         (long long)have->id, wire_role_str(have->role), have->job_name,
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
                               wire_ep_status_str(ep->status));
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
    bool healthy = in->status == WIRE_INS_ACTIVE && bs == BRK_CLOSED;
    /* Upstream reports a breaker as closed/open only; half-open counts as open. */
    const char *bname = bs == BRK_CLOSED ? "closed" : "open";
    json_t *cb =
        json_pack("{s:s, s:i, s:i, s:f}", "state", bname, "trip_count", b.trip_count,
                  "failure_count", b.failures, "current_timeout", (double)b.cur_open_ms / 1000.0);
    return json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:o, s:o}", "id", (json_int_t)in->id,
                     "role", wire_role_str(in->role), "job_name", in->job_name, "model_name",
                     in->model_name, "engine_type", in->engine_type, "status",
                     wire_ins_status_str(in->status), "pool", inst_pool_name(in->status), "healthy",
                     healthy, "circuit_breaker", cb, "endpoints", eps);
}

json_t *inst_table_to_refresh(const struct inst_table *t)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < t->n; i++) {
        const struct instance *in = t->v[i];
        json_t *pods = json_object();
        for (size_t k = 0; k < in->n_eps; k++) {
            const struct inst_endpoint *ep = &in->eps[k];
            json_t *pod = json_object_get(pods, ep->ip);
            if (!pod) {
                pod = json_object();
                json_object_set_new(pods, ep->ip, pod);
            }
            char id[24];
            snprintf(id, sizeof(id), "%lld", (long long)ep->id);
            json_t *je = json_pack("{s:I, s:s, s:i, s:s, s:b}", "id", (json_int_t)ep->id, "ip",
                                   ep->ip, "business_port", ep->port, "status",
                                   wire_ep_status_str(ep->status), "headless", ep->headless);
            if (ep->bootstrap_port)
                json_object_set_new(je, "bootstrap_port", json_integer(ep->bootstrap_port));
            json_object_set_new(pod, id, je);
        }
        json_t *o =
            json_pack("{s:I, s:s, s:s, s:s, s:s, s:s, s:o}", "id", (json_int_t)in->id, "role",
                      wire_role_str(in->role), "status", wire_ins_status_str(in->status),
                      "job_name", in->job_name, "model_name", in->model_name, "engine_type",
                      in->engine_type, "endpoints", pods);
        if (in->dispatch != WIRE_DISPATCH_DEFAULT)
            json_object_set_new(o, "dispatch_capabilities",
                                json_pack("[s]", in->dispatch == WIRE_DISPATCH_HANDOFF
                                                     ? "prefill_handoff_decode"
                                                     : "concurrent_engine_sync"));
        json_array_append_new(arr, o);
    }
    return wire_refresh_body(WIRE_REFRESH_SET, arr);
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
    for (int r = 0; r < WIRE_ROLE_COUNT; r++)
        s->routable[r] = xcalloc(t->n + 1, sizeof(*s->routable[r]));
    s->models = xcalloc(t->n + 1, sizeof(*s->models));
    for (size_t i = 0; i < t->n; i++) {
        struct instance *in = inst_ref(t->v[i]);
        s->all[s->n_all++] = in;
        if (!inst_routable(in))
            continue;
        s->routable[in->role][s->n_routable[in->role]++] = in;
        if (in->role == WIRE_ROLE_ENCODE || in->model_name[0] == '\0')
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
    for (int r = 0; r < WIRE_ROLE_COUNT; r++)
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
