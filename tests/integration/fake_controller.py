"""fake_controller — a small stand-in for the Motor Controller, plus node-manager helpers.

``FakeController`` is an HTTP(S) server on 127.0.0.1 (ephemeral port, threads) that
records every request (method, path, parsed JSON body, arrival time) and answers the four
node-manager routes of the Controller protocol (spec §5):

* ``POST /controller/register``               → 200 ``{"result": 0}``
* ``POST /controller/reregister``             → 200 ``{"result": 0}``
* ``POST /controller/heartbeat``              → 200 ``{"result": [true, 200]}``
* ``POST /controller/report_software_fault``  → 200 envelope with ``data.accepted = true``

Behaviour per path can be changed while running with ``set(path, ...)``: another status
and body (``status=503``, ``body={"error": "x"}``, ``accepted=False``), a ``hang`` (the
handler holds the request until ``release()``/``close()``), and a count (``times=2``: only
the next two requests, then back to the previous behaviour).

Node-manager helpers (shared by the ``test_nm_*`` files and ``bench/nm_*``):
``nm_config()`` builds a user_config.json dict with short test intervals,
``write_json()``, ``start_nm()`` starts ``motor node-manager`` and returns an ``NM``
handle (API URL, log events, engines), ``start_body()`` builds a StartCmdMsg, and
``free_port_run()`` finds a run of free ports ``base, base+2, ...`` for engines.

Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Optional

import motorlib

HERE = Path(__file__).resolve().parent
FAKEBIN = HERE / "fakebin"

ROUTES = ("/controller/register", "/controller/reregister", "/controller/heartbeat",
          "/controller/report_software_fault")


class Rec:
    """One recorded request."""

    def __init__(self, method: str, path: str, headers: dict, raw: bytes, t: float,
                 peer: tuple = ("", 0)):
        self.method = method
        self.peer = peer  # (host, port) of the client connection: keep-alive reuses it
        self.path = path
        self.headers = headers
        self.raw = raw
        self.t = t  # time.monotonic() when the body was read
        try:
            self.body = json.loads(raw) if raw else None
        except ValueError:
            self.body = None

    def __repr__(self) -> str:
        return f"<Rec {self.method} {self.path} {self.raw[:200]!r}>"


class _Rule:
    def __init__(self, status: int, body: Any, hang: bool, times: Optional[int],
                 delay: float):
        self.status = status
        self.body = body
        self.hang = hang
        self.times = times
        self.delay = delay


def _default_body(path: str) -> Any:
    if path == "/controller/heartbeat":
        return {"result": [True, 200]}
    if path == "/controller/report_software_fault":
        return {"code": 200, "message": "Software fault reported successfully",
                "data": {"accepted": True}}
    return {"result": 0}


class FakeController:
    def __init__(self, tls: Optional[ssl.SSLContext] = None):
        self.requests: list[Rec] = []
        self._cond = threading.Condition()
        self._rules: dict[str, list[_Rule]] = {}
        self._release = threading.Event()
        ctl = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the NM's heartbeat client expects

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                rec = Rec(self.command, self.path.split("?")[0],
                          {k.lower(): v for k, v in self.headers.items()}, raw,
                          time.monotonic(), tuple(self.client_address[:2]))
                rule = ctl._take_rule(rec.path)
                with ctl._cond:
                    ctl.requests.append(rec)
                    ctl._cond.notify_all()
                if rule and rule.hang:
                    ctl._release.wait(120)
                    self.close_connection = True
                    return
                if rule and rule.delay:
                    time.sleep(rule.delay)
                if rule:
                    status, body = rule.status, rule.body
                elif rec.path in ROUTES:
                    status, body = 200, _default_body(rec.path)
                else:
                    status, body = 404, {"detail": "Not Found"}
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.scheme = "https" if tls else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    # -- behaviour ------------------------------------------------------------------------

    def set(self, path: str, status: int = 200, body: Any = None, hang: bool = False,
            times: Optional[int] = None, accepted: Optional[bool] = None,
            delay: float = 0.0) -> None:
        """Change how `path` is answered. accepted=False/True shapes the fault-report
        envelope; times=N applies to the next N requests only (then the previous rule)."""
        if body is None:
            if accepted is not None:
                body = {"code": 200, "message": "Software fault reported",
                        "data": {"accepted": accepted}}
            else:
                body = _default_body(path)
        rule = _Rule(status, body, hang, times, delay)
        with self._cond:
            self._rules.setdefault(path, []).append(rule)

    def reset(self, path: str) -> None:
        with self._cond:
            self._rules.pop(path, None)

    def _take_rule(self, path: str) -> Optional[_Rule]:
        with self._cond:
            stack = self._rules.get(path)
            while stack:
                rule = stack[-1]
                if rule.times is None:
                    return rule
                if rule.times > 0:
                    rule.times -= 1
                    if rule.times == 0:
                        stack.pop()
                    return rule
                stack.pop()
            return None

    def release(self) -> None:
        """Let hanging handlers go (they close their connection without answering)."""
        self._release.set()

    # -- inspection -----------------------------------------------------------------------

    def of(self, path: str) -> list[Rec]:
        with self._cond:
            return [r for r in self.requests if r.path == path]

    def count(self, path: str) -> int:
        return len(self.of(path))

    def wait_request(self, path: str, pred: Optional[Callable[[Rec], bool]] = None,
                     timeout: float = 10.0, after: int = 0) -> Rec:
        """The (after+1)-th request to `path` matching pred; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [r for r in self.requests
                         if r.path == path and (pred is None or pred(r))]
                if len(found) > after:
                    return found[after]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no request #{after + 1} to {path} within {timeout}s; "
                                       f"got {[r.path for r in self.requests][-20:]}")
                self._cond.wait(min(left, 0.1))

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeController":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# node-manager helpers


