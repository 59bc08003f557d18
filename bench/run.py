#!/usr/bin/python3
"""Motor's side-by-side benchmarks: one markdown table, bench/results.md and
bench/results.json. `make bench` runs this after installing the peers (s6, runit,
supervisor, nginx, wrk) and building the release binary.

Rows (each module under bench/lib/row_*.py):
  restart   death → replacement started: Motor's node manager vs s6, runit, supervisord
  memory    the supervisor's RSS/PSS with 16 engines: same peers
  mgmt_api  GET /node-manager/status under wrk vs nginx serving the same bytes
  gateway   coordinator vs nginx reverse proxy: added latency (motor-latprobe) and req/s
  plugins   rows from bench/nm_*.py, bench/ctl_*.py, bench/pool_*.py, bench/coord_*.py
            (see README.md)

Environment (all optional): BENCH_QUICK=1 (1 repetition, 100 kills, 3 s wrk runs),
BENCH_REPS, BENCH_KILLS, BENCH_SERVICES, BENCH_KILL_INTERVAL_MS, BENCH_MIN_AGE_MS,
BENCH_MEM_ENGINES, BENCH_WRK_SECONDS, BENCH_GW_SECONDS, BENCH_GW_REQUESTS, BENCH_GW_BATCH,
BENCH_WRK_THREADS, BENCH_WRK_CONNECTIONS, BENCH_ROWS=restart,memory,... (a subset),
MOTOR_BIN (default build/motor; motor-latprobe is taken from the same directory),
BENCH_OUT (directory for results.md/json, default bench/).
Exit status: 0 when the table was written (pending rows included), 1 when a row errored.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import common as C  # noqa: E402
from lib import report  # noqa: E402
from lib import supervisors as S  # noqa: E402
from lib import wrk  # noqa: E402
from lib.ctx import Ctx  # noqa: E402

ROWS = ["restart", "memory", "mgmt_api", "gateway", "plugins"]


def main() -> int:
    ctx = Ctx.from_env()
    unknown = ctx.rows - set(ROWS)
    if unknown and not all(r.startswith(("nm_", "ctl_", "pool_", "coord_")) for r in unknown):
        print(f"unknown BENCH_ROWS entries: {sorted(unknown)}; known: {ROWS}", file=sys.stderr)
        return 2
    if not os.access(ctx.motor, os.X_OK):
        print(f"motor binary not found: {ctx.motor} (make build, or set MOTOR_BIN)",
              file=sys.stderr)
        return 2
    # SIGTERM/SIGHUP: unwind through the rows' finally blocks like Ctrl-C does
    def interrupted(signo, _frame):
        raise KeyboardInterrupt(f"signal {signo}")
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    t0 = time.monotonic()
    load_start = os.getloadavg()
    C.log(f"motor: {ctx.motor}; mode {'quick' if ctx.quick else 'full'}, {ctx.reps} "
          f"repetition(s); commands: {', '.join(sorted(ctx.motor_cmds)) or 'none'}")
    from lib import procev
    why = procev.available()
    if why:
        C.log(f"proc connector unavailable ({why}); the restart row polls /proc")

    rows: list[report.Row] = []
    timings = {}
    for name in ROWS:
        from lib.row_plugins import PREFIXES
        if not ctx.want(name) and not (name == "plugins" and any(
                r.startswith(PREFIXES) for r in ctx.rows)):
            continue
        mod = __import__(f"lib.row_{name}", fromlist=["run"])
        t = time.monotonic()
        try:
            rows += mod.run(ctx)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # a row's own bug: report it, keep the others
            import traceback
            traceback.print_exc()
            rows.append(report.Row(id=name, group=name, workload="", metric="", unit="",
                                   status="error", reason=f"{type(e).__name__}: {e}"))
        timings[name] = round(time.monotonic() - t, 1)
        C.log(f"{name}: {timings[name]} s")

    versions = S.versions(ctx.motor)
    if wrk.nginx_version():
        versions["nginx"] = wrk.nginx_version()
    meta = {"host": report.host_info(), "versions": versions, "settings": ctx.settings(),
            "seconds": timings, "restart_method": None if not why else f"/proc polling ({why})",
            # the machine is shared: say how busy it was (1/5/15-minute load averages)
            "loadavg": {"start": [round(x, 2) for x in load_start],
                        "end": [round(x, 2) for x in os.getloadavg()]}}
    out = Path(os.environ.get("BENCH_OUT") or Path(__file__).resolve().parent)
    out.mkdir(parents=True, exist_ok=True)
    md = report.write(rows, str(out / "results.md"), str(out / "results.json"), meta)
    print(md)
    C.log(f"wrote {out / 'results.md'} and {out / 'results.json'} in "
          f"{time.monotonic() - t0:.0f} s")
    return 1 if any(r.status == "error" for r in rows) else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"\nbench interrupted ({e}); processes and temp dirs cleaned up", file=sys.stderr)
        sys.exit(130)
