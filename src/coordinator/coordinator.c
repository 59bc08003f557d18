/* motor coordinator — process lifecycle: arguments, configuration, the management
 * reactor on the main thread, N worker threads, metrics, graceful stop. */
#include "coordinator/coord_internal.h"
#include "coordinator/kvidx.h"
#include "coordinator/precision.h"

#include "coordinator/coordinator.h"
#include "common/cliopt.h"
#include "common/http1.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- metrics ------------------------------------------------------------------------ */

static const char *const cause_names[CAUSE_COUNT] = {
    [CAUSE_BAD_REQUEST] = "bad_request",
    [CAUSE_UNAUTHORIZED] = "unauthorized",
    [CAUSE_MODEL_NOT_FOUND] = "model_not_found",
    [CAUSE_NO_INSTANCE] = "no_instance",
    [CAUSE_UPSTREAM_TRANSPORT] = "upstream_transport",
    [CAUSE_UPSTREAM_STATUS] = "upstream_status",
    [CAUSE_UPSTREAM_PROTOCOL] = "upstream_protocol",
    [CAUSE_FIRST_TOKEN_TIMEOUT] = "first_token_timeout",
    [CAUSE_INFER_TIMEOUT] = "infer_timeout",
    [CAUSE_CLIENT_DISCONNECT] = "client_disconnect",
    [CAUSE_SHUTDOWN] = "shutdown",
    [CAUSE_INTER_TOKEN_TIMEOUT] = "inter_token_timeout",
};

static void metrics_cache(struct coord *c);

/* vLLM's bucket edges (vllm/v1/metrics/loggers.py), so the gateway's histograms and the
 * engines' own vllm:* ones share a dashboard panel. */
static const double vllm_ttft_b[] = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                     0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                     20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
static const double vllm_itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                    0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double vllm_e2e_b[] = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                    5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/* vLLM's build_1_2_5_buckets up to 1M tokens (it stops at max_model_len). */
static const double vllm_tok_b[] = {1,     2,      5,      10,     20,     50,    100,
                                    200,   500,    1000,   2000,   5000,   10000, 20000,
                                    50000, 100000, 200000, 500000, 1000000};

static void gw_metrics_setup(struct coord_metrics *m)
{
#define GWH(field, name, help, b)                                                                  \
    m->field = metrics_histogram_family(m->reg, name, help, b, ARRAY_LEN(b), "model_name", "role")
    GWH(gw_ttft, "motor_gateway_time_to_first_token_seconds",
        "Arrival to the first answer byte sent to the client, by model and the role of the "
        "instance that answered.",
        vllm_ttft_b);
    GWH(gw_itl, "motor_gateway_inter_token_latency_seconds",
        "Time between two consecutive streamed events (one token each with vLLM's defaults).",
        vllm_itl_b);
    GWH(gw_tpot, "motor_gateway_time_per_output_token_seconds",
        "Per streamed request: (end - first event) / (events - 1).", vllm_itl_b);
    GWH(gw_e2e, "motor_gateway_e2e_request_latency_seconds",
        "Arrival to the last byte of a successful answer.", vllm_e2e_b);
    GWH(gw_queue, "motor_gateway_queue_time_seconds",
        "Arrival until an endpoint was picked (parsing, tokenizing, routing, backoff).",
        vllm_ttft_b);
    GWH(gw_handoff, "motor_gateway_pd_handoff_seconds",
        "PD: the prefill leg's answer (the KV ticket) to the decode leg's first byte.",
        vllm_ttft_b);
    GWH(gw_prompt, "motor_gateway_request_prompt_tokens",
        "Prompt tokens per successful request (the engine's usage, else the routing count).",
        vllm_tok_b);
    GWH(gw_completion, "motor_gateway_request_generation_tokens",
        "Completion tokens per successful request (usage, else streamed events).", vllm_tok_b);
#undef GWH
    m->gw_prompt_total =
        metrics_counter_family(m->reg, "motor_gateway_prompt_tokens_total",
                               "Prompt tokens of the requests answered.", "model_name", "role");
    m->gw_completion_total =
        metrics_counter_family(m->reg, "motor_gateway_generation_tokens_total",
                               "Completion tokens forwarded to clients.", "model_name", "role");
}

