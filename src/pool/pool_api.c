/* pool_api — the worker pool's HTTP routes and the invoke forwarder.
 *
 * An invoke is a small state machine tied to its HTTP request:
 *   queued (waiting for a slot) -> in flight (slot held, POST /invoke to the worker)
 *   -> answered; the slot is released the moment the worker's answer ends, fails or
 *   times out, or the client goes away, whichever comes first — never later.
 * The call object lives until the request's on_close (or pool shutdown), the only
 * point where nobody can refer to it any more.
 *
 * Worker replies: application/json (and +json, or no content type) is buffered up to
 * POOL_JSON_PEEK bytes and checked to be JSON before it is answered, so a worker that
 * answers garbage yields a failed result naming the cause; a longer JSON reply is
 * streamed through as it arrives. text/event-stream and NDJSON replies are streamed
 * from the first byte. Any other content type is a failed result. */
#include "pool/pool_internal.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define POOL_JSON_PEEK (256u * 1024u)
#define POOL_NONJSON_SNIPPET 512u
/* How long a transport failure waits for the worker's exit to be reported. */
#define POOL_CRASH_WAIT_MS 100
#define INSTANCE_HEADER "X-Motor-Instance-Id"
#define NODE_HEADER "X-Motor-Node-Id"

enum call_phase { CALL_QUEUED = 0, CALL_INFLIGHT, CALL_DONE };
enum reply_mode { REPLY_JSON = 0, REPLY_STREAM, REPLY_OTHER };

struct pool_call {
    struct pool *pool;
    struct list_head link;  /* on pool->calls */
    struct list_head ilink; /* on inst->calls_head while in flight (inst set) */
    struct httpd_req *req;  /* NULL once the request is gone */
    struct pool_waiter w;
    enum call_phase phase;
    struct pool_inst *inst;
    struct httpc_req *hreq;
    char *node_id;
    char inst_id[24];
    enum reply_mode mode;
    bool streaming; /* the answer to the client has begun */
    long up_status;
    char *up_ctype;
    struct strbuf buf;
    int64_t t0_ms;
    struct reactor_timer defer; /* transport error: waiting to learn whether it crashed */
    char *up_error;
};

/* ---- small helpers ------------------------------------------------------------------- */

static void respond_detail(struct httpd_req *req, int status, const char *detail, json_t *extra)
{
    json_t *o = json_object();
    json_object_set_new(o, "detail", pool_json_str(detail, strlen(detail)));
    if (extra)
        json_object_update(o, extra);
    httpd_respond_json(req, status, o);
}

/* The failed result of an invoke: the seed's InvokeResponse shape plus FastAPI's detail. */
static void call_fail(struct pool_call *c, int status, const char *msg, json_t *extra)
{
    if (!c->req || c->phase == CALL_DONE)
        return;
    c->phase = CALL_DONE;
    log_info("pool_call_failed", LF_STR("node_id", c->node_id),
             LF_STR("instance_id", c->inst_id[0] ? c->inst_id : NULL), LF_INT("status", status),
             LF_STR("error", msg), LF_INT("elapsed_ms", util_mono_ms() - c->t0_ms));
    if (c->streaming) {
        httpd_stream_end(c->req, true);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string("failed"));
    json_object_set_new(o, "error", pool_json_str(msg, strlen(msg)));
    json_object_set_new(o, "detail", pool_json_str(msg, strlen(msg)));
    json_object_set_new(o, "node_id", json_string(c->node_id));
    json_object_set_new(o, "instance_id", c->inst_id[0] ? json_string(c->inst_id) : json_null());
    if (extra)
        json_object_update(o, extra);
    if (c->inst_id[0])
        httpd_add_header(c->req, INSTANCE_HEADER, c->inst_id);
    httpd_respond_json(c->req, status, o);
}

static void link_inst(struct pool_call *c, struct pool_inst *i)
{
    c->inst = i;
    list_insert_head(&i->calls_head, &c->ilink);
}

static void unlink_inst(struct pool_call *c)
{
    if (!c->inst)
        return;
    list_remove(&c->ilink);
    c->inst = NULL;
}

