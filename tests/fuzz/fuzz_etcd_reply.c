/* libFuzzer: what the etcd store reads from the network — /v3/kv/range answers (the
 * Controller's state at startup) and failed-campaign txn answers (who leads) — and what
 * the shared etcd client reads of one record (common/etcd.h: the coordinators' lock
 * holder and their replicated instance table). etcd is
 * another process, possibly a proxy or a hostile peer, so any bytes may arrive.
 * Checks: a range answer either fails cleanly or yields records that lay under the
 * prefix (stripped), never the leader key, each with a value; the txn owner is NULL or
 * a string; nothing leaks or over-reads (ASan). */
#include "common/etcd.h"
#include "controller/store.h"
#include "controller/store_internal.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const prefixes[] = {"/motor/", "", "/m"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *body = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!body)
        return 0;
    for (size_t p = 0; p < sizeof(prefixes) / sizeof(prefixes[0]); p++) {
        const char *prefix = prefixes[p];
        char *leader = malloc(strlen(prefix) + 8);
        memcpy(leader, prefix, strlen(prefix));
        memcpy(leader + strlen(prefix), "leader", 7);
        struct store_kv *kvs = NULL;
        size_t n = 0;
        int rc = store_etcd_parse_range(body, prefix, leader, &kvs, &n);
        if (rc < 0) {
            if (kvs || n)
                abort();
        } else {
            if (!kvs)
                abort();
            for (size_t i = 0; i < n; i++) {
                if (!kvs[i].key || !kvs[i].value)
                    abort();
                /* The full key was prefix + key; it is never the leader key. */
                if (strcmp(kvs[i].key, "leader") == 0 && strlen(prefix) > 0 &&
                    strncmp(leader, prefix, strlen(prefix)) == 0)
                    abort();
            }
            store_kvs_free(kvs, n);
        }
        free(leader);
    }
    char *value = NULL;
    int64_t rev = -1;
    char lease[32];
    int found = etcd_range_first(body, &value, &rev, lease, sizeof(lease));
    if (found < -1000 || found > 1 || (found != 1 && value) || (found == 1 && !value) ||
        strlen(lease) >= sizeof(lease) || (found == 1 && rev < 0))
        abort();
    free(value);
    (void)etcd_txn_succeeded(body);
    char *owner = store_etcd_txn_owner(body);
    if (owner)
        (void)strlen(owner);
    free(owner);
    json_decref(body);
    return 0;
}
