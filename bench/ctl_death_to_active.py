#!/usr/bin/env python3
"""Controller: engine SIGKILL -> instance active again (EngineRelaunchStrategy, §7.2).

One `motor controller`, two `motor node-manager`s hosting one DP rank each of a dp=2
instance (and, second row set, four node managers of a dp=4 instance: the multi-pod shape
of issue 15, where a relaunch must restart every pod's engines), `motor engine-sim` engines with 0 s load time, a fake coordinator. Each round
SIGKILLs one engine (alternating ranks) and waits until the controller has relaunched
every engine of the instance and published it again. Times come from the controller's
own log lines (wall-clock ms timestamps) against the wall clock of the kill:

  death -> fault report accepted -> restart dispatched everywhere -> instance active
  again (the strategy's SUCCESS: every endpoint heartbeated NORMAL after the restart and
  the instance is active) -> published to the coordinator.

Settings: node-manager heartbeat 0.2 s (the instance turns active on the first NORMAL
heartbeat after the engines are ready), controller relaxed-status poll 0.2 s. Upstream
detects deaths by a 5 s poll on the NM side and polls the relaunch every 5 s.

usage: bench/ctl_death_to_active.py [--rounds N] [--json PATH]   (motor-bench-plugin: 1)
Standard library only; everything on 127.0.0.1; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import tempfile
import shutil
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402
from ctl_fakes import Controller, FakeCoordinator, controller_config  # noqa: E402
from ctl_fakes.e2e import engine_pids, sim_nm  # noqa: E402


def ts(ev: dict) -> float:
    return datetime.datetime.fromisoformat(ev["ts"].replace("Z", "+00:00")).timestamp()


def first_new(events: list[dict], start: int, pred) -> dict | None:
    """The first event at index >= start (i.e. logged after the snapshot taken before the
    kill) matching pred. Ordering by log position, not by timestamp: the log's timestamps
    have millisecond resolution, so an event in the kill's own millisecond can carry a
    time just below time.time() at the kill (a lookup by timestamp then found nothing)."""
    for e in events[start:]:
        if pred(e):
            return e
    return None


def run_once(motor: str, kills: int, pods: int = 2) -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-ctl-d2a-")
    reg = motorlib.ProcRegistry(tmp)
    coord = FakeCoordinator()
    out: dict[str, list[float]] = {"report": [], "dispatch": [], "active": [], "published": []}
    missing: dict[str, int] = {}
    failed = 0
    try:
        cfg = controller_config(tmp, coord.port, ft={"engine_relaunch_poll_interval_sec": 0.2})
        c = Controller(reg, cfg)
        rpc = motorlib.free_port()
        nms = [sim_nm(reg, tmp, c.port, "bench-d2a", dp=pods, rpc_port=rpc, name=f"nm{i}",
                      load_seconds=0.0) for i in range(pods)]
        motorlib.wait_for(lambda: any(i["status"] == "active" for i in c.instances()), 30,
                          what="instance active")
        iid = c.instances()[0]["id"]
        motorlib.wait_for(lambda: iid in coord.routable(), 10, what="published")
        for k in range(kills):
            rank = k % pods
            nm = [n for n in nms if rank in engine_pids(n)][0]
            pid = engine_pids(nm)[rank]
            done_before = len(c.proc.find_events("strategy_finished", instance_id=iid))
            mark = len(c.proc.events())  # events logged from here on follow the kill
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            motorlib.wait_for(lambda: len(c.proc.find_events("strategy_finished", instance_id=iid))
                              > done_before, 30, what="relaunch finished", interval=0.005)
            if not c.proc.find_events("strategy_finished", instance_id=iid)[-1].get("ok"):
                # counted, and this repetition's kills end: the instance is being rebuilt
                failed += 1
                print(f"[{pods} pods] kill {k + 1}: relaunch FAILED "
                      f"({c.proc.find_events('strategy_finished', instance_id=iid)[-1]})",
                      flush=True)
                break
            try:
                motorlib.wait_for(lambda: iid in coord.routable() and first_new(
                    c.proc.events(), mark, lambda e: e.get("event") == "coordinator_push" and
                    e.get("push") == "add" and e.get("instance_id") == iid), 10,
                    what="published again", interval=0.005)
            except TimeoutError:
                # with 0 s loads the instance may never have left `active` (no new add):
                # the "published" step is then counted missing below
                motorlib.wait_for(lambda: iid in coord.routable(), 10, what="still published")
            fin = c.proc.find_events("strategy_finished", instance_id=iid)[-1]
            if not fin.get("ok"):
                raise RuntimeError(f"relaunch failed: {fin}")
            ev = c.proc.events()

            def of(pred, ev=ev, mark=mark, iid=iid):
                e = first_new(ev, mark, lambda x: x.get("instance_id") == iid and pred(x))
                return None if e is None else (ts(e) - t_kill) * 1000

            steps = {
                "report": of(lambda e: e.get("event") == "fault_reported"),
                "dispatch": of(lambda e: e.get("event") == "strategy_phase" and
                               "polling" in (e.get("detail") or "")),
                # active again: the relaunch strategy's SUCCESS, i.e. every endpoint
                # heartbeated NORMAL after the restart and the instance is active (with 0 s
                # loads the instance may never have left `active` between two heartbeats)
                "active": of(lambda e: e.get("event") == "strategy_phase" and
                             e.get("phase") == "SUCCESS"),
                "published": of(lambda e: e.get("event") == "coordinator_push" and
                                e.get("push") == "add"),
            }
            if steps["active"] is None:
                raise RuntimeError("no strategy_phase SUCCESS logged after the kill "
                                   f"(strategy_finished: {fin})")
            for key, v in steps.items():
                if v is None:  # a step's log line missing: counted, not fatal
                    missing[key] = missing.get(key, 0) + 1
                else:
                    out[key].append(v)

            def f(key):
                return "—" if steps[key] is None else f"{steps[key]:.0f} ms"
            print(f"[{pods} pods] kill {k + 1}: report {f('report')}, dispatched {f('dispatch')}, "
                  f"active {f('active')}, published {f('published')}", flush=True)
            time.sleep(0.3)
        if missing:
            print(f"steps without a log line after some kills: {missing}", flush=True)
        out["missing"] = missing  # type: ignore[assignment]
        out["failed"] = failed  # type: ignore[assignment]
        return out
    finally:
        reg.close_all()
        coord.close()
        shutil.rmtree(tmp, ignore_errors=True)


G4 = "Death → instance active again, 4-pod instance"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=0, help="kills per repetition")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    kills = a.rounds or int(os.environ.get("BENCH_CTL_KILLS", "0")) or (6 if a.quick else 16)
    reps = [run_once(a.motor, kills) for _ in range(a.reps)]
    reps4 = [run_once(a.motor, kills, pods=4) for _ in range(a.reps)]
    work = "engine-sim (0 s load) SIGKILLed, controller + node manager"
    notes = [f"{kills} kills per repetition, dp=2 over 2 node managers; NM heartbeat 0.2 s, "
             "relaunch poll 0.2 s; times from the controller's log vs the kill's wall clock"]
    p50 = [plugin.pct(r["active"], 50) for r in reps]
    p99 = [plugin.pct(r["active"], 99) for r in reps]
    extra = {k: [plugin.pct(r[k], 50) if r[k] else None for r in reps]
             for k in ("report", "dispatch", "published")}
    extra["missing_log_lines"] = [r.get("missing", {}) for r in reps]
    extra["failed_relaunches"] = [r.get("failed", 0) for r in reps]
    plugin.emit(a, [
        plugin.row("ctl.death_to_active.p50", "Death → instance active again", work, "p50", "ms",
                   p50, notes=notes,
                   peer_name="upstream design: 5 s death poll + 5 s relaunch poll (not measured)",
                   extra={"p50_breakdown_ms": extra}),
        plugin.row("ctl.death_to_active.p99", "Death → instance active again", work, "p99", "ms",
                   p99),
        plugin.row("ctl.death_to_active_4pod.p50", G4,
                   work + " (dp=4 over 4 node managers)", "p50", "ms",
                   [plugin.pct(r["active"], 50) for r in reps4],
                   notes=[f"{kills} kills per repetition, one DP rank per node manager: every "
                          "kill relaunches the engines of all four pods"],
                   peer_name="the 2-pod row above (same settings)",
                   extra={"p50_breakdown_ms": {
                       k: [plugin.pct(r[k], 50) if r[k] else None for r in reps4]
                       for k in ("report", "dispatch", "published")},
                       "failed_relaunches": [r.get("failed", 0) for r in reps4]}),
        plugin.row("ctl.death_to_active_4pod.p99", G4,
                   work + " (dp=4 over 4 node managers)", "p99", "ms",
                   [plugin.pct(r["active"], 99) for r in reps4]),
    ])
    print("\n| step (median over kills) | " + " | ".join(f"rep {i + 1}" for i in range(len(reps)))
          + " |")
    print("| --- |" + " --- |" * len(reps))
    for k, name in (("report", "death → fault report"), ("dispatch", "→ restart dispatched"),
                    ("active", "→ instance active"), ("published", "→ published")):
        print(f"| {name} ms | " + " | ".join(f"{plugin.pct(r[k], 50):.0f}" if r[k] else "—"
                                             for r in reps) + " |")
    print("| active p99 ms | " + " | ".join(f"{v:.0f}" for v in p99) + " |")
    print("| 4 pods: active p50 / p99 ms | " + " | ".join(
        f"{plugin.pct(r['active'], 50):.0f} / {plugin.pct(r['active'], 99):.0f}" for r in reps4)
        + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
