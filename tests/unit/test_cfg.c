/* cfg: typed getters, error collection and file loading. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/cfg.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char doc_text[] =
    "{\"a\": {\"int\": 5, \"real_int\": 2.0, \"frac\": 2.5, \"big\": 70000, \"neg\": -3,"
    "        \"str\": \"abc\", \"empty\": \"\", \"t\": true, \"f\": false, \"null\": null,"
    "        \"dbl\": 0.5, \"huge_real\": 1e300, \"obj\": {\"x\": {\"y\": 7}}, \"arr\": [1, 2],"
    "        \"engine\": \"vllm\", \"Engine\": \"VLLM\", \"nul\": \"a\\u0000b\","
    "        \"long\": \"0123456789012345678901234567890123456789012345678901234567890123456789\"},"
    " \"scalar\": 7, \"nullobj\": null}";

static json_t *load_doc(void)
{
    json_error_t err;
    json_t *doc = json_loads(doc_text, JSON_ALLOW_NUL, &err);
    if (!doc)
        fail_msg("test doc: %s (line %d)", err.text, err.line);
    return doc;
}

/* Asserts the error text is exactly `want` (NULL: no errors). */
static void check_errors(struct cfg_errors *e, const char *want)
{
    if (!want) {
        assert_int_equal(cfg_errors_count(e), 0);
        assert_string_equal(cfg_errors_text(e), "");
    } else {
        assert_int_equal(cfg_errors_count(e), 1);
        assert_string_equal(cfg_errors_text(e), want);
    }
}

struct int_case {
    const char *path;
    int64_t def, min, max;
    int64_t want;
    const char *err; /* full expected text with prefix "p" or NULL */
};

static void test_get_int(void **state)
{
    (void)state;
    static const struct int_case cases[] = {
        {"a.int", 9, 0, 10, 5, NULL},
        {"a.neg", 9, -5, 10, -3, NULL},
        {"a.real_int", 9, 0, 10, 2, NULL},
        {"a.missing", 9, 0, 10, 9, NULL},
        {"missing.deeper.still", 9, 0, 10, 9, NULL},
        {"a.null", 9, 0, 10, 9, NULL},
        {"nullobj.x", 9, 0, 10, 9, NULL},
        {"a.frac", 9, 0, 10, 9, "p.a.frac: must be an integer in [0, 10], got 2.5\n"},
        {"a.big", 1026, 1, 65535, 1026, "p.a.big: must be an integer in [1, 65535], got 70000\n"},
        {"a.int", 9, 6, 10, 9, "p.a.int: must be an integer in [6, 10], got 5\n"},
        {"a.int", 9, 0, 4, 9, "p.a.int: must be an integer in [0, 4], got 5\n"},
        {"a.str", 9, 0, 10, 9, "p.a.str: must be an integer in [0, 10], got \"abc\"\n"},
        {"a.t", 9, 0, 10, 9, "p.a.t: must be an integer in [0, 10], got true\n"},
        {"a.f", 9, 0, 10, 9, "p.a.f: must be an integer in [0, 10], got false\n"},
        {"a.obj", 9, 0, 10, 9, "p.a.obj: must be an integer in [0, 10], got an object\n"},
        {"a.arr", 9, 0, 10, 9, "p.a.arr: must be an integer in [0, 10], got an array\n"},
        {"a.huge_real", 9, INT64_MIN, INT64_MAX, 9,
         "p.a.huge_real: must be an integer in [-9223372036854775808, 9223372036854775807], "
         "got 1e+300\n"},
        {"a.obj.x.y", 9, 0, 10, 7, NULL},
        {"scalar.x", 9, 0, 10, 9, "p.scalar: must be an object, got 7\n"},
        {"a.int.deeper", 9, 0, 10, 9, "p.a.int: must be an object, got 5\n"},
    };
    json_t *doc = load_doc();
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct int_case *c = &cases[i];
        struct cfg_errors e;
        cfg_errors_init(&e, "p");
        int64_t got = cfg_get_int(doc, c->path, c->def, c->min, c->max, &e);
        print_message("int case %zu: %s\n", i, c->path);
        assert_int_equal(got, c->want);
        check_errors(&e, c->err);
        cfg_errors_release(&e);
    }
    json_decref(doc);
}

