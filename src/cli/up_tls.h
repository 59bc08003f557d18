/* up_tls — the throwaway PKI of `motor up --tls`.
 *
 * A local CA and one certificate per plane, made with the openssl CLI (Debian's
 * `openssl` package; the same tool tests/fixtures/mkcerts.sh uses) into a directory of
 * the state dir, afresh on every run (EC P-256 keys, 30 days, mode 0600):
 *   ca.crt / ca.key        the CA every listener and client trusts (ca_file)
 *   mgmt.crt / .key        the control plane's mgmt_tls_config: controller API, node
 *                          manager APIs, coordinator management port, and the same daemons
 *                          as clients of each other (upstream's one block serves both ways)
 *   infer.crt / .key       infer_tls_config: the coordinator's inference port, its client
 *                          certificate towards the engines, the node managers' probes
 *   engine.crt / .key      every engine's --ssl-certfile/--ssl-keyfile
 *   client.crt / .key      for you (curl, `motor status`) and motor up's own client
 * Server certificates name 127.0.0.1, ::1 and localhost (motor up runs on loopback) and
 * carry serverAuth and clientAuth; the client certificate clientAuth only.
 *
 * Per plane rather than per process: upstream's configuration has one mgmt_tls_config
 * for the controller, every node manager and the coordinator (the deploy block's wins
 * over the daemons' own), so one file names one certificate for all of them.
 *
 * Threading: blocking (waits for openssl); called once before the fleet starts. */
#ifndef MOTOR_UP_TLS_H
#define MOTOR_UP_TLS_H

#include <stdbool.h>
#include <stddef.h>

#define UP_TLS_CA "ca.crt"
#define UP_TLS_MGMT "mgmt"
#define UP_TLS_INFER "infer"
#define UP_TLS_ENGINE "engine"
#define UP_TLS_CLIENT "client"

/* Make the PKI in dir (created). With keep, a complete set already there is kept (motor
 * up --keep-state: clients that trust the CA go on trusting it). 0, or -errno with a
 * one-line reason in err (openssl's own messages are in dir/openssl.log). */
int up_tls_make(const char *dir, bool keep, char *err, size_t cap);

#endif
