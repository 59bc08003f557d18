"""motor node-manager: the DP scale-down proxy routes (spec §4, §8.3) —
/node-manager/fault-tolerance/{status,apply,guard,finalize} — with real engines
(`motor engine-sim --ft`, two DP ranks forming a simulated DP group)."""

import os
import signal

import pytest

import motorlib
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json

FT = "/node-manager/fault-tolerance"
PROXY_ON = {"enable_fault_tolerance": True, "enable_dp_scale_down": True}


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def raw_post(nm, path, data: bytes):
    return motorlib.http("POST", nm.url + path, raw=data,
                         headers={"Content-Type": "application/json"})


def ft_state(nm):
    r = nm.get(FT)
    assert r.status == 200, r
    return r.json()


def test_routes_404_when_off_and_parse_order(procs, tmpdir_path):
    # Controller enable_dp_scale_down defaults to false: the proxy switch is off.
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), nm_config()))
    # guard checks the switch before it looks at the body.
    for data in (b"not json", b"[1]", b'{"request_id": 5}'):
        r = raw_post(nm, FT + "/guard", data)
        assert r.status == 404, (data, r)
        assert r.json() == {"detail": "fault tolerance proxy disabled"}
    # status/apply/finalize parse first: a malformed body is a 400 even when off ...
    malformed = {
        "status": [b"not json", b'{"endpoint_ids": []}', b'{"endpoint_ids": ["a"]}', b"[]"],
        "apply": [b'{"endpoint_ids": [0], "instruction": "dance", "request_id": "r"}',
                  b'{"endpoint_ids": [0], "instruction": "retry", "params": 3,'
                  b' "request_id": "r"}',
                  b'{"instruction": "retry", "request_id": "r"}'],
        "finalize": [b'{"request_id": "r", "commit": true}',
                     b'{"request_id": "r", "retired_endpoint_ids": [0], "commit": "yes"}',
                     b'{"request_id": "r", "retired_endpoint_ids": [-1], "commit": true}'],
    }
    for name, bodies in malformed.items():
        for data in bodies:
            r = raw_post(nm, f"{FT}/{name}", data)
            assert r.status == 400, (name, data, r)
            assert "detail" in r.json()
    # ... and a well-formed one (even with a value rule broken: duplicates) is a 404.
    wellformed = {
        "status": {"endpoint_ids": [0, 0]},
        "apply": {"endpoint_ids": [0], "instruction": "scale_down", "params": {},
                  "request_id": "r1"},
        "finalize": {"request_id": "r1", "retired_endpoint_ids": [], "commit": True},
    }
    for name, body in wellformed.items():
        r = nm.post(f"{FT}/{name}", body)
        assert r.status == 404 and r.json() == {"detail": "fault tolerance proxy disabled"}, \
            (name, r)
    assert ft_state(nm)["proxy_enabled"] is False


