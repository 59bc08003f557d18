"""motor controller: configuration hot reload (issue 17), the node manager's way.

* Every live key with traffic running: node managers heartbeating, a client reading the
  instance table all along — the intervals (daemon loop, instance manager, coordinator
  heartbeat), the heartbeat timeout, the coordinator's address, the fault-tolerance
  switch and the log level change by a rename over the file, an edit in place or SIGHUP,
  and no request fails.
* An invalid file: the running configuration stays and the reason is logged.
* A restart-only key: named in config_reload_restart_required, its old value kept (the
  API still listens where it did).
* TLS: a certificate rotated in place (same paths) is picked up by new connections while
  an open keep-alive connection goes on with the old one.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
from typing import Any

import motorlib
from ctl_fakes import Controller, FakeCoordinator, FakeNM, call, controller_config

REPO = motorlib.REPO


class CountingCoordinator(FakeCoordinator):
    """A fake coordinator that also timestamps the controller's /liveness heartbeats."""

    def __init__(self) -> None:
        self.beats: list[float] = []
        super().__init__()

    def _handle(self, method: str, path: str, body: Any):
        if path == "/liveness":
            with self.lock:
                self.beats.append(time.monotonic())
        return super()._handle(method, path, body)

    def gaps(self, n: int, timeout: float = 15.0) -> list[float]:
        """Gaps between the next n+1 heartbeats."""
        with self.lock:
            start = len(self.beats)
        motorlib.wait_for(lambda: len(self.beats) >= start + n + 1, timeout,
                          what=f"{n + 1} coordinator heartbeats")
        with self.lock:
            b = self.beats[start:start + n + 1]
        return [y - x for x, y in zip(b, b[1:])]


def rewrite(path: str, mutate) -> None:
    """Load, mutate, write next to it and rename over (what editors and tools do)."""
    with open(path) as f:
        cfg = json.load(f)
    mutate(cfg)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cfg, f)
    os.rename(tmp, path)


