/* sim_req: table-driven parsing and validation of completion / chat bodies. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim/sim_req.h"
#include "sim/sim_text.h"

#include <errno.h>
#include <string.h>

static const char *const models[] = {"sim-model", "alias"};
static const struct sim_req_limits lim = {.max_model_len = 128, .models = models, .n_models = 2};

struct bad_case {
    enum sim_api api;
    const char *body;
    int status;
    const char *param;    /* expected err.param */
    const char *contains; /* substring of the message */
};

static const struct bad_case bad[] = {
    {SIM_API_COMPLETIONS, "[]", 400, "", "JSON object"},
    {SIM_API_COMPLETIONS, "\"x\"", 400, "", "JSON object"},
    {SIM_API_COMPLETIONS, "{}", 400, "prompt", "required"},
    {SIM_API_COMPLETIONS, "{\"prompt\": null}", 400, "prompt", "required"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"\"}", 400, "prompt", "empty"},
    {SIM_API_COMPLETIONS, "{\"prompt\": 5}", 400, "prompt", "must be a string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": []}", 400, "prompt", "empty"},
    {SIM_API_COMPLETIONS, "{\"prompt\": [1, \"a\"]}", 400, "prompt", "token ids"},
    {SIM_API_COMPLETIONS, "{\"prompt\": [\"a\", 1]}", 400, "prompt", "must be a string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": [-1]}", 400, "prompt", "token ids"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"max_tokens\": -3}", 400, "max_tokens", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"max_tokens\": 129}", 400, "max_tokens", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a b c\", \"max_tokens\": 126}", 400, "max_tokens",
     "maximum context length"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"max_tokens\": \"16\"}", 400, "max_tokens",
     "integer"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"max_tokens\": 1.5}", 400, "max_tokens", "integer"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"stream\": \"yes\"}", 400, "stream", "boolean"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", 400,
     "stream_options", "stream=True"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"stream\": true, \"stream_options\": 3}", 400,
     "stream_options", "object"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"model\": \"other\"}", 404, "model",
     "does not exist"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"model\": 7}", 400, "model", "string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"n\": 0}", 400, "n", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"n\": 17}", 400, "n", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"temperature\": \"hot\"}", 400, "temperature",
     "number"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"temperature\": -1}", 400, "temperature",
     "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"top_p\": 0}", 400, "top_p", "between"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"stop\": 3}", 400, "stop", "string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"stop\": [\"x\", 3]}", 400, "stop", "string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"min_tokens\": 20, \"max_tokens\": 10}", 400,
     "min_tokens", "exceed"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"request_id\": 5}", 400, "request_id", "string"},
    {SIM_API_COMPLETIONS, "{\"prompt\": \"a\", \"kv_transfer_params\": 1}", 400,
     "kv_transfer_params", "object"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_decode\": true, "
     "\"do_remote_prefill\": true}}",
     400, "kv_transfer_params", "exclusive"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_prefill\": true}}", 400,
     "kv_transfer_params", "remote_host"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_prefill\": true, \"remote_host\": "
     "\"h\"}}",
     400, "kv_transfer_params", "remote_port"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_prefill\": true, \"remote_host\": "
     "\"h\", \"remote_port\": 70000}}",
     400, "remote_port", "between"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_prefill\": true, \"remote_host\": "
     "\"h\", \"remote_port\": 7, \"remote_block_ids\": []}}",
     400, "kv_transfer_params", "remote_block_ids"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"kv_transfer_params\": {\"do_remote_prefill\": true, \"remote_host\": "
     "\"h\", \"remote_port\": 7, \"remote_block_ids\": [\"x\"]}}",
     400, "kv_transfer_params", "integers"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": [\"a\", \"b\"], \"kv_transfer_params\": {\"do_remote_decode\": true}}", 400,
     "kv_transfer_params", "exactly one prompt"},
    {SIM_API_COMPLETIONS,
     "{\"prompt\": \"a\", \"stream\": true, \"kv_transfer_params\": {\"do_remote_decode\": true}}",
     400, "stream", "must not stream"},
    {SIM_API_CHAT, "{}", 400, "messages", "required"},
    {SIM_API_CHAT, "{\"messages\": {}}", 400, "messages", "list"},
    {SIM_API_CHAT, "{\"messages\": []}", 400, "messages", "empty"},
    {SIM_API_CHAT, "{\"messages\": [1]}", 400, "messages", "object"},
    {SIM_API_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages", "role"},
    {SIM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages",
     "content"},
    {SIM_API_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400,
     "messages", "only 'text'"},
    {SIM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
     400, "messages", "text must be a string"},
    {SIM_API_CHAT,
     "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}",
     400, "max_completion_tokens", "between"},
};

