/* httpc_curl — the https:// backend of httpc: libcurl multi driven by the reactor.
 *
 * libcurl is not linked: it is loaded with dlopen (common/dynlib.h) on the first https
 * request, and every curl_* function is called through the table below. A process that
 * never makes an https request never maps libcurl (nor its OpenSSL, Kerberos, LDAP,
 * nghttp2 ... dependencies): several MiB of resident memory the node manager cannot
 * afford. curl.h is included for its types and constants only.
 *
 * curl tells us which sockets to watch (CURLMOPT_SOCKETFUNCTION) and when to wake it
 * (CURLMOPT_TIMERFUNCTION); we turn those into reactor fd watches and one reactor
 * timer, and hand events back with curl_multi_socket_action().
 *
 * The hard part is re-entrancy. curl refuses multi calls (add/remove handle) from
 * inside its own callbacks, and user callbacks (status/chunk from curl's header/write
 * callbacks, done from our completion loop) may start or cancel requests, or even free
 * the client. So every request is in exactly one state, and work that cannot be done
 * where it is asked for is parked on a list and finished by service(), which runs
 * after curl returns (and from a deferred "kick" — the reactor's run-on-this-pass
 * queue — when nothing else would run it):
 *
 *   PENDING   created while inside curl, or failed before curl saw it (early error)
 *   ACTIVE    added to the multi handle
 *   ZOMBIE    cancelled while inside curl; still in the multi, callbacks suppressed
 *   COMPLETED finished by curl and removed from the multi; done not yet called
 *   FINISHING popped from a list, its done (or last on_status) is running
 *
 * The client itself is freed only when no entry point (socket event, timer, kick) is
 * on the stack: httpc_curl_free() from inside a callback only marks it. */
#include "common/httpc_internal.h"

#include "common/dynlib.h"
#include "common/log.h"
#include "common/strbuf.h"
#include "common/util.h"

/* Types and constants only: no call may bind to a linked libcurl. */
#define CURL_DISABLE_TYPECHECK 1
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- the libcurl function table ------------------------------------------------- */

static struct {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    void (*easy_reset)(CURL *);
    void (*easy_cleanup)(CURL *);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    const char *(*easy_strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_cleanup)(CURLM *);
    CURLMcode (*multi_setopt)(CURLM *, CURLMoption, ...);
    CURLMcode (*multi_add_handle)(CURLM *, CURL *);
    CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
    CURLMcode (*multi_socket_action)(CURLM *, curl_socket_t, int, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    const char *(*multi_strerror)(CURLMcode);
} cu;

static const char *const cu_symbols[] = {
    "curl_global_init",     "curl_easy_init",       "curl_easy_reset",
    "curl_easy_cleanup",    "curl_easy_setopt",     "curl_easy_getinfo",
    "curl_easy_strerror",   "curl_slist_append",    "curl_slist_free_all",
    "curl_multi_init",      "curl_multi_cleanup",   "curl_multi_setopt",
    "curl_multi_add_handle", "curl_multi_remove_handle", "curl_multi_socket_action",
    "curl_multi_info_read", "curl_multi_strerror",
};
_Static_assert(sizeof(cu_symbols) / sizeof(cu_symbols[0]) == sizeof(cu) / sizeof(void (*)(void)),
               "one symbol name per table slot");

static const char *const cu_sonames[] = {"libcurl.so.4", "libcurl-gnutls.so.4", NULL};
static struct dynlib cu_lib = DYNLIB_INIT("libcurl", cu_sonames, cu_symbols, &cu);

/* curl.h turns some of these names into argument-count-checking macros. */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#undef curl_multi_setopt
#define curl_global_init cu.global_init
#define curl_easy_init cu.easy_init
#define curl_easy_reset cu.easy_reset
#define curl_easy_cleanup cu.easy_cleanup
#define curl_easy_setopt cu.easy_setopt
#define curl_easy_getinfo cu.easy_getinfo
#define curl_easy_strerror cu.easy_strerror
#define curl_slist_append cu.slist_append
#define curl_slist_free_all cu.slist_free_all
#define curl_multi_init cu.multi_init
#define curl_multi_cleanup cu.multi_cleanup
#define curl_multi_setopt cu.multi_setopt
#define curl_multi_add_handle cu.multi_add_handle
#define curl_multi_remove_handle cu.multi_remove_handle
#define curl_multi_socket_action cu.multi_socket_action
#define curl_multi_info_read cu.multi_info_read
#define curl_multi_strerror cu.multi_strerror

#define HTTPC_EASY_POOL 32

enum { SOCK_NONE = 0, SOCK_WANTED };

enum req_state { REQ_PENDING, REQ_ACTIVE, REQ_ZOMBIE, REQ_COMPLETED, REQ_FINISHING };

struct req_list {
    struct httpc_req *head, *tail;
};

struct httpc_req {
    struct httpc_req_hdr hdr; /* first: is_curl = true */
    struct httpc_curl *c;
    struct httpc_req *prev, *next; /* links in the list of its state */
    enum req_state state;
    CURL *easy;
    struct curl_slist *headers;
    char *body; /* our copy: CURLOPT_POSTFIELDS does not copy */

