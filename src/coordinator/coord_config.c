/* coord_config — motor_coordinator_config as a table (common/cfgtab.h), plus what no row
 * says: the API key file's lines, the management key file, the derived scheduler. */
#include "coordinator/coord_config.h"

#include "common/cfgtab.h"
#include "common/util.h"
#include "coordinator/qcheck.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SRC_BLOCK, SRC_DEPLOY, SRC_CTL };
static const char *const src_names[] = {"", "motor_deploy_config", "motor_controller_config"};

static const char *const scheds[] = {"load_balance", "round_robin", "kv_cache_affinity",
                                     "compute_length", NULL};
static const char *const effective_scheds[] = {"load_balance", "round_robin",
                                               "kv_cache_affinity", "compute_length", NULL};
static const char *const kv_modes[] = {"unified", "load_gated", NULL};
static const char *const kv_sources[] = {"kv_events", "approximate", NULL};

/* An empty host keeps the default (upstream writes "" for "not set"). */
static const char *skip_empty(const char **s, char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    return **s ? NULL : cfgtab_skip;
}

static const char *nonempty_key(const char **s, char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
    return **s ? NULL : "must be a non-empty string";
}

/* -1 = "as max_retry" (the proxy's rule): show what applies. */
static json_t *transport_retry_dump(const struct cfgtab_row *r, const void *base)
{
    (void)r;
    const struct ccfg *c = base;
    return json_integer(c->transport_max_retry >= 0 ? c->transport_max_retry : c->max_retry);
}
static const struct cfgtab_ops transport_retry_ops = {.dump = transport_retry_dump};

/* TLS of one server (motor_deploy_config.tls_config.<name>), one row per key: a reload
 * reads the files again (new connections get the new certificate), switching between
 * plain and TLS takes a restart. The shape shown is the one it always had: only
 * enable_tls while off. */
