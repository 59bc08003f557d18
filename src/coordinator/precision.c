/* precision — see precision.h. */
#include "coordinator/precision.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"
#include "coordinator/coord_internal.h"
#include "coordinator/instances.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define PREC_MAX_WINDOWS 4096 /* decode instances with a window (oldest forgotten beyond) */
#define PREC_MAX_GROUPS 4096  /* PD groups with a state */
#define PREC_MAX_PENDING 256  /* samples waiting for the management reactor */
#define PREC_SAMPLE_TOKENS 16384
#define PREC_SAMPLE_TEXT (256u << 10)
#define PREC_REPORT_TIMEOUT_MS 10000
#define PREC_PROBE_MAX_TOKENS 64

/* ---- the state table ---------------------------------------------------------------- */

static const signed char table[PREC_STATE_COUNT][PREC_EV_COUNT] = {
    /*               ISSUE_TH      RAISED        RAISE_FAIL   CLEAR_TH       CLEARED     CLEAR_FAIL
       RECOVERED */
    [PREC_CLEAN] = {PREC_PROBING, -1, -1, -1, -1, -1, PREC_CLEAN},
    [PREC_PROBING] = {-1, PREC_ALARMED, PREC_CLEAN, -1, -1, -1, PREC_CLEAN},
    [PREC_ALARMED] = {-1, -1, -1, PREC_CLEARING, -1, -1, PREC_CLEAN},
    [PREC_CLEARING] = {-1, -1, -1, -1, PREC_CLEAN, PREC_ALARMED, PREC_CLEAN},
};

static const char *const state_names[] = {"clean", "probing", "alarmed", "clearing"};
static const char *const event_names[] = {"issue_threshold", "raised",  "raise_failed",
                                          "clear_threshold", "cleared", "clear_failed",
                                          "recovered"};

int prec_next(enum prec_state s, enum prec_event ev)
{
    if ((unsigned)s >= PREC_STATE_COUNT || (unsigned)ev >= PREC_EV_COUNT)
        return -1;
    return table[s][ev];
}

const char *prec_state_name(enum prec_state s)
{
    return (unsigned)s < PREC_STATE_COUNT ? state_names[s] : "?";
}

const char *prec_event_name(enum prec_event ev)
{
    return (unsigned)ev < PREC_EV_COUNT ? event_names[ev] : "?";
}

char *prec_moi(const char *service_ip, int64_t p_id, int64_t d_id)
{
    if (p_id >= 0)
        return xasprintf("service name=Coordinator, service ip=%s, pId=%lld, instanceId=%lld",
                         service_ip, (long long)p_id, (long long)d_id);
    return xasprintf("service name=Coordinator, service ip=%s, instanceId=%lld", service_ip,
                     (long long)d_id);
}

/* ---- state -------------------------------------------------------------------------- */

struct prec_window {
    int64_t d_id;
    int64_t last_ms;
};

enum act_kind { ACT_PROBE, ACT_RAISE, ACT_CLEAR };

struct prec_group {
    struct prec_group *next;
    int64_t p_id, d_id;
    enum prec_state st;
    int bad_streak, good_streak;
    int issue_count;    /* bad samples that led to the alarm */
    int probe_failures; /* of the probe run */
    int probe_attempts;
    uint64_t gen; /* bumped at every transition: an action of an older one is stale */
    char *moi;    /* the active alarm's (byte for byte the same at its clear) */
    struct prec_action *act;
    int64_t raised_wall_ms;
};

struct prec_action {
    struct coord *c;
    struct prec_group *g;
    enum act_kind kind;
    struct httpc_req *h;
};

struct prec_pending {
    struct prec_pending *next;
    int64_t p_id, d_id;
    struct qck_acc *acc;
};

