/* nm_config — load, validate and derive the node manager's configuration (§3).
 *
 * The keys are the rows of one table (below; common/cfgtab.h): defaults, parsing with
 * every error collected, the effective dump (--check-config), the reload diff and the
 * docs' key table come from it. What remains by hand is the loader's order (which block,
 * which section, which prefix), the engine section's normalisation and the derived
 * values of §3.4. */
#include "nodemgr/nm_config.h"

#include "common/cfgtab.h"
#include "common/jval.h"
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

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

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
static const char *const role_names[] = {"encode", "prefill", "decode", "union", NULL};
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
/* The local address peers reach this pod by, for a pod_ip that is not configured: the
 * source address of the route to the Controller when its host is a numeric IPv4 address
 * (a UDP connect sends nothing; no DNS lookup at startup), else the first IPv4 address of
 * an interface that is up and not loopback (a pod's eth0), else NULL (127.0.0.1 stays). */
static char *routable_ip(const char *ctl_host, int ctl_port)
{
    char buf[INET_ADDRSTRLEN] = "";
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ctl_port)};
    if (ctl_host && inet_pton(AF_INET, ctl_host, &to.sin_addr) == 1) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in me;
        socklen_t len = sizeof(me);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&to, sizeof(to)) == 0 &&
            getsockname(fd, (struct sockaddr *)&me, &len) == 0 && me.sin_addr.s_addr != 0)
            inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf));
        if (fd >= 0)
            close(fd);
        if (*buf)
            return xstrdup(buf);
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !*buf; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
                (i->ifa_flags & IFF_LOOPBACK))
                continue;
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof(buf));
        }
        freeifaddrs(ifs);
    }
    return *buf ? xstrdup(buf) : NULL;
}

static const char *env_set(const struct nm_config *c, const char *name)
{
    const char *v = nm_config_env(c, name);
    return (v && *v) ? v : NULL;
}

/* ---- loader state ------------------------------------------------------------------- */

struct loader {
    struct nm_config *c;
    struct cfg_errors *e;
    struct cfgtab_ctx tab; /* the table's context: errors, environment, given keys */
    char *base;            /* the caller's prefix */
    json_t *root;
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

/* ---- the keys ------------------------------------------------------------------------ */

/* The source blocks rows are read from (applied by build() in this order of appearance). */
enum {
    SRC_NM,       /* motor_nodemanger_config: top level, then the role section's */
    SRC_DEPLOY,   /* motor_deploy_config */
    SRC_SNAPSHOT, /* motor_container_snapshot_config */
    SRC_CTL,      /* motor_controller_config */
    SRC_SECTION,  /* motor_engine_<role>_config */
    SRC_HEALTH,   /* its health_check_config */
    SRC_KV,       /* kv_cache_store_config */
};
static const char *const src_names[] = {
    "",
    "motor_deploy_config",
    "motor_container_snapshot_config",
    "motor_controller_config",
    "motor_engine_<role>_config",
    "motor_engine_<role>_config.health_check_config",
    "kv_cache_store_config",
};

static const char *nonempty_key(const char **s, char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    return **s ? NULL : "must not be empty (omit it to disable the key)";
}

static const char *absolute_path(const char **s, char *buf, size_t cap)
{
    if (!**s || **s == '/')
        return NULL;
    snprintf(buf, cap, "must be an absolute path, got \"%.160s\"", *s);
    return buf;
}

/* basic_config.parallel_config: used only when the role has no engine section; the
 * effective sizes (c->parallel) are what is shown. */
static void parallel_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                           struct cfgtab_ctx *ctx)
{
    struct nm_config *c = base;
    if (!cfg_read_object(v, path, ctx->errs))
        return;
    json_decref(c->user_parallel);
    c->user_parallel = json_incref(v);
}

static json_t *parallel_dump(const struct cfgtab_row *r, const void *base)
{
    return wire_parallel_config_to_json(&((const struct nm_config *)base)->parallel);
}

static void parallel_release(const struct cfgtab_row *r, void *base)
{
    struct nm_config *c = base;
    json_decref(c->user_parallel);
    c->user_parallel = NULL;
}

static const struct cfgtab_ops parallel_ops = {
    .parse = parallel_parse, .dump = parallel_dump, .release = parallel_release};

/* Derived keys a user may still write: dropped with a warning. */
static void caps_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                       struct cfgtab_ctx *ctx)
{
    if (cfg_read_array(v, path, ctx->errs) && json_array_size(v) > 0)
        warn(base, "basic_config.dispatch_capabilities is derived from the engine section; the "
                   "configured value is ignored");
}
static const struct cfgtab_ops caps_ops = {.parse = caps_parse};

static void proxy_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                        struct cfgtab_ctx *ctx)
{
    warn(base, "fault_tolerance_config.enable_dp_scale_down_proxy is derived from "
               "motor_controller_config.fault_tolerance_config (enable_fault_tolerance && "
               "enable_dp_scale_down); the configured value is ignored");
}
static const struct cfgtab_ops proxy_ops = {.parse = proxy_parse};

static void engine_command_parse(const struct cfgtab_row *r, void *base, json_t *arr,
                                 const char *path, struct cfgtab_ctx *ctx)
{
    struct nm_config *c = base;
    struct loader *L = ctx->ud;
    if (!cfg_read_array(arr, path, L->e))
        return;
    L->engine_command_given = json_array_size(arr) > 0;
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        char p[48];
        snprintf(p, sizeof(p), "engine_command[%zu]", i);
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            cfg_error(L->e, p, "must be a string without NUL characters");
            continue;
        }
        char bad[96];
        if (nm_config_check_template(json_string_value(v), bad, sizeof(bad)) < 0)
            cfg_error(L->e, p,
                      "%s (known: {host} {port} {dp_rank} {dp_size} {node_rank} "
                      "{master_addr} {instance_id} {role} {model})",
                      bad);
        wire_strlist_push(&c->engine_command, json_string_value(v));
    }
}
static const struct cfgtab_ops engine_command_ops = {.parse = engine_command_parse};

