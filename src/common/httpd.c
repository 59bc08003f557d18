/* httpd — the core: routes, requests, answers, access log, TLS contexts. The
 * connections (plain and TLS alike) are in httpd_native.c; see httpd_core.h for how the
 * two meet. */
#include "common/httpd.h"

#include "common/http1.h"
#include "common/httpd_core.h"
#include "common/httpd_internal.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/tls.h"
#include "common/util.h"
#include "common/xalloc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define HTTPD_RESP_HEADERS_MAX ((size_t)64 * 1024)
/* Room past the caller-added headers for the Content-Type line set_content_type appends. */
#define HTTPD_RESP_CTYPE_SLACK 512
/* First allocation of the response-header buffer: the usual few headers fit at once. */
#define HTTPD_RESP_HEADERS_FIRST 256

/* ---- pure matching (httpd_internal.h) -------------------------------------------- */

static bool seg_is_param(const char *s, size_t len)
{
    return len >= 2 && s[0] == '{' && s[len - 1] == '}';
}

bool httpd_path_match(const char *pattern, const char *path, struct httpd_params *params)
{
    params->n = 0;
    if (!pattern || !path || pattern[0] != '/' || path[0] != '/')
        return false;
    const char *p = pattern, *u = path;
    for (;;) {
        /* p and u both point at a '/' */
        p++;
        u++;
        const char *pe = strchrnul(p, '/');
        const char *ue = strchrnul(u, '/');
        size_t pl = (size_t)(pe - p), ul = (size_t)(ue - u);
        if (seg_is_param(p, pl)) {
            if (ul == 0 || params->n >= HTTPD_MAX_PARAMS)
                return false;
            params->p[params->n++] = (struct httpd_param_view){
                .name = p + 1, .name_len = pl - 2, .value = u, .value_len = ul};
        } else if (pl != ul || memcmp(p, u, pl) != 0) {
            return false;
        }
        if (*pe == '\0' || *ue == '\0')
            return *pe == *ue;
        p = pe;
        u = ue;
    }
}

bool httpd_pattern_valid(const char *pattern)
{
    if (!pattern || pattern[0] != '/')
        return false;
    size_t nparams = 0;
    const char *p = pattern;
    while (*p) {
        p++; /* skip '/' */
        const char *pe = strchrnul(p, '/');
        size_t pl = (size_t)(pe - p);
        const char *open = memchr(p, '{', pl), *close = memchr(p, '}', pl);
        if (open || close) {
            /* a parameter must be a whole segment with a non-empty, brace-free name */
            if (!seg_is_param(p, pl) || pl < 3 || memchr(p + 1, '{', pl - 2) ||
                memchr(p + 1, '}', pl - 2))
                return false;
            if (++nparams > HTTPD_MAX_PARAMS)
                return false;
        }
        p = pe;
    }
    return true;
}

static bool method_matches(const char *route_method, const char *method)
{
    if (strcmp(route_method, method) == 0)
        return true;
    return strcmp(method, "HEAD") == 0 && strcmp(route_method, "GET") == 0;
}

static void allow_add(char *allow, size_t cap, const char *method)
{
    if (cap == 0)
        return;
    /* skip duplicates: search whole comma-separated tokens */
    size_t ml = strlen(method);
    const char *s = allow;
    while (*s) {
        while (*s == ',' || *s == ' ') /* separators; the text may end truncated */
            s++;
        const char *e = strchrnul(s, ',');
        if ((size_t)(e - s) == ml && memcmp(s, method, ml) == 0)
            return;
        s = e;
    }
    size_t len = strlen(allow);
    snprintf(allow + len, cap - len, "%s%s", len ? ", " : "", method);
}

