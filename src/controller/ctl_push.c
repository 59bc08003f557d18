/* ctl_push — tells the coordinator which instances are routable (§5.10 observers):
 * POST /instances/refresh with "add" / "del" on changes, a periodic full "set", and a
 * full "set" queued after any failed incremental push (coalesced; a failed set is not
 * re-queued at once — the next successful coordinator heartbeat retries it, as does the
 * periodic sync and the recovery after two lost coordinator heartbeats).
 *
 * Restart detection (motor coordinators): their probes and refresh answers carry a
 * boot_id, random per process start. The boot id that answered our last full set is
 * remembered; a heartbeat or push answer with another one means the coordinator
 * restarted — its table is empty — and a full set goes out at once, however quickly it
 * came back (faster than two heartbeats is invisible to the lost-heartbeat rule).
 * Coordinators without a boot id (upstream) keep the rules above.
 *
 * One push is in flight at a time so that add/del reach the coordinator in order. Each
 * instance carries the coordinator's expected view (published, published_sig,
 * published_body), updated when a push is queued: later decisions build on the queue's
 * outcome, and a failure is repaired by the full set, which recomputes everything. */
#include "controller/ctl_internal.h"
#include "wire/wire_refresh.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>


struct ctl_push_entry {
    struct ctl_push_entry *next;
    enum wire_refresh_event kind;
    int64_t id;
    json_t *inst; /* add/del: the Instance object */
    ctl_push_cb cb;
    void *cb_arg;
};

static void on_push_retry(struct reactor *r, void *arg);
static void on_coord_hb(struct reactor *r, void *arg);
static void on_coord_sync(struct reactor *r, void *arg);

void ctl_push_init(struct ctl *c)
{
    reactor_timer_init(&c->push_retry, on_push_retry, c);
    reactor_timer_init(&c->coord_hb_timer, on_coord_hb, c);
    reactor_timer_init(&c->coord_sync_timer, on_coord_sync, c);
}

static bool enabled(struct ctl *c)
{
    return c->cfg.coordinator_push;
}

void ctl_push_start(struct ctl *c)
{
    if (!enabled(c))
        return;
    reactor_timer_start(c->r, &c->coord_hb_timer, c->cfg.coordinator_hb_ms,
                        c->cfg.coordinator_hb_ms);
    if (c->cfg.coordinator_sync_ms > 0)
        reactor_timer_start(c->r, &c->coord_sync_timer, c->cfg.coordinator_sync_ms,
                            c->cfg.coordinator_sync_ms);
    /* After a (re)start the coordinator's view may be anything: replace it. */
    ctl_push_full_set(c);
}

void ctl_push_reconfigure(struct ctl *c, bool target_changed)
{
    if (!c->leader || !c->loaded)
        return; /* go_live starts the push with whatever the configuration is then */
    if (!enabled(c)) {
        reactor_timer_stop(c->r, &c->coord_hb_timer);
        reactor_timer_stop(c->r, &c->coord_sync_timer);
        return;
    }
    bool was_on = reactor_timer_active(&c->coord_hb_timer);
    reactor_timer_start(c->r, &c->coord_hb_timer, c->cfg.coordinator_hb_ms,
                        c->cfg.coordinator_hb_ms);
    if (c->cfg.coordinator_sync_ms > 0)
        reactor_timer_start(c->r, &c->coord_sync_timer, c->cfg.coordinator_sync_ms,
                            c->cfg.coordinator_sync_ms);
    else
        reactor_timer_stop(c->r, &c->coord_sync_timer);
    if (!was_on || target_changed) {
        /* Another coordinator (or pushing again): its view is unknown, replace it. */
        free(c->coord_boot_id);
        c->coord_boot_id = NULL;
        c->coord_lost = 0;
        ctl_push_full_set(c);
    }
}

void ctl_push_stop(struct ctl *c)
{
    free(c->coord_boot_id);
    c->coord_boot_id = NULL;
    reactor_timer_stop(c->r, &c->push_retry);
    reactor_timer_stop(c->r, &c->coord_hb_timer);
    reactor_timer_stop(c->r, &c->coord_sync_timer);
    struct ctl_push_entry *e = c->push_head;
    while (e) {
        struct ctl_push_entry *next = e->next;
        json_decref(e->inst);
        free(e);
        e = next;
    }
    c->push_head = c->push_tail = NULL;
}

