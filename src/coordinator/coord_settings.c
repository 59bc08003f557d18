/* coord_settings — the workers' settings snapshot (see coord_settings.h). */
#include "coordinator/coord_settings.h"

#include "common/util.h"

#include <stdlib.h>
#include <string.h>

struct csettings *csettings_new(const struct ccfg *cfg, uint64_t version)
{
    struct csettings *s = xcalloc(1, sizeof(*s));
    atomic_init(&s->refs, 1);
    s->version = version;
    switch (cfg->scheduler) {
    case CCFG_SCHED_ROUND_ROBIN:
        s->policy = BAL_ROUND_ROBIN;
        break;
    case CCFG_SCHED_KV_AFFINITY:
        s->policy = cfg->kv_mode == CCFG_KV_LOAD_GATED ? BAL_KV_LOAD_GATED : BAL_KV_UNIFIED;
        s->approx = cfg->kv_approx;
        s->tokenize = !cfg->kv_approx;
        if (cfg->conductor_service && *cfg->conductor_service) {
            s->conductor = xstrdup(cfg->conductor_service);
            s->approx = s->tokenize = false;
        }
        break;
    case CCFG_SCHED_COMPUTE_LENGTH:
        s->policy = BAL_LEAST_TOKENS;
        s->tokenize = true;
        break;
    case CCFG_SCHED_LOAD_BALANCE:
        s->policy = BAL_LEAST_TOKENS;
        break;
    }
    s->tokenize_timeout_ms = cfg->tokenize_timeout_ms;
    s->load_gate_factor = cfg->load_gate_factor;
    s->approx_chunks = cfg->approx_chunks;
    s->instance_score_weight = cfg->instance_score_weight;
    s->pd_fallback_to_hybrid = cfg->pd_fallback_to_hybrid;
    s->decode_colocation = cfg->decode_colocation;
    s->max_retry = cfg->max_retry;
    s->transport_max_retry = cfg->transport_max_retry;
    s->retry_delay_ms = cfg->retry_delay_ms;
    s->reschedule_enable = cfg->reschedule_enable;
    s->max_reschedule = cfg->max_reschedule;
    s->inter_token_timeout_ms = cfg->inter_token_timeout_ms;
    s->first_token_timeout_ms = cfg->first_token_timeout_ms;
    s->infer_timeout_ms = cfg->infer_timeout_ms;
    s->connect_timeout_ms = cfg->connect_timeout_ms;
    s->shutdown_grace_ms = cfg->shutdown_grace_ms;
    s->api_key_enable = cfg->api_key_enable;
    s->api_keys = xcalloc(cfg->n_api_keys + 1, sizeof(char *));
    for (size_t i = 0; i < cfg->n_api_keys; i++)
        s->api_keys[i] = xstrdup(cfg->api_keys[i]);
    s->n_api_keys = cfg->n_api_keys;
    s->prec_enable = cfg->prec_enable;
    s->prec_interval_ms = cfg->prec_interval_ms;
    s->prec_logprobs = cfg->prec_logprobs;
    const struct ccfg_tls *t = &cfg->infer_tls;
    s->engine_tls = t->enable && t->engine_tls;
    if (s->engine_tls) {
        s->engine_tls_opts.ca_file = t->ca_file && *t->ca_file ? xstrdup(t->ca_file) : NULL;
        s->engine_tls_opts.cert_file = t->cert_file ? xstrdup(t->cert_file) : NULL;
        s->engine_tls_opts.key_file = t->key_file ? xstrdup(t->key_file) : NULL;
        s->engine_tls_opts.key_password = t->key_password ? xstrdup(t->key_password) : NULL;
    }
    s->self_tls = t->enable;
    if (s->self_tls) {
        s->self_tls_opts.cert_file = t->cert_file ? xstrdup(t->cert_file) : NULL;
        s->self_tls_opts.key_file = t->key_file ? xstrdup(t->key_file) : NULL;
        s->self_tls_opts.key_password = t->key_password ? xstrdup(t->key_password) : NULL;
        s->self_tls_opts.insecure = true;
    }
    int64_t shortest = MOTOR_MIN(s->first_token_timeout_ms, s->infer_timeout_ms);
    if (s->inter_token_timeout_ms > 0)
        shortest = MOTOR_MIN(shortest, s->inter_token_timeout_ms);
    s->sweep_ms = MOTOR_MAX((int64_t)10, MOTOR_MIN((int64_t)100, shortest / 10));
    return s;
}

struct csettings *csettings_ref(struct csettings *s)
{
    if (s)
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

static void tls_opts_free(struct httpc_tls *t)
{
    free((char *)t->ca_file);
    free((char *)t->cert_file);
    free((char *)t->key_file);
    if (t->key_password)
        explicit_bzero((char *)t->key_password, strlen(t->key_password));
    free((char *)t->key_password);
}

void csettings_unref(struct csettings *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < s->n_api_keys; i++) {
        explicit_bzero(s->api_keys[i], strlen(s->api_keys[i]));
        free(s->api_keys[i]);
    }
    free(s->api_keys);
    tls_opts_free(&s->engine_tls_opts);
    tls_opts_free(&s->self_tls_opts);
    free(s->conductor);
    free(s);
}

int csettings_retry_limit(const struct csettings *s, bool transport)
{
    if (transport && s->transport_max_retry >= 0)
        return s->transport_max_retry;
    return s->max_retry;
}

void csettings_pub_init(struct csettings_pub *p)
{
    pthread_mutex_init(&p->mu, NULL);
    p->cur = NULL;
    atomic_init(&p->version, 0);
}

void csettings_pub_release(struct csettings_pub *p)
{
    csettings_unref(p->cur);
    p->cur = NULL;
    pthread_mutex_destroy(&p->mu);
}

void csettings_pub_set(struct csettings_pub *p, struct csettings *take)
{
    pthread_mutex_lock(&p->mu);
    struct csettings *old = p->cur;
    p->cur = take;
    atomic_store_explicit(&p->version, take->version, memory_order_release);
    pthread_mutex_unlock(&p->mu);
    csettings_unref(old);
}

struct csettings *csettings_pub_get(struct csettings_pub *p)
{
    pthread_mutex_lock(&p->mu);
    struct csettings *s = csettings_ref(p->cur);
    pthread_mutex_unlock(&p->mu);
    return s;
}

uint64_t csettings_pub_version(struct csettings_pub *p)
{
    return atomic_load_explicit(&p->version, memory_order_acquire);
}
