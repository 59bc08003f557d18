/* nm_config — load, validate and derive the node manager's configuration (§3). */
#include "nodemgr/nm_config.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_CONTROLLER_DNS "mindie-motor-controller-service.mindie-motor.svc.cluster.local"
#define API_KEY_FILE_MAX 4096

static const char *const env_names[] = {
    "ROLE",
    "USER_CONFIG_PATH",
    "CONFIG_PATH",
    "POD_IP",
    "JOB_NAME",
    "RANKTABLE_PATH",
    "HCCL_PATH",
    "INDEX",
    "KUBERNETES_SERVICE_HOST",
    "POD_NAMESPACE",
    "CONTROLLER_SERVICE",
    "KV_STORE_BACKEND",
    "KVS_MASTER_SERVICE",
    "KV_CACHE_STORE_PORT",
    "MMC_LOCAL_CONFIG_PATH",
    "MMC_LOCAL_SERVICE_MODE",
    "MOTOR_RESTART_LOCAL_SERVICE",
    "VLLM_HOST_IP",
    "MOONCAKE_ASCEND_IPV6_EXPERIMENT",
    "MC_USE_IPV6",
    "ASCEND_GLOBAL_LOG_LEVEL",
};

/* Engine-config sub-configs that users may write as JSON strings (§3.4). */
static const char *const json_subconfigs[] = {"kv_transfer_config", "additional_config",
                                              "eplb_config", "fault_tolerance_config",
                                              "compilation_config"};

static const char *const engine_type_names[] = {"vllm", "sglang", "sim", "cmd", NULL};
static const char *const role_section_names[] = {
    "motor_engine_encode_config", "motor_engine_prefill_config", "motor_engine_decode_config",
    "motor_engine_union_config"};

const char *nm_engine_type_str(enum nm_engine_type t)
{
    return (unsigned)t < 4 ? engine_type_names[t] : "?";
}

/* ---- environment -------------------------------------------------------------------- */

const char *nm_env_from_array(void *ud, const char *name)
{
    size_t n = strlen(name);
    for (char *const *kv = ud; kv && *kv; kv++)
        if (strncmp(*kv, name, n) == 0 && (*kv)[n] == '=')
            return *kv + n + 1;
    return NULL;
}

static const char *env_getenv(void *ud, const char *name)
{
    (void)ud;
    return getenv(name);
}

const char *nm_config_env(const struct nm_config *c, const char *name)
{
    return c ? nm_env_from_array(c->env_kv, name) : NULL;
}

static char **capture_env(nm_env_fn fn, void *ud)
{
    char **kv = xcalloc(ARRAY_LEN(env_names) + 1, sizeof(char *));
    size_t n = 0;
    for (size_t i = 0; i < ARRAY_LEN(env_names); i++) {
        const char *v = fn(ud, env_names[i]);
        if (v)
            kv[n++] = xasprintf("%s=%s", env_names[i], v);
    }
    return kv;
}

/* An env value that counts as set: present and not empty. */
static const char *env_set(const struct nm_config *c, const char *name)
{
    const char *v = nm_config_env(c, name);
    return (v && *v) ? v : NULL;
}

/* ---- loader state ------------------------------------------------------------------- */

struct loader {
    struct nm_config *c;
    struct cfg_errors *e;
    char *base; /* the caller's prefix */
    json_t *root;
    /* user values of derived keys, used when the role has no engine section */
    const char *user_model_name;
    const char *user_engine_type;
    json_t *user_parallel;
    int64_t user_nnodes;
    bool nm_relaunch_set;
    bool nm_relaunch;
    bool container_managed_set;
    bool engine_command_given; /* a non-empty engine_command array, valid or not */
};

/* Errors recorded from now on are prefixed with path (after the caller's prefix). */
static void at(struct loader *L, const char *path)
{
    if (*L->base && path && *path) {
        char *p = xasprintf("%s.%s", L->base, path);
        cfg_errors_set_prefix(L->e, p);
        free(p);
    } else {
        cfg_errors_set_prefix(L->e, (path && *path) ? path : L->base);
    }
}

static void set_str(char **dst, const char *v)
{
    if (*dst == v)
        return;
    char *copy = xstrdup(v);
    free(*dst);
    *dst = copy;
}

