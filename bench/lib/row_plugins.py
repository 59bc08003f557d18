"""row_plugins — rows measured by other components' bench scripts.

bench/nm_*.py, bench/ctl_*.py, bench/pool_*.py and bench/coord_*.py (written by the
node-manager, controller, worker-pool and coordinator work; only scripts carrying the
plug-in marker run, so coord_ab.py and coord_callgrind.py are not rows) are run one
after the other as
    /usr/bin/python3 bench/<name>.py --json <file>
with MOTOR_BIN, BENCH_QUICK, BENCH_REPS and BENCH_KILLS in the environment, and must
write the JSON document described in bench/README.md ("Plug-in contract"). Their rows
replace the placeholders below when the ids match; other ids are appended. A script that
fails, times out or writes no valid JSON turns its rows into "error" rows with the reason.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
from typing import Optional

from . import common as C
from .ctx import Ctx
from .report import Row, pending

PREFIXES = ("nm_", "ctl_", "pool_", "coord_")
TIMEOUT_S = {"quick": 120, "full": 300}

# (id, group, workload, metric, unit, better, target, who builds it)
PLACEHOLDERS = [
    ("nm.death_to_controller.p50", "Death → controller informed",
     "engine-sim SIGKILLed ≥ 100×, fake controller", "p50", "ms", "lower", None, "bench/nm_*.py"),
    ("nm.death_to_controller.p99", "Death → controller informed",
     "engine-sim SIGKILLed ≥ 100×, fake controller", "p99", "ms", "lower", "≤ 50 ms",
     "bench/nm_*.py"),
    ("nm.hung_detected.default", "Hung engine detected",
     "engine alive, stops answering (default probes)", "time to abnormal", "s", "lower", None,
     "bench/nm_*.py"),
    ("nm.hung_detected.tight", "Hung engine detected",
     "engine alive, stops answering (tight probes)", "time to abnormal", "s", "lower", None,
     "bench/nm_*.py"),
    ("ctl.death_to_active.p50", "Death → instance active again",
     "engine-sim (0 s load) SIGKILLed, controller + node manager", "p50", "ms", "lower", None,
     "bench/ctl_*.py"),
    ("ctl.death_to_active.p99", "Death → instance active again",
     "engine-sim (0 s load) SIGKILLed, controller + node manager", "p99", "ms", "lower", None,
     "bench/ctl_*.py"),
    ("ctl.scale.cpu", "Controller scale", "1000 simulated node managers, heartbeat 1/s",
     "controller CPU", "%", "lower", None, "bench/ctl_*.py"),
    ("ctl.scale.hb_p99", "Controller scale", "1000 simulated node managers, heartbeat 1/s",
     "heartbeat handling p99", "ms", "lower", None, "bench/ctl_*.py"),
    ("ctl.scale.rss", "Controller scale", "1000 simulated node managers, heartbeat 1/s",
     "controller RSS", "KiB", "lower", None, "bench/ctl_*.py"),
    ("pool.warm_invoke_added.p50", "Worker pool: warm invoke",
     "invoke through the pool vs the worker directly", "added p50", "ms", "lower", None,
     "bench/pool_*.py"),
    ("pool.warm_invoke_added.p99", "Worker pool: warm invoke",
     "invoke through the pool vs the worker directly", "added p99", "ms", "lower", "≤ 1 ms",
     "bench/pool_*.py"),
    ("pool.cold_start.p50", "Worker pool: cold start", "first call to a stopped worker",
     "time to first answer p50", "ms", "lower", None, "bench/pool_*.py"),
    ("coord.takeover.p50", "Coordinator takeover",
     "2 coordinators on etcd, master_lock_ttl 3 s, renewal and retry 1 s",
     "master SIGKILL → standby's first answer, median", "ms", "lower", None,
     "bench/coord_*.py"),
]


MARKER = "motor-bench-plugin: 1"


def scripts() -> list[str]:
    out = []
    for pre in PREFIXES:
        out += sorted(glob.glob(str(C.REPO / "bench" / f"{pre}*.py")))
    return out


def is_plugin(path: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return MARKER in f.read(65536)
    except OSError:
        return False


def _fig(v) -> Optional[dict]:
    if v is None:
        return None
    if isinstance(v, dict):
        if "median" not in v:
            raise ValueError("a figure object needs median (and min, max, n)")
        med = float(v["median"])
        return {"median": med, "min": float(v.get("min", med)), "max": float(v.get("max", med)),
                "n": int(v.get("n", 1)), "values": v.get("values", [])}
    if isinstance(v, (int, float)):
        return C.summary([v])
    if isinstance(v, list):
        return C.summary(v)
    raise ValueError(f"bad figure {v!r}")


def to_row(d: dict, source: str) -> Row:
    for k in ("id", "group", "metric"):
        if not isinstance(d.get(k), str) or not d[k]:
            raise ValueError(f"row without {k}")
    m, p = _fig(d.get("motor")), _fig(d.get("peer"))
    status = d.get("status", "ok")
    if status not in ("ok", "pending", "error"):
        raise ValueError(f"bad status {status!r}")
    notes = [str(n) for n in d.get("notes", [])] + [f"Measured by {source}."]
    reps = int(d.get("reps") or (m["n"] if m else 0))
    row = Row(id=d["id"], group=d["group"], workload=str(d.get("workload", "")),
              metric=d["metric"], unit=str(d.get("unit", "")),
              better=d.get("better", "lower"), motor=m,
              peer_name=d.get("peer_name"), peer=p, reps=reps, status=status,
              reason=str(d.get("reason", "")), target=d.get("target"), notes=notes,
              extra=d.get("extra", {}) if isinstance(d.get("extra", {}), dict) else {})
    if row.status == "ok" and m is None:
        row.status, row.reason = "error", "no Motor figure"
    return row


def run_script(ctx: Ctx, path: str) -> list[Row]:
    name = os.path.basename(path)
    out = C.Session("plugin")
    jpath = out.path("result.json")
    env = dict(os.environ, MOTOR_BIN=ctx.motor, BENCH_QUICK="1" if ctx.quick else "0",
               BENCH_REPS=str(ctx.reps), BENCH_KILLS=str(ctx.kills))
    timeout = TIMEOUT_S["quick" if ctx.quick else "full"]
    C.log(f"plug-in {name} (timeout {timeout}s)")
    try:
        p = subprocess.Popen(["/usr/bin/python3", path, "--json", jpath], cwd=str(C.REPO),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, text=True)
        try:
            so, se = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise RuntimeError(f"timed out after {timeout}s")
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # anything it left in its group
            except OSError:
                pass
        if p.returncode != 0:
            tail = (se or so).strip().splitlines()[-3:]
            raise RuntimeError(f"exit {p.returncode}: {' / '.join(tail)}")
        with open(jpath) as f:
            doc = json.load(f)
        rows = [to_row(d, f"bench/{name}") for d in doc.get("rows", [])]
        if not rows:
            raise RuntimeError("no rows in its JSON")
        return rows
    except Exception as e:
        return [Row(id=f"plugin.{name}", group=f"bench/{name}", workload="", metric="",
                    unit="", status="error", reason=f"{type(e).__name__}: {e}")]
    finally:
        out.close()


def run(ctx: Ctx) -> list[Row]:
    got: list[Row] = []
    not_yet: dict[str, list[str]] = {}  # prefix -> scripts without the marker
    for s in scripts():
        name = os.path.basename(s)[:-3]
        if ctx.rows and name not in ctx.rows and "plugins" not in ctx.rows:
            continue
        if not is_plugin(s):
            C.log(f"bench/{name}.py: no '# {MARKER}' marker, not run (bench/README.md)")
            not_yet.setdefault(name.split("_", 1)[0] + "_", []).append(f"bench/{name}.py")
            continue
        got += run_script(ctx, s)
    by_id = {r.id: r for r in got}
    rows = []
    for pid, group, wl, metric, unit, better, target, who in PLACEHOLDERS:
        if pid in by_id:
            rows.append(by_id.pop(pid))
        else:
            pre = who.split("/")[1].split("*")[0]
            why = f"waiting for a {who} plug-in"
            if not_yet.get(pre):
                why += (f" ({', '.join(not_yet[pre])} exists but does not follow the "
                        f"plug-in contract of bench/README.md yet)")
            r = pending(pid, group, wl, metric, unit, why, target=target)
            r.better = better
            rows.append(r)
    rows += list(by_id.values())
    return rows
