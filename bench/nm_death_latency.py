#!/usr/bin/env python3
"""Engine death -> Controller informed: Motor's node manager next to supervisord's event
listener, and the node manager's RSS with 16 engines.

Motor: one `motor node-manager` (restart_policy controller, as shipped) supervises 16
`motor engine-sim` engines (one endpoint each, data_parallel_size 16) and reports to a
fake Controller (tests/integration/fake_controller.py) that timestamps every request on
arrival. The bench SIGKILLs the engines one at a time, each kill waiting for its report
(then a 20 ms pause), relaunches all of them through POST /node-manager/engine-restart
every 16 kills, and repeats until `kills` deaths were measured. Latency = the fake
Controller's arrival time - the time of the kill (both time.monotonic() in this process).
The node manager's VmRSS/VmHWM/Pss are read from /proc while all 16 engines are ready.

Peer (measured): supervisord running the same 16 `motor engine-sim` command lines
(autorestart=true, startsecs=0) with an [eventlistener] subscribed to
PROCESS_STATE_EXITED (bench/lib/sv_listener.py) that POSTs the same fault report to the
same kind of fake Controller over a kept-alive connection. Same kill pacing; fewer kills
(BENCH_NM_PEER_KILLS, default 30, 16 quick) because each can take up to a second.
Upstream's own design (a 5 s polling monitor, §2.4: 0-5 s, p50 2.5 s before a report is
even built) is named in the notes, not measured.

With --tls the node manager's management API and its client towards the fake Controller
speak TLS (mgmt_tls_config: mutual TLS, certificates from tests/fixtures/mkcerts.sh): the
same run then measures the RSS with libssl loaded and in use both ways.

usage: bench/nm_death_latency.py [--json PATH] [--motor-kills N] [--peer-kills N] [--engines 16]
                                 [--tls]
(motor-bench-plugin: 1; without --json prints a table). Use a release build (default
build/motor; ASan inflates RSS several times). Standard library only; 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import shutil
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1
from lib import common as C  # noqa: E402
from lib import supervisors as S  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "integration"))

import motorlib  # noqa: E402
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json  # noqa: E402

GAP_S = 0.02  # pause after each report before the next kill, for both supervisors
LISTENER = str(Path(__file__).resolve().parent / "lib" / "sv_listener.py")
GROUP = "Death → controller informed"
UPSTREAM = "upstream design: 5 s poll ⇒ uniform 0–5 s, p50 2.5 s (not measured)"


def rss_kib(pid: int) -> dict:
    """VmRSS/VmHWM/RssAnon/RssFile from status, Pss from smaps_rollup (KiB)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:", "RssAnon:", "RssFile:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0])
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1])
    except OSError:
        pass
    return out


class TlsNM:
    """The node manager's API over mutual TLS (the helpers of fake_controller.NM)."""

    def __init__(self, nm, ctx):
        self.nm, self.ctx = nm, ctx
        self.nm.url = f"https://127.0.0.1:{nm.port}"

    def __getattr__(self, name):
        return getattr(self.nm, name)

    def get(self, path, **kw):
        return motorlib.get(self.nm.url + path, context=self.ctx, **kw)

    def post(self, path, body=None, **kw):
        return motorlib.post(self.nm.url + path, body, context=self.ctx, **kw)

    def engines(self):
        r = self.get("/node-manager/engines")
        assert r.status == 200, r
        return r.json()

    def wait_ready(self, timeout=20.0):
        def ready():
            eps = self.engines()["endpoints"]
            return eps if eps and all(x["status"] == "normal" for x in eps) else None
        return motorlib.wait_for(ready, timeout, interval=0.05, what="endpoints normal")


