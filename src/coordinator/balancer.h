/* balancer — choose an endpoint among the routable endpoints of some instances.
 *
 * least in-flight tokens (default, upstream "load_balance"): score = the endpoint's
 * in-flight token estimate + weight × the average over its instance's endpoints (the
 * instance term spreads DP ranks of a busy instance less eagerly); the lowest score
 * wins, ties broken by a rotating start so equal endpoints share the work. An
 * endpoint's estimate = the tokens of the legs this coordinator has in flight there +,
 * while its last /metrics reading is fresh, BAL_FOREIGN_TOKENS per request the engine
 * reported running or waiting beyond those legs (engscrape.c).
 * round robin: the candidates in order, one step per pick.
 * cache affinity (bal_select_affinity, upstream "kv_cache_affinity"): each candidate's
 * cached prefix of the request (matched tokens, from the KV index or the approximate
 * prefix trees) weighs against its load:
 *   unified     score = prompt tokens not cached there + its load score (as above): the
 *               work the request adds to what the endpoint already has; lowest wins;
 *   load_gated  the longest cached prefix among the endpoints whose load score is at
 *               most gate x the candidates' mean + the request's own tokens (a hot
 *               prefix cannot pile everything on one endpoint); least load among equal
 *               prefixes, and least load overall when nothing is cached anywhere.
 *
 * Pure apart from reading the atomic load counters; any thread. */
#ifndef MOTOR_BALANCER_H
#define MOTOR_BALANCER_H

#include "coordinator/instances.h"

#include <stdatomic.h>

#define BAL_FOREIGN_TOKENS 512.0 /* a request this coordinator did not send, in tokens */

enum bal_policy { BAL_LEAST_TOKENS = 0, BAL_ROUND_ROBIN, BAL_KV_UNIFIED, BAL_KV_LOAD_GATED };

struct bal_pick {
    struct instance *inst;
    struct inst_endpoint *ep;
};

/* Candidate filter: return false to skip (breaker open, already failed, other model).
 * Only routable endpoints (inst_ep_routable) are ever offered. */
typedef bool (*bal_filter_fn)(struct instance *in, const struct inst_endpoint *ep, void *arg);

/* Pick one endpoint. rr: a shared rotation counter (atomically incremented).
 * 0, or -ENOENT when no candidate passes the filter. */
int bal_select(enum bal_policy pol, double inst_weight, struct instance *const *insts, size_t n,
               bal_filter_fn ok, void *arg, atomic_uint *rr, struct bal_pick *out);

/* Matched prefix tokens of the request on each of m endpoints (named by hostport). */
typedef void (*bal_match_fn)(void *ctx, const char *const *hostports, size_t m, uint32_t *tokens);

struct bal_affinity {
    bal_match_fn match;
    void *ctx;
    int64_t prompt_tokens; /* the request's prompt */
    int64_t req_tokens;    /* its load estimate (the gate's slack) */
    double gate;           /* load_gated factor (>= 1) */
    uint32_t matched;      /* out: matched tokens of the pick */
};

#define BAL_AFFINITY_MAX 256 /* candidates scored at once; beyond, bal_select's rule */

/* pol BAL_KV_UNIFIED or BAL_KV_LOAD_GATED (any other: bal_select). Same contract as
 * bal_select; aff->matched is set. */
int bal_select_affinity(enum bal_policy pol, double inst_weight, struct instance *const *insts,
                        size_t n, bal_filter_fn ok, void *arg, atomic_uint *rr,
                        struct bal_affinity *aff, struct bal_pick *out);

#endif
