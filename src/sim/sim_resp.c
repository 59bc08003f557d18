#include "sim/sim_resp.h"

#include "sim/sim_tok.h"

#include "common/http1.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* vLLM's err_type names (create_error_response): BadRequestError (400),
 * NotFoundError (404), InternalServerError (500), ...; the rest follow the same
 * CamelCase family. */
const char *sim_resp_error_type(int status)
{
    return http1_openai_error_type(status);
}

json_t *sim_resp_error(int status, const char *message, const char *param)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:i}}", "error", "message", message ? message : "",
                          "type", sim_resp_error_type(status), "param",
                          param && *param ? json_string(param) : json_null(), "code", status);
    /* Only invalid UTF-8 in message/param can fail the pack: answer without them. */
    if (!o)
        o = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", "invalid request", "type",
                      sim_resp_error_type(status), "param", "code", status);
    return o;
}

json_t *sim_resp_error_from(const struct sim_err *err)
{
    return sim_resp_error(err->status, err->message, err->param);
}

json_t *sim_resp_usage(int prompt_tokens, int completion_tokens)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt_tokens, "total_tokens",
                     (json_int_t)prompt_tokens + completion_tokens, "completion_tokens",
                     completion_tokens);
}

static json_t *reason(const char *finish_reason)
{
    return finish_reason ? json_string(finish_reason) : json_null();
}

json_t *sim_resp_choice(enum sim_api api, int index, const char *text, const char *finish_reason)
{
    return sim_resp_choice_lp(api, index, text, finish_reason, NULL);
}

json_t *sim_resp_choice_lp(enum sim_api api, int index, const char *text, const char *finish_reason,
                           json_t *logprobs)
{
    json_t *lp = logprobs ? logprobs : json_null();
    if (api == SIM_API_CHAT)
        return json_pack("{s:i, s:{s:s, s:s, s:[]}, s:o, s:o, s:n}", "index", index, "message",
                         "role", "assistant", "content", text ? text : "", "tool_calls", "logprobs",
                         lp, "finish_reason", reason(finish_reason), "stop_reason");
    return json_pack("{s:i, s:s, s:o, s:o, s:n}", "index", index, "text", text ? text : "",
                     "logprobs", lp, "finish_reason", reason(finish_reason), "stop_reason");
}

static json_t *envelope(const struct sim_resp_meta *m, const char *object)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id ? m->id : "", "object", object, "created",
                     (json_int_t)m->created, "model", m->model ? m->model : "");
}