def free_port_run(n: int, step: int = 2, host: str = "127.0.0.1") -> int:
    """A base port such that base, base+step, ... (n ports) are all free right now."""
    for _ in range(200):
        base = motorlib.free_port(host)
        if base + step * n > 65000:
            continue
        if all(motorlib.port_is_free(base + step * i, host) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports found")


def nm_config(*, job: str = "job1", role: str = "union", engine_type: str = "sim",
              engine_config: Optional[dict] = None, nm: Optional[dict] = None,
              basic: Optional[dict] = None, ft: Optional[dict] = None,
              health: Optional[dict] = None, controller_port: int = 1,
              controller_ft: Optional[dict] = None, base_port: Optional[int] = None,
              endpoints: int = 1, top: Optional[dict] = None) -> dict:
    """A user_config.json for one node manager with test-sized intervals.

    nm: extra keys merged into motor_nodemanger_config (restart_policy, standalone, ...);
    basic/ft: merged into its basic_config/fault_tolerance_config; health: the engine
    section's health_check_config; top: extra top-level blocks."""
    if base_port is None:
        base_port = free_port_run(endpoints)
    ec = {"model": "demo", "load_seconds": 0.2}
    ec.update(engine_config or {})
    if int(ec.get("data_parallel_size", 1)) > 1 and "data_parallel_rpc_port" not in ec:
        # DP engines (the simulator too) meet on the master's RPC port: the default 9000
        # would make concurrent tests join each other's groups.
        ec["data_parallel_rpc_port"] = motorlib.free_port()
    b = {"job_name": job, "heartbeat_interval_seconds": 0.2, "daemon_loop_interval": 0.5}
    b.update(basic or {})
    f = {"engine_restart_wait_timeout_sec": 60, "container_restart_managed": True}
    f.update(ft or {})
    h = {"health_collector_timeout": 1, "startup_timeout": 30}
    h.update(health or {})
    block = {
        "api_config": {"pod_ip": "127.0.0.1", "node_manager_port": 1026},
        "endpoint_config": {"base_port": base_port},
        "basic_config": b,
        "fault_tolerance_config": f,
        "stop_grace_seconds": 2,
    }
    block.update(nm or {})
    cfg = {
        "motor_controller_config": {
            "api_config": {"controller_api_dns": "127.0.0.1",
                           "controller_api_port": controller_port},
            "fault_tolerance_config": dict(controller_ft or {}),
        },
        f"motor_engine_{role}_config": {
            "engine_type": engine_type,
            "engine_config": ec,
            "health_check_config": h,
            "motor_nodemanger_config": block,
        },
    }
    cfg.update(top or {})
    return cfg


def write_json(path: str, obj: Any) -> str:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
    return path


class NM:
    """A running node manager: its Proc, port, and API helpers."""

    def __init__(self, proc: motorlib.Proc, port: int, scheme: str = "http"):
        self.proc = proc
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"

    def __getattr__(self, name: str) -> Any:  # nm.wait_event(...), nm.pid, ...
        return getattr(self.proc, name)

    def get(self, path: str, **kw: Any) -> motorlib.Response:
        return motorlib.get(self.url + path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> motorlib.Response:
        return motorlib.post(self.url + path, body, **kw)

    def engines(self) -> dict:
        r = self.get("/node-manager/engines")
        assert r.status == 200, r
        return r.json()

    def endpoint(self, i: int = 0) -> dict:
        return self.engines()["endpoints"][i]

    def status(self, relaxed: bool = False) -> bool:
        r = self.get("/node-manager/status" + ("?relaxed=true" if relaxed else ""))
        assert r.status == 200, r
        return r.json()["status"]

    def wait_ready(self, timeout: float = 20.0) -> dict:
        """Wait until every endpoint reports `normal`; the engines view."""
        def ready() -> Any:
            e = self.engines()
            eps = e["endpoints"]
            return e if eps and all(x["status"] == "normal" for x in eps) else None
        return motorlib.wait_for(ready, timeout, interval=0.05, what="endpoints normal")


def start_nm(procs: motorlib.ProcRegistry, cfg_path: str, *, role: str = "union",
             env: Optional[dict] = None, args: tuple = (), name: str = "node-manager",
             state_file: Optional[str] = None, scheme: str = "http", **kw: Any) -> NM:
    """Start `motor node-manager --config cfg_path --port 0` and wait until it listens."""
    extra = {"ROLE": role}
    extra.update(env or {})
    if state_file is None:
        state_file = os.path.join(os.path.dirname(cfg_path), f"nm-state-{time.monotonic_ns()}.json")
    p = procs.motor("node-manager", "--config", cfg_path, "--port", "0", "--state-file",
                    state_file, *args, name=name, extra_env=extra, **kw)
    ev = p.wait_event("nm_listening", timeout=15)
    return NM(p, int(ev["port"]), scheme)


def start_body(cfg: dict, *, role: str = "union", instance_id: int = 1,
               job: Optional[str] = None, ip: str = "127.0.0.1",
               endpoints: Optional[int] = None, **extra: Any) -> dict:
    """A StartCmdMsg for the node manager configured by cfg."""
    sec = cfg[f"motor_engine_{role}_config"]
    block = sec["motor_nodemanger_config"]
    base = block["endpoint_config"]["base_port"]
    n = endpoints
    if n is None:
        ec = sec.get("engine_config", {})
        n = int(ec.get("data_parallel_size", ec.get("dp_size", 1)))
    eps = [{"id": i, "ip": ip, "business_port": str(base + 2 * i), "status": "initial",
            "device_infos": [], "hb_timestamp": 1760000000.0,
            "workload": {"active_tokens": 0}, "headless": False} for i in range(n)]
    body = {"job_name": job if job is not None else block["basic_config"]["job_name"],
            "role": role, "instance_id": instance_id, "endpoints": eps,
            "master_dp_ip": ip, "node_rank": 0}
    body.update(extra)
    return body


def self_signed(dirpath: str, cn: str = "127.0.0.1") -> tuple[str, str]:
    """Generate a self-signed certificate (with SAN IP:127.0.0.1) and key with openssl;
    (cert_path, key_path)."""
    import subprocess
    cert = os.path.join(dirpath, "cert.pem")
    key = os.path.join(dirpath, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", f"/CN={cn}",
                    "-addext", f"subjectAltName=IP:{cn}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return cert, key


def port_listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        try:
            s.connect((host, port))
            return True
        except OSError:
            return False
