/* The inference API on a worker reactor: OpenAI routes, routing (§9.4) and the
 * proxied-request state machine.
 *
 * One client request (struct preq) runs one or more attempts. An attempt picks a route
 * from the worker's current snapshot and starts its legs:
 *   single     one leg (union instance, or a prefill/decode one as hybrid fallback)
 *   vllm PD    prefill leg (non-streaming, max_tokens=1) -> ticket -> decode leg
 *   sglang PD  prefill and decode legs concurrently, both with the bootstrap fields
 * The "main" leg (decode or single) is what the client sees. Until its first byte goes
 * out the request is not committed: any failure (transport error, 5xx, bad ticket) is
 * charged to the instance's breaker and the request is retried on another pair after a
 * backoff. Once committed, a failure can only end the stream.
 *
 * With kv_cache_affinity or compute_length the first attempt waits for the prompt's
 * token ids (TOKENIZING: an engine's /tokenize, tokreq.h; an integer prompt is used as
 * it is): their count replaces the character estimate of the load, and with
 * kv_cache_affinity their block keys (kvidx_keys) score each candidate's cached prefix
 * in the KV index (bal_select_affinity). A tokenizer that fails or is late costs only
 * the affinity: the request is balanced on load.
 *
 * Where a request is lives in one place: its state (reqfsm.h: ROUTING, TOKENIZING,
 * PREFILL, DECODE, BUFFERING, STREAMING, BACKOFF, DONE), changed only through step() — the table
 * decides, the change is counted per worker and logged at debug level. Every terminal event goes
 * through preq_end(), the one exit path: it enters DONE (so it runs once: DONE accepts
 * no event), releases the legs, load and breaker claims and the backoff timer, counts the
 * request and its error cause, and answers the client (an HTTP answer, or the end of a
 * stream that already began). The preq itself is freed in httpd's on_close, which also
 * covers a client that went away (CLIENT_GONE: its legs are then cancelled). */
#include "coordinator/coord_internal.h"
#include "coordinator/kvidx.h"
#include "coordinator/tokreq.h"

#include "common/http1.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "coordinator/lpproj.h"
#include "coordinator/pdreq.h"
#include "coordinator/precision.h"
#include "coordinator/qcheck.h"
#include "coordinator/reqfsm.h"
#include "coordinator/reqscan.h"
#include "coordinator/resume.h"
#include "coordinator/sse.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PROXY_ERR_BODY_MAX (64u << 10) /* upstream error bodies passed through */
#define PROXY_RESP_MAX (64u << 20)     /* non-streamed upstream answers */
#define PROXY_SSE_LINE_MAX (4u << 20)
#define PROXY_SSE_EVENT_MAX (8u << 20)
#define PROXY_MAX_AVOID 32
#define PROXY_BACKOFF_MAX_MS 5000
#define PROXY_DRAIN_POLL_MS 50
#define PROXY_SAMPLE_TOKENS 16384      /* tokens a precision sample keeps */
#define PROXY_SAMPLE_TEXT (256u << 10) /* content bytes it keeps */
/* A streamed answer is recorded (the events the client got) up to this size, for a
 * continuation elsewhere should its leg fail; a longer one can only end in-band. */
#define PROXY_REC_MAX (8u << 20)
#define PROXY_TAIL 16 /* bytes kept of a union stream's end: did it end with [DONE]? */
/* Busy endpoints (closed at accept) a request may meet before that counts as a failure;
 * the first few are retried at once, then with the retry backoff (capped at 1 s). */
#define PROXY_BUSY_MAX 64
#define PROXY_BUSY_AT_ONCE 4
#define PROXY_BUSY_DELAY_MAX_MS 1000

/* Generation APIs (PD-aware) first, then the routes any instance serves. */
enum api {
    API_COMPLETIONS = 0,
    API_CHAT,
    API_RESPONSES, /* OpenAI Responses: named SSE events, no [DONE] */
    API_MESSAGES,  /* Anthropic-style messages (vLLM's): named SSE events */
    API_EMBEDDINGS,
    API_TOKENIZE,
    API_DETOKENIZE,
};
#define API_FIRST_ANY API_EMBEDDINGS /* from here: no generation, any role serves it */
static const char *const api_names[] = {"completions", "chat_completions", "responses", "messages",
                                        "embeddings",  "tokenize",         "detokenize"};
static const char *const api_paths[] = {"/v1/completions", "/v1/chat/completions", "/v1/responses",
                                        "/v1/messages",    "/v1/embeddings",       "/tokenize",
                                        "/detokenize"};

enum mode { MODE_SINGLE = 0, MODE_VLLM_PD, MODE_SGLANG_PD, MODE_VLLM_TRIGGER };
static const char *const mode_names[] = {"single", "vllm_pd", "sglang_pd", "vllm_trigger"};

enum { LEG_PREFILL = 0, LEG_MAIN = 1 };

struct preq;

struct leg {
    struct preq *pr;
    int which;
    struct httpc_req *h;
    struct instance *inst; /* borrowed from pr->snap */
    struct inst_endpoint *ep;
    int64_t tokens;
    /* The claims the leg holds, each given back once: facts about resources, not phases
     * (a vLLM prefill returns its load at the hand-off but keeps its identity for the
     * avoid list; the breaker's verdict comes with the first byte, long before the end). */
    bool load_held;
    bool brk_held; /* a breaker admission awaiting its verdict */
    bool trial;    /* that admission is the half-open trial */
    /* Facts about the body read so far. */
    bool truncated; /* we stopped reading an over-long error body on purpose */
    bool too_large; /* a success body over the cap */
    int span;       /* its span in pr->tr */
    long status;
    char *ctype;
    struct strbuf body;
};

struct preq {
    struct coord_worker *w;
    struct coord *c;
    struct httpd_req *hreq; /* NULL once closed */
    struct list_head link;  /* on the worker's live list */
    struct reqfsm fsm;      /* where the request is: the only phase it has */
    enum api api;
    /* What routing needs from the client's body (reqscan: no tree on the union route). */
    struct reqscan scan;
    const char *model; /* scan.model_name, NULL if absent */
    /* The body as a jansson tree, built only when a PD route must rewrite it. */
    json_t *body;
    /* The client asked for a streamed answer ("stream": true in its body): a property of
     * the request read once on arrival, not a phase (the phase is STREAMING). */
    bool stream;
    char rid[64];
    struct inst_snapshot *snap;
    struct csettings *set; /* the settings it started with, to its end (coord_settings.h) */
    enum mode mode;
    struct leg legs[2];
    int attempts;
    int retries;
    int busy;               /* busy endpoints met (not retries: load is not failure) */
    struct meta_wait *meta; /* trigger mode: the decode engine's callback, awaiting its prefill */
    struct {
        int64_t inst, ep;
    } avoid[PROXY_MAX_AVOID];
    int n_avoid;
    struct reactor_timer t_backoff;
    int64_t first_deadline_ms; /* first_token_timeout, checked by the worker's sweep */
    struct sse_parser sse;     /* in use while STREAMING on a PD route (sse_in_use) */
    /* Mid-stream rescheduling (streamed requests). rec holds the complete events the
     * client got (max 0: not recording: disabled, or over PROXY_REC_MAX); on the union
     * route rec also holds the bytes after the last complete event, not yet sent
     * (rec_out: what was). */
    struct strbuf rec;
    size_t rec_out;
    char tail[PROXY_TAIL]; /* union route: the stream's last bytes */
    uint8_t tail_len;
    bool done_seen;       /* the SSE parser passed data: [DONE] */
    int64_t last_byte_ms; /* STREAMING: the main leg's last byte (inter_token_timeout) */
    int reschedules;
    int64_t resched_us;      /* when the last continuation began (its gap metric) */
    struct resume_state *rs; /* set once rescheduled: what continuations splice onto */
    json_t *cont;            /* the continuation's body (in place of body) */
    char up_rid[80];         /* the upstream request id once rescheduled: rid-rN */
    int64_t start_us;
    int64_t deadline_ms;
    /* the last failure, answered when no retry is left */
    enum coord_cause fail_cause;
    int fail_status;
    char *fail_body;
    size_t fail_len;
    char *fail_ctype;
    char fail_msg[256];
    /* Precision sampling (precision.h). acc is set once this request claimed its decode
     * instance's sampling window: the engine is asked for logprobs, the client gets what
     * it asked for (proj), the sample goes to the management thread after the answer. */
    struct qck_acc *acc;
    struct lpproj proj;
    bool sample_tried;      /* the window was asked for (once per request) */
    bool sample_mixed;      /* rescheduled: two engines wrote it, it judges neither */
    int64_t samp_p, samp_d; /* the PD group of the attempt that answers (p -1: none) */
    /* A precision probe (the management thread's, by its secret header): routed to
     * this P/D pair only, never sampled. */
    bool probe;
    int64_t pin_p, pin_d;

    /* cache-aware routing */
    struct httpc_req *tok_h; /* the /tokenize call while TOKENIZING */
    int64_t prompt_tokens;   /* real count, -1 = unknown (then reqscan's estimate) */
    uint32_t matched;        /* cached prompt tokens where the last pick went */
    /* the KV Conductor's answer: matched prompt tokens per endpoint address */
    char **cond_hp;
    uint32_t *cond_tok;
    size_t n_cond;
    uint64_t *kv_keys; /* block keys of the prompt (kvidx_keys) */
    size_t n_keys;
    int kv_bs;

    /* Gateway metrics (gwm_*): what the client saw, per model and answering role. */
    int64_t first_us;                       /* the first answer byte went out (0: not yet) */
    int64_t last_ev_us;                     /* the last streamed chunk that carried an event */
    int64_t handoff_us;                     /* PD: the prefill leg's successful answer */
    int64_t n_events;                       /* streamed SSE events passed on ([DONE] included) */
    int64_t usage_prompt, usage_completion; /* the engine's "usage", -1 = not seen */
    enum wire_role ans_role; /* the role of the instance whose answer the client got */
    bool picked;             /* an endpoint was picked (queue time observed) */
    char last_ch;            /* the last streamed byte (an event boundary across chunks) */

    /* W3C trace context from the client, passed on to every leg unchanged (the
     * coordinator is not a participant: it exports no spans). [0] == 0: none. */
    char traceparent[56];
    char *tracestate;    /* NULL: none; capped at PROXY_TRACESTATE_MAX */
    struct otlp_req *tr; /* sampled for span export (otlp.h); NULL: not traced */
    int tr_route;        /* the routing span */
};

#define PROXY_TRACESTATE_MAX 512

/* A client's X-Request-Id is kept when it is 1..63 characters of [A-Za-z0-9._~:/+=@-]
 * (no spaces, quotes or controls: it goes into logs, headers and PD bodies); a longer
 * one is cut to 63. Anything else gets a fresh id. */
static size_t client_rid(const char *h, char *out, size_t cap)
{
    if (!h || !*h)
        return 0;
    size_t n = 0;
    for (; h[n] && n < cap - 1; n++) {
        unsigned char ch = (unsigned char)h[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              strchr("._~:/+=@-", ch)))
            return 0;
    }
    memcpy(out, h, n);
    out[n] = '\0';
    return n;
}

static bool is_lower_hex(const char *s, size_t n, bool *all_zero)
{
    *all_zero = true;
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
        if (s[i] != '0')
            *all_zero = false;
    }
    return true;
}

/* traceparent (W3C Trace Context level 1): "00-<32 hex trace id>-<16 hex parent id>-<2 hex
 * flags>", neither id all zeros; a higher version is read by the same prefix. */
static bool traceparent_ok(const char *h)
{
    size_t n = h ? strlen(h) : 0;
    bool z;
    if (n < 55 || !is_lower_hex(h, 2, &z) || (h[0] == 'f' && h[1] == 'f'))
        return false;
    bool v00 = h[0] == '0' && h[1] == '0';
    if ((v00 && n != 55) || (!v00 && n > 55 && h[55] != '-'))
        return false;
    if (h[2] != '-' || h[35] != '-' || h[52] != '-')
        return false;
    return is_lower_hex(h + 3, 32, &z) && !z && is_lower_hex(h + 36, 16, &z) && !z &&
           is_lower_hex(h + 53, 2, &z);
}

static void trace_context(struct preq *pr, struct httpd_req *req)
{
    const char *tp = httpd_req_header(req, "traceparent");
    if (!traceparent_ok(tp))
        return; /* an invalid traceparent is dropped, and tracestate with it (spec) */
    memcpy(pr->traceparent, tp, 55);
    pr->traceparent[55] = '\0';
    const char *ts = httpd_req_header(req, "tracestate");
    if (!ts || !*ts)
        return;
    size_t n = strlen(ts);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)ts[i] < 0x20 || (unsigned char)ts[i] > 0x7e)
            return;
    if (n > PROXY_TRACESTATE_MAX) {
        /* Cut at a list member boundary (the spec's rule for propagators that must). */
        n = PROXY_TRACESTATE_MAX;
        while (n > 0 && ts[n] != ',')
            n--;
        if (n == 0)
            return;
    }
    pr->tracestate = xstrndup(ts, n);
}

static void attempt(struct preq *pr);

/* ---- the state machine ------------------------------------------------------------- */

static enum reqfsm_state state_of(const struct preq *pr)
{
    return reqfsm_state(&pr->fsm);
}

/* The one transition function for non-terminal events (terminal ones: preq_end). False
 * when the table refused the event (logged and counted by reqfsm_step): do nothing. */
static inline __attribute__((always_inline)) bool step(struct preq *pr, enum reqfsm_event ev,
                                                       const char *cause)
{
    return reqfsm_step(&pr->fsm, ev, &pr->w->fsm_stats, pr->rid, cause) >= 0;
}

/* PD answers go through the SSE parser (internal fields are stripped per event); a
 * union answer is forwarded as it comes. */
static bool sse_in_use(const struct preq *pr, enum reqfsm_state st)
{
    return st == REQ_STREAMING &&
           (pr->mode != MODE_SINGLE || pr->rs || pr->acc || pr->api >= API_RESPONSES);
}

/* The body the legs are made from: the client's, or a continuation's. */
static json_t *req_tree(const struct preq *pr)
{
    return pr->cont ? pr->cont : pr->body;
}

/* The request id sent upstream: a continuation gets its own (the failed engine may still
 * hold the first, and a prefill ticket is per request id). */
static const char *up_rid(const struct preq *pr)
{
    return pr->reschedules ? pr->up_rid : pr->rid;
}

/* ---- small helpers ------------------------------------------------------------------- */

struct inst_snapshot *proxy_snapshot(struct coord_worker *w)
{
    uint64_t v = inst_pub_version(&w->c->pub);
    if (!w->snap || v != w->snap_version) {
        struct inst_snapshot *s = inst_pub_get(&w->c->pub);
        inst_snapshot_unref(w->snap);
        w->snap = s;
        w->snap_version = v;
    }
    return w->snap;
}

