"""report — the result rows, the markdown table and the JSON document.

A Row compares Motor's figure with one peer's on one workload and metric. Figures are
summaries over repeated runs (common.summary: median, min, max, n, values); the ratio is
Motor's median divided by the peer's (say in `better` which direction wins). A row that
could not be measured has status "pending" (not built yet, tool missing) or "error"
(it ran and failed), with the reason shown in place of Motor's figure.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class Row:
    id: str  # stable key, e.g. "restart.sim.s6.p50"
    group: str  # "Death → replacement started"
    workload: str
    metric: str  # "p50", "RSS", "req/s", ...
    unit: str  # "ms", "KiB", "req/s"
    better: str = "lower"  # or "higher"
    motor: Optional[dict] = None  # summary over runs
    motor_label: str = "Motor"
    peer_name: Optional[str] = None
    peer: Optional[dict] = None
    reps: int = 0
    status: str = "ok"  # ok | pending | error
    reason: str = ""
    target: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # JSON only

    @property
    def ratio(self) -> Optional[float]:
        if not self.motor or not self.peer:
            return None
        p = self.peer["median"]
        if p <= 0 or self.motor["median"] < 0:
            return None  # e.g. an added latency within noise of zero
        return self.motor["median"] / p

    def to_json(self) -> dict:
        d = asdict(self)
        d["ratio"] = self.ratio
        return d


def pending(id: str, group: str, workload: str, metric: str, unit: str, reason: str,
            peer_name: Optional[str] = None, target: Optional[str] = None,
            status: str = "pending") -> Row:
    return Row(id=id, group=group, workload=workload, metric=metric, unit=unit,
               peer_name=peer_name, status=status, reason=reason, target=target)


def _num(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fig(s: Optional[dict]) -> str:
    if not s:
        return "—"
    if s["n"] == 1 or s["min"] == s["max"]:
        return _num(s["median"])
    return f"{_num(s['median'])} ({_num(s['min'])}–{_num(s['max'])})"


def _ratio(r: Row) -> str:
    q = r.ratio
    if q is None:
        return "—"
    if q >= 100:
        return f"×{q:.0f}"
    if q >= 0.1:
        return f"×{q:.2f}"
    return f"×{q:.2g}"  # e.g. ×0.0011: two significant digits, not ×0.00


def markdown(rows: list[Row], header: str = "") -> str:
    notes: list[str] = []

    def ref(row: Row) -> str:
        out = []
        for n in row.notes:
            if n not in notes:
                notes.append(n)
            out.append(str(notes.index(n) + 1))
        return f" [{','.join(out)}]" if out else ""

    lines = []
    if header:
        lines += [header, ""]
    lines.append("| Row | Workload | Metric | Motor | Peer | Peer figure | Motor ÷ peer | Reps |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        metric = f"{r.metric} ({r.unit}, {r.better} is better)" if r.unit else r.metric
        if r.target:
            metric += f"; target {r.target}"
        if r.status != "ok":
            motor = f"{r.status}: {r.reason}"
            peer_fig = fig(r.peer) if r.peer else "—"
        else:
            motor = fig(r.motor)
            peer_fig = fig(r.peer)
        lines.append(f"| {r.group}{ref(r)} | {r.workload} | {metric} | {motor} | "
                     f"{r.peer_name or '—'} | {peer_fig} | {_ratio(r)} | "
                     f"{r.reps or '—'} |")
    lines.append("")
    lines.append("Figures: median of the repetitions (min–max). Motor ÷ peer compares medians.")
    if notes:
        lines.append("")
        for i, n in enumerate(notes, 1):
            lines.append(f"{i}. {n}")
    return "\n".join(lines) + "\n"


def host_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "cpu": cpu,
            "python": platform.python_version()}


def _clean(v):
    """NaN/inf are not JSON: null instead."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def write(rows: list[Row], md_path: str, json_path: str, meta: dict) -> str:
    header = (f"Motor bench — {time.strftime('%Y-%m-%d %H:%M:%S %Z')} — "
              f"{meta['host']['cpus']} CPUs ({meta['host']['cpu'] or 'unknown CPU'}), "
              f"kernel {meta['host']['kernel']}, mode {meta['settings']['mode']}")
    md = markdown(rows, header)
    vers = ", ".join(f"{k} {v}" for k, v in meta.get("versions", {}).items() if v)
    md += f"\nVersions: {vers}.\n"
    la = meta.get("loadavg")
    if la:
        md += (f"\nLoad average (1/5/15 min) at the start: {' / '.join(map(str, la['start']))}"
               f"; at the end: {' / '.join(map(str, la['end']))} (other work shares the "
               f"machine).\n")
    with open(md_path, "w") as f:
        f.write(md)
    doc = {**meta, "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "rows": [r.to_json() for r in rows]}
    with open(json_path, "w") as f:
        json.dump(_clean(doc), f, indent=1, default=str)
        f.write("\n")
    return md
