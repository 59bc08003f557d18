/* Placeholder until the simulator lands (issue: foundation). */
#include "cli/commands.h"
#include <stdio.h>
int sim_main(int argc, char **argv)
{
    fprintf(stderr, "engine-sim: not built yet\n");
    return 1;
}
