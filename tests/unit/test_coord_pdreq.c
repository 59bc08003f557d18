/* PD request rewriting: vLLM hand-off legs, the ticket, SGLang bootstrap, stripping. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/pdreq.h"

#include <errno.h>
#include <string.h>

static json_t *J(const char *t)
{
    json_error_t e;
    json_t *j = json_loads(t, 0, &e);
    if (!j)
        fail_msg("bad json %s", t);
    return j;
}

static void assert_json_eq(json_t *got, const char *want)
{
    json_t *w = J(want);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_SORT_KEYS);
        fail_msg("got %s\nwant %s", g, want);
    }
    json_decref(w);
}

static void test_vllm_prefill_completions(void **state)
{
    (void)state;
    json_t *orig = J("{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":true,\"max_tokens\":50,"
                     "\"stream_options\":{\"include_usage\":true},\"temperature\":0}");
    json_t *p = pdreq_vllm_prefill(orig, "r-1");
    assert_json_eq(p,
                   "{\"model\":\"m\",\"prompt\":\"hi\",\"stream\":false,\"max_tokens\":1,"
                   "\"min_tokens\":1,\"temperature\":0,\"request_id\":\"r-1\","
                   "\"kv_transfer_params\":{\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                   "\"remote_engine_id\":null,\"remote_block_ids\":null,\"remote_host\":null,"
                   "\"remote_port\":null}}");
    /* the client's body is untouched */
    assert_true(json_is_true(json_object_get(orig, "stream")));
    assert_int_equal(json_integer_value(json_object_get(orig, "max_tokens")), 50);
    json_decref(p);
    json_decref(orig);
}

static void test_vllm_prefill_chat_max_completion(void **state)
{
    (void)state;
    json_t *orig = J("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                     "\"max_completion_tokens\":9,\"kv_transfer_params\":{\"evil\":1}}");
    json_t *p = pdreq_vllm_prefill(orig, "r-2");
    assert_int_equal(json_integer_value(json_object_get(p, "max_completion_tokens")), 1);
    assert_int_equal(json_integer_value(json_object_get(p, "max_tokens")), 1);
    assert_null(json_object_get(json_object_get(p, "kv_transfer_params"), "evil"));
    json_decref(p);

    json_t *ticket = J("{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                       "\"remote_engine_id\":\"e\",\"remote_block_ids\":[1,2],"
                       "\"remote_host\":\"10.0.0.1\",\"remote_port\":5555}");
    json_t *d = pdreq_vllm_decode(orig, "r-2", ticket);
    assert_json_eq(d,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                   "\"max_completion_tokens\":9,\"request_id\":\"r-2\","
                   "\"kv_transfer_params\":{\"do_remote_prefill\":true,\"do_remote_decode\":false,"
                   "\"remote_engine_id\":\"e\",\"remote_block_ids\":[1,2],"
                   "\"remote_host\":\"10.0.0.1\",\"remote_port\":5555}}");
    json_decref(d);
    json_decref(ticket);
    json_decref(orig);
}

static void test_ticket(void **state)
{
    (void)state;
    static const struct {
        const char *resp;
        int rc;
    } cases[] = {
        {"{\"choices\":[],\"kv_transfer_params\":{\"do_remote_prefill\":true,\"remote_host\":\"h\"}"
         "}",
         0},
        {"{\"choices\":[]}", -EPROTO},
        {"{\"kv_transfer_params\":null}", -EPROTO},
        {"{\"kv_transfer_params\":{\"do_remote_prefill\":false}}", -EPROTO},
        {"{\"kv_transfer_params\":{\"do_remote_prefill\":1}}", -EPROTO},
        {"[1]", -EPROTO},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *r = J(cases[i].resp);
        json_t *t = NULL;
        char err[128] = "";
        int rc = pdreq_vllm_ticket(r, &t, err, sizeof(err));
        if (rc != cases[i].rc)
            fail_msg("case %zu rc %d", i, rc);
        if (rc == 0) {
            assert_string_equal(json_string_value(json_object_get(t, "remote_host")), "h");
            json_decref(t);
        } else {
            assert_null(t);
            assert_true(err[0]);
        }
        json_decref(r);
    }
}

static void test_sglang(void **state)
{
    (void)state;
    json_t *orig = J("{\"model\":\"m\",\"prompt\":\"p\",\"stream\":true,"
                     "\"stream_options\":{\"include_usage\":true}}");
    uint64_t room = pdreq_bootstrap_room(1, 2, "r", 0);
    assert_true(room <= (uint64_t)INT64_MAX);
    assert_int_equal(room, pdreq_bootstrap_room(1, 2, "r", 0));
    assert_true(room != pdreq_bootstrap_room(1, 2, "r", 1));
    assert_true(room != pdreq_bootstrap_room(1, 3, "r", 0));
    json_t *p = pdreq_sglang_leg(orig, true, "10.0.0.1", 0, room, "r");
    json_t *d = pdreq_sglang_leg(orig, false, "10.0.0.1", 9000, room, "r");
    assert_false(json_is_true(json_object_get(p, "stream")));
    assert_null(json_object_get(p, "stream_options"));
    assert_int_equal(json_integer_value(json_object_get(p, "bootstrap_port")),
                     WIRE_SGLANG_BOOTSTRAP_PORT);
    assert_true(json_is_true(json_object_get(d, "stream")));
    assert_non_null(json_object_get(d, "stream_options"));
    assert_int_equal(json_integer_value(json_object_get(d, "bootstrap_port")), 9000);
    assert_string_equal(json_string_value(json_object_get(d, "bootstrap_host")), "10.0.0.1");
    assert_string_equal(json_string_value(json_object_get(d, "rid")), "r");
    assert_int_equal((uint64_t)json_integer_value(json_object_get(p, "bootstrap_room")), room);
    assert_int_equal((uint64_t)json_integer_value(json_object_get(d, "bootstrap_room")), room);
    json_decref(p);
    json_decref(d);
    json_decref(orig);
}

static void test_strip_and_estimate(void **state)
{
    (void)state;
    json_t *r = J("{\"id\":\"x\",\"choices\":[],\"kv_transfer_params\":null}");
    const char *raw = "{\"kv_transfer_params\":null}";
    assert_true(pdreq_has_internal(raw, strlen(raw)));
    assert_false(pdreq_has_internal("{\"choices\":[]}", 14));
    assert_true(pdreq_strip_response(r));
    assert_false(pdreq_strip_response(r));
    assert_json_eq(r, "{\"id\":\"x\",\"choices\":[]}");
    json_decref(r);

    json_t *q = J("{\"prompt\":\"0123456789abcdef\",\"max_tokens\":10}");
    assert_int_equal(pdreq_estimate_tokens(q, true), 5);
    assert_int_equal(pdreq_estimate_tokens(q, false), 15);
    json_decref(q);
    q = J("{\"messages\":[{\"role\":\"user\",\"content\":\"01234567\"},"
          "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"0123\"}]}]}");
    assert_int_equal(pdreq_estimate_tokens(q, false), 12 / 4 + 1 + 256);
    json_decref(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm_prefill_completions),
        cmocka_unit_test(test_vllm_prefill_chat_max_completion),
        cmocka_unit_test(test_ticket),
        cmocka_unit_test(test_sglang),
        cmocka_unit_test(test_strip_and_estimate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