struct csettings *proxy_settings(struct coord_worker *w)
{
    uint64_t v = csettings_pub_version(&w->c->settings);
    if (!w->set || v != w->set_version) {
        struct csettings *s = csettings_pub_get(&w->c->settings);
        csettings_unref(w->set);
        w->set = s;
        w->set_version = v;
    }
    return w->set;
}

/* type: vLLM's name for the status (http1_openai_error_type) unless the caller has a
 * more precise one of vLLM's. */
static void respond_openai_error(struct httpd_req *req, int status, const char *type,
                                 const char *msg)
{
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type",
                          type ? type : http1_openai_error_type(status), "param", "code", status);
    httpd_respond_json(req, status, j);
}

/* Authorization: Bearer <key> against every configured key (no early exit, so the
 * time does not tell which key came close). */
static bool authorized(const struct csettings *set, struct httpd_req *req)
{
    if (!set->api_key_enable)
        return true;
    const char *h = httpd_req_header(req, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return false;
    const char *key = h + 7;
    while (*key == ' ')
        key++;
    bool ok = false;
    for (size_t i = 0; i < set->n_api_keys; i++)
        ok |= util_secret_equal(key, set->api_keys[i]);
    return ok;
}

static bool check_auth(struct coord *c, const struct csettings *set, struct httpd_req *req,
                       const char *api)
{
    if (authorized(set, req))
        return true;
    coord_count_error(c, CAUSE_UNAUTHORIZED);
    coord_count_request(c, api, 401);
    httpd_add_header(req, "WWW-Authenticate", "Bearer");
    respond_openai_error(req, 401, NULL,
                         "Invalid or missing API key (Authorization: Bearer <key>)");
    return false;
}

static int64_t now_ms(struct preq *pr)
{
    return reactor_now(pr->w->r);
}

/* ---- legs -------------------------------------------------------------------------- */

static void leg_verdict(struct preq *pr, struct leg *leg, int outcome)
{
    if (!leg->brk_held || !leg->inst)
        return;
    leg->brk_held = false;
    struct instance *in = leg->inst;
    bool tripped = inst_breaker_report(in, util_mono_ms(), outcome, leg->trial);
    if (tripped) {
        struct brk b;
        inst_breaker_read(in, &b);
        metrics_counter_inc(pr->c->m.breaker_trips);
        log_warn("breaker_open", LF_INT("instance_id", in->id),
                 LF_STR("role", wire_role_str(in->role)), LF_INT("trip_count", b.trip_count),
                 LF_INT("open_ms", b.cur_open_ms));
    } else if (outcome > 0 && leg->trial) {
        log_info("breaker_closed", LF_INT("instance_id", in->id),
                 LF_STR("role", wire_role_str(in->role)));
    }
    coord_count_leg(pr->c, in->role, outcome);
}

/* Stop a leg: cancel its HTTP request, give back its load, and close its breaker
 * admission without a verdict unless one was given. */
/* Trigger mode: the decode engine's POST /v1/metaserver, held until the prefill it
 * asked for has run. Its own allocation: the callback's connection may outlive the
 * request or end first (either side clears the link). */
struct meta_wait {
    struct preq *pr;
    struct httpd_req *req;
};

static void meta_closed(struct httpd_req *req, void *arg)
{
    struct meta_wait *mw = arg;
    if (mw->pr)
        mw->pr->meta = NULL;
    free(mw);
}

/* Answer the held callback (status 2xx: the decode engine generates; else its leg fails
 * with 502, naming the status). */
static void meta_answer(struct preq *pr, int status, json_t *body)
{
    struct meta_wait *mw = pr->meta;
    if (!mw) {
        json_decref(body);
        return;
    }
    pr->meta = NULL;
    mw->pr = NULL;
    httpd_respond_json(mw->req, status, body);
}

static void leg_release(struct preq *pr, struct leg *leg)
{
    if (pr->meta) /* the request moves on without this prefill: the callback is moot */
        meta_answer(pr, 503,
                    json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message",
                              "the request no longer waits for this prefill", "type",
                              "ServiceUnavailableError", "param", "code", 503));
    if (leg->h) {
        httpc_cancel(pr->w->httpc, leg->h);
        leg->h = NULL;
    }
    if (leg->load_held) {
        inst_load_release(leg->ep->load, leg->tokens);
        leg->load_held = false;
    }
    leg_verdict(pr, leg, 0);
    free(leg->ctype);
    leg->ctype = NULL;
    strbuf_release(&leg->body);
    leg->inst = NULL;
    leg->ep = NULL;
    leg->status = 0;
    leg->truncated = leg->too_large = false;
}

static void avoid_add(struct preq *pr, const struct leg *leg)
{
    if (!leg->inst || pr->n_avoid >= PROXY_MAX_AVOID)
        return;
    pr->avoid[pr->n_avoid].inst = leg->inst->id;
    pr->avoid[pr->n_avoid].ep = leg->ep->id;
    pr->n_avoid++;
}

static bool avoided(const struct preq *pr, const struct instance *in,
                    const struct inst_endpoint *ep)
{
    for (int i = 0; i < pr->n_avoid; i++)
        if (pr->avoid[i].inst == in->id && pr->avoid[i].ep == ep->id)
            return true;
    return false;
}

/* ---- the exit path ----------------------------------------------------------------- */

/* A number after "key": in a JSON text (the usage object of an answer), -1 if absent. */
static int64_t json_scan_int(const char *s, size_t n, const char *key)
{
    size_t kl = strlen(key);
    const char *end = s + n;
    for (const char *p = s; p && p + kl < end; p++) {
        p = memmem(p, (size_t)(end - p), key, kl);
        if (!p)
            break;
        const char *q = p + kl;
        while (q < end && (*q == ' ' || *q == ':'))
            q++;
        if (q < end && *q >= '0' && *q <= '9') {
            int64_t v = 0;
            while (q < end && *q >= '0' && *q <= '9' && v < INT64_MAX / 10)
                v = v * 10 + (*q++ - '0');
            return v;
        }
    }
    return -1;
}

static void gwm_first(struct preq *pr, const struct leg *leg)
{
    int64_t now = util_mono_us();
    pr->first_us = pr->last_ev_us = now;
    pr->ans_role = leg->inst ? leg->inst->role : WIRE_ROLE_UNION;
    const struct gwm *g = gwm_get(pr->w, pr->model, pr->ans_role);
    metrics_histogram_observe(g->ttft, (double)(now - pr->start_us) / 1e6);
    if (pr->handoff_us)
        metrics_histogram_observe(g->handoff, (double)(now - pr->handoff_us) / 1e6);
}

/* Streamed bytes passed on: events end at a blank line ("\n\n", also across chunks). */
static void gwm_stream(struct preq *pr, const char *data, size_t len)
{
    /* memchr, not a byte loop: this runs on every byte a stream passes on (a byte loop
     * doubled the coordinator's instructions per streamed request under callgrind). */
    int64_t k = len && data[0] == '\n' && pr->last_ch == '\n';
    const char *end = data + len;
    for (const char *p = data; (p = memchr(p, '\n', (size_t)(end - p))) != NULL; p++)
        if (p + 1 < end && p[1] == '\n')
            k++;
    if (len)
        pr->last_ch = data[len - 1];
    if (!k || !pr->first_us)
        return;
    int64_t now = util_mono_us();
    const struct gwm *g = gwm_get(pr->w, pr->model, pr->ans_role);
    metrics_histogram_observe(g->itl, (double)(now - pr->last_ev_us) / 1e6);
    pr->last_ev_us = now;
    pr->n_events += k;
}

static void gwm_end(struct preq *pr)
{
    int64_t now = util_mono_us();
    const struct gwm *g = gwm_get(pr->w, pr->model, pr->ans_role);
    metrics_histogram_observe(g->e2e, (double)(now - pr->start_us) / 1e6);
    int64_t gen = pr->usage_completion;
    if (pr->stream) {
        /* every event but the closing [DONE] and, for chat, the opening one that only
         * carries the role (a usage event, when asked for, counts) */
        int64_t tokens = pr->n_events - 1 - (pr->api == API_CHAT ? 1 : 0);
        if (tokens < 0)
            tokens = 0;
        if (gen < 0)
            gen = tokens;
        if (tokens > 1)
            metrics_histogram_observe(g->tpot, (double)(pr->last_ev_us - pr->first_us) / 1e6 /
                                                   (double)(tokens - 1));
    }
    int64_t prompt = pr->usage_prompt >= 0    ? pr->usage_prompt
                     : pr->prompt_tokens >= 0 ? pr->prompt_tokens
                                              : reqscan_estimate_tokens(&pr->scan, true);
    if (gen >= 0) {
        metrics_histogram_observe(g->completion, (double)gen);
        metrics_counter_add(g->completion_total, (uint64_t)gen);
    }
    if (prompt >= 0) {
        metrics_histogram_observe(g->prompt, (double)prompt);
        metrics_counter_add(g->prompt_total, (uint64_t)prompt);
    }
}

static void record_end(struct preq *pr, int status)
{
    coord_count_request(pr->c, api_names[pr->api], status);
    metrics_histogram_observe(pr->c->m.e2e, (double)(util_mono_us() - pr->start_us) / 1e6);
    if (status == 200 && pr->first_us)
        gwm_end(pr);
    if (pr->tr) {
        otlp_finish(pr->tr, &pr->c->otlp, pr->w->httpc, util_mono_us(), status, pr->rid,
                    api_names[pr->api], pr->model, pr->retries, pr->reschedules);
        pr->tr = NULL;
    }
}

#define NO_CAUSE (-1)

/* What the client gets. msg set: an OpenAI error {"error":{...}} (or, once streaming, an
 * in-band error event); else body (NULL: empty) passed on with ctype (NULL: JSON). */
struct answer {
    int status; /* accounted under it (499: the client went away; 200 once streaming) */
    const char *type, *msg;
    const char *ctype, *body;
    size_t len;
    const char *why; /* for the transition log when there is no msg */
};

/* The one exit path: ev is a terminal event, cause an enum coord_cause counted in
 * errors_total (NO_CAUSE: none). Ignored (logged by the table) when ev is illegal in the
 * current state — in particular a second end, since DONE takes no event. */
static void preq_end(struct preq *pr, enum reqfsm_event ev, int cause, const struct answer *a)
{
    int from = reqfsm_step(&pr->fsm, ev, &pr->w->fsm_stats, pr->rid, a->msg ? a->msg : a->why);
    if (from < 0)
        return;
    struct httpd_req *req = pr->hreq;
    bool streaming = from == REQ_STREAMING || from == REQ_RESUMING;
    if (streaming && req) {
        const char *msg = a->msg;
        char cmsg[200];
        if (!msg && a->status >= 400) {
            /* a continuation's leg refused or failed: its answer cannot be passed on */
            snprintf(cmsg, sizeof(cmsg), "the continuation of this answer failed: %s",
                     a->why ? a->why : "upstream error");
            msg = cmsg;
        }
        if (msg) {
            /* The head went out: tell the client in-band. */
            struct strbuf sb;
            strbuf_init(&sb, 4096);
            strbuf_puts(&sb, "data: {\"error\":{\"message\":");
            strbuf_put_json_string(&sb, msg);
            int code = cause == CAUSE_INFER_TIMEOUT ? 504 : 502;
            strbuf_appendf(&sb, ",\"type\":\"%s\",\"code\":%d}}\n\n", http1_openai_error_type(code),
                           code);
            httpd_stream_write(req, strbuf_str(&sb), sb.len);
            strbuf_release(&sb);
        } else if (sse_in_use(pr, (enum reqfsm_state)from)) {
            size_t n;
            const char *rest = sse_pending(&pr->sse, &n);
            if (n)
                httpd_stream_write(req, rest, n);
        } else if (from == REQ_STREAMING && pr->rec_out < pr->rec.len) {
            httpd_stream_write(req, pr->rec.buf + pr->rec_out, pr->rec.len - pr->rec_out);
        }
    }
    reactor_timer_stop(pr->w->r, &pr->t_backoff);
    if (pr->tok_h) {
        httpc_cancel(pr->w->httpc, pr->tok_h);
        pr->tok_h = NULL;
    }
    leg_release(pr, &pr->legs[LEG_PREFILL]);
    leg_release(pr, &pr->legs[LEG_MAIN]);
    if (sse_in_use(pr, (enum reqfsm_state)from))
        sse_release(&pr->sse);
    strbuf_release(&pr->rec);
    if (cause != NO_CAUSE)
        coord_count_error(pr->c, (enum coord_cause)cause);
    record_end(pr, a->status);
    if (!req)
        return;
    if (streaming) {
        httpd_stream_end(req, false);
        return;
    }
    httpd_add_header(req, "X-Request-Id", pr->rid);
    if (a->msg)
        respond_openai_error(req, a->status, a->type, a->msg);
    else
        httpd_respond(req, a->status, a->ctype ? a->ctype : "application/json",
                      a->body ? a->body : "", a->body ? a->len : 0);
}

static void abort_sent(const struct httpc_response *resp, void *arg)
{
    (void)arg;
    if (resp->error || resp->status != 200)
        log_info("abort_request_failed", LF_INT("status", resp->status),
                 LF_STR("error", resp->error_text));
}

/* SGLang: closing a leg's connection does not stop its generation (the bootstrap pair
 * would keep computing); POST /abort_request {"rid"} to each engine still holding a leg.
 * Fire and forget: nothing refers back to the request. */
static void sglang_abort(struct preq *pr)
{
    for (int i = 0; i < 2; i++) {
        struct leg *leg = &pr->legs[i];
        if (!leg->h || !leg->ep)
            continue;
        char url[320], body[160];
        snprintf(url, sizeof(url), "http://%s/abort_request", leg->ep->hostport);
        int n = snprintf(body, sizeof(body), "{\"rid\":\"%s\"}", up_rid(pr));
        struct httpc_opts o = {.method = "POST",
                               .url = url,
                               .body = body,
                               .body_len = (size_t)n,
                               .timeout_ms = 5000,
                               .connect_timeout_ms = pr->set->connect_timeout_ms};
        httpc_request(pr->w->httpc, &o, abort_sent, NULL);
        log_debug("abort_request", LF_STR("request_id", pr->rid), LF_STR("url", url));
    }
}

/* The request cannot go on because its client is gone (on_close, or defensively where
 * the body should still be readable). */
static void client_gone(struct preq *pr)
{
    if (pr->mode == MODE_SGLANG_PD && state_of(pr) != REQ_DONE)
        sglang_abort(pr);
    preq_end(pr, REQ_EV_CLIENT_GONE, CAUSE_CLIENT_DISCONNECT,
             &(struct answer){.status = 499, .why = "client connection closed"});
}

