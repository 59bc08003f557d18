/* pool manifests: validation (every error reported), normalization, defaults, the ready
 * line parser and the seed's venv conveniences. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "pool/pool_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct pool_defaults defs(void)
{
    struct pool_config c;
    pool_config_init(&c);
    return c.defaults;
}

/* Parse text; returns the manifest (or NULL) and leaves the errors in *errs. */
static struct pool_manifest *parse(const char *text, struct cfg_errors *errs)
{
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
    assert_non_null(j);
    struct pool_defaults d = defs();
    cfg_errors_init(errs, "");
    struct pool_manifest *m = pool_manifest_parse(j, &d, "/srv/workers", errs);
    json_decref(j);
    return m;
}

static void test_minimal_gets_defaults(void **state)
{
    struct cfg_errors e;
    struct pool_manifest *m = parse("{\"id\":\"asr\",\"command\":[\"python\",\"w.py\"]}", &e);
    assert_non_null(m);
    assert_int_equal(cfg_errors_count(&e), 0);
    assert_string_equal(m->id, "asr");
    assert_int_equal(m->argc, 2);
    assert_string_equal(m->argv[0], "python");
    assert_null(m->argv[2]);
    assert_string_equal(m->workdir, "/srv/workers"); /* missing workdir = base dir */
    assert_int_equal(m->max_concurrency, 1);
    assert_int_equal(m->max_instances, 1);
    assert_int_equal(m->idle_ttl_ms, 300000);
    assert_false(m->keep_warm);
    assert_int_equal(m->ready_timeout_ms, 60000);
    assert_int_equal(m->invoke_timeout_ms, 300000);
    assert_int_equal(m->queue_timeout_ms, 300000); /* queue default = invoke timeout */
    assert_int_equal(m->n_env, 0);
    /* The normalized document has every field filled. */
    assert_int_equal(json_integer_value(json_object_get(m->doc, "max_instances")), 1);
    assert_string_equal(json_string_value(json_object_get(m->doc, "workdir")), "/srv/workers");
    pool_manifest_unref(m);
    cfg_errors_release(&e);
}

static void test_full_manifest(void **state)
{
    struct cfg_errors e;
    struct pool_manifest *m = parse(
        "{\"id\":\"emb-1.v2\",\"command\":[\"/bin/w\",\"--x\"],\"workdir\":\"sub/dir\","
        "\"env\":{\"A\":\"1\",\"B.C\":\"x=y\"},\"max_concurrency\":4,\"max_instances\":3,"
        "\"idle_ttl_seconds\":1.5,\"keep_warm\":true,\"ready_timeout_seconds\":2,"
        "\"invoke_timeout_seconds\":0.25,\"queue_timeout_seconds\":0,\"name\":\"Embedder\"}",
        &e);
    assert_non_null(m);
    assert_string_equal(m->workdir, "/srv/workers/sub/dir");
    assert_int_equal(m->n_env, 2);
    assert_string_equal(m->env[0], "A=1");
    assert_string_equal(m->env[1], "B.C=x=y");
    assert_int_equal(m->max_concurrency, 4);
    assert_int_equal(m->max_instances, 3);
    assert_int_equal(m->idle_ttl_ms, 1500);
    assert_true(m->keep_warm);
    assert_int_equal(m->ready_timeout_ms, 2000);
    assert_int_equal(m->invoke_timeout_ms, 250);
    assert_int_equal(m->queue_timeout_ms, 0);
    /* Unknown fields are the operator's: kept. */
    assert_string_equal(json_string_value(json_object_get(m->doc, "name")), "Embedder");
    pool_manifest_unref(m);
    cfg_errors_release(&e);
}

static void test_workdir_is_normalized(void **state)
{
    static const struct {
        const char *wd, *want;
    } cases[] = {
        {"..", "/srv"},
        {"./a//b/./c/", "/srv/workers/a/b/c"},
        {"../../../..", "/"},
        {"/opt/x/../y", "/opt/y"},
        {".", "/srv/workers"},
    };
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        char *json = xasprintf("{\"id\":\"a\",\"command\":[\"x\"],\"workdir\":\"%s\"}",
                               cases[k].wd);
        struct cfg_errors e;
        struct pool_manifest *m = parse(json, &e);
        assert_non_null(m);
        if (strcmp(m->workdir, cases[k].want) != 0)
            fail_msg("workdir '%s': got '%s', want '%s'", cases[k].wd, m->workdir,
                     cases[k].want);
        pool_manifest_unref(m);
        cfg_errors_release(&e);
        free(json);
    }
}

static void test_negative_ttl_means_never_and_repo_dir_alias(void **state)
{
    struct cfg_errors e;
    struct pool_manifest *m = parse(
        "{\"id\":\"a\",\"command\":[\"x\"],\"idle_ttl_seconds\":-1,\"repo_dir\":\"/opt/w\"}", &e);
    assert_non_null(m);
    assert_true(m->idle_ttl_ms < 0);
    assert_string_equal(m->workdir, "/opt/w");
    assert_int_equal(json_integer_value(json_object_get(m->doc, "idle_ttl_seconds")), -1);
    pool_manifest_unref(m);
    cfg_errors_release(&e);
}

