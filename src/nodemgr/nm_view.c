/* nm_view — nodemgr_pod_view(): the node manager's own config loader, asked on behalf of
 * `motor up` (nodemgr.h). The environment a pod would get (ROLE, INDEX, POD_IP,
 * JOB_NAME) is synthesized, so the answer is exactly what that pod's node manager
 * would derive from the same file. */
#include "nodemgr/nodemgr.h"

#include "common/util.h"
#include "nodemgr/nm_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int nodemgr_pod_view(const json_t *user_config, const struct nodemgr_pod_query *q,
                     struct nodemgr_pod_view *out, struct cfg_errors *errs)
{
    memset(out, 0, sizeof(*out));
    char role_kv[48], index_kv[32];
    snprintf(role_kv, sizeof(role_kv), "ROLE=%s", q->role);
    snprintf(index_kv, sizeof(index_kv), "INDEX=%d", q->index);
    char *ip_kv = xasprintf("POD_IP=%s", q->pod_ip ? q->pod_ip : "127.0.0.1");
    char *job_kv = xasprintf("JOB_NAME=%s", q->job_name ? q->job_name : "");
    char *env[] = {role_kv, index_kv, ip_kv, job_kv, NULL};
    struct nm_config_opts no = {
        .role = q->role,
        .env = nm_env_from_array,
        .env_ud = env,
        .motor_bin = q->motor_bin ? q->motor_bin : "motor",
    };
    /* The loader only reads the document (it deep-copies what it keeps). */
    struct nm_config *c = nm_config_from_json((json_t *)user_config, &no, errs);
    free(ip_kv);
    free(job_kv);
    if (!c)
        return -EINVAL;
    out->nm_port = c->node_manager_port;
    out->endpoint_num = c->endpoint_num;
    out->service_ports = xcalloc((size_t)(c->endpoint_num > 0 ? c->endpoint_num : 1), sizeof(int));
    for (int k = 0; k < c->endpoint_num; k++)
        out->service_ports[k] = c->service_ports[k];
    out->dp_size = c->parallel.dp_size;
    out->dp_rpc_port = c->dp_rpc_port;
    out->dp_master_port = c->dp_master_port;
    out->dp_scale_down_proxy = c->ft.enable_dp_scale_down_proxy;
    out->sglang = c->engine_type == NM_ENGINE_SGLANG;
    out->prefill = c->role == WIRE_ROLE_PREFILL;
    out->kv_port = out->sglang ? 0 : c->sc.kv_port;
    out->world_size = c->parallel.world_size > 0 ? c->parallel.world_size : 1;
    out->bootstrap_port = c->bootstrap_port;
    out->global_index = c->sc.global_index;
    out->engine_type = xstrdup(nm_engine_type_str(c->engine_type));
    out->model_name = xstrdup(c->model_name ? c->model_name : "");
    for (size_t w = 0; w < c->warnings.n; w++)
        wire_strlist_push(&out->warnings, c->warnings.items[w]);
    nm_config_free(c);
    return 0;
}

void nodemgr_pod_view_release(struct nodemgr_pod_view *v)
{
    if (!v)
        return;
    free(v->service_ports);
    free(v->engine_type);
    free(v->model_name);
    wire_strlist_release(&v->warnings);
    memset(v, 0, sizeof(*v));
}
