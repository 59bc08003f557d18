/* nm_launch — start commands (§2.8, §4, §5.4), launch-parameter persistence, the launch
 * and in-place relaunch (§7.1) mechanics, and the standalone boot start.
 *
 * The handlers validate a request, read the phase's verdict (nm_phase_verdict: 409 while
 * another flow runs, 503 while stopping) and raise a phase event; flows that must first
 * take old engines down (a start with another spec, a relaunch, /stop) hold their HTTP
 * request, and the phase's action answers it when the group stop (SIGTERM, grace,
 * SIGKILL, sweep) is over. The readiness wait is the phase machine's (nm_phase.c). */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/util.h"
#include "wire/wire_ft.h"
#include "wire/wire_ranktable.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STATE_VERSION 1
#define STATE_MAX_BYTES (16u << 20)

/* ---- persisted launch parameters --------------------------------------------------------- */

json_t *nm_launch_state_to_json(const struct wire_start_cmd *launch, unsigned relaunch_count)
{
    char ts[40];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    return json_pack("{s:i, s:o, s:i, s:s}", "version", STATE_VERSION, "start",
                     wire_start_cmd_to_json(launch), "relaunch_count", (int)relaunch_count,
                     "saved_at", ts);
}

int nm_launch_state_parse(json_t *j, struct wire_start_cmd *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(j)) {
        wire_err_set(err, "state: must be an object");
        return -EINVAL;
    }
    json_t *v = json_object_get(j, "version");
    if (!json_is_integer(v) || json_integer_value(v) != STATE_VERSION) {
        wire_err_set(err, "version: must be %d", STATE_VERSION);
        return -EINVAL;
    }
    return wire_start_cmd_parse(json_object_get(j, "start"), 0, out, err);
}

static void state_save(struct nodemgr *nm)
{
    if (!nm->state_path || !*nm->state_path || !nm->launch)
        return;
    json_t *j = nm_launch_state_to_json(nm->launch, nm->relaunch_count);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    if (!text)
        return;
    /* Atomic: a crash mid-write leaves the previous parameters, never half a file. */
    int rc = util_write_file_atomic(nm->state_path, text, strlen(text), 0600);
    free(text);
    if (rc < 0)
        log_warn("launch_state_save_failed", LF_STR("path", nm->state_path),
                 LF_STR("error", strerror(-rc)));
    else
        log_debug("launch_state_saved", LF_STR("path", nm->state_path));
}

/* Why a start command does not fit this node manager (§2.8), or NULL. */
static const char *start_mismatch(const struct nm_config *cfg, const struct wire_start_cmd *c,
                                  char *buf, size_t cap)
{
    if (!cfg->job_name || !*cfg->job_name) {
        snprintf(buf, cap, "job_name is not configured on this node manager");
        return buf;
    }
    if (strcmp(c->job_name, cfg->job_name) != 0) {
        snprintf(buf, cap, "job_name \"%.100s\" != configured \"%.100s\"", c->job_name,
                 cfg->job_name);
        return buf;
    }
    if (c->n_endpoints != (size_t)cfg->endpoint_num) {
        snprintf(buf, cap, "%zu endpoints, this pod serves %d", c->n_endpoints, cfg->endpoint_num);
        return buf;
    }
    for (size_t i = 0; i < c->n_endpoints; i++) {
        if (strcmp(c->endpoints[i].ip, cfg->pod_ip) != 0) {
            snprintf(buf, cap, "endpoints[%zu].ip \"%.64s\" != pod ip \"%.64s\"", i,
                     c->endpoints[i].ip, cfg->pod_ip);
            return buf;
        }
    }
    return NULL;
}

void nm_launch_forget(struct nodemgr *nm)
{
    if (!nm->state_path || !*nm->state_path)
        return;
    if (unlink(nm->state_path) == 0)
        log_info("launch_state_cleared", LF_STR("path", nm->state_path),
                 LF_STR("why", "stopped by the controller: the next start registers afresh"));
    else if (errno != ENOENT)
        log_warn("launch_state_clear_failed", LF_STR("path", nm->state_path),
                 LF_STR("error", strerror(errno)));
}

