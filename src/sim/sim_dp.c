/* sim_dp — a simulated data-parallel group, so that a DP peer's death is felt by the
 * survivors the way vLLM's ranks feel it (their collectives fail): they turn
 * "unhealthy", which is what the controller's DP scale-down waits for before it sends
 * fault_tolerance/apply.
 *
 * With --data-parallel-size > 1, --data-parallel-address and --data-parallel-rpc-port
 * (what the node manager passes to every rank), rank 0 listens on that address and
 * every other rank connects and says hello. Once the group is formed, a lost
 * connection breaks it: the master marks itself unhealthy and closes every other member
 * (which then see EOF and turn unhealthy too); a member that loses the master turns
 * unhealthy. An FT apply (scale_down/retry) or a "recover" fault dissolves the group
 * (no monitoring afterwards). Setup problems (the port is taken, the master never
 * answers) only log: the engine serves regardless. */
#include "common/log.h"
#include "common/util.h"
#include "sim/sim_internal.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SIM_DP_RETRY_MS 200
#define SIM_DP_HELLO_MAX 64

struct dp_peer {
    int fd;
    int rank; /* -1 until its hello arrived */
    char buf[SIM_DP_HELLO_MAX];
    size_t len;
};

struct sim_dp {
    struct sim *s;
    bool master;
    bool formed;   /* every rank joined (master) / hello sent (member) */
    bool finished; /* broken or dissolved: no more monitoring */
    int listen_fd; /* master */
    struct dp_peer *peers;
    int n_peers, cap_peers, joined;
    int fd; /* member: connection to the master, -1 when none */
    bool connecting;
    struct reactor_timer retry;
};

static void close_fd(struct sim_dp *dp, int *fd)
{
    if (*fd < 0)
        return;
    if (reactor_has_fd(dp->s->r, *fd))
        reactor_del_fd(dp->s->r, *fd);
    close(*fd);
    *fd = -1;
}

static void close_all(struct sim_dp *dp)
{
    for (int i = 0; i < dp->n_peers; i++)
        close_fd(dp, &dp->peers[i].fd);
    dp->n_peers = 0;
    dp->joined = 0;
    close_fd(dp, &dp->listen_fd);
    close_fd(dp, &dp->fd);
    reactor_timer_stop(dp->s->r, &dp->retry);
}

/* The group is broken: this rank's collectives would fail from now on. */
static void group_broken(struct sim_dp *dp, const char *info, int lost_rank)
{
    struct sim *s = dp->s;
    dp->finished = true;
    close_all(dp);
    if (s->phase == SIM_STOPPING)
        return;
    log_warn("sim_dp_peer_lost", LF_INT("dp_rank", s->args.dp_rank), LF_INT("lost_rank", lost_rank),
             LF_STR("effect", "unhealthy until a fault-tolerance apply or recover"));
    if (s->fault == SIM_FAULT_NONE) {
        s->fault = SIM_FAULT_UNHEALTHY;
        free(s->fault_info);
        s->fault_info = xstrdup(info);
    }
}

static int resolve(const char *host, int port, bool passive, struct addrinfo **out)
{
    char svc[8];
    snprintf(svc, sizeof(svc), "%d", port);
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    return getaddrinfo(host, svc, &hints, out);
}

/* ---- master ----------------------------------------------------------------------- */

static void on_peer(struct reactor *r, int fd, uint32_t events, void *arg);

static void drop_peer(struct sim_dp *dp, int i)
{
    close_fd(dp, &dp->peers[i].fd);
    if (dp->peers[i].rank >= 0)
        dp->joined--;
    dp->peers[i] = dp->peers[--dp->n_peers];
}

static void on_accept(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct sim_dp *dp = arg;
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0)
            return; /* EAGAIN, or a transient error: nothing to do */
        if (dp->n_peers == dp->cap_peers) {
            close(c); /* more connections than ranks: not one of ours */
            continue;
        }
        struct dp_peer *p = &dp->peers[dp->n_peers++];
        memset(p, 0, sizeof(*p));
        p->fd = c;
        p->rank = -1;
        reactor_add_fd(r, c, EPOLLIN | EPOLLRDHUP, on_peer, dp);
    }
}

static void on_peer(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct sim_dp *dp = arg;
    struct sim *s = dp->s;
    int i = 0;
    while (i < dp->n_peers && dp->peers[i].fd != fd)
        i++;
    if (i == dp->n_peers)
        return;
    struct dp_peer *p = &dp->peers[i];
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        int rank = p->rank;
        if (rank >= 0 && dp->formed) {
            char info[96];
            snprintf(info, sizeof(info), "DP group broken: rank %d lost", rank);
            group_broken(dp, info, rank);
            return;
        }
        log_info("sim_dp_peer_left", LF_INT("rank", rank),
                 LF_STR("why", "before the group formed"));
        drop_peer(dp, i);
        return;
    }
    if (p->rank >= 0)
        return; /* members say nothing after hello */
    size_t take = MOTOR_MIN((size_t)n, sizeof(p->buf) - 1 - p->len);
    memcpy(p->buf + p->len, buf, take);
    p->len += take;
    p->buf[p->len] = '\0';
    char *nl = strchr(p->buf, '\n');
    if (!nl) {
        if (p->len >= sizeof(p->buf) - 1)
            drop_peer(dp, i); /* not our protocol */
        return;
    }
    *nl = '\0';
    int rank, size;
    if (sscanf(p->buf, "sim-dp-hello %d %d", &rank, &size) != 2 || size != s->args.dp_size ||
        rank <= 0 || rank >= size) {
        log_warn("sim_dp_hello_rejected", LF_STR("hello", p->buf),
                 LF_INT("dp_size", s->args.dp_size),
                 LF_STR("why", "another group (different DP size) or not a simulator"));
        drop_peer(dp, i);
        return;
    }
    p->rank = rank;
    dp->joined++;
    log_info("sim_dp_rank_joined", LF_INT("rank", rank), LF_INT("joined", dp->joined + 1),
             LF_INT("dp_size", s->args.dp_size));
    if (!dp->formed && dp->joined == s->args.dp_size - 1) {
        dp->formed = true;
        log_info("sim_dp_group_formed", LF_INT("dp_size", s->args.dp_size),
                 LF_INT("dp_rank", s->args.dp_rank));
    }
}

