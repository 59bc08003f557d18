#include "controller/ctl_config.h"

#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v && *v ? v : def;
}

void ctlcfg_init(struct ctlcfg *c)
{
    memset(c, 0, sizeof(*c));
    c->host = xstrdup(env_or("POD_IP", "127.0.0.1"));
    c->port = 1026;
    c->obs_port = 1027;
    c->assemble_timeout_ms = 600000;
    c->assembler_check_ms = 30000;
    c->cmd_send_interval_ms = 30000;
    c->manager_check_ms = 1000;
    c->hb_timeout_active_ms = 10000;
    c->hb_timeout_other_ms = 300000;
    c->expired_timeout_ms = 1200000;
    c->send_cmd_retry_times = 3;
    c->start_cmd_timeout_ms = 5000;
    c->nm_probe_timeout_ms = 3000;
    c->coordinator_push = true;
    c->coordinator_host = xstrdup(env_or("COORDINATOR_SERVICE", "127.0.0.1"));
    c->coordinator_port = 1026;
    c->coordinator_hb_ms = 10000;
    c->coordinator_sync_ms = 300000;
    c->coordinator_timeout_ms = 5000;
    c->ft_enable = true;
    c->strategy_check_ms = 10000;
    c->fault_window_ms = 60000;
    c->relaunch_enable = true;
    c->relaunch_timeout_ms = 600000;
    c->relaunch_poll_ms = 5000;
    c->relaunch_retries = 3;
    c->relaunch_unreachable = 3;
    c->relaunch_backoff_ms = 2000;
    c->sd_request_timeout_ms = 11000;
    c->sd_poll_ms = 1000;
    c->sd_deadline_ms = 30000;
    c->reconfig_enable = true;
    c->store = CTLCFG_STORE_SQLITE;
    c->sqlite_path = xstrdup("motor-controller.db");
    c->etcd_endpoints = xcalloc(2, sizeof(char *));
    c->etcd_endpoints[0] = xstrdup("http://127.0.0.1:2379");
    c->n_etcd_endpoints = 1;
    c->etcd_prefix = xstrdup("/motor/controller/");
    c->etcd_lease_ttl_s = 15;
    c->etcd_timeout_ms = 5000;
    c->leader_retry_ms = 5000;
}

static void tls_release(struct ctlcfg_tls *t)
{
    free(t->ca_file);
    free(t->cert_file);
    free(t->key_file);
    if (t->key_password)
        explicit_bzero(t->key_password, strlen(t->key_password));
    free(t->key_password);
    memset(t, 0, sizeof(*t));
}

static void free_endpoints(struct ctlcfg *c)
{
    for (size_t i = 0; c->etcd_endpoints && i < c->n_etcd_endpoints; i++)
        free(c->etcd_endpoints[i]);
    free(c->etcd_endpoints);
    c->etcd_endpoints = NULL;
    c->n_etcd_endpoints = 0;
}

void ctlcfg_release(struct ctlcfg *c)
{
    if (!c)
        return;
    free(c->host);
    tls_release(&c->tls);
    free(c->coordinator_host);
    if (c->coordinator_key)
        explicit_bzero(c->coordinator_key, strlen(c->coordinator_key));
    free(c->coordinator_key);
    free(c->sqlite_path);
    free_endpoints(c);
    free(c->etcd_prefix);
    memset(c, 0, sizeof(*c));
}

const char *ctlcfg_store_name(enum ctlcfg_store s)
{
    switch (s) {
    case CTLCFG_STORE_SQLITE:
        return "sqlite";
    case CTLCFG_STORE_ETCD:
        return "etcd";
    case CTLCFG_STORE_MEMORY:
        return "memory";
    }
    return "?";
}

double ctlcfg_guard_lease_s(const struct ctlcfg *c)
{
    double lease = 2.0 * (double)c->sd_deadline_ms / 1000.0 +
                   4.0 * (double)c->sd_request_timeout_ms / 1000.0 +
                   MOTOR_MAX(5.0, (double)c->sd_poll_ms / 1000.0);
    return lease > 300.0 ? 300.0 : lease;
}

/* Seconds (int or real) in [min, max] into milliseconds. */
static int64_t get_ms(json_t *obj, const char *path, int64_t def_ms, double min_s, double max_s,
                      struct cfg_errors *e)
{
    double v = cfg_get_double(obj, path, (double)def_ms / 1000.0, min_s, max_s, e);
    return (int64_t)llround(v * 1000.0);
}

