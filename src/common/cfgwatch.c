/* cfgwatch — inotify on the directories of the configuration files (see cfgwatch.h). */
#include "common/cfgwatch.h"

#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFGWATCH_MAX_DIRS 16

struct wdir {
    char *path;
    int wd;
    bool all;     /* a watched directory: every entry counts */
    char **names; /* basenames of the watched files in it */
    size_t n_names;
};

struct cfgwatch {
    struct reactor *r;
    char *what;
    int64_t debounce_ms;
    cfgwatch_fn fn;
    void *arg;
    int fd;
    struct reactor_timer timer;
    struct wdir dirs[CFGWATCH_MAX_DIRS];
    size_t n_dirs;
    char **files;
    size_t n_files;
    char *loaded; /* identity recorded by cfgwatch_mark, NULL = never */
};

char *cfgwatch_file_sig(const char *path)
{
    struct stat st;
    if (!path || stat(path, &st) < 0)
        return xstrdup("missing");
    return xasprintf("%llu:%llu:%lld:%lld.%09ld", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, (long long)st.st_size,
                     (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
}

static char *identity(const struct cfgwatch *w)
{
    struct strbuf sb;
    strbuf_init(&sb, 64 * 1024);
    for (size_t i = 0; i < w->n_files; i++) {
        char *s = cfgwatch_file_sig(w->files[i]);
        (void)strbuf_appendf(&sb, "%s=%s\n", w->files[i], s);
        free(s);
    }
    return strbuf_take(&sb);
}

bool cfgwatch_changed(const struct cfgwatch *w)
{
    if (!w->loaded)
        return true;
    char *now = identity(w);
    bool changed = strcmp(now, w->loaded) != 0;
    free(now);
    return changed;
}

void cfgwatch_mark(struct cfgwatch *w)
{
    free(w->loaded);
    w->loaded = identity(w);
}

bool cfgwatch_active(const struct cfgwatch *w)
{
    return w && w->fd >= 0;
}

static void fire(struct reactor *r, void *arg)
{
    (void)r;
    struct cfgwatch *w = arg;
    w->fn(w->arg);
}

static struct wdir *dir_of_wd(struct cfgwatch *w, int wd)
{
    for (size_t i = 0; i < w->n_dirs; i++)
        if (w->dirs[i].wd == wd)
            return &w->dirs[i];
    return NULL;
}

static bool relevant_name(const struct wdir *d, const char *name)
{
    if (d->all || strncmp(name, "..", 2) == 0) /* Kubernetes' ..data / ..<timestamp> swap */
        return true;
    for (size_t i = 0; i < d->n_names; i++)
        if (strcmp(d->names[i], name) == 0)
            return true;
    return false;
}

static void on_inotify(struct reactor *r, int fd, uint32_t events, void *arg)
{
    (void)events;
    struct cfgwatch *w = arg;
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
                relevant = true; /* events were lost: look again */
                continue;
            }
            if (ev->len == 0)
                continue;
            struct wdir *d = dir_of_wd(w, ev->wd);
            if (d && relevant_name(d, ev->name))
                relevant = true;
        }
    }
    if (relevant)
        reactor_timer_start(r, &w->timer, w->debounce_ms, 0);
}

static void dirs_release(struct cfgwatch *w)
{
    for (size_t i = 0; i < w->n_dirs; i++) {
        free(w->dirs[i].path);
        for (size_t k = 0; k < w->dirs[i].n_names; k++)
            free(w->dirs[i].names[k]);
        free(w->dirs[i].names);
    }
    memset(w->dirs, 0, sizeof(w->dirs));
    w->n_dirs = 0;
    for (size_t i = 0; i < w->n_files; i++)
        free(w->files[i]);
    free(w->files);
    w->files = NULL;
    w->n_files = 0;
}

static void fd_close(struct cfgwatch *w)
{
    if (w->fd < 0)
        return;
    reactor_del_fd(w->r, w->fd);
    close(w->fd);
    w->fd = -1;
}

