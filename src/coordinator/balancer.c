#include "coordinator/balancer.h"

#include <errno.h>

static double inst_avg_tokens(const struct instance *in)
{
    long long sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < in->n_eps; i++) {
        if (!inst_ep_routable(&in->eps[i]) || !in->eps[i].load)
            continue;
        sum += atomic_load_explicit(&in->eps[i].load->tokens, memory_order_relaxed);
        n++;
    }
    return n ? (double)sum / (double)n : 0.0;
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
            if (pol == BAL_LEAST_TOKENS) {
                if (avg < 0)
                    avg = inst_avg_tokens(in);
                long long t =
                    ep->load ? atomic_load_explicit(&ep->load->tokens, memory_order_relaxed) : 0;
                score = (double)t + inst_weight * avg;
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
