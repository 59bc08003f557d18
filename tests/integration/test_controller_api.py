"""motor controller against fake node managers and a fake coordinator: the §5 protocol
(register, start commands, heartbeats with their size rules and event evaluation,
re-registration), assembly (DP ranks, node_rank/headless), the state machine with its
heartbeat timeouts and guarded isolation probe, the coordinator push, the small routes,
and clear errors for bad bodies."""

from __future__ import annotations

import time

import pytest

import motorlib
from ctl_fakes import Controller, FakeCoordinator, FakeNM, call, controller_config, ft_phase


@pytest.fixture
def env(procs, tmpdir_path):
    made: list = []

    class Env:
        def __init__(self) -> None:
            self.coord = FakeCoordinator()
            made.append(self.coord)
            self.procs = procs
            self.tmp = tmpdir_path

        def controller(self, **kw) -> Controller:
            cfg = controller_config(self.tmp, self.coord.port, **kw)
            return Controller(self.procs, cfg)

        def nm(self, *a, **kw) -> FakeNM:
            n = FakeNM(*a, **kw)
            made.append(n)
            return n

    yield Env()
    for m in made:
        m.close()


def wait_start(nm: FakeNM, timeout: float = 10.0) -> dict:
    motorlib.wait_for(lambda: nm.start_cmd is not None, timeout, what=f"start command on {nm.port}")
    return nm.start_cmd


def test_bad_bodies_get_clear_errors(env):
    c = env.controller()
    # register: not JSON, missing field, wrong type
    st, body = call("POST", c.url + "/controller/register", None)
    assert st == 200 and body["error"] == "Invalid RegisterMsg format"
    assert "empty" in body["detail"]
    st, body = c.post("/controller/register", {"job_name": "j", "role": "prefill"})
    assert st == 200 and body["error"] == "Invalid RegisterMsg format"
    assert "pod_ip" in body["detail"]
    st, body = c.post("/controller/register", {"job_name": "j", "role": "prefill", "pod_ip": "1.2.3.4",
                                               "business_port": ["0"], "nm_port": "1"})
    assert st == 200 and "business_port" in body["detail"]
    st, body = c.post("/controller/register", {"job_name": "j", "role": "chef", "pod_ip": "1.2.3.4",
                                               "business_port": ["1"], "nm_port": "1"})
    assert st == 200 and "role" in body["detail"]
    # heartbeat: malformed => 200 error; unknown instance => 503
    st, body = c.post("/controller/heartbeat", {"job_name": "j", "ins_id": "x", "ip": "1.2.3.4",
                                                "status": {}})
    assert st == 200 and body["error"] == "Invalid HeartbeatMsg format" and "ins_id" in body["detail"]
    st, body = c.post("/controller/heartbeat", {"job_name": "j", "ins_id": 1, "ip": "1.2.3.4",
                                                "status": {"zero": "normal"}})
    assert st == 200 and "status" in body["detail"]
    st, body = c.post("/controller/heartbeat", {"job_name": "j", "ins_id": 99, "ip": "1.2.3.4",
                                                "status": {"0": "normal"}})
    assert st == 503 and "re-register" in body["detail"]
    # reregister: endpoints are strict (unknown Endpoint fields rejected)
    st, body = c.post("/controller/reregister", {
        "job_name": "j", "instance_id": 5, "role": "prefill", "pod_ip": "1.2.3.4", "nm_port": "1",
        "endpoints": [{"id": 0, "ip": "1.2.3.4", "business_port": "1", "mgmt_port": "2"}]})
    assert st == 200 and body["error"] == "Invalid ReregisterMsg format" and "mgmt_port" in body["detail"]
    # fault report: missing engine_id => 400 with data.accepted false
    st, body = c.post("/controller/report_software_fault", {"engine_status": 1, "pod_ip": "1.2.3.4"})
    assert st == 400 and body["detail"]["data"]["accepted"] is False
    assert "engine_id" in body["detail"]["message"]
    st, body = c.post("/controller/report_software_fault",
                      {"engine_id": "0", "engine_status": 1, "pod_ip": "1.2.3.4"})
    assert st == 400 and body["detail"]["data"]["accepted"] is False
    # check / terminate / ft status inputs
    st, body = c.post("/controller/check_instance", {"instance_id": "x"})
    assert st == 400 and "instance_id" in body["detail"]
    st, body = c.post("/controller/check_instance", {"instance_id": 3})
    assert st == 200 and body == {"exists": False}
    st, body = c.post("/controller/terminate_instance", {"instance_id": 3})
    assert st == 404 and body["detail"]["code"] == 404
    st, body = c.get("/controller/fault_tolerance/status?instance_id=abc")
    assert st == 400
    st, body = c.get("/controller/fault_tolerance/status?instance_id=77")
    assert st == 404 and body["detail"] == "fault-tolerance runtime not found"
    # nothing above created anything
    st, body = c.get("/controller/instances")
    assert body["instances"] == [] and body["assembling"] == []
    ev = c.proc.find_events("register_invalid")
    assert ev and all(e.get("error") for e in ev)


