/* pool_store — the worker pool's records in SQLite: manifests, one row per instance,
 * and every state transition with its time and cause.
 *
 * Writes happen on the reactor thread, so they must be cheap: WAL with
 * synchronous=NORMAL (a commit is an append to the WAL, no fsync per transition), and
 * nothing is written on the warm call path (an instance's call count and last use are
 * written with its next transition). A failed write is logged and the pool goes on:
 * records are for operators, they never decide what the pool does. */
#include "pool/pool_internal.h"

#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

struct pool_store {
    sqlite3 *db;
    sqlite3_stmt *node_put, *node_del, *inst_put, *trans_put;
};

static const char SCHEMA[] =
    "CREATE TABLE IF NOT EXISTS pool_nodes ("
    "  id TEXT PRIMARY KEY, manifest TEXT NOT NULL, source TEXT NOT NULL,"
    "  created_at TEXT NOT NULL, updated_at TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS pool_instances ("
    "  id TEXT PRIMARY KEY, node_id TEXT NOT NULL, state TEXT NOT NULL, pid INTEGER,"
    "  address TEXT, started_at TEXT, ready_at TEXT, stopped_at TEXT, last_used_at TEXT,"
    "  calls INTEGER NOT NULL DEFAULT 0, error TEXT, stderr_tail TEXT, manifest TEXT,"
    "  updated_at TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS pool_instances_node ON pool_instances(node_id);"
    "CREATE TABLE IF NOT EXISTS pool_transitions ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT, instance_id TEXT NOT NULL,"
    "  node_id TEXT NOT NULL, from_state TEXT, to_state TEXT NOT NULL, cause TEXT,"
    "  at TEXT NOT NULL, at_ms INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS pool_transitions_inst ON pool_transitions(instance_id);";

static void db_error(struct pool_store *s, const char *what)
{
    log_error("pool_db_error", LF_STR("op", what), LF_STR("error", sqlite3_errmsg(s->db)));
}

static void iso(int64_t wall, char *buf, size_t cap)
{
    if (wall <= 0) {
        buf[0] = '\0';
        return;
    }
    util_wall_iso8601(wall, buf, cap);
}

static void bind_text_or_null(sqlite3_stmt *st, int idx, const char *v)
{
    if (v && *v)
        sqlite3_bind_text(st, idx, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, idx);
}

static int prepare(struct pool_store *s, const char *sql, sqlite3_stmt **out)
{
    if (sqlite3_prepare_v3(s->db, sql, -1, SQLITE_PREPARE_PERSISTENT, out, NULL) != SQLITE_OK) {
        db_error(s, "prepare");
        return -EIO;
    }
    return 0;
}

