/* ctl_config — the motor_controller_config block of user_config.json (spec §14) plus
 * the coordinator address (motor_coordinator_config.api_config) and Motor's own store
 * section.
 *
 * The keys are the rows of one table (ctl_config.c, common/cfgtab.h): parsing, defaults,
 * the --check-config dump (ctlcfg_to_json), the live/restart class of every key and the
 * key table of docs/controller.md come from it. The list below is the overview; the
 * table is the reference.
 *
 * Upstream key names are accepted as they are; keys Motor adds are marked (motor) here
 * and in docs/controller.md. Durations are given in seconds (integers or reals) and kept
 * in milliseconds. Every value is type- and range-checked through common/cfg.h and all
 * problems are collected in one pass.
 *
 * Keys (defaults in brackets):
 *   daemon_loop_interval [5], logging_config.log_level [INFO]
 *   api_config.controller_api_host [$POD_IP or 127.0.0.1], controller_api_port [1026;
 *     0 = ephemeral], controller_api_dns (accepted), observability_api_port [1027;
 *     0 = ephemeral]
 *   observability_config.observability_enable [false]: listen on observability_api_port
 *     (ctl_obs.h); metrics_ttl (accepted)
 *   mgmt_tls_config.{enable_tls, ca_file, cert_file, key_file, passwd_file} — overridden
 *     by motor_deploy_config.tls_config.mgmt_tls_config; server TLS of the API and client
 *     TLS towards node managers and the coordinator
 *   instance_config.instance_assemble_timeout [600], instance_assembler_check_interval
 *     [30], instance_assembler_cmd_send_interval [30], instance_manager_check_interval
 *     [1], instance_heartbeat_timeout [10: while active], (motor)
 *     instance_heartbeat_timeout_inactive [300: initial/inactive/paused],
 *     instance_expired_timeout [1200, accepted], send_cmd_retry_times [3], (motor)
 *     start_cmd_timeout [5], (motor) nm_probe_timeout [3]
 *   event_config.coordinator_heartbeat_interval [10], coordinator_set_sync_interval
 *     [300; 0 disables], event_consumer_sleep_interval (accepted), (motor)
 *     coordinator_push [true], (motor) coordinator_request_timeout [5]
 *   fault_tolerance_config.enable_fault_tolerance [true], strategy_center_check_interval
 *     [10], fault_collection_timeout_seconds [60], enable_token_reinference (accepted),
 *     enable_engine_relaunch [true], engine_relaunch_complete_timeout_sec [600],
 *     engine_relaunch_poll_interval_sec [5], engine_relaunch_dispatch_retries [3],
 *     engine_relaunch_nm_unreachable_threshold [3], (motor)
 *     engine_relaunch_dispatch_backoff_sec [2], enable_dp_scale_down [false],
 *     enable_dp_scale_up [false], dp_scale_down_config.{request_timeout_sec [11, (0,60]],
 *     poll_interval_sec [1, (0,60]], execution_deadline_sec [30, [1,600]]}, (motor)
 *     enable_reconfiguration [true]
 *   store_config (motor).{backend ["sqlite" | "etcd" | "memory"], sqlite_path
 *     ["motor-controller.db"], etcd_endpoints [["http://127.0.0.1:2379"]] (a string is
 *     accepted too), etcd_prefix ["/motor/controller/"], etcd_lease_ttl [15, 1..3600],
 *     etcd_timeout [5], leader_retry_interval [standby_config.master_lock_retry_interval
 *     or 5]}
 *   etcd_config.{etcd_host, etcd_port, enable_etcd_persistence} (upstream): when
 *     enable_etcd_persistence is true and store_config.backend is not given, the store
 *     is etcd at http://etcd_host:etcd_port
 *   standby_config.{master_lock_ttl, master_lock_retry_interval} feed the etcd lease TTL
 *     and the standby retry interval when store_config does not set them.
 *   motor_coordinator_config.api_config.{coordinator_api_dns [$COORDINATOR_SERVICE or
 *     127.0.0.1], coordinator_api_mgmt_port [1026]}, motor_coordinator_config.
 *     mgmt_api_key_config.{enable_api_key, api_key_file}: the key sent as
 *     X-Motor-Management-Key on pushes.
 *
 * Every key is live (a hot reload applies it: ctl_reload.c) or takes a restart, as its
 * row says; docs/controller.md's table lists which.
 *
 * Not thread-safe; the reactor thread owns it (loaded in main, replaced on reload). */
#ifndef MOTOR_CTL_CONFIG_H
#define MOTOR_CTL_CONFIG_H

#include "common/cfg.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ctlcfg_store { CTLCFG_STORE_SQLITE = 0, CTLCFG_STORE_ETCD, CTLCFG_STORE_MEMORY };