def test_1p1d_assembles_starts_and_goes_active(env):
    c = env.controller()
    p = env.nm("job-p", role="prefill", ports=(10000, 10002), dp=2)
    d = env.nm("job-d", role="decode", ports=(10100,), dp=1)
    assert p.register(c.url) == (200, {"result": 0})
    assert d.register(c.url) == (200, {"result": 0})
    sp, sd = wait_start(p), wait_start(d)
    assert sp["job_name"] == "job-p" and sp["role"] == "prefill"
    assert sd["role"] == "decode"
    assert sp["instance_id"] != sd["instance_id"]
    assert {sp["instance_id"], sd["instance_id"]} == {1, 2}
    assert [e["id"] for e in sp["endpoints"]] == [0, 1]
    assert [e["business_port"] for e in sp["endpoints"]] == ["10000", "10002"]
    assert all(e["ip"] == "127.0.0.1" and e["status"] == "initial" for e in sp["endpoints"])
    assert sp["master_dp_ip"] == "127.0.0.1" and sp["node_rank"] == 0
    assert "mgmt_port" not in sp["endpoints"][0]
    pid, did = sp["instance_id"], sd["instance_id"]
    assert c.status_of(pid) == "initial"
    # registering again while assembled: upstream's answer
    other = env.nm("job-p", role="prefill", ports=(10004,), dp=2)
    st, body = other.register(c.url)
    assert st == 200 and body["error"] == "Instance already registered"
    # engines loading: initial heartbeats keep it initial
    assert p.heartbeat(c.url) == (200, {"result": [True, 200]})
    assert c.status_of(pid) == "initial"
    p.set_all("normal")
    d.set_all("normal")
    assert p.heartbeat(c.url)[0] == 200
    assert d.heartbeat(c.url)[0] == 200
    assert c.status_of(pid) == "active" and c.status_of(did) == "active"
    motorlib.wait_for(lambda: env.coord.routable() == {pid, did}, 5, what="coordinator adds")
    pushed = env.coord.last_instance(pid)
    assert pushed["status"] == "active" and pushed["job_name"] == "job-p"
    assert sorted(pushed["endpoints"]["127.0.0.1"].keys()) == ["0", "1"]
    # the instances view
    view = c.instance(pid)
    assert view["role"] == "prefill" and view["routable"] and view["published"]
    assert [e["status"] for e in view["node_managers"][0]["endpoints"]] == ["normal", "normal"]
    assert view["node_managers"][0]["heartbeat_age_ms"] < 3000
    # ACTIVE + INIT has no transition: 500 with a reason, the instance stays active
    p.set(0, "initial")
    st, body = p.heartbeat(c.url)
    assert st == 500 and "no transition from active on INIT" in body["detail"]
    assert c.status_of(pid) == "active"
    # abnormal => inactive => coordinator del; normal again => active => add
    p.set(0, "abnormal")
    assert p.heartbeat(c.url)[0] == 200
    assert c.status_of(pid) == "inactive"
    motorlib.wait_for(lambda: pid not in env.coord.routable(), 5, what="del pushed")
    p.set_all("normal")
    p.heartbeat(c.url)
    assert c.status_of(pid) == "active"
    motorlib.wait_for(lambda: pid in env.coord.routable(), 5, what="add pushed again")
    # all paused => paused (still known to the coordinator as paused)
    p.set_all("paused")
    p.heartbeat(c.url)
    assert c.status_of(pid) == "paused"
    motorlib.wait_for(lambda: (env.coord.last_instance(pid) or {}).get("status") == "paused", 5,
                      what="paused pushed")
    # metrics and probes
    st, _ = c.get("/readiness")
    assert st == 200
    r = motorlib.get(c.url + "/metrics")
    assert r.status == 200 and 'motor_controller_instances{status="active"} 1' in r.text
    assert 'motor_controller_heartbeats_total{result="ok"}' in r.text
    assert c.post("/controller/check_instance", {"instance_id": pid}) == (200, {"exists": True})


