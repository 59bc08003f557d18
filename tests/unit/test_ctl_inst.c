/* Controller instance model: the §5.10 state table (all 19 transitions and every
 * missing one), heartbeat event evaluation, the heartbeat size rule, NM lookup for
 * several NMs on one host, persistence round trip and the coordinator shape. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "controller/ctl_inst.h"
#include "common/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define I WIRE_INS_INITIAL
#define A WIRE_INS_ACTIVE
#define N WIRE_INS_INACTIVE
#define P WIRE_INS_PAUSED
#define D WIRE_INS_DELETED
#define X -1

static void test_state_table(void **state)
{
    (void)state;
    /* Rows: from; columns: INIT NORMAL ABNORMAL HB_TIMEOUT PAUSED RESUMED (spec §5.10). */
    static const struct {
        enum wire_ins_status from;
        int to[CTL_EV_COUNT];
    } rows[] = {
        {I, {I, A, N, D, P, X}}, {A, {X, A, N, N, P, X}}, {N, {I, A, N, D, P, X}},
        {P, {X, A, N, D, P, A}}, {D, {X, X, X, X, X, X}},
    };
    int defined = 0;
    for (size_t r = 0; r < ARRAY_LEN(rows); r++) {
        for (int ev = 0; ev < CTL_EV_COUNT; ev++) {
            enum wire_ins_status to = (enum wire_ins_status)99;
            int rc = ctl_transition(rows[r].from, (enum ctl_event)ev, &to);
            if (rows[r].to[ev] == X) {
                assert_int_equal(rc, -ENOENT);
                assert_int_equal(to, 99); /* untouched */
            } else {
                assert_int_equal(rc, 0);
                assert_int_equal(to, rows[r].to[ev]);
                defined++;
            }
        }
    }
    assert_int_equal(defined, 19);
    enum wire_ins_status to;
    assert_int_equal(ctl_transition((enum wire_ins_status)17, CTL_EV_INIT, &to), -ENOENT);
    assert_int_equal(ctl_transition(I, (enum ctl_event)42, &to), -ENOENT);
    assert_string_equal(ctl_event_name(CTL_EV_HB_TIMEOUT), "HEARTBEAT_TIMEOUT");
}

/* An instance with NMs; eps: per NM a string of statuses ('i','n','a','p','w'), headless
 * marked uppercase. Ids are consecutive. */
static struct ctl_inst *mk(const char *const *nms, bool same_host)
{
    struct ctl_inst *in = ctl_inst_new(7);
    in->job_name = xstrdup("job");
    in->model_name = xstrdup("m");
    size_t n = 0;
    while (nms[n])
        n++;
    in->nms = xcalloc(n, sizeof(*in->nms));
    int64_t id = 0;
    for (size_t i = 0; i < n; i++) {
        struct ctl_nm *nm = &in->nms[in->n_nms++];
        nm->pod_ip = same_host ? xstrdup("127.0.0.1") : xasprintf("10.0.0.%d", (int)i);
        nm->port = xasprintf("%d", 1026 + (int)i);
        size_t k = strlen(nms[i]);
        nm->eps = xcalloc(k + 1, sizeof(*nm->eps));
        for (size_t j = 0; j < k; j++) {
            struct wire_endpoint *ep = &nm->eps[nm->n_eps++];
            ep->id = id++;
            ep->ip = xstrdup(nm->pod_ip);
            ep->business_port = xasprintf("%d", 10000 + 2 * (int)j);
            char ch = nms[i][j];
            ep->headless = ch >= 'A' && ch <= 'Z';
            switch (ch | 0x20) {
            case 'n':
                ep->status = WIRE_EP_NORMAL;
                break;
            case 'a':
                ep->status = WIRE_EP_ABNORMAL;
                break;
            case 'p':
                ep->status = WIRE_EP_PAUSED;
                break;
            case 'w':
                ep->status = WIRE_EP_WAIT2START;
                break;
            default:
                ep->status = WIRE_EP_INITIAL;
            }
        }
    }
    return in;
}

static enum ctl_event eval(const char *a, const char *b)
{
    const char *nms[] = {a, b, NULL};
    struct ctl_inst *in = mk(nms, false);
    enum ctl_event ev = ctl_inst_evaluate(in, NULL, 0);
    ctl_inst_free(in);
    return ev;
}

