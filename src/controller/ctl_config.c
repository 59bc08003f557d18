/* ctl_config — motor_controller_config as a table (common/cfgtab.h), plus what no row
 * says: the whole-file shape, upstream's etcd_config switch, TLS files that must exist,
 * the coordinator's key file. */
#include "controller/ctl_config.h"

#include "common/cfgtab.h"
#include "common/util.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SRC_CTL, SRC_DEPLOY, SRC_COORD };
static const char *const src_names[] = {"", "motor_deploy_config", "motor_coordinator_config"};

static const char *const store_names[] = {"sqlite", "etcd", "memory", NULL};

const char *ctlcfg_store_name(enum ctlcfg_store s)
{
    return (unsigned)s < 3 ? store_names[s] : "?";
}

double ctlcfg_guard_lease_s(const struct ctlcfg *c)
{
    double lease = 2.0 * (double)c->sd_deadline_ms / 1000.0 +
                   4.0 * (double)c->sd_request_timeout_ms / 1000.0 +
                   MOTOR_MAX(5.0, (double)c->sd_poll_ms / 1000.0);
    return lease > 300.0 ? 300.0 : lease;
}

/* passwd_file: the key password is read when the file is readable (a missing file is not
 * an error: the key may be unencrypted); only whether one was loaded is shown. */
static void passwd_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                         struct cfgtab_ctx *ctx)
{
    struct ctlcfg_tls *t = base;
    const char *pw;
    if (!cfg_read_string(v, path, &pw, ctx->errs) || !*pw || access(pw, R_OK) != 0)
        return;
    char *secret = NULL;
    if (cfg_read_secret(pw, &secret) == 0) {
        cfgtab_ops_loaded.release(r, base);
        t->key_password = secret;
    }
}

static json_t *passwd_dump(const struct cfgtab_row *r, const void *base)
{
    return cfgtab_ops_loaded.dump(r, base);
}

static void passwd_release(const struct cfgtab_row *r, void *base)
{
    cfgtab_ops_loaded.release(r, base);
}

static const struct cfgtab_ops passwd_ops = {
    .parse = passwd_parse, .dump = passwd_dump, .release = passwd_release};

static const char *http_url(const char **s, char *buf, size_t cap)
{
    if (strncmp(*s, "http://", 7) == 0 || strncmp(*s, "https://", 8) == 0)
        return NULL;
    snprintf(buf, cap, "\"%.160s\" must start with http:// or https://", *s);
    return buf;
}

#define TOFF(f) offsetof(struct ctlcfg_tls, f)

/* A reload reads the files again (new connections get the new certificate); switching
 * between plain and TLS takes a restart. */
static const struct cfgtab_row tls_rows[] = {
    {"enable_tls", CFGTAB_BOOL, TOFF(enable), .flags = CFGTAB_RESTART, .doc = "turns it on"},
    {"ca_file", CFGTAB_STRING, TOFF(ca_file), .doc = "must be readable when set"},
    {"cert_file", CFGTAB_STRING, TOFF(cert_file), .doc = "required and readable with TLS"},
    {"key_file", CFGTAB_STRING, TOFF(key_file), .doc = "required and readable with TLS"},
    {"passwd_file", CFGTAB_CUSTOM, TOFF(key_password), .flags = CFGTAB_SECRET, .ops = &passwd_ops,
     .size = sizeof(char *), .dump = "key_password_loaded", .type_doc = "string",
     .doc = "the key's password, read when the file is readable"},
};
static const struct cfgtab tls_table = CFGTAB_TABLE("tls", tls_rows, NULL);

/* etcd's client side: the client certificate is optional (etcd may not ask for one). */
static const struct cfgtab_row etcd_tls_rows[] = {
    {"enable_tls", CFGTAB_BOOL, TOFF(enable), .doc = "https towards etcd"},
    {"ca_file", CFGTAB_STRING, TOFF(ca_file),
     .doc = "verifies etcd's certificate (default: the system's trusted CAs)"},
    {"cert_file", CFGTAB_STRING, TOFF(cert_file),
     .doc = "client certificate, when etcd asks for one (`--client-cert-auth`)"},
    {"key_file", CFGTAB_STRING, TOFF(key_file), .doc = "its key (required with `cert_file`)"},
    {"passwd_file", CFGTAB_CUSTOM, TOFF(key_password), .flags = CFGTAB_SECRET, .ops = &passwd_ops,
     .size = sizeof(char *), .dump = "key_password_loaded", .type_doc = "string",
     .doc = "the key's password, read when the file is readable"},
};
static const struct cfgtab etcd_tls_table = CFGTAB_TABLE("etcd_tls", etcd_tls_rows, NULL);
#define OFF(f) offsetof(struct ctlcfg, f)
#define L CFGTAB_LIVE
#define M CFGTAB_MOTOR
#define SUB(rows_) (&(const struct cfgtab)CFGTAB_TABLE("", rows_, NULL))

