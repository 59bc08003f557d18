/* engine_cmd: full argv and environment of every builder against spec §6.1–§6.3,
 * table-driven (vllm DP>1, nnodes=2 node 0 vs node 1, prefill/decode/union KV roles,
 * MultiConnector, sglang, sim, cmd), device sets with wrap-around, and the launch
 * context checks. Configs are inline JSON with single quotes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/util.h"
#include "nodemgr/engine_cmd.h"
#include "unit_helpers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct nm_config *cfg_of(const char *squoted, const char *role, const char **env)
{
    json_t *root = J(squoted);
    static const char *none[] = {"POD_IP=10.0.0.5", NULL};
    struct nm_config_opts o = {.role = role,
                               .env = nm_env_from_array,
                               .env_ud = env ? (void *)env : (void *)none,
                               .motor_bin = "/usr/local/bin/motor"};
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *c = nm_config_from_json(root, &o, &errs);
    if (!c)
        fail_msg("config: %s", cfg_errors_text(&errs));
    cfg_errors_release(&errs);
    json_decref(root);
    return c;
}

#define MAXV 64

struct cmd_case {
    const char *name;
    const char *config;
    const char *role;
    const char *env[4]; /* NM environment; NULL-first => POD_IP=10.0.0.5 only */
    /* launch */
    int64_t ep_id;
    const char *ip, *port;
    int index, node_rank;
    const char *master;
    int64_t instance_id;
    /* expectations */
    const char *argv[MAXV]; /* NULL-terminated */
    const char *envv[8];    /* exact extra environment, NULL-terminated */
    const char *err;        /* non-NULL: the build must fail with this message */
};

static void check_list(const char *what, const char *name, char **got, size_t n,
                       const char *const *want)
{
    size_t wn = 0;
    while (want[wn])
        wn++;
    bool same = n == wn && got[n] == NULL;
    for (size_t i = 0; same && i < n; i++)
        same = strcmp(got[i], want[i]) == 0;
    if (same)
        return;
    print_error("%s: %s differs\n", name, what);
    for (size_t i = 0; i < MOTOR_MAX(n, wn); i++)
        print_error("  [%zu] got %-50s want %s\n", i, i < n ? got[i] : "(none)",
                    i < wn ? want[i] : "(none)");
    fail();
}

static void run_cmd_case(const struct cmd_case *tc)
{
    const char **env = tc->env[0] ? (const char **)tc->env : NULL;
    struct nm_config *cfg = cfg_of(tc->config, tc->role, env);
    struct wire_endpoint ep = {
        .id = tc->ep_id, .ip = (char *)tc->ip, .business_port = (char *)tc->port};
    enum wire_role role;
    assert_int_equal(wire_role_from_str(tc->role, &role), 0);
    struct engine_launch l = {.role = role,
                              .instance_id = tc->instance_id,
                              .endpoint = &ep,
                              .endpoint_index = tc->index,
                              .node_rank = tc->node_rank,
                              .master_dp_ip = tc->master};
    struct engine_cmd cmd;
    struct wire_err err = {{0}};
    int rc = engine_cmd_build(cfg, &l, &cmd, &err);
    if (tc->err) {
        if (rc != -EINVAL || strcmp(err.msg, tc->err) != 0)
            fail_msg("%s: rc %d error \"%s\", want \"%s\"", tc->name, rc, err.msg, tc->err);
        assert_null(cmd.argv);
    } else {
        if (rc != 0)
            fail_msg("%s: %s", tc->name, err.msg);
        check_list("argv", tc->name, cmd.argv, cmd.argc, tc->argv);
        check_list("env", tc->name, cmd.env, cmd.envc, tc->envv);
        engine_cmd_release(&cmd);
    }
    nm_config_free(cfg);
}

/* ---- configs ------------------------------------------------------------------------ */

#define UNION_BASIC                                                                                \
    "{'motor_engine_union_config':{'engine_config':{'served_model_name':['qwen','alias'],"         \
    "'model':'/m/qwen','gpu_memory_utilization':0.9,'max-model-len':2048,'enforce-eager':true,"    \
    "'enable_expert_parallel':false,'trust_remote_code':null,'allowed_origins':[],"                \
    "'host':'0.0.0.0','compilation_config':{'cudagraph_mode':'FULL_DECODE_ONLY'},"                 \
    "'kv_transfer_config':{'kv_connector':'MooncakeConnectorV1','engine_id':'0'}}}}"

