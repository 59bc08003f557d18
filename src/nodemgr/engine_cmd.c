/* engine_cmd — argv and environment of one engine process (§6.1–§6.3). */
#include "nodemgr/engine_cmd.h"
#include "wire/wire_msg.h"

#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* ---- growable NULL-terminated string vector ------------------------------------------ */

struct vec {
    char **v;
    size_t n;
};

static void vec_take(struct vec *a, char *s)
{
    a->v = xrealloc(a->v, (a->n + 2) * sizeof(char *));
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void vec_push(struct vec *a, const char *s)
{
    vec_take(a, xstrdup(s));
}

static void vec_free(struct vec *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    a->v = NULL;
    a->n = 0;
}

/* ---- flag rendering ------------------------------------------------------------------ */

/* Text of a scalar or nested value as a command-line argument. */
static char *value_text(const json_t *v)
{
    char num[64];
    switch (json_typeof(v)) {
    case JSON_STRING:
        return xstrdup(json_string_value(v));
    case JSON_INTEGER:
        return xasprintf("%" JSON_INTEGER_FORMAT, json_integer_value(v));
    case JSON_REAL:
        wire_fmt_double(json_real_value(v), num, sizeof(num));
        return xstrdup(num);
    case JSON_TRUE:
        return xstrdup("true");
    case JSON_FALSE:
        return xstrdup("false");
    case JSON_NULL:
        return xstrdup("null");
    case JSON_OBJECT:
    case JSON_ARRAY:
        return wire_json_compact(v);
    }
    return xstrdup("");
}

static void render_flags(struct vec *av, json_t *flags)
{
    const char *key;
    json_t *v;
    json_object_foreach(flags, key, v)
    {
        char *flag = xasprintf("--%s", key);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        switch (json_typeof(v)) {
        case JSON_TRUE:
            vec_take(av, flag);
            flag = NULL;
            break;
        case JSON_FALSE:
        case JSON_NULL:
            break;
        case JSON_ARRAY:
            if (json_array_size(v) == 0)
                break;
            vec_take(av, flag);
            flag = NULL;
            for (size_t i = 0; i < json_array_size(v); i++) {
                json_t *item = json_array_get(v, i);
                if (!json_is_null(item))
                    vec_take(av, value_text(item));
            }
            break;
        default:
            vec_take(av, flag);
            flag = NULL;
            vec_take(av, value_text(v));
            break;
        }
        free(flag);
    }
}

/* ---- shared pieces ------------------------------------------------------------------- */

static int check_launch(const struct engine_launch *l, struct wire_err *err)
{
    if (!l || !l->endpoint) {
        wire_err_set(err, "launch: no endpoint");
        return -EINVAL;
    }
    if ((unsigned)l->role >= WIRE_ROLE_COUNT) {
        wire_err_set(err, "launch: invalid role %d", (int)l->role);
        return -EINVAL;
    }
    if (l->instance_id < 0 || l->instance_id > WIRE_ID_MAX) {
        wire_err_set(err, "launch: instance id %" PRId64 " out of range", l->instance_id);
        return -EINVAL;
    }
    if (!l->endpoint->ip || !*l->endpoint->ip) {
        wire_err_set(err, "endpoint %" PRId64 ": empty ip", l->endpoint->id);
        return -EINVAL;
    }
    if (wire_endpoint_port(l->endpoint) == 0) {
        wire_err_set(err, "endpoint %" PRId64 ": invalid business port \"%.20s\"", l->endpoint->id,
                     l->endpoint->business_port ? l->endpoint->business_port : "");
        return -EINVAL;
    }
    if (l->endpoint->id < 0 || l->endpoint->id > 65535) {
        wire_err_set(err, "endpoint %" PRId64 ": DP rank outside 0..65535", l->endpoint->id);
        return -EINVAL;
    }
    if (l->endpoint_index < 0 || l->node_rank < 0) {
        wire_err_set(err, "launch: negative endpoint index or node rank");
        return -EINVAL;
    }
    return 0;
}

static const struct wire_parallel_config *launch_parallel(const struct nm_config *cfg,
                                                          const struct engine_launch *l)
{
    return l->parallel ? l->parallel : &cfg->parallel;
}

static int launch_rpc_port(const struct nm_config *cfg, const struct engine_launch *l)
{
    return l->dp_rpc_port > 0 ? l->dp_rpc_port : cfg->dp_rpc_port;
}

static const char *launch_master(const struct engine_launch *l)
{
    return (l->master_dp_ip && *l->master_dp_ip) ? l->master_dp_ip : l->endpoint->ip;
}

static json_t *engine_flags_base(const struct nm_config *cfg)
{
    json_t *d = json_deep_copy(cfg->engine_config ? cfg->engine_config : json_object());
    if (!d)
        d = json_object();
    json_object_del(d, "engine_type");
    return d;
}

/* obj[key] as an object, created (or replacing a non-object) when needed. Borrowed. */
static json_t *child_object(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_object(v)) {
        v = json_object();
        json_object_set_new(obj, key, v);
    }
    return v;
}

