/* sim_req — parsing and validation of the generation requests the simulator serves, as
 * vLLM's OpenAI server accepts them: completions, chat completions, the Responses API
 * subset and Anthropic-style messages (the last two become a chat conversation).
 *
 * Everything from the network is type- and range-checked; a failure fills a
 * struct sim_err with the HTTP status, the offending parameter and a message for an
 * OpenAI-style error body. Unknown fields are ignored (as vLLM does). Prompts are
 * tokenized here (sim_tok) so every later step works on token ids.
 *
 * Pure: no I/O, thread-safe. */
#ifndef MOTOR_SIM_REQ_H
#define MOTOR_SIM_REQ_H

#include "sim/sim_tok.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sim_api { SIM_API_COMPLETIONS, SIM_API_CHAT, SIM_API_RESPONSES, SIM_API_MESSAGES };

/* Role of a request in a prefill/decode hand-off (kv_transfer_params). */
enum sim_leg {
    SIM_LEG_NONE,    /* an ordinary (union) request */
    SIM_LEG_PREFILL, /* do_remote_decode: compute the prompt, hand out a KV ticket */
    SIM_LEG_DECODE,  /* do_remote_prefill with remote_*: fetch the ticket, then generate */
    SIM_LEG_TRIGGER, /* do_remote_prefill with a metaserver URL (concurrent_engine_sync):
                      * call the metaserver back, then generate */
};

#define SIM_REQ_MAX_N 16           /* choices per prompt */
#define SIM_REQ_MAX_PROMPTS 64     /* prompts in one completions batch */
#define SIM_REQ_MAX_BLOCK_IDS 4096 /* remote_block_ids in a decode leg */
#define SIM_REQ_MAX_ID_LEN 256     /* request_id, engine ids, host names */
#define SIM_REQ_MAX_URL_LEN 1024   /* metaserver URL */
#define SIM_REQ_MAX_MESSAGES 4096
#define SIM_COMPLETIONS_DEFAULT_MAX_TOKENS 16
#define SIM_REQ_MAX_LOGPROBS 20 /* vLLM's default max_logprobs */

struct sim_err {
    int status;     /* HTTP status: 400, 404, ... */
    char param[64]; /* offending parameter ("" when none) */
    char message[256];
};

struct sim_req_limits {
    int max_model_len;         /* prompt + completion tokens cap */
    const char *const *models; /* served model names (>= 1) */
    size_t n_models;
};

struct sim_prompt {
    struct sim_ids ids; /* the prompt's token ids (chat: the rendered template) */
    uint64_t hash;      /* sim_text_hash_ids of the ids */
    int tokens;         /* ids.n */
};

struct sim_req {
    enum sim_api api;
    char *model;                /* the model to report: requested or the first served */
    struct sim_prompt *prompts; /* completions may batch prompts; the others have one */
    size_t n_prompts;
    int n;          /* choices per prompt */
    int max_tokens; /* effective completion cap per choice */
    int min_tokens;
    bool ignore_eos; /* run to max_tokens */
    bool stream;
    bool include_usage;    /* stream_options.include_usage */
    bool continuous_usage; /* stream_options.continuous_usage_stats */
    int logprobs;          /* top logprobs per token; -1 = none (chat: logprobs=false) */
    bool return_token_ids; /* return_tokens_as_token_ids: "token_id:N" in logprobs */
    bool continue_final;   /* chat: continue_final_message */
    char *request_id;      /* body "request_id" (or SGLang's "rid"), or NULL */
    char *instructions;    /* Responses: echoed back */
    enum sim_leg leg;
    /* decode leg only: where the prefill engine's ticket is */
    char *remote_engine_id; /* may be NULL */
    char *remote_host;
    int remote_port;
    int64_t *remote_block_ids;
    size_t n_remote_block_ids;
    /* trigger leg only */
    char *metaserver; /* the callback URL */
};

/* Parse body (a JSON value of any type) as a request of kind api. 0 with *out filled
 * (release it with sim_req_release), or -EINVAL with *err filled (out then needs no
 * release, but releasing it is harmless). */
int sim_req_parse(const json_t *body, enum sim_api api, const struct sim_req_limits *lim,
                  struct sim_req *out, struct sim_err *err);
/* Frees the request's heap parts. NULL-safe, idempotent. */
void sim_req_release(struct sim_req *req);

/* Total prompt tokens over all prompts (each counted once, as usage reports them). */
int sim_req_prompt_tokens(const struct sim_req *req);

/* The served model a body names (404 when unknown). For the other routes. Returns the
 * name to report (static storage of lim) or NULL with err filled. */
const char *sim_req_model(const json_t *body, const struct sim_req_limits *lim,
                          struct sim_err *err);

/* Render a chat conversation (a "messages" array) into ids with the template
 * (sim_tok.h). For /tokenize too. 0 or -EINVAL (err filled). */
int sim_req_render_chat(const json_t *msgs, const json_t *system, bool continue_final,
                        struct sim_ids *out, struct sim_err *err);

/* Fill err (printf-style message). Returns -EINVAL for convenient `return`. */
int sim_err_set(struct sim_err *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
