/* motor controller — process lifecycle (arguments, configuration, leadership, state
 * reload), the assembler driver (§5.3), start commands, the instance manager (§5.10:
 * transitions, heartbeat timeouts, the guarded isolation probe) and persistence glue.
 * One reactor thread does everything. */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "controller/controller.h"
#include "common/list.h"
#include "common/cliopt.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- lookup --------------------------------------------------------------------------- */

struct ctl_inst *ctl_find(struct ctl *c, int64_t id)
{
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->id == id)
            return c->insts[i];
    return NULL;
}

struct ctl_inst *ctl_find_pending(struct ctl *c, int64_t id)
{
    for (size_t i = 0; i < c->n_pending; i++)
        if (c->pending[i]->id == id)
            return c->pending[i];
    return NULL;
}

struct ctl_inst *ctl_find_job(struct ctl *c, const char *job)
{
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->status != WIRE_INS_DELETED && strcmp(c->insts[i]->job_name, job) == 0)
            return c->insts[i];
    return NULL;
}

struct ctl_inst *ctl_find_pending_job(struct ctl *c, const char *job)
{
    for (size_t i = 0; i < c->n_pending; i++)
        if (strcmp(c->pending[i]->job_name, job) == 0)
            return c->pending[i];
    return NULL;
}

static void inst_vec_push(struct ctl_inst ***v, size_t *n, struct ctl_inst *in)
{
    *v = xrealloc(*v, (*n + 1) * sizeof(**v));
    (*v)[(*n)++] = in;
}

static void inst_vec_remove(struct ctl_inst **v, size_t *n, struct ctl_inst *in)
{
    for (size_t i = 0; i < *n; i++) {
        if (v[i] == in) {
            memmove(&v[i], &v[i + 1], (*n - i - 1) * sizeof(*v));
            (*n)--;
            return;
        }
    }
}

/* ---- persistence ------------------------------------------------------------------------ */

static bool can_write(struct ctl *c)
{
    return c->store && c->leader && c->loaded;
}

void ctl_save_inst(struct ctl *c, struct ctl_inst *in)
{
    if (!can_write(c))
        return;
    json_t *j = ctl_inst_store_json(in);
    char *text = json_dumps(j, JSON_COMPACT);
    char key[48];
    snprintf(key, sizeof(key), "instances/%lld", (long long)in->id);
    store_put(c->store, key, text);
    free(text);
    json_decref(j);
}

static void forget_inst(struct ctl *c, int64_t id)
{
    if (!can_write(c))
        return;
    char key[48];
    snprintf(key, sizeof(key), "instances/%lld", (long long)id);
    store_del(c->store, key);
}

void ctl_save_rt(struct ctl *c, struct ctl_ft_rt *rt)
{
    rt->dirty = false;
    if (!can_write(c))
        return;
    json_t *j = ctl_ft_rt_store_json(rt);
    char *text = json_dumps(j, JSON_COMPACT);
    char key[48];
    snprintf(key, sizeof(key), "ft/%lld", (long long)rt->instance_id);
    store_put(c->store, key, text);
    free(text);
    json_decref(j);
}

static void forget_rt(struct ctl *c, int64_t id)
{
    if (!can_write(c))
        return;
    char key[48];
    snprintf(key, sizeof(key), "ft/%lld", (long long)id);
    store_del(c->store, key);
}

void ctl_save_meta(struct ctl *c)
{
    if (!can_write(c))
        return;
    char v[32];
    snprintf(v, sizeof(v), "%lld", (long long)c->next_id);
    store_put(c->store, "meta/next_id", v);
}

/* ---- FT runtimes ------------------------------------------------------------------------ */

static void rt_attach(struct ctl *c, struct ctl_inst *in)
{
    if (!in->ft) {
        in->ft = ctl_ft_rt_new(in->id, in->job_name);
        for (size_t i = 0; i < in->n_nms; i++)
            for (size_t j = 0; j < in->nms[i].n_eps; j++)
                if (!in->nms[i].eps[j].headless)
                    ctl_ids_add(&in->ft->original, &in->ft->n_original, in->nms[i].eps[j].id);
    }
    in->ft->gate =
        ctl_ft_gate(c->cfg.ft_enable, c->cfg.scale_down_enable, &in->ft_cap, in->ft_cap_consistent);
}

static int rt_order(const void *a, const void *b)
{
    const struct ctl_ft_rt *x = *(struct ctl_ft_rt *const *)a, *y = *(struct ctl_ft_rt *const *)b;
    return x->instance_id < y->instance_id ? -1 : x->instance_id > y->instance_id;
}

size_t ctl_all_runtimes(struct ctl *c, struct ctl_ft_rt ***out)
{
    struct ctl_ft_rt **v = xcalloc(c->n_insts + c->n_ghosts + 1, sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->ft)
            v[n++] = c->insts[i]->ft;
    for (size_t i = 0; i < c->n_ghosts; i++)
        v[n++] = c->ghosts[i];
    qsort(v, n, sizeof(*v), rt_order);
    *out = v;
    return n;
}

struct ctl_ft_rt *ctl_find_rt(struct ctl *c, int64_t id)
{
    struct ctl_inst *in = ctl_find(c, id);
    if (in && in->ft)
        return in->ft;
    for (size_t i = 0; i < c->n_ghosts; i++)
        if (c->ghosts[i]->instance_id == id)
            return c->ghosts[i];
    return NULL;
}

void ctl_drop_ghosts_of_job(struct ctl *c, const char *job, int64_t keep_id)
{
    for (size_t i = 0; i < c->n_ghosts;) {
        struct ctl_ft_rt *rt = c->ghosts[i];
        if (rt->instance_id != keep_id && strcmp(rt->job_name, job) == 0) {
            log_info("ft_runtime_dropped", LF_INT("instance_id", rt->instance_id),
                     LF_STR("job_name", job), LF_INT("replaced_by", keep_id));
            forget_rt(c, rt->instance_id);
            ctl_ft_rt_free(rt);
            memmove(&c->ghosts[i], &c->ghosts[i + 1], (c->n_ghosts - i - 1) * sizeof(*c->ghosts));
            c->n_ghosts--;
            continue;
        }
        i++;
    }
}

/* ---- transitions ------------------------------------------------------------------------ */