/* The entry for directory path (added when new, NULL when the table is full). */
static struct wdir *dir_get(struct cfgwatch *w, const char *path, bool all)
{
    for (size_t i = 0; i < w->n_dirs; i++) {
        if (strcmp(w->dirs[i].path, path) == 0) {
            w->dirs[i].all |= all;
            return &w->dirs[i];
        }
    }
    if (w->n_dirs == CFGWATCH_MAX_DIRS) {
        log_warn("config_watch_skipped", LF_STR("what", w->what), LF_STR("dir", path),
                 LF_STR("why", "too many directories"));
        return NULL;
    }
    struct wdir *d = &w->dirs[w->n_dirs++];
    d->path = xstrdup(path);
    d->wd = -1;
    d->all = all;
    return d;
}

int cfgwatch_set(struct cfgwatch *w, const char *const *files, size_t n_files,
                 const char *const *dirs, size_t n_dirs)
{
    fd_close(w);
    dirs_release(w);
    w->files = xcalloc(n_files + 1, sizeof(char *));
    for (size_t i = 0; i < n_files; i++) {
        if (!files[i] || !*files[i])
            continue;
        bool dup = false;
        for (size_t k = 0; k < w->n_files; k++)
            dup |= strcmp(w->files[k], files[i]) == 0;
        if (dup)
            continue;
        w->files[w->n_files++] = xstrdup(files[i]);
        char *dcopy = xstrdup(files[i]), *bcopy = xstrdup(files[i]);
        struct wdir *d = dir_get(w, dirname(dcopy), false);
        if (d) {
            d->names = xrealloc(d->names, (d->n_names + 1) * sizeof(char *));
            d->names[d->n_names++] = xstrdup(basename(bcopy));
        }
        free(dcopy);
        free(bcopy);
    }
    for (size_t i = 0; i < n_dirs; i++)
        if (dirs[i] && *dirs[i])
            (void)dir_get(w, dirs[i], true);
    if (w->n_dirs == 0 || !w->fn)
        return 0;
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        log_warn("config_watch_failed", LF_STR("what", w->what), LF_STR("error", strerror(err)),
                 LF_STR("hint", "raise fs.inotify.max_user_instances; SIGHUP still reloads"));
        return -err;
    }
    size_t ok = 0;
    for (size_t i = 0; i < w->n_dirs; i++) {
        struct wdir *d = &w->dirs[i];
        d->wd = inotify_add_watch(fd, d->path,
                                  IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE |
                                      IN_ATTRIB | IN_DELETE);
        if (d->wd < 0) {
            int err = errno;
            log_warn("config_watch_failed", LF_STR("what", w->what), LF_STR("dir", d->path),
                     LF_STR("error", strerror(err)),
                     LF_STR("hint", err == ENOSPC ? "raise fs.inotify.max_user_watches; "
                                                    "SIGHUP still reloads"
                                                  : "SIGHUP still reloads"));
            continue;
        }
        ok++;
        struct strbuf names;
        strbuf_init(&names, 4096);
        for (size_t k = 0; k < d->n_names; k++)
            (void)strbuf_appendf(&names, "%s%s", k ? "," : "", d->names[k]);
        log_info("config_watch", LF_STR("what", w->what), LF_STR("dir", d->path),
                 LF_STR("file", d->all ? "*" : strbuf_str(&names)));
        strbuf_release(&names);
    }
    if (ok == 0) {
        close(fd);
        return -ENOENT;
    }
    int rc = reactor_add_fd(w->r, fd, EPOLLIN, on_inotify, w);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    w->fd = fd;
    return 0;
}

struct cfgwatch *cfgwatch_new(struct reactor *r, const char *what, int64_t debounce_ms,
                              cfgwatch_fn fn, void *arg)
{
    struct cfgwatch *w = xcalloc(1, sizeof(*w));
    w->r = r;
    w->what = xstrdup(what ? what : "config");
    w->debounce_ms = debounce_ms > 0 ? debounce_ms : CFGWATCH_DEBOUNCE_MS;
    w->fn = fn;
    w->arg = arg;
    w->fd = -1;
    reactor_timer_init(&w->timer, fire, w);
    return w;
}

void cfgwatch_free(struct cfgwatch *w)
{
    if (!w)
        return;
    reactor_timer_stop(w->r, &w->timer);
    fd_close(w);
    dirs_release(w);
    free(w->loaded);
    free(w->what);
    free(w);
}
