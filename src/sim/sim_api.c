/* sim_api — the simulator's routes that generate nothing: probes, /v1/models, /metrics,
 * the tokenizer (/tokenize, /detokenize), /v1/embeddings, the fault-tolerance API, the
 * prefix cache reset, SGLang's abort_request, the PD ticket, and /sim/... */
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "sim/sim_fmt.h"
#include "sim/sim_internal.h"
#include "sim/sim_req.h"
#include "sim/sim_resp.h"
#include "sim/sim_text.h"
#include "sim/sim_tok.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_EMBED_DIM 256
#define SIM_EMBED_MAX_DIM 4096
#define SIM_EMBED_MAX_INPUTS 2048

void sim_respond_error(struct httpd_req *req, int status, const char *param, const char *fmt, ...)
{
    struct sim_err err;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof(err.message)];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sim_err_set(&err, status, param, "%s", msg);
    const char *path = httpd_req_path(req);
    if (path && !strcmp(path, "/v1/messages"))
        httpd_respond_json(req, status, sim_fmt_anthropic_error(status, err.message));
    else
        httpd_respond_json(req, status, sim_resp_error_from(&err));
}

bool sim_refuse(struct sim *s, struct httpd_req *req)
{
    if (s->phase == SIM_LOADING) {
        sim_respond_error(req, 503, NULL, "model is still loading");
        return true;
    }
    if (s->phase == SIM_STOPPING) {
        sim_respond_error(req, 503, NULL, "engine is shutting down");
        return true;
    }
    switch (s->fault) {
    case SIM_FAULT_UNHEALTHY:
        sim_respond_error(req, 503, NULL, "engine is unhealthy (injected fault)");
        return true;
    case SIM_FAULT_FT_DEAD:
        sim_respond_error(req, 503, NULL, "engine is dead (injected fault)");
        return true;
    case SIM_FAULT_ERROR:
        sim_respond_error(req, 500, NULL, "internal engine error (injected fault)");
        return true;
    default:
        break;
    }
    if (s->ft_recovering) {
        sim_respond_error(req, 503, NULL, "engine is recovering (fault tolerance)");
        return true;
    }
    return false;
}

void sim_limits(struct sim *s, struct sim_req_limits *lim, const char **names, size_t cap)
{
    size_t n = MOTOR_MIN(s->args.n_served, cap);
    for (size_t i = 0; i < n; i++)
        names[i] = s->args.served_names[i];
    *lim = (struct sim_req_limits){
        .max_model_len = s->args.max_model_len, .models = names, .n_models = n};
}

/* ---- probes, models, metrics --------------------------------------------------------- */

static void on_health(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (s->phase == SIM_LOADING)
        sim_respond_error(req, 503, NULL, "model is still loading");
    else if (s->phase == SIM_STOPPING)
        sim_respond_error(req, 503, NULL, "engine is shutting down");
    else if (s->fault == SIM_FAULT_UNHEALTHY || s->fault == SIM_FAULT_FT_DEAD || s->ft_recovering)
        sim_respond_error(req, 503, NULL, "engine is %s",
                      s->fault == SIM_FAULT_FT_DEAD ? "dead" : "unhealthy");
    else
        httpd_respond(req, 200, "text/plain", "", 0);
}

static json_t *model_card(const struct sim *s, const char *name)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}", "id", name, "object", "model",
                     "created", (json_int_t)(s->start_wall_ms / 1000), "owned_by", "vllm", "root",
                     s->args.model, "parent", "max_model_len", s->args.max_model_len,
                     "permission");
}

