/* libFuzzer: the fault-tolerance bodies (wire_ft.h) — what the Controller sends to the
 * node manager's /node-manager/fault-tolerance/{status,apply,guard,finalize} and
 * /engine-restart, what an engine answers on GET /v1/fault_tolerance/status, and the node
 * manager proxy's status reply the Controller parses. Any input must parse or fail
 * cleanly with a message; accepted inputs must round-trip (parse -> serialize -> text ->
 * parse gives an identical serialization), and the apply body forwarded to engines must
 * carry a port in 1..65535 and no internal dp_master_rank. */
#include "wire/wire_ft.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ROUND_TRIP(type, parse, to_json, release)                                                  \
    do {                                                                                           \
        type a_, b_;                                                                               \
        struct wire_err e_ = {{0}};                                                                \
        int rc_ = parse(in, &a_, &e_);                                                             \
        if (rc_ != 0) {                                                                            \
            if ((rc_ != -EINVAL && rc_ != -ERANGE) || !e_.msg[0])                                  \
                abort();                                                                           \
            break;                                                                                 \
        }                                                                                          \
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

static void restart_release(struct wire_engine_restart_req *r)
{
    (void)r;
}

static void engines_use(const struct wire_ft_engines *l)
{
    for (size_t i = 0; i < l->n; i++) {
        const struct wire_ft_engine_entry *e = &l->v[i];
        if (!e->status)
            abort();
        char *sig = wire_ft_engine_entry_signature(e);
        if (!sig)
            abort();
        free(sig);
        json_t *j = wire_ft_engine_entry_to_json(e);
        /* one entry must re-parse to the same serialization */
        struct wire_ft_engine_entry again;
        struct wire_err err = {{0}};
        if (wire_ft_engine_entry_parse(j, &again, &err) != 0)
            abort();
        json_t *j2 = wire_ft_engine_entry_to_json(&again);
        if (!json_equal(j, j2))
            abort();
        json_decref(j2);
        wire_ft_engine_entry_release(&again);
        json_decref(j);
        if (!wire_ft_engines_find(l, e->id))
            abort();
    }
}

static void apply_forward(json_t *in, int port)
{
    struct wire_ft_apply_req r;
    struct wire_err err = {{0}};
    if (wire_ft_apply_req_parse(in, &r, &err) != 0)
        return;
    json_t *body = wire_ft_apply_engine_body(&r, port, &err);
    if (body) {
        json_t *params = json_object_get(body, "params");
        if (!json_is_object(params))
            abort();
        /* §8.3: for scale_down the node manager turns the internal dp_master_rank into
         * dp_store_port; retry params are forwarded as they are. */
        if (r.instruction == WIRE_FT_SCALE_DOWN) {
            if (json_object_get(params, "dp_master_rank"))
                abort();
            json_int_t p = json_integer_value(json_object_get(params, "dp_store_port"));
            if (p < 1 || p > 65535)
                abort();
        }
        json_decref(body);
    } else if (!err.msg[0]) {
        abort();
    }
    wire_ft_apply_req_release(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    ROUND_TRIP(struct wire_ft_status_req, wire_ft_status_req_parse, wire_ft_status_req_to_json,
               wire_ft_status_req_release);
    ROUND_TRIP(struct wire_ft_apply_req, wire_ft_apply_req_parse, wire_ft_apply_req_to_json,
               wire_ft_apply_req_release);
    ROUND_TRIP(struct wire_ft_guard_req, wire_ft_guard_req_parse, wire_ft_guard_req_to_json,
               wire_ft_guard_req_release);
    ROUND_TRIP(struct wire_ft_finalize_req, wire_ft_finalize_req_parse,
               wire_ft_finalize_req_to_json, wire_ft_finalize_req_release);
    ROUND_TRIP(struct wire_engine_restart_req, wire_engine_restart_req_parse,
               wire_engine_restart_req_to_json, restart_release);
    apply_forward(in, 29500);
    apply_forward(in, 65535);
    apply_forward(in, 1);

    struct wire_ft_engines l;
    struct wire_err err = {{0}};
    if (wire_ft_engines_parse(in, &l, &err) == 0) {
        engines_use(&l);
        wire_ft_engines_release(&l);
    } else if (!err.msg[0]) {
        abort();
    }
    memset(&err, 0, sizeof(err));
    if (wire_ft_status_reply_parse(in, &l, &err) == 0) {
        engines_use(&l);
        wire_ft_engines_release(&l);
    } else if (!err.msg[0]) {
        abort();
    }
    /* a single entry at the top level too (what a poll error entry looks like) */
    struct wire_ft_engine_entry e;
    memset(&err, 0, sizeof(err));
    if (wire_ft_engine_entry_parse(in, &e, &err) == 0)
        wire_ft_engine_entry_release(&e);
    json_decref(in);
    return 0;
}
