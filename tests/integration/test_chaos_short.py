"""The chaos suite's short run (part of `make test`; `make chaos` runs the long one).

* ``test_chaos_short``: tests/chaos/chaos.py --short — a controller-driven fleet (SQLite
  store), the two-coordinator one (etcd store, master and standby behind a Service
  stand-in) and a standalone one (node managers, simulated engines with worker children,
  controller, coordinators), random SIGKILL/SIGSTOP of every kind of process plus network
  partitions between node managers and the controller, a client sending requests all
  along; it must report zero violations, have injected and recovered faults of most
  kinds, and leave no process, port or namespace behind.
* The checkers themselves must be able to fail: a planted orphan and a lasting zombie
  are reported, a socket is attributed to its owner, and the client flags a garbled 200,
  a wrong text, broken SSE framing and a stream whose text diverges — while a clean
  error, a cut stream and a correct answer pass.

Docs: docs/chaos.md.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import motorlib

REPO = Path(__file__).resolve().parents[2]
CHAOS = REPO / "tests" / "chaos"
sys.path.insert(0, str(CHAOS))

import chaos_fleet  # noqa: E402
from chaos_client import Client, Reference  # noqa: E402
from chaos_net import NoNet  # noqa: E402


def run_chaos(tmp_path, args: list[str], timeout: float) -> tuple[dict, str]:
    """tests/chaos/chaos.py with args (and --seed, --json): (report, output). Fails the test
    when it does not finish in time or reports a violation."""
    out = tmp_path / "report.json"
    # A fixed seed keeps `make test` reproducible; CHAOS_SEED=random (or a number) explores.
    raw = os.environ.get("CHAOS_SEED", "12")
    seed = int.from_bytes(os.urandom(4), "little") if raw == "random" else int(raw)
    argv = [sys.executable, str(CHAOS / "chaos.py"), *args, "--seed", str(seed),
            "--json", str(out)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "MOTOR_BIN": motorlib.motor_bin()},
                         start_new_session=True)
    try:
        text, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # the driver tears its fleet down on SIGTERM
        try:
            text, _ = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            text, _ = p.communicate()
        pytest.fail(f"chaos run (seed {seed}) did not finish in time\n{text[-6000:]}")
    print(text[-8000:])
    assert p.returncode == 0, f"chaos run failed (seed {seed}, rc {p.returncode}):\n{text[-8000:]}"
    rep = json.loads(out.read_text())
    assert rep["violations"] == []
    assert rep["recoveries"] == rep["faults_injected"], rep
    assert rep["requests"].get("violation", 0) == 0
    # nothing of the run is left: no process carrying its marker, no namespace or link
    assert chaos_fleet.marked_pids(rep["run_id"]) == []
    if rep["net"] == "netns":
        tag = f"mc{rep['run_id'][:6]}"
        ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        assert tag not in ns and tag not in links
    return rep, text


def test_chaos_short(tmp_path):
    rep, _ = run_chaos(tmp_path, ["--short"], 240)
    assert rep["faults_injected"] >= 10, rep
    assert len(rep["injected"]) >= 8, f"too few kinds of faults: {rep['injected']}"
    assert rep["requests"].get("ok", 0) >= 100, rep["requests"]
    # rounds of a single engine fault were checked for cut streams (none may be: they
    # are continued elsewhere, issue 19)
    assert rep["engine_fault_rounds_streams_checked"] >= 1, rep


# ---------------------------------------------------------------------------------------
# the checkers can fail


def _spawn_marked(code: str, run_id: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code],
                            env={**os.environ, chaos_fleet.MARK: run_id},
                            start_new_session=True)


def test_process_checks_report_orphans_and_zombies(tmp_path):
    run_id = f"selftest{os.getpid()}"
    fleet = chaos_fleet.Fleet("controller", run_id, tmp_path, NoNet(run_id))
    # an orphan: a marked grandchild whose parent exits at once (reparented away from us)
    pidfile = tmp_path / "orphan.pid"
    p = _spawn_marked(
        "import os,sys,time\n"
        "if os.fork():\n    os._exit(0)\n"
        f"open({str(pidfile)!r},'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n", run_id)
    p.wait(10)
    # a zombie: a marked child that never gets reaped by its (marked) parent
    z = _spawn_marked(
        "import os,time\n"
        "if os.fork()==0:\n    os._exit(0)\n"
        "time.sleep(60)\n", run_id)
    orphan = int(motorlib.wait_for(lambda: pidfile.exists() and pidfile.read_text(), 10,
                                   what="orphan pid"))
    try:
        motorlib.wait_for(lambda: chaos_fleet.zombies_of({z.pid}), 10, what="the zombie")
        first = fleet.process_violations(killed=[])
        assert any(f"orphan {orphan}" in v for v in first), first
        time.sleep(3.3)  # zombies count only when they stay
        second = fleet.process_violations(killed=[z.pid])
        assert any("zombie" in v for v in second), second
        # a "killed" process that is in fact alive is reported too
        assert any(f"killed process {orphan} still alive" in v
                   for v in fleet.process_violations(killed=[orphan])), "killed check"
    finally:
        os.kill(orphan, signal.SIGKILL)
        z.kill()
        z.wait(10)
    motorlib.wait_for(lambda: not [q for q in chaos_fleet.marked_pids(run_id)
                                   if (chaos_fleet.proc_stat(q) or ("X",))[0] not in "ZX"],
                      10, what="planted processes gone")


def test_socket_owner_lookup():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        inodes = chaos_fleet.listen_inodes(os.getpid(), port)
        assert inodes
        assert chaos_fleet.socket_owners(inodes, [os.getpid()]) == {os.getpid()}
    assert chaos_fleet.listen_inodes(os.getpid(), port) == set()


class _Fake:
    """An HTTP server answering /v1/completions with whatever `mode` says."""

    REF = "alpha beta gamma"

    def __init__(self) -> None:
        self.mode = "ok"
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n))
                stream = body.get("stream") and self.server is outer.front.httpd_ref
                m = outer.mode if self.server is outer.front.httpd_ref else "ok"
                if m == "http_error":
                    data = b'{"error":{"message":"no instance","code":503}}'
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if stream:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    words = outer.REF.split(" ")
                    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
                    if m == "stream_wrong":
                        pieces[1] = " BETA"
                    for i, piece in enumerate(pieces):
                        if m == "stream_cut" and i == 2:
                            self.wfile.write(b"data: {\"choi")  # cut mid-event
                            return
                        fin = "length" if i == len(pieces) - 1 else None
                        ev = {"choices": [{"index": 0, "text": piece, "finish_reason": fin}]}
                        if m == "stream_framing" and i == 1:
                            self.wfile.write(b"dat: " + json.dumps(ev).encode() + b"\n\n")
                        else:
                            self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                text = outer.REF if m in ("ok", "stream_cut", "stream_wrong",
                                          "stream_framing") else "alpha beta delta"
                obj = {"choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                       "usage": {"completion_tokens": 3}}
                data = json.dumps(obj).encode()
                if m == "garbled":
                    data = data[: len(data) // 2]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.oracle = _Srv(H)
        self.front = _Srv(H)
        self.front.httpd_ref = self.front.httpd

    def close(self) -> None:
        self.oracle.close()
        self.front.close()


class _Srv:
    def __init__(self, handler) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.httpd_ref = None
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("mode,stream,outcome,kind", [
    ("ok", False, "ok", None),
    ("ok", True, "ok", None),
    ("http_error", False, "http 503", None),
    ("stream_cut", True, "truncated", None),
    ("garbled", False, "violation", "garbled_200"),
    ("wrong", False, "violation", "wrong_text"),
    ("stream_wrong", True, "violation", "wrong_text"),
    ("stream_framing", True, "violation", "sse_framing"),
])
def test_client_flags_corruption(mode, stream, outcome, kind):
    f = _Fake()
    try:
        f.mode = mode
        c = Client(f.front.url, Reference(f.oracle.url, "m"), seed=1, threads=0, timeout=5)
        got = c.one("completions", "p", 3, stream, False)
        assert got == outcome
        snap = c.snapshot()
        if kind:
            assert [v["kind"] for v in snap["violations"]] == [kind]
        else:
            assert snap["violations"] == []
    finally:
        f.close()


def test_member_check_flags_a_routable_instance_with_a_silent_member(tmp_path):
    """The partial-loss invariant can fail: a multi-pod instance the coordinator routes
    while the driver has kept one of its node managers silent past the grace is a
    violation; within the grace, withdrawn, or a single-pod instance, it is not."""
    fleet = chaos_fleet.Fleet("controller", "t", tmp_path, NoNet("t"))
    ep0 = [p for p in fleet.pods if p.name == "ep0"][0]
    assert ep0.multi and ep0.job == "chaos-ep"
    views = {"coord": [{"id": 7, "status": "active", "pool": "available"}],
             "ctl": [{"id": 7, "job_name": "chaos-ep"}]}
    fleet.coordinator_instances = lambda: views["coord"]
    fleet.controller_instances = lambda: views["ctl"]

    class Ctl:  # the controller, up for a minute
        stopped, since = False, time.monotonic() - 60

        @staticmethod
        def alive() -> bool:
            return True
    fleet.controller = Ctl
    assert fleet.member_violations() == []  # nobody silent
    ep0.down_since = time.monotonic() - 2
    assert fleet.member_violations() == []  # within the grace (timeout + probe)
    ep0.down_since = time.monotonic() - 10
    v = fleet.member_violations()
    assert len(v) == 1 and v[0].startswith("VIOLATION coordinator routes chaos-ep (instance 7)")
    # a controller restarted 2 s ago counts the silence from its start: within the grace
    Ctl.since = time.monotonic() - 2
    assert fleet.member_violations() == []
    Ctl.since = time.monotonic() - 60
    views["coord"][0]["status"] = "inactive"
    assert fleet.member_violations() == []  # withdrawn
    # the standalone fleet has no multi-pod instance
    assert not [p for p in chaos_fleet.Fleet("standalone", "t", tmp_path, NoNet("t")).pods
                if p.multi]
