#include "controller/ctl_asm.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* RegisterMsg has no copy function: round-trip through its own serializer. */
static struct wire_register *reg_dup(const struct wire_register *m)
{
    struct wire_register *c = xcalloc(1, sizeof(*c));
    json_t *j = wire_register_to_json(m);
    struct wire_err err;
    if (wire_register_parse(j, c, &err) < 0) {
        /* Our own serializer's output must parse; anything else is a wire bug. */
        json_decref(j);
        free(c);
        return NULL;
    }
    json_decref(j);
    return c;
}

static int lws_of(const struct wire_parallel_config *pc)
{
    struct wire_parallel_config p = *pc;
    if (wire_parallel_config_fill(&p, NULL) < 0)
        return 1;
    return p.local_world_size > 0 ? p.local_world_size : 1;
}

static int world_of(const struct wire_parallel_config *pc)
{
    struct wire_parallel_config p = *pc;
    if (wire_parallel_config_fill(&p, NULL) < 0)
        return 1;
    return p.world_size > 0 ? p.world_size : 1;
}

/* The pod's server in its MindCluster ranktable: the one naming the pod IP, else the
 * only one. */
static const struct wire_rt_server *pod_server(const struct wire_ranktable *rt, const char *ip)
{
    if (!rt || rt->n_servers == 0)
        return NULL;
    for (size_t i = 0; i < rt->n_servers; i++) {
        const struct wire_rt_server *s = &rt->servers[i];
        if ((s->server_id && strcmp(s->server_id, ip) == 0) ||
            (s->container_ip && strcmp(s->container_ip, ip) == 0))
            return s;
    }
    return rt->n_servers == 1 ? &rt->servers[0] : NULL;
}

/* Device infos of the k-th endpoint of a pod. With a ranktable, the endpoint gets its
 * own slice of local_world_size devices when the pod lists enough of them (upstream
 * hands every endpoint the whole list, which makes a hardware-fault-to-rank mapping
 * select every rank, §12.15); otherwise the whole list. Without one, synthesized ids. */
static void fill_devices(struct wire_endpoint *ep, const struct wire_register *m, size_t k, int lws,
                         bool single)
{
    const struct wire_rt_server *srv = pod_server(m->ranktable, m->pod_ip);
    if (srv) {
        size_t from = 0, n = srv->n_devices;
        if (!single && (k + 1) * (size_t)lws <= srv->n_devices) {
            from = k * (size_t)lws;
            n = (size_t)lws;
        }
        ep->device_infos = xcalloc(n + 1, sizeof(*ep->device_infos));
        for (size_t d = 0; d < n; d++)
            wire_device_info_copy(&ep->device_infos[d], &srv->devices[from + d]);
        ep->n_device_infos = n;
        return;
    }
    size_t n = single && m->device_num > 0 ? (size_t)m->device_num : (size_t)lws;
    if (n > 4096)
        n = 4096;
    ep->device_infos = xcalloc(n + 1, sizeof(*ep->device_infos));
    for (size_t d = 0; d < n; d++) {
        ep->device_infos[d].device_id = xasprintf("%zu", (single ? 0 : k * (size_t)lws) + d);
        ep->device_infos[d].rank_id = xasprintf("%lld", (long long)ep->id * lws + (long long)d);
    }
    ep->n_device_infos = n;
}

/* Build the endpoints of one registering pod with ids from `offset`. */
static int build_endpoints(struct ctl_nm *nm, const struct wire_register *m, int64_t offset,
                           double hb_now_s, struct wire_err *err)
{
    int lws = lws_of(&m->parallel_config);
    size_t count;
    bool single = !m->enable_multi_endpoints;
    if (m->business_port.n == 0) {
        wire_err_set(err, "business_port: at least one port is required");
        return -EINVAL;
    }
    if (single) {
        count = 1;
    } else {
        count = m->business_port.n;
        if (m->device_num > 0) {
            int64_t cap = m->device_num / lws;
            if (cap < 1) {
                wire_err_set(err,
                             "device_num: %lld devices cannot hold one endpoint of "
                             "local_world_size %d",
                             (long long)m->device_num, lws);
                return -EINVAL;
            }
            if ((int64_t)count > cap)
                count = (size_t)cap;
        }
    }
    nm->eps = xcalloc(count + 1, sizeof(*nm->eps));
    for (size_t k = 0; k < count; k++) {
        struct wire_endpoint *ep = &nm->eps[k];
        ep->id = offset + (int64_t)k;
        ep->ip = xstrdup(m->pod_ip);
        ep->business_port = xstrdup(m->business_port.items[k]);
        ep->bootstrap_port = m->bootstrap_port;
        ep->status = WIRE_EP_INITIAL;
        ep->hb_timestamp = hb_now_s;
        fill_devices(ep, m, k, lws, single);
    }
    nm->n_eps = count;
    return 0;
}

