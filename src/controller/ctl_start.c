/* ctl_start — start commands (§5.4): one POST /node-manager/start per node manager of a
 * newly assembled instance, retried every cmd_send_interval until every node manager
 * accepted or send_cmd_retry_times rounds were spent. On the controller's reactor thread. */
#include "controller/ctl_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>

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
        ssize_t i = ctl_nm_by_key(in, a->key);
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

void ctl_start_send(struct ctl *c, struct ctl_inst *in)
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

void ctl_start_on_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (!c->loaded)
        return;
    for (size_t i = 0; i < c->n_insts; i++)
        if (c->insts[i]->start_pending && !c->insts[i]->start_inflight)
            ctl_start_send(c, c->insts[i]);
}
