/* otlp — see otlp.h. OTLP/HTTP JSON (opentelemetry-proto's JSON mapping: ids as lower-case
 * hex, times as decimal strings of Unix nanoseconds). */
#include "coordinator/otlp.h"

#include "common/httpc.h"
#include "common/strbuf.h"
#include "common/util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int otlp_cfg_from_env(struct otlp_cfg *cfg, const char **why)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->ratio = 1.0;
    const char *u = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    const char *base = getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
    if (u && *u)
        cfg->url = xstrdup(u);
    else if (base && *base) {
        size_t n = strlen(base);
        cfg->url = xasprintf("%.*s/v1/traces", (int)(n && base[n - 1] == '/' ? n - 1 : n), base);
    }
    if (!cfg->url)
        return 0;
    if (strncmp(cfg->url, "http://", 7) != 0) {
        *why = "OTEL_EXPORTER_OTLP_*ENDPOINT must be an http:// URL";
        otlp_cfg_release(cfg);
        return -1;
    }
    const char *r = getenv("OTEL_TRACES_SAMPLER_ARG");
    if (r && *r && util_parse_double(r, 0.0, 1.0, &cfg->ratio) != 0) {
        *why = "OTEL_TRACES_SAMPLER_ARG must be a number in [0, 1]";
        otlp_cfg_release(cfg);
        return -1;
    }
    const char *s = getenv("OTEL_SERVICE_NAME");
    cfg->service = xstrdup(s && *s ? s : "motor-coordinator");
    return 0;
}

void otlp_cfg_release(struct otlp_cfg *cfg)
{
    free(cfg->url);
    free(cfg->service);
    cfg->url = cfg->service = NULL;
}