static void remove_instance(struct ctl *c, struct ctl_inst *in)
{
    ctl_push_forget(c, in);
    ctl_strategy_detach(c, in);
    ctl_faults_free(in);
    if (in->ft) {
        if (in->ft->phase == FT_RECONFIGURING) {
            /* Keep it observable until a replacement of the job is ready. */
            c->ghosts = xrealloc(c->ghosts, (c->n_ghosts + 1) * sizeof(*c->ghosts));
            c->ghosts[c->n_ghosts++] = in->ft;
            ctl_save_rt(c, in->ft);
        } else {
            forget_rt(c, in->id);
            ctl_ft_rt_free(in->ft);
        }
        in->ft = NULL;
    }
    forget_inst(c, in->id);
    inst_vec_remove(c->insts, &c->n_insts, in);
    ctl_inst_free(in);
}

static void change_status(struct ctl *c, struct ctl_inst *in, enum wire_ins_status to,
                          const char *event, const char *cause)
{
    enum wire_ins_status from = in->status;
    if (from == to)
        return;
    in->status = to;
    in->status_wall_ms = util_wall_ms();
    in->status_mono_ms = reactor_now(c->r);
    log_info("instance_state", LF_INT("instance_id", in->id), LF_STR("job_name", in->job_name),
             LF_STR("role", wire_role_str(in->role)), LF_STR("from", wire_ins_status_str(from)),
             LF_STR("to", wire_ins_status_str(to)), LF_STR("trigger", event),
             LF_STR("cause", cause));
    metrics_counter_inc(metrics_counter_labels(c->m.transitions, "to", wire_ins_status_str(to)));
    if (from == WIRE_INS_ACTIVE && in->ever_ready) {
        char msg[256];
        snprintf(msg, sizeof(msg), "instance %lld left active (now %s): %s", (long long)in->id,
                 wire_ins_status_str(to), cause ? cause : event);
        ctl_obs_raise(c, "instance_unavailable", "critical", in->id, in->job_name, msg);
    }
    if (to == WIRE_INS_DELETED) {
        remove_instance(c, in);
        return;
    }
    if (to == WIRE_INS_ACTIVE) {
        ctl_obs_clear(c, "instance_unavailable", in->id, in->job_name, "instance active again");
        in->ever_ready = true;
        /* The job is served again: runtimes of the instances it replaced go away. */
        ctl_drop_ghosts_of_job(c, in->job_name, in->id);
    }
    ctl_save_inst(c, in);
    ctl_push_reconcile(c, in);
}

int ctl_apply_event(struct ctl *c, struct ctl_inst *in, enum ctl_event ev, const char *cause)
{
    enum wire_ins_status to;
    if (ctl_transition(in->status, ev, &to) < 0)
        return -ENOENT;
    if (to == WIRE_INS_ACTIVE && in->separated && in->status != WIRE_INS_ACTIVE)
        return 0; /* forcibly separated instances are kept from returning to active */
    change_status(c, in, to, ctl_event_name(ev), cause);
    return 0;
}

void ctl_set_status(struct ctl *c, struct ctl_inst *in, enum wire_ins_status to, const char *cause)
{
    change_status(c, in, to, "FORCED", cause);
}

/* ---- probes (reachability only: any HTTP answer counts) ---------------------------------- */

enum probe_kind { PROBE_ASSEMBLY, PROBE_ISOLATION };

struct probe_round {
    struct ctl *c;
    enum probe_kind kind;
    int64_t id;
    uint64_t incarnation; /* of the instance probed: a rebuilt one ignores the result */
    size_t n, left;
    bool *ok;
    char **keys; /* "ip port" of each NM */
};

static void assembly_probed(struct ctl *c, struct probe_round *p);
static void isolation_probed(struct ctl *c, struct probe_round *p);

static void probe_free(struct probe_round *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->keys[i]);
    free(p->keys);
    free(p->ok);
    free(p);
}

static void probe_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct probe_round *p = arg;
    if (--p->left == 0)
        probe_free(p);
}

static void probe_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    struct probe_round *p = arg;
    p->ok[tag] = resp->error == 0 && resp->status > 0;
    if (!p->ok[tag])
        log_warn("node_manager_probe_failed", LF_INT("instance_id", p->id),
                 LF_STR("node_manager", p->keys[tag]), LF_STR("error", ctl_http_err(resp)));
    if (--p->left > 0)
        return;
    if (p->kind == PROBE_ASSEMBLY)
        assembly_probed(c, p);
    else
        isolation_probed(c, p);
    probe_free(p);
}

static void probe_start(struct ctl *c, struct ctl_inst *in, enum probe_kind kind)
{
    struct probe_round *p = xcalloc(1, sizeof(*p));
    p->c = c;
    p->kind = kind;
    p->id = in->id;
    p->incarnation = in->incarnation;
    p->n = p->left = in->n_nms;
    p->ok = xcalloc(in->n_nms + 1, sizeof(bool));
    p->keys = xcalloc(in->n_nms + 1, sizeof(char *));
    in->probing = true;
    for (size_t i = 0; i < in->n_nms; i++)
        p->keys[i] = xasprintf("%s %s", in->nms[i].pod_ip, in->nms[i].port);
    for (size_t i = 0; i < in->n_nms; i++) {
        char *url = ctl_nm_url(c, in->nms[i].pod_ip, in->nms[i].port, "/node-manager/status");
        ctl_request(c, "GET", url, NULL, c->cfg.nm_probe_timeout_ms, probe_done, p, (intptr_t)i,
                    probe_drop);
        free(url);
    }
}

static ssize_t nm_by_key(struct ctl_inst *in, const char *key)
{
    for (size_t i = 0; i < in->n_nms; i++) {
        char *k = xasprintf("%s %s", in->nms[i].pod_ip, in->nms[i].port);
        bool eq = strcmp(k, key) == 0;
        free(k);
        if (eq)
            return (ssize_t)i;
    }
    return -1;
}

/* ---- assembler ------------------------------------------------------------------------------ */

static void send_start(struct ctl *c, struct ctl_inst *in);

