#!/usr/bin/env python3
"""Hung engine detected: an engine that stops answering but stays alive, time until it is
marked `abnormal` — Motor's node manager with its default and with tight probe settings,
next to monit's HTTP check (the measured peer) and supervisord (no health check).

Motor: a fresh `motor node-manager` (restart_policy controller, fake Controller from
tests/integration/fake_controller.py) with one `motor engine-sim` engine (0 s load) per
sample. After the endpoint is `normal` and a random pause (so the hang falls anywhere in
the probe period), POST /sim/fault {"mode":"hang"} freezes the engine's only thread (the
kernel still accepts connections; nothing answers). Time = from the fault's answer to the
first GET /node-manager/engines (polled every 10 ms) showing the endpoint `abnormal`.
  default: health_collector_timeout 5 s, 3 attempts, heartbeat 3 s (probe every 1 s);
           the attempts overlap (one per period), so ≈ 5 + 2 × 1 s after the hang's first
           unanswered probe
  tight:   health_collector_timeout 1 s, 1 attempt, heartbeat 0.2 s (probe every 0.2 s)

Peers:
  monit 5.33 (`set daemon 1`, its shortest cycle; `if failed port P protocol http request
  /health with timeout 1 seconds then exec` a script that POSTs to a fake Controller): time
  from the hang to that POST's arrival. Same engine, same random pause. Compared with the
  tight row; monit's own defaults (a cycle of 30–120 s in its shipped configs, 5 s
  timeout) would be far slower.
  supervisord 4.2.5 (no health check): the same hang is held as long as Motor's slowest
  default detection (+1 s); the bench checks the engine still does not answer, the
  process is the same pid and supervisord still reports it RUNNING — "not detected".

usage: bench/nm_hung_detect.py [--json PATH] [--samples N]   (motor-bench-plugin: 1)
Standard library only; 127.0.0.1 only; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1
from lib import common as C  # noqa: E402
from lib import supervisors as S  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json  # noqa: E402

GROUP = "Hung engine detected"
SETTINGS = {
    "default": {"basic": {"heartbeat_interval_seconds": 3, "daemon_loop_interval": 5},
                "health": {"health_collector_timeout": 5,
                           "health_collector_timeout_retry_attempts": 3,
                           "startup_timeout": 1800},
                "period": 1.0},
    "tight": {"basic": {"heartbeat_interval_seconds": 0.2, "daemon_loop_interval": 5},
              "health": {"health_collector_timeout": 1,
                         "health_collector_timeout_retry_attempts": 1,
                         "startup_timeout": 1800},
              "period": 0.2},
}
RNG = random.Random(8)


def hang(port: int) -> float:
    """Freeze the engine; the monotonic time its answer arrived (the hang starts as the
    fault request's connection closes, within a millisecond)."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/sim/fault",
                                 data=json.dumps({"mode": "hang"}).encode(),
                                 headers={"Content-Type": "application/json",
                                          "Connection": "close"}, method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError(f"/sim/fault: HTTP {r.status}")
    return time.monotonic()


def health_answers(port: int, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


def motor_sample(motor: str, mode: str) -> float:
    """One hang under a fresh node manager; seconds to `abnormal`."""
    os.environ["MOTOR_BIN"] = motor
    st = SETTINGS[mode]
    tmp = tempfile.mkdtemp(prefix="motor-bench-hung-")
    procs = motorlib.ProcRegistry(tmp)
    ctl = FakeController()
    try:
        cfg = nm_config(controller_port=ctl.port, endpoints=1,
                        engine_config={"load_seconds": 0}, basic=st["basic"],
                        health=st["health"], ft={"engine_restart_wait_timeout_sec": 600})
        nm = start_nm(procs, write_json(os.path.join(tmp, "c.json"), cfg))
        ctl.wait_request("/controller/register", timeout=10)
        r = nm.post("/node-manager/start", start_body(cfg, instance_id=1), timeout=30)
        if r.status != 200:
            raise RuntimeError(f"start: {r}")
        nm.wait_ready(timeout=30)
        port = int(nm.endpoint(0)["port"])
        time.sleep(0.5 + RNG.uniform(0, st["period"]))
        t0 = hang(port)
        deadline = t0 + 60
        while True:
            ep = nm.endpoint(0)
            if ep["status"] == "abnormal":
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}: endpoint not abnormal after 60 s: {ep}")
            time.sleep(0.01)
    finally:
        ctl.close()
        procs.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def monit_available() -> str | None:
    return None if C.which("monit") else "monit not installed (apt-get install monit)"


def monit_run(motor: str, samples: int) -> list[float]:
    """monit with a 1 s cycle and a 1 s HTTP check of one engine; seconds from each hang
    to monit's report at the fake Controller."""
    sess = C.Session("hung-monit")
    ctl = FakeController()
    out: list[float] = []
    try:
        port = C.free_port_run(1, 2)
        argv = [motor, "engine-sim", "--port", str(port), "--load-seconds", "0",
                "--log-level", "warn"]
        sess.track_cmdline(argv)
        script = sess.path("report.sh")
        with open(script, "w") as f:
            f.write("#!/bin/sh\nexec /usr/bin/curl -s -o /dev/null -X POST "
                    "-H 'Content-Type: application/json' --data "
                    "'{\"fault_type\":\"EngineHungError\",\"additional_info\":"
                    "{\"source\":\"monit\"}}' "
                    f"http://127.0.0.1:{ctl.port}/controller/report_software_fault\n")
        os.chmod(script, 0o755)
        rc = sess.path("monitrc")
        with open(rc, "w") as f:
            f.write("\n".join([
                "set daemon 1", f"set logfile {sess.tmp}/monit.log",
                f"set pidfile {sess.tmp}/monit.pid", f"set idfile {sess.tmp}/monit.id",
                f"set statefile {sess.tmp}/monit.state",
                "check host engine with address 127.0.0.1",
                f"  if failed port {port} protocol http request \"/health\" "
                f"with timeout 1 seconds then exec \"{script}\"", ""]))
        os.chmod(rc, 0o600)
        r = subprocess.run([C.which("monit"), "-t", "-c", rc], capture_output=True, text=True,
                           timeout=10)
        if r.returncode != 0:
            raise RuntimeError(f"monit -t: {(r.stderr or r.stdout).strip()}")
        eng = sess.start(argv, "engine0.log")
        C.wait_port(port, timeout=15, proc=eng)
        mon = sess.start([C.which("monit"), "-I", "-c", rc], "monit.out")
        time.sleep(1.5)  # monit's first cycle
        for k in range(samples):
            time.sleep(0.5 + RNG.uniform(0, 1.0))  # any phase of monit's 1 s cycle
            if mon.poll() is not None:
                raise RuntimeError(f"monit exited: {open(sess.path('monit.out')).read()[-300:]}")
            before = ctl.count("/controller/report_software_fault")
            t0 = hang(port)
            rec = ctl.wait_request("/controller/report_software_fault", timeout=30,
                                   after=before)
            out.append(rec.t - t0)
            # a fresh engine on the same port; wait until monit saw it answer again
            eng.kill()
            eng.wait(10)
            lines = len(open(sess.path("monit.log"), errors="replace").read().splitlines())
            eng = sess.start(argv, f"engine{k + 1}.log")
            C.wait_port(port, timeout=15, proc=eng)
            C.wait_for(lambda: any("succeeded" in ln for ln in open(
                sess.path("monit.log"), errors="replace").read().splitlines()[lines:]), 15,
                "monit sees the engine again", 0.05)
        return out
    finally:
        ctl.close()
        sess.close()


def supervisord_check(motor: str, hold_s: float) -> dict:
    """Hang an engine under supervisord and hold it hold_s seconds: still the same pid,
    still RUNNING, still not answering?"""
    sess = C.Session("hung-sv")
    try:
        port = C.free_port_run(1, 2)
        argv = [motor, "engine-sim", "--port", str(port), "--load-seconds", "0",
                "--log-level", "warn"]
        sv = S.Supervisord(sess, [argv])
        sv.start()
        pid = list(sv.wait_services(timeout=30).values())[0]
        C.wait_port(port, timeout=15, proc=sv.proc)
        time.sleep(0.5)
        t0 = hang(port)
        time.sleep(max(0.0, t0 + hold_s - time.monotonic()))
        held = time.monotonic() - t0
        st = subprocess.run([C.which("supervisorctl"), "-c", sess.path("supervisord.conf"),
                             "status", "svc0"], capture_output=True, text=True, timeout=10)
        state = (st.stdout.split() + ["?", "?"])[1]
        res = {"held_s": round(held, 2), "same_pid": C.pid_alive(pid) and
               C.read_cmdline(pid) == C.cmdline_bytes(argv),
               "supervisord_state": state, "health_answers": health_answers(port, 1.0)}
        res["detected"] = not (res["same_pid"] and state == "RUNNING") or res["health_answers"]
        return res
    finally:
        S.stop_quietly(sess)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=0,
                    help="hangs per repetition for tight Motor and monit (default 5, 3 quick)")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    samples = a.samples or C.env_int("BENCH_HANG_SAMPLES", 3 if a.quick else 5)
    # The default probes take ~8 s a hang: fewer of them, so the plug-in fits its time.
    dsamples = 3 if a.quick else 2
    res: dict[str, list[list[float]]] = {"default": [], "tight": [], "monit": []}
    monit_why = monit_available()
    for rep in range(a.reps):
        C.log(f"hung rep {rep + 1}/{a.reps}: motor default probes, {dsamples} hangs")
        res["default"].append([motor_sample(a.motor, "default") for _ in range(dsamples)])
        C.log("  " + ", ".join(f"{x:.2f}" for x in res["default"][-1]) + " s")
        C.log(f"hung rep {rep + 1}/{a.reps}: motor tight probes, {samples} hangs")
        res["tight"].append([motor_sample(a.motor, "tight") for _ in range(samples)])
        C.log("  " + ", ".join(f"{x:.2f}" for x in res["tight"][-1]) + " s")
        if monit_why is None:
            C.log(f"hung rep {rep + 1}/{a.reps}: monit (1 s cycle, 1 s timeout), "
                  f"{samples} hangs")
            try:
                res["monit"].append(monit_run(a.motor, samples))
                C.log("  " + ", ".join(f"{x:.2f}" for x in res["monit"][-1]) + " s")
            except Exception as e:  # the peer failing must not hide Motor's figures
                monit_why = f"monit run failed: {type(e).__name__}: {e}"
                res["monit"].clear()
                C.log(f"  {monit_why}")
    sv = None
    sv_why = S.Supervisord.available()
    if sv_why is None:
        hold = max(x for r in res["default"] for x in r) + 1.0
        C.log(f"hung: supervisord, one hang held {hold:.1f} s")
        try:
            sv = supervisord_check(a.motor, hold)
            C.log(f"  {sv}")
        except Exception as e:
            sv_why = f"supervisord check failed: {type(e).__name__}: {e}"
            C.log(f"  {sv_why}")

    med = [plugin.pct(r, 50) for r in res["tight"]]
    mon = [plugin.pct(r, 50) for r in res["monit"]] or None
    if sv is None:
        sv_name = None
    elif not sv["detected"]:
        sv_name = (f"supervisord (no health check): not detected — still RUNNING, same pid, "
                   f"not answering after {sv['held_s']:.1f} s")
    else:
        sv_name = f"supervisord: unexpected result {sv}"
    notes_common = (
        "Hang: POST /sim/fault {\"mode\":\"hang\"} freezes the engine simulator's only thread "
        "(process alive, connections accepted, nothing answered); time from the fault's "
        "answer to GET /node-manager/engines (polled every 10 ms) showing the endpoint "
        "`abnormal`. A fresh node manager (controller policy, fake controller) with one "
        "engine (0 s load) per hang, hung at a random point of the probe period.")
    rows = [
        plugin.row("nm.hung_detected.default", GROUP,
                   "engine alive, stops answering (default probes)", "time to abnormal", "s",
                   [plugin.pct(r, 50) for r in res["default"]], peer_name=sv_name, peer=None,
                   target="≈ 7 s + the hang's phase in the 1 s period (upstream, attempts "
                   "back to back: 15.3 s)",
                   notes=[notes_common,
                          "Default probes: health_collector_timeout 5 s, 3 attempts "
                          "(timeouts retried), probe every min(1 s, heartbeat 3 s); the "
                          "attempts overlap — a new probe every period while earlier ones "
                          "are outstanding — so a hang is found after timeout + 2 periods "
                          "= 7 s from the first unanswered probe, plus where in the period "
                          "the hang fell (0–1 s). Figure per repetition = median of "
                          f"{dsamples} hangs. Peer: supervisord has no health check; the same "
                          "hang under it was held as long as Motor's slowest default "
                          "detection + 1 s and checked with supervisorctl status."],
                   extra={"supervisord": sv, "supervisord_unavailable": sv_why}),
        plugin.row("nm.hung_detected.tight", GROUP,
                   "engine alive, stops answering (tight probes)", "time to abnormal", "s",
                   med, peer_name="monit 5.33 HTTP check, 1 s cycle, 1 s timeout" if mon
                   else None, peer=mon,
                   notes=[f"Tight probes: health_collector_timeout 1 s (its minimum), 1 "
                          f"attempt, heartbeat 0.2 s (probe every 0.2 s); figure per "
                          f"repetition = median of {samples} hangs. Peer: monit 5.33, `set "
                          f"daemon 1` (shortest cycle), `if failed port P protocol http "
                          f"request /health with timeout 1 seconds then exec` a curl POST "
                          f"to a fake controller; time from the hang to that POST's "
                          f"arrival; median of {samples} hangs per repetition, a random "
                          f"phase of its cycle each."
                          + (f" monit not run: {monit_why}." if monit_why else "")],
                   extra={"motor_samples_s": res["tight"], "monit_samples_s": res["monit"]}),
    ]
    plugin.emit(a, rows)
    print("\n### hung engine → abnormal (s)\n")
    for k, v in res.items():
        print(f"| {k} | " + " | ".join(", ".join(f"{x:.2f}" for x in r) for r in v) + " |")
    print(f"\nsupervisord: {sv or sv_why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