json_t *sim_resp_body(const struct sim_resp_meta *m, json_t *choices, json_t *usage)
{
    json_t *o = envelope(m, m->api == SIM_API_CHAT ? "chat.completion" : "text_completion");
    json_object_set_new(o, "choices", choices ? choices : json_array());
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

json_t *sim_resp_chunk(const struct sim_resp_meta *m, int index, const char *text, bool with_role,
                       const char *finish_reason, json_t *usage)
{
    return sim_resp_chunk_lp(m, index, text, with_role, finish_reason, usage, NULL);
}

json_t *sim_resp_chunk_lp(const struct sim_resp_meta *m, int index, const char *text,
                          bool with_role, const char *finish_reason, json_t *usage,
                          json_t *logprobs)
{
    json_t *lp = logprobs ? logprobs : json_null();
    json_t *o = envelope(m, m->api == SIM_API_CHAT ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    if (m->api == SIM_API_CHAT) {
        json_t *delta = json_object();
        if (with_role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text)
            json_object_set_new(delta, "content", json_string(text));
        choice = json_pack("{s:i, s:o, s:o, s:o, s:n}", "index", index, "delta", delta, "logprobs",
                           lp, "finish_reason", reason(finish_reason), "stop_reason");
    } else {
        choice = json_pack("{s:i, s:s, s:o, s:o, s:n}", "index", index, "text", text ? text : "",
                           "logprobs", lp, "finish_reason", reason(finish_reason), "stop_reason");
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (usage)
        json_object_set_new(o, "usage", usage);
    else if (m->usage_null)
        json_object_set_new(o, "usage", json_null());
    return o;
}

json_t *sim_resp_usage_chunk(const struct sim_resp_meta *m, json_t *usage)
{
    json_t *o = envelope(m, m->api == SIM_API_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", usage ? usage : json_null());
    return o;
}

int sim_sse_event(struct strbuf *sb, const json_t *obj)
{
    char *s = json_dumps(obj, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s)
        return -ENOMEM;
    size_t before = sb->len;
    int rc = strbuf_puts(sb, "data: ");
    if (!rc)
        rc = strbuf_puts(sb, s);
    if (!rc)
        rc = strbuf_puts(sb, "\n\n");
    if (rc) {
        /* Never leave half an event behind. */
        sb->len = before;
        if (sb->buf)
            sb->buf[before] = '\0';
    }
    free(s);
    return rc;
}

int sim_sse_done(struct strbuf *sb)
{
    return strbuf_puts(sb, "data: [DONE]\n\n");
}

/* ---- logprobs ------------------------------------------------------------------- */

static void token_str(int32_t id, bool as_ids, char *buf, size_t cap)
{
    if (as_ids)
        snprintf(buf, cap, "token_id:%d", (int)id);
    else
        sim_tok_text(id, true, buf, cap);
}

/* Python's len(): code points. */
static int64_t cp_len(const char *s)
{
    int64_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static json_t *bytes_of(const char *t)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        json_array_append_new(a, json_integer(*p));
    return a;
}

static json_t *lp_value(double lp)
{
    return json_real(lp < -9999.0 ? -9999.0 : lp);
}

json_t *sim_resp_chat_lp_entry(const struct sim_lp *lp, int top, bool as_ids)
{
    char t[SIM_TOK_TEXT_MAX + 24];
    token_str(lp->e[0].id, as_ids, t, sizeof(t));
    json_t *tops = json_array();
    /* vLLM: the first `top` entries of the sampled-first dict */
    for (int i = 0; i < lp->n && i < top; i++) {
        char a[SIM_TOK_TEXT_MAX + 24];
        token_str(lp->e[i].id, as_ids, a, sizeof(a));
        json_array_append_new(tops, json_pack("{s:s, s:o, s:o}", "token", a, "logprob",
                                              lp_value(lp->e[i].lp), "bytes", bytes_of(a)));
    }
    return json_pack("{s:s, s:o, s:o, s:o}", "token", t, "logprob", lp_value(lp->e[0].lp), "bytes",
                     bytes_of(t), "top_logprobs", tops);
}

json_t *sim_resp_chat_lp_wrap(json_t *content)
{
    return json_pack("{s:o}", "content", content ? content : json_array());
}

json_t *sim_resp_cmpl_lp_new(void)
{
    return json_pack("{s:[], s:[], s:[], s:[]}", "text_offset", "token_logprobs", "tokens",
                     "top_logprobs");
}

void sim_resp_cmpl_lp_add(json_t *o, const struct sim_lp *lp, int top, bool as_ids, int64_t *offset)
{
    char t[SIM_TOK_TEXT_MAX + 24];
    token_str(lp->e[0].id, as_ids, t, sizeof(t));
    json_array_append_new(json_object_get(o, "text_offset"), json_integer(*offset));
    json_array_append_new(json_object_get(o, "token_logprobs"), lp_value(lp->e[0].lp));
    json_array_append_new(json_object_get(o, "tokens"), json_string(t));
    /* vLLM: the first top + 1 entries of the sampled-first dict */
    json_t *d = json_object();
    for (int i = 0; i < lp->n && i <= top; i++) {
        char a[SIM_TOK_TEXT_MAX + 24];
        token_str(lp->e[i].id, as_ids, a, sizeof(a));
        if (!json_object_get(d, a))
            json_object_set_new(d, a, lp_value(lp->e[i].lp));
    }
    json_array_append_new(json_object_get(o, "top_logprobs"), d);
    *offset += cp_len(t);
}
