"""Observability of a whole fleet (issue 20, deliverables 3 and 4): a `motor up` fleet
(examples/local.json: controller, coordinator, 2 node managers, 4 simulated engines)
serves some chats; then

* every Motor-named metric family of every daemon passes `promtool check metrics`
  (the engines' `vllm:` families are vLLM's contract names, colons and all);
* a real Prometheus server (Debian's) scrapes every daemon and its query API answers
  `up == 1` for every target;
* deploy/prometheus/motor-alerts.yml passes `promtool check rules`, every rule evaluates
  on that Prometheus without error, and every metric it names is exported;
* every query of deploy/grafana/*.json evaluates on that Prometheus and names only
  exported metrics.

This test must fail — never skip — when Prometheus is missing (scripts/deps.sh installs
it)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import urllib.parse

import motorlib
from motorlib import REPO, get, wait_for
from test_up import LOCAL_JSON, Fleet, chat

ALERTS = REPO / "deploy" / "prometheus" / "motor-alerts.yml"
DASHBOARDS = sorted(glob.glob(str(REPO / "deploy" / "grafana" / "*.json")))
# Names in PromQL that are not metrics.
_NAME = re.compile(r'(?<![\w:"{=~,])([a-zA-Z_:][a-zA-Z0-9_:]*)')


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not installed (scripts/deps.sh installs the Debian package prometheus)"
    return path


def targets_of(fleet: Fleet) -> dict[str, list[int]]:
    r = subprocess.run([motorlib.motor_bin(), "up", "-c", LOCAL_JSON, "--port-base",
                        str(fleet.base), "--dry-run"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    return {"motor-coordinator": [plan["coordinator_mgmt_port"]],
            "motor-controller": [plan["controller_port"]],
            "motor-node-manager": [p["node_manager_port"] for p in plan["pods"]],
            "motor-engine": [e for p in plan["pods"] for e in p["engine_ports"]]}


def motor_families(text: str) -> str:
    """The exposition restricted to Motor-named families (comments and samples)."""
    out = []
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("# ") and len(line.split()) > 2 else \
            re.split(r"[{ ]", line, 1)[0]
        if name.startswith("motor_"):
            out.append(line)
    return "\n".join(out) + "\n"


def sample_names(text: str) -> set[str]:
    """Every series name the exposition has or declares (a labelled family has no sample
    before its first child, e.g. strategies that never ran)."""
    out = {re.split(r"[{ ]", line, 1)[0] for line in text.splitlines()
           if line and not line.startswith("#")}
    for line in text.splitlines():
        parts = line.split()
        if line.startswith("# TYPE ") and len(parts) == 4:
            out.add(parts[2])
            if parts[3] in ("histogram", "summary"):
                out |= {parts[2] + "_bucket", parts[2] + "_sum", parts[2] + "_count"}
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (Motor's, vLLM's, and `up`)."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    return {n for n in _NAME.findall(expr)
            if n.startswith(("motor_", "vllm:", "sim:")) or n == "up"}


def prom_query(base: str, expr: str) -> dict:
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    r = get(url, timeout=10)
    body = r.json()
    assert r.status == 200 and body.get("status") == "success", (expr, r.status, body)
    return body["data"]


def start_prometheus(procs, tmpdir: str, targets: dict[str, list[int]]) -> str:
    port = motorlib.free_port()
    rules = os.path.join(tmpdir, "motor-alerts.yml")
    shutil.copy(ALERTS, rules)
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n      - targets: ["
        + ", ".join(f'"127.0.0.1:{p}"' for p in ports) + "]\n"
        for job, ports in targets.items())
    cfg = os.path.join(tmpdir, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                f"rule_files:\n  - {rules}\nscrape_configs:\n{jobs}")
    p = procs.start([tool("prometheus"), f"--config.file={cfg}",
                     f"--storage.tsdb.path={os.path.join(tmpdir, 'tsdb')}",
                     f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                    name="prometheus")
    base = f"http://127.0.0.1:{port}"
    motorlib.wait_http(base + "/-/ready", 200, timeout=30, proc=p)
    return base


def test_fleet_metrics_prometheus_alerts_dashboards(procs, tmpdir_path):
    promtool = tool("promtool")
    fleet = Fleet(procs, tmpdir_path)
    fleet.wait_ready()
    assert chat(fleet.url, "hello there").status == 200
    targets = targets_of(fleet)

    exported: set[str] = set()
    for job, ports in targets.items():
        for port in ports:
            r = get(f"http://127.0.0.1:{port}/metrics")
            assert r.status == 200, (job, port, r)
            exported |= sample_names(r.text)
            fams = motor_families(r.text)
            if job != "motor-engine":
                assert fams.strip(), f"{job}: no motor_ family"
            c = subprocess.run([promtool, "check", "metrics"], input=fams.encode(),
                               capture_output=True, timeout=30)
            assert c.returncode == 0 and not c.stdout.strip(), \
                (job, port, c.stdout.decode(), c.stderr.decode())

    base = start_prometheus(procs, tmpdir_path, targets)
    want = {(job, f"127.0.0.1:{p}") for job, ports in targets.items() for p in ports}

    def all_up():
        res = prom_query(base, "up")["result"]
        got = {(s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in res}
        return got if set(got) == want and all(v == "1" for v in got.values()) else None
    got = wait_for(all_up, timeout=30, interval=0.5, what="up == 1 for every target")
    assert len(got) == 1 + 1 + 2 + 4

    # Alert rules: promtool, names, and every rule healthy on the live server.
    c = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                       text=True, timeout=30)
    assert c.returncode == 0, c.stdout + c.stderr
    exported.add("up")

    def rules_evaluated():
        groups = get(base + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if rules and all(r.get("lastEvaluation", "").startswith("20")
                                      and not r["lastEvaluation"].startswith("0001")
                                      for r in rules) else None
    rules = wait_for(rules_evaluated, timeout=20, interval=0.5, what="every rule evaluated")
    assert len(rules) >= 5
    for r in rules:
        assert r["health"] == "ok", r
        missing = metric_names(r["query"]) - exported
        assert not missing, (r["name"], missing)
    names = {r["name"] for r in rules}
    for alert in ("MotorInstanceNotRoutable", "MotorRecoveryFailing", "MotorBreakerOpen",
                  "MotorHighTimeToFirstToken", "MotorPrecisionAlarm"):
        assert alert in names
    # A healthy fleet fires none of them.
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    assert not firing, firing

    # Dashboards: every query evaluates and names exported metrics only.
    assert DASHBOARDS
    for path in DASHBOARDS:
        with open(path) as f:
            dash = json.load(f)
        exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
        titles = {p["title"] for p in dash["panels"] if p["type"] == "row"}
        assert {"Fleet overview", "Gateway latency and tokens", "Instances and recoveries",
                "Node managers and engines"} <= titles, titles
        assert len(exprs) >= 10
        for e in exprs:
            missing = metric_names(e) - exported
            assert not missing, (path, e, missing)
            prom_query(base, e.replace("$__rate_interval", "1m").replace("$__range", "5m"))
    assert fleet.stop() == 0
