/* wire — the upstream (MindIE-Motor) wire types, once, for every daemon.
 *
 * This header holds the shared vocabulary: error reporting, enums, caps and the small
 * value types embedded in messages (DeviceInfo, Endpoint, ParallelConfig,
 * FtCapabilitySnapshot, NodeManagerInfo, string lists). Messages live in
 * wire_msg.h (Controller <-> NodeManager), wire_ranktable.h and wire_ft.h (FT proxy).
 * Spec: ../shared/spec/motor-reference.md §5.9.
 *
 * Conventions shared by every wire_* parser:
 *  - Input is a jansson value (the HTTP layer already capped the body). Parsers never
 *    take ownership of it and never keep borrowed pointers into it (every string is
 *    copied), except where a field is documented as an owned json_t reference.
 *  - Every field is type- and range-checked. On failure the parser returns -EINVAL
 *    (malformed: wrong type, missing, out of range) and writes one message naming the
 *    field path ("endpoints[1].business_port: must be a port number 1-65535, got \"0\"")
 *    into err (err may be NULL). On failure the output owns nothing: structs with heap
 *    members are left zeroed, plain-value structs (ParallelConfig, FtCapability) are
 *    left untouched; releasing either is safe.
 *  - JSON null counts as absent for optional fields; a required field that is null is
 *    "missing". Unknown keys are ignored unless a flag says otherwise (upstream ignores
 *    extra keys except in the newest Controller's Endpoint, see WIRE_STRICT_ENDPOINT).
 *  - Numeric strings on the wire ("10000", device ids) are accepted as JSON strings or
 *    as non-negative JSON integers and kept as strings (serialized as strings).
 *  - Integers accept JSON integers and integral reals (2.0), never booleans or strings.
 *  - Strings are at most WIRE_STR_MAX bytes and contain no NUL; lists at most
 *    WIRE_LIST_MAX elements.
 *
 * Serializers (wire_*_to_json) return a new reference and never fail (allocation
 * failure aborts, as xmalloc). Null/absent optional fields are omitted, as upstream
 * dumps its models without nulls.
 *
 * _release functions free what a struct owns and zero it; they accept NULL and zeroed
 * structs. Nothing here has global state: every function is thread-safe on distinct
 * objects. */
#ifndef MOTOR_WIRE_H
#define MOTOR_WIRE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_ERR_MAX 256
#define WIRE_STR_MAX 4096
#define WIRE_LIST_MAX 16384
/* Ids (instance ids, endpoint ids = global DP ranks) are non-negative and fit an int. */
#define WIRE_ID_MAX 2147483647
/* Parallel sizes (dp, tp, ...) and derived world sizes. */
#define WIRE_SIZE_MAX 65536

/* One human-readable message, "<field path>: <problem>". */
struct wire_err {
    char msg[WIRE_ERR_MAX];
};

/* Parser flags. */
enum {
    /* Reject Endpoint keys outside the newest model (id, ip, business_port,
     * bootstrap_port, status, device_infos, hb_timestamp, workload, headless): the newest
     * Controller rejects unknown Endpoint fields, including the legacy `port` and
     * `mgmt_port`. Without the flag both are tolerated (`port` maps to business_port,
     * `mgmt_port` is dropped). */
    WIRE_STRICT_ENDPOINT = 1u << 0,
};

/* SGLang's disaggregation bootstrap port when an endpoint or engine config names none
 * (SGLang's own default; the prefill engine serves it, the decode leg is told it). */
#define WIRE_SGLANG_BOOTSTRAP_PORT 8998

/* ---- enums ------------------------------------------------------------------------ */

/* PDRole. "both" is accepted on input as union; output is always the canonical name. */
enum wire_role { WIRE_ROLE_ENCODE = 0, WIRE_ROLE_PREFILL, WIRE_ROLE_DECODE, WIRE_ROLE_UNION };
#define WIRE_ROLE_COUNT 4
/* 0 or -EINVAL (NULL or unknown). Case-sensitive, as upstream. */
int wire_role_from_str(const char *s, enum wire_role *out);
const char *wire_role_str(enum wire_role r); /* "?" when out of range */

/* EndpointStatus. */
enum wire_ep_status {
    WIRE_EP_INITIAL = 0,
    WIRE_EP_NORMAL,
    WIRE_EP_ABNORMAL,
    WIRE_EP_PAUSED,
    WIRE_EP_WAIT2START,
};
int wire_ep_status_from_str(const char *s, enum wire_ep_status *out);
const char *wire_ep_status_str(enum wire_ep_status s);

/* InsStatus (Controller instance states). */
enum wire_ins_status {
    WIRE_INS_INITIAL = 0,
    WIRE_INS_INACTIVE,
    WIRE_INS_ACTIVE,
    WIRE_INS_PAUSED,
    WIRE_INS_DELETED,
};
int wire_ins_status_from_str(const char *s, enum wire_ins_status *out);
const char *wire_ins_status_str(enum wire_ins_status s);

/* engine_status of a software-fault report (the numbers are the wire values). */
enum wire_engine_status {
    WIRE_ENGINE_HEALTHY = 0,
    WIRE_ENGINE_DEAD = 1,
    WIRE_ENGINE_UNHEALTHY = 2,
};
int wire_engine_status_from_str(const char *s, enum wire_engine_status *out);
const char *wire_engine_status_str(enum wire_engine_status s); /* "healthy"/"dead"/"unhealthy" */

