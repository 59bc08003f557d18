"""supervisors — Motor's node manager and the peers, each supervising the same N commands.

A Supervisor is built with a Session (cleanup) and a list of services (argv lists, one
process each), started with start(), and answers:
  * pids()            the supervisor's own processes (for the memory rows): the node
                      manager; supervisord; s6-svscan + every s6-supervise; runsvdir +
                      every runsv;
  * wait_services()   the pid of every service once each runs its final program.
Settings for immediate restart (the death → replacement row):
  * Motor: engine_type "cmd" with the same argv template, restart_policy "local",
    standalone, restart_backoff_initial_sec = restart_backoff_max_sec = the smallest
    accepted value (tuned) or the shipped defaults (default), restart_start_limit 0.
  * s6: a `run` script `#!/bin/sh` + `exec argv` per service under s6-svscan. s6-supervise
    waits 1 s before restarting a service that lived less than 1 s; not configurable,
    so the kill loop only kills processes older than that (for every supervisor alike).
  * runit: the same run scripts under runsvdir (runsv also throttles to one start per
    second, same treatment).
  * supervisord: one [program] per service, autorestart=true, startsecs=0, unix socket
    and logs in the temp dir, nodaemon.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from typing import Optional

from . import common as C


def versions(motor: str) -> dict:
    out = {}
    try:
        out["motor"] = subprocess.run([motor, "--version"], capture_output=True, text=True,
                                      timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        out["motor"] = None
    for pkg in ("s6", "runit", "supervisor", "nginx", "wrk", "monit"):
        try:
            r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                               text=True, timeout=5)
            out[pkg] = r.stdout.strip() or None
        except (OSError, subprocess.TimeoutExpired):
            out[pkg] = None
    return out


class Supervisor:
    name = "?"
    label = "?"

    def __init__(self, sess: C.Session, services: list[list[str]]):
        self.sess = sess
        self.services = services
        self.cmdlines = [sess.track_cmdline(a) for a in services]
        self.proc: Optional[subprocess.Popen] = None

    @staticmethod
    def available() -> Optional[str]:
        """None when usable, else why not."""
        return None

    def start(self) -> None:
        raise NotImplementedError

    def pids(self) -> list[int]:
        assert self.proc is not None
        return [self.proc.pid]

    def wait_services(self, timeout: float = 30.0) -> dict[bytes, int]:
        """cmdline -> pid for every service, once all run their final program."""
        want = set(self.cmdlines)
        last: dict = {}

        def scan():
            found: dict[bytes, int] = {}
            dup = None
            for pid in C.all_pids():
                cl = C.read_cmdline(pid)
                if cl in want and C.pid_alive(pid):
                    if cl in found:  # two of one service: not settled yet
                        dup = cl
                    found[cl] = pid
            last["found"], last["dup"] = found, dup
            return found if len(found) == len(want) and dup is None else None
        try:
            return C.wait_for(scan, timeout, f"{len(want)} services under {self.name}", 0.05,
                              self.proc)
        except TimeoutError as e:
            found = last.get("found", {})
            missing = [c for c in self.cmdlines if c not in found]
            detail = f"{len(found)} running"
            if missing:
                argv = missing[0].replace(b"\0", b" ").decode(errors="replace").strip()
                detail += f", e.g. not running: {argv}"
            if last.get("dup"):
                detail += ", two processes of one service"
            raise TimeoutError(f"{e} ({detail}); log tail: {self.log_tail()}") from None

    def log_tail(self, n: int = 3) -> str:
        import glob
        lines: list[str] = []
        for f in sorted(glob.glob(self.sess.path("*.log")) + glob.glob(self.sess.path("*.out"))):
            try:
                with open(f, errors="replace") as fh:
                    lines += fh.read().splitlines()[-n:]
            except OSError:
                pass
        return " / ".join(lines[-n:]) or "(empty)"


def _run_script(argv: list[str]) -> str:
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in argv) + " 2>&1\n"


class S6(Supervisor):
    name = "s6"
    label = "s6-supervise"

    @staticmethod
    def available():
        return None if C.which("s6-svscan") and C.which("s6-svscanctl") else \
            "s6-svscan not installed (apt-get install s6)"

    def start(self):
        self.scan = self.sess.path("s6scan")
        os.makedirs(self.scan)
        for i, argv in enumerate(self.services):
            d = os.path.join(self.scan, f"svc{i}")
            os.makedirs(d)
            with open(os.path.join(d, "run"), "w") as f:
                f.write(_run_script(argv))
            os.chmod(os.path.join(d, "run"), 0o755)
        scan = self.scan

        def stop():
            subprocess.run([C.which("s6-svscanctl"), "-t", scan], timeout=5,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = self.sess.start([C.which("s6-svscan"), scan], "s6-svscan.log", stop=stop)

    def pids(self):
        sup = [p for p in C.children(self.proc.pid)
               if (C.read_cmdline(p) or b"").startswith(b"s6-supervise\0")]
        return [self.proc.pid] + sup


class Runit(Supervisor):
    name = "runit"
    label = "runsv"

    @staticmethod
    def available():
        return None if C.which("runsvdir") and C.which("runsv") else \
            "runsvdir not installed (apt-get install runit)"

    def start(self):
        self.scan = self.sess.path("runit")
        os.makedirs(self.scan)
        for i, argv in enumerate(self.services):
            d = os.path.join(self.scan, f"svc{i}")
            os.makedirs(d)
            with open(os.path.join(d, "run"), "w") as f:
                f.write(_run_script(argv))
            os.chmod(os.path.join(d, "run"), 0o755)
        proc_holder = {}

        def stop():
            # runsvdir: SIGHUP = TERM every runsv (which stops its service), then exit
            os.kill(proc_holder["p"].pid, signal.SIGHUP)
        self.proc = self.sess.start([C.which("runsvdir"), self.scan], "runsvdir.log", stop=stop)
        proc_holder["p"] = self.proc

    def pids(self):
        sup = [p for p in C.children(self.proc.pid)
               if (C.read_cmdline(p) or b"").startswith(b"runsv\0")]
        return [self.proc.pid] + sup


class Supervisord(Supervisor):
    name = "supervisord"
    label = "supervisord"
    # more sections appended to the generated supervisord.conf (e.g. an [eventlistener:x]
    # in bench/nm_death_latency.py); set on the instance before start()
    extra_conf: list[str] = []

    @staticmethod
    def available():
        return None if C.which("supervisord") else \
            "supervisord not installed (apt-get install supervisor)"

    def start(self):
        t = self.sess.tmp
        lines = [
            "[unix_http_server]", f"file={t}/supervisor.sock", "",
            "[supervisord]", f"logfile={t}/supervisord.log", f"pidfile={t}/supervisord.pid",
            f"childlogdir={t}", "nodaemon=true", "loglevel=warn", "", "[rpcinterface:supervisor]",
            "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
            "", "[supervisorctl]", f"serverurl=unix://{t}/supervisor.sock", ""]
        for i, argv in enumerate(self.services):
            lines += [f"[program:svc{i}]",
                      "command=" + " ".join(shlex.quote(a) for a in argv),
                      "autostart=true", "autorestart=true", "startsecs=0",
                      "startretries=1000000", "stopasgroup=true", "killasgroup=true",
                      "stopwaitsecs=2", "redirect_stderr=true",
                      f"stdout_logfile={t}/svc{i}.log", "stdout_logfile_maxbytes=1MB",
                      "stdout_logfile_backups=0", ""]
        lines += list(self.extra_conf)
        conf = self.sess.path("supervisord.conf")
        with open(conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        holder = {}
        sess = self.sess

        def stop():
            # supervisord's orderly stop takes ~0.5 s per program (its 1 s loop tick);
            # nothing is measured here, so: SIGKILL it, then its programs (each in a
            # process group of its own)
            os.kill(holder["p"].pid, signal.SIGKILL)
            holder["p"].wait(5)
            sess.sweep()
        self.proc = self.sess.start([C.which("supervisord"), "-n", "-c", conf],
                                    "supervisord.out", stop=stop)
        holder["p"] = self.proc


class MotorNM(Supervisor):
    """`motor node-manager`, standalone, local restart policy, engine_type cmd with the
    services' argv as the template ({port} placeholder: service i gets base_port + 2i)."""
    name = "motor"
    label = "Motor node manager"

    def __init__(self, sess, services, template: list[str], base_port: int, motor: str,
                 tuned: bool = True, backoff_sec: Optional[float] = None,
                 extra: Optional[dict] = None):
        super().__init__(sess, services)
        self.template = template
        self.base_port = base_port
        self.motor = motor
        self.tuned = tuned
        self.backoff_sec = backoff_sec
        self.extra = extra or {}
        self.api_port: Optional[int] = None

    @staticmethod
    def available_in(motor: str) -> Optional[str]:
        if not os.access(motor, os.X_OK):
            return f"motor binary not found: {motor} (make build)"
        if "node-manager" not in C.motor_commands(motor):
            return "`motor node-manager` not in this build yet"
        return None

    def config(self) -> dict:
        nm = {
            "api_config": {"pod_ip": "127.0.0.1", "node_manager_port": 1026},
            "endpoint_config": {"base_port": self.base_port},
            "basic_config": {"job_name": "bench"},
            "restart_policy": "local",
            "standalone": True,
            "stop_grace_seconds": 1,
            "port_allocator_config": {"enable": False},
        }
        if self.tuned:
            nm["restart_backoff_initial_sec"] = self.backoff_sec
            nm["restart_backoff_max_sec"] = self.backoff_sec
            nm["restart_start_limit"] = 0
        nm.update(self.extra)
        return {"motor_engine_union_config": {
            "engine_type": "cmd",
            "engine_command": self.template,
            "motor_nodemanger_config": nm,
            "engine_config": {"model": "bench", "data_parallel_size": len(self.services)},
        }}

    def write_config(self) -> str:
        path = self.sess.path("nm.json")
        with open(path, "w") as f:
            json.dump(self.config(), f, indent=1)
        return path

    def check_config(self) -> Optional[str]:
        """None when the node manager accepts the config, else its error text."""
        path = self.write_config()
        r = subprocess.run([self.motor, "node-manager", "--check-config", "--config", path,
                            "--role", "union"], capture_output=True, text=True, timeout=10)
        return None if r.returncode == 0 else (r.stderr.strip() or r.stdout.strip())

    def start(self):
        path = self.write_config()
        self.log = self.sess.path("nm.log")
        self.proc = self.sess.start(
            [self.motor, "node-manager", "--config", path, "--role", "union", "--port", "0",
             "--state-file", "", "--log-level", "warn" if self.tuned else "info"],
            "nm.log")

    def wait_api(self, timeout: float = 15) -> int:
        # nm_listening is logged at info; the bench runs the NM at warn, so read the
        # port from /proc instead when the event is absent
        def port():
            ev = C.log_event(self.log, "nm_listening")
            if ev:
                return ev["port"]
            return _listen_port(self.proc.pid)
        self.api_port = C.wait_for(port, timeout, "node manager API port", 0.02, self.proc)
        return self.api_port


def _listen_port(pid: int) -> Optional[int]:
    """A TCP port the process listens on (first found), from /proc/net/tcp + its fds."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return None
    for tab in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(tab) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and parts[9] in inodes:
                        return int(parts[1].split(":")[1], 16)
        except OSError:
            continue
    return None


PEERS = {"s6": S6, "runit": Runit, "supervisord": Supervisord}


def stop_quietly(sess: C.Session) -> list[int]:
    """Session.close() with a note when something had to be swept."""
    swept = sess.close()
    if swept:
        C.log(f"  swept {len(swept)} leftover process(es) after an orderly stop")
    return swept


def settle(seconds: float) -> None:
    time.sleep(seconds)
