/* nm_ports — see nm_ports.h. A probe is a real bind + listen: connect-based checks miss
 * a port bound but not yet listening, and a bare bind without listen can succeed next to
 * a listener on another address of the same port. */
#include "nodemgr/nm_ports.h"

#include "common/log.h"
#include "common/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NM_PORTS_RETRY_MS 50 /* pause between probes of a busy port within the timeout */
#define NM_PORTS_MAX 1024    /* API + service ports + reserved TCPStore ports */

bool nm_ports_free(const char *host, int port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t len;
    int family;
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        family = v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        len = sizeof(*v4);
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        family = v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        len = sizeof(*v6);
    } else {
        return false;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    bool ok = bind(fd, (struct sockaddr *)&ss, len) == 0 && listen(fd, 1) == 0;
    close(fd);
    return ok;
}

struct taken {
    int ports[NM_PORTS_MAX];
    size_t n;
};

static bool is_taken(const struct taken *t, int port)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->ports[i] == port)
            return true;
    return false;
}

static void take(struct taken *t, int port)
{
    if (t->n < NM_PORTS_MAX)
        t->ports[t->n++] = port;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Free right now, or after waiting up to timeout_ms for it to become free. */
static bool free_within(const char *host, int port, int64_t timeout_ms)
{
    int64_t deadline = util_mono_ms() + timeout_ms;
    for (;;) {
        if (nm_ports_free(host, port))
            return true;
        if (util_mono_ms() >= deadline)
            return false;
        sleep_ms(NM_PORTS_RETRY_MS);
    }
}

/* The port to use for `want`: itself when free (after the probe timeout), else the first
 * free one above it within range. 0 when none. */
static int pick(const struct nm_config *cfg, struct taken *t, int want)
{
    const char *host = cfg->port_alloc_bind_host;
    int64_t timeout_ms = (int64_t)(cfg->port_alloc_probe_timeout_seconds * 1000.0);
    if (!is_taken(t, want) && free_within(host, want, timeout_ms))
        return want;
    for (int p = want + 1; p <= want + cfg->port_alloc_scan_range && p <= 65535; p++)
        if (!is_taken(t, p) && nm_ports_free(host, p))
            return p;
    return 0;
}

int nm_ports_allocate(struct nm_config *cfg, bool api_port_fixed, char *err, size_t cap)
{
    if (!cfg->port_alloc_enable)
        return 0;
    struct taken *t = xcalloc(1, sizeof(*t));
    int rc = 0;
    json_t *matrix = json_array();

    /* Reserved first, so no scan hands them out: the per-rank TCPStore ports. */
    if (cfg->ft.enable_dp_scale_down_proxy) {
        for (int r = 0; r < cfg->parallel.dp_size; r++) {
            int p = cfg->dp_master_port + r;
            if (p > 65535) {
                snprintf(err, cap,
                         "port_allocator_config: DP scale-down TCPStore port %d (dp_master_port "
                         "%d + rank %d) is beyond 65535",
                         p, cfg->dp_master_port, r);
                rc = -EADDRINUSE;
                goto out;
            }
            /* Busy is only worth a warning: the store is served by an engine (rank 0 of
             * the group), which may be up already or be another pod's on this host. */
            if (!nm_ports_free(cfg->port_alloc_bind_host, p))
                log_warn("dp_store_port_busy", LF_INT("port", p), LF_INT("dp_rank", r),
                         LF_STR("bind_host", cfg->port_alloc_bind_host));
            take(t, p);
        }
        json_array_append_new(matrix, json_pack("{s:s,s:i,s:i,s:i}", "what", "dp_store_ports",
                                                "first", cfg->dp_master_port, "last",
                                                cfg->dp_master_port + cfg->parallel.dp_size - 1,
                                                "count", cfg->parallel.dp_size));
    }
    if (!api_port_fixed) {
        int want = cfg->node_manager_port;
        int got = pick(cfg, t, want);
        if (!got) {
            snprintf(err, cap,
                     "port_allocator_config: no free port for the node manager API in %d-%d on %s",
                     want, MOTOR_MIN(want + cfg->port_alloc_scan_range, 65535),
                     cfg->port_alloc_bind_host);
            rc = -EADDRINUSE;
            goto out;
        }
        take(t, got);
        cfg->node_manager_port_requested = want;
        cfg->node_manager_port = got;
        json_array_append_new(matrix, json_pack("{s:s,s:i,s:i}", "what", "node_manager_api",
                                                "requested", want, "port", got));
    }
    for (int i = 0; i < cfg->endpoint_num; i++) {
        int want = cfg->service_ports[i];
        int got = pick(cfg, t, want);
        if (!got) {
            snprintf(err, cap,
                     "port_allocator_config: no free port for endpoint %d in %d-%d on %s", i, want,
                     MOTOR_MIN(want + cfg->port_alloc_scan_range, 65535),
                     cfg->port_alloc_bind_host);
            rc = -EADDRINUSE;
            goto out;
        }
        take(t, got);
        cfg->service_ports[i] = got;
        json_array_append_new(matrix, json_pack("{s:s,s:i,s:i,s:i}", "what", "engine_service",
                                                "endpoint", i, "requested", want, "port", got));
    }
    for (size_t i = 0; i < json_array_size(matrix); i++) {
        json_t *row = json_array_get(matrix, i);
        json_t *req = json_object_get(row, "requested");
        if (req && json_integer_value(req) != json_integer_value(json_object_get(row, "port")))
            log_warn("port_reassigned", LF_STR("what", json_string_value(json_object_get(row, "what"))),
                     LF_INT("requested", json_integer_value(req)),
                     LF_INT("port", json_integer_value(json_object_get(row, "port"))),
                     LF_STR("why", "requested port busy"));
    }
    char *text = json_dumps(matrix, JSON_COMPACT);
    log_info("port_matrix", LF_STR("bind_host", cfg->port_alloc_bind_host),
             LF_RAW("ports", text ? text : "[]"));
    free(text);
out:
    json_decref(matrix);
    free(t);
    return rc;
}

void nm_ports_carry(const struct nm_config *old, struct nm_config *next)
{
    if (!old->port_alloc_enable || !next->port_alloc_enable)
        return;
    if (old->node_manager_port_requested &&
        next->node_manager_port == old->node_manager_port_requested) {
        next->node_manager_port_requested = old->node_manager_port_requested;
        next->node_manager_port = old->node_manager_port;
    }
    if (old->endpoint_num != next->endpoint_num || old->base_port != next->base_port)
        return; /* a new layout: it applies to the next start command (restart warned) */
    for (int i = 0; i < next->endpoint_num; i++)
        next->service_ports[i] = old->service_ports[i];
}