/* End the slot: stop talking to the worker, give the slot back. Idempotent. */
static void call_release(struct pool_call *c)
{
    reactor_timer_stop(c->pool->r, &c->defer);
    if (c->hreq) {
        httpc_cancel(c->pool->http, c->hreq);
        c->hreq = NULL;
    }
    struct pool_inst *i = c->inst;
    if (i) {
        unlink_inst(c);
        pool_release(i);
    }
}

static void call_free(struct pool_call *c)
{
    struct pool *p = c->pool;
    list_remove(&c->link);
    reactor_timer_stop(p->r, &c->defer);
    strbuf_release(&c->buf);
    free(c->up_error);
    free(c->up_ctype);
    free(c->node_id);
    free(c);
}

static void call_on_close(struct httpd_req *req, void *arg)
{
    struct pool_call *c = arg;
    c->req = NULL;
    if (c->phase == CALL_QUEUED)
        pool_waiter_cancel(&c->w);
    if (c->hreq || c->inst)
        log_info("pool_call_abandoned", LF_STR("node_id", c->node_id),
                 LF_STR("instance_id", c->inst_id), LF_STR("why", "client went away"));
    call_release(c);
    call_free(c);
}

/* ---- forwarding ------------------------------------------------------------------------- */

static bool ctype_is(const char *ct, const char *want)
{
    size_t n = strlen(want);
    return ct && strncasecmp(ct, want, n) == 0 && (ct[n] == '\0' || ct[n] == ';' || ct[n] == ' ');
}

static enum reply_mode mode_for(const char *ct)
{
    if (!ct || !*ct || ctype_is(ct, "application/json"))
        return REPLY_JSON;
    if (ctype_is(ct, "text/event-stream") || ctype_is(ct, "application/x-ndjson") ||
        ctype_is(ct, "application/jsonl") || ctype_is(ct, "application/json-seq"))
        return REPLY_STREAM;
    /* application/problem+json and the like */
    const char *semi = strchr(ct, ';');
    size_t len = semi ? (size_t)(semi - ct) : strlen(ct);
    if (len > 5 && strncasecmp(ct + len - 5, "+json", 5) == 0)
        return REPLY_JSON;
    return REPLY_OTHER;
}

static void begin_stream(struct pool_call *c)
{
    httpd_add_header(c->req, INSTANCE_HEADER, c->inst_id);
    httpd_stream_begin(c->req, (int)c->up_status,
                       c->up_ctype && *c->up_ctype ? c->up_ctype : "application/json");
    c->streaming = true;
}

static int on_up_status(long status, const char *ctype, void *arg)
{
    struct pool_call *c = arg;
    if (!c->req)
        return 1;
    c->up_status = status;
    free(c->up_ctype);
    c->up_ctype = xstrdup(ctype);
    c->mode = mode_for(ctype);
    if (c->mode == REPLY_STREAM)
        begin_stream(c);
    return 0;
}

static int on_up_chunk(const char *data, size_t len, void *arg)
{
    struct pool_call *c = arg;
    if (!c->req)
        return 1;
    if (c->streaming)
        return httpd_stream_write(c->req, data, len) == 0 ? 0 : 1;
    if (c->mode == REPLY_OTHER) {
        /* Only a snippet for the error message. */
        size_t room = POOL_NONJSON_SNIPPET - MOTOR_MIN(c->buf.len, POOL_NONJSON_SNIPPET);
        (void)strbuf_append(&c->buf, data, MOTOR_MIN(room, len));
        return 0;
    }
    if (c->buf.len + len <= POOL_JSON_PEEK)
        return strbuf_append(&c->buf, data, len) == 0 ? 0 : 1;
    /* Too big to hold for a check: pass it through as it comes. */
    begin_stream(c);
    int rc = c->buf.len ? httpd_stream_write(c->req, c->buf.buf, c->buf.len) : 0;
    strbuf_reset(&c->buf);
    if (rc == 0)
        rc = httpd_stream_write(c->req, data, len);
    return rc == 0 ? 0 : 1;
}

