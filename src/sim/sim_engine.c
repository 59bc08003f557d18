/* sim_engine — the simulator's generation routes (completions, chat, Responses,
 * Messages), the PD hand-offs (KV ticket, trigger-mode metaserver callback), SGLang's
 * abort, and the stream faults. The routes that generate nothing are in sim_api.c.
 *
 * A generation is a small state machine per request (struct sim_gen):
 *
 *   FETCHING (decode leg: taking the KV ticket; trigger leg: calling the metaserver)
 *      -> WAITING (no free slot: more than --max-num-seqs running)
 *      -> RUNNING (prefix cache looked up; a reactor timer paces tokens: --ttft-ms plus
 *                  --prefill-ms-per-token per uncached prompt token, then
 *                  --tokens-per-second)
 *      -> DONE    (answered, aborted or cut; freed when httpd reports the request closed)
 *
 * Nothing blocks: the request stays suspended in httpd while the timer runs, and the
 * struct lives until httpd's on_close, the only place it is freed. */
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
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define SIM_SSE_CHUNK_MAX ((size_t)4 << 20)  /* one tick's worth of SSE events */
#define SIM_STEPS_PER_TICK 64                /* token steps generated per loop iteration */
#define SIM_STREAM_BACKLOG ((size_t)1 << 20) /* unsent stream bytes before we pause */
#define SIM_BACKLOG_RETRY_MS 10
#define SIM_STALL_POLL_MS 50
#define SIM_KV_FETCH_TIMEOUT_MS 5000
#define SIM_KV_FETCH_MAX_RESPONSE ((size_t)64 << 10)
#define SIM_META_TIMEOUT_MS 30000

enum gen_state { GEN_FETCHING, GEN_WAITING, GEN_RUNNING, GEN_DONE };

struct gen_choice {
    int prompt;       /* index into r.prompts */
    uint64_t seed;    /* of the answer (see sim_text.h) */
    int done0;        /* tokens of that answer already in the prompt (a continuation) */
    bool first_space; /* the answer's first token has a leading space */
    int planned;      /* tokens this choice produces */
    bool stopped;     /* finish_reason "stop" (else "length") */
    int32_t *ids;     /* generated so far */
    uint8_t *modes;   /* the quality mode of each (for logprobs) */
    int n;
    int64_t text_off; /* completions logprobs: code points sent so far */
    bool ended;       /* a planned-0 choice's finish chunk was sent */
    bool has_seq;     /* owns the prompt's prefix-cache sequence */
    struct sim_cache_seq seq;
};

struct sim_gen {
    struct sim *s;
    struct httpd_req *req;
    struct sim_req r;
    enum gen_state state;
    struct list_head link;
    struct sim_gen_list *list; /* the list it is on, NULL when none */
    char id[SIM_REQ_MAX_ID_LEN + 16];
    char item_id[SIM_REQ_MAX_ID_LEN + 24];
    struct sim_resp_meta meta;
    struct gen_choice *choices;
    int n_choices;
    int steps;         /* max planned over the choices (at least 1) */
    int emitted;       /* steps done */
    int prompt_tokens; /* total over the prompts */
    int cached_tokens; /* of them, found in the prefix cache */
    int64_t arrive_ms, run_ms, first_due_ms;
    struct reactor_timer timer;
    struct httpc_req *fetch;
    int resp_seq; /* Responses: sequence_number */
    bool aborted; /* abort_request */
    int attempt;  /* trigger: the metaserver attempt */
};

static void respond_error_gen(struct sim_gen *g, int status, const char *param, const char *fmt,
                              ...) __attribute__((format(printf, 4, 5)));

