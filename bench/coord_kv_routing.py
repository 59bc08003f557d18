#!/usr/bin/env python3
"""Cache-aware routing: multi-turn chat with shared system prompts over 4 engines with
limited prefix caches — cache-hit rate, TTFT p50/p99 and load spread of the coordinator's
schedulers next to an oracle, plus the routing decision's own cost at 10,000 sessions.

The fleet: 4 `motor engine-sim` DP ranks of one union instance (vLLM-style KV events on
base port + rank with a replay endpoint), block size 16, a prefix cache of
BENCH_KV_BLOCKS blocks each (smaller than the workload's working set: routing decides
what stays cached), TTFT = 1 ms + 0.1 ms per uncached prompt token (the simulator's
prefix-cache model). The workload: BENCH_KV_SESSIONS sessions, each with one of 4
system prompts (~400 tokens) and BENCH_KV_TURNS turns; a turn sends the whole
conversation so far plus a new user message (~40 tokens) and the assistant's previous
answer (~40 tokens) — the prompt grows as a chat does. 8 clients, each its sessions in
turn, one request at a time, `max_tokens` 1 (the latency is the TTFT). Each scheduler
runs on fresh engines (empty caches) and a fresh coordinator:

  kv_cache_affinity   Motor's own KV index from the engines' events (unified mode)
  load_gated          the same, kv_cache_affinity_mode load_gated
  approximate         kv_cache_affinity_source approximate (no events, no /tokenize)
  load_balance        least in-flight tokens (the default)
  round_robin
  oracle              perfect knowledge, no gateway: the client sends every session of a
                      system prompt straight to "its" engine (4 prompts, 4 engines), the
                      placement that shares every prefix with a perfectly even load

Hit rate = prompt tokens the engines found cached / prompt tokens (their /sim/status).
Load spread = the busiest engine's prompt tokens / the mean. Goals (issue 18): hit rate
>= 0.9 x oracle, TTFT p50 <= 0.5 x load_balance, spread <= 1.5.

usage: bench/coord_kv_routing.py [--json PATH]   (motor-bench-plugin: 1)
Environment: BENCH_KV_SESSIONS (48; quick 32), BENCH_KV_TURNS (6; quick 5),
BENCH_KV_BLOCKS (256). Standard library only; 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402

N = 4
CLIENTS = 8
SCHEDULERS = ["kv_cache_affinity", "load_gated", "approximate", "load_balance", "round_robin",
              "oracle"]


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def system_prompt(g: int) -> str:
    return f"You are assistant number {g}. " + words(f"s{g}w", 400)


def turn_text(k: int, t: int) -> str:
    return f" User: question {t} of session {k}: " + words(f"u{k}t{t}x", 40) + \
        f" Assistant: " + words(f"a{k}t{t}y", 40)


def prompt(k: int, turns: int) -> str:
    return system_prompt(k % N) + "".join(turn_text(k, t) for t in range(turns + 1))


def fleet(reg, blocks: int):
    base, rbase = motorlib.free_port(), motorlib.free_port()
    cfg = ('{"enable_kv_cache_events": true, '
           f'"endpoint": "tcp://*:{base}", "replay_endpoint": "tcp://*:{rbase}"}}')
    sims = []
    for r in range(N):
        sims.append(motorlib.start_sim(
            reg, "--model", "m", "--ttft-ms", "1", "--prefill-ms-per-token", "0.1",
            "--tokens-per-second", "0", "--block-size", "16", "--num-gpu-blocks-override",
            str(blocks), "--kv-events-config", cfg, "--data-parallel-rank", str(r),
            "--data-parallel-size", str(N), name=f"rank{r}"))
    return sims, base, rbase


def coordinator(reg, tmp: str, sched: str, base: int, rbase: int):
    sc = {"scheduler_type": sched}
    if sched == "load_gated":
        sc = {"scheduler_type": "kv_cache_affinity", "kv_cache_affinity_mode": "load_gated"}
    if sched == "approximate":
        sc = {"scheduler_type": "kv_cache_affinity", "kv_cache_affinity_source": "approximate"}
    cfg = {"scheduler_config": sc,
           "prefill_kv_event_config": {"endpoint": f"tcp://*:{base}",
                                       "replay_endpoint": f"tcp://*:{rbase}"}}
    path = os.path.join(tmp, f"coord-{sched}.json")
    with open(path, "w") as f:
        json.dump({"motor_coordinator_config": cfg}, f)
    infer, mgmt = motorlib.free_port(), motorlib.free_port()
    p = reg.motor("coordinator", "--config", path, "--port", infer, "--mgmt-port", mgmt,
                  "--workers", 2, name=f"coord-{sched}")
    motorlib.wait_http(f"http://127.0.0.1:{mgmt}/liveness", 200, timeout=15, proc=p)
    return p, infer, mgmt


def register(mgmt: int, sims) -> None:
    eps = {"127.0.0.1": {str(r): {"id": r, "ip": "127.0.0.1", "business_port": str(s.port),
                                  "status": "normal", "headless": False}
                         for r, s in enumerate(sims)}}
    body = {"event": "set", "model_name": "m", "instances": [
        {"id": 1, "role": "union", "job_name": "bench", "model_name": "m",
         "engine_type": "vllm", "status": "active", "endpoints": eps}]}
    r = motorlib.post(f"http://127.0.0.1:{mgmt}/instances/refresh", body)
    assert r.status == 200, r


def wait_subscribed(mgmt: int) -> None:
    def ok():
        idx = motorlib.get(f"http://127.0.0.1:{mgmt}/kv_index").json()["index"]
        subs = (idx or {}).get("subscriptions", [])
        return len(subs) == N and all(s["connected"] for s in subs)
    motorlib.wait_for(ok, 15, what="KV-event subscriptions")


def cache_totals(sims):
    out = []
    for s in sims:
        pc = s.status()["prefix_cache"]
        out.append((pc["queries"], pc["hits"]))
    return out


def run_workload(sims, url_of, sessions: int, turns: int):
    """url_of(session) -> the completions URL. Returns per-request latencies (ms)."""
    lat: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        mine = [k for k in range(sessions) if k % CLIENTS == c]
        for t in range(turns):
            for k in mine:
                body = {"model": "m", "prompt": prompt(k, t), "max_tokens": 1}
                t0 = time.monotonic()
                try:
                    r = motorlib.post(url_of(k), body, timeout=30)
                    ok = r.status == 200
                except OSError as e:
                    ok, r = False, e
                ms = (time.monotonic() - t0) * 1000
                with lock:
                    if ok:
                        lat.append(ms)
                    else:
                        errors.append(str(r)[:200])
    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, first: {errors[0]}")
    return lat


def run_one(motor: str, sched: str, sessions: int, turns: int, blocks: int) -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-kvbench-")
    reg = motorlib.ProcRegistry(tmp)
    try:
        sims, base, rbase = fleet(reg, blocks)
        if sched == "oracle":
            def url_of(k):
                return f"http://127.0.0.1:{sims[k % N].port}/v1/completions"
        else:
            p, infer, mgmt = coordinator(reg, tmp, sched, base, rbase)
            register(mgmt, sims)
            if sched in ("kv_cache_affinity", "load_gated"):
                wait_subscribed(mgmt)

            def url_of(k):
                return f"http://127.0.0.1:{infer}/v1/completions"
        before = cache_totals(sims)
        lat = run_workload(sims, url_of, sessions, turns)
        after = cache_totals(sims)
        q = [a[0] - b[0] for a, b in zip(after, before)]
        h = [a[1] - b[1] for a, b in zip(after, before)]
        mean = sum(q) / len(q)
        return {"hit": sum(h) / max(1, sum(q)), "p50": plugin.pct(lat, 50),
                "p99": plugin.pct(lat, 99), "spread": max(q) / mean if mean else 0.0,
                "requests": len(lat)}
    finally:
        reg.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def route_cost(motor: str) -> dict | None:
    tool = os.path.join(os.path.dirname(motor), "motor-kvroute-cost")
    if not os.access(tool, os.X_OK):
        return None
    out = subprocess.run([tool, "--sessions", "10000", "--endpoints", "8", "--tokens", "2048",
                          "--requests", "20000"], capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else None


def main() -> int:
    a = plugin.args()
    q = a.quick
    sessions = int(os.environ.get("BENCH_KV_SESSIONS", "0")) or (32 if q else 48)
    turns = int(os.environ.get("BENCH_KV_TURNS", "0")) or (5 if q else 6)
    blocks = int(os.environ.get("BENCH_KV_BLOCKS", "0")) or 256
    res: dict[str, list[dict]] = {s: [] for s in SCHEDULERS}
    for rep in range(a.reps):
        for s in SCHEDULERS:
            r = run_one(a.motor, s, sessions, turns, blocks)
            res[s].append(r)
            print(f"rep {rep + 1} {s:18s} hit {r['hit']:.3f} ttft p50 {r['p50']:.1f} ms "
                  f"p99 {r['p99']:.1f} ms spread {r['spread']:.2f}", flush=True)
    work = (f"{sessions} chat sessions x {turns} turns, 4 system prompts, 4 engines x "
            f"{blocks} blocks of 16 tokens, 8 clients")

    def col(s, k):
        return [r[k] for r in res[s]]
    rows = []
    goals = {"hit": "≥ 0.9 × oracle", "p50": "≤ 0.5 × load_balance", "spread": "≤ 1.5"}
    for s in SCHEDULERS[:-1]:
        kv = s in ("kv_cache_affinity", "load_gated")
        rows.append(plugin.row(f"coord.kv.{s}.hit_rate", "Cache-aware routing", work,
                               f"{s}: prefix-cache hit rate", "fraction", col(s, "hit"),
                               better="higher", peer_name="oracle", peer=col("oracle", "hit"),
                               target=goals["hit"] if kv else None))
        rows.append(plugin.row(f"coord.kv.{s}.ttft_p50", "Cache-aware routing", work,
                               f"{s}: TTFT p50", "ms", col(s, "p50"),
                               peer_name="load_balance", peer=col("load_balance", "p50"),
                               target=goals["p50"] if kv else None))
        rows.append(plugin.row(f"coord.kv.{s}.ttft_p99", "Cache-aware routing", work,
                               f"{s}: TTFT p99", "ms", col(s, "p99"),
                               peer_name="load_balance", peer=col("load_balance", "p99")))
        rows.append(plugin.row(f"coord.kv.{s}.spread", "Cache-aware routing", work,
                               f"{s}: busiest engine / mean (prompt tokens)", "ratio",
                               col(s, "spread"), target=goals["spread"] if kv else None))
    rows.append(plugin.row("coord.kv.oracle.ttft_p50", "Cache-aware routing", work,
                           "oracle: TTFT p50 (no gateway)", "ms", col("oracle", "p50"),
                           peer_name="load_balance", peer=col("load_balance", "p50")))
    rc = route_cost(a.motor)
    if rc:
        rows.append(plugin.row("coord.kv.route_cost", "Cache-aware routing",
                               "10,000 cached sessions of 2,048 tokens over 8 endpoints "
                               "(motor-kvroute-cost)", "routing decision per request", "µs",
                               [rc["us_per_request"]], extra=rc,
                               notes=["block keys of the prompt + index lookup + choice; "
                                      "the engine's /tokenize is not included"]))
    else:
        rows.append(plugin.row("coord.kv.route_cost", "Cache-aware routing", "", "", "µs", None,
                               status="pending", reason="motor-kvroute-cost not built"))
    plugin.emit(a, rows)
    print("\nscheduler           hit    ttft p50  ttft p99  spread")
    for s in SCHEDULERS:
        m = {k: plugin.pct(col(s, k), 50) for k in ("hit", "p50", "p99", "spread")}
        print(f"{s:18s} {m['hit']:.3f} {m['p50']:8.1f} {m['p99']:9.1f} {m['spread']:7.2f}")
    if rc:
        print(f"routing cost at 10,000 sessions: {rc['us_per_request']:.2f} µs per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