struct ctlcfg_tls {
    bool enable;
    char *ca_file;
    char *cert_file;
    char *key_file;
    char *key_password; /* from passwd_file when readable, else NULL */
};

struct ctlcfg {
    int64_t daemon_loop_ms; /* daemon_loop_interval (seed 002) */
    char *log_level;        /* logging_config.log_level, canonical upper case */
    /* api_config */
    char *host;
    int port;
    /* observability */
    bool obs_enable;
    int obs_port;
    struct ctlcfg_tls tls;
    /* etcd_tls_config (upstream block; motor_deploy_config.tls_config's wins): client TLS
     * towards etcd. Enabled, the default endpoints become https://; ca_file verifies
     * etcd, cert_file/key_file (optional) are the client certificate. Disabled,
     * https:// endpoints use mgmt_tls_config's files (as before this block existed). */
    struct ctlcfg_tls etcd_tls;
    /* instance_config */
    int64_t assemble_timeout_ms;
    int64_t assembler_check_ms;
    int64_t cmd_send_interval_ms;
    int64_t manager_check_ms;
    int64_t hb_timeout_active_ms;
    int64_t hb_timeout_other_ms;
    int64_t expired_timeout_ms;
    int send_cmd_retry_times;
    int64_t start_cmd_timeout_ms;
    int64_t nm_probe_timeout_ms;
    /* event_config + coordinator address */
    bool coordinator_push;
    char *coordinator_host;
    int coordinator_port;
    char *coordinator_key;       /* mgmt API key or NULL */
    bool coordinator_key_enable; /* mgmt_api_key_config.enable_api_key */
    char *coordinator_key_file;  /* mgmt_api_key_config.api_key_file */
    /* node_manager_api_key_config: the node managers' management_api_key, sent as
     * X-Motor-Management-Key on every /node-manager/ call */
    char *nm_key;
    bool nm_key_enable;
    char *nm_key_file;
    int64_t coordinator_hb_ms;
    int64_t coordinator_sync_ms; /* 0 = no periodic full set */
    int64_t coordinator_timeout_ms;
    /* fault_tolerance_config */
    bool ft_enable;
    int64_t strategy_check_ms;
    int64_t fault_window_ms;
    bool relaunch_enable;
    int64_t relaunch_timeout_ms;
    int64_t relaunch_poll_ms;
    int relaunch_retries;
    int relaunch_unreachable;
    int64_t relaunch_backoff_ms;
    bool scale_down_enable;
    bool scale_up_enable;
    bool prec_auto_recovery; /* precision_auto_recovery_enabled (ctl_prec.c) */
    int64_t sd_request_timeout_ms;
    int64_t sd_poll_ms;
    int64_t sd_deadline_ms;
    bool reconfig_enable;
    /* store */
    enum ctlcfg_store store;
    char *sqlite_path;
    char **etcd_endpoints; /* NULL-terminated */
    size_t n_etcd_endpoints;
    char *etcd_prefix;
    int etcd_lease_ttl_s;
    int64_t etcd_timeout_ms;
    int64_t leader_retry_ms;
    /* upstream's etcd_config (its switch is folded into store and etcd_endpoints) */
    char *etcd_host;
    int etcd_port;
    bool etcd_persistence;
};

/* Defaults (env POD_IP, COORDINATOR_SERVICE honoured). Release with ctlcfg_release. */
void ctlcfg_init(struct ctlcfg *c);
void ctlcfg_release(struct ctlcfg *c);

/* Apply a user_config.json document. root may hold motor_controller_config (plus
 * motor_coordinator_config, motor_deploy_config) or be the controller block itself.
 * Errors are recorded in e; nothing aborts. */
void ctlcfg_apply(struct ctlcfg *c, json_t *root, struct cfg_errors *e);

/* The DP scale-down guard lease (§8.2): 2×deadline + 4×request timeout + max(5, poll),
 * in seconds (109 with the defaults), capped at the NM's 300 s limit. */
double ctlcfg_guard_lease_s(const struct ctlcfg *c);

/* Name of a store backend ("sqlite", "etcd", "memory"). */
const char *ctlcfg_store_name(enum ctlcfg_store s);

/* The effective configuration (every key at its upstream path, durations in seconds,
 * secrets shown only as "key_loaded"/"key_password_loaded"). New reference. */
json_t *ctlcfg_to_json(const struct ctlcfg *c);
/* --check-config: ctlcfg_to_json with "config_path" on stdout, a one-line summary on
 * stderr. 0, or 1 when stdout cannot be written. */
int ctlcfg_print_check(const struct ctlcfg *c, const char *path);

/* The table of the keys (docs, diffs: cfgtab.h). */
struct cfgtab;
extern const struct cfgtab ctlcfg_cfgtab;

#endif
