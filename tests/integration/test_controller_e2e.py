"""motor controller end to end with real node managers and simulated engines on
127.0.0.1: a 1P1D job assembles, starts and serves through a real coordinator; DP ranks
across node managers and node_rank/headless for nnodes=2; SIGKILL of one engine makes
the controller relaunch every engine of the instance and it becomes active again; a
relaunch that cannot proceed escalates to reconfiguration."""

from __future__ import annotations

import os
import signal

import pytest

import motorlib
from ctl_fakes import Controller, FakeCoordinator, call, controller_config, ft_phase
from ctl_fakes.e2e import engine_pids, instance_of, relaunches, sim_nm, wait_active


def test_1p1d_serves_through_a_real_coordinator(procs, tmpdir_path):
    co = procs.motor("coordinator", "--port", 0, "--mgmt-port", 0, "--workers", 1,
                     name="coordinator")
    ev = co.wait_event("coordinator_listening", timeout=15)
    infer, mgmt = int(ev["infer_port"]), int(ev["mgmt_port"])
    c = Controller(procs, controller_config(tmpdir_path, mgmt))
    p = sim_nm(procs, tmpdir_path, c.port, "qwen-p", role="prefill", name="nm-p")
    d = sim_nm(procs, tmpdir_path, c.port, "qwen-d", role="decode", name="nm-d")
    pid, did = wait_active(c, "qwen-p"), wait_active(c, "qwen-d")
    assert pid != did
    view = instance_of(c, "qwen-p")
    assert view["role"] == "prefill" and view["published"] is True
    assert view["node_managers"][0]["port"] == str(p.port)
    # the coordinator learned both from the controller and routes a PD request
    motorlib.wait_for(lambda: call("GET", f"http://127.0.0.1:{mgmt}/readiness")[1].get("ready"),
                      10, what="coordinator ready")
    st, inst = call("GET", f"http://127.0.0.1:{mgmt}/instances")
    assert st == 200 and {i["id"] for i in inst["instances"]} == {pid, did}
    assert all(i["status"] == "active" and i["healthy"] for i in inst["instances"])
    st, out = call("POST", f"http://127.0.0.1:{infer}/v1/completions",
                   {"model": "sim-model", "prompt": "hello", "max_tokens": 4}, timeout=15)
    assert st == 200, out
    assert out["choices"][0]["text"]
    # one start command each, nothing relaunched
    assert relaunches(p) == 0 and relaunches(d) == 0
    assert len(c.proc.find_events("start_command_accepted")) == 2


def test_dp_ranks_across_nms_and_nnodes_headless(procs, tmpdir_path, coord):
    c = Controller(procs, controller_config(tmpdir_path, coord.port))
    rpc = motorlib.free_port()
    a = sim_nm(procs, tmpdir_path, c.port, "job-dp", dp=3, device_num=2, rpc_port=rpc, name="nm-a")
    b = sim_nm(procs, tmpdir_path, c.port, "job-dp", dp=3, device_num=1, rpc_port=rpc, name="nm-b")
    iid = wait_active(c, "job-dp")
    # global DP ranks in registration order: whoever registered first holds rank 0
    view = instance_of(c, "job-dp")
    ids = [[e["id"] for e in nm["endpoints"]] for nm in view["node_managers"]]
    assert ids in ([[0, 1], [2]], [[0], [1, 2]])
    assert view["master_dp_ip"] == "127.0.0.1"
    # each engine runs with its rank (the simulator reports it)
    for nm in (a, b):
        for e in nm.engines()["endpoints"]:
            st, s = call("GET", f"http://127.0.0.1:{e['port']}/sim/status")
            assert st == 200 and s["dp_rank"] == e["id"], s
    assert sorted(e for nm in (a, b) for e in engine_pids(nm)) == [0, 1, 2]
    # the simulated DP group formed (rank 0 saw every rank join)
    first = a if 0 in engine_pids(a) else b
    first.proc.wait_event("sim_dp_group_formed", timeout=10)

    # nnodes 2, dp 1: master node + headless slave node
    m = sim_nm(procs, tmpdir_path, c.port, "job-pcp", nnodes=2, name="nm-m",
               master_port=motorlib.free_port())
    s = sim_nm(procs, tmpdir_path, c.port, "job-pcp", nnodes=2, name="nm-s",
               master_port=motorlib.free_port())
    pcp = wait_active(c, "job-pcp")
    assert pcp != iid
    view = instance_of(c, "job-pcp")
    ranks = {nm["port"]: nm["node_rank"] for nm in view["node_managers"]}
    headless = {nm["port"]: nm["endpoints"][0]["headless"] for nm in view["node_managers"]}
    master_port = [p for p, r in ranks.items() if r == 0][0]
    assert sorted(ranks.values()) == [0, 1]
    assert headless[master_port] is False
    assert [h for p, h in headless.items() if p != master_port] == [True]
    slave = m if str(m.port) != master_port else s
    ep = slave.engines()["endpoints"][0]
    assert ep["headless"] is True and ep["status"] == "wait2start"
    master = s if slave is m else m
    assert master.engines()["endpoints"][0]["status"] == "normal"


