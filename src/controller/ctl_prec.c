/* ctl_prec — precision (output-quality) alarms on the controller
 * (docs/precision-detection.md).
 *
 * The coordinator reports alarm 0xFC001009 ("Precision Anomaly Alarm") for a PD group
 * (p_instance_id, d_instance_id) with POST /controller/report_alarms, category ALARM or
 * CLEAR (CLEAR with the raise's moi byte for byte). Each alarm is a record — active
 * until cleared, then kept among the recent ones — persisted in the store under
 * "precision/<seq>", so the alarm state survives a controller restart (upstream keeps
 * it in memory).
 *
 * Three clear paths:
 *   coordinator   CLEAR after precision_clear_threshold good samples (no auto-recovery);
 *   auto-recovery fault_tolerance_config.precision_auto_recovery_enabled: on an ALARM the
 *                 D instance (and P) is isolated, then terminated through its node
 *                 managers' stop; ALARM and CLEAR are recorded, and the coordinator's
 *                 POST /precision/alarm_cleared resets its group; the answer to the
 *                 report says so (precision_alarm_cleared_by_auto_recovery);
 *   manual        POST /controller/terminate_instance with precision_alarm_clear: true
 *                 (an operator system), the same recovery path.
 * GET /controller/precision/alarms[?active=true] lists them; motor status shows the
 * active ones; metrics: motor_controller_precision_alarms_{active,total{category}}.
 *
 * On the controller's reactor thread. */
#include "controller/ctl_internal.h"
#include "controller/ctl_obs.h"

#include "common/log.h"
#include "common/util.h"
#include "wire/wire_msg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREC_ALARM_ID "0xFC001009"
#define PREC_KEEP 100 /* records kept (every active one, then the newest cleared) */
#define PREC_COORD_TIMEOUT_MS 5000

struct ctl_prec_alarm {
    struct ctl_prec_alarm *next; /* newest first */
    int64_t seq;
    int64_t p_id, d_id; /* p -1: none */
    char *moi;
    json_t *alarm; /* the ALARM as reported */
    bool active;
    int64_t raised_ms, cleared_ms; /* wall */
    char *cleared_by;              /* "coordinator", "auto_recovery", "manual" */
    json_t *terminated;            /* ids the recovery terminated */
};

struct ctl_prec {
    struct ctl_prec_alarm *head;
    size_t n;
    int64_t next_seq;
    struct metrics_family *total; /* {category} */
    struct metrics_gauge *active;
};

/* An answer that waits for the coordinator's /precision/alarm_cleared calls. */
struct pending {
    struct ctl *c;
    struct httpd_req *req; /* NULL once the client went away */
    json_t *data;          /* the answer's data */
    const char *message;
    int left;
    bool all_ok;
};

void ctl_prec_init(struct ctl *c)
{
    struct ctl_prec *p = xcalloc(1, sizeof(*p));
    p->next_seq = 1;
    p->total = metrics_counter_family(c->m.reg, "motor_controller_precision_alarms_total",
                                      "Precision alarms recorded, by category (ALARM, CLEAR).",
                                      "category");
    p->active = metrics_gauge_new(c->m.reg, "motor_controller_precision_alarms_active",
                                  "Active precision alarms (PD groups).");
    c->prec = p;
}

static void alarm_free(struct ctl_prec_alarm *a)
{
    if (!a)
        return;
    free(a->moi);
    free(a->cleared_by);
    json_decref(a->alarm);
    json_decref(a->terminated);
    free(a);
}

void ctl_prec_free(struct ctl *c)
{
    struct ctl_prec *p = c->prec;
    if (!p)
        return;
    while (p->head) {
        struct ctl_prec_alarm *a = p->head;
        p->head = a->next;
        alarm_free(a);
    }
    free(p);
    c->prec = NULL;
}

static json_t *alarm_json(const struct ctl_prec_alarm *a)
{
    json_t *j = json_pack("{s:I, s:I, s:s, s:b, s:I, s:O}", "seq", (json_int_t)a->seq,
                          "d_instance_id", (json_int_t)a->d_id, "moi", a->moi, "active", a->active,
                          "raised_at_ms", (json_int_t)a->raised_ms, "alarm", a->alarm);
    json_object_set_new(j, "p_instance_id", a->p_id >= 0 ? json_integer(a->p_id) : json_null());
    if (!a->active) {
        json_object_set_new(j, "cleared_at_ms", json_integer(a->cleared_ms));
        json_object_set_new(j, "cleared_by", json_string(a->cleared_by ? a->cleared_by : ""));
    }
    if (a->terminated)
        json_object_set(j, "terminated", a->terminated);
    return j;
}