static void on_up_done(const struct httpc_response *resp, void *arg)
{
    struct pool_call *c = arg;
    c->hreq = NULL;
    struct pool_node *n = c->w.node;
    if (resp->error && resp->error != -ETIMEDOUT && resp->error != -E2BIG && c->inst &&
        c->inst->state == POOL_READY && c->inst->proc_alive && !c->streaming) {
        /* A dying process resets its sockets before the kernel reports its exit: give
         * the pidfd a moment, so a crash is answered with its real cause (signal, exit
         * code) by pool_api_inst_gone rather than as a bare "connection reset". */
        free(c->up_error);
        c->up_error =
            xasprintf("transport failure calling instance %s at %s/invoke: %s", c->inst_id,
                      c->inst->address ? c->inst->address : "?", resp->error_text);
        reactor_timer_start(c->pool->r, &c->defer, POOL_CRASH_WAIT_MS, 0);
        return;
    }
    double timeout_s = c->inst ? (double)c->inst->m->invoke_timeout_ms / 1000.0 : 0;
    char *addr = c->inst && c->inst->address ? xstrdup(c->inst->address) : xstrdup("?");
    /* The slot first: the worker is done with this call whatever we answer. */
    call_release(c);
    if (!c->req || c->phase == CALL_DONE) {
        free(addr);
        return;
    }
    if (resp->error) {
        n->calls_failed++;
        char *msg;
        int status = 502;
        if (resp->error == -ETIMEDOUT) {
            status = 504;
            msg = xasprintf("invoke on instance %s timed out after %.3g s "
                            "(invoke_timeout_seconds)",
                            c->inst_id, timeout_s);
        } else if (resp->error == -E2BIG) {
            msg = xasprintf("instance %s replied with more than %zu bytes", c->inst_id,
                            c->pool->cfg.max_response);
        } else {
            msg = xasprintf("transport failure calling instance %s at %s/invoke: %s", c->inst_id,
                            addr, resp->error_text);
        }
        call_fail(c, status, msg, NULL);
        free(msg);
        free(addr);
        return;
    }
    free(addr);
    if (c->streaming) {
        c->phase = CALL_DONE;
        httpd_stream_end(c->req, false);
        return;
    }
    if (c->mode == REPLY_OTHER) {
        n->calls_failed++;
        char *msg = xasprintf("instance %s replied with a non-JSON body (HTTP %ld, content-type "
                              "%s): %.200s",
                              c->inst_id, resp->status, c->up_ctype ? c->up_ctype : "none",
                              strbuf_str(&c->buf));
        call_fail(c, 502, msg, NULL);
        free(msg);
        return;
    }
    json_error_t jerr;
    json_t *j = json_loadb(c->buf.buf ? c->buf.buf : "", c->buf.len, JSON_DECODE_ANY, &jerr);
    if (!j) {
        n->calls_failed++;
        char *msg = xasprintf("instance %s replied with invalid JSON (HTTP %ld): %s; body: %.200s",
                              c->inst_id, resp->status, jerr.text, strbuf_str(&c->buf));
        call_fail(c, 502, msg, NULL);
        free(msg);
        return;
    }
    json_decref(j);
    c->phase = CALL_DONE;
    if (resp->status >= 400)
        n->calls_failed++;
    httpd_add_header(c->req, INSTANCE_HEADER, c->inst_id);
    httpd_respond(c->req, (int)resp->status,
                  c->up_ctype && *c->up_ctype ? c->up_ctype : "application/json",
                  c->buf.buf ? c->buf.buf : "", c->buf.len);
}

static void on_defer(struct reactor *r, void *arg)
{
    struct pool_call *c = arg;
    struct pool_node *n = c->w.node;
    /* Still alive (or its exit not seen): it was a plain transport failure. */
    call_release(c);
    n->calls_failed++;
    call_fail(c, 502, c->up_error ? c->up_error : "transport failure", NULL);
}