static const struct cfgtab_row api_rows[] = {
    {"controller_api_host", CFGTAB_STRING, OFF(host), .flags = CFGTAB_NONEMPTY, .env = "POD_IP",
     .def_s = "127.0.0.1", .doc = "bind address (`--host`)"},
    {"controller_api_port", CFGTAB_INT, OFF(port), .min = 0, .max = 65535, .def_i = 1026,
     .doc = "API port (0 = ephemeral; `--port`)"},
    {"controller_api_dns", CFGTAB_STRING, 0, .flags = CFGTAB_ACCEPTED,
     .doc = "where node managers find the controller"},
    {"observability_api_port", CFGTAB_INT, OFF(obs_port), .min = 0, .max = 65535, .def_i = 1027,
     .doc = "observability listener (0 = ephemeral), only with `observability_enable`"},
};

static const struct cfgtab_row instance_rows[] = {
    {"instance_assemble_timeout", CFGTAB_MS, OFF(assemble_timeout_ms), .flags = L, .min = 0.1,
     .max = 86400, .def_d = 600,
     .doc = "an assembly not ready this long after its last registration is dropped"},
    {"instance_assembler_check_interval", CFGTAB_MS, OFF(assembler_check_ms), .flags = L,
     .min = 0.01, .max = 3600, .def_d = 30,
     .doc = "assembler period (registrations also wake it at once)"},
    {"instance_assembler_cmd_send_interval", CFGTAB_MS, OFF(cmd_send_interval_ms), .flags = L,
     .min = 0.01, .max = 3600, .def_d = 30, .doc = "start-command retry period"},
    {"instance_manager_check_interval", CFGTAB_MS, OFF(manager_check_ms), .flags = L, .min = 0.01,
     .max = 3600, .def_d = 1, .doc = "heartbeat-timeout check period"},
    {"instance_heartbeat_timeout", CFGTAB_MS, OFF(hb_timeout_active_ms), .flags = L, .min = 0.1,
     .max = 86400, .def_d = 10, .doc = "heartbeat timeout while `active`"},
    {"instance_heartbeat_timeout_inactive", CFGTAB_MS, OFF(hb_timeout_other_ms), .flags = L | M,
     .min = 0.1, .max = 86400, .def_d = 300,
     .doc = "heartbeat timeout in `initial` / `inactive` / `paused`"},
    {"instance_expired_timeout", CFGTAB_MS, OFF(expired_timeout_ms), .flags = L, .min = 0.1,
     .max = 864000, .def_d = 1200, .doc = "accepted, unused"},
    {"send_cmd_retry_times", CFGTAB_INT, OFF(send_cmd_retry_times), .flags = L, .min = 1,
     .max = 1000, .def_i = 3, .doc = "start-command attempts before giving up"},
    {"start_cmd_timeout", CFGTAB_MS, OFF(start_cmd_timeout_ms), .flags = L | M, .min = 0.1,
     .max = 600, .def_d = 5, .doc = "`/node-manager/start` (and `/stop`) request timeout"},
    {"nm_probe_timeout", CFGTAB_MS, OFF(nm_probe_timeout_ms), .flags = L | M, .min = 0.1,
     .max = 600, .def_d = 3, .doc = "reachability probes (`GET /node-manager/status`)"},
};