static void on_models(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (s->phase == SIM_LOADING) {
        sim_respond_error(req, 503, NULL, "model is still loading");
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < s->args.n_served; i++)
        json_array_append_new(data, model_card(s, s->args.served_names[i]));
    httpd_respond_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void on_model(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (s->phase == SIM_LOADING) {
        sim_respond_error(req, 503, NULL, "model is still loading");
        return;
    }
    const char *id = httpd_req_param(req, "id");
    for (size_t i = 0; i < s->args.n_served; i++) {
        if (!strcmp(s->args.served_names[i], id)) {
            httpd_respond_json(req, 200, model_card(s, id));
            return;
        }
    }
    sim_respond_error(req, 404, "model", "The model `%s` does not exist.", id);
}

static void on_version(struct httpd_req *req, void *arg)
{
    httpd_respond_json(req, 200, json_pack("{s:s}", "version", "motor-engine-sim-" MOTOR_VERSION));
}

static void on_metrics(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    sim_update_gauges(s);
    size_t len = 0;
    char *text = metrics_render_alloc(s->metrics, (size_t)1 << 20, &len);
    if (!text) {
        sim_respond_error(req, 500, NULL, "metrics too large");
        return;
    }
    httpd_respond(req, 200, METRICS_CONTENT_TYPE, text, len);
    free(text);
}

void sim_metrics_init(struct sim *s)
{
    s->metrics = metrics_registry_new();
    char engine[16];
    snprintf(engine, sizeof(engine), "%d", s->args.dp_rank);
    const char *model = s->args.served_names[0];
    struct metrics_registry *m = s->metrics;
#define GAUGE(name, help)                                                                          \
    metrics_gauge_labels(metrics_gauge_family(m, name, help, "model_name", "engine"),              \
                         "model_name", model, "engine", engine)
#define COUNTER(name, help)                                                                        \
    metrics_counter_labels(metrics_counter_family(m, name, help, "model_name", "engine"),          \
                           "model_name", model, "engine", engine)
    s->m_running =
        GAUGE("vllm:num_requests_running", "Number of requests in model execution batches.");
    s->m_waiting =
        GAUGE("vllm:num_requests_waiting", "Number of requests waiting to be processed.");
    struct metrics_family *wr = metrics_gauge_family(m, "vllm:num_requests_waiting_by_reason",
                                                     "Number of waiting requests by reason.",
                                                     "model_name", "engine", "reason");
    s->m_wait_capacity =
        metrics_gauge_labels(wr, "model_name", model, "engine", engine, "reason", "capacity");
    s->m_wait_kv =
        metrics_gauge_labels(wr, "model_name", model, "engine", engine, "reason", "remote_kvs");
    s->m_kv_usage = GAUGE("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
    s->m_prompt_tokens = COUNTER("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
    s->m_gen_tokens =
        COUNTER("vllm:generation_tokens_total", "Number of generation tokens processed.");
    struct metrics_family *ok = metrics_counter_family(m, "vllm:request_success_total",
                                                       "Count of successfully processed requests.",
                                                       "model_name", "engine", "finished_reason");
    s->m_success_length = metrics_counter_labels(ok, "model_name", model, "engine", engine,
                                                 "finished_reason", "length");
    s->m_success_stop = metrics_counter_labels(ok, "model_name", model, "engine", engine,
                                               "finished_reason", "stop");
    s->m_success_abort = metrics_counter_labels(ok, "model_name", model, "engine", engine,
                                                "finished_reason", "abort");
    s->m_pc_queries = COUNTER("vllm:prefix_cache_queries_total",
                              "Prefix cache queries, in terms of number of queried tokens.");
    s->m_pc_hits = COUNTER("vllm:prefix_cache_hits_total",
                           "Prefix cache hits, in terms of number of cached tokens.");
    s->m_gpu_pc_queries =
        COUNTER("vllm:gpu_prefix_cache_queries_total",
                "GPU prefix cache queries, in terms of number of queried tokens (deprecated name).");
    s->m_gpu_pc_hits =
        COUNTER("vllm:gpu_prefix_cache_hits_total",
                "GPU prefix cache hits, in terms of number of cached tokens (deprecated name).");
    char bs[16], nb[16];
    snprintf(bs, sizeof(bs), "%d", s->args.block_size);
    snprintf(nb, sizeof(nb), "%d", s->args.num_gpu_blocks);
    s->m_cache_info = metrics_gauge_labels(
        metrics_gauge_family(m, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                             "block_size", "num_gpu_blocks", "enable_prefix_caching"),
        "block_size", bs, "num_gpu_blocks", nb, "enable_prefix_caching",
        s->args.prefix_caching ? "True" : "False");
    metrics_gauge_set(s->m_cache_info, 1);
    s->m_failed = COUNTER("sim:requests_aborted_total",
                          "Requests ended before completion (client gone, stream cut).");
    static const double lat[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
    s->m_ttft = metrics_histogram_labels(
        metrics_histogram_family(m, "vllm:time_to_first_token_seconds",
                                 "Histogram of time to first token in seconds.", lat,
                                 ARRAY_LEN(lat), "model_name", "engine"),
        "model_name", model, "engine", engine);
    s->m_e2e = metrics_histogram_labels(
        metrics_histogram_family(m, "vllm:e2e_request_latency_seconds",
                                 "Histogram of end to end request latency in seconds.", lat,
                                 ARRAY_LEN(lat), "model_name", "engine"),
        "model_name", model, "engine", engine);
#undef GAUGE
#undef COUNTER
    sim_update_gauges(s);
}

/* ---- PD: the prefill side of the ticket --------------------------------------------- */

static void on_kv_take(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    int64_t block;
    if (util_parse_i64(httpd_req_param(req, "id"), 0, INT64_MAX, &block)) {
        httpd_respond_error(req, 400, "KV ticket id must be a non-negative integer");
        return;
    }
    struct sim_kv_ticket t;
    if (sim_kv_take(s->kv, block, reactor_now(s->r), &t)) {
        log_info("sim_kv_ticket_unknown", LF_INT("first_block", block),
                 LF_STR("peer", httpd_req_peer(req)));
        httpd_respond_error(req, 404, "unknown KV ticket");
        return;
    }
    char hash[24];
    snprintf(hash, sizeof(hash), "%016" PRIx64, t.prompt_hash);
    json_t *ids = json_array();
    for (int i = 0; i < t.n_blocks; i++)
        json_array_append_new(ids, json_integer(t.first_block + i));
    log_debug("sim_kv_ticket_taken", LF_INT("first_block", block),
              LF_STR("peer", httpd_req_peer(req)));
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:I, s:o, s:s, s:i}", "engine_id", s->engine_id,
                                 "first_block", (json_int_t)t.first_block, "block_ids", ids,
                                 "prompt_hash", hash, "prompt_tokens", t.prompt_tokens));
}

/* ---- fault tolerance ------------------------------------------------------------------ */

static void ft_recovered(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    s->ft_recovering = false;
    if (s->fault == SIM_FAULT_UNHEALTHY) {
        s->fault = SIM_FAULT_NONE;
        free(s->fault_info);
        s->fault_info = NULL;
    }
    log_info("sim_ft_recovered", LF_STR("request_id", s->ft_last_request_id),
             LF_STR("instruction", s->ft_instruction), LF_INT("dp_size", s->args.dp_size));
}

static void on_ft_status(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    json_t *e = json_pack("{s:i}", "id", s->args.dp_rank);
    const char *status = "healthy";
    if (s->fault == SIM_FAULT_FT_DEAD) {
        status = "dead";
        json_object_set_new(
            e, "fault_info",
            json_string(s->fault_info ? s->fault_info : "EngineDeadError (injected)"));
    } else if (s->ft_recovering) {
        status = "unhealthy";
        json_object_set_new(e, "ft_state", json_string("recovering"));
    } else if (s->fault == SIM_FAULT_UNHEALTHY) {
        status = "unhealthy";
        json_object_set_new(
            e, "fault_info",
            json_string(s->fault_info ? s->fault_info : "EngineUnhealthyError (injected)"));
    }
    json_object_set_new(e, "status", json_string(status));
    if (s->ft_last_request_id)
        json_object_set_new(e, "last_ft_request_id", json_string(s->ft_last_request_id));
    httpd_respond_json(req, 200, json_pack("{s:[o]}", "engines", e));
}

/* Body (the node manager forwards {instruction, params, request_id}; "action" and a
 * top-level removed_dp_ranks are accepted too). */
static void on_ft_apply(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    if (!json_is_object(body)) {
        json_decref(body);
        sim_respond_error(req, 400, NULL, "body must be a JSON object%s%s", body ? "" : ": ",
                      body ? "" : jmsg);
        return;
    }
    const json_t *rid = json_object_get(body, "request_id");
    const json_t *ins = json_object_get(body, "instruction");
    if (!ins)
        ins = json_object_get(body, "action");
    const json_t *params = json_object_get(body, "params");
    const json_t *removed =
        json_object_get(json_is_object(params) ? params : body, "removed_dp_ranks");
    if (!removed)
        removed = json_object_get(body, "removed_dp_ranks");
    const char *instruction = json_string_value(ins);
    if (!json_is_string(rid) || json_string_length(rid) == 0 ||
        json_string_length(rid) > SIM_REQ_MAX_ID_LEN) {
        sim_respond_error(req, 400, "request_id", "'request_id' must be a non-empty string");
        goto out;
    }
    if (!instruction || (strcmp(instruction, "scale_down") && strcmp(instruction, "retry"))) {
        sim_respond_error(req, 400, "instruction", "'instruction' must be 'scale_down' or 'retry'");
        goto out;
    }
    if (params && !json_is_null(params) && !json_is_object(params)) {
        sim_respond_error(req, 400, "params", "'params' must be an object");
        goto out;
    }
    int n_removed = 0;
    if (!strcmp(instruction, "scale_down")) {
        if (!json_is_array(removed) || json_array_size(removed) == 0) {
            sim_respond_error(req, 400, "removed_dp_ranks",
                          "scale_down needs a non-empty 'removed_dp_ranks' list");
            goto out;
        }
        size_t i;
        const json_t *v;
        json_array_foreach(removed, i, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65535) {
                sim_respond_error(req, 400, "removed_dp_ranks",
                              "'removed_dp_ranks' must hold DP ranks (integers 0..65535)");
                goto out;
            }
            if (json_integer_value(v) == s->args.dp_rank) {
                sim_respond_error(req, 400, "removed_dp_ranks",
                              "this engine (DP rank %d) is in removed_dp_ranks: apply goes to "
                              "survivors only",
                              s->args.dp_rank);
                goto out;
            }
        }
        n_removed = (int)json_array_size(removed);
    }
    if (s->fault == SIM_FAULT_FT_DEAD) {
        sim_respond_error(req, 409, NULL, "engine is dead: it cannot apply %s", instruction);
        goto out;
    }
    free(s->ft_last_request_id);
    free(s->ft_instruction);
    s->ft_last_request_id = xstrdup(json_string_value(rid));
    s->ft_instruction = xstrdup(instruction);
    if (n_removed > 0)
        s->args.dp_size = MOTOR_MAX(1, s->args.dp_size - n_removed);
    s->ft_recovering = true;
    reactor_timer_start(s->r, &s->ft_timer, s->args.ft_recover_ms, 0);
    sim_dp_dissolve(s, "fault-tolerance apply changed the DP world");
    char *params_text = params ? json_dumps(params, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    log_info("sim_ft_apply", LF_STR("request_id", s->ft_last_request_id),
             LF_STR("instruction", instruction),
             LF_RAW("params", params_text ? params_text : "null"),
             LF_INT("recover_ms", s->args.ft_recover_ms));
    free(params_text);
    httpd_respond_json(req, 202,
                       json_pack("{s:b, s:s, s:s, s:i}", "accepted", 1, "request_id",
                                 s->ft_last_request_id, "instruction", instruction, "dp_rank",
                                 s->args.dp_rank));
out:
    json_decref(body);
}

/* ---- simulator-only routes ------------------------------------------------------------ */

static void fault_req_closed(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    /* The answer is out: let the process-ending fault act now. */
    if (s->pending_end)
        reactor_timer_start(s->r, &s->end_timer, 0, 0);
}

static int opt_count(const json_t *body, const char *k1, const char *k2, long *out)
{
    const json_t *v = json_object_get(body, k1);
    if (!v && k2)
        v = json_object_get(body, k2);
    *out = -1;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return -EINVAL;
    *out = (long)json_integer_value(v);
    return 0;
}

static void on_fault(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    const char *mode = json_string_value(json_object_get(body, "mode"));
    const json_t *ign = json_object_get(body, "ignore_sigterm");
    long tokens, ms;
    if (!mode || (ign && !json_is_boolean(ign)) ||
        opt_count(body, "after_tokens", "tokens", &tokens) || opt_count(body, "ms", NULL, &ms)) {
        sim_respond_error(req, 400, "mode",
                      "body must be {\"mode\": \"crash|exit0|hang|unhealthy|ft_dead|error|"
                      "repeat|garbled|rare_chars|stall|cut|crash_after_tokens|metaserver_fail|"
                      "metaserver_delay|recover\"} (optional \"ignore_sigterm\": bool for hang, "
                      "\"after_tokens\"/\"tokens\": N for stall, cut and crash_after_tokens, "
                      "\"ms\": N for metaserver_delay)");
        json_decref(body);
        return;
    }
    const char *previous = sim_fault_name(s->fault);
    if (s->quality == SIM_MODE_REPEAT)
        previous = "repeat";
    else if (s->quality == SIM_MODE_GARBLED)
        previous = "garbled";
    else if (s->quality == SIM_MODE_RARE)
        previous = "rare_chars";
    else if (s->sf == SIM_SF_STALL)
        previous = "stall";
    else if (s->sf == SIM_SF_CUT)
        previous = "cut";
    char *mode_copy = xstrdup(mode);
    int rc = sim_fault_apply2(s, mode_copy, json_is_true(ign), tokens, ms);
    json_decref(body);
    if (rc) {
        sim_respond_error(req, 400, "mode", "%s fault mode '%s'",
                      rc == -ERANGE ? "missing \"tokens\" for" : "unknown", mode_copy);
        free(mode_copy);
        return;
    }
    if (s->pending_end)
        httpd_req_on_close(req, fault_req_closed, s);
    httpd_respond_json(req, 200, json_pack("{s:s, s:s}", "mode", mode_copy, "previous", previous));
    free(mode_copy);
}

static const char *phase_name(enum sim_phase p)
{
    return p == SIM_LOADING ? "loading" : p == SIM_READY ? "ready" : "stopping";
}

static void on_sim_status(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    json_t *workers = json_array();
    for (int i = 0; i < s->n_workers; i++)
        if (s->workers[i].pidfd >= 0)
            json_array_append_new(workers, json_integer(s->workers[i].pid));
    json_t *st = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:b}",
                                 "engine_id", s->engine_id, "phase", phase_name(s->phase), "fault",
                                 sim_fault_name(s->fault), "dp_rank", s->args.dp_rank, "dp_size",
                                 s->args.dp_size, "running", s->running.count, "waiting",
                                 s->waiting.count, "fetching", s->fetching.count, "kv_tickets",
                                 (int)sim_kv_count(s->kv), "workers", workers, "ft_recovering",
                                 s->ft_recovering);
    json_object_set_new(st, "tokens_total", json_integer((json_int_t)s->tokens_total));
    if (s->cache) {
        struct sim_cache_stats cs;
        sim_cache_get_stats(s->cache, &cs);
        json_object_set_new(st, "prefix_cache",
                            json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}", "capacity",
                                      (json_int_t)cs.capacity, "cached", (json_int_t)cs.cached,
                                      "pinned", (json_int_t)cs.pinned, "queries",
                                      (json_int_t)cs.queries, "hits", (json_int_t)cs.hits,
                                      "stored", (json_int_t)cs.stored, "evicted",
                                      (json_int_t)cs.evicted, "block_size", s->args.block_size));
    }
    if (s->kvev) {
        struct sim_kvev_stats ks;
        sim_kvev_get_stats(s->kvev, &ks);
        json_object_set_new(st, "kv_events",
                            json_pack("{s:I, s:I, s:I, s:I, s:i, s:i}", "next_seq",
                                      (json_int_t)ks.next_seq, "batches", (json_int_t)ks.batches,
                                      "events", (json_int_t)ks.events, "replays",
                                      (json_int_t)ks.replays, "port", (int)ks.port, "replay_port",
                                      (int)ks.replay_port));
    }
    httpd_respond_json(req, 200, st);
}


