/* nm_config: defaults, derived values, every validation rule with its exact message,
 * several errors reported together, environment precedence, hot reload, the
 * --check-config entry point, and every upstream user_config.json for every role it
 * has (read in place from ../shared/spec/upstream-examples). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "nodemgr/nm_config.h"
#include "unit_helpers.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------ */

static char *fixture(const char *name)
{
    char *rel = xasprintf("tests/fixtures/%s", name);
    char *p = repo_path(rel);
    free(rel);
    return p;
}

/* Load a fixture file for role with the given environment ("K=V" list). */
static struct nm_config *load_fixture(const char *name, const char *role, const char **env,
                                      struct cfg_errors *errs)
{
    char *path = fixture(name);
    static const char *none[] = {NULL};
    struct nm_config_opts o = {.config_path = path,
                               .role = role,
                               .env = nm_env_from_array,
                               .env_ud = env ? (void *)env : (void *)none,
                               .motor_bin = "/opt/motor/bin/motor"};
    cfg_errors_init(errs, "");
    struct nm_config *c = nm_config_load(&o, errs);
    free(path);
    return c;
}

static struct nm_config *must_load(const char *name, const char *role, const char **env)
{
    struct cfg_errors errs;
    struct nm_config *c = load_fixture(name, role, env, &errs);
    if (!c)
        fail_msg("%s (%s): %s", name, role, cfg_errors_text(&errs));
    cfg_errors_release(&errs);
    return c;
}

static struct nm_config *from_text(const char *squoted, const char *role, const char **env,
                                   struct cfg_errors *errs)
{
    json_t *root = J(squoted);
    static const char *none[] = {NULL};
    struct nm_config_opts o = {.role = role,
                               .env = nm_env_from_array,
                               .env_ud = env ? (void *)env : (void *)none,
                               .motor_bin = "motor"};
    cfg_errors_init(errs, "");
    struct nm_config *c = nm_config_from_json(root, &o, errs);
    json_decref(root);
    return c;
}

/* ---- defaults ----------------------------------------------------------------------- */

static void test_defaults(void **state)
{
    (void)state;
    struct nm_config *c = must_load("nm_defaults.json", "both", NULL);
    assert_int_equal(c->role, WIRE_ROLE_UNION);
    assert_string_equal(c->role_section, "motor_engine_union_config");
    /* Seed 000: no pod_ip anywhere: the API binds the wildcard address and advertises an
     * address of this host (the Controller's host is a DNS name here: an interface's). */
    assert_string_equal(c->bind_host, "0.0.0.0");
    assert_true(c->pod_ip_detected);
    assert_non_null(c->pod_ip);
    assert_string_not_equal(c->pod_ip, "0.0.0.0");
    assert_int_equal(c->node_manager_port, 1026);
    assert_false(c->mgmt_tls.enable_tls);
    assert_string_equal(c->mgmt_tls.ca_file, "security/mgmt/cert/ca.crt");
    assert_string_equal(c->mgmt_tls.key_file, "security/mgmt/keys/server.key");
    assert_string_equal(c->controller_host,
                        "mindie-motor-controller-service.mindie-motor.svc.cluster.local");
    assert_int_equal(c->controller_port, 1026);
    assert_null(c->job_name);
    assert_string_equal(c->model_name, "/models/tiny");
    assert_int_equal(c->engine_type, NM_ENGINE_VLLM);
    assert_int_equal(c->dispatch_capabilities.n, 0);
    assert_string_equal(c->hardware_type, "800I-A3");
    assert_true(c->heartbeat_interval_seconds == 3.0);
    assert_true(c->daemon_loop_interval == 5.0);
    assert_int_equal(c->parallel.dp_size, 1);
    assert_int_equal(c->parallel.world_size, 1);
    assert_int_equal(c->parallel.local_world_size, 1);
    assert_int_equal(c->device_num, 1); /* no NPU count anywhere: dp * local world */
    assert_int_equal(c->endpoint_num, 1);
    assert_int_equal(c->base_port, 10000);
    assert_int_equal(c->service_ports[0], 10000);
    assert_int_equal(c->bootstrap_port, 0);
    assert_int_equal(c->nnodes, 1);
    assert_int_equal(c->dp_master_port, 29500);
    assert_int_equal(c->dp_rpc_port, 9000);
    assert_true(c->enable_multi_endpoints);
    assert_false(c->ft.enable_fault_tolerance);
    assert_true(c->ft.poll_interval_sec == 1.0);
    assert_true(c->ft.poll_timeout_sec == 5.0);
    assert_int_equal(c->ft.max_poll_failures, 3);
    assert_int_equal(c->ft.max_consecutive_404, 3);
    assert_true(c->ft.unsupported_reprobe_interval_sec == 60.0);
    assert_true(c->ft.enable_engine_relaunch);
    assert_true(c->ft.engine_restart_wait_timeout_sec == 180.0);
    assert_true(c->ft.engine_restart_freeze_sec == 720.0);
    assert_false(c->ft.container_restart_managed);
    assert_true(c->ft.container_restart_managed_auto);
    assert_false(c->ft.enable_dp_scale_down_proxy);
    assert_string_equal(c->log_level, "INFO");
    assert_int_equal(c->log_max_line_length, 8192);
    assert_true(c->port_alloc_enable);
    assert_int_equal(c->port_alloc_scan_range, 100);
    assert_string_equal(c->port_alloc_bind_host, "0.0.0.0");
    assert_false(c->sc.enabled);
    assert_false(c->kv.enabled);
    assert_int_equal(c->kv.port, 50088);
    assert_int_equal(c->health.health_collector_timeout, 5);
    assert_int_equal(c->health.health_collector_timeout_retry_attempts, 3);
    assert_int_equal(c->health.startup_timeout, 1800);
    assert_int_equal(c->health.max_failure_count, 6);
    assert_int_equal(c->restart_policy, NM_RESTART_CONTROLLER);
    assert_true(c->restart_backoff_initial_sec == 1);
    assert_true(c->restart_backoff_max_sec == 60);
    assert_true(c->restart_reset_after_sec == 600);
    assert_int_equal(c->restart_start_limit, 10);
    assert_false(c->standalone);
    assert_null(c->management_api_key);
    assert_string_equal(c->engine_log_dir, "");
    assert_int_equal(c->engine_log_rotation_bytes, 20 << 20);
    assert_int_equal(c->engine_log_rotation_count, 10);
    assert_true(c->stop_grace_seconds == 10);
    assert_null(c->ranktable_path);
    assert_null(c->hccl_path);
    assert_string_equal(c->motor_bin, "/opt/motor/bin/motor");
    assert_int_equal(c->warnings.n, 0);
    assert_true(c->has_role_parallel[WIRE_ROLE_UNION]);
    assert_false(c->has_role_parallel[WIRE_ROLE_PREFILL]);
    nm_config_free(c);
    nm_config_free(NULL);
}

/* ---- derived values ------------------------------------------------------------------- */

