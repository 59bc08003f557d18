"""motor node-manager: overlapping /health probe attempts (issue 20, deliverable 6).

health_collector_timeout 1 s, 3 attempts, heartbeat 0.2 s (a probe every 0.2 s). Run back
to back (upstream) a hang costs 3 x 1 s; overlapped, a new probe goes out every period
while earlier ones are outstanding, so the 3 timeouts land one period apart and the hang
is found ~1 s + 2 x 0.2 s after the first unanswered probe. The test reads the spacing
from the node manager's own debug log (probe_timeout, probe_failed), not from a stopwatch:
back to back, two timeouts are at least a timeout (1 s) apart by construction.
"""

import datetime
import os
import signal
import time

import pytest

import motorlib
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def started(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port, engine_config={"load_seconds": 0},
                    health={"health_collector_timeout": 1,
                            "health_collector_timeout_retry_attempts": 3},
                    ft={"engine_restart_wait_timeout_sec": 600})
    path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
    nm = start_nm(procs, path, args=("--log-level", "debug"))
    ctl.wait_request("/controller/register", timeout=10)
    r = nm.post("/node-manager/start", start_body(cfg, instance_id=4))
    assert r.status == 200, r
    nm.wait_ready(timeout=30)
    return nm


def events_after(nm, n: int, name: str) -> list[dict]:
    return [e for e in nm.events()[n:] if e.get("event") == name]


def ts(ev: dict) -> float:
    return datetime.datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()


def test_hang_found_by_overlapping_attempts(procs, tmpdir_path, ctl):
    nm = started(procs, tmpdir_path, ctl)
    port = int(nm.endpoint()["port"])
    n0 = len(nm.events())
    r = motorlib.post(f"http://127.0.0.1:{port}/sim/fault", {"mode": "hang"})
    assert r.status == 200, r
    motorlib.wait_for(lambda: nm.endpoint()["status"] == "abnormal", timeout=15)
    timeouts = events_after(nm, n0, "probe_timeout")
    failed = events_after(nm, n0, "probe_failed")
    assert [e["timeouts"] for e in timeouts[:2]] == [1, 2], timeouts
    assert failed and failed[0]["error"], failed
    # Timeouts one probe period apart, not one timeout apart.
    first, last = ts(timeouts[0]), ts(failed[0])
    assert last - first < 0.9, (timeouts, failed)
    assert last >= ts(timeouts[1]) >= first
    # The third timeout counted as a failed round: the endpoint is abnormal.
    assert nm.endpoint()["status"] == "abnormal"


def test_engine_paused_shorter_than_timeout_is_no_failure(procs, tmpdir_path, ctl):
    """A loaded machine: the engine is not scheduled for 0.8 s (< the 1 s timeout) while
    3 probes are outstanding; they are all answered once it runs, nothing is abnormal."""
    nm = started(procs, tmpdir_path, ctl)
    pid = nm.endpoint()["pid"]
    n0 = len(nm.events())
    for _ in range(3):
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(0.8)
        finally:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 0.6
        while time.monotonic() < deadline:
            assert nm.endpoint()["status"] == "normal"
            time.sleep(0.02)
    assert not events_after(nm, n0, "probe_failed")
    assert not events_after(nm, n0, "probe_timeout")
    assert nm.endpoint()["status"] == "normal"