def motor_run(motor: str, kills: int, n: int, tls: bool = False) -> dict:
    os.environ["MOTOR_BIN"] = motor
    tmp = tempfile.mkdtemp(prefix="motor-bench-nmdeath-")
    procs = motorlib.ProcRegistry(tmp)
    nm_extra: dict = {}
    ctl_ctx = cli_ctx = None
    if tls:
        pki = os.path.join(tmp, "pki")
        subprocess.run([str(REPO / "tests" / "fixtures" / "mkcerts.sh"), pki], check=True,
                       timeout=60)
        f = lambda name: os.path.join(pki, name)  # noqa: E731
        nm_extra = {"mgmt_tls_config": {"enable_tls": True, "cert_file": f("srv.crt"),
                                        "key_file": f("srv.key"), "ca_file": f("ca.crt")}}
        ctl_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctl_ctx.load_cert_chain(f("srv.crt"), f("srv.key"))
        ctl_ctx.load_verify_locations(f("ca.crt"))
        ctl_ctx.verify_mode = ssl.CERT_REQUIRED
        cli_ctx = ssl.create_default_context(cafile=f("ca.crt"))
        cli_ctx.load_cert_chain(f("cli.crt"), f("cli.key"))
    ctl = FakeController(tls=ctl_ctx)
    lat: list[float] = []
    rss: dict = {}
    try:
        cfg = nm_config(controller_port=ctl.port, endpoints=n,
                        engine_config={"data_parallel_size": n, "load_seconds": 0},
                        basic={"heartbeat_interval_seconds": 1.0},
                        ft={"engine_restart_wait_timeout_sec": 600}, nm=nm_extra)
        path = write_json(os.path.join(tmp, "c.json"), cfg)
        nm = start_nm(procs, path)
        if tls:
            nm = TlsNM(nm, cli_ctx)
        ctl.wait_request("/controller/register", timeout=10)
        r = nm.post("/node-manager/start", start_body(cfg, instance_id=1), timeout=30)
        if r.status != 200:
            raise RuntimeError(f"start: {r}")
        nm.wait_ready(timeout=60)
        time.sleep(1.0)  # settle: heartbeats on their period, nothing else in flight
        rss = rss_kib(nm.pid)
        while len(lat) < kills:
            for ep in nm.engines()["endpoints"]:
                if len(lat) >= kills:
                    break

                def is_death(rec, pid=ep["pid"]):
                    info = (rec.body or {}).get("additional_info") or {}
                    return info.get("source") == "pidfd" and info.get("pid") == pid
                t0 = time.monotonic()
                os.kill(ep["pid"], signal.SIGKILL)
                rec = ctl.wait_request("/controller/report_software_fault", is_death,
                                       timeout=10)
                if rec.body.get("engine_id") != ep["id"]:
                    raise RuntimeError(f"report for the wrong engine: {rec.body}")
                lat.append((rec.t - t0) * 1000.0)
                time.sleep(GAP_S)
            # everything down: relaunch all engines in place and wait for them
            deadline = time.monotonic() + 30
            while True:
                r = nm.post("/node-manager/engine-restart", {"action": "restart"}, timeout=30)
                if r.status == 200:
                    break
                if r.status != 409 or time.monotonic() > deadline:
                    raise RuntimeError(f"engine-restart: {r}")
                time.sleep(0.05)  # the previous relaunch still waits for readiness
            nm.wait_ready(timeout=60)
            time.sleep(0.2)
        return {"lat": lat, "rss": rss}
    finally:
        ctl.close()
        procs.close_all()
        shutil.rmtree(tmp, ignore_errors=True)


