/* nm_check — `motor node-manager --check-config`: load the configuration exactly as the
 * daemon would and print the effective, derived configuration. */
#include "nodemgr/nm_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: motor node-manager --check-config [--config PATH] [--role ROLE]\n"
          "  Loads the configuration (PATH, else $USER_CONFIG_PATH, else $CONFIG_PATH) for\n"
          "  ROLE (else $ROLE), prints the effective configuration as JSON and exits 0,\n"
          "  or prints every error and exits 1.\n",
          f);
}

/* Value of "--name VALUE" or "--name=VALUE" at argv[*i]; advances *i. NULL if not it. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = true;
        return NULL;
    }
    return argv[++*i];
}

int nm_check_config_main(int argc, char **argv)
{
    struct nm_config_opts opts = {0};
    for (int i = 1; i < argc; i++) {
        bool missing = false;
        const char *v;
        if (strcmp(argv[i], "--check-config") == 0)
            continue;
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if ((v = opt_value(argc, argv, &i, "--config", &missing))) {
            opts.config_path = v;
            continue;
        }
        if ((v = opt_value(argc, argv, &i, "--role", &missing))) {
            opts.role = v;
            continue;
        }
        fprintf(stderr, missing ? "option %s needs a value\n" : "unknown argument: %s\n", argv[i]);
        usage(stderr);
        return 2;
    }
    struct cfg_errors errs;
    cfg_errors_init(&errs, "");
    struct nm_config *c = nm_config_load(&opts, &errs);
    if (!c) {
        fprintf(stderr, "invalid node manager configuration (%d error%s):\n%s",
                cfg_errors_count(&errs), cfg_errors_count(&errs) == 1 ? "" : "s",
                cfg_errors_text(&errs));
        cfg_errors_release(&errs);
        return 1;
    }
    cfg_errors_release(&errs);
    json_t *j = nm_config_to_json(c);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(j);
    nm_config_free(c);
    if (!text) {
        fputs("out of memory\n", stderr);
        return 1;
    }
    fputs(text, stdout);
    fputc('\n', stdout);
    free(text);
    return fflush(stdout) == 0 ? 0 : 1;
}