/* kv_cache_store_config.mode: anything but "separated" is combined (with a warning). */
static void kv_mode_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                          struct cfgtab_ctx *ctx)
{
    struct nm_config *c = base;
    const char *mode;
    if (!cfg_read_string(v, path, &mode, ctx->errs))
        return;
    c->kv.mode = strcmp(mode, "separated") == 0 ? NM_KV_SEPARATED : NM_KV_COMBINED;
    if (c->kv.mode == NM_KV_COMBINED && strcmp(mode, "combined") != 0)
        warn(c, "kv_cache_store_config.mode \"%s\" is not combined/separated; using combined",
             mode);
}
static const struct cfgtab_ops kv_mode_ops = {.parse = kv_mode_parse};

/* Sizes: "1GB" as written, or a non-negative integer kept as its digits. */
static void kv_size_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                          struct cfgtab_ctx *ctx)
{
    char **dst = (char **)((char *)base + r->off);
    char *s = NULL;
    if (jval_numstr(v, SIZE_MAX, &s) != JVAL_OK) {
        cfg_error(ctx->errs, path, "must be a size string (\"1GB\") or a non-negative integer");
        return;
    }
    free(*dst);
    *dst = s;
}
static const struct cfgtab_ops kv_size_ops = {.parse = kv_size_parse};

static json_t *service_ports_dump(const struct cfgtab_row *r, const void *base)
{
    const struct nm_config *c = base;
    json_t *a = json_array();
    for (int i = 0; i < c->endpoint_num; i++) {
        char buf[16];
        snprintf(buf, sizeof(buf), "%d", c->service_ports[i]);
        json_array_append_new(a, json_string(buf));
    }
    return a;
}

static void service_ports_release(const struct cfgtab_row *r, void *base)
{
    struct nm_config *c = base;
    free(c->service_ports);
    c->service_ports = NULL;
}
static const struct cfgtab_ops service_ports_ops = {.dump = service_ports_dump,
                                                    .release = service_ports_release};

static json_t *bootstrap_dump(const struct cfgtab_row *r, const void *base)
{
    int port = ((const struct nm_config *)base)->bootstrap_port;
    return port ? json_integer(port) : json_null();
}
static const struct cfgtab_ops bootstrap_ops = {.dump = bootstrap_dump};

static json_t *ft_capability_dump(const struct cfgtab_row *r, const void *base)
{
    return wire_ft_capability_to_json(&((const struct nm_config *)base)->ft_capability);
}
static const struct cfgtab_ops ft_capability_ops = {.dump = ft_capability_dump};

#define TOFF(f) offsetof(struct nm_tls, f)

/* The keys every TLS block has. */
#define TLS_ROWS                                                                                   \
    {"enable_tls", CFGTAB_BOOL, TOFF(enable_tls), .doc = "turns it on"},                           \
        {"ca_file", CFGTAB_STRING, TOFF(ca_file), .def_s = "security/mgmt/cert/ca.crt"},           \
        {"cert_file", CFGTAB_STRING, TOFF(cert_file), .def_s = "security/mgmt/cert/server.crt"},   \
        {"key_file", CFGTAB_STRING, TOFF(key_file), .def_s = "security/mgmt/keys/server.key"},     \
        {"passwd_file", CFGTAB_STRING, TOFF(passwd_file),                                          \
         .def_s = "security/mgmt/keys/key_pwd.txt"},                                               \
    {                                                                                              \
        "crl_file", CFGTAB_STRING, TOFF(crl_file),                                                 \
            .def_s = "",                                                                           \
            .doc = "PEM CRLs of the CA: a revoked client certificate fails the handshake (needs "  \
                   "ca_file)"                                                                      \
    }

static const struct cfgtab_row tls_rows[] = {TLS_ROWS};
static const struct cfgtab tls_table = CFGTAB_TABLE("tls", tls_rows, NULL);

/* infer_tls_config: how the engines are probed. */
static const struct cfgtab_row infer_tls_rows[] = {
    TLS_ROWS,
    {"engine_tls", CFGTAB_BOOL, TOFF(engine_tls), .flags = CFGTAB_MOTOR | CFGTAB_NODUMP, .def_i = 1,
     .doc = "the engines serve TLS (probes over https); false = the engines are plain HTTP "
            "behind a TLS coordinator"},
};
static const struct cfgtab infer_tls_table = CFGTAB_TABLE("infer_tls", infer_tls_rows, NULL);

#define OFF(f) offsetof(struct nm_config, f)
#define LIST(f) OFF(f.items), OFF(f.n)
#define L CFGTAB_LIVE
#define M CFGTAB_MOTOR
#define D CFGTAB_DERIVED

static const char *const policy_names[] = {"controller", "local", NULL};
static const char *const profile_names[] = {"handoff", "trigger", NULL};
static const char *const kv_backend_names[] = {"memcache", "mooncake", NULL};
static const char *const kv_mode_names[] = {"combined", "separated", NULL};
static const char *const kv_lsm_names[] = {"standalone", "inprocess", NULL};
static const char *const kv_store_mode_names[] = {"", "embedded", "standalone", NULL};

/* In the order the blocks were always read (error reports keep that order); derived
 * values next to the keys they come from, at their place in the dump. */