static void assemble(struct ctl *c, struct ctl_inst *p)
{
    inst_vec_remove(c->pending, &c->n_pending, p);
    if (p->reregistered)
        ctl_asm_finalize_rereg(p);
    else
        ctl_asm_finalize(p);
    int64_t now = reactor_now(c->r);
    p->status = WIRE_INS_INITIAL;
    p->status_wall_ms = util_wall_ms();
    p->status_mono_ms = now;
    for (size_t i = 0; i < p->n_nms; i++) {
        p->nms[i].last_hb_ms = now;
        p->nms[i].guard_refreshed = false;
    }
    p->start_pending = !p->reregistered;
    p->start_attempts = 0;
    inst_vec_push(&c->insts, &c->n_insts, p);
    rt_attach(c, p);
    ctl_save_rt(c, p->ft);
    ctl_save_inst(c, p);
    log_info("instance_assembled", LF_INT("instance_id", p->id), LF_STR("job_name", p->job_name),
             LF_STR("role", wire_role_str(p->role)), LF_INT("node_managers", p->n_nms),
             LF_INT("endpoints", ctl_inst_n_endpoints(p)), LF_STR("master_dp_ip", p->master_dp_ip),
             LF_BOOL("reregistered", p->reregistered));
    if (p->start_pending)
        send_start(c, p);
}

static void drop_pending(struct ctl *c, struct ctl_inst *p, const char *why)
{
    log_warn("assembly_dropped", LF_INT("instance_id", p->id), LF_STR("job_name", p->job_name),
             LF_INT("node_managers", p->n_nms), LF_STR("reason", why));
    forget_inst(c, p->id);
    inst_vec_remove(c->pending, &c->n_pending, p);
    ctl_inst_free(p);
}

static void assembly_probed(struct ctl *c, struct probe_round *pr)
{
    struct ctl_inst *p = ctl_find_pending(c, pr->id);
    if (!p || p->incarnation != pr->incarnation)
        return;
    p->probing = false;
    bool changed = false;
    double now_s = (double)util_wall_ms() / 1000.0;
    for (size_t k = pr->n; k-- > 0;) {
        if (pr->ok[k])
            continue;
        ssize_t i = nm_by_key(p, pr->keys[k]);
        if (i < 0)
            continue;
        log_warn("node_manager_dropped", LF_INT("instance_id", p->id),
                 LF_STR("job_name", p->job_name), LF_STR("node_manager", pr->keys[k]),
                 LF_STR("reason", "unreachable during assembly"));
        ctl_asm_remove_nm(p, (size_t)i, now_s);
        changed = true;
    }
    if (p->n_nms == 0) {
        drop_pending(c, p, "every node manager unreachable");
        return;
    }
    if (changed)
        ctl_save_inst(c, p);
    if (ctl_asm_ready(p, NULL))
        assemble(c, p);
}

