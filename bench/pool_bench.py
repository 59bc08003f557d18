#!/usr/bin/env python3
"""Worker-pool benchmark: what the pool adds to a call, measured side by side.

* warm invoke: the same small JSON call sent N times (keep-alive, one at a time) to the
  worker directly (POST /invoke) and through the pool (POST
  /node-manager/pool/nodes/{id}/invoke); p50/p99 of both and the difference.
* cold start: a call to a node with no instance (the pool spawns the worker, waits for
  its ready line and /health, then forwards) against the peer: spawning the worker by
  hand and calling it as soon as it prints its ready line.

The worker is tests/integration/pool_worker.py (Python, standard library). Run with a
release build; prints a markdown table. Not part of `make test`. A `make bench` plug-in
(bench/README.md): BENCH_REPS repetitions (a fresh pool each), rows
pool.warm_invoke_added.p50/.p99 (through the pool minus direct, same repetition) and
pool.cold_start.p50 (next to spawning the worker by hand).

  bench/pool_bench.py [--motor build/motor] [--calls 2000] [--cold 10] [--json PATH]
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tests", "integration", "pool_worker.py")
PY = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
BODY = json.dumps({"input": {"text": "hello", "n": 1}}).encode()


def pct(xs, p):
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def timed_calls(host, port, path, n, warmup=50):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    out = []
    for i in range(n + warmup):
        t0 = time.perf_counter()
        conn.request("POST", path, body=BODY, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status} {data[:200]!r}")
        if i >= warmup:
            out.append(dt * 1000.0)
    conn.close()
    return out


def request(host, port, method, path, body=None):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    payload = r.read()
    conn.close()
    return r.status, r.getheaders(), payload


def spawn_worker():
    """The peer of a cold start: spawn the worker ourselves, read its ready line."""
    p = subprocess.Popen([PY, WORKER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         stdin=subprocess.DEVNULL, start_new_session=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    line = p.stdout.readline().decode()
    if not line.startswith("MOTOR_NODE_READY"):
        raise RuntimeError(f"unexpected first line {line!r}")
    return p, int(line.split("port=")[1])


def kill(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def run_once(motor, calls, cold):
    """One fresh pool: warm series (direct, via) and cold series (pool, by hand), in ms."""
    tmp = tempfile.mkdtemp(prefix="pool-bench-")
    pool, port = None, None
    worker = None
    log = None
    try:
        # The pool logs at info here only to print its port; the noise is in a file.
        log = open(os.path.join(tmp, "pool.log"), "w+")
        pool = subprocess.Popen([motor, "worker-pool", "--port", "0"], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 15
        while port is None and time.monotonic() < deadline:
            log.seek(0)
            for line in log:
                if '"pool_listening"' in line:
                    port = json.loads(line)["port"]
            time.sleep(0.02)
        if port is None:
            raise RuntimeError("worker-pool did not start")
        host = "127.0.0.1"
        m = {"id": "bench", "command": [PY, WORKER], "max_concurrency": 4, "max_instances": 1,
             "idle_ttl_seconds": -1}
        st, _, body = request(host, port, "POST", "/node-manager/pool/nodes", m)
        if st != 201:
            raise RuntimeError(f"create node: HTTP {st} {body[:200]!r}")

        # ---- warm: pool vs direct, same worker instance ----
        st, hdrs, body = request(host, port, "POST", "/node-manager/pool/nodes/bench/invoke", {})
        if st != 200:
            raise RuntimeError(f"first invoke: HTTP {st} {body[:200]!r}")
        insts = json.loads(request(host, port, "GET", "/node-manager/pool/instances")[2])
        wport = insts["instances"][0]["port"]
        # Interleave the two series in blocks so drift (CPU frequency, the other
        # helpers' load) hits both alike.
        direct, via = [], []
        block = max(1, calls // 10)
        for _ in range(10):
            direct += timed_calls(host, wport, "/invoke", block, warmup=10)
            via += timed_calls(host, port, "/node-manager/pool/nodes/bench/invoke", block,
                               warmup=10)

        # ---- cold: pool spawn-to-answer vs spawning by hand ----
        cold_pool, cold_direct = [], []
        for k in range(cold):
            node = f"cold{k}"
            mk = dict(m, id=node)
            st, _, body = request(host, port, "POST", "/node-manager/pool/nodes", mk)
            if st != 201:
                raise RuntimeError(f"create {node}: HTTP {st} {body[:200]!r}")
            t0 = time.perf_counter()
            st, _, body = request(host, port, "POST", f"/node-manager/pool/nodes/{node}/invoke",
                                  {})
            cold_pool.append((time.perf_counter() - t0) * 1000.0)
            if st != 200:
                raise RuntimeError(f"cold invoke: HTTP {st} {body[:200]!r}")
            st, _, body = request(host, port, "DELETE", f"/node-manager/pool/nodes/{node}")
            if st != 200:
                raise RuntimeError(f"delete {node}: HTTP {st} {body[:200]!r}")

            t0 = time.perf_counter()
            worker, wp = spawn_worker()
            st, _, body = request(host, wp, "POST", "/invoke", {})
            cold_direct.append((time.perf_counter() - t0) * 1000.0)
            if st != 200:
                raise RuntimeError(f"direct cold invoke: HTTP {st}")
            kill(worker)
            worker = None
        return {"direct": direct, "via": via, "cold_pool": cold_pool,
                "cold_direct": cold_direct}
    finally:
        if worker is not None:
            kill(worker)
        if pool is not None:
            pool.send_signal(signal.SIGTERM)
            try:
                pool.wait(10)
            except subprocess.TimeoutExpired:
                kill(pool)
        if log is not None:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--motor", default=None)
    ap.add_argument("--calls", type=int, default=0, help="warm calls per path (2000; 1000 "
                    "quick)")
    ap.add_argument("--cold", type=int, default=0, help="cold starts per repetition (10; 5 "
                    "quick)")
    a = plugin.args(ap)
    calls = a.calls or (1000 if a.quick else 2000)
    cold = a.cold or (5 if a.quick else 10)
    reps = []
    for rep in range(a.reps):
        print(f"pool rep {rep + 1}/{a.reps}: {calls} warm calls per path, {cold} cold starts",
              file=sys.stderr, flush=True)
        reps.append(run_once(a.motor, calls, cold))

    def added(r, p):
        return pct(r["via"], p) - pct(r["direct"], p)

    work = "invoke through the pool vs the worker directly"
    warm_note = (f"Warm: the same small JSON call, one at a time over keep-alive, {calls} "
                 f"times to the worker directly (POST /invoke) and through `motor "
                 f"worker-pool` (POST /node-manager/pool/nodes/{{id}}/invoke), interleaved in "
                 f"10 blocks; added = pool percentile − direct percentile of the same "
                 f"repetition. Worker: tests/integration/pool_worker.py (Python); client: "
                 f"Python http.client on the same 2 CPUs.")
    cold_note = (f"Cold: {cold} calls per repetition to a node with no worker (the pool "
                 f"spawns it, waits for its ready line and /health, forwards) vs spawning "
                 f"the same worker by hand and calling it as soon as it prints its ready line; "
                 f"p50 over the calls.")
    extra = {"direct_p50_ms": [pct(r["direct"], 50) for r in reps],
             "direct_p99_ms": [pct(r["direct"], 99) for r in reps],
             "via_p50_ms": [pct(r["via"], 50) for r in reps],
             "via_p99_ms": [pct(r["via"], 99) for r in reps]}
    plugin.emit(a, [
        plugin.row("pool.warm_invoke_added.p50", "Worker pool: warm invoke", work,
                   "added p50", "ms", [added(r, 50) for r in reps], notes=[warm_note],
                   extra=extra),
        plugin.row("pool.warm_invoke_added.p99", "Worker pool: warm invoke", work,
                   "added p99", "ms", [added(r, 99) for r in reps], target="≤ 1 ms",
                   notes=[warm_note], extra=extra),
        plugin.row("pool.cold_start.p50", "Worker pool: cold start",
                   "first call to a stopped worker", "time to first answer p50", "ms",
                   [statistics.median(r["cold_pool"]) for r in reps],
                   peer_name="spawn by hand, wait for the ready line, call",
                   peer=[statistics.median(r["cold_direct"]) for r in reps],
                   notes=[cold_note],
                   extra={"pool_max_ms": [max(r["cold_pool"]) for r in reps],
                          "by_hand_max_ms": [max(r["cold_direct"]) for r in reps]}),
    ])

    def row(name, xs):
        return f"| {name} | {statistics.median(xs):.3f} | {pct(xs, 99):.3f} | {len(xs)} |"

    for i, r in enumerate(reps):
        direct, via, cold_pool, cold_direct = (r["direct"], r["via"], r["cold_pool"],
                                               r["cold_direct"])
        print(f"## repetition {i + 1}\n")
        print("### worker pool: warm invoke (ms, sequential, keep-alive)\n")
        print("| path | p50 | p99 | calls |")
        print("| --- | ---: | ---: | ---: |")
        print(row("worker direct (POST /invoke)", direct))
        print(row("through the pool", via))
        d50 = statistics.median(via) - statistics.median(direct)
        d99 = pct(via, 99) - pct(direct, 99)
        print(f"| **added by the pool** | **{d50:.3f}** | **{d99:.3f}** | |")
        print()
        print("### worker pool: cold start to first answer (ms)\n")
        print("| path | p50 | max | runs |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| spawn by hand, wait for ready line, call | {statistics.median(cold_direct):.1f} "
              f"| {max(cold_direct):.1f} | {len(cold_direct)} |")
        print(f"| pool: spawn, ready line, /health, forward | {statistics.median(cold_pool):.1f} "
              f"| {max(cold_pool):.1f} | {len(cold_pool)} |")
        print()
    print(f"motor: {a.motor}; worker: {WORKER} (Python {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
