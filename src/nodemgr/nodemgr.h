/* nodemgr — the node manager's public face: its subcommand, and the one question other
 * parts of Motor may ask of its configuration loader.
 *
 * This is the only header of src/nodemgr that code outside the folder may include (the
 * build enforces it, docs/architecture.md "Layering"). `motor up` plans a local fleet
 * and must know, for each pod, what the node manager itself would derive from the same
 * user_config.json (ports, endpoint count, DP layout) — so it asks the node manager's
 * own loader through nodemgr_pod_view() instead of re-implementing it.
 *
 * Threading: node_manager_main owns the process; nodemgr_pod_view is pure (any thread). */
#ifndef MOTOR_NODEMGR_H
#define MOTOR_NODEMGR_H

#include "common/cfg.h"
#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>

/* `motor node-manager [options]`; returns the process exit status (255 on every
 * shutdown path, as upstream). */
int node_manager_main(int argc, char **argv);

/* What one pod's node manager derives from a user_config.json (owned strings/arrays;
 * release with nodemgr_pod_view_release). */
struct nodemgr_pod_view {
    int nm_port;         /* the node manager's API port */
    int endpoint_num;    /* engines (endpoints) in this pod */
    int *service_ports;  /* endpoint_num business ports */
    int dp_size;         /* data_parallel_size of the role */
    int dp_rpc_port;     /* 0 = none */
    int dp_master_port;  /* 0 = none */
    bool dp_scale_down_proxy; /* the FT DP scale-down proxy is on (needs a DP master) */
    int kv_port;         /* kv_transfer_config.kv_port, 0 = none (SGLang: never) */
    int world_size;      /* devices of the pod's parallel layout (>= 1) */
    int bootstrap_port;  /* SGLang prefill bootstrap port as configured, 0 = unset */
    int global_index;    /* the pod's global index in its role */
    bool sglang;         /* engine_type is SGLang */
    bool prefill;        /* the role is prefill */
    char *engine_type;   /* "vllm", "sglang", "sim", ... */
    char *model_name;    /* "" when unset */
    struct wire_strlist warnings; /* the loader's non-fatal notes, one sentence each */
};

/* Options of the view: the pod's role ("prefill", "decode", "union"), its index in the
 * role, its job name, and the motor binary the simulator engine would run. */
struct nodemgr_pod_query {
    const char *role;
    int index;
    const char *job_name;
    const char *pod_ip;
    const char *motor_bin;
};

/* Load the node manager's view of one pod from user_config (not modified). 0, or
 * -EINVAL with every problem appended to errs (under the node manager's own key paths). */
int nodemgr_pod_view(const json_t *user_config, const struct nodemgr_pod_query *q,
                     struct nodemgr_pod_view *out, struct cfg_errors *errs);
void nodemgr_pod_view_release(struct nodemgr_pod_view *v);

#endif
