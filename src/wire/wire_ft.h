/* wire_ft — bodies of the NodeManager's fault-tolerance routes (§4, §8.3), the
 * engine-restart body (§7.1), and the engine FT API's status entries (§8.3, vLLM fork
 * `GET /v1/fault_tolerance/status`). Conventions: see wire.h.
 *
 * Return codes of the request parsers map onto upstream's status codes:
 *   -EINVAL  malformed body: not an object, missing field, wrong type, bad enum
 *            => HTTP 400
 *   -ERANGE  well-formed but breaking a value rule upstream reports as a failed
 *            operation: duplicate ids, empty request_id, guard lease outside (0, 300]
 *            => HTTP 502 ("Engine FT ... failed")
 * Both write a message into err. Whether the proxy is enabled (404) is the caller's
 * check: upstream checks it before parsing for guard, after parsing for the others. */
#ifndef MOTOR_WIRE_FT_H
#define MOTOR_WIRE_FT_H

#include "wire/wire.h"

#define WIRE_FT_LEASE_MAX_SEC 300.0

enum wire_ft_instruction { WIRE_FT_RETRY = 0, WIRE_FT_SCALE_DOWN };
int wire_ft_instruction_from_str(const char *s, enum wire_ft_instruction *out);
const char *wire_ft_instruction_str(enum wire_ft_instruction i); /* "retry"/"scale_down" */

/* POST /node-manager/fault-tolerance/status  {"endpoint_ids":[int,...]} (non-empty) */
struct wire_ft_status_req {
    int64_t *endpoint_ids;
    size_t n_endpoint_ids;
};
int wire_ft_status_req_parse(json_t *j, struct wire_ft_status_req *out, struct wire_err *err);
json_t *wire_ft_status_req_to_json(const struct wire_ft_status_req *r);
void wire_ft_status_req_release(struct wire_ft_status_req *r);

/* POST /node-manager/fault-tolerance/apply
 * {"endpoint_ids":[...], "instruction":"retry"|"scale_down", "params":{...},
 *  "request_id":str}  — params absent/null => {}. */
struct wire_ft_apply_req {
    int64_t *endpoint_ids; /* non-empty, unique */
    size_t n_endpoint_ids;
    enum wire_ft_instruction instruction;
    json_t *params;   /* owned object, never NULL after a successful parse */
    char *request_id; /* non-empty */
};
int wire_ft_apply_req_parse(json_t *j, struct wire_ft_apply_req *out, struct wire_err *err);
json_t *wire_ft_apply_req_to_json(const struct wire_ft_apply_req *r);
void wire_ft_apply_req_release(struct wire_ft_apply_req *r);

/* The body the NM forwards to each engine's POST /v1/fault_tolerance/apply:
 * {"instruction","params","request_id"}. For scale_down the NM supplies the TCPStore
 * port: params.dp_store_port = dp_master_port + params.dp_master_rank (rank absent =>
 * dp_master_port), and strips the internal dp_master_rank (§8.3, fix of §12.3).
 * New reference, or NULL with err set when dp_master_rank is not a non-negative integer
 * or the port leaves 1..65535. */
json_t *wire_ft_apply_engine_body(const struct wire_ft_apply_req *r, int dp_master_port,
                                  struct wire_err *err);

/* POST /node-manager/fault-tolerance/guard  {"request_id":str, "lease_sec":number} */
struct wire_ft_guard_req {
    char *request_id; /* non-empty */
    double lease_sec; /* (0, 300] */
};
int wire_ft_guard_req_parse(json_t *j, struct wire_ft_guard_req *out, struct wire_err *err);
json_t *wire_ft_guard_req_to_json(const struct wire_ft_guard_req *r);
void wire_ft_guard_req_release(struct wire_ft_guard_req *r);

/* POST /node-manager/fault-tolerance/finalize
 * {"request_id":str, "retired_endpoint_ids":[int...], "commit":bool, "dp_master_rank"?:int}
 * retired_endpoint_ids may be empty (also on commit, newest behaviour). */