static const struct cfgtab_row event_rows[] = {
    {"event_consumer_sleep_interval", CFGTAB_DOUBLE, 0, .flags = CFGTAB_ACCEPTED, .min = 0,
     .max = 3600},
    {"coordinator_heartbeat_interval", CFGTAB_MS, OFF(coordinator_hb_ms), .flags = L, .min = 0.05,
     .max = 3600, .def_d = 10,
     .doc = "`GET /liveness` of the coordinator; a restart or lost ones lead to a full set"},
    {"coordinator_set_sync_interval", CFGTAB_MS, OFF(coordinator_sync_ms), .flags = L, .min = 0,
     .max = 86400, .def_d = 300, .doc = "periodic full set (0 = off)"},
    {"coordinator_push", CFGTAB_BOOL, OFF(coordinator_push), .flags = L | M, .def_i = 1,
     .doc = "false: never talk to a coordinator"},
    {"coordinator_request_timeout", CFGTAB_MS, OFF(coordinator_timeout_ms), .flags = L | M,
     .min = 0.1, .max = 600, .def_d = 5, .doc = "push timeout"},
};

static const struct cfgtab_row scale_down_rows[] = {
    /* (0, 60]: a zero timeout or poll interval would spin. */
    {"request_timeout_sec", CFGTAB_MS, OFF(sd_request_timeout_ms), .flags = L, .min = 0.001,
     .max = 60, .def_d = 11, .doc = "node-manager request timeout"},
    {"poll_interval_sec", CFGTAB_MS, OFF(sd_poll_ms), .flags = L, .min = 0.001, .max = 60,
     .def_d = 1, .doc = "status poll period"},
    {"execution_deadline_sec", CFGTAB_MS, OFF(sd_deadline_ms), .flags = L, .min = 1, .max = 600,
     .def_d = 30,
     .doc = "deadline of each wait; guard lease = 2×deadline + 4×timeout + max(5, poll), at "
            "most 300"},
};

static const struct cfgtab_row ft_rows[] = {
    {"enable_fault_tolerance", CFGTAB_BOOL, OFF(ft_enable), .flags = L, .def_i = 1,
     .doc = "false: fault reports are not accepted, no strategies"},
    {"strategy_center_check_interval", CFGTAB_MS, OFF(strategy_check_ms), .flags = L, .min = 0.01,
     .max = 3600, .def_d = 10, .doc = "strategy center period (a DEAD report also wakes it)"},
    {"fault_collection_timeout_seconds", CFGTAB_MS, OFF(fault_window_ms), .flags = L, .min = 0.1,
     .max = 86400, .def_d = 60, .doc = "a reported fault no strategy consumed expires after this"},
    {"enable_token_reinference", CFGTAB_BOOL, 0, .flags = CFGTAB_ACCEPTED},
    {"enable_engine_relaunch", CFGTAB_BOOL, OFF(relaunch_enable), .flags = L, .def_i = 1,
     .doc = "EngineRelaunchStrategy for DEAD engines"},
    {"engine_relaunch_complete_timeout_sec", CFGTAB_MS, OFF(relaunch_timeout_ms), .flags = L,
     .min = 0.1, .max = 86400, .def_d = 600, .doc = "relaunch deadline"},
    {"engine_relaunch_poll_interval_sec", CFGTAB_MS, OFF(relaunch_poll_ms), .flags = L, .min = 0.01,
     .max = 3600, .def_d = 5, .doc = "relaxed-status poll period"},
    {"engine_relaunch_dispatch_retries", CFGTAB_INT, OFF(relaunch_retries), .flags = L, .min = 1,
     .max = 100, .def_i = 3, .doc = "attempts of the probe and of the dispatch"},
    {"engine_relaunch_nm_unreachable_threshold", CFGTAB_INT, OFF(relaunch_unreachable), .flags = L,
     .min = 1, .max = 1000, .def_i = 3, .doc = "failed polls in a row that fail the relaunch"},
    {"engine_relaunch_dispatch_backoff_sec", CFGTAB_MS, OFF(relaunch_backoff_ms), .flags = L | M,
     .min = 0, .max = 600, .def_d = 2, .doc = "pause between those attempts"},
    {"enable_dp_scale_down", CFGTAB_BOOL, OFF(scale_down_enable), .flags = L,
     .doc = "DpScaleDownStrategy when the gate allows it"},
    {"enable_dp_scale_up", CFGTAB_BOOL, OFF(scale_up_enable), .flags = L,
     .doc = "after a scale-down, stop node managers left without a rank"},
    {"enable_reconfiguration", CFGTAB_BOOL, OFF(reconfig_enable), .flags = L | M, .def_i = 1,
     .doc = "false: a failed relaunch does not stop the node managers"},
    {"dp_scale_down_config", CFGTAB_GROUP, 0, .flags = L | CFGTAB_OBJECT,
     .sub = SUB(scale_down_rows)},
    {"precision_auto_recovery_enabled", CFGTAB_BOOL, OFF(prec_auto_recovery), .flags = L,
     .doc = "on a precision alarm, isolate and terminate the D (and P) instance, then clear "
            "the alarm (docs/precision-detection.md)"},
};

