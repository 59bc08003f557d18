"""motor node-manager: the kv_store service (spec §2.6, §2.7, §3.5) — the KV local
service launched from kv_cache_store_config.local_service_command after the engines,
restarted in place when it dies (MOTOR_RESTART_LOCAL_SERVICE), stopped with the node
manager; MMC_LOCAL_CONFIG_PATH exported to the engines; `separated` mode = the KV service
only (no engine, no registration, no heartbeats)."""

import json
import os
import signal
import time

import pytest

import motorlib
from fake_controller import FakeController, nm_config, start_body, start_nm, write_json

KV_SCRIPT = """\
import json, os, sys, time
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"pid": os.getpid(),
                        "mmc": os.environ.get("MMC_LOCAL_CONFIG_PATH")}) + "\\n")
print("kv local service up", flush=True)
while True:
    time.sleep(60)
"""


@pytest.fixture
def ctl():
    c = FakeController()
    yield c
    c.close()


def kv_setup(tmpdir_path, mode="combined", with_conf=True):
    script = os.path.join(tmpdir_path, "kv_service.py")
    with open(script, "w") as f:
        f.write(KV_SCRIPT)
    out = os.path.join(tmpdir_path, "kv-starts.jsonl")
    conf = os.path.join(tmpdir_path, "mmc-local.conf")
    if with_conf:
        with open(conf, "w") as f:
            f.write("# memcache local config\n")
    block = {"backend": "memcache", "mode": mode, "local_config_path": conf,
             "local_service_command": ["/usr/bin/python3", script, out]}
    return {"kv_cache_store_config": block}, out, conf


def starts(out):
    if not os.path.exists(out):
        return []
    with open(out) as f:
        return [json.loads(line) for line in f if line.strip()]


def kv_state(nm):
    r = nm.get("/node-manager/kv-store")
    assert r.status == 200, r
    return r.json()


def environ_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)


def test_combined_launch_restart_stop(procs, tmpdir_path, ctl):
    top, out, conf = kv_setup(tmpdir_path)
    cfg = nm_config(controller_port=ctl.port, top=top,
                    ft={"container_restart_managed": False})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    ctl.wait_request("/controller/register", timeout=5)
    # Nothing runs before the start command.
    st = kv_state(nm)
    assert st["enabled"] is True and st["mode"] == "combined" and st["alive"] is False, st
    assert starts(out) == []

    assert nm.post("/node-manager/start", start_body(cfg)).status == 200
    ev = nm.wait_event("kv_service_spawned", timeout=5)
    nm.wait_ready()
    # After the engines (prepare first, then the engines, then the KV service).
    names = [e.get("event") for e in nm.events()]
    assert names.index("kv_engine_env") < names.index("engine_spawned") < \
        names.index("kv_service_spawned"), names
    pid = ev["pid"]
    motorlib.wait_for(lambda: starts(out), timeout=5, what="kv service record")
    assert starts(out) == [{"pid": pid, "mmc": conf}]
    # The engines see MMC_LOCAL_CONFIG_PATH (prepare), as does the service.
    env = environ_of(nm.endpoint()["pid"])
    assert env.get(b"MMC_LOCAL_CONFIG_PATH") == conf.encode(), env.get(b"MMC_LOCAL_CONFIG_PATH")
    st = kv_state(nm)
    assert st["alive"] is True and st["pid"] == pid and st["restarts"] == 0, st
    assert st["engine_env"] == {"MMC_LOCAL_CONFIG_PATH": conf}
    r = nm.get("/node-manager/kv-store/logs?tail=5")
    assert r.status == 200 and "kv local service up" in r.text, r

    # A repeated start command does not start a second service.
    assert nm.post("/node-manager/start", start_body(cfg)).status == 200
    assert kv_state(nm)["pid"] == pid and len(starts(out)) == 1

    # Death: known at once, restarted in place at the next health check.
    os.kill(pid, signal.SIGKILL)
    ex = nm.wait_event("kv_service_exited", timeout=5)
    assert ex["pid"] == pid and ex["signal"] == 9 and ex["will_restart"] is True
    ev2 = nm.wait_event("kv_service_spawned", after=1, timeout=5)
    pid2 = ev2["pid"]
    assert pid2 != pid and motorlib.pid_alive(pid2)
    st = kv_state(nm)
    assert st["alive"] is True and st["pid"] == pid2 and st["restarts"] == 1, st
    assert st["last_exit"]["signal"] == 9
    motorlib.wait_for(lambda: len(starts(out)) == 2, timeout=5, what="second record")
    # The engine was not touched.
    assert nm.endpoint()["restarts"] == 0 and nm.endpoint()["status"] == "normal"

    # An in-place engine relaunch leaves the KV service alone.
    r = nm.post("/node-manager/engine-restart", {"action": "restart"})
    assert r.status == 200, r
    nm.wait_event("relaunch_ready", timeout=15)
    assert kv_state(nm)["pid"] == pid2 and motorlib.pid_alive(pid2)

    # /stop takes everything down, the KV service too, then exit 255.
    r = nm.post("/node-manager/stop")
    assert r.status == 200, r
    assert nm.proc.wait(timeout=15) == 255
    motorlib.wait_for(lambda: not motorlib.pid_alive(pid2), timeout=5, what="kv service gone")
    nm.wait_event("kv_service_stopped", timeout=1)