struct wire_ft_finalize_req {
    char *request_id;
    int64_t *retired_endpoint_ids;
    size_t n_retired;
    bool commit;
    bool has_dp_master_rank;
    int64_t dp_master_rank;
};
int wire_ft_finalize_req_parse(json_t *j, struct wire_ft_finalize_req *out, struct wire_err *err);
json_t *wire_ft_finalize_req_to_json(const struct wire_ft_finalize_req *r);
void wire_ft_finalize_req_release(struct wire_ft_finalize_req *r);

/* POST /node-manager/engine-restart  {"action":"restart"|"abort", "instance_id"?:int}
 * Any parse failure is a 400 (-EINVAL). Nothing to release. */
enum wire_restart_action { WIRE_RESTART = 0, WIRE_RESTART_ABORT };
struct wire_engine_restart_req {
    enum wire_restart_action action;
    bool has_instance_id;
    int64_t instance_id;
};
int wire_engine_restart_req_parse(json_t *j, struct wire_engine_restart_req *out,
                                  struct wire_err *err);
json_t *wire_engine_restart_req_to_json(const struct wire_engine_restart_req *r);

/* ---- engine FT status entries ------------------------------------------------------- */

enum wire_ft_engine_state {
    WIRE_FT_HEALTHY = 0,
    WIRE_FT_UNHEALTHY,
    WIRE_FT_DEAD,
    WIRE_FT_UNKNOWN, /* the NM proxy's poll_error entry */
    WIRE_FT_OTHER,   /* any other status string (kept verbatim in `status`) */
};

/* {"id", "status", "fault_info"?, "ft_state"?, "last_ft_request_id"?, "ft_error"?,
 *  "mask"?, "source"?} */
struct wire_ft_engine_entry {
    int64_t id;   /* global DP rank */
    char *status; /* verbatim */
    enum wire_ft_engine_state state;
    json_t *fault_info;       /* owned, any JSON; NULL = absent/null */
    char *ft_state;           /* NULL = absent/null ("recovering", "failed", ...) */
    char *last_ft_request_id; /* NULL = absent/null */
    json_t *ft_error;         /* owned, any JSON; NULL = absent/null */
    json_t *mask;             /* owned, any JSON; NULL = absent/null */
    char *source;             /* NULL = absent ("poll_error" on proxy error entries) */
};
int wire_ft_engine_entry_parse(json_t *j, struct wire_ft_engine_entry *out, struct wire_err *err);
json_t *wire_ft_engine_entry_to_json(const struct wire_ft_engine_entry *e);
void wire_ft_engine_entry_release(struct wire_ft_engine_entry *e);
/* Dedup signature (§2.10): compact JSON of [status, fault_info, ft_state,
 * last_ft_request_id, ft_error, mask]. Heap string, never NULL. */
char *wire_ft_engine_entry_signature(const struct wire_ft_engine_entry *e);
/* The proxy's transport-failure entry {"id", "status":"unknown", "fault_info": error,
 * "source":"poll_error"}. New reference. */
json_t *wire_ft_poll_error_entry(int64_t id, const char *error);

struct wire_ft_engines {
    struct wire_ft_engine_entry *v;
    size_t n;
};
/* An engine's GET /v1/fault_tolerance/status reply {"engines":[entry...]}. */
int wire_ft_engines_parse(json_t *j, struct wire_ft_engines *out, struct wire_err *err);
/* The NM proxy's status reply {"<id>": entry, ...} (what the Controller receives);
 * an entry without "id" takes the key's. Entries are in key order. */
int wire_ft_status_reply_parse(json_t *j, struct wire_ft_engines *out, struct wire_err *err);
/* The entry with this id, or NULL. */
const struct wire_ft_engine_entry *wire_ft_engines_find(const struct wire_ft_engines *l,
                                                        int64_t id);
void wire_ft_engines_release(struct wire_ft_engines *l);

#endif
