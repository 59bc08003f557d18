/* fanout — every request shape in PD mode: a prefill/decode hand-off carries one prompt
 * and one choice (vLLM's KV connectors and the simulator refuse more), so a request with
 * n > 1, best_of > 1 or a batch of prompts is served as one sub-request per (prompt,
 * choice), each an ordinary request to this coordinator's own inference port — routed,
 * retried and rescheduled like any other — and the answers are merged:
 *
 *   index      choice k of prompt p is index p·n + k (vLLM's order)
 *   usage      prompt_tokens once per prompt, completion_tokens summed over the choices
 *              returned, total their sum
 *   best_of    best_of candidates per prompt (with logprobs), the n of highest
 *              cumulative logprob kept (vLLM's rule); logprobs dropped unless asked
 *   streams    the sub-streams' events interleaved as they come, each with its global
 *              index and the first answer's id; their usage chunks summed into one
 *              final chunk, then one [DONE]
 *
 * At most FANOUT_INFLIGHT sub-requests run at once (a stream needs them all at once:
 * a wider stream is refused with 400). A sub-request that fails fails the request (its
 * answer is passed on; once streaming, an in-band error); the client leaving cancels
 * every sub-request (each cancels its own legs, so the engines see the abort).
 * Worker thread only. */
#include "coordinator/coord_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "coordinator/pdreq.h"
#include "coordinator/sse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FANOUT_INFLIGHT 16
#define FANOUT_MAX_SUBS 256
#define FANOUT_RESP_MAX (64u << 20)
#define FANOUT_SSE_MAX (8u << 20)

struct fanout;

struct sub {
    struct fanout *f;
    int idx;    /* global index of its choice (best_of: its candidate number) */
    int prompt; /* which prompt */
    struct httpc_req *h;
    long status;
    char *ctype;
    struct strbuf body; /* non-stream answer, or an error body */
    struct sse_parser sse;
    bool sse_on;
    bool done;
};

struct fanout {
    struct coord_worker *w;
    struct httpd_req *hreq; /* NULL once closed */
    bool chat, stream, ended;
    bool head_sent; /* the stream's head went out */
    const char *api;
    char rid[72];
    json_t *body;
    int n, best_of, n_prompts, n_subs, next, inflight, finished;
    bool logprobs_asked;
    struct sub *subs;
    char *id; /* the answer's id: the first sub-answer's */
    json_int_t created;
    char *model;
    json_t *usage_sum; /* streams: the summed final usage */
    json_t **results;  /* non-stream: each sub's parsed answer */
    int64_t start_us;
};

static void fanout_next(struct fanout *f);

static void respond_error(struct httpd_req *req, int status, const char *type, const char *msg)
{
    json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", type,
                          "param", "code", status);
    httpd_respond_json(req, status, j);
}

static void cancel_all(struct fanout *f)
{
    for (int i = 0; i < f->n_subs; i++)
        if (f->subs[i].h) {
            httpc_cancel(f->w->httpc, f->subs[i].h);
            f->subs[i].h = NULL;
        }
}

/* The one end: answer (or end the stream), count, cancel what still runs. */
static void fanout_end(struct fanout *f, int status, const char *ctype, const char *body,
                       size_t len, const char *inband)
{
    if (f->ended)
        return;
    f->ended = true;
    cancel_all(f);
    coord_count_request(f->w->c, f->api, status);
    metrics_histogram_observe(f->w->c->m.e2e, (double)(util_mono_us() - f->start_us) / 1e6);
    if (!f->hreq)
        return;
    if (f->head_sent) {
        if (inband) {
            struct strbuf sb;
            strbuf_init(&sb, 4096);
            strbuf_puts(&sb, "data: {\"error\":{\"message\":");
            strbuf_put_json_string(&sb, inband);
            strbuf_puts(&sb, ",\"type\":\"upstream_error\",\"code\":502}}\n\n");
            httpd_stream_write(f->hreq, strbuf_str(&sb), sb.len);
            strbuf_release(&sb);
        }
        httpd_stream_end(f->hreq, false);
        return;
    }
    httpd_add_header(f->hreq, "X-Request-Id", f->rid);
    if (inband)
        respond_error(f->hreq, status, status == 504 ? "timeout" : "upstream_error", inband);
    else
        httpd_respond(f->hreq, status, ctype ? ctype : "application/json", body, len);
}

