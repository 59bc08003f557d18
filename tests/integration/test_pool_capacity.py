"""Worker pool capacity: the per-instance concurrency cap, max_instances, FIFO queueing,
the queue timeout (503 with a clear message) and the invoke timeout (504)."""

import os
import threading
import time

from motorlib import wait_for
from pool_helpers import manifest, read_calls, start_pool


def _invoke_async(pool, node, body, results, key, timeout=30.0):
    def run():
        results[key] = pool.invoke(node, body, timeout=timeout)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_concurrency_cap_and_max_instances(procs, tmpdir_path):
    log = os.path.join(tmpdir_path, "calls.jsonl")
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("cap", max_concurrency=2, max_instances=2, env={"POOL_WORKER_LOG": log})])
    # Warm one instance first, so the burst has a ready instance to fill.
    assert pool.invoke("cap", {}).status == 200
    results = {}
    threads = [_invoke_async(pool, "cap", {"delay": 0.6, "call": k}, results, k)
               for k in range(6)]
    for t in threads:
        t.join(30)
    assert all(results[k].status == 200 for k in range(6)), results
    by_inst = {}
    for k in range(6):
        r = results[k]
        by_inst.setdefault(r.headers["x-motor-instance-id"], []).append(r.json())
    # Two instances at most, and never more than two calls at once on either.
    assert len(by_inst) == 2, by_inst.keys()
    assert max(b["in_flight"] for bodies in by_inst.values() for b in bodies) <= 2
    calls = read_calls(log, expect=6)
    for inst in by_inst:
        mine = sorted((c["t_start"], c["t_end"]) for c in calls if c["instance_id"] == inst)
        for start, _ in mine:
            overlapping = sum(1 for s, e in mine if s <= start < e)
            assert overlapping <= 2, (inst, mine)
    assert len(pool.instances(live=1)) == 2
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_fifo_queue(procs, tmpdir_path):
    log = os.path.join(tmpdir_path, "calls.jsonl")
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("fifo", max_concurrency=1, max_instances=1, env={"POOL_WORKER_LOG": log})])
    assert pool.invoke("fifo", {}).status == 200  # warm
    results = {}
    threads = [_invoke_async(pool, "fifo", {"delay": 0.4, "call": 0}, results, 0)]
    wait_for(lambda: pool.node("fifo").json()["instances"]["busy_slots"] == 1, 5)
    # Queue the rest one by one, so their arrival order is known.
    for k in range(1, 5):
        threads.append(_invoke_async(pool, "fifo", {"delay": 0.05, "call": k}, results, k))
        wait_for(lambda: pool.node("fifo").json()["queued"] == k, 5, what=f"{k} queued")
    for t in threads:
        t.join(30)
    assert [results[k].status for k in range(5)] == [200] * 5
    served = [c["call"] for c in sorted(read_calls(log, expect=5), key=lambda c: c["t_start"])]
    assert served == [0, 1, 2, 3, 4]  # first come, first served
    node = pool.node("fifo").json()
    assert node["queued"] == 0 and node["instances"]["busy_slots"] == 0
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_queue_timeout_is_503_with_reason(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("busy", max_concurrency=1, max_instances=1, queue_timeout_seconds=0.5)])
    assert pool.invoke("busy", {}).status == 200
    results = {}
    t = _invoke_async(pool, "busy", {"delay": 2.0}, results, "long")
    wait_for(lambda: pool.node("busy").json()["instances"]["busy_slots"] == 1, 5)
    t0 = time.monotonic()
    r = pool.invoke("busy", {"input": "queued"})
    waited = time.monotonic() - t0
    assert r.status == 503, r
    detail = r.json()["detail"]
    assert "no capacity for node 'busy'" in detail
    assert "1/1 slots busy" in detail and "max_instances=1" in detail
    assert r.json()["status"] == "failed"
    assert 0.45 <= waited < 1.5
    t.join(10)
    assert results["long"].status == 200  # the busy call was not disturbed
    node = pool.node("busy").json()
    assert node["counters"]["queue_timeouts"] == 1
    # The slot came back: a new call gets it.
    assert pool.invoke("busy", {}).status == 200
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_invoke_timeout_is_504_and_releases(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("slow", max_concurrency=1, invoke_timeout_seconds=0.5)])
    t0 = time.monotonic()
    r = pool.invoke("slow", {"delay": 3})
    assert r.status == 504, r
    assert "timed out after 0.5 s" in r.json()["error"]
    assert time.monotonic() - t0 < 2.5
    [i] = pool.instances()
    assert i["busy"] == 0  # released on the timeout path
    assert pool.invoke("slow", {"delay": 0}).status == 200
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0


def test_client_gone_releases_slot(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("gone", max_concurrency=1)])
    assert pool.invoke("gone", {}).status == 200
    try:
        pool.invoke("gone", {"delay": 3}, timeout=0.5)
    except OSError:
        pass  # our client timed out and closed the connection
    wait_for(lambda: pool.instances()[0]["busy"] == 0, 5, what="slot released")
    ev = pool.proc.wait_event("pool_call_abandoned")
    assert ev["node_id"] == "gone"
    assert pool.invoke("gone", {}, timeout=10).status == 200
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0