void nm_launch_restore(struct nodemgr *nm)
{
    if (!nm->state_path || !*nm->state_path || !nm->has_engine)
        return;
    size_t len = 0;
    char *text = util_read_file(nm->state_path, STATE_MAX_BYTES, &len);
    if (!text) {
        if (errno != ENOENT)
            log_warn("launch_state_unreadable", LF_STR("path", nm->state_path),
                     LF_STR("error", strerror(errno)));
        return;
    }
    json_t *j = json_loadb(text, len, 0, NULL);
    free(text);
    struct wire_start_cmd cmd;
    struct wire_err err = {{0}};
    int rc = nm_launch_state_parse(j, &cmd, &err);
    json_decref(j);
    if (rc < 0) {
        log_warn("launch_state_invalid", LF_STR("path", nm->state_path), LF_STR("error", err.msg));
        return;
    }
    char why[256];
    if (start_mismatch(nm->cfg, &cmd, why, sizeof(why))) {
        log_warn("launch_state_ignored", LF_STR("path", nm->state_path), LF_STR("why", why));
        wire_start_cmd_release(&cmd);
        return;
    }
    nm->launch = xmalloc(sizeof(*nm->launch));
    *nm->launch = cmd;
    log_info("launch_state_restored", LF_STR("path", nm->state_path),
             LF_INT("instance_id", cmd.instance_id), LF_INT("endpoints", cmd.n_endpoints));
}

/* ---- helpers ------------------------------------------------------------------------------ */

static void free_start(struct wire_start_cmd *c)
{
    if (!c)
        return;
    wire_start_cmd_release(c);
    free(c);
}

/* The launch-relevant part of a start command: what the engines are started from.
 * Heartbeat timestamps, statuses and workloads change between the Controller's retries. */
static json_t *launch_spec(const struct wire_start_cmd *c)
{
    json_t *j = wire_start_cmd_to_json(c);
    json_t *eps = json_object_get(j, "endpoints");
    size_t i;
    json_t *e;
    json_array_foreach(eps, i, e)
    {
        json_object_del(e, "status");
        json_object_del(e, "hb_timestamp");
        json_object_del(e, "workload");
    }
    return j;
}

static bool same_launch(const struct wire_start_cmd *a, const struct wire_start_cmd *b)
{
    json_t *x = launch_spec(a), *y = launch_spec(b);
    bool eq = json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return eq;
}

static void pending_closed(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    if (nm->pending_req == req)
        nm->pending_req = NULL;
    if (nm->stop_req == req)
        nm->stop_req = NULL;
}

static void pending_hold(struct nodemgr *nm, struct httpd_req *req)
{
    nm->pending_req = req;
    httpd_req_on_close(req, pending_closed, nm);
}

void nm_launch_answer_json(struct nodemgr *nm, int status, json_t *body)
{
    struct httpd_req *req = nm->pending_req;
    nm->pending_req = NULL;
    if (!req) {
        json_decref(body);
        return;
    }
    httpd_req_on_close(req, NULL, NULL);
    httpd_respond_json(req, status, body);
}

void nm_launch_answer_error(struct nodemgr *nm, int status, const char *detail)
{
    nm_launch_answer_json(nm, status, json_pack("{s:s}", "detail", detail));
}

void nm_launch_abandon(struct nodemgr *nm)
{
    free_start(nm->pending_start);
    nm->pending_start = NULL;
    nm_launch_answer_error(nm, 503, "Node manager is stopping");
}

/* ---- start ---------------------------------------------------------------------------------- */

