"""chaos_fleet — the fleet under test, its supervisor, and the invariant checks.

A fleet is three pods — prefill (DP 1), decode (DP 1) and union (DP 2, one node manager
hosting both ranks) — of simulated engines (``engine_type: sim``, each engine forks one
``--workers`` child), plus, by mode:

* ``controller``: ``motor controller`` (SQLite store) + ``motor coordinator``; the node
  managers register with the controller (restart policy ``controller``), which starts
  the engines, relaunches them and pushes the routable set to the coordinator;
* ``controller`` with ``coordinators=2`` (the ``ha`` mode of chaos.py): the etcd store,
  and two coordinators as master and standby on etcd (standby_config) behind a stand-in
  for a Kubernetes Service (chaos_service.py: new connections go to the one whose
  /readiness answers 200) — the controller pushes to, and the client calls, the Service;
* ``standalone``: no controller; the node managers launch their engines at boot and
  restart them themselves (``restart_policy: local``); the instances are registered with
  the coordinator by ``motor register set`` — again after every coordinator restart, as
  an operator's hook would.

Nothing supervises daemons on a dev box, so the ``Supervisor`` thread plays Kubernetes:
a node manager, controller or coordinator that exits is started again (same command,
same ports, same state files) after a short delay, or after the delay a fault chose. An
exit nobody caused is recorded: a node manager's 255 is its documented "restart this
pod" (allowed), anything else is a crash.

Every process started here carries ``MOTOR_CHAOS_RUN=<run id>`` in its environment
(engines and workers inherit it), which is how the /proc checks find exactly this run's
processes among everyone else's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
import motorlib  # noqa: E402

MODEL = "chaos-model"
MARK = "MOTOR_CHAOS_RUN"

# Set while a fleet runs with every listener on TLS (chaos.py --tls: the up fleet under
# `motor up --tls`): the fleet's URLs turn https:// and call() presents this context (the
# fleet's CA and the client certificate motor up made). None = plain HTTP.
TLS_CTX: Optional[ssl.SSLContext] = None


def scheme() -> str:
    return "https" if TLS_CTX is not None else "http"


# ---------------------------------------------------------------------------------------
# HTTP


def call(method: str, url: str, body: Any = None, timeout: float = 2.0) -> tuple[int, Any]:
    """(status, parsed JSON | text); (0, error text) on a transport failure."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        ctx = TLS_CTX if url.startswith("https://") else None
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            raw, st = r.read(), r.status
    except urllib.error.HTTPError as e:
        with e:
            try:
                raw = e.read()
            except OSError:
                raw = b""
            st = e.code
    except (OSError, urllib.error.URLError, ValueError) as e:
        return 0, repr(e)
    except Exception as e:  # http.client.RemoteDisconnected and friends
        return 0, repr(e)
    try:
        return st, json.loads(raw) if raw else None
    except ValueError:
        return st, raw.decode(errors="replace")


# ---------------------------------------------------------------------------------------
# /proc


def proc_stat(pid: int) -> Optional[tuple[str, int]]:
    """(state, ppid) or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2:].split()
    return rest[0], int(rest[1])


def marked_pids(run_id: str) -> list[int]:
    """Every process whose environment carries this run's marker."""
    needle = f"{MARK}={run_id}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(name))
    return sorted(out)