/* ---- tokenizer -------------------------------------------------------------------- */

static json_t *token_strs(const struct sim_ids *ids)
{
    json_t *a = json_array();
    for (size_t i = 0; i < ids->n; i++) {
        char t[SIM_TOK_TEXT_MAX];
        sim_tok_text(ids->v[i], true, t, sizeof(t));
        json_array_append_new(a, json_string(t));
    }
    return a;
}

static void on_tokenize(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (sim_refuse(s, req))
        return;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    if (!json_is_object(body)) {
        json_decref(body);
        sim_respond_error(req, 400, NULL, "body must be a JSON object%s%s", body ? "" : ": ",
                      body ? "" : jmsg);
        return;
    }
    const char *names[64];
    struct sim_req_limits lim;
    sim_limits(s, &lim, names, ARRAY_LEN(names));
    struct sim_err err;
    struct sim_ids ids;
    sim_ids_init(&ids, (size_t)1 << 21);
    const json_t *prompt = json_object_get(body, "prompt");
    const json_t *msgs = json_object_get(body, "messages");
    const json_t *ast = json_object_get(body, "add_special_tokens");
    const json_t *rts = json_object_get(body, "return_token_strs");
    const json_t *agp = json_object_get(body, "add_generation_prompt");
    const json_t *cfm = json_object_get(body, "continue_final_message");
    int rc = 0;
    if (!sim_req_model(body, &lim, &err))
        rc = -EINVAL;
    else if ((ast && !json_is_boolean(ast) && !json_is_null(ast)) ||
             (rts && !json_is_boolean(rts) && !json_is_null(rts)) ||
             (agp && !json_is_boolean(agp) && !json_is_null(agp)) ||
             (cfm && !json_is_boolean(cfm) && !json_is_null(cfm)))
        rc = sim_err_set(&err, 400, NULL,
                         "add_special_tokens, return_token_strs, add_generation_prompt and "
                         "continue_final_message must be booleans");
    else if (json_is_true(agp) && json_is_true(cfm))
        rc = sim_err_set(&err, 400, "continue_final_message",
                         "Cannot set both `continue_final_message` and `add_generation_prompt` "
                         "to True.");
    else if (msgs)
        rc = sim_req_render_chat(msgs, NULL, json_is_true(cfm), &ids, &err);
    else if (json_is_string(prompt))
        sim_tok_encode(json_string_value(prompt), json_string_length(prompt), &ids);
    else
        rc = sim_err_set(&err, 400, "prompt",
                         "'prompt' (a string) or 'messages' (a list) is required");
    if (rc) {
        sim_respond_error(req, err.status, err.param, "%s", err.message);
    } else {
        json_t *toks = json_array();
        for (size_t i = 0; i < ids.n; i++)
            json_array_append_new(toks, json_integer(ids.v[i]));
        json_t *out = json_pack("{s:i, s:i, s:o}", "count", (int)ids.n, "max_model_len",
                                s->args.max_model_len, "tokens", toks);
        json_object_set_new(out, "token_strs", json_is_true(rts) ? token_strs(&ids) : json_null());
        httpd_respond_json(req, 200, out);
    }
    sim_ids_release(&ids);
    json_decref(body);
}

