/* The subcommands of the one `motor` binary. src/cli is the only place that knows them
 * all; each entry point takes the arguments after its own name (argv[0] = subcommand)
 * and returns the process exit status. */
#ifndef MOTOR_CLI_COMMANDS_H
#define MOTOR_CLI_COMMANDS_H

int sim_main(int argc, char **argv);
int coordinator_main(int argc, char **argv);
int register_main(int argc, char **argv);
int node_manager_main(int argc, char **argv);
int pool_main(int argc, char **argv);
int up_main(int argc, char **argv);
int status_main(int argc, char **argv);
int controller_main(int argc, char **argv);

#endif