    httpc_done_cb done;
    httpc_status_cb on_status;
    httpc_chunk_cb on_chunk;
    void *arg;

    struct strbuf resp;
    int64_t start_ms;
    CURLcode result;
    int early_error;        /* failed before curl got it (-errno) */
    const char *early_text; /* static text for early_error */
    bool cancelled;         /* no callback may run any more */
    bool status_sent;
    bool aborted_by_cb; /* on_status/on_chunk asked to stop */
    bool too_big;
    char errbuf[CURL_ERROR_SIZE];
};

struct httpc_curl {
    struct reactor *r;
    CURLM *multi;
    struct reactor_timer timer;     /* curl's timeout */
    struct reactor_deferred expire; /* curl asked for timeout 0: act at the end of this pass */
    struct reactor_deferred kick;   /* run service() at the end of this pass */

    struct req_list pending, active, zombies, completed;
    size_t nactive; /* requests the user still waits for */

    int depth;    /* entry points on the stack */
    bool in_curl; /* inside curl_multi_socket_action: curl callbacks may run */
    bool freeing; /* httpc_free() was called while depth > 0 */

    /* Per socket number: SOCK_NONE, or SOCK_WANTED (registered with the reactor because
     * curl watches it; unregistered as soon as curl stops watching, see socket_cb). */
    uint8_t *sst;
    size_t nsst;

