/* wire_refresh — POST /instances/refresh, the message that tells a coordinator which
 * instances it may route to (spec §9.2): written by the controller, `motor register`
 * and upstream's External Deployer; read by the coordinator.
 *
 * Two body shapes are accepted, both {"event": "add"|"del"|"set", "instances": [...]}:
 *   controller shape  instance {id, role, status?, job_name?, model_name?, engine_type?,
 *                     dispatch_capabilities?, endpoints: {pod_ip: {id: Endpoint}}, ...}
 *   external shape    instance {id, role, endpoints: [{id, address: "host:port",
 *                     bootstrap_port?}]}, model_name / engine_type /
 *                     dispatch_capabilities may be given once at the top level.
 * Unknown Endpoint fields are rejected (upstream's model is strict); unknown instance
 * fields (parallel_config, node_managers, ft_capability, ...) are ignored.
 *
 * Pure functions, any thread. */
#ifndef MOTOR_WIRE_REFRESH_H
#define MOTOR_WIRE_REFRESH_H

#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WIRE_REFRESH_MAX_INSTANCES 4096 /* per body */
#define WIRE_REFRESH_MAX_ENDPOINTS 1024 /* per instance */
#define WIRE_REFRESH_MAX_NAME 256       /* job_name, model_name, engine_type */

enum wire_refresh_event { WIRE_REFRESH_ADD = 0, WIRE_REFRESH_DEL, WIRE_REFRESH_SET };
const char *wire_refresh_event_str(enum wire_refresh_event e); /* "add", "del", "set" */

/* How prefill and decode of an instance cooperate (dispatch_capabilities). */
enum wire_dispatch {
    WIRE_DISPATCH_DEFAULT = 0,
    WIRE_DISPATCH_HANDOFF, /* "prefill_handoff_decode" */
    WIRE_DISPATCH_TRIGGER, /* "concurrent_engine_sync" */
};

struct wire_refresh_ep {
    int64_t id;                 /* >= 0, unique in the instance */
    char *ip;                   /* host name or IP literal (unbracketed) */
    int port;                   /* business port 1..65535 */
    int bootstrap_port;         /* 0 = none */
    enum wire_ep_status status; /* default initial */
    bool headless;              /* PCP slave: never routed */
};

struct wire_refresh_inst {
    int64_t id;                 /* >= 0, unique in the body */
    enum wire_role role;        /* "both" read as union */
    enum wire_ins_status status; /* absent => active (whoever pushes it wants it served) */
    enum wire_dispatch dispatch;
    char *job_name;    /* "" when absent */
    char *model_name;  /* "" when absent (the coordinator then discovers it) */
    char *engine_type; /* "vllm" when absent */
    struct wire_refresh_ep *eps;
    size_t n_eps;
};

struct wire_refresh {
    enum wire_refresh_event ev;
    struct wire_refresh_inst *v;
    size_t n;
};

/* Parse and validate a refresh body (either shape). 0 with *out filled (release it), or
 * -EINVAL with a one-line reason in err (cap bytes) and *out empty. Limits: the
 * WIRE_REFRESH_MAX_* above, ports 1..65535, names printable, no duplicate instance ids,
 * endpoint ids or ip:port pairs. */
int wire_refresh_parse(json_t *body, struct wire_refresh *out, char *err, size_t cap);
void wire_refresh_release(struct wire_refresh *r);

/* ---- writing (controller shape) -------------------------------------------------- */

/* One node manager's share of an instance. */
struct wire_refresh_pod {
    const char *pod_ip;
    const char *port; /* the node manager's API port, decimal; NULL = no node manager
                       * (engines registered directly: node_managers is left out) */
    int64_t device_num;
    const struct wire_endpoint *eps;
    size_t n_eps;
};

/* What the controller pushes of one instance. Endpoints whose id is in exclude (n_exclude
 * of them, may be NULL) are left out (DP scale-down: committed ranks). */
struct wire_refresh_out {
    int64_t id;
    const char *job_name;    /* NULL = "" */
    const char *model_name;  /* NULL = "" */
    const char *engine_type; /* NULL = left out */
    enum wire_role role;
    enum wire_ins_status status;
    const struct wire_strlist *dispatch_caps; /* NULL = left out */
    const struct wire_parallel_config *pc; /* NULL = left out */
    bool multi_endpoints;
    const struct wire_ft_capability *ft_cap; /* NULL = left out */
    const struct wire_refresh_pod *pods;
    size_t n_pods;
    const int64_t *exclude;
    size_t n_exclude;
};

/* The instance object of the controller shape (new reference). */
json_t *wire_refresh_instance_to_json(const struct wire_refresh_out *in);
/* {"event": ev, "instances": instances}; steals the instances array. */
json_t *wire_refresh_body(enum wire_refresh_event ev, json_t *instances);

#endif
