"""plugin — the small helper a bench/nm_*.py, bench/ctl_*.py or bench/pool_*.py script
uses to fold its numbers into `make bench` (contract: bench/README.md).

    import sys, pathlib
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from lib import plugin                     # motor-bench-plugin: 1

    args = plugin.args()                       # --json PATH, plus env: motor, quick, reps, kills
    p50s, p99s = [], []
    for rep in range(args.reps):
        lat = measure(args.motor, args.kills)  # your code
        p50s.append(plugin.pct(lat, 50)); p99s.append(plugin.pct(lat, 99))
    plugin.emit(args, [
        plugin.row("nm.death_to_controller.p50", "Death → controller informed",
                   "engine-sim SIGKILLed 100×, fake controller", "p50", "ms", p50s),
        plugin.row("nm.death_to_controller.p99", "Death → controller informed",
                   "engine-sim SIGKILLed 100×, fake controller", "p99", "ms", p99s,
                   target="≤ 50 ms", peer_name="upstream: 5 s poll", peer=[2500.0]),
    ])

Standard library only; importing it has no side effects.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Optional

from .common import percentile as pct  # re-exported for plug-ins

__all__ = ["Args", "args", "row", "emit", "pct"]


class Args(argparse.Namespace):
    json: Optional[str]
    motor: str
    quick: bool
    reps: int
    kills: int


def args(extra: Optional[argparse.ArgumentParser] = None) -> Args:
    """Parse --json PATH (and a script's own options when it passes its parser) and read
    the bench environment. Without --json the script may print a human-readable table."""
    ap = extra or argparse.ArgumentParser()
    ap.add_argument("--json", metavar="PATH", help="write the bench rows (plug-in contract)")
    ns = ap.parse_args(namespace=Args())
    from .common import motor_bin, env_flag, env_int
    if not getattr(ns, "motor", None):
        ns.motor = os.path.abspath(motor_bin())
    ns.quick = env_flag("BENCH_QUICK")
    ns.reps = env_int("BENCH_REPS", 1 if ns.quick else 3)
    ns.kills = env_int("BENCH_KILLS", 100 if ns.quick else 200)
    return ns


def row(id: str, group: str, workload: str, metric: str, unit: str, motor: Any,
        better: str = "lower", peer_name: Optional[str] = None, peer: Any = None,
        target: Optional[str] = None, notes: Optional[list[str]] = None,
        status: str = "ok", reason: str = "", extra: Optional[dict] = None) -> dict:
    """One row. motor/peer: a list with one figure per repetition, a single number, or
    {"median", "min", "max", "n"}."""
    d = {"id": id, "group": group, "workload": workload, "metric": metric, "unit": unit,
         "better": better, "motor": motor, "peer_name": peer_name, "peer": peer,
         "target": target, "notes": notes or [], "status": status, "reason": reason,
         "extra": extra or {}}
    return d


def emit(a: Args, rows: list[dict]) -> None:
    """Write the rows to --json PATH (atomically); no-op without --json."""
    if not a.json:
        return
    tmp = a.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    os.replace(tmp, a.json)
