"""motor controller fault tolerance against fake node managers: EngineRelaunchStrategy
(§7.2) success and failure, escalation to reconfiguration, DpScaleDownStrategy (§8.2)
with engines simulated behind the fake NMs' FT routes, and every phase in the FT status
API (§8.4)."""

from __future__ import annotations

import pytest

import motorlib
from ctl_fakes import Controller, FakeCoordinator, FakeNM, controller_config, ft_phase

FT_CAP = {"enabled": True, "scale_down_supported": True, "external_lb": True,
          "auto_recovery": False, "fused_mc2_enabled": False, "eplb_enabled": True,
          "num_redundant_experts": 2}


@pytest.fixture
def env(procs, tmpdir_path):
    made: list = []

    class Env:
        def __init__(self) -> None:
            self.coord = FakeCoordinator()
            made.append(self.coord)

        def controller(self, **kw) -> Controller:
            return Controller(procs, controller_config(tmpdir_path, self.coord.port, **kw))

        def nm(self, *a, **kw) -> FakeNM:
            n = FakeNM(*a, **kw)
            made.append(n)
            return n

    yield Env()
    for m in made:
        m.close()


def active_instance(c: Controller, nms: list[FakeNM]) -> int:
    for n in nms:
        n.register(c.url)
    for n in nms:
        motorlib.wait_for(lambda n=n: n.start_cmd is not None, 10, what="start command")
    for n in nms:
        n.set_all("normal")
        n.start_heartbeats(lambda: c.url, 0.15)
    iid = nms[0].instance_id
    c.wait_status(iid, "active", timeout=10)
    return iid


def history(c: Controller, iid: int) -> list[tuple[str, str]]:
    st, body = c.ft(iid)
    assert st == 200, body
    return [(h["scope"], h["phase"]) for h in body["data"]["history"]]


def test_relaunch_success(env):
    c = env.controller()
    a = env.nm("job-rl", ports=(20000,), dp=2)
    b = env.nm("job-rl", ports=(20100,), dp=2)
    iid = active_instance(c, [a, b])
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="published")
    # the restart keeps the endpoints abnormal until the test says they are back
    a.restart_recovers = b.restart_recovers = False
    a.set(0, "abnormal")
    st, body = a.report(c.url, 0, 1)
    assert st == 200 and body["data"]["accepted"] is True
    # withdrawn at once, restart dispatched to every NM of the instance
    motorlib.wait_for(lambda: iid not in env.coord.routable(), 5, what="withdrawn")
    motorlib.wait_for(lambda: a.seen("/node-manager/engine-restart") and
                      b.seen("/node-manager/engine-restart"), 5, what="restart on both NMs")
    assert a.seen("/node-manager/engine-restart")[0] == {"action": "restart", "instance_id": iid}
    c.wait_status(iid, "inactive", timeout=5)
    st, rt = c.ft(iid)
    assert rt["data"]["strategy"] == "EngineRelaunchStrategy"
    assert rt["data"]["strategy_phase"] == "RELAUNCH_ENGINE"
    # engines back
    a.set_all("normal")
    c.wait_status(iid, "active", timeout=10)
    motorlib.wait_for(lambda: (c.ft(iid)[1]["data"]["strategy_phase"] == "SUCCESS"), 10,
                      what="relaunch SUCCESS")
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="published again")
    h = history(c, iid)
    phases = [p for s, p in h if s == "EngineRelaunchStrategy"]
    assert phases[0] == "INIT" and "RELAUNCH_ENGINE" in phases and phases[-1] == "SUCCESS"
    assert not a.seen("/node-manager/stop") and not b.seen("/node-manager/stop")
    assert ft_phase(c.ft(iid)[1]["data"]) == "NORMAL"
    # the episode is settled: the same engine failing again starts a new relaunch
    n = len(a.seen("/node-manager/engine-restart"))
    a.restart_recovers = True
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: len(a.seen("/node-manager/engine-restart")) > n, 5,
                      what="second relaunch")


