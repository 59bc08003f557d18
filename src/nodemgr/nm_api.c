/* nm_api — the node manager's HTTP API (§4) on its reactor: the upstream routes with
 * their bodies and status codes, plus GET /metrics, GET /node-manager/engines and the
 * per-endpoint log tail. State-changing routes take the optional management key. */
#include "nodemgr/nm_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* A start command carries the instance ranktable: allow a large one. */
#define NM_API_MAX_BODY (16u << 20)
#define NM_DEFAULT_TAIL_LINES 100

void nm_respond_detail(struct httpd_req *req, int status, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    httpd_respond_error(req, status, buf);
}

/* FastAPI's bool query values. 0, or -EINVAL. */
static int parse_bool_query(const char *s, bool *out)
{
    static const char *const yes[] = {"true", "1", "yes", "on", "t", "y"};
    static const char *const no[] = {"false", "0", "no", "off", "f", "n"};
    for (size_t i = 0; i < ARRAY_LEN(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- upstream routes ---------------------------------------------------------------------- */

static void h_start(struct httpd_req *req, void *arg)
{
    nm_launch_handle_start(arg, req);
}

static void h_stop(struct httpd_req *req, void *arg)
{
    nm_launch_handle_stop(arg, req);
}

static void h_restart(struct httpd_req *req, void *arg)
{
    nm_launch_handle_restart(arg, req);
}

static void h_status(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    bool relaxed = false;
    const char *q = httpd_req_query(req, "relaxed");
    if (q && parse_bool_query(q, &relaxed) < 0) {
        nm_respond_detail(req, 422, "relaxed: must be a boolean, got \"%.64s\"", q);
        return;
    }
    bool ok = relaxed ? nm_engine_none_abnormal(nm) : nm_engine_all_normal(nm);
    httpd_respond_json(req, 200, json_pack("{s:b}", "status", ok));
}

static void h_readiness(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    if (nm_engine_all_normal(nm)) {
        httpd_respond_json(req, 200, json_pack("{s:s}", "message", "Node manager is ready"));
        return;
    }
    httpd_respond_json(req, 503,
                       json_pack("{s:{s:s, s:s}}", "detail", "message", "Node manager is not ready",
                                 "reason", "Endpoints not healthy"));
}

static void h_liveness(struct httpd_req *req, void *arg)
{
    (void)arg;
    httpd_respond_json(req, 200, json_pack("{s:s}", "message", "Node manager is alive"));
}

static void h_pause(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    json_t *targets = json_array();
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (nm_engine_retired(e))
            continue;
        nm_engine_set_status(e, WIRE_EP_PAUSED, "pause");
        if (!e->ep.headless) {
            char *url = nm_ft_endpoint_url(e, "/metrics");
            json_array_append_new(targets, json_string(url));
            free(url);
        }
    }
    log_info("endpoints_paused", LF_INT("endpoints", nm->n_eps));
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s, s:o}", "status", "ok", "message",
                                 "Endpoints set to PAUSED", "engine_metrics_targets", targets));
}

static void h_resume(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        if (nm_engine_retired(e) || e->status != WIRE_EP_PAUSED)
            continue;
        /* Upstream sets NORMAL blindly; an engine that died while paused is abnormal. */
        nm_engine_set_status(
            e, nm_status_from_runtime(nm_engine_state_runtime(e->state), WIRE_EP_NORMAL), "resume");
    }
    log_info("endpoints_resumed", LF_INT("endpoints", nm->n_eps));
    httpd_respond_json(
        req, 200,
        json_pack("{s:s, s:s}", "status", "ok", "message", "Endpoints resumed to NORMAL"));
}

/* ---- additions --------------------------------------------------------------------------------
 */

static void h_engines(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    json_t *o = json_object();
    json_object_set_new(o, "instance_id",
                        nm->launch ? json_integer(nm->launch->instance_id) : json_null());
    json_object_set_new(o, "role", json_string(wire_role_str(nm->cfg->role)));
    json_object_set_new(o, "engine_type", json_string(nm_engine_type_str(nm->cfg->engine_type)));
    json_object_set_new(
        o, "restart_policy",
        json_string(nm->cfg->restart_policy == NM_RESTART_LOCAL ? "local" : "controller"));
    json_object_set_new(o, "generation", json_integer((json_int_t)nm->generation));
    json_object_set_new(o, "phase", json_string(nm_phase_str(nm->phase)));
    json_object_set_new(o, "relaunching", json_boolean(nm_relaunching(nm)));
    json_object_set_new(o, "relaunch_count", json_integer(nm->relaunch_count));
    json_object_set_new(o, "in_grace", json_boolean(nm->grace));
    json_object_set_new(o, "frozen", json_boolean(nm_frozen(nm)));
    json_object_set_new(o, "abnormal_rounds", json_integer(nm->arb.counter));
    json_object_set_new(o, "registered", json_boolean(nm->ctrl.registered));
    json_object_set_new(o, "endpoints", nm_engine_list_json(nm));
    httpd_respond_json(req, 200, o);
}