def supervisord_run(motor: str, kills: int, n: int) -> dict:
    sess = C.Session("nmdeath-sv")
    ctl = FakeController()
    lat: list[float] = []
    try:
        base = C.free_port_run(n, 2)
        services = [[motor, "engine-sim", "--port", str(base + 2 * i), "--load-seconds", "0",
                     "--log-level", "warn"] for i in range(n)]
        sv = S.Supervisord(sess, services)
        sv.extra_conf = [
            "[eventlistener:reporter]",
            f"command=/usr/bin/python3 {LISTENER} {ctl.port} {sess.tmp}",
            "events=PROCESS_STATE_EXITED", "buffer_size=1024", "autorestart=true",
            f"stderr_logfile={sess.tmp}/listener.err", ""]
        sv.start()
        found = sv.wait_services(timeout=30)
        for p in range(n):
            C.wait_port(base + 2 * p, timeout=15)
        time.sleep(2.0)  # the listener is RUNNING after its startsecs (1 s); settle
        cmdlines = list(sv.cmdlines)
        k = 0
        while len(lat) < kills:
            cl = cmdlines[k % n]
            k += 1
            # the service's current process (supervisord restarted earlier victims)
            pid = C.wait_for(lambda: next((p for p in C.all_pids()
                                           if C.read_cmdline(p) == cl and C.pid_alive(p)),
                                          None), 15, "a running service", 0.01, sv.proc)
            found[cl] = pid

            def is_death(rec, pid=pid):
                info = (rec.body or {}).get("additional_info") or {}
                return info.get("source") == "supervisord" and info.get("pid") == pid
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            rec = ctl.wait_request("/controller/report_software_fault", is_death, timeout=15)
            lat.append((rec.t - t0) * 1000.0)
            time.sleep(GAP_S)
        return {"lat": lat}
    finally:
        ctl.close()
        S.stop_quietly(sess)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--motor-kills", type=int, default=0, help="Motor kills per repetition "
                    "(default BENCH_KILLS: 200, 100 quick)")
    ap.add_argument("--peer-kills", type=int, default=0,
                    help="supervisord kills per repetition (default 30, 16 quick)")
    ap.add_argument("--engines", type=int, default=16)
    ap.add_argument("--motor", default=None)
    ap.add_argument("--tls", action="store_true",
                    help="management API and Controller client over (mutual) TLS")
    a = plugin.args(ap)
    kills = a.motor_kills or a.kills
    peer_kills = a.peer_kills or C.env_int("BENCH_NM_PEER_KILLS", 16 if a.quick else 30)
    n = a.engines
    peer_ok = S.Supervisord.available()
    motor_reps: list[dict] = []
    peer_reps: list[dict] = []
    for rep in range(a.reps):
        order = ["motor", "supervisord"] if rep % 2 == 0 else ["supervisord", "motor"]
        for who in order:
            if who == "motor":
                C.log(f"death→controller rep {rep + 1}/{a.reps}: motor, {kills} kills, "
                      f"{n} engines")
                r = motor_run(a.motor, kills, n, a.tls)
                motor_reps.append(r)
            elif peer_ok is None:
                C.log(f"death→controller rep {rep + 1}/{a.reps}: supervisord, {peer_kills} "
                      f"kills, {n} programs")
                try:
                    r = supervisord_run(a.motor, peer_kills, n)
                except Exception as e:  # the peer failing must not hide Motor's figures
                    peer_ok = f"supervisord run failed: {type(e).__name__}: {e}"
                    peer_reps.clear()
                    C.log(f"  {peer_ok}")
                    continue
                peer_reps.append(r)
            else:
                continue
            C.log(f"  p50 {plugin.pct(r['lat'], 50):.2f} ms  p99 "
                  f"{plugin.pct(r['lat'], 99):.2f} ms  max {max(r['lat']):.2f} ms")

    work = f"engine-sim SIGKILLed, one at a time, {n} engines, fake controller"
    peer_name = "supervisord eventlistener (PROCESS_STATE_EXITED → POST)" if peer_reps \
        else None
    notes = [
        f"Death → controller: SIGKILL of one engine to the fault report's arrival at a fake "
        f"controller (monotonic clock, same process). Motor: node manager, restart_policy "
        f"controller, {kills} kills per repetition over {n} engines (all relaunched through "
        f"/node-manager/engine-restart every {n} kills). Peer: supervisord 4.2.5, the same "
        f"{n} command lines (autorestart=true, startsecs=0), an event listener subscribed to "
        f"PROCESS_STATE_EXITED that POSTs the same report over keep-alive, {peer_kills} kills "
        f"per repetition (its p99 is close to its max). Each kill waits for its report, then "
        f"{GAP_S * 1e3:g} ms. Upstream's design polls every 5 s (§2.4): 0–5 s, p50 2.5 s "
        f"before a report is built — not measured.",
    ]
    if peer_ok is not None:
        notes.append(f"supervisord not run: {peer_ok}")
    rows = []
    for metric, target in (("p50", None), ("p99", "≤ 50 ms")):
        m = [plugin.pct(r["lat"], int(metric[1:])) for r in motor_reps]
        p = [plugin.pct(r["lat"], int(metric[1:])) for r in peer_reps] or None
        rows.append(plugin.row(
            f"nm.death_to_controller.{metric}", GROUP, work, metric, "ms", m,
            peer_name=peer_name, peer=p, target=target, notes=notes if metric == "p50" else [],
            extra={"motor_max_ms": [max(r["lat"]) for r in motor_reps],
                   "peer_max_ms": [max(r["lat"]) for r in peer_reps],
                   "motor_kills": kills, "peer_kills": peer_kills,
                   "upstream": UPSTREAM,
                   "nm_rss_kib_16_engines": [r["rss"] for r in motor_reps]}))
    plugin.emit(a, rows)

    print(f"\n### engine death → controller informed ({n} engines)\n")
    print("| | " + " | ".join(f"rep {i + 1}" for i in range(len(motor_reps))) + " |")
    print("| --- |" + " ---: |" * len(motor_reps))
    for who, reps in (("Motor", motor_reps), ("supervisord", peer_reps)):
        if not reps:
            continue
        for p in (50, 99):
            print(f"| {who} p{p} ms | " + " | ".join(f"{plugin.pct(r['lat'], p):.2f}"
                                                    for r in reps) + " |")
        print(f"| {who} max ms | " + " | ".join(f"{max(r['lat']):.2f}" for r in reps) + " |")
    for key in ("VmRSS", "RssAnon", "RssFile", "Pss", "VmHWM"):
        print(f"| node manager {key} KiB | " + " | ".join(str(r["rss"].get(key, "?"))
                                                        for r in motor_reps) + " |")
    print(f"\n{UPSTREAM}; binary: {a.motor}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
