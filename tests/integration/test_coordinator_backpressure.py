"""Load is not failure (issue 19, deliverable 4): an idle-connection flood does not lock
new clients out (the oldest idle keep-alive connections make room), and an engine at its
connection cap is a busy endpoint — tried elsewhere, never charged to its breaker."""

import socket
import threading
import time

from coord_helpers import FAST, ext_instance, sim_served, start_coordinator, stop_clean
from motorlib import start_sim, wait_for


def open_idle(port, n):
    """n connected sockets that never send a byte."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    return socks


def closed_by_peer(s):
    try:
        s.setblocking(False)
        return s.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_flood_does_not_lock_clients_out(procs, tmpdir_path):
    """Done-when: 8,000 idle connections, and a new client is still served at once (the
    oldest idle connections are closed for it), with the default slots of 2 workers."""
    sim = start_sim(procs, "--model", "m", *FAST)
    c = start_coordinator(procs, tmpdir_path, {"api_config": {"max_connections": 4000}},
                          workers=2)
    ev = c.proc.wait_event("coordinator_listening")
    assert ev["connection_slots"] == 4000
    c.set_instances([ext_instance(1, "union", sim)])
    socks = open_idle(c.infer_port, 8000)
    try:
        time.sleep(1.0)  # the coordinator accepted (or evicted) them all
        t0 = time.monotonic()
        served = 0
        for i in range(20):
            r = c.completion(model="m", prompt=f"new client {i}", max_tokens=2, timeout=5)
            assert r.status == 200, r
            served += 1
        assert served == 20
        assert time.monotonic() - t0 < 10
        # the oldest were closed, the newest still open
        oldest_closed = sum(closed_by_peer(s) for s in socks[:100])
        newest_open = sum(not closed_by_peer(s) for s in socks[-100:])
        assert oldest_closed >= 90, oldest_closed
        assert newest_open >= 90, newest_open
    finally:
        for s in socks:
            s.close()
    stop_clean(c)


def test_busy_engine_is_not_a_breaker_failure(procs, tmpdir_path):
    """An engine at its connection cap closes new connections at accept: the request goes
    to the other instance, counted as busy, and no breaker opens."""
    capped = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "20",
                       "--max-connections", "4", name="capped")
    other = start_sim(procs, "--model", "m", "--ttft-ms", "0", "--tokens-per-second", "20",
                      name="other")
    c = start_coordinator(procs, tmpdir_path, {"exception_config": {"retry_delay": 0.01}},
                          workers=1)
    c.set_instances([ext_instance(1, "union", capped), ext_instance(2, "union", other)])
    results = []

    def one(i):
        r = c.completion(model="m", prompt=f"burst {i}", max_tokens=10, timeout=30)
        results.append(r.status)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(60)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results.count(200) == 60, results
    assert not c.proc.find_events("breaker_open")
    assert c.metric("motor_coordinator_busy_endpoints_total") > 0
    inst = {i["id"]: i for i in c.instances()["instances"]}
    assert inst[1]["healthy"] and inst[1]["circuit_breaker"]["state"] == "closed"
    stop_clean(c)


def test_burst_balanced_and_never_refused(procs, tmpdir_path):
    """A burst of streams over one instance with two equal endpoints (DP ranks), engines
    at their connection cap: every request answered 200, and each endpoint's share
    within 1.2x of the mean."""
    slow = ("--ttft-ms", "0", "--tokens-per-second", "20")
    r0 = start_sim(procs, "--model", "m", *slow, "--max-connections", "150", name="rank0")
    r1 = start_sim(procs, "--model", "m", *slow, "--max-connections", "150", name="rank1")
    c = start_coordinator(procs, tmpdir_path, {"exception_config": {"retry_delay": 0.02}},
                          workers=2)
    c.set_instances([ext_instance(1, "union", r0, r1)])
    n = 400
    statuses = []
    lock = threading.Lock()

    def one(i):
        from motorlib import SSEStream
        s = SSEStream(c.url + "/v1/completions",
                      {"model": "m", "prompt": f"burst stream {i}", "max_tokens": 20,
                       "stream": True}, timeout=60)
        ok = s.status == 200
        if ok:
            try:
                s.all()
            except AssertionError:
                ok = False
        with lock:
            statuses.append(s.status if ok else -s.status)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses.count(200) == n, sorted(set(statuses))
    served = [sim_served(r0), sim_served(r1)]
    mean = sum(served) / 2
    assert sum(served) == n, served
    assert max(served) <= 1.2 * mean, served
    assert not c.proc.find_events("breaker_open")
    stop_clean(c)