def test_alarms_and_observability_port(env):
    """An instance that leaves active raises an instance_unavailable alarm, cleared when it
    is active again; external alarms are accepted (bad ones refused); the observability
    port serves alarms, inventory and metrics."""
    c = env.controller(api={"observability_api_port": 0},
                       extra={"observability_config": {"observability_enable": True}})
    obs = f"http://127.0.0.1:{c.proc.wait_event('observability_listening', timeout=5)['port']}"
    nm = env.nm("job-a", ports=(10300,), dp=1)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    nm.set_all("normal")
    nm.heartbeat(c.url)
    assert c.status_of(iid) == "active"
    assert c.get("/observability/alarms")[1]["count"] == 0
    nm.set(0, "abnormal")
    nm.heartbeat(c.url)
    assert c.status_of(iid) == "inactive"
    st, body = call("GET", obs + "/observability/alarms?active=true")
    assert st == 200 and body["active"] == 1, body
    alarm = body["alarms"][0]
    assert alarm["type"] == "instance_unavailable" and alarm["severity"] == "critical"
    assert alarm["instance_id"] == iid and alarm["job_name"] == "job-a" and alarm["active"]
    nm.heartbeat(c.url)  # still abnormal: no second alarm
    nm.set_all("normal")
    nm.heartbeat(c.url)
    assert c.status_of(iid) == "active"
    body = c.get("/observability/alarms")[1]
    assert body["count"] == 1 and body["active"] == 0
    assert body["alarms"][0]["cleared_because"] == "instance active again"
    assert call("GET", obs + "/observability/alarms?active=true")[1]["alarms"] == []
    # external alarms
    st, body = c.post("/observability/add_alarm", {"type": "npu_temp", "severity": "major",
                                                   "node": "n1"})
    assert st == 200 and body["message"] == "alarm added"
    listed = c.get("/observability/alarms")[1]["alarms"][-1]
    assert listed["id"] == body["id"] and listed["source"] == "external"
    assert listed["type"] == "npu_temp" and listed["detail"]["node"] == "n1"
    assert c.post("/observability/add_alarm", [1, 2])[0] == 422
    assert c.post("/observability/add_alarm", {"type": 5})[0] == 422
    assert motorlib.http("POST", c.url + "/observability/add_alarm", raw=b"{nope").status == 400
    # inventory and metrics on the observability port
    st, inv = call("GET", obs + "/observability/inventory")
    assert st == 200 and [i["id"] for i in inv["instances"]] == [iid]
    r = motorlib.get(obs + "/observability/metrics")
    assert r.status == 200 and "motor_controller_leader 1" in r.text


def test_observability_port_off_by_default(env):
    c = env.controller()
    assert not c.proc.find_events("observability_listening")
    assert c.get("/observability/alarms")[0] == 200  # the list itself is on the API port


def test_heartbeat_size_rule(env):
    c = env.controller()
    nm = env.nm("job-s", ports=(10000, 10002), dp=2)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    # one endpoint missing
    st, body = call("POST", c.url + "/controller/heartbeat",
                    {"job_name": "job-s", "ins_id": iid, "ip": "127.0.0.1", "status": {"0": "normal"}})
    assert st == 500 and "1 endpoint(s) reported" in body["detail"]
    # an endpoint of nobody
    st, body = call("POST", c.url + "/controller/heartbeat",
                    {"job_name": "job-s", "ins_id": iid, "ip": "127.0.0.1",
                     "status": {"0": "normal", "1": "normal", "7": "normal"}})
    assert st == 500 and "endpoint 7" in body["detail"]
    # a pod that is not part of the instance
    st, body = call("POST", c.url + "/controller/heartbeat",
                    {"job_name": "job-s", "ins_id": iid, "ip": "10.9.9.9",
                     "status": {"0": "normal", "1": "normal"}})
    assert st == 500 and "not registered" in body["detail"]
    # another job's name for the id
    st, body = call("POST", c.url + "/controller/heartbeat",
                    {"job_name": "other", "ins_id": iid, "ip": "127.0.0.1",
                     "status": {"0": "normal", "1": "normal"}})
    assert st == 500 and "belongs to job job-s" in body["detail"]
    assert c.status_of(iid) == "initial"


