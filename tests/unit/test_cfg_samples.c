/* Every sample configuration (upstream's user_config.json files, the examples, the test
 * fixtures, the pool's example manifest) loads exactly as it did before the
 * configuration tables: tests/fixtures/effective_before.json holds what the loaders of
 * commit 49ffe98 produced (the node manager's and the coordinator's effective dumps, the
 * controller's parsed struct field by field, every error text), and today's loaders must
 * produce the same. Upstream files are read in place from ../shared/spec/upstream-examples;
 * when that folder is absent the test says so and skips those entries. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "controller/ctl_config.h"
#include "coordinator/coord_config.h"
#include "nodemgr/nm_config.h"
#include "pool/pool_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char *repo_path(const char *rel)
{
    char *repo = xstrdup(__FILE__);
    for (int i = 0; i < 3; i++) {
        char *slash = strrchr(repo, '/');
        if (slash)
            *slash = '\0';
    }
    char *p = xasprintf("%s/%s", repo, rel);
    free(repo);
    return p;
}

static json_t *before(const char *daemon)
{
    char *path = repo_path("tests/fixtures/effective_before.json");
    json_error_t jerr;
    json_t *all = json_load_file(path, 0, &jerr);
    if (!all)
        fail_msg("%s: %s", path, jerr.text);
    free(path);
    json_t *d = json_incref(json_object_get(all, daemon));
    json_decref(all);
    assert_non_null(d);
    return d;
}

/* The sample a fixture key names ("upstream/x.json|..." or "examples/x.json|..."); NULL
 * when it is an upstream file and the folder is absent. */
static char *sample_path(const char *key, int *skipped)
{
    size_t n = strcspn(key, "|");
    char *rel = xstrndup(key, n);
    char *path;
    if (strncmp(rel, "upstream/", 9) == 0) {
        const char *env = getenv("MOTOR_UPSTREAM_EXAMPLES");
        char *dir = env && *env ? xstrdup(env) : repo_path("../shared/spec/upstream-examples");
        path = xasprintf("%s/%s", dir, rel + 9);
        free(dir);
    } else {
        path = repo_path(rel);
    }
    free(rel);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (strncmp(key, "upstream/", 9) != 0)
            fail_msg("sample %s is missing", path);
        (*skipped)++;
        free(path);
        return NULL;
    }
    return path;
}

static void report_skips(int skipped)
{
    if (skipped)
        fprintf(stderr,
                "*** upstream examples folder not found: %d upstream sample(s) NOT compared "
                "(set MOTOR_UPSTREAM_EXAMPLES)\n",
                skipped);
}

static void expect_same(const char *key, json_t *want, json_t *got)
{
    if (json_equal(want, got))
        return;
    /* Name the first differing member, so a failure says what changed. */
    const char *k;
    json_t *v;
    json_object_foreach(want, k, v)
    {
        json_t *g = json_object_get(got, k);
        if (!json_equal(v, g)) {
            char *a = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
            char *b = g ? json_dumps(g, JSON_COMPACT | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17))
                        : xstrdup("(absent)");
            fail_msg("%s: %s differs\n  before: %s\n  now:    %s", key, k, a, b);
        }
    }
    json_object_foreach(got, k, v)
    {
        if (!json_object_get(want, k))
            fail_msg("%s: %s is new", key, k);
    }
    fail_msg("%s differs", key);
}

static void test_node_manager(void **state)
{
    (void)state;
    json_t *want = before("node_manager");
    int skipped = 0, compared = 0;
    const char *key;
    json_t *w;
    json_object_foreach(want, key, w)
    {
        char *path = sample_path(key, &skipped);
        if (!path)
            continue;
        char *copy = xstrdup(key);
        char *role = strchr(copy, '|') + 1;
        char *envtag = strchr(role, '|');
        *envtag++ = '\0';
        const char *env[] = {strcmp(envtag, "-") == 0 ? NULL : envtag, NULL};
        struct nm_config_opts o = {.config_path = path,
                                   .role = role,
                                   .env = nm_env_from_array,
                                   .env_ud = env,
                                   .motor_bin = "motor"};
        struct cfg_errors errs;
        cfg_errors_init(&errs, "");
        struct nm_config *c = nm_config_load(&o, &errs);
        json_t *got;
        if (c) {
            got = nm_config_to_json(c);
            json_object_del(got, "config_path");
        } else {
            got = json_pack("{s:s}", "errors", cfg_errors_text(&errs));
        }
        expect_same(key, w, got);
        json_decref(got);
        nm_config_free(c);
        cfg_errors_release(&errs);
        free(copy);
        free(path);
        compared++;
    }
    print_message("node manager: %d loads compared\n", compared);
    report_skips(skipped);
    assert_true(compared > 0);
    json_decref(want);
}