struct prec {
    /* shared with the workers */
    pthread_mutex_t mu;
    struct prec_window win[PREC_MAX_WINDOWS];
    size_t n_win;
    struct prec_pending *pend_head, *pend_tail;
    size_t n_pend;
    bool posted; /* a drain task is queued on the management reactor */
    char secret[33];
    /* management reactor only */
    struct prec_group *groups;
    size_t n_groups;
    struct metrics_family *samples; /* {verdict} */
    struct metrics_counter *alarms_raised, *alarms_cleared, *probes_failed;
    struct metrics_gauge *active;
};

static void random_hex(char *out, size_t n_bytes)
{
    unsigned char b[32];
    size_t got = 0;
    while (got < n_bytes) {
        ssize_t r = getrandom(b + got, n_bytes - got, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    for (size_t i = got; i < n_bytes; i++) /* never seen: getrandom of 16 bytes */
        b[i] = (unsigned char)(util_mono_us() >> (i % 8));
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < n_bytes; i++) {
        out[2 * i] = hex[b[i] >> 4];
        out[2 * i + 1] = hex[b[i] & 15];
    }
    out[2 * n_bytes] = '\0';
}

void prec_init(struct coord *c)
{
    struct prec *p = xcalloc(1, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    random_hex(p->secret, 16);
    struct metrics_registry *reg = c->m.reg;
    p->samples = metrics_counter_family(reg, "motor_coordinator_precision_samples_total",
                                        "Sampled decode answers checked, by verdict.", "verdict");
    p->alarms_raised = metrics_counter_new(reg, "motor_coordinator_precision_alarms_raised_total",
                                           "Precision alarms reported to the controller.");
    p->alarms_cleared =
        metrics_counter_new(reg, "motor_coordinator_precision_alarms_cleared_total",
                            "Precision alarms cleared (good samples or the controller).");
    p->probes_failed = metrics_counter_new(reg, "motor_coordinator_precision_probe_failures_total",
                                           "Probe requests that did not answer as expected.");
    p->active = metrics_gauge_new(reg, "motor_coordinator_precision_alarms_active",
                                  "PD groups with an active precision alarm.");
    c->prec = p;
}

static void action_free(struct prec_action *a)
{
    if (!a)
        return;
    if (a->h)
        httpc_cancel(a->c->mgmt_httpc, a->h);
    free(a);
}

static void group_free(struct prec_group *g)
{
    if (!g)
        return;
    if (g->act) {
        g->act->g = NULL;
        action_free(g->act);
    }
    free(g->moi);
    free(g);
}

void prec_release(struct coord *c)
{
    struct prec *p = c->prec;
    if (!p)
        return;
    while (p->groups) {
        struct prec_group *g = p->groups;
        p->groups = g->next;
        if (g->act)
            g->act->h = NULL; /* the client was freed with mgmt_stop */
        group_free(g);
    }
    while (p->pend_head) {
        struct prec_pending *e = p->pend_head;
        p->pend_head = e->next;
        qck_acc_release(e->acc);
        free(e->acc);
        free(e);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
    c->prec = NULL;
}

/* ---- the worker side ---------------------------------------------------------------- */

bool prec_window_claim(_Atomic int64_t *last, int64_t interval_ms, int64_t now_ms)
{
    int64_t seen = atomic_load_explicit(last, memory_order_relaxed);
    while (seen == INT64_MIN || now_ms - seen >= interval_ms) {
        /* the one that moves it claims the window; a loser sees the new value */
        if (atomic_compare_exchange_weak_explicit(last, &seen, now_ms, memory_order_acq_rel,
                                                  memory_order_relaxed))
            return true;
    }
    return false;
}

bool prec_claim(struct coord *c, const struct csettings *set, struct instance *d, int64_t now_ms)
{
    struct prec *p = c->prec;
    if (!p || !set->prec_enable || !d)
        return false;
    if (d->shared)
        return prec_window_claim(&d->shared->prec_last_ms, set->prec_interval_ms, now_ms);
    int64_t d_id = d->id;
    bool ok = false;
    pthread_mutex_lock(&p->mu);
    size_t i, oldest = 0;
    for (i = 0; i < p->n_win; i++) {
        if (p->win[i].d_id == d_id)
            break;
        if (p->win[i].last_ms < p->win[oldest].last_ms)
            oldest = i;
    }
    if (i == p->n_win) {
        if (p->n_win < PREC_MAX_WINDOWS)
            p->n_win++;
        else
            i = oldest;
        p->win[i].d_id = d_id;
        p->win[i].last_ms = now_ms;
        ok = true;
    } else if (now_ms - p->win[i].last_ms >= set->prec_interval_ms) {
        p->win[i].last_ms = now_ms;
        ok = true;
    }
    pthread_mutex_unlock(&p->mu);
    return ok;
}

bool prec_probe_pin(struct coord *c, const char *hdr, int64_t *p_id, int64_t *d_id)
{
    struct prec *p = c->prec;
    if (!p || !hdr)
        return false;
    size_t sl = strlen(p->secret);
    if (strncmp(hdr, p->secret, sl) != 0 || hdr[sl] != ' ')
        return false;
    char *end;
    errno = 0;
    long long pp = strtoll(hdr + sl + 1, &end, 10);
    if (errno || *end != ' ' || pp < -1)
        return false;
    long long dd = strtoll(end + 1, &end, 10);
    if (errno || *end != '\0' || dd < 0)
        return false;
    *p_id = pp;
    *d_id = dd;
    return true;
}

static void on_pending(void *arg);

void prec_submit(struct coord *c, int64_t p_id, int64_t d_id, struct qck_acc *take)
{
    struct prec *p = c->prec;
    if (!p) {
        qck_acc_release(take);
        free(take);
        return;
    }
    struct prec_pending *e = xcalloc(1, sizeof(*e));
    e->p_id = p_id;
    e->d_id = d_id;
    e->acc = take;
    bool post = false;
    pthread_mutex_lock(&p->mu);
    if (p->n_pend >= PREC_MAX_PENDING) {
        /* The management thread is behind: a sample is worth less than its memory. */
        pthread_mutex_unlock(&p->mu);
        qck_acc_release(take);
        free(take);
        free(e);
        return;
    }
    if (p->pend_tail)
        p->pend_tail->next = e;
    else
        p->pend_head = e;
    p->pend_tail = e;
    p->n_pend++;
    if (!p->posted)
        post = p->posted = true;
    pthread_mutex_unlock(&p->mu);
    if (post && reactor_post(c->r, on_pending, c) < 0) {
        pthread_mutex_lock(&p->mu);
        p->posted = false; /* the next sample tries again; these wait */
        pthread_mutex_unlock(&p->mu);
    }
}

/* ---- groups, transitions ------------------------------------------------------------ */

static struct prec_group *group_find(struct prec *p, int64_t p_id, int64_t d_id)
{
    for (struct prec_group *g = p->groups; g; g = g->next)
        if (g->p_id == p_id && g->d_id == d_id)
            return g;
    return NULL;
}

static void group_unlink(struct prec *p, struct prec_group *g)
{
    for (struct prec_group **pp = &p->groups; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            p->n_groups--;
            return;
        }
}

static struct prec_group *group_get(struct prec *p, int64_t p_id, int64_t d_id)
{
    struct prec_group *g = group_find(p, p_id, d_id);
    if (g)
        return g;
    if (p->n_groups >= PREC_MAX_GROUPS) {
        /* forget a clean group (its streak only) to make room */
        struct prec_group *victim = NULL;
        for (struct prec_group *x = p->groups; x; x = x->next)
            if (x->st == PREC_CLEAN && !x->act)
                victim = x;
        if (!victim)
            return NULL;
        group_unlink(p, victim);
        group_free(victim);
    }
    g = xcalloc(1, sizeof(*g));
    g->p_id = p_id;
    g->d_id = d_id;
    g->st = PREC_CLEAN;
    g->next = p->groups;
    p->groups = g;
    p->n_groups++;
    return g;
}

static void count_active(struct prec *p)
{
    int n = 0;
    for (struct prec_group *g = p->groups; g; g = g->next)
        n += g->st == PREC_ALARMED || g->st == PREC_CLEARING;
    metrics_gauge_set(p->active, n);
}

static void start_probe(struct coord *c, struct prec_group *g);
static void start_report(struct coord *c, struct prec_group *g, enum act_kind kind);

/* The one transition function of a group: logs old state, new state and cause, and
 * starts what the new state does. False when the table refused the event. */
static bool group_step(struct coord *c, struct prec_group *g, enum prec_event ev, const char *cause)
{
    int to = prec_next(g->st, ev);
    if (to < 0) {
        log_warn("precision_event_refused", LF_INT("p_instance_id", g->p_id),
                 LF_INT("d_instance_id", g->d_id), LF_STR("state", prec_state_name(g->st)),
                 LF_STR("on", prec_event_name(ev)), LF_STR("cause", cause));
        return false;
    }
    enum prec_state from = g->st;
    g->st = (enum prec_state)to;
    g->gen++;
    if (g->act) { /* whatever ran belongs to the old state */
        g->act->g = NULL;
        action_free(g->act);
        g->act = NULL;
    }
    log_info("precision_state", LF_INT("p_instance_id", g->p_id), LF_INT("d_instance_id", g->d_id),
             LF_STR("from", prec_state_name(from)), LF_STR("to", prec_state_name(g->st)),
             LF_STR("on", prec_event_name(ev)), LF_STR("cause", cause));
    switch (g->st) {
    case PREC_PROBING:
        g->issue_count = g->bad_streak;
        g->probe_failures = 0;
        g->probe_attempts = 0;
        start_probe(c, g);
        break;
    case PREC_ALARMED:
        g->good_streak = 0;
        if (from == PREC_PROBING) {
            g->raised_wall_ms = util_wall_ms();
            metrics_counter_inc(c->prec->alarms_raised);
        }
        break;
    case PREC_CLEARING:
        start_report(c, g, ACT_CLEAR);
        break;
    case PREC_CLEAN:
        if (from == PREC_ALARMED || from == PREC_CLEARING)
            metrics_counter_inc(c->prec->alarms_cleared);
        g->bad_streak = g->good_streak = 0;
        free(g->moi);
        g->moi = NULL;
        break;
    default:
        break;
    }
    count_active(c->prec);
    return true;
}

/* ---- samples ------------------------------------------------------------------------ */

static void params_from(const struct ccfg *cfg, struct qck_params *q)
{
    qck_params_default(q);
    q->min_tokens = cfg->prec_min_tokens;
    q->garbled = cfg->prec_logprobs >= 3;
    q->rare = cfg->prec_logprobs >= 5;
    if (cfg->prec_common_chars && *cfg->prec_common_chars) {
        char err[160];
        struct qck_charset cs;
        if (qck_charset_parse(&cs, cfg->prec_common_chars, err, sizeof(err)) == 0)
            q->common = cs; /* validated at load: always */
    }
}

static void on_sample(struct coord *c, int64_t p_id, int64_t d_id, const struct qck_acc *acc)
{
    struct prec *p = c->prec;
    struct qck_params q;
    params_from(&c->cfg, &q);
    struct qck_verdict v;
    qck_check(acc, &q, &v);
    const char *verdict = !v.valid ? "invalid" : v.bad ? "bad" : "good";
    metrics_counter_inc(metrics_counter_labels(p->samples, "verdict", verdict));
    log_at(v.bad ? LOG_WARN : LOG_DEBUG, "precision_sample", LF_INT("p_instance_id", p_id),
           LF_INT("d_instance_id", d_id), LF_STR("verdict", verdict),
           LF_STR("fault", qck_fault_name(v.bad)), LF_INT("tokens", acc->n),
           LF_INT("period", v.period), LF_INT("repeat_tokens", v.repeat_tokens),
           LF_DBL("distinct_4gram", v.distinct_4gram), LF_INT("low_conf_run", v.low_conf_run),
           LF_DBL("low_conf_share", v.low_conf_share), LF_INT("invalid_chars", v.invalid_chars),
           LF_DBL("rare_share", v.rare_share));
    if (!v.valid)
        return;
    struct prec_group *g = v.bad ? group_get(p, p_id, d_id) : group_find(p, p_id, d_id);
    if (!g)
        return; /* a good sample of a group without history: nothing to count */
    switch (g->st) {
    case PREC_CLEAN:
        if (!v.bad) {
            g->bad_streak = 0;
            if (!g->act) { /* nothing to remember */
                group_unlink(p, g);
                group_free(g);
            }
            return;
        }
        if (++g->bad_streak >= c->cfg.prec_issue_threshold)
            group_step(c, g, PREC_EV_ISSUE_THRESHOLD, qck_fault_name(v.bad));
        break;
    case PREC_ALARMED:
        if (v.bad) {
            g->good_streak = 0;
            return;
        }
        if (++g->good_streak >= c->cfg.prec_clear_threshold)
            group_step(c, g, PREC_EV_CLEAR_THRESHOLD, "good samples");
        break;
    case PREC_PROBING:
    case PREC_CLEARING:
    default:
        break; /* an action is out: it decides */
    }
}

static void on_pending(void *arg)
{
    struct coord *c = arg;
    struct prec *p = c->prec;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    struct prec_pending *list = p->pend_head;
    p->pend_head = p->pend_tail = NULL;
    p->n_pend = 0;
    p->posted = false;
    pthread_mutex_unlock(&p->mu);
    bool stopping = !c->mgmt_httpc;
    while (list) {
        struct prec_pending *e = list;
        list = e->next;
        if (!stopping)
            on_sample(c, e->p_id, e->d_id, e->acc);
        qck_acc_release(e->acc);
        free(e->acc);
        free(e);
    }
}

/* ---- the probe ---------------------------------------------------------------------- */

static void probe_done(const struct httpc_response *resp, void *arg);

static void probe_send(struct coord *c, struct prec_group *g)
{
    struct prec_action *a = g->act;
    char url[320], pin[128], auth[600];
    /* our own inference port, where it listens: the loopback unless bound elsewhere */
    const char *h = c->cfg.host;
    bool any = !h || !*h || strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0;
    bool v6 = !any && strchr(h, ':');
    const struct ccfg_tls *t = &c->cfg.infer_tls;
    snprintf(url, sizeof(url), "%s://%s%s%s:%u/v1/chat/completions", t->enable ? "https" : "http",
             v6 ? "[" : "", any ? "127.0.0.1" : h, v6 ? "]" : "", c->infer_port);
    /* Over TLS the probe is a client of our own port: it presents the port's own
     * certificate (a mutual-TLS port whose CA signed it accepts it; one that does not
     * fails the probe, and the alarm says so). The server is not verified: the address
     * is this process's own listening socket, which nobody else can hold while we do, and
     * its certificate names the service, not the loopback. */
    struct httpc_tls tls = {.cert_file = t->cert_file,
                            .key_file = t->key_file,
                            .key_password = t->key_password,
                            .insecure = true};
    snprintf(pin, sizeof(pin), "X-Motor-Precision-Probe: %s %lld %lld", c->prec->secret,
             (long long)g->p_id, (long long)g->d_id);
    const char *hdrs[3] = {pin, NULL, NULL};
    if (c->cfg.api_key_enable && c->cfg.n_api_keys) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", c->cfg.api_keys[0]);
        hdrs[1] = auth;
    }
    json_t *body = json_pack("{s:[{s:s, s:s}], s:i, s:b, s:f}", "messages", "role", "user",
                             "content", c->cfg.prec_probe_question, "max_tokens",
                             PREC_PROBE_MAX_TOKENS, "stream", 0, "temperature", 0.0);
    char *s = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = s,
        .content_type = "application/json",
        .headers = hdrs,
        .timeout_ms = c->cfg.prec_probe_timeout_ms,
        .max_response = 1 << 20,
        .tls = t->enable ? &tls : NULL,
    };
    g->probe_attempts++;
    log_info("precision_probe", LF_INT("p_instance_id", g->p_id), LF_INT("d_instance_id", g->d_id),
             LF_INT("attempt", g->probe_attempts));
    a->h = httpc_request(c->mgmt_httpc, &o, probe_done, a);
    explicit_bzero(auth, sizeof(auth));
    free(s);
}

static void start_probe(struct coord *c, struct prec_group *g)
{
    if (c->cfg.prec_probe_attempts == 0) {
        /* No probe: the alarm goes out at once. */
        start_report(c, g, ACT_RAISE);
        return;
    }
    struct prec_action *a = xcalloc(1, sizeof(*a));
    a->c = c;
    a->g = g;
    a->kind = ACT_PROBE;
    g->act = a;
    probe_send(c, g);
}

static bool probe_passed(const struct httpc_response *resp, const char *expected)
{
    if (resp->error || resp->status != 200)
        return false;
    json_t *j = json_loadb(resp->body, resp->body_len, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *content = json_string_value(json_object_get(msg, "content"));
    bool ok = content && strstr(content, expected) != NULL;
    json_decref(j);
    return ok;
}

static void probe_done(const struct httpc_response *resp, void *arg)
{
    struct prec_action *a = arg;
    a->h = NULL;
    struct coord *c = a->c;
    struct prec_group *g = a->g;
    if (!g) { /* the group moved on */
        free(a);
        return;
    }
    bool ok = probe_passed(resp, c->cfg.prec_probe_answer);
    if (!ok) {
        g->probe_failures++;
        metrics_counter_inc(c->prec->probes_failed);
    }
    log_info("precision_probe_done", LF_INT("p_instance_id", g->p_id),
             LF_INT("d_instance_id", g->d_id), LF_BOOL("passed", ok),
             LF_INT("status", resp->status), LF_STR("error", resp->error_text));
    if (!ok && g->probe_attempts < c->cfg.prec_probe_attempts) {
        probe_send(c, g);
        return;
    }
    g->act = NULL;
    free(a);
    start_report(c, g, ACT_RAISE);
}

/* ---- reports to the controller ------------------------------------------------------ */

static json_t *alarm_json(struct coord *c, struct prec_group *g, bool clear)
{
    char info[256];
    char pbuf[24];
    if (g->p_id >= 0)
        snprintf(pbuf, sizeof(pbuf), "%lld", (long long)g->p_id);
    else
        snprintf(pbuf, sizeof(pbuf), "None");
    snprintf(info, sizeof(info),
             "precision_issue_count=%d, probe_failure_count=%d, p_instance_id=%s, "
             "d_instance_id=%lld",
             g->issue_count, g->probe_failures, pbuf, (long long)g->d_id);
    json_t *j =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:I}", "alarm_id", PREC_ALARM_ID,
                  "alarm_name", PREC_ALARM_NAME, "category", clear ? "CLEAR" : "ALARM", "severity",
                  "MAJOR", "event_type", "PROCESSING_ERROR", "instance_id", (json_int_t)g->d_id,
                  "p_instance_id", g->p_id >= 0 ? pbuf : "", "moi", g->moi,
                  "additional_information", info, "timestamp", (json_int_t)util_wall_ms());
    if (g->p_id >= 0)
        json_object_set_new(j, "p_instance_id", json_integer(g->p_id));
    return j;
}