static void test_evaluate(void **state)
{
    (void)state;
    static const struct {
        const char *a, *b;
        enum ctl_event want;
    } cases[] = {
        {"pp", "pp", CTL_EV_PAUSED},   /* all paused */
        {"nn", "nn", CTL_EV_NORMAL},   /* all normal */
        {"nn", "NW", CTL_EV_NORMAL},   /* headless may be wait2start */
        {"nn", "nw", CTL_EV_INIT},     /* routable wait2start is not ready */
        {"na", "nn", CTL_EV_ABNORMAL}, /* any abnormal */
        {"ap", "pp", CTL_EV_ABNORMAL}, /* abnormal beats paused */
        {"np", "nn", CTL_EV_PAUSED},   /* some paused */
        {"ni", "nn", CTL_EV_INIT},     /* still starting */
        {"ii", "ii", CTL_EV_INIT},     {"N", "n", CTL_EV_NORMAL}, /* headless normal counts too */
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        enum ctl_event got = eval(cases[i].a, cases[i].b);
        if (got != cases[i].want)
            fail_msg("case %zu (%s|%s): got %s want %s", i, cases[i].a, cases[i].b,
                     ctl_event_name(got), ctl_event_name(cases[i].want));
    }
    /* Retired ranks take no part: rank 1 abnormal but retired. */
    const char *nms[] = {"na", NULL};
    struct ctl_inst *in = mk(nms, false);
    int64_t retired[] = {1};
    assert_int_equal(ctl_inst_evaluate(in, NULL, 0), CTL_EV_ABNORMAL);
    assert_int_equal(ctl_inst_evaluate(in, retired, 1), CTL_EV_NORMAL);
    ctl_inst_free(in);
    /* No endpoints at all: INIT. */
    struct ctl_inst *empty = ctl_inst_new(1);
    assert_int_equal(ctl_inst_evaluate(empty, NULL, 0), CTL_EV_INIT);
    ctl_inst_free(empty);
}

static void test_hb_size_rule(void **state)
{
    (void)state;
    const char *nms[] = {"nnn", NULL};
    struct ctl_inst *in = mk(nms, false);
    struct ctl_nm *nm = &in->nms[0];
    struct wire_err err = {{0}};
    struct wire_hb_status all[] = {{0, WIRE_EP_NORMAL}, {1, WIRE_EP_NORMAL}, {2, WIRE_EP_NORMAL}};
    assert_int_equal(ctl_nm_check_hb_ids(nm, all, 3, NULL, 0, &err), 0);
    /* One missing. */
    assert_int_equal(ctl_nm_check_hb_ids(nm, all, 2, NULL, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "2 endpoint(s) reported"));
    /* ...unless it is a committed retired rank. */
    int64_t retired[] = {2};
    assert_int_equal(ctl_nm_check_hb_ids(nm, all, 2, retired, 1, &err), 0);
    /* A retired rank that is still reported is fine too. */
    assert_int_equal(ctl_nm_check_hb_ids(nm, all, 3, retired, 1, &err), 0);
    /* An unknown id. */
    struct wire_hb_status bad[] = {{0, WIRE_EP_NORMAL}, {1, WIRE_EP_NORMAL}, {9, WIRE_EP_NORMAL}};
    assert_int_equal(ctl_nm_check_hb_ids(nm, bad, 3, NULL, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "endpoint 9 is not registered"));
    /* Empty map for a pod with endpoints. */
    assert_int_equal(ctl_nm_check_hb_ids(nm, NULL, 0, NULL, 0, &err), -EINVAL);
    ctl_inst_free(in);
}

/* Seed 001: the freshness of an instance's members. A pod whose every rank is retired is
 * no member; the stalest stale member is reported with its age. */