/* A sub-request failed before the answer began: its answer is the request's. */
static void sub_failed(struct sub *s, const struct httpc_response *resp)
{
    struct fanout *f = s->f;
    log_warn("fanout_part_failed", LF_STR("request_id", f->rid), LF_INT("part", s->idx),
             LF_INT("status", s->status), LF_STR("error", resp ? resp->error_text : ""));
    if (f->head_sent) {
        char msg[200];
        snprintf(msg, sizeof(msg), "choice %d failed: HTTP %ld %s", s->idx, s->status,
                 resp && resp->error ? resp->error_text : "");
        fanout_end(f, 200, NULL, NULL, 0, msg);
        return;
    }
    if (s->status >= 400 && s->body.len) {
        fanout_end(f, (int)s->status, s->ctype, strbuf_str(&s->body), s->body.len, NULL);
        return;
    }
    fanout_end(f, 502, NULL, NULL, 0,
               resp && resp->error ? resp->error_text : "a part of the request failed");
}

/* ---- streams ----------------------------------------------------------------------- */

static void head_out(struct fanout *f)
{
    if (!f->hreq || f->head_sent)
        return;
    f->head_sent = true;
    httpd_add_header(f->hreq, "X-Request-Id", f->rid);
    httpd_add_header(f->hreq, "Cache-Control", "no-cache");
    httpd_stream_begin(f->hreq, 200, "text/event-stream");
}

static void usage_add(json_t *sum, const json_t *u, bool with_prompt)
{
    static const char *const keys[] = {"prompt_tokens", "completion_tokens", "total_tokens"};
    for (int i = 0; i < 3; i++) {
        if (i == 0 && !with_prompt)
            continue;
        json_int_t v = json_integer_value(json_object_get(u, keys[i]));
        if (i == 2 && !with_prompt)
            v -= json_integer_value(json_object_get(u, "prompt_tokens"));
        json_object_set_new(sum, keys[i],
                            json_integer(json_integer_value(json_object_get(sum, keys[i])) + v));
    }
}

static int on_sub_event(const char *raw, size_t raw_len, const char *data, size_t data_len,
                        bool has_data, void *arg)
{
    struct sub *s = arg;
    struct fanout *f = s->f;
    if (!f->hreq || f->ended)
        return 1;
    if (!has_data || (data_len == 6 && memcmp(data, "[DONE]", 6) == 0))
        return 0;
    json_t *ev = json_loadb(data, data_len, 0, NULL);
    if (!json_is_object(ev)) {
        json_decref(ev);
        return 0;
    }
    const json_t *err = json_object_get(ev, "error");
    if (err) {
        const char *m = json_string_value(json_object_get(err, "message"));
        char msg[240];
        snprintf(msg, sizeof(msg), "choice %d: %s", s->idx, m ? m : "upstream error");
        json_decref(ev);
        fanout_end(f, 200, NULL, NULL, 0, msg);
        return 1;
    }
    if (!f->id) {
        const char *id = json_string_value(json_object_get(ev, "id"));
        f->id = xstrdup(id ? id : f->rid);
        f->created = json_integer_value(json_object_get(ev, "created"));
    }
    json_object_set_new(ev, "id", json_string(f->id));
    json_object_set_new(ev, "created", json_integer(f->created));
    json_t *choices = json_object_get(ev, "choices");
    json_t *u = json_object_get(ev, "usage");
    if (json_is_array(choices) && json_array_size(choices) == 0 && json_is_object(u)) {
        /* a sub-stream's final usage: summed into ours */
        if (!f->usage_sum)
            f->usage_sum = json_object();
        usage_add(f->usage_sum, u, s->idx % f->n == 0);
        json_decref(ev);
        return 0;
    }
    size_t i;
    json_t *c;
    json_array_foreach(choices, i, c) json_object_set_new(c, "index", json_integer(s->idx));
    pdreq_strip_response(ev);
    char *js = json_dumps(ev, JSON_COMPACT);
    json_decref(ev);
    head_out(f);
    int rc = 0;
    if (js) {
        char *line = xasprintf("data: %s\n\n", js);
        rc = httpd_stream_write(f->hreq, line, strlen(line));
        free(line);
        free(js);
    }
    (void)raw;
    (void)raw_len;
    return rc < 0 ? 1 : 0;
}