/* An upstream answer passed on as it is (the engine judged the request itself). */
static void pass_through(struct preq *pr, struct leg *leg)
{
    leg_verdict(pr, leg, 1);
    size_t len = leg->body.len;
    char *body = strbuf_take(&leg->body);
    char *ct = xstrdup(leg->ctype);
    char why[48];
    snprintf(why, sizeof(why), "engine answered HTTP %ld", leg->status);
    preq_end(pr, REQ_EV_PASS_THROUGH, CAUSE_UPSTREAM_STATUS,
             &(struct answer){
                 .status = (int)leg->status, .ctype = ct, .body = body, .len = len, .why = why});
    free(ct);
    free(body);
}

/* ---- retries ----------------------------------------------------------------------- */

static void on_backoff(struct reactor *r, void *arg)
{
    struct preq *pr = arg;
    if (step(pr, REQ_EV_RETRY_TIMER, "backoff elapsed"))
        attempt(pr);
}

/* No retry left: answer the last failure. */
static void give_up(struct preq *pr)
{
    if (pr->fail_status >= 400) {
        char *body = pr->fail_body;
        pr->fail_body = NULL;
        preq_end(pr, REQ_EV_GIVE_UP, pr->fail_cause,
                 &(struct answer){.status = pr->fail_status,
                                  .ctype = pr->fail_ctype,
                                  .body = body ? body : "",
                                  .len = body ? pr->fail_len : 0,
                                  .why = pr->fail_msg});
        free(body);
        return;
    }
    int status = pr->fail_cause == CAUSE_FIRST_TOKEN_TIMEOUT ? 504 : 502;
    preq_end(pr, REQ_EV_GIVE_UP, pr->fail_cause,
             &(struct answer){.status = status, .msg = pr->fail_msg});
}

/* The attempt failed before anything reached the client. */
static void attempt_failed(struct preq *pr, struct leg *leg, enum coord_cause cause,
                           const char *msg)
{
    struct coord *c = pr->c;
    if (leg) {
        leg_verdict(pr, leg, -1);
        avoid_add(pr, leg);
        /* A decode leg that failed after a hand-off may be the prefill's fault (its
         * engine died holding the KV): try another pair. */
        if (leg->which == LEG_MAIN && pr->mode == MODE_VLLM_PD)
            avoid_add(pr, &pr->legs[LEG_PREFILL]);
        free(pr->fail_body);
        free(pr->fail_ctype);
        pr->fail_body = NULL;
        pr->fail_ctype = NULL;
        pr->fail_status = 0;
        if (leg->status >= 400) {
            pr->fail_status = (int)leg->status;
            pr->fail_len = leg->body.len;
            pr->fail_body = strbuf_take(&leg->body);
            pr->fail_ctype = xstrdup(leg->ctype);
        }
        log_warn("upstream_failed", LF_STR("request_id", pr->rid),
                 LF_INT("instance_id", leg->inst ? leg->inst->id : -1),
                 LF_STR("endpoint", leg->ep ? leg->ep->hostport : ""),
                 LF_STR("leg",
                        leg->which == LEG_PREFILL && pr->mode != MODE_SINGLE ? "prefill" : "main"),
                 LF_INT("status", leg->status), LF_STR("error", msg),
                 LF_INT("attempt", pr->attempts));
    }
    pr->fail_cause = cause;
    snprintf(pr->fail_msg, sizeof(pr->fail_msg), "%s", msg);
    int limit = csettings_retry_limit(pr->set, cause == CAUSE_UPSTREAM_TRANSPORT);
    if (pr->retries >= limit) {
        give_up(pr);
        return;
    }
    if (!step(pr, REQ_EV_RETRY, msg))
        return;
    leg_release(pr, &pr->legs[LEG_PREFILL]);
    leg_release(pr, &pr->legs[LEG_MAIN]);
    pr->retries++;
    metrics_counter_inc(c->m.retries);
    int64_t delay = pr->set->retry_delay_ms;
    for (int i = 1; i < pr->retries && delay < PROXY_BACKOFF_MAX_MS; i++)
        delay *= 2;
    if (delay > PROXY_BACKOFF_MAX_MS)
        delay = PROXY_BACKOFF_MAX_MS;
    reactor_timer_start(pr->w->r, &pr->t_backoff, delay, 0);
}

/* The leg's engine closed the connection before answering anything — an engine at its
 * connection cap does that at accept. Load, not failure: no breaker verdict, no retry
 * spent; another endpoint is tried (at once while there may be an idle one). Bounded:
 * past PROXY_BUSY_MAX it is a failure like any other. */
static void endpoint_busy(struct preq *pr, struct leg *leg, const char *error)
{
    if (pr->busy >= PROXY_BUSY_MAX) {
        attempt_failed(pr, leg, CAUSE_UPSTREAM_TRANSPORT, error);
        return;
    }
    pr->busy++;
    metrics_counter_inc(pr->c->m.busy);
    log_debug("endpoint_busy", LF_STR("request_id", pr->rid),
              LF_INT("instance_id", leg->inst ? leg->inst->id : -1),
              LF_STR("endpoint", leg->ep ? leg->ep->hostport : ""), LF_STR("error", error),
              LF_INT("busy", pr->busy));
    avoid_add(pr, leg);
    if (!step(pr, REQ_EV_RETRY, "endpoint busy"))
        return;
    leg_release(pr, &pr->legs[LEG_PREFILL]);
    leg_release(pr, &pr->legs[LEG_MAIN]);
    int64_t delay = 0;
    if (pr->busy > PROXY_BUSY_AT_ONCE) {
        delay = MOTOR_MAX(pr->set->retry_delay_ms, (int64_t)1);
        for (int i = PROXY_BUSY_AT_ONCE + 1; i < pr->busy && delay < PROXY_BUSY_DELAY_MAX_MS; i++)
            delay *= 2;
        delay = MOTOR_MIN(delay, (int64_t)PROXY_BUSY_DELAY_MAX_MS);
    }
    reactor_timer_start(pr->w->r, &pr->t_backoff, delay, 0);
}

/* ---- main-leg output --------------------------------------------------------------- */

/* Keep what the client got, for a continuation (stop recording past the cap). */
static void rec_note(struct preq *pr, const char *data, size_t len)
{
    if (!pr->rec.max)
        return;
    if (!pr->rec.buf)
        strbuf_grow(&pr->rec, MOTOR_MAX(len, (size_t)4096));
    if (strbuf_append(&pr->rec, data, len) < 0) {
        strbuf_release(&pr->rec);
        pr->rec.max = 0;
        return;
    }
    pr->rec_out = pr->rec.len;
}

/* A sampled answer's JSON (a body or one event's data): into the sample, and projected
 * to what the client asked for. True with *out (heap, *out_len) set; false when it is
 * not JSON of that shape (then it goes to the client as it is: fail-open). */
static bool sample_json(struct preq *pr, const char *d, size_t dl, char **out, size_t *out_len)
{
    json_t *j = json_loadb(d, dl, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return false;
    }
    qck_acc_add_response(pr->acc, j);
    json_decref(j);
    struct strbuf sb;
    strbuf_init(&sb, dl + 64);
    if (lpproj_rewrite(&pr->proj, d, dl, &sb) < 0) {
        strbuf_release(&sb);
        return false;
    }
    *out_len = sb.len;
    *out = strbuf_take(&sb);
    return *out != NULL;
}

/* Write one event of a sampled stream: data projected, every other byte of the event
 * the engine's own (s: data already rewritten, NULL: data as it came). */
static int sampled_event(struct preq *pr, const char *raw, size_t raw_len, const char *data,
                         size_t data_len, char *s)
{
    char *p;
    size_t pl;
    if (!sample_json(pr, s ? s : data, s ? strlen(s) : data_len, &p, &pl)) {
        int rc;
        if (s) {
            char *ev = xasprintf("data: %s\n\n", s);
            rc = httpd_stream_write(pr->hreq, ev, strlen(ev));
            rec_note(pr, ev, strlen(ev));
            free(ev);
        } else {
            rc = httpd_stream_write(pr->hreq, raw, raw_len);
            rec_note(pr, raw, raw_len);
        }
        return rc;
    }
    const char *at = s ? NULL : memmem(raw, raw_len, data, data_len);
    struct strbuf ev;
    strbuf_init(&ev, raw_len + pl + 16);
    if (at) {
        size_t off = (size_t)(at - raw);
        strbuf_append(&ev, raw, off);
        strbuf_append(&ev, p, pl);
        strbuf_append(&ev, raw + off + data_len, raw_len - off - data_len);
    } else {
        strbuf_puts(&ev, "data: ");
        strbuf_append(&ev, p, pl);
        strbuf_puts(&ev, "\n\n");
    }
    int rc = httpd_stream_write(pr->hreq, strbuf_str(&ev), ev.len);
    rec_note(pr, strbuf_str(&ev), ev.len);
    strbuf_release(&ev);
    free(p);
    return rc;
}

static int on_sse_event(const char *raw, size_t raw_len, const char *data, size_t data_len,
                        bool has_data, void *arg)
{
    struct preq *pr = arg;
    if (!pr->hreq)
        return 1;
    int rc;
    json_t *j = NULL;
    if (has_data && data_len == 6 && memcmp(data, "[DONE]", 6) == 0)
        pr->done_seen = true;
    else if (has_data && pr->api == API_RESPONSES &&
             (memmem(data, data_len, "\"response.completed\"", 20) ||
              memmem(data, data_len, "\"response.incomplete\"", 21) ||
              memmem(data, data_len, "\"response.failed\"", 17)))
        pr->done_seen = true; /* the Responses API's last event (it sends no [DONE]) */
    else if (has_data && pr->api == API_MESSAGES && memmem(data, data_len, "\"message_stop\"", 14))
        pr->done_seen = true;
    if (pr->rs && has_data && data_len && data[0] == '{' &&
        (j = json_loadb(data, data_len, 0, NULL)) && json_is_object(j)) {
        /* a continuation: its events become part of the first answer */
        if (!resume_rewrite(j, pr->rs)) {
            json_decref(j);
            return 0;
        }
        char *s = json_dumps(j, JSON_COMPACT);
        if (pr->acc) {
            rc = sampled_event(pr, raw, raw_len, data, data_len, s ? s : "{}");
        } else {
            char *ev = xasprintf("data: %s\n\n", s ? s : "{}");
            rc = httpd_stream_write(pr->hreq, ev, strlen(ev));
            rec_note(pr, ev, strlen(ev));
            free(ev);
        }
        free(s);
    } else if (has_data && pdreq_has_internal(data, data_len) &&
               (j = json_loadb(data, data_len, 0, NULL)) && pdreq_strip_response(j)) {
        char *s = json_dumps(j, JSON_COMPACT);
        if (pr->acc) {
            rc = sampled_event(pr, raw, raw_len, data, data_len, s ? s : "{}");
        } else {
            char *ev = xasprintf("data: %s\n\n", s ? s : "{}");
            rc = httpd_stream_write(pr->hreq, ev, strlen(ev));
            rec_note(pr, ev, strlen(ev));
            free(ev);
        }
        free(s);
    } else if (pr->acc && has_data && data_len && data[0] == '{') {
        rc = sampled_event(pr, raw, raw_len, data, data_len, NULL);
    } else {
        rc = httpd_stream_write(pr->hreq, raw, raw_len);
        rec_note(pr, raw, raw_len);
    }
    json_decref(j);
    return rc < 0 ? 1 : 0;
}

/* The answer completed: the sample goes to the management thread (precision.h). */
static void sample_finish(struct preq *pr)
{
    if (!pr->acc)
        return;
    struct qck_acc *a = pr->acc;
    pr->acc = NULL;
    if (pr->sample_mixed) {
        qck_acc_release(a);
        free(a);
        return;
    }
    prec_submit(pr->c, pr->samp_p, pr->samp_d, a);
}

static void sample_drop(struct preq *pr)
{
    if (!pr->acc)
        return;
    qck_acc_release(pr->acc);
    free(pr->acc);
    pr->acc = NULL;
}

/* The end of the last complete event in rec[lo..len) (a blank line: LF LF or LF CR LF),
 * or lo when there is none. */
static size_t rec_boundary(const struct strbuf *rec, size_t lo)
{
    const char *b = rec->buf;
    for (size_t i = rec->len; i >= lo + 2 && i >= 2; i--)
        if (b[i - 1] == '\n' &&
            (b[i - 2] == '\n' || (i >= 3 && b[i - 2] == '\r' && b[i - 3] == '\n')))
            return i;
    return lo;
}

/* The union route: the stream's last PROXY_TAIL bytes. */
static void tail_note(struct preq *pr, const char *data, size_t len)
{
    if (len >= PROXY_TAIL) {
        memcpy(pr->tail, data + len - PROXY_TAIL, PROXY_TAIL);
        pr->tail_len = PROXY_TAIL;
        return;
    }
    size_t keep = MOTOR_MIN((size_t)pr->tail_len, PROXY_TAIL - len);
    memmove(pr->tail, pr->tail + pr->tail_len - keep, keep);
    memcpy(pr->tail + keep, data, len);
    pr->tail_len = (uint8_t)(keep + len);
}

/* The union route with recording: forward complete events only, so that a continuation
 * splices onto a clean event boundary. */
static int rec_forward(struct preq *pr, const char *data, size_t len)
{
    if (!pr->rec.buf)
        strbuf_grow(&pr->rec, MOTOR_MAX(len, (size_t)4096)); /* one allocation, not six */
    if (strbuf_append(&pr->rec, data, len) < 0) {
        /* too long to re-send: forward everything from now on, as without recording */
        tail_note(pr, pr->rec.buf, pr->rec.len);
        tail_note(pr, data, len);
        int rc = 0;
        if (pr->rec_out < pr->rec.len)
            rc = httpd_stream_write(pr->hreq, pr->rec.buf + pr->rec_out, pr->rec.len - pr->rec_out);
        strbuf_release(&pr->rec);
        pr->rec.max = 0;
        pr->rec_out = 0;
        return rc ? rc : httpd_stream_write(pr->hreq, data, len);
    }
    size_t end = rec_boundary(&pr->rec, pr->rec_out);
    if (end == pr->rec_out)
        return 0;
    int rc = httpd_stream_write(pr->hreq, pr->rec.buf + pr->rec_out, end - pr->rec_out);
    pr->rec_out = end;
    return rc;
}

/* Did the stream end as a finished OpenAI stream does, with data: [DONE]? */
static bool stream_finished(const struct preq *pr)
{
    if (pr->mode != MODE_SINGLE || pr->rs || pr->acc || pr->api >= API_RESPONSES)
        return pr->done_seen;
    /* recording: the stream is in rec; else its last bytes are in tail */
    const char *t = pr->rec.max ? pr->rec.buf : pr->tail;
    size_t n = pr->rec.max ? pr->rec.len : pr->tail_len;
    if (!t)
        return false;
    while (n && (t[n - 1] == '\n' || t[n - 1] == '\r'))
        n--;
    return n >= 6 && memcmp(t + n - 6, "[DONE]", 6) == 0;
}

/* The main leg's first byte of a 2xx answer (state DECODE): the breaker's verdict, and
 * for a streamed request the response head (the request is committed). */
