/* libFuzzer: StartCmdMsg (POST /node-manager/start) parsing, the node manager's most
 * exposed input. Any input must parse or fail cleanly; an accepted input must survive
 * parse -> serialize -> text -> parse with an identical serialization (round trip);
 * a strict parse (newest Controller) that succeeds must agree with the tolerant one. */
#include "wire/wire_msg.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *in = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!in)
        return 0;
    struct wire_start_cmd a, b, s;
    struct wire_err err;
    if (wire_start_cmd_parse(in, 0, &a, &err) == 0) {
        json_t *ja = wire_start_cmd_to_json(&a);
        char *text = json_dumps(ja, JSON_COMPACT);
        json_t *again = text ? json_loads(text, 0, NULL) : NULL;
        if (!again || wire_start_cmd_parse(again, WIRE_STRICT_ENDPOINT, &b, &err) != 0)
            abort(); /* our own output is always the newest shape */
        json_t *jb = wire_start_cmd_to_json(&b);
        if (!json_equal(ja, jb))
            abort();
        if (wire_start_cmd_parse(in, WIRE_STRICT_ENDPOINT, &s, &err) == 0) {
            json_t *js = wire_start_cmd_to_json(&s);
            if (!json_equal(ja, js))
                abort();
            json_decref(js);
            wire_start_cmd_release(&s);
        }
        wire_start_cmd_release(&b);
        json_decref(jb);
        json_decref(again);
        free(text);
        json_decref(ja);
        wire_start_cmd_release(&a);
    } else if (wire_start_cmd_parse(in, WIRE_STRICT_ENDPOINT, &s, &err) == 0) {
        abort(); /* strict accepts a subset of tolerant */
    }
    json_decref(in);
    return 0;
}