static void test_vllm_prefill_derived(void **state)
{
    (void)state;
    struct nm_config *c = must_load("nm_vllm_pd.json", "prefill", NULL);
    /* the role's NM block overrides the top-level one, key by key */
    assert_int_equal(c->node_manager_port, 1600);
    assert_true(c->heartbeat_interval_seconds == 2.0);
    assert_string_equal(c->job_name, "from-file");
    assert_string_equal(c->log_level, "DEBUG");
    assert_true(c->ft.engine_restart_wait_timeout_sec == 90.0);
    /* deploy-level overrides */
    assert_string_equal(c->hardware_type, "800I_A2");
    assert_true(c->mgmt_tls.enable_tls);
    assert_string_equal(c->mgmt_tls.ca_file, "/etc/motor/ca.pem");
    assert_string_equal(c->mgmt_tls.cert_file, "security/mgmt/cert/server.crt");
    /* controller block */
    assert_string_equal(c->controller_host, "ctl.example");
    assert_int_equal(c->controller_port, 2026);
    assert_true(c->ft.enable_dp_scale_down_proxy);
    assert_false(c->ft.enable_engine_relaunch); /* mirrors the Controller switch */
    /* engine section */
    assert_string_equal(c->model_name, "qwen");
    assert_int_equal(c->parallel.dp_size, 2);
    assert_int_equal(c->parallel.tp_size, 2);
    assert_int_equal(c->parallel.world_size, 4);
    assert_int_equal(c->parallel.local_world_size, 2);
    assert_int_equal(c->parallel.ep_size, 1);
    assert_int_equal(c->device_num, 4);
    assert_int_equal(c->endpoint_num, 2);
    assert_int_equal(c->base_port, 20000);
    assert_int_equal(c->service_ports[0], 20000);
    assert_int_equal(c->service_ports[1], 20002);
    assert_int_equal(c->dp_master_port, 29600);
    assert_int_equal(c->dp_rpc_port, 9100);
    assert_int_equal(c->dispatch_capabilities.n, 1);
    assert_string_equal(c->dispatch_capabilities.items[0], "prefill_handoff_decode");
    assert_true(c->ft_capability.enabled);
    assert_true(c->ft_capability.scale_down_supported);
    assert_true(c->ft_capability.external_lb);
    assert_false(c->ft_capability.auto_recovery);
    assert_true(c->ft_capability.fused_mc2_enabled);
    assert_true(c->ft_capability.eplb_enabled);
    assert_int_equal(c->ft_capability.num_redundant_experts, 16);
    assert_true(c->ft.enable_fault_tolerance); /* the engine advertises FT */
    assert_int_equal(c->health.startup_timeout, 600);
    assert_int_equal(c->health.health_collector_timeout, 2);
    /* normalized engine config: dashes to underscores, JSON strings parsed */
    assert_non_null(json_object_get(c->engine_config, "data_parallel_size"));
    assert_null(json_object_get(c->engine_config, "data-parallel-size"));
    assert_true(json_is_object(json_object_get(c->engine_config, "eplb_config")));
    /* the other role's sizes, for kv_connector_extra_config */
    assert_true(c->has_role_parallel[WIRE_ROLE_DECODE]);
    assert_int_equal(c->role_parallel[WIRE_ROLE_DECODE].dp_size, 4);
    assert_int_equal(c->role_parallel[WIRE_ROLE_DECODE].tp_size, 1);
    assert_true(c->has_role_parallel[WIRE_ROLE_PREFILL]);
    assert_false(c->has_role_parallel[WIRE_ROLE_UNION]);
    /* the user's dispatch_capabilities were dropped with a warning */
    assert_int_equal(c->warnings.n, 1);
    assert_non_null(strstr(c->warnings.items[0], "dispatch_capabilities"));
    assert_int_equal(nm_config_dp_store_port(c, 0), 29600);
    assert_int_equal(nm_config_dp_store_port(c, 3), 29603);
    assert_int_equal(nm_config_dp_store_port(c, -1), -ERANGE);
    assert_int_equal(nm_config_dp_store_port(c, 40000), -ERANGE);
    nm_config_free(c);
}

static void test_vllm_decode_derived(void **state)
{
    (void)state;
    struct nm_config *c = must_load("nm_vllm_pd.json", "decode", NULL);
    assert_int_equal(c->node_manager_port, 1500); /* top-level block only */
    assert_int_equal(c->base_port, 10000);
    assert_string_equal(c->model_name, "qwen-d"); /* first served name */
    assert_int_equal(c->device_num, 2);
    assert_int_equal(c->endpoint_num, 2); /* min(dp 4, 2 devices / 1) */
    assert_string_equal(c->dispatch_capabilities.items[0], "concurrent_engine_sync");
    assert_false(c->ft_capability.enabled);
    assert_false(c->ft.enable_fault_tolerance);
    assert_true(c->ft.engine_restart_wait_timeout_sec == 180.0);
    assert_int_equal(c->role_parallel[WIRE_ROLE_PREFILL].dp_size, 2);
    assert_int_equal(c->role_parallel[WIRE_ROLE_PREFILL].tp_size, 2);
    nm_config_free(c);
}

struct derive_case {
    const char *json;
    const char *role;
    int dp, world, local_world, ep, device_num, endpoints, nnodes;
};

static void test_parallel_rules(void **state)
{
    (void)state;
    static const struct derive_case cases[] = {
        /* pcp*pp divisible by nnodes: local world divided */
        {"{'motor_deploy_config':{'hybrid_pod_npu_num':8},'motor_engine_union_config':{"
         "'engine_config':{'prefill_context_parallel_size':2,'tensor_parallel_size':4,"
         "'nnodes':2,'master_port':1234}}}",
         "union", 1, 8, 4, 1, 8, 1, 2},
        /* expert parallel: ep = world */
        {"{'motor_deploy_config':{'p_pod_npu_num':16},'motor_engine_prefill_config':{"
         "'dispatch_profile':'handoff','engine_config':{'data_parallel_size':4,"
         "'tensor_parallel_size':2,'enable_expert_parallel':true}}}",
         "prefill", 4, 8, 2, 8, 16, 4, 1},
        /* devices limit the endpoint count */
        {"{'motor_deploy_config':{'d_pod_npu_num':4},'motor_engine_decode_config':{"
         "'dispatch_profile':'trigger','engine_config':{'dp_size':8,'tp_size':2}}}",
         "decode", 8, 16, 2, 1, 4, 2, 1},
        /* single-endpoint mode */
        {"{'motor_nodemanger_config':{'basic_config':{'enable_multi_endpoints':false}},"
         "'motor_engine_union_config':{'engine_config':{'data_parallel_size':4}}}",
         "union", 4, 4, 1, 1, 4, 1, 1},
        /* explicit device_num wins, ep_size given */
        {"{'motor_nodemanger_config':{'basic_config':{'device_num':3}},'motor_deploy_config':{"
         "'hybrid_pod_npu_num':16},'motor_engine_union_config':{'engine_config':{"
         "'data_parallel_size':4,'ep_size':2}}}",
         "union", 4, 4, 1, 2, 3, 3, 1},
        /* no engine section: the NM block's own parallel_config and nnodes */
        {"{'motor_nodemanger_config':{'basic_config':{'parallel_config':{'dp_size':2,"
         "'tp_size':2,'cp_size':9},'nnodes':1,'device_num':4}}}",
         "union", 2, 4, 2, 1, 4, 2, 1},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors errs;
        struct nm_config *c = from_text(cases[i].json, cases[i].role, NULL, &errs);
        if (!c)
            fail_msg("case %zu: %s", i, cfg_errors_text(&errs));
        const struct derive_case *w = &cases[i];
        int nn = w->nnodes;
        if (c->parallel.dp_size != w->dp || c->parallel.world_size != w->world ||
            c->parallel.local_world_size != w->local_world || c->parallel.ep_size != w->ep ||
            c->device_num != w->device_num || c->endpoint_num != w->endpoints || c->nnodes != nn)
            fail_msg("case %zu: dp %d world %d local %d ep %d devices %d endpoints %d nnodes %d", i,
                     c->parallel.dp_size, c->parallel.world_size, c->parallel.local_world_size,
                     c->parallel.ep_size, c->device_num, c->endpoint_num, c->nnodes);
        for (int k = 0; k < c->endpoint_num; k++)
            assert_int_equal(c->service_ports[k], 10000 + 2 * k);
        nm_config_free(c);
        cfg_errors_release(&errs);
    }
}

