#!/usr/bin/python3
"""coord_callgrind — instructions the coordinator executes per proxied request, under
callgrind (valgrind), for the gateway bench's modes and a vLLM PD hand-off.

Not a bench row (callgrind slows the process ~50x; its figure is work, not latency): a
repeatable count to compare two builds of the coordinator, e.g. before and after a change
of the request path. The engines run natively; only the coordinator (one worker) runs
under callgrind. Per mode: warm-up requests, `callgrind_control --zero`, N requests one at
a time over one keep-alive connection, `callgrind_control --dump`; the figure is the dump's
total instructions (every thread of the process) / N.

    /usr/bin/python3 bench/coord_callgrind.py [--motor build/motor] [-n 2000] [--warm 300]

Prints one JSON object {mode: instructions per request}. Needs valgrind. A release build
(RelWithDebInfo, `make build`) gives the figures docs/performance.md quotes.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import common as C  # noqa: E402

LONG_PROMPT = ("Summarise the following text in one sentence. " * 350)[:16384]


def total_ir(path: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def drive(port: int, path: str, body: dict, n: int) -> None:
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    hdrs = {"Content-Type": "application/json"}
    for _ in range(n):
        conn.request("POST", path, data, hdrs)
        r = conn.getresponse()
        r.read()
        if r.status != 200:
            raise RuntimeError(f"{path}: HTTP {r.status}")
    conn.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--motor", default=C.motor_bin())
    ap.add_argument("-n", type=int, default=2000, help="timed requests per mode")
    ap.add_argument("--warm", type=int, default=300, help="warm-up requests per mode")
    ap.add_argument("--keep", metavar="DIR", help="keep each mode's callgrind dump in DIR "
                    "(for callgrind_annotate)")
    a = ap.parse_args()
    if not C.which("valgrind") or not C.which("callgrind_control"):
        print("valgrind (callgrind) is not installed", file=sys.stderr)
        return 2
    sess = C.Session("cg")
    out: dict[str, float] = {}
    try:
        fast = ["--ttft-ms", "0", "--tokens-per-second", "0", "--load-seconds", "0",
                "--log-level", "warn"]
        ports = {}
        for name in ("union", "prefill", "decode"):
            ports[name] = C.free_port()
            e = sess.start([a.motor, "engine-sim", "--model", "m", "--port", str(ports[name])]
                           + fast, f"{name}.log")
            C.wait_port(ports[name], 15, e)
        clog = sess.path("coordinator.log")
        cg = sess.path("cg.out")
        c = sess.start(["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg}",
                        a.motor, "coordinator", "--port", "0", "--mgmt-port", "0",
                        "--workers", "1", "--log-level", "info"], "coordinator.log")
        ev = None
        deadline = time.monotonic() + 120
        while ev is None and time.monotonic() < deadline:
            ev = C.log_event(clog, "coordinator_listening")
            if ev is None:
                time.sleep(0.2)
            if c.poll() is not None:
                raise RuntimeError("coordinator exited")
        if ev is None:
            raise TimeoutError("coordinator_listening")
        cport, mport = ev["infer_port"], ev["mgmt_port"]

        def refresh(insts: list[dict], **top) -> None:
            body = {"event": "set", "model_name": "m", "instances": insts, **top}
            st, b = C.http_post_json(f"http://127.0.0.1:{mport}/instances/refresh", body, 60)
            if st // 100 != 2:
                raise RuntimeError(f"refresh: {st} {b[:200]!r}")

        def ext(iid: int, role: str, port: int) -> dict:
            return {"id": iid, "role": role,
                    "endpoints": [{"id": 0, "address": f"127.0.0.1:{port}"}]}

        modes = [
            ("non-stream", False, "benchmark prompt", "union"),
            ("stream", True, "benchmark prompt", "union"),
            ("long-prompt", False, LONG_PROMPT, "union"),
            ("vllm-pd non-stream", False, "benchmark prompt", "pd"),
            ("vllm-pd stream", True, "benchmark prompt", "pd"),
        ]
        current = None
        for mode, stream, prompt, fleet in modes:
            if fleet != current:
                if fleet == "union":
                    refresh([ext(1, "union", ports["union"])])
                else:
                    refresh([ext(1, "prefill", ports["prefill"]),
                             ext(2, "decode", ports["decode"])],
                            dispatch_capabilities=["prefill_handoff_decode"])
                current = fleet
            body = {"model": "m", "prompt": prompt, "max_tokens": 16, "stream": stream}
            drive(cport, "/v1/completions", body, a.warm)
            before = set(glob.glob(cg + "*"))
            subprocess.run(["callgrind_control", "--zero", str(c.pid)], check=True,
                           capture_output=True)
            drive(cport, "/v1/completions", body, a.n)
            subprocess.run(["callgrind_control", "--dump", str(c.pid)], check=True,
                           capture_output=True)
            new = C.wait_for(lambda: sorted(set(glob.glob(cg + "*")) - before), 30, "dump")
            out[mode] = round(total_ir(new[-1]) / a.n)
            print(f"{mode}: {out[mode]} instructions per request", file=sys.stderr)
            for f in new:
                if a.keep:
                    os.makedirs(a.keep, exist_ok=True)
                    os.replace(f, os.path.join(a.keep, "callgrind." + mode.replace(" ", "_")))
                else:
                    os.unlink(f)
    finally:
        sess.close(grace=30)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
