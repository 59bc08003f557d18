"""motor node-manager: death reports, in-place relaunch, suicide arbitration (spec §2.5,
§5.8, §7.1). Heartbeat interval 0.2 s, so the 5-round threshold is about 1 s."""

import os
import signal
import time

import pytest

import motorlib
from fake_controller import (FakeController, nm_config, start_body, start_nm, write_json)


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def started(procs, tmpdir_path, ctl, state_file=None, **cfg_kw):
    cfg = nm_config(controller_port=ctl.port, **cfg_kw)
    path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
    nm = start_nm(procs, path, state_file=state_file)
    ctl.wait_request("/controller/register", timeout=5)
    r = nm.post("/node-manager/start", start_body(cfg, instance_id=3))
    assert r.status == 200, r
    nm.wait_ready()
    return nm, cfg


def test_sigkill_is_reported_at_once(procs, tmpdir_path, ctl):
    nm, _ = started(procs, tmpdir_path, ctl)
    pid = nm.endpoint()["pid"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rep = ctl.wait_request("/controller/report_software_fault", timeout=5)
    latency = rep.t - t0
    assert latency < 1.0, latency  # pidfd, not a 5 s poll
    b = rep.body
    assert b["exception_type"] == "EngineDeadError"
    assert b["engine_id"] == 0 and b["engine_status"] == 1
    assert b["pod_ip"] == "127.0.0.1" and b["instance_id"] == 3
    assert b["node_manager_port"] == nm.port
    assert b["additional_info"]["signal"] == 9 and b["additional_info"]["pid"] == pid
    ep = nm.endpoint()
    assert ep["state"] == "stopped" and ep["status"] == "abnormal"
    assert ep["last_exit"]["signal"] == 9 and ep["pid"] is None
    ctl.wait_request("/controller/heartbeat", lambda r: r.body["status"] == {"0": "abnormal"},
                     timeout=5)
    # Accepted + relaunch enabled => frozen for the Controller's relaunch (no suicide).
    nm.wait_event("suicide_frozen", cause="fault_report", timeout=5)
    assert nm.engines()["frozen"] is True
    assert ctl.count("/controller/report_software_fault") == 1  # one episode, one report


def test_relaunch_200_409_and_banner(procs, tmpdir_path, ctl):
    state = os.path.join(tmpdir_path, "state.json")
    logdir = os.path.join(tmpdir_path, "engine-logs")
    nm, cfg = started(procs, tmpdir_path, ctl, state_file=state,
                      engine_config={"load_seconds": 0.8}, nm={"engine_log_dir": logdir})
    old_pid = nm.endpoint()["pid"]
    # Engine output goes to a per-endpoint file (and the tail, and our stdout).
    logfile = nm.endpoint()["log_file"]
    assert logfile == os.path.join(logdir, "engine-0.log")
    assert "sim_ready" in open(logfile).read()
    r = nm.post("/node-manager/engine-restart", {"action": "restart", "instance_id": 3})
    assert r.status == 200 and r.json() == {"message": "engine restart accepted"}, r
    # Still loading: a second request is refused, the Controller reads 409 as "dispatched".
    r = nm.post("/node-manager/engine-restart", {"action": "restart"})
    assert r.status == 409 and r.json()["detail"] == "Engine restart already in progress", r
    assert not motorlib.pid_alive(old_pid)
    assert "[ENGINE RELAUNCH #1] instance_id=3" in nm.output()
    # ... and in the engine's log file, between the old and the new engine's lines.
    text = open(logfile).read()
    banner = text.index("[ENGINE RELAUNCH #1] instance_id=3")
    assert text.index("sim_ready") < banner
    # During the reload the status is relaxed-true (fresh process = initial, §12.9 fix).
    assert nm.status(relaxed=True) is True
    nm.wait_event("relaunch_ready", timeout=15)
    nm.wait_ready()
    ep = nm.endpoint()
    assert ep["pid"] != old_pid and ep["restarts"] == 1
    text = open(logfile).read()
    assert text.find("sim_ready", text.index("[ENGINE RELAUNCH #1]")) > 0
    # The freeze was lifted by readiness.
    assert nm.engines()["frozen"] is False
    # Another relaunch is possible now; a wrong instance id is refused.
    r = nm.post("/node-manager/engine-restart", {"action": "restart", "instance_id": 99})
    assert r.status == 400
    assert r.json()["detail"] == "No engine start recorded, nothing to restart"
    for bad in ({"action": "dance"}, [1], {"instance_id": 3}):
        assert nm.post("/node-manager/engine-restart", bad).status == 400, bad

    # A restarted node manager still relaunches from the persisted launch parameters.
    nm.proc.close()
    nm2 = start_nm(procs, os.path.join(tmpdir_path, "c.json"), state_file=state, name="nm2")
    nm2.wait_event("launch_state_restored", timeout=5)
    assert nm2.engines()["endpoints"] == []
    r = nm2.post("/node-manager/engine-restart", {"action": "restart", "instance_id": 3})
    assert r.status == 200, r
    nm2.wait_ready()
    assert nm2.engines()["instance_id"] == 3
    ctl.wait_request("/controller/heartbeat",
                     lambda rec: rec.body["ins_id"] == 3 and rec.body["status"] == {"0": "normal"},
                     timeout=10)


def test_relaunch_without_start_is_400(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    r = nm.post("/node-manager/engine-restart", {"action": "restart"})
    assert r.status == 400
    assert r.json() == {"detail": "No engine start recorded, nothing to restart"}
    r = nm.post("/node-manager/engine-restart", {"action": "abort"})
    assert r.status == 200 and r.json() == {"message": "abort accepted"}


def test_suicide_after_threshold(procs, tmpdir_path, ctl):
    # The Controller does not accept reports (its FT is off): nothing freezes.
    ctl.set("/controller/report_software_fault",
            body={"code": 200, "message": "Fault tolerance is not enabled", "data": {}})
    nm, cfg = started(procs, tmpdir_path, ctl)
    pid = nm.endpoint()["pid"]
    port = int(start_body(cfg)["endpoints"][0]["business_port"])
    t0 = time.monotonic()
    r = motorlib.post(f"http://127.0.0.1:{port}/sim/fault", {"mode": "unhealthy"})
    assert r.status == 200
    rc = nm.proc.wait(timeout=15)
    elapsed = time.monotonic() - t0
    assert rc == 255, nm.tail()
    # Five abnormal rounds at 0.2 s: not before ~0.8 s.
    assert elapsed >= 0.75, elapsed
    ev = nm.find_events("arbitration_abnormal")
    assert [e["counter"] for e in ev][-5:] == [1, 2, 3, 4, 5]
    # The abnormal (ever-NORMAL) endpoint was reported once, as dead (§2.5).
    reps = ctl.of("/controller/report_software_fault")
    assert len(reps) >= 1 and reps[0].body["engine_status"] == 1
    assert reps[0].body["additional_info"]["source"] == "arbitration"
    # The engine went down with the node manager.
    motorlib.wait_for(lambda: not motorlib.pid_alive(pid), 5, what="engine gone")


def test_no_suicide_while_frozen_then_abort(procs, tmpdir_path, ctl):
    nm, cfg = started(procs, tmpdir_path, ctl)
    port = int(start_body(cfg)["endpoints"][0]["business_port"])
    motorlib.post(f"http://127.0.0.1:{port}/sim/fault", {"mode": "unhealthy"})
    ctl.wait_request("/controller/report_software_fault", timeout=5)
    nm.wait_event("suicide_frozen", timeout=5)
    # Frozen for engine_restart_wait_timeout_sec (60 s): well past the 1 s threshold.
    n = len(nm.find_events("endpoint_status", to="abnormal"))
    assert n == 1
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        assert nm.alive(), nm.tail()
        time.sleep(0.1)
    assert not nm.find_events("suicide")
    # The Controller gives up (abort): arbitration resumes and the pod restarts.
    t0 = time.monotonic()
    r = nm.post("/node-manager/engine-restart", {"action": "abort"})
    assert r.status == 200
    assert nm.proc.wait(timeout=10) == 255
    # Five fresh rounds at 0.2 s after the abort (the first may come right away).
    assert time.monotonic() - t0 >= 0.75


def test_grace_then_startup_timeout(procs, tmpdir_path, ctl):
    """An engine that never becomes ready: no suicide within the startup window (grace,
    ever-NORMAL rule), but after it the node manager does give up (fix of §12.8)."""
    cfg = nm_config(controller_port=ctl.port, engine_config={"load_seconds": 600},
                    health={"startup_timeout": 3})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    t0 = time.monotonic()
    assert nm.post("/node-manager/start", start_body(cfg)).status == 200
    while time.monotonic() - t0 < 2.0:
        assert nm.alive()
        assert nm.endpoint()["status"] == "initial"
        time.sleep(0.1)
    rc = nm.proc.wait(timeout=15)
    assert rc == 255
    assert time.monotonic() - t0 >= 3.0
    nm.wait_event("grace_period_ended", cause="startup_timeout", timeout=1)
    # Never NORMAL: counted but never reported as dead (cold start is loading).
    assert ctl.count("/controller/report_software_fault") == 0
