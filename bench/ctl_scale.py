#!/usr/bin/env python3
"""Controller scale: 1000 simulated node managers registering and heartbeating 1/s.

A load generator speaks the node-manager side of the Controller protocol (spec §5):
N simulated node managers (default 1000; one instance per --nms-per-instance of them)
register with one `motor controller`, answer its reachability probes and start commands
(a few asyncio HTTP servers on 127.0.0.1 stand in for the NM APIs), then heartbeat every
second with every endpoint `normal`, spread evenly over the second, over a pool of
kept-alive connections. After a warm-up in which every instance becomes active, the
controller's CPU (utime+stime from /proc over the window) and RSS (VmRSS, VmHWM) are
sampled for --seconds, and the client-side heartbeat round-trip latency is recorded.

Also reported: time to register all node managers and time until every instance was
assembled and started. The controller runs with its shipped defaults (10 s heartbeat
timeout, SQLite store in a temp dir) except a 0.5 s assembler interval and no
coordinator push (nothing to measure there).

A second set of rows (--grouped 4, 0 = off) runs the same N node managers grouped into
N/4 four-pod instances (DP ranks across pods, issue 15: the freshness of every member
is checked on each transition to active), next to the single-pod rows.

usage: bench/ctl_scale.py [--nms 1000] [--nms-per-instance 1] [--grouped 4] [--seconds 20]
       [--connections 32] [--json PATH]      (plug-in: motor-bench-plugin: 1)
Use a release build (default build/motor, or MOTOR_BIN): ASan inflates CPU and RSS.
Standard library only; binds 127.0.0.1 only; leaves nothing behind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import plugin  # noqa: E402  motor-bench-plugin: 1

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return int(rest[11]) + int(rest[12])  # utime + stime


def mem_kib(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0])
    return out


def pct(vals: list[float], p: float) -> float:
    if not vals:
        return float("nan")
    s = sorted(vals)
    return s[min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))]


# ---------------------------------------------------------------------------------------
# minimal HTTP/1.1 over asyncio streams (keep-alive, Content-Length bodies)


async def read_message(reader: asyncio.StreamReader) -> tuple[str, dict, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "0"))
    body = await reader.readexactly(n) if n else b""
    return lines[0], hdrs, body


class Conn:
    def __init__(self, port: int):
        self.port = port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: dict | None) -> tuple[int, bytes]:
        for attempt in range(2):
            if self.w is None:
                self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)
            data = json.dumps(body).encode() if body is not None else b""
            req = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                   ).encode() + data
            try:
                self.w.write(req)
                await self.w.drain()
                status_line, hdrs, payload = await read_message(self.r)
            except (ConnectionError, asyncio.IncompleteReadError):
                self.w = None
                if attempt:
                    raise
                continue
            if hdrs.get("connection", "").lower() == "close":
                self.w.close()
                self.w = None
            return int(status_line.split()[1]), payload
        raise ConnectionError("unreachable")


# ---------------------------------------------------------------------------------------
# the simulated node managers


class Fleet:
    def __init__(self, n: int, per_instance: int):
        self.n = n
        self.per = per_instance
        self.ports: list[int] = []
        self.servers: list[asyncio.AbstractServer] = []
        self.instance_of_job: dict[str, int] = {}
        self.eps_of: dict[tuple[str, int], list[int]] = {}  # (job, nm port) -> endpoint ids
        self.started = asyncio.Event()
        self.n_started = 0

    def job(self, i: int) -> str:
        return f"bench-{i // self.per}"

    def port(self, i: int) -> int:
        return self.ports[i % self.per]

    async def serve(self) -> None:
        for _ in range(self.per):
            srv = await asyncio.start_server(self._client, "127.0.0.1", 0, backlog=1024)
            self.servers.append(srv)
            self.ports.append(srv.sockets[0].getsockname()[1])

    async def _client(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        port = w.get_extra_info("sockname")[1]
        try:
            while True:
                line, _h, body = await read_message(r)
                method, path = line.split()[:2]
                out = b"{}"
                if path.startswith("/node-manager/status"):
                    out = b'{"status": true}'
                elif path == "/node-manager/start" and method == "POST":
                    m = json.loads(body)
                    key = (m["job_name"], port)
                    if key not in self.eps_of:
                        self.n_started += 1
                    self.instance_of_job[m["job_name"]] = m["instance_id"]
                    self.eps_of[key] = [e["id"] for e in m["endpoints"]]
                    if self.n_started >= self.n:
                        self.started.set()
                w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(out), out))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    def register_body(self, i: int) -> dict:
        return {"job_name": self.job(i), "model_name": "bench", "engine_type": "vllm",
                "dispatch_capabilities": ["prefill_handoff_decode"], "role": "prefill",
                "pod_ip": "127.0.0.1", "business_port": [str(20000 + 2 * (i % self.per))],
                "nm_port": str(self.port(i)),
                "parallel_config": {"dp_size": self.per, "tp_size": 1},
                "enable_multi_endpoints": True, "device_num": 1, "nnodes": 1}

    def heartbeat_body(self, i: int) -> dict:
        job = self.job(i)
        ids = self.eps_of.get((job, self.port(i)), [])
        return {"job_name": job, "ins_id": self.instance_of_job.get(job, 0), "ip": "127.0.0.1",
                "status": {str(e): "normal" for e in ids}}


async def register_all(fleet: Fleet, ctl_port: int, conns: int) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(fleet.n):
        queue.put_nowait(i)

    async def worker() -> None:
        c = Conn(ctl_port)
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            while True:
                st, body = await c.request("POST", "/controller/register", fleet.register_body(i))
                if st == 200 and b'"result"' in body:
                    break
                await asyncio.sleep(0.2)
    await asyncio.gather(*(worker() for _ in range(conns)))


async def heartbeat_phase(fleet: Fleet, ctl_port: int, conns: int, seconds: float,
                          warmup: float, on_window) -> tuple[list[float], int]:
    """Each NM heartbeats once a second at its own offset. Latencies of the measured
    window (after warm-up) are returned with the count of non-200 answers."""
    lat: list[float] = []
    errors = 0
    start = time.monotonic() + 0.05
    window_at = start + warmup
    end = window_at + seconds
    per_conn = [list(range(k, fleet.n, conns)) for k in range(conns)]
    window_started = asyncio.Event()

    async def window() -> None:
        await asyncio.sleep(max(0.0, window_at - time.monotonic()))
        on_window("start")
        window_started.set()
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        on_window("end")

    async def worker(nms: list[int]) -> None:
        nonlocal errors
        c = Conn(ctl_port)
        # NM i fires at start + i/n + k seconds; this connection serves its NMs in order
        slots = sorted((i / fleet.n, i) for i in nms)
        k = 0
        while True:
            for off, i in slots:
                due = start + k + off
                if due >= end:
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                t = time.monotonic()
                st, _ = await c.request("POST", "/controller/heartbeat", fleet.heartbeat_body(i))
                if t >= window_at:
                    lat.append((time.monotonic() - t) * 1000.0)
                    if st != 200:
                        errors += 1
            k += 1
    await asyncio.gather(window(), *(worker(p) for p in per_conn))
    return lat, errors


def controller_config(tmp: str) -> str:
    cfg = {"motor_controller_config": {
        "api_config": {"controller_api_host": "127.0.0.1", "controller_api_port": 0},
        "instance_config": {"instance_assembler_check_interval": 0.5,
                            "instance_assembler_cmd_send_interval": 2},
        "event_config": {"coordinator_push": False},
        "store_config": {"backend": "sqlite", "sqlite_path": os.path.join(tmp, "ctl.db")}}}
    path = os.path.join(tmp, "controller.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def start_controller(motor: str, tmp: str) -> tuple[subprocess.Popen, int, str]:
    log = os.path.join(tmp, "controller.log")
    lf = open(log, "wb")
    p = subprocess.Popen([motor, "controller", "--config", controller_config(tmp), "--port", "0",
                          "--log-level", "warn"], stdout=lf, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    lf.close()
    # the listening line is info level: read the port from /proc instead
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError("controller exited: " + open(log).read()[-2000:])
        port = listening_port(p.pid)
        if port:
            return p, port, log
        time.sleep(0.05)
    raise RuntimeError("controller did not listen")


def listening_port(pid: int) -> int:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if t.startswith("socket:["):
                inodes.add(t[8:-1])
    except OSError:
        return 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                return int(parts[1].split(":")[1], 16)
    return 0


async def run_once(motor: str, n: int, per: int, seconds: float, conns: int) -> dict:
    tmp = tempfile.mkdtemp(prefix="motor-ctl-scale-")
    proc = None
    fleet = Fleet(n, per)
    try:
        await fleet.serve()
        proc, port, _log = start_controller(motor, tmp)
        t0 = time.monotonic()
        await register_all(fleet, port, conns)
        t_reg = time.monotonic() - t0
        await asyncio.wait_for(fleet.started.wait(), timeout=120)
        t_started = time.monotonic() - t0
        samples: dict[str, tuple[float, int]] = {}

        def on_window(what: str) -> None:
            samples[what] = (time.monotonic(), cpu_ticks(proc.pid))
        lat, errors = await heartbeat_phase(fleet, port, conns, seconds, 3.0, on_window)
        mem = mem_kib(proc.pid)
        (t_a, c_a), (t_b, c_b) = samples["start"], samples["end"]
        cpu = 100.0 * (c_b - c_a) / TICKS / (t_b - t_a)
        st, body = await Conn(port).request("GET", "/controller/instances", None)
        inst = json.loads(body)["instances"]
        active = sum(1 for i in inst if i["status"] == "active")
        return {"cpu_pct": cpu, "rss_kib": mem.get("VmRSS", 0), "hwm_kib": mem.get("VmHWM", 0),
                "hb_p50_ms": pct(lat, 50), "hb_p99_ms": pct(lat, 99), "heartbeats": len(lat),
                "hb_errors": errors, "register_s": t_reg, "started_s": t_started,
                "instances": len(inst), "active": active}
    finally:
        for s in fleet.servers:
            s.close()
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nms", type=int, default=1000)
    ap.add_argument("--nms-per-instance", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=0)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--grouped", type=int, default=4,
                    help="also run with this many node managers per instance (0: no)")
    ap.add_argument("--motor", default=None)
    a = plugin.args(ap)
    seconds = a.seconds or (8.0 if a.quick else 20.0)
    runs = []
    for rep in range(a.reps):
        r = asyncio.run(run_once(a.motor, a.nms, a.nms_per_instance, seconds, a.connections))
        print(f"rep {rep + 1}: {json.dumps(r)}", flush=True)
        if r["active"] != r["instances"] or r["hb_errors"]:
            print("warning: not every instance active / heartbeat errors", flush=True)
        runs.append(r)
    work = f"{a.nms} simulated node managers, heartbeat 1/s"
    notes = [f"{a.nms} NMs ({a.nms_per_instance} per instance), {seconds:.0f} s window after a "
             "3 s warm-up; controller defaults, SQLite store, no coordinator push",
             "heartbeat latency measured by the Python load generator (includes its own "
             "scheduling)"]
    rows = [
        plugin.row("ctl.scale.cpu", "Controller scale", work, "controller CPU", "%",
                   [r["cpu_pct"] for r in runs], notes=notes,
                   extra={"runs": runs}),
        plugin.row("ctl.scale.hb_p99", "Controller scale", work, "heartbeat handling p99", "ms",
                   [r["hb_p99_ms"] for r in runs]),
        plugin.row("ctl.scale.rss", "Controller scale", work, "controller RSS", "KiB",
                   [r["rss_kib"] for r in runs]),
    ]
    grouped = []
    if a.grouped > 1 and a.nms_per_instance == 1 and a.nms % a.grouped == 0:
        for rep in range(a.reps):
            r = asyncio.run(run_once(a.motor, a.nms, a.grouped, seconds, a.connections))
            print(f"grouped rep {rep + 1}: {json.dumps(r)}", flush=True)
            if r["active"] != r["instances"] or r["hb_errors"]:
                print("warning: not every instance active / heartbeat errors", flush=True)
            grouped.append(r)
        gwork = (f"{a.nms} simulated node managers in {a.nms // a.grouped} {a.grouped}-pod "
                 "instances, heartbeat 1/s")
        peer = "the single-pod rows (same node managers, one per instance)"
        rows += [
            plugin.row(f"ctl.scale_{a.grouped}pod.cpu", "Controller scale", gwork,
                       "controller CPU", "%", [r["cpu_pct"] for r in grouped],
                       peer_name=peer, peer=[r["cpu_pct"] for r in runs],
                       notes=[f"{a.nms} NMs, {a.grouped} per instance (DP ranks across pods)"],
                       extra={"runs": grouped}),
            plugin.row(f"ctl.scale_{a.grouped}pod.hb_p99", "Controller scale", gwork,
                       "heartbeat handling p99", "ms", [r["hb_p99_ms"] for r in grouped],
                       peer_name=peer, peer=[r["hb_p99_ms"] for r in runs]),
            plugin.row(f"ctl.scale_{a.grouped}pod.rss", "Controller scale", gwork,
                       "controller RSS", "KiB", [r["rss_kib"] for r in grouped],
                       peer_name=peer, peer=[r["rss_kib"] for r in runs]),
        ]
    plugin.emit(a, rows)
    heads = [f"rep {i + 1}" for i in range(len(runs))] + \
        [f"{a.grouped}-pod rep {i + 1}" for i in range(len(grouped))]
    print("\n| metric | " + " | ".join(heads) + " |")
    print("| --- |" + " --- |" * len(heads))
    for key, name in (("cpu_pct", "controller CPU %"), ("rss_kib", "controller RSS KiB"),
                      ("hwm_kib", "controller peak RSS KiB"), ("hb_p50_ms", "heartbeat p50 ms"),
                      ("hb_p99_ms", "heartbeat p99 ms"), ("register_s", "register all, s"),
                      ("started_s", "all started, s"), ("active", "instances active")):
        print(f"| {name} | " + " | ".join(f"{r[key]:.1f}" if isinstance(r[key], float)
                                        else str(r[key]) for r in runs + grouped) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