def test_relaunch_failure_escalates_to_reconfiguration(env):
    c = env.controller()
    a = env.nm("job-rf", ports=(21000,), dp=2)
    b = env.nm("job-rf", ports=(21100,), dp=2)
    iid = active_instance(c, [a, b])
    b.restart_status = 500  # b refuses to relaunch
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: c.status_of(iid) is None, 10, what="instance reconfigured away")
    # a accepted its restart (keeps its freeze): no abort for a; b did not: abort for b
    # (sent after the instance is gone from the table: wait for it, do not race it)
    motorlib.wait_for(
        lambda: [x for x in b.seen("/node-manager/engine-restart") if x["action"] == "abort"],
        5, what="abort to the node manager that refused the restart")
    assert not [x for x in a.seen("/node-manager/engine-restart") if x["action"] == "abort"]
    # reconfiguration: both NMs told to stop so the platform restarts them
    motorlib.wait_for(lambda: a.seen("/node-manager/stop") and b.seen("/node-manager/stop"), 5,
                      what="stop to every NM")
    st, rt = c.ft(iid)
    assert st == 200
    d = rt["data"]
    assert ft_phase(d) == "RECONFIGURING" and d["reconfiguration_dispatched"] is True
    assert "restart not accepted" in d["last_error"]
    phases = [(s, p) for s, p in history(c, iid)]
    assert ("EngineRelaunchStrategy", "RESTART_CONTAINER") in phases
    assert ("EngineRelaunchStrategy", "FAILED") in phases
    assert ("InstanceReconfigurationStrategy", "DISPATCHED") in phases
    motorlib.wait_for(lambda: iid not in env.coord.routable(), 5, what="withdrawn")
    # a node manager still running the old instance (it missed its stop) is refused and
    # told to stop again instead of resurrecting the instance
    st, body = b.reregister(c.url)
    assert st == 410 and "reconfigured" in body["error"]
    # (once per 10 s and node manager: its own heartbeat loop may have got it already)
    motorlib.wait_for(lambda: len(b.seen("/node-manager/stop")) >= 2, 5, what="stop again")
    assert c.status_of(iid) is None
    # the platform restarts the pods: they register again, a new instance replaces it
    for n in (a, b):
        n.stop_heartbeats()
        n.start_cmd = None
        n.instance_id = None
    iid2 = active_instance(c, [a, b])
    assert iid2 > iid
    # the old runtime disappears once the replacement is ready
    motorlib.wait_for(lambda: c.ft(iid)[0] == 404, 5, what="old runtime dropped")


def test_relaunch_unreachable_nm_goes_to_restart_container(env):
    c = env.controller(ft={"engine_relaunch_dispatch_retries": 2})
    a = env.nm("job-ru", ports=(22000,), dp=2)
    b = env.nm("job-ru", ports=(22100,), dp=2)
    iid = active_instance(c, [a, b])
    b.stop_heartbeats()
    b.dead = True  # unreachable: no dispatch at all
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: c.status_of(iid) is None, 10, what="reconfigured")
    assert not a.seen("/node-manager/engine-restart", "POST") or all(
        x["action"] == "abort" for x in a.seen("/node-manager/engine-restart"))
    d = c.ft(iid)[1]["data"]
    assert "unreachable" in d["last_error"]


def scale_down_ft(**kw):
    ft = {"enable_dp_scale_down": True,
          "dp_scale_down_config": {"request_timeout_sec": 2, "poll_interval_sec": 0.1,
                                   "execution_deadline_sec": 5}}
    ft.update(kw)
    return ft


def test_dp_scale_down_end_to_end(env):
    c = env.controller(ft=scale_down_ft())
    a = env.nm("job-sd", ports=(23000, 23002), dp=4, ft_capability=FT_CAP)
    b = env.nm("job-sd", ports=(23100, 23102), dp=4, ft_capability=FT_CAP)
    iid = active_instance(c, [a, b])
    st, rt = c.ft(iid)
    assert rt["data"]["gate"] == {"allowed": True, "reason_codes": []}
    assert rt["data"]["original_dp_ranks"] == [0, 1, 2, 3]
    # rank 1 (on a) dies; the survivors turn unhealthy without ft_state (ready for apply)
    with a.lock:
        a.ft[1] = {"status": "dead"}
        a.ft[0] = {"status": "unhealthy"}
    with b.lock:
        b.ft[2] = {"status": "unhealthy"}
        b.ft[3] = {"status": "unhealthy"}
    a.set(1, "abnormal")
    st, body = a.report(c.url, 1, 1)
    assert body["data"]["accepted"] is True
    motorlib.wait_for(lambda: ft_phase(c.ft(iid)[1]["data"]) == "SCALED_DOWN_RUNNING", 15,
                      what="SCALED_DOWN_RUNNING")
    d = c.ft(iid)[1]["data"]
    assert d["dead_committed"] == [1] and d["pending_removed_ranks"] == []
    assert d["alive_dp_ranks"] == [0, 2, 3]
    assert d["request_id"].startswith("scale-down-")
    runtime_phases = [p for s, p in history(c, iid) if s == "runtime"]
    assert runtime_phases[:1] == ["DECIDING"]
    for p in ("SCALING_DOWN", "POST_SCALE_CLEANUP", "SCALED_DOWN_RUNNING"):
        assert p in runtime_phases
    # the transaction as the NMs saw it
    rid = d["request_id"]
    assert a.seen("/node-manager/fault-tolerance/guard")[0]["request_id"] == rid
    assert b.seen("/node-manager/fault-tolerance/guard")[0]["lease_sec"] == pytest.approx(
        2 * 5 + 4 * 2 + 5)
    apply_a = a.seen("/node-manager/fault-tolerance/apply")
    apply_b = b.seen("/node-manager/fault-tolerance/apply")
    assert len(apply_a) == 1 and len(apply_b) == 1  # applied once
    assert apply_a[0]["endpoint_ids"] == [0] and apply_b[0]["endpoint_ids"] == [2, 3]
    assert apply_a[0]["instruction"] == "scale_down"
    assert apply_a[0]["params"] == {"removed_dp_ranks": [1], "dp_master_ip": "127.0.0.1",
                                    "dp_master_rank": 0}
    fin_a = a.seen("/node-manager/fault-tolerance/finalize")
    fin_b = b.seen("/node-manager/fault-tolerance/finalize")
    assert fin_a == [{"request_id": rid, "retired_endpoint_ids": [1], "commit": True,
                      "dp_master_rank": 0}]
    assert fin_b[0]["retired_endpoint_ids"] == [] and fin_b[0]["commit"] is True
    # the NM stops reporting the retired rank: accepted, and the instance serves again
    c.wait_status(iid, "active", timeout=5)
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="survivors published")
    pushed = env.coord.last_instance(iid)
    assert sorted(pushed["endpoints"]["127.0.0.1"].keys()) == ["0", "2", "3"]
    motorlib.wait_for(lambda: c.ft(iid)[1]["data"]["can_serve"] is True, 5, what="can_serve")
    assert not a.hb_errors and not b.hb_errors


