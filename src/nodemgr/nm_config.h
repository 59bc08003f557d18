/* nm_config — the node manager's configuration: upstream user_config.json as is, plus
 * the derived values (spec §3) and Motor's additions. Pure: no sockets, no processes,
 * no globals; the environment comes in through a lookup function.
 *
 * Every key is a row of the table in nm_config.c (common/cfgtab.h): type, range,
 * default, live-or-restart and doc there; defaults, parsing, the effective dump, the
 * reload diff and the key table of docs/node-manager.md come from it. The lists below
 * are the overview.
 *
 * Loading (nm_config_load):
 *  1. File: opts.config_path (--config), else $USER_CONFIG_PATH, else $CONFIG_PATH.
 *  2. Role: opts.role, else $ROLE; one of encode/prefill/decode/union ("both" = union).
 *     Required. The engine section is motor_engine_<role>_config ("union" for both).
 *  3. NM block: `motor_nodemanger_config` (historic spelling) or
 *     `motor_nodemanager_config`, first at the top level of the file, then inside the
 *     role's engine section; the section's values override the top level's, key by key
 *     (a key absent from the section keeps the top-level value). If neither exists
 *     anywhere, the whole file is read as the NM block. Unknown keys are ignored.
 *  4. Every key is type- and range-checked through common/cfg.h; all errors are
 *     collected into the caller's cfg_errors (one line each, named by full JSON path,
 *     e.g. "motor_engine_prefill_config.motor_nodemanger_config.api_config.
 *     node_manager_port: must be an integer in [1, 65535], got 0"; environment problems
 *     as "$INDEX: ..."). On any error the result is NULL.
 *
 * The keys (upstream §3.3 and §3.5, plus Motor's: restart_policy and its backoff,
 * standalone, management_api_key(_file), engine_log_*, stop_grace_seconds; in the engine
 * section engine_type "vllm" | "sglang" | "sim" | "cmd", dispatch_profile, engine_command;
 * kv_cache_store_config.local_service_command) with their types, ranges, defaults and
 * live/restart class are the table's rows; docs/node-manager.md shows them generated.
 * Rules no row holds:
 *   - a key of the NM block's basic_config that is derived (model_name, engine_type,
 *     parallel_config, nnodes) is used as given only when the role has no engine
 *     section; dispatch_capabilities and fault_tolerance_config.
 *     enable_dp_scale_down_proxy are derived and a user value is dropped with a warning;
 *   - fault_tolerance_config.enable_engine_relaunch defaults to the Controller's;
 *     container_restart_managed unset = true iff $KUBERNETES_SERVICE_HOST or
 *     $POD_NAMESPACE is set; enable_fault_tolerance is also on when the engine
 *     advertises FT;
 *   - motor_deploy_config.{hardware_type, tls_config.mgmt_tls_config} and
 *     motor_container_snapshot_config override the NM block's; snapshot and startup
 *     acceleration require vllm; restart_backoff_max_sec >= restart_backoff_initial_sec;
 *     management_api_key and management_api_key_file exclude each other (the file's
 *     content is read at load, trailing whitespace trimmed, non-empty);
 *   - engine_command (engine_type "cmd", required then): argv template with
 *     placeholders {host} {port} {dp_rank} {dp_size} {node_rank} {master_addr}
 *     {instance_id} {role} {model}; "{{" and "}}" are literal braces; an unknown
 *     placeholder is a config error. "sim" runs `<motor binary> engine-sim ...` with
 *     vllm's flags (nm_config_opts.motor_bin);
 *   - the KV-store service is on when kv_cache_store_config exists or $KV_STORE_BACKEND
 *     is set; $KV_STORE_BACKEND, $KV_CACHE_STORE_PORT, $MMC_LOCAL_SERVICE_MODE supply
 *     defaults (validated).
 *
 * Other blocks read: motor_controller_config (the Controller's address and FT switches),
 * motor_deploy_config (hardware_type, deploy_mode, *_pod_npu_num, p_instances_num,
 * tls_config), the engine section's health_check_config (§3.6), and the other roles'
 * engine sections (their parallel sizes feed kv_connector_extra_config).
 *
 * Derived values (§3.4), computed at load:
 *   parallel: dp = data_parallel_size|dp_size, tp = tensor_parallel_size|tp_size,
 *     pp = pipeline_parallel_size|pp_size, pcp = prefill_context_parallel_size|pcp_size
 *     (dash or underscore spellings), ep = ep_size or (enable_expert_parallel ? world :
 *     1), world = dp*pcp*tp*pp, local_world = pcp*tp*pp; if nnodes > 1 and pcp*pp > 1,
 *     pcp*pp must be divisible by nnodes and local_world = pcp*tp*pp / nnodes.
 *   device_num: basic_config.device_num if > 0, else single-container world size, else
 *     motor_deploy_config.{p,d,e,hybrid}_pod_npu_num for the role, else (Motor, no NPU
 *     count anywhere) dp * local_world so that the pod hosts every DP rank.
 *   endpoint_num: enable_multi_endpoints ? min(dp, device_num / local_world) (error when
 *     device_num < local_world) : 1; service_ports[i] = base_port + 2i (1..65535).
 *   bootstrap_port: SGLang's disaggregation_bootstrap_port (1..65535), else 0.
 *   dp_master_port = data_parallel_master_port [29500]; dp_rpc_port =
 *     data_parallel_rpc_port [9000] (+ single-container offset).
 *   dispatch_capabilities: dispatch_profile ("handoff" => prefill_handoff_decode,
 *     "trigger" => concurrent_engine_sync) wins; else sglang => concurrent_engine_sync;
 *     else vllm/sim by kv_transfer_config.kv_connector (MooncakeConnectorV1,
 *     MooncakeHybridConnector, NixlConnector => prefill_handoff_decode;
 *     MooncakeLayerwiseConnector => concurrent_engine_sync; MultiConnector => its
 *     connectors[0]). A prefill/decode vllm/sim role that resolves to nothing is an error.
 *     (decode_colocation is not derived: the spec does not say which connectors have it.)
 *   ft_capability: enabled = enable_fault_tolerance, scale_down_supported = (vllm|sim)
 *     && enabled, external_lb = data_parallel_external_lb, auto_recovery =
 *     fault_tolerance_config.auto_recovery, fused_mc2_enabled =
 *     additional_config.enable_fused_mc2, eplb_enabled = enable_eplb,
 *     num_redundant_experts = eplb_config.num_redundant_experts (>= 0). Sub-configs
 *     may be JSON strings.
 *   enable_dp_scale_down_proxy = Controller enable_fault_tolerance && enable_dp_scale_down.
 *   single container (deploy_mode "single_container" and $INDEX set): g = INDEX, or
 *     p_instances_num + INDEX for decode; node_manager_port += g; base_port +=
 *     g*2*dp; device_offset = g*world, device_num = world; kv_port =
 *     kv_transfer_config.kv_port + device_offset; lookup_rpc_port =
 *     kv_connector_extra_config.lookup_rpc_port + g (when present); dp_rpc_port += g.
 *     This is an approximation of upstream's per-role tables (§3.4 gives only the rules).
 *
 * Engine config keys are normalized to underscores ("enforce-eager" =>
 * "enforce_eager"; a later duplicate spelling wins) and the sub-configs
 * kv_transfer_config, additional_config, eplb_config, fault_tolerance_config and
 * compilation_config are parsed when given as JSON strings.
 *
 * Thread-safety: a loaded config is immutable; share it read-only between threads.
 * The daemon swaps whole configs on reload (nm_config_reload). */
