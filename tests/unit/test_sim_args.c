/* sim_args: vLLM-style command lines, the simulator's flags, unknown flags. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "sim/sim_args.h"

#include <errno.h>
#include <string.h>

#define ARGV(...) ((char *[]){"engine-sim", __VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){"engine-sim", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(a, err, ...)                                                                         \
    sim_args_parse((a), ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), err, sizeof(err))

static void test_defaults(void **state)
{
    struct sim_args a;
    char err[200];
    char *argv[] = {"engine-sim", NULL};
    assert_int_equal(sim_args_parse(&a, 1, argv, err, sizeof(err)), 0);
    assert_string_equal(a.host, "127.0.0.1");
    assert_int_equal(a.port, 8000);
    assert_string_equal(a.model, "sim-model");
    assert_int_equal(a.n_served, 1);
    assert_string_equal(a.served_names[0], "sim-model");
    assert_int_equal(a.dp_rank, 0);
    assert_int_equal(a.dp_size, 1);
    assert_false(a.headless);
    assert_false(a.ft);
    assert_true(a.tokens_per_second == 50.0);
    assert_int_equal(a.ttft_ms, 20);
    assert_int_equal(a.workers, 0);
    assert_true(a.crash_after < 0);
    assert_int_equal(a.ft_recover_ms, 500);
    assert_int_equal(a.max_model_len, 4096);
    assert_int_equal(a.n_ignored, 0);
    sim_args_release(&a);
}

/* What the node manager renders for a vLLM P/D engine, plus noise. */
static void test_vllm_command_line(void **state)
{
    struct sim_args a;
    char err[200];
    int rc = PARSE(
        &a, err, "serve", "/models/qwen", "--host", "10.0.0.5", "--port=18001",
        "--served-model-name", "qwen", "qwen-alias", "--data-parallel-size", "4",
        "--data-parallel-rank=2", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port",
        "9000", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2",
        "--kv-transfer-config",
        "{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\",\"engine_id\":\"7\"}",
        "--tensor-parallel-size", "8", "--enforce-eager", "--gpu-memory-utilization=0.9",
        "--disable-access-log-for-endpoints", "/health,/metrics", "--no-enable-prefix-caching",
        "--seed", "-1", "--enable-fault-tolerance", "--node-rank", "1", "--master-addr", "10.0.0.1",
        "--master-port", "29500", "--headless");
    assert_int_equal(rc, 0);
    assert_string_equal(a.model, "/models/qwen");
    assert_string_equal(a.host, "10.0.0.5");
    assert_int_equal(a.port, 18001);
    assert_int_equal(a.n_served, 2);
    assert_string_equal(a.served_names[1], "qwen-alias");
    assert_int_equal(a.dp_size, 4);
    assert_int_equal(a.dp_rank, 2);
    assert_string_equal(a.dp_address, "10.0.0.1");
    assert_int_equal(a.dp_rpc_port, 9000);
    assert_int_equal(a.dp_size_local, 2);
    assert_int_equal(a.dp_start_rank, 2);
    assert_string_equal(a.kv_role, "kv_producer");
    assert_string_equal(a.kv_engine_id, "7");
    assert_true(a.ft);
    assert_true(a.headless);
    assert_int_equal(a.node_rank, 1);
    assert_string_equal(a.master_addr, "10.0.0.1");
    assert_int_equal(a.master_port, 29500);
    assert_false(a.prefix_caching); /* --no-enable-prefix-caching is a real flag now */
    const char *ignored[] = {
        "--tensor-parallel-size 8",     "--enforce-eager",
        "--gpu-memory-utilization=0.9", "--disable-access-log-for-endpoints /health,/metrics",
        "--seed -1"};
    assert_int_equal(a.n_ignored, sizeof(ignored) / sizeof(ignored[0]));
    for (size_t i = 0; i < a.n_ignored; i++)
        assert_string_equal(a.ignored[i], ignored[i]);
    sim_args_release(&a);
}