static bool can_write(struct ctl *c)
{
    return c->store && c->leader && c->loaded;
}

static void save(struct ctl *c, const struct ctl_prec_alarm *a)
{
    if (!can_write(c))
        return;
    json_t *j = alarm_json(a);
    char *text = json_dumps(j, JSON_COMPACT);
    char key[48];
    snprintf(key, sizeof(key), "precision/%lld", (long long)a->seq);
    store_put(c->store, key, text);
    free(text);
    json_decref(j);
}

static void count_active(struct ctl *c)
{
    int n = 0;
    for (struct ctl_prec_alarm *a = c->prec->head; a; a = a->next)
        n += a->active;
    metrics_gauge_set(c->prec->active, n);
}

/* Beyond PREC_KEEP records the oldest cleared ones go (from the store too). */
static void trim(struct ctl *c)
{
    struct ctl_prec *p = c->prec;
    while (p->n > PREC_KEEP) {
        struct ctl_prec_alarm **victim = NULL;
        for (struct ctl_prec_alarm **pp = &p->head; *pp; pp = &(*pp)->next)
            if (!(*pp)->active)
                victim = pp;
        if (!victim)
            return;
        struct ctl_prec_alarm *a = *victim;
        *victim = a->next;
        p->n--;
        if (can_write(c)) {
            char key[48];
            snprintf(key, sizeof(key), "precision/%lld", (long long)a->seq);
            store_del(c->store, key);
        }
        alarm_free(a);
    }
}

static void insert(struct ctl_prec *p, struct ctl_prec_alarm *a)
{
    /* newest (highest seq) first */
    struct ctl_prec_alarm **pp = &p->head;
    while (*pp && (*pp)->seq > a->seq)
        pp = &(*pp)->next;
    a->next = *pp;
    *pp = a;
    p->n++;
    if (a->seq >= p->next_seq)
        p->next_seq = a->seq + 1;
}

int ctl_prec_load(struct ctl *c, const char *key, json_t *j)
{
    int64_t seq;
    json_t *d = json_object_get(j, "d_instance_id"), *pv = json_object_get(j, "p_instance_id");
    const char *moi = json_string_value(json_object_get(j, "moi"));
    if (util_parse_i64(key + strlen("precision/"), 1, INT64_MAX / 2, &seq) < 0 ||
        !json_is_integer(d) || !moi || !json_is_boolean(json_object_get(j, "active")) ||
        (pv && !json_is_null(pv) && !json_is_integer(pv)))
        return -EINVAL;
    struct ctl_prec_alarm *a = xcalloc(1, sizeof(*a));
    a->seq = seq;
    a->d_id = json_integer_value(d);
    a->p_id = json_is_integer(pv) ? json_integer_value(pv) : -1;
    a->moi = xstrdup(moi);
    json_t *al = json_object_get(j, "alarm");
    a->alarm = json_is_object(al) ? json_incref(al) : json_object();
    a->active = json_is_true(json_object_get(j, "active"));
    a->raised_ms = json_integer_value(json_object_get(j, "raised_at_ms"));
    a->cleared_ms = json_integer_value(json_object_get(j, "cleared_at_ms"));
    const char *by = json_string_value(json_object_get(j, "cleared_by"));
    a->cleared_by = by ? xstrdup(by) : NULL;
    json_t *t = json_object_get(j, "terminated");
    a->terminated = json_is_array(t) ? json_incref(t) : NULL;
    insert(c->prec, a);
    count_active(c);
    return 0;
}

static struct ctl_prec_alarm *find_active(struct ctl *c, int64_t p_id, int64_t d_id)
{
    for (struct ctl_prec_alarm *a = c->prec->head; a; a = a->next)
        if (a->active && a->p_id == p_id && a->d_id == d_id)
            return a;
    return NULL;
}

static void clear(struct ctl *c, struct ctl_prec_alarm *a, const char *by)
{
    a->active = false;
    a->cleared_ms = util_wall_ms();
    free(a->cleared_by);
    a->cleared_by = xstrdup(by);
    metrics_counter_inc(metrics_counter_labels(c->prec->total, "category", "CLEAR"));
    log_warn("precision_alarm_cleared", LF_INT("p_instance_id", a->p_id),
             LF_INT("d_instance_id", a->d_id), LF_STR("moi", a->moi), LF_STR("cleared_by", by));
    ctl_obs_clear(c, "precision_anomaly", a->d_id, NULL, by);
    save(c, a);
    count_active(c);
    trim(c);
}