class Reader(threading.Thread):
    """Reads /controller/instances and /readiness in a loop: every answer must be 200."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.stop_ev = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop_ev.is_set():
            for path in ("/controller/instances", "/readiness"):
                try:
                    st, body = call("GET", self.url + path, timeout=5)
                except Exception as e:  # a refused or dropped connection is a failure
                    self.failures.append(f"{path}: {e!r}")
                    continue
                if st == 200:
                    self.ok += 1
                else:
                    self.failures.append(f"{path}: {st} {body}")
            time.sleep(0.01)

    def finish(self) -> None:
        self.stop_ev.set()
        self.join(10)


def test_live_keys_with_traffic(procs, tmpdir_path):
    a, b = CountingCoordinator(), CountingCoordinator()
    nms: list[FakeNM] = []
    reader = None
    try:
        path = controller_config(tmpdir_path, a.port,
                                 event={"coordinator_heartbeat_interval": 0.3},
                                 extra={"daemon_loop_interval": 5})
        c = Controller(procs, path)
        nms = [FakeNM(f"job-{k}", role="union", ports=(11000 + k,)) for k in range(2)]
        for nm in nms:
            assert nm.register(c.url)[0] == 200
        motorlib.wait_for(lambda: all(nm.start_cmd for nm in nms), 10, what="start commands")
        for nm in nms:
            nm.set_all("normal")
            nm.start_heartbeats(lambda: c.url, interval=0.1)
        motorlib.wait_for(lambda: all(c.status_of(nm.instance_id) == "active" for nm in nms),
                          15, what="both instances active")
        reader = Reader(c.url)
        reader.start()
        assert max(a.gaps(3)) < 0.6

        # 1. a rename over the file: periods, the heartbeat timeout, the log level
        n = len(c.proc.find_events("config_reloaded"))

        def first(cfg):
            m = cfg["motor_controller_config"]
            m["event_config"]["coordinator_heartbeat_interval"] = 1.2
            m["instance_config"]["instance_manager_check_interval"] = 0.05
            m["instance_config"]["instance_heartbeat_timeout"] = 1.0
            m["daemon_loop_interval"] = 0.1
            m["logging_config"] = {"log_level": "DEBUG"}
        rewrite(path, first)
        ev = c.proc.wait_event("config_reloaded", after=n, timeout=10)
        changed = set(ev["changed"].split(","))
        assert {"event_config.coordinator_heartbeat_interval",
                "instance_config.instance_manager_check_interval",
                "instance_config.instance_heartbeat_timeout", "daemon_loop_interval",
                "logging_config.log_level"} <= changed, changed
        assert ev["daemon_loop_interval_ms"] == 100 and ev["log_level"] == "DEBUG"
        assert not c.proc.find_events("config_reload_restart_required")
        gaps = a.gaps(2)
        assert min(gaps) > 0.9, gaps
        # the debug level: the API now logs each request it serves
        call("GET", c.url + "/controller/instances")
        motorlib.wait_for(lambda: c.proc.find_events("http_request"), 5, what="a debug line")
        # the new heartbeat timeout: a silent node manager is noticed after ~1 s, not 3
        silent = nms[1]
        silent.stop_heartbeats()
        t0 = time.monotonic()
        c.wait_status(silent.instance_id, "inactive", timeout=10)
        assert time.monotonic() - t0 < 2.5
        silent.start_heartbeats(lambda: c.url, interval=0.1)

        # 2. an edit in place, then SIGHUP (a second, harmless trigger): the coordinator
        # moves to b, which gets the whole set; fault tolerance goes off
        n = len(c.proc.find_events("config_reloaded"))
        with open(path) as f:
            cfg = json.load(f)
        cfg["motor_coordinator_config"]["api_config"]["coordinator_api_mgmt_port"] = b.port
        cfg["motor_controller_config"]["event_config"]["coordinator_heartbeat_interval"] = 0.3
        cfg["motor_controller_config"]["fault_tolerance_config"]["enable_fault_tolerance"] = False
        with open(path, "w") as f:
            json.dump(cfg, f)
        ev = c.proc.wait_event("config_reloaded", after=n, timeout=10)
        c.proc.signal(signal.SIGHUP)
        c.proc.wait_event("config_reload_signal", timeout=5)
        motorlib.wait_for(lambda: any(e == "set" for e, _ in b.events()), 10,
                          what="a full set to the new coordinator")
        assert max(b.gaps(3)) < 0.6
        st, body = nms[0].report(c.url, 0, 1)
        assert st == 200 and body["message"] == "Fault tolerance is not enabled", body
        assert not body["data"].get("accepted"), body

        # 3. invalid: the running configuration stays, the reason is logged
        n_fail = len(c.proc.find_events("config_reload_failed"))
        rewrite(path, lambda cfg: cfg["motor_controller_config"]["instance_config"].update(
            {"instance_manager_check_interval": "fast"}))
        ev = c.proc.wait_event("config_reload_failed", after=n_fail, timeout=10)
        assert "instance_manager_check_interval" in ev["detail"], ev
        assert "keeping" in ev["action"]
        assert max(b.gaps(3)) < 0.6  # still the 0.3 s heartbeat

        # 4. a restart-only key: named, its running value kept
        n_rr = len(c.proc.find_events("config_reload_restart_required"))

        def restart_only(cfg):
            m = cfg["motor_controller_config"]
            m["instance_config"]["instance_manager_check_interval"] = 0.1
            m["api_config"]["observability_api_port"] = 1
            m["store_config"]["sqlite_path"] = os.path.join(tmpdir_path, "elsewhere.db")
        rewrite(path, restart_only)
        ev = c.proc.wait_event("config_reload_restart_required", after=n_rr, timeout=10)
        keys = set(ev["settings"].split(","))
        assert keys == {"api_config.observability_api_port", "store_config.sqlite_path"}, keys
        assert not os.path.exists(os.path.join(tmpdir_path, "elsewhere.db"))
        assert call("GET", c.url + "/readiness")[0] == 200

        reader.finish()
        assert reader.failures == [], reader.failures[:5]
        assert reader.ok > 50
        for nm in nms:
            nm.stop_heartbeats()
            assert nm.hb_errors == [], nm.hb_errors[:5]
        assert c.proc.alive()
        assert c.proc.stop(15) == 0, c.proc.tail()  # no sanitizer report at exit
        assert "Sanitizer" not in c.proc.output()
    finally:
        if reader:
            reader.finish()
        for nm in nms:
            nm.close()
        a.close()
        b.close()


def mkcerts(d: str) -> dict:
    """The test PKI: the CA's server certificate, and another CA's (the rotation)."""
    subprocess.run(["bash", str(REPO / "tests" / "fixtures" / "mkcerts.sh"), d], check=True,
                   capture_output=True, timeout=120)
    j = lambda f: os.path.join(d, f)  # noqa: E731
    return {"first": {"ca": j("ca.crt"), "cert": j("srv.crt"), "key": j("srv.key")},
            "second": {"ca": j("other-ca.crt"), "cert": j("other-srv.crt"),
                       "key": j("other-srv.key")}}


def test_tls_certificate_rotated_in_place(procs, tmpdir_path):
    """The API's certificate is replaced in the same files: a new connection sees the new
    one; a keep-alive connection opened before goes on serving requests."""
    pki = mkcerts(os.path.join(tmpdir_path, "pki"))
    certs, second = pki["first"], pki["second"]
    live = {k: os.path.join(tmpdir_path, f"live-{k}.pem") for k in ("cert", "key")}
    shutil.copy(certs["cert"], live["cert"])
    shutil.copy(certs["key"], live["key"])
    tls = {"enable_tls": True, "cert_file": live["cert"], "key_file": live["key"]}
    a = FakeCoordinator()
    try:
        path = controller_config(tmpdir_path, a.port, extra={"mgmt_tls_config": tls},
                                 event={"coordinator_push": False})
        c = Controller(procs, path, wait_ready=False)
        c.proc.wait_event("controller_ready", timeout=15)

        def connect(ca: str) -> http.client.HTTPSConnection:
            ctx = ssl.create_default_context(cafile=ca)
            ctx.check_hostname = False
            conn = http.client.HTTPSConnection("127.0.0.1", c.port, context=ctx, timeout=5)
            conn.request("GET", "/liveness")
            r = conn.getresponse()
            r.read()
            assert r.status == 200
            return conn

        old = connect(certs["ca"])
        der_old = old.sock.getpeercert(binary_form=True)
        n = len(c.proc.find_events("tls_reloaded"))
        # cert-manager's way: new content in the same files (key first, then the cert)
        shutil.copy(second["key"], live["key"] + ".new")
        os.rename(live["key"] + ".new", live["key"])
        shutil.copy(second["cert"], live["cert"] + ".new")
        os.rename(live["cert"] + ".new", live["cert"])
        c.proc.wait_event("tls_reloaded", after=n, timeout=10)
        c.proc.wait_event("config_reloaded", timeout=10)
        # the open connection: still served, still the old certificate
        for _ in range(3):
            old.request("GET", "/liveness")
            r = old.getresponse()
            r.read()
            assert r.status == 200
        assert old.sock.getpeercert(binary_form=True) == der_old
        # a new connection: the new certificate, verified by the new CA (not the old one)
        new = connect(second["ca"])
        assert new.sock.getpeercert(binary_form=True) != der_old
        try:
            connect(certs["ca"])
            raise AssertionError("the old CA still verifies the new certificate")
        except ssl.SSLError:
            pass
        old.close()
        new.close()
        assert c.proc.stop(15) == 0, c.proc.tail()
        assert "Sanitizer" not in c.proc.output()
    finally:
        a.close()
