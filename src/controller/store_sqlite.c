/* store_sqlite — one SQLite file in WAL mode; leadership through flock on a side file;
 * and the in-memory backend (nothing persists). Both complete every operation
 * synchronously (SQLite in WAL mode with synchronous=NORMAL commits in tens of µs). */
#include "controller/store_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

struct sq {
    sqlite3 *db;
    sqlite3_stmt *put, *del, *all;
    char *lock_path;
    int lock_fd;
    /* deferred load (the interface promises a callback from the loop) */
    struct reactor_timer load_timer;
    store_load_cb load_cb;
    void *load_arg;
};

static int exec(sqlite3 *db, const char *sql, char *err, size_t cap)
{
    char *msg = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        snprintf(err, cap, "%s: %s", sql, msg ? msg : sqlite3_errmsg(db));
        sqlite3_free(msg);
        return -EIO;
    }
    return 0;
}

static void sq_campaign(struct store *st)
{
    struct sq *q = st->impl;
    if (q->lock_fd < 0) {
        q->lock_fd = open(q->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (q->lock_fd < 0) {
            log_error("store_lock_open_failed", LF_STR("path", q->lock_path),
                      LF_STR("error", strerror(errno)));
            store_campaign_retry(st, NULL);
            return;
        }
    }
    if (flock(q->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        char owner[256] = "";
        ssize_t n = pread(q->lock_fd, owner, sizeof(owner) - 1, 0);
        owner[n > 0 ? n : 0] = '\0';
        owner[strcspn(owner, "\n")] = '\0';
        store_campaign_retry(st, owner);
        return;
    }
    /* Ours: leave our identity in the file for the standby's logs and /readiness. */
    if (ftruncate(q->lock_fd, 0) == 0) {
        char *line = xasprintf("%s\n", st->owner);
        if (pwrite(q->lock_fd, line, strlen(line), 0) < 0)
            log_warn("store_lock_write_failed", LF_STR("error", strerror(errno)));
        free(line);
    }
    store_set_leader(st, true, st->owner);
}

static void sq_load_now(struct reactor *r, void *arg)
{
    (void)r;
    struct store *st = arg;
    struct sq *q = st->impl;
    struct store_kv *kvs = NULL;
    size_t n = 0, cap = 0;
    int rc = 0, s;
    sqlite3_reset(q->all);
    while ((s = sqlite3_step(q->all)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            kvs = xrealloc(kvs, cap * sizeof(*kvs));
        }
        kvs[n].key = xstrdup((const char *)sqlite3_column_text(q->all, 0));
        kvs[n].value = xstrdup((const char *)sqlite3_column_text(q->all, 1));
        n++;
    }
    if (s != SQLITE_DONE) {
        log_error("store_load_failed", LF_STR("error", sqlite3_errmsg(q->db)));
        rc = -EIO;
    }
    sqlite3_reset(q->all);
    store_load_cb cb = q->load_cb;
    q->load_cb = NULL;
    if (cb)
        cb(st, rc, rc ? NULL : kvs, rc ? 0 : n, q->load_arg);
    for (size_t i = 0; i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

static void sq_load(struct store *st, store_load_cb cb, void *arg)
{
    struct sq *q = st->impl;
    q->load_cb = cb;
    q->load_arg = arg;
    reactor_timer_start(st->r, &q->load_timer, 0, 0);
}

static void sq_write(struct store *st, struct store_op *op)
{
    struct sq *q = st->impl;
    sqlite3_stmt *s = op->value ? q->put : q->del;
    sqlite3_reset(s);
    sqlite3_bind_text(s, 1, op->key, -1, SQLITE_TRANSIENT);
    if (op->value)
        sqlite3_bind_text(s, 2, op->value, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        log_error("store_sqlite_write_failed", LF_STR("key", op->key),
                  LF_STR("error", sqlite3_errmsg(q->db)));
    store_write_done(st, op, rc == SQLITE_DONE ? 0 : -EIO);
}

static void sq_free(struct store *st)
{
    struct sq *q = st->impl;
    if (!q)
        return;
    reactor_timer_stop(st->r, &q->load_timer);
    sqlite3_finalize(q->put);
    sqlite3_finalize(q->del);
    sqlite3_finalize(q->all);
    sqlite3_close(q->db);
    if (q->lock_fd >= 0)
        close(q->lock_fd); /* releases the flock */
    free(q->lock_path);
    free(q);
    st->impl = NULL;
}

static const struct store_backend_ops sq_ops = {
    .campaign = sq_campaign,
    .load = sq_load,
    .write = sq_write,
    .free = sq_free,
};

int store_sqlite_open(struct store *st, const struct store_opts *o, char *err, size_t cap)
{
    if (!o->sqlite_path || !*o->sqlite_path) {
        snprintf(err, cap, "sqlite: no path");
        return -EINVAL;
    }
    struct sq *q = xcalloc(1, sizeof(*q));
    q->lock_fd = -1;
    q->lock_path = xasprintf("%s.lock", o->sqlite_path);
    reactor_timer_init(&q->load_timer, sq_load_now, st);
    st->impl = q;
    st->ops = &sq_ops;
    int rc =
        sqlite3_open_v2(o->sqlite_path, &q->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        snprintf(err, cap, "sqlite: cannot open %s: %s", o->sqlite_path,
                 q->db ? sqlite3_errmsg(q->db) : sqlite3_errstr(rc));
        goto fail;
    }
    sqlite3_busy_timeout(q->db, 2000);
    /* WAL: readers never block the writer and a crash (SIGKILL) loses nothing that was
     * committed; synchronous=NORMAL only risks the last commits on power loss. */
    if (exec(q->db, "PRAGMA journal_mode=WAL", err, cap) < 0 ||
        exec(q->db, "PRAGMA synchronous=NORMAL", err, cap) < 0 ||
        exec(q->db, "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
             err, cap) < 0)
        goto fail;
    if (sqlite3_prepare_v2(q->db, "INSERT OR REPLACE INTO kv(key, value) VALUES (?1, ?2)", -1,
                           &q->put, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(q->db, "DELETE FROM kv WHERE key = ?1", -1, &q->del, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(q->db, "SELECT key, value FROM kv ORDER BY key", -1, &q->all, NULL) !=
            SQLITE_OK) {
        snprintf(err, cap, "sqlite: prepare failed: %s", sqlite3_errmsg(q->db));
        goto fail;
    }
    return 0;
fail:
    sq_free(st);
    return -EIO;
}

/* ---- memory backend ------------------------------------------------------------------ */

struct mem {
    struct store_kv *kvs;
    size_t n;
    struct reactor_timer load_timer;
    store_load_cb load_cb;
    void *load_arg;
};

static void mem_campaign(struct store *st)
{
    store_set_leader(st, true, st->owner);
}

static void mem_load_now(struct reactor *r, void *arg)
{
    (void)r;
    struct store *st = arg;
    struct mem *m = st->impl;
    store_load_cb cb = m->load_cb;
    m->load_cb = NULL;
    if (cb)
        cb(st, 0, m->kvs, m->n, m->load_arg);
}

static void mem_load(struct store *st, store_load_cb cb, void *arg)
{
    struct mem *m = st->impl;
    m->load_cb = cb;
    m->load_arg = arg;
    reactor_timer_start(st->r, &m->load_timer, 0, 0);
}

static void mem_write(struct store *st, struct store_op *op)
{
    struct mem *m = st->impl;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->kvs[i].key, op->key) != 0)
            continue;
        free(m->kvs[i].value);
        if (op->value) {
            m->kvs[i].value = xstrdup(op->value);
        } else {
            free(m->kvs[i].key);
            m->kvs[i] = m->kvs[--m->n];
        }
        store_write_done(st, op, 0);
        return;
    }
    if (op->value) {
        m->kvs = xrealloc(m->kvs, (m->n + 1) * sizeof(*m->kvs));
        m->kvs[m->n].key = xstrdup(op->key);
        m->kvs[m->n].value = xstrdup(op->value);
        m->n++;
    }
    store_write_done(st, op, 0);
}

static void mem_free(struct store *st)
{
    struct mem *m = st->impl;
    if (!m)
        return;
    reactor_timer_stop(st->r, &m->load_timer);
    for (size_t i = 0; i < m->n; i++) {
        free(m->kvs[i].key);
        free(m->kvs[i].value);
    }
    free(m->kvs);
    free(m);
    st->impl = NULL;
}

static const struct store_backend_ops mem_ops = {
    .campaign = mem_campaign,
    .load = mem_load,
    .write = mem_write,
    .free = mem_free,
};

int store_memory_open(struct store *st, const struct store_opts *o, char *err, size_t cap)
{
    (void)o;
    (void)err;
    (void)cap;
    struct mem *m = xcalloc(1, sizeof(*m));
    reactor_timer_init(&m->load_timer, mem_load_now, st);
    st->impl = m;
    st->ops = &mem_ops;
    return 0;
}
