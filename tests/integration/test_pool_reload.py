"""Worker pool: the manifests directory is watched (issue 17).

* A changed manifest is validated and replaces the node for new calls while a call
  running on the old version finishes on it; the old instance stops after that call.
* An invalid edit is reported and the node keeps its last valid manifest.
* A new file registers a node; a removed file retires its node: queued and new calls
  get 404, the call in flight finishes, then its instance stops.
"""

from __future__ import annotations

import json
import os
import threading

import motorlib
from pool_helpers import manifest, start_pool


def put(mdir: str, m: dict, name: str = "") -> None:
    path = os.path.join(mdir, (name or m["id"]) + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(m, f)
    os.rename(path + ".tmp", path)


def test_manifest_dir_watched(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("w", env={"VERSION": "1"})])
    mdir = os.path.join(tmpdir_path, "manifests-worker-pool")
    r = pool.invoke("w", {"env_keys": ["VERSION"]})
    assert r.status == 200 and r.json()["env"]["VERSION"] == "1"
    old_inst, old_pid = r.headers["x-motor-instance-id"], r.json()["pid"]

    # a long call on the old version, then the file changes under it
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(r=pool.invoke(
        "w", {"delay": 1.5, "env_keys": ["VERSION"]}, timeout=20)))
    t.start()
    motorlib.wait_for(lambda: any(i["busy"] for i in pool.instances(live=1)), 5,
                      what="the long call running")
    n = len(pool.proc.find_events("pool_node_replaced"))
    put(mdir, manifest("w", env={"VERSION": "2"}, max_instances=2))
    pool.proc.wait_event("pool_node_replaced", after=n, timeout=10)
    r2 = pool.invoke("w", {"env_keys": ["VERSION"]})
    assert r2.status == 200 and r2.json()["env"]["VERSION"] == "2"
    assert r2.headers["x-motor-instance-id"] != old_inst
    t.join(20)
    assert out["r"].status == 200 and out["r"].json()["env"]["VERSION"] == "1"
    assert out["r"].headers["x-motor-instance-id"] == old_inst
    pool.wait_state(old_inst, "stopped")
    motorlib.assert_no_process(old_pid)

    # an invalid edit: reported, the node keeps version 2
    n = len(pool.proc.find_events("pool_manifest_invalid"))
    put(mdir, {"id": "w", "command": [], "max_instances": 0})
    ev = pool.proc.wait_event("pool_manifest_invalid", after=n, timeout=10)
    assert "max_instances" in ev["detail"] and "previous" in ev["action"]
    r = pool.invoke("w", {"env_keys": ["VERSION"]})
    assert r.status == 200 and r.json()["env"]["VERSION"] == "2"
    assert pool.node("w").json()["manifest"]["max_instances"] == 2

    # a new file: a new node
    n = len(pool.proc.find_events("pool_node_registered"))
    put(mdir, manifest("fresh"))
    pool.proc.wait_event("pool_node_registered", after=n, timeout=10)
    assert pool.invoke("fresh", {}).status == 200

    # a removed file: the node drains
    r = pool.invoke("fresh", {})
    inst = r.headers["x-motor-instance-id"]
    t = threading.Thread(target=lambda: out.update(f=pool.invoke("fresh", {"delay": 1.5},
                                                                 timeout=20)))
    t.start()
    motorlib.wait_for(lambda: any(i["busy"] and i["id"] == inst for i in pool.instances(live=1)),
                      5, what="the call in flight")
    os.unlink(os.path.join(mdir, "fresh.json"))
    pool.proc.wait_event("pool_node_retired", timeout=10)
    assert pool.invoke("fresh", {}).status == 404
    assert pool.node("fresh").status == 404
    t.join(20)
    assert out["f"].status == 200 and out["f"].headers["x-motor-instance-id"] == inst
    pool.wait_state(inst, "stopped")
    # the other node is untouched
    assert pool.invoke("w", {}).status == 200
    assert pool.stop() == 0
    assert "Sanitizer" not in pool.proc.output()