static void on_granted(struct pool_waiter *w, struct pool_inst *i)
{
    struct pool_call *c = (struct pool_call *)((char *)w - offsetof(struct pool_call, w));
    c->phase = CALL_INFLIGHT;
    snprintf(c->inst_id, sizeof(c->inst_id), "%s", i->id);
    link_inst(c, i);
    size_t len = 0;
    const char *body = httpd_req_body(c->req, &len);
    const char *ct = httpd_req_header(c->req, "Content-Type");
    const char *accept = httpd_req_header(c->req, "Accept");
    const char *rid = httpd_req_header(c->req, "X-Request-Id");
    char *h_inst = xasprintf(INSTANCE_HEADER ": %s", i->id);
    char *h_node = xasprintf(NODE_HEADER ": %s", i->node->id);
    char *h_accept = accept ? xasprintf("Accept: %s", accept) : NULL;
    char *h_rid = rid ? xasprintf("X-Request-Id: %s", rid) : NULL;
    const char *headers[5] = {h_inst, h_node, NULL, NULL, NULL};
    size_t k = 2;
    if (h_accept)
        headers[k++] = h_accept;
    if (h_rid)
        headers[k++] = h_rid;
    struct httpc_opts o = {
        .method = "POST",
        .url = i->invoke_url,
        /* httpc treats body_len 0 as strlen(body): give it an explicit empty body. */
        .body = len ? body : "",
        .body_len = len,
        .content_type = ct && *ct ? ct : "application/json",
        .headers = headers,
        .timeout_ms = i->m->invoke_timeout_ms,
        .max_response = c->pool->cfg.max_response,
        .on_status = on_up_status,
        .on_chunk = on_up_chunk,
    };
    c->hreq = httpc_request(c->pool->http, &o, on_up_done, c);
    free(h_inst);
    free(h_node);
    free(h_accept);
    free(h_rid);
}

static void on_failed(struct pool_waiter *w, int status, const char *msg, json_t *extra)
{
    struct pool_call *c = (struct pool_call *)((char *)w - offsetof(struct pool_call, w));
    call_fail(c, status, msg, extra);
}

static void h_invoke(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    const char *id = httpd_req_param(req, "id");
    struct pool_node *n = pool_node_find(p, id);
    if (!n) {
        char *msg = xasprintf("node '%s' is not registered", id);
        respond_detail(req, 404, msg, NULL);
        free(msg);
        return;
    }
    size_t len = 0;
    (void)httpd_req_body(req, &len);
    if (len > p->cfg.max_request) {
        respond_detail(req, 413, "request body too large", NULL);
        return;
    }
    struct pool_call *c = xcalloc(1, sizeof(*c));
    c->pool = p;
    c->req = req;
    c->node_id = xstrdup(n->id);
    c->t0_ms = util_mono_ms();
    strbuf_init(&c->buf, p->cfg.max_response ? p->cfg.max_response : (16u << 20));
    reactor_timer_init(&c->defer, on_defer, c);
    c->w.granted = on_granted;
    c->w.failed = on_failed;
    list_init(&c->ilink);
    list_insert_head(&p->calls, &c->link);
    httpd_req_on_close(req, call_on_close, c);
    pool_acquire(n, &c->w);
}

void pool_api_inst_gone(struct pool_inst *i, const char *why)
{
    while (!list_empty(&i->calls_head)) {
        struct pool_call *c = list_entry(i->calls_head.next, struct pool_call, ilink);
        reactor_timer_stop(c->pool->r, &c->defer);
        if (c->hreq) {
            httpc_cancel(c->pool->http, c->hreq);
            c->hreq = NULL;
        }
        unlink_inst(c);
        i->node->calls_failed++;
        pool_release(i);
        call_fail(c, 502, why, NULL);
    }
}

void pool_api_drop_calls(struct pool *p, const char *why)
{
    while (!list_empty(&p->calls)) {
        struct pool_call *c = list_entry(p->calls.next, struct pool_call, link);
        if (c->phase == CALL_QUEUED)
            pool_waiter_cancel(&c->w);
        call_release(c);
        if (c->req) {
            httpd_req_on_close(c->req, NULL, NULL);
            call_fail(c, 503, why, NULL);
        }
        call_free(c);
    }
}

/* ---- management routes ------------------------------------------------------------------ */

static int cmp_node_json(const void *a, const void *b)
{
    const json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
    return strcmp(json_string_value(json_object_get(x, "id")),
                  json_string_value(json_object_get(y, "id")));
}

