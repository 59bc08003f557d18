/* sim_engine — the simulator's HTTP surface: vLLM's OpenAI routes, the PD KV hand-off,
 * the fault-tolerance API, /metrics, and the simulator-only /sim/... routes.
 *
 * A generation is a small state machine per request (struct sim_gen):
 *
 *   FETCHING (decode leg: taking the KV ticket from the prefill engine over HTTP)
 *      -> WAITING (no free slot: more than --max-num-seqs running)
 *      -> RUNNING (reactor timer paces tokens: --ttft-ms, then --tokens-per-second)
 *      -> DONE    (answered; freed when httpd reports the request closed)
 *
 * Nothing blocks: the request stays suspended in httpd while the timer runs, and the
 * struct lives until httpd's on_close, the only place it is freed. */
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "sim/sim_internal.h"
#include "sim/sim_req.h"
#include "sim/sim_resp.h"
#include "sim/sim_text.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_SSE_CHUNK_MAX ((size_t)4 << 20)  /* one tick's worth of SSE events */
#define SIM_STEPS_PER_TICK 64                /* token steps generated per loop iteration */
#define SIM_STREAM_BACKLOG ((size_t)1 << 20) /* unsent stream bytes before we pause */
#define SIM_BACKLOG_RETRY_MS 10
#define SIM_KV_FETCH_TIMEOUT_MS 5000
#define SIM_KV_FETCH_MAX_RESPONSE ((size_t)64 << 10)

enum gen_state { GEN_FETCHING, GEN_WAITING, GEN_RUNNING, GEN_DONE };

struct gen_choice {
    uint64_t seed;
    int planned;  /* tokens this choice produces */
    bool stopped; /* finish_reason "stop" (else "length") */
};

struct sim_gen {
    struct sim *s;
    struct httpd_req *req;
    struct sim_req r;
    enum gen_state state;
    struct list_head link;
    struct sim_gen_list *list; /* the list it is on, NULL when none */
    char id[SIM_REQ_MAX_ID_LEN + 16];
    struct sim_resp_meta meta;
    struct gen_choice *choices;
    int n_choices;
    int steps;         /* max planned over the choices */
    int emitted;       /* steps done */
    int prompt_tokens; /* total over the prompts */
    int64_t arrive_ms, run_ms;
    struct reactor_timer timer;
    struct httpc_req *fetch;
};

/* ---- helpers ----------------------------------------------------------------------- */

static void respond_error(struct httpd_req *req, int status, const char *param, const char *fmt,
                          ...) __attribute__((format(printf, 4, 5)));

static void respond_error(struct httpd_req *req, int status, const char *param, const char *fmt,
                          ...)
{
    struct sim_err err;
    va_list ap;
    va_start(ap, fmt);
    char msg[sizeof(err.message)];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sim_err_set(&err, status, param, "%s", msg);
    httpd_respond_json(req, status, sim_resp_error_from(&err));
}

static void gen_list_push(struct sim_gen_list *l, struct sim_gen *g)
{
    list_insert_tail(&l->head, &g->link);
    l->count++;
    g->list = l;
}

static void gen_list_remove(struct sim_gen *g)
{
    struct sim_gen_list *l = g->list;
    if (!l)
        return;
    list_remove(&g->link);
    g->list = NULL;
    l->count--;
}

/* The oldest generation of l, NULL when empty. */
static struct sim_gen *gen_list_first(const struct sim_gen_list *l)
{
    struct list_head *n = list_first(&l->head);
    return n ? list_entry(n, struct sim_gen, link) : NULL;
}

static void update_gauges(struct sim *s)
{
    metrics_gauge_set(s->m_running, s->running.count);
    metrics_gauge_set(s->m_waiting, s->waiting.count + s->fetching.count);
    metrics_gauge_set(s->m_wait_capacity, s->waiting.count);
    metrics_gauge_set(s->m_wait_kv, s->fetching.count);
    metrics_gauge_set(s->m_kv_usage, (double)s->running.count / s->args.max_num_seqs);
}