static void set_identity(struct ctl_inst *in, const struct wire_register *m)
{
    in->job_name = xstrdup(m->job_name);
    in->model_name = xstrdup(m->model_name ? m->model_name : "");
    in->engine_type = xstrdup(m->engine_type);
    wire_strlist_copy(&in->dispatch_caps, &m->dispatch_capabilities);
    in->ft_cap = m->ft_capability;
    in->role = m->role;
    in->pc = m->parallel_config;
    wire_parallel_config_fill(&in->pc, NULL);
    in->multi_ep = m->enable_multi_endpoints;
    in->nnodes = m->nnodes > 0 ? m->nnodes : 1;
}

static int append_nm(struct ctl_inst *in, const struct wire_register *m, double hb_now_s,
                     struct wire_err *err)
{
    struct ctl_nm nm = {0};
    if (build_endpoints(&nm, m, (int64_t)ctl_inst_n_endpoints(in), hb_now_s, err) < 0) {
        ctl_nm_release(&nm);
        return -EINVAL;
    }
    nm.pod_ip = xstrdup(m->pod_ip);
    nm.port = xstrdup(m->nm_port);
    nm.device_num = m->device_num;
    nm.reg = reg_dup(m);
    in->nms = xrealloc(in->nms, (in->n_nms + 1) * sizeof(*in->nms));
    in->nms[in->n_nms++] = nm;
    return 0;
}

struct ctl_inst *ctl_asm_new(int64_t id, const struct wire_register *m, double hb_now_s,
                             struct wire_err *err)
{
    struct ctl_inst *in = ctl_inst_new(id);
    set_identity(in, m);
    if (append_nm(in, m, hb_now_s, err) < 0) {
        ctl_inst_free(in);
        return NULL;
    }
    return in;
}

static bool caps_equal(const struct wire_ft_capability *a, const struct wire_ft_capability *b)
{
    return a->enabled == b->enabled && a->scale_down_supported == b->scale_down_supported &&
           a->external_lb == b->external_lb && a->auto_recovery == b->auto_recovery &&
           a->fused_mc2_enabled == b->fused_mc2_enabled && a->eplb_enabled == b->eplb_enabled &&
           a->num_redundant_experts == b->num_redundant_experts;
}

int ctl_asm_add(struct ctl_inst *in, const struct wire_register *m, double hb_now_s,
                struct wire_err *err)
{
    if (ctl_inst_find_nm(in, m->pod_ip, m->nm_port) >= 0)
        return 1;
    if (m->role != in->role) {
        wire_err_set(err, "role: job %s is assembling a %s instance, got %s", in->job_name,
                     wire_role_str(in->role), wire_role_str(m->role));
        return -EINVAL;
    }
    if (strcmp(m->model_name ? m->model_name : "", in->model_name ? in->model_name : "") != 0) {
        wire_err_set(err, "model_name: job %s serves \"%s\", got \"%s\"", in->job_name,
                     in->model_name, m->model_name);
        return -EINVAL;
    }
    if (m->parallel_config.dp_size != in->pc.dp_size) {
        wire_err_set(err, "parallel_config.dp_size: job %s has dp_size %d, got %d", in->job_name,
                     in->pc.dp_size, m->parallel_config.dp_size);
        return -EINVAL;
    }
    if (!caps_equal(&m->ft_capability, &in->ft_cap))
        in->ft_cap_consistent = false;
    return append_nm(in, m, hb_now_s, err);
}

void ctl_asm_remove_nm(struct ctl_inst *in, size_t idx, double hb_now_s)
{
    if (idx >= in->n_nms)
        return;
    ctl_nm_release(&in->nms[idx]);
    memmove(&in->nms[idx], &in->nms[idx + 1], (in->n_nms - idx - 1) * sizeof(*in->nms));
    in->n_nms--;
    /* Renumber: ids are registration-order offsets, so every later pod shifts. */
    int64_t offset = 0;
    for (size_t i = 0; i < in->n_nms; i++) {
        struct ctl_nm *nm = &in->nms[i];
        if (!nm->reg) {
            offset += (int64_t)nm->n_eps;
            continue;
        }
        wire_endpoints_free(nm->eps, nm->n_eps);
        nm->eps = NULL;
        nm->n_eps = 0;
        if (build_endpoints(nm, nm->reg, offset, hb_now_s, NULL) < 0)
            continue;
        offset += (int64_t)nm->n_eps;
    }
}