/* ---- the coordinator's scheduler state ---------------------------------------------- */

static void pending_answer(struct pending *pd)
{
    if (pd->req) {
        httpd_req_on_close(pd->req, NULL, NULL);
        json_object_set_new(pd->data, "scheduler_state_cleared", json_boolean(pd->all_ok));
        httpd_respond_json(pd->req, 200, wire_envelope_new(200, pd->message, pd->data));
        pd->data = NULL;
    }
    json_decref(pd->data);
    free(pd);
}

static void pending_closed(struct httpd_req *req, void *arg)
{
    (void)req;
    struct pending *pd = arg;
    pd->req = NULL;
}

static void notify_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    (void)tag;
    struct pending *pd = arg;
    bool ok = ctl_http_ok(resp);
    if (!ok) {
        pd->all_ok = false;
        log_warn("precision_scheduler_clear_failed", LF_STR("error", ctl_http_err(resp)));
    }
    if (--pd->left == 0)
        pending_answer(pd);
    (void)c;
}

static void notify_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct pending *pd = arg;
    pd->all_ok = false;
    if (--pd->left == 0)
        pending_answer(pd);
}

/* POST /precision/alarm_cleared {p_instance_id, d_instance_id} to the coordinator. */
static void notify(struct ctl *c, struct pending *pd, int64_t p_id, int64_t d_id)
{
    char port[16];
    snprintf(port, sizeof(port), "%d", c->cfg.coordinator_port);
    char *url = ctl_nm_url(c, c->cfg.coordinator_host, port, "/precision/alarm_cleared");
    json_t *body = json_pack("{s:I}", "d_instance_id", (json_int_t)d_id);
    json_object_set_new(body, "p_instance_id", p_id >= 0 ? json_integer(p_id) : json_null());
    pd->left++;
    ctl_request(c, "POST", url, body, PREC_COORD_TIMEOUT_MS, notify_done, pd, 0, notify_drop);
    json_decref(body);
    free(url);
}

static struct pending *pending_new(struct ctl *c, struct httpd_req *req, const char *message,
                                   json_t *data)
{
    struct pending *pd = xcalloc(1, sizeof(*pd));
    pd->c = c;
    pd->req = req;
    pd->data = data;
    pd->message = message;
    pd->all_ok = true;
    pd->left = 1; /* released by pending_go once every call is out */
    httpd_req_on_close(req, pending_closed, pd);
    return pd;
}

static void pending_go(struct pending *pd)
{
    if (--pd->left == 0)
        pending_answer(pd);
}

/* ---- recovery ----------------------------------------------------------------------- */

/* Isolate, then terminate, the group's instances that exist; the ids terminated. */
static json_t *terminate_group(struct ctl *c, int64_t p_id, int64_t d_id, const char *why)
{
    json_t *done = json_array();
    int64_t ids[2] = {d_id, p_id};
    for (int k = 0; k < 2; k++) {
        struct ctl_inst *in = ids[k] >= 0 ? ctl_find(c, ids[k]) : NULL;
        if (!in)
            continue;
        if (in->status == WIRE_INS_ACTIVE)
            ctl_set_status(c, in, WIRE_INS_INACTIVE, "precision alarm: isolated");
        log_warn("instance_terminated", LF_INT("instance_id", ids[k]), LF_STR("reason", why));
        json_array_append_new(done, json_integer(ids[k]));
        ctl_terminate_instance(c, in, why);
    }
    return done;
}

/* ---- POST /controller/report_alarms ------------------------------------------------- */

struct report {
    json_t *a; /* borrowed */
    bool precision, clear;
    int64_t p_id, d_id;
    const char *moi;
};

static bool read_id(json_t *v, bool optional, int64_t *out)
{
    if (optional && (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))) {
        *out = -1;
        return true;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = json_integer_value(v);
        return true;
    }
    return json_is_string(v) && util_parse_i64(json_string_value(v), 0, WIRE_ID_MAX, out) == 0;
}