static bool wildcard_host(const char *h)
{
    return !h || !*h || !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "[::]");
}

/* ---- generation ----------------------------------------------------------------------- */

static void gen_tick(struct reactor *r, void *arg);
static void schedule(struct sim *s);

static double token_interval_ms(const struct sim *s)
{
    return s->args.tokens_per_second > 0 ? 1000.0 / s->args.tokens_per_second : 0.0;
}

static void gen_start(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_list_remove(g);
    gen_list_push(&s->running, g);
    g->state = GEN_RUNNING;
    g->run_ms = reactor_now(s->r);
    metrics_counter_add(s->m_prompt_tokens, (uint64_t)g->prompt_tokens);
    update_gauges(s);
    if (g->r.stream) {
        httpd_add_header(g->req, "Cache-Control", "no-cache");
        httpd_stream_begin(g->req, 200, "text/event-stream");
        if (g->r.api == SIM_API_CHAT) {
            /* vLLM opens a chat stream with the role before the first token. */
            struct strbuf sb;
            strbuf_init(&sb, SIM_SSE_CHUNK_MAX);
            for (int c = 0; c < g->n_choices; c++) {
                json_t *chunk = sim_resp_chunk(&g->meta, c, "", true, NULL, NULL);
                sim_sse_event(&sb, chunk);
                json_decref(chunk);
            }
            httpd_stream_write(g->req, sb.buf, sb.len);
            strbuf_release(&sb);
        }
    }
    reactor_timer_start(s->r, &g->timer, s->args.ttft_ms, 0);
}

/* Fill free slots from the waiting queue, oldest first. */
static void schedule(struct sim *s)
{
    /* While stopping, httpd_free is closing every request: start nothing new. */
    struct sim_gen *g;
    while (s->phase != SIM_STOPPING && (g = gen_list_first(&s->waiting)) &&
           s->running.count < s->args.max_num_seqs)
        gen_start(g);
    update_gauges(s);
}

static void gen_enqueue(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_list_remove(g);
    g->state = GEN_WAITING;
    gen_list_push(&s->waiting, g);
    schedule(s);
}

static json_t *usage_now(const struct sim_gen *g, int steps_done)
{
    int completion = 0;
    for (int c = 0; c < g->n_choices; c++)
        completion += MOTOR_MIN(g->choices[c].planned, steps_done);
    return sim_resp_usage(g->prompt_tokens, completion);
}

static const char *finish_of(const struct gen_choice *c)
{
    return c->stopped ? "stop" : "length";
}

/* The prefill leg's ticket: vLLM's kv_transfer_params for the decode side. */
static json_t *prefill_ticket(struct sim_gen *g)
{
    struct sim *s = g->s;
    struct sim_kv_ticket t;
    int evicted =
        sim_kv_put(s->kv, g->r.prompts[0].hash, g->r.prompts[0].tokens, reactor_now(s->r), &t);
    if (evicted)
        log_warn("sim_kv_ticket_evicted", LF_INT("evicted", evicted),
                 LF_STR("why", "ticket table full"));
    json_t *ids = json_array();
    for (int i = 0; i < t.n_blocks; i++)
        json_array_append_new(ids, json_integer(t.first_block + i));
    log_debug("sim_kv_ticket_stored", LF_INT("first_block", t.first_block),
              LF_INT("blocks", t.n_blocks), LF_STR("request_id", g->id));
    return json_pack("{s:b, s:b, s:s, s:o, s:s, s:i, s:s}", "do_remote_prefill", 1,
                     "do_remote_decode", 0, "remote_engine_id", s->engine_id, "remote_block_ids",
                     ids, "remote_host", s->kv_host, "remote_port", (int)s->port,
                     "remote_request_id", g->id);
}