static const struct cfgtab_row etcd_rows[] = {
    {"etcd_host", CFGTAB_STRING, OFF(etcd_host), .def_s = "etcd.default.svc.cluster.local"},
    {"etcd_port", CFGTAB_INT, OFF(etcd_port), .min = 1, .max = 65535, .def_i = 2379},
    {"enable_etcd_persistence", CFGTAB_BOOL, OFF(etcd_persistence),
     .doc = "with no `store_config.backend`: the store is etcd at `http://etcd_host:etcd_port`"},
    {"etcd_timeout", CFGTAB_MS, OFF(etcd_timeout_ms), .flags = CFGTAB_OVERRIDE, .min = 0.1,
     .max = 600, .doc = "as `store_config.etcd_timeout`, which wins"},
};

static const struct cfgtab_row standby_rows[] = {
    {"master_lock_ttl", CFGTAB_INT, OFF(etcd_lease_ttl_s), .flags = CFGTAB_OVERRIDE, .min = 1,
     .max = 3600, .doc = "as `store_config.etcd_lease_ttl`, which wins"},
    {"master_lock_retry_interval", CFGTAB_MS, OFF(leader_retry_ms), .flags = CFGTAB_OVERRIDE,
     .min = 0.05, .max = 3600, .doc = "as `store_config.leader_retry_interval`, which wins"},
    {"enable_master_standby", CFGTAB_BOOL, 0, .flags = CFGTAB_ACCEPTED},
    {"master_lock_key", CFGTAB_STRING, 0, .flags = CFGTAB_ACCEPTED},
};

static const char *const default_endpoints[] = {"http://127.0.0.1:2379", NULL};

static const struct cfgtab_row store_rows[] = {
    {"backend", CFGTAB_ENUM, OFF(store), .flags = M, .names = store_names,
     .def_i = CTLCFG_STORE_SQLITE, .doc = "`memory`: nothing persists"},
    {"sqlite_path", CFGTAB_STRING, OFF(sqlite_path), .flags = M | CFGTAB_NONEMPTY,
     .def_s = "motor-controller.db", .doc = "the database (WAL; leader lock in `<path>.lock`)"},
    {"etcd_endpoints", CFGTAB_STRLIST, OFF(etcd_endpoints), OFF(n_etcd_endpoints),
     .flags = M | CFGTAB_NONEMPTY | CFGTAB_ONE_OR_LIST, .def_list = default_endpoints,
     .check = http_url, .doc = "etcd members, tried in turn"},
    {"etcd_prefix", CFGTAB_STRING, OFF(etcd_prefix), .flags = M | CFGTAB_NONEMPTY,
     .def_s = "/motor/controller/", .doc = "key prefix"},
    {"etcd_lease_ttl", CFGTAB_INT, OFF(etcd_lease_ttl_s), .flags = M, .min = 1, .max = 3600,
     .def_i = 15, .def_doc = "15 (or `standby_config.master_lock_ttl`)", .doc = "leader lease"},
    {"etcd_timeout", CFGTAB_MS, OFF(etcd_timeout_ms), .flags = M, .min = 0.1, .max = 600,
     .def_d = 5, .def_doc = "5 (or `etcd_config.etcd_timeout`)", .doc = "etcd request timeout"},
    {"leader_retry_interval", CFGTAB_MS, OFF(leader_retry_ms), .flags = M, .min = 0.05, .max = 3600,
     .def_d = 5, .def_doc = "5 (or `standby_config.master_lock_retry_interval`)",
     .doc = "standby campaign period, also the store's write-retry period"},
};

static const struct cfgtab_row coord_api_rows[] = {
    {"coordinator_api_dns", CFGTAB_STRING, OFF(coordinator_host), .flags = CFGTAB_NONEMPTY,
     .env = "COORDINATOR_SERVICE", .def_s = "127.0.0.1", .doc = "where pushes go"},
    {"coordinator_api_mgmt_port", CFGTAB_INT, OFF(coordinator_port), .min = 1, .max = 65535,
     .def_i = 1026, .doc = "the coordinator's management port"},
};