const struct gwm *gwm_get(struct coord_worker *w, const char *model, enum wire_role role)
{
    struct coord_metrics *m = &w->c->m;
    if (!model || !*model)
        model = "unknown";
    if ((unsigned)role >= WIRE_ROLE_COUNT)
        role = WIRE_ROLE_UNION;
    struct gwm_cache *e = NULL;
    for (int i = 0; i < w->n_gwm && !e; i++)
        if (!strcmp(w->gwm[i].model, model))
            e = &w->gwm[i];
    if (!e) {
        /* Past GWM_MAX_MODELS (or a name too long for a label we keep): "other". */
        bool fits = w->n_gwm < GWM_MAX_MODELS && strlen(model) < sizeof(e->model);
        const char *name = fits ? model : "other";
        for (int i = 0; i < w->n_gwm && !e; i++)
            if (!strcmp(w->gwm[i].model, name))
                e = &w->gwm[i];
        if (!e) {
            e = &w->gwm[w->n_gwm++];
            snprintf(e->model, sizeof(e->model), "%s", name);
        }
    }
    struct gwm *g = &e->by_role[role];
    if (!e->resolved[role]) {
        /* Get-or-create takes the registry mutex: once per worker, model and role. */
        const char *r = wire_role_str(role);
        const char *v[] = {e->model, r, NULL};
        g->ttft = metrics_histogram_labelsv(m->gw_ttft, v);
        g->itl = metrics_histogram_labelsv(m->gw_itl, v);
        g->tpot = metrics_histogram_labelsv(m->gw_tpot, v);
        g->e2e = metrics_histogram_labelsv(m->gw_e2e, v);
        g->queue = metrics_histogram_labelsv(m->gw_queue, v);
        g->handoff = metrics_histogram_labelsv(m->gw_handoff, v);
        g->prompt = metrics_histogram_labelsv(m->gw_prompt, v);
        g->completion = metrics_histogram_labelsv(m->gw_completion, v);
        g->prompt_total = metrics_counter_labelsv(m->gw_prompt_total, v);
        g->completion_total = metrics_counter_labelsv(m->gw_completion_total, v);
        e->resolved[role] = true;
    }
    return g;
}

static void metrics_setup(struct coord *c)
{
    struct coord_metrics *m = &c->m;
    m->reg = metrics_registry_new();
    m->requests = metrics_counter_family(m->reg, "motor_coordinator_requests_total",
                                         "Inference requests answered, by API and HTTP status.",
                                         "api", "code");
    struct metrics_family *errs =
        metrics_counter_family(m->reg, "motor_coordinator_errors_total",
                               "Inference requests that failed, by cause.", "cause");
    for (int i = 0; i < CAUSE_COUNT; i++)
        m->errors[i] = metrics_counter_labels(errs, "cause", cause_names[i]);
    m->retries =
        metrics_counter_new(m->reg, "motor_coordinator_retries_total",
                            "Attempts repeated on another instance before the first byte.");
    m->busy = metrics_counter_new(
        m->reg, "motor_coordinator_busy_endpoints_total",
        "Legs an engine closed before answering anything (its connection cap): tried "
        "elsewhere, not charged to the breaker nor to the retries.");
    struct metrics_family *rs = metrics_counter_family(
        m->reg, "motor_coordinator_reschedules_total",
        "Streamed answers whose leg failed mid-stream, by what followed: continued on another "
        "instance (started), ended in-band because they could not be (refused).",
        "outcome");
    m->reschedules = metrics_counter_labels(rs, "outcome", "started");
    m->reschedule_refused = metrics_counter_labels(rs, "outcome", "refused");
    static const double rs_b[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30};
    m->reschedule_gap = metrics_histogram_new(
        m->reg, "motor_coordinator_reschedule_gap_seconds",
        "Time from a stream's failure to its continuation's first byte (the added latency).", rs_b,
        ARRAY_LEN(rs_b));
    m->breaker_trips = metrics_counter_new(m->reg, "motor_coordinator_breaker_trips_total",
                                           "Times an instance's circuit breaker opened.");
    m->legs =
        metrics_counter_family(m->reg, "motor_coordinator_upstream_legs_total",
                               "Requests sent to engines, by role and outcome.", "role", "outcome");
    static const double ttft_b[] = {.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60};
    static const double e2e_b[] = {.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300};
    m->ttft = metrics_histogram_new(m->reg, "motor_coordinator_time_to_first_token_seconds",
                                    "Time from request arrival to the first byte sent back.",
                                    ttft_b, ARRAY_LEN(ttft_b));
    m->e2e =
        metrics_histogram_new(m->reg, "motor_coordinator_request_duration_seconds",
                              "End-to-end latency of inference requests.", e2e_b, ARRAY_LEN(e2e_b));
    m->inflight = metrics_gauge_new(m->reg, "motor_coordinator_inflight_requests",
                                    "Inference requests in progress.");
    m->refreshes = metrics_counter_new(m->reg, "motor_coordinator_instance_refreshes_total",
                                       "Accepted POST /instances/refresh calls.");
    struct metrics_family *rl =
        metrics_counter_family(m->reg, "motor_coordinator_config_reloads_total",
                               "Configuration reloads, by result.", "result");
    m->reloads_ok = metrics_counter_labels(rl, "result", "ok");
    m->reloads_failed = metrics_counter_labels(rl, "result", "invalid");
    m->standby_refusals =
        metrics_counter_new(m->reg, "motor_coordinator_standby_refusals_total",
                            "Inference requests refused because this coordinator is a standby.");
    m->is_master = metrics_gauge_new(m->reg, "motor_coordinator_master",
                                     "1 while this coordinator serves (master, or no standby "
                                     "configuration), 0 as a standby.");
    m->prefix_prompt_tokens =
        metrics_counter_new(m->reg, "motor_coordinator_prefix_prompt_tokens_total",
                            "Prompt tokens of requests routed by kv_cache_affinity.");
    m->prefix_matched_tokens =
        metrics_counter_new(m->reg, "motor_coordinator_prefix_matched_tokens_total",
                            "Of those, tokens the chosen endpoint held in its prefix cache (as "
                            "the coordinator knew it).");
    struct metrics_family *tk = metrics_counter_family(
        m->reg, "motor_coordinator_tokenize_requests_total",
        "Prompts sent to an engine's /tokenize before routing, by result.", "result");
    m->tokenize_ok = metrics_counter_labels(tk, "result", "ok");
    struct metrics_family *cq = metrics_counter_family(
        m->reg, "motor_coordinator_conductor_queries_total",
        "Prefix queries to the KV Conductor before routing, by result.", "result");
    m->conductor_ok = metrics_counter_labels(cq, "result", "ok");
    m->conductor_failed = metrics_counter_labels(cq, "result", "failed");
    m->tokenize_failed = metrics_counter_labels(tk, "result", "failed");
    gw_metrics_setup(m);
    m->mem_trims = metrics_counter_new(
        m->reg, "motor_coordinator_memory_trims_total",
        "Times the coordinator gave freed heap memory back to the kernel (malloc_trim).");
    m->mem_trimmed = metrics_counter_new(m->reg, "motor_coordinator_memory_trimmed_bytes_total",
                                         "Resident memory those trims gave back, bytes.");
    metrics_cache(c);
}