static void warn(struct nm_config *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(struct nm_config *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    if (s)
        wire_strlist_push(&c->warnings, s);
    free(s);
}

static int64_t clamp_int(int64_t v)
{
    return v > INT_MAX ? INT_MAX : v < INT_MIN ? INT_MIN : v;
}

static int get_int(json_t *o, const char *path, int def, int min, int max, struct cfg_errors *e)
{
    return (int)clamp_int(cfg_get_int(o, path, def, min, max, e));
}

/* The NM block of obj under either spelling (the correct one wins when both exist). */
static json_t *find_nm_block(struct nm_config *c, json_t *obj, const char *where,
                             const char **key_out, struct cfg_errors *e)
{
    static const char *const keys[] = {"motor_nodemanager_config", "motor_nodemanger_config"};
    json_t *found = NULL;
    for (size_t i = 0; i < ARRAY_LEN(keys); i++) {
        json_t *b = cfg_get_object(obj, keys[i], e);
        if (b && !found) {
            *key_out = keys[i];
            found = b;
        } else if (b) {
            warn(c,
                 "%s%shas both motor_nodemanager_config and motor_nodemanger_config; only "
                 "motor_nodemanager_config is used",
                 where, *where ? " " : "");
        }
    }
    return found;
}

/* ---- NM block ----------------------------------------------------------------------- */

static void apply_tls(json_t *blk, const char *base, struct nm_tls *t, struct cfg_errors *e)
{
    char p[96];
#define TLS_PATH(k) (snprintf(p, sizeof(p), "%s.%s", base, k), p)
    t->enable_tls = cfg_get_bool(blk, TLS_PATH("enable_tls"), t->enable_tls, e);
    set_str(&t->ca_file, cfg_get_string(blk, TLS_PATH("ca_file"), t->ca_file, e));
    set_str(&t->cert_file, cfg_get_string(blk, TLS_PATH("cert_file"), t->cert_file, e));
    set_str(&t->key_file, cfg_get_string(blk, TLS_PATH("key_file"), t->key_file, e));
    set_str(&t->passwd_file, cfg_get_string(blk, TLS_PATH("passwd_file"), t->passwd_file, e));
    set_str(&t->crl_file, cfg_get_string(blk, TLS_PATH("crl_file"), t->crl_file, e));
#undef TLS_PATH
}

static void tls_defaults(struct nm_tls *t)
{
    t->enable_tls = false;
    t->ca_file = xstrdup("security/mgmt/cert/ca.crt");
    t->cert_file = xstrdup("security/mgmt/cert/server.crt");
    t->key_file = xstrdup("security/mgmt/keys/server.key");
    t->passwd_file = xstrdup("security/mgmt/keys/key_pwd.txt");
    t->crl_file = xstrdup("");
}

static void tls_release(struct nm_tls *t)
{
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    free(t->passwd_file);
    free(t->crl_file);
    memset(t, 0, sizeof(*t));
}

static void apply_nm_block(struct loader *L, json_t *blk)
{
    struct nm_config *c = L->c;
    struct cfg_errors *e = L->e;

    /* api_config */
    const char *pod_ip = cfg_get_string(blk, "api_config.pod_ip", c->pod_ip, e);
    if (pod_ip && !*pod_ip)
        cfg_error(e, "api_config.pod_ip", "must not be empty");
    else
        set_str(&c->pod_ip, pod_ip);
    c->node_manager_port =
        get_int(blk, "api_config.node_manager_port", c->node_manager_port, 1, 65535, e);
    apply_tls(blk, "mgmt_tls_config", &c->mgmt_tls, e);

    /* endpoint_config: only base_port is an input; the rest is derived. */
    c->base_port = get_int(blk, "endpoint_config.base_port", c->base_port, 0, 65535, e);

    /* basic_config */
    const char *job = cfg_get_string(blk, "basic_config.job_name", c->job_name, e);
    if (job && !*job)
        cfg_error(e, "basic_config.job_name", "must not be empty");
    else
        set_str(&c->job_name, job);
    L->user_model_name = cfg_get_string(blk, "basic_config.model_name", L->user_model_name, e);
    L->user_engine_type =
        cfg_get_enum(blk, "basic_config.engine_type", L->user_engine_type, engine_type_names, e);
    set_str(&c->hardware_type,
            cfg_get_string(blk, "basic_config.hardware_type", c->hardware_type, e));
    c->heartbeat_interval_seconds = cfg_get_double(blk, "basic_config.heartbeat_interval_seconds",
                                                   c->heartbeat_interval_seconds, 0.001, 3600, e);
    c->daemon_loop_interval = cfg_get_double(blk, "basic_config.daemon_loop_interval",
                                             c->daemon_loop_interval, 0.01, 3600, e);
    c->device_num = get_int(blk, "basic_config.device_num", c->device_num, 0, WIRE_SIZE_MAX, e);
    c->enable_multi_endpoints =
        cfg_get_bool(blk, "basic_config.enable_multi_endpoints", c->enable_multi_endpoints, e);
    L->user_nnodes = cfg_get_int(blk, "basic_config.nnodes", L->user_nnodes, 1, WIRE_SIZE_MAX, e);
    json_t *par = cfg_get_object(blk, "basic_config.parallel_config", e);
    if (par)
        L->user_parallel = par;
    json_t *caps = cfg_get_array(blk, "basic_config.dispatch_capabilities", e);
    if (caps && json_array_size(caps) > 0)
        warn(c, "basic_config.dispatch_capabilities is derived from the engine section; the "
                "configured value is ignored");

    /* snapshot_config */
    c->enable_snapshot =
        cfg_get_bool(blk, "snapshot_config.enable_snapshot", c->enable_snapshot, e);
    set_str(&c->snapshot_metadata_path,
            cfg_get_string(blk, "snapshot_config.snapshot_metadata_path", c->snapshot_metadata_path,
                           e));

    /* fault_tolerance_config */
    struct nm_ft_config *ft = &c->ft;
    ft->enable_fault_tolerance = cfg_get_bool(blk, "fault_tolerance_config.enable_fault_tolerance",
                                              ft->enable_fault_tolerance, e);
    ft->poll_interval_sec = cfg_get_double(blk, "fault_tolerance_config.poll_interval_sec",
                                           ft->poll_interval_sec, 0.01, 3600, e);
    ft->poll_timeout_sec = cfg_get_double(blk, "fault_tolerance_config.poll_timeout_sec",
                                          ft->poll_timeout_sec, 0.01, 3600, e);
    ft->max_poll_failures = get_int(blk, "fault_tolerance_config.max_poll_failures",
                                    ft->max_poll_failures, 1, 1000000, e);
    ft->max_consecutive_404 = get_int(blk, "fault_tolerance_config.max_consecutive_404",
                                      ft->max_consecutive_404, 1, 1000000, e);
    ft->unsupported_reprobe_interval_sec =
        cfg_get_double(blk, "fault_tolerance_config.unsupported_reprobe_interval_sec",
                       ft->unsupported_reprobe_interval_sec, 0.01, 86400, e);
    if (cfg_lookup(blk, "fault_tolerance_config.enable_engine_relaunch")) {
        L->nm_relaunch =
            cfg_get_bool(blk, "fault_tolerance_config.enable_engine_relaunch", L->nm_relaunch, e);
        L->nm_relaunch_set = true;
    }
    ft->engine_restart_wait_timeout_sec =
        cfg_get_double(blk, "fault_tolerance_config.engine_restart_wait_timeout_sec",
                       ft->engine_restart_wait_timeout_sec, 60, 3600, e);
    ft->engine_restart_freeze_sec =
        cfg_get_double(blk, "fault_tolerance_config.engine_restart_freeze_sec",
                       ft->engine_restart_freeze_sec, 120, 7200, e);
    if (cfg_lookup(blk, "fault_tolerance_config.container_restart_managed")) {
        ft->container_restart_managed =
            cfg_get_bool(blk, "fault_tolerance_config.container_restart_managed",
                         ft->container_restart_managed, e);
        L->container_managed_set = true;
    }
    if (cfg_lookup(blk, "fault_tolerance_config.enable_dp_scale_down_proxy"))
        warn(c, "fault_tolerance_config.enable_dp_scale_down_proxy is derived from "
                "motor_controller_config.fault_tolerance_config (enable_fault_tolerance && "
                "enable_dp_scale_down); the configured value is ignored");

    /* vllm_startup_acceleration_config */
    c->enable_startup_plan = cfg_get_bool(
        blk, "vllm_startup_acceleration_config.enable_startup_plan", c->enable_startup_plan, e);
    c->enable_graph_reuse = cfg_get_bool(blk, "vllm_startup_acceleration_config.enable_graph_reuse",
                                         c->enable_graph_reuse, e);
    const char *root_dir = cfg_get_string(blk, "vllm_startup_acceleration_config.cache_root",
                                          c->startup_cache_root, e);
    if (root_dir && *root_dir && root_dir[0] != '/')
        cfg_error(e, "vllm_startup_acceleration_config.cache_root",
                  "must be an absolute path, got \"%s\"", root_dir);
    else
        set_str(&c->startup_cache_root, root_dir);

    /* logging_config */
    const char *lvl = cfg_get_string(blk, "logging_config.log_level", c->log_level, e);
    enum log_level parsed;
    if (lvl && lvl != c->log_level) {
        if (log_parse_level(lvl, &parsed) < 0) {
            cfg_error(e, "logging_config.log_level",
                      "must be one of DEBUG, INFO, WARNING, ERROR, got \"%s\"", lvl);
        } else {
            static const char *const canon[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
            set_str(&c->log_level, canon[parsed]);
        }
    }
    c->log_max_line_length =
        get_int(blk, "logging_config.log_max_line_length", c->log_max_line_length, 1, 1 << 24, e);
    set_str(&c->host_log_dir,
            cfg_get_string(blk, "logging_config.host_log_dir", c->host_log_dir, e));

    /* port_allocator_config */
    c->port_alloc_enable =
        cfg_get_bool(blk, "port_allocator_config.enable", c->port_alloc_enable, e);
    c->port_alloc_scan_range =
        get_int(blk, "port_allocator_config.scan_range", c->port_alloc_scan_range, 0, 65535, e);
    c->port_alloc_probe_timeout_seconds =
        cfg_get_double(blk, "port_allocator_config.probe_timeout_seconds",
                       c->port_alloc_probe_timeout_seconds, 0.001, 60, e);
    c->port_alloc_remote_check_timeout_seconds =
        cfg_get_double(blk, "port_allocator_config.remote_check_timeout_seconds",
                       c->port_alloc_remote_check_timeout_seconds, 0.001, 60, e);
    set_str(&c->port_alloc_bind_host,
            cfg_get_string(blk, "port_allocator_config.bind_host", c->port_alloc_bind_host, e));

    /* Motor additions */
    static const char *const policies[] = {"controller", "local", NULL};
    const char *pol =
        cfg_get_enum(blk, "restart_policy",
                     c->restart_policy == NM_RESTART_LOCAL ? "local" : "controller", policies, e);
    c->restart_policy = strcmp(pol, "local") == 0 ? NM_RESTART_LOCAL : NM_RESTART_CONTROLLER;
    /* 0 = restart at once (the timer's 1 ms floor, nm_backoff_next); storms are bounded by
     * restart_start_limit, not by a minimum delay. */
    c->restart_backoff_initial_sec = cfg_get_double(blk, "restart_backoff_initial_sec",
                                                    c->restart_backoff_initial_sec, 0, 3600, e);
    c->restart_backoff_max_sec =
        cfg_get_double(blk, "restart_backoff_max_sec", c->restart_backoff_max_sec, 0, 86400, e);
    c->restart_reset_after_sec =
        cfg_get_double(blk, "restart_reset_after_sec", c->restart_reset_after_sec, 1, 604800, e);
    c->restart_start_limit =
        get_int(blk, "restart_start_limit", c->restart_start_limit, 0, 1000000, e);
    c->standalone = cfg_get_bool(blk, "standalone", c->standalone, e);
    const char *key = cfg_get_string(blk, "management_api_key", c->management_api_key, e);
    if (key && !*key)
        cfg_error(e, "management_api_key", "must not be empty (omit it to disable the key)");
    else
        set_str(&c->management_api_key, key);
    const char *kf = cfg_get_string(blk, "management_api_key_file", c->management_api_key_file, e);
    if (kf && !*kf)
        cfg_error(e, "management_api_key_file", "must not be empty");
    else
        set_str(&c->management_api_key_file, kf);
    set_str(&c->engine_log_dir, cfg_get_string(blk, "engine_log_dir", c->engine_log_dir, e));
    c->engine_log_rotation_bytes = cfg_get_int(blk, "engine_log_rotation_size",
                                               c->engine_log_rotation_bytes >> 20, 1, 10240, e)
                                   << 20;
    c->engine_log_rotation_count =
        get_int(blk, "engine_log_rotation_count", c->engine_log_rotation_count, 1, 1000, e);
    c->stop_grace_seconds =
        cfg_get_double(blk, "stop_grace_seconds", c->stop_grace_seconds, 0, 3600, e);
}

static void set_defaults(struct nm_config *c)
{
    const char *pod_ip = env_set(c, "POD_IP");
    c->pod_ip = xstrdup(pod_ip ? pod_ip : "127.0.0.1");
    c->node_manager_port = 1026;
    tls_defaults(&c->mgmt_tls);
    tls_defaults(&c->infer_tls);
    c->base_port = 10000;
    c->job_name = xstrdup(env_set(c, "JOB_NAME"));
    c->hardware_type = xstrdup("800I-A3");
    c->heartbeat_interval_seconds = 3;
    c->daemon_loop_interval = 5.0;
    c->enable_multi_endpoints = true;
    c->snapshot_metadata_path = xstrdup("");
    c->ft = (struct nm_ft_config){
        .poll_interval_sec = 1.0,
        .poll_timeout_sec = 5.0,
        .max_poll_failures = 3,
        .max_consecutive_404 = 3,
        .unsupported_reprobe_interval_sec = 60.0,
        .enable_engine_relaunch = true,
        .engine_restart_wait_timeout_sec = 180.0,
        .engine_restart_freeze_sec = 720.0,
    };
    c->startup_cache_root = xstrdup("");
    c->log_level = xstrdup("INFO");
    c->log_max_line_length = 8192;
    c->host_log_dir = xstrdup("/root/ascend/log");
    c->port_alloc_enable = true;
    c->port_alloc_scan_range = 100;
    c->port_alloc_probe_timeout_seconds = 0.5;
    c->port_alloc_remote_check_timeout_seconds = 1.0;
    c->port_alloc_bind_host = xstrdup("0.0.0.0");
    c->restart_policy = NM_RESTART_CONTROLLER;
    c->restart_backoff_initial_sec = 1;
    c->restart_backoff_max_sec = 60;
    c->restart_reset_after_sec = 600;
    c->restart_start_limit = 10;
    c->engine_log_dir = xstrdup("");
    c->engine_log_rotation_bytes = (int64_t)20 << 20;
    c->engine_log_rotation_count = 10;
    c->stop_grace_seconds = 10;
    c->health = (struct nm_health){
        .health_collector_timeout = 5,
        .health_collector_timeout_retry_attempts = 3,
        .startup_timeout = 1800,
        .npu_usage_threshold = 3,
        .max_failure_count = 6,
        .virtual_inference_timeout = 5.0,
    };
    c->dp_master_port = 29500;
    c->dp_rpc_port = 9000;
    c->nnodes = 1;
    wire_parallel_config_default(&c->parallel);
}

/* ---- engine section ----------------------------------------------------------------- */

static bool is_json_subconfig(const char *key)
{
    for (size_t i = 0; i < ARRAY_LEN(json_subconfigs); i++)
        if (strcmp(key, json_subconfigs[i]) == 0)
            return true;
    return false;
}

/* A copy of engine_config with underscore keys and JSON-string sub-configs parsed. */
static json_t *normalize_engine_config(json_t *ec, struct cfg_errors *e)
{
    json_t *out = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(ec, key, v)
    {
        /* Strip leading dashes through a copy of the pointer: json_object_foreach finds
         * the next key from `key` itself, so advancing it would derail the iteration. */
        const char *k = key;
        while (*k == '-')
            k++;
        char *nk = xstrdup(k);
        for (char *p = nk; *p; p++)
            if (*p == '-')
                *p = '_';
        json_t *val = json_deep_copy(v);
        if (is_json_subconfig(nk) && json_is_string(v)) {
            json_error_t jerr;
            json_t *parsed = json_loads(json_string_value(v), 0, &jerr);
            if (!json_is_object(parsed)) {
                cfg_error(e, nk, "must be an object or a JSON object string (%s)",
                          parsed ? "not an object" : jerr.text);
                json_decref(parsed);
                /* Reported once: later getters see it as absent. */
                json_decref(val);
                val = json_null();
            } else {
                json_decref(val);
                val = parsed;
            }
        }
        /* A later spelling of the same flag wins, keeping the first one's position. */
        json_object_set_new(out, nk, val);
        free(nk);
    }
    return out;
}

/* The first of two spellings that is present (NULL when neither). */
static const char *pick(json_t *ec, const char *a, const char *b)
{
    if (cfg_lookup(ec, a))
        return a;
    if (b && cfg_lookup(ec, b))
        return b;
    return a;
}

/* Parallel sizes of one engine config (§3.4). Returns false on an error (recorded). */
static bool resolve_parallel(json_t *ec, struct wire_parallel_config *p, int *nnodes_out,
                             struct cfg_errors *e)
{
    int before = cfg_errors_count(e);
    wire_parallel_config_default(p);
    p->dp_size = get_int(ec, pick(ec, "data_parallel_size", "dp_size"), 1, 1, WIRE_SIZE_MAX, e);
    p->tp_size = get_int(ec, pick(ec, "tensor_parallel_size", "tp_size"), 1, 1, WIRE_SIZE_MAX, e);
    p->pp_size = get_int(ec, pick(ec, "pipeline_parallel_size", "pp_size"), 1, 1, WIRE_SIZE_MAX, e);
    p->pcp_size =
        get_int(ec, pick(ec, "prefill_context_parallel_size", "pcp_size"), 1, 1, WIRE_SIZE_MAX, e);
    int nnodes = get_int(ec, "nnodes", 1, 1, WIRE_SIZE_MAX, e);
    bool ep = cfg_get_bool(ec, "enable_expert_parallel", false, e);
    int ep_size = get_int(ec, "ep_size", 0, 1, WIRE_SIZE_MAX, e);
    struct wire_err werr;
    if (wire_parallel_config_fill(p, &werr) < 0) {
        cfg_error(e, "", "%s", werr.msg);
        p->world_size = p->local_world_size = 1;
    }
    p->ep_size = ep_size ? ep_size : ep ? p->world_size : 1;
    int pcp_pp = p->pcp_size * p->pp_size;
    if (nnodes > 1 && pcp_pp > 1) {
        if (pcp_pp % nnodes != 0)
            cfg_error(e, "nnodes",
                      "prefill_context_parallel_size * pipeline_parallel_size (%d) must be "
                      "divisible by nnodes (%d)",
                      pcp_pp, nnodes);
        else
            p->local_world_size = p->local_world_size / nnodes;
    }
    *nnodes_out = nnodes;
    return cfg_errors_count(e) == before;
}

/* The first string of a string-or-list value; NULL otherwise. */
static const char *string_or_first(json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_array(v) && json_is_string(json_array_get(v, 0)))
        return json_string_value(json_array_get(v, 0));
    return NULL;
}

/* kv_port of a kv_transfer_config: string or integer; 0 when absent or invalid. */
static int number_value(json_t *v)
{
    int port = 0;
    if (json_is_integer(v))
        return (int)clamp_int(json_integer_value(v));
    if (json_is_string(v) && util_parse_int(json_string_value(v), 0, INT_MAX, &port) == 0)
        return port;
    return 0;
}

static const char *connector_capability(const char *conn)
{
    static const char *const handoff[] = {"MooncakeConnectorV1", "MooncakeHybridConnector",
                                          "NixlConnector"};
    if (!conn)
        return NULL;
    for (size_t i = 0; i < ARRAY_LEN(handoff); i++)
        if (strcmp(conn, handoff[i]) == 0)
            return "prefill_handoff_decode";
    if (strcmp(conn, "MooncakeLayerwiseConnector") == 0)
        return "concurrent_engine_sync";
    return NULL;
}

/* The transport connector name of a kv_transfer_config (MultiConnector => connectors[0]). */
static const char *transport_connector(json_t *kvt)
{
    const char *conn = json_string_value(json_object_get(kvt, "kv_connector"));
    if (conn && strcmp(conn, "MultiConnector") == 0) {
        json_t *list = cfg_lookup(kvt, "kv_connector_extra_config.connectors");
        return json_string_value(json_object_get(json_array_get(list, 0), "kv_connector"));
    }
    return conn;
}

static void parse_health(struct loader *L, json_t *sec, const char *secname)
{
    struct nm_health *h = &L->c->health;
    struct cfg_errors *e = L->e;
    at(L, secname);
    json_t *hc = cfg_get_object(sec, "health_check_config", e);
    if (!hc)
        return;
    char *p = xasprintf("%s.health_check_config", secname);
    at(L, p);
    free(p);
    h->health_collector_timeout =
        get_int(hc, "health_collector_timeout", h->health_collector_timeout, 1, 3600, e);
    h->health_collector_timeout_retry_attempts =
        get_int(hc, "health_collector_timeout_retry_attempts",
                h->health_collector_timeout_retry_attempts, 1, 100, e);
    h->startup_timeout = get_int(hc, "startup_timeout", h->startup_timeout, 1, 604800, e);
    h->enable_virtual_inference =
        cfg_get_bool(hc, "enable_virtual_inference", h->enable_virtual_inference, e);
    h->npu_usage_threshold = get_int(hc, "npu_usage_threshold", h->npu_usage_threshold, 0, 100, e);
    h->max_failure_count = get_int(hc, "max_failure_count", h->max_failure_count, 1, 1000000, e);
    h->virtual_inference_timeout = cfg_get_double(hc, "virtual_inference_timeout",
                                                  h->virtual_inference_timeout, 0.001, 3600, e);
}

static const char *const cmd_placeholders[] = {"host",        "port",      "dp_rank",
                                               "dp_size",     "node_rank", "master_addr",
                                               "instance_id", "role",      "model"};

int nm_config_check_template(const char *s, char *bad, size_t badcap)
{
    for (const char *p = s; *p; p++) {
        if (p[0] == '{' && p[1] == '{') {
            p++;
            continue;
        }
        if (p[0] == '}' && p[1] == '}') {
            p++;
            continue;
        }
        if (*p == '}') {
            snprintf(bad, badcap, "unmatched '}'");
            return -EINVAL;
        }
        if (*p != '{')
            continue;
        const char *end = strchr(p, '}');
        if (!end) {
            snprintf(bad, badcap, "unterminated '{'");
            return -EINVAL;
        }
        size_t n = (size_t)(end - p - 1);
        bool known = false;
        for (size_t i = 0; i < ARRAY_LEN(cmd_placeholders); i++)
            known = known || (strlen(cmd_placeholders[i]) == n &&
                              strncmp(p + 1, cmd_placeholders[i], n) == 0);
        if (!known) {
            snprintf(bad, badcap, "unknown placeholder {%.*s}", (int)MOTOR_MIN(n, 40), p + 1);
            return -EINVAL;
        }
        p = end;
    }
    return 0;
}

static void parse_engine_command(struct loader *L, json_t *sec)
{
    struct nm_config *c = L->c;
    json_t *arr = cfg_get_array(sec, "engine_command", L->e);
    if (!arr)
        return;
    L->engine_command_given = json_array_size(arr) > 0;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        char path[48];
        snprintf(path, sizeof(path), "engine_command[%zu]", i);
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            cfg_error(L->e, path, "must be a string without NUL characters");
            continue;
        }
        char bad[96];
        if (nm_config_check_template(json_string_value(v), bad, sizeof(bad)) < 0)
            cfg_error(L->e, path,
                      "%s (known: {host} {port} {dp_rank} {dp_size} {node_rank} "
                      "{master_addr} {instance_id} {role} {model})",
                      bad);
        wire_strlist_push(&c->engine_command, json_string_value(v));
    }
}