static const struct cfgtab_row coord_key_rows[] = {
    {"enable_api_key", CFGTAB_BOOL, OFF(coordinator_key_enable),
     .doc = "send the key as `X-Motor-Management-Key` on pushes"},
    {"api_key_file", CFGTAB_STRING, OFF(coordinator_key_file),
     .doc = "the key: the file's first line (read when enabled)"},
    {"key_loaded", CFGTAB_CUSTOM, OFF(coordinator_key), .flags = CFGTAB_DERIVED | CFGTAB_SECRET,
     .ops = &cfgtab_ops_loaded, .size = sizeof(char *)},
};

static const struct cfgtab_row nm_key_rows[] = {
    {"enable_api_key", CFGTAB_BOOL, OFF(nm_key_enable),
     .doc = "(motor) send the node managers' `management_api_key` as `X-Motor-Management-Key` "
            "on every `/node-manager/` call"},
    {"api_key_file", CFGTAB_STRING, OFF(nm_key_file),
     .doc = "(motor) the key: the file's first line (read when enabled, again on every reload)"},
    {"key_loaded", CFGTAB_CUSTOM, OFF(nm_key), .flags = CFGTAB_DERIVED | CFGTAB_SECRET,
     .ops = &cfgtab_ops_loaded, .size = sizeof(char *)},
};

static const struct cfgtab_row rows[] = {
    {"daemon_loop_interval", CFGTAB_MS, OFF(daemon_loop_ms), .flags = L, .min = 0.05, .max = 3600,
     .def_d = 5,
     .doc = "period of the daemon loop's housekeeping (store backlog, stale stop records)"},
    {"logging_config.log_level", CFGTAB_STRING, OFF(log_level), .flags = L, .def_s = "INFO",
     .check = cfgtab_check_log_level, .type_doc = "DEBUG, INFO, WARNING, ERROR (any case)",
     .doc = "the controller's log level (`--log-level` wins)"},
    {"api_config", CFGTAB_GROUP, 0, .flags = CFGTAB_OBJECT, .sub = SUB(api_rows)},
    {"observability_config.observability_enable", CFGTAB_BOOL, OFF(obs_enable),
     .doc = "serve `/observability/{alarms,inventory,metrics}` on the observability port"},
    {"observability_config.metrics_ttl", CFGTAB_DOUBLE, 0, .flags = CFGTAB_ACCEPTED, .min = 0,
     .max = 86400},
    {"mgmt_tls_config", CFGTAB_GROUP, OFF(tls), .flags = L | CFGTAB_OBJECT, .sub = &tls_table,
     .doc = "HTTPS on the API (a `ca_file` makes it mutual TLS) and client TLS towards node "
            "managers, the coordinator and `https://` etcd endpoints"},
    {"etcd_tls_config", CFGTAB_GROUP, OFF(etcd_tls), .flags = CFGTAB_OBJECT, .sub = &etcd_tls_table,
     .doc = "client TLS towards etcd; enabled, the default etcd endpoints are `https://`"},
    {"instance_config", CFGTAB_GROUP, 0, .flags = L | CFGTAB_OBJECT, .sub = SUB(instance_rows)},
    {"event_config", CFGTAB_GROUP, 0, .flags = L | CFGTAB_OBJECT, .sub = SUB(event_rows)},
    {"fault_tolerance_config", CFGTAB_GROUP, 0, .flags = L | CFGTAB_OBJECT, .sub = SUB(ft_rows)},
    {"node_manager_api_key_config", CFGTAB_GROUP, 0, .flags = L | M | CFGTAB_OBJECT,
     .sub = SUB(nm_key_rows)},
    {"etcd_config", CFGTAB_GROUP, 0, .flags = CFGTAB_OBJECT, .sub = SUB(etcd_rows)},
    {"standby_config", CFGTAB_GROUP, 0, .flags = CFGTAB_OBJECT, .sub = SUB(standby_rows)},
    {"store_config", CFGTAB_GROUP, 0, .flags = CFGTAB_OBJECT, .sub = SUB(store_rows)},
    /* The deploy block's TLS overrides the controller block's (same keys, not dumped). */
    {"tls_config.mgmt_tls_config", CFGTAB_GROUP, OFF(tls), .src = SRC_DEPLOY,
     .flags = L | CFGTAB_OBJECT | CFGTAB_OVERRIDE, .sub = &tls_table,
     .doc = "overrides `mgmt_tls_config`"},
    {"tls_config.etcd_tls_config", CFGTAB_GROUP, OFF(etcd_tls), .src = SRC_DEPLOY,
     .flags = CFGTAB_OBJECT | CFGTAB_OVERRIDE, .sub = &etcd_tls_table,
     .doc = "overrides `etcd_tls_config`"},
    {"api_config", CFGTAB_GROUP, 0, .src = SRC_COORD, .flags = L | CFGTAB_OBJECT,
     .sub = SUB(coord_api_rows), .dump = "motor_coordinator_config.api_config"},
    {"mgmt_api_key_config", CFGTAB_GROUP, 0, .src = SRC_COORD, .flags = L | CFGTAB_OBJECT,
     .sub = SUB(coord_key_rows), .dump = "motor_coordinator_config.mgmt_api_key_config"},
};