static void test_dispatch_capabilities(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        const char *role;
        const char *cap; /* NULL = none */
    } cases[] = {
        {"{'motor_engine_prefill_config':{'engine_config':{'kv_transfer_config':{"
         "'kv_connector':'NixlConnector'}}}}",
         "prefill", "prefill_handoff_decode"},
        {"{'motor_engine_prefill_config':{'engine_config':{'kv_transfer_config':{"
         "'kv_connector':'MooncakeHybridConnector'}}}}",
         "prefill", "prefill_handoff_decode"},
        {"{'motor_engine_decode_config':{'engine_config':{'kv-transfer-config':"
         "'{\\'kv_connector\\':\\'MooncakeLayerwiseConnector\\'}'}}}",
         "decode", "concurrent_engine_sync"},
        {"{'motor_engine_decode_config':{'dispatch_profile':'handoff','engine_config':{"
         "'kv_transfer_config':{'kv_connector':'MooncakeLayerwiseConnector'}}}}",
         "decode", "prefill_handoff_decode"},
        {"{'motor_engine_prefill_config':{'engine_type':'sglang','engine_config':{}}}", "prefill",
         "concurrent_engine_sync"},
        {"{'motor_engine_prefill_config':{'engine_type':'sim','engine_config':{"
         "'kv_transfer_config':{'kv_connector':'MooncakeConnectorV1'}}}}",
         "prefill", "prefill_handoff_decode"},
        {"{'motor_engine_union_config':{'engine_config':{}}}", "union", NULL},
        {"{'motor_engine_prefill_config':{'engine_type':'cmd','engine_command':['x'],"
         "'engine_config':{}}}",
         "prefill", NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors errs;
        /* the JSON-string case needs real double quotes inside a string */
        char *text = xstrdup(cases[i].json);
        struct nm_config *c;
        if (strstr(text, "\\'")) {
            /* build it by hand: J() would turn the escaped quotes into plain ones */
            json_t *root = json_pack("{s:{s:{s:s}}}", "motor_engine_decode_config", "engine_config",
                                     "kv-transfer-config",
                                     "{\"kv_connector\":\"MooncakeLayerwiseConnector\"}");
            static const char *none[] = {NULL};
            struct nm_config_opts o = {
                .role = cases[i].role, .env = nm_env_from_array, .env_ud = (void *)none};
            cfg_errors_init(&errs, "");
            c = nm_config_from_json(root, &o, &errs);
            json_decref(root);
        } else {
            c = from_text(text, cases[i].role, NULL, &errs);
        }
        free(text);
        if (!c)
            fail_msg("case %zu: %s", i, cfg_errors_text(&errs));
        if (cases[i].cap) {
            assert_int_equal(c->dispatch_capabilities.n, 1);
            assert_string_equal(c->dispatch_capabilities.items[0], cases[i].cap);
        } else {
            assert_int_equal(c->dispatch_capabilities.n, 0);
        }
        nm_config_free(c);
        cfg_errors_release(&errs);
    }
}

static void test_sglang_bootstrap(void **state)
{
    (void)state;
    struct cfg_errors errs;
    struct nm_config *c = from_text(
        "{'motor_engine_prefill_config':{'engine_type':'sglang','engine_config':{"
        "'model-path':'/w','tp-size':2,'dp-size':1,'disaggregation_bootstrap_port':9100}}}",
        "prefill", NULL, &errs);
    assert_non_null(c);
    assert_int_equal(c->engine_type, NM_ENGINE_SGLANG);
    assert_int_equal(c->bootstrap_port, 9100);
    assert_int_equal(c->parallel.tp_size, 2);
    assert_string_equal(c->model_name, "/w");
    assert_false(c->ft_capability.scale_down_supported);
    nm_config_free(c);
    cfg_errors_release(&errs);
}

static void test_single_container(void **state)
{
    (void)state;
    static const char *cfg =
        "{'motor_deploy_config':{'deploy_mode':'single_container','p_instances_num':2},"
        "'motor_engine_prefill_config':{'motor_nodemanger_config':{'api_config':"
        "{'node_manager_port':3026}},'engine_config':{'data_parallel_size':2,"
        "'tensor_parallel_size':2,'kv_transfer_config':{'kv_connector':'MooncakeConnectorV1',"
        "'kv_port':'30001','kv_connector_extra_config':{'lookup_rpc_port':7000}}}},"
        "'motor_engine_decode_config':{'motor_nodemanger_config':{'api_config':"
        "{'node_manager_port':4026}},'engine_config':{'data_parallel_size':1,"
        "'tensor_parallel_size':4,'kv_transfer_config':{'kv_connector':'MooncakeConnectorV1',"
        "'kv_port':30001}}}}";
    struct cfg_errors errs;
    const char *env1[] = {"INDEX=1", NULL};
    struct nm_config *p = from_text(cfg, "prefill", env1, &errs);
    if (!p)
        fail_msg("%s", cfg_errors_text(&errs));
    cfg_errors_release(&errs);
    assert_true(p->sc.enabled);
    assert_int_equal(p->sc.global_index, 1);
    assert_int_equal(p->node_manager_port, 3027);
    assert_int_equal(p->base_port, 10004);    /* + 1 * 2 * dp 2 */
    assert_int_equal(p->sc.device_offset, 4); /* 1 * world 4 */
    assert_int_equal(p->device_num, 4);       /* world size */
    assert_int_equal(p->endpoint_num, 2);
    assert_int_equal(p->sc.kv_port, 30005);
    assert_int_equal(p->sc.lookup_rpc_port, 7001);
    assert_int_equal(p->dp_rpc_port, 9001);
    assert_int_equal(p->service_ports[1], 10006);
    nm_config_free(p);

    const char *env0[] = {"INDEX=0", NULL};
    struct nm_config *d = from_text(cfg, "decode", env0, &errs);
    if (!d)
        fail_msg("%s", cfg_errors_text(&errs));
    cfg_errors_release(&errs);
    assert_int_equal(d->sc.global_index, 2); /* after the 2 prefill instances */
    assert_int_equal(d->node_manager_port, 4028);
    assert_int_equal(d->base_port, 10004); /* 2 * 2 * dp 1 */
    assert_int_equal(d->sc.device_offset, 8);
    assert_int_equal(d->sc.kv_port, 30009);
    assert_int_equal(d->sc.lookup_rpc_port, 0);
    nm_config_free(d);

    /* without INDEX: no offsets, a warning */
    struct nm_config *n = from_text(cfg, "prefill", NULL, &errs);
    assert_non_null(n);
    cfg_errors_release(&errs);
    assert_false(n->sc.enabled);
    assert_int_equal(n->node_manager_port, 3026);
    assert_int_equal(n->warnings.n, 1);
    assert_non_null(strstr(n->warnings.items[0], "INDEX"));
    nm_config_free(n);
}

static void test_kv_store_and_health(void **state)
{
    (void)state;
    struct cfg_errors errs;
    const char *env[] = {"KVS_MASTER_SERVICE=kvs.svc", "KV_CACHE_STORE_PORT=50100",
                         "MMC_LOCAL_SERVICE_MODE=standalone", NULL};
    struct nm_config *c = from_text(
        "{'kv_cache_store_config':{'mode':'weird','global_segment_size':'1GB',"
        "'local_buffer_size':1024,'local_service_command':['kvd','--port','1']},"
        "'motor_engine_union_config':{'health_check_config':{'enable_virtual_inference':true,"
        "'npu_usage_threshold':50,'virtual_inference_timeout':2.5},'engine_config':{}}}",
        "union", env, &errs);
    if (!c)
        fail_msg("%s", cfg_errors_text(&errs));
    assert_true(c->kv.enabled);
    assert_int_equal(c->kv.backend, NM_KV_MEMCACHE);
    assert_int_equal(c->kv.mode, NM_KV_COMBINED); /* invalid mode => combined + warning */
    assert_int_equal(c->warnings.n, 1);
    assert_string_equal(c->kv.service, "kvs.svc");
    assert_int_equal(c->kv.port, 50100);
    assert_string_equal(c->kv.local_service_mode, "standalone");
    assert_string_equal(c->kv.global_segment_size, "1GB");
    assert_string_equal(c->kv.local_buffer_size, "1024");
    assert_int_equal(c->kv.local_service_command.n, 3);
    assert_true(c->health.enable_virtual_inference);
    assert_int_equal(c->health.npu_usage_threshold, 50);
    assert_true(c->health.virtual_inference_timeout == 2.5);
    nm_config_free(c);
    cfg_errors_release(&errs);

    /* KV_STORE_BACKEND alone enables it; separated mode */
    const char *env2[] = {"KV_STORE_BACKEND=mooncake", NULL};
    c = from_text("{'kv_cache_store_config':{'mode':'separated'}}", "union", env2, &errs);
    assert_non_null(c);
    assert_int_equal(c->kv.backend, NM_KV_MOONCAKE);
    assert_int_equal(c->kv.mode, NM_KV_SEPARATED);
    nm_config_free(c);
    cfg_errors_release(&errs);
    c = from_text("{'motor_engine_union_config':{}}", "union", env2, &errs);
    assert_non_null(c);
    assert_true(c->kv.enabled);
    nm_config_free(c);
    cfg_errors_release(&errs);
}

