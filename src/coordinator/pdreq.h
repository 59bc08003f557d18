/* pdreq — request and response rewriting for the PD legs (spec §9.4). Pure JSON
 * transformations on jansson objects; any thread.
 *
 * vLLM hand-off (prefill_handoff_decode):
 *   prefill leg = client body with stream=false, max_tokens=1, min_tokens=1,
 *     max_completion_tokens=1 (only when present), stream_options removed,
 *     request_id injected, kv_transfer_params = {do_remote_decode:true,
 *     do_remote_prefill:false, remote_engine_id/remote_block_ids/remote_host/
 *     remote_port: null};
 *   the prefill response must carry kv_transfer_params with do_remote_prefill:true
 *     (the ticket);
 *   decode leg = client body (its own stream mode) with the same request_id and
 *     kv_transfer_params = the ticket.
 * SGLang bootstrap: both legs get bootstrap_host/bootstrap_port (the prefill
 *   endpoint's) and bootstrap_room, the request id as rid; the prefill leg does not
 *   stream.
 * Nothing internal reaches the client: pdreq_strip_response() removes the fields. */
#ifndef MOTOR_PDREQ_H
#define MOTOR_PDREQ_H

#include "wire/wire.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* New object (caller owns); orig is not modified. */
json_t *pdreq_vllm_prefill(const json_t *orig, const char *request_id);
/* ticket is copied. */
json_t *pdreq_vllm_decode(const json_t *orig, const char *request_id, const json_t *ticket);
/* The ticket in a prefill response: 0 and a new reference in *ticket, or -EPROTO with a
 * message (no kv_transfer_params, or do_remote_prefill not true). */
int pdreq_vllm_ticket(const json_t *prefill_resp, json_t **ticket, char *err, size_t cap);

json_t *pdreq_sglang_leg(const json_t *orig, bool prefill, const char *bootstrap_host,
                         int bootstrap_port, uint64_t room, const char *rid);
/* A stable 63-bit room for (pair, request, attempt): the same inputs give the same room,
 * a retry gets another one. */
uint64_t pdreq_bootstrap_room(int64_t p_id, int64_t d_id, const char *request_id, int attempt);

/* Remove internal fields from a response object (kv_transfer_params, bootstrap_*).
 * True when something was removed. */
bool pdreq_strip_response(json_t *resp);
/* Does this SSE data payload / body possibly carry an internal field? (cheap test
 * before parsing). */
bool pdreq_has_internal(const char *data, size_t len);

/* Estimated tokens of a request for the balancer: prompt characters / 4 (+ max_tokens
 * unless prefill_only). Never below 1. The proxy computes the same figure without a
 * tree (reqscan_estimate_tokens); this is the definition the tests hold it to. */
int64_t pdreq_estimate_tokens(const json_t *req, bool prefill_only);

#endif
