#!/usr/bin/env python3
"""Coordinator memory per concurrent stream, next to nginx proxying the same streams;
and the coordinator's RSS after rounds of streams and aborts (does it come back?).

One `motor engine-sim` (--tokens-per-second 4, 16 tokens: a stream lasts ~4 s); in front
of it `motor coordinator` (2 workers) and nginx (2 workers, upstream keep-alive,
proxy_buffering off — the gateway row's configuration). N streaming chat completions
opened at once by one asyncio client (one TCP connection each), read to the end.
Memory per stream = (peak RSS while the N streams are open − RSS before) / N, KiB; RSS
is the sum of VmRSS over the proxy's processes (nginx: master + workers), sampled every
50 ms until the first stream ends. Then, coordinator only: rounds of N streams + N
aborted (dropped after the first chunk), RSS after each round (in `extra`).

usage: bench/coord_memory.py [--json PATH] [--streams N] [--rounds R]
   (motor-bench-plugin: 1) env BENCH_MEM_STREAMS (2000; 1000 quick)
Standard library only; 127.0.0.1 only; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1
from lib import common as C  # noqa: E402
from lib import wrk  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import streamload  # noqa: E402

GROUP = "Coordinator memory per concurrent stream"
WORKERS = 2
MAX_TOKENS = 16


def _nginx_conf(port: int, engine_port: int) -> str:
    return f"""
    upstream engines {{
        server 127.0.0.1:{engine_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} reuseport;
        keepalive_requests 1000000;
        client_body_buffer_size 1m;
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}"""


def rss_sum(pids: list[int]) -> int:
    total = 0
    for p in pids:
        try:
            total += streamload.rss_kib(p)
        except (OSError, RuntimeError):
            pass
    return total


def per_stream(port: int, pids_fn, n: int) -> dict:
    """Open n streams at once through port; the memory they cost the proxy, and what it
    still holds 3 s after they ended."""
    streamload.burst(port, 50)  # warm-up: upstream pools, first allocations
    time.sleep(1.5)
    before = rss_sum(pids_fn())
    peak = [before]

    def sample() -> None:
        peak[0] = max(peak[0], rss_sum(pids_fn()))

    out = streamload.burst(port, n, during=sample, max_tokens=MAX_TOKENS)
    if out.get("done") != n:
        raise RuntimeError(f"port {port}: not every stream completed: {out}")
    time.sleep(3.0)
    return {"before_kib": before, "peak_kib": peak[0], "after_kib": rss_sum(pids_fn()),
            "per_stream_kib": round((peak[0] - before) / n, 2)}


def start_coordinator(sess: C.Session, motor: str, eport: int, name: str) -> tuple:
    clog = sess.path(f"{name}.log")
    c = sess.start([motor, "coordinator", "--port", "0", "--mgmt-port", "0",
                    "--workers", str(WORKERS), "--log-level", "info"], f"{name}.log")
    ev = C.wait_log_event(clog, "coordinator_listening", 15, c)
    cport, mport = ev["infer_port"], ev["mgmt_port"]
    body = {"event": "set", "model_name": "m", "instances": [
        {"id": 1, "role": "union", "endpoints": [{"id": 0, "address": f"127.0.0.1:{eport}"}]}]}
    st, b = C.http_post_json(f"http://127.0.0.1:{mport}/instances/refresh", body)
    if st // 100 != 2:
        raise RuntimeError(f"coordinator refresh answered {st}: {b[:200]!r}")
    return c, cport


def stop(p) -> None:
    p.terminate()
    try:
        p.wait(15)
    except Exception:
        p.kill()
        p.wait(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    n = a.streams or C.env_int("BENCH_MEM_STREAMS", 1000 if a.quick else 2000)
    rounds = a.rounds or (3 if a.quick else 10)
    why = wrk.nginx_available()
    motor_v, nginx_v, soaks = [], [], []
    sess = C.Session("coord-mem")
    try:
        eport = C.free_port()
        e = sess.start([a.motor, "engine-sim", "--model", "m", "--port", str(eport),
                        "--ttft-ms", "20", "--tokens-per-second", "4", "--load-seconds", "0",
                        "--max-num-seqs", str(4 * n), "--log-level", "warn"], "engine.log")
        C.wait_port(eport, 15, e)
        for rep in range(a.reps):
            # Fresh proxies every repetition: nginx keeps (and reuses) what a burst took.
            C.log(f"coord memory rep {rep + 1}/{a.reps}: {n} streams, coordinator")
            c, cport = start_coordinator(sess, a.motor, eport, f"coordinator-{rep}")
            motor_v.append(per_stream(cport, lambda: [c.pid], n))
            stop(c)
            C.log(f"  {motor_v[-1]}")
            if why is None:
                C.log(f"coord memory rep {rep + 1}/{a.reps}: {n} streams, nginx")
                nsess = C.Session("coord-mem-nginx")
                try:
                    nport = C.free_port()
                    ng = wrk.start_nginx(nsess, WORKERS, _nginx_conf(nport, eport), nport)
                    nginx_v.append(per_stream(nport, lambda: [ng.pid] + C.children(ng.pid), n))
                finally:
                    nsess.close()
                C.log(f"  {nginx_v[-1]}")
        c, cport = start_coordinator(sess, a.motor, eport, "coordinator-soak")
        C.log(f"coord memory: soak, {rounds} rounds of {n} streams + {n} aborted")
        fresh = streamload.rss_kib(c.pid)
        for r in streamload.soak(cport, c.pid, n, rounds,
                                 metrics_url=f"http://127.0.0.1:{cport}/metrics",
                                 max_tokens=MAX_TOKENS, settle=1.5,
                                 trim_metric="motor_coordinator_memory_trims_total"):
            soaks.append({k: r[k] for k in ("round", "peak_kib", "rss_kib")})
            C.log(f"  {soaks[-1]}")
    finally:
        sess.close()
    notes = [f"One engine simulator (4 tokens/s, {MAX_TOKENS} tokens a stream); {n} "
             f"streaming chat completions opened at once, one TCP connection each; (peak "
             f"RSS while they are open − RSS before) / {n}. Coordinator: {WORKERS} workers; "
             f"nginx: {WORKERS} workers, upstream keepalive 64, proxy_buffering off; RSS = "
             f"sum of VmRSS over master + workers."
             + (f" nginx not run: {why}." if why else ""),
             f"Soak (extra.soak): {rounds} rounds of {n} completed + {n} aborted streams, "
             f"coordinator RSS after each round once its idle trim ran (+1.5 s; fresh "
             f"{fresh} KiB)."]
    after = plugin.row("coord.memory_after_burst", GROUP,
                       f"{n} concurrent streaming chats, 3 s after they ended",
                       "RSS still held", "KiB", [v["after_kib"] for v in motor_v],
                       peer_name="nginx reverse proxy" if nginx_v else None,
                       peer=[v["after_kib"] for v in nginx_v] or None,
                       notes=["Same runs as the row above; the coordinator gives freed heap "
                              "back (malloc_trim once idle, docs/operations.md \"Memory\"), "
                              "nginx keeps its pools for reuse."])
    rows = [plugin.row("coord.memory_per_stream", GROUP, f"{n} concurrent streaming chats",
                       "RSS per open stream", "KiB",
                       [v["per_stream_kib"] for v in motor_v],
                       peer_name="nginx reverse proxy" if nginx_v else None,
                       peer=[v["per_stream_kib"] for v in nginx_v] or None, notes=notes,
                       extra={"motor": motor_v, "nginx": nginx_v, "soak": soaks,
                              "fresh_kib": fresh}),
            plugin.row("coord.memory_after_rounds", GROUP,
                       f"{rounds} rounds of {n} streams + {n} aborted",
                       "RSS after the last round ÷ after the first", "ratio",
                       [round(soaks[-1]["rss_kib"] / soaks[0]["rss_kib"], 3)],
                       target="≤ 1.1", notes=["Coordinator only; per-round figures in "
                                              "extra.soak of the row above."]), after]
    plugin.emit(a, rows)
    print(json.dumps({"motor": motor_v, "nginx": nginx_v, "soak": soaks, "fresh_kib": fresh},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