#define DP4                                                                                        \
    "{'motor_deploy_config':{'hybrid_pod_npu_num':8},'motor_engine_union_config':{"                \
    "'engine_config':{'model':'/m','data_parallel_size':4,'tensor_parallel_size':2,"               \
    "'disable_access_log_for_endpoints':'/metrics'}}}"

#define NNODES2                                                                                    \
    "{'motor_deploy_config':{'hybrid_pod_npu_num':2},'motor_engine_union_config':{"                \
    "'engine_config':{'model':'/m','nnodes':2,'master_port':29555,"                                \
    "'pipeline_parallel_size':2,'tensor_parallel_size':2,'headless':true}}}"

#define PD_FILE(p_kvt, d_kvt)                                                                      \
    "{'motor_deploy_config':{'p_pod_npu_num':4,'d_pod_npu_num':4},"                                \
    "'motor_engine_prefill_config':{'engine_config':{'model':'/m','data_parallel_size':2,"         \
    "'tensor_parallel_size':2,'kv_transfer_config':" p_kvt "}},"                                   \
    "'motor_engine_decode_config':{'engine_config':{'model':'/m','tensor_parallel_size':4,"        \
    "'kv_transfer_config':" d_kvt "}}}"

#define MOONCAKE                                                                                   \
    "{'kv_connector':'MooncakeConnectorV1','kv_role':'kv_both','kv_port':'30001',"                 \
    "'engine_id':'0','kv_connector_extra_config':{'prefill':{'keep':1}}}"
#define LAYERWISE "{'kv_connector':'MooncakeLayerwiseConnector'}"

#define SIZES_P "\"prefill\":{\"dp_size\":2,\"tp_size\":2,\"pp_size\":1}"
#define SIZES_D "\"decode\":{\"dp_size\":1,\"tp_size\":4,\"pp_size\":1}"

#define VLLM_ENV(devs)                                                                             \
    {                                                                                              \
        "ASCEND_RT_VISIBLE_DEVICES=" devs, "VLLM_HOST_IP=10.0.0.5", NULL                           \
    }