static void parse_engine_section(struct loader *L, json_t *sec, const char *secname)
{
    struct nm_config *c = L->c;
    struct cfg_errors *e = L->e;
    at(L, secname);
    const char *et_default = L->user_engine_type ? L->user_engine_type : "vllm";
    const char *et =
        sec ? cfg_get_enum(sec, "engine_type", et_default, engine_type_names, e) : et_default;
    for (int i = 0; i < 4; i++)
        if (strcmp(et, engine_type_names[i]) == 0)
            c->engine_type = (enum nm_engine_type)i;
    static const char *const profiles[] = {"handoff", "trigger", NULL};
    if (sec) {
        set_str(&c->dispatch_profile, cfg_get_enum(sec, "dispatch_profile", NULL, profiles, e));
        parse_engine_command(L, sec);
    }
    json_t *ec = sec ? cfg_get_object(sec, "engine_config", e) : NULL;
    char *ecpath = xasprintf("%s.engine_config", secname);
    at(L, ecpath);
    free(ecpath);
    c->engine_config = ec ? normalize_engine_config(ec, e) : json_object();
    ec = c->engine_config;

    if (sec) {
        resolve_parallel(ec, &c->parallel, &c->nnodes, e);
    } else {
        /* No engine section: the NM block's own parallel_config/nnodes (config_sample). */
        at(L, NULL);
        struct cfg_errors *pe = e;
        wire_parallel_config_default(&c->parallel);
        if (L->user_parallel) {
            json_t *up = L->user_parallel;
            c->parallel.dp_size = get_int(up, "dp_size", 1, 1, WIRE_SIZE_MAX, pe);
            c->parallel.pcp_size = get_int(up, "pcp_size", 1, 1, WIRE_SIZE_MAX, pe);
            c->parallel.tp_size = get_int(up, "tp_size", 1, 1, WIRE_SIZE_MAX, pe);
            c->parallel.pp_size = get_int(up, "pp_size", 1, 1, WIRE_SIZE_MAX, pe);
            c->parallel.ep_size = get_int(up, "ep_size", 1, 1, WIRE_SIZE_MAX, pe);
        }
        struct wire_err werr;
        if (wire_parallel_config_fill(&c->parallel, &werr) < 0) {
            cfg_error(pe, "basic_config.parallel_config", "%s", werr.msg);
            c->parallel.world_size = c->parallel.local_world_size = 1;
        }
        c->nnodes = (int)L->user_nnodes;
        at(L, secname);
    }
    ecpath = xasprintf("%s.engine_config", secname);
    at(L, ecpath);
    free(ecpath);
    c->dp_master_port = get_int(ec, "data_parallel_master_port", 29500, 1, 65535, e);
    c->dp_rpc_port = get_int(ec, "data_parallel_rpc_port", 9000, 1, 65535, e);
    if (c->engine_type == NM_ENGINE_SGLANG)
        c->bootstrap_port = get_int(ec, "disaggregation_bootstrap_port", 0, 1, 65535, e);

    /* model name: served name, else the model path, else the NM block's value */
    const char *model = string_or_first(cfg_lookup(ec, "served_model_name"));
    if (!model)
        model = json_string_value(cfg_lookup(ec, "model"));
    if (!model)
        model = json_string_value(cfg_lookup(ec, "model_path"));
    if (!model)
        model = L->user_model_name;
    c->model_name = xstrdup(model ? model : "");

    /* ft_capability */
    struct wire_ft_capability *ft = &c->ft_capability;
    ft->enabled = cfg_get_bool(ec, "enable_fault_tolerance", false, e);
    ft->scale_down_supported =
        ft->enabled && (c->engine_type == NM_ENGINE_VLLM || c->engine_type == NM_ENGINE_SIM);
    ft->external_lb = cfg_get_bool(ec, "data_parallel_external_lb", false, e);
    ft->auto_recovery = cfg_get_bool(ec, "fault_tolerance_config.auto_recovery", false, e);
    ft->fused_mc2_enabled = cfg_get_bool(ec, "additional_config.enable_fused_mc2", false, e);
    ft->eplb_enabled = cfg_get_bool(ec, "enable_eplb", false, e);
    ft->num_redundant_experts =
        cfg_get_int(ec, "eplb_config.num_redundant_experts", 0, 0, WIRE_ID_MAX, e);

    /* dispatch_capabilities */
    json_t *kvt = cfg_get_object(ec, "kv_transfer_config", e);
    const char *cap = NULL;
    if (c->dispatch_profile)
        cap = strcmp(c->dispatch_profile, "handoff") == 0 ? "prefill_handoff_decode"
                                                          : "concurrent_engine_sync";
    else if (c->engine_type == NM_ENGINE_SGLANG)
        cap = "concurrent_engine_sync";
    else if (c->engine_type == NM_ENGINE_VLLM || c->engine_type == NM_ENGINE_SIM)
        cap = connector_capability(transport_connector(kvt));
    if (cap)
        wire_strlist_push(&c->dispatch_capabilities, cap);

    at(L, secname);
    bool pd = c->role == WIRE_ROLE_PREFILL || c->role == WIRE_ROLE_DECODE;
    if (sec && pd && !cap && (c->engine_type == NM_ENGINE_VLLM || c->engine_type == NM_ENGINE_SIM))
        cfg_error(e, "engine_config.kv_transfer_config.kv_connector",
                  "a %s role needs a known KV connector (MooncakeConnectorV1, "
                  "MooncakeHybridConnector, NixlConnector, MooncakeLayerwiseConnector, or a "
                  "MultiConnector whose connectors[0] is one of them) or dispatch_profile "
                  "\"handoff\"/\"trigger\"",
                  wire_role_str(c->role));
    if (c->engine_type == NM_ENGINE_SGLANG && c->role == WIRE_ROLE_ENCODE)
        cfg_error(e, "engine_type", "sglang does not support the encode role");
    if (c->engine_type == NM_ENGINE_CMD && !L->engine_command_given)
        cfg_error(e, "engine_command",
                  "required (a non-empty array of strings) when engine_type is \"cmd\"");
    if (c->engine_type != NM_ENGINE_CMD && c->engine_command.n > 0)
        warn(c, "%s.engine_command is only used with engine_type \"cmd\"; ignored", secname);
    if (sec)
        parse_health(L, sec, secname);
}