static void set_str(char **dst, const char *v)
{
    if (!v)
        return;
    free(*dst);
    *dst = xstrdup(v);
}

/* The TLS keys of the block at path `at` of obj (missing block: nothing). */
static void apply_tls(struct ctlcfg_tls *t, json_t *obj, const char *at, struct cfg_errors *e)
{
    if (!cfg_get_object(obj, at, e))
        return;
    char p[160];
#define TLS_KEY(k) (snprintf(p, sizeof(p), "%s.%s", at, k), p)
    t->enable = cfg_get_bool(obj, TLS_KEY("enable_tls"), t->enable, e);
    set_str(&t->ca_file, cfg_get_string(obj, TLS_KEY("ca_file"), NULL, e));
    set_str(&t->cert_file, cfg_get_string(obj, TLS_KEY("cert_file"), NULL, e));
    set_str(&t->key_file, cfg_get_string(obj, TLS_KEY("key_file"), NULL, e));
    const char *pw = cfg_get_string(obj, TLS_KEY("passwd_file"), NULL, e);
#undef TLS_KEY
    if (pw && *pw && access(pw, R_OK) == 0) {
        char *secret = NULL;
        if (cfg_read_secret(pw, &secret) == 0) {
            free(t->key_password);
            t->key_password = secret;
        }
    }
}

static void check_tls_files(struct ctlcfg_tls *t, const char *where, struct cfg_errors *e)
{
    if (!t->enable)
        return;
    const char *files[] = {t->cert_file, t->key_file};
    const char *names[] = {"cert_file", "key_file"};
    for (size_t i = 0; i < ARRAY_LEN(files); i++) {
        char path[128];
        snprintf(path, sizeof(path), "%s.%s", where, names[i]);
        if (!files[i] || !*files[i])
            cfg_error(e, path, "required when enable_tls is true");
        else if (access(files[i], R_OK) != 0)
            cfg_error(e, path, "cannot read \"%s\": %s", files[i], strerror(errno));
    }
    if (t->ca_file && *t->ca_file && access(t->ca_file, R_OK) != 0) {
        char path[128];
        snprintf(path, sizeof(path), "%s.ca_file", where);
        cfg_error(e, path, "cannot read \"%s\": %s", t->ca_file, strerror(errno));
    }
}