#ifndef MOTOR_NM_CONFIG_H
#define MOTOR_NM_CONFIG_H

#include "common/cfg.h"
#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

enum nm_engine_type { NM_ENGINE_VLLM = 0, NM_ENGINE_SGLANG, NM_ENGINE_SIM, NM_ENGINE_CMD };
const char *nm_engine_type_str(enum nm_engine_type t);

enum nm_restart_policy { NM_RESTART_CONTROLLER = 0, NM_RESTART_LOCAL };
enum nm_kv_backend { NM_KV_MEMCACHE = 0, NM_KV_MOONCAKE };
enum nm_kv_mode { NM_KV_COMBINED = 0, NM_KV_SEPARATED };

/* Environment lookup: the value of name or NULL when unset. */
typedef const char *(*nm_env_fn)(void *ud, const char *name);
/* An nm_env_fn over a NULL-terminated array of "NAME=value" strings (ud), for tests
 * and for callers that build the environment themselves. */
const char *nm_env_from_array(void *ud, const char *name);

struct nm_config_opts {
    const char *config_path; /* --config PATH; NULL => $USER_CONFIG_PATH, $CONFIG_PATH */
    const char *role;        /* NULL => $ROLE */
    nm_env_fn env;           /* NULL => getenv */
    void *env_ud;
    const char *motor_bin; /* for engine_type "sim"; NULL => readlink(/proc/self/exe) */
};

struct nm_tls {
    bool enable_tls;
    char *ca_file, *cert_file, *key_file, *passwd_file, *crl_file;
    bool engine_tls; /* infer_tls_config only (Motor): engines serve TLS, default true */
};

struct nm_ft_config {
    bool enable_fault_tolerance; /* effective: NM switch OR engine advertises FT */
    double poll_interval_sec, poll_timeout_sec;
    int max_poll_failures, max_consecutive_404;
    double unsupported_reprobe_interval_sec;
    bool enable_engine_relaunch;
    double engine_restart_wait_timeout_sec; /* 60..3600 */
    double engine_restart_freeze_sec;       /* 120..7200 */
    bool container_restart_managed;         /* resolved */
    bool container_restart_managed_auto;    /* true when it came from the env rule */
    bool enable_dp_scale_down_proxy;        /* derived from the Controller block */
};