/* ---- string lists ------------------------------------------------------------------- */

struct wire_strlist {
    char **items;
    size_t n;
};
void wire_strlist_release(struct wire_strlist *l);
/* Append a copy of s. */
void wire_strlist_push(struct wire_strlist *l, const char *s);
/* Deep copy (dst is overwritten, not released). */
void wire_strlist_copy(struct wire_strlist *dst, const struct wire_strlist *src);
json_t *wire_strlist_to_json(const struct wire_strlist *l);

/* ---- DeviceInfo --------------------------------------------------------------------- */

struct wire_device_info {
    char *device_id;       /* local device id, required */
    char *rank_id;         /* global rank, required */
    char *device_ip;       /* NULL = null */
    char *super_device_id; /* NULL = null (A5) */
};
int wire_device_info_parse(json_t *j, struct wire_device_info *out, struct wire_err *err);
json_t *wire_device_info_to_json(const struct wire_device_info *d);
void wire_device_info_release(struct wire_device_info *d);
void wire_device_info_copy(struct wire_device_info *dst, const struct wire_device_info *src);

/* ---- Endpoint ----------------------------------------------------------------------- */

struct wire_endpoint {
    int64_t id;                 /* global DP rank within the instance, 0..WIRE_ID_MAX */
    char *ip;                   /* required, non-empty */
    char *business_port;        /* decimal port "1".."65535"; legacy `port` mapped here */
    int bootstrap_port;         /* 0 = null, else 1..65535 (SGLang PD bootstrap) */
    enum wire_ep_status status; /* default initial */
    struct wire_device_info *device_infos;
    size_t n_device_infos;
    double hb_timestamp;  /* epoch seconds; 0 when absent */
    double active_tokens; /* workload.active_tokens (>= 0), default 0; older workload
                             keys (active_kv_cache, prefill_cost) are dropped */
    bool headless;        /* PCP slave node: process-only probing, not routed */
};
/* flags: WIRE_STRICT_ENDPOINT or 0. */
int wire_endpoint_parse(json_t *j, unsigned flags, struct wire_endpoint *out, struct wire_err *err);
/* Newest shape: id, ip, business_port, bootstrap_port (only when set), status,
 * device_infos, hb_timestamp, workload{active_tokens}, headless. Never mgmt_port. */
json_t *wire_endpoint_to_json(const struct wire_endpoint *e);
void wire_endpoint_release(struct wire_endpoint *e);
void wire_endpoint_copy(struct wire_endpoint *dst, const struct wire_endpoint *src);
/* Release an array of n endpoints and free the array itself. */
void wire_endpoints_free(struct wire_endpoint *v, size_t n);
/* The business port as a number (0 if the string is not a valid port). */
int wire_endpoint_port(const struct wire_endpoint *e);

/* ---- ParallelConfig ----------------------------------------------------------------- */

struct wire_parallel_config {
    int dp_size, pcp_size, tp_size, ep_size, pp_size; /* 1..WIRE_SIZE_MAX, default 1 */
    int world_size, local_world_size;                 /* 0 = to be computed */
};
void wire_parallel_config_default(struct wire_parallel_config *p);
/* Absent keys keep the defaults; unknown keys (cp_size, sp_size of older files) ignored. */
int wire_parallel_config_parse(json_t *j, struct wire_parallel_config *out, struct wire_err *err);
json_t *wire_parallel_config_to_json(const struct wire_parallel_config *p);
/* Fill zero world_size (dp*pcp*tp*pp) and local_world_size (pcp*tp*pp). 0, or -ERANGE
 * when a product exceeds WIRE_SIZE_MAX (err set). */
int wire_parallel_config_fill(struct wire_parallel_config *p, struct wire_err *err);

/* ---- FtCapabilitySnapshot ----------------------------------------------------------- */

struct wire_ft_capability {
    bool enabled, scale_down_supported, external_lb, auto_recovery, fused_mc2_enabled, eplb_enabled;
    int64_t num_redundant_experts; /* >= 0 */
};
int wire_ft_capability_parse(json_t *j, struct wire_ft_capability *out, struct wire_err *err);
json_t *wire_ft_capability_to_json(const struct wire_ft_capability *c);

/* ---- NodeManagerInfo ---------------------------------------------------------------- */

struct wire_nm_info {
    char *pod_ip;       /* required */
    char *port;         /* NM API port as a decimal string, required */
    int64_t device_num; /* >= 0, default 0 */
};
int wire_nm_info_parse(json_t *j, struct wire_nm_info *out, struct wire_err *err);
json_t *wire_nm_info_to_json(const struct wire_nm_info *n);
void wire_nm_info_release(struct wire_nm_info *n);

/* ---- misc --------------------------------------------------------------------------- */

/* Set err->msg (err may be NULL). Used by callers that add their own semantic checks
 * so that all messages look alike. */
void wire_err_set(struct wire_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Dump a JSON value compactly into a heap string (never NULL): the canonical text used
 * for logs, signatures and engine command-line JSON arguments. Reals are printed in the
 * shortest form that reads back exactly (0.9, not 0.90000000000000002). */
char *wire_json_compact(const json_t *j);

/* Format a double in the shortest round-trip form, Python-repr style ("0.9", "1.0",
 * "1e+16"). buf should hold >= 32 bytes. */
void wire_fmt_double(double v, char *buf, size_t cap);

#endif