static void report_done(const struct httpc_response *resp, void *arg);

static void start_report(struct coord *c, struct prec_group *g, enum act_kind kind)
{
    if (kind == ACT_RAISE) {
        /* the address this coordinator is known by: its bind address, or the pod's
         * when it listens on every interface */
        const char *ip = c->cfg.host;
        const char *pod = getenv("POD_IP");
        if ((!ip || !*ip || !strcmp(ip, "0.0.0.0") || !strcmp(ip, "::")) && pod && *pod)
            ip = pod;
        free(g->moi);
        g->moi = prec_moi(ip ? ip : "", g->p_id, g->d_id);
    }
    struct prec_action *a = xcalloc(1, sizeof(*a));
    a->c = c;
    a->g = g;
    a->kind = kind;
    g->act = a;
    json_t *alarms = json_array();
    json_array_append_new(alarms, alarm_json(c, g, kind == ACT_CLEAR));
    /* The controller's API is TLS when the deploy block's mgmt_tls_config is on (that
     * block is the controller's too); its certificate is then ours as a client. */
    const struct ccfg_tls *m = &c->cfg.mgmt_tls;
    char url[320];
    snprintf(url, sizeof(url), "%s://%s:%d/controller/report_alarms", m->enable ? "https" : "http",
             c->cfg.ctl_host, c->cfg.ctl_port);
    log_warn(kind == ACT_CLEAR ? "precision_alarm_clear" : "precision_alarm_raise",
             LF_INT("p_instance_id", g->p_id), LF_INT("d_instance_id", g->d_id),
             LF_STR("moi", g->moi), LF_INT("precision_issue_count", g->issue_count),
             LF_INT("probe_failure_count", g->probe_failures), LF_STR("url", url));
    struct httpc_tls tls = {.ca_file = m->ca_file,
                            .cert_file = m->cert_file,
                            .key_file = m->key_file,
                            .key_password = m->key_password};
    char *body = json_dumps(alarms, JSON_COMPACT);
    struct httpc_opts o = {.method = "POST",
                           .url = url,
                           .body = body,
                           .timeout_ms = PREC_REPORT_TIMEOUT_MS,
                           .tls = m->enable ? &tls : NULL};
    a->h = httpc_request(c->mgmt_httpc, &o, report_done, a);
    free(body);
    json_decref(alarms);
}