static void h_nodes_list(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    size_t n = list_count(&p->nodes);
    json_t **v = xcalloc(n ? n : 1, sizeof(json_t *));
    size_t k = 0;
    struct list_head *pos;
    list_for_each(pos, &p->nodes)
    {
        v[k++] = pool_node_json(list_entry(pos, struct pool_node, link));
    }
    qsort(v, n, sizeof(json_t *), cmp_node_json);
    json_t *arr = json_array();
    for (k = 0; k < n; k++)
        json_array_append_new(arr, v[k]);
    free(v);
    json_t *o = json_object();
    json_object_set_new(o, "nodes", arr);
    httpd_respond_json(req, 200, o);
}

static void h_nodes_post(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    if (p->shutting_down) {
        respond_detail(req, 503, "the worker pool is shutting down", NULL);
        return;
    }
    char err[256];
    json_t *body = httpd_req_json(req, err, sizeof(err));
    if (!body) {
        char *msg = xasprintf("invalid JSON: %s", err);
        json_t *extra = json_object();
        json_t *errs = json_array();
        json_array_append_new(errs, pool_json_str(msg, strlen(msg)));
        json_object_set_new(extra, "errors", errs);
        respond_detail(req, 400, msg, extra);
        json_decref(extra);
        free(msg);
        return;
    }
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct pool_manifest *m = pool_manifest_parse(body, &p->cfg.defaults, p->base_dir, &errs);
    json_decref(body);
    if (!m) {
        char *msg = xasprintf("invalid manifest: %d error(s)", cfg_errors_count(&errs));
        json_t *extra = json_object();
        json_object_set_new(extra, "errors", pool_errors_json(&errs));
        respond_detail(req, 400, msg, extra);
        json_decref(extra);
        free(msg);
        cfg_errors_release(&errs);
        return;
    }
    cfg_errors_release(&errs);
    bool created = false;
    struct pool_node *n = pool_node_put(p, m, "api", true, &created);
    httpd_respond_json(req, created ? 201 : 200, pool_node_json(n));
}

static struct pool_node *node_or_404(struct pool *p, struct httpd_req *req)
{
    const char *id = httpd_req_param(req, "id");
    struct pool_node *n = pool_node_find(p, id);
    if (!n) {
        char *msg = xasprintf("node '%s' is not registered", id);
        respond_detail(req, 404, msg, NULL);
        free(msg);
    }
    return n;
}

static void h_node_get(struct httpd_req *req, void *arg)
{
    struct pool_node *n = node_or_404(arg, req);
    if (n)
        httpd_respond_json(req, 200, pool_node_json(n));
}

struct del_ctx {
    struct httpd_req *req;
    char *id;
    int stopped;
    bool done;
};

static void del_on_close(struct httpd_req *req, void *arg)
{
    struct del_ctx *d = arg;
    d->req = NULL;
    if (d->done) {
        free(d->id);
        free(d);
    }
}

static void del_done(void *arg)
{
    struct del_ctx *d = arg;
    d->done = true;
    if (!d->req) {
        free(d->id);
        free(d);
        return;
    }
    json_t *o = json_object();
    json_object_set_new(o, "deleted", json_string(d->id));
    json_object_set_new(o, "stopped_instances", json_integer(d->stopped));
    httpd_respond_json(d->req, 200, o);
}

static void h_node_delete(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    struct pool_node *n = node_or_404(p, req);
    if (!n)
        return;
    struct del_ctx *d = xcalloc(1, sizeof(*d));
    d->req = req;
    d->id = xstrdup(n->id);
    struct list_head *pos;
    list_for_each(pos, &p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (i->node == n && pool_inst_live(i))
            d->stopped++;
    }
    httpd_req_on_close(req, del_on_close, d);
    pool_node_delete(n, del_done, d);
}

static int query_int(struct httpd_req *req, const char *name, int def, int min, int max)
{
    const char *v = httpd_req_query(req, name);
    int x;
    if (!v || util_parse_int(v, min, max, &x) != 0)
        return def;
    return x;
}