static void test_motor_additions(void **state)
{
    (void)state;
    struct nm_config *c = must_load("nm_sim_local.json", "union", NULL);
    assert_int_equal(c->engine_type, NM_ENGINE_SIM);
    assert_int_equal(c->restart_policy, NM_RESTART_LOCAL);
    assert_true(c->restart_backoff_initial_sec == 0.5);
    assert_true(c->restart_backoff_max_sec == 8);
    assert_true(c->restart_reset_after_sec == 120);
    assert_int_equal(c->restart_start_limit, 4);
    assert_true(c->standalone);
    assert_string_equal(c->management_api_key, "s3cret");
    assert_string_equal(c->engine_log_dir, "/tmp/motor-engines");
    assert_int_equal(c->engine_log_rotation_bytes, 5 << 20);
    assert_int_equal(c->engine_log_rotation_count, 3);
    assert_true(c->stop_grace_seconds == 2.5);
    assert_int_equal(c->endpoint_num, 2); /* dp 2, no NPU count: both ranks here */
    assert_int_equal(c->controller_port, 18026);
    /* the key never appears in the effective config */
    json_t *j = nm_config_to_json(c);
    char *text = json_dumps(j, 0);
    assert_null(strstr(text, "s3cret"));
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(j, "motor"), "management_api_key")),
        "<redacted>");
    free(text);
    json_decref(j);
    nm_config_set_motor_bin(c, "/x/motor");
    assert_string_equal(c->motor_bin, "/x/motor");
    nm_config_free(c);

    /* key from a file, trailing newline trimmed */
    char dir[] = "/tmp/test_nm_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *kf = xasprintf("%s/key", dir);
    assert_int_equal(util_write_file_atomic(kf, "k3y\n", 4, 0600), 0);
    char *cfg = xasprintf("{'motor_nodemanger_config':{'management_api_key_file':'%s'}}", kf);
    struct cfg_errors errs;
    c = from_text(cfg, "union", NULL, &errs);
    if (!c)
        fail_msg("%s", cfg_errors_text(&errs));
    assert_string_equal(c->management_api_key, "k3y");
    assert_string_equal(c->management_api_key_file, kf);
    nm_config_free(c);
    cfg_errors_release(&errs);
    free(cfg);
    /* an empty key file is an error */
    assert_int_equal(util_write_file_atomic(kf, "\n", 1, 0600), 0);
    cfg = xasprintf("{'motor_nodemanger_config':{'management_api_key_file':'%s'}}", kf);
    c = from_text(cfg, "union", NULL, &errs);
    assert_null(c);
    char *want = xasprintf("management_api_key_file: %s: empty key or NUL characters\n", kf);
    assert_string_equal(cfg_errors_text(&errs), want);
    free(want);
    free(cfg);
    cfg_errors_release(&errs);
    unlink(kf);
    rmdir(dir);
    free(kf);

    /* backoff 0: restart at once (no 10 ms floor); negative is still rejected */
    c = from_text("{'motor_nodemanger_config':{'restart_policy':'local',"
                  "'restart_backoff_initial_sec':0,'restart_backoff_max_sec':0}}",
                  "union", NULL, &errs);
    if (!c)
        fail_msg("%s", cfg_errors_text(&errs));
    assert_true(c->restart_backoff_initial_sec == 0);
    assert_true(c->restart_backoff_max_sec == 0);
    nm_config_free(c);
    cfg_errors_release(&errs);
    c = from_text("{'motor_nodemanger_config':{'restart_backoff_initial_sec':-0.5}}", "union", NULL,
                  &errs);
    assert_null(c);
    assert_non_null(strstr(cfg_errors_text(&errs),
                           "restart_backoff_initial_sec: must be a number in [0, 3600]"));
    cfg_errors_release(&errs);
}

/* ---- validation: one rule at a time, exact messages --------------------------------- */

struct err_case {
    const char *json;
    const char *role;
    const char *env[3];
    const char *want;
};

