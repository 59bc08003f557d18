"""row_restart — Death → replacement started.

The same N commands run under each supervisor in turn (Motor's node manager with the
local restart policy, s6-supervise, runsv, supervisord); each run SIGKILLs `kills`
processes and times every replacement (lib/restart.py). Two workloads: the engine
simulator (`motor engine-sim --port P --load-seconds 0`) and /bin/sleep. Figures per run:
p50 and p99 over the kills; the table shows the median (min–max) of those over the
repetitions. Motor is also run once per repetition with its shipped backoff (1 s), every
service killed once, to show what the default configuration does.
"""

from __future__ import annotations

from typing import Optional

from . import common as C
from . import supervisors as S
from .ctx import Ctx
from .report import Row, pending

GROUP = "Death → replacement started"
LONE_GROUP = "Death → replacement, one death at a time"
LONE_GAP_S = 0.1
LONE_SERVICES = 4
ORDER = ["motor", "s6", "runit", "supervisord"]


def workloads(motor: str) -> dict[str, tuple[list[str], str]]:
    return {
        "engine-sim": ([motor, "engine-sim", "--port", "{port}", "--load-seconds", "0",
                        "--log-level", "warn"], "motor engine-sim --load-seconds 0"),
        "sleep": (["/bin/sleep", "9{port}"], "/bin/sleep"),
    }


def _render(template: list[str], base: int, n: int) -> list[list[str]]:
    return [[a.replace("{port}", str(base + 2 * i)) for a in template] for i in range(n)]


def tuned_backoff(ctx: Ctx) -> tuple[float, Optional[str]]:
    """The smallest restart backoff the node manager accepts: 0 when it does, else 0.01
    (the documented minimum) — with the reason for the notes."""
    sess = C.Session("nmcheck")
    try:
        for b in (0.0, 0.001, 0.01):
            nm = S.MotorNM(sess, [["/bin/true"]], ["/bin/true"], 30000, ctx.motor,
                           tuned=True, backoff_sec=b)
            err = nm.check_config()
            if err is None:
                return b, None if b == 0 else \
                    f"the node manager rejects restart_backoff_initial_sec below {b:g} s"
        return 0.01, "the node manager rejected every tuned backoff tried"
    finally:
        sess.close()


def one_run(ctx: Ctx, who: str, template: list[str], n_services: int, n_kills: int,
            tuned: bool = True, backoff: float = 0.0, lone: bool = False) -> dict:
    sess = C.Session(f"restart-{who}")
    try:
        base = C.free_port_run(n_services, 2)
        services = _render(template, base, n_services)
        if who == "motor":
            sup: S.Supervisor = S.MotorNM(sess, services, template, base, ctx.motor,
                                          tuned=tuned, backoff_sec=backoff)
        else:
            sup = S.PEERS[who](sess, services)
        sup.start()
        found = sup.wait_services(timeout=30)
        from . import restart
        if lone:
            res = restart.kill_loop(found, n_kills, interval=LONE_GAP_S, min_age=ctx.min_age,
                                    max_inflight=1)
        else:
            res = restart.kill_loop(found, n_kills, interval=ctx.interval, min_age=ctx.min_age)
        lat = res.latencies("exec")
        if not lat:
            raise RuntimeError("no replacement observed")
        return {"p50": C.percentile(lat, 50), "p99": C.percentile(lat, 99),
                "max": max(lat), "n": len(lat), "lost": res.lost, "method": res.method,
                "fork_p50": C.percentile(forks, 50) if (forks := res.latencies("fork"))
                else None,
                "overruns": res.overruns}
    finally:
        S.stop_quietly(sess)


