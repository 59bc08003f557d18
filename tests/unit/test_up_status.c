/* The pure parts of `motor up` and `motor status`: the plan (pods, indexes, ports,
 * collisions, port base) and the status model (documents -> model, health verdict,
 * metrics sums, tables). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "cli/status.h"
#include "cli/up_plan.h"
#include "common/util.h"
#include "unit_helpers.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- plan ------------------------------------------------------------------------- */

static json_t *parse(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j)
        fail_msg("bad test JSON: %s (line %d)", je.text, je.line);
    return j;
}

#define ENGINE(role)                                                                               \
    "\"motor_engine_" role "_config\": {\"engine_type\": \"sim\", \"engine_config\": "             \
    "{\"model\": \"m\", \"data_parallel_size\": 2, \"kv_transfer_config\": "                       \
    "{\"kv_connector\": \"NixlConnector\"}}}"

static const char *const PD =
    "{\"motor_deploy_config\": {\"p_instances_num\": 2, \"d_instances_num\": 1},"
    " \"motor_controller_config\": {\"api_config\": {\"controller_api_port\": 2026,"
    "   \"controller_api_dns\": \"controller.svc\"}},"
    " \"motor_coordinator_config\": {\"api_config\": {\"coordinator_api_infer_port\": 1025,"
    "   \"coordinator_api_mgmt_port\": 1026}},"
    " \"motor_nodemanger_config\": {\"api_config\": {\"node_manager_port\": 3026},"
    "   \"endpoint_config\": {\"base_port\": 10000}}," ENGINE("prefill") "," ENGINE("decode") "}";

static const struct up_plan_opts OPTS = {.state_dir = "/state", .motor_bin = "/bin/motor"};

/* TLS in the file: the plan says which listeners speak it and with which files (motor
 * up's own client); --tls switches every one on with the throwaway PKI's files. */
static void test_plan_tls(void **state)
{
    (void)state;
    json_t *cfg = parse(
        "{\"motor_deploy_config\": {\"tls_config\": {\"mgmt_tls_config\": {\"enable_tls\": true,"
        " \"ca_file\": \"/pki/ca.crt\", \"cert_file\": \"/pki/m.crt\", \"key_file\": "
        "\"/pki/m.key\"}}}," ENGINE("union") "}");
    struct up_plan p;
    struct cfg_errors e;
    struct up_plan_opts o = OPTS;
    o.port_base = 40000;
    cfg_errors_init(&e, "");
    if (up_plan_build(cfg, &o, &p, &e))
        fail_msg("%s", cfg_errors_text(&e));
    assert_true(p.mgmt_tls.on && p.ctl_tls.on);
    assert_false(p.infer_tls.on);
    assert_string_equal(p.ctl_tls.ca_file, "/pki/ca.crt");
    assert_string_equal(p.mgmt_tls.cert_file, "/pki/m.crt");
    assert_null(p.mgmt_tls.key_password);
    up_plan_release(&p);
    cfg_errors_release(&e);

    /* an encrypted key: motor up's own client reads its password like the daemons */
    char pw[] = "/tmp/motor-up-pw-XXXXXX";
    int fd = mkstemp(pw);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "hunter2\n", 8), 8);
    close(fd);
    json_t *blk = cfg_lookup(cfg, "motor_deploy_config.tls_config.mgmt_tls_config");
    json_object_set_new(blk, "passwd_file", json_string(pw));
    cfg_errors_init(&e, "");
    if (up_plan_build(cfg, &o, &p, &e))
        fail_msg("%s", cfg_errors_text(&e));
    assert_string_equal(p.mgmt_tls.key_password, "hunter2");
    up_plan_release(&p);
    cfg_errors_release(&e);
    unlink(pw);
    json_object_del(blk, "passwd_file");

    o.tls_dir = "/state/tls";
    cfg_errors_init(&e, "");
    if (up_plan_build(cfg, &o, &p, &e))
        fail_msg("%s", cfg_errors_text(&e));
    assert_true(p.mgmt_tls.on && p.ctl_tls.on && p.infer_tls.on);
    assert_string_equal(p.infer_tls.ca_file, "/state/tls/ca.crt");
    assert_string_equal(p.infer_tls.cert_file, "/state/tls/infer.crt");
    assert_string_equal(p.mgmt_tls.key_file, "/state/tls/mgmt.key");
    json_t *eng = cfg_lookup(p.config, "motor_engine_union_config.engine_config");
    assert_string_equal(json_string_value(json_object_get(eng, "ssl_certfile")),
                        "/state/tls/engine.crt");
    assert_string_equal(json_string_value(json_object_get(eng, "ssl_ca_certs")),
                        "/state/tls/ca.crt");
    assert_int_equal(json_integer_value(json_object_get(eng, "ssl_cert_reqs")), 2);
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);

    /* --tls with a tls_config that is not an object: said, not overwritten */
    cfg = parse("{\"motor_deploy_config\": {\"tls_config\": 3}," ENGINE("union") "}");
    cfg_errors_init(&e, "");
    assert_int_equal(up_plan_build(cfg, &o, &p, &e), -EINVAL);
    assert_non_null(strstr(cfg_errors_text(&e), "motor_deploy_config.tls_config"));
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);
}