struct dbl_case {
    const char *path;
    double def, min, max, want;
    const char *err;
};

static void test_get_double(void **state)
{
    (void)state;
    static const struct dbl_case cases[] = {
        {"a.dbl", 3, 0, 10, 0.5, NULL},
        {"a.int", 3, 0, 10, 5, NULL}, /* integers are numbers */
        {"a.missing", 3, 0, 10, 3, NULL},
        {"a.null", 3, 0, 10, 3, NULL},
        {"a.dbl", 3, 0.001, 0.4, 3, "p.a.dbl: must be a number in [0.001, 0.4], got 0.5\n"},
        {"a.str", 3, 0.001, 3600, 3, "p.a.str: must be a number in [0.001, 3600], got \"abc\"\n"},
        {"a.t", 3, 0, 10, 3, "p.a.t: must be a number in [0, 10], got true\n"},
        {"a.huge_real", 3, 0, 1e6, 3, "p.a.huge_real: must be a number in [0, 1000000], got 1e+300\n"},
        {"a.huge_real", 3, -INFINITY, INFINITY, 1e300, NULL},
    };
    json_t *doc = load_doc();
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct dbl_case *c = &cases[i];
        struct cfg_errors e;
        cfg_errors_init(&e, "p");
        double got = cfg_get_double(doc, c->path, c->def, c->min, c->max, &e);
        print_message("double case %zu: %s\n", i, c->path);
        assert_true(got == c->want);
        check_errors(&e, c->err);
        cfg_errors_release(&e);
    }
    json_decref(doc);
}

/* The exact message format promised to operators. */
static void test_message_format(void **state)
{
    (void)state;
    struct cfg_errors e;
    cfg_errors_init(&e, "motor_nodemanger_config");
    json_t *doc = json_pack("{s:{s:s}}", "basic_config", "heartbeat_interval_seconds", "abc");
    double v = cfg_get_double(doc, "basic_config.heartbeat_interval_seconds", 3.0, 0.001, 3600, &e);
    assert_true(v == 3.0);
    assert_string_equal(cfg_errors_text(&e),
                        "motor_nodemanger_config.basic_config.heartbeat_interval_seconds: "
                        "must be a number in [0.001, 3600], got \"abc\"\n");
    cfg_errors_release(&e);

    /* Without a prefix, the path starts the line. */
    cfg_errors_init(&e, "");
    cfg_get_double(doc, "basic_config.heartbeat_interval_seconds", 3.0, 0.001, 3600, &e);
    assert_string_equal(cfg_errors_text(&e), "basic_config.heartbeat_interval_seconds: "
                                             "must be a number in [0.001, 3600], got \"abc\"\n");
    cfg_errors_release(&e);

    /* NULL prefix behaves like "". */
    cfg_errors_init(&e, NULL);
    cfg_error(&e, "x", "bad %d", 42);
    assert_string_equal(cfg_errors_text(&e), "x: bad 42\n");
    cfg_errors_release(&e);
    json_decref(doc);
}

static void test_get_bool(void **state)
{
    (void)state;
    static const struct {
        const char *path;
        bool def, want;
        const char *err;
    } cases[] = {
        {"a.t", false, true, NULL},
        {"a.f", true, false, NULL},
        {"a.missing", true, true, NULL},
        {"a.null", false, false, NULL},
        {"a.int", false, false, "p.a.int: must be true or false, got 5\n"},
        {"a.str", true, true, "p.a.str: must be true or false, got \"abc\"\n"},
        {"a.empty", true, true, "p.a.empty: must be true or false, got \"\"\n"},
    };
    json_t *doc = load_doc();
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors e;
        cfg_errors_init(&e, "p");
        print_message("bool case %zu: %s\n", i, cases[i].path);
        assert_int_equal(cfg_get_bool(doc, cases[i].path, cases[i].def, &e), cases[i].want);
        check_errors(&e, cases[i].err);
        cfg_errors_release(&e);
    }
    json_decref(doc);
}