static const char *parse_report(json_t *a, struct report *r, char *err, size_t cap, size_t i)
{
    memset(r, 0, sizeof(*r));
    r->a = a;
    const char *id = json_string_value(json_object_get(a, "alarm_id"));
    const char *cat = json_string_value(json_object_get(a, "category"));
    if (!json_is_object(a))
        snprintf(err, cap, "alarms[%zu]: must be an object", i);
    else if (!id || !*id)
        snprintf(err, cap, "alarms[%zu].alarm_id: must be a non-empty string", i);
    else if (!cat || (strcmp(cat, "ALARM") && strcmp(cat, "CLEAR")))
        snprintf(err, cap, "alarms[%zu].category: must be \"ALARM\" or \"CLEAR\"", i);
    else
        err[0] = '\0';
    if (err[0])
        return err;
    r->clear = strcmp(cat, "CLEAR") == 0;
    if (strcasecmp(id, PREC_ALARM_ID) != 0)
        return NULL;
    r->precision = true;
    r->moi = json_string_value(json_object_get(a, "moi"));
    if (!read_id(json_object_get(a, "instance_id"), false, &r->d_id))
        snprintf(err, cap, "alarms[%zu].instance_id: must be a non-negative integer", i);
    else if (!read_id(json_object_get(a, "p_instance_id"), true, &r->p_id))
        snprintf(err, cap, "alarms[%zu].p_instance_id: must be an integer or empty", i);
    else if (!r->moi || !*r->moi)
        snprintf(err, cap, "alarms[%zu].moi: must be a non-empty string", i);
    return err[0] ? err : NULL;
}

static void h_report(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    char jm[WIRE_ERR_MAX] = "";
    json_t *j = httpd_req_json(req, jm, sizeof(jm));
    /* a list, {"alarms": [...]}, or one alarm object (list NULL) */
    json_t *list = json_is_array(j) ? j : json_object_get(j, "alarms");
    if (!json_is_array(list))
        list = NULL;
    char err[256] = "";
    size_t n = list ? json_array_size(list) : json_is_object(j) ? 1 : 0;
    struct report *rs = n ? xcalloc(n, sizeof(*rs)) : NULL;
    int status = 400;
    if (!j) {
        snprintf(err, sizeof(err), "%s", jm);
    } else if (!list && !json_is_object(j)) {
        snprintf(err, sizeof(err),
                 "body must be an alarm object, a list of them or {\"alarms\": [...]}");
    } else if (n == 0) {
        snprintf(err, sizeof(err), "no alarm in the body");
    } else {
        for (size_t i = 0; i < n && !err[0]; i++)
            parse_report(list ? json_array_get(list, i) : j, &rs[i], err, sizeof(err), i);
    }
    /* Conflicts before anything changes: a CLEAR must match its raise. */
    for (size_t i = 0; i < n && !err[0]; i++) {
        struct report *r = &rs[i];
        if (!r->precision)
            continue;
        struct ctl_prec_alarm *a = find_active(c, r->p_id, r->d_id);
        if (r->clear && !a) {
            status = 404;
            snprintf(err, sizeof(err), "no active precision alarm for PD group (%lld, %lld)",
                     (long long)r->p_id, (long long)r->d_id);
        } else if (a && strcmp(a->moi, r->moi) != 0) {
            status = 409;
            snprintf(err, sizeof(err),
                     "the active precision alarm of PD group (%lld, %lld) has moi \"%.100s\"",
                     (long long)r->p_id, (long long)r->d_id, a->moi);
        }
    }
    if (err[0]) {
        log_warn("report_alarms_refused", LF_INT("status", status), LF_STR("error", err));
        httpd_respond_json(req, status, wire_envelope_error_new(status, err, NULL));
        free(rs);
        json_decref(j);
        return;
    }
    bool cleared = false, by_recovery = false;
    json_t *terminated = json_array();
    struct pending *pd = NULL;
    json_t *data = json_object();
    for (size_t i = 0; i < n; i++) {
        struct report *r = &rs[i];
        const char *cat = r->clear ? "CLEAR" : "ALARM";
        if (!r->precision) {
            log_info("alarm_reported",
                     LF_STR("alarm_id", json_string_value(json_object_get(r->a, "alarm_id"))),
                     LF_STR("category", cat));
            continue;
        }
        struct ctl_prec_alarm *a = find_active(c, r->p_id, r->d_id);
        if (r->clear) {
            clear(c, a, "coordinator");
            cleared = true;
            continue;
        }
        if (a) /* a repeated raise (the coordinator retried): already active */
            continue;
        a = xcalloc(1, sizeof(*a));
        a->seq = c->prec->next_seq;
        a->p_id = r->p_id;
        a->d_id = r->d_id;
        a->moi = xstrdup(r->moi);
        a->alarm = json_deep_copy(r->a);
        a->active = true;
        a->raised_ms = util_wall_ms();
        insert(c->prec, a);
        metrics_counter_inc(metrics_counter_labels(c->prec->total, "category", "ALARM"));
        log_warn("precision_alarm_raised", LF_INT("p_instance_id", a->p_id),
                 LF_INT("d_instance_id", a->d_id), LF_STR("moi", a->moi),
                 LF_STR("additional_information",
                        json_string_value(json_object_get(r->a, "additional_information"))));
        struct ctl_inst *din = ctl_find(c, a->d_id);
        ctl_obs_raise(c, "precision_anomaly", "major", a->d_id, din ? din->job_name : NULL, a->moi);
        save(c, a);
        count_active(c);
        if (!c->cfg.prec_auto_recovery)
            continue;
        /* auto-recovery: the group goes, the alarm with it */
        a->terminated = terminate_group(c, a->p_id, a->d_id, "precision alarm: auto-recovery");
        json_array_extend(terminated, a->terminated);
        clear(c, a, "auto_recovery");
        cleared = by_recovery = true;
        if (!pd)
            pd = pending_new(c, req, "Alarms reported", data);
        notify(c, pd, a->p_id, a->d_id);
    }
    json_object_set_new(data, "accepted", json_integer((json_int_t)n));
    json_object_set_new(data, "precision_alarm_cleared", json_boolean(cleared));
    json_object_set_new(data, "precision_alarm_cleared_by_auto_recovery",
                        json_boolean(by_recovery));
    json_object_set_new(data, "terminated", terminated);
    free(rs);
    json_decref(j);
    if (pd) {
        pending_go(pd); /* answered once the coordinator heard it */
        return;
    }
    json_object_set_new(data, "scheduler_state_cleared", json_false());
    httpd_respond_json(req, 200, wire_envelope_new(200, "Alarms reported", data));
}

