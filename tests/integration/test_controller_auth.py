"""The node managers' management key end to end: real `motor node-manager`s with
`management_api_key_file`, simulated engines, a real `motor controller` with
`node_manager_api_key_config`.

* A keyed fleet (two pods, DP ranks across them) starts, relaunches every engine after
  an engine SIGKILL (POST /node-manager/engine-restart) and scales down (the FT routes:
  guard, status, apply, finalize) under its controller; no call is refused.
* A controller with the wrong key gets a clear error in its log
  (node_manager_auth_failed), in GET /controller/instances and in `motor status`, not a
  silent 401 loop; writing the right key into its key file (watched) rotates it and the
  instance starts.
* One key file shared by the controller and the node managers: rotating its content
  rotates both (management_key_rotated) and the fleet still relaunches.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import motorlib
from ctl_fakes import Controller, FakeCoordinator, controller_config
from ctl_fakes.e2e import (engine_pids, instance_of, relaunches, sim_nm,
                           wait_active as e2e_wait_active)

FT_ENGINE = {"enable_fault_tolerance": True, "data_parallel_external_lb": True,
             "enable_eplb": True, "eplb_config": {"num_redundant_experts": 2}}
SD_CTL_FT = {"enable_fault_tolerance": True, "enable_dp_scale_down": True}


def wait_active(c: Controller, job: str) -> int:
    return e2e_wait_active(c, job, timeout=30.0)


def key_file(tmp: str, name: str, key: str) -> str:
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(key + "\n")
    return path


def keyed_controller(procs, tmp, coord, key_path, ft=None) -> Controller:
    return Controller(procs, controller_config(
        tmp, coord.port, ft=ft,
        extra={"node_manager_api_key_config": {"enable_api_key": True,
                                               "api_key_file": key_path}}))


def no_refusals(c: Controller, *nms) -> None:
    assert not c.proc.find_events("node_manager_auth_failed")
    for nm in nms:
        assert "401" not in "".join(l for l in nm.output().splitlines()
                                    if '"event":"http_request"' in l and "/node-manager/" in l)


def relaunch_once(c: Controller, iid: int, a, b) -> None:
    before = {**engine_pids(a), **engine_pids(b)}
    n_a, n_b = relaunches(a), relaunches(b)
    os.kill(before[0], signal.SIGKILL)
    motorlib.wait_for(lambda: relaunches(a) == n_a + 1 and relaunches(b) == n_b + 1, 30,
                      what="relaunch on both node managers")
    motorlib.wait_for(lambda: c.ft(iid)[1]["data"]["strategy_phase"] == "SUCCESS", 30,
                      what="relaunch strategy SUCCESS")
    c.wait_status(iid, "active", timeout=15)


def test_keyed_fleet_starts_relaunches_and_scales_down(procs, tmpdir_path, coord):
    kf = key_file(tmpdir_path, "nm.key", "fleet-s3cret")
    c = keyed_controller(procs, tmpdir_path, coord, kf, ft={
        "enable_dp_scale_down": True,
        "dp_scale_down_config": {"request_timeout_sec": 3, "poll_interval_sec": 0.1,
                                 "execution_deadline_sec": 15}})
    nmk = {"management_api_key_file": kf}
    rpc = motorlib.free_port()
    a = sim_nm(procs, tmpdir_path, c.port, "job-k", dp=3, device_num=2, rpc_port=rpc,
               engine=FT_ENGINE, controller_ft=SD_CTL_FT, name="nm-a", nm=nmk)
    b = sim_nm(procs, tmpdir_path, c.port, "job-k", dp=3, device_num=1, rpc_port=rpc,
               engine=FT_ENGINE, controller_ft=SD_CTL_FT, name="nm-b", nm=nmk)
    for nm in (a, b):
        assert nm.find_events("nm_listening")[0]["management_key"] is True
        # the key is required: a call without it is refused
        assert nm.post("/node-manager/pause", {}).status == 401
    iid = wait_active(c, "job-k")
    assert len(c.proc.find_events("start_command_accepted")) == 2
    # scale down: kill the highest rank, the survivors keep serving without it
    owner = a if 2 in engine_pids(a) else b
    os.kill(engine_pids(owner)[2], signal.SIGKILL)
    motorlib.wait_for(lambda: c.ft(iid)[1]["data"]["phase"] == "SCALED_DOWN_RUNNING", 40,
                      what="SCALED_DOWN_RUNNING")
    d = c.ft(iid)[1]["data"]
    assert d["dead_committed"] == [2] and d["alive_dp_ranks"] == [0, 1]
    c.wait_status(iid, "active", timeout=15)
    motorlib.wait_for(lambda: iid in coord.routable(), 10, what="survivors published")
    no_refusals(c, a, b)


def test_keyed_fleet_relaunches(procs, tmpdir_path, coord):
    kf = key_file(tmpdir_path, "nm.key", "fleet-s3cret")
    c = keyed_controller(procs, tmpdir_path, coord, kf)
    rpc = motorlib.free_port()
    nmk = {"management_api_key_file": kf}
    a = sim_nm(procs, tmpdir_path, c.port, "job-r", dp=2, rpc_port=rpc, name="nm-a", nm=nmk)
    b = sim_nm(procs, tmpdir_path, c.port, "job-r", dp=2, rpc_port=rpc, name="nm-b", nm=nmk)
    iid = wait_active(c, "job-r")
    relaunch_once(c, iid, a, b)
    no_refusals(c, a, b)
    # one shared key file: rotating it rotates the node managers and the controller
    with open(kf + ".tmp", "w") as f:
        f.write("rotated-k3y\n")
    os.rename(kf + ".tmp", kf)
    for p in (a.proc, b.proc, c.proc):
        p.wait_event("management_key_rotated", timeout=10)
    assert a.post("/node-manager/pause", {},
                  headers={"X-Motor-Management-Key": "fleet-s3cret"}).status == 403
    relaunch_once(c, iid, a, b)
    assert "rotated-k3y" not in c.proc.output() + a.output() + b.output()


def test_wrong_key_is_a_clear_error_until_rotated(procs, tmpdir_path, coord):
    nm_key = key_file(tmpdir_path, "nm.key", "right-key")
    ctl_key = key_file(tmpdir_path, "ctl.key", "wrong-key")
    c = keyed_controller(procs, tmpdir_path, coord, ctl_key)
    a = sim_nm(procs, tmpdir_path, c.port, "job-w", name="nm-a",
               nm={"management_api_key_file": nm_key})
    ev = c.proc.wait_event("node_manager_auth_failed", timeout=15)
    assert ev["status"] == 403 and ev["route"] == "/node-manager/start"
    assert ev["node_manager"] == f"127.0.0.1:{a.port}" and ev["key_sent"] is True
    assert "node_manager_api_key_config" in ev["fix"]
    st, body = c.get("/controller/instances")
    auth = body["node_manager_auth"]
    assert auth["refusing"][0]["node_manager"] == f"127.0.0.1:{a.port}"
    views = body["instances"] + body["assembling"]
    assert any("management key refused" in nm.get("auth_error", "")
               for v in views for nm in v["node_managers"])
    # motor status names the problem and exits 1
    r = subprocess.run([motorlib.motor_bin(), "status", "--controller", c.url, "--coordinator",
                        "none"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 1
    assert f"cannot authenticate to node manager 127.0.0.1:{a.port}" in r.stdout + r.stderr
    # not a log flood: one error per node manager per 30 s
    assert len(c.proc.find_events("node_manager_auth_failed")) == 1
    # the operator writes the right key: the controller reloads it and the start goes in
    with open(ctl_key + ".tmp", "w") as f:
        f.write("right-key\n")
    os.rename(ctl_key + ".tmp", ctl_key)
    c.proc.wait_event("management_key_rotated", timeout=10)
    wait_active(c, "job-w")
    st, body = c.get("/controller/instances")
    assert "node_manager_auth" not in body
    assert "right-key" not in c.proc.output() and "wrong-key" not in c.proc.output()
