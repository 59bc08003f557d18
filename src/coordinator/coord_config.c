#include "coordinator/coord_config.h"

#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>


void ccfg_init(struct ccfg *c)
{
    memset(c, 0, sizeof(*c));
    const char *pod_ip = getenv("POD_IP");
    c->host = xstrdup(pod_ip && *pod_ip ? pod_ip : "127.0.0.1");
    c->infer_port = 1025;
    c->mgmt_port = 1026;
    c->max_body = 16u << 20;
    c->scheduler = CCFG_SCHED_LOAD_BALANCE;
    c->scheduler_type = xstrdup("load_balance");
    c->instance_score_weight = 0.05;
    c->pd_fallback_to_hybrid = true;
    c->max_retry = 5;
    c->retry_delay_ms = 200;
    c->transport_max_retry = -1;
    c->breaker_threshold = 3;
    c->breaker_open_ms = 30000;
    c->breaker_max_open_ms = 300000;
    c->first_token_timeout_ms = 600000;
    c->infer_timeout_ms = 3600000;
    c->connect_timeout_ms = 5000;
    c->shutdown_grace_ms = 10000;
    c->api_keys = xcalloc(1, sizeof(char *));
}

static void tls_release(struct ccfg_tls *t)
{
    free(t->cert_file);
    free(t->key_file);
    free(t->ca_file);
    free(t->key_password);
    memset(t, 0, sizeof(*t));
}

void ccfg_release(struct ccfg *c)
{
    if (!c)
        return;
    free(c->host);
    free(c->scheduler_type);
    for (size_t i = 0; c->api_keys && c->api_keys[i]; i++)
        free(c->api_keys[i]);
    free(c->api_keys);
    free(c->mgmt_key);
    tls_release(&c->infer_tls);
    tls_release(&c->mgmt_tls);
    memset(c, 0, sizeof(*c));
}

static void add_key(struct ccfg *c, const char *key)
{
    c->api_keys = xrealloc(c->api_keys, (c->n_api_keys + 2) * sizeof(char *));
    c->api_keys[c->n_api_keys++] = xstrdup(key);
    c->api_keys[c->n_api_keys] = NULL;
}

/* Seconds (number) at path into ms, within [min_s, max_s]. */
static int64_t get_seconds(json_t *o, const char *path, int64_t def_ms, double min_s, double max_s,
                           struct cfg_errors *e)
{
    double s = cfg_get_double(o, path, (double)def_ms / 1000.0, min_s, max_s, e);
    return (int64_t)(s * 1000.0 + 0.5);
}

static void apply_tls(struct ccfg_tls *t, json_t *blk, const char *name, struct cfg_errors *e)
{
    if (!blk)
        return;
    char path[64];
    snprintf(path, sizeof(path), "%s.enable_tls", name);
    t->enable = cfg_get_bool(blk, "enable_tls", false, e);
    if (!t->enable)
        return;
    const char *cert = cfg_get_string(blk, "cert_file", NULL, e);
    const char *key = cfg_get_string(blk, "key_file", NULL, e);
    const char *ca = cfg_get_string(blk, "ca_file", NULL, e);
    const char *pw = cfg_get_string(blk, "passwd_file", NULL, e);
    if (!cert || !key) {
        cfg_error(e, path, "TLS enabled but cert_file/key_file missing");
        return;
    }
    t->cert_file = xstrdup(cert);
    t->key_file = xstrdup(key);
    t->ca_file = ca && *ca ? xstrdup(ca) : NULL;
    if (pw && *pw) {
        int rc = cfg_read_secret(pw, &t->key_password);
        if (rc < 0)
            cfg_error(e, "passwd_file", "cannot read %s: %s", pw, strerror(-rc));
    }
}

