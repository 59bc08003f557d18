/* libFuzzer: the worker pool's parsers of untrusted input.
 *   first byte even: the bytes are a manifest (POST /node-manager/pool/nodes body) ->
 *     pool_manifest_parse; a result must satisfy every bound validation promises and its
 *     normalized document must parse again to the same manifest; a rejection must come
 *     with at least one error line.
 *   first byte odd: the bytes are a worker's stdout line -> pool_parse_ready_line (a
 *     port, when found, is in 1..65535), and worker output -> pool_json_str /
 *     pool_lines_json (always valid JSON strings). */
#include "common/cfg.h"
#include "common/util.h"
#include "pool/pool_internal.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_manifest(const struct pool_manifest *m)
{
    if (!m->id || !pool_id_valid(m->id) || m->argc == 0 || m->argv[m->argc] != NULL ||
        !m->workdir || m->workdir[0] != '/' || m->max_concurrency < 1 ||
        m->max_concurrency > POOL_CONCURRENCY_MAX || m->max_instances < 1 ||
        m->max_instances > POOL_INSTANCES_MAX || m->ready_timeout_ms < 1 ||
        m->invoke_timeout_ms < 1 || m->queue_timeout_ms < 0 || !m->doc)
        abort();
    for (size_t i = 0; i < m->argc; i++)
        if (!m->argv[i][0])
            abort();
    for (size_t i = 0; i < m->n_env; i++)
        if (!strchr(m->env[i], '=') || m->env[i][0] == '=')
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    if ((data[0] & 1) == 0) {
        struct cfg_errors e;
        cfg_errors_init(&e, "");
        json_t *j = cfg_load_buffer(text, len, &e);
        if (j) {
            struct pool_defaults d = {1, 1, 300, false, 60, 300, -1};
            struct pool_manifest *m = pool_manifest_parse(j, &d, "/srv/w", &e);
            if (m) {
                check_manifest(m);
                /* What we store must load back as the same manifest. */
                struct cfg_errors e2;
                cfg_errors_init(&e2, "");
                struct pool_manifest *m2 = pool_manifest_parse(m->doc, &d, "/elsewhere", &e2);
                if (!m2 || strcmp(m2->workdir, m->workdir) != 0 || m2->argc != m->argc ||
                    m2->n_env != m->n_env || m2->idle_ttl_ms != m->idle_ttl_ms)
                    abort();
                pool_manifest_unref(m2);
                cfg_errors_release(&e2);
                pool_manifest_unref(m);
            } else if (cfg_errors_count(&e) == 0) {
                abort();
            }
            json_decref(j);
        }
        json_t *errs = pool_errors_json(&e);
        json_decref(errs);
        cfg_errors_release(&e);
        return 0;
    }
    char *line = xstrndup(text, len);
    int port = 0;
    int rc = pool_parse_ready_line(line, &port);
    if (rc == 1 && (port < 1 || port > 65535))
        abort();
    free(line);
    json_t *s = pool_json_str(text, len);
    if (!s || !json_is_string(s))
        abort();
    char *dump = json_dumps(s, JSON_ENCODE_ANY);
    if (!dump)
        abort();
    free(dump);
    json_decref(s);
    char *copy = xstrndup(text, len);
    json_t *lines = pool_lines_json(copy);
    if (!lines)
        abort();
    json_decref(lines);
    free(copy);
    return 0;
}
