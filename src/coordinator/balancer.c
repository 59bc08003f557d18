#include "coordinator/balancer.h"

#include "common/util.h"

#include <errno.h>

/* The engine's own word on its load, from its /metrics (engscrape.c) while fresh: the
 * requests it runs or queues beyond those this coordinator had in flight there when it
 * asked (other gateways, direct clients), in two readings in a row, each worth
 * BAL_FOREIGN_TOKENS; requests this coordinator sent since are in its own count. */
static double foreign_tokens(const struct inst_load *l, int64_t now)
{
    if (!l || atomic_load_explicit(&l->eng_until_ms, memory_order_acquire) < now)
        return 0;
    double foreign = (double)atomic_load_explicit(&l->eng_foreign_m, memory_order_relaxed) / 1000.0;
    return foreign > 0 ? foreign * BAL_FOREIGN_TOKENS : 0;
}

static double ep_tokens(const struct inst_endpoint *ep, int64_t now)
{
    if (!ep->load)
        return 0;
    return (double)atomic_load_explicit(&ep->load->tokens, memory_order_relaxed) +
           foreign_tokens(ep->load, now);
}

static double inst_avg_tokens(const struct instance *in, int64_t now)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < in->n_eps; i++) {
        if (!inst_ep_routable(&in->eps[i]) || !in->eps[i].load)
            continue;
        sum += ep_tokens(&in->eps[i], now);
        n++;
    }
    return n ? sum / (double)n : 0.0;
}

int bal_select(enum bal_policy pol, double inst_weight, struct instance *const *insts, size_t n,
               bal_filter_fn ok, void *arg, atomic_uint *rr, struct bal_pick *out)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < insts[i]->n_eps; j++)
            if (inst_ep_routable(&insts[i]->eps[j]) &&
                (!ok || ok(insts[i], &insts[i]->eps[j], arg)))
                count++;
    if (count == 0)
        return -ENOENT;
    size_t start = atomic_fetch_add_explicit(rr, 1, memory_order_relaxed) % count;
    int64_t now = pol == BAL_ROUND_ROBIN ? 0 : util_mono_ms();

    size_t c = 0, best_pos = SIZE_MAX;
    double best_score = 0;
    struct bal_pick best = {0};
    for (size_t i = 0; i < n; i++) {
        struct instance *in = insts[i];
        double avg = -1;
        for (size_t j = 0; j < in->n_eps; j++) {
            struct inst_endpoint *ep = &in->eps[j];
            if (!inst_ep_routable(ep) || (ok && !ok(in, ep, arg)))
                continue;
            size_t pos = (c + count - start) % count;
            c++;
            double score = 0;
            if (pol != BAL_ROUND_ROBIN) {
                if (avg < 0)
                    avg = inst_avg_tokens(in, now);
                score = ep_tokens(ep, now) + inst_weight * avg;
            }
            if (best_pos == SIZE_MAX || score < best_score ||
                (score == best_score && pos < best_pos)) {
                best_score = score;
                best_pos = pos;
                best.inst = in;
                best.ep = ep;
            }
        }
    }
    *out = best;
    return 0;
}

static double ep_load(struct instance *in, const struct inst_endpoint *ep, double inst_weight,
                      int64_t now)
{
    return ep_tokens(ep, now) + inst_weight * inst_avg_tokens(in, now);
}

int bal_select_affinity(enum bal_policy pol, double inst_weight, struct instance *const *insts,
                        size_t n, bal_filter_fn ok, void *arg, atomic_uint *rr,
                        struct bal_affinity *aff, struct bal_pick *out)
{
    aff->matched = 0;
    if (pol != BAL_KV_UNIFIED && pol != BAL_KV_LOAD_GATED)
        return bal_select(pol, inst_weight, insts, n, ok, arg, rr, out);
    int64_t now = util_mono_ms();
    struct bal_pick cand[BAL_AFFINITY_MAX];
    const char *hp[BAL_AFFINITY_MAX];
    double load[BAL_AFFINITY_MAX];
    uint32_t got[BAL_AFFINITY_MAX];
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < insts[i]->n_eps; j++) {
            struct inst_endpoint *ep = &insts[i]->eps[j];
            if (!inst_ep_routable(ep) || (ok && !ok(insts[i], ep, arg)))
                continue;
            if (m == BAL_AFFINITY_MAX)
                return bal_select(BAL_LEAST_TOKENS, inst_weight, insts, n, ok, arg, rr, out);
            cand[m] = (struct bal_pick){insts[i], ep};
            hp[m] = ep->hostport;
            load[m] = ep_load(insts[i], ep, inst_weight, now);
            m++;
        }
    if (m == 0)
        return -ENOENT;
    aff->match(aff->ctx, hp, m, got);
    size_t start = atomic_fetch_add_explicit(rr, 1, memory_order_relaxed) % m;
    double mean = 0;
    for (size_t j = 0; j < m; j++)
        mean += load[j];
    mean /= (double)m;
    double bound = aff->gate * mean + (double)aff->req_tokens;
    size_t best = SIZE_MAX;
    double best_score = 0;
    for (size_t k = 0; k < m; k++) {
        size_t j = (start + k) % m; /* ties go to the first in the rotation */
        double score;
        if (pol == BAL_KV_UNIFIED) {
            double uncached = (double)aff->prompt_tokens - (double)got[j];
            score = (uncached > 0 ? uncached : 0) + load[j];
        } else {
            /* Gated in: longest prefix first, then load (scaled below one token). */
            bool in = load[j] <= bound;
            score = in ? -(double)got[j] + load[j] / (bound + 1.0) / 2.0 : 1e18 + load[j];
        }
        if (best == SIZE_MAX || score < best_score) {
            best = j;
            best_score = score;
        }
    }
    *out = cand[best];
    aff->matched = got[best];
    return 0;
}
