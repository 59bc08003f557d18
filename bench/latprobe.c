/* motor-latprobe: per-request latency of several HTTP targets, measured interleaved.
 *
 * Why not wrk: wrk's latency histogram has 1 us buckets and each target is driven in its
 * own run, so drift of the machine between runs (frequency, other processes, cache
 * state) lands on one target only. A proxy adds 10-20 us here; that drift is of the same
 * size. This probe keeps one keep-alive connection per target and sends one request at a
 * time, alternating between the targets in small batches (the starting target rotates
 * every round), and times every request with CLOCK_MONOTONIC in nanoseconds. Whatever
 * the machine does during the run is spread evenly over all targets.
 *
 * usage: motor-latprobe [--requests N] [--batch B] [--warmup W] [--path P]
 *                       [--body-file F] [--ca-file F] [--cert-file F --key-file F]
 *                       NAME=PORT | NAME=tls:PORT ...
 * A tls: target is spoken to over TLS (OpenSSL, linked: this is a bench tool, not a
 * daemon): the server verified against --ca-file (its IP address 127.0.0.1 checked), the
 * client certificate presented when given. The handshake happens at connect (warm-up),
 * so the timed requests measure the TLS records on a kept-alive connection, as a client
 * of a gateway sees them.
 * Targets are on 127.0.0.1. The first target is the reference ("direct"): for every other
 * target the output gives the added latency (its percentile minus the reference's) and
 * the median over batches of (batch median minus the reference's batch median of the
 * same round). Output: one JSON object on stdout. Exit 0, or 1 with a message on stderr
 * when a target cannot be reached or answers something other than 2xx.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define PROBE_MAX_TARGETS 8
#define PROBE_RESP_MAX (1 << 20)

struct target {
    const char *name;
    int port;
    int fd;
    uint64_t *samples_ns; /* one per timed request */
    size_t n;
    double *batch_median_us; /* one per round */
    unsigned reconnects;
    bool tls;
    SSL *ssl; /* with tls, on fd */
};

static SSL_CTX *tls_ctx; /* one for every tls: target */

struct probe {
    struct target t[PROBE_MAX_TARGETS];
    size_t ntargets;
    char *request; /* the whole request, sent with one send() */
    size_t request_len;
    char *resp;
    long requests, batch, warmup;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void target_close(struct target *t)
{
    if (t->ssl) {
        SSL_free(t->ssl);
        t->ssl = NULL;
    }
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
}

static int target_connect(struct target *t)
{
    target_close(t);
    t->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->fd < 0)
        return -errno;
    int one = 1;
    setsockopt(t->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)t->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(t->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        return -errno;
    if (t->tls) {
        t->ssl = SSL_new(tls_ctx);
        SSL_set_fd(t->ssl, t->fd);
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(t->ssl), "127.0.0.1");
        if (SSL_connect(t->ssl) != 1) {
            char e[256];
            ERR_error_string_n(ERR_get_error(), e, sizeof(e));
            fprintf(stderr, "%s: TLS handshake failed: %s\n", t->name, e);
            return -EPROTO;
        }
    }
    return 0;
}

static ssize_t t_send(struct target *t, const void *b, size_t n)
{
    if (!t->ssl)
        return send(t->fd, b, n, MSG_NOSIGNAL);
    size_t w = 0;
    return SSL_write_ex(t->ssl, b, n, &w) == 1 ? (ssize_t)w : -1;
}

static ssize_t t_recv(struct target *t, void *b, size_t n)
{
    if (!t->ssl)
        return recv(t->fd, b, n, 0);
    size_t r = 0;
    return SSL_read_ex(t->ssl, b, n, &r) == 1 ? (ssize_t)r : -1;
}

