#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void oom(size_t n)
{
    char msg[96];
    int len = snprintf(msg, sizeof(msg), "motor: out of memory allocating %zu bytes\n", n);
    if (len > 0)
        (void)!write(STDERR_FILENO, msg, (size_t)len);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        oom(count * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *xstrdup(const char *s)
{
    if (!s)
        return NULL;
    return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
    if (!s)
        return NULL;
    size_t len = strnlen(s, n);
    char *p = xmalloc(len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

char *xasprintf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    va_list ap2;
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len < 0) {
        va_end(ap2);
        return xstrdup("");
    }
    char *p = xmalloc((size_t)len + 1);
    vsnprintf(p, (size_t)len + 1, fmt, ap2);
    va_end(ap2);
    return p;
}

static int64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t mono_ms(void)
{
    return clock_ns(CLOCK_MONOTONIC) / 1000000LL;
}

int64_t mono_us(void)
{
    return clock_ns(CLOCK_MONOTONIC) / 1000LL;
}

int64_t wall_ms(void)
{
    return clock_ns(CLOCK_REALTIME) / 1000000LL;
}

void wall_iso8601(int64_t wall_millis, char *buf, size_t cap)
{
    time_t secs = (time_t)(wall_millis / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    char base[24];
    strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf, cap, "%s.%03dZ", base, (int)(wall_millis % 1000));
}

int parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!s || !*s)
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0')
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

int parse_int(const char *s, int min, int max, int *out)
{
    int64_t v;
    int rc = parse_i64(s, min, max, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

int parse_double(const char *s, double min, double max, double *out)
{
    if (!s || !*s)
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v))
        return -EINVAL;
    if (errno == ERANGE || v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

bool secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);
    size_t n = la > lb ? la : lb;
    for (size_t i = 0; i < n; i++) {
        unsigned char ca = i < la ? (unsigned char)a[i] : 0;
        unsigned char cb = i < lb ? (unsigned char)b[i] : 0;
        diff |= ca ^ cb;
    }
    return diff == 0;
}

int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

char *read_file(const char *path, size_t max_bytes, size_t *len_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int saved = errno;
            free(buf);
            close(fd);
            errno = saved;
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
        if (len > max_bytes) {
            free(buf);
            close(fd);
            errno = EFBIG;
            return NULL;
        }
    }
    close(fd);
    buf[len] = '\0';
    if (len_out)
        *len_out = len;
    return buf;
}

int write_file_atomic(const char *path, const void *data, size_t n, int mode)
{
    char *tmp = xasprintf("%s.tmp.%d", path, (int)getpid());
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    rc = write_all(fd, data, n);
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
out:
    free(tmp);
    return rc;
}
