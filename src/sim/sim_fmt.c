#include "sim/sim_fmt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sim_fmt_event(struct strbuf *sb, const char *type, json_t *obj, int *seq)
{
    if (!obj)
        return -ENOMEM;
    json_object_set_new(obj, "type", json_string(type));
    if (seq)
        json_object_set_new(obj, "sequence_number", json_integer((*seq)++));
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s)
        return -ENOMEM;
    size_t before = sb->len;
    int rc = strbuf_puts(sb, "event: ");
    if (!rc)
        rc = strbuf_puts(sb, type);
    if (!rc)
        rc = strbuf_puts(sb, "\ndata: ");
    if (!rc)
        rc = strbuf_puts(sb, s);
    if (!rc)
        rc = strbuf_puts(sb, "\n\n");
    if (rc) {
        sb->len = before;
        if (sb->buf)
            sb->buf[before] = '\0';
    }
    free(s);
    return rc;
}

static json_t *usage_obj(const struct sim_fmt_usage *u)
{
    return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", u->input,
                     "input_tokens_details", "cached_tokens", u->cached, "output_tokens", u->output,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                     u->input + u->output);
}

static json_t *text_part(const char *text, json_t *logprobs)
{
    json_t *p = json_pack("{s:s, s:s, s:[]}", "type", "output_text", "text", text ? text : "",
                          "annotations");
    if (logprobs)
        json_object_set_new(p, "logprobs", logprobs);
    return p;
}

static json_t *message_item(const struct sim_fmt_meta *m, const char *status, const char *text,
                            json_t *logprobs)
{
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, text_part(text, logprobs));
    else
        json_decref(logprobs);
    return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", m->item_id ? m->item_id : "", "type",
                     "message", "status", status, "role", "assistant", "content", content);
}

json_t *sim_fmt_response(const struct sim_fmt_meta *m, const char *status, const char *text,
                         const struct sim_fmt_usage *u, json_t *logprobs)
{
    json_t *out = json_array();
    if (text)
        json_array_append_new(out, message_item(m, !strcmp(status, "in_progress")   ? "in_progress"
                                                   : !strcmp(status, "incomplete") ? "incomplete"
                                                                                   : "completed",
                                                text, logprobs));
    else
        json_decref(logprobs);
    json_t *r = json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:o, s:o, s:o, s:b, s:s, s:[], s:n, s:n, s:o}", "id",
        m->id ? m->id : "", "object", "response", "created_at", (json_int_t)m->created, "model",
        m->model ? m->model : "", "status", status, "output", out, "instructions",
        m->instructions ? json_string(m->instructions) : json_null(), "max_output_tokens",
        m->max_output_tokens > 0 ? json_integer(m->max_output_tokens) : json_null(),
        "parallel_tool_calls", 1, "tool_choice", "auto", "tools", "temperature", "top_p", "usage",
        u ? usage_obj(u) : json_null());
    json_object_set_new(r, "incomplete_details",
                        !strcmp(status, "incomplete")
                            ? json_pack("{s:s}", "reason", "max_output_tokens")
                            : json_null());
    json_object_set_new(r, "error", json_null());
    return r;
}

void sim_fmt_resp_open(struct strbuf *sb, const struct sim_fmt_meta *m, int *seq)
{
    sim_fmt_event(sb, "response.created",
                  json_pack("{s:o}", "response", sim_fmt_response(m, "in_progress", NULL, NULL, NULL)),
                  seq);
    sim_fmt_event(sb, "response.in_progress",
                  json_pack("{s:o}", "response", sim_fmt_response(m, "in_progress", NULL, NULL, NULL)),
                  seq);
    sim_fmt_event(sb, "response.output_item.added",
                  json_pack("{s:i, s:o}", "output_index", 0, "item",
                            message_item(m, "in_progress", NULL, NULL)),
                  seq);
    sim_fmt_event(sb, "response.content_part.added",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", m->item_id, "output_index", 0,
                            "content_index", 0, "part", text_part("", NULL)),
                  seq);
}

