/* sim_args — the simulator's command line: vLLM's flags (so command lines the node
 * manager renders for `vllm serve` work unchanged) plus the simulator's own.
 *
 * Accepted forms: `--flag value`, `--flag=value`, bare boolean flags, an optional leading
 * `serve` and a positional model (`serve /models/x`). Unknown `--flags` (with or without
 * a value) are collected in `ignored` for the caller to log, never an error.
 *
 * Pure (no I/O besides sim_args_usage), thread-safe. */
#ifndef MOTOR_SIM_ARGS_H
#define MOTOR_SIM_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

struct sim_args {
    /* vLLM */
    char *host;          /* "127.0.0.1" */
    int port;            /* 8000; 0 = ephemeral */
    char *model;         /* "sim-model" */
    char **served_names; /* --served-model-name (one or more); empty => {model} */
    size_t n_served;
    int dp_rank;       /* --data-parallel-rank, 0 */
    int dp_size;       /* --data-parallel-size, 1 */
    char *dp_address;  /* --data-parallel-address, NULL */
    int dp_rpc_port;   /* --data-parallel-rpc-port, 0 = unset */
    int dp_size_local; /* --data-parallel-size-local, 0 = unset */
    int dp_start_rank; /* --data-parallel-start-rank, 0 */
    bool headless;
    char *kv_transfer_config; /* raw JSON object text, validated; NULL = none */
    char *kv_role;            /* its "kv_role", may be NULL */
    char *kv_engine_id;       /* its "engine_id", may be NULL */
    int node_rank;
    char *master_addr;
    int master_port;
    int max_model_len; /* --max-model-len, 4096 */
    int max_num_seqs;  /* --max-num-seqs: running requests at most, 256 */
    bool ft;           /* --ft / --enable-fault-tolerance */
    char *kv_events_config;     /* --kv-events-config raw JSON, validated; NULL = none */
    int block_size;             /* --block-size, 16 */
    int num_gpu_blocks;         /* --num-gpu-blocks-override / --num-gpu-blocks, 8192 */
    bool prefix_caching;        /* --enable-prefix-caching (default) / --no-enable-... */
    bool no_prefix_caching;
    char *prefix_hash_algo;     /* --prefix-caching-hash-algo: accepted, sha256_cbor used */
    bool return_token_ids;      /* --return-tokens-as-token-ids */
    int max_logprobs;           /* --max-logprobs, 20 */
    /* HTTPS as vLLM (uvicorn) serves it: both files or neither; ssl_cert_reqs is
     * Python's ssl.VerifyMode (0 none, 1 optional, 2 required), and with a CA file and a
     * non-zero value client certificates are verified (mutual TLS: required either way). */
    char *ssl_keyfile;          /* --ssl-keyfile, NULL = plain HTTP */
    char *ssl_certfile;         /* --ssl-certfile */
    char *ssl_ca_certs;         /* --ssl-ca-certs */
    int ssl_cert_reqs;          /* --ssl-cert-reqs, 0 */
    bool prompt_tokens_details; /* --enable-prompt-tokens-details: usage.cached_tokens */
    /* simulator */
    double load_seconds;      /* 0 */
    double tokens_per_second; /* 50; 0 = instant */
    int ttft_ms;              /* 20 */
    int workers;              /* 0 */
    bool fail_load;
    double crash_after; /* seconds; < 0 = never */
    long crash_after_tokens;  /* SIGKILL after this many tokens in total; 0 = never */
    int crash_after_tokens_i; /* (parsed form) */
    double prefill_ms_per_token; /* TTFT per uncached prompt token, 0.02 */
    int max_connections;      /* --max-connections, 0 = unlimited */
    char *kv_events_encoding; /* "array" (default) | "map" */
    int ft_recover_ms;  /* 500 */
    char *fault;        /* --fault MODE: start in that fault mode, NULL = none */
    char *log_level;    /* --log-level / --uvicorn-log-level, NULL = info */
    bool help;
    /* unknown flags and stray positionals, as given ("--foo=bar", "--baz") */
    char **ignored;
    size_t n_ignored;
};

/* Parse argv[1..argc-1] (argv[0] is the subcommand name). 0 with *a filled (release it
 * with sim_args_release), or -EINVAL with a message in err (a is then released). */
int sim_args_parse(struct sim_args *a, int argc, char **argv, char *err, size_t cap);
void sim_args_release(struct sim_args *a);

void sim_args_usage(FILE *out);

#endif
