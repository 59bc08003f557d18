/* controller — the controller's public face: its subcommand. The only header of
 * src/controller that code outside the folder may include (the build enforces it);
 * everything else talks to a controller over HTTP through src/wire. */
#ifndef MOTOR_CONTROLLER_H
#define MOTOR_CONTROLLER_H

/* `motor controller [options]`; returns the process exit status. */
int controller_main(int argc, char **argv);

#endif