static uint64_t next(uint64_t *s)
{
    if (!*s) {
        uint64_t seed = 0;
        if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed) || !seed)
            seed = (uint64_t)util_mono_us() * 0x9e3779b97f4a7c15ull | 1;
        *s = seed;
    }
    /* xorshift64*: ids need to be unique, not secret */
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static void rand_bytes(uint64_t *rng, uint8_t *out, size_t n)
{
    while (n) {
        uint64_t v = next(rng);
        for (int i = 0; i < 8 && n; i++, n--)
            *out++ = (uint8_t)(v >> (8 * i));
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void unhex(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (uint8_t)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
}

static void put_hex(struct strbuf *sb, const uint8_t *b, size_t n)
{
    static const char hx[] = "0123456789abcdef";
    char buf[64];
    for (size_t i = 0; i < n; i++) {
        buf[2 * i] = hx[b[i] >> 4];
        buf[2 * i + 1] = hx[b[i] & 15];
    }
    strbuf_append(sb, buf, 2 * n);
}

struct otlp_req *otlp_begin(const struct otlp_cfg *cfg, const char *traceparent, uint64_t *rng,
                            int64_t start_us)
{
    if (!cfg || !cfg->url)
        return NULL;
    bool sampled;
    if (traceparent) /* validated by the caller: "vv-<32>-<16>-ff" */
        sampled = (hexval(traceparent[54]) & 1) != 0;
    else
        sampled = cfg->ratio >= 1.0 ||
                  (cfg->ratio > 0 && (double)(next(rng) >> 11) / 9007199254740992.0 < cfg->ratio);
    if (!sampled)
        return NULL;
    struct otlp_req *t = xcalloc(1, sizeof(*t));
    if (traceparent) {
        unhex(traceparent + 3, t->trace_id, 16);
        unhex(traceparent + 36, t->parent, 8);
        t->has_parent = true;
    } else {
        rand_bytes(rng, t->trace_id, 16);
    }
    t->wall_us_at_mono0 = util_wall_ms() * 1000 - util_mono_us();
    struct otlp_span *s = &t->spans[t->n++];
    s->name = "request";
    s->kind = 2;
    s->start_us = start_us;
    s->instance_id = -1;
    rand_bytes(rng, s->id, 8);
    return t;
}

int otlp_span_open(struct otlp_req *t, const char *name, int kind, int64_t start_us, uint64_t *rng)
{
    if (!t || t->n >= OTLP_MAX_SPANS)
        return -1;
    struct otlp_span *s = &t->spans[t->n];
    memset(s, 0, sizeof(*s));
    s->name = name;
    s->kind = kind;
    s->start_us = start_us;
    s->instance_id = -1;
    rand_bytes(rng, s->id, 8);
    return t->n++;
}

void otlp_span_close(struct otlp_req *t, int idx, int64_t end_us, int status, bool error)
{
    if (!t || idx < 0 || idx >= t->n || t->spans[idx].end_us)
        return;
    t->spans[idx].end_us = end_us;
    t->spans[idx].status = status;
    t->spans[idx].error = error;
}

void otlp_traceparent(const struct otlp_req *t, int idx, char *buf)
{
    struct strbuf sb;
    strbuf_init(&sb, 64);
    strbuf_puts(&sb, "00-");
    put_hex(&sb, t->trace_id, 16);
    strbuf_puts(&sb, "-");
    put_hex(&sb, t->spans[idx].id, 8);
    strbuf_puts(&sb, "-01");
    memcpy(buf, strbuf_str(&sb), 55);
    buf[55] = '\0';
    strbuf_release(&sb);
}

static void attr_str(struct strbuf *sb, bool *first, const char *k, const char *v)
{
    if (!v)
        return;
    strbuf_puts(sb, *first ? "" : ",");
    *first = false;
    strbuf_appendf(sb, "{\"key\":\"%s\",\"value\":{\"stringValue\":", k);
    strbuf_put_json_string(sb, v);
    strbuf_puts(sb, "}}");
}

static void attr_int(struct strbuf *sb, bool *first, const char *k, int64_t v)
{
    strbuf_puts(sb, *first ? "" : ",");
    *first = false;
    strbuf_appendf(sb, "{\"key\":\"%s\",\"value\":{\"intValue\":\"%lld\"}}", k, (long long)v);
}

static void on_sent(const struct httpc_response *resp, void *arg)
{
    (void)resp; /* best effort: a collector down loses spans, never requests */
    (void)arg;
}

void otlp_finish(struct otlp_req *t, const struct otlp_cfg *cfg, struct httpc *http, int64_t end_us,
                 int status, const char *rid, const char *api, const char *model, int retries,
                 int reschedules)
{
    if (!t)
        return;
    for (int i = t->n - 1; i >= 0; i--)
        otlp_span_close(t, i, end_us, i == 0 ? status : 0, i == 0 && status >= 500);
    struct strbuf sb;
    strbuf_init(&sb, 1u << 20);
    strbuf_puts(&sb, "{\"resourceSpans\":[{\"resource\":{\"attributes\":[");
    bool first = true;
    attr_str(&sb, &first, "service.name", cfg->service);
    strbuf_puts(&sb, "]},\"scopeSpans\":[{\"scope\":{\"name\":\"motor\"},\"spans\":[");
    for (int i = 0; i < t->n; i++) {
        const struct otlp_span *s = &t->spans[i];
        strbuf_puts(&sb, i ? ",{\"traceId\":\"" : "{\"traceId\":\"");
        put_hex(&sb, t->trace_id, 16);
        strbuf_puts(&sb, "\",\"spanId\":\"");
        put_hex(&sb, s->id, 8);
        strbuf_puts(&sb, "\"");
        if (i > 0 || t->has_parent) {
            strbuf_puts(&sb, ",\"parentSpanId\":\"");
            put_hex(&sb, i > 0 ? t->spans[0].id : t->parent, 8);
            strbuf_puts(&sb, "\"");
        }
        strbuf_puts(&sb, ",\"name\":");
        strbuf_put_json_string(&sb, s->name);
        strbuf_appendf(&sb,
                       ",\"kind\":%d,\"startTimeUnixNano\":\"%lld000\","
                       "\"endTimeUnixNano\":\"%lld000\",\"attributes\":[",
                       s->kind, (long long)(s->start_us + t->wall_us_at_mono0),
                       (long long)(s->end_us + t->wall_us_at_mono0));
        first = true;
        if (i == 0) {
            attr_str(&sb, &first, "http.route", api);
            attr_str(&sb, &first, "gen_ai.request.model", model);
            attr_str(&sb, &first, "motor.request_id", rid);
            attr_int(&sb, &first, "http.response.status_code", status);
            attr_int(&sb, &first, "motor.retries", retries);
            attr_int(&sb, &first, "motor.reschedules", reschedules);
        } else if (s->kind == 3) {
            attr_str(&sb, &first, "motor.role", s->role);
            attr_str(&sb, &first, "server.address", s->endpoint);
            attr_int(&sb, &first, "motor.instance_id", s->instance_id);
            if (s->status)
                attr_int(&sb, &first, "http.response.status_code", s->status);
        }
        strbuf_appendf(&sb, "],\"status\":{\"code\":%d}}", s->error ? 2 : 0);
    }
    strbuf_puts(&sb, "]}]}]}");
    if (!sb.overflow && http) {
        struct httpc_opts o = {.method = "POST",
                               .url = cfg->url,
                               .body = strbuf_str(&sb),
                               .body_len = sb.len,
                               .content_type = "application/json",
                               .timeout_ms = 5000,
                               .max_response = 64 * 1024};
        httpc_request(http, &o, on_sent, NULL);
    }
    strbuf_release(&sb);
    free(t);
}
