"""motor node-manager: registration, start, heartbeats, the HTTP API (spec §4, §5).

A FakeController records what the node manager sends; engines are `motor engine-sim`."""

import json
import os
import subprocess
import time

import pytest

import motorlib
from fake_controller import (FakeController, nm_config, start_body, start_nm, write_json)


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def test_register_payload_and_backoff(procs, tmpdir_path, ctl):
    # Refused twice (the Controller's "error" body, HTTP 200), then accepted.
    ctl.set("/controller/register", body={"error": "Instance already registered"}, times=2)
    cfg = nm_config(controller_port=ctl.port, engine_config={"data_parallel_size": 2},
                    endpoints=2)
    hccl = {"version": "1.0", "status": "completed", "server_count": "1",
            "server_list": [{"server_id": "127.0.0.1",
                             "device": [{"device_id": "0", "device_ip": "192.168.1.1",
                                         "rank_id": "0"}]}]}
    hccl_path = write_json(os.path.join(tmpdir_path, "hccl.json"), hccl)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                  env={"HCCL_PATH": hccl_path})
    r0 = ctl.wait_request("/controller/register", timeout=5)
    r1 = ctl.wait_request("/controller/register", after=1, timeout=5)
    r2 = ctl.wait_request("/controller/register", after=2, timeout=8)
    nm.wait_event("registered", timeout=5)

    body = r0.body
    base = cfg["motor_engine_union_config"]["motor_nodemanger_config"]["endpoint_config"][
        "base_port"]
    assert body["job_name"] == "job1"
    assert body["model_name"] == "demo"
    assert body["engine_type"] == "vllm"  # the simulator speaks vLLM's surface
    assert body["role"] == "union"
    assert body["pod_ip"] == "127.0.0.1"
    assert body["business_port"] == [str(base), str(base + 2)]
    assert body["nm_port"] == str(nm.port)
    assert body["parallel_config"]["dp_size"] == 2
    assert body["parallel_config"]["world_size"] == 2
    assert body["device_num"] == 2
    assert body["nnodes"] == 1 and body["is_master"] is False
    assert body["enable_multi_endpoints"] is True
    assert isinstance(body["dispatch_capabilities"], list)
    assert set(body["ft_capability"]) >= {"enabled", "scale_down_supported"}
    assert "mgmt_port" not in body
    assert body["ranktable"]["server_list"][0]["device"][0]["device_ip"] == "192.168.1.1"
    # Backoff 2 s, then 4 s (§2.8).
    assert 1.7 <= r1.t - r0.t <= 3.5, r1.t - r0.t
    assert 3.6 <= r2.t - r1.t <= 6.0, r2.t - r1.t


def test_start_ready_heartbeats_and_api(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port, engine_config={"data_parallel_size": 2},
                    endpoints=2)
    rt_path = os.path.join(tmpdir_path, "ranktable.json")
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                  env={"RANKTABLE_PATH": rt_path})
    ctl.wait_request("/controller/register", timeout=5)
    # Before a start: nothing to be ready for.
    assert nm.status() is False and nm.status(relaxed=True) is False
    assert nm.get("/readiness").status == 503

    ranktable = {"version": "1.2", "status": "completed", "server_count": "1",
                 "server_list": [{"server_id": "127.0.0.1", "container_ip": "127.0.0.1",
                                  "device": [{"device_id": "0", "rank_id": "0",
                                              "device_ip": None}],
                                  "host_ip": "dropped"}]}
    body = start_body(cfg, instance_id=7, ranktable=ranktable)
    r = nm.post("/node-manager/start", body)
    assert r.status == 200 and r.json() == {}, r

    hb = ctl.wait_request("/controller/heartbeat",
                          lambda rec: rec.body["status"] == {"0": "normal", "1": "normal"},
                          timeout=15)
    assert hb.body["job_name"] == "job1"
    assert hb.body["ins_id"] == 7
    assert hb.body["ip"] == "127.0.0.1"
    # Heartbeats ride one kept-alive connection (§5.6), not a connection each.
    hbs = ctl.of("/controller/heartbeat")[-4:]
    assert len({r.peer for r in hbs}) == 1, [r.peer for r in hbs]
    assert nm.status() is True and nm.status(relaxed=True) is True
    r = nm.get("/readiness")
    assert r.status == 200 and r.json() == {"message": "Node manager is ready"}

    # Ranktable written with nulls and unknown keys dropped (§5.5).
    with open(rt_path) as f:
        written = json.load(f)
    assert written["server_list"][0]["device"] == [{"device_id": "0", "rank_id": "0"}]
    assert "host_ip" not in written["server_list"][0]

    view = nm.engines()
    assert view["instance_id"] == 7
    pids = [e["pid"] for e in view["endpoints"]]
    assert all(isinstance(p, int) and motorlib.pid_alive(p) for p in pids)
    assert [e["state"] for e in view["endpoints"]] == ["ready", "ready"]
    assert [e["restarts"] for e in view["endpoints"]] == [0, 0]

    logs = nm.get("/node-manager/engines/1/logs?tail=50")
    assert logs.status == 200 and "sim_ready" in logs.text
    assert nm.get("/node-manager/engines/9/logs").status == 404
    assert nm.get("/node-manager/engines/0/logs?tail=-1").status == 400

    metrics = nm.get("/metrics")
    assert metrics.status == 200
    assert "motor_nm_engine_spawns_total 2" in metrics.text
    assert 'motor_nm_endpoint_status{endpoint_id="1",status="normal"} 1' in metrics.text

    # The Controller's retry of the same command changes nothing (§12.14 fix).
    r = nm.post("/node-manager/start", body)
    assert r.status == 200
    assert [e["pid"] for e in nm.engines()["endpoints"]] == pids

    # Pause / resume (§4).
    r = nm.post("/node-manager/pause")
    assert r.status == 200
    pj = r.json()
    assert pj["status"] == "ok" and pj["message"] == "Endpoints set to PAUSED"
    base = cfg["motor_engine_union_config"]["motor_nodemanger_config"]["endpoint_config"][
        "base_port"]
    assert pj["engine_metrics_targets"] == [f"http://127.0.0.1:{base}/metrics",
                                            f"http://127.0.0.1:{base + 2}/metrics"]
    ctl.wait_request("/controller/heartbeat",
                     lambda rec: rec.body["status"] == {"0": "paused", "1": "paused"}, timeout=5)
    assert nm.status(relaxed=True) is True and nm.status() is False
    r = nm.post("/node-manager/resume")
    assert r.status == 200 and r.json()["message"] == "Endpoints resumed to NORMAL"
    n = len(ctl.of("/controller/heartbeat"))
    ctl.wait_request("/controller/heartbeat",
                     lambda rec: rec.body["status"] == {"0": "normal", "1": "normal"},
                     after=0, timeout=5)
    assert len(ctl.of("/controller/heartbeat")) >= n