static void report_done(const struct httpc_response *resp, void *arg)
{
    struct prec_action *a = arg;
    a->h = NULL;
    struct coord *c = a->c;
    struct prec_group *g = a->g;
    enum act_kind kind = a->kind;
    if (!g) {
        free(a);
        return;
    }
    g->act = NULL;
    free(a);
    bool ok = !resp->error && resp->status >= 200 && resp->status < 300;
    if (kind == ACT_CLEAR && !resp->error && (resp->status == 404 || resp->status == 409)) {
        /* The controller holds no such alarm (it recovered the group, or an operator
         * cleared it): nothing is left to clear, and asking again would not change that. */
        log_warn("precision_clear_not_held", LF_INT("p_instance_id", g->p_id),
                 LF_INT("d_instance_id", g->d_id), LF_INT("status", resp->status));
        ok = true;
    }
    bool recovered = false;
    if (ok && kind == ACT_RAISE) {
        json_t *j = json_loadb(resp->body, resp->body_len, 0, NULL);
        json_t *d = json_object_get(j, "data");
        recovered = json_is_true(json_object_get(d, "precision_alarm_cleared_by_auto_recovery")) ||
                    json_is_true(json_object_get(j, "precision_alarm_cleared_by_auto_recovery"));
        json_decref(j);
    }
    if (!ok) {
        char why[160];
        snprintf(why, sizeof(why), "controller answered %ld%s%s", resp->status,
                 resp->error ? ": " : "", resp->error_text);
        log_warn("precision_report_failed", LF_INT("p_instance_id", g->p_id),
                 LF_INT("d_instance_id", g->d_id), LF_STR("error", why));
        if (kind == ACT_RAISE) {
            int streak = c->cfg.prec_issue_threshold - 1;
            group_step(c, g, PREC_EV_RAISE_FAILED, why);
            g->bad_streak = streak; /* the next bad sample tries again */
        } else {
            group_step(c, g, PREC_EV_CLEAR_FAILED, why);
            g->good_streak = c->cfg.prec_clear_threshold - 1;
        }
        return;
    }
    if (kind == ACT_CLEAR) {
        group_step(c, g, PREC_EV_CLEARED, "controller took the clear");
        return;
    }
    group_step(c, g, PREC_EV_RAISED, "controller took the alarm");
    if (recovered && g->st == PREC_ALARMED)
        group_step(c, g, PREC_EV_RECOVERED, "cleared by the controller's auto-recovery");
}

