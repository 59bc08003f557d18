#include "coordinator/pdreq.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

json_t *pdreq_vllm_prefill(const json_t *orig, const char *request_id)
{
    json_t *b = json_deep_copy(orig);
    json_object_set_new(b, "stream", json_false());
    json_object_set_new(b, "max_tokens", json_integer(1));
    json_object_set_new(b, "min_tokens", json_integer(1));
    if (json_object_get(b, "max_completion_tokens"))
        json_object_set_new(b, "max_completion_tokens", json_integer(1));
    json_object_del(b, "stream_options");
    json_object_set_new(b, "request_id", json_string(request_id));
    json_object_set_new(b, "kv_transfer_params",
                        json_pack("{s:b, s:b, s:n, s:n, s:n, s:n}", "do_remote_decode", 1,
                                  "do_remote_prefill", 0, "remote_engine_id", "remote_block_ids",
                                  "remote_host", "remote_port"));
    return b;
}

json_t *pdreq_vllm_decode(const json_t *orig, const char *request_id, const json_t *ticket)
{
    json_t *b = json_deep_copy(orig);
    json_object_set_new(b, "request_id", json_string(request_id));
    json_object_set_new(b, "kv_transfer_params", json_deep_copy(ticket));
    return b;
}

int pdreq_vllm_ticket(const json_t *prefill_resp, json_t **ticket, char *err, size_t cap)
{
    *ticket = NULL;
    if (!json_is_object(prefill_resp)) {
        snprintf(err, cap, "prefill response is not a JSON object");
        return -EPROTO;
    }
    json_t *kv = json_object_get(prefill_resp, "kv_transfer_params");
    if (!json_is_object(kv)) {
        snprintf(err, cap, "prefill response carries no kv_transfer_params");
        return -EPROTO;
    }
    if (!json_is_true(json_object_get(kv, "do_remote_prefill"))) {
        snprintf(err, cap, "prefill kv_transfer_params lack do_remote_prefill=true");
        return -EPROTO;
    }
    *ticket = json_incref(kv);
    return 0;
}

json_t *pdreq_sglang_leg(const json_t *orig, bool prefill, const char *bootstrap_host,
                         int bootstrap_port, uint64_t room, const char *rid)
{
    json_t *b = json_deep_copy(orig);
    json_object_set_new(b, "bootstrap_host", json_string(bootstrap_host));
    json_object_set_new(
        b, "bootstrap_port",
        json_integer(bootstrap_port > 0 ? bootstrap_port : WIRE_SGLANG_BOOTSTRAP_PORT));
    json_object_set_new(b, "bootstrap_room", json_integer((json_int_t)(room & INT64_MAX)));
    json_object_set_new(b, "rid", json_string(rid));
    if (prefill) {
        json_object_set_new(b, "stream", json_false());
        json_object_del(b, "stream_options");
    }
    return b;
}

/* FNV-1a 64: small, stable across builds and platforms, good enough to keep rooms of
 * concurrent requests apart. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t pdreq_bootstrap_room(int64_t p_id, int64_t d_id, const char *request_id, int attempt)
{
    char buf[96];
    int n = snprintf(buf, sizeof(buf), "%lld|%lld|%d|", (long long)p_id, (long long)d_id, attempt);
    uint64_t h = fnv1a(0xcbf29ce484222325ull, buf, (size_t)n);
    h = fnv1a(h, request_id, strlen(request_id));
    return h & (uint64_t)INT64_MAX;
}

static const char *const internal_fields[] = {"kv_transfer_params", "bootstrap_host",
                                              "bootstrap_port", "bootstrap_room"};

bool pdreq_strip_response(json_t *resp)
{
    if (!json_is_object(resp))
        return false;
    bool removed = false;
    for (size_t i = 0; i < sizeof(internal_fields) / sizeof(internal_fields[0]); i++)
        if (json_object_del(resp, internal_fields[i]) == 0)
            removed = true;
    return removed;
}

bool pdreq_has_internal(const char *data, size_t len)
{
    return memmem(data, len, "kv_transfer_params", 18) || memmem(data, len, "bootstrap_", 10);
}

static size_t content_chars(const json_t *v, int depth)
{
    if (depth > 8 || !v)
        return 0;
    if (json_is_string(v))
        return json_string_length(v);
    size_t n = 0;
    if (json_is_array(v)) {
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x)
        {
            /* Token-id prompts count one token per element (4 "chars"). */
            n += json_is_integer(x) ? 4 : content_chars(x, depth + 1);
        }
    } else if (json_is_object(v)) {
        n += content_chars(json_object_get(v, "content"), depth + 1);
        n += content_chars(json_object_get(v, "text"), depth + 1);
    }
    return n;
}

int64_t pdreq_estimate_tokens(const json_t *req, bool prefill_only)
{
    size_t chars = content_chars(json_object_get(req, "prompt"), 0) +
                   content_chars(json_object_get(req, "messages"), 0);
    int64_t t = (int64_t)(chars / 4) + 1;
    if (!prefill_only) {
        json_t *m = json_object_get(req, "max_completion_tokens");
        if (!json_is_integer(m))
            m = json_object_get(req, "max_tokens");
        int64_t gen = json_is_integer(m) ? (int64_t)json_integer_value(m) : 256;
        if (gen < 0)
            gen = 0;
        if (gen > 1 << 20)
            gen = 1 << 20;
        t += gen;
    }
    return t;
}