static void gen_finish(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_list_remove(g);
    g->state = GEN_DONE;
    int64_t now = reactor_now(s->r);
    metrics_histogram_observe(s->m_e2e, (double)(now - g->arrive_ms) / 1000.0);
    metrics_counter_inc(g->choices[0].stopped ? s->m_success_stop : s->m_success_length);
    struct httpd_req *req = g->req;
    if (g->r.stream) {
        struct strbuf sb;
        strbuf_init(&sb, SIM_SSE_CHUNK_MAX);
        if (g->r.include_usage) {
            json_t *chunk = sim_resp_usage_chunk(&g->meta, usage_now(g, g->steps));
            sim_sse_event(&sb, chunk);
            json_decref(chunk);
        }
        sim_sse_done(&sb);
        httpd_stream_write(req, sb.buf, sb.len);
        strbuf_release(&sb);
        schedule(s);
        httpd_stream_end(req, false);
        return;
    }
    json_t *choices = json_array();
    for (int c = 0; c < g->n_choices; c++) {
        char *text = sim_text_completion(g->choices[c].seed, g->choices[c].planned);
        json_array_append_new(choices,
                              sim_resp_choice(g->r.api, c, text, finish_of(&g->choices[c])));
        free(text);
    }
    json_t *body = sim_resp_body(&g->meta, choices, usage_now(g, g->steps));
    if (g->r.leg == SIM_LEG_PREFILL)
        json_object_set_new(body, "kv_transfer_params", prefill_ticket(g));
    schedule(s);
    httpd_respond_json(req, 200, body);
}

/* Emit the tokens whose time has come; finish when every choice is complete. */
static void gen_tick(struct reactor *r, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    int64_t now = reactor_now(r);
    double interval = token_interval_ms(s);
    int64_t first_due = g->run_ms + s->args.ttft_ms;
    if (g->r.stream && httpd_stream_pending(g->req) > SIM_STREAM_BACKLOG) {
        /* The client reads slower than we generate: wait instead of piling up. */
        reactor_timer_start(r, &g->timer, SIM_BACKLOG_RETRY_MS, 0);
        return;
    }
    int due = g->steps;
    if (interval > 0)
        due = (int)MOTOR_MIN((double)g->steps, floor((double)(now - first_due) / interval) + 1);
    if (due <= g->emitted)
        due = g->emitted + 1; /* the timer fired: at least one step is due */
    /* Bounded work per loop iteration, whatever the speed (tokens-per-second 0). */
    bool capped = due - g->emitted > SIM_STEPS_PER_TICK;
    if (capped)
        due = g->emitted + SIM_STEPS_PER_TICK;
    if (g->emitted == 0)
        metrics_histogram_observe(s->m_ttft, (double)(now - g->arrive_ms) / 1000.0);

    uint64_t tokens = 0;
    struct strbuf sb;
    strbuf_init(&sb, SIM_SSE_CHUNK_MAX);
    for (int step = g->emitted; step < due; step++) {
        for (int c = 0; c < g->n_choices; c++) {
            const struct gen_choice *ch = &g->choices[c];
            if (step >= ch->planned)
                continue;
            tokens++;
            if (!g->r.stream)
                continue;
            char tok[SIM_TEXT_TOKEN_MAX];
            sim_text_token(ch->seed, step, tok, sizeof(tok));
            bool last = step == ch->planned - 1;
            json_t *usage = g->r.continuous_usage ? usage_now(g, step + 1) : NULL;
            json_t *chunk =
                sim_resp_chunk(&g->meta, c, tok, false, last ? finish_of(ch) : NULL, usage);
            sim_sse_event(&sb, chunk);
            json_decref(chunk);
        }
    }
    g->emitted = due;
    metrics_counter_add(s->m_gen_tokens, tokens);
    if (g->r.stream && sb.len > 0 && httpd_stream_write(g->req, sb.buf, sb.len) < 0) {
        /* Client gone (or hopelessly slow): stop producing; on_close frees g. */
        strbuf_release(&sb);
        gen_list_remove(g);
        g->state = GEN_DONE;
        metrics_counter_inc(s->m_failed);
        schedule(s);
        httpd_stream_end(g->req, true);
        return;
    }
    strbuf_release(&sb);
    if (g->emitted >= g->steps) {
        gen_finish(g);
        return;
    }
    int64_t next_due = first_due + (int64_t)ceil(interval * g->emitted);
    reactor_timer_start(r, &g->timer, capped ? 0 : MOTOR_MAX(next_due - now, 0), 0);
}

