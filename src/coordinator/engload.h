/* engload — the load an engine reports on its /metrics (Prometheus text), as the
 * balancer reads it: requests running, requests waiting, KV-cache usage.
 *
 * Names: vLLM's `vllm:num_requests_running`, `vllm:num_requests_waiting`,
 * `vllm:kv_cache_usage_perc` (older: `vllm:gpu_cache_usage_perc`); SGLang's
 * `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`. A metric
 * with several label sets (one per model or DP engine) is summed (requests) or its
 * largest value taken (usage). Comment lines, other metrics and malformed lines are
 * skipped; the scan is bounded by the body the caller capped.
 *
 * Pure; any thread. */
#ifndef MOTOR_ENGLOAD_H
#define MOTOR_ENGLOAD_H

#include <stdbool.h>
#include <stddef.h>

struct engload {
    double running, waiting; /* requests */
    double kv_usage;         /* 0..1 */
    bool have_running, have_waiting, have_usage;
};

/* Parse text[0..len). Returns true when any of the three was found. */
bool engload_parse(const char *text, size_t len, struct engload *out);

#endif