def test_guard_and_finalize_ownership(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port, controller_ft=PROXY_ON)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    assert ft_state(nm)["proxy_enabled"] is True
    assert nm.engines()["frozen"] is False

    # Body rules: shape errors 400, value rules 502.
    assert raw_post(nm, FT + "/guard", b"nope").status == 400
    assert nm.post(FT + "/guard", {"request_id": "a", "lease_sec": "10"}).status == 400
    assert nm.post(FT + "/guard", {"lease_sec": 10}).status == 400
    for body in ({"request_id": "a", "lease_sec": 0}, {"request_id": "a", "lease_sec": 300.5},
                 {"request_id": "a", "lease_sec": -1}, {"request_id": "", "lease_sec": 5}):
        r = nm.post(FT + "/guard", body)
        assert r.status == 502, (body, r)
        assert r.json()["detail"].startswith("Engine FT guard failed"), r
    assert nm.engines()["frozen"] is False

    # Finalize without any guard: stale.
    r = nm.post(FT + "/finalize", {"request_id": "a", "retired_endpoint_ids": [],
                                   "commit": False})
    assert r.status == 502 and "stale" in r.json()["detail"], r

    r = nm.post(FT + "/guard", {"request_id": "tx-1", "lease_sec": 1.5})
    assert r.status == 200 and r.json() == {"status": "guarded"}, r
    assert nm.engines()["frozen"] is True  # suicide frozen for the lease
    st = ft_state(nm)
    assert st["guard_owner"] == "tx-1" and 0 < st["guard_left_seconds"] <= 1.5

    # Another transaction while the lease runs: rejected; the owner may renew.
    r = nm.post(FT + "/guard", {"request_id": "tx-2", "lease_sec": 10})
    assert r.status == 502 and "tx-1" in r.json()["detail"], r
    assert nm.post(FT + "/guard", {"request_id": "tx-1", "lease_sec": 1.5}).status == 200
    r = nm.post(FT + "/finalize", {"request_id": "tx-2", "retired_endpoint_ids": [],
                                   "commit": False})
    assert r.status == 502 and "stale" in r.json()["detail"], r
    assert ft_state(nm)["guard_owner"] == "tx-1"

    # Once the lease expired another transaction takes over (finalize got lost).
    motorlib.wait_for(lambda: ft_state(nm)["guard_left_seconds"] == 0, timeout=5,
                      what="guard lease expiry")
    assert nm.engines()["frozen"] is False
    r = nm.post(FT + "/guard", {"request_id": "tx-2", "lease_sec": 30})
    assert r.status == 200, r
    # The old owner is stale now.
    r = nm.post(FT + "/finalize", {"request_id": "tx-1", "retired_endpoint_ids": [],
                                   "commit": False})
    assert r.status == 502 and "stale" in r.json()["detail"], r
    # Commit with ids this pod does not manage: 502, guard kept (nothing changed).
    r = nm.post(FT + "/finalize", {"request_id": "tx-2", "retired_endpoint_ids": [7],
                                   "commit": True})
    assert r.status == 502 and "not managed" in r.json()["detail"], r
    assert ft_state(nm)["guard_owner"] == "tx-2" and nm.engines()["frozen"] is True
    # Abort releases the guard and lifts the freeze at once.
    r = nm.post(FT + "/finalize", {"request_id": "tx-2", "retired_endpoint_ids": [7],
                                   "commit": False})
    assert r.status == 200 and r.json() == {"status": "aborted"}, r
    assert ft_state(nm)["guard_owner"] is None
    assert nm.engines()["frozen"] is False
    nm.wait_event("suicide_unfrozen", cause="ft_guard", why="ft finalize abort", timeout=2)
    # A second finalize of the same transaction is stale.
    r = nm.post(FT + "/finalize", {"request_id": "tx-2", "retired_endpoint_ids": [],
                                   "commit": False})
    assert r.status == 502, r


def sim_fault(port, mode):
    r = motorlib.post(f"http://127.0.0.1:{port}/sim/fault", {"mode": mode})
    assert r.status == 200, r