/* Value of header `name` in the header block [b, end), or NULL. */
static const char *header_value(const char *b, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    const char *p = memchr(b, '\n', (size_t)(end - b));
    while (p && p + 1 < end) {
        const char *line = p + 1;
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (!eol)
            return NULL;
        if ((size_t)(eol - line) > nl && line[nl] == ':' && strncasecmp(line, name, nl) == 0) {
            const char *v = line + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
                ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        p = eol;
    }
    return NULL;
}

/* Length of the complete response at the start of b, 0 when more bytes are needed, -1
 * when it cannot be framed (no Content-Length and not chunked: close-delimited answers
 * are not supported, the probe measures keep-alive proxies). */
static long response_length(const char *b, size_t n, int *status, bool *closes)
{
    const char *hend = memmem(b, n, "\r\n\r\n", 4);
    if (!hend)
        return 0;
    size_t head = (size_t)(hend - b) + 4;
    if (n < 12 || memcmp(b, "HTTP/1.", 7) != 0)
        return -1;
    *status = (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
    size_t vl;
    const char *v = header_value(b, hend + 2, "connection", &vl);
    *closes = v && vl == 5 && strncasecmp(v, "close", 5) == 0;
    v = header_value(b, hend + 2, "content-length", &vl);
    if (v) {
        long cl = strtol(v, NULL, 10);
        if (cl < 0)
            return -1;
        return n >= head + (size_t)cl ? (long)(head + (size_t)cl) : 0;
    }
    v = header_value(b, hend + 2, "transfer-encoding", &vl);
    if (!v || vl != 7 || strncasecmp(v, "chunked", 7) != 0)
        return -1;
    size_t pos = head;
    for (;;) {
        const char *eol = memmem(b + pos, n - pos, "\r\n", 2);
        if (!eol)
            return 0;
        char *numend;
        unsigned long size = strtoul(b + pos, &numend, 16);
        if (numend == b + pos || size > PROBE_RESP_MAX)
            return -1;
        pos = (size_t)(eol - b) + 2;
        if (size == 0) {
            /* trailers: none expected; the terminating empty line */
            const char *fin = memmem(b + pos, n - pos, "\r\n", 2);
            if (!fin)
                return 0;
            return (long)((size_t)(fin - b) + 2);
        }
        if (n < pos + size + 2)
            return 0;
        pos += size + 2;
    }
}

/* One request on t's connection; returns its duration in ns, or 0 on failure. */
static uint64_t exchange(struct probe *p, struct target *t)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (t->fd < 0 && target_connect(t) < 0)
            return 0;
        uint64_t start = now_ns();
        ssize_t w = t_send(t, p->request, p->request_len);
        if (w != (ssize_t)p->request_len) {
            target_close(t);
            t->reconnects++;
            continue;
        }
        size_t have = 0;
        for (;;) {
            ssize_t r = t_recv(t, p->resp + have, PROBE_RESP_MAX - have);
            if (r <= 0) {
                if (have == 0 && attempt == 0) /* a stale keep-alive: retry once */
                    break;
                fprintf(stderr, "%s: connection lost mid-response\n", t->name);
                return 0;
            }
            have += (size_t)r;
            int status = 0;
            bool closes = false;
            long len = response_length(p->resp, have, &status, &closes);
            if (len < 0 || (len == 0 && have == PROBE_RESP_MAX)) {
                fprintf(stderr, "%s: cannot frame the response\n", t->name);
                return 0;
            }
            if (len > 0) {
                uint64_t took = now_ns() - start;
                if (status / 100 != 2) {
                    fprintf(stderr, "%s: status %d\n", t->name, status);
                    return 0;
                }
                if (closes || (size_t)len != have) {
                    target_close(t);
                    t->reconnects++;
                }
                return took ? took : 1;
            }
        }
        target_close(t);
        t->reconnects++;
    }
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Percentile q (0..1) of sorted samples, in microseconds (nearest rank). */
static double pct_us(const uint64_t *sorted, size_t n, double q)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return (double)sorted[i] / 1000.0;
}

static double median_double(double *v, size_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n ? (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2) : 0;
}

static char *util_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(PROBE_RESP_MAX + 1);
    size_t n = buf ? fread(buf, 1, PROBE_RESP_MAX + 1, f) : 0;
    fclose(f);
    if (n > PROBE_RESP_MAX) { /* a body the probe would silently cut */
        free(buf);
        errno = EFBIG;
        return NULL;
    }
    *len = n;
    return buf;
}

static void usage(void)
{
    fprintf(stderr, "usage: motor-latprobe [--requests N] [--batch B] [--warmup W] [--path P] "
                    "[--body-file F] [--ca-file F] [--cert-file F --key-file F] "
                    "NAME=[tls:]PORT ...\n");
}