def test_dp_ranks_and_nnodes_headless(env):
    c = env.controller()
    # DP 4 over two NMs with two endpoints each: ranks in registration order
    a = env.nm("job-dp", ports=(11000, 11002), dp=4)
    b = env.nm("job-dp", ports=(11100, 11102), dp=4)
    a.register(c.url)
    time.sleep(0.3)  # the assembler must not assemble half an instance meanwhile
    assert a.start_cmd is None
    b.register(c.url)
    sa, sb = wait_start(a), wait_start(b)
    assert [e["id"] for e in sa["endpoints"]] == [0, 1]
    assert [e["id"] for e in sb["endpoints"]] == [2, 3]
    assert sa["node_rank"] == 0 and sb["node_rank"] == 1
    assert sa["master_dp_ip"] == sb["master_dp_ip"] == "127.0.0.1"
    assert not any(e["headless"] for e in sa["endpoints"] + sb["endpoints"])
    # nnodes 2, dp 1: master + headless slave; node_rank = index % nnodes
    m = env.nm("job-pcp", ports=(12000,), dp=1, nnodes=2)
    s = env.nm("job-pcp", ports=(12100,), dp=1, nnodes=2)
    m.register(c.url)
    s.register(c.url)
    sm, ss = wait_start(m), wait_start(s)
    assert sm["node_rank"] == 0 and ss["node_rank"] == 1
    assert sm["endpoints"][0]["headless"] is False and ss["endpoints"][0]["headless"] is True
    assert sm["endpoints"][0]["id"] == 0 and ss["endpoints"][0]["id"] == 1
    iid = sm["instance_id"]
    # headless wait2start + routable normal => NORMAL
    m.set_all("normal")
    s.set_all("wait2start")
    m.heartbeat(c.url)
    s.heartbeat(c.url)
    assert c.status_of(iid) == "active"
    # the coordinator is told the headless endpoint is headless
    motorlib.wait_for(lambda: env.coord.last_instance(iid) is not None, 5, what="add")
    eps = env.coord.last_instance(iid)["endpoints"]["127.0.0.1"]
    assert eps["1"]["headless"] is True and eps["0"]["headless"] is False


def test_start_command_retries_only_failed_nms(env):
    c = env.controller(instance={"send_cmd_retry_times": 3})
    a = env.nm("job-r", ports=(13000,), dp=2)
    b = env.nm("job-r", ports=(13100,), dp=2)
    b.reachable = False  # answers 503 to everything (still reachable for the assembler)
    a.register(c.url)
    b.register(c.url)
    wait_start(a)
    motorlib.wait_for(lambda: len(b.seen("/node-manager/start")) >= 2, 10, what="retries on b")
    b.reachable = True
    wait_start(b)
    c.proc.wait_event("start_commands_delivered", timeout=10)
    # a accepted on the first attempt and was never asked again
    assert len(a.seen("/node-manager/start")) == 1