/* ---- desired state ------------------------------------------------------------------------ */

static void excluded(const struct ctl_inst *in, int64_t **v, size_t *n)
{
    *v = NULL;
    *n = 0;
    if (!in->ft)
        return;
    for (size_t i = 0; i < in->ft->n_committed; i++)
        ctl_ids_add(v, n, in->ft->committed[i]);
    for (size_t i = 0; i < in->ft->n_pending; i++)
        ctl_ids_add(v, n, in->ft->pending[i]);
}

bool ctl_push_wanted(struct ctl *c, const struct ctl_inst *in)
{
    (void)c;
    if (!in->assembled || in->withdrawn)
        return false;
    if (in->status != WIRE_INS_ACTIVE && in->status != WIRE_INS_PAUSED)
        return false;
    if (in->ft && ctl_ft_in_transaction(in->ft))
        return false;
    return true;
}

/* "<status>|<id>:<ip>:<port>:<headless>,..." — what the coordinator cares about. */
static char *signature(const struct ctl_inst *in, bool identity_only)
{
    int64_t *ex;
    size_t n_ex;
    excluded(in, &ex, &n_ex);
    struct strbuf sb;
    strbuf_init(&sb, 1u << 24);
    if (!identity_only)
        strbuf_appendf(&sb, "%s|", wire_ins_status_str(in->status));
    strbuf_appendf(&sb, "%s|", wire_role_str(in->role));
    for (size_t i = 0; i < in->n_nms; i++)
        for (size_t j = 0; j < in->nms[i].n_eps; j++) {
            const struct wire_endpoint *ep = &in->nms[i].eps[j];
            if (ctl_ids_has(ex, n_ex, ep->id))
                continue;
            strbuf_appendf(&sb, "%lld:%s:%s:%d,", (long long)ep->id, ep->ip, ep->business_port,
                           ep->headless);
        }
    free(ex);
    return strbuf_take(&sb);
}

static json_t *inst_body(const struct ctl_inst *in)
{
    int64_t *ex;
    size_t n_ex;
    excluded(in, &ex, &n_ex);
    json_t *j = ctl_inst_coord_json(in, ex, n_ex, -1);
    free(ex);
    return j;
}

/* ---- queue ----------------------------------------------------------------------------------- */

static void pump(struct ctl *c);

static struct ctl_push_entry *enqueue(struct ctl *c, enum wire_refresh_event kind, int64_t id, json_t *inst)
{
    struct ctl_push_entry *e = xcalloc(1, sizeof(*e));
    e->kind = kind;
    e->id = id;
    e->inst = inst;
    if (c->push_tail)
        c->push_tail->next = e;
    else
        c->push_head = e;
    c->push_tail = e;
    return e;
}

void ctl_push_full_set(struct ctl *c)
{
    if (!enabled(c) || c->push_full_set_queued)
        return;
    c->push_full_set_queued = true;
    enqueue(c, WIRE_REFRESH_SET, 0, NULL);
    pump(c);
}

static void mark_published(struct ctl *c, struct ctl_inst *in, bool want)
{
    free(in->published_sig);
    free(in->published_body);
    in->published_sig = NULL;
    in->published_body = NULL;
    in->published = want;
    if (want) {
        in->published_sig = signature(in, false);
        json_t *b = inst_body(in);
        in->published_body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
    }
    (void)c;
}

static struct ctl_push_entry *plan(struct ctl *c, struct ctl_inst *in)
{
    bool want = ctl_push_wanted(c, in);
    struct ctl_push_entry *del = NULL;
    if (want && in->published) {
        char *sig = signature(in, false);
        bool same = in->published_sig && strcmp(sig, in->published_sig) == 0;
        free(sig);
        if (same)
            return NULL;
    }
    if (!want && !in->published)
        return NULL;
    if (in->published) {
        /* Gone, or a new endpoint set (the coordinator refuses an add that changes an
         * instance's identity): del what it has first. */
        char *now_id = signature(in, true);
        json_t *old = in->published_body ? json_loads(in->published_body, 0, NULL) : NULL;
        bool same_identity = false;
        if (old) {
            /* The identity part of the published signature follows its "status|". */
            const char *bar = in->published_sig ? strchr(in->published_sig, '|') : NULL;
            same_identity = bar && strcmp(bar + 1, now_id) == 0;
        }
        free(now_id);
        if (!want || !same_identity) {
            del = enqueue(c, WIRE_REFRESH_DEL, in->id, old ? old : inst_body(in));
            old = NULL;
            mark_published(c, in, false);
        }
        json_decref(old);
    }
    if (want) {
        enqueue(c, WIRE_REFRESH_ADD, in->id, inst_body(in));
        mark_published(c, in, true);
    }
    return del;
}

