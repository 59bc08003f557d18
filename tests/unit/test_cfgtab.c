/* cfgtab: what a table derives — defaults (environment included), parsing that layers
 * blocks and collects every error with the cfg getters' messages, groups (path, object
 * and if-present modes), aliases, required keys, checks, the given set, the dump (secrets,
 * scale, seconds, numbers), the diff by live/restart class, the docs' markdown, and
 * release (ASan checks nothing leaks). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/cfgtab.h"
#include "common/util.h"
#include "unit_helpers.h"

#include <stdlib.h>
#include <string.h>

struct sub {
    bool on;
    char *file;
};

struct conf {
    char *host;
    int port;
    int64_t size;
    size_t cap;
    double ratio;
    int64_t wait_ms;
    bool flag;
    int mode;
    char *level;
    char **list;
    size_t n_list;
    char *secret;
    char *dir;
    struct sub tls;
    struct sub alt;
    int derived;
    char *name;
};

static const char *const modes[] = {"a", "b", NULL};
static const char *const def_list[] = {"x", "y", NULL};

static const char *upper_ok(const char **s, char *buf, size_t cap)
{
    if (strcmp(*s, "LOW") == 0) {
        *s = "low"; /* a replacement: the canonical spelling */
        return NULL;
    }
    if (strcmp(*s, "keep") == 0)
        return cfgtab_skip;
    snprintf(buf, cap, "must be low or high, got \"%s\"", *s);
    return strcmp(*s, "low") == 0 || strcmp(*s, "high") == 0 ? NULL : buf;
}

static const char *no_z(const char **s, char *buf, size_t cap)
{
    return strchr(*s, 'z') ? "must not contain z" : NULL;
}

#define SOFF(f) offsetof(struct sub, f)
static const struct cfgtab_row sub_rows[] = {
    {"on", CFGTAB_BOOL, SOFF(on), .doc = "turns it on"},
    {"file", CFGTAB_STRING, SOFF(file), .def_s = "f.pem"},
};
static const struct cfgtab sub_table = CFGTAB_TABLE("sub", sub_rows, NULL);

#define OFF(f) offsetof(struct conf, f)
static const char *const srcs[] = {"", "other_block"};
static const struct cfgtab_row rows[] = {
    {"api.host", CFGTAB_STRING, OFF(host), .flags = CFGTAB_NONEMPTY, .env = "TEST_CFGTAB_HOST",
     .def_s = "127.0.0.1", .doc = "bind address"},
    {"api.port", CFGTAB_INT, OFF(port), .min = 1, .max = 65535, .def_i = 80},
    {"size_mib", CFGTAB_INT64, OFF(size), .flags = CFGTAB_LIVE, .min = 1, .max = 100, .def_i = 2,
     .scale = 1 << 20},
    {"cap", CFGTAB_SIZE, OFF(cap), .flags = CFGTAB_LIVE, .min = 0, .max = 1000, .def_i = 7},
    {"ratio", CFGTAB_DOUBLE, OFF(ratio), .flags = CFGTAB_LIVE | CFGTAB_NUMBER, .min = 0, .max = 1,
     .def_d = 0.5},
    {"wait", CFGTAB_MS, OFF(wait_ms), .flags = CFGTAB_LIVE, .min = 0.001, .max = 60, .def_d = 1.5},
    {"flag", CFGTAB_BOOL, OFF(flag), .flags = CFGTAB_LIVE | CFGTAB_MOTOR, .def_i = 1},
    {"mode", CFGTAB_ENUM, OFF(mode), .flags = CFGTAB_LIVE, .names = modes, .def_i = 1},
    {"level", CFGTAB_STRING, OFF(level), .flags = CFGTAB_LIVE, .def_s = "low", .check = upper_ok},
    {"list", CFGTAB_STRLIST, OFF(list), OFF(n_list),
     .flags = CFGTAB_LIVE | CFGTAB_ONE_OR_LIST | CFGTAB_NONEMPTY, .def_list = def_list,
     .check = no_z},
    {"secret", CFGTAB_STRING, OFF(secret), .flags = CFGTAB_LIVE | CFGTAB_SECRET},
    {"dir", CFGTAB_STRING, OFF(dir), .alias = "old_dir", .missing = "is required"},
    {"tls", CFGTAB_GROUP, OFF(tls), .flags = CFGTAB_OBJECT, .sub = &sub_table,
     .doc = "the TLS block"},
    {"alt", CFGTAB_GROUP, OFF(alt), .flags = CFGTAB_IFPRESENT, .sub = &sub_table},
    {"unused", CFGTAB_INT, 0, .flags = CFGTAB_ACCEPTED, .min = 0, .max = 1},
    {"derived", CFGTAB_INT, OFF(derived), .flags = CFGTAB_DERIVED},
    {"name", CFGTAB_STRING, OFF(name), .src = 1, .def_s = "n", .dump = "other.name"},
    {"name_again", CFGTAB_STRING, OFF(name), .src = 1, .flags = CFGTAB_OVERRIDE},
};
static const struct cfgtab table = CFGTAB_TABLE("test", rows, srcs);

