"""motor coordinator: configuration hot reload (issue 17) with traffic flowing.

* Live keys change while clients stream and post to model "m" all along — none of those
  requests fails or is cut: the scheduler (load_balance -> round_robin, seen in where a
  busy engine's share goes), the breaker (threshold and open period, seen on a flaky
  instance and in GET /instances), the first-token timeout (seen on a slow instance),
  retries, the inference API keys and the management key, the log level.
* A request in flight keeps the settings it started with: a stream begun under a long
  infer_timeout is not cut when a reload shortens it below the stream's length.
* An invalid file: nothing changes, the reason is logged. A restart-only key (workers,
  ports): named, its running value kept.
* TLS on the inference port: a certificate rotated in place reaches new connections;
  a stream open across the rotation completes.
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
from typing import Any, Optional

import motorlib
from coord_helpers import Coord, ext_instance, sim_served, stop_clean

REPO = motorlib.REPO
KEY1, KEY2 = "key-one-" + "x" * 16, "key-two-" + "y" * 16


def write(path: str, cfg: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(cfg, f)
    os.rename(tmp, path)


class Traffic(threading.Thread):
    """Requests to model "m" (streamed and not, alternately) with KEY1; every one must be
    a complete 200."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.stop_ev = threading.Event()
        self.ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        n = 0
        hdr = {"Authorization": f"Bearer {KEY1}"}
        while not self.stop_ev.is_set():
            n += 1
            try:
                if n % 2:
                    s = motorlib.SSEStream(self.url + "/v1/completions",
                                           {"model": "m", "prompt": "go", "max_tokens": 8,
                                            "stream": True}, timeout=15, headers=hdr)
                    if s.status != 200:
                        self.failures.append(f"stream {s.status} {s.error_body!r}")
                        continue
                    if len(s.all()) < 1:
                        self.failures.append("empty stream")
                        continue
                else:
                    r = motorlib.post(self.url + "/v1/completions",
                                      {"model": "m", "prompt": "go", "max_tokens": 4},
                                      timeout=15, headers=hdr)
                    if r.status != 200:
                        self.failures.append(f"post {r.status} {r.text[:200]}")
                        continue
                self.ok += 1
            except Exception as e:  # a cut stream, a refused connection
                self.failures.append(repr(e))

    def finish(self) -> None:
        self.stop_ev.set()
        self.join(30)


def breaker(c: Coord, iid: int) -> dict:
    for i in c.instances()["instances"]:
        if i["id"] == iid:
            return i["circuit_breaker"]
    raise AssertionError(f"instance {iid} missing")