static void stream_finish(struct fanout *f)
{
    head_out(f);
    if (f->usage_sum && f->hreq) {
        json_t *ev =
            json_pack("{s:s, s:s, s:I, s:s, s:[], s:O}", "id", f->id ? f->id : f->rid, "object",
                      f->chat ? "chat.completion.chunk" : "text_completion", "created", f->created,
                      "model", f->model ? f->model : "", "choices", "usage", f->usage_sum);
        char *js = json_dumps(ev, JSON_COMPACT);
        json_decref(ev);
        char *line = xasprintf("data: %s\n\n", js);
        httpd_stream_write(f->hreq, line, strlen(line));
        free(line);
        free(js);
    }
    if (f->hreq)
        httpd_stream_write(f->hreq, "data: [DONE]\n\n", 14);
    fanout_end(f, 200, NULL, NULL, 0, NULL);
}

/* ---- non-stream merge -------------------------------------------------------------- */

static double cumulative_logprob(const json_t *choice)
{
    const json_t *lp = json_object_get(json_object_get(choice, "logprobs"), "token_logprobs");
    double sum = 0;
    size_t i;
    const json_t *v;
    json_array_foreach(lp, i, v) sum += json_number_value(v);
    return sum;
}

static void merge_finish(struct fanout *f)
{
    json_t *first = f->results[0];
    json_t *out = json_deep_copy(first);
    pdreq_strip_response(out);
    json_t *choices = json_array();
    json_t *usage =
        json_pack("{s:i, s:i, s:i}", "prompt_tokens", 0, "completion_tokens", 0, "total_tokens", 0);
    int per = f->best_of > f->n ? f->best_of : f->n;
    for (int p = 0; p < f->n_prompts; p++) {
        /* candidates of prompt p: subs p·per .. p·per + per − 1 */
        int order[FANOUT_MAX_SUBS];
        for (int k = 0; k < per; k++)
            order[k] = p * per + k;
        if (f->best_of > f->n) /* vLLM: the n best by cumulative logprob, best first */
            for (int a = 1; a < per; a++)
                for (int b = a; b > 0; b--) {
                    double lb = cumulative_logprob(
                        json_array_get(json_object_get(f->results[order[b]], "choices"), 0));
                    double la = cumulative_logprob(
                        json_array_get(json_object_get(f->results[order[b - 1]], "choices"), 0));
                    if (lb <= la)
                        break;
                    int t = order[b];
                    order[b] = order[b - 1];
                    order[b - 1] = t;
                }
        for (int k = 0; k < per; k++) {
            json_t *r = f->results[order[k]];
            if (k >= f->n)
                continue; /* a best_of candidate not kept: not counted, as vLLM */
            usage_add(usage, json_object_get(r, "usage"), k == 0);
            json_t *c = json_deep_copy(json_array_get(json_object_get(r, "choices"), 0));
            json_object_set_new(c, "index", json_integer(p * f->n + k));
            if (f->best_of > f->n && !f->logprobs_asked)
                json_object_set_new(c, "logprobs", json_null());
            json_array_append_new(choices, c);
        }
    }
    json_object_set_new(out, "choices", choices);
    json_object_set_new(out, "usage", usage);
    char *s = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    fanout_end(f, 200, "application/json", s, strlen(s), NULL);
    free(s);
}

/* ---- sub-requests ------------------------------------------------------------------ */

static int sub_on_status(long status, const char *ctype, void *arg)
{
    struct sub *s = arg;
    s->status = status;
    free(s->ctype);
    s->ctype = xstrdup(ctype);
    strbuf_release(&s->body);
    strbuf_init(&s->body, FANOUT_RESP_MAX);
    if (s->f->stream && status == 200) {
        sse_init(&s->sse, FANOUT_SSE_MAX, FANOUT_SSE_MAX);
        s->sse_on = true;
    }
    return 0;
}

static int sub_on_chunk(const char *data, size_t len, void *arg)
{
    struct sub *s = arg;
    if (s->sse_on)
        return sse_feed(&s->sse, data, len, on_sub_event, s) != 0;
    return strbuf_append(&s->body, data, len) < 0;
}

