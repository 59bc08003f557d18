/* up_plan — see up_plan.h. */
#include "cli/up_plan.h"
#include "cli/up_tls.h"

#include "common/util.h"
#include "nodemgr/nodemgr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define LOCAL_HOST "127.0.0.1"

/* The roles in start order, with their motor_deploy_config keys. */
struct role_keys {
    enum wire_role role;
    const char *section;
    const char *instances_key;
    const char *pods_key;
};

static const struct role_keys roles[] = {
    {WIRE_ROLE_PREFILL, "motor_engine_prefill_config", "p_instances_num",
     "single_p_instance_pod_num"},
    {WIRE_ROLE_DECODE, "motor_engine_decode_config", "d_instances_num",
     "single_d_instance_pod_num"},
    {WIRE_ROLE_UNION, "motor_engine_union_config", "hybrid_instances_num",
     "single_hybrid_instance_pod_num"},
    {WIRE_ROLE_ENCODE, "motor_engine_encode_config", "e_instances_num",
     "single_e_instance_pod_num"},
};

const char *up_role_name(enum wire_role r)
{
    return r == WIRE_ROLE_UNION ? "union" : wire_role_str(r);
}

/* What the plan learns about one role before laying pods out. */
struct role_info {
    bool present;
    int instances, pods_per_instance, n_pods;
    int g_start; /* global single-container index of its first pod */
    int dp, world;
    bool sglang;     /* engine_type sglang (bootstrap port; no kv_transfer_config) */
    bool dp_master;  /* uses data_parallel_master_port: dp > 1 or the DP scale-down proxy */
    bool kv;         /* kv_transfer_config.kv_port set: the node manager derives one per pod */
    bool bootstrap;  /* disaggregation_bootstrap_port set (SGLang) */
    json_t *section; /* borrowed from the effective config */
};

static void note(struct up_plan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(struct up_plan *p, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    wire_strlist_push(&p->notes, buf);
}

/* The object at key in parent, created when missing; NULL (error recorded) when the key
 * holds something else. */
static json_t *child_obj(json_t *parent, const char *key, const char *path, struct cfg_errors *e)
{
    json_t *o = json_object_get(parent, key);
    if (!o || json_is_null(o)) {
        o = json_object();
        json_object_set_new(parent, key, o);
        return o;
    }
    if (!json_is_object(o)) {
        cfg_error(e, path, "must be an object");
        return NULL;
    }
    return o;
}

/* Set key to a JSON value, recording a note when that changes the document. */
static void set_key(struct up_plan *p, json_t *obj, const char *path, const char *key, json_t *val)
{
    json_t *old = json_object_get(obj, key);
    if (!old || !json_equal(old, val)) {
        char *o = old ? json_dumps(old, JSON_ENCODE_ANY | JSON_COMPACT) : xstrdup("(unset)");
        char *n = json_dumps(val, JSON_ENCODE_ANY | JSON_COMPACT);
        note(p, "%s.%s: %s -> %s", path, key, o ? o : "?", n ? n : "?");
        free(o);
        free(n);
    }
    json_object_set_new(obj, key, val);
}

/* The node-manager block of a role section (either spelling), created when missing. */
static json_t *nm_block(json_t *section, const char *secname, struct cfg_errors *e)
{
    if (json_is_object(json_object_get(section, "motor_nodemanager_config")))
        return json_object_get(section, "motor_nodemanager_config");
    char path[128];
    snprintf(path, sizeof(path), "%s.motor_nodemanger_config", secname);
    return child_obj(section, "motor_nodemanger_config", path, e);
}

/* Copy each error line of src into dst under a prefix. */
static void copy_errors(struct cfg_errors *dst, const char *prefix, const struct cfg_errors *src)
{
    const char *t = cfg_errors_text(src);
    while (*t) {
        const char *nl = strchr(t, '\n');
        size_t n = nl ? (size_t)(nl - t) : strlen(t);
        cfg_error(dst, prefix, "%.*s", (int)n, t);
        t += n + (nl ? 1 : 0);
    }
}

/* Load the node manager's view of one pod through its own loader. */
static int nm_view(json_t *cfg, enum wire_role role, int index, const char *job,
                   const struct up_plan_opts *o, struct nodemgr_pod_view *v,
                   struct cfg_errors *tmp)
{
    struct nodemgr_pod_query q = {
        .role = up_role_name(role),
        .index = index,
        .job_name = job,
        .pod_ip = LOCAL_HOST,
        .motor_bin = o->motor_bin,
    };
    return nodemgr_pod_view(cfg, &q, v, tmp);
}

static void push_unique(struct wire_strlist *l, const char *s)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->items[i], s) == 0)
            return;
    wire_strlist_push(l, s);
}