/* Table: one bad field each, and the path the error must name. */
static void test_single_errors(void **state)
{
    static const struct {
        const char *json;
        const char *must_contain;
    } cases[] = {
        {"{\"command\":[\"x\"]}", "id: is required"},
        {"{\"id\":5,\"command\":[\"x\"]}", "id: must be a string"},
        {"{\"id\":\"\",\"command\":[\"x\"]}", "id: must be 1-64"},
        {"{\"id\":\"a b\",\"command\":[\"x\"]}", "id: must be 1-64"},
        {"{\"id\":\".hidden\",\"command\":[\"x\"]}", "id: must be 1-64"},
        {"{\"id\":\"a/b\",\"command\":[\"x\"]}", "id: must be 1-64"},
        {"{\"id\":\"a\"}", "command: is required"},
        {"{\"id\":\"a\",\"command\":\"python w.py\"}", "command: must be a non-empty array"},
        {"{\"id\":\"a\",\"command\":[]}", "command: must be a non-empty array"},
        {"{\"id\":\"a\",\"command\":[\"x\",\"\"]}", "command[1]: must be a non-empty string"},
        {"{\"id\":\"a\",\"command\":[\"x\",3]}", "command[1]: must be a non-empty string"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"workdir\":\"\"}", "workdir: must be a non-empty"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"workdir\":7}", "workdir: must be a string"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"env\":[]}", "env: must be an object"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"env\":{\"K\":1}}", "env.K: must be a string"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"env\":{\"A=B\":\"1\"}}", "env.A=B: is not a valid"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"env\":{\"\":\"1\"}}", "env.: is not a valid"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"max_concurrency\":0}", "max_concurrency: must be"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"max_concurrency\":1.5}", "max_concurrency: must be"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"max_instances\":\"2\"}", "max_instances: must be"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"max_instances\":100000}", "max_instances: must be"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"idle_ttl_seconds\":\"5\"}", "idle_ttl_seconds: must"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"keep_warm\":1}", "keep_warm: must be true or false"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"ready_timeout_seconds\":0}", "ready_timeout_seconds"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"invoke_timeout_seconds\":-3}",
         "invoke_timeout_seconds"},
        {"{\"id\":\"a\",\"command\":[\"x\"],\"queue_timeout_seconds\":-1}", "queue_timeout_seconds"},
        {"[1,2]", "a manifest must be a JSON object"},
    };
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        struct cfg_errors e;
        struct pool_manifest *m = parse(cases[k].json, &e);
        if (m || !strstr(cfg_errors_text(&e), cases[k].must_contain))
            fail_msg("case %zu %s: expected error containing '%s', got '%s'", k, cases[k].json,
                     cases[k].must_contain, cfg_errors_text(&e));
        assert_int_equal(cfg_errors_count(&e), 1);
        cfg_errors_release(&e);
    }
}

static void test_all_errors_reported_at_once(void **state)
{
    struct cfg_errors e;
    struct pool_manifest *m = parse(
        "{\"id\":\"bad id\",\"command\":[1,\"\"],\"env\":{\"X\":2},\"max_concurrency\":-1,"
        "\"max_instances\":0,\"keep_warm\":\"yes\",\"ready_timeout_seconds\":\"10\"}",
        &e);
    assert_null(m);
    const char *t = cfg_errors_text(&e);
    assert_int_equal(cfg_errors_count(&e), 8);
    assert_non_null(strstr(t, "id:"));
    assert_non_null(strstr(t, "command[0]:"));
    assert_non_null(strstr(t, "command[1]:"));
    assert_non_null(strstr(t, "env.X:"));
    assert_non_null(strstr(t, "max_concurrency:"));
    assert_non_null(strstr(t, "max_instances:"));
    assert_non_null(strstr(t, "keep_warm:"));
    assert_non_null(strstr(t, "ready_timeout_seconds:"));
    json_t *arr = pool_errors_json(&e);
    assert_int_equal(json_array_size(arr), 8);
    json_decref(arr);
    cfg_errors_release(&e);
}

static void test_id_valid(void **state)
{
    assert_true(pool_id_valid("a"));
    assert_true(pool_id_valid("Whisper_large-v3.1"));
    char id[70];
    memset(id, 'x', 64);
    id[64] = '\0';
    assert_true(pool_id_valid(id));
    id[64] = 'x';
    id[65] = '\0';
    assert_false(pool_id_valid(id));
    assert_false(pool_id_valid(""));
    assert_false(pool_id_valid(NULL));
    assert_false(pool_id_valid("a%2f"));
    assert_false(pool_id_valid("é"));
}