enum httpd_match httpd_routes_find(const struct httpd_route_entry *routes, size_t n,
                                   const char *method, const char *path, size_t *idx,
                                   struct httpd_params *params, char *allow, size_t cap)
{
    bool path_seen = false;
    if (cap > 0)
        allow[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (!httpd_path_match(routes[i].pattern, path, params))
            continue;
        if (method_matches(routes[i].method, method)) {
            *idx = i;
            return HTTPD_MATCH_FOUND;
        }
        path_seen = true;
    }
    if (!path_seen)
        return HTTPD_MATCH_NO_PATH;
    /* Second pass for the Allow header (only on the error path). */
    struct httpd_params scratch;
    for (size_t i = 0; i < n; i++) {
        if (!httpd_path_match(routes[i].pattern, path, &scratch))
            continue;
        allow_add(allow, cap, routes[i].method);
        if (strcmp(routes[i].method, "GET") == 0)
            allow_add(allow, cap, "HEAD");
    }
    return HTTPD_MATCH_BAD_METHOD;
}

/* ---- requests ------------------------------------------------------------------------ */

struct httpd_req *httpd_req_new(struct httpd *h, void *conn, size_t nhdrs, size_t nquery,
                                size_t arena_len)
{
    size_t kv = (nhdrs + nquery) * sizeof(struct httpd_kv);
    struct httpd_req *req = xcalloc(1, sizeof(*req) + kv + arena_len);
    req->h = h;
    req->conn = conn;
    req->hdrs = (struct httpd_kv *)(void *)(req + 1);
    req->query = req->hdrs + nhdrs;
    req->arena = (char *)(req->query + nquery);
    req->start_ms = util_mono_ms();
    req->method = "";
    req->path = "/";
    strbuf_init(&req->rhdrs, HTTPD_RESP_HEADERS_MAX + HTTPD_RESP_CTYPE_SLACK);
    /* sbuf may hold consumed-but-not-compacted bytes in front of the pending ones. */
    strbuf_init(&req->sbuf, 2 * HTTPD_STREAM_MAX);
    list_insert_tail(&h->live, &req->link);
    return req;
}

static bool is_quiet(const struct httpd *h, const char *path)
{
    for (char **q = h->quiet_paths; q && *q; q++)
        if (strcmp(*q, path) == 0)
            return true;
    return false;
}

void httpd_req_finish(struct httpd_req *req, bool ok)
{
    struct httpd *h = req->h;
    if (req->completed)
        return;
    req->completed = true;
    req->conn = NULL;
    if (!ok)
        req->client_gone = true;
    if (req->handled && log_enabled(LOG_DEBUG) && !is_quiet(h, req->path))
        log_debug("http_request", LF_STR("server", h->name), LF_STR("method", req->method),
                  LF_STR("path", req->path), LF_INT("status", req->status),
                  LF_INT("duration_ms", util_mono_ms() - req->start_ms), LF_STR("peer", req->peer),
                  LF_BOOL("ok", ok));
    if (req->on_close) {
        httpd_close_cb cb = req->on_close;
        req->on_close = NULL; /* exactly once */
        cb(req, req->on_close_arg);
    }
    list_remove(&req->link);
    free(req->param_store);
    free(req->body);
    free(req->resp_body);
    strbuf_release(&req->rhdrs);
    strbuf_release(&req->sbuf);
    free(req);
}

size_t httpd_query_count(const char *qs, size_t len)
{
    if (len == 0)
        return 0;
    size_t n = 1;
    for (size_t i = 0; i < len; i++)
        n += qs[i] == '&';
    return n;
}

size_t httpd_req_parse_query(struct httpd_req *req, const char *qs, size_t len, size_t *arena_off)
{
    size_t n = 0, i = 0;
    while (i < len) {
        size_t s = i;
        while (i < len && qs[i] != '&')
            i++;
        size_t e = i++;
        if (e == s)
            continue;
        const char *eq = memchr(qs + s, '=', e - s);
        size_t kl = eq ? (size_t)(eq - (qs + s)) : e - s;
        char *k = req->arena + *arena_off;
        int kn = http1_url_decode(k, qs + s, kl, true);
        if (kn < 0)
            continue; /* an argument with a NUL byte cannot be looked up: drop it */
        char *v = NULL;
        size_t used = (size_t)kn + 1;
        if (eq) {
            v = k + used;
            int vn = http1_url_decode(v, eq + 1, (size_t)(qs + e - eq - 1), true);
            if (vn < 0)
                continue;
            used += (size_t)vn + 1;
        }
        *arena_off += used;
        req->query[n++] = (struct httpd_kv){k, v};
    }
    req->nquery = n;
    return n;
}