static void gen_on_close(struct httpd_req *req, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    reactor_timer_stop(s->r, &g->timer);
    if (g->fetch)
        httpc_cancel(s->httpc, g->fetch);
    g->fetch = NULL;
    if (g->state != GEN_DONE) {
        log_debug("sim_request_aborted", LF_STR("request_id", g->id),
                  LF_INT("state", (int)g->state));
        metrics_counter_inc(s->m_failed);
    }
    bool was_running = g->state == GEN_RUNNING;
    gen_list_remove(g);
    if (was_running)
        schedule(s);
    update_gauges(s);
    sim_req_release(&g->r);
    free(g->choices);
    free(g);
}

/* ---- decode leg: take the ticket from the prefill engine ----------------------------- */

static void fetch_done(const struct httpc_response *resp, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    g->fetch = NULL;
    gen_list_remove(g);
    const char *host = g->r.remote_host;
    int port = g->r.remote_port;
    long long block = (long long)g->r.remote_block_ids[0];
    if (resp->error) {
        g->state = GEN_DONE;
        update_gauges(s);
        log_warn("sim_kv_fetch_failed", LF_STR("request_id", g->id), LF_STR("host", host),
                 LF_INT("port", port), LF_STR("error", resp->error_text));
        respond_error(g->req, 502, "kv_transfer_params",
                      "prefill engine %s:%d unreachable while fetching KV ticket %lld: %s", host,
                      port, block, resp->error_text);
        return;
    }
    if (resp->status == 404) {
        g->state = GEN_DONE;
        update_gauges(s);
        respond_error(g->req, 400, "kv_transfer_params",
                      "unknown KV ticket %lld at prefill engine %s:%d (expired, already taken "
                      "or never issued)",
                      block, host, port);
        return;
    }
    json_error_t jerr;
    json_t *t = resp->status == 200 ? json_loadb(resp->body, resp->body_len, 0, &jerr) : NULL;
    const char *hash = json_string_value(json_object_get(t, "prompt_hash"));
    const char *eid = json_string_value(json_object_get(t, "engine_id"));
    char want[24];
    snprintf(want, sizeof(want), "%016" PRIx64, g->r.prompts[0].hash);
    if (!hash || !eid) {
        g->state = GEN_DONE;
        update_gauges(s);
        respond_error(g->req, 502, "kv_transfer_params",
                      "prefill engine %s:%d answered HTTP %ld to the KV ticket fetch", host, port,
                      resp->status);
    } else if (g->r.remote_engine_id && strcmp(eid, g->r.remote_engine_id) != 0) {
        g->state = GEN_DONE;
        update_gauges(s);
        respond_error(g->req, 400, "kv_transfer_params",
                      "KV ticket %lld belongs to engine %s, not remote_engine_id %s", block, eid,
                      g->r.remote_engine_id);
    } else if (strcmp(hash, want) != 0) {
        g->state = GEN_DONE;
        update_gauges(s);
        respond_error(g->req, 400, "kv_transfer_params",
                      "KV ticket %lld was computed for another prompt", block);
    } else {
        log_debug("sim_kv_fetched", LF_STR("request_id", g->id), LF_INT("first_block", block),
                  LF_INT("ms", resp->elapsed_ms));
        gen_enqueue(g);
    }
    json_decref(t);
}

static void gen_fetch(struct sim_gen *g)
{
    struct sim *s = g->s;
    const char *h = g->r.remote_host;
    bool v6 = strchr(h, ':') && h[0] != '[';
    char *url = xasprintf("http://%s%s%s:%d/sim/kv/%lld", v6 ? "[" : "", h, v6 ? "]" : "",
                          g->r.remote_port, (long long)g->r.remote_block_ids[0]);
    struct httpc_opts o = {
        .url = url,
        .timeout_ms = SIM_KV_FETCH_TIMEOUT_MS,
        .max_response = SIM_KV_FETCH_MAX_RESPONSE,
    };
    g->state = GEN_FETCHING;
    gen_list_push(&s->fetching, g);
    update_gauges(s);
    g->fetch = httpc_request(s->httpc, &o, fetch_done, g);
    free(url);
}