    /* Easy handles of finished requests, reset and ready for the next one: creating
     * and destroying one per request was a visible part of a proxied request's cost. */
    CURL *easy_pool[HTTPC_EASY_POOL];
    size_t neasy;
    bool closing; /* really_free() running: no pooling */
};

/* ---- small helpers ---------------------------------------------------------------- */

static void list_push(struct req_list *l, struct httpc_req *q)
{
    q->next = NULL;
    q->prev = l->tail;
    if (l->tail)
        l->tail->next = q;
    else
        l->head = q;
    l->tail = q;
}

static void list_unlink(struct req_list *l, struct httpc_req *q)
{
    if (q->prev)
        q->prev->next = q->next;
    else
        l->head = q->next;
    if (q->next)
        q->next->prev = q->prev;
    else
        l->tail = q->prev;
    q->prev = q->next = NULL;
}

static struct httpc_req *list_pop(struct req_list *l)
{
    struct httpc_req *q = l->head;
    if (q)
        list_unlink(l, q);
    return q;
}

static struct req_list *list_of(struct httpc_curl *c, enum req_state s)
{
    switch (s) {
    case REQ_PENDING:
        return &c->pending;
    case REQ_ACTIVE:
        return &c->active;
    case REQ_ZOMBIE:
        return &c->zombies;
    case REQ_COMPLETED:
        return &c->completed;
    case REQ_FINISHING:
        break;
    }
    return NULL;
}

static void set_state(struct httpc_req *q, enum req_state s)
{
    struct req_list *from = list_of(q->c, q->state);
    if (from)
        list_unlink(from, q);
    q->state = s;
    struct req_list *to = list_of(q->c, s);
    if (to)
        list_push(to, q);
}

/* Frees a request that curl no longer holds (removed, or never added). */
static void req_destroy(struct httpc_req *q)
{
    struct httpc_curl *c = q->c;
    if (q->easy) {
        if (!c->closing && c->neasy < HTTPC_EASY_POOL) {
            curl_easy_reset(q->easy);
            c->easy_pool[c->neasy++] = q->easy;
        } else {
            curl_easy_cleanup(q->easy);
        }
    }
    curl_slist_free_all(q->headers);
    free(q->body);
    strbuf_release(&q->resp);
    free(q);
}

static void arm_kick(struct httpc_curl *c)
{
    reactor_defer(c->r, &c->kick);
}

static int sock_state(const struct httpc_curl *c, int fd)
{
    return fd >= 0 && (size_t)fd < c->nsst ? c->sst[fd] : SOCK_NONE;
}

static void sock_set(struct httpc_curl *c, int fd, int st)
{
    if ((size_t)fd >= c->nsst) {
        if (st == SOCK_NONE)
            return;
        size_t n = c->nsst ? c->nsst : 64;
        while (n <= (size_t)fd)
            n *= 2;
        c->sst = xrealloc(c->sst, n);
        memset(c->sst + c->nsst, 0, n - c->nsst);
        c->nsst = n;
    }
    c->sst[fd] = (uint8_t)st;
}

/* Take a socket out of the reactor (it stays open: curl owns it). */
static void sock_forget(struct httpc_curl *c, int fd)
{
    if (sock_state(c, fd) == SOCK_NONE)
        return;
    reactor_del_fd(c->r, fd);
    sock_set(c, fd, SOCK_NONE);
}

/* ---- curl -> reactor ------------------------------------------------------------- */

static void drive(struct httpc_curl *c, curl_socket_t fd, int flags);

static void on_sock_event(struct reactor *r, int fd, uint32_t events, void *arg)
{
    int flags = 0;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP))
        flags |= CURL_CSELECT_IN;
    if (events & EPOLLOUT)
        flags |= CURL_CSELECT_OUT;
    if (events & EPOLLERR)
        flags |= CURL_CSELECT_ERR;
    drive(arg, fd, flags);
}

static void on_curl_timer(struct reactor *r, void *arg)
{
    drive(arg, CURL_SOCKET_TIMEOUT, 0);
}

static void on_curl_expire(struct reactor *r, void *arg)
{
    drive(arg, CURL_SOCKET_TIMEOUT, 0);
}

static int socket_cb(CURL *easy, curl_socket_t s, int what, void *userp, void *socketp)
{
    struct httpc_curl *c = userp;
    if (what == CURL_POLL_REMOVE) {
        /* Unregister at once. Keeping idle keep-alive sockets registered saved an
         * epoll_ctl per request when curl carried every leg, but curl 7.88 closes a socket
         * whose connect timed out without calling close_cb, which left a watch on a dead
         * number that the next accept() or socket() reused (EEXIST for its owner). Only
         * https:// goes through curl now, so the saving is not worth that hazard. */
        sock_forget(c, s);
        return 0;
    }
    uint32_t ev = 0;
    if (what == CURL_POLL_IN || what == CURL_POLL_INOUT)
        ev |= EPOLLIN;
    if (what == CURL_POLL_OUT || what == CURL_POLL_INOUT)
        ev |= EPOLLOUT;
    if (sock_state(c, s) != SOCK_NONE) {
        if (reactor_mod_fd(c->r, s, ev) == 0) {
            sock_set(c, s, SOCK_WANTED);
            return 0;
        }
        /* The number was closed and reused behind our back (the old epoll
         * registration died with the old socket): start over. */
        sock_forget(c, s);
    }
    int rc = reactor_add_fd(c->r, s, ev, on_sock_event, c);
    if (rc != 0) {
        log_error("httpc_watch_failed", LF_INT("fd", s), LF_INT("errno", -rc));
        return -1; /* curl fails the transfers on this socket */
    }
    sock_set(c, s, SOCK_WANTED);
    return 0;
}

