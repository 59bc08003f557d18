/* libFuzzer: HeartbeatMsg parsing (POST /controller/heartbeat, every few seconds from
 * every node manager), plus the other small bodies from the same peers: the
 * software-fault report, the engine-restart body and the FT proxy bodies. Any input
 * must parse or fail cleanly; accepted inputs must round-trip. */
#include "wire/wire_ft.h"
#include "wire/wire_msg.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ROUND_TRIP(type, parse, to_json, release)                                                  \
    do {                                                                                           \
        type a_, b_;                                                                               \
        struct wire_err e_;                                                                        \
        if (parse(in, &a_, &e_) != 0)                                                              \
            break;                                                                                 \
        json_t *ja_ = to_json(&a_);                                                                \
        char *t_ = json_dumps(ja_, JSON_COMPACT);                                                  \
        json_t *again_ = t_ ? json_loads(t_, 0, NULL) : NULL;                                      \
        if (!again_ || parse(again_, &b_, &e_) != 0)                                               \
            abort();                                                                               \
        json_t *jb_ = to_json(&b_);                                                                \
        if (!json_equal(ja_, jb_))                                                                 \
            abort();                                                                               \
        release(&b_);                                                                              \
        release(&a_);                                                                              \
        json_decref(jb_);                                                                          \
        json_decref(again_);                                                                       \
        json_decref(ja_);                                                                          \
        free(t_);                                                                                  \
    } while (0)

static void no_release(struct wire_engine_restart_req *r)
{
    (void)r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    ROUND_TRIP(struct wire_heartbeat, wire_heartbeat_parse, wire_heartbeat_to_json,
               wire_heartbeat_release);
    ROUND_TRIP(struct wire_fault_report, wire_fault_report_parse, wire_fault_report_to_json,
               wire_fault_report_release);
    ROUND_TRIP(struct wire_engine_restart_req, wire_engine_restart_req_parse,
               wire_engine_restart_req_to_json, no_release);
    ROUND_TRIP(struct wire_ft_status_req, wire_ft_status_req_parse, wire_ft_status_req_to_json,
               wire_ft_status_req_release);
    ROUND_TRIP(struct wire_ft_apply_req, wire_ft_apply_req_parse, wire_ft_apply_req_to_json,
               wire_ft_apply_req_release);
    ROUND_TRIP(struct wire_ft_guard_req, wire_ft_guard_req_parse, wire_ft_guard_req_to_json,
               wire_ft_guard_req_release);
    ROUND_TRIP(struct wire_ft_finalize_req, wire_ft_finalize_req_parse,
               wire_ft_finalize_req_to_json, wire_ft_finalize_req_release);
    struct wire_ft_engines l;
    struct wire_err err;
    if (wire_ft_engines_parse(in, &l, &err) == 0) {
        for (size_t i = 0; i < l.n; i++) {
            free(wire_ft_engine_entry_signature(&l.v[i]));
            json_decref(wire_ft_engine_entry_to_json(&l.v[i]));
        }
        wire_ft_engines_release(&l);
    }
    json_decref(in);
    return 0;
}