static void test_sim_flags(void **state)
{
    struct sim_args a;
    char err[200];
    assert_int_equal(PARSE(&a, err, "--load-seconds", "1.5", "--tokens-per-second=0", "--ttft-ms",
                           "0", "--workers", "3", "--fail-load", "--crash-after", "2.5", "--ft",
                           "--ft-recover-ms", "50", "--fault", "unhealthy", "--model", "m",
                           "--max-num-seqs", "4", "--max-model-len", "64", "--log-level", "debug"),
                     0);
    assert_true(a.load_seconds == 1.5);
    assert_true(a.tokens_per_second == 0.0);
    assert_int_equal(a.ttft_ms, 0);
    assert_int_equal(a.workers, 3);
    assert_true(a.fail_load);
    assert_true(a.crash_after == 2.5);
    assert_true(a.ft);
    assert_int_equal(a.ft_recover_ms, 50);
    assert_string_equal(a.fault, "unhealthy");
    assert_string_equal(a.model, "m");
    assert_string_equal(a.served_names[0], "m");
    assert_int_equal(a.max_num_seqs, 4);
    assert_int_equal(a.max_model_len, 64);
    assert_string_equal(a.log_level, "debug");
    sim_args_release(&a);

    assert_int_equal(PARSE(&a, err, "--help"), 0);
    assert_true(a.help);
    sim_args_release(&a);

    /* vLLM's HTTPS flags (uvicorn's ssl_* settings) */
    assert_int_equal(PARSE(&a, err, "--ssl-certfile", "/c.pem", "--ssl-keyfile=/k.pem",
                           "--ssl-ca-certs", "/ca.pem", "--ssl-cert-reqs", "2"),
                     0);
    assert_string_equal(a.ssl_certfile, "/c.pem");
    assert_string_equal(a.ssl_keyfile, "/k.pem");
    assert_string_equal(a.ssl_ca_certs, "/ca.pem");
    assert_int_equal(a.ssl_cert_reqs, 2);
    assert_int_equal(a.n_ignored, 0);
    sim_args_release(&a);
}

struct bad_case {
    const char *a1, *a2;
    const char *contains;
};

static void test_errors(void **state)
{
    static const struct bad_case bad[] = {
        {"--port", "70000", "out of range for --port"},
        {"--port", "x", "invalid value for --port"},
        {"--port", NULL, "missing value for --port"},
        {"--workers", "-1", "--workers"},
        {"--workers", "65", "out of range"},
        {"--load-seconds", "nan", "--load-seconds"},
        {"--tokens-per-second", "-5", "--tokens-per-second"},
        {"--kv-transfer-config", "[1]", "kv-transfer-config"},
        {"--kv-transfer-config", "{bad", "kv-transfer-config"},
        {"--fault", "crash", "--fault"},
        {"--data-parallel-size", "0", "--data-parallel-size"},
        {"--headless=maybe", NULL, "--headless"},
        {"--model", "--port", "missing value for --model"},
        {"--ssl-keyfile", "/k.pem", "go together: missing --ssl-certfile"},
        {"--ssl-certfile", "/c.pem", "go together: missing --ssl-keyfile"},
        {"--ssl-cert-reqs", "3", "out of range for --ssl-cert-reqs"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sim_args a;
        char err[200];
        char *argv[] = {"engine-sim", (char *)bad[i].a1, (char *)bad[i].a2, NULL};
        int argc = bad[i].a2 ? 3 : 2;
        int rc = sim_args_parse(&a, argc, argv, err, sizeof(err));
        if (rc != -EINVAL || !strstr(err, bad[i].contains))
            fail_msg("case %zu: rc=%d err='%s'", i, rc, err);
    }
    /* a DP rank must be inside the DP world */
    struct sim_args a;
    char err[200];
    assert_int_equal(PARSE(&a, err, "--data-parallel-size", "2", "--data-parallel-rank", "2"),
                     -EINVAL);
    assert_non_null(strstr(err, "data-parallel-rank"));
}

static void test_positional_and_bools(void **state)
{
    struct sim_args a;
    char err[200];
    /* --flag=value for booleans; the model flag beats a later positional */
    assert_int_equal(PARSE(&a, err, "--model", "a", "b", "--headless=false", "--ft=true"), 0);
    assert_string_equal(a.model, "a");
    assert_false(a.headless);
    assert_true(a.ft);
    assert_int_equal(a.n_ignored, 1);
    assert_string_equal(a.ignored[0], "b");
    sim_args_release(&a);
    /* an unknown flag at the end has no value to take */
    assert_int_equal(PARSE(&a, err, "x", "--trailing"), 0);
    assert_string_equal(a.model, "x");
    assert_int_equal(a.n_ignored, 1);
    assert_string_equal(a.ignored[0], "--trailing");
    sim_args_release(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_vllm_command_line),
        cmocka_unit_test(test_sim_flags),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_positional_and_bools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