/* Every socket curl opened for us is closed here, so none stays registered with the
 * reactor under a number that may be reused. */
static int close_cb(void *clientp, curl_socket_t s)
{
    sock_forget(clientp, s);
    return close(s);
}

/* curl's single timeout; a new value replaces the previous one. Timeout 0 (every
 * curl_multi_add_handle asks for it) is the hot path: it goes to the deferred queue, so
 * the transfer starts at the end of this loop pass without a timer round trip. */
static int timer_cb(CURLM *multi, long timeout_ms, void *userp)
{
    struct httpc_curl *c = userp;
    if (timeout_ms == 0) {
        reactor_timer_stop(c->r, &c->timer);
        reactor_defer(c->r, &c->expire);
        return 0;
    }
    reactor_defer_cancel(c->r, &c->expire);
    if (timeout_ms < 0)
        reactor_timer_stop(c->r, &c->timer);
    else
        reactor_timer_start(c->r, &c->timer, timeout_ms, 0);
    return 0;
}

/* ---- per-request curl callbacks (run inside curl_multi_socket_action) ------------ */

static bool req_dead(const struct httpc_req *q)
{
    return q->cancelled || q->c->freeing;
}

static void send_status(struct httpc_req *q)
{
    q->status_sent = true;
    if (!q->on_status)
        return;
    long status = 0;
    char *ct = NULL;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(q->easy, CURLINFO_CONTENT_TYPE, &ct);
    if (q->on_status(status, ct, q->arg) != 0)
        q->aborted_by_cb = true;
}

static size_t header_cb(char *data, size_t size, size_t nitems, void *userp)
{
    struct httpc_req *q = userp;
    size_t n = size * nitems;
    if (req_dead(q) || q->aborted_by_cb)
        return 0;
    if (q->status_sent)
        return n; /* trailers */
    /* The blank line ends a header block. A 1xx block is followed by the real one. */
    if (!((n == 2 && data[0] == '\r' && data[1] == '\n') || (n == 1 && data[0] == '\n')))
        return n;
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 100 && status < 200)
        return n;
    send_status(q);
    if (req_dead(q) || q->aborted_by_cb)
        return 0; /* abort: curl ends the transfer with CURLE_WRITE_ERROR */
    return n;
}

static size_t write_cb(char *data, size_t size, size_t nmemb, void *userp)
{
    struct httpc_req *q = userp;
    size_t n = size * nmemb;
    if (req_dead(q) || q->aborted_by_cb || q->too_big)
        return 0;
    if (!q->status_sent) {
        send_status(q);
        if (req_dead(q) || q->aborted_by_cb)
            return 0;
    }
    if (q->on_chunk) {
        if (n && q->on_chunk(data, n, q->arg) != 0)
            q->aborted_by_cb = true;
        if (req_dead(q) || q->aborted_by_cb)
            return 0;
        return n;
    }
    if (strbuf_append(&q->resp, data, n) != 0) {
        q->too_big = true;
        return 0;
    }
    return n;
}

/* ---- completion ------------------------------------------------------------------ */

static int map_curlcode(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return 0;
    case CURLE_OPERATION_TIMEDOUT:
        return -ETIMEDOUT;
    case CURLE_COULDNT_CONNECT:
        return -ECONNREFUSED;
    case CURLE_FILESIZE_EXCEEDED:
        return -E2BIG;
    case CURLE_WEIRD_SERVER_REPLY:
        return -EPROTO;
    default:
        return -EIO;
    }
}