/* ---- port rewriting ---------------------------------------------------------------- */

/* Whether key is a spelling of the underscore flag name as the node manager normalizes
 * engine keys: leading dashes dropped, '-' read as '_'. */
static bool is_spelling(const char *key, const char *underscore)
{
    while (*key == '-')
        key++;
    for (; *key && *underscore; key++, underscore++)
        if (*key != *underscore && !(*key == '-' && *underscore == '_'))
            return false;
    return !*key && !*underscore;
}

/* Move the spelling of a flag the node manager would read (the last one: a later
 * spelling wins there) to the underscore key and drop the others, so that rewriting the
 * underscore key is what every reader sees. Returns the value (borrowed) or NULL. */
static json_t *canon_key(json_t *engine, const char *underscore)
{
    json_t *win = NULL;
    const char *k;
    json_t *v;
    void *tmp;
    json_object_foreach(engine, k, v)
    {
        if (is_spelling(k, underscore))
            win = v;
    }
    if (!win)
        return NULL;
    json_incref(win);
    json_object_foreach_safe(engine, tmp, k, v)
    {
        if (is_spelling(k, underscore))
            json_object_del(engine, k);
    }
    json_object_set_new(engine, underscore, win);
    return win;
}

/* Rewrite kv_transfer_config.kv_port to port, keeping the type of both the sub-config
 * (object or JSON string, as upstream files have both) and the port (string or
 * integer). */
static void set_kv_port(struct up_plan *p, json_t *engine, const char *secname, int port)
{
    json_t *kvt = canon_key(engine, "kv_transfer_config");
    char path[192];
    snprintf(path, sizeof(path), "%s.engine_config.kv_transfer_config", secname);
    json_t *obj = kvt;
    if (json_is_string(kvt))
        obj = json_loads(json_string_value(kvt), 0, NULL);
    if (!json_is_object(obj)) {
        if (obj != kvt)
            json_decref(obj);
        return; /* the node manager reports it; nothing derived from it */
    }
    char num[16];
    snprintf(num, sizeof(num), "%d", port);
    json_t *val =
        json_is_string(json_object_get(obj, "kv_port")) ? json_string(num) : json_integer(port);
    if (obj == kvt) {
        set_key(p, obj, path, "kv_port", val);
        return;
    }
    json_object_set_new(obj, "kv_port", val);
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    snprintf(path, sizeof(path), "%s.engine_config", secname);
    set_key(p, engine, path, "kv_transfer_config", json_string(text ? text : "{}"));
    free(text);
}

/* Set an engine flag under its underscore spelling (the others removed). */
static void set_engine_int(struct up_plan *p, json_t *engine, const char *secname,
                           const char *underscore, int val)
{
    char path[160];
    snprintf(path, sizeof(path), "%s.engine_config", secname);
    canon_key(engine, underscore);
    set_key(p, engine, path, underscore, json_integer(val));
}

static int rewrite_ports(struct up_plan *p, struct role_info *ri, int g_total, int base,
                         struct cfg_errors *e)
{
    json_t *cfg = p->config;
    json_t *coord = child_obj(cfg, "motor_coordinator_config", "motor_coordinator_config", e);
    json_t *ctl = child_obj(cfg, "motor_controller_config", "motor_controller_config", e);
    json_t *capi =
        coord ? child_obj(coord, "api_config", "motor_coordinator_config.api_config", e) : NULL;
    json_t *tapi =
        ctl ? child_obj(ctl, "api_config", "motor_controller_config.api_config", e) : NULL;
    if (!capi || !tapi)
        return -EINVAL;
    const char *cp = "motor_coordinator_config.api_config";
    const char *tp = "motor_controller_config.api_config";
    set_key(p, capi, cp, "coordinator_api_infer_port", json_integer(base));
    set_key(p, capi, cp, "coordinator_api_mgmt_port", json_integer(base + 1));
    set_key(p, capi, cp, "coordinator_obs_port", json_integer(base + 2));
    set_key(p, tapi, tp, "controller_api_port", json_integer(base + 3));
    set_key(p, tapi, tp, "observability_api_port", json_integer(base + 4));

