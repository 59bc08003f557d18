"""latprobe — run bench/latprobe.c (`motor-latprobe`, built next to `motor`) and parse it.

The probe times one request at a time per target over one keep-alive connection each,
the targets interleaved in batches, in nanoseconds; the first target is the reference and
every other one gets added_* figures (see the header comment of bench/latprobe.c).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Optional

NAME = "motor-latprobe"


def find(motor: str) -> Optional[str]:
    """The probe next to the motor binary, or None."""
    p = os.path.join(os.path.dirname(os.path.abspath(motor)), NAME)
    return p if os.access(p, os.X_OK) else None


def missing_reason(motor: str) -> str:
    d = os.path.dirname(os.path.abspath(motor))
    return (f"{NAME} not found next to the motor binary (in {d}); it is built with motor "
            f"from bench/latprobe.c (ninja -C <build dir> {NAME})")


def run(probe: str, targets: list[tuple[str, int]], body: dict, requests: int, batch: int,
        tmp: str, path: str = "/v1/completions", cpus: Optional[set[int]] = None) -> dict:
    """One interleaved run over targets (the first is the reference), the probe on cpus
    when given. Returns the probe's JSON with `by_name` added: {name: target dict}.
    Raises RuntimeError on failure."""
    bf = os.path.join(tmp, "latprobe-body.json")
    with open(bf, "w") as f:
        json.dump(body, f)
    cmd = [probe, "--requests", str(requests), "--batch", str(batch), "--path", path,
           "--body-file", bf] + [f"{n}={p}" for n, p in targets]
    # a generous bound: 5 ms per request would already be 25x what this machine takes
    timeout = 120 + requests * len(targets) * 0.005
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         start_new_session=True, preexec_fn=pin)
    if out.returncode != 0:
        raise RuntimeError(f"{NAME} failed ({out.returncode}): {out.stderr.strip()[:400]}")
    try:
        doc = json.loads(out.stdout)
    except ValueError as e:
        raise RuntimeError(f"{NAME}: unparsable output ({e}): {out.stdout[:200]!r}")
    doc["by_name"] = {t["name"]: t for t in doc["targets"]}
    return doc
