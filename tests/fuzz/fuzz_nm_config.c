/* libFuzzer: bytes -> the node manager's config loader (nm_config_from_json), for every
 * role and with and without the single-container environment, then what the daemon does
 * with a loaded config: the effective-config JSON (--check-config), the reload diff, and
 * the engine command of every endpoint (the flags rendered from engine_config).
 * Checks the loader's promises: NULL exactly when errors were recorded, derived ports in
 * 1..65535, one service port per endpoint, and the rendered argv is NULL-terminated. */
#include "fuzz_paths.h"
#include "nodemgr/engine_cmd.h"
#include "common/cfgtab.h"
#include "nodemgr/nm_config.h"

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
    return 0;
}

static char *env_plain[] = {"POD_IP=127.0.0.1", "JOB_NAME=fuzz-job", NULL};
static char *env_sc[] = {"POD_IP=127.0.0.1", "JOB_NAME=fuzz-job", "INDEX=1",
                         "KUBERNETES_SERVICE_HOST=10.0.0.1", "RANKTABLE_PATH=/nonexistent/rt",
                         NULL};

static void check_ports(const struct nm_config *c)
{
    if (c->node_manager_port < 1 || c->node_manager_port > 65535)
        abort();
    if (c->endpoint_num < 0 || (c->endpoint_num > 0 && !c->service_ports))
        abort();
    for (int i = 0; i < c->endpoint_num; i++)
        if (c->service_ports[i] < 1 || c->service_ports[i] > 65535)
            abort();
    if (c->bootstrap_port < 0 || c->bootstrap_port > 65535)
        abort();
}

static void build_cmds(const struct nm_config *c)
{
    int n = c->endpoint_num < 4 ? c->endpoint_num : 4;
    for (int i = 0; i < n; i++) {
        char port[16];
        snprintf(port, sizeof(port), "%d", c->service_ports[i]);
        struct wire_endpoint ep = {0};
        ep.id = i;
        ep.ip = c->pod_ip;
        ep.business_port = port;
        struct engine_launch l = {0};
        l.role = c->role;
        l.instance_id = 7;
        l.endpoint = &ep;
        l.endpoint_index = i;
        struct engine_cmd cmd;
        struct wire_err err = {{0}};
        if (engine_cmd_build(c, &l, &cmd, &err) == 0) {
            if (!cmd.argv || cmd.argv[cmd.argc] != NULL || cmd.argc == 0)
                abort();
            for (size_t k = 0; k < cmd.envc; k++)
                if (!strchr(cmd.env[k], '='))
                    abort();
            engine_cmd_release(&cmd);
        } else if (!err.msg[0]) {
            abort();
        }
        free(engine_cmd_visible_devices(c, i));
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *root = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!root)
        return 0;
    fuzz_sanitize_paths(root, 0);
    static const char *const roles[] = {"prefill", "decode", "union", "encode"};
    struct nm_config *first = NULL;
    for (size_t r = 0; r < 4; r++) {
        for (int sc = 0; sc < 2; sc++) {
            struct nm_config_opts o = {0};
            o.config_path = "/nonexistent/user_config.json";
            o.role = roles[r];
            o.env = nm_env_from_array;
            o.env_ud = sc ? env_sc : env_plain;
            o.motor_bin = "/usr/bin/motor";
            struct cfg_errors e;
            cfg_errors_init(&e, "user_config");
            struct nm_config *c = nm_config_from_json(root, &o, &e);
            if (!c) {
                if (cfg_errors_count(&e) == 0)
                    abort();
            } else {
                if (cfg_errors_count(&e) != 0)
                    abort();
                check_ports(c);
                json_t *eff = nm_config_to_json(c);
                char *text = json_dumps(eff, JSON_COMPACT);
                if (!text)
                    abort();
                free(text);
                json_decref(eff);
                build_cmds(c);
                if (first) {
                    free(nm_config_diff(first, c));
                    /* restart keys are a subset of the changed keys: none without a change */
                    char *all = cfgtab_diff(&nm_config_cfgtab, first, c, 0, 0);
                    char *restart = nm_config_restart_keys(first, c);
                    if (restart && !all)
                        abort();
                    free(all);
                    free(restart);
                    nm_config_free(c);
                } else {
                    first = c;
                }
            }
            cfg_errors_release(&e);
        }
    }
    nm_config_free(first);
    json_decref(root);
    return 0;
}