def test_dp_scale_down_failure_falls_back_to_relaunch(env):
    c = env.controller(ft=scale_down_ft())
    a = env.nm("job-sf", ports=(24000, 24002), dp=2, ft_capability=FT_CAP)
    iid = active_instance(c, [a])
    with a.lock:
        a.ft[0] = {"status": "dead"}
        a.ft[1] = {"status": "unhealthy"}
    a.ft_apply_status = 502  # the engine refuses the apply
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: a.seen("/node-manager/engine-restart"), 15, what="fallback relaunch")
    # the aborted transaction was finalized with commit false
    fins = a.seen("/node-manager/fault-tolerance/finalize")
    assert fins and fins[-1]["commit"] is False
    h = history(c, iid)
    assert ("runtime", "RECONFIGURING") in h
    assert ("DpScaleDownStrategy", "FAILED") in h
    d = c.ft(iid)[1]["data"]
    assert d["dead_committed"] == []
    # the relaunch recovers everything: the runtime is NORMAL again
    motorlib.wait_for(lambda: ft_phase(c.ft(iid)[1]["data"]) == "NORMAL", 15, what="NORMAL again")
    assert c.ft(iid)[1]["data"]["fallback_strategy"] is None


def test_gate_closed_uses_relaunch(env):
    c = env.controller(ft=scale_down_ft())
    a = env.nm("job-g", ports=(25000,), dp=1)  # no ft_capability: gate closed
    iid = active_instance(c, [a])
    d = c.ft(iid)[1]["data"]
    assert d["gate"]["allowed"] is False
    assert "ENGINE_FT_REQUIRED" in d["gate"]["reason_codes"]
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: a.seen("/node-manager/engine-restart"), 5, what="relaunch")
    assert not a.seen("/node-manager/fault-tolerance/guard")


def test_dp_scale_down_verifies_dead_reports(env):
    """A DEAD report for an engine that still answers its FT status (a node manager's
    arbitration reporting a merely unhealthy engine) removes nothing."""
    c = env.controller(ft=scale_down_ft())
    a = env.nm("job-v", ports=(26000, 26002), dp=2, ft_capability=FT_CAP)
    iid = active_instance(c, [a])
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="published")
    # engine 1 answers "healthy" (the fake's default): not dead
    a.report(c.url, 1, 1, etype="EngineDeadError")
    motorlib.wait_for(lambda: c.ft(iid)[1]["data"]["strategy_phase"] == "SUCCESS", 10,
                      what="scale-down ended without a change")
    d = c.ft(iid)[1]["data"]
    assert ft_phase(d) == "NORMAL" and d["dead_committed"] == []
    ends = [h for h in d["history"] if h["scope"] == "DpScaleDownStrategy" and
            h["phase"] == "SUCCESS"]
    assert "no candidate is dead" in ends[-1]["detail"]
    assert a.seen("/node-manager/fault-tolerance/status")  # verified through the NM
    assert not a.seen("/node-manager/fault-tolerance/guard")
    assert not a.seen("/node-manager/fault-tolerance/apply")
    assert not a.seen("/node-manager/engine-restart")
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="published again")