def test_live_keys_with_traffic(procs, tmpdir_path):
    fast = [motorlib.start_sim(procs, "--model", "m", "--ttft-ms", "1", "--tokens-per-second",
                               "2000", name=f"fast{i}") for i in range(2)]
    slow = motorlib.start_sim(procs, "--model", "slow", "--ttft-ms", "1500", name="slow")
    flaky = motorlib.start_sim(procs, "--model", "flaky", "--ttft-ms", "1", name="flaky")
    lb = [motorlib.start_sim(procs, "--model", "lb", "--ttft-ms", "1", "--tokens-per-second",
                             "20", name=f"lb{i}") for i in range(2)]
    cfg = {"motor_coordinator_config": {
        "scheduler_config": {"scheduler_type": "load_balance"},
        "exception_config": {"max_retry": 0, "retry_delay": 0.05,
                             "circuit_breaker_failure_threshold": 3,
                             "circuit_breaker_open_timeout": 30},
        "timeout_config": {"first_token_timeout": 10, "infer_timeout": 30},
        "api_key_config": {"enable_api_key": True, "api_keys": [KEY1]},
        "logging_config": {"log_level": "INFO"}}}
    path = os.path.join(tmpdir_path, "user_config.json")
    write(path, cfg)
    p = procs.motor("coordinator", "--config", path, "--port", 0, "--mgmt-port", 0,
                    "--workers", 2, name="coordinator")
    ev = p.wait_event("coordinator_listening", timeout=15)
    c = Coord(p, int(ev["infer_port"]), int(ev["mgmt_port"]))
    body = {"event": "set", "instances": [
        ext_instance(1, "union", fast[0], model_name="m"),
        ext_instance(2, "union", fast[1], model_name="m"),
        ext_instance(3, "union", slow, model_name="slow"),
        ext_instance(4, "union", flaky, model_name="flaky"),
        ext_instance(6, "union", lb[0], model_name="lb"),
        ext_instance(7, "union", lb[1], model_name="lb")]}
    assert c.refresh(body).status == 200
    auth = {"Authorization": f"Bearer {KEY1}"}
    traffic = Traffic(c.url)
    traffic.start()
    n_reload = 0

    def reload(mutate) -> dict:
        nonlocal n_reload
        mutate(cfg["motor_coordinator_config"])
        write(path, cfg)
        got = p.wait_event("config_reloaded", after=n_reload, timeout=10)
        n_reload = len(p.find_events("config_reloaded"))
        return got

    try:
        motorlib.wait_for(lambda: traffic.ok >= 10, 20, what="traffic flowing")
        # -- the breaker: threshold 3, so one failure on the flaky instance does not open it
        assert flaky.fault("error").status == 200
        r = c.completion(model="flaky", prompt="x", max_tokens=2, headers=auth)
        assert r.status == 500, r
        assert breaker(c, 4)["state"] == "closed"
        ev = reload(lambda m: m["exception_config"].update(
            {"circuit_breaker_failure_threshold": 1, "circuit_breaker_open_timeout": 7}))
        assert "exception_config.circuit_breaker_failure_threshold" in ev["changed"]
        assert ev["breaker_threshold"] == 1
        assert breaker(c, 1)["current_timeout"] == 7  # every breaker got the new base
        r = c.completion(model="flaky", prompt="x", max_tokens=2, headers=auth)
        assert r.status == 500, r
        motorlib.wait_for(lambda: breaker(c, 4)["state"] == "open", 5, what="the breaker opens")
        assert flaky.fault("recover").status == 200

        # -- the first-token timeout: the slow instance answers after 1.5 s
        assert c.completion(model="slow", prompt="x", max_tokens=2, headers=auth).status == 200
        ev = reload(lambda m: m["timeout_config"].update({"first_token_timeout": 0.5}))
        assert ev["first_token_timeout_ms"] == 500
        t0 = time.monotonic()
        r = c.completion(model="slow", prompt="x", max_tokens=2, headers=auth)
        assert r.status == 504 and time.monotonic() - t0 < 1.4, (r, time.monotonic() - t0)
        reload(lambda m: m["timeout_config"].update({"first_token_timeout": 10}))

        # -- a request keeps its settings: a 3 s stream started under infer_timeout 30 goes
        # on when a reload sets 1.5 s; the next one is cut at 1.5 s
        def long_stream() -> motorlib.SSEStream:
            st = motorlib.SSEStream(c.url + "/v1/completions",
                                    {"model": "lb", "prompt": "long", "max_tokens": 60,
                                     "stream": True, "ignore_eos": True}, timeout=20,
                                    headers=auth)
            assert st.status == 200
            return st
        s = long_stream()
        it = s.raw_events()
        next(it)
        reload(lambda m: m["timeout_config"].update({"infer_timeout": 1.5}))
        rest = list(it)
        assert rest[-1] == "[DONE]" and len(rest) >= 50, rest[-3:]
        t0 = time.monotonic()
        cut = list(long_stream().raw_events())
        assert "infer_timeout" in cut[-1] and time.monotonic() - t0 < 2.5, cut[-1:]
        reload(lambda m: m["timeout_config"].update({"infer_timeout": 30}))

        # -- the scheduler: a long stream keeps one "lb" engine loaded; load_balance sends
        # the short requests to the other, round_robin alternates
        def fewest_served(n: int = 16) -> float:
            before = [sim_served(x) for x in lb]
            hold = motorlib.SSEStream(c.url + "/v1/completions",
                                      {"model": "lb", "prompt": "hold", "max_tokens": 200,
                                       "stream": True, "ignore_eos": True}, timeout=30,
                                      headers=auth)
            events = hold.raw_events()  # kept: dropping the generator closes the stream
            next(events)  # in flight now
            for _ in range(n):
                assert c.completion(model="lb", prompt="q", max_tokens=1,
                                    headers=auth).status == 200
            events.close()
            hold.close()
            return min(sim_served(x) - b for x, b in zip(lb, before))
        assert fewest_served() == 0
        ev = reload(lambda m: m["scheduler_config"].update({"scheduler_type": "round_robin"}))
        assert ev["scheduler"] == "round_robin"
        # (the rotation counter is shared with the traffic: an uneven split, never none)
        assert fewest_served() >= 2

        # -- retries: max_retry 0 -> 2 (a dead instance is skipped for the request)
        ev = reload(lambda m: m["exception_config"].update({"max_retry": 2}))
        assert ev["max_retry"] == 2

        # -- keys: a second inference key, a management key; log level DEBUG
        keyfile = os.path.join(tmpdir_path, "mgmt.key")
        with open(keyfile, "w") as f:
            f.write("mgmt-secret\n")
        assert c.instances()["count"] == 6  # no management key yet
        ev = reload(lambda m: m.update({
            "api_key_config": {"enable_api_key": True, "api_keys": [KEY1, KEY2]},
            "mgmt_api_key_config": {"enable_api_key": True, "api_key_file": keyfile},
            "logging_config": {"log_level": "DEBUG"}}))
        assert ev["mgmt_api_key"] is True and ev["log_level"] == "DEBUG"
        assert c.completion(model="m", prompt="q", max_tokens=1,
                            headers={"Authorization": f"Bearer {KEY2}"}).status == 200
        assert c.completion(model="m", prompt="q", max_tokens=1).status == 401
        assert motorlib.get(c.mgmt + "/instances").status == 401
        assert c.instances(key="mgmt-secret")["count"] == 6
        motorlib.wait_for(lambda: p.find_events("http_request"), 5, what="a debug line")

        # -- invalid: nothing changes
        n_fail = len(p.find_events("config_reload_failed"))
        bad = json.loads(json.dumps(cfg))
        bad["motor_coordinator_config"]["exception_config"]["max_retry"] = -3
        write(path, bad)
        ev = p.wait_event("config_reload_failed", after=n_fail, timeout=10)
        assert "max_retry" in ev["detail"] and "keeping" in ev["action"]
        assert c.instances(key="mgmt-secret")["count"] == 6

        # -- restart-only keys: named, kept
        n_rr = len(p.find_events("config_reload_restart_required"))
        # (num_workers is pinned by --workers: the command line wins, nothing to report)
        reload(lambda m: m.update({"inference_workers_config": {"num_workers": 5},
                                   "api_config": {"max_request_body_bytes": 4096,
                                                  "coordinator_api_host": "0.0.0.0"}}))
        ev = p.wait_event("config_reload_restart_required", after=n_rr, timeout=10)
        assert set(ev["settings"].split(",")) == {"api_config.max_request_body_bytes",
                                                  "api_config.coordinator_api_host"}
        big = "word " * 2000  # above 4096 bytes: still accepted (the old cap is kept)
        assert c.completion(model="m", prompt=big, max_tokens=1, headers=auth).status == 200

        # -- SIGHUP with nothing changed: a no-op
        p.signal(signal.SIGHUP)
        p.wait_event("config_unchanged", timeout=5)
        motorlib.wait_for(lambda: traffic.ok >= 40, 30, what="more traffic")
    finally:
        traffic.finish()
    assert traffic.failures == [], traffic.failures[:5]
    assert p.alive()
    stop_clean(c)  # exit 0, no sanitizer report (every replaced config released)


