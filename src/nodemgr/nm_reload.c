/* nm_reload — configuration hot reload (§3.7).
 *
 * inotify watches the config file's *directory*: editors and Kubernetes replace files by
 * rename (ConfigMaps swap a `..data` symlink), which a watch on the file itself would
 * miss. Relevant events are debounced, then the file is reloaded with the same role,
 * environment snapshot and binary. An invalid file keeps the old config (and says why);
 * a valid one is swapped in whole. What takes effect at once: log level, heartbeat
 * interval (also the arbitration period, unlike upstream), probe settings
 * (health_check_config), the Controller address, FT polling switches, and everything read
 * when engines are next launched. What needs a restart is what the configuration table
 * marks so (rows without CFGTAB_LIVE: bind address and port, TLS material, the
 * management key, standalone/KV mode, the endpoint layout); the changed ones are logged
 * by key (nm_config_restart_keys). */
#include "nodemgr/nm_internal.h"
#include "nodemgr/nm_ports.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define RELOAD_DEBOUNCE_MS 100

/* Identity of the file content as the file system sees it (follows symlinks). */
static char *file_sig(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) < 0)
        return NULL;
    return xasprintf("%llu:%llu:%lld:%lld.%09ld", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

int nm_reload_now(struct nodemgr *nm)
{
    const char *path = nm->cfg->config_path;
    char *sig = file_sig(path);
    if (sig && nm->loaded_sig && strcmp(sig, nm->loaded_sig) == 0) {
        log_debug("config_unchanged", LF_STR("path", path));
        free(sig);
        return 0;
    }
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *next = nm_config_reload(nm->cfg, &errs);
    free(nm->loaded_sig);
    nm->loaded_sig = sig;
    if (!next) {
        metrics_counter_inc(nm->m.reloads_failed);
        log_error("config_reload_failed", LF_STR("path", path),
                  LF_INT("errors", cfg_errors_count(&errs)),
                  LF_STR("detail", cfg_errors_text(&errs)),
                  LF_STR("action", "keeping the previous configuration"));
        cfg_errors_release(&errs);
        return -EINVAL;
    }
    cfg_errors_release(&errs);
    struct nm_config *old = nm->cfg;
    nm_ports_carry(old, next);
    char *diff = nm_config_diff(old, next);
    char *restart = nm_config_restart_keys(old, next);
    nm->cfg = next;

    enum log_level lvl;
    if (log_parse_level(next->log_level, &lvl) == 0)
        log_set_level(lvl);
    nm_ctrl_reconfigure(nm);
    nm_ctrl_heartbeat_reconfigure(nm);
    nm_arb_reconfigure(nm);
    nm_engine_probes_reconfigure(nm);
    nm_ft_config_updated(nm);
    metrics_counter_inc(nm->m.reloads_ok);
    log_info("config_reloaded", LF_STR("path", path), LF_STR("changed", diff ? diff : ""),
             LF_STR("log_level", next->log_level),
             LF_DBL("heartbeat_interval_seconds", next->heartbeat_interval_seconds),
             LF_INT("health_collector_timeout", next->health.health_collector_timeout),
             LF_INT("startup_timeout", next->health.startup_timeout));
    if (restart)
        log_warn("config_reload_restart_required", LF_STR("settings", restart));
    for (size_t i = 0; i < next->warnings.n; i++)
        log_warn("config_warning", LF_STR("warning", next->warnings.items[i]));
    free(diff);
    free(restart);
    nm_config_free(old);
    return 0;
}

static void reload_fire(struct reactor *r, void *arg)
{
    (void)r;
    nm_reload_now(arg);
}

static void on_inotify(struct reactor *r, int fd, uint32_t events, void *arg)
{
    (void)r;
    (void)events;
    struct nodemgr *nm = arg;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool relevant = false;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof(*ev) + ev->len;
            if (ev->mask & IN_Q_OVERFLOW) {
                relevant = true;
                continue;
            }
            if (ev->len == 0)
                continue;
            /* The file itself, or Kubernetes' ..data / ..<timestamp> swap. */
            if (strcmp(ev->name, nm->watch_name) == 0 || strncmp(ev->name, "..", 2) == 0)
                relevant = true;
        }
    }
    if (relevant && !nm_shutting_down(nm))
        nm_timer_start(nm->r, &nm->reload_timer, reload_fire, nm, RELOAD_DEBOUNCE_MS, 0);
}

int nm_reload_init(struct nodemgr *nm)
{
    nm->inotify_fd = -1;
    nm->inotify_wd = -1;
    const char *path = nm->cfg->config_path;
    if (!path || !*path)
        return 0;
    nm->loaded_sig = file_sig(path);
    if (nm->cfg->enable_snapshot) {
        log_info("config_watch_disabled", LF_STR("why", "snapshot enabled"));
        return 0;
    }
    char *d = xstrdup(path), *b = xstrdup(path);
    nm->watch_dir = xstrdup(dirname(d));
    nm->watch_name = xstrdup(basename(b));
    free(d);
    free(b);
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) {
        log_warn("config_watch_failed", LF_STR("error", strerror(errno)),
                 LF_STR("hint", "raise fs.inotify.max_user_instances; SIGHUP still reloads"));
        return 0;
    }
    int wd = inotify_add_watch(fd, nm->watch_dir,
                               IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_ATTRIB | IN_DELETE);
    if (wd < 0) {
        log_warn("config_watch_failed", LF_STR("dir", nm->watch_dir),
                 LF_STR("error", strerror(errno)),
                 LF_STR("hint", errno == ENOSPC ? "raise fs.inotify.max_user_watches" : ""));
        close(fd);
        return 0;
    }
    int rc = reactor_add_fd(nm->r, fd, EPOLLIN, on_inotify, nm);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    nm->inotify_fd = fd;
    nm->inotify_wd = wd;
    log_info("config_watch", LF_STR("dir", nm->watch_dir), LF_STR("file", nm->watch_name));
    return 0;
}

void nm_reload_free(struct nodemgr *nm)
{
    reactor_timer_stop(nm->r, &nm->reload_timer);
    if (nm->inotify_fd >= 0) {
        reactor_del_fd(nm->r, nm->inotify_fd);
        close(nm->inotify_fd);
        nm->inotify_fd = -1;
    }
    free(nm->watch_dir);
    free(nm->watch_name);
    free(nm->loaded_sig);
    nm->watch_dir = nm->watch_name = nm->loaded_sig = NULL;
}