struct pool_store *pool_store_open(const char *path)
{
    struct pool_store *s = xcalloc(1, sizeof(*s));
    const char *p = (path && *path) ? path : ":memory:";
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    if (sqlite3_open_v2(p, &s->db, flags, NULL) != SQLITE_OK) {
        log_error("pool_db_open_failed", LF_STR("path", p),
                  LF_STR("error", s->db ? sqlite3_errmsg(s->db) : "out of memory"));
        goto fail;
    }
    sqlite3_busy_timeout(s->db, 2000);
    char *err = NULL;
    /* WAL + NORMAL: commits do not fsync (durable at the next checkpoint); a power cut
     * may lose the last transitions, never corrupt the file. */
    if (sqlite3_exec(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", NULL, NULL,
                     &err) != SQLITE_OK) {
        log_warn("pool_db_pragma_failed", LF_STR("path", p), LF_STR("error", err));
        sqlite3_free(err);
        err = NULL;
    }
    if (sqlite3_exec(s->db, SCHEMA, NULL, NULL, &err) != SQLITE_OK) {
        log_error("pool_db_schema_failed", LF_STR("path", p), LF_STR("error", err));
        sqlite3_free(err);
        goto fail;
    }
    if (prepare(s,
                "INSERT INTO pool_nodes(id, manifest, source, created_at, updated_at) "
                "VALUES(?1, ?2, ?3, ?4, ?4) ON CONFLICT(id) DO UPDATE SET "
                "manifest = excluded.manifest, source = excluded.source, "
                "updated_at = excluded.updated_at",
                &s->node_put) ||
        prepare(s, "DELETE FROM pool_nodes WHERE id = ?1", &s->node_del) ||
        prepare(s,
                "INSERT INTO pool_instances(id, node_id, state, pid, address, started_at,"
                " ready_at, stopped_at, last_used_at, calls, error, stderr_tail, manifest,"
                " updated_at) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
                " ON CONFLICT(id) DO UPDATE SET state = excluded.state, pid = excluded.pid,"
                " address = excluded.address, ready_at = excluded.ready_at,"
                " stopped_at = excluded.stopped_at, last_used_at = excluded.last_used_at,"
                " calls = excluded.calls, error = excluded.error,"
                " stderr_tail = excluded.stderr_tail, updated_at = excluded.updated_at",
                &s->inst_put) ||
        prepare(s,
                "INSERT INTO pool_transitions(instance_id, node_id, from_state, to_state,"
                " cause, at, at_ms) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                &s->trans_put))
        goto fail;
    return s;
fail:
    pool_store_close(s);
    errno = EIO;
    return NULL;
}

void pool_store_close(struct pool_store *s)
{
    if (!s)
        return;
    sqlite3_finalize(s->node_put);
    sqlite3_finalize(s->node_del);
    sqlite3_finalize(s->inst_put);
    sqlite3_finalize(s->trans_put);
    sqlite3_close(s->db);
    free(s);
}

static int step_done(struct pool_store *s, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    if (rc != SQLITE_DONE) {
        db_error(s, what);
        return -EIO;
    }
    return 0;
}

int pool_store_node_put(struct pool_store *s, const char *id, const char *manifest_json,
                        const char *source)
{
    char now[40];
    iso(util_wall_ms(), now, sizeof(now));
    sqlite3_bind_text(s->node_put, 1, id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s->node_put, 2, manifest_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s->node_put, 3, source ? source : "api", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s->node_put, 4, now, -1, SQLITE_TRANSIENT);
    return step_done(s, s->node_put, "node_put");
}

int pool_store_node_delete(struct pool_store *s, const char *id)
{
    sqlite3_bind_text(s->node_del, 1, id, -1, SQLITE_TRANSIENT);
    return step_done(s, s->node_del, "node_delete");
}

int pool_store_nodes_each(struct pool_store *s, pool_store_node_cb cb, void *arg)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT id, manifest, source FROM pool_nodes ORDER BY id", -1,
                           &st, NULL) != SQLITE_OK) {
        db_error(s, "nodes_each");
        return -EIO;
    }
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        cb((const char *)sqlite3_column_text(st, 0), (const char *)sqlite3_column_text(st, 1),
           (const char *)sqlite3_column_text(st, 2), arg);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? 0 : -EIO;
}

int pool_store_instance_put(struct pool_store *s, const struct pool_inst_rec *r)
{
    char started[40], ready[40], stopped[40], used[40], now[40];
    iso(r->started_wall_ms, started, sizeof(started));
    iso(r->ready_wall_ms, ready, sizeof(ready));
    iso(r->stopped_wall_ms, stopped, sizeof(stopped));
    iso(r->last_used_wall_ms, used, sizeof(used));
    iso(util_wall_ms(), now, sizeof(now));
    sqlite3_stmt *st = s->inst_put;
    sqlite3_bind_text(st, 1, r->id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->node_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, r->state, -1, SQLITE_TRANSIENT);
    if (r->pid > 0)
        sqlite3_bind_int64(st, 4, r->pid);
    else
        sqlite3_bind_null(st, 4);
    bind_text_or_null(st, 5, r->address);
    bind_text_or_null(st, 6, started);
    bind_text_or_null(st, 7, ready);
    bind_text_or_null(st, 8, stopped);
    bind_text_or_null(st, 9, used);
    sqlite3_bind_int64(st, 10, (sqlite3_int64)r->calls);
    bind_text_or_null(st, 11, r->error);
    bind_text_or_null(st, 12, r->stderr_tail);
    bind_text_or_null(st, 13, r->manifest);
    sqlite3_bind_text(st, 14, now, -1, SQLITE_TRANSIENT);
    return step_done(s, st, "instance_put");
}

int pool_store_transition(struct pool_store *s, const char *inst_id, const char *node_id,
                          const char *from, const char *to, const char *cause, int64_t wall)
{
    char at[40];
    iso(wall, at, sizeof(at));
    sqlite3_stmt *st = s->trans_put;
    sqlite3_bind_text(st, 1, inst_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, node_id, -1, SQLITE_TRANSIENT);
    bind_text_or_null(st, 3, from);
    sqlite3_bind_text(st, 4, to, -1, SQLITE_TRANSIENT);
    bind_text_or_null(st, 5, cause);
    sqlite3_bind_text(st, 6, at, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 7, wall);
    return step_done(s, st, "transition");
}

