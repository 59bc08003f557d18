/* libFuzzer: bytes -> cfg_load_buffer -> every cfg getter over a schema-like table, the
 * way a daemon validates user_config.json, plus getters on paths taken from the
 * document itself so deep and odd keys are reached. Checks the getters' promises: a
 * result is in range or the default, every error is counted and ends in a newline. */
#include "common/cfg.h"
#include "common/util.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_INT, K_DBL, K_BOOL, K_STR, K_ENUM, K_OBJ, K_ARR };

struct field {
    enum kind kind;
    const char *path;
    double min, max;
};

static const char *const log_levels[] = {"DEBUG", "INFO", "WARNING", "ERROR", NULL};
static const char *const hw_types[] = {"800I_A2", "800I_A3", "Ascend950", NULL};
static const char *const roles[] = {"prefill", "decode", "union", "encode", NULL};

static const struct field nm_schema[] = {
    {K_STR, "api_config.pod_ip", 0, 0},
    {K_INT, "api_config.node_manager_port", 1, 65535},
    {K_BOOL, "mgmt_tls_config.enable_tls", 0, 0},
    {K_STR, "mgmt_tls_config.ca_file", 0, 0},
    {K_INT, "endpoint_config.endpoint_num", 0, 4096},
    {K_INT, "endpoint_config.base_port", 0, 65535},
    {K_ARR, "endpoint_config.service_ports", 0, 0},
    {K_STR, "basic_config.job_name", 0, 0},
    {K_ENUM, "basic_config.hardware_type", 0, 0},
    {K_DBL, "basic_config.heartbeat_interval_seconds", 0.001, 3600},
    {K_DBL, "basic_config.daemon_loop_interval", 0.001, 3600},
    {K_INT, "basic_config.device_num", 0, 1024},
    {K_OBJ, "basic_config.parallel_config", 0, 0},
    {K_BOOL, "fault_tolerance_config.enable_fault_tolerance", 0, 0},
    {K_DBL, "fault_tolerance_config.poll_interval_sec", 0.001, 3600},
    {K_INT, "fault_tolerance_config.max_poll_failures", 1, 1000},
    {K_DBL, "fault_tolerance_config.engine_restart_wait_timeout_sec", 60, 3600},
    {K_DBL, "fault_tolerance_config.engine_restart_freeze_sec", 120, 7200},
    {K_ENUM, "logging_config.log_level", 0, 0},
    {K_INT, "logging_config.log_max_line_length", 1, 1 << 20},
    {K_OBJ, "logging_config.third_party_log_levels", 0, 0},
};

static const struct field server_schema[] = {
    {K_STR, "host", 0, 0},
    {K_INT, "port", 1, 65535},
    {K_ENUM, "role", 0, 0},
    {K_DBL, "weight", 0, 1000},
};

static const char *const *enum_for(const char *path)
{
    if (strstr(path, "log_level"))
        return log_levels;
    if (strstr(path, "hardware_type"))
        return hw_types;
    return roles;
}

static void check_field(json_t *obj, const struct field *f, struct cfg_errors *e)
{
    int before = cfg_errors_count(e);
    switch (f->kind) {
    case K_INT: {
        int64_t min = (int64_t)f->min, max = (int64_t)f->max;
        int64_t v = cfg_get_int(obj, f->path, -7, min, max, e);
        if (v != -7 && (v < min || v > max))
            abort();
        break;
    }
    case K_DBL: {
        double v = cfg_get_double(obj, f->path, -7.5, f->min, f->max, e);
        if (v != -7.5 && !(v >= f->min && v <= f->max))
            abort();
        break;
    }
    case K_BOOL:
        (void)cfg_get_bool(obj, f->path, false, e);
        break;
    case K_STR: {
        const char *s = cfg_get_string(obj, f->path, "def", e);
        if (!s)
            abort();
        (void)strlen(s);
        break;
    }
    case K_ENUM: {
        const char *const *allowed = enum_for(f->path);
        const char *s = cfg_get_enum(obj, f->path, "dflt", allowed, e);
        bool ok = strcmp(s, "dflt") == 0;
        for (size_t i = 0; allowed[i] && !ok; i++)
            ok = strcmp(s, allowed[i]) == 0;
        if (!ok)
            abort();
        break;
    }
    case K_OBJ: {
        json_t *o = cfg_get_object(obj, f->path, e);
        if (o && !json_is_object(o))
            abort();
        break;
    }
    case K_ARR: {
        json_t *a = cfg_get_array(obj, f->path, e);
        if (a && !json_is_array(a))
            abort();
        break;
    }
    }
    /* A getter records at most one error per call (a bad parent or a bad value). */
    if (cfg_errors_count(e) - before > 1)
        abort();
}

