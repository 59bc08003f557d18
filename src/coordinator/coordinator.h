/* coordinator — the gateway's public face: its subcommand. The only header of
 * src/coordinator that code outside the folder may include (the build enforces it);
 * everything else talks to a coordinator over HTTP through src/wire. */
#ifndef MOTOR_COORDINATOR_H
#define MOTOR_COORDINATOR_H

/* `motor coordinator [options]`; returns the process exit status. */
int coordinator_main(int argc, char **argv);

#endif