static void apply_store(struct ctlcfg *c, json_t *ctl, struct cfg_errors *e)
{
    /* Upstream's etcd_config / standby_config first, so store_config overrides them. */
    json_t *etcd = cfg_get_object(ctl, "etcd_config", e);
    if (etcd) {
        const char *host =
            cfg_get_string(ctl, "etcd_config.etcd_host", "etcd.default.svc.cluster.local", e);
        int64_t port = cfg_get_int(ctl, "etcd_config.etcd_port", 2379, 1, 65535, e);
        bool persist = cfg_get_bool(ctl, "etcd_config.enable_etcd_persistence", false, e);
        c->etcd_timeout_ms =
            get_ms(ctl, "etcd_config.etcd_timeout", c->etcd_timeout_ms, 0.1, 600, e);
        if (persist) {
            free_endpoints(c);
            c->etcd_endpoints = xcalloc(2, sizeof(char *));
            c->etcd_endpoints[0] = xasprintf("http://%s:%lld", host, (long long)port);
            c->n_etcd_endpoints = 1;
            c->store = CTLCFG_STORE_ETCD;
        }
    }
    json_t *sb = cfg_get_object(ctl, "standby_config", e);
    if (sb) {
        c->etcd_lease_ttl_s = (int)cfg_get_int(ctl, "standby_config.master_lock_ttl",
                                               c->etcd_lease_ttl_s, 1, 3600, e);
        c->leader_retry_ms = get_ms(ctl, "standby_config.master_lock_retry_interval",
                                    c->leader_retry_ms, 0.05, 3600, e);
        (void)cfg_get_bool(ctl, "standby_config.enable_master_standby", false, e);
        (void)cfg_get_string(ctl, "standby_config.master_lock_key", NULL, e);
    }
    json_t *st = cfg_get_object(ctl, "store_config", e);
    if (!st)
        return;
    static const char *const backends[] = {"sqlite", "etcd", "memory", NULL};
    const char *b = cfg_get_enum(ctl, "store_config.backend", NULL, backends, e);
    if (b)
        c->store = strcmp(b, "etcd") == 0     ? CTLCFG_STORE_ETCD
                   : strcmp(b, "memory") == 0 ? CTLCFG_STORE_MEMORY
                                              : CTLCFG_STORE_SQLITE;
    const char *p = cfg_get_string(ctl, "store_config.sqlite_path", NULL, e);
    if (p && !*p)
        cfg_error(e, "store_config.sqlite_path", "must not be empty");
    else
        set_str(&c->sqlite_path, p);
    json_t *eps = cfg_lookup(ctl, "store_config.etcd_endpoints");
    if (eps && json_is_string(eps)) {
        const char *s = cfg_get_string(ctl, "store_config.etcd_endpoints", NULL, e);
        free_endpoints(c);
        c->etcd_endpoints = xcalloc(2, sizeof(char *));
        c->etcd_endpoints[0] = xstrdup(s);
        c->n_etcd_endpoints = 1;
    } else if (eps) {
        json_t *arr = cfg_get_array(ctl, "store_config.etcd_endpoints", e);
        if (arr && json_array_size(arr) == 0)
            cfg_error(e, "store_config.etcd_endpoints", "must not be empty");
        else if (arr) {
            size_t n = json_array_size(arr);
            bool ok = true;
            for (size_t i = 0; i < n; i++) {
                if (!json_is_string(json_array_get(arr, i))) {
                    cfg_error(e, "store_config.etcd_endpoints", "element %zu must be a string", i);
                    ok = false;
                }
            }
            if (ok) {
                free_endpoints(c);
                c->etcd_endpoints = xcalloc(n + 1, sizeof(char *));
                for (size_t i = 0; i < n; i++)
                    c->etcd_endpoints[i] = xstrdup(json_string_value(json_array_get(arr, i)));
                c->n_etcd_endpoints = n;
            }
        }
    }
    for (size_t i = 0; i < c->n_etcd_endpoints; i++) {
        const char *u = c->etcd_endpoints[i];
        if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
            cfg_error(e, "store_config.etcd_endpoints",
                      "\"%s\" must start with http:// or https://", u);
    }
    const char *pre = cfg_get_string(ctl, "store_config.etcd_prefix", NULL, e);
    if (pre && !*pre)
        cfg_error(e, "store_config.etcd_prefix", "must not be empty");
    else
        set_str(&c->etcd_prefix, pre);
    c->etcd_lease_ttl_s =
        (int)cfg_get_int(ctl, "store_config.etcd_lease_ttl", c->etcd_lease_ttl_s, 1, 3600, e);
    c->etcd_timeout_ms = get_ms(ctl, "store_config.etcd_timeout", c->etcd_timeout_ms, 0.1, 600, e);
    c->leader_retry_ms =
        get_ms(ctl, "store_config.leader_retry_interval", c->leader_retry_ms, 0.05, 3600, e);
}

