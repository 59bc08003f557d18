/* up — `motor up`: a whole fleet on one host from one upstream user_config.json.
 *
 * Starts, on 127.0.0.1 and in this order, the coordinator, the controller (SQLite store
 * in the state directory) and one node manager per pod (env ROLE, INDEX, JOB_NAME,
 * POD_IP=127.0.0.1 as upstream's deployer sets them; single-container port and device
 * offsets). The node managers register, the controller sends them their start commands,
 * they launch the engines the file names (the simulator in the bundled examples) and the
 * controller pushes the routable instances to the coordinator. `motor up` prints the
 * OpenAI base URL once every instance is routable and the coordinator lists the model.
 *
 * Supervision: every child runs in its own process group (src/common/proc), its output
 * in <state>/logs/<name>.log. A child that exits unexpectedly is restarted with
 * exponential backoff (1 s doubling to 30 s; back to 1 s after 60 s of uptime), as a
 * Kubernetes pod would be — a node manager exits 255 precisely to be restarted. A child
 * that fails its very first start within 5 s with status 1 or 2 (invalid configuration,
 * port conflict, bad flag) stops the whole fleet instead: restarting cannot fix that.
 *
 * Stop (SIGINT, SIGTERM): coordinator, then controller, then the node managers (which
 * stop their engines), each with a grace period then SIGKILL of its process group; then
 * every orphan that reached us (we are a child subreaper) is killed and reaped. Exit 0.
 * A second signal kills everything at once (exit 130). Fatal startup errors exit 1,
 * usage errors 2.
 *
 * On a terminal a live view (processes, instances, endpoints, pools, requests/s) is
 * redrawn every second and motor up's own log goes to <state>/up.log; otherwise the log
 * (JSON lines) goes to stderr and the URL block to stdout. Main thread only. */
#ifndef MOTOR_UP_H
#define MOTOR_UP_H

int up_main(int argc, char **argv);

#endif