/* ---- other blocks ------------------------------------------------------------------- */

static void parse_controller(struct loader *L)
{
    struct nm_config *c = L->c;
    at(L, "motor_controller_config");
    json_t *ctl = L->root ? cfg_lookup(L->root, "motor_controller_config") : NULL;
    if (ctl && !json_is_object(ctl)) {
        at(L, NULL);
        cfg_error(L->e, "motor_controller_config", "must be an object");
        ctl = NULL;
        at(L, "motor_controller_config");
    }
    const char *svc = env_set(c, "CONTROLLER_SERVICE");
    c->controller_host = xstrdup(cfg_get_string(ctl, "api_config.controller_api_dns",
                                                svc ? svc : DEFAULT_CONTROLLER_DNS, L->e));
    if (!*c->controller_host)
        cfg_error(L->e, "api_config.controller_api_dns", "must not be empty");
    c->controller_port = get_int(ctl, "api_config.controller_api_port", 1026, 1, 65535, L->e);
    c->controller_enable_fault_tolerance =
        cfg_get_bool(ctl, "fault_tolerance_config.enable_fault_tolerance", true, L->e);
    c->controller_enable_dp_scale_down =
        cfg_get_bool(ctl, "fault_tolerance_config.enable_dp_scale_down", false, L->e);
    bool relaunch = cfg_get_bool(ctl, "fault_tolerance_config.enable_engine_relaunch", true, L->e);
    c->ft.enable_engine_relaunch = L->nm_relaunch_set ? L->nm_relaunch : relaunch;
    c->ft.enable_dp_scale_down_proxy =
        c->controller_enable_fault_tolerance && c->controller_enable_dp_scale_down;
}

