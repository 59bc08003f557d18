/* register — `motor register set|add|del|list` (spec §9.3): register engines that run
 * without a controller directly with a coordinator. The pure parts are exported for the
 * unit tests. */
#ifndef MOTOR_CLI_REGISTER_H
#define MOTOR_CLI_REGISTER_H

#include <stddef.h>
#include <stdint.h>

/* Standard CRC-32 (zlib's: reflected, polynomial 0xEDB88320, init and final xor ~0). */
uint32_t register_crc32(const void *data, size_t len);

struct register_ep {
    char *ip;
    int port;
};

/* Parse "IP:PORT[,IP:PORT...]" (split at the last colon of each item, "[v6]:port"
 * accepted), sort by (ip, int port). 0 or -EINVAL (message in err). *eps is a heap
 * array of *n entries; free with register_eps_free. Duplicates are rejected. */
int register_parse_group(const char *spec, struct register_ep **eps, size_t *n, char *err,
                         size_t cap);
void register_eps_free(struct register_ep *eps, size_t n);

/* 0x40000000 | (CRC32("role|ip:port|ip:port...") & 0x3FFFFFFF) over a sorted group. */
int64_t register_instance_id(const char *role, const struct register_ep *eps, size_t n);

int register_main(int argc, char **argv);

#endif