static void first_byte(struct preq *pr, struct leg *leg)
{
    if (!pr->stream) {
        if (step(pr, REQ_EV_BODY_START, NULL))
            leg_verdict(pr, leg, 1);
        return;
    }
    bool resumed = state_of(pr) == REQ_RESUMING;
    if (!step(pr, REQ_EV_STREAM_START, NULL))
        return;
    leg_verdict(pr, leg, 1);
    pr->last_byte_ms = now_ms(pr);
    if (resumed) {
        /* A continuation: the head went out long ago; its events are spliced. */
        int64_t gap_us = util_mono_us() - pr->resched_us;
        metrics_histogram_observe(pr->c->m.reschedule_gap, (double)gap_us / 1e6);
        log_info("stream_resumed", LF_STR("request_id", pr->rid),
                 LF_INT("instance_id", leg->inst->id), LF_INT("gap_ms", gap_us / 1000),
                 LF_INT("reschedules", pr->reschedules));
        sse_init(&pr->sse, PROXY_SSE_LINE_MAX, PROXY_SSE_EVENT_MAX);
        return;
    }
    if (pr->set->reschedule_enable && pr->set->max_reschedule > 0)
        strbuf_init(&pr->rec, PROXY_REC_MAX);
    metrics_histogram_observe(pr->c->m.ttft, (double)(util_mono_us() - pr->start_us) / 1e6);
    gwm_first(pr, leg);
    httpd_add_header(pr->hreq, "X-Request-Id", pr->rid);
    httpd_add_header(pr->hreq, "Cache-Control", "no-cache");
    httpd_stream_begin(pr->hreq, 200, leg->ctype ? leg->ctype : "text/event-stream");
    if (sse_in_use(pr, REQ_STREAMING))
        sse_init(&pr->sse, PROXY_SSE_LINE_MAX, PROXY_SSE_EVENT_MAX);
}

static int leg_on_status(long status, const char *ctype, void *arg)
{
    struct leg *leg = arg;
    leg->status = status;
    free(leg->ctype);
    leg->ctype = xstrdup(ctype);
    bool ok = status >= 200 && status < 300;
    strbuf_release(&leg->body);
    strbuf_init(&leg->body, ok ? PROXY_RESP_MAX : PROXY_ERR_BODY_MAX);
    return 0;
}

static int leg_on_chunk(const char *data, size_t len, void *arg)
{
    struct leg *leg = arg;
    struct preq *pr = leg->pr;
    bool ok = leg->status >= 200 && leg->status < 300;
    if (!ok || leg->which == LEG_PREFILL || !pr->stream) {
        if (leg->body.max == 0)
            strbuf_init(&leg->body, ok ? PROXY_RESP_MAX : PROXY_ERR_BODY_MAX);
        /* An error answer is not a first token: the request may still be retried. */
        if (ok && leg->which == LEG_MAIN && state_of(pr) == REQ_DECODE)
            first_byte(pr, leg);
        if (strbuf_append(&leg->body, data, len) < 0) {
            size_t room = leg->body.max - leg->body.len;
            strbuf_append(&leg->body, data, room);
            if (ok)
                leg->too_large = true;
            else
                leg->truncated = true;
            return 1;
        }
        return 0;
    }
    /* The streamed main leg. */
    enum reqfsm_state st = state_of(pr);
    if (st == REQ_DECODE || st == REQ_RESUMING)
        first_byte(pr, leg);
    if (!pr->hreq || state_of(pr) != REQ_STREAMING)
        return 1;
    pr->last_byte_ms = now_ms(pr);
    gwm_stream(pr, data, len);
    int rc;
    if (sse_in_use(pr, REQ_STREAMING)) {
        rc = sse_feed(&pr->sse, data, len, on_sse_event, pr);
        if (rc == -E2BIG) {
            log_warn("upstream_sse_oversized", LF_STR("request_id", pr->rid));
            preq_end(pr, REQ_EV_BROKEN, CAUSE_UPSTREAM_PROTOCOL,
                     &(struct answer){.status = 200, .msg = "upstream SSE event too large"});
            return 1;
        }
    } else {
        if (pr->rec.max) {
            rc = rec_forward(pr, data, len);
        } else {
            tail_note(pr, data, len);
            rc = httpd_stream_write(pr->hreq, data, len);
        }
    }
    /* A gone client: on_close follows and cancels everything. */
    return rc != 0 ? 1 : 0;
}

static bool preq_tree(struct preq *pr);

/* A streamed leg failed after the head went out (state STREAMING): continue the answer
 * on another instance (mid-stream rescheduling). False when it cannot be: disabled, the
 * bound reached, not recorded, a request shape resume_body refuses — why says which.
 * True when the request went on (RESUMING) or was answered. */
static bool reschedule(struct preq *pr, struct leg *leg, const char *error, const char **why)
{
    char err[160];
    if (!pr->set->reschedule_enable) {
        *why = "reschedule_config.enable is off";
        return false;
    }
    if (pr->reschedules >= pr->set->max_reschedule) {
        *why = "reschedule_config.max_reschedule reached";
        return false;
    }
    if (!pr->rec.max) {
        *why = "the answer so far is over the recording limit";
        return false;
    }
    if (pr->api != API_COMPLETIONS && pr->api != API_CHAT) {
        *why = "only completions and chat completions are continued";
        return false;
    }
    if (!pr->hreq)
        return false;
    if (!preq_tree(pr))
        return true; /* answered */
    struct resume_state *rs = xcalloc(1, sizeof(*rs));
    json_t *cont = NULL;
    if (resume_scan(pr->rec.buf ? pr->rec.buf : "", pr->rec_out, pr->api == API_CHAT, rs, err,
                    sizeof(err)) == 0 &&
        !rs->finished)
        cont = resume_body(pr->body, rs, err, sizeof(err));
    if (rs->finished && !cont) {
        /* Every token arrived, only the end is missing: finish the stream ourselves. */
        resume_release(rs);
        free(rs);
        if (sse_in_use(pr, REQ_STREAMING))
            sse_release(&pr->sse);
        pr->rec.len = pr->rec_out; /* an unfinished event stays unsent */
        if (pr->hreq)
            httpd_stream_write(pr->hreq, "data: [DONE]\n\n", 14);
        log_info("stream_end_supplied", LF_STR("request_id", pr->rid), LF_STR("error", error));
        preq_end(pr, REQ_EV_COMPLETE, NO_CAUSE, &(struct answer){.status = 200});
        return true;
    }
    if (!cont) {
        resume_release(rs);
        free(rs);
        snprintf(pr->fail_msg, sizeof(pr->fail_msg), "cannot continue: %s", err);
        *why = pr->fail_msg;
        return false;
    }
    if (sse_in_use(pr, REQ_STREAMING))
        sse_release(&pr->sse);
    if (!step(pr, REQ_EV_RESCHEDULE, error)) {
        json_decref(cont);
        resume_release(rs);
        free(rs);
        return true;
    }
    avoid_add(pr, leg);
    leg_release(pr, &pr->legs[LEG_PREFILL]);
    leg_release(pr, &pr->legs[LEG_MAIN]);
    /* what was received after the last complete event was never sent: dropped */
    pr->rec.len = pr->rec_out;
    if (pr->rec.buf)
        pr->rec.buf[pr->rec.len] = '\0';
    if (pr->rs) {
        resume_release(pr->rs);
        free(pr->rs);
    }
    pr->rs = rs;
    json_decref(pr->cont);
    pr->cont = cont;
    pr->reschedules++;
    pr->sample_mixed = true; /* still projected, no longer judged */
    pr->done_seen = false;
    snprintf(pr->up_rid, sizeof(pr->up_rid), "%s-r%d", pr->rid, pr->reschedules);
    pr->resched_us = util_mono_us();
    pr->first_deadline_ms = now_ms(pr) + pr->set->first_token_timeout_ms;
    metrics_counter_inc(pr->c->m.reschedules);
    log_warn("stream_rescheduled", LF_STR("request_id", pr->rid),
             LF_INT("instance_id", leg->inst ? leg->inst->id : -1), LF_STR("error", error),
             LF_INT("tokens_sent", rs->tokens), LF_STR("by", rs->ids ? "token_ids" : "text"),
             LF_INT("reschedule", pr->reschedules));
    /* from the reactor, not from inside the failed leg's callback */
    reactor_timer_start(pr->w->r, &pr->t_backoff, 0, 0);
    return true;
}

/* A streamed leg failed after the head went out: rescheduled, or ended in-band. */
static void stream_failed(struct preq *pr, struct leg *leg, enum coord_cause cause,
                          const char *error, const char *msg)
{
    leg_verdict(pr, leg, -1);
    const char *why = "the client is gone";
    if (reschedule(pr, leg, error, &why))
        return;
    metrics_counter_inc(pr->c->m.reschedule_refused);
    log_warn("upstream_stream_broken", LF_STR("request_id", pr->rid),
             LF_INT("instance_id", leg->inst ? leg->inst->id : -1), LF_STR("error", error),
             LF_STR("not_rescheduled", why));
    preq_end(pr, REQ_EV_BROKEN, cause, &(struct answer){.status = 200, .msg = msg});
}

static void main_done(struct preq *pr, struct leg *leg, const struct httpc_response *resp)
{
    bool cut = leg->truncated || leg->too_large;
    if (resp->no_reply && (state_of(pr) == REQ_DECODE || state_of(pr) == REQ_RESUMING)) {
        endpoint_busy(pr, leg, resp->error_text);
        return;
    }
    if (resp->error && !cut) {
        if (state_of(pr) == REQ_STREAMING) {
            stream_failed(pr, leg, CAUSE_UPSTREAM_TRANSPORT, resp->error_text,
                          "upstream connection lost mid-stream");
            return;
        }
        attempt_failed(pr, leg, CAUSE_UPSTREAM_TRANSPORT, resp->error_text);
        return;
    }
    if (leg->too_large) {
        preq_end(pr, REQ_EV_FAIL, CAUSE_UPSTREAM_PROTOCOL,
                 &(struct answer){.status = 502,
                                  .msg = "upstream response exceeds the coordinator's limit"});
        return;
    }
    if (leg->status >= 500 || leg->status < 200) {
        char msg[96];
        snprintf(msg, sizeof(msg), "upstream answered HTTP %ld", leg->status);
        attempt_failed(pr, leg, CAUSE_UPSTREAM_STATUS, msg);
        return;
    }
    if (leg->status >= 300) {
        /* The engine judged the request itself (4xx): the instance is fine and another
         * one would say the same. Pass the answer through. */
        pass_through(pr, leg);
        return;
    }
    enum reqfsm_state st = state_of(pr);
    if (st == REQ_DECODE || st == REQ_RESUMING)
        first_byte(pr, leg); /* a 2xx answer without a body */
    if (pr->stream) {
        /* A clean end is not a finished answer: an engine stopped (SIGTERM) closes its
         * streams cleanly, mid-answer. */
        if (!stream_finished(pr)) {
            stream_failed(pr, leg, CAUSE_UPSTREAM_PROTOCOL, "stream ended without [DONE]",
                          "upstream stream ended before the answer was finished");
            return;
        }
        preq_end(pr, REQ_EV_COMPLETE, NO_CAUSE, &(struct answer){.status = 200});
        sample_finish(pr);
        return;
    }
    /* A body framed by chunks can end cleanly half-way: scanned whole. One framed by
     * Content-Length is what the engine meant to send: only its last byte is checked. */
    if (resp->length_framed ? !resume_json_closed(strbuf_str(&leg->body), leg->body.len)
                            : !resume_json_complete(strbuf_str(&leg->body), leg->body.len)) {
        /* nothing reached the client: the whole request is tried again */
        attempt_failed(pr, leg, CAUSE_UPSTREAM_PROTOCOL,
                       "upstream body ended before its JSON document did");
        return;
    }
    metrics_histogram_observe(pr->c->m.ttft, (double)(util_mono_us() - pr->start_us) / 1e6);
    gwm_first(pr, leg);
    pr->usage_prompt = json_scan_int(strbuf_str(&leg->body), leg->body.len, "\"prompt_tokens\"");
    pr->usage_completion =
        json_scan_int(strbuf_str(&leg->body), leg->body.len, "\"completion_tokens\"");
    size_t len = leg->body.len;
    char *body = strbuf_take(&leg->body);
    char *ct = xstrdup(leg->ctype);
    if (pr->mode != MODE_SINGLE && body && pdreq_has_internal(body, len)) {
        json_t *j = json_loadb(body, len, 0, NULL);
        if (j && pdreq_strip_response(j)) {
            free(body);
            body = json_dumps(j, JSON_COMPACT);
            len = strlen(body);
            free(ct);
            ct = xstrdup("application/json");
        }
        json_decref(j);
    }
    char *proj;
    size_t pl;
    if (pr->acc && body && sample_json(pr, body, len, &proj, &pl)) {
        free(body);
        body = proj;
        len = pl;
    }
    preq_end(pr, REQ_EV_COMPLETE, NO_CAUSE,
             &(struct answer){.status = 200, .ctype = ct, .body = body, .len = len});
    free(ct);
    free(body);
    sample_finish(pr);
}

static void leg_start(struct preq *pr, struct leg *leg, const char *body, size_t len, bool stream);

