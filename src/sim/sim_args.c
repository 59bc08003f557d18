#include "sim/sim_args.h"

#include "common/util.h"
#include "sim/sim_kvev.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum opt_kind { OPT_STR, OPT_INT, OPT_DBL, OPT_BOOL, OPT_NAMES, OPT_KVCFG };

struct opt {
    const char *name; /* without the leading "--" */
    enum opt_kind kind;
    size_t off;
    double min, max;
};

#define O(name, kind, field, min, max)                                                             \
    {                                                                                              \
        name, kind, offsetof(struct sim_args, field), min, max                                     \
    }

static const struct opt opts[] = {
    O("host", OPT_STR, host, 0, 0),
    O("port", OPT_INT, port, 0, 65535),
    O("model", OPT_STR, model, 0, 0),
    O("served-model-name", OPT_NAMES, served_names, 0, 0),
    O("data-parallel-rank", OPT_INT, dp_rank, 0, 65535),
    O("data-parallel-size", OPT_INT, dp_size, 1, 65536),
    O("data-parallel-address", OPT_STR, dp_address, 0, 0),
    O("data-parallel-rpc-port", OPT_INT, dp_rpc_port, 0, 65535),
    O("data-parallel-size-local", OPT_INT, dp_size_local, 0, 65536),
    O("data-parallel-start-rank", OPT_INT, dp_start_rank, 0, 65535),
    O("headless", OPT_BOOL, headless, 0, 0),
    O("kv-transfer-config", OPT_KVCFG, kv_transfer_config, 0, 0),
    O("node-rank", OPT_INT, node_rank, 0, 65535),
    O("master-addr", OPT_STR, master_addr, 0, 0),
    O("master-port", OPT_INT, master_port, 0, 65535),
    O("max-model-len", OPT_INT, max_model_len, 16, 1 << 24),
    O("max-num-seqs", OPT_INT, max_num_seqs, 1, 1 << 20),
    O("ft", OPT_BOOL, ft, 0, 0),
    O("kv-events-config", OPT_STR, kv_events_config, 0, 0),
    O("block-size", OPT_INT, block_size, 1, 1024),
    O("num-gpu-blocks-override", OPT_INT, num_gpu_blocks, 1, 1 << 24),
    O("num-gpu-blocks", OPT_INT, num_gpu_blocks, 1, 1 << 24),
    O("enable-prefix-caching", OPT_BOOL, prefix_caching, 0, 0),
    O("no-enable-prefix-caching", OPT_BOOL, no_prefix_caching, 0, 0),
    O("prefix-caching-hash-algo", OPT_STR, prefix_hash_algo, 0, 0),
    O("return-tokens-as-token-ids", OPT_BOOL, return_token_ids, 0, 0),
    O("max-logprobs", OPT_INT, max_logprobs, 0, 20),
    O("enable-prompt-tokens-details", OPT_BOOL, prompt_tokens_details, 0, 0),
    O("crash-after-tokens", OPT_INT, crash_after_tokens_i, 1, INT32_MAX),
    O("prefill-ms-per-token", OPT_DBL, prefill_ms_per_token, 0, 60000),
    O("max-connections", OPT_INT, max_connections, 0, 1 << 24),
    O("kv-events-encoding", OPT_STR, kv_events_encoding, 0, 0),
    O("enable-fault-tolerance", OPT_BOOL, ft, 0, 0),
    O("load-seconds", OPT_DBL, load_seconds, 0, 86400),
    O("tokens-per-second", OPT_DBL, tokens_per_second, 0, 1e6),
    O("ttft-ms", OPT_INT, ttft_ms, 0, 3600000),
    O("workers", OPT_INT, workers, 0, 64),
    O("fail-load", OPT_BOOL, fail_load, 0, 0),
    O("crash-after", OPT_DBL, crash_after, 0, 86400 * 365.0),
    O("ft-recover-ms", OPT_INT, ft_recover_ms, 0, 3600000),
    O("fault", OPT_STR, fault, 0, 0),
    O("log-level", OPT_STR, log_level, 0, 0),
    O("uvicorn-log-level", OPT_STR, log_level, 0, 0),
    O("ssl-keyfile", OPT_STR, ssl_keyfile, 0, 0),
    O("ssl-certfile", OPT_STR, ssl_certfile, 0, 0),
    O("ssl-ca-certs", OPT_STR, ssl_ca_certs, 0, 0),
    O("ssl-cert-reqs", OPT_INT, ssl_cert_reqs, 0, 2),
};

/* vLLM flags known to take no value: an unknown flag followed by a positional would
 * otherwise swallow it. ("--no-*" flags are always bare.) */