    int nm_base = base + 10;
    int rpc_base = nm_base + g_total;
    int cursor = rpc_base + g_total;
    cursor += cursor & 1;
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        struct role_info *r = &ri[i];
        if (!r->present || !r->n_pods)
            continue;
        json_t *nmb = nm_block(r->section, roles[i].section, e);
        json_t *engine = child_obj(r->section, "engine_config", roles[i].section,
                                   e); /* path good enough for a type error */
        if (!nmb || !engine)
            return -EINVAL;
        char path[160];
        snprintf(path, sizeof(path), "%s.motor_nodemanger_config.api_config", roles[i].section);
        json_t *api = child_obj(nmb, "api_config", path, e);
        snprintf(path, sizeof(path), "%s.motor_nodemanger_config.endpoint_config",
                 roles[i].section);
        json_t *epc = child_obj(nmb, "endpoint_config", path, e);
        if (!api || !epc)
            return -EINVAL;
        /* The node manager adds g to its port and g*2*dp to its base port. */
        snprintf(path, sizeof(path), "%s.motor_nodemanger_config.api_config", roles[i].section);
        set_key(p, api, path, "node_manager_port", json_integer(nm_base));
        int span = 2 * r->dp;
        int bp = cursor - r->g_start * span;
        if (bp < 1) {
            cursor += 1 - bp;
            bp = 1;
        }
        snprintf(path, sizeof(path), "%s.motor_nodemanger_config.endpoint_config",
                 roles[i].section);
        set_key(p, epc, path, "base_port", json_integer(bp));
        cursor += r->n_pods * span;
        set_engine_int(p, engine, roles[i].section, "data_parallel_rpc_port", rpc_base);
    }
    /* After every engine port: the ports the engines derive from keys the node manager
     * does not move with g (DP master), or moves by the device offset (KV transfer). */
    int bootstrap = 0;
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        struct role_info *r = &ri[i];
        if (!r->present || !r->n_pods)
            continue;
        json_t *engine = json_object_get(r->section, "engine_config");
        /* dp_master_port + rank for rank < dp: the DP group's master and the per-rank
         * TCPStore ports nm_ports reserves. One range per role: every pod of the role
         * reads the same key. */
        if (r->dp_master) {
            set_engine_int(p, engine, roles[i].section, "data_parallel_master_port", cursor);
            cursor += r->dp;
        }
        /* kv_port + g*world for each pod: world ports per pod, as with base_port. */
        if (r->kv) {
            int kv = cursor - r->g_start * r->world;
            if (kv < 1) {
                cursor += 1 - kv;
                kv = 1;
            }
            set_kv_port(p, engine, roles[i].section, kv);
            cursor += r->n_pods * r->world;
        }
        /* SGLang's bootstrap server runs in the prefill engine (default 8998 when the key
         * is absent, so it is always set there); decode's copy, when given, is not bound
         * (requests carry the prefill's) but is kept equal to it. */
        if (r->sglang && (roles[i].role == WIRE_ROLE_PREFILL ||
                          (roles[i].role == WIRE_ROLE_DECODE && r->bootstrap))) {
            if (!bootstrap)
                bootstrap = cursor++;
            set_engine_int(p, engine, roles[i].section, "disaggregation_bootstrap_port", bootstrap);
        }
    }
    if (cursor - 1 > 65535) {
        cfg_error(e, "--port-base", "%d leaves no room: the fleet needs ports up to %d", base,
                  cursor - 1);
        return -EINVAL;
    }
    return 0;
}

/* ---- the effective configuration ---------------------------------------------------- */

static int localize(struct up_plan *p, struct role_info *ri, const struct up_plan_opts *o,
                    struct cfg_errors *e)
{
    json_t *cfg = p->config;
    json_t *deploy = child_obj(cfg, "motor_deploy_config", "motor_deploy_config", e);
    json_t *coord = child_obj(cfg, "motor_coordinator_config", "motor_coordinator_config", e);
    json_t *ctl = child_obj(cfg, "motor_controller_config", "motor_controller_config", e);
    if (!deploy || !coord || !ctl)
        return -EINVAL;
    json_t *capi = child_obj(coord, "api_config", "motor_coordinator_config.api_config", e);
    json_t *tapi = child_obj(ctl, "api_config", "motor_controller_config.api_config", e);
    if (!capi || !tapi)
        return -EINVAL;

    /* Every pod on one host: only single-container mode gives each node manager its own
     * ports and devices. */
    set_key(p, deploy, "motor_deploy_config", "deploy_mode", json_string("single_container"));

    /* Everything on loopback: the file may name Kubernetes services. */
    const char *cp = "motor_coordinator_config.api_config";
    const char *tp = "motor_controller_config.api_config";
    set_key(p, capi, cp, "coordinator_api_host", json_string(LOCAL_HOST));
    set_key(p, capi, cp, "coordinator_api_dns", json_string(LOCAL_HOST));
    set_key(p, tapi, tp, "controller_api_host", json_string(LOCAL_HOST));
    set_key(p, tapi, tp, "controller_api_dns", json_string(LOCAL_HOST));