static void parse_kv_store(struct loader *L)
{
    struct nm_config *c = L->c;
    struct nm_kv_store *kv = &c->kv;
    at(L, NULL);
    json_t *sec = cfg_get_object(L->root, "kv_cache_store_config", L->e);
    const char *backend_env = env_set(c, "KV_STORE_BACKEND");
    kv->enabled = sec != NULL || backend_env != NULL;
    at(L, "kv_cache_store_config");
    struct cfg_errors *e = L->e;
    static const char *const backends[] = {"memcache", "mooncake", NULL};
    const char *backend_def = "memcache";
    if (backend_env) {
        if (strcmp(backend_env, "memcache") == 0 || strcmp(backend_env, "mooncake") == 0) {
            backend_def = backend_env;
        } else {
            at(L, NULL);
            cfg_error(e, "$KV_STORE_BACKEND", "must be \"memcache\" or \"mooncake\", got \"%s\"",
                      backend_env);
            at(L, "kv_cache_store_config");
        }
    }
    const char *backend = cfg_get_enum(sec, "backend", backend_def, backends, e);
    kv->backend = strcmp(backend, "mooncake") == 0 ? NM_KV_MOONCAKE : NM_KV_MEMCACHE;
    const char *mode = cfg_get_string(sec, "mode", "combined", e);
    if (strcmp(mode, "separated") == 0) {
        kv->mode = NM_KV_SEPARATED;
    } else {
        kv->mode = NM_KV_COMBINED;
        if (strcmp(mode, "combined") != 0)
            warn(c, "kv_cache_store_config.mode \"%s\" is not combined/separated; using combined",
                 mode);
    }
    kv->service = xstrdup(cfg_get_string(sec, "service", env_set(c, "KVS_MASTER_SERVICE"), e));
    int port_def = 50088;
    const char *port_env = env_set(c, "KV_CACHE_STORE_PORT");
    if (port_env && util_parse_int(port_env, 1, 65535, &port_def) < 0) {
        at(L, NULL);
        cfg_error(e, "$KV_CACHE_STORE_PORT", "must be a port 1-65535, got \"%s\"", port_env);
        at(L, "kv_cache_store_config");
        port_def = 50088;
    }
    kv->port = get_int(sec, "port", port_def, 1, 65535, e);
    static const char *const lsm[] = {"standalone", "inprocess", NULL};
    const char *lsm_env = env_set(c, "MMC_LOCAL_SERVICE_MODE");
    const char *lsm_def = "inprocess";
    if (lsm_env && (strcmp(lsm_env, "standalone") == 0 || strcmp(lsm_env, "inprocess") == 0))
        lsm_def = lsm_env;
    kv->local_service_mode = xstrdup(cfg_get_enum(sec, "local_service_mode", lsm_def, lsm, e));
    const char *lcp = env_set(c, "MMC_LOCAL_CONFIG_PATH");
    kv->local_config_path = xstrdup(
        cfg_get_string(sec, "local_config_path",
                       lcp ? lcp : "/usr/local/Ascend/pyMotor/conf/mmc-local-inprocess.conf", e));
    static const char *const store_modes[] = {"", "embedded", "standalone", NULL};
    kv->store_mode = xstrdup(cfg_get_enum(sec, "store_mode", "", store_modes, e));
    const char *sizes[] = {"global_segment_size", "local_buffer_size"};
    char **dst[] = {&kv->global_segment_size, &kv->local_buffer_size};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = cfg_lookup(sec, sizes[i]);
        if (!v)
            continue;
        if (json_is_integer(v) && json_integer_value(v) >= 0)
            *dst[i] = xasprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v));
        else if (json_is_string(v))
            *dst[i] = xstrdup(json_string_value(v));
        else
            cfg_error(e, sizes[i], "must be a size string (\"1GB\") or a non-negative integer");
    }
    kv->store_http_port = get_int(sec, "store_http_port", 0, 0, 65535, e);
    kv->metadata_server = xstrdup(cfg_get_string(sec, "metadata_server", "P2PHANDSHAKE", e));
    kv->protocol = xstrdup(cfg_get_string(sec, "protocol", "ascend", e));
    kv->device_name = xstrdup(cfg_get_string(sec, "device_name", "", e));
    json_t *cmd = cfg_get_array(sec, "local_service_command", e);
    size_t i;
    json_t *v;
    json_array_foreach(cmd, i, v)
    {
        if (!json_is_string(v)) {
            char p[48];
            snprintf(p, sizeof(p), "local_service_command[%zu]", i);
            cfg_error(e, p, "must be a string");
            continue;
        }
        wire_strlist_push(&kv->local_service_command, json_string_value(v));
    }
}

/* ---- derived values ----------------------------------------------------------------- */

static const char *npu_key_for(enum wire_role r)
{
    switch (r) {
    case WIRE_ROLE_PREFILL:
        return "p_pod_npu_num";
    case WIRE_ROLE_DECODE:
        return "d_pod_npu_num";
    case WIRE_ROLE_ENCODE:
        return "e_pod_npu_num";
    case WIRE_ROLE_UNION:
        return "hybrid_pod_npu_num";
    }
    return "hybrid_pod_npu_num";
}