/* kv_connector_extra_config.{prefill,decode} += {dp_size, tp_size, pp_size}. */
static void merge_role_sizes(const struct nm_config *cfg, const struct engine_launch *l,
                             json_t *connector)
{
    static const enum wire_role roles[] = {WIRE_ROLE_PREFILL, WIRE_ROLE_DECODE};
    json_t *extra = NULL;
    for (size_t i = 0; i < ARRAY_LEN(roles); i++) {
        enum wire_role r = roles[i];
        const struct wire_parallel_config *p = NULL;
        if (r == l->role)
            p = launch_parallel(cfg, l);
        else if (cfg->has_role_parallel[r])
            p = &cfg->role_parallel[r];
        if (!p)
            continue;
        if (!extra)
            extra = child_object(connector, "kv_connector_extra_config");
        json_t *sub = child_object(extra, wire_role_str(r));
        json_object_set_new(sub, "dp_size", json_integer(p->dp_size));
        json_object_set_new(sub, "tp_size", json_integer(p->tp_size));
        json_object_set_new(sub, "pp_size", json_integer(p->pp_size));
    }
}

/* §6.2 rule 7 on the flags' kv_transfer_config (modified in place). */
static int kv_transfer_rules(const struct nm_config *cfg, const struct engine_launch *l,
                             json_t *flags, struct wire_err *err)
{
    json_t *kvt = json_object_get(flags, "kv_transfer_config");
    if (!json_is_object(kvt))
        return 0;
    if (cfg->sc.enabled && cfg->sc.kv_port > 0) {
        json_t *old = json_object_get(kvt, "kv_port");
        char port[16];
        snprintf(port, sizeof(port), "%d", cfg->sc.kv_port);
        json_object_set_new(kvt, "kv_port",
                            json_is_integer(old) ? json_integer(cfg->sc.kv_port)
                                                 : json_string(port));
    }
    if (l->role != WIRE_ROLE_PREFILL && l->role != WIRE_ROLE_DECODE)
        return 0; /* union (and encode) pass kv_transfer_config through */
    const char *kv_role = l->role == WIRE_ROLE_PREFILL ? "kv_producer" : "kv_consumer";
    char id[24];
    snprintf(id, sizeof(id), "%" PRId64, l->instance_id);
    const char *conn = json_string_value(json_object_get(kvt, "kv_connector"));
    if (conn && strcmp(conn, "UCMConnector") == 0) {
        wire_err_set(err,
                     "kv_transfer_config: UCMConnector alone cannot serve the %s role; use "
                     "a MultiConnector with a transport connector first",
                     wire_role_str(l->role));
        return -EINVAL;
    }
    json_object_set_new(kvt, "kv_role", json_string(kv_role));
    json_object_set_new(kvt, "engine_id", json_string(id));
    if (!conn || strcmp(conn, "MultiConnector") != 0) {
        merge_role_sizes(cfg, l, kvt);
        return 0;
    }
    json_t *extra = json_object_get(kvt, "kv_connector_extra_config");
    json_t *list = json_object_get(extra, "connectors");
    if (!json_is_array(list) || json_array_size(list) < 2 ||
        !json_is_object(json_array_get(list, 0)) || !json_is_object(json_array_get(list, 1))) {
        wire_err_set(err, "kv_transfer_config.kv_connector_extra_config.connectors: "
                          "MultiConnector needs at least 2 connector objects");
        return -EINVAL;
    }
    json_t *transport = json_array_get(list, 0);
    json_object_set_new(transport, "kv_role", json_string(kv_role));
    merge_role_sizes(cfg, l, transport);
    json_t *store = json_array_get(list, 1);
    const char *sname = json_string_value(json_object_get(store, "kv_connector"));
    if (sname && strcmp(sname, "UCMConnector") == 0) {
        json_object_set_new(store, "kv_role", json_string("kv_both"));
    } else if (sname && strcmp(sname, "MooncakeStoreConnectorV1") == 0) {
        json_object_set_new(child_object(store, "kv_connector_extra_config"), "mooncake_rpc_port",
                            json_string(id));
    } else if (sname && strcmp(sname, "AscendStoreConnector") == 0) {
        json_object_set_new(child_object(store, "kv_connector_extra_config"), "lookup_rpc_port",
                            json_string(id));
    } else {
        wire_err_set(err,
                     "kv_transfer_config.kv_connector_extra_config.connectors[1]: store connector "
                     "\"%.40s\" is not supported (UCMConnector, MooncakeStoreConnectorV1, "
                     "AscendStoreConnector)",
                     sname ? sname : "");
        return -EINVAL;
    }
    return 0;
}

