/* The CLI's own subcommands (the daemons' *_main live in their public headers). src/cli
 * is the only place that knows every subcommand. */
#ifndef MOTOR_CLI_COMMANDS_H
#define MOTOR_CLI_COMMANDS_H

int register_main(int argc, char **argv);
int up_main(int argc, char **argv);
int status_main(int argc, char **argv);

#endif