static const char *fake_env(void *ud, const char *name)
{
    return strcmp(name, "TEST_CFGTAB_HOST") == 0 ? ud : NULL;
}

/* Defaults, then each document in turn; the errors' text in *errs_out (caller frees). */
static void load(struct conf *c, const char *env_host, const char *doc1, const char *doc2,
                 char **errs_out, struct cfgtab_ctx *keep)
{
    memset(c, 0, sizeof(*c));
    struct cfg_errors e;
    cfg_errors_init(&e, "p");
    struct cfgtab_ctx ctx = {.errs = &e, .env = fake_env, .env_ud = (void *)env_host};
    cfgtab_defaults(&table, c, &ctx);
    const char *docs[] = {doc1, doc2};
    for (size_t i = 0; i < 2; i++) {
        if (!docs[i])
            continue;
        json_t *j = J(docs[i]);
        cfgtab_apply(&table, 0, c, j, &ctx);
        json_decref(j);
    }
    *errs_out = xstrdup(cfg_errors_text(&e));
    cfg_errors_release(&e);
    if (keep)
        *keep = ctx;
    else
        cfgtab_ctx_release(&ctx);
}

static void test_defaults(void **state)
{
    (void)state;
    struct conf c;
    char *errs;
    load(&c, NULL, "{'dir':'/d'}", NULL, &errs, NULL);
    assert_string_equal(errs, "");
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 80);
    assert_int_equal(c.size, 2 << 20);
    assert_int_equal(c.cap, 7);
    assert_true(c.ratio == 0.5);
    assert_int_equal(c.wait_ms, 1500);
    assert_true(c.flag);
    assert_int_equal(c.mode, 1);
    assert_string_equal(c.level, "low");
    assert_int_equal(c.n_list, 2);
    assert_string_equal(c.list[1], "y");
    assert_null(c.list[2]);
    assert_null(c.secret);
    assert_string_equal(c.tls.file, "f.pem");
    assert_string_equal(c.alt.file, "f.pem");
    assert_string_equal(c.name, "n");
    cfgtab_release(&table, &c);
    free(errs);

    /* an environment default wins over the constant when set and not empty */
    load(&c, "10.0.0.1", "{'dir':'/d'}", NULL, &errs, NULL);
    assert_string_equal(c.host, "10.0.0.1");
    cfgtab_release(&table, &c);
    free(errs);
    load(&c, "", "{'dir':'/d'}", NULL, &errs, NULL);
    assert_string_equal(c.host, "127.0.0.1");
    cfgtab_release(&table, &c);
    free(errs);
}

