/* ctl_assemble — the assembler driver (§5.3): registration and re-registration intake,
 * the periodic check that turns a pending instance whose registrations are complete into
 * an assembled one (after a reachability probe of its node managers), and the assembly
 * timeout. The assembly rules themselves are pure and live in ctl_asm.c. On the
 * controller's reactor thread. */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- assembler ------------------------------------------------------------------------------ */

static void assemble(struct ctl *c, struct ctl_inst *p)
{
    ctl_inst_vec_remove(c->pending, &c->n_pending, p);
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
    ctl_inst_vec_push(&c->insts, &c->n_insts, p);
    ctl_rt_attach(c, p);
    ctl_save_rt(c, p->ft);
    ctl_save_inst(c, p);
    log_info("instance_assembled", LF_INT("instance_id", p->id), LF_STR("job_name", p->job_name),
             LF_STR("role", wire_role_str(p->role)), LF_INT("node_managers", p->n_nms),
             LF_INT("endpoints", ctl_inst_n_endpoints(p)), LF_STR("master_dp_ip", p->master_dp_ip),
             LF_BOOL("reregistered", p->reregistered));
    if (p->start_pending)
        ctl_start_send(c, p);
}

static void drop_pending(struct ctl *c, struct ctl_inst *p, const char *why)
{
    log_warn("assembly_dropped", LF_INT("instance_id", p->id), LF_STR("job_name", p->job_name),
             LF_INT("node_managers", p->n_nms), LF_STR("reason", why));
    ctl_forget_inst(c, p->id);
    ctl_inst_vec_remove(c->pending, &c->n_pending, p);
    ctl_inst_free(p);
}

static void assembly_probed(struct ctl *c, const struct ctl_probe *pr)
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
        ssize_t i = ctl_nm_by_key(p, pr->keys[k]);
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
        ctl_probe_start(c, p, assembly_probed);
    }
    free(ids);
}

void ctl_asm_on_timer(struct reactor *r, void *arg)
{
    (void)r;
    asm_check(arg);
}

void ctl_asm_kick(struct ctl *c)
{
    if (!reactor_timer_active(&c->asm_kick))
        reactor_timer_start(c->r, &c->asm_kick, 0, 0);
}

/* ---- registration --------------------------------------------------------------------------- */

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
    ctl_inst_vec_push(&c->pending, &c->n_pending, p);
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
            in->nms[i].unconfirmed = false;
        }
        ctl_save_inst(c, in);
        log_info("node_manager_reregistered", LF_INT("instance_id", in->id),
                 LF_STR("job_name", in->job_name), LF_STR("pod_ip", m->pod_ip),
                 LF_STR("nm_port", m->nm_port), LF_BOOL("known", rc == 1));
        return json_pack("{s:i}", "result", 0);
    }
    struct ctl_ft_rt *ghost = ctl_find_rt(c, m->instance_id);
    if (ctl_lost_has(c, m->instance_id)) {
        /* A survivor of a partially lost instance that still runs (shutting down, or it
         * missed its stop): the stop again, never a one-pod resurrection. */
        *status = 410;
        if (restop_due(c, m->pod_ip, m->nm_port)) {
            char *url = ctl_nm_url(c, m->pod_ip, m->nm_port, "/node-manager/stop");
            ctl_http_fire(c, "POST", url, NULL, c->cfg.start_cmd_timeout_ms, "node_manager_stop",
                          m->instance_id);
            free(url);
        }
        log_warn("reregister_refused", LF_INT("instance_id", m->instance_id),
                 LF_STR("pod_ip", m->pod_ip), LF_STR("nm_port", m->nm_port),
                 LF_STR("reason", "instance partially lost: survivors exit"));
        return reg_error(c, "Instance was partially lost: register afresh", NULL);
    }
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
        ctl_inst_vec_push(&c->pending, &c->n_pending, p);
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
