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
#include "unit_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* got is stolen. */
static void expect_same(const char *key, json_t *want, json_t *got)
{
    if (json_equal(want, got)) {
        json_decref(got);
        return;
    }
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

/* Each fixture entry of daemon whose sample is here: check(key, path, want); then how many
 * were compared (at least one, or the test fails) and a loud note for those skipped. */
typedef void (*check_fn)(const char *key, const char *path, json_t *want);

static void each_sample(const char *daemon, check_fn check)
{
    json_t *all = before(daemon);
    int skipped = 0, compared = 0;
    const char *key;
    json_t *w;
    json_object_foreach(all, key, w)
    {
        char *path = sample_path(key, &skipped);
        if (!path)
            continue;
        check(key, path, w);
        free(path);
        compared++;
    }
    print_message("%s: %d loads compared\n", daemon, compared);
    report_skips(skipped);
    assert_true(compared > 0);
    json_decref(all);
}

/* key: "<sample>|<role>|<INDEX=n or ->" */
static void check_node_manager(const char *key, const char *path, json_t *want)
{
    char *copy = xstrdup(key);
    char *role = strchr(copy, '|') + 1;
    char *envtag = strchr(role, '|');
    *envtag++ = '\0';
    /* $POD_IP as the fixture's loads had it by default: without one the address becomes
     * this host's (seed 000), which no fixture can hold. */
    const char *env[] = {"POD_IP=127.0.0.1", strcmp(envtag, "-") == 0 ? NULL : envtag, NULL};
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
        /* Added since (seed 000): where the API binds, whether pod_ip was found. */
        json_object_del(json_object_get(got, "motor"), "bind_host");
        json_object_del(json_object_get(got, "motor"), "pod_ip_detected");
    } else {
        got = json_pack("{s:s}", "errors", cfg_errors_text(&errs));
    }
    expect_same(key, want, got);
    nm_config_free(c);
    cfg_errors_release(&errs);
    free(copy);
}

static void test_node_manager(void **state)
{
    (void)state;
    each_sample("node_manager", check_node_manager);
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

/* Remove the member at a dotted path ("a.b.c") of o, if there. */
static void del_path(json_t *o, const char *path)
{
    const char *dot;
    while (o && (dot = strchr(path, '.'))) {
        char head[128];
        size_t n = (size_t)(dot - path);
        if (n >= sizeof(head))
            return;
        memcpy(head, path, n);
        head[n] = '\0';
        o = json_object_get(o, head);
        path = dot + 1;
    }
    if (json_is_object(o))
        json_object_del(o, path);
}

/* What the controller's (or the coordinator's) loader made of root, with the error text. */
static json_t *effective(json_t *root, bool coordinator)
{
    struct cfg_errors errs;
    cfg_errors_init(&errs, coordinator ? "motor_coordinator_config" : "");
    struct ctlcfg cc;
    struct ccfg co;
    json_t *got;
    if (coordinator) {
        ccfg_init(&co);
        ccfg_apply(&co, root, &errs);
        got = ccfg_to_json(&co);
        ccfg_release(&co);
        /* Keys the coordinator reads since the before-image: upstream files that carry
         * them were not read then. One dotted path per key or block (a new key is one line
         * here, next to its row in coord_config.c). */
        static const char *const since[] = {
            "logging_config", /* issue 17: log level, master/standby, etcd */
            "standby_config",
            "etcd_config",
            "tls_config.etcd_tls_config", /* issue 13: etcd over TLS */
            "reschedule_config",          /* issue 19: mid-stream rescheduling */
            "api_config.max_connections", /* issue 19: connection slots */
            "api_config.keep_alive_timeout",
            "api_config.metaserver_base_port", /* issue 19: trigger mode */
            "precision_detection_config", /* issue 16: precision detection, alarms' target */
            "motor_controller_config",
            "prefill_kv_event_config", /* issue 18: KV events, cache-aware scheduling */
            "scheduler_config.kv_cache_affinity_mode",
            "scheduler_config.load_gate_factor",
            "scheduler_config.tokenize_timeout",
            "scheduler_config.kv_cache_affinity_source",
            "scheduler_config.approximate_chunks_per_endpoint",
            "scheduler_config.engine_metrics_interval",
        };
        for (size_t i = 0; i < sizeof(since) / sizeof(since[0]); i++)
            del_path(got, since[i]);
        /* Issue 18: kv_cache_affinity / compute_length are no longer degraded to
         * load_balance. */
        json_t *sc = json_object_get(got, "scheduler_config");
        const char *eff = json_string_value(json_object_get(sc, "effective_scheduler"));
        if (eff && (!strcmp(eff, "kv_cache_affinity") || !strcmp(eff, "compute_length")))
            json_object_set_new(sc, "effective_scheduler", json_string("load_balance"));
    } else {
        ctlcfg_init(&cc);
        ctlcfg_apply(&cc, root, &errs);
        got = ctl_fields(&cc);
        ctlcfg_release(&cc);
    }
    json_object_set_new(got, "errors", json_string(cfg_errors_text(&errs)));
    cfg_errors_release(&errs);
    return got;
}

static void check_controller(const char *key, const char *path, json_t *want)
{
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    expect_same(key, want, effective(root, false));
    json_decref(root);
}

static void check_coordinator(const char *key, const char *path, json_t *want)
{
    json_t *root = json_load_file(path, 0, NULL);
    assert_non_null(root);
    expect_same(key, want, effective(root, true));
    json_decref(root);
}

static void check_manifest(const char *key, const char *path, json_t *want)
{
    json_t *m = json_load_file(path, 0, NULL);
    assert_non_null(m);
    struct pool_config pc;
    pool_config_init(&pc);
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct pool_manifest *pm = pool_manifest_parse(m, &pc.defaults, "/srv/base", &errs);
    expect_same(key, want,
                pm ? json_deep_copy(pm->doc)
                   : json_pack("{s:s}", "errors", cfg_errors_text(&errs)));
    pool_manifest_unref(pm);
    cfg_errors_release(&errs);
    json_decref(m);
}

static void test_controller_and_coordinator(void **state)
{
    (void)state;
    unsetenv("POD_IP");
    unsetenv("COORDINATOR_SERVICE");
    unsetenv("CONTROLLER_SERVICE");
    each_sample("controller", check_controller);
    each_sample("coordinator", check_coordinator);
}

static void test_pool_manifests(void **state)
{
    (void)state;
    each_sample("pool_manifest", check_manifest);
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
