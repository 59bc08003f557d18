#!/usr/bin/python3
"""coord_ab — two builds of the coordinator side by side in ONE interleaved latency probe.

The gateway row compares Motor with nginx; comparing two Motor builds through two gateway
runs lets the machine's drift between the runs (other work on a shared machine moves the
figures by several µs) land on one build. Here both coordinators (2 workers each) front
the same engine simulator and `motor-latprobe` interleaves direct, before and after batch
by batch, every process pinned to CPU 0 (the coordinator's own work, see
docs/performance.md). Prints the added p50 / p99 / paired p50 of each build per mode.

    /usr/bin/python3 bench/coord_ab.py --before /tmp/old/motor --after build/motor [--reps 3]

`motor-latprobe` is taken from next to --after. Not a bench row: a check for a change of
the request path.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import common as C  # noqa: E402
from lib import latprobe  # noqa: E402

LONG_PROMPT = ("Summarise the following text in one sentence. " * 350)[:16384]
MODES = (("non-stream", False, "benchmark prompt"), ("stream", True, "benchmark prompt"),
         ("16 KiB prompt", False, LONG_PROMPT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default=C.motor_bin())
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=20000, help="timed requests per target and mode")
    a = ap.parse_args()
    probe = latprobe.find(a.after)
    if not probe:
        print(latprobe.missing_reason(a.after), file=sys.stderr)
        return 2
    sess = C.Session("ab")
    try:
        ep = C.free_port()
        e = sess.start([a.after, "engine-sim", "--model", "m", "--port", str(ep), "--ttft-ms",
                        "0", "--tokens-per-second", "0", "--load-seconds", "0",
                        "--log-level", "warn"], "engine.log")
        C.wait_port(ep, 15, e)
        ports = {"direct": ep}
        for name, binary in (("before", a.before), ("after", a.after)):
            c = sess.start([binary, "coordinator", "--port", "0", "--mgmt-port", "0",
                            "--workers", "2", "--log-level", "info"], name + ".log")
            ev = C.wait_log_event(sess.path(name + ".log"), "coordinator_listening", 15, c)
            body = {"event": "set", "model_name": "m", "instances": [
                {"id": 1, "role": "union",
                 "endpoints": [{"id": 0, "address": f"127.0.0.1:{ep}"}]}]}
            st, b = C.http_post_json(f"http://127.0.0.1:{ev['mgmt_port']}/instances/refresh",
                                     body)
            if st != 200:
                raise RuntimeError(f"{name}: refresh answered {st}: {b[:200]!r}")
            ports[name] = ev["infer_port"]
        names = ["direct", "before", "after"]
        for rep in range(a.reps):
            for mode, stream, prompt in MODES:
                req = {"model": "m", "prompt": prompt, "max_tokens": 16, "stream": stream}
                sess.set_affinity({0})
                try:
                    doc = latprobe.run(probe, [(n, ports[n]) for n in names], req, a.n, 50,
                                       sess.tmp, cpus={0})
                finally:
                    sess.set_affinity(None)
                t = doc["by_name"]
                print(f"rep {rep + 1} {mode:14s} " + " | ".join(
                    f"{n}: added p50 {t[n]['added_p50_us']:.1f} us, p99 "
                    f"{t[n]['added_p99_us']:.1f} us, paired p50 "
                    f"{t[n]['added_paired_p50_us']:.1f} us" for n in ("before", "after")),
                    flush=True)
    finally:
        sess.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
