#!/usr/bin/env python3
"""Worker-pool benchmark: what the pool adds to a call, measured side by side.

* warm invoke: the same small JSON call sent N times (keep-alive, one at a time) to the
  worker directly (POST /invoke) and through the pool (POST
  /node-manager/pool/nodes/{id}/invoke); p50/p99 of both and the difference.
* cold start: a call to a node with no instance (the pool spawns the worker, waits for
  its ready line and /health, then forwards) against the peer: spawning the worker by
  hand and calling it as soon as it prints its ready line.

The worker is tests/integration/pool_worker.py (Python, standard library). Run with a
release build; prints a markdown table. Not part of `make test`.

  bench/pool_bench.py [--motor build/motor] [--calls 2000] [--cold 5]
"""

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--motor", default=os.environ.get("MOTOR_BIN") or
                    os.path.join(REPO, "build", "motor"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--cold", type=int, default=5)
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="pool-bench-")
    pool, port = None, None
    worker = None
    try:
        # The pool logs at info here only to print its port; the noise is in a file.
        log = open(os.path.join(tmp, "pool.log"), "w+")
        pool = subprocess.Popen([a.motor, "worker-pool", "--port", "0"], stdout=log,
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
        assert st == 201, body

        # ---- warm: pool vs direct, same worker instance ----
        st, hdrs, body = request(host, port, "POST", "/node-manager/pool/nodes/bench/invoke", {})
        assert st == 200, body
        insts = json.loads(request(host, port, "GET", "/node-manager/pool/instances")[2])
        wport = insts["instances"][0]["port"]
        # Interleave the two series in blocks so drift (CPU frequency, the other
        # helpers' load) hits both alike.
        direct, via = [], []
        block = max(1, a.calls // 10)
        for _ in range(10):
            direct += timed_calls(host, wport, "/invoke", block, warmup=10)
            via += timed_calls(host, port, "/node-manager/pool/nodes/bench/invoke", block,
                               warmup=10)

        # ---- cold: pool spawn-to-answer vs spawning by hand ----
        cold_pool, cold_direct = [], []
        for k in range(a.cold):
            node = f"cold{k}"
            mk = dict(m, id=node)
            assert request(host, port, "POST", "/node-manager/pool/nodes", mk)[0] == 201
            t0 = time.perf_counter()
            st, _, body = request(host, port, "POST", f"/node-manager/pool/nodes/{node}/invoke",
                                  {})
            cold_pool.append((time.perf_counter() - t0) * 1000.0)
            assert st == 200, body
            assert request(host, port, "DELETE", f"/node-manager/pool/nodes/{node}")[0] == 200

            t0 = time.perf_counter()
            worker, wp = spawn_worker()
            st, _, body = request(host, wp, "POST", "/invoke", {})
            cold_direct.append((time.perf_counter() - t0) * 1000.0)
            assert st == 200
            kill(worker)
            worker = None

        def row(name, xs):
            return f"| {name} | {statistics.median(xs):.3f} | {pct(xs, 99):.3f} | {len(xs)} |"

        print("## worker pool: warm invoke (ms, sequential, keep-alive)\n")
        print("| path | p50 | p99 | calls |")
        print("| --- | ---: | ---: | ---: |")
        print(row("worker direct (POST /invoke)", direct))
        print(row("through the pool", via))
        d50 = statistics.median(via) - statistics.median(direct)
        d99 = pct(via, 99) - pct(direct, 99)
        print(f"| **added by the pool** | **{d50:.3f}** | **{d99:.3f}** | |")
        print()
        print("## worker pool: cold start to first answer (ms)\n")
        print("| path | p50 | max | runs |")
        print("| --- | ---: | ---: | ---: |")
        print(f"| spawn by hand, wait for ready line, call | {statistics.median(cold_direct):.1f} "
              f"| {max(cold_direct):.1f} | {len(cold_direct)} |")
        print(f"| pool: spawn, ready line, /health, forward | {statistics.median(cold_pool):.1f} "
              f"| {max(cold_pool):.1f} | {len(cold_pool)} |")
        print(f"\nmotor: {a.motor}; worker: {WORKER} (Python {sys.version.split()[0]})")
    finally:
        if worker is not None:
            kill(worker)
        if pool is not None:
            pool.send_signal(signal.SIGTERM)
            try:
                pool.wait(10)
            except subprocess.TimeoutExpired:
                kill(pool)


if __name__ == "__main__":
    main()
