/* resume — mid-stream continuation: scan, continuation body, splice (see resume.h). */
#include "coordinator/resume.h"

#include "common/util.h"
#include "coordinator/pdreq.h"
#include "coordinator/sse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RESUME_TEXT_MAX (64u << 20)

struct scan_ctx {
    struct resume_state *st;
    bool ids_ok; /* every token so far carried an id */
    bool usage_seen;
    char *err;
    size_t cap;
};

/* "token_id:N" → N; -1 when the string is not one. */
static json_int_t token_id_of(const char *s)
{
    if (!s || strncmp(s, "token_id:", 9) != 0 || !s[9])
        return -1;
    char *end;
    long long v = strtoll(s + 9, &end, 10);
    return *end || v < 0 ? -1 : (json_int_t)v;
}

/* The ids of one chunk's logprobs (completions: tokens[]; chat: content[].token). False
 * when the chunk has no logprobs or one token without an id. */
static bool chunk_ids(const json_t *choice, bool chat, json_t *ids, size_t *n)
{
    const json_t *lp = json_object_get(choice, "logprobs");
    const json_t *arr = chat ? json_object_get(lp, "content") : json_object_get(lp, "tokens");
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return false;
    size_t i;
    const json_t *t;
    json_array_foreach(arr, i, t)
    {
        json_int_t id = token_id_of(json_string_value(chat ? json_object_get(t, "token") : t));
        if (id < 0)
            return false;
        json_array_append_new(ids, json_integer(id));
    }
    *n = json_array_size(arr);
    return true;
}

static int scan_event(const char *raw, size_t raw_len, const char *data, size_t data_len,
                      bool has_data, void *arg)
{
    (void)raw;
    (void)raw_len;
    struct scan_ctx *x = arg;
    struct resume_state *st = x->st;
    if (!has_data || (data_len == 6 && memcmp(data, "[DONE]", 6) == 0))
        return 0;
    json_t *j = json_loadb(data, data_len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        snprintf(x->err, x->cap, "an event the client got is not a JSON object");
        return 1;
    }
    if (json_object_get(j, "error")) {
        json_decref(j);
        snprintf(x->err, x->cap, "the stream carried an error event");
        return 1;
    }
    const char *id = json_string_value(json_object_get(j, "id"));
    if (id && !st->id)
        st->id = xstrdup(id);
    const json_t *cr = json_object_get(j, "created");
    if (json_is_integer(cr) && !st->have_created) {
        st->created = json_integer_value(cr);
        st->have_created = true;
    }
    const json_t *usage = json_object_get(j, "usage");
    const json_t *ct = json_object_get(usage, "completion_tokens");
    const json_t *choices = json_object_get(j, "choices");
    size_t i;
    const json_t *c;
    json_array_foreach(choices, i, c)
    {
        const json_t *idx = json_object_get(c, "index");
        if (json_integer_value(idx) != 0) {
            json_decref(j);
            snprintf(x->err, x->cap, "more than one choice");
            return 1;
        }
        const char *piece;
        if (st->chat) {
            const json_t *delta = json_object_get(c, "delta");
            if (json_object_get(delta, "role"))
                st->role_sent = true;
            if (json_object_get(delta, "tool_calls")) {
                json_decref(j);
                snprintf(x->err, x->cap, "a tool call is being streamed");
                return 1;
            }
            piece = json_string_value(json_object_get(delta, "content"));
        } else {
            piece = json_string_value(json_object_get(c, "text"));
        }
        size_t n_ids = 0;
        if (piece && *piece) {
            if (strbuf_puts(&st->text, piece) < 0) {
                json_decref(j);
                snprintf(x->err, x->cap, "the answer so far is too long to re-send");
                return 1;
            }
            if (x->ids_ok && !chunk_ids(c, st->chat, st->ids, &n_ids))
                x->ids_ok = false;
            if (!x->usage_seen)
                st->tokens += n_ids ? (int64_t)n_ids : 1;
        }
        const json_t *fr = json_object_get(c, "finish_reason");
        if (fr && !json_is_null(fr))
            st->finished = true;
    }
    /* continuous_usage_stats: the engine's own count wins over counting chunks */
    if (json_is_integer(ct)) {
        x->usage_seen = true;
        st->tokens = json_integer_value(ct);
    }
    json_decref(j);
    return 0;
}

int resume_scan(const char *rec, size_t len, bool chat, struct resume_state *st, char *err,
                size_t cap)
{
    memset(st, 0, sizeof(*st));
    st->chat = chat;
    strbuf_init(&st->text, RESUME_TEXT_MAX);
    st->ids = json_array();
    struct scan_ctx x = {st, true, false, err, cap};
    struct sse_parser p;
    sse_init(&p, RESUME_TEXT_MAX, RESUME_TEXT_MAX);
    int rc = sse_feed(&p, rec, len, scan_event, &x);
    sse_release(&p);
    if (!x.ids_ok || json_array_size(st->ids) == 0) {
        json_decref(st->ids);
        st->ids = NULL;
    }
    if (rc != 0) {
        if (rc == -E2BIG)
            snprintf(err, cap, "an event the client got is too large");
        return -EINVAL;
    }
    return 0;
}

void resume_release(struct resume_state *st)
{
    strbuf_release(&st->text);
    json_decref(st->ids);
    st->ids = NULL;
    free(st->id);
    st->id = NULL;
}

/* key -= by when key is an integer (at least floor); absent keys stay absent. */
static void reduce(json_t *o, const char *key, int64_t by, int64_t floor)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return;
    int64_t left = json_integer_value(v) - by;
    json_object_set_new(o, key, json_integer(left < floor ? floor : left));
}