void sim_fmt_resp_delta(struct strbuf *sb, const struct sim_fmt_meta *m, const char *delta,
                        int *seq)
{
    sim_fmt_event(sb, "response.output_text.delta",
                  json_pack("{s:s, s:i, s:i, s:s, s:[]}", "item_id", m->item_id, "output_index", 0,
                            "content_index", 0, "delta", delta, "logprobs"),
                  seq);
}

void sim_fmt_resp_close(struct strbuf *sb, const struct sim_fmt_meta *m, const char *status,
                        const char *text, const struct sim_fmt_usage *u, int *seq)
{
    sim_fmt_event(sb, "response.output_text.done",
                  json_pack("{s:s, s:i, s:i, s:s, s:[]}", "item_id", m->item_id, "output_index", 0,
                            "content_index", 0, "text", text, "logprobs"),
                  seq);
    sim_fmt_event(sb, "response.content_part.done",
                  json_pack("{s:s, s:i, s:i, s:o}", "item_id", m->item_id, "output_index", 0,
                            "content_index", 0, "part", text_part(text, NULL)),
                  seq);
    sim_fmt_event(sb, "response.output_item.done",
                  json_pack("{s:i, s:o}", "output_index", 0, "item",
                            message_item(m, !strcmp(status, "incomplete") ? "incomplete" : "completed",
                                         text, NULL)),
                  seq);
    const char *ev = !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed";
    sim_fmt_event(sb, ev,
                  json_pack("{s:o}", "response", sim_fmt_response(m, status, text, u, NULL)), seq);
}

json_t *sim_fmt_message(const struct sim_fmt_meta *m, const char *text, const char *stop,
                        const struct sim_fmt_usage *u)
{
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s, s:s}", "type", "text", "text", text));
    return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:n, s:{s:i, s:i}}", "id", m->id, "type",
                     "message", "role", "assistant", "model", m->model ? m->model : "", "content",
                     content, "stop_reason", stop ? json_string(stop) : json_null(),
                     "stop_sequence", "usage", "input_tokens", u->input, "output_tokens",
                     u->output);
}

void sim_fmt_msg_open(struct strbuf *sb, const struct sim_fmt_meta *m,
                      const struct sim_fmt_usage *u)
{
    struct sim_fmt_usage start = {.input = u->input};
    sim_fmt_event(sb, "message_start",
                  json_pack("{s:o}", "message", sim_fmt_message(m, NULL, NULL, &start)), NULL);
    sim_fmt_event(sb, "content_block_start",
                  json_pack("{s:i, s:{s:s, s:s}}", "index", 0, "content_block", "type", "text",
                            "text", ""),
                  NULL);
    sim_fmt_event(sb, "ping", json_object(), NULL);
}

void sim_fmt_msg_delta(struct strbuf *sb, const char *delta)
{
    sim_fmt_event(sb, "content_block_delta",
                  json_pack("{s:i, s:{s:s, s:s}}", "index", 0, "delta", "type", "text_delta", "text",
                            delta),
                  NULL);
}

void sim_fmt_msg_close(struct strbuf *sb, const char *stop, const struct sim_fmt_usage *u)
{
    sim_fmt_event(sb, "content_block_stop", json_pack("{s:i}", "index", 0), NULL);
    sim_fmt_event(sb, "message_delta",
                  json_pack("{s:{s:s, s:n}, s:{s:i}}", "delta", "stop_reason", stop,
                            "stop_sequence", "usage", "output_tokens", u->output),
                  NULL);
    sim_fmt_event(sb, "message_stop", json_object(), NULL);
}

json_t *sim_fmt_anthropic_error(int status, const char *message)
{
    const char *t = status == 400   ? "invalid_request_error"
                    : status == 404 ? "not_found_error"
                    : status == 413 ? "request_too_large"
                    : status == 503 ? "overloaded_error"
                                    : "api_error";
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message",
                          message ? message : "");
    if (!o)
        o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message",
                      "invalid request");
    return o;
}