static void sub_done(const struct httpc_response *resp, void *arg)
{
    struct sub *s = arg;
    struct fanout *f = s->f;
    s->h = NULL;
    s->done = true;
    f->inflight--;
    if (f->ended)
        return;
    if (!f->stream && resp->body_len) /* not streamed: httpc kept the body */
        strbuf_append(&s->body, resp->body, resp->body_len);
    if (resp->error || s->status != 200) {
        sub_failed(s, resp);
        return;
    }
    if (!f->stream) {
        json_t *j = json_loadb(strbuf_str(&s->body), s->body.len, 0, NULL);
        if (!json_is_object(j) || !json_is_array(json_object_get(j, "choices"))) {
            json_decref(j);
            sub_failed(s, resp);
            return;
        }
        f->results[s->idx] = j;
    }
    f->finished++;
    if (f->finished == f->n_subs) {
        if (f->stream)
            stream_finish(f);
        else
            merge_finish(f);
        return;
    }
    fanout_next(f);
}

/* The body of sub-request i: one prompt, one choice. */
static json_t *sub_body(struct fanout *f, int prompt)
{
    json_t *b = json_deep_copy(f->body);
    json_object_del(b, "n");
    json_object_del(b, "best_of");
    if (!f->chat) {
        json_t *pr = json_object_get(f->body, "prompt");
        if (f->n_prompts > 1 || (json_is_array(pr) && json_array_size(pr) == 1 &&
                                 !json_is_integer(json_array_get(pr, 0))))
            json_object_set(b, "prompt", json_array_get(pr, (size_t)prompt));
    }
    if (f->best_of > f->n && !json_is_integer(json_object_get(b, "logprobs")))
        json_object_set_new(b, "logprobs", json_integer(0));
    return b;
}

static void fanout_next(struct fanout *f)
{
    struct coord *c = f->w->c;
    const char *host = c->cfg.host;
    if (!strcmp(host, "0.0.0.0") || !strcmp(host, "::") || !*host)
        host = "127.0.0.1";
    bool v6 = strchr(host, ':') != NULL;
    char url[200];
    const struct csettings *set = proxy_settings(f->w);
    snprintf(url, sizeof(url), "%s://%s%s%s:%u%s", set->self_tls ? "https" : "http", v6 ? "[" : "",
             host, v6 ? "]" : "", (unsigned)c->infer_port,
             f->chat ? "/v1/chat/completions" : "/v1/completions");
    int per = f->best_of > f->n ? f->best_of : f->n;
    while (f->inflight < FANOUT_INFLIGHT && f->next < f->n_subs && !f->ended) {
        struct sub *s = &f->subs[f->next++];
        json_t *b = sub_body(f, s->prompt);
        char *js = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        const char *auth = f->hreq ? httpd_req_header(f->hreq, "Authorization") : NULL;
        char auth_hdr[1100], rid_hdr[120];
        snprintf(auth_hdr, sizeof(auth_hdr), "Authorization: %s", auth ? auth : "");
        snprintf(rid_hdr, sizeof(rid_hdr), "X-Request-Id: %s-f%d", f->rid, s->idx);
        const char *hdrs[] = {"X-Motor-Fanout: 1", rid_hdr,
                              f->stream ? "Accept: text/event-stream" : "Accept: application/json",
                              auth ? auth_hdr : NULL, NULL};
        struct httpc_opts o = {
            .method = "POST",
            .url = url,
            .body = js,
            .body_len = strlen(js),
            .content_type = "application/json",
            .headers = hdrs,
            .timeout_ms = proxy_settings(f->w)->infer_timeout_ms + 5000,
            .max_response = FANOUT_RESP_MAX,
            .on_status = sub_on_status,
            .on_chunk = f->stream ? sub_on_chunk : NULL,
            .tls = set->self_tls ? &set->self_tls_opts : NULL,
        };
        f->inflight++;
        s->h = httpc_request(f->w->httpc, &o, sub_done, s);
        free(js);
    }
    (void)per;
}

