#include "sim/sim_resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *error_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 409:
        return "conflict_error";
    case 502:
        return "bad_gateway";
    case 503:
        return "service_unavailable";
    default:
        return status >= 500 ? "internal_server_error" : "invalid_request_error";
    }
}

json_t *sim_resp_error(int status, const char *message, const char *param)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:i}}", "error", "message", message ? message : "",
                          "type", error_type(status), "param",
                          param && *param ? json_string(param) : json_null(), "code", status);
    /* Only invalid UTF-8 in message/param can fail the pack: answer without them. */
    if (!o)
        o = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", "invalid request", "type",
                      error_type(status), "param", "code", status);
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
    if (api == SIM_API_CHAT)
        return json_pack("{s:i, s:{s:s, s:s, s:[]}, s:n, s:o, s:n}", "index", index, "message",
                         "role", "assistant", "content", text ? text : "", "tool_calls", "logprobs",
                         "finish_reason", reason(finish_reason), "stop_reason");
    return json_pack("{s:i, s:s, s:n, s:o, s:n}", "index", index, "text", text ? text : "",
                     "logprobs", "finish_reason", reason(finish_reason), "stop_reason");
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
    json_t *o = envelope(m, m->api == SIM_API_CHAT ? "chat.completion.chunk" : "text_completion");
    json_t *choice;
    if (m->api == SIM_API_CHAT) {
        json_t *delta = json_object();
        if (with_role)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (text)
            json_object_set_new(delta, "content", json_string(text));
        choice = json_pack("{s:i, s:o, s:n, s:o, s:n}", "index", index, "delta", delta, "logprobs",
                           "finish_reason", reason(finish_reason), "stop_reason");
    } else {
        choice = json_pack("{s:i, s:s, s:n, s:o, s:n}", "index", index, "text", text ? text : "",
                           "logprobs", "finish_reason", reason(finish_reason), "stop_reason");
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