static void prefill_done(struct preq *pr, struct leg *leg, const struct httpc_response *resp)
{
    enum reqfsm_state st = state_of(pr);
    if (pr->mode == MODE_VLLM_TRIGGER && !resp->error && leg->status >= 200 && leg->status < 300) {
        /* The prefill ran: tell the waiting decode engine (it generates now). */
        json_t *j = json_loadb(strbuf_str(&leg->body), leg->body.len, 0, NULL);
        json_t *kv = json_incref(json_object_get(j, "kv_transfer_params"));
        json_decref(j);
        meta_answer(pr, 200, kv ? kv : json_object());
        if (!step(pr, REQ_EV_PREFILL_DONE, "trigger prefill done"))
            return;
        leg_verdict(pr, leg, 1);
        if (leg->load_held) {
            inst_load_release(leg->ep->load, leg->tokens);
            leg->load_held = false;
        }
        strbuf_release(&leg->body);
        return;
    }
    if (pr->mode == MODE_SGLANG_PD && (st == REQ_BUFFERING || st == REQ_STREAMING)) {
        /* The decode side already answers: the prefill's outcome only feeds its
         * breaker, the client's request goes on (or fails) with the decode leg. */
        bool ok = !resp->error && leg->status >= 200 && leg->status < 500;
        if (!step(pr, REQ_EV_PREFILL_DONE, ok ? "prefill done" : "prefill failed late"))
            return;
        leg_verdict(pr, leg, ok ? 1 : -1);
        leg_release(pr, leg);
        return;
    }
    if (resp->no_reply) {
        endpoint_busy(pr, leg, resp->error_text);
        return;
    }
    if (resp->error && !leg->truncated) {
        attempt_failed(pr, leg, CAUSE_UPSTREAM_TRANSPORT, resp->error_text);
        return;
    }
    if (leg->status >= 500 || leg->status < 200 || leg->too_large) {
        char msg[96];
        snprintf(msg, sizeof(msg), "prefill answered HTTP %ld", leg->status);
        attempt_failed(pr, leg, CAUSE_UPSTREAM_STATUS, msg);
        return;
    }
    if (leg->status >= 300) {
        pass_through(pr, leg);
        return;
    }
    if (pr->mode == MODE_SGLANG_PD) {
        /* The decode leg carries the answer; the prefill only had to succeed. */
        if (!step(pr, REQ_EV_PREFILL_DONE, "prefill done"))
            return;
        leg_verdict(pr, leg, 1);
        leg_release(pr, leg);
        return;
    }
    json_t *j = json_loadb(strbuf_str(&leg->body), leg->body.len, 0, NULL);
    json_t *ticket = NULL;
    char err[160];
    int rc = pdreq_vllm_ticket(j, &ticket, err, sizeof(err));
    json_decref(j);
    if (rc < 0) {
        attempt_failed(pr, leg, CAUSE_UPSTREAM_PROTOCOL, err);
        return;
    }
    if (!step(pr, REQ_EV_TICKET, NULL)) {
        json_decref(ticket);
        return;
    }
    leg_verdict(pr, leg, 1);
    /* Keep the prefill's identity for the avoid list, drop its request and load. */
    if (leg->load_held) {
        inst_load_release(leg->ep->load, leg->tokens);
        leg->load_held = false;
    }
    strbuf_release(&leg->body);
    json_t *d = pdreq_vllm_decode(req_tree(pr), up_rid(pr), ticket);
    json_decref(ticket);
    char *s = json_dumps(d, JSON_COMPACT);
    json_decref(d);
    leg_start(pr, &pr->legs[LEG_MAIN], s, strlen(s), pr->stream);
    free(s);
}

static void leg_on_done(const struct httpc_response *resp, void *arg)
{
    struct leg *leg = arg;
    struct preq *pr = leg->pr;
    leg->h = NULL;
    if (pr->tr)
        otlp_span_close(pr->tr, leg->span, util_mono_us(), (int)leg->status,
                        resp->error != 0 || leg->status >= 500);
    if (leg->which == LEG_PREFILL && !resp->error && leg->status >= 200 && leg->status < 300)
        pr->handoff_us = util_mono_us();
    if (leg->which == LEG_PREFILL)
        prefill_done(pr, leg, resp);
    else
        main_done(pr, leg, resp);
}

static void leg_start(struct preq *pr, struct leg *leg, const char *body, size_t len, bool stream)
{
    leg->pr = pr;
    bool prefill_only = leg->which == LEG_PREFILL && pr->mode != MODE_SINGLE;
    leg->tokens = reqscan_estimate_tokens(&pr->scan, prefill_only);
    if (pr->prompt_tokens >= 0) /* the real count instead of characters / 4 + 1 */
        leg->tokens += pr->prompt_tokens - reqscan_estimate_tokens(&pr->scan, true);
    /* The engine computes what it does not hold: a cached prefix is not its load. */
    if (leg->which == LEG_PREFILL || pr->mode == MODE_SINGLE)
        leg->tokens = MOTOR_MAX((int64_t)1, leg->tokens - (int64_t)pr->matched);
    inst_load_acquire(leg->ep->load, leg->tokens);
    leg->load_held = true;
    if (pr->tr) {
        int64_t now = util_mono_us();
        if (!pr->picked)
            otlp_span_close(pr->tr, pr->tr_route, now, 0, false);
        enum wire_role role = leg->inst->role;
        static const char *const leg_names[] = {[WIRE_ROLE_UNION] = "leg union",
                                                [WIRE_ROLE_PREFILL] = "leg prefill",
                                                [WIRE_ROLE_DECODE] = "leg decode"};
        leg->span = otlp_span_open(
            pr->tr, (unsigned)role < WIRE_ROLE_COUNT && leg_names[role] ? leg_names[role] : "leg",
            3, now, &pr->w->rng);
        if (leg->span >= 0) {
            struct otlp_span *sp = &pr->tr->spans[leg->span];
            sp->instance_id = leg->inst->id;
            snprintf(sp->endpoint, sizeof(sp->endpoint), "%s", leg->ep->hostport);
            snprintf(sp->role, sizeof(sp->role), "%s", wire_role_str(role));
        }
    }
    if (!pr->picked) {
        pr->picked = true;
        const struct gwm *g = gwm_get(pr->w, pr->model, leg->inst->role);
        metrics_histogram_observe(g->queue, (double)(util_mono_us() - pr->start_us) / 1e6);
    }
    /* Per leg, so assembled without printf or the heap (hostport is an address). */
    char url[320], rid_hdr[96];
    size_t hl = strnlen(leg->ep->hostport, sizeof(url) - 64);
    size_t pl = strlen(api_paths[pr->api]);
    bool tls = pr->set->engine_tls;
    size_t sl = tls ? 8 : 7;
    memcpy(url, tls ? "https://" : "http://", sl);
    memcpy(url + sl, leg->ep->hostport, hl);
    memcpy(url + sl + hl, api_paths[pr->api], pl + 1);
    const char *rid = up_rid(pr);
    size_t rl = strnlen(rid, sizeof(pr->up_rid));
    memcpy(rid_hdr, "X-Request-Id: ", 14);
    memcpy(rid_hdr + 14, rid, rl);
    rid_hdr[14 + rl] = '\0';
    char tp_hdr[72];
    const char *hdrs[5] = {rid_hdr,
                           stream ? "Accept: text/event-stream" : "Accept: application/json"};
    char *ts_hdr = NULL;
    if (pr->tr && leg->span >= 0) {
        /* a participant: the engine's spans are children of this leg's */
        char tp[56];
        otlp_traceparent(pr->tr, leg->span, tp);
        snprintf(tp_hdr, sizeof(tp_hdr), "traceparent: %s", tp);
        hdrs[2] = tp_hdr;
        if (pr->tracestate) {
            ts_hdr = xasprintf("tracestate: %s", pr->tracestate);
            hdrs[3] = ts_hdr;
        }
    } else if (pr->traceparent[0]) {
        snprintf(tp_hdr, sizeof(tp_hdr), "traceparent: %s", pr->traceparent);
        hdrs[2] = tp_hdr;
        if (pr->tracestate) {
            ts_hdr = xasprintf("tracestate: %s", pr->tracestate);
            hdrs[3] = ts_hdr;
        }
    }
    int64_t left = pr->deadline_ms - now_ms(pr);
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = body,
        .body_len = len,
        .content_type = "application/json",
        .headers = hdrs,
        .timeout_ms = (left > 0 ? left : 1) + 1000,
        .connect_timeout_ms = pr->set->connect_timeout_ms,
        .max_response = PROXY_RESP_MAX,
        .on_status = leg_on_status,
        .on_chunk = leg_on_chunk,
        .tls = tls ? &pr->set->engine_tls_opts : NULL,
    };
    log_debug("upstream_leg", LF_STR("request_id", pr->rid), LF_STR("url", url),
              LF_INT("instance_id", leg->inst->id), LF_BOOL("stream", stream));
    leg->h = httpc_request(pr->w->httpc, &o, leg_on_done, leg);
    free(ts_hdr);
}
/* ---- routing ----------------------------------------------------------------------- */

struct pick_ctx {
    struct preq *pr;
    const char *model;        /* "" or NULL: any */
    const struct instance *p; /* for the decode pick: the prefill it must match */
    bool strict;              /* honour the avoid list */
    int64_t now;
    int64_t only; /* >= 0: this instance only (a precision probe's pin) */
};

static bool model_ok(const struct instance *in, const char *model)
{
    return !model || !*model || !in->model_name[0] || strcmp(in->model_name, model) == 0;
}

static bool pick_filter(struct instance *in, const struct inst_endpoint *ep, void *arg)
{
    struct pick_ctx *x = arg;
    if (!model_ok(in, x->model))
        return false;
    if (x->p) {
        if (in->engine != x->p->engine)
            return false;
        if (x->p->model_name[0] && in->model_name[0] && strcmp(in->model_name, x->p->model_name))
            return false;
    }
    if (x->only >= 0 && in->id != x->only)
        return false;
    if (x->strict && avoided(x->pr, in, ep))
        return false;
    return inst_breaker_peek(in, x->now);
}

/* The KV index's matched prefix, in tokens (bal_match_fn). */
static void kv_match(void *ctx, const char *const *hostports, size_t m, uint32_t *tokens)
{
    struct preq *pr = ctx;
    struct kvidx *x = atomic_load_explicit(&pr->c->kvidx, memory_order_acquire);
    if (!x) {
        memset(tokens, 0, m * sizeof(*tokens));
        return;
    }
    kvidx_match(x, pr->kv_keys, pr->n_keys, pr->kv_bs, hostports, m, tokens);
    /* Approximate chunks are text: counted as the balancer's characters / 4. */
    uint32_t per = pr->set->approx ? KVIDX_TEXT_CHUNK / 4 : (uint32_t)pr->kv_bs;
    for (size_t j = 0; j < m; j++)
        tokens[j] *= per;
}

/* The conductor's scores (bal_match_fn). */
static void cond_match(void *ctx, const char *const *hostports, size_t m, uint32_t *tokens)
{
    struct preq *pr = ctx;
    for (size_t j = 0; j < m; j++) {
        tokens[j] = 0;
        for (size_t i = 0; i < pr->n_cond; i++)
            if (!strcmp(pr->cond_hp[i], hostports[j]))
                tokens[j] = pr->cond_tok[i];
    }
}

static int select_ep(struct preq *pr, enum wire_role role, struct pick_ctx *x, struct bal_pick *p)
{
    struct inst_snapshot *s = pr->snap;
    const struct csettings *set = pr->set;
    if (role != WIRE_ROLE_DECODE)
        pr->matched = 0; /* the pick of the leg that computes the prompt sets it */
    /* Cache affinity for the leg that computes the prompt (not a PD decode). */
    if ((set->policy == BAL_KV_UNIFIED || set->policy == BAL_KV_LOAD_GATED) &&
        (pr->n_keys || pr->n_cond) && role != WIRE_ROLE_DECODE) {
        int64_t prompt =
            pr->prompt_tokens >= 0 ? pr->prompt_tokens : reqscan_estimate_tokens(&pr->scan, true);
        struct bal_affinity aff = {.match = pr->n_cond ? cond_match : kv_match,
                                   .ctx = pr,
                                   .prompt_tokens = prompt,
                                   .req_tokens = reqscan_estimate_tokens(&pr->scan, false) -
                                                 reqscan_estimate_tokens(&pr->scan, true) + prompt,
                                   .gate = set->load_gate_factor};
        int rc =
            bal_select_affinity(set->policy, set->instance_score_weight, s->routable[role],
                                s->n_routable[role], pick_filter, x, &pr->c->rr[role], &aff, p);
        struct kvidx *ix = atomic_load_explicit(&pr->c->kvidx, memory_order_acquire);
        if (rc == 0 && set->approx && ix) {
            /* What this endpoint will have cached once it computed the prompt. */
            struct kvidx_stats st = {0};
            kvidx_learn(ix, p->ep->hostport, pr->kv_keys, pr->n_keys, KVIDX_TEXT_CHUNK,
                        set->approx_chunks, &st);
        }
        pr->matched = rc == 0 ? aff.matched : 0;
        if (rc == 0) {
            metrics_counter_add(pr->c->m.prefix_prompt_tokens, (uint64_t)prompt);
            metrics_counter_add(pr->c->m.prefix_matched_tokens, aff.matched);
            log_debug("prefix_route", LF_STR("request_id", pr->rid),
                      LF_STR("endpoint", p->ep->hostport), LF_INT("prompt_tokens", prompt),
                      LF_INT("matched_tokens", aff.matched));
        }
        return rc;
    }
    return bal_select(set->policy, set->instance_score_weight, s->routable[role],
                      s->n_routable[role], pick_filter, x, &pr->c->rr[role], p);
}

/* Pick and claim (breaker admission) one endpoint of a role. */
static bool pick_role(struct preq *pr, enum wire_role role, const struct instance *pair,
                      struct leg *out)
{
    int64_t only = -1;
    if (pr->probe)
        only = role == WIRE_ROLE_PREFILL && pair == NULL && pr->pin_p >= 0 ? pr->pin_p : pr->pin_d;
    struct pick_ctx x = {pr, pr->model, pair, true, util_mono_ms(), only};
    for (int tries = 0; tries < 8; tries++) {
        struct bal_pick p;
        int rc = select_ep(pr, role, &x, &p);
        if (rc < 0 && x.strict) {
            /* Everything was tried already: the avoid list is a preference, not a ban. */
            x.strict = false;
            rc = select_ep(pr, role, &x, &p);
        }
        if (rc < 0)
            return false;
        bool trial;
        if (inst_breaker_acquire(p.inst, x.now, &trial)) {
            out->inst = p.inst;
            out->ep = p.ep;
            out->trial = trial;
            out->brk_held = true;
            return true;
        }
        /* Lost the half-open trial to another request: look again. */
    }
    return false;
}

static void describe_fleet(struct preq *pr, char *buf, size_t cap)
{
    struct inst_snapshot *s = pr->snap;
    int64_t now = util_mono_ms();
    int open = 0;
    for (int r = 0; r < WIRE_ROLE_COUNT; r++)
        for (size_t i = 0; i < s->n_routable[r]; i++)
            if (!inst_breaker_peek(s->routable[r][i], now))
                open++;
    snprintf(buf, cap,
             "no instance available to serve model '%s': routable prefill %zu, decode %zu, "
             "union %zu (of %zu registered); %d with an open circuit breaker",
             pr->model ? pr->model : "", s->n_routable[WIRE_ROLE_PREFILL],
             s->n_routable[WIRE_ROLE_DECODE], s->n_routable[WIRE_ROLE_UNION], s->n_all, open);
}