void ctl_push_reconcile(struct ctl *c, struct ctl_inst *in)
{
    if (!enabled(c)) {
        bool want = ctl_push_wanted(c, in);
        if (in->ft)
            in->ft->serving_published = want;
        in->published = want;
        return;
    }
    plan(c, in);
    pump(c);
}

void ctl_push_forget(struct ctl *c, struct ctl_inst *in)
{
    in->withdrawn = true;
    ctl_push_reconcile(c, in);
}

void ctl_push_withdraw(struct ctl *c, struct ctl_inst *in, ctl_push_cb cb, void *arg)
{
    in->withdrawn = true;
    if (!enabled(c)) {
        ctl_push_reconcile(c, in);
        if (cb)
            cb(c, in->id, 0, arg);
        return;
    }
    struct ctl_push_entry *del = plan(c, in);
    if (del) {
        del->cb = cb;
        del->cb_arg = arg;
        pump(c);
        return;
    }
    pump(c);
    if (cb)
        cb(c, in->id, 0, arg);
}

/* ---- sending ----------------------------------------------------------------------------------
 */

static void set_serving(struct ctl *c, int64_t id, bool on)
{
    struct ctl_inst *in = ctl_find(c, id);
    if (in && in->ft)
        in->ft->serving_published = on;
}

/* The boot id in a coordinator answer: top-level (probes) or data.boot_id (refresh);
 * NULL when absent (an upstream coordinator) or malformed. Borrowed from j. */
static const char *boot_id_of(json_t *j)
{
    if (!json_is_object(j))
        return NULL;
    json_t *b = json_object_get(j, "boot_id");
    if (!b) {
        json_t *d = json_object_get(j, "data");
        b = json_is_object(d) ? json_object_get(d, "boot_id") : NULL;
    }
    const char *s = json_string_value(b);
    /* Ours are 32 hex digits; anything absurd is ignored rather than trusted. */
    return s && *s && strlen(s) <= 128 ? s : NULL;
}

/* A coordinator answered with boot id `boot` (NULL: none). from_set: the answer to a
 * full set, which is now that process's whole view. */
static void coord_boot_seen(struct ctl *c, const char *boot, bool from_set, const char *via)
{
    if (!boot)
        return;
    if (c->coord_boot_id && strcmp(c->coord_boot_id, boot) == 0)
        return;
    bool restarted = c->coord_boot_id && !from_set;
    if (restarted)
        log_warn("coordinator_restarted", LF_STR("previous_boot_id", c->coord_boot_id),
                 LF_STR("boot_id", boot), LF_STR("seen_by", via), LF_STR("action", "full set"));
    free(c->coord_boot_id);
    c->coord_boot_id = xstrdup(boot);
    if (restarted && !c->stopping) {
        metrics_counter_inc(c->m.coord_restarts);
        ctl_push_full_set(c);
    }
}

