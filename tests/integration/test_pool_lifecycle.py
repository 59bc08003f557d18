"""Worker pool instance lifecycle: idle reaping on time, keep_warm, workers that never
get ready or fail /health, crashes (during a call and idle), admin stop, the SIGKILL
after the grace, and a pool shutdown with a call in flight."""

import os
import signal
import threading
import time

import motorlib
from motorlib import post, wait_for
from pool_helpers import BASE, manifest, start_pool


def _transition(inst: dict, to: str) -> dict:
    return next(t for t in inst["transitions"] if t["to"] == to)


def test_idle_ttl_reaping_is_on_time(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("ttl", idle_ttl_seconds=1.0)])
    r = pool.invoke("ttl", {})
    t_ret = time.monotonic()
    assert r.status == 200
    inst, pid = r.headers["x-motor-instance-id"], r.json()["pid"]
    # Still there shortly before its TTL...
    time.sleep(0.5)
    assert pool.instance(inst)["state"] == "ready"
    # ...and stopped within a second of it.
    pool.wait_state(inst, "stopped", timeout=5)
    dt = time.monotonic() - t_ret
    assert 0.9 <= dt <= 2.0, dt
    rec = pool.instance(inst)
    assert rec["stop_cause"] == "idle ttl expired"
    stopping = _transition(rec, "stopping")
    assert stopping["cause"] == "idle ttl expired"
    # The recorded times agree: idle from the end of the call to the reaper's stop.
    ev = pool.proc.wait_event("pool_instance_reaped", instance_id=inst)
    assert 1000 <= ev["idle_ms"] < 1500
    motorlib.assert_no_process(pid)
    # The next call starts a new instance.
    r2 = pool.invoke("ttl", {})
    assert r2.status == 200 and r2.headers["x-motor-instance-id"] != inst
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_keep_warm_is_never_reaped(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("warm", idle_ttl_seconds=0.3, keep_warm=True),
        manifest("cold", idle_ttl_seconds=0.3),
    ])
    rw, rc = pool.invoke("warm", {}), pool.invoke("cold", {})
    assert rw.status == 200 and rc.status == 200
    cold_inst = rc.headers["x-motor-instance-id"]
    pool.wait_state(cold_inst, "stopped", timeout=5)
    time.sleep(0.7)  # well past the TTL
    [w] = pool.instances(node="warm")
    assert w["state"] == "ready" and w["keep_warm"] is True
    assert motorlib.pid_alive(rw.json()["pid"])
    r = pool.invoke("warm", {})
    assert r.headers["x-motor-instance-id"] == rw.headers["x-motor-instance-id"]
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_never_ready_worker(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("stuck", ready_timeout_seconds=1, env={"POOL_WORKER_NEVER_READY": "1"})])
    t0 = time.monotonic()
    r = pool.invoke("stuck", {})
    assert r.status == 503, r
    assert 0.9 <= time.monotonic() - t0 < 3
    b = r.json()
    assert "failed to start" in b["error"]
    assert "no 'MOTOR_NODE_READY port=N' line on stdout within 1 s" in b["error"]
    assert "stuck: waiting for a GPU that never frees" in b["stderr_tail"]
    inst = b["instance_id"]
    rec = pool.instance(inst)
    assert rec["state"] == "error"
    assert "no 'MOTOR_NODE_READY" in rec["error"]
    assert any("loading model shard 2/3" in line for line in rec["stderr_tail"])
    wait_for(lambda: not pool.instance(inst)["alive"], 5, what="stuck worker killed")
    motorlib.assert_no_process(rec["pid"])
    assert [t["to"] for t in pool.instance(inst)["transitions"]] == ["starting", "error"]
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_ready_line_but_health_fails(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("sick", env={"POOL_WORKER_HEALTH_FAILS": "1"})])
    r = pool.invoke("sick", {})
    assert r.status == 503, r
    err = r.json()["error"]
    assert "health check failed" in err and "answered HTTP 500" in err
    rec = pool.instance(r.json()["instance_id"])
    assert rec["state"] == "error" and rec["port"]
    wait_for(lambda: not pool.instance(rec["id"])["alive"], 5)
    motorlib.assert_no_process(rec["pid"])
    node = pool.node("sick").json()
    assert node["counters"]["start_failures"] == 1
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_crash_during_call_then_replaced(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("crashy", keep_warm=True)])
    r0 = pool.invoke("crashy", {})
    inst0 = r0.headers["x-motor-instance-id"]
    r = pool.invoke("crashy", {"crash": True, "delay": 0.1})
    assert r.status == 502, r
    b = r.json()
    assert b["status"] == "failed" and b["instance_id"] == inst0
    assert "crashed (killed by signal 9" in b["error"]
    rec = pool.instance(inst0)  # marked at once, through the pidfd
    assert rec["state"] == "error" and "crashed" in rec["error"]
    assert any("crashing on purpose" in line for line in rec["stderr_tail"])
    r2 = pool.invoke("crashy", {})
    assert r2.status == 200 and r2.headers["x-motor-instance-id"] != inst0
    assert pool.node("crashy").json()["counters"]["calls_failed"] == 1
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_idle_crash_detected_at_once(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("victim")])
    r = pool.invoke("victim", {})
    inst, pid = r.headers["x-motor-instance-id"], r.json()["pid"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    pool.wait_state(inst, "error", timeout=5)
    assert time.monotonic() - t0 < 1.0
    assert "killed by signal 9" in pool.instance(inst)["error"]
    r2 = pool.invoke("victim", {})
    assert r2.status == 200 and r2.headers["x-motor-instance-id"] != inst
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_admin_stop_and_sigkill_after_grace(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("stubborn", env={"POOL_WORKER_IGNORE_TERM": "1"})])
    r = pool.invoke("stubborn", {})
    inst, pid = r.headers["x-motor-instance-id"], r.json()["pid"]
    t0 = time.monotonic()
    s = post(f"{pool.url}{BASE}/instances/{inst}/stop")
    assert s.status == 202 and s.json()["state"] == "stopping"
    assert post(f"{pool.url}{BASE}/instances/{inst}/stop").status == 409
    assert post(f"{pool.url}{BASE}/instances/ni_nope/stop").status == 404
    pool.wait_state(inst, "stopped", timeout=8)
    dt = time.monotonic() - t0
    assert 1.8 <= dt < 5, dt  # SIGTERM ignored: SIGKILL after the 2 s grace
    assert not motorlib.pid_alive(pid)
    assert pool.instance(inst)["stop_cause"] == "stopped by admin"
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_shutdown_with_call_in_flight(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("long", max_instances=2)])
    res = {}

    def call():
        try:
            res["r"] = pool.invoke("long", {"delay": 5}, timeout=10)
        except OSError as e:
            res["e"] = e
    t = threading.Thread(target=call, daemon=True)
    t.start()
    wait_for(lambda: any(i["busy"] for i in pool.instances()), 10)
    pids = pool.live_pids()
    assert pids
    t0 = time.monotonic()
    assert pool.stop() == 0
    assert time.monotonic() - t0 < 5
    t.join(5)
    # The caller got an answer (503) or a closed connection, never a hang.
    assert "e" in res or res["r"].status == 503, res
    for pid in pids:
        motorlib.assert_no_process(pid)
