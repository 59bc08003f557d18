"""motor coordinator management API: GET /instances, POST /instances/refresh in both
shapes, 400/409/413 rules, add/del/set semantics, model discovery, the management key."""

import socket

from coord_helpers import stop_clean, FAST, ctrl_instance, ext_instance, start_coordinator
from motorlib import free_port, get, http, post, start_sim


def detail(resp, status):
    assert resp.status == status, resp
    d = resp.json()["detail"]
    assert isinstance(d, str) and d
    return d


def test_refresh_shapes_and_instances_view(procs, tmpdir_path):
    p = start_sim(procs, "--model", "m", *FAST, name="p")
    d = start_sim(procs, "--model", "m", *FAST, name="d")
    c = start_coordinator(procs, tmpdir_path)

    # Controller shape, then GET /instances
    r = c.refresh({"event": "add", "instances": [ctrl_instance(2, "decode", d, job="jd"),
                                                  ctrl_instance(1, "prefill", p, job="jp")]})
    assert r.status == 200, r
    body = r.json()
    assert body["status"] == "success" and body["message"] == "Instance refresh completed"
    assert body["data"]["event_type"] == "add" and body["data"]["instance_count"] == 2
    view = c.instances()
    assert view["count"] == 2
    assert [(i["role"], i["id"]) for i in view["instances"]] == [("decode", 2), ("prefill", 1)]
    i1 = view["instances"][1]
    assert i1["job_name"] == "jp" and i1["model_name"] == "m" and i1["status"] == "active"
    assert i1["pool"] == "available" and i1["healthy"] is True
    assert i1["circuit_breaker"] == {"state": "closed", "trip_count": 0, "failure_count": 0,
                                     "current_timeout": 30.0}
    assert i1["endpoints"][0]["ip"] == "127.0.0.1"
    assert i1["endpoints"][0]["business_port"] == str(p.port)
    assert i1["endpoints"][0]["headless"] is False

    # External Deployer shape replaces everything with set
    r = c.refresh({"event": "set", "model_name": "m",
                   "dispatch_capabilities": ["prefill_handoff_decode"], "engine_type": "vllm",
                   "instances": [ext_instance(10, "union", p, d)]})
    assert r.status == 200, r
    view = c.instances()
    assert [i["id"] for i in view["instances"]] == [10]
    assert len(view["instances"][0]["endpoints"]) == 2
    assert c.completion(model="m", prompt="x", max_tokens=1).status == 200

    # headless endpoints are kept but never routed to
    inst = ctrl_instance(11, "union", p)
    inst["endpoints"]["127.0.0.1"]["0"]["headless"] = True
    assert c.refresh({"event": "set", "instances": [inst]}).status == 200
    assert c.completion(model="m", prompt="x", max_tokens=1).status == 503
    stop_clean(c)


def test_refresh_errors(procs, tmpdir_path):
    s = start_sim(procs, "--model", "m", *FAST)
    c = start_coordinator(procs, tmpdir_path)
    base = ctrl_instance(1, "prefill", s, job="j1")
    assert c.refresh({"event": "add", "instances": [base]}).status == 200

    # 400: syntax, shape, duplicate ids, unknown Endpoint fields, bad addresses
    r = post(c.mgmt + "/instances/refresh", raw=b"{", headers={"Content-Type": "application/json"})
    detail(r, 400)
    assert "event" in detail(c.refresh({"event": "merge", "instances": []}), 400)
    assert "duplicate instance id 5" in detail(
        c.refresh({"event": "set", "model_name": "m",
                   "instances": [ext_instance(5, "union", s), ext_instance(5, "union", s)]}), 400)
    bad = ctrl_instance(3, "decode", s)
    bad["endpoints"]["127.0.0.1"]["0"]["mgmt_port"] = "9"
    assert "mgmt_port" in detail(c.refresh({"event": "add", "instances": [bad]}), 400)
    assert "address" in detail(c.refresh({"event": "add", "model_name": "m", "instances": [
        {"id": 4, "role": "decode", "endpoints": [{"id": 0, "address": "no-port"}]}]}), 400)
    assert "role" in detail(c.refresh({"event": "add", "model_name": "m", "instances": [
        {"id": 4, "role": "master", "endpoints": []}]}), 400)

    # 409: same id, another identity; del with a mismatching identity
    other = ctrl_instance(1, "decode", s, job="j1")
    assert "instance 1" in detail(c.refresh({"event": "add", "instances": [other]}), 409)
    other = ctrl_instance(1, "prefill", s, job="another-job")
    detail(c.refresh({"event": "add", "instances": [other]}), 409)
    detail(c.refresh({"event": "del", "instances": [other]}), 409)
    assert [i["id"] for i in c.instances()["instances"]] == [1]
    # the same identity again is fine (idempotent add), del removes, unknown del is a no-op
    assert c.refresh({"event": "add", "instances": [base]}).status == 200
    assert c.refresh({"event": "del", "instances": [base]}).status == 200
    assert c.instances()["count"] == 0
    assert c.refresh({"event": "del", "instances": [base]}).status == 200

    # 413: over 10 MB
    big = b'{"event":"set","instances":[],"pad":"' + b"x" * (10 * 1024 * 1024 + 10) + b'"}'
    try:
        r = post(c.mgmt + "/instances/refresh", raw=big,
                 headers={"Content-Type": "application/json"}, timeout=20)
        assert r.status == 413, r
    except (ConnectionError, socket.error):
        pass  # the server may close while we are still sending; it must still be alive
    assert get(c.mgmt + "/liveness").status == 200
    assert c.proc.alive()
    stop_clean(c)


