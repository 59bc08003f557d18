/* The simulator process: shared between sim_main.c (process lifecycle: arguments, load,
 * workers, signals, faults that end the process) and sim_engine.c (the HTTP engine:
 * routes, generation, PD hand-off, fault tolerance, metrics). */
#ifndef MOTOR_SIM_INTERNAL_H
#define MOTOR_SIM_INTERNAL_H

#include "common/list.h"
#include "common/httpc.h"
#include "common/httpd.h"
#include "common/metrics.h"
#include "common/reactor.h"
#include "sim/sim_args.h"
#include "sim/sim_cache.h"
#include "sim/sim_kv.h"
#include "sim/sim_kvev.h"
#include "sim/sim_text.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum sim_phase { SIM_LOADING, SIM_READY, SIM_STOPPING };

/* Injected faults that keep the process alive (crash and exit0 end it at once). */
enum sim_fault {
    SIM_FAULT_NONE,
    SIM_FAULT_UNHEALTHY, /* /health 503, FT "unhealthy", inference 503 */
    SIM_FAULT_FT_DEAD,   /* /health 503, FT "dead", inference 503 */
    SIM_FAULT_HANG,      /* the process stops answering anything */
    SIM_FAULT_ERROR,     /* /health 200, inference answers 500 */
};

/* Faults that act on streams after a number of tokens (engine-wide count). */
enum sim_stream_fault {
    SIM_SF_NONE,
    SIM_SF_STALL, /* generations stop sending tokens; connections stay open */
    SIM_SF_CUT,   /* responses end cleanly without finish_reason / [DONE] (or cut short) */
    SIM_SF_CRASH, /* SIGKILL the process */
};

enum sim_meta_fault { SIM_META_OK, SIM_META_FAIL, SIM_META_DELAY };

struct sim_gen;
struct sim_dp;

/* A counted list of generations (its gauge is the count). */
struct sim_gen_list {
    struct list_head head;
    int count;
};

struct sim_worker {
    pid_t pid;
    int pidfd; /* -1 once reaped */
};

struct sim {
    struct sim_args args;
    struct reactor *r;
    struct httpd *httpd; /* NULL when headless */
    struct httpc *httpc; /* decode legs fetch tickets with it */
    struct sim_kv *kv;
    uint16_t port;         /* bound HTTP port (0 when headless) */
    char *engine_id;       /* remote_engine_id handed out by prefill legs */
    char *kv_host;         /* remote_host handed out by prefill legs */
    int64_t start_ms;      /* monotonic */
    int64_t start_wall_ms; /* for API timestamps */
    uint64_t id_base;      /* random part of generated request ids */
    uint64_t id_seq;

    enum sim_phase phase;
    enum sim_fault fault;
    char *fault_info; /* why, for FT status "fault_info" (NULL = generic text) */
    bool hang_ignores_sigterm;
    int exit_code;

    /* fault tolerance: after an apply, "unhealthy/recovering" until ft_timer fires */
    bool ft_recovering;
    char *ft_last_request_id;
    char *ft_instruction;
    struct reactor_timer ft_timer;

    /* requests: waiting for a slot (max_num_seqs), fetching their KV ticket, running */
    struct sim_gen_list waiting, fetching, running;

    struct reactor_timer load_timer, crash_timer, kv_timer, end_timer;
    void (*pending_end)(struct sim *s); /* what end_timer does (crash/exit0/hang) */

    struct sim_dp *dp; /* the simulated DP group, NULL when not in one */

    /* output quality (repeat, garbled, rare_chars faults) */
    enum sim_mode quality;
    /* stream faults: act once `sf_after` more tokens were sent (-1: not armed) */
    enum sim_stream_fault sf;
    long sf_after;
    uint64_t tokens_total; /* tokens sent since start (--crash-after-tokens) */
    bool dying;            /* a token-count crash is due: send nothing more */
    struct reactor_timer dying_timer;
    /* trigger mode: the metaserver callback */
    enum sim_meta_fault meta_fault;
    int meta_delay_ms;

    struct sim_cache *cache; /* NULL without prefix caching */
    struct sim_kvev *kvev;   /* NULL without --kv-events-config */

    struct sim_worker *workers;
    int n_workers;

    struct metrics_registry *metrics;
    struct metrics_gauge *m_running, *m_waiting, *m_wait_capacity, *m_wait_kv, *m_kv_usage;
    struct metrics_counter *m_prompt_tokens, *m_gen_tokens, *m_success_length, *m_success_stop,
        *m_success_abort, *m_failed, *m_pc_queries, *m_pc_hits, *m_gpu_pc_queries, *m_gpu_pc_hits;
    struct metrics_gauge *m_cache_info;
    struct metrics_histogram *m_ttft, *m_e2e;
};

/* sim_engine.c */
/* Start the HTTP server and register the routes. 0 or -errno (logged). */
int sim_engine_start(struct sim *s);
/* Stop serving: closes streams and suspended requests, frees the server and client. */
void sim_engine_stop(struct sim *s);
/* Abort generations (SGLang's abort_request): those whose request id (body
 * request_id/rid, or the response id) is rid, or all. Returns how many. */
int sim_engine_abort(struct sim *s, const char *rid, bool all);
/* Resume stalled generations (after `recover`). */
void sim_engine_resume(struct sim *s);
void sim_update_gauges(struct sim *s);

/* sim_api.c: the routes that generate nothing (probes, models, metrics, tokenizer,
 * embeddings, FT, /sim/...). */
void sim_api_routes(struct sim *s);
void sim_metrics_init(struct sim *s);
/* An error answer in vLLM's shape (or Anthropic's for /v1/messages). */
void sim_respond_error(struct httpd_req *req, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* 503/500 while the engine cannot serve (answered); false when it can. */
bool sim_refuse(struct sim *s, struct httpd_req *req);
/* The served names as sim_req_limits wants them. */
struct sim_req_limits;
void sim_limits(struct sim *s, struct sim_req_limits *lim, const char **names, size_t cap);

/* sim_dp.c */
/* Join (or, as rank 0, host) the simulated DP group when the DP flags ask for one.
 * Always 0: problems are logged and leave the engine serving alone. */
int sim_dp_start(struct sim *s);
/* Stop monitoring the group (the DP world changed, e.g. after an FT apply). */
void sim_dp_dissolve(struct sim *s, const char *why);
void sim_dp_free(struct sim *s);

/* sim_main.c */
/* Leave the reactor loop and exit with code (graceful: workers are stopped). */
void sim_shutdown(struct sim *s, int code, const char *cause);
/* Apply a fault mode by name: 0, or -EINVAL for an unknown mode. Modes that end the
 * process (crash, exit0, hang) act on the next loop iteration, after the current
 * response had a chance to go out. */
int sim_fault_apply(struct sim *s, const char *mode, bool ignore_sigterm);
/* The same with the parameters of the token-count and metaserver modes (after_tokens /
 * tokens, ms); -1 = absent. */
int sim_fault_apply2(struct sim *s, const char *mode, bool ignore_sigterm, long tokens, long ms);
/* A token was sent: count it against --crash-after-tokens and armed stream faults.
 * Returns the stream fault that acts now (SIM_SF_NONE when none). */
enum sim_stream_fault sim_token_sent(struct sim *s);
/* The stream fault in force before sending another token (stall/cut once armed and
 * due), SIM_SF_NONE otherwise. */
enum sim_stream_fault sim_stream_fault_now(const struct sim *s);
const char *sim_fault_name(enum sim_fault f);

#endif