static void test_get_string(void **state)
{
    (void)state;
    static const struct {
        const char *path;
        const char *def, *want;
        const char *err;
    } cases[] = {
        {"a.str", "d", "abc", NULL},
        {"a.empty", "d", "", NULL},
        {"a.missing", "d", "d", NULL},
        {"a.missing", NULL, NULL, NULL},
        {"a.null", "d", "d", NULL},
        {"a.int", "d", "d", "p.a.int: must be a string, got 5\n"},
        {"a.t", "d", "d", "p.a.t: must be a string, got true\n"},
        {"a.nul", "d", "d", "p.a.nul: must not contain NUL characters\n"},
    };
    json_t *doc = load_doc();
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors e;
        cfg_errors_init(&e, "p");
        print_message("string case %zu: %s\n", i, cases[i].path);
        const char *got = cfg_get_string(doc, cases[i].path, cases[i].def, &e);
        if (cases[i].want)
            assert_string_equal(got, cases[i].want);
        else
            assert_null(got);
        check_errors(&e, cases[i].err);
        cfg_errors_release(&e);
    }
    json_decref(doc);
}

/* A long bad value is cut in the message, so one error stays one short line. */
static void test_long_value_truncated(void **state)
{
    (void)state;
    json_t *doc = load_doc();
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    cfg_get_int(doc, "a.long", 0, 0, 1, &e);
    const char *t = cfg_errors_text(&e);
    assert_non_null(strstr(t, "got \"0123456789"));
    assert_non_null(strstr(t, "\"...\n"));
    assert_true(strlen(t) < 160);
    cfg_errors_release(&e);
    json_decref(doc);
}

static void test_get_enum(void **state)
{
    (void)state;
    static const char *const engines[] = {"vllm", "sglang", "sim", NULL};
    json_t *doc = load_doc();
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    assert_string_equal(cfg_get_enum(doc, "a.engine", "sim", engines, &e), "vllm");
    assert_string_equal(cfg_get_enum(doc, "a.missing", "sim", engines, &e), "sim");
    assert_string_equal(cfg_get_enum(doc, "a.null", "sim", engines, &e), "sim");
    check_errors(&e, NULL);
    /* Case-sensitive. */
    assert_string_equal(cfg_get_enum(doc, "a.Engine", "sim", engines, &e), "sim");
    check_errors(&e, "p.a.Engine: must be one of \"vllm\", \"sglang\", \"sim\", got \"VLLM\"\n");
    cfg_errors_release(&e);

    cfg_errors_init(&e, "p");
    assert_string_equal(cfg_get_enum(doc, "a.int", "sim", engines, &e), "sim");
    check_errors(&e, "p.a.int: must be one of \"vllm\", \"sglang\", \"sim\", got 5\n");
    cfg_errors_release(&e);
    json_decref(doc);
}

static void test_get_object_array(void **state)
{
    (void)state;
    json_t *doc = load_doc();
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    json_t *o = cfg_get_object(doc, "a.obj", &e);
    assert_non_null(o);
    assert_ptr_equal(o, json_object_get(json_object_get(doc, "a"), "obj"));
    assert_null(cfg_get_object(doc, "a.missing", &e));
    assert_null(cfg_get_object(doc, "nullobj", &e));
    json_t *arr = cfg_get_array(doc, "a.arr", &e);
    assert_non_null(arr);
    assert_int_equal(json_array_size(arr), 2);
    assert_null(cfg_get_array(doc, "a.missing", &e));
    check_errors(&e, NULL);

    assert_null(cfg_get_object(doc, "a.arr", &e));
    check_errors(&e, "p.a.arr: must be an object, got an array\n");
    cfg_errors_release(&e);

    cfg_errors_init(&e, "p");
    assert_null(cfg_get_array(doc, "a.obj", &e));
    check_errors(&e, "p.a.obj: must be an array, got an object\n");
    cfg_errors_release(&e);

    /* A getter on a sub-object from cfg_get_object; NULL object => defaults, no error. */
    cfg_errors_init(&e, "p");
    assert_int_equal(cfg_get_int(o, "x.y", 0, 0, 10, &e), 7);
    assert_int_equal(cfg_get_int(NULL, "x.y", 4, 0, 10, &e), 4);
    check_errors(&e, NULL);
    cfg_errors_release(&e);
    json_decref(doc);
}