void coord_count_error(struct coord *c, enum coord_cause cause)
{
    if ((unsigned)cause < CAUSE_COUNT)
        metrics_counter_inc(c->m.errors[cause]);
}

static const int coord_codes[COORD_CODES] = {200, 400, 401, 404, 413, 499, 500, 502, 503, 504};
static const char *const coord_apis[3] = {"completions", "chat_completions", "models"};
static const char *const leg_outcomes[3] = {"abandoned", "success", "failure"};

static void metrics_cache(struct coord *c)
{
    struct coord_metrics *m = &c->m;
    for (int a = 0; a < 3; a++)
        for (int k = 0; k < COORD_CODES; k++) {
            char codes[8];
            snprintf(codes, sizeof(codes), "%d", coord_codes[k]);
            m->req_cache[a][k] =
                metrics_counter_labels(m->requests, "api", coord_apis[a], "code", codes);
        }
    for (int r = 0; r < WIRE_ROLE_COUNT; r++)
        for (int o = 0; o < 3; o++)
            m->leg_cache[r][o] = metrics_counter_labels(
                m->legs, "role", wire_role_str((enum wire_role)r), "outcome", leg_outcomes[o]);
}

void coord_count_request(struct coord *c, const char *api, int code)
{
    for (int a = 0; a < 3; a++) {
        if (strcmp(api, coord_apis[a]) != 0)
            continue;
        for (int k = 0; k < COORD_CODES; k++) {
            if (coord_codes[k] == code) {
                metrics_counter_inc(c->m.req_cache[a][k]);
                return;
            }
        }
    }
    char codes[8];
    snprintf(codes, sizeof(codes), "%d", code);
    /* Rare statuses: the lookup takes the registry mutex, and the set stays small. */
    metrics_counter_inc(metrics_counter_labels(c->m.requests, "api", api, "code", codes));
}

void coord_count_leg(struct coord *c, enum wire_role role, int outcome)
{
    if ((unsigned)role < WIRE_ROLE_COUNT)
        metrics_counter_inc(c->m.leg_cache[role][outcome > 0 ? 1 : outcome < 0 ? 2 : 0]);
}

void coord_handle_metrics(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    struct strbuf sb;
    strbuf_init(&sb, 8u << 20);
    metrics_render(c->m.reg, &sb);
    /* In-flight load per endpoint comes from the live snapshot, so endpoints that left
     * the fleet disappear from the exposition instead of lingering as stale series. */
    struct inst_snapshot *s = inst_pub_get(&c->pub);
    strbuf_puts(&sb, "# HELP motor_coordinator_endpoint_inflight_requests Upstream legs in "
                     "flight per endpoint.\n"
                     "# TYPE motor_coordinator_endpoint_inflight_requests gauge\n");
    for (size_t i = 0; s && i < s->n_all; i++) {
        struct instance *in = s->all[i];
        for (size_t j = 0; j < in->n_eps; j++) {
            struct inst_endpoint *ep = &in->eps[j];
            if (!ep->load)
                continue;
            strbuf_appendf(&sb,
                           "motor_coordinator_endpoint_inflight_requests{instance_id=\"%lld\","
                           "role=\"%s\",endpoint=\"%s\"} %d\n",
                           (long long)in->id, wire_role_str(in->role), ep->hostport,
                           atomic_load(&ep->load->requests));
        }
    }
    strbuf_puts(&sb, "# HELP motor_coordinator_endpoint_inflight_tokens Estimated tokens in "
                     "flight per endpoint.\n"
                     "# TYPE motor_coordinator_endpoint_inflight_tokens gauge\n");
    for (size_t i = 0; s && i < s->n_all; i++) {
        struct instance *in = s->all[i];
        for (size_t j = 0; j < in->n_eps; j++) {
            struct inst_endpoint *ep = &in->eps[j];
            if (!ep->load)
                continue;
            strbuf_appendf(&sb,
                           "motor_coordinator_endpoint_inflight_tokens{instance_id=\"%lld\","
                           "role=\"%s\",endpoint=\"%s\"} %lld\n",
                           (long long)in->id, wire_role_str(in->role), ep->hostport,
                           (long long)atomic_load(&ep->load->tokens));
        }
    }
    inst_snapshot_unref(s);
    /* The requests' state machine, summed over the workers (each writes its own). */
    const struct reqfsm_stats *stats[256];
    size_t n_stats = 0;
    for (int i = 0; c->workers && i < c->n_workers && n_stats < ARRAY_LEN(stats); i++)
        stats[n_stats++] = &c->workers[i].fsm_stats;
    reqfsm_render(&sb, stats, n_stats);
    if (sb.overflow) {
        strbuf_release(&sb);
        httpd_respond_error(req, 500, "metrics exposition too large");
        return;
    }
    httpd_respond(req, 200, METRICS_CONTENT_TYPE, strbuf_str(&sb), sb.len);
    strbuf_release(&sb);
}

