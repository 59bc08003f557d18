#!/usr/bin/env python3
"""A decode engine SIGKILLed in the middle of hundreds of streams: answers lost by the
coordinator (mid-stream rescheduling) and by nginx as a plain reverse proxy in front of
the same engines, side by side.

Two union `motor engine-sim`s (10 tokens/s per stream, answers of 8..127 tokens) behind
the proxy; N concurrent streams (completions and chat, different prompts) start at once;
`--kill-after` seconds later one engine is SIGKILLed (`--fault hang`: hung — alive,
accepting, answering nothing; the coordinator's inter_token_timeout is 1 s here, nginx's
proxy_read_timeout 10 s). Every answer is checked against the
fault-free reference (the same request to a third simulator, not streamed): a lost
answer is a non-200, an in-band error, a stream without [DONE], or a text that differs.
The added latency of a rescheduled answer is the longest pause between two of its events
minus the engines' inter-token interval (client-side, p50/p99 over the answers that
paused more than 3 intervals).

usage: bench/coord_reschedule.py [--streams 500] [--kill-after 2] [--fault kill|hang]
                                 [--motor PATH]
       (motor-bench-plugin: 1)
Environment: BENCH_RESCHED_STREAMS (default 500, quick 200). Needs nginx for the peer
column. Standard library only; everything on 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
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
from coord_helpers import ext_instance, start_coordinator  # noqa: E402

TPS = 10

NGINX_CONF = """
worker_processes 2;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engines {{
        {servers}
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 10s;
        }}
    }}
}}
"""


def requests(n: int) -> list[tuple[str, dict]]:
    out = []
    for i in range(n):
        if i % 3 == 2:
            out.append(("/v1/chat/completions",
                        {"model": "m", "stream": True, "max_tokens": 200,
                         "messages": [{"role": "user", "content": f"bench story {i}"}]}))
        else:
            out.append(("/v1/completions", {"model": "m", "stream": True, "max_tokens": 200,
                                            "prompt": f"bench request {i} says"}))
    return out


def reference(port: int, path: str, body: dict) -> str:
    b = dict(body, stream=False)
    r = motorlib.post(f"http://127.0.0.1:{port}{path}", b, 30)
    assert r.status == 200, r
    ch = r.json()["choices"][0]
    return ch["message"]["content"] if "chat" in path else ch["text"]


def one_stream(port: int, path: str, body: dict) -> dict:
    out = {"ok": False, "text": "", "gap": 0.0, "why": ""}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        conn.request("POST", path, json.dumps(body),
                     {"Content-Type": "application/json", "Accept": "text/event-stream"})
        r = conn.getresponse()
        if r.status != 200:
            out["why"] = f"HTTP {r.status}"
            return out
        last = None
        done = False
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            now = time.monotonic()
            if last is not None:
                out["gap"] = max(out["gap"], now - last)
            last = now
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                continue
            ev = json.loads(payload)
            if "error" in ev:
                out["why"] = "in-band error: " + str(ev["error"].get("message"))
                continue
            for ch in ev.get("choices", []):
                if "chat" in path:
                    out["text"] += ch.get("delta", {}).get("content") or ""
                else:
                    out["text"] += ch.get("text") or ""
        conn.close()
        if not done and not out["why"]:
            out["why"] = "no [DONE]"
        out["ok"] = done and not out["why"]
    except Exception as e:  # noqa: BLE001 - a lost answer, reported
        out["why"] = repr(e)
    return out


def run_load(port: int, reqs, refs, kill, kill_after: float) -> dict:
    results: list = [None] * len(reqs)

    def worker(i):
        results[i] = one_stream(port, *reqs[i])
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(reqs))]
    for t in threads:
        t.start()
    time.sleep(kill_after)
    kill()
    for t in threads:
        t.join(180)
    lost = 0
    whys: dict[str, int] = {}
    added = []
    for res, ref in zip(results, refs):
        if res is None or not res["ok"] or res["text"] != ref:
            lost += 1
            why = (res or {}).get("why") or "text differs from the reference"
            whys[why[:60]] = whys.get(why[:60], 0) + 1
            continue
        if res["gap"] > 3.0 / TPS:
            added.append((res["gap"] - 1.0 / TPS) * 1000)
    return {"lost": lost, "whys": whys, "added_ms": added}


def fault_fn(sim, fault: str):
    """The fault: SIGKILL, or the simulator's hang (alive, answering nothing)."""
    if fault == "hang":
        return lambda: sim.fault("hang")
    return lambda: sim.proc.signal(signal.SIGKILL)