const char *httpd_status_text(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "";
    }
}

/* ---- dispatch --------------------------------------------------------------------------- */

void httpd_req_shutdown_answer(struct httpd_req *req)
{
    httpd_add_header(req, "Connection", "close");
    httpd_respond_error(req, 503, "server shutting down");
}

static void route(struct httpd_req *req)
{
    struct httpd *h = req->h;
    struct httpd_params ps;
    size_t idx = 0;
    char allow[128];
    enum httpd_match m = httpd_routes_find(h->routes, h->nroutes, req->method, req->path, &idx, &ps,
                                           allow, sizeof(allow));
    if (m == HTTPD_MATCH_NO_PATH) {
        httpd_respond_error(req, 404, "Not Found");
        return;
    }
    if (m == HTTPD_MATCH_BAD_METHOD) {
        httpd_add_header(req, "Allow", allow);
        httpd_respond_error(req, 405, "Method Not Allowed");
        return;
    }
    const struct httpd_route_entry *rt = &h->routes[idx];
    if ((rt->flags & HTTPD_ROUTE_AUTH) && h->api_key) {
        const char *got = httpd_req_header(req, h->api_key_header);
        if (!got || !*got) {
            httpd_respond_error(req, 401, "missing management key");
            return;
        }
        if (!util_secret_equal(got, h->api_key)) {
            httpd_respond_error(req, 403, "invalid management key");
            return;
        }
    }
    if (ps.n > 0) {
        /* one block for every name and value: "name\0value\0..." */
        size_t need = 0;
        for (size_t i = 0; i < ps.n; i++)
            need += ps.p[i].name_len + ps.p[i].value_len + 2;
        char *st = xmalloc(need);
        req->param_store = st;
        for (size_t i = 0; i < ps.n; i++) {
            memcpy(st, ps.p[i].name, ps.p[i].name_len);
            st[ps.p[i].name_len] = '\0';
            req->param_names[i] = st;
            st += ps.p[i].name_len + 1;
            memcpy(st, ps.p[i].value, ps.p[i].value_len);
            st[ps.p[i].value_len] = '\0';
            req->param_values[i] = st;
            st += ps.p[i].value_len + 1;
        }
        req->nparams = ps.n;
    }
    rt->fn(req, rt->arg);
}

void httpd_req_dispatch(struct httpd_req *req)
{
    if (req->handled)
        return;
    req->handled = true;
    if (req->too_large)
        httpd_respond_error(req, 413, "request body too large");
    else if (req->h->stopping) /* owners are tearing down: handlers must not run now */
        httpd_req_shutdown_answer(req);
    else
        route(req);
}

/* ---- public API -------------------------------------------------------------------------- */

static int resolve_host(const char *host, uint16_t port, struct sockaddr_storage *ss, bool *is_v6)
{
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        *is_v6 = false;
        return 0;
    }
    if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        *is_v6 = true;
        return 0;
    }
    /* A name ("localhost"): resolve once at startup, first address wins. */
    struct addrinfo hints = {
        .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return -EINVAL;
    memcpy(ss, res->ai_addr, MOTOR_MIN((size_t)res->ai_addrlen, sizeof(*ss)));
    *is_v6 = res->ai_family == AF_INET6;
    if (*is_v6)
        v6->sin6_port = htons(port);
    else
        v4->sin_port = htons(port);
    freeaddrinfo(res);
    return 0;
}