bool ctl_asm_ready(const struct ctl_inst *in, const char **why)
{
    const char *dummy;
    if (!why)
        why = &dummy;
    if (in->n_nms == 0) {
        *why = "no node manager";
        return false;
    }
    int dp = in->pc.dp_size > 0 ? in->pc.dp_size : 1;
    if (in->nnodes > 1) {
        size_t per = in->nms[0].n_eps > 0 ? in->nms[0].n_eps : 1;
        size_t groups = ((size_t)dp + per - 1) / per;
        *why = "waiting for the node managers of every node (nnodes)";
        return in->n_nms >= groups * (size_t)in->nnodes;
    }
    if (in->multi_ep) {
        *why = "waiting for dp_size endpoints";
        return ctl_inst_n_endpoints(in) >= (size_t)dp;
    }
    int64_t dev = in->nms[0].device_num;
    int world = world_of(&in->pc);
    size_t need = dev > 0 ? (size_t)((world + dev - 1) / dev) : 1;
    *why = "waiting for ceil(world_size / device_num) node managers";
    return in->n_nms >= need;
}

static void build_ranktable(struct ctl_inst *in)
{
    wire_ranktable_free(in->ranktable);
    in->ranktable = NULL;
    const struct wire_ranktable *first = NULL;
    size_t n = 0;
    for (size_t i = 0; i < in->n_nms; i++) {
        const struct wire_register *m = in->nms[i].reg;
        if (m && m->ranktable) {
            if (!first)
                first = m->ranktable;
            n += m->ranktable->n_servers;
        }
    }
    if (!first)
        return;
    struct wire_ranktable *rt = xcalloc(1, sizeof(*rt));
    rt->version = xstrdup(first->version ? first->version : "1.0");
    rt->status = xstrdup(first->status ? first->status : "completed");
    rt->servers = xcalloc(n + 1, sizeof(*rt->servers));
    for (size_t i = 0; i < in->n_nms; i++) {
        const struct wire_register *m = in->nms[i].reg;
        if (!m || !m->ranktable)
            continue;
        for (size_t s = 0; s < m->ranktable->n_servers; s++) {
            const struct wire_rt_server *src = &m->ranktable->servers[s];
            struct wire_rt_server *dst = &rt->servers[rt->n_servers++];
            dst->server_id = xstrdup(src->server_id);
            dst->container_ip = xstrdup(src->container_ip);
            dst->devices = xcalloc(src->n_devices + 1, sizeof(*dst->devices));
            for (size_t d = 0; d < src->n_devices; d++)
                wire_device_info_copy(&dst->devices[d], &src->devices[d]);
            dst->n_devices = src->n_devices;
        }
    }
    rt->server_count = xasprintf("%zu", rt->n_servers);
    in->ranktable = rt;
}

void ctl_asm_finalize(struct ctl_inst *in)
{
    free(in->master_dp_ip);
    in->master_dp_ip = in->n_nms ? xstrdup(in->nms[0].pod_ip) : NULL;
    build_ranktable(in);
    for (size_t i = 0; i < in->n_nms; i++) {
        struct ctl_nm *nm = &in->nms[i];
        nm->node_rank = in->nnodes > 1 ? (int64_t)i % in->nnodes : (int64_t)i;
        bool headless = in->nnodes > 1 && (int64_t)i % in->nnodes != 0;
        for (size_t j = 0; j < nm->n_eps; j++)
            nm->eps[j].headless = headless;
        if (nm->reg) {
            wire_register_release(nm->reg);
            free(nm->reg);
            nm->reg = NULL;
        }
    }
    in->assembled = true;
}

/* ---- re-registration ---------------------------------------------------------------- */

static void nm_from_rereg(struct ctl_nm *nm, const struct wire_reregister *m, double hb_now_s)
{
    memset(nm, 0, sizeof(*nm));
    nm->pod_ip = xstrdup(m->pod_ip);
    nm->port = xstrdup(m->nm_port);
    nm->device_num = m->device_num;
    nm->node_rank = m->node_rank;
    nm->start_ok = true; /* its engines are running: nothing to start */
    nm->eps = xcalloc(m->n_endpoints + 1, sizeof(*nm->eps));
    for (size_t k = 0; k < m->n_endpoints; k++) {
        wire_endpoint_copy(&nm->eps[k], &m->endpoints[k]);
        nm->eps[k].headless = m->node_rank != 0;
        nm->eps[k].hb_timestamp = hb_now_s;
    }
    nm->n_eps = m->n_endpoints;
}