/* Calls done (unless cancelled meanwhile) and frees q. q is FINISHING: in no list. */
static void finish(struct httpc_req *q)
{
    struct httpc_curl *c = q->c;
    int err;
    const char *text = "";
    long status = 0;
    char *ct = NULL;

    if (q->early_error) {
        err = q->early_error;
        text = q->early_text ? q->early_text : "";
    } else {
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(q->easy, CURLINFO_CONTENT_TYPE, &ct);
        if (q->too_big || q->result == CURLE_FILESIZE_EXCEEDED) {
            err = -E2BIG;
            text = "response larger than max_response";
        } else if (q->aborted_by_cb) {
            err = -ECANCELED;
            text = "aborted by callback";
        } else {
            err = map_curlcode(q->result);
            if (err)
                text = q->errbuf[0] ? q->errbuf : curl_easy_strerror(q->result);
        }
        /* The header callback normally reported the status at the end of the
         * headers; should curl ever not have shown us that blank line (and a bodiless
         * response never reaches the write callback), the status still comes first. */
        if (err == 0 && status > 0 && !q->status_sent) {
            send_status(q);
            if (q->aborted_by_cb) {
                err = -ECANCELED;
                text = "aborted by callback";
            }
        }
    }
    if (!req_dead(q)) {
        c->nactive--;
        /* From here on a cancel (even of itself, from inside done) is a no-op. */
        q->cancelled = true;
        struct httpc_response resp = {
            .error = err,
            .error_text = text,
            .status = status,
            .body = strbuf_str(&q->resp),
            .body_len = q->resp.len,
            .content_type = ct,
            .elapsed_ms = util_mono_ms() - q->start_ms,
        };
        if (q->done)
            q->done(&resp, q->arg);
    }
    req_destroy(q);
}

static void drain_curl_messages(struct httpc_curl *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left))) {
        if (m->msg != CURLMSG_DONE)
            continue;
        char *priv = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, &priv);
        struct httpc_req *q = (struct httpc_req *)priv;
        CURLcode result = m->data.result;
        curl_multi_remove_handle(c->multi, m->easy_handle); /* m is invalid now */
        if (!q)
            continue;
        if (q->state == REQ_ZOMBIE) {
            list_unlink(&c->zombies, q);
            req_destroy(q);
            continue;
        }
        q->result = result;
        set_state(q, REQ_COMPLETED);
    }
}

/* Does everything that could not be done inside curl: reap cancelled transfers,
 * deliver completions, add requests created meanwhile. Never inside curl. */
static void service(struct httpc_curl *c)
{
    while (!c->freeing) {
        bool did = false;
        struct httpc_req *q;
        while ((q = list_pop(&c->zombies))) {
            q->state = REQ_FINISHING;
            curl_multi_remove_handle(c->multi, q->easy);
            req_destroy(q);
            did = true;
        }
        drain_curl_messages(c);
        while (!c->freeing && (q = list_pop(&c->completed))) {
            q->state = REQ_FINISHING;
            finish(q);
            did = true;
        }
        while (!c->freeing && (q = list_pop(&c->pending))) {
            did = true;
            if (!q->early_error) {
                CURLMcode mrc = curl_multi_add_handle(c->multi, q->easy);
                if (mrc == CURLM_OK) {
                    q->state = REQ_ACTIVE;
                    list_push(&c->active, q);
                    continue;
                }
                q->early_error = -EIO;
                q->early_text = curl_multi_strerror(mrc);
            }
            q->state = REQ_FINISHING;
            finish(q);
        }
        if (!did)
            break;
    }
}

static void really_free(struct httpc_curl *c);

static void leave(struct httpc_curl *c)
{
    if (--c->depth == 0 && c->freeing)
        really_free(c);
}