int pool_store_close_orphans(struct pool_store *s, const char *cause, int64_t wall)
{
    sqlite3_stmt *sel = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT id, node_id, state FROM pool_instances WHERE state IN "
                           "('starting', 'ready', 'stopping')",
                           -1, &sel, NULL) != SQLITE_OK) {
        db_error(s, "close_orphans");
        return -EIO;
    }
    char at[40];
    iso(wall, at, sizeof(at));
    int n = 0;
    sqlite3_exec(s->db, "BEGIN", NULL, NULL, NULL);
    while (sqlite3_step(sel) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(sel, 0);
        const char *node = (const char *)sqlite3_column_text(sel, 1);
        const char *state = (const char *)sqlite3_column_text(sel, 2);
        pool_store_transition(s, id, node, state, "stopped", cause, wall);
        n++;
    }
    sqlite3_finalize(sel);
    sqlite3_stmt *up = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "UPDATE pool_instances SET state = 'stopped', stopped_at = ?1,"
                           " updated_at = ?1, error = coalesce(error, ?2) WHERE state IN "
                           "('starting', 'ready', 'stopping')",
                           -1, &up, NULL) == SQLITE_OK) {
        sqlite3_bind_text(up, 1, at, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(up, 2, cause, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(up) != SQLITE_DONE)
            db_error(s, "close_orphans");
        sqlite3_finalize(up);
    }
    sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL);
    return n;
}

static json_t *col_json(sqlite3_stmt *st, int i)
{
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_INTEGER:
        return json_integer(sqlite3_column_int64(st, i));
    case SQLITE_TEXT:
        return pool_json_str((const char *)sqlite3_column_text(st, i),
                             (size_t)sqlite3_column_bytes(st, i));
    default:
        return json_null();
    }
}

static const char INST_COLS[] = "id, node_id, state, pid, address, started_at, ready_at,"
                                " stopped_at, last_used_at, calls, error, stderr_tail, manifest";

static json_t *inst_row_json(sqlite3_stmt *st)
{
    static const char *const names[] = {"id",           "node_id",    "state",   "pid",
                                        "address",      "started_at", "ready_at", "stopped_at",
                                        "last_used_at", "calls",      "error",   "stderr_tail",
                                        "manifest"};
    json_t *o = json_object();
    for (int i = 0; i < (int)ARRAY_LEN(names); i++) {
        if (strcmp(names[i], "stderr_tail") == 0) {
            /* Stored as text; shown as lines like the live view. */
            json_object_set_new(o, names[i],
                                pool_lines_json((const char *)sqlite3_column_text(st, i)));
        } else if (strcmp(names[i], "manifest") == 0) {
            const char *t = (const char *)sqlite3_column_text(st, i);
            json_t *m = t ? json_loads(t, 0, NULL) : NULL;
            json_object_set_new(o, names[i], m ? m : json_null());
        } else {
            json_object_set_new(o, names[i], col_json(st, i));
        }
    }
    return o;
}

json_t *pool_store_instances_json(struct pool_store *s, const char *node_id, int limit)
{
    json_t *arr = json_array();
    char *sql = xasprintf("SELECT %s FROM pool_instances %s ORDER BY rowid DESC LIMIT ?2",
                          INST_COLS, node_id ? "WHERE node_id = ?1" : "");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
        db_error(s, "instances_json");
        free(sql);
        return arr;
    }
    free(sql);
    if (node_id)
        sqlite3_bind_text(st, 1, node_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 2, limit);
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, inst_row_json(st));
    sqlite3_finalize(st);
    return arr;
}

json_t *pool_store_instance_json(struct pool_store *s, const char *inst_id)
{
    char *sql = xasprintf("SELECT %s FROM pool_instances WHERE id = ?1", INST_COLS);
    sqlite3_stmt *st = NULL;
    json_t *o = NULL;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) {
        db_error(s, "instance_json");
        free(sql);
        return NULL;
    }
    free(sql);
    sqlite3_bind_text(st, 1, inst_id, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW)
        o = inst_row_json(st);
    sqlite3_finalize(st);
    if (!o)
        return NULL;
    json_t *tr = json_array();
    if (sqlite3_prepare_v2(s->db,
                           "SELECT from_state, to_state, cause, at, at_ms FROM pool_transitions "
                           "WHERE instance_id = ?1 ORDER BY seq",
                           -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, inst_id, -1, SQLITE_TRANSIENT);
        while (sqlite3_step(st) == SQLITE_ROW) {
            json_t *t = json_object();
            json_object_set_new(t, "from", col_json(st, 0));
            json_object_set_new(t, "to", col_json(st, 1));
            json_object_set_new(t, "cause", col_json(st, 2));
            json_object_set_new(t, "at", col_json(st, 3));
            json_object_set_new(t, "at_ms", col_json(st, 4));
            json_array_append_new(tr, t);
        }
        sqlite3_finalize(st);
    }
    json_object_set_new(o, "transitions", tr);
    return o;
}