def zombies_of(parents: set[int]) -> list[tuple[int, int]]:
    """(pid, ppid) of every zombie whose parent is in `parents`. A zombie has no
    environment left to carry the run marker, so it is found through its parent."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = proc_stat(int(name))
        if st and st[0] == "Z" and st[1] in parents:
            out.append((int(name), st[1]))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def listen_inodes(ns_pid: int, port: int) -> set[int]:
    """Inodes of the LISTEN sockets on `port` in the network namespace of ns_pid."""
    out = set()
    for fam in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{ns_pid}/net/{fam}") as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10:
                continue
            local, state, inode = parts[1], parts[3], int(parts[9])
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                out.add(inode)
    return out


def socket_owners(inodes: set[int], pids: list[int]) -> set[int]:
    """Which of `pids` hold a file descriptor on one of the socket inodes."""
    want = {f"socket:[{i}]" for i in inodes}
    owners = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in want:
                    owners.add(pid)
                    break
            except OSError:
                continue
    return owners


# ---------------------------------------------------------------------------------------
# daemons


class Daemon:
    """One supervised process: how to start it, its current Proc, its history."""

    def __init__(self, fleet: "Fleet", name: str, kind: str, argv_fn: Callable[[], list[str]],
                 ready_event: Any, env: Optional[dict] = None,
                 post_start: Optional[Callable[["Daemon"], None]] = None):
        self.fleet = fleet
        self.name = name
        self.kind = kind  # controller | coordinator | nm
        self.argv_fn = argv_fn
        self.ready_event = ready_event
        self.env = dict(env or {})
        self.post_start = post_start
        self.proc: Optional[motorlib.Proc] = None
        self.procs: list[motorlib.Proc] = []  # every incarnation (logs are scanned at the end)
        self.hold_until = 0.0  # not restarted before this (a fault chose the delay)
        self.expect_death = False  # we killed it: its exit is not a crash
        self.stopped = False  # SIGSTOPped by a fault
        # monotonic: when the current process became ready (a controller: loaded as the
        # leader, `controller_ready`), or its last SIGCONT; inf while not ready yet
        self.since = 0.0
        self.restarts = 0
        self.exits: list[dict] = []
        self.lock = threading.RLock()

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def alive(self) -> bool:
        return bool(self.proc and self.proc.alive())

    def wait_ready(self, proc: motorlib.Proc, timeout: float = 30.0) -> None:
        """ready_event: a log event name, or a callable polled until it is true."""
        if callable(self.ready_event):
            def ok() -> bool:
                if not proc.alive():
                    raise motorlib.ProcessExited(f"{self.name} exited\n{proc.tail()}")
                return bool(self.ready_event())
            motorlib.wait_for(ok, timeout, interval=0.1, what=f"{self.name} ready")
        else:
            proc.wait_event(self.ready_event, timeout=timeout)
        if proc is self.proc:
            self.since = time.monotonic()

    def start(self, wait: bool = True, timeout: float = 30.0) -> None:
        with self.lock:
            env = {MARK: self.fleet.run_id, **self.env}
            self.proc = motorlib.Proc(self.argv_fn(), name=self.name,
                                      log_dir=str(self.fleet.log_dir), extra_env=env)
            self.procs.append(self.proc)
            self.expect_death = False
            self.stopped = False
            self.since = float("inf")
        if wait:
            self.wait_ready(self.proc, timeout)
            if self.post_start:
                self.post_start(self)

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.alive():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, hold: float) -> int:
        """SIGKILL; the supervisor restarts it `hold` seconds from now. The pid killed."""
        with self.lock:
            self.expect_death = True
            self.hold_until = time.monotonic() + hold
            pid = self.pid
            self.signal(signal.SIGKILL)
            return pid

    def stop_gracefully(self, timeout: float = 15.0) -> Optional[int]:
        with self.lock:
            self.expect_death = True
            self.hold_until = float("inf")
        if not self.proc:
            return None
        if self.stopped:
            self.signal(signal.SIGCONT)
        self.proc.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except TimeoutError:
            self.proc.kill()
            try:
                return self.proc.wait(5)
            except TimeoutError:
                return None


class Supervisor(threading.Thread):
    """Restarts daemons that exited (Kubernetes' job on a real cluster)."""

    def __init__(self, fleet: "Fleet", delay: float = 0.3):
        super().__init__(daemon=True, name="chaos-supervisor")
        self.fleet = fleet
        self.delay = delay
        self.stop_ev = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop_ev.wait(0.05):
            for d in list(self.fleet.daemons):
                try:
                    self._tend(d)
                except Exception as e:  # keep supervising; report at the end
                    self.errors.append(f"{d.name}: {e!r}")

    def _tend(self, d: Daemon) -> None:
        with d.lock:
            if d.proc is None or d.proc.alive():
                return
            if not getattr(d, "_exit_seen", None) is d.proc:
                d._exit_seen = d.proc  # type: ignore[attr-defined]
                rc = d.proc.returncode
                ev = {"at": time.monotonic(), "rc": rc, "expected": d.expect_death,
                      "pid": d.proc.pid}
                d.exits.append(ev)
                if not d.expect_death:
                    self.fleet.on_unexpected_exit(d, rc)
                if d.hold_until < time.monotonic() + self.delay:
                    d.hold_until = time.monotonic() + self.delay
            if time.monotonic() < d.hold_until:
                return
            d.restarts += 1
            d.start(wait=False)
        threading.Thread(target=self._after_restart, args=(d, d.proc), daemon=True).start()

    def _after_restart(self, d: Daemon, proc: motorlib.Proc) -> None:
        try:
            d.wait_ready(proc, 30)
        except Exception:
            return  # it died again: the next round of tending sees it
        if d.post_start and d.proc is proc:
            try:
                d.post_start(d)
            except Exception as e:
                self.errors.append(f"{d.name} post-start: {e!r}")


# ---------------------------------------------------------------------------------------
# the fleet


class Pod:
    def __init__(self, g: int, role: str, dp: int, job: str, local: int = 0, name: str = ""):
        self.g = g
        self.role = role
        self.dp = dp  # the instance's data_parallel_size
        self.local = local or dp  # the DP ranks this pod hosts (its device_num)
        self.name = name or role
        self.job = job
        # multi-pod instances: since when the driver keeps this pod's node manager silent
        # (SIGSTOP, SIGKILL, partition), None when it is not
        self.down_since: Optional[float] = None
        self.ip = ""
        self.nm_port = 0
        self.base_port = 0
        self.rpc_port = 0
        self.cfg_path = ""
        self.state_path = ""
        self.daemon: Optional[Daemon] = None

    @property
    def url(self) -> str:
        return f"{scheme()}://{self.ip}:{self.nm_port}"

    def engine_ports(self) -> list[int]:
        return [self.base_port + 2 * i for i in range(self.local)]

    @property
    def multi(self) -> bool:
        return self.local < self.dp

    def addrs(self) -> list[str]:
        return [f"{self.ip}:{p}" for p in self.engine_ports()]


class Fleet:
    # (role, data_parallel_size, job, ranks on this pod, name). chaos-ep is a multi-pod
    # instance (issue 15): its two DP ranks on two node managers, one rank each, as the
    # large MoE/EP instances Motor exists for (DP ranks across pods, one node manager per
    # pod). Controller fleets only: without a controller nothing assembles it.
    PODS = [("prefill", 1, "chaos-prefill", 1, "prefill"),
            ("decode", 1, "chaos-decode", 1, "decode"),
            ("union", 2, "chaos-union", 2, "union"), ("union", 2, "chaos-ep", 1, "ep0"),
            ("union", 2, "chaos-ep", 1, "ep1")]

    def __init__(self, mode: str, run_id: str, run_dir: Path, net, workers: int = 1,
                 log: Callable[..., None] = print, store: str = "sqlite",
                 coordinators: int = 1, etcd_members: int = 1):
        self.mode = mode
        self.store = store  # controller mode: sqlite | etcd
        self.n_coordinators = coordinators  # 2: master/standby on etcd behind a Service
        self.coordinators: list[Daemon] = []
        self.coord_ports: list[tuple[int, int]] = []  # (infer, mgmt) of each
        self.services: list[Any] = []
        self.etcd: Optional[Daemon] = None  # the first member
        self.etcds: list[Daemon] = []  # every member (3: the etcd3 fleet)
        self.etcd_urls: list[str] = []
        self.etcd_members = etcd_members
        self.etcd_url = ""
        self.run_id = run_id
        self.dir = run_dir / (mode if store == "sqlite" else
                              f"{mode}-etcd3" if etcd_members > 1 else
                              f"{mode}-{store}" if coordinators == 1 else f"{mode}-ha")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.dir / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.net = net
        self.workers = workers
        self.log = log
        self.bin = motorlib.motor_bin()
        self.pods = [Pod(g, r, dp, job, local, name)
                     for g, (r, dp, job, local, name) in enumerate(self.PODS)
                     if mode == "controller" or local == dp]
        self.daemons: list[Daemon] = []
        self.controller: Optional[Daemon] = None
        self.coordinator: Optional[Daemon] = None
        self.oracle: Optional[motorlib.Proc] = None
        self.supervisor: Optional[Supervisor] = None
        self.crashes: list[dict] = []
        self.suicides: list[dict] = []
        self.leadership_losses: list[dict] = []
        self.zombie_seen: dict[int, float] = {}
        self.ctl_port = 0
        self.coord_port = 0
        self.coord_mgmt = 0

    # -- configuration ------------------------------------------------------------------------

    def _controller_cfg(self) -> str:
        cfg = {
            "motor_controller_config": {
                "api_config": {"controller_api_host": self.net.controller_host,
                               "controller_api_port": self.ctl_port},
                "instance_config": {
                    "instance_assemble_timeout": 30, "instance_assembler_check_interval": 0.2,
                    "instance_assembler_cmd_send_interval": 0.5,
                    "instance_manager_check_interval": 0.2, "instance_heartbeat_timeout": 3,
                    "instance_heartbeat_timeout_inactive": 8, "start_cmd_timeout": 2,
                    "nm_probe_timeout": 1},
                "event_config": {"coordinator_heartbeat_interval": 0.5,
                                 "coordinator_set_sync_interval": 3,
                                 "coordinator_request_timeout": 2},
                "fault_tolerance_config": {
                    "enable_fault_tolerance": True, "strategy_center_check_interval": 0.2,
                    "fault_collection_timeout_seconds": 30, "enable_engine_relaunch": True,
                    "engine_relaunch_complete_timeout_sec": 20,
                    "engine_relaunch_poll_interval_sec": 0.3,
                    "engine_relaunch_dispatch_retries": 2,
                    "engine_relaunch_nm_unreachable_threshold": 3,
                    "engine_relaunch_dispatch_backoff_sec": 0.2},
                "store_config": ({"backend": "sqlite",
                                  "sqlite_path": str(self.dir / "controller.db")}
                                 if self.store == "sqlite" else
                                 {"backend": "etcd", "etcd_endpoints": list(self.etcd_urls),
                                  "etcd_prefix": f"/motor-chaos/{self.run_id}/",
                                  "etcd_lease_ttl": 4, "etcd_timeout": 2,
                                  "leader_retry_interval": 1}),
            },
            "motor_coordinator_config": {"api_config": {
                "coordinator_api_dns": "127.0.0.1",
                "coordinator_api_mgmt_port": self.coord_mgmt}},
        }
        path = self.dir / "controller.json"
        path.write_text(json.dumps(cfg, indent=1))
        return str(path)

    def _coordinator_cfg(self, k: int = 0) -> str:
        infer, mgmt = self.coord_ports[k] if self.coord_ports else (self.coord_port,
                                                                    self.coord_mgmt)
        cfg = {"motor_coordinator_config": {
            "api_config": {"coordinator_api_host": "127.0.0.1",
                           "coordinator_api_infer_port": infer,
                           "coordinator_api_mgmt_port": mgmt},
            "scheduler_config": {"scheduler_type": "load_balance"},
            "exception_config": {"max_retry": 3, "retry_delay": 0.05,
                                 "circuit_breaker_open_timeout": 1,
                                 "circuit_breaker_max_open_timeout": 4},
            "timeout_config": {"first_token_timeout": 6, "infer_timeout": 15,
                               "upstream_connect_timeout": 1, "graceful_shutdown_timeout": 2},
            # a hung or stopped engine's streams continue elsewhere after 2 s of silence
            "reschedule_config": {"enable": True, "inter_token_timeout": 2},
            "inference_workers_config": {"num_workers": 1}}}
        if self.n_coordinators > 1:
            # the lease like the controller's (4 s), renewed every second
            cfg["motor_coordinator_config"].update({
                "standby_config": {"enable_master_standby": True, "master_lock_ttl": 4,
                                   "master_standby_check_interval": 1,
                                   "master_lock_retry_interval": 1,
                                   "master_lock_max_failures": 3,
                                   "master_lock_key": f"/motor-chaos/{self.run_id}/coordinator"},
                "etcd_config": {"etcd_endpoints": [self.etcd_url], "etcd_timeout": 2}})
        path = self.dir / f"coordinator{k if k else ''}.json"
        path.write_text(json.dumps(cfg, indent=1))
        return str(path)

    def _nm_cfg(self, pod: Pod) -> str:
        ctl_host, ctl_port = self.net.controller_addr_for(pod.g, self.ctl_port or 1)
        ec: dict[str, Any] = {"model": MODEL, "data_parallel_size": pod.dp, "load_seconds": 0.3,
                              "tokens_per_second": 400, "ttft_ms": 5, "max_model_len": 4096}
        if self.workers:
            ec["workers"] = self.workers
        if pod.dp > 1:
            ec["data_parallel_rpc_port"] = pod.rpc_port  # one per job: the pods meet there
        standalone = self.mode == "standalone"
        block: dict[str, Any] = {
            "api_config": {"pod_ip": pod.ip, "node_manager_port": pod.nm_port},
            "endpoint_config": {"base_port": pod.base_port},
            "basic_config": {"job_name": pod.job, "heartbeat_interval_seconds": 0.5,
                             "daemon_loop_interval": 1, "device_num": pod.local},
            # suicide allowed (exit 255 = "restart this pod"; the supervisor does): also
            # standalone, where the local restart policy only restarts *dead* engines —
            # a hung engine or a DP survivor left unhealthy needs the pod restart
            "fault_tolerance_config": {"engine_restart_wait_timeout_sec": 60,
                                       "container_restart_managed": True},
            "stop_grace_seconds": 1,
        }
        if standalone:
            block.update({"standalone": True, "restart_policy": "local",
                          "restart_backoff_initial_sec": 0.2, "restart_backoff_max_sec": 2,
                          "restart_start_limit": 0})
        sec: dict[str, Any] = {
            "engine_type": "sim", "engine_config": ec,
            "health_check_config": {"health_collector_timeout": 1,
                                    "health_collector_timeout_retry_attempts": 2,
                                    "startup_timeout": 30},
            "motor_nodemanger_config": block,
        }
        if pod.role in ("prefill", "decode"):
            sec["dispatch_profile"] = "handoff"
        cfg = {"motor_controller_config": {
                   "api_config": {"controller_api_dns": ctl_host, "controller_api_port": ctl_port},
                   "fault_tolerance_config": {"enable_fault_tolerance": True,
                                              "enable_engine_relaunch": True}},
               f"motor_engine_{pod.role}_config": sec}
        path = self.dir / f"nm-{pod.name}.json"
        path.write_text(json.dumps(cfg, indent=1))
        return str(path)

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self.oracle = motorlib.Proc([self.bin, "engine-sim", "--port", "0", "--model", MODEL,
                                     "--tokens-per-second", "0", "--ttft-ms", "0"],
                                    name="oracle", log_dir=str(self.log_dir),
                                    extra_env={MARK: self.run_id})
        ev = self.oracle.wait_event("sim_listening", timeout=20)
        self.oracle_url = f"http://127.0.0.1:{ev['port']}"
        self.oracle.wait_event("sim_ready", timeout=20)

        root_pods = [p for p in self.pods if self.net.in_root_ns(p.g)]
        for p in self.pods:
            p.ip = self.net.pod_ip(p.g)
            if self.net.in_root_ns(p.g):
                p.nm_port = motorlib.free_port()
                p.base_port = _free_run(p.local)
                # the pods of one instance share its DP RPC port (rank 0's pod serves it)
                same = [q for q in self.pods if q.job == p.job and q.rpc_port and q is not p]
                p.rpc_port = same[0].rpc_port if same else motorlib.free_port()
            else:  # a namespace of its own: any ports will do
                p.nm_port, p.base_port, p.rpc_port = 3026, 10000, 19000
            p.state_path = str(self.dir / f"nm-{p.name}.state.json")
        del root_pods
        self.coord_port = motorlib.free_port()
        self.coord_mgmt = motorlib.free_port()
        if self.mode == "controller" and self.store == "etcd":
            self._add_etcd()
        if self.n_coordinators > 1:
            self.coord_ports = [(motorlib.free_port(), motorlib.free_port())
                                for _ in range(self.n_coordinators)]
        if self.mode == "controller":
            self.ctl_port = motorlib.free_port(self.net.controller_host)
            ccfg = self._controller_cfg()
            self.controller = Daemon(self, "controller", "controller",
                                     lambda: [self.bin, "controller", "--config", ccfg,
                                              "--port", str(self.ctl_port)],
                                     "controller_ready")
            self.daemons.append(self.controller)
        if self.n_coordinators == 1:
            kcfg = self._coordinator_cfg()
            self.coordinator = Daemon(
                self, "coordinator", "coordinator",
                lambda: [self.bin, "coordinator", "--config", kcfg, "--port",
                         str(self.coord_port), "--mgmt-port", str(self.coord_mgmt), "--workers",
                         "1"],
                "coordinator_listening",
                post_start=self._register if self.mode == "standalone" else None)
            self.coordinators = [self.coordinator]
        else:
            for k, (infer, mgmt) in enumerate(self.coord_ports):
                kc = self._coordinator_cfg(k)
                self.coordinators.append(Daemon(
                    self, f"coordinator-{k}", "coordinator",
                    (lambda kc=kc, infer=infer, mgmt=mgmt:
                     [self.bin, "coordinator", "--config", kc, "--port", str(infer),
                      "--mgmt-port", str(mgmt), "--workers", "1"]),
                    "coordinator_listening"))
            self.coordinator = self.coordinators[0]
        self.daemons += self.coordinators
        for p in self.pods:
            p.cfg_path = self._nm_cfg(p)
            argv = [self.bin, "node-manager", "--config", p.cfg_path, "--port", str(p.nm_port),
                    "--state-file", p.state_path]
            p.daemon = Daemon(self, f"nm-{p.name}", "nm",
                              (lambda a=argv, g=p.g: self.net.wrap(g, a)), "nm_listening",
                              env={"ROLE": p.role})
            self.daemons.append(p.daemon)
        for d in self.etcds:
            d.start(wait=False)
        for d in self.etcds:
            d.wait_ready(d.proc, 30)
        if self.controller:
            self.controller.start()
        for d in self.coordinators:
            d.start(wait=True)
        if self.n_coordinators > 1:
            from chaos_service import Service, wait_ready
            self.services = [Service(self.coord_port, [(i, m) for i, m in self.coord_ports],
                                     name="svc-infer"),
                             Service(self.coord_mgmt, [(m, m) for _, m in self.coord_ports],
                                     name="svc-mgmt")]
            for svc in self.services:
                wait_ready(svc)
        for p in self.pods:
            p.daemon.start(wait=False)
        for p in self.pods:
            p.daemon.proc.wait_event("nm_listening", timeout=30)
        if self.mode == "standalone":
            self._register(self.coordinator)
        self.supervisor = Supervisor(self)
        self.supervisor.start()
        self.log(f"[{self.mode}] fleet started in {time.monotonic() - t0:.1f}s "
                 f"({len(self.daemons)} daemons)")

    def _add_etcd(self) -> None:
        """etcd on 127.0.0.1 (same data directory across restarts: its own durability is
        what a controller restart relies on); etcd_members 3: a cluster, the controller
        given every member's URL."""
        exe = shutil.which("etcd")
        if not exe:
            raise RuntimeError("etcd not installed (scripts/deps.sh installs etcd-server)")
        n = self.etcd_members
        ports = [(motorlib.free_port(), motorlib.free_port()) for _ in range(n)]
        names = ["chaos"] if n == 1 else [f"chaos{k}" for k in range(n)]
        cluster = ",".join(f"{nm}=http://127.0.0.1:{pp}" for nm, (_, pp) in zip(names, ports))
        for k, (cport, pport) in enumerate(ports):
            cu, pu = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
            data = self.dir / ("etcd-data" if n == 1 else f"etcd{k}-data")
            self.etcd_urls.append(cu)
            argv = [exe, "--name", names[k], "--data-dir", str(data),
                    "--listen-client-urls", cu, "--advertise-client-urls", cu,
                    "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                    "--initial-cluster", cluster, "--initial-cluster-token",
                    f"chaos-{self.run_id}", "--heartbeat-interval=20", "--election-timeout=200"]

            def healthy(cu=cu) -> bool:
                if n > 1:  # a member alone has no quorum yet: answering is enough here
                    return call("GET", cu + "/version", timeout=1)[0] == 200
                st, body = call("GET", cu + "/health", timeout=1)
                return st == 200 and isinstance(body, dict) and body.get("health") == "true"
            d = Daemon(self, "etcd" if n == 1 else f"etcd-{k}", "etcd",
                       (lambda a=argv: a), healthy)
            self.etcds.append(d)
            self.daemons.append(d)
        self.etcd = self.etcds[0]
        self.etcd_url = self.etcd_urls[0]

    def etcd_leader(self) -> Optional[Daemon]:
        """The member that leads the cluster now (etcd's maintenance status), or None."""
        for d, url in zip(self.etcds, self.etcd_urls):
            if not d.alive() or d.stopped:
                continue
            st, body = call("POST", url + "/v3/maintenance/status", {}, timeout=1)
            if st == 200 and isinstance(body, dict) and body.get("leader") and \
                    body.get("header", {}).get("member_id") == body["leader"]:
                return d
        return None

    @property
    def infer_url(self) -> str:
        return f"{scheme()}://127.0.0.1:{self.coord_port}"

    @property
    def mgmt_url(self) -> str:
        return f"{scheme()}://127.0.0.1:{self.coord_mgmt}"

    @property
    def ctl_url(self) -> str:
        return f"{scheme()}://{self.net.controller_host}:{self.ctl_port}"

    def _register(self, d: Daemon) -> None:
        """standalone: `motor register set` every pod's instance (the operator's hook)."""
        args = [self.bin, "register", "set", "--coordinator", "http://127.0.0.1",
                "--mgmt-port", str(self.coord_mgmt), "--model-name", MODEL,
                "--no-health-check", "--timeout", "10"]
        for p in self.pods:
            args += [f"--{p.role}", ",".join(p.addrs())]
        r = subprocess.run(args, capture_output=True, text=True, timeout=30,
                           env={**os.environ, MARK: self.run_id})
        if r.returncode != 0:
            raise RuntimeError(f"motor register failed ({r.returncode}): {r.stderr.strip()}")

    def on_unexpected_exit(self, d: Daemon, rc: Optional[int]) -> None:
        ev = {"daemon": d.name, "rc": rc, "at": time.monotonic(),
              "log": d.proc.log_path if d.proc else ""}
        if d.kind == "nm" and rc == 255:
            self.suicides.append(ev)  # "restart this pod": by design
            self.log(f"  [{d.name}] exited 255 (restart-this-pod); supervisor restarts it")
        elif d.kind == "controller" and rc == 1 and d.proc and \
                d.proc.find_events("controller_leadership_lost"):
            # etcd unreachable past the lease: a leader steps down by exiting (documented)
            self.leadership_losses.append(ev)
            self.log(f"  [{d.name}] lost its etcd leadership and exited 1; supervisor restarts it")
        else:
            ev["tail"] = d.proc.tail(15) if d.proc else ""
            self.crashes.append(ev)
            self.log(f"  [{d.name}] CRASHED rc={rc}; supervisor restarts it")

    # -- views ---------------------------------------------------------------------------------

    def engines(self, pod: Pod) -> Optional[dict]:
        st, body = call("GET", pod.url + "/node-manager/engines", timeout=2)
        return body if st == 200 and isinstance(body, dict) else None

    def engine_pids(self, pod: Pod) -> list[int]:
        v = self.engines(pod)
        if not v:
            return []
        return [e["pid"] for e in v.get("endpoints", []) if e.get("pid") and e.get("alive")]

    def controller_instances(self) -> Optional[list[dict]]:
        st, body = call("GET", self.ctl_url + "/controller/instances", timeout=2)
        if st == 200 and isinstance(body, dict):
            return body.get("instances", [])
        return None

    def coordinator_instances(self) -> Optional[list[dict]]:
        st, body = call("GET", self.mgmt_url + "/instances", timeout=2)
        if st == 200 and isinstance(body, dict):
            return body.get("instances", [])
        return None

    # -- health --------------------------------------------------------------------------------

    def health(self, replaced: frozenset = frozenset()) -> list[str]:
        """What keeps the fleet from being fully recovered (empty = healthy). `replaced`:
        engine pids a fault killed or hung — an endpoint still reporting one of them has
        not been noticed yet."""
        problems: list[str] = []
        for d in self.daemons:
            if not d.alive():
                problems.append(f"{d.name} not running")
            elif d.stopped:
                problems.append(f"{d.name} stopped")
        if problems:
            return problems
        for p in self.pods:
            v = self.engines(p)
            if v is None:
                problems.append(f"{p.daemon.name}: API unreachable")
                continue
            eps = v.get("endpoints", [])
            if len(eps) != p.local:
                problems.append(f"{p.daemon.name}: {len(eps)} endpoints, want {p.local}")
            for e in eps:
                if e.get("pid") in replaced:
                    problems.append(f"{p.daemon.name}: endpoint {e.get('id')} still runs "
                                    f"pid {e.get('pid')} (fault not noticed yet)")
                elif not e.get("alive") or e.get("status") != "normal":
                    problems.append(f"{p.daemon.name}: endpoint {e.get('id')} "
                                    f"{e.get('state')}/{e.get('status')}")
                else:  # the engine itself, not only what its node manager believes
                    st, _ = call("GET", f"{scheme()}://{p.ip}:{e.get('port')}/health",
                                 timeout=2)
                    if st != 200:
                        problems.append(f"{p.daemon.name}: endpoint {e.get('id')} /health {st}")
            st, body = call("GET", p.url + "/node-manager/status", timeout=2)
            if st != 200 or not isinstance(body, dict) or body.get("status") is not True:
                problems.append(f"{p.daemon.name}: /node-manager/status {st} {body}")
        if problems:
            return problems
        problems += self._port_problems()
        if self.n_coordinators > 1:
            problems += self._ha_problems()
            if problems:
                return problems
        if self.mode == "controller":
            problems += self._controller_problems()
        else:
            problems += self._standalone_problems()
        return problems

    def _controller_problems(self) -> list[str]:
        out = []
        insts = self.controller_instances()
        if insts is None:
            return ["controller: /controller/instances unreachable"]
        active: dict[str, int] = {}
        for job, pods in self.jobs().items():
            mine = [i for i in insts if i.get("job_name") == job]
            act = [i for i in mine if i.get("status") == "active"]
            if len(act) != 1:
                out.append(f"controller: {job} has {len(act)} active instance(s) "
                           f"({[(i.get('id'), i.get('status')) for i in mine]})")
                continue
            active[job] = act[0]["id"]
            eps = sorted(f"{e.get('ip')}:{e.get('business_port')}"
                         for nm in act[0].get("node_managers", [])
                         for e in nm.get("endpoints", []))
            want = sorted(a for p in pods for a in p.addrs())
            if eps != want:
                out.append(f"controller: {job} endpoints {eps}, want {want}")
            if len(act[0].get("node_managers", [])) != len(pods):
                out.append(f"controller: {job} has {len(act[0].get('node_managers', []))} node "
                           f"manager(s), want {len(pods)}")
        if out:
            return out
        coord = self.coordinator_instances()
        if coord is None:
            return ["coordinator: /instances unreachable"]
        routable = {i["id"] for i in coord if i.get("status") == "active"
                    and i.get("pool") == "available"}
        want = set(active.values())
        if routable != want:
            out.append(f"coordinator routes {sorted(routable)}, controller has active "
                       f"{sorted(want)}")
        return out

    def jobs(self) -> dict[str, list[Pod]]:
        out: dict[str, list[Pod]] = {}
        for p in self.pods:
            out.setdefault(p.job, []).append(p)
        return out

    # A multi-pod instance must leave the coordinator when one of its node managers is
    # silent longer than the controller's heartbeat timeout (3 s) + probe (1 s), with room
    # for the check interval and the push: after this, routing it is a violation.
    MEMBER_GRACE = 6.0

    def member_violations(self) -> list[str]:
        """The partial-loss invariant, sampled continuously: the coordinator never holds
        a routable multi-pod instance one of whose node managers the driver has kept
        silent for longer than MEMBER_GRACE."""
        now = time.monotonic()
        ctl = self.controller
        if self.mode != "controller" or ctl is None or ctl.stopped or not ctl.alive():
            return []
        # A controller that (re)started or resumed meanwhile knows nothing of the silence
        # before: it counts every member's heartbeat age from its load (a fresh window,
        # as upstream's isolation guard) — the grace runs from then (`since`: its
        # controller_ready, i.e. loaded as the leader; inf until then).
        down = {}
        for p in self.pods:
            if p.multi and p.down_since is not None and \
                    now - max(p.down_since, ctl.since) > self.MEMBER_GRACE:
                down.setdefault(p.job, []).append(p)
        if not down:
            return []
        coord = self.coordinator_instances()
        insts = self.controller_instances()
        if coord is None or insts is None:
            return []
        ids = {i["id"]: i.get("job_name") for i in insts}
        out = []
        for i in coord:
            job = ids.get(i.get("id"))
            if job in down and i.get("status") == "active" and i.get("pool") == "available":
                out.append(f"VIOLATION coordinator routes {job} (instance {i.get('id')}) while "
                           f"{['nm-' + p.name for p in down[job]]} silent for "
                           f"{now - min(p.down_since for p in down[job]):.1f}s (controller "
                           f"up {now - ctl.since:.1f}s)")
        return out

    def master(self) -> Optional[Daemon]:
        """The coordinator whose /readiness answers 200 when exactly one does."""
        up = []
        for d, (_, mgmt) in zip(self.coordinators, self.coord_ports):
            if d.alive() and not d.stopped and \
                    call("GET", f"http://127.0.0.1:{mgmt}/readiness", timeout=1)[0] == 200:
                up.append(d)
        return up[0] if len(up) == 1 else None

    def _ha_problems(self) -> list[str]:
        """One master, every other coordinator a standby (NOT_MASTER) whose replica of
        the instance table is the master's."""
        out = []
        states = []
        for d, (_, mgmt) in zip(self.coordinators, self.coord_ports):
            st, body = call("GET", f"http://127.0.0.1:{mgmt}/readiness", timeout=2)
            states.append((d, st, body if isinstance(body, dict) else {}))
        masters = [d for d, st, _ in states if st == 200]
        if len(masters) != 1:
            return [f"coordinators: {len(masters)} master(s) "
                    f"{[(d.name, st, b.get('reason')) for d, st, b in states]}"]
        tables = {}
        for d, (_, mgmt) in zip(self.coordinators, self.coord_ports):
            st, body = call("GET", f"http://127.0.0.1:{mgmt}/instances", timeout=2)
            if st != 200 or not isinstance(body, dict):
                return [f"{d.name}: /instances {st}"]
            tables[d.name] = sorted((i["id"], i.get("status")) for i in body.get("instances", []))
        for d, st, b in states:
            if st != 200 and b.get("reason") != "NOT_MASTER":
                out.append(f"{d.name}: /readiness {st} {b.get('reason')} (want NOT_MASTER)")
            if tables[d.name] != tables[masters[0].name]:
                out.append(f"{d.name}: replica {tables[d.name]} differs from the master's "
                           f"{tables[masters[0].name]}")
        return out

    def _standalone_problems(self) -> list[str]:
        coord = self.coordinator_instances()
        if coord is None:
            return ["coordinator: /instances unreachable"]
        out = []
        for p in self.pods:
            role = "union" if p.role == "union" else p.role
            match = [i for i in coord if i.get("role") == role]
            eps = sorted(f"{e.get('ip')}:{e.get('business_port')}"
                         for i in match for e in i.get("endpoints", []))
            if eps != sorted(p.addrs()):
                out.append(f"coordinator: {role} endpoints {eps}, want {sorted(p.addrs())}")
            elif not all(i.get("status") == "active" and i.get("pool") == "available"
                         for i in match):
                out.append(f"coordinator: {role} not available")
        return out

    def _port_problems(self) -> list[str]:
        """Every engine port is held by the engine its node manager reports, and every
        node manager's API port by that node manager: never by a leftover process."""
        out = []
        marked = marked_pids(self.run_id)
        for p in self.pods:
            v = self.engines(p)
            if not v:
                continue
            nm_pid = p.daemon.pid
            for e in v.get("endpoints", []):
                pid, port = e.get("pid"), e.get("port")
                if not pid or not port:
                    continue
                inodes = listen_inodes(pid, int(port))
                if not inodes:
                    out.append(f"{p.daemon.name}: nobody listens on engine port {port}")
                    continue
                owners = socket_owners(inodes, marked)
                if owners != {pid}:
                    out.append(f"VIOLATION port {p.ip}:{port} held by "
                               f"{sorted(owners)} ({[cmdline(o)[:60] for o in owners]}), "
                               f"engine is {pid}")
            inodes = listen_inodes(nm_pid, p.nm_port)
            owners = socket_owners(inodes, marked)
            if owners and owners != {nm_pid}:
                out.append(f"VIOLATION port {p.ip}:{p.nm_port} held by {sorted(owners)}, "
                           f"node manager is {nm_pid}")
        return out

    def restart_counts(self) -> dict[str, int]:
        return {d.name: d.restarts for d in self.daemons}

    # -- process-tree invariants ------------------------------------------------------------

    def process_violations(self, killed: list[int]) -> list[str]:
        """Orphans (a process of this run not descending from a live daemon of ours or
        from this driver), zombies that stay, and killed processes still alive."""
        out = []
        me = os.getpid()
        roots = {me} | {d.pid for d in self.daemons if d.alive()}
        if self.oracle and self.oracle.alive():
            roots.add(self.oracle.pid)
        now = time.monotonic()
        zombies_now = set()
        marked = marked_pids(self.run_id)
        for pid, ppid in zombies_of(set(marked) | roots):
            zombies_now.add(pid)
            first = self.zombie_seen.setdefault(pid, now)
            if now - first > 3.0:
                out.append(f"VIOLATION zombie {pid} ({_comm(pid)}) not reaped by its parent "
                           f"{ppid} ({cmdline(ppid)[:60]}) for {now - first:.1f}s")
        for pid in marked:
            st = proc_stat(pid)
            if st is None or st[0] in ("Z", "X"):
                continue
            state, ppid = st
            chain, cur = [], pid
            ok = False
            for _ in range(16):
                if cur in roots:
                    ok = True
                    break
                s = proc_stat(cur)
                if s is None or cur <= 1:
                    break
                chain.append(cur)
                cur = s[1]
            if not ok:
                out.append(f"VIOLATION orphan {pid} ({cmdline(pid)[:80]}) parent {ppid}")
        for pid in list(self.zombie_seen):
            if pid not in zombies_now:
                del self.zombie_seen[pid]
        for pid in killed:
            st = proc_stat(pid)
            if st is not None and st[0] not in ("Z", "X") and pid not in roots:
                out.append(f"VIOLATION killed process {pid} still alive ({cmdline(pid)[:60]})")
        return out

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop everything (gracefully, in the order an operator would), then make sure
        nothing of this run is left. Returns leftovers (violations)."""
        if self.supervisor:
            self.supervisor.stop_ev.set()
            self.supervisor.join(5)
        for d in self.daemons:
            if d.stopped:
                d.signal(signal.SIGCONT)
        order = list(self.coordinators) + ([self.controller] if self.controller else [])
        for d in order:
            d.stop_gracefully(10)
        for svc in self.services:
            svc.close()
        nms = [p.daemon for p in self.pods if p.daemon]
        threads = [threading.Thread(target=d.stop_gracefully, args=(15,)) for d in nms]
        for t in threads:
            t.start()
        for t in threads:
            t.join(25)
        for d in self.etcds:
            d.stop_gracefully(10)
        if self.oracle:
            self.oracle.stop(5)
            self.oracle.close()
        left: list[str] = []
        deadline = time.monotonic() + 10
        while True:
            pids = [p for p in marked_pids(self.run_id) if p != os.getpid()]
            live = [p for p in pids if (proc_stat(p) or ("X",))[0] not in ("Z", "X")]
            if not live or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for pid in live:
            left.append(f"VIOLATION left behind after stop: {pid} ({cmdline(pid)[:80]})")
            try:
                os.kill(pid, signal.SIGKILL)  # ours (marked with this run's id)
            except ProcessLookupError:
                pass
        for d in self.daemons:
            for p in d.procs:
                p.close()
        for port in (self.coord_port, self.coord_mgmt, *[q for pp in self.coord_ports for q in pp]):
            if port and not motorlib.port_is_free(port):
                left.append(f"VIOLATION port 127.0.0.1:{port} still bound after stop")
        return left

    def sanitizer_reports(self) -> list[str]:
        pat = re.compile(r"ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|"
                         r"SUMMARY: UndefinedBehaviorSanitizer")
        out = []
        for f in sorted(self.log_dir.glob("*.log")):
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            m = pat.search(text)
            if m:
                start = max(0, text.rfind("\n", 0, m.start()))
                out.append(f"VIOLATION sanitizer report in {f}: "
                           f"{text[start:start + 400].strip()}")
        return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _free_run(n: int) -> int:
    for _ in range(200):
        base = motorlib.free_port()
        if base + 2 * n < 65000 and all(motorlib.port_is_free(base + 2 * i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")