/* ---- inference routes --------------------------------------------------------------- */

/* 503/500 while the engine cannot serve; false when it can. */
static bool refuse_inference(struct sim *s, struct httpd_req *req)
{
    if (s->phase == SIM_LOADING) {
        respond_error(req, 503, NULL, "model is still loading");
        return true;
    }
    if (s->phase == SIM_STOPPING) {
        respond_error(req, 503, NULL, "engine is shutting down");
        return true;
    }
    switch (s->fault) {
    case SIM_FAULT_UNHEALTHY:
        respond_error(req, 503, NULL, "engine is unhealthy (injected fault)");
        return true;
    case SIM_FAULT_FT_DEAD:
        respond_error(req, 503, NULL, "engine is dead (injected fault)");
        return true;
    case SIM_FAULT_ERROR:
        respond_error(req, 500, NULL, "internal engine error (injected fault)");
        return true;
    default:
        break;
    }
    if (s->ft_recovering) {
        respond_error(req, 503, NULL, "engine is recovering (fault tolerance)");
        return true;
    }
    return false;
}

static void make_id(struct sim *s, struct sim_gen *g)
{
    const char *rid = g->r.request_id;
    const char *hdr = httpd_req_header(g->req, "X-Request-Id");
    if (!rid && hdr && *hdr && strlen(hdr) <= SIM_REQ_MAX_ID_LEN)
        rid = hdr;
    const char *prefix = g->r.api == SIM_API_CHAT ? "chatcmpl-" : "cmpl-";
    if (rid)
        snprintf(g->id, sizeof(g->id), "%s%s", prefix, rid);
    else
        snprintf(g->id, sizeof(g->id), "%s%016" PRIx64 "%08" PRIx64, prefix, s->id_base,
                 ++s->id_seq);
}

static void handle_infer(struct httpd_req *req, struct sim *s, enum sim_api api)
{
    if (refuse_inference(s, req))
        return;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    if (!body) {
        respond_error(req, 400, NULL, "malformed JSON body: %s", jmsg);
        return;
    }
    const char *names[64];
    size_t n_names = MOTOR_MIN(s->args.n_served, ARRAY_LEN(names));
    for (size_t i = 0; i < n_names; i++)
        names[i] = s->args.served_names[i];
    struct sim_req_limits lim = {
        .max_model_len = s->args.max_model_len, .models = names, .n_models = n_names};
    struct sim_gen *g = xcalloc(1, sizeof(*g));
    struct sim_err err;
    int rc = sim_req_parse(body, api, &lim, &g->r, &err);
    json_decref(body);
    if (rc) {
        free(g);
        httpd_respond_json(req, err.status, sim_resp_error_from(&err));
        return;
    }
    g->s = s;
    g->req = req;
    g->arrive_ms = reactor_now(s->r);
    make_id(s, g);
    g->meta = (struct sim_resp_meta){.api = api,
                                     .id = g->id,
                                     .created = util_wall_ms() / 1000,
                                     .model = g->r.model,
                                     .usage_null = g->r.include_usage};
    g->n_choices = (int)g->r.n_prompts * g->r.n;
    g->choices = xcalloc((size_t)g->n_choices, sizeof(*g->choices));
    for (size_t p = 0; p < g->r.n_prompts; p++) {
        for (int k = 0; k < g->r.n; k++) {
            struct gen_choice *c = &g->choices[p * (size_t)g->r.n + (size_t)k];
            c->seed = sim_text_seed(g->r.prompts[p].hash, k);
            c->planned = sim_text_plan(c->seed, g->r.max_tokens, g->r.min_tokens, g->r.ignore_eos,
                                       &c->stopped);
            g->steps = MOTOR_MAX(g->steps, c->planned);
        }
    }
    /* A prefill leg only computes the prompt (and the one token it was asked for). */
    g->prompt_tokens = sim_req_prompt_tokens(&g->r);
    reactor_timer_init(&g->timer, gen_tick, g);
    httpd_req_on_close(req, gen_on_close, g);
    log_debug("sim_request", LF_STR("request_id", g->id),
              LF_STR("api", api == SIM_API_CHAT ? "chat" : "completions"),
              LF_INT("prompt_tokens", g->prompt_tokens), LF_INT("max_tokens", g->r.max_tokens),
              LF_BOOL("stream", g->r.stream), LF_INT("leg", (int)g->r.leg));
    if (g->r.leg == SIM_LEG_DECODE)
        gen_fetch(g);
    else
        gen_enqueue(g);
}