static void free_config(struct httpd *h)
{
    for (size_t i = 0; i < h->nroutes; i++) {
        free(h->routes[i].method);
        free(h->routes[i].pattern);
    }
    free(h->routes);
    for (char **q = h->quiet_paths; q && *q; q++)
        free(*q);
    free(h->quiet_paths);
    tls_ctx_unref(h->tls);
    free(h->name);
    free(h->api_key_header);
    if (h->api_key)
        explicit_bzero(h->api_key, strlen(h->api_key));
    free(h->api_key);
    free(h);
}

static struct tls_ctx *server_tls(const struct httpd *h, const struct httpd_config *cfg)
{
    struct tls_config tc = {
        .cert_file = cfg->tls_cert_file,
        .key_file = cfg->tls_key_file,
        .key_password = cfg->tls_key_password,
        .ca_file = cfg->tls_ca_file,
        .crl_file = cfg->tls_crl_file,
        .min_version = cfg->tls_min_version,
        .ciphers = cfg->tls_ciphers,
        .ciphersuites = cfg->tls_ciphersuites,
    };
    char err[256];
    struct tls_ctx *ctx = tls_ctx_new_server(&tc, err, sizeof(err));
    if (!ctx) {
        int e = errno;
        log_error("httpd_tls_failed", LF_STR("server", h->name), LF_STR("error", err));
        errno = e;
    }
    return ctx;
}

static bool has_tls(const struct httpd_config *cfg, bool *half)
{
    bool has_cert = cfg->tls_cert_file && *cfg->tls_cert_file;
    bool has_key = cfg->tls_key_file && *cfg->tls_key_file;
    *half = has_cert != has_key;
    return has_cert && has_key;
}

struct httpd *httpd_new(struct reactor *r, const struct httpd_config *cfg)
{
    struct httpd *h = xcalloc(1, sizeof(*h));
    h->r = r;
    list_init(&h->live);
    h->name = xstrdup(cfg->name ? cfg->name : "httpd");
    h->max_body = cfg->max_body ? cfg->max_body : HTTPD_DEFAULT_MAX_BODY;
    h->idle_timeout_s = cfg->idle_timeout_s ? cfg->idle_timeout_s : 60;
    h->min_rate = HTTPD_MIN_RATE;
    h->max_connections = cfg->max_connections ? cfg->max_connections : 1024;
    h->evict_idle = cfg->evict_idle;
    h->openai_errors = cfg->openai_errors;
    h->api_key = xstrdup(cfg->api_key);
    h->api_key_header =
        xstrdup(cfg->api_key_header ? cfg->api_key_header : "X-Motor-Management-Key");
    if (cfg->quiet_paths) {
        size_t n = 0;
        while (cfg->quiet_paths[n])
            n++;
        h->quiet_paths = xcalloc(n + 1, sizeof(char *));
        for (size_t i = 0; i < n; i++)
            h->quiet_paths[i] = xstrdup(cfg->quiet_paths[i]);
    }

    const char *host = cfg->host && *cfg->host ? cfg->host : "127.0.0.1";
    struct sockaddr_storage ss;
    bool v6 = false;
    if (resolve_host(host, cfg->port, &ss, &v6) != 0) {
        log_error("httpd_bad_host", LF_STR("server", h->name), LF_STR("host", host));
        free_config(h);
        errno = EINVAL;
        return NULL;
    }
    bool half = false;
    bool tls = has_tls(cfg, &half);
    if (half) {
        log_error("httpd_tls_incomplete", LF_STR("server", h->name),
                  LF_STR("detail", "TLS needs both a certificate and a key file"));
        free_config(h);
        errno = EINVAL;
        return NULL;
    }
    if (tls && !(h->tls = server_tls(h, cfg))) {
        int e = errno;
        free_config(h);
        errno = e;
        return NULL;
    }
    int rc = httpd_native_start(h, (const struct sockaddr *)&ss,
                                v6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
                                cfg->reuse_port);
    if (rc != 0) {
        log_error("httpd_start_failed", LF_STR("server", h->name), LF_STR("host", host),
                  LF_INT("port", cfg->port), LF_BOOL("tls", tls), LF_STR("error", strerror(-rc)));
        free_config(h);
        errno = -rc;
        return NULL;
    }
    log_info("http_listening", LF_STR("server", h->name), LF_STR("host", host),
             LF_INT("port", h->port), LF_BOOL("tls", tls),
             LF_BOOL("mutual_tls", tls_ctx_verifies_peer(h->tls)));
    return h;
}