bool coord_ready(struct inst_snapshot *s)
{
    if (!s)
        return false;
    return (s->n_routable[WIRE_ROLE_PREFILL] && s->n_routable[WIRE_ROLE_DECODE]) ||
           s->n_routable[WIRE_ROLE_UNION] || s->n_routable[WIRE_ROLE_PREFILL];
}

/* A worker whose loop has not run the management thread's beat for this long is stuck. */
#define COORD_WORKER_STALE_MS 5000

bool coord_serving(struct coord *c, int64_t now_ms)
{
    return now_ms < atomic_load_explicit(&c->serve_until, memory_order_acquire);
}

json_t *coord_readiness(struct coord *c, struct inst_snapshot *s, bool mgmt, int *status)
{
    const char *holder = "";
    const char *role = coord_ha_role(c, &holder);
    const char *reason = NULL;
    char message[160] = "Coordinator is ok";
    int64_t now = util_mono_ms();
    if (atomic_load(&c->stopping)) {
        reason = "SHUTTING_DOWN";
        snprintf(message, sizeof(message), "Coordinator is shutting down");
    } else if (!coord_serving(c, now)) {
        bool syncing = strcmp(role, "syncing") == 0;
        reason = syncing ? "SYNCING" : "NOT_MASTER";
        snprintf(message, sizeof(message), "%s",
                 syncing ? "Coordinator is taking over: reading the instance table"
                         : "Coordinator is a standby");
    }
    for (int i = 0; !reason && c->workers && i < c->n_workers; i++) {
        struct coord_worker *w = &c->workers[i];
        if (!w->started)
            continue;
        int64_t beat = atomic_load(&w->beat_ms);
        if (atomic_load(&w->exited)) {
            reason = "DAEMON_EXITED";
            snprintf(message, sizeof(message), "inference worker %d exited", i);
        } else if (beat && now - beat > COORD_WORKER_STALE_MS) {
            reason = "HEARTBEAT_STALE";
            snprintf(message, sizeof(message), "inference worker %d has not run for %lld ms", i,
                     (long long)(now - beat));
        }
    }
    json_t *j;
    if (reason) {
        *status = 503;
        bool standby = strcmp(reason, "NOT_MASTER") == 0 || strcmp(reason, "SYNCING") == 0;
        j = json_pack("{s:s, s:s, s:b, s:s}", "status", standby ? "standby" : "unavailable",
                      "message", message, "ready", false, "reason", reason);
    } else {
        *status = 200;
        j = json_pack("{s:s, s:s, s:b}", "status", "ok", "message", message, "ready",
                      coord_ready(s));
    }
    /* Without master/standby the answer is what it always was. */
    if (c->cfg.ha_enable) {
        json_object_set_new(j, "role", json_string(role));
        json_object_set_new(j, "master", json_string(holder));
    }
    if (mgmt) {
        json_object_set_new(j, "boot_id", json_string(c->boot_id));
        json_object_set_new(j, "started_at", json_real((double)c->start_wall_ms / 1000.0));
    }
    return j;
}

bool coord_refuse_standby(struct coord *c, struct httpd_req *req, const char *api)
{
    if (coord_serving(c, util_mono_ms()))
        return true;
    metrics_counter_inc(c->m.standby_refusals);
    coord_count_request(c, api, 503);
    httpd_add_header(req, "Retry-After", "1");
    httpd_add_header(req, "Connection", "close"); /* a kept-alive client reconnects */
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i, s:s}}", "error", "message",
                          "this coordinator is a standby (NOT_MASTER): send inference to the "
                          "master (the one whose /readiness answers 200)",
                          "type", http1_openai_error_type(503), "param", "code", 503, "reason",
                          "NOT_MASTER");
    httpd_respond_json(req, 503, j);
    return false;
}

