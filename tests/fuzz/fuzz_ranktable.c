/* libFuzzer: Ranktable parsing (inside start commands and registrations, and the
 * HCCL_PATH file). Any input must parse or fail cleanly; an accepted input must
 * round-trip, and the 2-space-indented file text must parse back to the same value. */
#include "wire/wire_ranktable.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    struct wire_ranktable a, b;
    struct wire_err err;
    if (wire_ranktable_parse(in, &a, &err) == 0) {
        json_t *ja = wire_ranktable_to_json(&a);
        char *text = json_dumps(ja, JSON_INDENT(2));
        json_t *again = text ? json_loads(text, 0, NULL) : NULL;
        if (!again || wire_ranktable_parse(again, &b, &err) != 0)
            abort();
        json_t *jb = wire_ranktable_to_json(&b);
        if (!json_equal(ja, jb))
            abort();
        struct wire_ranktable *d = wire_ranktable_dup(&b);
        json_t *jd = wire_ranktable_to_json(d);
        if (!json_equal(ja, jd))
            abort();
        json_decref(jd);
        wire_ranktable_free(d);
        wire_ranktable_release(&b);
        json_decref(jb);
        json_decref(again);
        free(text);
        json_decref(ja);
        wire_ranktable_release(&a);
    }
    json_decref(in);
    return 0;
}
