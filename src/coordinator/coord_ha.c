/* coord_ha — master/standby over etcd (standby_config.enable_master_standby), on the
 * management reactor.
 *
 * Every coordinator of a deployment campaigns for one lease lock on etcd
 * (standby_config.master_lock_key; the shared lock of common/etcd.h, the one the
 * controller's store elects its leader with). The holder is the master: it serves
 * inference and accepts POST /instances/refresh. The others are standbys: /readiness
 * answers 503 with reason NOT_MASTER (so a Kubernetes Service sends traffic and the
 * controller's pushes only to the master), inference reaching one directly gets a 503
 * that says so (NOT_MASTER), and a refresh gets 503 too (its table is the master's).
 *
 * The instance table is replicated through etcd, so a takeover needs no re-sync: after
 * every accepted refresh the master writes the whole table, as the refresh body that
 * recreates it, to `<master_lock_key>/instances` in a transaction guarded by the lock
 * (only the current holder's write lands; one write in flight, coalesced). Standbys
 * read that key every master_standby_check_interval and apply it as a `set`; a
 * coordinator that wins the lock reads it once more before it serves (state SYNCING,
 * reason SYNCING), so it starts with the master's last table, whatever the polling
 * missed. Breaker states and load counters are per process and start fresh.
 *
 * Takeover is bounded by the lease: the master renews every min(check interval,
 * TTL/3); when it stops (killed, frozen, partitioned from etcd) its lease ends TTL after
 * its last renewal and the key goes. A standby that finds the lock taken asks etcd how
 * long the holder's lease has left and tries again right then (at the latest after
 * master_lock_retry_interval), so it takes over within about one TTL of the master's
 * last renewal. A master that cannot renew steps down (master_lock_max_failures failed
 * renewals in a row, or a whole TTL without one) to standby — in place: requests in
 * flight finish, new ones are refused — and campaigns again. Its workers stop serving
 * by themselves at the lease's sure end (c->serve_until), so a master frozen past its
 * lease refuses new requests the moment it runs again. A master stopped with SIGTERM
 * gives the lock back first: its standby takes over at once.
 *
 * The flow is a state table (STANDBY, SYNCING, MASTER, STOPPED x WON, BUSY, FAILED,
 * SYNCED, LOST, STOP), changed only through ha_step, which logs each transition. */
#include "coordinator/coord_internal.h"

#include "common/etcd.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The workers stop serving this long before the lease's sure end. */
#define HA_FENCE_MARGIN_MS 100
/* A coordinator that won the lock re-reads a failed table this often. */
#define HA_SYNC_RETRY_MS 200

enum ha_state { HA_STANDBY = 0, HA_SYNCING, HA_MASTER, HA_STOPPED, HA_STATES };
enum ha_event {
    HA_EV_WON = 0,
    HA_EV_BUSY,
    HA_EV_FAILED,
    HA_EV_SYNCED,
    HA_EV_LOST,
    HA_EV_STOP,
    HA_EVENTS
};

static const char *const state_names[HA_STATES] = {"standby", "syncing", "master", "stopped"};
static const char *const event_names[HA_EVENTS] = {"won",    "busy", "failed",
                                                   "synced", "lost", "stop"};

/* new state + 1; 0 = illegal */
/* clang-format off */
#define T(s) ((int8_t)((s) + 1))
static const int8_t ha_table[HA_STATES][HA_EVENTS] = {
    /*              WON            BUSY           FAILED         SYNCED        LOST           STOP */
    [HA_STANDBY] = {T(HA_SYNCING), T(HA_STANDBY), T(HA_STANDBY), 0,            0,             T(HA_STOPPED)},
    [HA_SYNCING] = {0,             0,             0,             T(HA_MASTER), T(HA_STANDBY), T(HA_STOPPED)},
    [HA_MASTER] = {0,              0,             0,             0,            T(HA_STANDBY), T(HA_STOPPED)},
    [HA_STOPPED] = {0},
};
#undef T
/* clang-format on */

struct coord_ha {
    struct coord *c;
    struct etcd *e;
    struct etcd_lock *lock;
    enum ha_state state;
    char *owner;
    char *table_key;
    struct reactor_timer campaign_timer;
    struct reactor_timer sync_timer;
    struct etcd_call *read_call, *write_call;
    int64_t read_rev; /* mod_revision of the table last applied */
    bool dirty;       /* master: the table changed since the last write that landed */
    uint64_t written_version;
};

const char *coord_ha_next(const char *state, const char *event)
{
    for (int st = 0; st < HA_STATES; st++) {
        if (strcmp(state_names[st], state) != 0)
            continue;
        for (int ev = 0; ev < HA_EVENTS; ev++)
            if (strcmp(event_names[ev], event) == 0)
                return ha_table[st][ev] ? state_names[ha_table[st][ev] - 1] : NULL;
    }
    return NULL;
}