static void test_lookup(void **state)
{
    (void)state;
    json_t *doc = load_doc();
    assert_int_equal(json_integer_value(cfg_lookup(doc, "a.obj.x.y")), 7);
    assert_null(cfg_lookup(doc, "a.null"));
    assert_null(cfg_lookup(doc, "a.missing"));
    assert_null(cfg_lookup(doc, "scalar.x"));
    assert_null(cfg_lookup(doc, "a..int"));
    assert_null(cfg_lookup(NULL, "a"));
    assert_ptr_equal(cfg_lookup(doc, ""), doc);
    json_decref(doc);
}

/* One pass over a bad config reports every problem, in order. */
static void test_collects_all_errors(void **state)
{
    (void)state;
    struct cfg_errors e;
    cfg_errors_init(&e, "nm");
    json_t *doc = json_loads("{\"api_config\": {\"pod_ip\": 5, \"node_manager_port\": 0},"
                             " \"basic_config\": {\"heartbeat_interval_seconds\": true,"
                             " \"job_name\": \"j\"}}",
                             0, NULL);
    assert_non_null(doc);
    const char *ip = cfg_get_string(doc, "api_config.pod_ip", "127.0.0.1", &e);
    int64_t port = cfg_get_int(doc, "api_config.node_manager_port", 1026, 1, 65535, &e);
    double hb = cfg_get_double(doc, "basic_config.heartbeat_interval_seconds", 3, 0.001, 3600, &e);
    const char *job = cfg_get_string(doc, "basic_config.job_name", "", &e);
    assert_string_equal(ip, "127.0.0.1");
    assert_int_equal(port, 1026);
    assert_true(hb == 3);
    assert_string_equal(job, "j");
    assert_int_equal(cfg_errors_count(&e), 3);
    assert_string_equal(cfg_errors_text(&e),
                        "nm.api_config.pod_ip: must be a string, got 5\n"
                        "nm.api_config.node_manager_port: must be an integer in [1, 65535], got 0\n"
                        "nm.basic_config.heartbeat_interval_seconds: must be a number in "
                        "[0.001, 3600], got true\n");

    /* The prefix can change between checks (array elements). */
    cfg_errors_set_prefix(&e, "nm.servers[2]");
    cfg_error(&e, "port", "must be set");
    assert_int_equal(cfg_errors_count(&e), 4);
    assert_non_null(strstr(cfg_errors_text(&e), "\nnm.servers[2].port: must be set\n"));
    json_decref(doc);
    cfg_errors_release(&e);
    cfg_errors_release(NULL);
}

/* A key with control characters cannot forge report lines. */
static void test_control_chars_in_path(void **state)
{
    (void)state;
    json_t *doc = json_loads("{\"a\\nnm_fake: injected\": \"x\", \"b\\u001b[31m\": 1.5}", 0, NULL);
    assert_non_null(doc);
    struct cfg_errors e;
    cfg_errors_init(&e, "nm");
    cfg_get_int(doc, "a\nnm_fake: injected", 0, 0, 1, &e);
    cfg_get_int(doc, "b\x1b[31m", 0, 0, 1, &e);
    assert_int_equal(cfg_errors_count(&e), 2);
    assert_string_equal(cfg_errors_text(&e),
                        "nm.a\\x0anm_fake: injected: must be an integer in [0, 1], got \"x\"\n"
                        "nm.b\\x1b[31m: must be an integer in [0, 1], got 1.5\n");
    cfg_errors_release(&e);
    json_decref(doc);
}