static bool query_true(struct httpd_req *req, const char *name)
{
    const char *v = httpd_req_query(req, name);
    return v && (strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
}

static void h_instances(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    const char *node = httpd_req_query(req, "node");
    const char *state = httpd_req_query(req, "state");
    int tail = query_int(req, "tail", 20, 0, POOL_TAIL_LINES);
    json_t *o = json_object();
    if (query_true(req, "history")) {
        int limit = query_int(req, "limit", 100, 1, 10000);
        json_object_set_new(o, "instances", pool_store_instances_json(p->store, node, limit));
        httpd_respond_json(req, 200, o);
        return;
    }
    bool live_only = query_true(req, "live");
    json_t *arr = json_array();
    struct list_head *pos;
    list_for_each(pos, &p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (node && strcmp(i->node->id, node) != 0)
            continue;
        if (state && strcmp(pool_state_str(i->state), state) != 0)
            continue;
        if (live_only && !pool_inst_live(i))
            continue;
        json_array_append_new(arr, pool_inst_json(i, (size_t)tail));
    }
    json_object_set_new(o, "instances", arr);
    httpd_respond_json(req, 200, o);
}

static struct pool_inst *inst_find(struct pool *p, const char *id)
{
    struct list_head *pos;
    list_for_each(pos, &p->insts)
    {
        struct pool_inst *i = list_entry(pos, struct pool_inst, link);
        if (strcmp(i->id, id) == 0)
            return i;
    }
    return NULL;
}

static void h_instance_get(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    const char *id = httpd_req_param(req, "id");
    int tail = query_int(req, "tail", POOL_TAIL_LINES, 0, POOL_TAIL_LINES);
    struct pool_inst *i = inst_find(p, id);
    json_t *rec = pool_store_instance_json(p->store, id);
    if (!i && !rec) {
        char *msg = xasprintf("instance '%s' not found", id);
        respond_detail(req, 404, msg, NULL);
        free(msg);
        return;
    }
    json_t *o;
    if (i) {
        o = pool_inst_json(i, (size_t)tail);
        json_t *tr = rec ? json_object_get(rec, "transitions") : NULL;
        json_object_set(o, "transitions", tr ? tr : json_array());
        json_decref(rec);
    } else {
        o = rec; /* recorded only (an earlier run, or trimmed from memory) */
    }
    httpd_respond_json(req, 200, o);
}

static void h_instance_stop(struct httpd_req *req, void *arg)
{
    struct pool *p = arg;
    const char *id = httpd_req_param(req, "id");
    struct pool_inst *i = inst_find(p, id);
    if (!i) {
        char *msg = xasprintf("instance '%s' not found", id);
        respond_detail(req, 404, msg, NULL);
        free(msg);
        return;
    }
    if (i->state != POOL_STARTING && i->state != POOL_READY) {
        char *msg = xasprintf("instance '%s' is %s", id, pool_state_str(i->state));
        json_t *extra = json_object();
        json_object_set_new(extra, "state", json_string(pool_state_str(i->state)));
        respond_detail(req, 409, msg, extra);
        json_decref(extra);
        free(msg);
        return;
    }
    pool_inst_stop(i, "stopped by admin");
    httpd_respond_json(req, 202, pool_inst_json(i, 0));
}

/* ---- metrics ----------------------------------------------------------------------- */

const double pool_wait_bounds[POOL_WAIT_BUCKETS] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                                                    1,     5,     10,   30,   60};

/* A label value: node ids are the operator's, escaped as the exposition format wants. */
static void label_value(struct strbuf *sb, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            strbuf_appendf(sb, "\\%c", *v);
        else if (*v == '\n')
            strbuf_puts(sb, "\\n");
        else
            strbuf_append(sb, v, 1);
    }
}

