"""Precision detection end to end with real processes: controller (SQLite store), node
managers running simulated engines, and a real coordinator. A decode engine switched to
a fault mode under traffic raises alarm 0xFC001009 within the threshold; with
precision_auto_recovery_enabled the controller terminates the group and clears the alarm
(same moi) and the coordinator's state; without it the alarm stays until the engine
recovers and good samples clear it; the alarm state survives a controller restart;
report_alarms and terminate_instance refuse bad bodies with 400/404/409."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import motorlib
from ctl_fakes import Controller, Etcd, call, controller_config, etcd_available
from ctl_fakes.e2e import sim_nm
from coord_helpers import metric_value


FAST_ENGINE = {"tokens_per_second": 0, "ttft_ms": 0}


def fleet(procs, tmp, auto_recovery: bool, **prec):
    mgmt = motorlib.free_port()
    c = Controller(procs, controller_config(
        tmp, mgmt, ft={"precision_auto_recovery_enabled": auto_recovery}))
    cfg = {"motor_coordinator_config": {
               "precision_detection_config": {
                   "precision_check_enabled": True, "interval_seconds": 0, "logprobs_count": 5,
                   "precision_issue_threshold": 3, "precision_clear_threshold": 3,
                   "probe_max_attempts": 1, "probe_timeout_seconds": 5, **prec}},
           "motor_controller_config": {"api_config": {"controller_api_dns": "127.0.0.1",
                                                      "controller_api_port": c.port}}}
    path = f"{tmp}/coordinator.json"
    with open(path, "w") as f:
        json.dump(cfg, f)
    co = procs.motor("coordinator", "--port", 0, "--mgmt-port", mgmt, "--workers", 2,
                     "--config", path, name="coordinator")
    ev = co.wait_event("coordinator_listening", timeout=15)
    return c, co, f"http://127.0.0.1:{ev['infer_port']}", f"http://127.0.0.1:{mgmt}"


def job_instance(c, job):
    for i in c.instances():
        if i["job_name"] == job and i["status"] == "active":
            return i
    return None


def wait_job(c, job, not_id=None, timeout=30.0):
    return motorlib.wait_for(
        lambda: (lambda i: i if i and i["id"] != not_id else None)(job_instance(c, job)),
        timeout, what=f"{job} active")


def engine_url(nm):
    ep = nm.engines()["endpoints"][0]
    return f"http://127.0.0.1:{ep['port']}"


def routable(mgmt, iid):
    st, body = call("GET", mgmt + "/instances")
    return st == 200 and any(i["id"] == iid and i["healthy"] for i in body["instances"])


def chat(infer, n=1, max_tokens=48):
    outs = []
    for _ in range(n):
        st, out = call("POST", infer + "/v1/chat/completions",
                       {"model": "sim-model", "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": "tell me a story"}]},
                       timeout=20)
        outs.append((st, out))
    return outs


def alarms(c, active=None):
    q = "" if active is None else f"?active={'true' if active else 'false'}"
    st, body = c.get("/controller/precision/alarms" + q)
    assert st == 200, body
    return body


@pytest.mark.parametrize("mode", ["garbled", "repeat", "rare_chars"])
def test_auto_recovery_terminates_and_clears(procs, tmpdir_path, mode):
    c, co, infer, mgmt = fleet(procs, tmpdir_path, auto_recovery=True)
    bad_nm = sim_nm(procs, tmpdir_path, c.port, "bad", name="nm-bad", engine=FAST_ENGINE)
    good_nm = sim_nm(procs, tmpdir_path, c.port, "good", name="nm-good", engine=FAST_ENGINE)
    bad, good = wait_job(c, "bad"), wait_job(c, "good")
    motorlib.wait_for(lambda: routable(mgmt, bad["id"]) and routable(mgmt, good["id"]), 15,
                      what="both routable")
    # healthy traffic first: no alarm
    assert all(st == 200 for st, _ in chat(infer, 6))
    assert alarms(c)["active"] == []
    st, _ = call("POST", engine_url(bad_nm) + "/sim/fault", {"mode": mode})
    assert st == 200
    errors = 0
    for _ in range(30):
        (st, out), = chat(infer)
        errors += st != 200
        if alarms(c)["recent"]:
            break
    # no client-visible error while the bad engine answered garbage
    assert errors == 0
    body = alarms(c)
    rec = motorlib.wait_for(lambda: alarms(c)["recent"], 10, what="alarm recorded")[0]
    assert rec["d_instance_id"] == bad["id"] and rec["p_instance_id"] is None
    assert rec["cleared_by"] == "auto_recovery" and rec["terminated"] == [bad["id"]]
    assert rec["moi"] == f"service name=Coordinator, service ip=127.0.0.1, instanceId={bad['id']}"
    assert rec["alarm"]["alarm_id"] == "0xFC001009" and rec["alarm"]["category"] == "ALARM"
    assert body["active"] == []
    # the coordinator's group was reset by the controller (alarm_cleared) or the answer
    motorlib.wait_for(lambda: co.find_events("precision_state") and
                      co.find_events("precision_state")[-1]["to"] == "clean", 10,
                      what="coordinator group clean")
    # the bad instance is gone from routing; the good one still serves
    motorlib.wait_for(lambda: not routable(mgmt, bad["id"]), 10, what="bad withdrawn")
    assert all(st == 200 for st, _ in chat(infer, 3))
    text = motorlib.get(c.url + "/metrics").text
    assert metric_value(text, "motor_controller_precision_alarms_total", {"category": "ALARM"}) == 1
    assert metric_value(text, "motor_controller_precision_alarms_total", {"category": "CLEAR"}) == 1
    assert metric_value(text, "motor_controller_precision_alarms_active") == 0
    # the node manager stopped its engine and exited 255 (the upstream contract: the
    # platform restarts the pod); its restart brings the job back as a new instance
    assert bad_nm.proc.wait(15) == 255
    sim_nm(procs, tmpdir_path, c.port, "bad", name="nm-bad2", engine=FAST_ENGINE)
    new = wait_job(c, "bad", not_id=bad["id"], timeout=40)
    motorlib.wait_for(lambda: routable(mgmt, new["id"]), 15, what="replacement routable")
    assert all(st == 200 for st, _ in chat(infer, 4))
    assert alarms(c)["active"] == []


def test_without_auto_recovery_alarm_then_clear_and_restart(procs, tmpdir_path):
    c, co, infer, mgmt = fleet(procs, tmpdir_path, auto_recovery=False)
    nm = sim_nm(procs, tmpdir_path, c.port, "solo", name="nm-solo", engine=FAST_ENGINE)
    inst = wait_job(c, "solo")
    motorlib.wait_for(lambda: routable(mgmt, inst["id"]), 15, what="routable")
    call("POST", engine_url(nm) + "/sim/fault", {"mode": "garbled"})
    for _ in range(30):
        assert all(st == 200 for st, _ in chat(infer))
        if alarms(c)["active"]:
            break
    act = alarms(c)["active"]
    assert len(act) == 1 and act[0]["d_instance_id"] == inst["id"], act
    moi = act[0]["moi"]
    assert c.status_of(inst["id"]) == "active"  # no recovery without the switch
    # motor status shows it (and is not healthy while it is active)
    r = subprocess.run([motorlib.motor_bin(), "status", "--controller", c.url, "--coordinator",
                        mgmt, "--json"], capture_output=True, text=True, timeout=20)
    model = json.loads(r.stdout)
    assert r.returncode == 1 and model["healthy"] is False, r.stdout
    assert [(a["alarm_id"], a["d_instance_id"], a["moi"]) for a in model["alarms"]] == \
        [("0xFC001009", inst["id"], act[0]["moi"])]
    r = subprocess.run([motorlib.motor_bin(), "status", "--controller", c.url, "--coordinator",
                        mgmt], capture_output=True, text=True, timeout=20)
    assert "ACTIVE ALARMS (controller)" in r.stdout and "Precision Anomaly Alarm" in r.stdout
    text = motorlib.get(c.url + "/metrics").text
    assert metric_value(text, "motor_controller_precision_alarms_active") == 1

    # bad bodies: 400 (shape), 404 (CLEAR without an active alarm), 409 (another moi)
    for body, code in [(None, 400), ([], 400), ([1], 400), ({"alarm_id": "x"}, 400),
                       ({"alarm_id": "0xFC001009", "category": "ALARM", "moi": "m"}, 400),
                       ({"alarm_id": "0xFC001009", "category": "CLEAR", "instance_id": 999,
                         "moi": "m"}, 404),
                       ({"alarm_id": "0xFC001009", "category": "CLEAR",
                         "instance_id": inst["id"], "p_instance_id": "", "moi": moi + "x"}, 409)]:
        if body is None:
            r = motorlib.post(c.url + "/controller/report_alarms", raw=b"{bad")
            st, out = r.status, r.json()
        else:
            st, out = c.post("/controller/report_alarms", body)
        assert st == code, (body, st, out)
        assert out["message"] if isinstance(out, dict) and "message" in out else out, out
    st, out = c.post("/controller/terminate_instance", {"instance_id": inst["id"],
                                                         "precision_alarm_clear": "yes"})
    assert st == 400 and "precision_alarm_clear" in json.dumps(out)
    st, _ = c.get("/controller/precision/alarms?active=maybe")
    assert st == 400

    # the alarm survives a controller restart (SQLite store)
    cfg = c.config
    rc = c.proc.stop(10)
    assert rc == 0, c.proc.tail()
    c = Controller(procs, cfg, name="controller2", port=c.port)
    act2 = alarms(c)["active"]
    assert [a["moi"] for a in act2] == [moi]

    # the engine recovers: good samples clear it from the coordinator, same moi
    call("POST", engine_url(nm) + "/sim/fault", {"mode": "recover"})
    for _ in range(30):
        assert all(st == 200 for st, _ in chat(infer))
        if not alarms(c)["active"]:
            break
    rec = alarms(c)["recent"]
    assert rec and rec[0]["moi"] == moi and rec[0]["cleared_by"] == "coordinator", rec
    assert c.status_of(inst["id"]) == "active"


def test_manual_clear_through_terminate_instance(procs, tmpdir_path):
    c, co, infer, mgmt = fleet(procs, tmpdir_path, auto_recovery=False)
    nm = sim_nm(procs, tmpdir_path, c.port, "man", name="nm-man", engine=FAST_ENGINE)
    inst = wait_job(c, "man")
    motorlib.wait_for(lambda: routable(mgmt, inst["id"]), 15, what="routable")
    call("POST", engine_url(nm) + "/sim/fault", {"mode": "repeat"})
    for _ in range(30):
        assert all(st == 200 for st, _ in chat(infer))
        if alarms(c)["active"]:
            break
    moi = alarms(c)["active"][0]["moi"]
    st, out = c.post("/controller/terminate_instance",
                     {"instance_id": inst["id"], "reason": "precision control",
                      "precision_alarm_clear": True})
    assert st == 200, out
    d = out["data"]
    assert d["precision_alarm_cleared"] is True and d["moi"] == moi
    assert d["scheduler_state_cleared"] is True and d["terminated"] == [inst["id"]]
    rec = alarms(c)["recent"][0]
    assert rec["cleared_by"] == "manual" and not alarms(c)["active"]
    st, body = call("GET", mgmt + "/precision/status")
    assert st == 200 and body["groups"] == []
    for p in (co, c.proc):  # both exit 0 with no sanitizer report
        rc = p.stop(15)
        out = p.output()
        assert rc == 0 and "Sanitizer" not in out and "runtime error:" not in out, p.tail(40)


def _alarm(d, moi, category="ALARM"):
    return {"alarm_id": "0xFC001009", "alarm_name": "Precision Anomaly Alarm",
            "category": category, "severity": "MAJOR", "event_type": "PROCESSING_ERROR",
            "instance_id": d, "p_instance_id": "", "moi": moi,
            "additional_information": f"precision_issue_count=3, probe_failure_count=0, "
                                      f"p_instance_id=None, d_instance_id={d}"}


@pytest.mark.skipif(not etcd_available() and os.environ.get("MOTOR_REQUIRE_ETCD") != "1",
                    reason="etcd not installed")
def test_alarm_state_survives_restart_on_etcd(procs, tmpdir_path):
    """The same persistence with the etcd store: records under <prefix>precision/<seq>,
    active and cleared ones both back after a restart, the CLEAR's moi checked against
    the reloaded raise."""
    e = Etcd(procs)
    cfg = controller_config(tmpdir_path, motorlib.free_port(),
                            store={"backend": "etcd", "etcd_endpoints": [e.url],
                                   "etcd_prefix": "/prec-test/", "etcd_lease_ttl": 2,
                                   "leader_retry_interval": 0.2})
    c = Controller(procs, cfg, name="controller-1")
    m1, m2 = "service name=Coordinator, service ip=10.0.0.1, instanceId=7", \
        "service name=Coordinator, service ip=10.0.0.1, instanceId=8"
    for body in ([_alarm(7, m1)], {"alarms": [_alarm(8, m2)]}, _alarm(8, m2, "CLEAR")):
        st, out = c.post("/controller/report_alarms", body)
        assert st == 200, out
    motorlib.wait_for(lambda: len([k for k in e.keys("/prec-test/") if "/precision/" in k]) == 2,
                      5, what="two records in etcd")
    rc = c.proc.stop(10)
    assert rc == 0, c.proc.tail()
    c2 = Controller(procs, cfg, name="controller-2", port=c.port)
    body = alarms(c2)
    assert [a["moi"] for a in body["active"]] == [m1]
    assert [(a["moi"], a["cleared_by"]) for a in body["recent"]] == [(m2, "coordinator")]
    st, out = c2.post("/controller/report_alarms", _alarm(7, m1 + " ", "CLEAR"))
    assert st == 409, out
    st, out = c2.post("/controller/report_alarms", _alarm(7, m1, "CLEAR"))
    assert st == 200, out
    assert alarms(c2, active=True)["active"] == []
