/* ctl_obs — see ctl_obs.h. Alarms are a doubly bounded list: at most CTL_OBS_MAX_ALARMS
 * entries, the oldest dropped first, so a flapping instance or a chatty external sender
 * cannot grow the controller's memory. */
#include "controller/ctl_obs.h"

#include "common/httpd.h"
#include "common/log.h"
#include "common/util.h"
#include "controller/ctl_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct ctl_alarm {
    struct ctl_alarm *next;
    int64_t id;
    json_t *view; /* the JSON answered by /observability/alarms (owned) */
    char *type;
    int64_t instance_id;
    char *job_name; /* NULL for external alarms */
    bool active;
};

struct ctl_obs {
    struct ctl_alarm *head, *tail; /* oldest first */
    size_t n;
    int64_t next_id;
    uint64_t dropped;
    struct httpd *httpd;
};

static struct ctl_obs *obs(struct ctl *c)
{
    if (!c->obs) {
        c->obs = xcalloc(1, sizeof(*c->obs));
        c->obs->next_id = 1;
    }
    return c->obs;
}

static void alarm_free(struct ctl_alarm *a)
{
    json_decref(a->view);
    free(a->type);
    free(a->job_name);
    free(a);
}

static json_t *now_iso(void)
{
    char ts[40];
    util_wall_iso8601(util_wall_ms(), ts, sizeof(ts));
    return json_string(ts);
}

static struct ctl_alarm *push(struct ctl *c, const char *type, int64_t instance_id,
                              const char *job_name, json_t *view)
{
    struct ctl_obs *o = obs(c);
    if (o->n >= CTL_OBS_MAX_ALARMS) {
        struct ctl_alarm *old = o->head;
        o->head = old->next;
        if (!o->head)
            o->tail = NULL;
        alarm_free(old);
        o->n--;
        o->dropped++;
    }
    struct ctl_alarm *a = xcalloc(1, sizeof(*a));
    a->id = o->next_id++;
    a->type = xstrdup(type);
    a->instance_id = instance_id;
    a->job_name = xstrdup(job_name);
    a->active = true;
    a->view = view;
    json_object_set_new(view, "id", json_integer(a->id));
    json_object_set_new(view, "type", json_string(type));
    json_object_set_new(view, "raised_at", now_iso());
    json_object_set_new(view, "active", json_true());
    if (o->tail)
        o->tail->next = a;
    else
        o->head = a;
    o->tail = a;
    o->n++;
    return a;
}

static struct ctl_alarm *find_active(struct ctl *c, const char *type, int64_t instance_id)
{
    if (!c->obs)
        return NULL;
    for (struct ctl_alarm *a = c->obs->head; a; a = a->next)
        if (a->active && a->instance_id == instance_id && strcmp(a->type, type) == 0)
            return a;
    return NULL;
}

void ctl_obs_raise(struct ctl *c, const char *type, const char *severity, int64_t instance_id,
                   const char *job_name, const char *message)
{
    if (instance_id >= 0 && find_active(c, type, instance_id))
        return;
    json_t *v = json_pack("{s:s, s:s, s:s}", "source", "controller", "severity", severity,
                          "message", message ? message : "");
    if (instance_id >= 0)
        json_object_set_new(v, "instance_id", json_integer(instance_id));
    if (job_name)
        json_object_set_new(v, "job_name", json_string(job_name));
    struct ctl_alarm *a = push(c, type, instance_id, job_name, v);
    log_warn("alarm_raised", LF_INT("alarm_id", a->id), LF_STR("type", type),
             LF_STR("severity", severity), LF_INT("instance_id", instance_id),
             LF_STR("message", message));
}

static void clear_one(struct ctl_alarm *a, const char *why)
{
    a->active = false;
    json_object_set_new(a->view, "active", json_false());
    json_object_set_new(a->view, "cleared_at", now_iso());
    json_object_set_new(a->view, "cleared_because", json_string(why));
    log_info("alarm_cleared", LF_INT("alarm_id", a->id), LF_STR("type", a->type),
             LF_INT("instance_id", a->instance_id), LF_STR("why", why));
}

void ctl_obs_clear(struct ctl *c, const char *type, int64_t instance_id, const char *job_name,
                   const char *why)
{
    if (!c->obs)
        return;
    for (struct ctl_alarm *a = c->obs->head; a; a = a->next) {
        if (!a->active || strcmp(a->type, type) != 0)
            continue;
        if (a->instance_id == instance_id ||
            (job_name && a->job_name && strcmp(a->job_name, job_name) == 0))
            clear_one(a, why);
    }
}