void ccfg_apply(struct ccfg *c, json_t *root, struct cfg_errors *e)
{
    if (!root || !json_is_object(root))
        return;
    json_t *blk = json_object_get(root, "motor_coordinator_config");
    json_t *deploy = json_object_get(root, "motor_deploy_config");
    if (!blk) {
        blk = root;
    } else if (!json_is_object(blk)) {
        cfg_error(e, "", "must be an object");
        return;
    }

    const char *host = cfg_get_string(blk, "api_config.coordinator_api_host", NULL, e);
    if (host && *host) {
        free(c->host);
        c->host = xstrdup(host);
    }
    c->infer_port =
        (int)cfg_get_int(blk, "api_config.coordinator_api_infer_port", c->infer_port, 0, 65535, e);
    c->mgmt_port =
        (int)cfg_get_int(blk, "api_config.coordinator_api_mgmt_port", c->mgmt_port, 0, 65535, e);
    c->max_body = (size_t)cfg_get_int(blk, "api_config.max_request_body_bytes",
                                      (int64_t)c->max_body, 1024, 256ll << 20, e);

    static const char *const scheds[] = {"load_balance", "round_robin", "kv_cache_affinity",
                                         "compute_length", NULL};
    const char *st =
        cfg_get_enum(blk, "scheduler_config.scheduler_type", "load_balance", scheds, e);
    /* kv_cache_affinity needs the KV Conductor and compute_length a tokenizer; neither
     * exists here, so both degrade to the default balancer (logged by the daemon). */
    c->scheduler =
        strcmp(st, "round_robin") == 0 ? CCFG_SCHED_ROUND_ROBIN : CCFG_SCHED_LOAD_BALANCE;
    free(c->scheduler_type);
    c->scheduler_type = xstrdup(st);
    c->instance_score_weight =
        cfg_get_double(blk, "scheduler_config.endpoint_instance_score_weight",
                       c->instance_score_weight, 0.0, 1000.0, e);
    c->pd_fallback_to_hybrid =
        cfg_get_bool(blk, "scheduler_config.enable_pd_separation_fallback_to_hybrid",
                     c->pd_fallback_to_hybrid, e);
    c->decode_colocation =
        cfg_get_bool(blk, "scheduler_config.decode_colocation", c->decode_colocation, e);

    c->max_retry = (int)cfg_get_int(blk, "exception_config.max_retry", c->max_retry, 0, 100, e);
    c->retry_delay_ms =
        get_seconds(blk, "exception_config.retry_delay", c->retry_delay_ms, 0.0, 60.0, e);
    c->transport_max_retry =
        (int)cfg_get_int(blk, "exception_config.transport_max_retry", -1, -1, 100, e);
    c->breaker_threshold =
        (int)cfg_get_int(blk, "exception_config.circuit_breaker_failure_threshold",
                         c->breaker_threshold, 1, 1000, e);
    c->breaker_open_ms = get_seconds(blk, "exception_config.circuit_breaker_open_timeout",
                                     c->breaker_open_ms, 0.01, 86400.0, e);
    c->breaker_max_open_ms = get_seconds(blk, "exception_config.circuit_breaker_max_open_timeout",
                                         c->breaker_max_open_ms, 0.01, 86400.0, e);
    if (c->breaker_max_open_ms < c->breaker_open_ms)
        c->breaker_max_open_ms = c->breaker_open_ms;

    c->first_token_timeout_ms = get_seconds(blk, "timeout_config.first_token_timeout",
                                            c->first_token_timeout_ms, 0.01, 864000.0, e);
    c->infer_timeout_ms =
        get_seconds(blk, "timeout_config.infer_timeout", c->infer_timeout_ms, 0.01, 864000.0, e);
    c->connect_timeout_ms = get_seconds(blk, "timeout_config.upstream_connect_timeout",
                                        c->connect_timeout_ms, 0.01, 600.0, e);
    c->shutdown_grace_ms = get_seconds(blk, "timeout_config.graceful_shutdown_timeout",
                                       c->shutdown_grace_ms, 0.0, 3600.0, e);

    c->api_key_enable = cfg_get_bool(blk, "api_key_config.enable_api_key", false, e);
    json_t *keys = cfg_get_array(blk, "api_key_config.api_keys", e);
    if (keys) {
        size_t i;
        json_t *k;
        json_array_foreach(keys, i, k)
        {
            if (!json_is_string(k) || json_string_length(k) == 0) {
                cfg_error(e, "api_key_config.api_keys", "item %zu must be a non-empty string", i);
                continue;
            }
            add_key(c, json_string_value(k));
        }
    }
    const char *kf = cfg_get_string(blk, "api_key_config.api_key_file", NULL, e);
    if (kf && *kf) {
        size_t len = 0;
        char *text = util_read_file(kf, 1 << 20, &len);
        if (!text) {
            cfg_error(e, "api_key_config.api_key_file", "cannot read %s: %s", kf, strerror(errno));
        } else {
            /* One key per line; blank lines and '#' comments skipped. */
            char *p = text;
            while (*p) {
                size_t n = strcspn(p, "\r\n");
                size_t a = 0, b = n;
                while (a < b && (p[a] == ' ' || p[a] == '\t'))
                    a++;
                while (b > a && (p[b - 1] == ' ' || p[b - 1] == '\t'))
                    b--;
                if (b > a && p[a] != '#') {
                    char *k = xstrndup(p + a, b - a);
                    add_key(c, k);
                    free(k);
                }
                p += n;
                while (*p == '\r' || *p == '\n')
                    p++;
            }
            explicit_bzero(text, len);
            free(text);
        }
    }
    if (c->api_key_enable && c->n_api_keys == 0)
        cfg_error(e, "api_key_config",
                  "enable_api_key is true but no key is configured "
                  "(api_keys or api_key_file)");

    c->mgmt_key_enable = cfg_get_bool(blk, "mgmt_api_key_config.enable_api_key", false, e);
    const char *mf = cfg_get_string(blk, "mgmt_api_key_config.api_key_file", NULL, e);
    if (c->mgmt_key_enable) {
        if (!mf || !*mf) {
            cfg_error(e, "mgmt_api_key_config.api_key_file",
                      "required when enable_api_key is true");
        } else {
            int rc = cfg_read_secret(mf, &c->mgmt_key);
            if (rc < 0)
                cfg_error(e, "mgmt_api_key_config.api_key_file", "cannot read %s: %s", mf,
                          rc == -EINVAL ? "empty key" : strerror(-rc));
        }
    }

    c->workers =
        (int)cfg_get_int(blk, "inference_workers_config.num_workers", c->workers, 0, 256, e);

    if (deploy && json_is_object(deploy)) {
        json_t *tls = json_object_get(deploy, "tls_config");
        if (tls && json_is_object(tls)) {
            json_t *it = json_object_get(tls, "infer_tls_config");
            json_t *mt = json_object_get(tls, "mgmt_tls_config");
            apply_tls(&c->infer_tls, json_is_object(it) ? it : NULL, "infer_tls_config", e);
            apply_tls(&c->mgmt_tls, json_is_object(mt) ? mt : NULL, "mgmt_tls_config", e);
        }
    }
}