def test_bad_start_bodies(procs, tmpdir_path):
    cfg = nm_config(engine_config={"data_parallel_size": 2}, endpoints=2)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    url = nm.url + "/node-manager/start"
    good = start_body(cfg)

    def post_raw(raw):
        return motorlib.http("POST", url, raw=raw, headers={"Content-Type": "application/json"})

    cases_400 = [
        post_raw(b"{not json"),
        post_raw(b""),
        nm.post("/node-manager/start", [1, 2]),
        nm.post("/node-manager/start", {k: v for k, v in good.items() if k != "endpoints"}),
        nm.post("/node-manager/start", dict(good, instance_id="seven")),
        nm.post("/node-manager/start", dict(good, role="chef")),
        nm.post("/node-manager/start",
                dict(good, endpoints=[dict(good["endpoints"][0], business_port="abc"),
                                      good["endpoints"][1]])),
    ]
    for r in cases_400:
        assert r.status == 400, r
        assert r.json()["detail"].startswith("Invalid start command payload"), r

    cases_422 = [
        nm.post("/node-manager/start", dict(good, job_name="other")),
        nm.post("/node-manager/start", dict(good, endpoints=good["endpoints"][:1])),
        nm.post("/node-manager/start",
                dict(good, endpoints=[good["endpoints"][0],
                                      dict(good["endpoints"][1], ip="10.9.9.9")])),
    ]
    for r in cases_422:
        assert r.status == 422, r
        assert r.json()["detail"].startswith("Start command validation failed"), r
    # Nothing was launched by any of them.
    assert nm.engines()["endpoints"] == []
    assert nm.alive()


def test_ft_proxy_routes_404_when_disabled(procs, tmpdir_path):
    # Controller enable_dp_scale_down defaults to false: the proxy switch is off (§3.3).
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), nm_config()))
    bodies = {
        "guard": {"request_id": "r1", "lease_sec": 10},
        "status": {"endpoint_ids": [0]},
        "apply": {"endpoint_ids": [0], "instruction": "retry", "params": {}, "request_id": "r1"},
        "finalize": {"request_id": "r1", "retired_endpoint_ids": [], "commit": False},
    }
    for name, body in bodies.items():
        r = nm.post(f"/node-manager/fault-tolerance/{name}", body)
        assert r.status == 404, (name, r)
        assert r.json() == {"detail": "fault tolerance proxy disabled"}, (name, r)


def test_management_key(procs, tmpdir_path):
    cfg = nm_config(nm={"management_api_key": "s3cret"})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    r = nm.post("/node-manager/start", {})
    assert r.status == 401, r
    r = nm.post("/node-manager/start", {}, headers={"X-Motor-Management-Key": "wrong"})
    assert r.status == 403, r
    r = nm.post("/node-manager/engine-restart", {"action": "abort"})
    assert r.status == 401, r
    # With the key the request reaches the handler (and is judged on its body).
    r = nm.post("/node-manager/start", {}, headers={"X-Motor-Management-Key": "s3cret"})
    assert r.status == 400, r
    # Read-only routes need no key.
    assert nm.get("/node-manager/status").status == 200
    assert nm.get("/node-manager/engines").status == 200
    assert nm.get("/metrics").status == 200