static void test_plan_pd(void **state)
{
    (void)state;
    json_t *cfg = parse(PD);
    struct up_plan p;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    int rc = up_plan_build(cfg, &OPTS, &p, &e);
    if (rc)
        fail_msg("%s", cfg_errors_text(&e));
    assert_int_equal(p.n_pods, 3);
    assert_int_equal(p.n_instances, 3);
    /* Prefill g = INDEX = 0, 1; decode g = p_instances_num + INDEX = 2 with INDEX 0. */
    assert_string_equal(p.pods[0].name, "prefill-0");
    assert_string_equal(p.pods[1].name, "prefill-1");
    assert_string_equal(p.pods[2].name, "decode-0");
    assert_int_equal(p.pods[1].index, 1);
    assert_int_equal(p.pods[2].index, 0);
    assert_int_equal(p.pods[2].g, 2);
    assert_int_equal(p.pods[0].nm_port, 3026);
    assert_int_equal(p.pods[1].nm_port, 3027);
    assert_int_equal(p.pods[2].nm_port, 3028);
    /* base_port + g * 2 * dp, then 2 per rank. */
    assert_int_equal(p.pods[1].ports[0], 10004);
    assert_int_equal(p.pods[1].ports[1], 10006);
    assert_int_equal(p.pods[2].ports[0], 10008);
    assert_string_equal(p.pods[0].job_name, "motor-prefill-0");
    assert_string_equal(p.pods[2].job_name, "motor-decode-0");
    assert_int_equal(p.coord_port, 1025);
    assert_int_equal(p.ctl_port, 2026);
    /* Localized: single container, loopback, SQLite in the state directory. */
    assert_string_equal(json_string_value(cfg_lookup(p.config, "motor_deploy_config.deploy_mode")),
                        "single_container");
    assert_string_equal(json_string_value(cfg_lookup(
                            p.config, "motor_controller_config.api_config.controller_api_dns")),
                        "127.0.0.1");
    assert_string_equal(p.sqlite_path, "/state/controller.db");
    assert_true(p.notes.n >= 2); /* deploy_mode and controller_api_dns changed */
    /* The user's document is untouched. */
    assert_null(cfg_lookup(cfg, "motor_deploy_config.deploy_mode"));
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);
}