static void test_freshness(void **state)
{
    (void)state;
    const char *nms[] = {"nn", "nn", "n", NULL};
    struct ctl_inst *in = mk(nms, false);
    in->nms[0].last_hb_ms = 10000;
    in->nms[1].last_hb_ms = 4000;
    in->nms[2].last_hb_ms = 1000;
    struct ctl_freshness f;
    ctl_inst_freshness(in, 10000, 3000, NULL, 0, &f);
    assert_int_equal(f.members, 3);
    assert_int_equal(f.stale, 2);
    assert_int_equal(f.fresh, 1);
    assert_int_equal(f.worst, 2);
    assert_int_equal(f.worst_age_ms, 9000);
    /* NM 2 (rank 4) retired by a scale-down: no member, so not stale either. */
    int64_t retired[] = {4};
    assert_false(ctl_nm_is_member(&in->nms[2], retired, 1));
    assert_true(ctl_nm_is_member(&in->nms[1], retired, 1));
    ctl_inst_freshness(in, 10000, 3000, retired, 1, &f);
    assert_int_equal(f.members, 2);
    assert_int_equal(f.stale, 1);
    assert_int_equal(f.worst, 1);
    assert_int_equal(f.worst_age_ms, 6000);
    /* Within the timeout (the boundary included): nothing stale. */
    ctl_inst_freshness(in, 7000, 6000, retired, 1, &f);
    assert_int_equal(f.stale, 0);
    assert_int_equal(f.worst, -1);
    /* Loaded by a restarted controller, no heartbeat since: stale whatever its age. */
    in->nms[0].unconfirmed = true;
    ctl_inst_freshness(in, 7000, 6000, retired, 1, &f);
    assert_int_equal(f.stale, 1);
    assert_int_equal(f.worst, 0);
    ctl_inst_free(in);
}

static void test_find_nm_same_host(void **state)
{
    (void)state;
    /* Two NMs on 127.0.0.1 (tests, single host): the heartbeat's ids pick the NM. */
    const char *nms[] = {"nn", "nn", NULL};
    struct ctl_inst *in = mk(nms, true);
    struct wire_hb_status second[] = {{2, WIRE_EP_NORMAL}, {3, WIRE_EP_NORMAL}};
    struct wire_hb_status first[] = {{1, WIRE_EP_NORMAL}, {0, WIRE_EP_NORMAL}};
    assert_int_equal(ctl_inst_find_nm_for_ids(in, "127.0.0.1", second, 2, NULL, 0), 1);
    assert_int_equal(ctl_inst_find_nm_for_ids(in, "127.0.0.1", first, 2, NULL, 0), 0);
    assert_int_equal(ctl_inst_find_nm_for_ids(in, "10.9.9.9", first, 2, NULL, 0), -1);
    /* An empty report: the NM left without ranks (all retired), else the first. */
    int64_t retired[] = {2, 3};
    assert_int_equal(ctl_inst_find_nm_for_ids(in, "127.0.0.1", NULL, 0, retired, 2), 1);
    assert_int_equal(ctl_inst_find_nm_for_ids(in, "127.0.0.1", NULL, 0, NULL, 0), 0);
    assert_int_equal(ctl_inst_find_nm(in, "127.0.0.1", "1027"), 1);
    assert_int_equal(ctl_inst_find_nm(in, "127.0.0.1", "9"), -1);
    assert_int_equal(ctl_inst_find_nm(in, "127.0.0.1", NULL), 0);
    size_t idx = 99;
    assert_non_null(ctl_inst_endpoint(in, 3, &idx));
    assert_int_equal(idx, 1);
    assert_null(ctl_inst_endpoint(in, 4, NULL));
    assert_int_equal(ctl_inst_n_endpoints(in), 4);
    ctl_inst_free(in);
}

static void test_store_roundtrip(void **state)
{
    (void)state;
    const char *nms[] = {"nn", "W", NULL};
    struct ctl_inst *in = mk(nms, false);
    in->role = WIRE_ROLE_DECODE;
    in->status = WIRE_INS_ACTIVE;
    in->engine_type = xstrdup("vllm");
    in->nnodes = 2;
    in->master_dp_ip = xstrdup("10.1.0.0");
    in->assembled = true;
    in->ever_ready = true;
    in->ft_cap.enabled = true;
    in->ft_cap.num_redundant_experts = 3;
    in->pc.dp_size = 2;
    wire_strlist_push(&in->dispatch_caps, "prefill_handoff_decode");
    in->nms[1].node_rank = 1;
    in->nms[0].start_ok = true;
    json_t *j = ctl_inst_store_json(in);
    char *text = json_dumps(j, JSON_COMPACT);
    json_t *back = json_loads(text, 0, NULL);
    struct wire_err err = {{0}};
    struct ctl_inst *r = ctl_inst_from_store_json(back, &err);
    if (!r)
        fail_msg("round trip failed: %s", err.msg);
    assert_int_equal(r->id, 7);
    assert_string_equal(r->job_name, "job");
    assert_string_equal(r->engine_type, "vllm");
    assert_int_equal(r->role, WIRE_ROLE_DECODE);
    assert_int_equal(r->status, WIRE_INS_ACTIVE);
    assert_int_equal(r->nnodes, 2);
    assert_true(r->assembled);
    assert_true(r->ever_ready);
    assert_true(r->ft_cap.enabled);
    assert_int_equal(r->ft_cap.num_redundant_experts, 3);
    assert_int_equal(r->pc.dp_size, 2);
    assert_int_equal(r->dispatch_caps.n, 1);
    assert_int_equal(r->n_nms, 2);
    assert_int_equal(r->nms[1].node_rank, 1);
    assert_true(r->nms[0].start_ok);
    assert_false(r->nms[1].start_ok);
    assert_int_equal(r->nms[1].n_eps, 1);
    assert_true(r->nms[1].eps[0].headless);
    assert_int_equal(r->nms[1].eps[0].status, WIRE_EP_WAIT2START);
    assert_string_equal(r->master_dp_ip, "10.1.0.0");
    ctl_inst_free(r);
    json_decref(back);
    free(text);
    json_decref(j);
    /* Malformed documents are refused with a message. */
    json_t *bad = json_loads("{\"id\":3,\"job_name\":\"j\",\"model_name\":\"m\",\"role\":\"nope\","
                             "\"status\":\"active\",\"node_managers\":[]}",
                             0, NULL);
    assert_null(ctl_inst_from_store_json(bad, &err));
    assert_true(err.msg[0] != '\0');
    json_decref(bad);
    ctl_inst_free(in);
}