def run_once(motor: str, n: int, kill_after: float, peer: bool, fault: str = "kill") -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-resched-")
    reg = motorlib.ProcRegistry(tmp)
    out = {}
    try:
        # room for every stream on the survivor (the simulator's default is vLLM's 256
        # sequences: the rest would wait in its queue, an engine's cost, not a proxy's)
        slow = ("--ttft-ms", "0", "--tokens-per-second", str(TPS), "--max-num-seqs", "2048")
        ref = motorlib.start_sim(reg, "--model", "m", "--ttft-ms", "0", "--tokens-per-second",
                                 "0", name="reference")
        reqs = requests(n)
        refs = [reference(ref.port, p, b) for p, b in reqs]
        # the coordinator
        a = motorlib.start_sim(reg, "--model", "m", *slow, name="doomed")
        b = motorlib.start_sim(reg, "--model", "m", *slow, name="survivor")
        c = start_coordinator(reg, tmp, {"exception_config": {"retry_delay": 0.05},
                                         "reschedule_config": {"inter_token_timeout": 1}},
                              workers=2)
        c.set_instances([ext_instance(1, "union", a), ext_instance(2, "union", b)])
        out["motor"] = run_load(c.infer_port, reqs, refs, fault_fn(a, fault), kill_after)
        out["motor"]["gap_ms"] = [float(e["gap_ms"]) for e in c.proc.find_events("stream_resumed")]
        c.proc.stop(15)
        if peer and shutil.which("nginx"):
            a2 = motorlib.start_sim(reg, "--model", "m", *slow, name="doomed2")
            b2 = motorlib.start_sim(reg, "--model", "m", *slow, name="survivor2")
            ndir = os.path.join(tmp, "nginx")
            for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
                os.makedirs(os.path.join(ndir, d), exist_ok=True)
            port = motorlib.free_port()
            servers = "".join(f"server 127.0.0.1:{s.port};" for s in (a2, b2))
            conf = os.path.join(ndir, "nginx.conf")
            with open(conf, "w") as f:
                f.write(NGINX_CONF.format(tmp=ndir, servers=servers, port=port))
            ng = reg.start([shutil.which("nginx"), "-c", conf, "-p", ndir, "-g", "daemon off;"],
                           name="nginx")
            motorlib.wait_http(f"http://127.0.0.1:{port}/health", 200, timeout=10)
            out["nginx"] = run_load(port, reqs, refs, fault_fn(a2, fault), kill_after)
            ng.stop(10)
        return out
    finally:
        reg.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=0)
    ap.add_argument("--kill-after", type=float, default=2.0)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--fault", choices=("kill", "hang"), default="kill")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    n = a.streams or int(os.environ.get("BENCH_RESCHED_STREAMS", "0")) or (200 if a.quick else 500)
    runs = [run_once(a.motor, n, a.kill_after, not a.no_peer, a.fault) for _ in range(a.reps)]
    lost = [r["motor"]["lost"] for r in runs]
    peer_lost = [r["nginx"]["lost"] for r in runs if "nginx" in r]
    added = [x for r in runs for x in r["motor"]["added_ms"]]
    gaps = [x for r in runs for x in r["motor"]["gap_ms"]]
    g50 = plugin.pct(gaps, 50) if gaps else None
    g99 = plugin.pct(gaps, 99) if gaps else None
    p50 = plugin.pct(added, 50) if added else None
    p99 = plugin.pct(added, 99) if added else None
    what = "SIGKILLed" if a.fault == "kill" else "hung (alive, silent)"
    work = (f"{n} concurrent streams ({TPS} tokens/s each) over 2 union engine-sims, one "
            f"{what} {a.kill_after:g} s in")
    notes = [f"lost = non-200, in-band error, no [DONE] or text unlike the fault-free "
             f"reference; {len(gaps)} answers rescheduled: failure → continuation's first "
             f"byte p50 {g50} ms, p99 {g99} ms (coordinator's stream_resumed gap_ms); longest "
             f"pause the client saw minus the token interval p50 {p50 and round(p50)} ms, p99 "
             f"{p99 and round(p99)} ms ({len(added)} answers paused > 3 intervals)"]
    plugin.emit(a, [
        plugin.row(f"coord.reschedule.lost{'' if a.fault == 'kill' else '.' + a.fault}",
                   f"Engine {'killed' if a.fault == 'kill' else 'hung'} mid-stream", work,
                   "answers lost", "answers", lost, peer_name="nginx reverse proxy",
                   peer=peer_lost or None, target="0", notes=notes,
                   extra={"added_ms_p50": p50, "added_ms_p99": p99, "gap_ms_p50": g50,
                          "gap_ms_p99": g99, "rescheduled": len(gaps),
                          "why": [r["motor"]["whys"] for r in runs],
                          "peer_why": [r["nginx"]["whys"] for r in runs if "nginx" in r]}),
    ])
    print(json.dumps({"streams": n, "motor_lost": lost, "nginx_lost": peer_lost,
                      "rescheduled_added_ms": {"p50": p50, "p99": p99, "n": len(added)},
                      "reschedule_gap_ms": {"p50": g50, "p99": g99, "n": len(gaps)},
                      "motor_why": [r["motor"]["whys"] for r in runs],
                      "nginx_why": [r["nginx"]["whys"] for r in runs if "nginx" in r]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