def test_invalid_config_exits_1_listing_every_error(tmpdir_path, motor):
    cfg = nm_config(basic={"heartbeat_interval_seconds": -1},
                    nm={"api_config": {"pod_ip": "127.0.0.1", "node_manager_port": 0}})
    path = write_json(os.path.join(tmpdir_path, "bad.json"), cfg)
    env = dict(os.environ, ROLE="union")
    p = subprocess.run([motor, "node-manager", "--config", path, "--port", "0"], env=env,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 1, p
    assert "node_manager_port" in p.stderr and "heartbeat_interval_seconds" in p.stderr, p.stderr
    # --check-config prints the effective configuration (same loader).
    good = write_json(os.path.join(tmpdir_path, "good.json"), nm_config())
    p = subprocess.run([motor, "node-manager", "--check-config", "--config", good], env=env,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    eff = json.loads(p.stdout)
    assert eff["basic_config"]["job_name"] == "job1"
    p = subprocess.run([motor, "node-manager", "--check-config", "--config", path], env=env,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 1


def test_unset_pod_ip_binds_the_wildcard_and_advertises_a_routable_address(tmpdir_path, motor):
    """Seed 000: without pod_ip (file or $POD_IP) upstream's API host falls back to
    0.0.0.0; Motor binds the wildcard too but registers an address peers can reach (here
    the source address of the route to the Controller at 127.0.0.1), never 0.0.0.0."""
    cfg = nm_config()
    del cfg["motor_engine_union_config"]["motor_nodemanger_config"]["api_config"]["pod_ip"]
    path = write_json(os.path.join(tmpdir_path, "nopod.json"), cfg)
    env = {k: v for k, v in os.environ.items() if k != "POD_IP"}
    env["ROLE"] = "union"
    p = subprocess.run([motor, "node-manager", "--check-config", "--config", path], env=env,
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    eff = json.loads(p.stdout)
    assert eff["motor"]["bind_host"] == "0.0.0.0" and eff["motor"]["pod_ip_detected"] is True
    assert eff["api_config"]["pod_ip"] == "127.0.0.1"
    # a configured pod_ip is both the bind and the advertised address
    env["POD_IP"] = "127.0.0.1"
    p = subprocess.run([motor, "node-manager", "--check-config", "--config", path], env=env,
                       capture_output=True, text=True, timeout=20)
    eff = json.loads(p.stdout)
    assert eff["motor"]["bind_host"] == "127.0.0.1" and eff["motor"]["pod_ip_detected"] is False


def test_slow_controller_never_stalls_api_or_probes(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    assert nm.post("/node-manager/start", start_body(cfg)).status == 200
    nm.wait_ready()
    ctl.set("/controller/heartbeat", hang=True)
    ctl.wait_request("/controller/heartbeat", after=len(ctl.of("/controller/heartbeat")),
                     timeout=5)
    # The API answers at once while a heartbeat hangs.
    t0 = time.monotonic()
    for _ in range(10):
        assert nm.get("/node-manager/status", timeout=2).status == 200
    assert time.monotonic() - t0 < 2.0
    # A death is still noticed and reported at once (reports do not wait for heartbeats).
    pid = nm.endpoint()["pid"]
    os.kill(pid, 9)
    rep = ctl.wait_request("/controller/report_software_fault", timeout=3)
    assert rep.body["engine_id"] == 0 and rep.body["engine_status"] == 1
    motorlib.wait_for(lambda: nm.endpoint()["state"] == "stopped", 3, what="endpoint stopped")
    ctl.release()


def test_heartbeat_503_reregisters(procs, tmpdir_path, ctl):
    cfg = nm_config(controller_port=ctl.port)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    assert nm.post("/node-manager/start", start_body(cfg, instance_id=4)).status == 200
    ctl.wait_request("/controller/heartbeat", timeout=5)
    # Any 503 means "unknown instance", whatever the body says (§12.10 fix); other errors
    # (500 here) never cause a re-registration.
    ctl.set("/controller/heartbeat", status=500, body={"detail": "boom 503"}, times=2)
    n = len(ctl.of("/controller/heartbeat"))
    ctl.wait_request("/controller/heartbeat", after=n + 1, timeout=5)
    assert ctl.count("/controller/reregister") == 0
    ctl.set("/controller/heartbeat", status=503, body={"detail": "need to re-register"}, times=1)
    rr = ctl.wait_request("/controller/reregister", timeout=5)
    assert rr.body["instance_id"] == 4
    assert rr.body["job_name"] == "job1"
    assert rr.body["nm_port"] == str(nm.port)
    assert [e["id"] for e in rr.body["endpoints"]] == [0]
    assert rr.body["endpoints"][0]["business_port"] == start_body(cfg)["endpoints"][0][
        "business_port"]
    nm.wait_event("reregistered", timeout=5)
