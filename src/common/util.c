#include "common/util.h"

#include <ctype.h>
#include <errno.h>
#include <sys/resource.h>
#include <fcntl.h>
#include <libgen.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int64_t clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t util_mono_ms(void)
{
    return clock_ns(CLOCK_MONOTONIC) / 1000000LL;
}

int64_t util_mono_us(void)
{
    return clock_ns(CLOCK_MONOTONIC) / 1000LL;
}

int64_t util_wall_ms(void)
{
    return clock_ns(CLOCK_REALTIME) / 1000000LL;
}

void util_wall_iso8601(int64_t wall_millis, char *buf, size_t cap)
{
    /* Floor division: before the epoch, -1 ms is 23:59:59.999 of the previous second,
     * not a negative millisecond field. */
    int64_t ms = wall_millis % 1000;
    int64_t secs64 = wall_millis / 1000;
    if (ms < 0) {
        ms += 1000;
        secs64--;
    }
    time_t secs = (time_t)secs64;
    struct tm tm;
    char base[32];
    if (!gmtime_r(&secs, &tm) || strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm) == 0)
        snprintf(base, sizeof(base), "1970-01-01T00:00:00");
    snprintf(buf, cap, "%s.%03dZ", base, (int)ms);
}

size_t util_utf8_seq_len_n(const char *str, size_t avail)
{
    const unsigned char *s = (const unsigned char *)str;
    if (avail == 0)
        return 0;
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0; /* continuation byte, overlong C0/C1, F5..FF */
    }
    if (avail < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

size_t util_utf8_seq_len(const char *str)
{
    /* A NUL ends the string: it can neither start nor continue a sequence. */
    return util_utf8_seq_len_n(str, strnlen(str, 4));
}

/* strtol/strtod skip leading white space; a "whole string" must not start with it. */
static bool starts_clean(const char *s)
{
    return s && *s && !isspace((unsigned char)*s);
}

int util_parse_i64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    if (!starts_clean(s))
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

int util_parse_int(const char *s, int min, int max, int *out)
{
    int64_t v;
    int rc = util_parse_i64(s, min, max, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

int util_parse_double(const char *s, double min, double max, double *out)
{
    if (!starts_clean(s))
        return -EINVAL;
    /* strtod also takes hex floats ("0x1p3"); configuration numbers are decimal. */
    const char *digits = (*s == '+' || *s == '-') ? s + 1 : s;
    if (digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X'))
        return -EINVAL;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0')
        return -EINVAL;
    /* Overflow ("1e400") is a number out of range; "inf"/"nan" are not numbers. */
    if (errno == ERANGE)
        return -ERANGE;
    if (!isfinite(v))
        return -EINVAL;
    if (v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

bool util_secret_equal(const char *a, const char *b)
{
    if (!a || !b)
        return false;
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

int util_write_all(int fd, const void *buf, size_t n)
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

char *util_read_file(const char *path, size_t max_bytes, size_t *len_out)
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

/* fsync the directory holding path so the rename itself survives a crash. Best effort:
 * the data is already safe in the new file either way. */
static void fsync_parent(const char *path)
{
    char *copy = xstrdup(path);
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    free(copy);
}

int util_write_file_atomic(const char *path, const void *data, size_t n, int mode)
{
    /* The pid alone is not unique: two threads writing the same path would share (and
     * truncate) one temp file and could publish a mix. A process-wide sequence number
     * makes each attempt's temp file its own; O_EXCL refuses a planted file or symlink. */
    static _Atomic unsigned seq;
    char *tmp = xasprintf("%s.tmp.%d.%u", path, (int)getpid(), atomic_fetch_add(&seq, 1));
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    rc = util_write_all(fd, data, n);
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
    else
        fsync_parent(path);
out:
    free(tmp);
    return rc;
}

size_t util_fmt_u64(char *buf, uint64_t v)
{
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

size_t util_fmt_hex64(char *buf, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    size_t n = 0;
    do {
        tmp[n++] = digits[v & 15];
        v >>= 4;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    return n;
}

long util_raise_nofile_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        struct rlimit next = {.rlim_cur = want, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &next) == 0)
            rl.rlim_cur = want;
    }
    return rl.rlim_cur == RLIM_INFINITY ? (long)INT32_MAX : (long)rl.rlim_cur;
}

long util_rss_kib(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    unsigned long size = 0, resident = 0;
    if (sscanf(buf, "%lu %lu", &size, &resident) != 2)
        return -1;
    return (long)(resident * (unsigned long)sysconf(_SC_PAGESIZE) / 1024);
}

long util_heap_in_use_kib(void)
{
#ifdef __GLIBC__
    struct mallinfo2 mi = mallinfo2();
    return (long)((mi.uordblks + mi.hblkhd) / 1024);
#else
    return -1;
#endif
}

int util_heap_trim(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
    return 0;
#else
    return -1;
#endif
}
