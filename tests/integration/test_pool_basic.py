"""Worker pool: manifests (API and directory, validation), cold start then warm reuse,
the invoke forwarder (headers, streaming, non-JSON and invalid replies), the seed's venv
conveniences."""

import json
import os
import time
import urllib.request

import motorlib
from motorlib import get, http, wait_for
from pool_helpers import BASE, PY, WORKER, manifest, start_pool


def test_cold_start_then_warm_reuse(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("echo")])
    t0 = time.monotonic()
    r1 = pool.invoke("echo", {"input": "first"})
    cold = time.monotonic() - t0
    assert r1.status == 200, r1
    b1 = r1.json()
    inst = r1.headers["x-motor-instance-id"]
    assert inst.startswith("ni_")
    assert b1["output"] == {"echo": "first"}
    # The worker saw the instance id both in its environment and in the request header.
    assert b1["instance_id"] == inst and b1["env_instance_id"] == inst
    assert b1["node_id"] == "echo"

    t0 = time.monotonic()
    r2 = pool.invoke("echo", {"input": "second"})
    warm = time.monotonic() - t0
    assert r2.status == 200
    assert r2.headers["x-motor-instance-id"] == inst  # reused
    assert r2.json()["pid"] == b1["pid"]
    assert warm < cold

    [i] = pool.instances()
    assert i["id"] == inst and i["state"] == "ready" and i["calls"] == 2
    assert i["busy"] == 0 and i["pid"] == b1["pid"] and i["address"].startswith("http://127.0.0.1:")
    assert i["idle_seconds"] >= 0
    assert any("listening on" in line for line in i["stderr_tail"])
    ev = pool.proc.wait_event("pool_instance_ready", instance_id=inst)
    assert ev["startup_ms"] >= 0
    # Stopping the pool stops the worker: nothing is left behind.
    assert pool.stop() == 0
    motorlib.assert_no_process(b1["pid"])