static const char *const bare_vllm_flags[] = {
    "enforce-eager",
    "trust-remote-code",
    "enable-expert-parallel",
    "disable-log-requests",
    "disable-log-stats",
    "enable-log-requests",
    "enable-chunked-prefill",
    "enable-eplb",
    "data-parallel-external-lb",
    "data-parallel-hybrid-lb",
    "enable-auto-tool-choice",
    "disable-custom-all-reduce",
    "enable-lora",
    "enable-sleep-mode",
    "enable-force-include-usage",
    "enable-server-load-tracking",
    "enable-request-id-headers",
    "disable-fastapi-docs",
    "async-scheduling",
    "skip-tokenizer-init",
    "disable-frontend-multiprocessing",
    "enable-return-tokens-as-token-ids",
    "disable-uvicorn-access-log",
};

static const char *const start_faults[] = {"unhealthy", "ft_dead", "hang",  "error",
                                           "repeat",    "garbled", "rare_chars"};

static void set_err(char *err, size_t cap, const char *msg, const char *flag, const char *val)
{
    if (err && cap)
        snprintf(err, cap, "%s%s%s%s%s", msg, flag ? " --" : "", flag ? flag : "", val ? ": " : "",
                 val ? val : "");
}

static void push(char ***list, size_t *n, const char *s)
{
    *list = xrealloc(*list, (*n + 1) * sizeof(**list));
    (*list)[(*n)++] = xstrdup(s);
}

static void free_list(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

void sim_args_release(struct sim_args *a)
{
    if (!a)
        return;
    free(a->host);
    free(a->model);
    free_list(a->served_names, a->n_served);
    free(a->dp_address);
    free(a->kv_transfer_config);
    free(a->kv_role);
    free(a->kv_engine_id);
    free(a->master_addr);
    free(a->fault);
    free(a->kv_events_config);
    free(a->prefix_hash_algo);
    free(a->kv_events_encoding);
    free(a->log_level);
    free(a->ssl_keyfile);
    free(a->ssl_certfile);
    free(a->ssl_ca_certs);
    free_list(a->ignored, a->n_ignored);
    memset(a, 0, sizeof(*a));
}

static void defaults(struct sim_args *a)
{
    memset(a, 0, sizeof(*a));
    a->port = 8000;
    a->dp_size = 1;
    a->max_model_len = 4096;
    a->max_num_seqs = 256;
    a->tokens_per_second = 50;
    a->ttft_ms = 20;
    a->crash_after = -1;
    a->ft_recover_ms = 500;
    a->block_size = 16;
    a->num_gpu_blocks = 8192;
    a->prefix_caching = true;
    a->max_logprobs = 20;
    a->prefill_ms_per_token = 0.02;
}

static bool is_flag(const char *s)
{
    return s[0] == '-' && s[1] == '-' && s[2] != '\0';
}

static int parse_bool_text(const char *v, bool *out)
{
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1")) {
        *out = true;
        return 0;
    }
    if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "0")) {
        *out = false;
        return 0;
    }
    return -EINVAL;
}

/* kv_transfer_config must be a JSON object; its kv_role and engine_id are kept. */
static int parse_kvcfg(struct sim_args *a, const char *v, char *err, size_t cap)
{
    json_error_t jerr;
    json_t *o = json_loads(v, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(o)) {
        json_decref(o);
        set_err(err, cap, "not a JSON object:", "kv-transfer-config", v);
        return -EINVAL;
    }
    const json_t *role = json_object_get(o, "kv_role");
    const json_t *eid = json_object_get(o, "engine_id");
    free(a->kv_transfer_config);
    free(a->kv_role);
    free(a->kv_engine_id);
    a->kv_transfer_config = xstrdup(v);
    a->kv_role = json_is_string(role) ? xstrdup(json_string_value(role)) : NULL;
    a->kv_engine_id = json_is_string(eid)    ? xstrdup(json_string_value(eid))
                      : json_is_integer(eid) ? xasprintf("%lld", (long long)json_integer_value(eid))
                                             : NULL;
    json_decref(o);
    return 0;
}