int httpd_tls_reload(struct httpd *h, const struct httpd_config *cfg)
{
    bool half = false;
    if (!h->tls || !has_tls(cfg, &half)) {
        log_error("httpd_tls_reload_failed", LF_STR("server", h->name),
                  LF_STR("error", h->tls ? "TLS needs both a certificate and a key file"
                                         : "not a TLS listener"));
        return -EINVAL;
    }
    struct tls_ctx *ctx = server_tls(h, cfg);
    if (!ctx)
        return -errno;
    tls_ctx_unref(h->tls); /* open connections hold their own reference */
    h->tls = ctx;
    log_info("httpd_tls_reloaded", LF_STR("server", h->name),
             LF_BOOL("mutual_tls", tls_ctx_verifies_peer(ctx)));
    return 0;
}

bool httpd_is_tls(const struct httpd *h)
{
    return h->tls != NULL;
}

void httpd_free(struct httpd *h)
{
    if (!h)
        return;
    h->stopping = true;
    if (h->native)
        httpd_native_shutdown(h);
    /* The connections finish every request; anything left is a bug, but never leak it. */
    while (!list_empty(&h->live))
        httpd_req_finish(list_entry(list_first(&h->live), struct httpd_req, link), false);
    free_config(h);
}

void httpd_set_min_rate(struct httpd *h, unsigned bytes_per_s)
{
    h->min_rate = bytes_per_s ? bytes_per_s : HTTPD_MIN_RATE;
}

void httpd_set_api_key(struct httpd *h, const char *key)
{
    if (h->api_key)
        explicit_bzero(h->api_key, strlen(h->api_key));
    free(h->api_key);
    h->api_key = key ? xstrdup(key) : NULL;
}

uint16_t httpd_port(const struct httpd *h)
{
    return h->port;
}

void httpd_route(struct httpd *h, const char *method, const char *pattern, httpd_handler fn,
                 void *arg, unsigned flags)
{
    if (!method || !*method || !fn || !httpd_pattern_valid(pattern)) {
        log_error("httpd_bad_route", LF_STR("server", h->name), LF_STR("method", method),
                  LF_STR("pattern", pattern));
        return;
    }
    if (h->nroutes == h->routes_cap) {
        h->routes_cap = h->routes_cap ? 2 * h->routes_cap : 16;
        h->routes = xrealloc(h->routes, h->routes_cap * sizeof(*h->routes));
    }
    h->routes[h->nroutes++] = (struct httpd_route_entry){.method = xstrdup(method),
                                                         .pattern = xstrdup(pattern),
                                                         .fn = fn,
                                                         .arg = arg,
                                                         .flags = flags};
}

const char *httpd_req_method(const struct httpd_req *req)
{
    return req->method;
}

const char *httpd_req_path(const struct httpd_req *req)
{
    return req->path;
}

const char *httpd_req_param(const struct httpd_req *req, const char *name)
{
    for (size_t i = 0; i < req->nparams; i++)
        if (strcmp(req->param_names[i], name) == 0)
            return req->param_values[i];
    return NULL;
}

const char *httpd_req_query(const struct httpd_req *req, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < req->nquery; i++)
        if (strcmp(req->query[i].name, name) == 0)
            return req->query[i].value;
    return NULL;
}

const char *httpd_req_header(const struct httpd_req *req, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < req->nhdrs; i++)
        if (strcasecmp(req->hdrs[i].name, name) == 0)
            return req->hdrs[i].value;
    return NULL;
}