static int ha_step(struct coord_ha *h, enum ha_event ev, const char *cause)
{
    enum ha_state from = h->state;
    int to = ha_table[from][ev] - 1;
    if (to < 0) {
        log_warn("state_event_ignored", LF_STR("machine", "coordinator_ha"),
                 LF_STR("state", state_names[from]), LF_STR("trigger", event_names[ev]),
                 LF_STR("cause", cause));
        return -1;
    }
    h->state = (enum ha_state)to;
    log_at(to == (int)from ? LOG_DEBUG : LOG_INFO, "state_transition",
           LF_STR("machine", "coordinator_ha"), LF_STR("from", state_names[from]),
           LF_STR("to", state_names[to]), LF_STR("trigger", event_names[ev]),
           LF_STR("cause", cause), LF_STR("master", etcd_lock_holder(h->lock)));
    return (int)from;
}

static void set_serving(struct coord_ha *h, bool on)
{
    struct coord *c = h->c;
    int64_t until = on ? etcd_lock_valid_until(h->lock) - HA_FENCE_MARGIN_MS : 0;
    atomic_store_explicit(&c->serve_until, until, memory_order_release);
    metrics_gauge_set(c->m.is_master, on ? 1 : 0);
}

/* ---- the replicated table ---------------------------------------------------------------- */

static void write_table(struct coord_ha *h);

static void write_done(void *arg, json_t *body, const char *error)
{
    struct coord_ha *h = arg;
    h->write_call = NULL;
    if (!body) {
        log_warn("ha_table_write_failed", LF_STR("error", error),
                 LF_STR("action", "retried at the next check"));
        h->dirty = true;
        return;
    }
    if (!etcd_txn_succeeded(body)) {
        h->dirty = true;
        etcd_lock_lost(h->lock, "the lock key changed hands");
        return;
    }
    log_debug("ha_table_written", LF_INT("version", (int64_t)h->written_version));
    if (h->dirty)
        write_table(h);
}

static void write_table(struct coord_ha *h)
{
    if (h->state != HA_MASTER || h->write_call)
        return; /* SYNCING writes once it serves; one write in flight, then the latest */
    struct coord *c = h->c;
    h->dirty = false;
    h->written_version = c->table.version;
    json_t *v =
        json_pack("{s:s, s:I, s:o}", "owner", h->owner, "version", (json_int_t)c->table.version,
                  "refresh", inst_table_to_refresh(&c->table));
    char *text = json_dumps(v, JSON_COMPACT);
    json_decref(v);
    json_t *ops = json_pack("[o]", etcd_op_put(h->table_key, text ? text : "{}", NULL));
    free(text);
    h->write_call = etcd_post(h->e, "/v3/kv/txn",
                              etcd_txn_body(etcd_lock_guard(h->lock), ops, NULL), write_done, h);
}

/* Apply the table text read from etcd. 0, or -EINVAL (logged). */
static int apply_table(struct coord_ha *h, const char *text, int64_t rev)
{
    struct coord *c = h->c;
    json_t *v = json_loads(text, 0, NULL);
    json_t *body = json_object_get(v, "refresh");
    struct inst_refresh r;
    char err[512] = "";
    int rc = body ? inst_refresh_parse(body, &r, err, sizeof(err)) : -EINVAL;
    if (rc == 0) {
        if (r.ev != WIRE_REFRESH_SET) {
            snprintf(err, sizeof(err), "not a set");
            rc = -EINVAL;
        } else {
            rc = inst_table_apply(&c->table, &r, err, sizeof(err));
        }
        inst_refresh_release(&r);
    }
    if (rc < 0) {
        log_error("ha_table_invalid", LF_STR("key", h->table_key), LF_STR("error", err));
        json_decref(v);
        return -EINVAL;
    }
    mgmt_publish(c);
    h->read_rev = rev;
    log_info("ha_table_synced", LF_INT("instances", (int64_t)c->table.n), LF_INT("revision", rev),
             LF_STR("written_by", json_string_value(json_object_get(v, "owner"))),
             LF_STR("state", state_names[h->state]));
    json_decref(v);
    return 0;
}