/* The vllm flag dict (§6.2 rules 1-7). New reference or NULL (err set). */
static json_t *vllm_flags(const struct nm_config *cfg, const struct engine_launch *l,
                          struct wire_err *err)
{
    json_t *d = engine_flags_base(cfg);
    const struct wire_parallel_config *p = launch_parallel(cfg, l);
    const char *master = launch_master(l);
    if (!json_object_get(d, "disable_access_log_for_endpoints"))
        json_object_set_new(d, "disable_access_log_for_endpoints", json_string("/health,/metrics"));
    json_object_set_new(d, "host", json_string(l->endpoint->ip));
    json_object_set_new(d, "port", json_string(l->endpoint->business_port));
    if (p->dp_size > 1) {
        json_object_set_new(d, "data_parallel_address", json_string(master));
        json_object_set_new(d, "data_parallel_rpc_port", json_integer(launch_rpc_port(cfg, l)));
        json_object_set_new(d, "data_parallel_rank", json_integer(l->endpoint->id));
    }
    if (cfg->nnodes > 1 && json_object_get(d, "master_port")) {
        json_object_set_new(d, "node_rank", json_integer(l->node_rank));
        json_object_set_new(d, "master_addr", json_string(master));
        if (l->node_rank != 0)
            json_object_set_new(d, "headless", json_true());
        else
            json_object_del(d, "headless");
    }
    if (kv_transfer_rules(cfg, l, d, err) < 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

static json_t *sglang_flags(const struct nm_config *cfg, const struct engine_launch *l,
                            struct wire_err *err)
{
    if (l->role == WIRE_ROLE_ENCODE) {
        wire_err_set(err, "sglang does not support the encode role");
        return NULL;
    }
    json_t *d = engine_flags_base(cfg);
    json_object_del(d, "kv_transfer_config");
    json_object_set_new(d, "enable_metrics", json_true());
    json_object_set_new(d, "host", json_string(l->endpoint->ip));
    json_object_set_new(d, "port", json_string(l->endpoint->business_port));
    if (cfg->nnodes > 1) {
        const char *master = launch_master(l);
        char *addr = strchr(master, ':') ? xasprintf("[%s]:%d", master, launch_rpc_port(cfg, l))
                                         : xasprintf("%s:%d", master, launch_rpc_port(cfg, l));
        json_object_set_new(d, "dist_init_addr", json_string(addr));
        free(addr);
        json_object_set_new(d, "node_rank", json_integer(l->node_rank));
    }
    if (l->role == WIRE_ROLE_PREFILL || l->role == WIRE_ROLE_DECODE)
        json_object_set_new(d, "disaggregation_mode", json_string(wire_role_str(l->role)));
    else
        json_object_del(d, "disaggregation_mode");
    return d;
}

/* {model} of a cmd template. */
static const char *model_of(const struct nm_config *cfg)
{
    const char *m = json_string_value(json_object_get(cfg->engine_config, "model"));
    if (!m)
        m = json_string_value(json_object_get(cfg->engine_config, "model_path"));
    return m ? m : (cfg->model_name ? cfg->model_name : "");
}

static char *substitute(const char *tmpl, const struct nm_config *cfg,
                        const struct engine_launch *l, struct wire_err *err)
{
    char bad[96];
    if (nm_config_check_template(tmpl, bad, sizeof(bad)) < 0) {
        wire_err_set(err, "engine_command: \"%.60s\": %s", tmpl, bad);
        return NULL;
    }
    const struct wire_parallel_config *p = launch_parallel(cfg, l);
    struct strbuf sb;
    strbuf_init(&sb, 64 * 1024);
    for (const char *s = tmpl; *s; s++) {
        if ((s[0] == '{' && s[1] == '{') || (s[0] == '}' && s[1] == '}')) {
            (void)strbuf_putc(&sb, *s);
            s++;
            continue;
        }
        if (*s != '{') {
            (void)strbuf_putc(&sb, *s);
            continue;
        }
        const char *end = strchr(s, '}');
        size_t n = (size_t)(end - s - 1);
        const char *name = s + 1;
#define IS(k) (n == strlen(k) && strncmp(name, k, n) == 0)
        if (IS("host"))
            (void)strbuf_puts(&sb, l->endpoint->ip);
        else if (IS("port"))
            (void)strbuf_puts(&sb, l->endpoint->business_port);
        else if (IS("dp_rank"))
            (void)strbuf_appendf(&sb, "%" PRId64, l->endpoint->id);
        else if (IS("dp_size"))
            (void)strbuf_appendf(&sb, "%d", p->dp_size);
        else if (IS("node_rank"))
            (void)strbuf_appendf(&sb, "%d", l->node_rank);
        else if (IS("master_addr"))
            (void)strbuf_puts(&sb, launch_master(l));
        else if (IS("instance_id"))
            (void)strbuf_appendf(&sb, "%" PRId64, l->instance_id);
        else if (IS("role"))
            (void)strbuf_puts(&sb, wire_role_str(l->role));
        else if (IS("model"))
            (void)strbuf_puts(&sb, model_of(cfg));
#undef IS
        s = end;
    }
    if (sb.overflow) {
        strbuf_release(&sb);
        wire_err_set(err, "engine_command: argument too long after substitution");
        return NULL;
    }
    return strbuf_take(&sb);
}

/* ---- environment --------------------------------------------------------------------- */

char *engine_cmd_visible_devices(const struct nm_config *cfg, int endpoint_index)
{
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    int offset = cfg->sc.enabled ? cfg->sc.device_offset : 0;
    if (cfg->enable_multi_endpoints && cfg->device_num > 0) {
        int lws = cfg->parallel.local_world_size > 0 ? cfg->parallel.local_world_size : 1;
        int64_t start = ((int64_t)endpoint_index * lws) % cfg->device_num;
        for (int k = 0; k < lws; k++)
            (void)strbuf_appendf(&sb, "%s%" PRId64, k ? "," : "",
                                 (start + k) % cfg->device_num + offset);
    } else if (cfg->sc.enabled) {
        for (int k = 0; k < cfg->sc.device_num; k++)
            (void)strbuf_appendf(&sb, "%s%d", k ? "," : "", offset + k);
    }
    return strbuf_take(&sb);
}

static void build_env(const struct nm_config *cfg, const struct engine_launch *l, struct vec *env)
{
    char *dev = engine_cmd_visible_devices(cfg, l->endpoint_index);
    if (*dev)
        vec_take(env, xasprintf("ASCEND_RT_VISIBLE_DEVICES=%s", dev));
    free(dev);
    bool vllm_like = cfg->engine_type == NM_ENGINE_VLLM || cfg->engine_type == NM_ENGINE_SIM;
    if (vllm_like && !nm_config_env(cfg, "VLLM_HOST_IP"))
        vec_take(env, xasprintf("VLLM_HOST_IP=%s", cfg->pod_ip));
    const char *v6 = nm_config_env(cfg, "MOONCAKE_ASCEND_IPV6_EXPERIMENT");
    if (v6 && strcmp(v6, "1") == 0 && !nm_config_env(cfg, "MC_USE_IPV6"))
        vec_push(env, "MC_USE_IPV6=1");
    if (cfg->engine_type == NM_ENGINE_SGLANG)
        vec_push(env, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=true");
}

/* ---- entry points -------------------------------------------------------------------- */

int engine_cmd_build(const struct nm_config *cfg, const struct engine_launch *l,
                     struct engine_cmd *out, struct wire_err *err)
{
    memset(out, 0, sizeof(*out));
    if (check_launch(l, err) < 0)
        return -EINVAL;
    struct vec av = {0}, env = {0};
    json_t *flags = NULL;
    switch (cfg->engine_type) {
    case NM_ENGINE_VLLM:
    case NM_ENGINE_SIM:
        flags = vllm_flags(cfg, l, err);
        if (!flags)
            goto fail;
        if (cfg->engine_type == NM_ENGINE_VLLM) {
            vec_push(&av, "vllm");
            vec_push(&av, "serve");
        } else {
            vec_push(&av, cfg->motor_bin ? cfg->motor_bin : "motor");
            vec_push(&av, "engine-sim");
        }
        render_flags(&av, flags);
        break;
    case NM_ENGINE_SGLANG:
        flags = sglang_flags(cfg, l, err);
        if (!flags)
            goto fail;
        vec_push(&av, "python3");
        vec_push(&av, "-m");
        vec_push(&av, "sglang.launch_server");
        render_flags(&av, flags);
        break;
    case NM_ENGINE_CMD:
        if (cfg->engine_command.n == 0) {
            wire_err_set(err, "engine_command: empty");
            goto fail;
        }
        for (size_t i = 0; i < cfg->engine_command.n; i++) {
            char *arg = substitute(cfg->engine_command.items[i], cfg, l, err);
            if (!arg)
                goto fail;
            vec_take(&av, arg);
        }
        break;
    default:
        wire_err_set(err, "unknown engine type %d", (int)cfg->engine_type);
        goto fail;
    }
    json_decref(flags);
    build_env(cfg, l, &env);
    if (!env.v)
        env.v = xcalloc(1, sizeof(char *)); /* an empty, still NULL-terminated overlay */
    out->argv = av.v;
    out->argc = av.n;
    out->env = env.v;
    out->envc = env.n;
    wire_d2d_peers_for(l->d2d_peer_ips, l->endpoint->id, &out->d2d_peers);
    return 0;
fail:
    json_decref(flags);
    vec_free(&av);
    vec_free(&env);
    return -EINVAL;
}

void engine_cmd_release(struct engine_cmd *c)
{
    if (!c)
        return;
    struct vec a = {c->argv, c->argc}, e = {c->env, c->envc};
    vec_free(&a);
    vec_free(&e);
    wire_strlist_release(&c->d2d_peers);
    memset(c, 0, sizeof(*c));
}

const char *engine_cmd_getenv(const struct engine_cmd *c, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; c && i < c->envc; i++)
        if (strncmp(c->env[i], name, n) == 0 && c->env[i][n] == '=')
            return c->env[i] + n + 1;
    return NULL;
}

char *engine_cmd_render(const struct engine_cmd *c)
{
    struct strbuf sb;
    strbuf_init(&sb, 1 << 20);
    for (size_t i = 0; c && i < c->argc; i++) {
        const char *a = c->argv[i];
        if (i)
            (void)strbuf_putc(&sb, ' ');
        if (*a && !strpbrk(a, " \t\n'\"\\$`{}*?;&|<>()")) {
            (void)strbuf_puts(&sb, a);
            continue;
        }
        (void)strbuf_putc(&sb, '\'');
        for (const char *p = a; *p; p++) {
            if (*p == '\'')
                (void)strbuf_puts(&sb, "'\\''");
            else
                (void)strbuf_putc(&sb, *p);
        }
        (void)strbuf_putc(&sb, '\'');
    }
    return strbuf_take(&sb);
}