static void test_coord_shape(void **state)
{
    (void)state;
    const char *nms[] = {"nn", "nn", NULL};
    struct ctl_inst *in = mk(nms, true);
    in->status = WIRE_INS_ACTIVE;
    int64_t ex[] = {2};
    json_t *j = ctl_inst_coord_json(in, ex, 1, -1);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "active");
    json_t *eps = json_object_get(json_object_get(j, "endpoints"), "127.0.0.1");
    assert_int_equal(json_object_size(eps), 3); /* 0, 1, 3: rank 2 left out */
    assert_null(json_object_get(eps, "2"));
    json_t *e3 = json_object_get(eps, "3");
    assert_string_equal(json_string_value(json_object_get(e3, "business_port")), "10002");
    assert_null(json_object_get(e3, "mgmt_port"));
    assert_int_equal(json_array_size(json_object_get(j, "node_managers")), 2);
    json_decref(j);
    j = ctl_inst_coord_json(in, NULL, 0, WIRE_INS_PAUSED);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "paused");
    json_decref(j);
    ctl_inst_free(in);
}

static void test_ids(void **state)
{
    (void)state;
    int64_t *v = NULL;
    size_t n = 0;
    ctl_ids_add(&v, &n, 5);
    ctl_ids_add(&v, &n, 1);
    ctl_ids_add(&v, &n, 3);
    ctl_ids_add(&v, &n, 3);
    assert_int_equal(n, 3);
    assert_int_equal(v[0], 1);
    assert_int_equal(v[2], 5);
    ctl_ids_remove(v, &n, 1);
    assert_int_equal(n, 2);
    assert_int_equal(v[0], 3);
    assert_false(ctl_ids_has(v, n, 1));
    free(v);
    json_t *a = json_loads("[4, 2, 4]", 0, NULL);
    assert_int_equal(ctl_ids_parse(a, &v, &n), 0);
    assert_int_equal(n, 2);
    assert_int_equal(v[0], 2);
    free(v);
    json_decref(a);
    a = json_loads("[1, -1]", 0, NULL);
    assert_int_equal(ctl_ids_parse(a, &v, &n), -EINVAL);
    assert_null(v);
    json_decref(a);
}

/* Same id, new object: replies addressed to the old one must be told apart. */
static void test_incarnations_are_unique(void **state)
{
    (void)state;
    struct ctl_inst *a = ctl_inst_new(42);
    uint64_t first = a->incarnation;
    ctl_inst_free(a);
    struct ctl_inst *b = ctl_inst_new(42);
    assert_true(first != 0);
    assert_true(b->incarnation != first);
    ctl_inst_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_table),
        cmocka_unit_test(test_incarnations_are_unique),
        cmocka_unit_test(test_evaluate),
        cmocka_unit_test(test_hb_size_rule),
        cmocka_unit_test(test_freshness),
        cmocka_unit_test(test_find_nm_same_host),
        cmocka_unit_test(test_store_roundtrip),
        cmocka_unit_test(test_coord_shape),
        cmocka_unit_test(test_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