static void respond_error_gen(struct sim_gen *g, int status, const char *param, const char *fmt,
                              ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sim_respond_error(g->req, status, param, "%s", msg);
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

void sim_update_gauges(struct sim *s)
{
    metrics_gauge_set(s->m_running, s->running.count);
    metrics_gauge_set(s->m_waiting, s->waiting.count + s->fetching.count);
    metrics_gauge_set(s->m_wait_capacity, s->waiting.count);
    metrics_gauge_set(s->m_wait_kv, s->fetching.count);
    double usage = (double)s->running.count / s->args.max_num_seqs;
    if (s->cache) {
        /* vLLM: the share of KV blocks in use by running requests */
        struct sim_cache_stats cs;
        sim_cache_get_stats(s->cache, &cs);
        usage = cs.capacity ? (double)cs.pinned / (double)cs.capacity : 0.0;
    }
    metrics_gauge_set(s->m_kv_usage, usage);
}

static bool is_openai(const struct sim_gen *g)
{
    return g->r.api == SIM_API_COMPLETIONS || g->r.api == SIM_API_CHAT;
}

/* ---- generation ----------------------------------------------------------------------- */

static void gen_tick(struct reactor *r, void *arg);
static void schedule(struct sim *s);

static double token_interval_ms(const struct sim *s)
{
    return s->args.tokens_per_second > 0 ? 1000.0 / s->args.tokens_per_second : 0.0;
}

static struct sim_fmt_meta fmt_meta(const struct sim_gen *g)
{
    return (struct sim_fmt_meta){.id = g->id,
                                 .item_id = g->item_id,
                                 .created = g->meta.created,
                                 .model = g->r.model,
                                 .instructions = g->r.instructions,
                                 .max_output_tokens =
                                     g->r.api == SIM_API_RESPONSES ? g->r.max_tokens : 0};
}

static int completion_tokens(const struct sim_gen *g)
{
    int n = 0;
    for (int c = 0; c < g->n_choices; c++)
        n += g->choices[c].n;
    return n;
}

static struct sim_fmt_usage fmt_usage(const struct sim_gen *g)
{
    return (struct sim_fmt_usage){
        .input = g->prompt_tokens, .output = completion_tokens(g), .cached = g->cached_tokens};
}

static json_t *usage_json(const struct sim_gen *g, int completion)
{
    json_t *u = sim_resp_usage(g->prompt_tokens, completion);
    if (g->s->args.prompt_tokens_details)
        json_object_set_new(u, "prompt_tokens_details",
                            json_pack("{s:i}", "cached_tokens", g->cached_tokens));
    return u;
}

/* Prefix cache: look every prompt up (pinning its blocks), for the TTFT. */
static void cache_begin(struct sim_gen *g)
{
    struct sim *s = g->s;
    g->cached_tokens = 0;
    if (!s->cache)
        return;
    for (int c = 0; c < g->n_choices; c++) {
        struct gen_choice *ch = &g->choices[c];
        if (c % g->r.n != 0)
            continue; /* the first choice of each prompt holds its sequence */
        const struct sim_prompt *p = &g->r.prompts[ch->prompt];
        sim_cache_seq_init(&ch->seq);
        ch->has_seq = true;
        size_t hit = sim_cache_begin(s->cache, &ch->seq, p->ids.v, p->ids.n, true);
        /* vLLM recomputes the last prompt token even when everything is cached */
        if (hit >= p->ids.n && hit > 0)
            hit = p->ids.n - 1;
        g->cached_tokens += (int)hit;
    }
    struct sim_cache_stats cs;
    sim_cache_get_stats(s->cache, &cs);
    metrics_counter_add(s->m_pc_queries, (uint64_t)g->prompt_tokens);
    metrics_counter_add(s->m_pc_hits, (uint64_t)g->cached_tokens);
    metrics_counter_add(s->m_gpu_pc_queries, (uint64_t)g->prompt_tokens);
    metrics_counter_add(s->m_gpu_pc_hits, (uint64_t)g->cached_tokens);
}

static void cache_end(struct sim_gen *g)
{
    for (int c = 0; c < g->n_choices; c++) {
        if (g->choices[c].has_seq) {
            sim_cache_end(g->s->cache, &g->choices[c].seq);
            g->choices[c].has_seq = false;
        }
    }
}

static void stream_open(struct sim_gen *g)
{
    httpd_add_header(g->req, "Cache-Control", "no-cache");
    httpd_stream_begin(g->req, 200, "text/event-stream");
    struct strbuf sb;
    strbuf_init(&sb, SIM_SSE_CHUNK_MAX);
    struct sim_fmt_meta fm = fmt_meta(g);
    if (g->r.api == SIM_API_CHAT) {
        /* vLLM opens a chat stream with the role before the first token. */
        for (int c = 0; c < g->n_choices; c++) {
            json_t *chunk = sim_resp_chunk(&g->meta, c, "", true, NULL, NULL);
            sim_sse_event(&sb, chunk);
            json_decref(chunk);
        }
    } else if (g->r.api == SIM_API_RESPONSES) {
        sim_fmt_resp_open(&sb, &fm, &g->resp_seq);
    } else if (g->r.api == SIM_API_MESSAGES) {
        struct sim_fmt_usage u = fmt_usage(g);
        sim_fmt_msg_open(&sb, &fm, &u);
    }
    if (sb.len)
        httpd_stream_write(g->req, sb.buf, sb.len);
    strbuf_release(&sb);
}

static void gen_start(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_list_remove(g);
    gen_list_push(&s->running, g);
    g->state = GEN_RUNNING;
    g->run_ms = reactor_now(s->r);
    metrics_counter_add(s->m_prompt_tokens, (uint64_t)g->prompt_tokens);
    cache_begin(g);
    sim_update_gauges(s);
    /* The prefill cost: what the prefix cache did not have. A decode leg got its KV
     * from the prefill engine. */
    double prefill = 0;
    if (g->r.leg != SIM_LEG_DECODE && g->r.leg != SIM_LEG_TRIGGER)
        prefill = s->args.prefill_ms_per_token * (g->prompt_tokens - g->cached_tokens);
    int64_t ttft = s->args.ttft_ms + (int64_t)ceil(prefill);
    g->first_due_ms = g->run_ms + ttft;
    if (g->r.stream)
        stream_open(g);
    reactor_timer_start(s->r, &g->timer, ttft, 0);
}

/* Fill free slots from the waiting queue, oldest first. */
static void schedule(struct sim *s)
{
    /* While stopping, httpd_free is closing every request: start nothing new. */
    struct sim_gen *g;
    while (s->phase != SIM_STOPPING && (g = gen_list_first(&s->waiting)) &&
           s->running.count < s->args.max_num_seqs)
        gen_start(g);
    sim_update_gauges(s);
}

static void gen_enqueue(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_list_remove(g);
    g->state = GEN_WAITING;
    gen_list_push(&s->waiting, g);
    schedule(s);
}

static const char *finish_of(const struct sim_gen *g, const struct gen_choice *c)
{
    if (g->aborted)
        return "abort";
    return c->stopped ? "stop" : "length";
}

/* The text of the tokens generated so far (the concatenation of what a stream sent). */
static char *choice_text(const struct gen_choice *c)
{
    char *out = xmalloc((size_t)c->n * SIM_TOK_TEXT_MAX + 1);
    size_t len = 0;
    for (int i = 0; i < c->n; i++)
        len += sim_tok_text(c->ids[i], false, out + len, SIM_TOK_TEXT_MAX);
    out[len] = '\0';
    return out;
}

static void token_lp(const struct gen_choice *c, int i, int top, struct sim_lp *lp)
{
    sim_text_logprobs((enum sim_mode)c->modes[i], c->seed, c->done0 + i, c->ids[i], top, lp);
}

/* Logprobs of tokens [from, to) of a choice in the API's shape (NULL without logprobs). */
static json_t *choice_logprobs(struct sim_gen *g, struct gen_choice *c, int from, int to)
{
    if (g->r.logprobs < 0)
        return NULL;
    bool as_ids = g->r.return_token_ids || g->s->args.return_token_ids;
    if (g->r.api == SIM_API_COMPLETIONS) {
        json_t *o = sim_resp_cmpl_lp_new();
        for (int i = from; i < to; i++) {
            struct sim_lp lp;
            token_lp(c, i, g->r.logprobs, &lp);
            sim_resp_cmpl_lp_add(o, &lp, g->r.logprobs, as_ids, &c->text_off);
        }
        return o;
    }
    json_t *content = json_array();
    for (int i = from; i < to; i++) {
        struct sim_lp lp;
        token_lp(c, i, g->r.logprobs, &lp);
        json_array_append_new(content, sim_resp_chat_lp_entry(&lp, g->r.logprobs, as_ids));
    }
    if (g->r.api == SIM_API_RESPONSES)
        return content;
    return sim_resp_chat_lp_wrap(content);
}

/* The whole non-streamed body. */
static json_t *final_body(struct sim_gen *g)
{
    struct sim_fmt_meta fm = fmt_meta(g);
    struct sim_fmt_usage u = fmt_usage(g);
    if (g->r.api == SIM_API_RESPONSES) {
        struct gen_choice *c = &g->choices[0];
        char *text = choice_text(c);
        c->text_off = 0;
        json_t *b = sim_fmt_response(&fm, c->stopped || g->aborted ? "completed" : "incomplete",
                                     text, &u, choice_logprobs(g, c, 0, c->n));
        free(text);
        return b;
    }
    if (g->r.api == SIM_API_MESSAGES) {
        char *text = choice_text(&g->choices[0]);
        json_t *b = sim_fmt_message(&fm, text, g->choices[0].stopped ? "end_turn" : "max_tokens", &u);
        free(text);
        return b;
    }
    json_t *choices = json_array();
    for (int c = 0; c < g->n_choices; c++) {
        struct gen_choice *ch = &g->choices[c];
        char *text = choice_text(ch);
        ch->text_off = 0;
        json_array_append_new(choices, sim_resp_choice_lp(g->r.api, c, text, finish_of(g, ch),
                                                          choice_logprobs(g, ch, 0, ch->n)));
        free(text);
    }
    return sim_resp_body(&g->meta, choices, usage_json(g, completion_tokens(g)));
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

static void gen_done(struct sim_gen *g)
{
    gen_list_remove(g);
    g->state = GEN_DONE;
    reactor_timer_stop(g->s->r, &g->timer);
    cache_end(g);
}

static void gen_finish(struct sim_gen *g)
{
    struct sim *s = g->s;
    gen_done(g);
    int64_t now = reactor_now(s->r);
    metrics_histogram_observe(s->m_e2e, (double)(now - g->arrive_ms) / 1000.0);
    metrics_counter_inc(g->aborted                ? s->m_success_abort
                        : g->choices[0].stopped ? s->m_success_stop
                                                : s->m_success_length);
    struct httpd_req *req = g->req;
    if (g->r.stream) {
        struct strbuf sb;
        strbuf_init(&sb, SIM_SSE_CHUNK_MAX);
        if (g->r.api == SIM_API_RESPONSES || g->r.api == SIM_API_MESSAGES) {
            struct gen_choice *c = &g->choices[0];
            char *text = choice_text(c);
            struct sim_fmt_meta fm = fmt_meta(g);
            struct sim_fmt_usage u = fmt_usage(g);
            if (g->r.api == SIM_API_RESPONSES)
                sim_fmt_resp_close(&sb, &fm, c->stopped || g->aborted ? "completed" : "incomplete",
                                   text, &u, &g->resp_seq);
            else
                sim_fmt_msg_close(&sb, c->stopped ? "end_turn" : "max_tokens", &u);
            free(text);
        } else {
            if (g->aborted) {
                /* SGLang ends an aborted stream with finish_reason "abort" */
                for (int c = 0; c < g->n_choices; c++) {
                    if (g->choices[c].n >= g->choices[c].planned)
                        continue;
                    json_t *chunk = sim_resp_chunk(&g->meta, c, "", false, "abort", NULL);
                    sim_sse_event(&sb, chunk);
                    json_decref(chunk);
                }
            }
            if (g->r.include_usage) {
                json_t *chunk = sim_resp_usage_chunk(&g->meta, usage_json(g, completion_tokens(g)));
                sim_sse_event(&sb, chunk);
                json_decref(chunk);
            }
            sim_sse_done(&sb);
        }
        httpd_stream_write(req, sb.buf, sb.len);
        strbuf_release(&sb);
        schedule(s);
        httpd_stream_end(req, false);
        return;
    }
    json_t *body = final_body(g);
    if (g->r.leg == SIM_LEG_PREFILL)
        json_object_set_new(body, "kv_transfer_params", prefill_ticket(g));
    schedule(s);
    httpd_respond_json(req, 200, body);
}

/* The `cut` fault: end the answer cleanly but unfinished — a stream without
 * finish_reason or [DONE], a body cut in the middle. */
static void gen_cut(struct sim_gen *g, struct strbuf *pending)
{
    struct sim *s = g->s;
    gen_done(g);
    metrics_counter_inc(s->m_failed);
    log_info("sim_stream_cut", LF_STR("request_id", g->id), LF_INT("tokens", completion_tokens(g)),
             LF_BOOL("stream", g->r.stream));
    if (g->r.stream) {
        if (pending && pending->len)
            httpd_stream_write(g->req, pending->buf, pending->len);
        schedule(s);
        httpd_stream_end(g->req, false);
        return;
    }
    json_t *body = final_body(g);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    httpd_stream_begin(g->req, 200, "application/json");
    if (text)
        httpd_stream_write(g->req, text, strlen(text) / 2);
    free(text);
    schedule(s);
    httpd_stream_end(g->req, false);
}

/* One token of choice c: generate, record, render into sb when streaming. */
static void emit_token(struct sim_gen *g, struct gen_choice *c, int index, struct strbuf *sb)
{
    struct sim *s = g->s;
    enum sim_mode mode = s->quality;
    int32_t id = sim_text_gen_mode(mode, c->seed, c->done0 + c->n, c->first_space);
    c->ids[c->n] = id;
    c->modes[c->n] = (uint8_t)mode;
    c->n++;
    if (c->has_seq)
        sim_cache_append(s->cache, &c->seq, id);
    if (!g->r.stream)
        return;
    char tok[SIM_TOK_TEXT_MAX];
    sim_tok_text(id, false, tok, sizeof(tok));
    bool last = c->n == c->planned;
    struct sim_fmt_meta fm = fmt_meta(g);
    switch (g->r.api) {
    case SIM_API_RESPONSES:
        sim_fmt_resp_delta(sb, &fm, tok, &g->resp_seq);
        break;
    case SIM_API_MESSAGES:
        sim_fmt_msg_delta(sb, tok);
        break;
    default: {
        json_t *usage = g->r.continuous_usage ? usage_json(g, completion_tokens(g)) : NULL;
        json_t *chunk = sim_resp_chunk_lp(&g->meta, index, tok, false, last ? finish_of(g, c) : NULL,
                                          usage, choice_logprobs(g, c, c->n - 1, c->n));
        sim_sse_event(sb, chunk);
        json_decref(chunk);
    }
    }
}

static void on_dying(struct reactor *r, void *arg)
{
    struct sim *s = arg;
    log_error("sim_crash", LF_STR("cause", "token count reached"),
              LF_INT("tokens_total", (long long)s->tokens_total), LF_INT("pid", getpid()));
    kill(getpid(), SIGKILL);
    _exit(137);
}

/* Emit the tokens whose time has come; finish when every choice is complete. */
static void gen_tick(struct reactor *r, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    int64_t now = reactor_now(r);
    double interval = token_interval_ms(s);
    if (s->dying)
        return; /* the process is about to die: not one token more */
    if (g->r.stream && httpd_stream_pending(g->req) > SIM_STREAM_BACKLOG) {
        /* The client reads slower than we generate: wait instead of piling up. */
        reactor_timer_start(r, &g->timer, SIM_BACKLOG_RETRY_MS, 0);
        return;
    }
    enum sim_stream_fault sf = sim_stream_fault_now(s);
    if (sf == SIM_SF_STALL) {
        reactor_timer_start(r, &g->timer, SIM_STALL_POLL_MS, 0);
        return;
    }
    if (sf == SIM_SF_CUT) {
        gen_cut(g, NULL);
        return;
    }
    if (sf == SIM_SF_CRASH) {
        s->dying = true;
        reactor_timer_start(r, &s->dying_timer, 0, 0);
        return;
    }
    int due = g->steps;
    if (interval > 0)
        due = (int)MOTOR_MIN((double)g->steps,
                             floor((double)(now - g->first_due_ms) / interval) + 1);
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
    enum sim_stream_fault act = SIM_SF_NONE;
    int stopped_at = due;
    for (int step = g->emitted; step < due && act == SIM_SF_NONE; step++) {
        for (int c = 0; c < g->n_choices; c++) {
            struct gen_choice *ch = &g->choices[c];
            if (step == 0 && ch->planned == 0 && g->r.stream && is_openai(g) && !ch->ended) {
                /* a continuation at its natural end: nothing more, but say so */
                json_t *chunk = sim_resp_chunk(&g->meta, c, "", false, finish_of(g, ch), NULL);
                sim_sse_event(&sb, chunk);
                json_decref(chunk);
                ch->ended = true;
            }
            /* ch->n > step: this choice has its token of this step already (a fault
             * stopped the step half-way before) */
            if (step >= ch->planned || ch->n > step)
                continue;
            if (sim_stream_fault_now(s) != SIM_SF_NONE) {
                act = sim_stream_fault_now(s);
                stopped_at = step;
                break;
            }
            emit_token(g, ch, c, &sb);
            tokens++;
            act = sim_token_sent(s);
            if (act != SIM_SF_NONE) {
                /* the step is complete only if every choice has its token */
                stopped_at = step;
                bool complete = true;
                for (int q = 0; q < g->n_choices; q++)
                    complete = complete && (step >= g->choices[q].planned || g->choices[q].n > step);
                if (complete)
                    stopped_at = step + 1;
                break;
            }
        }
    }
    g->emitted = act == SIM_SF_NONE ? due : stopped_at;
    metrics_counter_add(s->m_gen_tokens, tokens);
    if (act == SIM_SF_CRASH) {
        /* send what was generated, then die on the next iteration (after the write) */
        if (g->r.stream && sb.len)
            httpd_stream_write(g->req, sb.buf, sb.len);
        strbuf_release(&sb);
        s->dying = true;
        reactor_timer_start(r, &s->dying_timer, 0, 0);
        return;
    }
    if (act == SIM_SF_CUT) {
        gen_cut(g, &sb);
        strbuf_release(&sb);
        return;
    }
    if (g->r.stream && sb.len > 0 && httpd_stream_write(g->req, sb.buf, sb.len) < 0) {
        /* Client gone (or hopelessly slow): stop producing; on_close frees g. */
        strbuf_release(&sb);
        gen_done(g);
        metrics_counter_inc(s->m_failed);
        schedule(s);
        httpd_stream_end(g->req, true);
        return;
    }
    strbuf_release(&sb);
    if (act == SIM_SF_STALL) {
        reactor_timer_start(r, &g->timer, SIM_STALL_POLL_MS, 0);
        return;
    }
    if (g->emitted >= g->steps) {
        gen_finish(g);
        return;
    }
    int64_t next_due = g->first_due_ms + (int64_t)ceil(interval * g->emitted);
    reactor_timer_start(r, &g->timer, capped ? 0 : MOTOR_MAX(next_due - now, 0), 0);
}

static void gen_free(struct sim_gen *g)
{
    for (int c = 0; c < g->n_choices; c++) {
        free(g->choices[c].ids);
        free(g->choices[c].modes);
    }
    sim_req_release(&g->r);
    free(g->choices);
    free(g);
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
    cache_end(g);
    if (was_running)
        schedule(s);
    sim_update_gauges(s);
    gen_free(g);
}

void sim_engine_resume(struct sim *s)
{
    /* stalled generations poll; nothing to do but let them see the change at once */
    struct list_head *pos;
    list_for_each(pos, &s->running.head)
    {
        struct sim_gen *g = list_entry(pos, struct sim_gen, link);
        if (g->emitted > 0 || reactor_timer_active(&g->timer))
            reactor_timer_start(s->r, &g->timer, 0, 0);
    }
}

static bool rid_matches(const struct sim_gen *g, const char *rid)
{
    if (g->r.request_id && !strcmp(g->r.request_id, rid))
        return true;
    if (!strcmp(g->id, rid))
        return true;
    const char *dash = strchr(g->id, '-');
    const char *us = strchr(g->id, '_');
    const char *sep = dash && (!us || dash < us) ? dash : us;
    return sep && !strcmp(sep + 1, rid);
}

static void gen_abort(struct sim_gen *g)
{
    struct sim *s = g->s;
    if (g->fetch)
        httpc_cancel(s->httpc, g->fetch);
    g->fetch = NULL;
    g->aborted = true;
    log_info("sim_request_aborted", LF_STR("request_id", g->id), LF_STR("by", "abort_request"),
             LF_INT("tokens", completion_tokens(g)));
    metrics_counter_inc(s->m_failed);
    /* finish_reason "abort" on what was generated (nothing yet when it never ran) */
    if (g->state != GEN_RUNNING && g->r.stream)
        stream_open(g);
    gen_finish(g);
}

int sim_engine_abort(struct sim *s, const char *rid, bool all)
{
    /* Collect first: aborting one generation schedules waiting ones (moving them
     * between the lists being walked). */
    struct sim_gen_list *lists[] = {&s->running, &s->waiting, &s->fetching};
    size_t total = (size_t)(s->running.count + s->waiting.count + s->fetching.count);
    struct sim_gen **hit = xcalloc(total ? total : 1, sizeof(*hit));
    size_t n = 0;
    for (size_t l = 0; l < ARRAY_LEN(lists); l++) {
        struct list_head *pos;
        list_for_each(pos, &lists[l]->head)
        {
            struct sim_gen *g = list_entry(pos, struct sim_gen, link);
            if (n < total && (all || (rid && rid_matches(g, rid))))
                hit[n++] = g;
        }
    }
    for (size_t i = 0; i < n; i++)
        gen_abort(hit[i]);
    free(hit);
    sim_update_gauges(s);
    return (int)n;
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
        sim_update_gauges(s);
        log_warn("sim_kv_fetch_failed", LF_STR("request_id", g->id), LF_STR("host", host),
                 LF_INT("port", port), LF_STR("error", resp->error_text));
        respond_error_gen(g, 502, "kv_transfer_params",
                          "prefill engine %s:%d unreachable while fetching KV ticket %lld: %s",
                          host, port, block, resp->error_text);
        return;
    }
    if (resp->status == 404) {
        g->state = GEN_DONE;
        sim_update_gauges(s);
        respond_error_gen(g, 400, "kv_transfer_params",
                          "unknown KV ticket %lld at prefill engine %s:%d (expired, already "
                          "taken or never issued)",
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
        sim_update_gauges(s);
        respond_error_gen(g, 502, "kv_transfer_params",
                          "prefill engine %s:%d answered HTTP %ld to the KV ticket fetch", host,
                          port, resp->status);
    } else if (g->r.remote_engine_id && strcmp(eid, g->r.remote_engine_id) != 0) {
        g->state = GEN_DONE;
        sim_update_gauges(s);
        respond_error_gen(g, 400, "kv_transfer_params",
                          "KV ticket %lld belongs to engine %s, not remote_engine_id %s", block,
                          eid, g->r.remote_engine_id);
    } else if (strcmp(hash, want) != 0) {
        g->state = GEN_DONE;
        sim_update_gauges(s);
        respond_error_gen(g, 400, "kv_transfer_params",
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
    /* A TLS engine pulls from its peers over TLS too (they share the deployment's
     * certificates: ours is the client certificate, --ssl-ca-certs verifies theirs). */
    bool tls = s->args.ssl_certfile != NULL;
    struct httpc_tls t = {.ca_file = s->args.ssl_ca_certs,
                          .cert_file = s->args.ssl_certfile,
                          .key_file = s->args.ssl_keyfile};
    char *url = xasprintf("%s://%s%s%s:%d/sim/kv/%lld", tls ? "https" : "http", v6 ? "[" : "", h,
                          v6 ? "]" : "", g->r.remote_port, (long long)g->r.remote_block_ids[0]);
    struct httpc_opts o = {
        .url = url,
        .timeout_ms = SIM_KV_FETCH_TIMEOUT_MS,
        .max_response = SIM_KV_FETCH_MAX_RESPONSE,
        .tls = tls ? &t : NULL,
    };
    g->state = GEN_FETCHING;
    gen_list_push(&s->fetching, g);
    sim_update_gauges(s);
    g->fetch = httpc_request(s->httpc, &o, fetch_done, g);
    free(url);
}

/* ---- trigger leg: the metaserver callback (concurrent_engine_sync) ------------------- */

/* vLLM's engine-side request id, which the metaserver keys its requests by:
 * "cmpl-<id>-0" for completions, "chatcmpl-<id>" for chat. */
static void engine_request_id(const struct sim_gen *g, char *out, size_t cap)
{
    if (g->r.api == SIM_API_COMPLETIONS)
        snprintf(out, cap, "%s-0", g->id);
    else
        snprintf(out, cap, "%s", g->id);
}

static void meta_done(const struct httpc_response *resp, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    g->fetch = NULL;
    gen_list_remove(g);
    bool ok = !resp->error && resp->status >= 200 && resp->status < 300;
    log_info("sim_metaserver_callback", LF_STR("request_id", g->id), LF_INT("attempt", g->attempt),
             LF_INT("status", resp->status), LF_STR("error", resp->error ? resp->error_text : NULL),
             LF_INT("ms", resp->elapsed_ms));
    if (ok) {
        gen_enqueue(g);
        return;
    }
    g->state = GEN_DONE;
    sim_update_gauges(s);
    if (resp->error)
        respond_error_gen(g, 502, "kv_transfer_params", "metaserver %s unreachable: %s",
                          g->r.metaserver, resp->error_text);
    else
        respond_error_gen(g, 502, "kv_transfer_params",
                          "metaserver %s answered HTTP %ld to the prefill callback (attempt %d)%s",
                          g->r.metaserver, resp->status, g->attempt,
                          resp->status == 404   ? ": unknown request"
                          : resp->status == 409 ? ": stale attempt"
                                                : "");
}

static void meta_call(struct reactor *r, void *arg)
{
    struct sim_gen *g = arg;
    struct sim *s = g->s;
    reactor_timer_init(&g->timer, gen_tick, g); /* the delay is over: back to pacing */
    if (s->meta_fault == SIM_META_FAIL) {
        gen_list_remove(g);
        g->state = GEN_DONE;
        sim_update_gauges(s);
        log_warn("sim_metaserver_callback", LF_STR("request_id", g->id),
                 LF_STR("error", "injected fault metaserver_fail"));
        respond_error_gen(g, 502, "kv_transfer_params",
                          "metaserver callback failed (injected fault)");
        return;
    }
    char rid[SIM_REQ_MAX_ID_LEN + 32];
    engine_request_id(g, rid, sizeof(rid));
    /* the prefill leg's kv_transfer_params: pull from / push to this decode engine */
    json_t *blocks = json_array();
    int nb = (g->r.prompts[0].tokens + s->args.block_size - 1) / s->args.block_size;
    for (int i = 0; i < nb && i < SIM_KV_MAX_BLOCKS; i++)
        json_array_append_new(blocks, json_integer(i));
    json_t *body = json_pack("{s:s, s:b, s:b, s:s, s:s, s:i, s:o, s:s}", "request_id", rid,
                             "do_remote_decode", 1, "do_remote_prefill", 0, "remote_engine_id",
                             s->engine_id, "remote_host", s->kv_host, "remote_port", (int)s->port,
                             "remote_block_ids", blocks, "metaserver", g->r.metaserver);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    const char *url = g->r.metaserver;
    char *full = strstr(url, "attempt=") ? xstrdup(url)
                                         : xasprintf("%s%sattempt=%d", url,
                                                     strchr(url, '?') ? "&" : "?", g->attempt);
    struct httpc_opts o = {.method = "POST",
                           .url = full,
                           .body = text,
                           .timeout_ms = SIM_META_TIMEOUT_MS,
                           .max_response = SIM_KV_FETCH_MAX_RESPONSE};
    g->fetch = httpc_request(s->httpc, &o, meta_done, g);
    free(full);
    free(text);
}

static void gen_trigger(struct sim_gen *g)
{
    struct sim *s = g->s;
    g->state = GEN_FETCHING;
    g->attempt = 1;
    gen_list_push(&s->fetching, g);
    sim_update_gauges(s);
    if (s->meta_fault == SIM_META_DELAY && s->meta_delay_ms > 0) {
        reactor_timer_init(&g->timer, meta_call, g);
        reactor_timer_start(s->r, &g->timer, s->meta_delay_ms, 0);
        return;
    }
    meta_call(s->r, g);
}

/* ---- inference routes --------------------------------------------------------------- */

static void make_id(struct sim *s, struct sim_gen *g)
{
    const char *rid = g->r.request_id;
    const char *hdr = httpd_req_header(g->req, "X-Request-Id");
    if (!rid && hdr && *hdr && strlen(hdr) <= SIM_REQ_MAX_ID_LEN)
        rid = hdr;
    const char *prefix = g->r.api == SIM_API_CHAT        ? "chatcmpl-"
                         : g->r.api == SIM_API_RESPONSES ? "resp_"
                         : g->r.api == SIM_API_MESSAGES  ? "msg_"
                                                         : "cmpl-";
    if (rid)
        snprintf(g->id, sizeof(g->id), "%s%s", prefix, rid);
    else
        snprintf(g->id, sizeof(g->id), "%s%016" PRIx64 "%08" PRIx64, prefix, s->id_base,
                 ++s->id_seq);
    snprintf(g->item_id, sizeof(g->item_id), "msg_%s", strchr(g->id, '_') ? strchr(g->id, '_') + 1
                                                                        : g->id);
}

/* Choices: where each prompt's answer starts (a continuation?), its seed and plan. */
static void plan_choices(struct sim *s, struct sim_gen *g)
{
    g->n_choices = (int)g->r.n_prompts * g->r.n;
    g->choices = xcalloc((size_t)g->n_choices, sizeof(*g->choices));
    g->steps = 1;
    bool natural = s->quality == SIM_MODE_GOOD;
    for (size_t p = 0; p < g->r.n_prompts; p++) {
        const struct sim_prompt *pr = &g->r.prompts[p];
        struct sim_text_origin o;
        sim_text_locate(pr->ids.v, pr->ids.n, &o);
        bool fs = sim_text_first_space(pr->ids.v, o.split);
        for (int k = 0; k < g->r.n; k++) {
            struct gen_choice *c = &g->choices[p * (size_t)g->r.n + (size_t)k];
            c->prompt = (int)p;
            c->seed = sim_text_seed(o.hash, (o.k + k) % SIM_TEXT_MAX_K);
            c->done0 = o.m;
            c->first_space = fs;
            if (natural) {
                c->planned = sim_text_plan_from(c->seed, c->done0, g->r.max_tokens,
                                                g->r.min_tokens, g->r.ignore_eos, &c->stopped);
            } else {
                c->planned = g->r.max_tokens; /* a broken model does not stop */
                c->stopped = false;
            }
            c->ids = xcalloc((size_t)MOTOR_MAX(c->planned, 1), sizeof(*c->ids));
            c->modes = xcalloc((size_t)MOTOR_MAX(c->planned, 1), 1);
            g->steps = MOTOR_MAX(g->steps, c->planned);
        }
        if (o.found)
            log_debug("sim_continuation", LF_INT("prompt", p), LF_INT("split", o.split),
                      LF_INT("continued_tokens", o.m), LF_INT("choice", o.k));
    }
}

static void handle_infer(struct httpd_req *req, struct sim *s, enum sim_api api)
{
    if (sim_refuse(s, req))
        return;
    char jmsg[200];
    json_t *body = httpd_req_json(req, jmsg, sizeof(jmsg));
    if (!body) {
        sim_respond_error(req, 400, NULL, "malformed JSON body: %s", jmsg);
        return;
    }
    const char *names[64];
    struct sim_req_limits lim;
    sim_limits(s, &lim, names, ARRAY_LEN(names));
    struct sim_gen *g = xcalloc(1, sizeof(*g));
    struct sim_err err;
    int rc = sim_req_parse(body, api, &lim, &g->r, &err);
    json_decref(body);
    if (!rc && g->r.logprobs > s->args.max_logprobs) {
        sim_err_set(&err, 400, api == SIM_API_COMPLETIONS ? "logprobs" : "top_logprobs",
                    "Requested sample logprobs of %d, which is greater than max allowed: %d",
                    g->r.logprobs, s->args.max_logprobs);
        sim_req_release(&g->r);
        rc = -EINVAL;
    }
    if (rc) {
        free(g);
        sim_respond_error(req, err.status, err.param, "%s", err.message);
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
    plan_choices(s, g);
    g->prompt_tokens = sim_req_prompt_tokens(&g->r);
    reactor_timer_init(&g->timer, gen_tick, g);
    httpd_req_on_close(req, gen_on_close, g);
    log_debug("sim_request", LF_STR("request_id", g->id), LF_INT("api", (int)api),
              LF_INT("prompt_tokens", g->prompt_tokens), LF_INT("max_tokens", g->r.max_tokens),
              LF_BOOL("stream", g->r.stream), LF_INT("leg", (int)g->r.leg));
    if (g->r.leg == SIM_LEG_DECODE)
        gen_fetch(g);
    else if (g->r.leg == SIM_LEG_TRIGGER)
        gen_trigger(g);
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

static void on_responses(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, SIM_API_RESPONSES);
}

static void on_messages(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, SIM_API_MESSAGES);
}

/* ---- server -------------------------------------------------------------------------- */

static bool wildcard_host(const char *h)
{
    return !h || !*h || !strcmp(h, "0.0.0.0") || !strcmp(h, "::") || !strcmp(h, "[::]");
}

int sim_engine_start(struct sim *s)
{
    static const char *const quiet[] = {"/health", "/metrics", NULL};
    struct httpd_config cfg = {
        .name = "engine-sim",
        .host = s->args.host,
        .port = (uint16_t)s->args.port,
        .max_body = (size_t)1 << 20,
        .quiet_paths = quiet,
        /* vLLM (uvicorn) has no connection limit unless asked for one */
        .max_connections =
            s->args.max_connections > 0 ? (unsigned)s->args.max_connections : (unsigned)(1u << 30),
        /* --ssl-*: the same transport as every Motor listener (conn.h); libssl is loaded
         * only when they are given. */
        .tls_cert_file = s->args.ssl_certfile,
        .tls_key_file = s->args.ssl_keyfile,
        .tls_ca_file = s->args.ssl_cert_reqs > 0 ? s->args.ssl_ca_certs : NULL,
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
    httpd_route(h, "POST", "/v1/completions", on_completions, s, 0);
    httpd_route(h, "POST", "/v1/chat/completions", on_chat, s, 0);
    httpd_route(h, "POST", "/v1/responses", on_responses, s, 0);
    httpd_route(h, "POST", "/v1/messages", on_messages, s, 0);
    sim_api_routes(s);
    reactor_timer_init(&s->dying_timer, on_dying, s);

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
    if (s->r) {
        reactor_timer_stop(s->r, &s->ft_timer);
        reactor_timer_stop(s->r, &s->dying_timer);
    }
}
