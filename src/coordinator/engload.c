/* engload — reading an engine's /metrics (see engload.h). */
#include "coordinator/engload.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum which { W_NONE, W_RUNNING, W_WAITING, W_USAGE };

static const struct {
    const char *name;
    enum which w;
} names[] = {
    {"vllm:num_requests_running", W_RUNNING}, {"vllm:num_requests_waiting", W_WAITING},
    {"vllm:kv_cache_usage_perc", W_USAGE},    {"vllm:gpu_cache_usage_perc", W_USAGE},
    {"sglang:num_running_reqs", W_RUNNING},   {"sglang:num_queue_reqs", W_WAITING},
    {"sglang:token_usage", W_USAGE},
};

static enum which which_of(const char *p, size_t n)
{
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strlen(names[i].name) == n && memcmp(names[i].name, p, n) == 0)
            return names[i].w;
    return W_NONE;
}

bool engload_parse(const char *text, size_t len, struct engload *out)
{
    memset(out, 0, sizeof(*out));
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        if (p < le && *p != '#') {
            const char *q = p;
            while (q < le && *q != '{' && *q != ' ' && *q != '\t')
                q++;
            enum which w = which_of(p, (size_t)(q - p));
            if (w != W_NONE) {
                if (q < le && *q == '{') { /* labels: up to the closing brace */
                    const char *c = memchr(q, '}', (size_t)(le - q));
                    q = c ? c + 1 : le;
                }
                while (q < le && (*q == ' ' || *q == '\t'))
                    q++;
                char num[64];
                size_t k = 0;
                while (q < le && *q != ' ' && *q != '\t' && *q != '\r' && k + 1 < sizeof(num))
                    num[k++] = *q++;
                num[k] = '\0';
                char *e;
                double v = strtod(num, &e);
                if (k && *e == '\0' && isfinite(v) && v >= 0) {
                    if (w == W_RUNNING) {
                        out->running += v;
                        out->have_running = true;
                    } else if (w == W_WAITING) {
                        out->waiting += v;
                        out->have_waiting = true;
                    } else {
                        out->kv_usage = fmax(out->kv_usage, fmin(v, 1.0));
                        out->have_usage = true;
                    }
                }
            }
        }
        p = le + 1;
    }
    return out->have_running || out->have_waiting || out->have_usage;
}