    /* The controller's store: SQLite in the state directory unless the file chose etcd
     * (or a store path of its own). */
    json_t *store = json_object_get(ctl, "store_config");
    const char *backend = json_string_value(json_object_get(store, "backend"));
    bool etcd_persist = json_is_true(cfg_lookup(ctl, "etcd_config.enable_etcd_persistence"));
    if ((!backend && !etcd_persist) || (backend && strcmp(backend, "sqlite") == 0)) {
        store = child_obj(ctl, "store_config", "motor_controller_config.store_config", e);
        if (!store)
            return -EINVAL;
        if (!json_object_get(store, "backend"))
            json_object_set_new(store, "backend", json_string("sqlite"));
        const char *path = json_string_value(json_object_get(store, "sqlite_path"));
        if (!path) {
            p->sqlite_path = xasprintf("%s/controller.db", o->state_dir);
            json_object_set_new(store, "sqlite_path", json_string(p->sqlite_path));
        }
    }

    /* Node managers take $POD_IP (we set 127.0.0.1) unless the file names an address:
     * replace it where it does, at the top level and in every role section. */
    static const char *const blocks[] = {"motor_nodemanger_config", "motor_nodemanager_config"};
    for (size_t k = 0; k < ARRAY_LEN(blocks); k++) {
        json_t *api = cfg_lookup(cfg, blocks[k]);
        api = json_is_object(api) ? json_object_get(api, "api_config") : NULL;
        if (json_is_object(api) && json_object_get(api, "pod_ip")) {
            char path[96];
            snprintf(path, sizeof(path), "%s.api_config", blocks[k]);
            set_key(p, api, path, "pod_ip", json_string(LOCAL_HOST));
        }
        for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
            if (!ri[i].present)
                continue;
            json_t *blk = json_object_get(ri[i].section, blocks[k]);
            api = json_is_object(blk) ? json_object_get(blk, "api_config") : NULL;
            if (json_is_object(api) && json_object_get(api, "pod_ip")) {
                char path[192];
                snprintf(path, sizeof(path), "%s.%s.api_config", roles[i].section, blocks[k]);
                set_key(p, api, path, "pod_ip", json_string(LOCAL_HOST));
            }
        }
    }
    return 0;
}

/* ---- build ------------------------------------------------------------------------ */

/* One planned listener. `shared` names the key when every instance of the role reads
 * the same port from it (the node manager adds no per-pod offset), so that two of
 * them colliding is a layout limit, not something distinct ports in the file fix. */
struct planned_port {
    int port;
    char *owner;
    enum wire_role role;
    const char *shared;
};

static struct planned_port *collect_ports(const struct up_plan *p, size_t *n_out)
{
    size_t cap = 8, n = 0;
    for (size_t i = 0; i < p->n_pods; i++) {
        const struct up_pod *d = &p->pods[i];
        cap += 3 + (size_t)d->endpoint_num + (size_t)d->dp_size + (size_t)d->kv_span;
    }
    struct planned_port *v = xcalloc(cap, sizeof(*v));
#define ADD(role_, shared_, port_, ...)                                                            \
    do {                                                                                           \
        v[n].port = (port_);                                                                       \
        v[n].role = (role_);                                                                       \
        v[n].shared = (shared_);                                                                   \
        v[n++].owner = xasprintf(__VA_ARGS__);                                                     \
    } while (0)
    ADD(WIRE_ROLE_UNION, NULL, p->coord_port, "coordinator (inference)");
    ADD(WIRE_ROLE_UNION, NULL, p->coord_mgmt_port, "coordinator (management)");
    ADD(WIRE_ROLE_UNION, NULL, p->ctl_port, "controller");
    for (size_t i = 0; i < p->n_pods; i++) {
        const struct up_pod *d = &p->pods[i];
        ADD(d->role, NULL, d->nm_port, "%s node manager", d->name);
        for (int k = 0; k < d->endpoint_num; k++)
            ADD(d->role, NULL, d->ports[k], "%s engine %d", d->name, k);
        if (d->dp_size > 1 && d->pod == 0)
            ADD(d->role, NULL, d->dp_rpc_port, "%s DP RPC", d->name);
        /* Only what a real engine binds: the sim engine binds none of these. vLLM's DP
         * group master (rank 0's pod) and the scale-down TCPStore of each rank. */
        bool vllm = d->engine_type && strcmp(d->engine_type, "vllm") == 0;
        if (vllm && d->dp_size > 1 && d->pod == 0)
            for (int r = 0; r < d->dp_size; r++)
                ADD(d->role, "data_parallel_master_port", d->dp_master_port + r,
                    "%s DP master rank %d", d->name, r);
        if (vllm)
            for (int k = 0; k < d->kv_span; k++)
                ADD(d->role, NULL, d->kv_port + k, "%s KV transfer (device %d)", d->name, k);
        if (d->bootstrap_port && d->pod == 0)
            ADD(d->role, "disaggregation_bootstrap_port", d->bootstrap_port, "%s SGLang bootstrap",
                d->name);
    }
#undef ADD
    *n_out = n;
    return v;
}