struct nm_single_container {
    bool enabled;
    int index;        /* $INDEX */
    int global_index; /* index, or p_instances_num + index for decode */
    int node_manager_port_offset, base_port_offset, device_offset, device_num;
    int kv_port;         /* 0 = not applicable */
    int lookup_rpc_port; /* 0 = not applicable */
    int dp_rpc_port;
};

struct nm_kv_store {
    bool enabled; /* section present or $KV_STORE_BACKEND set */
    enum nm_kv_backend backend;
    enum nm_kv_mode mode;
    char *service;            /* $KVS_MASTER_SERVICE; NULL = unset */
    int port;                 /* 50088 / $KV_CACHE_STORE_PORT */
    char *local_service_mode; /* "standalone" | "inprocess" */
    char *local_config_path;
    char *store_mode;                              /* "" | "embedded" | "standalone" */
    char *global_segment_size, *local_buffer_size; /* NULL = unset */
    int store_http_port;                           /* 0 = ephemeral */
    char *metadata_server, *protocol, *device_name;
    struct wire_strlist local_service_command; /* Motor: argv; empty = none */
};

struct nm_health {
    int health_collector_timeout;                /* s, >= 1 */
    int health_collector_timeout_retry_attempts; /* >= 1, total attempts */
    int startup_timeout;                         /* s, >= 1 */
    bool enable_virtual_inference;
    int npu_usage_threshold;          /* 0..100 */
    int max_failure_count;            /* >= 1 */
    double virtual_inference_timeout; /* > 0 */
};

struct nm_config {
    /* provenance */
    char *config_path;
    enum wire_role role;
    char *role_section; /* "motor_engine_prefill_config", NULL when absent */
    char *motor_bin;
    struct wire_strlist warnings; /* non-fatal notes, one sentence each */

    /* api_config / TLS */
    char *pod_ip;          /* advertised: registered, carried by every endpoint, engines bind it */
    char *bind_host;       /* where the API listens: pod_ip, or the wildcard 0.0.0.0 when pod_ip
                              is unset (seed 000: upstream's host falls back to 0.0.0.0) */
    bool pod_ip_detected;  /* pod_ip unset: the advertised address was found (see docs) */
    int node_manager_port; /* includes the single-container offset */
    int node_manager_port_requested; /* before nm_ports_allocate moved it; 0 = not moved */
    struct nm_tls mgmt_tls;
    struct nm_tls infer_tls; /* motor_deploy_config.tls_config.infer_tls_config (probes) */

    /* the Controller, from motor_controller_config */
    char *controller_host;
    int controller_port;
    bool controller_enable_fault_tolerance;
    bool controller_enable_dp_scale_down;
    bool controller_enable_engine_relaunch; /* our default of ft.enable_engine_relaunch */

    /* endpoint_config */
    int base_port; /* includes the single-container offset */
    int endpoint_num;
    int *service_ports; /* endpoint_num entries */
    int bootstrap_port; /* 0 = none */

    /* basic_config */
    char *job_name; /* NULL = unset */
    char *model_name;
    enum nm_engine_type engine_type;
    struct wire_strlist dispatch_capabilities;
    struct wire_ft_capability ft_capability;
    char *hardware_type;
    double heartbeat_interval_seconds;
    double daemon_loop_interval;
    int device_num;
    struct wire_parallel_config parallel; /* world sizes filled */
    int nnodes;
    int dp_master_port;
    int dp_rpc_port;
    bool enable_multi_endpoints;
    /* Parallel sizes of every role that has an engine section in the file. */
    struct wire_parallel_config role_parallel[WIRE_ROLE_COUNT];
    bool has_role_parallel[WIRE_ROLE_COUNT];

    bool enable_snapshot;
    char *snapshot_metadata_path;
    struct nm_ft_config ft;
    bool enable_startup_plan, enable_graph_reuse;
    char *startup_cache_root;

    char *log_level; /* canonical upper case */
    int log_max_line_length;
    char *host_log_dir;

    bool port_alloc_enable;
    int port_alloc_scan_range;
    double port_alloc_probe_timeout_seconds, port_alloc_remote_check_timeout_seconds;
    char *port_alloc_bind_host;

    struct nm_single_container sc;
    struct nm_kv_store kv;
    struct nm_health health;

    /* the engine section */
    json_t *engine_config;              /* owned, normalized ({} when the role has no section) */
    char *dispatch_profile;             /* NULL = unset */
    struct wire_strlist engine_command; /* cmd template */

