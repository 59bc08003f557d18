#include "common/logfile.h"

#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOGFILE_MAX_KEEP 100

struct logfile {
    char *path;
    size_t max_bytes;
    unsigned keep;
    int fd; /* -1 after a failed reopen; the next write retries */
    size_t size;
    uint64_t dropped;
};

static int open_current(struct logfile *lf, bool truncate)
{
    int flags = O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0);
    int fd = open(lf->path, flags, 0644);
    if (fd < 0)
        return -errno;
    struct stat st;
    lf->size = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
    lf->fd = fd;
    return 0;
}

int logfile_open(const char *path, size_t max_bytes, unsigned keep, struct logfile **out)
{
    if (!path || !*path || max_bytes == 0 || keep > LOGFILE_MAX_KEEP || !out)
        return -EINVAL;
    struct logfile *lf = xcalloc(1, sizeof(*lf));
    lf->path = xstrdup(path);
    lf->max_bytes = max_bytes;
    lf->keep = keep;
    lf->fd = -1;
    int rc = open_current(lf, false);
    if (rc) {
        logfile_close(lf);
        return rc;
    }
    *out = lf;
    return 0;
}

void logfile_close(struct logfile *lf)
{
    if (!lf)
        return;
    if (lf->fd >= 0)
        close(lf->fd);
    free(lf->path);
    free(lf);
}

int logfile_rotate(struct logfile *lf)
{
    int rc = 0;
    if (lf->fd >= 0) {
        close(lf->fd);
        lf->fd = -1;
    }
    if (lf->keep > 0) {
        /* Shift path.(k-1) -> path.k from the oldest down; a missing file is just a gap
         * (fewer rotations so far). rename over path.keep drops the oldest. */
        for (unsigned k = lf->keep; k >= 1; k--) {
            char *from = k == 1 ? xstrdup(lf->path) : xasprintf("%s.%u", lf->path, k - 1);
            char *to = xasprintf("%s.%u", lf->path, k);
            if (rename(from, to) != 0 && errno != ENOENT && rc == 0)
                rc = -errno;
            free(from);
            free(to);
        }
    }
    /* keep == 0, or the rename failed: start over in place rather than grow forever. */
    int orc = open_current(lf, true);
    return rc ? rc : orc;
}

static int write_chunk(struct logfile *lf, const char *p, size_t n)
{
    if (lf->fd < 0) {
        int rc = open_current(lf, false);
        if (rc) {
            lf->dropped += n;
            return rc;
        }
    }
    int rc = util_write_all(lf->fd, p, n);
    if (rc) {
        lf->dropped += n;
        return rc;
    }
    lf->size += n;
    return 0;
}

int logfile_write(struct logfile *lf, const void *data, size_t n)
{
    const char *p = data;
    int first_err = 0;
    while (n > 0) {
        size_t room = lf->size < lf->max_bytes ? lf->max_bytes - lf->size : 0;
        if (n <= room) {
            int rc = write_chunk(lf, p, n);
            return first_err ? first_err : rc;
        }
        /* Fill up to the last newline that fits; a file holding nothing yet takes a
         * forced cut so a huge line still makes progress. */
        size_t cut = 0;
        if (room) {
            const char *nl = memrchr(p, '\n', room);
            cut = nl ? (size_t)(nl - p) + 1 : (lf->size == 0 ? room : 0);
        }
        if (cut) {
            int rc = write_chunk(lf, p, cut);
            if (rc && !first_err)
                first_err = rc;
            p += cut;
            n -= cut;
        }
        int rc = logfile_rotate(lf);
        if (rc && !first_err)
            first_err = rc;
        if (lf->fd < 0) {
            /* Could not reopen: drop the rest rather than spin. */
            lf->dropped += n;
            return first_err;
        }
    }
    return first_err;
}

size_t logfile_size(const struct logfile *lf)
{
    return lf->size;
}

uint64_t logfile_dropped(const struct logfile *lf)
{
    return lf->dropped;
}
