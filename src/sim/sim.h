/* sim — the engine simulator's public face: its subcommand. The simulator is an engine,
 * not part of the control plane: it uses src/common and src/wire only, and nothing but
 * the CLI includes this header. */
#ifndef MOTOR_SIM_H
#define MOTOR_SIM_H

/* `motor engine-sim [options]`; returns the process exit status. */
int sim_main(int argc, char **argv);

#endif