const struct cfgtab ctlcfg_cfgtab = CFGTAB_TABLE("controller", rows, src_names);

void ctlcfg_init(struct ctlcfg *c)
{
    cfgtab_init(&ctlcfg_cfgtab, c, sizeof(*c), NULL);
}

void ctlcfg_release(struct ctlcfg *c)
{
    if (c)
        cfgtab_release(&ctlcfg_cfgtab, c);
}

json_t *ctlcfg_to_json(const struct ctlcfg *c)
{
    return cfgtab_dump(&ctlcfg_cfgtab, c);
}

int ctlcfg_print_check(const struct ctlcfg *c, const char *path)
{
    json_t *j = ctlcfg_to_json(c);
    json_object_set_new(j, "config_path", path && *path ? json_string(path) : json_null());
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(j);
    if (!text)
        return 1;
    printf("%s\n", text);
    free(text);
    fprintf(stderr,
            "motor controller: configuration OK (%s): api %s:%d, store %s, coordinator %s:%d, "
            "fault tolerance %s, relaunch %s, dp scale-down %s\n",
            path ? path : "defaults", c->host, c->port, ctlcfg_store_name(c->store),
            c->coordinator_host, c->coordinator_port, c->ft_enable ? "on" : "off",
            c->relaunch_enable ? "on" : "off", c->scale_down_enable ? "on" : "off");
    return fflush(stdout) == 0 ? 0 : 1;
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

/* etcd over TLS: the files must be readable, the default endpoints turn https://, and an
 * http:// endpoint given next to an enabled block is a contradiction said aloud. */
static void derive_etcd_tls(struct ctlcfg *c, const struct cfgtab_ctx *ctx, struct cfg_errors *e)
{
    struct ctlcfg_tls *t = &c->etcd_tls;
    if (!t->enable)
        return;
    const char *files[] = {t->ca_file, t->cert_file, t->key_file};
    const char *names[] = {"ca_file", "cert_file", "key_file"};
    for (size_t i = 0; i < ARRAY_LEN(files); i++)
        if (files[i] && *files[i] && access(files[i], R_OK) != 0)
            cfg_error(e, names[i], "cannot read \"%s\": %s", files[i], strerror(errno));
    bool cert = t->cert_file && *t->cert_file, key = t->key_file && *t->key_file;
    if (cert != key)
        cfg_error(e, cert ? "key_file" : "cert_file", "required with %s",
                  cert ? "cert_file" : "key_file");
    bool given = cfgtab_given(ctx, OFF(etcd_endpoints));
    for (size_t i = 0; i < c->n_etcd_endpoints; i++) {
        char *u = c->etcd_endpoints[i];
        if (strncmp(u, "http://", 7) != 0)
            continue;
        if (given) {
            cfg_error(e, "etcd_endpoints", "\"%s\" is http:// but etcd_tls_config is enabled", u);
            continue;
        }
        c->etcd_endpoints[i] = xasprintf("https://%s", u + 7);
        free(u);
    }
}

/* Upstream's etcd_config switch: persistence makes the store etcd at etcd_host:etcd_port
 * unless store_config says otherwise. */
static void derive_store(struct ctlcfg *c, const struct cfgtab_ctx *ctx)
{
    if (!c->etcd_persistence)
        return;
    if (!cfgtab_given(ctx, OFF(etcd_endpoints))) {
        for (size_t i = 0; i < c->n_etcd_endpoints; i++)
            free(c->etcd_endpoints[i]);
        free(c->etcd_endpoints);
        c->etcd_endpoints = xcalloc(2, sizeof(char *));
        c->etcd_endpoints[0] = xasprintf("http://%s:%d", c->etcd_host, c->etcd_port);
        c->n_etcd_endpoints = 1;
    }
    if (!cfgtab_given(ctx, OFF(store)))
        c->store = CTLCFG_STORE_ETCD;
}

static void read_coordinator_key(struct ctlcfg *c, struct cfg_errors *e)
{
    if (!c->coordinator_key_enable)
        return;
    const char *f = c->coordinator_key_file;
    char *key = NULL;
    int rc = f && *f ? cfg_read_secret(f, &key) : -ENOENT;
    if (rc < 0) {
        cfg_error(e, "mgmt_api_key_config.api_key_file", "cannot read a key from \"%s\": %s",
                  f ? f : "", strerror(-rc));
        return;
    }
    if (c->coordinator_key)
        explicit_bzero(c->coordinator_key, strlen(c->coordinator_key));
    free(c->coordinator_key);
    c->coordinator_key = key;
}

static void read_nm_key(struct ctlcfg *c, struct cfg_errors *e)
{
    if (!c->nm_key_enable)
        return;
    const char *f = c->nm_key_file;
    char *key = NULL;
    int rc = f && *f ? cfg_read_secret(f, &key) : -ENOENT;
    if (rc < 0) {
        cfg_error(e, "node_manager_api_key_config.api_key_file",
                  "cannot read a key from \"%s\": %s", f ? f : "", strerror(-rc));
        return;
    }
    if (c->nm_key)
        explicit_bzero(c->nm_key, strlen(c->nm_key));
    free(c->nm_key);
    c->nm_key = key;
}

/* Block at root[key] when it is an object; "must be an object" (prefix key) otherwise. */
static json_t *block(json_t *root, const char *key, struct cfg_errors *e)
{
    json_t *b = json_object_get(root, key);
    if (b && !json_is_object(b)) {
        cfg_errors_set_prefix(e, key);
        cfg_error(e, "", "must be an object");
        return NULL;
    }
    return b;
}

void ctlcfg_apply(struct ctlcfg *c, json_t *root, struct cfg_errors *e)
{
    if (!json_is_object(root))
        return;
    struct cfgtab_ctx ctx = {.errs = e};
    json_t *ctl = block(root, "motor_controller_config", e);
    bool whole = !json_object_get(root, "motor_controller_config") &&
                 !json_object_get(root, "motor_coordinator_config") &&
                 !json_object_get(root, "motor_deploy_config");
    if (whole)
        ctl = root; /* the file is the controller block itself */
    cfg_errors_set_prefix(e, whole ? "" : "motor_controller_config");
    cfgtab_apply(&ctlcfg_cfgtab, SRC_CTL, c, ctl, &ctx);
    derive_store(c, &ctx);
    read_nm_key(c, e);

    /* The deploy block's TLS overrides the controller's own block, as upstream. */
    json_t *deploy = block(root, "motor_deploy_config", e);
    cfg_errors_set_prefix(e, "motor_deploy_config");
    cfgtab_apply(&ctlcfg_cfgtab, SRC_DEPLOY, c, deploy, &ctx);
    cfg_errors_set_prefix(e, "");
    check_tls_files(&c->tls, "motor_controller_config.mgmt_tls_config", e);
    cfg_errors_set_prefix(e, "motor_controller_config.etcd_tls_config");
    derive_etcd_tls(c, &ctx, e);
    cfg_errors_set_prefix(e, "");

    json_t *coord = block(root, "motor_coordinator_config", e);
    cfg_errors_set_prefix(e, "motor_coordinator_config");
    cfgtab_apply(&ctlcfg_cfgtab, SRC_COORD, c, coord, &ctx);
    read_coordinator_key(c, e);
    cfg_errors_set_prefix(e, "");
    cfgtab_ctx_release(&ctx);
}