static void derive(struct loader *L, json_t *deploy)
{
    struct nm_config *c = L->c;
    struct cfg_errors *e = L->e;
    struct wire_parallel_config *p = &c->parallel;

    /* single container */
    at(L, "motor_deploy_config");
    const char *mode = cfg_get_string(deploy, "deploy_mode", "", e);
    struct nm_single_container *sc = &c->sc;
    if (strcmp(mode, "single_container") == 0) {
        const char *idx = nm_config_env(c, "INDEX");
        if (!idx) {
            warn(c, "deploy_mode is single_container but $INDEX is not set: no port/device "
                    "offsets applied");
        } else if (util_parse_int(idx, 0, 4095, &sc->index) < 0) {
            at(L, NULL);
            cfg_error(e, "$INDEX", "must be an integer in [0, 4095], got \"%s\"", idx);
        } else {
            int p_num = get_int(deploy, "p_instances_num", 1, 0, 4096, e);
            sc->enabled = true;
            sc->global_index = c->role == WIRE_ROLE_DECODE ? p_num + sc->index : sc->index;
            int g = sc->global_index;
            sc->node_manager_port_offset = g;
            sc->base_port_offset = g * 2 * p->dp_size;
            sc->device_offset = g * p->world_size;
            sc->device_num = p->world_size;
            sc->dp_rpc_port = c->dp_rpc_port + g;
            json_t *kvt = json_object_get(c->engine_config, "kv_transfer_config");
            int kv_port = number_value(json_object_get(kvt, "kv_port"));
            sc->kv_port = kv_port ? kv_port + sc->device_offset : 0;
            int lookup = number_value(cfg_lookup(kvt, "kv_connector_extra_config.lookup_rpc_port"));
            sc->lookup_rpc_port = lookup ? lookup + g : 0;
        }
    }

    at(L, NULL);
    if (sc->enabled) {
        c->node_manager_port += sc->node_manager_port_offset;
        c->base_port += sc->base_port_offset;
        c->dp_rpc_port = sc->dp_rpc_port;
        if (c->node_manager_port > 65535)
            cfg_error(e, "api_config.node_manager_port",
                      "with the single-container offset %d the port %d exceeds 65535",
                      sc->node_manager_port_offset, c->node_manager_port);
        if (sc->dp_rpc_port > 65535 || sc->kv_port > 65535 || sc->lookup_rpc_port > 65535)
            cfg_error(e, "single_container_config", "an offset port exceeds 65535");
    }

    /* device_num */
    if (c->device_num <= 0) {
        if (sc->enabled) {
            c->device_num = sc->device_num;
        } else {
            at(L, "motor_deploy_config");
            c->device_num = get_int(deploy, npu_key_for(c->role), 0, 0, WIRE_SIZE_MAX, e);
            at(L, NULL);
        }
        if (c->device_num <= 0) {
            int64_t all = (int64_t)p->dp_size * p->local_world_size;
            c->device_num = (int)MOTOR_MIN(all, WIRE_SIZE_MAX);
        }
    }

    /* endpoints and ports */
    if (c->enable_multi_endpoints) {
        if (c->device_num < p->local_world_size) {
            cfg_error(e, "basic_config.device_num",
                      "%d devices cannot hold one engine of local world size %d", c->device_num,
                      p->local_world_size);
            c->endpoint_num = 0;
        } else {
            c->endpoint_num = MOTOR_MIN(p->dp_size, c->device_num / p->local_world_size);
        }
    } else {
        c->endpoint_num = 1;
    }
    c->service_ports = xcalloc((size_t)c->endpoint_num + 1, sizeof(int));
    for (int i = 0; i < c->endpoint_num; i++) {
        int port = c->base_port + 2 * i;
        if (port < 1 || port > 65535) {
            cfg_error(e, "endpoint_config.base_port",
                      "service port %d of endpoint %d is outside 1-65535 (base %d + 2*%d)", port, i,
                      c->base_port, i);
            break;
        }
        c->service_ports[i] = port;
    }

    /* fault tolerance */
    c->ft.enable_fault_tolerance = c->ft.enable_fault_tolerance || c->ft_capability.enabled;
    if (!L->container_managed_set) {
        c->ft.container_restart_managed =
            env_set(c, "KUBERNETES_SERVICE_HOST") || env_set(c, "POD_NAMESPACE");
        c->ft.container_restart_managed_auto = true;
    }

    /* cross-field rules */
    if (c->enable_snapshot && c->engine_type != NM_ENGINE_VLLM)
        cfg_error(e, "snapshot_config.enable_snapshot", "requires engine_type \"vllm\"");
    if ((c->enable_startup_plan || c->enable_graph_reuse) && c->engine_type != NM_ENGINE_VLLM)
        cfg_error(e, "vllm_startup_acceleration_config", "requires engine_type \"vllm\"");
    if (c->restart_backoff_max_sec < c->restart_backoff_initial_sec)
        cfg_error(e, "restart_backoff_max_sec",
                  "must be >= restart_backoff_initial_sec (%g), got %g",
                  c->restart_backoff_initial_sec, c->restart_backoff_max_sec);
    if (c->management_api_key && c->management_api_key_file) {
        cfg_error(e, "management_api_key_file",
                  "set either management_api_key or management_api_key_file, not both");
    } else if (c->management_api_key_file) {
        size_t len = 0;
        char *data = util_read_file(c->management_api_key_file, API_KEY_FILE_MAX, &len);
        if (!data) {
            cfg_error(e, "management_api_key_file", "%s: cannot read: %s",
                      c->management_api_key_file, strerror(errno));
        } else {
            while (len > 0 && strchr(" \t\r\n", data[len - 1]))
                data[--len] = '\0';
            if (len == 0 || strlen(data) != len)
                cfg_error(e, "management_api_key_file", "%s: empty key or NUL characters",
                          c->management_api_key_file);
            else
                set_str(&c->management_api_key, data);
            free(data);
        }
    }
}

/* Parallel sizes of the other roles' sections (for kv_connector_extra_config). */
static void other_roles(struct loader *L)
{
    struct nm_config *c = L->c;
    for (int r = 0; r < WIRE_ROLE_COUNT; r++) {
        if (r == (int)c->role) {
            if (c->role_section) {
                c->role_parallel[r] = c->parallel;
                c->has_role_parallel[r] = true;
            }
            continue;
        }
        json_t *sec = json_object_get(L->root, role_section_names[r]);
        json_t *ec = json_object_get(sec, "engine_config");
        if (!json_is_object(ec))
            continue;
        /* Another role's mistakes are that role's node managers' to report. */
        json_t *norm = normalize_engine_config(ec, NULL);
        int nnodes;
        if (resolve_parallel(norm, &c->role_parallel[r], &nnodes, NULL))
            c->has_role_parallel[r] = true;
        json_decref(norm);
    }
}

static char *self_exe(void)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0)
        return xstrdup("motor");
    buf[n] = '\0';
    return xstrdup(buf);
}

static struct nm_config *build(json_t *root, const struct nm_config_opts *opts, const char *path,
                               char **env_kv, struct cfg_errors *errs)
{
    struct nm_config *c = xcalloc(1, sizeof(*c));
    c->env_kv = env_kv;
    c->config_path = xstrdup(path);
    c->motor_bin = opts->motor_bin ? xstrdup(opts->motor_bin) : self_exe();
    c->opt_role = xstrdup(opts->role);
    struct loader L = {.c = c, .e = errs, .root = root, .user_nnodes = 1, .nm_relaunch = true};
    L.base = xstrdup(errs->prefix ? errs->prefix : "");
    int before = cfg_errors_count(errs);

    set_defaults(c);

    /* role */
    at(&L, NULL);
    const char *role = opts->role ? opts->role : nm_config_env(c, "ROLE");
    if (!role || !*role)
        cfg_error(errs, "$ROLE", "not set (one of encode, prefill, decode, union, both)");
    else if (wire_role_from_str(role, &c->role) < 0)
        cfg_error(errs, "$ROLE", "must be one of encode, prefill, decode, union, both; got \"%s\"",
                  role);
    if (!role || wire_role_from_str(role, &c->role) < 0)
        c->role = WIRE_ROLE_UNION; /* keep validating the rest */

    const char *secname = role_section_names[c->role];
    json_t *deploy = cfg_get_object(root, "motor_deploy_config", errs);
    json_t *sec = cfg_get_object(root, secname, errs);
    if (sec)
        c->role_section = xstrdup(secname);

    /* NM blocks: top level, then the role section's. */
    const char *top_key = NULL, *sec_key = NULL;
    json_t *top_nm = find_nm_block(c, root, "the file", &top_key, errs);
    at(&L, secname);
    json_t *sec_nm = sec ? find_nm_block(c, sec, secname, &sec_key, errs) : NULL;
    if (top_nm) {
        at(&L, top_key);
        apply_nm_block(&L, top_nm);
    }
    if (sec_nm) {
        char *p = xasprintf("%s.%s", secname, sec_key);
        at(&L, p);
        free(p);
        apply_nm_block(&L, sec_nm);
    }
    if (!top_nm && !sec_nm && !sec) {
        at(&L, NULL);
        apply_nm_block(&L, root);
    }

    /* overrides from the deploy block and the snapshot block */
    at(&L, "motor_deploy_config");
    set_str(&c->hardware_type, cfg_get_string(deploy, "hardware_type", c->hardware_type, errs));
    if (cfg_lookup(deploy, "tls_config.mgmt_tls_config"))
        apply_tls(deploy, "tls_config.mgmt_tls_config", &c->mgmt_tls, errs);
    if (cfg_lookup(deploy, "tls_config.infer_tls_config"))
        apply_tls(deploy, "tls_config.infer_tls_config", &c->infer_tls, errs);
    at(&L, "motor_container_snapshot_config");
    json_t *snap = cfg_lookup(root, "motor_container_snapshot_config");
    c->enable_snapshot = cfg_get_bool(snap, "enable_snapshot", c->enable_snapshot, errs);
    set_str(&c->snapshot_metadata_path,
            cfg_get_string(snap, "snapshot_metadata_path", c->snapshot_metadata_path, errs));

    parse_controller(&L);
    parse_engine_section(&L, sec, secname);
    parse_kv_store(&L);
    derive(&L, deploy);
    other_roles(&L);

    c->ranktable_path = xstrdup(env_set(c, "RANKTABLE_PATH"));
    c->hccl_path = xstrdup(env_set(c, "HCCL_PATH"));

    cfg_errors_set_prefix(errs, L.base);
    free(L.base);
    if (cfg_errors_count(errs) != before) {
        nm_config_free(c);
        return NULL;
    }
    return c;
}

