/* ctl_obs — alarms and the observability listener (upstream's port 1027).
 *
 * Alarms are what an operator's monitoring should page on, kept in a bounded in-memory
 * list (the newest CTL_OBS_MAX_ALARMS; not persisted — they describe this process's
 * view). Two sources:
 *   - the controller itself: "instance_unavailable" when an instance that was serving
 *     leaves active (heartbeat loss, fault, pause, deletion), cleared automatically when
 *     it or another instance of its job is active again;
 *   - anyone else: POST /observability/add_alarm on the API port, any JSON object.
 * With observability_config.observability_enable, a second listener on
 * api_config.observability_api_port serves GET /observability/alarms[?active=true],
 * /observability/inventory (the instance table) and /observability/metrics (Prometheus,
 * as /metrics). The alarm list is also on the API port at GET /observability/alarms.
 *
 * Threading: the controller's reactor thread. */
#ifndef MOTOR_CTL_OBS_H
#define MOTOR_CTL_OBS_H

#include <stdint.h>

struct ctl;
struct httpd_req;

#define CTL_OBS_MAX_ALARMS 1000
#define CTL_OBS_MAX_BODY (64u * 1024u) /* an external alarm */

/* Routes on the API port (add_alarm, alarms). */
void ctl_obs_register_routes(struct ctl *c);
/* Start the observability listener when enabled. 0, or -errno (logged). */
int ctl_obs_listen(struct ctl *c);
/* Certificate reload of the observability listener (when it runs with TLS). */
struct httpd_config;
void ctl_obs_reload_tls(struct ctl *c, const struct httpd_config *tls);
/* Stop the listener and drop every alarm. NULL-safe members. */
void ctl_obs_free(struct ctl *c);

/* Raise a controller alarm about an instance (instance_id < 0: none). A second raise of
 * the same type for the same instance while one is active is ignored. */
void ctl_obs_raise(struct ctl *c, const char *type, const char *severity, int64_t instance_id,
                   const char *job_name, const char *message);
/* Clear the active alarms of that type for that instance, or (job_name non-NULL) for any
 * instance of that job — a replacement instance serving the job again. */
void ctl_obs_clear(struct ctl *c, const char *type, int64_t instance_id, const char *job_name,
                   const char *why);

/* Shared with ctl_api.c: the instance table and metrics answers. */
void ctl_api_instances(struct httpd_req *req, void *arg);
void ctl_api_metrics(struct httpd_req *req, void *arg);

#endif
