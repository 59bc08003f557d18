/* coord_settings — what the inference workers read of the configuration, as an
 * immutable, reference-counted snapshot published by the management thread: the same
 * pattern as the instance table (instances.h).
 *
 * A hot reload (coord_reload.c) builds a new snapshot from the reloaded configuration
 * and publishes it; a worker picks the current one up when a request arrives and the
 * request keeps that reference to its end, so a reload never changes a request
 * half-way (its deadlines, retry budget and route policy are those it started with) and
 * never races one: nothing a worker reads is ever written after publication.
 *
 * Threads: built and published by the management thread; read by any (csettings_pub_get
 * takes the mutex only when the version moved, like inst_pub_get). */
#ifndef MOTOR_COORD_SETTINGS_H
#define MOTOR_COORD_SETTINGS_H

#include "common/httpc.h"
#include "coordinator/balancer.h"
#include "coordinator/coord_config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct csettings {
    atomic_int refs;
    uint64_t version;
    /* scheduler_config */
    enum bal_policy policy;
    bool tokenize;               /* kv_cache_affinity, compute_length: /tokenize first */
    int64_t tokenize_timeout_ms; /* scheduler_config.tokenize_timeout */
    double load_gate_factor;     /* load_gated's bound */
    bool approx;                 /* kv_cache_affinity on what was routed (no events) */
    char *conductor;             /* kv_cache_affinity through a KV Conductor, NULL = none */
    size_t approx_chunks;        /* per endpoint */
    double instance_score_weight;
    bool pd_fallback_to_hybrid;
    bool decode_colocation;
    /* exception_config */
    int max_retry;
    int transport_max_retry; /* -1 = max_retry */
    int64_t retry_delay_ms;
    /* reschedule_config */
    bool reschedule_enable;
    int max_reschedule;
    int64_t inter_token_timeout_ms; /* 0: none */
    /* timeout_config */
    int64_t first_token_timeout_ms;
    int64_t infer_timeout_ms;
    int64_t connect_timeout_ms;
    int64_t shutdown_grace_ms;
    /* api_key_config */
    bool api_key_enable;
    char **api_keys; /* NULL-terminated copies (wiped when freed) */
    size_t n_api_keys;
    /* precision_detection_config: what a worker needs to sample (precision.h) */
    bool prec_enable;
    int64_t prec_interval_ms;
    int prec_logprobs;
    /* infer_tls_config with engine_tls: https to engines with these client settings
     * (owned copies); engine_tls false = plain http:// */
    bool engine_tls;
    struct httpc_tls engine_tls_opts;
    /* infer_tls_config on: a fan-out's parts are https requests to our own inference
     * port, presenting its certificate (owned copies; not verifying the server, which is
     * this process's own listening socket) */
    bool self_tls;
    struct httpc_tls self_tls_opts;
    /* derived: the deadline sweep's period, a tenth of the shortest timeout, 10..100 ms */
    int64_t sweep_ms;
};

/* A snapshot of cfg's worker settings (refs = 1). */
struct csettings *csettings_new(const struct ccfg *cfg, uint64_t version);
struct csettings *csettings_ref(struct csettings *s);
void csettings_unref(struct csettings *s); /* NULL-safe, any thread */
/* The retry budget of a failure: transport failures have their own when set. */
int csettings_retry_limit(const struct csettings *s, bool transport);

struct csettings_pub {
    pthread_mutex_t mu;
    struct csettings *cur;
    _Atomic uint64_t version;
};

void csettings_pub_init(struct csettings_pub *p);
void csettings_pub_release(struct csettings_pub *p);
/* Publish (takes the caller's reference). */
void csettings_pub_set(struct csettings_pub *p, struct csettings *take);
/* A new reference to the current snapshot (never NULL after the first set). */
struct csettings *csettings_pub_get(struct csettings_pub *p);
uint64_t csettings_pub_version(struct csettings_pub *p);

#endif
