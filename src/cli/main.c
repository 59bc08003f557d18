/* motor — one binary, many roles. Thin dispatch only: every subcommand lives in its
 * own module and is reached through the table below. */
#include "cli/commands.h"
#include "controller/controller.h"
#include "coordinator/coordinator.h"
#include "nodemgr/nodemgr.h"
#include "pool/pool.h"
#include "sim/sim.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>

struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    /* The daemon's process title (upstream's setproctitle: "NodeManager", ...), set as the
     * kernel's comm (ps -o comm, top, /proc/<pid>/comm; 15 bytes). The command line is
     * left as it is: tooling that finds daemons by their arguments keeps working. */
    const char *title;
};

static const struct subcommand subcommands[] = {
    {"engine-sim", sim_main, "OpenAI-compatible engine simulator (vLLM surface, fault injection)",
     NULL},
    {"coordinator", coordinator_main, "OpenAI-compatible gateway (PD routing, balancing, breakers)",
     "Coordinator"},
    {"register", register_main, "register engines with a coordinator (standalone deployment)",
     NULL},
    {"node-manager", node_manager_main,
     "engine supervisor of one pod/host (register, launch, probe, relaunch)", "NodeManager"},
    {"controller", controller_main,
     "the fleet's brain: assembly, health, fault tolerance, coordinator push", "Controller"},
    {"up", up_main, "the whole fleet on this host from one user_config.json (make run)", NULL},
    {"status", status_main,
     "instances, endpoints, pools and breakers of a fleet; exit 1 if unhealthy", NULL},
    {"worker-pool", pool_main,
     "on-demand worker processes from manifests (the node manager's pool, alone)", "WorkerPool"},
};

static void usage(FILE *out)
{
    fprintf(out, "motor %s — orchestration for LLM inference fleets\n\n"
                 "usage: motor <command> [options]\n       motor --version\n\ncommands:\n",
            MOTOR_VERSION);
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++)
        fprintf(out, "  %-14s %s\n", subcommands[i].name, subcommands[i].summary);
    fprintf(out, "\n'motor <command> --help' shows the options of a command.\n");
}

int main(int argc, char **argv)
{
    /* A peer closing a socket must be an EPIPE, never a dead daemon. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
        printf("motor %s\n", MOTOR_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(subcommands) / sizeof(subcommands[0]); i++) {
        if (strcmp(cmd, subcommands[i].name) == 0) {
            if (subcommands[i].title)
                prctl(PR_SET_NAME, subcommands[i].title);
            return subcommands[i].run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "motor: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
