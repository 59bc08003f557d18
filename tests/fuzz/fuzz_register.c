/* libFuzzer: RegisterMsg and ReregisterMsg parsing (the Controller's registration
 * routes). Any input must parse or fail cleanly; accepted inputs must round-trip
 * (parse -> serialize -> text -> parse gives an identical serialization). */
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

static int rereg_parse(json_t *j, struct wire_reregister *out, struct wire_err *err)
{
    return wire_reregister_parse(j, 0, out, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    ROUND_TRIP(struct wire_register, wire_register_parse, wire_register_to_json,
               wire_register_release);
    ROUND_TRIP(struct wire_reregister, rereg_parse, wire_reregister_to_json,
               wire_reregister_release);
    json_decref(in);
    return 0;
}