static int master_start(struct sim_dp *dp)
{
    struct sim *s = dp->s;
    struct addrinfo *ai = NULL;
    int rc = resolve(s->args.dp_address, s->args.dp_rpc_port, true, &ai);
    if (rc) {
        log_warn("sim_dp_group_disabled", LF_STR("address", s->args.dp_address),
                 LF_STR("why", gai_strerror(rc)));
        return -EINVAL;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
        int e = errno;
        log_warn("sim_dp_group_disabled", LF_STR("address", s->args.dp_address),
                 LF_INT("port", s->args.dp_rpc_port), LF_STR("why", strerror(e)));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -e;
    }
    freeaddrinfo(ai);
    dp->listen_fd = fd;
    dp->cap_peers = s->args.dp_size - 1;
    dp->peers = xcalloc((size_t)dp->cap_peers, sizeof(*dp->peers));
    reactor_add_fd(s->r, fd, EPOLLIN, on_accept, dp);
    log_info("sim_dp_master_listening", LF_STR("address", s->args.dp_address),
             LF_INT("port", s->args.dp_rpc_port), LF_INT("dp_size", s->args.dp_size));
    return 0;
}

/* ---- member ----------------------------------------------------------------------- */

static void member_connect(struct sim_dp *dp);

static void on_member_retry(struct reactor *r, void *arg)
{
    member_connect(arg);
}

static void member_retry_later(struct sim_dp *dp)
{
    close_fd(dp, &dp->fd);
    dp->connecting = false;
    reactor_timer_start(dp->s->r, &dp->retry, SIM_DP_RETRY_MS, 0);
}

static void on_member(struct reactor *r, int fd, uint32_t events, void *arg)
{
    struct sim_dp *dp = arg;
    struct sim *s = dp->s;
    if (dp->connecting) {
        int err = 0;
        socklen_t len = sizeof(err);
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
            member_retry_later(dp); /* the master is not up yet */
            return;
        }
        dp->connecting = false;
        char hello[SIM_DP_HELLO_MAX];
        int n = snprintf(hello, sizeof(hello), "sim-dp-hello %d %d\n", s->args.dp_rank,
                         s->args.dp_size);
        if (write(fd, hello, (size_t)n) != n) {
            member_retry_later(dp);
            return;
        }
        dp->formed = true;
        reactor_mod_fd(r, fd, EPOLLIN | EPOLLRDHUP);
        log_info("sim_dp_joined", LF_INT("dp_rank", s->args.dp_rank),
                 LF_STR("master", s->args.dp_address), LF_INT("port", s->args.dp_rpc_port));
        return;
    }
    char buf[64];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0)
        group_broken(dp, "DP group broken: master rank 0 lost or group torn down", 0);
}

static void member_connect(struct sim_dp *dp)
{
    struct sim *s = dp->s;
    if (dp->finished)
        return;
    struct addrinfo *ai = NULL;
    if (resolve(s->args.dp_address, s->args.dp_rpc_port, false, &ai)) {
        reactor_timer_start(s->r, &dp->retry, SIM_DP_RETRY_MS * 5, 0);
        return;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        reactor_timer_start(s->r, &dp->retry, SIM_DP_RETRY_MS, 0);
        return;
    }
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    dp->fd = fd;
    dp->connecting = true;
    if (rc < 0 && errno != EINPROGRESS) {
        member_retry_later(dp);
        return;
    }
    reactor_add_fd(s->r, fd, EPOLLOUT | EPOLLIN | EPOLLRDHUP, on_member, dp);
}

/* ---- API -------------------------------------------------------------------------- */

int sim_dp_start(struct sim *s)
{
    if (s->args.dp_size <= 1 || !s->args.dp_address || s->args.dp_rpc_port <= 0 || s->args.headless)
        return 0;
    struct sim_dp *dp = xcalloc(1, sizeof(*dp));
    dp->s = s;
    dp->listen_fd = -1;
    dp->fd = -1;
    reactor_timer_init(&dp->retry, on_member_retry, dp);
    s->dp = dp;
    if (s->args.dp_rank == 0) {
        dp->master = true;
        if (master_start(dp))
            dp->finished = true;
        return 0;
    }
    member_connect(dp);
    return 0;
}

void sim_dp_dissolve(struct sim *s, const char *why)
{
    struct sim_dp *dp = s->dp;
    if (!dp || dp->finished)
        return;
    dp->finished = true;
    close_all(dp);
    log_info("sim_dp_group_dissolved", LF_STR("why", why));
}

void sim_dp_free(struct sim *s)
{
    struct sim_dp *dp = s->dp;
    if (!dp)
        return;
    close_all(dp);
    free(dp->peers);
    free(dp);
    s->dp = NULL;
}