static bool plan(struct preq *pr)
{
    struct inst_snapshot *s = pr->snap;
    struct leg *p = &pr->legs[LEG_PREFILL], *d = &pr->legs[LEG_MAIN];
    p->which = LEG_PREFILL;
    d->which = LEG_MAIN;
    if (pr->probe) {
        /* pinned: the suspect pair or nothing */
        if (pr->pin_p >= 0) {
            if (!pick_role(pr, WIRE_ROLE_PREFILL, NULL, p))
                return false;
            if (pick_role(pr, WIRE_ROLE_DECODE, p->inst, d)) {
                pr->mode = p->inst->engine == INST_ENGINE_SGLANG ? MODE_SGLANG_PD : MODE_VLLM_PD;
                return true;
            }
            leg_release(pr, p);
            return false;
        }
        pr->mode = MODE_SINGLE;
        return pick_role(pr, WIRE_ROLE_UNION, NULL, d) ||
               pick_role(pr, WIRE_ROLE_DECODE, NULL, d) ||
               pick_role(pr, WIRE_ROLE_PREFILL, NULL, d);
    }
    if (pr->api >= API_FIRST_ANY) {
        /* embeddings, tokenizer: no generation, no hand-off; any engine of the model */
        pr->mode = MODE_SINGLE;
        return pick_role(pr, WIRE_ROLE_UNION, NULL, d) ||
               pick_role(pr, WIRE_ROLE_PREFILL, NULL, d) ||
               pick_role(pr, WIRE_ROLE_DECODE, NULL, d);
    }
    bool pd_present = s->n_routable[WIRE_ROLE_PREFILL] || s->n_routable[WIRE_ROLE_DECODE];
    if (s->n_routable[WIRE_ROLE_PREFILL] && s->n_routable[WIRE_ROLE_DECODE]) {
        if (pick_role(pr, WIRE_ROLE_PREFILL, NULL, p)) {
            if (pick_role(pr, WIRE_ROLE_DECODE, p->inst, d)) {
                pr->mode = p->inst->engine == INST_ENGINE_SGLANG        ? MODE_SGLANG_PD
                           : d->inst->dispatch == WIRE_DISPATCH_TRIGGER ? MODE_VLLM_TRIGGER
                                                                        : MODE_VLLM_PD;
                return true;
            }
            leg_release(pr, p);
        }
    }
    if (pd_present && !pr->set->pd_fallback_to_hybrid && !s->n_routable[WIRE_ROLE_UNION])
        return false;
    pr->mode = MODE_SINGLE;
    if (pick_role(pr, WIRE_ROLE_UNION, NULL, d))
        return true;
    if (pd_present && !pr->set->pd_fallback_to_hybrid)
        return false;
    if (pick_role(pr, WIRE_ROLE_PREFILL, NULL, d))
        return true;
    if (pr->set->decode_colocation && pick_role(pr, WIRE_ROLE_DECODE, NULL, d))
        return true;
    return false;
}

static bool model_known(struct preq *pr)
{
    if (!pr->model || !*pr->model)
        return true;
    struct inst_snapshot *s = pr->snap;
    if (s->n_all == 0)
        return true; /* nothing registered: that is a 503, not a 404 */
    for (size_t i = 0; i < s->n_all; i++)
        if (model_ok(s->all[i], pr->model))
            return true;
    return false;
}

/* The client's body as a tree, for the PD rewrites; parsed once per request. False
 * (and the request answered) when it cannot be: the client is gone, or jansson refuses
 * what reqscan accepted (they accept the same language: tests/fuzz/fuzz_reqscan.c). */
static bool preq_tree(struct preq *pr)
{
    if (pr->body)
        return true;
    size_t len;
    const char *raw = pr->hreq ? httpd_req_body(pr->hreq, &len) : NULL;
    if (!raw) {
        client_gone(pr);
        return false;
    }
    json_error_t e;
    pr->body = json_loadb(raw, len, 0, &e);
    if (!json_is_object(pr->body)) {
        log_error("request_body_reparse_failed", LF_STR("request_id", pr->rid),
                  LF_STR("error", e.text));
        preq_end(pr, REQ_EV_REJECT, CAUSE_BAD_REQUEST,
                 &(struct answer){.status = 400,
                                  .type = "BadRequestError",
                                  .msg = "request body is not valid JSON"});
        return false;
    }
    return true;
}

/* The decode instance's sampling window was claimed: ask the engine for Motor's logprobs
 * (max of the client's and logprobs_count) and token ids, and remember what the client
 * asked for. A body whose logprobs fields the engine would judge (wrong types, top
 * logprobs without logprobs, an echo) is left alone: not sampled. */
static void sample_begin(struct preq *pr)
{
    if (!pr->body) {
        size_t len;
        const char *raw = pr->hreq ? httpd_req_body(pr->hreq, &len) : NULL;
        json_t *j = raw ? json_loadb(raw, len, 0, NULL) : NULL;
        if (!json_is_object(j)) {
            json_decref(j);
            return;
        }
        pr->body = j;
    }
    json_t *b = pr->body;
    int k_motor = pr->set->prec_logprobs;
    struct lpproj proj = {.chat = pr->api == API_CHAT};
    json_t *lp = json_object_get(b, "logprobs");
    if (pr->api == API_CHAT) {
        json_t *tl = json_object_get(b, "top_logprobs");
        bool tl_set = tl && !json_is_null(tl);
        if (tl_set &&
            (!json_is_integer(tl) || json_integer_value(tl) < 0 || json_integer_value(tl) > 20))
            return;
        if (json_is_true(lp)) {
            proj.top = tl_set ? (int)json_integer_value(tl) : 0;
        } else if (!lp || json_is_null(lp) || json_is_false(lp)) {
            if (tl_set)
                return;
            proj.strip = true;
            json_object_set_new(b, "logprobs", json_true());
        } else {
            return;
        }
        if (proj.strip || proj.top < k_motor)
            json_object_set_new(b, "top_logprobs", json_integer(k_motor));
    } else {
        if (json_is_true(json_object_get(b, "echo")))
            return; /* the prompt's logprobs would be judged as output */
        if (lp && !json_is_null(lp)) {
            if (!json_is_integer(lp) || json_integer_value(lp) < 0 || json_integer_value(lp) > 20)
                return;
            proj.top = (int)json_integer_value(lp);
        } else {
            proj.strip = true;
        }
        if (proj.strip || proj.top < k_motor)
            json_object_set_new(b, "logprobs", json_integer(k_motor));
    }
    /* Token ids make repetition exact; only where the client sees no token strings. */
    if (proj.strip && !json_object_get(b, "return_tokens_as_token_ids"))
        json_object_set_new(b, "return_tokens_as_token_ids", json_true());
    pr->proj = proj;
    pr->acc = xmalloc(sizeof(*pr->acc));
    qck_acc_init(pr->acc, PROXY_SAMPLE_TOKENS, PROXY_SAMPLE_TEXT);
    log_debug("precision_sampled", LF_STR("request_id", pr->rid),
              LF_INT("d_instance_id", pr->samp_d), LF_BOOL("client_logprobs", !proj.strip),
              LF_INT("client_top", proj.top), LF_INT("logprobs_count", k_motor));
}

/* ROUTING: pick a route and send its legs. */
static void attempt(struct preq *pr)
{
    struct inst_snapshot *s = proxy_snapshot(pr->w);
    if (pr->snap != s) {
        inst_snapshot_unref(pr->snap);
        pr->snap = inst_snapshot_ref(s);
    }
    pr->attempts++;
    if (pr->attempts == 1 && !model_known(pr)) {
        char msg[320];
        snprintf(msg, sizeof(msg), "The model `%s` does not exist.", pr->model);
        preq_end(pr, REQ_EV_REJECT, CAUSE_MODEL_NOT_FOUND,
                 &(struct answer){.status = 404, .type = "NotFoundError", .msg = msg});
        return;
    }
    if (!plan(pr)) {
        if (pr->retries > 0 && (pr->fail_status || pr->fail_msg[0])) {
            give_up(pr);
            return;
        }
        char msg[320];
        describe_fleet(pr, msg, sizeof(msg));
        log_warn("no_instance", LF_STR("request_id", pr->rid), LF_STR("reason", msg));
        preq_end(pr, REQ_EV_REJECT, CAUSE_NO_INSTANCE, &(struct answer){.status = 503, .msg = msg});
        return;
    }
    struct leg *p = &pr->legs[LEG_PREFILL], *d = &pr->legs[LEG_MAIN];
    log_debug("route", LF_STR("request_id", pr->rid), LF_STR("mode", mode_names[pr->mode]),
              LF_INT("prefill_instance", p->inst ? p->inst->id : -1),
              LF_INT("main_instance", d->inst->id), LF_INT("attempt", pr->attempts));
    if (!pr->cont) { /* a continuation keeps the sample's group: it is not judged */
        pr->samp_p = pr->mode != MODE_SINGLE ? p->inst->id : -1;
        pr->samp_d = d->inst->id;
    }
    if (!pr->sample_tried && !pr->probe && pr->set->prec_enable) {
        pr->sample_tried = true;
        if (prec_claim(pr->c, pr->set, d->inst, now_ms(pr)))
            sample_begin(pr);
    }
    switch (pr->mode) {
    case MODE_SINGLE: {
        if (pr->cont) {
            if (!step(pr, REQ_EV_SENT, mode_names[pr->mode]))
                return;
            char *cs = json_dumps(pr->cont, JSON_COMPACT);
            leg_start(pr, d, cs, strlen(cs), pr->stream);
            free(cs);
            break;
        }
        size_t len;
        const char *raw = pr->hreq ? httpd_req_body(pr->hreq, &len) : NULL;
        if (!raw) {
            client_gone(pr);
            return;
        }
        if (!step(pr, REQ_EV_SENT, mode_names[pr->mode]))
            return;
        if (pr->acc) { /* the sampled body */
            char *sb = json_dumps(pr->body, JSON_COMPACT);
            leg_start(pr, d, sb, strlen(sb), pr->stream);
            free(sb);
        } else {
            leg_start(pr, d, raw, len, pr->stream);
        }
        break;
    }
    case MODE_VLLM_PD: {
        if (!preq_tree(pr))
            return;
        if (!step(pr, REQ_EV_HANDOFF, mode_names[pr->mode]))
            return;
        json_t *b = pdreq_vllm_prefill(req_tree(pr), up_rid(pr));
        if (pr->api == API_RESPONSES) /* its budget key: the prefill computes one token */
            json_object_set_new(b, "max_output_tokens", json_integer(1));
        char *sb = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        leg_start(pr, p, sb, strlen(sb), false);
        free(sb);
        break;
    }
    case MODE_VLLM_TRIGGER: {
        /* Decode first: the engine calls this worker's metaserver back for its prefill
         * (h_metaserver), then generates. */
        if (!preq_tree(pr))
            return;
        if (!step(pr, REQ_EV_SENT, mode_names[pr->mode]))
            return;
        const char *host = pr->c->cfg.host;
        if (!*host || !strcmp(host, "0.0.0.0") || !strcmp(host, "::"))
            host = "127.0.0.1";
        bool v6 = strchr(host, ':') != NULL;
        char url[200];
        snprintf(url, sizeof(url), "http://%s%s%s:%u/v1/metaserver?attempt=%d", v6 ? "[" : "", host,
                 v6 ? "]" : "", (unsigned)pr->w->meta_port, pr->attempts);
        json_t *ticket = json_pack("{s:b, s:b, s:s}", "do_remote_prefill", 1, "do_remote_decode", 0,
                                   "metaserver", url);
        json_t *db = pdreq_vllm_decode(req_tree(pr), up_rid(pr), ticket);
        json_decref(ticket);
        char *ds = json_dumps(db, JSON_COMPACT);
        json_decref(db);
        leg_start(pr, d, ds, strlen(ds), pr->stream);
        free(ds);
        break;
    }
    case MODE_SGLANG_PD: {
        if (!preq_tree(pr))
            return;
        if (!step(pr, REQ_EV_SENT, mode_names[pr->mode]))
            return;
        uint64_t room = pdreq_bootstrap_room(p->inst->id, d->inst->id, pr->rid, pr->attempts);
        json_t *pb = pdreq_sglang_leg(req_tree(pr), true, p->ep->ip, p->ep->bootstrap_port, room,
                                      up_rid(pr));
        json_t *db = pdreq_sglang_leg(req_tree(pr), false, p->ep->ip, p->ep->bootstrap_port, room,
                                      up_rid(pr));
        char *ps = json_dumps(pb, JSON_COMPACT), *ds = json_dumps(db, JSON_COMPACT);
        json_decref(pb);
        json_decref(db);
        leg_start(pr, p, ps, strlen(ps), false);
        leg_start(pr, d, ds, strlen(ds), pr->stream);
        free(ps);
        free(ds);
        break;
    }
    }
}

/* ---- timers ------------------------------------------------------------------------ */

/* The verdict on the engines holding a request that timed out. */
static void legs_timed_out(struct preq *pr)
{
    for (int i = 0; i < 2; i++)
        if (pr->legs[i].h)
            leg_verdict(pr, &pr->legs[i], -1);
}

/* PREFILL, DECODE, BACKOFF: nothing of an answer yet. */
static void on_first_timeout(struct preq *pr)
{
    legs_timed_out(pr);
    char trail[160];
    reqfsm_trail(&pr->fsm, trail, sizeof(trail));
    log_warn("first_token_timeout", LF_STR("request_id", pr->rid),
             LF_INT("timeout_ms", pr->set->first_token_timeout_ms),
             LF_INT("instance_id", pr->legs[LEG_MAIN].inst ? pr->legs[LEG_MAIN].inst->id : -1),
             LF_STR("states", trail));
    preq_end(pr, REQ_EV_FIRST_TIMEOUT, CAUSE_FIRST_TOKEN_TIMEOUT,
             &(struct answer){
                 .status = 504,
                 .msg = "no first token from the inference engine within first_token_timeout"});
}

static void on_total_timeout(struct preq *pr)
{
    bool streaming = state_of(pr) == REQ_STREAMING || state_of(pr) == REQ_RESUMING;
    char trail[160];
    reqfsm_trail(&pr->fsm, trail, sizeof(trail));
    log_warn("infer_timeout", LF_STR("request_id", pr->rid),
             LF_INT("timeout_ms", pr->set->infer_timeout_ms), LF_BOOL("streaming", streaming),
             LF_STR("states", trail));
    if (streaming) {
        preq_end(pr, REQ_EV_TOTAL_TIMEOUT, CAUSE_INFER_TIMEOUT,
                 &(struct answer){.status = 200, .msg = "request exceeded infer_timeout"});
        return;
    }
    legs_timed_out(pr);
    preq_end(pr, REQ_EV_TOTAL_TIMEOUT, CAUSE_INFER_TIMEOUT,
             &(struct answer){.status = 504, .msg = "request exceeded infer_timeout"});
}

/* STREAMING, and nothing from the engine for inter_token_timeout: a hung engine holds
 * its connections open; the leg has failed as surely as a reset one. */
static void on_stall(struct preq *pr)
{
    struct leg *leg = &pr->legs[LEG_MAIN];
    log_warn("inter_token_timeout", LF_STR("request_id", pr->rid),
             LF_INT("timeout_ms", pr->set->inter_token_timeout_ms),
             LF_INT("instance_id", leg->inst ? leg->inst->id : -1));
    if (leg->h) {
        httpc_cancel(pr->w->httpc, leg->h);
        leg->h = NULL;
    }
    stream_failed(pr, leg, CAUSE_INTER_TOKEN_TIMEOUT, "no byte within inter_token_timeout",
                  "the inference engine stopped sending (inter_token_timeout)");
}

