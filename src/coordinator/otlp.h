/* otlp — the coordinator's spans, exported as OTLP/HTTP JSON to a collector.
 *
 * Off unless OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (or OTEL_EXPORTER_OTLP_ENDPOINT, to which
 * "/v1/traces" is appended) names an http:// collector — the OpenTelemetry SDKs' own
 * variables, read once at start. Off costs a request one NULL test: no trace state is
 * allocated. Sampling: OTEL_TRACES_SAMPLER_ARG, a ratio in [0, 1] (default 1), applied
 * to requests without a sampled parent; a client's traceparent with the sampled flag is
 * always followed, one without it never (parent-based, as the SDKs' default).
 * OTEL_SERVICE_NAME names the service (default motor-coordinator).
 *
 * One trace state per sampled request (otlp_req): the request span (SERVER), the
 * routing span (arrival until an endpoint was picked) and one CLIENT span per upstream
 * leg (prefill, decode, union; retries and continuations are legs too), children of the
 * request span; the request span's parent is the client's span. At the request's end
 * the spans go out in one POST from the worker's own HTTP client (not waited for, not
 * retried: a collector down loses spans, never requests).
 *
 * Threading: otlp_req belongs to the worker thread of its request. */
#ifndef MOTOR_COORD_OTLP_H
#define MOTOR_COORD_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct httpc;

struct otlp_cfg {
    char *url;     /* NULL: tracing off */
    double ratio;  /* sampling of requests without a sampled parent */
    char *service; /* service.name */
};

/* Read the environment (see above). Returns 0, or -1 with why set for an invalid value
 * (the caller reports it and runs without tracing). */
int otlp_cfg_from_env(struct otlp_cfg *cfg, const char **why);
void otlp_cfg_release(struct otlp_cfg *cfg);

#define OTLP_MAX_SPANS 24

struct otlp_span {
    const char *name;
    uint8_t id[8];
    int64_t start_us, end_us; /* CLOCK_MONOTONIC; end 0: still open */
    int kind;                 /* 2 server, 3 client, 1 internal */
    int64_t instance_id;
    char endpoint[64];
    char role[12];
    int status; /* HTTP status of a leg, 0 unknown */
    bool error;
};

struct otlp_req {
    uint8_t trace_id[16];
    uint8_t parent[8]; /* the client's span, all zero: none */
    bool has_parent;
    int64_t wall_us_at_mono0; /* wall clock minus monotonic at creation, for the times */
    struct otlp_span spans[OTLP_MAX_SPANS];
    int n;
};

/* A sampled request's trace state, or NULL (off, or not sampled). traceparent: the
 * client's valid header or NULL. rng: the worker's generator state. */
struct otlp_req *otlp_begin(const struct otlp_cfg *cfg, const char *traceparent, uint64_t *rng,
                            int64_t start_us);
/* Open a span (child of the request span, span 0); its index, or -1 when full. */
int otlp_span_open(struct otlp_req *t, const char *name, int kind, int64_t start_us, uint64_t *rng);
void otlp_span_close(struct otlp_req *t, int idx, int64_t end_us, int status, bool error);
/* "00-<trace>-<span idx>-01" into buf (56 bytes): the traceparent a leg carries. */
void otlp_traceparent(const struct otlp_req *t, int idx, char *buf);
/* Close what is open at end_us, POST the spans (request attributes: api, model, status,
 * request id, retries, reschedules) and free t. */
void otlp_finish(struct otlp_req *t, const struct otlp_cfg *cfg, struct httpc *http, int64_t end_us,
                 int status, const char *rid, const char *api, const char *model, int retries,
                 int reschedules);

#endif