static void test_plan_port_base(void **state)
{
    (void)state;
    json_t *cfg = parse(PD);
    struct up_plan p;
    struct cfg_errors e;
    cfg_errors_init(&e, "");
    struct up_plan_opts o = OPTS;
    o.port_base = 40000;
    assert_int_equal(up_plan_build(cfg, &o, &p, &e), 0);
    assert_int_equal(p.coord_port, 40000);
    assert_int_equal(p.coord_mgmt_port, 40001);
    assert_int_equal(p.ctl_port, 40003);
    int *ports;
    char **owners;
    size_t n = up_plan_ports(&p, &ports, &owners);
    assert_int_equal(n, 3 + 3 + 3 * 2 + 3); /* control plane, NMs, engines, DP RPC */
    for (size_t i = 0; i < n; i++) {
        assert_true(ports[i] >= 40000 && ports[i] < 40064);
        for (size_t k = 0; k < i; k++)
            if (ports[k] == ports[i])
                fail_msg("port %d twice: %s, %s", ports[i], owners[k], owners[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(owners[i]);
    free(owners);
    free(ports);
    up_plan_release(&p);
    cfg_errors_release(&e);
    json_decref(cfg);
}

static void test_plan_errors(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        const char *expect;
    } cases[] = {
        {"{}", "nothing to start"},
        {"{\"motor_deploy_config\": {\"d_instances_num\": 0, \"p_instances_num\": 0}," ENGINE(
             "prefill") "}",
         "nothing to start"},
        /* Upstream defaults: controller, coordinator management and NM all on 1026. */
        {"{\"motor_deploy_config\": {\"d_instances_num\": 0}," ENGINE("prefill") "}",
         "1026 is used by both"},
        {"{\"motor_deploy_config\": {\"p_instances_num\": \"two\"}," ENGINE("prefill") "}",
         "p_instances_num"},
        {"{\"motor_engine_union_config\": 5}", "must be an object"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *cfg = parse(cases[i].json);
        struct up_plan p;
        struct cfg_errors e;
        cfg_errors_init(&e, "");
        assert_int_equal(up_plan_build(cfg, &OPTS, &p, &e), -EINVAL);
        if (!strstr(cfg_errors_text(&e), cases[i].expect))
            fail_msg("case %zu: expected '%s' in:\n%s", i, cases[i].expect, cfg_errors_text(&e));
        up_plan_release(&p);
        cfg_errors_release(&e);
        json_decref(cfg);
    }
}

/* ---- port base: DP master, KV transfer, SGLang bootstrap ----------------------------- */

/* A config from the repo (examples/...) or the shared upstream samples
 * (../shared/spec/upstream-examples/..., as test_wire_upstream finds them); NULL when
 * an upstream sample is not there. */
static json_t *load_config(const char *rel)
{
    char *path = repo_path(rel);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j && strncmp(rel, "../", 3) != 0)
        fail_msg("%s: %s", path, je.text);
    if (!j)
        fprintf(stderr, "*** %s not found: that row did NOT run\n", path);
    free(path);
    return j;
}

/* Every port the node manager derives for the plan's pods, whatever the engine binds:
 * node manager, engine ports, DP RPC (rank 0's pod), DP master + rank (one range per
 * role: every instance reads the same key), KV transfer span, SGLang bootstrap (one per
 * role). Sorted. */
static size_t derived_ports(const struct up_plan *p, int **out)
{
    size_t cap = 16, n = 0;
    for (size_t i = 0; i < p->n_pods; i++)
        cap += 3 + (size_t)p->pods[i].endpoint_num + (size_t)p->pods[i].dp_size +
               (size_t)p->pods[i].kv_span;
    int *v = calloc(cap, sizeof(int));
    v[n++] = p->coord_port;
    v[n++] = p->coord_mgmt_port;
    v[n++] = p->ctl_port;
    bool role_done[8] = {false};
    for (size_t i = 0; i < p->n_pods; i++) {
        const struct up_pod *d = &p->pods[i];
        v[n++] = d->nm_port;
        for (int k = 0; k < d->endpoint_num; k++)
            v[n++] = d->ports[k];
        if (d->dp_size > 1 && d->pod == 0)
            v[n++] = d->dp_rpc_port;
        for (int k = 0; k < d->kv_span; k++)
            v[n++] = d->kv_port + k;
        if (!role_done[d->role]) {
            role_done[d->role] = true;
            if (d->dp_size > 1)
                for (int r = 0; r < d->dp_size; r++)
                    v[n++] = d->dp_master_port + r;
            if (d->bootstrap_port)
                v[n++] = d->bootstrap_port;
        }
    }
    for (size_t i = 1; i < n; i++) /* insertion sort: a few dozen ports */
        for (size_t k = i; k > 0 && v[k - 1] > v[k]; k--) {
            int t = v[k];
            v[k] = v[k - 1];
            v[k - 1] = t;
        }
    *out = v;
    return n;
}

static json_t *engine_of(const struct up_plan *p, const char *role)
{
    char key[64];
    snprintf(key, sizeof(key), "motor_engine_%s_config", role);
    return json_object_get(json_object_get(p->config, key), "engine_config");
}

/* The effective kv_transfer_config.kv_port of a role as text, with its JSON type. */
static void kv_port_of(const struct up_plan *p, const char *role, char *buf, size_t cap,
                       bool *is_string)
{
    json_t *kvt = json_object_get(engine_of(p, role), "kv_transfer_config");
    json_t *parsed = NULL;
    if (json_is_string(kvt))
        kvt = parsed = json_loads(json_string_value(kvt), 0, NULL);
    json_t *v = json_object_get(kvt, "kv_port");
    *is_string = json_is_string(v);
    if (json_is_string(v))
        snprintf(buf, cap, "%s", json_string_value(v));
    else if (json_is_integer(v))
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
    else
        snprintf(buf, cap, "(none)");
    json_decref(parsed);
}

/* A file with what the upstream samples do not cover: a kv_transfer_config given as a
 * JSON string with an integer kv_port, dashed spellings of the DP keys, and the DP
 * scale-down proxy (dp_master reserved even at dp 1). */
static const char *const SPELLINGS =
    "{\"motor_deploy_config\": {\"p_instances_num\": 1, \"d_instances_num\": 1},"
    " \"motor_controller_config\": {\"fault_tolerance_config\": {\"enable_fault_tolerance\": "
    "   true, \"enable_dp_scale_down\": true}},"
    " \"motor_engine_prefill_config\": {\"engine_type\": \"vllm\", \"engine_config\": {"
    "   \"model\": \"m\", \"data-parallel-size\": 2, \"tensor_parallel_size\": 2,"
    "   \"--data-parallel-master-port\": 29500, \"data-parallel-rpc-port\": 9000,"
    "   \"kv_transfer_config\": \"{\\\"kv_connector\\\": \\\"MooncakeConnectorV1\\\","
    "      \\\"kv_port\\\": 30001}\"}},"
    " \"motor_engine_decode_config\": {\"engine_type\": \"vllm\", \"engine_config\": {"
    "   \"model\": \"m\", \"data_parallel_size\": 1,"
    "   \"kv-transfer-config\": {\"kv_connector\": \"MooncakeConnectorV1\", \"kv_port\": "
    "     \"30101\"}}}}";

static void test_plan_port_base_engine_ports(void **state)
{
    (void)state;
    enum { B = 40000 };
    static const struct {
        const char *file; /* repo-relative; NULL = SPELLINGS */
        /* expected effective values (0 = key absent / not rewritten) */
        int p_master, d_master; /* data_parallel_master_port per role */
        int p_kv, d_kv;         /* kv_transfer_config.kv_port per role */
        bool kv_string;         /* kv_port kept a string */
        int p_boot, d_boot;     /* disaggregation_bootstrap_port */
        /* derived for the first prefill pod and the first decode pod */
        int p_kv_pod, d_kv_pod;
        int top; /* highest derived port - B */
    } rows[] = {
        /* vLLM PD, dp 2 x tp 4 (world 8), MooncakeConnectorV1 kv_port "30001"/"30101". NM
         * 10-11, DP RPC 12-13, engines 14-21, prefill master 22-23, prefill kv 24-31,
         * decode master 32-33, decode kv (g 1: 26 + 8) 34-41. */
        {"examples/vllm-pd.json", B + 22, B + 32, B + 24, B + 26, true, 0, 0, B + 24, B + 34, 41},
        /* SGLang PD: only the prefill serves the bootstrap (decode has no key). */
        {"examples/sglang-pd.json", 0, 0, 0, 0, false, B + 18, 0, 0, 0, 18},
        {"../shared/spec/upstream-examples/sglang-user_config.json", 0, 0, 0, 0, false, B + 18, 0,
         0, 0, 18},
        /* Upstream single container: both roles kv_port "30001", world 1. */
        {"../shared/spec/upstream-examples/vllm-single_container-user_config.json", 0, 0, B + 18,
         B + 18, true, 0, 0, B + 18, B + 19, 19},
        /* Dashed spellings, JSON-string kv_transfer_config (integer kv_port), scale-down
         * proxy: prefill dp 2 x tp 2 (world 4, engines 14-17), decode dp 1 (engine 18).
         * Prefill master 20-21, kv 22-25; decode master 26 (proxy, dp 1), kv 27 - 1*1. */
        {NULL, B + 20, B + 26, B + 22, B + 26, false, 0, 0, B + 22, B + 27, 27},
    };
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const char *name = rows[i].file ? rows[i].file : "SPELLINGS";
        json_t *cfg = rows[i].file ? load_config(rows[i].file) : parse(SPELLINGS);
        if (!cfg)
            continue;
        struct up_plan p;
        struct cfg_errors e;
        cfg_errors_init(&e, "");
        struct up_plan_opts o = OPTS;
        o.port_base = B;
        if (up_plan_build(cfg, &o, &p, &e) != 0)
            fail_msg("%s: %s", name, cfg_errors_text(&e));

        /* The rewritten keys, under their underscore spelling only. */
        json_t *pe = engine_of(&p, "prefill"), *de = engine_of(&p, "decode");
        json_t *pm = json_object_get(pe, "data_parallel_master_port");
        json_t *dm = json_object_get(de, "data_parallel_master_port");
        if ((int)json_integer_value(pm) != rows[i].p_master ||
            (int)json_integer_value(dm) != rows[i].d_master)
            fail_msg("%s: data_parallel_master_port %lld/%lld, expected %d/%d", name,
                     (long long)json_integer_value(pm), (long long)json_integer_value(dm),
                     rows[i].p_master, rows[i].d_master);
        assert_null(json_object_get(pe, "--data-parallel-master-port"));
        assert_null(json_object_get(pe, "data-parallel-rpc-port"));
        assert_null(json_object_get(de, "kv-transfer-config"));
        char kv[32];
        bool str;
        char want[32];
        snprintf(want, sizeof(want), "%d", rows[i].p_kv);
        kv_port_of(&p, "prefill", kv, sizeof(kv), &str);
        if (rows[i].p_kv && (strcmp(kv, want) != 0 || str != rows[i].kv_string))
            fail_msg("%s: prefill kv_port %s (string %d), expected %s", name, kv, str, want);
        snprintf(want, sizeof(want), "%d", rows[i].d_kv);
        kv_port_of(&p, "decode", kv, sizeof(kv), &str);
        if (rows[i].d_kv && strcmp(kv, want) != 0)
            fail_msg("%s: decode kv_port %s, expected %s", name, kv, want);
        if (!rows[i].p_kv) { /* not added where the file has none */
            kv_port_of(&p, "prefill", kv, sizeof(kv), &str);
            assert_string_equal(kv, "(none)");
        }
        assert_int_equal(json_integer_value(json_object_get(pe, "disaggregation_bootstrap_port")),
                         rows[i].p_boot);
        assert_int_equal(json_integer_value(json_object_get(de, "disaggregation_bootstrap_port")),
                         rows[i].d_boot);

        /* What the node managers derive from them. */
        const struct up_pod *pp = NULL, *dp = NULL;
        for (size_t k = 0; k < p.n_pods; k++) {
            if (!pp && p.pods[k].role == WIRE_ROLE_PREFILL)
                pp = &p.pods[k];
            if (!dp && p.pods[k].role == WIRE_ROLE_DECODE)
                dp = &p.pods[k];
        }
        assert_non_null(pp);
        assert_non_null(dp);
        assert_int_equal(pp->kv_port, rows[i].p_kv_pod);
        assert_int_equal(dp->kv_port, rows[i].d_kv_pod);
        if (rows[i].p_master)
            assert_int_equal(pp->dp_master_port, rows[i].p_master);
        assert_int_equal(pp->bootstrap_port, rows[i].p_boot);

        /* No two derived ports collide, all inside the block, and the bound check's
         * figure is the top of it. */
        int *v;
        size_t n = derived_ports(&p, &v);
        for (size_t k = 0; k < n; k++) {
            if (v[k] < B || v[k] > B + rows[i].top)
                fail_msg("%s: port %d outside %d..%d", name, v[k], B, B + rows[i].top);
            if (k && v[k] == v[k - 1])
                fail_msg("%s: port %d derived twice", name, v[k]);
        }
        assert_int_equal(v[n - 1], B + rows[i].top);

        /* A second fleet right above this one's block shares no port with it, derived
         * or written in the effective config. */
        int b2 = v[n - 1] + 1;
        b2 += b2 & 1; /* same parity: the same layout */
        struct up_plan q;
        o.port_base = b2;
        if (up_plan_build(cfg, &o, &q, &e) != 0)
            fail_msg("%s (base %d): %s", name, b2, cfg_errors_text(&e));
        int *w;
        size_t m = derived_ports(&q, &w);
        assert_int_equal(m, n);
        for (size_t k = 0; k < m; k++) {
            assert_int_equal(w[k], v[k] + (b2 - B)); /* the same layout, shifted */
            for (size_t l = 0; l < n; l++)
                if (w[k] == v[l])
                    fail_msg("%s: port %d in both fleets", name, w[k]);
        }
        free(w);
        up_plan_release(&q);

        /* The bound check covers these ports: a base that leaves the top beyond 65535
         * is refused with the true top. */
        /* (Bases of one parity: the engine block starts on an even port.) */
        int hi = 65536 - rows[i].top;
        hi += hi & 1;
        o.port_base = hi;
        assert_int_equal(up_plan_build(cfg, &o, &q, &e), -EINVAL);
        char msg[96];
        snprintf(msg, sizeof(msg), "needs ports up to %d", hi + rows[i].top);
        if (!strstr(cfg_errors_text(&e), msg))
            fail_msg("%s: expected '%s' in:\n%s", name, msg, cfg_errors_text(&e));
        up_plan_release(&q);
        cfg_errors_release(&e);
        cfg_errors_init(&e, "");
        o.port_base = hi - 2;
        if (up_plan_build(cfg, &o, &q, &e) != 0)
            fail_msg("%s (base %d): %s", name, hi - 2, cfg_errors_text(&e));
        up_plan_release(&q);

        free(v);
        up_plan_release(&p);
        cfg_errors_release(&e);
        json_decref(cfg);
    }
}

/* The collision check knows the engines' own ports: two vLLM roles on the default DP
 * master port, and two instances of one role sharing it (a layout limit: the node
 * manager gives every instance of a role the same port, so the message says so). */
static void test_plan_engine_port_collisions(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int port_base;
        const char *expect;
    } cases[] = {
        {"{\"motor_coordinator_config\": {\"api_config\": {\"coordinator_api_mgmt_port\": 1024}},"
         " \"motor_engine_prefill_config\": {\"engine_type\": \"vllm\", \"engine_config\": "
         "   {\"model\": \"m\", \"data_parallel_size\": 2, \"kv_transfer_config\": "
         "   {\"kv_connector\": \"MooncakeConnectorV1\"}}},"
         " \"motor_engine_decode_config\": {\"engine_type\": \"vllm\", \"engine_config\": "
         "   {\"model\": \"m\", \"data_parallel_size\": 2, \"data_parallel_rpc_port\": 9100,"
         "    \"kv_transfer_config\": {\"kv_connector\": \"MooncakeConnectorV1\"}}}}",
         0, "29500 is used by both prefill-0 DP master rank 0 and decode-0 DP master rank 0"},
        {"{\"motor_deploy_config\": {\"hybrid_instances_num\": 2},"
         " \"motor_engine_union_config\": {\"engine_type\": \"vllm\", \"engine_config\": "
         "   {\"model\": \"m\", \"data_parallel_size\": 2}}}",
         30000,
         "every instance of the union role reads the same "
         "engine_config.data_parallel_master_port"},
        {"{\"motor_deploy_config\": {\"p_instances_num\": 2, \"d_instances_num\": 1},"
         " \"motor_engine_prefill_config\": {\"engine_type\": \"sglang\", \"engine_config\": "
         "   {\"model\": \"m\"}},"
         " \"motor_engine_decode_config\": {\"engine_type\": \"sglang\", \"engine_config\": "
         "   {\"model\": \"m\"}}}",
         30000,
         "every instance of the prefill role reads the same "
         "engine_config.disaggregation_bootstrap_port"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *cfg = parse(cases[i].json);
        struct up_plan p;
        struct cfg_errors e;
        cfg_errors_init(&e, "");
        struct up_plan_opts o = OPTS;
        o.port_base = cases[i].port_base;
        assert_int_equal(up_plan_build(cfg, &o, &p, &e), -EINVAL);
        if (!strstr(cfg_errors_text(&e), cases[i].expect))
            fail_msg("case %zu: expected '%s' in:\n%s", i, cases[i].expect, cfg_errors_text(&e));
        up_plan_release(&p);
        cfg_errors_release(&e);
        json_decref(cfg);
    }
}

/* ---- status ------------------------------------------------------------------------ */

static void test_metric_sum(void **state)
{
    (void)state;
    const char *text = "# HELP motor_coordinator_requests_total x\n"
                       "# TYPE motor_coordinator_requests_total counter\n"
                       "motor_coordinator_requests_total{api=\"chat\",code=\"200\"} 7\n"
                       "motor_coordinator_requests_total{api=\"a b}\",code=\"503\"} 2.5\n"
                       "motor_coordinator_requests_total_other 100\n"
                       "motor_coordinator_inflight_requests 3\n";
    assert_true(status_metric_sum(text, "motor_coordinator_requests_total") == 9.5);
    assert_true(status_metric_sum(text, "motor_coordinator_inflight_requests") == 3);
    assert_true(status_metric_sum(text, "absent") == -1);
    assert_true(status_metric_sum(NULL, "x") == -1);
}

static const char *const CTL_DOC =
    "{\"count\": 2, \"instances\": ["
    " {\"id\": 2, \"role\": \"decode\", \"job_name\": \"j-d\", \"model_name\": \"m\","
    "  \"status\": \"inactive\", \"ft_phase\": \"NORMAL\", \"strategy\": "
    "\"EngineRelaunchStrategy\","
    "  \"node_managers\": [{\"pod_ip\": \"10.0.0.2\", \"endpoints\": ["
    "    {\"id\": 1, \"ip\": \"10.0.0.2\", \"business_port\": \"10006\", \"status\": \"abnormal\","
    "     \"heartbeat_age_s\": 0.42},"
    "    {\"id\": 0, \"ip\": \"10.0.0.2\", \"business_port\": \"10004\", \"status\": \"normal\","
    "     \"heartbeat_age_s\": 0.4}]}]},"
    " {\"id\": 1, \"role\": \"prefill\", \"job_name\": \"j-p\", \"model_name\": \"m\","
    "  \"status\": \"active\", \"ft_phase\": null,"
    "  \"endpoints\": {\"10.0.0.1\": {\"0\": {\"id\": 0, \"ip\": \"10.0.0.1\","
    "   \"business_port\": 10000, \"status\": \"normal\", \"hb_timestamp\": 995.0}}}}],"
    " \"assembling\": []}";

static const char *const COORD_DOC =
    "{\"count\": 1, \"instances\": [{\"id\": 1, \"role\": \"prefill\", \"job_name\": \"j-p\","
    " \"status\": \"active\", \"pool\": \"available\", \"healthy\": true,"
    " \"circuit_breaker\": {\"state\": \"closed\", \"trip_count\": 0},"
    " \"endpoints\": [{\"id\": 0, \"ip\": \"10.0.0.1\", \"business_port\": \"10000\","
    "   \"status\": \"normal\", \"inflight_requests\": 2}]}]}";

static void test_model(void **state)
{
    (void)state;
    struct status_docs d = {0};
    d.ctl_instances = parse(CTL_DOC);
    d.coord_instances = parse(COORD_DOC);
    d.coord_metrics = strdup("motor_coordinator_requests_total{api=\"chat\"} 5\n");
    struct status_targets t = {.controller = "http://c", .coordinator = "http://o"};
    json_t *m = status_model(&t, &d, 1000.0);
    assert_false(status_model_healthy(m));
    json_t *insts = json_object_get(m, "instances");
    assert_int_equal(json_array_size(insts), 2);
    json_t *i0 = json_array_get(insts, 0), *i1 = json_array_get(insts, 1);
    assert_int_equal(json_integer_value(json_object_get(i0, "id")), 1); /* sorted by id */
    json_t *ep = json_array_get(json_object_get(i0, "endpoints"), 0);
    assert_string_equal(json_string_value(json_object_get(ep, "address")), "10.0.0.1:10000");
    assert_true(json_real_value(json_object_get(ep, "hb_age_s")) == 5.0);
    json_t *eps1 = json_object_get(i1, "endpoints");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(eps1, 0), "id")), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(eps1, 1), "address")),
                        "10.0.0.2:10006");
    assert_string_equal(json_string_value(json_object_get(i1, "strategy")),
                        "EngineRelaunchStrategy");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(m, "coordinator"), "requests_total")),
        5);
    /* Problems: decode inactive, its endpoint 1 abnormal. The coordinator not knowing an
     * inactive instance is expected, not a problem. */
    json_t *probs = json_object_get(m, "problems");
    assert_int_equal(json_array_size(probs), 2);
    assert_non_null(strstr(json_string_value(json_array_get(probs, 0)), "is inactive"));
    assert_non_null(
        strstr(json_string_value(json_array_get(probs, 1)), "10.0.0.2:10006 is abnormal"));

    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    status_render(&sb, m);
    const char *out = strbuf_str(&sb);
    assert_non_null(strstr(out, "INSTANCES (controller)"));
    assert_non_null(strstr(out, "NORMAL (EngineRelaunchStrategy)"));
    assert_non_null(strstr(out, "10.0.0.1:10000 (2)"));
    assert_non_null(strstr(out, "UNHEALTHY: 2 problem(s)"));
    strbuf_release(&sb);
    json_decref(m);

    /* Everything fine: healthy. */
    json_decref(d.ctl_instances);
    d.ctl_instances = parse("{\"instances\": [{\"id\": 1, \"role\": \"prefill\", \"status\":"
                            " \"active\", \"endpoints\": []}]}");
    m = status_model(&t, &d, 1000.0);
    assert_true(status_model_healthy(m));
    assert_int_equal(json_array_size(json_object_get(m, "alarms")), 0);
    json_decref(m);

    /* An active precision alarm: listed, rendered, and a problem. */
    d.ctl_prec = parse("{\"active\": [{\"seq\": 1, \"d_instance_id\": 1, \"p_instance_id\":"
                       " null, \"moi\": \"service name=Coordinator, service ip=10.0.0.9, "
                       "instanceId=1\", \"raised_at_ms\": 5, \"alarm\": {\"alarm_id\": "
                       "\"0xFC001009\", \"alarm_name\": \"Precision Anomaly Alarm\"}}], "
                       "\"recent\": [{\"d_instance_id\": 7, \"moi\": \"m7\", \"cleared_by\": "
                       "\"auto_recovery\", \"alarm\": {\"alarm_id\": \"0xFC001009\"}}]}");
    m = status_model(&t, &d, 1000.0);
    assert_false(status_model_healthy(m));
    json_t *al = json_array_get(json_object_get(m, "alarms"), 0);
    assert_string_equal(json_string_value(json_object_get(al, "alarm_id")), "0xFC001009");
    assert_true(json_is_null(json_object_get(al, "p_instance_id")));
    assert_non_null(strstr(json_string_value(json_array_get(json_object_get(m, "problems"), 0)),
                           "Precision Anomaly Alarm 0xFC001009 on instance 1"));
    strbuf_init(&sb, 1 << 20);
    status_render(&sb, m);
    assert_non_null(strstr(strbuf_str(&sb), "ACTIVE ALARMS (controller)"));
    assert_non_null(strstr(strbuf_str(&sb), "service ip=10.0.0.9, instanceId=1"));
    assert_non_null(strstr(strbuf_str(&sb), "RECENTLY CLEARED ALARMS (controller)"));
    assert_non_null(strstr(strbuf_str(&sb), "auto_recovery"));
    assert_int_equal(json_array_size(json_object_get(m, "recent_alarms")), 1);
    assert_int_equal(json_array_size(json_object_get(m, "problems")), 1); /* recent: none */
    strbuf_release(&sb);
    json_decref(m);
    json_decref(d.ctl_prec);
    d.ctl_prec = NULL;

    /* Unreachable sides. */
    struct status_docs bad = {.ctl_error = strdup("Connection refused"),
                              .coord_error = strdup("HTTP 500: x")};
    m = status_model(&t, &bad, 1000.0);
    assert_false(status_model_healthy(m));
    assert_int_equal(json_array_size(json_object_get(m, "problems")), 2);
    json_decref(m);
    status_docs_release(&bad);
    status_docs_release(&d);
}

static void test_table(void **state)
{
    (void)state;
    struct status_table t;
    status_table_init(&t, 2);
    status_table_cell(&t, "A");
    status_table_cell(&t, "B");
    status_table_cell(&t, "long %d", 1);
    status_table_cell(&t, "x");
    struct strbuf sb;
    strbuf_init(&sb, 4096);
    status_table_render(&t, &sb, "> ");
    assert_string_equal(strbuf_str(&sb), "> A       B\n> long 1  x\n");
    strbuf_release(&sb);
    status_table_release(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_pd),
        cmocka_unit_test(test_plan_tls),
        cmocka_unit_test(test_plan_port_base),
        cmocka_unit_test(test_plan_errors),
        cmocka_unit_test(test_plan_port_base_engine_ports),
        cmocka_unit_test(test_plan_engine_port_collisions),
        cmocka_unit_test(test_metric_sum),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