static void test_bad_inputs(void **state)
{
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_error_t je;
        json_t *body = json_loads(bad[i].body, JSON_DECODE_ANY, &je);
        assert_non_null(body);
        struct sim_req r;
        struct sim_err err;
        int rc = sim_req_parse(body, bad[i].api, &lim, &r, &err);
        if (rc != -EINVAL || err.status != bad[i].status || strcmp(err.param, bad[i].param) != 0 ||
            !strstr(err.message, bad[i].contains))
            fail_msg("case %zu (%s): rc=%d status=%d param='%s' message='%s'", i, bad[i].body, rc,
                     err.status, err.param, err.message);
        sim_req_release(&r);
        json_decref(body);
    }
}

static int parse_ok(const char *text, enum sim_api api, struct sim_req *r)
{
    json_error_t je;
    json_t *body = json_loads(text, 0, &je);
    assert_non_null(body);
    struct sim_err err;
    int rc = sim_req_parse(body, api, &lim, r, &err);
    if (rc)
        fail_msg("unexpected error for %s: %d %s", text, err.status, err.message);
    json_decref(body);
    return rc;
}

static void test_completion_defaults(void **state)
{
    struct sim_req r;
    parse_ok("{\"prompt\": \"one two  three\\nfour\"}", SIM_API_COMPLETIONS, &r);
    assert_string_equal(r.model, "sim-model");
    assert_int_equal(r.n_prompts, 1);
    /* the tokenizer (sim_tok.h): "one", " two", " ", " three", "\n", "four" */
    assert_int_equal(r.prompts[0].tokens, 6);
    assert_int_equal(r.max_tokens, SIM_COMPLETIONS_DEFAULT_MAX_TOKENS);
    assert_int_equal(r.n, 1);
    assert_false(r.stream);
    assert_int_equal(r.leg, SIM_LEG_NONE);
    assert_null(r.request_id);
    sim_req_release(&r);
    sim_req_release(&r); /* idempotent */
}

static void test_completion_fields(void **state)
{
    struct sim_req r;
    parse_ok("{\"model\": \"alias\", \"prompt\": [\"a b\", \"c\"], \"max_tokens\": 7.0, \"n\": 3, "
             "\"stream\": true, \"stream_options\": {\"include_usage\": true, "
             "\"continuous_usage_stats\": true}, \"ignore_eos\": true, \"min_tokens\": 2, "
             "\"request_id\": \"abc\", \"temperature\": 0.7, \"stop\": [\"x\"], \"unknown\": 1}",
             SIM_API_COMPLETIONS, &r);
    assert_string_equal(r.model, "alias");
    assert_int_equal(r.n_prompts, 2);
    assert_int_equal(r.prompts[0].tokens, 2);
    assert_int_equal(r.prompts[1].tokens, 1);
    assert_int_equal(sim_req_prompt_tokens(&r), 3);
    assert_true(r.prompts[0].hash != r.prompts[1].hash);
    assert_int_equal(r.max_tokens, 7);
    assert_int_equal(r.min_tokens, 2);
    assert_int_equal(r.n, 3);
    assert_true(r.stream && r.include_usage && r.continuous_usage && r.ignore_eos);
    assert_string_equal(r.request_id, "abc");
    sim_req_release(&r);
}

static void test_token_id_prompts(void **state)
{
    struct sim_req r;
    parse_ok("{\"prompt\": [1, 2, 3]}", SIM_API_COMPLETIONS, &r);
    assert_int_equal(r.n_prompts, 1);
    assert_int_equal(r.prompts[0].tokens, 3);
    uint64_t h = r.prompts[0].hash;
    sim_req_release(&r);
    parse_ok("{\"prompt\": [[1, 2, 3], [4]]}", SIM_API_COMPLETIONS, &r);
    assert_int_equal(r.n_prompts, 2);
    assert_true(r.prompts[0].hash == h);
    assert_int_equal(r.prompts[1].tokens, 1);
    sim_req_release(&r);
}