static void h_logs(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    int64_t id;
    if (util_parse_i64(httpd_req_param(req, "id"), 0, WIRE_ID_MAX, &id) < 0) {
        nm_respond_detail(req, 400, "endpoint id must be a non-negative integer");
        return;
    }
    int lines = NM_DEFAULT_TAIL_LINES;
    const char *t = httpd_req_query(req, "tail");
    if (t && util_parse_int(t, 0, NM_TAIL_MAX_LINES, &lines) < 0) {
        nm_respond_detail(req, 400, "tail must be an integer in [0, %d]", NM_TAIL_MAX_LINES);
        return;
    }
    struct nm_endpoint *e = nm_engine_find(nm, id);
    if (!e) {
        nm_respond_detail(req, 404, "endpoint %lld not found", (long long)id);
        return;
    }
    char *text = e->proc ? proc_tail(e->proc, (size_t)lines) : xstrdup("");
    httpd_respond(req, 200, "text/plain; charset=utf-8", text, strlen(text));
    free(text);
}

static void h_metrics(struct httpd_req *req, void *arg)
{
    struct nodemgr *nm = arg;
    struct strbuf sb;
    strbuf_init(&sb, 8u << 20);
    metrics_render(nm->m.reg, &sb);
    /* Per-endpoint series come from the live endpoint set, so endpoints of an older
     * start command disappear instead of lingering. */
    strbuf_puts(&sb, "# HELP motor_nm_endpoint_up 1 while the endpoint's engine process runs.\n"
                     "# TYPE motor_nm_endpoint_up gauge\n");
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        strbuf_appendf(&sb, "motor_nm_endpoint_up{endpoint_id=\"%lld\"} %d\n", (long long)e->ep.id,
                       e->proc && proc_running(e->proc) ? 1 : 0);
    }
    strbuf_puts(&sb, "# HELP motor_nm_endpoint_status The status reported in heartbeats (1 for "
                     "the current one).\n"
                     "# TYPE motor_nm_endpoint_status gauge\n");
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        strbuf_appendf(&sb, "motor_nm_endpoint_status{endpoint_id=\"%lld\",status=\"%s\"} 1\n",
                       (long long)e->ep.id, wire_ep_status_str(e->status));
    }
    strbuf_puts(&sb, "# HELP motor_nm_endpoint_restarts Processes started for the endpoint after "
                     "the first.\n"
                     "# TYPE motor_nm_endpoint_restarts gauge\n");
    for (size_t i = 0; i < nm->n_eps; i++) {
        struct nm_endpoint *e = nm->eps[i];
        strbuf_appendf(&sb, "motor_nm_endpoint_restarts{endpoint_id=\"%lld\"} %u\n",
                       (long long)e->ep.id, e->spawns > 0 ? e->spawns - 1 : 0);
    }
    strbuf_appendf(&sb,
                   "# HELP motor_nm_abnormal_rounds Consecutive abnormal arbitration rounds.\n"
                   "# TYPE motor_nm_abnormal_rounds gauge\nmotor_nm_abnormal_rounds %d\n"
                   "# HELP motor_nm_suicide_frozen 1 while suicide arbitration is frozen.\n"
                   "# TYPE motor_nm_suicide_frozen gauge\nmotor_nm_suicide_frozen %d\n"
                   "# HELP motor_nm_registered 1 once registered with the Controller.\n"
                   "# TYPE motor_nm_registered gauge\nmotor_nm_registered %d\n"
                   "# HELP motor_nm_engine_output_dropped_lines_total Engine output lines not "
                   "passed through to stdout (reader too slow).\n"
                   "# TYPE motor_nm_engine_output_dropped_lines_total counter\n"
                   "motor_nm_engine_output_dropped_lines_total %llu\n",
                   nm->arb.counter, nm_frozen(nm) ? 1 : 0, nm->ctrl.registered ? 1 : 0,
                   (unsigned long long)nm->passthrough_dropped);
    nm_pool_render_metrics(nm, &sb); /* the worker pool it runs, if any */
    if (sb.overflow) {
        strbuf_release(&sb);
        httpd_respond_error(req, 500, "metrics exposition too large");
        return;
    }
    httpd_respond(req, 200, METRICS_CONTENT_TYPE, strbuf_str(&sb), sb.len);
    strbuf_release(&sb);
}

