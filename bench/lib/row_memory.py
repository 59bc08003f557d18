"""row_memory — what supervision itself costs: the supervisor's memory while it supervises
N engine simulators (default 16).

Each supervisor in turn starts the same N `motor engine-sim` commands; once all listen,
and after a settle time (health probes, first log lines), we read the memory of the
supervisor's own processes: the node manager; supervisord; s6-svscan + its N
s6-supervise; runsvdir + its N runsv. Three views: the sum of VmRSS (/proc/PID/status),
the distinct physical pages of the group (/proc/PID/pagemap: the group's RSS as if it
were one process) and the sum of Pss (/proc/PID/smaps_rollup). The engines themselves
are not counted.
"""

from __future__ import annotations

import time

from . import common as C
from . import supervisors as S
from .ctx import Ctx
from .report import Row
from .row_restart import ORDER, _render, workloads

GROUP = "Memory of the supervisor"
SETTLE_S = 2.0


def one_run(ctx: Ctx, who: str) -> dict:
    sess = C.Session(f"mem-{who}")
    try:
        template = workloads(ctx.motor)["engine-sim"][0]
        n = ctx.mem_engines
        base = C.free_port_run(n, 2)
        services = _render(template, base, n)
        if who == "motor":
            sup: S.Supervisor = S.MotorNM(sess, services, template, base, ctx.motor,
                                          tuned=False)
        else:
            sup = S.PEERS[who](sess, services)
        sup.start()
        found = sup.wait_services(timeout=30)
        # every engine listening = the supervisor has done its start-up work
        for i in range(n):
            C.wait_port(base + 2 * i, timeout=30)
        time.sleep(SETTLE_S)
        pids = sup.pids()
        m = C.mem_sum(pids)
        if m is None:
            raise RuntimeError("supervisor process vanished while measuring")
        if len(found) != n:
            raise RuntimeError(f"{len(found)} of {n} engines running")
        return m
    finally:
        S.stop_quietly(sess)


def run(ctx: Ctx) -> list[Row]:
    motor_why = S.MotorNM.available_in(ctx.motor)
    peers_ok = {p: S.PEERS[p].available() for p in S.PEERS}
    runs: dict[str, list[dict]] = {}
    errors: dict[str, str] = {}
    for rep in range(ctx.reps):
        order = ORDER[rep % len(ORDER):] + ORDER[:rep % len(ORDER)]
        for who in order:
            if (who == "motor" and motor_why) or (who != "motor" and peers_ok[who]) or \
                    who in errors:
                continue
            C.log(f"memory rep {rep + 1}/{ctx.reps}: {who} with {ctx.mem_engines} engines")
            try:
                m = one_run(ctx, who)
                runs.setdefault(who, []).append(m)
                C.log(f"  RSS {m['rss']} KiB  distinct {m['distinct']} KiB  PSS {m['pss']} KiB  "
                      f"({m['procs']} processes)")
            except Exception as e:
                errors[who] = f"{type(e).__name__}: {e}"
                C.log(f"  error: {errors[who]}")
    notes = [f"Memory: sum over the supervisor's own processes (not the engines) with "
             f"{ctx.mem_engines} `motor engine-sim` engines running, read {SETTLE_S:g} s after "
             f"all engines listen. Motor: the node manager with its default settings "
             f"(engine_type cmd, standalone, local restart policy). s6: s6-svscan + one "
             f"s6-supervise per engine; runit: runsvdir + one runsv per engine; supervisord: "
             f"one Python process. Sum of VmRSS counts a shared page once per process that "
             f"maps it; distinct pages (/proc/PID/pagemap frame numbers) counts it once for "
             f"the whole supervisor; PSS (smaps_rollup) splits it among all its users — "
             f"including the engines, which here run the same motor binary as the node "
             f"manager, so Motor's PSS is flattered by this workload."]
    rows = []
    workload = f"{ctx.mem_engines} × motor engine-sim"
    for metric, key in (("RSS (sum of VmRSS)", "rss"), ("RSS (distinct pages)", "distinct"),
                        ("PSS", "pss")):
        for peer in S.PEERS:
            m = C.summary(r[key] for r in runs.get("motor", []))
            p = C.summary(r[key] for r in runs.get(peer, []))
            row = Row(id=f"memory.{key}.{peer}", group=GROUP, workload=workload,
                      metric=metric, unit="KiB", motor=m, peer_name=S.PEERS[peer].label +
                      (" (+ s6-svscan)" if peer == "s6" else " (+ runsvdir)"
                       if peer == "runit" else ""),
                      peer=p, reps=min(m["n"] if m else 0, p["n"] if p else 0),
                      target="≤ 5 MiB" if key != "pss" else None, notes=notes,
                      extra={"motor_runs": runs.get("motor", []),
                             "peer_runs": runs.get(peer, [])})
            if m is None or p is None:
                row.status = "pending" if (motor_why or peers_ok[peer]) else "error"
                row.reason = motor_why or errors.get("motor") or peers_ok[peer] or \
                    errors.get(peer) or "no data"
                if key == "distinct" and runs.get("motor") and runs.get(peer):
                    row.status = "pending"
                    row.reason = "needs root: /proc/PID/pagemap hides frame numbers otherwise"
            rows.append(row)
    return rows