static void test_chat(void **state)
{
    struct sim_req r;
    parse_ok("{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": "
             "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi there\"}]}, {\"role\": "
             "\"assistant\", \"content\": null}]}",
             SIM_API_CHAT, &r);
    assert_int_equal(r.n_prompts, 1);
    /* 3 messages of template overhead + 4 words */
    assert_int_equal(r.prompts[0].tokens, 7);
    /* chat defaults to the rest of the context */
    assert_int_equal(r.max_tokens, 128 - 7);
    uint64_t h = r.prompts[0].hash;
    sim_req_release(&r);

    /* max_completion_tokens wins over max_tokens; the same conversation hashes alike */
    parse_ok("{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": "
             "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi there\"}]}, {\"role\": "
             "\"assistant\", \"content\": null}], \"max_tokens\": 9, \"max_completion_tokens\": 4}",
             SIM_API_CHAT, &r);
    assert_int_equal(r.max_tokens, 4);
    assert_true(r.prompts[0].hash == h);
    sim_req_release(&r);

    /* a different role changes the prompt */
    parse_ok("{\"messages\": [{\"role\": \"user\", \"content\": \"be brief\"}]}", SIM_API_CHAT, &r);
    assert_true(r.prompts[0].hash != h);
    sim_req_release(&r);
}

static void test_kv_legs(void **state)
{
    struct sim_req r;
    parse_ok(
        "{\"prompt\": \"a\", \"max_tokens\": 1, \"kv_transfer_params\": {\"do_remote_decode\": "
        "true, \"do_remote_prefill\": false, \"remote_engine_id\": null, \"remote_block_ids\": "
        "null, \"remote_host\": null, \"remote_port\": null}}",
        SIM_API_COMPLETIONS, &r);
    assert_int_equal(r.leg, SIM_LEG_PREFILL);
    sim_req_release(&r);

    parse_ok(
        "{\"prompt\": \"a\", \"stream\": true, \"kv_transfer_params\": {\"do_remote_prefill\": "
        "true, \"do_remote_decode\": false, \"remote_engine_id\": \"e1\", \"remote_block_ids\": "
        "[10, 11], \"remote_host\": \"10.0.0.1\", \"remote_port\": 8100}}",
        SIM_API_COMPLETIONS, &r);
    assert_int_equal(r.leg, SIM_LEG_DECODE);
    assert_string_equal(r.remote_host, "10.0.0.1");
    assert_int_equal(r.remote_port, 8100);
    assert_string_equal(r.remote_engine_id, "e1");
    assert_int_equal(r.n_remote_block_ids, 2);
    assert_int_equal(r.remote_block_ids[1], 11);
    sim_req_release(&r);

    parse_ok("{\"prompt\": \"a\", \"kv_transfer_params\": {}}", SIM_API_COMPLETIONS, &r);
    assert_int_equal(r.leg, SIM_LEG_NONE);
    sim_req_release(&r);
}

/* A message quoting peer text must stay valid UTF-8 when cut at the message cap. */
static void test_error_utf8_truncation(void **state)
{
    char model[300];
    size_t n = 0;
    model[n++] = 'x'; /* odd offset: the cap falls inside a 2-byte sequence */
    while (n + 2 <= 249) {
        model[n++] = (char)0xC3; /* U+00E9 */
        model[n++] = (char)0xA9;
    }
    model[n] = '\0';
    json_t *j = json_pack("{s:s, s:s}", "prompt", "a", "model", model);
    assert_non_null(j);
    struct sim_req r;
    struct sim_err err;
    assert_int_equal(sim_req_parse(j, SIM_API_COMPLETIONS, &lim, &r, &err), -EINVAL);
    assert_int_equal(err.status, 404);
    assert_true(strlen(err.message) < sizeof(err.message));
    json_decref(j);
    json_t *s = json_string(err.message);
    assert_non_null(s); /* jansson rejects invalid UTF-8 */
    json_decref(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_completion_defaults),
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_token_id_prompts),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_kv_legs),
        cmocka_unit_test(test_error_utf8_truncation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