static void node_series(struct strbuf *sb, const struct pool *p, const char *name, const char *type,
                        const char *help, int which)
{
    strbuf_appendf(sb, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    const struct list_head *pos;
    list_for_each(pos, &p->nodes)
    {
        const struct pool_node *n = list_entry(pos, struct pool_node, link);
        uint64_t v = which == 0   ? n->calls
                     : which == 1 ? n->calls_failed
                     : which == 2 ? n->starts
                     : which == 3 ? n->start_failures
                     : which == 4 ? n->queue_timeouts
                                  : n->n_waiting;
        strbuf_appendf(sb, "%s{node=\"", name);
        label_value(sb, n->id);
        strbuf_appendf(sb, "\"} %llu\n", (unsigned long long)v);
    }
}

void pool_render_metrics(const struct pool *p, struct strbuf *sb)
{
    if (!p)
        return;
    node_series(sb, p, "motor_pool_calls_total", "counter", "Invokes given a slot, by node.", 0);
    node_series(sb, p, "motor_pool_calls_failed_total", "counter",
                "Invokes answered with an error by the pool or the worker, by node.", 1);
    node_series(sb, p, "motor_pool_cold_starts_total", "counter",
                "Worker instances started (a call found no ready one), by node.", 2);
    node_series(sb, p, "motor_pool_start_failures_total", "counter",
                "Worker instances that failed to start, by node.", 3);
    node_series(sb, p, "motor_pool_queue_timeouts_total", "counter",
                "Invokes that waited for a slot longer than the node allows, by node.", 4);
    node_series(sb, p, "motor_pool_queue_depth", "gauge",
                "Invokes waiting for a slot now, by node.", 5);
    strbuf_puts(sb, "# HELP motor_pool_instances Worker instances by node and state.\n"
                    "# TYPE motor_pool_instances gauge\n");
    static const enum pool_state states[] = {POOL_STARTING, POOL_READY, POOL_STOPPING};
    const struct list_head *pos, *ipos;
    list_for_each(pos, &p->nodes)
    {
        const struct pool_node *n = list_entry(pos, struct pool_node, link);
        int counts[8] = {0};
        list_for_each(ipos, &p->insts)
        {
            const struct pool_inst *i = list_entry(ipos, struct pool_inst, link);
            if (i->node == n && (unsigned)i->state < ARRAY_LEN(counts))
                counts[i->state]++;
        }
        for (size_t k = 0; k < ARRAY_LEN(states); k++) {
            strbuf_puts(sb, "motor_pool_instances{node=\"");
            label_value(sb, n->id);
            strbuf_appendf(sb, "\",state=\"%s\"} %d\n", pool_state_str(states[k]),
                           counts[states[k]]);
        }
    }
    strbuf_puts(sb, "# HELP motor_pool_queue_wait_seconds Time invokes waited for a slot "
                    "(0 when one was free).\n"
                    "# TYPE motor_pool_queue_wait_seconds histogram\n");
    uint64_t cum = 0;
    for (int b = 0; b < POOL_WAIT_BUCKETS; b++) {
        cum += p->wait_bucket[b];
        strbuf_appendf(sb, "motor_pool_queue_wait_seconds_bucket{le=\"%g\"} %llu\n",
                       pool_wait_bounds[b], (unsigned long long)cum);
    }
    strbuf_appendf(sb,
                   "motor_pool_queue_wait_seconds_bucket{le=\"+Inf\"} %llu\n"
                   "motor_pool_queue_wait_seconds_sum %.6f\n"
                   "motor_pool_queue_wait_seconds_count %llu\n",
                   (unsigned long long)p->wait_count, p->wait_sum,
                   (unsigned long long)p->wait_count);
}

int pool_register_routes(struct pool *p, struct httpd *h)
{
    if (!p || !h)
        return -EINVAL;
    /* Reads are open (like the NM's GET routes); changes take the admin flags. */
    unsigned a = p->cfg.admin_route_flags, v = p->cfg.invoke_route_flags;
    httpd_route(h, "POST", "/node-manager/pool/nodes", h_nodes_post, p, a);
    httpd_route(h, "GET", "/node-manager/pool/nodes", h_nodes_list, p, 0);
    httpd_route(h, "GET", "/node-manager/pool/nodes/{id}", h_node_get, p, 0);
    httpd_route(h, "DELETE", "/node-manager/pool/nodes/{id}", h_node_delete, p, a);
    httpd_route(h, "POST", "/node-manager/pool/nodes/{id}/invoke", h_invoke, p, v);
    httpd_route(h, "GET", "/node-manager/pool/instances", h_instances, p, 0);
    httpd_route(h, "GET", "/node-manager/pool/instances/{id}", h_instance_get, p, 0);
    httpd_route(h, "POST", "/node-manager/pool/instances/{id}/stop", h_instance_stop, p, a);
    return 0;
}