static const struct cmd_case vllm_cases[] = {
    {.name = "vllm union: flattening rules",
     .config = UNION_BASIC,
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.5",
     .port = "10000",
     .master = "10.0.0.5",
     .instance_id = 3,
     .argv = {"vllm",
              "serve",
              "--served-model-name",
              "qwen",
              "alias",
              "--model",
              "/m/qwen",
              "--gpu-memory-utilization",
              "0.9",
              "--max-model-len",
              "2048",
              "--enforce-eager",
              "--host",
              "10.0.0.5",
              "--compilation-config",
              "{\"cudagraph_mode\":\"FULL_DECODE_ONLY\"}",
              "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeConnectorV1\",\"engine_id\":\"0\"}",
              "--disable-access-log-for-endpoints",
              "/health,/metrics",
              "--port",
              "10000",
              NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm dp>1: DP flags, user access-log setting kept, device set by index",
     .config = DP4,
     .role = "union",
     .ep_id = 5,
     .ip = "10.0.0.6",
     .port = "10004",
     .index = 2,
     .master = "10.0.0.1",
     .instance_id = 1,
     .argv = {"vllm",
              "serve",
              "--model",
              "/m",
              "--data-parallel-size",
              "4",
              "--tensor-parallel-size",
              "2",
              "--disable-access-log-for-endpoints",
              "/metrics",
              "--host",
              "10.0.0.6",
              "--port",
              "10004",
              "--data-parallel-address",
              "10.0.0.1",
              "--data-parallel-rpc-port",
              "9000",
              "--data-parallel-rank",
              "5",
              NULL},
     .envv = VLLM_ENV("4,5")},
    {.name = "vllm dp>1 without master_dp_ip: the endpoint is the master",
     .config = DP4,
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.6",
     .port = "10000",
     .index = 0,
     .master = NULL,
     .argv = {"vllm",
              "serve",
              "--model",
              "/m",
              "--data-parallel-size",
              "4",
              "--tensor-parallel-size",
              "2",
              "--disable-access-log-for-endpoints",
              "/metrics",
              "--host",
              "10.0.0.6",
              "--port",
              "10000",
              "--data-parallel-address",
              "10.0.0.6",
              "--data-parallel-rpc-port",
              "9000",
              "--data-parallel-rank",
              "0",
              NULL},
     .envv = VLLM_ENV("0,1")},
    {.name = "vllm nnodes=2 node 0: headless removed",
     .config = NNODES2,
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.5",
     .port = "10000",
     .node_rank = 0,
     .master = "10.0.0.5",
     .argv = {"vllm",
              "serve",
              "--model",
              "/m",
              "--nnodes",
              "2",
              "--master-port",
              "29555",
              "--pipeline-parallel-size",
              "2",
              "--tensor-parallel-size",
              "2",
              "--disable-access-log-for-endpoints",
              "/health,/metrics",
              "--host",
              "10.0.0.5",
              "--port",
              "10000",
              "--node-rank",
              "0",
              "--master-addr",
              "10.0.0.5",
              NULL},
     .envv = VLLM_ENV("0,1")},
    {.name = "vllm nnodes=2 node 1: headless, master address of node 0",
     .config = NNODES2,
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.7",
     .port = "10000",
     .node_rank = 1,
     .master = "10.0.0.5",
     .argv = {"vllm",
              "serve",
              "--model",
              "/m",
              "--nnodes",
              "2",
              "--master-port",
              "29555",
              "--pipeline-parallel-size",
              "2",
              "--tensor-parallel-size",
              "2",
              "--headless",
              "--disable-access-log-for-endpoints",
              "/health,/metrics",
              "--host",
              "10.0.0.7",
              "--port",
              "10000",
              "--node-rank",
              "1",
              "--master-addr",
              "10.0.0.5",
              NULL},
     .envv = VLLM_ENV("0,1")},
    {.name = "vllm nnodes=2 without master_port: no cross-node flags",
     .config = "{'motor_deploy_config':{'hybrid_pod_npu_num':2},'motor_engine_union_config':{"
               "'engine_config':{'model':'/m','nnodes':2,'pipeline_parallel_size':2}}}",
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.7",
     .port = "10000",
     .node_rank = 1,
     .master = "10.0.0.5",
     .argv = {"vllm", "serve", "--model", "/m", "--nnodes", "2", "--pipeline-parallel-size", "2",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "10.0.0.7",
              "--port", "10000", NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm prefill: kv_producer, engine id, both roles' sizes merged",
     .config = PD_FILE(MOONCAKE, MOONCAKE),
     .role = "prefill",
     .ep_id = 1,
     .ip = "10.0.0.5",
     .port = "10002",
     .index = 1,
     .master = "10.0.0.5",
     .instance_id = 7,
     .argv = {"vllm",
              "serve",
              "--model",
              "/m",
              "--data-parallel-size",
              "2",
              "--tensor-parallel-size",
              "2",
              "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_role\":\"kv_producer\","
              "\"kv_port\":\"30001\",\"engine_id\":\"7\",\"kv_connector_extra_config\":{"
              "\"prefill\":{\"keep\":1,\"dp_size\":2,\"tp_size\":2,\"pp_size\":1},\"decode\":"
              "{\"dp_size\":1,\"tp_size\":4,\"pp_size\":1}}}",
              "--disable-access-log-for-endpoints",
              "/health,/metrics",
              "--host",
              "10.0.0.5",
              "--port",
              "10002",
              "--data-parallel-address",
              "10.0.0.5",
              "--data-parallel-rpc-port",
              "9000",
              "--data-parallel-rank",
              "1",
              NULL},
     .envv = VLLM_ENV("2,3")},
    {.name = "vllm decode: kv_consumer",
     .config = PD_FILE(MOONCAKE, LAYERWISE),
     .role = "decode",
     .ep_id = 0,
     .ip = "10.0.0.8",
     .port = "10000",
     .master = "10.0.0.8",
     .instance_id = 12,
     .argv = {"vllm", "serve", "--model", "/m", "--tensor-parallel-size", "4",
              "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeLayerwiseConnector\",\"kv_role\":\"kv_consumer\","
              "\"engine_id\":\"12\",\"kv_connector_extra_config\":{" SIZES_P "," SIZES_D "}}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "10.0.0.8",
              "--port", "10000", NULL},
     .envv = VLLM_ENV("0,1,2,3")},
    {.name = "vllm decode without the prefill section: only its own sizes",
     .config = "{'motor_deploy_config':{'d_pod_npu_num':1},'motor_engine_decode_config':{"
               "'engine_config':{'model':'/m','kv_transfer_config':" LAYERWISE "}}}",
     .role = "decode",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .instance_id = 2,
     .argv = {"vllm", "serve", "--model", "/m", "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeLayerwiseConnector\",\"kv_role\":\"kv_consumer\","
              "\"engine_id\":\"2\",\"kv_connector_extra_config\":{\"decode\":{\"dp_size\":1,"
              "\"tp_size\":1,\"pp_size\":1}}}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "h", "--port",
              "10000", NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm prefill MultiConnector with MooncakeStoreConnectorV1",
     .config = "{'motor_deploy_config':{'p_pod_npu_num':1},'motor_engine_prefill_config':{"
               "'engine_config':{'model':'/m','kv_transfer_config':{'kv_connector':"
               "'MultiConnector','kv_connector_extra_config':{'connectors':[{'kv_connector':"
               "'MooncakeConnectorV1'},{'kv_connector':'MooncakeStoreConnectorV1',"
               "'kv_role':'kv_both'}]}}}}}",
     .role = "prefill",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .instance_id = 4,
     .argv = {"vllm", "serve", "--model", "/m", "--kv-transfer-config",
              "{\"kv_connector\":\"MultiConnector\",\"kv_connector_extra_config\":{"
              "\"connectors\":[{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_role\":"
              "\"kv_producer\",\"kv_connector_extra_config\":{\"prefill\":{\"dp_size\":1,"
              "\"tp_size\":1,\"pp_size\":1}}},{\"kv_connector\":\"MooncakeStoreConnectorV1\","
              "\"kv_role\":\"kv_both\",\"kv_connector_extra_config\":{\"mooncake_rpc_port\":"
              "\"4\"}}]},\"kv_role\":\"kv_producer\",\"engine_id\":\"4\"}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "h", "--port",
              "10000", NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm decode MultiConnector with UCMConnector and AscendStoreConnector",
     .config = "{'motor_deploy_config':{'d_pod_npu_num':1},'motor_engine_decode_config':{"
               "'engine_config':{'kv_transfer_config':{'kv_connector':'MultiConnector',"
               "'kv_connector_extra_config':{'connectors':[{'kv_connector':"
               "'MooncakeLayerwiseConnector','kv_connector_extra_config':{}},{'kv_connector':"
               "'UCMConnector','kv_role':'kv_consumer'}]}}}}}",
     .role = "decode",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .instance_id = 9,
     .argv = {"vllm", "serve", "--kv-transfer-config",
              "{\"kv_connector\":\"MultiConnector\",\"kv_connector_extra_config\":{"
              "\"connectors\":[{\"kv_connector\":\"MooncakeLayerwiseConnector\","
              "\"kv_connector_extra_config\":{\"decode\":{\"dp_size\":1,\"tp_size\":1,"
              "\"pp_size\":1}},\"kv_role\":\"kv_consumer\"},{\"kv_connector\":\"UCMConnector\","
              "\"kv_role\":\"kv_both\"}]},\"kv_role\":\"kv_consumer\",\"engine_id\":\"9\"}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "h", "--port",
              "10000", NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm MultiConnector AscendStoreConnector gets lookup_rpc_port",
     .config = "{'motor_deploy_config':{'p_pod_npu_num':1},'motor_engine_prefill_config':{"
               "'dispatch_profile':'handoff','engine_config':{'kv_transfer_config':{"
               "'kv_connector':'MultiConnector','kv_connector_extra_config':{'connectors':[{"
               "'kv_connector':'X'},{'kv_connector':'AscendStoreConnector'}]}}}}}",
     .role = "prefill",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .instance_id = 5,
     .argv = {"vllm", "serve", "--kv-transfer-config",
              "{\"kv_connector\":\"MultiConnector\",\"kv_connector_extra_config\":{"
              "\"connectors\":[{\"kv_connector\":\"X\",\"kv_role\":\"kv_producer\","
              "\"kv_connector_extra_config\":{\"prefill\":{\"dp_size\":1,\"tp_size\":1,"
              "\"pp_size\":1}}},{\"kv_connector\":\"AscendStoreConnector\","
              "\"kv_connector_extra_config\":{\"lookup_rpc_port\":\"5\"}}]},\"kv_role\":"
              "\"kv_producer\",\"engine_id\":\"5\"}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "h", "--port",
              "10000", NULL},
     .envv = VLLM_ENV("0")},
    {.name = "vllm MultiConnector with an unknown store connector",
     .config = "{'motor_engine_prefill_config':{'dispatch_profile':'handoff','engine_config':{"
               "'kv_transfer_config':{'kv_connector':'MultiConnector','kv_connector_extra_config':"
               "{'connectors':[{'kv_connector':'A'},{'kv_connector':'B'}]}}}}}",
     .role = "prefill",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .err = "kv_transfer_config.kv_connector_extra_config.connectors[1]: store connector \"B\" "
            "is not supported (UCMConnector, MooncakeStoreConnectorV1, AscendStoreConnector)"},
    {.name = "vllm MultiConnector with one connector",
     .config = "{'motor_engine_decode_config':{'dispatch_profile':'handoff','engine_config':{"
               "'kv_transfer_config':{'kv_connector':'MultiConnector','kv_connector_extra_config':"
               "{'connectors':[{'kv_connector':'A'}]}}}}}",
     .role = "decode",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .err = "kv_transfer_config.kv_connector_extra_config.connectors: MultiConnector needs at "
            "least 2 connector objects"},
    {.name = "vllm standalone UCMConnector on prefill",
     .config = "{'motor_engine_prefill_config':{'dispatch_profile':'trigger','engine_config':{"
               "'kv_transfer_config':{'kv_connector':'UCMConnector'}}}}",
     .role = "prefill",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .err = "kv_transfer_config: UCMConnector alone cannot serve the prefill role; use a "
            "MultiConnector with a transport connector first"},
    {.name = "vllm single container: kv_port and devices offset",
     .config = "{'motor_deploy_config':{'deploy_mode':'single_container','p_instances_num':1},"
               "'motor_engine_decode_config':{'engine_config':{'tensor_parallel_size':2,"
               "'kv_transfer_config':{'kv_connector':'MooncakeConnectorV1','kv_port':'30001'}}}}",
     .role = "decode",
     .env = {"INDEX=1", "POD_IP=10.0.0.5", "VLLM_HOST_IP=10.9.9.9", NULL},
     .ep_id = 0,
     .ip = "h",
     .port = "10008",
     .instance_id = 2,
     /* decode index 1 after 1 prefill instance: g = 2, device offset 4, kv port 30005 */
     .argv = {"vllm", "serve", "--tensor-parallel-size", "2", "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_port\":\"30005\",\"kv_role\":"
              "\"kv_consumer\",\"engine_id\":\"2\",\"kv_connector_extra_config\":{\"decode\":{"
              "\"dp_size\":1,\"tp_size\":2,\"pp_size\":1}}}",
              "--disable-access-log-for-endpoints", "/health,/metrics", "--host", "h", "--port",
              "10008", NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=4,5", NULL}},
};

static const struct cmd_case other_cases[] = {
    {.name = "sglang prefill single node",
     .config = "{'motor_deploy_config':{'p_pod_npu_num':2},'motor_engine_prefill_config':{"
               "'engine_type':'sglang','engine_config':{'served-model-name':'q','model-path':'/w',"
               "'tp-size':2,'disaggregation_bootstrap_port':9100,'enable_dp_attention':false,"
               "'trust_remote_code':true,'kv_transfer_config':{'x':1},'nnodes':1,"
               "'mem-fraction-static':0.9}}}",
     .role = "prefill",
     .ep_id = 0,
     .ip = "10.0.0.5",
     .port = "10000",
     .master = "10.0.0.5",
     .instance_id = 1,
     .argv = {"python3",
              "-m",
              "sglang.launch_server",
              "--served-model-name",
              "q",
              "--model-path",
              "/w",
              "--tp-size",
              "2",
              "--disaggregation-bootstrap-port",
              "9100",
              "--trust-remote-code",
              "--nnodes",
              "1",
              "--mem-fraction-static",
              "0.9",
              "--enable-metrics",
              "--host",
              "10.0.0.5",
              "--port",
              "10000",
              "--disaggregation-mode",
              "prefill",
              NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=0,1", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true",
              NULL}},
    {.name = "sglang decode nnodes=2 node 1, IPv6 master",
     .config = "{'motor_deploy_config':{'d_pod_npu_num':4},'motor_engine_decode_config':{"
               "'engine_type':'sglang','engine_config':{'model-path':'/w','tp-size':4,"
               "'pp-size':2,'nnodes':2,'data_parallel_rpc_port':5000}}}",
     .role = "decode",
     .ep_id = 0,
     .ip = "fd00::2",
     .port = "10000",
     .node_rank = 1,
     .master = "fd00::1",
     .argv = {"python3",
              "-m",
              "sglang.launch_server",
              "--model-path",
              "/w",
              "--tp-size",
              "4",
              "--pp-size",
              "2",
              "--nnodes",
              "2",
              "--data-parallel-rpc-port",
              "5000",
              "--enable-metrics",
              "--host",
              "fd00::2",
              "--port",
              "10000",
              "--dist-init-addr",
              "[fd00::1]:5000",
              "--node-rank",
              "1",
              "--disaggregation-mode",
              "decode",
              NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=0,1,2,3", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true",
              NULL}},
    {.name = "sglang union: no disaggregation mode (even when configured)",
     .config = "{'motor_engine_union_config':{'engine_type':'sglang','engine_config':{"
               "'model-path':'/w','disaggregation-mode':'prefill','nnodes':2}}}",
     .role = "union",
     .ep_id = 0,
     .ip = "10.0.0.5",
     .port = "10000",
     .node_rank = 0,
     .master = "10.0.0.4",
     .argv = {"python3", "-m", "sglang.launch_server", "--model-path", "/w", "--nnodes", "2",
              "--enable-metrics", "--host", "10.0.0.5", "--port", "10000", "--dist-init-addr",
              "10.0.0.4:9000", "--node-rank", "0", NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=0", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true",
              NULL}},
    {.name = "sim: motor engine-sim with the vllm flags",
     .config = "{'motor_engine_prefill_config':{'engine_type':'sim','engine_config':{"
               "'model':'sim','data_parallel_size':2,'kv_transfer_config':{'kv_connector':"
               "'MooncakeConnectorV1'}}}}",
     .role = "prefill",
     .ep_id = 1,
     .ip = "127.0.0.1",
     .port = "18002",
     .index = 1,
     .master = "127.0.0.1",
     .instance_id = 6,
     .argv = {"/usr/local/bin/motor",
              "engine-sim",
              "--model",
              "sim",
              "--data-parallel-size",
              "2",
              "--kv-transfer-config",
              "{\"kv_connector\":\"MooncakeConnectorV1\",\"kv_role\":\"kv_producer\","
              "\"engine_id\":\"6\",\"kv_connector_extra_config\":{\"prefill\":{\"dp_size\":2,"
              "\"tp_size\":1,\"pp_size\":1}}}",
              "--disable-access-log-for-endpoints",
              "/health,/metrics",
              "--host",
              "127.0.0.1",
              "--port",
              "18002",
              "--data-parallel-address",
              "127.0.0.1",
              "--data-parallel-rpc-port",
              "9000",
              "--data-parallel-rank",
              "1",
              NULL},
     .envv = VLLM_ENV("1")},
    {.name = "cmd: every placeholder, literal braces",
     .config = "{'motor_engine_decode_config':{'engine_type':'cmd','engine_command':["
               "'/opt/eng','--listen={host}:{port}','--rank','{dp_rank}/{dp_size}',"
               "'--node={node_rank}','--master={master_addr}','--id={instance_id}',"
               "'--role={role}','--model={model}','--json={{\\\"a\\\":1}}'],"
               "'engine_config':{'data_parallel_size':3,'model_path':'/w/m'}}}",
     .role = "decode",
     .env = {"POD_IP=10.0.0.5", "VLLM_HOST_IP=x", NULL},
     .ep_id = 2,
     .ip = "10.0.0.5",
     .port = "10004",
     .index = 2,
     .node_rank = 0,
     .master = "10.0.0.1",
     .instance_id = 8,
     .argv = {"/opt/eng", "--listen=10.0.0.5:10004", "--rank", "2/3", "--node=0",
              "--master=10.0.0.1", "--id=8", "--role=decode", "--model=/w/m", "--json={\"a\":1}",
              NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=2", NULL}},
    {.name = "cmd: master defaults to the endpoint, model to the model name",
     .config = "{'motor_engine_union_config':{'engine_type':'cmd','engine_command':["
               "'run','{master_addr}','{model}'],'engine_config':{'served_model_name':'nm'}}}",
     .role = "union",
     .env = {"POD_IP=10.0.0.5", "MOONCAKE_ASCEND_IPV6_EXPERIMENT=1", NULL},
     .ep_id = 0,
     .ip = "10.0.0.9",
     .port = "10000",
     .argv = {"run", "10.0.0.9", "nm", NULL},
     .envv = {"ASCEND_RT_VISIBLE_DEVICES=0", "MC_USE_IPV6=1", NULL}},
    {.name = "launch: invalid business port",
     .config = "{}",
     .role = "union",
     .ep_id = 0,
     .ip = "h",
     .port = "0",
     .err = "endpoint 0: invalid business port \"0\""},
    {.name = "launch: empty ip",
     .config = "{}",
     .role = "union",
     .ep_id = 3,
     .ip = "",
     .port = "10000",
     .err = "endpoint 3: empty ip"},
    {.name = "launch: DP rank out of range",
     .config = "{}",
     .role = "union",
     .ep_id = 70000,
     .ip = "h",
     .port = "10000",
     .err = "endpoint 70000: DP rank outside 0..65535"},
    {.name = "launch: negative instance id",
     .config = "{}",
     .role = "union",
     .ep_id = 0,
     .ip = "h",
     .port = "10000",
     .instance_id = -1,
     .err = "launch: instance id -1 out of range"},
};

static void test_vllm(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(vllm_cases); i++)
        run_cmd_case(&vllm_cases[i]);
}

static void test_other_backends(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(other_cases); i++)
        run_cmd_case(&other_cases[i]);
}

static void test_sglang_encode_rejected(void **state)
{
    (void)state;
    /* the config refuses it; a builder given such a launch refuses it too */
    struct nm_config *cfg =
        cfg_of("{'motor_engine_union_config':{'engine_type':'sglang'}}", "union", NULL);
    struct wire_endpoint ep = {.id = 0, .ip = "h", .business_port = "10000"};
    struct engine_launch l = {.role = WIRE_ROLE_ENCODE, .endpoint = &ep};
    struct engine_cmd cmd;
    struct wire_err err;
    assert_int_equal(engine_cmd_build(cfg, &l, &cmd, &err), -EINVAL);
    assert_string_equal(err.msg, "sglang does not support the encode role");
    l.endpoint = NULL;
    assert_int_equal(engine_cmd_build(cfg, &l, &cmd, &err), -EINVAL);
    assert_string_equal(err.msg, "launch: no endpoint");
    l.endpoint = &ep;
    l.role = (enum wire_role)7;
    assert_int_equal(engine_cmd_build(cfg, &l, &cmd, &err), -EINVAL);
    assert_string_equal(err.msg, "launch: invalid role 7");
    nm_config_free(cfg);
}

static void test_visible_devices(void **state)
{
    (void)state;
    /* 6 devices, local world 4: endpoint 1 starts at 4 and wraps */
    struct nm_config *cfg = cfg_of("{'motor_nodemanger_config':{'basic_config':{'device_num':6}},"
                                   "'motor_engine_union_config':{'engine_config':{"
                                   "'data_parallel_size':2,'tensor_parallel_size':4}}}",
                                   "union", NULL);
    static const char *const want[] = {"0,1,2,3", "4,5,0,1", "2,3,4,5", "0,1,2,3"};
    for (int i = 0; i < 4; i++) {
        char *d = engine_cmd_visible_devices(cfg, i);
        assert_string_equal(d, want[i]);
        free(d);
    }
    /* and through the builder, with an explicit parallel override and rpc port */
    struct wire_endpoint ep = {.id = 1, .ip = "h", .business_port = "10002"};
    struct wire_parallel_config par = cfg->parallel;
    par.dp_size = 3;
    struct engine_launch l = {.role = WIRE_ROLE_UNION,
                              .endpoint = &ep,
                              .endpoint_index = 1,
                              .parallel = &par,
                              .dp_rpc_port = 9555,
                              .master_dp_ip = "m"};
    struct engine_cmd cmd;
    struct wire_err err;
    assert_int_equal(engine_cmd_build(cfg, &l, &cmd, &err), 0);
    assert_string_equal(engine_cmd_getenv(&cmd, "ASCEND_RT_VISIBLE_DEVICES"), "4,5,0,1");
    assert_string_equal(engine_cmd_getenv(&cmd, "VLLM_HOST_IP"), "10.0.0.5");
    assert_null(engine_cmd_getenv(&cmd, "VLLM"));
    char *line = engine_cmd_render(&cmd);
    assert_non_null(strstr(line, "--data-parallel-rpc-port 9555 --data-parallel-rank 1"));
    free(line);
    engine_cmd_release(&cmd);
    engine_cmd_release(NULL);
    nm_config_free(cfg);

    /* single-endpoint mode: not set outside a single container ... */
    cfg = cfg_of("{'motor_nodemanger_config':{'basic_config':{'enable_multi_endpoints':false}}}",
                 "union", NULL);
    char *d = engine_cmd_visible_devices(cfg, 0);
    assert_string_equal(d, "");
    free(d);
    nm_config_free(cfg);
    /* ... and the container's slice inside one */
    const char *env[] = {"INDEX=1", NULL};
    cfg = cfg_of("{'motor_deploy_config':{'deploy_mode':'single_container'},"
                 "'motor_nodemanger_config':{'basic_config':{'enable_multi_endpoints':false}},"
                 "'motor_engine_union_config':{'engine_config':{'tensor_parallel_size':2}}}",
                 "union", env);
    d = engine_cmd_visible_devices(cfg, 0);
    assert_string_equal(d, "2,3");
    free(d);
    nm_config_free(cfg);
}

static void test_d2d_and_render(void **state)
{
    (void)state;
    /* built by hand: the template holds an apostrophe */
    json_t *root = json_pack("{s:{s:s,s:[s,s,s,s,s]}}", "motor_engine_union_config", "engine_type",
                             "cmd", "engine_command", "a b", "it's", "{host}", "$X", "plain");
    static const char *env[] = {"POD_IP=10.0.0.5", NULL};
    struct nm_config_opts o = {.role = "union", .env = nm_env_from_array, .env_ud = env};
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *cfg = nm_config_from_json(root, &o, &errs);
    assert_non_null(cfg);
    cfg_errors_release(&errs);
    json_decref(root);
    struct wire_endpoint ep = {.id = 1, .ip = "10.0.0.5", .business_port = "10000"};
    struct wire_strlist peers = {0};
    wire_strlist_push(&peers, "1:10.0.0.7");
    wire_strlist_push(&peers, "0:10.0.0.8");
    wire_strlist_push(&peers, "1:10.0.0.9");
    struct engine_launch l = {.role = WIRE_ROLE_UNION, .endpoint = &ep, .d2d_peer_ips = &peers};
    struct engine_cmd cmd;
    struct wire_err err;
    assert_int_equal(engine_cmd_build(cfg, &l, &cmd, &err), 0);
    assert_int_equal(cmd.d2d_peers.n, 2);
    assert_string_equal(cmd.d2d_peers.items[0], "10.0.0.7");
    assert_string_equal(cmd.d2d_peers.items[1], "10.0.0.9");
    char *line = engine_cmd_render(&cmd);
    assert_string_equal(line, "'a b' 'it'\\''s' 10.0.0.5 '$X' plain");
    free(line);
    engine_cmd_release(&cmd);
    wire_strlist_release(&peers);
    nm_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vllm),
        cmocka_unit_test(test_other_backends),
        cmocka_unit_test(test_sglang_encode_rejected),
        cmocka_unit_test(test_visible_devices),
        cmocka_unit_test(test_d2d_and_render),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
