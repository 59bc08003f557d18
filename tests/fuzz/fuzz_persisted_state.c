/* libFuzzer: what the daemons read back after a restart — state written before a crash
 * that may be truncated, stale or edited by hand, or (etcd store) come from another
 * process: the Controller's instance records (ctl_inst_from_store_json) and
 * fault-tolerance records (ctl_ft_rt_from_store_json), the node manager's persisted
 * launch parameters (nm_launch_state_parse, the --state-file), and the store's base64
 * codec (etcd keys and values). Checks: clean failure or a record that round-trips
 * (serialize -> text -> parse -> serialize is identical), and base64 decode(encode(x))
 * == x. */
#include "common/etcd.h"
#include "controller/ctl_ft.h"
#include "controller/ctl_inst.h"
#include "controller/store.h"
#include "nodemgr/nm_internal.h"
#include "wire/wire_msg.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_t *reparse(json_t *j)
{
    char *t = json_dumps(j, JSON_COMPACT);
    if (!t)
        abort();
    json_t *again = json_loads(t, 0, NULL);
    free(t);
    if (!again)
        abort();
    return again;
}

static void inst_record(json_t *in)
{
    struct wire_err err = {{0}};
    struct ctl_inst *a = ctl_inst_from_store_json(in, &err);
    if (!a) {
        if (!err.msg[0])
            abort();
        return;
    }
    json_t *ja = ctl_inst_store_json(a);
    json_t *again = reparse(ja);
    struct ctl_inst *b = ctl_inst_from_store_json(again, &err);
    if (!b)
        abort();
    json_t *jb = ctl_inst_store_json(b);
    if (!json_equal(ja, jb))
        abort();
    json_t *coord = ctl_inst_coord_json(a, NULL, 0, -1);
    json_decref(coord);
    (void)ctl_inst_n_endpoints(a);
    json_decref(jb);
    json_decref(again);
    json_decref(ja);
    ctl_inst_free(b);
    ctl_inst_free(a);
}

static void ft_record(json_t *in)
{
    struct ctl_ft_rt *rt = ctl_ft_rt_from_store_json(7, in);
    if (!rt)
        return;
    json_t *view = ctl_ft_rt_json(rt);
    json_t *st = ctl_ft_rt_store_json(rt);
    json_t *again = reparse(st);
    struct ctl_ft_rt *rt2 = ctl_ft_rt_from_store_json(7, again);
    if (!rt2)
        abort();
    (void)ctl_ft_can_serve(rt2);
    size_t n = 0;
    free(ctl_ft_alive(rt2, &n));
    ctl_ft_rt_free(rt2);
    json_decref(again);
    json_decref(st);
    json_decref(view);
    ctl_ft_rt_free(rt);
}

static void launch_state(json_t *in)
{
    struct wire_start_cmd a, b;
    struct wire_err err = {{0}};
    if (nm_launch_state_parse(in, &a, &err) != 0) {
        if (!err.msg[0])
            abort();
        return;
    }
    json_t *ja = nm_launch_state_to_json(&a, 3);
    json_t *again = reparse(ja);
    if (nm_launch_state_parse(again, &b, &err) != 0)
        abort();
    json_t *jb = nm_launch_state_to_json(&b, 3);
    /* saved_at is the wall clock of the call, not part of the state */
    json_object_del(ja, "saved_at");
    json_object_del(jb, "saved_at");
    if (!json_equal(ja, jb))
        abort();
    json_decref(jb);
    json_decref(again);
    json_decref(ja);
    wire_start_cmd_release(&b);
    wire_start_cmd_release(&a);
}

static void b64(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    size_t n = 0;
    char *dec = etcd_b64_decode(text, &n);
    if (dec) {
        char *enc = etcd_b64_encode(dec, n);
        size_t n2 = 0;
        char *dec2 = etcd_b64_decode(enc, &n2);
        if (!dec2 || n2 != n || memcmp(dec, dec2, n) != 0)
            abort();
        free(dec2);
        free(enc);
        free(dec);
    }
    char *enc = etcd_b64_encode(data, size);
    dec = etcd_b64_decode(enc, &n);
    if (!dec || n != size || memcmp(dec, data, size) != 0)
        abort();
    free(dec);
    free(enc);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    b64(data, size);
    json_t *in = json_loadb((const char *)data, size, 0, NULL);
    if (!in)
        return 0;
    inst_record(in);
    ft_record(in);
    launch_state(in);
    json_decref(in);
    return 0;
}