/* ---- terminate_instance with precision_alarm_clear ---------------------------------- */

void ctl_prec_terminate_clear(struct ctl *c, struct httpd_req *req, int64_t d_id, int64_t p_id,
                              json_t *data)
{
    struct ctl_prec_alarm *a = find_active(c, p_id, d_id);
    json_object_set_new(data, "precision_alarm_cleared", json_boolean(a != NULL));
    json_object_set_new(data, "moi", a ? json_string(a->moi) : json_null());
    if (a) {
        json_t *t = json_object_get(data, "terminated");
        a->terminated = json_is_array(t) ? json_incref(t) : NULL;
        clear(c, a, "manual");
    }
    struct pending *pd = pending_new(c, req, "Instance terminated", data);
    notify(c, pd, p_id, d_id);
    pending_go(pd);
}

/* ---- GET /controller/precision/alarms ------------------------------------------------ */

json_t *ctl_prec_active_json(struct ctl *c)
{
    json_t *arr = json_array();
    for (struct ctl_prec_alarm *a = c->prec ? c->prec->head : NULL; a; a = a->next)
        if (a->active)
            json_array_append_new(arr, alarm_json(a));
    return arr;
}

static void h_alarms(struct httpd_req *req, void *arg)
{
    struct ctl *c = arg;
    if (!ctl_api_serving(c, req))
        return;
    const char *q = httpd_req_query(req, "active");
    if (q && strcmp(q, "true") && strcmp(q, "false")) {
        httpd_respond_error(req, 400, "active must be true or false");
        return;
    }
    json_t *recent = json_array();
    if (!q || strcmp(q, "true"))
        for (struct ctl_prec_alarm *a = c->prec->head; a; a = a->next)
            if (!a->active)
                json_array_append_new(recent, alarm_json(a));
    httpd_respond_json(req, 200,
                       json_pack("{s:o, s:o, s:b}", "active", ctl_prec_active_json(c), "recent",
                                 recent, "auto_recovery", c->cfg.prec_auto_recovery));
}

void ctl_prec_register_routes(struct ctl *c)
{
    httpd_route(c->httpd, "POST", "/controller/report_alarms", h_report, c, 0);
    httpd_route(c->httpd, "GET", "/controller/precision/alarms", h_alarms, c, 0);
}
