/* wire_ranktable — the HCCL ranktable (MindCluster / instance ranktable), §5.5.
 *
 * Shape: version, status, server_count (strings), server_list[{server_id, container_ip?,
 * device[{device_id, rank_id, device_ip?, super_device_id?}]}]. All numbers are strings
 * (integers on input are accepted and turned into strings). Extra keys (super_pod_list,
 * host_ip, hardware_type, ...) are dropped, as upstream's model does; nulls are omitted
 * on output. Conventions: see wire.h. */
#ifndef MOTOR_WIRE_RANKTABLE_H
#define MOTOR_WIRE_RANKTABLE_H

#include "wire/wire.h"

struct wire_rt_server {
    char *server_id;                  /* required */
    char *container_ip;               /* NULL = absent */
    struct wire_device_info *devices; /* `device`; DeviceInfo's fields and rules */
    size_t n_devices;
};

struct wire_ranktable {
    char *version;                  /* NULL = absent */
    char *status;                   /* NULL = absent ("completed" in practice) */
    char *server_count;             /* NULL = absent */
    struct wire_rt_server *servers; /* `server_list`, required (may be empty) */
    size_t n_servers;
};

int wire_ranktable_parse(json_t *j, struct wire_ranktable *out, struct wire_err *err);
json_t *wire_ranktable_to_json(const struct wire_ranktable *rt);
void wire_ranktable_release(struct wire_ranktable *rt);
/* Heap deep copy (never NULL for a non-NULL src; NULL in, NULL out). */
struct wire_ranktable *wire_ranktable_dup(const struct wire_ranktable *src);
/* Release and free a heap ranktable (NULL-safe). */
void wire_ranktable_free(struct wire_ranktable *rt);

/* Read a ranktable JSON file (HCCL_PATH; at most 16 MiB). 0, -errno from reading
 * (message in err), or -EINVAL (syntax or validation; message in err). */
int wire_ranktable_load_file(const char *path, struct wire_ranktable *out, struct wire_err *err);

/* Write the ranktable to path (RANKTABLE_PATH): UTF-8 with non-ASCII kept, 2-space
 * indent, nulls omitted, trailing newline; atomically (temp file + fsync + rename,
 * mode 0644). 0 or -errno. */
int wire_ranktable_write_file(const struct wire_ranktable *rt, const char *path);

#endif