/* ---- routes ------------------------------------------------------------------------- */

static void h_add_alarm(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    char err[160];
    json_t *body = httpd_req_json(req, err, sizeof(err));
    if (!body) {
        httpd_respond_error(req, 400, err);
        return;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        httpd_respond_error(req, 422, "an alarm must be a JSON object");
        return;
    }
    json_t *jt = json_object_get(body, "type");
    if (jt && !json_is_string(jt)) {
        json_decref(body);
        httpd_respond_error(req, 422, "'type' must be a string");
        return;
    }
    const char *type = jt ? json_string_value(jt) : "external";
    /* The sender's fields are kept as they are under "detail"; ours stay authoritative. */
    json_t *v = json_pack("{s:s, s:o}", "source", "external", "detail", body);
    json_t *sev = json_object_get(body, "severity");
    json_object_set_new(v, "severity", json_string(json_is_string(sev) ? json_string_value(sev)
                                                                       : "warning"));
    struct ctl_alarm *a = push(c, type, -1, NULL, v); /* type lives in body, now in v */
    log_warn("alarm_raised", LF_INT("alarm_id", a->id), LF_STR("type", type),
             LF_STR("source", "external"), LF_STR("peer", httpd_req_peer(req)));
    httpd_respond_json(req, 200, json_pack("{s:s, s:I}", "message", "alarm added", "id",
                                           (json_int_t)a->id));
}

static void h_alarms(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    const char *q = httpd_req_query(req, "active");
    bool only_active = q && (strcmp(q, "true") == 0 || strcmp(q, "1") == 0);
    json_t *arr = json_array();
    size_t active = 0;
    if (c->obs) {
        for (struct ctl_alarm *a = c->obs->head; a; a = a->next) {
            active += a->active;
            if (!only_active || a->active)
                json_array_append(arr, a->view);
        }
    }
    httpd_respond_json(req, 200,
                       json_pack("{s:I, s:I, s:I, s:o}", "count", (json_int_t)json_array_size(arr),
                                 "active", (json_int_t)active, "dropped",
                                 (json_int_t)(c->obs ? c->obs->dropped : 0), "alarms", arr));
}

void ctl_obs_register_routes(struct ctl *c)
{
    httpd_route(c->httpd, "POST", "/observability/add_alarm", h_add_alarm, c, 0);
    httpd_route(c->httpd, "GET", "/observability/alarms", h_alarms, c, 0);
}

int ctl_obs_listen(struct ctl *c)
{
    if (!c->cfg.obs_enable)
        return 0;
    static const char *const quiet[] = {"/observability/metrics", NULL};
    struct httpd_config hc = {
        .name = "controller-observability",
        .host = c->cfg.host,
        .port = (uint16_t)c->cfg.obs_port,
        .max_body = 4096,
        .quiet_paths = quiet,
    };
    if (c->use_tls) {
        hc.tls_cert_file = c->cfg.tls.cert_file;
        hc.tls_key_file = c->cfg.tls.key_file;
        hc.tls_ca_file = c->cfg.tls.ca_file;
        hc.tls_key_password = c->cfg.tls.key_password;
    }
    struct httpd *h = httpd_new(c->r, &hc);
    if (!h) {
        int err = errno ? errno : EIO;
        log_error("observability_listen_failed", LF_STR("host", c->cfg.host),
                  LF_INT("port", c->cfg.obs_port), LF_STR("error", strerror(err)));
        return -err;
    }
    obs(c)->httpd = h;
    httpd_route(h, "GET", "/observability/alarms", h_alarms, c, 0);
    httpd_route(h, "GET", "/observability/inventory", ctl_api_instances, c, 0);
    httpd_route(h, "GET", "/observability/metrics", ctl_api_metrics, c, 0);
    log_info("observability_listening", LF_STR("host", c->cfg.host),
             LF_INT("port", httpd_port(h)));
    return 0;
}

void ctl_obs_reload_tls(struct ctl *c, const struct httpd_config *tls)
{
    if (c->obs && c->obs->httpd && httpd_is_tls(c->obs->httpd))
        (void)httpd_tls_reload(c->obs->httpd, tls);
}

void ctl_obs_free(struct ctl *c)
{
    if (!c->obs)
        return;
    httpd_free(c->obs->httpd);
    struct ctl_alarm *a = c->obs->head;
    while (a) {
        struct ctl_alarm *next = a->next;
        alarm_free(a);
        a = next;
    }
    free(c->obs);
    c->obs = NULL;
}