static void asm_check(struct ctl *c)
{
    if (!c->loaded)
        return;
    int64_t now = reactor_now(c->r);
    /* Iterate over ids: assembling or dropping changes the array. */
    size_t n = c->n_pending;
    int64_t *ids = xcalloc(n + 1, sizeof(int64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = c->pending[i]->id;
    for (size_t i = 0; i < n; i++) {
        struct ctl_inst *p = ctl_find_pending(c, ids[i]);
        if (!p || p->probing)
            continue;
        const char *why = NULL;
        if (!ctl_asm_ready(p, &why)) {
            if (now - p->last_reg_ms > c->cfg.assemble_timeout_ms)
                drop_pending(c, p, "assemble timeout: not ready since the last registration");
            continue;
        }
        probe_start(c, p, PROBE_ASSEMBLY);
    }
    free(ids);
}

static void on_asm_timer(struct reactor *r, void *arg)
{
    (void)r;
    asm_check(arg);
}

void ctl_asm_kick(struct ctl *c)
{
    if (!reactor_timer_active(&c->asm_kick))
        reactor_timer_start(c->r, &c->asm_kick, 0, 0);
}

/* ---- registration -----------------------------------------------------------------------------
 */

static json_t *reg_error(struct ctl *c, const char *msg, const char *detail)
{
    metrics_counter_inc(c->m.register_errors);
    json_t *o = json_pack("{s:s}", "error", msg);
    if (detail && *detail)
        json_object_set_new(o, "detail", json_string(detail));
    return o;
}

json_t *ctl_register(struct ctl *c, const struct wire_register *m, int *status)
{
    *status = 200;
    metrics_counter_inc(c->m.registrations);
    struct ctl_inst *in = ctl_find_job(c, m->job_name);
    if (in) {
        ssize_t idx = ctl_inst_find_nm(in, m->pod_ip, m->nm_port);
        if (idx < 0) {
            log_warn("register_rejected", LF_STR("job_name", m->job_name),
                     LF_STR("pod_ip", m->pod_ip), LF_STR("reason", "instance already registered"),
                     LF_INT("instance_id", in->id));
            return reg_error(c, "Instance already registered", NULL);
        }
        if (!in->nms[idx].start_ok) {
            /* It has not got its start command yet: a retry of a registration whose
             * answer it missed. The start command is on its way. */
            return json_pack("{s:i}", "result", 0);
        }
        /* A member that already ran its engines registering anew restarted and lost
         * them (§12.13): the instance cannot recover as it is; rebuild the job. */
        log_warn("member_registered_again", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_STR("pod_ip", m->pod_ip),
                 LF_STR("nm_port", m->nm_port));
        ctl_reconfigure(c, in, "a node manager of the instance restarted and registered again",
                        idx);
    }
    int64_t now = reactor_now(c->r);
    double now_s = (double)util_wall_ms() / 1000.0;
    struct wire_err err = {{0}};
    struct ctl_inst *p = ctl_find_pending_job(c, m->job_name);
    if (p) {
        if (p->reregistered)
            return reg_error(c, "Instance is being rebuilt from re-registrations", NULL);
        int rc = ctl_asm_add(p, m, now_s, &err);
        if (rc < 0) {
            log_warn("register_rejected", LF_STR("job_name", m->job_name),
                     LF_STR("pod_ip", m->pod_ip), LF_STR("reason", err.msg));
            return reg_error(c, "Registration does not match the instance being assembled",
                             err.msg);
        }
        if (rc == 0) {
            p->last_reg_ms = now;
            ctl_save_inst(c, p);
            ctl_asm_kick(c);
        }
        log_info("node_manager_registered", LF_INT("instance_id", p->id),
                 LF_STR("job_name", m->job_name), LF_STR("pod_ip", m->pod_ip),
                 LF_STR("nm_port", m->nm_port), LF_INT("node_managers", p->n_nms),
                 LF_INT("endpoints", ctl_inst_n_endpoints(p)), LF_BOOL("duplicate", rc == 1));
        return json_pack("{s:i}", "result", 0);
    }
    if (c->n_pending + c->n_insts >= CTL_MAX_INSTANCES) {
        log_error("register_rejected", LF_STR("job_name", m->job_name),
                  LF_STR("reason", "instance limit reached"), LF_INT("limit", CTL_MAX_INSTANCES));
        return reg_error(c, "Too many instances", "the controller's instance limit is reached");
    }
    p = ctl_asm_new(c->next_id, m, now_s, &err);
    if (!p) {
        log_warn("register_rejected", LF_STR("job_name", m->job_name), LF_STR("pod_ip", m->pod_ip),
                 LF_STR("reason", err.msg));
        return reg_error(c, "Invalid RegisterMsg format", err.msg);
    }
    c->next_id++;
    ctl_save_meta(c);
    p->created_wall_ms = util_wall_ms();
    p->last_reg_ms = now;
    inst_vec_push(&c->pending, &c->n_pending, p);
    ctl_save_inst(c, p);
    log_info("node_manager_registered", LF_INT("instance_id", p->id),
             LF_STR("job_name", m->job_name), LF_STR("pod_ip", m->pod_ip),
             LF_STR("nm_port", m->nm_port), LF_INT("node_managers", 1),
             LF_INT("endpoints", ctl_inst_n_endpoints(p)), LF_BOOL("duplicate", false));
    ctl_asm_kick(c);
    return json_pack("{s:i}", "result", 0);
}

/* At most one repeated stop per node manager every 10 s: one that keeps heartbeating
 * after its stop (still shutting down) must not be flooded. */
static bool restop_due(struct ctl *c, const char *ip, const char *port)
{
    int64_t now = reactor_now(c->r);
    char *key = xasprintf("%s %s", ip, port);
    bool due = true;
    for (size_t i = 0; i < c->n_restops;) {
        if (now - c->restops[i].at > 10000) {
            free(c->restops[i].key);
            c->restops[i] = c->restops[--c->n_restops];
            continue;
        }
        if (strcmp(c->restops[i].key, key) == 0)
            due = false;
        i++;
    }
    if (due && c->n_restops < 4096) {
        c->restops = xrealloc(c->restops, (c->n_restops + 1) * sizeof(*c->restops));
        c->restops[c->n_restops++] = (struct ctl_restop){.key = key, .at = now};
        key = NULL;
    }
    free(key);
    return due;
}

json_t *ctl_reregister(struct ctl *c, const struct wire_reregister *m, int *status)
{
    *status = 200;
    metrics_counter_inc(c->m.reregistrations);
    int64_t now = reactor_now(c->r);
    double now_s = (double)util_wall_ms() / 1000.0;
    struct wire_err err = {{0}};
    struct ctl_inst *in = ctl_find(c, m->instance_id);
    if (in) {
        int rc = ctl_asm_add_rereg(in, m, now_s, &err);
        if (rc < 0)
            return reg_error(c, "Re-registration does not match the instance", err.msg);
        ssize_t i = ctl_inst_find_nm(in, m->pod_ip, m->nm_port);
        if (i >= 0) {
            in->nms[i].last_hb_ms = now;
            in->nms[i].guard_refreshed = false;
        }
        ctl_save_inst(c, in);
        log_info("node_manager_reregistered", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_STR("pod_ip", m->pod_ip),
                 LF_STR("nm_port", m->nm_port), LF_BOOL("known", rc == 1));
        return json_pack("{s:i}", "result", 0);
    }
    struct ctl_ft_rt *ghost = ctl_find_rt(c, m->instance_id);
    if (ghost && ghost->reconfiguration_dispatched) {
        /* The instance was torn down on purpose: a node manager that still runs it missed
         * its stop. Tell it again instead of resurrecting the instance. */
        *status = 410;
        if (restop_due(c, m->pod_ip, m->nm_port)) {
            char *url = ctl_nm_url(c, m->pod_ip, m->nm_port, "/node-manager/stop");
            ctl_http_fire(c, "POST", url, NULL, c->cfg.start_cmd_timeout_ms, "node_manager_stop",
                          m->instance_id);
            free(url);
        }
        log_warn("reregister_refused", LF_INT("instance_id", m->instance_id),
                 LF_STR("pod_ip", m->pod_ip), LF_STR("nm_port", m->nm_port),
                 LF_STR("reason", "instance reconfigured"));
        return reg_error(c, "Instance was reconfigured: register afresh", NULL);
    }
    struct ctl_inst *other = ctl_find_job(c, m->job_name);
    if (other)
        return reg_error(c, "Job is served by another instance",
                         other->id == m->instance_id ? NULL : "the job has a newer instance");
    struct ctl_inst *p = ctl_find_pending(c, m->instance_id);
    struct ctl_inst *pj = ctl_find_pending_job(c, m->job_name);
    if ((p && !p->reregistered) || (pj && pj != p))
        return reg_error(c, "Job is being assembled from fresh registrations", NULL);
    if (p) {
        int rc = ctl_asm_add_rereg(p, m, now_s, &err);
        if (rc < 0)
            return reg_error(c, "Re-registration does not match the instance", err.msg);
        p->last_reg_ms = now;
        ctl_save_inst(c, p);
        ctl_asm_kick(c);
    } else {
        if (c->n_pending + c->n_insts >= CTL_MAX_INSTANCES)
            return reg_error(c, "Too many instances", "the controller's instance limit is reached");
        p = ctl_asm_new_rereg(m, now_s);
        p->created_wall_ms = util_wall_ms();
        p->last_reg_ms = now;
        inst_vec_push(&c->pending, &c->n_pending, p);
        if (m->instance_id >= c->next_id) {
            c->next_id = m->instance_id + 1;
            ctl_save_meta(c);
        }
        ctl_save_inst(c, p);
        ctl_asm_kick(c);
    }
    log_info("node_manager_reregistered", LF_INT("instance_id", p->id),
             LF_STR("job_name", p->job_name), LF_STR("pod_ip", m->pod_ip),
             LF_STR("nm_port", m->nm_port), LF_BOOL("known", false),
             LF_INT("node_managers", p->n_nms));
    return json_pack("{s:i}", "result", 0);
}

/* ---- start commands -----------------------------------------------------------------------------
 */

void ctl_d2d_peers(struct ctl *c, const struct ctl_inst *in, struct wire_strlist *out)
{
    for (size_t i = 0; i < c->n_insts; i++) {
        const struct ctl_inst *o = c->insts[i];
        if (o == in || o->id == in->id || o->role != in->role || o->status != WIRE_INS_ACTIVE)
            continue;
        for (size_t k = 0; k < o->n_nms; k++) {
            for (size_t j = 0; j < o->nms[k].n_eps; j++) {
                char *e = xasprintf("%lld:%s", (long long)o->nms[k].eps[j].id, o->nms[k].eps[j].ip);
                wire_strlist_push(out, e);
                free(e);
            }
        }
    }
}

struct start_arg {
    int64_t id;
    uint64_t incarnation;
    char *key;
};

static void start_arg_free(void *arg, intptr_t tag)
{
    (void)tag;
    struct start_arg *a = arg;
    free(a->key);
    free(a);
}

static void start_round_done(struct ctl *c, struct ctl_inst *in)
{
    size_t ok = 0;
    for (size_t i = 0; i < in->n_nms; i++)
        ok += in->nms[i].start_ok;
    if (ok == in->n_nms) {
        in->start_pending = false;
        log_info("start_commands_delivered", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_INT("node_managers", in->n_nms),
                 LF_INT("attempts", in->start_attempts));
    } else if (in->start_attempts >= c->cfg.send_cmd_retry_times) {
        in->start_pending = false;
        log_error("start_commands_abandoned", LF_INT("instance_id", in->id),
                  LF_STR("job_name", in->job_name), LF_INT("accepted", ok),
                  LF_INT("node_managers", in->n_nms), LF_INT("attempts", in->start_attempts));
    }
    ctl_save_inst(c, in);
}

static void start_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    struct start_arg *a = arg;
    struct ctl_inst *in = ctl_find(c, a->id);
    if (in && in->incarnation == a->incarnation) {
        in->start_inflight--;
        ssize_t i = nm_by_key(in, a->key);
        if (ctl_http_ok(resp)) {
            metrics_counter_inc(c->m.start_ok);
            if (i >= 0)
                in->nms[i].start_ok = true;
            log_info("start_command_accepted", LF_INT("instance_id", in->id),
                     LF_STR("node_manager", a->key), LF_INT("status", resp->status));
        } else {
            metrics_counter_inc(c->m.start_failed);
            log_warn("start_command_failed", LF_INT("instance_id", in->id),
                     LF_STR("node_manager", a->key), LF_INT("attempt", in->start_attempts),
                     LF_STR("error", ctl_http_err(resp)));
        }
        if (in->start_inflight == 0)
            start_round_done(c, in);
    }
    start_arg_free(a, tag);
}

static void send_start(struct ctl *c, struct ctl_inst *in)
{
    if (in->start_inflight || !in->start_pending)
        return;
    in->start_attempts++;
    struct wire_strlist d2d = {0};
    ctl_d2d_peers(c, in, &d2d);
    for (size_t i = 0; i < in->n_nms; i++) {
        struct ctl_nm *nm = &in->nms[i];
        if (nm->start_ok)
            continue;
        json_t *body = ctl_asm_start_cmd_json(in, i, &d2d);
        char *url = ctl_nm_url(c, nm->pod_ip, nm->port, "/node-manager/start");
        struct start_arg *a = xcalloc(1, sizeof(*a));
        a->id = in->id;
        a->incarnation = in->incarnation;
        a->key = xasprintf("%s %s", nm->pod_ip, nm->port);
        in->start_inflight++;
        log_info("start_command_sent", LF_INT("instance_id", in->id),
                 LF_STR("node_manager", a->key), LF_INT("endpoints", nm->n_eps),
                 LF_INT("node_rank", nm->node_rank), LF_INT("attempt", in->start_attempts));
        ctl_request(c, "POST", url, body, c->cfg.start_cmd_timeout_ms, start_done, a, (intptr_t)i,
                    start_arg_free);
        free(url);
        json_decref(body);
    }
    wire_strlist_release(&d2d);
    if (in->start_inflight == 0)
        start_round_done(c, in);
}

static void on_send_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (!c->loaded)
        return;
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->start_pending && !c->insts[i]->start_inflight)
            send_start(c, c->insts[i]);
}

