/* coord_config — the motor_coordinator_config block of user_config.json (spec §14).
 *
 * The keys are the rows of one table (coord_config.c, common/cfgtab.h): path, type,
 * field, range, default, live-or-restart, doc. Parsing, defaults, the --check-config
 * dump and the key table of docs/coordinator.md come from it. Upstream key names are
 * accepted as they are; keys Motor adds are marked "(motor)". Every value is validated;
 * all problems are collected in one pass through cfg_errors so an operator sees them at
 * once. Durations are kept in ms.
 *
 * Every key is live (a hot reload applies it: coord_reload.c) or takes a restart, as its
 * row says. The management thread owns the struct (loaded in main before threads exist,
 * replaced on reload); workers never read it: they read the settings snapshot
 * (coord_settings.h) built from it. */
#ifndef MOTOR_COORD_CONFIG_H
#define MOTOR_COORD_CONFIG_H

#include "common/cfg.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ccfg_scheduler {
    CCFG_SCHED_LOAD_BALANCE = 0,
    CCFG_SCHED_ROUND_ROBIN,
    CCFG_SCHED_KV_AFFINITY,
    CCFG_SCHED_COMPUTE_LENGTH,
};
enum ccfg_kv_mode { CCFG_KV_UNIFIED = 0, CCFG_KV_LOAD_GATED };

struct ccfg_tls {
    bool enable;     /* restart: a listener cannot switch between plain and TLS */
    char *cert_file; /* live: a reload reads the files again */
    char *key_file;
    char *ca_file;
    char *key_password; /* read from passwd_file when set */
    /* infer_tls_config only (Motor): engines serve TLS too, as upstream's node manager
     * probes them with this block (reference §6.5). The coordinator then connects to
     * them over https, verifying them against ca_file and presenting cert_file/key_file
     * as its client certificate. false: plain HTTP to engines behind a TLS port. */
    bool engine_tls;
};

