/* libFuzzer: bytes -> POST /instances/refresh parsing -> table apply -> snapshot ->
 * GET /instances rendering, the path a peer's body takes through the management API.
 * Checks the parser's promises: an error always has a message, a parsed refresh has no
 * duplicate ids, and a table/snapshot built from it renders and counts consistently. */
#include "coordinator/instances.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *body = json_loadb((const char *)data, size, 0, &je);
    if (!body)
        return 0;
    struct brk_params bp = {3, 30000, 300000};
    struct inst_table t;
    inst_table_init(&t, &bp);
    /* Apply twice so add-over-existing, identity checks and state inheritance run. */
    for (int round = 0; round < 2; round++) {
        struct inst_refresh r;
        char err[256] = "";
        int rc = inst_refresh_parse(body, &r, err, sizeof(err));
        if (rc < 0) {
            if (!err[0])
                abort();
            break;
        }
        for (size_t a = 0; a < r.n; a++)
            for (size_t b = a + 1; b < r.n; b++)
                if (r.v[a]->id == r.v[b]->id)
                    abort();
        err[0] = '\0';
        rc = inst_table_apply(&t, &r, err, sizeof(err));
        if (rc < 0 && !err[0])
            abort();
        inst_refresh_release(&r);
    }
    struct inst_snapshot *s = inst_snapshot_build(&t);
    if (s->n_all != t.n)
        abort();
    json_t *view = inst_table_to_json(&t, 0);
    if ((size_t)json_integer_value(json_object_get(view, "count")) != t.n)
        abort();
    char *text = json_dumps(view, JSON_COMPACT);
    free(text);
    json_decref(view);
    inst_snapshot_unref(s);
    inst_table_release(&t);
    json_decref(body);
    return 0;
}