def test_restart_disabled_by_env(procs, tmpdir_path, ctl):
    top, out, _ = kv_setup(tmpdir_path)
    cfg = nm_config(controller_port=ctl.port, top=top,
                    ft={"container_restart_managed": False})
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg),
                  env={"MOTOR_RESTART_LOCAL_SERVICE": "0"})
    ctl.wait_request("/controller/register", timeout=5)
    assert nm.post("/node-manager/start", start_body(cfg)).status == 200
    pid = nm.wait_event("kv_service_spawned", timeout=5)["pid"]
    os.kill(pid, signal.SIGKILL)
    ex = nm.wait_event("kv_service_exited", timeout=5)
    assert ex["will_restart"] is False
    nm.wait_event("kv_service_not_restarted", timeout=5)
    st = kv_state(nm)
    assert st["alive"] is False and st["restarts"] == 0 and st["restart_enabled"] is False
    assert len(nm.find_events("kv_service_spawned")) == 1


def test_separated_mode_kv_only(procs, tmpdir_path, ctl):
    top, out, conf = kv_setup(tmpdir_path, mode="separated", with_conf=False)
    cfg = nm_config(controller_port=ctl.port, top=top)
    nm = start_nm(procs, write_json(os.path.join(tmpdir_path, "c.json"), cfg))
    started = nm.wait_event("nm_started", timeout=5)
    assert started["has_engine"] is False
    ev = nm.wait_event("kv_service_spawned", timeout=5)
    assert ev["mode"] == "separated"
    pid = ev["pid"]
    # No local config file: nothing exported (and said so).
    nm.wait_event("kv_engine_env_skipped", timeout=1)
    motorlib.wait_for(lambda: starts(out), timeout=5, what="kv service record")
    assert starts(out) == [{"pid": pid, "mmc": None}]
    assert kv_state(nm)["alive"] is True
    assert nm.engines()["endpoints"] == []
    # No engine: a start command is refused, nothing registers or heartbeats. A node
    # manager with an engine registers at once; give this one a few heartbeat intervals.
    r = nm.post("/node-manager/start", start_body(cfg))
    assert r.status == 400 and "separated" in r.json()["detail"], r
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert ctl.requests == [], ctl.requests
        time.sleep(0.05)
    assert nm.engines()["registered"] is False
    # It still restarts the service ...
    os.kill(pid, signal.SIGKILL)
    pid2 = nm.wait_event("kv_service_spawned", after=1, timeout=5)["pid"]
    assert pid2 != pid
    # ... and SIGTERM stops it, exit 255.
    nm.proc.terminate(group=False)
    assert nm.proc.wait(timeout=15) == 255
    motorlib.wait_for(lambda: not motorlib.pid_alive(pid2), timeout=5, what="kv service gone")
    assert ctl.requests == []
