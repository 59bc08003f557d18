/* nm_ft: the FT manager's per-endpoint poll bookkeeping (§2.10) and the report fields of
 * an engine FT status entry. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "nodemgr/nm_internal.h"
#include "wire/wire_ft.h"

#include <stdlib.h>
#include <string.h>

/* An entry from a JSON text (single quotes for readability). */
static void entry_from(const char *text, struct wire_ft_engine_entry *e)
{
    char buf[512];
    size_t n = strlen(text);
    assert_true(n < sizeof(buf));
    for (size_t i = 0; i <= n; i++)
        buf[i] = text[i] == '\'' ? '"' : text[i];
    json_error_t jerr;
    json_t *j = json_loads(buf, 0, &jerr);
    assert_non_null(j);
    struct wire_err err = {{0}};
    assert_int_equal(wire_ft_engine_entry_parse(j, e, &err), 0);
    json_decref(j);
}

/* Observe an OK poll with this entry; returns the flags, frees the signature. */
static unsigned ok(struct nm_ft_track *t, const char *text, char **sig)
{
    struct wire_ft_engine_entry e;
    entry_from(text, &e);
    char *s = NULL;
    unsigned f = nm_ft_track_observe(t, NM_FT_EV_OK, &e, 3, 3, &s);
    wire_ft_engine_entry_release(&e);
    if (sig)
        *sig = s;
    else
        free(s);
    return f;
}

static void test_healthy_is_remembered_not_reported(void **state)
{
    (void)state;
    struct nm_ft_track t = {0};
    assert_int_equal(ok(&t, "{'id':0,'status':'healthy'}", NULL), 0);
    assert_non_null(t.sig);
    assert_int_equal(ok(&t, "{'id':0,'status':'healthy'}", NULL), 0);
    nm_ft_track_release(&t);
}

static void test_report_once_per_signature_after_delivery(void **state)
{
    (void)state;
    struct nm_ft_track t = {0};
    char *sig = NULL;
    const char *dead = "{'id':0,'status':'dead','fault_info':'boom'}";
    assert_int_equal(ok(&t, dead, &sig), NM_FT_REPORT_STATUS);
    assert_non_null(sig);
    /* Not delivered (refused or in flight): the next poll wants to report again. */
    free(sig);
    assert_int_equal(ok(&t, dead, &sig), NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, sig);
    assert_int_equal(ok(&t, dead, NULL), 0);
    assert_int_equal(ok(&t, dead, NULL), 0);
    /* unhealthy/recovering -> unhealthy/failed: another signature, delivered too. */
    assert_int_equal(ok(&t, "{'id':0,'status':'unhealthy','ft_state':'recovering'}", &sig),
                     NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, sig);
    assert_int_equal(ok(&t, "{'id':0,'status':'unhealthy','ft_state':'failed'}", &sig),
                     NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, sig);
    /* Healthy in between: the same fault again is a new episode. */
    assert_int_equal(ok(&t, "{'id':0,'status':'healthy'}", NULL), 0);
    assert_int_equal(ok(&t, dead, &sig), NM_FT_REPORT_STATUS);
    free(sig);
    /* Every FT field is part of the signature. */
    nm_ft_track_delivered(&t, false, NULL);
    char *a = NULL;
    assert_int_equal(ok(&t, "{'id':0,'status':'unhealthy','mask':[1]}", &a), NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, a);
    assert_int_equal(ok(&t, "{'id':0,'status':'unhealthy','mask':[2]}", &a), NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, a);
    assert_int_equal(
        ok(&t, "{'id':0,'status':'unhealthy','mask':[2],'last_ft_request_id':'r'}", &a),
        NM_FT_REPORT_STATUS);
    nm_ft_track_delivered(&t, false, a);
    assert_int_equal(ok(&t,
                        "{'id':0,'status':'unhealthy','mask':[2],'last_ft_request_id':'r',"
                        "'ft_error':{'x':1}}",
                        &a),
                     NM_FT_REPORT_STATUS);
    free(a);
    nm_ft_track_release(&t);
}

static void test_failures_report_unreachable_once(void **state)
{
    (void)state;
    struct nm_ft_track t = {0};
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL), 0);
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL), 0);
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL),
                     NM_FT_REPORT_UNREACHABLE);
    /* Refused: asked again at the next failure. */
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL),
                     NM_FT_REPORT_UNREACHABLE);
    nm_ft_track_delivered(&t, true, NULL);
    for (int i = 0; i < 10; i++)
        assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL), 0);
    assert_int_equal(t.failures, 14);
    /* A good poll ends the run: the next run is reported again. */
    assert_int_equal(ok(&t, "{'id':0,'status':'healthy'}", NULL), 0);
    assert_int_equal(t.failures, 0);
    assert_false(t.unreachable_reported);
    nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL);
    nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL);
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 3, NULL),
                     NM_FT_REPORT_UNREACHABLE);
    /* A 404 is an answer: it breaks the failure run. */
    nm_ft_track_observe(&t, NM_FT_EV_NOT_FOUND, NULL, 3, 3, NULL);
    assert_int_equal(t.failures, 0);
    nm_ft_track_release(&t);
}

