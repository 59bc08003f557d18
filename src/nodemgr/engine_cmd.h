/* engine_cmd — pure builders of one engine process's argv and extra environment
 * (spec §6.1–§6.3). No I/O, no globals: give it the config and a launch context, get
 * heap arrays back. The daemon execs argv[0] (PATH lookup, as upstream's Popen) with
 * its own environment overlaid by env.
 *
 * Backends (nm_config.engine_type):
 *   vllm    `vllm serve <flags>` — §6.2 rules 1–7:
 *             1. every key of engine_config (normalized by nm_config) as a flag;
 *             2. disable_access_log_for_endpoints="/health,/metrics" unless set;
 *             3. (legacy model/parallel fields: engine_config already holds them);
 *             4. forced host = endpoint ip, port = business port;
 *             5. dp_size > 1: forced data_parallel_address = master_dp_ip,
 *                data_parallel_rpc_port = dp_rpc_port, data_parallel_rank = endpoint id;
 *             6. nnodes > 1 and master_port in engine_config: forced node_rank,
 *                master_addr = master_dp_ip; headless (bare flag) on node_rank != 0,
 *                removed on node 0;
 *             7. prefill/decode: kv_transfer_config.kv_role = kv_producer/kv_consumer,
 *                engine_id = "<instance id>", kv_connector_extra_config.{prefill,decode}
 *                get dp_size/tp_size/pp_size of those roles' sections (when the file
 *                has them); MultiConnector: >= 2 connectors, the top level gets kv_role
 *                and engine_id, connectors[0] (transport) gets kv_role and the size
 *                sub-objects (no engine_id), connectors[1] (store): UCMConnector =>
 *                kv_role "kv_both", MooncakeStoreConnectorV1 => its
 *                kv_connector_extra_config.mooncake_rpc_port = "<instance id>",
 *                AscendStoreConnector => kv_connector_extra_config.lookup_rpc_port =
 *                "<instance id>", any other => error; a standalone UCMConnector on P/D
 *                => error. union: passed through. Single container: kv_port =
 *                sc.kv_port.
 *             Not implemented (noted for later): rule 8 D2D netloader (the endpoint's
 *             peers are returned in d2d_peers), rule 9 snapshot, rule 10 startup
 *             acceleration overrides.
 *   sglang  `python3 -m sglang.launch_server <flags>` — §6.3: engine_config minus
 *           engine_type and kv_transfer_config, forced enable_metrics, host, port; if
 *           nnodes > 1: dist_init_addr = master_dp_ip:dp_rpc_port ([v6]:port) and
 *           node_rank; disaggregation_mode = prefill / decode (omitted for union).
 *           env SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true. encode is rejected.
 *   sim     `<motor_bin> engine-sim <the vllm flags>`.
 *   cmd     engine_command with placeholders substituted ({host} endpoint ip, {port}
 *           business port, {dp_rank} endpoint id, {dp_size}, {node_rank},
 *           {master_addr} master_dp_ip (endpoint ip when unset), {instance_id}, {role},
 *           {model} engine_config model|model_path, else the model name); an unknown
 *           placeholder is an error.
 *
 * Flag rendering: key "a_b" => "--a-b"; true => bare flag; false/null => omitted;
 * list => flag then each item (strings verbatim, numbers as text, objects as JSON;
 * an empty list is omitted); object => compact JSON; number => shortest text
 * ("0.9", 2048); string => verbatim. Key order follows engine_config, forced keys
 * replace in place or are appended.
 *
 * Extra environment (all backends):
 *   ASCEND_RT_VISIBLE_DEVICES — multi-endpoint mode: local_world_size consecutive ids
 *     starting at (endpoint_index * local_world_size) mod device_num, wrapping modulo
 *     device_num, plus sc.device_offset; single-endpoint mode in a single container:
 *     device_offset .. device_offset+device_num-1; otherwise not set.
 *   VLLM_HOST_IP=<pod_ip> unless the NM's environment has it (vllm, sim).
 *   MC_USE_IPV6=1 when MOONCAKE_ASCEND_IPV6_EXPERIMENT=1 and MC_USE_IPV6 is unset.
 *   SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true (sglang).
 *
 * Thread-safe (reads the config only). */
#ifndef MOTOR_ENGINE_CMD_H
#define MOTOR_ENGINE_CMD_H

#include "nodemgr/nm_config.h"
#include "wire/wire.h"

#include <stddef.h>

struct engine_launch {
    enum wire_role role;
    int64_t instance_id;                         /* >= 0 */
    const struct wire_endpoint *endpoint;        /* id (= DP rank), ip (host), business_port,
                                                    headless; required */
    int endpoint_index;                          /* index of the endpoint in this pod, >= 0 */
    int node_rank;                               /* >= 0 */
    const char *master_dp_ip;                    /* NULL => the endpoint's ip */
    const struct wire_strlist *d2d_peer_ips;     /* the start command's list, or NULL */
    const struct wire_parallel_config *parallel; /* NULL => cfg->parallel */
    int dp_rpc_port;                             /* 0 => cfg->dp_rpc_port */
};

struct engine_cmd {
    char **argv; /* NULL-terminated, argc entries */
    size_t argc;
    char **env; /* "NAME=value", NULL-terminated: overlay on the NM env */
    size_t envc;
    struct wire_strlist d2d_peers; /* this endpoint's D2D peer IPs (§6.1 step 2) */
};

/* Build the command of one endpoint. 0, or -EINVAL with err set (bad launch context:
 * role, instance id, ip, port, DP rank 0..65535; unsupported connector layout; sglang
 * encode; a bad cmd template). out is zeroed on error. */
int engine_cmd_build(const struct nm_config *cfg, const struct engine_launch *l,
                     struct engine_cmd *out, struct wire_err *err);
void engine_cmd_release(struct engine_cmd *c);

/* ASCEND_RT_VISIBLE_DEVICES value for endpoint_index ("4,5"), "" when not set by the
 * rule above. Heap string. */
char *engine_cmd_visible_devices(const struct nm_config *cfg, int endpoint_index);

/* One line for logs: argv joined by spaces, arguments with spaces or quotes in single
 * quotes. Heap string. */
char *engine_cmd_render(const struct engine_cmd *c);

/* Value of NAME in the extra environment, or NULL. */
const char *engine_cmd_getenv(const struct engine_cmd *c, const char *name);

#endif