/* ---- instance manager: heartbeat timeouts
 * ---------------------------------------------------------- */

static void isolation_probed(struct ctl *c, struct probe_round *pr)
{
    struct ctl_inst *in = ctl_find(c, pr->id);
    if (!in || in->incarnation != pr->incarnation)
        return;
    in->probing = false;
    if (in->status != WIRE_INS_ACTIVE)
        return;
    bool all = true;
    for (size_t k = 0; k < pr->n; k++)
        all = all && pr->ok[k];
    int64_t now = reactor_now(c->r);
    if (all) {
        /* Every NM answers: the gap was ours (e.g. a controller failover), not theirs. */
        for (size_t i = 0; i < in->n_nms; i++) {
            if (now - in->nms[i].last_hb_ms > c->cfg.hb_timeout_active_ms) {
                in->nms[i].last_hb_ms = now;
                in->nms[i].guard_refreshed = true;
            }
        }
        metrics_counter_inc(c->m.isolation_suppressed);
        log_warn("heartbeat_timeout_suppressed", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name),
                 LF_STR("reason", "every node manager answered the probe"));
        return;
    }
    ctl_apply_event(c, in, CTL_EV_HB_TIMEOUT, "heartbeat timeout and node manager(s) unreachable");
}

static void mgr_check(struct ctl *c)
{
    int64_t now = reactor_now(c->r);
    size_t n = c->n_insts;
    int64_t *ids = xcalloc(n + 1, sizeof(int64_t));
    for (size_t i = 0; i < n; i++)
        ids[i] = c->insts[i]->id;
    for (size_t i = 0; i < n; i++) {
        struct ctl_inst *in = ctl_find(c, ids[i]);
        if (!in || in->probing)
            continue;
        int64_t timeout = in->status == WIRE_INS_ACTIVE ? c->cfg.hb_timeout_active_ms
                                                        : c->cfg.hb_timeout_other_ms;
        size_t stale = 0, refreshed = 0;
        int64_t worst = 0;
        for (size_t k = 0; k < in->n_nms; k++) {
            int64_t age = now - in->nms[k].last_hb_ms;
            if (age > timeout) {
                stale++;
                refreshed += in->nms[k].guard_refreshed;
                worst = MOTOR_MAX(worst, age);
            }
        }
        if (!stale)
            continue;
        char cause[128];
        snprintf(cause, sizeof(cause), "no heartbeat from %zu node manager(s) for %lld ms", stale,
                 (long long)worst);
        if (in->status == WIRE_INS_ACTIVE && refreshed < stale) {
            log_warn("heartbeat_timeout_probe", LF_INT("instance_id", in->id),
                     LF_STR("job_name", in->job_name), LF_STR("cause", cause));
            probe_start(c, in, PROBE_ISOLATION);
            continue;
        }
        ctl_apply_event(c, in, CTL_EV_HB_TIMEOUT, cause);
    }
    free(ids);
}

