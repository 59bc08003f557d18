/* cfgtab — configuration keys as table rows (nginx's ngx_command_t with its offsetof and
 * set handlers, redis's standardConfig array).
 *
 * One row per key: its dot path in a source block, type, the struct field it fills
 * (offsetof), range, default, flags (live or restart on hot reload, secret, ...), and a
 * one-line doc. From the table alone come:
 *   cfgtab_defaults  every field's default (environment defaults included);
 *   cfgtab_apply     parsing of one source block, every error collected (cfg.h), only the
 *                    keys present overwritten — so blocks layer (top level, then the role
 *                    section) by applying them in turn;
 *   cfgtab_dump      the effective configuration (what --check-config prints), secrets
 *                    redacted;
 *   cfgtab_diff      the keys whose values differ between two loaded configs, filtered by
 *                    flags (which of them a hot reload cannot apply);
 *   cfgtab_keep_restart  a reloaded config with the running values of its restart keys
 *                    (what a hot reload adopts: live keys new, restart keys as they run);
 *   cfgtab_markdown  the docs' key table;
 *   cfgtab_release   freeing what the fields own.
 * What a daemon still writes by hand is what no row can say: values derived from several
 * keys, rules across keys, files read at load (normalisation after cfgtab_apply), and
 * the few irregular keys, through a row's ops.
 *
 * Adding a key: one row, then use the field. docs/architecture.md, "Configuration
 * tables", describes the rules.
 *
 * Tables are static and immutable; the functions keep no state. Not thread-safe with
 * respect to the struct they fill. */
#ifndef MOTOR_CFGTAB_H
#define MOTOR_CFGTAB_H

#include "common/cfg.h"
#include "common/strbuf.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cfgtab_type {
    CFGTAB_BOOL,    /* bool */
    CFGTAB_INT,     /* int, an integer in [min, max] */
    CFGTAB_INT64,   /* int64_t; the field holds value * scale (MiB in the file, bytes kept) */
    CFGTAB_SIZE,    /* size_t */
    CFGTAB_DOUBLE,  /* double, a number in [min, max] */
    CFGTAB_MS,      /* seconds in the file (a number in [min, max]), int64_t ms in the field */
    CFGTAB_STRING,  /* char * (heap, may be NULL = unset); .names: one of them */
    CFGTAB_STRLIST, /* char ** (NULL-terminated, heap) at off, its size_t count at off_n */
    CFGTAB_ENUM,    /* int: the index of the value in .names (-1 = unset) */
    CFGTAB_GROUP,   /* the object at path, read with the rows of .sub (fields at off + theirs) */
    CFGTAB_CUSTOM,  /* nothing built in: .ops does everything */
};

enum cfgtab_flag {
    CFGTAB_LIVE = 1u << 0,         /* a hot reload applies it; without: it takes a restart. On a
                                    * GROUP, its rows inherit the group's choice */
    CFGTAB_SECRET = 1u << 1,       /* never dumped in clear: a string as "<redacted>" (null when
                                    * unset), a list as its length */
    CFGTAB_NONEMPTY = 1u << 2,     /* "" or [] is an error: "must not be empty" */
    CFGTAB_DERIVED = 1u << 3,      /* computed at load, not read: dumped and diffed only */
    CFGTAB_NODUMP = 1u << 4,       /* read (and diffed), not dumped */
    CFGTAB_OVERRIDE = 1u << 5,     /* another source of an earlier row's field: read only (no
                                    * default, dump or diff of its own) */
    CFGTAB_ACCEPTED = 1u << 6,     /* an upstream key validated and unused (no field) */
    CFGTAB_MOTOR = 1u << 7,        /* Motor's own key (the docs mark it) */
    CFGTAB_NUMBER = 1u << 8,       /* DOUBLE/MS: dumped as an integer when integral */
    CFGTAB_OBJECT = 1u << 9,       /* GROUP: must be an object (one error), skipped otherwise */
    CFGTAB_IFPRESENT = 1u << 10,   /* GROUP: read only when present (its keys by full path) */
    CFGTAB_QUIET = 1u << 11,       /* looked up without errors for non-object parents */
    CFGTAB_ONE_OR_LIST = 1u << 12, /* STRLIST: a string is taken as a one-element list */
    CFGTAB_RESTART = 1u << 13,     /* a row of a LIVE group that still takes a restart (a TLS
                                    * block's enable_tls: its files reload, the switch not) */
};

struct cfgtab;
struct cfgtab_row;
struct cfgtab_ctx;

/* Irregular keys. Each handler is optional and replaces the built-in behaviour of the
 * row's type; base is the struct the row's table fills (the field is base + off). A row
 * with its own parse gets no built-in default: the handler (or the loader) owns the
 * field's start. */
struct cfgtab_ops {
    /* v: the value found at path (present, not null). Record errors in ctx->errs. */
    void (*parse)(const struct cfgtab_row *r, void *base, json_t *v, const char *path,
                  struct cfgtab_ctx *ctx);
    /* The effective value (new reference), NULL to leave the key out of the dump. */
    json_t *(*dump)(const struct cfgtab_row *r, const void *base);
    void (*release)(const struct cfgtab_row *r, void *base);
};