/* The error text is bounded, the count is not. */
static void test_error_text_bounded(void **state)
{
    (void)state;
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    for (int i = 0; i < 10000; i++) {
        /* Alternate long and short lines: a short one must not slip in after the cut. */
        if (i % 2)
            cfg_error(&e, "k", "x");
        else
            cfg_error(&e, "some.long.path.to.a.key", "must be something reasonably long %d", i);
    }
    assert_int_equal(cfg_errors_count(&e), 10000);
    const char *t = cfg_errors_text(&e);
    assert_true(strlen(t) <= 65 * 1024);
    const char *more = strstr(t, "(further errors omitted)\n");
    assert_non_null(more);
    assert_string_equal(more, "(further errors omitted)\n"); /* once, at the end */
    assert_non_null(strstr(t, "p.some.long.path.to.a.key: must be something reasonably long 0\n"));
    cfg_errors_release(&e);
}

/* ---- loading ---- */

static char tmpdir[64];

static int setup_dir(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_cfg.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state)
{
    (void)state;
    char *cmd = xasprintf("rm -rf '%s'", tmpdir);
    int rc = system(cmd);
    free(cmd);
    return rc == 0 ? 0 : -1;
}

static char *write_tmp(const char *name, const char *text)
{
    char *path = xasprintf("%s/%s", tmpdir, name);
    assert_int_equal(util_write_file_atomic(path, text, strlen(text), 0600), 0);
    return path;
}

static void test_load_ok(void **state)
{
    (void)state;
    char *path = write_tmp("ok.json", "{\"a\": {\"b\": 1}}\n");
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    json_t *root = cfg_load_file(path, &e);
    assert_non_null(root);
    assert_int_equal(cfg_get_int(root, "a.b", 0, 0, 9, &e), 1);
    check_errors(&e, NULL);
    json_decref(root);
    cfg_errors_release(&e);
    free(path);
}

static void test_load_missing(void **state)
{
    (void)state;
    char *path = xasprintf("%s/nope.json", tmpdir);
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_file(path, &e));
    char *want = xasprintf("p: %s: cannot read: %s\n", path, strerror(ENOENT));
    check_errors(&e, want);
    free(want);
    cfg_errors_release(&e);
    free(path);
}

static void test_load_syntax_error(void **state)
{
    (void)state;
    char *path = write_tmp("bad.json", "{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n");
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_file(path, &e));
    assert_int_equal(cfg_errors_count(&e), 1);
    const char *t = cfg_errors_text(&e);
    assert_non_null(strstr(t, path));
    assert_non_null(strstr(t, "syntax error at line 3, column "));
    cfg_errors_release(&e);
    free(path);
}

static void test_load_not_object(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"[1, 2]", "top level must be a JSON object, got an array"},
        {"42", "top level must be a JSON object, got 42"},
        {"\"s\"", "top level must be a JSON object, got \"s\""},
        {"null", "top level must be a JSON object, got null"},
        {"", "syntax error at line 1"},
        {"{} trailing", "syntax error at line 1"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors e;
        cfg_errors_init(&e, "p");
        print_message("load case %zu: %s\n", i, cases[i].text);
        assert_null(cfg_load_buffer(cases[i].text, strlen(cases[i].text), &e));
        assert_int_equal(cfg_errors_count(&e), 1);
        assert_non_null(strstr(cfg_errors_text(&e), cases[i].want));
        cfg_errors_release(&e);
    }
    /* The file loader gives the same verdict. */
    char *path = write_tmp("arr.json", "[1]");
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_file(path, &e));
    assert_non_null(strstr(cfg_errors_text(&e), "top level must be a JSON object"));
    cfg_errors_release(&e);
    free(path);
}