static int apply_opt(struct sim_args *a, const struct opt *o, const char *v, char *err, size_t cap)
{
    char *base = (char *)a + o->off;
    int rc = 0;
    switch (o->kind) {
    case OPT_STR:
        free(*(char **)base);
        *(char **)base = xstrdup(v);
        break;
    case OPT_INT:
        rc = util_parse_int(v, (int)o->min, (int)o->max, (int *)base);
        break;
    case OPT_DBL:
        rc = util_parse_double(v, o->min, o->max, (double *)base);
        break;
    case OPT_BOOL:
        rc = parse_bool_text(v, (bool *)base);
        break;
    case OPT_NAMES:
        push(&a->served_names, &a->n_served, v);
        break;
    case OPT_KVCFG:
        return parse_kvcfg(a, v, err, cap);
    }
    if (rc) {
        set_err(err, cap, rc == -ERANGE ? "value out of range for" : "invalid value for", o->name,
                v);
        return -EINVAL;
    }
    return 0;
}

static const struct opt *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < ARRAY_LEN(opts); i++) {
        if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0)
            return &opts[i];
    }
    return NULL;
}

static bool bare_unknown(const char *name, size_t len)
{
    if (len > 3 && strncmp(name, "no-", 3) == 0)
        return true;
    for (size_t i = 0; i < ARRAY_LEN(bare_vllm_flags); i++) {
        if (strlen(bare_vllm_flags[i]) == len && strncmp(bare_vllm_flags[i], name, len) == 0)
            return true;
    }
    return false;
}

/* A following argument is the unknown flag's value unless it looks like another flag
 * (negative numbers are values). */
static bool looks_like_value(const char *s)
{
    if (!s)
        return false;
    if (s[0] != '-')
        return true;
    return s[1] >= '0' && s[1] <= '9';
}

static int finish(struct sim_args *a, char *err, size_t cap)
{
    if (!a->host)
        a->host = xstrdup("127.0.0.1");
    if (!a->model)
        a->model = xstrdup("sim-model");
    if (a->n_served == 0)
        push(&a->served_names, &a->n_served, a->model);
    if (a->dp_rank >= a->dp_size && a->dp_size > 1) {
        char n[64];
        snprintf(n, sizeof(n), "%d >= data-parallel-size %d", a->dp_rank, a->dp_size);
        set_err(err, cap, "invalid value for", "data-parallel-rank", n);
        return -EINVAL;
    }
    if (!a->ssl_keyfile != !a->ssl_certfile) {
        set_err(err, cap, "--ssl-keyfile and --ssl-certfile go together: missing",
                a->ssl_keyfile ? "ssl-certfile" : "ssl-keyfile", NULL);
        return -EINVAL;
    }
    if (a->no_prefix_caching)
        a->prefix_caching = false;
    a->crash_after_tokens = a->crash_after_tokens_i;
    if (a->kv_events_encoding && strcmp(a->kv_events_encoding, "array") &&
        strcmp(a->kv_events_encoding, "map")) {
        set_err(err, cap, "invalid value for", "kv-events-encoding", "expected array or map");
        return -EINVAL;
    }
    if (a->kv_events_config) {
        struct sim_kvev_config kc;
        char msg[160];
        if (sim_kvev_parse_config(a->kv_events_config, &kc, msg, sizeof(msg))) {
            set_err(err, cap, msg, NULL, NULL);
            return -EINVAL;
        }
        sim_kvev_config_release(&kc);
    }
    if (a->fault) {
        bool ok = false;
        for (size_t i = 0; i < ARRAY_LEN(start_faults); i++)
            ok = ok || strcmp(a->fault, start_faults[i]) == 0;
        if (!ok) {
            set_err(err, cap, "invalid value for", "fault",
                    "expected unhealthy, ft_dead, hang, error, repeat, garbled or rare_chars");
            return -EINVAL;
        }
    }
    return 0;
}

int sim_args_parse(struct sim_args *a, int argc, char **argv, char *err, size_t cap)
{
    defaults(a);
    if (err && cap)
        err[0] = '\0';
    bool model_from_flag = false;
    bool seen_positional = false;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!arg)
            continue;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            a->help = true;
            continue;
        }
        if (!is_flag(arg)) {
            /* `vllm serve MODEL`: skip the verb, take the first positional as the model. */
            if (!seen_positional && !strcmp(arg, "serve")) {
                seen_positional = true;
                continue;
            }
            seen_positional = true;
            if (!model_from_flag && !a->model) {
                a->model = xstrdup(arg);
            } else {
                push(&a->ignored, &a->n_ignored, arg);
            }
            continue;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const struct opt *o = find_opt(name, len);
        if (!o) {
            const char *next = i + 1 < argc ? argv[i + 1] : NULL;
            if (!eq && !bare_unknown(name, len) && looks_like_value(next)) {
                char *both = xasprintf("%s %s", arg, next);
                push(&a->ignored, &a->n_ignored, both);
                free(both);
                i++;
            } else {
                push(&a->ignored, &a->n_ignored, arg);
            }
            continue;
        }
        const char *val = eq ? eq + 1 : NULL;
        if (o->kind == OPT_BOOL && !val) {
            *(bool *)((char *)a + o->off) = true;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc || is_flag(argv[i + 1])) {
                set_err(err, cap, "missing value for", o->name, NULL);
                rc = -EINVAL;
                goto fail;
            }
            val = argv[++i];
        }
        if ((rc = apply_opt(a, o, val, err, cap)))
            goto fail;
        if (o->kind == OPT_STR && !strcmp(o->name, "model"))
            model_from_flag = true;
        /* --served-model-name takes one or more names (nargs="+"). */
        while (o->kind == OPT_NAMES && !eq && i + 1 < argc && !is_flag(argv[i + 1]) &&
               argv[i + 1][0] != '-')
            push(&a->served_names, &a->n_served, argv[++i]);
    }
    if ((rc = finish(a, err, cap)))
        goto fail;
    return 0;