static void fanout_free(struct fanout *f)
{
    for (int i = 0; i < f->n_subs; i++) {
        struct sub *s = &f->subs[i];
        if (s->sse_on)
            sse_release(&s->sse);
        strbuf_release(&s->body);
        free(s->ctype);
        if (f->results)
            json_decref(f->results[i]);
    }
    free(f->results);
    free(f->subs);
    free(f->id);
    free(f->model);
    json_decref(f->usage_sum);
    json_decref(f->body);
    free(f);
}

static void fanout_on_close(struct httpd_req *req, void *arg)
{
    struct fanout *f = arg;
    f->hreq = NULL;
    if (!f->ended) {
        log_info("client_disconnected", LF_STR("request_id", f->rid), LF_BOOL("fanout", true));
        coord_count_error(f->w->c, CAUSE_CLIENT_DISCONNECT);
        fanout_end(f, 499, NULL, NULL, 0, NULL);
    }
    struct coord_worker *w = f->w;
    fanout_free(f);
    proxy_live_done(w);
}

int fanout_shape(const json_t *body, bool chat, int *n_prompts, int *n, int *best_of)
{
    const json_t *jn = json_object_get(body, "n");
    const json_t *jb = json_object_get(body, "best_of");
    *n = json_is_integer(jn) ? (int)json_integer_value(jn) : 1;
    *best_of = json_is_integer(jb) ? (int)json_integer_value(jb) : 0;
    *n_prompts = 1;
    const json_t *p = json_object_get(body, "prompt");
    if (!chat && json_is_array(p) && json_array_size(p) > 0 &&
        !json_is_integer(json_array_get(p, 0)))
        *n_prompts = (int)json_array_size(p); /* strings or token-id lists: a batch */
    if (*n < 1 || *best_of < 0)
        return 0; /* the engine says what is wrong with it */
    int per = *best_of > *n ? *best_of : *n;
    return *n_prompts * per;
}

void fanout_start(struct coord_worker *w, struct httpd_req *req, bool chat, json_t *body,
                  const char *api, const char *rid)
{
    int n_prompts, n, best_of;
    int subs = fanout_shape(body, chat, &n_prompts, &n, &best_of);
    bool stream = json_is_true(json_object_get(body, "stream"));
    const char *why = NULL;
    if (subs > FANOUT_MAX_SUBS)
        why = "too many choices × prompts for a prefill/decode fan-out (at most 256)";
    else if (stream && subs > FANOUT_INFLIGHT)
        why = "a streamed fan-out takes at most 16 choices × prompts";
    else if (stream && best_of > n)
        why = "best_of is not supported with stream (as vLLM)";
    if (why) {
        json_decref(body);
        coord_count_error(w->c, CAUSE_BAD_REQUEST);
        coord_count_request(w->c, api, 400);
        respond_error(req, 400, "BadRequestError", why);
        return;
    }
    struct fanout *f = xcalloc(1, sizeof(*f));
    f->w = w;
    f->hreq = req;
    f->chat = chat;
    f->stream = stream;
    f->api = api;
    snprintf(f->rid, sizeof(f->rid), "%s", rid);
    f->body = body;
    f->n = n;
    f->best_of = best_of;
    f->n_prompts = n_prompts;
    f->n_subs = subs;
    f->logprobs_asked =
        json_object_get(body, "logprobs") && !json_is_null(json_object_get(body, "logprobs"));
    const char *model = json_string_value(json_object_get(body, "model"));
    f->model = model ? xstrdup(model) : NULL;
    f->start_us = util_mono_us();
    f->subs = xcalloc((size_t)subs, sizeof(*f->subs));
    f->results = f->stream ? NULL : xcalloc((size_t)subs, sizeof(json_t *));
    int per = best_of > n ? best_of : n;
    for (int i = 0; i < subs; i++) {
        f->subs[i].f = f;
        f->subs[i].idx = i; /* = prompt·per + k: the global index unless best_of */
        f->subs[i].prompt = i / per;
    }
    log_info("fanout", LF_STR("request_id", f->rid), LF_INT("prompts", n_prompts), LF_INT("n", n),
             LF_INT("best_of", best_of), LF_BOOL("stream", stream));
    proxy_live_add(w);
    httpd_req_on_close(req, fanout_on_close, f);
    fanout_next(f);
}
