/* up_plan — what `motor up` will start, computed from an upstream user_config.json.
 *
 * Pure: no processes, no sockets (except up_plan_check_free, which probe-binds), no
 * globals. The plan is
 *   - the effective configuration every child reads (the user's file with the changes
 *     one host needs: deploy_mode "single_container" so that every node manager gets its
 *     own ports and devices, every host/DNS key at 127.0.0.1, the controller's SQLite
 *     store in the state directory, and — with a port base — every port rewritten into
 *     one contiguous block);
 *   - one pod per node manager, as upstream's deployer would create them: role, $INDEX,
 *     $JOB_NAME, and the ports the node manager will derive (read back through the node
 *     manager's own config loader, so the plan and the daemon cannot disagree);
 *   - the control-plane ports.
 *
 * Pods: for each role with an engine section (prefill, decode, union, encode, in this
 * order) `<x>_instances_num` instances (p/d/hybrid/e; default 1) of
 * `single_<x>_instance_pod_num` pods each (default 1). Pods are numbered instance-major;
 * the node manager's single-container index g (INDEX, or p_instances_num + INDEX for
 * decode) is made global and unique, so two pods never share an offset.
 *
 * Port layout with a base B: B coordinator inference (the OpenAI URL), B+1 coordinator
 * management, B+2 coordinator observability, B+3 controller API, B+4 controller
 * observability, B+10+g node manager of pod g, then one DP RPC port per pod, then the
 * engines' business ports role after role (2 per DP rank, as upstream), then role after
 * role the ports engines derive from keys of their own: dp DP-master/TCPStore ports
 * (data_parallel_master_port + rank; when dp > 1 or the scale-down proxy is on), world
 * KV-transfer ports per pod (kv_transfer_config.kv_port + g*world; when kv_port is set),
 * and one SGLang bootstrap port (prefill; decode only when it has the key). Other
 * spellings of a rewritten engine key are removed; kv_port keeps its JSON type.
 *
 * The collision check (and up_plan_ports) covers what the processes bind: besides the
 * above, a vLLM engine's DP master range (dp > 1) and KV span, an SGLang prefill's
 * bootstrap port. The node manager gives every instance of a role the same DP master and
 * bootstrap port, so two such instances of one role are refused with that reason. */
#ifndef MOTOR_UP_PLAN_H
#define MOTOR_UP_PLAN_H

#include "common/cfg.h"
#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define UP_PLAN_MAX_PODS 256

struct up_pod {
    char *name; /* "prefill-0"; "prefill-0.1" for the second pod of a multi-pod instance */
    enum wire_role role;
    int instance;   /* index within the role */
    int pod;        /* index within the instance */
    int index;      /* $INDEX given to the node manager */
    int g;          /* the node manager's global single-container index */
    char *job_name; /* $JOB_NAME, shared by the pods of one instance */
    int nm_port;
    int endpoint_num;
    int *ports; /* endpoint_num engine business ports */
    int dp_size;
    int dp_rpc_port;    /* bound by the DP master when dp_size > 1 */
    int dp_master_port; /* engine_config.data_parallel_master_port (+ rank), no pod offset */
    int kv_port;        /* kv_port + device offset; 0 = none (or SGLang: not passed on) */
    int kv_span;        /* ports from kv_port the pod's devices use: its world size */
    int bootstrap_port; /* SGLang prefill: the bootstrap server's port; else 0 */
    char *engine_type;
    char *model;
};

/* TLS towards one listener kind, as motor up's own client sees it. */
struct up_tls_side {
    bool on;
    char *ca_file, *cert_file, *key_file; /* heap; NULL when not given */
    char *key_password;                   /* the block's passwd_file's first line, or NULL */
};

struct up_plan {
    json_t *config; /* the effective configuration (owned) */
    /* What the configuration switches to TLS (from the user's blocks, or all of it with
     * --tls): the controller's API, the coordinator's management and inference ports. */
    struct up_tls_side ctl_tls, mgmt_tls, infer_tls;
    const char *host;
    int coord_port, coord_mgmt_port, ctl_port;
    struct up_pod *pods;
    size_t n_pods;
    int n_instances;
    int n_serving;                /* instances the coordinator routes to (all but encode) */
    char *sqlite_path;            /* the controller's store file we manage; NULL = not ours */
    struct wire_strlist notes;    /* what was changed, one sentence each (for the log) */
    struct wire_strlist warnings; /* the node managers' own warnings, deduplicated */
};

struct up_plan_opts {
    int port_base;         /* 0 = keep the file's ports */
    const char *state_dir; /* absolute; the store and logs go there */
    const char *motor_bin; /* for engine_type "sim" */
    /* --tls: the directory of the throwaway PKI (up_tls.h names its files); every
     * listener of the fleet is switched to TLS with them, mutual TLS everywhere: the
     * deploy block's mgmt_tls_config (controller, node managers, coordinator
     * management), infer_tls_config (coordinator inference, its client towards the
     * engines, the node managers' probes), the engines' ssl_* flags. NULL = as the
     * file says. */
    const char *tls_dir;
};

/* Build the plan from a parsed user_config.json (borrowed; not modified). 0, or
 * -EINVAL with every problem in errs (invalid values, colliding ports, nothing to
 * start). p is zeroed first; release it with up_plan_release in both cases. */
int up_plan_build(const json_t *user, const struct up_plan_opts *o, struct up_plan *p,
                  struct cfg_errors *errs);
void up_plan_release(struct up_plan *p);

/* Every port the plan's processes will listen on, with its owner ("decode-0 engine 1"):
 * parallel arrays, heap (free each owner string and both arrays). Returns the count. */
size_t up_plan_ports(const struct up_plan *p, int **ports, char ***owners);

/* Probe-bind every planned port on 127.0.0.1; each one in use is recorded in errs.
 * 0 or -EADDRINUSE. */
int up_plan_check_free(const struct up_plan *p, struct cfg_errors *errs);

/* Role name used in pod names and job names ("prefill", "decode", "union", "encode"). */
const char *up_role_name(enum wire_role r);

#endif