static void test_load_buffer_not_terminated(void **state)
{
    (void)state;
    /* Only len bytes are parsed: the trailing junk is outside the buffer. */
    static const char text[] = "{\"k\": true}GARBAGE";
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    json_t *root = cfg_load_buffer(text, 11, &e);
    assert_non_null(root);
    assert_true(cfg_get_bool(root, "k", false, &e));
    check_errors(&e, NULL);
    json_decref(root);
    cfg_errors_release(&e);
}

static void test_load_oversize(void **state)
{
    (void)state;
    char *path = xasprintf("%s/big.json", tmpdir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    /* Sparse: 16 MiB + 1 byte of zeros without writing them. */
    assert_int_equal(ftruncate(fd, 16 * 1024 * 1024 + 1), 0);
    close(fd);
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_file(path, &e));
    assert_int_equal(cfg_errors_count(&e), 1);
    assert_non_null(strstr(cfg_errors_text(&e), "larger than 16 MiB"));
    cfg_errors_release(&e);

    /* Exactly 16 MiB is read (and then fails as JSON, not as too large). */
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 16 * 1024 * 1024), 0);
    close(fd);
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_file(path, &e));
    assert_null(strstr(cfg_errors_text(&e), "larger than"));
    assert_non_null(strstr(cfg_errors_text(&e), "syntax error"));
    cfg_errors_release(&e);

    /* The buffer loader has the same cap (no allocation of that size needed). */
    cfg_errors_init(&e, "p");
    assert_null(cfg_load_buffer("{}", 16 * 1024 * 1024 + 1, &e));
    assert_non_null(strstr(cfg_errors_text(&e), "larger than 16 MiB"));
    cfg_errors_release(&e);
    free(path);
}

static void test_read_secret(void **state)
{
    (void)state;
    char *s = NULL;
    assert_int_equal(cfg_read_secret("/nonexistent/x", &s), -ENOENT);
    assert_null(s);
    char p[] = "/tmp/cfgsecretXXXXXX";
    int fd = mkstemp(p);
    assert_int_equal(util_write_all(fd, "\n", 1), 0);
    close(fd);
    assert_int_equal(cfg_read_secret(p, &s), -EINVAL); /* empty first line */
    /* The first line only, trailing blanks dropped, CRLF understood. */
    fd = open(p, O_WRONLY | O_TRUNC);
    assert_int_equal(util_write_all(fd, "s3cret \t\r\nsecond line\n", strlen("s3cret \t\r\nsecond line\n")), 0);
    close(fd);
    assert_int_equal(cfg_read_secret(p, &s), 0);
    assert_string_equal(s, "s3cret");
    free(s);
    /* Above the cap: refused, nothing returned. */
    char *big = malloc(CFG_SECRET_MAX + 2);
    memset(big, 'k', CFG_SECRET_MAX + 1);
    fd = open(p, O_WRONLY | O_TRUNC);
    assert_int_equal(util_write_all(fd, big, CFG_SECRET_MAX + 1), 0);
    close(fd);
    free(big);
    s = NULL;
    assert_int_equal(cfg_read_secret(p, &s), -EFBIG);
    assert_null(s);
    unlink(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_secret),
        cmocka_unit_test(test_get_int),
        cmocka_unit_test(test_get_double),
        cmocka_unit_test(test_message_format),
        cmocka_unit_test(test_get_bool),
        cmocka_unit_test(test_get_string),
        cmocka_unit_test(test_long_value_truncated),
        cmocka_unit_test(test_get_enum),
        cmocka_unit_test(test_get_object_array),
        cmocka_unit_test(test_lookup),
        cmocka_unit_test(test_collects_all_errors),
        cmocka_unit_test(test_control_chars_in_path),
        cmocka_unit_test(test_error_text_bounded),
        cmocka_unit_test(test_load_ok),
        cmocka_unit_test(test_load_missing),
        cmocka_unit_test(test_load_syntax_error),
        cmocka_unit_test(test_load_not_object),
        cmocka_unit_test(test_load_buffer_not_terminated),
        cmocka_unit_test(test_load_oversize),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