/* ---- arguments ---------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor coordinator [options]\n\n"
            "The OpenAI-compatible gateway: routes requests across prefill, decode and union\n"
            "instances (PD hand-off, load balancing, circuit breaking, retries, SSE).\n\n"
            "  --config PATH      user_config.json (default: $USER_CONFIG_PATH, $CONFIG_PATH)\n"
            "  --host ADDR        bind address (motor_coordinator_config.api_config."
            "coordinator_api_host)\n"
            "  --port N           inference port (default 1025; 0 = ephemeral)\n"
            "  --mgmt-port N      management port (default 1026; 0 = ephemeral)\n"
            "  --workers N        inference worker threads (default: CPU count)\n"
            "  --log-level LEVEL  debug, info, warn, error (default info)\n"
            "  --check-config     print the effective configuration as JSON and exit 0, or\n"
            "                     every error and exit 1\n"
            "  -h, --help         this text\n\n"
            "The bound ports are logged as {\"event\":\"coordinator_listening\",...}.\n");
}

struct cli_args {
    const char *config;
    const char *host;
    int port, mgmt_port, workers;
    const char *log_level;
    bool check;
};

static int parse_args(int argc, char **argv, struct cli_args *a)
{
    const struct cliopt opts[] = {
        {"config", 0, CLIOPT_STRING, &a->config, 0, 0, NULL},
        {"host", 0, CLIOPT_STRING, &a->host, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &a->port, 0, 65535, "0-65535"},
        {"mgmt-port", 0, CLIOPT_INT, &a->mgmt_port, 0, 65535, "0-65535"},
        {"workers", 0, CLIOPT_INT, &a->workers, 1, 256, "1-256"},
        {"log-level", 0, CLIOPT_STRING, &a->log_level, 0, 0, NULL},
        {"check-config", 0, CLIOPT_FLAG, &a->check, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    a->port = a->mgmt_port = a->workers = -1;
    return cliopt_parse("motor coordinator", argc, argv, opts, usage);
}

static int load_config(struct coord *c, const struct cli_args *a)
{
    const char *path = cliopt_config_path(a->config);
    c->cli.config = path ? xstrdup(path) : NULL;
    c->cli.host = a->host ? xstrdup(a->host) : NULL;
    c->cli.port = a->port;
    c->cli.mgmt_port = a->mgmt_port;
    c->cli.workers = a->workers;
    c->cli.log_level_pinned = a->log_level != NULL;
    struct cfg_errors e;
    cfg_errors_init(&e, "motor_coordinator_config");
    if (coord_config_read(&c->cli, &c->cfg, &e) < 0) {
        int n = cfg_errors_count(&e);
        log_error("config_invalid", LF_STR("path", path), LF_STR("errors", cfg_errors_text(&e)));
        fprintf(stderr, "motor coordinator: invalid configuration %s (%d error%s):\n%s",
                path ? path : "", n, n == 1 ? "" : "s", cfg_errors_text(&e));
        cfg_errors_release(&e);
        return -EINVAL;
    }
    cfg_errors_release(&e);
    if (!c->cli.log_level_pinned) {
        enum log_level lvl;
        if (log_parse_level(c->cfg.log_level, &lvl) == 0)
            log_set_level(lvl);
    }
    if (a->check) {
        json_t *j = ccfg_to_json(&c->cfg);
        json_object_set_new(j, "config_path", path && *path ? json_string(path) : json_null());
        char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
        json_decref(j);
        if (text)
            printf("%s\n", text);
        free(text);
        return 1;
    }
    log_info("config_loaded", LF_STR("path", path), LF_STR("host", c->cfg.host),
             LF_INT("infer_port", c->cfg.infer_port), LF_INT("mgmt_port", c->cfg.mgmt_port),
             LF_INT("workers", c->cfg.workers), LF_STR("scheduler", c->cfg.scheduler_type),
             LF_INT("max_retry", c->cfg.max_retry),
             LF_INT("first_token_timeout_ms", c->cfg.first_token_timeout_ms),
             LF_INT("infer_timeout_ms", c->cfg.infer_timeout_ms),
             LF_BOOL("api_key", c->cfg.api_key_enable),
             LF_BOOL("mgmt_api_key", c->cfg.mgmt_key_enable));
    return 0;
}

/* ---- workers ------------------------------------------------------------------------ */

static const char *const quiet_paths[] = {"/health",  "/liveness", "/readiness",
                                          "/startup", "/metrics",  NULL};

#define COORD_CONN_PER_WORKER 4096
#define COORD_FD_RESERVE 256 /* listeners, the management side, logs, etcd, resolver */

/* Client connection slots per worker: api_config.max_connections shared out, or 4096
 * each; either way no more than the open-file limit holds (a client connection and the
 * engine connection it drives are two descriptors), so accept never fails for want of
 * descriptors. */
