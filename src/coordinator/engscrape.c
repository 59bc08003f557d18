/* engscrape — load from the engines: every engine_metrics_interval the management
 * thread GETs each endpoint's /metrics (engload.h) and leaves what it read in the
 * endpoint's shared load object, where the balancer finds it (balancer.h: foreign
 * work). One scrape per endpoint at a time; a reading is trusted for three intervals
 * (an engine that stops answering soon weighs only what this coordinator sends it). */
#include "coordinator/coord_internal.h"
#include "coordinator/engload.h"

#include "common/log.h"
#include "common/util.h"

#include <stdlib.h>

struct scrape {
    struct list_head link; /* on c->scrapes */
    struct httpc_req *h;
    struct coord *c;
    struct inst_load *load; /* a reference: the endpoint may leave the table meanwhile */
    int ours;
    int64_t period;
};

static void scrape_free(struct scrape *s)
{
    list_remove(&s->link);
    atomic_store(&s->load->eng_scraping, false);
    inst_load_unref(s->load);
    free(s);
}

static void on_metrics(const struct httpc_response *resp, void *arg)
{
    struct scrape *s = arg;
    struct engload el;
    if (!resp->error && resp->status == 200 && engload_parse(resp->body, resp->body_len, &el)) {
        struct inst_load *l = s->load;
        atomic_store_explicit(&l->eng_running_m, (long long)(el.running * 1000),
                              memory_order_relaxed);
        atomic_store_explicit(&l->eng_waiting_m, (long long)(el.waiting * 1000),
                              memory_order_relaxed);
        atomic_store_explicit(&l->eng_usage_m, (long long)(el.kv_usage * 1000),
                              memory_order_relaxed);
        /* The engine counted at some moment of the round trip: legs this coordinator
         * started meanwhile must not look foreign (the larger of the two counts). */
        int now_ours = atomic_load_explicit(&l->requests, memory_order_relaxed);
        int ours = MOTOR_MAX(s->ours, now_ours);
        atomic_store_explicit(&l->eng_ours, ours, memory_order_relaxed);
        long long excess = (long long)((el.running + el.waiting) * 1000) - (long long)ours * 1000;
        excess = MOTOR_MAX(0LL, excess);
        atomic_store_explicit(&l->eng_foreign_m, MOTOR_MIN(excess, l->eng_last_excess_m),
                              memory_order_relaxed);
        l->eng_last_excess_m = excess;
        atomic_store_explicit(&l->eng_until_ms, util_mono_ms() + 3 * s->period,
                              memory_order_release);
    }
    scrape_free(s);
}

static void on_tick(struct reactor *r, void *arg)
{
    (void)r;
    struct coord *c = arg;
    /* Engines are asked the way the workers talk to them (infer_tls_config). */
    struct csettings *set = csettings_pub_get(&c->settings);
    for (size_t i = 0; i < c->table.n; i++) {
        struct instance *in = c->table.v[i];
        for (size_t j = 0; j < in->n_eps; j++) {
            struct inst_endpoint *ep = &in->eps[j];
            if (ep->headless || !ep->load || atomic_exchange(&ep->load->eng_scraping, true))
                continue;
            struct scrape *s = xcalloc(1, sizeof(*s));
            s->c = c;
            s->load = inst_load_ref(ep->load);
            s->ours = atomic_load_explicit(&ep->load->requests, memory_order_relaxed);
            s->period = c->cfg.engine_metrics_ms;
            char url[320];
            snprintf(url, sizeof(url), "%s://%s/metrics", set->engine_tls ? "https" : "http",
                     ep->hostport);
            struct httpc_opts o = {.url = url,
                                   .timeout_ms = c->cfg.engine_metrics_ms,
                                   .max_response = 4u << 20,
                                   .tls = set->engine_tls ? &set->engine_tls_opts : NULL};
            list_insert_tail(&c->scrapes, &s->link);
            s->h = httpc_request(c->mgmt_httpc, &o, on_metrics, s);
        }
    }
    csettings_unref(set);
}

void engscrape_sync(struct coord *c)
{
    if (!c->scrape_timer_init) {
        reactor_timer_init(&c->scrape_timer, on_tick, c);
        list_init(&c->scrapes);
        c->scrape_timer_init = true;
    }
    reactor_timer_stop(c->r, &c->scrape_timer);
    if (c->cfg.engine_metrics_ms > 0)
        reactor_timer_start(c->r, &c->scrape_timer, c->cfg.engine_metrics_ms,
                            c->cfg.engine_metrics_ms);
}

void engscrape_stop(struct coord *c)
{
    if (!c->scrape_timer_init)
        return;
    reactor_timer_stop(c->r, &c->scrape_timer);
    struct list_head *n, *tmp;
    list_for_each_safe(n, tmp, &c->scrapes)
    {
        struct scrape *s = list_entry(n, struct scrape, link);
        httpc_cancel(c->mgmt_httpc, s->h);
        scrape_free(s);
    }
}