static void test_layers_and_values(void **state)
{
    (void)state;
    struct conf c;
    char *errs;
    struct cfgtab_ctx ctx;
    load(&c, NULL,
         "{'api':{'host':'h1','port':81},'size_mib':3,'ratio':1,'wait':0.25,'flag':false,"
         "'mode':'a','level':'LOW','list':'one','secret':'s3','dir':'/new',"
         "'tls':{'on':true,'file':'t.pem'},'alt':{'on':true},'unused':1}",
         "{'api':{'port':82},'list':['p','q','r'],'level':'keep','old_dir':'/old'}", &errs, &ctx);
    assert_string_equal(errs, "");
    assert_string_equal(c.host, "h1"); /* kept: the second block does not name it */
    assert_int_equal(c.port, 82);      /* replaced */
    assert_int_equal(c.size, 3 << 20);
    assert_true(c.ratio == 1.0);
    assert_int_equal(c.wait_ms, 250);
    assert_false(c.flag);
    assert_int_equal(c.mode, 0);
    assert_string_equal(c.level, "low"); /* canonicalised, then "keep" skipped silently */
    assert_int_equal(c.n_list, 3);
    assert_string_equal(c.list[2], "r");
    assert_string_equal(c.secret, "s3");
    assert_string_equal(c.dir, "/old"); /* through the alias */
    assert_true(c.tls.on);
    assert_string_equal(c.tls.file, "t.pem");
    assert_true(c.alt.on);
    assert_true(cfgtab_given(&ctx, OFF(port)));
    assert_true(cfgtab_given(&ctx, OFF(tls) + SOFF(file)));
    assert_false(cfgtab_given(&ctx, OFF(cap)));
    assert_false(cfgtab_given(&ctx, OFF(name)));
    cfgtab_ctx_release(&ctx);

    /* the other source's rows only when that source is applied */
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    struct cfgtab_ctx ctx2 = {.errs = &e};
    json_t *j = J("{'name':'first','name_again':'second'}");
    cfgtab_apply(&table, 1, &c, j, &ctx2);
    assert_string_equal(c.name, "second");
    json_decref(j);
    cfgtab_ctx_release(&ctx2);
    cfg_errors_release(&e);

    json_t *d = cfgtab_dump(&table, &c);
    char *text = json_dumps(d, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(text,
                        "{\"alt\":{\"file\":\"f.pem\",\"on\":true},\"api\":{\"host\":\"h1\","
                        "\"port\":82},\"cap\":7,\"derived\":0,\"dir\":\"/old\",\"flag\":false,"
                        "\"level\":\"low\","
                        "\"list\":[\"p\",\"q\",\"r\"],\"mode\":\"a\",\"other\":{\"name\":"
                        "\"second\"},\"ratio\":1,\"secret\":\"<redacted>\",\"size_mib\":3,"
                        "\"tls\":{\"file\":\"t.pem\",\"on\":true},\"wait\":0.25}");
    free(text);
    json_decref(d);
    cfgtab_release(&table, &c);
    assert_null(c.host);
    assert_null(c.list);
    assert_int_equal(c.n_list, 0);
    free(errs);
}

static void test_errors_collected(void **state)
{
    (void)state;
    struct conf c;
    char *errs;
    load(&c, NULL,
         "{'api':{'host':'','port':0},'size_mib':1.5,'cap':-1,'ratio':'x','wait':0,"
         "'flag':1,'mode':'c','level':'mid','list':['ok','zz',3],'tls':5,'alt':7,"
         "'unused':2}",
         "{'list':[]}", &errs, NULL);
    assert_string_equal(errs, "p.api.host: must not be empty\n"
                              "p.api.port: must be an integer in [1, 65535], got 0\n"
                              "p.size_mib: must be an integer in [1, 100], got 1.5\n"
                              "p.cap: must be an integer in [0, 1000], got -1\n"
                              "p.ratio: must be a number in [0, 1], got \"x\"\n"
                              "p.wait: must be a number in [0.001, 60], got 0\n"
                              "p.flag: must be true or false, got 1\n"
                              "p.mode: must be one of \"a\", \"b\", got \"c\"\n"
                              "p.level: must be low or high, got \"mid\"\n"
                              "p.list[1]: must not contain z\n"
                              "p.list[2]: must be a string, got 3\n"
                              "p.dir: is required\n"
                              "p.tls: must be an object, got 5\n"
                              "p.alt: must be an object, got 7\n"
                              "p.alt: must be an object, got 7\n"
                              "p.unused: must be an integer in [0, 1], got 2\n"
                              "p.list: must not be empty\n"
                              "p.dir: is required\n");
    /* invalid values kept the defaults */
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 80);
    assert_int_equal(c.n_list, 2);
    cfgtab_release(&table, &c);
    free(errs);
}

static void test_diff(void **state)
{
    (void)state;
    struct conf a, b;
    char *errs;
    load(&a, NULL, "{'dir':'/d'}", NULL, &errs, NULL);
    free(errs);
    load(&b, NULL,
         "{'dir':'/d','api':{'port':81},'wait':2,'secret':'new','tls':{'file':'x'},"
         "'list':['x','y']}",
         NULL, &errs, NULL);
    free(errs);
    char *all = cfgtab_diff(&table, &a, &b, 0, 0);
    assert_string_equal(all, "api.port,wait,secret,tls.file");
    free(all);
    /* what a hot reload cannot apply: rows (and groups) without CFGTAB_LIVE */
    char *restart = cfgtab_diff(&table, &a, &b, CFGTAB_LIVE, 0);
    assert_string_equal(restart, "api.port,tls.file");
    free(restart);
    char *live = cfgtab_diff(&table, &a, &b, CFGTAB_LIVE, CFGTAB_LIVE);
    assert_string_equal(live, "wait,secret");
    free(live);
    assert_null(cfgtab_diff(&table, &a, &a, 0, 0));
    cfgtab_release(&table, &a);
    cfgtab_release(&table, &b);
}