static void read_done(void *arg, json_t *body, const char *error)
{
    struct coord_ha *h = arg;
    h->read_call = NULL;
    char *text = NULL;
    int64_t rev = 0;
    int found = body ? etcd_range_first(body, &text, &rev, NULL, 0) : -EIO;
    if (found < 0) {
        log_warn("ha_table_read_failed", LF_STR("error", error ? error : "unexpected answer"),
                 LF_STR("state", state_names[h->state]));
        free(text);
        if (h->state == HA_SYNCING)
            reactor_timer_start(h->c->r, &h->sync_timer, HA_SYNC_RETRY_MS, 0);
        return;
    }
    if (found == 1 && rev != h->read_rev)
        (void)apply_table(h, text, rev); /* an invalid record is not ours to fix: logged */
    free(text);
    if (h->state != HA_SYNCING)
        return;
    if (ha_step(h, HA_EV_SYNCED, found ? "instance table read" : "no table in etcd yet") < 0)
        return;
    set_serving(h, true);
    log_info("coordinator_master", LF_STR("owner", h->owner),
             LF_INT("instances", (int64_t)h->c->table.n),
             LF_INT("lease_ttl_s", h->c->cfg.ha_ttl_s));
    reactor_timer_start(h->c->r, &h->sync_timer, h->c->cfg.ha_check_ms, h->c->cfg.ha_check_ms);
    /* Nothing in etcd yet but a table here (a first master that already got refreshes as
     * a standby could not: they were refused; this is one from before HA was on). */
    if (found == 0 && h->c->table.n > 0) {
        h->dirty = true;
        write_table(h);
    }
}

static void read_table(struct coord_ha *h)
{
    if (h->read_call)
        return;
    h->read_call =
        etcd_post(h->e, "/v3/kv/range", etcd_range_body(h->table_key, false), read_done, h);
}

static void on_sync_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct coord_ha *h = arg;
    switch (h->state) {
    case HA_STANDBY:
    case HA_SYNCING:
        read_table(h);
        break;
    case HA_MASTER:
        if (h->dirty)
            write_table(h);
        break;
    case HA_STOPPED:
    case HA_STATES:
        break;
    }
}

/* ---- the lock ---------------------------------------------------------------------------- */

static void on_campaign_timer(struct reactor *r, void *arg)
{
    (void)r;
    struct coord_ha *h = arg;
    if (h->state == HA_STANDBY)
        etcd_lock_try(h->lock);
}

static void retry_later(struct coord_ha *h, int64_t ms)
{
    reactor_timer_start(h->c->r, &h->campaign_timer, ms < 50 ? 50 : ms, 0);
}

static void on_lock(struct etcd_lock *l, enum etcd_lock_event ev, const char *detail, void *arg)
{
    struct coord_ha *h = arg;
    struct coord *c = h->c;
    switch (ev) {
    case ETCD_LOCK_WON:
        if (ha_step(h, HA_EV_WON, "lock acquired") < 0)
            return;
        /* A read sent before we won may predate the old master's last write. */
        etcd_cancel(h->e, h->read_call);
        h->read_call = NULL;
        reactor_timer_stop(c->r, &h->sync_timer);
        read_table(h);
        return;
    case ETCD_LOCK_BUSY: {
        ha_step(h, HA_EV_BUSY, detail);
        /* Try again when the holder's lease could end: etcd tells its remainder in whole
         * seconds, rounded down (the lease lives T..T+1 s more), so at T s, and every
         * 100 ms once under a second (etcd deletes an expired lease's key within its
         * 500 ms expiry check). A live master renews before then and stays. */
        int64_t left = etcd_lock_holder_ttl_ms(l);
        int64_t wait = c->cfg.ha_retry_ms;
        if (left >= 0)
            wait = MOTOR_MIN(wait, left >= 1000 ? left : 100);
        log_debug("ha_lock_busy", LF_STR("master", detail), LF_INT("holder_lease_left_ms", left),
                  LF_INT("retry_in_ms", wait));
        retry_later(h, wait);
        return;
    }
    case ETCD_LOCK_FAILED:
        ha_step(h, HA_EV_FAILED, detail);
        retry_later(h, c->cfg.ha_retry_ms);
        return;
    case ETCD_LOCK_RENEWED:
        if (h->state == HA_MASTER)
            set_serving(h, true);
        return;
    case ETCD_LOCK_LOST:
        set_serving(h, false);
        if (ha_step(h, HA_EV_LOST, detail) < 0)
            return;
        log_error("coordinator_stepped_down", LF_STR("reason", detail),
                  LF_STR("action", "standby: requests in flight finish, new ones are refused"));
        etcd_cancel(h->e, h->write_call);
        h->write_call = NULL;
        reactor_timer_start(c->r, &h->sync_timer, c->cfg.ha_check_ms, c->cfg.ha_check_ms);
        retry_later(h, c->cfg.ha_retry_ms);
        return;
    }
}

/* ---- the daemon's hooks ------------------------------------------------------------------ */