static void on_mgr_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->loaded)
        mgr_check(c);
}

static void on_strat_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->loaded)
        ctl_faults_tick(c);
}

/* ---- leadership and state reload
 * ----------------------------------------------------------------- */

static void go_live(struct ctl *c)
{
    c->loaded = true;
    int64_t now = reactor_now(c->r);
    for (size_t i = 0; i < c->n_insts; i++) {
        struct ctl_inst *in = c->insts[i];
        in->status_mono_ms = now;
        for (size_t k = 0; k < in->n_nms; k++)
            in->nms[k].last_hb_ms = now; /* a fresh window: NMs heartbeat a new leader */
        rt_attach(c, in);
        if (in->ft->dirty)
            ctl_save_rt(c, in->ft);
    }
    for (size_t i = 0; i < c->n_pending; i++)
        c->pending[i]->last_reg_ms = now;
    reactor_timer_start(c->r, &c->asm_timer, c->cfg.assembler_check_ms, c->cfg.assembler_check_ms);
    reactor_timer_start(c->r, &c->mgr_timer, c->cfg.manager_check_ms, c->cfg.manager_check_ms);
    reactor_timer_start(c->r, &c->send_timer, c->cfg.cmd_send_interval_ms,
                        c->cfg.cmd_send_interval_ms);
    reactor_timer_start(c->r, &c->strat_timer, c->cfg.strategy_check_ms, c->cfg.strategy_check_ms);
    ctl_push_start(c);
    log_info("controller_ready", LF_INT("instances", c->n_insts),
             LF_INT("assembling", c->n_pending), LF_INT("reconfiguring", c->n_ghosts),
             LF_INT("next_id", c->next_id),
             LF_STR("store", store_backend_name(store_get_backend(c->store))),
             LF_STR("owner", c->owner));
    ctl_asm_kick(c);
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->start_pending)
            send_start(c, c->insts[i]);
    ctl_faults_kick(c); /* interrupted transactions resume with their fallback */
}

static void on_loaded(struct store *st, int err, const struct store_kv *kvs, size_t n, void *arg);

static void on_load_retry(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->leader && !c->loaded)
        store_load(c->store, on_loaded, c);
}

static void on_loaded(struct store *st, int err, const struct store_kv *kvs, size_t n, void *arg)
{
    (void)st;
    struct ctl *c = arg;
    if (!c->leader || c->loaded)
        return;
    if (err) {
        log_error("state_load_failed", LF_STR("error", strerror(-err)));
        reactor_timer_start(c->r, &c->load_retry, c->cfg.leader_retry_ms, 0);
        return;
    }
    struct ctl_ft_rt **rts = xcalloc(n + 1, sizeof(*rts));
    size_t n_rts = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        const char *k = kvs[i].key;
        if (strcmp(k, "meta/next_id") == 0) {
            int64_t v;
            if (util_parse_i64(kvs[i].value, 1, WIRE_ID_MAX, &v) == 0 && v > c->next_id)
                c->next_id = v;
            continue;
        }
        json_t *j = json_loads(kvs[i].value, 0, NULL);
        if (strncmp(k, "instances/", 10) == 0) {
            struct wire_err werr = {{0}};
            struct ctl_inst *in = j ? ctl_inst_from_store_json(j, &werr) : NULL;
            if (!in) {
                log_error("state_record_invalid", LF_STR("key", k), LF_STR("error", werr.msg));
                bad++;
            } else if (ctl_find(c, in->id) || ctl_find_pending(c, in->id)) {
                ctl_inst_free(in);
            } else {
                if (in->id >= c->next_id)
                    c->next_id = in->id + 1;
                if (in->assembled)
                    inst_vec_push(&c->insts, &c->n_insts, in);
                else
                    inst_vec_push(&c->pending, &c->n_pending, in);
            }
        } else if (strncmp(k, "ft/", 3) == 0) {
            int64_t id;
            struct ctl_ft_rt *rt = NULL;
            if (j && util_parse_i64(k + 3, 0, WIRE_ID_MAX, &id) == 0)
                rt = ctl_ft_rt_from_store_json(id, j);
            if (rt)
                rts[n_rts++] = rt;
            else
                bad++;
        }
        json_decref(j);
    }
    c->loaded = true; /* from here on writes go to the store */
    for (size_t i = 0; i < n_rts; i++) {
        struct ctl_inst *in = ctl_find(c, rts[i]->instance_id);
        if (in && !in->ft) {
            in->ft = rts[i];
        } else if (!in && rts[i]->phase == FT_RECONFIGURING) {
            c->ghosts = xrealloc(c->ghosts, (c->n_ghosts + 1) * sizeof(*c->ghosts));
            c->ghosts[c->n_ghosts++] = rts[i];
        } else {
            forget_rt(c, rts[i]->instance_id);
            ctl_ft_rt_free(rts[i]);
        }
    }
    free(rts);
    log_info("state_loaded", LF_INT("records", n), LF_INT("invalid", bad),
             LF_INT("instances", c->n_insts), LF_INT("assembling", c->n_pending));
    go_live(c);
}

static void on_leader(struct store *st, bool leader, void *arg)
{
    (void)st;
    struct ctl *c = arg;
    if (leader) {
        c->leader = true;
        log_info("controller_leader", LF_STR("owner", c->owner));
        store_load(c->store, on_loaded, c);
        return;
    }
    if (c->leader) {
        /* Whatever we hold in memory may now be stale: step out, let the platform
         * restart us as a standby. */
        log_error("controller_leadership_lost", LF_STR("owner", c->owner));
        c->leader = false;
        c->loaded = false;
        c->exit_code = 1;
        reactor_stop(c->r);
    }
}

/* ---- metrics
 * ------------------------------------------------------------------------------------- */