json_t *resume_body(const json_t *orig, const struct resume_state *st, char *err, size_t cap)
{
    const json_t *n = json_object_get(orig, "n");
    if (n && !json_is_null(n) && json_integer_value(n) != 1) {
        snprintf(err, cap, "n > 1");
        return NULL;
    }
    const json_t *bo = json_object_get(orig, "best_of");
    if (bo && !json_is_null(bo) && json_integer_value(bo) > 1) {
        snprintf(err, cap, "best_of > 1");
        return NULL;
    }
    json_t *b = json_deep_copy(orig);
    const char *text = strbuf_str(&st->text);
    if (st->chat) {
        const json_t *msgs = json_object_get(b, "messages");
        if (!json_is_array(msgs)) {
            json_decref(b);
            snprintf(err, cap, "no messages");
            return NULL;
        }
        if (*text) {
            json_array_append_new((json_t *)msgs,
                                  json_pack("{s:s, s:s}", "role", "assistant", "content", text));
            json_object_set_new(b, "continue_final_message", json_true());
            json_object_set_new(b, "add_generation_prompt", json_false());
        }
        reduce(b, "max_tokens", st->tokens, 1);
        reduce(b, "max_completion_tokens", st->tokens, 1);
    } else {
        json_t *prompt = json_object_get(b, "prompt");
        if (json_is_string(prompt)) {
            size_t pl = json_string_length(prompt), tl = strlen(text);
            char *p = xmalloc(pl + tl + 1);
            memcpy(p, json_string_value(prompt), pl);
            memcpy(p + pl, text, tl + 1);
            json_object_set_new(b, "prompt", json_stringn_nocheck(p, pl + tl));
            free(p);
        } else if (json_is_array(prompt) && json_array_size(prompt) > 0 &&
                   json_is_integer(json_array_get(prompt, 0))) {
            if (*text && !st->ids) {
                json_decref(b);
                snprintf(err, cap, "a token-id prompt, and the stream carried no token ids");
                return NULL;
            }
            if (st->ids)
                json_array_extend(prompt, st->ids);
        } else {
            json_decref(b);
            snprintf(err, cap, "a batch of prompts");
            return NULL;
        }
        if (!json_object_get(b, "max_tokens") || json_is_null(json_object_get(b, "max_tokens")))
            json_object_set_new(b, "max_tokens", json_integer(16)); /* vLLM's default */
        reduce(b, "max_tokens", st->tokens, 1);
        json_object_set_new(b, "echo", json_false());
    }
    reduce(b, "min_tokens", st->tokens, 0);
    return b;
}

bool resume_rewrite(json_t *ev, const struct resume_state *st)
{
    if (st->id)
        json_object_set_new(ev, "id", json_string(st->id));
    if (st->have_created)
        json_object_set_new(ev, "created", json_integer(st->created));
    pdreq_strip_response(ev);
    json_t *usage = json_object_get(ev, "usage");
    if (json_is_object(usage)) {
        reduce(usage, "prompt_tokens", st->tokens, 0);
        json_t *ct = json_object_get(usage, "completion_tokens");
        if (json_is_integer(ct))
            json_object_set_new(usage, "completion_tokens",
                                json_integer(json_integer_value(ct) + st->tokens));
    }
    if (!st->chat || !st->role_sent)
        return true;
    json_t *choices = json_object_get(ev, "choices");
    json_t *c = json_array_get(choices, 0);
    json_t *delta = json_object_get(c, "delta");
    if (!json_object_get(delta, "role"))
        return true;
    json_object_del(delta, "role");
    /* The continuation's own opening chunk: nothing left in it once the role is gone. */
    const char *content = json_string_value(json_object_get(delta, "content"));
    const json_t *fr = json_object_get(c, "finish_reason");
    const json_t *lp = json_object_get(c, "logprobs");
    bool empty = (!content || !*content) && json_object_size(delta) <= 1 &&
                 (!fr || json_is_null(fr)) && (!lp || json_is_null(lp)) &&
                 json_array_size(choices) == 1 && (!usage || json_is_null(usage));
    return !empty;
}

bool resume_json_complete(const char *body, size_t len)
{
    size_t i = 0;
    while (i < len && (body[i] == ' ' || body[i] == '\n' || body[i] == '\r' || body[i] == '\t'))
        i++;
    if (i >= len || (body[i] != '{' && body[i] != '['))
        return i < len; /* a scalar: nothing to count (an engine answers objects) */
    int depth = 0;
    for (; i < len; i++) {
        char ch = body[i];
        if (ch == '"') {
            /* skip the string: memchr to each quote, escapes counted back */
            for (;;) {
                const char *q = memchr(body + i + 1, '"', len - i - 1);
                if (!q)
                    return false;
                i = (size_t)(q - body);
                size_t bs = 0;
                while (body[i - 1 - bs] == '\\')
                    bs++;
                if (!(bs & 1))
                    break;
            }
        } else if (ch == '{' || ch == '[') {
            depth++;
        } else if (ch == '}' || ch == ']') {
            if (--depth == 0) {
                for (i++; i < len; i++)
                    if (body[i] != ' ' && body[i] != '\n' && body[i] != '\r' && body[i] != '\t')
                        return false;
                return true;
            }
        }
    }
    return false;
}

bool resume_json_closed(const char *body, size_t len)
{
    while (len && (body[len - 1] == ' ' || body[len - 1] == '\n' || body[len - 1] == '\r' ||
                   body[len - 1] == '\t'))
        len--;
    return len && (body[len - 1] == '}' || body[len - 1] == ']');
}