static void passwd_parse(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                         struct cfgtab_ctx *ctx)
{
    struct ccfg_tls *t = base;
    const char *pw;
    /* enable_tls comes first in the block: a password file of TLS that is off is not read. */
    if (!cfg_read_string(v, path, &pw, ctx->errs) || !*pw || !t->enable)
        return;
    char *secret = NULL;
    int rc = cfg_read_secret(pw, &secret);
    if (rc < 0) {
        cfg_error(ctx->errs, path, "cannot read %s: %s", pw, strerror(-rc));
        return;
    }
    cfgtab_ops_loaded.release(r, base);
    t->key_password = secret;
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

static json_t *tls_dump(const struct cfgtab_row *r, const void *base)
{
    const struct ccfg_tls *t = (const struct ccfg_tls *)((const char *)base + r->off);
    json_t *o = json_pack("{s:b}", "enable_tls", t->enable);
    if (!t->enable)
        return o;
    json_object_set_new(o, "cert_file", t->cert_file ? json_string(t->cert_file) : json_null());
    json_object_set_new(o, "key_file", t->key_file ? json_string(t->key_file) : json_null());
    json_object_set_new(o, "ca_file", t->ca_file ? json_string(t->ca_file) : json_null());
    json_object_set_new(o, "key_password_loaded", json_boolean(t->key_password != NULL));
    if (r->off == offsetof(struct ccfg, infer_tls))
        json_object_set_new(o, "engine_tls", json_boolean(t->engine_tls));
    return o;
}

static const struct cfgtab_ops tls_ops = {.dump = tls_dump};

#define TOFF(f) offsetof(struct ccfg_tls, f)

/* The keys every TLS block has. */
#define TLS_ROWS                                                                                   \
    {"enable_tls", CFGTAB_BOOL, TOFF(enable), .flags = CFGTAB_RESTART, .doc = "turns it on"},      \
        {"cert_file", CFGTAB_STRING, TOFF(cert_file), .doc = "required with TLS"},                 \
        {"key_file", CFGTAB_STRING, TOFF(key_file), .doc = "required with TLS"},                   \
        {"ca_file", CFGTAB_STRING, TOFF(ca_file), .check = skip_empty,                             \
         .doc = "requires client certificates (mutual TLS)"},                                      \
    {                                                                                              \
        "passwd_file", CFGTAB_CUSTOM, TOFF(key_password),                                          \
            .flags = CFGTAB_SECRET, .ops = &passwd_ops, .size = sizeof(char *),                    \
            .dump = "key_password_loaded", .type_doc = "string",                                   \
            .doc = "the key's password: the file's first line"                                     \
    }

static const struct cfgtab_row tls_rows[] = {TLS_ROWS};
static const struct cfgtab tls_table = CFGTAB_TABLE("tls", tls_rows, NULL);

/* infer_tls_config: also the coordinator's client side towards the engines. */
static const struct cfgtab_row infer_tls_rows[] = {
    TLS_ROWS,
    {"engine_tls", CFGTAB_BOOL, TOFF(engine_tls), .flags = CFGTAB_MOTOR | CFGTAB_RESTART,
     .def_i = 1,
     .doc = "engines serve TLS too (as the node managers' probes expect): the coordinator "
            "connects to them over https, verifying them with `ca_file`, presenting "
            "`cert_file`/`key_file`; false: plain HTTP to the engines"},
};
static const struct cfgtab infer_tls_table = CFGTAB_TABLE("infer_tls", infer_tls_rows, NULL);

/* "" or tcp://HOST:PORT with PORT 1..65535. */
static int zmq_port(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (strncmp(s, "tcp://", 6) != 0 || !colon || colon < s + 6)
        return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    return *end || p < 1 || p > 65535 ? -1 : (int)p;
}

static const char *zmq_endpoint_check(const char **s, char *buf, size_t cap)
{
    if (!**s || zmq_port(*s) > 0)
        return NULL;
    snprintf(buf, cap, "\"%.160s\" must be tcp://HOST:PORT", *s);
    return buf;
}

static const char *http_url(const char **s, char *buf, size_t cap)
{
    if (strncmp(*s, "http://", 7) == 0 || strncmp(*s, "https://", 8) == 0)
        return NULL;
    snprintf(buf, cap, "\"%.160s\" must start with http:// or https://", *s);
    return buf;
}

static const char *common_chars(const char **s, char *buf, size_t cap)
{
    if (!**s)
        return NULL;
    struct qck_charset cs;
    return qck_charset_parse(&cs, *s, buf, cap) < 0 ? buf : NULL;
}

#define OFF(f) offsetof(struct ccfg, f)
#define L CFGTAB_LIVE
#define M CFGTAB_MOTOR

static const struct cfgtab_row rows[] = {
    {"logging_config.log_level", CFGTAB_STRING, OFF(log_level), .flags = L, .def_s = "INFO",
     .check = cfgtab_check_log_level, .type_doc = "DEBUG, INFO, WARNING, ERROR (any case)",
     .doc = "the coordinator's log level (`--log-level` wins)"},
    {"api_config.coordinator_api_host", CFGTAB_STRING, OFF(host), .env = "POD_IP",
     .def_s = "127.0.0.1", .check = skip_empty,
     .doc = "bind address of both ports (\"\" = the default)"},
    {"api_config.coordinator_api_infer_port", CFGTAB_INT, OFF(infer_port), .min = 0, .max = 65535,
     .def_i = 1025, .doc = "inference port (0 = ephemeral; `--port`)"},
    {"api_config.coordinator_api_mgmt_port", CFGTAB_INT, OFF(mgmt_port), .min = 0, .max = 65535,
     .def_i = 1026, .doc = "management port (0 = ephemeral; `--mgmt-port`)"},
    {"api_config.max_request_body_bytes", CFGTAB_SIZE, OFF(max_body), .flags = M, .min = 1024,
     .max = 256 << 20, .def_i = 16 << 20, .doc = "inference bodies (413 above)"},
    {"api_config.max_connections", CFGTAB_INT, OFF(max_connections), .flags = M, .min = 0,
     .max = 1 << 24, .def_doc = "automatic",
     .doc = "client connections of the inference port, shared by the workers (0 = 4096 per "
            "worker, lowered to fit the open-file limit); at the limit the oldest idle "
            "keep-alive connection is closed for a new client"},
    {"api_config.keep_alive_timeout", CFGTAB_MS, OFF(keep_alive_ms), .flags = M, .min = 1,
     .max = 3600, .def_d = 60, .doc = "an idle client connection is closed after this"},
    {"api_config.metaserver_base_port", CFGTAB_INT, OFF(metaserver_base_port), .flags = M, .min = 0,
     .max = 65535, .def_i = 0,
     .doc = "trigger mode (`concurrent_engine_sync`): worker i takes the decode engines' "
            "`POST /v1/metaserver` callbacks on this + i (upstream: 12000 + i); 0, or a port "
            "taken: an ephemeral one (each callback URL names its port)"},
    {"scheduler_config.scheduler_type", CFGTAB_STRING, OFF(scheduler_type), .flags = L,
     .names = scheds, .def_s = "load_balance",
     .doc = "`load_balance`, `round_robin`, `kv_cache_affinity` (longest cached prefix, from "
            "the engines' KV events), `compute_length` (load balance on real token counts)"},
    {"scheduler_config.effective_scheduler", CFGTAB_ENUM, OFF(scheduler),
     .flags = L | CFGTAB_DERIVED, .names = effective_scheds},
    {"scheduler_config.kv_cache_affinity_mode", CFGTAB_STRING, OFF(kv_mode_name), .flags = L,
     .names = kv_modes, .def_s = "unified",
     .doc = "`unified`: least (uncached prompt tokens + tokens in flight); `load_gated`: the "
            "longest cached prefix among endpoints within `load_gate_factor` of the mean load"},
    {"scheduler_config.load_gate_factor", CFGTAB_DOUBLE, OFF(load_gate_factor), .flags = L | M,
     .min = 1, .max = 100, .def_d = 1.5,
     .doc = "`load_gated`: an endpoint is favoured while its tokens in flight are at most this "
            "x the mean (plus the request's own)"},
    {"scheduler_config.kv_cache_affinity_source", CFGTAB_STRING, OFF(kv_source_name),
     .flags = L | M, .names = kv_sources, .def_s = "kv_events",
     .doc = "`kv_events`: the engines' KV events; `approximate`: what the coordinator routed "
            "where (engines that publish nothing; no `/tokenize` either)"},
    {"scheduler_config.approximate_chunks_per_endpoint", CFGTAB_SIZE, OFF(approx_chunks),
     .flags = L | M, .min = 16, .max = 1 << 24, .def_i = 8192,
     .doc = "`approximate`: 64-byte prompt chunks remembered per endpoint (its cache, in "
            "prompt text: 8192 = 512 KiB, about 130k tokens), least recently routed "
            "forgotten first"},
    {"scheduler_config.tokenize_timeout", CFGTAB_MS, OFF(tokenize_timeout_ms), .flags = L | M,
     .min = 0.001, .max = 60, .def_d = 0.5,
     .doc = "`kv_cache_affinity`/`compute_length` ask an engine's `/tokenize` first; past this "
            "the request is balanced on load alone"},
    {"prefill_kv_event_config.endpoint", CFGTAB_STRING, OFF(kv_endpoint), .flags = L, .def_s = "",
     .check = zmq_endpoint_check, .def_doc = "`tcp://*:5557` (vLLM's)",
     .doc = "the engines' `--kv-events-config` endpoint; only its port is used: DP rank r "
            "of an endpoint at IP a is subscribed at `tcp://a:<port + r>`"},
    {"prefill_kv_event_config.replay_endpoint", CFGTAB_STRING, OFF(kv_replay_endpoint), .flags = L,
     .def_s = "", .check = zmq_endpoint_check,
     .doc = "the engines' `replay_endpoint` (its port + DP rank; \"\" = none): the history "
            "is asked for again after a (re)connection or lost batches"},
    {"prefill_kv_event_config.block_size", CFGTAB_INT, OFF(kv_block_size), .flags = L, .min = 1,
     .max = 4096, .def_i = 128,
     .doc = "accepted; the engines' events carry their block size, which is what is used"},
    {"prefill_kv_event_config.model_path", CFGTAB_STRING, OFF(kv_model_path), .flags = L,
     .def_s = "",
     .doc = "accepted, unused: prompts are tokenized by the engine's `/tokenize` (its own "
            "tokenizer and chat template)"},
    {"prefill_kv_event_config.engine_type", CFGTAB_STRING, OFF(kv_engine_type), .flags = L,
     .def_s = "vLLM", .doc = "accepted (vLLM and SGLang publish the same wire)"},
    {"prefill_kv_event_config.http_server_port", CFGTAB_INT, OFF(kv_http_port), .flags = L,
     .min = 0, .max = 65535, .def_i = 13333, .doc = "accepted, unused"},
    {"prefill_kv_event_config.re_register_interval_sec", CFGTAB_MS, OFF(conductor_rereg_ms),
     .flags = L, .min = 0, .max = 86400,
     .doc = "with `conductor_service`: register every prefill endpoint again this often (0 = "
            "only on changes)"},
    {"prefill_kv_event_config.topic", CFGTAB_STRING, OFF(kv_topic), .flags = L, .def_s = "",
     .doc = "the engines' KV-event topic"},
    {"prefill_kv_event_config.conductor_service", CFGTAB_STRING, OFF(conductor_service), .flags = L,
     .def_s = "",
     .doc = "an upstream KV Conductor (`http://host:port`) instead of Motor's own index"},
    {"prefill_kv_event_config.max_index_blocks", CFGTAB_SIZE, OFF(kv_max_blocks), .flags = M,
     .min = 16, .max = 1 << 28, .def_i = 1 << 20,
     .doc = "KV index entries (endpoint, block) at most, about 64 bytes each; the least "
            "recently stored are forgotten beyond"},
    {"scheduler_config.engine_metrics_interval", CFGTAB_MS, OFF(engine_metrics_ms), .flags = L | M,
     .min = 0, .max = 3600, .def_d = 1,
     .doc = "scrape each engine's `/metrics` this often (0 = never): requests running and "
            "waiting that this coordinator did not send count as load"},
    {"scheduler_config.endpoint_instance_score_weight", CFGTAB_DOUBLE, OFF(instance_score_weight),
     .flags = L, .min = 0, .max = 1000, .def_d = 0.05,
     .doc = "an endpoint scores its tokens in flight + this × its instance's average"},
    {"scheduler_config.enable_pd_separation_fallback_to_hybrid", CFGTAB_BOOL,
     OFF(pd_fallback_to_hybrid), .flags = L, .def_i = 1,
     .doc = "no prefill or no decode instance: route whole requests to union instances"},
    {"scheduler_config.decode_colocation", CFGTAB_BOOL, OFF(decode_colocation), .flags = L | M,
     .doc = "decode instances may serve whole requests in hybrid mode"},
    {"exception_config.max_retry", CFGTAB_INT, OFF(max_retry), .flags = L, .min = 0, .max = 100,
     .def_i = 5, .doc = "attempts after the first on another instance"},
    {"exception_config.retry_delay", CFGTAB_MS, OFF(retry_delay_ms), .flags = L, .min = 0,
     .max = 60, .def_d = 0.2, .doc = "doubles per retry, capped at 5 s"},
    {"exception_config.transport_max_retry", CFGTAB_INT, OFF(transport_max_retry), .flags = L,
     .min = -1, .max = 100, .def_i = -1, .ops = &transport_retry_ops, .def_doc = "= `max_retry`",
     .doc = "retries of connection failures (-1 = `max_retry`)"},
    {"exception_config.circuit_breaker_failure_threshold", CFGTAB_INT, OFF(breaker_threshold),
     .flags = L | M, .min = 1, .max = 1000, .def_i = 3,
     .doc = "failures in a row that open an instance's breaker"},
    {"exception_config.circuit_breaker_open_timeout", CFGTAB_MS, OFF(breaker_open_ms),
     .flags = L | M, .min = 0.01, .max = 86400, .def_d = 30,
     .doc = "first open period (doubles while the probe fails)"},
    {"exception_config.circuit_breaker_max_open_timeout", CFGTAB_MS, OFF(breaker_max_open_ms),
     .flags = L | M, .min = 0.01, .max = 86400, .def_d = 300,
     .doc = "longest open period (at least `circuit_breaker_open_timeout`)"},
    {"reschedule_config.enable", CFGTAB_BOOL, OFF(reschedule_enable), .flags = L, .def_i = 1,
     .doc = "continue a streamed answer on another instance when its engine fails mid-stream "
            "(upstream's default is off; Motor's is on: see docs/coordinator.md)"},
    {"reschedule_config.max_reschedule", CFGTAB_INT, OFF(max_reschedule), .flags = L | M, .min = 0,
     .max = 100, .def_i = 3, .doc = "continuations of one answer at most"},
    {"reschedule_config.inter_token_timeout", CFGTAB_MS, OFF(inter_token_timeout_ms),
     .flags = L | M, .min = 0, .max = 864000, .def_d = 30,
     .doc = "a stream with no byte for this long is a failed leg (0 = no limit)"},
    {"timeout_config.first_token_timeout", CFGTAB_MS, OFF(first_token_timeout_ms), .flags = L,
     .min = 0.01, .max = 864000, .def_d = 600, .doc = "until the first token of an answer"},
    {"timeout_config.infer_timeout", CFGTAB_MS, OFF(infer_timeout_ms), .flags = L, .min = 0.01,
     .max = 864000, .def_d = 3600, .doc = "a whole request"},
    {"timeout_config.upstream_connect_timeout", CFGTAB_MS, OFF(connect_timeout_ms), .flags = L | M,
     .min = 0.01, .max = 600, .def_d = 5, .doc = "connecting to an engine"},
    {"timeout_config.graceful_shutdown_timeout", CFGTAB_MS, OFF(shutdown_grace_ms), .flags = L | M,
     .min = 0, .max = 3600, .def_d = 10, .doc = "in-flight requests get this long at SIGTERM"},
    {"api_key_config.enable_api_key", CFGTAB_BOOL, OFF(api_key_enable), .flags = L,
     .doc = "inference requests need `Authorization: Bearer <key>`"},
    {"api_key_config.api_keys", CFGTAB_STRLIST, OFF(api_keys), OFF(n_api_keys),
     .flags = L | CFGTAB_SECRET, .check = nonempty_key, .dump = "api_key_config.keys",
     .doc = "accepted keys (`--check-config` shows their number)"},
    {"api_key_config.api_key_file", CFGTAB_STRING, OFF(api_key_file), .flags = L | CFGTAB_NODUMP,
     .doc = "more keys, one per line (blank lines and `#` comments skipped)"},
    {"mgmt_api_key_config.enable_api_key", CFGTAB_BOOL, OFF(mgmt_key_enable), .flags = L,
     .doc = "management requests need `X-Motor-Management-Key`"},
    {"mgmt_api_key_config.api_key_file", CFGTAB_STRING, OFF(mgmt_key_file),
     .flags = L | CFGTAB_NODUMP, .doc = "the key: the file's first line (required when enabled)"},
    {"mgmt_api_key_config.key_loaded", CFGTAB_CUSTOM, OFF(mgmt_key),
     .flags = L | CFGTAB_DERIVED | CFGTAB_SECRET, .ops = &cfgtab_ops_loaded,
     .size = sizeof(char *)},
    {"inference_workers_config.num_workers", CFGTAB_INT, OFF(workers), .flags = M, .min = 0,
     .max = 256, .def_doc = "CPU count",
     .doc = "inference worker threads (0 = CPU count; `--workers`)"},
    {"standby_config.enable_master_standby", CFGTAB_BOOL, OFF(ha_enable),
     .doc = "master/standby over etcd: one coordinator holds the lease and serves, the others "
            "answer `/readiness` 503 `NOT_MASTER`"},
    {"standby_config.master_standby_check_interval", CFGTAB_MS, OFF(ha_check_ms), .min = 0.05,
     .max = 3600, .def_d = 5,
     .doc = "the master renews its lease at least this often (and at TTL/3); standbys read the "
            "instance table this often"},
    {"standby_config.master_lock_ttl", CFGTAB_INT, OFF(ha_ttl_s), .min = 1, .max = 3600,
     .def_i = 15, .doc = "the lease: a master that stops renewing is replaced after this"},
    {"standby_config.master_lock_retry_interval", CFGTAB_MS, OFF(ha_retry_ms), .min = 0.05,
     .max = 3600, .def_d = 5,
     .doc = "a standby tries the lock at least this often (and when the holder's lease ends)"},
    {"standby_config.master_lock_max_failures", CFGTAB_INT, OFF(ha_max_failures), .min = 1,
     .max = 1000, .def_i = 3, .doc = "failed renewals in a row after which a master steps down"},
    {"standby_config.master_lock_key", CFGTAB_STRING, OFF(ha_key), .flags = CFGTAB_NONEMPTY,
     .def_s = "/master_lock",
     .doc = "the lock's etcd key; the replicated instance table is `<key>/instances`"},
    {"etcd_config.etcd_host", CFGTAB_STRING, OFF(etcd_host),
     .def_s = "etcd.default.svc.cluster.local", .doc = "etcd, when `etcd_endpoints` is not given"},
    {"etcd_config.etcd_port", CFGTAB_INT, OFF(etcd_port), .min = 1, .max = 65535, .def_i = 2379,
     .doc = "with `etcd_host`"},
    {"etcd_config.etcd_timeout", CFGTAB_MS, OFF(etcd_timeout_ms), .min = 0.1, .max = 600,
     .def_d = 5, .doc = "etcd request timeout"},
    {"etcd_config.etcd_endpoints", CFGTAB_STRLIST, OFF(etcd_endpoints), OFF(n_etcd_endpoints),
     .flags = M | CFGTAB_ONE_OR_LIST, .check = http_url,
     .def_doc = "`http://<etcd_host>:<etcd_port>`",
     .doc = "etcd members (tried in turn); `https://` uses `mgmt_tls_config`'s files as the "
            "client's"},
    {"precision_detection_config.precision_check_enabled", CFGTAB_BOOL, OFF(prec_enable),
     .flags = L,
     .doc = "sample decode answers with logprobs and check their quality "
            "(docs/precision-detection.md)"},
    {"precision_detection_config.interval_seconds", CFGTAB_MS, OFF(prec_interval_ms), .flags = L,
     .min = 0, .max = 86400, .def_d = 30,
     .doc = "at least this long between two sampled requests of a decode instance (all workers)"},
    {"precision_detection_config.logprobs_count", CFGTAB_INT, OFF(prec_logprobs), .flags = L,
     .min = 1, .max = 20, .def_i = 1,
     .doc = "top logprobs asked for: >= 3 enables garbled detection, >= 5 rare characters"},
    {"precision_detection_config.precision_issue_threshold", CFGTAB_INT, OFF(prec_issue_threshold),
     .flags = L, .min = 1, .max = 100000, .def_i = 10,
     .doc = "bad samples in a row of a PD group that start the probe and the alarm"},
    {"precision_detection_config.precision_clear_threshold", CFGTAB_INT, OFF(prec_clear_threshold),
     .flags = L, .min = 1, .max = 100000, .def_i = 10,
     .doc = "valid good samples in a row that clear an active alarm"},
    {"precision_detection_config.probe_max_attempts", CFGTAB_INT, OFF(prec_probe_attempts),
     .flags = L, .min = 0, .max = 100, .def_i = 3,
     .doc = "probe requests at most (until one answers right; 0 = no probe)"},
    {"precision_detection_config.probe_timeout_seconds", CFGTAB_MS, OFF(prec_probe_timeout_ms),
     .flags = L, .min = 0.1, .max = 86400, .def_d = 600, .doc = "one probe request"},
    {"precision_detection_config.probe_question", CFGTAB_STRING, OFF(prec_probe_question),
     .flags = L | M | CFGTAB_NONEMPTY, .def_s = "相对论的发明人是谁",
     .doc = "the probe's question (a chat request pinned to the suspect P/D pair)"},
    {"precision_detection_config.probe_expected_answer", CFGTAB_STRING, OFF(prec_probe_answer),
     .flags = L | M | CFGTAB_NONEMPTY, .def_s = "爱因斯坦",
     .doc = "a probe passes when its answer contains this"},
    {"precision_detection_config.min_sample_tokens", CFGTAB_INT, OFF(prec_min_tokens),
     .flags = L | M, .min = 1, .max = 100000, .def_i = 24,
     .doc = "a sample with fewer generated tokens is not judged (it counts for nothing): "
            "a loop needs room to show"},
    {"precision_detection_config.common_chars", CFGTAB_STRING, OFF(prec_common_chars),
     .flags = L | M, .check = common_chars, .def_s = "", .def_doc = "built-in",
     .doc = "the common code points, `HEX-HEX,...` (`\"\"` = Latin, Greek, Cyrillic, Arabic, "
            "Indic, CJK, kana, Hangul, symbols, emoji …); a larger share outside is rare"},
    {"api_config.controller_api_dns", CFGTAB_STRING, OFF(ctl_host), .src = SRC_CTL,
     .flags = L | CFGTAB_NONEMPTY, .env = "CONTROLLER_SERVICE", .def_s = "127.0.0.1",
     .dump = "motor_controller_config.api_config.controller_api_dns",
     .doc = "where precision alarms go (`POST /controller/report_alarms`)"},
    {"api_config.controller_api_port", CFGTAB_INT, OFF(ctl_port), .src = SRC_CTL, .flags = L,
     .min = 1, .max = 65535, .def_i = 1026,
     .dump = "motor_controller_config.api_config.controller_api_port",
     .doc = "with `controller_api_dns`"},
    {"tls_config.infer_tls_config", CFGTAB_GROUP, OFF(infer_tls),
     .flags = L | CFGTAB_OBJECT | CFGTAB_IFPRESENT, .src = SRC_DEPLOY, .sub = &infer_tls_table,
     .ops = &tls_ops, .doc = "TLS of the inference port"},
    {"tls_config.mgmt_tls_config", CFGTAB_GROUP, OFF(mgmt_tls),
     .flags = L | CFGTAB_OBJECT | CFGTAB_IFPRESENT, .src = SRC_DEPLOY, .sub = &tls_table,
     .ops = &tls_ops, .doc = "TLS of the management port"},
    {"tls_config.etcd_tls_config", CFGTAB_GROUP, OFF(etcd_tls),
     .flags = CFGTAB_OBJECT | CFGTAB_IFPRESENT, .src = SRC_DEPLOY, .sub = &tls_table,
     .ops = &tls_ops,
     .doc = "client TLS towards etcd (master/standby): `ca_file` verifies etcd, "
            "`cert_file`/`key_file` are the client certificate when etcd asks for one; "
            "enabled, the default endpoint is `https://`"},
};

const struct cfgtab ccfg_cfgtab = CFGTAB_TABLE("coordinator", rows, src_names);

void ccfg_init(struct ccfg *c)
{
    cfgtab_init(&ccfg_cfgtab, c, sizeof(*c), NULL);
}

void ccfg_release(struct ccfg *c)
{
    if (c)
        cfgtab_release(&ccfg_cfgtab, c);
}

static void add_key(struct ccfg *c, const char *key)
{
    c->api_keys = xrealloc(c->api_keys, (c->n_api_keys + 2) * sizeof(char *));
    c->api_keys[c->n_api_keys++] = xstrdup(key);
    c->api_keys[c->n_api_keys] = NULL;
}

/* api_key_file: one key per line; blank lines and '#' comments skipped. */
static void read_key_file(struct ccfg *c, struct cfg_errors *e)
{
    const char *kf = c->api_key_file;
    if (!kf || !*kf)
        return;
    size_t len = 0;
    char *text = util_read_file(kf, 1 << 20, &len);
    if (!text) {
        cfg_error(e, "api_key_config.api_key_file", "cannot read %s: %s", kf, strerror(errno));
        return;
    }
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
            explicit_bzero(k, b - a);
            free(k);
        }
        p += n;
        while (*p == '\r' || *p == '\n')
            p++;
    }
    explicit_bzero(text, len);
    free(text);
}