static void on_completions(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, SIM_API_COMPLETIONS);
}

static void on_chat(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, SIM_API_CHAT);
}

/* ---- probes, models, metrics --------------------------------------------------------- */

static void on_health(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (s->phase == SIM_LOADING)
        respond_error(req, 503, NULL, "model is still loading");
    else if (s->phase == SIM_STOPPING)
        respond_error(req, 503, NULL, "engine is shutting down");
    else if (s->fault == SIM_FAULT_UNHEALTHY || s->fault == SIM_FAULT_FT_DEAD || s->ft_recovering)
        respond_error(req, 503, NULL, "engine is %s",
                      s->fault == SIM_FAULT_FT_DEAD ? "dead" : "unhealthy");
    else
        httpd_respond(req, 200, "text/plain", "", 0);
}

static void on_models(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    if (s->phase == SIM_LOADING) {
        respond_error(req, 503, NULL, "model is still loading");
        return;
    }
    json_t *data = json_array();
    for (size_t i = 0; i < s->args.n_served; i++)
        json_array_append_new(data,
                              json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i, s:[]}", "id",
                                        s->args.served_names[i], "object", "model", "created",
                                        (json_int_t)(s->start_wall_ms / 1000), "owned_by", "vllm",
                                        "root", s->args.model, "parent", "max_model_len",
                                        s->args.max_model_len, "permission"));
    httpd_respond_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void on_version(struct httpd_req *req, void *arg)
{
    httpd_respond_json(req, 200, json_pack("{s:s}", "version", "motor-engine-sim-" MOTOR_VERSION));
}

static void on_metrics(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    update_gauges(s);
    size_t len = 0;
    char *text = metrics_render_alloc(s->metrics, (size_t)1 << 20, &len);
    if (!text) {
        respond_error(req, 500, NULL, "metrics too large");
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
    update_gauges(s);
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
        respond_error(req, 400, NULL, "body must be a JSON object%s%s", body ? "" : ": ",
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
        respond_error(req, 400, "request_id", "'request_id' must be a non-empty string");
        goto out;
    }
    if (!instruction || (strcmp(instruction, "scale_down") && strcmp(instruction, "retry"))) {
        respond_error(req, 400, "instruction", "'instruction' must be 'scale_down' or 'retry'");
        goto out;
    }
    if (params && !json_is_null(params) && !json_is_object(params)) {
        respond_error(req, 400, "params", "'params' must be an object");
        goto out;
    }
    int n_removed = 0;
    if (!strcmp(instruction, "scale_down")) {
        if (!json_is_array(removed) || json_array_size(removed) == 0) {
            respond_error(req, 400, "removed_dp_ranks",
                          "scale_down needs a non-empty 'removed_dp_ranks' list");
            goto out;
        }
        size_t i;
        const json_t *v;
        json_array_foreach(removed, i, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65535) {
                respond_error(req, 400, "removed_dp_ranks",
                              "'removed_dp_ranks' must hold DP ranks (integers 0..65535)");
                goto out;
            }
            if (json_integer_value(v) == s->args.dp_rank) {
                respond_error(req, 400, "removed_dp_ranks",
                              "this engine (DP rank %d) is in removed_dp_ranks: apply goes to "
                              "survivors only",
                              s->args.dp_rank);
                goto out;
            }
        }
        n_removed = (int)json_array_size(removed);
    }
    if (s->fault == SIM_FAULT_FT_DEAD) {
        respond_error(req, 409, NULL, "engine is dead: it cannot apply %s", instruction);
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

static void on_fault(struct httpd_req *req, void *arg)
{
    struct sim *s = arg;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    const char *mode = json_string_value(json_object_get(body, "mode"));
    const json_t *ign = json_object_get(body, "ignore_sigterm");
    if (!mode || (ign && !json_is_boolean(ign))) {
        respond_error(req, 400, "mode",
                      "body must be {\"mode\": \"crash|exit0|hang|unhealthy|ft_dead|error|"
                      "recover\"} (optional \"ignore_sigterm\": bool for hang)");
        json_decref(body);
        return;
    }
    const char *previous = sim_fault_name(s->fault);
    char *mode_copy = xstrdup(mode);
    int rc = sim_fault_apply(s, mode_copy, json_is_true(ign));
    json_decref(body);
    if (rc) {
        respond_error(req, 400, "mode", "unknown fault mode '%s'", mode_copy);
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
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:b}",
                                 "engine_id", s->engine_id, "phase", phase_name(s->phase), "fault",
                                 sim_fault_name(s->fault), "dp_rank", s->args.dp_rank, "dp_size",
                                 s->args.dp_size, "running", s->running.count, "waiting",
                                 s->waiting.count, "fetching", s->fetching.count, "kv_tickets",
                                 (int)sim_kv_count(s->kv), "workers", workers, "ft_recovering",
                                 s->ft_recovering));
}