static void apply_controller(struct ctlcfg *c, json_t *ctl, struct cfg_errors *e)
{
    json_t *api = cfg_get_object(ctl, "api_config", e);
    if (api) {
        set_str(&c->host, cfg_get_string(ctl, "api_config.controller_api_host", NULL, e));
        c->port = (int)cfg_get_int(ctl, "api_config.controller_api_port", c->port, 0, 65535, e);
        (void)cfg_get_string(ctl, "api_config.controller_api_dns", NULL, e);
        c->obs_port = (int)cfg_get_int(ctl, "api_config.observability_api_port", c->obs_port, 0,
                                       65535, e);
    }
    c->obs_enable =
        cfg_get_bool(ctl, "observability_config.observability_enable", c->obs_enable, e);
    (void)cfg_get_double(ctl, "observability_config.metrics_ttl", 5, 0, 86400, e);
    if (c->host && !*c->host)
        cfg_error(e, "api_config.controller_api_host", "must not be empty");
    apply_tls(&c->tls, ctl, "mgmt_tls_config", e);

    json_t *ic = cfg_get_object(ctl, "instance_config", e);
    if (ic) {
        c->assemble_timeout_ms = get_ms(ctl, "instance_config.instance_assemble_timeout",
                                        c->assemble_timeout_ms, 0.1, 86400, e);
        c->assembler_check_ms = get_ms(ctl, "instance_config.instance_assembler_check_interval",
                                       c->assembler_check_ms, 0.01, 3600, e);
        c->cmd_send_interval_ms =
            get_ms(ctl, "instance_config.instance_assembler_cmd_send_interval",
                   c->cmd_send_interval_ms, 0.01, 3600, e);
        c->manager_check_ms = get_ms(ctl, "instance_config.instance_manager_check_interval",
                                     c->manager_check_ms, 0.01, 3600, e);
        c->hb_timeout_active_ms = get_ms(ctl, "instance_config.instance_heartbeat_timeout",
                                         c->hb_timeout_active_ms, 0.1, 86400, e);
        c->hb_timeout_other_ms = get_ms(ctl, "instance_config.instance_heartbeat_timeout_inactive",
                                        c->hb_timeout_other_ms, 0.1, 86400, e);
        c->expired_timeout_ms = get_ms(ctl, "instance_config.instance_expired_timeout",
                                       c->expired_timeout_ms, 0.1, 864000, e);
        c->send_cmd_retry_times = (int)cfg_get_int(ctl, "instance_config.send_cmd_retry_times",
                                                   c->send_cmd_retry_times, 1, 1000, e);
        c->start_cmd_timeout_ms =
            get_ms(ctl, "instance_config.start_cmd_timeout", c->start_cmd_timeout_ms, 0.1, 600, e);
        c->nm_probe_timeout_ms =
            get_ms(ctl, "instance_config.nm_probe_timeout", c->nm_probe_timeout_ms, 0.1, 600, e);
    }

    json_t *ev = cfg_get_object(ctl, "event_config", e);
    if (ev) {
        (void)cfg_get_double(ctl, "event_config.event_consumer_sleep_interval", 1.0, 0, 3600, e);
        c->coordinator_hb_ms = get_ms(ctl, "event_config.coordinator_heartbeat_interval",
                                      c->coordinator_hb_ms, 0.05, 3600, e);
        c->coordinator_sync_ms = get_ms(ctl, "event_config.coordinator_set_sync_interval",
                                        c->coordinator_sync_ms, 0, 86400, e);
        c->coordinator_push =
            cfg_get_bool(ctl, "event_config.coordinator_push", c->coordinator_push, e);
        c->coordinator_timeout_ms = get_ms(ctl, "event_config.coordinator_request_timeout",
                                           c->coordinator_timeout_ms, 0.1, 600, e);
    }

    json_t *ft = cfg_get_object(ctl, "fault_tolerance_config", e);
    if (ft) {
        c->ft_enable =
            cfg_get_bool(ctl, "fault_tolerance_config.enable_fault_tolerance", c->ft_enable, e);
        c->strategy_check_ms = get_ms(ctl, "fault_tolerance_config.strategy_center_check_interval",
                                      c->strategy_check_ms, 0.01, 3600, e);
        c->fault_window_ms = get_ms(ctl, "fault_tolerance_config.fault_collection_timeout_seconds",
                                    c->fault_window_ms, 0.1, 86400, e);
        (void)cfg_get_bool(ctl, "fault_tolerance_config.enable_token_reinference", true, e);
        c->relaunch_enable = cfg_get_bool(ctl, "fault_tolerance_config.enable_engine_relaunch",
                                          c->relaunch_enable, e);
        c->relaunch_timeout_ms =
            get_ms(ctl, "fault_tolerance_config.engine_relaunch_complete_timeout_sec",
                   c->relaunch_timeout_ms, 0.1, 86400, e);
        c->relaunch_poll_ms =
            get_ms(ctl, "fault_tolerance_config.engine_relaunch_poll_interval_sec",
                   c->relaunch_poll_ms, 0.01, 3600, e);
        c->relaunch_retries =
            (int)cfg_get_int(ctl, "fault_tolerance_config.engine_relaunch_dispatch_retries",
                             c->relaunch_retries, 1, 100, e);
        c->relaunch_unreachable =
            (int)cfg_get_int(ctl, "fault_tolerance_config.engine_relaunch_nm_unreachable_threshold",
                             c->relaunch_unreachable, 1, 1000, e);
        c->relaunch_backoff_ms =
            get_ms(ctl, "fault_tolerance_config.engine_relaunch_dispatch_backoff_sec",
                   c->relaunch_backoff_ms, 0, 600, e);
        c->scale_down_enable = cfg_get_bool(ctl, "fault_tolerance_config.enable_dp_scale_down",
                                            c->scale_down_enable, e);
        c->scale_up_enable =
            cfg_get_bool(ctl, "fault_tolerance_config.enable_dp_scale_up", c->scale_up_enable, e);
        c->reconfig_enable = cfg_get_bool(ctl, "fault_tolerance_config.enable_reconfiguration",
                                          c->reconfig_enable, e);
        json_t *sd = cfg_get_object(ctl, "fault_tolerance_config.dp_scale_down_config", e);
        if (sd) {
            /* (0, 60]: a zero timeout or poll interval would spin. */
            c->sd_request_timeout_ms =
                get_ms(ctl, "fault_tolerance_config.dp_scale_down_config.request_timeout_sec",
                       c->sd_request_timeout_ms, 0.001, 60, e);
            c->sd_poll_ms =
                get_ms(ctl, "fault_tolerance_config.dp_scale_down_config.poll_interval_sec",
                       c->sd_poll_ms, 0.001, 60, e);
            c->sd_deadline_ms =
                get_ms(ctl, "fault_tolerance_config.dp_scale_down_config.execution_deadline_sec",
                       c->sd_deadline_ms, 1, 600, e);
        }
    }
    apply_store(c, ctl, e);
}