    /* Motor additions */
    enum nm_restart_policy restart_policy;
    double restart_backoff_initial_sec, restart_backoff_max_sec, restart_reset_after_sec;
    int restart_start_limit;
    bool standalone;
    char *management_api_key;      /* resolved key; NULL = no key required */
    char *management_api_key_file; /* NULL = not used */
    char *engine_log_dir;          /* "" = no files */
    int64_t engine_log_rotation_bytes;
    int engine_log_rotation_count;
    double stop_grace_seconds;

    /* paths from the environment */
    char *ranktable_path; /* $RANKTABLE_PATH; NULL = do not write */
    char *hccl_path;      /* $HCCL_PATH; NULL = no ranktable at registration */

    /* private: basic_config.parallel_config as given (used without an engine section) */
    json_t *user_parallel;
    /* private: what a reload needs, and the captured environment */
    char *opt_role;
    char **env_kv; /* "NAME=value" for the names listed in nm_config.c */
};

/* Load and validate. New config (free with nm_config_free), or NULL with every problem
 * recorded in errs (errs initialised by the caller; its prefix, if any, is prepended to
 * every path). Reads the environment only through opts->env. Not thread-safe with
 * respect to errs only. */
struct nm_config *nm_config_load(const struct nm_config_opts *opts, struct cfg_errors *errs);
/* Same from an already parsed document (borrowed); opts->config_path is only recorded. */
struct nm_config *nm_config_from_json(json_t *root, const struct nm_config_opts *opts,
                                      struct cfg_errors *errs);
void nm_config_free(struct nm_config *c);

/* Hot reload: load the same file with the same role, environment snapshot and motor
 * binary as `live`, without touching `live`. New config (the daemon swaps it in), or
 * NULL with the errors in errs (the daemon keeps the old one and logs why). */
struct nm_config *nm_config_reload(const struct nm_config *live, struct cfg_errors *errs);
/* Which top-level sections of the effective config (nm_config_to_json) differ:
 * NULL when none, else a heap string "api_config,basic_config". */
char *nm_config_diff(const struct nm_config *a, const struct nm_config *b);
/* The changed keys a hot reload cannot apply (the table's rows without CFGTAB_LIVE: bind
 * address and port, API TLS, the management key, standalone, KV mode, the endpoint
 * layout, ...): NULL when none, else a heap string "api_config.pod_ip,standalone". */
char *nm_config_restart_keys(const struct nm_config *a, const struct nm_config *b);
/* The table of the keys (docs, tests: common/cfgtab.h). */
struct cfgtab;
extern const struct cfgtab nm_config_cfgtab;

/* The effective, derived configuration as JSON (what --check-config prints). Secrets
 * are redacted ("management_api_key": "<redacted>"). New reference. */
json_t *nm_config_to_json(const struct nm_config *c);

/* A captured environment value (names: ROLE USER_CONFIG_PATH CONFIG_PATH POD_IP JOB_NAME
 * RANKTABLE_PATH HCCL_PATH INDEX KUBERNETES_SERVICE_HOST POD_NAMESPACE
 * CONTROLLER_SERVICE KV_STORE_BACKEND KVS_MASTER_SERVICE KV_CACHE_STORE_PORT
 * MMC_LOCAL_CONFIG_PATH MMC_LOCAL_SERVICE_MODE MOTOR_RESTART_LOCAL_SERVICE VLLM_HOST_IP
 * MOONCAKE_ASCEND_IPV6_EXPERIMENT MC_USE_IPV6 ASCEND_GLOBAL_LOG_LEVEL), NULL when unset. */
const char *nm_config_env(const struct nm_config *c, const char *name);

/* Replace the motor binary used for engine_type "sim". */
void nm_config_set_motor_bin(struct nm_config *c, const char *path);

/* TCPStore port of a DP scale-down (§8.3): dp_master_port + dp_master_rank, or -ERANGE
 * when the rank is negative or the port leaves 1..65535. */
int nm_config_dp_store_port(const struct nm_config *c, int64_t dp_master_rank);

/* `motor node-manager --check-config [--config PATH] [--role ROLE]` (nm_check.c):
 * argv[0] is the subcommand; "--check-config" itself is accepted and ignored. Prints
 * nm_config_to_json to stdout and returns 0, or the error list to stderr and returns 1
 * (2 for a bad command line). Reads the real environment. Main thread only. */
int nm_check_config_main(int argc, char **argv);

/* Check one engine_command template element: 0, or -EINVAL with the reason in bad
 * ("unknown placeholder {foo}", "unterminated '{'", "unmatched '}'"). */
int nm_config_check_template(const char *arg, char *bad, size_t badcap);

/* Configured seconds as the milliseconds every timer uses (rounded). */
static inline int64_t nm_config_ms(double seconds)
{
    return (int64_t)(seconds * 1000.0 + 0.5);
}

#endif