static unsigned conn_slots(struct coord *c, long nofile)
{
    long want = c->cfg.max_connections > 0 ? c->cfg.max_connections
                                           : (long)COORD_CONN_PER_WORKER * c->n_workers;
    long fit = nofile > 0 ? (nofile - COORD_FD_RESERVE) / 2 : want;
    long total = MOTOR_MAX(MOTOR_MIN(want, fit), (long)c->n_workers * 16);
    if (total < want)
        log_warn("connection_slots_lowered", LF_INT("wanted", want), LF_INT("slots", total),
                 LF_INT("open_files_limit", nofile),
                 LF_STR("why", "each client connection may hold an engine connection too"));
    return (unsigned)MOTOR_MAX(total / c->n_workers, 1L);
}

static int worker_create(struct coord *c, struct coord_worker *w, int idx, uint16_t port)
{
    w->c = c;
    w->idx = idx;
    list_init(&w->live);
    w->r = reactor_new();
    if (!w->r)
        return -errno;
    struct httpd_config hc = {
        .name = "coordinator-infer",
        .host = c->cfg.host,
        .port = port,
        .max_body = c->cfg.max_body,
        .reuse_port = true,
        .max_connections = c->conn_per_worker,
        .evict_idle = true,
        .openai_errors = true,
        .idle_timeout_s = (unsigned)((c->cfg.keep_alive_ms + 999) / 1000),
        .quiet_paths = quiet_paths,
    };
    if (c->cfg.infer_tls.enable) {
        hc.tls_cert_file = c->cfg.infer_tls.cert_file;
        hc.tls_key_file = c->cfg.infer_tls.key_file;
        hc.tls_ca_file = c->cfg.infer_tls.ca_file;
        hc.tls_key_password = c->cfg.infer_tls.key_password;
    }
    w->httpd = httpd_new(w->r, &hc);
    if (!w->httpd)
        return errno ? -errno : -EIO;
    w->httpc = httpc_new(w->r);
    if (!w->httpc)
        return -ENOMEM;
    /* The metaserver: plain HTTP, the decode engines' callbacks (upstream: 12000 + i). */
    int mp = c->cfg.metaserver_base_port ? c->cfg.metaserver_base_port + idx : 0;
    struct httpd_config mc = {
        .name = "coordinator-metaserver",
        .host = c->cfg.host,
        .port = (uint16_t)(mp > 65535 ? 0 : mp),
        .max_body = 1 << 20,
        .openai_errors = true,
    };
    w->meta_httpd = httpd_new(w->r, &mc);
    if (!w->meta_httpd && mc.port) {
        /* The decode engines learn the port from each request's callback URL: any port
         * works, so a taken one (another coordinator on this host) is no reason to stop. */
        log_warn("metaserver_port_taken", LF_INT("worker", idx), LF_INT("port", mp),
                 LF_STR("error", strerror(errno)), LF_STR("using", "an ephemeral port"));
        mc.port = 0;
        w->meta_httpd = httpd_new(w->r, &mc);
    }
    if (!w->meta_httpd) {
        log_error("metaserver_listen_failed", LF_INT("worker", idx), LF_INT("port", mp),
                  LF_STR("error", strerror(errno)));
        return errno ? -errno : -EIO;
    }
    w->meta_port = httpd_port(w->meta_httpd);
    proxy_register_routes(w);
    return 0;
}

static void worker_destroy(struct coord_worker *w)
{
    httpd_free(w->meta_httpd);
    w->meta_httpd = NULL;
    httpd_free(w->httpd);
    w->httpd = NULL;
    httpc_free(w->httpc);
    w->httpc = NULL;
    inst_snapshot_unref(w->snap);
    w->snap = NULL;
    csettings_unref(w->set);
    w->set = NULL;
    reactor_free(w->r);
    w->r = NULL;
}

static void worker_beat(void *arg)
{
    struct coord_worker *w = arg;
    atomic_store(&w->beat_ms, util_mono_ms());
}

/* When the coordinator gives freed heap back (mem_release). Busy: only when the memory
 * held but unused exceeds both this and what is in use (a burst that ended while others
 * run; below that a trim is not worth its walk of the arenas — a stream holds ~15-22 KiB,
 * so 4 MiB is ~200 streams' worth). Idle (no request in flight): when the memory held
 * but unused grew by more than COORD_TRIM_IDLE_KIB since the last trim (connections
 * that close after the last request free their buffers later), so after every burst the
 * coordinator is back at its floor within 2 s and an idle one does not trim again. */
#define COORD_TRIM_BUSY_KIB (4 * 1024)
#define COORD_TRIM_IDLE_KIB 256

/* Give back what a burst left behind (docs/operations.md, "Memory"): every worker
 * thread allocates from its own glibc arena, and the connections of a burst free their
 * buffers in an order that leaves most pages of each arena free but below a live chunk,
 * where glibc never returns them by itself (2 workers: 66 MB resident, 0.3 MB in use
 * after 2 x 2,000 streams, more after every round). Checked once a second on the
 * management thread; malloc_trim locks one arena at a time, so a worker waits at most
 * one arena's walk (measured 2-6 ms for 40 MB after 2,000 streams). */