/* Every getter on one path found in the document. */
static void probe_path(json_t *root, const char *path, struct cfg_errors *e)
{
    static const enum kind kinds[] = {K_INT, K_DBL, K_BOOL, K_STR, K_ENUM, K_OBJ, K_ARR};
    for (size_t k = 0; k < ARRAY_LEN(kinds); k++) {
        struct field f = {kinds[k], path, -1000, 1000};
        check_field(root, &f, e);
    }
    (void)cfg_lookup(root, path);
}

/* Walk objects (bounded depth and breadth) building dot paths from real keys. */
static void walk(json_t *root, json_t *obj, char *path, size_t len, size_t cap, int depth,
                 int *budget, struct cfg_errors *e)
{
    if (depth > 6 || !json_is_object(obj))
        return;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        if (--*budget < 0)
            return;
        size_t klen = strlen(key);
        size_t need = len + (len ? 1 : 0) + klen;
        if (need + 1 > cap)
            continue;
        size_t at = len;
        if (len)
            path[at++] = '.';
        memcpy(path + at, key, klen);
        path[need] = '\0';
        probe_path(root, path, e);
        walk(root, v, path, need, cap, depth + 1, budget, e);
        path[len] = '\0';
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct cfg_errors e;
    cfg_errors_init(&e, "user_config");
    json_t *root = cfg_load_buffer((const char *)data, size, &e);
    if (!root) {
        if (cfg_errors_count(&e) != 1)
            abort();
        cfg_errors_release(&e);
        return 0;
    }
    if (!json_is_object(root) || cfg_errors_count(&e) != 0)
        abort();

    /* The node manager's view: the role section's block, else the whole file. */
    json_t *nm = cfg_get_object(root, "motor_engine_prefill_config.motor_nodemanger_config", &e);
    if (!nm)
        nm = cfg_get_object(root, "motor_nodemanger_config", &e);
    if (!nm)
        nm = root;
    for (size_t i = 0; i < ARRAY_LEN(nm_schema); i++)
        check_field(nm, &nm_schema[i], &e);

    /* An array of objects validated element by element with a moving prefix. */
    json_t *servers = cfg_get_array(root, "servers", &e);
    for (size_t i = 0; servers && i < json_array_size(servers) && i < 64; i++) {
        char prefix[64];
        snprintf(prefix, sizeof(prefix), "user_config.servers[%zu]", i);
        cfg_errors_set_prefix(&e, prefix);
        json_t *el = json_array_get(servers, i);
        if (!json_is_object(el)) {
            cfg_error(&e, "", "must be an object");
            continue;
        }
        for (size_t j = 0; j < ARRAY_LEN(server_schema); j++)
            check_field(el, &server_schema[j], &e);
    }
    cfg_errors_set_prefix(&e, "user_config");

    char path[256];
    path[0] = '\0';
    int budget = 200;
    walk(root, root, path, 0, sizeof(path), 0, &budget, &e);

    /* The report: count matches lines until the text cap cuts it short. */
    const char *t = cfg_errors_text(&e);
    size_t lines = 0, n = strlen(t);
    for (size_t i = 0; i < n; i++)
        lines += t[i] == '\n';
    if (n && t[n - 1] != '\n')
        abort();
    if (lines > (size_t)cfg_errors_count(&e) ||
        (n < 60000 && lines != (size_t)cfg_errors_count(&e)))
        abort();
    json_decref(root);
    cfg_errors_release(&e);
    return 0;
}
