"""Worker pool records in SQLite survive a restart: manifests registered through the API,
every instance with its transitions, and instances a killed pool left behind (closed as
stopped at the next start; their workers died with the pool through PDEATHSIG)."""

import os
import signal

import motorlib
from motorlib import get, wait_for
from pool_helpers import BASE, manifest, start_pool


def test_records_survive_a_clean_restart(procs, tmpdir_path):
    db = os.path.join(tmpdir_path, "pool.db")
    files = [manifest("from-file")]
    pool = start_pool(procs, tmpdir_path, manifests=files, db=db, name="pool1")
    assert pool.register(manifest("from-api", max_concurrency=3)).status == 201
    r1 = pool.invoke("from-file", {"input": 1})
    r2 = pool.invoke("from-api", {"input": 2})
    assert r1.status == 200 and r2.status == 200
    ids = {r1.headers["x-motor-instance-id"], r2.headers["x-motor-instance-id"]}
    pids = [r1.json()["pid"], r2.json()["pid"]]
    assert pool.stop() == 0
    for pid in pids:
        motorlib.assert_no_process(pid)

    pool = start_pool(procs, tmpdir_path, manifests=files, db=db, name="pool2")
    nodes = {n["id"]: n for n in get(pool.url + BASE + "/nodes").json()["nodes"]}
    assert set(nodes) == {"from-file", "from-api"}
    assert nodes["from-api"]["manifest"]["max_concurrency"] == 3
    assert nodes["from-api"]["source"] == "api"
    assert nodes["from-file"]["source"].endswith("from-file.json")
    assert pool.instances() == []  # nothing live in memory...
    hist = {i["id"]: i for i in pool.instances(history=1)}
    assert ids <= set(hist)  # ...but every instance is on record
    for iid in ids:
        rec = pool.instance(iid)
        assert rec["state"] == "stopped" and rec["calls"] == 1
        assert rec["started_at"] and rec["ready_at"] and rec["stopped_at"]
        assert [t["to"] for t in rec["transitions"]] == ["starting", "ready", "stopping",
                                                         "stopped"]
        assert rec["transitions"][-1]["cause"] == "pool shutdown"
        times = [t["at_ms"] for t in rec["transitions"]]
        assert times == sorted(times)
    # The API-registered node still works after the restart.
    r = pool.invoke("from-api", {"input": 3})
    assert r.status == 200 and r.headers["x-motor-instance-id"] not in ids
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_killed_pool_leaves_no_worker_and_closes_records(procs, tmpdir_path):
    db = os.path.join(tmpdir_path, "pool.db")
    pool = start_pool(procs, tmpdir_path, db=db, name="pool1")
    assert pool.register(manifest("w")).status == 201
    r = pool.invoke("w", {})
    inst, pid = r.headers["x-motor-instance-id"], r.json()["pid"]
    pool.proc.signal(signal.SIGKILL)  # the pool only, not its group
    pool.proc.wait(5)
    # PR_SET_PDEATHSIG: the worker dies with the pool.
    motorlib.assert_no_process(pid)

    pool = start_pool(procs, tmpdir_path, db=db, name="pool2")
    ev = pool.proc.wait_event("pool_orphan_records_closed")
    assert ev["instances"] == 1
    rec = pool.instance(inst)
    assert rec["state"] == "stopped"
    assert "worker pool restarted" in rec["error"]
    assert [t["to"] for t in rec["transitions"]] == ["starting", "ready", "stopped"]
    assert pool.node("w").status == 200
    r2 = pool.invoke("w", {})
    assert r2.status == 200
    wait_for(lambda: pool.instances(live=1), 5)
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0