static void mem_release(struct coord *c)
{
    long rss = util_rss_kib();
    if (rss < 0 || c->rss_baseline_kib < 0)
        return;
    /* Idle = no request in flight at two beats in a row: the connections the last
     * requests leave close and free their buffers within the beat in between, and a
     * trim before that would keep the pages they free. */
    c->idle_beats = metrics_gauge_value(c->m.inflight) <= 0 ? c->idle_beats + 1 : 0;
    bool idle = c->idle_beats >= 2;
    if (c->idle_beats == 1)
        return;
    if (rss - c->rss_baseline_kib <= (idle ? COORD_TRIM_IDLE_KIB : COORD_TRIM_BUSY_KIB))
        return;
    int64_t t0 = util_mono_us();
    long in_use = util_heap_in_use_kib();
    long retained = rss - c->rss_baseline_kib - in_use;
    if (in_use < 0 || (idle && retained <= c->retained_after_trim_kib + COORD_TRIM_IDLE_KIB) ||
        (!idle && (retained <= COORD_TRIM_BUSY_KIB || retained <= in_use)))
        return;
    util_heap_trim();
    long after = util_rss_kib();
    if (after < 0)
        after = rss;
    c->retained_after_trim_kib = after - c->rss_baseline_kib - in_use;
    long kib = after < rss ? rss - after : 0;
    metrics_counter_inc(c->m.mem_trims);
    metrics_counter_add(c->m.mem_trimmed, (uint64_t)kib * 1024);
    log_debug("memory_trimmed", LF_INT("kib", kib), LF_INT("rss_kib", after),
              LF_INT("in_use_kib", in_use), LF_BOOL("idle", idle),
              LF_INT("us", util_mono_us() - t0));
}

/* Management thread: a beat to every worker (readiness: HEARTBEAT_STALE). */
static void on_beat_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct coord *c = arg;
    for (int i = 0; i < c->n_workers; i++)
        if (c->workers[i].started && !atomic_load(&c->workers[i].exited))
            reactor_post(c->workers[i].r, worker_beat, &c->workers[i]);
    mem_release(c);
}

static void *worker_thread(void *arg)
{
    struct coord_worker *w = arg;
    worker_beat(w);
    int rc = reactor_run(w->r);
    if (rc < 0)
        log_error("worker_reactor_failed", LF_INT("worker", w->idx),
                  LF_STR("error", strerror(-rc)));
    /* Tear down on the owning thread: httpd/httpc belong to this reactor. */
    httpd_free(w->meta_httpd);
    w->meta_httpd = NULL;
    httpd_free(w->httpd);
    w->httpd = NULL;
    httpc_free(w->httpc);
    w->httpc = NULL;
    atomic_store(&w->exited, true);
    if (!atomic_load(&w->c->stopping))
        log_error("worker_exited", LF_INT("worker", w->idx));
    return NULL;
}

/* ---- main --------------------------------------------------------------------------- */

static void make_boot_id(struct coord *c)
{
    unsigned char b[16];
    size_t got = 0;
    while (got < sizeof(b)) {
        ssize_t n = getrandom(b + got, sizeof(b) - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof(b)) {
        /* getrandom cannot fail for 16 bytes once the pool is ready; never seen, but a
         * boot id must still differ between two starts: pid and clocks. */
        uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)util_mono_ms() ^
                     ((uint64_t)c->start_wall_ms << 20);
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] = (unsigned char)(x >> ((i % 8) * 8)) ^ (unsigned char)i;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof(b); i++) {
        c->boot_id[2 * i] = hex[b[i] >> 4];
        c->boot_id[2 * i + 1] = hex[b[i] & 15];
    }
    c->boot_id[32] = '\0';
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct coord *c = arg;
    if (signo == SIGHUP) {
        log_info("config_reload_signal");
        coord_reload_now(c, "SIGHUP");
        return;
    }
    log_info("coordinator_stopping", LF_INT("signal", signo));
    atomic_store(&c->stopping, true);
    reactor_stop(r);
}