static void free_ports(struct planned_port *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].owner);
    free(v);
}

size_t up_plan_ports(const struct up_plan *p, int **ports_out, char ***owners_out)
{
    size_t n;
    struct planned_port *v = collect_ports(p, &n);
    int *ports = xcalloc(n ? n : 1, sizeof(int));
    char **owners = xcalloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        ports[i] = v[i].port;
        owners[i] = v[i].owner;
        v[i].owner = NULL;
    }
    free_ports(v, n);
    *ports_out = ports;
    *owners_out = owners;
    return n;
}

static int planned_cmp(const void *a, const void *b)
{
    const struct planned_port *x = *(const struct planned_port *const *)a;
    const struct planned_port *y = *(const struct planned_port *const *)b;
    if (x->port != y->port)
        return (x->port > y->port) - (x->port < y->port);
    return (x > y) - (x < y); /* stable: plan order */
}

static void check_collisions(const struct up_plan *p, struct cfg_errors *e)
{
    size_t n;
    struct planned_port *v = collect_ports(p, &n);
    struct planned_port **idx = xcalloc(n ? n : 1, sizeof(*idx));
    for (size_t i = 0; i < n; i++)
        idx[i] = &v[i];
    qsort(idx, n, sizeof(*idx), planned_cmp);
    for (size_t i = 1; i < n; i++) {
        const struct planned_port *a = idx[i - 1], *b = idx[i];
        if (a->port != b->port)
            continue;
        if (a->shared && b->shared && strcmp(a->shared, b->shared) == 0 && a->role == b->role)
            cfg_error(e, "ports",
                      "%d is used by both %s and %s: every instance of the %s role reads "
                      "the same engine_config.%s (the node manager adds no per-pod offset "
                      "to it), so on one host run one such instance of the role",
                      b->port, a->owner, b->owner, up_role_name(a->role), a->shared);
        else
            cfg_error(e, "ports",
                      "%d is used by both %s and %s (set distinct ports, or use "
                      "--port-base)",
                      b->port, a->owner, b->owner);
    }
    free(idx);
    free_ports(v, n);
}

int up_plan_check_free(const struct up_plan *p, struct cfg_errors *e)
{
    int *ports;
    char **owners;
    size_t n = up_plan_ports(p, &ports, &owners);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i])};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == EADDRINUSE) {
            cfg_error(e, "ports", "%d (%s) is already in use on " LOCAL_HOST, ports[i], owners[i]);
            rc = -EADDRINUSE;
        }
        close(fd);
    }
    for (size_t i = 0; i < n; i++)
        free(owners[i]);
    free(owners);
    free(ports);
    return rc;
}

static void fill_pod(struct up_pod *d, const struct nodemgr_pod_view *c)
{
    d->nm_port = c->nm_port;
    d->endpoint_num = c->endpoint_num;
    d->ports = xcalloc((size_t)(c->endpoint_num ? c->endpoint_num : 1), sizeof(int));
    for (int k = 0; k < c->endpoint_num; k++)
        d->ports[k] = c->service_ports[k];
    d->dp_size = c->dp_size;
    d->dp_rpc_port = c->dp_rpc_port;
    d->dp_master_port = c->dp_master_port;
    if (c->kv_port > 0) {
        d->kv_port = c->kv_port;
        d->kv_span = c->world_size;
    }
    /* SGLang's prefill engine serves the bootstrap, on its default port when unset. */
    if (c->sglang && c->prefill)
        d->bootstrap_port = c->bootstrap_port ? c->bootstrap_port : WIRE_SGLANG_BOOTSTRAP_PORT;
    d->g = c->global_index;
    d->engine_type = xstrdup(c->engine_type);
    d->model = xstrdup(c->model_name);
}

/* ---- TLS --------------------------------------------------------------------------- */

