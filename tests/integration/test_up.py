"""`motor up` end to end: the bundled local fleet (examples/local.json: 1 prefill + 1
decode instance of simulated engines, 2 DP ranks each) comes up, serves streamed and
non-streamed chat completions through the coordinator, survives a SIGKILLed decode
engine (the controller relaunches it), and stops on SIGTERM with nothing left behind.

This test must fail — never skip — when the fleet does not come up.

The helpers at the top are shared with test_up_supervision.py."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path
from typing import Optional

import motorlib
from motorlib import REPO, get, post, wait_for

LOCAL_JSON = str(REPO / "examples" / "local.json")
# examples/local.json with --port-base B uses B..B+21; keep a margin.
PORT_BLOCK = 32
READY_TIMEOUT = 90.0


def free_port_block(n: int = PORT_BLOCK) -> int:
    """The first port of n consecutive ports that are free now. Below the kernel's
    ephemeral range, so that clients' source ports do not take them meanwhile."""
    lo, hi = 20000, 32000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph = int(f.read().split()[0])
        hi = min(hi, eph - n)
    except (OSError, ValueError):
        pass
    rng = random.Random(os.getpid() ^ int.from_bytes(os.urandom(4), "little"))
    for _ in range(200):
        base = rng.randrange(lo, hi, 2)
        if all(motorlib.port_is_free(p) for p in range(base, base + n)):
            return base
    raise RuntimeError("no free block of ports")


def descendants(pid: int) -> list[int]:
    """Live descendants of pid (children, their children, ...)."""
    out, todo = [], [pid]
    while todo:
        kids = motorlib.children_of(todo.pop())
        out += kids
        todo += kids
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains text."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me and motorlib.pid_alive(int(name)):
            if text in cmdline(int(name)):
                out.append(int(name))
    return out