struct ccfg {
    char *log_level; /* logging_config.log_level, canonical upper case */
    /* api_config */
    char *host;      /* coordinator_api_host ($POD_IP or 127.0.0.1) */
    int infer_port;  /* coordinator_api_infer_port (1025), 0 = ephemeral */
    int mgmt_port;   /* coordinator_api_mgmt_port (1026), 0 = ephemeral */
    size_t max_body; /* (motor) max_request_body_bytes, inference requests */
    int max_connections;   /* (motor) inference port, all workers; 0 = automatic */
    int64_t keep_alive_ms; /* (motor) keep_alive_timeout: idle client connections, 60 s */
    int metaserver_base_port; /* (motor) trigger mode: worker i's metaserver, base + i (0: any) */
    /* scheduler_config */
    enum ccfg_scheduler scheduler;
    char *scheduler_type;         /* as configured */
    enum ccfg_kv_mode kv_mode;    /* kv_cache_affinity_mode (unified) */
    char *kv_mode_name;
    double load_gate_factor;      /* (motor) load_gated: favoured load <= this x mean */
    bool kv_approx;               /* (motor) kv_cache_affinity_source approximate */
    char *kv_source_name;
    size_t approx_chunks;         /* (motor) approximate: chunks remembered per endpoint */
    int64_t tokenize_timeout_ms;  /* (motor) the engine's /tokenize, before routing */
    double instance_score_weight; /* endpoint_instance_score_weight (0.05) */
    bool pd_fallback_to_hybrid;   /* enable_pd_separation_fallback_to_hybrid (true) */
    bool decode_colocation;       /* (motor) decode instances may serve whole requests */
    /* prefill_kv_event_config: the engines' KV events (kvsub.c) */
    char *kv_endpoint;        /* endpoint, e.g. "tcp://HOST:5557" ("" = vLLM's default) */
    char *kv_replay_endpoint; /* replay_endpoint ("" = none) */
    int kv_event_port;        /* derived: base port of the engines' PUB (+ DP rank) */
    int kv_replay_port;       /* derived: base port of their replay ROUTER; 0 = none */
    int kv_block_size;        /* block_size: accepted (the events carry theirs) */
    char *kv_model_path, *kv_engine_type; /* accepted */
    int kv_http_port;                     /* http_server_port: accepted */
    int64_t conductor_rereg_ms;           /* re_register_interval_sec */
    char *kv_topic;          /* "" */
    char *conductor_service; /* "" = Motor's own index */
    size_t kv_max_blocks;    /* (motor) index entries at most */
    int64_t engine_metrics_ms; /* (motor) scrape engines' /metrics this often, 0 = never */
    /* exception_config */
    int max_retry;               /* 5 */
    int64_t retry_delay_ms;      /* retry_delay 0.2 s, doubling per attempt */
    int transport_max_retry;     /* defaults to max_retry */
    int breaker_threshold;       /* (motor) circuit_breaker_failure_threshold 3 */
    int64_t breaker_open_ms;     /* (motor) circuit_breaker_open_timeout 30 s */
    int64_t breaker_max_open_ms; /* (motor) circuit_breaker_max_open_timeout 300 s */
    /* reschedule_config: mid-stream rescheduling (proxy.c) */
    bool reschedule_enable;         /* enable (upstream: off; Motor: on) */
    int max_reschedule;             /* (motor) continuations per answer, 3 */
    int64_t inter_token_timeout_ms; /* (motor) a silent stream is a failed leg, 30 s (0 off) */
    /* timeout_config */
    int64_t first_token_timeout_ms; /* 600 s */
    int64_t infer_timeout_ms;       /* 3600 s */
    int64_t connect_timeout_ms;     /* (motor) upstream_connect_timeout 5 s */
    int64_t shutdown_grace_ms;      /* (motor) graceful_shutdown_timeout 10 s */
    /* api_key_config: inference API keys (Authorization: Bearer) */
    bool api_key_enable;
    char **api_keys; /* NULL-terminated; from api_keys[] and api_key_file lines */
    size_t n_api_keys;
    char *api_key_file; /* as configured (its lines are in api_keys) */
    /* mgmt_api_key_config */
    bool mgmt_key_enable;
    char *mgmt_key;      /* the single-line secret of api_key_file */
    char *mgmt_key_file; /* as configured */
    /* inference_workers_config */
    int workers; /* (motor) num_workers; 0 = number of online CPUs */
    /* standby_config: master/standby over etcd (coord_ha.c) */
    bool ha_enable;
    int64_t ha_check_ms;
    int ha_ttl_s;
    int64_t ha_retry_ms;
    int ha_max_failures;
    char *ha_key;
    /* etcd_config */
    char *etcd_host;
    int etcd_port;
    int64_t etcd_timeout_ms;
    char **etcd_endpoints; /* NULL-terminated; http://etcd_host:etcd_port when not given */
    size_t n_etcd_endpoints;
    /* motor_deploy_config.tls_config */
    struct ccfg_tls infer_tls;
    struct ccfg_tls mgmt_tls;
    /* precision_detection_config (precision.c): sample decode answers, check them
     * (qcheck.h), confirm with a probe, alarm the controller */
    bool prec_enable;              /* precision_check_enabled (false) */
    int64_t prec_interval_ms;      /* interval_seconds (30) per decode instance */
    int prec_logprobs;             /* logprobs_count (1; >= 3 garbled, >= 5 rare chars) */
    int prec_issue_threshold;      /* precision_issue_threshold (10) bad samples in a row */
    int prec_clear_threshold;      /* precision_clear_threshold (10) good ones while alarmed */
    int prec_probe_attempts;       /* probe_max_attempts (3) */
    int64_t prec_probe_timeout_ms; /* probe_timeout_seconds (600) */
    char *prec_probe_question;     /* (motor) probe_question */
    char *prec_probe_answer;       /* (motor) probe_expected_answer */
    int prec_min_tokens;           /* (motor) min_sample_tokens (16) */
    char *prec_common_chars;       /* (motor) common_chars: "" = the built-in set */
    /* motor_controller_config.api_config: where alarms go */
    char *ctl_host;
    int ctl_port;
    /* motor_deploy_config.tls_config.etcd_tls_config: client TLS towards etcd (ca_file
     * verifies etcd; cert_file/key_file optional, the client certificate); enabled, the
     * default endpoint is https://. Disabled, https:// endpoints use mgmt_tls's files. */
    struct ccfg_tls etcd_tls;
};

/* Fill with the defaults (env POD_IP honoured). Release with ccfg_release. */
void ccfg_init(struct ccfg *c);
void ccfg_release(struct ccfg *c);

/* Apply a user_config.json document: root may hold motor_coordinator_config (and
 * motor_deploy_config for TLS) or be the coordinator block itself. Files referenced by
 * the config (key files) are read here. Errors are recorded in e (nothing aborts). */
void ccfg_apply(struct ccfg *c, json_t *root, struct cfg_errors *e);

/* The effective configuration as JSON (for --check-config), grouped like the upstream
 * blocks, durations in seconds. Secrets are never included: key counts and whether a
 * key / key password was loaded instead. workers is as resolved by the caller (0 = CPU
 * count). Returns a new reference. */
json_t *ccfg_to_json(const struct ccfg *c);

/* The table of the keys (docs, diffs: cfgtab.h). */
struct cfgtab;
extern const struct cfgtab ccfg_cfgtab;

#endif
