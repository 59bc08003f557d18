"""Partial loss of a multi-pod instance (seeds 001/002): a decode instance whose DP ranks
span two node managers (real `motor node-manager`s, simulated engines), one of them
frozen with SIGSTOP while its peer keeps heartbeating.

* The instance leaves the coordinator after its heartbeat timeout and stays out for as
  long as the member is silent: the healthy peer's heartbeats do not make it active again
  (the freshness gate: every member's last heartbeat must be within
  instance_heartbeat_timeout before any transition to active).
* When the silent member stays away past instance_heartbeat_timeout_inactive the
  instance is deleted and the surviving node manager is told to exit through
  /node-manager/stop (exit 255, the orchestrator reschedules the pod group); the
  replacement pods assemble a new instance that becomes routable.
* When the member comes back within the window, the instance becomes routable again.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

import motorlib
from ctl_fakes import Controller, FakeCoordinator, controller_config
from ctl_fakes.e2e import instance_of, sim_nm
from fake_controller import start_nm


def two_pod_instance(procs, tmp, c: Controller, job: str):
    rpc = motorlib.free_port()
    a = sim_nm(procs, tmp, c.port, job, role="decode", dp=2, rpc_port=rpc, name="nm-a")
    b = sim_nm(procs, tmp, c.port, job, role="decode", dp=2, rpc_port=rpc, name="nm-b")
    motorlib.wait_for(lambda: instance_of(c, job).get("status") == "active", 30,
                      what=f"{job} active")
    view = instance_of(c, job)
    assert len(view["node_managers"]) == 2
    return a, b, view["id"]


def config_of(nm) -> str:
    argv = nm.proc.argv
    return argv[argv.index("--config") + 1]


def never_routable(coord: FakeCoordinator, iid: int, seconds: float,
                   until=lambda: False) -> int:
    """Sample the coordinator's view for `seconds` (or until `until()`); fail at the first
    sample where iid is routable. The number of samples taken."""
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        assert iid not in coord.routable(), \
            f"instance {iid} routable again while a member is silent (sample {n})"
        n += 1
        time.sleep(0.05)
    return n


def test_silent_member_keeps_the_instance_out_until_replaced(procs, tmpdir_path, coord):
    c = Controller(procs, controller_config(tmpdir_path, coord.port, instance={
        "instance_heartbeat_timeout": 2, "instance_heartbeat_timeout_inactive": 6}))
    a, b, iid = two_pod_instance(procs, tmpdir_path, c, "job-pl")
    motorlib.wait_for(lambda: iid in coord.routable(), 5, what="published")
    a.proc.signal(signal.SIGSTOP)  # the NM only: its engines keep running
    motorlib.wait_for(lambda: iid not in coord.routable(), 10, what="withdrawn")
    # The peer keeps heartbeating (every 0.2 s); the instance must stay out until it is
    # deleted (A silent past the inactive timeout).
    samples = never_routable(coord, iid, 15, until=lambda: c.status_of(iid) is None)
    assert samples > 20
    assert c.status_of(iid) is None, "instance not deleted after the inactive timeout"
    conf = c.proc.find_events("heartbeat_timeout_confirmed", instance_id=iid)
    assert conf and conf[0]["member"].endswith(f":{a.port}") and conf[0]["rule"]
    gate = c.proc.find_events("instance_freshness_gate", instance_id=iid)
    assert gate, "the gate's refusals are logged"
    assert gate[0]["member"].endswith(f":{a.port}") and gate[0]["heartbeat_age_ms"] > 2000
    assert gate[0]["rule"]
    # the survivor is told to exit: /node-manager/stop -> exit 255
    loss = c.proc.find_events("instance_partial_loss", instance_id=iid)
    assert loss and loss[0]["action"] == "stop_survivors", loss
    assert any(s["member"].endswith(f":{b.port}") for s in
               c.proc.find_events("partial_loss_survivor_stop", instance_id=iid))
    assert b.proc.wait(15) == 255
    # its launch is void: the state file is gone, a restart registers afresh
    argv = b.proc.argv
    assert not os.path.exists(argv[argv.index("--state-file") + 1])
    assert iid not in coord.routable()
    # The orchestrator replaces the pod group: both pods start again with their files.
    a.proc.kill()
    cfg_a, cfg_b = config_of(a), config_of(b)
    start_nm(procs, cfg_a, role="decode", name="nm-a2")
    start_nm(procs, cfg_b, role="decode", name="nm-b2")
    motorlib.wait_for(lambda: instance_of(c, "job-pl").get("status") == "active", 30,
                      what="replacement active")
    new = instance_of(c, "job-pl")["id"]
    assert new != iid
    motorlib.wait_for(lambda: new in coord.routable(), 5, what="replacement published")


def test_member_back_within_the_window_makes_it_routable_again(procs, tmpdir_path, coord):
    c = Controller(procs, controller_config(tmpdir_path, coord.port, instance={
        "instance_heartbeat_timeout": 2, "instance_heartbeat_timeout_inactive": 30}))
    a, b, iid = two_pod_instance(procs, tmpdir_path, c, "job-back")
    motorlib.wait_for(lambda: iid in coord.routable(), 5, what="published")
    a.proc.signal(signal.SIGSTOP)
    motorlib.wait_for(lambda: iid not in coord.routable(), 10, what="withdrawn")
    never_routable(coord, iid, 4)
    assert c.status_of(iid) == "inactive"
    # A controller restart meanwhile (same store, same port) starts every member's window
    # afresh, but loading is no proof of life: the silent member must heartbeat this
    # controller before the instance may become active again.
    c.proc.kill()
    c.proc.wait(5)
    c = Controller(procs, c.config, name="controller-2", port=c.port)
    assert c.status_of(iid) == "inactive"
    never_routable(coord, iid, 6)
    assert c.status_of(iid) == "inactive"
    gate = c.proc.find_events("instance_freshness_gate", instance_id=iid)
    assert gate and gate[0]["member"].endswith(f":{a.port}"), gate
    a.proc.signal(signal.SIGCONT)
    motorlib.wait_for(lambda: iid in coord.routable(), 10, what="routable again once whole")
    assert c.status_of(iid) == "active"
    # nobody was told to exit
    assert not c.proc.find_events("partial_loss_survivor_stop")
    assert a.proc.alive() and b.proc.alive()