static char **opts_env(const struct nm_config_opts *opts)
{
    return capture_env(opts && opts->env ? opts->env : env_getenv, opts ? opts->env_ud : NULL);
}

struct nm_config *nm_config_from_json(json_t *root, const struct nm_config_opts *opts,
                                      struct cfg_errors *errs)
{
    struct nm_config_opts none = {0};
    if (!opts)
        opts = &none;
    return build(root, opts, opts->config_path, opts_env(opts), errs);
}

struct nm_config *nm_config_load(const struct nm_config_opts *opts, struct cfg_errors *errs)
{
    struct nm_config_opts none = {0};
    if (!opts)
        opts = &none;
    char **env = opts_env(opts);
    const char *path = opts->config_path;
    if (!path)
        path = nm_env_from_array(env, "USER_CONFIG_PATH");
    if (!path || !*path)
        path = nm_env_from_array(env, "CONFIG_PATH");
    if (!path || !*path) {
        cfg_error(errs, "",
                  "no configuration file: pass --config PATH or set "
                  "USER_CONFIG_PATH or CONFIG_PATH");
        for (char **kv = env; *kv; kv++)
            free(*kv);
        free(env);
        return NULL;
    }
    json_t *root = cfg_load_file(path, errs);
    if (!root) {
        for (char **kv = env; *kv; kv++)
            free(*kv);
        free(env);
        return NULL;
    }
    struct nm_config *c = build(root, opts, path, env, errs);
    json_decref(root);
    return c;
}

struct nm_config *nm_config_reload(const struct nm_config *live, struct cfg_errors *errs)
{
    struct nm_config_opts opts = {
        .config_path = live->config_path,
        .role = live->opt_role,
        .env = nm_env_from_array,
        .env_ud = live->env_kv,
        .motor_bin = live->motor_bin,
    };
    return nm_config_load(&opts, errs);
}

void nm_config_set_motor_bin(struct nm_config *c, const char *path)
{
    set_str(&c->motor_bin, path);
}

int nm_config_dp_store_port(const struct nm_config *c, int64_t dp_master_rank)
{
    if (dp_master_rank < 0 || dp_master_rank > 65535)
        return -ERANGE;
    int64_t port = c->dp_master_port + dp_master_rank;
    if (port < 1 || port > 65535)
        return -ERANGE;
    return (int)port;
}

void nm_config_free(struct nm_config *c)
{
    if (!c)
        return;
    free(c->config_path);
    free(c->role_section);
    free(c->motor_bin);
    wire_strlist_release(&c->warnings);
    free(c->pod_ip);
    tls_release(&c->mgmt_tls);
    tls_release(&c->infer_tls);
    free(c->controller_host);
    free(c->service_ports);
    free(c->job_name);
    free(c->model_name);
    wire_strlist_release(&c->dispatch_capabilities);
    free(c->hardware_type);
    free(c->snapshot_metadata_path);
    free(c->startup_cache_root);
    free(c->log_level);
    free(c->host_log_dir);
    free(c->port_alloc_bind_host);
    struct nm_kv_store *kv = &c->kv;
    free(kv->service);
    free(kv->local_service_mode);
    free(kv->local_config_path);
    free(kv->store_mode);
    free(kv->global_segment_size);
    free(kv->local_buffer_size);
    free(kv->metadata_server);
    free(kv->protocol);
    free(kv->device_name);
    wire_strlist_release(&kv->local_service_command);
    json_decref(c->engine_config);
    free(c->dispatch_profile);
    wire_strlist_release(&c->engine_command);
    free(c->management_api_key);
    free(c->management_api_key_file);
    free(c->engine_log_dir);
    free(c->ranktable_path);
    free(c->hccl_path);
    free(c->opt_role);
    for (char **kv2 = c->env_kv; kv2 && *kv2; kv2++)
        free(*kv2);
    free(c->env_kv);
    free(c);
}

/* ---- effective configuration as JSON ------------------------------------------------ */

static json_t *jstr_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *tls_json(const struct nm_tls *t)
{
    return json_pack("{s:b,s:s,s:s,s:s,s:s,s:s}", "enable_tls", t->enable_tls, "ca_file",
                     t->ca_file, "cert_file", t->cert_file, "key_file", t->key_file, "passwd_file",
                     t->passwd_file, "crl_file", t->crl_file);
}

static json_t *ports_json(const int *ports, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        char buf[16];
        snprintf(buf, sizeof(buf), "%d", ports[i]);
        json_array_append_new(a, json_string(buf));
    }
    return a;
}