static void metrics_setup(struct ctl *c)
{
    struct ctl_metrics *m = &c->m;
    m->reg = metrics_registry_new();
    m->registrations = metrics_counter_new(m->reg, "motor_controller_registrations_total",
                                           "POST /controller/register calls.");
    m->reregistrations = metrics_counter_new(m->reg, "motor_controller_reregistrations_total",
                                             "POST /controller/reregister calls.");
    m->register_errors = metrics_counter_new(m->reg, "motor_controller_register_errors_total",
                                             "Registrations answered with an error.");
    m->heartbeats = metrics_counter_family(m->reg, "motor_controller_heartbeats_total",
                                           "Heartbeats by result.", "result");
    m->hb_ok = metrics_counter_labels(m->heartbeats, "result", "ok");
    m->hb_unknown = metrics_counter_labels(m->heartbeats, "result", "unknown_instance");
    m->hb_invalid = metrics_counter_labels(m->heartbeats, "result", "invalid");
    m->hb_rejected = metrics_counter_labels(m->heartbeats, "result", "rejected");
    m->faults = metrics_counter_family(m->reg, "motor_controller_software_faults_total",
                                       "Software fault reports by engine status.", "status");
    m->strategies = metrics_counter_family(m->reg, "motor_controller_strategies_total",
                                           "Fault-tolerance strategies finished, by result.",
                                           "strategy", "result");
    m->pushes = metrics_counter_family(m->reg, "motor_controller_coordinator_pushes_total",
                                       "POST /instances/refresh calls by event and result.",
                                       "event", "result");
    m->start_ok = metrics_counter_new(m->reg, "motor_controller_start_commands_total",
                                      "Start commands accepted by node managers.");
    m->start_failed = metrics_counter_new(m->reg, "motor_controller_start_command_failures_total",
                                          "Start commands that failed.");
    m->transitions = metrics_counter_family(m->reg, "motor_controller_instance_transitions_total",
                                            "Instance state changes by new state.", "to");
    m->isolation_suppressed =
        metrics_counter_new(m->reg, "motor_controller_isolation_suppressed_total",
                            "Heartbeat timeouts cancelled because every node manager answered.");
    m->coord_restarts =
        metrics_counter_new(m->reg, "motor_controller_coordinator_restarts_total",
                            "Coordinator restarts detected by a changed boot id (full set sent).");
}