def test_status_apply_commit_retires(procs, tmpdir_path, ctl):
    master_port = motorlib.free_port()
    cfg = nm_config(controller_port=ctl.port, controller_ft=PROXY_ON, endpoints=2,
                    engine_config={"data_parallel_size": 2, "enable_fault_tolerance": True,
                                   "data_parallel_master_port": master_port,
                                   "ft_recover_ms": 200},
                    ft={"container_restart_managed": False, "poll_interval_sec": 0.2})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    body = start_body(cfg, instance_id=4)
    assert nm.post("/node-manager/start", body).status == 200
    nm.wait_ready()
    ports = [int(ep["business_port"]) for ep in body["endpoints"]]
    # The simulated DP group is formed (rank 0 is its master).
    nm.wait_event("sim_dp_group_formed", timeout=10)

    # status: every engine's own entry, keyed by endpoint id.
    r = nm.post(FT + "/status", {"endpoint_ids": [0, 1]})
    assert r.status == 200, r
    st = r.json()
    assert set(st) == {"0", "1"}
    assert st["0"]["id"] == 0 and st["0"]["status"] == "healthy"
    assert st["1"]["id"] == 1 and st["1"]["status"] == "healthy"
    for ids in ([0, 5], [0, 0]):
        r = nm.post(FT + "/status", {"endpoint_ids": ids})
        assert r.status == 502 and r.json()["detail"].startswith(
            "Engine FT status query failed"), (ids, r)

    # A transaction: guard, rank 0 dies in the FT sense, the survivor turns unhealthy.
    assert nm.post(FT + "/guard", {"request_id": "sd-1", "lease_sec": 60}).status == 200
    sim_fault(ports[0], "ft_dead")
    sim_fault(ports[1], "unhealthy")
    st = nm.post(FT + "/status", {"endpoint_ids": [0, 1]}).json()
    assert st["0"]["status"] == "dead" and st["1"]["status"] == "unhealthy", st
    assert "ft_state" not in st["1"]  # ready for apply

    # apply: the NM supplies dp_store_port = dp_master_port + dp_master_rank and strips
    # the rank; the dead engine refuses (409) => 502 naming it.
    r = nm.post(FT + "/apply", {"endpoint_ids": [0], "instruction": "scale_down",
                                "params": {"removed_dp_ranks": [1]}, "request_id": "sd-1"})
    assert r.status == 502 and "endpoint 0" in r.json()["detail"], r
    params = {"removed_dp_ranks": [0], "dp_master_ip": "127.0.0.1", "dp_master_rank": 1}
    r = nm.post(FT + "/apply", {"endpoint_ids": [1], "instruction": "scale_down",
                                "params": params, "request_id": "sd-1"})
    assert r.status == 200 and r.json() == {"status": "accepted"}, r
    ev = nm.wait_event("sim_ft_apply", request_id="sd-1", timeout=5)
    got = ev["params"]
    assert got["dp_store_port"] == master_port + 1, got
    assert "dp_master_rank" not in got and got["removed_dp_ranks"] == [0], got
    # Out-of-range master rank: the port would leave 1..65535.
    r = nm.post(FT + "/apply", {"endpoint_ids": [1], "instruction": "scale_down",
                                "params": {"removed_dp_ranks": [0], "dp_master_rank": 70000},
                                "request_id": "sd-1"})
    assert r.status == 502, r
    # The survivor recovers: unhealthy/recovering, then healthy.
    motorlib.wait_for(lambda: nm.post(FT + "/status", {"endpoint_ids": [1]}).json()["1"]
                      ["status"] == "healthy", timeout=10, what="survivor healthy")

    # finalize commit retires endpoint 0 everywhere.
    r = nm.post(FT + "/finalize", {"request_id": "sd-1", "retired_endpoint_ids": [0],
                                   "commit": True, "dp_master_rank": 1})
    assert r.status == 200 and r.json() == {"status": "committed"}, r
    assert nm.endpoint(0)["retired"] is True and nm.endpoint(1)["retired"] is False
    assert ft_state(nm)["guard_owner"] is None
    # The guard's freeze is lifted at once, or (the node manager's probes may not have
    # seen the survivor healthy yet) as soon as they do.
    nm.wait_event("suicide_unfrozen", cause="ft_guard", timeout=5)
    # Heartbeats carry the survivor only (from the next one on).
    n_hb = ctl.count("/controller/heartbeat")
    hb = ctl.wait_request("/controller/heartbeat", after=n_hb, timeout=5)
    assert set(hb.body["status"]) == {"1"}, hb.body
    # Retired ids are no longer proxied.
    r = nm.post(FT + "/status", {"endpoint_ids": [0]})
    assert r.status == 502 and "retired" in r.json()["detail"], r
    assert [e["id"] for e in ft_state(nm)["endpoints"] if not e["retired"]] == [1]
    # The strict status only looks at the survivors.
    motorlib.wait_for(lambda: nm.status(), timeout=10, what="status true without rank 0")

    # The retired engine's death is not reported.
    def reports_for(eid):
        return [r for r in ctl.of("/controller/report_software_fault")
                if r.body and r.body.get("engine_id") == eid]
    before = len(reports_for(0))
    pid0 = nm.endpoint(0)["pid"]
    os.kill(pid0, signal.SIGKILL)
    nm.wait_event("engine_exited", endpoint_id=0, timeout=5)
    n_hb = ctl.count("/controller/heartbeat")
    hb = ctl.wait_request("/controller/heartbeat", after=n_hb + 1, timeout=5)
    assert set(hb.body["status"]) == {"1"}, hb.body
    assert len(reports_for(0)) == before, [r.body for r in reports_for(0)]
    assert not nm.find_events("engine_death_reporting", endpoint_id=0)
    assert nm.alive()