int coordinator_main(int argc, char **argv)
{
    struct cli_args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc)
        return prc == 1 ? 0 : 2;
    log_set_component("coordinator");
    if (cliopt_log_level("motor coordinator", a.log_level))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    long nofile = util_raise_nofile_limit();
    if (nofile >= 0 && nofile < 8192)
        log_warn("open_files_limit_low", LF_INT("limit", nofile),
                 LF_STR("why", "each client, node manager and engine connection holds one; raise "
                               "the hard limit (ulimit -Hn, LimitNOFILE=)"));

    struct coord *c = xcalloc(1, sizeof(*c));
    int exit_code = 1;
    reactor_timer_init(&c->beat_timer, on_beat_timer, c);
    csettings_pub_init(&c->settings);
    int lrc = load_config(c, &a);
    if (lrc != 0) {
        /* < 0: invalid (every error printed); 1: --check-config printed the config. */
        ccfg_release(&c->cfg);
        csettings_pub_release(&c->settings);
        free(c->cli.config);
        free(c->cli.host);
        free(c);
        return lrc < 0 ? 1 : 0;
    }
    c->start_wall_ms = util_wall_ms();
    make_boot_id(c);
    const char *why = NULL;
    if (otlp_cfg_from_env(&c->otlp, &why) < 0)
        log_warn("tracing_disabled", LF_STR("why", why));
    else if (c->otlp.url)
        log_info("tracing_enabled", LF_STR("collector", c->otlp.url),
                 LF_DBL("sample_ratio", c->otlp.ratio), LF_STR("service", c->otlp.service));
    /* Without master/standby this coordinator always serves; with it, once it leads. */
    atomic_init(&c->serve_until, c->cfg.ha_enable ? 0 : INT64_MAX);
    coord_publish_settings(c);
    inst_pub_init(&c->pub);
    struct brk_params bp = {c->cfg.breaker_threshold, c->cfg.breaker_open_ms,
                            c->cfg.breaker_max_open_ms};
    inst_table_init(&c->table, &bp);
    metrics_setup(c);
    prec_init(c);

    c->r = reactor_new();
    if (!c->r) {
        log_error("reactor_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    /* Signals are blocked here, before any thread exists, so workers inherit the mask
     * and only the management reactor receives them. */
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    if (reactor_watch_signals(c->r, sigs, ARRAY_LEN(sigs), on_signal, c) < 0) {
        log_error("signals_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    mgmt_publish(c); /* an empty snapshot before anyone routes */

    c->n_workers = c->cfg.workers;
    c->conn_per_worker = conn_slots(c, nofile);
    c->workers = xcalloc((size_t)c->n_workers, sizeof(*c->workers));
    uint16_t port = (uint16_t)c->cfg.infer_port;
    for (int i = 0; i < c->n_workers; i++) {
        int rc = worker_create(c, &c->workers[i], i, port);
        if (rc < 0) {
            log_error("listen_failed", LF_STR("server", "inference"), LF_STR("host", c->cfg.host),
                      LF_INT("port", port), LF_STR("error", strerror(-rc)));
            goto out;
        }
        /* Port 0: the first worker picks the ephemeral port, the others share it. */
        port = httpd_port(c->workers[i].httpd);
    }
    c->infer_port = port;
    if (mgmt_start(c) < 0)
        goto out;
    if (coord_ha_start(c) < 0)
        goto out;
    metrics_gauge_set(c->m.is_master, c->cfg.ha_enable ? 0 : 1);

    for (int i = 0; i < c->n_workers; i++) {
        struct coord_worker *w = &c->workers[i];
        if (pthread_create(&w->thread, NULL, worker_thread, w) != 0) {
            log_error("thread_failed", LF_INT("worker", i));
            goto out;
        }
        w->started = true;
    }
    log_info("coordinator_listening", LF_STR("host", c->cfg.host),
             LF_INT("infer_port", c->infer_port), LF_INT("mgmt_port", c->mgmt_port),
             LF_INT("workers", c->n_workers), LF_INT("pid", getpid()),
             LF_INT("metaserver_port", c->n_workers ? c->workers[0].meta_port : 0),
             LF_INT("connection_slots", (int64_t)c->conn_per_worker * c->n_workers),
             LF_BOOL("master_standby", c->cfg.ha_enable));
    /* Text, libraries and the startup allocations: what a trim can never give back. */
    c->rss_baseline_kib = util_rss_kib();
    reactor_timer_start(c->r, &c->beat_timer, 1000, 1000);
    coord_reload_init(c);
    engscrape_sync(c);

    int rc = reactor_run(c->r);
    exit_code = rc < 0 ? 1 : 0;
out:
    atomic_store(&c->stopping, true);
    if (c->r) {
        reactor_timer_stop(c->r, &c->beat_timer);
        engscrape_stop(c);
        coord_reload_free(c);
        /* A master hands the lock over before draining: its standby serves new requests
         * while this one finishes what it has. */
        coord_ha_stop(c, 1000);
    }
    /* Workers first: each stops taking new requests, lets its streams finish within the
     * grace period (timeout_config.graceful_shutdown_timeout), cuts the rest and stops
     * its reactor; the management side goes last. */
    for (int i = 0; c->workers && i < c->n_workers; i++) {
        struct coord_worker *w = &c->workers[i];
        if (w->started)
            reactor_post(w->r, proxy_worker_drain, w);
    }
    for (int i = 0; c->workers && i < c->n_workers; i++) {
        struct coord_worker *w = &c->workers[i];
        if (w->started)
            pthread_join(w->thread, NULL);
        worker_destroy(w);
    }
    free(c->workers);
    kvsub_stop(c);
    conductor_stop(c);
    kvidx_free(atomic_load(&c->kvidx));
    mgmt_stop(c);
    inst_table_release(&c->table);
    inst_pub_release(&c->pub);
    csettings_pub_release(&c->settings);
    reactor_free(c->r); /* runs its last tasks: samples still posted are dropped */
    prec_release(c);
    metrics_registry_free(c->m.reg);
    ccfg_release(&c->cfg);
    otlp_cfg_release(&c->otlp);
    free(c->cli.config);
    free(c->cli.host);
    free(c);
    log_info("coordinator_stopped", LF_INT("exit_code", exit_code));
    return exit_code;
}
