#!/usr/bin/env python3
"""A burst of streams against healthy engines at their connection cap: the answers the
coordinator refuses (502/503, in-band errors) and how evenly it splits the burst over two
equal DP ranks, next to nginx as a plain reverse proxy in front of the same engines.

One instance with two endpoints (two `motor engine-sim`s, 20 tokens/s, each capped at
`--max-connections` connections, closed at accept beyond: the engines' backpressure);
N streams (default 2000) start at once, each through its own connection. Reported:
streams not answered in full, and the busier rank's share over the mean (target: 1.2).

usage: bench/coord_burst.py [--streams 2000] [--cap 400] [--motor PATH]
       (motor-bench-plugin: 1)
Environment: BENCH_BURST_STREAMS (default 2000, quick 500). Standard library only;
everything on 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402
from coord_helpers import ext_instance, sim_served, start_coordinator  # noqa: E402
from coord_reschedule import NGINX_CONF  # noqa: E402


def stream(port: int, i: int) -> str:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = json.dumps({"model": "m", "prompt": f"burst {i}", "max_tokens": 20,
                           "stream": True})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            return f"HTTP {r.status}"
        data = r.read()
        conn.close()
        if b"data: [DONE]" not in data:
            return "cut"
        if b'"error"' in data:
            return "in-band error"
        return "ok"
    except Exception as e:  # noqa: BLE001 - counted
        return type(e).__name__


def burst(port: int, n: int) -> dict:
    out: dict[str, int] = {}
    lock = threading.Lock()

    def one(i):
        res = stream(port, i)
        with lock:
            out[res] = out.get(res, 0) + 1
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def run_once(motor: str, n: int, cap: int, peer: bool) -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-burst-")
    reg = motorlib.ProcRegistry(tmp)
    res = {}
    try:
        args = ("--model", "m", "--ttft-ms", "0", "--tokens-per-second", "20",
                "--max-connections", str(cap), "--max-num-seqs", "4096")
        r0 = motorlib.start_sim(reg, *args, name="rank0")
        r1 = motorlib.start_sim(reg, *args, name="rank1")
        c = start_coordinator(reg, tmp, {"exception_config": {"retry_delay": 0.05}}, workers=2)
        c.set_instances([ext_instance(1, "union", r0, r1)])
        got = burst(c.infer_port, n)
        served = [sim_served(r0), sim_served(r1)]
        mean = sum(served) / 2 or 1
        res["motor"] = {"outcomes": got, "split": served, "max_over_mean": max(served) / mean,
                        "busy": c.metric("motor_coordinator_busy_endpoints_total"),
                        "breaker_trips": c.metric("motor_coordinator_breaker_trips_total")}
        c.proc.stop(15)
        if peer and shutil.which("nginx"):
            a = motorlib.start_sim(reg, *args, name="nrank0")
            b = motorlib.start_sim(reg, *args, name="nrank1")
            ndir = os.path.join(tmp, "nginx")
            for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
                os.makedirs(os.path.join(ndir, d), exist_ok=True)
            port = motorlib.free_port()
            conf = os.path.join(ndir, "nginx.conf")
            with open(conf, "w") as f:
                f.write(NGINX_CONF.format(tmp=ndir, port=port, servers="".join(
                    f"server 127.0.0.1:{s.port};" for s in (a, b))))
            ng = reg.start([shutil.which("nginx"), "-c", conf, "-p", ndir, "-g", "daemon off;"],
                           name="nginx")
            motorlib.wait_http(f"http://127.0.0.1:{port}/health", 200, timeout=10)
            got = burst(port, n)
            served = [sim_served(a), sim_served(b)]
            mean = sum(served) / 2 or 1
            res["nginx"] = {"outcomes": got, "split": served,
                            "max_over_mean": max(served) / mean}
            ng.stop(10)
        return res
    finally:
        reg.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=0)
    ap.add_argument("--cap", type=int, default=400, help="each engine's connection cap")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    n = a.streams or int(os.environ.get("BENCH_BURST_STREAMS", "0")) or (500 if a.quick else 2000)
    runs = [run_once(a.motor, n, a.cap, not a.no_peer) for _ in range(a.reps)]
    failed = [n - r["motor"]["outcomes"].get("ok", 0) for r in runs]
    peer_failed = [n - r["nginx"]["outcomes"].get("ok", 0) for r in runs if "nginx" in r]
    spread = [r["motor"]["max_over_mean"] for r in runs]
    work = (f"{n} streams at once over one instance of 2 engine-sims (DP ranks), each capped "
            f"at {a.cap} connections")
    plugin.emit(a, [
        plugin.row("coord.burst.failed", "Burst at the engines' connection cap", work,
                   "streams not answered in full", "streams", failed,
                   peer_name="nginx reverse proxy", peer=peer_failed or None, target="0",
                   extra={"runs": runs}),
        plugin.row("coord.burst.spread", "Burst at the engines' connection cap", work,
                   "busier rank / mean", "ratio", spread, target="≤ 1.2",
                   peer_name="nginx reverse proxy",
                   peer=[r["nginx"]["max_over_mean"] for r in runs if "nginx" in r] or None),
    ])
    print(json.dumps({"streams": n, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