int nm_launch_begin(struct nodemgr *nm, char *why, size_t cap)
{
    struct wire_start_cmd *cmd = nm->pending_start;
    nm->pending_start = NULL;
    if (!cmd) {
        snprintf(why, cap, "Failed to start native engine: no start command");
        return -EINVAL;
    }
    if (nm_services_prepare(nm, (int)cmd->n_endpoints) < 0) {
        free_start(cmd);
        snprintf(why, cap, "Failed to start native engine: service prepare failed");
        return -EIO;
    }
    free_start(nm->launch);
    nm->launch = cmd;
    nm->generation++;
    nm_engine_set_endpoints(nm, cmd);
    nm->grace = true;
    nm->grace_since_ms = util_mono_ms();
    nm_ft_endpoints_reset(nm);
    nm_scaledown_endpoints_reset(nm);
    log_info("endpoints_set", LF_INT("instance_id", cmd->instance_id),
             LF_INT("generation", (long long)nm->generation), LF_INT("endpoints", cmd->n_endpoints),
             LF_STR("role", wire_role_str(cmd->role)));
    struct wire_err err = {{0}};
    if (nm_engine_spawn_all(nm, &err) < 0) {
        snprintf(why, cap, "Failed to start native engine: %s", err.msg);
        nm_engine_free_endpoints(nm);
        free_start(nm->launch);
        nm->launch = NULL;
        return -EIO;
    }
    if (nm_services_pull_others(nm, &err) < 0) {
        snprintf(why, cap, "Failed to start KV store service: %s", err.msg);
        nm_services_kill_now(nm);
        nm_engine_free_endpoints(nm);
        free_start(nm->launch);
        nm->launch = NULL;
        return -EIO;
    }
    state_save(nm);
    nm_engine_probes_start(nm);
    nm_ctrl_heartbeat_start(nm);
    return 0;
}

/* The 409 detail while another flow runs. */
static const char *busy_detail(const struct nodemgr *nm)
{
    return nm_relaunching(nm) ? "Engine restart already in progress"
                              : "Start command already in progress";
}

void nm_launch_handle_start(struct nodemgr *nm, struct httpd_req *req)
{
    if (!nm->has_engine) {
        nm_respond_detail(req, 400,
                          "Invalid start command payload: this node manager runs no "
                          "engine (kv_cache_store_config.mode is separated)");
        return;
    }
    enum nm_phase_action verdict = nm_phase_verdict(nm, NM_PEV_START);
    if (verdict == NM_PA_REJECT_STOPPING) {
        nm_respond_detail(req, 503, "Node manager is stopping");
        return;
    }
    char jerr[200];
    json_t *j = httpd_req_json(req, jerr, sizeof(jerr));
    if (!j) {
        nm_respond_detail(req, 400, "Invalid start command payload: %s", jerr);
        return;
    }
    struct wire_start_cmd cmd;
    struct wire_err err = {{0}};
    int rc = wire_start_cmd_parse(j, 0, &cmd, &err);
    json_decref(j);
    if (rc < 0) {
        /* Fix of §12.17: a malformed command is the caller's error, not a 500. */
        log_warn("start_rejected", LF_STR("why", err.msg));
        nm_respond_detail(req, 400, "Invalid start command payload: %s", err.msg);
        return;
    }
    char why[256];
    if (start_mismatch(nm->cfg, &cmd, why, sizeof(why))) {
        log_warn("start_rejected", LF_STR("why", why));
        nm_respond_detail(req, 422, "Start command validation failed: %s", why);
        wire_start_cmd_release(&cmd);
        return;
    }
    if (verdict == NM_PA_REJECT_BUSY) {
        nm_respond_detail(req, 409, "%s", busy_detail(nm));
        wire_start_cmd_release(&cmd);
        return;
    }
    /* Fix of §12.14: the Controller resends the same command to every NM of an
     * instance; a repeat for engines already running is a no-op (no ranktable rewrite,
     * no generation or grace reset). */
    if (nm->launch && nm->n_eps && same_launch(nm->launch, &cmd) && nm_engine_any_alive(nm)) {
        bool all = true;
        for (size_t i = 0; i < nm->n_eps; i++)
            if (!nm_engine_retired(nm->eps[i]) &&
                !(nm->eps[i]->proc && proc_running(nm->eps[i]->proc)))
                all = false;
        if (all) {
            log_info("start_unchanged", LF_INT("instance_id", cmd.instance_id));
            wire_start_cmd_release(&cmd);
            httpd_respond_json(req, 200, json_object());
            return;
        }
    }
    log_info("start_accepted", LF_INT("instance_id", cmd.instance_id),
             LF_STR("role", wire_role_str(cmd.role)), LF_INT("endpoints", cmd.n_endpoints),
             LF_STR("master_dp_ip", cmd.master_dp_ip), LF_INT("node_rank", cmd.node_rank));
    if (cmd.ranktable) {
        const char *path = nm->cfg->ranktable_path;
        if (path && *path) {
            rc = wire_ranktable_write_file(cmd.ranktable, path);
            if (rc < 0) {
                log_error("ranktable_write_failed", LF_STR("path", path),
                          LF_STR("error", strerror(-rc)));
                nm_respond_detail(req, 500,
                                  "Failed to start native engine: cannot write the "
                                  "ranktable to %s: %s",
                                  path, strerror(-rc));
                wire_start_cmd_release(&cmd);
                return;
            }
            log_info("ranktable_written", LF_STR("path", path));
        } else {
            log_info("ranktable_skipped", LF_STR("why", "$RANKTABLE_PATH unset"));
        }
    }
    nm->pending_start = xmalloc(sizeof(cmd));
    *nm->pending_start = cmd;
    pending_hold(nm, req);
    /* Alive engines of another spec go first (NM_PA_STOP_FOR_START); the phase's action
     * answers the request. */
    nm_phase_event(nm, nm_engine_any_alive(nm) ? NM_PEV_START : NM_PEV_LAUNCH, "start command");
}