static json_t *tls_block(const char *dir, const char *name)
{
    char ca[PATH_MAX], crt[PATH_MAX], key[PATH_MAX];
    snprintf(ca, sizeof(ca), "%s/%s", dir, UP_TLS_CA);
    snprintf(crt, sizeof(crt), "%s/%s.crt", dir, name);
    snprintf(key, sizeof(key), "%s/%s.key", dir, name);
    return json_pack("{s:b,s:s,s:s,s:s}", "enable_tls", 1, "ca_file", ca, "cert_file", crt,
                     "key_file", key);
}

/* --tls: every listener on TLS with the throwaway PKI in dir (see up_plan_opts). */
static int tls_everywhere(struct up_plan *p, const struct role_info *ri, const char *dir,
                          struct cfg_errors *e)
{
    json_t *deploy = child_obj(p->config, "motor_deploy_config", "motor_deploy_config", e);
    json_t *tc =
        deploy ? child_obj(deploy, "tls_config", "motor_deploy_config.tls_config", e) : NULL;
    if (!tc)
        return -EINVAL;
    set_key(p, tc, "motor_deploy_config.tls_config", "mgmt_tls_config",
            tls_block(dir, UP_TLS_MGMT));
    set_key(p, tc, "motor_deploy_config.tls_config", "infer_tls_config",
            tls_block(dir, UP_TLS_INFER));
    /* The daemons' own blocks would be overridden by the deploy block anyway; switched
     * off so that the file reads as what runs. */
    static const char *const own[] = {"motor_controller_config", "motor_nodemanger_config"};
    for (size_t i = 0; i < ARRAY_LEN(own); i++) {
        json_t *b = json_object_get(p->config, own[i]);
        if (json_is_object(b) && json_object_get(b, "mgmt_tls_config"))
            set_key(p, b, own[i], "mgmt_tls_config", tls_block(dir, UP_TLS_MGMT));
    }
    char ca[PATH_MAX], crt[PATH_MAX], key[PATH_MAX];
    snprintf(ca, sizeof(ca), "%s/%s", dir, UP_TLS_CA);
    snprintf(crt, sizeof(crt), "%s/%s.crt", dir, UP_TLS_ENGINE);
    snprintf(key, sizeof(key), "%s/%s.key", dir, UP_TLS_ENGINE);
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        if (!ri[i].present)
            continue;
        char path[160];
        snprintf(path, sizeof(path), "%s.engine_config", roles[i].section);
        json_t *engine = child_obj(ri[i].section, "engine_config", path, e);
        if (!engine)
            return -EINVAL;
        /* vLLM's (uvicorn's) flags; the simulator takes the same. 2 = CERT_REQUIRED. */
        set_key(p, engine, path, "ssl_certfile", json_string(crt));
        set_key(p, engine, path, "ssl_keyfile", json_string(key));
        set_key(p, engine, path, "ssl_ca_certs", json_string(ca));
        set_key(p, engine, path, "ssl_cert_reqs", json_integer(2));
    }
    return 0;
}

static char *block_file(json_t *b, const char *key)
{
    const char *v = json_string_value(json_object_get(b, key));
    return v && *v ? xstrdup(v) : NULL;
}

static void side_from_block(struct up_tls_side *s, json_t *b)
{
    s->on = true;
    s->ca_file = block_file(b, "ca_file");
    s->cert_file = block_file(b, "cert_file");
    s->key_file = block_file(b, "key_file");
    char *pw = block_file(b, "passwd_file");
    if (pw && cfg_read_secret(pw, &s->key_password) < 0)
        s->key_password = NULL; /* an unencrypted key needs none; a wrong one fails loudly */
    free(pw);
}

/* What motor up's own client needs: which listeners speak TLS and with which files (a
 * daemon's mgmt_tls_config serves both ways, so its certificate is also the client's). */
static void tls_sides(struct up_plan *p)
{
    json_t *dm = cfg_lookup(p->config, "motor_deploy_config.tls_config.mgmt_tls_config");
    json_t *di = cfg_lookup(p->config, "motor_deploy_config.tls_config.infer_tls_config");
    json_t *cm = cfg_lookup(p->config, "motor_controller_config.mgmt_tls_config");
    if (json_is_true(json_object_get(dm, "enable_tls")))
        side_from_block(&p->mgmt_tls, dm);
    if (json_is_true(json_object_get(di, "enable_tls")))
        side_from_block(&p->infer_tls, di);
    json_t *c = json_object_get(dm, "enable_tls") ? dm : cm; /* the deploy block wins */
    if (json_is_true(json_object_get(c, "enable_tls")))
        side_from_block(&p->ctl_tls, c);
}

