/* nm_ports — upstream's startup port allocator (§3.8, port_allocator_config).
 *
 * Before the API listens and before registration, each port the node manager will hand
 * out is probe-bound on bind_host (SO_REUSEADDR, bind + listen, close): the API port and
 * every engine service port. A busy port is probed again for probe_timeout_seconds (an
 * engine of a previous node manager may still be exiting), then the allocator scans
 * upward within scan_range, skipping ports already chosen or reserved. When the DP
 * scale-down proxy is on, the per-rank TCPStore ports dp_master_port .. + dp_size - 1
 * are reserved (never handed to the API or an endpoint) and must lie below 65536; a busy
 * one is logged ("dp_store_port_busy"), not fatal. The resulting port matrix is logged
 * ("port_matrix").
 *
 * remote_check_timeout_seconds is accepted and unused (every probe here is local).
 * Threading: main thread, before the reactor runs (it may sleep while a port is busy). */
#ifndef MOTOR_NM_PORTS_H
#define MOTOR_NM_PORTS_H

#include "nodemgr/nm_config.h"

#include <stdbool.h>
#include <stddef.h>

/* Probe: can a listener bind host:port right now? host is an IPv4/IPv6 literal
 * ("0.0.0.0", "::"). */
bool nm_ports_free(const char *host, int port);

/* Allocate in place: cfg->node_manager_port (unless api_port_fixed: --port was given)
 * and cfg->service_ports[]. No-op when cfg->port_alloc_enable is false. Returns 0, or
 * -EADDRINUSE with a one-line reason in err (no free port within the range, a reserved
 * TCPStore port beyond 65535) — the caller exits 1. */
int nm_ports_allocate(struct nm_config *cfg, bool api_port_fixed, char *err, size_t cap);

/* After a configuration reload: keep the ports allocated at startup when the endpoint
 * layout did not change (the allocation happens once, as upstream). */
void nm_ports_carry(const struct nm_config *old, struct nm_config *next);

#endif
