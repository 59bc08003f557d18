"""chaos_up — the chaos fleet run by `motor up` instead of by the driver.

Same pods as the other fleets (prefill DP 1, decode DP 1, union DP 2, engine simulators
with one worker each), same controller and coordinator settings, but one process is the
driver's child: `motor up`, which starts the coordinator, the controller (SQLite store in
its state directory) and one node manager per pod, and restarts any of them that exits
(1 s, doubling to 30 s, reset after 60 s of uptime). The driver only injects faults and
checks; it never restarts anything itself — except `motor up` after an `up_kill` (the
way systemd would), with `--keep-state` so that the controller finds its instances.

Children are found through `<state dir>/up.json` (name, pid, restarts), pods and ports
through `motor up --dry-run`. ``UpChild`` gives a child the small interface the faults
use (pid, alive, signal, kill, stopped).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

import motorlib
from chaos_fleet import MARK, MODEL, Fleet, Pod, marked_pids, proc_stat


class UpChild:
    """One child of `motor up`, looked up by name in up.json."""

    def __init__(self, fleet: "UpFleet", name: str, kind: str):
        self.fleet = fleet
        self.name = name
        self.kind = kind
        self.stopped = False
        self.procs: list = []

    def info(self) -> dict:
        for c in self.fleet.up_info().get("children", []):
            if c.get("name") == self.name:
                return c
        return {}

    @property
    def pid(self) -> int:
        return int(self.info().get("pid") or 0)

    @property
    def restarts(self) -> int:
        return int(self.info().get("restarts") or 0)

    def alive(self) -> bool:
        pid = self.pid
        st = proc_stat(pid) if pid else None
        return st is not None and st[0] not in ("Z", "X")

    def signal(self, sig: int) -> None:
        pid = self.pid
        # up.json may be a moment old: only signal a pid that still carries our marker
        if pid and pid in marked_pids(self.fleet.run_id):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, hold: float) -> int:
        """SIGKILL; `motor up` decides when it comes back (hold is not ours to choose)."""
        pid = self.pid
        self.fleet.expected_exits.add(pid)
        self.signal(signal.SIGKILL)
        return pid


class UpFleet(Fleet):
    """The fleet of `motor up` (mode "up"; the controller checks apply)."""

    def __init__(self, run_id: str, run_dir: Path, net, log=print, tls: bool = False):
        super().__init__("controller", run_id, run_dir, net, log=log)
        self.kind = "up"
        # `motor up --tls`: every listener on mutual TLS; the driver's own requests use
        # the CA and client certificate it made (chaos_fleet.TLS_CTX while this runs)
        self.tls = tls
        self.dir = run_dir / "up"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = self.dir / "logs"  # the driver's own logs (motor up, oracle)
        self.log_dir.mkdir(exist_ok=True)
        self.state = self.dir / "state"
        self.up: Optional[motorlib.Proc] = None
        self.ups: list[motorlib.Proc] = []
        self.expected_exits: set[int] = set()
        self.up_kills = 0
        self._info_cache: tuple[float, dict] = (0.0, {})

    # -- configuration ------------------------------------------------------------------------

    def _up_cfg(self) -> str:
        ctl = json.loads(Path(self._controller_cfg()).read_text())["motor_controller_config"]
        ctl.pop("store_config", None)  # motor up keeps the store in its state directory
        ctl["api_config"] = {}
        coord = json.loads(Path(self._coordinator_cfg()).read_text())["motor_coordinator_config"]
        coord["api_config"] = {}
        nm_block = {
            "basic_config": {"heartbeat_interval_seconds": 0.5, "daemon_loop_interval": 1},
            "fault_tolerance_config": {"engine_restart_wait_timeout_sec": 60,
                                       "container_restart_managed": True},
            "stop_grace_seconds": 1,
        }

        def engine(dp: int, kv_role: Optional[str]) -> dict:
            ec: dict[str, Any] = {"model": MODEL, "data_parallel_size": dp, "load_seconds": 0.3,
                                  "tokens_per_second": 400, "ttft_ms": 5, "max_model_len": 4096,
                                  "workers": 1}
            if kv_role:
                ec["kv_transfer_config"] = {"kv_connector": "NixlConnector", "kv_role": kv_role}
            return {"engine_type": "sim", "engine_config": ec,
                    "health_check_config": {"health_collector_timeout": 1,
                                            "health_collector_timeout_retry_attempts": 2,
                                            "startup_timeout": 30}}
        cfg = {
            "motor_deploy_config": {"p_instances_num": 1, "d_instances_num": 1,
                                    "hybrid_instances_num": 1, "single_p_instance_pod_num": 1,
                                    "single_d_instance_pod_num": 1,
                                    "single_hybrid_instance_pod_num": 1, "job_id": "chaos-up"},
            "motor_controller_config": ctl,
            "motor_coordinator_config": coord,
            "motor_nodemanger_config": nm_block,
            "motor_engine_prefill_config": engine(1, "kv_producer"),
            "motor_engine_decode_config": engine(1, "kv_consumer"),
            "motor_engine_union_config": engine(2, None),
        }
        path = self.dir / "user_config.json"
        path.write_text(json.dumps(cfg, indent=1))
        return str(path)

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        self._start_oracle()
        self.cfg_path = self._up_cfg()
        self.base = _free_block(80)
        r = subprocess.run([self.bin, "up", "--dry-run", "-c", self.cfg_path, "--port-base",
                            str(self.base), "--state-dir", str(self.state)] + self._tls_arg(),
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"motor up --dry-run failed: {r.stderr.strip()}")
        plan = json.loads(r.stdout)
        self.coord_port = plan["coordinator_port"]
        self.coord_mgmt = plan["coordinator_mgmt_port"]
        self.ctl_port = plan["controller_port"]
        self.pods = []
        for g, d in enumerate(plan["pods"]):
            p = Pod(g, d["role"], d["dp_size"], d["job_name"])
            p.ip = "127.0.0.1"
            p.nm_port = d["node_manager_port"]
            p.base_port = d["engine_ports"][0]
            p.daemon = UpChild(self, d["name"], "nm")  # type: ignore[assignment]
            self.pods.append(p)
        self.controller = UpChild(self, "controller", "controller")  # type: ignore[assignment]
        self.coordinator = UpChild(self, "coordinator", "coordinator")  # type: ignore[assignment]
        self.daemons = [self.coordinator, self.controller] + [p.daemon for p in self.pods]
        self._start_up(keep_state=False)
        if self.tls:
            import ssl
            import chaos_fleet
            tls = self.state / "tls"
            ctx = ssl.create_default_context(cafile=str(tls / "ca.crt"))
            ctx.load_cert_chain(str(tls / "client.crt"), str(tls / "client.key"))
            chaos_fleet.TLS_CTX = ctx
        self.log(f"[up] motor up{' --tls' if self.tls else ''} ready in "
                 f"{time.monotonic() - t0:.1f}s (port base {self.base}, {len(self.pods)} pods)")

    def _tls_arg(self) -> list[str]:
        return ["--tls"] if self.tls else []

    def _start_oracle(self) -> None:
        self.oracle = motorlib.Proc([self.bin, "engine-sim", "--port", "0", "--model", MODEL,
                                     "--tokens-per-second", "0", "--ttft-ms", "0"],
                                    name="oracle", log_dir=str(self.log_dir),
                                    extra_env={MARK: self.run_id})
        ev = self.oracle.wait_event("sim_listening", timeout=20)
        self.oracle_url = f"http://127.0.0.1:{ev['port']}"
        self.oracle.wait_event("sim_ready", timeout=20)

    def _start_up(self, keep_state: bool) -> None:
        argv = [self.bin, "up", "-c", self.cfg_path, "--port-base", str(self.base),
                "--state-dir", str(self.state), "--plain", "--ready-timeout", "90"]
        argv += self._tls_arg()  # with --keep-state, motor up keeps its certificates too
        if keep_state:
            argv.append("--keep-state")
        self.up = motorlib.Proc(argv, name="up", log_dir=str(self.log_dir),
                                extra_env={MARK: self.run_id})
        self.ups.append(self.up)
        self.up.wait_event("up_ready", timeout=90)

    def up_info(self) -> dict:
        now = time.monotonic()
        if now - self._info_cache[0] < 0.05:
            return self._info_cache[1]
        try:
            info = json.loads((self.state / "up.json").read_text())
        except (OSError, ValueError):
            info = self._info_cache[1]
        self._info_cache = (now, info)
        return info

    # -- faults on motor up itself ----------------------------------------------------------

    def kill_up(self) -> list[int]:
        """SIGKILL `motor up`: every child must die with it (PDEATHSIG) — checked here —
        then start it again with --keep-state. Returns the pids that had to die."""
        victims = [p for p in marked_pids(self.run_id)
                   if p not in (os.getpid(), self.oracle.pid if self.oracle else 0)]
        self.up_kills += 1
        self.up.kill(group=False)
        self.up.wait(10)
        return victims

    def restart_up(self) -> None:
        self._start_up(keep_state=True)

    # -- checks ----------------------------------------------------------------------------

    def health(self, replaced: frozenset = frozenset()) -> list[str]:
        if not self.up or not self.up.alive():
            return ["motor up not running"]
        return super().health(replaced)

    def process_violations(self, killed: list[int]) -> list[str]:
        # descendants of motor up are accounted: make it a root next to the driver
        extra = []
        if self.up and self.up.alive():
            extra.append(self.up.pid)
        saved = self.daemons
        self.daemons = list(saved) + [_Root(p) for p in extra]
        try:
            return super().process_violations(killed)
        finally:
            self.daemons = saved

    def restart_counts(self) -> dict[str, int]:
        """Restarts by `motor up` of each child, over every `motor up` of the run."""
        out: dict[str, int] = {}
        for up in self.ups:
            for ev in up.find_events("up_child_started"):
                if int(ev.get("start", 1)) > 1:
                    out[ev.get("name", "?")] = out.get(ev.get("name", "?"), 0) + 1
        out["motor up"] = len(self.ups) - 1
        return out

    def crashes_from_log(self) -> list[dict]:
        """Children that exited without the driver killing them (motor up logs each exit);
        a node manager's 255 is its documented restart request."""
        out = []
        for up in self.ups:
            for ev in up.find_events("up_child_exited"):
                if ev.get("pid") in self.expected_exits:
                    continue
                if ev.get("name") not in ("controller", "coordinator") and ev.get("code") == 255:
                    self.suicides.append(ev)
                    continue
                out.append({"daemon": ev.get("name"), "rc": ev.get("code") or -ev.get("signal", 0),
                            "log": ev.get("log"), "tail": ev.get("tail", "")})
        return out

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        for d in self.daemons:
            if d.stopped:
                d.signal(signal.SIGCONT)
        self.crashes.extend(self.crashes_from_log())
        left: list[str] = []
        if self.up and self.up.alive():
            self.up.signal(signal.SIGTERM)
            try:
                rc = self.up.wait(60)
                if rc != 0:
                    left.append(f"VIOLATION motor up exited {rc} on SIGTERM")
            except TimeoutError:
                left.append("VIOLATION motor up did not stop within 60s of SIGTERM")
        if self.oracle:
            self.oracle.stop(5)
            self.oracle.close()
        deadline = time.monotonic() + 10
        live: list[int] = []
        while True:
            live = [p for p in marked_pids(self.run_id) if p != os.getpid()
                    and (proc_stat(p) or ("X",))[0] not in ("Z", "X")]
            if not live or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        from chaos_fleet import cmdline
        for pid in live:
            left.append(f"VIOLATION left behind after stop: {pid} ({cmdline(pid)[:80]})")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for up in self.ups:
            up.close()
        for port in (self.coord_port, self.coord_mgmt, self.ctl_port):
            if port and not motorlib.port_is_free(port):
                left.append(f"VIOLATION port 127.0.0.1:{port} still bound after stop")
        import chaos_fleet
        chaos_fleet.TLS_CTX = None
        return left

    def sanitizer_reports(self) -> list[str]:
        out = super().sanitizer_reports()
        saved = self.log_dir
        self.log_dir = self.state / "logs"
        try:
            out += super().sanitizer_reports()
        finally:
            self.log_dir = saved
        return out


class _Root:
    """A pid that counts as a root of the process tree for the orphan check."""

    def __init__(self, pid: int):
        self.pid = pid

    def alive(self) -> bool:
        return True


def _free_block(n: int) -> int:
    """n consecutive ports free now, below the kernel's ephemeral range (so that clients'
    source ports do not take one between this check and `motor up` binding it)."""
    lo, hi = 20000, 60000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            hi = min(hi, int(f.read().split()[0]))
    except (OSError, ValueError):
        pass
    rng = random.Random(os.getpid() ^ int(time.time()))
    for _ in range(200):
        base = rng.randrange(lo, hi - n, 10)
        if all(motorlib.port_is_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free block of ports for motor up")
