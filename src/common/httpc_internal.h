/* httpc internals shared with the tests: default limits. (The HTTP/1.1 syntax the client
 * parses, URLs included, is in http1.h.) */
#ifndef MOTOR_HTTPC_INTERNAL_H
#define MOTOR_HTTPC_INTERNAL_H

#include "common/httpc.h"

#define HTTPC_DEFAULT_TIMEOUT_MS 30000
#define HTTPC_DEFAULT_CONNECT_TIMEOUT_MS 5000
#define HTTPC_DEFAULT_MAX_RESPONSE (16u * 1024 * 1024)

#endif