def run(ctx: Ctx) -> list[Row]:
    wls = workloads(ctx.motor)
    peers_ok = {p: S.PEERS[p].available() for p in S.PEERS}
    motor_why = S.MotorNM.available_in(ctx.motor)
    backoff, backoff_note = (0.01, None)
    if motor_why is None:
        backoff, backoff_note = tuned_backoff(ctx)
    runs: dict[tuple[str, str], list[dict]] = {}
    errors: dict[tuple[str, str], str] = {}
    method = ""
    for rep in range(ctx.reps):
        # rotate the order so slow drift of the machine does not favour anyone
        order = ORDER[rep % len(ORDER):] + ORDER[:rep % len(ORDER)]
        for wl, (template, _) in wls.items():
            for who in order:
                if who == "motor" and motor_why:
                    continue
                if who != "motor" and peers_ok[who]:
                    continue
                key = (wl, who)
                if key in errors:
                    continue
                C.log(f"restart rep {rep + 1}/{ctx.reps}: {who}, {wl}, "
                      f"{ctx.kills} kills over {ctx.services} processes")
                try:
                    r = one_run(ctx, who, template, ctx.services, ctx.kills, True, backoff)
                    method = r["method"]
                    runs.setdefault(key, []).append(r)
                    C.log(f"  p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms  lost {r['lost']}")
                except Exception as e:  # one broken supervisor must not sink the others
                    errors[key] = f"{type(e).__name__}: {e}"
                    C.log(f"  error: {errors[key]}")
            if motor_why is None and (wl, "motor-default") not in errors:
                # shipped backoff: kill every service once (a second kill would meet the
                # doubled backoff)
                n = min(ctx.services, 16)
                C.log(f"restart rep {rep + 1}/{ctx.reps}: motor (default backoff), {wl}, "
                      f"{n} kills")
                try:
                    r = one_run(ctx, "motor", template, n, n, tuned=False)
                    runs.setdefault((wl, "motor-default"), []).append(r)
                    C.log(f"  p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms")
                except Exception as e:
                    errors[(wl, "motor-default")] = f"{type(e).__name__}: {e}"
                    C.log(f"  error: {errors[(wl, 'motor-default')]}")
        if ctx.lone_kills > 0:
            template = wls["sleep"][0]
            for who in order:
                if (who == "motor" and motor_why) or (who != "motor" and peers_ok[who]) or \
                        ("lone", who) in errors:
                    continue
                C.log(f"restart rep {rep + 1}/{ctx.reps}: {who}, sleep, {ctx.lone_kills} lone "
                      f"deaths")
                try:
                    r = one_run(ctx, who, template, LONE_SERVICES, ctx.lone_kills, True,
                                backoff, lone=True)
                    runs.setdefault(("lone", who), []).append(r)
                    C.log(f"  p50 {r['p50']:.2f} ms  max {r['max']:.2f} ms")
                except Exception as e:
                    errors[("lone", who)] = f"{type(e).__name__}: {e}"
                    C.log(f"  error: {errors[('lone', who)]}")

    notes_common = [
        f"Kill → replacement: time from kill(2) to the exec of a new process with the "
        f"victim's exact command line, taken from {method or 'the proc connector'}. "
        f"{ctx.kills} SIGKILLs per run, round robin over {ctx.services} supervised processes, "
        f"one kill every {ctx.interval * 1e3:g} ms, never a process younger than "
        f"{ctx.min_age * 1e3:g} ms (runsv holds back the restart of a service that ran "
        f"< 1 s); the same pacing for every supervisor.",
        "Peers as shipped by Debian 12: s6 2.11 (s6-svscan + s6-supervise, run script "
        "`#!/bin/sh` + exec), runit (runsvdir + runsv, same run script), supervisord "
        "(autorestart=true, startsecs=0). s6-supervise 2.11 restarts a service 1 s after "
        "each death whatever its age (measured; we found no setting to shorten it). "
        "supervisord restarts a program on a later pass of its main loop; with many deaths "
        "in flight that pass comes sooner than for a lone death (see the one-at-a-time rows).",
    ]
    tuned_note = (f"Motor tuned: restart_policy local, standalone, restart_backoff_initial_sec "
                  f"= restart_backoff_max_sec = {backoff:g} s, restart_start_limit 0, "
                  f"engine_type cmd with the same argv as the peers.")
    if backoff_note:
        tuned_note += f" Not 0 because {backoff_note}: every Motor restart waits that long."
    elif backoff == 0:
        tuned_note += (" Backoff 0 = restart at once: the node manager arms its restart "
                       "timer with its 1 ms floor (nm_backoff_next).")
    default_note = ("Motor default: the shipped local-policy backoff (restart_backoff_initial_sec"
                    " 1 s, doubling to 60 s); each service killed once per run.")

    rows: list[Row] = []
    for wl, (_, wl_label) in wls.items():
        workload = f"{wl_label}"
        for peer in S.PEERS:
            peer_label = S.PEERS[peer].label
            for metric in ("p50", "p99"):
                rid = f"restart.{wl}.{peer}.{metric}"
                why = motor_why or errors.get((wl, "motor")) or peers_ok[peer] or \
                    errors.get((wl, peer))
                m = C.summary(r[metric] for r in runs.get((wl, "motor"), []))
                p = C.summary(r[metric] for r in runs.get((wl, peer), []))
                row = Row(id=rid, group=GROUP + " (Motor tuned)", workload=workload,
                          metric=metric, unit="ms", motor=m, peer_name=peer_label, peer=p,
                          reps=min(m["n"] if m else 0, p["n"] if p else 0),
                          notes=notes_common + [tuned_note],
                          target="Motor ≤ s6" if peer == "s6" else None,
                          extra={"motor_runs": runs.get((wl, "motor"), []),
                                 "peer_runs": runs.get((wl, peer), [])})
                if m is None or p is None:
                    row.status = "pending" if (motor_why or peers_ok[peer]) else "error"
                    row.reason = why or "no data"
                rows.append(row)
        for metric in ("p50", "p99"):
            m = C.summary(r[metric] for r in runs.get((wl, "motor-default"), []))
            p = C.summary(r[metric] for r in runs.get((wl, "s6"), []))
            row = Row(id=f"restart.{wl}.default.s6.{metric}",
                      group=GROUP + " (Motor default backoff)", workload=workload,
                      metric=metric, unit="ms", motor=m, peer_name=S.S6.label, peer=p,
                      reps=min(m["n"] if m else 0, p["n"] if p else 0),
                      notes=notes_common + [default_note],
                      extra={"motor_runs": runs.get((wl, "motor-default"), [])})
            if m is None or p is None:
                row.status = "pending" if (motor_why or peers_ok["s6"]) else "error"
                row.reason = motor_why or errors.get((wl, "motor-default")) or \
                    peers_ok["s6"] or errors.get((wl, "s6")) or "no data"
            rows.append(row)
    if ctx.lone_kills > 0:
        lone_note = (f"One death at a time: {ctx.lone_kills} SIGKILLs per run over "
                     f"{LONE_SERVICES} /bin/sleep services, the next kill {LONE_GAP_S * 1e3:g} ms "
                     f"after the previous replacement exec'd (nothing else happening: a "
                     f"single crash on a quiet host). Motor tuned as above.")
        for peer in S.PEERS:
            m = C.summary(r["p50"] for r in runs.get(("lone", "motor"), []))
            p = C.summary(r["p50"] for r in runs.get(("lone", peer), []))
            row = Row(id=f"restart.lone.{peer}.p50", group=LONE_GROUP, workload="/bin/sleep",
                      metric="p50", unit="ms", motor=m, peer_name=S.PEERS[peer].label, peer=p,
                      reps=min(m["n"] if m else 0, p["n"] if p else 0),
                      notes=[notes_common[0], lone_note],
                      extra={"motor_runs": runs.get(("lone", "motor"), []),
                             "peer_runs": runs.get(("lone", peer), [])})
            if m is None or p is None:
                row.status = "pending" if (motor_why or peers_ok[peer]) else "error"
                row.reason = motor_why or errors.get(("lone", "motor")) or peers_ok[peer] or \
                    errors.get(("lone", peer)) or "no data"
            rows.append(row)
    return rows


def placeholder(reason: str) -> list[Row]:
    return [pending("restart", GROUP, "engine-sim / sleep", "p50, p99", "ms", reason)]