def test_heartbeat_timeout_guarded_probe_then_isolation(env):
    c = env.controller(instance={"instance_heartbeat_timeout": 1, "instance_heartbeat_timeout_inactive": 2})
    nm = env.nm("job-t", ports=(14000,), dp=1)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    nm.set_all("normal")
    nm.heartbeat(c.url)
    assert c.status_of(iid) == "active"
    # silence, but the NM answers its status: the probe refreshes once instead of isolating
    c.proc.wait_event("heartbeat_timeout_suppressed", timeout=5, instance_id=iid)
    assert c.status_of(iid) == "active"
    # still silent after the refresh: isolated without another probe, then deleted
    c.wait_status(iid, "inactive", timeout=5)
    motorlib.wait_for(lambda: iid not in env.coord.routable(), 5, what="del")
    c.wait_status(iid, None, timeout=6)
    ev = c.proc.find_events("instance_state", instance_id=iid, to="deleted")
    assert ev and ev[0]["from"] == "inactive"
    # the NM's next heartbeat is told to re-register; re-registration rebuilds it with
    # the same id and no new start command
    n_start = len(nm.seen("/node-manager/start"))
    st, _ = nm.heartbeat(c.url)
    assert st == 503
    assert nm.reregister(c.url) == (200, {"result": 0})
    motorlib.wait_for(lambda: c.status_of(iid) == "initial", 5, what="rebuilt from reregister")
    assert nm.heartbeat(c.url)[0] == 200
    assert c.status_of(iid) == "active"
    assert len(nm.seen("/node-manager/start")) == n_start
    assert c.instance(iid)["reregistered"] is True


def test_unreachable_nm_isolated(env):
    c = env.controller(instance={"instance_heartbeat_timeout": 1})
    nm = env.nm("job-u", ports=(15000,), dp=1)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    nm.set_all("normal")
    nm.heartbeat(c.url)
    assert c.status_of(iid) == "active"
    nm.close()  # gone: the probe fails, the instance is isolated at once
    c.wait_status(iid, "inactive", timeout=5)
    assert not c.proc.find_events("heartbeat_timeout_suppressed", instance_id=iid)


def test_terminate_and_member_reregistration(env):
    c = env.controller()
    a = env.nm("job-x", ports=(16000,), dp=2)
    b = env.nm("job-x", ports=(16100,), dp=2)
    a.register(c.url)
    b.register(c.url)
    wait_start(a)
    wait_start(b)
    iid = a.instance_id
    c.proc.wait_event("start_commands_delivered", timeout=5, instance_id=iid)
    # b restarts (fresh registration from a member): the instance is rebuilt, a is told to stop
    a.start_cmd = None
    assert b.register(c.url) == (200, {"result": 0})
    motorlib.wait_for(lambda: a.seen("/node-manager/stop"), 5, what="stop to the other member")
    assert not b.seen("/node-manager/stop")
    assert c.status_of(iid) is None
    st, ft = c.ft(iid)
    assert st == 200 and ft_phase(ft["data"]) == "RECONFIGURING"
    assert ft["data"]["reconfiguration_dispatched"] is True
    # a comes back (the platform restarted it): a new instance of the job
    a.register(c.url)
    new = wait_start(a)["instance_id"]
    assert new > iid
    # terminate: NMs told to stop, instance gone
    st, body = c.post("/controller/terminate_instance", {"instance_id": new, "reason": "test"})
    assert st == 200 and body["data"]["terminated"] == [new]
    assert c.status_of(new) is None
    assert c.post("/controller/check_instance", {"instance_id": new}) == (200, {"exists": False})


def test_coordinator_failure_queues_full_set(env):
    c = env.controller()
    nm = env.nm("job-c", ports=(17000,), dp=1)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    env.coord.fail = True
    nm.set_all("normal")
    nm.start_heartbeats(lambda: c.url, 0.2)
    # the add fails, a full set is queued and fails too (not re-queued)
    motorlib.wait_for(lambda: any(r["body"]["event"] == "set" for r in env.coord.refreshes
                                  if r["failed"]), 5, what="full set after failed add")
    env.coord.fail = False
    # the coordinator heartbeat notices the recovery and sends a full set
    motorlib.wait_for(lambda: iid in env.coord.routable(), 8, what="full set after recovery")
    assert env.coord.events()[-1][0] == "set"
    ev = c.proc.find_events("coordinator_push", push="add", ok=False)
    assert ev