/* ---- server -------------------------------------------------------------------------- */

int sim_engine_start(struct sim *s)
{
    static const char *const quiet[] = {"/health", "/metrics", NULL};
    struct httpd_config cfg = {
        .name = "engine-sim",
        .host = s->args.host,
        .port = (uint16_t)s->args.port,
        .max_body = (size_t)1 << 20,
        .quiet_paths = quiet,
    };
    s->httpd = httpd_new(s->r, &cfg);
    if (!s->httpd) {
        int e = errno ? errno : EIO;
        log_error("sim_listen_failed", LF_STR("host", s->args.host), LF_INT("port", s->args.port),
                  LF_STR("error", strerror(e)));
        return -e;
    }
    s->port = httpd_port(s->httpd);
    struct httpd *h = s->httpd;
    httpd_route(h, "GET", "/health", on_health, s, 0);
    httpd_route(h, "GET", "/v1/models", on_models, s, 0);
    httpd_route(h, "GET", "/version", on_version, s, 0);
    httpd_route(h, "POST", "/v1/completions", on_completions, s, 0);
    httpd_route(h, "POST", "/v1/chat/completions", on_chat, s, 0);
    httpd_route(h, "GET", "/metrics", on_metrics, s, 0);
    if (s->args.ft) {
        httpd_route(h, "GET", "/v1/fault_tolerance/status", on_ft_status, s, 0);
        httpd_route(h, "POST", "/v1/fault_tolerance/apply", on_ft_apply, s, 0);
    }
    httpd_route(h, "GET", "/sim/kv/{id}", on_kv_take, s, 0);
    httpd_route(h, "POST", "/sim/fault", on_fault, s, 0);
    httpd_route(h, "GET", "/sim/status", on_sim_status, s, 0);
    reactor_timer_init(&s->ft_timer, ft_recovered, s);

    const char *vhost = getenv("VLLM_HOST_IP");
    s->kv_host = xstrdup(vhost && *vhost               ? vhost
                         : wildcard_host(s->args.host) ? "127.0.0.1"
                                                       : s->args.host);
    return 0;
}

void sim_engine_stop(struct sim *s)
{
    /* httpd_free closes suspended requests: their on_close (gen_on_close) still needs
     * the client and the lists, so the server goes first. */
    httpd_free(s->httpd);
    s->httpd = NULL;
    httpc_free(s->httpc);
    s->httpc = NULL;
    if (s->r)
        reactor_timer_stop(s->r, &s->ft_timer);
}