static void on_detokenize(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (sim_refuse(s, req))
        return;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    const char *names[64];
    struct sim_req_limits lim;
    sim_limits(s, &lim, names, ARRAY_LEN(names));
    struct sim_err err;
    const json_t *toks = json_object_get(body, "tokens");
    if (!json_is_object(body)) {
        sim_respond_error(req, 400, NULL, "body must be a JSON object%s%s", body ? "" : ": ",
                      body ? "" : jmsg);
    } else if (!sim_req_model(body, &lim, &err)) {
        sim_respond_error(req, err.status, err.param, "%s", err.message);
    } else if (!json_is_array(toks)) {
        sim_respond_error(req, 400, "tokens", "'tokens' must be a list of token ids");
    } else {
        size_t n = json_array_size(toks);
        int32_t *ids = xcalloc(n ? n : 1, sizeof(*ids));
        size_t i;
        const json_t *t;
        bool ok = true;
        json_array_foreach(toks, i, t)
        {
            if (!json_is_integer(t) || !sim_tok_valid(json_integer_value(t))) {
                sim_respond_error(req, 400, "tokens",
                              "tokens[%zu] is not a token id of this model (vocabulary size %d)",
                              i, (int)SIM_TOK_VOCAB_SIZE);
                ok = false;
                break;
            }
            ids[i] = (int32_t)json_integer_value(t);
        }
        if (ok) {
            char *text = sim_tok_decode(ids, n, true);
            httpd_respond_json(req, 200, json_pack("{s:s}", "prompt", text));
            free(text);
        }
        free(ids);
    }
    json_decref(body);
}