def test_model_discovery(procs, tmpdir_path):
    s = start_sim(procs, "--model", "discovered", *FAST)
    c = start_coordinator(procs, tmpdir_path)
    r = c.refresh({"event": "set", "instances": [ext_instance(1, "union", s)]})
    assert r.status == 200, r
    assert c.instances()["instances"][0]["model_name"] == "discovered"
    assert c.completion(model="discovered", prompt="x", max_tokens=1).status == 200
    assert [m["id"] for m in get(c.url + "/v1/models").json()["data"]] == ["discovered"]
    c.proc.wait_event("model_discovered", model="discovered")

    # an engine that cannot tell (two served names) and one that is not there: 400
    two = start_sim(procs, "--model", "a", "--served-model-name", "a", "b", *FAST, name="two")
    r = c.refresh({"event": "set", "instances": [ext_instance(2, "union", two)]})
    assert "exactly one model" in detail(r, 400)
    dead = free_port()
    r = c.refresh({"event": "set", "instances": [
        {"id": 3, "role": "union", "endpoints": [{"id": 0, "address": f"127.0.0.1:{dead}"}]}]})
    assert "discovery" in detail(r, 400)
    # the table kept the last good state
    assert [i["id"] for i in c.instances()["instances"]] == [1]
    stop_clean(c)


def test_management_key(procs, tmpdir_path):
    keyfile = f"{tmpdir_path}/mgmt.key"
    with open(keyfile, "w") as f:
        f.write("top-secret\n")
    c = start_coordinator(procs, tmpdir_path, {"mgmt_api_key_config": {
        "enable_api_key": True, "api_key_file": keyfile}})
    body = {"event": "set", "model_name": "m", "instances": []}
    assert c.refresh(body).status == 401
    assert c.refresh(body, key="wrong").status == 403
    assert c.refresh(body, key="top-secret").status == 200
    assert get(c.mgmt + "/instances").status == 401
    assert get(c.mgmt + "/instances", headers={"X-Motor-Management-Key": "nope"}).status == 403
    assert c.instances(key="top-secret")["count"] == 0
    for path in ("/liveness", "/startup", "/readiness", "/health"):
        assert get(c.mgmt + path).status == 200, path
    ready = get(c.mgmt + "/readiness").json()
    # upstream's fields, plus the (motor) boot id a controller uses to see restarts
    boot = ready.pop("boot_id")
    assert isinstance(ready.pop("started_at"), float)
    assert ready == {"status": "ok", "message": "Coordinator is ok", "ready": False}
    assert len(boot) == 32 and int(boot, 16) >= 0
    assert get(c.mgmt + "/liveness").json()["boot_id"] == boot
    r = c.refresh(body, key="top-secret")
    assert r.status == 200 and r.json()["data"]["boot_id"] == boot
    # the inference port is not protected by the management key
    assert get(c.url + "/v1/models").status == 200
    assert http("DELETE", c.mgmt + "/instances", headers={
        "X-Motor-Management-Key": "top-secret"}).status == 405
    stop_clean(c)