static void drive(struct httpc_curl *c, curl_socket_t fd, int flags)
{
    int running = 0;
    c->depth++;
    c->in_curl = true;
    curl_multi_socket_action(c->multi, fd, flags, &running);
    c->in_curl = false;
    service(c);
    leave(c);
}

static void on_kick(struct reactor *r, void *arg)
{
    struct httpc_curl *c = arg;
    c->depth++;
    service(c);
    leave(c);
}

/* ---- lifecycle ------------------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static int curl_load_rc = -ENOENT;
static const char *curl_load_why = "libcurl not loaded";

static void curl_init_once(void)
{
    int rc = dynlib_load(&cu_lib);
    if (rc != 0) {
        curl_load_rc = rc;
        curl_load_why = dynlib_error(&cu_lib);
        return;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        curl_load_rc = -EIO;
        curl_load_why = "curl_global_init failed";
        return;
    }
    curl_load_rc = 0;
    curl_load_why = "";
}

int httpc_curl_load(const char **why)
{
    pthread_once(&curl_once, curl_init_once);
    *why = curl_load_why;
    return curl_load_rc;
}

struct httpc_curl *httpc_curl_new(struct reactor *r, const char **why)
{
    if (httpc_curl_load(why) != 0)
        return NULL;
    struct httpc_curl *c = xcalloc(1, sizeof(*c));
    c->r = r;
    reactor_timer_init(&c->timer, on_curl_timer, c);
    reactor_deferred_init(&c->expire, on_curl_expire, c);
    reactor_deferred_init(&c->kick, on_kick, c);
    c->multi = curl_multi_init();
    if (!c->multi) {
        *why = "curl_multi_init failed";
        free(c);
        return NULL;
    }
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, socket_cb);
    curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, timer_cb);
    curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
    return c;
}

static void destroy_list(struct httpc_curl *c, struct req_list *l, bool in_multi)
{
    struct httpc_req *q;
    while ((q = list_pop(l))) {
        if (in_multi)
            curl_multi_remove_handle(c->multi, q->easy);
        req_destroy(q);
    }
}

static void really_free(struct httpc_curl *c)
{
    c->closing = true;
    destroy_list(c, &c->active, true);
    destroy_list(c, &c->zombies, true);
    destroy_list(c, &c->completed, false);
    destroy_list(c, &c->pending, false);
    curl_multi_cleanup(c->multi); /* closes the cached connections (close_cb) */
    while (c->neasy)
        curl_easy_cleanup(c->easy_pool[--c->neasy]);
    for (size_t fd = 0; fd < c->nsst; fd++)
        sock_forget(c, (int)fd);
    free(c->sst);
    reactor_timer_stop(c->r, &c->timer);
    reactor_defer_cancel(c->r, &c->expire);
    reactor_defer_cancel(c->r, &c->kick);
    free(c);
}

void httpc_curl_free(struct httpc_curl *c)
{
    if (!c)
        return;
    if (c->depth > 0) {
        /* Inside one of our callbacks: curl and our loops are on the stack. Silence
         * everything now; the outermost entry point frees on its way out. */
        c->freeing = true;
        return;
    }
    really_free(c);
}

size_t httpc_curl_active(const struct httpc_curl *c)
{
    return c ? c->nactive : 0;
}

/* ---- starting requests ----------------------------------------------------------- */

#define SETOPT(easy, opt, val)                                                                     \
    do {                                                                                           \
        if (curl_easy_setopt((easy), (opt), (val)) != CURLE_OK)                                    \
            goto bad_option;                                                                       \
    } while (0)

static struct curl_slist *slist_add(struct curl_slist *l, const char *s)
{
    struct curl_slist *n = curl_slist_append(l, s);
    if (!n) {
        /* Small allocations abort on OOM (CONVENTIONS §8), like xmalloc. */
        log_error("httpc_out_of_memory");
        abort();
    }
    return n;
}