static void test_markdown(void **state)
{
    (void)state;
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    cfgtab_markdown(&table, &sb);
    const char *md = strbuf_str(&sb);
    static const char *const want[] = {
        "| key | type | default | reload | meaning |\n| --- | --- | --- | --- | --- |\n",
        ("| `api.host` | string | `$TEST_CFGTAB_HOST` or `\"127.0.0.1\"` | restart | bind "
         "address |\n"),
        "| `api.port` | integer [1, 65535] | 80 | restart | |\n",
        "| `wait` | seconds [0.001, 60] | 1.5 | live | |\n",
        "| `flag` | boolean | true | live | (motor) |\n",
        "| `mode` | `a`, `b` | `b` | live | |\n",
        "| `list` | string or list of strings | `[\"x\", \"y\"]` | live | |\n",
        "| `secret` | string | unset | live | (secret) |\n",
        "| `dir` (or `old_dir`) | string | required | restart | |\n",
        "| `tls.on` | boolean | false | restart | the TLS block: turns it on |\n",
        "| `tls.file` | string | `\"f.pem\"` | restart | |\n",
        "| `unused` | integer [0, 1] |  | restart | accepted, unused |\n",
        "| `other_block.name_again` | string |  | restart | |\n",
    };
    for (size_t i = 0; i < ARRAY_LEN(want); i++)
        if (!strstr(md, want[i]))
            fail_msg("missing line %s in:\n%s", want[i], md);
    assert_null(strstr(md, "derived")); /* derived values are not keys */
    strbuf_release(&sb);
}

/* Hot reload: the restart rows keep their running values (swapped, not copied), the
 * live ones take the new; a live group's RESTART row stays. */
struct rl {
    int port;
    char *host;
    int64_t wait_ms;
    char **list;
    size_t n_list;
    struct sub tls;
};

static const struct cfgtab_row rl_sub_rows[] = {
    {"on", CFGTAB_BOOL, SOFF(on), .flags = CFGTAB_RESTART},
    {"file", CFGTAB_STRING, SOFF(file), .def_s = "f.pem"},
};
static const struct cfgtab rl_sub = CFGTAB_TABLE("rl_sub", rl_sub_rows, NULL);

#define ROFF(f) offsetof(struct rl, f)
static const struct cfgtab_row rl_rows[] = {
    {"port", CFGTAB_INT, ROFF(port), .min = 1, .max = 65535, .def_i = 80},
    {"host", CFGTAB_STRING, ROFF(host), .def_s = "h0"},
    {"wait", CFGTAB_MS, ROFF(wait_ms), .flags = CFGTAB_LIVE, .min = 0, .max = 60, .def_d = 1},
    {"list", CFGTAB_STRLIST, ROFF(list), ROFF(n_list), .flags = CFGTAB_LIVE},
    {"tls", CFGTAB_GROUP, ROFF(tls), .flags = CFGTAB_LIVE, .sub = &rl_sub},
};
static const struct cfgtab rl_table = CFGTAB_TABLE("rl", rl_rows, NULL);

static void rl_load(struct rl *c, const char *doc)
{
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    struct cfgtab_ctx ctx = {.errs = &e};
    cfgtab_init(&rl_table, c, sizeof(*c), &ctx);
    json_t *j = J(doc);
    cfgtab_apply(&rl_table, 0, c, j, &ctx);
    json_decref(j);
    assert_int_equal(cfg_errors_count(&e), 0);
    cfg_errors_release(&e);
    cfgtab_ctx_release(&ctx);
}

static void test_keep_restart(void **state)
{
    (void)state;
    struct rl run, next;
    rl_load(&run, "{'port':81,'host':'h1','wait':2,'list':['a'],'tls':{'on':true,'file':'a.pem'}}");
    rl_load(&next,
            "{'port':82,'host':'h2','wait':3,'list':['b','c'],'tls':{'on':false,'file':'b.pem'}}");
    char *host = run.host, *file = run.tls.file;
    char *restart = cfgtab_diff(&rl_table, &run, &next, CFGTAB_LIVE, 0);
    assert_string_equal(restart, "port,host,tls.on");
    free(restart);
    assert_int_equal(cfgtab_keep_restart(&rl_table, &next, &run), 0);
    /* next: restart keys as they run (the same string, not a copy), live keys new */
    assert_int_equal(next.port, 81);
    assert_ptr_equal(next.host, host);
    assert_true(next.tls.on);
    assert_int_equal(next.wait_ms, 3000);
    assert_int_equal(next.n_list, 2);
    assert_string_equal(next.list[1], "c");
    assert_string_equal(next.tls.file, "b.pem");
    /* run: what did not apply, released with it */
    assert_int_equal(run.port, 82);
    assert_string_equal(run.host, "h2");
    assert_false(run.tls.on);
    assert_ptr_equal(run.tls.file, file);
    assert_null(cfgtab_diff(&rl_table, &next, &next, 0, 0));
    cfgtab_release(&rl_table, &run);
    cfgtab_release(&rl_table, &next);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),         cmocka_unit_test(test_layers_and_values),
        cmocka_unit_test(test_errors_collected), cmocka_unit_test(test_diff),
        cmocka_unit_test(test_markdown),         cmocka_unit_test(test_keep_restart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
