/* libFuzzer: bytes -> the other configuration loaders of user_config.json: the
 * Controller's (ctlcfg_apply), the coordinator's (ccfg_apply) and `motor up`'s planner
 * (up_plan_build, which also runs every pod through the node manager's loader). The
 * node manager's own loader has fuzz_nm_config. Checks: loaders never crash or leak on
 * any document, errors are counted consistently, and a plan that builds has ports in
 * 1..65535, pods within the cap and an effective configuration that serializes. */
#include "cli/up_plan.h"
#include "common/cfgtab.h"
#include "controller/ctl_config.h"
#include "coordinator/coord_config.h"
#include "fuzz_paths.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_paths_init();
    atexit(fuzz_paths_cleanup);
    /* the loaders read POD_IP / COORDINATOR_SERVICE; fix them so runs are reproducible */
    setenv("POD_IP", "127.0.0.1", 1);
    unsetenv("COORDINATOR_SERVICE");
    unsetenv("CONTROLLER_SERVICE");
    return 0;
}

static void check_report(struct cfg_errors *e)
{
    const char *t = cfg_errors_text(e);
    size_t n = strlen(t);
    if (cfg_errors_count(e) > 0 && n == 0)
        abort();
    if (n && t[n - 1] != '\n')
        abort();
}

/* The effective dump serializes; a config differs from itself in nothing; a diff against
 * the defaults completes. */
static void dump_and_diff(const struct cfgtab *t, const void *def, const void *c)
{
    json_t *j = cfgtab_dump(t, c);
    char *text = json_dumps(j, JSON_COMPACT);
    if (!text)
        abort();
    free(text);
    json_decref(j);
    char *d = cfgtab_diff(t, c, c, 0, 0);
    if (d)
        abort();
    free(cfgtab_diff(t, def, c, CFGTAB_LIVE, 0));
}

static void plan(json_t *root, int port_base)
{
    struct up_plan_opts o = {0};
    o.port_base = port_base;
    o.state_dir = "/nonexistent/motor-fuzz-state";
    o.motor_bin = "/usr/bin/motor";
    struct up_plan p;
    struct cfg_errors e;
    cfg_errors_init(&e, "user_config");
    int rc = up_plan_build(root, &o, &p, &e);
    if (rc == 0) {
        if (cfg_errors_count(&e) != 0 || p.n_pods > UP_PLAN_MAX_PODS || !p.config)
            abort();
        int *ports = NULL;
        char **owners = NULL;
        size_t n = up_plan_ports(&p, &ports, &owners);
        for (size_t i = 0; i < n; i++) {
            if (ports[i] < 1 || ports[i] > 65535 || !owners[i])
                abort();
            free(owners[i]);
        }
        free(ports);
        free(owners);
        char *text = json_dumps(p.config, JSON_COMPACT);
        if (!text)
            abort();
        free(text);
    } else if (cfg_errors_count(&e) == 0) {
        abort();
    }
    check_report(&e);
    up_plan_release(&p);
    cfg_errors_release(&e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!root)
        return 0;
    fuzz_sanitize_paths(root, 0);

    struct cfg_errors e;
    cfg_errors_init(&e, "user_config");
    struct ctlcfg cc, cdef;
    ctlcfg_init(&cc);
    ctlcfg_init(&cdef);
    ctlcfg_apply(&cc, root, &e);
    double lease = ctlcfg_guard_lease_s(&cc);
    if (!(lease >= 0) || lease > 300.0001)
        abort();
    (void)ctlcfg_store_name(cc.store);
    dump_and_diff(&ctlcfg_cfgtab, &cdef, &cc);
    ctlcfg_release(&cc);
    ctlcfg_release(&cdef);
    check_report(&e);
    cfg_errors_release(&e);

    cfg_errors_init(&e, "user_config");
    struct ccfg co, codef;
    ccfg_init(&co);
    ccfg_init(&codef);
    ccfg_apply(&co, root, &e);
    dump_and_diff(&ccfg_cfgtab, &codef, &co);
    ccfg_release(&co);
    ccfg_release(&codef);
    check_report(&e);
    cfg_errors_release(&e);

    if (json_is_object(root)) {
        plan(root, 0);
        plan(root, 24000);
    }
    json_decref(root);
    return 0;
}
