"""`motor up` planning, failure policy and supervision, and `motor status`:

* --dry-run: the pods, their $INDEX/$JOB_NAME and ports, --port-base layout, colliding
  upstream defaults refused;
* a port already in use, or a child that cannot start (invalid configuration), stops
  everything with exit 1 and a message naming the culprit;
* a crashed controller is restarted and finds its instances again (SQLite store), a
  crashed coordinator is restarted and gets the fleet pushed again, while
  a second `motor up` on the same state directory is refused;
* `motor status` exits non-zero when it cannot reach the fleet."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess

import motorlib
from motorlib import wait_for
from test_up import LOCAL_JSON, Fleet, chat, descendants, free_port_block


def run_motor(*args, timeout: float = 30.0) -> subprocess.CompletedProcess:
    return subprocess.run([motorlib.motor_bin(), *[str(a) for a in args]], capture_output=True,
                          text=True, timeout=timeout)


def load_local() -> dict:
    with open(LOCAL_JSON) as f:
        return json.load(f)


def write_config(tmpdir: str, cfg: dict, name: str = "user_config.json") -> str:
    path = os.path.join(tmpdir, name)
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def plan(*args) -> dict:
    r = run_motor("up", "--dry-run", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def all_ports(p: dict) -> list[int]:
    ports = [p["coordinator_port"], p["coordinator_mgmt_port"], p["controller_port"]]
    for pod in p["pods"]:
        ports += [pod["node_manager_port"], *pod["engine_ports"]]
        if pod["dp_size"] > 1:
            ports.append(pod["dp_rpc_port"])
    return ports


def test_dry_run_plans_the_local_example():
    p = plan("-c", LOCAL_JSON)
    assert p["instances"] == 2
    pods = {d["name"]: d for d in p["pods"]}
    assert set(pods) == {"prefill-0", "decode-0"}
    pre, dec = pods["prefill-0"], pods["decode-0"]
    assert (pre["role"], pre["index"], pre["job_name"]) == ("prefill", 0, "motor-local-prefill-0")
    assert (dec["role"], dec["index"], dec["job_name"]) == ("decode", 0, "motor-local-decode-0")
    assert pre["engine_type"] == dec["engine_type"] == "sim"
    assert len(pre["engine_ports"]) == len(dec["engine_ports"]) == 2
    ports = all_ports(p)
    assert len(ports) == len(set(ports)), ports
    assert p["openai_url"] == f"http://127.0.0.1:{p['coordinator_port']}/v1"
    eff = p["effective_config"]
    assert eff["motor_deploy_config"]["deploy_mode"] == "single_container"
    assert eff["motor_controller_config"]["store_config"]["backend"] == "sqlite"

    # --port-base moves every port into one block, and still none collide.
    b = 24000
    q = plan("-c", LOCAL_JSON, "--port-base", b)
    assert q["coordinator_port"] == b and q["coordinator_mgmt_port"] == b + 1
    assert q["controller_port"] == b + 3
    ports = all_ports(q)
    assert len(ports) == len(set(ports)) and all(b <= x < b + 64 for x in ports), ports
    assert any("coordinator_api_infer_port" in n for n in q["notes"])


def test_dry_run_multi_pod_and_multi_instance_layout(tmpdir_path):
    cfg = load_local()
    cfg["motor_deploy_config"].update({"p_instances_num": 2, "d_instances_num": 1,
                                       "single_d_instance_pod_num": 2})
    path = write_config(tmpdir_path, cfg)
    # DP ranks across pods (decode: 2 pods, data_parallel_size 2) are refused, naming the
    # keys, by the dry run as by the real run: each pod would start every rank.
    for extra in (("--state-dir", os.path.join(tmpdir_path, "st")), ("--dry-run",)):
        r = run_motor("up", "-c", path, *extra, timeout=15)
        assert r.returncode != 0
        assert "single_d_instance_pod_num 2" in r.stderr, r.stderr
        assert "motor_engine_decode_config.engine_config.data_parallel_size 2" in r.stderr
        assert "cannot spread one instance's DP ranks over several pods" in r.stderr
    # The same layout with a cross-node decode (nnodes 2, one rank) plans.
    cfg["motor_engine_decode_config"]["engine_config"].update(
        {"data_parallel_size": 1, "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
         "nnodes": 2, "master_port": 29700})
    path = write_config(tmpdir_path, cfg)
    p = plan("-c", path, "--port-base", 26000)
    names = [d["name"] for d in p["pods"]]
    assert names == ["prefill-0", "prefill-1", "decode-0.0", "decode-0.1"]
    assert p["instances"] == 3
    jobs = {d["name"]: d["job_name"] for d in p["pods"]}
    assert jobs["decode-0.0"] == jobs["decode-0.1"] != jobs["prefill-0"] != jobs["prefill-1"]
    ports = all_ports(p)
    assert len(ports) == len(set(ports)), ports


def engine_ports(p: dict) -> set[int]:
    """Every port the dry-run plan derives, the engines' own ones included (DP master +
    rank once per role, the KV span of each pod, the SGLang bootstrap)."""
    ports = set(all_ports(p))
    roles = set()
    for pod in p["pods"]:
        ports.update(range(pod.get("kv_port", 0), pod.get("kv_port", 0) + pod.get("kv_span", 0)))
        if pod["role"] not in roles:
            roles.add(pod["role"])
            if pod["dp_size"] > 1:
                ports.update(range(pod["dp_master_port"], pod["dp_master_port"] + pod["dp_size"]))
            if "bootstrap_port" in pod:
                ports.add(pod["bootstrap_port"])
    return ports


def test_dry_run_port_base_moves_engine_ports():
    # vLLM PD at dp 2 with kv_port, and SGLang PD with a bootstrap port: --port-base moves
    # those ports too, so two fleets a block apart share none.
    vllm_pd = str(motorlib.REPO / "examples" / "vllm-pd.json")
    sglang_pd = str(motorlib.REPO / "examples" / "sglang-pd.json")
    for path, top in ((vllm_pd, 41), (sglang_pd, 18)):
        a, b = plan("-c", path, "--port-base", 24000), plan("-c", path, "--port-base", 24100)
        pa, pb = engine_ports(a), engine_ports(b)
        assert max(pa) == 24000 + top and min(pa) == 24000, sorted(pa)
        assert not pa & pb, sorted(pa & pb)
    p = plan("-c", vllm_pd, "--port-base", 24000)
    pre = p["effective_config"]["motor_engine_prefill_config"]["engine_config"]
    assert pre["data_parallel_master_port"] == 24022
    assert pre["kv_transfer_config"]["kv_port"] == "24024"  # still a string
    assert [(d["dp_master_port"], d["kv_port"], d["kv_span"]) for d in p["pods"]] == \
        [(24022, 24024, 8), (24032, 24034, 8)]
    s = plan("-c", sglang_pd, "--port-base", 24000)
    assert [d.get("bootstrap_port") for d in s["pods"]] == [24018, None]


def test_colliding_upstream_defaults_are_refused(tmpdir_path):
    # Upstream's defaults put the controller, the coordinator's management API and the
    # node manager on 1026: fine in separate pods, impossible on one host.
    cfg = {"motor_deploy_config": {"p_instances_num": 1, "d_instances_num": 0},
           "motor_controller_config": {}, "motor_coordinator_config": {},
           "motor_engine_prefill_config": {
               "engine_type": "sim",
               "engine_config": {"model": "m", "kv_transfer_config":
                                 {"kv_connector": "NixlConnector"}}}}
    path = write_config(tmpdir_path, cfg)
    r = run_motor("up", "-c", path, "--dry-run")
    assert r.returncode == 1
    assert "1026 is used by both" in r.stderr and "--port-base" in r.stderr
    # With a port base it plans fine.
    assert plan("-c", path, "--port-base", 27000)["instances"] == 1


def test_invalid_config_is_reported_before_anything_starts(tmpdir_path):
    cfg = load_local()
    cfg["motor_engine_decode_config"]["engine_config"]["data_parallel_size"] = 0
    path = write_config(tmpdir_path, cfg)
    r = run_motor("up", "-c", path, "--state-dir", os.path.join(tmpdir_path, "s"), "--plain")
    assert r.returncode == 1
    assert "cannot run this configuration" in r.stderr
    assert "motor_engine_decode_config.engine_config.data_parallel_size" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(tmpdir_path, "s", "up.json"))


def test_port_in_use_stops_before_starting(procs, tmpdir_path):
    base = free_port_block()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not busy
        s.bind(("127.0.0.1", base + 3))  # the controller's port
        s.listen(1)
        r = run_motor("up", "-c", LOCAL_JSON, "--port-base", base, "--plain",
                      "--state-dir", os.path.join(tmpdir_path, "s"))
    assert r.returncode == 1
    assert f"{base + 3} (controller) is already in use" in r.stderr, r.stderr
    assert "up_child_started" not in r.stderr


def test_child_that_cannot_start_stops_the_fleet(procs, tmpdir_path):
    cfg = load_local()
    cfg["motor_coordinator_config"]["exception_config"]["max_retry"] = -7
    path = write_config(tmpdir_path, cfg)
    fleet = Fleet(procs, tmpdir_path, config=path)
    rc = fleet.proc.wait(30)
    out = fleet.proc.output()
    assert rc == 1, out
    assert "coordinator failed to start" in out
    assert "max_retry" in out  # the child's own explanation is shown
    started = [e["name"] for e in fleet.proc.find_events("up_child_started")]
    assert started == ["coordinator"], started
    assert not descendants(fleet.proc.pid)


def test_crashed_controller_and_coordinator_are_restarted(procs, tmpdir_path):
    fleet = Fleet(procs, tmpdir_path)
    fleet.wait_ready()
    before = {i["job_name"]: i["id"] for i in fleet.wait_healthy(30)["instances"]}
    assert len(before) == 2

    # A second motor up on the same state directory is refused.
    r = run_motor("up", "-c", LOCAL_JSON, "--state-dir", fleet.state, "--port-base",
                  free_port_block(), "--plain")
    assert r.returncode == 1 and "another `motor up`" in r.stderr, r.stderr

    ctl = fleet.child("controller")
    os.kill(ctl["pid"], signal.SIGKILL)
    fleet.proc.wait_event("up_child_exited", name="controller", timeout=10)
    fleet.proc.wait_event("up_child_started", name="controller", start=2, timeout=15)
    assert fleet.child("controller")["restarts"] == 1
    after = {i["job_name"]: i["id"] for i in fleet.wait_healthy(60)["instances"]}
    assert after == before, "the restarted controller lost its instances"
    r = chat(fleet.url, "still there?")
    assert r.status == 200, r

    # The coordinator too: restarted empty, it gets the fleet from the controller again.
    co = fleet.child("coordinator")
    os.kill(co["pid"], signal.SIGKILL)
    fleet.proc.wait_event("up_child_started", name="coordinator", start=2, timeout=15)
    assert {i["job_name"]: i["id"] for i in fleet.wait_healthy(60)["instances"]} == before
    r = chat(fleet.url, "and now?")
    assert r.status == 200, r
    assert fleet.stop() == 0


def test_status_reports_an_unreachable_fleet():
    a, b = motorlib.free_port(), motorlib.free_port()
    r = run_motor("status", "--controller", f"http://127.0.0.1:{a}", "--coordinator",
                  f"127.0.0.1:{b}", "--json", "--timeout", "2")
    assert r.returncode == 1, r
    m = json.loads(r.stdout)
    assert m["healthy"] is False
    assert not m["controller"]["reachable"] and not m["coordinator"]["reachable"]
    assert len(m["problems"]) == 2
    r = run_motor("status", "--controller", "none", "--coordinator", f"127.0.0.1:{b}")
    assert r.returncode == 1 and "UNREACHABLE" in r.stdout
    assert run_motor("status", "--bogus").returncode == 2


def test_cross_node_instances_come_up(procs, tmpdir_path):
    # Two pods per instance (nnodes 2): the controller assembles each instance from two
    # node managers; rank 1 runs headless.
    cfg = load_local()
    for role, port in (("prefill", 29600), ("decode", 29700)):
        cfg[f"motor_engine_{role}_config"]["engine_config"].update(
            {"data_parallel_size": 1, "tensor_parallel_size": 2, "pipeline_parallel_size": 2,
             "nnodes": 2, "master_port": port})
    cfg["motor_deploy_config"].update({"single_p_instance_pod_num": 2,
                                       "single_d_instance_pod_num": 2})
    fleet = Fleet(procs, tmpdir_path, config=write_config(tmpdir_path, cfg))
    assert fleet.wait_ready()["instances"] == 2
    model = fleet.wait_healthy(30)
    assert sorted(c["name"] for c in fleet.info()["children"]) == sorted(
        ["coordinator", "controller", "prefill-0.0", "prefill-0.1", "decode-0.0", "decode-0.1"])
    for inst in model["instances"]:
        assert sorted(e["headless"] for e in inst["endpoints"]) == [False, True], inst
    r = chat(fleet.url, "across nodes")
    assert r.status == 200, r
    tree = descendants(fleet.proc.pid)
    assert fleet.stop() == 0
    assert not [p for p in tree if motorlib.pid_alive(p)]
