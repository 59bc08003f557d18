/* wire_msg — Controller <-> NodeManager messages (§5): StartCmdMsg, RegisterMsg,
 * ReregisterMsg, HeartbeatMsg, the software-fault report, and the Controller's reply
 * envelopes. Conventions (errors, ownership, nulls, caps): see wire.h. */
#ifndef MOTOR_WIRE_MSG_H
#define MOTOR_WIRE_MSG_H

#include "wire/wire.h"
#include "wire/wire_ranktable.h"

/* ---- StartCmdMsg (POST /node-manager/start, §5.4) ---------------------------------- */

struct wire_start_cmd {
    char *job_name;                  /* required */
    enum wire_role role;             /* required; "both" => union */
    int64_t instance_id;             /* required, 0..WIRE_ID_MAX */
    struct wire_endpoint *endpoints; /* required array (may be empty here; the NM checks
                                        the count against its endpoint_num) */
    size_t n_endpoints;
    char *master_dp_ip;               /* NULL when absent (older Controllers' test data) */
    struct wire_ranktable *ranktable; /* heap; NULL when null/absent */
    struct wire_strlist d2d_peer_ips; /* "<endpoint_id>:<ip>" entries */
    bool has_d2d_peer_ips;            /* false = null/absent (omitted on output) */
    int64_t node_rank;                /* default 0, 0..65535 */
};
/* flags: 0 (tolerant: legacy `port`, `mgmt_port`, unknown keys) or WIRE_STRICT_ENDPOINT.
 * Duplicate endpoint ids are rejected. */
int wire_start_cmd_parse(json_t *j, unsigned flags, struct wire_start_cmd *out,
                         struct wire_err *err);
/* Dumped without nulls, as the Controller sends it. */
json_t *wire_start_cmd_to_json(const struct wire_start_cmd *m);
void wire_start_cmd_release(struct wire_start_cmd *m);
/* Deep copy into dst (dst is overwritten, not released): for storing launch params. */
void wire_start_cmd_copy(struct wire_start_cmd *dst, const struct wire_start_cmd *src);

/* D2D peers of one endpoint (§6.1 step 2): the IPs of the entries "<id>:<ip>" of
 * peers whose id equals endpoint_id, in order, appended to out. Entries without a
 * colon or with a non-numeric id are skipped. */
void wire_d2d_peers_for(const struct wire_strlist *peers, int64_t endpoint_id,
                        struct wire_strlist *out);

/* ---- RegisterMsg (POST /controller/register, §5.2) --------------------------------- */

struct wire_register {
    char *job_name;    /* required */
    char *model_name;  /* default "" (never NULL after parse) */
    char *engine_type; /* NULL = null */
    struct wire_strlist dispatch_capabilities;
    struct wire_ft_capability ft_capability;     /* absent => all false/0 */
    enum wire_role role;                         /* required */
    char *pod_ip;                                /* required */
    struct wire_strlist business_port;           /* required; each a decimal port */
    int bootstrap_port;                          /* 0 = null */
    char *nm_port;                               /* required; decimal port */
    struct wire_parallel_config parallel_config; /* absent => defaults (all 1, worlds 0) */
    bool enable_multi_endpoints;                 /* default true */
    int64_t device_num;                          /* default 0 */
    struct wire_ranktable *ranktable;            /* heap; NULL = null */
    int64_t nnodes;                              /* default 1, 1..WIRE_SIZE_MAX */
    bool is_master;                              /* default false */
};
/* Legacy `mgmt_port` is accepted and dropped. */
int wire_register_parse(json_t *j, struct wire_register *out, struct wire_err *err);
json_t *wire_register_to_json(const struct wire_register *m);
void wire_register_release(struct wire_register *m);

/* ---- ReregisterMsg (POST /controller/reregister, §5.7) ----------------------------- */

struct wire_reregister {
    char *job_name;    /* required */
    char *model_name;  /* default "" */
    char *engine_type; /* NULL = null */
    struct wire_strlist dispatch_capabilities;
    struct wire_ft_capability ft_capability;
    int64_t instance_id; /* required, 0..WIRE_ID_MAX */
    enum wire_role role; /* required */
    char *pod_ip;        /* required */
    char *nm_port;       /* required */
    struct wire_parallel_config parallel_config;
    bool enable_multi_endpoints; /* default true */
    int64_t device_num;
    struct wire_endpoint *endpoints; /* required */
    size_t n_endpoints;
    int64_t nnodes;    /* default 1 */
    int64_t node_rank; /* default 0 */
};
/* flags: WIRE_STRICT_ENDPOINT makes it behave like the newest Controller. */
int wire_reregister_parse(json_t *j, unsigned flags, struct wire_reregister *out,
                          struct wire_err *err);
json_t *wire_reregister_to_json(const struct wire_reregister *m);
void wire_reregister_release(struct wire_reregister *m);

/* ---- HeartbeatMsg (POST /controller/heartbeat, §5.6) ------------------------------- */

struct wire_hb_status {
    int64_t endpoint_id;
    enum wire_ep_status status;
};
struct wire_heartbeat {
    char *job_name;                /* required */
    int64_t ins_id;                /* required, 0..WIRE_ID_MAX */
    char *ip;                      /* required: the pod IP */
    struct wire_hb_status *status; /* `status` object {"<id>": "<status>"}, in order */
    size_t n_status;
};
/* The status keys must be decimal endpoint ids ("0", "12"); duplicates (after
 * conversion, e.g. "1" and "01") are rejected. An empty map is accepted. */
int wire_heartbeat_parse(json_t *j, struct wire_heartbeat *out, struct wire_err *err);
json_t *wire_heartbeat_to_json(const struct wire_heartbeat *m);
void wire_heartbeat_release(struct wire_heartbeat *m);

/* ---- software-fault report (POST /controller/report_software_fault, §5.8) ---------- */

struct wire_fault_report {
    char *exception_type;                  /* default "" */
    char *exception_message;               /* default "" */
    int64_t engine_id;                     /* required: endpoint id = global DP rank */
    enum wire_engine_status engine_status; /* required: 0 healthy, 1 dead, 2 unhealthy */
    char *pod_ip;                          /* required */
    bool has_instance_id;
    int64_t instance_id;
    int node_manager_port;   /* 0 = absent; 1..65535 */
    json_t *additional_info; /* owned reference to an object; NULL = absent */
};
/* engine_id/engine_status must be JSON integers (upstream answers 400 with
 * data.accepted=false for missing or non-integer values). */
int wire_fault_report_parse(json_t *j, struct wire_fault_report *out, struct wire_err *err);
json_t *wire_fault_report_to_json(const struct wire_fault_report *m);
void wire_fault_report_release(struct wire_fault_report *m);

/* ---- Controller reply envelopes (§5.1, §5.8) --------------------------------------- */

/* {"code":code,"message":message,"data":data}. data is stolen; NULL => {}. */
json_t *wire_envelope_new(int code, const char *message, json_t *data);
/* Error envelope {"detail":{"code","message","data"}}. data is stolen; NULL => {}. */
json_t *wire_envelope_error_new(int code, const char *message, json_t *data);
/* The fault-report delivery rule: true iff body.data.accepted is JSON true (a missing
 * `data.accepted`, as in "Fault tolerance is not enabled", is false). NULL-safe. */
bool wire_envelope_accepted(const json_t *body);
/* Registration reply rule (§5.2): success iff the body is an object without "error".
 * NULL-safe (false). */
bool wire_register_reply_ok(const json_t *body);

#endif