static const struct cfgtab_row rows[] = {
    {"config_path", CFGTAB_STRING, OFF(config_path), .flags = L | D},
    {"role", CFGTAB_ENUM, OFF(role), .flags = D, .names = role_names},
    {"role_section", CFGTAB_STRING, OFF(role_section), .flags = D},

    /* motor_nodemanger_config */
    {"api_config.pod_ip", CFGTAB_STRING, OFF(pod_ip), .flags = CFGTAB_NONEMPTY, .env = "POD_IP",
     .def_s = "127.0.0.1", .def_doc = "`$POD_IP`, else detected",
     .doc = "registered pod IP, the IP every start-command endpoint must carry, the API bind "
            "address; unset (no key, no `$POD_IP`): the API binds 0.0.0.0 and advertises the "
            "source address of the route to a numeric Controller IP, else the first non-loopback "
            "interface address, else 127.0.0.1"},
    {"api_config.bind_host", CFGTAB_STRING, OFF(bind_host), .flags = D, .dump = "motor.bind_host"},
    {"api_config.pod_ip_detected", CFGTAB_BOOL, OFF(pod_ip_detected), .flags = D,
     .dump = "motor.pod_ip_detected"},
    {"api_config.node_manager_port", CFGTAB_INT, OFF(node_manager_port), .min = 1, .max = 65535,
     .def_i = 1026, .doc = "API port (single container: + index)"},
    {"mgmt_tls_config", CFGTAB_GROUP, OFF(mgmt_tls), .sub = &tls_table,
     .doc = "HTTPS on the API (a readable `ca_file` makes it mutual TLS) and towards the "
            "Controller"},
    {"endpoint_config.endpoint_num", CFGTAB_INT, OFF(endpoint_num), .flags = D},
    {"endpoint_config.base_port", CFGTAB_INT, OFF(base_port), .min = 0, .max = 65535,
     .def_i = 10000,
     .doc = "engine business ports `base_port + 2i` (applies to the next start command)"},
    {"endpoint_config.service_ports", CFGTAB_CUSTOM, OFF(service_ports), .flags = D,
     .ops = &service_ports_ops},
    {"endpoint_config.bootstrap_port", CFGTAB_CUSTOM, OFF(bootstrap_port), .flags = L | D,
     .ops = &bootstrap_ops},
    {"basic_config.job_name", CFGTAB_STRING, OFF(job_name), .flags = L | CFGTAB_NONEMPTY,
     .env = "JOB_NAME", .doc = "required to register; start commands must carry it"},
    {"basic_config.role", CFGTAB_ENUM, OFF(role), .flags = D, .names = role_names},
    {"basic_config.model_name", CFGTAB_STRING, OFF(model_name), .flags = L,
     .doc = "used only when the role has no engine section (else served_model_name / model)"},
    {"basic_config.engine_type", CFGTAB_ENUM, OFF(engine_type), .flags = L,
     .names = engine_type_names, .doc = "used only when the role has no engine section"},
    {"basic_config.dispatch_capabilities", CFGTAB_STRLIST, LIST(dispatch_capabilities), .flags = L,
     .ops = &caps_ops, .type_doc = "derived",
     .doc = "derived from the engine section; a configured value is dropped with a warning"},
    {"basic_config.ft_capability", CFGTAB_CUSTOM, OFF(ft_capability), .flags = L | D,
     .ops = &ft_capability_ops},
    {"basic_config.hardware_type", CFGTAB_STRING, OFF(hardware_type), .flags = L,
     .def_s = "800I-A3", .doc = "`motor_deploy_config.hardware_type` wins"},
    {"basic_config.heartbeat_interval_seconds", CFGTAB_DOUBLE, OFF(heartbeat_interval_seconds),
     .flags = L, .min = 0.001, .max = 3600, .def_d = 3,
     .doc = "heartbeat period and suicide-arbitration period"},
    {"basic_config.daemon_loop_interval", CFGTAB_DOUBLE, OFF(daemon_loop_interval), .flags = L,
     .min = 0.01, .max = 3600, .def_d = 5, .doc = "period of the services' health checks"},
    {"basic_config.device_num", CFGTAB_INT, OFF(device_num), .flags = L, .min = 0,
     .max = WIRE_SIZE_MAX, .def_doc = "0 = derived",
     .doc = "devices of the pod (endpoints = min(dp, devices / local world size))"},
    {"basic_config.enable_multi_endpoints", CFGTAB_BOOL, OFF(enable_multi_endpoints), .flags = L,
     .def_i = 1, .doc = "false: one endpoint per pod"},
    {"basic_config.nnodes", CFGTAB_INT, OFF(nnodes), .flags = L, .min = 1, .max = WIRE_SIZE_MAX,
     .def_i = 1, .doc = "used only when the role has no engine section"},
    {"basic_config.parallel_config", CFGTAB_CUSTOM, OFF(user_parallel), .flags = L,
     .ops = &parallel_ops, .doc = "used only when the role has no engine section"},
    {"basic_config.dp_master_port", CFGTAB_INT, OFF(dp_master_port), .flags = L | D},
    {"basic_config.dp_rpc_port", CFGTAB_INT, OFF(dp_rpc_port), .flags = L | D},
    {"snapshot_config.enable_snapshot", CFGTAB_BOOL, OFF(enable_snapshot),
     .doc = "vllm only; turns the config watch off"},
    {"snapshot_config.snapshot_metadata_path", CFGTAB_STRING, OFF(snapshot_metadata_path),
     .def_s = ""},
    {"fault_tolerance_config.enable_fault_tolerance", CFGTAB_BOOL, OFF(ft.enable_fault_tolerance),
     .flags = L, .doc = "engine FT polling; also on when the engine section advertises FT"},
    {"fault_tolerance_config.poll_interval_sec", CFGTAB_DOUBLE, OFF(ft.poll_interval_sec),
     .flags = L, .min = 0.01, .max = 3600, .def_d = 1, .doc = "FT status poll period"},
    {"fault_tolerance_config.poll_timeout_sec", CFGTAB_DOUBLE, OFF(ft.poll_timeout_sec), .flags = L,
     .min = 0.01, .max = 3600, .def_d = 5,
     .doc = "FT poll timeout (also bounds the proxy's status/apply calls)"},
    {"fault_tolerance_config.max_poll_failures", CFGTAB_INT, OFF(ft.max_poll_failures), .flags = L,
     .min = 1, .max = 1000000, .def_i = 3,
     .doc = "accepted, not used: the first failed poll during runtime reports DEAD (seed 002)"},
    {"fault_tolerance_config.max_consecutive_404", CFGTAB_INT, OFF(ft.max_consecutive_404),
     .flags = L, .min = 1, .max = 1000000, .def_i = 3,
     .doc = "404s in a row → the engine has no FT API (\"unsupported\")"},
    {"fault_tolerance_config.unsupported_reprobe_interval_sec", CFGTAB_DOUBLE,
     OFF(ft.unsupported_reprobe_interval_sec), .flags = L, .min = 0.01, .max = 86400, .def_d = 60,
     .doc = "an \"unsupported\" engine is probed again this often"},
    {"fault_tolerance_config.enable_engine_relaunch", CFGTAB_BOOL, OFF(ft.enable_engine_relaunch),
     .flags = L, .def_i = 1, .def_doc = "the Controller's, true",
     .doc = "freeze suicide after an accepted death report"},
    {"fault_tolerance_config.engine_restart_wait_timeout_sec", CFGTAB_DOUBLE,
     OFF(ft.engine_restart_wait_timeout_sec), .flags = L, .min = 60, .max = 3600, .def_d = 180,
     .doc = "that freeze"},
    {"fault_tolerance_config.engine_restart_freeze_sec", CFGTAB_DOUBLE,
     OFF(ft.engine_restart_freeze_sec), .flags = L, .min = 120, .max = 7200, .def_d = 720,
     .doc = "freeze during an in-place relaunch"},
    {"fault_tolerance_config.container_restart_managed", CFGTAB_BOOL,
     OFF(ft.container_restart_managed), .flags = L,
     .def_doc = "auto: true iff `$KUBERNETES_SERVICE_HOST` or `$POD_NAMESPACE`",
     .doc = "false: never commit suicide (docker, systemd)"},
    {"fault_tolerance_config.enable_dp_scale_down_proxy", CFGTAB_BOOL,
     OFF(ft.enable_dp_scale_down_proxy), .flags = L, .ops = &proxy_ops, .type_doc = "derived",
     .doc = "derived from the Controller's block; a configured value is ignored with a warning"},
    {"vllm_startup_acceleration_config.enable_startup_plan", CFGTAB_BOOL, OFF(enable_startup_plan),
     .flags = L, .doc = "vllm only"},
    {"vllm_startup_acceleration_config.enable_graph_reuse", CFGTAB_BOOL, OFF(enable_graph_reuse),
     .flags = L, .doc = "vllm only"},
    {"vllm_startup_acceleration_config.cache_root", CFGTAB_STRING, OFF(startup_cache_root),
     .flags = L, .def_s = "", .check = absolute_path, .doc = "\"\" or an absolute path"},
    {"logging_config.log_level", CFGTAB_STRING, OFF(log_level), .flags = L, .def_s = "INFO",
     .check = cfgtab_check_log_level, .type_doc = "DEBUG, INFO, WARNING, ERROR (any case)",
     .doc = "the node manager's own log level"},
    {"logging_config.log_max_line_length", CFGTAB_INT, OFF(log_max_line_length), .flags = L,
     .min = 1, .max = 1 << 24, .def_i = 8192,
     .doc = "longer engine output lines are truncated in the tail and files"},
    {"logging_config.host_log_dir", CFGTAB_STRING, OFF(host_log_dir), .flags = L,
     .def_s = "/root/ascend/log"},
    {"port_allocator_config.enable", CFGTAB_BOOL, OFF(port_alloc_enable), .def_i = 1,
     .doc = "probe-bind the API and engine ports at start; a busy one moves (§3.8)"},
    {"port_allocator_config.scan_range", CFGTAB_INT, OFF(port_alloc_scan_range), .min = 0,
     .max = 65535, .def_i = 100, .doc = "ports tried above a busy one"},
    {"port_allocator_config.probe_timeout_seconds", CFGTAB_DOUBLE,
     OFF(port_alloc_probe_timeout_seconds), .min = 0.001, .max = 60, .def_d = 0.5,
     .doc = "a busy port is probed again this long"},
    {"port_allocator_config.remote_check_timeout_seconds", CFGTAB_DOUBLE,
     OFF(port_alloc_remote_check_timeout_seconds), .min = 0.001, .max = 60, .def_d = 1,
     .doc = "accepted, unused"},
    {"port_allocator_config.bind_host", CFGTAB_STRING, OFF(port_alloc_bind_host),
     .def_s = "0.0.0.0", .doc = "where ports are probed"},
    {"restart_policy", CFGTAB_ENUM, OFF(restart_policy), .flags = L | M, .names = policy_names,
     .dump = "motor.restart_policy",
     .doc = "`controller`: report deaths, wait for `/engine-restart`; `local`: restart here"},
    {"restart_backoff_initial_sec", CFGTAB_DOUBLE, OFF(restart_backoff_initial_sec), .flags = L | M,
     .min = 0, .max = 3600, .def_d = 1, .dump = "motor.restart_backoff_initial_sec",
     .doc = "local restarts wait 1, 2, 4, … s (0 = at once)"},
    {"restart_backoff_max_sec", CFGTAB_DOUBLE, OFF(restart_backoff_max_sec), .flags = L | M,
     .min = 0, .max = 86400, .def_d = 60, .dump = "motor.restart_backoff_max_sec",
     .doc = "… up to this"},
    {"restart_reset_after_sec", CFGTAB_DOUBLE, OFF(restart_reset_after_sec), .flags = L | M,
     .min = 1, .max = 604800, .def_d = 600, .dump = "motor.restart_reset_after_sec",
     .doc = "ready this long before dying resets the backoff and the count"},
    {"restart_start_limit", CFGTAB_INT, OFF(restart_start_limit), .flags = L | M, .min = 0,
     .max = 1000000, .def_i = 10, .dump = "motor.restart_start_limit",
     .doc = "restarts within one reset window before the endpoint is `failed` (0 = unlimited)"},
    {"standalone", CFGTAB_BOOL, OFF(standalone), .flags = M, .dump = "motor.standalone",
     .doc = "no Controller: launch the configured endpoints at boot, never register"},
    {"management_api_key", CFGTAB_STRING, OFF(management_api_key), .flags = L | M | CFGTAB_SECRET,
     .check = nonempty_key, .dump = "motor.management_api_key",
     .doc = "require `X-Motor-Management-Key` on state-changing routes"},
    {"management_api_key_file", CFGTAB_STRING, OFF(management_api_key_file),
     .flags = L | M | CFGTAB_NONEMPTY, .dump = "motor.management_api_key_file",
     .doc = "the key from a file (trailing whitespace trimmed; read again on every reload, the "
            "file is watched); not with `management_api_key`"},
    {"engine_log_dir", CFGTAB_STRING, OFF(engine_log_dir), .flags = L | M, .def_s = "",
     .dump = "motor.engine_log_dir", .doc = "rotated files `engine-<id>.log` (none when empty)"},
    {"engine_log_rotation_size", CFGTAB_INT64, OFF(engine_log_rotation_bytes), .flags = L | M,
     .min = 1, .max = 10240, .def_i = 20, .scale = 1 << 20,
     .dump = "motor.engine_log_rotation_size", .doc = "MiB per file"},
    {"engine_log_rotation_count", CFGTAB_INT, OFF(engine_log_rotation_count), .flags = L | M,
     .min = 1, .max = 1000, .def_i = 10, .dump = "motor.engine_log_rotation_count",
     .doc = "files kept per endpoint"},
    {"stop_grace_seconds", CFGTAB_DOUBLE, OFF(stop_grace_seconds), .flags = L | M, .min = 0,
     .max = 3600, .def_d = 10, .dump = "motor.stop_grace_seconds",
     .doc = "SIGTERM → SIGKILL grace of an engine process group"},

    /* overrides from the deploy and snapshot blocks */
    {"hardware_type", CFGTAB_STRING, OFF(hardware_type), .src = SRC_DEPLOY,
     .flags = L | CFGTAB_OVERRIDE,
     .doc = "`800I_A2`, `800I_A3`, `Ascend950`; overrides `basic_config.hardware_type`"},
    {"tls_config.mgmt_tls_config", CFGTAB_GROUP, OFF(mgmt_tls), .src = SRC_DEPLOY,
     .flags = CFGTAB_OVERRIDE | CFGTAB_IFPRESENT, .sub = &tls_table,
     .doc = "overrides `mgmt_tls_config`"},
    {"tls_config.infer_tls_config", CFGTAB_GROUP, OFF(infer_tls), .src = SRC_DEPLOY,
     .flags = L | CFGTAB_IFPRESENT, .sub = &infer_tls_table, .dump = "infer_tls_config",
     .doc = "HTTPS towards the engines (probes)"},
    {"enable_snapshot", CFGTAB_BOOL, OFF(enable_snapshot), .src = SRC_SNAPSHOT,
     .flags = CFGTAB_OVERRIDE, .doc = "overrides `snapshot_config.enable_snapshot`"},
    {"snapshot_metadata_path", CFGTAB_STRING, OFF(snapshot_metadata_path), .src = SRC_SNAPSHOT,
     .flags = CFGTAB_OVERRIDE, .doc = "overrides `snapshot_config.snapshot_metadata_path`"},

    /* motor_controller_config: where the Controller is and what it does */
    {"api_config.controller_api_dns", CFGTAB_STRING, OFF(controller_host), .src = SRC_CTL,
     .flags = L | CFGTAB_NONEMPTY, .env = "CONTROLLER_SERVICE", .def_s = DEFAULT_CONTROLLER_DNS,
     .dump = "controller.controller_api_dns", .doc = "the Controller's address"},
    {"api_config.controller_api_port", CFGTAB_INT, OFF(controller_port), .src = SRC_CTL, .flags = L,
     .min = 1, .max = 65535, .def_i = 1026, .dump = "controller.controller_api_port",
     .doc = "the Controller's port"},
    {"fault_tolerance_config.enable_fault_tolerance", CFGTAB_BOOL,
     OFF(controller_enable_fault_tolerance), .src = SRC_CTL, .flags = L, .def_i = 1,
     .dump = "controller.enable_fault_tolerance",
     .doc = "with `enable_dp_scale_down`: the DP scale-down proxy routes are on"},
    {"fault_tolerance_config.enable_dp_scale_down", CFGTAB_BOOL,
     OFF(controller_enable_dp_scale_down), .src = SRC_CTL, .flags = L,
     .dump = "controller.enable_dp_scale_down"},
    {"fault_tolerance_config.enable_engine_relaunch", CFGTAB_BOOL,
     OFF(controller_enable_engine_relaunch), .src = SRC_CTL, .flags = L | CFGTAB_NODUMP, .def_i = 1,
     .doc = "the default of `fault_tolerance_config.enable_engine_relaunch`"},

    /* the engine section */
    {"engine_type", CFGTAB_ENUM, OFF(engine_type), .src = SRC_SECTION, .flags = L | CFGTAB_OVERRIDE,
     .names = engine_type_names, .def_doc = "`vllm`",
     .doc = "`sim`: `motor engine-sim` with vLLM's flags; `cmd`: the `engine_command` template"},
    {"dispatch_profile", CFGTAB_STRING, OFF(dispatch_profile), .src = SRC_SECTION, .flags = L | M,
     .names = profile_names, .dump = "engine.dispatch_profile",
     .doc = "overrides the capability derived from the KV connector"},
    {"engine_command", CFGTAB_STRLIST, LIST(engine_command), .src = SRC_SECTION, .flags = L | M,
     .ops = &engine_command_ops, .dump = "engine.engine_command",
     .doc = "`cmd` only: argv template with {host} {port} {dp_rank} {dp_size} {node_rank} "
            "{master_addr} {instance_id} {role} {model}"},
    {"engine.engine_type", CFGTAB_ENUM, OFF(engine_type), .flags = L | D,
     .names = engine_type_names},
    {"engine.engine_config", CFGTAB_CUSTOM, OFF(engine_config), .flags = L | D,
     .ops = &cfgtab_ops_json},
    {"engine.motor_bin", CFGTAB_STRING, OFF(motor_bin), .flags = L | D},
    {"health_collector_timeout", CFGTAB_INT, OFF(health.health_collector_timeout),
     .src = SRC_HEALTH, .flags = L, .min = 1, .max = 3600, .def_i = 5,
     .dump = "health_check_config.health_collector_timeout", .doc = "`/health` probe timeout, s"},
    {"health_collector_timeout_retry_attempts", CFGTAB_INT,
     OFF(health.health_collector_timeout_retry_attempts), .src = SRC_HEALTH, .flags = L, .min = 1,
     .max = 100, .def_i = 3, .dump = "health_check_config.health_collector_timeout_retry_attempts",
     .doc = "attempts per probe (only timeouts are retried)"},
    {"startup_timeout", CFGTAB_INT, OFF(health.startup_timeout), .src = SRC_HEALTH, .flags = L,
     .min = 1, .max = 604800, .def_i = 1800, .dump = "health_check_config.startup_timeout",
     .doc = "model-load window, s: failing probes keep `starting` until then"},
    {"enable_virtual_inference", CFGTAB_BOOL, OFF(health.enable_virtual_inference),
     .src = SRC_HEALTH, .flags = L, .dump = "health_check_config.enable_virtual_inference"},
    {"npu_usage_threshold", CFGTAB_INT, OFF(health.npu_usage_threshold), .src = SRC_HEALTH,
     .flags = L, .min = 0, .max = 100, .def_i = 3,
     .dump = "health_check_config.npu_usage_threshold"},
    {"max_failure_count", CFGTAB_INT, OFF(health.max_failure_count), .src = SRC_HEALTH, .flags = L,
     .min = 1, .max = 1000000, .def_i = 6, .dump = "health_check_config.max_failure_count"},
    {"virtual_inference_timeout", CFGTAB_DOUBLE, OFF(health.virtual_inference_timeout),
     .src = SRC_HEALTH, .flags = L, .min = 0.001, .max = 3600, .def_d = 5,
     .dump = "health_check_config.virtual_inference_timeout"},

    /* kv_cache_store_config (§3.5) */
    {"kv_cache_store_config.enabled", CFGTAB_BOOL, OFF(kv.enabled), .flags = D},
    {"backend", CFGTAB_ENUM, OFF(kv.backend), .src = SRC_KV, .names = kv_backend_names,
     .def_doc = "`$KV_STORE_BACKEND` or `memcache`", .dump = "kv_cache_store_config.backend",
     .doc = "the section (or `$KV_STORE_BACKEND`) enables the KV-store service"},
    {"mode", CFGTAB_ENUM, OFF(kv.mode), .src = SRC_KV, .names = kv_mode_names, .ops = &kv_mode_ops,
     .def_doc = "`combined`", .dump = "kv_cache_store_config.mode",
     .doc = "`combined`: engines + KV service; `separated`: KV service only"},
    {"service", CFGTAB_STRING, OFF(kv.service), .src = SRC_KV, .flags = L,
     .env = "KVS_MASTER_SERVICE", .dump = "kv_cache_store_config.service"},
    {"port", CFGTAB_INT, OFF(kv.port), .src = SRC_KV, .flags = L, .min = 1, .max = 65535,
     .def_i = 50088, .def_doc = "`$KV_CACHE_STORE_PORT` or 50088",
     .dump = "kv_cache_store_config.port"},
    {"local_service_mode", CFGTAB_STRING, OFF(kv.local_service_mode), .src = SRC_KV, .flags = L,
     .names = kv_lsm_names, .def_s = "inprocess",
     .def_doc = "`$MMC_LOCAL_SERVICE_MODE` or `inprocess`",
     .dump = "kv_cache_store_config.local_service_mode"},
    {"local_config_path", CFGTAB_STRING, OFF(kv.local_config_path), .src = SRC_KV, .flags = L,
     .env = "MMC_LOCAL_CONFIG_PATH",
     .def_s = "/usr/local/Ascend/pyMotor/conf/mmc-local-inprocess.conf",
     .dump = "kv_cache_store_config.local_config_path",
     .doc = "memcache: exported as `MMC_LOCAL_CONFIG_PATH` when the file exists"},
    {"store_mode", CFGTAB_STRING, OFF(kv.store_mode), .src = SRC_KV, .flags = L,
     .names = kv_store_mode_names, .def_s = "", .dump = "kv_cache_store_config.store_mode"},
    {"global_segment_size", CFGTAB_STRING, OFF(kv.global_segment_size), .src = SRC_KV, .flags = L,
     .ops = &kv_size_ops, .type_doc = "size string or integer",
     .dump = "kv_cache_store_config.global_segment_size"},
    {"local_buffer_size", CFGTAB_STRING, OFF(kv.local_buffer_size), .src = SRC_KV, .flags = L,
     .ops = &kv_size_ops, .type_doc = "size string or integer",
     .dump = "kv_cache_store_config.local_buffer_size"},
    {"store_http_port", CFGTAB_INT, OFF(kv.store_http_port), .src = SRC_KV, .flags = L, .min = 0,
     .max = 65535, .dump = "kv_cache_store_config.store_http_port", .doc = "0 = ephemeral"},
    {"metadata_server", CFGTAB_STRING, OFF(kv.metadata_server), .src = SRC_KV, .flags = L,
     .def_s = "P2PHANDSHAKE", .dump = "kv_cache_store_config.metadata_server"},
    {"protocol", CFGTAB_STRING, OFF(kv.protocol), .src = SRC_KV, .flags = L, .def_s = "ascend",
     .dump = "kv_cache_store_config.protocol"},
    {"device_name", CFGTAB_STRING, OFF(kv.device_name), .src = SRC_KV, .flags = L, .def_s = "",
     .dump = "kv_cache_store_config.device_name"},
    {"local_service_command", CFGTAB_STRLIST, LIST(kv.local_service_command), .src = SRC_KV,
     .flags = L | M, .dump = "kv_cache_store_config.local_service_command",
     .doc = "argv of the KV local service the node manager runs and restarts (empty: none)"},

    /* derived at load (§3.4) */
    {"single_container_config.single_container_flag", CFGTAB_BOOL, OFF(sc.enabled), .flags = D},
    {"single_container_config.index", CFGTAB_INT, OFF(sc.index), .flags = D},
    {"single_container_config.node_manager_port_offset", CFGTAB_INT,
     OFF(sc.node_manager_port_offset), .flags = D},
    {"single_container_config.base_port_offset", CFGTAB_INT, OFF(sc.base_port_offset), .flags = D},
    {"single_container_config.device_offset", CFGTAB_INT, OFF(sc.device_offset), .flags = D},
    {"single_container_config.device_num", CFGTAB_INT, OFF(sc.device_num), .flags = D},
    {"single_container_config.kv_port", CFGTAB_INT, OFF(sc.kv_port), .flags = D},
    {"single_container_config.lookup_rpc_port", CFGTAB_INT, OFF(sc.lookup_rpc_port), .flags = D},
    {"single_container_config.dp_rpc_port", CFGTAB_INT, OFF(sc.dp_rpc_port), .flags = D},
    {"env.RANKTABLE_PATH", CFGTAB_STRING, OFF(ranktable_path), .flags = D},
    {"env.HCCL_PATH", CFGTAB_STRING, OFF(hccl_path), .flags = D},
    {"warnings", CFGTAB_STRLIST, LIST(warnings), .flags = L | D},
};