static void test_ready_line(void **state)
{
    static const struct {
        const char *line;
        int rc, port;
    } cases[] = {
        {"MOTOR_NODE_READY port=8123", 1, 8123},
        {"WOV_NODE_READY port=1", 1, 1},
        {"  MOTOR_NODE_READY host=127.0.0.1 port=65535 pid=3", 1, 65535},
        {"MOTOR_NODE_READY port=8123\r", 1, 8123},
        {"MOTOR_NODE_READY port=0", -EINVAL, 0},
        {"MOTOR_NODE_READY port=65536", -EINVAL, 0},
        {"MOTOR_NODE_READY port=12ab", -EINVAL, 0},
        {"MOTOR_NODE_READY port=", -EINVAL, 0},
        {"MOTOR_NODE_READY", -EINVAL, 0},
        {"MOTOR_NODE_READYport=5", 0, 0},
        {"loading MOTOR_NODE_READY port=5", 0, 0},
        {"", 0, 0},
        {"INFO server ready", 0, 0},
    };
    for (size_t k = 0; k < ARRAY_LEN(cases); k++) {
        int port = -1;
        int rc = pool_parse_ready_line(cases[k].line, &port);
        if (rc != cases[k].rc || (rc == 1 && port != cases[k].port))
            fail_msg("'%s': rc %d port %d, want rc %d port %d", cases[k].line, rc, port,
                     cases[k].rc, cases[k].port);
    }
}

static void test_json_str_sanitizes(void **state)
{
    json_t *j = pool_json_str("ok\xff\xfe!", 5);
    assert_non_null(j);
    assert_string_equal(json_string_value(j), "ok\xef\xbf\xbd\xef\xbf\xbd!");
    json_decref(j);
    j = pool_lines_json("a\nb\xc3\n\nc");
    assert_int_equal(json_array_size(j), 4);
    assert_string_equal(json_string_value(json_array_get(j, 1)), "b\xef\xbf\xbd");
    assert_string_equal(json_string_value(json_array_get(j, 2)), "");
    json_decref(j);
}

/* ---- venv conveniences ---------------------------------------------------------------- */

static void mkdirs(const char *path)
{
    char *cmd = xasprintf("mkdir -p '%s'", path);
    assert_int_equal(system(cmd), 0);
    free(cmd);
}

static void test_venv_python(void **state)
{
    char tmpl[] = "/tmp/pool-venv-XXXXXX";
    char *root = mkdtemp(tmpl);
    assert_non_null(root);
    assert_null(pool_venv_python(root, "python3")); /* no venv */
    char *bin = xasprintf("%s/.venv/bin", root);
    mkdirs(bin);
    char *py = xasprintf("%s/python", bin);
    assert_int_equal(util_write_file_atomic(py, "#!/bin/sh\n", 10, 0755), 0);
    char *got = pool_venv_python(root, "python");
    assert_non_null(got);
    assert_string_equal(got, py);
    free(got);
    got = pool_venv_python(root, "PYTHON3");
    assert_non_null(got);
    free(got);
    assert_null(pool_venv_python(root, "/usr/bin/python3")); /* explicit paths are kept */
    assert_null(pool_venv_python(root, "node"));
    chmod(py, 0644); /* not executable: not used */
    assert_null(pool_venv_python(root, "python"));
    char *rm = xasprintf("rm -rf '%s'", root);
    assert_int_equal(system(rm), 0);
    free(rm);
    free(py);
    free(bin);
}

static void test_cuda_library_path(void **state)
{
    char tmpl[] = "/tmp/pool-cuda-XXXXXX";
    char *root = mkdtemp(tmpl);
    assert_non_null(root);
    assert_null(pool_cuda_library_path(root, "/usr/lib"));
    char *a = xasprintf("%s/.venv/lib/python3.11/site-packages/nvidia/cublas/lib", root);
    char *b = xasprintf("%s/.venv/lib/python3.11/site-packages/nvidia/cudnn/lib", root);
    char *c = xasprintf("%s/.venv/lib/python3.11/site-packages/nvidia/nccl/include", root);
    mkdirs(a);
    mkdirs(b);
    mkdirs(c);
    char *got = pool_cuda_library_path(root, NULL);
    char *want = xasprintf("%s:%s", a, b);
    assert_string_equal(got, want);
    free(got);
    free(want);
    /* Existing entries are kept after, and not repeated. */
    char *cur = xasprintf("/usr/local/lib:%s", b);
    got = pool_cuda_library_path(root, cur);
    want = xasprintf("%s:/usr/local/lib:%s", a, b);
    assert_string_equal(got, want);
    free(got);
    free(want);
    free(cur);
    char *rm = xasprintf("rm -rf '%s'", root);
    assert_int_equal(system(rm), 0);
    free(rm);
    free(a);
    free(b);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_minimal_gets_defaults),
        cmocka_unit_test(test_full_manifest),
        cmocka_unit_test(test_negative_ttl_means_never_and_repo_dir_alias),
        cmocka_unit_test(test_workdir_is_normalized),
        cmocka_unit_test(test_single_errors),
        cmocka_unit_test(test_all_errors_reported_at_once),
        cmocka_unit_test(test_id_valid),
        cmocka_unit_test(test_ready_line),
        cmocka_unit_test(test_json_str_sanitizes),
        cmocka_unit_test(test_venv_python),
        cmocka_unit_test(test_cuda_library_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