static void push_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    (void)tag;
    struct ctl_push_entry *e = arg;
    c->push_inflight = false;
    bool ok = ctl_http_ok(resp);
    metrics_counter_inc(metrics_counter_labels(c->m.pushes, "event", wire_refresh_event_str(e->kind), "result",
                                               ok ? "ok" : "error"));
    if (ok) {
        log_info("coordinator_push", LF_STR("push", wire_refresh_event_str(e->kind)),
                 LF_INT("instance_id", e->id), LF_BOOL("ok", true));
        json_t *j = ctl_http_json(resp);
        coord_boot_seen(c, boot_id_of(j), e->kind == WIRE_REFRESH_SET, wire_refresh_event_str(e->kind));
        json_decref(j);
        if (e->kind == WIRE_REFRESH_ADD)
            set_serving(c, e->id, true);
        else if (e->kind == WIRE_REFRESH_DEL)
            set_serving(c, e->id, false);
        else {
            c->push_dirty = false;
            for (size_t i = 0; i < c->n_insts; i++)
                if (c->insts[i]->ft)
                    c->insts[i]->ft->serving_published = c->insts[i]->published;
        }
    } else {
        log_warn("coordinator_push", LF_STR("push", wire_refresh_event_str(e->kind)),
                 LF_INT("instance_id", e->id), LF_BOOL("ok", false),
                 LF_STR("error", ctl_http_err(resp)));
        /* Eventual consistency: one full set repairs whatever this push left behind. A
         * failed set is not re-queued (the heartbeat recovery / periodic sync retry). */
        if (e->kind != WIRE_REFRESH_SET && !c->stopping)
            ctl_push_full_set(c);
        else if (e->kind == WIRE_REFRESH_SET)
            c->push_dirty = true; /* the next good coordinator heartbeat retries */
    }
    if (e->cb)
        e->cb(c, e->id, ok ? 0 : -EIO, e->cb_arg);
    json_decref(e->inst);
    free(e);
    if (!c->stopping)
        pump(c);
}

static void push_drop(void *arg, intptr_t tag)
{
    (void)tag;
    struct ctl_push_entry *e = arg;
    json_decref(e->inst);
    free(e);
}

static void pump(struct ctl *c)
{
    if (c->push_inflight || !c->push_head || c->stopping)
        return;
    struct ctl_push_entry *e = c->push_head;
    c->push_head = e->next;
    if (!c->push_head)
        c->push_tail = NULL;
    json_t *arr = json_array();
    if (e->kind == WIRE_REFRESH_SET) {
        c->push_full_set_queued = false;
        for (size_t i = 0; i < c->n_insts; i++) {
            struct ctl_inst *in = c->insts[i];
            bool want = ctl_push_wanted(c, in);
            mark_published(c, in, want);
            if (want)
                json_array_append_new(arr, inst_body(in));
        }
    } else {
        json_array_append(arr, e->inst);
    }
    json_t *body = wire_refresh_body(e->kind, arr);
    char port[16];
    snprintf(port, sizeof(port), "%d", c->cfg.coordinator_port);
    char *url = ctl_nm_url(c, c->cfg.coordinator_host, port, "/instances/refresh");
    c->push_inflight = true;
    log_debug("coordinator_push_sent", LF_STR("push", wire_refresh_event_str(e->kind)),
              LF_INT("instance_id", e->id), LF_INT("instances", json_array_size(arr)));
    ctl_request(c, "POST", url, body, c->cfg.coordinator_timeout_ms, push_done, e, 0, push_drop);
    free(url);
    json_decref(body);
}

static void on_push_retry(struct reactor *r, void *arg)
{
    (void)r;
    pump(arg);
}

/* ---- coordinator heartbeat and periodic sync
 * ----------------------------------------------------- */

static void coord_hb_done(struct ctl *c, const struct httpc_response *resp, void *arg, intptr_t tag)
{
    (void)arg;
    (void)tag;
    c->coord_hb_inflight = false;
    if (ctl_http_ok(resp)) {
        json_t *j = ctl_http_json(resp);
        coord_boot_seen(c, boot_id_of(j), false, "heartbeat");
        json_decref(j);
        if (c->coord_lost >= 2 || c->push_dirty) {
            log_info("coordinator_back", LF_INT("lost_heartbeats", c->coord_lost),
                     LF_BOOL("after_failed_set", c->push_dirty));
            ctl_push_full_set(c);
        }
        c->coord_lost = 0;
        return;
    }
    c->coord_lost++;
    if (c->coord_lost == 2)
        log_warn("coordinator_unreachable", LF_STR("error", ctl_http_err(resp)));
}

static void on_coord_hb(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->coord_hb_inflight || !c->loaded)
        return;
    char port[16];
    snprintf(port, sizeof(port), "%d", c->cfg.coordinator_port);
    char *url = ctl_nm_url(c, c->cfg.coordinator_host, port, "/liveness");
    c->coord_hb_inflight = true;
    ctl_request(c, "GET", url, NULL, c->cfg.coordinator_timeout_ms, coord_hb_done, NULL, 0, NULL);
    free(url);
}

static void on_coord_sync(struct reactor *r, void *arg)
{
    (void)r;
    struct ctl *c = arg;
    if (c->loaded)
        ctl_push_full_set(c);
}