/* Deadlines are checked by one periodic timer per worker rather than two timers per
 * request (arming and disarming them per request was a visible cost when reactor timers
 * were backed by a timerfd; the sweep is still the cheaper shape). The granularity
 * (sweep_ms, a tenth of the shortest timeout, 10..100 ms) is far below any sensible
 * timeout. */
static void on_sweep(struct reactor *r, void *arg)
{
    struct coord_worker *w = arg;
    int64_t now = reactor_now(r);
    struct list_head *n, *tmp;
    list_for_each_safe(n, tmp, &w->live)
    {
        /* answering never frees pr (on_close does, later) */
        struct preq *pr = list_entry(n, struct preq, link);
        switch (state_of(pr)) {
        case REQ_TOKENIZING:
        case REQ_PREFILL:
        case REQ_DECODE:
        case REQ_BACKOFF:
        case REQ_RESUMING:
            if (now >= pr->first_deadline_ms)
                on_first_timeout(pr);
            else if (now >= pr->deadline_ms)
                on_total_timeout(pr);
            break;
        case REQ_BUFFERING:
            if (now >= pr->deadline_ms)
                on_total_timeout(pr);
            break;
        case REQ_STREAMING:
            if (now >= pr->deadline_ms)
                on_total_timeout(pr);
            else if (pr->set->inter_token_timeout_ms > 0 &&
                     now - pr->last_byte_ms >= pr->set->inter_token_timeout_ms)
                on_stall(pr);
            break;
        case REQ_ROUTING: /* synchronous: never seen here */
        case REQ_DONE:    /* answered, waiting for on_close */
            break;
        }
    }
    if (w->n_live == 0)
        reactor_timer_stop(r, &w->sweep);
}

/* ---- lifecycle --------------------------------------------------------------------- */

static void worker_maybe_stop(struct coord_worker *w)
{
    if (w->draining && w->n_live == 0)
        reactor_stop(w->r);
}

static void on_close(struct httpd_req *req, void *arg)
{
    struct preq *pr = arg;
    pr->hreq = NULL;
    if (state_of(pr) != REQ_DONE) {
        char trail[160];
        reqfsm_trail(&pr->fsm, trail, sizeof(trail));
        log_info("client_disconnected", LF_STR("request_id", pr->rid),
                 LF_BOOL("streaming", state_of(pr) == REQ_STREAMING), LF_STR("states", trail));
        client_gone(pr);
    }
    struct coord_worker *w = pr->w;
    list_remove(&pr->link);
    w->n_live--;
    metrics_gauge_dec(pr->c->m.inflight);
    sample_drop(pr); /* an answer that did not complete: no sample */
    json_decref(pr->body);
    json_decref(pr->cont);
    if (pr->rs) {
        resume_release(pr->rs);
        free(pr->rs);
    }
    reqscan_release(&pr->scan);
    inst_snapshot_unref(pr->snap);
    csettings_unref(pr->set);
    free(pr->fail_body);
    free(pr->fail_ctype);
    free(pr->kv_keys);
    for (size_t i = 0; i < pr->n_cond; i++)
        free(pr->cond_hp[i]);
    free(pr->cond_hp);
    free(pr->cond_tok);
    free(pr->tracestate);
    free(pr->tr); /* never answered (record_end exports and clears it) */
    free(pr);
    worker_maybe_stop(w);
}

/* ---- tokenization (kv_cache_affinity, compute_length) ------------------------------ */

/* The prompt's ids are known: keep their count and, for the KV index, their block keys
 * at the block size the engines reported. */
static void use_tokens(struct preq *pr, uint32_t *ids, size_t n)
{
    pr->prompt_tokens = (int64_t)n;
    struct kvidx *x = atomic_load_explicit(&pr->c->kvidx, memory_order_acquire);
    if (x && (pr->set->policy == BAL_KV_UNIFIED || pr->set->policy == BAL_KV_LOAD_GATED)) {
        struct inst_snapshot *s = pr->snap;
        int bs = 0;
        for (int r = 0; !bs && r < WIRE_ROLE_COUNT; r++)
            for (size_t i = 0; !bs && i < s->n_routable[r]; i++)
                for (size_t j = 0; !bs && j < s->routable[r][i]->n_eps; j++)
                    bs = kvidx_block_size(x, s->routable[r][i]->eps[j].hostport);
        if (bs > 0 && n / (size_t)bs > 0) {
            pr->kv_keys = xmalloc(n / (size_t)bs * sizeof(uint64_t));
            pr->n_keys = kvidx_keys(ids, n, bs, pr->kv_keys, n / (size_t)bs);
            pr->kv_bs = bs;
        }
    }
    free(ids);
}

static void tokenized(struct preq *pr, const char *why)
{
    if (why) {
        metrics_counter_inc(pr->c->m.tokenize_failed);
        /* Once per power of two: an engine without /tokenize would log every request. */
        uint64_t nf = (uint64_t)metrics_counter_value(pr->c->m.tokenize_failed);
        if ((nf & (nf - 1)) == 0)
            log_warn("tokenize_failed", LF_STR("request_id", pr->rid), LF_STR("error", why),
                     LF_STR("using", "load_balance"), LF_INT("failures", (int64_t)nf));
    } else {
        metrics_counter_inc(pr->c->m.tokenize_ok);
    }
    if (step(pr, REQ_EV_TOKENIZED, why ? why : "tokens"))
        attempt(pr);
}

static void on_tokenized(const struct httpc_response *resp, void *arg)
{
    struct preq *pr = arg;
    pr->tok_h = NULL;
    char why[128];
    uint32_t *ids;
    size_t n;
    if (resp->error) {
        snprintf(why, sizeof(why), "/tokenize: %s", resp->error_text);
    } else if (resp->status != 200) {
        snprintf(why, sizeof(why), "/tokenize answered HTTP %ld", resp->status);
    } else if (tokreq_parse(resp->body, resp->body_len, &ids, &n) < 0) {
        snprintf(why, sizeof(why), "/tokenize answered no token ids");
    } else {
        use_tokens(pr, ids, n);
        tokenized(pr, NULL);
        return;
    }
    tokenized(pr, why);
}

/* An engine that can tokenize for this request: a routable prefill or union endpoint of
 * its model, in turn. */
static const struct inst_endpoint *tokenizer_ep(struct preq *pr)
{
    struct inst_snapshot *s = pr->snap;
    static const enum wire_role roles[] = {WIRE_ROLE_UNION, WIRE_ROLE_PREFILL};
    size_t count = 0;
    int64_t now = util_mono_ms();
    for (int pass = 0; pass < 2; pass++) {
        size_t pick = pass ? (size_t)(pr->w->seq % count) : 0, k = 0;
        for (size_t r = 0; r < ARRAY_LEN(roles); r++)
            for (size_t i = 0; i < s->n_routable[roles[r]]; i++) {
                struct instance *in = s->routable[roles[r]][i];
                if (!model_ok(in, pr->model) || !inst_breaker_peek(in, now))
                    continue;
                for (size_t j = 0; j < in->n_eps; j++) {
                    if (!inst_ep_routable(&in->eps[j]))
                        continue;
                    if (pass && k == pick)
                        return &in->eps[j];
                    k++;
                }
            }
        count = k;
        if (!count)
            return NULL;
    }
    return NULL;
}

/* ---- the KV Conductor (conductor.c has the wire) ------------------------------------ */

static void cond_failed(struct preq *pr, const char *why)
{
    metrics_counter_inc(pr->c->m.conductor_failed);
    uint64_t nf = (uint64_t)metrics_counter_value(pr->c->m.conductor_failed);
    if ((nf & (nf - 1)) == 0)
        log_warn("kv_conductor_unreachable", LF_STR("request_id", pr->rid), LF_STR("error", why),
                 LF_STR("using", "load_balance"), LF_INT("failures", (int64_t)nf));
}

/* {"scores": {"ip:port": tokens, ...}}: false when it is not that. */
static bool cond_parse(struct preq *pr, const char *body, size_t len)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    json_t *sc = json_object_get(j, "scores");
    if (!json_is_object(sc)) {
        json_decref(j);
        return false;
    }
    size_t n = json_object_size(sc), k = 0;
    pr->cond_hp = xcalloc(n ? n : 1, sizeof(char *));
    pr->cond_tok = xcalloc(n ? n : 1, sizeof(uint32_t));
    const char *key;
    json_t *v;
    json_object_foreach(sc, key, v)
    {
        json_int_t t = json_is_integer(v) ? json_integer_value(v) : -1;
        if (t < 0 || t > (json_int_t)TOKREQ_MAX_TOKENS)
            continue;
        pr->cond_hp[k] = xstrdup(key);
        pr->cond_tok[k++] = (uint32_t)t;
    }
    pr->n_cond = k;
    json_decref(j);
    return true;
}

static void on_cond_answer(const struct httpc_response *resp, void *arg)
{
    struct preq *pr = arg;
    pr->tok_h = NULL;
    char why[128] = "";
    if (resp->error)
        snprintf(why, sizeof(why), "conductor: %s", resp->error_text);
    else if (resp->status != 200)
        snprintf(why, sizeof(why), "conductor answered HTTP %ld", resp->status);
    else if (!cond_parse(pr, resp->body, resp->body_len))
        snprintf(why, sizeof(why), "conductor answered no scores");
    if (why[0])
        cond_failed(pr, why);
    else
        metrics_counter_inc(pr->c->m.conductor_ok);
    if (step(pr, REQ_EV_TOKENIZED, why[0] ? why : "conductor scores"))
        attempt(pr);
}

/* ROUTING -> TOKENIZING while the conductor is asked (it tokenizes itself). */
static void conductor_query(struct preq *pr)
{
    pr->snap = inst_snapshot_ref(proxy_snapshot(pr->w));
    if (!preq_tree(pr))
        return;
    json_t *b = tokreq_body(pr->body, pr->api == API_CHAT);
    if (!b) {
        uint32_t *ids;
        size_t n;
        if (pr->api != API_COMPLETIONS || tokreq_prompt_ids(pr->body, &ids, &n) != 1) {
            attempt(pr);
            return;
        }
        free(ids);
        b = json_object();
        json_object_set(b, "prompt", json_object_get(pr->body, "prompt"));
    }
    if (pr->model)
        json_object_set_new(b, "model", json_string(pr->model));
    if (!step(pr, REQ_EV_TOKENIZE, "conductor")) {
        json_decref(b);
        return;
    }
    char *url = conductor_url(pr->set->conductor, "/query");
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct httpc_opts o = {.method = "POST",
                           .url = url,
                           .body = body,
                           .body_len = strlen(body),
                           .content_type = "application/json",
                           .timeout_ms = pr->set->tokenize_timeout_ms,
                           .connect_timeout_ms = pr->set->tokenize_timeout_ms,
                           .max_response = 4u << 20};
    pr->tok_h = httpc_request(pr->w->httpc, &o, on_cond_answer, pr);
    free(body);
    free(url);
}

/* The prompt as text, for approximate prefixes: a completion's prompt string, or a
 * chat's messages (role and text content of each, with separators). */
static void prompt_text(const json_t *body, bool chat, struct strbuf *out)
{
    if (!chat) {
        json_t *p = json_object_get(body, "prompt");
        if (json_is_array(p) && json_array_size(p) >= 1)
            p = json_array_get(p, 0);
        if (json_is_string(p))
            strbuf_append(out, json_string_value(p), json_string_length(p));
        return;
    }
    json_t *msgs = json_object_get(body, "messages"), *m;
    size_t i;
    json_array_foreach(msgs, i, m)
    {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (json_is_string(role))
            strbuf_puts(out, json_string_value(role));
        strbuf_putc(out, '\x1f');
        if (json_is_string(content)) {
            strbuf_append(out, json_string_value(content), json_string_length(content));
        } else if (json_is_array(content)) {
            json_t *part;
            size_t k;
            json_array_foreach(content, k, part)
            {
                json_t *t = json_object_get(part, "text");
                if (json_is_string(t))
                    strbuf_append(out, json_string_value(t), json_string_length(t));
            }
        }
        strbuf_putc(out, '\x1e');
    }
}

static void approx_keys(struct preq *pr)
{
    if (!preq_tree(pr))
        return;
    struct strbuf sb;
    strbuf_init(&sb, 64u << 20);
    prompt_text(pr->body, pr->api == API_CHAT, &sb);
    size_t nk = sb.len / KVIDX_TEXT_CHUNK;
    if (nk) {
        pr->kv_keys = xmalloc(nk * sizeof(uint64_t));
        pr->n_keys = kvidx_text_keys(sb.buf, sb.len, pr->kv_keys, nk);
        pr->kv_bs = KVIDX_TEXT_CHUNK;
    }
    strbuf_release(&sb);
    attempt(pr);
}

/* ROUTING -> TOKENIZING, or straight to the first attempt when the ids are in the
 * request, when it is not one prompt, or when no engine can tokenize it. */
static void tokenize(struct preq *pr)
{
    pr->snap = inst_snapshot_ref(proxy_snapshot(pr->w));
    if (!preq_tree(pr))
        return;
    uint32_t *ids;
    size_t n;
    if (pr->api == API_COMPLETIONS && tokreq_prompt_ids(pr->body, &ids, &n) == 1) {
        use_tokens(pr, ids, n);
        attempt(pr);
        return;
    }
    const struct inst_endpoint *ep = tokenizer_ep(pr);
    json_t *b = ep ? tokreq_body(pr->body, pr->api == API_CHAT) : NULL;
    if (!b) {
        attempt(pr);
        return;
    }
    if (!step(pr, REQ_EV_TOKENIZE, ep->hostport)) {
        json_decref(b);
        return;
    }
    char url[320];
    bool tls = pr->set->engine_tls;
    snprintf(url, sizeof(url), "%s://%s/tokenize", tls ? "https" : "http", ep->hostport);
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct httpc_opts o = {.method = "POST",
                           .url = url,
                           .body = body,
                           .body_len = strlen(body),
                           .content_type = "application/json",
                           .timeout_ms = pr->set->tokenize_timeout_ms,
                           .connect_timeout_ms = pr->set->tokenize_timeout_ms,
                           .max_response = 32u << 20,
                           .tls = tls ? &pr->set->engine_tls_opts : NULL};
    pr->tok_h = httpc_request(pr->w->httpc, &o, on_tokenized, pr);
    free(body);
}

/* "motor-<boot>-<worker>-<seq>" into rid (64 bytes). */
static void make_rid(struct coord_worker *w, char *rid)
{
    if (!w->rid_prefix_len) {
        int n = snprintf(w->rid_prefix, sizeof(w->rid_prefix), "motor-%08x-%02x-",
                         (unsigned)(w->c->start_wall_ms & 0xffffffff), w->idx);
        w->rid_prefix_len = n > 0 ? MOTOR_MIN((size_t)n, sizeof(w->rid_prefix) - 1) : 0;
    }
    memcpy(rid, w->rid_prefix, w->rid_prefix_len);
    size_t idn = util_fmt_hex64(rid + w->rid_prefix_len, ++w->seq);
    rid[w->rid_prefix_len + idn] = '\0';
}

