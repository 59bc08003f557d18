"""Fakes and helpers for the controller's integration tests.

* ``Controller``: start ``motor controller`` with a generated config on an ephemeral port
  and wait until it is ready (or standby).
* ``FakeNM``: a node manager speaking the controller protocol from the NM side — an HTTP
  server (the NM API: status, start, stop, engine-restart, fault-tolerance/*) that
  records every request, plus a client that registers, heartbeats (by hand or from a
  background thread), re-registers and reports faults. Its FT routes simulate engines
  behind it (dead / unhealthy / recovering / healthy) so that DP scale-down can run
  without real engines.
* ``FakeCoordinator``: records POST /instances/refresh bodies; can be told to fail.
* ``Etcd``: a real etcd on free loopback ports with a temporary data dir.

Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Optional

import motorlib

# ---------------------------------------------------------------------------------------
# small HTTP client


def call(method: str, url: str, body: Any = None, timeout: float = 5.0,
         ctx: Any = None) -> tuple[int, Any]:
    """(status, parsed JSON or raw text) — HTTP errors are returned, not raised. ctx: an
    ssl.SSLContext for https:// URLs."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ctx) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        with e:
            raw = e.read()
            status = e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


# ---------------------------------------------------------------------------------------
# a tiny threaded JSON server


class _Server:
    """ThreadingHTTPServer on 127.0.0.1:0 whose requests go to handle(method, path,
    body) -> (status, json_body)."""

    def __init__(self, handle: Callable[[str, str, Any], tuple[int, Any]]):
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:  # quiet
                pass

            def _do(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                res = handle(self.command, self.path, body)
                if res is None:
                    # "dead": drop the connection without an answer (a transport error
                    # for the client, also on kept-alive connections)
                    self.close_connection = True
                    return
                status, out = res
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _do
            do_POST = _do

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self._outer = outer

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---------------------------------------------------------------------------------------
# fake coordinator


class FakeCoordinator:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refreshes: list[dict] = []
        self.fail = False
        self.server = _Server(self._handle)
        self.port = self.server.port

    def _handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/liveness":
            return (503, {"detail": "down"}) if self.fail else (200, {"status": "ok"})
        if method == "POST" and path == "/instances/refresh":
            with self.lock:
                self.refreshes.append({"body": body, "failed": self.fail})
            if self.fail:
                return 503, {"detail": "coordinator failing on purpose"}
            return 200, {"status": "success", "message": "Instance refresh completed"}
        return 404, {"detail": "Not Found"}

    def events(self, ok_only: bool = True) -> list[tuple[str, list[int]]]:
        with self.lock:
            out = []
            for r in self.refreshes:
                if ok_only and r["failed"]:
                    continue
                b = r["body"]
                out.append((b["event"], [i["id"] for i in b["instances"]]))
            return out

    def last_instance(self, iid: int) -> Optional[dict]:
        """The instance object of the last successful add/set that carried iid."""
        with self.lock:
            for r in reversed(self.refreshes):
                if r["failed"]:
                    continue
                b = r["body"]
                for i in b["instances"]:
                    if i["id"] == iid and b["event"] in ("add", "set"):
                        return i
        return None

    def routable(self) -> set[int]:
        """The coordinator's view after replaying every successful refresh."""
        have: set[int] = set()
        for ev, ids in self.events():
            if ev == "set":
                have = set(ids)
            elif ev == "add":
                have |= set(ids)
            elif ev == "del":
                have -= set(ids)
        return have

    def close(self) -> None:
        self.server.close()


# ---------------------------------------------------------------------------------------
# fake node manager


class FakeNM:
    """One fake node manager. ports: its engines' business ports (one endpoint each)."""

    def __init__(self, job: str, role: str = "prefill", ports: tuple[int, ...] = (10000,),
                 dp: int = 1, tp: int = 1, nnodes: int = 1, device_num: int = 0,
                 model: str = "m", multi: bool = True, ft_capability: Optional[dict] = None,
                 ip: str = "127.0.0.1"):
        self.job, self.role, self.ports, self.dp, self.tp = job, role, ports, dp, tp
        self.nnodes, self.device_num, self.model, self.multi = nnodes, device_num, model, multi
        self.ft_capability = ft_capability
        self.ip = ip
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, Any]] = []
        self.start_cmd: Optional[dict] = None
        self.instance_id: Optional[int] = None
        self.statuses: dict[int, str] = {}
        # behaviour switches
        self.status_ok = True          # GET /node-manager/status -> {"status": ...}
        self.reachable = True          # False: every route answers 503 (still "reachable"
                                       # for the assembler, which only needs an answer)
        self.restart_status = 200      # engine-restart answer
        self.restart_recovers = True   # after a restart, endpoints report normal again
        self.ft: dict[int, dict] = {}  # endpoint id -> engine FT entry
        self.ft_recover_s = 0.3
        self.ft_apply_status = 200
        self.dead = False              # True: connections are dropped without an answer
        self.hb_errors: list[Any] = []
        self._hb_thread: Optional[threading.Thread] = None
        self._hb_stop = threading.Event()
        self.server = _Server(self._handle)
        self.port = self.server.port

    # -- the NM API ------------------------------------------------------------------------

    def _handle(self, method: str, path: str, body: Any) -> Optional[tuple[int, Any]]:
        with self.lock:
            self.requests.append((method, path, body))
        if self.dead:
            return None
        if not self.reachable:
            return 503, {"detail": "unavailable"}
        if path.startswith("/node-manager/status"):
            return 200, {"status": self.status_ok}
        if path == "/node-manager/start" and method == "POST":
            with self.lock:
                self.start_cmd = body
                self.instance_id = body["instance_id"]
                self.statuses = {e["id"]: "initial" for e in body["endpoints"]}
            return 200, {}
        if path == "/node-manager/stop":
            return 200, {"message": "All engine processes stopped successfully."}
        if path == "/node-manager/engine-restart":
            if body.get("action") == "abort":
                return 200, {"message": "abort accepted"}
            if self.restart_status != 200:
                return self.restart_status, {"detail": "restart refused on purpose"}
            if self.restart_recovers:
                with self.lock:
                    self.statuses = {k: "normal" for k in self.statuses}
                    for e in self.ft.values():
                        e.update(status="healthy")
                        e.pop("ft_state", None)
            return 200, {"message": "engine restart accepted"}
        if path == "/node-manager/fault-tolerance/guard":
            return 200, {"status": "guarded"}
        if path == "/node-manager/fault-tolerance/status":
            out = {}
            with self.lock:
                for i in body["endpoint_ids"]:
                    e = self.ft.get(i, {"status": "healthy"})
                    out[str(i)] = dict(e, id=i)
            return 200, out
        if path == "/node-manager/fault-tolerance/apply":
            if self.ft_apply_status != 200:
                return self.ft_apply_status, {"detail": "apply refused"}
            with self.lock:
                for i in body["endpoint_ids"]:
                    self.ft[i] = {"status": "unhealthy", "ft_state": "recovering",
                                  "last_ft_request_id": body["request_id"]}

            def recover(ids: list[int]) -> None:
                time.sleep(self.ft_recover_s)
                with self.lock:
                    for i in ids:
                        self.ft[i] = {"status": "healthy"}
            threading.Thread(target=recover, args=(list(body["endpoint_ids"]),),
                             daemon=True).start()
            return 200, {"status": "accepted"}
        if path == "/node-manager/fault-tolerance/finalize":
            if body.get("commit"):
                with self.lock:
                    for i in body.get("retired_endpoint_ids", []):
                        self.statuses.pop(i, None)
                return 200, {"status": "committed"}
            return 200, {"status": "aborted"}
        return 404, {"detail": "Not Found"}

    def seen(self, path_prefix: str, method: Optional[str] = None) -> list[Any]:
        with self.lock:
            return [b for (m, p, b) in self.requests
                    if p.startswith(path_prefix) and (method is None or m == method)]

    # -- the controller client ---------------------------------------------------------------

    def register_body(self) -> dict:
        b = {
            "job_name": self.job, "model_name": self.model, "engine_type": "vllm",
            "dispatch_capabilities": ["prefill_handoff_decode"], "role": self.role,
            "pod_ip": self.ip, "business_port": [str(p) for p in self.ports],
            "nm_port": str(self.port),
            "parallel_config": {"dp_size": self.dp, "tp_size": self.tp},
            "enable_multi_endpoints": self.multi, "device_num": self.device_num,
            "nnodes": self.nnodes, "ranktable": None,
        }
        if self.ft_capability is not None:
            b["ft_capability"] = self.ft_capability
        return b

    def register(self, ctl: str) -> tuple[int, Any]:
        return call("POST", ctl + "/controller/register", self.register_body())

    def reregister(self, ctl: str) -> tuple[int, Any]:
        assert self.start_cmd is not None
        b = self.register_body()
        b.pop("business_port")
        b.pop("ranktable")
        b.pop("dispatch_capabilities")
        b.update(instance_id=self.start_cmd["instance_id"], endpoints=self.start_cmd["endpoints"],
                 node_rank=self.start_cmd.get("node_rank", 0))
        return call("POST", ctl + "/controller/reregister", b)

    def set_all(self, status: str) -> None:
        with self.lock:
            self.statuses = {k: status for k in self.statuses}

    def set(self, eid: int, status: str) -> None:
        with self.lock:
            self.statuses[eid] = status

    def heartbeat(self, ctl: str) -> tuple[int, Any]:
        with self.lock:
            body = {"job_name": self.job, "ins_id": self.instance_id, "ip": self.ip,
                    "status": {str(k): v for k, v in self.statuses.items()}}
        return call("POST", ctl + "/controller/heartbeat", body)

    def start_heartbeats(self, ctl_fn: Callable[[], str], interval: float = 0.2) -> None:
        """Heartbeat every interval to ctl_fn() (re-evaluated, for failover); on 503
        re-register once, as the real NM does."""
        self._hb_stop.clear()

        def loop() -> None:
            while not self._hb_stop.wait(interval):
                if self.instance_id is None:
                    continue
                try:
                    ctl = ctl_fn()
                    st, body = self.heartbeat(ctl)
                    if st == 503:
                        self.reregister(ctl)
                    elif st != 200:
                        self.hb_errors.append((st, body))
                except OSError as e:
                    self.hb_errors.append(str(e))
        self._hb_thread = threading.Thread(target=loop, daemon=True)
        self._hb_thread.start()

    def stop_heartbeats(self) -> None:
        self._hb_stop.set()
        if self._hb_thread:
            self._hb_thread.join(timeout=5)
            self._hb_thread = None

    def report(self, ctl: str, engine_id: int, status: int, iid: Any = "auto",
               etype: str = "EngineDeadError") -> tuple[int, Any]:
        body = {"exception_type": etype, "exception_message": "test", "engine_id": engine_id,
                "engine_status": status, "pod_ip": self.ip, "node_manager_port": self.port}
        if iid == "auto":
            iid = self.instance_id
        if iid is not None:
            body["instance_id"] = iid
        return call("POST", ctl + "/controller/report_software_fault", body)

    def close(self) -> None:
        self.dead = True
        self.stop_heartbeats()
        self.server.close()