struct ctl_inst *ctl_asm_new_rereg(const struct wire_reregister *m, double hb_now_s)
{
    struct ctl_inst *in = ctl_inst_new(m->instance_id);
    in->job_name = xstrdup(m->job_name);
    in->model_name = xstrdup(m->model_name ? m->model_name : "");
    in->engine_type = xstrdup(m->engine_type);
    wire_strlist_copy(&in->dispatch_caps, &m->dispatch_capabilities);
    in->ft_cap = m->ft_capability;
    in->role = m->role;
    in->pc = m->parallel_config;
    wire_parallel_config_fill(&in->pc, NULL);
    in->multi_ep = m->enable_multi_endpoints;
    in->nnodes = m->nnodes > 0 ? m->nnodes : 1;
    in->reregistered = true;
    in->nms = xcalloc(1, sizeof(*in->nms));
    nm_from_rereg(&in->nms[0], m, hb_now_s);
    in->n_nms = 1;
    return in;
}

int ctl_asm_add_rereg(struct ctl_inst *in, const struct wire_reregister *m, double hb_now_s,
                      struct wire_err *err)
{
    if (strcmp(in->job_name, m->job_name) != 0) {
        wire_err_set(err, "job_name: instance %lld belongs to job %s, got %s", (long long)in->id,
                     in->job_name, m->job_name);
        return -EINVAL;
    }
    if (m->role != in->role) {
        wire_err_set(err, "role: instance %lld is %s, got %s", (long long)in->id,
                     wire_role_str(in->role), wire_role_str(m->role));
        return -EINVAL;
    }
    ssize_t at = ctl_inst_find_nm(in, m->pod_ip, m->nm_port);
    for (size_t k = 0; k < m->n_endpoints; k++) {
        size_t owner;
        if (ctl_inst_endpoint(in, m->endpoints[k].id, &owner) && (ssize_t)owner != at) {
            wire_err_set(err,
                         "endpoints[%zu].id: endpoint %lld of instance %lld belongs to "
                         "another pod",
                         k, (long long)m->endpoints[k].id, (long long)in->id);
            return -EINVAL;
        }
    }
    if (at >= 0) {
        struct ctl_nm fresh;
        nm_from_rereg(&fresh, m, hb_now_s);
        fresh.last_hb_ms = in->nms[at].last_hb_ms;
        ctl_nm_release(&in->nms[at]);
        in->nms[at] = fresh;
        return 1;
    }
    in->nms = xrealloc(in->nms, (in->n_nms + 1) * sizeof(*in->nms));
    nm_from_rereg(&in->nms[in->n_nms++], m, hb_now_s);
    if (!caps_equal(&m->ft_capability, &in->ft_cap))
        in->ft_cap_consistent = false;
    return 0;
}

static int64_t nm_min_id(const struct ctl_nm *nm)
{
    int64_t m = INT64_MAX;
    for (size_t j = 0; j < nm->n_eps; j++)
        if (nm->eps[j].id < m)
            m = nm->eps[j].id;
    return m;
}

static int nm_order(const void *a, const void *b)
{
    const struct ctl_nm *x = a, *y = b;
    int64_t ix = nm_min_id(x), iy = nm_min_id(y);
    if (ix != iy)
        return ix < iy ? -1 : 1;
    return x->node_rank < y->node_rank ? -1 : x->node_rank > y->node_rank;
}

void ctl_asm_finalize_rereg(struct ctl_inst *in)
{
    qsort(in->nms, in->n_nms, sizeof(*in->nms), nm_order);
    free(in->master_dp_ip);
    in->master_dp_ip = in->n_nms ? xstrdup(in->nms[0].pod_ip) : NULL;
    in->assembled = true;
    in->start_pending = false;
}

/* ---- start command ------------------------------------------------------------------ */

json_t *ctl_asm_start_cmd_json(const struct ctl_inst *in, size_t idx,
                               const struct wire_strlist *d2d)
{
    const struct ctl_nm *nm = &in->nms[idx];
    /* The wire struct borrows our storage: it is serialized, never released. */
    struct wire_start_cmd m = {
        .job_name = in->job_name,
        .role = in->role,
        .instance_id = in->id,
        .endpoints = nm->eps,
        .n_endpoints = nm->n_eps,
        .master_dp_ip = in->master_dp_ip,
        .ranktable = in->ranktable,
        .node_rank = nm->node_rank,
    };
    if (d2d && d2d->n) {
        m.d2d_peer_ips = *d2d;
        m.has_d2d_peer_ips = true;
    }
    return wire_start_cmd_to_json(&m);
}
