#!/usr/bin/env python3
"""Coordinator master/standby: master SIGKILL -> the standby's first answered request.

Two `motor coordinator`s on one etcd (standby_config: master_lock_ttl TTL, renewal and
retry every second), one `motor engine-sim` behind them. Each round SIGKILLs the
current master and polls the standby with a one-token completion every 10 ms until one
is answered 200; the time from the kill to that answer is the takeover. The killed
coordinator is then started again (it comes back as the standby, with the replicated
table) and the next round kills the new master. Shown next to the TTL, its bound: the
master's lease ends at most one TTL after its last renewal, which was at most one
renewal period (here 1 s) before the kill.

usage: bench/coord_takeover.py [--rounds N] [--ttl S]   (motor-bench-plugin: 1)
Environment: BENCH_HA_KILLS (rounds per repetition; default 8, quick 4). Needs etcd.
Standard library only; everything on 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402
from ctl_fakes import Etcd  # noqa: E402


class Coord:
    def __init__(self, reg: motorlib.ProcRegistry, tmp: str, name: str, etcd: str, ttl: int):
        self.reg, self.name = reg, name
        self.infer, self.mgmt = motorlib.free_port(), motorlib.free_port()
        self.config = os.path.join(tmp, f"{name}.json")
        with open(self.config, "w") as f:
            json.dump({"motor_coordinator_config": {
                "standby_config": {"enable_master_standby": True, "master_lock_ttl": ttl,
                                   "master_standby_check_interval": 1,
                                   "master_lock_retry_interval": 1,
                                   "master_lock_key": "/bench/coordinator"},
                "etcd_config": {"etcd_endpoints": [etcd], "etcd_timeout": 1},
                "logging_config": {"log_level": "WARNING"}}}, f)
        self.start()

    def start(self) -> None:
        self.proc = self.reg.motor("coordinator", "--config", self.config, "--port", self.infer,
                                   "--mgmt-port", self.mgmt, "--workers", 1, name=self.name)
        motorlib.wait_http(f"http://127.0.0.1:{self.mgmt}/liveness", 200, timeout=15,
                           proc=self.proc)

    def ready(self) -> int:
        r = motorlib.try_get(f"http://127.0.0.1:{self.mgmt}/readiness", timeout=1)
        return r.status if r else 0

    def answers(self) -> bool:
        try:
            r = motorlib.post(f"http://127.0.0.1:{self.infer}/v1/completions",
                              {"model": "m", "prompt": "p", "max_tokens": 1}, timeout=1)
            return r.status == 200
        except OSError:
            return False


def run_once(motor: str, rounds: int, ttl: int) -> list[float]:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-takeover-")
    reg = motorlib.ProcRegistry(tmp)
    out: list[float] = []
    try:
        e = Etcd(reg)
        sim = motorlib.start_sim(reg, "--model", "m", "--ttft-ms", "0", "--tokens-per-second",
                                 "0", name="sim")
        cs = [Coord(reg, tmp, f"coord-{i}", e.url, ttl) for i in range(2)]
        master = motorlib.wait_for(lambda: next((c for c in cs if c.ready() == 200), None), 20,
                                   what="a master")
        body = {"event": "set", "model_name": "m", "instances": [
            {"id": 1, "role": "union", "endpoints": [{"id": 0,
                                                      "address": f"127.0.0.1:{sim.port}"}]}]}
        r = motorlib.post(f"http://127.0.0.1:{master.mgmt}/instances/refresh", body)
        assert r.status == 200, r
        for k in range(rounds):
            master = motorlib.wait_for(lambda: next((c for c in cs if c.ready() == 200), None),
                                       20, what="a master")
            standby = cs[1] if master is cs[0] else cs[0]
            # the standby's replica has the table: the takeover needs nothing else
            motorlib.wait_for(lambda: standby.ready() == 503, 20, what="a standby")
            t0 = time.monotonic()
            master.proc.signal(signal.SIGKILL)
            motorlib.wait_for(standby.answers, ttl + 10, interval=0.01,
                              what="the standby's first answer")
            took = (time.monotonic() - t0) * 1000
            out.append(took)
            print(f"round {k + 1}: takeover {took:.0f} ms (TTL {ttl * 1000} ms)", flush=True)
            master.proc.wait(5)
            master.start()
        return out
    finally:
        reg.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=0, help="kills per repetition")
    ap.add_argument("--ttl", type=int, default=3, help="master_lock_ttl, seconds")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    work = f"2 coordinators on etcd, master_lock_ttl {a.ttl} s, renewal and retry 1 s"
    if not shutil.which("etcd"):
        plugin.emit(a, [plugin.row("coord.takeover.p50", "Coordinator takeover", work, "p50",
                                   "ms", None, status="pending", reason="etcd not installed")])
        return 0
    rounds = a.rounds or int(os.environ.get("BENCH_HA_KILLS", "0")) or (4 if a.quick else 8)
    reps = [run_once(a.motor, rounds, a.ttl) for _ in range(a.reps)]
    p50 = [plugin.pct(r, 50) for r in reps]
    mx = [max(r) for r in reps]
    notes = [f"{rounds} master SIGKILLs per repetition; time from the kill to the first "
             "completion the standby answers (polled every 10 ms); the peer column is the "
             "lease TTL, the bound (ratio < 1: within it)"]
    plugin.emit(a, [
        plugin.row("coord.takeover.p50", "Coordinator takeover", work,
                   "master SIGKILL → standby's first answer, median", "ms", p50,
                   peer_name="the lease TTL (the bound)", peer=[a.ttl * 1000.0] * len(reps),
                   notes=notes, extra={"max_ms": mx, "all_ms": reps}),
    ])
    print(f"\ntakeover median per repetition (ms): {[round(x) for x in p50]}, "
          f"max {[round(x) for x in mx]}, TTL {a.ttl * 1000} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