static void side_release(struct up_tls_side *s)
{
    free(s->ca_file);
    free(s->cert_file);
    free(s->key_file);
    if (s->key_password)
        explicit_bzero(s->key_password, strlen(s->key_password));
    free(s->key_password);
    memset(s, 0, sizeof(*s));
}

int up_plan_build(const json_t *user, const struct up_plan_opts *o, struct up_plan *p,
                  struct cfg_errors *e)
{
    memset(p, 0, sizeof(*p));
    p->host = LOCAL_HOST;
    int start_errors = cfg_errors_count(e);
    if (!json_is_object(user)) {
        cfg_error(e, "(top level)", "must be an object");
        return -EINVAL;
    }
    p->config = json_deep_copy(user);
    json_t *deploy = json_object_get(p->config, "motor_deploy_config");
    if (deploy && !json_is_object(deploy)) {
        cfg_error(e, "motor_deploy_config", "must be an object");
        return -EINVAL;
    }

    /* Roles present and their sizes. */
    struct role_info ri[ARRAY_LEN(roles)];
    memset(ri, 0, sizeof(ri));
    int total_pods = 0;
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        json_t *sec = json_object_get(p->config, roles[i].section);
        if (!sec)
            continue;
        if (!json_is_object(sec)) {
            cfg_error(e, roles[i].section, "must be an object");
            continue;
        }
        struct role_info *r = &ri[i];
        r->present = true;
        r->section = sec;
        cfg_errors_set_prefix(e, "motor_deploy_config");
        r->instances = (int)cfg_get_int(deploy, roles[i].instances_key, 1, 0, UP_PLAN_MAX_PODS, e);
        r->pods_per_instance =
            (int)cfg_get_int(deploy, roles[i].pods_key, 1, 1, UP_PLAN_MAX_PODS, e);
        cfg_errors_set_prefix(e, "");
        r->n_pods = r->instances * r->pods_per_instance;
        total_pods += r->n_pods;
    }
    if (cfg_errors_count(e) > start_errors)
        return -EINVAL;
    if (total_pods == 0) {
        cfg_error(e, "(top level)",
                  "nothing to start: no motor_engine_{prefill,decode,union,"
                  "encode}_config section with at least one instance");
        return -EINVAL;
    }
    if (total_pods > UP_PLAN_MAX_PODS) {
        cfg_error(e, "motor_deploy_config", "%d pods in all; motor up runs at most %d", total_pods,
                  UP_PLAN_MAX_PODS);
        return -EINVAL;
    }

    /* Global single-container indexes: decode's is p_instances_num + INDEX. */
    cfg_errors_set_prefix(e, "motor_deploy_config");
    int p_num = (int)cfg_get_int(deploy, "p_instances_num", 1, 0, UP_PLAN_MAX_PODS, e);
    cfg_errors_set_prefix(e, "");
    int g = 0;
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        if (!ri[i].present || !ri[i].n_pods)
            continue;
        if (roles[i].role == WIRE_ROLE_DECODE && g < p_num)
            g = p_num;
        ri[i].g_start = g;
        g += ri[i].n_pods;
    }
    int g_total = g;

    if (localize(p, ri, o, e) < 0)
        return -EINVAL;
    if (o->tls_dir && tls_everywhere(p, ri, o->tls_dir, e) < 0)
        return -EINVAL;
    tls_sides(p);

    /* DP sizes (for the port layout) from the node manager's own derivation. */
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        if (!ri[i].present || !ri[i].n_pods)
            continue;
        struct cfg_errors tmp;
        cfg_errors_init(&tmp, "");
        int idx = roles[i].role == WIRE_ROLE_DECODE ? ri[i].g_start - p_num : ri[i].g_start;
        struct nodemgr_pod_view c;
        if (nm_view(p->config, roles[i].role, idx, "probe", o, &c, &tmp) < 0)
            copy_errors(e, up_role_name(roles[i].role), &tmp);
        else {
            ri[i].dp = c.dp_size;
            ri[i].world = c.world_size;
            ri[i].sglang = c.sglang;
            ri[i].dp_master = c.dp_size > 1 || c.dp_scale_down_proxy;
            ri[i].kv = c.kv_port > 0;
            ri[i].bootstrap = c.bootstrap_port > 0;
        }
        nodemgr_pod_view_release(&c);
        cfg_errors_release(&tmp);
        /* DP ranks across pods: in single-container mode every pod of an instance would
         * start all the role's DP ranks (its device share is the whole world) on a DP RPC
         * port of its own, and the controller would assemble the instance from the first
         * pod and refuse the others forever. Refused here, naming the keys, until the
         * node manager learns each pod's share of the ranks. nnodes > 1 with
         * data_parallel_size 1 (cross-node PCP: master + headless) is fine. */
        if (ri[i].pods_per_instance > 1 && ri[i].dp > 1)
            cfg_error(e, "motor_deploy_config",
                      "%s %d with %s.engine_config.data_parallel_size %d: motor up cannot "
                      "spread one instance's DP ranks over several pods (each pod would start "
                      "all %d ranks and the controller would keep only the first pod); set %s "
                      "to 1 (every rank in one pod), or data_parallel_size to 1 with nnodes %d "
                      "(cross-node, a master and headless pods), or run the pods as separate "
                      "node managers each with its basic_config.device_num share",
                      roles[i].pods_key, ri[i].pods_per_instance, roles[i].section, ri[i].dp,
                      ri[i].dp, roles[i].pods_key, ri[i].pods_per_instance);
    }
    if (cfg_errors_count(e) > start_errors)
        return -EINVAL;

    if (o->port_base > 0 && rewrite_ports(p, ri, g_total, o->port_base, e) < 0)
        return -EINVAL;

    /* The pods, each read back through the node manager's loader. */
    const char *job_id = cfg_get_string(deploy, "job_id", "motor", e);
    if (!*job_id)
        job_id = "motor";
    p->pods = xcalloc((size_t)total_pods, sizeof(*p->pods));
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        struct role_info *r = &ri[i];
        if (!r->present)
            continue;
        p->n_instances += r->instances;
        if (roles[i].role != WIRE_ROLE_ENCODE)
            p->n_serving += r->instances;
        for (int inst = 0; inst < r->instances; inst++) {
            for (int pod = 0; pod < r->pods_per_instance; pod++) {
                struct up_pod *d = &p->pods[p->n_pods++];
                const char *rn = up_role_name(roles[i].role);
                d->role = roles[i].role;
                d->instance = inst;
                d->pod = pod;
                d->name = r->pods_per_instance > 1 ? xasprintf("%s-%d.%d", rn, inst, pod)
                                                   : xasprintf("%s-%d", rn, inst);
                d->job_name = xasprintf("%s-%s-%d", job_id, rn, inst);
                int gi = r->g_start + inst * r->pods_per_instance + pod;
                d->index = roles[i].role == WIRE_ROLE_DECODE ? gi - p_num : gi;
                struct cfg_errors tmp;
                cfg_errors_init(&tmp, "");
                struct nodemgr_pod_view c;
                if (nm_view(p->config, d->role, d->index, d->job_name, o, &c, &tmp) < 0) {
                    copy_errors(e, d->name, &tmp);
                } else {
                    fill_pod(d, &c);
                    for (size_t w = 0; w < c.warnings.n; w++)
                        push_unique(&p->warnings, c.warnings.items[w]);
                }
                nodemgr_pod_view_release(&c);
                cfg_errors_release(&tmp);
            }
        }
    }
    if (cfg_errors_count(e) > start_errors)
        return -EINVAL;

    cfg_errors_set_prefix(e, "");
    p->coord_port = (int)cfg_get_int(p->config,
                                     "motor_coordinator_config.api_config."
                                     "coordinator_api_infer_port",
                                     1025, 1, 65535, e);
    p->coord_mgmt_port = (int)cfg_get_int(p->config,
                                          "motor_coordinator_config.api_config."
                                          "coordinator_api_mgmt_port",
                                          1026, 1, 65535, e);
    p->ctl_port = (int)cfg_get_int(p->config,
                                   "motor_controller_config.api_config."
                                   "controller_api_port",
                                   1026, 1, 65535, e);
    if (cfg_errors_count(e) > start_errors)
        return -EINVAL;
    check_collisions(p, e);
    return cfg_errors_count(e) > start_errors ? -EINVAL : 0;
}

void up_plan_release(struct up_plan *p)
{
    if (!p)
        return;
    json_decref(p->config);
    side_release(&p->ctl_tls);
    side_release(&p->mgmt_tls);
    side_release(&p->infer_tls);
    for (size_t i = 0; i < p->n_pods; i++) {
        struct up_pod *d = &p->pods[i];
        free(d->name);
        free(d->job_name);
        free(d->ports);
        free(d->engine_type);
        free(d->model);
    }
    free(p->pods);
    free(p->sqlite_path);
    wire_strlist_release(&p->notes);
    wire_strlist_release(&p->warnings);
    memset(p, 0, sizeof(*p));
}