/* Configures q->easy from opts. 0, or -EINVAL with q->early_text set. */
static int configure(struct httpc_req *q, const struct httpc_opts *o)
{
    CURL *e = q->easy;
    const char *method = o->method;
    bool has_body = o->body != NULL;
    if (!method)
        method = has_body ? "POST" : "GET";
    bool is_post = strcasecmp(method, "POST") == 0;

    int64_t timeout = o->timeout_ms > 0 ? o->timeout_ms : HTTPC_DEFAULT_TIMEOUT_MS;
    int64_t ctimeout = o->connect_timeout_ms > 0
                           ? o->connect_timeout_ms
                           : MOTOR_MIN(timeout, HTTPC_DEFAULT_CONNECT_TIMEOUT_MS);
    size_t max = o->max_response ? o->max_response : HTTPC_DEFAULT_MAX_RESPONSE;
    strbuf_init(&q->resp, max);

    SETOPT(e, CURLOPT_PRIVATE, (char *)q);
    SETOPT(e, CURLOPT_URL, o->url);
    SETOPT(e, CURLOPT_PROTOCOLS_STR, "http,https");
    SETOPT(e, CURLOPT_NOSIGNAL, 1L);
    SETOPT(e, CURLOPT_TCP_NODELAY, 1L);
    SETOPT(e, CURLOPT_CLOSESOCKETFUNCTION, close_cb);
    SETOPT(e, CURLOPT_CLOSESOCKETDATA, q->c);
    /* Operators' http_proxy must never capture loopback control traffic. */
    SETOPT(e, CURLOPT_NOPROXY, "*");
    SETOPT(e, CURLOPT_PROXY, "");
    SETOPT(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    SETOPT(e, CURLOPT_TIMEOUT_MS, (long)timeout);
    SETOPT(e, CURLOPT_CONNECTTIMEOUT_MS, (long)ctimeout);
    SETOPT(e, CURLOPT_ERRORBUFFER, q->errbuf);
    SETOPT(e, CURLOPT_WRITEFUNCTION, write_cb);
    SETOPT(e, CURLOPT_WRITEDATA, q);
    SETOPT(e, CURLOPT_HEADERFUNCTION, header_cb);
    SETOPT(e, CURLOPT_HEADERDATA, q);
    if (!o->on_chunk) /* fail early when Content-Length already says it is too big */
        SETOPT(e, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max);

    bool user_ctype = false;
    for (const char *const *h = o->headers; h && *h; h++) {
        /* A CR or LF would let a caller's value smuggle headers or a second request. */
        if (strpbrk(*h, "\r\n")) {
            q->early_text = "header contains CR or LF";
            return -EINVAL;
        }
        if (strncasecmp(*h, "Content-Type:", strlen("Content-Type:")) == 0)
            user_ctype = true;
    }

    if (has_body || is_post) {
        size_t len = has_body ? (o->body_len ? o->body_len : strlen(o->body)) : 0;
        q->body = xmalloc(len + 1);
        if (len)
            memcpy(q->body, o->body, len);
        q->body[len] = '\0';
        SETOPT(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        SETOPT(e, CURLOPT_POSTFIELDS, q->body);
        if (!is_post)
            SETOPT(e, CURLOPT_CUSTOMREQUEST, method);
        if (!user_ctype) {
            char *ct = xasprintf("Content-Type: %s",
                                 o->content_type ? o->content_type : "application/json");
            q->headers = slist_add(q->headers, ct);
            free(ct);
        }
        /* No 100-continue round trip: our peers answer at once. */
        q->headers = slist_add(q->headers, "Expect:");
    } else if (strcasecmp(method, "HEAD") == 0) {
        SETOPT(e, CURLOPT_NOBODY, 1L);
    } else if (strcasecmp(method, "GET") != 0) {
        SETOPT(e, CURLOPT_CUSTOMREQUEST, method);
    }
    for (const char *const *h = o->headers; h && *h; h++) {
        /* As the native client: the framing is curl's, a caller's copy is dropped. */
        if (strncasecmp(*h, "Content-Length:", 15) == 0 ||
            strncasecmp(*h, "Transfer-Encoding:", 18) == 0)
            continue;
        q->headers = slist_add(q->headers, *h);
    }
    if (q->headers)
        SETOPT(e, CURLOPT_HTTPHEADER, q->headers);

    const struct httpc_tls *t = o->tls;
    if (t) {
        if (t->ca_file)
            SETOPT(e, CURLOPT_CAINFO, t->ca_file);
        if (t->cert_file)
            SETOPT(e, CURLOPT_SSLCERT, t->cert_file);
        if (t->key_file)
            SETOPT(e, CURLOPT_SSLKEY, t->key_file);
        if (t->key_password)
            SETOPT(e, CURLOPT_KEYPASSWD, t->key_password);
        if (t->insecure) {
            SETOPT(e, CURLOPT_SSL_VERIFYPEER, 0L);
            SETOPT(e, CURLOPT_SSL_VERIFYHOST, 0L);
        }
    }
    return 0;
bad_option:
    q->early_text = "unsupported request option";
    return -EINVAL;
}

static struct httpc_req *start(struct httpc_curl *c, const struct httpc_opts *o, httpc_done_cb done,
                               void *arg, int early_error, const char *early_text)
{
    struct httpc_req *q = xcalloc(1, sizeof(*q));
    q->hdr.is_curl = true;
    q->c = c;
    q->done = done;
    q->arg = arg;
    q->start_ms = util_mono_ms();
    q->state = REQ_FINISHING; /* in no list yet */
    strbuf_init(&q->resp, 1);
    c->nactive++;
    if (early_error) {
        q->early_error = early_error;
        q->early_text = early_text;
    } else if (!o || !o->url || !o->url[0]) {
        q->early_error = -EINVAL;
        q->early_text = "no url";
    } else {
        q->on_status = o->on_status;
        q->on_chunk = o->on_chunk;
        q->easy = c->neasy ? c->easy_pool[--c->neasy] : curl_easy_init();
        if (!q->easy) {
            q->early_error = -ENOMEM;
            q->early_text = "curl_easy_init failed";
        } else {
            q->early_error = configure(q, o);
        }
    }
    if (!q->early_error && !c->in_curl) {
        CURLMcode mrc = curl_multi_add_handle(c->multi, q->easy);
        if (mrc == CURLM_OK) {
            set_state(q, REQ_ACTIVE);
            return q;
        }
        q->early_error = -EIO;
        q->early_text = curl_multi_strerror(mrc);
    }
    /* done must never run inside httpc_request(), and curl must not be entered from
     * its own callbacks: hand it to service(). */
    set_state(q, REQ_PENDING);
    arm_kick(c);
    return q;
}

struct httpc_req *httpc_curl_request(struct httpc_curl *c, const struct httpc_opts *opts, httpc_done_cb done,
                                void *arg)
{
    return start(c, opts, done, arg, 0, NULL);
}

void httpc_curl_cancel(struct httpc_curl *c, struct httpc_req *q)
{
    if (!c || !q || q->cancelled)
        return;
    q->cancelled = true;
    c->nactive--;
    switch (q->state) {
    case REQ_FINISHING:
        /* Its done (or last on_status) is on the stack: finish() frees it. */
        break;
    case REQ_PENDING:
    case REQ_COMPLETED:
        list_unlink(list_of(c, q->state), q);
        req_destroy(q);
        break;
    case REQ_ACTIVE:
        if (c->in_curl) {
            /* curl is on the stack (maybe in this very request's write callback):
             * its callbacks now abort the transfer; service() removes it. */
            set_state(q, REQ_ZOMBIE);
            arm_kick(c);
        } else {
            list_unlink(&c->active, q);
            curl_multi_remove_handle(c->multi, q->easy);
            req_destroy(q);
        }
        break;
    case REQ_ZOMBIE:
        break;
    }
}
