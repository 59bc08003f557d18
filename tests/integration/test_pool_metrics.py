"""Worker pool GET /metrics (issue 20, deliverable 3): calls, failures, cold starts, queue
depth and wait, instances by state, per node; `promtool check metrics` passes."""

import shutil
import subprocess

from coord_helpers import metric_value
from motorlib import get
from pool_helpers import manifest, start_pool


def test_pool_metrics(procs, tmpdir_path):
    pool = start_pool(procs, tmpdir_path, manifests=[manifest("echo"), manifest("idle")])
    assert pool.invoke("echo", {"input": "a"}).status == 200
    assert pool.invoke("echo", {"input": "b"}).status == 200
    assert pool.invoke("nope", {"input": "c"}).status == 404
    r = get(pool.url + "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain"), r
    text = r.text
    node = {"node": "echo"}
    assert metric_value(text, "motor_pool_calls_total", node) == 2
    assert metric_value(text, "motor_pool_cold_starts_total", node) == 1
    assert metric_value(text, "motor_pool_calls_failed_total", node) == 0
    assert metric_value(text, "motor_pool_queue_depth", node) == 0
    assert metric_value(text, "motor_pool_instances", {"node": "echo", "state": "ready"}) == 1
    assert metric_value(text, "motor_pool_instances", {"node": "idle", "state": "ready"}) == 0
    assert metric_value(text, "motor_pool_cold_starts_total", {"node": "idle"}) == 0
    # the first call waited for the cold start, the second for nothing
    assert metric_value(text, "motor_pool_queue_wait_seconds_count") == 2
    assert metric_value(text, "motor_pool_queue_wait_seconds_sum") > 0
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing (scripts/deps.sh installs prometheus)"
    chk = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                         capture_output=True, timeout=30)
    assert chk.returncode == 0 and not chk.stdout.strip(), chk.stdout.decode() + chk.stderr.decode()
