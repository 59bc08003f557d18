/* httpc — the public client: dispatches each request by URL scheme.
 *
 * http:// goes to the native HTTP/1.1 backend (httpc_native.c): it is on the proxy's
 * hot path and must cost little per request. https:// goes to libcurl (httpc_curl.c),
 * loaded and created on the first https request only, so processes that never use TLS
 * upstreams never map libcurl. Both backends keep their own re-entrancy bookkeeping;
 * this layer holds no per-request state, so a callback of either backend may free the
 * client: each backend defers its own teardown until its callbacks have unwound. */
#include "common/httpc.h"

#include "common/httpc_internal.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct httpc {
    struct reactor *r;
    struct httpc_native *native;
    struct httpc_curl *curl; /* NULL until the first https request */
};

struct httpc *httpc_new(struct reactor *r)
{
    if (!r)
        return NULL;
    struct httpc *c = xcalloc(1, sizeof(*c));
    c->r = r;
    c->native = httpc_native_new(r);
    if (!c->native) {
        free(c);
        return NULL;
    }
    return c;
}

void httpc_free(struct httpc *c)
{
    if (!c)
        return;
    httpc_native_free(c->native);
    httpc_curl_free(c->curl);
    free(c);
}

size_t httpc_active(const struct httpc *c)
{
    if (!c)
        return 0;
    return httpc_native_active(c->native) + (c->curl ? httpc_curl_active(c->curl) : 0);
}

static bool is_https(const char *url)
{
    return url && strncasecmp(url, "https://", 8) == 0;
}

struct httpc_req *httpc_request(struct httpc *c, const struct httpc_opts *opts, httpc_done_cb done,
                                void *arg)
{
    if (opts && is_https(opts->url)) {
        if (!c->curl) {
            const char *why = "";
            c->curl = httpc_curl_new(c->r, &why);
            if (!c->curl) /* e.g. "libcurl is not available (...); install it to use this feature" */
                return httpc_native_fail(c->native, -EIO, why && why[0] ? why : "libcurl unavailable",
                                         done, arg);
        }
        return httpc_curl_request(c->curl, opts, done, arg);
    }
    return httpc_native_request(c->native, opts, done, arg);
}

void httpc_cancel(struct httpc *c, struct httpc_req *req)
{
    if (!c || !req)
        return;
    if (((const struct httpc_req_hdr *)req)->is_curl)
        httpc_curl_cancel(c->curl, req);
    else
        httpc_native_cancel(c->native, req);
}

struct httpc_req *httpc_get(struct httpc *c, const char *url, int64_t timeout_ms,
                            httpc_done_cb done, void *arg)
{
    struct httpc_opts o = {.url = url, .timeout_ms = timeout_ms};
    return httpc_request(c, &o, done, arg);
}

struct httpc_req *httpc_post_json(struct httpc *c, const char *url, const json_t *body,
                                  int64_t timeout_ms, httpc_done_cb done, void *arg)
{
    char *s = NULL;
    if (body) {
        s = json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!s)
            return httpc_native_fail(c->native, -EINVAL, "body is not serializable JSON", done, arg);
    }
    struct httpc_opts o = {
        .method = "POST",
        .url = url,
        .body = s ? s : "",
        .body_len = s ? strlen(s) : 0,
        .content_type = "application/json",
        .timeout_ms = timeout_ms,
    };
    struct httpc_req *q = httpc_request(c, &o, done, arg);
    free(s);
    return q;
}