/* The controller had no effective dump before: its parsed struct, field by field. */
static json_t *ctl_fields(const struct ctlcfg *c)
{
    json_t *o = json_object();
#define S(f) json_object_set_new(o, #f, c->f ? json_string(c->f) : json_null())
#define I(f) json_object_set_new(o, #f, json_integer((json_int_t)c->f))
#define B(f) json_object_set_new(o, #f, json_boolean(c->f))
    S(host);
    I(port);
    B(obs_enable);
    I(obs_port);
    B(tls.enable);
    S(tls.ca_file);
    S(tls.cert_file);
    S(tls.key_file);
    S(tls.key_password);
    I(assemble_timeout_ms);
    I(assembler_check_ms);
    I(cmd_send_interval_ms);
    I(manager_check_ms);
    I(hb_timeout_active_ms);
    I(hb_timeout_other_ms);
    I(expired_timeout_ms);
    I(send_cmd_retry_times);
    I(start_cmd_timeout_ms);
    I(nm_probe_timeout_ms);
    B(coordinator_push);
    S(coordinator_host);
    I(coordinator_port);
    S(coordinator_key);
    I(coordinator_hb_ms);
    I(coordinator_sync_ms);
    I(coordinator_timeout_ms);
    B(ft_enable);
    I(strategy_check_ms);
    I(fault_window_ms);
    B(relaunch_enable);
    I(relaunch_timeout_ms);
    I(relaunch_poll_ms);
    I(relaunch_retries);
    I(relaunch_unreachable);
    I(relaunch_backoff_ms);
    B(scale_down_enable);
    B(scale_up_enable);
    I(sd_request_timeout_ms);
    I(sd_poll_ms);
    I(sd_deadline_ms);
    B(reconfig_enable);
    I(store);
    S(sqlite_path);
    json_t *eps = json_array();
    for (size_t i = 0; i < c->n_etcd_endpoints; i++)
        json_array_append_new(eps, json_string(c->etcd_endpoints[i]));
    json_object_set_new(o, "etcd_endpoints", eps);
    S(etcd_prefix);
    I(etcd_lease_ttl_s);
    I(etcd_timeout_ms);
    I(leader_retry_ms);
#undef S
#undef I
#undef B
    return o;
}

static void test_controller_and_coordinator(void **state)
{
    (void)state;
    unsetenv("POD_IP");
    unsetenv("COORDINATOR_SERVICE");
    unsetenv("CONTROLLER_SERVICE");
    json_t *want_ctl = before("controller"), *want_coord = before("coordinator");
    int skipped = 0, compared = 0;
    const char *key;
    json_t *w;
    json_object_foreach(want_ctl, key, w)
    {
        char *path = sample_path(key, &skipped);
        if (!path)
            continue;
        json_t *root = json_load_file(path, 0, NULL);
        assert_non_null(root);

        struct cfg_errors errs;
        cfg_errors_init(&errs, "");
        struct ctlcfg cc;
        ctlcfg_init(&cc);
        ctlcfg_apply(&cc, root, &errs);
        json_t *got = ctl_fields(&cc);
        json_object_set_new(got, "errors", json_string(cfg_errors_text(&errs)));
        expect_same(key, w, got);
        json_decref(got);
        ctlcfg_release(&cc);
        cfg_errors_release(&errs);

        cfg_errors_init(&errs, "motor_coordinator_config");
        struct ccfg co;
        ccfg_init(&co);
        ccfg_apply(&co, root, &errs);
        got = ccfg_to_json(&co);
        json_object_set_new(got, "errors", json_string(cfg_errors_text(&errs)));
        expect_same(key, json_object_get(want_coord, key), got);
        json_decref(got);
        ccfg_release(&co);
        cfg_errors_release(&errs);
        json_decref(root);
        free(path);
        compared++;
    }
    print_message("controller and coordinator: %d files compared\n", compared);
    report_skips(skipped);
    assert_true(compared > 0);
    json_decref(want_ctl);
    json_decref(want_coord);
}

static void test_pool_manifests(void **state)
{
    (void)state;
    json_t *want = before("pool_manifest");
    int skipped = 0;
    const char *key;
    json_t *w;
    json_object_foreach(want, key, w)
    {
        char *path = sample_path(key, &skipped);
        json_t *m = json_load_file(path, 0, NULL);
        assert_non_null(m);
        struct pool_config pc;
        pool_config_init(&pc);
        struct cfg_errors errs;
        cfg_errors_init(&errs, "");
        struct pool_manifest *pm = pool_manifest_parse(m, &pc.defaults, "/srv/base", &errs);
        json_t *got =
            pm ? json_deep_copy(pm->doc) : json_pack("{s:s}", "errors", cfg_errors_text(&errs));
        expect_same(key, w, got);
        json_decref(got);
        pool_manifest_unref(pm);
        cfg_errors_release(&errs);
        json_decref(m);
        free(path);
    }
    json_decref(want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_node_manager),
        cmocka_unit_test(test_controller_and_coordinator),
        cmocka_unit_test(test_pool_manifests),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