static void test_validation_errors(void **state)
{
    (void)state;
    static const struct err_case cases[] = {
        {"{'motor_engine_union_config':{'motor_nodemanger_config':{'api_config':"
         "{'node_manager_port':0}}}}",
         "union",
         {NULL},
         "motor_engine_union_config.motor_nodemanger_config.api_config.node_manager_port: "
         "must be an integer in [1, 65535], got 0\n"},
        {"{'motor_nodemanager_config':{'api_config':{'node_manager_port':70000}}}",
         "union",
         {NULL},
         "motor_nodemanager_config.api_config.node_manager_port: must be an integer in "
         "[1, 65535], got 70000\n"},
        {"{'motor_nodemanger_config':{'api_config':{'pod_ip':''}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.api_config.pod_ip: must not be empty\n"},
        {"{'motor_nodemanger_config':{'fault_tolerance_config':"
         "{'engine_restart_wait_timeout_sec':30}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.fault_tolerance_config.engine_restart_wait_timeout_sec: must "
         "be a number in [60, 3600], got 30\n"},
        {"{'motor_nodemanger_config':{'fault_tolerance_config':"
         "{'engine_restart_wait_timeout_sec':3601}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.fault_tolerance_config.engine_restart_wait_timeout_sec: must "
         "be a number in [60, 3600], got 3601\n"},
        {"{'motor_nodemanger_config':{'fault_tolerance_config':{'engine_restart_freeze_sec':119}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.fault_tolerance_config.engine_restart_freeze_sec: must be a "
         "number in [120, 7200], got 119\n"},
        {"{'motor_nodemanger_config':{'fault_tolerance_config':{'engine_restart_freeze_sec':7200.5}"
         "}}",
         "union",
         {NULL},
         "motor_nodemanger_config.fault_tolerance_config.engine_restart_freeze_sec: must be a "
         "number in [120, 7200], got 7200.5\n"},
        {"{'motor_nodemanger_config':{'fault_tolerance_config':{'container_restart_managed':1}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.fault_tolerance_config.container_restart_managed: must be "
         "true or false, got 1\n"},
        {"{'motor_nodemanger_config':{'basic_config':{'heartbeat_interval_seconds':0}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.basic_config.heartbeat_interval_seconds: must be a number in "
         "[0.001, 3600], got 0\n"},
        {"{'motor_nodemanger_config':{'basic_config':{'job_name':7}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.basic_config.job_name: must be a string, got 7\n"},
        {"{'motor_nodemanger_config':{'logging_config':{'log_level':'LOUD'}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.logging_config.log_level: must be one of DEBUG, INFO, WARNING, "
         "ERROR, got \"LOUD\"\n"},
        {"{'motor_nodemanger_config':{'vllm_startup_acceleration_config':{'cache_root':'rel'}}}",
         "union",
         {NULL},
         "motor_nodemanger_config.vllm_startup_acceleration_config.cache_root: must be an "
         "absolute path, got \"rel\"\n"},
        {"{'motor_nodemanger_config':{'vllm_startup_acceleration_config':"
         "{'enable_startup_plan':true}},'motor_engine_union_config':{'engine_type':'sglang'}}",
         "union",
         {NULL},
         "vllm_startup_acceleration_config: requires engine_type \"vllm\"\n"},
        {"{'motor_container_snapshot_config':{'enable_snapshot':true},"
         "'motor_engine_union_config':{'engine_type':'sim'}}",
         "union",
         {NULL},
         "snapshot_config.enable_snapshot: requires engine_type \"vllm\"\n"},
        {"{'motor_nodemanger_config':{'restart_policy':'always'}}",
         "union",
         {NULL},
         "motor_nodemanger_config.restart_policy: must be one of \"controller\", \"local\", got "
         "\"always\"\n"},
        {"{'motor_nodemanger_config':{'restart_backoff_initial_sec':5,'restart_backoff_max_sec':2}"
         "}",
         "union",
         {NULL},
         "restart_backoff_max_sec: must be >= restart_backoff_initial_sec (5), got 2\n"},
        {"{'motor_nodemanger_config':{'management_api_key':'a','management_api_key_file':'/k'}}",
         "union",
         {NULL},
         "management_api_key_file: set either management_api_key or management_api_key_file, "
         "not both\n"},
        {"{'motor_nodemanger_config':{'management_api_key_file':'/nonexistent/key'}}",
         "union",
         {NULL},
         "management_api_key_file: /nonexistent/key: cannot read: No such file or directory\n"},
        {"{'motor_nodemanger_config':{'management_api_key':''}}",
         "union",
         {NULL},
         "motor_nodemanger_config.management_api_key: must not be empty (omit it to disable the "
         "key)\n"},
        {"{'motor_nodemanger_config':{'stop_grace_seconds':-1}}",
         "union",
         {NULL},
         "motor_nodemanger_config.stop_grace_seconds: must be a number in [0, 3600], got -1\n"},
        {"{'motor_engine_union_config':{'engine_type':'tgi'}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_type: must be one of \"vllm\", \"sglang\", \"sim\", "
         "\"cmd\", got \"tgi\"\n"},
        {"{'motor_engine_union_config':{'dispatch_profile':'x'}}",
         "union",
         {NULL},
         "motor_engine_union_config.dispatch_profile: must be one of \"handoff\", \"trigger\", "
         "got \"x\"\n"},
        {"{'motor_engine_union_config':{'health_check_config':{'startup_timeout':true}}}",
         "union",
         {NULL},
         "motor_engine_union_config.health_check_config.startup_timeout: must be an integer in "
         "[1, 604800], got true\n"},
        {"{'motor_engine_union_config':{'health_check_config':{'health_collector_timeout':1.5}}}",
         "union",
         {NULL},
         "motor_engine_union_config.health_check_config.health_collector_timeout: must be an "
         "integer in [1, 3600], got 1.5\n"},
        {"{'motor_engine_union_config':{'health_check_config':{'virtual_inference_timeout':0}}}",
         "union",
         {NULL},
         "motor_engine_union_config.health_check_config.virtual_inference_timeout: must be a "
         "number in [0.001, 3600], got 0\n"},
        {"{'motor_engine_union_config':{'engine_config':{'tensor_parallel_size':0}}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_config.tensor_parallel_size: must be an integer in "
         "[1, 65536], got 0\n"},
        {"{'motor_engine_union_config':{'engine_config':{'pipeline_parallel_size':3,'nnodes':2}}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_config.nnodes: prefill_context_parallel_size * "
         "pipeline_parallel_size (3) must be divisible by nnodes (2)\n"},
        {"{'motor_engine_union_config':{'engine_config':{'kv_transfer_config':'[1]'}}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_config.kv_transfer_config: must be an object or a "
         "JSON object string (not an object)\n"},
        {"{'motor_engine_union_config':{'engine_config':{'data_parallel_master_port':0}}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_config.data_parallel_master_port: must be an integer "
         "in [1, 65535], got 0\n"},
        {"{'motor_engine_union_config':{'engine_config':{'eplb_config':{"
         "'num_redundant_experts':-2}}}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_config.eplb_config.num_redundant_experts: must be an "
         "integer in [0, 2147483647], got -2\n"},
        {"{'motor_deploy_config':{'hybrid_pod_npu_num':2},'motor_engine_union_config':"
         "{'engine_config':{'tensor_parallel_size':4}}}",
         "union",
         {NULL},
         "basic_config.device_num: 2 devices cannot hold one engine of local world size 4\n"},
        {"{'motor_nodemanger_config':{'endpoint_config':{'base_port':65535}},"
         "'motor_engine_union_config':{'engine_config':{'data_parallel_size':2}}}",
         "union",
         {NULL},
         "endpoint_config.base_port: service port 65537 of endpoint 1 is outside 1-65535 (base "
         "65535 + 2*1)\n"},
        {"{'motor_engine_union_config':{'engine_type':'cmd'}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_command: required (a non-empty array of strings) when "
         "engine_type is \"cmd\"\n"},
        {"{'motor_engine_union_config':{'engine_type':'cmd','engine_command':['run','{gpu}']}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_command[1]: unknown placeholder {gpu} (known: {host} "
         "{port} {dp_rank} {dp_size} {node_rank} {master_addr} {instance_id} {role} {model})\n"},
        {"{'motor_engine_union_config':{'engine_type':'cmd','engine_command':['--p={port']}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_command[0]: unterminated '{' (known: {host} {port} "
         "{dp_rank} {dp_size} {node_rank} {master_addr} {instance_id} {role} {model})\n"},
        {"{'motor_engine_union_config':{'engine_type':'cmd','engine_command':[3]}}",
         "union",
         {NULL},
         "motor_engine_union_config.engine_command[0]: must be a string without NUL "
         "characters\n"},
        {"{'motor_engine_prefill_config':{'engine_config':{'kv_transfer_config':"
         "{'kv_connector':'SomeConnector'}}}}",
         "prefill",
         {NULL},
         "motor_engine_prefill_config.engine_config.kv_transfer_config.kv_connector: a prefill "
         "role needs a known KV connector (MooncakeConnectorV1, MooncakeHybridConnector, "
         "NixlConnector, MooncakeLayerwiseConnector, or a MultiConnector whose connectors[0] is "
         "one of them) or dispatch_profile \"handoff\"/\"trigger\"\n"},
        {"{'motor_engine_encode_config':{'engine_type':'sglang'}}",
         "encode",
         {NULL},
         "motor_engine_encode_config.engine_type: sglang does not support the encode role\n"},
        {"{'motor_controller_config':{'api_config':{'controller_api_port':0}}}",
         "union",
         {NULL},
         "motor_controller_config.api_config.controller_api_port: must be an integer in "
         "[1, 65535], got 0\n"},
        {"{'motor_controller_config':{'fault_tolerance_config':{'enable_dp_scale_down':'yes'}}}",
         "union",
         {NULL},
         "motor_controller_config.fault_tolerance_config.enable_dp_scale_down: must be true or "
         "false, got \"yes\"\n"},
        {"{'kv_cache_store_config':{'backend':'redis'}}",
         "union",
         {NULL},
         "kv_cache_store_config.backend: must be one of \"memcache\", \"mooncake\", got "
         "\"redis\"\n"},
        {"{}",
         "union",
         {"KV_CACHE_STORE_PORT=0", NULL},
         "$KV_CACHE_STORE_PORT: must be a port 1-65535, got \"0\"\n"},
        {"{}",
         "union",
         {"KV_STORE_BACKEND=redis", NULL},
         "$KV_STORE_BACKEND: must be \"memcache\" or \"mooncake\", got \"redis\"\n"},
        {"{'motor_deploy_config':{'deploy_mode':'single_container'}}",
         "union",
         {"INDEX=x", NULL},
         "$INDEX: must be an integer in [0, 4095], got \"x\"\n"},
        {"{'motor_deploy_config':5}",
         "union",
         {NULL},
         "motor_deploy_config: must be an object, got 5\n"},
        {"{'motor_engine_union_config':[]}",
         "union",
         {NULL},
         "motor_engine_union_config: must be an object, got an array\n"},
        {"{}",
         "leader",
         {NULL},
         "$ROLE: must be one of encode, prefill, decode, union, both; got \"leader\"\n"},
        {"{}", NULL, {NULL}, "$ROLE: not set (one of encode, prefill, decode, union, both)\n"},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        struct cfg_errors errs;
        struct nm_config *c =
            from_text(cases[i].json, cases[i].role, (const char **)cases[i].env, &errs);
        if (c)
            fail_msg("case %zu loaded, want error %s", i, cases[i].want);
        if (strcmp(cfg_errors_text(&errs), cases[i].want) != 0)
            fail_msg("case %zu:\n  got:  %s  want: %s", i, cfg_errors_text(&errs), cases[i].want);
        assert_int_equal(cfg_errors_count(&errs), 1);
        cfg_errors_release(&errs);
    }
}

