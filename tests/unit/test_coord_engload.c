/* Reading an engine's /metrics: vLLM's and SGLang's names, label sets summed, usage
 * capped, comments and malformed lines skipped. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "coordinator/engload.h"

#include <string.h>

static void test_vllm(void **st)
{
    (void)st;
    const char *t = "# HELP vllm:num_requests_running Number of requests.\n"
                    "# TYPE vllm:num_requests_running gauge\n"
                    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
                    "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2\n"
                    "vllm:num_requests_waiting{model_name=\"m\"} 4.0\n"
                    "vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9\n"
                    "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\r\n"
                    "vllm:num_requests_running_total 99\n";
    struct engload l;
    assert_true(engload_parse(t, strlen(t), &l));
    assert_true(l.running == 5.0);
    assert_true(l.waiting == 4.0);
    assert_true(l.kv_usage == 0.25);
}

static void test_sglang_and_junk(void **st)
{
    (void)st;
    const char *t = "sglang:num_running_reqs{tp_rank=\"0\"} 7\n"
                    "sglang:num_queue_reqs 1e1\n"
                    "sglang:token_usage 1.7\n"
                    "vllm:num_requests_waiting nan\n"
                    "vllm:num_requests_waiting -3\n"
                    "vllm:num_requests_waiting {broken\n"
                    "vllm:num_requests_running";
    struct engload l;
    assert_true(engload_parse(t, strlen(t), &l));
    assert_true(l.running == 7.0);
    assert_true(l.waiting == 10.0);
    assert_true(l.kv_usage == 1.0);
    assert_false(engload_parse("other 1\n", 8, &l));
    assert_false(engload_parse("", 0, &l));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm),
        cmocka_unit_test(test_sglang_and_junk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