/* A TLS block's files are read only when it is on. */
static void check_tls(struct ccfg_tls *t, const char *name, struct cfg_errors *e)
{
    if (!t->enable)
        return;
    if (!t->cert_file || !*t->cert_file || !t->key_file || !*t->key_file) {
        char where[64];
        snprintf(where, sizeof(where), "%s.enable_tls", name);
        cfg_error(e, where, "TLS enabled but cert_file/key_file missing");
        /* Nothing of an unusable block is kept (or shown). */
        char **files[] = {&t->cert_file, &t->key_file, &t->ca_file};
        for (size_t i = 0; i < ARRAY_LEN(files); i++) {
            free(*files[i]);
            *files[i] = NULL;
        }
        if (t->key_password)
            explicit_bzero(t->key_password, strlen(t->key_password));
        free(t->key_password);
        t->key_password = NULL;
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
    struct cfgtab_ctx ctx = {.errs = e};
    cfgtab_apply(&ccfg_cfgtab, SRC_BLOCK, c, blk, &ctx);
    cfgtab_apply(&ccfg_cfgtab, SRC_DEPLOY, c, json_is_object(deploy) ? deploy : NULL, &ctx);
    json_t *ctl = json_object_get(root, "motor_controller_config");
    cfgtab_apply(&ccfg_cfgtab, SRC_CTL, c, json_is_object(ctl) ? ctl : NULL, &ctx);
    cfgtab_ctx_release(&ctx);

    c->scheduler = CCFG_SCHED_LOAD_BALANCE;
    for (int i = 0; effective_scheds[i]; i++)
        if (strcmp(c->scheduler_type, effective_scheds[i]) == 0)
            c->scheduler = (enum ccfg_scheduler)i;
    c->kv_mode = strcmp(c->kv_mode_name, "load_gated") == 0 ? CCFG_KV_LOAD_GATED : CCFG_KV_UNIFIED;
    c->kv_approx = strcmp(c->kv_source_name, "approximate") == 0;
    c->kv_event_port = *c->kv_endpoint ? zmq_port(c->kv_endpoint) : 5557;
    c->kv_replay_port = *c->kv_replay_endpoint ? zmq_port(c->kv_replay_endpoint) : 0;
    if (c->kv_event_port < 0)
        c->kv_event_port = 0;
    if (c->kv_replay_port < 0)
        c->kv_replay_port = 0;
    if (c->breaker_max_open_ms < c->breaker_open_ms)
        c->breaker_max_open_ms = c->breaker_open_ms;
    check_tls(&c->infer_tls, "infer_tls_config", e);
    check_tls(&c->mgmt_tls, "mgmt_tls_config", e);
    if (c->n_etcd_endpoints == 0) {
        free(c->etcd_endpoints); /* the empty default list */
        c->etcd_endpoints = xcalloc(2, sizeof(char *));
        c->etcd_endpoints[0] = xasprintf("%s://%s:%d", c->etcd_tls.enable ? "https" : "http",
                                         c->etcd_host, c->etcd_port);
        c->n_etcd_endpoints = 1;
    }
    read_key_file(c, e);
    if (c->api_key_enable && c->n_api_keys == 0)
        cfg_error(e, "api_key_config",
                  "enable_api_key is true but no key is configured "
                  "(api_keys or api_key_file)");
    if (c->mgmt_key_enable) {
        const char *mf = c->mgmt_key_file;
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
}

json_t *ccfg_to_json(const struct ccfg *c)
{
    return cfgtab_dump(&ccfg_cfgtab, c);
}