def test_manifest_api_crud(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path)
    m = manifest("asr", max_concurrency=2, env={"MODEL": "tiny"}, name="Speech recognition")
    r = pool.register(m)
    assert r.status == 201, r
    node = r.json()
    assert node["id"] == "asr"
    assert node["manifest"]["max_concurrency"] == 2
    assert node["manifest"]["env"] == {"MODEL": "tiny"}
    assert node["manifest"]["name"] == "Speech recognition"  # unknown fields kept
    assert node["manifest"]["queue_timeout_seconds"] == 10  # defaults to invoke timeout
    assert node["source"] == "api"

    r = get(pool.url + BASE + "/nodes")
    assert r.status == 200 and [n["id"] for n in r.json()["nodes"]] == ["asr"]
    assert pool.node("asr").json()["manifest"]["command"] == [PY, WORKER]
    assert pool.node("nope").status == 404

    # The env reaches the worker.
    r = pool.invoke("asr", {"env_keys": ["MODEL", "MOTOR_POOL_NODE_ID"]})
    assert r.status == 200, r
    assert r.json()["env"] == {"MODEL": "tiny", "MOTOR_POOL_NODE_ID": "asr"}
    pid = r.json()["pid"]

    # Replacing the manifest: 200, the idle old-version instance is stopped.
    r = pool.register(manifest("asr", max_concurrency=3, env={"MODEL": "base"}))
    assert r.status == 200, r
    r = pool.invoke("asr", {"env_keys": ["MODEL"]})
    assert r.json()["env"] == {"MODEL": "base"}
    assert r.json()["pid"] != pid
    motorlib.assert_no_process(pid)

    # DELETE stops the node's instances first, then forgets it.
    pid2 = r.json()["pid"]
    r = http("DELETE", pool.url + BASE + "/nodes/asr")
    assert r.status == 200, r
    assert r.json() == {"deleted": "asr", "stopped_instances": 1}
    assert not motorlib.pid_alive(pid2)
    assert pool.node("asr").status == 404
    assert pool.invoke("asr", {}).status == 404
    assert http("DELETE", pool.url + BASE + "/nodes/asr").status == 404
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_bad_manifests_report_every_error(procs, tmpdir_path):
    good = manifest("good")
    bad_file = {"id": "broken", "command": "python w.py", "max_instances": 0}
    pool = start_pool(procs, tmpdir_path, manifests=[good, bad_file])
    # The invalid file is skipped with all its errors logged; the good one is loaded.
    ev = pool.proc.wait_event("pool_manifest_invalid")
    assert ev["errors"] == 2 and "command" in ev["detail"] and "max_instances" in ev["detail"]
    assert pool.node("good").status == 200
    assert pool.node("broken").status == 404

    r = pool.register({"id": "bad id!", "command": [1, ""], "env": {"A": 5, "B=C": "x"},
                       "max_concurrency": 0, "max_instances": "2", "idle_ttl_seconds": "x",
                       "keep_warm": "yes", "ready_timeout_seconds": 0,
                       "invoke_timeout_seconds": -1})
    assert r.status == 400, r
    body = r.json()
    errors = body["errors"]
    assert body["detail"] == f"invalid manifest: {len(errors)} error(s)"
    for path in ("id:", "command[0]:", "command[1]:", "env.A:", "env.B=C:", "max_concurrency:",
                 "max_instances:", "idle_ttl_seconds:", "keep_warm:", "ready_timeout_seconds:",
                 "invoke_timeout_seconds:"):
        assert any(e.startswith(path) for e in errors), (path, errors)
    assert len(errors) == 11

    r = pool.register({"command": ["x"]})
    assert r.status == 400 and r.json()["errors"] == ["id: is required"]
    r = http("POST", pool.url + BASE + "/nodes", raw=b"{not json",
             headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json()["detail"].startswith("invalid JSON")
    r = pool.register([1, 2])
    assert r.status == 400 and "must be a JSON object" in r.json()["errors"][0]
    # Nothing invalid was registered.
    assert [n["id"] for n in get(pool.url + BASE + "/nodes").json()["nodes"]] == ["good"]
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_reply_mapping(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("w", max_concurrency=4)])
    # A worker's own error with a JSON body passes through with its status.
    r = pool.invoke("w", {"status": 422, "input": 1})
    assert r.status == 422 and r.json()["status"] == "succeeded"
    inst = r.headers["x-motor-instance-id"]

    r = pool.invoke("w", {"non_json": True})
    assert r.status == 502, r
    b = r.json()
    assert b["status"] == "failed" and b["instance_id"] == inst
    assert "non-JSON body" in b["error"] and "text/plain" in b["error"]
    assert "definitely not json" in b["error"]

    r = pool.invoke("w", {"bad_json": True})
    assert r.status == 502 and "invalid JSON" in r.json()["error"]

    # SSE is streamed through as it comes.
    req = urllib.request.Request(f"{pool.url}{BASE}/nodes/w/invoke",
                                 data=json.dumps({"stream": 5, "interval": 0.05}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Motor-Instance-Id"] == inst
        first = resp.readline()
        t_first = time.monotonic()
        rest = resp.read()
        t_end = time.monotonic()
    assert json.loads(first[6:])["index"] == 0
    assert rest.count(b"data: ") == 5 and rest.endswith(b"data: [DONE]\n\n")
    assert t_end - t_first >= 0.15  # the first event arrived before the worker finished

    # The slot was released on every one of those paths.
    [i] = pool.instances()
    assert i["busy"] == 0 and i["calls"] == 4

    # Unknown node.
    r = pool.invoke("nope", {})
    assert r.status == 404 and "not registered" in r.json()["detail"]
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_venv_python_and_cuda_paths_and_wov_token(procs, tmpdir_path):
    wd = os.path.join(tmpdir_path, "repo")
    venv_bin = os.path.join(wd, ".venv", "bin")
    os.makedirs(venv_bin)
    cuda = os.path.join(wd, ".venv", "lib", "python3.11", "site-packages", "nvidia", "cublas", "lib")
    os.makedirs(cuda)
    # The venv's "python": a wrapper that marks it ran, then runs the real interpreter.
    with open(os.path.join(venv_bin, "python"), "w") as f:
        f.write(f"#!/bin/sh\nexport VENV_WRAPPER=1\nexec {PY} \"$@\"\n")
    os.chmod(os.path.join(venv_bin, "python"), 0o755)
    m = manifest("venv", command=["python", WORKER], workdir="repo",
                 env={"POOL_WORKER_READY_TOKEN": "WOV_NODE_READY"})
    pool = start_pool(procs, tmpdir_path, extra=["--base-dir", tmpdir_path])
    assert pool.register(m).status == 201
    r = pool.invoke("venv", {"env_keys": ["VENV_WRAPPER", "LD_LIBRARY_PATH"]})
    assert r.status == 200, r
    env = r.json()["env"]
    assert env["VENV_WRAPPER"] == "1"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == os.path.realpath(cuda)
    ev = pool.proc.wait_event("pool_instance_spawned")
    assert ev["argv0"] == os.path.join(os.path.realpath(wd), ".venv", "bin", "python")
    # A missing workdir is a clear start failure.
    assert pool.register(manifest("nowd", workdir="/nonexistent/dir")).status == 201
    r = pool.invoke("nowd", {})
    assert r.status == 503 and "workdir not found: /nonexistent/dir" in r.json()["error"]
    wait_for(lambda: pool.instances(node="nowd")[0]["state"] == "error", 5)
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0