def test_tls_rotated_in_place_keeps_open_streams(procs, tmpdir_path):
    d = os.path.join(tmpdir_path, "pki")
    subprocess.run(["bash", str(REPO / "tests" / "fixtures" / "mkcerts.sh"), d], check=True,
                   capture_output=True, timeout=120)
    live_cert, live_key = os.path.join(tmpdir_path, "tls.crt"), os.path.join(tmpdir_path, "tls.key")
    shutil.copy(os.path.join(d, "srv.crt"), live_cert)
    shutil.copy(os.path.join(d, "srv.key"), live_key)
    sim = motorlib.start_sim(procs, "--model", "m", "--ttft-ms", "1", "--tokens-per-second",
                             "40", name="sim")
    cfg = {"motor_coordinator_config": {},
           "motor_deploy_config": {"tls_config": {"infer_tls_config": {
               "enable_tls": True, "cert_file": live_cert, "key_file": live_key,
               "engine_tls": False}}}}  # the simulator behind it is plain HTTP
    path = os.path.join(tmpdir_path, "user_config.json")
    write(path, cfg)
    p = procs.motor("coordinator", "--config", path, "--port", 0, "--mgmt-port", 0,
                    "--workers", 2, name="coordinator")
    ev = p.wait_event("coordinator_listening", timeout=15)
    c = Coord(p, int(ev["infer_port"]), int(ev["mgmt_port"]))
    assert c.refresh({"event": "set", "model_name": "m",
                      "instances": [ext_instance(1, "union", sim)]}).status == 200

    def ctx(ca: str) -> ssl.SSLContext:
        x = ssl.create_default_context(cafile=os.path.join(d, ca))
        x.check_hostname = False
        return x

    # a stream opened before the rotation: ~1.5 s of tokens
    conn = http.client.HTTPSConnection("127.0.0.1", c.infer_port, context=ctx("ca.crt"),
                                       timeout=20)
    conn.request("POST", "/v1/completions",
                 json.dumps({"model": "m", "prompt": "p", "max_tokens": 60, "stream": True,
                             "ignore_eos": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    first = resp.readline()
    assert first.startswith(b"data: ")
    old_der = conn.sock.getpeercert(binary_form=True)
    n = len(p.find_events("tls_reloaded"))
    for src, dst in (("other-srv.key", live_key), ("other-srv.crt", live_cert)):
        shutil.copy(os.path.join(d, src), dst + ".new")
        os.rename(dst + ".new", dst)
    # the two workers and nothing else (management has no TLS here)
    motorlib.wait_for(lambda: len(p.find_events("tls_reloaded")) >= n + 2, 10,
                      what="both workers reloaded")
    rest = resp.read()
    assert rest.rstrip().endswith(b"data: [DONE]"), rest[-200:]
    assert conn.sock is None or True
    conn.close()
    # new connections: the new certificate (the old CA no longer verifies it)
    new = http.client.HTTPSConnection("127.0.0.1", c.infer_port, context=ctx("other-ca.crt"),
                                      timeout=10)
    new.request("GET", "/health")
    r = new.getresponse()
    r.read()
    assert r.status == 200
    assert new.sock.getpeercert(binary_form=True) != old_der
    new.close()
    try:
        bad = http.client.HTTPSConnection("127.0.0.1", c.infer_port, context=ctx("ca.crt"),
                                          timeout=10)
        bad.request("GET", "/health")
        bad.getresponse()
        raise AssertionError("the old CA still verifies the new certificate")
    except ssl.SSLError:
        pass
    stop_clean(c)
