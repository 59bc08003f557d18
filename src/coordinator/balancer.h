/* balancer — choose an endpoint among the routable endpoints of some instances.
 *
 * least in-flight tokens (default, upstream "load_balance"): score = the endpoint's
 * in-flight token estimate + weight × the average over its instance's endpoints (the
 * instance term spreads DP ranks of a busy instance less eagerly); the lowest score
 * wins, ties broken by a rotating start so equal endpoints share the work.
 * round robin: the candidates in order, one step per pick.
 *
 * Pure apart from reading the atomic load counters; any thread. */
#ifndef MOTOR_BALANCER_H
#define MOTOR_BALANCER_H

#include "coordinator/instances.h"

#include <stdatomic.h>

enum bal_policy { BAL_LEAST_TOKENS = 0, BAL_ROUND_ROBIN };

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

#endif