const char *httpd_req_body(const struct httpd_req *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

json_t *httpd_req_json(const struct httpd_req *req, char *err_msg, size_t cap)
{
    if (req->body_len == 0) {
        if (cap)
            snprintf(err_msg, cap, "request body is empty");
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loadb(req->body, req->body_len, JSON_DECODE_ANY, &e);
    if (!j && cap)
        snprintf(err_msg, cap, "invalid JSON at line %d column %d: %s", e.line, e.column, e.text);
    return j;
}

const char *httpd_req_peer(const struct httpd_req *req)
{
    return req->peer;
}

int64_t httpd_req_start_ms(const struct httpd_req *req)
{
    return req->start_ms;
}

struct httpd *httpd_req_server(const struct httpd_req *req)
{
    return req->h;
}

void httpd_req_on_close(struct httpd_req *req, httpd_close_cb cb, void *arg)
{
    if (req->completed)
        return; /* already closing: the caller sees no further callback */
    req->on_close = cb;
    req->on_close_arg = arg;
}

bool httpd_req_client_gone(const struct httpd_req *req)
{
    return req->client_gone;
}

/* ---- answering ------------------------------------------------------------------------------ */

static bool header_text_ok(const char *s)
{
    for (; *s; s++)
        if (*s == '\r' || *s == '\n')
            return false;
    return true;
}

void httpd_add_header(struct httpd_req *req, const char *name, const char *value)
{
    if (!name || !value || req->answered || req->completed)
        return;
    if (!*name || !header_text_ok(name) || !header_text_ok(value) || strchr(name, ':')) {
        log_warn("httpd_bad_header", LF_STR("server", req->h->name), LF_STR("name", name));
        return;
    }
    /* Framing is the transport's business. */
    if (strcasecmp(name, "Content-Length") == 0 || strcasecmp(name, "Transfer-Encoding") == 0)
        return;
    if (strcasecmp(name, "Connection") == 0) {
        if (strcasecmp(value, "close") == 0)
            req->resp_close = true;
        return;
    }
    /* The whole line or nothing: a line cut before its CRLF would run into the framing
     * header the transport appends after these (the answer would lose its length). */
    size_t nl = strlen(name), vl = strlen(value);
    if (req->rhdrs.len > HTTPD_RESP_HEADERS_MAX ||
        nl + vl + 4 > HTTPD_RESP_HEADERS_MAX - req->rhdrs.len) {
        log_warn("httpd_headers_too_large", LF_STR("server", req->h->name), LF_STR("name", name));
        return;
    }
    if (req->rhdrs.cap == 0) /* the usual few headers in one allocation */
        strbuf_grow(&req->rhdrs, HTTPD_RESP_HEADERS_FIRST);
    strbuf_append(&req->rhdrs, name, nl);
    strbuf_append(&req->rhdrs, ": ", 2);
    strbuf_append(&req->rhdrs, value, vl);
    strbuf_append(&req->rhdrs, "\r\n", 2);
}

static bool can_answer(struct httpd_req *req, const char *what)
{
    if (req->completed || req->answered) {
        log_warn("httpd_answer_ignored", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_STR("call", what),
                 LF_STR("why", req->completed ? "request closed" : "already answered"));
        return false;
    }
    return true;
}

/* Content-Type, after the handler's headers. */
static void set_content_type(struct httpd_req *req, const char *ctype)
{
    /* At most 400: the line then fits whole in HTTPD_RESP_CTYPE_SLACK, past the cap of
     * the caller-added headers. Header order carries no meaning: appended last. */
    if (!ctype || !header_text_ok(ctype) || strlen(ctype) > 400)
        return;
    strbuf_puts(&req->rhdrs, "Content-Type: ");
    strbuf_puts(&req->rhdrs, ctype);
    strbuf_puts(&req->rhdrs, "\r\n");
}

/* Take ownership of a malloc'd body and answer with it. */
static void respond_take(struct httpd_req *req, int status, const char *content_type, char *body,
                         size_t len)
{
    if (!can_answer(req, "respond")) {
        free(body);
        return;
    }
    set_content_type(req, content_type ? content_type : "application/json");
    req->status = status;
    req->resp_body = body;
    req->resp_len = len;
    req->answered = true;
    httpd_native_kick(req);
}

void httpd_respond(struct httpd_req *req, int status, const char *content_type, const void *body,
                   size_t len)
{
    char *copy = xmalloc(len + 1);
    if (len)
        memcpy(copy, body, len);
    copy[len] = '\0';
    respond_take(req, status, content_type, copy, len);
}

void httpd_respond_json(struct httpd_req *req, int status, json_t *body)
{
    char *s = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(body);
    if (!s) {
        httpd_respond_error(req, 500, "response serialization failed");
        return;
    }
    respond_take(req, status, "application/json", s, strlen(s));
}

/* vLLM's error type names (create_error_response), by status: one table for the server's
 * own answers, the coordinator's and the simulator's. */
static const char *openai_error_type(int status)
{
    return http1_openai_error_type(status);
}

int httpd_error_json(const struct httpd *h, int status, const char *detail, char *buf, size_t cap)
{
    int n = h->openai_errors
                ? snprintf(buf, cap,
                           "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,"
                           "\"code\":%d}}",
                           detail, openai_error_type(status), status)
                : snprintf(buf, cap, "{\"detail\":\"%s\"}", detail);
    return n < 0 ? 0 : (size_t)n >= cap ? (int)cap - 1 : n;
}

void httpd_respond_error(struct httpd_req *req, int status, const char *detail)
{
    struct strbuf sb;
    strbuf_init(&sb, 64 * 1024);
    bool oa = req->h->openai_errors;
    strbuf_puts(&sb, oa ? "{\"error\":{\"message\":" : "{\"detail\":");
    if (strbuf_put_json_string(&sb, detail ? detail : "") != 0) {
        strbuf_reset(&sb);
        strbuf_puts(&sb, oa ? "{\"error\":{\"message\":\"error\"" : "{\"detail\":\"error\"");
    }
    if (oa)
        strbuf_appendf(&sb, ",\"type\":\"%s\",\"param\":null,\"code\":%d}",
                       openai_error_type(status), status);
    strbuf_putc(&sb, '}');
    size_t len = sb.len;
    respond_take(req, status, "application/json", strbuf_take(&sb), len);
}

static size_t stream_pending(const struct httpd_req *req)
{
    return req->sbuf.len - req->soff + httpd_native_unsent(req);
}

void httpd_stream_begin(struct httpd_req *req, int status, const char *content_type)
{
    if (!can_answer(req, "stream_begin"))
        return;
    set_content_type(req, content_type ? content_type : "text/event-stream");
    req->streaming = true;
    req->status = status;
    req->answered = true;
    httpd_native_kick(req);
}

int httpd_stream_write(struct httpd_req *req, const void *data, size_t len)
{
    if (req->completed || req->client_gone)
        return -EPIPE;
    if (!req->streaming || req->stream_ended)
        return -EINVAL;
    if (len == 0)
        return 0;
    if (stream_pending(req) + len > HTTPD_STREAM_MAX || strbuf_append(&req->sbuf, data, len) != 0) {
        log_warn("httpd_stream_overflow", LF_STR("server", req->h->name), LF_STR("path", req->path),
                 LF_INT("pending", stream_pending(req)));
        req->stream_ended = true;
        req->stream_abort = true;
        httpd_native_kick(req);
        return -E2BIG;
    }
    httpd_native_kick(req);
    return 0;
}

void httpd_stream_end(struct httpd_req *req, bool abort)
{
    if (!req->streaming || req->stream_ended || req->completed)
        return;
    req->stream_ended = true;
    req->stream_abort = abort;
    httpd_native_kick(req);
}

size_t httpd_stream_pending(const struct httpd_req *req)
{
    return req->streaming && !req->completed ? stream_pending(req) : 0;
}
