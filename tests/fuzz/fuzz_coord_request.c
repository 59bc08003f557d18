/* libFuzzer: a client's inference body through the coordinator's request rewriting
 * (pdreq.h): the vLLM prefill and decode legs, the SGLang bootstrap legs, the balancer's
 * token estimate, and the same bytes read as a prefill engine's answer (the KV ticket)
 * and as a response to strip. Clients and engines are untrusted peers here. Checks the
 * promises the proxy relies on: a prefill leg never streams and asks for one token, the
 * decode leg carries the ticket, the estimate is >= 1, a ticket is only accepted with
 * do_remote_prefill true, and stripped responses carry no internal field. */
#include "coordinator/pdreq.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void legs(json_t *body)
{
    json_t *p = pdreq_vllm_prefill(body, "rid-1");
    if (!p || !json_is_object(p))
        abort();
    if (json_is_true(json_object_get(p, "stream")) ||
        json_integer_value(json_object_get(p, "max_tokens")) != 1 ||
        json_object_get(p, "stream_options"))
        abort();
    json_t *kv = json_object_get(p, "kv_transfer_params");
    if (!json_is_true(json_object_get(kv, "do_remote_decode")))
        abort();
    json_t *ticket = json_pack("{s:b,s:s,s:[i,i],s:s,s:i}", "do_remote_prefill", 1,
                               "remote_engine_id", "e", "remote_block_ids", 1, 2,
                               "remote_host", "127.0.0.1", "remote_port", 8100);
    json_t *d = pdreq_vllm_decode(body, "rid-1", ticket);
    if (!d || !json_equal(json_object_get(d, "kv_transfer_params"), ticket))
        abort();
    for (int pre = 0; pre < 2; pre++) {
        json_t *s = pdreq_sglang_leg(body, pre, "127.0.0.1", 8998, 42, "rid-1");
        if (!s || (pre && json_is_true(json_object_get(s, "stream"))))
            abort();
        json_decref(s);
    }
    if (pdreq_estimate_tokens(body, false) < 1 || pdreq_estimate_tokens(body, true) < 1)
        abort();
    json_decref(d);
    json_decref(ticket);
    json_decref(p);
}

static void response(json_t *resp, const uint8_t *data, size_t size)
{
    json_t *ticket = NULL;
    char err[256] = "";
    int rc = pdreq_vllm_ticket(resp, &ticket, err, sizeof(err));
    if (rc == 0) {
        if (!ticket || !json_is_true(json_object_get(ticket, "do_remote_prefill")))
            abort();
        json_decref(ticket);
    } else if (rc != -EPROTO || !err[0]) {
        abort();
    }
    bool maybe = pdreq_has_internal((const char *)data, size);
    json_t *copy = json_deep_copy(resp);
    bool removed = pdreq_strip_response(copy);
    /* the cheap pre-test must never miss a body that carries an internal field */
    if (removed && !maybe)
        abort();
    if (json_object_get(copy, "kv_transfer_params"))
        abort();
    json_decref(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    if (!j)
        return 0;
    if (json_is_object(j)) {
        legs(j);
        response(j, data, size);
    }
    (void)pdreq_bootstrap_room(size, 3, "rid", (int)(size & 7));
    json_decref(j);
    return 0;
}