class Fleet:
    """A running `motor up` on a free port block, with its state directory."""

    def __init__(self, procs: motorlib.ProcRegistry, tmpdir: str, config: str = LOCAL_JSON,
                 extra: Optional[list[str]] = None):
        self.base = free_port_block()
        self.state = os.path.join(tmpdir, "state")
        self.config = config
        args = ["up", "-c", config, "--port-base", self.base, "--state-dir", self.state,
                "--plain", "--ready-timeout", int(READY_TIMEOUT)] + (extra or [])
        self.proc = procs.motor(*args, name="up")
        self.url: Optional[str] = None

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> dict:
        ev = self.proc.wait_event("up_ready", timeout=timeout)
        self.url = ev["url"]
        return ev

    def info(self) -> dict:
        with open(os.path.join(self.state, "up.json")) as f:
            return json.load(f)

    def child(self, name: str) -> dict:
        return next(c for c in self.info()["children"] if c["name"] == name)

    def status(self, *extra: str) -> tuple[int, dict]:
        r = subprocess.run([motorlib.motor_bin(), "status", "--state-dir", self.state, "--json",
                            *extra], capture_output=True, text=True, timeout=30)
        try:
            model = json.loads(r.stdout)
        except ValueError:
            raise AssertionError(f"motor status printed no JSON (rc {r.returncode}):\n"
                                 f"{r.stdout}\n{r.stderr}")
        return r.returncode, model

    def wait_healthy(self, timeout: float = 60.0) -> dict:
        last: list = [None]

        def ok():
            rc, m = self.status()
            last[0] = m
            return m if rc == 0 and m["healthy"] else None
        try:
            return wait_for(ok, timeout, interval=0.3, what="motor status to say healthy")
        except TimeoutError as e:
            raise AssertionError(f"{e}; last problems: {last[0] and last[0]['problems']}\n"
                                 f"{self.proc.tail()}") from None

    def stop(self, timeout: float = 40.0) -> int:
        self.proc.signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def chat(url: str, content: str, stream: bool = False, max_tokens: int = 12,
         timeout: float = 20.0):
    body = {"model": "motor-demo", "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True, "messages": [{"role": "user", "content": content}]}
    if stream:
        return motorlib.SSEStream(url + "/chat/completions", body, timeout=timeout)
    return post(url + "/chat/completions", body, timeout)


def streamed_text(s: motorlib.SSEStream) -> str:
    assert s.status == 200, (s.status, s.error_body)
    text = ""
    for ch in s.chunks():
        for c in ch.get("choices", []):
            text += (c.get("delta") or {}).get("content") or ""
    return text


def metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ---------------------------------------------------------------------------------------


def test_local_fleet_end_to_end(procs, tmpdir_path):
    fleet = Fleet(procs, tmpdir_path)
    ev = fleet.wait_ready()
    assert ev["instances"] == 2 and ev["model"] == "motor-demo"
    url = fleet.url
    assert url == f"http://127.0.0.1:{fleet.base}/v1"
    assert "OpenAI base URL: " + url in fleet.proc.output()

    # The coordinator serves the model, non-streamed and streamed, with the same text
    # (the simulator is deterministic), through the PD hand-off.
    r = get(url + "/models")
    assert r.status == 200 and [m["id"] for m in r.json()["data"]] == ["motor-demo"]
    r = chat(url, "hello fleet")
    assert r.status == 200, r
    whole = r.json()["choices"][0]["message"]["content"]
    assert whole and r.json()["usage"]["completion_tokens"] == 12
    assert streamed_text(chat(url, "hello fleet", stream=True)) == whole

    # motor status sees two active instances with two normal endpoints each, and the
    # coordinator's pools routable.
    model = fleet.wait_healthy(30)
    roles = sorted(i["role"] for i in model["instances"])
    assert roles == ["decode", "prefill"]
    for inst in model["instances"]:
        assert inst["status"] == "active"
        assert [e["status"] for e in inst["endpoints"]] == ["normal", "normal"]
    assert all(p["healthy"] for p in model["pools"]) and len(model["pools"]) == 2
    assert model["coordinator"]["requests_total"] >= 2

    # SIGKILL one decode engine: the node manager reports it, the controller relaunches
    # the instance's engines, and the fleet serves again.
    nm = fleet.child("decode-0")
    engines = motorlib.children_of(nm["pid"])
    assert len(engines) == 2, [cmdline(p) for p in engines]
    victim = engines[0]
    assert "engine-sim" in cmdline(victim)
    os.kill(victim, signal.SIGKILL)

    def relaunched():
        now = motorlib.children_of(nm["pid"])
        return now if len(now) == 2 and victim not in now else None
    new_engines = wait_for(relaunched, 60, interval=0.1, what="the decode engines relaunched")
    fleet.wait_healthy(60)
    assert fleet.child("decode-0")["pid"] == nm["pid"], "the node manager itself survived"
    assert motorlib.children_of(nm["pid"]) == new_engines

    decode_ports = [int(cmdline(p).split("--port ")[1].split()[0]) for p in new_engines]

    def decoded() -> float:
        return sum(metric_sum(get(f"http://127.0.0.1:{port}/metrics").text,
                              "vllm:request_success_total") for port in decode_ports)
    before = decoded()
    n = 3
    for i in range(n):
        r = chat(url, f"after relaunch {i}")
        assert r.status == 200, r
        assert r.json()["choices"][0]["message"]["content"]
    assert streamed_text(chat(url, "after relaunch stream", stream=True))
    # Those requests were decoded by the decode instance (PD), relaunched engine included.
    assert decoded() - before == n + 1

    # SIGTERM: everything stops, in order, and nothing is left.
    tree = descendants(fleet.proc.pid)
    assert len(tree) >= 8, tree  # coordinator, controller, 2 NMs, 4 engines (+ workers)
    rc = fleet.stop()
    assert rc == 0, fleet.proc.tail()
    out = fleet.proc.output()
    order = [e["what"] for e in fleet.proc.find_events("up_stopping")]
    assert order == ["coordinator", "controller", "node managers"], order
    assert "up_stopped" in out
    left = [p for p in tree if motorlib.pid_alive(p)]
    assert not left, [(p, cmdline(p)) for p in left]
    assert not processes_mentioning(fleet.state), "a process still uses the state directory"
    for port in range(fleet.base, fleet.base + 22):
        assert motorlib.port_is_free(port), f"port {port} still bound"
    assert not Path(fleet.state, "up.json").exists()