static long parse_count(const char *s, const char *what)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > 10000000) {
        fprintf(stderr, "motor-latprobe: bad %s '%s'\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    struct probe p = {.requests = 20000, .batch = 50, .warmup = 500};
    const char *path = "/v1/completions", *body_file = NULL;
    const char *ca = NULL, *cert = NULL, *key = NULL;
    static const struct option opts[] = {{"requests", required_argument, NULL, 'n'},
                                         {"batch", required_argument, NULL, 'b'},
                                         {"warmup", required_argument, NULL, 'w'},
                                         {"path", required_argument, NULL, 'p'},
                                         {"body-file", required_argument, NULL, 'f'},
                                         {"ca-file", required_argument, NULL, 'A'},
                                         {"cert-file", required_argument, NULL, 'C'},
                                         {"key-file", required_argument, NULL, 'K'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "n:b:w:p:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'n':
            p.requests = parse_count(optarg, "--requests");
            break;
        case 'b':
            p.batch = parse_count(optarg, "--batch");
            break;
        case 'w':
            p.warmup = parse_count(optarg, "--warmup");
            break;
        case 'p':
            path = optarg;
            break;
        case 'f':
            body_file = optarg;
            break;
        case 'A':
            ca = optarg;
            break;
        case 'C':
            cert = optarg;
            break;
        case 'K':
            key = optarg;
            break;
        default:
            usage();
            return c == 'h' ? 0 : 2;
        }
    }
    for (int i = optind; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq || p.ntargets == PROBE_MAX_TARGETS) {
            usage();
            return 2;
        }
        *eq = '\0';
        struct target *t = &p.t[p.ntargets++];
        t->name = argv[i];
        t->tls = strncmp(eq + 1, "tls:", 4) == 0;
        t->port = (int)parse_count(eq + 1 + (t->tls ? 4 : 0), "port");
        t->fd = -1;
        if (t->tls && !tls_ctx) {
            tls_ctx = SSL_CTX_new(TLS_client_method());
            SSL_CTX_set_min_proto_version(tls_ctx, TLS1_2_VERSION);
            SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, NULL);
            if ((ca && SSL_CTX_load_verify_locations(tls_ctx, ca, NULL) != 1) ||
                (cert && SSL_CTX_use_certificate_chain_file(tls_ctx, cert) != 1) ||
                (key && SSL_CTX_use_PrivateKey_file(tls_ctx, key, SSL_FILETYPE_PEM) != 1)) {
                fprintf(stderr, "motor-latprobe: cannot load the TLS files\n");
                return 2;
            }
        }
    }
    if (p.ntargets == 0) {
        usage();
        return 2;
    }
    size_t body_len = 0;
    char *body = NULL;
    if (body_file && !(body = util_read_file(body_file, &body_len))) {
        fprintf(stderr, "motor-latprobe: cannot read %s: %s\n", body_file, strerror(errno));
        return 2;
    }
    size_t cap = strlen(path) + body_len + 256;
    p.request = malloc(cap);
    int hl = snprintf(
        p.request, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sContent-Length: %zu\r\n\r\n",
        body ? "POST" : "GET", path, body ? "Content-Type: application/json\r\n" : "", body_len);
    if (body)
        memcpy(p.request + hl, body, body_len);
    p.request_len = (size_t)hl + body_len;
    free(body);
    p.resp = malloc(PROBE_RESP_MAX);

    long rounds = (p.requests + p.batch - 1) / p.batch;
    for (size_t i = 0; i < p.ntargets; i++) {
        struct target *t = &p.t[i];
        t->samples_ns = calloc((size_t)(rounds * p.batch), sizeof(uint64_t));
        t->batch_median_us = calloc((size_t)rounds, sizeof(double));
        for (long k = 0; k < p.warmup; k++)
            if (!exchange(&p, t)) {
                fprintf(stderr, "motor-latprobe: %s (port %d) failed during warm-up\n", t->name,
                        t->port);
                return 1;
            }
    }
    uint64_t *batch = calloc((size_t)p.batch, sizeof(uint64_t));
    for (long r = 0; r < rounds; r++) {
        for (size_t k = 0; k < p.ntargets; k++) {
            struct target *t = &p.t[((size_t)r + k) % p.ntargets];
            for (long j = 0; j < p.batch; j++) {
                uint64_t ns = exchange(&p, t);
                if (!ns) {
                    fprintf(stderr, "motor-latprobe: %s (port %d) failed\n", t->name, t->port);
                    return 1;
                }
                batch[j] = ns;
                t->samples_ns[t->n++] = ns;
            }
            qsort(batch, (size_t)p.batch, sizeof(*batch), cmp_u64);
            t->batch_median_us[r] = pct_us(batch, (size_t)p.batch, 0.5);
        }
    }

    printf("{\"requests_per_target\":%ld,\"batch\":%ld,\"targets\":[", rounds * p.batch, p.batch);
    double ref_p50 = 0, ref_p90 = 0, ref_p99 = 0;
    double *diff = calloc((size_t)rounds, sizeof(double));
    for (size_t i = 0; i < p.ntargets; i++) {
        struct target *t = &p.t[i];
        qsort(t->samples_ns, t->n, sizeof(uint64_t), cmp_u64);
        double p50 = pct_us(t->samples_ns, t->n, 0.5), p90 = pct_us(t->samples_ns, t->n, 0.9),
               p99 = pct_us(t->samples_ns, t->n, 0.99);
        double sum = 0;
        for (size_t k = 0; k < t->n; k++)
            sum += (double)t->samples_ns[k] / 1000.0;
        printf("%s{\"name\":\"%s\",\"n\":%zu,\"p50_us\":%.3f,\"p90_us\":%.3f,\"p99_us\":%.3f,"
               "\"mean_us\":%.3f,\"reconnects\":%u",
               i ? "," : "", t->name, t->n, p50, p90, p99, sum / (double)t->n, t->reconnects);
        if (i == 0) {
            ref_p50 = p50, ref_p90 = p90, ref_p99 = p99;
        } else {
            for (long r = 0; r < rounds; r++)
                diff[r] = t->batch_median_us[r] - p.t[0].batch_median_us[r];
            printf(",\"added_p50_us\":%.3f,\"added_p90_us\":%.3f,\"added_p99_us\":%.3f,"
                   "\"added_paired_p50_us\":%.3f",
                   p50 - ref_p50, p90 - ref_p90, p99 - ref_p99,
                   median_double(diff, (size_t)rounds));
        }
        printf("}");
    }
    printf("]}\n");
    for (size_t i = 0; i < p.ntargets; i++) {
        target_close(&p.t[i]);
        free(p.t[i].samples_ns);
        free(p.t[i].batch_median_us);
    }
    free(diff);
    free(batch);
    free(p.request);
    free(p.resp);
    SSL_CTX_free(tls_ctx);
    return 0;
}