static void test_errors_collected_together(void **state)
{
    (void)state;
    struct cfg_errors errs;
    struct nm_config *c = load_fixture("nm_invalid.json", "decode", NULL, &errs);
    assert_null(c);
    assert_string_equal(
        cfg_errors_text(&errs),
        "motor_nodemanger_config.api_config.node_manager_port: must be an integer in [1, 65535], "
        "got 0\n"
        "motor_nodemanger_config.fault_tolerance_config.engine_restart_wait_timeout_sec: must be "
        "a number in [60, 3600], got 30\n"
        "motor_nodemanger_config.fault_tolerance_config.engine_restart_freeze_sec: must be a "
        "number in [120, 7200], got 9000\n"
        "motor_engine_decode_config.engine_config.tensor_parallel_size: must be an integer in "
        "[1, 65536], got \"2\"\n"
        "motor_engine_decode_config.engine_config.kv_transfer_config.kv_connector: a decode role "
        "needs a known KV connector (MooncakeConnectorV1, MooncakeHybridConnector, "
        "NixlConnector, MooncakeLayerwiseConnector, or a MultiConnector whose connectors[0] is "
        "one of them) or dispatch_profile \"handoff\"/\"trigger\"\n"
        "motor_engine_decode_config.health_check_config.startup_timeout: must be an integer in "
        "[1, 604800], got true\n");
    assert_int_equal(cfg_errors_count(&errs), 6);
    cfg_errors_release(&errs);

    /* the caller's prefix is kept in front of every path, and restored afterwards */
    json_t *root = J("{'motor_nodemanger_config':{'api_config':{'node_manager_port':0}}}");
    struct nm_config_opts o = {
        .role = "union", .env = nm_env_from_array, .env_ud = (void *)(const char *[]){NULL}};
    cfg_errors_init(&errs, "file.json");
    assert_null(nm_config_from_json(root, &o, &errs));
    assert_string_equal(cfg_errors_text(&errs),
                        "file.json.motor_nodemanger_config.api_config.node_manager_port: must "
                        "be an integer in [1, 65535], got 0\n");
    assert_string_equal(errs.prefix, "file.json");
    cfg_errors_release(&errs);
    json_decref(root);
}

static void test_block_spellings(void **state)
{
    (void)state;
    struct cfg_errors errs;
    /* historic spelling at the top, correct spelling in the section: both apply */
    struct nm_config *c =
        from_text("{'motor_nodemanger_config':{'basic_config':{'heartbeat_interval_seconds':7}},"
                  "'motor_engine_union_config':{'motor_nodemanager_config':{'api_config':"
                  "{'node_manager_port':1234}}}}",
                  "union", NULL, &errs);
    assert_non_null(c);
    assert_true(c->heartbeat_interval_seconds == 7.0);
    assert_int_equal(c->node_manager_port, 1234);
    assert_int_equal(c->warnings.n, 0);
    nm_config_free(c);
    cfg_errors_release(&errs);
    /* both spellings in one place: the correct one wins, with a warning */
    c = from_text("{'motor_nodemanger_config':{'api_config':{'node_manager_port':1}},"
                  "'motor_nodemanager_config':{'api_config':{'node_manager_port':2}}}",
                  "union", NULL, &errs);
    assert_non_null(c);
    assert_int_equal(c->node_manager_port, 2);
    assert_int_equal(c->warnings.n, 1);
    assert_string_equal(c->warnings.items[0],
                        "the file has both motor_nodemanager_config and motor_nodemanger_config; "
                        "only motor_nodemanager_config is used");
    nm_config_free(c);
    cfg_errors_release(&errs);
    /* no block and no section: the whole file is the NM block */
    c = from_text("{'api_config':{'node_manager_port':3333},'basic_config':{'job_name':'bare'}}",
                  "union", NULL, &errs);
    assert_non_null(c);
    assert_int_equal(c->node_manager_port, 3333);
    assert_string_equal(c->job_name, "bare");
    assert_null(c->role_section);
    nm_config_free(c);
    cfg_errors_release(&errs);
}

/* ---- environment -------------------------------------------------------------------- */

static void test_env_precedence(void **state)
{
    (void)state;
    struct cfg_errors errs;
    /* env gives the defaults ... */
    const char *env[] = {"POD_IP=10.1.1.1",
                         "JOB_NAME=job-env",
                         "CONTROLLER_SERVICE=ctl.env",
                         "RANKTABLE_PATH=/tmp/rt.json",
                         "HCCL_PATH=/etc/hccl.json",
                         "POD_NAMESPACE=ns",
                         "VLLM_HOST_IP=10.9.9.9",
                         NULL};
    struct nm_config *c = from_text("{}", "union", env, &errs);
    assert_non_null(c);
    assert_string_equal(c->pod_ip, "10.1.1.1");
    assert_string_equal(c->bind_host, "10.1.1.1"); /* a configured pod_ip is the bind address */
    assert_false(c->pod_ip_detected);
    assert_string_equal(c->job_name, "job-env");
    assert_string_equal(c->controller_host, "ctl.env");
    assert_string_equal(c->ranktable_path, "/tmp/rt.json");
    assert_string_equal(c->hccl_path, "/etc/hccl.json");
    assert_true(c->ft.container_restart_managed);
    assert_true(c->ft.container_restart_managed_auto);
    assert_string_equal(nm_config_env(c, "VLLM_HOST_IP"), "10.9.9.9");
    assert_null(nm_config_env(c, "INDEX"));
    assert_null(nm_config_env(c, "HOME")); /* only the listed names are captured */
    nm_config_free(c);
    cfg_errors_release(&errs);

    /* ... and the file's values win over them */
    c = from_text("{'motor_nodemanger_config':{'api_config':{'pod_ip':'10.2.2.2'},"
                  "'basic_config':{'job_name':'job-file'},'fault_tolerance_config':"
                  "{'container_restart_managed':false}},'motor_controller_config':"
                  "{'api_config':{'controller_api_dns':'ctl.file'}}}",
                  "union", env, &errs);
    assert_non_null(c);
    assert_string_equal(c->pod_ip, "10.2.2.2");
    assert_string_equal(c->job_name, "job-file");
    assert_string_equal(c->controller_host, "ctl.file");
    assert_false(c->ft.container_restart_managed);
    assert_false(c->ft.container_restart_managed_auto);
    nm_config_free(c);
    cfg_errors_release(&errs);

    /* null in the file means "not set": the env value stays */
    c = from_text("{'motor_nodemanger_config':{'basic_config':{'job_name':null}}}", "union", env,
                  &errs);
    assert_non_null(c);
    assert_string_equal(c->job_name, "job-env");
    nm_config_free(c);
    cfg_errors_release(&errs);

    /* empty env values count as unset */
    const char *empty[] = {"POD_IP=", "JOB_NAME=", "KUBERNETES_SERVICE_HOST=", NULL};
    c = from_text("{'motor_controller_config':{'api_config':{'controller_api_dns':'127.0.0.1'}}}",
                  "union", empty, &errs);
    assert_non_null(c);
    /* pod_ip unset, a numeric Controller address: the source address of the route to it */
    assert_string_equal(c->pod_ip, "127.0.0.1");
    assert_string_equal(c->bind_host, "0.0.0.0");
    assert_true(c->pod_ip_detected);
    assert_null(c->job_name);
    assert_false(c->ft.container_restart_managed);
    nm_config_free(c);
    cfg_errors_release(&errs);

    /* ROLE from the env; an explicit role wins */
    const char *roles[] = {"ROLE=decode", NULL};
    c = from_text("{'motor_engine_decode_config':{'dispatch_profile':'handoff'}}", NULL, roles,
                  &errs);
    assert_non_null(c);
    assert_int_equal(c->role, WIRE_ROLE_DECODE);
    nm_config_free(c);
    cfg_errors_release(&errs);
    c = from_text("{}", "prefill", roles, &errs);
    assert_non_null(c);
    assert_int_equal(c->role, WIRE_ROLE_PREFILL);
    nm_config_free(c);
    cfg_errors_release(&errs);
}