/* ---- server --------------------------------------------------------------------------------- */

void nm_route(struct nodemgr *nm, const char *method, const char *pattern, httpd_handler fn,
              void *arg, unsigned flags)
{
    httpd_route(nm->api, method, pattern, fn, arg, flags);
}

static bool readable(const char *path)
{
    return path && *path && access(path, R_OK) == 0;
}

int nm_api_init(struct nodemgr *nm)
{
    const struct nm_config *cfg = nm->cfg;
    static const char *const quiet[] = {"/readiness", "/liveness", "/metrics",
                                        "/node-manager/status", NULL};
    int port = nm->port_override >= 0 ? nm->port_override : cfg->node_manager_port;
    struct httpd_config hc = {
        .name = "node-manager-api",
        .host = cfg->bind_host ? cfg->bind_host : cfg->pod_ip,
        .port = (uint16_t)port,
        .max_body = NM_API_MAX_BODY,
        .api_key = cfg->management_api_key,
        .quiet_paths = quiet,
    };
    char *password = NULL;
    const struct nm_tls *t = &cfg->mgmt_tls;
    if (t->enable_tls) {
        hc.tls_cert_file = t->cert_file;
        hc.tls_key_file = t->key_file;
        /* With a CA the server asks for client certificates (mutual TLS, as upstream's
         * Controller presents the same TLS files); without one it is server-auth only. */
        if (readable(t->ca_file))
            hc.tls_ca_file = t->ca_file;
        if (readable(t->passwd_file)) {
            size_t len = 0;
            password = util_read_file(t->passwd_file, 4096, &len);
            while (password && len > 0 && (password[len - 1] == '\n' || password[len - 1] == '\r'))
                password[--len] = '\0';
            hc.tls_key_password = password;
        }
        /* A CRL is checked against client certificates, so only with a CA. */
        if (t->crl_file && *t->crl_file && hc.tls_ca_file)
            hc.tls_crl_file = t->crl_file;
        else if (t->crl_file && *t->crl_file)
            log_warn("mgmt_tls_crl_ignored", LF_STR("crl_file", t->crl_file),
                     LF_STR("why", "a CRL needs ca_file (client certificates are not verified)"));
    }
    nm->api = httpd_new(nm->r, &hc);
    free(password);
    if (!nm->api) {
        int err = errno ? errno : EIO;
        log_error("api_listen_failed", LF_STR("host", hc.host), LF_INT("port", port),
                  LF_STR("error", strerror(err)));
        return -err;
    }
    nm->api_port = httpd_port(nm->api);

    /* Extension routes first (the first matching route wins). */
    int rc = nm_ft_init(nm);
    if (rc < 0)
        return rc;
    if ((rc = nm_scaledown_init(nm)) < 0)
        return rc;
    if ((rc = nm_pool_init(nm)) < 0)
        return rc;
    nm_kv_init_routes(nm);

    nm_route(nm, "POST", "/node-manager/start", h_start, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/stop", h_stop, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/engine-restart", h_restart, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/pause", h_pause, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "POST", "/node-manager/resume", h_resume, nm, HTTPD_ROUTE_AUTH);
    nm_route(nm, "GET", "/node-manager/status", h_status, nm, 0);
    nm_route(nm, "GET", "/readiness", h_readiness, nm, 0);
    nm_route(nm, "GET", "/liveness", h_liveness, nm, 0);
    nm_route(nm, "GET", "/metrics", h_metrics, nm, 0);
    nm_route(nm, "GET", "/node-manager/engines", h_engines, nm, 0);
    nm_route(nm, "GET", "/node-manager/engines/{id}/logs", h_logs, nm, 0);

    log_info("nm_listening", LF_STR("host", hc.host), LF_STR("advertised", cfg->pod_ip),
             LF_BOOL("pod_ip_detected", cfg->pod_ip_detected), LF_INT("port", nm->api_port),
             LF_BOOL("tls", t->enable_tls), LF_BOOL("mutual_tls", hc.tls_ca_file != NULL),
             LF_BOOL("management_key", cfg->management_api_key != NULL));
    return 0;
}