/* ---- arguments
 * ------------------------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor controller [options]\n\n"
            "The fleet's brain: assembles instances from node-manager registrations, starts\n"
            "them, tracks their health, runs the fault-tolerance strategies and tells the\n"
            "coordinator which instances are routable.\n\n"
            "  --config PATH      user_config.json (default: $USER_CONFIG_PATH, $CONFIG_PATH)\n"
            "  --check-config     print the effective configuration as JSON and exit 0, or\n"
            "                     every error and exit 1\n"
            "  --host ADDR        bind address (api_config.controller_api_host)\n"
            "  --port N           API port (default 1026; 0 = ephemeral)\n"
            "  --log-level LEVEL  debug, info, warn, error (default info)\n"
            "  -h, --help         this text\n\n"
            "The bound port is logged as {\"event\":\"controller_listening\",...}.\n");
}

struct cli_args {
    const char *config;
    const char *host;
    const char *log_level;
    int port;
    bool check;
};

static int parse_args(int argc, char **argv, struct cli_args *a)
{
    const struct cliopt opts[] = {
        {"config", 0, CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"host", 0, CLIOPT_STRING, &a->host, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &a->port, 0, 65535, "0-65535"},
        {"log-level", 0, CLIOPT_STRING, &a->log_level, 0, 0, NULL},
        {"check-config", 0, CLIOPT_FLAG, &a->check, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    a->port = -1;
    return cliopt_parse("motor controller", argc, argv, opts, usage);
}

static void apply_config(void *cfg, json_t *root, struct cfg_errors *e)
{
    ctlcfg_apply(cfg, root, e);
}

static int load_config(struct ctl *c, const struct cli_args *a)
{
    ctlcfg_init(&c->cfg);
    const char *path = cliopt_config_path(a->config);
    int rc = cliopt_load_config("motor controller", path, "", apply_config, &c->cfg);
    if (rc)
        return rc;
    if (a->host) {
        free(c->cfg.host);
        c->cfg.host = xstrdup(a->host);
    }
    if (a->port >= 0)
        c->cfg.port = a->port;
    if (a->check)
        return ctlcfg_print_check(&c->cfg, path) == 0 ? 1 : -EIO;
    log_info("config_loaded", LF_STR("path", path), LF_STR("host", c->cfg.host),
             LF_INT("port", c->cfg.port), LF_STR("store", ctlcfg_store_name(c->cfg.store)),
             LF_STR("coordinator", c->cfg.coordinator_host),
             LF_INT("coordinator_port", c->cfg.coordinator_port),
             LF_BOOL("fault_tolerance", c->cfg.ft_enable),
             LF_BOOL("engine_relaunch", c->cfg.relaunch_enable),
             LF_BOOL("dp_scale_down", c->cfg.scale_down_enable),
             LF_INT("heartbeat_timeout_ms", c->cfg.hb_timeout_active_ms),
             LF_INT("heartbeat_timeout_inactive_ms", c->cfg.hb_timeout_other_ms));
    return 0;
}

static struct store *open_store(struct ctl *c)
{
    struct ctlcfg *k = &c->cfg;
    struct store_opts o = {
        .backend = k->store == CTLCFG_STORE_ETCD     ? STORE_ETCD
                   : k->store == CTLCFG_STORE_MEMORY ? STORE_MEMORY
                                                     : STORE_SQLITE,
        .sqlite_path = k->sqlite_path,
        .etcd_endpoints = (const char *const *)k->etcd_endpoints,
        .n_etcd_endpoints = k->n_etcd_endpoints,
        .prefix = k->etcd_prefix,
        .lease_ttl_s = k->etcd_lease_ttl_s,
        .timeout_ms = k->etcd_timeout_ms,
        .retry_ms = k->leader_retry_ms,
        .owner = c->owner,
        .tls = c->use_tls ? &c->tls : NULL,
    };
    char err[512] = "";
    struct store *st = store_open(c->r, &o, err, sizeof(err));
    if (!st) {
        log_error("store_open_failed", LF_STR("backend", ctlcfg_store_name(k->store)),
                  LF_STR("error", err));
        fprintf(stderr, "motor controller: cannot open the %s store: %s\n",
                ctlcfg_store_name(k->store), err);
    }
    return st;
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct ctl *c = arg;
    if (signo == SIGHUP) {
        log_info("signal_ignored", LF_INT("signal", signo));
        return;
    }
    log_info("controller_stopping", LF_INT("signal", signo));
    c->stopping = true;
    reactor_stop(r);
}

static void free_all_instances(struct ctl *c)
{
    for (size_t i = 0; i < c->n_insts; i++) {
        struct ctl_inst *in = c->insts[i];
        ctl_strategy_detach(c, in);
        ctl_faults_free(in);
        ctl_ft_rt_free(in->ft);
        in->ft = NULL;
        ctl_inst_free(in);
    }
    free(c->insts);
    c->insts = NULL;
    c->n_insts = 0;
    for (size_t i = 0; i < c->n_pending; i++)
        ctl_inst_free(c->pending[i]);
    free(c->pending);
    c->pending = NULL;
    c->n_pending = 0;
    for (size_t i = 0; i < c->n_ghosts; i++)
        ctl_ft_rt_free(c->ghosts[i]);
    free(c->ghosts);
    c->ghosts = NULL;
    c->n_ghosts = 0;
}

static void tls_setup(struct ctl *c)
{
    struct ctlcfg_tls *t = &c->cfg.tls;
    if (!t->enable)
        return;
    c->use_tls = true;
    c->tls.ca_file = t->ca_file && *t->ca_file ? t->ca_file : NULL;
    c->tls.cert_file = t->cert_file;
    c->tls.key_file = t->key_file;
    c->tls.key_password = t->key_password;
}

static const char *const quiet_paths[] = {
    "/liveness", "/readiness", "/startup", "/metrics", "/controller/heartbeat", NULL};

int controller_main(int argc, char **argv)
{
    struct cli_args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc == 1 ? 0 : 2;
    log_set_component("controller");
    if (cliopt_log_level("motor controller", a.log_level))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    long nofile = util_raise_nofile_limit();
    if (nofile >= 0 && nofile < 8192)
        log_warn("open_files_limit_low", LF_INT("limit", nofile),
                 LF_STR("why", "each client, node manager and engine connection holds one; raise "
                               "the hard limit (ulimit -Hn, LimitNOFILE=)"));

    struct ctl *c = xcalloc(1, sizeof(*c));
    list_init(&c->calls);
    int exit_code = 1;
    /* Timers first: the cleanup path stops them whatever failed. */
    reactor_timer_init(&c->asm_timer, on_asm_timer, c);
    reactor_timer_init(&c->asm_kick, on_asm_timer, c);
    reactor_timer_init(&c->send_timer, on_send_timer, c);
    reactor_timer_init(&c->mgr_timer, on_mgr_timer, c);
    reactor_timer_init(&c->strat_timer, on_strat_timer, c);
    reactor_timer_init(&c->strat_kick, on_strat_timer, c);
    reactor_timer_init(&c->load_retry, on_load_retry, c);
    int lrc = load_config(c, &a);
    if (lrc != 0) {
        ctlcfg_release(&c->cfg);
        free(c);
        return lrc == 1 ? 0 : 1;
    }
    c->start_wall_ms = util_wall_ms();
    c->next_id = 1;
    tls_setup(c);
    metrics_setup(c);
    ctl_push_init(c);
    c->r = reactor_new();
    if (!c->r) {
        log_error("reactor_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    if (reactor_watch_signals(c->r, sigs, ARRAY_LEN(sigs), on_signal, c) < 0) {
        log_error("signals_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    c->hc = httpc_new(c->r);
    if (!c->hc) {
        log_error("http_client_failed");
        goto out;
    }
    struct httpd_config hc = {
        .name = "controller-api",
        .host = c->cfg.host,
        .port = (uint16_t)c->cfg.port,
        .max_body = 8u << 20,
        .max_connections = 4096,
        .quiet_paths = quiet_paths,
    };
    if (c->use_tls) {
        hc.tls_cert_file = c->cfg.tls.cert_file;
        hc.tls_key_file = c->cfg.tls.key_file;
        hc.tls_ca_file = c->cfg.tls.ca_file;
        hc.tls_key_password = c->cfg.tls.key_password;
    }
    c->httpd = httpd_new(c->r, &hc);
    if (!c->httpd) {
        log_error("listen_failed", LF_STR("host", c->cfg.host), LF_INT("port", c->cfg.port),
                  LF_STR("error", strerror(errno)));
        fprintf(stderr, "motor controller: cannot listen on %s:%d: %s\n", c->cfg.host, c->cfg.port,
                strerror(errno));
        goto out;
    }
    c->port = httpd_port(c->httpd);
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    c->owner = xasprintf("%s:%d:%d", host, (int)getpid(), c->port);
    ctl_api_register_routes(c);
    if (ctl_obs_listen(c) < 0) {
        fprintf(stderr, "motor controller: cannot listen on the observability port %d\n",
                c->cfg.obs_port);
        goto out;
    }
    c->store = open_store(c);
    if (!c->store)
        goto out;
    log_info("controller_listening", LF_STR("host", c->cfg.host), LF_INT("port", c->port),
             LF_INT("pid", getpid()), LF_STR("store", ctlcfg_store_name(c->cfg.store)),
             LF_STR("owner", c->owner));
    store_campaign(c->store, on_leader, c);

    int rc = reactor_run(c->r);
    exit_code = rc < 0 ? 1 : c->exit_code;
out:
    c->stopping = true;
    if (c->store && c->leader) {
        size_t left = store_flush(c->store, 2000);
        if (left)
            log_warn("store_flush_incomplete", LF_INT("pending", left));
    }
    if (c->r) {
        reactor_timer_stop(c->r, &c->asm_timer);
        reactor_timer_stop(c->r, &c->asm_kick);
        reactor_timer_stop(c->r, &c->send_timer);
        reactor_timer_stop(c->r, &c->mgr_timer);
        reactor_timer_stop(c->r, &c->strat_timer);
        reactor_timer_stop(c->r, &c->strat_kick);
        reactor_timer_stop(c->r, &c->load_retry);
        ctl_push_stop(c);
    }
    ctl_obs_free(c);
    httpd_free(c->httpd);
    httpc_free(c->hc);
    ctl_requests_drop_all(c);
    free_all_instances(c);
    for (size_t i = 0; i < c->n_restops; i++)
        free(c->restops[i].key);
    free(c->restops);
    store_free(c->store);
    reactor_free(c->r);
    metrics_registry_free(c->m.reg);
    free(c->owner);
    ctlcfg_release(&c->cfg);
    free(c);
    log_info("controller_stopped", LF_INT("exit_code", exit_code));
    return exit_code;
}