static void test_config_path_resolution(void **state)
{
    (void)state;
    char *good = fixture("nm_defaults.json");
    char *other = fixture("nm_sim_local.json");
    char *user = xasprintf("USER_CONFIG_PATH=%s", good);
    char *conf = xasprintf("CONFIG_PATH=%s", other);
    struct cfg_errors errs;

    /* USER_CONFIG_PATH before CONFIG_PATH */
    const char *env1[] = {user, conf, NULL};
    struct nm_config_opts o = {.role = "union", .env = nm_env_from_array, .env_ud = env1};
    cfg_errors_init(&errs, "");
    struct nm_config *c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_string_equal(c->config_path, good);
    nm_config_free(c);
    /* CONFIG_PATH alone */
    const char *env2[] = {conf, NULL};
    o.env_ud = env2;
    c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_string_equal(c->config_path, other);
    nm_config_free(c);
    /* --config wins over both */
    o.env_ud = env1;
    o.config_path = other;
    c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_string_equal(c->config_path, other);
    nm_config_free(c);
    assert_int_equal(cfg_errors_count(&errs), 0);
    /* nothing at all */
    const char *env3[] = {NULL};
    o.env_ud = env3;
    o.config_path = NULL;
    assert_null(nm_config_load(&o, &errs));
    assert_string_equal(cfg_errors_text(&errs),
                        "no configuration file: pass --config PATH or set USER_CONFIG_PATH or "
                        "CONFIG_PATH\n");
    cfg_errors_release(&errs);
    /* a missing file */
    cfg_errors_init(&errs, "");
    o.config_path = "/nonexistent/user_config.json";
    assert_null(nm_config_load(&o, &errs));
    assert_string_equal(cfg_errors_text(&errs), "/nonexistent/user_config.json: cannot read: No "
                                                "such file or directory\n");
    cfg_errors_release(&errs);
    free(user);
    free(conf);
    free(good);
    free(other);
}

/* ---- reload and diff ---------------------------------------------------------------- */

static void test_reload(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_nm_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *path = xasprintf("%s/user_config.json", dir);
    const char *v1 = "{\"motor_nodemanger_config\":{\"basic_config\":"
                     "{\"heartbeat_interval_seconds\":3}}}";
    assert_int_equal(util_write_file_atomic(path, v1, strlen(v1), 0644), 0);
    char *cp = xasprintf("CONFIG_PATH=%s", path);
    const char *env[] = {cp, "ROLE=union", "POD_IP=10.3.3.3", NULL};
    struct nm_config_opts o = {.env = nm_env_from_array, .env_ud = env};
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *live = nm_config_load(&o, &errs);
    assert_non_null(live);

    /* identical reload: no difference */
    struct nm_config *same = nm_config_reload(live, &errs);
    assert_non_null(same);
    assert_null(nm_config_diff(live, same));
    nm_config_free(same);

    /* a changed file: new values, live untouched, the env snapshot reused */
    const char *v2 = "{\"motor_nodemanger_config\":{\"basic_config\":"
                     "{\"heartbeat_interval_seconds\":1},\"api_config\":"
                     "{\"node_manager_port\":2000}}}";
    assert_int_equal(util_write_file_atomic(path, v2, strlen(v2), 0644), 0);
    struct nm_config *next = nm_config_reload(live, &errs);
    assert_non_null(next);
    assert_true(next->heartbeat_interval_seconds == 1.0);
    assert_int_equal(next->node_manager_port, 2000);
    assert_string_equal(next->pod_ip, "10.3.3.3");
    assert_true(live->heartbeat_interval_seconds == 3.0);
    assert_int_equal(live->node_manager_port, 1026);
    char *d = nm_config_diff(live, next);
    assert_string_equal(d, "api_config,basic_config");
    free(d);
    /* of the two, only the port needs a restart (the table's live/restart class) */
    d = nm_config_restart_keys(live, next);
    assert_string_equal(d, "api_config.node_manager_port");
    free(d);
    assert_null(nm_config_restart_keys(live, live));
    nm_config_free(next);

    /* an invalid file: NULL with the reasons, live untouched */
    const char *v3 = "{\"motor_nodemanger_config\":{\"api_config\":{\"node_manager_port\":-5}}}";
    assert_int_equal(util_write_file_atomic(path, v3, strlen(v3), 0644), 0);
    assert_null(nm_config_reload(live, &errs));
    assert_string_equal(cfg_errors_text(&errs),
                        "motor_nodemanger_config.api_config.node_manager_port: must be an "
                        "integer in [1, 65535], got -5\n");
    cfg_errors_release(&errs);
    cfg_errors_init(&errs, "");
    assert_int_equal(util_write_file_atomic(path, "{", 1, 0644), 0);
    assert_null(nm_config_reload(live, &errs));
    assert_non_null(strstr(cfg_errors_text(&errs), "syntax error at line"));
    assert_int_equal(live->node_manager_port, 1026);
    cfg_errors_release(&errs);

    nm_config_free(live);
    unlink(path);
    rmdir(dir);
    free(cp);
    free(path);
}

/* ---- effective configuration and --check-config ------------------------------------- */

static void test_to_json(void **state)
{
    (void)state;
    struct nm_config *c = must_load("nm_vllm_pd.json", "prefill", NULL);
    json_t *j = nm_config_to_json(c);
    json_t *ep = json_object_get(j, "endpoint_config");
    json_t *want = json_pack("{s:i,s:i,s:[s,s],s:n}", "endpoint_num", 2, "base_port", 20000,
                             "service_ports", "20000", "20002", "bootstrap_port");
    assert_true(json_equal(ep, want));
    json_decref(want);
    json_t *b = json_object_get(j, "basic_config");
    assert_string_equal(json_string_value(json_object_get(b, "role")), "prefill");
    assert_string_equal(json_string_value(json_object_get(b, "engine_type")), "vllm");
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(b, "parallel_config"), "world_size")),
        4);
    assert_true(json_is_true(json_object_get(json_object_get(j, "fault_tolerance_config"),
                                             "enable_dp_scale_down_proxy")));
    assert_int_equal(json_array_size(json_object_get(j, "warnings")), 1);
    json_decref(j);
    nm_config_free(c);
}