def test_commit_waits_for_recovering_survivors(procs, tmpdir_path, ctl):
    """Regression: a finalize commit lifted the guard freeze at once, so the next
    arbitration round reported survivors whose /health had not recovered yet (the node
    manager's probes lag the FT status the Controller checked before committing) as
    EngineDeadError. After a commit the guard freeze now lasts until no survivor is
    abnormal (bounded), then arbitration is live again."""
    master_port = motorlib.free_port()
    cfg = nm_config(controller_port=ctl.port, controller_ft=PROXY_ON, endpoints=2,
                    engine_config={"data_parallel_size": 2, "enable_fault_tolerance": True,
                                   "data_parallel_master_port": master_port,
                                   "ft_recover_ms": 1500},
                    health={"health_collector_timeout_retry_attempts": 1},
                    # accepted reports must not freeze: only the guard's freeze is tested
                    ft={"container_restart_managed": False, "enable_engine_relaunch": False})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    body = start_body(cfg, instance_id=4)
    assert nm.post("/node-manager/start", body).status == 200
    nm.wait_ready()
    ports = [int(ep["business_port"]) for ep in body["endpoints"]]
    nm.wait_event("sim_dp_group_formed", timeout=10)

    def arb_reports(eid):
        return [r for r in ctl.of("/controller/report_software_fault")
                if r.body and r.body.get("engine_id") == eid and
                (r.body.get("additional_info") or {}).get("source") == "arbitration"]

    assert nm.post(FT + "/guard", {"request_id": "sd-1", "lease_sec": 60}).status == 200
    sim_fault(ports[0], "ft_dead")
    sim_fault(ports[1], "unhealthy")
    motorlib.wait_for(lambda: nm.endpoint(1)["status"] == "abnormal", timeout=5,
                      what="survivor abnormal in the node manager's view")
    params = {"removed_dp_ranks": [0], "dp_master_ip": "127.0.0.1", "dp_master_rank": 1}
    r = nm.post(FT + "/apply", {"endpoint_ids": [1], "instruction": "scale_down",
                                "params": params, "request_id": "sd-1"})
    assert r.status == 200, r
    # Commit while the survivor still recovers (its /health answers 503 for 1.5 s): the
    # node manager's view of it is still abnormal, as right after a real commit.
    r = nm.post(FT + "/finalize", {"request_id": "sd-1", "retired_endpoint_ids": [0],
                                   "commit": True, "dp_master_rank": 1})
    assert r.status == 200 and r.json() == {"status": "committed"}, r
    assert ft_state(nm)["guard_owner"] is None
    assert nm.engines()["frozen"] is True
    assert ft_state(nm)["commit_settling"] is True
    nm.wait_event("ft_commit_settled", timeout=10)
    assert nm.endpoint(1)["status"] == "normal"
    assert nm.engines()["frozen"] is False
    # Several arbitration rounds went by while the survivor was abnormal: none reported it.
    assert arb_reports(1) == [], [r.body for r in arb_reports(1)]
    assert not nm.find_events("endpoint_abnormal_reporting", endpoint_id=1)

    # Arbitration is live again: a real fault of the survivor is reported.
    sim_fault(ports[1], "unhealthy")
    nm.wait_event("endpoint_abnormal_reporting", endpoint_id=1, timeout=5)
    motorlib.wait_for(lambda: arb_reports(1), timeout=5, what="arbitration report")

    # A survivor that never comes back does not keep arbitration frozen: the post-commit
    # window is bounded by the rest of the lease (at least probe period + probe timeout +
    # one round, here about 1.4 s).
    assert nm.post(FT + "/guard", {"request_id": "sd-2", "lease_sec": 2}).status == 200
    r = nm.post(FT + "/finalize", {"request_id": "sd-2", "retired_endpoint_ids": [],
                                   "commit": True})
    assert r.status == 200, r
    assert nm.engines()["frozen"] is True
    nm.wait_event("ft_commit_settle_expired", timeout=10)
    assert nm.engines()["frozen"] is False
    assert ft_state(nm)["commit_settling"] is False
    nm.wait_event("arbitration_abnormal", after=len(nm.find_events("arbitration_abnormal")),
                  timeout=5)