static void apply_coordinator(struct ctlcfg *c, json_t *coord, struct cfg_errors *e)
{
    json_t *api = cfg_get_object(coord, "api_config", e);
    if (api) {
        set_str(&c->coordinator_host,
                cfg_get_string(coord, "api_config.coordinator_api_dns", NULL, e));
        c->coordinator_port = (int)cfg_get_int(coord, "api_config.coordinator_api_mgmt_port",
                                               c->coordinator_port, 1, 65535, e);
    }
    if (c->coordinator_host && !*c->coordinator_host)
        cfg_error(e, "api_config.coordinator_api_dns", "must not be empty");
    json_t *mk = cfg_get_object(coord, "mgmt_api_key_config", e);
    if (mk && cfg_get_bool(coord, "mgmt_api_key_config.enable_api_key", false, e)) {
        const char *f = cfg_get_string(coord, "mgmt_api_key_config.api_key_file", NULL, e);
        char *key = NULL;
        int rc = f && *f ? cfg_read_secret(f, &key) : -ENOENT;
        if (rc < 0)
            cfg_error(e, "mgmt_api_key_config.api_key_file", "cannot read a key from \"%s\": %s",
                      f ? f : "", strerror(-rc));
        else {
            free(c->coordinator_key);
            c->coordinator_key = key;
        }
    }
}

void ctlcfg_apply(struct ctlcfg *c, json_t *root, struct cfg_errors *e)
{
    if (!json_is_object(root))
        return;
    json_t *ctl = json_object_get(root, "motor_controller_config");
    bool whole = ctl == NULL && json_object_get(root, "motor_coordinator_config") == NULL &&
                 json_object_get(root, "motor_deploy_config") == NULL;
    cfg_errors_set_prefix(e, whole ? "" : "motor_controller_config");
    if (ctl && !json_is_object(ctl)) {
        cfg_error(e, "", "must be an object");
        ctl = NULL;
    }
    if (!ctl && whole)
        ctl = root; /* the file is the controller block itself */
    if (ctl)
        apply_controller(c, ctl, e);

    /* The deploy block's TLS overrides the controller's own block, as upstream. */
    json_t *deploy = json_object_get(root, "motor_deploy_config");
    if (deploy) {
        cfg_errors_set_prefix(e, "motor_deploy_config");
        if (!json_is_object(deploy))
            cfg_error(e, "", "must be an object");
        else
            apply_tls(&c->tls, deploy, "tls_config.mgmt_tls_config", e);
    }
    cfg_errors_set_prefix(e, "");
    check_tls_files(&c->tls, "motor_controller_config.mgmt_tls_config", e);

    json_t *coord = json_object_get(root, "motor_coordinator_config");
    if (coord) {
        cfg_errors_set_prefix(e, "motor_coordinator_config");
        if (!json_is_object(coord))
            cfg_error(e, "", "must be an object");
        else
            apply_coordinator(c, coord, e);
    }
    cfg_errors_set_prefix(e, "");
}
