"""The worker pool inside `motor node-manager` (config key worker_pool of the NM block):
one daemon serves both engines and on-demand workers."""

import os
import subprocess

import motorlib
from motorlib import get, http, post
from fake_controller import nm_config, start_nm, write_json
from pool_helpers import BASE, PY, WORKER, manifest


def _cfg(tmpdir, pool_block):
    return nm_config(controller_port=motorlib.free_port(),
                     nm={"management_api_key": "k3y", "worker_pool": pool_block})


def test_pool_in_node_manager(procs, tmpdir_path):
    mdir = os.path.join(tmpdir_path, "manifests")
    os.makedirs(mdir)
    write_json(os.path.join(mdir, "echo.json"), {"id": "echo", "command": [PY, WORKER]})
    db = os.path.join(tmpdir_path, "pool.db")
    cfg = _cfg(tmpdir_path, {"enable": True, "manifests_dir": mdir, "db_path": db,
                             "stop_grace_seconds": 1,
                             "defaults": {"idle_ttl_seconds": 30, "max_instances": 2}})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    url = nm.url
    nm.proc.wait_event("pool_started")

    r = post(f"{url}{BASE}/nodes/echo/invoke", {"input": "hi"}, timeout=20)
    assert r.status == 200, r
    assert r.json()["output"] == {"echo": "hi"}
    pid = r.json()["pid"]
    nodes = get(f"{url}{BASE}/nodes").json()["nodes"]
    # The block's defaults apply to what the manifest leaves out.
    assert nodes[0]["manifest"]["max_instances"] == 2
    assert nodes[0]["manifest"]["idle_ttl_seconds"] == 30

    # Changes take the node manager's management key; reads and invoke do not.
    m = manifest("other")
    assert post(f"{url}{BASE}/nodes", m).status == 401
    r = http("POST", f"{url}{BASE}/nodes", body=m, headers={"X-Motor-Management-Key": "k3y"})
    assert r.status == 201, r
    assert post(f"{url}{BASE}/nodes/other/invoke", {}, timeout=20).status == 200
    [i] = [x for x in get(f"{url}{BASE}/instances").json()["instances"] if x["node_id"] == "echo"]
    assert i["state"] == "ready" and i["pid"] == pid
    # The NM's own routes are still there.
    assert get(f"{url}/node-manager/status").status == 200
    # Its /metrics carries the pool's families next to its own.
    text = get(f"{url}/metrics").text
    assert 'motor_pool_calls_total{node="echo"} 1' in text
    assert 'motor_pool_instances{node="echo",state="ready"} 1' in text
    assert "motor_nm_engine_spawns_total" in text

    # Shutting the node manager down stops the workers too.
    nm.proc.signal(15)
    assert nm.proc.wait(15) == 255
    motorlib.assert_no_process(pid)


def test_invalid_worker_pool_block(procs, tmpdir_path):
    cfg = _cfg(tmpdir_path, {"enable": "yes", "defaults": {"max_instances": 0}})
    path = write_json(os.path.join(tmpdir_path, "c.json"), cfg)
    env = dict(os.environ, ROLE="union")
    r = subprocess.run([motorlib.motor_bin(), "node-manager", "--config", path, "--port", "0",
                        "--state-file", os.path.join(tmpdir_path, "s.json")],
                       env=env, capture_output=True, text=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "invalid worker_pool configuration (2 errors)" in r.stderr
    assert "worker_pool.enable: must be true or false" in r.stderr
    assert "worker_pool.defaults.max_instances: must be an integer" in r.stderr