void proxy_live_add(struct coord_worker *w)
{
    w->n_live++;
    metrics_gauge_inc(w->c->m.inflight);
}

void proxy_live_done(struct coord_worker *w)
{
    w->n_live--;
    metrics_gauge_dec(w->c->m.inflight);
    worker_maybe_stop(w);
}

static void handle_infer(struct httpd_req *req, struct coord_worker *w, enum api api)
{
    struct coord *c = w->c;
    struct csettings *set = proxy_settings(w);
    if (!check_auth(c, set, req, api_names[api]))
        return;
    if (!coord_refuse_standby(c, req, api_names[api]))
        return;
    if (w->draining || atomic_load_explicit(&c->stopping, memory_order_relaxed)) {
        coord_count_error(c, CAUSE_SHUTDOWN);
        coord_count_request(c, api_names[api], 503);
        respond_openai_error(req, 503, NULL, "coordinator is shutting down");
        return;
    }
    char err[256];
    size_t body_len;
    const char *raw = httpd_req_body(req, &body_len);
    struct reqscan scan;
    const char *why = NULL;
    if (!raw || body_len == 0) {
        memset(&scan, 0, sizeof(scan));
        why = "request body is empty";
    } else if (reqscan_parse(raw, body_len, &scan, err, sizeof(err)) < 0) {
        why = err;
    } else if (scan.top != REQSCAN_OBJECT) {
        why = "request body must be a JSON object";
    } else if (scan.stream != REQSCAN_ABSENT && scan.stream != REQSCAN_TRUE &&
               scan.stream != REQSCAN_FALSE && scan.stream != REQSCAN_NULL) {
        why = "'stream' must be a boolean";
    } else if (scan.model != REQSCAN_ABSENT && scan.model != REQSCAN_STRING &&
               scan.model != REQSCAN_NULL) {
        why = "'model' must be a string";
    } else if ((api == API_CHAT || api == API_MESSAGES) && scan.messages != REQSCAN_ARRAY) {
        why = "'messages' must be an array";
    } else if (api == API_COMPLETIONS && scan.prompt == REQSCAN_ABSENT) {
        why = "'prompt' is required";
    }
    if (why) {
        reqscan_release(&scan);
        coord_count_error(c, CAUSE_BAD_REQUEST);
        coord_count_request(c, api_names[api], 400);
        respond_openai_error(req, 400, "BadRequestError", why);
        return;
    }
    /* PD mode: a hand-off takes one prompt and one choice, other shapes fan out
     * (fanout.c). Only a body that may hold one is parsed here (the PD route parses it
     * anyway: the tree is kept). */
    json_t *tree = NULL;
    struct inst_snapshot *snap = proxy_snapshot(w);
    if (api <= API_CHAT && snap->n_routable[WIRE_ROLE_PREFILL] &&
        snap->n_routable[WIRE_ROLE_DECODE] && !httpd_req_header(req, "X-Motor-Fanout") &&
        (scan.prompt == REQSCAN_ARRAY || memmem(raw, body_len, "\"n\"", 3) ||
         memmem(raw, body_len, "\"best_of\"", 9))) {
        tree = json_loadb(raw, body_len, 0, NULL);
        int np, n, bo;
        if (json_is_object(tree) && fanout_shape(tree, api == API_CHAT, &np, &n, &bo) > 1) {
            char rid[64];
            make_rid(w, rid);
            reqscan_release(&scan);
            fanout_start(w, req, api == API_CHAT, tree, api_names[api], rid);
            return;
        }
        if (!json_is_object(tree)) {
            json_decref(tree);
            tree = NULL;
        }
    }
    struct preq *pr = xcalloc(1, sizeof(*pr));
    pr->body = tree;
    pr->w = w;
    pr->c = c;
    pr->hreq = req;
    pr->api = api;
    pr->scan = scan;
    reqfsm_init(&pr->fsm);
    pr->stream = scan.stream == REQSCAN_TRUE;
    pr->model = scan.model_name;
    pr->start_us = util_mono_us();
    pr->set = csettings_ref(set);
    pr->deadline_ms = reactor_now(w->r) + set->infer_timeout_ms;
    pr->legs[LEG_PREFILL].pr = pr;
    pr->legs[LEG_MAIN].pr = pr;
    pr->legs[LEG_PREFILL].which = LEG_PREFILL;
    pr->legs[LEG_MAIN].which = LEG_MAIN;
    pr->pin_p = pr->pin_d = -1;
    pr->probe =
        prec_probe_pin(c, httpd_req_header(req, "X-Motor-Precision-Probe"), &pr->pin_p, &pr->pin_d);
    if (!client_rid(httpd_req_header(req, "X-Request-Id"), pr->rid, sizeof(pr->rid)))
        make_rid(w, pr->rid);
    trace_context(pr, req);
    pr->tr =
        otlp_begin(&c->otlp, pr->traceparent[0] ? pr->traceparent : NULL, &w->rng, pr->start_us);
    pr->tr_route = otlp_span_open(pr->tr, "route", 1, pr->start_us, &w->rng);
    list_insert_tail(&w->live, &pr->link);
    w->n_live++;
    metrics_gauge_inc(c->m.inflight);
    httpd_req_on_close(req, on_close, pr);
    reactor_timer_init(&pr->t_backoff, on_backoff, pr);
    pr->first_deadline_ms = reactor_now(w->r) + set->first_token_timeout_ms;
    if (!reactor_timer_active(&w->sweep) || w->sweep_ms != set->sweep_ms) {
        w->sweep_ms = set->sweep_ms; /* reloaded timeouts: the sweep follows */
        reactor_timer_start(w->r, &w->sweep, w->sweep_ms, w->sweep_ms);
    }
    pr->prompt_tokens = -1;
    pr->usage_prompt = pr->usage_completion = -1;
    if (set->conductor)
        conductor_query(pr);
    else if (set->tokenize)
        tokenize(pr);
    else if (set->approx && (set->policy == BAL_KV_UNIFIED || set->policy == BAL_KV_LOAD_GATED))
        approx_keys(pr);
    else
        attempt(pr);
}

static void h_completions(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_COMPLETIONS);
}

static void h_chat(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_CHAT);
}

static void h_responses(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_RESPONSES);
}

static void h_messages(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_MESSAGES);
}

static void h_embeddings(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_EMBEDDINGS);
}

static void h_tokenize(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_TOKENIZE);
}

static void h_detokenize(struct httpd_req *req, void *arg)
{
    handle_infer(req, arg, API_DETOKENIZE);
}

/* Does the callback's request id name this request? vLLM's engine-side ids are
 * "cmpl-<id>-0" (completions) and "chatcmpl-<id>" (chat), <id> being ours. */
static bool meta_names(const struct preq *pr, const char *id)
{
    const char *rid = up_rid(pr);
    size_t rl = strlen(rid);
    if (!strncmp(id, "chatcmpl-", 9))
        id += 9;
    else if (!strncmp(id, "cmpl-", 5))
        id += 5;
    size_t il = strlen(id);
    if (il == rl + 2 && !strcmp(id + rl, "-0"))
        il = rl;
    return il == rl && !strncmp(id, rid, rl);
}

/* POST /v1/metaserver?attempt=N (trigger mode, spec §9.4): a decode engine asks for the
 * prefill of a request it holds. 404 an unknown request, 409 a stale attempt (or one
 * already served); else the prefill leg is sent and the answer waits for it. */
static void h_metaserver(struct httpd_req *req, void *arg)
{
    struct coord_worker *w = arg;
    size_t len;
    const char *raw = httpd_req_body(req, &len);
    json_t *kv = raw ? json_loadb(raw, len, 0, NULL) : NULL;
    const char *id = json_string_value(json_object_get(kv, "request_id"));
    const char *att = httpd_req_query(req, "attempt");
    if (!id) {
        json_decref(kv);
        respond_openai_error(req, 400, "BadRequestError", "request_id is required");
        return;
    }
    struct preq *pr = NULL;
    struct list_head *n;
    list_for_each(n, &w->live)
    {
        struct preq *x = list_entry(n, struct preq, link);
        if (x->mode == MODE_VLLM_TRIGGER && state_of(x) != REQ_DONE && meta_names(x, id)) {
            pr = x;
            break;
        }
    }
    char msg[200];
    if (!pr) {
        snprintf(msg, sizeof(msg), "unknown request %.120s", id);
        json_decref(kv);
        respond_openai_error(req, 404, "NotFoundError", msg);
        return;
    }
    struct leg *p = &pr->legs[LEG_PREFILL];
    int att_n = -1; /* a malformed attempt is stale: it names no attempt of ours */
    if (att && util_parse_int(att, 0, INT_MAX, &att_n) != 0)
        att_n = -1;
    if ((att && att_n != pr->attempts) || state_of(pr) != REQ_DECODE || pr->meta || p->h ||
        !p->inst) {
        snprintf(msg, sizeof(msg), "stale attempt %s of request %.120s (now attempt %d)",
                 att ? att : "?", id, pr->attempts);
        json_decref(kv);
        respond_openai_error(req, 409, "ConflictError", msg);
        return;
    }
    json_t *b = pdreq_vllm_prefill(req_tree(pr), up_rid(pr));
    json_object_set_new(b, "kv_transfer_params", kv); /* the decode engine's: push to it */
    if (pr->api == API_RESPONSES)
        json_object_set_new(b, "max_output_tokens", json_integer(1));
    char *sb = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    struct meta_wait *mw = xcalloc(1, sizeof(*mw));
    mw->pr = pr;
    mw->req = req;
    pr->meta = mw;
    httpd_req_on_close(req, meta_closed, mw);
    log_debug("metaserver_callback", LF_STR("request_id", pr->rid), LF_INT("attempt", pr->attempts),
              LF_INT("prefill_instance", p->inst->id));
    leg_start(pr, p, sb, strlen(sb), false);
    free(sb);
}

/* GET /v1/models/{id}: the card of a model some instance serves, else vLLM's 404. */
static void h_model(struct httpd_req *req, void *arg)
{
    struct coord_worker *w = arg;
    if (!check_auth(w->c, proxy_settings(w), req, "models"))
        return;
    if (!coord_refuse_standby(w->c, req, "models"))
        return;
    const char *a = httpd_req_param(req, "id"), *b = httpd_req_param(req, "rest");
    char id[512];
    snprintf(id, sizeof(id), "%s%s%s", a ? a : "", b ? "/" : "", b ? b : "");
    struct inst_snapshot *s = proxy_snapshot(w);
    for (size_t i = 0; i < s->n_models; i++)
        if (!strcmp(s->models[i], id)) {
            coord_count_request(w->c, "models", 200);
            httpd_respond_json(req, 200,
                               json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", id, "object", "model",
                                         "created", (json_int_t)(w->c->start_wall_ms / 1000),
                                         "owned_by", "motor", "root", id));
            return;
        }
    char msg[600];
    snprintf(msg, sizeof(msg), "The model `%s` does not exist.", id);
    coord_count_request(w->c, "models", 404);
    respond_openai_error(req, 404, "NotFoundError", msg);
}

static void h_models(struct httpd_req *req, void *arg)
{
    struct coord_worker *w = arg;
    if (!check_auth(w->c, proxy_settings(w), req, "models"))
        return;
    if (!coord_refuse_standby(w->c, req, "models"))
        return;
    struct inst_snapshot *s = proxy_snapshot(w);
    json_t *data = json_array();
    for (size_t i = 0; i < s->n_models; i++)
        json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", s->models[i],
                                              "object", "model", "created",
                                              (json_int_t)(w->c->start_wall_ms / 1000), "owned_by",
                                              "motor", "root", s->models[i]));
    httpd_respond_json(req, 200, json_pack("{s:s, s:o}", "object", "list", "data", data));
}

static void h_health(struct httpd_req *req, void *arg)
{
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s}", "status", "ok", "message", "Coordinator is alive"));
}

static void h_readiness(struct httpd_req *req, void *arg)
{
    struct coord_worker *w = arg;
    int status;
    json_t *body = coord_readiness(w->c, proxy_snapshot(w), false, &status);
    httpd_respond_json(req, status, body);
}

void proxy_register_routes(struct coord_worker *w)
{
    w->sweep_ms = proxy_settings(w)->sweep_ms;
    reactor_timer_init(&w->sweep, on_sweep, w);
    httpd_route(w->httpd, "POST", "/v1/completions", h_completions, w, 0);
    httpd_route(w->httpd, "POST", "/v1/chat/completions", h_chat, w, 0);
    httpd_route(w->httpd, "GET", "/v1/models", h_models, w, 0);
    httpd_route(w->httpd, "GET", "/v1/models/{id}", h_model, w, 0);
    if (w->meta_httpd)
        httpd_route(w->meta_httpd, "POST", "/v1/metaserver", h_metaserver, w, 0);
    httpd_route(w->httpd, "GET", "/v1/models/{id}/{rest}", h_model, w, 0); /* org/name */
    httpd_route(w->httpd, "POST", "/v1/responses", h_responses, w, 0);
    httpd_route(w->httpd, "POST", "/v1/messages", h_messages, w, 0);
    httpd_route(w->httpd, "POST", "/v1/embeddings", h_embeddings, w, 0);
    httpd_route(w->httpd, "POST", "/tokenize", h_tokenize, w, 0);
    httpd_route(w->httpd, "POST", "/detokenize", h_detokenize, w, 0);
    httpd_route(w->httpd, "GET", "/health", h_health, w, 0);
    httpd_route(w->httpd, "GET", "/liveness", h_health, w, 0);
    httpd_route(w->httpd, "GET", "/startup", h_health, w, 0);
    httpd_route(w->httpd, "GET", "/readiness", h_readiness, w, 0);
    httpd_route(w->httpd, "GET", "/metrics", coord_handle_metrics, w->c, 0);
}

static void on_drain_tick(struct reactor *r, void *arg)
{
    struct coord_worker *w = arg;
    if (w->n_live == 0 || reactor_now(r) >= w->drain_deadline) {
        if (w->n_live)
            log_warn("drain_deadline", LF_INT("worker", w->idx), LF_INT("cut", w->n_live));
        reactor_timer_stop(r, &w->drain_timer);
        reactor_stop(r);
    }
}

void proxy_worker_drain(void *arg)
{
    struct coord_worker *w = arg;
    w->draining = true;
    w->drain_deadline = reactor_now(w->r) + proxy_settings(w)->shutdown_grace_ms;
    if (w->n_live == 0) {
        reactor_stop(w->r);
        return;
    }
    log_info("draining", LF_INT("worker", w->idx), LF_INT("inflight", w->n_live));
    reactor_timer_init(&w->drain_timer, on_drain_tick, w);
    reactor_timer_start(w->r, &w->drain_timer, PROXY_DRAIN_POLL_MS, PROXY_DRAIN_POLL_MS);
}
