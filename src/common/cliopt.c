/* cliopt — see cliopt.h. getopt_long does the scanning; the table gives each option a
 * typed destination, so a subcommand's parser is data instead of a switch. */
#include "common/cliopt.h"

#include "common/cfg.h"
#include "common/log.h"
#include "common/util.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define CLIOPT_MAX 32
#define CLIOPT_HELP 0x100 /* getopt value of --help (beyond any char) */
#define CLIOPT_BASE 0x200 /* getopt value of table entry i is CLIOPT_BASE + i */

static void range_message(const char *prog, const struct cliopt *o)
{
    if (o->must)
        fprintf(stderr, "%s: --%s must be %s\n", prog, o->name, o->must);
    else
        fprintf(stderr, "%s: --%s must be a number in [%g, %g]\n", prog, o->name, o->min, o->max);
}

static int store(const char *prog, const struct cliopt *o, const char *arg)
{
    int rc = 0;
    switch (o->kind) {
    case CLIOPT_STRING:
        *(const char **)o->out = arg;
        break;
    case CLIOPT_FLAG:
        *(bool *)o->out = true;
        break;
    case CLIOPT_INT:
        rc = util_parse_int(arg, (int)o->min, (int)o->max, (int *)o->out);
        break;
    case CLIOPT_I64:
        rc = util_parse_i64(arg, (int64_t)o->min, (int64_t)o->max, (int64_t *)o->out);
        break;
    case CLIOPT_DOUBLE:
        rc = util_parse_double(arg, o->min, o->max, (double *)o->out);
        break;
    }
    if (rc < 0) {
        range_message(prog, o);
        return 2;
    }
    return 0;
}

int cliopt_parse(const char *prog, int argc, char **argv, const struct cliopt *opts,
                 void (*usage)(FILE *out))
{
    struct option longs[CLIOPT_MAX + 2];
    char shorts[2 * CLIOPT_MAX + 4] = "h";
    size_t n = 0, ns = 1;
    for (; opts[n].name; n++) {
        if (n >= CLIOPT_MAX)
            abort(); /* a programming error, caught by any test of the subcommand */
        bool takes_arg = opts[n].kind != CLIOPT_FLAG;
        longs[n] = (struct option){opts[n].name, takes_arg ? required_argument : no_argument,
                                   NULL, CLIOPT_BASE + (int)n};
        if (opts[n].short_name) {
            shorts[ns++] = opts[n].short_name;
            if (takes_arg)
                shorts[ns++] = ':';
        }
    }
    shorts[ns] = '\0';
    longs[n] = (struct option){"help", no_argument, NULL, CLIOPT_HELP};
    longs[n + 1] = (struct option){NULL, 0, NULL, 0};

    optind = 1;
    opterr = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        if (ch == 'h' || ch == CLIOPT_HELP) {
            usage(stdout);
            return 1;
        }
        const struct cliopt *o = NULL;
        if (ch >= CLIOPT_BASE && ch < CLIOPT_BASE + (int)n) {
            o = &opts[ch - CLIOPT_BASE];
        } else {
            for (size_t i = 0; i < n && !o; i++)
                if (opts[i].short_name && opts[i].short_name == ch)
                    o = &opts[i];
        }
        if (!o) { /* getopt already said what was wrong */
            usage(stderr);
            return 2;
        }
        if (store(prog, o, optarg) != 0)
            return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return 2;
    }
    return 0;
}

const char *cliopt_config_path(const char *flag_value)
{
    if (flag_value && *flag_value)
        return flag_value;
    const char *env = getenv("USER_CONFIG_PATH");
    if (env && *env)
        return env;
    env = getenv("CONFIG_PATH");
    if (env && *env)
        return env;
    return NULL;
}

int cliopt_log_level(const char *prog, const char *value)
{
    if (!value)
        return 0;
    enum log_level lv;
    if (log_parse_level(value, &lv) < 0) {
        fprintf(stderr, "%s: invalid --log-level '%s'\n", prog, value);
        return 2;
    }
    log_set_level(lv);
    return 0;
}

int cliopt_load_config(const char *prog, const char *path, const char *section,
                       cliopt_apply_fn apply, void *cfg)
{
    struct cfg_errors e;
    cfg_errors_init(&e, section);
    if (path) {
        json_t *root = cfg_load_file(path, &e);
        if (root) {
            apply(cfg, root, &e);
            json_decref(root);
        }
    }
    int n = cfg_errors_count(&e), rc = 0;
    if (n) {
        log_error("config_invalid", LF_STR("path", path), LF_STR("errors", cfg_errors_text(&e)));
        fprintf(stderr, "%s: invalid configuration %s (%d error%s):\n%s", prog, path ? path : "",
                n, n == 1 ? "" : "s", cfg_errors_text(&e));
        rc = -EINVAL;
    }
    cfg_errors_release(&e);
    return rc;
}