const struct cfgtab nm_config_cfgtab = CFGTAB_TABLE("node manager", rows, src_names);
/* The rows' shorthands end with the table: the loader's functions name their context L
 * (gcc's -Wshadow sees the macro's expansion there). */
#undef L
#undef M
#undef D

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
    at(L, secname);
    json_t *hc = cfg_get_object(sec, "health_check_config", L->e);
    if (!hc)
        return;
    char *p = xasprintf("%s.health_check_config", secname);
    at(L, p);
    free(p);
    cfgtab_apply(&nm_config_cfgtab, SRC_HEALTH, L->c, hc, &L->tab);
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

static void parse_engine_section(struct loader *L, json_t *sec, const char *secname)
{
    struct nm_config *c = L->c;
    struct cfg_errors *e = L->e;
    at(L, secname);
    /* engine_type (the NM block's, else vllm, when absent), dispatch_profile, engine_command */
    cfgtab_apply(&nm_config_cfgtab, SRC_SECTION, c, sec, &L->tab);
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
        if (c->user_parallel) {
            json_t *up = c->user_parallel;
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
        at(L, secname);
    }
    ecpath = xasprintf("%s.engine_config", secname);
    at(L, ecpath);
    free(ecpath);
    c->dp_master_port = get_int(ec, "data_parallel_master_port", 29500, 1, 65535, e);
    /* vLLM's DP group: one store port per rank from the master port on. */
    if (c->parallel.dp_size > 1 && c->dp_master_port + c->parallel.dp_size - 1 > 65535)
        cfg_error(e, "data_parallel_master_port", "%d DP ranks need ports %d..%d, beyond 65535",
                  c->parallel.dp_size, c->dp_master_port,
                  c->dp_master_port + c->parallel.dp_size - 1);
    c->dp_rpc_port = get_int(ec, "data_parallel_rpc_port", 9000, 1, 65535, e);
    if (c->engine_type == NM_ENGINE_SGLANG)
        c->bootstrap_port = get_int(ec, "disaggregation_bootstrap_port", 0, 1, 65535, e);

    /* model name: served name, else the model path, else the NM block's value */
    const char *model = string_or_first(cfg_lookup(ec, "served_model_name"));
    if (!model)
        model = json_string_value(cfg_lookup(ec, "model"));
    if (!model)
        model = json_string_value(cfg_lookup(ec, "model_path"));
    if (model)
        set_str(&c->model_name, model);
    else if (!c->model_name)
        c->model_name = xstrdup("");

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
    cfgtab_apply(&nm_config_cfgtab, SRC_CTL, c, ctl, &L->tab);
    /* The NM block's enable_engine_relaunch, else the Controller's. */
    if (!cfgtab_given(&L->tab, OFF(ft.enable_engine_relaunch)))
        c->ft.enable_engine_relaunch = c->controller_enable_engine_relaunch;
    c->ft.enable_dp_scale_down_proxy =
        c->controller_enable_fault_tolerance && c->controller_enable_dp_scale_down;
}