json_t *nm_config_to_json(const struct nm_config *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "config_path", jstr_or_null(c->config_path));
    json_object_set_new(o, "role", json_string(wire_role_str(c->role)));
    json_object_set_new(o, "role_section", jstr_or_null(c->role_section));
    json_object_set_new(
        o, "api_config",
        json_pack("{s:s,s:i}", "pod_ip", c->pod_ip, "node_manager_port", c->node_manager_port));
    json_object_set_new(o, "mgmt_tls_config", tls_json(&c->mgmt_tls));
    json_object_set_new(o, "infer_tls_config", tls_json(&c->infer_tls));
    json_object_set_new(o, "controller",
                        json_pack("{s:s,s:i,s:b,s:b}", "controller_api_dns", c->controller_host,
                                  "controller_api_port", c->controller_port,
                                  "enable_fault_tolerance", c->controller_enable_fault_tolerance,
                                  "enable_dp_scale_down", c->controller_enable_dp_scale_down));

    json_t *ep = json_object();
    json_object_set_new(ep, "endpoint_num", json_integer(c->endpoint_num));
    json_object_set_new(ep, "base_port", json_integer(c->base_port));
    json_object_set_new(ep, "service_ports", ports_json(c->service_ports, c->endpoint_num));
    json_object_set_new(ep, "bootstrap_port",
                        c->bootstrap_port ? json_integer(c->bootstrap_port) : json_null());
    json_object_set_new(o, "endpoint_config", ep);

    json_t *b = json_object();
    json_object_set_new(b, "job_name", jstr_or_null(c->job_name));
    json_object_set_new(b, "role", json_string(wire_role_str(c->role)));
    json_object_set_new(b, "model_name", json_string(c->model_name));
    json_object_set_new(b, "engine_type", json_string(nm_engine_type_str(c->engine_type)));
    json_object_set_new(b, "dispatch_capabilities",
                        wire_strlist_to_json(&c->dispatch_capabilities));
    json_object_set_new(b, "ft_capability", wire_ft_capability_to_json(&c->ft_capability));
    json_object_set_new(b, "hardware_type", json_string(c->hardware_type));
    json_object_set_new(b, "heartbeat_interval_seconds", json_real(c->heartbeat_interval_seconds));
    json_object_set_new(b, "daemon_loop_interval", json_real(c->daemon_loop_interval));
    json_object_set_new(b, "device_num", json_integer(c->device_num));
    json_object_set_new(b, "parallel_config", wire_parallel_config_to_json(&c->parallel));
    json_object_set_new(b, "dp_master_port", json_integer(c->dp_master_port));
    json_object_set_new(b, "dp_rpc_port", json_integer(c->dp_rpc_port));
    json_object_set_new(b, "enable_multi_endpoints", json_boolean(c->enable_multi_endpoints));
    json_object_set_new(b, "nnodes", json_integer(c->nnodes));
    json_object_set_new(o, "basic_config", b);

    json_object_set_new(o, "snapshot_config",
                        json_pack("{s:b,s:s}", "enable_snapshot", c->enable_snapshot,
                                  "snapshot_metadata_path", c->snapshot_metadata_path));
    const struct nm_ft_config *ft = &c->ft;
    json_t *f = json_object();
    json_object_set_new(f, "enable_fault_tolerance", json_boolean(ft->enable_fault_tolerance));
    json_object_set_new(f, "poll_interval_sec", json_real(ft->poll_interval_sec));
    json_object_set_new(f, "poll_timeout_sec", json_real(ft->poll_timeout_sec));
    json_object_set_new(f, "max_poll_failures", json_integer(ft->max_poll_failures));
    json_object_set_new(f, "max_consecutive_404", json_integer(ft->max_consecutive_404));
    json_object_set_new(f, "unsupported_reprobe_interval_sec",
                        json_real(ft->unsupported_reprobe_interval_sec));
    json_object_set_new(f, "enable_engine_relaunch", json_boolean(ft->enable_engine_relaunch));
    json_object_set_new(f, "engine_restart_wait_timeout_sec",
                        json_real(ft->engine_restart_wait_timeout_sec));
    json_object_set_new(f, "engine_restart_freeze_sec", json_real(ft->engine_restart_freeze_sec));
    json_object_set_new(f, "container_restart_managed",
                        json_boolean(ft->container_restart_managed));
    json_object_set_new(f, "enable_dp_scale_down_proxy",
                        json_boolean(ft->enable_dp_scale_down_proxy));
    json_object_set_new(o, "fault_tolerance_config", f);
    json_object_set_new(o, "vllm_startup_acceleration_config",
                        json_pack("{s:b,s:b,s:s}", "enable_startup_plan", c->enable_startup_plan,
                                  "enable_graph_reuse", c->enable_graph_reuse, "cache_root",
                                  c->startup_cache_root));
    json_object_set_new(o, "logging_config",
                        json_pack("{s:s,s:i,s:s}", "log_level", c->log_level, "log_max_line_length",
                                  c->log_max_line_length, "host_log_dir", c->host_log_dir));
    json_object_set_new(o, "port_allocator_config",
                        json_pack("{s:b,s:i,s:f,s:f,s:s}", "enable", c->port_alloc_enable,
                                  "scan_range", c->port_alloc_scan_range, "probe_timeout_seconds",
                                  c->port_alloc_probe_timeout_seconds,
                                  "remote_check_timeout_seconds",
                                  c->port_alloc_remote_check_timeout_seconds, "bind_host",
                                  c->port_alloc_bind_host));
    const struct nm_single_container *sc = &c->sc;
    json_object_set_new(
        o, "single_container_config",
        json_pack("{s:b,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i}", "single_container_flag", sc->enabled,
                  "index", sc->index, "node_manager_port_offset", sc->node_manager_port_offset,
                  "base_port_offset", sc->base_port_offset, "device_offset", sc->device_offset,
                  "device_num", sc->device_num, "kv_port", sc->kv_port, "lookup_rpc_port",
                  sc->lookup_rpc_port, "dp_rpc_port", sc->dp_rpc_port));
    const struct nm_kv_store *kv = &c->kv;
    json_t *k = json_object();
    json_object_set_new(k, "enabled", json_boolean(kv->enabled));
    json_object_set_new(k, "backend",
                        json_string(kv->backend == NM_KV_MOONCAKE ? "mooncake" : "memcache"));
    json_object_set_new(k, "mode",
                        json_string(kv->mode == NM_KV_SEPARATED ? "separated" : "combined"));
    json_object_set_new(k, "service", jstr_or_null(kv->service));
    json_object_set_new(k, "port", json_integer(kv->port));
    json_object_set_new(k, "local_service_mode", json_string(kv->local_service_mode));
    json_object_set_new(k, "local_config_path", json_string(kv->local_config_path));
    json_object_set_new(k, "store_mode", json_string(kv->store_mode));
    json_object_set_new(k, "global_segment_size", jstr_or_null(kv->global_segment_size));
    json_object_set_new(k, "local_buffer_size", jstr_or_null(kv->local_buffer_size));
    json_object_set_new(k, "store_http_port", json_integer(kv->store_http_port));
    json_object_set_new(k, "metadata_server", json_string(kv->metadata_server));
    json_object_set_new(k, "protocol", json_string(kv->protocol));
    json_object_set_new(k, "device_name", json_string(kv->device_name));
    json_object_set_new(k, "local_service_command",
                        wire_strlist_to_json(&kv->local_service_command));
    json_object_set_new(o, "kv_cache_store_config", k);
    const struct nm_health *h = &c->health;
    json_object_set_new(
        o, "health_check_config",
        json_pack("{s:i,s:i,s:i,s:b,s:i,s:i,s:f}", "health_collector_timeout",
                  h->health_collector_timeout, "health_collector_timeout_retry_attempts",
                  h->health_collector_timeout_retry_attempts, "startup_timeout", h->startup_timeout,
                  "enable_virtual_inference", h->enable_virtual_inference, "npu_usage_threshold",
                  h->npu_usage_threshold, "max_failure_count", h->max_failure_count,
                  "virtual_inference_timeout", h->virtual_inference_timeout));
    json_t *eng = json_object();
    json_object_set_new(eng, "engine_type", json_string(nm_engine_type_str(c->engine_type)));
    json_object_set_new(eng, "engine_config", json_deep_copy(c->engine_config));
    json_object_set_new(eng, "dispatch_profile", jstr_or_null(c->dispatch_profile));
    json_object_set_new(eng, "engine_command", wire_strlist_to_json(&c->engine_command));
    json_object_set_new(eng, "motor_bin", jstr_or_null(c->motor_bin));
    json_object_set_new(o, "engine", eng);

    json_t *m = json_object();
    json_object_set_new(
        m, "restart_policy",
        json_string(c->restart_policy == NM_RESTART_LOCAL ? "local" : "controller"));
    json_object_set_new(m, "restart_backoff_initial_sec",
                        json_real(c->restart_backoff_initial_sec));
    json_object_set_new(m, "restart_backoff_max_sec", json_real(c->restart_backoff_max_sec));
    json_object_set_new(m, "restart_reset_after_sec", json_real(c->restart_reset_after_sec));
    json_object_set_new(m, "restart_start_limit", json_integer(c->restart_start_limit));
    json_object_set_new(m, "standalone", json_boolean(c->standalone));
    json_object_set_new(m, "management_api_key",
                        c->management_api_key ? json_string("<redacted>") : json_null());
    json_object_set_new(m, "management_api_key_file", jstr_or_null(c->management_api_key_file));
    json_object_set_new(m, "engine_log_dir", json_string(c->engine_log_dir));
    json_object_set_new(m, "engine_log_rotation_size",
                        json_integer(c->engine_log_rotation_bytes >> 20));
    json_object_set_new(m, "engine_log_rotation_count", json_integer(c->engine_log_rotation_count));
    json_object_set_new(m, "stop_grace_seconds", json_real(c->stop_grace_seconds));
    json_object_set_new(o, "motor", m);

    json_object_set_new(o, "env",
                        json_pack("{s:o,s:o}", "RANKTABLE_PATH", jstr_or_null(c->ranktable_path),
                                  "HCCL_PATH", jstr_or_null(c->hccl_path)));
    json_object_set_new(o, "warnings", wire_strlist_to_json(&c->warnings));
    return o;
}

char *nm_config_diff(const struct nm_config *a, const struct nm_config *b)
{
    json_t *ja = nm_config_to_json(a), *jb = nm_config_to_json(b);
    struct strbuf sb;
    strbuf_init(&sb, 4096);
    const char *key;
    json_t *va;
    json_object_foreach(ja, key, va)
    {
        if (strcmp(key, "warnings") == 0)
            continue;
        if (!json_equal(va, json_object_get(jb, key))) {
            if (sb.len)
                (void)strbuf_putc(&sb, ',');
            (void)strbuf_puts(&sb, key);
        }
    }
    json_decref(ja);
    json_decref(jb);
    if (sb.len == 0) {
        strbuf_release(&sb);
        return NULL;
    }
    return strbuf_take(&sb);
}