/* ---- relaunch (§7.1) ------------------------------------------------------------------------ */

int nm_launch_respawn(struct nodemgr *nm, char *why, size_t cap)
{
    char ts[40], banner[160];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    snprintf(banner, sizeof(banner), "[ENGINE RELAUNCH #%u] instance_id=%lld %s",
             nm->relaunch_count, (long long)nm->launch->instance_id, ts);
    nm_engine_banner(nm, banner);
    nm_engine_reset_restart_state(nm);
    struct wire_err err = {{0}};
    if (nm_engine_spawn_all(nm, &err) < 0) {
        snprintf(why, cap, "%s", err.msg);
        return -EIO;
    }
    metrics_counter_inc(nm->m.relaunches);
    state_save(nm);
    nm_engine_probes_start(nm);
    nm_ctrl_heartbeat_start(nm);
    return 0;
}

void nm_launch_handle_restart(struct nodemgr *nm, struct httpd_req *req)
{
    char jerr[200];
    json_t *j = httpd_req_json(req, jerr, sizeof(jerr));
    if (!j) {
        nm_respond_detail(req, 400, "Invalid request body: %s", jerr);
        return;
    }
    struct wire_engine_restart_req r;
    struct wire_err err = {{0}};
    int rc = wire_engine_restart_req_parse(j, &r, &err);
    json_decref(j);
    if (rc < 0) {
        nm_respond_detail(req, 400, "Invalid request body: %s", err.msg);
        return;
    }
    if (r.action == WIRE_RESTART_ABORT) {
        /* The Controller gave up on relaunching us: the container-restart fallback
         * (suicide arbitration) must resume now, not when the freeze expires. */
        nm_unfreeze(nm, NM_FREEZE_FAULT, "abort");
        nm_unfreeze(nm, NM_FREEZE_RELAUNCH, "abort");
        log_info("relaunch_abort_accepted");
        httpd_respond_json(req, 200, json_pack("{s:s}", "message", "abort accepted"));
        return;
    }
    enum nm_phase_action verdict = nm_phase_verdict(nm, NM_PEV_RELAUNCH);
    if (verdict == NM_PA_REJECT_STOPPING) {
        nm_respond_detail(req, 503, "Node manager is stopping");
        return;
    }
    if (verdict == NM_PA_REJECT_BUSY) {
        nm_respond_detail(req, 409, "Engine restart already in progress");
        return;
    }
    if (!nm->has_engine || !nm->launch ||
        (r.has_instance_id && r.instance_id != nm->launch->instance_id)) {
        if (nm->launch && r.has_instance_id)
            log_warn("relaunch_rejected", LF_INT("instance_id", r.instance_id),
                     LF_INT("stored_instance_id", nm->launch->instance_id));
        nm_respond_detail(req, 400, "No engine start recorded, nothing to restart");
        return;
    }
    nm->relaunch_count++;
    log_info("relaunch_accepted", LF_INT("relaunch", nm->relaunch_count),
             LF_INT("instance_id", nm->launch->instance_id));
    nm_ft_pause(nm);
    nm_freeze(nm, NM_FREEZE_RELAUNCH, nm_config_ms(nm->cfg->ft.engine_restart_freeze_sec),
              "relaunch");
    if (nm_services_prepare(nm, (int)nm->launch->n_endpoints) < 0) {
        /* Refused before it began: the phase stays what it was. */
        nm_unfreeze(nm, NM_FREEZE_RELAUNCH, "relaunch failed");
        nm_ft_resume(nm);
        log_error("relaunch_failed", LF_STR("why", "service prepare failed"));
        nm_respond_detail(req, 500, "Engine restart failed: service prepare failed");
        return;
    }
    if (nm->n_eps == 0) {
        /* Restored from the state file after our own restart: no endpoints yet. */
        nm_engine_set_endpoints(nm, nm->launch);
        nm->generation++;
        nm->grace = true;
        nm->grace_since_ms = util_mono_ms();
    }
    pending_hold(nm, req);
    nm_phase_event(nm, NM_PEV_RELAUNCH, "engine-restart");
}