/* ---- management routes -------------------------------------------------------------- */

static bool read_id(json_t *body, const char *key, bool required, int64_t *out, char *err,
                    size_t cap)
{
    json_t *v = json_object_get(body, key);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(err, cap, "'%s' is required", key);
            return false;
        }
        *out = -1;
        return true;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = json_integer_value(v);
        return true;
    }
    /* upstream sends ids as strings now and then */
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (*s && !errno && !*end && x >= 0) {
            *out = x;
            return true;
        }
        if (!*s && !required) {
            *out = -1;
            return true;
        }
    }
    snprintf(err, cap, "'%s' must be a non-negative integer instance id", key);
    return false;
}

static void h_alarm_cleared(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    size_t len;
    const char *raw = httpd_req_body(req, &len);
    json_error_t e;
    json_t *body = raw && len ? json_loadb(raw, len, 0, &e) : NULL;
    char err[160];
    int64_t p_id, d_id;
    if (!json_is_object(body)) {
        httpd_respond_error(req, 400, "body must be a JSON object {d_instance_id, p_instance_id?}");
        goto out;
    }
    if (!read_id(body, "d_instance_id", true, &d_id, err, sizeof(err)) ||
        !read_id(body, "p_instance_id", false, &p_id, err, sizeof(err))) {
        httpd_respond_error(req, 400, err);
        goto out;
    }
    struct prec_group *g = group_find(c->prec, p_id, d_id);
    if (!g || g->st == PREC_CLEAN) {
        char msg[160];
        snprintf(msg, sizeof(msg), "no precision alarm state for PD group (%lld, %lld)",
                 (long long)p_id, (long long)d_id);
        httpd_respond_error(req, 404, msg);
        goto out;
    }
    enum prec_state was = g->st;
    group_step(c, g, PREC_EV_RECOVERED, "POST /precision/alarm_cleared");
    group_unlink(c->prec, g);
    group_free(g);
    json_t *data = json_pack("{s:I, s:s}", "d_instance_id", (json_int_t)d_id, "previous_state",
                             prec_state_name(was));
    json_object_set_new(data, "p_instance_id", p_id >= 0 ? json_integer(p_id) : json_null());
    httpd_respond_json(req, 200,
                       json_pack("{s:s, s:s, s:o}", "status", "success", "message",
                                 "precision alarm state cleared", "data", data));
out:
    json_decref(body);
}

static void h_status(struct httpd_req *req, void *arg)
{
    struct coord *c = arg;
    json_t *groups = json_array();
    for (struct prec_group *g = c->prec->groups; g; g = g->next) {
        json_t *o = json_pack("{s:I, s:s, s:i, s:i}", "d_instance_id", (json_int_t)g->d_id, "state",
                              prec_state_name(g->st), "bad_streak", g->bad_streak, "good_streak",
                              g->good_streak);
        json_object_set_new(o, "p_instance_id", g->p_id >= 0 ? json_integer(g->p_id) : json_null());
        if (g->moi)
            json_object_set_new(o, "moi", json_string(g->moi));
        json_array_append_new(groups, o);
    }
    httpd_respond_json(
        req, 200,
        json_pack("{s:b, s:o}", "precision_check_enabled", c->cfg.prec_enable, "groups", groups));
}

void prec_register_routes(struct coord *c)
{
    httpd_route(c->mgmt, "POST", "/precision/alarm_cleared", h_alarm_cleared, c, HTTPD_ROUTE_AUTH);
    httpd_route(c->mgmt, "GET", "/precision/status", h_status, c, HTTPD_ROUTE_AUTH);
}