struct cfgtab_row {
    const char *path; /* dot path in its source block (GROUP: "" = the block itself) */
    enum cfgtab_type type;
    size_t off;                  /* offsetof the field */
    size_t off_n;                /* STRLIST: offsetof its count */
    unsigned flags;              /* enum cfgtab_flag */
    unsigned src;                /* which source block (index into the table's src_names) */
    double min, max;             /* numbers: the range (MS: in seconds) */
    int64_t def_i;               /* BOOL (0/1), INT, INT64 (file units), SIZE, ENUM (index) */
    double def_d;                /* DOUBLE; MS in seconds */
    const char *def_s;           /* STRING (NULL = unset) */
    const char *const *def_list; /* STRLIST, NULL-terminated */
    const char *env;             /* STRING: the default is this variable when set and not empty */
    const char *const *names;    /* ENUM; STRING: the allowed values. NULL-terminated */
    int64_t scale;               /* INT64: field = value * scale (0 = 1) */
    const char *alias;           /* historic spelling read when path is absent */
    const char *missing;         /* required in every block applied: the message when absent */
    /* STRING and STRLIST elements: a rule beyond the type. NULL accepts (it may point *s
     * at a replacement, e.g. a canonical spelling), cfgtab_skip keeps the old value
     * silently, anything else is the message recorded at the key. buf: cap bytes for a
     * formatted message. */
    const char *(*check)(const char **s, char *buf, size_t cap);
    const struct cfgtab *sub;     /* GROUP */
    const struct cfgtab_ops *ops; /* irregular keys (on a GROUP: only dump, for its shape) */
    const char *dump;             /* path in the dump (NULL = path) */
    const char *doc;              /* one line for the docs */
    size_t size;                  /* CUSTOM: the field's size (cfgtab_keep_restart swaps it) */
    const char *def_doc;  /* the docs' default when not a constant ("`$POD_IP` or 127.0.0.1") */
    const char *type_doc; /* the docs' type when the built-in one does not say it */
};

struct cfgtab {
    const char *name;
    const struct cfgtab_row *rows;
    size_t n;
    /* How the docs name each source block's keys: the prefix of their paths ("" for the
     * main block, "motor_controller_config", ...). NULL: one source, no prefix. */
    const char *const *src_names;
};

#define CFGTAB_TABLE(name_, rows_, srcs_)                                                          \
    {                                                                                              \
        (name_), (rows_), sizeof(rows_) / sizeof((rows_)[0]), (srcs_)                              \
    }

/* A check's answer: keep the old value without an error. */
extern const char cfgtab_skip[];

/* What a load shares with every cfgtab call. */
struct cfgtab_ctx {
    struct cfg_errors *errs;
    const char *(*env)(void *env_ud, const char *name); /* NULL = getenv */
    void *env_ud;
    void *ud; /* for ops */
    /* Offsets (from the table's base) of the fields a document set: cfgtab_given. */
    size_t *given;
    size_t n_given, cap_given;
};
void cfgtab_ctx_release(struct cfgtab_ctx *ctx);
/* Whether any source block applied so far gave the field at off (present, not null). */
bool cfgtab_given(const struct cfgtab_ctx *ctx, size_t off);

/* Every field's default. base must be zeroed (nothing is freed). */
void cfgtab_defaults(const struct cfgtab *t, void *base, struct cfgtab_ctx *ctx);
/* The struct of size bytes at base zeroed, then its defaults (ctx may be NULL: getenv). */
void cfgtab_init(const struct cfgtab *t, void *base, size_t size, struct cfgtab_ctx *ctx);
/* Read the rows of source src from blk (NULL: nothing). Keys absent keep their value;
 * an invalid value keeps it too and records an error (paths relative to blk, after the
 * errors' prefix). */
void cfgtab_apply(const struct cfgtab *t, unsigned src, void *base, json_t *blk,
                  struct cfgtab_ctx *ctx);
/* The effective configuration: every row but NODUMP/OVERRIDE/ACCEPTED at its dump path.
 * New reference; cfgtab_dump_into adds to an existing object. */
json_t *cfgtab_dump(const struct cfgtab *t, const void *base);
void cfgtab_dump_into(const struct cfgtab *t, const void *base, json_t *out);
/* The keys (dump paths, comma-separated, table order) whose values differ between a and
 * b among the rows with (flags & mask) == want; NULL when none. mask 0: every row. */
char *cfgtab_diff(const struct cfgtab *t, const void *a, const void *b, unsigned mask,
                  unsigned want);
/* Hot reload: next (just loaded) takes the running values of the restart keys from old
 * (the config in use) and old gets next's, so that adopting next applies exactly the live
 * keys and releasing old frees the values that did not apply. Fields are swapped, not
 * copied: strings of restart keys keep their addresses (whatever points into the running
 * config stays valid). Rows that share a field are handled once; OVERRIDE and ACCEPTED
 * rows own no field. 0, or -EINVAL when a restart CUSTOM row has no size (not swapped).
 * Derived fields outside the table are the caller's. */
int cfgtab_keep_restart(const struct cfgtab *t, void *next, void *old);

/* The check of a log level ("DEBUG", "INFO", "WARNING"/"WARN", "ERROR", any case), kept
 * in the canonical upper-case spelling. */
const char *cfgtab_check_log_level(const char **s, char *buf, size_t cap);

/* The docs' table of the keys (not the derived values), markdown, one row per key:
 * key, type, default, reload (live/restart), meaning. Appended to sb. */
void cfgtab_markdown(const struct cfgtab *t, struct strbuf *sb);
/* Free what the fields own (strings wiped first when SECRET) and zero them. */
void cfgtab_release(const struct cfgtab *t, void *base);

/* Ops for a string field shown as whether it is set ("key_loaded": true), not its value
 * (wiped when released). */
extern const struct cfgtab_ops cfgtab_ops_loaded;
/* Ops for a json_t * field (a derived document): dumped as a copy, released. */
extern const struct cfgtab_ops cfgtab_ops_json;

#endif