/* ---- stop ------------------------------------------------------------------------------------ */

void nm_launch_answer_stop(struct nodemgr *nm)
{
    struct httpd_req *req = nm->stop_req;
    nm->stop_req = NULL;
    if (!req)
        return;
    httpd_req_on_close(req, NULL, NULL);
    httpd_respond_json(req, 200,
                       json_pack("{s:s}", "message", "All engine processes stopped successfully."));
}

void nm_launch_handle_stop(struct nodemgr *nm, struct httpd_req *req)
{
    enum nm_phase_action verdict = nm_phase_verdict(nm, NM_PEV_STOP);
    if (verdict == NM_PA_REJECT_BUSY) {
        nm_respond_detail(req, 409, "Stop already in progress");
        return;
    }
    if (verdict == NM_PA_REJECT_STOPPING) {
        nm_respond_detail(req, 503, "Node manager is stopping");
        return;
    }
    log_info("stop_requested", LF_STR("peer", httpd_req_peer(req)));
    nm->stop_req = req;
    httpd_req_on_close(req, pending_closed, nm);
    nm_phase_event(nm, NM_PEV_STOP, "stop route");
}

/* ---- standalone -------------------------------------------------------------------------------
 */

int nm_launch_standalone(struct nodemgr *nm)
{
    const struct nm_config *cfg = nm->cfg;
    struct wire_start_cmd *cmd = xcalloc(1, sizeof(*cmd));
    cmd->job_name = xstrdup(cfg->job_name ? cfg->job_name : "standalone");
    cmd->role = cfg->role;
    cmd->instance_id = 0;
    cmd->master_dp_ip = xstrdup(cfg->pod_ip);
    cmd->node_rank = 0;
    cmd->n_endpoints = (size_t)cfg->endpoint_num;
    cmd->endpoints = xcalloc(cmd->n_endpoints ? cmd->n_endpoints : 1, sizeof(*cmd->endpoints));
    for (size_t i = 0; i < cmd->n_endpoints; i++) {
        struct wire_endpoint *e = &cmd->endpoints[i];
        e->id = (int64_t)i;
        e->ip = xstrdup(cfg->pod_ip);
        e->business_port = xasprintf("%d", cfg->service_ports[i]);
        e->status = WIRE_EP_INITIAL;
        e->bootstrap_port = cfg->bootstrap_port;
    }
    nm->pending_start = cmd;
    log_info("standalone_start", LF_INT("endpoints", cmd->n_endpoints),
             LF_STR("engine_type", nm_engine_type_str(cfg->engine_type)));
    nm_phase_event(nm, NM_PEV_LAUNCH, "standalone boot");
    if (nm->phase == NM_PH_IDLE) {
        log_error("standalone_start_failed", LF_STR("why", "the launch failed (start_failed)"));
        return -EIO;
    }
    return 0;
}

void nm_launch_shutdown(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->stop_exit_timer);
    free_start(nm->pending_start);
    nm->pending_start = NULL;
}
