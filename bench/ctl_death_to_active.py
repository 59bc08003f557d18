#!/usr/bin/env python3
"""Controller: engine SIGKILL -> instance active again (EngineRelaunchStrategy, §7.2).

One `motor controller`, two `motor node-manager`s hosting one DP rank each of a dp=2
instance, `motor engine-sim` engines with 0 s load time, a fake coordinator. Each round
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


def first_after(events: list[dict], t: float) -> float | None:
    for e in events:
        if ts(e) >= t:
            return ts(e)
    return None


def run_once(motor: str, kills: int) -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-ctl-d2a-")
    reg = motorlib.ProcRegistry(tmp)
    coord = FakeCoordinator()
    out: dict[str, list[float]] = {"report": [], "dispatch": [], "active": [], "published": []}
    try:
        cfg = controller_config(tmp, coord.port, ft={"engine_relaunch_poll_interval_sec": 0.2})
        c = Controller(reg, cfg)
        rpc = motorlib.free_port()
        nms = [sim_nm(reg, tmp, c.port, "bench-d2a", dp=2, rpc_port=rpc, name=f"nm{i}",
                      load_seconds=0.0) for i in range(2)]
        motorlib.wait_for(lambda: any(i["status"] == "active" for i in c.instances()), 30,
                          what="instance active")
        iid = c.instances()[0]["id"]
        motorlib.wait_for(lambda: iid in coord.routable(), 10, what="published")
        for k in range(kills):
            rank = k % 2
            nm = [n for n in nms if rank in engine_pids(n)][0]
            pid = engine_pids(nm)[rank]
            done_before = len(c.proc.find_events("strategy_finished", instance_id=iid))
            t_kill = time.time()
            os.kill(pid, signal.SIGKILL)
            motorlib.wait_for(lambda: len(c.proc.find_events("strategy_finished", instance_id=iid))
                              > done_before, 30, what="relaunch finished", interval=0.005)
            motorlib.wait_for(lambda: iid in coord.routable() and
                              first_after(c.proc.find_events("coordinator_push", push="add",
                                                             instance_id=iid), t_kill), 10,
                              what="published again", interval=0.005)
            fin = c.proc.find_events("strategy_finished", instance_id=iid)[-1]
            if not fin.get("ok"):
                raise RuntimeError(f"relaunch failed: {fin}")
            ev = c.proc.events()
            rep = first_after([e for e in ev if e.get("event") == "fault_reported"
                               and e.get("instance_id") == iid], t_kill)
            dis = [e for e in ev if e.get("event") == "strategy_phase" and
                   e.get("instance_id") == iid and "polling" in (e.get("detail") or "")]
            # active again: the relaunch strategy's SUCCESS, i.e. every endpoint heartbeated
            # NORMAL after the restart and the instance is active (with 0 s loads the
            # instance may never have left `active` between two heartbeats)
            act = first_after([e for e in ev if e.get("event") == "strategy_phase" and
                               e.get("instance_id") == iid and e.get("phase") == "SUCCESS"],
                              t_kill)
            pub = first_after([e for e in ev if e.get("event") == "coordinator_push" and
                               e.get("push") == "add" and e.get("instance_id") == iid], t_kill)
            out["report"].append((rep - t_kill) * 1000)
            out["dispatch"].append((first_after(dis, t_kill) - t_kill) * 1000)
            out["active"].append((act - t_kill) * 1000)
            out["published"].append((pub - t_kill) * 1000)
            print(f"kill {k + 1}: report {out['report'][-1]:.0f} ms, dispatched "
                  f"{out['dispatch'][-1]:.0f} ms, active {out['active'][-1]:.0f} ms, "
                  f"published {out['published'][-1]:.0f} ms", flush=True)
            time.sleep(0.3)
        return out
    finally:
        reg.close_all()
        coord.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=0, help="kills per repetition")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    kills = a.rounds or int(os.environ.get("BENCH_CTL_KILLS", "0")) or (6 if a.quick else 16)
    reps = [run_once(a.motor, kills) for _ in range(a.reps)]
    work = "engine-sim (0 s load) SIGKILLed, controller + node manager"
    notes = [f"{kills} kills per repetition, dp=2 over 2 node managers; NM heartbeat 0.2 s, "
             "relaunch poll 0.2 s; times from the controller's log vs the kill's wall clock"]
    p50 = [plugin.pct(r["active"], 50) for r in reps]
    p99 = [plugin.pct(r["active"], 99) for r in reps]
    extra = {k: [plugin.pct(r[k], 50) for r in reps] for k in ("report", "dispatch", "published")}
    plugin.emit(a, [
        plugin.row("ctl.death_to_active.p50", "Death → instance active again", work, "p50", "ms",
                   p50, notes=notes, peer_name="upstream: 5 s death poll + 5 s relaunch poll",
                   extra={"p50_breakdown_ms": extra}),
        plugin.row("ctl.death_to_active.p99", "Death → instance active again", work, "p99", "ms",
                   p99),
    ])
    print("\n| step (median over kills) | " + " | ".join(f"rep {i + 1}" for i in range(len(reps)))
          + " |")
    print("| --- |" + " --- |" * len(reps))
    for k, name in (("report", "death → fault report"), ("dispatch", "→ restart dispatched"),
                    ("active", "→ instance active"), ("published", "→ published")):
        print(f"| {name} ms | " + " | ".join(f"{plugin.pct(r[k], 50):.0f}" for r in reps) + " |")
    print("| active p99 ms | " + " | ".join(f"{v:.0f}" for v in p99) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
