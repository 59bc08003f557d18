/* pool_main — `motor worker-pool`: the worker pool alone on its own HTTP server, for
 * operators who want on-demand workers without inference engines (and for tests). The
 * same pool runs inside `motor node-manager`. */
#include "pool/pool_internal.h"

#include "common/cliopt.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define POOL_DEFAULT_PORT 1030

static void usage(FILE *out)
{
    fprintf(out,
            "usage: motor worker-pool [options]\n\n"
            "The worker pool alone: manifest-defined worker processes started on demand,\n"
            "reused up to a concurrency cap, reaped when idle, invoked over HTTP\n"
            "(POST /node-manager/pool/nodes/{id}/invoke). See docs/worker-pool.md.\n\n"
            "  --host ADDR         bind address (default 127.0.0.1)\n"
            "  --port N            port (default %d; 0 = ephemeral)\n"
            "  --manifests DIR     register every DIR/*.json manifest at start\n"
            "  --db PATH           SQLite file for manifests and instance records\n"
            "                      (default: in memory, nothing survives a restart)\n"
            "  --base-dir DIR      relative workdirs resolve here (default: --manifests)\n"
            "  --stop-grace-ms N   SIGTERM -> SIGKILL grace for workers (default 5000)\n"
            "  --api-key KEY       require X-Motor-Management-Key on management routes\n"
            "                      (default: $MOTOR_POOL_API_KEY, else none)\n"
            "  --log-level LEVEL   debug, info, warn, error (default info)\n"
            "  -h, --help          this text\n\n"
            "The bound port is logged as {\"event\":\"pool_listening\",\"port\":N,...}.\n",
            POOL_DEFAULT_PORT);
}

struct pool_main {
    struct reactor *r;
    struct httpd *h;
    struct pool *p;
    struct reactor_timer deadline;
    bool stopping;
};

static void on_drained(void *arg)
{
    struct pool_main *m = arg;
    log_info("pool_drained");
    reactor_stop(m->r);
}

static void on_deadline(struct reactor *r, void *arg)
{
    log_warn("pool_shutdown_deadline", LF_STR("why", "workers still running: killing them"));
    reactor_stop(r);
}

static void on_signal(struct reactor *r, int signo, void *arg)
{
    struct pool_main *m = arg;
    if (signo == SIGCHLD) {
        /* Subreaper: descendants that left their worker's group end up here. */
        proc_reap_orphans();
        return;
    }
    if (signo == SIGHUP) {
        log_info("signal_ignored", LF_INT("signal", signo));
        return;
    }
    if (m->stopping) {
        reactor_stop(r); /* second signal: do not wait */
        return;
    }
    m->stopping = true;
    log_info("pool_stopping", LF_INT("signal", signo));
    pool_shutdown(m->p, on_drained, m);
    reactor_timer_start(r, &m->deadline, m->p->cfg.stop_grace_ms + 2000, 0);
}

static void h_metrics(struct httpd_req *req, void *arg)
{
    struct pool_main *m = arg;
    struct strbuf sb;
    strbuf_init(&sb, 8u << 20);
    pool_render_metrics(m->p, &sb);
    if (sb.overflow) {
        strbuf_release(&sb);
        httpd_respond_error(req, 500, "metrics exposition too large");
        return;
    }
    httpd_respond(req, 200, METRICS_CONTENT_TYPE, strbuf_str(&sb), sb.len);
    strbuf_release(&sb);
}

static void h_health(struct httpd_req *req, void *arg)
{
    struct pool_main *m = arg;
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(m->stopping ? "stopping" : "ok"));
    json_object_set_new(o, "live_instances", json_integer((json_int_t)pool_live_instances(m->p)));
    httpd_respond_json(req, m->stopping ? 503 : 200, o);
}

int pool_main(int argc, char **argv)
{
    const char *host = "127.0.0.1", *log_level = NULL, *api_key = getenv("MOTOR_POOL_API_KEY");
    int port = POOL_DEFAULT_PORT;
    int64_t grace = -1;
    struct pool_config cfg;
    pool_config_init(&cfg);
    const struct cliopt opts[] = {
        {"host", 0, CLIOPT_STRING, &host, 0, 0, NULL},
        {"port", 0, CLIOPT_INT, &port, 0, 65535, "0-65535"},
        {"manifests", 0, CLIOPT_STRING, &cfg.manifests_dir, 0, 0, NULL},
        {"db", 0, CLIOPT_STRING, &cfg.db_path, 0, 0, NULL},
        {"base-dir", 0, CLIOPT_STRING, &cfg.base_dir, 0, 0, NULL},
        {"stop-grace-ms", 0, CLIOPT_I64, &grace, 0, 600000, "milliseconds in [0, 600000]"},
        {"api-key", 0, CLIOPT_STRING, &api_key, 0, 0, NULL},
        {"log-level", 0, CLIOPT_STRING, &log_level, 0, 0, NULL},
        {NULL, 0, 0, NULL, 0, 0, NULL},
    };
    int prc = cliopt_parse("motor worker-pool", argc, argv, opts, usage);
    if (prc)
        return prc == 1 ? 0 : prc;
    log_set_component("worker-pool");
    if (cliopt_log_level("motor worker-pool", log_level))
        return 2;
    signal(SIGPIPE, SIG_IGN);
    if (grace >= 0)
        cfg.stop_grace_ms = grace;
    if (api_key && *api_key)
        cfg.admin_route_flags = HTTPD_ROUTE_AUTH;

    struct pool_main m;
    memset(&m, 0, sizeof(m));
    int code = 1;
    m.r = reactor_new();
    if (!m.r) {
        log_error("reactor_failed", LF_STR("error", strerror(errno)));
        return 1;
    }
    reactor_timer_init(&m.deadline, on_deadline, &m);
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
    if (reactor_watch_signals(m.r, sigs, ARRAY_LEN(sigs), on_signal, &m) < 0) {
        log_error("signals_failed", LF_STR("error", strerror(errno)));
        goto out;
    }
    if (proc_become_subreaper() < 0)
        log_warn("pool_subreaper_failed", LF_STR("error", strerror(errno)));

    m.p = pool_new(m.r, &cfg);
    if (!m.p)
        goto out;
    static const char *const quiet[] = {"/health", "/metrics", NULL};
    struct httpd_config hc = {
        .name = "worker-pool",
        .host = host,
        .port = (uint16_t)port,
        .max_body = cfg.max_request,
        .api_key = (api_key && *api_key) ? api_key : NULL,
        .quiet_paths = quiet,
    };
    m.h = httpd_new(m.r, &hc);
    if (!m.h) {
        log_error("pool_listen_failed", LF_STR("host", host), LF_INT("port", port),
                  LF_STR("error", strerror(errno)));
        goto out;
    }
    pool_register_routes(m.p, m.h);
    httpd_route(m.h, "GET", "/health", h_health, &m, 0);
    httpd_route(m.h, "GET", "/metrics", h_metrics, &m, 0);
    log_info("pool_listening", LF_STR("host", host), LF_INT("port", httpd_port(m.h)),
             LF_INT("pid", getpid()));
    int rc = reactor_run(m.r);
    if (rc)
        log_error("reactor_error", LF_STR("error", strerror(-rc)));
    code = rc ? 1 : 0;
out:
    /* The pool first: its held requests are answered while the server still runs. */
    pool_free(m.p);
    httpd_free(m.h);
    if (m.r)
        reactor_timer_stop(m.r, &m.deadline);
    reactor_free(m.r);
    log_info("pool_exit", LF_INT("exit_code", code), LF_INT("pid", getpid()));
    return code;
}