def test_engine_sigkill_relaunches_every_engine(procs, tmpdir_path, coord):
    c = Controller(procs, controller_config(tmpdir_path, coord.port))
    rpc = motorlib.free_port()
    a = sim_nm(procs, tmpdir_path, c.port, "job-rl", dp=2, rpc_port=rpc, name="nm-a")
    b = sim_nm(procs, tmpdir_path, c.port, "job-rl", dp=2, rpc_port=rpc, name="nm-b")
    iid = wait_active(c, "job-rl")
    motorlib.wait_for(lambda: iid in coord.routable(), 5, what="published")
    before = {**engine_pids(a), **engine_pids(b)}
    os.kill(before[0], signal.SIGKILL)
    # withdrawn at once, then every engine of the instance (both NMs) relaunched
    motorlib.wait_for(lambda: iid not in coord.routable(), 5, what="withdrawn")
    motorlib.wait_for(lambda: relaunches(a) == 1 and relaunches(b) == 1, 15,
                      what="relaunch on both node managers")
    motorlib.wait_for(lambda: c.ft(iid)[1]["data"]["strategy_phase"] == "SUCCESS", 20,
                      what="relaunch strategy SUCCESS")
    assert c.status_of(iid) == "active"
    after = {**engine_pids(a), **engine_pids(b)}
    assert set(after) == {0, 1}
    assert all(after[k] and after[k] != before[k] for k in after), (before, after)
    motorlib.wait_for(lambda: iid in coord.routable(), 5, what="published again")
    hist = [(h["scope"], h["phase"]) for h in c.ft(iid)[1]["data"]["history"]]
    assert ("EngineRelaunchStrategy", "RELAUNCH_ENGINE") in hist
    assert hist[-1] == ("EngineRelaunchStrategy", "SUCCESS")
    # the instance went inactive while relaunching and came back (through initial while
    # the fresh engines load, or straight INACTIVE + NORMAL)
    states = [(e["from"], e["to"]) for e in c.proc.find_events("instance_state", instance_id=iid)]
    assert ("active", "inactive") in states
    assert states.index(("active", "inactive")) < len(states) - 1 and states[-1][1] == "active"
    # no new start command: relaunch is in place
    assert len(c.proc.find_events("start_command_accepted")) == 2


def test_relaunch_that_cannot_proceed_escalates(procs, tmpdir_path, coord):
    c = Controller(procs, controller_config(tmpdir_path, coord.port,
                                            ft={"engine_relaunch_dispatch_retries": 2}))
    rpc = motorlib.free_port()
    a = sim_nm(procs, tmpdir_path, c.port, "job-esc", dp=2, rpc_port=rpc, name="nm-a")
    b = sim_nm(procs, tmpdir_path, c.port, "job-esc", dp=2, rpc_port=rpc, name="nm-b")
    iid = wait_active(c, "job-esc")
    victim_nm = a if 0 in engine_pids(a) else b
    other = b if victim_nm is a else a
    # the other node manager hangs (unreachable): the relaunch must not be dispatched
    other.proc.signal(signal.SIGSTOP)
    try:
        os.kill(engine_pids(victim_nm)[0], signal.SIGKILL)
        motorlib.wait_for(lambda: c.ft(iid)[0] == 200 and
                          ft_phase(c.ft(iid)[1]["data"]) == "RECONFIGURING", 20,
                          what="escalated to reconfiguration")
        d = c.ft(iid)[1]["data"]
        hist = [(h["scope"], h["phase"]) for h in d["history"]]
        assert ("EngineRelaunchStrategy", "RESTART_CONTAINER") in hist
        assert ("EngineRelaunchStrategy", "FAILED") in hist
        assert d["reconfiguration_dispatched"] is True
        # nothing was relaunched; the reachable node manager is told to stop (exit 255,
        # the platform restarts the pod)
        assert relaunches(victim_nm) == 0 if victim_nm.proc.alive() else True
        assert victim_nm.proc.wait(10) == 255
        assert c.status_of(iid) is None
        assert iid not in coord.routable()
    finally:
        other.proc.signal(signal.SIGCONT)


def test_coordinator_restart_gets_the_instances_back_at_once(procs, tmpdir_path):
    """Regression: a coordinator that restarted faster than two controller heartbeats
    stayed empty until the periodic set (coordinator_set_sync_interval, 300 s by default;
    off here). Its boot_id changes with every start; the controller sees that at its next
    heartbeat and pushes a full set."""
    co = procs.motor("coordinator", "--port", 0, "--mgmt-port", 0, "--workers", 1,
                     name="coordinator")
    ev = co.wait_event("coordinator_listening", timeout=15)
    infer, mgmt = int(ev["infer_port"]), int(ev["mgmt_port"])
    url = f"http://127.0.0.1:{mgmt}"
    c = Controller(procs, controller_config(
        tmpdir_path, mgmt, event={"coordinator_heartbeat_interval": 1,
                                  "coordinator_set_sync_interval": 0}))
    sim_nm(procs, tmpdir_path, c.port, "job-cr", name="nm")
    iid = wait_active(c, "job-cr")

    def ids() -> set:
        st, body = call("GET", url + "/instances")
        return {i["id"] for i in body["instances"]} if st == 200 else set()
    motorlib.wait_for(lambda: ids() == {iid}, 10, what="published")
    st, live = call("GET", url + "/liveness")
    assert st == 200 and live["status"] == "ok" and len(live["boot_id"]) == 32, live
    first_boot = live["boot_id"]

    co.kill()
    co.wait(5)
    co2 = procs.motor("coordinator", "--port", infer, "--mgmt-port", mgmt, "--workers", 1,
                      name="coordinator-2")
    co2.wait_event("coordinator_listening", timeout=15)
    st, live = call("GET", url + "/liveness")
    assert st == 200 and live["boot_id"] != first_boot, live
    # Within a heartbeat or two, not at a periodic sync (there is none).
    motorlib.wait_for(lambda: ids() == {iid}, 5, what="instances back after the restart")
    ev = c.proc.wait_event("coordinator_restarted", timeout=1)
    assert ev["previous_boot_id"] == first_boot and ev["boot_id"] == live["boot_id"]
    assert not c.proc.find_events("coordinator_unreachable")  # two heartbeats never failed