/* Run nm_check_config_main with stdout/stderr captured into heap strings. */
static int run_check(int argc, char **argv, char **out, char **err)
{
    char dir[] = "/tmp/test_nm_check_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char *po = xasprintf("%s/out", dir), *pe = xasprintf("%s/err", dir);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(po, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int fe = open(pe, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = nm_check_config_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    close(fo);
    close(fe);
    size_t n;
    *out = util_read_file(po, 1 << 20, &n);
    *err = util_read_file(pe, 1 << 20, &n);
    unlink(po);
    unlink(pe);
    rmdir(dir);
    free(po);
    free(pe);
    return rc;
}

static void test_check_config_main(void **state)
{
    (void)state;
    char *good = fixture("nm_vllm_pd.json");
    char *bad = fixture("nm_invalid.json");
    char *out, *err;

    char *argv1[] = {"node-manager", "--check-config", "--config", good, "--role=prefill", NULL};
    assert_int_equal(run_check(5, argv1, &out, &err), 0);
    json_error_t jerr;
    json_t *j = json_loads(out, 0, &jerr);
    if (!j)
        fail_msg("not JSON: %s\n%s", jerr.text, out);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "api_config"), "node_manager_port")),
        1600);
    assert_string_equal(err, "");
    json_decref(j);
    free(out);
    free(err);

    char *argv2[] = {"node-manager", "--config=" /* joined below */, NULL, NULL};
    char *joined = xasprintf("--config=%s", bad);
    argv2[1] = joined;
    argv2[2] = "--role=decode";
    assert_int_equal(run_check(3, argv2, &out, &err), 1);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "invalid node manager configuration (6 errors):\n"));
    assert_non_null(strstr(err, "engine_restart_freeze_sec: must be a number in [120, 7200], got "
                                "9000\n"));
    free(out);
    free(err);
    free(joined);

    char *argv3[] = {"node-manager", "--bogus", NULL};
    assert_int_equal(run_check(2, argv3, &out, &err), 2);
    assert_non_null(strstr(err, "unknown argument: --bogus"));
    free(out);
    free(err);
    char *argv4[] = {"node-manager", "--config", NULL};
    assert_int_equal(run_check(2, argv4, &out, &err), 2);
    assert_non_null(strstr(err, "option --config needs a value"));
    free(out);
    free(err);
    free(good);
    free(bad);
}

/* ---- upstream compatibility --------------------------------------------------------- */

static char *upstream_dir(void)
{
    const char *env = getenv("MOTOR_UPSTREAM_EXAMPLES");
    if (env && *env)
        return xstrdup(env);
    return repo_path("../shared/spec/upstream-examples");
}

/* Every file with motor_* blocks at its top is a user config. */
static bool is_user_config(json_t *root)
{
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strncmp(key, "motor_", 6) == 0)
            return true;
    }
    return false;
}

static void test_upstream_user_configs(void **state)
{
    (void)state;
    char *dir = upstream_dir();
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr,
                "*** upstream examples folder not found: %s\n"
                "*** the upstream user_config.json compatibility check did NOT run "
                "(set MOTOR_UPSTREAM_EXAMPLES)\n",
                dir);
        free(dir);
        skip();
        return;
    }
    static const char *const roles[] = {"encode", "prefill", "decode", "union"};
    int files = 0, loads = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n < 5 || strcmp(de->d_name + n - 5, ".json") != 0)
            continue;
        char *path = xasprintf("%s/%s", dir, de->d_name);
        json_t *root = json_load_file(path, 0, NULL);
        if (!root || !is_user_config(root)) {
            json_decref(root);
            free(path);
            continue;
        }
        files++;
        bool any = false;
        for (size_t r = 0; r < ARRAY_LEN(roles); r++) {
            char *sec = xasprintf("motor_engine_%s_config", roles[r]);
            bool present = json_object_get(root, sec) != NULL;
            free(sec);
            /* a file without engine sections is loaded as union */
            if (!present && !(r == 3 && !any))
                continue;
            any = true;
            /* with and without a single-container index */
            static const char *envs[][2] = {{NULL, NULL}, {"INDEX=0", NULL}};
            for (size_t e = 0; e < ARRAY_LEN(envs); e++) {
                struct nm_config_opts o = {.config_path = path,
                                           .role = roles[r],
                                           .env = nm_env_from_array,
                                           .env_ud = envs[e],
                                           .motor_bin = "motor"};
                struct cfg_errors errs;
                cfg_errors_init(&errs, "");
                struct nm_config *c = nm_config_load(&o, &errs);
                if (!c)
                    fail_msg("%s role %s: %s", de->d_name, roles[r], cfg_errors_text(&errs));
                assert_true(c->endpoint_num >= 1);
                json_t *j = nm_config_to_json(c);
                assert_non_null(j);
                json_decref(j);
                nm_config_free(c);
                cfg_errors_release(&errs);
                loads++;
            }
        }
        json_decref(root);
        free(path);
    }
    closedir(d);
    free(dir);
    print_message("upstream: %d user configs, %d role loads\n", files, loads);
    /* the README promises at least these six samples */
    assert_true(files >= 6);
}

static void test_upstream_specifics(void **state)
{
    (void)state;
    char *dir = upstream_dir();
    struct stat st;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "*** upstream examples folder not found: %s (check did NOT run)\n", dir);
        free(dir);
        skip();
        return;
    }
    char *path = xasprintf("%s/sglang-user_config.json", dir);
    struct nm_config_opts o = {.config_path = path,
                               .role = "prefill",
                               .env = nm_env_from_array,
                               .env_ud = (void *)(const char *[]){NULL}};
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_int_equal(c->engine_type, NM_ENGINE_SGLANG);
    assert_int_equal(c->bootstrap_port, 9100);
    assert_int_equal(c->parallel.tp_size, 2);
    assert_int_equal(c->device_num, 2);
    assert_int_equal(c->endpoint_num, 1);
    assert_string_equal(c->dispatch_capabilities.items[0], "concurrent_engine_sync");
    assert_string_equal(c->hardware_type, "800I_A2");
    nm_config_free(c);
    free(path);

    path = xasprintf("%s/vllm-single_container-user_config.json", dir);
    o.config_path = path;
    o.role = "decode";
    o.env_ud = (void *)(const char *[]){"INDEX=0", NULL};
    c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_true(c->sc.enabled);
    assert_int_equal(c->node_manager_port, 4027); /* 4026 + (1 prefill instance + 0) */
    assert_int_equal(c->controller_port, 2026);
    assert_int_equal(c->sc.kv_port, 30002);
    nm_config_free(c);
    free(path);

    path = xasprintf("%s/test-user_config.json", dir);
    o.config_path = path;
    o.role = "both";
    o.env_ud = (void *)(const char *[]){NULL};
    c = nm_config_load(&o, &errs);
    assert_non_null(c);
    assert_true(c->heartbeat_interval_seconds == 1.0);
    nm_config_free(c);
    free(path);
    assert_int_equal(cfg_errors_count(&errs), 0);
    cfg_errors_release(&errs);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_vllm_prefill_derived),
        cmocka_unit_test(test_vllm_decode_derived),
        cmocka_unit_test(test_parallel_rules),
        cmocka_unit_test(test_dispatch_capabilities),
        cmocka_unit_test(test_sglang_bootstrap),
        cmocka_unit_test(test_single_container),
        cmocka_unit_test(test_kv_store_and_health),
        cmocka_unit_test(test_motor_additions),
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_errors_collected_together),
        cmocka_unit_test(test_block_spellings),
        cmocka_unit_test(test_env_precedence),
        cmocka_unit_test(test_config_path_resolution),
        cmocka_unit_test(test_reload),
        cmocka_unit_test(test_to_json),
        cmocka_unit_test(test_check_config_main),
        cmocka_unit_test(test_upstream_user_configs),
        cmocka_unit_test(test_upstream_specifics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
