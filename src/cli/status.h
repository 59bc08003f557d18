/* status — one view of a Motor fleet from the controller and the coordinator.
 *
 * `motor status` and the live view of `motor up` share it: an asynchronous fetch of the
 * documents that describe a fleet (controller: GET /controller/instances,
 * /controller/fault_tolerance/status and /controller/precision/alarms;
 * coordinator management port: GET /instances and /metrics), a pure function that turns them into
 * one normalized model (a JSON object, which is also what `motor status --json` prints), a health
 * verdict, and a text renderer.
 *
 * The model:
 *   {"controller":  {"url", "reachable", "error"},
 *    "coordinator": {"url", "reachable", "error", "requests_total", "inflight_requests"},
 *    "instances":   [{id, role, job_name, model_name, status, ft_phase,
 *                     endpoints: [{id, address, status, hb_age_s, headless}]}],
 *    "pools":       [{id, role, job_name, model_name, status, pool, healthy,
 *                     breaker, trip_count, endpoints: [{id, address, status,
 *                     inflight_requests}]}],
 *    "alarms":      [{alarm_id, alarm_name, d_instance_id, p_instance_id, moi,
 *                     raised_at_ms}]  (active precision alarms; each is a problem too),
 *    "recent_alarms": [{alarm_id, d_instance_id, moi, cleared_by, cleared_at_ms}]
 *                    (the last cleared ones, newest first; not problems),
 *    "problems":    ["instance 2 (decode) is inactive", ...],
 *    "healthy":     bool}
 * A side that was not asked (URL NULL) is {"url": null, "reachable": false} and causes
 * no problem; hb_age_s is null when the controller gave no heartbeat time.
 *
 * Threading: the fetch runs on the reactor of the httpc it is given; the rest is pure. */
#ifndef MOTOR_STATUS_H
#define MOTOR_STATUS_H

#include "common/httpc.h"
#include "common/strbuf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct status_targets {
    const char *controller;  /* base URL ("http://127.0.0.1:2026"); NULL = not asked */
    const char *coordinator; /* management base URL; NULL = not asked */
    const char *mgmt_key;    /* X-Motor-Management-Key for the coordinator; may be NULL */
    /* https:// targets: CA and client certificate (mgmt_tls_config's files); NULL = the
     * system's trusted CAs, no client certificate. Used while the requests start. */
    const struct httpc_tls *tls;
};

/* The raw answers (owned by the fetch; valid during the callback). A failed request has
 * its document NULL and its error set ("connection refused", "HTTP 500: ..."). */
struct status_docs {
    json_t *ctl_instances;
    char *ctl_error;
    json_t *ctl_ft;   /* NULL when unavailable (not an error: older controllers) */
    json_t *ctl_prec; /* active precision alarms; NULL when unavailable (likewise) */
    json_t *coord_instances;
    char *coord_error;
    char *coord_metrics; /* Prometheus text; NULL when unavailable */
};
void status_docs_release(struct status_docs *d);

struct status_fetch;
typedef void (*status_done_cb)(const struct status_docs *docs, void *arg);

/* Start the requests (each with timeout_ms). done is called exactly once, from the
 * reactor, unless the fetch is cancelled first. The targets' strings are copied. */
struct status_fetch *status_fetch_start(struct httpc *hc, const struct status_targets *t,
                                        int64_t timeout_ms, status_done_cb done, void *arg);
/* Abort a fetch in flight (no callback). NULL-safe. Not from inside its own callback. */
void status_fetch_cancel(struct status_fetch *f);

/* The normalized model (new reference) from the documents. now_wall_s: wall clock in
 * seconds, for heartbeat ages. */
json_t *status_model(const struct status_targets *t, const struct status_docs *d,
                     double now_wall_s);
bool status_model_healthy(const json_t *model);

/* The model as tables (instances, endpoints, coordinator pools, problems). */
void status_render(struct strbuf *out, const json_t *model);

/* A text table: cells are added left to right, row after row (a row ends after ncols
 * cells); render aligns the columns, two spaces apart, each line prefixed by indent. */
struct status_table {
    size_t ncols;
    char **cells;
    size_t n, cap;
};
void status_table_init(struct status_table *t, size_t ncols);
void status_table_cell(struct status_table *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void status_table_render(const struct status_table *t, struct strbuf *out, const char *indent);
void status_table_release(struct status_table *t);

/* Sum of every sample of metric `name` (all label sets) in Prometheus text; -1 when the
 * metric does not appear. */
double status_metric_sum(const char *text, const char *name);

/* `motor status [--controller URL] [--coordinator URL] [--json] ...`: 0 healthy,
 * 1 unhealthy or unreachable, 2 usage. */
int status_main(int argc, char **argv);

#endif
