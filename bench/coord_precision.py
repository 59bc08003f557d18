#!/usr/bin/env python3
"""Precision detection: the detector's detection and false-alarm rates on a labelled
corpus the simulator generates, and the added latency of a sampled request.

Corpus: one `motor engine-sim` (no pacing) behind a `motor coordinator` with
precision_check_enabled, interval_seconds 0 (every request sampled), logprobs_count 5
(every detector on) and an issue threshold it never reaches (so the corpus is judged,
not acted on). The same request mix goes through it with the engine good (10,000
answers: the false alarms) and switched to each fault mode (`POST /sim/fault`; 1,000
answers each: the detection): chat and completions, a quarter streamed, a quarter with
the client's own logprobs, prompts of 1-30 random words, max_tokens 16-256 (the
generator's natural end is 8-127 tokens). Every verdict is the coordinator's own
`precision_sample` log event (the real chain: sampling, projection, check), in order.
Figures per mode: the share of judged samples flagged with that fault; "within the
threshold": the share of runs of precision_issue_threshold (10) consecutive samples that
are all flagged — what an alarm needs. Good corpus: samples flagged bad, and false alarms
(runs of 10 bad in a row, the alarm's condition; goal 0).

Overhead: motor-latprobe (built next to motor) interleaves three targets — the engine
direct, a coordinator with every request sampled, one without precision — one
non-streamed chat request of 64 tokens at a time; the row is the sampled coordinator's
p50 next to the unsampled one's (peer), and their difference in `extra`.

usage: bench/coord_precision.py [--good N] [--bad N]   (motor-bench-plugin: 1)
Environment: BENCH_QUICK (2,000 good, 300 per mode, 1,000 timed requests per target and
repetition; full: 1,500). Standard
library only; everything on 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import latprobe, plugin  # noqa: E402  motor-bench-plugin: 1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402

MODES = ("repeat", "garbled", "rare_chars")
THRESHOLD = 10
WORDS = ("the sea model river light engine story small quick brown fox jumps over lazy dog "
         "answer question science history music city road mountain winter summer").split()


def post(url: str, body: dict, stream: bool) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        return r.status


def one_request(infer: str, rnd: random.Random) -> None:
    prompt = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 30)))
    stream = rnd.random() < 0.25
    own = rnd.random() < 0.25
    mt = rnd.randint(16, 256)
    if rnd.random() < 0.5:
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}],
                "max_tokens": mt, "stream": stream}
        if own:
            body.update(logprobs=True, top_logprobs=rnd.randint(0, 8))
        path = "/v1/chat/completions"
    else:
        body = {"model": "m", "prompt": prompt, "max_tokens": mt, "stream": stream}
        if own:
            body["logprobs"] = rnd.randint(0, 8)
        path = "/v1/completions"
    st = post(infer + path, body, stream)
    if st != 200:
        raise RuntimeError(f"HTTP {st} from the coordinator")


def verdicts(proc: motorlib.Proc, since: int) -> list[dict]:
    return proc.find_events("precision_sample")[since:]


def run_corpus(infer: str, proc: motorlib.Proc, n: int, seed: int) -> list[dict]:
    before = len(proc.find_events("precision_sample"))
    rnds = [random.Random(seed * 1000 + i) for i in range(n)]
    with ThreadPoolExecutor(max_workers=4) as ex:
        list(ex.map(lambda r: one_request(infer, r), rnds))
    deadline = time.monotonic() + 30
    while len(verdicts(proc, before)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    got = verdicts(proc, before)
    if len(got) < n:
        raise RuntimeError(f"{len(got)} verdicts for {n} sampled requests")
    return got


def runs_all_bad(flags: list[bool], k: int) -> float:
    """Share of the disjoint runs of k consecutive samples that are all flagged."""
    runs = [flags[i:i + k] for i in range(0, len(flags) - k + 1, k)]
    return 100.0 * sum(all(r) for r in runs) / len(runs) if runs else 0.0


def false_alarms(flags: list[bool], k: int) -> int:
    n = streak = 0
    for f in flags:
        streak = streak + 1 if f else 0
        if streak == k:
            n += 1
            streak = 0
    return n


def start(reg: motorlib.ProcRegistry, tmp: str, name: str, prec: bool, log: str) -> tuple:
    cfg = {"motor_coordinator_config": {"logging_config": {"log_level": log}}}
    if prec:
        cfg["motor_coordinator_config"]["precision_detection_config"] = {
            "precision_check_enabled": True, "interval_seconds": 0, "logprobs_count": 5,
            "precision_issue_threshold": 100000, "probe_max_attempts": 0}
    path = os.path.join(tmp, f"{name}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = reg.motor("coordinator", "--config", path, "--port", 0, "--mgmt-port", 0, "--workers", 1,
                  name=name)
    ev = p.wait_event("coordinator_listening", timeout=15)
    return p, int(ev["infer_port"]), int(ev["mgmt_port"])


def register(mgmt: int, sim_port: int) -> None:
    r = motorlib.post(f"http://127.0.0.1:{mgmt}/instances/refresh",
                      {"event": "set", "model_name": "m", "instances": [
                          {"id": 1, "role": "union",
                           "endpoints": [{"id": 0, "address": f"127.0.0.1:{sim_port}"}]}]}, 10)
    if r.status != 200:
        raise RuntimeError(f"refresh: {r}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--good", type=int, default=0)
    ap.add_argument("--bad", type=int, default=0)
    a = plugin.args(ap)
    os.environ["MOTOR_BIN"] = a.motor
    n_good = a.good or (2000 if a.quick else 10000)
    n_bad = a.bad or (300 if a.quick else 1000)
    # the plug-in runs within row_plugins' 300 s (full): the corpus takes most of it
    timed = 1000 if a.quick else 1500
    tmp = tempfile.mkdtemp(prefix="motor-bench-prec-")
    reg = motorlib.ProcRegistry(tmp)
    rows = []
    try:
        sim = motorlib.start_sim(reg, "--model", "m", "--ttft-ms", "0", "--tokens-per-second",
                                 "0", name="sim")
        co, infer_port, mgmt = start(reg, tmp, "coord-sampled", True, "DEBUG")
        register(mgmt, sim.port)
        infer = f"http://127.0.0.1:{infer_port}"
        # labelled corpus
        good = run_corpus(infer, co, n_good, 1)
        flags = [v["verdict"] == "bad" for v in good if v["verdict"] != "invalid"]
        judged_good = len(flags)
        fp = sum(flags)
        fa = false_alarms(flags, THRESHOLD)
        print(f"good: {n_good} answers, {judged_good} judged, {fp} flagged, {fa} false alarms")
        det = {}
        for k, mode in enumerate(MODES):
            sim.fault(mode)
            got = run_corpus(infer, co, n_bad, 10 + k)
            sim.fault("recover")
            judged = [v for v in got if v["verdict"] != "invalid"]
            flags_m = [mode in v["fault"].split("+") for v in judged]
            rate = 100.0 * sum(flags_m) / len(flags_m) if flags_m else 0.0
            within = runs_all_bad(flags_m, THRESHOLD)
            det[mode] = (rate, within, len(judged))
            print(f"{mode}: {len(judged)} judged, detected {rate:.2f} %, runs of {THRESHOLD} all "
                  f"flagged {within:.2f} %")
            rows.append(plugin.row(
                f"coord.precision.detect.{mode}", "Precision detector: detection",
                f"simulator `{mode}` fault, {len(judged)} sampled answers (chat/completions, "
                f"¼ streamed, 16-256 tokens), logprobs_count 5", "samples flagged", "%",
                round(rate, 2), better="higher", target="≥ 99 %",
                extra={"within_threshold_pct": round(within, 2), "judged": len(judged),
                       "answers": n_bad}))
        rows.append(plugin.row(
            "coord.precision.false_alarms", "Precision detector: false alarms",
            f"{n_good} good simulator answers ({judged_good} long enough to judge)",
            f"false alarms ({THRESHOLD} bad in a row)", "count", fa, target="0",
            extra={"flagged_samples": fp, "judged": judged_good}))
        # overhead
        probe = latprobe.find(a.motor)
        if not probe:
            rows.append(plugin.row("coord.precision.overhead.p50", "Precision sampling overhead",
                                   "", "p50", "µs", None, status="pending",
                                   reason=latprobe.missing_reason(a.motor)))
        else:
            plain, plain_port, plain_mgmt = start(reg, tmp, "coord-plain", False, "INFO")
            register(plain_mgmt, sim.port)
            co.stop(10)
            co, infer_port, mgmt = start(reg, tmp, "coord-sampled2", True, "INFO")
            register(mgmt, sim.port)
            body = {"model": "m", "messages": [{"role": "user", "content": "tell me a story"}],
                    "max_tokens": 64}
            # what the sampled request asks the engine for: its own cost, apart
            lp_body = dict(body, logprobs=True, top_logprobs=5, return_tokens_as_token_ids=True)
            p50s, plain50s, added, engine_lp, coord_own = [], [], [], [], []
            for rep in range(a.reps):
                doc = latprobe.run(probe, [("direct", sim.port), ("unsampled", plain_port),
                                           ("sampled", infer_port)], body, timed, 50, tmp,
                                   path="/v1/chat/completions")
                lp = latprobe.run(probe, [("direct", sim.port), ("unsampled", plain_port)],
                                  lp_body, timed, 50, tmp, path="/v1/chat/completions")
                s, u = doc["by_name"]["sampled"], doc["by_name"]["unsampled"]
                ul = lp["by_name"]["unsampled"]
                p50s.append(s["p50_us"])
                plain50s.append(u["p50_us"])
                added.append(s["p50_us"] - u["p50_us"])
                engine_lp.append(ul["p50_us"] - u["p50_us"])
                coord_own.append(s["p50_us"] - ul["p50_us"])
                print(f"rep {rep + 1}: sampled p50 {s['p50_us']:.1f} us, unsampled "
                      f"{u['p50_us']:.1f} us, direct {doc['by_name']['direct']['p50_us']:.1f} us; "
                      f"unsampled with the sampled body {ul['p50_us']:.1f} us (the engine's "
                      f"logprobs: {engine_lp[-1]:.1f} us, the coordinator's own sampling work: "
                      f"{coord_own[-1]:.1f} us)")
            rows.append(plugin.row(
                "coord.precision.overhead.p50", "Precision sampling overhead",
                f"non-streamed chat, 64 tokens, every request sampled (logprobs_count 5) vs "
                f"precision off; motor-latprobe {timed} requests per target, interleaved",
                "latency p50", "µs", p50s, peer_name="coordinator, precision off",
                peer=plain50s,
                notes=["added = the engine computing logprobs + the coordinator's own work "
                       "(parse, project, collect; the check runs off the client's path)"],
                extra={"added_p50_us": added, "engine_logprobs_p50_us": engine_lp,
                       "coordinator_sampling_p50_us": coord_own}))
    except Exception as ex:  # a row that ran and failed says so
        rows.append(plugin.row("coord.precision.detect", "Precision detector", "", "", "", None,
                               status="error", reason=f"{type(ex).__name__}: {ex}"))
        print(f"error: {ex}", file=sys.stderr)
    finally:
        reg.close_all()
    plugin.emit(a, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
