"""Concurrent calls racing the idle reaper: with a TTL shorter than the gaps between
calls, instances are reaped and restarted all the time while calls keep coming. No call
may be lost, and none may be served by an instance after the reaper began stopping it
(the worker records which instance served each call, and when)."""

import os
import random
import threading
import time

from pool_helpers import manifest, read_calls, start_pool


def test_calls_racing_the_reaper(procs, tmpdir_path):
    log = os.path.join(tmpdir_path, "calls.jsonl")
    pool = start_pool(procs, tmpdir_path, manifests=[
        manifest("race", idle_ttl_seconds=0.2, max_instances=2, max_concurrency=1,
                 queue_timeout_seconds=20, env={"POOL_WORKER_LOG": log})])
    results = []
    lock = threading.Lock()
    rnd = random.Random(7)
    gaps = [[rnd.uniform(0.15, 0.26) for _ in range(200)] for _ in range(4)]

    def client(cid: int):
        deadline = time.monotonic() + 4.0
        k = 0
        while time.monotonic() < deadline:
            tag = f"{cid}-{k}"
            r = pool.invoke("race", {"call": tag, "delay": rnd.uniform(0, 0.03)}, timeout=30)
            with lock:
                results.append((tag, r))
            time.sleep(gaps[cid][k % 200])
            k += 1

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results
    bad = [(tag, r) for tag, r in results if r.status != 200]
    assert not bad, bad[:3]
    for tag, r in results:
        body = r.json()
        assert body["call"] == tag
        # The instance the pool says served it is the process that did.
        assert r.headers["x-motor-instance-id"] == body["env_instance_id"] == body["instance_id"]

    # None lost: the workers saw exactly the calls the clients got answers for.
    seen = read_calls(log, expect=len(results))
    assert sorted(c["call"] for c in seen) == sorted(tag for tag, _ in results)

    # The reaper really raced the calls: several instances came and went.
    reaped = pool.proc.find_events("pool_instance_reaped")
    assert len(reaped) >= 2, f"only {len(reaped)} reaps: the race did not happen"

    # None served by an instance the reaper was stopping (or before it was ready).
    insts = {}
    for c in seen:
        iid = c["instance_id"]
        if iid not in insts:
            insts[iid] = pool.instance(iid)
        rec = insts[iid]
        ready_ms = next(t["at_ms"] for t in rec["transitions"] if t["to"] == "ready")
        assert c["t_start"] * 1000 >= ready_ms - 5, (c, rec["transitions"])
        stopping = [t["at_ms"] for t in rec["transitions"] if t["to"] == "stopping"]
        if stopping:
            # The call had ended before the instance was stopped.
            assert c["t_end"] * 1000 <= stopping[0] + 5, (c, rec["transitions"])
    assert len(insts) >= 3
    # A clean exit (status 0: no sanitizer report, no worker left).
    assert pool.stop() == 0