def test_probes_and_fault_report_rules(env):
    c = env.controller(ft={"enable_fault_tolerance": True})
    assert c.get("/liveness")[0] == 200
    assert c.get("/startup")[0] == 200
    st, body = c.get("/readiness")
    assert st == 200 and body["leader"] is True
    nm = env.nm("job-f", ports=(18000,), dp=1)
    nm.register(c.url)
    wait_start(nm)
    iid = nm.instance_id
    # cold start: not accepted (the NM keeps its own fallback)
    st, body = nm.report(c.url, 0, 1)
    assert st == 200 and body["data"]["accepted"] is False
    # unknown engine of the instance
    st, body = nm.report(c.url, 5, 1)
    assert st == 404 and body["detail"]["data"]["accepted"] is False
    nm.set_all("normal")
    nm.heartbeat(c.url)
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="add")
    # an UNHEALTHY report withdraws the instance; HEALTHY puts it back
    st, body = nm.report(c.url, 0, 2, etype="EngineUnhealthyError")
    assert st == 200 and body == {"code": 200, "message": "Software fault reported successfully",
                                  "data": {"accepted": True}}
    motorlib.wait_for(lambda: iid not in env.coord.routable(), 5, what="withdrawn")
    st, body = nm.report(c.url, 0, 0, etype="")
    assert body["data"]["accepted"] is True
    motorlib.wait_for(lambda: iid in env.coord.routable(), 5, what="published again")
    # without instance_id the pod IP + engine id + NM port find it
    st, body = nm.report(c.url, 0, 2, iid=None)
    assert st == 200 and body["data"]["accepted"] is True


def test_fault_tolerance_disabled(env):
    c = env.controller(ft={"enable_fault_tolerance": False})
    st, body = c.post("/controller/report_software_fault",
                      {"engine_id": 0, "engine_status": 1, "pod_ip": "127.0.0.1"})
    assert st == 200 and body["message"] == "Fault tolerance is not enabled"
    assert "accepted" not in body["data"]
    st, body = c.ft()
    assert st == 200 and body["data"] == {"phase": "DISABLED", "instances": []}


def test_fault_tolerance_status_disabled_without_dp_scale_down(env):
    """Seed 002: FT on but DP scale-down off answers phase DISABLED with no instances;
    Motor's own record of its strategies stays beside it (motor_runtimes, motor_phase)."""
    c = env.controller()  # enable_dp_scale_down defaults to false
    a = env.nm("job-sdoff", role="union", ports=(10000,))
    assert a.register(c.url) == (200, {"result": 0})
    iid = wait_start(a)["instance_id"]
    st, body = c.ft()
    d = body["data"]
    assert st == 200 and d["phase"] == "DISABLED" and d["instances"] == []
    assert d["dp_scale_down"] is False
    motorlib.wait_for(lambda: [r["instance_id"] for r in c.ft()[1]["data"]["motor_runtimes"]]
                      == [iid], 10, what="the runtime kept as motor_runtimes")
    st, body = c.ft(iid)
    assert st == 200 and body["data"]["phase"] == "DISABLED"
    assert body["data"]["motor_phase"] == "NORMAL"
    # with the switch on, the runtimes are upstream's list again
    c2 = env.controller(ft={"enable_dp_scale_down": True}, store={"backend": "memory"})
    st, body = c2.ft()
    assert st == 200 and "phase" not in body["data"] and body["data"]["instances"] == []


def test_graceful_stop_is_clean(env):
    """SIGTERM with requests and a strategy in flight: exit 0, nothing leaked (ASan)."""
    c = env.controller(ft={"engine_relaunch_poll_interval_sec": 0.1})
    a = env.nm("job-g", ports=(19000,), dp=2)
    b = env.nm("job-g", ports=(19100,), dp=2)
    for n in (a, b):
        n.register(c.url)
    for n in (a, b):
        motorlib.wait_for(lambda n=n: n.start_cmd is not None, 10, what="start")
        n.set_all("normal")
        n.heartbeat(c.url)
    iid = a.instance_id
    c.wait_status(iid, "active")
    a.restart_recovers = b.restart_recovers = False
    a.report(c.url, 0, 1)
    motorlib.wait_for(lambda: a.seen("/node-manager/engine-restart"), 5, what="relaunch running")
    rc = c.proc.stop(timeout=10)
    out = c.proc.output()
    assert rc == 0, out[-2000:]
    assert "LeakSanitizer" not in out and "AddressSanitizer" not in out, out[-4000:]
    assert c.proc.find_events("controller_stopped", exit_code=0)