static void test_404_unsupported_and_back(void **state)
{
    (void)state;
    struct nm_ft_track t = {0};
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_NOT_FOUND, NULL, 3, 2, NULL), 0);
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_NOT_FOUND, NULL, 3, 2, NULL),
                     NM_FT_NOW_UNSUPPORTED);
    assert_true(t.unsupported);
    /* Re-probes that still 404 say nothing new. */
    assert_int_equal(nm_ft_track_observe(&t, NM_FT_EV_NOT_FOUND, NULL, 3, 2, NULL), 0);
    assert_true(t.unsupported);
    /* A failure breaks the 404 streak but does not make it supported. */
    nm_ft_track_observe(&t, NM_FT_EV_FAILED, NULL, 3, 2, NULL);
    assert_int_equal(t.n404, 0);
    assert_true(t.unsupported);
    /* The engine got the API (upgrade): supported again, its status handled. */
    char *sig = NULL;
    struct wire_ft_engine_entry e;
    entry_from("{'id':0,'status':'unhealthy'}", &e);
    unsigned f = nm_ft_track_observe(&t, NM_FT_EV_OK, &e, 3, 2, &sig);
    assert_int_equal(f, NM_FT_NOW_SUPPORTED | NM_FT_REPORT_STATUS);
    assert_false(t.unsupported);
    free(sig);
    wire_ft_engine_entry_release(&e);
    /* max 0 (or less) behaves as 1. */
    struct nm_ft_track u = {0};
    assert_int_equal(nm_ft_track_observe(&u, NM_FT_EV_NOT_FOUND, NULL, 0, 0, NULL),
                     NM_FT_NOW_UNSUPPORTED);
    assert_int_equal(nm_ft_track_observe(&u, NM_FT_EV_FAILED, NULL, 0, 0, NULL),
                     NM_FT_REPORT_UNREACHABLE);
    nm_ft_track_release(&u);
    nm_ft_track_release(&t);
}

static void test_report_fields(void **state)
{
    (void)state;
    static const struct {
        const char *entry;
        enum wire_engine_status status;
        const char *type;
    } cases[] = {
        {"{'id':1,'status':'healthy'}", WIRE_ENGINE_HEALTHY, "EngineUnhealthyError"},
        {"{'id':1,'status':'dead'}", WIRE_ENGINE_DEAD, "EngineDeadError"},
        {"{'id':1,'status':'dead','fault_info':'NPU lost'}", WIRE_ENGINE_DEAD, "EngineDeadError"},
        {"{'id':1,'status':'unhealthy'}", WIRE_ENGINE_UNHEALTHY, "EngineUnhealthyError"},
        {"{'id':1,'status':'unhealthy','fault_info':'HcclTimeout'}", WIRE_ENGINE_UNHEALTHY,
         "HcclTimeout"},
        {"{'id':1,'status':'unhealthy','fault_info':''}", WIRE_ENGINE_UNHEALTHY,
         "EngineUnhealthyError"},
        {"{'id':1,'status':'unhealthy','fault_info':{'code':7}}", WIRE_ENGINE_UNHEALTHY,
         "{\"code\":7}"},
        {"{'id':1,'status':'degraded'}", WIRE_ENGINE_UNHEALTHY, "EngineUnhealthyError"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct wire_ft_engine_entry e;
        entry_from(cases[i].entry, &e);
        assert_int_equal(nm_ft_entry_engine_status(&e), cases[i].status);
        char buf[256];
        nm_ft_entry_exception_type(&e, buf, sizeof(buf));
        assert_string_equal(buf, cases[i].type);
        wire_ft_engine_entry_release(&e);
    }
    /* A long fault_info is capped by the buffer. */
    struct wire_ft_engine_entry e;
    entry_from("{'id':1,'status':'unhealthy','fault_info':'0123456789abcdef'}", &e);
    char small[8];
    nm_ft_entry_exception_type(&e, small, sizeof(small));
    assert_string_equal(small, "0123456");
    wire_ft_engine_entry_release(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_healthy_is_remembered_not_reported),
        cmocka_unit_test(test_report_once_per_signature_after_delivery),
        cmocka_unit_test(test_failures_report_unreachable_once),
        cmocka_unit_test(test_404_unsupported_and_back),
        cmocka_unit_test(test_report_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