static json_t *tls_json(const struct ccfg_tls *t)
{
    json_t *o = json_pack("{s:b}", "enable_tls", t->enable);
    if (!t->enable)
        return o;
    json_object_set_new(o, "cert_file", t->cert_file ? json_string(t->cert_file) : json_null());
    json_object_set_new(o, "key_file", t->key_file ? json_string(t->key_file) : json_null());
    json_object_set_new(o, "ca_file", t->ca_file ? json_string(t->ca_file) : json_null());
    json_object_set_new(o, "key_password_loaded", json_boolean(t->key_password != NULL));
    return o;
}

static json_t *secs(int64_t ms)
{
    return json_real((double)ms / 1000.0);
}

json_t *ccfg_to_json(const struct ccfg *c)
{
    json_t *o = json_object();
    json_object_set_new(o, "api_config",
                        json_pack("{s:s, s:i, s:i, s:I}", "coordinator_api_host", c->host,
                                  "coordinator_api_infer_port", c->infer_port,
                                  "coordinator_api_mgmt_port", c->mgmt_port,
                                  "max_request_body_bytes", (json_int_t)c->max_body));
    json_object_set_new(
        o, "scheduler_config",
        json_pack("{s:s, s:s, s:f, s:b, s:b}", "scheduler_type", c->scheduler_type,
                  "effective_scheduler",
                  c->scheduler == CCFG_SCHED_ROUND_ROBIN ? "round_robin" : "load_balance",
                  "endpoint_instance_score_weight", c->instance_score_weight,
                  "enable_pd_separation_fallback_to_hybrid", c->pd_fallback_to_hybrid,
                  "decode_colocation", c->decode_colocation));
    json_t *ex =
        json_pack("{s:i, s:o, s:i, s:o, s:o}", "max_retry", c->max_retry, "retry_delay",
                  secs(c->retry_delay_ms), "circuit_breaker_failure_threshold",
                  c->breaker_threshold, "circuit_breaker_open_timeout", secs(c->breaker_open_ms),
                  "circuit_breaker_max_open_timeout", secs(c->breaker_max_open_ms));
    /* -1 = "as max_retry" (the proxy's rule): show what applies. */
    json_object_set_new(
        ex, "transport_max_retry",
        json_integer(c->transport_max_retry >= 0 ? c->transport_max_retry : c->max_retry));
    json_object_set_new(o, "exception_config", ex);
    json_object_set_new(o, "timeout_config",
                        json_pack("{s:o, s:o, s:o, s:o}", "first_token_timeout",
                                  secs(c->first_token_timeout_ms), "infer_timeout",
                                  secs(c->infer_timeout_ms), "upstream_connect_timeout",
                                  secs(c->connect_timeout_ms), "graceful_shutdown_timeout",
                                  secs(c->shutdown_grace_ms)));
    json_object_set_new(o, "api_key_config",
                        json_pack("{s:b, s:I}", "enable_api_key", c->api_key_enable, "keys",
                                  (json_int_t)c->n_api_keys));
    json_object_set_new(o, "mgmt_api_key_config",
                        json_pack("{s:b, s:b}", "enable_api_key", c->mgmt_key_enable, "key_loaded",
                                  c->mgmt_key != NULL));
    json_object_set_new(o, "inference_workers_config",
                        json_pack("{s:i}", "num_workers", c->workers));
    json_object_set_new(o, "tls_config",
                        json_pack("{s:o, s:o}", "infer_tls_config", tls_json(&c->infer_tls),
                                  "mgmt_tls_config", tls_json(&c->mgmt_tls)));
    return o;
}