fail:
    sim_args_release(a);
    return rc;
}

void sim_args_usage(FILE *out)
{
    fputs("usage: motor engine-sim [serve] [MODEL] [options]\n"
          "\n"
          "An engine simulator speaking vLLM's HTTP surface (OpenAI completions and chat,\n"
          "SSE streaming, PD kv_transfer_params hand-off, /v1/fault_tolerance/*, /metrics)\n"
          "with fault injection (POST /sim/fault). See docs/engine-sim.md.\n"
          "\n"
          "vLLM options (other --flags are accepted and ignored):\n"
          "  --host ADDR                     bind address (127.0.0.1)\n"
          "  --port N                        HTTP port (8000; 0 = ephemeral)\n"
          "  --model NAME                    model (sim-model)\n"
          "  --served-model-name NAME...     names served (default: the model)\n"
          "  --data-parallel-rank N          this engine's global DP rank (0)\n"
          "  --data-parallel-size N          DP world size (1)\n"
          "  --data-parallel-address ADDR    --data-parallel-rpc-port N\n"
          "  --data-parallel-size-local N    --data-parallel-start-rank N\n"
          "  --headless                      no HTTP server; stay alive until signalled\n"
          "  --kv-transfer-config JSON       KV connector config (kv_role, engine_id)\n"
          "  --node-rank N  --master-addr ADDR  --master-port N\n"
          "  --max-model-len N               context length (4096)\n"
          "  --max-num-seqs N                concurrently running requests (256)\n"
          "  --enable-fault-tolerance, --ft  serve /v1/fault_tolerance/* (else 404)\n"
          "  --kv-events-config JSON         publish KV-cache events (ZMQ PUB, msgpack), vLLM's\n"
          "                                  keys: enable_kv_cache_events, publisher, endpoint,\n"
          "                                  replay_endpoint, buffer_steps, hwm, topic\n"
          "  --block-size N                  KV block size in tokens (16)\n"
          "  --num-gpu-blocks-override N     KV cache capacity in blocks (8192)\n"
          "  --[no-]enable-prefix-caching    prefix caching (on)\n"
          "  --return-tokens-as-token-ids    logprobs tokens as \"token_id:N\"\n"
          "  --max-logprobs N                top logprobs at most (20)\n"
          "  --ssl-certfile F --ssl-keyfile F  serve HTTPS (PEM files; both or neither)\n"
          "  --ssl-ca-certs F --ssl-cert-reqs 2  verify client certificates (mutual TLS)\n"
          "\n"
          "simulator options:\n"
          "  --load-seconds S                model loading time (0): /health 503 until done\n"
          "  --tokens-per-second R           generation speed (50; 0 = instant)\n"
          "  --ttft-ms MS                    time to first token (20)\n"
          "  --workers N                     fork N worker children (like EngineCore/TP)\n"
          "  --fail-load                     exit 1 when loading finishes\n"
          "  --crash-after S                 die by SIGKILL S seconds after start\n"
          "  --crash-after-tokens N          die by SIGKILL once N tokens were sent (in total)\n"
          "  --prefill-ms-per-token MS       TTFT per uncached prompt token (0.02)\n"
          "  --max-connections N             HTTP connections at most (0 = unlimited)\n"
          "  --kv-events-encoding array|map  KV event batch encoding (array, as released vLLM)\n"
          "  --ft-recover-ms MS              FT apply -> healthy delay (500)\n"
          "  --fault MODE                    start in fault mode unhealthy|ft_dead|hang|error\n"
          "                                  (also env MOTOR_SIM_FAULT)\n"
          "  --log-level LEVEL               debug|info|warn|error (info)\n"
          "  --help                          this text\n",
          out);
}
