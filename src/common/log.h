/* log — one JSON object per line on stderr (CONVENTIONS §17).
 *
 *   log_info("engine_spawned", LF_INT("endpoint_id", id), LF_INT("pid", pid));
 *   => {"ts":"2026-11-30T06:28:31.123Z","level":"info","component":"node-manager",
 *       "event":"engine_spawned","endpoint_id":0,"pid":4242}
 *
 * Each line is built in a stack buffer and written with one write(2) (≤ 4 KiB; long
 * string values are truncated with "…"), so lines from threads and processes sharing
 * stderr never interleave. The level and component are process-global; set them in
 * main before threads start. Thread-safe. */
#ifndef MOTOR_LOG_H
#define MOTOR_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };

enum log_field_type { LOG_FIELD_STR = 1, LOG_FIELD_INT, LOG_FIELD_DBL, LOG_FIELD_BOOL, LOG_FIELD_RAW };

struct log_field {
    const char *key;
    enum log_field_type type;
    union {
        const char *s; /* STR (NULL prints null), RAW (pre-rendered JSON) */
        long long i;
        double d;
        bool b;
    } v;
};

#define LF_STR(k, val) ((struct log_field){.key = (k), .type = LOG_FIELD_STR, .v.s = (val)})
#define LF_INT(k, val) ((struct log_field){.key = (k), .type = LOG_FIELD_INT, .v.i = (long long)(val)})
#define LF_DBL(k, val) ((struct log_field){.key = (k), .type = LOG_FIELD_DBL, .v.d = (double)(val)})
#define LF_BOOL(k, val) ((struct log_field){.key = (k), .type = LOG_FIELD_BOOL, .v.b = (val)})
#define LF_RAW(k, json) ((struct log_field){.key = (k), .type = LOG_FIELD_RAW, .v.s = (json)})

#define LOG_FIELDS_(...) (const struct log_field[]){{0}, ##__VA_ARGS__}
#define LOG_NFIELDS_(...) (sizeof(LOG_FIELDS_(__VA_ARGS__)) / sizeof(struct log_field) - 1)
#define log_at(level, event, ...)                                                                 \
    log_emit((level), (event), LOG_FIELDS_(__VA_ARGS__) + 1, LOG_NFIELDS_(__VA_ARGS__))
#define log_debug(event, ...) log_at(LOG_DEBUG, event, ##__VA_ARGS__)
#define log_info(event, ...) log_at(LOG_INFO, event, ##__VA_ARGS__)
#define log_warn(event, ...) log_at(LOG_WARN, event, ##__VA_ARGS__)
#define log_error(event, ...) log_at(LOG_ERROR, event, ##__VA_ARGS__)

/* Emit one line if level >= the configured level. */
void log_emit(enum log_level level, const char *event, const struct log_field *fields, size_t n);

void log_set_level(enum log_level level);
enum log_level log_get_level(void);
bool log_enabled(enum log_level level);
/* Accepts debug/info/warn/warning/error in any case. 0 or -EINVAL. */
int log_parse_level(const char *s, enum log_level *out);
/* The component name put on every line (static storage expected; default "motor"). */
void log_set_component(const char *component);
/* Redirect output to another fd (tests); default STDERR_FILENO. */
void log_set_fd(int fd);

#endif