/* ---- embeddings ------------------------------------------------------------------- */

static uint64_t emix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A deterministic unit vector: the normalized mean of per-token pseudo-random vectors,
 * so texts that share tokens point in similar directions. */
static void embed(const struct sim_ids *ids, int dim, float *out)
{
    for (int d = 0; d < dim; d++)
        out[d] = 0;
    for (size_t i = 0; i < ids->n; i++) {
        uint64_t h = emix((uint64_t)(uint32_t)ids->v[i] * 0x100000001b3ULL);
        for (int d = 0; d < dim; d++) {
            h = emix(h + (uint64_t)d);
            out[d] += (float)((double)(h >> 11) / 9007199254740992.0 - 0.5);
        }
    }
    double norm = 0;
    for (int d = 0; d < dim; d++)
        norm += (double)out[d] * out[d];
    norm = sqrt(norm);
    for (int d = 0; d < dim; d++)
        out[d] = norm > 0 ? (float)(out[d] / norm) : (d == 0 ? 1.0f : 0.0f);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64_floats(const float *v, int dim)
{
    size_t n = (size_t)dim * 4;
    const uint8_t *p = (const uint8_t *)v; /* little-endian float32, as numpy's tobytes */
    char *out = xmalloc((n + 2) / 3 * 4 + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        out[o++] = b64[x >> 18 & 63];
        out[o++] = b64[x >> 12 & 63];
        out[o++] = i + 1 < n ? b64[x >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[x & 63] : '=';
    }
    out[o] = '\0';
    return out;
}

static int embed_input(const json_t *in, struct sim_ids *ids, size_t idx, struct sim_err *err)
{
    if (json_is_string(in)) {
        sim_tok_encode(json_string_value(in), json_string_length(in), ids);
        if (ids->n == 0)
            return sim_err_set(err, 400, "input", "input[%zu] must not be empty", idx);
        return 0;
    }
    if (json_is_array(in) && json_array_size(in) > 0) {
        size_t i;
        const json_t *t;
        json_array_foreach(in, i, t)
        {
            if (!json_is_integer(t) || !sim_tok_valid(json_integer_value(t)))
                return sim_err_set(err, 400, "input",
                                   "input[%zu][%zu] is not a token id of this model", idx, i);
            sim_ids_push(ids, (int32_t)json_integer_value(t));
        }
        return 0;
    }
    return sim_err_set(err, 400, "input",
                       "'input' must be a string, a list of strings, a list of token ids or a "
                       "list of token-id lists");
}

static void on_embeddings(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (sim_refuse(s, req))
        return;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    const char *names[64];
    struct sim_req_limits lim;
    sim_limits(s, &lim, names, ARRAY_LEN(names));
    struct sim_err err;
    const char *model = NULL;
    const json_t *input = json_object_get(body, "input");
    const json_t *fmt = json_object_get(body, "encoding_format");
    const json_t *dims = json_object_get(body, "dimensions");
    int dim = SIM_EMBED_DIM;
    int rc = 0;
    if (!json_is_object(body)) {
        rc = sim_err_set(&err, 400, NULL, "body must be a JSON object%s%s", body ? "" : ": ",
                         body ? "" : jmsg);
    } else if (!(model = sim_req_model(body, &lim, &err))) {
        rc = -EINVAL;
    } else if (fmt && !json_is_null(fmt) &&
               (!json_is_string(fmt) || (strcmp(json_string_value(fmt), "float") &&
                                         strcmp(json_string_value(fmt), "base64")))) {
        rc = sim_err_set(&err, 400, "encoding_format",
                         "'encoding_format' must be 'float' or 'base64'");
    } else if (dims && !json_is_null(dims) &&
               (!json_is_integer(dims) || json_integer_value(dims) < 1 ||
                json_integer_value(dims) > SIM_EMBED_MAX_DIM)) {
        rc = sim_err_set(&err, 400, "dimensions", "'dimensions' must be between 1 and %d",
                         SIM_EMBED_MAX_DIM);
    } else if (!input || json_is_null(input)) {
        rc = sim_err_set(&err, 400, "input", "'input' is required");
    }
    if (rc) {
        sim_respond_error(req, err.status, err.param, "%s", err.message);
        json_decref(body);
        return;
    }
    if (json_is_integer(dims))
        dim = (int)json_integer_value(dims);
    bool b64out = json_is_string(fmt) && !strcmp(json_string_value(fmt), "base64");
    /* one input (a string or one token list) or a batch */
    bool batch = json_is_array(input) && json_array_size(input) > 0 &&
                 !json_is_integer(json_array_get(input, 0));
    size_t n_in = batch ? json_array_size(input) : 1;
    if (n_in > SIM_EMBED_MAX_INPUTS) {
        sim_respond_error(req, 400, "input", "at most %d inputs", SIM_EMBED_MAX_INPUTS);
        json_decref(body);
        return;
    }
    json_t *data = json_array();
    float *vec = xcalloc((size_t)dim, sizeof(*vec));
    int total = 0;
    for (size_t i = 0; i < n_in && !rc; i++) {
        struct sim_ids ids;
        sim_ids_init(&ids, (size_t)1 << 21);
        rc = embed_input(batch ? json_array_get(input, i) : input, &ids, i, &err);
        if (!rc && (int)ids.n > s->args.max_model_len)
            rc = sim_err_set(&err, 400, "input",
                             "This model's maximum context length is %d tokens. However, "
                             "input[%zu] has %zu tokens.",
                             s->args.max_model_len, i, ids.n);
        if (!rc) {
            total += (int)ids.n;
            embed(&ids, dim, vec);
            json_t *e;
            if (b64out) {
                char *t = base64_floats(vec, dim);
                e = json_string(t);
                free(t);
            } else {
                e = json_array();
                for (int d = 0; d < dim; d++)
                    json_array_append_new(e, json_real(vec[d]));
            }
            json_array_append_new(data, json_pack("{s:i, s:s, s:o}", "index", (int)i, "object",
                                                  "embedding", "embedding", e));
        }
        sim_ids_release(&ids);
    }
    free(vec);
    if (rc) {
        json_decref(data);
        sim_respond_error(req, err.status, err.param, "%s", err.message);
    } else {
        metrics_counter_add(s->m_prompt_tokens, (uint64_t)total);
        char id[48];
        snprintf(id, sizeof(id), "embd-%016" PRIx64 "%08" PRIx64, s->id_base, ++s->id_seq);
        httpd_respond_json(req, 200,
                           json_pack("{s:s, s:s, s:I, s:s, s:o, s:{s:i, s:i}}", "id", id,
                                     "object", "list", "created", (json_int_t)(util_wall_ms() / 1000),
                                     "model", model, "data", data, "usage", "prompt_tokens", total,
                                     "total_tokens", total));
    }
    json_decref(body);
}

/* ---- prefix cache reset, SGLang abort -------------------------------------------- */

static void on_reset_prefix_cache(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (!s->cache) {
        httpd_respond(req, 200, "text/plain", "", 0);
        return;
    }
    if (sim_cache_reset(s->cache)) {
        sim_respond_error(req, 409, NULL,
                      "cannot reset the prefix cache while requests hold KV blocks");
        return;
    }
    log_info("sim_prefix_cache_reset");
    httpd_respond(req, 200, "text/plain", "", 0);
}

/* SGLang: POST /abort_request {"rid": "...", "abort_all": false}. */
static void on_abort_request(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    const json_t *rid = json_object_get(body, "rid");
    const json_t *all = json_object_get(body, "abort_all");
    if (!json_is_object(body) || (rid && !json_is_string(rid) && !json_is_null(rid)) ||
        (all && !json_is_boolean(all)) || (!json_is_string(rid) && !json_is_true(all))) {
        sim_respond_error(req, 400, "rid",
                      "body must be {\"rid\": \"<request id>\"} or {\"abort_all\": true}");
        json_decref(body);
        return;
    }
    int n = sim_engine_abort(s, json_string_value(rid), json_is_true(all));
    log_info("sim_abort_request", LF_STR("rid", json_string_value(rid)),
             LF_BOOL("abort_all", json_is_true(all)), LF_INT("aborted", n));
    httpd_respond_json(req, 200, json_pack("{s:i}", "aborted", n));
    json_decref(body);
}

void sim_api_routes(struct sim *s)
{
    struct httpd *h = s->httpd;
    httpd_route(h, "GET", "/health", on_health, s, 0);
    httpd_route(h, "GET", "/v1/models", on_models, s, 0);
    httpd_route(h, "GET", "/v1/models/{id}", on_model, s, 0);
    httpd_route(h, "GET", "/version", on_version, s, 0);
    httpd_route(h, "GET", "/metrics", on_metrics, s, 0);
    httpd_route(h, "POST", "/tokenize", on_tokenize, s, 0);
    httpd_route(h, "POST", "/detokenize", on_detokenize, s, 0);
    httpd_route(h, "POST", "/v1/embeddings", on_embeddings, s, 0);
    httpd_route(h, "POST", "/reset_prefix_cache", on_reset_prefix_cache, s, 0);
    httpd_route(h, "POST", "/abort_request", on_abort_request, s, 0);
    if (s->args.ft) {
        httpd_route(h, "GET", "/v1/fault_tolerance/status", on_ft_status, s, 0);
        httpd_route(h, "POST", "/v1/fault_tolerance/apply", on_ft_apply, s, 0);
    }
    httpd_route(h, "GET", "/sim/kv/{id}", on_kv_take, s, 0);
    httpd_route(h, "POST", "/sim/fault", on_fault, s, 0);
    httpd_route(h, "GET", "/sim/status", on_sim_status, s, 0);
    reactor_timer_init(&s->ft_timer, ft_recovered, s);
}