# ---------------------------------------------------------------------------------------
# controller process


def ft_phase(data: dict) -> str:
    """A fault-tolerance runtime's phase: Motor's own record when DP scale-down is off (the
    wire answers phase DISABLED then, seed 002, and keeps the real one as motor_phase)."""
    return data.get("motor_phase", data["phase"])


def controller_config(tmpdir: str, coordinator_port: int, store: Optional[dict] = None,
                      ft: Optional[dict] = None, instance: Optional[dict] = None,
                      event: Optional[dict] = None, api: Optional[dict] = None,
                      extra: Optional[dict] = None) -> str:
    """Write a user_config.json with short intervals; returns its path."""
    inst = {"instance_assemble_timeout": 30, "instance_assembler_check_interval": 0.2,
            "instance_assembler_cmd_send_interval": 0.3, "instance_manager_check_interval": 0.1,
            "instance_heartbeat_timeout": 3, "instance_heartbeat_timeout_inactive": 6,
            "start_cmd_timeout": 2, "nm_probe_timeout": 1}
    inst.update(instance or {})
    fto = {"enable_fault_tolerance": True, "strategy_center_check_interval": 0.2,
           "fault_collection_timeout_seconds": 30, "enable_engine_relaunch": True,
           "engine_relaunch_complete_timeout_sec": 20, "engine_relaunch_poll_interval_sec": 0.2,
           "engine_relaunch_dispatch_retries": 2, "engine_relaunch_nm_unreachable_threshold": 3,
           "engine_relaunch_dispatch_backoff_sec": 0.1}
    fto.update(ft or {})
    ev = {"coordinator_heartbeat_interval": 0.5, "coordinator_set_sync_interval": 0,
          "coordinator_request_timeout": 2}
    ev.update(event or {})
    cfg = {
        "motor_controller_config": {
            "api_config": {"controller_api_host": "127.0.0.1", "controller_api_port": 0,
                           **(api or {})},
            "instance_config": inst,
            "event_config": ev,
            "fault_tolerance_config": fto,
            "store_config": store or {"backend": "sqlite",
                                      "sqlite_path": os.path.join(tmpdir, "controller.db")},
        },
        "motor_coordinator_config": {"api_config": {"coordinator_api_dns": "127.0.0.1",
                                                    "coordinator_api_mgmt_port": coordinator_port}},
    }
    cfg["motor_controller_config"].update(extra or {})
    path = os.path.join(tmpdir, f"controller-{time.monotonic_ns()}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


class Controller:
    """A running `motor controller`."""

    def __init__(self, procs: motorlib.ProcRegistry, config: str, name: str = "controller",
                 wait_ready: bool = True, port: int = 0):
        self.config = config
        self.proc = procs.motor("controller", "--config", config, "--port", port, name=name)
        ev = self.proc.wait_event("controller_listening", timeout=15)
        self.port = int(ev["port"])
        self.url = f"http://127.0.0.1:{self.port}"
        if wait_ready:
            self.proc.wait_event("controller_ready", timeout=15)

    def get(self, path: str) -> tuple[int, Any]:
        return call("GET", self.url + path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return call("POST", self.url + path, body)

    def instances(self) -> list[dict]:
        st, body = self.get("/controller/instances")
        assert st == 200, body
        return body["instances"]

    def instance(self, iid: int) -> Optional[dict]:
        for i in self.instances():
            if i["id"] == iid:
                return i
        return None

    def status_of(self, iid: int) -> Optional[str]:
        i = self.instance(iid)
        return i["status"] if i else None

    def ft(self, iid: Optional[int] = None) -> tuple[int, Any]:
        q = f"?instance_id={iid}" if iid is not None else ""
        return self.get("/controller/fault_tolerance/status" + q)

    def wait_status(self, iid: int, status: Optional[str], timeout: float = 10.0) -> None:
        motorlib.wait_for(lambda: self.status_of(iid) == status, timeout,
                          what=f"instance {iid} -> {status} (now {self.status_of(iid)})")


# ---------------------------------------------------------------------------------------
# etcd


class Etcd:
    """etcd 3.4 on free loopback ports, fast elections, temporary data dir.

    tls: {"cert", "key", "ca"} (PEM paths) serves the client URL over https; with "ca",
    etcd requires client certificates signed by it (--client-cert-auth). The helper's own
    requests then present tls["client_cert"], tls["client_key"]."""

    def __init__(self, procs: motorlib.ProcRegistry, tls: Optional[dict] = None):
        self.dir = tempfile.mkdtemp(prefix="motor-etcd-")
        self.client_port = motorlib.free_port()
        self.peer_port = motorlib.free_port()
        scheme = "https" if tls else "http"
        cu = f"{scheme}://127.0.0.1:{self.client_port}"
        pu = f"http://127.0.0.1:{self.peer_port}"
        exe = shutil.which("etcd")
        if not exe:
            raise FileNotFoundError("etcd not installed (scripts/deps.sh installs etcd-server)")
        extra: list[str] = []
        self.ctx = None
        if tls:
            import ssl
            extra = ["--cert-file", tls["cert"], "--key-file", tls["key"]]
            if tls.get("ca"):
                extra += ["--client-cert-auth", "--trusted-ca-file", tls["ca"]]
            self.ctx = ssl.create_default_context(cafile=tls.get("ca_verify", tls.get("ca")))
            if tls.get("client_cert"):
                self.ctx.load_cert_chain(tls["client_cert"], tls["client_key"])
        self.proc = procs.start([exe, "--name", "t", "--data-dir", self.dir,
                                 "--listen-client-urls", cu, "--advertise-client-urls", cu,
                                 "--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
                                 "--initial-cluster", f"t={pu}",
                                 "--heartbeat-interval=10", "--election-timeout=100", *extra],
                                name="etcd")
        self.url = cu

        def ready() -> bool:
            if not self.proc.alive():
                raise motorlib.ProcessExited(self.proc.tail())
            try:
                st, body = call("GET", cu + "/health", timeout=1, ctx=self.ctx)
                return st == 200 and isinstance(body, dict) and body.get("health") == "true"
            except OSError:
                return False
        motorlib.wait_for(ready, 15, what="etcd health")

    def keys(self, prefix: str) -> dict[str, str]:
        import base64
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        st, body = call("POST", self.url + "/v3/kv/range",
                        {"key": base64.b64encode(prefix.encode()).decode(),
                         "range_end": base64.b64encode(end.encode()).decode()}, ctx=self.ctx)
        assert st == 200, body
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode()
                for kv in body.get("kvs", [])}

    def close(self) -> None:
        self.proc.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def etcd_available() -> bool:
    return shutil.which("etcd") is not None


def run_quiet(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)