int coord_ha_start(struct coord *c)
{
    if (!c->cfg.ha_enable)
        return 0;
    struct httpc_tls tls = {0};
    const struct ccfg_tls *m = c->cfg.etcd_tls.enable ? &c->cfg.etcd_tls : &c->cfg.mgmt_tls;
    if (m->enable) {
        tls.ca_file = m->ca_file;
        tls.cert_file = m->cert_file && *m->cert_file ? m->cert_file : NULL;
        tls.key_file = m->key_file && *m->key_file ? m->key_file : NULL;
        tls.key_password = m->key_password;
    }
    struct etcd_opts eo = {
        .endpoints = (const char *const *)c->cfg.etcd_endpoints,
        .n_endpoints = c->cfg.n_etcd_endpoints,
        .timeout_ms = c->cfg.etcd_timeout_ms,
        .tls = m->enable ? &tls : NULL,
    };
    char err[256] = "";
    struct etcd *e = etcd_new(c->r, &eo, err, sizeof(err));
    if (!e) {
        log_error("ha_start_failed", LF_STR("error", err));
        fprintf(stderr, "motor coordinator: master/standby: %s\n", err);
        return -EINVAL;
    }
    struct coord_ha *h = xcalloc(1, sizeof(*h));
    h->c = c;
    h->e = e;
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    h->owner = xasprintf("%s:%d:%u:%.8s", host, (int)getpid(), c->mgmt_port, c->boot_id);
    h->table_key = xasprintf("%s/instances", c->cfg.ha_key);
    struct etcd_lock_opts lo = {
        .key = c->cfg.ha_key,
        .owner = h->owner,
        .ttl_s = c->cfg.ha_ttl_s,
        .renew_ms = c->cfg.ha_check_ms,
        .max_failures = c->cfg.ha_max_failures,
        .holder_ttl = true,
        .log_prefix = "coordinator_ha",
    };
    h->lock = etcd_lock_new(e, c->r, &lo, on_lock, h);
    h->state = HA_STANDBY;
    reactor_timer_init(&h->campaign_timer, on_campaign_timer, h);
    reactor_timer_init(&h->sync_timer, on_sync_timer, h);
    c->ha = h;
    log_info("ha_started", LF_STR("owner", h->owner), LF_STR("lock_key", c->cfg.ha_key),
             LF_STR("etcd", c->cfg.etcd_endpoints[0]), LF_INT("lease_ttl_s", c->cfg.ha_ttl_s),
             LF_INT("check_interval_ms", c->cfg.ha_check_ms),
             LF_INT("retry_interval_ms", c->cfg.ha_retry_ms));
    read_table(h); /* a standby's replica, from the start */
    reactor_timer_start(c->r, &h->sync_timer, c->cfg.ha_check_ms, c->cfg.ha_check_ms);
    etcd_lock_try(h->lock);
    return 0;
}

void coord_ha_table_changed(struct coord *c)
{
    struct coord_ha *h = c->ha;
    if (!h)
        return;
    h->dirty = true;
    write_table(h);
}

bool coord_ha_accepts_refresh(struct coord *c, struct httpd_req *req)
{
    struct coord_ha *h = c->ha;
    if (!h || h->state == HA_MASTER)
        return true;
    char msg[384];
    snprintf(msg, sizeof(msg),
             "this coordinator is a standby (NOT_MASTER): refresh the master (%s); standbys "
             "copy its table",
             *etcd_lock_holder(h->lock) ? etcd_lock_holder(h->lock) : "unknown yet");
    httpd_add_header(req, "Retry-After", "1");
    httpd_add_header(req, "Connection", "close");
    httpd_respond_error(req, 503, msg);
    return false;
}

void coord_ha_standby_close(struct coord *c, struct httpd_req *req)
{
    if (c->ha && c->ha->state != HA_MASTER)
        httpd_add_header(req, "Connection", "close");
}

const char *coord_ha_role(struct coord *c, const char **holder)
{
    struct coord_ha *h = c->ha;
    if (!h) {
        *holder = "";
        return "single";
    }
    *holder = etcd_lock_holder(h->lock);
    return state_names[h->state];
}

void coord_ha_stop(struct coord *c, int64_t wait_ms)
{
    struct coord_ha *h = c->ha;
    if (!h)
        return;
    bool was_master = etcd_lock_held(h->lock);
    set_serving(h, false);
    ha_step(h, HA_EV_STOP, "shutting down");
    reactor_timer_stop(c->r, &h->campaign_timer);
    reactor_timer_stop(c->r, &h->sync_timer);
    etcd_cancel(h->e, h->read_call);
    etcd_cancel(h->e, h->write_call);
    h->read_call = h->write_call = NULL;
    if (was_master) {
        etcd_lock_resign(h->lock);
        /* Let etcd hear it: the standby takes over now rather than after the TTL. */
        int64_t deadline = util_mono_ms() + wait_ms;
        while (etcd_active(h->e) && util_mono_ms() < deadline)
            reactor_run_once(c->r, 50);
    }
    etcd_lock_free(h->lock);
    etcd_free(h->e);
    free(h->owner);
    free(h->table_key);
    free(h);
    c->ha = NULL;
}