/* The environment's KV-store defaults (§3.5), validated, then the section's keys. */
static void parse_kv_store(struct loader *L)
{
    struct nm_config *c = L->c;
    struct nm_kv_store *kv = &c->kv;
    struct cfg_errors *e = L->e;
    at(L, NULL);
    json_t *sec = cfg_get_object(L->root, "kv_cache_store_config", e);
    const char *backend_env = env_set(c, "KV_STORE_BACKEND");
    kv->enabled = sec != NULL || backend_env != NULL;
    if (backend_env) {
        if (strcmp(backend_env, "memcache") == 0 || strcmp(backend_env, "mooncake") == 0)
            kv->backend = strcmp(backend_env, "mooncake") == 0 ? NM_KV_MOONCAKE : NM_KV_MEMCACHE;
        else
            cfg_error(e, "$KV_STORE_BACKEND", "must be \"memcache\" or \"mooncake\", got \"%s\"",
                      backend_env);
    }
    const char *port_env = env_set(c, "KV_CACHE_STORE_PORT");
    int port = 0;
    if (port_env && util_parse_int(port_env, 1, 65535, &port) < 0)
        cfg_error(e, "$KV_CACHE_STORE_PORT", "must be a port 1-65535, got \"%s\"", port_env);
    else if (port_env)
        kv->port = port;
    const char *lsm_env = env_set(c, "MMC_LOCAL_SERVICE_MODE");
    if (lsm_env && (strcmp(lsm_env, "standalone") == 0 || strcmp(lsm_env, "inprocess") == 0))
        set_str(&kv->local_service_mode, lsm_env);
    at(L, "kv_cache_store_config");
    cfgtab_apply(&nm_config_cfgtab, SRC_KV, c, sec, &L->tab);
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
        /* Each device of the pod takes one KV transfer port from kv_port on. */
        else if (sc->kv_port > 0 && sc->kv_port + sc->device_num - 1 > 65535)
            cfg_error(e, "kv_transfer_config.kv_port",
                      "the pod's %d devices need KV ports %d..%d, beyond 65535", sc->device_num,
                      sc->kv_port, sc->kv_port + sc->device_num - 1);
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

    /* Seed 000: without a configured pod_ip (file or $POD_IP) the API binds the wildcard
     * address, as upstream's falls back to 0.0.0.0, but what is registered and carried by
     * the endpoints must be an address peers can reach. */
    set_str(&c->bind_host, c->pod_ip);
    c->pod_ip_detected = false;
    if (!cfgtab_given(&L->tab, OFF(pod_ip)) && !env_set(c, "POD_IP")) {
        char *ip = routable_ip(c->controller_host, c->controller_port);
        if (ip) {
            set_str(&c->pod_ip, ip);
            free(ip);
        }
        set_str(&c->bind_host, "0.0.0.0");
        c->pod_ip_detected = true;
    }

    /* fault tolerance */
    c->ft.enable_fault_tolerance = c->ft.enable_fault_tolerance || c->ft_capability.enabled;
    if (!cfgtab_given(&L->tab, OFF(ft.container_restart_managed))) {
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
    struct loader L = {.c = c, .e = errs, .root = root};
    L.tab =
        (struct cfgtab_ctx){.errs = errs, .env = nm_env_from_array, .env_ud = c->env_kv, .ud = &L};
    L.base = xstrdup(errs->prefix ? errs->prefix : "");
    int before = cfg_errors_count(errs);

    cfgtab_defaults(&nm_config_cfgtab, c, &L.tab);
    wire_parallel_config_default(&c->parallel);

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

    /* NM blocks: top level, then the role section's, key by key. */
    const char *top_key = NULL, *sec_key = NULL;
    json_t *top_nm = find_nm_block(c, root, "the file", &top_key, errs);
    at(&L, secname);
    json_t *sec_nm = sec ? find_nm_block(c, sec, secname, &sec_key, errs) : NULL;
    if (top_nm) {
        at(&L, top_key);
        cfgtab_apply(&nm_config_cfgtab, SRC_NM, c, top_nm, &L.tab);
    }
    if (sec_nm) {
        char *p = xasprintf("%s.%s", secname, sec_key);
        at(&L, p);
        free(p);
        cfgtab_apply(&nm_config_cfgtab, SRC_NM, c, sec_nm, &L.tab);
    }
    if (!top_nm && !sec_nm && !sec) {
        at(&L, NULL);
        cfgtab_apply(&nm_config_cfgtab, SRC_NM, c, root, &L.tab);
    }

    /* overrides from the deploy block and the snapshot block */
    at(&L, "motor_deploy_config");
    cfgtab_apply(&nm_config_cfgtab, SRC_DEPLOY, c, deploy, &L.tab);
    at(&L, "motor_container_snapshot_config");
    cfgtab_apply(&nm_config_cfgtab, SRC_SNAPSHOT, c,
                 cfg_lookup(root, "motor_container_snapshot_config"), &L.tab);

    parse_controller(&L);
    parse_engine_section(&L, sec, secname);
    parse_kv_store(&L);
    derive(&L, deploy);
    other_roles(&L);

    c->ranktable_path = xstrdup(env_set(c, "RANKTABLE_PATH"));
    c->hccl_path = xstrdup(env_set(c, "HCCL_PATH"));

    cfg_errors_set_prefix(errs, L.base);
    free(L.base);
    cfgtab_ctx_release(&L.tab);
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
    cfgtab_release(&nm_config_cfgtab, c);
    free(c->opt_role);
    for (char **kv = c->env_kv; kv && *kv; kv++)
        free(*kv);
    free(c->env_kv);
    free(c);
}

json_t *nm_config_to_json(const struct nm_config *c)
{
    return cfgtab_dump(&nm_config_cfgtab, c);
}

char *nm_config_diff(const struct nm_config *a, const struct nm_config *b)
{
    char *keys = cfgtab_diff(&nm_config_cfgtab, a, b, 0, 0);
    if (!keys)
        return NULL;
    /* The top-level sections of the changed keys, once each, warnings aside. */
    struct strbuf sb;
    strbuf_init(&sb, strlen(keys) + 2);
    for (char *k = keys; *k;) {
        size_t n = strcspn(k, ",");
        size_t sect = strcspn(k, ".,");
        bool dup = false;
        for (const char *s = strbuf_str(&sb); *s && !dup;) {
            size_t m = strcspn(s, ",");
            dup = m == sect && strncmp(s, k, sect) == 0;
            s += m + (s[m] == ',');
        }
        if (!dup && !(sect == 8 && strncmp(k, "warnings", 8) == 0)) {
            if (sb.len)
                (void)strbuf_putc(&sb, ',');
            (void)strbuf_append(&sb, k, sect);
        }
        k += n + (k[n] == ',');
    }
    free(keys);
    if (sb.len == 0) {
        strbuf_release(&sb);
        return NULL;
    }
    return strbuf_take(&sb);
}

char *nm_config_restart_keys(const struct nm_config *a, const struct nm_config *b)
{
    return cfgtab_diff(&nm_config_cfgtab, a, b, CFGTAB_LIVE, 0);
}
